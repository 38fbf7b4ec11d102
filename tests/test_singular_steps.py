"""bound(singular_steps=K): steps along J's K smallest singular directions, certified like Algorithm 1's, each
bounding every mode it moves. Oracles: NumPy's SVD of W (linear models, closed form) or of torch.func's J, the
test's own float64 forward passes and SciPy's DCT."""
import warnings

import numpy as np
import pytest
import scipy.fft
import torch
from test_bound import linear_model, matrix_with_condition

import hcrfast
from hcrfast import dense, krylov


def coords(eps, shape, basis="dct"):
    """|mode coordinates| of the steps (rows), by SciPy's orthonormal DCT-II over the last two axes."""
    e = np.asarray(eps).reshape((-1,) + tuple(shape))
    c = scipy.fft.dctn(e, axes=(-2, -1), norm="ortho") if basis == "dct" else e
    return np.abs(c.reshape(len(e), -1))


def singular_oracle(model64, x, K, sigma, size, signs=(1.0,)):
    """Per example (B, p): max over J's K smallest singular directions v_i (NumPy's SVD of torch.func's J,
    above 1e-12 of the largest) of |Q ε|/sqrt(D), ε = ±v_i·size·σ/s_i and D from this test's own float64
    passes; with several signs, the (lowest, highest) over them, as (B, p) arrays."""
    B = x.shape[0]
    shape = tuple(x.shape[1:])
    p = int(np.prod(shape))
    lo, hi = np.zeros((B, p)), np.zeros((B, p))
    for b in range(B):
        xb = x[b:b + 1].double()
        J = torch.func.jacrev(lambda t: model64(t).reshape(-1))(xb).reshape(-1, p).detach().numpy()
        _, s, vt = np.linalg.svd(J, full_matrices=False)
        keep = s > s[0] * 1e-12
        s, vt = s[keep][::-1][:K], vt[keep][::-1][:K]
        with torch.no_grad():
            a0 = model64(xb).reshape(-1)
        per_sign = []
        for sign in signs:
            e = sign * vt * (size * sigma / s)[:, None]
            with torch.no_grad():
                z = model64(xb + torch.as_tensor(e).reshape((len(e),) + shape)).reshape(len(e), -1) - a0
            d = np.expm1((z.numpy() ** 2).sum(axis=1) / sigma**2)
            per_sign.append(coords(e, shape) / np.sqrt(d)[:, None])
        both = np.stack(per_sign)                       # (signs, K, p)
        lo[b] = both.min(axis=0).max(axis=0)
        hi[b] = both.max(axis=0).max(axis=0)
    return lo, hi


