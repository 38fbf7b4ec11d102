"""Batched eigendecompositions of symmetric tridiagonal matrices on the host, for the Krylov basis.

Each example's basis ends with the tridiagonal ``B_kᵀB_k`` (k up to a few thousand) whose
eigenvectors its solves project on (:func:`hcrfast.krylov._factors`). One decomposition is
LAPACK's divide and conquer, ``dstevd`` (what ``scipy.linalg.eigh_tridiagonal`` runs for all
eigenpairs): ~3 ms at k = 390 on one core. A GPU slice of the MNIST target holds 1,250 of them.

* ``impl="twin"``: ``scipy.linalg.eigh_tridiagonal(..., lapack_driver="stevd")`` one matrix at a
  time. SciPy's wrapper keeps the GIL through the call, so Python threads do not run two at
  once (2 threads: 4.4 ms per matrix against 3.2 ms serial on 2 cores); the H100 profile of
  MNIST spent 9.2 of 21.5 s of a slice here (benchmarks/results/gpu_h100-*_20261127).
* ``impl="numba"``: the same ``dstevd``, from SciPy's own LAPACK (``scipy.linalg.cython_lapack``),
  called from a Numba function that releases the GIL, over chunks of rows in a thread per core,
  with BLAS held to one thread (``threadpoolctl``) for the call so that the cores are not
  oversubscribed. (A plain ``nogil`` function, not ``parallel=True``: it compiles in a third of
  the time, and no Numba threading layer is involved.)
* ``impl="lapack"`` (what ``"auto"`` takes): the same ``dstevd`` called through ctypes, which
  releases the GIL (:mod:`hcrfast.kernels._lapack`), a matrix per call from a thread per core, the
  sorting and truncation in NumPy. As fast as the Numba loop (64 bases of k = 386 on this machine's
  2 cores: 0.37 s against 0.34 s; 1 thread: 0.82 s both) without its compilation (~2-4 s once per
  process, which every Krylov run paid).

All return the same values (the same LAPACK routine on the same data; tests compare them).

:func:`eigh_tridiagonal_device` is the same contract on the GPU (``impl`` "cusolver" or "cupy"): the
matrices are written out dense on the device and decomposed by a batched cuSOLVER routine
(:func:`hcrfast.kernels.symmetric.eigh_batch`, whose results are checked there); the eigenvectors stay
on the device, and only the eigenvalues come to the host. Not yet run on a GPU.
"""
from __future__ import annotations

import functools

import numpy as np

from hcrfast.backend import available_memory

from . import _lapack


class NonFiniteMatrix(ValueError):
    """A tridiagonal matrix with NaN or inf among its entries (:func:`eigh_tridiagonal_batch`,
    :func:`eigh_tridiagonal_device`); ``row`` and ``k`` name the first such matrix. A caller that built the
    matrices (:mod:`hcrfast.krylov`) catches it to say what overflowed and what to change."""

    def __init__(self, message: str, row: int, k: int):
        super().__init__(message)
        self.row, self.k = row, k

__all__ = ["DEVICE_IMPLS", "IMPLS", "eigh_tridiagonal_batch", "eigh_tridiagonal_device"]

IMPLS = ("auto", "twin", "numba", "lapack")

#: :func:`eigh_tridiagonal_device`'s implementations (:data:`hcrfast.kernels.symmetric.DEVICE_IMPLS`).
DEVICE_IMPLS = ("cusolver", "cupy")

def _cut(lam_max, k, rtol: float, noise: float):
    """The rank cut of a descending spectrum of order ``k`` whose largest eigenvalue is ``lam_max``:
    ``max(rtol, k·noise)² · lam_max`` (scalars, or arrays over rows)."""
    return np.maximum(rtol, k * noise) ** 2 * np.maximum(lam_max, np.finfo(np.float64).tiny)


def _postprocess(lam_desc: np.ndarray, k: int, rtol: float, noise: float) -> int:
    """Clip a descending spectrum at 0 and count the eigenvalues kept: the rank."""
    np.clip(lam_desc, 0, None, out=lam_desc)
    return int((lam_desc > _cut(lam_desc[0], k, rtol, noise)).sum())


def _twin(diag, off, ks, rtol, noise):
    import scipy.linalg

    g, K = diag.shape[0], int(ks.max()) if len(ks) else 0
    lam = np.zeros((g, K))
    Y = np.zeros((g, K, K))
    ranks = np.zeros(g, dtype=np.int64)
    for a, k in enumerate(ks):
        k = int(k)
        if k == 0:
            continue
        if k == 1:
            w, z = diag[a, :1].copy(), np.ones((1, 1))
        else:
            w, z = scipy.linalg.eigh_tridiagonal(diag[a, :k], off[a, :k - 1], lapack_driver="stevd")
        lam[a, :k] = w[::-1]
        r = ranks[a] = _postprocess(lam[a, :k], k, rtol, noise)
        Y[a, :r, :k] = z[:, ::-1][:, :r].T
    return lam, Y, ranks


