"""hcrfast.attack: the Gauss–Newton attacker against least squares and the exact LS covariance."""
import copy
import dataclasses
import json
import math
import re
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import chi2
from test_bound import dct_basis, linear_model, matrix_with_condition

import hcrfast
from hcrfast.attack import (
    AttackResult,
    _damped_steps,
    compare,
    gauss_newton_attack,
    observation_noise,
)

SHAPE, P, N = (1, 4, 4), 16, 24


def _linear_problem(seed, cond=10.0, examples=2):
    rng = np.random.default_rng(seed)
    W = matrix_with_condition(rng, N, P, cond)
    b = rng.standard_normal(N)
    x = torch.as_tensor(rng.standard_normal((examples,) + SHAPE))
    return W, b, linear_model(W, b, SHAPE), x


def _observations(W, b, x, draws, sigma, seed):
    """X = Wθ + b + Z with the attack's documented noise streams, (B·draws, n)."""
    B = x.shape[0]
    Z = observation_noise(np.arange(B), draws, N, seed=seed, noise=sigma)
    return np.repeat(x.reshape(B, -1).numpy() @ W.T + b, draws, axis=0) + Z


@pytest.mark.parametrize("start", ["truth", "mean"])
def test_undamped_gauss_newton_on_a_linear_model_is_least_squares_after_one_step(start):
    W, b, model, x = _linear_problem(1)
    sigma, draws = 0.3, 6
    res = gauss_newton_attack(model, x, sigma, draws=draws, steps=1, damping=0.0, start=start, seed=3)
    X = _observations(W, b, x, draws, sigma, seed=3)
    ls = np.linalg.lstsq(W, (X - b).T, rcond=None)[0].T            # one lstsq per draw (columns)
    np.testing.assert_allclose(res.estimates.reshape(-1, P), ls, atol=1e-8, rtol=0)
    assert np.all(res.steps == 1) and np.all(res.iterations == 1)
    # more steps do not move it: the next step finds Jᵀr = 0 and stops
    more = gauss_newton_attack(model, x, sigma, draws=draws, steps=5, damping=0.0, start=start, seed=3)
    np.testing.assert_allclose(more.estimates.reshape(-1, P), ls, atol=1e-8, rtol=0)
    assert np.all(more.converged) and np.all(more.iterations <= 3)
    resid = np.linalg.norm(X - ls @ W.T - b, axis=1).reshape(2, draws)
    np.testing.assert_allclose(more.residual_norm, resid, rtol=1e-9)
    np.testing.assert_allclose(more.residual_truth, np.linalg.norm(X - np.repeat(x.reshape(2, -1).numpy() @ W.T + b,
                                                                                   draws, axis=0), axis=1).reshape(2, draws))


def test_one_damped_step_is_the_ridge_solution_and_mixed_damping_solves_each_problem():
    W, b, model, x = _linear_problem(2)
    sigma, draws, lam = 0.5, 4, 0.7
    res = gauss_newton_attack(model, x, sigma, draws=draws, steps=1, damping=lam, seed=1)
    X = _observations(W, b, x, draws, sigma, seed=1)
    theta = np.repeat(x.reshape(2, -1).numpy(), draws, axis=0)
    r = X - theta @ W.T - b
    ridge = theta + np.linalg.solve(W.T @ W + lam**2 * np.eye(P), W.T @ r.T).T
    np.testing.assert_allclose(res.estimates.reshape(-1, P), ridge, atol=1e-8, rtol=0)
    # per-problem damping in one batch: undamped rows and three different λ in one call
    lams = np.array([0.0, 0.01, 0.7, 5.0])
    points = x[:1].repeat(4, 1, 1, 1)
    rhs = np.random.default_rng(0).standard_normal((4, N))
    delta, itn, _ = _damped_steps(model, points, rhs, lams, options=hcrfast.LSQROptions(atol=1e-12, btol=1e-12),
                                  jacobian="reverse")
    for k, lk in enumerate(lams):
        expected = np.linalg.solve(W.T @ W + lk**2 * np.eye(P), W.T @ rhs[k])
        np.testing.assert_allclose(delta[k], expected, atol=1e-9, rtol=0)
    assert np.all(itn > 0)


def test_empirical_variance_matches_the_least_squares_covariance_and_respects_the_bounds():
    """Per mode, draws·rmse²/v ~ χ²(draws) with v = σ²[Q(WᵀW)⁻¹Qᵀ]_kk (LS is unbiased); every valid
    bound, Algorithm 1's and the targeted (Cramér–Rao) one, has std² ≤ v, so rmse² ≥ std² up to MC error."""
    W, _, model, x = _linear_problem(7, cond=30.0)
    sigma, draws = 0.4, 400
    res = gauss_newton_attack(model, x, sigma, draws=draws, steps=3, damping=0.0, seed=11)
    Q = dct_basis(SHAPE)
    v = sigma**2 * np.diag(Q @ np.linalg.inv(W.T @ W) @ Q.T)
    m = res.rmse.size                                          # modes tested jointly
    alpha = 1e-4 / m                                           # Bonferroni: all modes together at 1e-4
    stat = draws * res.rmse.reshape(2, P) ** 2 / v
    assert np.all(stat >= chi2.ppf(alpha / 2, draws)) and np.all(stat <= chi2.ppf(1 - alpha / 2, draws))
    # unbiased: the mean error is within MC error of 0
    assert np.all(np.abs(res.bias) <= 5 * res.bias_se)
    np.testing.assert_allclose(res.mse, (res.rmse.reshape(2, P) ** 2).mean(axis=1), rtol=1e-12)

    low = chi2.ppf(alpha, draws) / draws                       # rmse²/v can be this small by chance
    lsqr = hcrfast.LSQROptions(atol=1e-10, btol=1e-10, iter_lim=200)
    alg1 = hcrfast.bound(model, x, sigma, iterations=2, restarts=4, lsqr=lsqr)
    full = hcrfast.bound(model, x, sigma, iterations=2, restarts=4, lsqr=lsqr, targets="all")
    for bnd in (alg1, full):
        assert np.all(res.rmse**2 >= low * bnd.std**2)
    # the targeted bound is close to the CRB, so the efficient attacker sits near ratio 1
    c = compare(full, res)
    assert c["n_compared"] == 2 * P and c["n_bound_infinite"] == 0
    assert 0.9 < c["median"] < 1.1 and c["quantiles"][0.05] >= np.sqrt(low)
    assert c["mc_band"][0] < 1 < c["mc_band"][1]
    assert compare(alg1, res)["median"] >= c["median"]          # Algorithm 1 is the looser bound
    # per example, the attack's MSE against (1/p) Σ std² of the full targeted bound: the trace of the LS
    # covariance over p, which the efficient attacker meets (MC error ~ 2% over 400 draws × 16 modes)
    trace = np.trace(sigma**2 * np.linalg.inv(W.T @ W)) / P
    assert c["mse_ratio_median"] == pytest.approx(np.median(res.mse / (full.std.reshape(2, P) ** 2).mean(axis=1)))
    assert 0.9 < c["mse_ratio_median"] < 1.1 and np.all(full.mse_from_modes <= trace * (1 + 1e-9))
    assert compare(alg1, res)["mse_ratio_median"] >= c["mse_ratio_median"]


