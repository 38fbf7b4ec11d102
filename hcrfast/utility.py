"""What the noise costs: the accuracy of a head on the dithered features, beside the bounds.

A noise level is a trade: larger σ lifts the HCR bounds (the confidentiality) and lowers what the
released features are good for. :func:`dithered_accuracy` measures the second half: ``head(model(x) + Z)``
over several draws of ``Z ~ N(0, σ²)`` per input (one σ, or one std per feature), scored by a metric:

- ``"accuracy"`` (the default): the head classifies the features; the share of noisy copies whose
  top class is the input's label. ``"top5"`` (any ``"topK"``): the label is among the K best classes.
- ``"cosine"``: no labels; the cosine similarity of each noisy copy's output with the clean one's,
  for embeddings released as they are (``head=None``) or through a projection.
- a callable ``metric(outputs, targets)``: a score per noisy copy, higher is better (a negative
  squared error for a regression head, say); ``targets`` holds each copy's rows of the labels given.

With ``head=None`` the metric sees the features themselves (noisy logits, or the embedding).

Example e draws its noise from ``numpy.random.default_rng([seed, e, DITHER_STREAM])``, as
``hcrfast reproduce`` draws its dithering: the same seed gives the same draws there and here,
on the CPU and on a GPU alike. e is the input's row in the batch, or its global index given in
``example_ids`` (as :func:`hcrfast.bound` takes them): a slice of a batch with its rows' indices
draws what the whole batch draws for those rows.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from hcrfast.backend import host_argument
from hcrfast.results import counted, describe_ids, same_result
from hcrfast.validation import HcrfastRuntimeWarning

__all__ = ["AccuracySearch", "DITHER_STREAM", "Utility", "accuracy_on_features", "dithered_accuracy",
           "sigma_for_accuracy"]

# Tags the dithering noise stream of example e, default_rng([seed, e, DITHER_STREAM]): "dith".
DITHER_STREAM = 0x64697468

# Noisy copies per head call, in feature entries: bounds the memory of one batch of draws.
_CHUNK_ENTRIES = 1 << 24


@dataclass(frozen=True)
class Utility:
    """What a head's metric gives on clean and on dithered features (:func:`dithered_accuracy`).

    Attributes
    ----------
    clean : float
        The metric on the clean features, averaged over the inputs (for ``"accuracy"``: the share of
        inputs the head classifies right).
    dithered : float
        The same with noise, averaged over every input's ``draws`` noisy copies.
    per_draw : numpy.ndarray
        (draws,): the metric of the d-th noisy copy of every input, averaged over the inputs.
    stderr : float
        The standard error of :attr:`dithered` over the draws; 0 for one draw, which gives no estimate of
        it (a number, so that ``summary.json`` stays strict JSON): the summaries then say "no standard
        error", never "± 0".
    draws, examples, seed : int
    sigma : float or None
        The noise's std; None where one std per feature (then :attr:`sigma_rms` is their RMS).
    sigma_rms : float
    metric : str
        ``"accuracy"``, ``"topK"``, ``"cosine"``, or a callable's name.
    run : dict or None
        ``{"example_ids": ...}``: the ids that seeded the inputs' noise, as ``Bounds.params["run"]`` records them
        (:func:`hcrfast.results.describe_ids`: count, first, last, a hash, and the ids themselves up to 16).
        Recorded, not compared: ``==`` leaves it out, as it leaves out ``params["run"]``.
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
    metric: str = "accuracy"
    run: dict | None = field(default=None, repr=False)

    __eq__ = same_result   # by value: per_draw bitwise (a dataclass's own == raised on the array)
    __hash__ = None

    def summary(self) -> str:
        noise = (f"sigma {self.sigma:.6g}" if self.sigma is not None
                 else f"one std per feature (RMS {self.sigma_rms:.6g})")
        return (f"{_describe(self.metric)} on {self.examples} inputs: clean {self.clean:.4f}, dithered ({noise}, "
                f"{counted(self.draws, 'draw')} each) {self._with_stderr()}")

    def __repr__(self) -> str:   # (the dataclass's printed every field and per_draw's array, in one long line)
        try:
            return f"<Utility: {self.summary()}>"
        except Exception as exc:  # a repr must not raise: fields set by hand
            return f"<Utility (no summary: {type(exc).__name__}: {exc})>"

    def _with_stderr(self) -> str:
        """:attr:`dithered` and its standard error as the summaries print them: ``"0.8125 ± 0.0102"``; with one
        draw, which measures no spread, ``"0.8125 (1 draw: no standard error)"`` (its ``stderr`` of 0 is no
        estimate, and "± 0.0000" would read as one)."""
        if self.draws > 1:
            return f"{self.dithered:.4f} ± {self.stderr:.4f}"
        return f"{self.dithered:.4f} (1 draw: no standard error)"

    def to_dict(self) -> dict:
        return {"clean": self.clean, "dithered": self.dithered, "stderr": self.stderr,
                "per_draw": self.per_draw.tolist(), "draws": self.draws, "examples": self.examples,
                "seed": self.seed, "sigma": self.sigma, "sigma_rms": self.sigma_rms, "metric": self.metric,
                "noise_stream": f"default_rng([seed, example, {DITHER_STREAM:#x}])", "run": self.run}