@pytest.mark.parametrize("solver", ["dense", "krylov"])
@pytest.mark.parametrize("n", [40, 18])  # more features than inputs, and fewer (a null space)
def test_linear_models_get_the_closed_form_of_each_singular_step(solver, n):
    """a(θ) = Wθ + b: the step along v_i (scaled to ‖W ε‖ = sσ) bounds mode j by
    |(Q v_i)_j|·sσ/s_i / sqrt(expm1(s²)); the result is the max of that and Algorithm 1's."""
    rng = np.random.default_rng(n)
    shape, p, B, K, sigma, size = (2, 3, 4), 24, 3, 5, 0.7, 1 / 200
    W = matrix_with_condition(rng, n, p, 1e3) if n >= p else matrix_with_condition(rng, p, n, 1e3).T
    model = linear_model(W, rng.standard_normal(n), shape)
    x = torch.as_tensor(rng.standard_normal((B,) + shape))
    kw = dict(restarts=3, iterations=3, solver=solver, size=size)
    base = hcrfast.bound(model, x, sigma, singular_steps=0, **kw).std.reshape(B, -1)
    res = hcrfast.bound(model, x, sigma, singular_steps=K, **kw)
    _, s, vt = np.linalg.svd(W)
    s, vt = s[::-1][:K], vt[:len(s)][::-1][:K]
    closed = (coords(vt, shape) * (size * sigma / s)[:, None]).max(axis=0) / np.sqrt(np.expm1(size**2))
    np.testing.assert_allclose(res.std.reshape(B, -1), np.maximum(base, closed[None]), rtol=1e-7)
    assert res.params["singular_steps"]["count"] == K and res.params["singular_steps"]["examples"] == B
    assert res.params["singular_steps"]["modes_lifted"] == int((closed[None] > base * (1 + 1e-9)).sum())


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_a_relu_model_gets_what_its_own_forward_passes_certify(solver):
    """Float32 ReLU MLP: every mode's bound is the max of Algorithm 1's and the singular steps' certified
    by the test (float64 copy, both signs of each singular vector, which SVD leaves open; the engine's
    vectors are of its float32 J, 1e-4 apart), and at least one singular step raises some mode."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 90), torch.nn.ReLU(),
                                torch.nn.Linear(90, 70)).eval()
    x = torch.randn(2, 1, 8, 8)
    sigma = hcrfast.rms_sigma(model(x).detach(), 1.0)
    kw = dict(restarts=3, iterations=2, solver=solver)
    base = hcrfast.bound(model, x, sigma, singular_steps=0, **kw).std.reshape(2, -1)
    got = hcrfast.bound(model, x, sigma, singular_steps=6, **kw).std.reshape(2, -1)
    model64 = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 90), torch.nn.ReLU(),
                                  torch.nn.Linear(90, 70)).double().eval()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    lo, hi = singular_oracle(model64, x, 6, sigma, 1 / 200, signs=(1.0, -1.0))
    assert np.all(got >= base) and np.any(got > base * 1.01)
    # each direction is certified with both signs: the max over them (hi), whatever sign the SVD took
    np.testing.assert_allclose(got, np.maximum(base, hi), rtol=1e-4)
    # uncertified float32 passes (certify=False): the same steps, their shifts rounded at 1e-7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the uncertified-bounds warning
        loose = hcrfast.bound(model, x, sigma, singular_steps=6, certify=False, **kw).std.reshape(2, -1)
        loose0 = hcrfast.bound(model, x, sigma, certify=False, singular_steps=0, **kw).std.reshape(2, -1)
    assert np.all(loose >= loose0)
    np.testing.assert_allclose(loose, got, rtol=1e-2)


def test_the_bounds_do_not_depend_on_the_sign_each_eigensolver_gives_a_singular_vector(monkeypatch):
    """LAPACK's and torch's eigensolvers return J's singular vectors with their own signs; on a ReLU MLP,
    +v and -v shift the features differently (so one sign alone gave medians 12% apart on the race's
    MLP). Both signs are certified, so the drivers' bounds agree to rounding, and a direction's values
    are ‖J v‖ computed from J (SciPy's SVD of J the oracle)."""
    import scipy.linalg

    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.ReLU(),
                                torch.nn.Linear(48, 40)).double().eval()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    sigma = hcrfast.rms_sigma(model(x).detach(), 1.0)
    got = {}
    for impl in ("lapack", "torch"):
        monkeypatch.setattr(dense, "EIGH_IMPL", impl)
        got[impl] = hcrfast.bound(model, x, sigma, restarts=2, iterations=2, solver="dense", singular_steps=8).std
        J = torch.func.jacrev(lambda t: model(t[None]).reshape(-1))(x[0]).reshape(1, 40, 64).detach()
        m = dense.min_norm_solver(J, smallest=8)
        s = scipy.linalg.svdvals(J[0].numpy())
        s = np.sort(s[s > s[0] * 1e-12])[:8]
        np.testing.assert_allclose(m.smallest_values[0].numpy(), s, rtol=1e-8)
        np.testing.assert_allclose(torch.linalg.vector_norm(m.smallest[0], dim=1).numpy(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(got["lapack"], got["torch"], rtol=1e-9)
    base = hcrfast.bound(model, x, sigma, restarts=2, iterations=2, solver="dense", singular_steps=0).std
    plus, _ = singular_oracle(model, x, 8, sigma, 1 / 200, signs=(1.0,))
    minus, _ = singular_oracle(model, x, 8, sigma, 1 / 200, signs=(-1.0,))
    assert np.any(np.abs(plus - minus) > 0.05 * np.minimum(plus, minus)), "the signs agree: the test shows nothing"
    np.testing.assert_allclose(got["lapack"].reshape(2, -1), np.maximum(base.reshape(2, -1), np.maximum(plus, minus)),
                               rtol=1e-7)


def test_krylov_ritz_vectors_of_pilots_sharing_one_space_are_taken_once():
    """Two pilots whose bases both exhaust the space find the same Ritz vectors: the K smallest distinct
    ones are J's K smallest right singular vectors (NumPy's SVD), not each twice."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 30), torch.nn.Tanh(),
                                torch.nn.Linear(30, 24)).double().eval()
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    built = []
    real = krylov.build

    def spy(*a, **k):
        built.append(real(*a, **k))
        return built[-1]

    krylov.build = spy
    try:
        hcrfast.bound(model, x, 0.1, solver="krylov", restarts=2, iterations=2, krylov_pilots=2)
    finally:
        krylov.build = real
    dirs, values = krylov.smallest_directions(built[0], 4, pilots=2)
    for b in range(2):
        J = torch.func.jacrev(lambda t: model(t).reshape(-1))(x[b:b + 1]).reshape(24, 16).detach().numpy()
        _, s, vt = np.linalg.svd(J, full_matrices=False)
        np.testing.assert_allclose(values[b].numpy(), s[::-1][:4], rtol=1e-8)
        np.testing.assert_allclose(np.abs(np.sum(dirs[b].numpy() * vt[::-1][:4], axis=1)), 1.0, atol=1e-8)


def test_min_norm_solver_keeps_the_smallest_singular_vectors_with_each_driver():
    torch.manual_seed(2)
    for n, p in ((30, 20), (12, 20), (20, 20)):
        J = torch.randn(3, n, p, dtype=torch.float64)
        J[1, :4] = 0   # dead rows, dropped before the factorization
        for driver in ("svd", "eigh"):
            solver = dense.min_norm_solver(J, driver=driver, smallest=5)
            for b in range(3):
                _, s, vt = np.linalg.svd(J[b].numpy())
                r = int((s > s[0] * 1e-12).sum())
                np.testing.assert_allclose(solver.smallest_values[b].numpy(), s[:r][::-1][:5], rtol=1e-8)
                np.testing.assert_allclose(np.abs(np.sum(solver.smallest[b].numpy() * vt[:r][::-1][:5], axis=1)),
                                           1.0, atol=1e-8)
    # more asked than the rank holds: zero rows with value 0
    J = torch.zeros(1, 6, 5, dtype=torch.float64)
    J[0, 0, 0], J[0, 1, 1] = 2.0, 3.0
    solver = dense.min_norm_solver(J, smallest=4)
    np.testing.assert_allclose(solver.smallest_values[0].numpy(), [2.0, 3.0, 0.0, 0.0])
    assert not solver.smallest[0, 2:].any()


def test_singular_steps_are_checked_before_the_run():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).eval()
    x = torch.randn(2, 1, 4, 4)
    with pytest.raises(ValueError, match="singular_steps must be 0 .none., a positive integer.*got -1"):
        hcrfast.bound(model, x, 0.1, singular_steps=-1)
    for bad in (True, 2.0, None):
        with pytest.raises(TypeError, match="singular_steps must be an integer or 'auto'"):
            hcrfast.bound(model, x, 0.1, singular_steps=bad)
    for bad in ("4", "Auto", ""):
        with pytest.raises(ValueError, match="pass 'auto', 0 .none. or a positive integer"):
            hcrfast.bound(model, x, 0.1, singular_steps=bad)
    with pytest.raises(ValueError, match="solves with 'lsqr'; pass solver='dense' or solver='krylov'"):
        hcrfast.bound(model, x, 0.1, singular_steps=4, solver="lsqr")
    with pytest.raises(NotImplementedError, match="needs Gaussian noise.*pass singular_steps=0"):
        hcrfast.bound(model, x, hcrfast.Laplace(0.1), singular_steps=4)
    b = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, singular_steps=0)
    assert b.params["singular_steps"] is None


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_the_default_certifies_64_singular_steps_where_the_solve_gives_them(solver):
    """singular_steps="auto" (the default): hcrfast.algorithm.AUTO_SINGULAR_STEPS (64) with the dense or
    Krylov solve, at most min(n, p); the bounds are those of the count passed by name, and never below
    Algorithm 1's (singular_steps=0)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(100, 120), torch.nn.Tanh()).eval()
    x = torch.randn(2, 1, 10, 10)
    kw = dict(restarts=2, iterations=2, solver=solver)
    auto = hcrfast.bound(model, x, 0.1, **kw)
    assert hcrfast.algorithm.AUTO_SINGULAR_STEPS == 64
    assert auto.params["singular_steps"]["count"] == 64 and auto.params["singular_steps"]["auto"] is True
    named = hcrfast.bound(model, x, 0.1, singular_steps=64, **kw)
    assert named.params["singular_steps"]["auto"] is False
    np.testing.assert_array_equal(auto.std, named.std)
    alone = hcrfast.bound(model, x, 0.1, singular_steps=0, **kw)
    assert np.all(auto.std >= alone.std) and np.any(auto.std > alone.std)
    assert "singular steps (auto): 64 per example" in auto.summary()
    # J's rank is at most min(n, p): 12 features give 12 steps, not 52 zero ones
    narrow = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(100, 12), torch.nn.Tanh()).eval()
    assert hcrfast.bound(narrow, x, 0.1, **kw).params["singular_steps"]["count"] == 12


def test_the_default_takes_none_where_the_directions_would_cost_products_or_the_noise_is_not_gaussian():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).eval()
    x = torch.randn(2, 1, 4, 4)
    kw = dict(restarts=2, iterations=2)
    assert hcrfast.bound(model, x, 0.1, solver="lsqr", **kw).params["singular_steps"] is None
    assert hcrfast.bound(model, x, 0.1, linearize_at="current", **kw).params["singular_steps"] is None
    assert hcrfast.bound(model, x, hcrfast.Laplace(0.1), solver="dense", **kw).params["singular_steps"] is None
    assert hcrfast.algorithm.resolve_singular_steps("auto", "krylov", 5000, 150528) == 64
    assert hcrfast.algorithm.resolve_singular_steps("auto", "lsqr", 5000, 150528) == 0
    assert hcrfast.algorithm.resolve_singular_steps(7, "lsqr", 5000, 150528) == 7


