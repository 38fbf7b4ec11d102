"""Batched symmetric eigendecompositions (hcrfast.kernels.symmetric) against oracles no one here
wrote: NumPy's eigh matrix by matrix, the matrix rebuilt from its factors, and torch.linalg.eigh.

The device routines run on a GPU only (tests/test_gpu.py). Here: their ctypes call against a stand-in
that keeps cuSOLVER's documented ABI on host memory, and the check that sends failed decompositions to
the host."""
import ctypes
import warnings

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
        symmetric.eigh_batch(A, impl="magma")
    for impl in symmetric.DEVICE_IMPLS:
        with pytest.raises(ValueError, match=rf"impl='{impl}' runs on a CUDA device, and A is on cpu"):
            symmetric.eigh_batch(A, impl=impl)
        with pytest.raises(ValueError, match="float32 or float64 matrices, got torch.int64"):
            symmetric.eigh_batch(A.long(), impl=impl)
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


class FakeCusolver:
    """``cusolverDnXsyevBatched`` as cuSOLVER's documentation specifies it, over host memory: each of
    ``batchSize`` matrices column-major with leading dimension ``lda`` (element (i, j) of matrix k at
    ``A[i + lda·j + lda·n·k]``), only the ``uplo`` triangle read, the eigenvectors written over A as
    columns, the eigenvalues ascending in ``W[j + n·k]``, ``info[k]`` per matrix (here 1 where the
    triangle read holds NaN). The workspaces it asks for are written through, end to end."""

    # The prototypes as cusolverDn.h declares them, spelled out here (not taken from the module under test).
    P, I, I64, SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
    PROTOTYPES = {
        "cusolverDnSetStream": [P, P],
        "cusolverDnXsyevBatched_bufferSize": [P, P, I, I, I64, I, P, I64, I, P, I, ctypes.POINTER(SZ),
                                              ctypes.POINTER(SZ), I64],
        "cusolverDnXsyevBatched": [P, P, I, I, I64, I, P, I64, I, P, I, P, SZ, P, SZ, P, I64],
    }

    def __init__(self, refuse_above=None):
        self.calls, self.streams, self.queries = [], [], []
        self.refuse_above = refuse_above        # a size query for more matrices returns INVALID_VALUE
        for name, fn in [("cusolverDnSetStream", self._set_stream),
                         ("cusolverDnXsyevBatched_bufferSize", self._buffer_size),
                         ("cusolverDnXsyevBatched", self._syev_batched)]:
            setattr(self, name, ctypes.CFUNCTYPE(ctypes.c_int, *self.PROTOTYPES[name])(fn))

    def _set_stream(self, handle, stream):
        self.streams.append((handle, stream))
        return 0

    @staticmethod
    def _sizes(n, batch):
        return 8 * n * batch + 40, 3 * n + 1

    def _buffer_size(self, handle, params, jobz, uplo, n, dta, A, lda, dtw, W, ct, dev, host, batch):
        self.queries.append(batch)
        if self.refuse_above is not None and batch > self.refuse_above:
            return 3                                # CUSOLVER_STATUS_INVALID_VALUE
        dev[0], host[0] = self._sizes(n, batch)
        return 0

    def _syev_batched(self, handle, params, jobz, uplo, n, dta, A, lda, dtw, W, ct, dwork, dsize, hwork, hsize,
                      info, batch):
        assert jobz == 1 and dta == dtw == ct and dta in (0, 1) and lda >= n
        assert (dsize, hsize) == self._sizes(n, batch)
        for ptr, size in ((dwork, dsize), (hwork, hsize)):
            np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))[:] = 0xAB
        self.calls.append(dict(handle=handle, params=params, uplo=uplo, n=n, lda=lda, batch=batch))
        ctype = ctypes.c_double if dta == 1 else ctypes.c_float
        a = np.ctypeslib.as_array((ctype * (lda * n * batch)).from_address(A))
        F = a.reshape(batch, n, lda).transpose(0, 2, 1)     # F[k, i, j] = A[i + lda·j + lda·n·k]
        w = np.ctypeslib.as_array((ctype * (n * batch)).from_address(W)).reshape(batch, n)
        inf = np.ctypeslib.as_array((ctypes.c_int * batch).from_address(info))
        for k in range(batch):
            tri = np.triu(F[k, :n]) if uplo == 1 else np.tril(F[k, :n])
            if not np.isfinite(tri).all():
                inf[k] = 1
                continue
            lam, Q = np.linalg.eigh(tri + tri.T - np.diag(np.diag(tri)))
            w[k], F[k, :n] = lam, Q
            inf[k] = 0
        return 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cusolver_call_keeps_the_documented_abi(dtype, monkeypatch):
    """The ctypes call of cusolverDnXsyevBatched: the C arrays' lower triangles are what is decomposed
    (garbage above), eigenvectors come back as columns of V, eigenvalues ascending, the batch split into
    calls of DEVICE_BATCH_VALUES, each with its workspace sizes, on the stream given."""
    monkeypatch.setattr(symmetric, "DEVICE_BATCH_VALUES", 2 * 12 * 12)   # 2 matrices per call
    A = grams(11, g=5, m=12)
    upper = np.triu_indices(12, 1)
    A[:, upper[0], upper[1]] = 777.0                                      # garbage above the diagonal
    A[4, 7, 2] = np.nan                                                   # the last call's: info 1
    fake = FakeCusolver()
    At = torch.as_tensor(A, dtype=dtype)
    w, V, info = symmetric._syev_batched(fake, 11, 22, 33, At)
    assert fake.streams == [(11, 33)]
    assert [c["batch"] for c in fake.calls] == [2, 2, 1]
    assert all(c["uplo"] == 1 and c["n"] == c["lda"] == 12 and (c["handle"], c["params"]) == (11, 22)
               for c in fake.calls)
    assert w.dtype == V.dtype == dtype and info.tolist() == [0, 0, 0, 0, 1]
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    lower = np.tril(A) + np.tril(A, -1).transpose(0, 2, 1)
    for k in range(4):
        want = np.linalg.eigvalsh(lower[k])
        np.testing.assert_allclose(w[k].double().numpy(), want, atol=tol * np.abs(want).max())
        Vk = V[k].double().numpy()
        np.testing.assert_allclose(lower[k] @ Vk, Vk * w[k].double().numpy(), atol=tol * np.abs(want).max())
    np.testing.assert_array_equal(At.numpy(), A.astype(At.numpy().dtype))   # A itself untouched (NaN too)


