"""The published experiments end to end: ``hcrfast reproduce NAME``.

One run evaluates the first ``examples`` test (ImageNet: validation) images of an
experiment of METHOD.md §3 with the experiment's published parameters, unless
overridden:

1. the model ``zoo.build(name, weights)`` (digits: trained here on first use);
2. the clean features ``a(θ)`` of the *normalized* images, σ = sigma_scale × RMS
   of those features over all evaluated examples, the clean accuracy (head on
   ``a(θ)``) and the dithered accuracy (head on ``a(θ) + Z``, one draw Z per
   restart, averaged over the draws);
3. HCR bounds with :func:`hcrfast.bound` on ``zoo.features`` and the normalized
   images. The bounds are therefore bounds on estimators of the DCT coefficients
   of the *normalized* image, as in the paper (METHOD.md §3: reconstructions
   add the bound to "the DCT of the normalized image"). A bound in [0, 1] pixel
   units is the normalized one times the channel's std;
4. the outputs: ``bounds.npz``, ``summary.json``, figures and ``report.html``
   (:mod:`hcrfast.report`).

Resumable and sharded
---------------------
The examples are cut into chunks of ``chunk_examples``; each chunk is computed
by one :func:`hcrfast.bound` call and written atomically (temporary file, then
``os.replace``) as ``OUT/chunks/chunk_00000.npz``, with the run's key (every
argument that changes the numbers) inside. ``OUT/run.json`` holds the key and
σ. A rerun with the same arguments skips the chunks already written; different
arguments in the same ``OUT`` are refused. Every example draws its noise from
its own stream (``example_ids``), and a rerun uses the σ stored in ``run.json``,
so a killed and restarted run ends with the bounds of an uninterrupted one.

Under ``torchrun`` (``WORLD_SIZE`` and ``RANK`` set) every process takes the
chunks ``c`` with ``c % world_size == rank`` (``torch.distributed`` with gloo on
the CPU, NCCL on CUDA); rank 0 fixes σ for all once every process has shown the
same run key, and when all are done merges the chunks and writes the outputs. A
process's error stops the others at their next step (:mod:`hcrfast.distributed`).
Bitwise equality with a one-process run holds when every process computes with
the same arithmetic: on the CPU the same number of threads (torchrun sets
``OMP_NUM_THREADS=1`` unless it is set).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import re
import shlex
import sys
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hcrfast.backend import warnings_ignored

import hcrfast
from hcrfast import algorithm as _algorithm
from hcrfast import checkpoint as _checkpoint
from hcrfast import validation
from hcrfast.distributed import ShardError as _ShardError, World as _World, differences, join_timeout
from hcrfast.checkpoint import (CheckpointMismatchError, arithmetic_of, atomic_savez, atomic_write_text, check_key,
                                mixed_arithmetic, sha256_tensors)
from hcrfast import data as _data
from hcrfast import zoo as _zoo
from hcrfast.results import _FORMAT as BOUNDS_FORMAT, counted, mse_from_modes, save_npz, targets_baseline

__all__ = ["DEFAULT_CHUNK_EXAMPLES", "DEFAULT_RESTARTS", "EXPERIMENTS", "RunMismatchError", "RunResult", "run"]

EXPERIMENTS = _zoo.NAMES
DEFAULT_RESTARTS = 25
# Examples per resumable chunk: about a minute of work per chunk on 2 CPU cores
# for digits/MNIST; the ImageNet models take far longer per example.
DEFAULT_CHUNK_EXAMPLES = {"digits": 64, "mnist": 64, "cifar10": 32, "resnet18": 8, "swin_t": 8}
_TRAINED_HERE = {"digits"}
# 2: float64-rounded D = 0 bounds 0, not +inf; 3: zero steps say why; 4: a chunk's targeted steps bound every
# mode they move, not only their own (all 2026-11-25); 5: bounds rounded outward, as hcrfast.bound checkpoint/5
# (2026-11-30); 6: D past float64's rounding of the passes, as hcrfast.bound checkpoint/6 (2026-11-30); 7: the dense
# solve's rank rule, as hcrfast.bound checkpoint/7 (changed 2026-11-30 without a bump of 6, bumped 2026-12-01; every
# change of the numbers a chunk holds must bump it); older are refused
_FORMAT = 7
# A rerun takes σ from run.json; one computed afresh must agree to this relative tolerance
# (the float32 features may differ in the last bits with the thread count).
_SIGMA_RTOL = 1e-5

_ISTOP_MEANING = {
    0: "x = 0 is the exact solution",
    1: "Ax - b small enough (atol, btol)",
    2: "least-squares residual small enough (atol)",
    3: "condition estimate exceeded conlim",
    4: "Ax - b small to machine precision",
    5: "least-squares residual small to machine precision",
    6: "condition estimate too large for machine precision",
    7: "iteration limit reached",
    -1: "no LSQR: solved exactly by the dense path (solver='dense')",
    -2: "no LSQR: projected on the example's Krylov basis (solver='krylov')",
}


class RunMismatchError(CheckpointMismatchError):
    """The output directory holds a run made with different arguments."""


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` produced (rank 0 of a distributed run; others get ``summary=None``).

    Attributes
    ----------
    out : pathlib.Path
        The output directory.
    bounds_path, summary_path, report_path : pathlib.Path
        ``bounds.npz``, ``summary.json``, ``report.html`` in ``out``.
    summary : dict or None
        The content of ``summary.json``.
    chunks_computed, chunks_reused : int
        Chunks this process computed, and chunks found finished and reused.
    """

    out: Path
    bounds_path: Path
    summary_path: Path
    report_path: Path
    summary: dict | None
    chunks_computed: int
    chunks_reused: int


