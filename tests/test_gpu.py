"""GPU tests (marker ``gpu``): skipped cleanly on machines without CUDA and CuPy.

Each compares the GPU path with the CPU path on the same inputs, checks the
zero-copy bridge by data pointers, and checks that the LSQR loop makes no
device-to-host transfer between its every-k convergence checks.
"""
import copy
import warnings

import numpy as np
import pytest
import torch

import hcrfast
from hcrfast.backend import cuda_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and cuda_available()),
                       reason="needs a CUDA GPU with CuPy (pip install 'hcrfast[cuda12]' or '[cuda13]')"),
]


@pytest.fixture(scope="module")
def cupy():
    import cupy

    return cupy


@pytest.fixture
def host_reads(monkeypatch):
    """(list that grows by one per deliberate host read of the LSQR loop, a float32 CUDA MLP, its inputs)."""
    import hcrfast.lsqr as lsqr_mod

    calls = []
    real = lsqr_mod.to_host
    monkeypatch.setattr(lsqr_mod, "to_host", lambda a: calls.append(1) or real(a))
    return calls, mlp(torch.float32).cuda(), torch.rand(64, 1, 8, 8, device="cuda")


def mlp(dtype=torch.float64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.Tanh(),
                               torch.nn.Linear(48, 48), torch.nn.Tanh()).to(dtype).eval()


def test_bridge_is_zero_copy_on_cuda(cupy):
    from hcrfast.bindings import from_torch, to_torch

    a = cupy.random.standard_normal((5, 7), dtype=cupy.float32)
    assert to_torch(a).data_ptr() == a.data.ptr
    t = torch.randn(5, 7, device="cuda")
    assert from_torch(t).data.ptr == t.data_ptr()


def test_bound_on_gpu_matches_cpu():
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kw = dict(iterations=3, restarts=3, lsqr=hcrfast.LSQROptions(atol=1e-10, btol=1e-10, iter_lim=300))
    cpu = hcrfast.bound(mlp(), x, 0.05, **kw)
    gpu = hcrfast.bound(mlp().cuda(), x.cuda(), 0.05, **kw).to_numpy()
    np.testing.assert_allclose(gpu.std, cpu.std, rtol=1e-6)
    np.testing.assert_allclose(gpu.divergence, cpu.divergence, rtol=1e-6)


def test_on_a_gpu_no_forward_is_hooked_or_pieced(monkeypatch):
    """The CPU's activation count (hooks during the first forward) and its forward pieces are for the CPU's memory:
    on CUDA, where allocations fail and are halved, no hook is registered on the model and nothing is counted."""
    from hcrfast import algorithm

    registered, counted, first = [], [], []
    real = torch.nn.Module.register_forward_hook
    monkeypatch.setattr(torch.nn.Module, "register_forward_hook",
                        lambda self, *a, **k: registered.append(type(self).__name__) or real(self, *a, **k))
    real_piece, real_unmeasured = algorithm._piece_rows, algorithm._unmeasured
    monkeypatch.setattr(algorithm, "_piece_rows", lambda m, x: counted.append(real_piece(m, x)) or counted[-1])
    monkeypatch.setattr(algorithm, "_unmeasured", lambda m, x: first.append(real_unmeasured(m, x)) or first[-1])
    model = mlp(torch.float32).cuda()
    # (40 rows: on a CPU the first forward would run 16 of them first, counted; on CUDA it runs whole)
    hcrfast.bound(model, torch.rand(40, 1, 8, 8, device="cuda"), 0.05, iterations=2, restarts=2)
    assert registered == [] and counted and set(counted) == {None} and first and set(first) == {False}


@pytest.mark.parametrize("eigh_impl", ["lapack", "torch", "cusolver", "cupy"])
def test_dense_solve_on_gpu_matches_cpu(eigh_impl, monkeypatch):
    """solver='dense' on CUDA, its Gram matrices on the host's LAPACK (the default), cuSOLVER one matrix
    at a time through torch, or batched on the device (cusolverDnXsyevBatched through ctypes, CuPy's
    syevjBatched): the same exact steps as on the CPU, no decomposition redone on the host."""
    import warnings

    from hcrfast import dense

    from hcrfast.kernels import symmetric

    # float32: min_norm_solver's "eigh" driver (a float64 J takes the SVD, which would test nothing here)
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    kw = dict(iterations=3, restarts=3, solver="dense")
    cpu = hcrfast.bound(mlp().float(), x, 0.05, **kw)
    monkeypatch.setattr(dense, "EIGH_IMPL", eigh_impl)
    impls, real = [], symmetric.eigh_batch
    monkeypatch.setattr(symmetric, "eigh_batch", lambda *a, **k: impls.append(k.get("impl")) or real(*a, **k))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="eigh_batch", category=RuntimeWarning)  # a failed device check
        gpu = hcrfast.bound(mlp().float().cuda(), x.cuda(), 0.05, **kw)
    assert impls and set(impls) == {eigh_impl}
    assert gpu.params["solver"] == "dense" and gpu.params["dense"]["rank_min"] == cpu.params["dense"]["rank_min"]
    np.testing.assert_allclose(gpu.to_numpy().std, cpu.std, rtol=1e-4)
    # and "auto" takes the Krylov basis on CUDA (the dense solve on the CPU)
    assert hcrfast.bound(mlp().float().cuda(), x.cuda(), 0.05, iterations=1, restarts=1).params["solver"] == "krylov"


def test_symmetric_eigh_of_cuda_matrices_matches_numpy():
    """kernels.symmetric on CUDA tensors: the host's LAPACK (a copy there and back), cuSOLVER through
    torch, and the batched device routines (cusolverDnXsyevBatched, CuPy's syevjBatched) give NumPy's
    eigenvalues, eigenvectors that rebuild the matrices, on the matrices' device."""
    import warnings

    from hcrfast.kernels import symmetric

    rng = np.random.default_rng(0)
    J = rng.standard_normal((5, 60, 90))
    A = J @ J.transpose(0, 2, 1)
    orders = np.array([60, 41, 0, 1, 59])
    for impl in ("lapack", "torch", "cusolver", "cupy"):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="eigh_batch", category=RuntimeWarning)  # none redone on the host
            w, V = symmetric.eigh_batch(torch.as_tensor(A, device="cuda"), orders, impl=impl)
        assert w.device.type == V.device.type == "cuda"
        w, V = w.cpu().numpy(), V.cpu().numpy()
        for a, n in enumerate(orders):
            block = np.zeros_like(A[a])
            block[:n, :n] = A[a, :n, :n]
            np.testing.assert_allclose(np.sort(w[a]), np.linalg.eigvalsh(block), atol=1e-10 * np.abs(A).max())
            np.testing.assert_allclose(V[a] @ np.diag(w[a]) @ V[a].T, block, atol=1e-9 * np.abs(A).max())


