"""Numba CUDA kernels for the batched hot spots, with host-side wrappers.

Each kernel computes what its NumPy twin in :mod:`hcrfast.kernels.twins` computes
(the twin is the oracle in the tests), in the input's precision (float32 or
float64). Batched arrays hold one problem per row, shape ``(B, ...)``; the
wrappers flatten a row to ``m = prod(shape[1:])`` values, and the DCT flattens
all leading axes to one batch axis.

Inputs and outputs
------------------
The wrappers take arrays of one kind and return arrays of that kind:

* CuPy arrays (the GPU path): outputs are allocated through CuPy, and kernels
  run on ``stream`` or, when it is None, on CuPy's current stream, so they are
  ordered with the CuPy work around them without any host synchronization.
* Numba device arrays (and, under the simulator, its fake device arrays):
  outputs are Numba device arrays.
* Other objects exposing ``__cuda_array_interface__`` (e.g. PyTorch CUDA
  tensors) are viewed through ``numba.cuda.as_cuda_array``; outputs are Numba
  device arrays. PyTorch exports version 2 of the interface, which names no
  stream, so nothing is synchronized: with ``stream=None`` the kernels run on the
  legacy default stream, so pass ``stream=torch.cuda.current_stream()`` when
  torch works on another stream.
* NumPy arrays: copied to the device, and the results copied back. This is for
  tests and the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``); the CPU path is
  the twins.

``stream`` may be a Numba stream, a CuPy stream or a PyTorch CUDA stream.

Numba is imported and the kernels are compiled on first use, so importing this
module stays cheap and needs neither numba.cuda nor a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import math
from types import SimpleNamespace

import numpy as np

from hcrfast.backend import import_cupy, is_cupy_array, warnings_ignored

from . import twins

__all__ = ["dct2", "idct2", "lsqr_update_xw", "restart_update", "row_normalize", "row_norms"]

# numba.cuda, bound by _numba_cuda() on first use. The kernels must look it up as a
# global of this module: the CUDA simulator runs kernels as Python and swaps the
# module globals that hold numba.cuda for its fake thread/block API (a closure
# variable would not be swapped).
cuda = None

# Threads per block of the row kernels, and the size of their shared buffer.
# The tree reduction needs a power of two.
_MAX_ROW_THREADS = 256
_MIN_ROW_THREADS = 32  # one warp
# Edge of the DCT's shared-memory tiles; its blocks are _TILE × _TILE threads.
_TILE = 16
# Grid limit in y and z (x allows 2³¹ − 1); every kernel grid-strides past its grid, but for
# batched_matmul's rows (a DCT's image axis, far fewer than _MAX_GRID · _TILE).
_MAX_GRID = 65535

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@functools.lru_cache(maxsize=1)
def _numba_cuda():
    """Import ``numba.cuda`` once and bind it to the module global ``cuda``."""
    global cuda
    if not hasattr(np, "row_stack"):
        # numba-cuda up to 0.30 registers an overload of np.row_stack (an alias of np.vstack that
        # NumPy 2.5 removed) while it builds its typing context: the first kernel compilation then
        # fails with "module 'numpy' has no attribute 'row_stack'" (seen on an H100 image with
        # numba-cuda 0.30.4 and NumPy 2.5.2). Restore the alias, which is exactly np.vstack.
        np.row_stack = np.vstack
    from numba import cuda as numba_cuda

    cuda = numba_cuda
    return numba_cuda


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------


@functools.cache
def _kernels(dtype: np.dtype) -> SimpleNamespace:
    """Define the kernels for one floating dtype (compiled on their first launch).

    The dtype is baked in so that shared buffers, accumulators and the casts
    that mirror the twins' NumPy casting rules are in the input's precision.
    """
    _numba_cuda()
    cast = dtype.type  # np.float32 or np.float64: a cast inside the kernels
    zero = cast(0)

    @cuda.jit(device=True)
    def block_sum(buf, value):
        """Sum ``value`` over the threads of a block (power-of-two size); every thread gets it."""
        tid = cuda.threadIdx.x
        buf[tid] = value
        cuda.syncthreads()
        half = cuda.blockDim.x // 2
        while half > 0:
            if tid < half:
                buf[tid] += buf[tid + half]
            cuda.syncthreads()
            half //= 2
        total = buf[0]
        cuda.syncthreads()  # all have read buf[0] before the caller's next round overwrites buf
        return total

    @cuda.jit(device=True)
    def scale_for(targets, target, per_row, b, norm):
        """``target_b / norm`` in the array's dtype, or 0 for a zero row. The twin divides a float64 target in
        float64 and then rounds (within an ulp of this: the tests allow it); a scalar target it casts first."""
        t = cast(targets[b]) if per_row else cast(target)
        if norm > zero:
            return t / norm
        return zero

    @cuda.jit
    def row_normalize(a, targets, target, per_row, write_scaled, scaled, norms):
        """norms[b] = ‖a[b]‖₂; scaled[b] = target_b · a[b] / norms[b] (0 for a zero row).

        One block per row (grid-striding over rows), each thread striding over
        the row's columns; a shared-memory tree reduction gives the norm, then
        the same block writes the scaled row. ``targets`` is read only when
        ``per_row``; ``scaled`` is written only when ``write_scaled``.
        """
        buf = cuda.shared.array(_MAX_ROW_THREADS, cast)
        tid = cuda.threadIdx.x
        n_rows, n_cols = a.shape
        for b in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
            partial = zero
            for j in range(tid, n_cols, cuda.blockDim.x):
                value = a[b, j]
                partial += value * value
            norm = cast(math.sqrt(block_sum(buf, partial)))
            if tid == 0:
                norms[b] = norm
            if write_scaled:
                scale = scale_for(targets, target, per_row, b, norm)
                for j in range(tid, n_cols, cuda.blockDim.x):
                    scaled[b, j] = a[b, j] * scale

    @cuda.jit
    def restart_update(perturbed, features, targets, target, per_row, z, znorm, ztilde):
        """z = perturbed − features; znorm[b] = ‖z[b]‖₂; ztilde[b] = target_b · z[b] / znorm[b].

        Same block-per-row layout as ``row_normalize``; each thread rereads
        only the elements of z it wrote itself, so no barrier is needed there.
        """
        buf = cuda.shared.array(_MAX_ROW_THREADS, cast)
        tid = cuda.threadIdx.x
        n_rows, n_cols = z.shape
        for b in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
            partial = zero
            for j in range(tid, n_cols, cuda.blockDim.x):
                diff = perturbed[b, j] - features[b, j]
                z[b, j] = diff
                partial += diff * diff
            norm = cast(math.sqrt(block_sum(buf, partial)))
            if tid == 0:
                znorm[b] = norm
            scale = scale_for(targets, target, per_row, b, norm)
            for j in range(tid, n_cols, cuda.blockDim.x):
                ztilde[b, j] = z[b, j] * scale

    @cuda.jit
    def lsqr_update_xw(x, w, v, t1, t2):
        """x[b] += t1[b]·w[b]; w[b] = t2[b]·w[b] + v[b], on a 2-D grid (columns × rows).

        The roundings follow the twin's in-place NumPy ops: ``x += t1·w`` adds
        in the wider of the two dtypes, ``w *= t2`` rounds to the dtype before
        ``w += v``.
        """
        col0, row0 = cuda.grid(2)
        col_step, row_step = cuda.gridsize(2)
        n_rows, n_cols = x.shape
        for b in range(row0, n_rows, row_step):
            step_x = t1[b]
            step_w = t2[b]
            for j in range(col0, n_cols, col_step):
                w_old = w[b, j]
                x[b, j] = x[b, j] + step_x * w_old
                w[b, j] = cast(step_w * w_old) + v[b, j]

    @cuda.jit
    def batched_matmul(a, b, out):
        """out[n] = a[n] @ b[n] for every n; an operand of leading size 1 serves every n.

        Classic shared-memory tiling: each block computes one _TILE × _TILE
        tile of out[n], looping over the inner dimension one tile at a time
        (grid z strides over n).
        """
        a_tile = cuda.shared.array((_TILE, _TILE), cast)
        b_tile = cuda.shared.array((_TILE, _TILE), cast)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * _TILE + ty
        col = cuda.blockIdx.x * _TILE + tx
        n_batch, n_rows, n_cols = out.shape
        inner = a.shape[2]
        for n in range(cuda.blockIdx.z, n_batch, cuda.gridDim.z):
            na = n if a.shape[0] > 1 else 0
            nb = n if b.shape[0] > 1 else 0
            acc = zero
            for k0 in range(0, inner, _TILE):
                k = k0 + tx
                if row < n_rows and k < inner:
                    a_tile[ty, tx] = a[na, row, k]
                else:
                    a_tile[ty, tx] = zero
                k = k0 + ty
                if k < inner and col < n_cols:
                    b_tile[ty, tx] = b[nb, k, col]
                else:
                    b_tile[ty, tx] = zero
                cuda.syncthreads()
                for kk in range(_TILE):
                    acc += a_tile[ty, kk] * b_tile[kk, tx]
                cuda.syncthreads()
            if row < n_rows and col < n_cols:
                out[n, row, col] = acc

    return SimpleNamespace(
        row_normalize=row_normalize,
        restart_update=restart_update,
        lsqr_update_xw=lsqr_update_xw,
        batched_matmul=batched_matmul,
    )


# ---------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------


def _row_threads(n_cols: int) -> int:
    """Threads per block for a row of ``n_cols``: a power of two in [32, 256]."""
    threads = _MIN_ROW_THREADS
    while threads < n_cols and threads < _MAX_ROW_THREADS:
        threads *= 2
    return threads


@functools.lru_cache(maxsize=1)
def _numba_config():
    """The config module numba's CUDA dispatcher reads (numba-cuda's own, or numba's before it)."""
    try:
        from numba.cuda.core import config
    except ImportError:
        from numba.core import config
    return config


