"""hcrfast.noise: the χ² divergence D of every noise law against oracles no one here wrote.

Oracles: adaptive quadrature (``scipy.integrate.quad``) of the one-dimensional
χ²(t) = ∫ f(x)·(f(x − t)/f(x) − 1)² dx, combined through 1 + D = Π_j (1 + χ²_j);
plain Monte Carlo of the definition D(z) = E[(f(Z − z)/f(Z) − 1)²]; and, for the
Monte Carlo law's upper confidence bound, its coverage over repeated seeds.
"""
import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from scipy import integrate, stats

import hcrfast

from hcrfast.backend import cuda_available
from hcrfast.noise import (
    Gaussian,
    Laplace,
    MonteCarlo,
    MonteCarloEstimate,
    NoiseLaw,
    as_noise,
)


def laplace_logpdf(b):
    return lambda x: -abs(x) / b - math.log(2 * b)


def laplace_log_ratio(b):
    """log f(x − t) − log f(x) = (|x| − |x − t|)/b, piecewise, free of cancellation for tiny t."""
    def log_ratio(x, t):
        lo, hi = min(0.0, t), max(0.0, t)
        if x <= lo or x >= hi:
            return (t if x >= hi else -t) / b
        return (2 * x - t) / b if t > 0 else (t - 2 * x) / b
    return log_ratio


def gaussian_logpdf(sigma):
    return lambda x: -0.5 * (x / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))


def gaussian_log_ratio(sigma):
    return lambda x, t: t * (2 * x - t) / (2 * sigma**2)


def chi2_quad(logpdf, t, log_ratio=None, epsrel=1e-10):
    """χ²(t) = ∫ f(x)·(f(x−t)/f(x) − 1)² dx by quadrature, split at the kinks 0 and t.

    ``log_ratio(x, t)``, when given, is log f(x−t) − log f(x) without the cancellation of the
    difference of two log-densities (relative error ~1e-16/t at tiny t).
    """
    if log_ratio is None:
        def log_ratio(x, t):
            return logpdf(x - t) - logpdf(x)

    def integrand(x):
        d = log_ratio(x, t)
        if d == 0.0 or not math.isfinite(d):
            return 0.0  # no shift; or the far tails, where both log-densities underflow
        log_abs_expm1 = d + math.log(-math.expm1(-d)) if d > 0 else math.log(-math.expm1(d))
        return math.exp(logpdf(x) + 2.0 * log_abs_expm1)

    edges = [-math.inf] + sorted({0.0, float(t)}) + [math.inf]
    return sum(integrate.quad(integrand, a, b, epsabs=0.0, epsrel=epsrel, limit=200)[0]
               for a, b in itertools.pairwise(edges))


def divergence_quad(logpdf, z, log_ratio=None, epsrel=1e-10):
    """D for each row of z (B, n) from per-coordinate quadrature."""
    return np.array([math.expm1(sum(math.log1p(chi2_quad(logpdf, t, log_ratio, epsrel)) for t in row if t != 0.0))
                     for row in z])


def student_t_logpdf(df, s):
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi) - math.log(s)
    return lambda x: c - (df + 1) / 2 * math.log1p((x / s) ** 2 / df)


def student_t_log_ratio(df, s):
    return lambda x, t: -(df + 1) / 2 * math.log1p(t * (t - 2 * x) / (df * s**2 + x**2))


SHIFTS = np.array([1e-7, -1e-3, 0.05, -0.4, 1.0, -3.0, 12.0])  # in units of the scale


# ----------------------------------------------------------------------------- exact laws
@pytest.mark.parametrize("b", [0.4, 2.5])
def test_laplace_matches_quadrature(b):
    law = Laplace(b)
    t = SHIFTS * b
    chi2 = np.expm1(law.log1p_chi2(t))
    expected = np.array([chi2_quad(laplace_logpdf(b), v, laplace_log_ratio(b)) for v in t])
    np.testing.assert_allclose(chi2, expected, rtol=1e-9, atol=0)
    # METHOD.md §5 as written, where it is numerically safe
    a = np.abs(t[2:6]) / b
    np.testing.assert_allclose(chi2[2:6], (2 / 3) * np.exp(a) + (1 / 3) * np.exp(-2 * a) - 1, rtol=1e-12)

    z = np.array([[0.3, -0.6, 0.15, 0.0], [1e-6, 2e-6, -3e-6, 0.0], [2.0, -1.0, 0.5, 0.25]]) * b
    np.testing.assert_allclose(law.divergence(z), divergence_quad(laplace_logpdf(b), z, laplace_log_ratio(b)), rtol=1e-9, atol=0)


def test_laplace_matches_monte_carlo_of_the_definition():
    """Independent of the product formula: the n-dimensional expectation sampled directly."""
    b = 0.8
    z = np.array([0.3, -0.6, 0.15])
    Z = np.random.default_rng(11).laplace(0.0, b, size=(1_000_000, 3))
    ratio = np.exp((np.abs(Z) - np.abs(Z - z)).sum(axis=1) / b)
    v = (ratio - 1.0) ** 2
    mean, se = v.mean(), v.std(ddof=1) / math.sqrt(v.size)
    d = Laplace(b).divergence(z[None])[0]
    assert se < 0.005 * d  # enough draws for power ...
    assert abs(mean - d) < 4 * se
    # ... e.g. to tell the Laplace law from a Gaussian of the same variance
    assert abs(mean - Gaussian(b * math.sqrt(2)).divergence(z[None])[0]) > 20 * se


def test_gaussian_matches_quadrature():
    sigma = 0.7
    law = Gaussian(sigma)
    t = SHIFTS[:-1] * sigma  # exp(144) − 1 overflows the quadrature's integrand
    expected = np.array([chi2_quad(gaussian_logpdf(sigma), v, gaussian_log_ratio(sigma)) for v in t])
    np.testing.assert_allclose(law.divergence(t[:, None]), expected, rtol=1e-9, atol=0)
    z = np.array([[0.3, -0.6, 0.15], [1e-6, 2e-6, -3e-6]]) * sigma
    np.testing.assert_allclose(law.divergence(z), divergence_quad(gaussian_logpdf(sigma), z, gaussian_log_ratio(sigma)), rtol=1e-9, atol=0)