@pytest.mark.parametrize("impl", ["cusolver", "cupy"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_device_eigh_at_the_dense_solves_size(impl, dtype):
    """The race's Gram matrices: 40 of order up to 390 (rank-deficient blocks of per-example orders),
    in more than one call of the device routine: the host LAPACK's eigenvalues, a small residual, and no
    decomposition that fails the check (which would be redone on the host with a RuntimeWarning)."""
    import warnings

    from hcrfast.kernels import symmetric

    rng = np.random.default_rng(6)
    J = rng.standard_normal((40, 390, 784)) / 28
    J[:, :, 380:] = 0.0                                    # rank 380 at most: ~10 zero eigenvalues
    A = J @ J.transpose(0, 2, 1)
    orders = rng.integers(370, 391, size=40)
    w0, _ = symmetric.eigh_batch(torch.as_tensor(A), orders, impl="lapack")
    At = torch.as_tensor(A, device="cuda", dtype=dtype)
    old = symmetric.DEVICE_BATCH_VALUES
    symmetric.DEVICE_BATCH_VALUES = 16 * 390 * 390          # 3 calls
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="eigh_batch", category=RuntimeWarning)
            w, V = symmetric.eigh_batch(At, orders, impl=impl)
    finally:
        symmetric.DEVICE_BATCH_VALUES = old
    assert w.dtype == V.dtype == dtype and w.device.type == "cuda"
    eps = float(torch.finfo(dtype).eps)
    scale = float(np.abs(np.sort(w0.numpy(), axis=1)).max())
    np.testing.assert_allclose(w.double().cpu().numpy(), np.sort(w0.numpy(), axis=1), atol=1e4 * eps * scale)
    S = symmetric._blocks(At, orders)
    res = torch.linalg.vector_norm(S @ V - V * w[:, None, :], dim=(1, 2)) / torch.linalg.vector_norm(S, dim=(1, 2))
    assert float(res.max()) < 1e3 * eps


def test_dense_jacobian_from_nonzero_rows_on_gpu_matches_jacrev_on_cpu():
    """The dense solve's J on CUDA, its zero rows found by JVPs and checked by a VJP, each example
    pulling back its own nonzero rows: torch.func.jacrev's J on the CPU, the same products count."""
    from hcrfast import dense

    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.ReLU(),
                              torch.nn.Linear(48, 40), torch.nn.ReLU()).double().eval()
    x = torch.randn(6, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    want = torch.stack([torch.func.jacrev(lambda t: net(t[None]).reshape(-1))(x[b]).reshape(40, 64)
                        for b in range(6)]).detach().numpy()
    J, products = dense.jacobian(net.cuda(), x.cuda(), mode="reverse", chunk_size=5, skip_zero_rows=True,
                                 return_products=True)
    np.testing.assert_allclose(J.cpu().numpy(), want, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(products, (np.abs(want).max(axis=2) > 0).sum(axis=1) + 3 + 1)


def test_krylov_solve_on_gpu_matches_cpu():
    """solver='krylov' on CUDA (CuPy LSQR steps, torch reorthogonalization, host eigh of B_kᵀB_k), both in
    float64 and float32, and compacting every look: the same bases and bounds as on the CPU. In float32
    the bounds are compared by their median: a reading of the code found that another summation order
    of the matmuls (cuBLAS's instead of the CPU's) moves single float32 coordinates by percents, where
    float64 moves them by ~1e-10."""
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for dtype in (torch.float64, torch.float32):
        kw = dict(iterations=3, restarts=3, solver="krylov")
        cpu = hcrfast.bound(mlp().to(dtype), x.to(dtype), 0.05, **kw)
        gpu = hcrfast.bound(mlp().to(dtype).cuda(), x.to(dtype).cuda(), 0.05, **kw)
        assert gpu.params["solver"] == "krylov"
        assert gpu.params["krylov"]["rank_min"] == cpu.params["krylov"]["rank_min"]
        if dtype == torch.float64:
            np.testing.assert_allclose(gpu.to_numpy().std, cpu.std, rtol=1e-7)
        else:
            assert np.median(gpu.to_numpy().std) == pytest.approx(np.median(cpu.std), rel=0.02)


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_singular_steps_past_the_rank_on_gpu_match_cpu(solver):
    """J of rank <= 6 behind a 6-unit layer, 12 singular steps: the rows past the rank (steps of 0) are
    left out of the certification by device index, and the bounds are the CPU's (float64)."""
    def narrow():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 6), torch.nn.Tanh(),
                                   torch.nn.Linear(6, 48), torch.nn.Tanh()).double().eval()

    x = torch.rand(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    kw = dict(iterations=2, restarts=2, solver=solver, singular_steps=12)
    cpu = hcrfast.bound(narrow(), x, 0.05, **kw)
    gpu = hcrfast.bound(narrow().cuda(), x.cuda(), 0.05, **kw).to_numpy()
    assert gpu.params["singular_steps"]["count"] == 12
    np.testing.assert_allclose(gpu.std, cpu.std, rtol=1e-7)


@pytest.mark.parametrize("eig_impl", ["cusolver", "cupy"])
def test_krylov_basis_factored_on_the_device_matches_the_host(eig_impl, monkeypatch):
    """krylov.EIG_IMPL "cusolver"/"cupy": a float32 basis' B_kᵀB_k written out dense and decomposed by a
    batched cuSOLVER routine on the device (no host LAPACK): the host's ranks and bounds, no decomposition
    redone on the host; a float64 basis stays on the host (its rank cut is below the routine's accuracy)."""
    import warnings

    from hcrfast import krylov
    from hcrfast.kernels import tridiagonal

    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(5)).cuda()
    net = mlp().float().cuda()
    kw = dict(iterations=3, restarts=3, solver="krylov")
    host = hcrfast.bound(net, x, 0.05, **kw)
    monkeypatch.setattr(krylov, "EIG_IMPL", eig_impl)
    calls, real = [], tridiagonal.eigh_tridiagonal_batch
    monkeypatch.setattr(tridiagonal, "eigh_tridiagonal_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="eigh_batch", category=RuntimeWarning)
        dev = hcrfast.bound(net, x, 0.05, **kw)
    assert not calls
    assert dev.params["krylov"]["rank_min"] == host.params["krylov"]["rank_min"]
    np.testing.assert_allclose(dev.to_numpy().std, host.to_numpy().std, rtol=1e-4)
    with pytest.warns(RuntimeWarning, match="below what a dense eigensolver"):
        hcrfast.bound(mlp().cuda(), x.double(), 0.05, **kw)
    assert calls


def test_krylov_rollback_at_exhaustion_on_gpu_gives_pinv(cupy):
    """The default one-pass Gram–Schmidt with its device-side check: on a rank-100 float64 stack (CuPy
    matrices) the block where the space is exhausted is rerun with two passes, as on the CPU, and
    the solves are numpy.linalg.pinv's."""
    from hcrfast import krylov
    from hcrfast.operators import DenseBatchOperator

    rng = np.random.default_rng(100)
    A = np.empty((2, 150, 120))
    for e in range(2):
        U, _ = np.linalg.qr(rng.standard_normal((150, 100)))
        V, _ = np.linalg.qr(rng.standard_normal((120, 100)))
        A[e] = (U * np.logspace(0, -2, 100)) @ V.T
    b = rng.standard_normal((2, 150))
    basis = krylov.build(DenseBatchOperator(cupy.asarray(A)), cupy.asarray(b))
    assert np.all(basis.rank == 100) and np.all(basis.redone > 0)
    c = rng.standard_normal((2, 4, 150))
    got = basis.solve(torch.as_tensor(c, device="cuda")).cpu().numpy()
    want = np.einsum("bpn,brn->brp", np.linalg.pinv(A, rcond=1e-10), c)
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max()


def test_to_device_queues_the_copy_without_waiting():
    """A host index reaches the device through pinned memory, queued on torch's stream: torch's
    sync-debug mode, which raises on a pageable copy (torch.as_tensor(..., device="cuda")), stays
    silent, and the values arrive behind the work queued before them."""
    from hcrfast.bindings import to_device

    a = np.arange(1000, dtype=np.int64)[::-1].copy()
    busy = torch.randn(4096, 4096, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        busy = busy @ busy  # keeps the stream busy while the copy is queued behind it
        t = to_device(a, torch.device("cuda"))
        got = busy[0, :0].sum() + t  # ordered on the same stream
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert t.is_cuda and t.dtype == torch.int64
    np.testing.assert_array_equal(got.cpu().numpy(), a)


def test_no_host_transfer_inside_the_krylov_build(cupy, monkeypatch):
    """The basis' steps never wait for the device between checks (torch's sync-debug mode raises; the
    factorization after the loop copies α, β to the host on purpose and runs outside it), and the only
    host reads of the loop are, per check, the active mask and the one-pass check's mask, then the
    steps and stop codes once."""
    from hcrfast import krylov
    from hcrfast.bindings import TorchJacobian

    calls = []
    real_to_host, real_factors = krylov.to_host, krylov._factors
    monkeypatch.setattr(krylov, "to_host", lambda a: calls.append(1) or real_to_host(a))

    def factors(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_factors(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("error")
    monkeypatch.setattr(krylov, "_factors", factors)
    model, x = mlp(torch.float32).cuda(), torch.rand(64, 1, 8, 8, device="cuda")
    b = cupy.random.standard_normal((64, 48), dtype=cupy.float32)
    torch.cuda.set_sync_debug_mode("error")
    try:
        basis = krylov.build(TorchJacobian(model, x), b, iter_lim=40, check_every=10)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert np.all(basis.steps == 40) and basis.redone.sum() == 0  # no exhaustion, no rollback
    checks = 40 // 10 + 1
    assert len(calls) == checks + (checks - 1) + 2


def test_dense_solve_with_targets_on_gpu_matches_cpu():
    """bound(solver='dense', targets=...) on CUDA: the targeted directions from the solve's shared
    factorization, certified on the device, as on the CPU."""
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    kw = dict(iterations=2, restarts=2, solver="dense", targets="low:3")
    cpu = hcrfast.bound(mlp(), x, 0.05, **kw)
    gpu = hcrfast.bound(mlp().cuda(), x.cuda(), 0.05, **kw)
    assert gpu.targeted.params["shared_factorization"] and gpu.targeted.params["device"].startswith("cuda")
    np.testing.assert_allclose(gpu.to_numpy().std, cpu.std, rtol=1e-8)


@pytest.mark.parametrize("method", ["dense", "lsqr"])
def test_targeted_bound_on_gpu_matches_cpu(method):
    """targeted_bound on CUDA (dense: with the null-space probes; lsqr: two batched solves) as on the CPU."""
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    cpu = hcrfast.targeted_bound(mlp(), x, 0.05, targets="low:2", method=method)
    gpu = hcrfast.targeted_bound(mlp().cuda(), x.cuda(), 0.05, targets="low:2", method=method).to_numpy()
    np.testing.assert_array_equal(gpu.infinite, cpu.infinite)
    np.testing.assert_array_equal(gpu.from_null_space, cpu.from_null_space)
    # 64 inputs, 48 features: J has a null space, and the dense method's null-space probes move the
    # features by rounding only. Their bounds (~1e12 here) are certified for the features as each
    # device computes them, and differ between devices as the rounding does (on an H100 against
    # its host: 3.4e12 against 2.4e12). The Cramér-Rao steps must agree to 1e-6.
    targeted = np.zeros(cpu.std.shape, dtype=bool)
    flat = targeted.reshape(targeted.shape[0], -1)
    flat[:, cpu.modes] = ~cpu.from_null_space
    np.testing.assert_allclose(gpu.std[targeted], cpu.std[targeted], rtol=1e-6)
    null = ~targeted & (cpu.std > 0)
    np.testing.assert_array_equal(gpu.std[null] > 0, True)
    assert np.all(np.abs(np.log10(gpu.std[null] / cpu.std[null])) < 1), (gpu.std[null], cpu.std[null])


def test_per_feature_sigma_and_input_checks_on_gpu():
    """One std per feature (a CUDA tensor too), the batch copy, a model blind to the input and an
    attack that takes no step: as on the CPU."""
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    stds = np.linspace(0.03, 0.08, 48)
    kw = dict(iterations=2, restarts=2, solver="krylov", targets="low:2")
    cpu = hcrfast.bound(mlp(), x, stds, **kw)
    for sigma in (stds, torch.as_tensor(stds, device="cuda")):
        gpu = hcrfast.bound(mlp().cuda(), x.cuda(), sigma, **kw).to_numpy()
        np.testing.assert_allclose(gpu.std, cpu.std, rtol=1e-6)
        np.testing.assert_allclose(gpu.z, cpu.z, rtol=1e-6)
        assert gpu.params["noise"] == cpu.params["noise"]
    blind = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 6, bias=True)).double().cuda().eval()
    with torch.no_grad():
        blind[1].weight.zero_()
    with pytest.warns(UserWarning, match="found J = 0"):
        res = hcrfast.bound(blind, x.cuda(), 0.05, iterations=1, restarts=2, solver="lsqr")
    assert all("J = 0 here" in r for r in res.params["zero_step_reasons"])


@pytest.mark.parametrize("impl", ["twin", "numba"])
def test_bound_float32_on_gpu_with_each_kernel_impl(impl):
    model = mlp(torch.float32).cuda()
    x = torch.rand(8, 1, 8, 8, device="cuda")
    res = hcrfast.bound(model, x, 0.05, iterations=2, restarts=4,
                        lsqr=hcrfast.LSQROptions(atol=1e-5, btol=1e-5, iter_lim=100, kernels=impl)).to_numpy()
    cpu = hcrfast.bound(mlp(torch.float32), x.cpu(), 0.05, iterations=2, restarts=4,
                        lsqr=hcrfast.LSQROptions(atol=1e-5, btol=1e-5, iter_lim=100))
    assert np.all(np.isfinite(res.std)) and np.all(res.std > 0)
    np.testing.assert_allclose(np.median(res.std), np.median(cpu.std), rtol=0.05)


@pytest.mark.parametrize("name", ["row_normalize", "lsqr_update_xw", "restart_update", "dct2", "idct2"])
def test_numba_kernels_match_twins_on_cupy(cupy, name):
    from hcrfast import kernels

    rng = cupy.random.default_rng(2)
    for dtype, tol in ((cupy.float32, 1e-5), (cupy.float64, 1e-12)):
        if name == "row_normalize":
            a = rng.standard_normal((33, 1000), dtype=dtype)
            a[3] = 0
            args = (a, 2.0)
            in_place = a.copy()
            got = kernels.row_normalize(in_place, 2.0, out=in_place, impl="numba")
            assert got[0] is in_place
            want = kernels.row_normalize(a, 2.0, impl="twin")
            for g, r in zip(got, want):
                cupy.testing.assert_allclose(g, r, rtol=tol, atol=tol)
        elif name == "lsqr_update_xw":
            x, w, v = (rng.standard_normal((9, 500), dtype=dtype) for _ in range(3))
            t1, t2 = rng.standard_normal(9, dtype=dtype), rng.standard_normal(9, dtype=dtype)
            got = kernels.lsqr_update_xw(x.copy(), w.copy(), v, t1, t2, impl="numba")
            want = kernels.lsqr_update_xw(x.copy(), w.copy(), v, t1, t2, impl="twin")
            for g, r in zip(got, want):
                cupy.testing.assert_allclose(g, r, rtol=tol, atol=tol)
            continue
        elif name == "restart_update":
            args = (rng.standard_normal((17, 300), dtype=dtype), rng.standard_normal((17, 300), dtype=dtype),
                    cupy.full(17, 0.5, dtype=cupy.float64))
        else:
            args = (rng.standard_normal((2, 3, 91, 91), dtype=dtype),)
        got = getattr(kernels, name)(*args, impl="numba")
        want = getattr(kernels, name)(*args, impl="twin")
        for g, r in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            cupy.testing.assert_allclose(g, r, rtol=tol, atol=tol)


def test_launches_on_one_cupy_stream_reuse_one_numba_wrapper(cupy):
    """Every launch on CuPy's current stream takes the same Numba stream object (numba-cuda's launch
    configurations are cached on it); a side stream gets its own, and the results stay right."""
    from hcrfast import kernels
    from hcrfast.kernels import cuda as cuda_kernels

    a = cupy.random.default_rng(3).standard_normal((8, 300))
    kernels.row_norms(a, impl="numba")
    ptr = cupy.cuda.get_current_stream().ptr
    wrapper = cuda_kernels._external_stream(ptr)
    kernels.row_norms(a, impl="numba")
    assert cuda_kernels._external_stream(ptr) is wrapper and int(wrapper) == ptr
    side = cupy.cuda.Stream(non_blocking=True)
    side.wait_event(cupy.cuda.get_current_stream().record())  # a was written on the current stream
    with side:
        got = kernels.row_norms(a, impl="numba")
        assert cuda_kernels._external_stream(side.ptr) is not wrapper
    side.synchronize()
    cupy.testing.assert_allclose(got, cupy.linalg.norm(a, axis=1), rtol=1e-12)


def test_lsqr_from_a_fortran_ordered_start_runs_the_numba_kernels(cupy):
    """The Numba x/w update writes C-ordered rows in place; a start x0 in Fortran order is taken in C
    order, and the solve matches the twins' (the update refused it before: 'must be C-contiguous')."""
    from hcrfast.lsqr import lsqr
    from hcrfast.operators import DenseBatchOperator

    rng = np.random.default_rng(5)
    A, b, x0 = rng.standard_normal((3, 40, 30)), rng.standard_normal((3, 40)), rng.standard_normal((3, 30))
    op = DenseBatchOperator(cupy.asarray(A))
    start = cupy.asfortranarray(cupy.asarray(x0))
    assert not start.flags.c_contiguous
    got = lsqr(op, cupy.asarray(b), atol=1e-10, btol=1e-10, x0=start, kernels="numba")
    want = lsqr(op, cupy.asarray(b), atol=1e-10, btol=1e-10, x0=start, kernels="twin")
    cupy.testing.assert_allclose(got.x, want.x, rtol=1e-9, atol=1e-12)


def test_no_host_transfer_inside_the_lsqr_loop(cupy, host_reads):
    """Between checks torch's side of the loop never waits for the device (its sync-debug mode raises
    on torch's synchronizing ops; it does not see CuPy's, which the profiler test below counts), and
    the only deliberate host reads are the every-k checks."""
    from hcrfast.bindings import TorchJacobian, solver_stream
    from hcrfast.lsqr import lsqr

    calls, model, x = host_reads
    with solver_stream(x.device):
        b = cupy.random.standard_normal((64, 48), dtype=cupy.float32)
        torch.cuda.set_sync_debug_mode("error")
        try:
            res = lsqr(TorchJacobian(model, x), b, atol=0, btol=0, conlim=0, iter_lim=40, check_every=10)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert int(res.itn.max()) == 40
    assert len(calls) == 40 // 10 + 1


def test_device_to_host_copies_in_lsqr_are_only_the_checks_by_profiler(cupy, host_reads):
    """CUPTI (through torch.profiler) sees every device-to-host copy of the process, CuPy's
    included: their number equals the deliberate every-k checks, and nothing else."""
    from torch.profiler import ProfilerActivity, profile

    from hcrfast.bindings import TorchJacobian, solver_stream
    from hcrfast.lsqr import lsqr

    calls, model, x = host_reads
    with solver_stream(x.device):
        b = cupy.random.standard_normal((64, 48), dtype=cupy.float32)
        op = TorchJacobian(model, x)
        op.matvec(cupy.zeros((64, 64), dtype=cupy.float32))  # record the graph outside the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            res = lsqr(op, b, atol=0, btol=0, conlim=0, iter_lim=40, check_every=10, compact_below=0.0)
            torch.cuda.synchronize()
    names = {e.key: e.count for e in prof.key_averages()}
    if not any("gemm" in k.lower() or "sgemm" in k.lower() or "kernel" in k.lower() for k in names):
        pytest.skip(f"the profiler recorded no CUDA activity here (CUPTI unavailable?): {sorted(names)[:8]}")
    dtoh = sum(count for key, count in names.items() if "DtoH" in key)
    assert int(res.itn.max()) == 40
    assert dtoh == len(calls) == 40 // 10 + 1, {k: v for k, v in names.items() if "Memcpy" in k}


@pytest.fixture
def pool_mallocs(cupy):
    """A list that grows by one per allocation CuPy's default pool serves on this thread (a memory hook)."""
    calls = []

    class Count(cupy.cuda.MemoryHook):
        name = "hcrfast-test-count"

        def malloc_preprocess(self, **kwargs):
            calls.append(kwargs["mem_size"])

    with Count():
        yield calls


def test_solver_arrays_come_from_torchs_caching_allocator(cupy, pool_mallocs, monkeypatch):
    """In the solver's block a CuPy array is a block of torch's caching allocator (owned by the array's
    memory, counted by torch, given back when the array dies) and CuPy's pool serves nothing; on a
    stream other than the solver's, and with HCRFAST_CUPY_ALLOCATOR=cupy, CuPy's pool serves."""
    import gc
    import weakref

    from hcrfast.bindings import solver_stream

    device = torch.device("cuda", torch.cuda.current_device())
    size = 1 << 22
    gc.collect()
    with solver_stream(device):
        before = torch.cuda.memory_allocated(device)
        a = cupy.ones(size, dtype=cupy.uint8)
        owner = a.data.mem._owner
        assert owner is not None and owner.ptr == a.data.ptr and a.data.mem.device_id == device.index
        assert torch.cuda.memory_allocated(device) >= before + size
        assert int(a.sum()) == size
        assert pool_mallocs == []
        gone = weakref.ref(owner)
        del owner, a
        assert gone() is None
        assert torch.cuda.memory_allocated(device) == before
        empty = cupy.empty(0, dtype=cupy.float32)
        assert empty.size == 0 and pool_mallocs == []
        with cupy.cuda.Stream():
            b = cupy.ones(size, dtype=cupy.uint8)
            assert pool_mallocs and pool_mallocs[-1] >= size and b.data.mem.__class__.__name__ != "UnownedMemory"
            del b
    monkeypatch.setenv("HCRFAST_CUPY_ALLOCATOR", "cupy")
    pool_mallocs.clear()
    with solver_stream(device):
        c = cupy.ones(size, dtype=cupy.uint8)
        assert pool_mallocs and pool_mallocs[-1] >= size
        del c


def test_a_users_own_cupy_allocator_is_left_in_place(cupy, pool_mallocs):
    """An allocator the caller set (here CuPy's raw cudaMalloc, no pool) serves the solver's arrays."""
    from hcrfast.bindings import solver_stream

    with cupy.cuda.using_allocator(cupy.cuda.memory._malloc):
        with solver_stream(torch.device("cuda")):
            a = cupy.ones(1 << 20, dtype=cupy.uint8)
            assert type(a.data.mem).__name__ == "Memory" and pool_mallocs == []


@pytest.mark.parametrize("solver", ["lsqr", "krylov"])
def test_bound_keeps_its_vectors_in_torchs_pool_and_matches_cupys_pool(cupy, pool_mallocs, monkeypatch, solver):
    """A whole call (solve, kernels, DCT, certification) takes nothing from CuPy's pool by default, and
    gives the bounds it gives with the solver's arrays in CuPy's pool."""
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(3)).cuda()
    kw = dict(iterations=3, restarts=4, solver=solver,
              lsqr=hcrfast.LSQROptions(atol=1e-6, btol=1e-6, iter_lim=100) if solver == "lsqr" else None)
    shared = hcrfast.bound(mlp(torch.float32).cuda(), x, 0.05, **kw)
    assert pool_mallocs == []  # (the host copies below are outside the call: not counted)
    shared = shared.to_numpy()
    monkeypatch.setenv("HCRFAST_CUPY_ALLOCATOR", "cupy")
    pool_mallocs.clear()
    apart = hcrfast.bound(mlp(torch.float32).cuda(), x, 0.05, **kw)
    assert pool_mallocs
    apart = apart.to_numpy()
    np.testing.assert_allclose(shared.std, apart.std, rtol=1e-5)
    np.testing.assert_allclose(shared.divergence, apart.divergence, rtol=1e-5)


def test_a_call_on_a_side_stream_hands_back_finished_results(cupy):
    """Under torch.cuda.stream(side) (non-blocking) the call's last device work (the targeted maximum)
    is queued on `side`; the caller's CuPy stream waits for it, so results read right after are whole."""
    x = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(4)).cuda()
    kw = dict(iterations=2, restarts=3, targets="low:2", solver="lsqr",
              lsqr=hcrfast.LSQROptions(atol=1e-6, btol=1e-6, iter_lim=100))
    want = hcrfast.bound(mlp(torch.float32).cuda(), x, 0.05, **kw).to_numpy()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = hcrfast.bound(mlp(torch.float32).cuda(), x, 0.05, **kw)
    got = got.to_numpy()  # on CuPy's stream of this thread, not `side`
    # (not bitwise: cuBLAS may reduce in another order on another stream; a race gives stale rows)
    np.testing.assert_allclose(got.std, want.std, rtol=1e-4)
    np.testing.assert_allclose(got.std_algorithm1, want.std_algorithm1, rtol=1e-4)


