"""Batched kernels behind one dispatch: NumPy/CuPy twins and Numba CUDA kernels.

Each function takes ``impl`` ("auto", "twin" or "numba"):

* NumPy inputs always run the twin (:mod:`hcrfast.kernels.twins`); the Numba
  kernels are CUDA kernels, so ``impl`` does not change the CPU path.
* CuPy inputs run the Numba kernel (:mod:`hcrfast.kernels.cuda`) for
  ``impl="numba"`` and the twin, which is written on the array namespace and so
  runs on CuPy, for ``impl="twin"``. ``"auto"`` picks the twin for now.

Importing this package needs neither numba.cuda nor a GPU: the kernel module is
imported on the first ``impl="numba"`` call with CuPy data.
"""
from __future__ import annotations

import numpy as np

from hcrfast.backend import is_cupy_array

from . import twins

__all__ = ["IMPLS", "dct2", "idct2", "lsqr_update_xw", "restart_update", "row_normalize", "row_norms", "twins"]

IMPLS = ("auto", "twin", "numba")


def _numba_kernels(impl, *arrays):
    """The Numba kernel module when ``impl`` selects it for these arrays, else None (run the twin)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    # "auto" on CuPy runs the twin until benchmarks on a GPU say, kernel by
    # kernel, where the Numba kernel wins (the twins' reductions and GEMMs are
    # CuPy/cuBLAS calls, not obviously slower).
    if impl != "numba" or not any(is_cupy_array(a) for a in arrays):
        return None
    from . import cuda

    return cuda


def _floating(name, a, min_ndim: int = 1):
    """``a`` checked: a NumPy or CuPy array of floats with at least ``min_ndim`` axes (the twins would run
    on integers and truncate their DCT matrix or scale to 0, and broadcast what the CUDA kernels refuse)."""
    dtype, shape = getattr(a, "dtype", None), getattr(a, "shape", None)
    if dtype is None or shape is None or type(a).__module__.startswith("torch") or (
            not hasattr(a, "__array__") and not is_cupy_array(a)):
        raise TypeError(f"{name} must be a NumPy or CuPy array, got {type(a).__name__} (torch tensors: "
                        f"hcrfast.bindings.from_torch)")
    # float16 runs on the twins alone (a float16 model with no float32 copy, certify=False); longdouble ran at
    # float64's accuracy (the DCT matrix is float64's)
    if np.dtype(dtype) not in (np.float32, np.float64) and not (np.dtype(dtype) == np.float16 and not is_cupy_array(a)):
        raise TypeError(f"{name} must hold float32 or float64, got {dtype}; cast it with .astype(np.float64)")
    if len(shape) < min_ndim:
        want = "(..., H, W)" if min_ndim == 2 else "(B, ...)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(shape)}")
    return a


def _same(name, a, ref_name, ref):
    """``a`` of ``ref``'s shape and dtype (the CUDA kernels refuse mixed dtypes; the twins promoted them)."""
    if tuple(a.shape) != tuple(ref.shape):
        raise ValueError(f"Shape mismatch: {ref_name} has shape {tuple(ref.shape)} but {name} has "
                         f"{tuple(a.shape)}; pass arrays of one shape (B, ...)")
    if np.dtype(a.dtype) != np.dtype(ref.dtype):
        raise TypeError(f"{name} is {np.dtype(a.dtype)} but {ref_name} is {np.dtype(ref.dtype)}; pass arrays of one "
                        f"dtype (cast with .astype({ref_name}.dtype))")


def _per_row(name, value, rows: int, scalar_ok: bool):
    """A per-problem parameter: shape (B,) (or one number where ``scalar_ok``)."""
    shape = tuple(getattr(value, "shape", ()))
    if scalar_ok and shape == ():
        return
    if shape != (rows,):
        raise ValueError(f"Shape mismatch: {name} must have shape ({rows},)"
                         + (" or be one number" if scalar_ok else "") + f", got {shape}")
    if np.dtype(getattr(value, "dtype", np.float64)).kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got {value.dtype}")


def row_norms(a, *, impl="auto"):
    """Euclidean norm of each row, shape (B,): see :func:`twins.row_norms`."""
    kernels = _numba_kernels(impl, a)
    _floating("a", a)
    return twins.row_norms(a) if kernels is None else kernels.row_norms(a)


def row_normalize(a, target=1.0, *, out=None, impl="auto"):
    """Rescale each row to norm ``target``; returns ``(scaled, norms)``: see :func:`twins.normalize_rows`.

    ``out`` (shaped like ``a``; ``a`` itself allowed) receives the scaled rows.
    """
    kernels = _numba_kernels(impl, a)
    _per_row("target", target, _floating("a", a).shape[0], scalar_ok=True)
    if out is not None:
        _same("out", _floating("out", out), "a", a)
    if kernels is None:
        return twins.normalize_rows(a, target, out=out)
    return kernels.row_normalize(a, target, out=out)


def lsqr_update_xw(x, w, v, t1, t2, *, impl="auto"):
    """LSQR's in-place ``x += t1·w; w = v + t2·w``; returns ``(x, w)``: see :func:`twins.lsqr_update_xw`."""
    kernels = _numba_kernels(impl, x)
    for name, a in (("w", w), ("v", v)):
        _same(name, _floating(name, a), "x", _floating("x", x))
    for name, t in (("t1", t1), ("t2", t2)):
        _per_row(name, t, x.shape[0], scalar_ok=False)
    return (twins if kernels is None else kernels).lsqr_update_xw(x, w, v, t1, t2)


def restart_update(features_perturbed, features, target, *, impl="auto"):
    """``(z, ‖z‖, target·z/‖z‖)`` with ``z = fp − f0``: see :func:`twins.restart_update`."""
    kernels = _numba_kernels(impl, features_perturbed)
    _same("features", _floating("features", features), "features_perturbed",
          _floating("features_perturbed", features_perturbed))
    _per_row("target", target, features_perturbed.shape[0], scalar_ok=True)
    return (twins if kernels is None else kernels).restart_update(features_perturbed, features, target)


def dct2(x, *, impl="auto"):
    """Orthonormal 2-D DCT-II over the last two axes: see :func:`twins.dct2`."""
    kernels = _numba_kernels(impl, x)
    _floating("x", x, 2)
    return (twins if kernels is None else kernels).dct2(x)


def idct2(y, *, impl="auto"):
    """Inverse of :func:`dct2`: see :func:`twins.idct2`."""
    kernels = _numba_kernels(impl, y)
    _floating("y", y, 2)
    return (twins if kernels is None else kernels).idct2(y)