def test_failed_device_decompositions_are_redone_on_the_host():
    """The check: a matrix answered by its diagonal and the identity (syevjBatched's known failure), one
    with NaN eigenvalues, one with a nonzero info and one whose eigenvectors are not orthonormal are
    decomposed again by LAPACK, with a warning that counts them; the others are kept as they were."""
    A = torch.as_tensor(grams(12, g=6, m=9))
    w, V = torch.linalg.eigh(A)
    w, V = w.clone(), V.clone()
    w[1], V[1] = torch.diagonal(A[1]).sort().values, torch.eye(9, dtype=A.dtype)
    w[2, 3] = float("nan")
    V[4] *= 1.01
    info = torch.tensor([0, 0, 0, 5, 0, 0], dtype=torch.int32)
    kept = V[5].clone()
    with pytest.warns(RuntimeWarning, match=r"4 of 6 decompositions failed the check .* the first: matrix 1"):
        w2, V2 = symmetric._checked(A, w, V, info, "cupy")
    for k in range(6):
        want = np.linalg.eigvalsh(A[k].numpy())
        np.testing.assert_allclose(w2[k].numpy(), want, atol=1e-12 * want.max())
        np.testing.assert_allclose(A[k].numpy() @ V2[k].numpy(), V2[k].numpy() * w2[k].numpy(),
                                   atol=1e-12 * want.max())
    assert torch.equal(V2[5], kept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        symmetric._checked(A, w2, V2, None, "cupy")                        # all good: no warning


def test_cusolver_batches_are_halved_where_the_size_query_refuses_them_or_the_workspace_is_over_budget():
    """A batch the size query refuses (INVALID_VALUE) or whose device workspace is over the budget is
    asked again at half the matrices; every matrix is still decomposed, once."""
    A = torch.as_tensor(grams(13, g=7, m=6))
    want = np.linalg.eigvalsh(A.numpy())
    fake = FakeCusolver(refuse_above=3)
    w, _, info = symmetric._syev_batched(fake, 1, 2, 0, A)
    assert fake.queries == [7, 3, 3, 1] and [c["batch"] for c in fake.calls] == [3, 3, 1]
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-12)
    fake = FakeCusolver()
    budget = FakeCusolver._sizes(6, 3)[0]                   # the workspace of 3 matrices
    w, _, _ = symmetric._syev_batched(fake, 1, 2, 0, A, budget=budget)
    assert fake.queries == [7, 3, 3, 1] and [c["batch"] for c in fake.calls] == [3, 3, 1]
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-12)
    w, V, info = symmetric._syev_batched(FakeCusolver(), 1, 2, 0, A[:0])    # nothing to do: no call
    assert w.shape == (0, 6) and V.shape == (0, 6, 6) and info.shape == (0,)


