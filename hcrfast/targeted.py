"""Targeted HCR bounds: one perturbation per basis mode, aimed at the Cramér–Rao optimum.

Algorithm 1 finds one direction per restart (towards the weakest right singular
vector of J), so the bound it gives mode k is ``σ·|v_k|/σ_min`` in the limit,
usually far below the best a single ε can give that mode. For mode k (basis
vector ``q_k = Qᵀ e_k``) the best direction in the linear regime is (METHOD.md §4)

    ε_k ∝ (JᵀJ)⁺ q_k,   linearized bound  σ·sqrt(q_kᵀ (JᵀJ)⁺ q_k)  (Cramér–Rao),

which the least-squares estimator attains on a linear model. This module aims
one ε at every requested mode, scales it so that the *linearized* feature shift
has norm s·σ, and then, as :func:`hcrfast.bound` does, computes the feature
shift ``z_ε = a(θ+ε) − a(θ)`` by forward passes (in float64 with ``certify``) and
reports ``|(Q ε)_k| / sqrt(D(z_ε))``, ``D(z) = expm1(‖z‖²/σ²)``. Every reported
number is a certified HCR bound (paper eq. 5, 12); nothing derived from the
linearization is reported as a bound.

Two ways to get the directions:

``"dense"`` (:mod:`hcrfast.dense`)
    The full Jacobian of each example, factored once (:func:`hcrfast.dense.min_norm_solver`):
    all modes at once, the exact restriction to the row space of J, and the local
    null space of J.
``"lsqr"``
    Matrix-free, with the batched LSQR: since ``(JᵀJ)⁺ = J⁺ (J⁺)ᵀ``,
    ``w = (Jᵀ)⁺ q_k`` is the min-norm least-squares solution of ``Jᵀ w = q_k``
    and ``ε = J⁺ w`` that of ``J ε = w``; LSQR started from 0 returns
    min-norm solutions. All (example, mode) pairs are one batch of problems.

Null space (dense only): where ``q_k`` has a component ``u`` in the null space of
J, steps ``ε = t·u/‖u‖`` are also certified. A step whose forward pass leaves
the features *exactly* unchanged has D = 0 and gives the mode the bound +inf:
``θ`` and ``θ + ε`` produce the same distribution of released features, so no
*unbiased* estimator of that mode exists locally. That is not a guarantee of
confidentiality against every attacker: a biased estimator (one using a prior
over images, say) can still reconstruct the mode. A step whose features change
by rounding only gives a finite, typically huge, certified bound.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import types
from dataclasses import dataclass, field

import numpy as np
import torch

from hcrfast import dense, kernels, profiling, validation
from hcrfast.algorithm import (_ROUNDING_TOLERANCE, _Eta, _StillTheSameFunction, _applied64, _applied_shift,
                               _auto_chunk, _certified_shift, _check_perturbations, _coarse_shifts, _cross_bounds,
                               _features, _in_chunks, _is_oom, _far_slope, _nonfinite_derivative, _progress_line,
                               _rounded_away, _rounding_error, _rounding_magnitude, _rounding_slope, _step_magnitude,
                               _warn_rounding, _widened, coordinates_down, divergence_underflow, infinite_derivative)
from hcrfast.backend import get_array_module, host_argument, to_host
from hcrfast.bindings import TorchJacobian, array_module_for, from_torch, to_torch
from hcrfast.checkpoint import (RESUME_BITWISE, Checkpoint, arithmetic_of, gaps, key_batch_fingerprint,
                                key_model_fingerprint, sha256_tensors, taken_back_on_failure)
from hcrfast.lsqr import LSQROptions, lsqr
from hcrfast.noise import Gaussian, accepts_per_feature_sigma, as_noise, divergence_of
from hcrfast.operators import Transposed
from hcrfast.results import (counted, json_default, load_npz, malformed, quantile_line, require, revision_line,
                              merged_run, revision_loaded, revision_saved, run_record, same_result, save_npz, short_repr)

METHODS = ("auto", "dense", "lsqr")

#: ``method="auto"`` uses the dense path up to this many input values per example, and while an
#: example's J and V (n·p + p² float64 values) take at most ``DENSE_MAX_VALUES``. Measured on one
#: CPU thread, MLP Flatten→Linear(p,p)→ReLU→Linear(p,p)→ReLU, 2 examples, 64 targets: dense
#: 0.04 / 0.14 / 1.2 s against LSQR 0.36 / 2.7 / 33 s at p = 64 / 256 / 784, and dense 52 s at
#: p = 3072 (eigh 36 s); LSQR's cost grows with the number of targets, the dense path's hardly.
DENSE_MAX_INPUTS = 4096
DENSE_MAX_VALUES = 2**28

#: LSQR settings of the "lsqr" method by dtype unless the caller passes ``lsqr=``, with
#: ``iter_lim = LSQR_ITER_FACTOR · max(n, p)``. Both solves must be accurate (the bound of mode k
#: loses about the square of the direction's error); on ill-conditioned J, LSQR in floating
#: point needs more than the 2·n_cols steps of exact arithmetic (cond 1e3, p = 24: ~67 steps).
LSQR_ITER_FACTOR = 4
TARGETED_LSQR = {
    torch.float64: LSQROptions(atol=1e-10, btol=1e-10, conlim=1e12),
    torch.float32: LSQROptions(atol=1e-5, btol=1e-5, conlim=1e7),
    # float16's unit roundoff is 4.9e-4: LSQR's estimates cannot fall much below it (bounds certified in float64)
    torch.float16: LSQROptions(atol=1e-3, btol=1e-3, conlim=1e3),
}

#: A mode is probed in the null space when ``‖(I − V_r V_rᵀ) q_k‖ > NULL_COMPONENT_TOL`` (q_k has norm 1).
NULL_COMPONENT_TOL = 1e-6

#: Null-space steps t, as multiples of the RMS of the example's input values.
NULL_STEPS = (1e-3, 1e-2, 1e-1)

#: Entries of a null-space step below this fraction of its largest entry are also tried as exact zeros:
#: when the null space is spanned by input coordinates, SVD round-off outside them would move the features.
_CLEAN_BELOW = 1e-10

#: Examples × (n·p + p² + 2·K·p) float64 values per dense group.
_DENSE_ELEMENTS = 2**26

#: What :func:`targeted_bound`'s ``chunk_size`` counts (``params["run"]["chunk_unit"]``): rows, not examples as
#: :func:`hcrfast.bound`'s; its pieces of examples hold ``chunk_size // K`` examples of K modes each (at least 1).
CHUNK_UNIT = "rows (examples x modes) per batched pass"


class _Rows:
    """Rows per batched pass of one :func:`targeted_bound` call (:data:`CHUNK_UNIT`): its ``chunk_size``, or the
    automatic one, halved for the rest of the call where a pass runs out of memory (a later pass does not run
    out of it again first); the last size is what ``params["run"]["chunk_size"]`` records."""

    def __init__(self, size: int, progress: bool = False):
        self.size, self.progress = int(size), progress

    def over(self, total: int, compute, device) -> None:
        """``compute(lo, hi)`` over ``0..total`` in passes of at most :attr:`size` rows
        (:func:`hcrfast.algorithm._in_chunks`)."""
        try:
            self.size = _in_chunks(total, self.size, compute, device, on_halve=self._halved)
        except Exception as exc:  # out of memory at one row (halved down to 1): say what a row is
            if _is_oom(exc):
                exc.add_note("hcrfast.targeted_bound: one row alone (one example's step for one mode) ran out of "
                             f"memory; chunk_size counts {CHUNK_UNIT}, not examples as hcrfast.bound's, and is "
                             "halved down to 1, no further")
            raise

    def _halved(self, size: int) -> None:
        self.size = size
        if self.progress:
            validation.say(f"hcrfast.targeted_bound: out of memory, chunk_size halved to {size} {CHUNK_UNIT}")


def _most_rows(B: int, K: int, null_probes: bool) -> int:
    """The most rows a pass of a :func:`targeted_bound` call on ``B`` examples and ``K`` modes can hold: each
    (example, mode)'s step, or with the null-space probes its 2·len(NULL_STEPS) candidates. An automatic chunk size
    above it computes as this one does (one piece, every pass whole): ``params["run"]`` records it capped here, as
    :func:`hcrfast.results.run_record` caps examples at the batch's."""
    return max(1, B * K * (2 * len(NULL_STEPS) if null_probes else 1))


