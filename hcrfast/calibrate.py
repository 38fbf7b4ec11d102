"""The noise to release: the smallest σ whose certified bounds reach a target.

A user who dithers features asks the inverse of :func:`hcrfast.bound`: how much noise makes every
unbiased reconstruction at least this uncertain? :func:`sigma_for` answers it by search. Every σ it
tries is one full, certified :func:`hcrfast.bound` call on the given batch, and the σ it returns is one
whose bounds were computed, never one predicted from a model of how they scale.

The statistic is conservative by construction: "a fraction ``1 − quantile`` of the bounds are at least
``target``" holds for the returned bounds (the quantile is NumPy's ``method="lower"``, an order
statistic, so infinite bounds need no interpolation).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hcrfast.backend import available_memory, host_argument, to_host, warnings_ignored
from hcrfast.results import counted, same_result
from hcrfast.validation import say

#: Statistics :func:`sigma_for` can aim at: ``"std"``, every per-mode bound of every example;
#: ``"rmse"``, per example the root of the mean of the selected modes' bounds squared (a lower bound on
#: the root-mean-square error of any unbiased estimator over those modes; over all modes it is
#: ``sqrt(Bounds.mse_from_modes)``).
STATISTICS = ("std", "rmse")

#: Largest factor by which one step of the search moves σ.
MAX_STEP = 100.0

#: Bytes of dense factors and Krylov bases :func:`sigma_for` keeps from one call to the next by default on
#: a GPU (in device memory), and at least that on the CPU (see :func:`default_reuse_bytes`). Measured
#: with random weights: MNIST MLP ~2.5 MB per example, CIFAR-10 CNN 37.5 MB (J's pseudo-inverse on its live
#: rows, in float64), ResNet-18 at 91x91 952.5 MB (a 4,096-step float32 Krylov basis;
#: ``benchmarks/reuse_store_size.py``): on a GPU this keeps one such basis.
REUSE_BYTES = 2**30

#: On the CPU the default keeps up to this share of the memory available when the search starts.
CPU_REUSE_SHARE = 0.5


def default_reuse_bytes(device) -> int:
    """:func:`sigma_for`'s budget for kept factors where none is given: on the CPU, :data:`CPU_REUSE_SHARE`
    of the memory available now (shared among the processes ``torchrun`` started on this machine,
    ``LOCAL_WORLD_SIZE``), and never less than :data:`REUSE_BYTES` (a CIFAR-10 search keeps ~37.5 MB per
    example: 1 GiB alone would serve 28 of 500 inputs); on a GPU, :data:`REUSE_BYTES` of device
    memory, which the solves' chunks also need."""
    if getattr(device, "type", str(device)) != "cpu":
        return REUSE_BYTES
    free = available_memory()
    if free is None:
        return REUSE_BYTES
    # torchrun's processes on this machine share its memory: each takes its part
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(REUSE_BYTES, int(free * CPU_REUSE_SHARE / local))


@dataclass
class SigmaSearch:
    """The result of :func:`sigma_for`.

    Attributes
    ----------
    sigma : float or numpy.ndarray
        The σ to release: ``scale × sigma0`` (one std per feature where ``sigma0`` was a profile). Where
        ``met`` is False, not one to release: the σ tried whose statistic came closest to the target (the
        largest statistic; the smallest σ among equals), with its bounds.
    scale : float
        σ over ``sigma0``.
    sigma0 : float or numpy.ndarray
        The σ the search started from (its unit).
    statistic : float
        The certified statistic of :attr:`bounds`: ``quantile`` of the bounds (or, for ``"rmse"``, of the
        examples' RMSE bounds) of :attr:`modes`, order statistic ``"lower"``:
        ``statistic_of(bounds, statistic_name, quantile, modes)``.
    target, quantile, statistic_name :
        What was asked.
    modes : None, str, sequence or array
        The modes the statistic is over, as given to :func:`sigma_for` (a CuPy array copied to the host);
        None: every mode.
    met : bool
        ``statistic >= target``.
    within_rtol : bool
        Also ``statistic <= target · (1 + rtol)``: no σ much smaller is expected to meet it (the search
        assumes the statistic grows with σ, which it does for linearized models; see :func:`sigma_for`).
    bounds : hcrfast.Bounds
        The certified bounds at :attr:`sigma`: the answer itself, not an estimate of it.
    history : list of dict
        Every call in order: ``scale``, ``sigma`` (its RMS where a profile), ``statistic``, ``seconds``,
        ``reused_examples`` (whose factor or basis came from an earlier call).
    note : str
        Why the search ended.
    reuse_bytes : int
        The budget the calls shared their factors within (the default's value where none was given).
    """

    sigma: object
    scale: float
    sigma0: object
    statistic: float
    target: float
    quantile: float
    statistic_name: str
    met: bool
    within_rtol: bool
    bounds: object
    history: list = field(default_factory=list)
    note: str = ""
    reuse_bytes: int = 0
    modes: object = None  # (last, with a default: a SigmaSearch built positionally, as before, is over every mode)

    def summary(self) -> str:
        what = _describe(self.statistic_name, self.quantile, self.modes)
        sig = (f"{self.sigma:.6g}" if np.ndim(self.sigma) == 0
               else f"{self.scale:.6g} x the given stds (RMS {_rms(self.sigma):.6g})")
        head = (f"sigma {sig}: {what} {self.statistic:.6g} {'>=' if self.met else '<'} target {self.target:.6g} "
                f"({_certified(self.bounds)}, {len(self.history)} bound calls)")
        lines = [head, f"  {self.note}"]
        for i, h in enumerate(self.history):
            lines.append(f"  call {i + 1}: scale {h['scale']:.6g}, sigma {h['sigma']:.6g} -> {h['statistic']:.6g} "
                         f"({h['seconds']:.1f} s)")
        return "\n".join(lines)

    __eq__ = same_result
    __hash__ = None

    def __repr__(self) -> str:
        return f"<SigmaSearch: {self.summary().splitlines()[0]}>"


def _certified(bounds) -> str:
    """How the summaries name the bounds: certified unless ``certify=False`` left ``z_ε`` to the model's dtype."""
    every = bounds if isinstance(bounds, list) else [bounds]
    certify = all(getattr(b, "params", {}).get("certify", True) for b in every)
    return "certified" if certify else "NOT certified: certify=False"