def test_tanh_mlp_residuals_decrease_per_problem_and_errors_are_finite():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 24), torch.nn.Tanh()).double().eval()
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    sigma = 0.05
    res = gauss_newton_attack(model, x, sigma, draws=5, steps=6, damping=1e-3, start="mean", seed=2)
    hist = res.residual_history
    assert hist.shape == (3, 5, 7)
    assert np.all(np.diff(hist, axis=2) <= 0)                  # never increases, problem by problem
    assert np.all(hist[..., -1] < hist[..., 0])                # and the start was improved on
    assert np.any(res.iterations > res.steps)                   # some steps were rejected (damping raised)
    np.testing.assert_array_equal(hist[..., 0], res.residual_start)
    np.testing.assert_array_equal(hist[..., -1], res.residual_norm)
    assert np.all(np.isfinite(res.rmse)) and np.all(np.isfinite(res.mse))
    assert np.all(res.steps >= 1) and np.all(res.steps <= res.iterations) and np.all(res.iterations <= 6)
    # the reported residual is ‖a(θ̂) − X‖ by a forward pass
    Z = observation_noise(np.arange(3), 5, 24, seed=2, noise=sigma)
    with torch.no_grad():
        X = model(x).repeat_interleave(5, dim=0).numpy() + Z
        fit = model(torch.as_tensor(res.estimates).reshape(15, *SHAPE)).numpy()
    np.testing.assert_allclose(res.residual_norm.reshape(-1), np.linalg.norm(X - fit, axis=1), rtol=1e-10)
    assert isinstance(res.summary(), str) and "Gauss-Newton attack" in res.summary()


def test_the_summary_medians_of_steps_and_iterations_show_their_halves():
    """12 problems whose accepted steps have numpy median 4.5 (the oracle) read "accepted steps: median 4":
    ``:.0f`` rounds half to even. The medians of counts now show the .5, the LSQR iterations' too."""
    W, b, model, x = _linear_problem(0, examples=3)
    res = gauss_newton_attack(model, x, 0.1, draws=4, steps=2)                  # 3 x 4 problems
    steps = np.array([[4, 5, 4, 4], [6, 3, 6, 5], [7, 2, 4, 6]])                 # the audit's
    lsqr = np.array([[33, 34, 34, 34], [35, 33, 34, 36], [36, 33, 35, 33]])
    assert (np.median(steps), np.median(lsqr)) == (4.5, 34.0)
    lines = dataclasses.replace(res, steps=steps, lsqr_iterations=lsqr).summary().splitlines()
    line = next(x for x in lines if "accepted steps" in x)
    assert line.startswith("  accepted steps: median 4.5; converged ") and "per problem: median 34;" in line
    lsqr[0, 0] = 35                                                              # median 34.5
    line = dataclasses.replace(res, steps=steps * 0 + 4, lsqr_iterations=lsqr).summary()
    assert "accepted steps: median 4; " in line and f"per problem: median {np.median(lsqr):g};" in line