def test_laplace_small_and_large_shifts():
    law = Laplace(1.0)
    a = np.array([1e-12, 1e-9, 1e-6, 1e-4])
    series = a**2 - a**3 / 3 + a**4 / 4 - a**5 / 12  # (2 + (−2)^k)/(3 k!) a^k
    np.testing.assert_allclose(np.expm1(law.log1p_chi2(a)), series, rtol=1e-13)
    np.testing.assert_allclose(np.expm1(law.log1p_chi2(-a)), series, rtol=1e-13)
    # the two branches meet at a = 1
    below, above = law.log1p_chi2(np.array([1 - 1e-12, 1 + 1e-12]))
    assert above - below == pytest.approx(2e-12 * 1.0 / 1.857, rel=0.2)
    # a ≫ 1: log(1 + χ²) = a + log(2/3 + e^{−3a}/3), no overflow on the way
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        big = law.log1p_chi2(np.array([700.0, 1e5, -1e300]))
    np.testing.assert_allclose(big, [700 + math.log(2 / 3), 1e5 + math.log(2 / 3), 1e300], rtol=1e-15)
    assert np.isfinite(law.divergence(np.array([[300.0, -300.0]])))[0]


def test_zero_shift_gives_exactly_zero():
    z = np.zeros((2, 5))
    mc = MonteCarlo.from_scipy(stats.t(5), n_samples=100)
    for law in (Gaussian(1.0), Laplace(1.0), mc):
        d = law.divergence(z)
        assert d.dtype == np.float64 and d.shape == (2,)
        assert np.all(d == 0.0)


# -------------------------------------------------------------------------- interface
def test_common_interface():
    rng = np.random.default_rng(0)
    z = (0.01 * rng.standard_normal((3, 2, 4))).astype(np.float32)  # (B, ...) is flattened per row
    laws = [Gaussian(0.5), Laplace(0.5), MonteCarlo.from_scipy(stats.logistic(scale=0.3), n_samples=500)]
    for law in laws:
        assert isinstance(law, NoiseLaw)
        d = law.divergence(z)
        assert d.shape == (3,) and d.dtype == np.float64 and np.all(d > 0)
        draws = law.sample(np.random.default_rng(1), (4, 6))
        assert draws.shape == (4, 6) and draws.dtype == np.float64
        assert isinstance(law.describe(), str) and law.describe()
    assert "0.5" in laws[1].describe() and "Laplace" in laws[1].describe()
    assert "logistic" in laws[2].describe() and "0.99" in laws[2].describe()


def test_laplace_sample_has_the_laplace_law():
    b = 0.6
    x = Laplace(b).sample(np.random.default_rng(3), (200_000,))
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-3
    assert np.var(x) == pytest.approx(2 * b**2, rel=0.02)


def test_as_noise():
    assert as_noise(0.5) == Gaussian(0.5)
    assert as_noise(2) == Gaussian(2.0)
    assert as_noise(np.float32(0.25)) == Gaussian(0.25)
    lap = Laplace(0.3)
    mc = MonteCarlo.from_scipy(stats.t(5), n_samples=100)
    assert as_noise(lap) is lap and as_noise(mc) is mc
    with pytest.raises(ValueError, match=r"sigma must be a positive finite number, got -1\.0"):
        as_noise(-1.0)
    for bad in (True, "0.5", None, [0.5], np.array([0.5, 1.0]), stats.t(5)):
        with pytest.raises(TypeError, match="noise must be a positive float"):
            as_noise(bad)


@pytest.mark.parametrize("value", [0, -1.5, math.nan, math.inf])
def test_laplace_rejects_bad_scales(value):
    with pytest.raises(ValueError, match=rf"scale must be a positive finite number, got {float(value)!r}; "
                                         r"pass the Laplace scale b"):
        Laplace(value)


@pytest.mark.parametrize("value", ["1", None, True, [1.0]])
def test_laplace_rejects_non_numbers(value):
    with pytest.raises(TypeError, match="scale must be a real number"):
        Laplace(value)


@pytest.mark.parametrize("value", [np.complex128(2 + 3j), np.complex64(2), np.bool_(True), np.array([2 + 0j])])
@pytest.mark.parametrize("law,name", [(Gaussian, "sigma"), (Laplace, "scale"), (as_noise, "sigma")])
def test_complex_and_numpy_bool_scales_are_refused(law, name, value):
    """NumPy's complex and bool scalars have ``__float__``: they were taken as a scale (the imaginary part
    dropped with a mere ComplexWarning, True as 1.0)."""
    refused = rf"{name} must be a real number, got (complex|bool)"
    if law is as_noise and np.ndim(value):
        refused = "noise must be a positive float"  # as_noise takes no array, real or not
    with pytest.raises(TypeError, match=refused):
        law(value)


@pytest.mark.parametrize("law,name", [(Gaussian, "sigma"), (Laplace, "scale"), (as_noise, "sigma")])
def test_a_decimal_scale_is_refused_as_bound_refuses_a_decimal_sigma(law, name):
    """The laws took anything with __float__ (a Decimal), while bound(sigma=Decimal(...)), rms_sigma and hcrfast.dp
    refused it: one rule now, a real number (0-d arrays and tensors as their number)."""
    from decimal import Decimal

    with pytest.raises(TypeError, match=rf"{name} must be a real number, got Decimal"):
        law(Decimal("0.1"))
    with pytest.raises(TypeError, match=r"sigma must be a real number, got Decimal"):
        hcrfast.bound(torch.nn.Flatten(), torch.ones(1, 1, 2, 2, dtype=torch.float64), Decimal("0.1"))
    for same in (np.float32(0.25), np.array(0.25), torch.tensor(0.25), 0.25, np.int64(1)):
        assert law(same) == law(float(same))


