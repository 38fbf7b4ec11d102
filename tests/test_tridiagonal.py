"""The Krylov basis' batched tridiagonal eigendecompositions (hcrfast.kernels.tridiagonal) against
oracles no one here wrote: SciPy's eigh_tridiagonal matrix by matrix, the dense matrix itself
(Y diag(λ) Yᵀ), and NumPy's dense eigvalsh for the rank."""
import concurrent.futures

import numpy as np
import pytest
import scipy.linalg
import torch

from hcrfast.kernels import tridiagonal

IMPLS = ["twin", "numba", "lapack"]


def batch(seed=0, g=12, K=60):
    rng = np.random.default_rng(seed)
    diag = rng.random((g, K)) + 0.05
    off = rng.standard_normal((g, K)) * 0.4
    ks = rng.integers(3, K + 1, g)
    ks[:4] = (K, 0, 1, 2)
    # entries past each k are ignored: fill them with garbage (NaN included) to prove it
    cols = np.arange(K)[None, :]
    diag[cols >= ks[:, None]] = np.nan
    off[cols >= ks[:, None] - 1] = 1e300
    return diag, off, ks


def dense(diag, off, k):
    return np.diag(diag[:k]) + np.diag(off[:k - 1], 1) + np.diag(off[:k - 1], -1)


@pytest.mark.parametrize("impl", IMPLS)
def test_each_matrix_matches_scipy_and_rebuilds_the_matrix(impl):
    diag, off, ks = batch()
    lam, Y, ranks = tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=0.0, impl=impl)
    K = diag.shape[1]
    assert lam.shape == (len(ks), K) and Y.shape == (len(ks), K, K)
    for a, k in enumerate(ks):
        if k == 0:
            assert ranks[a] == 0 and not Y[a].any() and not lam[a].any()
            continue
        want = scipy.linalg.eigvalsh_tridiagonal(diag[a, :k], off[a, :k - 1])[::-1].clip(min=0)
        np.testing.assert_allclose(lam[a, :k], want, rtol=1e-12, atol=1e-13)
        assert not lam[a, k:].any()
        r = ranks[a]
        assert r == int((want > 0).sum())  # rtol = 0: every positive eigenvalue is kept
        # rows past the rank and columns past k are exact zeros
        assert not Y[a, r:].any() and not Y[a, :, k:].any()
        V = Y[a, :r, :k].T                                        # eigenvectors as columns
        np.testing.assert_allclose(V.T @ V, np.eye(r), atol=1e-12)
        T = dense(diag[a], off[a], k)
        if r == k:  # all kept: V diag(λ) Vᵀ is the matrix
            np.testing.assert_allclose(V @ np.diag(lam[a, :k]) @ V.T, T, atol=1e-12)
        np.testing.assert_allclose(T @ V, V * lam[a, :r], atol=1e-12)