def test_per_mode_errors_are_the_statistics_of_the_dct_of_the_estimates_errors():
    """rmse, bias, std (ddof 1), bias_se = std/sqrt(draws) and mse, recomputed from the reported estimates:
    Q(θ̂ − θ) by scipy.fft.dctn (orthonormal DCT-II per channel), statistics by numpy over the draws."""
    import scipy.fft

    _, _, model, x = _linear_problem(8)
    draws = 5
    res = gauss_newton_attack(model, x, 0.3, draws=draws, steps=2, start="mean", seed=4)
    err = res.estimates.astype(np.float64) - x.numpy()[:, None]                    # (B, draws, 1, 4, 4)
    coords = scipy.fft.dctn(err, axes=(-2, -1), norm="ortho")
    np.testing.assert_allclose(res.rmse, np.sqrt((coords**2).mean(axis=1)), rtol=1e-12)
    np.testing.assert_allclose(res.bias, coords.mean(axis=1), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(res.std, coords.std(axis=1, ddof=1), rtol=1e-10)
    np.testing.assert_allclose(res.bias_se, coords.std(axis=1, ddof=1) / np.sqrt(draws), rtol=1e-10)
    np.testing.assert_allclose(res.mse, (err**2).reshape(2, -1).mean(axis=1), rtol=1e-12)
    assert np.all(np.abs(res.bias) > 0)  # the start is not the truth: signed errors to get right


def test_the_noise_of_example_e_is_the_documented_stream():
    """Z of example e: noise.sample(default_rng([seed, e, 1]), (draws, n)), i.e. σ·standard normals of that
    stream for the Gaussian; not Algorithm 1's start-vector stream default_rng([seed, e])."""
    Z = observation_noise(np.array([3, 7]), 4, 5, seed=2, noise=0.3)
    want = np.concatenate([0.3 * np.random.default_rng([2, e, 1]).standard_normal((4, 5)) for e in (3, 7)])
    np.testing.assert_array_equal(Z, want)


class _Wavy(torch.nn.Module):
    """Two inputs, three features, curved enough that full Gauss–Newton steps from far away overshoot."""

    def forward(self, x):
        t = x.flatten(1)
        return torch.stack([torch.sin(3 * t[:, 0]) + t[:, 1], torch.cos(2 * t[:, 1]), t[:, 0] * t[:, 1]], 1)


def _wavy_jacobian(t):
    return np.array([[3 * np.cos(3 * t[0]), 1.0], [0.0, -2 * np.sin(2 * t[1])], [t[1], t[0]]])


def _wavy(t):
    return np.array([np.sin(3 * t[0]) + t[1], np.cos(2 * t[1]), t[0] * t[1]])


@pytest.mark.parametrize("start, steps, tol", [("mean", 12, 1e-10), ("truth", 40, 1e-2)])
def test_levenberg_marquardt_schedule_against_a_numpy_oracle(start, steps, tol):
    """The documented schedule, written out with the exact Jacobian: δ = (JᵀJ + λ²I)⁻¹Jᵀr, accepted iff
    the residual norm drops; a rejection raises the level by one, an acceptance lowers it by one (not to
    0); λ = damping at level 0, else unit·10^level with unit = damping here (damping ≥ 1e-4·‖J‖_F); a
    draw stops on a relative step or gain under tol. Estimates, accepted and tried steps, the next λ and
    the whole residual history of every draw, which stays at its last value once the draw has stopped
    (with 40 steps and tol 1e-2 every draw stops early), and whether it converged."""
    x = torch.tensor([[[[0.3, -0.2]]], [[[1.1, 0.4]]]], dtype=torch.float64)
    sigma, draws, damping = 0.6, 6, 0.05
    res = gauss_newton_attack(_Wavy().eval(), x, sigma, draws=draws, steps=steps, damping=damping, start=start,
                              seed=3, basis="pixel", tol=tol)
    hist = np.empty((2, draws, steps + 1))
    for e in range(2):
        Z = sigma * np.random.default_rng([3, e, 1]).standard_normal((draws, 3))
        truth = x[e].reshape(2).numpy()
        for d in range(draws):
            X = _wavy(truth) + Z[d]
            est = (x.mean(dim=0) if start == "mean" else x[e]).reshape(2).numpy().copy()
            cost = np.linalg.norm(X - _wavy(est))
            level, lam, accepted, tried = 0, damping, 0, 0
            hist[e, d, 0] = cost
            running, converged = True, False
            for j in range(steps):
                if running:
                    J = _wavy_jacobian(est)
                    delta = np.linalg.solve(J.T @ J + lam**2 * np.eye(2), J.T @ (X - _wavy(est)))
                    cand = np.linalg.norm(X - _wavy(est + delta))
                    ok = cand < cost
                    old = cost
                    if ok:
                        est, cost, accepted = est + delta, cand, accepted + 1
                    tried += 1
                    level = max(level - 1, 0) if ok else level + 1
                    lam = damping if level == 0 else damping * 10.0**level
                    done = (np.linalg.norm(delta) <= tol * (np.linalg.norm(est) + tol)
                            or (ok and old - cand <= tol * old))
                    running, converged = not done and level <= 30, done
                hist[e, d, j + 1] = cost
            np.testing.assert_allclose(res.estimates[e, d].reshape(2), est, rtol=1e-7, atol=1e-9)
            assert (res.steps[e, d], res.iterations[e, d], res.converged[e, d]) == (accepted, tried, converged)
            np.testing.assert_allclose(res.damping[e, d], lam, rtol=1e-12)
    np.testing.assert_allclose(res.residual_history, hist, rtol=1e-7, atol=1e-12)
    assert np.any(res.iterations > res.steps) and np.any(res.damping > damping)  # rejections happened
    assert np.any(res.iterations < steps) and np.all(res.iterations < 40)  # draws stopped early (all of them at 40)


def test_the_first_damping_raise_is_a_thousandth_of_the_jacobians_frobenius_norm():
    """damping = 0: the first rejected step sets λ = max(10·damping, 1e-3·‖J‖_F) for the next one. Features
    sin(θ_i) of 400 inputs, J = diag(cos θ), ‖J‖_F = sqrt(Σ cos²θ) exactly; noise σ = 3 makes the first
    undamped step overshoot. Its Hutchinson estimate (4 Gaussian probes of 400 values) is within 15%."""

    class Sine(torch.nn.Module):
        def forward(self, t):
            return torch.sin(t.flatten(1))

    x = torch.rand(2, 1, 20, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 3 - 1.5
    res = gauss_newton_attack(Sine().eval(), x, 3.0, draws=4, steps=1, basis="pixel", seed=1)
    rejected = res.steps == 0
    assert rejected.any()
    fro = np.sqrt((np.cos(x.reshape(2, -1).numpy()) ** 2).sum(axis=1))
    ratio = res.damping / (1e-3 * fro[:, None])
    assert np.all((ratio[rejected] > 0.85) & (ratio[rejected] < 1.15)), ratio
    assert np.all(res.damping[~rejected] == 0)


def test_seeds_are_reproducible_and_independent_of_chunking():
    _, _, model, x = _linear_problem(3, examples=3)
    kw = dict(draws=3, steps=2, damping=1e-3)
    a = gauss_newton_attack(model, x, 0.2, seed=5, **kw)
    again = gauss_newton_attack(model, x, 0.2, seed=5, chunk_size=1, **kw)
    other = gauss_newton_attack(model, x, 0.2, seed=6, **kw)
    np.testing.assert_array_equal(a.estimates, gauss_newton_attack(model, x, 0.2, seed=5, **kw).estimates)
    # another chunking draws the same noise; only the rounding of batched matmuls may differ
    np.testing.assert_allclose(again.estimates, a.estimates, rtol=0, atol=1e-9)
    assert not np.allclose(a.estimates, other.estimates)
    # example e draws from its own stream: example 2 alone, with its global id, gives its rows
    alone = gauss_newton_attack(model, x[2:], 0.2, seed=5, example_ids=[2], **kw)
    np.testing.assert_allclose(alone.estimates[0], a.estimates[2], rtol=0, atol=1e-9)
    assert a.params["seed"] == 5 and a.params["start"] == "truth"


def test_progress_prints_one_line_per_chunk_with_an_eta_until_the_last(capsys):
    _, _, model, x = _linear_problem(3, examples=3)
    quiet = gauss_newton_attack(model, x, 0.2, draws=2, steps=1, chunk_size=1)
    assert capsys.readouterr().err == ""
    loud = gauss_newton_attack(model, x, 0.2, draws=2, steps=1, chunk_size=1, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(" done")[0] for line in lines] == [f"hcrfast.gauss_newton_attack: examples {k}/3" for k in (1, 2, 3)]
    assert all("ETA" in line for line in lines[:2]) and "ETA" not in lines[2]
    np.testing.assert_array_equal(loud.estimates, quiet.estimates)


def test_float32_relu_model_and_custom_start():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.ReLU(),
                                torch.nn.Linear(24, 24), torch.nn.ReLU()).eval()
    x = torch.rand(2, *SHAPE)
    sigma = hcrfast.rms_sigma(model(x).detach(), 0.1)
    start = torch.zeros(SHAPE)
    res = gauss_newton_attack(model, x, sigma, draws=4, steps=3, start=start)
    assert res.estimates.dtype == np.float32 and res.rmse.dtype == np.float64
    assert np.all(np.isfinite(res.rmse)) and res.params["start"] == "tensor"
    assert np.all(np.diff(res.residual_history, axis=2) <= 0)
    bnd = hcrfast.bound(model, x, sigma, iterations=2, restarts=2)
    c = compare(bnd, res)
    assert c["n_compared"] + c["n_bound_infinite"] + c["n_bound_zero"] == c["n_modes"] == 32


def test_compare_leaves_out_infinite_and_zero_bounds_and_checks_shapes(tmp_path):
    _, _, model, x = _linear_problem(4)
    res = gauss_newton_attack(model, x, 0.3, draws=3, steps=1, damping=0.0)
    std = np.full(res.rmse.shape, 0.1)
    std[0, 0, 0, 0] = np.inf
    std[1, 0, 0, 0] = 0.0
    c = compare(std, res, quantiles=(0.5,))
    assert c["n_bound_infinite"] == 1 and c["n_bound_zero"] == 1 and c["n_compared"] == c["n_modes"] - 2
    keep = np.isfinite(std) & (std > 0)
    assert c["median"] == pytest.approx(np.median(res.rmse[keep] / 0.1))
    assert c["quantiles"][0.5] == c["median"]
    with pytest.raises(ValueError, match="Shape mismatch"):
        compare(std[:1], res)
    pixel = hcrfast.bound(model, x, 0.3, iterations=1, restarts=1, basis="pixel")
    with pytest.raises(ValueError, match="basis"):
        compare(pixel, res)
    with pytest.raises(TypeError, match="AttackResult"):
        compare(std, res.rmse)
    assert isinstance(res, AttackResult)
    # bounds at another sigma (Bounds and TargetedBounds), or of a model with other features
    other_sigma = hcrfast.bound(model, x, 0.05, iterations=1, restarts=1)
    with pytest.raises(ValueError, match=r"other noise than the attack: 'Gaussian\(sigma=0.05\): .*' against "
                                         r"'Gaussian\(sigma=0.3\): "):
        compare(other_sigma, res)
    with pytest.raises(ValueError, match="same sigma or noise law"):
        compare(hcrfast.targeted_bound(model, x, 0.05, targets=[0]), res)
    # a sigma that describe()'s 6 digits do not tell apart
    with pytest.raises(ValueError, match=r"sigma = 0.3000001 but the attack for sigma = 0.3;"):
        compare(hcrfast.bound(model, x, 0.3000001, iterations=1, restarts=1), res)
    # a Monte Carlo law: the bound raises its confidence per restart inside; the pair still matches
    law = hcrfast.MonteCarlo(lambda z: -z**2 / (2 * 0.3**2) - np.log(0.3 * np.sqrt(2 * np.pi)),
                             lambda rng, shape: rng.normal(0, 0.3, shape), n_samples=500, name="normal(0.3)")
    mc_bound = hcrfast.bound(model, x, law, iterations=1, restarts=3)
    assert mc_bound.params["noise"] != mc_bound.params["noise_asked"]
    mc_attack = gauss_newton_attack(model, x, law, draws=2, steps=1)
    compare(mc_bound, mc_attack)
    mc_bound.save(tmp_path / "mc.npz")
    compare(hcrfast.Bounds.load(tmp_path / "mc.npz"), mc_attack)  # and read back from disk
    wider = torch.nn.Sequential(model, torch.nn.Linear(model(x).shape[1], 3).double()).eval()
    with pytest.raises(ValueError, match="computed with 3 features per example"):
        compare(hcrfast.bound(wider, x, 0.3, iterations=1, restarts=1), res)
    compare(hcrfast.bound(model, x, 0.3, iterations=1, restarts=1), res)  # the same: accepted


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(draws=0), ValueError, "draws must be at least 1"),
    (dict(steps=0), ValueError, "steps must be at least 1"),
    (dict(draws=2.5), TypeError, "draws must be an integer"),
    (dict(damping=-1e-3), ValueError, "damping must be a finite number >= 0"),
    (dict(damping=float("nan")), ValueError, "damping"),
    (dict(start=torch.zeros(2, 1, 4, 5, dtype=torch.float64)), ValueError, "Shape mismatch: start"),
    (dict(start=torch.zeros(3, 1, 4, 4, dtype=torch.float64)), ValueError, "Shape mismatch: start"),
    (dict(start=torch.zeros(2, 1, 4, 4)), TypeError, "dtype"),
    (dict(start=torch.full((1, 4, 4), float("nan"), dtype=torch.float64)), ValueError, "NaN"),
    (dict(start="median"), ValueError, "start must be one of"),
    (dict(start=np.zeros((2, 1, 4, 4))), TypeError, "start must be"),
    (dict(lsqr=hcrfast.LSQROptions(damp=0.1)), ValueError, "damping="),
    (dict(basis="wavelet"), ValueError, "basis"),
    (dict(seed=-1), ValueError, "seed"),
])
def test_bad_inputs_raise_clear_errors(kwargs, exc, match):
    _, _, model, x = _linear_problem(5)
    with pytest.raises(exc, match=match):
        gauss_newton_attack(model, x, 0.3, **kwargs)


