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

__all__ = ["DITHER_STREAM", "Utility", "accuracy_on_features", "dithered_accuracy"]

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
    from hcrfast import validation

    with torch.no_grad(), validation.eval_mode(model):
        feats = validation.features_of(model, batch, flat=False)
    return accuracy_on_features(head, feats, labels, sigma, draws=draws, seed=seed)


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
    return Utility(clean=clean / B, dithered=float(per_draw.mean()), per_draw=per_draw,
                   stderr=float(per_draw.std(ddof=1) / np.sqrt(draws)) if draws > 1 else 0.0,
                   draws=int(draws), examples=B, seed=int(seed), sigma=float(profile) if scalar else None,
                   sigma_rms=float(np.sqrt(np.mean(profile ** 2))))


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
