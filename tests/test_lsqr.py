"""Batched LSQR against scipy.sparse.linalg.lsqr run problem by problem, and numpy.linalg.lstsq."""
import dataclasses

import numpy as np
import pytest
import scipy.sparse.linalg as spla

import hcrfast.lsqr as lsqr_mod
from hcrfast.lsqr import LSQROptions, lsqr
from hcrfast.operators import DenseBatchOperator


def random_batch(rng, B, m, n, cond):
    """B matrices m×n with singular values spread log-uniformly over [1/cond, 1]."""
    A = np.empty((B, m, n))
    k = min(m, n)
    for b in range(B):
        U, _ = np.linalg.qr(rng.standard_normal((m, k)))
        V, _ = np.linalg.qr(rng.standard_normal((n, k)))
        A[b] = (U * np.logspace(0, -np.log10(cond), k)) @ V.T
    return A


CASES = [  # (m, n, cond, damp)
    (40, 15, 1e1, 0.0),
    (40, 15, 1e4, 0.0),
    (15, 40, 1e1, 0.0),
    (30, 30, 1e3, 0.0),
    (15, 40, 1e3, 0.0),
    (40, 15, 1e4, 1e-2),
    (15, 40, 1e3, 1e-1),
]


@pytest.mark.parametrize("m,n,cond,damp", CASES)
def test_matches_scipy_problem_by_problem(m, n, cond, damp):
    rng = np.random.default_rng(hash((m, n, int(cond), damp)) % 2**32)
    B = 5
    A = random_batch(rng, B, m, n, cond)
    b = rng.standard_normal((B, m))
    kw = dict(damp=damp, atol=1e-12, btol=1e-12, conlim=1e12, iter_lim=20 * n)
    res = lsqr(DenseBatchOperator(A), b, **kw)
    for k in range(B):
        ref = spla.lsqr(A[k], b[k], **kw)
        assert np.linalg.norm(res.x[k] - ref[0]) <= 1e-8 * np.linalg.norm(ref[0])
        assert res.istop[k] == ref[1] and res.istop[k] in (1, 2)
        # Near the tolerance the last steps gain almost nothing: rounding (which differs between BLAS
        # builds and CPUs: 111 vs SciPy's 106 steps on an AMD EPYC, cond 1e3) can move the stop by a few.
        assert abs(int(res.itn[k]) - ref[2]) <= max(3, 0.1 * ref[2])
        np.testing.assert_allclose(res.xnorm[k], ref[8], rtol=1e-8)
        # and the exact (damped) least-squares solution
        Ad = np.vstack([A[k], damp * np.eye(n)])
        exact = np.linalg.lstsq(Ad, np.concatenate([b[k], np.zeros(n)]), rcond=None)[0]
        assert np.linalg.norm(res.x[k] - exact) <= 1e-6 * np.linalg.norm(exact)


@pytest.mark.parametrize("damp", [0.0, 0.3])
def test_first_iterations_agree_to_rounding(damp):
    """Before any stopping test fires, every iterate equals SciPy's to rounding."""
    rng = np.random.default_rng(7)
    A = random_batch(rng, 4, 25, 20, 1e2)
    b = rng.standard_normal((4, 25))
    res = lsqr(DenseBatchOperator(A), b, damp=damp, iter_lim=4)
    for k in range(4):
        ref = spla.lsqr(A[k], b[k], damp=damp, iter_lim=4)
        np.testing.assert_allclose(res.x[k], ref[0], rtol=1e-10, atol=1e-12)
        assert res.istop[k] == ref[1] == 7 and res.itn[k] == ref[2] == 4
        for i, name in [(3, "r1norm"), (4, "r2norm"), (5, "anorm"), (6, "acond"), (7, "arnorm"), (8, "xnorm")]:
            np.testing.assert_allclose(getattr(res, name)[k], ref[i], rtol=1e-10)