def _rms(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(np.sqrt(np.mean(a * a)))


def _describe(statistic: str, quantile: float, modes=None) -> str:
    """The statistic in words, naming the modes it is over where not every one (a statistic of a few modes
    is not the statistic of all: the two can differ by any factor)."""
    if modes is None:
        of = "per-mode bounds" if statistic == "std" else "examples' RMSE bounds"
    else:
        of = (f"bounds of {_modes_text(modes)}" if statistic == "std"
              else f"examples' RMSE bounds over {_modes_text(modes)}")
    return "median of the " + of if quantile == 0.5 else f"{quantile:g}-quantile of the {of}"


#: :func:`_modes_text` lists at most this many modes, the first ones, and counts the rest.
_MODES_SHOWN = 6


def _modes_text(modes) -> str:
    """``modes=`` (a ``targets`` spec of :func:`hcrfast.targeted.parse_targets`, already checked) in words:
    "modes low:4", "modes [0, 1]", "modes [0, 1, 2, 3, 4, 5, ...] (64 modes)", "the 5 modes of a mask"."""
    if isinstance(modes, str):
        return "all modes" if modes == "all" else f"modes {modes}"
    if hasattr(modes, "detach"):  # a torch tensor, on any device
        modes = modes.detach().cpu().numpy()
    arr = to_host(modes)
    if arr.dtype == bool:
        return f"the {int(arr.sum())} modes of a mask"
    shown = [int(m) if arr.ndim == 1 else tuple(int(i) for i in m) for m in arr[:_MODES_SHOWN]]
    if len(arr) <= _MODES_SHOWN:
        return f"modes {shown}"
    return f"modes {str(shown)[:-1]}, ...] ({len(arr)} modes)"


#: :func:`hcrfast.targeted.parse_targets`'s words for its argument, and what ``modes=`` calls them.
_TARGETS_WORDS = ((re.compile(r"\btargets\b"), "modes"), (re.compile(r"\bflat target indices\b"), "flat mode indices"))


def _parse_modes(modes, input_shape, basis: str) -> np.ndarray:
    """``modes=`` of :func:`sigma_for`, :func:`statistic_of`, :meth:`SigmaSweep.statistic` read as
    :func:`hcrfast.bound` reads ``targets=`` (:func:`hcrfast.targeted.parse_targets`), its errors naming
    ``modes=``, the argument given (``modes='low:9': K must lie in 1..6 ...``), not ``targets=``."""
    from hcrfast.targeted import parse_targets

    try:
        return parse_targets(modes, tuple(input_shape), basis)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        for words, ours in _TARGETS_WORDS:
            message = words.sub(ours, message)
        raise type(exc)(message) from None


def _quantile(quantile) -> float:
    """``quantile=`` checked: a number in [0, 1]."""
    try:
        q = float(quantile)
    except (TypeError, ValueError):
        q = math.nan
    if isinstance(quantile, bool) or not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile={quantile!r}: pass a number in [0, 1] (0.5: the median bound must reach the "
                         f"target; 0.05: 95% of the bounds must)")
    return q


def statistic_of(bounds, statistic: str = "std", quantile: float = 0.5, modes=None) -> float:
    """The number :func:`sigma_for` aims at, from a :class:`hcrfast.Bounds` (or its ``std`` array).

    ``quantile`` of every selected per-mode bound (``"std"``) or of every example's
    ``sqrt(mean of the selected modes' bounds squared)`` (``"rmse"``), by the order statistic
    ``numpy.quantile(..., method="lower")``: at least a fraction ``1 − quantile`` of the values are ≥ it.
    ``modes``: as :func:`hcrfast.bound`'s ``targets`` (``"all"``, ``"low:K"``, a list of modes, a mask);
    ``None`` is every mode.
    """
    from hcrfast.results import mse_from_modes

    if hasattr(bounds, "to_numpy"):  # a Bounds, possibly on the GPU
        std, basis = bounds.to_numpy().std, bounds.params.get("basis", "dct")
    else:
        std, basis = bounds, "dct"
    std = np.asarray(std, dtype=np.float64)
    if std.ndim < 2:
        raise ValueError(f"statistic_of: expected bounds of shape (B, ...), got {std.shape}")
    flat = std.reshape(std.shape[0], -1)
    if modes is not None:
        flat = flat[:, _parse_modes(modes, std.shape[1:], basis)]
    from hcrfast import validation

    validation.choice("statistic", statistic, STATISTICS)
    quantile = _quantile(quantile)
    values = flat.ravel() if statistic == "std" else np.sqrt(mse_from_modes(flat))
    return float(np.quantile(values, quantile, method="lower"))


def _zeros(bounds, statistic: str, modes) -> str:
    """How many of the values :func:`statistic_of` takes its quantile of are 0, in words."""
    from hcrfast.results import mse_from_modes

    std = np.asarray(bounds.to_numpy().std, dtype=np.float64)
    flat = std.reshape(std.shape[0], -1)
    if modes is not None:
        flat = flat[:, _parse_modes(modes, std.shape[1:], bounds.params.get("basis", "dct"))]
    values = flat.ravel() if statistic == "std" else np.sqrt(mse_from_modes(flat))
    of = "per-mode bounds" if statistic == "std" else "examples' RMSE bounds"
    return f"at the last, {int(np.sum(values == 0))} of the {values.size} {of} are 0"


def _rounding_zeros(bounds) -> bool:
    """Whether some of ``bounds``' zero steps are float rounding (a shift below float64's resolution of the
    features, or D not established: ``zero_step_kind`` "rounded", "coarse", "uncertified"), which a larger σ
    lifts: a σ0 of 1e-14 of the features' RMS gives bounds of 0 at 1 and 100 × σ0, and 0.9 at 1e14 ×."""
    from hcrfast.algorithm import zero_step_kind

    reasons = getattr(bounds, "params", {}).get("zero_step_reasons") or []
    return any(zero_step_kind(r) in ("rounded", "coarse", "uncertified") for r in reasons)


def sigma_for(model, batch, target: float, *, sigma0=None, quantile: float = 0.5, statistic: str = "std",
              modes=None, rtol: float = 0.05, max_calls: int = 8, checkpoint=None, progress: bool = False,
              reuse_bytes: int | None = None, **bound_kwargs) -> SigmaSearch:
    """The smallest σ (within ``rtol``) at which the certified bounds on ``batch`` reach ``target``.

    Parameters
    ----------
    model, batch :
        As for :func:`hcrfast.bound`.
    target : float
        In the inputs' units (the DCT coefficients' with ``basis="dct"``): the ``quantile`` of the bounds
        must be at least this.
    sigma0 : float or array of one std per feature, optional
        Where the search starts, and its unit: the σ tried are ``scale × sigma0``, so a per-feature profile
        keeps its shape. Default: the RMS of the clean features over the batch (σ-scale 1, as published).
    quantile : float in [0, 1]
        0.5: the median bound must reach the target; 0.05: 95% of the bounds must.
    statistic : {"std", "rmse"}
        Over every per-mode bound of every example, or over each example's RMSE bound (see
        :data:`STATISTICS`).
    modes : optional
        Only these modes count (as ``targets`` of :func:`hcrfast.bound`: ``"low:8"``, a list, a mask); kept
        as :attr:`SigmaSearch.modes`, and named in its summary.
    rtol : float
        Stop once the statistic lies in ``[target, target · (1 + rtol)]``.
    max_calls : int
        At most this many :func:`hcrfast.bound` calls; each call costs one full bound of the batch.
    checkpoint : folder, optional
        Each call's :func:`hcrfast.bound` checkpoint goes in a sub-folder named by its scale: the search is
        deterministic, so the same call made again after a crash replays the finished calls from disk and
        goes on (one call per folder at a time).
    progress : bool
        A line per call on stderr (and the calls' own progress).
    reuse_bytes : int, optional
        With a scalar σ and the dense solve or the Krylov basis (``solver="auto"`` takes one of them), J's
        factor or basis does not depend on σ: each chunk's is kept from the first call, up to this many
        bytes in all (default :func:`default_reuse_bytes`: half the memory available at the start on the
        CPU, at least 1 GiB; 1 GiB on the GPU, where they stay in device memory), and the later
        calls compute only their solves and certification (CIFAR-10 CNN: searches of 3-4 calls in
        1.43-1.67x one call's time with the default singular steps, 2.66-5.07x without keeping the factors;
        1.18-1.27x with Algorithm 1 alone; ``benchmarks/sigma_search.py``, the README's "The noise to
        release"). Dense solves give bitwise the bounds
        of a call made alone, Krylov ones the same to rounding. A per-feature ``sigma0`` is searched as the
        scalar σ = scale on the features divided by ``sigma0`` (the same observation, divided), so its calls
        share them too; their bounds equal those of the per-feature call at ``sigma`` to rounding, and read
        as its (``params["noise"]`` names the stds, ``z`` is in the model's units). 0: every call computes
        its own (a per-feature one then bitwise a direct call's).
    **bound_kwargs :
        Passed to every :func:`hcrfast.bound` call (``size``, ``restarts``, ``seed``, ``solver``,
        ``targets``, ...). The seed is the same at every σ, so the calls differ by σ only.

    Returns
    -------
    SigmaSearch
        ``sigma``, its certified ``bounds`` and the search's ``history``. The claim is about this batch:
        other inputs need their own bounds (calibrate on inputs like the ones you release, or bound those).

    The search takes σ's scale on a log axis, with secant steps on ``log statistic`` through the last two
    calls (a linearized model's bounds are proportional to σ, so the first step usually lands within a few
    percent) and geometric bisection where a step would leave the bracket of scales that missed and met
    the target. For models far from linear over the noise's reach the
    statistic need not grow monotonically with σ: the σ returned meets the target (its bounds show it),
    but a smaller one might too. Where no σ tried meets it, the search ends once the statistic stops
    growing with σ (it fell on both sides of its largest value, looked for below the start where that
    was the first call's, and narrowed with the calls left, :data:`_GOLDEN`, as the target may lie under
    it; or it stayed 0 over a step of :data:`MAX_STEP`, where no step of the bound
    moves the modes it falls on), after ``max_calls``, or where a later call raises ``ValueError`` or an
    ``ArithmeticError`` (σ out of the range the solver resolves): ``met`` is then False, a
    ``RuntimeWarning`` says why, and ``sigma``, ``bounds`` are those of the call whose statistic came
    closest.
    """
    from hcrfast import validation

    target = validation.positive_float("target", target)
    quantile = _quantile(quantile)
    validation.choice("statistic", statistic, STATISTICS)
    rtol = validation.positive_float("rtol", rtol)
    max_calls = validation.positive_int("max_calls", max_calls)
    if "sigma" in bound_kwargs:
        raise TypeError("sigma_for() got sigma=...: the search sets sigma itself; pass the start as sigma0")
    _bound_keywords(sigma_for, bound_kwargs)
    bound_at, profile, scalar, reuse_bytes = _scaled_bound(model, batch, sigma0, reuse_bytes, checkpoint, progress,
                                                           bound_kwargs, "sigma_for searches")
    if modes is not None:  # a bad spec is refused before any bound is computed
        modes = host_argument("modes", modes)  # (kept on the result: a CuPy array on the host)
        _parse_modes(modes, tuple(batch.shape[1:]), bound_kwargs.get("basis", "dct"))
    what = _describe(statistic, quantile, modes)

    history = []

    def run(k: float):
        t0 = time.perf_counter()
        try:
            sigma, res = bound_at(k)
        except Exception as exc:
            if hasattr(exc, "add_note"):  # Python >= 3.11: where the search was
                tried = ", ".join(f"{h['sigma']:.6g} -> {h['statistic']:.6g}" for h in history) or "none"
                exc.add_note(f"hcrfast.sigma_for: raised by bound call {len(history) + 1} at sigma scale {k:.6g} x "
                             f"sigma0 (calls before it, sigma -> {what}: {tried})")
            raise
        stat = statistic_of(res, statistic, quantile, modes)
        history.append({"scale": k, "sigma": float(sigma) if scalar else _rms(sigma), "statistic": stat,
                        "seconds": time.perf_counter() - t0,
                        "reused_examples": (res.params.get("reuse") or {}).get("examples", 0),
                        # (where its chunks came from, and their arithmetic: recorded, not compared)
                        "checkpoint": res.params.get("checkpoint")})
        if progress:
            say(f"hcrfast.sigma_for: call {len(history)}/{max_calls}: sigma {history[-1]['sigma']:.6g} -> {what} "
                f"{stat:.6g} (target {target:.6g}), {history[-1]['seconds']:.1f} s")
        return res, stat

    goal = target * math.sqrt(1.0 + rtol)  # aim inside [target, target · (1 + rtol)], on a log scale
    with _reusing(reuse_bytes):
        meets, best, note, kept = _search(run, target, goal, rtol, max_calls, what, history,
                                          zeros=lambda res: _zeros(res, statistic, modes))

    if meets is not None:
        k_best, stat_best = meets
        met = True
    else:
        k_best, stat_best = best
        met = False
        warnings.warn(f"sigma_for: no sigma tried reached the target {target:g}; the one that came closest, "
                      f"{k_best:.6g} x sigma0, gave {what} {stat_best:.6g} (returned with met=False): {note}",
                      validation.HcrfastRuntimeWarning, stacklevel=2)
    within = met and stat_best <= target * (1.0 + rtol)
    if met and not within and not math.isinf(stat_best):
        note += f"; the smallest sigma that met the target gives {stat_best / target:.4g} x the target"
    sigma = float(k_best * profile) if scalar else k_best * profile
    return SigmaSearch(sigma=sigma, scale=k_best, sigma0=float(profile) if scalar else profile, statistic=stat_best,
                       target=target, quantile=quantile, statistic_name=statistic, met=met, within_rtol=within,
                       bounds=kept[k_best], history=history, note=note, reuse_bytes=reuse_bytes, modes=modes)


@dataclass
class SigmaSweep:
    """The result of :func:`sweep_sigma`: certified bounds at each σ asked for.

    Attributes
    ----------
    scales : numpy.ndarray
        The σ asked for, in units of :attr:`sigma0`, in the order computed.
    sigma0 : float or numpy.ndarray
        The unit (one std per feature where a profile).
    sigmas : list
        ``scale × sigma0`` for each scale: floats, or arrays of one std per feature.
    bounds : list of hcrfast.Bounds
        The certified bounds at each σ, as :func:`hcrfast.bound` gives them at that σ.
    seconds, reused_examples : list
        Per σ: its call's seconds, and how many examples' factors or bases came from an earlier call.
    reuse_bytes : int
        The budget the calls shared their factors within.
    """

    scales: np.ndarray
    sigma0: object
    sigmas: list
    bounds: list
    seconds: list
    reused_examples: list
    reuse_bytes: int

    def statistic(self, statistic: str = "std", quantile: float = 0.5, modes=None) -> np.ndarray:
        """Per σ, :func:`statistic_of` its bounds: by default the median per-mode bound."""
        return np.array([statistic_of(b, statistic, quantile, modes) for b in self.bounds])

    def save(self, folder, *, overwrite: bool = False) -> Path:
        """Write the sweep to ``folder``: ``sweep.json`` (scales, seconds, reuse; the unit σ0, or
        ``sigma0.npy`` for one std per feature) and each σ's bounds as ``scale_K/bounds.npz``
        (:meth:`hcrfast.Bounds.save`). :meth:`load` reads it back; returns ``sweep.json``'s path.

        A folder an earlier save wrote is written over, and what that save wrote and this one does not (a
        σ no longer asked for) removed; a folder holding another file at a name this save writes (a
        ``sweep.json`` of the user's) is refused before anything is written, and no other file is touched.
        ``overwrite=True`` writes over such files: the caller vouches they are no one's (``hcrfast bound
        --sweep`` does, having checked its OUT by its list of outputs before computing)."""
        import json

        from hcrfast.checkpoint import atomic_write_bytes, atomic_write_text

        folder = Path(folder).expanduser()
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"SigmaSweep.save({str(folder)!r}): a file is there; pass a folder (made if missing)")
        scalar = np.ndim(self.sigma0) == 0
        names = [scale_folder(k) for k in self.scales.tolist()]
        planned = {"sweep.json", *(f"{name}/bounds.npz" for name in names)} | (set() if scalar else {"sigma0.npy"})
        earlier = _saved_by_sweeps(folder)
        # a file of the user's at a name save writes would be written over, and a later save would remove it
        theirs = sorted({n for n in planned if (folder / n).exists() and n not in earlier}
                        | {name for name in names if (folder / name).exists() and not (folder / name).is_dir()}
                        | ({_SAVE_JOURNAL} if (folder / _SAVE_JOURNAL).exists() and _journal(folder) is None
                           else set()))
        if theirs and not overwrite:
            raise ValueError(f"SigmaSweep.save({str(folder)!r}): holds {', '.join(theirs)}, which save writes and "
                             f"which no earlier SigmaSweep.save wrote there; pass another folder, move "
                             f"{'them' if len(theirs) > 1 else 'it'}, or overwrite=True to write over "
                             f"{'them' if len(theirs) > 1 else 'it'}")
        folder.mkdir(parents=True, exist_ok=True)
        # listed before any is written: a save cut short leaves its files its own, for the next save to replace
        atomic_write_text(folder / _SAVE_JOURNAL, json.dumps(
            {"writer": "hcrfast.SigmaSweep.save", "files": sorted(earlier | planned)}, indent=1) + "\n")
        levels = []
        for k, name, res in zip(self.scales.tolist(), names, self.bounds):
            (folder / name).mkdir(exist_ok=True)
            res.save(folder / name / "bounds.npz")
            levels.append({"scale": k, "bounds": f"{name}/bounds.npz"})
        if not scalar:
            sigma0 = np.asarray(self.sigma0, dtype=np.float64)
            atomic_write_bytes(folder / "sigma0.npy", lambda fh: np.save(fh, sigma0))
        atomic_write_text(folder / "sweep.json", json.dumps({
            "format": _SWEEP_FORMAT, "writer": "hcrfast.SigmaSweep.save",
            "sigma0": float(self.sigma0) if scalar else "sigma0.npy", "levels": levels,
            "seconds": [float(t) for t in self.seconds], "reused_examples": [int(n) for n in self.reused_examples],
            "reuse_bytes": int(self.reuse_bytes)}, indent=1) + "\n")
        # after the new sweep.json: a crash between leaves files, never a dangling list. What an earlier save
        # wrote and this one does not goes: bounds.npz and sigma0.npy alone (a file of anyone else's stays, and
        # so its folder; an `hcrfast bound --sweep` removes the attack.npz it wrote itself, by its list of outputs)
        for name in sorted(earlier - planned):
            parts = name.split("/")
            if name != "sigma0.npy" and not (len(parts) == 2 and parts[0].startswith("scale_")
                                             and parts[1] == "bounds.npz"):
                continue
            if (folder / name).is_file():
                (folder / name).unlink()
            if len(parts) == 2:   # (a save cut short may have made the folder alone)
                try:
                    (folder / parts[0]).rmdir()
                except OSError:   # it holds something else too: leave it
                    pass
        (folder / _SAVE_JOURNAL).unlink(missing_ok=True)   # sweep.json now lists what this save wrote
        return folder / "sweep.json"

    @classmethod
    def load(cls, folder) -> "SigmaSweep":
        """The :class:`SigmaSweep` that :meth:`save` wrote to ``folder`` (bounds as NumPy arrays)."""
        import json

        from hcrfast.results import Bounds

        folder = Path(folder).expanduser()
        path = folder / "sweep.json"
        if not path.is_file():
            raise FileNotFoundError(f"SigmaSweep.load({str(folder)!r}): no sweep.json there (SigmaSweep.save writes "
                                    f"it; hcrfast bound --sweep writes OUT/sweep)")
        meta = json.loads(path.read_text(encoding="utf-8"))
        if meta.get("format") != _SWEEP_FORMAT:
            raise ValueError(f"{path}: format {meta.get('format')!r}, not {_SWEEP_FORMAT} (written by another "
                             f"version of hcrfast); compute the sweep again")
        sigma0 = (float(meta["sigma0"]) if not isinstance(meta["sigma0"], str)
                  else np.load(folder / meta["sigma0"], allow_pickle=False))
        scales = np.array([lv["scale"] for lv in meta["levels"]], dtype=np.float64)
        return cls(scales=scales, sigma0=sigma0,
                   sigmas=[float(k * sigma0) if np.ndim(sigma0) == 0 else k * sigma0 for k in scales.tolist()],
                   bounds=[Bounds.load(folder / lv["bounds"]) for lv in meta["levels"]],
                   seconds=list(meta["seconds"]), reused_examples=list(meta["reused_examples"]),
                   reuse_bytes=int(meta["reuse_bytes"]))

    def summary(self) -> str:
        """Each σ's bounds by the summaries' rule (:func:`hcrfast.results.quantile_line`, summary.json's and
        the reports' quantiles): quantiles of the finite per-mode bounds, +inf ones (D = 0) counted apart and
        zeros (which bound nothing) said. Not :meth:`statistic`'s order statistic over every bound, +inf
        included, which the σ searches aim at: where many bounds are 0 its median is 0 while the finite
        bounds' is not."""
        from hcrfast.results import quantile_line

        unit = "" if np.ndim(self.sigma0) == 0 else " (RMS of the stds)"
        lines = [f"{counted(len(self.scales), 'sigma')}, {_certified(self.bounds)} bounds at each (quantiles of "
                 f"the finite per-mode bounds; +inf ones, from D = 0, counted apart){unit}:"]
        for k, sig, res, sec, used in zip(self.scales, self.sigmas, self.bounds, self.seconds,
                                          self.reused_examples):
            std = np.asarray(res.to_numpy().std, dtype=np.float64)
            lines.append(f"  scale {k:.6g}, sigma {sig if np.ndim(sig) == 0 else _rms(sig):.6g} ({sec:.1f} s"
                         f"{f', {used} examples reused' if used else ''}): {quantile_line(std).strip()}")
        return "\n".join(lines)

    __eq__ = same_result
    __hash__ = None

    def __repr__(self) -> str:
        if not len(self.scales):   # (a sweep.json edited to hold no level loads: its repr must not raise)
            return "<SigmaSweep: no sigmas>"
        return f"<SigmaSweep: {len(self.scales)} sigmas, scales {self.scales.min():.6g} to {self.scales.max():.6g}>"