def test_a_checkpoint_keys_the_singular_steps_and_resumes_them(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).eval()
    x = torch.randn(4, 1, 4, 4)
    kw = dict(restarts=2, iterations=2, chunk_size=2, singular_steps=3)
    whole = hcrfast.bound(model, x, 0.1, **kw)
    first = hcrfast.bound(model, x[:2], 0.1, checkpoint=tmp_path / "c", example_ids=[0, 1], **kw)
    assert first.std.shape[0] == 2
    with pytest.raises(hcrfast.CheckpointMismatchError, match="singular_steps"):
        hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "c", **dict(kw, singular_steps=4))
    # the key leaves out a count of 0 (keys from before the steps still match), named as the value it means
    with pytest.raises(hcrfast.CheckpointMismatchError, match="singular_steps: 3 -> 0"):
        hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "c", **dict(kw, singular_steps=0))
    resumed = hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "d", **kw)
    np.testing.assert_allclose(resumed.std, whole.std, rtol=1e-12)
    assert "singular" in whole.summary()


def test_a_count_above_js_rank_is_capped_and_zero_directions_cost_no_forward_pass(monkeypatch):
    """J (24 features x 16 inputs) has at most 16 singular directions: singular_steps=2000 takes 16, with a
    warning, and the bounds of 16. Behind a 6-unit layer its rank is at most 6: the rows past it (value 0, a
    step of 0, a bound of 0) get no float64 forward pass, and the bounds are those of 6 steps."""
    torch.manual_seed(0)
    x = torch.randn(2, 1, 4, 4)
    kw = dict(restarts=2, iterations=2)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 24)).eval()
    with pytest.warns(UserWarning, match=r"singular_steps=2000: J \(24 features x 16 inputs\) has at most "
                                         r"min\(n, p\) = 16 singular directions; taking those 16"):
        many = hcrfast.bound(model, x, 0.1, singular_steps=2000, **kw)
    assert many.params["singular_steps"]["count"] == 16
    np.testing.assert_array_equal(many.std, hcrfast.bound(model, x, 0.1, singular_steps=16, **kw).std)
    assert hcrfast.algorithm.resolve_singular_steps(5, "lsqr", 6, 7) == 5  # a count within it: as given

    passed = []
    certified = hcrfast.algorithm._certified_iterates

    def counting(model64, batch, owner, steps, at=None):
        passed.append(np.linalg.norm(np.asarray(steps, dtype=np.float64), axis=1))
        return certified(model64, batch, owner, steps, at=at)

    monkeypatch.setattr(hcrfast.algorithm, "_certified_iterates", counting)
    narrow = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 6), torch.nn.ReLU(),
                                 torch.nn.Linear(6, 24)).eval()
    for solver in ("dense", "krylov"):
        passed.clear()
        wide = hcrfast.bound(narrow, x, 0.1, singular_steps=16, solver=solver, **kw)
        rows = np.concatenate(passed)
        assert len(rows) and np.all(rows > 0), solver
        six = hcrfast.bound(narrow, x, 0.1, singular_steps=6, solver=solver, **kw)
        np.testing.assert_allclose(wide.std, six.std, rtol=1e-12, err_msg=solver)