# ----------------------------------------------------------------------------------------
# small helpers


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _weights_fingerprint(path: Path) -> str:
    """The run key's name for a weights file: SHA-256 of its state dict's names, shapes, dtypes and
    values, so that the same weights saved twice (torch.save writes the file's name into the archive)
    are the same weights; the file's bytes when it holds no state dict (zoo.build says why later)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - not a state dict: zoo.build's own error explains it
        return f"sha256:{_sha256_file(path)}"
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return f"sha256:{_sha256_file(path)}"
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(f"{k}:{tuple(state[k].shape)}:{state[k].dtype}:".encode())
        h.update(sha256_tensors(state[k]).encode())
    return f"state-dict-sha256:{h.hexdigest()}"


def _json_str(obj) -> str:
    return json.dumps(obj, sort_keys=True, indent=1)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return str(datetime.timedelta(seconds=seconds))


def _say(progress: bool, text: str) -> None:
    if progress:
        validation.say(text)


def _positive_int(name: str, value, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r} ({flag})")
    return int(value)


def _positive_float(name: str, value, flag: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r} ({flag})") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r} ({flag})")
    return v


#: What a run writes in its OUT once its chunks are done (``hcrfast reproduce`` refuses an OUT holding a file
#: of the user's at one of these names); in an OUT of an hcrfast from before OUTPUTS_LIST, these are hcrfast's
#: where run.json is there.
REPRODUCE_OUTPUTS = ("bounds.npz", "summary.json", "report.html", "hist_all.png", "hist_lowfreq.png",
                     "reconstructions.png", "bound_images.png", "bound_modes.png")


# ----------------------------------------------------------------------------------------
# weights


def _weights(name: str, weights, out: Path, *, world: _World, progress: bool, train_epochs):
    """What to pass to ``zoo.build`` and how to name it in the run key and the report.

    Returns ``(weights_arg, fingerprint, description, trained)``: ``trained`` is False for a random
    initialization only (a state dict of the user's is taken as given).
    """
    _check_weights(name, weights)
    trained_here = weights is None and name in _TRAINED_HERE
    path = out / f"{name}_state_dict.pt"
    if trained_here and world.rank == 0 and not path.is_file():
        from hcrfast import train as _train

        _say(progress, f"hcrfast reproduce {name}: no --weights given; training the {name} model first "
                       f"(saved to {path} and reused on reruns)")
        _train.train(name, out=path, progress=progress, epochs=train_epochs, seed=0)  # written atomically
    # as long as rank 0's training takes; every process comes here, so that one given other weights
    # meets the others at the next step, where the run keys name the difference
    world.agree("weights")
    if trained_here:
        return path, _weights_fingerprint(path), f"{path} (trained by hcrfast reproduce)", True
    if weights is None:
        message = (f"{name}: no --weights given, so the model is RANDOMLY INITIALIZED: the bounds and "
                   f"accuracies are NOT the published ones. Pass --weights default to download "
                   f"torchvision's ImageNet weights (once), or --weights PATH to a state dict.")
        validation.warn(message)
        if world.rank == 0:
            validation.say("\n" + "!" * 78 + f"\nWARNING: {message}\n" + "!" * 78 + "\n")
        return None, "random-init:seed=0", "random initialization (seed 0): NOT the published weights", False
    if weights == "default":
        _, enum, _ = _zoo._torchvision(name)
        return "default", f"torchvision:{enum}", f"torchvision {enum}", True
    path = Path(weights).expanduser()
    return path, _weights_fingerprint(path), str(path), True


def _check_weights(name: str, weights) -> None:
    """The refusals of ``--weights`` that need nothing trained or loaded (run before the run folder is made)."""
    if weights is None and name in ("mnist", "cifar10"):
        raise ValueError(
            f"{name} needs trained weights: run `hcrfast train {name}` first (add --download to fetch "
            f"the data; it writes ./{name}_state_dict.pt) and pass --weights {name}_state_dict.pt"
        )
    if weights is None:
        return
    if weights == "default":
        if name not in ("resnet18", "swin_t"):
            raise ValueError(f"--weights default exists only for resnet18 and swin_t (torchvision's ImageNet "
                             f"weights); for {name} run `hcrfast train {name}` and pass the state dict's path")
        return
    path = Path(weights).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"No weights file at {path.resolve()} (--weights). Pass a state dict saved by "
                                f"`hcrfast train {name}`" + (" or 'default'" if name in ("resnet18", "swin_t") else ""))


# ----------------------------------------------------------------------------------------
# features, σ, accuracies


def _features(zm, xn: torch.Tensor, batch: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([zm.features(xn[i:i + batch]).reshape(min(batch, xn.shape[0] - i), -1)
                          for i in range(0, xn.shape[0], batch)])


def _accuracies(zm, feats: torch.Tensor, labels: torch.Tensor, sigma: float, *, seed: int, restarts: int):
    """Clean accuracy and the accuracy on dithered features, one noise draw per restart
    (:func:`hcrfast.utility.accuracy_on_features`: example e draws its R noise vectors from
    ``default_rng([seed, e, DITHER_STREAM])``, apart from the start-vector stream ``default_rng([seed, e])``
    of :func:`hcrfast.start_vectors`). Returns ``(clean, dithered_mean, dithered_per_draw)``.
    """
    from hcrfast.utility import accuracy_on_features

    u = accuracy_on_features(zm.head, feats, labels, sigma, draws=restarts, seed=seed)
    return u.clean, u.dithered, u.per_draw.tolist()


# ----------------------------------------------------------------------------------------
# chunks


def _chunk_path(out: Path, c: int) -> Path:
    return out / "chunks" / f"chunk_{c:05d}.npz"


def _read_chunk(path: Path, key_json: str, ids: np.ndarray):
    """A finished chunk's arrays, or None if the file is absent or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:   # (zlib: a damaged text member)
        validation.warn(f"{path} is unreadable ({exc}); computing that chunk again")
        return None
    if str(arrays.get("key")) != key_json:
        raise RunMismatchError(
            f"{path} was written by a run with other arguments than this one (its key differs from "
            f"run.json's). Use a fresh --out, or delete {path.parent}")
    if not np.array_equal(arrays.get("example_ids"), ids):
        raise RunMismatchError(f"{path} holds examples {arrays.get('example_ids')} instead of {ids}; use a fresh --out")
    return arrays


_CHUNK_ARRAYS = ("std", "mse", "eps", "z", "divergence", "best_restart", "lsqr_iterations", "lsqr_istop",
                 "std_algorithm1")


def _compute_chunk(zm, xn, ids, sigma, cfg, lsqr) -> dict:
    res = hcrfast.bound(
        zm.features, xn, sigma, size=cfg["size"], iterations=cfg["iterations"], restarts=cfg["restarts"],
        seed=cfg["seed"], linearize_at=cfg["linearize_at"], example_ids=ids, progress=False,
        lsqr=None if cfg.get("solver") == "dense" else lsqr,  # the dense solve runs no LSQR (the key keeps lsqr)
        targets=cfg.get("targets"), warm_start=cfg["warm_start"], solver=cfg.get("solver", "lsqr"),
        iterates=cfg.get("iterates", "last"),  # a key without it is a run from before: Algorithm 1's last iterates
        krylov_pilots=cfg.get("krylov_pilots", 1), singular_steps=cfg.get("singular_steps", 0),
    ).to_numpy()
    # Without targets Algorithm 1's bounds are the bounds.
    arrays = {k: np.asarray(getattr(res, k) if getattr(res, k, None) is not None else res.std)
              for k in _CHUNK_ARRAYS}
    arrays["seconds"] = np.float64(res.seconds)
    # restarts whose D float64's rounding may move by more than 1e-6 (bounds kept, warned), the worst estimate
    # (and the singular steps', counted apart)
    r = res.params["rounding"]
    # (and the restarts whose model-dtype shifts strayed from float64's, at examples whose bounds take theirs:
    # hcrfast.algorithm._dtype_drift, with the worst stray)
    arrays["rounding"] = np.array([r["restarts"], r["worst"], r.get("singular_steps", 0), r.get("worst_singular", 0.0),
                                   r.get("dtype_drift", 0), r.get("worst_drift", 0.0)], np.float64)
    # the singular steps' account (examples, (example, mode) bounds they raised, seconds), summed over chunks
    sing = res.params.get("singular_steps")
    if sing:
        taken = sing.get("directions") or {}   # (directions the examples had in all, the fewest an example had)
        arrays["singular"] = np.array([sing["examples"], sing["modes_lifted"], sing["seconds"],
                                       taken.get("total", np.nan), taken.get("fewest", np.nan)], np.float64)
    # what a rerun of this chunk needs besides (its ids, chunk size, torch threads, versions), which a resumed run's
    # chunks may not share: bounds.npz's params["run"] merges them (_merged_run)
    arrays["run"] = np.array(_json_str(res.params["run"]))
    # the call's run-wide parameters, for bounds.npz's Bounds header
    arrays["bound_params"] = np.array(_json_str({k: res.params.get(k) for k in _RUN_WIDE_PARAMS}))
    # (example, restart, why: _ZERO_STEP_KINDS) of every restart that bounds nothing: its D = 0, if
    # any, proves no +inf. Kept per chunk so that the merge after a resume still knows them.
    arrays["zero_steps"] = np.array(
        [(int(ids[0]) + int(m["e"]), int(m["r"]), _zero_step_kind(line)) for line in res.params["zero_step_reasons"]
         for m in [_ZERO_STEP_LINE.match(line).groupdict()]], dtype=np.int64).reshape(-1, 3)
    return arrays


#: Why a restart bounds nothing, by the code in the third column of a chunk's ``zero_steps``.
_ZERO_STEP_KINDS = {0: "eps_zero", 1: "at_zero_jacobian", 2: "rounded", 3: "uncertified", 4: "coarse"}


def _zero_step_kind(line: str) -> int:
    """The :data:`_ZERO_STEP_KINDS` code of one of hcrfast.bound's zero-step reasons."""
    kind = _algorithm.zero_step_kind(line)
    return {"eps_zero": 0, "at_zero_jacobian": 1, "rounded": 2, "uncertified": 3, "coarse": 4}[kind]


def _merged_run(parts, example_ids, chunk_examples: int) -> dict:
    """``params["run"]`` of bounds.npz: the ids of every example, ``chunk_examples`` (examples per resumable chunk,
    ``--chunk-examples``), and the chunk size (examples per chunk of each chunk's :func:`hcrfast.bound` call), torch
    threads and versions the chunks recorded where they agree; where chunks computed in different sessions (a
    resumed run) differ, or one from before they were recorded has none, that entry is None and ``differ`` lists
    what they recorded (:func:`hcrfast.results.merged_run`)."""
    from hcrfast.results import merged_run

    records = [json.loads(str(p["run"])) if "run" in p else None for p in parts]
    return dict(merged_run(records, example_ids, caps=[len(p["example_ids"]) for p in parts]),
                chunk_examples=int(chunk_examples))


# The entries of hcrfast.bound's params that are the same for every chunk of a run.
_RUN_WIDE_PARAMS = ("noise", "certify", "basis", "jacobian", "dtype", "tf32", "solver", "warm_start", "iterates", "lsqr",
                    "device", "n_features", "n_inputs")


# How hcrfast.bound's params["zero_step_reasons"] begin: the example's place in the batch, the restart.
_ZERO_STEP_LINE = re.compile(r"example (?P<e>\d+), restart (?P<r>\d+): ")


# ----------------------------------------------------------------------------------------
# run.json


def _check_or_write_run(out: Path, key: dict, sigma: float) -> float:
    """Rank 0: σ of the run in ``out`` (writing run.json for a fresh one), or raise on a mismatch."""
    path = out / "run.json"
    if path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RunMismatchError(f"{path} is unreadable ({exc}); use a fresh --out") from exc
        old = stored.get("key", {}).get("format") if isinstance(stored.get("key"), dict) else None
        if old != key.get("format"):   # no rerun resumes it: its bounds are not this version's
            raise RunMismatchError(
                f"{out} holds a run written by another version of hcrfast (format: {old} -> {key.get('format')}), "
                f"whose chunks this one does not mix with its own (see the README's notes on run folders); pass a "
                f"fresh --out (or delete {out}) to compute the run again")
        try:
            check_key(out, stored.get("key", {}), key, f"Rerun with the same arguments to resume it, or pass a "
                                                          f"fresh --out (or delete {out}) to start a new run.")
        except CheckpointMismatchError as exc:
            raise RunMismatchError(str(exc)) from None
        stored_sigma = float(stored["sigma"])
        if abs(stored_sigma - sigma) > _SIGMA_RTOL * stored_sigma:
            raise RunMismatchError(
                f"{out} holds a run with sigma = {stored_sigma!r}, but the features now give {sigma!r}: the "
                f"data or the model changed. Use a fresh --out.")
        return stored_sigma
    atomic_write_text(path, _json_str({"key": key, "sigma": sigma}))
    return sigma


# ----------------------------------------------------------------------------------------
# summary


def _quantiles(values: np.ndarray) -> dict:
    """Percentiles, min, max and mean of the finite ``values``, zeros (which bound nothing) among them
    and counted apart, as are the infinite ones (left out)."""
    finite = values[np.isfinite(values)]
    qs = (5, 25, 50, 75, 95)
    if finite.size == 0:
        return {f"q{q}": None for q in qs} | {"finite": 0, "zero": 0, "infinite": int(values.size)}
    got = np.percentile(finite, qs)
    return ({f"q{q}": float(v) for q, v in zip(qs, got)}
            | {"min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()),
               "finite": int(finite.size), "zero": int((finite == 0).sum()),
               "infinite": int(values.size - finite.size)})


def _zero_steps_summary(zero_steps: np.ndarray, restarts: int, overflowed: np.ndarray | None = None,
                        bounded: np.ndarray | None = None) -> dict:
    """summary.json's account of the restarts whose last iterate bounds nothing (``zero_steps``: example,
    restart, :data:`_ZERO_STEP_KINDS` code; ``overflowed``: example, restart of those whose D overflowed to
    +inf, bound 0, which the chunks do not list): how many of each kind, in how many examples, and why.
    ``bounded`` (per example): whether any of its bounds is above 0; an example all of whose restarts are
    listed still bounds something where an earlier iterate (``iterates="all"``) or a singular step did, and
    is not counted as bounding nothing."""
    overflowed = np.zeros((0, 2), np.int64) if overflowed is None else np.asarray(overflowed).reshape(-1, 2)
    kinds = {name: int((zero_steps[:, 2] == code).sum()) for code, name in _ZERO_STEP_KINDS.items()}
    kinds["d_overflow"] = int(overflowed.shape[0])
    examples, per_example = np.unique(np.concatenate([zero_steps[:, 0], overflowed[:, 0]]), return_counts=True)
    all_listed = per_example >= restarts
    if bounded is not None:
        all_listed &= ~np.asarray(bounded, dtype=bool)[examples.astype(np.int64)]
    whole = int(all_listed.sum())
    # examples all of whose last iterates are listed but that an earlier iterate, a singular or a targeted step bounds
    rescued = int((per_example >= restarts).sum()) - whole
    why = {"eps_zero": "their eps came out 0 (outside the range the solver's dtype resolves)",
           "at_zero_jacobian": "J = 0 at their example (its features do not move with its input)",
           "rounded": "float64 could not resolve the shift of the features: they came out exactly unchanged, but "
                      "J eps is not 0 (sigma * size too small next to the features' size: a larger --sigma-scale "
                      "resolves it)",
           "coarse": "float64 could not establish D: the shift is within float64's rounding of features this size "
                     "(sigma * size too small next to the features' size: a larger --sigma-scale resolves it)",
           "uncertified": "D = 0 in uncertified lower-precision passes",
           "d_overflow": "their last iterate's D overflowed to +inf, a bound of 0 from that step (the model moved "
                         "its features far beyond the noise for a step of this size: a smaller --size gives finite "
                         "D; also counted in divergence.infinite; their earlier iterates may still bound)"}
    reason = ("; ".join(f"{n} because {why[k]}" for k, n in kinds.items() if n)
              + (f"; every restart of {counted(whole, 'example')} bounds nothing, so Algorithm 1 bounds "
                 f"{'its' if whole == 1 else 'their'} modes by 0, which guarantees nothing" if whole else "")
              + (f"; every restart's last iterate of {counted(rescued, 'example')} bounds nothing, but an earlier "
                 f"iterate, a singular or a targeted step bounds {'it' if rescued == 1 else 'them'}" if rescued else "")
              + ("; the other affected examples' remaining restarts still bound them"
                 if whole + rescued < examples.size else ""))
    # "rounding": both of float64's kinds together (the one count of run formats before 4)
    return {"restarts": int(zero_steps.shape[0] + overflowed.shape[0]), **kinds,
            "rounding": kinds["rounded"] + kinds["coarse"], "examples_affected": int(examples.size),
            "examples_bounding_nothing": whole, "reason": reason}


def _lsqr_stats(itn: np.ndarray, istop: np.ndarray) -> dict:
    codes, counts = np.unique(istop, return_counts=True)
    return {
        "solves": int(itn.size),
        "iterations_median": float(np.median(itn)),
        "iterations_mean": float(np.mean(itn)),
        "iterations_max": int(np.max(itn)),
        "iterations_total": int(np.sum(itn)),
        "istop_counts": {str(int(c)): int(n) for c, n in zip(codes, counts)},
        "istop_meaning": {str(int(c)): _ISTOP_MEANING.get(int(c), "?") for c in codes},
    }


def _targeted_stats(targets, std, std_algorithm1, singular_steps: int = 0):
    """How much the targeted directions lifted the bounds: gain = bound / the bound without them
    (``std_algorithm1``: Algorithm 1's, and the ``singular_steps``' where they were taken; the keys keep
    their names from before the singular steps, and ``baseline`` says what they were weighed against)."""
    if targets is None:
        return None
    lifted = std > std_algorithm1
    ok = np.isfinite(std) & np.isfinite(std_algorithm1) & (std_algorithm1 > 0)
    gain = std[ok] / std_algorithm1[ok]
    # The pairs a ratio leaves out, counted so that none is lost: a finite baseline of 0 (the targeted step
    # bounds what nothing else did: an infinite gain if it is above 0), a +inf bound the targeted step alone
    # gives (also infinite), +inf both ways (no gain: the baseline already had it).
    from_zero = np.isfinite(std_algorithm1) & (std_algorithm1 == 0)
    return {
        "targets": targets,
        "modes_lifted_fraction": float(lifted.mean()),
        "gain_over_algorithm1_all_modes": dict(
            _quantiles(gain), pairs=int(std.size),
            from_zero_baseline_lifted=int((from_zero & (std > 0)).sum()),
            from_zero_baseline_still_zero=int((from_zero & (std == 0)).sum()),
            to_infinite_by_targeted=int((np.isinf(std) & np.isfinite(std_algorithm1) & ~from_zero).sum()),
            infinite_both=int((np.isinf(std) & np.isinf(std_algorithm1)).sum())),
        "gain_over_algorithm1_lifted_modes": _quantiles(std[lifted & ok] / std_algorithm1[lifted & ok]),
        "bounds_algorithm1_only": _quantiles(std_algorithm1.ravel()),
        "baseline": targets_baseline(singular_steps),
    }


def _singular_account(singular_steps, parts) -> dict | None:
    """The singular steps' account summed over a run's chunks, as ``hcrfast.bound``'s params give it for one
    call (examples, modes_lifted, seconds); None without them, or where a chunk was computed before the
    chunks kept it."""
    if not singular_steps or any("singular" not in p for p in parts):
        return None
    each = [np.asarray(p["singular"], dtype=np.float64) for p in parts]
    total = np.sum([a[:3] for a in each], axis=0)
    account = dict(examples=int(total[0]), modes_lifted=int(total[1]), seconds=float(total[2]))
    taken = [a[3:5] for a in each if len(a) >= 5 and np.all(np.isfinite(a[3:5]))]
    if taken and len(taken) == len(each):   # (chunks from before 2026-11-30 did not count them)
        account["directions"] = dict(total=int(sum(t[0] for t in taken)), fewest=int(min(t[1] for t in taken)))
    return account


def _command_line(name, key, weights, out, data_root, threads: int) -> str:
    """The ``hcrfast reproduce`` command that resumes or repeats this run, every parameter spelt out, torch's
    thread count (``threads``, the one this run computed with) included: the bounds are bitwise only with it."""
    lsqr = key["lsqr"]
    parts = ["hcrfast", "reproduce", name, "--examples", key["examples"], "--restarts", key["restarts"],
             "--iterations", key["iterations"], "--size", repr(key["size"]), "--sigma-scale", key["sigma_scale"],
             "--seed", key["seed"], "--linearize-at", key["linearize_at"]]
    default = hcrfast.DEFAULT_LSQR
    # The dense solve runs no LSQR: its default options are left out (given, they warn as unused).
    if not (key.get("solver") == "dense" and (lsqr["atol"], lsqr["btol"], lsqr["iter_lim"])
            == (default.atol, default.btol, default.iter_lim)):
        parts += ["--lsqr-atol", lsqr["atol"], "--lsqr-btol", lsqr["btol"]]
        if lsqr["iter_lim"] is not None:
            parts += ["--lsqr-iter-lim", lsqr["iter_lim"]]
    if key["limit"]:
        parts.append("--limit")
    if key.get("targets") is not None:
        parts += ["--targets", key["targets"]]
    if key.get("singular_steps"):
        parts += ["--singular-steps", key["singular_steps"]]
    elif key.get("solver") in ("dense", "krylov"):  # none, where the default ("auto") would take 64
        parts += ["--singular-steps", 0]
    if not key["warm_start"]:
        parts.append("--cold-start")
    if key.get("iterates", "last") == "last":
        parts.append("--last-iterate")
    parts += ["--solver", key.get("solver", "lsqr")]
    if key.get("krylov_pilots", 1) != 1:
        parts += ["--krylov-pilots", key["krylov_pilots"]]
    parts += ["--chunk-examples", key["chunk_examples"], "--device", key["device_type"], "--threads", threads]
    from hcrfast._bound_cli import option_words

    if weights is not None:
        parts += option_words("--weights", weights)
    if data_root is not None:
        parts += option_words("--data", data_root)
    parts += option_words("--out", out)
    return " ".join(shlex.quote(str(p)) for p in parts)


def _beyond_range(summary: dict) -> str:
    """What the done line adds where the median bound, in the units of the [0, 1] images, passes their whole range:
    that it rules out unbiased reconstruction only (a biased estimator, one that clips to [0, 1] or uses a prior
    over the images, can come closer); "" otherwise."""
    med = summary.get("bounds_pixel_units", {}).get("q50")
    if med is None or not math.isfinite(med) or med <= 1.0:
        return ""
    return (f" ({med:.4g} in [0, 1] pixel units, {med:.3g}x the pixels' whole range: no unbiased estimator comes "
            f"near the images, but a biased one, one that clips to [0, 1] or uses a prior over the images, can)")


def _fmt_or_inf(value) -> str:
    return "inf (no finite bound)" if value is None else f"{value:.4g}"


# ----------------------------------------------------------------------------------------
# the run


def run(
    name: str,
    *,
    examples: int | None = None,
    restarts: int = DEFAULT_RESTARTS,
    iterations: int | None = None,
    size: float | None = None,
    sigma_scale: float | None = None,
    limit: bool = False,
    seed: int = 0,
    device: str = "cpu",
    out=None,
    data_root=None,
    download: bool = False,
    weights=None,
    chunk_examples: int | None = None,
    linearize_at: str = "input",
    targets: str | None = None,
    warm_start: bool = True,
    iterates: str = "all",
    solver: str = "auto",
    lsqr_atol: float | None = None,
    lsqr_btol: float | None = None,
    lsqr_iter_lim: int | None = None,
    krylov_pilots: int | str = "auto",
    singular_steps: int | str = "auto",
    progress: bool = True,
    train_epochs: int | None = None,
    crash_after_chunks: int | None = None,
) -> RunResult:
    """Run one published experiment and write its bounds, summary, figures and report.

    Parameters
    ----------
    name : {"digits", "mnist", "cifar10", "resnet18", "swin_t"}
    examples, iterations, size, sigma_scale : optional
        Default: the experiment's published values (``zoo.build(name)``'s ``examples``,
        ``iterations``/``iterations_limit``, ``size``/``size_limit``, ``sigma_scale``).
    restarts : int
        R start vectors per example (published: 25).
    limit : bool
        Use the "limit" setting (``size_limit``, ``iterations_limit``) for the defaults.
    seed : int
        Seeds the start vectors and the dithering noise (per example).
    device : {"cpu", "cuda"}
    out : path, optional
        Output directory; default ``runs/NAME`` (``runs/NAME_limit`` with ``limit``).
    data_root, download :
        ``hcrfast.data.load``'s ``root`` and ``download`` (download: MNIST/CIFAR-10 only).
    weights : None, "default" or path
        None: digits is trained here (saved in ``out``, reused); mnist/cifar10 need a
        state dict (``hcrfast train``); resnet18/swin_t run randomly initialized, with a
        warning. "default": torchvision's ImageNet weights (downloaded once).
    chunk_examples : int, optional
        Examples per resumable chunk (default ``DEFAULT_CHUNK_EXAMPLES[name]``).
    linearize_at : {"input", "current"}
    targets : str, optional
        ``hcrfast.bound``'s ``targets`` (e.g. "low:8").
    singular_steps : int or "auto"
        ``hcrfast.bound``'s ``singular_steps``: default "auto", 64 with the dense or Krylov solve and 0
        with LSQR (resolved before the run's key is written); 0: none; a count needs the dense or
        Krylov solve.
    warm_start : bool
        ``hcrfast.bound``'s ``warm_start`` (False: every LSQR solve from zero, as the
        published scripts; ``--cold-start``).
    iterates : {"all", "last"}
        ``hcrfast.bound``'s ``iterates``: every iterate of Algorithm 1 bounds the modes (default), or
        the last alone, as the paper (``--last-iterate``).
    solver : {"auto", "lsqr", "dense", "krylov"}
        ``hcrfast.bound``'s ``solver`` (``--solver``); "auto" is resolved before the run's
        key is written, so a resumed run keeps the solver its chunks were computed with.
    krylov_pilots : int or "auto"
        ``hcrfast.bound``'s ``krylov_pilots`` (``--krylov-pilots``), for the Krylov solver only;
        "auto" is resolved before the run's key is written (the pilots, and each one's steps as
        the basis' ``iter_lim``), so the key and the command line spell out what ran.
    lsqr_atol, lsqr_btol, lsqr_iter_lim : optional
        Override ``hcrfast.DEFAULT_LSQR``'s stopping rules.
    progress : bool
        Progress lines on stderr.
    train_epochs : int, optional
        Epochs of the digits training when no weights are given (default: train's own).
    crash_after_chunks : int, optional
        Test hook: ``os._exit(1)`` after this process has written that many chunks.

    Returns
    -------
    RunResult
    """
    t_start = time.perf_counter()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r} (--device)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    world = _World(device)
    # Every other check inside the processes' session: one process's bad argument stops them all.
    with world.session(f"hcrfast reproduce {name}"):
        if name not in EXPERIMENTS:
            raise ValueError(f"Unknown experiment {name!r}; valid names: {', '.join(EXPERIMENTS)}")
        restarts = _positive_int("restarts", restarts, "--restarts")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r} (--seed)")
        if linearize_at not in ("input", "current"):
            raise ValueError(f"linearize_at must be 'input' or 'current', got {linearize_at!r} (--linearize-at)")
        if solver not in _algorithm.SOLVERS:
            raise ValueError(f"solver must be one of {', '.join(_algorithm.SOLVERS)}, got {solver!r} (--solver)")
        if solver in ("dense", "krylov") and linearize_at != "input":
            raise ValueError(f"--solver {solver} works on J at the input only; it needs --linearize-at input "
                             f"(or use --solver lsqr)")
        lsqr_given = {k: v for k, v in (("atol", lsqr_atol), ("btol", lsqr_btol)) if v is not None}  # --lsqr-*
        if lsqr_iter_lim is not None:
            lsqr_given["iter_lim"] = _positive_int("lsqr_iter_lim", lsqr_iter_lim, "--lsqr-iter-lim")
        lsqr = dataclasses.replace(hcrfast.DEFAULT_LSQR, **lsqr_given)
        chunk_examples = _positive_int("chunk_examples", DEFAULT_CHUNK_EXAMPLES[name] if chunk_examples is None
                                       else chunk_examples, "--chunk-examples")
        if crash_after_chunks is not None:
            crash_after_chunks = _positive_int("crash_after_chunks", crash_after_chunks, "test hook")
        # Values given are checked before the run folder is made or a model trained; the defaults are the model's.
        for label, value, check, flag in (("examples", examples, _positive_int, "--examples"),
                                          ("iterations", iterations, _positive_int, "--iterations"),
                                          ("size", size, _positive_float, "--size"),
                                          ("sigma_scale", sigma_scale, _positive_float, "--sigma-scale")):
            if value is not None:
                check(label, value, flag)
        if targets is not None:  # a bad --targets fails before a model is trained or a folder made
            from hcrfast.targeted import parse_targets

            parse_targets(targets, _zoo.published_parameters(name)["input_shape"], "dct")
        if singular_steps not in (0, "auto"):  # a bad --singular-steps fails before a model is trained or a folder made
            singular_steps = _positive_int("singular_steps", singular_steps, "--singular-steps")
            if solver == "lsqr" or linearize_at != "input" or (lsqr_given and solver == "auto"):
                raise ValueError(f"--singular-steps {singular_steps} takes J's smallest singular directions from "
                                 f"the dense solve or the Krylov basis, but this run solves by LSQR (--solver lsqr, "
                                 f"--linearize-at current or an --lsqr-* option); drop those, or --singular-steps")
        if krylov_pilots != "auto":  # a bad --krylov-pilots fails before a model is trained or a folder made
            krylov_pilots = _positive_int("krylov_pilots", krylov_pilots, "--krylov-pilots")
            if krylov_pilots > restarts:
                raise ValueError(f"--krylov-pilots {krylov_pilots} exceeds --restarts {restarts}; pass at most "
                                 f"{restarts}")
            shape = _zoo.published_parameters(name)
            with warnings_ignored((None, Warning)):  # the run's own resolve_solver says what it has to say
                early = _algorithm.resolve_solver(solver, linearize_at, torch.device(device), shape["n_features"],
                                                  int(np.prod(shape["input_shape"])), lsqr_given=bool(lsqr_given))
            if krylov_pilots != 1 and early != "krylov":
                raise ValueError(f"--krylov-pilots {krylov_pilots} applies to the Krylov solver, but this run solves "
                                 f"with {early!r}; add --solver krylov or drop --krylov-pilots")
        _check_weights(name, weights)
        out = Path(out if out is not None else Path("runs") / (f"{name}_limit" if limit else name))
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; pass a folder for the run (it is created if missing)")
        if out.is_dir():   # (as `hcrfast reproduce` checks it: a Python caller's OUT holds the user's files too)
            from hcrfast._bound_cli import _check_out_kind, check_outputs

            _check_out_kind(out, "reproduce")
            check_outputs(out, REPRODUCE_OUTPUTS, REPRODUCE_OUTPUTS, ("run.json",), "hcrfast reproduce ", world.rank)
        # by this call, with the parents it makes (runs/ for the default OUT): taken back if it fails early
        made = [p for p in (*reversed(out.parents), out, out / "chunks") if not p.exists()]
        fresh = not (out / "run.json").exists()
        try:
            return _run(name, examples=examples, restarts=restarts, iterations=iterations, size=size,
                        sigma_scale=sigma_scale, limit=limit, seed=int(seed), device=device, out=out,
                        data_root=data_root, download=download, weights=weights, chunk_examples=chunk_examples,
                        linearize_at=linearize_at, targets=targets, warm_start=bool(warm_start), solver=solver,
                        iterates=validation.choice("iterates", iterates, ("all", "last")),
                        lsqr=lsqr, lsqr_given=lsqr_given, krylov_pilots=krylov_pilots,
                        singular_steps=singular_steps, progress=progress, train_epochs=train_epochs,
                        crash_after_chunks=crash_after_chunks, world=world, t_start=t_start)
        except BaseException:
            if world.rank == 0:
                # a run that failed before its first chunk (a --size that overflows, say) takes back the
                # run.json it wrote, so that the corrected command may use the same --out
                try:
                    if fresh and (out / "run.json").is_file() and not any((out / "chunks").glob("*.npz")):
                        (out / "run.json").unlink()
                except OSError:   # (an --out that cannot be a folder: the run's own error says so)
                    pass
                _remove_if_empty(made)
            raise