@pytest.mark.parametrize("solver", ["lsqr", "krylov"])
def test_checkpointed_call_on_gpu_resumes_to_the_uninterrupted_bounds(solver, tmp_path, monkeypatch):
    """A CUDA call killed after one chunk and made again reads the chunk back (CuPy rows from host files)
    and ends with the bounds of an uninterrupted CUDA call (with the Krylov solve: and its targeted bounds)."""
    from hcrfast import algorithm

    x = torch.rand(5, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).cuda()
    kw = dict(iterations=3, restarts=3, chunk_size=2, solver=solver,
              lsqr=hcrfast.LSQROptions(atol=1e-10, btol=1e-10, iter_lim=300) if solver == "lsqr" else None,
              targets="low:2" if solver == "krylov" else None)
    whole = hcrfast.bound(mlp().cuda(), x, 0.05, **kw).to_numpy()
    real, calls = algorithm._certified_shift, []

    def certify(*args):
        if len(calls) == 1:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(algorithm, "_certified_shift", certify)
    with pytest.raises(KeyboardInterrupt):
        hcrfast.bound(mlp().cuda(), x, 0.05, checkpoint=tmp_path, **kw)
    monkeypatch.setattr(algorithm, "_certified_shift", real)
    again = hcrfast.bound(mlp().cuda(), x, 0.05, checkpoint=tmp_path, **kw)
    assert again.params["checkpoint"]["examples_read_back"] == 2
    again = again.to_numpy()
    for name in ("std", "mse", "divergence", "eps", "z"):
        np.testing.assert_allclose(getattr(again, name), getattr(whole, name), rtol=1e-9, err_msg=name)
    np.testing.assert_array_equal(again.lsqr_iterations, whole.lsqr_iterations)
    if solver == "krylov":  # the targeted bounds, read back from the chunk files into CuPy arrays
        assert again.targeted.method == "krylov"
        np.testing.assert_allclose(again.targeted.to_numpy().std, whole.targeted.to_numpy().std, rtol=1e-9)