@pytest.mark.parametrize("damp", [0.0, 0.2])
def test_warm_start_x0_iterates_as_scipy_and_stops_on_the_whole_solution(damp):
    """x0: SciPy's iterates exactly; the stopping tests take ‖x0‖ + ‖δ‖ for ‖x‖ (SciPy: ‖δ‖),
    so a start near the solution stops sooner than SciPy's, yet at a residual within the
    cold start's criterion; x0 = 0 is the cold start."""
    rng = np.random.default_rng(11)
    B, m, n = 4, 30, 20
    A = random_batch(rng, B, m, n, 1e3)
    b = rng.standard_normal((B, m))
    tol = 1e-8
    cold = lsqr(DenseBatchOperator(A), b, damp=damp, atol=tol, btol=tol, iter_lim=400)
    x0 = cold.x * (1 + 1e-3 * rng.standard_normal((B, n)))  # near the solution
    x0[3] = 0.0
    opts = dict(damp=damp, atol=tol, btol=tol, iter_lim=400)
    res = lsqr(DenseBatchOperator(A), b, x0=x0, **opts)
    early = lsqr(DenseBatchOperator(A), b, x0=x0, damp=damp, iter_lim=3)
    for k in range(B):
        ref3 = spla.lsqr(A[k], b[k], x0=x0[k], damp=damp, iter_lim=3)  # no test fires in 3 steps
        np.testing.assert_allclose(early.x[k], ref3[0], rtol=1e-10, atol=1e-12)
        for i, name in [(3, "r1norm"), (7, "arnorm"), (8, "xnorm")]:
            np.testing.assert_allclose(getattr(early, name)[k], ref3[i], rtol=1e-9)
        ref = spla.lsqr(A[k], b[k], x0=x0[k], **opts)
        assert res.istop[k] in (1, 2) and int(res.itn[k]) <= ref[2] + 3  # (rounding moves a stop by a few)
        if damp == 0:  # the cold start's criterion, with the true residual and ‖A‖ ≥ LSQR's estimate;
            # the slack 4 covers LSQR's recurrence estimate of ‖Aᵀr‖ against the true one (2.04× seen on an
            # AMD EPYC's OpenBLAS, under 2× on an Xeon); a stop far too early misses it by orders of magnitude.
            r = np.linalg.norm(b[k] - A[k] @ res.x[k])
            assert r <= 4 * (tol * np.linalg.norm(b[k]) + tol * np.linalg.norm(A[k], 2) * np.linalg.norm(res.x[k])) \
                or np.linalg.norm(A[k].T @ (b[k] - A[k] @ res.x[k])) <= 4 * tol * np.linalg.norm(A[k]) * r
            exact = np.linalg.lstsq(A[k], b[k], rcond=None)[0]
            assert np.linalg.norm(res.x[k] - exact) <= 1e-4 * np.linalg.norm(exact)
    np.testing.assert_array_equal(lsqr(DenseBatchOperator(A), b, x0=np.zeros((B, n)), **opts).x, cold.x)
    if damp == 0:  # (damped, these problems take 10 steps from anywhere)
        assert (res.itn[:3] < cold.itn[:3]).all()
    np.testing.assert_array_equal(x0[3], 0.0)  # x0 itself is not modified
    with pytest.raises(ValueError, match="x0 of shape"):
        lsqr(DenseBatchOperator(A), b, x0=x0[:, :5])


