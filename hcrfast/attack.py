"""An empirical reconstruction attack, to calibrate the HCR bounds against what an attacker does.

For every example θ and every one of ``draws`` noise draws the attacker sees the
released features ``X = a(θ) + Z`` and reconstructs ``θ̂`` by damped Gauss–Newton
(Levenberg–Marquardt) on the least-squares misfit ``‖a(θ̂) − X‖²``. Step j solves,
for every (example, draw) problem at once, with the batched LSQR engine,

    δ = argmin ‖J(θ̂) δ − (X − a(θ̂))‖² + λ²‖δ‖²,      θ̂ ← θ̂ + δ  if ‖a(θ̂ + δ) − X‖ < ‖a(θ̂) − X‖,

with ``J(θ̂)`` the Jacobian at the current estimate (:class:`hcrfast.bindings.TorchJacobian`).
The empirical per-mode error ``Q(θ̂ − θ)`` over the draws (its RMS, mean and spread)
is then set beside the bound by :func:`compare`.

Why this attacker. On a linear model ``a(θ) = Wθ + b`` with Gaussian noise, one
undamped step from anywhere gives the least-squares estimator, unbiased with
covariance ``σ²(WᵀW)⁻¹``: it attains the Cramér–Rao bound, the largest value any
valid bound can take (METHOD.md §4). So on a locally linear model an attacker that
converges to the nearby least-squares solution is the efficient *unbiased*
attacker, and ``attack_rmse / bound`` measures how far the bound is from it.
Expect ratios ≥ 1 (up to Monte Carlo error) where the attacker is nearly unbiased;
ratios below 1 where it is biased (see :func:`compare`) do not contradict the bound.

References: K. Levenberg (1944), D. W. Marquardt (1963); Paige & Saunders (1982) for LSQR.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hcrfast import kernels, validation
from hcrfast.algorithm import (_Eta, _auto_chunk, _every, _heartbeat, _in_chunks, _nonfinite_derivative, _span,
                               _progress_line, infinite_derivative)
from hcrfast.backend import get_array_module, to_host
from hcrfast.bindings import (
    TorchJacobian,
    array_module_for,
    from_torch,
    to_torch,
)
from hcrfast.lsqr import LSQROptions
from hcrfast.lsqr import lsqr as lsqr_solve
from hcrfast.noise import Gaussian, ScaledGaussian, accepts_per_feature_sigma, as_noise
from hcrfast.checkpoint import (RESUME_BITWISE, Checkpoint, arithmetic_of, gaps, key_batch_fingerprint,
                                key_model_fingerprint, sha256_tensors, taken_back_on_failure)
from hcrfast.results import (counted, load_npz, median_count, mse_from_modes, revision_line, revision_loaded,
                             revision_saved, run_record, same_result, save_npz, short_repr)
from hcrfast.operators import RowScaled

__all__ = ["ATTACK_LSQR", "AttackResult", "compare", "gauss_newton_attack", "observation_noise"]

#: LSQR settings of each Gauss–Newton step by dtype unless the caller passes ``lsqr=``
#: (``iter_lim`` None: ``LSQR_ITER_FACTOR · max(n, p)``). The step must be accurate for the
#: attacker to reach the least-squares point it aims at; loose solves would make it look worse
#: than it is and so flatter the bound.
LSQR_ITER_FACTOR = 4
ATTACK_LSQR = {
    torch.float64: LSQROptions(atol=1e-10, btol=1e-10, conlim=1e12),
    torch.float32: LSQROptions(atol=1e-6, btol=1e-6, conlim=1e7),
}

#: Default convergence tolerance by dtype (relative step size and relative residual decrease).
DEFAULT_TOL = {torch.float64: 1e-10, torch.float32: 1e-5}

#: The first increase of a problem's damping goes to max(10·damping, FIRST_DAMPING · ‖J‖_F) with
#: ‖J‖_F estimated from NORM_PROBES fixed Gaussian probes (Hutchinson: ‖J‖_F² = E‖Jv‖²), the same
#: probes for every problem. LSQR's own ``anorm`` serves only where they all give 0: it grows past
#: ‖J‖_F once the iterations run beyond J's rank (lost orthogonality), by an amount set by rounding,
#: so the damping, and every later step, changed with chunk_size and the other examples of a chunk.
FIRST_DAMPING = 1e-3
NORM_PROBES = 4

#: A problem whose damping was raised this many times in a row without an accepted step stops.
MAX_DAMPING_LEVEL = 30

#: Third element of the noise stream ``default_rng([seed, e, NOISE_STREAM])``: keeps the attack's
#: noise independent of Algorithm 1's start vectors, which use ``default_rng([seed, e])``.
NOISE_STREAM = 1


def observation_noise(example_ids, draws: int, n: int, *, seed: int, noise) -> np.ndarray:
    """The attack's noise draws Z, shape (len(example_ids)·draws, n), float64 on the host.

    Example e draws ``noise.sample(default_rng([seed, e, 1]), (draws, n))``: its own
    stream, so results do not depend on chunking or on the other examples, and
    independent of :func:`hcrfast.start_vectors` (stream ``[seed, e]``).
    """
    law = as_noise(noise)
    out = np.empty((len(example_ids) * draws, n))
    for i, e in enumerate(example_ids):
        out[i * draws:(i + 1) * draws] = law.sample(np.random.default_rng([seed, int(e), NOISE_STREAM]), (draws, n))
    return out


@dataclass
class AttackResult:
    """What the Gauss–Newton attacker achieved, per example and per mode.

    Errors are ``Q(θ̂ − θ)`` with Q the basis of the call (orthonormal 2-D DCT-II per
    channel, or the identity), one value per (example, draw, mode).

    Attributes
    ----------
    rmse : array, shape = batch.shape
        ``sqrt(mean over draws of (Q(θ̂ − θ))_k²)``: the empirical RMS error per mode,
        the quantity to set beside the bound ``std``.
    bias : array, shape = batch.shape
        Mean over draws of ``Q(θ̂ − θ)``.
    bias_se : array, shape = batch.shape
        Standard error of ``bias``: ``std / sqrt(draws)`` (NaN for one draw).
    std : array, shape = batch.shape
        Sample standard deviation over draws (ddof = 1; NaN for one draw).
    mse : array, shape (B,)
        ``(1/p)·mean over draws of ‖θ̂ − θ‖²``, to set beside ``Bounds.mse`` (eq. 6).
    estimates : array, shape (B, draws, *input_shape)
        The reconstructions θ̂, in the model's dtype (float32 for a float16 Module, run as a float32 copy).
    residual_norm : array, shape (B, draws)
        Final ``‖a(θ̂) − X‖``.
    residual_start : array, shape (B, draws)
        ``‖a(θ̂₀) − X‖`` at the start.
    residual_truth : array, shape (B, draws)
        ``‖Z‖ = ‖a(θ) − X‖``: a final residual above it means the attacker stopped
        at a worse fit than the truth itself (a poor local minimum).
    residual_history : array, shape (B, draws, steps + 1)
        ``‖a(θ̂) − X‖`` after each Gauss–Newton iteration (entry 0: the start);
        non-increasing by construction; repeated once a problem has stopped.
    steps : array of int, shape (B, draws)
        Accepted Gauss–Newton steps.
    iterations : array of int, shape (B, draws)
        Gauss–Newton iterations tried (accepted or rejected).
    lsqr_iterations : array of int, shape (B, draws)
        LSQR iterations over all of them.
    converged : array of bool, shape (B, draws)
        Stopped by the tolerance (relative step or relative residual decrease ≤ ``tol``)
        rather than by ``steps`` or the damping limit.
    damping : array, shape (B, draws)
        The damping λ each problem would use next.
    params : dict
        The parameters used; ``"run"``: what a rerun needs besides (:func:`hcrfast.results.run_record`: the
        example ids, the chunk size used, torch's thread count, the versions of hcrfast, torch, NumPy and
        SciPy), recorded but not compared by ``==``, and absent from files written before it was recorded.
    seconds : float
    """

    rmse: object
    bias: object
    bias_se: object
    std: object
    mse: object
    estimates: object
    residual_norm: object
    residual_start: object
    residual_truth: object
    residual_history: object
    steps: object
    iterations: object
    lsqr_iterations: object
    converged: object
    damping: object
    params: dict = field(default_factory=dict)
    seconds: float = 0.0

    _ARRAYS = ("rmse", "bias", "bias_se", "std", "mse", "estimates", "residual_norm", "residual_start",
               "residual_truth", "residual_history", "steps", "iterations", "lsqr_iterations", "converged",
               "damping")

    __repr__ = short_repr
    __eq__ = same_result
    __hash__ = None

    def to_numpy(self) -> AttackResult:
        """A copy whose arrays are NumPy arrays on the host."""
        return dataclasses.replace(self, **{k: to_host(getattr(self, k)) for k in self._ARRAYS})

    _FORMAT = "hcrfast.AttackResult/1"

    def save(self, path) -> None:
        """Write every field to the ``.npz`` file ``path`` (atomically; ``numpy.load`` reads it too)."""
        h = self.to_numpy()
        save_npz(path, self._FORMAT, {k: getattr(h, k) for k in self._ARRAYS},
                 dict(params=revision_saved(h.params, CHECKPOINT_FORMAT), seconds=float(h.seconds)))

    @classmethod
    def load(cls, path) -> AttackResult:
        """The :class:`AttackResult` that :meth:`save` wrote to ``path`` (NumPy arrays); one another revision of
        the attack computed keeps it in ``params["revision"]`` (:meth:`hcrfast.Bounds.load`)."""
        arrays, meta = load_npz(path, cls._FORMAT, "AttackResult.save", arrays_needed=cls._ARRAYS,
                                meta_needed=("params", "seconds"))
        return cls(**{k: arrays[k] for k in cls._ARRAYS}, params=revision_loaded(meta["params"], CHECKPOINT_FORMAT),
                   seconds=meta["seconds"])

    def summary(self) -> str:
        """A few lines: parameters, error quantiles, convergence, residuals."""
        h = self.to_numpy()
        B = h.rmse.shape[0]
        rmse = h.rmse.reshape(B, -1)
        q = np.quantile(rmse, [0.1, 0.5, 0.9])
        p = self.params
        worse = int((h.residual_norm > h.residual_truth).sum())
        lines = [revision_line(p)] if revision_line(p) else []
        lines += [
            (f"Gauss-Newton attack on {counted(B, 'example')} x {counted(p.get('draws'), 'draw')} x "
             f"{counted(rmse.shape[1], str(p.get('basis')) + ' mode')} "
             f"(noise={str(p.get('noise')).split(':')[0]}, start={p.get('start')}, damping={p.get('damping')}, "
             f"steps={p.get('steps')})"),
            f"  RMS error per mode, quantiles 10/50/90%: {q[0]:.4g} / {q[1]:.4g} / {q[2]:.4g}",
            (f"  accepted steps: median {median_count(np.median(h.steps))}; "
             f"converged {int(h.converged.sum())}/{h.converged.size}; "
             f"LSQR iterations per problem: median {median_count(np.median(h.lsqr_iterations))}; "
             f"{int((h.steps == 0).sum())} never left their start"),
            (f"  final residual / |Z|: median {np.median(h.residual_norm / h.residual_truth):.4g}; "
             f"{worse} problems end with a worse fit than the truth"),
            f"  wall time {self.seconds:.2f} s",
        ]
        return "\n".join(lines)


#: What a :func:`gauss_newton_attack` checkpoint's chunk files hold (:mod:`hcrfast.checkpoint`).
CHECKPOINT_FORMAT = "hcrfast.gauss_newton_attack checkpoint/1"


def _damped_steps(model, points, rhs, lam, *, options, jacobian):
    """Solve ``min ‖J_b δ − rhs_b‖² + λ_b²‖δ‖²`` for every row b; returns ``(δ, itn, ‖J‖ estimate)``.

    At most two LSQR calls: the undamped rows (λ = 0) and the damped rows, the latter
    as one call through :class:`RowScaled`.
    """
    xp = array_module_for(points.device)
    P = points.shape[0]
    delta = xp.zeros((P, math.prod(points.shape[1:])), dtype=rhs.dtype)
    itn = xp.zeros(P, dtype=xp.int64)
    anorm = xp.zeros(P)
    lam_host = to_host(lam)  # deliberate host copy: which rows go to which solve
    for rows, damped in ((np.flatnonzero(lam_host == 0), False), (np.flatnonzero(lam_host > 0), True)):
        if rows.size == 0:
            continue
        r = xp.asarray(rows)
        op = TorchJacobian(model, points[to_torch(r).to(points.device)], mode=jacobian)
        if damped:
            scale = (1.0 / lam[r]).astype(rhs.dtype)
            res = lsqr_solve(RowScaled(op, scale), rhs[r], options, damp=1.0)
            delta[r] = scale[:, None] * res.x
            anorm[r] = res.anorm / scale.astype(xp.float64)
        else:
            res = lsqr_solve(op, rhs[r], options, damp=0.0)
            delta[r] = res.x
            anorm[r] = res.anorm
        itn[r] = res.itn
    return delta, itn, anorm


def _features(model, x: torch.Tensor):
    with torch.no_grad():
        return from_torch(model(x).reshape(x.shape[0], -1))


def _row_norms64(a, xp):
    a = a.astype(xp.float64)
    return xp.sqrt(xp.einsum("bi,bi->b", a, a))


def _gn_progress(lo: int, hi: int, total: int, steps: int, t_start: float):
    """``progress=True``: lines from inside a chunk's Gauss–Newton iterations (a chunk of the automatic
    size can take minutes)."""
    return _every(t_start, lambda j, running, rows: (
        f"hcrfast.gauss_newton_attack: {_span(lo, hi)} of {total}: Gauss-Newton step {j + 1}/{steps}, "
        f"{running} of {rows} draws running"))


def _frobenius_estimate(model, points, *, jacobian, xp):
    """Hutchinson estimate of ``‖J‖_F`` at each row of ``points`` with NORM_PROBES fixed Gaussian probes."""
    P = points.shape[0]
    p = math.prod(points.shape[1:])
    op = TorchJacobian(model, points, mode=jacobian)
    probes = np.random.default_rng(0).standard_normal((NORM_PROBES, p))  # Gaussian: J v = 0 only if J = 0
    acc = xp.zeros(P)
    dtype = from_torch(points[:1]).dtype
    for v in probes:
        jv = op.matvec(xp.broadcast_to(xp.asarray(v, dtype=dtype), (P, p)).copy())
        acc += _row_norms64(jv, xp) ** 2
    return xp.sqrt(acc / NORM_PROBES)


def _gauss_newton(model, est, X, *, input_shape, steps, damping, tol, options, jacobian, progress=None):
    """Levenberg–Marquardt for the rows of ``est`` (P, p) against observations ``X`` (P, n, float64).

    Damping per problem by levels: λ = ``damping`` at level 0, ``unit·10^level`` above it,
    with ``unit = max(damping, FIRST_DAMPING/10 · ‖J‖)`` fixed at the first rejection. A
    rejected step raises the level by one, an accepted one lowers it by one (Marquardt).
    Only the still-running problems are solved; which ones is decided on the host once
    per Gauss–Newton iteration, when ``progress(j, running, P)`` is told too.
    """
    xp = get_array_module(X)
    P = est.shape[0]
    dtype = est.dtype

    def as_input(rows):
        return to_torch(rows).reshape((rows.shape[0],) + input_shape)


    resid = X - _features(model, as_input(est)).astype(xp.float64)
    cost = _row_norms64(resid, xp)
    history = xp.empty((P, steps + 1))
    history[:, 0] = cost
    start_cost = cost.copy()
    level = xp.zeros(P, dtype=xp.int64)
    unit = xp.zeros(P)
    lam = xp.full(P, float(damping))
    running = xp.ones(P, dtype=bool)
    converged = xp.zeros(P, dtype=bool)
    accepted = xp.zeros(P, dtype=xp.int64)
    tried = xp.zeros(P, dtype=xp.int64)
    itn_total = xp.zeros(P, dtype=xp.int64)

    for j in range(steps):
        idx_host = np.flatnonzero(to_host(running))  # the deliberate host look, once per iteration
        if progress is not None:
            progress(j, idx_host.size, P)
        if idx_host.size == 0:
            history[:, j + 1:] = cost[:, None]
            break
        idx = xp.asarray(idx_host)
        delta, itn, anorm = _damped_steps(model, as_input(est[idx]), resid[idx].astype(dtype), lam[idx],
                                      options=options, jacobian=jacobian)
        cand = est[idx] + delta
        cand_resid = X[idx] - _features(model, as_input(cand)).astype(xp.float64)
        cand_cost = _row_norms64(cand_resid, xp)
        old = cost[idx]
        ok = xp.isfinite(cand_cost) & (cand_cost < old)

        est[idx] = xp.where(ok[:, None], cand, est[idx])
        resid[idx] = xp.where(ok[:, None], cand_resid, resid[idx])
        cost[idx] = xp.where(ok, cand_cost, old)
        accepted[idx] += ok
        tried[idx] += 1
        itn_total[idx] += itn

        # Damping: the first raise of a problem fixes its unit from the norm of J (at the point it stays at).
        u = unit[idx]
        first = np.flatnonzero(to_host(~ok & (u == 0)))
        if first.size:
            f = xp.asarray(first)
            fro = _frobenius_estimate(model, as_input(est[idx[f]]), jacobian=jacobian, xp=xp)
            # J v = 0 for every probe while LSQR saw J != 0 (probability 0 for Gaussian probes, but a unit of 0
            # would leave the damping at 0 for good): LSQR's estimate instead
            fro = xp.where(fro > 0, fro, anorm[f])
            u[f] = xp.maximum(float(damping), (FIRST_DAMPING / 10) * fro)
        unit[idx] = u
        lev = xp.where(ok, xp.maximum(level[idx] - 1, 0), level[idx] + 1)
        level[idx] = lev
        lam[idx] = xp.where(lev == 0, float(damping), u * 10.0 ** lev.astype(xp.float64))

        small_step = _row_norms64(delta, xp) <= tol * (_row_norms64(est[idx], xp) + tol)
        small_gain = ok & (old - cand_cost <= tol * old)
        done = small_step | small_gain | (old == 0)
        converged[idx] = done
        running[idx] = ~done & (lev <= MAX_DAMPING_LEVEL)
        history[:, j + 1] = cost
    return dict(estimates=est, residual_norm=cost, residual_start=start_cost, residual_history=history,
                steps=accepted, iterations=tried, lsqr_iterations=itn_total, converged=converged, damping=lam)


def _check_start(start, batch: torch.Tensor) -> torch.Tensor:
    """The start point of every example, shape batch.shape, from "truth", "mean" or a tensor."""
    if isinstance(start, str):
        validation.choice("start", start, ("truth", "mean"))
        if start == "truth":
            return batch
        if batch.shape[0] == 1:
            raise ValueError("start='mean' with a batch of one example starts from that example itself (the mean of "
                             "one), which is start='truth'; pass start='truth' to say so, or the data's mean as a "
                             "tensor of one example's shape (an attacker that knows the data's average)")
        return batch.mean(dim=0, keepdim=True).expand_as(batch)
    if not isinstance(start, torch.Tensor):
        raise TypeError(f"start must be 'truth', 'mean' or a torch.Tensor, got {type(start).__name__}")
    if start.dtype != batch.dtype:
        raise TypeError(f"start has dtype {start.dtype} but the batch is {batch.dtype}; use start.to({batch.dtype})")
    if start.device != batch.device:
        raise ValueError(f"start is on {start.device} but the batch is on {batch.device}; "
                         f"use start.to({str(batch.device)!r})")
    if tuple(start.shape) == tuple(batch.shape[1:]):
        start = start.unsqueeze(0).expand_as(batch)
    elif tuple(start.shape) != tuple(batch.shape):
        raise ValueError(f"Shape mismatch: start must have the batch's shape {tuple(batch.shape)} (one start per "
                         f"example) or one example's shape {tuple(batch.shape[1:])} (shared), got {tuple(start.shape)}")
    if not bool(torch.isfinite(start).all()):
        raise ValueError("start contains NaN or inf; pass finite start points")
    return start


def _noise_by_either_name(fn):
    """Let ``fn(model, batch, noise_or_sigma, ...)`` take its noise as ``sigma=`` too, the name every other
    entry point gives it (once: both at once are refused). Applied over :func:`accepts_per_feature_sigma`,
    which then finds one std per feature given as ``sigma=`` under the name it reads."""
    signature = inspect.signature(fn)
    first, rest = list(signature.parameters.values())[:3], list(signature.parameters.values())[3:]
    public = signature.replace(parameters=[*first[:2], first[2].replace(default=None),
                                           inspect.Parameter("sigma", inspect.Parameter.KEYWORD_ONLY, default=None),
                                           *rest])
    name = f"{fn.__module__.split('.')[0]}.{fn.__name__}()"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            given = public.bind(*args, **kwargs).arguments
        except TypeError as exc:  # bind's message does not say whose arguments these are
            raise TypeError(f"{name}: {exc}; its arguments are {', '.join(public.parameters)}") from None
        if "sigma" in given and "noise_or_sigma" in given:
            shown = [f"{key} {text}" if text.startswith("of dtype") else f"{key}={text}"
                     for key, text in ((key, _short_value(given[key])) for key in ("noise_or_sigma", "sigma"))]
            raise TypeError(f"{name}: the noise was given twice, {shown[0]} and {shown[1]}; pass one of them "
                            f"(sigma=, as hcrfast.bound names it)")
        if "sigma" not in given and "noise_or_sigma" not in given:
            raise TypeError(f"{name}: missing a required argument: 'sigma' (σ, one std per feature, or a noise "
                            f"law); pass sigma=... or the noise as the third argument (noise_or_sigma)")
        if "sigma" in kwargs:
            kwargs["noise_or_sigma"] = kwargs.pop("sigma")
        return fn(*args, **kwargs)

    wrapper.__signature__ = public
    return wrapper


def _float32_for_float16(model, batch: torch.Tensor):
    """:func:`hcrfast.validation.float32_for_float16` (a float16 Module and batch run as float32 copies, as in
    :func:`hcrfast.bound`: float16's range overflows LSQR's sums of squares here too), in the attack's words."""
    return validation.float32_for_float16(model, batch, copied=(
        "the model and batch are float16: gauss_newton_attack ran on a float32 copy of the model and batch "
        "(float16's range, 65504, overflows LSQR's sums of squares for features in the hundreds), so its estimates "
        "are float32 and params['dtype'] is 'float32' (its errors are float64, as always); pass model.float() and "
        "batch.float() to silence this"))


