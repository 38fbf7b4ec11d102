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


def row_norms(a, *, impl="auto"):
    """Euclidean norm of each row, shape (B,): see :func:`twins.row_norms`."""
    kernels = _numba_kernels(impl, a)
    return twins.row_norms(a) if kernels is None else kernels.row_norms(a)


def row_normalize(a, target=1.0, *, out=None, impl="auto"):
    """Rescale each row to norm ``target``; returns ``(scaled, norms)``: see :func:`twins.normalize_rows`.

    ``out`` (shaped like ``a``; ``a`` itself allowed) receives the scaled rows.
    """
    kernels = _numba_kernels(impl, a)
    if kernels is None:
        return twins.normalize_rows(a, target, out=out)
    return kernels.row_normalize(a, target, out=out)


def lsqr_update_xw(x, w, v, t1, t2, *, impl="auto"):
    """LSQR's in-place ``x += t1·w; w = v + t2·w``; returns ``(x, w)``: see :func:`twins.lsqr_update_xw`."""
    kernels = _numba_kernels(impl, x)
    return (twins if kernels is None else kernels).lsqr_update_xw(x, w, v, t1, t2)


def restart_update(features_perturbed, features, target, *, impl="auto"):
    """``(z, ‖z‖, target·z/‖z‖)`` with ``z = fp − f0``: see :func:`twins.restart_update`."""
    kernels = _numba_kernels(impl, features_perturbed)
    return (twins if kernels is None else kernels).restart_update(features_perturbed, features, target)


def dct2(x, *, impl="auto"):
    """Orthonormal 2-D DCT-II over the last two axes: see :func:`twins.dct2`."""
    kernels = _numba_kernels(impl, x)
    return (twins if kernels is None else kernels).dct2(x)


def idct2(y, *, impl="auto"):
    """Inverse of :func:`dct2`: see :func:`twins.idct2`."""
    kernels = _numba_kernels(impl, y)
    return (twins if kernels is None else kernels).idct2(y)
