"""Reconstruction bounds for DP-SGD against a prior-free adversary.

The adversary controls the architecture and makes the model a linear
projection ``Y = W^T x``; the privatized gradient of the first layer then IS a
rescaled copy of the training example (Ziller et al., METHOD.md section 6)::

    X_hat = beta * X + xi,   beta = 1 / max(1, ||X||_2 / C),   xi ~ N(0, C^2 sigma^2 I_N).

Averaging ``T`` independent observations divides the noise variance by ``T``,
so every bound below depends on the noise only through
``sigma_eff = sigma / sqrt(T)``, and on the clipping norm only through
``s^2 = C^2 sigma^2 / T`` (the per-coordinate noise variance of the average).

Three groups of functions live here:

* closed-form moments and bounds: :func:`expected_mse`, :func:`mse_lower_bound`,
  :func:`psnr_upper_bound`, :func:`ncc_expected`, :func:`ncc_upper_bound`,
  :func:`worst_case_success`, collected by :func:`report` (for the noise
  multipliers :func:`report_sigma_range` gives);
* distributions: :func:`mse_cdf` (noncentral chi-square), the ReRo bounds
  :func:`rero_mse` and :func:`rero_psnr`, and :func:`ncc_cdf` (the sample
  Pearson correlation, reduced to a noncentral t variable); the central
  chi-square CDF ``P(N/2, x)`` they use is scipy's below ``N/2 = 1e5`` and Temme's
  uniform expansion from there (:func:`_gammainc_temme`: scipy's falls below the
  exact value there, by 35% at ``N = 2e8``);
* the attack itself: :func:`simulate_attack` and :func:`attack_metrics`, the
  Monte Carlo counterpart the bounds are tested against.

All public arguments are keyword-only (as in Opacus); everything is NumPy and
SciPy, no torch. A bound that float64 cannot hold as a normal number is refused
with a ValueError naming it and the range that works, never returned as 0, inf
or a subnormal: 0 would be a false upper bound, inf a false lower bound.

References
----------
T. Ziller, A. Ziller, ... G. Kaissis, "Bounding reconstruction attack success
of adversaries without data priors" (2024).
J. Dong, A. Roth, W. Su, "Gaussian differential privacy", JRSS-B (2022).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
import sys

import numpy as np
from scipy import integrate, special, stats

from hcrfast.backend import one_number

__all__ = [
    "AttackMetrics",
    "attack_metrics",
    "effective_sigma",
    "expected_mse",
    "mse_cdf",
    "mse_lower_bound",
    "mse_noncentrality",
    "ncc_cdf",
    "ncc_expected",
    "ncc_upper_bound",
    "psnr_upper_bound",
    "report",
    "report_sigma_range",
    "rero_mse",
    "rero_psnr",
    "simulate_attack",
    "worst_case_success",
]

# Equal-probability (quantile) nodes for integrating over the noise of the
# sample Pearson correlation in ncc_cdf. The integrand is bounded and monotone
# in the quantile, so the midpoint rule cannot err by more than 1/nodes; in
# practice (checked against 4e6-draw Monte Carlo and scipy.stats.nct) ~1e-5.
_NCC_NODES = 4096

# mse_cdf switches from scipy.stats.ncx2 to the Edgeworth expansion where
# N/2 + lam reaches this: the expansion's error (below 0.1 (N/2 + lam)^-1.5) is then
# under 1e-13, smaller than scipy's, which grows with lam and turns to NaN.
_NCX2_EDGEWORTH_FROM = 1e8

# float64's normal range. A bound that falls outside it is refused rather
# than returned as 0, inf or a subnormal with few correct digits: 0 would be a
# false upper bound on reconstruction quality, inf a false lower bound on MSE.
_TINY = sys.float_info.min
#: The PSNR upper bound is rounded up by this times the sum of its terms' sizes (2^-51, 2 ulps: each term, a
#: logarithm times a constant, is within 1.5 ulps of its value), the population NCC bound by ``_NCC_ROUND_UP``
#: relative (4 ulps: its quotient of a hypot is within 3), so that the floats are never below the exact bounds
_PSNR_ROUND_UP = 2.0**-51
_NCC_ROUND_UP = 2.0**-50
#: The finite-N NCC bound, from _pearson_mean's integral (to about 1e-14 relative; 6e-16 against mpmath at
#: N = 3 to 64), is rounded up by 2^-44 (5.7e-14)
_PEARSON_ROUND_UP = 2.0**-44
_HUGE = sys.float_info.max
_SQRT_TINY = math.sqrt(_TINY)
_SQRT_HUGE = math.sqrt(_HUGE)
_LOG10_TINY = math.log10(_TINY)
_LOG10_HUGE = math.log10(_HUGE)
_NORMAL_RANGE = "float64's normal range [2.2e-308, 1.8e+308]"
# N and T enter the formulas as float64, which holds every integer only up to 2**53.
_MAX_COUNT = 2**53


# --------------------------------------------------------------------------
# validation at the boundary
# --------------------------------------------------------------------------
def _real(name: str, value) -> float:
    value = one_number(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def _check_sigma(sigma) -> float:
    sigma = _real("sigma", sigma)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(
            f"sigma must be a positive finite noise multiplier, got {sigma!r}; "
            "pass the DP-SGD noise_multiplier (> 0)"
        )
    return sigma


def _check_clip(C) -> float:
    C = _real("C", C)
    if not (math.isfinite(C) and C > 0):
        raise ValueError(
            f"C must be a positive finite clipping norm, got {C!r}; "
            "pass DP-SGD's max_grad_norm (> 0)"
        )
    return C


def _int_text(value: int) -> str:
    """An integer for a message: in full if short, else as 1.23e+400 (digits counted exactly)."""
    digits = str(abs(value))
    if len(digits) <= 20:
        return str(value)
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"


def _check_count(name: str, value, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    value = one_number(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Integral):
        count = int(value)  # compared as an int: float() of a huge int would overflow
    else:
        as_float = float(value)
        if not (math.isfinite(as_float) and as_float == int(as_float)):
            raise ValueError(f"{name} must be an integer {what} >= {minimum}, got {value!r}")
        count = int(as_float)
    if count < minimum:
        raise ValueError(f"{name} must be an integer {what} >= {minimum}, got {_int_text(count)}")
    if maximum is not None and count > maximum:
        raise ValueError(
            f"{name} = {_int_text(count)} is too large: the bounds use {name} as a float64, which "
            f"holds every integer only up to 2**53 = {maximum}; pass {name} <= {maximum}"
        )
    return count


def _check_T(T) -> int:
    return _check_count("T", T, "number of DP-SGD steps", maximum=_MAX_COUNT)


def _check_N(N, minimum: int = 1) -> int:
    return _check_count("N", N, "data dimension (values per example)", minimum, maximum=_MAX_COUNT)


def _check_kappa(kappa) -> float:
    kappa = _real("kappa", kappa)
    if not (0.0 < kappa < 1.0):
        raise ValueError(
            f"kappa must be a prior success probability in (0, 1), got {kappa!r}; "
            "for an adversary guessing among m candidates use 1/m"
        )
    if kappa < _TINY:
        raise ValueError(
            f"kappa = {kappa!r} is a subnormal float64 (below 2.2e-308), too small to compute "
            "the success bound (at least kappa) to float precision; pass kappa >= 2.2e-308"
        )
    return kappa


def _check_beta(beta) -> float:
    beta = _real("beta", beta)
    if not (0.0 < beta <= 1.0):
        raise ValueError(
            f"beta must be a clipping factor in (0, 1], got {beta!r}; "
            "beta = 1 / max(1, ||X|| / C)"
        )
    return beta


def _check_nonneg(name: str, value, what: str) -> float:
    value = _real(name, value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite non-negative {what}, got {value!r}")
    return value


def _check_data_range(data_range) -> float:
    data_range = _real("data_range", data_range)
    if not (math.isfinite(data_range) and data_range > 0):
        raise ValueError(
            f"data_range must be a positive finite max(X) - min(X), got {data_range!r}; "
            "use 1.0 for images scaled to [0, 1]"
        )
    return data_range


def _real_array(name: str, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must be real numbers, got dtype {arr.dtype}")
    if np.iscomplexobj(arr) or arr.dtype == bool:
        raise TypeError(f"{name} must be real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not contain NaN")
    return arr


def _check_seed(seed):
    """A seed of the Monte Carlo draws: what ``numpy.random.default_rng`` takes, ``None`` excepted.

    That is a non-negative integer (NumPy's too), a non-empty sequence of them (a list, tuple, range or array),
    a ``numpy.random.SeedSequence``, a ``numpy.random.BitGenerator`` or a ``numpy.random.Generator``.
    ``None`` (fresh entropy from the OS, a different draw every call) is refused: the draws would not be
    repeatable. The three objects carry their own state, taken as it is: one made without a seed
    (``SeedSequence()``, ``PCG64()``) holds fresh entropy too, repeatable only from its recorded
    ``entropy``. A negative or fractional seed is refused here by name, not deep in NumPy."""
    if isinstance(seed, (np.random.Generator, np.random.SeedSequence, np.random.BitGenerator)):
        return seed
    what = ("seed must be a non-negative integer, a sequence of them, a numpy.random.SeedSequence, "
            "BitGenerator or Generator")
    if isinstance(seed, (collections.abc.Sequence, np.ndarray)) and not isinstance(seed, (str, bytes)):
        entries = list(np.asarray(seed, dtype=object).ravel()) if isinstance(seed, np.ndarray) else list(seed)
        if not entries:
            raise ValueError(f"{what}, got an empty {type(seed).__name__}; pass e.g. seed=0 or seed=[0, 1]")
        for entry in entries:
            if isinstance(entry, (bool, np.bool_)) or not isinstance(entry, numbers.Integral) or entry < 0:
                raise TypeError(f"{what}, got {type(seed).__name__} {seed!r} with entry {entry!r}; every entry "
                                f"must be an integer >= 0, e.g. seed=[0, 1]")
        return [int(entry) for entry in entries]
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{what}, got {type(seed).__name__} {seed!r}; pass e.g. seed=0 (the draws are then "
                        f"repeatable)")
    if seed < 0:
        raise ValueError(f"{what}, got {seed}; pass e.g. seed=0")
    return int(seed)


def _scalar_or_array(out: np.ndarray):
    return float(out) if out.ndim == 0 else out


def _sci(log10_value: float) -> str:
    """``10**log10_value`` written out (1e-320, 1.3e+154), also where float64 cannot hold it.

    An exponent of more than nine digits is written as a power, ``10^(-8e+299)``: its digits in full would
    run to hundreds, and past ~1e15 the digits of the mantissa are not those of the value. A log10 that
    itself overflowed (inf) says only that the value is beyond ``10^(+-1.8e+308)``.
    """
    if not math.isfinite(log10_value):
        return "10^(-1.8e+308) or less" if log10_value < 0 else "10^(1.8e+308) or more"
    if abs(log10_value) >= 1e9:
        return f"10^({log10_value:.3g})"
    exponent = math.floor(log10_value)
    mantissa = round(10.0 ** (log10_value - exponent), 2)
    if mantissa >= 10.0:
        mantissa, exponent = mantissa / 10.0, exponent + 1
    return f"{mantissa:.3g}e{exponent:+03d}"


def _sci_limit(log10_value: float, *, up: bool) -> str:
    """``10**log10_value`` to 5 significant digits, rounded up (``up``, a lower limit) or down (an upper
    limit) past the rounding of ``log10_value``: a threshold the user may pass as printed.

    Clamped to float64's normal range, which the value passed must lie in anyway: an upper limit above the
    largest float64 is printed as that, rounded down (1.7976e+308), a lower limit below the smallest normal as
    that, rounded up (2.2251e-308). Unclamped, 1.3407e+454 reads back as inf and 1.4917e-454 as 0, both
    refused, and a subnormal such as 1.4917e-314 as a neighbour that may fall past the limit. A lower limit
    above the largest float64, or an upper one below the smallest normal, is left as it is (no float64 meets
    it): every caller's limits are inside the range on that side (see each)."""
    # (clamped in log10: the edges print as float64's own, past the rounding 10 ** log10(_HUGE) would add)
    log10_value = max(log10_value, _LOG10_TINY) if up else min(log10_value, _LOG10_HUGE)
    exponent = math.floor(log10_value)
    # log10_value carries an absolute error ~1e-13 (|log10_value| <= ~630): 1e-10 relative covers it
    scaled = 10.0 ** (log10_value - exponent + 4.0)
    digits = math.ceil(scaled * (1.0 + 1e-10)) if up else math.floor(scaled * (1.0 - 1e-10))
    if digits >= 100_000:
        digits, exponent = digits // 10, exponent + 1
    elif digits < 10_000:
        digits, exponent = 99_999, exponent - 1
    mantissa = f"{digits // 10_000}.{digits % 10_000:04d}".rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent:+03d}"