def dithered_accuracy(model, head, batch: torch.Tensor, labels, sigma, *, draws: int = 10,
                      seed: int = 0, metric="accuracy", example_ids=None) -> Utility:
    """The metric of ``head`` on ``model(batch)``, clean and with ``draws`` noise draws per input.

    Parameters
    ----------
    model : torch.nn.Module
        The feature extractor whose outputs are released (as for :func:`hcrfast.bound`).
    head : callable or None
        A torch.nn.Module or any function (``lambda f: f @ W.T``, ``functools.partial``), as
        :func:`hcrfast.bound` takes its model: takes the features as ``model`` returns them, (B, ...);
        for ``"accuracy"`` and ``"topK"`` it returns class scores (B, C), whose best classes are the
        prediction. Run in eval mode (a Module, and the modules a function calls), its mode restored
        after. None: the features themselves are what the metric scores.
    batch : torch.Tensor
        The inputs, (B, ...).
    labels : torch.Tensor, numpy.ndarray or None
        ``"accuracy"``, ``"topK"``: (B,) integer classes in [0, C). ``"cosine"``: None. A callable
        metric: None, or anything with B rows, handed to it row by row with each noisy copy.
    sigma : float, array or hcrfast.Gaussian
        The std of the Gaussian noise added to every feature, or one std per feature (the features'
        shape, or flat); ``hcrfast.Gaussian(s)`` is the std ``s`` (other noise laws are refused). 0, or 0 on
        some features, adds no noise there: σ = 0 scores the clean features in every draw (a baseline, where
        :func:`hcrfast.bound` refuses σ = 0).
    draws : int
        Noisy copies per input (default 10).
    seed : int
        Example e draws from ``default_rng([seed, e, DITHER_STREAM])``.
    example_ids : sequence of int, optional
        The inputs' global indices, the e above (default 0..B-1), B distinct non-negative integers, as
        :func:`hcrfast.bound` takes them: a shard or a resumed part of a batch, with its rows' indices,
        draws the noise the whole batch draws for those rows. Recorded in :attr:`Utility.run`.
    metric : str or callable
        ``"accuracy"`` (default), ``"topK"`` (``"top5"``: the label among the K best classes),
        ``"cosine"`` (each noisy copy's output against the clean one's, flattened), or
        ``metric(outputs, targets)`` returning one finite score per copy, shape (N,), higher is
        better (outputs: the head's (N, ...) for N copies; targets: their labels' rows, or None).

    Returns
    -------
    Utility
        ``clean`` (the metric on the clean features, averaged over the inputs), ``dithered`` (averaged
        over every input's ``draws`` noisy copies), ``per_draw`` (the d-th copies' mean, one per draw),
        ``stderr`` (of ``dithered`` over the draws; 0 for one draw, no estimate), and the call's
        ``draws``, ``examples``, ``seed``, ``sigma`` (None for one std per feature), ``sigma_rms``,
        ``metric`` (its name) and ``run`` (the example ids). ``summary()`` puts them in words,
        ``to_dict()`` in a dict (the CLI's ``summary.json`` entry).
    """
    _early_ids(example_ids, batch)
    return accuracy_on_features(head, _features(model, batch), labels, sigma, draws=draws, seed=seed, metric=metric,
                                example_ids=example_ids)


def _early_ids(example_ids, batch) -> None:
    """Refuses bad ``example_ids`` before the model runs (a batch that is no tensor is named by the batch's check)."""
    from hcrfast import validation

    if example_ids is not None and isinstance(batch, torch.Tensor) and batch.ndim >= 1:
        validation.example_ids(example_ids, batch.shape[0])


def _features(model, batch: torch.Tensor) -> torch.Tensor:
    """The model's checked features of ``batch``, in its own shape, the model in eval mode: the model and batch
    checked as :func:`hcrfast.bound` checks them first (basis "pixel": no DCT here, vector inputs are fine), but
    for a bfloat16 batch, which bound refuses for its solver's arrays only (no solver runs here)."""
    from hcrfast import validation
    from hcrfast.algorithm import pieces_scope

    if isinstance(batch, torch.Tensor) and batch.dtype == torch.bfloat16 and callable(model):
        validation.check_batch(batch.float(), "pixel")   # (its shape, device and values, on a float32 copy)
        validation.model_dtype_device(model, batch, forward_only=True)
    else:   # forward passes only: a model loaded under torch.inference_mode is fine
        validation.model_and_batch(model, batch, "pixel", forward_only=True)
    # as every entry point runs it (under the one-call lock: another thread's call restoring the model's mode
    # meanwhile turned its dropout on inside this one), its buffers given back as they were; on a CPU in pieces of
    # the model's activations, as bound's forwards (hcrfast.algorithm.pieces_scope)
    with validation.model_kept(model), torch.no_grad(), pieces_scope():
        feats = validation.features_of(model, batch, flat=False)
        validation.probe_forward(model, batch, feats, name="model",
                                 why="its features are not a fixed function of each input (the noise hcrfast adds "
                                     "would not be the only noise in them)")
        return feats


