"""Batched symmetric eigendecompositions (hcrfast.kernels.symmetric) against oracles no one here
wrote: NumPy's eigh matrix by matrix, the matrix rebuilt from its factors, and torch.linalg.eigh."""
import numpy as np
import pytest
import torch

from hcrfast.kernels import symmetric


def grams(seed=0, g=6, m=40, rank=None):
    rng = np.random.default_rng(seed)
    J = rng.standard_normal((g, m, rank or 2 * m))
    return J @ J.transpose(0, 2, 1)


@pytest.mark.parametrize("impl", ["torch", "lapack"])
def test_each_matrix_matches_numpy_and_rebuilds_it(impl):
    A = grams()
    A[1] = grams(1, g=1, rank=7)[0]                       # rank 7: 33 eigenvalues ~0
    A[2] = -A[2]                                          # negative definite
    w, V = symmetric.eigh_batch(torch.as_tensor(A), impl=impl)
    assert w.dtype == V.dtype == torch.float64 and w.shape == (6, 40) and V.shape == (6, 40, 40)
    w, V = w.numpy(), V.numpy()
    for a in range(len(A)):
        want = np.linalg.eigvalsh(A[a])
        scale = np.abs(want).max()
        np.testing.assert_allclose(w[a], want, rtol=0, atol=1e-12 * scale)   # ascending, as NumPy's
        np.testing.assert_allclose(V[a].T @ V[a], np.eye(40), atol=1e-12)
        np.testing.assert_allclose(V[a] @ np.diag(w[a]) @ V[a].T, A[a], atol=1e-12 * scale)


def test_lapack_and_torch_agree_on_a_larger_batch():
    A = torch.as_tensor(grams(2, g=9, m=150))
    w1, V1 = symmetric.eigh_batch(A, impl="lapack")
    w2, V2 = symmetric.eigh_batch(A, impl="torch")
    np.testing.assert_allclose(w1.numpy(), w2.numpy(), rtol=1e-11)
    # eigenvectors up to sign (the spectrum of a random Gram matrix is simple)
    np.testing.assert_allclose(np.abs((V1 * V2).sum(dim=1).numpy()), 1.0, atol=1e-8)


def test_orders_decompose_each_leading_block_alone():
    """Matrix a is its leading orders[a] block, zeros elsewhere (what lies outside is ignored): the
    block's eigenpairs, and unit vectors with eigenvalue 0 for the padding, first."""
    A = grams(3, g=5, m=30)
    orders = np.array([30, 0, 1, 17, 29])
    A[3, 17:, :] = np.nan                                 # outside the block: never read
    A[3, :, 17:] = 1e300
    w, V = symmetric.eigh_batch(torch.as_tensor(A), orders, impl="lapack")
    w, V = w.numpy(), V.numpy()
    for a, n in enumerate(orders):
        pad = 30 - n
        assert not w[a, :pad].any()
        np.testing.assert_array_equal(V[a, :, :pad], np.eye(30)[:, n:])
        if n:
            block = A[a, :n, :n]
            np.testing.assert_allclose(w[a, pad:], np.linalg.eigvalsh(block), atol=1e-12 * np.abs(block).max())
            assert not V[a, n:, pad:].any()
            Vb = V[a, :n, pad:]
            np.testing.assert_allclose(Vb @ np.diag(w[a, pad:]) @ Vb.T, block, atol=1e-12 * np.abs(block).max())
    # torch decomposes the matrix with the outside zeroed: the same spectrum, sorted
    w_t, _ = symmetric.eigh_batch(torch.as_tensor(A), orders, impl="torch")
    np.testing.assert_allclose(w_t.numpy(), np.sort(w, axis=1), atol=1e-9)


def test_auto_takes_lapack_for_several_float64_matrices(monkeypatch):
    calls = []
    real = symmetric._lapack_host
    monkeypatch.setattr(symmetric, "_lapack_host", lambda *a: calls.append(a[0].shape) or real(*a))
    A = torch.as_tensor(grams(4, g=3, m=12))
    symmetric.eigh_batch(A)
    assert calls == [(3, 12, 12)]
    symmetric.eigh_batch(A[:1])                           # one matrix: all of BLAS's threads, through torch
    symmetric.eigh_batch(A.float())                       # float32: torch
    assert calls == [(3, 12, 12)]