def _noise_var(sigma: float, C: float, T: int) -> float:
    """Per-coordinate variance s^2 = C^2 sigma^2 / T of the averaged noise.

    Refused (ValueError) where it leaves float64's normal range: it would
    round to 0 or a subnormal (ratios by it turn into inf or lose their digits)
    or to inf. Where s^2 is in range, ``C sigma`` is too (T <= 2**53), so the
    product below cannot over- or underflow on the way.
    """
    noise_sd = C * sigma / math.sqrt(T)
    s2 = noise_sd * noise_sd
    if not _TINY <= s2 <= _HUGE:
        log_s2 = 2.0 * math.log10(C) + 2.0 * math.log10(sigma) - math.log10(T)
        log_root_T = 0.5 * math.log10(T)
        # Never empty once clamped (_sci_limit): C >= 4.9e-324 (the smallest subnormal) and sqrt(T) <= 9.5e7
        # keep the lower limit below 3e177 and the upper above 7.4e-155.
        raise ValueError(
            f"the noise variance C^2 sigma^2 / T = {_sci(log_s2)} (sigma = {sigma:g}, C = {C:g}, "
            f"T = {T}) is outside {_NORMAL_RANGE}; for this C and T pass "
            f"{_sci_limit(math.log10(_SQRT_TINY) + log_root_T - math.log10(C), up=True)} <= sigma <= "
            f"{_sci_limit(math.log10(_SQRT_HUGE) + log_root_T - math.log10(C), up=False)}"
        )
    return s2


# --------------------------------------------------------------------------
# closed forms
# --------------------------------------------------------------------------
def effective_sigma(*, sigma, T) -> float:
    r"""Noise multiplier of the average of ``T`` observations.

    .. math:: \sigma_\mathrm{eff} = \sigma / \sqrt{T}

    Parameters
    ----------
    sigma : float
        DP-SGD noise multiplier, > 0.
    T : int
        Number of steps (independent noisy observations), >= 1.

    Raises
    ------
    ValueError
        Where ``sigma / sqrt(T)`` would underflow float64's normal range.
    """
    sigma, T = _check_sigma(sigma), _check_T(T)
    sigma_eff = sigma / math.sqrt(T)
    if sigma_eff < _TINY:
        # (the limit, _TINY sqrt(T) <= 2.1e-300, is a normal float64)
        raise ValueError(
            f"sigma / sqrt(T) = {_sci(math.log10(sigma) - 0.5 * math.log10(T))} (sigma = {sigma:g}, "
            f"T = {T}) is below float64's smallest normal number 2.2e-308; for this T pass "
            f"sigma >= {_sci_limit(math.log10(_TINY) + 0.5 * math.log10(T), up=True)}"
        )
    return sigma_eff


def expected_mse(*, sigma, C, T=1, beta=1.0, mean_square=0.0) -> float:
    r"""Expected MSE of the linear-layer reconstruction.

    .. math::
        E[\mathrm{MSE}(X, \hat X)] = (1-\beta)^2 \frac{1}{N}\sum_i x_i^2
                                    + \frac{C^2\sigma^2}{T}

    Exact (no inequality): the clipping bias and the zero-mean noise are
    orthogonal in expectation.

    Parameters
    ----------
    sigma, C : float
        Noise multiplier and clipping norm, both > 0.
    T : int, default 1
        Number of averaged observations.
    beta : float in (0, 1], default 1.0
        Clipping factor ``1 / max(1, ||X|| / C)``; 1 means no clipping.
    mean_square : float >= 0, default 0.0
        ``(1/N) sum_i x_i^2`` (or its expectation over the data).

    Raises
    ------
    ValueError
        Where ``C^2 sigma^2 / T`` leaves float64's normal range, or the sum
        exceeds float64's largest number (it would be returned as inf).
    """
    sigma, C, T = _check_sigma(sigma), _check_clip(C), _check_T(T)
    beta = _check_beta(beta)
    mean_square = _check_nonneg("mean_square", mean_square, "mean of squared values")
    s2 = _noise_var(sigma, C, T)
    with np.errstate(over="ignore"):
        value = (1.0 - beta) ** 2 * mean_square + s2
    if not value <= _HUGE:
        log_clip = 2.0 * math.log10(1.0 - beta) + math.log10(mean_square)
        log_value = float(np.logaddexp(log_clip * math.log(10.0), math.log(s2))) / math.log(10.0)
        raise ValueError(
            f"the expected MSE (1 - beta)^2 mean_square + C^2 sigma^2 / T = {_sci(log_value)} "
            f"(beta = {beta!r}, mean_square = {mean_square:g}, sigma = {sigma:g}, C = {C:g}, T = {T}) "
            "is above float64's largest 1.8e+308; rescale the data (a smaller mean_square, and C and "
            "sigma with it) so that the MSE is below 1.8e+308"
        )
    return value


def mse_lower_bound(*, sigma, C, T=1) -> float:
    r"""Data-free lower bound on the expected MSE.

    .. math:: E[\mathrm{MSE}] \ge C^2\sigma^2 / T

    Holds for every example, clipped or not (the clipping term of
    :func:`expected_mse` is non-negative); equality without clipping.
    """
    return _noise_var(_check_sigma(sigma), _check_clip(C), _check_T(T))


def psnr_upper_bound(*, sigma, C, T=1, data_range=1.0, N=None) -> float:
    r"""Upper bound on the reconstruction PSNR (dB).

    Without ``N`` (METHOD.md section 6):

    .. math:: \mathrm{PSNR} \le 10\log_{10}\frac{E[(\max X-\min X)^2]\,T}{C^2\sigma^2}

    This bounds the PSNR *of the expected MSE*, ``10 log10(R^2 / E[MSE])``,
    because ``E[MSE] >= C^2 sigma^2 / T``. It is **not** a bound on ``E[PSNR]``:
    ``-log`` is convex, so Jensen goes the other way and ``E[PSNR]`` exceeds
    it by up to the gap below (about ``4.34 / N`` dB).

    With ``N`` the bound is on ``E[PSNR]`` itself. ``MSE = (s^2/N) chi^2_N(lambda)``
    with ``s^2 = C^2 sigma^2 / T`` and ``chi^2_N(lambda)`` stochastically
    dominates ``chi^2_N``, whose log-mean is ``psi(N/2) + ln 2``; so

    .. math::
        E[\mathrm{PSNR}] \le 10\log_{10}\frac{R^2 T}{C^2\sigma^2}
            + \frac{10}{\ln 10}\Bigl(\ln\frac N2 - \psi\bigl(\tfrac N2\bigr)\Bigr),

    with equality when nothing is clipped. ``R = data_range`` may be any upper
    bound of ``max X - min X`` (1 for images in [0, 1]); averaging over the data,
    ``log E[R^2] >= E[log R^2]`` keeps it a bound.

    Parameters
    ----------
    sigma, C : float
        Noise multiplier and clipping norm, > 0.
    T : int, default 1
    data_range : float, default 1.0
        ``max X - min X`` (or an upper bound of it), > 0.
    N : int, optional
        Data dimension. Given, the Jensen gap is added.

    Notes
    -----
    The logarithm is taken term by term, ``20 log10 R + 10 log10 T - 20 log10 C
    - 20 log10 sigma``: the ratio inside it over- or underflows float64 long
    before the bound does, so every positive finite input has a finite bound.
    """
    sigma, C, T = _check_sigma(sigma), _check_clip(C), _check_T(T)
    data_range = _check_data_range(data_range)
    terms = [20.0 * math.log10(data_range), 10.0 * math.log10(T), -20.0 * math.log10(C), -20.0 * math.log10(sigma)]
    if N is not None:
        terms.append(10.0 / math.log(10.0) * _log_minus_digamma(_check_N(N) / 2.0))
    # An upper bound: rounded up past each term's rounding (a few ulps of it; the digamma term's series errs high
    # already), as worst_case_success and the ReRo bounds are: it sat up to 2e-16 relative below the exact value
    return math.fsum(terms) + _PSNR_ROUND_UP * math.fsum(abs(t) for t in terms)