#: sweep.json's format (:meth:`SigmaSweep.save`).
_SWEEP_FORMAT = 1

#: The files a :meth:`SigmaSweep.save` under way writes in its folder (and the earlier save's), listed before the
#: first is written and removed after sweep.json, which lists them then: a save cut short leaves them named.
_SAVE_JOURNAL = ".hcrfast-sweep-save.json"


def _journal(folder: Path) -> set | None:
    """The files _SAVE_JOURNAL in ``folder`` names, None where it is missing or not a save's."""
    import json

    try:
        held = json.loads((folder / _SAVE_JOURNAL).read_text(encoding="utf-8"))
        if held.get("writer") == "hcrfast.SigmaSweep.save" and isinstance(held.get("files"), list):
            return {str(n) for n in held["files"]}
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _saved_by_sweeps(folder: Path) -> set:
    """The files in ``folder`` (paths relative to it) that an earlier :meth:`SigmaSweep.save` wrote: sweep.json
    where that save wrote it (its "writer" says so), the bounds and sigma0.npy it names, and those a save cut
    short listed in _SAVE_JOURNAL. A user's sweep.json, or their scale_1/bounds.npz, is none of these."""
    import json

    files = _journal(folder) or set()
    try:
        meta = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
        if meta.get("writer") == "hcrfast.SigmaSweep.save":
            files |= {"sweep.json"} | {str(level["bounds"]) for level in meta["levels"]} | (
                {"sigma0.npy"} if meta.get("sigma0") == "sigma0.npy" else set())
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    return files