@functools.cache
def _numba_kernel():
    """Compile (or load from Numba's cache) the parallel loop over ``dstevd``."""
    import ctypes

    import numba
    from numba.extending import get_cython_function_address

    # DSTEVD(JOBZ, N, D, E, Z, LDZ, WORK, LWORK, IWORK, LIWORK, INFO): every argument by reference.
    dstevd = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 11))(
        get_cython_function_address("scipy.linalg.cython_lapack", "dstevd"))
    tiny = np.finfo(np.float64).tiny

    @numba.njit(nogil=True)  # no cache=True: the LAPACK address differs per process
    def kernel(lo, hi, diag, off, ks, rtol, noise, lam, Y, ranks, info):
        for a in range(lo, hi):
            n = ks[a]
            if n == 0:
                Y[a, :, :] = 0.0
                continue
            d = diag[a, :n].copy()
            e = np.zeros(n)
            e[:n - 1] = off[a, :n - 1]
            z = np.empty((n, n))  # Fortran order: eigenvector j is z[j, :]
            jobz = np.array([ord("V")], dtype=np.uint8)
            dims = np.array([n, n, 1 + 4 * n + n * n, 3 + 5 * n, 0], dtype=np.int32)  # N, LDZ, LWORK, LIWORK, INFO
            work = np.empty(1 + 4 * n + n * n)
            iwork = np.empty(3 + 5 * n, dtype=np.int32)
            dstevd(jobz.ctypes, dims[0:].ctypes, d.ctypes, e.ctypes, z.ctypes, dims[1:].ctypes, work.ctypes,
                   dims[2:].ctypes, iwork.ctypes, dims[3:].ctypes, dims[4:].ctypes)
            info[a] = dims[4]
            # descending, clipped at 0; kept: above max(rtol, n·noise)² of the largest
            for j in range(n):
                lam[a, j] = max(d[n - 1 - j], 0.0)
            thr = max(rtol, n * noise) ** 2 * max(lam[a, 0], tiny)
            r = 0
            for j in range(n):
                if lam[a, j] > thr:
                    r += 1
            ranks[a] = r
            for j in range(r):  # eigenvector j (descending) as row j: contiguous reads and writes
                Y[a, j, :n] = z[n - 1 - j, :]
                Y[a, j, n:] = 0.0
            Y[a, r:, :] = 0.0

    return kernel


def _workers(k: int = 0) -> int:
    """Threads for matrices of order up to ``k``: one per core this process may use, but no more than
    the workspaces (2·k² float64 values each: the eigenvectors and LAPACK's work) that fit in a
    quarter of the available memory (ResNet-18's k = 4,096: 268 MB a thread)."""
    return _lapack.workers(16 * k * k + 2**20, available_memory())


def _numba(diag, off, ks, rtol, noise):
    kernel = _numba_kernel()
    g, K = diag.shape[0], int(ks.max()) if len(ks) else 0
    lam = np.zeros((g, K))
    Y = np.empty((g, K, K))
    ranks = np.zeros(g, dtype=np.int64)
    info = np.zeros(g, dtype=np.int32)
    args = (np.ascontiguousarray(diag), np.ascontiguousarray(off), ks, float(rtol), float(noise), lam, Y, ranks, info)
    # Rows in chunks of about equal work (k³ each), one per core: the kernel holds no GIL. BLAS is held
    # to one thread meanwhile, under the lock every host LAPACK call of hcrfast takes (kernels._lapack).
    _lapack.run(lambda lo, hi: kernel(lo, hi, *args), _lapack.chunks(ks.astype(np.float64) ** 3, _workers(K)))
    if info.any():
        bad = int(np.flatnonzero(info)[0])
        raise np.linalg.LinAlgError(f"LAPACK dstevd failed to converge (info {int(info[bad])}) on the tridiagonal "
                                    f"matrix of row {bad} (k = {int(ks[bad])})")
    return lam, Y, ranks