def _log_minus_digamma(x: float) -> float:
    r"""``ln x - psi(x)`` for ``x > 0``, to full relative precision.

    For large ``x`` the two terms agree to about ``log10(x)`` digits and their
    float difference is noise (it even turns negative near ``x = 1e17``), so
    from ``x = 10`` on the asymptotic series (Abramowitz & Stegun 6.3.18)

    .. math:: \ln x - \psi(x) = \frac1{2x} + \sum_{k\ge1} \frac{B_{2k}}{2k\,x^{2k}}

    is summed up to ``k = 7``. The first term left out, ``B_16 / (16 x^16)``,
    is negative and below ``5e-17`` in size: the truncated sum errs high, in
    the safe direction for the PSNR upper bound, by less than 1e-15 relative.
    """
    if x < 10.0:
        return math.log(x) - float(special.digamma(x))
    inv2 = 1.0 / (x * x)
    tail = inv2 * (1 / 12 + inv2 * (-1 / 120 + inv2 * (1 / 252 + inv2 * (
        -1 / 240 + inv2 * (1 / 132 + inv2 * (-691 / 32760 + inv2 * (1 / 12)))))))
    return 0.5 / x + tail


def ncc_expected(*, sigma, C, T=1, beta, variance, N=None) -> float:
    r"""Expected NCC (Pearson correlation) of the reconstruction with the data.

    Without ``N``, the population (large-``N``) value of METHOD.md section 6:

    .. math::
        E[\mathrm{NCC}] \approx \frac{\beta\,\mathrm{sd}(X)}
                                     {\sqrt{\beta^2\mathrm{Var}(X) + C^2\sigma^2/T}},

    the correlation of ``beta x_i + xi_i`` with ``x_i`` when the coordinates are
    treated as draws of one variable. For a finite ``N`` the sample Pearson
    coefficient differs from it by ``O(1/N)``.

    With ``N`` (>= 3) the exact finite-``N`` mean is returned: with ``x_c`` the
    centred example, the sample correlation is
    ``r = t / sqrt(t^2 + N - 2)`` where ``t`` is noncentral t with ``N - 2``
    degrees of freedom and noncentrality ``beta ||x_c|| / s`` (the slope
    t-statistic of regressing ``X_hat`` on ``X``), ``||x_c||^2 = N Var(X)``.
    The mean is computed from the exact one-dimensional integral of
    :func:`_pearson_mean` (to about 1e-14 relative).

    Parameters
    ----------
    sigma, C : float
    T : int, default 1
    beta : float in (0, 1]
        Clipping factor.
    variance : float >= 0
        Empirical variance of the example's values, ``(1/N) sum (x_i - mean)^2``.
    N : int, optional
        Data dimension; given, the exact finite-``N`` mean is computed.
    """
    sigma, C, T = _check_sigma(sigma), _check_clip(C), _check_T(T)
    beta = _check_beta(beta)
    variance = _check_nonneg("variance", variance, "variance of the example's values")
    noise_sd = math.sqrt(_noise_var(sigma, C, T))
    if N is not None:
        N = _check_N(N, minimum=3)
    if variance == 0.0:
        return 0.0
    # Ratios of standard deviations, not of variances: beta^2 Var(X) may overflow.
    signal_sd = beta * math.sqrt(variance)
    if N is None:
        return 1.0 / math.hypot(1.0, noise_sd / signal_sd)
    return _pearson_mean(signal_sd * math.sqrt(N) / noise_sd, N - 2)


def ncc_upper_bound(*, sigma, N=None, T=1, finite_n=False) -> float:
    r"""Upper bound on the NCC of any clipped example.

    After clipping ``||beta X|| <= C``, and ``N Var(X) = ||x_c||^2 <= ||X||^2``,
    so ``beta^2 Var(X) <= C^2 / N``. The population NCC of
    :func:`ncc_expected` increases with ``beta^2 Var(X)``, hence

    .. math::
        \mathrm{NCC} \le \sqrt{\frac{1}{1 + N\sigma^2/T}}
                     \le \sqrt{\frac{1}{1 + \sigma^2/T}}.

    ``C`` cancels. Without ``N`` the data-free right-hand side (``N = 1``) is
    returned. Equality needs a zero-mean example with ``||X|| >= C``.

    These bound the population NCC. The mean of the *sample* Pearson
    coefficient at finite ``N`` can exceed them by a relative ``O(1/N)``
    (about 3 % at ``N = 10``, 0.4 % at ``N = 64``). ``finite_n=True`` returns
    the rigorous finite-``N`` bound instead: the exact mean of the sample NCC
    (see :func:`ncc_expected`) at the largest noncentrality clipping allows,
    ``beta ||x_c|| / s = C / s = sqrt(T) / sigma``; the mean increases with the
    noncentrality, so no clipped example does better. Needs ``N >= 3``.

    Parameters
    ----------
    sigma : float
    N : int, optional
        Data dimension; omitted, the data-free bound.
    T : int, default 1
    finite_n : bool, default False
        Return the rigorous bound on the mean sample Pearson coefficient.

    Raises
    ------
    ValueError
        Where the bound would fall below float64's smallest normal number
        (``sigma`` above about ``sqrt(T / N) / 2.2e-308``): returning 0 there
        would understate the bound.
    """
    sigma, T = _check_sigma(sigma), _check_T(T)
    if not isinstance(finite_n, (bool, np.bool_)):
        raise TypeError(f"finite_n must be a bool, got {type(finite_n).__name__}")
    if finite_n:
        if N is None:
            raise ValueError("finite_n=True needs the data dimension N; pass N=...")
        N = _check_N(N, minimum=3)
        # sqrt(T) / sigma may overflow to inf; _pearson_mean returns the limit 1 then.
        bound = min(1.0, _pearson_mean(math.sqrt(T) / sigma, N - 2) * (1.0 + _PEARSON_ROUND_UP))
        what = "the finite-N NCC bound"
    else:
        N = 1 if N is None else _check_N(N)
        # 1 / sqrt(1 + N sigma^2 / T) as 1 / hypot(1, sigma sqrt(N / T)): sigma^2 overflows
        # from sigma = 1.3e154 on, and would turn a bound of 1e-200 into 0.
        bound = min(1.0, (1.0 + _NCC_ROUND_UP) / math.hypot(1.0, sigma * (math.sqrt(N) / math.sqrt(T))))
        what = "the NCC bound 1 / sqrt(1 + N sigma^2 / T)"
    if bound < _TINY:
        log_bound = -math.log10(sigma) - 0.5 * math.log10(N) + 0.5 * math.log10(T)
        # (the limit, sqrt(T / N) / _TINY >= 4.7e299, is above the smallest normal; above the largest, clamped)
        raise ValueError(
            f"{what} (sigma = {sigma:g}, N = {N}, T = {T}) is about {_sci(log_bound)}, below "
            f"float64's smallest normal number 2.2e-308; for this N and T pass sigma <= "
            f"{_sci_limit(log_bound + math.log10(sigma) - math.log10(_TINY), up=False)}"
        )
    return bound


def worst_case_success(*, kappa, sigma, T=1) -> float:
    r"""Reconstruction success bound for an informed adversary (Gaussian DP).

    T steps of the Gaussian mechanism with sensitivity ``C`` and noise
    ``C sigma`` compose to ``mu``-GDP with ``mu = sqrt(T) / sigma``; an
    adversary whose prior success is ``kappa`` then succeeds with probability

    .. math:: \Pr[\text{success}] \le \Phi\bigl(\Phi^{-1}(\kappa) + \mu\bigr).

    The value returned is that upper bound rounded up: it is at most a relative
    ``2e-14`` above ``Phi(Phi^-1(kappa) + mu)`` and never below it (checked against
    mpmath down to ``kappa = 1e-300``), and lies in ``[kappa, 1]``.

    Parameters
    ----------
    kappa : float in (0, 1)
        Prior success probability (e.g. 1/m for m candidates).
    sigma : float
    T : int, default 1
    """
    kappa, sigma, T = _check_kappa(kappa), _check_sigma(sigma), _check_T(T)
    mu = math.sqrt(T) / sigma  # inf where it overflows: Phi(inf) = 1 is then the rounded bound
    z = float(special.ndtri(kappa))
    s = z + mu
    if s >= 0.0 or math.isinf(mu):
        success = float(special.ndtr(s))
    else:
        # Deep in the lower tail Phi(s) has relative slope |s| (up to 38 here), so the half-ulp
        # errors of z = ndtri(kappa), of mu = sqrt(T) / sigma and of z + mu would cost ~1e-13.
        # All three are corrected to first order: z by one Newton step on Phi(z) = kappa, mu and
        # the sum by their exact rounding errors (Dekker's product, Knuth's TwoSum).
        z_lo = (kappa - _ndtr_lower(z)) / _npdf(z)
        mu_lo = 0.0
        if sigma < 1e290:  # else mu < 1e-282 and its rounding is far below an ulp of the result
            root_T = math.sqrt(T)
            sq_hi, sq_lo = _two_prod(root_T, root_T)
            root_T_lo = ((T - sq_hi) - sq_lo) / (2.0 * root_T)
            prod_hi, prod_lo = _two_prod(mu, sigma)
            mu_lo = (((root_T - prod_hi) - prod_lo) + root_T_lo) / sigma
        s_lo = (z - (s - (s - z))) + (mu - (s - z))  # TwoSum: z + mu = s + s_lo exactly
        mills = _npdf(s) / _ndtr_lower(s)
        success = _ndtr_lower(s) * (1.0 + mills * (z_lo + mu_lo + s_lo))
    # An upper bound: rounded up by 2^-46 (1.4e-14 relative), above the few ulps left (measured
    # against mpmath: below 3e-15), so that the float is never below Phi(Phi^-1(kappa) + mu).
    # The exact value lies in [kappa, 1], so the clamp is exact.
    return min(1.0, max(kappa, success * (1.0 + 2.0**-46)))