def scale_folder(k: float) -> str:
    """The folder of scale ``k`` in a saved sweep: 'scale_0.5', 'scale_2' (the shortest name that reads
    back as k)."""
    short = f"{k:g}"
    return f"scale_{short if float(short) == k else repr(float(k))}"


def sweep_sigma(model, batch, scales, *, sigma0=None, checkpoint=None, progress: bool = False,
                reuse_bytes: int | None = None, **bound_kwargs) -> SigmaSweep:
    """Certified bounds on ``batch`` at several noise levels, σ = ``scale × sigma0`` for each scale: the
    curve of the bound against σ that a choice of noise weighs against utility.

    Every σ is one full, certified :func:`hcrfast.bound` call (the same seed, so the calls differ by σ
    only); with a scalar σ or a per-feature profile and the dense solve or the Krylov basis (what
    ``solver="auto"`` takes) they share each chunk's factor or basis, kept from the first call up to
    ``reuse_bytes`` (as :func:`sigma_for`: dense solves bitwise a direct call's bounds at that σ,
    Krylov ones and per-feature profiles to rounding). ``checkpoint=DIR`` gives each σ its own folder:
    the same call made again after a crash reads the finished σ back and goes on.

    Parameters
    ----------
    model, batch :
        As for :func:`hcrfast.bound`.
    scales : sequence of positive floats
        The noise levels, in units of ``sigma0``; computed in this order (the first builds the factors).
    sigma0 : float or array of one std per feature, optional
        The unit. Default: the RMS of the clean features over the batch (scale 1 is σ = 1 × RMS, as
        published).
    checkpoint, progress, reuse_bytes, **bound_kwargs :
        As for :func:`sigma_for`. Every call's bounds are kept (each holds the batch's ``std``, ``eps``
        and ``z``): mind the memory of long sweeps over large batches.
    """
    from hcrfast import validation

    try:
        values = validation.real_array(scales)   # strings ("0.5") and bools are no scales: np.float64 took them
    except (TypeError, ValueError):
        raise TypeError(f"scales={scales!r}: pass a sequence of positive numbers (the sigmas in units of "
                        f"sigma0)") from None
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values) & (values > 0)):
        raise ValueError(f"scales={scales!r}: pass a non-empty sequence of positive finite numbers (the sigmas in "
                         f"units of sigma0, e.g. [0.5, 1, 2, 4])")
    listed = values.tolist()
    twice = sorted({k for k in listed if listed.count(k) > 1})
    if twice:  # (as the CLI's --sweep: the same sigma twice is the same certified bounds twice)
        raise ValueError(f"scales={scales!r}: {twice[0]:g} is given {listed.count(twice[0])} times; name each sigma "
                         f"once")
    if "sigma" in bound_kwargs:
        raise TypeError("sweep_sigma() got sigma=...: pass the noise levels as scales (and their unit as sigma0)")
    _bound_keywords(sweep_sigma, bound_kwargs)
    bound_at, profile, scalar, reuse_bytes = _scaled_bound(model, batch, sigma0, reuse_bytes, checkpoint, progress,
                                                           bound_kwargs, "sweep_sigma takes")
    _scales_in_range(values, profile, batch, whitened=bound_at.whitened)
    sigmas, results, seconds, reused = [], [], [], []
    with _reusing(reuse_bytes):
        for i, k in enumerate(values.tolist()):
            t0 = time.perf_counter()
            try:
                sigma, res = bound_at(k)
            except Exception as exc:
                if hasattr(exc, "add_note"):  # Python >= 3.11: where the sweep was
                    exc.add_note(f"hcrfast.sweep_sigma: raised by the bound call at scale {k:.6g} x sigma0 "
                                 f"({i} of {values.size} sigmas done before it)")
                raise
            sigmas.append(sigma)
            results.append(res)
            seconds.append(time.perf_counter() - t0)
            reused.append((res.params.get("reuse") or {}).get("examples", 0))
            if progress:
                say(f"hcrfast.sweep_sigma: {i + 1}/{values.size}: scale {k:.6g}, median bound "
                    f"{statistic_of(res):.6g}, {seconds[-1]:.1f} s")
    return SigmaSweep(scales=values, sigma0=float(profile) if scalar else profile, sigmas=sigmas, bounds=results,
                      seconds=seconds, reused_examples=reused, reuse_bytes=reuse_bytes)