def test_bad_sigma_raises():
    _, _, model, x = _linear_problem(5)
    with pytest.raises(ValueError, match="sigma"):
        gauss_newton_attack(model, x, 0.0)
    with pytest.raises(TypeError):
        gauss_newton_attack(model, x, "big")


def test_an_attack_that_takes_no_step_is_refused_not_reported_as_perfect():
    """At sigma = 1e20 against features of order 1 no Gauss-Newton step lowers a residual: every estimate
    stays at its start (the truth by default), whose error of 0 would read as a perfect attack."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(P, 12), torch.nn.Tanh(),
                                torch.nn.Linear(12, 6)).eval()
    x = torch.randn(2, *SHAPE)
    with pytest.raises(ValueError, match=r"took no step at any of its 6 draws \(Gaussian\(sigma=1e\+20\) against "
                                         r"features of RMS"):
        gauss_newton_attack(model, x, 1e20, draws=3, steps=2)
    assert np.any(gauss_newton_attack(model, x, 0.3, draws=3, steps=2).steps > 0)


def test_attack_results_save_and_load(tmp_path):
    _, _, model, x = _linear_problem(3)
    res = gauss_newton_attack(model, x, 0.3, draws=3, steps=2)
    res.save(tmp_path / "a.npz")
    back = AttackResult.load(tmp_path / "a.npz")
    for name in AttackResult._ARRAYS:
        np.testing.assert_array_equal(getattr(back, name), getattr(res, name), err_msg=name)
    assert back.params == json.loads(json.dumps(res.params)) and back.seconds == res.seconds
    assert back == res and back != dataclasses.replace(res, rmse=res.rmse + 1.0)
    assert compare(hcrfast.bound(model, x, 0.3, iterations=1, restarts=1), back)["n_modes"] == res.rmse.size
    hcrfast.bound(model, x, 0.3, iterations=1, restarts=1).save(tmp_path / "b.npz")
    with pytest.raises(ValueError, match=r"not a file written by AttackResult.save .*'hcrfast.AttackResult/1'"):
        AttackResult.load(tmp_path / "b.npz")


def test_attack_checkpoint_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
    from hcrfast import attack

    _, _, model, x = _linear_problem(4, examples=5)
    kw = dict(draws=3, steps=2, chunk_size=2)
    whole = gauss_newton_attack(model, x, 0.3, **kw)
    real, calls = attack._gauss_newton, []

    def crash_on_the_third_chunk(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attack, "_gauss_newton", crash_on_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        gauss_newton_attack(model, x, 0.3, checkpoint=tmp_path, **kw)
    monkeypatch.setattr(attack, "_gauss_newton", real)
    capsys.readouterr()
    again = gauss_newton_attack(model, x, 0.3, checkpoint=tmp_path, progress=True, **kw)
    assert again.params["checkpoint"]["examples_read_back"] == 4
    assert "hcrfast.gauss_newton_attack: 4 of 5 examples read back" in capsys.readouterr().err
    for name in AttackResult._ARRAYS:
        np.testing.assert_array_equal(getattr(again, name), getattr(whole, name), err_msg=name)
    with pytest.raises(hcrfast.CheckpointMismatchError, match="draws: 3 -> 4"):
        gauss_newton_attack(model, x, 0.3, checkpoint=tmp_path, **dict(kw, draws=4))


def test_an_attack_on_a_model_blind_to_its_input_is_refused_with_that_cause():
    """J = 0: every step is 0, which counts as converged; the estimates stay at the truth (error 0)."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(P, 6)).double().eval()
    with torch.no_grad():
        model[1].weight.zero_()
    x = torch.randn(2, *SHAPE, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"took no step: the model's features do not move with its input \(J = 0"):
        gauss_newton_attack(model, x, 0.3, draws=3, steps=2)