def test_cusolver_status_is_named_and_alloc_failed_counts_as_out_of_memory():
    from hcrfast.algorithm import _is_oom

    with pytest.raises(RuntimeError, match=r"cusolverDnXsyevBatched returned CUSOLVER_STATUS_ALLOC_FAILED \(2\)") as e:
        symmetric._status("cusolverDnXsyevBatched", 2)
    assert _is_oom(e.value)                                 # bound() halves the chunk and goes on
    with pytest.raises(RuntimeError, match=r"CUSOLVER_STATUS_INVALID_VALUE \(3\)") as e:
        symmetric._status("cusolverDnXsyevBatched_bufferSize", 3)
    assert not _is_oom(e.value)


def test_signatures_match_the_cusolver_header_torchs_wheel_ships():
    """_SIGNATURES against cusolverDn.h as torch's CUDA wheel installs it (nvidia-cusolver), read here,
    and the library beside it exports each function (skipped where the wheel's files are absent)."""
    import glob
    import os
    import re

    site = os.path.dirname(os.path.dirname(torch.__file__))
    headers = sorted(glob.glob(os.path.join(site, "nvidia", "*", "include", "cusolverDn.h"))
                     + glob.glob(os.path.join(site, "nvidia", "cusolver", "include", "cusolverDn.h")))
    if not headers:
        pytest.skip("no cusolverDn.h from torch's CUDA wheel here")
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", open(headers[0]).read(), flags=re.S)
    scalar = {"int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t, "cusolverEigMode_t": ctypes.c_int,
              "cublasFillMode_t": ctypes.c_int, "cudaDataType": ctypes.c_int, "cusolverDnHandle_t": ctypes.c_void_p,
              "cusolverDnParams_t": ctypes.c_void_p, "cudaStream_t": ctypes.c_void_p}

    def ctype(decl):
        words = decl.replace("*", " * ").split()
        words = [w for w in words if w != "const"]
        stars = words.count("*")
        base = words[0]
        if stars == 0:
            return scalar[base]
        if stars == 1 and base in ("size_t", "cusolverDnHandle_t", "cusolverDnParams_t"):
            return ("pointer to", scalar[base])
        return ctypes.c_void_p                             # void*, const void*, int*

    def ours(t):
        return ("pointer to", t._type_) if isinstance(t, type) and issubclass(t, ctypes._Pointer) else t

    for name, sig in symmetric._SIGNATURES.items():
        m = re.search(r"\b%s\s*\(([^)]*)\)\s*;" % re.escape(name), text)
        assert m, name
        declared = [ctype(a) for a in m.group(1).split(",")]
        assert declared == [ours(t) for t in sig], name
    libs = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(headers[0])), "lib", "libcusolver.so.*")))
    if libs:
        lib = ctypes.CDLL(libs[0])
        assert all(hasattr(lib, name) for name in symmetric._SIGNATURES)


def test_the_check_refuses_wrong_answers_at_any_scale_and_names_a_non_finite_matrix():
    """Scaled by each matrix's largest entry, the check's norms do not overflow: the diagonal-and-identity
    answer is refused for matrices near float64's and float32's limits, and kept right ones pass. A NaN in
    a lower triangle is refused with that matrix's index in the whole batch."""
    for dtype, big in ((torch.float64, 1e153), (torch.float32, 1e18)):
        A = torch.as_tensor(grams(14, g=3, m=8) / 50, dtype=torch.float64) * big
        w, V = torch.linalg.eigh(A)
        w, V = w.to(dtype), V.to(dtype)
        A = A.to(dtype)
        wrong_w, wrong_V = w.clone(), V.clone()
        wrong_w[2], wrong_V[2] = torch.diagonal(A[2]).sort().values, torch.eye(8, dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            symmetric._checked(A, w, V, None, "cusolver")                   # right: kept, no warning
        with pytest.warns(RuntimeWarning, match=r"1 of 3 decompositions failed the check .* matrix 2"):
            symmetric._checked(A, wrong_w, wrong_V, None, "cusolver")
    A = torch.as_tensor(grams(15, g=5, m=6))
    w, V = torch.linalg.eigh(A)
    kept = float(A[3, 4, 1])
    A[3, 4, 1] = float("nan")
    with pytest.raises(ValueError, match=r"matrix 3 \(order 6 .*\) holds NaN or inf in its lower triangle"):
        symmetric._checked(A, w, V, None, "cupy")
    A[3, 4, 1] = kept
    w2 = w.clone()
    w2[1] = w2[1].flip(0)                                   # eigenpairs out of order: redone
    with pytest.warns(RuntimeWarning, match=r"1 of 5 .* the first: matrix 1"):
        w3, _ = symmetric._checked(A, w2, V, None, "cupy")
    np.testing.assert_allclose(w3[1].numpy(), np.linalg.eigvalsh(A[1].numpy()), rtol=1e-12)