def _bound_keywords(fn, bound_kwargs: dict) -> None:
    """Refuses, before any bound is computed, a keyword that neither ``fn`` (:func:`sigma_for`,
    :func:`sweep_sigma`) nor :func:`hcrfast.bound` takes, naming ``fn`` and both's keywords: bound's own
    message, at the first call, named bound alone (``quantiles=`` came back without ``quantile`` in its list)."""
    import inspect

    from hcrfast.algorithm import bound

    params = inspect.signature(bound).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):   # (bound wrapped, by a test say: it takes any)
        return
    taken = [name for name in params if name not in ("model", "batch", "sigma")]
    unknown = [name for name in bound_kwargs if name not in taken]
    if unknown:
        own = [p.name for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]
        raise TypeError(f"hcrfast.{fn.__name__}(): got an unexpected keyword argument {unknown[0]!r}; its arguments "
                        f"are {', '.join(own)}, and those it passes to hcrfast.bound: "
                        f"{', '.join(name for name in taken if name not in own)}")


def _reuse_budget(reuse_bytes, batch) -> int:
    """``reuse_bytes`` checked, or :func:`default_reuse_bytes` for ``batch``'s device where None."""
    if reuse_bytes is not None and (isinstance(reuse_bytes, bool) or not isinstance(reuse_bytes, (int, np.integer))
                                    or reuse_bytes < 0):
        raise ValueError(f"reuse_bytes={reuse_bytes!r}: pass a whole number of bytes >= 0 (0: keep nothing between "
                         f"calls), "
                         f"or None for the default (half the available memory on the CPU, 1 GiB on a GPU)")
    return int(default_reuse_bytes(getattr(batch, "device", "cpu")) if reuse_bytes is None else reuse_bytes)


def _profile(model, batch, sigma0, who: str, basis: str = "dct"):
    """``(profile, scalar)``: ``sigma0`` as float64 (a 0-d array where one std serves every feature),
    checked positive and finite; None is the RMS of the clean features over the batch. Where it runs the model
    (sigma0 None, or one std per feature), the model and batch are checked first as :func:`hcrfast.bound`
    checks them (``basis``: its argument), so that its messages, not the forward's, name their faults."""
    from hcrfast import validation
    from hcrfast.algorithm import rms_sigma
    from hcrfast.noise import Gaussian, NoiseLaw, PerFeatureGaussian, detached

    if isinstance(sigma0, Gaussian) and not isinstance(sigma0, PerFeatureGaussian):
        sigma0 = sigma0.sigma   # hcrfast.Gaussian(s): the std s, as bound and dithered_accuracy read it
    if isinstance(sigma0, (NoiseLaw, bool)) or (
            sigma0 is not None and not isinstance(sigma0, (numbers.Real, np.ndarray, list, tuple))
            and not hasattr(sigma0, "detach")):  # (numbers.Real: NumPy's scalars too, as bound takes them)
        raise TypeError(f"sigma0={sigma0!r}: {who} the std of Gaussian noise; pass a float, one std per feature, "
                        f"or hcrfast.Gaussian(std)")
    if sigma0 is None:
        import torch

        validation.model_and_batch(model, batch, basis)
        # the features bound() sees (no dropout, running stats), run as bound runs the model (the one-call lock,
        # its buffers given back)
        with validation.model_kept(model), torch.no_grad():
            sigma0 = rms_sigma(validation.features_of(model, batch), 1.0)
    if hasattr(sigma0, "detach"):
        sigma0 = sigma0.detach().cpu().numpy()
    # (a list of tensors that require grad: their values) a copy: the caller's array, changed later, changed the
    # sigma0 the results record (their sigmas saved and loaded with it), not the sigma their bounds were made at
    profile = np.array(detached(sigma0), dtype=np.float64)
    if not (np.all(np.isfinite(profile)) and np.all(profile > 0)) or profile.size == 0:
        raise ValueError(f"sigma0 must be positive and finite, got {sigma0!r}" if profile.size < 8 else
                         f"sigma0 must be positive and finite; it holds {int(np.sum(~(profile > 0)))} values <= 0 "
                         f"and {int(np.sum(~np.isfinite(profile)))} that are not finite")
    scalar = profile.size == 1  # one std for every feature
    if not scalar:  # checked here, where the message can name sigma0 (bound's would name its sigma)
        import torch

        validation.model_and_batch(model, batch, basis)
        with validation.model_kept(model), torch.no_grad():
            shape = tuple(validation.features_of(model, batch, flat=False).shape[1:])
        n = int(np.prod(shape))
        if profile.size != n:
            raise ValueError(f"sigma0 holds {profile.size} stds, but the model gives {n} features per example (shape "
                             f"{shape}); pass one std per feature, or one number")
        if profile.shape not in ((n,), shape):
            raise ValueError(f"sigma0 has the shape {profile.shape}, but the model's features have the shape {shape}; "
                             f"pass stds of the features' shape, or flat")
    return (profile.reshape(()) if scalar else profile), scalar


