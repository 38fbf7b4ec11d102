"""NumPy twins of the batched kernels: the CPU path and the test oracle.

Every function here is written on the array namespace of its input (NumPy or
CuPy), so the same code also serves as the GPU fallback. Batched arrays hold
one problem per row: shape ``(B, ...)``; a "row" is everything after axis 0.
The CUDA kernels in :mod:`hcrfast.kernels.cuda` compute exactly the same maths.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from hcrfast.backend import get_array_module


def row_norms(a):
    """Euclidean norm of each row: ``‖a[b]‖₂`` over all axes but the first, shape (B,)."""
    xp = get_array_module(a)
    flat = a.reshape(a.shape[0], math.prod(a.shape[1:]))  # not -1: NumPy cannot infer it for 0 rows
    return xp.sqrt(xp.einsum("bi,bi->b", flat, flat))


def normalize_rows(a, target=1.0, *, out=None):
    """Rescale each row to norm ``target`` (Algorithm 1 step 4; LSQR's u/β and v/α).

    Returns ``(scaled, norms)`` with ``norms = row_norms(a)``. A zero row stays
    zero (its scale is taken as 0, not NaN). ``target`` is a scalar or (B,).
    ``out`` (shaped like ``a``, ``a`` itself allowed) receives ``scaled``.
    """
    xp = get_array_module(a)
    norms = row_norms(a)
    nonzero = norms > 0  # once: each elementwise operation is a kernel launch on a GPU
    safe = xp.where(nonzero, norms, 1)
    # ``target / safe`` keeps a Python scalar on the host side of the kernel call: no transfer.
    scale = xp.where(nonzero, target / safe, 0).astype(a.dtype)
    scaled = xp.multiply(a, scale.reshape((-1,) + (1,) * (a.ndim - 1)), out=out)
    return scaled, norms


def lsqr_update_xw(x, w, v, t1, t2):
    """LSQR's fused "update x and w" step, per problem, in place.

    ``x ← x + t1·w`` then ``w ← v + t2·w`` with ``t1 = φ/ρ`` and ``t2 = −θ/ρ``
    given per problem, shape (B,). Stopped problems get ``t1 = 0`` from
    :func:`hcrfast.lsqr.lsqr_step`, so their x does not move.
    Returns ``(x, w)``.
    """
    t1 = t1.reshape((-1,) + (1,) * (x.ndim - 1))
    t2 = t2.reshape((-1,) + (1,) * (x.ndim - 1))
    x += t1 * w
    w *= t2
    w += v
    return x, w


def restart_update(features_perturbed, features, target):
    """Algorithm 1 steps 7 and 4: ``z = a(θ+ε) − a(θ)``, ``‖z‖`` and ``z̃ = target·z/‖z‖``.

    Returns ``(z, znorm, ztilde)``; a row with ``z = 0`` gives ``z̃ = 0``.
    """
    z = features_perturbed - features
    ztilde, znorm = normalize_rows(z, target)
    return z, znorm, ztilde


@functools.lru_cache(maxsize=32)
def _dct_matrix_host(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix C (n×n), float64: ``X = C x``, ``x = Cᵀ X``.

    ``C[k, j] = s_k cos(π (2j+1) k / (2n))`` with ``s_0 = √(1/n)``, ``s_k = √(2/n)``,
    SciPy's ``dct(type=2, norm="ortho")`` convention. Read-only: the cache hands the same array to every
    caller, and one that scaled it in place (``dct_matrix(4) *= 2``) changed every later DCT, and the bounds.
    """
    if n == 0:
        c = np.zeros((0, 0))
    else:
        k = np.arange(n)[:, None]
        j = np.arange(n)[None, :]
        c = np.cos(np.pi * (2 * j + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
        c[0] /= np.sqrt(2.0)
    c.setflags(write=False)
    return c


def dct_matrix(n: int, xp=np, dtype=np.float64):
    """The orthonormal DCT-II matrix of size n in namespace ``xp`` and ``dtype`` (NumPy float64: the cached
    array itself, read-only; copy it to write into it)."""
    return xp.asarray(_dct_matrix_host(n), dtype=dtype)


def dct2(x):
    """Orthonormal 2-D DCT-II over the last two axes, batched over all others.

    ``Y = C_H · X · C_Wᵀ`` per trailing (H, W) slice; equals
    ``scipy.fft.dctn(x, axes=(-2, -1), norm="ortho")``.
    """
    xp = get_array_module(x)
    ch = dct_matrix(x.shape[-2], xp, x.dtype)
    cw = dct_matrix(x.shape[-1], xp, x.dtype)
    return ch @ x @ cw.T


def idct2(y):
    """Inverse of :func:`dct2`: ``X = C_Hᵀ · Y · C_W`` (``idctn(..., norm="ortho")``)."""
    xp = get_array_module(y)
    ch = dct_matrix(y.shape[-2], xp, y.dtype)
    cw = dct_matrix(y.shape[-1], xp, y.dtype)
    return ch.T @ y @ cw
