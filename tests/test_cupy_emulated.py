"""The CuPy path of hcrfast, run on the CPU under a strict CuPy stand-in (``_cupy_emulator``).

CI has no GPU, and ``test_gpu.py`` skips there. These tests run the same solver code with the
array namespace CuPy gives it on CUDA: every solver, option and output of ``hcrfast.bound`` must
give the CPU's bounds (the oracle: the NumPy path, itself tested against SciPy and exact
covariances) without ever converting a device array implicitly, mixing in a NumPy array, or
reading device data back where a GPU would stall; and the LSQR and Krylov loops must read the
host only at their every-k checks, counted read by read (implicit ones included).
"""
import sys

import numpy as np
import pytest
import torch

import hcrfast
from _cupy_emulator import Emulator, ndarray
from hcrfast import backend, kernels
from hcrfast.bindings import bridge


@pytest.fixture
def emulated(monkeypatch):
    """Install the emulator as ``cupy`` and route CPU tensors through it, as CUDA tensors go through CuPy."""
    emu = Emulator()
    monkeypatch.setitem(sys.modules, "cupy", emu.module)
    backend.import_cupy.cache_clear()
    backend.cuda_available.cache_clear()

    real_from_torch, real_module_for = bridge.from_torch, bridge.array_module_for

    def from_torch(t):
        if not emu.enabled:
            return real_from_torch(t)
        t = t.detach()
        return emu.wrap((t if t.is_contiguous() else t.contiguous()).numpy())  # zero-copy, as DLPack

    def array_module_for(device):
        return emu.module if emu.enabled else real_module_for(device)

    replace = [(real_from_torch, from_torch), (real_module_for, array_module_for)]
    for module in [m for name, m in sys.modules.items() if name.startswith("hcrfast")]:
        for name, value in list(vars(module).items()):
            for real, fake in replace:
                if value is real:  # every module that imported the bridge's function by name
                    monkeypatch.setattr(module, name, fake)
    yield emu
    backend.import_cupy.cache_clear()
    backend.cuda_available.cache_clear()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.Tanh(),
                               torch.nn.Linear(48, 48), torch.nn.Tanh()).double().eval()