def _scaled_bound(model, batch, sigma0, reuse_bytes, checkpoint, progress, bound_kwargs: dict, who: str):
    """The arguments :func:`sigma_for` and :func:`sweep_sigma` share, checked, and the call they make:
    ``(bound_at, profile, scalar, reuse_bytes)``, with ``bound_at(k) -> (sigma, Bounds)`` the
    :func:`hcrfast.bound` call at σ = k·profile, its checkpoint in ``checkpoint/`` + :func:`scale_folder`
    (``scale_0.5``), or in the folder named by ``k.hex()`` that versions before 2026-12-01 made, where only
    that one exists (:func:`_scale_checkpoint`).

    A profile σ = k·sigma0 is the scalar σ = k on the features divided by sigma0 (the same observation,
    divided): run that way where factors are kept, the calls differ by a scalar σ only, so they can share
    J's factor or basis; without reuse each call is a plain per-feature call (bitwise a direct one)."""
    from hcrfast import validation
    from hcrfast.algorithm import bound
    from hcrfast.noise import Gaussian, ScaledGaussian, _stored_key, _whiten, as_per_feature_result, as_scaled_result
    from hcrfast.noise import _damping_given_back, _with_damp_as_given, whitened_scale

    checkpoint = validation.checkpoint_folder(checkpoint)
    validation.flag("progress", progress)
    reuse_bytes = _reuse_budget(reuse_bytes, batch)
    profile, scalar = _profile(model, batch, sigma0, who, bound_kwargs.get("basis", "dct"))
    root = None if checkpoint is None else Path(checkpoint)
    # a scalar sigma0 too far from 1 for the features' dtype is divided out once, here, as a profile is: each
    # call would divide by its own k·sigma0 (hcrfast.noise.whitened_scale), a J of its own, and share nothing
    far = scalar and whitened_scale(float(profile), batch) is not None
    whiten = (not scalar or far) and reuse_bytes and _reuses(batch, profile.size, bound_kwargs)
    whitened = []   # the model with its features divided by the profile, made once where a call needs it

    def bound_at(k: float):
        sigma = float(k * profile) if scalar else k * profile
        folder = None if root is None else _scale_checkpoint(root, k)
        on_whitened = whiten
        if folder is None or (scalar and not far):
            made = None
        elif scalar:   # a far sigma0: divided out here (reuse on), or each call at its own sigma (reuse off; or
            stored = _stored_key(folder)   # a version before 2026-12-02, on the features as they are)
            made = (True if stored.get("noise") in (repr(Gaussian(float(k))), repr(ScaledGaussian(1.0, scale=float(k))))
                    and str(stored.get("model", "")).startswith("PerFeatureStd:") else
                    False if stored.get("noise") in (repr(Gaussian(sigma)), repr(ScaledGaussian(1.0, scale=sigma)))
                    else None)
        else:
            made = _folder_whitened(folder)
        if made is not None and made != on_whitened:   # (resumed as made; its key is checked in full all the same)
            plain = "a plain call at the scalar sigma" if scalar else "a plain call with one std per feature"
            how = (f"reuse on (reuse_bytes > 0: the scalar sigma {float(k)!r} on the model with its features divided "
                   f"by sigma0; bounds equal to a plain call's up to rounding)" if made else
                   f"reuse off (reuse_bytes=0: {plain})")
            validation.warn(f"{folder} was made with {how}, and this call has reuse {'on' if whiten else 'off'}: it "
                            f"resumes the folder as it was made; pass the first call's reuse_bytes (hcrfast bound: "
                            f"--reuse-gib) to run every sigma as that call did")
            on_whitened = made
        if not on_whitened:
            return sigma, bound(model, batch, sigma, progress=progress, checkpoint=folder, **bound_kwargs)
        if not whitened:
            whitened.append(_whiten(model, batch, profile, bound_kwargs.get("certify", True)))
        kwargs, call, damp = bound_kwargs, bound, getattr(bound_kwargs.get("lsqr"), "damp", 0) or 0
        if scalar and damp > 0:   # LSQR's damp is in J's units: the divided features' J is J / sigma0
            kwargs = {**bound_kwargs, "lsqr": dataclasses.replace(bound_kwargs["lsqr"], damp=damp / float(profile))}
            call = functools.partial(_with_damp_as_given, bound, damp)   # (its warnings quote the user's)
        try:   # (its warnings, and its errors below, name the sigma k stands for, not k)
            with validation.named_as(*_sigma_named(k, sigma)):
                res = call(whitened[0], batch, float(k), progress=progress, checkpoint=folder, **kwargs)
        except (ValueError, ArithmeticError) as exc:   # bound named the scalar sigma k it ran at, not sigma0's
            new = _per_feature_named(exc, k, sigma)
            if new is exc:
                raise
            raise new from exc.__cause__
        if scalar:   # (where bound divided the features by k itself too, they were divided by k·sigma0 in all)
            if damp > 0:
                _damping_given_back(res, {"lsqr": damp}, 1.0)
            return sigma, as_scaled_result(res, float(profile), sigma=sigma,
                                           divided_by=float(profile) * res.params.get("features_divided_by", 1.0))
        return sigma, as_per_feature_result(res, sigma, divided_by=profile)

    if whiten:   # (made here, before the first call, where its refusals belong)
        whitened.append(_whiten(model, batch, profile, bound_kwargs.get("certify", True)))
    bound_at.whitened = bool(whiten)   # its calls run at sigma = k on the features divided by sigma0
    return bound_at, profile, scalar, reuse_bytes