def test_by_default_the_attack_is_least_squares_whatever_the_inputs_scale():
    """A linear model on badly scaled inputs (J's singular values 3e-3 .. 3e-5): the default attack lands
    on the least-squares estimate of each draw (as the README says), not on a ridge one that shrinks
    the small directions towards the true input (absolute damping 1e-3 did: std 0.2x the exact one)."""
    rng = np.random.default_rng(4)
    W = matrix_with_condition(rng, N, P, 100.0) * 1e-3
    b = rng.standard_normal(N)
    model, x = linear_model(W, b, SHAPE), torch.as_tensor(rng.standard_normal((2,) + SHAPE))
    sigma, draws = 1e-4, 8
    res = gauss_newton_attack(model, x, sigma, draws=draws, steps=3, seed=5)
    X = _observations(W, b, x, draws, sigma, seed=5)
    ls = np.linalg.lstsq(W, (X - b).T, rcond=None)[0].T.reshape(res.estimates.shape)
    np.testing.assert_allclose(res.estimates, ls, rtol=1e-6, atol=1e-8 * np.abs(ls).max())


def test_compare_matches_a_monte_carlo_law_by_its_name_and_warns_when_it_has_none():
    """The attack only samples the law: a scipy law at another confidence is the same law; two laws of
    other names are refused; two unnamed custom densities may differ, which compare says."""
    import scipy.stats as st

    W, b, model, x = _linear_problem(6)
    kw = dict(n_samples=300, pilot_samples=64)
    res = hcrfast.bound(model, x, hcrfast.MonteCarlo.from_scipy(st.logistic(scale=0.3), **kw), restarts=2,
                        iterations=1)
    other_confidence = hcrfast.MonteCarlo.from_scipy(st.logistic(scale=0.3), confidence=0.95, **kw)
    compare(res, gauss_newton_attack(model, x, other_confidence, draws=3, steps=1))
    with pytest.raises(ValueError, match="the bounds are for other noise than the attack"):
        compare(res, gauss_newton_attack(model, x, hcrfast.MonteCarlo.from_scipy(st.logistic(scale=3.0), **kw),
                                         draws=3, steps=1))

    def unnamed(scale):
        d = st.logistic(scale=scale)
        return hcrfast.MonteCarlo(d.logpdf, lambda rng, shape: d.rvs(size=shape, random_state=rng), **kw)

    res = hcrfast.bound(model, x, unnamed(0.3), restarts=2, iterations=1)
    with pytest.warns(UserWarning, match=r"both use an unnamed Monte Carlo density .*cannot tell whether they are "
                                         r"the same law"):
        compare(res, gauss_newton_attack(model, x, unnamed(30.0), draws=3, steps=1))


