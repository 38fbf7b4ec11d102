"""What the noise costs: the accuracy of a head on the dithered features, beside the bounds.

A noise level is a trade: larger σ lifts the HCR bounds (the confidentiality) and lowers what the
released features are good for. :func:`dithered_accuracy` measures the second half, for the common
case of features that feed a classifier: ``head(model(x) + Z)`` against the labels, over several
draws of ``Z ~ N(0, σ²)`` per input (one σ, or one std per feature).

Example e draws its noise from ``numpy.random.default_rng([seed, e, DITHER_STREAM])``, as
``hcrfast reproduce`` draws its dithering: the same seed gives the same draws there and here,
on the CPU and on a GPU alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["AccuracySearch", "DITHER_STREAM", "Utility", "accuracy_on_features", "dithered_accuracy",
           "sigma_for_accuracy"]

# Tags the dithering noise stream of example e, default_rng([seed, e, DITHER_STREAM]): "dith".
DITHER_STREAM = 0x64697468

# Noisy copies per head call, in feature entries: bounds the memory of one batch of draws.
_CHUNK_ENTRIES = 1 << 24


@dataclass(frozen=True)
class Utility:
    """The accuracy of a head on clean and on dithered features (:func:`dithered_accuracy`).

    Attributes
    ----------
    clean : float
        The share of inputs whose clean features the head classifies right.
    dithered : float
        The same with noise, averaged over the draws (each input's ``draws`` noisy copies).
    per_draw : numpy.ndarray
        (draws,): the accuracy of the d-th noisy copy of every input.
    stderr : float
        The standard error of :attr:`dithered` over the draws (0 for one draw).
    draws, examples, seed : int
    sigma : float or None
        The noise's std; None where one std per feature (then :attr:`sigma_rms` is their RMS).
    sigma_rms : float
    """

    clean: float
    dithered: float
    per_draw: np.ndarray = field(repr=False)
    stderr: float
    draws: int
    examples: int
    seed: int
    sigma: float | None
    sigma_rms: float

    def summary(self) -> str:
        noise = (f"sigma {self.sigma:.6g}" if self.sigma is not None
                 else f"one std per feature (RMS {self.sigma_rms:.6g})")
        return (f"accuracy of the head on {self.examples} inputs: clean {self.clean:.4f}, dithered ({noise}, "
                f"{self.draws} draws each) {self.dithered:.4f} ± {self.stderr:.4f}")

    def to_dict(self) -> dict:
        return {"clean": self.clean, "dithered": self.dithered, "stderr": self.stderr,
                "per_draw": self.per_draw.tolist(), "draws": self.draws, "examples": self.examples,
                "seed": self.seed, "sigma": self.sigma, "sigma_rms": self.sigma_rms,
                "noise_stream": f"default_rng([seed, example, {DITHER_STREAM:#x}])"}


def dithered_accuracy(model, head, batch: torch.Tensor, labels, sigma, *, draws: int = 10,
                      seed: int = 0) -> Utility:
    """The accuracy of ``head`` on ``model(batch)``, clean and with ``draws`` noise draws per input.

    Parameters
    ----------
    model : torch.nn.Module
        The feature extractor whose outputs are released (as for :func:`hcrfast.bound`).
    head : torch.nn.Module
        Takes the features as ``model`` returns them, (B, ...), and returns class scores (B, C); its
        argmax over the classes is the prediction.
    batch : torch.Tensor
        The inputs, (B, ...).
    labels : torch.Tensor or numpy.ndarray
        (B,) integer classes in [0, C).
    sigma : float or array
        The std of the Gaussian noise added to every feature, or one std per feature (the features'
        shape, or flat).
    draws : int
        Noisy copies per input (default 10).
    seed : int
        Example e draws from ``default_rng([seed, e, DITHER_STREAM])``.
    """
    return accuracy_on_features(head, _features(model, batch), labels, sigma, draws=draws, seed=seed)


def _features(model, batch: torch.Tensor) -> torch.Tensor:
    """The model's checked features of ``batch``, in its own shape, the model in eval mode."""
    from hcrfast import validation

    with torch.no_grad(), validation.eval_mode(model):
        return validation.features_of(model, batch, flat=False)


def accuracy_on_features(head, feats: torch.Tensor, labels, sigma, *, draws: int = 10, seed: int = 0) -> Utility:
    """:func:`dithered_accuracy` on features already computed, ``feats`` (B, ...)."""
    from hcrfast import validation

    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise ValueError(f"draws={draws!r}: pass a positive integer (noisy copies per input)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: pass an integer >= 0")
    if not isinstance(head, torch.nn.Module):
        raise TypeError(f"head={type(head).__name__}: pass the torch.nn.Module that classifies the features")
    B, shape = feats.shape[0], tuple(feats.shape[1:])
    n = int(np.prod(shape))
    profile = _profile(sigma, n, shape)
    labels = _labels(labels, B)
    with torch.no_grad(), validation.eval_mode(head, "head"):
        try:
            scores = _scores(head, feats)
        except (RuntimeError, TypeError) as exc:
            if isinstance(exc, torch.OutOfMemoryError):
                raise
            raise ValueError(f"the head failed on the features, shape {tuple(feats.shape)} "
                             f"({str(exc).splitlines()[0][:200]}): pass a head that takes the features as the model "
                             f"returns them") from exc
        classes = scores.shape[1]
        if labels.max() >= classes:
            raise ValueError(f"labels hold class {int(labels.max())}, but the head scores {classes} classes (0.."
                             f"{classes - 1}): pass the labels the head was trained on")
        want = torch.as_tensor(labels, device=feats.device)
        clean = int((scores.argmax(dim=1) == want).sum())
        correct = np.zeros(draws, dtype=np.int64)
        flat = profile.reshape(-1)  # one std, or one per feature in the features' order
        step = max(1, _CHUNK_ENTRIES // max(1, draws * n))
        for lo in range(0, B, step):
            hi = min(B, lo + step)
            # float64 draws times the stds, then the features' dtype (as reproduce has always drawn them)
            z = np.stack([flat * np.random.default_rng([seed, e, DITHER_STREAM]).standard_normal((draws, n))
                          for e in range(lo, hi)])                      # (examples, draws, n)
            noise = torch.as_tensor(z.reshape((-1,) + shape), dtype=feats.dtype, device=feats.device)
            noisy = feats[lo:hi].repeat_interleave(draws, dim=0) + noise
            hits = _scores(head, noisy).argmax(dim=1) == want[lo:hi].repeat_interleave(draws)
            correct += hits.reshape(hi - lo, draws).sum(dim=0).cpu().numpy()
    per_draw = correct / B
    scalar = profile.size == 1
    # the share of all B x draws copies classified right, an exact ratio of counts (so that a target met
    # exactly, 0.8 = 200 / 250, compares as met)
    return Utility(clean=clean / B, dithered=int(correct.sum()) / (B * draws), per_draw=per_draw,
                   stderr=float(per_draw.std(ddof=1) / np.sqrt(draws)) if draws > 1 else 0.0,
                   draws=int(draws), examples=B, seed=int(seed), sigma=float(profile) if scalar else None,
                   sigma_rms=float(np.sqrt(np.mean(profile ** 2))))


@dataclass(frozen=True)
class AccuracySearch:
    """The result of :func:`sigma_for_accuracy`: the largest noise found that keeps the accuracy.

    Attributes
    ----------
    sigma : float or numpy.ndarray
        ``scale × sigma0``: the largest σ tried whose measured dithered accuracy met the target.
    scale : float
        σ in units of :attr:`sigma0`.
    sigma0 : float or numpy.ndarray
        The unit (one std per feature where a profile).
    target : float
        The accuracy asked for.
    utility : Utility
        The head's accuracy at :attr:`sigma` (clean, dithered ± standard error).
    above_scale : float or None
        The smallest scale tried above :attr:`scale` (its dithered accuracy fell under the target); None
        where no σ up to :data:`MAX_SCALE` × sigma0 did.
    above : Utility or None
        The head's accuracy there.
    history : list of dict
        Every σ tried: ``scale``, ``dithered``, ``stderr``.
    note : str
        Why the search ended.
    """

    sigma: object
    scale: float
    sigma0: object
    target: float
    utility: Utility
    above_scale: float | None
    above: Utility | None
    history: list = field(repr=False)
    note: str

    def summary(self) -> str:
        unit = "" if np.ndim(self.sigma0) == 0 else " (RMS of the stds)"
        sig = self.sigma if np.ndim(self.sigma) == 0 else float(np.sqrt(np.mean(np.square(self.sigma))))
        above = ("" if self.above is None else
                 f"; at {self.above_scale:.6g} x sigma0 it is {self.above.dithered:.4f}")
        return (f"the largest sigma found keeping the head's dithered accuracy >= {self.target:g}: "
                f"{self.scale:.6g} x sigma0 = {sig:.6g}{unit}, accuracy {self.utility.dithered:.4f} ± "
                f"{self.utility.stderr:.4f} (clean {self.utility.clean:.4f}){above}; {len(self.history)} sigmas "
                f"tried ({self.note})")


#: The largest σ, in units of sigma0, :func:`sigma_for_accuracy` tries.
MAX_SCALE = 2.0 ** 40


def sigma_for_accuracy(model, head, batch: torch.Tensor, labels, accuracy: float, *, sigma0=None,
                       draws: int = 10, seed: int = 0, rtol: float = 0.01) -> AccuracySearch:
    """The largest σ = scale × ``sigma0`` at which ``head``'s accuracy on the dithered features stays
    at least ``accuracy``: the most noise, and so the largest HCR bounds, a utility target allows.

    The model runs once; every σ tried is ``draws`` noisy copies of every input's features through the
    head (:func:`accuracy_on_features`, the same draws at every σ, scaled). The search doubles or halves
    σ until the accuracy crosses the target, then bisects (in log σ) until the two σ either side are
    within a factor ``1 + rtol``. The accuracy is measured on these inputs and draws, not guaranteed
    elsewhere; with the draws fixed it is a step function of σ, falling as σ grows but not always
    strictly, so the σ returned is the lower end of a crossing the search found. Bound the inputs at
    :attr:`AccuracySearch.sigma` (:func:`hcrfast.bound`) for the confidentiality it buys.

    Parameters
    ----------
    model, head, batch, labels, draws, seed :
        As for :func:`dithered_accuracy`.
    accuracy : float
        The dithered accuracy to keep, in (0, 1]; at most the clean accuracy.
    sigma0 : float or array, optional
        The unit and first σ tried. Default: the RMS of the clean features over the batch.
    rtol : float
        The relative width of the final bracket (default 0.01).
    """
    from hcrfast.algorithm import rms_sigma

    if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float, np.floating, np.integer)) or not (
            0 < accuracy <= 1):
        raise ValueError(f"accuracy={accuracy!r}: pass the dithered accuracy to keep, a number in (0, 1]")
    if not (isinstance(rtol, (int, float, np.floating)) and np.isfinite(rtol) and rtol > 0):
        raise ValueError(f"rtol={rtol!r}: pass a positive number (the bracket's relative width)")
    feats = _features(model, batch)
    if sigma0 is None:
        sigma0 = rms_sigma(feats.reshape(feats.shape[0], -1), 1.0)
    unit = _profile(sigma0, int(np.prod(feats.shape[1:])), tuple(feats.shape[1:]))
    if not np.all(unit > 0):
        raise ValueError("sigma0 must be positive: it is the unit of the search")
    history = []

    def at(k: float) -> Utility:
        u = accuracy_on_features(head, feats, labels, k * unit, draws=draws, seed=seed)
        history.append({"scale": k, "dithered": u.dithered, "stderr": u.stderr})
        return u

    k, u = 1.0, at(1.0)
    clean = u.clean  # (every call measures it; the first says whether any sigma can keep the target)
    if clean < accuracy:
        raise ValueError(f"accuracy={accuracy:g}: the head's clean accuracy on these inputs is {clean:.4f}, under the "
                         f"target: no noise keeps it; pass a target of at most {clean:.4f}")
    lo = hi = None  # (scale, Utility): meets the target, falls under it
    if u.dithered >= accuracy:
        lo = (k, u)
        while hi is None and k < MAX_SCALE:
            k *= 2.0
            u = at(k)
            if u.dithered >= accuracy:
                lo = (k, u)
            else:
                hi = (k, u)
    else:
        hi = (k, u)
        while lo is None:
            k /= 2.0
            u = at(k)
            if u.dithered >= accuracy:
                lo = (k, u)
            else:
                hi = (k, u)
            if k < 1.0 / MAX_SCALE and lo is None:  # (the clean accuracy meets it: sigma -> 0 must)
                raise RuntimeError(f"the dithered accuracy stays under {accuracy:g} down to sigma = {k:g} x sigma0 "
                                   f"although the clean accuracy is {clean:.4f}; the head's scores are unstable")
    if hi is None:
        return AccuracySearch(sigma=_scaled(lo[0], unit), scale=lo[0], sigma0=_unit(unit), target=float(accuracy),
                              utility=lo[1], above_scale=None, above=None, history=history,
                              note=f"the accuracy met the target up to {MAX_SCALE:g} x sigma0: the head barely "
                                   f"looks at these features")
    while hi[0] > lo[0] * (1.0 + rtol):
        k = float(np.sqrt(lo[0] * hi[0]))
        u = at(k)
        if u.dithered >= accuracy:
            lo = (k, u)
        else:
            hi = (k, u)
    return AccuracySearch(sigma=_scaled(lo[0], unit), scale=lo[0], sigma0=_unit(unit), target=float(accuracy),
                          utility=lo[1], above_scale=hi[0], above=hi[1], history=history,
                          note=f"bracketed within rtol={rtol:g}")