def parse_targets(targets, input_shape, basis: str) -> np.ndarray:
    """Flat indices (sorted, unique) of the modes to target.

    Parameters
    ----------
    targets : "all", "low:K", sequence of int or of index tuples, or bool array
        ``"all"``: every mode. ``"low:K"`` (``basis="dct"`` only): the K×K lowest
        frequencies of every channel, modes ``(c, i, j)`` with ``i, j < K``.
        A sequence of flat indices into the flattened example, or of tuples
        ``(c, i, j)`` (one index per axis of an example). A boolean array of the
        example's shape selects its True entries. A bare tuple of one int per axis,
        such as ``(1, 2, 3)``, is refused as ambiguous: ``[(1, 2, 3)]`` is that mode,
        ``[1, 2, 3]`` three flat indices.
    input_shape : tuple of int
    basis : {"dct", "pixel"}
    """
    input_shape = tuple(input_shape)
    p = math.prod(input_shape)
    targets = host_argument("targets", targets)
    if isinstance(targets, str):
        if targets == "all":
            return np.arange(p)
        if targets.startswith("low:"):
            if basis != "dct":
                raise ValueError(f"targets={targets!r} selects low DCT frequencies, but basis={basis!r}; "
                                 f"pass basis='dct' or list the modes")
            try:
                k = int(targets[4:])
            except ValueError:
                raise ValueError(f"targets={targets!r}: expected 'low:K' with an integer K, e.g. 'low:8'") from None
            h, w = input_shape[-2:]
            if not 1 <= k <= min(h, w):
                raise ValueError(f"targets={targets!r}: K must lie in 1..{min(h, w)} for examples of shape "
                                 f"{input_shape}")
            mask = np.zeros(input_shape, dtype=bool)
            mask[..., :k, :k] = True
            return np.flatnonzero(mask)
        raise ValueError(f"targets must be 'all', 'low:K', a list of modes or a boolean mask, got {targets!r}")
    if (isinstance(targets, tuple) and len(targets) == len(input_shape) > 1
            and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in targets)):
        raise ValueError(f"targets={targets!r} could be one mode given by its index per axis of an example "
                         f"{input_shape} or {len(targets)} flat indices; pass [{targets!r}] for the mode, or a "
                         f"list {list(targets)!r} for flat indices")
    try:
        arr = np.asarray(targets)
    except ValueError:  # a ragged list: flat indices and index tuples mixed, or tuples of several lengths
        raise TypeError(f"targets={targets!r} mixes forms: pass flat int indices, or index tuples of length "
                        f"{len(input_shape)} (one per axis of an example), not both") from None
    if arr.size == 0:
        raise ValueError("targets selects no mode")
    if arr.dtype == bool:
        if arr.shape != input_shape:
            raise ValueError(f"Shape mismatch: a boolean targets mask must have the example's shape "
                             f"{input_shape}, got {arr.shape}")
        flat = np.flatnonzero(arr)
    elif arr.dtype.kind in "iu" and arr.ndim == 1:
        flat = arr.astype(np.int64)
    elif arr.dtype.kind in "iu" and arr.ndim == 2 and arr.shape[1] == len(input_shape):
        if np.any(arr < 0) or np.any(arr >= np.asarray(input_shape)):
            raise ValueError(f"targets contain a mode outside the example's shape {input_shape}: "
                             f"{arr[np.any((arr < 0) | (arr >= np.asarray(input_shape)), axis=1)][:5].tolist()}")
        flat = np.ravel_multi_index(tuple(arr.T), input_shape)
    else:
        raise TypeError(f"targets must be 'all', 'low:K', flat int indices, index tuples of length "
                        f"{len(input_shape)} (one per axis of an example) or a boolean mask; got an array of "
                        f"shape {arr.shape} and dtype {arr.dtype}")
    if flat.size == 0:
        raise ValueError("targets selects no mode (the mask is all False)")
    if np.any(flat < 0) or np.any(flat >= p):
        bad = flat[(flat < 0) | (flat >= p)]
        raise ValueError(f"flat target indices must lie in 0..{p - 1}, got {bad[:5].tolist()}")
    return np.unique(flat)


#: The counts behind the targeted steps' rounding warnings (:func:`_warn_targeted`), kept with the
#: bounds (``TargetedBounds.rounding``, checkpoint pieces included) so that a resumed call warns as
#: the uninterrupted one: steps whose D = 0 was rounding, steps too coarse for D (0), how many more
#: float64 resolves only roughly and the worst such error, D = 0 from uncertified passes.
ROUNDING_COUNTS = dict(rounded=0, coarse=0, risky=0, worst=0.0, unresolved=0)


def _sum_rounding(counts) -> dict:
    """The rounding counts of several pieces as those of one (the worst error is the largest)."""
    counts = [dict(ROUNDING_COUNTS, **c) for c in counts]
    return {k: max((c[k] for c in counts), default=v) if k == "worst" else sum(c[k] for c in counts)
            for k, v in ROUNDING_COUNTS.items()}


def _warn_targeted(rounding: dict, dtype) -> None:
    """The warnings of a call's targeted steps that rounding decided (``rounding``: their counts)."""
    r = dict(ROUNDING_COUNTS, **rounding)
    if r["rounded"]:
        validation.warn(f"{r['rounded']} targeted steps left the float64 features exactly unchanged, but J eps is "
                        f"not 0 (or the features move once eps is scaled up): the shifts are below float64's "
                        f"resolution against features of this size (sigma * size too small next to the features), "
                        f"so D = 0 is rounding and they bound nothing (0); pass a sigma nearer the features' scale "
                        f"(hcrfast.rms_sigma(features, scale))")
    _warn_rounding("targeted steps", r["coarse"], r["risky"], r["worst"])
    if r["unresolved"]:
        validation.warn(f"{r['unresolved']} targeted steps left the features exactly unchanged in uncertified "
                        f"{validation.dtype_name(dtype)} forward passes (certify=False), which may have "
                        f"rounded the shift away: D = 0 is not established and they bound nothing (0); "
                        f"certify=True recomputes the shift in float64")