def test_progress_speaks_from_inside_a_long_chunk(capsys, monkeypatch):
    """One chunk of the automatic size can run for minutes: lines come from its iterations too (at most
    every algorithm._PROGRESS_EVERY seconds, 0 here), and the results are the quiet run's."""
    from hcrfast import algorithm

    _, _, model, x = _linear_problem(3, examples=3)
    quiet = gauss_newton_attack(model, x, 0.2, draws=2, steps=2)
    monkeypatch.setattr(algorithm, "_PROGRESS_EVERY", 0.0)
    loud = gauss_newton_attack(model, x, 0.2, draws=2, steps=2, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(r"hcrfast.gauss_newton_attack: examples 0-2 of 3: Gauss-Newton step 1/2, 6 of 6 draws running "
                        r"\(\d+\.\d s\)", lines[0]), lines
    assert lines[-1].startswith("hcrfast.gauss_newton_attack: examples 3/3 done")
    np.testing.assert_array_equal(loud.estimates, quiet.estimates)


def test_no_step_in_few_iterations_names_more_steps_as_the_fix():
    """A ReLU CNN at sigma = its features' RMS: the first undamped steps are rejected and two steps do
    not give the damping room to rise; the message names more steps (sigma is already at scale), and
    with them the attack runs."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(4, 4, 3, padding=1)).eval()
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), 1.0)
    with pytest.raises(ValueError, match=r"in steps=2, .* more steps \(steps=10\) may find one"):
        gauss_newton_attack(model, x, sigma, draws=2, steps=2)
    assert np.any(gauss_newton_attack(model, x, sigma, draws=2, steps=10).steps > 0)


def test_a_float16_function_names_both_settings_it_needs_at_once():
    """A function (not a Module) cannot be copied to float32, as hcrfast.bound leaves it too: it runs in float16
    with the tolerances passed by hand, and the refusal without them says why model.float() is not at hand."""
    _, _, model, x = _linear_problem(3)
    model, x = model.half(), x.half()
    function = lambda t: model(t)   # noqa: E731
    with pytest.raises(NotImplementedError, match=r"no default tolerances for torch.float16 .* pass tol=1e-3 and "
                                                  r"lsqr=hcrfast.LSQROptions\(atol=1e-3, btol=1e-3\) .* a function "
                                                  r"cannot be copied"):
        gauss_newton_attack(function, x, 0.2, draws=2, steps=2)
    with pytest.raises(NotImplementedError, match=r"pass lsqr=hcrfast.LSQROptions\(atol=1e-3, btol=1e-3\) \("):
        gauss_newton_attack(function, x, 0.2, draws=2, steps=2, tol=1e-3)
    res = gauss_newton_attack(function, x, 0.2, draws=2, steps=2, tol=1e-3,
                              lsqr=hcrfast.LSQROptions(atol=1e-3, btol=1e-3))
    assert np.all(np.isfinite(res.rmse))
    assert res.params["dtype"] == "float16" and res.estimates.dtype == np.float16


@pytest.mark.parametrize("start", ["truth", "mean", "tensor"])
def test_a_float16_module_is_attacked_as_its_float32_copy_with_one_warning(start):
    """The attack refused a float16 Module (no default tolerances) where hcrfast.bound solves a float32 copy. It
    now runs the same copy: the attack of model.float() on batch.float() to the bit, float32 estimates, one
    warning that names the attack (not the bound's "certifies the bounds") and float32. One undamped step from
    the truth is the least-squares solution of the float16 weights (an exact oracle, in float64). The user's
    model and batch stay float16."""
    W, b, model, x = _linear_problem(3)
    model, x = model.half(), x.half()
    first = x[0] + 0.25
    kw = dict(draws=3, steps=1, seed=5, basis="pixel",
              start=first if start == "tensor" else start)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = gauss_newton_attack(model, x, 0.2, **kw)
    said = [str(w.message) for w in seen if "float16" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith("the model (") and "and batch are float16: gauss_newton_attack ran on a float32 copy" in said[0]
    assert "bound" not in said[0]
    kw["start"] = first.float() if start == "tensor" else start
    same = gauss_newton_attack(copy.deepcopy(model).float(), x.float(), 0.2, **kw)   # (.float() is in place)
    for key in ("estimates", "rmse", "bias", "std", "mse", "residual_norm", "steps", "damping"):
        np.testing.assert_array_equal(getattr(res, key), getattr(same, key), err_msg=key)
    assert res.estimates.dtype == np.float32 and res.rmse.dtype == np.float64
    assert res.params["dtype"] == "float32"
    assert next(model.parameters()).dtype == torch.float16 and x.dtype == torch.float16
    if start == "truth":
        W16 = model[1].weight.detach().double().numpy()
        b16 = model[1].bias.detach().double().numpy()
        X = _observations(W16, b16, x.double(), 3, 0.2, seed=5)
        ls = np.linalg.lstsq(W16, (X - b16).T, rcond=None)[0].T
        np.testing.assert_allclose(res.estimates.reshape(-1, P), ls, atol=1e-4, rtol=0)


def test_rejected_steps_do_not_make_the_attack_depend_on_chunking():
    """The damping unit came from LSQR's anorm, which rounding inflates past ‖J‖_F: chunk_size moved estimates by 1e-2."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh(), torch.nn.Linear(20, 12),
                                torch.nn.Tanh()).double().eval()
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.mul_(1.5)
    torch.manual_seed(2)
    x = torch.randn(4, 1, 4, 4, dtype=torch.float64)
    kw = dict(draws=3, steps=4, seed=11)
    a = gauss_newton_attack(model, x, 0.1, chunk_size=1, **kw)
    b = gauss_newton_attack(model, x, 0.1, chunk_size=4, **kw)
    assert np.any(a.iterations > a.steps)  # the rejection path ran
    np.testing.assert_allclose(a.estimates, b.estimates, rtol=0, atol=1e-8)
    with pytest.warns(UserWarning, match="never left their start"):
        out = hcrfast.compare(np.full(a.rmse.shape, 0.05), gauss_newton_attack(model, x, 0.1, draws=3, steps=1, seed=11))
    assert out["n_draws_unmoved"] > 0


def test_a_jacobian_the_fixed_norm_probes_do_not_see_still_gets_a_damping_unit(monkeypatch):
    """Features of x_1 - x_13 alone: sign probes that agree at 1 and 13 gave J v = 0 for every probe though
    J != 0, and a unit of 0 left the damping at 0, so every draw whose first step was rejected never moved.
    Gaussian probes see it; were the estimate still 0, LSQR's norm estimate gives the unit."""
    from hcrfast import attack

    class Difference(torch.nn.Module):
        def forward(self, x):
            d = x.flatten(1)[:, 1] - x.flatten(1)[:, 13]
            return torch.stack([torch.sin(20 * d), torch.cos(20 * d)], 1)

    x = torch.rand(4, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    kw = dict(draws=16, steps=10, seed=1, basis="pixel")
    for blind in (False, True):
        if blind:
            monkeypatch.setattr(attack, "_frobenius_estimate", lambda model, points, **_: torch.zeros(len(points),
                                                                                                  dtype=torch.float64).numpy())
        res = gauss_newton_attack(Difference().eval(), x, 1.0, **kw)
        assert np.any(res.iterations > res.steps)  # steps were rejected
        assert np.all(res.damping[res.iterations > res.steps] > 0) and np.all(res.steps > 0)


def test_a_problem_whose_steps_are_all_rejected_stops_at_the_damping_cap(monkeypatch):
    """Features θ + K·|θ − θ₀| with K = 1e6 on example 1 only (autograd's derivative of |·| at 0 is 0, so
    J = I there while every real step costs K·|δ|): each of its steps is rejected and the damping rises a
    level each time. Past MAX_DAMPING_LEVEL levels in a row the problem stops, without converging: with the
    cap at 3 after 4 tries, while with the default cap it goes on until its damped step is below tol.
    Example 0 (K = 0, a plain identity) takes its steps either way."""
    from hcrfast import attack

    x = torch.rand(2, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[0, 0, 0, 0], x[1, 0, 0, 0] = 0.0, 1.0

    class PerExample(torch.nn.Module):  # the kink keyed on the input's own marker pixel (examples independent)
        def forward(self, t):
            marker = (t[:, :1, :1, :1] > 0.5).to(t)
            anchor = torch.where(marker > 0, x[1:2], x[0:1])
            return (t + 1e6 * marker * (t - anchor).abs()).flatten(1)

    model = PerExample().eval()
    monkeypatch.setattr(attack, "MAX_DAMPING_LEVEL", 3)
    capped = gauss_newton_attack(model, x, 0.1, draws=3, steps=40, basis="pixel", seed=2)
    assert np.all(capped.steps[1] == 0) and np.all(capped.iterations[1] == 4) and not capped.converged[1].any()
    assert np.all(capped.steps[0] >= 1) and capped.converged[0].all()
    monkeypatch.undo()
    default = gauss_newton_attack(model, x, 0.1, draws=3, steps=40, basis="pixel", seed=2)
    assert np.all(default.steps[1] == 0) and np.all(default.iterations[1] > 4) and default.converged[1].all()


def test_start_mean_of_one_example_is_refused_and_compare_takes_one_quantile():
    """start="mean" with one example started from the example itself (the mean of one: start="truth"), and the
    CLI's report read it as an attacker that knew nothing beating the bound. Refused now, naming the fix.
    compare(quantiles=0.5) raised "'float' object is not iterable"."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh()).double().eval()
    x = torch.randn(1, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"start='mean' with a batch of one example .* pass start='truth'"):
        hcrfast.gauss_newton_attack(m, x, 0.05, draws=4, steps=3, start="mean", basis="pixel")
    x = torch.randn(3, 6, dtype=torch.float64)
    a = hcrfast.gauss_newton_attack(m, x, 0.05, draws=4, steps=3, start="mean", basis="pixel")
    b = hcrfast.bound(m, x, 0.05, restarts=2, iterations=2, basis="pixel")
    one = hcrfast.compare(b, a, quantiles=0.5)
    assert one["quantiles"] == {0.5: hcrfast.compare(b, a, quantiles=(0.5,))["quantiles"][0.5]}
    with pytest.raises(ValueError, match=r"quantiles must lie in \[0, 1\], got \(1.5,\)"):
        hcrfast.compare(b, a, quantiles=1.5)
    # the share below 1 an efficient unbiased attacker would show against an exact bound: over one half
    assert one["fraction_below_1_efficient"] == pytest.approx(chi2.cdf(4, 4), rel=1e-12) and chi2.cdf(4, 4) > 0.5


def test_compare_refuses_quantiles_and_bounds_that_are_not_numbers_by_name():
    """quantiles=None read as NaN ("must lie in [0, 1], got (nan,)"), [[0.5]] raised a raw TypeError, '0.5'
    was parsed as a number and (True,) became 1.0; compare("x", attack) raised "could not convert string to
    float". Each is now refused naming the argument and what it takes."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh()).double().eval()
    x = torch.randn(2, 6, dtype=torch.float64)
    a = hcrfast.gauss_newton_attack(m, x, 0.05, draws=2, steps=2, basis="pixel")
    std = np.full(a.rmse.shape, 0.05)
    for bad in (None, [[0.5]], "0.5", (True,), np.array([[0.5]]), (0.5, "0.9")):
        with pytest.raises(TypeError, match=r"quantiles must be quantile levels in \[0, 1\]: a number or a flat "
                                            r"sequence of numbers, got .*; pass e\.g\. quantiles="):
            compare(std, a, quantiles=bad)
    for bad in ("x", None, [["a", "b"]], np.ones(a.rmse.shape, dtype=bool)):
        with pytest.raises(TypeError, match=r"bounds must be an hcrfast\.Bounds, hcrfast\.TargetedBounds or an "
                                            r"array of per-mode std bounds, got "):
            compare(bad, a)
    # numbers of every kind still do: NumPy scalars and 0-d arrays, lists, tensors
    levels = compare(std.tolist(), a, quantiles=[np.float32(0.5), np.array(0.25), 1])["quantiles"]
    assert list(levels) == [0.5, 0.25, 1.0]
    assert list(compare(torch.as_tensor(std), a, quantiles=torch.tensor([0.5]))["quantiles"]) == [0.5]


def test_bfloat16_is_refused_in_words_for_the_attack():
    """The batch checks' refusal said "bounds are certified in float64 either way", which speaks of bounds, not
    of an attack: the attack's own says what it has defaults for and how to run it."""
    _, _, model, x = _linear_problem(3)
    with pytest.raises(TypeError, match=r"^batch is torch\.bfloat16, which the attack's arrays \(NumPy, CuPy\) "
                                        r"cannot hold; run the attack in float32: pass model\.float\(\) and "
                                        r"batch\.float\(\) \(float32 and float64 are the dtypes it has default "
                                        r"tolerances for\)$"):
        gauss_newton_attack(model.bfloat16(), x.bfloat16(), 0.2, draws=2, steps=1)


def test_the_progress_entry_of_the_docstring_names_every_line_the_attack_prints():
    """It said "one line per finished chunk", but lines also come from inside a chunk's iterations (at most
    every algorithm._PROGRESS_EVERY seconds), where a chunk is halved and where a checkpoint gave examples back
    (test_progress_speaks_from_inside_a_long_chunk and the checkpoint tests check the lines themselves)."""
    from hcrfast import algorithm

    entry = re.search(r"\n    progress : bool\n(.*?)\n    \w+ :", gauss_newton_attack.__doc__, re.S).group(1)
    entry = " ".join(entry.split())
    assert "a line per finished chunk (examples done, elapsed seconds, ETA)" in entry, entry
    assert (f"lines from inside a chunk's Gauss–Newton iterations, at most one every "
            f"{algorithm._PROGRESS_EVERY:g} s (the chunk's examples, its Gauss–Newton step, the draws still "
            f"running)") in entry, entry
    assert "halved for memory" in entry and "``checkpoint`` gave examples back" in entry, entry


def test_compare_takes_a_targeted_bounds_every_mode_bound_not_its_zeros_for_untargeted_modes():
    """TargetedBounds.std is 0 for the modes not targeted: compare counted them as vacuous bounds and put
    those zeros in mse_from_modes. It takes std_every_mode (every mode's best bound from all the steps, what
    bound(targets=) takes): the counts, the ratios and mse_ratio_median are numpy's on std_every_mode."""
    _, _, model, x = _linear_problem(4)
    sigma = 0.3
    tb = hcrfast.targeted_bound(model, x, sigma, targets="low:2")
    att = gauss_newton_attack(model, x, sigma, draws=3, steps=1)
    c = compare(tb, att)
    every = tb.std_every_mode
    assert np.count_nonzero(tb.std == 0) > 0 and c["n_bound_zero"] == np.count_nonzero(every == 0)
    assert c["n_bound_zero"] < np.count_nonzero(tb.std == 0)
    keep = np.isfinite(every) & (every > 0)
    assert c["n_bound_infinite"] == np.count_nonzero(np.isinf(every))
    assert c["n_compared"] == np.count_nonzero(keep)
    assert c["median"] == pytest.approx(np.median(att.rmse[keep] / every[keep]), rel=1e-12)
    mse_bound = (every.reshape(len(x), -1) ** 2).mean(axis=1)
    assert np.all(np.isfinite(mse_bound) & (mse_bound > 0))
    assert c["mse_ratio_median"] == pytest.approx(np.median(att.mse / mse_bound), rel=1e-12)
    # the array itself gives the same; Bounds and arrays still use .std and the array
    assert compare(every, att) == c


def test_the_attack_takes_its_noise_as_sigma_too_and_refuses_it_twice():
    """Every other entry point names the noise sigma: gauss_newton_attack(m, x, sigma=0.1) failed with
    "missing a required argument: 'noise_or_sigma'". sigma= gives what the third argument gives (one number,
    or one std per feature, which the per-feature wrapper must still see); noise_or_sigma= still works; both
    at once, or neither, are refused by name."""
    import inspect

    _, _, model, x = _linear_problem(3)
    kw = dict(draws=2, steps=1, seed=4)
    want = gauss_newton_attack(model, x, 0.2, **kw)
    for got in (gauss_newton_attack(model, x, sigma=0.2, **kw), gauss_newton_attack(model, x, noise_or_sigma=0.2, **kw),
                gauss_newton_attack(model=model, batch=x, sigma=0.2, **kw)):
        np.testing.assert_array_equal(got.estimates, want.estimates)
        assert got.params == want.params
    stds = np.linspace(0.1, 0.3, N)
    per_feature = gauss_newton_attack(model, x, sigma=stds, **kw)
    np.testing.assert_array_equal(per_feature.estimates, gauss_newton_attack(model, x, stds, **kw).estimates)
    assert per_feature.params["sigma"] is None and "per feature" in per_feature.params["noise"]
    with pytest.raises(TypeError, match=r"^hcrfast\.gauss_newton_attack\(\): the noise was given twice, "
                                        r"noise_or_sigma=0\.2 and sigma=0\.3; pass one of them"):
        gauss_newton_attack(model, x, 0.2, sigma=0.3, **kw)
    with pytest.raises(TypeError, match=r"given twice, noise_or_sigma of dtype float64 and shape \(24,\) and "
                                        r"sigma=0\.3;"):
        gauss_newton_attack(model, x, noise_or_sigma=stds, sigma=0.3, **kw)
    with pytest.raises(TypeError, match=r"^hcrfast\.gauss_newton_attack\(\): missing a required argument: 'sigma' "
                                        r".*pass sigma=\.\.\. or the noise as the third argument"):
        gauss_newton_attack(model, x, **kw)
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'noise'; its arguments are model, "
                                        r"batch, noise_or_sigma, sigma, draws, "):
        gauss_newton_attack(model, x, noise=0.2, **kw)
    params = inspect.signature(gauss_newton_attack).parameters
    assert params["sigma"].kind is inspect.Parameter.KEYWORD_ONLY


def test_params_record_the_ids_chunk_size_threads_and_versions_a_rerun_needs():
    """example_ids [0, 1] and [7, 8] drew other noise, so other estimates, with identical params: params["run"]
    records them (and the chunk size, torch's thread count, the versions); == leaves it out."""
    import hashlib

    _, _, model, x = _linear_problem(0)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = gauss_newton_attack(model, x, 0.5, draws=3, steps=2)
    finally:
        torch.set_num_threads(threads)
    b = gauss_newton_attack(model, x, 0.5, draws=3, steps=2, example_ids=[7, 8])
    c = gauss_newton_attack(model, x, 0.5, draws=3, steps=2, chunk_size=1)
    assert not np.array_equal(a.mse, b.mse)
    digest = {ids: hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()[:16] for ids in ((0, 1), (7, 8))}
    assert a.params["run"]["example_ids"] == dict(count=2, first=0, last=1, sha256=digest[0, 1], ids=[0, 1])
    assert b.params["run"]["example_ids"] == dict(count=2, first=7, last=8, sha256=digest[7, 8], ids=[7, 8])
    assert (a.params["run"]["chunk_size"], c.params["run"]["chunk_size"]) == (2, 1)
    assert a.params["run"]["torch_threads"] == 1 and b.params["run"]["torch_threads"] == threads
    assert a.params["run"]["versions"]["torch"] == torch.__version__
    assert {k: v for k, v in a.params.items() if k != "run"} == {k: v for k, v in b.params.items() if k != "run"}


def test_the_run_record_survives_save_and_load(tmp_path):
    _, _, model, x = _linear_problem(1)
    res = gauss_newton_attack(model, x, 0.5, draws=2, steps=2, example_ids=[3, 5])
    res.save(tmp_path / "a.npz")
    back = AttackResult.load(tmp_path / "a.npz")
    assert back.params["run"] == res.params["run"] and back == res
    back.params["run"] = dict(back.params["run"], torch_threads=64)
    assert back == res   # recorded, not compared


def test_an_attack_on_features_and_sigma_scaled_together_is_the_same_attack():
    """Features ~1e-200 (float64) with sigma to match are the problem of features ~1: the attack took no step
    (its squares underflowed) and its refusal put the features' RMS at 0. It now runs on the features divided
    by sigma, with its residuals given back in the model's units; where sigma is far from the features, the
    refusal gives their RMS in those units."""
    from test_bound import _Times

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).double().eval()
    x = torch.randn(2, 6, dtype=torch.float64)
    kw = dict(draws=2, steps=3, basis="pixel")
    base = gauss_newton_attack(net, x, 0.1, **kw)
    got = gauss_newton_attack(_Times(net, 1e-200).eval(), x, 1e-201, **kw)
    np.testing.assert_allclose(got.rmse, base.rmse, rtol=1e-6)
    np.testing.assert_allclose(got.residual_norm / 1e-200, base.residual_norm, rtol=1e-6)
    np.testing.assert_allclose(got.residual_history / 1e-200, base.residual_history, rtol=1e-6)
    assert got.params["sigma"] == 1e-201 and got.params["noise"] == base.params["noise"].replace("0.1", "1e-201")
    with torch.no_grad():
        rms = float(np.sqrt(np.mean(net(x).numpy() ** 2))) * 1e-200
    with pytest.raises(ValueError, match=f"against features of RMS {rms:.3g}\\)"):
        gauss_newton_attack(_Times(net, 1e-200).eval(), x, 1e-150, draws=2, steps=2, basis="pixel")