def test_tolerance_stops_per_problem():
    """Loose atol/btol: problems stop at different iterations, each as SciPy would."""
    rng = np.random.default_rng(3)
    conds = np.repeat([1e1, 1e2, 1e3], 3)
    A = np.concatenate([random_batch(rng, 3, 50, 20, c) for c in (1e1, 1e2, 1e3)])
    b = rng.standard_normal((9, 50))
    res = lsqr(DenseBatchOperator(A), b, atol=1e-5, btol=1e-5, iter_lim=400)
    itns = []
    for k in range(9):
        ref = spla.lsqr(A[k], b[k], atol=1e-5, btol=1e-5, iter_lim=400)
        itns.append(ref[2])
        assert res.istop[k] == ref[1] and res.istop[k] in (1, 2)
        # Late LSQR iterates amplify rounding (SciPy against itself with a differently rounded
        # matvec differs as much), so the stop can move by a few steps and x agrees to the
        # accuracy the tolerance buys, atol * cond(A)^2 for an inconsistent system, not to eps.
        assert abs(int(res.itn[k]) - ref[2]) <= max(2, ref[2] // 5)
        assert np.linalg.norm(res.x[k] - ref[0]) <= 1e-5 * conds[k] ** 2 * np.linalg.norm(ref[0])
    assert len(set(itns)) > 2  # the batch really had problems stopping at different times


def test_zero_rhs_and_zero_operator_stop_at_once():
    rng = np.random.default_rng(4)
    A = random_batch(rng, 3, 10, 6, 10.0)
    A[2] = 0.0
    b = rng.standard_normal((3, 10))
    b[0] = 0.0
    res = lsqr(DenseBatchOperator(A), b)
    for k in (0, 2):
        ref = spla.lsqr(A[k], b[k])
        assert res.istop[k] == ref[1] == 0 and res.itn[k] == ref[2] == 0
        assert np.all(res.x[k] == 0)
    assert res.istop[1] != 0 and res.itn[1] > 0
    assert res.messages()[0] == "The exact solution is  x = 0"


def test_compaction_and_check_interval_do_not_change_results():
    rng = np.random.default_rng(5)
    A = np.concatenate([random_batch(rng, 3, 40, 20, c) for c in (1e1, 1e4)])
    b = rng.standard_normal((6, 40))
    op = DenseBatchOperator(A)
    base = lsqr(op, b, atol=1e-8, btol=1e-8, compact_below=0.0, check_every=1)
    for opts in (dict(compact_below=1.0, check_every=1), dict(compact_below=1.0, check_every=5),
                 dict(compact_below=0.5, check_every=3)):
        other = lsqr(op, b, atol=1e-8, btol=1e-8, **opts)
        np.testing.assert_allclose(other.x, base.x, rtol=1e-12, atol=0)
        np.testing.assert_array_equal(other.istop, base.istop)
        np.testing.assert_array_equal(other.itn, base.itn)


def test_host_looks_only_every_k_steps(monkeypatch):
    """The only device-to-host copies are the every-k convergence checks."""
    calls = []
    real = lsqr_mod.to_host
    monkeypatch.setattr(lsqr_mod, "to_host", lambda a: calls.append(1) or real(a))
    rng = np.random.default_rng(6)
    A = random_batch(rng, 4, 30, 30, 1e6)
    b = rng.standard_normal((4, 30))
    res = lsqr(DenseBatchOperator(A), b, atol=0, btol=0, conlim=0, iter_lim=40, check_every=10)
    assert np.all(res.itn == 40)
    assert len(calls) == 40 // 10 + 1


def test_float32_agrees_with_float64_scipy():
    rng = np.random.default_rng(8)
    A = random_batch(rng, 3, 60, 30, 1e1)
    b = rng.standard_normal((3, 60))
    res = lsqr(DenseBatchOperator(A.astype(np.float32)), b.astype(np.float32), atol=1e-6, btol=1e-6, iter_lim=600)
    assert res.x.dtype == np.float32 and np.all(res.istop < 7)
    for k in range(3):
        ref = spla.lsqr(A[k], b[k], atol=1e-10, btol=1e-10, iter_lim=600)[0]
        assert np.linalg.norm(res.x[k] - ref) <= 1e-4 * np.linalg.norm(ref)


def test_bad_options_and_shapes():
    with pytest.raises(ValueError, match="atol"):
        LSQROptions(atol=-1)
    with pytest.raises(ValueError, match="iter_lim"):
        LSQROptions(iter_lim=0)
    with pytest.raises(ValueError, match="Shape mismatch"):
        lsqr(DenseBatchOperator(np.ones((2, 3, 4))), np.ones((2, 4)))


@pytest.mark.parametrize("kw,error,match", [
    (dict(check_every="8"), TypeError, r"check_every must be an integer >= 1, got '8' \(str\); pass an int"),
    (dict(check_every=2.5), TypeError, r"check_every .* got 2\.5 \(float\); pass an int, e\.g\. check_every=2"),
    (dict(check_every=True), TypeError, r"check_every .* got True \(bool\)"),
    (dict(check_every=0), ValueError, r"check_every must be >= 1, got 0"),
    (dict(iter_lim=2.9), TypeError, r"iter_lim must be an integer >= 1 or None .* got 2\.9 \(float\)"),
    (dict(iter_lim=3.0), TypeError, r"iter_lim .* got 3\.0 \(float\); pass an int, e\.g\. iter_lim=3"),
    (dict(iter_lim="5"), TypeError, r"iter_lim .* got '5' \(str\)"),
    (dict(iter_lim=np.bool_(True)), TypeError, r"iter_lim .* \(bool_?\)"),  # NumPy 1.x names the type bool_
    (dict(iter_lim=-2), ValueError, r"iter_lim must be >= 1 or None"),
    (dict(atol=True), TypeError, r"atol must be a finite number >= 0, got True \(bool\); pass a number"),
    (dict(atol="a"), TypeError, r"atol must be a finite number >= 0, got 'a' \(str\)"),
    (dict(btol=None), TypeError, r"btol .* got None \(NoneType\)"),
    (dict(damp="0"), TypeError, r"damp .* got '0' \(str\)"),
    (dict(damp=-0.1), ValueError, r"damp must be finite and >= 0, got -0\.1"),
    (dict(conlim=float("inf")), ValueError, r"conlim must be finite and >= 0, got inf"),
    (dict(conlim=[1e8]), TypeError, r"conlim .* \(list\)"),
    (dict(compact_below="0.5"), TypeError, r"compact_below must be a number in \[0, 1\], got '0\.5' \(str\)"),
    (dict(compact_below=False), TypeError, r"compact_below .* \(bool\)"),
    (dict(compact_below=float("nan")), ValueError, r"compact_below must lie in \[0, 1\]"),
    (dict(compact_below=1.5), ValueError, r"compact_below must lie in \[0, 1\]"),
    (dict(kernels=None), TypeError, r"kernels must be one of .* got None \(NoneType\)"),
    (dict(kernels=["auto"]), TypeError, r"kernels must be one of .* \(list\)"),
    (dict(kernels="cuda"), ValueError, r"kernels must be one of \('auto', 'twin', 'numba'\), got 'cuda'"),
])
def test_every_option_is_checked_at_construction(kw, error, match):
    """A bad option fails when the options are made (or replaced), naming the field, the value and the fix;
    not inside the solver after the model has run, and not truncated (iter_lim=2.9 is not 2)."""
    with pytest.raises(error, match=r"LSQROptions\." + match):
        LSQROptions(**kw)
    with pytest.raises(error, match=r"LSQROptions\." + match):
        dataclasses.replace(LSQROptions(), **kw)


def test_bad_option_of_a_call_fails_before_any_product():
    op = DenseBatchOperator(np.ones((2, 3, 4)))
    op.matvec = op.rmatvec = None  # a product would fail with another error
    with pytest.raises(TypeError, match=r"LSQROptions\.check_every .* got '8'"):
        lsqr(op, np.ones((2, 3)), check_every="8")


def test_numpy_numbers_are_accepted_and_stored_as_python_numbers():
    opts = LSQROptions(damp=np.float32(0.5), atol=0, btol=np.int64(0), conlim=np.float64(1e6), iter_lim=np.int32(7),
                       check_every=np.uint8(3), compact_below=1, kernels=np.str_("twin"))
    assert opts == LSQROptions(damp=0.5, atol=0.0, btol=0.0, conlim=1e6, iter_lim=7, check_every=3,
                               compact_below=1.0, kernels="twin")
    assert [type(getattr(opts, f.name)) for f in dataclasses.fields(opts)] == \
        [float, float, float, float, int, int, float, str]


def test_the_packages_own_options_pass_the_checks():
    import hcrfast
    from hcrfast import attack, krylov, targeted

    for opts in (hcrfast.DEFAULT_LSQR, krylov.DEFAULT_OPTIONS, *targeted.TARGETED_LSQR.values(),
                 *attack.ATTACK_LSQR.values()):
        assert dataclasses.replace(opts, iter_lim=targeted.LSQR_ITER_FACTOR * 3) == \
            dataclasses.replace(opts, iter_lim=12)


@pytest.mark.parametrize("scale", [2.0**-34, 2.0**-20, 2.0**20, 2.0**34])
def test_scaling_a_and_b_together_changes_nothing(scale):
    """min ‖kA x − kb‖ has the x of min ‖A x − b‖, and every stopping test is a ratio of like quantities:
    with k a power of two (exact in floating point) the iterates, counts and stop codes must be the
    same bits. (SciPy's ``test2`` adds eps to ‖A‖·‖r‖, which for k = 2⁻³⁴ is far below it: every
    problem would stop at step 1 with istop 2.)"""
    rng = np.random.default_rng(5)
    A = random_batch(rng, 4, 30, 12, 1e2)
    b = rng.standard_normal((4, 30))
    opts = LSQROptions(atol=1e-8, btol=1e-8, iter_lim=100)
    want = lsqr(DenseBatchOperator(A), b, opts)
    got = lsqr(DenseBatchOperator(A * scale), b * scale, opts)
    assert want.itn.min() > 3
    np.testing.assert_array_equal(got.itn, want.itn)
    np.testing.assert_array_equal(got.istop, want.istop)
    np.testing.assert_array_equal(got.x, want.x)


def test_default_iteration_limit_is_twice_the_columns_as_scipys():
    """iter_lim=None is SciPy's 2·n_cols: with every tolerance off, each problem runs exactly that many
    steps and stops with istop 7, as scipy.sparse.linalg.lsqr does."""
    rng = np.random.default_rng(6)
    A = random_batch(rng, 3, 30, 12, 1e6)
    b = rng.standard_normal((3, 30))
    res = lsqr(DenseBatchOperator(A), b, atol=0, btol=0, conlim=0)
    for k in range(3):
        ref = spla.lsqr(A[k], b[k], atol=0, btol=0, conlim=0)
        assert res.itn[k] == ref[2] == 24 and res.istop[k] == ref[1] == 7


def test_an_exactly_solved_problem_stops_with_scipys_code_1():
    """rnorm = 0 exactly at step 1 (A = I, and a diagonal A with b = e_1): test1 = 0 <= rtol = 0 gives
    SciPy's istop 1 even with every tolerance 0."""
    A = np.stack([np.eye(6), np.diag([1.0, 2, 3, 4, 5, 6])])
    b = np.stack([np.ones(6), np.eye(6)[0]])
    res = lsqr(DenseBatchOperator(A), b, atol=0, btol=0, conlim=0)
    for k in range(2):
        ref = spla.lsqr(A[k], b[k], atol=0, btol=0, conlim=0)
        assert res.istop[k] == ref[1] == 1 and res.itn[k] == ref[2] == 1
        np.testing.assert_allclose(res.x[k], ref[0], rtol=1e-15)
        # β = 0 leaves SciPy's ‖A‖ estimate where it was (0 here), and its condition estimate with it
        assert res.anorm[k] == ref[5] == 0 and res.acond[k] == ref[6] == 0


def _documented_warm_stop(A, b, x0, atol, btol, iter_lim):
    """The first step whose test of :func:`lsqr` with ``x0`` fires, from SciPy's own per-step estimates
    (``iter_lim=k``, every tolerance off): test1 ``r/‖b‖ ≤ btol + atol·‖A‖·(‖x0‖ + ‖δ‖)/‖b‖`` (‖b‖ of b
    itself, not of b − A x0) or test2 ``‖Aᵀr‖/(‖A‖·r) ≤ atol``."""
    nb, nx0 = np.linalg.norm(b), np.linalg.norm(x0)
    for k in range(1, iter_lim + 1):
        _, _, _, r1, _, anorm, _, arnorm, xnorm, _ = spla.lsqr(A, b, x0=x0, atol=0, btol=0, conlim=0, iter_lim=k)
        if r1 / nb <= btol + atol * anorm * (xnorm + nx0) / nb or arnorm <= atol * anorm * r1:
            return k
    return iter_lim


@pytest.mark.parametrize("atol, btol", [(1e-8, 0.0), (0.0, 1e-8)])
def test_warm_start_stops_where_the_documented_tests_fire_on_scipys_estimates(atol, btol):
    """With x0 the stopping tests keep ‖b‖ (not ‖b − A x0‖) and take ‖x0‖ + ‖δ‖ for ‖x‖ (SciPy: ‖δ‖). On
    consistent systems started 1e-3 off the solution, either change moves the stop by 20-50% (SciPy's
    ‖δ‖ alone, or ‖b − A x0‖ for ‖b‖); rounding near the threshold moves it by a few steps."""
    rng = np.random.default_rng(11)
    B, m, n = 3, 60, 40
    A = random_batch(rng, B, m, n, 1e2)
    b = np.einsum("bij,bj->bi", A, rng.standard_normal((B, n)))
    exact = np.stack([np.linalg.lstsq(A[k], b[k], rcond=None)[0] for k in range(B)])
    x0 = exact * (1 + 1e-3 * rng.standard_normal((B, n)))
    res = lsqr(DenseBatchOperator(A), b, x0=x0, atol=atol, btol=btol, conlim=0, iter_lim=400)
    for k in range(B):
        want = _documented_warm_stop(A[k], b[k], x0[k], atol, btol, 400)
        assert res.istop[k] in (1, 2) and abs(int(res.itn[k]) - want) <= max(3, want // 10), (k, res.itn[k], want)


def test_a_damping_that_shrinks_the_steps_to_rounding_is_named_in_the_warning():
    """LSQROptions(damp=1e6) shrinks every eps toward 0: the restarts bound nothing, and the warning said to
    pass a sigma nearer the features' scale, which sigma already was. It names the damping too now."""
    import warnings

    import torch

    import hcrfast

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 1, 4, 4)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x))

    def said(damp):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = hcrfast.bound(model, x, sigma, lsqr=hcrfast.LSQROptions(damp=damp), solver="lsqr", restarts=2,
                                iterations=2)
        return res, [str(w.message) for w in caught if "so little next to their size" in str(w.message)]

    res, messages = said(1e6)
    assert (res.std == 0).all() and messages and all("LSQROptions(damp=1e+06)" in m for m in messages), messages
    assert said(0.0)[1] == []


def test_results_compare_by_value():
    """hcrfast.LSQRResult (in hcrfast.__all__) kept the dataclass's ==, which raised on its arrays ('The truth
    value of an array ... is ambiguous'), also for `r in [r2]`."""
    import copy
    import pickle

    rng = np.random.default_rng(0)
    A, b = rng.standard_normal((3, 6, 4)), rng.standard_normal((3, 6))
    r = lsqr(DenseBatchOperator(A), b)
    assert copy.deepcopy(r) == r and pickle.loads(pickle.dumps(r)) == r and r in [copy.deepcopy(r)]
    other = copy.deepcopy(r)
    other.x[0, 0] += 1.0
    assert other != r and r != "r"
    with pytest.raises(TypeError, match="unhashable"):
        hash(r)