@dataclass
class TargetedBounds:
    """Per-mode HCR bounds from :func:`targeted_bound`.

    Attributes
    ----------
    std : array, shape = batch.shape
        ``|(Q ε_k)_k| / sqrt(D(z_{ε_k}))`` for targeted modes k, the largest over
        the certified candidates of that mode; 0 for modes not targeted; ``inf``
        where a certified ε with ``D = 0`` moves the mode (``infinite``).
    targeted : array of bool, shape = batch.shape[1:]
        Which modes were targeted.
    modes : numpy array of int, shape (K,)
        Their flat indices; axis 1 of the per-target arrays below follows it.
    divergence : array, shape (B, K)
        ``D(z_ε)`` of the ε that gave each bound (float64).
    eps : array, shape (B, K, *input_shape), or None
        That ε, as applied (float64). None in the ``targeted`` of :func:`hcrfast.bound`, which
        drops each chunk's steps once their bounds are taken (B·K·p values: 12 GB for CIFAR-10's
        2,500 test images with ``low:8``) unless ``keep_targeted_eps=True``.
    std_every_mode : array, shape = batch.shape
        Per example and mode j (targeted or not), the best bound the targeted steps give it: the
        larger of ``std`` and ``max_k |(Q ε_k)_j| / √D_k`` over the steps whose own bound is finite
        and positive, null-space probes' excepted (their D is rounding by design). (5) holds for
        every coordinate with the same ε and D, so each step bounds every mode it moves;
        ``bound(targets=)`` takes these into its bounds. Computed once, with the steps.
    infinite : array of bool, shape = batch.shape
        Modes with a certified bound +inf: the features came out bitwise unchanged from the float64 forward
        passes, which certification takes as exact (a change below float64's rounding of the forward pass is
        not seen; with ``certify=False`` and a float32 model, D = 0 proves nothing and is not taken).
    from_null_space : array of bool, shape (B, K)
        Whether the bound came from a null-space step rather than the Cramér–Rao direction.
    null_dim : array of int, shape (B,), or None
        Dimension of the local null space of J (dense method; see :mod:`hcrfast.dense`
        for the tolerance). None for "lsqr", which does not compute it.
    null_fraction : array, shape (B, K), or None
        ``‖(I − V_r V_rᵀ) q_k‖``: the part of mode k no small feature change reveals.
    lsqr_iterations, lsqr_istop : arrays, shape (B, K, 2), or None
        LSQR work of the two solves (``Jᵀw = q``, ``Jε = w``) per target ("lsqr" only).
    method : str
        "dense" or "lsqr".
    infinite_reasons : list of str
    params : dict
        The parameters used. ``"run"``: what a rerun needs besides (:func:`hcrfast.results.run_record`): the
        batch's positions as ``example_ids`` (no noise is drawn: the steps depend on no ids), ``chunk_size`` in
        ``chunk_unit`` (:data:`CHUNK_UNIT`: rows, not examples; the last size used, after any halving on
        out-of-memory), torch's thread count and the versions; recorded but not compared by ``==``, and absent
        from files written before it was recorded. Joined chunks (:meth:`concatenate`: ``bound(targets=)``'s)
        give each entry where they agree (:func:`hcrfast.results.merged_run`).
    timings : dict
        Seconds per phase, summed over the pieces of examples, and ``"total"``, the call's wall time. With
        ``directions=`` (``params["shared_factorization"]``: what :func:`hcrfast.bound` passes), "jacobian"
        and "decomposition" are the seconds the solve spent making them, before this call, and the total
        counts them too. Where pieces were read back from a checkpoint
        (``params["checkpoint"]["examples_read_back"]``) their phases were timed by the call that computed
        them, and may sum to more than this call's total.
    rounding : dict
        How many targeted steps float64's rounding decided (:data:`ROUNDING_COUNTS`'s keys): the
        counts behind the call's warnings, each such step bounding nothing (0).
    """

    std: object
    targeted: object
    modes: np.ndarray
    divergence: object
    eps: object
    infinite: object
    from_null_space: object
    null_dim: object
    null_fraction: object
    lsqr_iterations: object
    lsqr_istop: object
    method: str
    std_every_mode: object = None
    infinite_reasons: list = field(default_factory=list)
    params: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    rounding: dict = field(default_factory=lambda: dict(ROUNDING_COUNTS))

    _ARRAYS = ("std", "targeted", "divergence", "eps", "infinite", "from_null_space", "null_dim",
               "null_fraction", "lsqr_iterations", "lsqr_istop", "std_every_mode")

    #: The fields with one row per example (all arrays but ``targeted``).
    _PER_EXAMPLE = tuple(k for k in _ARRAYS if k != "targeted")

    __repr__ = short_repr
    __eq__ = same_result
    __hash__ = None

    def with_every_mode(self) -> TargetedBounds:
        """This, with ``std_every_mode`` computed from ``eps`` (one DCT of every step); this itself where it is
        computed already: with null-space probes it also holds the bounds of the row-space steps a probe
        replaced, which ``eps`` no longer holds (recomputed, 26 of 32 came out lower: a review)."""
        if self.std_every_mode is not None:
            return self
        if self.eps is None:
            raise ValueError("with_every_mode() computes each step's bounds on every mode from the steps, and "
                             "these targeted bounds do not keep them: pass keep_targeted_eps=True to "
                             "hcrfast.bound(targets=...), or use hcrfast.targeted_bound, which keeps them")
        xp = get_array_module(self.std)
        cross = _cross_bounds(self, self.params["basis"], tuple(self.std.shape[1:]))
        return dataclasses.replace(self, std_every_mode=xp.maximum(self.std, cross.reshape(self.std.shape)))

    def to_numpy(self) -> TargetedBounds:
        """A copy whose arrays are NumPy arrays on the host."""
        return dataclasses.replace(self, **{k: None if getattr(self, k) is None else to_host(getattr(self, k))
                                            for k in self._ARRAYS})

    def to_arrays(self) -> tuple[dict, dict]:
        """Its arrays as NumPy arrays by field name, and its other fields (JSON-able): what
        :meth:`hcrfast.Bounds.save` and checkpoint files hold. :meth:`from_arrays` inverts it."""
        h = self.to_numpy()
        arrays = {k: getattr(h, k) for k in self._ARRAYS + ("modes",) if getattr(h, k) is not None}
        return arrays, dict(method=h.method, infinite_reasons=list(h.infinite_reasons), params=h.params,
                            timings=h.timings, rounding=h.rounding)

    @classmethod
    def from_arrays(cls, arrays: dict, meta: dict) -> TargetedBounds:
        made = cls(**{k: arrays.get(k) for k in cls._ARRAYS + ("modes",)}, **meta)
        # Files saved before std_every_mode was kept (2026-11-26) hold the steps it comes from.
        return made.with_every_mode() if made.std_every_mode is None and made.eps is not None else made

    _FORMAT = "hcrfast.TargetedBounds/1"

    def save(self, path) -> None:
        """Write every field to the ``.npz`` file ``path`` (atomically; ``numpy.load`` reads it too)."""
        arrays, meta = self.to_arrays()
        meta["params"] = revision_saved(meta["params"], CHECKPOINT_FORMAT)
        save_npz(path, self._FORMAT, arrays, meta)

    @classmethod
    def load(cls, path) -> TargetedBounds:
        """The :class:`TargetedBounds` that :meth:`save` wrote to ``path`` (NumPy arrays); one another revision of
        hcrfast computed keeps it in ``params["revision"]`` (:meth:`hcrfast.Bounds.load`)."""
        arrays, meta = load_npz(path, cls._FORMAT, "TargetedBounds.save")
        meta.pop("format")
        cls.check_fields(path, cls._FORMAT, "TargetedBounds.save", arrays, meta)
        meta["params"] = revision_loaded(meta.get("params", {}), CHECKPOINT_FORMAT)
        return cls.from_arrays(arrays, meta)

    #: The arrays every saved TargetedBounds holds (the others are None for one method or the other, or dropped).
    _SAVED_ALWAYS = ("std", "targeted", "modes", "divergence", "infinite", "from_null_space")

    @classmethod
    def check_fields(cls, path, fmt: str, writer: str, arrays: dict, meta, what: str = "") -> None:
        """Refuse (:func:`hcrfast.results.malformed`) the saved fields of targeted bounds that
        :meth:`from_arrays` cannot make into one: arrays or ``method`` missing, other entries than fields."""
        if not isinstance(meta, dict):
            raise malformed(path, fmt, writer, f"its {what}meta entry is a JSON {type(meta).__name__}, not an object")
        require(path, fmt, writer, arrays, cls._SAVED_ALWAYS, f"{what}arrays")
        require(path, fmt, writer, meta, ("method",), f"{what}meta header")
        fields = {f.name for f in dataclasses.fields(cls)} - set(cls._ARRAYS) - {"modes"}
        unknown = sorted(set(meta) - fields)
        if unknown:
            raise malformed(path, fmt, writer, f"its {what}meta header holds entries that are not fields of "
                                               f"TargetedBounds: {', '.join(map(repr, unknown))}")

    @classmethod
    def concatenate(cls, parts, xp=np) -> TargetedBounds:
        """The targeted bounds of consecutive chunks of one batch as one, its arrays in ``xp``: the
        per-example rows stacked, the reasons numbered over the whole batch, the timings summed, ``params["run"]``
        the whole batch's (:func:`hcrfast.results.merged_run`). Parts made with other modes, method or parameters (noise, size,
        basis, ...) are refused by name."""
        parts = list(parts)
        if not parts:
            raise ValueError("TargetedBounds.concatenate([]): pass at least one part")
        first = parts[0]
        for i, part in enumerate(parts[1:], 1):
            if part.method != first.method:
                raise ValueError(f"TargetedBounds.concatenate: part {i} was made by method {part.method!r}, part 0 "
                                 f"by {first.method!r}; pass the chunks of one call")
            if not np.array_equal(np.asarray(part.modes), np.asarray(first.modes)):
                raise ValueError(f"TargetedBounds.concatenate: part {i} targets other modes than part 0 "
                                 f"({len(part.modes)} against {len(first.modes)}); pass the chunks of one call")
            differ = [k for k in _SAME_PROBLEM if repr(part.params.get(k)) != repr(first.params.get(k))]
            if differ:
                k = differ[0]
                raise ValueError(f"TargetedBounds.concatenate: part {i} has {k}={part.params.get(k)!r}, part 0 "
                                 f"{first.params.get(k)!r}" + (f" (and {', '.join(differ[1:])} differ)" if differ[1:]
                                                              else "") + "; pass the chunks of one call")
            # an array some parts hold and others dropped (eps without keep_targeted_eps): NumPy's own error, or
            # (the part without it first) the others' silently dropped
            held = [k for k in cls._PER_EXAMPLE if (getattr(part, k) is None) != (getattr(first, k) is None)]
            if held:
                k = held[0]
                raise ValueError(f"TargetedBounds.concatenate: part {i} {'lacks' if getattr(part, k) is None else 'has'}"
                                 f" .{k}, part 0 {'has' if getattr(part, k) is None else 'lacks'} it (kept by one call, "
                                 f"dropped by the other: keep_targeted_eps for eps); pass the chunks of one call")
        rows = {k: None if getattr(first, k) is None else xp.concatenate([xp.asarray(getattr(p, k)) for p in parts])
                for k in cls._PER_EXAMPLE}
        std = rows["std"]
        value = to_host(std.reshape(std.shape[0], -1)[:, xp.asarray(first.modes)])
        params = first.params
        if any("run" in p.params for p in parts):   # the whole batch's positions, and what its chunks agree on
            params = dict(params, run=merged_run(
                [p.params.get("run") for p in parts], np.arange(std.shape[0]),
                caps=[_most_rows(p.std.shape[0], len(p.modes), p.params.get("null_probes")) for p in parts]))
        return dataclasses.replace(
            first, **rows, params=params,
            infinite_reasons=_infinite_reasons(value, first.modes, tuple(std.shape[1:]), first.params["basis"],
                                               to_host(rows["from_null_space"])),
            timings={k: sum(p.timings.get(k, 0.0) for p in parts) for k in first.timings},
            rounding=_sum_rounding(p.rounding for p in parts))

    def summary(self) -> str:
        """A few lines: method, targeted-bound quantiles, infinities, timings."""
        h = self.to_numpy()
        B = h.std.shape[0]
        vals = h.std.reshape(B, -1)[:, h.modes]
        noise = self.params.get("noise") or f"Gaussian(sigma={self.params.get('sigma')})"  # older files: sigma only
        note = revision_line(self.params)   # (a result another revision of hcrfast computed: said first)
        lines = ([note] if note else []) + [(f"targeted HCR bounds ({self.method}) for {counted(B, 'example')} x "
                  f"{counted(len(self.modes), str(self.params.get('basis', '?')) + ' mode')} (noise={noise.split(': D(z)')[0]}, "
                  f"size={self.params.get('size', float('nan')):.4g})"),
                 quantile_line(vals)]
        if h.null_dim is not None:
            lines.append(f"  local null space of J (singular values at most sqrt(max(n, p))·eps of its dtype × the "
                         f"largest): dimension median {np.median(h.null_dim):.0f}, max {np.max(h.null_dim)}")
        n_inf = int(h.infinite.sum())
        if n_inf:
            lines.append(f"  {n_inf} (example, mode) pairs have bound +inf (D = 0); see .infinite_reasons")
        r = dict(ROUNDING_COUNTS, **self.rounding)
        if r["rounded"] + r["coarse"] + r["unresolved"]:
            lines.append(f"  {counted(r['rounded'] + r['coarse'] + r['unresolved'], 'targeted step')} bound nothing "
                         f"(0): rounding decided their D (sigma * size too small next to the features"
                         + (", or uncertified passes" if r["unresolved"] else "") + "); see .rounding")
        lines.append(self._seconds_line(B))
        return "\n".join(lines)

    def _seconds_line(self, B: int) -> str:
        """The summary's timings; where pieces were read back from a checkpoint, which of them were timed by an
        earlier call (the phases, summed over every piece) and which by this one (the total): otherwise a
        total under its own phases reads as a clock gone wrong."""
        saved = self.params.get("checkpoint")
        read = saved.get("examples_read_back", 0) if isinstance(saved, dict) else 0
        if not read or "total" not in self.timings:
            # shared directions: made by the solve (bound's) before this call, and counted in the total
            shared = " (the solve's, deriving the directions; in the total)"
            return "  seconds: " + ", ".join(
                f"{k} {v:.2f}" + (shared if k == "decomposition" and self.params.get("shared_factorization") else "")
                for k, v in self.timings.items())
        phases = ", ".join(f"{k} {v:.2f}" for k, v in self.timings.items() if k != "total")
        return (f"  seconds: phases summed over the pieces, {read} of {counted(B, 'example')} read back from the "
                f"checkpoint (timed when an earlier call computed them): {phases}; this call: total "
                f"{self.timings['total']:.2f}")