def test_the_attack_s_damping_is_read_in_the_units_of_the_call():
    """The damping lambda weighs ||delta|| against the residual: with the features divided by a sigma far from 1
    it was passed as given, 1e20 times too strong for the divided J, and the attack took no step. Features and
    sigma and damping scaled by one c give the c = 1 estimates, and the per-problem lambda in the call's units."""
    from test_bound import _Times

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    x = torch.randn(2, 6)
    kw = dict(draws=2, steps=3, basis="pixel")
    base = gauss_newton_attack(net, x, 0.1, damping=0.5, **kw)
    c = 1e20
    got = gauss_newton_attack(_Times(net, c).eval(), x, 0.1 * c, damping=0.5 * c, **kw)
    np.testing.assert_allclose(got.rmse, base.rmse, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(got.damping) / c, base.damping, rtol=1e-4)
    assert got.params["damping"] == 0.5 * c


def test_an_attack_on_inputs_scaled_by_c_is_the_same_attack_in_other_units():
    """Inputs times c with a model that divides them by c first: at c = 1e-20 the attack's RMS error came out 59%
    off the c = 1 one (float32 LSQR steps overflowing), and at 1e30 it took no step. The batch (and a start
    tensor) now run divided by a power of two; errors and estimates come back in the batch's units."""
    from test_bound import _DividesInputs

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    x = torch.randn(2, 6)
    kw = dict(draws=2, steps=3, basis="pixel")
    for start in ("truth", 1.01):
        base = gauss_newton_attack(net, x, 0.1, start="truth" if start == "truth" else x * start, **kw)
        for c in (1e-20, 1e30):
            got = gauss_newton_attack(_DividesInputs(net, c).eval(), x * c, 0.1,
                                      start="truth" if start == "truth" else x * c * start, **kw)
            np.testing.assert_allclose(got.rmse / c, base.rmse, rtol=1e-4)
            np.testing.assert_allclose(got.mse / c ** 2, base.mse, rtol=2e-4)
            np.testing.assert_allclose(np.asarray(got.estimates) / c, base.estimates, rtol=1e-4, atol=1e-5)
            k = math.log2(got.params["inputs_divided_by"])   # a power of two near the batch's typical magnitude
            assert k == round(k) and abs(k - math.log2(c)) < 4