def _lapack_threads(diag, off, ks, rtol, noise):
    dstevd = _lapack.routine("dstevd", 11)
    g, K = diag.shape[0], int(ks.max()) if len(ks) else 0
    lam = np.zeros((g, K))
    Y = np.zeros((g, K, K))
    ranks = np.zeros(g, dtype=np.int64)
    info = np.zeros(g, dtype=np.int64)

    def task(lo: int, hi: int) -> None:
        jobz = np.frombuffer(b"V", dtype=np.uint8).copy()
        # workspaces for the largest matrix, once per thread (fresh large arrays cost page faults each time)
        m = int(ks[lo:hi].max(initial=0))
        zbuf, work, iwork = np.empty(m * m), np.empty(1 + 4 * m + m * m), np.empty(3 + 5 * m, dtype=np.int32)
        for a in range(lo, hi):
            n = int(ks[a])
            if n == 0:
                continue
            d = np.array(diag[a, :n], dtype=np.float64)
            e = np.zeros(n)
            e[:n - 1] = off[a, :n - 1]
            z = zbuf[:n * n].reshape(n, n)   # Fortran order: eigenvector j is z[j, :]
            lwork, liwork = 1 + 4 * n + n * n, 3 + 5 * n
            dims = np.array([n, n, lwork, liwork, 0], dtype=np.int32)   # N, LDZ, LWORK, LIWORK, INFO
            at = dims.ctypes.data
            dstevd(jobz.ctypes.data, at, d.ctypes.data, e.ctypes.data, z.ctypes.data, at + 4, work.ctypes.data,
                   at + 8, iwork.ctypes.data, at + 12, at + 16)
            info[a] = dims[4]
            lam[a, :n] = d[::-1]
            r = ranks[a] = _postprocess(lam[a, :n], n, rtol, noise)
            Y[a, :r, :n] = z[::-1][:r]   # eigenvectors of the kept ones as rows, descending

    _lapack.run(task, _lapack.chunks(ks.astype(np.float64) ** 3, _workers(K)))
    if info.any():
        bad = int(np.flatnonzero(info)[0])
        raise np.linalg.LinAlgError(f"LAPACK dstevd failed to converge (info {int(info[bad])}) on the tridiagonal "
                                    f"matrix of row {bad} (k = {int(ks[bad])})")
    return lam, Y, ranks