def accuracy_on_features(head, feats: torch.Tensor, labels, sigma, *, draws: int = 10, seed: int = 0,
                         metric="accuracy", example_ids=None) -> Utility:
    """:func:`dithered_accuracy` on features already computed, ``feats`` (B, ...)."""
    from hcrfast import validation
    from hcrfast.algorithm import pieces_scope

    _check_draws_and_seed(draws, seed)
    if head is not None and not callable(head):
        raise TypeError(f"head={type(head).__name__}: pass a callable that reads the features (a torch.nn.Module, or "
                        f"a function of them), or None: the metric scores the features themselves")
    score = _Metric.of(metric)
    if not isinstance(feats, torch.Tensor) or not feats.is_floating_point() or feats.ndim < 1:
        raise TypeError(f"feats must be a floating-point torch.Tensor of features, (B, ...), got "
                        f"{type(feats).__name__ if not isinstance(feats, torch.Tensor) else feats.dtype}")
    bad = ~torch.isfinite(feats.reshape(feats.shape[0], -1)).all(dim=1)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        raise ValueError(f"the features of inputs {rows[:10]}{' ...' if len(rows) > 10 else ''} are not finite (NaN "
                         f"or inf): their accuracy under noise is undefined; drop those inputs or fix the model")
    B, shape = feats.shape[0], tuple(feats.shape[1:])
    ids = validation.example_ids(example_ids, B)
    n = int(np.prod(shape))
    profile = _profile(sigma, n, shape)
    targets = score.targets(labels, B, feats.device)
    # (pieces_scope: the head's forwards after the clean one run in pieces of its activations on a CPU, as the
    # model's do: a large head on examples x draws copies at once held them all)
    with validation._ONE_CALL, torch.no_grad(), (validation.model_kept(head, "head") if head is not None
                                                 else contextlib.nullcontext()), pieces_scope():
        try:   # (on a copy: a head that writes into its input changed the caller's features, or batch)
            reference = _outputs(head, feats.clone())
        except (RuntimeError, TypeError) as exc:
            if isinstance(exc, torch.OutOfMemoryError):
                raise
            raise ValueError(f"the head failed on the features, shape {tuple(feats.shape)} "
                             f"({str(exc).splitlines()[0][:200]}): pass a head that takes the features as the model "
                             f"returns them") from exc
        score.check(reference, targets)   # (first: a metric's refusal of non-finite outputs says more)
        if head is not None:
            validation.probe_forward(head, feats, reference, name="head",
                                     why="its accuracy on the noisy features would not be the released noise's alone")
        clean = score.total(score(reference, reference, targets))
        total = np.zeros(draws, dtype=np.int64 if score.counts else np.float64)
        flat = profile.reshape(-1)  # one std, or one per feature in the features' order
        step = max(1, _CHUNK_ENTRIES // max(1, draws * n))
        for lo in range(0, B, step):
            hi = min(B, lo + step)
            # float64 draws times the stds, then the features' dtype (as reproduce has always drawn them)
            z = np.stack([flat * np.random.default_rng([seed, int(e), DITHER_STREAM]).standard_normal((draws, n))
                          for e in ids[lo:hi]])                      # (examples, draws, n)
            noise = torch.as_tensor(z.reshape((-1,) + shape), dtype=feats.dtype, device=feats.device)
            noisy = feats[lo:hi].repeat_interleave(draws, dim=0) + noise
            if not bool(torch.isfinite(noisy).all()):   # (the features are finite: the noise took them past the dtype)
                raise _NoiseOverflow(profile, z, feats)
            copies = score(_outputs(head, noisy), reference[lo:hi].repeat_interleave(draws, dim=0),
                           None if targets is None else targets[lo:hi].repeat_interleave(draws, dim=0))
            total += copies.reshape(hi - lo, draws).sum(dim=0).cpu().numpy()
    per_draw = total / B
    scalar = profile.size == 1
    # the mean over all B x draws copies; for (top-K) accuracy an exact ratio of counts (so that a target met
    # exactly, 0.8 = 200 / 250, compares as met)
    dithered = (int(total.sum()) / (B * draws)) if score.counts else float(total.sum() / (B * draws))
    return Utility(clean=clean / B, dithered=dithered, per_draw=per_draw,
                   stderr=float(per_draw.std(ddof=1) / np.sqrt(draws)) if draws > 1 else 0.0,
                   draws=int(draws), examples=B, seed=int(seed), sigma=float(profile) if scalar else None,
                   sigma_rms=float(np.sqrt(np.mean(profile ** 2))), metric=score.name,
                   run={"example_ids": describe_ids(ids)})


def _check_draws_and_seed(draws, seed) -> None:
    """Refuse ``draws`` or ``seed`` by name: TypeError for one that is no integer (``2.0``, ``True``), ValueError for
    one out of range, as :func:`hcrfast.bound` and :func:`hcrfast.gauss_newton_attack` refuse theirs."""
    for name, value, least, what in (("draws", draws, 1, "a positive integer (noisy copies per input)"),
                                     ("seed", seed, 0, "an integer >= 0")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name}={value!r} ({type(value).__name__}): pass {what}")
        if value < least:
            raise ValueError(f"{name}={value!r}: pass {what}")


class _NoiseOverflow(ValueError):
    """The noisy features ``feats + σ·draw`` left the features' dtype (inf): no head's or metric's fault, so
    not told as one (a head "not defined on every real input"). ``what``: the cause, without the fix."""

    def __init__(self, profile: np.ndarray, z: np.ndarray, feats: torch.Tensor):
        from hcrfast.validation import dtype_name

        name = dtype_name(feats.dtype)
        sigma = (f"sigma = {float(profile):.6g}" if profile.size == 1
                 else f"one std per feature (the largest {float(profile.max()):.6g})")
        self.float64 = feats.dtype == torch.float64
        self.what = (f"the noisy features overflow {name}: with {sigma}, the noise draws reach "
                     f"{float(np.abs(z).max()):.6g} and the features {float(feats.abs().max()):.6g}, and their sum "
                     f"passes {name}'s largest value, {torch.finfo(feats.dtype).max:.6g} (inf, which no head or "
                     f"metric can score)")
        fix = ("pass a smaller sigma" if self.float64 else
               "pass a smaller sigma, or run the model and batch in float64 (model.double(), batch.double()), whose "
               "features hold noise up to 1.8e308")
        super().__init__(f"{self.what}; {fix}")


def _outputs(head, feats: torch.Tensor) -> torch.Tensor:
    from hcrfast.algorithm import forward

    out = feats if head is None else forward(head, feats)
    if not isinstance(out, torch.Tensor) or out.ndim < 1 or out.shape[0] != feats.shape[0]:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the head returned {got} for {feats.shape[0]} feature vectors; it must return one row per "
                         f"feature vector, (B, ...)")
    return out