def test_a_resumed_call_accounts_for_every_chunk_of_its_result(tmp_path):
    """The singular steps' and the earlier iterates' accounts (modes lifted, steps certified) are kept in each
    chunk file: a call that reads chunks back, in part or whole, reports the uninterrupted call's counts."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).eval()
    x = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    kw = dict(restarts=2, iterations=3, chunk_size=2, singular_steps=3)
    whole = hcrfast.bound(model, x, 0.1, **kw)
    hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "c", **kw)
    chunks = sorted((tmp_path / "c").glob("chunk_*.npz"))
    assert len(chunks) == 2
    chunks[1].unlink()   # a crash lost the second chunk
    for _ in range(2):   # half read back, then all of it
        again = hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "c", **kw)
        for key in ("examples", "modes_lifted"):
            assert again.params["singular_steps"][key] == whole.params["singular_steps"][key], key
        for key in ("steps", "certified", "examples", "margin"):
            assert again.params["earlier_iterates"][key] == whole.params["earlier_iterates"][key], key
    assert whole.params["singular_steps"]["examples"] == 4 and whole.params["singular_steps"]["modes_lifted"] > 0
    assert again.params["checkpoint"]["examples_read_back"] == 4


class _Frozen(torch.nn.Module):
    """Features that do not move although the Jacobian (I) says they do: every step has D = 0."""

    def forward(self, x):
        flat = x.flatten(1)
        return (flat - flat.detach()) + 1.0


def test_a_singular_step_with_zero_divergence_gives_infinite_bounds_with_its_reason():
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = hcrfast.bound(_Frozen(), x, 0.1, restarts=2, iterations=2, solver="dense", singular_steps=3)
    assert np.all(np.isinf(res.std))
    singular = [r for r in res.infinite_reasons if ", singular step " in r]
    assert len(singular) == 2 * 3 * 2 and all("so D = 0" in r for r in singular)   # both signs of each direction
    assert sum("singular step 2 (+v): " in r for r in singular) == sum("singular step 2 (-v): " in r for r in singular) == 2
    assert "and 12 singular steps left the features unchanged in float64" in res.summary()


def test_a_short_krylov_basis_says_how_few_directions_it_had():
    """A 3-step Krylov basis keeps at most 3 Ritz vectors: of 8 singular steps asked for, the rest are steps of
    0. params['singular_steps']['directions'] counts what each example had, and the summary says it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh()).eval()
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    lsqr = hcrfast.LSQROptions(atol=0.0, btol=0.0, iter_lim=3)
    res = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, solver="krylov", lsqr=lsqr, singular_steps=8)
    got = res.params["singular_steps"]["directions"]
    assert 1 <= got["fewest"] <= 3 and got["total"] <= 2 * 3
    assert f"an example had as few as {got['fewest']}" in res.summary()
    full = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, solver="dense", singular_steps=8)
    assert full.params["singular_steps"]["directions"] == dict(total=16, fewest=8)
    assert "as few as" not in full.summary()


def test_singular_steps_with_lsqr_are_refused_naming_the_count_passed():
    """singular_steps=4 on a J of rank 3 with solver='lsqr': it warned 'taking those 3', then refused naming
    singular_steps=3, a count the caller never passed."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(5, 3)).double()
    x = torch.randn(2, 5, 1, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"^singular_steps=4 takes J's smallest singular directions .* this call "
                                             r"solves with 'lsqr'"):
            hcrfast.bound(model, x, 0.3, solver="lsqr", singular_steps=4, basis="pixel")
    assert not [w for w in caught if "taking those" in str(w.message)]