def _configured(kernel, grid, block, stream):
    """``kernel[grid, block, stream]``, without Numba's low-occupancy warning: a small batch (one block a
    row) is no mistake here, and the warning would come at every launch. Its threshold differs between
    releases (128 blocks, or twice the multiprocessors: 264 on an H100), so the switch is turned off at
    every launch, for that moment: a ``warnings.catch_warnings`` block would reset every module's record
    of warnings already shown once, at each launch."""
    config = _numba_config()
    saved = getattr(config, "CUDA_LOW_OCCUPANCY_WARNINGS", 0)
    config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    try:
        return kernel[grid, block, stream]
    finally:
        config.CUDA_LOW_OCCUPANCY_WARNINGS = saved


def _launch_rows(kernel, n_rows, n_cols, stream, *args):
    _configured(kernel, min(n_rows, _MAX_GRID), _row_threads(n_cols), stream)(*args)


def _launch_xw(kernel, n_rows, n_cols, stream, *args):
    threads = _row_threads(n_cols)
    grid = (min(-(-n_cols // threads), _MAX_GRID), min(n_rows, _MAX_GRID))
    _configured(kernel, grid, (threads, 1), stream)(*args)


def _launch_matmul(kernel, a, b, out, stream):
    n_batch, n_rows, n_cols = out.shape
    if n_rows > _MAX_GRID * _TILE:  # its rows do not grid-stride (the DCT's are one image axis)
        raise ValueError(f"batched_matmul: {n_rows} rows, more than the {_MAX_GRID * _TILE} one grid covers")
    grid = (-(-n_cols // _TILE), -(-n_rows // _TILE), min(n_batch, _MAX_GRID))
    _configured(kernel, grid, (_TILE, _TILE), stream)(a, b, out)


# ---------------------------------------------------------------------------
# Host side: array kinds, streams, allocation
# ---------------------------------------------------------------------------


def _kind(a) -> str:
    if is_cupy_array(a):
        return "cupy"
    if getattr(a, "__cuda_ndarray__", False):  # a Numba device array (or the simulator's)
        return "numba"
    if hasattr(a, "__cuda_array_interface__"):
        return "cai"
    if isinstance(a, np.ndarray):
        return "numpy"
    raise TypeError(
        f"expected a CuPy array, a Numba device array, an object with __cuda_array_interface__ "
        f"or a NumPy array, got {type(a).__name__}"
    )


def _stream_ptr(stream) -> int:
    """The CUstream handle of a CuPy, PyTorch or Numba stream."""
    for attribute in ("ptr", "cuda_stream"):  # CuPy, PyTorch
        ptr = getattr(stream, attribute, None)
        if ptr is not None:
            return int(ptr)
    return int(stream)  # a Numba stream converts to its handle


#: Most foreign streams one context keeps wrappers of (:func:`_external_stream`); past it they are dropped.
_MAX_EXTERNAL_STREAMS = 64


def _external_stream(ptr: int):
    """Numba's wrapper of the foreign stream ``ptr`` in the current context, made once and reused.

    numba-cuda caches launch configurations (``Dispatcher.configure``, an LRU of 128) keyed on the
    stream object among others: a fresh ``external_stream`` at every launch would miss it every
    time. The wrappers live in the context's own store (``Context.extras``), so a context that is
    closed takes them with it; a handle CUDA reuses for a new stream is the same stream to a launch.
    """
    context = cuda.current_context()
    extras = getattr(context, "extras", None)
    if not isinstance(extras, dict):  # a Numba without the per-context store: no reuse
        return cuda.external_stream(ptr)
    streams = extras.setdefault("hcrfast_external_streams", {})
    stream = streams.get(ptr)
    if stream is None:
        if len(streams) >= _MAX_EXTERNAL_STREAMS:
            streams.clear()
        stream = streams[ptr] = cuda.external_stream(ptr)
    return stream


def _numba_stream(stream):
    """A Numba stream (0 for the default stream) from None or a CuPy, PyTorch or Numba stream."""
    if stream is None:
        return 0
    if hasattr(stream, "ptr") or hasattr(stream, "cuda_stream"):
        return _external_stream(_stream_ptr(stream))
    return stream


class _Launch:
    """Where one wrapper call runs: the input kind, the Numba stream, and its allocator.

    ``device(a, name)`` gives a Numba view of an input to pass to a kernel;
    ``empty(shape, dtype)`` gives ``(output, view)``: the array to hand back and
    its Numba view; ``result(output)`` finishes an output (a host copy for
    NumPy inputs).
    """

    def __init__(self, kind, stream, cupy=None):
        self.kind = kind
        self.stream = stream
        self.cupy = cupy

    def device(self, a, name, *, contiguous_copy_ok=True):
        if self.kind == "cupy":
            if not a.flags.c_contiguous:
                _require_contiguous_copy_ok(name, contiguous_copy_ok)
                a = self.cupy.ascontiguousarray(a)
            # No host sync: the kernels run on the stream CuPy is using (see _launch).
            return cuda.as_cuda_array(a, sync=False)
        if self.kind == "numpy":
            if not a.flags.c_contiguous:
                _require_contiguous_copy_ok(name, contiguous_copy_ok)
            return cuda.to_device(np.ascontiguousarray(a), stream=self.stream)
        view = a if self.kind == "numba" else cuda.as_cuda_array(a)
        if not view.is_c_contiguous():
            raise ValueError(f"{name} must be C-contiguous (got strides {view.strides}); pass a contiguous copy")
        return view

    def empty(self, shape, dtype):
        if self.kind == "cupy":
            out = self.cupy.empty(shape, dtype=dtype)
            return out, cuda.as_cuda_array(out, sync=False)
        out = cuda.device_array(shape, dtype=dtype, stream=self.stream)
        return out, out

    def result(self, out):
        if self.kind == "numpy":
            host = out.copy_to_host(stream=self.stream)
            self.synchronize()
            return host
        return out

    def synchronize(self):
        if self.stream != 0:
            self.stream.synchronize()


def _require_contiguous_copy_ok(name, ok):
    if not ok:
        raise ValueError(f"{name} is updated in place and must be C-contiguous; pass a contiguous array")


@contextlib.contextmanager
def _launch(arrays, stream):
    """Pick the kind and stream for one call; for CuPy, make that stream CuPy's current one.

    With CuPy inputs every allocation, copy and free of the call is ordered on
    the launch stream, on the inputs' device (Numba's context is switched to
    it), so no host synchronization is needed.
    """
    kinds = {_kind(a) for a in arrays}
    if len(kinds) > 1:
        raise TypeError(
            f"mixed array kinds in one call ({', '.join(sorted(kinds))}); move them all to one device first"
        )
    (kind,) = kinds
    _numba_cuda()
    if kind != "cupy":
        yield _Launch(kind, _numba_stream(stream))
        return
    cupy = import_cupy()
    devices = sorted({int(a.device.id) for a in arrays})
    if len(devices) > 1:
        raise ValueError(f"the arrays of one call are on GPUs {devices}; move them to one device first")
    device_id = devices[0]   # the inputs' device, whichever is CuPy's current one
    with contextlib.ExitStack() as scope:
        scope.enter_context(cupy.cuda.Device(device_id))   # its current stream, allocations and DCT operands
        current = cupy.cuda.get_current_stream()
        ptr = current.ptr if stream is None else _stream_ptr(stream)
        if ptr != current.ptr:
            with warnings_ignored((None, DeprecationWarning)):  # CuPy 14 deprecates ExternalStream for Stream.from_external
                external = cupy.cuda.ExternalStream(ptr, device_id)
            scope.enter_context(external)
        scope.enter_context(cuda.gpus[device_id])
        yield _Launch(kind, _external_stream(ptr), cupy)


def _check_dtype(name, view):
    dtype = np.dtype(view.dtype)
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {dtype}; cast it with .astype(np.float32)")
    return dtype


def _check_batched(name, view):
    if len(view.shape) < 1:
        raise ValueError(f"{name} must be batched with shape (B, ...), got a 0-d array")
    n_rows = view.shape[0]
    n_cols = int(np.prod(view.shape[1:], dtype=np.int64))
    return n_rows, n_cols


def _check_same(name, view, ref_name, ref):
    if tuple(view.shape) != tuple(ref.shape):
        raise ValueError(
            f"Shape mismatch: {ref_name} has shape {tuple(ref.shape)} but {name} has {tuple(view.shape)}; "
            f"pass arrays of one shape (B, ...)"
        )
    if np.dtype(view.dtype) != np.dtype(ref.dtype):
        raise TypeError(f"{name} is {view.dtype} but {ref_name} is {ref.dtype}; pass one dtype")


def _per_row(launch, name, values, n_rows):
    """A (B,) device view of a per-problem parameter; integers (NumPy or CuPy) as float64, as the twins take them."""
    try:
        kind = np.dtype(getattr(values, "dtype", np.float64)).kind
    except TypeError:   # (a torch tensor's dtype, which NumPy does not read: read from its device view below)
        kind = "f"
    if kind in "iu" and hasattr(values, "astype"):   # (a Numba device array has no astype: refused below)
        values = values.astype(np.float64)
    view = launch.device(values, name)
    if tuple(view.shape) != (n_rows,):
        raise ValueError(f"Shape mismatch: {name} must have shape ({n_rows},), got {tuple(view.shape)}")
    if not np.issubdtype(np.dtype(view.dtype), np.floating):
        raise TypeError(f"{name} must be a floating array, got {view.dtype}; cast it with .astype(np.float64)")
    return view


def _target_args(launch, target, n_rows, dummy):
    """Kernel arguments (targets, target, per_row) for a scalar or (B,) target."""
    if np.ndim(target) == 0:  # a 0-d device array too: one deliberate read of one number
        return dummy, float(target), False
    return _per_row(launch, "target", target, n_rows), 0.0, True


# ---------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------


def row_norms(a, *, stream=None):
    """Euclidean norm of each row, ``‖a[b]‖₂`` over all axes but the first.

    Kernel twin: :func:`hcrfast.kernels.twins.row_norms`. Sums of squares are
    accumulated in the dtype of ``a`` by a per-row tree reduction.

    Parameters
    ----------
    a : device array, shape (B, ...), float32 or float64
    stream : CuPy, PyTorch or Numba stream, optional

    Returns
    -------
    norms : array of shape (B,), same kind and dtype as ``a``
    """
    with _launch((a,), stream) as launch:
        view = launch.device(a, "a")
        dtype = _check_dtype("a", view)
        n_rows, n_cols = _check_batched("a", view)
        norms, norms_view = launch.empty((n_rows,), dtype)
        if n_rows:
            rows = view.reshape(n_rows, n_cols)
            _launch_rows(_kernels(dtype).row_normalize, n_rows, n_cols, launch.stream,
                         rows, norms_view, 0.0, False, False, rows, norms_view)
        return launch.result(norms)


def row_normalize(a, target=1.0, *, out=None, stream=None):
    """Rescale each row to norm ``target`` (Algorithm 1 step 4; LSQR's u/β and v/α).

    Computes ``n_b = ‖a[b]‖₂`` and ``scaled[b] = (t_b / n_b) · a[b]``, with
    ``t_b`` cast to the dtype of ``a``; a zero row (``n_b = 0``) stays zero.
    One block per row: a grid-stride sum of squares, a shared-memory tree
    reduction, then the scale pass, all in the dtype of ``a``. Kernel twin:
    :func:`hcrfast.kernels.twins.normalize_rows`.

    Parameters
    ----------
    a : device array, shape (B, ...), float32 or float64
    target : float or device array of shape (B,)
    out : array shaped like ``a``, C-contiguous, optional
        Receives the scaled rows (``a`` itself allowed: each block reads its row
        for the norm before it writes).
    stream : CuPy, PyTorch or Numba stream, optional

    Returns
    -------
    scaled : array shaped like ``a`` (``out`` when given)
    norms : array of shape (B,), dtype of ``a``
    """
    arrays = (a,) if np.ndim(target) == 0 and not _is_device_array(target) else (a, target)
    with _launch(arrays + (() if out is None else (out,)), stream) as launch:
        view = launch.device(a, "a", contiguous_copy_ok=out is not a)
        dtype = _check_dtype("a", view)
        n_rows, n_cols = _check_batched("a", view)
        if out is None:
            scaled, scaled_view = launch.empty(tuple(view.shape), dtype)
        elif out is a:
            scaled, scaled_view = out, view
        else:
            scaled, scaled_view = out, launch.device(out, "out", contiguous_copy_ok=False)
            _check_same("out", scaled_view, "a", view)
        norms, norms_view = launch.empty((n_rows,), dtype)
        targets, target_value, per_row = _target_args(launch, target, n_rows, norms_view)
        if n_rows:
            rows = view.reshape(n_rows, n_cols)
            _launch_rows(_kernels(dtype).row_normalize, n_rows, n_cols, launch.stream,
                         rows, targets, target_value, per_row, True,
                         scaled_view.reshape(n_rows, n_cols), norms_view)
        if out is not None and launch.kind == "numpy":
            scaled_view.copy_to_host(out, stream=launch.stream)
            return out, launch.result(norms)
        return (scaled if out is not None else launch.result(scaled)), launch.result(norms)


def lsqr_update_xw(x, w, v, t1, t2, *, stream=None):
    """LSQR's fused "update x and w" step, per problem, in place.

    ``x[b] ← x[b] + t1[b]·w[b]`` then ``w[b] ← t2[b]·w[b] + v[b]``, with
    ``t1 = φ/ρ`` and ``t2 = −θ/ρ`` per problem (Paige & Saunders 1982,
    LSQR; SciPy's ``lsqr`` "update x and w" block). One thread per element
    on a 2-D grid over columns × problems. Kernel twin:
    :func:`hcrfast.kernels.twins.lsqr_update_xw`.

    Parameters
    ----------
    x, w : device arrays, shape (B, ...), float32 or float64, C-contiguous; updated in place
    v : device array shaped like ``x``
    t1, t2 : device arrays of shape (B,), floating
    stream : CuPy, PyTorch or Numba stream, optional

    Returns
    -------
    (x, w) : the input arrays, updated
    """
    with _launch((x, w, v, t1, t2), stream) as launch:
        x_view = launch.device(x, "x", contiguous_copy_ok=False)
        w_view = launch.device(w, "w", contiguous_copy_ok=False)
        v_view = launch.device(v, "v")
        dtype = _check_dtype("x", x_view)
        _check_same("w", w_view, "x", x_view)
        _check_same("v", v_view, "x", x_view)
        n_rows, n_cols = _check_batched("x", x_view)
        t1_view = _per_row(launch, "t1", t1, n_rows)
        t2_view = _per_row(launch, "t2", t2, n_rows)
        if n_rows and n_cols:
            _launch_xw(_kernels(dtype).lsqr_update_xw, n_rows, n_cols, launch.stream,
                       x_view.reshape(n_rows, n_cols), w_view.reshape(n_rows, n_cols),
                       v_view.reshape(n_rows, n_cols), t1_view, t2_view)
        if launch.kind == "numpy":
            x_view.copy_to_host(x, stream=launch.stream)
            w_view.copy_to_host(w, stream=launch.stream)
            launch.synchronize()
        return x, w


def restart_update(fp, f0, target, *, stream=None):
    """Algorithm 1 steps 7 and 4: ``z = a(θ+ε) − a(θ)``, ``‖z‖`` and ``z̃ = target·z/‖z‖``.

    Per row b: ``z[b] = fp[b] − f0[b]``, ``n_b = ‖z[b]‖₂`` and
    ``z̃[b] = (t_b / n_b) · z[b]`` (``t_b`` cast to the dtype; ``z̃[b] = 0``
    when ``n_b = 0``), fused in one block-per-row kernel in the dtype of the
    inputs. Kernel twin: :func:`hcrfast.kernels.twins.restart_update`.

    Parameters
    ----------
    fp, f0 : device arrays, shape (B, ...), one dtype (float32 or float64)
        Features of the perturbed and of the unperturbed parameters.
    target : float or device array of shape (B,)
    stream : CuPy, PyTorch or Numba stream, optional

    Returns
    -------
    z : array shaped like ``fp``
    znorm : array of shape (B,)
    ztilde : array shaped like ``fp``
    """
    arrays = (fp, f0) if np.ndim(target) == 0 and not _is_device_array(target) else (fp, f0, target)
    with _launch(arrays, stream) as launch:
        fp_view = launch.device(fp, "fp")
        f0_view = launch.device(f0, "f0")
        dtype = _check_dtype("fp", fp_view)
        _check_same("f0", f0_view, "fp", fp_view)
        n_rows, n_cols = _check_batched("fp", fp_view)
        shape = tuple(fp_view.shape)
        z, z_view = launch.empty(shape, dtype)
        znorm, znorm_view = launch.empty((n_rows,), dtype)
        ztilde, ztilde_view = launch.empty(shape, dtype)
        targets, target_value, per_row = _target_args(launch, target, n_rows, znorm_view)
        if n_rows:
            _launch_rows(_kernels(dtype).restart_update, n_rows, n_cols, launch.stream,
                         fp_view.reshape(n_rows, n_cols), f0_view.reshape(n_rows, n_cols),
                         targets, target_value, per_row,
                         z_view.reshape(n_rows, n_cols), znorm_view, ztilde_view.reshape(n_rows, n_cols))
        return launch.result(z), launch.result(znorm), launch.result(ztilde)


def dct2(x, *, stream=None):
    """Orthonormal 2-D DCT-II over the last two axes, batched over all others.

    ``Y = C_H · X · C_Wᵀ`` per trailing (H, W) slice, with the orthonormal
    DCT-II matrix ``C[k, j] = s_k cos(π (2j+1) k / (2n))``, ``s_0 = √(1/n)``,
    ``s_k = √(2/n)`` (:func:`hcrfast.kernels.twins.dct_matrix`), i.e.
    ``scipy.fft.dctn(x, axes=(-2, -1), norm="ortho")``. Two tiled batched
    matrix products in the dtype of ``x``: ``T = X · C_Wᵀ``, then ``Y = C_H · T``.
    Kernel twin: :func:`hcrfast.kernels.twins.dct2`.

    Parameters
    ----------
    x : device array, shape (..., H, W), float32 or float64
    stream : CuPy, PyTorch or Numba stream, optional

    Returns
    -------
    y : array shaped like ``x``
    """
    return _separable_dct(x, inverse=False, name="x", stream=stream)


def idct2(y, *, stream=None):
    """Inverse of :func:`dct2`: ``X = C_Hᵀ · Y · C_W`` (``scipy.fft.idctn(..., norm="ortho")``).

    Computed as ``T = Y · C_W``, then ``X = C_Hᵀ · T``. Kernel twin:
    :func:`hcrfast.kernels.twins.idct2`.

    Parameters
    ----------
    y : device array, shape (..., H, W), float32 or float64
    stream : CuPy, PyTorch or Numba stream, optional

    Returns
    -------
    x : array shaped like ``y``
    """
    return _separable_dct(y, inverse=True, name="y", stream=stream)


def _is_device_array(a) -> bool:
    return is_cupy_array(a) or hasattr(a, "__cuda_array_interface__") or getattr(a, "__cuda_ndarray__", False)


@functools.lru_cache(maxsize=64)
def _cupy_dct_operand(n: int, dtype: str, transposed: bool, device_id: int):
    """C or Cᵀ as a (1, n, n) CuPy array on one device, cached across calls."""
    cupy = import_cupy()
    c = twins.dct_matrix(n, np, np.dtype(dtype))
    operand = cupy.asarray(np.ascontiguousarray(c.T if transposed else c)[None])
    # Once per cache entry: later calls may use it on any stream.
    cupy.cuda.get_current_stream().synchronize()
    return operand


def _dct_operand(launch, n, dtype, transposed):
    if launch.kind == "cupy":
        operand = _cupy_dct_operand(n, dtype.str, transposed, launch.cupy.cuda.Device().id)
        return cuda.as_cuda_array(operand, sync=False)
    c = twins.dct_matrix(n, np, dtype)
    return cuda.to_device(np.ascontiguousarray(c.T if transposed else c)[None], stream=launch.stream)


def _separable_dct(x, *, inverse, name, stream):
    with _launch((x,), stream) as launch:
        view = launch.device(x, name)
        dtype = _check_dtype(name, view)
        shape = tuple(view.shape)
        if len(shape) < 2:
            raise ValueError(f"{name} must have shape (..., H, W), got {shape}")
        height, width = shape[-2:]
        n_batch = int(np.prod(shape[:-2], dtype=np.int64))
        out, out_view = launch.empty(shape, dtype)
        if n_batch * height * width == 0:
            return launch.result(out)
        # forward: T = X · C_Wᵀ, Y = C_H · T;  inverse: T = Y · C_W, X = C_Hᵀ · T
        left = _dct_operand(launch, height, dtype, transposed=inverse)
        right = _dct_operand(launch, width, dtype, transposed=not inverse)
        _, tmp = launch.empty((n_batch, height, width), dtype)
        matmul = _kernels(dtype).batched_matmul
        _launch_matmul(matmul, view.reshape(n_batch, height, width), right, tmp, launch.stream)
        _launch_matmul(matmul, left, tmp, out_view.reshape(n_batch, height, width), launch.stream)
        return launch.result(out)