def test_compare_warns_where_most_draws_stopped_at_the_step_cap_and_the_cli_line_says_how_many_converged():
    """An attack from the truth whose draws all stopped at the step cap (ResNet-18, 4 images: 0 of 8 converged)
    was reported as '100% below 1' with no word that none converged; its estimates stop near the truth. compare
    warns now, and the CLI's line gives the share that converged."""
    from hcrfast._bound_cli import _attack_line

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.Tanh(),
                                torch.nn.Linear(24, 24), torch.nn.Tanh()).double().eval()
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64)
    short = gauss_newton_attack(model, x, 0.1, draws=2, steps=1, seed=3)
    stopped = int((~np.asarray(short.converged) & (np.asarray(short.steps) > 0)).sum())
    assert stopped >= 4 and not np.asarray(short.converged).any()   # most draws stepped, none converged
    bounds = hcrfast.bound(model, x, 0.1, restarts=2, iterations=2, seed=0)
    with pytest.warns(UserWarning, match=rf"{stopped} of 6 attack draws had not converged when their 1 Gauss-Newton "
                                         r"steps ran out.*start='truth'.*steps=2"):
        c = hcrfast.compare(bounds, short)
    assert c["fraction_converged"] == 0.0
    args = type("Args", (), dict(attack=2, attack_start="truth"))()
    assert "; 0% of the draws converged (the others stopped at --attack-steps)" in _attack_line(c, args)
    done = gauss_newton_attack(model, x, 0.1, draws=2, steps=30, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = hcrfast.compare(bounds, done)
    assert "converged (the others" not in _attack_line(c, args)


def test_progress_speaks_inside_a_long_gauss_newton_step(capfd, monkeypatch):
    """The attack printed nothing inside a Gauss-Newton step (220 s on a ResNet-18 trunk, where bound's chunks
    have a heartbeat every 30 s): bound's heartbeat runs around the attack's chunks too, in its own words, and
    changes nothing of the result."""
    import threading
    import time

    from hcrfast import algorithm

    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh())

        def forward(self, t):
            time.sleep(0.05)
            return self.net(t)

    monkeypatch.setattr(algorithm, "_HEARTBEAT_EVERY", 0.2)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = Slow().double().eval()
    quiet = gauss_newton_attack(model, x, 0.3, draws=2, steps=3, seed=0)
    capfd.readouterr()
    loud = gauss_newton_attack(model, x, 0.3, draws=2, steps=3, seed=0, progress=True)
    lines = [line for line in capfd.readouterr().err.splitlines() if "into this chunk" in line]
    assert lines, "no heartbeat"
    assert all(re.match(r"hcrfast\.gauss_newton_attack: examples 0-1 of 2: .+, \d+ s into this chunk \(\d+\.\d s\)$",
                        line) for line in lines), lines
    np.testing.assert_array_equal(loud.estimates, quiet.estimates)
    assert not [t for t in threading.enumerate() if t.name == "hcrfast-heartbeat"]
