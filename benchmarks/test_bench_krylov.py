"""``solver="krylov"``'s projections: one batched pass over every example's basis vs one example at a time.

B = 1,024 examples of the MNIST-MLP geometry cut down (n = p = 256, k = 96 basis steps, random dense
matrices), R = 25 right-hand sides each: the work of one of Algorithm 1's steps for a chunk. The
per-example loop is what ``KrylovBasis.solve`` did before it stacked the bases (one small product
chain per example: ~8 launches each on a GPU, 10,000 examples × 10 steps for the MNIST target).
Also timed: building the bases (LSQR with kept, reorthogonalized vectors, and the host
eigendecompositions of B_kᵀB_k), one such eigendecomposition by MRRR (``stemr``) vs LAPACK's divide and
conquer (``dstevd``, what ``hcrfast.krylov`` uses), and a batch of them as the Krylov basis runs them
(``hcrfast.kernels.tridiagonal``): SciPy's wrapper one at a time (it keeps the GIL) vs the Numba loop
vs LAPACK through ctypes (both a thread per core, no GIL).
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from hcrfast import krylov
from hcrfast.bindings import ieee_float32
from hcrfast.lsqr import LSQROptions
from hcrfast.operators import DenseBatchOperator

B, N, P, K, R = 1024, 256, 256, 96, 25
OPTS = LSQROptions(atol=0.0, btol=0.0, conlim=0.0, iter_lim=K, check_every=8)


def _problem(xp):
    rng = np.random.default_rng(0)
    A = (rng.standard_normal((B, N, P), dtype=np.float32) / np.sqrt(P)).astype(np.float32)
    b = rng.standard_normal((B, N), dtype=np.float32)
    c = rng.standard_normal((B, R, N), dtype=np.float32)
    return DenseBatchOperator(xp.asarray(A)), xp.asarray(b), c


def _loop(basis: krylov.KrylovBasis, c: torch.Tensor) -> torch.Tensor:
    """One example at a time (the pre-stacking solve), from the same stored factors."""
    out = []
    for e in range(basis.batch):
        g = basis.groups[basis._group_of[e]]
        i, k = basis._row_of[e], int(basis.steps[e])
        U, V, alfa, beta = basis.vectors(e)
        Y, filt = g.Y[i, :k], g.filt[i]
        with ieee_float32():
            t = (U @ c[e].T).to(torch.float64)
            w = alfa[:k, None] * t[:k] + beta[1:k + 1, None] * t[1:k + 1]
            y = Y @ (filt[:, None] * (Y.T @ w))
            out.append((V.T @ y.to(V.dtype)).T)
    return torch.stack(out)


def _check(basis, tc):
    got, want = basis.solve(tc), _loop(basis, tc)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_krylov_build_cpu(benchmark):
    op, b, _ = _problem(np)
    basis = benchmark.pedantic(krylov.build, args=(op, b, OPTS), rounds=1, iterations=1)
    assert (basis.steps == K).all()
    benchmark.extra_info.update(examples=B, shape=(N, P), steps=K)


@pytest.mark.parametrize("how", ["batched", "loop"])
def test_krylov_solve_cpu(benchmark, how):
    op, b, c = _problem(np)
    basis = krylov.build(op, b, OPTS)
    tc = torch.as_tensor(c)
    _check(basis, tc)
    fn = basis.solve if how == "batched" else (lambda t: _loop(basis, t))
    benchmark.pedantic(fn, args=(tc,), rounds=3, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(examples=B, shape=(N, P), steps=K, right_hand_sides=R)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["batched", "loop"])
def test_krylov_solve_gpu(benchmark, how):
    import cupy

    op, b, c = _problem(cupy)
    basis = krylov.build(op, b, OPTS)
    tc = torch.as_tensor(c, device="cuda")
    _check(basis, tc)
    fn = basis.solve if how == "batched" else (lambda t: _loop(basis, t))

    def run():
        out = fn(tc)
        torch.cuda.synchronize()
        return out

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(examples=B, shape=(N, P), steps=K, right_hand_sides=R)


@pytest.mark.gpu
def test_krylov_build_gpu(benchmark):
    import cupy

    op, b, _ = _problem(cupy)

    def run():
        basis = krylov.build(op, b, OPTS)
        torch.cuda.synchronize()
        return basis

    basis = benchmark.pedantic(run, rounds=2, iterations=1, warmup_rounds=1)
    assert (basis.steps == K).all()
    benchmark.extra_info.update(examples=B, shape=(N, P), steps=K)


@pytest.fixture(scope="module")
def long_basis():
    """A 1,500-step basis of one 1,600 × 1,600 float64 matrix with singular values logspace(0, −3.2)
    (ResNet-18's Ritz values spanned [0.0056, 7.53]): its α, β are a real B_k's, and its first 386
    steps a shorter basis' (the vectors of a shorter run are a prefix)."""
    rng = np.random.default_rng(1)
    n = 1600
    Uo, _ = np.linalg.qr(rng.standard_normal((n, n)))
    Vo, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = ((Uo * np.logspace(0, -3.2, n)) @ Vo.T)[None]
    basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((1, n)),
                         LSQROptions(atol=0.0, btol=0.0, conlim=0.0, iter_lim=1500, check_every=64))
    _, _, alfa, beta = basis.vectors(0)
    return alfa.numpy(), beta.numpy()