#: The params that make targeted bounds one problem: chunks that :meth:`TargetedBounds.concatenate` joins share
#: them (how a chunk's J was built, read back or not, may differ).
_SAME_PROBLEM = ("noise", "sigma", "size", "basis", "certify", "null_probes", "n_features", "n_inputs", "dtype")


def _infinite_reasons(value: np.ndarray, modes, input_shape, basis: str, from_null=None) -> list[str]:
    """One line per (example, mode) whose targeted bound ``value`` (B, K) is +inf, naming the step that
    gave it: a null-space probe (``from_null`` (B, K) True) or the mode's Cramér–Rao direction."""
    reasons = []
    for b, k in zip(*np.nonzero(np.isinf(value))):
        mode = np.unravel_index(modes[k], input_shape)
        step = ("a step in the local null space of the Jacobian" if from_null is not None and from_null[b, k]
                else "the step aimed at this mode")
        reasons.append(
            f"example {b}, {basis} mode {tuple(int(i) for i in mode)}: {step} "
            f"leaves a(theta+eps) == a(theta) in float64, also when scaled up until float64 would resolve a "
            f"shift (D = 0), so no unbiased estimator of this mode exists locally (bound +inf; exact where the "
            f"features ignore it, as behind dead ReLUs; behind a unit that float64 saturates, tanh(25) == 1, the "
            f"exact bound is finite but beyond float64); an estimator with a prior (biased) may still "
            f"reconstruct it")
    return reasons


#: A null-space probe's shift is of the order of float64's rounding of the features, by design, and skips the
#: rounding guards: its D is taken at ``|z_j| + _NULL_PROBE_ROUNDING·u·m_j`` per feature (u = 2^-53, m_j the
#: rounding scale: the clean feature, or :func:`hcrfast.algorithm._rounding_magnitude`), the upper end of
#: what z's rounding can hide, so that its bound stays below the exact one. (A direction that float32's rank
#: tolerance took for null, singular value 5e-7 of the largest, gave bounds 1.0000009× the exact
#: least-squares std from its float64 D, shift 1e-9 against features of order 1.) A probe whose features did
#: not move at all keeps D = 0 (+inf, where proven).
_NULL_PROBE_ROUNDING = 64
_U64 = float(np.finfo(np.float64).eps) / 2