def _scales_in_range(scales: np.ndarray, profile, batch, *, whitened: bool) -> None:
    """Refuse, before any call, a scale whose σ = scale × sigma0 (``profile``, one number or one per feature)
    the sweep cannot run or report, where its calls had failed only once the sweep had spent the scales before:
    0 or inf in float64 (refused as "sigma must be a positive finite number, got 0.0", a σ nobody passed), and
    below the smallest normal number of the features' dtype (float32 where not float64) where the features are
    divided by it: a plain call at σ, or (``whitened``: the features divided by sigma0 once, each call at σ =
    scale) a scale far from 1 for the dtype, which the call divides them by again (a review: 1e-115 x 1e-200 then
    failed as a model whose derivative is not finite); a scale near 1 on the divided features runs at any σ."""
    import torch

    from hcrfast.noise import whitened_scale

    unit = np.asarray(profile, dtype=np.float64).reshape(-1)
    info = np.finfo(np.float64)
    dtype = np.float64 if getattr(batch, "dtype", None) == torch.float64 else np.float32
    tiny = float(np.finfo(dtype).tiny)
    with np.errstate(over="ignore", under="ignore"):
        for k in scales.tolist():
            low, high = float(k * unit.min()), float(k * unit.max())
            again = whitened and whitened_scale(float(k), batch) is not None   # divided by sigma0, then by k
            floor = tiny if not whitened or again else 0.0
            unit_text = (f"{float(unit[0])!r}" if unit.size == 1 else
                         f"one std per feature, {unit.min():.4g} to {unit.max():.4g}")
            if again and not tiny < k <= float(np.finfo(dtype).max):   # (a review: 1e-310 x 1e200 passed as 1e-110, then failed
                raise ValueError(                   # naming sigma=1e-310, a sigma nobody passed)
                    f"scales: {k!r} x sigma0 ({unit_text}): the features, divided by sigma0, are divided by the "
                    f"scale {k!r} again, {'below' if k <= tiny else 'above'} {np.dtype(dtype).name}'s range "
                    f"({tiny:.4g} to {float(np.finfo(dtype).max):.4g}; the features' dtype); pass scales within "
                    f"it (a sigma0 nearer the sigmas you sweep, with scales nearer 1)")
            if low > floor and high <= info.max:
                continue
            what = (f"is {low!r}, below {np.dtype(dtype).name}'s smallest normal number ({tiny:.4g}; the features' "
                    f"dtype): the features divided by it overflow" if 0 < low <= floor else
                    f"is {low if low <= floor else high!r}, outside float64's range")
            raise ValueError(f"scales: {k!r} x sigma0 ({unit_text}) {what}; pass scales whose sigma = scale x sigma0 "
                             f"lies within it")


def _scale_checkpoint(root: Path, k: float) -> Path:
    """Scale ``k``'s checkpoint folder under ``root``: :func:`scale_folder`'s name, which the user reads
    (``scale_0.5``, as a saved sweep's), unless only the folder that versions before 2026-12-01 named by
    ``float.hex`` (``scale_0x1.0000000000000p-1``) exists: that one is resumed where it is, not renamed (a
    rename under another process of the same run, or a crash half-way, would lose it)."""
    folder = root / scale_folder(k)
    old = root / f"scale_{float(k).hex()}"
    return old if old.is_dir() and not folder.exists() else folder


def _sigma_named(k: float, sigma) -> tuple[str, str]:
    """``(said, named)``: how a bound call at the scalar σ ``k`` on the features divided by sigma0 names its noise
    (``Gaussian(sigma=1)``), and the σ = k·sigma0 (``sigma``, a scalar or one per feature) it stands for."""
    from hcrfast.noise import Gaussian, per_feature_label

    said = Gaussian(float(k)).describe().split(":")[0]
    if np.ndim(sigma) == 0:   # a scalar sigma0 too far from 1, divided out
        return said, (f"{Gaussian(float(sigma)).describe().split(':')[0]} (sigma0 x {k:g}: run as {said} on the "
                      f"features divided by sigma0)")
    return said, (f"{per_feature_label(np.asarray(sigma, dtype=np.float64))} (sigma0 per feature x {k:g}: run as "
                  f"{said} on the features divided by sigma0)")


def _per_feature_named(exc: BaseException, k: float, sigma) -> BaseException:
    """``exc``, raised by the bound call at the scalar σ ``k`` on the features divided by a per-feature sigma0,
    with its message naming the per-feature σ = k·sigma0 it stands for where it named the scalar noise
    (``Gaussian(sigma=1)``, the scale, read as a σ the user never gave); ``exc`` itself where it did not."""
    said, named = _sigma_named(k, sigma)
    text = str(exc)
    if said not in text or len(exc.args) != 1:
        return exc
    try:
        new = type(exc)(text.replace(said, named, 1))
    except Exception:   # (an exception type that takes other arguments: kept as it came)
        return exc
    new.__dict__.update(exc.__dict__)   # (its notes, and marks such as hcrfast_argument)
    return new.with_traceback(exc.__traceback__)


def _folder_whitened(folder: Path) -> bool | None:
    """Whether the :func:`hcrfast.bound` checkpoint in ``folder`` (a σ of a search or sweep with one std per
    feature) was made on the whitened model (reuse on: a scalar σ's noise) or as a plain per-feature call (reuse
    off: :class:`~hcrfast.noise.PerFeatureGaussian` noise); None where it holds no readable bound key (the call
    writes or refuses it)."""
    from hcrfast.checkpoint import FORMAT
    from hcrfast.noise import _stored_key

    stored = _stored_key(folder)
    if stored.get("format") != FORMAT or not isinstance(stored.get("noise"), str):
        return None
    return not stored["noise"].startswith("PerFeatureGaussian(")


def _reuses(batch, n: int, bound_kwargs: dict) -> bool:
    """Whether the calls' solver keeps σ-free factors to share (the dense solve, the Krylov basis): only then
    is a per-feature σ run as a scalar one on the whitened model. LSQR has nothing to share, and on the
    whitened problem converges elsewhere (medians 2e-4 apart): its calls stay plain per-feature ones."""
    from hcrfast.algorithm import resolve_solver

    with warnings_ignored((None, Warning)):  # the calls themselves say what resolve_solver has to say
        solver = resolve_solver(bound_kwargs.get("solver", "auto"), bound_kwargs.get("linearize_at", "input"),
                                batch.device, n, batch[0].numel(), lsqr_given=bound_kwargs.get("lsqr") is not None)
    return solver in ("dense", "krylov")


@contextlib.contextmanager
def _reusing(reuse_bytes: int):
    """Calls inside share σ-free factors up to ``reuse_bytes`` (none where 0)."""
    if not reuse_bytes:
        yield None
        return
    from hcrfast.algorithm import reusing_factors

    with reusing_factors(reuse_bytes) as store:
        yield store


def _next_scale(k, stat, goal, history, meets, misses) -> float:
    """The next scale: a secant step on log statistic against log scale through the last two calls (1 at
    first: bounds proportional to σ; clipped to [0.2, 5], and 1 where the statistic did not grow between
    them), at most :data:`MAX_STEP` from the current scale, and the geometric midpoint of the bracket where
    the step leaves it. The step is taken in log space and clipped there: a statistic many orders of
    magnitude from the goal (a model past its peak, float rounding) moves σ by :data:`MAX_STEP`, never
    overflows.

    The secant is local (the last two calls), not the bracket's: the statistic's log-log slope changes
    with σ (a CIFAR-10 CNN's from ~1.3 near σ0 to ~0.5 at 20 σ0), and a slope taken from a far bracket
    end steps short again and again (regula falsi's one-sided stall: 8 calls where this takes 5)."""
    slope = 1.0
    pts = [(h["scale"], h["statistic"]) for h in history if 0 < h["statistic"] < math.inf]
    if len(pts) >= 2:  # (a bracket's two ends, where both are finite and > 0, are among these points)
        (k1, s1), (k2, s2) = pts[-1], pts[-2]
        if k1 != k2 and s1 != s2:
            measured = math.log(s1 / s2) / math.log(k1 / k2)
            if measured > 0:  # (a statistic that fell as σ grew says nothing of how far to go: bounds ∝ σ)
                slope = min(max(measured, 0.2), 5.0)
    widest = math.log(MAX_STEP)
    if stat > 0:
        log_step = (math.log(goal) - math.log(stat)) / slope
        # within MAX_STEP the plain power (bitwise the scales searched before the step was taken in logs)
        k_next = k * (goal / stat) ** (1.0 / slope) if abs(log_step) < widest else k * math.exp(
            math.copysign(widest, log_step))
    else:
        k_next = k * MAX_STEP  # bounds of 0 say nothing of how far: go up fast
    k_next = min(max(k_next, k / MAX_STEP), k * MAX_STEP)
    if meets is not None and misses is not None and not misses[0] < k_next < meets[0]:
        k_next = math.sqrt(misses[0] * meets[0])
    return float(k_next)