def _unit(unit: np.ndarray):
    return float(unit) if unit.size == 1 else unit


def _scaled(k: float, unit: np.ndarray):
    return float(k * unit) if unit.size == 1 else k * unit


def _profile(sigma, n: int, shape: tuple) -> np.ndarray:
    if hasattr(sigma, "detach"):
        sigma = sigma.detach().cpu().numpy()
    try:
        profile = np.asarray(sigma, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"sigma={sigma!r}: pass the noise's std, a float or one per feature") from None
    if profile.size != 1 and profile.size != n:
        raise ValueError(f"sigma has {profile.size} entries, shape {profile.shape}; the model returns {n} features "
                         f"of shape {shape}: pass one std, or one per feature")
    if not (np.all(np.isfinite(profile)) and np.all(profile >= 0)):
        raise ValueError("sigma must be finite and >= 0" + (f", got {float(profile):g}" if profile.size == 1 else
                                                           f"; {int(np.sum(~(profile >= 0)))} entries are not"))
    return profile.reshape(()) if profile.size == 1 else profile.reshape(shape)


def _labels(labels, B: int) -> np.ndarray:
    if hasattr(labels, "detach"):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu" and not (labels.dtype.kind == "f" and np.all(labels == np.round(labels))):
        raise ValueError(f"labels are {labels.dtype}; pass integer classes, one per input")
    if labels.shape != (B,):
        raise ValueError(f"labels have shape {labels.shape}; pass one class per input, shape ({B},)")
    labels = labels.astype(np.int64)
    if labels.min() < 0:
        raise ValueError(f"labels hold {int(labels.min())}; classes are 0, 1, ...")
    return labels


def _scores(head, feats: torch.Tensor) -> torch.Tensor:
    out = head(feats)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != feats.shape[0]:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the head returned {got} for {feats.shape[0]} feature vectors; it must return class "
                         f"scores of shape (B, classes)")
    if out.shape[1] < 2:
        raise ValueError(f"the head scores {out.shape[1]} class; accuracy needs at least 2 (argmax over classes)")
    return out