def _evaluate(model, model64, batch, f0, example_of, eps, q, *, certify, noise, chunk, null_probes=False,
              jacobian="reverse", magnitude=None, slope=None):
    """Certify the candidates ``eps`` (R, p) of examples ``example_of`` (R,) for the modes ``q`` (R, p).

    Returns ``(eps64, d, value, rounding)``: ε as applied, ``D(z_ε)`` and ``|q·ε| / sqrt(D)``
    (+inf where D = 0 and q·ε ≠ 0, unless the step was only rounded away; 0 where both vanish), all
    float64, and the counts behind the rounding warnings (:func:`_warn_targeted`), which the caller
    gives once for the whole call. ``null_probes``: the candidates are null-space steps, whose shifts
    are rounding by design (not counted as such).
    """
    xp = array_module_for(batch.device)
    R = eps.shape[0]
    eps64 = xp.empty((R, eps.shape[1]))
    d = xp.empty(R)
    rel = xp.empty(R)  # float64's rounding error in each shift's D (algorithm._rounding_error)
    moves = xp.empty(R, dtype=bool)  # z != 0
    example_of = xp.asarray(example_of)
    scale = f0 if magnitude is None else magnitude
    # Certified steps take a(θ) from one float64 pass per example, not one per step: half the passes
    # (an example's K targeted steps are K rows at one θ). A row whose shift is not far above float64's
    # resolution (or is 0) is certified again with a(θ) in its own pieces (_certified_shift), so that an
    # unchanged row comes out bitwise 0 whatever the batch shapes: what decides D = 0 stays as it was.
    # Null-space probes are rounding by design: every one in pieces of its own.
    paired = not certify or null_probes
    still = None if paired else _features(model64, batch.double())

    def shift(rows, pair):
        """ε as applied and z of the rows ``rows`` (a slice or indices); ``pair``: a(θ) in their own pieces."""
        at = example_of[rows]
        x = batch[to_torch(at).to(batch.device)]
        if not certify:
            return _applied_shift(model, x, eps[rows].astype(from_torch(x[:1]).dtype), f0[at])
        if pair:
            return _certified_shift(model64, x, eps[rows])
        _, pert, e64 = _applied64(x, eps[rows])
        return from_torch(e64), from_torch(_features(model64, pert) - still[to_torch(at).to(batch.device)])

    def store(rows, e64, z64):
        eps64[rows] = e64
        at = example_of[rows]
        at_slope = None if slope is None else slope[at]
        far = _far_slope(model64 if certify else model, batch, to_host(at), e64, jacobian) \
            if magnitude is not None else None
        mag = _step_magnitude(xp.abs(scale[at].reshape(z64.shape)), far, e64, z64)
        rel[rows] = _rounding_error(mag, z64)
        moved = xp.any(z64 != 0, axis=1)
        if null_probes:  # shifts of the order of their rounding: D at the bracket's upper end (see there)
            z64 = xp.where(moved[:, None], xp.abs(z64) + _NULL_PROBE_ROUNDING * _U64 * mag, z64)
        elif magnitude is not None:   # certified: D past float64's rounding of the passes (algorithm._widened)
            z64 = _widened(z64, mag, e64, at_slope, moved)
        d[rows] = divergence_of(noise, z64)
        moves[rows] = moved

    def work(rows, pair):
        store(rows, *shift(rows, pair))

    chunk.over(R, lambda r0, r1: work(slice(r0, r1), paired), batch.device)
    if not paired:
        again = to_host(xp.flatnonzero((rel > _ROUNDING_TOLERANCE) | ~moves))
        if again.size:
            chunk.over(again.size, lambda r0, r1: work(xp.asarray(again[r0:r1]), True), batch.device)
    underflow = int(to_host(((d == 0) & moves).sum()))
    if underflow:
        raise ValueError(divergence_underflow(noise, underflow))
    coord = coordinates_down(xp.abs(xp.einsum("rp,rp->r", eps64, q)), xp.sqrt(xp.einsum("rp,rp->r", eps64, eps64)),
                             q.shape[1])
    zero_d = d == 0
    value = coord / xp.sqrt(xp.where(zero_d, 1.0, d))
    # D = 0 proves +inf only from float64 passes (taken as exact): uncertified float32 ones may only
    # have rounded the shift away, and such a step bounds nothing (0); so may float64 ones where the
    # same direction, scaled up, moves the features.
    exact = certify or batch.dtype == torch.float64
    proven = (coord > 0) & exact
    rounding = dict(ROUNDING_COUNTS)
    if exact:
        rows = np.flatnonzero(to_host(zero_d & proven))
        if rows.size:  # probed in slices of chunk rows, as certified (the rows may be every example x mode)
            lost = np.zeros(rows.size, dtype=bool)
            owner = to_host(example_of)

            def probe(r0, r1):
                lost[r0:r1] = _rounded_away(model64 if certify else model,
                                            batch[torch.as_tensor(owner[rows[r0:r1]])],
                                            eps64[xp.asarray(rows[r0:r1])], jacobian)

            chunk.over(rows.size, probe, batch.device)
            if lost.any():
                proven[xp.asarray(rows[lost])] = False
            if not null_probes:  # a generic null space's steps are rounding by design
                rounding["rounded"] = int(lost.sum())
        if not null_probes:  # a generic null space's steps are rounding by design: huge finite bounds, valid
            coarse, rounding["risky"], rounding["worst"] = _coarse_shifts(rel)
            value = xp.where(coarse, 0.0, value)
            rounding["coarse"] = int(to_host(coarse.sum()))
    value = xp.where(zero_d, xp.where(proven, xp.inf, 0.0), value)
    if not exact and not null_probes:  # a null-space candidate is one of several for its pair, not its bound
        rounding["unresolved"] = int(to_host((zero_d & (coord > 0)).sum()))
    return eps64, d, value, rounding


@dataclass
class DenseDirections:
    """Cramér–Rao directions of every (example, mode) pair from the dense path, as torch float64
    tensors on the batch's device: what :func:`targeted_bound` certifies.

    Attributes
    ----------
    eps : torch.Tensor, shape (B, K, p)
        ``(JᵀJ)⁺ q_k`` scaled to ``‖J ε‖ = 1``.
    null_part : torch.Tensor, shape (B, K, p)
        ``(I − J⁺J) q_k``.
    null_fraction : torch.Tensor, shape (B, K)
    null_dim : torch.Tensor, shape (B,), int64
    jacobian : str
        "forward" or "reverse": how J was built (or the Krylov basis' products were taken).
    seconds : tuple of float
        (building J, factoring J and deriving the directions); building J is 0 when it was shared.
    method : str
        "dense" (J's factorization) or "krylov" (:func:`hcrfast.krylov.directions`: the
        direction within the Krylov space of ``bound(solver="krylov")``; no null-space parts).
    """

    eps: torch.Tensor
    null_part: torch.Tensor
    null_fraction: torch.Tensor
    null_dim: torch.Tensor
    jacobian: str
    seconds: tuple = (0.0, 0.0)
    method: str = "dense"

    @classmethod
    def empty(cls, B: int, K: int, p: int, jacobian: str, device, method: str = "dense") -> "DenseDirections":
        eps = torch.empty((B, K, p), dtype=torch.float64, device=device)
        return cls(eps=eps, null_part=torch.zeros_like(eps) if method == "krylov" else torch.empty_like(eps),
                   null_fraction=torch.zeros((B, K), dtype=torch.float64, device=device),
                   null_dim=torch.zeros(B, dtype=torch.int64, device=device), jacobian=jacobian, method=method)

    def fill(self, start: int, stop: int, solver: dense.MinNormSolver, dirs: dense.CramerRaoDirections) -> None:
        """Write the directions of examples ``start:stop`` from their factorization."""
        self.eps[start:stop] = dirs.eps
        self.null_part[start:stop] = dirs.null_part
        self.null_fraction[start:stop] = dirs.null_fraction
        self.null_dim[start:stop] = solver.null_dim


def resolve_method(method: str, n: int, p: int) -> str:
    """The method ``targeted_bound(method=...)`` uses: "auto" is "dense" up to
    :data:`DENSE_MAX_INPUTS` inputs while ``n·p + p² ≤`` :data:`DENSE_MAX_VALUES`, else "lsqr"."""
    if method != "auto":
        return method
    return "dense" if p <= DENSE_MAX_INPUTS and n * p + p * p <= DENSE_MAX_VALUES else "lsqr"