def _describe(metric: str) -> str:
    if metric == "accuracy":
        return "accuracy of the head"
    if metric.startswith("top") and metric[3:].isdigit():
        return f"top-{metric[3:]} accuracy of the head"
    if metric == "cosine":
        return "cosine similarity of the noisy outputs with the clean ones"
    return f"{metric} (the mean per noisy copy)"


class _Metric:
    """What a noisy copy's output scores: a (top-K) hit, its cosine with the clean output, or the user's
    callable. ``counts``: the scores are 0/1, summed as exact integers. A callable's name ends in "()"
    (``neg_sq_error()``), apart from the built-in names whatever the function is called."""

    def __init__(self, name: str, top: int | None = None, fn=None):
        self.name, self.top, self.fn = name, top, fn
        self.counts = top is not None

    @classmethod
    def of(cls, metric) -> "_Metric":
        if callable(metric) and not isinstance(metric, str):
            name = getattr(metric, "__name__", None) or type(metric).__name__
            return cls(("lambda" if name == "<lambda>" else name) + "()", fn=metric)
        if metric == "accuracy":
            return cls("accuracy", top=1)
        if metric == "cosine":
            return cls("cosine")
        if isinstance(metric, str) and metric.startswith("top") and metric[3:].isdigit() and int(metric[3:]) >= 1:
            k = int(metric[3:])
            return cls("accuracy" if k == 1 else f"top{k}", top=k)
        raise ValueError(f"metric={metric!r}: pass 'accuracy', 'topK' (top5: the label among the 5 best classes), "
                         f"'cosine', or a callable metric(outputs, targets) giving one score per noisy copy")

    def check_target(self, value, name: str = "accuracy=") -> None:
        """Refuses a target no noise level can sensibly be searched for: (0, 1] for (top-K) accuracy, (0, 1)
        for the cosine (1 is no noise at all, 0 what pure noise gives), any finite number for a callable."""
        value = host_argument(name.rstrip("="), value)
        if isinstance(value, (torch.Tensor, np.ndarray)) and math.prod(value.shape) == 1 and (
                value.dtype.kind in "iuf" if isinstance(value, np.ndarray) else value.is_floating_point()):
            value = value.item()   # a 0-d tensor or array of one real number
        wanted = ("number in (0, 1]" if self.counts
                  else "number in (0, 1) (1: no noise at all; 0: what pure noise gives)" if self.fn is None
                  else "finite number")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise TypeError(f"{name}{value!r} ({type(value).__name__}): pass the dithered {self.name} to keep, a "
                            f"{wanted}")
        if not np.isfinite(value):
            ok = False
        elif self.counts:
            ok = 0 < value <= 1
        elif self.fn is None:  # cosine
            ok = 0 < value < 1
        else:
            ok = True
        if not ok:
            raise ValueError(f"{name}{value!r}: pass the dithered {self.name} to keep, a {wanted}")

    def targets(self, labels, B: int, device):
        if self.top is not None:
            if labels is None:  # (np.asarray(None) is an object array: "labels are object" named no cause)
                raise ValueError(f"labels=None, but metric={self.name!r} needs labels: pass integer classes, one per "
                                 f"input, shape ({B},); or metric='cosine', which needs no labels")
            return torch.as_tensor(_labels(labels, B), device=device)
        if self.fn is None:  # cosine
            if labels is not None:
                raise ValueError("labels given with metric='cosine', which compares each noisy output with the clean "
                                 "one: pass labels=None")
            return None
        if labels is None:
            return None
        try:
            rows = labels if isinstance(labels, torch.Tensor) else torch.as_tensor(np.asarray(labels))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"labels of type {type(labels).__name__} are not numbers torch can hold "
                             f"({str(exc).splitlines()[0][:200]}): pass the metric {self.name}'s targets as numbers, "
                             f"one row per input") from None
        if rows.ndim < 1 or rows.shape[0] != B:
            raise ValueError(f"labels have shape {tuple(rows.shape)}; pass one row per input, {B} rows, for the "
                             f"metric {self.name} (or None)")
        return rows.to(device)

    def check(self, outputs: torch.Tensor, targets) -> None:
        """Checks the clean outputs (and the labels against them) before any noise is drawn."""
        if self.top is not None:   # (first: "fewer than K finite scores" is every row of a head of K classes)
            if outputs.ndim != 2:
                raise ValueError(f"the head returned {tuple(outputs.shape)} for {outputs.shape[0]} feature vectors; "
                                 f"accuracy needs class scores of shape (B, classes)")
            classes = outputs.shape[1]
            if classes <= self.top:
                raise ValueError(f"the head scores {classes} class{'es' if classes != 1 else ''}; "
                                 + ("accuracy needs at least 2 (argmax over classes)" if self.top == 1 else
                                    f"top-{self.top} accuracy needs more than {self.top} (pass a smaller K)"))
        self.finite(outputs, "clean inputs")
        if self.fn is None and self.top is None:  # cosine: against the clean output, which needs a direction
            norms = outputs.reshape(len(outputs), -1).double().norm(dim=1)
            flat = torch.nonzero(~(norms > 0)).flatten().tolist()
            if flat:
                raise ValueError(f"the clean outputs of inputs {flat[:10]}{' ...' if len(flat) > 10 else ''} are all "
                                 f"zero: their cosine with a noisy copy is undefined; drop those inputs, or score the "
                                 f"features before the layer that zeroes them (another head, or head=None)")
        if self.top is None:
            return
        classes = outputs.shape[1]
        if int(targets.max()) >= classes:
            raise ValueError(f"labels hold class {int(targets.max())}, but the head scores {classes} classes (0.."
                             f"{classes - 1}): pass the labels the head was trained on")

    def finite(self, outputs: torch.Tensor, what: str) -> None:
        """Refuses non-finite outputs for the built-in metrics (a callable's scores are checked instead):
        argmax and top-K over NaN pick the NaN, and the cosine would read it as 0."""
        if self.fn is not None:
            return
        flat = outputs.reshape(len(outputs), -1)
        if self.top is not None:
            # (top-K) accuracy over masked logits (-inf: classes ruled out) is defined where no score is NaN or
            # +inf and K of them are finite (else the K best tie among the -inf); they were refused outright
            bad = (torch.isnan(flat) | torch.isposinf(flat)).any(dim=1) | (torch.isfinite(flat).sum(dim=1) < self.top)
        else:
            bad = ~torch.isfinite(flat).all(dim=1)
        if bool(bad.any()):
            masked = (" (-inf scores are taken as classes ruled out, with at least "
                      f"{self.top} finite score{'s' if self.top > 1 else ''} a row)" if self.top is not None else "")
            raise ValueError(f"the head gave non-finite outputs (NaN or inf) for {int(bad.sum())} of {len(outputs)} "
                             f"{what}: the {self.name} of those is undefined{masked}; pass a head defined on every "
                             f"real input (the noisy features can take any value: a sqrt or log of them is not)")

    def __call__(self, outputs: torch.Tensor, reference: torch.Tensor, targets) -> torch.Tensor:
        """(N,) scores of N copies' outputs (reference: the clean outputs of their inputs)."""
        self.finite(outputs, "noisy copies")
        if self.top == 1:
            return outputs.argmax(dim=1) == targets
        if self.top is not None:
            return (outputs.topk(self.top, dim=1).indices == targets[:, None]).any(dim=1)
        if self.fn is None:  # the cosine, float64, no eps: a noisy output that is all zero has no direction (0)
            a = outputs.reshape(len(outputs), -1).double()
            b = reference.reshape(len(reference), -1).double()
            norms = a.norm(dim=1) * b.norm(dim=1)
            return torch.where(norms > 0, (a * b).sum(dim=1) / torch.where(norms > 0, norms, 1.0), 0.0)
        shown = "None" if targets is None else f"shape {tuple(targets.shape)}"
        try:
            got = self.fn(outputs, targets)
        except Exception as exc:
            if isinstance(exc, torch.OutOfMemoryError):  # (not the metric's fault: chunking is the answer)
                raise
            raise ValueError(f"the metric {self.name} failed on outputs of shape {tuple(outputs.shape)} and targets "
                             f"{shown} ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}): "
                             + ("pass the labels it needs as its targets (hcrfast bound: --labels), or "
                                if targets is None else "")
                             + "pass a function (outputs, targets) -> one score per noisy copy") from exc
        try:
            scores = torch.as_tensor(got.detach() if isinstance(got, torch.Tensor) else np.asarray(got))
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"the metric {self.name} returned {type(got).__name__}: it must return one number per "
                             f"copy, shape ({len(outputs)},)") from None
        if scores.is_complex() or not (scores.is_floating_point() or scores.dtype in (
                torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)):
            raise ValueError(f"the metric {self.name} returned {scores.dtype} scores: it must return real numbers")
        if scores.shape != (len(outputs),) or not bool(torch.isfinite(scores.double()).all()):
            raise ValueError(f"the metric {self.name} returned {tuple(scores.shape)} scores"
                             + ("" if scores.shape != (len(outputs),) else ", not all finite")
                             + f" for {len(outputs)} copies: it must return one finite score per copy, shape "
                               f"({len(outputs)},)")
        return scores.to(torch.float64)

    def total(self, scores: torch.Tensor):
        return int(scores.sum()) if self.counts else float(scores.double().sum())