def test_monte_carlo_validation():
    t5 = stats.t(5)

    def draws(rng, shape):
        return rng.standard_t(5, shape)

    with pytest.raises(ValueError, match=r"confidence must be in \[0\.5, 1\), got 1\.0"):
        MonteCarlo(t5.logpdf, draws, confidence=1.0)
    with pytest.raises(ValueError, match=r"got 0\.3; an upper confidence bound below 0\.5"):
        MonteCarlo(t5.logpdf, draws, confidence=0.3)
    with pytest.raises(ValueError, match="n_samples must be at least 10, got 5"):
        MonteCarlo(t5.logpdf, draws, n_samples=5)
    with pytest.raises(TypeError, match="n_samples must be an integer"):
        MonteCarlo(t5.logpdf, draws, n_samples=100.0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        MonteCarlo(t5.logpdf, draws, seed=-1)
    with pytest.raises(TypeError, match="logpdf must be a callable"):
        MonteCarlo("t", draws)
    with pytest.raises(TypeError, match="sample must be a callable"):
        MonteCarlo(t5.logpdf, None)
    with pytest.raises(ValueError, match=r"sample\(rng, \(100,\)\) returned shape \(50,\)"):
        MonteCarlo(t5.logpdf, lambda rng, shape: rng.standard_t(5, 50), n_samples=100)
    with pytest.raises(ValueError, match="logpdf must be elementwise"):
        MonteCarlo(lambda x: np.sum(t5.logpdf(x)), draws, n_samples=100)
    with pytest.raises(ValueError, match="logpdf is not finite at .* of the draws"):
        MonteCarlo(stats.uniform().logpdf, draws, n_samples=100)
    mc = MonteCarlo(t5.logpdf, draws, n_samples=100)
    with pytest.raises(ValueError, match="z contains NaN or inf"):
        mc.divergence(np.array([[0.1, np.nan]]))


@pytest.mark.parametrize("sample, refused", [
    (lambda rng, shape: rng.standard_t(5, shape) + 0j, r"complex draws \(dtype complex128\)"),
    (lambda rng, shape: rng.standard_t(5, shape) + 1e-3j, r"complex draws"),
    (lambda rng, shape: np.zeros(shape), r"only 1 distinct value \(0\) in 1000 draws"),
    (lambda rng, shape: rng.integers(-2, 3, shape).astype(np.float64),
     r"only 5 distinct values \(-2, -1, 0, 1, \.\.\.\) in 1000 draws"),
    (lambda rng, shape: np.round(rng.standard_t(5, shape), 1), r"only \d+ distinct values .* in 1000 draws"),
    (lambda rng, shape: np.where(rng.random(shape) < 0.01, np.inf, rng.standard_t(5, shape)), r"NaN or inf"),
])
def test_monte_carlo_refuses_complex_or_degenerate_draws(sample, refused):
    """Complex draws lost their imaginary part (a ComplexWarning at most) and a constant or few-valued sampler
    was taken as the law: each gave a finite, meaningless D."""
    t5 = stats.t(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refusal comes before any cast to float64
        with pytest.raises((TypeError, ValueError), match=r"MonteCarlo\(t5\): sample returned " + refused
                           + r".* from the law whose logpdf is given"):
            MonteCarlo(t5.logpdf, sample, n_samples=1000, name="t5")
    # Legitimate laws still pass: float32 draws (1% ties at 10^6 draws), and scipy's full-support laws.
    law = MonteCarlo(t5.logpdf, lambda rng, shape: rng.standard_t(5, shape).astype(np.float32), n_samples=1000)
    assert law.divergence(np.array([[0.1, -0.2]]))[0] > 0
    for dist in (stats.t(5), stats.logistic(), stats.laplace(scale=0.3), stats.norm(scale=2), stats.gumbel_r()):
        MonteCarlo.from_scipy(dist, n_samples=1000)


def test_from_scipy():
    mc = MonteCarlo.from_scipy(stats.t(5, scale=0.3), n_samples=100, seed=4)
    assert mc.name == "scipy.stats.t(5, scale=0.3)" and mc.seed == 4
    with pytest.raises(TypeError, match="frozen scipy.stats continuous distribution"):
        MonteCarlo.from_scipy(stats.t)
    with pytest.raises(TypeError, match="frozen scipy.stats continuous distribution"):
        MonteCarlo.from_scipy(stats.poisson(3.0))
    with pytest.raises(ValueError, match=r"uniform has support \[0, 1\], not the whole real line"):
        MonteCarlo.from_scipy(stats.uniform())
    with pytest.raises(ValueError, match="not the whole real line"):
        MonteCarlo.from_scipy(stats.lognorm(0.5))


# ------------------------------------------------------------------------ Monte Carlo
MC_LAWS = {  # frozen scipy law for MonteCarlo.from_scipy; independent log-density and log-ratio for quadrature
    "t5": (stats.t(5, scale=0.5), student_t_logpdf(5, 0.5), student_t_log_ratio(5, 0.5)),
    "laplace": (stats.laplace(scale=0.7), laplace_logpdf(0.7), laplace_log_ratio(0.7)),
}
MC_ROWS = np.array([[0.1, -0.2, 0.05], [0.3, -0.5, 1.0], [2e-6, -1e-6, 3e-6], [1.5, 0.0, 0.0]])  # × the law's std


def mc_case(name):
    """(frozen law, shifts z, true D of each row by quadrature)."""
    dist, logpdf, log_ratio = MC_LAWS[name]
    z = MC_ROWS * dist.std()
    return dist, z, divergence_quad(logpdf, z, log_ratio)


@pytest.mark.parametrize("name", ["t5", "laplace"])
def test_monte_carlo_point_estimate_matches_quadrature(name):
    dist, z, truth = mc_case(name)
    est = MonteCarlo.from_scipy(dist, n_samples=20_000, seed=1).estimate(z)
    assert isinstance(est, MonteCarloEstimate) and est.n_samples == 20_000
    # The Laplace kink at 0 makes the O(|t|/b) relative part of χ²(t) a rare event (a draw inside
    # [0, t], probability |t|/2b): at |t| ~ 1e-6 the draws miss it and the estimate is high by ~|t|/3b.
    tolerance = 4 * est.log_std_error + 1e-5 * np.log1p(truth)
    assert np.all(np.abs(np.log1p(est.point) - np.log1p(truth)) <= tolerance)
    assert np.all(est.log_std_error <= 0.02 * np.log1p(truth))  # so that the check has power
    assert np.all(est.upper >= est.point) and np.all(est.ess > 1000)  # coverage: see the test below


def test_monte_carlo_of_a_gaussian_brackets_the_exact_law_at_hcr_scale():
    """Algorithm 1's regime: many coordinates, tiny shifts (‖z‖ = σ/1000)."""
    rng = np.random.default_rng(2)
    z = rng.standard_normal((2, 2000))
    z *= 1e-3 / np.linalg.norm(z, axis=1, keepdims=True)
    exact = Gaussian(1.0).divergence(z)
    est = MonteCarlo.from_scipy(stats.norm(), n_samples=20_000).estimate(z)
    assert np.all(est.upper >= exact) and np.all(est.upper <= 1.1 * exact)
    assert np.all(np.abs(est.point / exact - 1) < 4 * est.log_std_error / exact)


def test_monte_carlo_is_deterministic_and_row_by_row():
    dist, z, _ = mc_case("t5")
    a = MonteCarlo.from_scipy(dist, n_samples=2000, seed=3).divergence(z)
    b = MonteCarlo.from_scipy(dist, n_samples=2000, seed=3).divergence(z)
    np.testing.assert_array_equal(a, b)
    law = MonteCarlo.from_scipy(dist, n_samples=2000, seed=3)
    np.testing.assert_array_equal(np.concatenate([law.divergence(z[i:i + 1]) for i in range(len(z))]), a)
    assert np.all(MonteCarlo.from_scipy(dist, n_samples=2000, seed=4).divergence(z) != a)
    stricter = law.with_confidence(0.999)
    assert stricter.confidence == 0.999 and np.all(stricter.divergence(z) > a)
    np.testing.assert_array_equal(stricter.estimate(z).point, law.estimate(z).point)  # same draws


@pytest.mark.filterwarnings("ignore:MonteCarlo.*effective sample size:RuntimeWarning")
@pytest.mark.parametrize("confidence", [0.99, 0.9])
@pytest.mark.parametrize("name", ["t5", "laplace"])
def test_monte_carlo_upper_bound_covers_at_the_stated_rate(name, confidence):
    """Over 200 seeds, UCB ≥ the true D (quadrature) for at least ``confidence`` of them, up to binomial noise."""
    dist, z, truth = mc_case(name)
    trials = 200
    upper, point = np.empty((trials, len(z))), np.empty((trials, len(z)))
    for seed in range(trials):
        est = MonteCarlo.from_scipy(dist, n_samples=200, confidence=confidence, seed=seed).estimate(z)
        upper[seed], point[seed] = est.upper, est.point
    # misses ~ Binomial(200, 1 − confidence) if the coverage is exact; allow its 99.9 % quantile
    allowed = stats.binom.ppf(0.999, trials, 1 - confidence)
    misses = (upper < truth).sum(axis=0)
    assert np.all(misses <= allowed), f"misses per row {misses}, allowed {allowed:g} of {trials}"
    # the check has power: the plug-in estimate, which is not an upper bound, fails it
    assert np.all((point < truth).sum(axis=0)[:2] > allowed)


@pytest.mark.parametrize("n_samples,shift", [(3000, 0.4), (30, 0.3)])
def test_monte_carlo_of_one_coordinate_is_the_documented_statistic_of_its_own_draws(n_samples, shift):
    """With one coordinate every draw picks it (q = 1) and the pilot's grid is that shift alone, so the
    Notes' statistic can be written out from the law's recorded draws and its seed's streams: X = x + K·t with
    K uniform on {0, 1, 2} (streams 3 and 4 of SeedSequence(seed), main and pilot), the term
    T(X) = (r(X) − 1)²·f(X)/h(X), h = (f + f(· − t) + f(· − 2t))/3; c = pilot mean of T, w = 1/(1 + c),
    K = log1p(c) − w·c, Y_i = w·T(X_i), point = expm1(K + Ȳ), s/√m with s of ddof 1,
    upper = expm1(K + Ȳ + (s/√m)(t_{m−1,1−δ} + γ̂₊(2 z²_{1−δ} + 1)/(6√m))),
    γ̂ = mean((Y − Ȳ)³)/s³, ess = (ΣY)²/ΣY² and its warning below 50. scipy.stats' Gumbel law is asymmetric, so the pilot must
    take the tangent point at the shift's own sign; with_confidence keeps the same draws (pilot too)."""
    dist = stats.gumbel_r(scale=0.6)
    recorded = []

    def sample(rng, size):
        x = dist.rvs(size=size, random_state=rng)
        recorded.append(x)
        return x

    law = MonteCarlo(dist.logpdf, sample, n_samples=n_samples, pilot_samples=70, seed=5)
    main, pilot = recorded  # the main draws, then the pilot's (the sizes say which)
    assert main.shape == (n_samples,) and pilot.shape == (70,)
    streams = np.random.SeedSequence(5).spawn(5)
    k_main = np.random.default_rng(streams[3]).integers(0, 3, n_samples)
    k_pilot = np.random.default_rng(streams[4]).integers(0, 3, 70)
    z = np.array([[shift], [-shift]])

    def term(x, k, t):
        X = x + k * t
        f, f1, f2 = (dist.pdf(X - j * t) for j in range(3))
        return (f1 / f - 1) ** 2 * f / ((f + f1 + f2) / 3)

    def oracle(confidence):
        m = n_samples
        out = []
        for t in z[:, 0]:
            c = term(pilot, k_pilot, t).mean()
            w = 1.0 / (1.0 + c)
            K = math.log1p(c) - w * c
            y = w * term(main, k_main, t)
            s = y.std(ddof=1)
            skew = max(0.0, ((y - y.mean()) ** 3).mean() / s**3)
            z_conf = stats.norm.ppf(confidence)
            quantile = stats.t.ppf(confidence, m - 1) + skew * (2 * z_conf**2 + 1) / (6 * math.sqrt(m))
            out.append((math.expm1(K + y.mean() + quantile * s / math.sqrt(m)), math.expm1(K + y.mean()),
                        s / math.sqrt(m), y.sum() ** 2 / (y**2).sum()))
        return np.array(out).T

    upper, point, se, ess = oracle(0.99)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the warning is checked row by row below
        est = law.estimate(z)
    np.testing.assert_allclose(est.point, point, rtol=1e-12)
    np.testing.assert_allclose(est.log_std_error, se, rtol=1e-12)
    np.testing.assert_allclose(est.upper, upper, rtol=1e-12)
    np.testing.assert_allclose(est.ess, ess, rtol=1e-12)
    for row, low in enumerate(ess < 50):  # the warning, row by row: heavy tails below an ess of 50
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            law.estimate(z[row:row + 1])
        assert sum("effective sample size" in str(w.message) for w in caught) == int(low)
    stricter = law.with_confidence(0.9)
    assert stricter.pilot_samples == 70
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_allclose(law.divergence(z), upper, rtol=1e-12)
        np.testing.assert_allclose(stricter.estimate(z).upper, oracle(0.9)[0], rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU with CuPy")
def test_laws_keep_cupy_arrays_on_the_device():
    import cupy

    z = np.random.default_rng(0).standard_normal((3, 50)) * 0.05
    for law in (Gaussian(0.5), Laplace(0.5), MonteCarlo.from_scipy(stats.t(5), n_samples=200)):
        d = law.divergence(cupy.asarray(z))
        assert isinstance(d, cupy.ndarray) and d.dtype == cupy.float64
        np.testing.assert_allclose(d.get(), law.divergence(z), rtol=1e-12)


@pytest.mark.parametrize("law", [Gaussian, Laplace])
def test_a_law_of_many_scales_points_to_per_feature_sigma(law):
    with pytest.raises(TypeError, match=r"must be one number, got 3 values; one std per feature is for Gaussian "
                                        r"noise only: pass them as sigma itself .*Laplace and Monte Carlo laws take one "
                                        r"scale"):
        law(np.ones(3))


# ------------------------------------------------------------------ float64's range
def _exact_gaussian_d(z, sigma):
    """expm1(Σ z²/σ²) in 60-digit arithmetic (mpmath): an oracle whose squares cannot underflow."""
    import mpmath

    with mpmath.workdps(60):
        return float(mpmath.expm1(mpmath.fsum(mpmath.mpf(float(v)) ** 2 for v in z) / mpmath.mpf(sigma) ** 2))


@pytest.mark.parametrize("sigma,ratio", [(1.61e-162, 14.4), (1e-200, 0.3), (3e-150, 1.0), (1e160, 2.0), (1.0, 0.7)])
def test_gaussian_d_keeps_its_digits_where_squares_leave_float64s_range(sigma, ratio):
    """z·z/(σ·σ) lost digits where σ² or |z|² is subnormal (σ = 1.61e-162, |z|/σ = 14.4: D 2.8e66 for a true
    7e89, a bound above the Cramér–Rao std) or overflowed (σ = 1e160: D = 0); (z/σ)² keeps them."""
    z = np.array([[ratio * sigma * 0.6, -ratio * sigma * 0.8]])
    got = float(Gaussian(sigma).divergence(z)[0])
    assert got == pytest.approx(_exact_gaussian_d(z[0], sigma), rel=1e-13)


def test_a_d_float64_cannot_resolve_is_refused_not_certified():
    """divergence_of, the one path by which bound evaluates D: below 2^-960 it is taken as 0, so a step whose
    features moved is refused (it was certified with a subnormal D of few digits: std 1.19 where the
    Cramér–Rao std is 1); the laws' own divergence is unchanged."""
    import torch

    import hcrfast
    from hcrfast.noise import D_FLOOR, divergence_of

    z = np.array([[2e-161], [1e-100], [0.0]])
    for law in (Gaussian(1.0), Laplace(1.0)):
        d = divergence_of(law, z)
        assert d[0] == 0.0 and d[1] > D_FLOOR and d[2] == 0.0 and 0 < law.divergence(z)[0] < D_FLOOR
    model = torch.nn.Linear(1, 1, bias=False).double().eval()
    torch.nn.init.ones_(model.weight)
    x = torch.zeros(1, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"D\(z\) is below what float64 resolves \(2\^-960"):
        hcrfast.bound(model, x, 1.0, size=2e-161, restarts=2, iterations=1, basis="pixel", singular_steps=0)
    for sigma in (1.61e-162, 1e-200):     # a model of that scale: a(θ) = σθ, Cramér–Rao std 1
        with torch.no_grad():
            model.weight.fill_(sigma)
        res = hcrfast.bound(model, x, sigma, size=14.0 if sigma > 1e-190 else 1.0, restarts=4, iterations=2,
                            iterates="last", singular_steps=0, basis="pixel")
        assert 0.3 < float(res.std.max()) <= 1.0


def _exact_d(law, z, scale):
    """D of ``law`` for the float64 row ``z`` at 40 digits (mpmath): Gaussian expm1(Σ z²/σ²), Laplace
    Π_j (1 + χ²_j) − 1 with 1 + χ²_j = (2/3)e^{t} + (1/3)e^{−2t}, t = |z_j|/b."""
    import mpmath

    with mpmath.workdps(40):
        s = mpmath.mpf(scale)
        if law == "gaussian":
            return mpmath.expm1(mpmath.fsum(mpmath.mpf(float(v)) ** 2 for v in z) / s ** 2)
        ts = [abs(mpmath.mpf(float(v))) / s for v in z]
        return mpmath.expm1(mpmath.fsum(mpmath.log(2 * mpmath.e ** t / 3 + mpmath.e ** (-2 * t) / 3) for t in ts))


@pytest.mark.parametrize("law,n,size", [("gaussian", 1500, 5e-3), ("gaussian", 50, 0.4), ("gaussian", 200, 2.0),
                                        ("laplace", 200, 5e-3), ("laplace", 40, 0.5)])
def test_divergence_of_rounds_d_up_never_below_the_exact_d(law, n, size):
    """float64's D may fall an ulp or a few below the exact one (a sum of n terms, then expm1), and a bound
    |c|/√D with it above the exact bound: divergence_of, the one way bound evaluates D, rounds it up past
    that. Exact: 40-digit mpmath from the same float64 z. The law's own D falls below it on some rows (so the
    check can fail), divergence_of's on none, and stays within a relative (n + 16)·2^-51·(1 + ln(1 + D))."""
    import mpmath

    from hcrfast.noise import divergence_of

    noise = Gaussian(0.7) if law == "gaussian" else Laplace(0.7)
    z = np.random.default_rng(n).standard_normal((40, n)) * size * 0.7 / math.sqrt(n)
    raw, up = noise.divergence(z), divergence_of(noise, z)
    below_raw = 0
    with mpmath.workdps(40):
        for r, u, row in zip(raw, up, z):
            exact = _exact_d(law, row, 0.7)
            below_raw += mpmath.mpf(float(r)) < exact
            assert mpmath.mpf(float(u)) >= exact
            assert (mpmath.mpf(float(u)) - exact) / exact <= (n + 16) * 2.0 ** -51 * (1 + float(mpmath.log1p(exact)))
    assert below_raw > 0


# ------------------------------------------------------------------ Monte Carlo at large shifts
def _chi2_quad(logpdf, t, points):
    """χ²(t) = ∫ f(x − t)²/f(x) dx − 1 by 30-digit quadrature (mpmath), split at ``points``."""
    import mpmath

    with mpmath.workdps(30):
        return float(mpmath.quad(lambda x: mpmath.e ** (2 * logpdf(x - t) - logpdf(x)), points) - 1)


def test_monte_carlo_bounds_d_at_shifts_where_draws_from_the_law_miss_the_mass():
    """Drawn from f alone, no draw lands where f(x − t)²/f(x) lives at large shifts (x ≈ 2t for the normal law):
    every (r − 1)² was ≈ 1 and D came out 1 at 10σ, where it is e^100, without a warning (a bound 64× the
    Cramér–Rao std). Drawn from (f + f(· − t) + f(· − 2t))/3, the upper bound covers D at any shift, and D
    past float64's range is inf (a bound of 0), not NaN."""
    import mpmath

    logistic = lambda x: -x - 2 * mpmath.log(1 + mpmath.e ** (-x))                               # noqa: E731
    cases = [(stats.norm(), 10.0, math.expm1(100.0)),
             (stats.laplace(), 20.0, (2 / 3) * math.exp(20.0) + math.exp(-40.0) / 3 - 1),
             (stats.logistic(), 20.0, _chi2_quad(logistic, 20, [-mpmath.inf, -50, 0, 10, 20, 30, 40, 60, mpmath.inf]))]
    for dist, t, truth in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)         # no warning, and none needed
            est = MonteCarlo.from_scipy(dist, n_samples=20_000).estimate(np.array([[t], [-t]]))
        assert np.all(est.upper >= truth) and np.all(est.upper <= 1.3 * truth), (dist.dist.name, est.upper, truth)
        assert np.all(np.abs(est.point / truth - 1) < 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        far = MonteCarlo.from_scipy(stats.norm(), n_samples=2000).divergence(np.array([[30.0], [1.0]]))
        assert far[0] == np.inf and np.isfinite(far[1])
        # scipy's Gumbel law: D = inf for shifts below -b ln 2 (from_scipy's docstring); now seen as such
        gumbel = MonteCarlo.from_scipy(stats.gumbel_r(scale=0.6), n_samples=2000).divergence(np.array([[-2.5]]))
        assert gumbel[0] == np.inf


def test_monte_carlo_covers_at_moderate_shifts_of_a_light_tail():
    """A Gaussian law estimated by Monte Carlo, |z| = 2σ over 5 coordinates, at confidence 0.9: the upper
    bound is below the exact D in about 10% of seeds, as stated (drawn from f alone: 59.5% of the seeds that
    raised no warning)."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((1, 5))
    z *= 2.0 / np.linalg.norm(z)
    seeds = 300
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        misses = sum(MonteCarlo.from_scipy(stats.norm(), n_samples=2000, confidence=0.9, seed=s).divergence(z)[0]
                     < math.expm1(4.0) for s in range(seeds))
    assert misses <= stats.binom.ppf(0.999, seeds, 0.1)


def test_a_bound_with_monte_carlo_noise_at_large_steps_stays_below_cramer_rao():
    """a(θ) = θ with N(0, 1) noise estimated by Monte Carlo, size 100 (shifts of ~100σ): the Cramér–Rao std is
    1; the bound was 64."""
    import torch

    import hcrfast

    model = torch.nn.Linear(1, 1, bias=False).double().eval()
    torch.nn.init.ones_(model.weight)
    x = torch.zeros(1, 1, dtype=torch.float64)
    for size in (100.0, 3.0):
        res = hcrfast.bound(model, x, MonteCarlo.from_scipy(stats.norm(), n_samples=5000), size=size, restarts=4,
                            iterations=2, basis="pixel", singular_steps=0)
        assert float(res.std.max()) <= 1.0


def test_a_monte_carlo_law_without_full_support_is_refused_when_built():
    """A normal truncated to [-3, 3] has D = inf for any shift (its support moves), but its Monte Carlo
    estimate came out finite (5e-6 at small shifts) or NaN, and bound() then reported NaN bounds summarized as
    "all +inf". The log-density is now checked over its draws' range and as much again on each side."""
    def logpdf(x):
        return np.where(np.abs(x) < 3, -0.5 * x * x, -np.inf)

    def sample(rng, shape):
        x = rng.standard_normal(shape)
        while (out := np.abs(x) >= 3).any():
            x[out] = rng.standard_normal(int(out.sum()))
        return x

    with pytest.raises(ValueError, match=r"logpdf is not finite at x = .*full support"):
        hcrfast.MonteCarlo(logpdf, sample, n_samples=2000, name="truncated normal")
    with pytest.raises(ValueError, match=r"logpdf is not finite"):   # from_scipy checks its own; by hand:
        hcrfast.MonteCarlo(stats.uniform(loc=-1, scale=2).logpdf,
                           lambda rng, shape: rng.uniform(-1, 1, shape), n_samples=1000)
    for law in (stats.gumbel_r(), stats.gumbel_r(scale=1e-3), stats.t(3), stats.cauchy()):   # full support
        hcrfast.MonteCarlo.from_scipy(law, n_samples=1000)


class _OwnLaw:
    """A user's noise law returning what ``values(z)`` gives as D."""

    def __init__(self, values):
        self.values = values

    def divergence(self, z):
        return self.values(z)

    def sample(self, rng, shape):
        return rng.standard_normal(shape)

    def describe(self):
        return "OwnLaw"


@pytest.mark.parametrize("values,message", [
    (lambda z: np.full(len(z), np.nan), r"OwnLaw returned D = NaN for"),
    (lambda z: np.full(len(z), -1.0), r"OwnLaw returned D < 0"),
    (lambda z: np.zeros((len(z), 2)), r"OwnLaw returned D of shape \(\d+, 2\) for \d+ rows")])
def test_a_user_law_whose_d_is_not_a_divergence_is_named(values, message):
    """A law's D of NaN gave NaN bounds summarized as +inf; a negative D was called 'below what float64
    resolves'; a misshapen one, a bare reshape error. Each is now refused naming the law and the value."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24, bias=False)).double().eval()
    with pytest.raises(ValueError, match=message):
        hcrfast.bound(model, torch.randn(1, 1, 4, 4, dtype=torch.float64), _OwnLaw(values), iterations=2, restarts=2)


@pytest.mark.parametrize("law", [Gaussian(0.5), Laplace(0.5)])
def test_every_law_takes_a_tensor_and_an_empty_batch(law):
    """Gaussian's D read ``z.astype`` (a torch tensor has none) and every law reshaped an empty batch (0, n)
    with -1, which NumPy refuses; both are shifts like any other: D of the tensor's values, and no rows."""
    import torch

    z = np.array([[0.1, -0.2, 0.3], [0.0, 0.0, 0.4]])
    np.testing.assert_array_equal(law.divergence(torch.as_tensor(z)), law.divergence(z))
    assert law.divergence(np.zeros((0, 3))).shape == (0,)


@pytest.mark.parametrize("law", [Gaussian(1.0), Laplace(1.0), MonteCarlo.from_scipy(stats.logistic(), n_samples=200)])
def test_one_shift_vector_without_its_batch_axis_is_refused(law):
    """A 1-D z of n values was read as n rows of one coordinate: Gaussian(1).divergence(ones(3)) gave
    [1.718, 1.718, 1.718] where the vector's D is e^3 - 1 = 19.09. A scalar was refused already."""
    with pytest.raises(ValueError, match=r"leading batch axis.*one vector of shape \(3,\).*pass z\[None\]"):
        law.divergence(np.ones(3))
    with pytest.raises(ValueError, match=r"leading batch axis.*a scalar"):
        law.divergence(np.float64(1.0))
    if not isinstance(law, MonteCarlo):
        assert law.divergence(np.ones((1, 3)))[0] == pytest.approx(
            math.expm1(3.0) if isinstance(law, Gaussian) else math.expm1(3 * math.log(2 / 3 * math.e + math.exp(-2) / 3)),
            rel=1e-14)


@pytest.mark.parametrize("law", [Gaussian(1.0), Laplace(1.0)])
def test_nan_or_complex_shifts_are_refused_by_name(law):
    """NaN z gave D = [nan] (MonteCarlo refuses it), complex z NumPy's ComplexWarning and then the real part's D."""
    with pytest.raises(ValueError, match=r"z contains NaN in rows \[1\]"):
        law.divergence(np.array([[0.1, 0.2], [np.nan, 0.1]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # refused before any cast that warns
        with pytest.raises(TypeError, match=r"z must hold real feature shifts, got dtype complex128"):
            law.divergence(np.array([[1.0 + 1.0j, 1.0]]))
    assert np.isposinf(law.divergence(np.array([[np.inf, 0.0]])))[0]   # an inf shift has D = inf, as before


def test_a_scale_that_is_not_a_number_says_what_to_pass():
    """Gaussian([1.0]) said "sigma must be a real number, got list" and no more (a list of tensors that require
    grad raised torch's RuntimeError): the message says what to pass now."""
    for value in ([0.5], "0.5", [torch.tensor(0.5, requires_grad=True)]):
        with pytest.raises(TypeError, match=r"sigma must be a real number, got (list|str); pass the noise scale of "
                                            r"the released features"):
            Gaussian(value)
    with pytest.raises(TypeError, match=r"sigma must be one number, got 2 values; one std per feature is for "
                                        r"Gaussian noise only: pass"):
        Gaussian([torch.tensor(0.5, requires_grad=True)] * 2)


def test_one_std_per_feature_as_tensors_that_require_grad_is_taken_as_their_values():
    """bound, targeted_bound and the attack read a per-feature sigma through noise.per_feature_stds, which raised
    torch's "Can't call numpy() on Tensor that requires grad" for a list of such tensors; one tensor that requires
    grad was taken as its values, and now the list is too: the same bounds as the plain numbers'."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    stds = [0.125, 0.25, 0.375, 0.5]
    grads = [torch.tensor(s, requires_grad=True) for s in stds]
    kw = dict(restarts=2, iterations=2)
    np.testing.assert_array_equal(hcrfast.bound(model, x, grads, **kw).std, hcrfast.bound(model, x, stds, **kw).std)
    np.testing.assert_array_equal(hcrfast.gauss_newton_attack(model, x, grads, draws=2, steps=2).estimates,
                                  hcrfast.gauss_newton_attack(model, x, stds, draws=2, steps=2).estimates)


class _Float32D(Gaussian):
    def divergence(self, z):
        return super().divergence(z).astype(np.float32)


class _Float32Inner(Gaussian):   # (the built-in divergence calls it)
    def _divergence(self, z):
        return super()._divergence(z).astype(np.float32)


class _Float32Terms(Laplace):   # (the built-in D sums them)
    def log1p_chi2(self, z):
        return super().log1p_chi2(z).astype(np.float32)


@pytest.mark.parametrize("law", [_Float32D, _Float32Inner, _Float32Terms])
def test_a_subclass_whose_d_is_float32_is_refused_whichever_method_it_overrides(law):
    """The float64 check skipped any subclass of Gaussian (its own divergence unchecked); then one whose divergence
    was the built-in one though the _divergence it calls was its own, and a Laplace subclass's own log1p_chi2.
    hcrfast's own subclasses, which override none of those, still give the built-in D unread."""
    from hcrfast.noise import PerFeatureGaussian, ScaledGaussian, divergence_of

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24, bias=False)).double().eval()
    batch = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"returned D as float32; D must be float64"):
        hcrfast.bound(model, batch, law(0.5), iterations=2, restarts=2)
    z = np.random.default_rng(0).standard_normal((3, 5))
    for own in (PerFeatureGaussian(1.0, "stds"), ScaledGaussian(1.0, scale=2.0)):
        assert hcrfast.noise._built_in_d(own)
        np.testing.assert_array_equal(divergence_of(own, z), divergence_of(Gaussian(1.0), z))


def test_a_big_endian_float64_d_is_taken():
    """The float64 check read the dtype's name, refusing float64 stored big-endian."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24, bias=False)).double().eval()
    batch = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    big = _OwnLaw(lambda z: Gaussian(0.5).divergence(z).astype(">f8"))
    native = _OwnLaw(lambda z: Gaussian(0.5).divergence(z))
    got = hcrfast.bound(model, batch, big, iterations=2, restarts=2, seed=0)
    assert got.std.tobytes() == hcrfast.bound(model, batch, native, iterations=2, restarts=2, seed=0).std.tobytes()


def test_a_user_laws_nan_d_at_a_nan_shift_bounds_nothing_as_the_built_in_laws_does():
    """A user law's D of NaN was refused as 'NaN for rows of finite shifts' where the shift itself was NaN; the
    built-in laws' D is NaN there, and the certified paths read it as a step that bounds nothing. A NaN D at a
    finite shift is still refused."""
    from hcrfast.noise import divergence_of

    z = np.array([[np.nan, 1.0], [1.0, 2.0]])
    own = _OwnLaw(lambda z: Gaussian(1.0)._divergence(z))
    np.testing.assert_array_equal(divergence_of(own, z), divergence_of(Gaussian(1.0), z))
    assert np.isnan(divergence_of(own, z)[0])
    broken = _OwnLaw(lambda z: np.array([0.5, np.nan]))
    with pytest.raises(ValueError, match=r"returned D = NaN for 1 of 2 rows of finite shifts"):
        divergence_of(broken, z)


def test_a_user_law_whose_d_is_float32_is_refused():
    """The protocol asks for float64 D, and the bounds' rounding guard allows float64's rounding: a law computing
    the exact Gaussian D in float32 was taken, its D up to 4e-8 below the exact one, a mode's bound 1.00000006
    times the built-in Gaussian's (rigorous) one, without a word."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24, bias=False)).double().eval()
    law = _OwnLaw(lambda z: Gaussian(0.5).divergence(z).astype(np.float32))
    with pytest.raises(TypeError, match=r"OwnLaw returned D as float32; D must be float64"):
        hcrfast.bound(model, torch.randn(1, 1, 4, 4, dtype=torch.float64), law, iterations=2, restarts=2)


def test_a_monte_carlo_law_centred_far_from_0_is_refused_naming_the_fix():
    """D does not depend on where the law is centred, but the shifts were lost next to its draws: a normal law at
    1e12 gave D = 0 for shifts of 1e-5 (exact 1.4e-9), and an upper bound below the exact D in 3 of 20 seeds at
    1e-3; a mixture with 40% of its mass at 1e14, 40% low. Such laws are refused, with the re-centred law as the
    fix; one whose draws stay within 2^24 of their spread is taken (a normal law at 1000: its D is the centred
    law's)."""
    with pytest.raises(ValueError, match=r"100\.0% of the law's draws lie more than 2\^24 times their spread .*up to "
                                         r"1e\+12.*re-centred at its median"):
        MonteCarlo.from_scipy(stats.norm(loc=1e12), n_samples=2000)

    def mixture(rng, shape):
        return np.where(rng.random(shape) < 0.4, 1e14, 0.0) + rng.standard_normal(shape)

    def mixture_logpdf(x):
        return np.logaddexp(np.log(0.6) + stats.norm.logpdf(x), np.log(0.4) + stats.norm.logpdf(x - 1e14))

    with pytest.raises(ValueError, match=r"4\d\.\d% of the law's draws lie more than 2\^24 .*up to 1e\+14.*a law in "
                                         r"one piece"):
        MonteCarlo(mixture_logpdf, mixture, n_samples=2000)
    near = MonteCarlo.from_scipy(stats.norm(loc=1000.0), n_samples=2000, seed=3)
    centred = MonteCarlo.from_scipy(stats.norm(), n_samples=2000, seed=3)
    z = np.array([[3e-3, -2e-3, 1e-3]])
    np.testing.assert_allclose(near.divergence(z), centred.divergence(z), rtol=1e-6)


@pytest.mark.parametrize("law, z", [(Gaussian(1.0), [[40.0, 0.0]]), (Laplace(1.0), [[1e4, 0.0]])])
def test_a_divergence_past_float64_is_inf_without_a_warning(law, z):
    """Gaussian(1).divergence([[40, 0]]) and Laplace's at 1e4 gave inf with a RuntimeWarning (overflow in expm1),
    an error under -W error; inf is the answer (a bound of 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert law.divergence(np.asarray(z)).tolist() == [math.inf]


def test_a_heavy_tailed_law_centred_at_0_is_not_refused_for_its_farthest_draws():
    """The far-draw rule measured the single farthest draw: a Cauchy law at 0 was refused at seed 26 (a draw at
    1.8e7 times the spread) and taken at seed 25, t(0.5) always. A heavy tail's farthest draws add ~(2t/x)² each,
    nothing next to the rest: only a share of draws beyond the limit (a part of the law far off) is refused."""
    for seed in (25, 26):
        MonteCarlo.from_scipy(stats.cauchy(), seed=seed)
    MonteCarlo.from_scipy(stats.t(0.5), n_samples=20_000, seed=0)