def test_the_cpu_emulator_of_cupy_keeps_to_cupys_rules(cupy):
    """tests/_cupy_emulator.py runs the CuPy path in CI without a GPU; the rules it enforces (no implicit
    conversion, NumPy arrays refused, 0-d reductions, CuPy's names only) hold for the real CuPy too."""
    from _cupy_emulator import NAMES, check_rules

    check_rules(cupy)
    if cupy.__version__.split(".")[0] == NAMES["cupy"].split(".")[0]:
        assert not [n for n in NAMES["module"] if not hasattr(cupy, n)]
        assert not [n for n in NAMES["ndarray"] if not hasattr(cupy.ndarray, n)]
        import inspect

        for name, keywords in NAMES["keywords"]["module"].items():
            params = inspect.signature(getattr(cupy, name)).parameters
            assert set(keywords) <= set(params) or any(p.kind == p.VAR_KEYWORD for p in params.values()), name


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_rounding_guards_and_infinite_bounds_on_gpu_match_cpu(solver):
    """The D = 0 decisions on the device: certified +inf (a straight-through quantizer), and steps below
    float64's resolution of the features (sigma = 1e-13 against features of order 0.1 to 1) that bound
    nothing, with the same reasons and warnings as on the CPU."""
    import warnings

    from test_results import Quantized  # a straight-through quantizer, 4 x 4 inputs

    gen = torch.Generator().manual_seed(2)
    kw = dict(iterations=2, restarts=3, solver=solver, targets="low:2")
    for model, x, sigma in ((Quantized().eval(), torch.rand(3, 1, 4, 4, dtype=torch.float64, generator=gen), 0.1),
                            (mlp(), torch.rand(3, 1, 8, 8, dtype=torch.float64, generator=gen), 1e-13)):
        runs = []
        for device in ("cpu", "cuda"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                res = hcrfast.bound(model.to(device), x.to(device), sigma, **kw).to_numpy()
            # hcrfast's own warnings (UserWarning, RuntimeWarning), not the libraries' deprecations (on
            # the H100 image torch 2.11 emitted 18 TorchScript DeprecationWarnings on the CPU side alone)
            ours = [w for w in caught if issubclass(w.category, (UserWarning, RuntimeWarning))
                    and "site-packages" not in w.filename]
            runs.append((res, sorted(str(w.message).split(" ", 1)[1] for w in ours)))
        (cpu, cpu_warned), (gpu, gpu_warned) = runs
        np.testing.assert_array_equal(np.isinf(gpu.std), np.isinf(cpu.std))
        np.testing.assert_array_equal(gpu.std == 0, cpu.std == 0)
        assert gpu_warned == cpu_warned
        assert len(gpu.params["zero_step_reasons"]) == len(cpu.params["zero_step_reasons"])
        assert gpu.targeted.rounding == cpu.targeted.rounding
    assert np.isinf(cpu.std).sum() == 0 and np.all(cpu.std == 0)  # the last model: sigma far below resolution


def test_null_space_probes_on_gpu_certify_what_the_cpu_certifies():
    """targeted_bound's null-space probes on the device: a dead ReLU's DC mode stays +inf."""
    from test_bound import DeadBeyond

    x = torch.rand(1, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kw = dict(targets="low:2", method="dense", null_probes=True)
    cpu = hcrfast.targeted_bound(DeadBeyond(x, 0.5).eval(), x, 0.05, **kw)
    gpu = hcrfast.targeted_bound(DeadBeyond(x, 0.5).eval().cuda(), x.cuda(), 0.05, **kw).to_numpy()
    assert np.isinf(gpu.std.reshape(-1)[0]) and gpu.from_null_space.ravel()[0]
    np.testing.assert_array_equal(np.isinf(gpu.std), np.isinf(cpu.std))
    finite = np.isfinite(cpu.std) & (cpu.std > 0)
    np.testing.assert_allclose(gpu.std[finite], cpu.std[finite], rtol=1e-6)


def test_bound_command_on_cuda_matches_the_api_on_cuda(tmp_path):
    """`hcrfast bound --device cuda` moves the user's model and inputs to the GPU and gives what
    hcrfast.bound gives there (same solver: "auto" takes the Krylov basis on CUDA)."""
    from hcrfast import cli

    (tmp_path / "net.py").write_text(
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.Tanh(),\n"
        "                               torch.nn.Linear(48, 48), torch.nn.Tanh())\n")
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "x.pt")
    out = tmp_path / "run"
    assert cli.main(["bound", f"{tmp_path / 'net.py'}:make", str(tmp_path / "x.pt"), "--device", "cuda",
                     "--sigma", "0.05", "--restarts", "3", "--iterations", "3", "--no-progress", "--no-report",
                     "--out", str(out)]) == 0
    got = hcrfast.Bounds.load(out / "bounds.npz")
    assert got.params["solver"] == "krylov"
    want = hcrfast.bound(mlp(torch.float32).cuda(), x.cuda(), 0.05, restarts=3, iterations=3).to_numpy()
    np.testing.assert_allclose(got.std, want.std, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_krylov_on_gpu_gives_the_cpu_dense_solves_bounds_on_a_relu_net(dtype):
    """What "auto" takes on CUDA (the Krylov basis) against the CPU's exact solve, on the ReLU net whose
    float64 basis kept its noise step's direction before RITZ_NOISE (one example in 12 bounded nothing)."""
    import warnings

    from test_solvers_agree import square_relu

    torch.manual_seed(0)
    net = square_relu().to(dtype).eval()
    x = torch.as_tensor(np.random.default_rng(1).standard_normal((12, 1, 8, 8))).to(dtype)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(net(x))
    kw = dict(restarts=3, iterations=3)
    dense = hcrfast.bound(net, x, sigma, solver="dense", **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpu = hcrfast.bound(net.cuda(), x.cuda(), sigma, **kw)
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "bound nothing" in m or "overflow" in m], said
    assert gpu.params["solver"] == "krylov"
    assert gpu.params["krylov"]["rank_median"] == dense.params["dense"]["rank_median"]
    ratio = gpu.to_numpy().std / dense.std
    if dtype == torch.float64:
        np.testing.assert_allclose(ratio, 1.0, rtol=1e-6)
    else:
        assert np.median(ratio) == pytest.approx(1.0, abs=2e-3) and 0.9 < ratio.min() and ratio.max() < 1.1


def test_sigma_search_on_gpu_takes_the_cpu_searchs_steps():
    """float64 MLP, LSQR solved tightly: each call's statistic is the CPU's to rounding, so the search makes
    the same calls and lands on the same sigma; the bounds it returns are those of a direct CUDA call."""
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kw = dict(iterations=3, restarts=3, lsqr=hcrfast.LSQROptions(atol=1e-10, btol=1e-10, iter_lim=300))
    cpu = hcrfast.sigma_for(mlp(), x, 0.2, quantile=0.25, **kw)
    gpu = hcrfast.sigma_for(mlp().cuda(), x.cuda(), 0.2, quantile=0.25, **kw)
    assert gpu.met and len(gpu.history) == len(cpu.history)
    np.testing.assert_allclose([h["scale"] for h in gpu.history], [h["scale"] for h in cpu.history], rtol=1e-5)
    np.testing.assert_allclose(gpu.bounds.to_numpy().std, cpu.bounds.std, rtol=1e-5)
    direct = hcrfast.bound(mlp().cuda(), x.cuda(), gpu.sigma, **kw).to_numpy()
    np.testing.assert_allclose(gpu.bounds.to_numpy().std, direct.std, rtol=1e-9)


def test_sigma_search_on_gpu_reuses_the_krylov_bases_in_device_memory():
    """solver "auto" on CUDA: the Krylov basis, built by the first call and kept on the device for the later
    ones; the bounds found are a direct CUDA call's at that sigma to rounding (float64)."""
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).cuda()
    model = mlp().cuda()
    found = hcrfast.sigma_for(model, x, 0.2, iterations=3, restarts=3)
    assert found.met and len(found.history) >= 2 and found.bounds.params["solver"] == "krylov"
    assert found.bounds.params["reuse"]["examples"] == 4 and found.bounds.params["reuse"]["store_bytes"] > 0
    direct = hcrfast.bound(model, x, found.sigma, iterations=3, restarts=3).to_numpy()
    np.testing.assert_allclose(found.bounds.to_numpy().std, direct.std, rtol=1e-9)


def test_a_sweep_on_gpu_gives_the_cpu_sweep_and_the_accuracy_along_it():
    """float64 MLP: a sweep on CUDA (Krylov bases kept on the device) gives the CPU dense sweep's bounds to
    rounding, and a head's dithered accuracy at each sigma is the CPU's draw for draw (the same host
    draws; float64 scores)."""
    x = torch.rand(6, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kw = dict(iterations=3, restarts=3)
    cpu = hcrfast.sweep_sigma(mlp(), x, [0.5, 2.0], solver="dense", **kw)
    gpu = hcrfast.sweep_sigma(mlp().cuda(), x.cuda(), [0.5, 2.0], **kw)
    assert gpu.reused_examples == [0, 6] and gpu.bounds[0].params["solver"] == "krylov"
    for a, b in zip(gpu.bounds, cpu.bounds):
        np.testing.assert_allclose(a.to_numpy().std, b.std, rtol=1e-6)
    torch.manual_seed(2)
    head = torch.nn.Linear(48, 5).double().eval()
    with torch.no_grad():
        labels = head(mlp()(x)).argmax(dim=1).numpy()
    for sigma in gpu.sigmas:
        on_cpu = hcrfast.dithered_accuracy(mlp(), head, x, labels, sigma, draws=8)
        on_gpu = hcrfast.dithered_accuracy(mlp().cuda(), head.cuda(), x.cuda(), labels, sigma, draws=8)
        np.testing.assert_array_equal(on_gpu.per_draw, on_cpu.per_draw)
        head.cpu()
        # the other metrics: top-2 draw for draw, the cosine (float64 on both) to rounding
        top_cpu = hcrfast.dithered_accuracy(mlp(), head, x, labels, sigma, draws=8, metric="top2")
        top_gpu = hcrfast.dithered_accuracy(mlp().cuda(), head.cuda(), x.cuda(), labels, sigma, draws=8,
                                            metric="top2")
        np.testing.assert_array_equal(top_gpu.per_draw, top_cpu.per_draw)
        head.cpu()
        cos_cpu = hcrfast.dithered_accuracy(mlp(), None, x, None, sigma, draws=8, metric="cosine")
        cos_gpu = hcrfast.dithered_accuracy(mlp().cuda(), None, x.cuda(), None, sigma, draws=8, metric="cosine")
        np.testing.assert_allclose(cos_gpu.per_draw, cos_cpu.per_draw, rtol=1e-10)


def _assert_gpu_products_match(cupy, op, J, seed):
    """A CUDA operator's J v and Jᵀ u (CuPy in and out) against the CPU's dense (B, n, p) float64 ``J``;
    the cotangents u, for more use."""
    rng = np.random.default_rng(seed)
    v, u = rng.standard_normal((J.shape[0], J.shape[2])), rng.standard_normal(J.shape[:2])
    np.testing.assert_allclose(cupy.asnumpy(op.matvec(cupy.asarray(v))), np.einsum("bij,bj->bi", J, v),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cupy.asnumpy(op.rmatvec(cupy.asarray(u))), np.einsum("bij,bi->bj", J, u),
                               rtol=1e-10, atol=1e-12)
    return u


@pytest.mark.parametrize("lean", [True, False])
def test_lean_double_backward_products_on_gpu_match_jacrev_on_cpu(lean, cupy, monkeypatch):
    """Mode "reverse" on CUDA (cuDNN, float64) with the lean graph (convolutions and eval batch norms through
    bindings/double_backward.py) and with torch's: J v and Jᵀ u against torch.func.jacrev's J on the CPU."""
    import hcrfast.bindings.jacobian as jac
    from hcrfast.bindings import TorchJacobian

    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", lean)
    torch.manual_seed(5)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Conv2d(4, 4, 3, padding=1, groups=2), nn.BatchNorm2d(4), nn.Tanh()).double().eval()
    for bn in (net[1], net[4]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(3, 3, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    J = torch.stack([torch.func.jacrev(lambda t: net(t[None]).reshape(-1))(x[b]).reshape(-1, 300)
                     for b in range(3)]).detach().numpy()
    _assert_gpu_products_match(cupy, TorchJacobian(net.cuda(), x.cuda()), J, 7)


class _SelfAttention(torch.nn.Module):
    """q, k, v projections of the input through scaled_dot_product_attention (2 heads of 8), causal."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        return torch.tanh(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("make", [_SelfAttention, lambda: torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False)],
                         ids=["scaled-dot-product", "transformer-encoder"])
def test_lean_attention_on_gpu_matches_jacrev_on_cpu_where_torch_refuses(make, cupy, monkeypatch):
    """torch's memory-efficient attention kernel (CUDA, float32) has no double backward. Under
    lean_double_backward a scaled_dot_product_attention call keeps that kernel in its forward and
    nn.MultiheadAttention writes the attention out; J v and Jᵀ u match torch.func.jacrev's J computed on the
    CPU in float64 under the MATH backend (to float32 rounding). Without the lean graph torch's fails."""
    import hcrfast.bindings.jacobian as jac
    from hcrfast.bindings import TorchJacobian
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(8)
    net = make().eval()
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(9))
    net64 = copy.deepcopy(net).double()
    with sdpa_kernel(SDPBackend.MATH):
        J = torch.stack([torch.func.jacrev(lambda t: net64(t[None]).reshape(-1))(x[b].double()).reshape(-1, 96)
                         for b in range(3)]).detach().numpy()
    net = net.cuda()
    rng = np.random.default_rng(10)
    v, u = rng.standard_normal((3, 96)).astype(np.float32), rng.standard_normal((3, 96)).astype(np.float32)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        op = TorchJacobian(net, x.cuda())
        jv = cupy.asnumpy(op.matvec(cupy.asarray(v)))
        jtu = cupy.asnumpy(op.rmatvec(cupy.asarray(u)))
        want_jv, want_jtu = np.einsum("bij,bj->bi", J, v), np.einsum("bij,bi->bj", J, u)
        np.testing.assert_allclose(jv, want_jv, rtol=0, atol=1e-4 * np.abs(want_jv).max())
        np.testing.assert_allclose(jtu, want_jtu, rtol=0, atol=1e-4 * np.abs(want_jtu).max())
        # forward mode: torch's fused kernels have no forward AD; hcrfast's JVPs run the MATH backend
        jv = cupy.asnumpy(TorchJacobian(net, x.cuda(), mode="forward").matvec(cupy.asarray(v)))
        np.testing.assert_allclose(jv, want_jv, rtol=0, atol=1e-4 * np.abs(want_jv).max())
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
        monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", False)
        with pytest.raises(RuntimeError, match="derivative for .* is not implemented"):
            TorchJacobian(net, x.cuda()).matvec(cupy.asarray(v))


def test_rnns_on_gpu_run_without_cudnn_in_the_products_and_match_the_cpu(cupy, monkeypatch):
    """cuDNN's RNN backward refuses eval mode ("cudnn RNN backward can only be called in training mode"):
    the products and the dense solve's J run the RNN calls without cuDNN (float64 on CUDA) and match
    autograd's Jacobian on the CPU; cuDNN's flag is on again afterwards; torch's own graph fails. Reverse
    mode only: torch's fused RNN cells on CUDA have no forward AD (pytorch/pytorch#174355)."""
    import hcrfast.bindings.jacobian as jac
    from hcrfast import dense
    from hcrfast.bindings import TorchJacobian

    from test_bindings import _Recurrent  # an LSTM then a bidirectional GRU

    model = _Recurrent().double().eval()
    x = torch.randn(3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    J = torch.stack([torch.autograd.functional.jacobian(lambda t: model(t[None])[0], x[b]).reshape(-1, 24)
                     for b in range(3)]).numpy()
    model = model.cuda()
    assert torch.backends.cudnn.enabled
    u = _assert_gpu_products_match(cupy, TorchJacobian(model, x.cuda()), J, 13)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = dense.jacobian(model, x.cuda(), mode="reverse")
    np.testing.assert_allclose(got.cpu().numpy(), J, rtol=1e-10, atol=1e-12)
    # the fused cells' backward under vmap: torch's differentiable composite (create_graph), not the CUDA kernel
    # with no batching rule that vmap runs row by row ("There is a performance drop ...")
    assert not [str(w.message) for w in caught if "performance drop" in str(w.message)]
    assert torch.backends.cudnn.enabled
    res = hcrfast.bound(model, x.cuda(), 0.05, restarts=2, iterations=1, solver="lsqr")
    assert np.all(np.isfinite(res.std)) and torch.backends.cudnn.enabled

    # 41 features of 24 inputs: "auto" takes forward mode, which CUDA's fused cells refuse (reverse mode then)
    got, mode = dense.jacobian(model, x.cuda(), return_mode=True)
    np.testing.assert_allclose(got.cpu().numpy(), J, rtol=1e-10, atol=1e-12)
    res = hcrfast.bound(model, x.cuda(), 0.05, restarts=2, iterations=1, solver="dense")
    assert np.all(np.isfinite(res.std)) and torch.backends.cudnn.enabled
    assert res.params["dense"]["jacobian_products"] == (41 if mode == "reverse" else 24) + 1
    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", False)  # the control, in float32 (what cuDNN surely takes)
    with pytest.raises(RuntimeError, match="cudnn RNN backward can only be called in training mode"):
        TorchJacobian(model.float(), x.float().cuda()).rmatvec(cupy.asarray(u.astype(np.float32)))