def batch(b=4):
    return torch.rand(b, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def assert_same_bounds(got, want):
    assert isinstance(got.std, ndarray), "the device path must return device arrays"
    got = got.to_numpy()
    for name in ("std", "mse", "divergence", "best_restart", "eps", "z"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-12, atol=1e-300, err_msg=name)
    assert got.infinite_reasons == want.infinite_reasons
    assert got.params["solver"] == want.params["solver"]
    if want.targeted is not None:
        np.testing.assert_allclose(got.targeted.std, want.targeted.std, rtol=1e-12)
        np.testing.assert_array_equal(got.std_algorithm1, want.std_algorithm1)


def test_emulator_keeps_cupys_rules(emulated):
    """The rules the tests below rely on (the same checks run against the real CuPy in test_gpu.py)."""
    from _cupy_emulator import check_rules

    check_rules(emulated.module, reads=emulated.reads)


CASES = {
    "lsqr": dict(solver="lsqr"),
    "dense": dict(solver="dense"),
    "krylov": dict(solver="krylov"),
    "lsqr-targets": dict(solver="lsqr", targets="low:4"),
    "dense-targets": dict(solver="dense", targets="low:4"),
    "krylov-2-pilots-targets": dict(solver="krylov", krylov_pilots=2, targets="all"),
    "current-cold-forward": dict(solver="lsqr", linearize_at="current", warm_start=False, jacobian="forward"),
    "pixel-uncertified": dict(solver="lsqr", basis="pixel", certify=False),
    "laplace": dict(solver="lsqr", noise=hcrfast.Laplace(0.05)),
    "monte-carlo": dict(solver="dense", noise=hcrfast.MonteCarlo(
        lambda z: -np.abs(z) / 0.05 - np.log(0.1), lambda rng, shape: rng.laplace(0, 0.05, shape))),
    "chunks-of-3": dict(solver="krylov", chunk_size=3),
    "per-feature-sigma-targets": dict(solver="dense", targets="low:2", noise=np.linspace(0.03, 0.08, 48)),
    "dense-singular-steps": dict(solver="dense", singular_steps=5),
    "krylov-2-pilots-singular-steps": dict(solver="krylov", krylov_pilots=2, singular_steps=5, chunk_size=3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bound_on_the_cupy_path_gives_the_cpu_bounds(case, emulated):
    kw = dict(CASES[case])
    noise = kw.pop("noise", 0.05)
    x = batch(5)
    with emulated.off():
        want = hcrfast.bound(mlp(), x, noise, iterations=3, restarts=3, **kw)
    got = hcrfast.bound(mlp(), x, noise, iterations=3, restarts=3, **kw)
    assert_same_bounds(got, want)


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_singular_steps_past_the_rank_skip_their_passes_on_the_cupy_path(solver, emulated):
    """J of rank <= 6 behind a 6-unit layer, 12 singular steps asked for: the rows past the rank (steps of
    0) are left out of the certification by index on the device, and the bounds are the CPU's."""
    def narrow():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 6), torch.nn.Tanh(),
                                   torch.nn.Linear(6, 48), torch.nn.Tanh()).double().eval()

    x = batch(3)
    kw = dict(iterations=2, restarts=2, solver=solver, singular_steps=12)
    with emulated.off():
        want = hcrfast.bound(narrow(), x, 0.05, **kw)
    got = hcrfast.bound(narrow(), x, 0.05, **kw)
    assert_same_bounds(got, want)


class FrozenFeatures(torch.nn.Module):
    """Features that do not move although the Jacobian says they do (as in test_bound.py): D = 0."""

    def forward(self, x):
        flat = x.flatten(1)
        return (flat - flat.detach()) + 1.0


@pytest.mark.parametrize("solver", ["lsqr", "dense", "krylov"])
def test_zero_divergence_on_the_cupy_path(solver, emulated):
    """D = 0: the +inf bounds and their reasons, Algorithm 1's and the targeted ones, come out of the device too."""
    x = batch(3)
    kw = dict(iterations=2, restarts=2, solver=solver, targets=None if solver == "lsqr" else "low:2")
    with emulated.off():
        want = hcrfast.bound(FrozenFeatures().eval(), x, 0.05, **kw)
    got = hcrfast.bound(FrozenFeatures().eval(), x, 0.05, **kw)
    assert np.isinf(want.std).any() and want.infinite_reasons
    assert_same_bounds(got, want)
    if want.targeted is not None:
        assert got.targeted.infinite_reasons == want.targeted.infinite_reasons


def test_device_results_summarize_save_and_load(emulated, tmp_path):
    """summary(), save() and load() work from device results, and save/load round-trips them."""
    res = hcrfast.bound(mlp(), batch(3), 0.05, iterations=2, restarts=2, solver="krylov", targets="low:2")
    assert "median" in res.summary()
    res.save(tmp_path / "b.npz")
    back = hcrfast.Bounds.load(tmp_path / "b.npz")
    np.testing.assert_array_equal(back.std, res.std.get())
    np.testing.assert_array_equal(back.targeted.std, res.targeted.std.get())
    assert back == res and res == res.to_numpy()     # == reads device arrays back to compare


def test_checkpoint_resume_on_the_cupy_path(emulated, tmp_path, monkeypatch):
    """Rows written from the device and read back into device arrays give the uninterrupted bounds."""
    from hcrfast.checkpoint import Checkpoint

    kw = dict(iterations=2, restarts=2, chunk_size=2, solver="krylov", targets="low:2")
    want = hcrfast.bound(mlp(), batch(5), 0.05, **kw).to_numpy()
    saves = []

    save = Checkpoint.save

    def crash_after_two(self, start, stop, **arrays):
        save(self, start, stop, **arrays)
        saves.append(start)
        if len(saves) == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(Checkpoint, "save", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        hcrfast.bound(mlp(), batch(5), 0.05, checkpoint=tmp_path, **kw)
    monkeypatch.setattr(Checkpoint, "save", save)
    got = hcrfast.bound(mlp(), batch(5), 0.05, checkpoint=tmp_path, **kw)
    assert got.params["checkpoint"]["examples_read_back"] == 4
    assert_same_bounds(got, want)


#: The attack stops at a relative step or residual decrease of tol = 1e-10 (float64), with LSQR's atol = btol =
#: 1e-10 inside: two paths whose arithmetic differs in the last bit (NumPy 1.x and 2.0 against the device path)
#: stop within a few tol of each other (measured 6.3e-10 with NumPy 1.25, 1.7e-10 with 2.0; bit-equal on 2.4).
ATTACK_RTOL = 2e-9


def test_targeted_bound_and_attack_on_the_cupy_path(emulated):
    x = batch(3)
    with emulated.off():
        want_t = hcrfast.targeted_bound(mlp(), x, 0.05, targets="low:3")
        want_a = hcrfast.gauss_newton_attack(mlp(), x, 0.05, draws=2)
    got_t = hcrfast.targeted_bound(mlp(), x, 0.05, targets="low:3")
    got_a = hcrfast.gauss_newton_attack(mlp(), x, 0.05, draws=2)
    np.testing.assert_allclose(got_t.to_numpy().std, want_t.std, rtol=1e-12)
    np.testing.assert_allclose(got_a.to_numpy().rmse, want_a.rmse, rtol=ATTACK_RTOL)


@pytest.mark.parametrize("method", ["dense", "lsqr"])
def test_targeted_bound_checkpoint_on_the_cupy_path(method, emulated, tmp_path):
    """targeted_bound's pieces, written from device arrays and read back into them, give the CPU's bounds."""
    x, kw = batch(5), dict(targets="low:2", method=method, chunk_size=8)  # 4 modes: pieces of 2 examples
    with emulated.off():
        want = hcrfast.targeted_bound(mlp(), x, 0.05, **kw)
    first = hcrfast.targeted_bound(mlp(), x, 0.05, checkpoint=tmp_path, **kw)
    again = hcrfast.targeted_bound(mlp(), x, 0.05, checkpoint=tmp_path, **kw)
    assert again.params["checkpoint"]["examples_read_back"] == 5
    for got in (first, again):
        assert isinstance(got.std, emulated.module.ndarray)
        np.testing.assert_allclose(got.to_numpy().std, want.std, rtol=1e-9)
        assert got.infinite_reasons == want.infinite_reasons


@pytest.mark.parametrize("name", ["row_norms", "row_normalize", "lsqr_update_xw", "restart_update", "dct2", "idct2"])
def test_kernel_twins_on_device_arrays_match_numpy(name, emulated):
    rng = np.random.default_rng(3)
    if name in ("row_norms", "row_normalize"):
        args = (rng.standard_normal((7, 30)),)
    elif name == "lsqr_update_xw":
        args = tuple(rng.standard_normal((7, 30)) for _ in range(3)) + (rng.standard_normal(7), rng.standard_normal(7))
    elif name == "restart_update":
        args = (rng.standard_normal((7, 30)), rng.standard_normal((7, 30)), np.full(7, 0.5))
    else:
        args = (rng.standard_normal((2, 3, 28, 32)),)
    want = getattr(kernels, name)(*[a.copy() for a in args])
    got = getattr(kernels, name)(*[emulated.module.asarray(a) for a in args])
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert isinstance(g, ndarray)
        np.testing.assert_allclose(g.get(), w, rtol=1e-13, atol=1e-15)


def test_lsqr_loop_reads_the_host_only_at_its_checks(emulated):
    """40 LSQR steps checked every 10: five reads of the active mask, no other read of any kind, and no copy
    to the device but the two index arrays that scatter the finished rows at the last check."""
    from hcrfast.bindings import TorchJacobian
    from hcrfast.lsqr import lsqr

    model, x = mlp(), batch(16)
    b = emulated.module.asarray(np.random.default_rng(0).standard_normal((16, 48)))
    emulated.reads.clear()
    emulated.writes = 0
    res = lsqr(TorchJacobian(model, x), b, atol=0, btol=0, conlim=0, iter_lim=40, check_every=10)
    reads, writes = list(emulated.reads), emulated.writes
    assert int(res.itn.max()) == 40
    assert reads == ["get"] * (40 // 10 + 1)
    assert writes == 2


def test_krylov_build_reads_the_host_only_at_its_checks(emulated, monkeypatch):
    """The basis' 40 steps checked every 10: per check the active mask and the one-pass check's mask, then
    the steps and stop codes once; the factorization after the loop copies α, β on purpose (not counted)."""
    from hcrfast import krylov
    from hcrfast.bindings import TorchJacobian

    real_factors, inside = krylov._factors, []

    def factors(*args, **kwargs):
        inside.append(len(emulated.reads))
        return real_factors(*args, **kwargs)
    monkeypatch.setattr(krylov, "_factors", factors)
    b = emulated.module.asarray(np.random.default_rng(0).standard_normal((16, 48)))
    emulated.reads.clear()
    basis = krylov.build(TorchJacobian(mlp(), batch(16)), b, iter_lim=40, check_every=10)
    assert np.all(basis.steps == 40) and basis.redone.sum() == 0
    checks = 40 // 10 + 1
    assert inside and emulated.reads[:inside[0]] == ["get"] * (checks + (checks - 1) + 2)


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_exact_solves_read_the_host_no_more_for_more_restarts_and_steps(solver, emulated):
    """The dense and Krylov solves take every restart's i steps on the device: R × i more steps add no host read."""
    counts = []
    for restarts, iterations in ((2, 2), (5, 6)):
        emulated.reads.clear()
        hcrfast.bound(mlp(), batch(3), 0.05, iterations=iterations, restarts=restarts, solver=solver)
        counts.append(len(emulated.reads))
    assert counts[0] == counts[1], counts


def test_device_arrays_reach_torch_through_dlpack_without_a_copy(emulated):
    """to_torch takes CuPy arrays through DLPack (torch.from_dlpack): the tensor shares the array's memory."""
    from hcrfast.bindings import to_torch

    a = emulated.module.asarray(np.arange(12.0).reshape(3, 4))
    t = to_torch(a)
    assert t.data_ptr() == a.data.ptr and t.shape == (3, 4)
    t[1, 2] = -1.0
    assert float(a[1, 2]) == -1.0


def test_attack_checkpoint_on_the_cupy_path(emulated, tmp_path):
    x = batch(3)
    with emulated.off():
        want = hcrfast.gauss_newton_attack(mlp(), x, 0.05, draws=2, chunk_size=2)
    first = hcrfast.gauss_newton_attack(mlp(), x, 0.05, draws=2, chunk_size=2, checkpoint=tmp_path)
    again = hcrfast.gauss_newton_attack(mlp(), x, 0.05, draws=2, chunk_size=2, checkpoint=tmp_path)
    assert again.params["checkpoint"]["examples_read_back"] == 3
    for got in (first, again):
        assert isinstance(got.rmse, emulated.module.ndarray)
        np.testing.assert_allclose(got.to_numpy().rmse, want.rmse, rtol=ATTACK_RTOL)


def test_a_krylov_basis_step_runs_few_array_operations(emulated, monkeypatch):
    """Each array operation of a basis step is a kernel launch on a GPU, paid in host time: the H100
    profile of the MNIST target (2026-11-27) counted ~250 per step and a GPU idle 95% of the time. The
    step without a tolerance runs the bidiagonalization alone: counted here (the stand-in's CuPy
    operations and torch's aten dispatches, per step between an 8- and a 32-step basis), 114.5, where
    LSQR's full step ran 288.5; 105.4 since the step limit is told on the host (it is the same step for
    every active problem), the scales' update is 2 operations and a block's rollback point copies u
    and v only."""
    import dataclasses

    from torch.utils._python_dispatch import TorchDispatchMode

    import _cupy_emulator
    from hcrfast import krylov

    count = {"ops": 0}

    class Aten(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count["ops"] += 1
            return func(*args, **(kwargs or {}))

    for owner, name in ((_cupy_emulator.ndarray, "__array_ufunc__"), (_cupy_emulator.Emulator, "call")):
        real = getattr(owner, name)

        def counted(self, *args, _real=real, **kwargs):
            count["ops"] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(owner, name, counted)
    ops = {}
    for steps in (8, 32):
        count["ops"] = 0
        with Aten():
            hcrfast.bound(mlp(), batch(4), 0.05, restarts=2, iterations=1, solver="krylov", singular_steps=0,
                          lsqr=dataclasses.replace(krylov.DEFAULT_OPTIONS, iter_lim=steps))
        ops[steps] = count["ops"]
    per_step = (ops[32] - ops[8]) / 24
    # The count depends on torch's dispatches and the NumPy version (cause not pinned): measured 120.1 with torch 2.8
    # and NumPy 2.0, 127.4 with torch 2.8 and NumPy 1.25, <= 107 with torch 2.14 under either NumPy.
    torch_version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    assert 60 < per_step <= (107 if torch_version >= (2, 14) else 128), per_step


def test_gram_eigendecompositions_on_the_cupy_path(emulated, monkeypatch):
    """kernels.symmetric's impl="cupy" (cupy.linalg.eigh of the batch; syevjBatched on a GPU) on device
    arrays: NumPy's eigenpairs of each matrix's leading block, ascending, eigenvectors that pass the
    check (no matrix sent back to the host, no warning), and the results are torch tensors."""
    import warnings

    from hcrfast.kernels import symmetric

    rng = np.random.default_rng(5)
    J = rng.standard_normal((4, 20, 30))
    A = J @ J.transpose(0, 2, 1)
    orders = np.array([20, 13, 0, 19])
    calls, real = [], emulated.module.linalg.eigh
    monkeypatch.setattr(emulated.module.linalg, "eigh", lambda a, **kw: calls.append((a.shape, kw)) or real(a, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w, V = symmetric.eigh_batch(torch.as_tensor(A), orders, impl="cupy")
    assert calls == [((4, 20, 20), {"UPLO": "L"})]          # one batched call, on device arrays
    assert isinstance(w, torch.Tensor) and isinstance(V, torch.Tensor)
    w, V = w.numpy(), V.numpy()
    for a, n in enumerate(orders):
        block = np.zeros_like(A[a])
        block[:n, :n] = A[a, :n, :n]
        np.testing.assert_allclose(w[a], np.linalg.eigvalsh(block), atol=1e-12 * np.abs(A).max())
        np.testing.assert_allclose(V[a] @ np.diag(w[a]) @ V[a].T, block, atol=1e-11 * np.abs(A).max())


def test_a_failed_device_eigendecomposition_is_redone_on_the_host_and_said_where_it_was_asked(emulated, monkeypatch):
    """syevjBatched's known failure (the diagonal as eigenvalues, the identity as eigenvectors) on one
    matrix of a batch: the check catches it, LAPACK redoes that matrix, and the warning points at the
    caller of eigh_batch (this file), not at hcrfast's internals."""
    from hcrfast.kernels import symmetric

    rng = np.random.default_rng(9)
    J = rng.standard_normal((3, 7, 12))
    A = J @ J.transpose(0, 2, 1)
    real = emulated.module.linalg.eigh

    def fails_on_matrix_1(a, **kw):
        w, V = real(a, **kw)
        w[1] = emulated.module.sort(emulated.module.diagonal(a[1]))
        V[1] = emulated.module.eye(7)
        return w, V

    monkeypatch.setattr(emulated.module.linalg, "eigh", fails_on_matrix_1)
    with pytest.warns(RuntimeWarning, match=r"1 of 3 decompositions failed the check .* matrix 1") as caught:
        w, V = symmetric.eigh_batch(torch.as_tensor(A), impl="cupy")
    assert caught[0].filename == __file__
    for a in range(3):
        np.testing.assert_allclose(w[a].numpy(), np.linalg.eigvalsh(A[a]), rtol=1e-12)
        np.testing.assert_allclose(A[a] @ V[a].numpy(), V[a].numpy() * w[a].numpy(), atol=1e-12 * np.abs(A).max())


def test_tridiagonal_eigendecompositions_on_the_device_path(emulated):
    """kernels.tridiagonal's device path (impl="cupy": the tridiagonal matrices written out dense, one
    batched eigh; on a GPU syevjBatched) against the host's LAPACK (impl="lapack"): the same descending
    eigenvalues, ranks, and kept eigenvectors up to sign, zero past each row's rank and k; the
    eigenvectors stay torch tensors, the eigenvalues come back as NumPy arrays. (The stand-in's eigensolver
    is NumPy's, on a tridiagonal matrix dstevd's own algorithm: this tests the plumbing, the ordering,
    ranks and masks; the real routines' accuracy is tests/test_gpu.py's.)"""
    from hcrfast.kernels import tridiagonal

    rng = np.random.default_rng(11)
    g, K = 5, 30
    diag, off = rng.random((g, K)) + 0.5, rng.random((g, K)) * 0.3
    off[2, 10] = 0.0                                     # a split matrix
    diag[3, 20:] = 1e-30                                 # tiny tail: cut by the rank
    off[3, 19:] = 0.0
    ks = np.array([30, 1, 17, 30, 0])
    want_lam, want_Y, want_ranks = tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-6, impl="lapack")
    lam, Y, ranks = tridiagonal.eigh_tridiagonal_device(torch.as_tensor(diag), torch.as_tensor(off), ks,
                                                        rtol=1e-6, impl="cupy")
    assert isinstance(lam, np.ndarray) and isinstance(ranks, np.ndarray) and isinstance(Y, torch.Tensor)
    np.testing.assert_array_equal(ranks, want_ranks)
    assert ranks[3] == 20 and ranks[4] == 0
    np.testing.assert_allclose(lam, want_lam, rtol=1e-12, atol=1e-14)
    r = int(ranks.max())
    assert Y.shape == (g, r, K)
    Y = Y.numpy()
    for a, (k, rank) in enumerate(zip(ks, ranks)):
        assert not Y[a, rank:].any() and not Y[a, :, k:].any()
        signs = np.sign((Y[a, :rank] * want_Y[a, :rank]).sum(axis=1))
        np.testing.assert_allclose(Y[a, :rank] * signs[:, None], want_Y[a, :rank], atol=1e-10)


def test_tridiagonal_device_eigenvectors_cut_below_k_hold_only_their_rows(emulated):
    """Where every row's rank is below K the kept eigenvectors (g, r, K) are their own storage: the basis
    keeps them for its lifetime, and a view of the (g, K, K) buffer held all of it (and the memory count
    of a reused factorization, numel × itemsize, missed K − r rows a matrix)."""
    from hcrfast.kernels import tridiagonal

    rng = np.random.default_rng(12)
    g, K = 3, 24
    diag, off = rng.random((g, K)) + 0.5, rng.random((g, K)) * 0.3
    ks = np.array([24, 24, 10])
    diag[:, 16:], off[:, 15:] = 1e-30, 0.0                # ranks 16, 16, 10
    lam, Y, ranks = tridiagonal.eigh_tridiagonal_device(torch.as_tensor(diag), torch.as_tensor(off), ks,
                                                        rtol=1e-6, impl="cupy")
    np.testing.assert_array_equal(ranks, [16, 16, 10])
    assert Y.shape == (g, 16, K) and Y.is_contiguous()
    assert Y.untyped_storage().nbytes() == Y.numel() * Y.element_size()
    want_lam, want_Y, _ = tridiagonal.eigh_tridiagonal_batch(diag, off, ks, rtol=1e-6, impl="lapack")
    for a, rank in enumerate(ranks):
        signs = np.sign((Y[a, :rank].numpy() * want_Y[a, :rank]).sum(axis=1))
        np.testing.assert_allclose(Y[a, :rank].numpy() * signs[:, None], want_Y[a, :rank], atol=1e-10)


def test_krylov_bounds_with_the_basis_factored_on_the_device(emulated, monkeypatch):
    """solver="krylov" with krylov.EIG_IMPL = "cupy": a float32 basis' B_kᵀB_k decomposed on the device
    (no host LAPACK called) gives the host's ranks and bounds; a float64 basis, whose rank cut lies
    below a dense eigensolver's accuracy, stays on the host, with a warning that says why. (Under the
    stand-in the device's eigensolver is NumPy's, which on a tridiagonal matrix is dstevd's algorithm:
    this tests the plumbing; tests/test_gpu.py the real routines.)"""
    from hcrfast import krylov
    from hcrfast.kernels import tridiagonal

    x = batch(4)
    net32, x32 = mlp().float(), x.float()
    with emulated.off():
        want = hcrfast.bound(net32, x32, 0.05, iterations=3, restarts=3, solver="krylov")
    monkeypatch.setattr(krylov, "EIG_IMPL", "cupy")
    host, real = [], tridiagonal.eigh_tridiagonal_batch
    monkeypatch.setattr(tridiagonal, "eigh_tridiagonal_batch", lambda *a, **k: host.append(1) or real(*a, **k))
    got = hcrfast.bound(net32, x32, 0.05, iterations=3, restarts=3, solver="krylov")
    assert not host
    assert got.params["krylov"]["rank_min"] == want.params["krylov"]["rank_min"]
    np.testing.assert_allclose(got.to_numpy().std, want.std, rtol=1e-5)
    with pytest.warns(RuntimeWarning, match="below what a dense eigensolver on the device resolves"):
        hcrfast.bound(mlp(), x, 0.05, iterations=1, restarts=1, solver="krylov")
    assert host


def test_tridiagonal_device_path_in_blocks_gives_what_one_block_gives(emulated, monkeypatch):
    """Decomposed in blocks of a few matrices (symmetric.DEVICE_BATCH_VALUES), the device path returns
    what one block gives: the blocks' kept eigenvectors put together at the largest rank."""
    from hcrfast.kernels import symmetric, tridiagonal

    rng = np.random.default_rng(12)
    diag, off = torch.as_tensor(rng.random((7, 20)) + 0.5), torch.as_tensor(rng.random((7, 20)) * 0.3)
    diag[4, 8:] = 1e-30
    off[4, 7:] = 0.0
    ks = np.array([20, 5, 12, 20, 20, 1, 16])
    one = tridiagonal.eigh_tridiagonal_device(diag, off, ks, rtol=1e-6, impl="cupy")
    monkeypatch.setattr(symmetric, "DEVICE_BATCH_VALUES", 4 * 3 * 20 * 20)   # blocks (a quarter) of 3, 3, 1
    calls, real = [], emulated.module.linalg.eigh
    monkeypatch.setattr(emulated.module.linalg, "eigh", lambda a, **kw: calls.append(a.shape[0]) or real(a, **kw))
    blocks = tridiagonal.eigh_tridiagonal_device(diag, off, ks, rtol=1e-6, impl="cupy")
    assert calls == [3, 3, 1]
    np.testing.assert_array_equal(blocks[2], one[2])
    np.testing.assert_array_equal(blocks[0], one[0])
    assert blocks[1].shape == one[1].shape == (7, 20, 20)
    np.testing.assert_array_equal(blocks[1].numpy(), one[1].numpy())


def test_a_cupy_batch_refused_as_invalid_is_split_and_finished(emulated, monkeypatch):
    """CuPy sizes syevjBatched's workspace in a 32-bit int, which a large batch overflows (cupy/cupy#7261:
    CUSOLVER_STATUS_INVALID_VALUE). impl="cupy" then halves the matrices per call until the calls go
    through, as "cusolver" does on its size query, and gives every matrix its eigenpairs; an error of
    another kind, or one matrix refused alone, still propagates."""
    from hcrfast.kernels import symmetric

    class CUSOLVERError(RuntimeError):  # as cupy_backends' own: the status kept, named in the message
        def __init__(self, status):
            self.status = status
            super().__init__("CUSOLVER_STATUS_INVALID_VALUE" if status == 3 else f"status {status}")

    rng = np.random.default_rng(3)
    J = rng.standard_normal((7, 6, 9))
    A = J @ J.transpose(0, 2, 1)
    monkeypatch.setattr(symmetric, "DEVICE_BATCH_MATRICES", 8)
    real, sizes = emulated.module.linalg.eigh, []

    def refuses_more_than_2(a, **kw):
        sizes.append(a.shape[0])
        if a.shape[0] > 2:
            raise CUSOLVERError(3)
        return real(a, **kw)

    monkeypatch.setattr(emulated.module.linalg, "eigh", refuses_more_than_2)
    w, V = symmetric.eigh_batch(torch.as_tensor(A), impl="cupy")
    assert sizes == [7, 3] + [1] * 7       # 7 refused, 3 refused (halved), then the rest a matrix a call
    for a in range(7):
        np.testing.assert_allclose(w[a].numpy(), np.linalg.eigvalsh(A[a]), rtol=1e-10)
        np.testing.assert_allclose(A[a] @ V[a].numpy(), V[a].numpy() * w[a].numpy(), atol=1e-10 * np.abs(A).max())

    monkeypatch.setattr(emulated.module.linalg, "eigh", lambda a, **kw: (_ for _ in ()).throw(CUSOLVERError(3)))
    with pytest.raises(CUSOLVERError):          # one matrix refused alone: nothing left to split
        symmetric.eigh_batch(torch.as_tensor(A[:1]), impl="cupy")
    monkeypatch.setattr(emulated.module.linalg, "eigh", lambda a, **kw: (_ for _ in ()).throw(CUSOLVERError(7)))
    with pytest.raises(CUSOLVERError, match="status 7"):
        symmetric.eigh_batch(torch.as_tensor(A), impl="cupy")


def test_order_zero_matrices_on_the_cupy_path(emulated):
    """A batch of 0 × 0 matrices: empty eigenpairs, not a reduction over an empty axis in the check."""
    from hcrfast.kernels import symmetric

    w, V = symmetric.eigh_batch(torch.zeros((3, 0, 0), dtype=torch.float64), impl="cupy")
    assert tuple(w.shape) == (3, 0) and tuple(V.shape) == (3, 0, 0)


def test_arguments_given_as_cupy_arrays_are_read_once_to_the_host(emulated):
    """A GPU user's σ (one, or one per feature), example ids and target mask as CuPy arrays: read to the host
    on purpose, as torch tensors are, with the result of the same NumPy arguments (they were refused as
    'got ndarray' or by CuPy's 'Implicit conversion to a NumPy array is not allowed')."""
    cp = emulated.module
    stds = np.linspace(0.03, 0.08, 48)
    mask = np.zeros((1, 8, 8), dtype=bool)
    mask[0, :2, :3] = True
    kw = dict(iterations=1, restarts=2, solver="dense")
    for host, device in [(dict(sigma=stds), dict(sigma=cp.asarray(stds))),
                         (dict(sigma=0.05), dict(sigma=cp.asarray(0.05))),
                         (dict(sigma=hcrfast.Gaussian(0.05)), dict(sigma=hcrfast.Gaussian(cp.asarray(0.05)))),
                         (dict(sigma=0.05, example_ids=np.array([5, 9])),
                          dict(sigma=0.05, example_ids=cp.asarray(np.array([5, 9])))),
                         (dict(sigma=0.05, targets=mask), dict(sigma=0.05, targets=cp.asarray(mask)))]:
        want = hcrfast.bound(mlp(), batch(2), **host, **kw).to_numpy()
        got = hcrfast.bound(mlp(), batch(2), **device, **kw).to_numpy()
        np.testing.assert_array_equal(got.std, want.std)
        assert got.params["noise"] == want.params["noise"]
    with pytest.raises(TypeError, match="sigma must be one number, got 48 values; one std per feature is for "
                                        "Gaussian noise only"):
        hcrfast.Gaussian(cp.asarray(stds))


def test_a_sigma_on_the_meta_device_is_named():
    """A meta tensor holds no values: refused by name, not with torch's 'Tensor.item() cannot be called on
    meta tensors'."""
    for sigma in (torch.tensor(0.1, device="meta"), torch.full((48,), 0.1, device="meta")):
        with pytest.raises(TypeError, match="sigma is a tensor on the meta device, which holds no values"):
            hcrfast.bound(mlp(), batch(2), sigma, iterations=1, restarts=1)