@_noise_by_either_name
@accepts_per_feature_sigma(scale_inputs=True)
def gauss_newton_attack(model, batch, noise_or_sigma, *, draws: int = 16, steps: int = 10, damping: float = 0.0,
                        start="truth", seed: int = 0, basis: str = "dct", lsqr: LSQROptions | None = None,
                        tol: float | None = None, jacobian: str = "reverse", chunk_size: int | None = None,
                        example_ids=None, progress: bool = False, checkpoint=None) -> AttackResult:
    """Reconstruct each input from noisy features by damped Gauss–Newton; report the per-mode error.

    For example θ and draw d: ``X = a(θ) + Z_d``; from ``θ̂₀`` (``start``) repeat
    ``steps`` times, for all (example, draw) problems in one batched LSQR,
    ``δ = argmin ‖J(θ̂)δ − (X − a(θ̂))‖² + λ²‖δ‖²`` and keep ``θ̂ + δ`` only if it
    lowers ``‖a(θ̂) − X‖``. A rejected step raises that problem's λ (first to
    ``max(10·damping, 1e-3·‖J‖_F)``, then ×10 each time); an accepted step lowers it
    ×10 back towards ``damping`` (Levenberg–Marquardt). A problem stops when its
    step or its relative residual decrease is ≤ ``tol``.

    Parameters
    ----------
    model : torch.nn.Module
        Input batch (B, ...) → features (B, ...); must not mix examples. Eval mode
        (a model in training mode is switched for the call, with a warning).
    batch : torch.Tensor, shape (B, ...)
        The true inputs θ, on the model's device and in its dtype (float32 or float64; a float16 Module and
        batch run as a float32 copy, with a warning, as in :func:`hcrfast.bound`; bfloat16 is refused).
    noise_or_sigma, sigma : float, array of one std per feature, or noise law
        The dithering, given once by either name: the third argument (or ``noise_or_sigma=``),
        or ``sigma=`` as :func:`hcrfast.bound` names it. σ of i.i.d. Gaussian noise, one std
        per feature (as :func:`hcrfast.bound`), or ``hcrfast.Gaussian``, ``hcrfast.Laplace``,
        ``hcrfast.MonteCarlo`` (only its ``sample`` is used).
    draws : int
        Noise draws per example (independent reconstructions).
    steps : int
        Most Gauss–Newton iterations per problem.
    damping : float
        λ ≥ 0 of the step (LSQR's ``damp``, absolute: in units of the Jacobian's
        singular values) that accepted steps return to. 0 (the default) gives pure
        Gauss–Newton steps, which on a linear model land on the least-squares
        estimator in one step; a rejected step still raises λ from ``1e-3·‖J‖_F``.
        A λ > 0 shrinks the directions whose singular values are below it towards
        the start (a ridge estimator: with ``start="truth"`` a biased one that can
        beat the bound, which :func:`compare`'s bias test cannot see at θ).
    start : {"truth", "mean"} or torch.Tensor
        ``θ̂₀``. ``"truth"``: θ itself — a *local* attacker that already knows roughly
        where θ is. It is the attacker's most favourable case (no spurious local
        minima to fall into) and the setting the local HCR bound speaks to: the
        bound concerns estimators unbiased in a neighbourhood of θ, and in the
        linear regime the one that attains it is the least-squares solution
        nearest θ, which is where Gauss–Newton from θ converges. Be aware that
        this start is information about θ: where J does not see a direction
        (a local null space, e.g. ReLUs switched off) or damping shrinks the step,
        θ̂ stays near θ there, a *biased* estimate with small error (see
        :func:`compare`). ``"mean"``: the mean of the batch (an attacker that knows
        the data's average; refused for one example, whose mean is itself). It
        depends on the whole batch: calls split over ``example_ids`` draw the same
        noise but start elsewhere; pass the mean as a tensor to start alike. A tensor: the batch's shape (one start per example)
        or one example's shape (shared), same dtype and device as ``batch``.
    seed : int
        Example e draws its noise from ``default_rng([seed, e, 1])``
        (:func:`observation_noise`): reproducible, independent of chunking.
    basis : {"dct", "pixel"}
        Q for the per-mode errors, as in :func:`hcrfast.bound`.
    lsqr : LSQROptions, optional
        Stopping rules of every step's LSQR; default :data:`ATTACK_LSQR` for the
        dtype with ``iter_lim = 4·max(n, p)``. Its ``damp`` must be 0: set ``damping``.
    tol : float, optional
        Convergence tolerance (1e-10 for float64, 1e-5 for float32 when None).
    jacobian : {"reverse", "forward", "auto"}
        How the products with J are computed (:class:`hcrfast.bindings.TorchJacobian`); "auto" is "reverse",
        as for :func:`hcrfast.targeted_bound`'s LSQR path.
    chunk_size : int, optional
        Examples per chunk (all their draws together); automatic when None. A chunk
        that runs out of memory is halved and retried.
    example_ids : sequence of int, optional
        Global indices of the examples (default 0..B−1), used only to seed their noise.
    progress : bool
        Print to stderr a line per finished chunk (examples done, elapsed seconds, ETA), and lines from
        inside a chunk's Gauss–Newton iterations, at most one every 10 s (the chunk's examples, its
        Gauss–Newton step, the draws still running): a chunk of the automatic size can run for minutes.
        Also a line where a chunk is halved for memory, and where a ``checkpoint`` gave examples back.
    checkpoint : str or os.PathLike, optional
        A folder: each finished chunk of examples is written there at once (atomically),
        and the same call made again after a crash or an interrupt reads them back and
        attacks only the missing examples (as :func:`hcrfast.bound`'s ``checkpoint``; a
        call with another model, batch, noise or arguments is refused with
        :class:`hcrfast.CheckpointMismatchError`). ``params["checkpoint"]`` says how many
        examples were read back.

    Returns
    -------
    AttackResult

    Notes
    -----
    Monte Carlo error: for an unbiased attacker with per-mode variance v,
    ``draws·rmse²/v`` is χ²(draws), so one mode's ``rmse`` has a relative spread
    of about ``1/sqrt(2·draws)`` (18% at 16 draws). :func:`compare` reports the
    band that an exactly efficient attacker would show.
    """
    t_start = time.perf_counter()
    threads = torch.get_num_threads()   # (params["run"]: the float32 solves' rounding follows it)
    noise = as_noise(validation.sigma_or_law(noise_or_sigma))
    draws = validation.positive_int("draws", draws)
    steps = validation.positive_int("steps", steps)
    if isinstance(damping, bool) or not isinstance(damping, numbers.Real):
        raise TypeError(f"damping must be a real number, got {type(damping).__name__}")
    damping = float(damping)
    if not math.isfinite(damping) or damping < 0:
        raise ValueError(f"damping must be a finite number >= 0, got {damping!r}; 0 gives pure Gauss-Newton steps")
    seed = validation.seed(seed)
    validation.choice("basis", basis, ("dct", "pixel"))
    jacobian = validation.jacobian_mode(jacobian)
    if validation.lsqr_options(lsqr) is not None:
        if lsqr.damp != 0:
            raise ValueError(f"lsqr.damp must be 0 (got {lsqr.damp!r}); the attack sets each step's damping: "
                             f"pass damping={lsqr.damp!r} instead")
    if tol is not None:
        tol = validation.positive_float("tol", tol)
    chunk_size = validation.chunk_size(chunk_size)
    checkpoint = validation.checkpoint_folder(checkpoint)
    progress = validation.flag("progress", progress)
    if callable(model) and isinstance(batch, torch.Tensor) and batch.dtype == torch.bfloat16:
        # (model_and_batch's refusal speaks of certified bounds, which the attack does not compute)
        raise TypeError("batch is torch.bfloat16, which the attack's arrays (NumPy, CuPy) cannot hold; run the "
                        "attack in float32: pass model.float() and batch.float() (float32 and float64 are the "
                        "dtypes it has default tolerances for)")
    batch = validation.model_and_batch(model, batch, basis)
    start_points = _check_start(start, batch)   # (checked as the user gave it, before any float32 copy)
    model, batch = _float32_for_float16(model, batch)
    if start_points.dtype != batch.dtype:   # the copy's start: float16 values are float32 values
        start_points = _check_start(start.float() if isinstance(start, torch.Tensor) else start, batch)
    example_ids = validation.example_ids(example_ids, batch.shape[0])
    missing = [what for what, given in (("tol=1e-3", tol), ("lsqr=hcrfast.LSQROptions(atol=1e-3, btol=1e-3)", lsqr))
               if given is None]
    if batch.dtype not in DEFAULT_TOL and missing:  # both named at once: one refusal, not two in a row
        uncopied = ("" if isinstance(model, torch.nn.Module) else
                    " (a float16 Module runs as a float32 copy by itself, but a function cannot be copied: pass a "
                    "float32 one, or make it a Module with the modules it calls as its attributes)")
        raise NotImplementedError(f"gauss_newton_attack has no default tolerances for {batch.dtype} (float32 and "
                                  f"float64 only): pass {' and '.join(missing)} (values near that dtype's "
                                  f"resolution), or run the attack in float32: model.float(), batch.float()"
                                  f"{uncopied}")
    if tol is None:
        tol = DEFAULT_TOL[batch.dtype]

    # (a call that fails before its first chunk takes back the key it wrote: the corrected call may use the folder)
    with validation.entry_point(model, batch.device), taken_back_on_failure():
        features = validation.features_of(model, batch)
        validation.check_independent(model, batch, features, mode=jacobian)
        xp = array_module_for(batch.device)
        B, n = features.shape
        input_shape = tuple(batch.shape[1:])
        p = math.prod(input_shape)
        if lsqr is None:
            options = dataclasses.replace(ATTACK_LSQR[batch.dtype], iter_lim=LSQR_ITER_FACTOR * max(n, p))
        else:
            options = lsqr
        if chunk_size is None:
            chunk_size = _auto_chunk(model, batch, draws, n, p, jacobian)

        out = dict(rmse=xp.zeros((B, p)), bias=xp.zeros((B, p)), bias_se=xp.zeros((B, p)), std=xp.zeros((B, p)),
                   mse=xp.zeros(B), estimates=xp.zeros((B, draws, p), dtype=from_torch(batch[:1]).dtype),
                   residual_norm=xp.zeros((B, draws)), residual_start=xp.zeros((B, draws)),
                   residual_truth=xp.zeros((B, draws)), residual_history=xp.zeros((B, draws, steps + 1)),
                   steps=xp.zeros((B, draws), dtype=xp.int64), iterations=xp.zeros((B, draws), dtype=xp.int64),
                   lsqr_iterations=xp.zeros((B, draws), dtype=xp.int64), converged=xp.zeros((B, draws), dtype=bool),
                   damping=xp.zeros((B, draws)))
        f_all = from_torch(features).astype(xp.float64)

        def compute(lo, hi):
            bad = _nonfinite_derivative(model, batch[lo:hi])  # no Gauss-Newton step exists there
            if bad:
                raise infinite_derivative(bad, lo)
            m = hi - lo
            Z = xp.asarray(observation_noise(example_ids[lo:hi], draws, n, seed=int(seed), noise=noise))
            X = xp.repeat(f_all[lo:hi], draws, axis=0) + Z
            est = from_torch(start_points[lo:hi].repeat_interleave(draws, dim=0).reshape(m * draws, p)).copy()
            # (a run that stalls on them is refused below; the heartbeat speaks inside a long step)
            with np.errstate(over="ignore", invalid="ignore"), _heartbeat(
                    progress, lo, hi, B, t_start, who="hcrfast.gauss_newton_attack",
                    idle="inside a Gauss-Newton step (its damped LSQR solves)"):
                return Z, _gauss_newton(model, est, X, input_shape=input_shape, steps=steps, damping=damping, tol=tol,
                                        options=options, jacobian=jacobian,
                                        progress=_gn_progress(lo, hi, B, steps, t_start) if progress else None)

        def store(lo, hi, result):
            Z, run = result
            m = hi - lo
            truth = from_torch(batch[lo:hi].reshape(m, p)).astype(xp.float64)
            err = run["estimates"].astype(xp.float64).reshape(m, draws, p) - truth[:, None, :]
            coords = err
            if basis == "dct":
                coords = kernels.dct2(err.reshape((m * draws,) + input_shape), impl=options.kernels)
                coords = coords.reshape(m, draws, p)
            out["rmse"][lo:hi] = xp.sqrt(xp.mean(coords * coords, axis=1))
            out["bias"][lo:hi] = xp.mean(coords, axis=1)
            spread = xp.std(coords, axis=1, ddof=1) if draws > 1 else xp.full((m, p), xp.nan)
            out["std"][lo:hi] = spread
            out["bias_se"][lo:hi] = spread / math.sqrt(draws)
            out["mse"][lo:hi] = xp.mean(err * err, axis=(1, 2))
            out["estimates"][lo:hi] = run["estimates"].reshape(m, draws, p)
            out["residual_truth"][lo:hi] = _row_norms64(Z, xp).reshape(m, draws)
            for key in ("residual_norm", "residual_start", "steps", "iterations", "lsqr_iterations", "converged",
                        "damping"):
                out[key][lo:hi] = run[key].reshape(m, draws)
            out["residual_history"][lo:hi] = run["residual_history"].reshape(m, draws, steps + 1)
            if saved is not None:
                saved.save(lo, hi, **{k: to_host(a[lo:hi]) for k, a in out.items()})
            done[0] += hi - lo
            if progress:
                _progress_line("hcrfast.gauss_newton_attack", f"examples {B - to_compute + done[0]}/{B}", t_start, eta,
                               done[0], to_compute)

        def on_halve(chunk):
            if saved is not None:   # the chunks from here on are of this size: theirs to record
                saved.chunk_size = chunk
            if progress:
                validation.say(f"hcrfast.gauss_newton_attack: out of memory, chunk halved to {chunk} examples")

        todo, saved = [(0, B)], None
        if checkpoint is not None:
            saved = Checkpoint(checkpoint, dict(
                format=CHECKPOINT_FORMAT, model=key_model_fingerprint(model), example_ids=sha256_tensors(example_ids),
                batch=key_batch_fingerprint(model, batch),
                noise=repr(noise), draws=draws, steps=steps, damping=damping, seed=int(seed), basis=basis,
                start=start if isinstance(start, str) else f"tensor sha256:{sha256_tensors(start_points)}",
                tol=tol, lsqr=dataclasses.asdict(options), jacobian=jacobian), example_ids,
                features.detach().cpu().numpy(), arithmetic_of(batch.device), chunk_size=chunk_size,
                required=tuple(out))
            finished = saved.finished()
            for lo, hi, arrays in finished:
                for k, a in out.items():
                    a[lo:hi] = xp.asarray(arrays[k])
            todo = gaps(B, finished)
            if todo:
                saved.check_writable()
        to_compute, done, eta = sum(hi - lo for lo, hi in todo), [0], _Eta(time.perf_counter())
        if progress and to_compute < B:
            validation.say(f"hcrfast.gauss_newton_attack: {B - to_compute} of {B} examples read back from {checkpoint}")
        for lo, hi in todo:
            chunk_size = _in_chunks(hi - lo, chunk_size, lambda a, b, lo=lo: compute(lo + a, lo + b), batch.device,
                                    store=lambda a, b, r, lo=lo: store(lo + a, lo + b, r), on_halve=on_halve)
        if saved is not None:
            saved.tidy()
            saved.warn_mixed(RESUME_BITWISE)

    # A draw that took no step (a zero step counts as converged) kept its start point: if all did, the
    # errors are those of the starts (0 from the truth) and say nothing about an attacker.
    stalled, finite = (int(v) for v in to_host(xp.stack([
        (out["steps"] == 0).sum(), xp.isfinite(out["rmse"]).all().astype(xp.int64)])))
    law = noise.describe().split(':')[0]
    if not finite:
        # (StepsOutOfRange: on a batch divided by a power of two the attack runs again on it as it is, where its
        # errors, the inputs' inverse scale there, can overflow: inputs of 1e-160, σ = 1, a linear model)
        raise validation.StepsOutOfRange(
                         f"gauss_newton_attack's errors overflowed (inf or NaN) with {law}: the observations are "
                         f"beyond what the {validation.dtype_name(batch.dtype)} model resolves; pass a sigma nearer "
                         f"the features' scale (hcrfast.rms_sigma(features, scale))"
                         + (", or a float64 model and batch" if batch.dtype != torch.float64 else ""))
    if stalled == B * draws:
        from hcrfast.algorithm import _features_move

        with validation.entry_point(model, batch.device):  # eval mode, as the attack ran
            blind = not _features_move(model, batch).any()
        if blind:
            raise ValueError("gauss_newton_attack took no step: the model's features do not move with its input "
                             "(J = 0 at every example), so no estimator can leave its start; the bounds are 0 "
                             "there too, and hcrfast.targeted_bound(..., null_probes=True) certifies +inf")
        from hcrfast.algorithm import rms_sigma

        # in the model's units where the call runs on its features divided by sigma (noise.ScaledGaussian)
        unit = noise.scale if isinstance(noise, ScaledGaussian) else 1.0
        try:   # (its squares scaled first where they under- or overflow: features of 1e-30 read RMS 0 before)
            rms = f"{rms_sigma(to_host(f_all), unit):.3g}"
        except ValueError:   # every feature 0
            rms = "0"
        raise ValueError(f"gauss_newton_attack took no step at any of its {B * draws} draws ({law} against "
                         f"features of RMS {rms}): no damped "
                         f"Gauss-Newton step lowered a residual in steps={steps}, so each estimate is its start "
                         f"point and its error says nothing about an attacker. A rejected step raises the damping "
                         f"for the next one, so more steps (steps={max(4 * steps, 10)}) may find one; a sigma far "
                         f"from the features' scale (hcrfast.rms_sigma(features, scale)) is the other cause")
    for key in ("rmse", "bias", "bias_se", "std"):
        out[key] = out[key].reshape((B,) + input_shape)
    out["estimates"] = out["estimates"].reshape((B, draws) + input_shape)
    params = dict(sigma=noise.sigma if isinstance(noise, Gaussian) else None, noise=noise.describe(), draws=draws,
                  steps=steps, damping=damping, start=start if isinstance(start, str) else "tensor",
                  seed=int(seed), noise_stream=f"default_rng([seed, e, {NOISE_STREAM}])", basis=basis, tol=tol,
                  lsqr=dataclasses.asdict(options), jacobian=jacobian, dtype=validation.dtype_name(batch.dtype),
                  device=str(batch.device), n_features=n, n_inputs=p,
                  checkpoint=None if saved is None else dict(path=str(saved.path), examples_read_back=B - to_compute,
                                                             arithmetic=sorted(saved.arithmetics)),
                  run=run_record(example_ids, chunk_size, threads))   # recorded, not compared (same_result)
    return AttackResult(**out, params=params, seconds=time.perf_counter() - t_start)