def _two_prod(a: float, b: float) -> tuple[float, float]:
    """``a*b = hi + lo`` exactly (Dekker's product; ``|a|, |b| < 1e290``)."""
    hi = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    return hi, ((a_hi * b_hi - hi) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _split(t: float) -> tuple[float, float]:
    c = 134217729.0 * t  # 2^27 + 1: t = hi + lo with 26-bit halves
    hi = c - (c - t)
    return hi, t - hi


def _npdf(t: float) -> float:
    """The standard normal density, with ``t^2`` kept exact (its rounding would cost |t|^2 ulps)."""
    hi, lo = _two_prod(t, t)
    return math.exp(-0.5 * hi) * (1.0 - 0.5 * lo) / math.sqrt(2.0 * math.pi)


def _ndtr_lower(t: float) -> float:
    """``Phi(t)`` for ``t <= 0`` to a few ulps: ``erfcx(-t / sqrt 2) exp(-t^2 / 2) / 2``."""
    hi, lo = _two_prod(t, t)
    return 0.5 * float(special.erfcx(-t / math.sqrt(2.0))) * math.exp(-0.5 * hi) * (1.0 - 0.5 * lo)


# --------------------------------------------------------------------------
# the regularized lower incomplete gamma function P(a, x) for large a
# --------------------------------------------------------------------------
# scipy.special.gammainc (and stats.chi2.cdf) sums the series of P(a, x) for at most 2000 terms
# outside |x - a| < 4.5 sqrt(a), and truncates it from a ~ 3e5 on, always BELOW the exact value:
# measured against mpmath (1F1 at 30 digits), -1e-11 at a = 3e5, -4.3e-6 at a = 1e6, -3% at
# a = 1e7, -35% at a = 1e8 (all at x = a - 5 sqrt(a)). Up to a = 2e5 its relative error is below
# 3e-13 wherever P is a normal number. From a = 1e5 on, P is computed here by Temme's uniform
# expansion instead (below 1e5, scipy is used, unchanged).
_GAMMAINC_TEMME_FROM = 1e5

# Taylor coefficients (in eta, from degree 0) of Temme's c_0(eta) ... c_3(eta) (DLMF 8.12.11:
# c_0 = 1/mu - 1/eta, c_k = c_{k-1}'(eta) / eta + (-1)^k g_k / mu, g_k the Stirling
# coefficients of Gamma*), derived in exact rational arithmetic and rounded once. Where the
# expansion is used, |eta| <= 0.13 (elsewhere P rounds to 0 or 1); the first omitted
# coefficients then contribute below 1e-28, and the omitted c_4 / a^4 below 1e-23.
_TEMME_C = (
    (-0.3333333333333333, 0.08333333333333333, -0.014814814814814815, 0.0011574074074074073,
     0.0003527336860670194, -0.0001787551440329218, 3.919263178522438e-05, -2.185448510679992e-06,
     -1.85406221071516e-06, 8.296711340953087e-07, -1.7665952736826078e-07, 6.707853543401498e-09,
     1.0261809784240309e-08, -4.382036018453353e-09, 9.14769958223679e-10, -2.5514193994946248e-11,
     -5.830772132550426e-11, 2.4361948020667415e-11, -5.0276692801141755e-12),
    (-0.001851851851851852, -0.003472222222222222, 0.0026455026455026454, -0.0009902263374485596,
     0.00020576131687242798, -4.018775720164609e-07, -1.8098550334489977e-05, 7.64916091608111e-06,
     -1.6120900894563446e-06, 4.647127802807434e-09, 1.378633446915721e-07, -5.752545603517705e-08,
     1.1951628599778148e-08, -1.7543241719747647e-11, -1.0091543710600413e-09, 4.162792991842583e-10,
     -8.56390702649298e-11),
    (0.004133597883597883, -0.0026813271604938273, 0.0007716049382716049, 2.0093878600823047e-06,
     -0.0001073665322636516, 5.2923448829120125e-05, -1.2760635188618728e-05, 3.423578734096138e-08,
     1.3721957309062934e-06, -6.298992138380055e-07, 1.4280614206064242e-07, -2.0477098421990866e-10,
     -1.409252991086752e-08, 6.228974084922022e-09, -1.3670488396617114e-09),
    (0.0006494341563786008, 0.00022947209362139917, -0.0004691894943952557, 0.00026772063206283885,
     -7.561801671883977e-05, -2.396505113867297e-07, 1.1082654115347302e-05, -5.6749528269915965e-06,
     1.4230900732435883e-06, -2.7861080291528143e-11, -1.6958404091930278e-07, 8.099464905388083e-08,
     -1.9111168485973655e-08),
)

# 2 (delta - log1p(delta)) / delta^2 - 1 = sum_{k >= 1} 2 (-1)^k delta^k / (k + 2), to degree 22:
# for |delta| <= 0.15 the omitted terms are below 1e-20.
_LOG1PMX_SERIES = (0.0,) + tuple(2.0 * (-1) ** k / (k + 2) for k in range(1, 23))

# Measured error of _gammainc_temme, a = 1e5 ... 2^52, x from where P is 2.2e-308 to 9 sqrt(a)
# above a: relative below 1e-14 where P <= 1/2 (largest at a ~ 1e5 in the far lower tail, below
# 1e-15 from a = 1e7 on), absolute below 3e-16 where P > 1/2 (relative 6e-16). Oracles: mpmath's
# x^a e^-x / Gamma(a+1) 1F1(1; a+1; x) at 30-50 digits up to a = 1e12, and at a = 2^52 (where
# that 1F1 is itself off by 1.5e-4) Gauss-Legendre quadrature of the density at 40 digits.
# The ReRo upper bounds are rounded up by 2^-43 (1.1e-13), ten times that, so that they are
# never below the exact P.
_TEMME_ROUND_UP = 2.0**-43


def _gammainc_temme(a: float, x) -> np.ndarray:
    r"""``P(a, x)`` for ``a >= 1e5`` by Temme's uniform asymptotic expansion (DLMF 8.12.3-4).

    With ``T = a (delta - log1p(delta))``, ``delta = (x - a) / a`` and
    ``eta = sign(delta) sqrt(2 T / a)``,

    .. math::
        P(a, x) = e^{-T}\Bigl[\tfrac12 \mathrm{erfcx}(\sqrt T)
                  - \frac{1}{\sqrt{2\pi a}}\sum_{k=0}^{3} c_k(\eta)\,a^{-k}\Bigr]  \quad (x < a),
        \qquad 1 - P(a, x) = e^{-T}\Bigl[\tfrac12 \mathrm{erfcx}(\sqrt T)
                  + \frac{1}{\sqrt{2\pi a}}\sum_{k=0}^{3} c_k(\eta)\,a^{-k}\Bigr] \quad (x \ge a).

    ``T`` is formed without cancellation: ``x - a`` is exact (Sterbenz), its square is kept
    as an exact double-double and divided by ``2a`` to double-double, times the series
    ``2 (delta - log1p(delta)) / delta^2 = 1 + O(delta)``, so that ``e^{-T}`` loses about
    ``0.1 T`` ulps (not ``3 T``, as ``exp(a log1pmx(delta))`` would). Where ``|delta| > 0.15``,
    ``T > 1000`` and ``P`` is 0 or 1 in float64. Accuracy: see ``_TEMME_ROUND_UP``.
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        d = x - a
        delta = d / a
        near = np.abs(delta) <= 0.15
        # T near a: d^2 / (2a) as hi + lo, times 1 + h(delta).
        p_hi, p_lo = _two_prod(d, d)
        q = p_hi / (2.0 * a)
        r_hi, r_lo = _two_prod(q, 2.0 * a)
        q_lo = (((p_hi - r_hi) - r_lo) + p_lo) / (2.0 * a)
        corr = q_lo + q * np.polynomial.polynomial.polyval(delta, _LOG1PMX_SERIES)
        t_hi = q + corr
        t_lo = (q - t_hi) + corr
        far_t = a * (np.maximum(delta, -1.0) - np.log1p(np.maximum(delta, -1.0)))
        t_hi = np.where(near, t_hi, far_t)
        t_lo = np.where(near, t_lo, 0.0)
        lower = delta < 0.0
        eta = np.sqrt(2.0 * t_hi / a)
        eta = np.clip(np.where(lower, -eta, eta), -0.2, 0.2)  # beyond, e^{-T} = 0
        series = np.zeros_like(eta)
        for k in range(len(_TEMME_C) - 1, -1, -1):
            series = series / a + np.polynomial.polynomial.polyval(eta, _TEMME_C[k])
        bracket = (0.5 * special.erfcx(np.sqrt(t_hi))
                   + np.where(lower, -series, series) / math.sqrt(2.0 * math.pi * a))
        tail = np.exp(-t_hi) * (1.0 - t_lo) * bracket  # P (x < a) or 1 - P (x >= a)
        out = np.where(lower, tail, 1.0 - tail)
    out = np.where(x <= 0.0, 0.0, np.where(np.isposinf(x), 1.0, out))
    return np.clip(out, 0.0, 1.0)


#: The unit roundoff of float64 (half its eps): the rounding of one operation, relative.
_UNIT = 2.0**-53
#: SciPy's ``gammainc`` below ``a = 1e5`` errs in the lower tail by up to 3.2e-13 at a = 500, x = 150 and 3.8e-12
#: at a = 2158, x = 863 (against mpmath at 60 digits, 2026-12-02): the ReRo bounds taken from it are rounded up
#: by 2^-40 (9.1e-13) plus 8 units times the size of the terms of its logarithm, a ln x, x and ln Gamma(a + 1).
_SCIPY_ROUND_UP = 2.0**-40


def _gammainc_up(a: float, x, x_rel=0.0) -> np.ndarray:
    """``P(a, x)`` for an upper bound: scipy below ``a = 1e5`` rounded up by ``_SCIPY_ROUND_UP``, from there
    Temme's expansion rounded up by ``_TEMME_ROUND_UP`` (never below the exact ``P``; at most 1). ``x_rel``:
    how far ``x``, computed in float64, may be below the exact argument, relative; ``P`` grows with ``x``, so
    it is evaluated at ``x (1 + x_rel)``. Far in the lower tail ``P``'s relative error is ``|a - x|`` times
    ``x``'s: at ``N = 10**6`` the ``x`` rounded as it came put ``rero_mse`` 2.7e-12 below the exact ``P``,
    past the 2^-43 margin (found 2026-12-02); scipy's values had no margin at all."""
    with np.errstate(over="ignore", under="ignore"):   # (x = inf stays inf: the limit 1 is exact)
        x = np.asarray(x, dtype=np.float64) * (1.0 + np.asarray(x_rel, dtype=np.float64))
        if a < _GAMMAINC_TEMME_FROM:
            # SciPy forms x^a e^-x / Gamma(a + 1) from its logarithm: its relative error grows with the terms'
            # sizes (-3.8e-12 at a = 2158, x = 863, where they are ~3e4), past a fixed 2^-40
            inside = (x > 0.0) & np.isfinite(x)
            safe = np.where(inside, x, 1.0)
            terms = np.where(inside, np.abs(a * np.log(safe)) + safe + math.lgamma(a + 1.0), 0.0)
            return np.minimum(1.0, np.asarray(special.gammainc(a, x), dtype=np.float64)
                              * (1.0 + _SCIPY_ROUND_UP + 8.0 * _UNIT * terms))
        return np.minimum(1.0, _gammainc_temme(a, x) * (1.0 + _TEMME_ROUND_UP))


# --------------------------------------------------------------------------
# distributions and ReRo
# --------------------------------------------------------------------------
def mse_noncentrality(*, sigma, C, T=1, beta, sq_norm) -> float:
    r"""Noncentrality of the scaled MSE, in units of the averaged noise.

    .. math:: \lambda = \frac{(1-\beta)^2\,\|X\|^2\,T}{C^2\sigma^2}

    (METHOD.md writes the ``T = 1`` case.) ``sq_norm`` is ``||X||^2``.
    """
    sigma, C, T = _check_sigma(sigma), _check_clip(C), _check_T(T)
    beta = _check_beta(beta)
    sq_norm = _check_nonneg("sq_norm", sq_norm, "squared norm ||X||^2")
    return (1.0 - beta) ** 2 * sq_norm / _noise_var(sigma, C, T)


def mse_cdf(eta, *, sigma, C, N, T=1, lam=0.0):
    r"""CDF of the reconstruction MSE.

    .. math::
        \mathrm{MSE} \sim \frac{s^2}{N}\,\chi^2_N(\lambda), \quad s^2 = \frac{C^2\sigma^2}{T},
        \qquad \Pr[\mathrm{MSE} \le \eta] = F_{\chi^2_N(\lambda)}\!\Bigl(\frac{N\eta}{s^2}\Bigr).

    Parameters
    ----------
    eta : float or array_like
        MSE threshold(s).
    sigma, C : float
    N : int
    T : int, default 1
    lam : float >= 0, default 0.0
        Noncentrality (:func:`mse_noncentrality`); 0 means no clipping.

    Returns
    -------
    float or ndarray
        Same shape as ``eta``; never NaN.

    Notes
    -----
    ``lam = 0`` is the central chi-square, ``P(N/2, q/2)``: ``scipy.stats.chi2`` while
    ``N/2 < 1e5``; from ``N/2 = 1e5`` on (where scipy truncates a series and falls below
    the exact value: by 4e-6 at ``N = 2e6``, 35% at ``N = 2e8``, 5 standard deviations below
    the mean) Temme's uniform expansion of :func:`_gammainc_temme`, whose measured relative
    error is below 1e-14 where the CDF is at most 1/2 (absolute 3e-16 above). For
    ``lam > 0``, ``scipy.stats.ncx2`` is used while ``N/2 + lam < 1e8``; from there
    on (where scipy's error grows past 1e-13 and it returns NaN, from about
    ``lam = 5e10`` or ``N = 1e12``) the second-order Edgeworth expansion of
    :func:`_ncx2_cdf_edgeworth`, whose absolute error is below
    ``0.1 (N/2 + lam)^{-3/2}``, i.e. 1e-13 at the switch and less beyond it. At
    the switch the CDF steps by scipy's own error there, a few 1e-12. As ``lam -> 0+`` the
    CDF tends to its ``lam = 0`` value (to 2e-13 relative, scipy's ncx2 error, within 5
    standard deviations of the mean for ``N <= 2e7``; to the expansion's absolute error
    beyond).
    """
    sigma, C, N, T = _check_sigma(sigma), _check_clip(C), _check_N(N), _check_T(T)
    lam = _check_nonneg("lam", lam, "noncentrality")
    eta, s2 = _real_array("eta", eta), _noise_var(sigma, C, T)
    # q = inf where eta is huge: the CDF's limit 1 is then exact; q = 0 where it is tiny: the CDF's limit 0 is
    # then exact, or scipy's to its last bit
    with np.errstate(over="ignore", under="ignore"):
        q = N * eta / s2
    if lam == 0.0 and 0.5 * N >= _GAMMAINC_TEMME_FROM:
        out = _gammainc_temme(0.5 * N, 0.5 * q)  # scipy's chi2 is up to 35% low there
    elif lam == 0.0:
        out = stats.chi2.cdf(q, N)
    elif 0.5 * N + lam >= _NCX2_EDGEWORTH_FROM:
        out = _ncx2_cdf_edgeworth(q, N, lam)
    else:
        try:
            out = np.asarray(stats.ncx2.cdf(q, N, lam), dtype=np.float64)
        except OverflowError:  # scipy 1.16's ncx2 raises deep in the lower tail (q = 1e-300, lam = 1e6)
            out = np.array([_ncx2_cdf_or_nan(x, N, lam) for x in np.ravel(q)]).reshape(np.shape(q))
        failed = np.isnan(out)  # not seen below the switch; never passed on as NaN
        if failed.any():
            out = np.where(failed, _ncx2_cdf_edgeworth(q, N, lam), out)
    return _scalar_or_array(np.asarray(out, dtype=np.float64))


def _ncx2_cdf_or_nan(q: float, k: int, lam: float) -> float:
    """``scipy.stats.ncx2.cdf`` at one ``q``, NaN where scipy raises OverflowError: :func:`mse_cdf` then
    takes the Edgeworth expansion there and keeps scipy's value at every other ``q``."""
    try:
        return float(stats.ncx2.cdf(q, k, lam))
    except OverflowError:
        return math.nan


def _ncx2_cdf_edgeworth(q, k: int, lam: float) -> np.ndarray:
    r"""CDF of ``chi^2_k(lam)`` at ``q`` by its Edgeworth expansion to second order.

    With the cumulants ``kappa_r = 2^{r-1} (r-1)! (k + r lam)``, ``u = k/2 + lam``,
    ``z = (q - lam - k) / (2 sqrt(u))`` (mean ``k + lam``, variance ``2(k + 2 lam) = 4u``),
    skewness ``g1 = 2 (1 + lam / 2u) / sqrt(u)`` and excess kurtosis ``g2 = 6 (1 + lam / u) / u``,

    .. math::
        F \approx \Phi(z) - \varphi(z)\Bigl[\tfrac{g_1}{6}He_2(z) + \tfrac{g_2}{24}He_3(z)
                 + \tfrac{g_1^2}{72}He_5(z)\Bigr].

    The error is ``O(u^{-3/2})``; measured against the exact ``k = 1`` form
    ``Phi(sqrt q - sqrt lam) - Phi(-sqrt q - sqrt lam)`` and against scipy it is below
    ``0.1 u^{-3/2}`` (1e-13 from ``u = 1e8`` on). Nothing here overflows: ``q - lam``
    is formed first, and ``z`` is clipped to [-40, 40], where ``Phi`` is already 0 or 1.
    """
    u = 0.5 * k + lam
    g1 = 2.0 * (1.0 + 0.5 * lam / u) / math.sqrt(u)
    g2 = 6.0 * (1.0 + lam / u) / u
    with np.errstate(over="ignore", invalid="ignore"):
        z = ((np.asarray(q, dtype=np.float64) - lam) - k) / (2.0 * math.sqrt(u))
    z = np.clip(z, -40.0, 40.0)
    z2 = z * z
    correction = (g1 / 6.0 * (z2 - 1.0) + g2 / 24.0 * z * (z2 - 3.0)
                  + g1 * g1 / 72.0 * z * (z2 * (z2 - 10.0) + 15.0))
    with np.errstate(under="ignore"):   # the density's factor is 0 (to float64) out in the tails: the CDF is ndtr's
        cdf = special.ndtr(z) - np.exp(-0.5 * z2) / math.sqrt(2.0 * math.pi) * correction
    return np.clip(cdf, 0.0, 1.0)


def _log_gammainc_small(a: float, log_x: float) -> float:
    r"""``ln P(a, x)`` from ``ln x``, for ``x < a + 1`` (where ``P`` underflows float64).

    ``P(a, x) = x^a e^{-x} / Gamma(a + 1) * sum_n x^n / ((a+1)...(a+n))`` (A&S 6.5.29); the
    series is summed over 10^5 terms and the rest bounded by a geometric tail. Only used to
    say in a message how small a refused bound is.
    """
    x = math.exp(log_x) if log_x > -745.0 else 0.0
    log_sum = 0.0
    if x > 0.0:
        n = np.arange(1, 100_001, dtype=np.float64)
        with np.errstate(under="ignore"):   # the terms past float64's smallest add nothing to the sum
            terms = np.exp(np.cumsum(log_x - np.log(a + n)))
        ratio = x / (a + n[-1] + 1.0)
        log_sum = math.log1p(float(terms.sum()) + float(terms[-1]) * ratio / (1.0 - ratio))
    return a * log_x - x - math.lgamma(a + 1.0) + log_sum


def _gammainc_normal_from(a: float, log_x_below: float) -> float:
    """``ln x`` of the smallest ``x`` with ``P(a, x) >= 2.2e-308``, by bisection on ``ln x`` from
    ``ln x_below`` (where ``P`` is below it) to ``ln(a + 1)`` (where ``P`` is far above)."""
    lo, hi = max(log_x_below, -800.0), math.log(a + 1.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _gammainc_up(a, math.exp(mid)) >= _TINY:
            hi = mid
        else:
            lo = mid
    return hi


def _refuse_tiny_rero(gamma, log_x, thresholds, positive, *, a, what, eta_name, fix) -> None:
    """Refuse a ReRo bound that is positive but below float64's smallest normal number.

    ``gamma`` is the computed ``P(a, x)``, ``log_x`` its ``ln x``; ``positive`` marks where the
    exact bound is positive (elsewhere 0 is exact). ``fix(ln x*)`` says which thresholds work.
    """
    bad = positive & ~(gamma >= _TINY)
    if not bad.any():
        return
    i = np.flatnonzero(bad.ravel())[0]
    lx = float(np.ravel(log_x)[i])
    log10_bound = _log_gammainc_small(a, lx) / math.log(10.0)
    raise ValueError(
        f"the ReRo bound {what} at {eta_name} = {float(np.ravel(thresholds)[i])!r} is about "
        f"{_sci(log10_bound)}, below float64's smallest normal number 2.2e-308 (0 would be a "
        f"false upper bound on the success probability); {fix(_gammainc_normal_from(a, lx))}"
    )


def rero_mse(*, eta, sigma, C, N, T=1):
    r"""ReRo bound: probability that the reconstruction MSE is at most ``eta``.

    .. math::
        \Pr[\mathrm{MSE} \le \eta] \le \gamma
            = P\Bigl(\frac N2, \frac{N\eta\,T}{2C^2\sigma^2}\Bigr)

    with ``P`` the regularized lower incomplete gamma function (the central
    chi-square CDF). Holds for every example: a clipped one has a noncentral
    chi-square, which is stochastically larger.

    ``P`` is ``scipy.special.gammainc`` while ``N/2 < 1e5``; from there on (where scipy
    returns values below the exact one, 35% below at ``N = 2e8``) Temme's uniform expansion
    (:func:`_gammainc_temme`, relative error below 1e-14), rounded up by 2^-43 (1.1e-13) so
    that the bound is never below the exact ``P``.

    For ``eta <= 0`` the bound is exactly 0 (the MSE is never negative) and is
    returned as 0.

    Raises
    ------
    ValueError
        Where ``eta > 0`` but the bound is below float64's smallest normal
        number (e.g. ``eta = 0.01`` at ``sigma = C = 1``, ``N = 784``: about
        7.07e-618): 0 or a subnormal would understate an upper bound. The
        message gives the smallest ``eta`` whose bound is representable.
    """
    sigma, C, N, T = _check_sigma(sigma), _check_clip(C), _check_N(N), _check_T(T)
    eta_in = _real_array("eta", eta)
    eta = np.maximum(eta_in, 0.0)
    s2 = _noise_var(sigma, C, T)
    a = N / 2.0
    with np.errstate(over="ignore", under="ignore"):  # x = inf where eta is huge: the limit 1 is exact
        # x's rounding: s^2 (3.5 units, _noise_var), N eta, the division: 8 units bound it
        gamma = _gammainc_up(a, N * eta / (2.0 * s2), 8.0 * _UNIT)
    with np.errstate(divide="ignore"):
        log_x = math.log(a) + np.log(eta) - math.log(s2)

    def fix(log_x_star: float) -> str:
        # P(a, x*) = _TINY < 1/2 puts x* below a, so eta's limit 2 x* s^2 / N = (x* / a) s^2 is below s^2 <=
        # _HUGE; below the smallest normal it is clamped (_sci_limit)
        log10_eta = (log_x_star + math.log(2.0) + math.log(s2) - math.log(N)) / math.log(10.0)
        return (f"for sigma = {sigma:g}, C = {C:g}, N = {N}, T = {T} pass "
                f"eta >= {_sci_limit(log10_eta, up=True)} (or eta <= 0, whose bound is exactly 0), or a smaller sigma")

    _refuse_tiny_rero(gamma, log_x, eta_in, eta_in > 0, a=a, what="Pr[MSE <= eta]",
                      eta_name="eta", fix=fix)
    return _scalar_or_array(np.asarray(gamma, dtype=np.float64))


def rero_psnr(*, eta, sigma, C, N, T=1, data_range=1.0):
    r"""ReRo bound: probability that the reconstruction PSNR is at least ``eta`` dB.

    ``PSNR >= eta`` iff ``MSE <= eta_hat``,
    ``eta_hat = 10^{2 log10(R) - eta/10}``, so

    .. math::
        \Pr[\mathrm{PSNR} \ge \eta] \le P\Bigl(\frac N2, \frac{N\hat\eta\,T}{2C^2\sigma^2}\Bigr),

    i.e. METHOD.md's ``Pr[PSNR <= eta] = 1 - P(...)`` (an equality without
    clipping, ``>=`` with it). ``data_range`` may be any upper bound of
    ``R = max X - min X``: a larger ``R`` only loosens the bound.

    ``eta = inf`` gives exactly 0. ``x = N eta_hat T / (2 C^2 sigma^2)`` is formed
    from its logarithm, so ``eta_hat`` underflowing does not matter. ``P`` is computed
    as in :func:`rero_mse` (scipy while ``N/2 < 1e5``, else Temme's expansion rounded up).

    Raises
    ------
    ValueError
        Where the bound is positive but below float64's smallest normal number
        (e.g. ``eta = 30`` dB at ``sigma = C = 1``, ``N = 784``): 0 or a subnormal
        would understate an upper bound. The message gives the largest ``eta``
        (in dB) whose bound is representable.
    """
    sigma, C, N, T = _check_sigma(sigma), _check_clip(C), _check_N(N), _check_T(T)
    data_range = _check_data_range(data_range)
    eta = _real_array("eta", eta)
    s2 = _noise_var(sigma, C, T)
    a = N / 2.0
    # x = N eta_hat / (2 s^2) through its logarithm: eta_hat alone may underflow where x does not.
    log10_x = math.log10(a) - math.log10(s2) + 2.0 * math.log10(data_range) - eta / 10.0
    with np.errstate(over="ignore", under="ignore"):  # x = inf for very negative eta: the limit 1 is exact
        # x's rounding: each log10 and sum rounds at a unit of its size (s^2's own 3.5 units add 1.5e-16
        # to its log10), 10 ** at one unit of x: ln(10) times the absolute error of log10_x, and 2 units
        terms = (abs(math.log10(a)) + abs(math.log10(s2)) + 2.0 * abs(math.log10(data_range))
                 + np.where(np.isfinite(eta), np.abs(eta), 0.0) / 10.0)   # (eta = inf: x = 0, exactly)
        gamma = _gammainc_up(a, 10.0 ** log10_x, math.log(10.0) * 4.0 * _UNIT * (terms + 1.0) + 4.0 * _UNIT)

    def fix(log_x_star: float) -> str:
        # PSNR >= eta  iff  x <= x*: the largest eta is 10 (log10(a / s^2) + 2 log10 R - log10 x*).
        eta_max = 10.0 * (math.log10(a) - math.log10(s2) + 2.0 * math.log10(data_range)
                          - log_x_star / math.log(10.0))
        return (f"for sigma = {sigma:g}, C = {C:g}, N = {N}, T = {T}, data_range = {data_range:g} pass "
                f"eta <= {math.floor(eta_max * 100.0) / 100.0:.2f} dB, or a smaller sigma")

    # PSNR = +inf has probability 0: the bound at eta = inf is exactly 0.
    _refuse_tiny_rero(gamma, log10_x * math.log(10.0), eta, np.isfinite(eta), a=a,
                      what="Pr[PSNR >= eta]", eta_name="eta", fix=fix)
    return _scalar_or_array(np.asarray(gamma, dtype=np.float64))


def _pearson_mean(nc: float, dof: int) -> float:
    r"""``E[z / sqrt(z^2 + w)]``, ``z ~ N(nc, 1)``, ``w ~ chi^2_dof``, ``nc >= 0``.

    Writing ``(z^2 + w)^{-1/2} = pi^{-1/2} int_0^inf t^{-1/2} e^{-t(z^2 + w)} dt``
    and taking the Gaussian and chi-square expectations inside gives the exact
    one-dimensional form (with ``u = 2t / (1 + 2t) = v^2``)

    .. math::
        E = \sqrt{2/\pi}\;\mathrm{nc}\int_0^1 (1 - v^2)^{\mathrm{dof}/2}
            e^{-\mathrm{nc}^2 v^2 / 2}\,dv
          = \mathrm{nc}\,\frac{\Gamma(\frac{\mathrm{dof}}2 + 1)}
            {\sqrt2\,\Gamma(\frac{\mathrm{dof}+3}2)}\;
            {}_1F_1\Bigl(\tfrac12; \tfrac{\mathrm{dof}+3}2; -\tfrac{\mathrm{nc}^2}2\Bigr),

    the mean of the cosine between ``N(nc e_1, I_{dof+1})`` and ``e_1``
    (``dof = 0`` gives ``erf(nc / sqrt 2)``). SciPy's ``hyp1f1`` loses digits
    for large ``dof`` and ``nc``, so the integral is evaluated instead, after
    ``v = h s``, ``h = 1 / sqrt(nc^2 + dof)``: the integrand is then at most
    ``exp(-s^2 / 2)`` and has unit width for every ``nc`` and ``dof``, and
    ``integrate.quad`` reaches about 1e-14 relative (checked against mpmath).
    Nothing is squared that could overflow: ``nc h = 1 / hypot(1, sqrt(dof) / nc)``.
    """
    if nc == 0.0:
        return 0.0
    if math.isinf(nc):
        return 1.0
    h = 1.0 / math.hypot(nc, math.sqrt(dof))
    nc_h = 1.0 / math.hypot(1.0, math.sqrt(dof) / nc)
    a, h2, half_dof = nc_h * nc_h, h * h, 0.5 * dof

    def integrand(s: float) -> float:
        return math.exp(-0.5 * a * s * s + half_dof * math.log1p(-h2 * s * s))

    # exp(-s^2/2) bounds the integrand: past s = 40 it is below 1e-347.
    integral, _ = integrate.quad(integrand, 0.0, min(1.0 / h, 40.0), epsabs=0.0, epsrel=1e-13,
                                 limit=200)
    return min(1.0, math.sqrt(2.0 / math.pi) * nc_h * integral)


#: :func:`ncc_cdf`'s thresholds per piece of its quadrature (a piece's array: 256 x 4,096 float64, 8 MB).
_NCC_PIECE = 256


def ncc_cdf(x, *, sigma, C, N, T=1, beta=1.0, variance, n_samples=None, seed=None):
    r"""CDF of the reconstruction NCC (sample Pearson correlation).

    Centring removes the mean direction; in the remaining ``N - 1`` dimensions
    the noise is isotropic, so with ``a = beta ||x_c||`` (``||x_c||^2 = N Var(X)``),
    ``z ~ N(a/s, 1)`` along ``x_c`` and ``w ~ chi^2_{N-2}`` orthogonal to it,

    .. math::
        r = \frac{z}{\sqrt{z^2 + w}}, \qquad
        \Pr[r \le x] = E_w\Bigl[\Phi\Bigl(\frac{x}{\sqrt{1-x^2}}\sqrt w - \frac{a}{s}\Bigr)\Bigr]

    (``r sqrt(N-2) / sqrt(1 - r^2)`` is noncentral t). By default the
    expectation over ``w`` is a midpoint rule on 4096 equal-probability nodes:
    the integrand is monotone and bounded, so the error is below 1/4096.
    With ``n_samples`` the CDF is instead estimated from that many seeded
    draws of ``(z, w)``.

    Parameters
    ----------
    x : float or array_like
        NCC threshold(s); values outside [-1, 1] give 0 or 1.
    sigma, C : float
    N : int >= 3
    T : int, default 1
    beta : float in (0, 1], default 1.0
    variance : float >= 0
        Empirical variance of the example's values.
    n_samples : int, optional
        Monte Carlo sample size; omitted, deterministic quadrature.
    seed : int >= 0, sequence of them, or numpy.random.SeedSequence/BitGenerator/Generator
        Seed of the Monte Carlo draws: required with ``n_samples``. Without ``n_samples`` nothing is
        drawn and a seed (still checked) changes nothing: the quadrature is deterministic.

    Returns
    -------
    float or ndarray
        Same shape as ``x``.
    """
    sigma, C, T = _check_sigma(sigma), _check_clip(C), _check_T(T)
    N = _check_N(N, minimum=3)
    beta = _check_beta(beta)
    variance = _check_nonneg("variance", variance, "variance of the example's values")
    x = _real_array("x", x)
    if n_samples is not None:
        n_samples = _check_count("n_samples", n_samples, "Monte Carlo sample size")
        if seed is None:
            raise TypeError("ncc_cdf with n_samples draws at random and needs seed= (e.g. a non-negative integer or a "
                            "numpy.random.Generator) to be repeatable; pass e.g. seed=0, or drop n_samples for "
                            "the deterministic quadrature")
    if seed is not None:
        seed = _check_seed(seed)
    # nc = beta sqrt(N Var(X)) / s from ratios of standard deviations: N Var(X) and Var(X) / s^2
    # may overflow where nc does not. Where nc itself exceeds float64, it is inf: r = 1 then.
    noise_sd = math.sqrt(_noise_var(sigma, C, T))
    with np.errstate(over="ignore"):
        nc = float(np.float64(beta * math.sqrt(variance)) * math.sqrt(N) / noise_sd)
    inside = np.clip(x, -1.0, 1.0)
    with np.errstate(divide="ignore"):
        slope = inside / np.sqrt(1.0 - inside**2)
    if n_samples is None:
        p = (np.arange(_NCC_NODES) + 0.5) / _NCC_NODES
        root_w = np.sqrt(stats.chi2.ppf(p, N - 2))
        # in pieces of _NCC_PIECE thresholds: one (thresholds x nodes) array took 75 KB a threshold (3.1 GB
        # at 40,000)
        flat = slope.reshape(-1)
        cdf = np.empty(flat.size, dtype=np.float64)
        for lo in range(0, flat.size, _NCC_PIECE):
            with np.errstate(invalid="ignore"):
                arg = flat[lo:lo + _NCC_PIECE, None] * root_w - nc
            cdf[lo:lo + _NCC_PIECE] = special.ndtr(arg).mean(axis=1)
        cdf = cdf.reshape(x.shape)
    else:
        rng = np.random.default_rng(seed)
        z = nc + rng.standard_normal(n_samples)
        root_w = np.sqrt(rng.chisquare(N - 2, n_samples))
        # z / sqrt(z^2 + w) without squaring z (which overflows for huge nc): 1 where z = inf.
        with np.errstate(divide="ignore"):
            r = np.sort(np.sign(z) / np.hypot(1.0, root_w / z))
        cdf = np.searchsorted(r, inside, side="right") / n_samples
    cdf = np.where(x >= 1.0, 1.0, np.where(x <= -1.0, 0.0, cdf))
    return _scalar_or_array(np.asarray(cdf, dtype=np.float64))


# --------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------
def report_sigma_range(*, C, N, T=1) -> tuple[float, float]:
    r"""The noise multipliers for which :func:`report` can represent every quantity.

    Each positive quantity of the report must be a normal float64 (between
    ``2.2e-308`` and ``1.8e308``); outside, it would round to 0, inf or a
    subnormal with few correct digits, and a bound of 0 or inf is false. With
    ``t``, ``h`` float64's smallest normal and largest numbers:

    * ``sigma / sqrt(T) >= t`` (``sigma_eff``);
    * ``sqrt(t) <= C sigma / sqrt(T) <= sqrt(h)`` (``mse = C^2 sigma^2 / T``);
    * ``sigma sqrt(N / T) <= 1 / t`` (``ncc``; ``ncc_finite_n`` is larger);
    * ``mu = sqrt(T) / sigma``, ``psnr`` and ``worst_case_success`` then hold.

    The range returned is shrunk by a relative ``2**-48`` at both ends, so
    that the roundings of the formulas cannot push a quantity at an edge out.

    Returns
    -------
    (float, float)
        ``(lo, hi)``: :func:`report` accepts ``lo <= sigma <= hi``.
    """
    C, N, T = _check_clip(C), _check_N(N), _check_T(T)
    root_T = math.sqrt(T)
    lo = max(_TINY * root_T, _SQRT_TINY * root_T / C)
    # Terms that overflow become inf and drop out of the min.
    hi = min(_HUGE, _SQRT_HUGE * root_T / C, root_T / (math.sqrt(N) * _TINY))
    return lo * (1.0 + 2.0**-48), hi * (1.0 - 2.0**-48)


def _report_range_reasons(sigma: float, C: float, N: int, T: int) -> str:
    """Which of report's quantities leave float64's normal range at this sigma, and their values."""
    log_tiny, log_huge = math.log10(_TINY), math.log10(_HUGE)
    log_sigma, log_C, log_T, log_N = math.log10(sigma), math.log10(C), math.log10(T), math.log10(N)
    log_ncc_arg = log_N + 2.0 * log_sigma - log_T  # log10(N sigma^2 / T)
    quantities = (
        ("sigma_eff = sigma / sqrt(T)", log_sigma - 0.5 * log_T),
        ("mu = sqrt(T) / sigma", 0.5 * log_T - log_sigma),
        ("the MSE bound C^2 sigma^2 / T", 2.0 * log_C + 2.0 * log_sigma - log_T),
        ("the NCC bound 1 / sqrt(1 + N sigma^2 / T)",
         -0.5 * float(np.logaddexp(0.0, log_ncc_arg * math.log(10.0))) / math.log(10.0)),
    )
    reasons = [
        f"{name} would be {_sci(value)}, " + ("below float64's smallest normal number 2.2e-308"
                                           if value < log_tiny else "above float64's largest 1.8e+308")
        for name, value in quantities if not log_tiny <= value <= log_huge
    ]
    return "; ".join(reasons) or "a quantity would come within a few roundings of float64's limits"


def report(*, sigma, C, N, T=1, kappa, data_range=1.0) -> dict:
    """All bounds for one DP-SGD configuration.

    Returns
    -------
    dict
        ``worst_case_success`` (:func:`worst_case_success`), ``mse``
        (:func:`mse_lower_bound`), ``psnr`` (:func:`psnr_upper_bound`, the
        METHOD.md form), ``ncc`` (:func:`ncc_upper_bound`, dimension-aware),
        plus the inputs, ``sigma_eff``, ``mu`` (the GDP parameter), and the
        rigorous bounds on the finite-``N`` means ``psnr_finite_n`` and
        ``ncc_finite_n`` (NaN when ``N < 3``).

    Raises
    ------
    ValueError
        Where ``sigma`` lies outside :func:`report_sigma_range` (about
        ``1.5e-154 .. 1.3e154`` for ``C = T = 1``): some quantity would not be
        a normal float64. The message names it and the range that works.
    """
    sigma, C, N, T = _check_sigma(sigma), _check_clip(C), _check_N(N), _check_T(T)
    kappa, data_range = _check_kappa(kappa), _check_data_range(data_range)
    lo, hi = report_sigma_range(C=C, N=N, T=T)
    if not lo <= sigma <= hi:
        raise ValueError(
            f"sigma = {sigma:g} is outside the range the report can represent for C = {C:g}, "
            f"N = {N}, T = {T}: {_report_range_reasons(sigma, C, N, T)}. Every reported quantity "
            f"is a normal float64 only for {_sci_limit(math.log10(lo), up=True)} <= sigma <= "
            f"{_sci_limit(math.log10(hi), up=False)}; pass a sigma in that range"
        )
    return {
        "sigma": sigma,
        "C": C,
        "N": N,
        "T": T,
        "kappa": kappa,
        "data_range": data_range,
        "sigma_eff": effective_sigma(sigma=sigma, T=T),
        "mu": math.sqrt(T) / sigma,
        "worst_case_success": worst_case_success(kappa=kappa, sigma=sigma, T=T),
        "mse": mse_lower_bound(sigma=sigma, C=C, T=T),
        "psnr": psnr_upper_bound(sigma=sigma, C=C, T=T, data_range=data_range),
        "ncc": ncc_upper_bound(sigma=sigma, N=N, T=T),
        "psnr_finite_n": psnr_upper_bound(sigma=sigma, C=C, T=T, data_range=data_range, N=N),
        "ncc_finite_n": (
            ncc_upper_bound(sigma=sigma, N=N, T=T, finite_n=True) if N >= 3 else math.nan
        ),
    }


# --------------------------------------------------------------------------
# the attack (Monte Carlo counterpart of the bounds)
# --------------------------------------------------------------------------
def _images_2d(name: str, images) -> np.ndarray:
    if hasattr(images, "detach") and hasattr(images, "cpu"):
        raise TypeError(f"{name} must be a NumPy array; pass tensor.detach().cpu().numpy()")
    arr = np.asarray(images)
    if arr.dtype == object or arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) \
            or np.iscomplexobj(arr):
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim < 2:
        raise ValueError(
            f"{name} must have shape (n_images, ...), got shape {arr.shape}; "
            "for one image pass images[None]"
        )
    if arr.shape[0] == 0 or arr[0].size == 0:
        raise ValueError(f"{name} must hold at least one non-empty image, got shape {arr.shape}")
    flat = arr.reshape(arr.shape[0], -1).astype(np.float64)
    if not np.isfinite(flat).all():
        raise ValueError(f"{name} must be finite")
    return flat


def simulate_attack(images, *, sigma, C, T=1, seed) -> np.ndarray:
    r"""The linear-layer adversary's reconstructions under DP-SGD.

    Each image is flattened to ``X`` (N values), clipped to
    ``beta X`` with ``beta = 1 / max(1, ||X|| / C)``, and observed ``T`` times
    with independent noise ``N(0, C^2 sigma^2 I)``; the reconstruction is the
    average. The average of ``T`` such draws has the law
    ``N(0, C^2 sigma^2 / T I)``, which is sampled directly (memory does not
    grow with ``T``).

    Parameters
    ----------
    images : ndarray, shape (n_images, ...)
        One example per leading index.
    sigma, C : float
    T : int, default 1
    seed : int >= 0, sequence of them, or numpy.random.SeedSequence/BitGenerator/Generator
        Seed of the noise (required: the same seed gives the same reconstructions).

    Returns
    -------
    ndarray, float64, same shape as ``images``
    """
    sigma, C, T = _check_sigma(sigma), _check_clip(C), _check_T(T)
    flat = _images_2d("images", images)
    seed = _check_seed(seed)
    noise_sd = C * (sigma / math.sqrt(T))
    if not math.isfinite(noise_sd):
        raise ValueError(
            f"the noise standard deviation C sigma / sqrt(T) (sigma = {sigma:g}, C = {C:g}, T = {T}) "
            "is above float64's largest 1.8e+308; pass a smaller sigma or C"
        )
    rng = np.random.default_rng(seed)
    # ||X|| of each row scaled by a power of two (exact), so that ||X||^2 cannot overflow
    # or underflow: unit = 2^e with max|x_i| / unit in [1, 2), ||X|| = unit * ||X / unit||.
    unit = _row_unit(flat)
    scaled = flat / unit
    scaled_norm = np.linalg.norm(scaled, axis=1, keepdims=True)
    with np.errstate(over="ignore", under="ignore"):
        ratio = unit * scaled_norm / C  # ||X|| / C; inf where it exceeds float64, 0 below (beta = 1: exact)
    beta = 1.0 / np.maximum(1.0, ratio)
    # Where ||X|| / C is huge, beta X = C (X / unit) / ||X / unit||, which stays exact
    # (beta itself would be 0 or a subnormal and drop the signal).
    with np.errstate(divide="ignore", invalid="ignore"):
        signal = np.where(ratio <= 2.0**1000, beta * flat, C * (scaled / scaled_norm))
    noise = rng.standard_normal(flat.shape) * noise_sd
    return (signal + noise).reshape(np.shape(images))


def _row_unit(rows: np.ndarray) -> np.ndarray:
    """Per row, the power of two ``2^e`` with ``max|row| / 2^e`` in [1, 2) (1 for a zero row),
    as a column; dividing by it is exact and brings every row to unit scale."""
    peak = np.max(np.abs(rows), axis=1, keepdims=True)
    _, exponent = np.frexp(peak)
    return np.where(peak > 0, np.ldexp(1.0, exponent - 1), 1.0)


@dataclasses.dataclass(frozen=True)
class AttackMetrics:
    """Per-image reconstruction quality; each field has shape (n_images,)."""

    mse: np.ndarray
    psnr: np.ndarray
    ncc: np.ndarray


def attack_metrics(images, recon) -> AttackMetrics:
    r"""MSE, PSNR and NCC of each reconstruction against its original.

    .. math::
        \mathrm{MSE} = \tfrac1N\|X - \hat X\|^2, \quad
        \mathrm{PSNR} = 10\log_{10}\frac{(\max X - \min X)^2}{\mathrm{MSE}}, \quad
        \mathrm{NCC} = \frac{\langle x_c, \hat x_c\rangle}{\|x_c\|\,\|\hat x_c\|}

    (``x_c`` centred; NCC is the Pearson correlation). A constant image has
    NaN NCC and PSNR ``-inf``; a reconstruction equal to its image has MSE 0
    and PSNR ``inf``.

    Each row is scaled by a power of two before squaring (exact, so ordinary
    inputs give the same numbers as the formulas above): PSNR and NCC are
    finite for every finite input, whatever its magnitude.

    Raises
    ------
    ValueError
        Where an MSE is nonzero but outside float64's normal range (values
        beyond about 1e154 or tiny differences): it would read inf or 0.
        Rescale images and reconstructions together (e.g. to [0, 1]).
    """
    x = _images_2d("images", images)
    y = _images_2d("recon", recon)
    if np.shape(images) != np.shape(recon):
        raise ValueError(
            f"Shape mismatch: recon has shape {np.shape(recon)}, images {np.shape(images)}"
        )
    # MSE: difference and squares at unit scale; mse = mean(b^2) * 4^e with e the sum of the
    # two power-of-two exponents, each scaling exact.
    unit_xy = _row_unit(np.concatenate([x, y], axis=1))
    diff = x / unit_xy - y / unit_xy
    unit_d = _row_unit(diff)
    mean_sq = np.mean((diff / unit_d) ** 2, axis=1)
    log2_unit = np.log2(unit_xy[:, 0]) + np.log2(unit_d[:, 0])  # integers, exact
    with np.errstate(over="ignore", under="ignore"):
        mse = np.ldexp(mean_sq, (2.0 * log2_unit).astype(np.int64))
    bad = (mean_sq > 0) & ~((mse >= _TINY) & (mse <= _HUGE))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        log_mse = math.log10(mean_sq[i]) + 2.0 * log2_unit[i] * math.log10(2.0)
        raise ValueError(
            f"the MSE of image {i} is {_sci(log_mse)}, outside {_NORMAL_RANGE}; rescale images "
            "and recon together (e.g. divide both by max|images|) so that it is representable"
        )
    # PSNR = 10 log10(R^2 / MSE), with R and the MSE at unit scale and the scales in the log.
    unit_x = _row_unit(x)
    xs = x / unit_x
    range_s = xs.max(axis=1) - xs.min(axis=1)  # R / unit_x
    with np.errstate(divide="ignore", invalid="ignore"):
        psnr = (10.0 * np.log10(range_s**2 / mean_sq)
                + 20.0 * math.log10(2.0) * (np.log2(unit_x[:, 0]) - log2_unit))
    # NCC is scale-free: computed on the unit-scale rows.
    ys = y / _row_unit(y)
    xc = xs - xs.mean(axis=1, keepdims=True)
    yc = ys - ys.mean(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ncc = np.sum(xc * yc, axis=1) / (np.linalg.norm(xc, axis=1) * np.linalg.norm(yc, axis=1))
    return AttackMetrics(mse=mse, psnr=psnr, ncc=ncc)