def _dense_directions(model, batch, qmat, n, *, jacobian, chunk) -> DenseDirections:
    """Build and factor every example's J (:func:`hcrfast.dense.min_norm_solver`), chunk by chunk,
    and derive the directions of the modes ``qmat`` (K, p) from it."""
    B, K, p = batch.shape[0], qmat.shape[0], qmat.shape[1]
    q = to_torch(qmat)
    out = DenseDirections.empty(B, K, p, dense.resolve_jacobian_mode(jacobian, n, p), batch.device)
    seconds = [0.0, 0.0]

    def work(start, stop):
        t0 = time.perf_counter()
        # "auto" may fall back to reverse mode (an operation without forward AD): the later chunks and
        # the products after the directions (rounding, certification) take the mode that ran.
        fell_back = out.jacobian != dense.resolve_jacobian_mode(jacobian, n, p)   # an earlier chunk's J: VJPs
        asked = "reverse" if fell_back else jacobian
        J, out.jacobian = dense.jacobian(model, batch[start:stop], mode=asked, chunk_size=chunk, skip_zero_rows=True,
                                         return_mode=True)
        t1 = time.perf_counter()
        solver = dense.min_norm_solver(J)
        out.fill(start, stop, solver, solver.directions(q, J))
        seconds[0] += t1 - t0
        seconds[1] += time.perf_counter() - t1

    _in_chunks(B, max(1, _DENSE_ELEMENTS // (n * p + p * p + 2 * K * p)), work, batch.device)
    out.seconds = tuple(seconds)
    return out


def _lsqr_directions(model, batch, qmat, *, jacobian, options, chunk, timings):
    """``(JᵀJ)⁺ q_k`` for every (example, mode) by two batched LSQR solves, scaled to ‖Jε‖ = 1.

    Returns ``(eps (B·K, p) float64, itn (B·K, 2), istop (B·K, 2))`` as solver arrays.
    """
    xp = array_module_for(batch.device)
    B, K, p = batch.shape[0], qmat.shape[0], qmat.shape[1]
    R = B * K
    dtype = from_torch(batch[:1]).dtype
    eps = xp.empty((R, p))
    itn = xp.empty((R, 2), dtype=xp.int64)
    istop = xp.empty((R, 2), dtype=xp.int64)
    t0 = time.perf_counter()

    def work(r0, r1):
        rows = np.arange(r0, r1)
        x = batch[torch.as_tensor(rows // K, device=batch.device)]
        q = qmat[xp.asarray(rows % K)].astype(dtype)
        op = TorchJacobian(model, x, mode=jacobian)
        first = lsqr(Transposed(op), q, options)        # w = (Jᵀ)⁺ q
        second = lsqr(op, first.x, options)             # ε = J⁺ w = (JᵀJ)⁺ q
        lin = kernels.row_norms(op.matvec(second.x), impl=options.kernels).astype(xp.float64)
        e = second.x.astype(xp.float64)
        eps[r0:r1] = e * xp.where(lin > 0, 1.0 / xp.where(lin > 0, lin, 1.0), 0.0)[:, None]
        itn[r0:r1] = xp.stack([first.itn, second.itn], axis=1)
        istop[r0:r1] = xp.stack([first.istop, second.istop], axis=1)

    chunk.over(R, work, batch.device)
    timings["lsqr"] = time.perf_counter() - t0
    return eps, itn, istop


@accepts_per_feature_sigma(scale_inputs=True)
def targeted_bound(model, batch, sigma, *, targets="all", size: float = 1 / 200, method: str = "auto",
                   basis: str = "dct", certify: bool = True, lsqr: LSQROptions | None = None,
                   jacobian: str = "auto", null_probes: bool = True,
                   chunk_size: int | None = None, tf32: bool = False, progress: bool = False,
                   checkpoint=None, directions: DenseDirections | None = None) -> TargetedBounds:
    """HCR bounds for chosen modes, each from a perturbation aimed at that mode.

    Parameters
    ----------
    model : torch.nn.Module
        Input batch (B, ...) → features (B, ...); must not mix examples. Eval mode
        (a model in training mode is switched for the call, with a warning).
    batch : torch.Tensor, shape (B, ...)
        The inputs θ, on the model's device and in its dtype (a float16 Module and batch are solved as a
        float32 copy, with a warning, as :func:`hcrfast.bound` does).
    sigma : float, array of one std per feature, or hcrfast.Gaussian
        Standard deviation of the Gaussian dithering of every feature, or one per
        feature (as :func:`hcrfast.bound`).
    targets : "all", "low:K", sequence of modes, or bool mask
        The modes to bound; see :func:`parse_targets`.
    size : float
        s: each direction is scaled so that its linearized feature shift has
        norm s·σ (D ≈ s²), the size of Algorithm 1's start vectors.
    method : {"auto", "dense", "lsqr"}
        How the directions are found (module docstring). "auto": "lsqr" when ``lsqr``
        options are given (as :func:`hcrfast.bound`'s "auto" solver), else "dense" when an
        example has at most :data:`DENSE_MAX_INPUTS` values and its J and V fit in
        :data:`DENSE_MAX_VALUES` float64 values, else "lsqr".
    basis : {"dct", "pixel"}
        Q: orthonormal 2-D DCT-II per channel, or the identity.
    certify : bool
        Compute ``z_ε`` in float64 with a float64 copy of the model.
    lsqr : LSQROptions, optional
        For ``method="lsqr"`` (which ``"auto"`` then takes); default :data:`TARGETED_LSQR` for
        the batch's dtype with ``iter_lim = LSQR_ITER_FACTOR · max(n, p)``. With
        ``method="dense"`` (or ``directions=``) no LSQR runs, and a warning says they go unused.
    jacobian : {"auto", "forward", "reverse"}
        "dense": forward mode (p JVPs) or reverse mode (n VJPs) for the Jacobian,
        "auto" picks the fewer products. "lsqr": the products of
        :class:`hcrfast.bindings.TorchJacobian` ("auto" means "reverse").
    null_probes : bool
        "dense": also certify steps in the local null space of J for modes with a
        component there (module docstring). With False, the bounds are those of
        the Cramér–Rao directions alone (what "lsqr" computes).
    chunk_size : int, optional
        Rows, not examples: the most example rows (examples × modes, or examples × tangents while
        ``method="dense"`` builds J) per batched pass; automatic when None. :func:`hcrfast.bound`'s
        ``chunk_size`` counts examples (all their restarts together), so one number gives the two calls
        very different memory: here ``chunk_size=64`` with ``targets="low:8"`` (64 modes) passes one example
        at a time. The batch is worked through in pieces of ``chunk_size // K`` examples of K modes (at
        least 1). A pass that runs out of memory is halved, for the rest of the call; ``params["run"]``
        records the last size in these rows (``params["run"]["chunk_unit"]``).
    tf32 : bool
        Allow TF32 float32 matmuls and convolutions on the GPU (see :func:`hcrfast.bound`).
    progress : bool
        Print a line per piece of examples on stderr (examples done, elapsed time, ETA), and one where a
        pass is halved for memory. The batch is worked through in pieces of examples whose modes fill one
        batched pass (``chunk_size`` rows), with or without progress and checkpoint.
    checkpoint : str or os.PathLike, optional
        A folder: each finished piece of examples is written there at once (atomically), and
        the same call made again after a crash or an interrupt reads them back and computes
        only the missing examples (as :func:`hcrfast.bound`'s ``checkpoint``; a call with
        another model, batch, σ or arguments is refused with
        :class:`hcrfast.CheckpointMismatchError`). ``params["checkpoint"]`` says how many
        examples were read back.
    directions : DenseDirections, optional
        Directions for this batch and these targets, already computed (``directions.method``:
        "dense" or "krylov", which then names the method) from
        the same Jacobians (what :func:`hcrfast.bound` passes when its dense solve has built
        and factored every J): the certification starts from them. Implies "dense".

    Returns
    -------
    TargetedBounds
    """
    t_start = time.perf_counter()
    threads = torch.get_num_threads()   # (params["run"]: the float32 passes' rounding follows it)
    law = as_noise(validation.sigma_or_law(sigma, laws=False))
    if not isinstance(law, Gaussian):
        raise NotImplementedError(f"targeted_bound needs Gaussian noise (its directions are scaled to a Gaussian "
                                  f"feature shift); got {law.describe().split(':')[0]}: hcrfast.bound takes that law")
    sigma = law.sigma
    size = validation.positive_float("size", size, "; typical values are 1/200, 1/500, 1/1000")
    validation.choice("method", method, METHODS)
    if directions is not None and method == "lsqr":
        raise ValueError("method='lsqr' finds its own directions, but directions= were given; "
                         "pass method='auto' or 'dense' with them, or drop directions=")
    shared = directions is not None
    validation.choice("basis", basis, ("dct", "pixel"))
    validation.choice("jacobian", jacobian, dense.JACOBIAN_MODES)
    validation.lsqr_options(lsqr)
    chunk_size = validation.chunk_size(chunk_size)
    for name, value in (("certify", certify), ("null_probes", null_probes), ("tf32", tf32), ("progress", progress)):
        validation.flag(name, value)
    checkpoint = validation.checkpoint_folder(checkpoint)
    if shared and (progress or checkpoint is not None):
        raise ValueError("directions= are computed for the whole batch at once; progress= and checkpoint= "
                         "work in pieces of it: drop directions= or both of them")
    if directions is not None and not isinstance(directions, DenseDirections):
        raise TypeError(f"directions must be None (targeted_bound finds them) or an hcrfast.targeted.DenseDirections "
                        f"(what hcrfast.bound passes from its dense solve), got {type(directions).__name__} "
                        f"{directions!r}; to choose how the directions are found pass method= "
                        f"({', '.join(map(repr, METHODS))})")
    batch = validation.model_and_batch(model, batch, basis)
    model, batch = validation.float32_for_float16(model, batch)
    input_shape = tuple(batch.shape[1:])
    p = math.prod(input_shape)
    modes = parse_targets(targets, input_shape, basis)
    noise = law

    with validation.entry_point(model, batch.device, tf32=tf32):
        features = validation.features_of(model, batch)
        lsqr_mode = "reverse" if jacobian == "auto" else jacobian
        validation.check_independent(model, batch, features, mode=lsqr_mode, tf32=tf32)
        xp = array_module_for(batch.device)
        B, n = features.shape
        K = len(modes)
        if directions is not None:
            method = directions.method
        elif method == "auto" and lsqr is not None:
            method = "lsqr"  # options given for LSQR are a request for it, as bound's "auto" solver reads them
        else:
            method = resolve_method(method, n, p)
        if method != "lsqr" and lsqr is not None:  # (no LSQR runs: not even its kernels choice is used)
            changed = [f.name for f in dataclasses.fields(LSQROptions)
                       if getattr(lsqr, f.name) != getattr(LSQROptions(), f.name)]
            source = "given by directions=" if shared else "from each example's J"
            validation.warn(f"method={method!r} finds the directions {source} and runs no LSQR, so these lsqr "
                            f"options go unused: {', '.join(changed) or 'LSQROptions() (all defaults)'}; pass "
                            f"method='lsqr'{' without directions=' if shared else ''} to find the directions by "
                            f"LSQR with them")
        if directions is not None and tuple(directions.eps.shape) != (B, K, p):
            raise ValueError(f"directions= holds {tuple(directions.eps.shape)} (examples, modes, inputs) but this "
                             f"call has {(B, K, p)}; pass the directions computed for this batch and these "
                             f"targets, or None")
        if method == "lsqr" and batch.dtype not in TARGETED_LSQR and lsqr is None:
            raise NotImplementedError(f"no default LSQR settings for dtype {batch.dtype}; "
                                      f"pass lsqr=LSQROptions(...)")
        options = (dataclasses.replace(TARGETED_LSQR[batch.dtype], iter_lim=LSQR_ITER_FACTOR * max(n, p))
                   if lsqr is None and method == "lsqr" else lsqr)
        chunk = _Rows(chunk_size or _auto_chunk(model, batch, 1, n, p, lsqr_mode), progress)   # (rows, not examples)
        per = max(1, chunk.size // K)   # examples per piece: planned before any halving, as the checkpoint records
        model64 = validation.float64_model(model, batch, certify)
        validation.warn_uncertified(batch, certify)
        if certify or batch.dtype == torch.float64:
            validation.check_repeatable(model64, batch, validation.noise_shift(noise, size), jacobian=lsqr_mode)
        # (inside hcrfast.bound's call, a chunk of it: bound checks the model over its whole call already)
        unchanged = None if validation.nested(model) else _StillTheSameFunction(
            model64, batch, validation.noise_shift(noise, size),
            torch.float64 if model64 is not model or batch.dtype == torch.float64 else batch.dtype, model, features,
            1e-2 if tf32 and batch.dtype == torch.float32 else max(1e-4, 4 * torch.finfo(batch.dtype).eps))
        qmat = dense.basis_vectors(input_shape, basis, modes, batch.device)      # (K, p) float64
        params = {"sigma": sigma, "noise": noise.describe(), "size": size, "method": method, "basis": basis, "certify": certify,
                  "jacobian": None, "lsqr": dataclasses.asdict(options) if method == "lsqr" else None,
                  "n_targets": K, "dtype": validation.dtype_name(batch.dtype), "device": str(batch.device),
                  "n_features": n, "n_inputs": p, "null_probes": bool(null_probes and method == "dense"),
                  "null_component_tol": NULL_COMPONENT_TOL, "shared_factorization": shared,
                  "null_steps": list(NULL_STEPS), "checkpoint": None}

        def piece(start: int, stop: int) -> TargetedBounds:
            """The targeted bounds of examples ``start:stop``."""
            if directions is None:  # (bound(), which shares its directions, checked its chunks already)
                bad = _nonfinite_derivative(model, batch[start:stop])
                if bad:
                    raise infinite_derivative(bad, start)
            return _targeted_piece(model, model64, batch[start:stop], from_torch(features[start:stop]), qmat, modes,
                                   noise=noise, size=size, method=method, jacobian=jacobian, options=options,
                                   null_probes=null_probes, chunk=chunk, chunk_size=chunk_size,
                                   directions=directions, params=params)

        if directions is not None:  # computed for the whole batch at once (bound's shared factorization)
            result = piece(0, B)
            if unchanged is not None:
                unchanged.check()
        else:  # always in the same pieces, so that progress= and checkpoint= leave the numbers as they are
            result = _in_pieces(piece, B, per, xp, progress=progress, checkpoint=checkpoint,
                                key=lambda: dict(  # hashed only for a checkpoint
                                    format=CHECKPOINT_FORMAT, model=key_model_fingerprint(model),
                                    batch=key_batch_fingerprint(model, batch),
                                    noise=repr(noise), size=size, modes=sha256_tensors(modes), basis=basis,
                                    method=method, certify=bool(certify), jacobian=jacobian, lsqr=params["lsqr"],
                                    null_probes=bool(null_probes), tf32=bool(tf32)),
                                features=features, unchanged=unchanged)
    # this call's, as hcrfast.bound's: the whole batch (pieces read back included), the last rows per pass
    result.params = dict(result.params, run=dict(
        run_record(np.arange(B), None, threads), chunk_size=min(chunk.size, _most_rows(B, K, params["null_probes"])),
        chunk_unit=CHUNK_UNIT))
    # directions= were made by the caller's solve (bound's), before this call: their phases count in the total
    result.timings["total"] = time.perf_counter() - t_start + (sum(directions.seconds) if shared else 0.0)
    _warn_targeted(result.rounding, batch.dtype)  # once for the call, pieces read back included
    if not (method == "dense" and null_probes):
        # A mode J does not see gets no direction, hence bound 0; only the dense null-space probes tell it +inf.
        unseen = int(to_host((result.std.reshape(B, -1)[:, xp.asarray(modes)] == 0).sum()))
        if unseen:
            validation.warn(f"{unseen} (example, mode) pairs got no direction (J does not see the mode there): "
                            f"their bound is 0, which guarantees nothing; method='dense' with null_probes=True "
                            f"certifies +inf where the features do not move")
    return result


#: What a :func:`targeted_bound` checkpoint's piece files hold (:mod:`hcrfast.checkpoint`); bumped with
#: hcrfast.bound's at every change of the numbers a piece holds (/7: the dense solve's rank rule), and alone at
#: /8 (2026-12-02): ``std_every_mode`` keeps the bounds that the row-space steps a null-space probe replaced gave
#: the other modes (they were lost, so a /7 piece's can be lower; bound's own pieces held no probes then).
CHECKPOINT_FORMAT = "hcrfast.targeted_bound checkpoint/8"  # /2 … /7: as hcrfast.bound checkpoint/2 … /7


def _in_pieces(piece, B: int, per: int, xp, *, progress: bool, checkpoint, key, features,
               unchanged=None) -> TargetedBounds:
    """``piece(start, stop)`` over the batch in pieces of ``per`` examples, each written to the
    checkpoint folder (if any; ``key()`` its key) as it finishes; the pieces an earlier call finished
    are read back. A call that fails before its first piece is saved takes back the key it wrote."""
    with taken_back_on_failure():
        return _pieces(piece, B, per, xp, progress=progress, checkpoint=checkpoint, key=key, features=features,
                       unchanged=unchanged)


def _pieces(piece, B: int, per: int, xp, *, progress: bool, checkpoint, key, features,
            unchanged=None) -> TargetedBounds:
    t_start = time.perf_counter()
    parts = {}
    todo = [(0, B)]
    saved = None
    if checkpoint is not None:
        saved = Checkpoint(checkpoint, key(), np.arange(B), features.detach().cpu().numpy(),
                           arithmetic_of(features.device), chunk_size=per, required=("meta",))
        finished = saved.finished()
        for start, _, arrays in finished:
            parts[start] = TargetedBounds.from_arrays(arrays, json.loads(str(arrays["meta"])))
        todo = gaps(B, finished)
        if progress and parts:
            validation.say(f"hcrfast.targeted_bound: {B - sum(hi - lo for lo, hi in todo)} of {B} examples read "
                           f"back from {checkpoint}")
    pieces = [(a, min(hi, a + per)) for lo, hi in todo for a in range(lo, hi, per)]
    computed, to_compute = 0, sum(stop - start for start, stop in pieces)
    eta = _Eta(time.perf_counter())
    if saved is not None and pieces:
        saved.check_writable()
    for start, stop in pieces:
        parts[start] = part = piece(start, stop)
        if saved is not None:
            arrays, meta = part.to_arrays()
            if unchanged is not None:   # (the piece's forwards ran: one of a model changed since is not saved)
                unchanged.check(saved, chunk=(start, stop))
            saved.save(start, stop, meta=np.array(json.dumps(meta, default=json_default)), **arrays)
        computed += stop - start
        if progress:
            _progress_line("hcrfast.targeted_bound", f"examples {B - to_compute + computed}/{B}", t_start, eta,
                           computed, to_compute)
    # (_StillTheSameFunction: the model did not change itself meanwhile; with a checkpoint, the check before the
    # last piece's save was the model's last forward, and a refusal there removed the pieces saved before it)
    if pieces and unchanged is not None and saved is None:
        unchanged.check()
    if saved is not None:
        saved.tidy()
        saved.warn_mixed(RESUME_BITWISE)
    result = TargetedBounds.concatenate([parts[start] for start in sorted(parts)], xp)
    result.params = dict(result.params, checkpoint=None if saved is None else dict(
        path=str(saved.path), examples_read_back=B - to_compute))
    return result


def _targeted_piece(model, model64, batch, f0, qmat, modes, *, noise, size, method, jacobian, options, null_probes,
                    chunk, chunk_size, directions, params) -> TargetedBounds:
    """:func:`targeted_bound` on the examples of ``batch`` (features ``f0``), its arguments checked and resolved."""
    xp = array_module_for(batch.device)
    B, K, p = batch.shape[0], len(modes), qmat.shape[1]
    input_shape = tuple(batch.shape[1:])
    n = f0.shape[1]
    sigma = noise.sigma
    timings: dict = {}
    example_of = np.repeat(np.arange(B), K)                                  # row b·K + k
    q_rows = qmat[xp.asarray(np.tile(np.arange(K), B))]

    itn = istop = null_dim = null_fraction = None
    if method in ("dense", "krylov"):
        if directions is None:
            directions = _dense_directions(model, batch, qmat, n, jacobian=jacobian, chunk=chunk_size)
        timings["jacobian"], timings["decomposition"] = directions.seconds
        jac_used = directions.jacobian
        unit = from_torch(directions.eps.reshape(B * K, p))
        null_dim, null_fraction = from_torch(directions.null_dim), from_torch(directions.null_fraction)
    else:
        jac_used = "reverse" if jacobian == "auto" else jacobian
        unit, itn, istop = _lsqr_directions(model, batch, qmat, jacobian=jac_used, options=options,
                                            chunk=chunk, timings=timings)
        itn, istop = itn.reshape(B, K, 2), istop.reshape(B, K, 2)

    t0 = time.perf_counter()
    exact = params["certify"] or batch.dtype == torch.float64
    magnitude = _rounding_magnitude(model64 if params["certify"] else model, batch, f0, jac_used) if exact else None
    slope = _rounding_slope(model64 if params["certify"] else model, batch, jac_used) if exact else None
    with np.errstate(over="ignore"):  # D = inf (‖z‖ ≫ σ) gives bound 0
        eps64, d, value, rounding = _evaluate(model, model64, batch, f0, example_of, (size * sigma) * unit, q_rows,
                                              certify=params["certify"], noise=noise, chunk=chunk, jacobian=jac_used,
                                              magnitude=magnitude, slope=slope)
    # A mode whose direction is 0 (J does not see it) is the null-space probes' to settle.
    _check_perturbations(eps64, d, noise, size, batch.dtype, intended=xp.any(unit != 0, axis=1))
    timings["certify"] = time.perf_counter() - t0
    from_null = xp.zeros(B * K, dtype=bool)
    row_cross = None   # the cross bounds of row-space steps a null-space probe replaced (their own modes' winner)

    if method == "dense" and null_probes:
        t0 = time.perf_counter()
        sel = xp.flatnonzero(null_fraction.reshape(-1) > NULL_COMPONENT_TOL)
        if sel.shape[0]:
            u = from_torch(directions.null_part.reshape(B * K, p))[sel]
            u_clean = xp.where(xp.abs(u) > _CLEAN_BELOW * xp.abs(u).max(axis=1, keepdims=True), u, 0.0)
            dirs = xp.stack([kernels.row_normalize(u)[0], kernels.row_normalize(u_clean)[0]], axis=1)
            ex_sel = example_of[to_host(sel)]
            flat = from_torch(batch.reshape(B, -1).double())
            scale = xp.sqrt(xp.mean(flat * flat, axis=1))
            scale = xp.where(scale > 0, scale, 1.0)[xp.asarray(ex_sel)]
            steps = xp.asarray(NULL_STEPS)
            cand = (scale[:, None, None, None] * steps[None, None, :, None]) * dirs[:, :, None, :]
            m = len(NULL_STEPS) * 2
            cand = cand.reshape(-1, p)
            ex = np.repeat(ex_sel, m)
            with np.errstate(over="ignore"):  # large null-space steps may overflow D: bound 0, never picked
                c_eps, c_d, c_val, c_rounding = _evaluate(
                    model, model64, batch, f0, ex, cand, xp.repeat(q_rows[sel], m, axis=0),
                    certify=params["certify"], noise=noise, chunk=chunk, null_probes=True, jacobian=jac_used,
                    magnitude=magnitude, slope=slope)
            rounding = _sum_rounding([rounding, c_rounding])
            c_val = c_val.reshape(-1, m)
            best = xp.argmax(c_val, axis=1)
            pick = xp.arange(sel.shape[0]) * m + best
            better = c_val[xp.arange(sel.shape[0]), best] > value[sel]
            if bool(to_host(better.any())):
                # a null-space probe that wins its mode replaces that mode's row-space step, whose bounds on the
                # other modes (_cross_bounds: a probe's count for its own mode only) went with it: bound(targets=
                # [0, 3, 5], null_probes=True) had 10 of 48 bounds below the call without probes (a review)
                row_std = xp.zeros((B, p))
                row_std[:, xp.asarray(modes)] = value.reshape(B, K)
                row_cross = _cross_bounds(types.SimpleNamespace(
                    std=row_std, modes=modes, divergence=d.reshape(B, K), eps=eps64.reshape((B, K) + input_shape),
                    from_null_space=None), params["basis"], input_shape)
            value[sel] = xp.where(better, c_val[xp.arange(sel.shape[0]), best], value[sel])
            d[sel] = xp.where(better, c_d[pick], d[sel])
            eps64[sel] = xp.where(better[:, None], c_eps[pick], eps64[sel])
            from_null[sel] = better
        timings["null_probes"] = time.perf_counter() - t0

    std = xp.zeros((B, p))
    std[:, xp.asarray(modes)] = value.reshape(B, K)
    infinite = xp.isinf(std)
    targeted = np.zeros(p, dtype=bool)
    targeted[modes] = True
    reasons = _infinite_reasons(to_host(value.reshape(B, K)), modes, input_shape, params["basis"],
                                to_host(from_null.reshape(B, K)))
    t0 = time.perf_counter()
    made = TargetedBounds(
        std=std.reshape((B,) + input_shape), targeted=targeted.reshape(input_shape), modes=modes,
        divergence=d.reshape(B, K), eps=eps64.reshape((B, K) + input_shape),
        infinite=infinite.reshape((B,) + input_shape),
        from_null_space=from_null.reshape(B, K), null_dim=null_dim, null_fraction=null_fraction,
        lsqr_iterations=itn, lsqr_istop=istop, method=method, infinite_reasons=reasons,
        params=dict(params, jacobian=jac_used), timings=timings, rounding=rounding)
    with profiling.annotate("targeted-cross"):  # each step bounds every mode it moves
        made = made.with_every_mode()
        if row_cross is not None:   # the row-space steps the null-space probes replaced count too
            made = dataclasses.replace(made, std_every_mode=xp.maximum(
                made.std_every_mode, row_cross.reshape(made.std_every_mode.shape)))
    timings["cross"] = time.perf_counter() - t0
    return made