@dataclass(frozen=True)
class AccuracySearch:
    """The result of :func:`sigma_for_accuracy`: the largest noise found that keeps the accuracy.

    Attributes
    ----------
    sigma : float or numpy.ndarray
        ``scale × sigma0``: the largest σ tried whose measured dithered accuracy met the target (where the
        target is at or below the metric's floor under noise, whose value is :attr:`floor`: the σ where that
        floor begins).
    scale : float
        σ in units of :attr:`sigma0`.
    sigma0 : float or numpy.ndarray
        The unit (one std per feature where a profile).
    target : float
        The accuracy asked for.
    utility : Utility
        The head's accuracy at :attr:`sigma` (clean, dithered ± standard error; no standard error for one
        draw).
    above_scale : float or None
        The smallest scale tried above :attr:`scale` (its dithered accuracy fell under the target); None
        where no σ up to :data:`MAX_SCALE` × sigma0 did.
    above : Utility or None
        The head's accuracy there.
    history : list of dict
        Every σ tried: ``scale``, ``dithered``, ``stderr`` (0 for one draw: :attr:`Utility.stderr`).
    note : str
        Why the search ended.
    floor : float or None
        Where the metric fell to a value it keeps up to :data:`MAX_SCALE` × sigma0 (what noise alone gives:
        for accuracy, about chance) and that value meets the target: that value, and :attr:`sigma` is where
        it begins, with a warning (every larger σ keeps the target; none is the largest). None otherwise.
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
    floor: float | None = None

    __eq__ = same_result
    __hash__ = None

    def summary(self) -> str:
        unit = "" if np.ndim(self.sigma0) == 0 else " (RMS of the stds)"
        sig = self.sigma if np.ndim(self.sigma) == 0 else float(np.sqrt(np.mean(np.square(self.sigma))))
        if self.floor is not None:
            return (f"no largest sigma: the dithered {self.utility.metric} reaches its floor under noise, "
                    f"{self.floor:.4f}, at or above the target {self.target:g}, from {self.scale:.6g} x sigma0 = "
                    f"{sig:.6g}{unit} on (clean {self.utility.clean:.4f}); {len(self.history)} sigmas tried "
                    f"({self.note})")
        above = ("" if self.above is None else
                 f"; at {self.above_scale:.6g} x sigma0 it is {self.above.dithered:.4f}")
        return (f"the largest sigma found keeping the dithered {self.utility.metric} >= {self.target:g}: "
                f"{self.scale:.6g} x sigma0 = {sig:.6g}{unit}, {self.utility.metric} {self.utility._with_stderr()} "
                f"(clean {self.utility.clean:.4f}){above}; {len(self.history)} sigmas tried ({self.note})")

    def __repr__(self) -> str:
        """One line, as :class:`hcrfast.SigmaSearch`'s: the σ and the metric there (the dataclass's repr printed
        every field, the history's every σ, a profile's every std)."""
        try:
            sig = (f"{self.sigma:.6g}" if np.ndim(self.sigma) == 0
                   else f"{self.scale:.6g} x the given stds (RMS {float(np.sqrt(np.mean(np.square(self.sigma)))):.6g})")
            value, which = ((f"at its floor under noise {self.floor:.4f}", "where the floor begins: no largest sigma")
                            if self.floor is not None else (self.utility._with_stderr(), "the largest sigma found"))
            return (f"<AccuracySearch: sigma {sig}: dithered {self.utility.metric} {value} >= target {self.target:g} "
                    f"(clean {self.utility.clean:.4f}), {which}, {len(self.history)} sigmas tried; .summary() for "
                    f"the rest>")
        except Exception as exc:  # a repr must not raise: fields set by hand
            return f"<AccuracySearch (no summary: {type(exc).__name__}: {exc})>"


#: The largest σ, in units of sigma0, :func:`sigma_for_accuracy` tries.
MAX_SCALE = 2.0 ** 40


def sigma_for_accuracy(model, head, batch: torch.Tensor, labels, accuracy: float, *, sigma0=None,
                       draws: int = 10, seed: int = 0, rtol: float = 0.01, metric="accuracy",
                       example_ids=None) -> AccuracySearch:
    """The largest σ = scale × ``sigma0`` at which ``head``'s accuracy on the dithered features stays
    at least ``accuracy``: the most noise, and so the largest HCR bounds, a utility target allows.
    (Any metric of :func:`dithered_accuracy` works alike: ``accuracy`` is then the value of its mean
    to keep, and the metric should fall as the noise grows.)

    The model runs once; every σ tried is ``draws`` noisy copies of every input's features through the
    head (:func:`hcrfast.utility.accuracy_on_features`, the same draws at every σ, scaled). The search doubles or halves
    σ until the accuracy crosses the target, then bisects (in log σ) until the two σ either side are
    within a factor ``1 + rtol``. The accuracy is measured on these inputs and draws, not guaranteed
    elsewhere; with the draws fixed it is a step function of σ, falling as σ grows but not always
    strictly, so the σ returned is the lower end of a crossing the search found. A target at or below the
    metric's floor under noise (the value it falls to and keeps, over at least :data:`FLOOR_SPAN`, up to
    :data:`MAX_SCALE` × sigma0: what noise alone gives, about chance for accuracy) has no crossing: every
    larger σ keeps it, so a ``RuntimeWarning`` says so and the σ returned is where the floor begins
    (:attr:`AccuracySearch.floor`). Bound the inputs at :attr:`AccuracySearch.sigma` (:func:`hcrfast.bound`)
    for the confidentiality it buys.

    Parameters
    ----------
    model, head, batch, labels, draws, seed, metric, example_ids :
        As for :func:`dithered_accuracy`.
    accuracy : float
        The dithered accuracy (the metric's mean) to keep: in (0, 1] for ``"accuracy"`` and
        ``"topK"``, in (0, 1) for ``"cosine"``, any number for a callable; at most its value on the
        clean features (below it for a metric that varies continuously with the noise: the cosine, most
        callables, which stay under their clean value at any σ > 0).
    sigma0 : float, array or hcrfast.Gaussian, optional
        The unit and first σ tried. Default: the RMS of the clean features over the batch.
    rtol : float
        The relative width of the final bracket (default 0.01).
    """
    from hcrfast.algorithm import rms_sigma

    score = _Metric.of(metric)
    score.check_target(accuracy)
    _check_draws_and_seed(draws, seed)
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float, np.integer, np.floating)):
        raise TypeError(f"rtol={rtol!r} ({type(rtol).__name__}): pass a positive number (the bracket's relative "
                        f"width)")
    if not (np.isfinite(rtol) and rtol > 0):
        raise ValueError(f"rtol={rtol!r}: pass a positive number (the bracket's relative width)")
    _early_ids(example_ids, batch)
    feats = _features(model, batch)
    if sigma0 is None:
        sigma0 = rms_sigma(feats.reshape(feats.shape[0], -1), 1.0)
    # (positive, as sigma_for's and sweep_sigma's: it is the unit of the search, where a std of 0 is no noise)
    unit = _profile(sigma0, int(np.prod(feats.shape[1:])), tuple(feats.shape[1:]), "sigma0", positive=True)
    history = []

    utilities = []   # (scale, Utility) of the doubling run: where a floor begins

    def at(k: float) -> Utility:
        try:
            u = accuracy_on_features(head, feats, labels, k * unit, draws=draws, seed=seed, metric=metric,
                                     example_ids=example_ids)
        except _NoiseOverflow as exc:
            # (only sigma0 itself or a doubling overflows: the halving and the bisection stay under a sigma tried)
            if not history:
                where, fix = "at sigma0, the first sigma it tries", "pass a smaller sigma0"
            else:
                where = (f"at {k:.6g} x sigma0, doubling sigma while the {score.name} kept the target {accuracy:g} "
                         f"(it did up to {k / 2:.6g} x sigma0)")
                fix = (f"pass a target above what noise alone gives (for accuracy, about chance): the {score.name} kept "
                       f"this one at this much noise")
            if not exc.float64:
                fix += (", or run the model and batch in float64 (model.double(), batch.double()), whose features hold "
                        "noise up to 1.8e308")
            raise ValueError(f"sigma_for_accuracy: {where}, {exc.what}; {fix}") from None
        history.append({"scale": k, "dithered": u.dithered, "stderr": u.stderr})
        utilities.append((k, u))
        return u

    k, u = 1.0, at(1.0)
    clean = u.clean  # (every call measures it; the first says whether any sigma can keep the target)
    if clean < accuracy:
        shown = f"{clean:.4f}" if score.counts else f"{clean:.6g}"
        raise ValueError(f"accuracy={accuracy:g}: the head's clean {score.name} on these inputs is {shown}, under the "
                         f"target: no noise keeps it; pass a target of at most {shown}")
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
            if k < 1.0 / MAX_SCALE and lo is None and accuracy >= clean:   # a target at the clean value
                raise ValueError(f"accuracy={accuracy:g} is the head's clean {score.name} itself ({clean:.6g}): the "
                                 f"dithered one stays under it down to sigma = {k:g} x sigma0, as a metric that "
                                 f"varies continuously with the noise does at any sigma > 0; pass a target below "
                                 f"{clean:.6g}")
            if k < 1.0 / MAX_SCALE and lo is None:  # (the clean accuracy meets it: sigma -> 0 must)
                raise RuntimeError(f"the dithered {score.name} stays under {accuracy:g} down to sigma = {k:g} x sigma0 "
                                   f"although the clean one is {clean:.6g}; the head's outputs (or the metric) are "
                                   f"unstable")
    if hi is None:
        floor = _floor(history, clean)
        if floor is not None:
            k_f, value = floor
            u_f = next(u for k_, u in utilities if k_ == k_f)
            shown = f"{value:.4f}" if score.counts else f"{value:.6g}"
            note = (f"the {score.name} falls from {clean:.6g} (clean) to {shown} by {k_f:g} x sigma0 and stays there "
                    f"up to {MAX_SCALE:g} x sigma0: its floor, what noise alone gives (the features drowned; for "
                    f"accuracy, about chance), at or above the target {accuracy:g}, so every sigma from there on "
                    f"keeps the target and none is the largest; the sigma returned is where the floor begins. Pass "
                    f"a target above {shown} for a sigma the target limits")
            warnings.warn(f"sigma_for_accuracy: accuracy={accuracy:g} is at or below what noise alone gives: {note}",
                          HcrfastRuntimeWarning, stacklevel=2)
            return AccuracySearch(sigma=_scaled(k_f, unit), scale=k_f, sigma0=_unit(unit), target=float(accuracy),
                                  utility=u_f, above_scale=None, above=None, history=history, note=note,
                                  floor=value)
        return AccuracySearch(sigma=_scaled(lo[0], unit), scale=lo[0], sigma0=_unit(unit), target=float(accuracy),
                              utility=lo[1], above_scale=None, above=None, history=history,
                              note=f"the {score.name} met the target up to {MAX_SCALE:g} x sigma0: it barely "
                                   f"depends on the noise (a head that barely looks at these features, or a "
                                   f"metric that does not fall as the noise grows)")
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


#: :func:`sigma_for_accuracy` calls the metric's value at the largest σ its floor (what noise alone gives)
#: where it fell from the clean value and stayed within a millionth of that fall over at least this factor
#: of σ.
FLOOR_SPAN = 2.0 ** 10


def _floor(history: list, clean: float):
    """``(scale, value)``: where the metric, measured from sigma0 up to :data:`MAX_SCALE`, reached the value it
    keeps up to there (within a millionth of its fall from ``clean``) over at least :data:`FLOOR_SPAN`, having
    fallen; None where it never fell (a head that ignores the features) or had not settled."""
    doubled = sorted((h["scale"], h["dithered"]) for h in history)
    final = doubled[-1][1]
    fall = clean - final
    if not fall > 0:
        return None
    tol = 1e-6 * fall
    start = len(doubled) - 1
    while start > 0 and abs(doubled[start - 1][1] - final) <= tol:
        start -= 1
    k_f = doubled[start][0]
    return (k_f, final) if doubled[-1][0] >= k_f * FLOOR_SPAN else None


def _unit(unit: np.ndarray):
    return float(unit) if unit.size == 1 else unit


def _scaled(k: float, unit: np.ndarray):
    return float(k * unit) if unit.size == 1 else k * unit


def _profile(sigma, n: int, shape: tuple, name: str = "sigma", positive: bool = False) -> np.ndarray:
    """``sigma`` as one std (a 0-d array) or one per feature (the features' shape): finite and >= 0, or with
    ``positive`` (a search's unit) > 0."""
    from hcrfast import validation
    from hcrfast.noise import Gaussian, NoiseLaw, PerFeatureGaussian

    sigma = host_argument(name, sigma)
    if isinstance(sigma, Gaussian) and not isinstance(sigma, PerFeatureGaussian):
        sigma = sigma.sigma   # hcrfast.Gaussian(s): the std s, as hcrfast.bound and sigma_for read it
    elif isinstance(sigma, NoiseLaw):
        raise TypeError(f"{name}={sigma!r}: the dithering is Gaussian noise, of one std or one per feature; pass a "
                        f"float, one std per feature, or hcrfast.Gaussian(std)")
    if hasattr(sigma, "detach"):
        sigma = sigma.detach().cpu().numpy()
    try:
        profile = validation.real_array(sigma)   # strings ("0.5"), bools, complex, objects: not a std
    except (TypeError, ValueError):
        raise TypeError(f"{name}={sigma!r}: pass the noise's std, a real number or one per feature") from None
    if profile.size != 1 and profile.size != n:
        raise ValueError(f"{name} has {profile.size} entries, shape {profile.shape}; the model returns {n} features "
                         f"of shape {shape}: pass one std, or one per feature")
    if profile.size != 1 and profile.shape not in ((n,), shape):  # (a transposed profile would land elsewhere)
        raise ValueError(f"{name} has the shape {profile.shape}, but the model's features have the shape {shape}: "
                         f"pass the stds in the features' shape, or flat ({n},) in their order")
    if positive and not (np.all(np.isfinite(profile)) and np.all(profile > 0)):
        raise ValueError(f"{name} must be positive and finite" + (
            f", got {float(profile)!r}" if profile.size == 1 else
            f"; {int(np.sum(~(np.isfinite(profile) & (profile > 0))))} entries are not"))
    if not (np.all(np.isfinite(profile)) and np.all(profile >= 0)):
        raise ValueError(f"{name} must be finite and >= 0" + (f", got {float(profile):g}" if profile.size == 1 else
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
