"""Batched eigendecompositions of symmetric matrices, for the dense solve's Gram matrices (float64).

The dense solve (:func:`hcrfast.dense.min_norm_solver`) factors one Gram matrix per example
(the MNIST MLP: ~390 × 390 in float64; a chunk holds tens of examples on a CPU, thousands on a
GPU). ``torch.linalg.eigh`` runs such a batch one matrix at a time: on a CPU each through a
LAPACK call whose BLAS threads gain little at this size; on CUDA, for orders above 32, one
cuSOLVER call per matrix (``syevd``, or ``syevj`` for float32 at some orders; PyTorch's dispatch
batches only orders ≤ 32).

* ``impl="torch"``: ``torch.linalg.eigh`` where the matrices are (the twin: another LAPACK, or
  cuSOLVER).
* ``impl="lapack"``: LAPACK's divide and conquer ``dsyevd`` (what ``torch.linalg.eigh`` and
  ``numpy.linalg.eigh`` run on CPUs) from SciPy's LAPACK, one matrix per call, called through
  ctypes from a thread per core without the GIL (:mod:`hcrfast.kernels._lapack`), on the host;
  matrices on a GPU go there and back in one copy each way.
* ``impl="cusolver"`` (CUDA): cuSOLVER's batched eigensolver ``cusolverDnXsyevBatched`` (cuSOLVER
  11.7.1 / CUDA 12.6.2 on), up to :data:`DEVICE_BATCH_VALUES` matrix values per call, on the device,
  on torch's current stream, called through ctypes from the cuSOLVER torch loaded (no CuPy needed).
  PyTorch itself routes only orders ≤ 32 there (pytorch/pytorch#175585).
* ``impl="cupy"`` (CUDA, CuPy): ``cupy.linalg.eigh`` of the batch, which CuPy runs as cuSOLVER's
  batched Jacobi ``syevjBatched`` at any order, on the device.
* ``impl="auto"``: "lapack" for two or more float64 matrices that need no gradient, else "torch"
  (one large matrix gets all of BLAS's threads; torch's eigh has a derivative).

The two device routines' results are checked, matrix by matrix, before they are returned
(:data:`CHECK_TOL`): the residual ``‖S V − V diag(w)‖`` and ``‖VᵀV − I‖``, a few batched products on the
device. ``syevjBatched`` has returned the diagonal as the eigenvalues and the identity as the
eigenvectors for some inputs (cupy/cupy#4847, CUDA before 11.3.1), and Jacobi sweeps may stop short
of convergence without saying so (CuPy reads no ``info`` by default). A matrix that fails the check
is decomposed again by "lapack" on the host, with a ``RuntimeWarning`` that counts them.

On this 2-core machine, 32 Gram matrices of order 390 (``benchmarks/test_bench_dense.py``):
see benchmarks/README.md. On a GPU, "lapack" against cuSOLVER (one ``syevd`` after another through
torch, or batched: "cusolver", "cupy") awaits a measurement; "auto" stays "lapack" until then.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import warnings

import numpy as np
import torch

from hcrfast.backend import available_memory

from . import _lapack

__all__ = ["CHECK_TOL", "DEVICE_IMPLS", "IMPLS", "eigh_batch"]

IMPLS = ("auto", "torch", "lapack", "cusolver", "cupy")

#: The implementations that run on the GPU, whose results :func:`eigh_batch` checks.
DEVICE_IMPLS = ("cusolver", "cupy")

#: A device routine's decomposition ``(w, V)`` of ``S`` (order m) is kept where
#: ``‖S V − V diag(w)‖_F ≤ CHECK_TOL · m · eps · ‖S‖_F`` and ``‖VᵀV − I‖_F ≤ CHECK_TOL · m · eps``
#: (eps of the dtype); a backward-stable eigensolver's are a small multiple of ``m · eps``.
CHECK_TOL = 100.0

#: Matrix values per call of a device routine and per block of the check (its temporaries hold as
#: many values each): 2**27 float64 values are 1 GiB, 882 Gram matrices of order 390.
DEVICE_BATCH_VALUES = 2**27
#: ... and matrices per call: a user's report has cusolverDnXsyevBatched's size query refuse a batch
#: of 65,536 matrices of order 16 (not documented by NVIDIA); a refused batch is halved anyway.
DEVICE_BATCH_MATRICES = 32_768

#: dsyevd's workspace, 1 + 6m + 2m², must fit LAPACK's 32-bit integers.
_MAX_ORDER = 32_000


def _workers(m: int) -> int:
    """Threads for matrices of order ``m``: each holds a copy of its matrix and dsyevd's workspaces
    (about 3·m² float64 values: 226 MB at m = 3,072)."""
    return _lapack.workers(24 * m * m + 2**20, available_memory())


def _lapack_host(A: np.ndarray, orders: np.ndarray):
    """``(w, Z)``: per matrix, the padding's zero eigenvalues first, then the block's ascending; the
    eigenvectors as ROWS of Z (LAPACK's column-major output, copied contiguously)."""
    dsyevd = _lapack.routine("dsyevd", 11)
    g, m = A.shape[0], A.shape[1]
    w = np.zeros((g, m))
    Z = np.zeros((g, m, m))
    info = np.zeros(g, dtype=np.int64)
    finite = np.ones(g, dtype=bool)

    def task(lo: int, hi: int) -> None:
        # JOBZ = 'V'; UPLO = 'U': Fortran's upper triangle is the C array's lower one, which torch reads
        jobz = np.frombuffer(b"VU", dtype=np.uint8).copy()
        # workspaces for the largest matrix, once per thread (fresh large arrays cost page faults each time)
        k = int(orders[lo:hi].max(initial=0))
        zbuf, work, iwork = np.empty(k * k), np.empty(1 + 6 * k + 2 * k * k), np.empty(3 + 5 * k, dtype=np.int32)
        for a in range(lo, hi):
            n = int(orders[a])
            pad = m - n
            Z[a, np.arange(pad), n + np.arange(pad)] = 1.0    # the padding: unit vectors, eigenvalue 0
            if n == 0:
                continue
            # The C array read in Fortran order is the transpose (the same matrix, its lower triangle
            # as UPLO = 'U'); LAPACK overwrites z with the eigenvectors as Fortran columns, i.e. as the
            # rows of the C array.
            z = zbuf[:n * n].reshape(n, n)
            z[...] = A[a, :n, :n]
            if not np.isfinite(np.tril(z)).all():
                finite[a] = False
                continue
            lwork, liwork = 1 + 6 * n + 2 * n * n, 3 + 5 * n
            dims = np.array([n, n, lwork, liwork, 0], dtype=np.int32)   # N, LDA, LWORK, LIWORK, INFO
            vals = np.empty(n)
            at = dims.ctypes.data
            dsyevd(jobz.ctypes.data, jobz.ctypes.data + 1, at, z.ctypes.data, at + 4, vals.ctypes.data,
                   work.ctypes.data, at + 8, iwork.ctypes.data, at + 12, at + 16)
            info[a] = dims[4]
            w[a, pad:] = vals
            Z[a, pad:, :n] = z

    _lapack.run(task, _lapack.chunks(orders.astype(np.float64) ** 3, _workers(m)))
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"matrix {bad} (order {int(orders[bad])}) holds NaN or inf in its lower triangle: its "
                         f"entries must be finite (a Gram matrix JJᵀ of entries near 1e154 or more overflows float64)")
    if info.any():
        bad = int(np.flatnonzero(info)[0])
        raise np.linalg.LinAlgError(f"LAPACK dsyevd failed (info {int(info[bad])}) on matrix {bad} "
                                    f"(order {int(orders[bad])})")
    return w, Z