@pytest.mark.parametrize("k", [386, 1500])
@pytest.mark.parametrize("driver", ["stemr", "dstevd"])
def test_tridiagonal_eigendecomposition(benchmark, long_basis, k, driver):
    """B_kᵀB_k of a real basis (k = 386: the MNIST MLP's size; 1,500: ResNet-18's at R = 25)."""
    a, b = long_basis
    diag, off = a[:k] ** 2 + b[1:k + 1] ** 2, a[1:k] * b[1:k]
    if driver == "dstevd":
        fn = lambda: scipy.linalg.lapack.dstevd(diag, off, compute_v=1)[:2]  # noqa: E731
    else:
        fn = lambda: scipy.linalg.eigh_tridiagonal(diag, off, lapack_driver="stemr")  # noqa: E731
    lam, Y = benchmark.pedantic(fn, rounds=5, iterations=1, warmup_rounds=1)
    T = np.diag(diag) + np.diag(off, 1) + np.diag(off, -1)
    assert np.abs(T @ Y - Y * lam).max() < 1e-10 * np.abs(lam).max()
    benchmark.extra_info.update(k=k, driver=driver)


@pytest.mark.parametrize("impl", ["twin", "numba", "lapack"])
def test_tridiagonal_batch(benchmark, long_basis, impl):
    """64 bases of k = 386 (the MNIST MLP's), as one group of the Krylov basis: SciPy one by one vs Numba vs
    ctypes."""
    from hcrfast.kernels import tridiagonal

    a, b = long_basis
    k, g = 386, 64
    diag = np.tile(a[:k] ** 2 + b[1:k + 1] ** 2, (g, 1))
    off = np.tile(a[1:k + 1] * b[1:k + 1], (g, 1))
    ks = np.full(g, k)
    tridiagonal.eigh_tridiagonal_batch(diag[:1], off[:1], ks[:1], rtol=0.0, impl=impl)  # Numba compiles here
    lam, Y, ranks = benchmark.pedantic(
        lambda: tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-7, impl=impl),
        rounds=3, iterations=1, warmup_rounds=1)
    T = np.diag(diag[0]) + np.diag(off[0, :k - 1], 1) + np.diag(off[0, :k - 1], -1)
    V = Y[0, :ranks[0]].T
    assert np.abs(T @ V - V * lam[0, :ranks[0]]).max() < 1e-10 * lam[0, 0]
    benchmark.extra_info.update(k=k, examples=g, impl=impl, workers=tridiagonal._workers(k))