def _remove_if_empty(folders) -> None:
    """Take back the folders a failed run made (deepest first), where nothing was written in them:
    a run refused for missing data leaves no empty ``OUT/chunks/`` behind; a trained model stays."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:  # not empty (or already gone): kept
            pass


def _run(name, *, examples, restarts, iterations, size, sigma_scale, limit, seed, device, out, data_root,
         download, weights, chunk_examples, linearize_at, targets, warm_start, iterates, solver, lsqr, lsqr_given,
         singular_steps, progress,
         train_epochs, krylov_pilots,
         crash_after_chunks,
         world, t_start) -> RunResult:
    tag = f"hcrfast reproduce {name}{world.tag}"
    token = None
    if world.rank == 0:
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "chunks").mkdir(exist_ok=True)
            token = world.mark_folder(out)  # for the others: the same folder, before anything is trained or written
        except OSError as exc:
            raise ValueError(f"--out {out}: the run folder cannot be created ({exc.strerror}: {exc.filename}); "
                             f"pass a folder you can write to") from None
    # a process that never comes is named, not waited for
    world.check_folder(out, world.agree("join", token, timeout=join_timeout())[0], "--out")
    dev = torch.device(device if device == "cpu" or world.size == 1 else f"cuda:{world.local_rank}")

    # -- data: first, so that a missing data set is named before weights are trained or downloaded --------
    spec = _zoo._SPECS[name]
    examples = spec["examples"] if examples is None else _positive_int("examples", examples, "--examples")
    t_data = time.perf_counter()
    load_kwargs = {}
    if spec["dataset"] == "imagenet":
        load_kwargs = {"resize": spec["resize"], "interpolation": spec["interpolation"]}
    if download and spec["dataset"] not in ("mnist", "cifar10"):
        _say(progress and world.rank == 0, f"{tag}: --download ignored: {spec['dataset']} is not downloadable "
                                           f"(digits ships with scikit-learn; ImageNet must be local)")
        download = False
    images, labels = _data.load(spec["dataset"], split="test", root=data_root, download=download, limit=examples,
                                **load_kwargs)
    if images.shape[0] < examples:
        validation.warn(f"{name}: asked for {examples} examples but the test split has {images.shape[0]}; "
                        f"using all {images.shape[0]}")
    n_examples = int(images.shape[0])
    seconds_load = time.perf_counter() - t_data

    # -- model ---------------------------------------------------------------------------
    weights_arg, fingerprint, weights_text, trained = _weights(
        name, weights, out, world=world, progress=progress and world.rank == 0, train_epochs=train_epochs)
    zm = _zoo.build(name, weights=weights_arg)
    zm.model.to(dev).eval()

    # -- parameters: published defaults unless given ----------------------------------------
    iterations = (zm.iterations_limit if limit else zm.iterations) if iterations is None else iterations
    iterations = _positive_int("iterations", iterations, "--iterations")
    size = _positive_float("size", (zm.size_limit if limit else zm.size) if size is None else size, "--size")
    sigma_scale = _positive_float("sigma_scale", zm.sigma_scale if sigma_scale is None else sigma_scale,
                                  "--sigma-scale")

    # -- clean features and sigma -----------------------------------------------------------
    t_features = time.perf_counter()
    xn = zm.normalize(images).to(dev)
    feats = _features(zm, xn, chunk_examples)
    sigma_fresh = hcrfast.rms_sigma(feats, sigma_scale)
    rms = sigma_fresh / sigma_scale
    seconds_data = seconds_load + time.perf_counter() - t_features  # loading and clean features
    solver = _algorithm.resolve_solver(solver, linearize_at, dev, feats.reshape(feats.shape[0], -1).shape[1],
                                       int(np.prod(xn.shape[1:])), lsqr_given=bool(lsqr_given))  # --lsqr-*: LSQR
    if krylov_pilots not in (1, "auto") and solver != "krylov":  # run() checked it on the published shapes
        raise ValueError(f"--krylov-pilots {krylov_pilots} applies to the Krylov solver, but this run solves with "
                         f"{solver!r}; add --solver krylov or drop --krylov-pilots")
    if solver == "krylov":  # the basis' own defaults, with the --lsqr-* options the user gave on top
        lsqr = dataclasses.replace(hcrfast.krylov.DEFAULT_OPTIONS, **lsqr_given)
    # "auto" is resolved before the key is written (its pilots, and their steps as the basis' iter_lim)
    krylov_pilots, lsqr = hcrfast.krylov.resolve_pilots(
        krylov_pilots, feats.reshape(feats.shape[0], -1).shape[1], int(np.prod(xn.shape[1:])), restarts, lsqr,
        solver=solver)
    singular_steps = _algorithm.resolve_singular_steps(  # "auto" resolved before the key is written
        singular_steps, solver, feats.reshape(feats.shape[0], -1).shape[1], int(np.prod(xn.shape[1:])))
    if solver == "dense" and lsqr_given:
        validation.warn(f"--solver dense solves every step exactly and runs no LSQR, so these options go unused: "
                        f"{', '.join('--lsqr-' + k.replace('_', '-') for k in lsqr_given)}; add --solver lsqr to "
                        f"solve by LSQR with them")

    key = {
        "format": _FORMAT,
        "experiment": name,
        "examples": n_examples,
        "restarts": restarts,
        "iterations": iterations,
        "size": size,
        "sigma_scale": sigma_scale,
        "limit": bool(limit),
        "seed": seed,
        "chunk_examples": chunk_examples,
        "linearize_at": linearize_at,
        "targets": targets,
        "warm_start": warm_start,
        **({"iterates": iterates} if iterates != "last" else {}),  # absent for "last": old keys (all "last") match
        "solver": solver,
        **({"krylov_pilots": krylov_pilots} if solver == "krylov" else {}),  # absent elsewhere: old keys still match
        **({"singular_steps": singular_steps} if singular_steps else {}),  # absent without: old keys still match
        "lsqr": dataclasses.asdict(lsqr),
        "device_type": dev.type,
        "dtype": str(xn.dtype).replace("torch.", ""),
        "weights": fingerprint,
        "data": f"{zm.dataset}:test:sha256:{sha256_tensors(images, labels)}",
    }
    key_json = json.dumps(key, sort_keys=True)

    # -- σ: rank 0 fixes it (from run.json on a rerun), everyone uses that one --------------
    every = world.agree("key", json.loads(key_json))
    others = [f"rank {r}: {', '.join(differences(every[0], theirs))}"
              for r, theirs in enumerate(every) if differences(every[0], theirs)]
    if others:  # a process with other arguments must not write into rank 0's run
        raise _ShardError(f"{tag}: the processes do not run the same thing; where they differ from rank 0 "
                          f"({'; '.join(others)}): give every process the same arguments")
    # rank 0's error (another run in --out) is raised on the others at this step
    sigma = world.agree("sigma", _check_or_write_run(out, key, sigma_fresh) if world.rank == 0 else None)[0]

    # -- accuracies (cheap: the head only) --------------------------------------------------
    clean_acc, dithered_acc, dithered_per_draw = _accuracies(zm, feats, labels, sigma, seed=seed, restarts=restarts)

    # -- chunks ----------------------------------------------------------------------------
    n_chunks = math.ceil(n_examples / chunk_examples)
    mine = [c for c in range(n_chunks) if c % world.size == world.rank]
    ids_of = {c: np.arange(c * chunk_examples, min(n_examples, (c + 1) * chunk_examples), dtype=np.int64)
              for c in range(n_chunks)}
    todo = [c for c in mine if _read_chunk(_chunk_path(out, c), key_json, ids_of[c]) is None]
    reused = len(mine) - len(todo)
    if world.rank == 0:
        _say(progress, f"{tag}: {n_examples} examples x {restarts} restarts, {iterations} iterations, "
                       f"size {size:.4g}, sigma = {sigma_scale:g} x RMS = {sigma:.4g}, solver {solver}; "
                       f"clean accuracy {clean_acc:.4f}, dithered {dithered_acc:.4f}; "
                       f"{n_chunks} chunk{'s' if n_chunks != 1 else ''} of {min(chunk_examples, n_examples)} "
                       f"examples in {out}")
    if reused:
        _say(progress, f"{tag}: {reused} of my {len(mine)} chunks already finished, reusing them")

    # Not in the key (a resume on another machine is allowed), but the last bits of the bounds depend
    # on it: each chunk records it, and a merge of chunks computed with different ones says so.
    arithmetic = arithmetic_of(dev)  # on the CPU with torch's thread count
    t_chunks = time.perf_counter()
    eta_of = _algorithm._Eta(t_chunks)   # (the first chunk's one-off costs left out once a second is done)
    examples_total = sum(len(ids_of[c]) for c in mine)
    examples_done = sum(len(ids_of[c]) for c in mine if c not in todo)
    for k, c in enumerate(todo, 1):
        ids = ids_of[c]
        arrays = _compute_chunk(zm, xn[ids[0]:ids[-1] + 1], ids, sigma, key, lsqr)
        arrays.update(key=np.array(key_json), chunk=np.int64(c), example_ids=ids, arithmetic=np.array(arithmetic))
        atomic_savez(_chunk_path(out, c), **arrays)
        examples_done += len(ids)
        elapsed = time.perf_counter() - t_chunks
        left = sum(len(ids_of[d]) for d in todo[k:])
        eta = eta_of(sum(len(ids_of[d]) for d in todo[:k]), left)
        _say(progress, f"{tag}: chunk {c + 1}/{n_chunks} done: examples {examples_done}/{examples_total}"
                       f"{'' if world.size == 1 else ' of this rank'}, {_duration(elapsed)} elapsed, "
                       f"ETA {_duration(eta)}")
        if crash_after_chunks is not None and k >= crash_after_chunks:
            # Test hook for the resume test: die as a kill would, without cleanup.
            if sys.stderr is not None:
                sys.stderr.flush()
            os._exit(1)
    # every chunk is in the folder now (or a process's error is raised here); the counts are the run's, all ranks'
    computed_all, reused_all = (sum(v) for v in zip(*world.agree("done", [len(todo), reused])))

    bounds_path, summary_path, report_path = out / "bounds.npz", out / "summary.json", out / "report.html"
    if world.rank != 0:
        return RunResult(out, bounds_path, summary_path, report_path, None, len(todo), reused)

    # -- merge (rank 0) --------------------------------------------------------------------
    parts = []
    for c in range(n_chunks):
        arrays = _read_chunk(_chunk_path(out, c), key_json, ids_of[c])
        if arrays is None:
            raise RuntimeError(f"chunk {c} ({_chunk_path(out, c)}) is missing after all processes finished; "
                               f"rerun the same command to compute it")
        parts.append(arrays)
    merged = {k: np.concatenate([p[k] for p in parts]) for k in _CHUNK_ARRAYS}
    arithmetics = sorted({str(p["arithmetic"]) if "arithmetic" in p else "not recorded" for p in parts})
    mixed_arithmetic(out, arithmetics, "resume with the first run's --threads to keep them bitwise")
    example_ids = np.concatenate([p["example_ids"] for p in parts])
    run = _merged_run(parts, example_ids, chunk_examples)
    bound_seconds = float(sum(float(p["seconds"]) for p in parts))
    # Chunks written before zero steps were recorded have none: such runs' restarts with eps = 0 count as D = 0.
    zero_steps = np.concatenate([p.get("zero_steps", np.zeros((0, 3), np.int64)) for p in parts])
    bounding_nothing = np.zeros(merged["divergence"].shape, dtype=bool)
    bounding_nothing[zero_steps[:, 0], zero_steps[:, 1]] = True
    # (example, restart) pairs with D = 0 from a step that moved the input: their bounds are +inf
    infinite = np.argwhere((merged["divergence"] == 0) & ~bounding_nothing)
    # and those whose D overflowed to +inf: their bounds are 0, and hcrfast.bound names them in a warning only
    overflowed = np.argwhere(np.isposinf(merged["divergence"]) & ~bounding_nothing)
    params = dict(key, sigma=sigma, rms=rms, basis="dct", bounds_on="coefficients of the orthonormal 2-D "
                  "DCT-II (per channel) of the normalized image", normalization=[list(v) for v in zm.normalization])
    singular_lifted = _singular_account(singular_steps, parts)
    if singular_steps:  # as hcrfast.bound's params give it (Bounds.summary reads it)
        params["singular_steps"] = dict(count=int(singular_steps), **(singular_lifted or {}))
    saved = {k: v for k, v in merged.items() if k != "std_algorithm1" or targets is not None}
    # listed as hcrfast's before they are written (`hcrfast reproduce` refused an OUT holding a file of the
    # user's at one of these names): a crash between leaves none of them unlisted
    from hcrfast._bound_cli import _listed_outputs, package_versions, write_outputs

    write_outputs(out, (_listed_outputs(out) or set()) | set(REPRODUCE_OUTPUTS))
    # hcrfast.Bounds.load reads it (its arrays and a 'meta' header); numpy.load reads every array.
    reasons = [f"example {e}, restart {r}: {_algorithm.INFINITE_REASON}" for e, r in infinite.tolist()]
    if targets is not None:  # and the modes whose +inf their targeted step gave, as hcrfast.bound names them
        from hcrfast.targeted import _infinite_reasons

        std_all = merged["std"]
        by_target = np.isinf(std_all) & ~np.isinf(merged["std_algorithm1"])
        reasons += _infinite_reasons(np.where(by_target, np.inf, 0.0).reshape(len(std_all), -1),
                                     np.arange(std_all[0].size), std_all.shape[1:], "dct")
    # the restarts that bound nothing, as hcrfast.bound's params name them (Bounds.summary counts them)
    zero_reasons = [f"example {e}, restart {r}: " + {
        0: "eps came out 0 in the solver's dtype: this restart bounds nothing (0)",
        1: f"{_algorithm._BLIND}: J = 0 at this example, this restart bounds nothing (0)",
        2: f"a(theta+eps) == a(theta) in float64, but J eps is not 0: the shift is {_algorithm._ROUNDED} "
           f"against features of this size, so D = 0 is rounding and this restart bounds nothing (0)",
        3: f"D = 0 in uncertified passes, {_algorithm._UNRESOLVED}: this restart bounds nothing (0)",
        4: f"the features' shift is {_algorithm._COARSE} of features this size: D is not established and this "
           f"restart bounds nothing (0)"}[k]
        for e, r, k in zero_steps.tolist()]
    save_npz(bounds_path, BOUNDS_FORMAT,
             dict(saved, labels=labels.numpy(), example_ids=example_ids, sigma=np.float64(sigma),
                  infinite=infinite.astype(np.int64), params=np.array(_json_str(params))),
             dict(infinite_reasons=reasons, seconds=bound_seconds, targeted=None,
                  params=dict(json.loads(str(parts[0]["bound_params"])) if "bound_params" in parts[0] else {},
                              **json.loads(_json_str(params)), zero_step_reasons=zero_reasons,
                              revision=_checkpoint.FORMAT,   # (the bound checkpoint's: what computed the chunks)
                              run=run)))
    for stray in (out / "chunks").glob(".chunk_*.tmp"):
        stray.unlink(missing_ok=True)  # left by killed processes; every chunk is final now

    std = merged["std"]
    L = zm.lowfreq
    low = std[:, :, :L, :L]
    n_inf = int(np.isinf(std).sum())
    summary = {
        "experiment": name,
        "command": _command_line(name, key, weights, out, data_root, torch.get_num_threads()),
        "cwd": os.getcwd(),   # where the command's relative paths are read from
        "threads": torch.get_num_threads(),   # this run's (chunks read back may have had others: chunks_arithmetic)
        # False for a random initialization only: torchvision's weights, a state dict given with
        # --weights or the digits model trained here all count as trained weights.
        "trained_weights": trained,
        "weights": weights_text,
        "examples": n_examples,
        "restarts": restarts,
        "iterations": iterations,
        "size": size,
        "limit": bool(limit),
        "sigma_scale": sigma_scale,
        "rms": rms,
        "sigma": sigma,
        "seed": seed,
        "linearize_at": linearize_at,
        "warm_start": warm_start,
        "iterates": iterates,
        "solver": solver,
        "krylov_pilots": krylov_pilots if solver == "krylov" else None,
        "lsqr_options": dataclasses.asdict(lsqr),
        "chunk_examples": chunk_examples,
        "chunks": n_chunks,
        "world_size": world.size,
        "accuracy": {"clean": clean_acc, "dithered": dithered_acc, "dithered_per_draw": dithered_per_draw},
        "bounds_on": params["bounds_on"],
        "normalization": {"mean": list(zm.normalization[0]), "std": list(zm.normalization[1])},
        "bounds": _quantiles(std.ravel()),
        # The same bounds in the units of the [0, 1] images: normalized bound x the channel's std.
        "bounds_pixel_units": _quantiles((std * np.asarray(zm.normalization[1]).reshape(1, -1, 1, 1)).ravel()),
        "lowfreq": L,
        "bounds_lowfreq": _quantiles(low.ravel()),
        "mse_bound": _quantiles(merged["mse"]),
        # (1/p) Σ_k std_k²: every mode's own bound summed, at least eq. 6's (Bounds.mse_from_modes)
        "mse_bound_modes": _quantiles(mse_from_modes(std)),
        # over the restarts that bound something: one listed in zero_steps holds a D of 0 (its eps is 0, or
        # float64 could not resolve its shift) that is not the features' D = 0, which makes bounds +inf
        "divergence": dict(_quantiles(merged["divergence"][~bounding_nothing]),
                           restarts_bounding_nothing_left_out=int(bounding_nothing.sum())),
        "infinite": {
            "coordinates": n_inf,
            "fraction": n_inf / std.size,
            "restarts_with_zero_divergence": int(infinite.shape[0]),
            # (example, mode) pairs whose +inf came from their targeted step alone
            "targeted_steps": int((np.isinf(std) & ~np.isinf(merged["std_algorithm1"])).sum()) if targets else 0,
            "examples_affected": int(np.isinf(std).reshape(len(std), -1).any(axis=1).sum()),
            "reason": ("a(theta+eps) == a(theta) in float64, also with eps scaled up until float64 would "
                       "resolve a shift (D = 0): theta and theta+eps give identical observations, so no unbiased "
                       "estimator exists for the DCT coordinates that eps moves; their bound is +inf (exact where "
                       "the features ignore eps, as behind dead ReLUs; behind a unit float64 saturates, "
                       "tanh(25) == 1, the exact bound is finite but beyond float64) (a restart whose eps came "
                       "out 0 moves none: it bounds nothing, and hcrfast.bound warns of it)"),
        },
        "zero_steps": _zero_steps_summary(zero_steps, restarts, overflowed,
                                          bounded=(std.reshape(len(std), -1) > 0).any(axis=1)),
        "rounding": {
            "restarts": int(sum(p.get("rounding", (0, 0.0))[0] for p in parts)),
            "worst_relative_error": float(max(p.get("rounding", (0, 0.0))[1] for p in parts)),
            # chunks written before 2026-11-30 counted their singular steps with the restarts
            "singular_steps": int(sum(p["rounding"][2] for p in parts if len(p.get("rounding", ())) > 2)),
            "worst_relative_error_singular": float(max((p["rounding"][3] for p in parts
                                                        if len(p.get("rounding", ())) > 3), default=0.0)),
            # chunks written before 2026-12-01 did not count the strays (read as none)
            "dtype_drift": int(sum(p["rounding"][4] for p in parts if len(p.get("rounding", ())) > 4)),
            "worst_dtype_drift": float(max((p["rounding"][5] for p in parts if len(p.get("rounding", ())) > 5),
                                           default=0.0)),
            "dtype_drift_reason": ("these restarts' last feature shifts a(theta+eps) - a(theta) in the model's dtype "
                                   "strayed from the float64 ones by more than 0.1 of their size, at examples whose "
                                   "bounds take theirs: the model's rounding set Algorithm 1's next steps, so those "
                                   "bounds (certified in float64, rigorous still) follow that rounding and do not "
                                   "scale with sigma; a larger --sigma-scale avoids it"),
            "reason": ("float64's rounding of a(theta+eps) - a(theta) may move these restarts' D, and their bounds "
                       "with it, by up to the worst relative error (sigma * size small next to the features' size: a "
                       "larger --sigma-scale removes it); D is taken 32x that far up, so their bounds are lower by "
                       "up to 32x it, to stay below the exact ones"),
        },
        "lsqr": _lsqr_stats(merged["lsqr_iterations"], merged["lsqr_istop"]),
        "targeted": _targeted_stats(targets, std, merged["std_algorithm1"], singular_steps),
        "singular_steps": singular_steps,   # per example, certified steps along J's smallest singular directions
        # (example, mode) bounds they raised above Algorithm 1's; None for chunks computed before it was kept
        "singular_steps_lifted": singular_lifted,
        "timings": {
            "bound_seconds_all_chunks": bound_seconds,
            "data_and_features_seconds": seconds_data,
            "chunks_computed_this_run": computed_all,
            "chunks_reused": reused_all,
        },
        "versions": {
            **package_versions(),   # what `hcrfast --version` names (SciPy's LAPACK runs the dense solve)
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "hcrfast": hcrfast.__version__,
        },
        "device": arithmetic_of(dev),
        "chunks_arithmetic": arithmetics,
        # bounds.npz's params["run"]: what the chunks were computed with ("threads" and "versions" are this run's)
        "run": run,
        "outputs": {},
    }
    from hcrfast import report as _report

    t_fig = time.perf_counter()
    figures = _report.write_figures(out, images=images.numpy(), std=std, normalization=zm.normalization,
                                    lowfreq=L, labels=labels.numpy(), seed=seed, name=name)
    summary["timings"]["figures_seconds"] = time.perf_counter() - t_fig
    summary["timings"]["wall_seconds_this_run"] = time.perf_counter() - t_start
    summary["outputs"] = {"bounds": bounds_path.name, "report": report_path.name, "figures": figures}
    atomic_write_text(summary_path, _json_str(summary) + "\n")
    _report.write_html(report_path, summary, figures)
    write_outputs(out, {bounds_path.name, summary_path.name, report_path.name, *(f["file"] for f in figures.values())})
    _say(progress, f"{tag}: done in {_duration(time.perf_counter() - t_start)}; "
                   f"median bound {_fmt_or_inf(summary['bounds']['q50'])}{_beyond_range(summary)}"
                   + (f" ({summary['bounds']['zero']:,} of {std.size:,} bounds are 0, which bounds nothing: see "
                      f"summary.json's zero_steps)" if summary["bounds"].get("zero") else "")
                   + (f" ({summary['rounding']['dtype_drift']:,} restarts' steps followed the model's rounding: see "
                      f"summary.json's rounding.dtype_drift)" if summary["rounding"]["dtype_drift"] else "")
                   + f", clean accuracy {clean_acc:.4f}, "
                   f"dithered {dithered_acc:.4f}")
    return RunResult(out, bounds_path, summary_path, report_path, summary, len(todo), reused)