def eigh_tridiagonal_batch(diag, off, ks, *, rtol: float, noise: float = 0.0, impl: str = "auto"):
    """Eigendecompositions of ``g`` symmetric tridiagonal matrices, descending, truncated at a rank.

    Row ``a`` holds a matrix of order ``ks[a]``: diagonal ``diag[a, :k]``, off-diagonal
    ``off[a, :k-1]`` (entries past them are ignored). Returns ``(lam, Y, ranks)``: ``lam`` (g, K)
    the eigenvalues in descending order, clipped at 0 (0 past each row's k); ``ranks[a]`` how many
    exceed ``max(rtol, k·noise)² · lam[a, 0]``; ``Y`` (g, K, K) the eigenvectors of the kept ones as
    ROWS, in the same order (``Y[a, j, :k]``: eigenvector j), zero past row rank and column k.
    K = max(ks). (Rows: LAPACK's column-major output copies to them contiguously; the caller takes
    the transpose as a view.)
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    diag, off = np.asarray(diag, dtype=np.float64), np.asarray(off, dtype=np.float64)
    ks = np.asarray(ks, dtype=np.int64)
    if diag.ndim != 2 or off.shape != diag.shape or ks.shape != diag.shape[:1]:
        raise ValueError(f"diag and off must be (g, K) and ks (g,), got {diag.shape}, {off.shape}, {ks.shape}")
    if len(ks) and (ks.min() < 0 or ks.max() > diag.shape[1]):
        raise ValueError(f"ks must lie in 0..{diag.shape[1]} (the columns of diag), got {ks.min()}..{ks.max()}")
    cols = np.arange(diag.shape[1])[None, :]
    bad = ~(np.isfinite(diag) | (cols >= ks[:, None])) | ~(np.isfinite(off) | (cols >= ks[:, None] - 1))
    if bad.any():
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        raise NonFiniteMatrix(f"the tridiagonal matrix of row {row} (k = {int(ks[row])}) holds NaN or inf: "
                              f"its entries must be finite", row, int(ks[row]))
    run = {"auto": _lapack_threads, "lapack": _lapack_threads, "numba": _numba, "twin": _twin}[impl]
    return run(diag, off, ks, rtol, noise)


def eigh_tridiagonal_device(diag, off, ks, *, rtol: float, noise: float = 0.0, impl: str = "cusolver"):
    """:func:`eigh_tridiagonal_batch` on the device: ``diag``, ``off`` (g, K) torch tensors where the
    bases are (CUDA), ``ks`` (g,) integers. Returns ``(lam, Y, ranks)`` as it does (``lam`` and ``ranks``
    NumPy arrays on the host, one copy; ``Y`` (g, r, K) on the device, r = max(ranks): the kept
    eigenvectors as rows, zero past each row's rank and k; a view of a (g, K, K) array).

    Peak device memory: that (g, K, K) float64 array (1.5 GB for 1,250 bases of K = 390), plus one
    block's dense matrices and the decomposition's arrays (a quarter of DEVICE_BATCH_VALUES each).

    Accuracy: a dense eigensolver's eigenvalue errors are ~eps·‖T‖, where LAPACK's ``dstevd`` resolves
    much smaller eigenvalues of these graded matrices; :func:`hcrfast.krylov._factors` uses this path
    only where its rank cut lies well above that (float32 bases), and the host otherwise.

    The tridiagonal matrices are written out dense, each matrix its leading ks[a] block, and decomposed by
    :func:`hcrfast.kernels.symmetric.eigh_batch` with ``impl`` ("cusolver": cusolverDnXsyevBatched;
    "cupy": syevjBatched), its results checked matrix by matrix (a failed one is redone on the host)."""
    import torch

    from . import symmetric

    if impl not in DEVICE_IMPLS:
        raise ValueError(f"impl must be one of {DEVICE_IMPLS}, got {impl!r}")
    ks = np.asarray(ks, dtype=np.int64)
    g, K = diag.shape[0], int(ks.max()) if len(ks) else 0
    if not (isinstance(diag, torch.Tensor) and isinstance(off, torch.Tensor)) or diag.ndim != 2 \
            or off.shape != diag.shape or ks.shape != (g,) or K > diag.shape[1]:
        raise ValueError(f"diag and off must be (g, ≥max ks) torch tensors and ks (g,), got "
                         f"{tuple(getattr(diag, 'shape', ()))}, {tuple(getattr(off, 'shape', ()))}, {ks.shape}")
    dev = diag.device
    if K == 0:
        return np.zeros((g, 0)), torch.zeros((g, 0, 0), dtype=torch.float64, device=dev), np.zeros(g, dtype=np.int64)
    kt = torch.as_tensor(ks, device=dev)[:, None]
    cols = torch.arange(K, device=dev)[None, :]
    d = torch.where(cols < kt, diag[:, :K].to(torch.float64), 0.0)
    e = torch.where(cols[:, :K - 1] < kt - 1, off[:, :K - 1].to(torch.float64), 0.0)
    finite = (torch.isfinite(d).all(dim=1) & torch.isfinite(e).all(dim=1)).cpu().numpy()
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise NonFiniteMatrix(f"the tridiagonal matrix of row {row} (k = {int(ks[row])}) holds NaN or inf: "
                              f"its entries must be finite", row, int(ks[row]))
    lam_d = torch.empty((g, K), dtype=torch.float64, device=dev)
    Y = torch.empty((g, K, K), dtype=torch.float64, device=dev)
    # Blocks of a quarter of symmetric.DEVICE_BATCH_VALUES matrix values: the dense matrices and the
    # decomposition's own arrays (~5 of them) exist for one block at a time; the eigenvectors are written
    # into Y in place. The host waits once per block (the check's flags) and once for the eigenvalues.
    per = max(1, symmetric.DEVICE_BATCH_VALUES // 4 // (K * K))
    for lo in range(0, g, per):
        hi = min(g, lo + per)
        T = torch.diag_embed(d[lo:hi]) + torch.diag_embed(e[lo:hi], offset=-1)   # the lower triangle is read
        w, V = symmetric.eigh_batch(T, ks[lo:hi], impl=impl)      # ascending, the padding's zeros among them
        del T
        lam_d[lo:hi] = w.flip(1).clamp_min(0.0)                    # descending; the padding's 0 last (≥ 0 all)
        Y[lo:hi] = V.flip(2).transpose(1, 2)                       # eigenvectors as rows, all K; cut below
        del w, V
    lam_h = lam_d.cpu().numpy()
    lam_h[np.arange(K)[None, :] >= ks[:, None]] = 0.0
    ranks = np.where(ks > 0, (lam_h > _cut(lam_h[:, 0], ks, rtol, noise)[:, None]).sum(axis=1), 0).astype(np.int64)
    r = int(ranks.max()) if g else 0
    keep = (torch.arange(K, device=dev)[None, :, None] < torch.as_tensor(ranks, device=dev)[:, None, None]) \
        & (cols[:, None, :] < kt[:, :, None])
    Y.masked_fill_(~keep, 0.0)
    # Its own storage where rows are cut: the basis keeps Y for its lifetime, and a view would hold (and a
    # byte count of its elements under-count) all K rows of every matrix.
    return lam_h, (Y[:, :r].clone() if r < K else Y), ranks
