"""DP-SGD reconstruction bounds (hcrfast.dp) against oracles written elsewhere.

Oracles: scipy.special.gammainc / digamma, scipy.stats (chi2, ncx2, nct, norm,
pearsonr), np.corrcoef, and seeded Monte Carlo of the linear-layer attack
written out here in full N-dimensional form (not through the reductions the
module uses).
"""
from __future__ import annotations

import csv
import io
import math

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
        assert dp.rero_mse(eta=eta, sigma=sigma, C=C, N=N) == pytest.approx(gamma, rel=1e-12)
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
    for row in rows:
        sigma, T = float(row["sigma"]), int(row["T"])
        assert float(row["mse"]) == pytest.approx(sigma**2 / T, rel=1e-5)
        assert float(row["psnr"]) == pytest.approx(-10 * math.log10(sigma**2 / T), rel=1e-5, abs=1e-5)
        assert float(row["ncc"]) == pytest.approx((1 + 784 * sigma**2 / T) ** -0.5, rel=1e-5)
        assert float(row["worst_case_success"]) == pytest.approx(
            stats.norm.cdf(stats.norm.ppf(0.1) + math.sqrt(T) / sigma), rel=1e-5)


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
    assert "hcrfast: error: sigma must be a positive finite noise multiplier" in captured.err


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
    assert "n_images must be between 1 and 30" in capsys.readouterr().err


def test_cli_figure_prints_the_path_it_writes_and_checks_it_first(tmp_path, capsys):
    """matplotlib adds .png to a name without a suffix: the printed path is that file. A folder, or a
    folder that does not exist, is refused before any attack runs."""
    assert main(["dp", "figure", "--out", str(tmp_path / "f11"), "--sigmas", "0.3", "--n-images", "2",
                 "--repeats", "1", "--dpi", "30"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'f11.png'}"
    assert (tmp_path / "f11.png").is_file() and not (tmp_path / "f11").exists()
    for out, text in ((tmp_path, "is a folder; pass a file name"), (tmp_path / "no" / "x.png", "does not exist")):
        assert main(["dp", "figure", "--out", str(out), "--sigmas", "0.3"]) == 2
        assert text in capsys.readouterr().err