#: How an unnamed MonteCarlo law describes itself: two of them may be different densities.
_UNNAMED_LAW = "MonteCarlo(custom density)"


def _noise_law(text):
    """The noise law a description names: a Monte Carlo law by its name alone (the attack only samples from
    it; its confidence and draws are the bound's estimate of D), any other law by its whole description."""
    if isinstance(text, str) and text.startswith("MonteCarlo("):
        return text.split("):")[0] + ")"
    return text


def _real_host_array(values) -> np.ndarray | None:
    """``values`` as a NumPy array of real numbers (host copy), or None where they are not that (strings,
    booleans, ragged or nested lists of other things)."""
    try:
        arr = to_host(values)
    except (TypeError, ValueError):   # a ragged list
        return None
    return arr if arr.dtype.kind in "iuf" else None


def _short_value(value) -> str:
    """``value`` for a message: an array by its dtype and shape, anything else by its repr, cut short."""
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"of dtype {value.dtype} and shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _quantile_levels(quantiles) -> list[float]:
    """compare's quantile levels: one real number or a flat sequence of them (range checked by the caller)."""
    single = isinstance(quantiles, numbers.Real) or (isinstance(quantiles, (np.ndarray, torch.Tensor))
                                                     and quantiles.ndim == 0)
    items = [quantiles] if single else quantiles
    try:
        items = None if isinstance(items, (str, bytes)) else list(items)
    except TypeError:   # not iterable (None, an object)
        items = None
    if items is not None:
        items = [q.item() if isinstance(q, (np.ndarray, torch.Tensor)) and q.ndim == 0 else q for q in items]
    if items is None or any(isinstance(q, (bool, np.bool_)) or not isinstance(q, numbers.Real) for q in items):
        raise TypeError(f"quantiles must be quantile levels in [0, 1]: a number or a flat sequence of numbers, "
                        f"got {type(quantiles).__name__} {_short_value(quantiles)}; pass e.g. "
                        f"quantiles=(0.05, 0.5, 0.95)")
    return [float(q) for q in items]