def _standing(history: list, target: float):
    """``(meets, misses, best)`` from the calls so far, each ``(scale, statistic)`` or None: the smallest scale
    that met the target; the largest that missed it below that one (any that missed, where none met: the
    bracket's lower end); and of those that missed, the one with the largest statistic (the smallest scale
    among equals)."""
    pts = [(h["scale"], h["statistic"]) for h in history]
    met = [p for p in pts if p[1] >= target]
    meets = min(met) if met else None
    missed = [p for p in pts if p[1] < target]
    below = [p for p in missed if meets is None or p[0] < meets[0]]
    misses = max(below) if below else None
    best = max(missed, key=lambda p: (p[1], -p[0])) if missed else None
    return meets, misses, best


#: Where no σ tried meets the target and the statistic fell on both sides of its largest value, the search probes
#: the wider side of that peak this far into it (in log σ: golden-section search) while calls remain, the scales
#: around it are more than (1 + rtol)² apart and both their statistics more than rtol below it: the
#: target may lie under the peak between them, and where it does not the σ returned comes closest. Before, it
#: stopped at the bracket: a peak of ~290 was reported as 100.6, the scale tried nearest it, with 5 of 8 calls
#: unspent.
_GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0


def _search(run, target: float, goal: float, rtol: float, max_calls: int, what: str, history: list,
            zeros=None):
    """The calls of :func:`sigma_for`: ``(meets, best, note, kept)``, the smallest scale that met the target
    and, of the scales that missed it, the one whose statistic came closest (the largest; the smallest scale
    among equals), as ``(scale, statistic)`` or None, why the search ended, and the bounds of those scales
    and the bracket's (the other calls' are dropped as the search goes: a batch's bounds hold its inputs'
    size several times over).

    Where no call met the target the search ends without one once the statistic stops growing with σ: when
    it fell past its largest value on both sides of it (a peak below the target, once the calls left have narrowed
    the scales around it to (1 + rtol)² apart, or one's statistic to within rtol of it: :data:`_GOLDEN`), or
    when it stayed 0 over a
    step of :data:`MAX_STEP` (no step of the bound moved the modes asked about; ``zeros(bounds)`` says how
    many). Where the largest value was at the smallest σ tried, the search first looks below it. A bound call
    after the first that raises ``ValueError`` or an ``ArithmeticError`` (σ out of the range the solver
    resolves) ends the search too, with what the calls before it found."""
    meets, misses, best = None, None, None
    k, note, kept = 1.0, "", {}
    while True:
        try:
            res, stat = run(k)
        except (ValueError, ArithmeticError) as exc:
            if not history:  # the first call: what is wrong is the arguments, not the sigma
                raise
            first = (str(exc).splitlines() or [""])[0]
            note = (f"bound call {len(history) + 1}, at sigma scale {k:.6g} x sigma0, raised {type(exc).__name__} "
                    f"({first[:300]}): the search ended there, with what the {len(history)} calls before it found")
            break
        kept[k] = res
        if math.isinf(stat):
            meets = (k, stat)
            note = (f"the {what} is +inf: at least that share of the bounds are infinite (D = 0: directions no "
                    f"unbiased estimator can estimate), at this and any smaller sigma alike; lower the quantile "
                    f"or restrict the modes to ask about the finite ones")
            break
        meets, misses, best = _standing(history, target)
        if target <= stat <= target * (1.0 + rtol):
            note = f"the statistic lies within rtol={rtol:g} above the target"
            break
        probe = None
        if meets is None:  # does the statistic still grow with sigma?
            scales = [h["scale"] for h in history]
            if best[1] == 0 and max(scales) >= min(scales) * MAX_STEP * (1 - 1e-12) and not _rounding_zeros(res):
                zero = "" if zeros is None else f"; {zeros(res)}"
                note = (f"the {what} stayed 0 from sigma scale {min(scales):.6g} to {max(scales):.6g} x sigma0 "
                        f"(a factor {max(scales) / min(scales):.6g}{zero}): no step of the bound moved the modes "
                        f"that statistic falls on, at any of these sigmas, so more noise does not lift their "
                        f"bounds. Modes the features do not see (the model's Jacobian is 0 on them: no unbiased "
                        f"estimator exists, their bound is +inf) show as 0 here: hcrfast.targeted_bound(model, "
                        f"batch, sigma, null_probes=True) certifies them; or ask about the modes the features "
                        f"see (modes=..., or a quantile above the share of 0 bounds). Bounds of 0 throughout "
                        f"can also be steps that round to nothing in the model's dtype (float32)")
                break
            lower = [c for c in scales if c < best[0]]
            upper = [c for c in scales if c > best[0]]
            if lower and upper:
                low, top = max(lower), min(upper)
                fell = next(h["statistic"] for h in history if h["scale"] == top)
                beside = max(fell, next(h["statistic"] for h in history if h["scale"] == low))
                # (in logs: (1 + rtol) ** 2 overflowed for rtol past 1e154)
                wide_apart = math.log(top / low) > 2.0 * math.log1p(rtol)
                # a scale beside it within rtol of it: the peak is known to about rtol (or a plateau, noise on one)
                flat = beside * (1.0 + rtol) >= best[1]
                if len(history) < max_calls and wide_apart and not flat:
                    # the peak is bracketed but the target may still lie under it, between the scales tried
                    # (a step of 100 jumped over it): a golden-section step, in log sigma, into the wider side
                    wide = math.log(top / best[0]) >= math.log(best[0] / low)
                    probe = best[0] * ((top / best[0]) if wide else (low / best[0])) ** _GOLDEN
                else:
                    note = (f"the {what} stopped growing with sigma: it peaked at {best[1]:.6g} (sigma scale "
                            f"{best[0]:.6g} x sigma0) among the sigmas tried, under the target, and "
                            + (f"fell to {fell:.6g}" if fell < best[1] else f"stayed at {fell:.6g}")
                            + f" at {top:.6g} x sigma0 (the features saturate, or at large sigma the model's dtype "
                            f"rounds the steps away); the scales tried on either side of it are {top / low:.4g}x "
                            f"apart"
                            + (f" (max_calls={max_calls} ended the search for the peak between them)"
                               if wide_apart and not flat else
                               f", one of their statistics within rtol={rtol:g} of it" if flat else "")
                            + "; lower the target, or see the curve around the peak with hcrfast.sweep_sigma")
                    break
            elif upper and best[1] > 0:  # the largest value at the smallest sigma tried: the peak may lie below it
                probe = max(best[0] * best[0] / min(upper), best[0] / MAX_STEP)
        if len(history) >= max_calls:
            note = f"stopped after max_calls={max_calls} bound calls"
            if meets is None:
                note += (" with the statistic still under the target; raise max_calls (each call is one full bound "
                         "of the batch), or check that the bounds can reach the target at all (they stop growing "
                         "where the features saturate)")
            break
        k_next = probe if probe is not None else _next_scale(k, stat, goal, history, meets, misses)
        if meets is not None and misses is not None and meets[0] <= misses[0] * (1.0 + rtol / 8):
            # the statistic jumps across the target within a narrow range of sigma: no smaller sigma
            # worth another call
            note = (f"the target lies between sigma scales {misses[0]:.6g} ({misses[1]:.6g}) and {meets[0]:.6g} "
                    f"({meets[1]:.6g}), {rtol / 8:g} apart: the statistic jumps there")
            break
        wanted = {pair[0] for pair in (meets, misses, best) if pair is not None}
        kept = {c: r for c, r in kept.items() if c in wanted}
        if not 0.0 < k_next < math.inf:  # (many steps of MAX_STEP one way)
            note = f"the next sigma scale ({k_next!r} x sigma0) is out of the floating-point range"
            break
        if any(h["scale"] == k_next for h in history):  # the step came back to a scale already tried
            note = "the search came back to a sigma it had tried"
            break
        k = k_next
    return meets, best, note, kept