def _blocks(A: torch.Tensor, orders: np.ndarray) -> torch.Tensor:
    """A with each matrix's entries outside its leading ``orders[a]`` block set to 0 (A itself when
    every order is full)."""
    m = A.shape[1]
    if int(orders.min(initial=m)) >= m:
        return A
    inside = torch.arange(m, device=A.device)[None, :] < torch.as_tensor(orders, device=A.device)[:, None]
    return torch.where(inside[:, :, None] & inside[:, None, :], A, 0.0)


def _symmetric(A: torch.Tensor) -> torch.Tensor:
    """The symmetric matrices whose lower triangle is A's (what every implementation reads)."""
    S = torch.tril(A)
    S += torch.tril(A, -1).transpose(1, 2)
    return S


def _per_call(m: int) -> int:
    """Matrices per call of a device routine: :data:`DEVICE_BATCH_VALUES` values, at most
    :data:`DEVICE_BATCH_MATRICES` matrices."""
    return max(1, min(DEVICE_BATCH_MATRICES, DEVICE_BATCH_VALUES // max(1, m * m)))


# ------------------------------------------------------------------------------- cuSOLVER via ctypes
# cusolverStatus_t fn(...): every handle, parameter object, stream and array is a pointer; the enums
# (cusolverEigMode_t, cublasFillMode_t, cudaDataType) are C ints; n, lda, batchSize are int64_t
# (cusolverDn.h; tests/test_symmetric.py compares these with the header torch's CUDA wheel ships).
_P, _I, _I64, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
_SIGNATURES = {
    "cusolverDnCreate": [ctypes.POINTER(_P)],
    "cusolverDnSetStream": [_P, _P],
    "cusolverDnCreateParams": [ctypes.POINTER(_P)],
    # (handle, params, jobz, uplo, n, dataTypeA, A, lda, dataTypeW, W, computeType,
    #  *workspaceInBytesOnDevice, *workspaceInBytesOnHost, batchSize)
    "cusolverDnXsyevBatched_bufferSize": [_P, _P, _I, _I, _I64, _I, _P, _I64, _I, _P, _I,
                                          ctypes.POINTER(_SZ), ctypes.POINTER(_SZ), _I64],
    # (handle, params, jobz, uplo, n, dataTypeA, A, lda, dataTypeW, W, computeType,
    #  bufferOnDevice, workspaceInBytesOnDevice, bufferOnHost, workspaceInBytesOnHost, info, batchSize)
    "cusolverDnXsyevBatched": [_P, _P, _I, _I, _I64, _I, _P, _I64, _I, _P, _I, _P, _SZ, _P, _SZ, _P, _I64],
}
_EIG_MODE_VECTOR = 1            # CUSOLVER_EIG_MODE_VECTOR
_FILL_MODE_UPPER = 1            # CUBLAS_FILL_MODE_UPPER: Fortran's upper triangle is a C array's lower one
_CUDA_DTYPES = {torch.float32: 0, torch.float64: 1}   # CUDA_R_32F, CUDA_R_64F
#: cusolverStatus_t (cusolver_common.h): named in errors, so that hcrfast.algorithm's out-of-memory
#: handling (which halves the chunk) knows ALLOC_FAILED.
_STATUS = {1: "NOT_INITIALIZED", 2: "ALLOC_FAILED", 3: "INVALID_VALUE", 4: "ARCH_MISMATCH", 5: "MAPPING_ERROR",
           6: "EXECUTION_FAILED", 7: "INTERNAL_ERROR", 8: "MATRIX_TYPE_NOT_SUPPORTED", 9: "NOT_SUPPORTED",
           31: "INVALID_WORKSPACE"}
_INVALID_VALUE = 3
_CUSOLVER_LOCK = threading.Lock()   # a cuSOLVER handle is not to be used by two threads at once


def _new_lock_in_child() -> None:
    """A forked child starts with its own lock (_lapack's reason: one held by another thread would stay held)."""
    global _CUSOLVER_LOCK
    _CUSOLVER_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)
#: The soname of cuSOLVER in torch's CUDA wheels, by CUDA major version.
_SONAMES = {"12": "libcusolver.so.11", "13": "libcusolver.so.12"}


def _bind(lib, name: str):
    f = getattr(lib, name)
    f.restype, f.argtypes = ctypes.c_int, _SIGNATURES[name]
    return f


def _status(name: str, status: int) -> None:
    if status:
        raise RuntimeError(f"cuSOLVER's {name} returned CUSOLVER_STATUS_{_STATUS.get(status, 'UNKNOWN')} "
                           f"({status})")


def _mapped_cusolvers() -> list[str]:
    """Paths of the cuSOLVER libraries mapped into this process (/proc/self/maps; [] elsewhere)."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) == 6:
                    path = fields[5].removesuffix(" (deleted)")
                    if "/libcusolver.so" in path and path not in found:
                        found.append(path)
    except OSError:  # not on Linux
        pass
    return found


@functools.cache
def _cusolver_library():
    """The cuSOLVER torch loaded (a 1 × 1 decomposition on CUDA makes sure its CUDA linear algebra is
    loaded), opened by its path in this process's memory map, the one of torch's CUDA version first;
    else by name. The first one that has cusolverDnXsyevBatched."""
    torch.linalg.eigvalsh(torch.ones((1, 1), dtype=torch.float64, device="cuda"))
    own = _SONAMES.get(str(torch.version.cuda or "").split(".")[0], "")
    paths = sorted(_mapped_cusolvers(), key=lambda path: not (own and path.endswith("/" + own)))
    names = paths + [own, "libcusolver.so.12", "libcusolver.so.11", "libcusolver.so"]
    lacking = []
    for name in dict.fromkeys(n for n in names if n):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "cusolverDnXsyevBatched"):
            return lib
        lacking.append(name)
    if lacking:
        raise RuntimeError(f"the cuSOLVER this process loaded ({', '.join(lacking)}) has no cusolverDnXsyevBatched "
                           f"(cuSOLVER 11.7.1, CUDA 12.6.2 or newer has it): use impl='lapack' or 'torch'")
    raise RuntimeError(f"impl='cusolver' found no cuSOLVER library (looked for {', '.join(dict.fromkeys(names))}): "
                       f"install torch's CUDA build or use impl='lapack' or 'torch'")


@functools.cache
def _cusolver_handle(index: int):
    """A cuSOLVER handle and parameter object for CUDA device ``index``, made once per process."""
    lib = _cusolver_library()
    handle, params = _P(), _P()
    with torch.cuda.device(index):
        _status("cusolverDnCreate", _bind(lib, "cusolverDnCreate")(ctypes.byref(handle)))
        _status("cusolverDnCreateParams", _bind(lib, "cusolverDnCreateParams")(ctypes.byref(params)))
    return handle.value, params.value


_HOST_WORK: dict = {}


def _host_workspace(handle, size: int) -> np.ndarray:
    """The host workspace of ``handle``'s calls: kept for the process and grown as asked; a smaller one
    it replaces is kept too, as a call still queued may use it (the device workspace comes from torch's
    allocator, which is stream-ordered)."""
    bufs = _HOST_WORK.setdefault(handle, [])
    if not bufs or bufs[-1].size < max(1, size):
        bufs.append(np.empty(max(1, size), dtype=np.uint8))
    return bufs[-1]


def _workspace_budget(device: torch.device) -> int | None:
    """Bytes a call's device workspace may take: half the free memory (None off CUDA: no limit)."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0] // 2


def _syev_batched(lib, handle, params, stream, A: torch.Tensor, budget: int | None = None):
    """``(w, V)`` of the symmetric matrices whose lower triangles are A's (g, m, m), by
    ``cusolverDnXsyevBatched`` through ``lib`` on ``stream``, and its ``info`` (g,) on A's device.

    The batch is one column-major array of g matrices (lda = m); read as a C array each matrix is its
    transpose, the same symmetric matrix, so UPLO "upper" reads the C array's lower triangle, and the
    eigenvectors come back as Fortran columns, which are the C array's rows. The device workspace
    comes from torch's allocator on A's device (the call is queued on ``stream``, torch's current).
    A call takes :func:`_per_call` matrices at most, fewer (halved) while the workspace it asks for is
    over ``budget`` bytes or the size query refuses the batch (INVALID_VALUE).
    """
    g, m = A.shape[0], A.shape[1]
    V = A.detach().clone(memory_format=torch.contiguous_format)   # overwritten by the eigenvectors
    w = torch.zeros((g, m), dtype=A.dtype, device=A.device)
    info = torch.zeros(g, dtype=torch.int32, device=A.device)
    if g == 0 or m == 0:
        return w, V.transpose(1, 2), info
    dtype = _CUDA_DTYPES[A.dtype]
    _status("cusolverDnSetStream", _bind(lib, "cusolverDnSetStream")(handle, stream))
    size = _bind(lib, "cusolverDnXsyevBatched_bufferSize")
    run = _bind(lib, "cusolverDnXsyevBatched")
    lo, call = 0, _per_call(m)
    while lo < g:
        b = min(call, g - lo)
        a_ptr, w_ptr = V[lo].data_ptr(), w[lo].data_ptr()
        on_device, on_host = _SZ(0), _SZ(0)
        status = size(handle, params, _EIG_MODE_VECTOR, _FILL_MODE_UPPER, m, dtype, a_ptr, m, dtype, w_ptr, dtype,
                      ctypes.byref(on_device), ctypes.byref(on_host), b)
        if b > 1 and (status == _INVALID_VALUE or (not status and budget is not None and on_device.value > budget)):
            call = b // 2
            continue
        _status("cusolverDnXsyevBatched_bufferSize", status)
        device_work = torch.empty(max(1, on_device.value), dtype=torch.uint8, device=A.device)
        host_work = _host_workspace(handle, on_host.value)
        _status("cusolverDnXsyevBatched",
                run(handle, params, _EIG_MODE_VECTOR, _FILL_MODE_UPPER, m, dtype, a_ptr, m, dtype, w_ptr, dtype,
                    device_work.data_ptr(), on_device.value, host_work.ctypes.data, on_host.value,
                    info[lo].data_ptr(), b))
        lo += b
    return w, V.transpose(1, 2), info


def _cusolver_eigh(A: torch.Tensor):
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    handle, params = _cusolver_handle(index)
    with _CUSOLVER_LOCK, torch.cuda.device(index):
        return _syev_batched(_cusolver_library(), handle, params, torch.cuda.current_stream(index).cuda_stream, A,
                             budget=_workspace_budget(A.device))


def _cupy_eigh(A: torch.Tensor):
    """``cupy.linalg.eigh`` (CuPy runs cuSOLVER's ``syevjBatched``, with 32-bit sizes) on torch's stream,
    :func:`_per_call` matrices a call, the eigenpairs sorted ascending."""
    from hcrfast.bindings import array_module_for, from_torch, solver_stream, to_torch

    xp = array_module_for(A.device)
    g, m = A.shape[0], A.shape[1]
    w = torch.empty((g, m), dtype=A.dtype, device=A.device)
    V = torch.empty((g, m, m), dtype=A.dtype, device=A.device)
    lo, call = 0, _per_call(m)
    with solver_stream(A.device):
        while lo < g:
            hi = min(g, lo + call)
            try:
                wc, Vc = xp.linalg.eigh(from_torch(A[lo:hi]), UPLO="L")
            except Exception as exc:
                # CuPy sizes syevjBatched's workspace in a 32-bit int, which a large batch overflows
                # (cupy/cupy#7261: CUSOLVER_STATUS_INVALID_VALUE): fewer matrices a call, as "cusolver" does.
                if hi - lo > 1 and _refused_as_invalid(exc):
                    call = (hi - lo) // 2
                    continue
                raise
            wc, Vc = to_torch(wc), to_torch(Vc)
            order = torch.argsort(wc, dim=1)
            w[lo:hi] = wc.gather(1, order)
            V[lo:hi] = Vc.gather(2, order[:, None, :].expand_as(Vc))
            lo = hi
    return w, V, None


def _refused_as_invalid(exc: BaseException) -> bool:
    """A cuSOLVER call CuPy made came back ``CUSOLVER_STATUS_INVALID_VALUE`` (CuPy's ``CUSOLVERError`` keeps
    the status; its message names it)."""
    return getattr(exc, "status", None) == _INVALID_VALUE or "INVALID_VALUE" in str(exc)


def _checked(S: torch.Tensor, w: torch.Tensor, V: torch.Tensor, info, impl: str):
    """``(w, V)`` with every matrix whose decomposition fails the check (:data:`CHECK_TOL`; eigenvalues
    not ascending; or an ``info`` that is not 0) decomposed again by "lapack" on the host: one host read
    for the whole batch. Each matrix is scaled by its largest entry first (so that no norm overflows),
    and the products run in IEEE float32 or float64 whatever torch's TF32 settings say. A matrix with
    NaN or inf in its lower triangle is refused by name, as "lapack" refuses it."""
    from hcrfast.bindings import ieee_float32

    g, m = S.shape[0], S.shape[1]
    if g == 0 or m == 0:
        return w, V
    tol = CHECK_TOL * m * float(torch.finfo(S.dtype).eps)
    ok = torch.empty(g, dtype=torch.bool, device=S.device)
    finite = torch.empty(g, dtype=torch.bool, device=S.device)
    eye = torch.eye(m, dtype=S.dtype, device=S.device)
    with ieee_float32():
        for lo in range(0, g, _per_call(m)):
            sl = slice(lo, lo + _per_call(m))
            Sb, wb, Vb = S[sl], w[sl], V[sl]
            finite[sl] = torch.isfinite(Sb).flatten(1).all(dim=1)
            scale = Sb.abs().flatten(1).amax(dim=1).clamp_min(torch.finfo(S.dtype).tiny)
            Sb, wb = Sb / scale[:, None, None], wb / scale[:, None]
            res = torch.linalg.vector_norm(torch.baddbmm(Vb * wb[:, None, :], Sb, Vb, beta=-1), dim=(1, 2))
            orth = torch.linalg.vector_norm(Vb.transpose(1, 2) @ Vb - eye, dim=(1, 2))
            ascending = (wb[:, 1:] >= wb[:, :-1]).all(dim=1)
            ok[sl] = ((res <= tol * torch.linalg.vector_norm(Sb, dim=(1, 2))) & (orth <= tol)
                      & torch.isfinite(wb).all(dim=1) & ascending)
    if info is not None:
        ok &= info == 0
    flags = torch.stack([ok, finite]).cpu().numpy()
    if not flags[1].all():
        bad = int(np.flatnonzero(~flags[1])[0])
        raise ValueError(f"matrix {bad} (order {m} with the outside of its block zeroed) holds NaN or inf in its "
                         f"lower triangle: its entries must be finite (a Gram matrix JJᵀ of entries near 1e154 or "
                         f"more overflows float64)")
    bad = np.flatnonzero(~flags[0])
    if bad.size:
        from hcrfast.validation import HcrfastRuntimeWarning   # (lazily: the kernels load without hcrfast's core)

        warnings.warn(f"eigh_batch(impl={impl!r}): {bad.size} of {g} decompositions failed the check "
                      f"(residual or orthogonality above {CHECK_TOL:g}·m·eps, eigenvalues out of order, or a "
                      f"nonzero info; the first: matrix {int(bad[0])}) and were redone by LAPACK on the host",
                      HcrfastRuntimeWarning, stacklevel=4)
        idx = torch.as_tensor(bad, device=S.device)
        w_h, Z = _lapack_host(S.index_select(0, idx).double().cpu().numpy(), np.full(bad.size, m))
        w, V = w.clone(), V.clone()
        w[idx] = torch.from_numpy(w_h).to(device=S.device, dtype=w.dtype)
        V[idx] = torch.from_numpy(Z).to(device=S.device, dtype=V.dtype).transpose(1, 2)
    return w, V


def eigh_batch(A: torch.Tensor, orders=None, *, impl: str = "auto"):
    """Eigenvalues and eigenvectors of ``g`` symmetric matrices ``A`` (g, m, m), as ``torch.linalg.eigh``.

    Only the lower triangle is read (as ``torch.linalg.eigh`` reads it); its entries must be finite.
    ``A`` that requires grad (with grad mode on) goes to torch, whose eigh has a derivative. With ``orders`` (g,) integers in 0..m, matrix a is its leading
    ``orders[a]`` × ``orders[a]`` block with zeros elsewhere (what lies outside the block is
    ignored): "lapack" decomposes the block alone (a batch of unequal orders costs what its
    matrices do, not g times the largest).

    "torch", "cusolver" and "cupy" decompose each matrix with the outside zeroed (g matrices of the
    largest order); "cusolver" and "cupy" take float32 or float64 matrices on a CUDA device (under
    hcrfast's CuPy stand-in in the tests, "cupy" also takes CPU tensors), and their results are checked
    (:data:`CHECK_TOL`).

    Returns ``(w, V)`` on A's device in A's dtype: ``w`` (g, m) the eigenvalues, ``V`` (g, m, m)
    the eigenvectors as columns (``A V = V diag(w)``), ascending, except that with ``orders`` the
    padding's zero eigenvalues (unit vectors outside the block) come first under "lapack"; the
    largest is last either way, unless a block's eigenvalues are all negative.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if not isinstance(A, torch.Tensor) or A.ndim != 3 or A.shape[1] != A.shape[2]:
        raise ValueError(f"A must be a (g, m, m) torch tensor, got {type(A).__name__} of shape "
                         f"{tuple(getattr(A, 'shape', ()))}")
    g, m = A.shape[0], A.shape[1]
    if orders is None:
        orders = np.full(g, m, dtype=np.int64)
    else:
        orders = np.asarray(orders.cpu() if isinstance(orders, torch.Tensor) else orders)
        if orders.dtype == bool or not np.issubdtype(orders.dtype, np.integer):
            raise ValueError(f"orders must be integers, got dtype {orders.dtype}")
        orders = orders.astype(np.int64)
        if orders.shape != (g,) or (g and (orders.min() < 0 or orders.max() > m)):
            raise ValueError(f"orders must be ({g},) integers in 0..{m}, got shape {orders.shape}"
                             + (f", range {orders.min()}..{orders.max()}" if orders.size else ""))
    differentiable = A.requires_grad and torch.is_grad_enabled()
    if impl == "auto":
        impl = "lapack" if A.dtype == torch.float64 and g >= 2 and not differentiable and m < _MAX_ORDER else "torch"
    if impl == "torch":
        return torch.linalg.eigh(_blocks(A, orders))
    if impl in DEVICE_IMPLS:
        return _device_eigh(A, orders, impl, differentiable)
    if A.dtype != torch.float64:
        raise ValueError(f"impl='lapack' decomposes float64 matrices, got {A.dtype}: convert with A.double()")
    if differentiable:
        raise ValueError("impl='lapack' has no derivative and A requires grad: use impl='torch' (or 'auto'), "
                         "or detach A / run under torch.no_grad()")
    if m >= _MAX_ORDER:
        raise ValueError(f"impl='lapack' takes orders below {_MAX_ORDER} (LAPACK's 32-bit workspace sizes), "
                         f"got {m}: use impl='torch'")
    w, Z = _lapack_host(A.detach().cpu().numpy(), orders)
    return (torch.from_numpy(w).to(A.device),
            torch.from_numpy(Z).to(A.device).transpose(1, 2))


def _device_eigh(A: torch.Tensor, orders: np.ndarray, impl: str, differentiable: bool):
    from hcrfast.bindings import array_module_for

    if differentiable:
        raise ValueError(f"impl={impl!r} has no derivative and A requires grad: use impl='torch' (or 'auto'), "
                         f"or detach A / run under torch.no_grad()")
    if A.dtype not in _CUDA_DTYPES:
        raise ValueError(f"impl={impl!r} decomposes float32 or float64 matrices, got {A.dtype}: convert with A.double()")
    on_device = A.device.type == "cuda" or (impl == "cupy" and array_module_for(A.device) is not np)
    if not on_device:
        raise ValueError(f"impl={impl!r} runs on a CUDA device, and A is on {A.device}: move A there (A.cuda()) "
                         f"or use impl='lapack' (the host's LAPACK) or 'torch'")
    S = _symmetric(_blocks(A.detach(), orders))
    w, V, info = (_cusolver_eigh if impl == "cusolver" else _cupy_eigh)(S)
    return _checked(S, w, V, info, impl)
