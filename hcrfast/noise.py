"""Noise laws of the dithering and their χ² divergence ``D(z)``.

``D(z) = E[(f(Z − z)/f(Z) − 1)²]`` is the denominator of the HCR bound
(paper eq. 5): ``Var(θ̂_k) ≥ ε_k² / D(z_ε)``.

For noise with i.i.d. coordinates of density ``f`` the expectation factorizes
(METHOD.md §5)::

    1 + D(z) = Π_j (1 + χ²(z_j)),   χ²(t) = ∫ (f(x − t) − f(x))² / f(x) dx,

so every law here reduces to the one-dimensional ``χ²(t)``:

- :class:`Gaussian` — exact, ``1 + χ²(t) = exp(t²/σ²)`` (paper eq. 12);
- :class:`Laplace` — exact, ``1 + χ²(t) = (2/3)·exp(|t|/b) + (1/3)·exp(−2|t|/b)``;
- :class:`MonteCarlo` — any other density: an upper confidence bound on ``D``,
  so that the reported HCR bound ``ε²/D`` stays conservative.

All three satisfy :class:`NoiseLaw` (``divergence``, ``sample``, ``describe``);
:func:`as_noise` turns a plain ``sigma`` into :class:`Gaussian`.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import hashlib
import inspect

import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from hcrfast import validation
from hcrfast.backend import get_array_module, host_argument, one_number, to_host

__all__ = ["Gaussian", "Laplace", "MonteCarlo", "MonteCarloEstimate", "NoiseLaw", "as_noise"]


def _check_scale(name: str, value, hint: str = "pass the noise scale of the released features "
                                                "(e.g. hcrfast.rms_sigma(features, 1.0))") -> float:
    value = detached(host_argument(name, value))
    count = (value.numel() if isinstance(value, torch.Tensor) else
             np.size(value) if isinstance(value, (np.ndarray, list, tuple)) else 1)
    if count > 1:
        raise TypeError(f"{name} must be one number, got {count} values; one std per feature is for Gaussian noise "
                        f"only: pass them as sigma itself (hcrfast.bound(model, batch, stds)), not inside a noise law "
                        f"(Laplace and Monte Carlo laws take one scale for every feature)")
    value = one_number(value)   # (a one-element array or tensor)
    # A real number, as sigma is everywhere else (validation.sigma_or_law, hcrfast.dp): NumPy's complex scalars and
    # bool have __float__ (the first drops the imaginary part, with a mere warning), and so has Decimal, which
    # hcrfast.bound(sigma=Decimal(...)) refused while Gaussian(Decimal(...)) took it.
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}; {hint}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}; {hint}")
    return value


def detached(value):
    """``value`` with the torch tensors in it (itself, or a sequence's items, nested) detached: NumPy reads no
    tensor that requires grad (``np.asarray`` raises RuntimeError), and a std's or a shift's gradient is
    nothing the noise uses (one tensor that requires grad is taken as its values: ``hcrfast.bound`` does)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (list, tuple)):
        items = [detached(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def _rows(z):
    """(xp, z as (B, n) float64) — the one reshaping convention of every law."""
    xp = get_array_module(z)
    z = xp.asarray(detached(z))
    if z.ndim < 2:
        # a vector (n,) read as n rows of one coordinate gave n values of D, none of them the vector's
        got = "a scalar" if z.ndim == 0 else f"one vector of shape {z.shape}"
        raise ValueError(f"z must have a leading batch axis, shape (B, n); got {got}. For one shift vector "
                         f"pass z[None]")
    if z.dtype.kind == "c":   # (astype(float64) would drop the imaginary part with a mere ComplexWarning)
        raise TypeError(f"z must hold real feature shifts, got dtype {z.dtype}; the features and their noise are "
                        f"real: pass z.real where the imaginary part is 0")
    n = math.prod(z.shape[1:])   # (not -1: an empty batch (0, n) has rows of n all the same)
    return xp, z.reshape(z.shape[0], n).astype(xp.float64)


#: D below this is not resolved in float64: its terms were squared below float64's normal range (2^-1022),
#: where they keep few digits, so D may come out below the truth. Every D hcrfast certifies with goes through
#: :func:`divergence_of`, which takes such a D as 0: a step whose features moved is then refused
#: (``divergence_underflow``), as one whose D underflowed to 0 is. (Algorithm 1's D ≈ s² ≈ 2.5e-5.)
D_FLOOR = 2.0 ** -960

#: |z|² and σ² inside [_SQUARES_SAFE, 1/_SQUARES_SAFE] keep every digit; outside it Gaussian D is taken
#: from (z/σ)² instead, whose terms stay normal wherever z/σ does.
_SQUARES_SAFE = 2.0 ** -960


#: D's float64 evaluation rounds: a sum of n terms (‖z‖²/σ², or Σ_j log(1 + χ²_j)) is within a relative
#: (n + 8)·2^-53 of its exact value, and expm1 turns a relative error δ of its argument x into one of at most
#: δ·(1 + x) of D, plus its own ulp. :func:`divergence_of` raises every D by the relative
#: ``(n + _D_ROUNDING_TERMS)·D_ROUNDING_UNIT·(1 + ln(1 + D))``, twice that, so that D is never below the
#: exact one (1.8e-13 on the MNIST MLP's 784 features at Algorithm 1's D ≈ s²).
D_ROUNDING_UNIT = 2.0 ** -52
_D_ROUNDING_TERMS = 16


def divergence_of(noise, z):
    """``noise.divergence(z)`` rounded outward (:data:`D_ROUNDING_UNIT`), with a D below :data:`D_FLOOR`
    taken as 0 (not resolved: see there). The one way hcrfast evaluates D for a bound, whatever the law (a
    user's included), whose values are checked: a D that is NaN, negative or of the wrong shape would read
    as +inf, or pass as a bound, where it is the law's fault (the built-in Gaussian and Laplace laws give
    none from finite shifts, and are not read back for it)."""
    # the built-in laws' D without their refusal of NaN shifts (a public call's mistake): the certified paths
    # read a NaN D as a step that bounds nothing, as before
    d = noise._divergence(z) if type(noise).divergence in _REFUSING_NAN else noise.divergence(z)
    if not _built_in_d(noise):   # (a subclass's own D is checked too, whichever of its methods it overrides)
        _check_divergence(noise, z, d)
    xp = get_array_module(d)
    n = math.prod(z.shape[1:]) if z.ndim > 1 else 1
    with np.errstate(over="ignore", invalid="ignore"):
        up = d + d * ((n + _D_ROUNDING_TERMS) * D_ROUNDING_UNIT) * (1.0 + xp.log1p(xp.maximum(d, 0.0)))
    return xp.where(d < D_FLOOR, 0.0, xp.where(xp.isfinite(d), up, d))


def _check_divergence(noise, z, d) -> None:
    """A noise law's ``divergence(z)``: one float per row of ``z``, each ≥ 0 or +inf, none NaN."""
    rows = z.shape[0] if getattr(z, "ndim", 0) > 1 else 1
    shape = tuple(getattr(d, "shape", ()))
    describe = getattr(noise, "describe", None)
    name = describe() if callable(describe) else repr(noise)
    if shape != (rows,):
        raise ValueError(f"the noise law {name} returned D of shape {shape} for {rows} rows of shifts; "
                         f"divergence(z) must give one value per row of z, shape ({rows},)")
    host = np.asarray(to_host(d), dtype=np.float64)
    xp = get_array_module(z)
    finite = np.asarray(to_host(xp.isfinite(xp.asarray(detached(z)).reshape(rows, -1)).all(axis=1)), dtype=bool)
    if np.isnan(host[finite]).any():   # (a NaN shift's NaN D bounds nothing, as the built-in laws' does)
        raise ValueError(f"the noise law {name} returned D = NaN for {int(np.isnan(host[finite]).sum())} of {rows} rows "
                         f"of finite shifts: its divergence is not defined there (a density without full support, "
                         f"say: then D = inf for any shift); fix the law, or use hcrfast.Gaussian / hcrfast.Laplace")
    dt = getattr(d, "dtype", None)
    if not (dt == torch.float64 if isinstance(dt, torch.dtype) else
            dt is not None and np.dtype(dt).kind == "f" and np.dtype(dt).itemsize == 8):   # (>f8 too)
        raise TypeError(f"the noise law {name} returned D as {getattr(d, 'dtype', type(d).__name__)}; D must be "
                        f"float64 (the bounds' rounding guard allows float64's rounding: a float32 D came out 4e-8 "
                        f"below the exact one, and its bounds above the rigorous ones): compute it in float64")
    if (host < 0).any():
        raise ValueError(f"the noise law {name} returned D < 0 ({host.min():.3g}) for {int((host < 0).sum())} of "
                         f"{rows} rows; D = exp(chi-square divergence) - 1 is never negative: fix the law's "
                         f"divergence")


def _refuse_nan(noise, d):
    """``d``, the D of a built-in law, unless a row is NaN, which only a NaN shift gives there (an inf shift
    gives D = inf; the sums are of squares or of non-negative terms): refused, as :class:`MonteCarlo` does."""
    xp = get_array_module(d)
    bad = xp.isnan(d)
    if bool(bad.any()):
        rows = np.flatnonzero(to_host(bad))
        raise ValueError(f"z contains NaN in rows {rows[:10].tolist()}{' ...' if rows.size > 10 else ''}, where "
                         f"{noise.describe().split(':')[0]} has no D; the shifts must be numbers (an inf shift "
                         f"gives D = inf)")
    return d


@runtime_checkable
class NoiseLaw(Protocol):
    """What :func:`hcrfast.bound` needs from a noise law.

    ``divergence(z)``
        ``D`` for each row of ``z`` (B, n): float64 of shape (B,), in ``z``'s
        array namespace (NumPy or CuPy). Must never under-estimate ``D``.
    ``sample(rng, shape)``
        Draws of the noise from a NumPy ``Generator``, float64.
    ``describe()``
        One line for reports.
    """

    def divergence(self, z): ...

    def sample(self, rng, shape): ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Gaussian:
    """i.i.d. centred Gaussian noise of standard deviation ``sigma`` on every feature.

    ``D(z) = exp(‖z‖²/σ²) − 1`` (paper eq. 12), evaluated with ``expm1`` so that
    small shifts keep full relative precision.
    """

    sigma: float

    def __post_init__(self):
        object.__setattr__(self, "sigma", _check_scale("sigma", self.sigma))

    def divergence(self, z):
        """``D`` for each row of ``z`` (B, n), in float64; a NaN shift is refused."""
        return _refuse_nan(self, self._divergence(z))

    def _divergence(self, z):
        xp, z = _rows(z)
        # σ·σ, not σ**2: Python's float power raises OverflowError past 1e154. Where |z|² or σ² leaves
        # [2^-960, 2^960] their squares lose digits (subnormal) or overflow: those rows take (z/σ)² instead,
        # which stays exact wherever z/σ is normal (the same bits elsewhere as before 2026-11-30).
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):   # those rows are taken from below
            ss, s2 = xp.einsum("bi,bi->b", z, z), self.sigma * self.sigma
            d = xp.expm1(ss / s2)
        if not _SQUARES_SAFE <= s2 <= 1 / _SQUARES_SAFE:
            in_range = xp.zeros(ss.shape, dtype=bool)
        else:
            in_range = (ss >= _SQUARES_SAFE) & (ss <= 1 / _SQUARES_SAFE)
        with np.errstate(over="ignore"):   # (D = inf past float64, as above: no warning from a public call)
            u = z / self.sigma
            return xp.where(in_range, d, xp.expm1(xp.einsum("bi,bi->b", u, u)))

    def sample(self, rng, shape):
        """Draws of the noise from a NumPy Generator, float64."""
        return self.sigma * rng.standard_normal(shape)

    def describe(self) -> str:
        return f"Gaussian(sigma={self.sigma:.6g}): D(z) = exp(|z|^2/sigma^2) - 1, exact"


@dataclass(frozen=True)
class Laplace:
    r"""i.i.d. centred Laplace noise of scale ``b`` on every feature.

    Density ``f(x) = exp(−|x|/b) / (2b)`` (variance ``2b²``; to match a
    Gaussian of standard deviation σ take ``b = σ/√2``).

    ``D(z) = Π_j (1 + χ²(z_j)) − 1`` with, for ``a = |t|/b``,

    .. math::  1 + χ²(t) = \tfrac23 e^{a} + \tfrac13 e^{-2a}
               \qquad\text{i.e.}\qquad
               χ²(t) = (1 − e^{-a})² (2e^{a} + 1) / 3 .

    Derivation. ``1 + χ²(t) = ∫ f(x − t)²/f(x) dx``. By the symmetry
    ``x → −x`` take ``t ≥ 0``; substitute ``x = b·u`` (``a = t/b``)::

        ∫ f(x−t)²/f(x) dx = (1/2) ∫ exp(−2|u − a| + |u|) du
          u < 0    : exponent  u − 2a   →  ∫_{−∞}^0 = e^{−2a}
          0 < u < a: exponent 3u − 2a   →  ∫_0^a    = (e^{a} − e^{−2a}) / 3
          u > a    : exponent −u + 2a   →  ∫_a^∞    = e^{a}
        sum / 2 = (2/3) e^{a} + (1/3) e^{−2a}.

    This agrees with METHOD.md §5. Subtracting 1, ``2e^{a} + e^{−2a} − 3 =
    (e^{a} − 1)²(2e^{a} + 1)/e^{2a}`` (the cubic ``2u³ − 3u² + 1`` has the
    double root ``u = 1``), which gives the factored χ² above: a product of
    positive terms, so tiny shifts keep full relative precision
    (``χ² = a² − a³/3 + a⁴/4 − …``) with no series cut-off to tune.

    Numerics (float64): per coordinate ``log(1 + χ²)`` is ``log1p`` of the
    factored χ² for ``a < 1`` and ``a + log(2/3 + e^{−3a}/3)`` for ``a ≥ 1``
    (no overflow of ``e^{a}``); ``D = expm1(Σ_j log(1 + χ²_j))``. Runs on
    NumPy or CuPy, on ``z``'s device.

    Parameters
    ----------
    scale : float
        ``b > 0``, finite.
    """

    scale: float

    def __post_init__(self):
        object.__setattr__(self, "scale", _check_scale(
            "scale", self.scale, "pass the Laplace scale b of the noise on every feature "
                                 "(its standard deviation is b*sqrt(2); b = sigma/sqrt(2) matches a Gaussian sigma)"))

    def log1p_chi2(self, z):
        """``log(1 + χ²(z_j))`` elementwise, float64, in ``z``'s namespace."""
        xp = get_array_module(z)
        a = xp.abs(xp.asarray(z).astype(xp.float64)) / self.scale
        # Both branches are evaluated by xp.where; clip so neither overflows where it is not used.
        a_small = xp.minimum(a, 1.0)
        chi2_small = xp.expm1(-a_small) ** 2 * (2.0 * xp.exp(a_small) + 1.0) / 3.0
        a_large = xp.maximum(a, 1.0)
        log_large = a_large + xp.log(2.0 / 3.0 + xp.exp(-3.0 * a_large) / 3.0)
        return xp.where(a < 1.0, xp.log1p(chi2_small), log_large)

    def divergence(self, z):
        """``D`` for each row of ``z`` (B, n), in float64; a NaN shift is refused."""
        return _refuse_nan(self, self._divergence(z))

    def _divergence(self, z):
        xp, z = _rows(z)
        with np.errstate(over="ignore"):   # (D = inf past float64: no warning from a public call)
            return xp.expm1(self.log1p_chi2(z).sum(axis=1))

    def sample(self, rng, shape):
        """Draws of the noise from a NumPy Generator, float64."""
        return rng.laplace(0.0, self.scale, size=shape)

    def describe(self) -> str:
        return (f"Laplace(scale={self.scale:.6g}): D(z) = prod_j((2/3)exp(|z_j|/b) + (1/3)exp(-2|z_j|/b)) - 1, "
                f"exact")


@dataclass(frozen=True)
class MonteCarloEstimate:
    """Per-row result of :meth:`MonteCarlo.estimate` (NumPy arrays of shape (B,)).

    Attributes
    ----------
    upper : ndarray
        Upper confidence bound on ``D`` at level ``confidence`` (what
        :meth:`MonteCarlo.divergence` returns).
    point : ndarray
        Estimate ``expm1(K + Ȳ)`` of the linearized ``D`` (see :class:`MonteCarlo`);
        not conservative, but biased up by the tangent slack only.
    log_std_error : ndarray
        Standard error of the linearized ``log(1 + D)`` statistic, ``s/√m``.
    ess : ndarray
        Kish effective sample size ``(Σ Y_i)² / Σ Y_i²`` of the per-draw terms
        (NaN for a zero row). Far below ``n_samples`` means heavy tails.
    confidence : float
    n_samples : int
    """

    upper: np.ndarray
    point: np.ndarray
    log_std_error: np.ndarray
    ess: np.ndarray
    confidence: float
    n_samples: int


class MonteCarlo:
    r"""Any i.i.d. noise law with full support, ``D`` bounded above by Monte Carlo.

    Parameters
    ----------
    logpdf : callable
        ``logpdf(x)``: the log-density of ONE coordinate, elementwise on NumPy
        arrays of any shape. Must be finite on the whole real line.
    sample : callable
        ``sample(rng, shape)``: float draws of one coordinate's law from a NumPy
        ``Generator`` (used for the Monte Carlo and for :meth:`sample`).
    n_samples : int, keyword-only
        ``m``, the i.i.d. pairs (draw, coordinate) of the main estimate; the
        cost is ``m + 32·pilot_samples`` evaluations of ``logpdf`` per row of
        ``z``, independent of the number n of coordinates.
    confidence : float, keyword-only
        ``1 − δ`` in [0.5, 1): each row's :meth:`divergence` is ≥ its true
        ``D`` with this probability over the draws (see Notes).
    seed : int, keyword-only
        Seeds all draws (``numpy.random.SeedSequence(seed)``). The same seed
        gives bitwise the same results, and a row's result does not depend on
        the other rows of the call (the draws are shared by all rows).
    name : str, keyword-only
        For :meth:`describe`.
    pilot_samples : int, keyword-only
        ``m₀``, the draws of the independent pilot (default 256).

    Notes
    -----
    **Estimand.** ``log(1 + D(z)) = Σ_j log(1 + χ²_j)`` with
    ``χ²_j = E[(r(X; z_j) − 1)²]``, ``r(x; t) = f(x − t)/f(x)``, ``X ~ f``.
    The mean of ``(r − 1)²`` is estimated rather than ``E[r²] − 1``: equal
    when ``f`` has full support (``E[r] = 1``), but ``(r − 1)² = O(t²)`` keeps
    O(1) relative spread as ``t → 0`` where ``r² − 1`` has O(1/t) — and small
    shifts are Algorithm 1's regime.

    **Upper bound.** ``log1p`` is concave, so for ANY tangent points
    ``c_j ≥ 0``::

        log(1 + χ²_j) ≤ log(1 + c_j) + w_j (χ²_j − c_j),   w_j = 1/(1 + c_j),

    and summing, ``log(1 + D) ≤ K + S`` with ``K = Σ_j [log(1 + c_j) − w_j c_j]``
    and ``S = Σ_j w_j χ²_j``. ``S`` is estimated by importance sampling over
    the coordinates and the line: i.i.d. triples ``x_i ~ f``, ``K_i`` uniform on
    {0, 1, 2}, ``J_i ~ q`` (independent) give ``X_i = x_i + K_i z_J``, drawn from
    the mixture ``h_t = (f + f(· − t) + f(· − 2t))/3`` at ``t = z_J``, and i.i.d.
    ``Y_i = w_J (r(X_i; z_J) − 1)² f(X_i)/h_{z_J}(X_i) / q_J`` with
    ``E[Y_i] = S`` exactly, for any ``q`` with ``q_j > 0`` wherever ``z_j ≠ 0``
    (``χ²_j = 0`` where ``z_j = 0``). Drawn from ``f`` alone (before 2026-11-30),
    no draw lands where ``f(x − t)²/f(x)`` has its mass once ``t`` is a few
    scales (at ``x ≈ 2t`` for the normal law, ``t`` for the Laplace law): every
    ``(r − 1)²`` was ≈ 1, and D came out 1 at 10σ, where it is e^100, with no
    warning. The mixture covers those places: ``f/h ≤ 3``, so no term is worse
    than three times the plain one, and for the normal law the relative variance
    of the terms stays bounded at every shift. ``c`` and ``q`` come from an independent pilot: χ² estimated
    from ``m₀`` draws on a geometric grid of 16 shift sizes per sign spanning
    the row's ``|z_j|`` and interpolated log-log to every coordinate;
    ``q ∝ 0.9·w c/Σ w c + 0.1·z²/‖z‖²`` (the second part, the small-shift
    shape ``χ² ≈ I t²`` of any regular density, keeps ``q`` away from 0).
    Given the pilot, ONE one-sided bound on the mean of the ``Y_i`` covers all
    coordinates jointly — no Bonferroni split over coordinates — and a good
    pilot makes both the tangent slack (second order in ``χ²_j − c_j``) and
    ``Var Y`` small. The mean is bounded by the Student-t bound with the
    Cornish–Fisher skewness correction of the studentized mean (Hall 1992,
    §2.6): ``S ≤ Ȳ + (s/√m)·(t_{m−1, 1−δ} + γ̂₊ (2 z²_{1−δ} + 1) / (6√m))``,
    ``γ̂₊ = max(0, sample skewness)`` — the ``Y_i`` are non-negative and right
    skewed, for which the plain t bound under-covers. The result is
    ``D ≤ expm1(K + that)``. (Shared draws for all coordinates — common random
    numbers — were not used across coordinates: at small shifts
    ``(r(X; z_j) − 1)² ≈ z_j² ψ(X)²`` for all j, so a sum over coordinates of
    one draw carries no more information than one coordinate, at n times the
    cost. Draws are shared across rows.)

    Each row's statement holds at level ``1 − δ``. A maximum over R rows (the
    restarts of one example) that must hold jointly needs
    ``confidence = 1 − δ/R`` (Bonferroni).

    **Assumptions.** (i) ``f > 0`` on all of R (else ``χ² = ∞`` for shifts
    that move mass outside the support, so ``D = ∞``); (ii) ``sample`` draws
    from ``f``; (iii) ``E[r(X; t)⁴] = ∫ f(x − t)⁴/f(x)³ dx < ∞`` for the
    shifts used, so ``Var Y < ∞`` and the CLT applies; (iv) ``m`` large enough
    for that asymptotic bound to be accurate (the coverage is 1 − δ + O(1/m)
    after the skewness correction). No finite-sample bound exists without a
    range or tail assumption: ``r`` is unbounded for light tails (Gaussian
    ``r = exp((2xt − t²)/2σ²)``), so empirical-Bernstein bounds, which need
    bounded variables, do not apply. (iii) holds for the Laplace and
    Student-t laws (bounded ratio) and the Gaussian, but for large shifts of
    light-tailed laws ``Y`` is nearly log-normal and the CLT needs very many
    draws: a ``RuntimeWarning`` is raised when the effective sample size of
    the ``Y_i`` falls below 50 (see :meth:`estimate`'s ``ess``); there the
    bound may under-cover and, with a pilot far off, is also very loose.
    Coverage is measured in ``tests/test_noise.py`` (t5 and Laplace laws at small
    and moderate shifts; the normal law at ‖z‖ = 2σ over 5 coordinates; the normal,
    Laplace and logistic laws at 10–20 scales against quadrature). A term past
    float64's range makes D inf (a bound of 0).

    ``r − 1`` is ``expm1(logpdf(x − t) − logpdf(x))``: the difference of two
    log-densities carries an absolute error ~1e-16·|logpdf|, i.e. a relative
    error ~1e-16/|t| in χ² — 1e-10 at Algorithm 1's typical ``|t| ~ 1e-6``.

    Computed on the host with NumPy; CuPy input is copied to the host and the
    result copied back to the device.

    References
    ----------
    P. Hall, *The Bootstrap and Edgeworth Expansion*, Springer (1992), §2.6.
    N. J. Johnson, "Modified t tests and confidence intervals for asymmetrical
    populations", JASA 73 (1978) 536–544.
    """

    _GRID = 16            # pilot shift sizes per sign
    _DEFENSIVE = 0.1      # share of q proportional to z_j²
    _BLOCK = 1 << 20      # float64 elements per temporary array (8 MB)

    def __init__(self, logpdf: Callable, sample: Callable, *, n_samples: int = 50_000,
                 confidence: float = 0.99, seed: int = 0, name: str = "custom density",
                 pilot_samples: int = 256):
        if not callable(logpdf):
            raise TypeError(f"logpdf must be a callable x -> log f(x), got {type(logpdf).__name__}")
        if not callable(sample):
            raise TypeError(f"sample must be a callable (rng, shape) -> draws, got {type(sample).__name__}")
        self.n_samples = _check_count("n_samples", n_samples, 10)
        self.pilot_samples = _check_count("pilot_samples", pilot_samples, 2)
        if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real):
            raise TypeError(f"confidence must be a real number, got {type(confidence).__name__}")
        confidence = float(confidence)
        if not 0.5 <= confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}; an upper confidence bound "
                             f"below 0.5 is not conservative and 1 needs infinitely many draws (typical: 0.99)")
        self.confidence = confidence
        self.seed = validation.seed(seed)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self.name = name
        self._logpdf = logpdf
        self._sampler = sample

        main_seq, pilot_seq, pick_seq, part_seq, part0_seq = np.random.SeedSequence(self.seed).spawn(5)
        self._x = self._draw(np.random.default_rng(main_seq), self.n_samples)
        self._x0 = self._draw(np.random.default_rng(pilot_seq), self.pilot_samples)
        self._refuse_far_centre()
        self._u = np.random.default_rng(pick_seq).random(self.n_samples)  # picks J_i by inverse CDF of q
        # the part of the proposal mixture each draw comes from: X = x + K·t, K uniform on {0, 1, 2}
        self._k = np.random.default_rng(part_seq).integers(0, 3, self.n_samples).astype(np.float64)
        self._k0 = np.random.default_rng(part0_seq).integers(0, 3, self.pilot_samples).astype(np.float64)
        self._logf_x = self._logpdf_at_draws(self._x)
        self._logf_x0 = self._logpdf_at_draws(self._x0)
        # What the law computes with, for checkpoint keys and sharded runs (its repr): the draws and the
        # log-density at them and on a fixed grid, so that two laws of one name (or of names that round
        # alike, as from_scipy's do) never pass for each other.
        with np.errstate(all="ignore"):
            grid = np.asarray(self._logpdf(_FINGERPRINT_GRID), dtype=np.float64)
        # Full support, where the draws and the shifts that matter reach: the draws' range and as much again on
        # each side (a law truncated at ±3, or uniform, is 0 there; a Gumbel's log-density at -1000 overflows
        # to -inf though its support is all of R, so the check does not go far beyond the draws)
        lo, hi = float(self._x.min()), float(self._x.max())
        probe = np.linspace(lo - (hi - lo), hi + (hi - lo), 65)
        with np.errstate(all="ignore"):
            at = np.asarray(self._logpdf(probe), dtype=np.float64)
        bad = ~np.isfinite(at) if at.shape == probe.shape else None
        if bad is None or bad.any() or not np.all(np.isfinite(self._logf_x)):
            where = (f"at x = {', '.join(f'{v:.3g}' for v in probe[bad][:4])}" if bad is not None and bad.any()
                     else "at some of its own draws" if bad is not None else "(it did not give one value per point)")
            raise ValueError(f"MonteCarlo({name}): logpdf is not finite {where}; the law must have a log-density "
                             f"finite on all of R (full support): a density that is 0 somewhere (truncated, uniform) "
                             f"has D = inf for every shift that moves its support, which no sample shows")
        digest = hashlib.sha256(b"proposal (f + f(.-t) + f(.-2t))/3")   # what the draws estimate with
        for part in (self._x, self._logf_x, self._x0, self._logf_x0, self._k, self._k0, grid):
            digest.update(np.ascontiguousarray(part).tobytes())
        self._fingerprint = digest.hexdigest()[:16]
        from scipy import stats  # deferred: only this law needs it

        m = self.n_samples
        self._t_quantile = float(stats.t.ppf(confidence, m - 1))
        self._skew_coef = (2.0 * float(stats.norm.ppf(confidence)) ** 2 + 1.0) / (6.0 * math.sqrt(m))

    @classmethod
    def from_scipy(cls, dist, **kwargs) -> MonteCarlo:
        """From a frozen ``scipy.stats`` continuous distribution, e.g. ``scipy.stats.t(df=5, scale=0.3)``.

        Uses ``dist.logpdf`` and ``dist.rvs``; keyword arguments go to
        :class:`MonteCarlo`. The support must be all of R, and that is checked; it is not enough: D is
        finite only where ``f(x - t)² / f(x)`` is integrable for the coordinates' shifts t (assumption
        (iii) above), which fails for a tail lighter than its shifted copy's. ``scipy.stats.gumbel_r(
        scale=b)``, for one, has D = inf for any shift below ``-b·ln 2`` (the bound there is 0), and its
        samples may not show it: one such coordinate among many small ones passes the effective-sample
        check. Between ``-b·ln 2`` and ``-b·ln(4/3)`` its D is finite but the estimator's variance is not
        (``f(x - t)⁴/f(x)³`` is not integrable), and the upper bound under-covers without a warning: at
        ``t = -0.6·b``, confidence 0.99 and the default draws, 17 of 300 seeds fell below the exact D
        (5.7%, not 1%). The normal, t, logistic and Laplace laws meet (iii) at every shift, and the proposal
        mixture reaches their mass there (tested at 10–20 scales against quadrature).
        """
        from scipy import stats

        if not (isinstance(getattr(dist, "dist", None), stats.rv_continuous)
                and callable(getattr(dist, "logpdf", None)) and callable(getattr(dist, "rvs", None))):
            raise TypeError(f"dist must be a frozen scipy.stats continuous distribution such as "
                            f"scipy.stats.t(df=5, scale=0.3), got {type(dist).__name__}")
        lo, hi = (float(v) for v in dist.support())
        if not (lo == -math.inf and hi == math.inf):
            raise ValueError(f"{dist.dist.name} has support [{lo:g}, {hi:g}], not the whole real line: a shift "
                             f"moves noise mass where f = 0, so D = inf and the HCR bound is 0; "
                             f"use a law with full support (e.g. scipy.stats.t, logistic, laplace, norm)")
        if "name" not in kwargs:
            params = [f"{v:g}" if isinstance(v, numbers.Real) else repr(v) for v in dist.args]
            params += [f"{k}={v:g}" if isinstance(v, numbers.Real) else f"{k}={v!r}" for k, v in dist.kwds.items()]
            kwargs["name"] = f"scipy.stats.{dist.dist.name}({', '.join(params)})"

        def sample(rng, shape):
            return dist.rvs(size=shape, random_state=rng)

        return cls(dist.logpdf, sample, **kwargs)

    def with_confidence(self, confidence: float) -> MonteCarlo:
        """The same law and draws (same seed) at another confidence, e.g. ``1 − δ/R`` for R restarts."""
        return type(self)(self._logpdf, self._sampler, n_samples=self.n_samples, confidence=confidence,
                          seed=self.seed, name=self.name, pilot_samples=self.pilot_samples)

    # ------------------------------------------------------------------ draws
    def _draw(self, rng, m: int) -> np.ndarray:
        raw = np.asarray(self._sampler(rng, (m,)))
        if np.iscomplexobj(raw):
            # float64 would keep the real part only (a ComplexWarning): D of another law, or of none
            raise TypeError(f"MonteCarlo({self.name}): sample returned complex draws (dtype {raw.dtype}); it must "
                            f"draw real numbers from the law whose logpdf is given")
        x = raw.astype(np.float64)
        if x.shape != (m,):
            raise ValueError(f"sample(rng, ({m},)) returned shape {x.shape}; it must return an array of the "
                             f"requested shape")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"MonteCarlo({self.name}): sample returned NaN or inf draws; it must draw real "
                             f"numbers from the law whose logpdf is given")
        # A law with a density draws no value twice (float32 draws: ~1% ties at m = 10^6); a constant or
        # few-valued sampler estimates chi^2 at a handful of points and gives a meaningless D.
        values = np.unique(x)
        if 2 * values.size < m:
            seen = ", ".join(f"{v:.6g}" for v in values[:4]) + (", ..." if values.size > 4 else "")
            raise ValueError(f"MonteCarlo({self.name}): sample returned only {values.size} distinct value"
                             f"{'s' if values.size > 1 else ''} ({seen}) in {m} draws; it must draw real, "
                             f"continuous samples from the law whose logpdf is given")
        return x

    #: :meth:`_refuse_far_centre`: the draws may reach this many times their spread (the median absolute
    #: deviation) from 0, but for a share below :data:`_FAR_SHARE` (a heavy tail's farthest draws, whose terms
    #: are ~(2t/x)², nothing next to the rest); a shift of 1e-6 of the spread that far is rounded at 4e-3 of it.
    _REACH_LIMIT = 2.0**24
    _FAR_SHARE = 1e-3

    def _refuse_far_centre(self) -> None:
        """Refuse a law whose draws lie far from 0 next to their spread. ``D`` does not depend on where the law
        is centred, but ``f(x - t)`` is evaluated at the draws ``x``, where float64 rounds a small shift away: at
        a centre of 1e12 and scale 1 a shift of 1e-5 gave D = 0, and shifts of 1e-3 an upper bound below the
        exact D in 3 of 20 seeds; a mixture with 40% of its mass at 1e14 one 40% low (found 2026-12-02). The
        farthest draw, not the median, is measured: a minority part far from the rest is lost alike."""
        draws = np.concatenate([self._x, self._x0])
        centre = float(np.median(draws))
        spread = float(np.median(np.abs(draws - centre)))
        far = np.abs(draws) > self._REACH_LIMIT * spread
        if far.mean() > self._FAR_SHARE:
            fix = (f"pass the law re-centred at its median {centre:.6g} (logpdf(x + {centre:.6g}), sample(rng, shape) "
                   f"- {centre:.6g}; from_scipy(dist) with loc=0)" if abs(centre) > self._REACH_LIMIT * spread else
                   "pass a law in one piece, not parts far apart (or their parts' D apart)")
            raise ValueError(f"MonteCarlo({self.name}): {far.mean():.1%} of the law's draws lie more than 2^24 times "
                             f"their spread (median absolute deviation {spread:.3g}) from 0, up to "
                             f"{float(np.abs(draws).max()):.6g}; D does not depend on where the law is centred, but a "
                             f"small shift next to draws that far is lost to float64's rounding (at 1e12, a shift of "
                             f"1e-5 is 0): {fix}")

    def _logpdf_at_draws(self, x: np.ndarray) -> np.ndarray:
        probe = np.asarray(self._logpdf(np.resize(x, (2, 3))), dtype=np.float64)
        if probe.shape != (2, 3):
            raise ValueError(f"logpdf must be elementwise: an input of shape (2, 3) gave shape {probe.shape}")
        lx = np.asarray(self._logpdf(x), dtype=np.float64)
        bad = ~np.isfinite(lx)
        if bad.any():
            raise ValueError(f"logpdf is not finite at {int(bad.sum())} of the draws (e.g. x = {x[bad][0]!r}, "
                             f"logpdf = {lx[bad][0]!r}); sample must draw from the density whose log is logpdf")
        return lx

    # ------------------------------------------------------------- estimation
    def _terms(self, x, k, t):
        """``(r(X; t) − 1)² · f(X)/h_t(X)`` at ``X = x + k·t``, broadcasting ``x``, ``k`` against ``t``: the
        terms whose mean over ``x ~ f``, ``k`` uniform on {0, 1, 2} is χ²(t) (``X ~ h_t``)."""
        X = x + k * t
        lf = np.asarray(self._logpdf(X), dtype=np.float64)
        lf1 = np.asarray(self._logpdf(X - t), dtype=np.float64)
        lf2 = np.asarray(self._logpdf(X - 2.0 * t), dtype=np.float64)
        a = lf1 - lf                                        # log r
        # log |r − 1| without overflow (r = e^a past float64's range at large shifts of light tails), so that
        # a huge (r − 1)² times a tiny f/h is their product, not inf·0; the term itself may overflow to inf,
        # and D then is inf (a bound of 0), as it is
        log_d = np.where(a > 700.0, a, np.log(np.abs(np.expm1(np.minimum(a, 700.0)))))
        log_h = np.logaddexp(np.logaddexp(lf, lf1), lf2) - math.log(3.0)
        return np.exp(2.0 * log_d + (lf - log_h))

    def _pilot(self, z):
        """Tangent points ``c`` (≈ χ²_j) and proposal ``q`` (rows sum to 1) for a block of rows."""
        G = self._GRID
        a = np.abs(z)
        nonzero = a > 0
        a_min = np.min(np.where(nonzero, a, np.inf), axis=1, keepdims=True)
        a_max = np.max(a, axis=1, keepdims=True)
        empty = ~np.isfinite(a_min)                           # rows with z == 0: any grid will do
        a_min = np.where(empty, 1.0, a_min)
        a_max = np.where(empty, 1.0, a_max)
        lo = np.log(a_min)
        step = (np.log(a_max) - lo) / (G - 1)
        sizes = np.exp(lo + step * np.arange(G))              # (rows, G)
        grid = np.concatenate([sizes, -sizes], axis=1)        # (rows, 2G): positive shifts, then negative
        with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
            chi2 = self._terms(self._x0, self._k0, grid[..., None]).mean(axis=-1)
        log_chi2 = np.log(np.clip(chi2, np.finfo(np.float64).tiny, np.finfo(np.float64).max))  # finite: interpolated

        pos = np.where(step > 0, (np.log(np.where(nonzero, a, a_min)) - lo) / np.where(step > 0, step, 1.0), 0.0)
        pos = np.clip(pos, 0.0, G - 1)
        k = np.minimum(np.floor(pos).astype(np.int64), G - 2)
        frac = pos - k
        k = k + np.where(z < 0, G, 0)
        log_c = ((1 - frac) * np.take_along_axis(log_chi2, k, axis=1)
                 + frac * np.take_along_axis(log_chi2, k + 1, axis=1))
        c = np.where(nonzero, np.exp(log_c), 0.0)

        wc = c / (1.0 + c)
        wc_sum = wc.sum(axis=1, keepdims=True)
        a2 = (a / a_max) ** 2                                 # scaled: no underflow of tiny shifts
        share = np.where(wc_sum > 0, self._DEFENSIVE, 1.0)    # all-zero pilot: q ∝ z² alone
        q = ((1 - share) * wc / np.where(wc_sum > 0, wc_sum, 1.0)
             + share * a2 / np.where(empty, 1.0, a2.sum(axis=1, keepdims=True)))
        q = np.where(nonzero, q, 0.0)
        q = q / np.where(empty, 1.0, q.sum(axis=1, keepdims=True))
        return c, q

    def estimate(self, z) -> MonteCarloEstimate:
        """Upper bound, point estimate and diagnostics for each row of ``z`` (B, n); host NumPy arrays."""
        _, z = _rows(z)
        z = to_host(z)
        if not np.all(np.isfinite(z)):
            raise ValueError("z contains NaN or inf; the shifts must be finite")
        B, n = z.shape
        m = self.n_samples
        if n == 0:
            zeros = np.zeros(B)
            return MonteCarloEstimate(upper=zeros, point=zeros.copy(), log_std_error=zeros.copy(),
                                      ess=np.full(B, np.nan), confidence=self.confidence, n_samples=m)
        x, k = self._x, self._k

        upper, point, log_se, ess = (np.empty(B) for _ in range(4))
        rows_per_block = max(1, self._BLOCK // max(m, n, 2 * self._GRID * self.pilot_samples))
        for r0 in range(0, B, rows_per_block):
            zr = z[r0:r0 + rows_per_block]
            rb = zr.shape[0]
            c, q = self._pilot(zr)
            if np.isnan(c).any() or np.isnan(q).any():
                raise ValueError(f"MonteCarlo({self.name}): logpdf is not finite at some shifted pilot draws; the "
                                 f"law must have a log-density finite on all of R")
            w = 1.0 / (1.0 + c)
            offset = (np.log1p(c) - w * c).sum(axis=1)        # K
            cdf = np.cumsum(q, axis=1)
            pick = np.empty((rb, m), dtype=np.int64)
            for r in range(rb):
                # first j with cdf_j > u·total: q_J > 0 always, and J < n since u < 1
                pick[r] = np.searchsorted(cdf[r], self._u * cdf[r, -1], side="right")
            pick = np.minimum(pick, n - 1)
            z_j, w_j, q_j = (np.take_along_axis(v, pick, axis=1) for v in (zr, w, q))
            with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
                y = np.where(q_j > 0, w_j * self._terms(x, k, z_j) / np.where(q_j > 0, q_j, 1.0), 0.0)
            if np.isnan(y).any():
                raise ValueError(f"MonteCarlo({self.name}): logpdf is not finite at some shifted draws x + k·z "
                                 f"(k = 0, 1, 2); the law must have a log-density finite on all of R")

            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                mean = y.mean(axis=1)
                sd = y.std(axis=1, ddof=1)
                m3 = ((y - mean[:, None]) ** 3).mean(axis=1)
                skew = np.where(sd > 0, m3 / np.where(sd > 0, sd, 1.0) ** 3, 0.0)
                total = y.sum(axis=1)
                ess_r = np.where(total > 0, total**2 / (y**2).sum(axis=1), np.nan)
                se = sd / math.sqrt(m)
                quantile = self._t_quantile + np.maximum(skew, 0.0) * self._skew_coef
                sl = slice(r0, r0 + rb)
                # a term past float64's range: χ² and D are too (a bound of 0), not the NaN of inf − inf
                huge = ~np.isfinite(mean) | ~np.isfinite(se)
                upper[sl] = np.where(huge, np.inf, np.expm1(np.maximum(offset + mean + quantile * se, 0.0)))
                point[sl] = np.where(huge, np.inf, np.expm1(np.maximum(offset + mean, 0.0)))
            log_se[sl] = se
            ess[sl] = ess_r
        low = np.nan_to_num(ess, nan=np.inf) < 50
        if low.any():
            validation.warn(f"MonteCarlo({self.name}): effective sample size {np.nanmin(ess):.1f} < 50 in "
                            f"{int(low.sum())} of {B} rows: the per-draw terms are heavy-tailed at these shifts "
                            f"and the normal-theory upper bound on D may under-cover; increase n_samples "
                            f"(now {m})", RuntimeWarning)
        return MonteCarloEstimate(upper=upper, point=point, log_std_error=log_se, ess=ess,
                                  confidence=self.confidence, n_samples=m)

    def divergence(self, z):
        """Upper ``confidence`` bound on ``D`` for each row of ``z`` (B, n), float64, in ``z``'s namespace.

        Computed on the host; CuPy input is copied to the host and back.
        """
        xp = get_array_module(z)
        return xp.asarray(self.estimate(z).upper)

    def sample(self, rng, shape):
        """Draws of the noise from a NumPy Generator, float64."""
        return np.asarray(self._sampler(rng, shape), dtype=np.float64)

    def describe(self) -> str:
        return (f"MonteCarlo({self.name}): D(z) <= upper {self.confidence:g}-confidence bound from "
                f"{self.n_samples} draws (+{self.pilot_samples} pilot), seed {self.seed}")

    def __repr__(self) -> str:
        return (f"MonteCarlo(name={self.name!r}, n_samples={self.n_samples}, confidence={self.confidence!r}, "
                f"seed={self.seed}, pilot_samples={self.pilot_samples}, sha256={self._fingerprint})")


#: Where :class:`MonteCarlo`'s fingerprint reads its log-density (besides its draws): 0, ±10^k.
_FINGERPRINT_GRID = np.concatenate([[0.0], *((-v, v) for v in np.logspace(-3, 3, 13))])


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


#: The laws' own ``divergence`` methods that refuse NaN shifts, which :func:`divergence_of` bypasses.
_REFUSING_NAN = (Gaussian.divergence, Laplace.divergence)

#: The methods by which each built-in law computes D: a law whose class takes all of its base's as they are (hcrfast's
#: own PerFeatureGaussian, ScaledGaussian) gives the built-in D, read back for nothing (on CUDA a host read a step).
_D_METHODS = {Gaussian: ("divergence", "_divergence"), Laplace: ("divergence", "_divergence", "log1p_chi2")}


def _built_in_d(noise) -> bool:
    """Whether ``noise``'s D is a built-in law's: a :class:`Gaussian` or :class:`Laplace`, or a subclass that overrides
    none of the methods computing it (:data:`_D_METHODS`); a subclass overriding ``_divergence`` alone was taken
    unchecked."""
    cls = type(noise)
    return any(issubclass(cls, base) and all(getattr(cls, m) is getattr(base, m) for m in methods)
               for base, methods in _D_METHODS.items())


def as_noise(noise) -> NoiseLaw:
    """A noise law from ``noise``: a positive real ``sigma`` gives :class:`Gaussian`; a law is passed through.

    Raises
    ------
    TypeError
        For anything else (including ``bool`` and strings).
    ValueError
        For a real ``sigma`` that is not positive and finite.
    """
    if isinstance(noise, NoiseLaw):
        return noise
    if isinstance(noise, numbers.Real) and not isinstance(noise, bool) or (
            hasattr(noise, "__float__") and not isinstance(noise, (bool, str, bytes))
            and getattr(noise, "ndim", 0) == 0):
        return Gaussian(noise)
    raise TypeError(f"noise must be a positive float (the Gaussian sigma) or a noise law "
                    f"(hcrfast.noise.Gaussian, Laplace, MonteCarlo), got {type(noise).__name__}")


class PerFeatureStd(torch.nn.Module):
    """``model`` with its features divided by ``stds``: Gaussian noise of std ``stds[j]`` on feature j
    is unit noise on these features, so every method runs on this model with σ = 1 (the released
    features and their noise, divided by the stds, are the same observation). The stds are a float64
    buffer, divided in the features' dtype, so that the float64 copy that certifies divides by the
    user's values exactly; ``shape`` is the per-example shape of the features they belong to (or None
    for a flat vector)."""

    #: hcrfast's warnings name the user's model and its submodules, not this wrapper (``model.``)
    wraps_user_model = True

    def __init__(self, model, stds: np.ndarray, shape=None, device=None):
        super().__init__()
        self.model = model
        self.shape = shape
        with torch.inference_mode(False):  # a buffer made under inference_mode could not be differentiated
            self.register_buffer("stds", torch.as_tensor(np.asarray(stds, dtype=np.float64).reshape(-1),
                                                         device=device))
        self.training = bool(getattr(model, "training", False))  # mirrors the model's flag; changes none of it

    def forward(self, x):
        out = self.model(x)
        if self.shape is None and self.stds.shape[0] == 1:   # one std for every feature (ScaledGaussian): any shape
            return out / self.stds.to(out.dtype)
        if self.shape is not None and tuple(out.shape[1:]) != self.shape:
            raise _sigma_error(f"sigma has the shape {self.shape}, one std per feature, but the model's features "
                               f"have the shape {tuple(out.shape[1:])}; pass stds of the features' shape, or flat")
        flat = out.reshape(out.shape[0], -1)
        if flat.shape[1] != self.stds.shape[0]:
            raise _sigma_error(f"sigma holds {self.stds.shape[0]} stds, one per feature, but the model gives "
                               f"{flat.shape[1]} features per example (shape {tuple(out.shape[1:])}); pass one std "
                               f"per feature, or one number")
        return flat / self.stds.to(flat.dtype)


def _sigma_error(message: str) -> ValueError:
    """The refusal of per-feature stds that do not fit the features, raised inside the forward pass: marked
    (``hcrfast_argument``) so that :func:`hcrfast.validation.features_of` does not add its note that the
    model raised it (the model is fine; sigma is not)."""
    exc = ValueError(message)
    exc.hcrfast_argument = True
    return exc


@dataclass(frozen=True)
class PerFeatureGaussian(Gaussian):
    """Unit Gaussian noise on the features divided by ``stds`` (:class:`PerFeatureStd`): ``sigma`` is 1
    and every computation is a :class:`Gaussian`'s; ``label`` says, in results, messages and checkpoint
    keys, which stds the user gave."""

    label: str = ""

    def describe(self) -> str:
        return f"{self.label}: D(z) = exp(sum_j z_j^2/sigma_j^2) - 1, exact"


@dataclass(frozen=True)
class ScaledGaussian(Gaussian):
    """Unit Gaussian noise on the features divided by one std, ``scale`` (:class:`PerFeatureStd` of one
    std): how :func:`accepts_per_feature_sigma` runs a Gaussian σ too far from 1 for the features' dtype
    (:func:`whitened_scale`). ``sigma`` is 1 and every computation is a :class:`Gaussian`'s; messages,
    results and checkpoint keys name ``Gaussian(scale)``, the user's noise (the key's ``repr`` tells the two
    runs apart)."""

    scale: float = 1.0

    def describe(self) -> str:
        return Gaussian(self.scale).describe()


#: A plain Gaussian σ outside ``[tiny**(1/4), max**(1/4)]`` of the features' dtype (float32: about
#: [3e-10, 4e9]; float64: [1e-77, 1e77]) is run on the features divided by σ, with σ = 1. The steps' feature
#: shifts are σ-sized, and LSQR, the Krylov basis and the norms square them in that dtype: past these ends
#: their squares came within a factor 1e-19 (float32) of under- or overflowing, and did (2026-12-02:
#: features and σ scaled by 1e20 overflowed every solver; by 1e-20, LSQR's steps came out 0). D depends on
#: z/σ alone, so the bounds are the same problem's, in every digit that matters.
WHITEN_ROOT = 4


def whitened_scale(sigma, batch) -> float | None:
    """σ where ``sigma`` is a plain Gaussian std (one number, or ``hcrfast.Gaussian(σ)``) that the features'
    dtype (the batch's; float32 where not float64: a float16 model is solved as a float32 copy) holds with too
    little room for its squares (:data:`WHITEN_ROOT`); None otherwise, and for anything the call itself
    should refuse or read (its errors name it)."""
    try:
        noise = as_noise(host_argument("sigma", sigma))
    except Exception:   # the call refuses it, in its own words
        return None
    if type(noise) is not Gaussian:
        return None
    dtype = torch.float64 if getattr(batch, "dtype", None) == torch.float64 else torch.float32
    info = torch.finfo(dtype)
    low, high = info.tiny ** (1 / WHITEN_ROOT), info.max ** (1 / WHITEN_ROOT)
    return None if low <= noise.sigma <= high else float(noise.sigma)


class ScaledInputs(torch.nn.Module):
    """``model`` on its inputs multiplied by ``scale``, a power of two: how :func:`accepts_per_feature_sigma`
    runs a batch whose values are too far from 1 for its dtype (:func:`input_scale`), as the batch divided by
    ``scale`` (exact, as is the product back: the model sees the user's inputs, bit for bit). An unbiased
    estimator of θ/s is one of θ divided by s, so the bounds on θ are those on θ/s times s
    (:func:`as_input_scaled_result`)."""

    #: hcrfast's warnings name the user's model and its submodules, not this wrapper (``model.``)
    wraps_user_model = True
    #: a checkpoint key names the model inside (checkpoint.key_model_fingerprint), and :attr:`key_note`
    keyed_elsewhere = True

    def __init__(self, model, scale: float):
        super().__init__()
        self.model = model
        self.scale = float(scale)
        self.training = bool(getattr(model, "training", False))  # mirrors the model's flag; changes none of it

    @property
    def key_note(self) -> str:
        """What a checkpoint key adds to the model inside: the divisor, which the divided batch does not show
        (x and 2x divided by 2^k and 2^(k+1) are the same bits)."""
        return f"inputs divided by 2^{round(math.log2(self.scale))}"

    def forward(self, x):
        return self.model(x * self.scale)


#: At most this many of a batch's values, evenly spaced, give its typical magnitude (:func:`input_scale`)
INPUT_SCALE_SAMPLE = 65536


def input_scale(model, batch) -> float | None:
    """A power of two near the batch's typical magnitude (the median of the nonzero magnitudes of at most
    :data:`INPUT_SCALE_SAMPLE` of its values, drawn at random with a fixed seed) where that is outside ``[tiny**(1/4), max**(1/4)]`` of its dtype
    (float32 or float64 torch tensors, of a ``torch.nn.Module``), as for σ (:data:`WHITEN_ROOT`), and the
    largest value divided by it is not: the steps ε are sized like the inputs where J is their inverse's scale
    (a model that normalizes inputs of 1e-20 by dividing them), and LSQR and the Krylov basis square them in
    that dtype. A batch of mixed scales (one column in units of 1e20 among columns near 1, one far pixel) is
    left as it is: divided by its largest value, its other values' rows of J would leave the dtype instead; so
    is a batch whose smallest nonzero value, divided, would not be a normal number (it would not come back
    bit for bit). None
    otherwise (and for anything the call refuses: its errors name it)."""
    if (not isinstance(model, torch.nn.Module) or not isinstance(batch, torch.Tensor)
            or batch.dtype not in (torch.float32, torch.float64) or batch.layout != torch.strided or not batch.numel()):
        return None
    info = torch.finfo(batch.dtype)
    low, high = info.tiny ** (1 / WHITEN_ROOT), info.max ** (1 / WHITEN_ROOT)
    try:
        with torch.no_grad():
            values = batch.detach()
            smallest, biggest = torch.aminmax(values)
            largest = max(abs(float(smallest)), abs(float(biggest)))
            if not math.isfinite(largest) or largest == 0:
                return None
            flat = values.reshape(-1)
            if flat.numel() > INPUT_SCALE_SAMPLE:   # drawn at random (seeded): a stride could land on one column
                picks = torch.randint(flat.numel(), (INPUT_SCALE_SAMPLE,), generator=torch.Generator().manual_seed(0))
                flat = flat[picks.to(flat.device)]
            sample = flat.abs()
            sample = sample[sample > 0]
            typical = float(sample.median()) if sample.numel() else 0.0
    except Exception:   # a nested tensor, a meta one: the call's checks refuse it, in their own words
        return None
    if typical == 0 or low <= typical <= high:
        return None
    scale = 2.0 ** round(math.log2(typical))
    if largest / scale > high:
        return None
    if scale > 1:   # dividing shrinks: every nonzero value must stay normal, or it would not come back bit for bit
        with torch.no_grad():
            magnitudes = batch.detach().abs()
            smallest = float(torch.where(magnitudes > 0, magnitudes, math.inf).amin())
        if smallest / scale < info.tiny:
            return None
    return scale


#: LSQR's damp as the caller gave it, while a call runs with it scaled (:func:`_undivided_damping`): what its
#: messages quote (:func:`shown_damp`), not the divided problem's value the user never wrote
_DAMP_AS_GIVEN: contextvars.ContextVar = contextvars.ContextVar("hcrfast_damp_as_given", default=None)


def _with_damp_as_given(fn, damp: float, *args, **kwargs):
    """``fn(*args, **kwargs)`` with :func:`shown_damp` giving ``damp``, the caller's value."""
    token = _DAMP_AS_GIVEN.set(damp)
    try:
        return fn(*args, **kwargs)
    finally:
        _DAMP_AS_GIVEN.reset(token)


def shown_damp(damp: float) -> float:
    """``damp`` (LSQR's, as a call runs with it) as the caller gave it, for a message."""
    given = _DAMP_AS_GIVEN.get()
    return damp if given is None else given


def _undivided_damping(arguments: dict, unit: float) -> dict:
    """Put into ``arguments`` (a call's, bound by name) the damping of the divided problem: ``lsqr``'s ``damp``
    (bound, targeted_bound) and the attack's ``damping`` λ weigh ‖ε‖ against ‖J ε − r‖, so they are in J's units
    and scale as it does, by ``unit`` (inputs' divisor / features'). Before 2026-12-02 they were passed as given:
    a damping ×1e20 with sigma ×1e20 made the attack take no step. Returns the values given, by name, for
    :func:`_damping_given_back`."""
    given = {}
    if unit == 1.0:
        return given
    options = arguments.get("lsqr")
    damp = getattr(options, "damp", None)
    if isinstance(damp, numbers.Real) and math.isfinite(damp) and damp > 0 and dataclasses.is_dataclass(options):
        given["lsqr"] = damp
        arguments["lsqr"] = dataclasses.replace(options, damp=damp * unit)
    damping = arguments.get("damping")
    if isinstance(damping, numbers.Real) and not isinstance(damping, bool) and math.isfinite(damping) and damping > 0:
        given["damping"] = damping
        arguments["damping"] = damping * unit
    return given


def _damping_given_back(result, given: dict, unit: float) -> None:
    """``result``'s record of the damping as the user gave it, and the attack's per-problem λ in their units."""
    for holder in (result, getattr(result, "targeted", None)):
        params = getattr(holder, "params", None)
        if "lsqr" in given and isinstance(params, dict) and isinstance(params.get("lsqr"), dict):
            params["lsqr"]["damp"] = given["lsqr"]
    if "damping" in given:
        result.params["damping"] = given["damping"]
    if unit != 1.0 and getattr(result, "damping", None) is not None and not isinstance(result.damping, (int, float)):
        result.damping = result.damping / unit   # the attack's λ per problem


def as_input_scaled_result(result, scale: float):
    """``result``, computed on the batch divided by ``scale`` (:class:`ScaledInputs`), made to read as the
    batch's: every bound and step in input units times ``scale`` (``mse`` times its square), and
    ``params["inputs_divided_by"]`` saying how it ran. Exact: ``scale`` is a power of two."""
    def times(name, holder, factor):
        if getattr(holder, name, None) is not None:
            setattr(holder, name, getattr(holder, name) * factor)

    for name in ("std", "eps", "std_algorithm1", "std_every_mode", "rmse", "bias", "bias_se", "estimates"):
        times(name, result, scale)   # (the last four: the attack's)
    times("mse", result, scale * scale)
    result.params["inputs_divided_by"] = float(scale)
    targeted = getattr(result, "targeted", None)
    if hasattr(targeted, "params"):   # Bounds' targeted part (TargetedBounds' own is a mask)
        for name in ("std", "eps", "std_every_mode"):
            times(name, targeted, scale)
        targeted.params["inputs_divided_by"] = float(scale)
    return result


def _begun_on_inputs(checkpoint, batch) -> bool:
    """Whether the ``checkpoint`` folder holds a call on ``batch`` as it is (made before 2026-12-02, which did
    not divide a batch that far from 1): resumed as it was begun."""
    stored = _stored_key(checkpoint)
    if not stored.get("batch"):
        return False
    from hcrfast.checkpoint import batch_fingerprint

    return stored["batch"] == batch_fingerprint(batch)


def _stored_key(checkpoint) -> dict:
    """The key.json of a ``checkpoint`` folder, or {} where there is none to read."""
    import json
    from pathlib import Path

    if not isinstance(checkpoint, (str, bytes)) and not hasattr(checkpoint, "__fspath__"):
        return {}
    try:
        stored = json.loads((Path(os.fsdecode(checkpoint)).expanduser() / "key.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _begun_unscaled(checkpoint, scale: float) -> bool:
    """Whether the ``checkpoint`` folder holds a call at σ = ``scale`` made on the features as they are (by a
    version before 2026-12-02, which did not divide them by a σ that far from 1): such a call is resumed as it
    was begun, not refused as one with another model and noise (its chunks' shifts z are in the model's units)."""
    return _stored_key(checkpoint).get("noise") == repr(Gaussian(scale))


def per_feature_stds(sigma):
    """The stds of a per-feature ``sigma`` (an array, tensor or sequence of more than one real value) as a
    float64 NumPy array of their shape, checked positive and finite; None for anything else (one number,
    a law)."""
    sigma = host_argument("sigma", sigma)
    if isinstance(sigma, torch.Tensor):
        if sigma.numel() <= 1:
            return None
        if sigma.is_complex() or sigma.dtype == torch.bool:
            raise TypeError(f"sigma as one std per feature must hold real numbers, got a {sigma.dtype} tensor")
        values = sigma.detach().to("cpu", torch.float64).numpy()
    elif isinstance(sigma, (np.ndarray, list, tuple)):
        try:
            values = np.asarray(detached(sigma))   # (a list of tensors that require grad, as one such tensor)
        except (TypeError, ValueError):
            return None
        if values.size <= 1:
            return None
        if values.dtype.kind not in "iuf":
            raise TypeError(f"sigma as one std per feature must hold real numbers, got an array of dtype {values.dtype}")
        values = values.astype(np.float64)
    else:
        return None
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        raise ValueError(f"sigma as one std per feature must be positive and finite; entries "
                         f"{np.flatnonzero(bad)[:10].tolist()} are {values.ravel()[bad.ravel()][:10].tolist()}")
    return values


def per_feature_label(stds: np.ndarray) -> str:
    """How results and messages name a per-feature σ: its spread and a fingerprint of the values."""
    digest = hashlib.sha256(np.ascontiguousarray(stds, dtype=np.float64).tobytes()).hexdigest()[:16]
    return (f"Gaussian(sigma per feature, {stds.size} stds, min {stds.min():.6g}, median {np.median(stds):.6g}, "
            f"max {stds.max():.6g}, sha256 {digest})")


def _whiten(model, batch, stds: np.ndarray, certify: bool) -> PerFeatureStd:
    """``model`` wrapped by :class:`PerFeatureStd`. A plain function under certification is refused first
    (its float64 copy could not divide in float64), and so are stds that the batch's dtype cannot hold."""
    from hcrfast import validation

    if isinstance(batch, torch.Tensor) and batch.is_floating_point():  # else the batch's checks name its fault
        if not isinstance(model, torch.nn.Module):
            validation.float64_model(model, batch, certify)
        # a float16 Module is solved as a float32 copy (validation.float32_for_float16): its features are float32
        # (1e-20 and 1e-9 were refused as 0 in float16, which the call never divides in, a review found)
        dtype = torch.float32 if batch.dtype == torch.float16 and isinstance(model, torch.nn.Module) else batch.dtype
        held = torch.as_tensor(stds).to(dtype)
        # a subnormal std too: the features are divided by it, and its inverse is past the dtype's range (the
        # features or J's products came out inf, refused as "NaN or inf" features: a sweep's sigma0 of 1e-40)
        lost = ~(torch.isfinite(held) & (held >= torch.finfo(dtype).tiny))
        if bool(lost.any()) and stds.size == 1 and stds.ndim <= 1:
            value = float(held.reshape(-1)[0])
            raise ValueError(f"sigma={float(stds.reshape(-1)[0]):g} is "
                             + (f"{value:g} in " if value == 0 or not math.isfinite(value) else
                                f"below the smallest normal number ({torch.finfo(dtype).tiny:.4g}) of ")
                             + f"{validation.dtype_name(dtype)}, the features' dtype; pass a sigma nearer the "
                             f"features' scale (hcrfast.rms_sigma(features, scale)), or a float64 model and batch")
        if bool(lost.any()):
            raise ValueError(f"sigma as one std per feature holds values {validation.dtype_name(dtype)} cannot "
                             f"represent (entries "
                             f"{torch.nonzero(lost.reshape(-1)).flatten()[:10].tolist()} become 0, subnormal or inf); "
                             f"scale the features (and the stds) nearer 1, or run in float64")
    return PerFeatureStd(model, stds, shape=tuple(stds.shape) if stds.ndim > 1 else None,
                         device=batch.device if isinstance(batch, torch.Tensor) else None)


def accepts_per_feature_sigma(fn=None, *, scale_inputs: bool = False):
    """Let ``fn(model, batch, sigma, ...)`` (bound, targeted_bound, the attack) take one std per feature
    as its third argument (by position or name): it runs on :class:`PerFeatureStd` with the unit
    :class:`PerFeatureGaussian`, and its result says so in ``params`` (``sigma`` None, ``noise`` naming
    the stds) and gives feature shifts (``z``) in the model's own units (the attack's residuals stay in
    those of the divided features). A Gaussian σ too far from 1 for the features'
    dtype (:func:`whitened_scale`) runs the same way, on the features divided by σ with
    :class:`ScaledGaussian`, and its result reads as the σ call's (``params["sigma"]`` σ,
    ``params["features_divided_by"]`` σ, ``z`` and the attack's residuals in the model's units). With ``scale_inputs``, a batch
    whose typical value is that far from 1 for its dtype (:func:`input_scale`) runs as the batch divided by a power
    of two, on :class:`ScaledInputs`, and its result reads as the batch's (:func:`as_input_scaled_result`).
    Any other number or noise law goes straight to ``fn``."""
    if fn is None:
        return functools.partial(accepts_per_feature_sigma, scale_inputs=scale_inputs)
    signature = inspect.signature(fn)
    model_name, batch_name, sigma_name = list(signature.parameters)[:3]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            bound_args = signature.bind(*args, **kwargs)
        except TypeError as exc:  # bind's message does not say whose arguments these are
            known = ", ".join(name for name in signature.parameters)
            raise TypeError(f"{fn.__module__.split('.')[0]}.{fn.__name__}(): {exc}; its arguments are {known}") from None
        sigma = bound_args.arguments.get(sigma_name)
        stds = per_feature_stds(sigma)
        scale = whitened_scale(sigma, bound_args.arguments.get(batch_name)) if stds is None else None
        _refuse_subnormal(f"{fn.__module__.split('.')[0]}.{fn.__name__}", scale, stds,
                          bound_args.arguments.get(batch_name))
        checkpoint = bound_args.arguments.get("checkpoint")
        if scale is not None and _begun_unscaled(checkpoint, scale):
            scale = None   # resumed as it was begun (by a version before 2026-12-02): on the features as they are
        inputs = input_scale(bound_args.arguments[model_name], bound_args.arguments[batch_name]) if scale_inputs else None
        if inputs is not None and _begun_on_inputs(checkpoint, bound_args.arguments[batch_name]):
            inputs = None   # resumed as it was begun: on the inputs as they are
        if inputs is not None and bound_args.arguments.get("directions") is not None:
            # bound(targets=)'s own call of targeted_bound, with directions in the units its caller runs in: the
            # batch as it is where that call runs undivided (its rerun), whose chunk was divided again here, and
            # the directions were not (bounds 6e-6 off, a chunk run twice: a review, 2026-12-02)
            inputs = None
        if inputs is None:
            return _run_scaled(fn, signature.bind(*args, **kwargs), scale, stds, None)
        from hcrfast.checkpoint import discarded_on

        begun = bool(_stored_key(checkpoint))
        sharded = bool(bound_args.arguments.get("shard"))
        token = validation.INPUTS_DIVIDED.set(True)
        try:   # (what the failed call saved in a checkpoint folder is removed: the call runs again, undivided)
            with discarded_on(validation.StepsOutOfRange):
                return _run_scaled(fn, bound_args, scale, stds, inputs)
        except validation.StepsOutOfRange as exc:
            # steps the size of the inputs are what the division assumes (a model that normalizes them); where
            # the model does not, the divided steps are the inputs' inverse scale (inputs of 1e-160 with σ = 1:
            # 1e157, whose squares overflowed: every bound 0, 2026-12-02), and the batch as it is holds them: run
            # on it, unless a checkpoint folder holds an earlier call's key or chunks on the divided batch
            name = f"{fn.__module__.split('.')[0]}.{fn.__name__}"
            if checkpoint is not None and (begun or sharded or _stored_key(checkpoint)):
                exc.add_note(f"{name} ran on the batch divided by {inputs:g} (its typical value is that far from 1), "
                             f"and its steps left its dtype's range there; it runs again on the batch as it is then, "
                             f"but not "
                             + ("sharded (shard=True: the processes would all have to): run it unsharded in another "
                                "checkpoint folder" if sharded else
                                f"where the checkpoint folder {checkpoint} holds work begun on the divided batch by an "
                                f"earlier call: pass another folder, or remove that one"))
                raise
            if bound_args.arguments.get("progress"):
                validation.say(f"{name}: the steps of the batch divided by {inputs:g} left its dtype's range "
                               f"({str(exc).split(';')[0]}); running again on the batch as it is")
        finally:
            validation.INPUTS_DIVIDED.reset(token)
        return _run_scaled(fn, signature.bind(*args, **kwargs), scale, stds, None)

    return wrapper


def _refuse_subnormal(name: str, scale, stds, batch) -> None:
    """Refuse a Gaussian σ (``scale``, or one of the ``stds``) below the smallest normal number of the features'
    dtype (the batch's; float32 where not float64, as :func:`whitened_scale`): the call divides the features by
    it, and 1/σ is past that dtype's range, so the features or J's products by it came out inf, refused as
    features with NaN or inf, or as a model whose derivative is not finite (a linear one)."""
    if scale is None and stds is None:
        return
    dtype = np.float64 if getattr(batch, "dtype", None) == torch.float64 else np.float32
    tiny = float(np.finfo(dtype).tiny)
    values = np.asarray([scale] if stds is None else stds, dtype=np.float64).reshape(-1)
    with np.errstate(under="ignore", over="ignore"):
        held = values.astype(dtype)
    if not np.all(np.isfinite(held) & (held != 0)):
        return   # values the dtype rounds to 0 or inf: the call's own check names every one of them (_whiten)
    subnormal = values[values < tiny]
    if not subnormal.size:
        return
    low = float(subnormal.min())
    what = f"sigma={low!r}" if stds is None else f"sigma (one std per feature) holds {low!r}"
    kind = np.dtype(dtype).name
    raise ValueError(f"{name}: {what}, below {kind}'s smallest normal number ({tiny:.4g}; {kind}: the features' "
                     f"dtype): the features are divided by the noise's std, and 1/sigma is past {kind}'s range; "
                     f"rescale the problem: multiply the model's features by a power of two (a Module whose forward "
                     f"returns model(x) * 2.0**k) and sigma by the same, which leaves every bound as it is"
                     + ("" if dtype == np.float64 else ", or pass a float64 model and batch"))


def _run_scaled(fn, bound_args, scale, stds, inputs):
    """:func:`accepts_per_feature_sigma`'s call of ``fn`` with its arguments ``bound_args`` on the features
    divided by ``scale`` (a far Gaussian σ) or by ``stds`` (one std per feature), on the batch divided by
    ``inputs``; each None for none."""
    if scale is None and stds is None and inputs is None:
        return fn(*bound_args.args, **bound_args.kwargs)
    signature = bound_args.signature
    model_name, batch_name, sigma_name = list(signature.parameters)[:3]
    certify_default = signature.parameters["certify"].default if "certify" in signature.parameters else False
    # a damping is in J's units (features per input): in the divided problem, times inputs / sigma
    given = _undivided_damping(bound_args.arguments, (inputs or 1.0) / (scale or 1.0))
    run = fn if "lsqr" not in given else functools.partial(_with_damp_as_given, fn, given["lsqr"])
    if inputs is not None:
        bound_args.arguments[model_name] = ScaledInputs(bound_args.arguments[model_name], inputs)
        bound_args.arguments[batch_name] = bound_args.arguments[batch_name].detach() / inputs   # (exact: 2^k)
        start = bound_args.arguments.get("start")
        if isinstance(start, torch.Tensor) and start.is_floating_point():   # the attack's start points
            bound_args.arguments["start"] = start.detach() / inputs
    certify = bound_args.arguments.get("certify", certify_default)  # the attack never makes a float64 copy
    if scale is not None:
        whitened = _whiten(bound_args.arguments[model_name], bound_args.arguments[batch_name], np.array([scale]),
                           certify)
        whitened.keyed_elsewhere = True   # its σ is the noise's repr in a checkpoint key (ScaledGaussian)
        bound_args.arguments[model_name] = whitened
        bound_args.arguments[sigma_name] = ScaledGaussian(1.0, scale=scale)
        result = as_scaled_result(run(*bound_args.args, **bound_args.kwargs), scale)
    elif stds is not None:
        label = per_feature_label(stds)
        bound_args.arguments[model_name] = _whiten(bound_args.arguments[model_name],
                                                   bound_args.arguments[batch_name], stds, certify)
        bound_args.arguments[sigma_name] = PerFeatureGaussian(1.0, label=label)
        result = as_per_feature_result(run(*bound_args.args, **bound_args.kwargs), stds, label=label)
    else:
        result = run(*bound_args.args, **bound_args.kwargs)
    _damping_given_back(result, given, (inputs or 1.0) / (scale or 1.0))
    return result if inputs is None else as_input_scaled_result(result, inputs)


def as_scaled_result(result, scale: float, sigma: float | None = None, divided_by: float | None = None):
    """``result``, computed on the features divided by ``scale`` with σ = 1 (:class:`ScaledGaussian`), made to
    read as the call at σ = ``scale``: ``params`` name Gaussian(scale) (and ``features_divided_by`` says how it
    ran) and the feature shifts ``z`` come back in the model's own units. ``sigma``: the call's σ where it is
    not ``scale`` (a sweep's k·sigma0, run at σ = k on the features divided by sigma0); ``divided_by``: what
    the features were divided by in all, where more than ``scale`` (that call's own division by a far k)."""
    sigma = float(scale if sigma is None else sigma)
    divided_by = float(scale if divided_by is None else divided_by)
    described = Gaussian(sigma).describe()
    params = result.params
    params.update(sigma=sigma, noise=described, features_divided_by=divided_by)
    if "noise_asked" in params:
        params["noise_asked"] = described
    if hasattr(getattr(result, "targeted", None), "params"):  # Bounds' targeted part (TargetedBounds' is a mask)
        result.targeted.params.update(sigma=sigma, noise=described, features_divided_by=divided_by)
    if getattr(result, "z", None) is not None:
        result.z = result.z * scale
    for name in ("residual_norm", "residual_start", "residual_truth", "residual_history"):   # the attack's
        if getattr(result, name, None) is not None:
            setattr(result, name, getattr(result, name) * scale)
    return result


def as_per_feature_result(result, stds: np.ndarray, divided_by=None, label: str | None = None):
    """``result``, computed on :class:`PerFeatureStd` (the model's features divided by ``divided_by``, by
    default ``stds``), made to read as a result for one std per feature, ``stds``: ``params`` says so
    (``sigma`` None, ``noise`` naming the stds; where the call's own σ was not 1, the divided features'
    noise ``stds / divided_by`` is what it was given) and the feature shifts ``z`` come back in the model's
    own units. ``label``: :func:`per_feature_label` of ``stds``, where already known."""
    label = per_feature_label(stds) if label is None else label
    params = result.params
    params["sigma"] = None
    params["noise"] = PerFeatureGaussian(1.0, label=label).describe()  # what it is where the call ran at σ = 1
    if "noise_asked" in params:
        params["noise_asked"] = params["noise"]
    if hasattr(getattr(result, "targeted", None), "params"):  # Bounds' targeted part (TargetedBounds' is a mask)
        result.targeted.params.update(sigma=None, noise=params["noise"])
    if getattr(result, "z", None) is not None:
        xp = get_array_module(result.z)
        unit = stds if divided_by is None else divided_by
        result.z = result.z * xp.asarray(np.asarray(unit, dtype=np.float64).reshape(-1), dtype=result.z.dtype)
    return result
