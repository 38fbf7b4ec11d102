"""Batched eigendecompositions of symmetric float64 matrices, for the dense solve's Gram matrices.

The dense solve (:func:`hcrfast.dense.min_norm_solver`) factors one Gram matrix per example
(the MNIST MLP: ~390 × 390 in float64; a chunk holds tens of examples on a CPU, thousands on a
GPU). ``torch.linalg.eigh`` runs such a batch one matrix at a time: on a CPU each through a
LAPACK call whose BLAS threads gain little at this size; on CUDA, for orders above 32, one
cuSOLVER ``syevd`` after another (PyTorch's dispatch batches only orders ≤ 32).

* ``impl="torch"``: ``torch.linalg.eigh`` where the matrices are (the twin: another LAPACK, or
  cuSOLVER).
* ``impl="lapack"``: LAPACK's divide and conquer ``dsyevd`` (what ``torch.linalg.eigh`` and
  ``numpy.linalg.eigh`` run on CPUs) from SciPy's LAPACK, one matrix per call, called through
  ctypes from a thread per core without the GIL (:mod:`hcrfast.kernels._lapack`), on the host;
  matrices on a GPU go there and back in one copy each way.
* ``impl="auto"``: "lapack" for two or more float64 matrices that need no gradient, else "torch"
  (one large matrix gets all of BLAS's threads; torch's eigh has a derivative).

On this 2-core machine, 32 Gram matrices of order 390 (``benchmarks/test_bench_dense.py``):
see benchmarks/README.md. On a GPU, "lapack" against cuSOLVER awaits a measurement.
"""
from __future__ import annotations

import numpy as np
import torch

from hcrfast.backend import available_memory

from . import _lapack

__all__ = ["IMPLS", "eigh_batch"]

IMPLS = ("auto", "torch", "lapack")

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


def eigh_batch(A: torch.Tensor, orders=None, *, impl: str = "auto"):
    """Eigenvalues and eigenvectors of ``g`` symmetric matrices ``A`` (g, m, m), as ``torch.linalg.eigh``.

    Only the lower triangle is read (as ``torch.linalg.eigh`` reads it); its entries must be finite.
    ``A`` that requires grad (with grad mode on) goes to torch, whose eigh has a derivative. With ``orders`` (g,) integers in 0..m, matrix a is its leading
    ``orders[a]`` × ``orders[a]`` block with zeros elsewhere (what lies outside the block is
    ignored): "lapack" decomposes the block alone (a batch of unequal orders costs what its
    matrices do, not g times the largest).

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
        if int(orders.min(initial=m)) < m:
            inside = torch.arange(m, device=A.device)[None, :] < torch.as_tensor(orders, device=A.device)[:, None]
            A = torch.where(inside[:, :, None] & inside[:, None, :], A, 0.0)
        return torch.linalg.eigh(A)
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
