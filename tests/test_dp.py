"""DP-SGD reconstruction bounds (hcrfast.dp) against oracles written elsewhere.

Oracles: scipy.special.gammainc / digamma, scipy.stats (chi2, ncx2, nct, norm,
pearsonr), np.corrcoef, seeded Monte Carlo of the linear-layer attack
written out here in full N-dimensional form (not through the reductions the
module uses), and, for the extreme regimes, the formulas evaluated in mpmath
at 50 digits (the finite-N NCC mean through its closed form with 1F1, which
the module does not use).
"""
from __future__ import annotations

import csv
import io
import math
import re
import sys

import numpy as np
import pytest
from scipy import special, stats

from hcrfast import dp
from hcrfast.cli import main


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    return load_digits().images[:200].astype(np.float64) / 16.0


def _attack_by_hand(X, sigma, C, T, rng, draws):
    """``draws`` reconstructions of the rows of X, T observations averaged explicitly."""
    beta = np.minimum(1.0, C / np.linalg.norm(X, axis=-1, keepdims=True))
    obs = beta * X + rng.normal(0.0, C * sigma, size=(T,) + np.broadcast_shapes((draws, 1), X.shape))
    return obs.mean(axis=0), beta


def _pearson_rows(a, b):
    return stats.pearsonr(a, b, axis=-1).statistic


# ---------------------------------------------------------------- closed forms
def test_effective_sigma():
    assert dp.effective_sigma(sigma=2.0, T=16) == pytest.approx(0.5)
    assert dp.effective_sigma(sigma=0.3, T=1) == pytest.approx(0.3)


@pytest.mark.parametrize("beta", [1.0, 0.6, 0.2])
def test_expected_mse_matches_noncentral_chi2_mean(beta):
    sigma, C, T, N = 0.7, 2.0, 5, 50
    sq_norm = 9.0
    s2 = (C * sigma) ** 2 / T
    lam = (1 - beta) ** 2 * sq_norm / s2
    oracle = s2 / N * stats.ncx2(N, lam).mean() if lam > 0 else s2 / N * stats.chi2(N).mean()
    got = dp.expected_mse(sigma=sigma, C=C, T=T, beta=beta, mean_square=sq_norm / N)
    assert got == pytest.approx(oracle, rel=1e-12)
    assert got >= dp.mse_lower_bound(sigma=sigma, C=C, T=T) - 1e-15
    assert dp.mse_noncentrality(sigma=sigma, C=C, T=T, beta=beta, sq_norm=sq_norm) == pytest.approx(lam)


def test_mse_lower_bound_scaling():
    assert dp.mse_lower_bound(sigma=0.5, C=3.0) == pytest.approx(2.25)
    assert dp.mse_lower_bound(sigma=0.5, C=3.0, T=9) == pytest.approx(0.25)


def test_psnr_upper_bound_formula_and_jensen_term():
    sigma, C, T, R = 0.25, 2.0, 4, 0.8
    method = 20 * math.log10(R) - 20 * math.log10(C * sigma) + 10 * math.log10(T)
    assert dp.psnr_upper_bound(sigma=sigma, C=C, T=T, data_range=R) == pytest.approx(method, rel=1e-12)
    # E[PSNR] without clipping: 10 log10 R^2 - E[10 log10 MSE], MSE = s^2/N chi2_N,
    # the log-mean taken by numerical integration against the chi2 density.
    for N in (2, 7, 64):
        s2 = (C * sigma) ** 2 / T
        e_log = stats.chi2(N).expect(np.log)
        exact = 10 * math.log10(R**2) - 10 / math.log(10) * (math.log(s2 / N) + e_log)
        got = dp.psnr_upper_bound(sigma=sigma, C=C, T=T, data_range=R, N=N)
        assert got == pytest.approx(exact, abs=1e-7)
        assert got > method


def test_ncc_expected_population_formula_large_n():
    # Population value: the correlation of beta*x + noise with x for many i.i.d. coordinates.
    rng = np.random.default_rng(1)
    sigma, C, T, beta, var = 0.4, 1.5, 3, 0.7, 0.36
    x = rng.normal(0.3, math.sqrt(var), 2_000_000)
    y = beta * x + rng.normal(0, C * sigma / math.sqrt(T), x.size)
    got = dp.ncc_expected(sigma=sigma, C=C, T=T, beta=beta, variance=var)
    assert got == pytest.approx(np.corrcoef(x, y)[0, 1], abs=2e-3)


def test_ncc_expected_finite_n_matches_full_monte_carlo():
    rng = np.random.default_rng(2)
    N, sigma, C = 8, 0.5, 1.0
    X = rng.normal(0.2, 1.0, N)
    Xhat, beta = _attack_by_hand(X, sigma, C, 1, rng, draws=40_000)
    r = _pearson_rows(np.broadcast_to(X, Xhat.shape), Xhat)
    got = dp.ncc_expected(sigma=sigma, C=C, beta=float(beta[0]), variance=float(X.var()), N=N)
    assert abs(r.mean() - got) < 3 * r.std() / math.sqrt(r.size) + 1e-4
    # The population formula is off by O(1/N) here, and the test can tell.
    pop = dp.ncc_expected(sigma=sigma, C=C, beta=float(beta[0]), variance=float(X.var()))
    assert abs(r.mean() - pop) > 3 * r.std() / math.sqrt(r.size)


def test_ncc_upper_bound_is_population_value_at_worst_case():
    sigma, C, T, N = 0.3, 2.0, 4, 100
    want = 1 / math.hypot(1.0, sigma * math.sqrt(N / T))
    assert dp.ncc_upper_bound(sigma=sigma, N=N, T=T) == pytest.approx(want, rel=1e-12)
    # Worst clipped example: beta^2 Var = C^2/N.
    at_worst = dp.ncc_expected(sigma=sigma, C=C, T=T, beta=1.0, variance=C**2 / N)
    assert at_worst == pytest.approx(want, rel=1e-12)
    assert dp.ncc_upper_bound(sigma=sigma, T=T) == pytest.approx(1 / math.hypot(1.0, sigma / math.sqrt(T)))
    assert dp.ncc_upper_bound(sigma=sigma, N=N, T=T) < dp.ncc_upper_bound(sigma=sigma, T=T)


def test_ncc_finite_n_bound_is_tight_for_zero_mean_clipped_example():
    # Zero-mean X with ||X|| > C: beta ||x_c|| = C, the extreme case.
    rng = np.random.default_rng(3)
    N, sigma, C = 5, 1.0, 1.0
    X = np.array([3.0, -1.0, 2.0, -2.5, -1.5])
    assert abs(X.mean()) < 1e-12 and np.linalg.norm(X) > C
    Xhat, _ = _attack_by_hand(X, sigma, C, 1, rng, draws=40_000)
    r = _pearson_rows(np.broadcast_to(X, Xhat.shape), Xhat)
    se = r.std() / math.sqrt(r.size)
    bound = dp.ncc_upper_bound(sigma=sigma, N=N, finite_n=True)
    assert abs(r.mean() - bound) < 3 * se + 1e-4
    # METHOD.md's sqrt(1/(1+N sigma^2)) bounds the population NCC only:
    # the sample mean exceeds it at small N.
    assert r.mean() > dp.ncc_upper_bound(sigma=sigma, N=N) + 3 * se


def test_worst_case_success_against_gaussian_test():
    for kappa, sigma, T in [(0.1, 1.0, 1), (0.01, 2.0, 10), (0.5, 0.8, 3)]:
        mu = math.sqrt(T) / sigma
        # Power at level kappa of the best test of N(0,1) against N(mu,1).
        oracle = stats.norm(loc=mu).sf(stats.norm.isf(kappa))
        assert dp.worst_case_success(kappa=kappa, sigma=sigma, T=T) == pytest.approx(oracle, rel=1e-10)
        assert dp.worst_case_success(kappa=kappa, sigma=sigma, T=T) == pytest.approx(
            stats.norm.cdf(stats.norm.ppf(kappa) + math.sqrt(T) / sigma), rel=1e-12)


def test_t_step_composition():
    sigma, T, kappa = 3.0, 25, 0.05
    # GDP composition: T steps of 1/sigma-GDP give sqrt(sum mu_i^2)-GDP.
    mu_total = math.sqrt(sum((1 / sigma) ** 2 for _ in range(T)))
    assert dp.worst_case_success(kappa=kappa, sigma=sigma, T=T) == pytest.approx(
        stats.norm.cdf(stats.norm.ppf(kappa) + mu_total))
    # Everything depends on sigma / sqrt(T) only.
    s1 = sigma / math.sqrt(T)
    assert dp.worst_case_success(kappa=kappa, sigma=sigma, T=T) == pytest.approx(
        dp.worst_case_success(kappa=kappa, sigma=s1))
    assert dp.rero_mse(eta=0.1, sigma=sigma, C=1.0, N=30, T=T) == pytest.approx(
        dp.rero_mse(eta=0.1, sigma=s1, C=1.0, N=30))
    assert dp.psnr_upper_bound(sigma=sigma, C=1.0, T=T) == pytest.approx(
        dp.psnr_upper_bound(sigma=s1, C=1.0))


# ------------------------------------------------------------- distributions
def test_mse_cdf_central_and_noncentral():
    sigma, C, T, N = 0.6, 1.2, 2, 20
    s2 = (C * sigma) ** 2 / T
    eta = np.array([0.05, 0.2, 0.3, 0.6])
    assert np.allclose(dp.mse_cdf(eta, sigma=sigma, C=C, N=N, T=T),
                       special.gammainc(N / 2, N * eta / (2 * s2)), rtol=1e-12, atol=0)
    # Noncentral chi-square as a Poisson(lam/2) mixture of central ones.
    lam = 3.5
    j = np.arange(200)
    weights = stats.poisson.pmf(j, lam / 2)
    mix = np.array([np.sum(weights * special.gammainc(N / 2 + j, N * e / (2 * s2))) for e in eta])
    assert np.allclose(dp.mse_cdf(eta, sigma=sigma, C=C, N=N, T=T, lam=lam), mix, atol=1e-10)
    assert isinstance(dp.mse_cdf(0.2, sigma=sigma, C=C, N=N, T=T), float)


def test_rero_mse_is_gammainc():
    sigma, C, N = 0.8, 1.0, 64
    eta = np.linspace(0.0, 1.2, 7)
    want = stats.chi2.cdf(N * eta / (C * sigma) ** 2, N)
    assert np.allclose(dp.rero_mse(eta=eta, sigma=sigma, C=C, N=N), want, atol=1e-13)


def test_rero_psnr_via_mse_threshold():
    sigma, C, N, T, R = 0.5, 1.0, 64, 4, 0.9
    eta = np.array([0.0, 10.0, 15.0, 20.0])
    mse_threshold = R**2 / 10 ** (eta / 10)
    want = stats.chi2.cdf(N * mse_threshold * T / (C * sigma) ** 2, N)
    assert np.allclose(dp.rero_psnr(eta=eta, sigma=sigma, C=C, N=N, T=T, data_range=R), want, atol=1e-13)