def test_one_thread_gives_what_several_give(monkeypatch):
    A = torch.as_tensor(grams(5, g=7, m=50))
    orders = np.array([50, 40, 50, 3, 50, 20, 49])
    several = symmetric.eigh_batch(A, orders, impl="lapack")
    monkeypatch.setattr(symmetric, "_workers", lambda m: 1)
    one = symmetric.eigh_batch(A, orders, impl="lapack")
    for x, y in zip(several, one):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_blas_threads_are_restored():
    from threadpoolctl import threadpool_info

    def blas():
        return sorted((i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")

    import scipy.linalg.cython_lapack  # noqa: F401  (SciPy's BLAS loaded before the count)

    before = blas()
    symmetric.eigh_batch(torch.as_tensor(grams(6, g=4, m=30)), impl="lapack")
    assert blas() == before


def test_both_read_the_lower_triangle():
    """What torch.linalg.eigh reads: a matrix whose upper triangle is garbage decomposes as its lower
    one mirrored (the C array seen by Fortran is the transpose: UPLO 'U' there)."""
    A = np.array([[[1.0, 0.0], [5.0, 1.0]], [[2.0, 9.0], [-1.0, 3.0]]])
    want = np.linalg.eigvalsh(A, UPLO="L")
    for impl in ("lapack", "torch"):
        w, V = symmetric.eigh_batch(torch.as_tensor(A), impl=impl)
        np.testing.assert_allclose(w.numpy(), want, rtol=1e-14)
        lower = np.tril(A) + np.tril(A, -1).transpose(0, 2, 1)
        np.testing.assert_allclose(lower @ V.numpy(), V.numpy() * w.numpy()[:, None, :], atol=1e-13)


def test_a_matrix_that_needs_its_gradient_goes_to_torch():
    """LAPACK through ctypes has no derivative: "auto" leaves such matrices to torch (the gradient of a
    function of the eigenvalues matches torch's), and "lapack" refuses them by name."""
    base = torch.as_tensor(grams(10, g=3, m=8))
    A = base.clone().requires_grad_(True)
    w, _ = symmetric.eigh_batch(A)
    w.sum().backward()
    np.testing.assert_allclose(A.grad.numpy(), np.broadcast_to(np.eye(8), (3, 8, 8)), atol=1e-12)  # d tr(A)/dA
    with pytest.raises(ValueError, match="no derivative and A requires grad"):
        symmetric.eigh_batch(A, impl="lapack")
    with torch.no_grad():
        symmetric.eigh_batch(A, impl="lapack")        # no graph wanted: fine


def test_bad_input_is_named():
    A = torch.as_tensor(grams(7, g=3, m=10))
    with pytest.raises(ValueError, match="impl must be one of"):
        symmetric.eigh_batch(A, impl="cusolver")
    with pytest.raises(ValueError, match=r"\(g, m, m\) torch tensor"):
        symmetric.eigh_batch(A[0])
    with pytest.raises(ValueError, match=r"\(g, m, m\) torch tensor"):
        symmetric.eigh_batch(A.numpy())
    with pytest.raises(ValueError, match=r"orders must be \(3,\) integers in 0..10"):
        symmetric.eigh_batch(A, [10, 11, 2])
    with pytest.raises(ValueError, match="orders must be integers, got dtype float64"):
        symmetric.eigh_batch(A, [10.0, 2.7, 2.0])
    with pytest.raises(ValueError, match="orders must be integers, got dtype bool"):
        symmetric.eigh_batch(A, [True, True, False])
    with pytest.raises(ValueError, match="float64 matrices, got torch.float32"):
        symmetric.eigh_batch(A.float(), impl="lapack")
    bad = A.clone()
    bad[2, 1, 1] = float("nan")
    with pytest.raises(ValueError, match=r"matrix 2 \(order 10\) holds NaN or inf in its lower triangle"):
        symmetric.eigh_batch(bad, impl="lapack")
    bad[2, 1, 1] = 1.0
    bad[2, 9, 9] = float("inf")                           # outside matrix 2's block of order 5: ignored
    symmetric.eigh_batch(bad, [10, 10, 5], impl="lapack")


def test_overlapping_with_the_krylov_basis_take_turns_with_blas(monkeypatch):
    """Both host LAPACK paths hold BLAS to one thread while they run, under one lock. A Gram
    decomposition that started while a tridiagonal one ran (a user's threads) and ended after it
    would restore the limit of 1 it had found, leaving BLAS on one thread for good. Whether a given
    BLAS shows that depends on the BLAS, so the limits are recorded here: each limit is restored
    before the next is set."""
    import threading
    import time

    from test_tridiagonal import record_blas_limits

    from hcrfast.kernels import _lapack, tridiagonal

    rng = np.random.default_rng(8)
    diag, off, ks = rng.random((1, 20)) + 1, rng.random((1, 20)), np.array([20])
    tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=0.0, impl="numba")   # compiled (seconds) first
    real_kernel = tridiagonal._numba_kernel()
    real_routine = _lapack.routine

    def slow_kernel(*args):
        time.sleep(0.3)
        return real_kernel(*args)

    def slow_routine(name, n_args):
        routine = real_routine(name, n_args)
        return lambda *args: (time.sleep(0.6), routine(*args))

    events = record_blas_limits(monkeypatch)
    monkeypatch.setattr(tridiagonal, "_numba_kernel", lambda: slow_kernel)
    monkeypatch.setattr(_lapack, "routine", slow_routine)
    ta = threading.Thread(target=tridiagonal.eigh_tridiagonal_batch, args=(diag, off, ks),
                          kwargs=dict(rtol=0.0, impl="numba"))
    ta.start()
    time.sleep(0.1)
    w, _ = symmetric.eigh_batch(torch.as_tensor(np.diag([3.0, 1.0, 2.0])[None]), impl="lapack")
    ta.join()
    assert events == ["set", "restore", "set", "restore"]
    np.testing.assert_allclose(w.numpy(), [[1.0, 2.0, 3.0]])