def test_every_path_agrees_with_the_twin_on_a_large_batch():
    """The paths run the same LAPACK routine: the same values, the same ranks; the two that call it
    from threads (Numba, ctypes: "auto") bit for bit."""
    rng = np.random.default_rng(3)
    g, K = 24, 200
    diag, off = rng.random((g, K)) + 1, rng.random((g, K)) * 0.3
    ks = rng.integers(150, K + 1, g)
    twin = tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-8, impl="twin")
    numba = tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-8, impl="numba")
    for a, b in zip(numba, tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-8, impl="auto")):
        np.testing.assert_array_equal(a, b)
    for impl in ("numba", "lapack", "auto"):
        got = tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-8, impl=impl)
        np.testing.assert_array_equal(got[2], twin[2])
        np.testing.assert_allclose(got[0], twin[0], rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(np.abs(got[1]), np.abs(twin[1]), atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_rank_cut_follows_rtol_and_noise(impl):
    """A spectrum spanning 1 to 1e-12 (dense eigvalsh is the oracle): kept are the eigenvalues above
    max(rtol, k·noise)² of the largest."""
    rng = np.random.default_rng(5)
    k = 40
    Q = np.linalg.qr(rng.standard_normal((k, k)))[0]
    spectrum = np.logspace(0, -12, k)
    T, _ = scipy.linalg.hessenberg(Q @ np.diag(spectrum) @ Q.T, calc_q=True)  # symmetric: tridiagonal
    diag, off = np.diag(T)[None, :].copy(), np.append(np.diag(T, 1), 0.0)[None, :].copy()
    exact = np.linalg.eigvalsh(dense(diag[0], off[0], k))[::-1]
    # (the cuts between two eigenvalues: 1e-6 / k and 1e-4 / k put them ON spectrum[39] and [26], where
    # rounding decided the side, and numpy 2.5's OpenBLAS, the lease machine's, took the other one)
    for rtol, noise in ((1e-3, 0.0), (1e-5, 0.0), (0.0, 1.2e-6 / k), (1e-7, 1.2e-4 / k)):
        lam, Y, ranks = tridiagonal.eigh_tridiagonal_batch(diag, off, [k], rtol=rtol, noise=noise, impl=impl)
        cut = max(rtol, k * noise) ** 2 * exact[0]
        assert ranks[0] == int((exact > cut).sum()), (rtol, noise)
        assert not Y[0, ranks[0]:].any()


@pytest.mark.parametrize("impl", ["numba", "lapack"])
def test_threaded_paths_run_from_several_threads_at_once(impl):
    """The kernels release the GIL and no Numba threading layer is involved: concurrent calls (a user's
    threads, say) each get their own, correct result."""
    inputs = [batch(seed, g=16, K=140) for seed in range(4)]
    want = [tridiagonal.eigh_tridiagonal_batch(*x, rtol=1e-9, impl="twin") for x in inputs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: tridiagonal.eigh_tridiagonal_batch(*x, rtol=1e-9, impl=impl), inputs))
    for (lam, Y, ranks), (lam0, Y0, ranks0) in zip(got, want):
        np.testing.assert_array_equal(ranks, ranks0)
        np.testing.assert_allclose(lam, lam0, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_input_is_named(impl):
    diag, off, ks = batch()
    with pytest.raises(ValueError, match="impl must be one of"):
        tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=0.0, impl="cuda")
    with pytest.raises(ValueError, match=r"ks \(g,\)"):
        tridiagonal.eigh_tridiagonal_batch(diag, off[:, :-1], ks, rtol=0.0, impl=impl)
    with pytest.raises(ValueError, match="ks must lie in 0..60"):
        tridiagonal.eigh_tridiagonal_batch(diag, off, ks + 100, rtol=0.0, impl=impl)
    bad = diag.copy()
    bad[4, 1] = np.inf
    with pytest.raises(ValueError, match=r"row 4 \(k = \d+\) holds NaN or inf"):
        tridiagonal.eigh_tridiagonal_batch(bad, off, ks, rtol=0.0, impl=impl)


def test_threads_are_capped_by_the_memory_their_workspaces_take(monkeypatch):
    """Each thread holds two k x k float64 workspaces: at k = 4,096 (ResNet-18's basis) 268 MB, so a
    machine with 1 GiB available gets no more than one thread, whatever its cores; small k, every core.
    One thread gives the same values as several."""
    import os

    available = {"bytes": 2**30}
    monkeypatch.setattr(tridiagonal, "available_memory", lambda: available["bytes"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    assert tridiagonal._workers(4096) == 1
    assert tridiagonal._workers(400) == 64
    available["bytes"] = 64 * 2**30
    assert tridiagonal._workers(4096) == 63            # 16 GiB / (16 · 4096² + 1 MiB) = 63.75
    diag, off, ks = batch(seed=7, g=9, K=80)
    several = [tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-9, impl=impl) for impl in ("numba", "lapack")]
    monkeypatch.setattr(tridiagonal, "_workers", lambda k=0: 1)
    one = [tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-9, impl=impl) for impl in ("numba", "lapack")]
    for x, y in zip(several, one):
        for a, b in zip(x, y):
            np.testing.assert_array_equal(a, b)


def test_threads_follow_torchs_thread_count(monkeypatch):
    """torch.set_num_threads (hcrfast bound --threads) is the user's say on how many cores hcrfast
    uses: the host LAPACK threads of both kinds (tridiagonal here, symmetric in the dense solve) keep
    to it, on a machine with more cores than that."""
    import os

    from hcrfast.kernels import symmetric

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert tridiagonal._workers(100) == symmetric._workers(100) == 3
        torch.set_num_threads(1)
        assert tridiagonal._workers(100) == symmetric._workers(100) == 1
    finally:
        torch.set_num_threads(before)


def record_blas_limits(monkeypatch) -> list:
    """threadpoolctl's limits replaced by a recorder: the list of "set" and "restore", in call order."""
    import threadpoolctl

    events = []

    class Recorded:
        def __init__(self, limits, user_api):
            assert (limits, user_api) == (1, "blas")
            events.append("set")

        def restore_original_limits(self):
            events.append("restore")

    monkeypatch.setattr(threadpoolctl, "threadpool_limits", Recorded)
    return events


def test_overlapping_calls_take_turns_with_blas(monkeypatch):
    """Each call holds BLAS to one thread while it runs. Two calls that overlap, the first to start also
    the first to end, used to restore each other's limits out of order: the second restored the limit
    of 1 it had found, and BLAS stayed on one thread for the rest of the process. Whether a given BLAS
    shows that depends on the BLAS (this machine's OpenBLAS did not), so the limits are recorded: each
    is restored before the next is set."""
    import threading
    import time

    a, b = batch(1, g=4, K=60), batch(2, g=4, K=61)
    tridiagonal.eigh_tridiagonal_batch(*a, rtol=0.0, impl="numba")   # compiled (seconds) before the clock
    real = tridiagonal._numba_kernel()
    delays = {60: 0.3, 61: 0.6}                    # by K: call A (K = 60) sleeps 0.3 s, call B 0.6 s

    def slow(lo, hi, diag, *args):
        time.sleep(delays[diag.shape[1]])
        return real(lo, hi, diag, *args)

    events = record_blas_limits(monkeypatch)
    monkeypatch.setattr(tridiagonal, "_numba_kernel", lambda: slow)
    monkeypatch.setattr(tridiagonal, "_workers", lambda k=0: 1)
    ta = threading.Thread(target=tridiagonal.eigh_tridiagonal_batch, args=a, kwargs=dict(rtol=0.0, impl="numba"))
    tb = threading.Thread(target=tridiagonal.eigh_tridiagonal_batch, args=b, kwargs=dict(rtol=0.0, impl="numba"))
    ta.start()
    time.sleep(0.1)
    tb.start()
    ta.join()
    tb.join()
    assert events == ["set", "restore", "set", "restore"]


def test_blas_threads_are_restored():
    from threadpoolctl import threadpool_info

    def blas():
        return sorted((i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")

    tridiagonal.eigh_tridiagonal_batch(*batch(3), rtol=0.0, impl="numba")   # SciPy's BLAS loaded
    before = blas()
    tridiagonal.eigh_tridiagonal_batch(*batch(4), rtol=0.0, impl="numba")
    assert blas() == before


def test_device_path_refuses_bad_input_by_name():
    from hcrfast.kernels import tridiagonal

    d, e = torch.ones((2, 4), dtype=torch.float64), torch.zeros((2, 4), dtype=torch.float64)
    with pytest.raises(ValueError, match="impl must be one of"):
        tridiagonal.eigh_tridiagonal_device(d, e, [4, 4], rtol=0.0, impl="lapack")
    with pytest.raises(ValueError, match="impl='cusolver' runs on a CUDA device, and A is on cpu"):
        tridiagonal.eigh_tridiagonal_device(d, e, [4, 4], rtol=0.0, impl="cusolver")
    with pytest.raises(ValueError, match=r"\(g, ≥max ks\) torch tensors"):
        tridiagonal.eigh_tridiagonal_device(d.numpy(), e.numpy(), [4, 4], rtol=0.0)
    d[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"row 1 \(k = 4\) holds NaN or inf"):
        tridiagonal.eigh_tridiagonal_device(d, e, [4, 4], rtol=0.0, impl="cupy")
    lam, Y, ranks = tridiagonal.eigh_tridiagonal_device(d, e, [0, 0], rtol=0.0, impl="cupy")   # nothing to do
    assert lam.shape == (2, 0) and Y.shape == (2, 0, 0) and not ranks.any()