def compare(bounds, attack: AttackResult, *, quantiles=(0.05, 0.25, 0.5, 0.75, 0.95)) -> dict:
    """Over all (example, mode) pairs: the distribution of ``attack.rmse / bound``.

    The HCR bound limits the variance of *unbiased* estimators, so for an attacker
    that is (approximately) unbiased the ratio should be ≥ 1 up to Monte Carlo error
    (``mc_band``: the central 90% range of the ratio for an exactly efficient,
    unbiased attacker and an exact bound, ``sqrt(χ²_draws/draws)``). A **biased**
    attacker can beat the bound: one with a prior, one with heavy damping, or one
    started at the truth (``start="truth"``) in directions the features do not
    reveal — it keeps the start there. A ratio < 1 then contradicts nothing; check
    ``significant_bias`` and ``std_ratio_median`` (the empirical spread over the
    bound, which ignores the bias).

    Being unbiased *at θ* is not enough: the bound is for estimators unbiased in a
    neighbourhood of θ. An estimator whose mean error at θ is ~0 but whose mean
    moves with θ at a slope ≠ 1 (``E θ̂ = θ + b(θ)``, ``b' ≠ 0``: shrinkage, or the
    kinks and saturation of ReLU/tanh features once the noise is as large as the
    features) obeys only the biased-estimator bound ``(1 + b')²·bound²`` and can
    have a ratio well below 1 with ``significant_bias`` ≈ 0. The ratio ≈ 1 of an
    efficient attacker is reached in the locally linear regime (small σ).

    Parameters
    ----------
    bounds : Bounds, TargetedBounds or array
        Per-mode std bounds, shape = ``attack.rmse.shape``, same basis: a Bounds' ``.std``; a
        TargetedBounds' ``.std_every_mode`` (every mode's best bound from all the targeted steps,
        what ``bound(targets=)`` takes; its ``.std`` is 0 for the modes not targeted, which would
        count as vacuous bounds); or the array itself. Bounds made at another noise law or σ, or
        with a model of another number of features or inputs, are refused (their ``params`` say
        so; that the batch is the same is the caller's to ensure).
    attack : AttackResult
    quantiles : sequence of float
        Quantile levels of the ratio to report.

    Returns
    -------
    dict
        ``median``, ``quantiles`` ({level: value}), ``min``, ``max``,
        ``fraction_below_1`` of the ratio over the pairs with a finite, positive
        bound (``n_compared`` of ``n_modes``); ``n_bound_infinite`` (bound +inf: no
        unbiased estimator exists there, left out), ``n_bound_zero`` (vacuous bound,
        left out); ``std_ratio_median``; ``significant_bias`` (fraction of compared
        pairs with ``|bias| > 3·bias_se``); ``mc_band``; ``fraction_below_1_efficient`` (what an
        exactly efficient unbiased attacker would show against an exact bound: P(χ²_draws < draws), 0.683
        at one draw); ``draws``; ``n_draws_unmoved``
        (draws with no accepted step: their estimate is their start, warned about);
        ``fraction_converged``; ``mse_ratio_median``: the median over examples of the attack's
        ``mse`` over the bound's ``(1/p) Σ_k std_k²`` (:attr:`Bounds.mse_from_modes`), over the
        examples where that is finite and positive.
    """
    if not isinstance(attack, AttackResult):
        raise TypeError(f"attack must be an hcrfast.attack.AttackResult, got {type(attack).__name__}")
    from hcrfast.targeted import TargetedBounds

    name = "bounds.std"
    if isinstance(bounds, TargetedBounds):  # .std holds 0 for the modes not targeted, which bound nothing
        name = "bounds.std_every_mode"
        std = (bounds.std_every_mode if bounds.std_every_mode is not None
               else bounds.with_every_mode().std_every_mode)
    else:
        std = bounds.std if hasattr(bounds, "std") and not callable(bounds.std) else bounds  # arrays have .std()
    if isinstance(std, torch.Tensor):
        std = std.detach().cpu().numpy()
    std = None if isinstance(std, (str, bytes)) or std is None else _real_host_array(std)
    if std is None:   # (np.asarray would read a string as one value, or fail naming no argument)
        raise TypeError(f"bounds must be an hcrfast.Bounds, hcrfast.TargetedBounds or an array of per-mode std "
                        f"bounds, got {type(bounds).__name__} {_short_value(bounds)}; pass the result of "
                        f"hcrfast.bound or hcrfast.targeted_bound on the attacked batch")
    std = std.astype(np.float64)
    att = attack.to_numpy()
    if std.shape != att.rmse.shape:
        raise ValueError(f"Shape mismatch: {name} has shape {std.shape} but attack.rmse has {att.rmse.shape}; "
                         f"compute both on the same batch")
    b_params = getattr(bounds, "params", None) or {}
    bound_basis = b_params.get("basis")
    if bound_basis is not None and bound_basis != attack.params.get("basis"):
        raise ValueError(f"the bounds are in the {bound_basis!r} basis but the attack in {attack.params.get('basis')!r}; "
                         f"pass the same basis= to both")
    # The law the bound was asked for (a Monte Carlo law's confidence is raised per restart inside it);
    # older results: their noise, or their sigma alone.
    bound_noise = (b_params.get("noise_asked") or b_params.get("noise")
                   or (Gaussian(b_params["sigma"]).describe() if b_params.get("sigma") else None))
    attack_noise = attack.params.get("noise")
    if bound_noise is not None and _noise_law(bound_noise) != _noise_law(attack_noise):
        raise ValueError(f"the bounds are for other noise than the attack: {bound_noise!r} against "
                         f"{attack_noise!r}; compute both with the same sigma or noise law")
    b_sigma, a_sigma = b_params.get("sigma"), attack.params.get("sigma")
    if isinstance(b_sigma, (int, float)) and isinstance(a_sigma, (int, float)) and b_sigma != a_sigma:
        # (describe() prints 6 digits: this is the full comparison)
        raise ValueError(f"the bounds are for sigma = {b_sigma!r} but the attack for sigma = {a_sigma!r}; "
                         f"compute both with the same sigma")
    if bound_noise is not None and _noise_law(bound_noise) == _UNNAMED_LAW:
        validation.warn(f"the bounds and the attack both use an unnamed Monte Carlo density ({_UNNAMED_LAW}): "
                        f"hcrfast cannot tell whether they are the same law; give each hcrfast.MonteCarlo(..., "
                        f"name=...) a name that says which (hcrfast.MonteCarlo.from_scipy names scipy's laws with "
                        f"their parameters)")
    for k, what in (("n_features", "features"), ("n_inputs", "input values")):
        if k in b_params and k in attack.params and b_params[k] != attack.params[k]:
            raise ValueError(f"the bounds were computed with {b_params[k]} {what} per example, the attack with "
                             f"{attack.params[k]}: not the same model; compute both with one model and batch")
    levels = _quantile_levels(quantiles)
    if any(not 0 <= q <= 1 for q in levels):
        raise ValueError(f"quantiles must lie in [0, 1], got {tuple(levels)}")
    if np.any(std < 0) or np.any(np.isnan(std)):
        raise ValueError(f"{name} contains negative or NaN values; pass the std of an hcrfast bound")

    infinite = np.isinf(std)
    zero = std == 0
    keep = ~infinite & ~zero & ~np.isnan(att.rmse)
    ratio = att.rmse[keep] / std[keep]
    std_ratio = att.std[keep] / std[keep]
    biased = np.abs(att.bias[keep]) > 3 * att.bias_se[keep]
    draws = int(attack.params.get("draws", att.estimates.shape[1]))
    still = np.asarray(att.steps) == 0
    unmoved, total = int(still.sum()), int(still.size)
    if unmoved:
        running = int((still & ~np.asarray(att.converged)).sum())  # stopped by the step cap, not converged
        validation.warn(f"{unmoved} of {total} attack draws never left their start (no accepted Gauss-Newton step): "
                        f"their estimate is the start point (with start='truth' an error of exactly 0), so the ratios "
                        f"understate the attacker's error and 'fraction_below_1' is not evidence of beating the bound"
                        + (f"; {running} of them had not converged: rerun the attack with more steps "
                           f"(steps={2 * int(attack.params.get('steps', 10))})" if running else ""))
    stopped = int((~np.asarray(att.converged) & ~still).sum())   # moved, then stopped by the step cap
    if stopped > (total - unmoved) / 2:
        from_truth = attack.params.get("start") == "truth"
        validation.warn(f"{stopped} of {total} attack draws had not converged when their {attack.params.get('steps')} "
                        f"Gauss-Newton steps ran out: their estimates stop short of where the attack goes"
                        + (" (from start='truth', near the truth: the ratios understate the attacker's error, and "
                           "'fraction_below_1' is no evidence of beating the bound)" if from_truth else "")
                        + f"; rerun the attack with more steps (steps={2 * int(attack.params.get('steps', 10))})")
    from scipy.stats import chi2

    band = (math.sqrt(chi2.ppf(0.05, draws) / draws), math.sqrt(chi2.ppf(0.95, draws) / draws))
    empty = ratio.size == 0
    mse_bound = mse_from_modes(std)
    has_mse = np.isfinite(mse_bound) & (mse_bound > 0)
    return {
        "median": float("nan") if empty else float(np.median(ratio)),
        "quantiles": {q: (float("nan") if empty else float(np.quantile(ratio, q))) for q in levels},
        "min": float("nan") if empty else float(ratio.min()),
        "max": float("nan") if empty else float(ratio.max()),
        "fraction_below_1": float("nan") if empty else float(np.mean(ratio < 1)),
        # what an exactly efficient unbiased attacker against an exact bound would show: P(χ²_draws < draws),
        # over one half (0.683 at one draw), so a share below 1 is no sign of beating the bound by itself
        "fraction_below_1_efficient": float(chi2.cdf(draws, draws)),
        "std_ratio_median": float("nan") if empty or draws < 2 else float(np.median(std_ratio)),
        "significant_bias": float("nan") if empty or draws < 2 else float(np.mean(biased)),
        "mc_band": band,
        "n_modes": int(std.size),
        "n_compared": int(ratio.size),
        "n_bound_infinite": int(infinite.sum()),
        "n_bound_zero": int(zero.sum()),
        "draws": draws,
        "n_draws_unmoved": unmoved,
        "fraction_converged": float(np.mean(att.converged)),
        "mse_ratio_median": float(np.median(att.mse[has_mse] / mse_bound[has_mse])) if has_mse.any() else float("nan"),
    }