def test_ncc_cdf_against_noncentral_t_and_full_simulation():
    rng = np.random.default_rng(4)
    N, sigma, C, T = 12, 0.5, 1.0, 2
    X = rng.normal(0.5, 0.8, N)
    beta = min(1.0, C / np.linalg.norm(X))
    var = float(X.var())
    x = np.linspace(-0.6, 0.95, 12)
    got = dp.ncc_cdf(x, sigma=sigma, C=C, N=N, T=T, beta=beta, variance=var)
    # The slope t-statistic of regressing X_hat on X is noncentral t.
    k = N - 2
    nc = beta * math.sqrt(N * var) / (C * sigma / math.sqrt(T))
    want = stats.nct.cdf(x * math.sqrt(k) / np.sqrt(1 - x**2), k, nc)
    assert np.allclose(got, want, atol=1e-4)
    # Full N-dimensional attack, T observations averaged explicitly.
    Xhat, _ = _attack_by_hand(X, sigma, C, T, rng, draws=20_000)
    r = _pearson_rows(np.broadcast_to(X, Xhat.shape), Xhat)
    empirical = (r[None, :] <= x[:, None]).mean(axis=1)
    assert np.abs(empirical - got).max() < 4 * 0.5 / math.sqrt(r.size)
    # The seeded Monte Carlo path agrees and is reproducible.
    mc = dp.ncc_cdf(x, sigma=sigma, C=C, N=N, T=T, beta=beta, variance=var, n_samples=50_000, seed=7)
    assert np.abs(mc - got).max() < 4 * 0.5 / math.sqrt(50_000)
    assert np.array_equal(mc, dp.ncc_cdf(x, sigma=sigma, C=C, N=N, T=T, beta=beta, variance=var,
                                         n_samples=50_000, seed=7))
    assert dp.ncc_cdf(1.0, sigma=sigma, C=C, N=N, variance=var) == 1.0
    assert dp.ncc_cdf(-1.0, sigma=sigma, C=C, N=N, variance=var) == 0.0


# ------------------------------------------------------- the attack itself
def test_simulate_attack_shape_seed_and_clipping(digits):
    imgs = digits[:10]
    rec = dp.simulate_attack(imgs, sigma=1e-9, C=1.0, seed=0)
    assert rec.shape == imgs.shape
    flat = rec.reshape(10, -1)
    assert np.allclose(np.linalg.norm(flat, axis=1), 1.0, atol=1e-6)  # all digits have ||X|| > 1
    assert np.allclose(flat / np.linalg.norm(flat, axis=1, keepdims=True),
                       imgs.reshape(10, -1) / np.linalg.norm(imgs.reshape(10, -1), axis=1, keepdims=True),
                       atol=1e-6)
    a = dp.simulate_attack(imgs, sigma=0.5, C=10.0, seed=3)
    assert np.array_equal(a, dp.simulate_attack(imgs, sigma=0.5, C=10.0, seed=3))
    assert not np.array_equal(a, dp.simulate_attack(imgs, sigma=0.5, C=10.0, seed=4))


@pytest.mark.parametrize("C, T", [(10.0, 1), (10.0, 7), (1.0, 1), (1.0, 7)])
def test_monte_carlo_mse_matches_closed_form(digits, C, T):
    imgs = np.repeat(digits[:20], 200, axis=0)
    flat = imgs.reshape(len(imgs), -1)
    norms = np.linalg.norm(flat, axis=1)
    clipped = norms > C
    assert clipped.all() if C == 1.0 else not clipped.any()
    sigma = 0.3
    rec = dp.simulate_attack(imgs, sigma=sigma, C=C, T=T, seed=11)
    mse = np.mean((rec.reshape(len(imgs), -1) - flat) ** 2, axis=1)
    beta = np.minimum(1.0, C / norms)
    closed = (1 - beta) ** 2 * np.mean(flat**2, axis=1) + (C * sigma) ** 2 / T
    se = np.std(mse - closed) / math.sqrt(mse.size)
    assert abs(np.mean(mse - closed)) < 3 * se
    model = np.array([dp.expected_mse(sigma=sigma, C=C, T=T, beta=b, mean_square=q)
                      for b, q in zip(beta[::200], np.mean(flat[::200] ** 2, axis=1))])
    assert np.allclose(model, closed[::200], rtol=1e-12)


def test_t_observations_average_has_variance_over_t(digits):
    imgs = np.repeat(digits[:5], 400, axis=0)
    C, sigma, T = 100.0, 0.02, 9  # no clipping: recon - X is pure noise
    noise = (dp.simulate_attack(imgs, sigma=sigma, C=C, T=T, seed=5) - imgs).ravel()
    # chi-square test of the variance C^2 sigma^2 / T.
    stat = np.sum(noise**2) / ((C * sigma) ** 2 / T)
    assert stats.chi2.cdf(stat, noise.size) == pytest.approx(0.5, abs=0.4995)
    assert np.var(noise) == pytest.approx((C * sigma) ** 2 / T, rel=0.02)


@pytest.mark.parametrize("C", [20.0, 1.0])
def test_empirical_psnr_and_ncc_below_bounds(digits, C):
    imgs = np.repeat(digits[:40], 50, axis=0)
    N = imgs[0].size
    for sigma in (0.05, 0.3, 1.0):
        rec = dp.simulate_attack(imgs, sigma=sigma, C=C, seed=int(100 * sigma))
        m = dp.attack_metrics(imgs, rec)
        R = (imgs.reshape(len(imgs), -1).max(1) - imgs.reshape(len(imgs), -1).min(1))
        assert R.max() <= 1.0
        psnr_se = m.psnr.std() / math.sqrt(m.psnr.size)
        assert m.psnr.mean() <= dp.psnr_upper_bound(sigma=sigma, C=C, N=N) + 3 * psnr_se
        ncc_se = m.ncc.std() / math.sqrt(m.ncc.size)
        assert m.ncc.mean() <= dp.ncc_upper_bound(sigma=sigma, N=N) + 3 * ncc_se
        assert m.ncc.mean() <= dp.ncc_upper_bound(sigma=sigma, N=N, finite_n=True) + 3 * ncc_se
        assert m.mse.mean() >= dp.mse_lower_bound(sigma=sigma, C=C) - 3 * m.mse.std() / math.sqrt(m.mse.size)


def test_psnr_mean_reaches_finite_n_bound_without_clipping():
    # Unclipped, data_range exact: E[PSNR] equals the N-aware bound, and exceeds
    # METHOD.md's form by the Jensen gap (~1.17 dB at N = 4).
    rng = np.random.default_rng(6)
    N, sigma, C = 4, 0.2, 10.0
    X = np.array([0.0, 1.0, 0.5, 0.25])
    Xhat, _ = _attack_by_hand(X, sigma, C, 1, rng, draws=40_000)
    m = dp.attack_metrics(np.broadcast_to(X, Xhat.shape), Xhat)
    se = m.psnr.std() / math.sqrt(m.psnr.size)
    bound = dp.psnr_upper_bound(sigma=sigma, C=C, N=N, data_range=1.0)
    assert abs(m.psnr.mean() - bound) < 3 * se
    assert m.psnr.mean() > dp.psnr_upper_bound(sigma=sigma, C=C, data_range=1.0) + 3 * se


@pytest.mark.parametrize("C", [20.0, 1.0])
def test_rero_bounds_hold_empirically(digits, C):
    imgs = np.repeat(digits[:50], 60, axis=0)
    N, sigma = imgs[0].size, 0.4
    m = dp.attack_metrics(imgs, dp.simulate_attack(imgs, sigma=sigma, C=C, seed=9))
    n = m.mse.size
    for eta in np.quantile(m.mse, [0.02, 0.2, 0.5, 0.8]):
        p_hat = np.mean(m.mse <= eta)
        gamma = special.gammainc(N / 2, N * eta / (2 * (C * sigma) ** 2))
        # (rounded up since 2026-12-02: at x raised by its rounding, and by SciPy's error, 1e-12 here)
        assert gamma <= dp.rero_mse(eta=eta, sigma=sigma, C=C, N=N) <= gamma * (1 + 1e-10)
        assert p_hat <= gamma + 3 * math.sqrt(gamma * (1 - gamma) / n) + 1e-3
    for eta in np.quantile(m.psnr, [0.2, 0.5, 0.8, 0.98]):
        p_hat = np.mean(m.psnr >= eta)
        gamma = dp.rero_psnr(eta=eta, sigma=sigma, C=C, N=N, data_range=1.0)
        assert p_hat <= gamma + 3 * math.sqrt(gamma * (1 - gamma) / n) + 1e-3
    if C == 20.0:  # unclipped: the MSE distribution is the central chi-square itself
        eta = float(np.median(m.mse))
        assert dp.rero_mse(eta=eta, sigma=sigma, C=C, N=N) == pytest.approx(0.5, abs=0.04)


def test_attack_metrics_against_scipy(digits):
    rng = np.random.default_rng(8)
    imgs = digits[:6]
    rec = imgs + rng.normal(0, 0.1, imgs.shape)
    m = dp.attack_metrics(imgs, rec)
    for i in range(6):
        x, y = imgs[i].ravel(), rec[i].ravel()
        mse = float(np.mean((x - y) ** 2))
        assert m.mse[i] == pytest.approx(mse)
        assert m.psnr[i] == pytest.approx(20 * math.log10(np.ptp(x)) - 10 * math.log10(mse))
        assert m.ncc[i] == pytest.approx(stats.pearsonr(x, y)[0], rel=1e-10)


# ----------------------------------------------------------------- report
def test_report_values():
    r = dp.report(sigma=0.5, C=2.0, N=784, T=100, kappa=0.1, data_range=1.0)
    assert {"worst_case_success", "mse", "psnr", "ncc"} <= set(r)
    assert r["worst_case_success"] == pytest.approx(stats.norm.cdf(stats.norm.ppf(0.1) + 10 / 0.5))
    assert r["mse"] == pytest.approx(4 * 0.25 / 100)
    assert r["psnr"] == pytest.approx(10 * math.log10(100 / (4 * 0.25)))
    assert r["ncc"] == pytest.approx((1 + 784 * 0.25 / 100) ** -0.5)
    assert r["sigma_eff"] == pytest.approx(0.05)
    assert r["psnr_finite_n"] > r["psnr"] and r["ncc_finite_n"] >= r["ncc"] - 1e-4


# ------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dp.mse_lower_bound(sigma=-1.0, C=1.0), r"sigma must be a positive finite noise multiplier, got -1\.0"),
        (lambda: dp.mse_lower_bound(sigma=0.0, C=1.0), r"sigma must be a positive finite.*got 0\.0"),
        (lambda: dp.mse_lower_bound(sigma=float("nan"), C=1.0), r"sigma must be a positive finite.*nan"),
        (lambda: dp.mse_lower_bound(sigma=float("inf"), C=1.0), r"sigma must be a positive finite.*inf"),
        (lambda: dp.psnr_upper_bound(sigma=1.0, C=0.0), r"C must be a positive finite clipping norm, got 0\.0"),
        (lambda: dp.rero_mse(eta=0.1, sigma=1.0, C=1.0, N=0), r"N must be an integer .*>= 1, got 0"),
        (lambda: dp.rero_mse(eta=0.1, sigma=1.0, C=1.0, N=784.5), r"N must be an integer.*got 784\.5"),
        (lambda: dp.ncc_cdf(0.5, sigma=1.0, C=1.0, N=2, variance=1.0), r"N must be an integer .*>= 3, got 2"),
        (lambda: dp.worst_case_success(kappa=0.0, sigma=1.0), r"kappa must be a prior success probability in \(0, 1\), got 0\.0"),
        (lambda: dp.worst_case_success(kappa=1.5, sigma=1.0), r"kappa .*got 1\.5"),
        (lambda: dp.effective_sigma(sigma=1.0, T=0), r"T must be an integer number of DP-SGD steps >= 1, got 0"),
        (lambda: dp.effective_sigma(sigma=1.0, T=2.5), r"T must be an integer.*got 2\.5"),
        (lambda: dp.expected_mse(sigma=1.0, C=1.0, beta=1.5), r"beta must be a clipping factor in \(0, 1\], got 1\.5"),
        (lambda: dp.expected_mse(sigma=1.0, C=1.0, mean_square=-1.0), r"mean_square must be a finite non-negative"),
        (lambda: dp.psnr_upper_bound(sigma=1.0, C=1.0, data_range=0.0), r"data_range must be a positive finite"),
        (lambda: dp.ncc_upper_bound(sigma=1.0, finite_n=True), r"finite_n=True needs the data dimension N"),
        (lambda: dp.simulate_attack(np.ones(5), sigma=1.0, C=1.0, seed=0), r"shape \(n_images, \.\.\.\).*images\[None\]"),
        (lambda: dp.attack_metrics(np.ones((2, 4)), np.ones((2, 5))), r"Shape mismatch"),
    ],
)
def test_bad_values_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dp.mse_lower_bound(sigma="1", C=1.0), r"sigma must be a real number, got str"),
        (lambda: dp.mse_lower_bound(sigma=1.0, C=None), r"C must be a real number, got NoneType"),
        (lambda: dp.rero_mse(eta=0.1, sigma=1.0, C=1.0, N="64"), r"N must be an integer, got str"),
        (lambda: dp.effective_sigma(sigma=1.0, T=True), r"T must be an integer, got bool"),
        (lambda: dp.worst_case_success(kappa=[0.1], sigma=1.0), r"kappa must be a real number, got list"),
        (lambda: dp.rero_mse(eta="x", sigma=1.0, C=1.0, N=4), r"eta must be real numbers"),
        (lambda: dp.simulate_attack(np.array([["a", "b"]]), sigma=1.0, C=1.0, seed=0), r"images must be a real numeric array"),
        (lambda: dp.ncc_upper_bound(sigma=1.0, N=10, finite_n=1), r"finite_n must be a bool"),
    ],
)
def test_bad_types_raise_type_error(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_zero_dimensional_tensors_and_arrays_are_their_numbers_as_in_bound():
    """hcrfast.bound takes sigma=torch.tensor(0.1); the dp functions refused it ("got Tensor"), a 0-d array and a
    one-element one,
    while taking np.float32. A one-element 0-d tensor of a bool or a complex is still refused."""
    torch = pytest.importorskip("torch")
    want = dp.rero_mse(eta=0.1, sigma=1.5, C=2.0, N=64, T=3)
    for wrap in (lambda v: torch.tensor(v, dtype=torch.float64 if isinstance(v, float) else torch.int64), np.array,
                 lambda v: np.array([v])):   # (one element of any shape, as sigma=np.array([0.5]) in bound)
        assert dp.rero_mse(eta=0.1, sigma=wrap(1.5), C=wrap(2.0), N=wrap(64), T=wrap(3)) == want
        assert dp.worst_case_success(kappa=wrap(0.1), sigma=wrap(1.0)) == dp.worst_case_success(kappa=0.1, sigma=1.0)
    with pytest.raises(TypeError, match="sigma must be a real number, got bool"):
        dp.expected_mse(sigma=torch.tensor(True), C=1.0)
    with pytest.raises(TypeError, match="N must be an integer, got complex"):
        dp.rero_mse(eta=0.1, sigma=1.0, C=1.0, N=np.array(4 + 0j))


def test_keyword_only():
    with pytest.raises(TypeError):
        dp.mse_lower_bound(1.0, 1.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        dp.worst_case_success(0.1, 1.0)  # type: ignore[misc]


# -------------------------------------------------------------------- CLI
def test_cli_table_csv(capsys):
    rc = main(["dp", "table", "--sigma", "0.5", "1", "2", "--C", "1", "--N", "784",
               "--T", "1", "100", "--kappa", "0.1", "--format", "csv"])
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 6
    assert {"worst_case_success", "mse", "psnr", "ncc"} <= set(rows[0])
    assert {row["data_range"] for row in rows} == {"1.0"}   # psnr's R, said in the table it sets
    assert main(["dp", "table", "--sigma", "1", "--N", "784", "--data-range", "255", "--format", "csv"]) == 0
    row = next(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert float(row["data_range"]) == 255.0 and float(row["psnr"]) == pytest.approx(20 * math.log10(255.0))
    for row in rows:
        sigma, T = float(row["sigma"]), int(row["T"])
        assert float(row["mse"]) == pytest.approx(sigma**2 / T, rel=1e-5)
        assert float(row["psnr"]) == pytest.approx(-10 * math.log10(sigma**2 / T), rel=1e-5, abs=1e-5)
        assert float(row["ncc"]) == pytest.approx((1 + 784 * sigma**2 / T) ** -0.5, rel=1e-5)
        assert float(row["worst_case_success"]) == pytest.approx(
            stats.norm.cdf(stats.norm.ppf(0.1) + math.sqrt(T) / sigma), rel=1e-5)


def test_cli_table_csv_keeps_every_digit(capsys):
    """CSV is for programs: each value reads back as the float64 dp.report computed (the aligned table's 6
    digits showed a success probability of 0.99999977 as 1)."""
    assert main(["dp", "table", "--sigma", "0.2", "--C", "1", "--N", "784", "--kappa", "0.1", "--format", "csv"]) == 0
    row = next(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    want = dp.report(sigma=0.2, C=1.0, N=784, T=1, kappa=0.1, data_range=1.0)
    assert 0.999 < want["worst_case_success"] < 1.0
    for col in ("worst_case_success", "mse", "psnr", "ncc"):
        assert float(row[col]) == want[col]


def test_cli_table_aligned(capsys):
    rc = main(["dp", "table", "--sigma", "0.5", "1", "--N", "64", "784", "--kappa", "0.1"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["sigma", "C", "N", "T", "kappa"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert len(lines) == 2 + 4
    assert len({len(line) for line in lines}) == 1  # columns aligned
    header = lines[0].split()
    first = dict(zip(header, lines[2].split()))
    assert float(first["ncc"]) == pytest.approx((1 + 64 * 0.25) ** -0.5, rel=1e-5)


def test_cli_bad_value_is_clean_error(capsys):
    assert main(["dp", "table", "--sigma", "-1", "--N", "64"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "hcrfast: error: --sigma must be a positive finite noise multiplier" in captured.err   # the flag


def test_cli_figure(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "fig.png"
    rc = main(["dp", "figure", "--out", str(out), "--sigmas", "0.03", "0.3", "3",
               "--n-images", "8", "--repeats", "2", "--dpi", "60", "--seed", "1"])
    assert rc == 0
    assert out.exists() and out.stat().st_size > 10_000
    pixels = plt.imread(out)
    assert pixels.ndim == 3 and pixels.std() > 0.01
    assert main(["dp", "figure", "--out", str(tmp_path / "p.png"), "--source", "photo",
                 "--n-images", "31"]) == 2
    assert "--n-images must be between 1 and 30 for --source photo, got 31" in capsys.readouterr().err


def test_cli_figure_photo_runs_with_its_default_number_of_images(tmp_path):
    """--n-images defaults to 64 digits, or every one of the 30 photo patches (64 was refused for photo)."""
    from hcrfast._dp_cli import _choose_images

    rng = np.random.default_rng(0)
    assert _choose_images("photo", None, rng).shape == (30, 64, 64)
    assert _choose_images("digits", None, rng).shape[0] == 64
    assert main(["dp", "figure", "--out", str(tmp_path / "p.png"), "--source", "photo", "--sigmas", "0.3",
                 "--repeats", "1", "--dpi", "30"]) == 0


def test_cli_figure_prints_the_path_it_writes_and_checks_it_first(tmp_path, capsys):
    """matplotlib adds .png to a name without a suffix: the printed path is that file. A folder, or a
    folder that does not exist, is refused before any attack runs."""
    assert main(["dp", "figure", "--out", str(tmp_path / "f11"), "--sigmas", "0.3", "--n-images", "2",
                 "--repeats", "1", "--dpi", "30"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'f11.png'}"
    assert (tmp_path / "f11.png").is_file() and not (tmp_path / "f11").exists()
    for out, text in ((tmp_path, "is a folder; pass a file name"), (tmp_path / "no" / "x.png", "does not exist"),
                      (f"{tmp_path / 'newdir'}/", "newdir/ names a folder; pass a file name")):   # not newdir.png
        assert main(["dp", "figure", "--out", str(out), "--sigmas", "0.3"]) == 2
        assert text in capsys.readouterr().err
    assert main(["dp", "figure", "--out", str(tmp_path / "s.png"), "--sigmas", "0.3", "--seed", "-1"]) == 2
    assert "seed must be a non-negative integer, got -1 (--seed)" in capsys.readouterr().err


# ------------------------------------------------------- extreme regimes
# Every quantity is either the exact value (to float precision) or refused
# with a ValueError that names it; never 0, inf or a subnormal standing in
# for a bound. The oracles are the formulas in mpmath at 50 digits.
TINY, HUGE = sys.float_info.min, sys.float_info.max
SWEEP = (5e-324, 1e-320, 1e-300, 1e-160, 1.6e-154, 1e-20, 1e-3, 1.0, 1e3, 1e20, 1.3e154, 1e160,
         1e200, 1e300, 1.7e308)


@pytest.fixture(scope="module")
def mp():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    return mpmath


def _exact_pearson_mean(mp, nc, N):
    """E[cos angle(N(nc e1, I_{N-1}), e1)] in closed form, with 1F1 (not the module's integral)."""
    nc, b = mp.mpf(nc), mp.mpf(N + 1) / 2
    return nc * mp.gamma(mp.mpf(N) / 2) / (mp.sqrt(2) * mp.gamma(b)) * mp.hyp1f1(0.5, b, -nc**2 / 2)


def _exact_report(mp, sigma, C, N, T, kappa, R):
    s, C, T, R = mp.mpf(sigma), mp.mpf(C), mp.mpf(T), mp.mpf(R)
    mu = mp.sqrt(T) / s
    psnr = 10 * mp.log10(R**2 * T / (C**2 * s**2))
    half = mp.mpf(N) / 2
    return {
        "sigma_eff": s / mp.sqrt(T),
        "mu": mu,
        "mse": C**2 * s**2 / T,
        "psnr": psnr,
        "ncc": 1 / mp.sqrt(1 + N * s**2 / T),
        "psnr_finite_n": psnr + 10 / mp.log(10) * (mp.log(half) - mp.digamma(half)),
        "ncc_finite_n": _exact_pearson_mean(mp, mu, N),
        "worst_case_success": mp.ncdf(mp.sqrt(2) * mp.erfinv(2 * mp.mpf(kappa) - 1) + mu),
    }


@pytest.mark.parametrize("C, N, T", [(1.0, 784, 1), (1e100, 784, 1), (1e-100, 10, 7), (2.0, 3, 10**6)])
def test_report_sigma_sweep_is_exact_or_refused(mp, C, N, T):
    kappa, R = 0.1, 1.0
    for sigma in SWEEP:
        exact = _exact_report(mp, sigma, C, N, T, kappa, R)
        positive = ("sigma_eff", "mu", "mse", "ncc", "ncc_finite_n")
        if not all(TINY <= exact[k] <= HUGE for k in positive):
            with pytest.raises(ValueError, match=re.escape(f"sigma = {sigma:g} is outside the range the "
                                                           "report can represent")
                               + r".*only for \S+ <= sigma <= \S+; pass"):
                dp.report(sigma=sigma, C=C, N=N, T=T, kappa=kappa, data_range=R)
            continue
        got = dp.report(sigma=sigma, C=C, N=N, T=T, kappa=kappa, data_range=R)
        for key in positive:
            assert got[key] == pytest.approx(float(exact[key]), rel=1e-13, abs=0), (sigma, key)
        for key in ("psnr", "psnr_finite_n"):
            assert got[key] == pytest.approx(float(exact[key]), rel=1e-14, abs=1e-11), (sigma, key)
        assert got["worst_case_success"] == pytest.approx(float(exact["worst_case_success"]), rel=1e-12, abs=0)
        assert kappa <= got["worst_case_success"] <= 1.0


@pytest.mark.parametrize("C, N, T", [(1.0, 784, 1), (1e-300, 3, 1), (1e300, 2**53, 2**53), (3.0, 64, 100)])
def test_report_fields_consistent_and_monotone_across_the_range(C, N, T):
    lo, hi = dp.report_sigma_range(C=C, N=N, T=T)
    sigmas = np.geomspace(lo, hi, 60)
    rows = [dp.report(sigma=float(s), C=C, N=N, T=T, kappa=0.01, data_range=1.0) for s in sigmas]
    col = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    for key in ("sigma_eff", "mu", "mse", "ncc", "ncc_finite_n", "worst_case_success"):
        assert np.all((col[key] >= TINY) & (col[key] <= HUGE)), key
    assert np.all(np.diff(col["mse"]) > 0) and np.all(np.diff(col["sigma_eff"]) > 0)
    assert np.all(np.diff(col["mu"]) < 0) and np.all(np.diff(col["psnr"]) < 0)
    for key in ("ncc", "ncc_finite_n", "worst_case_success"):
        assert np.all(np.diff(col[key]) <= 0), key
    # PSNR is 10 log10(R^2 / MSE) of the MSE bound; the finite-N forms only add to the bounds.
    assert np.allclose(col["psnr"], -10 * np.log10(col["mse"]), rtol=1e-13, atol=1e-10)
    assert np.all(col["psnr_finite_n"] >= col["psnr"])  # equal where the gap (~4.3/N dB) is below an ulp
    assert np.all(col["ncc_finite_n"] >= col["ncc"] * (1 - 1e-14))


def test_report_sigma_range_edges(mp):
    for C, N, T in [(1.0, 784, 1), (1e-300, 3, 1), (1e300, 2**53, 2**53), (5e-324, 10, 1)]:
        lo, hi = dp.report_sigma_range(C=C, N=N, T=T)
        rt = mp.sqrt(T)
        lo_exact = max(mp.mpf(TINY) * rt, mp.sqrt(TINY) * rt / mp.mpf(C))
        hi_exact = min(mp.mpf(HUGE), mp.sqrt(HUGE) * rt / mp.mpf(C), rt / (mp.sqrt(N) * mp.mpf(TINY)))
        assert lo == pytest.approx(float(lo_exact), rel=1e-13, abs=0)
        assert hi == pytest.approx(float(hi_exact), rel=1e-13, abs=0)
        for sigma in (lo, hi):
            r = dp.report(sigma=sigma, C=C, N=N, T=T, kappa=0.1)
            assert all(TINY <= r[k] <= HUGE for k in ("sigma_eff", "mu", "mse", "ncc", "ncc_finite_n"))
        for sigma in (float(np.nextafter(lo, 0)), float(np.nextafter(hi, np.inf))):
            if sigma < HUGE:
                with pytest.raises(ValueError, match="outside the range the report can represent"):
                    dp.report(sigma=sigma, C=C, N=N, T=T, kappa=0.1)


@pytest.mark.parametrize("N", [3, 4, 5, 11, 784, 10**6])
def test_ncc_finite_n_matches_closed_form_at_every_noise_level(mp, N):
    for sigma in (1e300, 1e20, 1e3, 2.0, 1.0, 1 / 3, 1e-2, 1e-4, 1e-150, 1e-300):
        want = _exact_pearson_mean(mp, mp.mpf(1) / mp.mpf(sigma), N)
        got = dp.ncc_upper_bound(sigma=sigma, N=N, finite_n=True)
        assert got == pytest.approx(float(want), rel=1e-13, abs=0), sigma
        assert got >= dp.ncc_upper_bound(sigma=sigma, N=N) * (1 - 1e-14)
    # sqrt(T) / sigma overflows float64 here; the bound is its limit, 1.
    assert dp.ncc_upper_bound(sigma=1e-320, N=N, finite_n=True) == 1.0
    # The same mean through ncc_expected: nc = beta sqrt(N Var) / s.
    got = dp.ncc_expected(sigma=1e100, C=1.0, beta=0.5, variance=4e-100 / N, N=N)
    nc = mp.mpf(0.5) * mp.sqrt(mp.mpf(4e-100)) / mp.mpf(1e100)
    assert got == pytest.approx(float(_exact_pearson_mean(mp, nc, N)), rel=1e-13, abs=0)


def test_ncc_bounds_for_huge_sigma_are_not_zero(mp):
    for sigma, N, T in [(1e200, 784, 1), (1e300, None, 1), (1e300, 784, 2**53)]:
        dim = 1 if N is None else N
        want = 1 / mp.sqrt(1 + dim * mp.mpf(sigma) ** 2 / T)
        assert dp.ncc_upper_bound(sigma=sigma, N=N, T=T) == pytest.approx(float(want), rel=1e-14, abs=0)
    with pytest.raises(ValueError, match=r"NCC bound .* is about 2\.1e-310, below float64's smallest "
                                         r"normal number 2\.2e-308; for this N and T pass sigma <= 1\.605e\+306"):
        dp.ncc_upper_bound(sigma=1.7e308, N=784)
    with pytest.raises(ValueError, match="finite-N NCC bound"):
        dp.ncc_upper_bound(sigma=1.7e308, N=784, finite_n=True)


def test_psnr_bound_in_log_space_and_jensen_term(mp):
    for sigma, C, T, R in [(1e-300, 1.0, 1, 1.0), (1e200, 1.0, 1, 1.0), (1e-300, 1e300, 1, 1.0),
                           (5e-324, 1.0, 2**53, 1e300), (1.7e308, 5e-324, 1, 1e-300)]:
        want = 10 * mp.log10(mp.mpf(R) ** 2 * T / (mp.mpf(C) ** 2 * mp.mpf(sigma) ** 2))
        assert dp.psnr_upper_bound(sigma=sigma, C=C, T=T, data_range=R) == pytest.approx(
            float(want), rel=1e-14, abs=1e-11)
    # With sigma = C = R = T = 1 the N-aware bound is the Jensen term alone; ln x - psi(x)
    # cancels to noise in floats from x ~ 1e8 on (0 or negative near 1e17).
    for N in (1, 2, 3, 19, 20, 21, 784, 10**6, 10**12, 10**15, 2**53):
        half = mp.mpf(N) / 2
        want = 10 / mp.log(10) * (mp.log(half) - mp.digamma(half))
        got = dp.psnr_upper_bound(sigma=1.0, C=1.0, N=N)
        assert got == pytest.approx(float(want), rel=1e-13, abs=0), N
        assert got > 0


def test_worst_case_success_at_extreme_kappa_and_sigma(mp):
    for kappa in (1e-300, 1e-20, 0.1, 0.9):
        with mp.workdps(400):
            z = mp.sqrt(2) * mp.erfinv(2 * mp.mpf(kappa) - 1)
            previous = 1.0
            for sigma in (1e-300, 1e-3, 1.0, 1e3, 1e300):
                want = mp.ncdf(z + 1 / mp.mpf(sigma))
                got = dp.worst_case_success(kappa=kappa, sigma=sigma)
                assert got == pytest.approx(float(want), rel=1e-10, abs=0), (kappa, sigma)
                assert kappa <= got <= previous
                previous = got
    with pytest.raises(ValueError, match=r"kappa = 5e-324 is a subnormal float64"):
        dp.worst_case_success(kappa=5e-324, sigma=1.0)


def test_noise_variance_outside_float64_is_refused():
    for call in (lambda: dp.mse_lower_bound(sigma=1e200, C=1.0),
                 lambda: dp.expected_mse(sigma=1e-170, C=1.0),
                 lambda: dp.rero_mse(eta=0.1, sigma=1e-300, C=1.0, N=10)):
        with pytest.raises(ValueError, match=r"noise variance C\^2 sigma\^2 / T = 1e[+-]\d+ .* outside "
                                             r"float64's normal range .* pass 1\.4917e-154 <= sigma <= 1\.3407e\+154"):
            call()
    assert dp.mse_lower_bound(sigma=1e-140, C=1e-4, T=2**53) == pytest.approx(1e-288 / 2**53, rel=1e-14, abs=0)
    with pytest.raises(ValueError, match=r"sigma / sqrt\(T\) = 1\.05e-308 .*pass sigma >= 2\.1118e-300"):
        dp.effective_sigma(sigma=1e-300, T=2**53)


@pytest.mark.parametrize("C, N, T", [(1.0, 784, 1), (3.0, 10, 7), (1e-100, 3, 2**53), (7e100, 10**6, 1)])
def test_limits_suggested_by_refusals_are_accepted_as_printed(mp, C, N, T):
    """A sigma typed back from a refusal is accepted, and within 1e-4 of the exact limit (mpmath): 3 digits
    printed to the nearest gave 1.49e-154 for sigma >= 1.4917e-154, itself refused."""
    root_T, tiny, huge = mp.sqrt(T), mp.mpf(TINY), mp.mpf(HUGE)
    cases = (  # (call at a sigma, a sigma it refuses, its message's pattern, the exact limits)
        (lambda s: dp.mse_lower_bound(sigma=s, C=C, T=T), 1e-300, r"pass (\S+) <= sigma <= (\S+)$",
         (mp.sqrt(tiny) * root_T / C, mp.sqrt(huge) * root_T / C)),
        (lambda s: dp.effective_sigma(sigma=s, T=T), 1e-310, r"pass sigma >= (\S+)$", (tiny * root_T,)),
        (lambda s: dp.ncc_upper_bound(sigma=s, N=N, T=T), 1.7e308, r"pass sigma <= (\S+)$",
         (root_T / (mp.sqrt(N) * tiny),)),
        (lambda s: dp.report(sigma=s, C=C, N=N, T=T, kappa=0.1), 1e-310, r"only for (\S+) <= sigma <= (\S+);",
         tuple(mp.mpf(v) for v in dp.report_sigma_range(C=C, N=N, T=T))),
    )
    for call, refused, pattern, exact in cases:
        try:
            call(refused)
        except ValueError as exc:
            message = str(exc)   # (exc is unbound after the except block)
            printed = re.search(pattern, message).groups()
        else:
            continue  # this sigma is representable here (an NCC limit past float64's largest)
        assert len(printed) == len(exact), message
        for text, limit in zip(printed, exact):
            call(float(text))  # accepted as printed
            assert abs(mp.mpf(text) / limit - 1) < 1e-4, (text, limit)


# Every call that refuses a noise variance C^2 sigma^2 / T outside float64's normal range (dp._noise_var).
NOISE_VAR_CALLS = {
    "expected_mse": lambda s, C: dp.expected_mse(sigma=s, C=C),
    "mse_lower_bound": lambda s, C: dp.mse_lower_bound(sigma=s, C=C),
    "ncc_expected": lambda s, C: dp.ncc_expected(sigma=s, C=C, beta=1.0, variance=1.0, N=10),
    "mse_noncentrality": lambda s, C: dp.mse_noncentrality(sigma=s, C=C, beta=0.5, sq_norm=1.0),
    "mse_cdf": lambda s, C: dp.mse_cdf(1.0, sigma=s, C=C, N=10),
    "rero_mse": lambda s, C: dp.rero_mse(eta=1.0, sigma=s, C=C, N=10),
    "rero_psnr": lambda s, C: dp.rero_psnr(eta=10.0, sigma=s, C=C, N=10),
    "ncc_cdf": lambda s, C: dp.ncc_cdf(0.5, sigma=s, C=C, N=10, variance=1.0),
}


@pytest.mark.parametrize("call", sorted(NOISE_VAR_CALLS))
@pytest.mark.parametrize("C, refused, edge", [(1e-300, 1e-10, "1.7976e+308"), (5e-324, 1.0, "1.7976e+308"),
                                              (1e160, 1e10, "2.2251e-308"), (1e300, 1.0, "2.2251e-308")])
def test_sigma_limits_past_float64_are_printed_at_its_edges(call, C, refused, edge):
    """A sigma limit float64 cannot hold was printed as it is, and refused as printed: 1.3407e+454 reads back as
    inf, 1.4917e-454 as 0, 1.4917e-314 as a subnormal. It is printed at the edge of float64's normal range,
    rounded inwards, and both limits are accepted as printed."""
    with pytest.raises(ValueError, match=r"outside float64's normal range") as exc:
        NOISE_VAR_CALLS[call](refused, C)
    printed = re.search(r"pass (\S+) <= sigma <= (\S+)$", str(exc.value)).groups()
    assert edge in printed, str(exc.value)
    for text in printed:
        assert TINY <= float(text) <= HUGE, str(exc.value)
        try:
            NOISE_VAR_CALLS[call](float(text), C)  # accepted as printed
        except ValueError as other:  # (rero_mse at sigma C = 1.3e154 refuses its eta = 1.0: a bound of 1e-1540)
            assert "noise variance" not in str(other), (text, str(other))


def test_eta_limit_below_float64_is_printed_at_its_smallest_normal():
    """rero_mse's smallest working eta below float64's smallest normal was printed as a subnormal (6.1635e-315),
    which reads back as a neighbour within a few ulps of 5e-324: it is printed as 2.2251e-308 instead."""
    with pytest.raises(ValueError, match=r"below float64's smallest normal number") as exc:
        dp.rero_mse(eta=1e-322, sigma=1.5e-154, C=1.0, N=100)
    assert _message_number(r"pass eta >= (\S+) ", str(exc.value)) == float("2.2251e-308")
    assert TINY <= dp.rero_mse(eta=float("2.2251e-308"), sigma=1.5e-154, C=1.0, N=100)


def test_cli_float_range_is_accepted_as_printed(capsys):
    with pytest.raises(SystemExit):
        main(["dp", "table", "--N", "64", "--sigma", "1e-400"])
    low, high = re.search(r"normal range \[(\S+), (\S+)\]", capsys.readouterr().err).groups()
    assert TINY <= float(low) and float(high) < math.inf
    for text in (low, high):
        assert main(["dp", "table", "--N", "64", "--C", text, "--sigma", "1"]) in (0, 2)
        assert "normal range" not in capsys.readouterr().err


def test_counts_beyond_float64_integers_are_refused():
    with pytest.raises(ValueError, match=r"N = 1\.00e\+400 is too large: .* 2\*\*53 = 9007199254740992"):
        dp.report(sigma=1.0, C=1.0, N=10**400, kappa=0.1)
    with pytest.raises(ValueError, match=r"T = 9007199254740993 is too large"):
        dp.effective_sigma(sigma=1.0, T=2**53 + 1)
    with pytest.raises(ValueError, match=r"N = 1\.00e\+300 is too large"):
        dp.psnr_upper_bound(sigma=1.0, C=1.0, N=1e300)
    assert dp.ncc_upper_bound(sigma=1.0, N=2**53) == pytest.approx(2**-26.5, rel=1e-15, abs=0)


def test_cli_table_extreme_sigma_is_refused_cleanly(capsys):
    """The three reported failures: a traceback, 'math domain error', and ncc_finite_n = 0."""
    for sigma, quantity in (("1e-300", r"1e-600, below"), ("1e200", r"1e\+400, above"),
                            ("1e-160", r"1e-320, below")):
        assert main(["dp", "table", "--sigma", sigma, "--N", "784"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        head = re.escape(f"hcrfast: error: sigma = {float(sigma):g} is outside the range")
        assert re.search(head + rf".*MSE bound C\^2 sigma\^2 / T would be {quantity} "
                                r".*1\.4917e-154 <= sigma <= 1\.3407e\+154", captured.err), captured.err
    # With C = 1e100 the same sigma = 1e-160 is representable: both NCC bounds are 1.
    assert main(["dp", "table", "--sigma", "1e-160", "--C", "1e100", "--N", "784", "--format", "csv"]) == 0
    row = next(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert float(row["ncc"]) == 1.0 and float(row["ncc_finite_n"]) == 1.0
    assert float(row["mse"]) == pytest.approx(1e-120, rel=1e-5, abs=0)
    assert float(row["psnr"]) == pytest.approx(1200.0)


@pytest.mark.parametrize("option, text, read_as", [("--sigma", "1e-400", "0"), ("--sigma", "1e400", "inf"),
                                                   ("--C", "1e-320", "9.99989e-321"),
                                                   ("--data-range", "1e-999", "0")])
def test_cli_refuses_numbers_float64_would_change(capsys, option, text, read_as):
    argv = ["dp", "table", "--N", "64", option, text] + ([] if option == "--sigma" else ["--sigma", "1"])
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {text} is outside float64's normal range" in err
    assert f"(it would be read as {read_as})" in err


def test_rero_mse_of_a_negative_threshold_is_zero():
    """Pr[MSE <= eta] is 0 for eta < 0 (the MSE is never negative): the central chi-square CDF, not NaN."""
    sigma, C, N, T = 0.8, 1.5, 20, 3
    eta = np.array([-2.0, -1e-12, 0.0, 0.3])
    want = stats.chi2.cdf(N * eta * T / (C * sigma) ** 2, N)
    got = dp.rero_mse(eta=eta, sigma=sigma, C=C, N=N, T=T)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert dp.rero_mse(eta=-1.0, sigma=sigma, C=C, N=N) == 0.0


def test_attack_metrics_psnr_uses_max_minus_min_of_each_image():
    """Images whose minimum is not 0 (the digits' is): PSNR = 10 log10(ptp(x)^2 / MSE) per image."""
    rng = np.random.default_rng(12)
    imgs = rng.uniform(0.3, 0.9, size=(4, 5, 6))
    rec = imgs + rng.normal(0, 0.05, imgs.shape)
    m = dp.attack_metrics(imgs, rec)
    for i in range(4):
        x, y = imgs[i].ravel(), rec[i].ravel()
        want = 10 * math.log10(np.ptp(x) ** 2 / np.mean((x - y) ** 2))
        assert m.psnr[i] == pytest.approx(want, rel=1e-12)


def test_report_and_cli_table_use_the_data_range():
    """PSNR = 10 log10(R^2 T / (C^2 sigma^2)) (+ the Jensen term with N) for R != 1, in report and in the CLI."""
    sigma, C, N, T, R = 0.5, 2.0, 64, 4, 0.25
    method = 10 * math.log10(R**2 * T / (C * sigma) ** 2)
    jensen = 10 / math.log(10) * (math.log(N / 2) - special.digamma(N / 2))
    r = dp.report(sigma=sigma, C=C, N=N, T=T, kappa=0.1, data_range=R)
    assert r["psnr"] == pytest.approx(method, rel=1e-12)
    assert r["psnr_finite_n"] == pytest.approx(method + jensen, rel=1e-12)
    out = io.StringIO()
    stdout, sys.stdout = sys.stdout, out
    try:
        assert main(["dp", "table", "--sigma", str(sigma), "--C", str(C), "--N", str(N), "--T", str(T),
                     "--data-range", str(R), "--format", "csv"]) == 0
    finally:
        sys.stdout = stdout
    row = next(csv.DictReader(io.StringIO(out.getvalue())))
    assert float(row["psnr"]) == pytest.approx(method, rel=1e-5)
    assert float(row["psnr_finite_n"]) == pytest.approx(method + jensen, rel=1e-5)


@pytest.mark.parametrize("N", [3, 4, 5, 12, 50])
def test_ncc_cdf_quadrature_reaches_its_stated_precision(N):
    """The quadrature is documented at about 1e-5 against scipy.stats.nct (its guaranteed 1/4096 is looser)."""
    sigma, C, T, beta = 0.5, 1.0, 1, 1.0
    k = N - 2
    x = np.linspace(-0.99, 0.99, 199)
    t = x * math.sqrt(k) / np.sqrt(1 - x**2)
    for var in (0.0, 0.5 / N, 2.0 / N, 4.0 / N):
        nc = beta * math.sqrt(N * var) / (C * sigma / math.sqrt(T))
        want = stats.nct.cdf(t, k, nc) if nc > 0 else stats.t.cdf(t, k)
        got = dp.ncc_cdf(x, sigma=sigma, C=C, N=N, T=T, beta=beta, variance=var)
        known = np.isfinite(want)  # scipy.stats.nct gives NaN far in the lower tail, where the CDF is ~0
        assert np.all(got[~known] < 1e-12) and known.mean() > 0.7
        np.testing.assert_allclose(got[known], want[known], rtol=0, atol=3e-5)


# ------------------------------------------------- defects of the 2nd review
def test_mse_cdf_at_huge_noncentrality_is_never_nan(mp):
    """scipy.stats.ncx2 returns NaN from lam ~ 5e10 (mse_cdf did too); the Edgeworth fallback is checked
    against the exact N = 1 form Phi(sqrt q - sqrt lam) - Phi(-sqrt q - sqrt lam) and the normal limit."""
    zs = np.array([-8.0, -3.0, -1.0, -0.2, 0.0, 0.7, 2.0, 5.0])
    for lam in (2e8, 1e11, 1e12, 1e20, 1e100, 1e300):
        eta = lam + zs * math.sqrt(2 * (1 + 2 * lam))  # N = 1, s^2 = 1: q = eta
        got = dp.mse_cdf(eta, sigma=1.0, C=1.0, N=1, lam=lam)
        for e, g in zip(eta, got):
            q, lm = mp.mpf(e), mp.mpf(lam)
            root_diff = (q - lm) / (mp.sqrt(q) + mp.sqrt(lm))  # sqrt q - sqrt lam without cancellation
            want = mp.ncdf(root_diff) - mp.ncdf(-mp.sqrt(q) - mp.sqrt(lm))
            assert g == pytest.approx(float(want), abs=1e-13, rel=0), (lam, e)
    # The reported case, and a clipped MNIST-sized example at sigma = 1e-5 (lam ~ 2.4e12): normal oracle
    # with the exact mean N + lam and variance 2(N + 2 lam); the skewness term is below 0.25 / sqrt(lam).
    N, lam = 784, 1e11
    got = dp.mse_cdf(1e11 / 784 + 1, sigma=1.0, C=1.0, N=N, lam=lam)
    assert got == pytest.approx(stats.norm.cdf((1e11 + 784 - N - lam) / math.sqrt(2 * (N + 2 * lam))),
                                abs=0.25 / math.sqrt(lam))
    x = np.random.default_rng(0).random(784)
    norm = float(np.linalg.norm(x))
    beta, sigma = 1.0 / max(1.0, norm), 1e-5
    lam = dp.mse_noncentrality(sigma=sigma, C=1.0, beta=beta, sq_norm=norm**2)
    assert lam > 1e12
    s2 = sigma**2
    z = np.linspace(-4, 4, 9)
    eta = (N + lam + z * math.sqrt(2 * (N + 2 * lam))) * s2 / N
    got = dp.mse_cdf(eta, sigma=sigma, C=1.0, N=N, lam=lam)
    assert np.all(np.isfinite(got)) and np.all(np.diff(got) > 0)
    np.testing.assert_allclose(got, stats.norm.cdf(z), rtol=0, atol=0.25 / math.sqrt(lam))
    # Where scipy works, both sides of the switch (N/2 + lam = 1e8) agree with it and with each other.
    lam0 = 1e8 - N / 2
    for lam in (lam0 * (1 - 1e-12), lam0, 1e9):
        eta = (N + lam + z * math.sqrt(2 * (N + 2 * lam))) / N
        np.testing.assert_allclose(dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N, lam=lam),
                                   stats.ncx2.cdf(N * eta, N, lam), rtol=0, atol=5e-12)
    eta = (N + lam0 + z * math.sqrt(2 * (N + 2 * lam0))) / N
    below = dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N, lam=lam0 * (1 - 1e-15))
    # The step there is scipy's own error (a few 1e-12; the expansion's is 1e-13).
    np.testing.assert_allclose(dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N, lam=lam0), below, rtol=0, atol=5e-12)
    # Never NaN, in [0, 1], with the exact limits at eta <= 0 and eta = inf, also for huge N.
    for N in (1, 784, 10**12, 2**53):
        for lam in (1.0, 1e6, 1e11, 1e200, 1.7e308):
            out = dp.mse_cdf(np.array([-1.0, 0.0, 1e-300, 1.0, 1e300, np.inf]), sigma=1.0, C=1.0, N=N, lam=lam)
            assert np.all((out >= 0) & (out <= 1)), (N, lam, out)
            assert out[0] == 0.0 and out[1] == 0.0 and out[-1] == 1.0


def test_mse_cdf_takes_the_fallback_where_scipys_ncx2_overflows(monkeypatch, mp):
    """scipy 1.16's ncx2.cdf raises OverflowError at q = 1e-300, lam = 1e6 (1.17 returns 0), and mse_cdf
    passed it on; the q where scipy raises now take the Edgeworth fallback and every other q keeps scipy's value.
    scipy 1.16 is mimicked here: oracle, the exact N = 1 form Phi(sqrt q - sqrt lam) - Phi(-sqrt q - sqrt lam)."""
    real_cdf = stats.ncx2.cdf

    def cdf_of_scipy_1_16(q, k, lam):
        if np.any(np.asarray(q) < 1e-200):
            raise OverflowError("(34, 'Numerical result out of range')")
        return real_cdf(q, k, lam)

    monkeypatch.setattr(stats.ncx2, "cdf", cdf_of_scipy_1_16)
    lam = 1e6
    eta = np.array([1e-300, 0.5, lam - 3e3, lam, lam + 3e3])
    got = dp.mse_cdf(eta, sigma=1.0, C=1.0, N=1, lam=lam)
    for e, g in zip(eta, got):
        q, lm = mp.mpf(e), mp.mpf(lam)
        want = mp.ncdf((q - lm) / (mp.sqrt(q) + mp.sqrt(lm))) - mp.ncdf(-mp.sqrt(q) - mp.sqrt(lm))
        assert g == pytest.approx(float(want), abs=1e-12, rel=0), e
    np.testing.assert_array_equal(got[1:], real_cdf(eta[1:], 1, lam))  # scipy's value where it works
    assert dp.mse_cdf(1e-300, sigma=1.0, C=1.0, N=1, lam=lam) == 0.0  # the reported call, scalar


def test_ncc_cdf_depends_on_variance_over_noise_variance_only():
    """N Var(X) overflowed float64 (CDF [0, 0] instead of [0, 1]); nc = beta sqrt(N Var) / s."""
    x = [0.7, 0.71]
    big = dp.ncc_cdf(x, sigma=1e150, C=1.0, N=10**10, variance=1e300)
    assert np.array_equal(big, dp.ncc_cdf(x, sigma=1.0, C=1.0, N=10**10, variance=1.0))
    assert np.array_equal(big, [0.0, 1.0])  # r concentrates at nc / sqrt(nc^2 + N) = 1/sqrt(2) = 0.7071
    mc = dp.ncc_cdf(x, sigma=1e150, C=1.0, N=10**10, variance=1e300, n_samples=2000, seed=3)
    assert np.array_equal(mc, dp.ncc_cdf(x, sigma=1.0, C=1.0, N=10**10, variance=1.0, n_samples=2000, seed=3))
    # N Var = 1e309 overflows, nc = sqrt(1e309) / 1e153 = 31.6 does not: oracle scipy.stats.nct.
    N, var, sigma = 100, 1e307, 1e153
    xs = np.linspace(0.9, 0.995, 9)
    nc = math.sqrt(N) * math.sqrt(var) / sigma
    want = stats.nct.cdf(xs * math.sqrt(N - 2) / np.sqrt(1 - xs**2), N - 2, nc)
    np.testing.assert_allclose(dp.ncc_cdf(xs, sigma=sigma, C=1.0, N=N, variance=var), want, rtol=0, atol=3e-5)
    # nc beyond float64 (here about 6.7e308): r = 1 almost surely, for both paths.
    for kw in ({}, {"n_samples": 100, "seed": 0}):
        out = dp.ncc_cdf([0.5, 1 - 1e-12, 1.0], sigma=1.5e-154, C=1.0, N=10**10, variance=1e300, **kw)
        assert np.array_equal(out, [0.0, 0.0, 1.0])


def test_simulate_attack_keeps_the_signal_of_huge_images():
    """||X||^2 overflowed, so beta = 0 and the reconstruction was noise only: beta X = C X / ||X||."""
    for value in (1e160, 1.7e308):
        rec = dp.simulate_attack(np.full((1, 4), value), sigma=1e-10, C=1.0, seed=0)
        np.testing.assert_allclose(rec, 0.5, rtol=1e-8)  # C / sqrt(N), the closed form
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3, 2, 5))
    for scale in (1e-200, 1e200):  # clipping is scale-free: the same direction, norm C
        rec = dp.simulate_attack(X * scale, sigma=1e-12, C=2.0, seed=0).reshape(3, -1)
        want = 2.0 * X.reshape(3, -1) / np.linalg.norm(X.reshape(3, -1), axis=1, keepdims=True)
        np.testing.assert_allclose(rec, want if scale > 1 else X.reshape(3, -1) * scale, rtol=1e-9,
                                   atol=1e-10 if scale > 1 else 1e-11)
    with pytest.raises(ValueError, match=r"C sigma / sqrt\(T\) .* above float64's largest"):
        dp.simulate_attack(np.ones((1, 3)), sigma=1e200, C=1e200, seed=0)


def test_attack_metrics_are_finite_or_refused_at_any_scale():
    """MSE inf and PSNR NaN for values ~1e160: PSNR and NCC are scale-free, the MSE scales by scale^2."""
    rng = np.random.default_rng(2)
    x = rng.random((3, 16))
    y = x + rng.normal(0, 0.1, x.shape)
    ref = dp.attack_metrics(x, y)
    for scale in (2.0**500, 2.0**-500, 1e150, 1e-150):
        m = dp.attack_metrics(x * scale, y * scale)
        np.testing.assert_allclose(m.psnr, ref.psnr, rtol=1e-12)
        np.testing.assert_allclose(m.ncc, ref.ncc, rtol=1e-12)
        np.testing.assert_allclose(m.mse, ref.mse * scale**2, rtol=1e-12)
    for scale in (1e160, 1e-160):
        with pytest.raises(ValueError, match=r"the MSE of image 0 is \S+, outside float64's normal range"
                                             r".*rescale images and recon together"):
            dp.attack_metrics(x * scale, y * scale)
    same = dp.attack_metrics(x * 1e160, x * 1e160)  # MSE exactly 0: not refused
    assert np.all(same.mse == 0) and np.all(same.psnr == np.inf) and np.allclose(same.ncc, 1.0)


def _message_number(pattern, text):
    return float(re.search(pattern, text).group(1))


def test_rero_bounds_below_float64_are_refused(mp):
    """Upper bounds on a success probability returned as 0 (true 7.07e-618) or a subnormal: refused,
    naming the bound (checked against mpmath) and the thresholds that work."""
    N, a = 784, mp.mpf(392)
    for eta in (0.01, 0.06379094773693424):
        with pytest.raises(ValueError, match=r"ReRo bound Pr\[MSE <= eta\] at eta = .* below float64's "
                                             r"smallest normal number") as exc:
            dp.rero_mse(eta=eta, sigma=1.0, C=1.0, N=N)
        want = mp.gammainc(a, 0, N * mp.mpf(eta) / 2, regularized=True)
        said = re.search(r"is about (\d\.\d+)e([+-]\d+)", str(exc.value))
        assert mp.mpf(said.group(1)) * mp.mpf(10) ** int(said.group(2)) == pytest.approx(want, rel=0.01)
        eta_min = _message_number(r"pass eta >= (\S+) ", str(exc.value))
        assert TINY <= dp.rero_mse(eta=eta_min, sigma=1.0, C=1.0, N=N) < 1e-300
        with pytest.raises(ValueError):
            dp.rero_mse(eta=[0.5, eta], sigma=1.0, C=1.0, N=N)   # arrays too
    assert dp.rero_mse(eta=[-1.0, 0.0], sigma=1.0, C=1.0, N=N).tolist() == [0.0, 0.0]  # exactly 0
    with pytest.raises(ValueError, match=r"Pr\[PSNR >= eta\] at eta = 30\.0 is about (\S+), below") as exc:
        dp.rero_psnr(eta=30.0, sigma=1.0, C=1.0, N=N)
    eta_max = _message_number(r"pass eta <= (\S+) dB", str(exc.value))
    got = dp.rero_psnr(eta=eta_max, sigma=1.0, C=1.0, N=N)
    want = mp.gammainc(a, 0, N * mp.mpf(10) ** (-mp.mpf(eta_max) / 10) / 2, regularized=True)
    assert TINY <= got and got == pytest.approx(float(want), rel=1e-9)
    assert dp.rero_psnr(eta=math.inf, sigma=1.0, C=1.0, N=N) == 0.0  # Pr[PSNR = inf] = 0 exactly
    with pytest.raises(ValueError, match=r"Pr\[PSNR >= eta\] at eta = 10000\.0 is about"):
        dp.rero_psnr(eta=1e4, sigma=1.0, C=1.0, N=N)  # eta_hat = 1e-1000 underflowed to a bound of 0


def test_expected_mse_beyond_float64_is_refused():
    with pytest.raises(ValueError, match=r"expected MSE .* = 2\.7e\+308 .* above float64's largest"):
        dp.expected_mse(sigma=1e154, C=1.0, beta=1e-10, mean_square=1.7e308)
    assert dp.expected_mse(sigma=1e150, C=1.0, beta=0.5, mean_square=4e300) == pytest.approx(2e300, rel=1e-15)


def test_worst_case_success_is_never_below_the_exact_bound(mp):
    """An upper bound: the float must not land below Phi(Phi^-1(kappa) + mu) (it did by 1.8e-13
    at kappa = 1e-300, mu = 0.01); at most 2e-14 above it."""
    for kappa in (2.3e-308, 1e-300, 1e-200, 1e-50, 1e-10, 0.1, 0.5, 0.9):
        for mu in (1e-12, 1e-3, 0.01, 0.3, 1.0, 5.0, 10.0, 20.0, 30.0, 37.0):
            for T in (1, 7):
                sigma = math.sqrt(T) / mu
                with mp.workdps(400):
                    z = mp.sqrt(2) * mp.erfinv(2 * mp.mpf(kappa) - 1)
                    want = mp.ncdf(z + mp.sqrt(T) / mp.mpf(sigma))
                    got = dp.worst_case_success(kappa=kappa, sigma=sigma, T=T)
                    assert want <= got <= max(want * (1 + mp.mpf(2e-14)), 1), (kappa, mu, T)


def test_cli_table_prints_distinct_inputs_distinctly(capsys):
    assert main(["dp", "table", "--sigma", "0.5", "--N", "784", "--kappa", "0.999999999", "0.9999999999"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    kappas = [dict(zip(header, line.split()))["kappa"] for line in lines[2:]]
    assert kappas == ["0.999999999", "0.9999999999"]
    assert dict(zip(header, lines[2].split()))["C"] == "1"


# ------------------------------------------------- defects of the 3rd review
# scipy's gammainc / chi2.cdf truncates its series for large a = N/2 and falls BELOW the exact
# P(a, x): -4.3e-6 at N = 2e6, -3% at N = 2e7, -35% at N = 2e8 (5 standard deviations below the
# mean), so rero_mse / rero_psnr were false upper bounds and mse_cdf jumped 35% between lam = 0
# and lam = 1e-300. From a = 1e5 on the module uses Temme's uniform expansion. Oracle:
# P(a, x) = x^a e^-x / Gamma(a + 1) 1F1(1; a + 1; x) in mpmath at 50 digits.
BIG_N = (200_000, 2_000_000, 20_000_000, 200_000_000)
BIG_Z = (-35.0, -30.0, -20.0, -10.0, -5.0, -2.0, -0.3, 0.0, 0.4, 2.0, 5.0, 8.0)


def _exact_gammainc(mp, a, x):
    a, x = mp.mpf(a), mp.mpf(x)
    return mp.exp(a * mp.log(x) - x - mp.loggamma(a + 1)) * mp.hyp1f1(1, a + 1, x, maxterms=10**8)


def _chi2_points(N, zs=BIG_Z):
    """eta (at sigma = C = 1) at z standard deviations of chi^2_N, and x = N eta / 2 as the module forms it."""
    eta = (N + np.asarray(zs) * math.sqrt(2 * N)) / N
    return eta, (N * eta) * 0.5


def test_reported_rero_mse_at_n_2e8_is_not_35_percent_low():
    N = 200_000_000
    eta = (N - 5 * math.sqrt(2 * N)) / N
    exact = 2.854642139958626e-07   # mpmath, 50 digits
    got = dp.rero_mse(eta=eta, sigma=1, C=1, N=N)
    assert exact <= got <= exact * (1 + 1e-10)   # (x's rounding, 8 units, times |a - x| = 5e4: 4.4e-11)
    assert dp.mse_cdf(eta, sigma=1, C=1, N=N, lam=0.0) == pytest.approx(exact, rel=1e-14)


@pytest.mark.parametrize("N", BIG_N)
def test_central_chi2_cdf_for_large_n_against_mpmath(mp, N):
    """mse_cdf(lam = 0): relative error below 2e-14 where the CDF <= 1/2, absolute 5e-16 above."""
    eta, x = _chi2_points(N)
    got = dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N)
    for g, xi, z in zip(got, x, BIG_Z):
        want = _exact_gammainc(mp, N / 2, xi)
        if want <= 0.5:
            assert abs(g - want) <= 2e-14 * want, (N, z, g, want)
        else:
            assert abs(g - want) <= 5e-16, (N, z, g, want)


def _log_slope(mp, a, x, P):
    """d ln P(a, x) / d ln x = x^a e^-x / (Gamma(a) P): what x's relative rounding costs P, relatively (about
    |a - x| in the lower tail)."""
    a, x = mp.mpf(a), mp.mpf(x)
    return mp.exp(a * mp.log(x) - x - mp.loggamma(a)) / P


@pytest.mark.parametrize("N", BIG_N)
def test_rero_bounds_for_large_n_are_never_below_the_exact_value(mp, N):
    """Upper bounds: never below P(N/2, x), and at most 2e-13 (relative) above it plus what x's rounding costs: x
    is taken 8 units (rero_mse; rero_psnr: its logarithm's) above the computed one since 2026-12-02, which moves P
    by |a - x| times that (3e-10 at N = 2e8, 35 standard deviations below the mean)."""
    eta, x = _chi2_points(N)
    got = dp.rero_mse(eta=eta, sigma=1.0, C=1.0, N=N)
    for g, xi, z in zip(got, x, BIG_Z):
        want = _exact_gammainc(mp, N / 2, xi)
        slack = 2e-13 + 1.5 * 8 * 2.0**-53 * _log_slope(mp, N / 2, xi, want)
        assert want <= g <= min(1, want * (1 + mp.mpf(slack))), (N, z, g, want)
    # PSNR thresholds giving the same x (the module forms x = 10^(log10(N/2) - eta/10)).
    psnr = 10.0 * (math.log10(N / 2.0) - np.log10(x))
    got = dp.rero_psnr(eta=psnr, sigma=1.0, C=1.0, N=N)
    x_psnr = 10.0 ** (math.log10(N / 2.0) - 0.0 + 2.0 * 0.0 - psnr / 10.0)
    for g, xi, z, e in zip(got, x_psnr, BIG_Z, psnr):
        want = _exact_gammainc(mp, N / 2, xi)
        rel_x = math.log(10.0) * 4 * 2.0**-53 * (math.log10(N / 2) + abs(e) / 10 + 1) + 4 * 2.0**-53
        slack = 2e-13 + 1.5 * rel_x * _log_slope(mp, N / 2, xi, want)
        assert want <= g <= min(1, want * (1 + mp.mpf(slack))), (N, z, g, want)


def test_mse_cdf_is_continuous_at_lam_0_for_large_n():
    """lam = 0 (Temme) and lam = 1e-300 (scipy's ncx2, or the Edgeworth expansion from N/2 = 1e8 on)
    agree: they differed by 35% at N = 2e8."""
    for N in (2_000_000, 20_000_000, 200_000_000, 10**12):
        eta, _ = _chi2_points(N, (-5.0, -2.0, 0.0, 3.0))
        at0 = dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N, lam=0.0)
        near0 = dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N, lam=1e-300)
        np.testing.assert_allclose(at0, near0, rtol=1e-7, atol=1e-13)
        if N <= 20_000_000:   # both from accurate methods below the Edgeworth switch
            np.testing.assert_allclose(at0, near0, rtol=2e-13, atol=0)


def test_central_chi2_below_and_at_the_switch():
    """Below N/2 = 1e5 scipy is used bitwise as before for the CDF, and for rero_mse at x taken 8 units above the
    computed one, rounded up by 2^-40 and the size of its logarithm's terms (since 2026-12-02: an upper bound,
    past scipy's own error); at the switch Temme and scipy (accurate
    to 3e-13 there) agree."""
    zs = np.array([-30.0, -10.0, -3.0, 0.0, 3.0])
    for N in (784, 199_998):
        eta = (N + zs[1:] * math.sqrt(2 * N)) / N if N == 784 else (N + zs * math.sqrt(2 * N)) / N
        assert np.array_equal(dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N), stats.chi2.cdf(N * eta, N))
        got, scipy_at_x = dp.rero_mse(eta=eta, sigma=1.0, C=1.0, N=N), special.gammainc(N / 2, N * eta / 2)
        assert np.all(got >= scipy_at_x) and np.all(got <= np.minimum(1.0, scipy_at_x * (1 + 1e-8)))
    N = 200_000
    eta = (N + zs * math.sqrt(2 * N)) / N
    np.testing.assert_allclose(dp.mse_cdf(eta, sigma=1.0, C=1.0, N=N), stats.chi2.cdf(N * eta, N),
                               rtol=1e-12, atol=0)
    # The exact limits and eta <= 0 stay exact.
    out = dp.mse_cdf(np.array([-1.0, 0.0, 1e-300, 1e300, np.inf]), sigma=1.0, C=1.0, N=N)
    assert out.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert dp.rero_mse(eta=[-1.0, 0.0, np.inf], sigma=1.0, C=1.0, N=N).tolist() == [0.0, 0.0, 1.0]


def test_tiny_rero_bound_for_large_n_is_refused_with_working_threshold(mp):
    N = 200_000_000
    eta = (N - 40 * math.sqrt(2 * N)) / N
    with pytest.raises(ValueError, match=r"below float64's smallest normal number") as exc:
        dp.rero_mse(eta=eta, sigma=1.0, C=1.0, N=N)
    want = _exact_gammainc(mp, N / 2, N * eta / 2)
    said = re.search(r"is about (\d\.\d+)e([+-]\d+)", str(exc.value))
    assert mp.mpf(said.group(1)) * mp.mpf(10) ** int(said.group(2)) == pytest.approx(want, rel=0.01)
    eta_min = _message_number(r"pass eta >= (\S+) ", str(exc.value))
    got = dp.rero_mse(eta=eta_min, sigma=1.0, C=1.0, N=N)   # eta_min is printed to 5 digits, rounded up
    assert TINY <= got and got >= _exact_gammainc(mp, N / 2, N * eta_min / 2)


@pytest.mark.parametrize("seed, error, said", [
    (None, TypeError, r"seed must be a non-negative integer, a sequence of them, a numpy\.random\.SeedSequence, "
                      r"BitGenerator or Generator, got NoneType None"),
    (-1, ValueError, r"seed must be a non-negative integer, .* or Generator, got -1"),
    ([], ValueError, r"seed must be .*got an empty list; pass e\.g\. seed=0 or seed=\[0, 1\]"),
    ([1, -2], TypeError, r"seed must be .*got list \[1, -2\] with entry -2; every entry must be an integer >= 0"),
    ((1, 0.5), TypeError, r"seed must be .*got tuple \(1, 0\.5\) with entry 0\.5"),
    (1.5, TypeError, r"seed must be .*got float 1\.5"),
    (True, TypeError, r"seed must be .*got bool True"),
])
def test_a_seed_that_does_not_repeat_the_draws_is_refused_by_name(seed, error, said):
    """simulate_attack's seed (required) and ncc_cdf's Monte Carlo seed: None drew fresh OS entropy (a new
    answer each call), -1 and 1.5 failed deep in NumPy with messages that did not name seed."""
    with pytest.raises(error, match=said):
        dp.simulate_attack(np.ones((1, 4)), sigma=1.0, C=1.0, seed=seed)
    if seed is not None:
        with pytest.raises(error, match=said):
            dp.ncc_cdf(0.5, sigma=1.0, C=1.0, N=16, variance=1.0, n_samples=100, seed=seed)
        with pytest.raises(error, match=said):   # checked also where the quadrature draws nothing
            dp.ncc_cdf(0.5, sigma=1.0, C=1.0, N=16, variance=1.0, seed=seed)
    # NumPy's integers and Generators are seeds
    a = dp.simulate_attack(np.ones((1, 4)), sigma=1.0, C=1.0, seed=np.int64(3))
    assert np.array_equal(a, dp.simulate_attack(np.ones((1, 4)), sigma=1.0, C=1.0, seed=np.random.default_rng(3)))


def test_every_seed_numpy_default_rng_repeats_is_taken():
    """A SeedSequence (what `hcrfast dp figure` spawns its noise seeds from), a BitGenerator and a list of
    integers are repeatable seeds NumPy takes; they were refused as 'not an integer'. Each gives the draws
    numpy.random.default_rng gives for it."""
    images = np.linspace(0.0, 1.0, 8).reshape(2, 4)
    kw = dict(sigma=0.3, C=1.0)
    for make in (lambda: np.random.SeedSequence(5), lambda: np.random.PCG64(5), lambda: [5, 6],
                 lambda: (5, 6), lambda: np.array([5, 6]), lambda: [np.int64(5)], lambda: range(5, 7)):
        got = dp.simulate_attack(images, **kw, seed=make())
        assert np.array_equal(got, dp.simulate_attack(images, **kw, seed=np.random.default_rng(make())))
        assert not np.array_equal(got, dp.simulate_attack(images, **kw, seed=0))
        x = np.array([0.1, 0.5])
        cdf = dp.ncc_cdf(x, sigma=1.0, C=1.0, N=16, variance=1.0, n_samples=500, seed=make())
        assert np.array_equal(cdf, dp.ncc_cdf(x, sigma=1.0, C=1.0, N=16, variance=1.0, n_samples=500,
                                              seed=np.random.default_rng(make())))


def test_ncc_cdf_monte_carlo_needs_a_seed_and_the_quadrature_ignores_one():
    with pytest.raises(TypeError, match=r"ncc_cdf with n_samples draws at random and needs seed="):
        dp.ncc_cdf(0.5, sigma=1.0, C=1.0, N=16, variance=1.0, n_samples=100)
    kw = dict(sigma=1.0, C=1.0, N=16, variance=1.0)
    assert dp.ncc_cdf(0.5, **kw, seed=3) == dp.ncc_cdf(0.5, **kw, seed=4) == dp.ncc_cdf(0.5, **kw)


def test_a_tiny_rero_bound_with_a_huge_exponent_is_printed_as_a_power():
    """At eta = 1e300 dB, x = 10^(-eta/10) (times O(1)) and P(N/2, x) ~ x^(N/2): log10 of the bound is
    -8e299 for N = 16. _sci wrote all 300 digits of that exponent (a 563-character message); where the
    exponent's log overflowed too (eta = 1e308) it raised OverflowError."""
    with pytest.raises(ValueError, match=r"is about 10\^\(-8e\+299\), below float64's smallest") as exc:
        dp.rero_psnr(eta=1e300, sigma=1.0, C=1.0, N=16)
    assert len(str(exc.value)) < 300
    with pytest.raises(ValueError, match=r"is about 10\^\(-1\.8e\+308\) or less, below float64's smallest"):
        dp.rero_psnr(eta=1e308, sigma=1.0, C=1.0, N=16)
    # exponents of up to nine digits are still written out in full: log10 P(N/2, N eta / 2) ~ (N/2) log10(eta)
    with pytest.raises(ValueError, match=r"is about \d\.\d+e-2398, "):
        dp.rero_mse(eta=1e-300, sigma=1.0, C=1.0, N=16)


def test_hcrfast_dp_is_there_after_a_plain_import_hcrfast(tmp_path):
    """The README says `hcrfast.dp` in Python; after `import hcrfast` alone it raised AttributeError."""
    import subprocess
    import sys

    code = "import hcrfast; print(hcrfast.dp.ncc_cdf.__name__); hcrfast.nothing"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.stdout.strip() == "ncc_cdf"
    assert "AttributeError: module 'hcrfast' has no attribute 'nothing'" in done.stderr


def test_underflows_are_handled_under_a_caller_s_errstate_raise():
    """hcrfast.dp handled underflows (a CDF's q, the series' terms, the Edgeworth density, ||X|| / C) that it
    left unguarded: under a caller's np.seterr(under="raise") they raised FloatingPointError instead of the
    value, or instead of the ValueError that says what to change."""
    q = 1e-300 / 1e16                                   # N eta / (C sigma)^2, a subnormal
    with np.errstate(all="raise"):
        got = dp.mse_cdf(np.array([1e-300]), sigma=1e8, C=1, N=1)
    assert got[0] == pytest.approx(math.erf(math.sqrt(q / 2.0)), rel=1e-6)   # chi2(1) CDF
    with np.errstate(all="raise"), pytest.raises(ValueError, match="below float64's smallest normal"):
        dp.rero_mse(eta=0.5, sigma=1000, C=1, N=784)
    with np.errstate(all="raise"):                      # the Edgeworth branch, out in both tails
        tails = dp.mse_cdf(np.array([1e-300, 1e300]), sigma=1e-3, C=1, N=3e8, lam=1e9)
    np.testing.assert_array_equal(tails, [0.0, 1.0])
    images = np.full((1, 4), 1e-300)
    with np.errstate(all="raise"):
        noisy = dp.simulate_attack(images, sigma=1.0, C=1e300, seed=0)
    noise = np.random.default_rng(0).standard_normal((1, 4)) * 1e300    # beta = 1: X + N(0, (C sigma)^2)
    np.testing.assert_allclose(noisy, images + noise, rtol=1e-12)


def test_cli_figure_help_states_every_default(capsys):
    """--seed and --source gave no default in `hcrfast dp figure --help`, where the other flags say theirs."""
    with pytest.raises(SystemExit):
        main(["dp", "figure", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--seed SEED seed of image choice and noise (default 0)" in out
    assert re.search(r"--source \{digits,photo\} digits \(default\)", out)
    for flag in ("--sigmas", "--n-images", "--C", "--T", "--repeats", "--seed", "--dpi", "--source"):
        assert re.search(re.escape(flag) + r" (?:(?! --).)*default", out.split("options:")[-1]), flag


# ------------------------------------------------- defects of the review of 2026-12-02
@pytest.mark.parametrize("N, sigma, eta", [(1_000_000, 0.3, 0.0855), (150_528, 0.3, 0.0855), (784, 0.3, 0.045),
                                           (1_000_000, 0.3, 0.0891), (30, 1.0, 0.02), (1000, 1.0, 0.5240677966101694),
                                           (4000, 1.0, 0.5471186440677966), (4300, 1.0, 0.476)])
def test_rero_mse_is_never_below_the_exact_probability(mp, N, sigma, eta):
    """Far in the lower tail P's relative error is |a - x| times x's: x formed in float64 put rero_mse 2.7e-12 below
    the exact P at N = 1e6 (past its 2^-43 margin), and scipy's path (N/2 < 1e5) had no margin. Oracle: the exact
    P at the exact x of the float64 inputs, mpmath at 50 digits; the looseness stays below 1e-8 (SciPy's path,
    N/2 < 1e5, is rounded up by the size of its logarithm's terms: 1.3e-9 at N = 150,528)."""
    got = dp.rero_mse(eta=eta, sigma=sigma, C=1.0, N=N)
    want = _exact_gammainc(mp, N / 2, mp.mpf(N) * mp.mpf(eta) / (2 * mp.mpf(sigma) ** 2))
    assert want <= got <= want * (1 + 1e-8)


@pytest.mark.parametrize("N, sigma, eta", [(150_528, 0.1, 20.3), (1_000_000, 0.1, 20.2), (150_528, 1.0, 0.2),
                                           (784, 1.0, 0.3), (3072, 0.05, 26.5)])
def test_rero_psnr_is_never_below_the_exact_probability(mp, N, sigma, eta):
    """As rero_mse: x = 10 ** log10_x, whose logarithm rounds at a unit of its terms' sizes, put rero_psnr 1.9e-12
    below the exact P at N = 150528."""
    got = dp.rero_psnr(eta=eta, sigma=sigma, C=1.0, N=N)
    x = mp.mpf(N) / 2 * mp.power(10, -mp.mpf(eta) / 10) / mp.mpf(sigma) ** 2
    want = _exact_gammainc(mp, N / 2, x)
    assert want <= got <= want * (1 + 1e-8)


def test_the_aligned_table_rounds_each_bound_toward_the_side_it_holds_on(capsys):
    """The aligned table rounded to the nearest 6th digit: 0.304213 for a worst_case_success upper bound of
    0.3042132564 and -2.27887 for a psnr upper bound of -2.278867, both below the API's. An upper bound is now
    rounded up and the mse lower bound down, past the value's own rounding (30.000000000000004 still prints 30)."""
    assert main(["dp", "table", "--sigma", "1.3", "0.7", "0.1", "--N", "784", "--T", "1", "1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[0].split()
    for line in lines[2:]:
        cells = dict(zip(head, line.split()))
        want = dp.report(sigma=float(cells["sigma"]), C=1.0, N=784, T=int(cells["T"]), kappa=0.1, data_range=1.0)
        for col in ("worst_case_success", "psnr", "ncc", "psnr_finite_n", "ncc_finite_n"):
            assert float(cells[col]) >= want[col] - 4 * math.ulp(want[col]), (col, cells[col], want[col])
            assert float(cells[col]) <= want[col] + 1e-5 * max(1.0, abs(want[col])), (col, cells[col], want[col])
        assert float(cells["mse"]) <= want["mse"] + 4 * math.ulp(want["mse"])
        assert float(cells["mse"]) >= want["mse"] * (1 - 1e-5)
    first = dict(zip(head, lines[2].split()))
    assert first["worst_case_success"] == "0.304214" and first["psnr"] == "-2.27886"


def test_ncc_cdf_of_many_thresholds_is_computed_in_pieces_with_the_same_values(monkeypatch):
    """One (thresholds x 4,096 nodes) array took 75 KB a threshold (3.1 GB at 40,000); pieces of 256 give the
    same values, bitwise (each threshold's mean over the nodes is the same sum)."""
    x = np.linspace(-0.99, 0.99, 600).reshape(20, 30)
    kw = dict(sigma=1.0, C=1.0, N=784, variance=0.05)
    whole = dp.ncc_cdf(x, **kw)
    monkeypatch.setattr(dp, "_NCC_PIECE", 7)
    assert np.array_equal(dp.ncc_cdf(x, **kw), whole) and whole.shape == (20, 30)
    monkeypatch.setattr(dp, "_NCC_PIECE", 10**6)
    assert np.array_equal(dp.ncc_cdf(x, **kw), whole)


def test_repeated_grid_flags_add_values_and_integer_flags_take_whole_numbers_as_floats(capsys):
    """--sigma 1 --sigma 2 printed the sigma = 2 row alone (the last flag won, silently); --T 1e3 was refused with
    argparse's bare "invalid int value"; a refusal named the keyword (C must ...), not the flag."""
    assert main(["dp", "table", "--sigma", "1", "--sigma", "2", "--N", "784", "--T", "1e3", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["sigma"], r["T"], r["C"], r["kappa"]) for r in rows] == [("1.0", "1000", "1.0", "0.1"),
                                                                        ("2.0", "1000", "1.0", "0.1")]
    with pytest.raises(SystemExit):
        main(["dp", "table", "--sigma", "1", "--N", "784.5"])
    assert "--N: 784.5 is not a whole number up to 2**53; pass one (1000, or 1e3)" in capsys.readouterr().err
    assert main(["dp", "table", "--sigma", "1", "--N", "784", "--C", "0"]) == 2
    assert capsys.readouterr().err.startswith("hcrfast: error: --C must be a positive finite clipping norm, got 0")


def test_psnr_and_ncc_upper_bounds_are_never_below_the_exact_ones(mp):
    """An audit against mpmath found the PSNR bound and both NCC bounds, alone among the upper bounds, returned
    as computed: up to 2e-16 relative below the exact value (worst_case_success and the ReRo bounds are rounded
    up). They are rounded up now, by a few ulps (the finite-N NCC by 5.7e-14, its integral's accuracy): never
    below, and within 1e-13 of it. The finite-N oracle is the closed form of the mean sample correlation at
    noncentrality nu = sqrt(T) / sigma, d = N - 2 degrees of freedom:
    nu Gamma(d/2 + 1) / (sqrt(2) Gamma((d + 3)/2)) 1F1(1/2; (d + 3)/2; -nu^2 / 2)."""
    mp.dps = 40
    below = []
    for sigma in (0.05, 0.3, 1.0, 3.7, 50.0):
        for T in (1, 7, 1000):
            for N in (3, 4, 10, 64, 784):
                want = 10 * mp.log10(mp.mpf(T) / mp.mpf(sigma) ** 2) + 10 / mp.log(10) * (
                    mp.log(mp.mpf(N) / 2) - mp.digamma(mp.mpf(N) / 2))
                got = dp.psnr_upper_bound(sigma=sigma, C=1.0, T=T, N=N)
                below += [("psnr", sigma, T, N)] * (mp.mpf(got) < want)
                assert abs(mp.mpf(got) - want) <= 1e-13 * max(1, abs(want))
                want = 1 / mp.sqrt(1 + N * mp.mpf(sigma) ** 2 / T)
                got = dp.ncc_upper_bound(sigma=sigma, N=N, T=T)
                below += [("ncc", sigma, T, N)] * (mp.mpf(got) < want)
                assert abs(mp.mpf(got) / want - 1) <= 2e-15
                nu, d = mp.sqrt(T) / mp.mpf(sigma), N - 2
                want = nu * mp.gamma(mp.mpf(d) / 2 + 1) / (mp.sqrt(2) * mp.gamma(mp.mpf(d + 3) / 2)) * mp.hyp1f1(
                    mp.mpf(1) / 2, mp.mpf(d + 3) / 2, -nu ** 2 / 2)
                got = dp.ncc_upper_bound(sigma=sigma, N=N, T=T, finite_n=True)
                below += [("finite", sigma, T, N)] * (mp.mpf(got) < want)
                assert abs(mp.mpf(got) / want - 1) <= 1e-13
    assert below == []
