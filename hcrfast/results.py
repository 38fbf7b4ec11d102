"""The named result of :func:`hcrfast.bound`."""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hcrfast.backend import to_host

_FORMAT = "hcrfast.Bounds/1"


def json_default(obj):
    """JSON for what ``json`` cannot write itself: NumPy scalars and arrays."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def save_npz(path, fmt: str, arrays: dict, meta: dict) -> None:
    """A result file: NumPy ``arrays`` and a JSON ``meta`` (with ``format`` = ``fmt``), written atomically
    to exactly ``path`` (``~`` expanded); ``numpy.load(path)`` reads it without hcrfast."""
    from hcrfast.checkpoint import atomic_savez

    header = np.array(json.dumps(dict(meta, format=fmt), default=json_default))
    atomic_savez(Path(path).expanduser(), meta=header, **arrays)


def load_npz(path, fmt: str, writer: str, *, arrays_needed=(), meta_needed=()) -> tuple[dict, dict]:
    """``(arrays, meta)`` of a file :func:`save_npz` wrote with ``fmt`` (by ``writer``, named in errors), which
    must hold the arrays ``arrays_needed`` and the ``meta`` entries ``meta_needed``. ``~`` in ``path`` is the
    user's home, as :func:`save_npz` writes it."""
    path = os.path.expanduser(path)
    not_ours = f"{path} is not a file written by {writer}"
    if os.path.isdir(path):
        inside = ("it holds a sigma sweep (sweep.json): read it with hcrfast.SigmaSweep.load"
                  if os.path.isfile(os.path.join(path, "sweep.json")) else
                  f"pass the .npz file {writer} wrote (an `hcrfast bound` OUT holds bounds.npz)")
        raise ValueError(f"{path} is a folder, not a results file; {inside}")
    with open(path, "rb") as fh:
        # np.load reads anything but an .npz or .npy archive as a pickle, and refuses it advising
        # allow_pickle: not what a results file needs
        magic = fh.read(6)
        if magic.startswith(b"\x93NUMPY"):
            raise ValueError(f"{not_ours}: it holds one NumPy array (.npy), not an hcrfast results file (an .npz "
                             f"archive); read it with numpy.load")
        if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
            raise ValueError(f"{not_ours}: it is not an hcrfast results file (those are NumPy .npz archives, this "
                             f"is no archive); pass the path {writer} wrote to")
        fh.seek(0)
        try:
            with np.load(fh, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (ValueError, zipfile.BadZipFile, EOFError, zlib.error) as exc:   # (zlib: a damaged text member)
            raise ValueError(f"{not_ours}: it is a damaged or foreign .npz archive ({exc})") from exc
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{path} is not a file written by {writer} (no {fmt!r} header: {exc}); read it with "
                         f"numpy.load instead") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{not_ours}: its meta header is a JSON {type(meta).__name__}, not the object of an "
                         f"hcrfast results file; read it with numpy.load")
    found = meta.get("format")
    if found != fmt:
        readers = {"hcrfast.Bounds/1": "hcrfast.Bounds.load", "hcrfast.TargetedBounds/1": "hcrfast.TargetedBounds.load",
                   "hcrfast.AttackResult/1": "hcrfast.AttackResult.load"}
        theirs = _format_version(found)
        # the format of its kind this version reads, where it is of a later one
        known = next((r for r in readers if theirs and _format_version(r)[0] == theirs[0]), None)
        newer = readers[known] if known and theirs[1] > _format_version(known)[1] else None
        if theirs and theirs[0] == _format_version(fmt)[0] and theirs[1] > _format_version(fmt)[1]:
            raise ValueError(f"{path} was written by {writer} of a newer hcrfast (format {found!r}); this version "
                             f"reads {fmt!r}: upgrade hcrfast to one that reads it to load it; numpy.load reads its "
                             f"arrays meanwhile")
        raise ValueError(f"{path} is not a file written by {writer} (its format is {found!r}, not {fmt!r}); "
                         + (f"read it with {readers[found]}" if found in readers
                            else f"read it with {newer} of a newer hcrfast (upgrade hcrfast), or numpy.load "
                                 f"meanwhile" if newer
                            else "read it with numpy.load"))
    require(path, fmt, writer, arrays, arrays_needed, "arrays")
    require(path, fmt, writer, meta, meta_needed, "meta header")
    check_kinds(path, fmt, writer, meta)
    return arrays, meta


def _format_version(fmt) -> tuple[str, int] | None:
    """``("hcrfast.Bounds", 1)`` of the format ``"hcrfast.Bounds/1"``; None for what is no such name."""
    match = re.fullmatch(r"(hcrfast\.\w+)/(\d+)", fmt) if isinstance(fmt, str) else None
    return (match.group(1), int(match.group(2))) if match else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_reasons(value) -> bool:
    return isinstance(value, list) and all(isinstance(r, str) for r in value)


#: The meta entries of the results files whose JSON type the loaders and summaries rely on: the check, and
#: what it should be (in errors).
_META_KINDS = {
    "params": (lambda v: isinstance(v, dict), "a JSON object"),
    "seconds": (_is_number, "a number"),
    "infinite_reasons": (_is_reasons, "a list of strings"),
    "targeted": (lambda v: v is None or isinstance(v, dict), "a JSON object or null"),
    "method": (lambda v: isinstance(v, str), "a string"),
    "timings": (lambda v: isinstance(v, dict), "a JSON object"),
    "rounding": (lambda v: isinstance(v, dict), "a JSON object"),
}


def check_kinds(path, fmt: str, writer: str, meta: dict, what: str = "") -> None:
    """Refuse (:func:`malformed`) a meta header (``what``: which one, as "targeted ") holding an entry of
    :data:`_META_KINDS` of another JSON type: loaded, it would fail later, in ``summary()`` or a repr."""
    for name, (ok, kind) in _META_KINDS.items():
        if name in meta and not ok(meta[name]):
            value = repr(meta[name])
            raise malformed(path, fmt, writer, f"its {what}meta entry {name!r} is "
                                               f"{value if len(value) <= 60 else value[:57] + '...'}, not {kind}")


#: The day results files began recording the revision of the algorithm that computed them (``revision``).
REVISION_SINCE = "2026-12-01"


def revision_saved(params: dict, current: str) -> dict:
    """``params`` as a results file holds them: with ``"revision"``, the algorithm revision that computed
    them (the checkpoint format of the call, ``current`` for a result made by this hcrfast; a result
    :func:`revision_loaded` read keeps the revision it was computed with, None where its file recorded none)."""
    return dict(params, revision=params["revision"] if "revision" in params else current)


def revision_loaded(params: dict, current: str) -> dict:
    """``params`` read from a results file, as the result holds them: ``"revision"`` left out where it is
    ``current`` (computed by this hcrfast's algorithm, as a result just made), kept where it is another, and
    None where the file recorded none (written before :data:`REVISION_SINCE`); :func:`revision_line` says so."""
    params = dict(params)
    revision = params.pop("revision", None)
    return params if revision == current else dict(params, revision=revision)


def revision_line(params) -> str | None:
    """The summary's first line for a result another revision of hcrfast computed (``params["revision"]``,
    :func:`revision_loaded`): the summary describes this version's method, which may not be the one that
    computed it. None for a result of this version."""
    if not isinstance(params, dict) or "revision" not in params:
        return None
    by = (f"another revision of hcrfast ({params['revision']})" if params["revision"] is not None else
          f"an hcrfast from before {REVISION_SINCE} (it recorded no revision)")
    return f"NOTE: computed by {by}: the method described below is this version's, maybe not the one that computed it"


def malformed(path, fmt: str, writer: str, why: str) -> ValueError:
    """The error for a file that says it is ``fmt`` but does not hold what ``writer`` writes."""
    return ValueError(f"{path} is a malformed {fmt} file ({why}): {writer} did not write it so, or it was changed "
                      f"since; write it again with {writer}")


def require(path, fmt: str, writer: str, held, names, what: str) -> None:
    """Refuse (:func:`malformed`) a file whose ``held`` (its arrays, or a meta dict) lacks any of ``names``."""
    missing = [name for name in names if name not in held]
    if missing:
        raise malformed(path, fmt, writer, f"its {what} lack{'s' if what.endswith('header') else ''} "
                                           f"{', '.join(map(repr, missing))}")


#: What ``==`` on results leaves out, at any depth: wall times, and how the run went (examples read back from
#: a checkpoint, the shard a process computed, factors reused from an earlier call, and ``params["run"]``: the
#: example ids, chunk size, torch threads and versions a rerun needs, recorded but not compared), not what it
#: computed.
WALL_TIME_KEYS = ("seconds", "timings", "checkpoint", "shard", "reuse", "reuse_bytes", "reused_examples", "run")

#: The distributions whose versions ``params["run"]["versions"]`` records (besides hcrfast's): those whose
#: arithmetic the numbers go through.
_RUN_VERSIONED = ("torch", "numpy", "scipy")


@functools.lru_cache(maxsize=None)
def _versions() -> tuple:
    import sys
    from importlib import metadata

    from hcrfast import __version__

    def version(name):
        imported = getattr(sys.modules.get(name), "__version__", None)   # torch's names its build: 2.14.1+cu130
        if isinstance(imported, str):
            return str(imported)   # (torch's is a str subclass)
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return (("hcrfast", __version__),) + tuple((name, version(name)) for name in _RUN_VERSIONED)


def run_versions() -> dict:
    """hcrfast's version and those of torch, NumPy and SciPy: an imported module's ``__version__`` (torch's
    names its build, as ``2.14.1+cu130``, which the installed metadata may not), else the installed metadata,
    as ``hcrfast --version`` reads them (:func:`hcrfast.cli.version_line`, which gives one line of text);
    None for one not installed."""
    return dict(_versions())


def describe_ids(example_ids) -> dict:
    """``example_ids`` (which seed each example's noise, ``default_rng([seed, e])``) as ``params["run"]`` holds
    them: their count, first and last, the first 16 hex digits of the SHA-256 of the little-endian int64 array,
    and (at most 16 of them) the ids themselves."""
    ids = np.ascontiguousarray(np.asarray(example_ids), dtype="<i8").ravel()
    out = dict(count=int(ids.size), first=int(ids[0]) if ids.size else None,
               last=int(ids[-1]) if ids.size else None, sha256=hashlib.sha256(ids.tobytes()).hexdigest()[:16])
    if ids.size <= 16:
        out["ids"] = ids.tolist()
    return out


def run_record(example_ids, chunk_size, torch_threads: int) -> dict:
    """``params["run"]`` of a result: what a rerun needs that the other params do not say, since each changes
    the numbers (the ids, which noise is drawn; the chunk size and torch's thread count, the rounding):
    ``example_ids`` (:func:`describe_ids`, the whole batch's), ``chunk_size`` (examples per chunk, the last
    size used: after any halving on out-of-memory, and at most the batch's size, which an automatic size may
    exceed; ``chunk_size=`` that value computes the chunks again), ``torch_threads``
    (``torch.get_num_threads()`` during the call) and ``versions`` (:func:`run_versions`). Recorded, not
    compared: ``==`` leaves it out (:data:`WALL_TIME_KEYS`)."""
    described = describe_ids(example_ids)
    return dict(example_ids=described,
                chunk_size=None if chunk_size is None else min(int(chunk_size), max(described["count"], 1)),
                torch_threads=int(torch_threads), versions=run_versions())


def merged_run(records, example_ids, *, caps=None) -> dict:
    """``params["run"]`` of a result merged from pieces of one batch (consecutive rows) that other calls or sessions
    may have computed (a resumed run's chunks, :func:`hcrfast.bound`'s chunks): the whole batch's ``example_ids``
    described as :func:`run_record` does, and every other entry of the pieces' own records
    (``records``, one per piece; None for a piece that recorded none, a file written before they were) where they
    all agree. Where they differ, or a piece recorded none, that entry is None and ``differ`` lists the values
    seen (None: not recorded), rather than one claimed for all. ``caps``: each piece's size, where its record
    caps ``chunk_size`` there (run_record's examples): a piece recorded at its own size, below the others', was
    computed whole as they were (a run's shorter last chunk), and agrees with them."""
    records = list(records)
    out = run_record(example_ids, None, 0)   # (each entry but the ids is the pieces')
    names = [k for k in out if k != "example_ids"]
    names += [k for r in records if r is not None for k in r if k not in names and k not in ("example_ids", "differ")]
    differ = {}
    for name in names:
        values = [None if r is None else r.get(name) for r in records]
        if name == "chunk_size" and caps is not None:
            largest = max((v for v in values if v is not None), default=None)
            values = [largest if v is not None and v == cap < largest else v for v, cap in zip(values, caps)]
        seen = []
        for v in values:
            if v not in seen:
                seen.append(v)
        out[name] = seen[0] if len(seen) == 1 else None
        if len(seen) != 1 or seen[0] is None:
            differ[name] = seen
    if differ:
        out["differ"] = differ
    return out


def _array_like(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (np.generic, float, int))


def same_result(a, b) -> bool:
    """``a == b`` of hcrfast's result classes: the same type, every array bitwise equal (NaN where the
    other has NaN, on the host whichever device holds it), every list, string and count equal, with
    the wall times and the run's own accounts left out (fields and ``params`` keys of
    :data:`WALL_TIME_KEYS`, at any depth; ``params["run"]`` among them, recorded but not compared): two runs
    that computed the same bounds compare equal (a resumed one and an uninterrupted one included, and two
    at other thread counts or versions that agree bitwise), and so do a result and its ``save``/``load``
    copy (JSON gives back lists for tuples; they compare as the same sequence)."""
    if a is b:
        return True
    if dataclasses.is_dataclass(a) or dataclasses.is_dataclass(b):
        return (type(a) is type(b)
                and all(same_result(getattr(a, f.name), getattr(b, f.name))
                        for f in dataclasses.fields(a) if f.name not in WALL_TIME_KEYS))
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return False
        keys = {k for k in a if k not in WALL_TIME_KEYS}
        return (keys == {k for k in b if k not in WALL_TIME_KEYS}
                and all(same_result(a[k], b[k]) for k in keys))
    if _array_like(a) or _array_like(b):
        if a is None or b is None:
            return False
        x, y = to_host(a), to_host(b)
        if x.shape != y.shape or (_array_like(a) and _array_like(b) and x.dtype != y.dtype):
            return False
        nan = x.dtype.kind in "fc" and y.dtype.kind in "fc"
        return bool(np.array_equal(x, y, equal_nan=nan))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_result(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def mse_from_modes(std) -> np.ndarray:
    """``(1/p) Σ_k std_k²`` per example (row of ``std``, shape (B, ...)): :attr:`Bounds.mse_from_modes`."""
    std = np.asarray(std, dtype=np.float64)
    std = std.reshape(std.shape[0], -1)
    finite = np.where(np.isfinite(std), np.abs(std), 0.0)
    scale = finite.max(axis=1, keepdims=True)
    scale = np.where(scale > 0, scale, 1.0)
    with np.errstate(over="ignore"):
        out = np.mean((std / scale) ** 2, axis=1) * scale[:, 0] * scale[:, 0]  # (≤ 1 · s) · s: no overflow of s²
    out[np.isinf(out) & np.isfinite(std).all(axis=1)] = np.finfo(np.float64).max
    return out


def short_repr(result) -> str:
    """A result's repr: the first two lines of its ``summary()`` (what was bounded, with which noise and
    settings, and the bounds' quantiles), not its arrays, which would fill a notebook cell."""
    try:
        note = revision_line(getattr(result, "params", None))
        lines = result.summary().splitlines()
        head = ([note] if note else []) + [line.strip() for line in lines[int(bool(lines) and lines[0] == note):][:2]]
    except Exception as exc:  # a repr must not raise: a result being built, or fields set by hand
        return f"<{type(result).__name__} (no summary: {type(exc).__name__}: {exc})>"
    return f"<{type(result).__name__}: {'; '.join(head)}; .summary() for the rest>"


def counted(n: int, word: str) -> str:
    """``"1 example"``, ``"3 examples"``: the summaries' counts."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def median_count(m) -> str:
    """A median of counts (steps, iterations, ranks) as the summaries print it: ``4`` or ``4.5``, every digit
    (``:.0f`` rounds 4.5 half to even, to 4, and ``:g`` writes 1.23457e+06)."""
    return f"{float(m):.1f}".removesuffix(".0")


def quantile_line(std) -> str:
    """The summaries' line of bound quantiles: 10/50/90% of the finite bounds in ``std`` (+inf bounds,
    from D = 0, have no quantile worth printing), how many are finite when some are not, and "all +inf"
    when none is. Bounds of 0 (which bound nothing) are among the quantiles, as the valid lower bounds
    they are, and counted apart so that a quantile of 0 is not read as a measured bound."""
    std = np.asarray(std)
    finite = std[np.isfinite(std)]
    n_nan = int(np.isnan(std).sum())   # (no bound hcrfast computes; a result edited or made by hand: said as NaN)
    if not finite.size:
        return ("  std bounds: all +inf" if not n_nan else
                f"  std bounds: none finite ({n_nan} NaN, {std.size - n_nan} +inf)")
    q = np.quantile(finite, [0.1, 0.5, 0.9])
    notes = [f"{finite.size} finite of {std.size}"] if finite.size < std.size else []
    if n_nan:
        notes.append(f"{n_nan} NaN, which is no bound")
    n_zero = int((finite == 0).sum())
    if n_zero:
        notes.append(f"{n_zero} of {std.size} are 0, which bounds nothing")
    return (f"  std bound quantiles 10/50/90%: {q[0]:.4g} / {q[1]:.4g} / {q[2]:.4g}"
            + (f" ({'; '.join(notes)})" if notes else ""))


def finite_stats(values, *, largest: bool = True) -> str:
    """"median M, min m, max X" of the finite ``values`` and how many are +inf, the rule of
    :func:`quantile_line` (and of ``summary.json``'s quantiles): a +inf bound (D = 0) is counted apart, not
    averaged into a median, so the median printed is that of the finite ones and says so."""
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    n_nan = int(np.isnan(values).sum())
    others = (f"{values.size - finite.size - n_nan} +inf" if values.size - finite.size > n_nan else "") + (
        f"{', ' if values.size - finite.size > n_nan else ''}{n_nan} NaN" if n_nan else "")
    if not finite.size:
        return ("all +inf" if not n_nan else f"none finite ({others})") if values.size else "none"
    text = f"median {np.median(finite):.4g}, min {finite.min():.4g}" + (f", max {finite.max():.4g}" if largest else "")
    return text + (f" (of the {finite.size} finite; {others})" if finite.size < values.size else "")


def _null_space_line(p: dict, probed: bool = False) -> str | None:
    """The summary's line on J's local null space, where the call shows one: the dense solve's numerical rank
    below the inputs, or (any solver) fewer features than inputs. The steps bound() certifies lie in J's row
    space with ``linearize_at="input"`` (J⁺'s, its singular directions past the rank are steps of 0), so no mode's
    bound comes from the null
    space, where steps move the features only at second order or by rounding and the bounds can be far larger
    (+inf where the features ignore the step): a MNIST-geometry ReLU MLP's J has rank ~380 of 784, and a small
    ReLU MLP's median bound was 3.46 here against 1.5e7 from targeted_bound's null-space probes (2026-12-02)."""
    n, inputs = p.get("n_features"), p.get("n_inputs")
    if not isinstance(inputs, int) or isinstance(inputs, bool) or p.get("linearize_at") == "current":
        return None   # (linearized at θ + ε(j−1), the steps are in the row spaces of other J's: not J(θ)'s alone)
    dense = p.get("dense") if p.get("solver") == "dense" else None
    rank_min = dense.get("rank_min") if isinstance(dense, dict) else None
    # (a run merged from chunks, hcrfast reproduce's, keeps no rank; the singular steps' count of directions
    # within each example's rank tells it where one had fewer than were asked for)
    sing = p.get("singular_steps") if p.get("solver") == "dense" else None
    taken = (sing.get("directions") or {}) if isinstance(sing, dict) else {}
    fewest, count = taken.get("fewest"), sing.get("count") if isinstance(sing, dict) else None
    if isinstance(rank_min, (int, np.integer)) and rank_min < inputs:
        median = dense.get("rank_median", float("nan"))
        size = (f"{median_count(inputs - median)} of its {inputs:,} input directions at the median example "
                f"(up to {inputs - int(rank_min):,})")
    elif (rank_min is None and isinstance(fewest, (int, np.integer)) and isinstance(count, (int, np.integer))
          and fewest < count):   # (rank = the directions taken, where fewer than asked)
        size = f"up to {inputs - int(fewest):,} of its {inputs:,} input directions (J's rank was {int(fewest)} at an example)"
    elif isinstance(n, int) and not isinstance(n, bool) and n < inputs:
        size = f"at least {inputs - n:,} of its {inputs:,} input directions ({n:,} features)"
    else:
        return None
    if probed:   # bound(targets=..., null_probes=True): the target modes' null-space components were stepped along
        return (f"  J's local null space: {size}. The target modes' components there were certified as steps "
                f"(null_probes=True), each for its own mode; the other steps lie in J's row space")
    return (f"  J's local null space: {size}. Every step here lies in J's row space: steps along the null space move "
            f"the features only at second order or by rounding, so the modes with a component there can have far "
            f"larger bounds than these (+inf where the features ignore the step); bound(..., targets=..., "
            f"null_probes=True) or hcrfast.targeted_bound(..., null_probes=True) certifies steps there")


def _divergence_text(divergence, zero_step_reasons) -> str:
    """The summary's median D over the restarts that bound something: a restart listed in
    ``zero_step_reasons`` (eps = 0, J = 0, a shift float64 could not resolve) holds a D of 0 that is no
    D = 0 of the features (which would make its bounds +inf), so it is left out, and said to be."""
    divergence = np.asarray(divergence, dtype=np.float64)
    keep = np.ones(divergence.shape, dtype=bool)
    for reason in zero_step_reasons:
        m = _RESTART.match(reason)
        if m and divergence.ndim == 2 and int(m.group(1)) < divergence.shape[0] \
                and int(m.group(2)) < divergence.shape[1]:
            keep[int(m.group(1)), int(m.group(2))] = False
    left = int((~keep).sum())
    if not keep.any():
        return f"none: every restart bounds nothing ({left}, see params['zero_step_reasons'])"
    return (f"median {np.median(divergence[keep]):.4g}"
            + (f" over the restarts that bound something ({left} that bound nothing left out)" if left else ""))


def noise_label(described) -> str:
    """The short name of a noise law from its ``describe()`` line, with the confidence of bounds that
    hold only with that confidence (Monte Carlo; bound()'s ``params["noise_asked"]``: the law as asked,
    before each restart's confidence was raised so that their maximum holds at it)."""
    text = str(described)
    label = text.split(": D(z)")[0] if ": D(z)" in text else text.split(":")[0]
    match = re.search(r"upper ([0-9.eE+-]+)-confidence", text)
    return label + (f", bounds at {match.group(1)} confidence" if match else "")


# How a reason of params["zero_step_reasons"] or of infinite_reasons names its restart.
_RESTART = re.compile(r"example (\d+), restart (\d+): ")
_SINGULAR = re.compile(r"example (\d+), singular step (\d+)(?: \([+-]v\))?: ")


def targets_baseline(singular_steps) -> str:
    """What the targeted steps' gains are over: the bounds without them (``std_algorithm1``), which hold the
    singular steps' too where they were taken."""
    if not singular_steps:
        return "Algorithm 1's bounds"
    return f"the bounds of Algorithm 1 and the {int(singular_steps)} singular steps"


@dataclass
class Bounds:
    """Lower bounds on the standard deviation of every unbiased estimator of the input.

    Attributes
    ----------
    std : array, shape = batch.shape
        Per-coordinate bound in the chosen basis (DCT modes per channel, or
        pixels): ``max |(Q ε)_k| / sqrt(D(z_ε))`` over the steps ε of every restart (with
        ``params["iterates"] == "all"``, the default, every iterate ε(1) … ε(i) of each; with
        "last", ε(i) alone, the paper's Algorithm 1), over the singular steps when they were taken
        (``params["singular_steps"]``; by default, with the dense or Krylov solve and Gaussian noise:
        J's smallest singular directions, each with both signs), and over every targeted step when
        ``targets`` was given (each of these bounds every mode it moves).
        ``inf`` where a certified ε with ``D = 0`` moves that coordinate.
    mse : array, shape (B,)
        Bound on the mean squared error per coordinate, paper eq. (6):
        ``max (1/p)‖ε‖² / D(z_ε)`` over Algorithm 1's steps alone: every restart's ε(1) … ε(i) with
        ``iterates="all"`` (the earlier ones left out by the screen could not raise it), its ε(i) with
        "last". The singular and targeted steps do not count: it is the same with
        ``singular_steps=0`` and without ``targets``. :attr:`mse_from_modes` is a tighter bound, from every
        step.
    eps, z : arrays, shapes (B, *input_shape) and (B, n)
        The step with the largest ``mse`` bound per example (of any restart and, with
        ``iterates="all"``, any iterate), and its feature shift ``a(θ+ε) − a(θ)`` from forward passes.
    divergence : array, shape (B, R)
        ``D(z_ε)`` of every restart's last iterate ε(i) (float64; certified when ``certify``).
    best_restart : array, shape (B,)
        The restart of ``eps``.
    lsqr_iterations, lsqr_istop : arrays, shape (B, R, i)
        LSQR iteration count and stop code of every solve of Algorithm 1 (SciPy's
        ``istop``); with ``solver="dense"`` (``params["solver"]``) no LSQR ran: 0 and -1;
        with ``solver="krylov"`` each pilot's basis' LSQR is at ``[b, r, 0]``, r < the pilots
        (``params["krylov"]["pilots"]``; one pilot: ``[b, 0, 0]``), and every other step was a
        projection: 0 and -2.
    infinite_reasons : list of str
        One line per certified step whose ``D`` is exactly 0 though it moves the input (its
        modes' bounds +inf): per (example, restart), its last iterate's, or else (``iterates="all"``) its
        first earlier iterate's; per (example, singular step, sign); and the targeted steps' (example,
        mode) lines, from :attr:`targeted`.
    params : dict
        The parameters used (sigma, size, iterations, restarts, seed, ...). ``"revision"`` only in a
        result :meth:`load` read that another revision of hcrfast's algorithm computed: the format of its
        call's checkpoints (:data:`hcrfast.checkpoint.FORMAT` then), or None for a file written before
        2026-12-01, which recorded none; :meth:`save` writes this version's for one it computed.
        ``"run"``: what a rerun needs besides (:func:`run_record`: the example ids, the chunk size used,
        torch's thread count, the versions of hcrfast, torch, NumPy and SciPy); recorded but not compared
        by ``==``, and absent from files written before it was recorded.
    seconds : float
        Wall time of the call.
    targeted : TargetedBounds or None
        The targeted bounds alone, when ``targets`` was given.
    std_algorithm1 : array or None
        The bounds before the max with the targeted ones, when ``targets`` was given: Algorithm 1's,
        and the singular steps' where they were taken (``params["singular_steps"]``; the default).
    """

    std: object
    mse: object
    eps: object
    z: object
    divergence: object
    best_restart: object
    lsqr_iterations: object
    lsqr_istop: object
    infinite_reasons: list = field(default_factory=list)
    params: dict = field(default_factory=dict)
    seconds: float = 0.0
    targeted: object = None
    std_algorithm1: object = None

    _ARRAYS = ("std", "mse", "eps", "z", "divergence", "best_restart", "lsqr_iterations", "lsqr_istop")

    __repr__ = short_repr
    __eq__ = same_result
    __hash__ = None

    @property
    def mse_from_modes(self) -> np.ndarray:
        """Bound on the mean squared error per coordinate from every mode's own bound, shape (B,):
        ``(1/p) Σ_k std_k²``.

        Summing (5) over k with each mode's own best ε: the MSE of an unbiased estimator is
        ``(1/p) Σ_k Var((Qθ̂)_k)`` (Q orthonormal) and each variance is at least ``std_k²``. As rigorous
        as ``std`` (the same certified ε and D; a Monte Carlo law's at the same confidence), and at
        least :attr:`mse` (eq. 6 sums (5) for one ε, and ``std_k ≥ |(Qε_r)_k|/√D_r`` for every restart
        r): on the trained digits MLP the median is 1.67× eq. 6's, 11.1× with ``targets="low:8"``.
        ``+inf`` where a mode's bound is (no unbiased estimator of the input exists there); a sum past
        float64's range from finite bounds is float64's largest value, still a lower bound.
        """
        return mse_from_modes(to_host(self.std))

    def to_numpy(self) -> "Bounds":
        """A copy whose arrays are NumPy arrays on the host."""
        arrays = {k: to_host(getattr(self, k)) for k in self._ARRAYS}
        if self.std_algorithm1 is not None:
            arrays["std_algorithm1"] = to_host(self.std_algorithm1)
        if self.targeted is not None:
            arrays["targeted"] = self.targeted.to_numpy()
        return dataclasses.replace(self, **arrays)

    def save(self, path) -> None:
        """Write every field to the ``.npz`` file ``path`` (exactly that name; atomically): the arrays
        as NumPy arrays, the rest (params, reasons, timings, the targeted bounds' own) as JSON.
        :meth:`load` reads it back; ``numpy.load(path)`` reads it without hcrfast."""
        h = self.to_numpy()
        arrays = {k: getattr(h, k) for k in self._ARRAYS}
        if h.std_algorithm1 is not None:
            arrays["std_algorithm1"] = h.std_algorithm1
        meta = dict(infinite_reasons=list(h.infinite_reasons), params=h.params, seconds=float(h.seconds),
                    targeted=None)
        if h.targeted is not None:
            t_arrays, meta["targeted"] = h.targeted.to_arrays()
            arrays.update({f"targeted.{k}": v for k, v in t_arrays.items()})
        from hcrfast import checkpoint

        meta["params"] = revision_saved(h.params, checkpoint.FORMAT)  # (a nested targeted's is the same call's)
        save_npz(path, _FORMAT, arrays, meta)

    @classmethod
    def load(cls, path) -> "Bounds":
        """The :class:`Bounds` that :meth:`save` wrote to ``path`` (NumPy arrays). One computed by another
        revision of hcrfast's algorithm (``params["revision"]``, None for a file written before
        2026-12-01) loads as it was computed, and its :meth:`summary` says so first."""
        from hcrfast import checkpoint

        arrays, meta = load_npz(path, _FORMAT, "Bounds.save", arrays_needed=cls._ARRAYS,
                                meta_needed=("infinite_reasons", "params", "seconds", "targeted"))
        targeted = None
        if meta["targeted"] is not None:
            from hcrfast.targeted import TargetedBounds  # here: hcrfast.targeted imports this module's users

            prefix = "targeted."
            t_arrays = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            TargetedBounds.check_fields(path, _FORMAT, "Bounds.save", t_arrays, meta["targeted"], "targeted ")
            check_kinds(path, _FORMAT, "Bounds.save", meta["targeted"], "targeted ")
            targeted = TargetedBounds.from_arrays(t_arrays, meta["targeted"])
        params = revision_loaded(meta["params"], checkpoint.FORMAT)
        if targeted is not None and "revision" in params:   # computed in the same call: by the same revision (its
            targeted.params = dict(targeted.params, revision=params["revision"])   # summary and own save say so)
        return cls(**{k: arrays[k] for k in cls._ARRAYS}, std_algorithm1=arrays.get("std_algorithm1"),
                   infinite_reasons=meta["infinite_reasons"], params=params, seconds=meta["seconds"],
                   targeted=targeted)

    def summary(self) -> str:
        """A few lines: parameters, bound quantiles, LSQR work, infinities."""
        h = self.to_numpy()
        std = h.std.reshape(h.std.shape[0], -1)
        mse_modes = mse_from_modes(std)
        p = self.params
        note = revision_line(p)
        lines = ([note] if note else []) + [
            f"HCR bounds for {counted(std.shape[0], 'example')} x {counted(std.shape[1], str(p.get('basis', '?')) + ' mode')} "
            f"(noise={noise_label(p.get('noise_asked') or p.get('noise'))}, size={p.get('size', float('nan')):.4g}, "
            f"iterations={p.get('iterations')}, restarts={p.get('restarts')}, linearize_at={p.get('linearize_at')}"
            f"{', every iterate' if p.get('iterates') == 'all' and (p.get('iterations') or 1) > 1 else ''})",
            quantile_line(std),
            "  (bounds in the units of the batch given: normalized units for a batch of normalized images)",
            f"  mse bound per example (eq. 6, one eps): {finite_stats(h.mse)}; from the per-mode bounds "
            f"(.mse_from_modes): {finite_stats(mse_modes, largest=False)}",
            f"  divergence D: {_divergence_text(h.divergence, p.get('zero_step_reasons') or [])}  "
            f"(certified in float64: {p.get('certify')})",
        ]
        earlier = p.get("earlier_iterates")
        if earlier and earlier.get("screened") and earlier.get("steps"):
            lines.append(f"  earlier iterates: all {earlier['steps']} steps certified"
                         if earlier["certified"] >= earlier["steps"] else
                         f"  earlier iterates: {earlier['certified']} of {earlier['steps']} steps certified; by their "
                         f"uncertified shifts the others could not raise any mode's bound")
        # the restarts that bound nothing, and why (the markers of bound()'s zero-step reasons)
        from hcrfast import algorithm

        nothing = p.get("zero_step_reasons") or []
        kinds = collections.Counter(algorithm.zero_step_kind(r) for r in nothing)
        causes = [("coarse", "float64's rounding leaves their D not established"),
                  ("rounded", "their shift is below float64's resolution of the features"),
                  ("uncertified", "D = 0 in uncertified passes"),
                  ("at_zero_jacobian", "J = 0 at their example"),
                  ("eps_zero", "their eps came out 0")]
        counts = [(kinds[kind], why) for kind, why in causes]
        if nothing:
            lines.append(f"  {counted(len(nothing), 'restart')} bound nothing (0): "
                         + "; ".join(f"{c} {why}" for c, why in counts if c)
                         + ("; sigma * size is too small next to the features" if counts[0][0] + counts[1][0] else "")
                         + "; see params['zero_step_reasons']")
        if p.get("solver") == "dense":
            d = p.get("dense")
            lines.append(f"  dense solve: J built with {float(d.get('jacobian_products', float('nan'))):.1f} products per "
                         f"example (a VJP per nonzero row and 3 products to find them, or one per row or column; and one "
                         f"VJP that checks J), numerical rank of J (singular values above sqrt(max(n, p))·eps of its dtype "
                         f"× the largest) median {median_count(d.get('rank_median', float('nan')))}, "
                         f"min {d.get('rank_min')}; every step exact"
                         if d else "  dense solve: every step exact")  # (reproduce's merged runs: no per-call counts)
        elif p.get("solver") == "krylov" and not p.get("krylov"):
            lines.append("  Krylov basis per example, every step projected on it")
        elif p.get("solver") == "krylov":
            k = p["krylov"]
            lines.append(f"  Krylov basis per example and pilot ({k.get('pilots', 1)} pilot(s)"
                         + (", chosen by krylov_pilots='auto'" if k.get("pilots_auto") and k.get("pilots", 1) > 1
                            else "")
                         + "; one reorthogonalized "
                         f"LSQR each, every step projected on it): "
                         f"median {median_count(k.get('steps_median', float('nan')))} steps, max {k.get('steps_max')}, "
                         f"{k.get('products_per_example', float('nan')):.0f} products per example"
                         + (f" ({k['products_needed_per_example']:.0f} needed, the rest spent on examples riding "
                            f"along in their batch after they stopped)"
                            if k.get("products_needed_per_example", k.get("products_per_example"))
                            != k.get("products_per_example") else "")
                         + (f" ({k['steps_redone_mean']:.1f} steps rerun with two Gram-Schmidt passes)"
                            if k.get("steps_redone_mean") else "")
                         + f"; rank median {median_count(k.get('rank_median', float('nan')))}")
        else:
            codes = {int(k): int(c) for k, c in zip(*np.unique(h.lsqr_istop, return_counts=True))}
            lines.append(f"  LSQR iterations per solve: median {median_count(np.median(h.lsqr_iterations))}, "
                         f"max {np.max(h.lsqr_iterations)}; stop codes {codes}")
        null = _null_space_line(p, probed=h.targeted is not None and bool(h.targeted.params.get("null_probes")))
        if null:
            lines.append(null)
        sing = p.get("singular_steps")
        if sing and not isinstance(sing, dict):   # a run hcrfast reproduce wrote before it kept their account
            sing = {"count": int(sing)}
        if sing:
            fewest = (sing.get("directions") or {}).get("fewest", sing["count"])
            lines.append(f"  singular steps{' (auto)' if sing.get('auto') else ''}: {sing['count']} per example along "
                         f"J's smallest singular directions, each certified with both signs"
                         + (f" (an example had as few as {fewest}: the rest, past its rank or its Krylov bases' kept "
                            f"vectors, are steps of 0 and bound nothing)" if fewest < sing["count"] else "")
                         + (f"; they raised {sing['modes_lifted']:,} of the "
                            f"{sing['examples'] * std.shape[1]:,} (example, mode) bounds of the examples they were "
                            f"counted over ({sing['seconds']:.2f} s)" if "modes_lifted" in sing else ""))
        without = targets_baseline(sing and sing["count"])   # what the targeted steps are weighed against
        if h.targeted is not None:
            t = h.targeted
            lifted = np.asarray(t.std).reshape(std.shape[0], -1)[:, t.modes] > \
                np.asarray(h.std_algorithm1).reshape(std.shape[0], -1)[:, t.modes]
            others = np.ones(std.shape[1], dtype=bool)
            others[t.modes] = False
            cross = (std > np.asarray(h.std_algorithm1).reshape(std.shape))[:, others]
            lines.append(f"  targeted ({t.method}): {len(t.modes)} modes per example, each its own certified "
                         f"perturbation; {lifted.mean():.1%} of their bounds above {without} (the bounds "
                         f"above are the largest of all)"
                         + (f"; their steps also bound the other modes, and lifted {cross.mean():.1%} of those"
                            if cross.size else ""))
        elif h.std_algorithm1 is not None:  # the targeted bounds folded in, their own fields not kept (reproduce)
            lifted = std > np.asarray(h.std_algorithm1).reshape(std.shape)
            lines.append(f"  targeted bounds folded in: the bounds above are the larger of {without} "
                         f"(.std_algorithm1) and the targeted ones, which lifted {lifted.mean():.1%} of them")
        elif (p.get("solver") in ("dense", "krylov") and p.get("basis") == "dct" and h.std.ndim >= 3
              and not sing and str(p.get("noise", "")).startswith("Gaussian")):
            # the directions would come from this solve's own factorization: no model product, a forward pass a step
            k = min(8, *h.std.shape[-2:])
            n_feat, p_in = p.get("n_features"), p.get("n_inputs")
            auto = min(64, n_feat, p_in) if isinstance(n_feat, int) and isinstance(p_in, int) else 64
            lines.append(f"  no extra steps: targets='low:{k}' (hcrfast bound --targets low:{k}: a step aimed at each "
                         f"of the {k}x{k} lowest modes of a channel, one forward pass a step) or the default "
                         f"singular_steps='auto' ({auto} of J's smallest singular directions, at most min(features, "
                         f"inputs), each certified with both signs: two forward passes a direction; this call passed "
                         f"0) would add certified steps, their directions from this solve's own factorization; they "
                         f"can only raise these bounds (README, 'Tighter bounds')")
        n_inf = int(np.isinf(std).sum())
        if n_inf:
            matched = [_RESTART.match(r) for r in self.infinite_reasons]
            by_restart = len({m.groups() for m in matched if m})   # a restart's iterates may each have one
            by_singular = sum(bool(not m and _SINGULAR.match(r)) for m, r in zip(matched, self.infinite_reasons))
            by_target = sum(not m for m in matched) - by_singular
            lines.append(f"  {n_inf} coordinates have bound +inf (D = 0): "
                         + " and ".join(part for part in (
                             counted(by_restart, "restart") if by_restart else "",
                             counted(by_singular, "singular step") if by_singular else "",
                             counted(by_target, "targeted (example, mode) step") if by_target else "") if part)
                         + " left the features unchanged in float64 (exact where they ignore the step, as behind dead ReLUs; not"
                         " behind a unit float64 saturates, tanh(25) == 1); see .infinite_reasons")
        n_zero = int((std == 0).sum())
        if n_zero:
            # examples all of whose restarts bound nothing: their zeros have the reasons above
            per_example = {}
            for r in nothing:
                m = _RESTART.match(r)
                if m:
                    per_example.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
            dead = [e for e, rs in per_example.items() if len(rs) >= (p.get("restarts") or math.inf) and e < std.shape[0]]
            n_dead = int((std[dead] == 0).sum()) if dead else 0
            rank = (p.get("dense") or p.get("krylov") or {}).get("rank_min")
            rank_note = (f" J's rank is as low as {rank} of {std.shape[1]} inputs: some modes may be invisible to "
                         f"the features." if rank is not None and rank < std.shape[1] else "")
            if n_dead:
                lines.append(f"  {n_dead} coordinates have bound 0 because every restart of their "
                             f"{counted(len(dead), 'example')} bound nothing (above). 0 guarantees nothing; it "
                             f"does not show they are exposed")
            if n_zero > n_dead:
                lines.append(f"  {n_zero - n_dead} coordinates have bound 0: no restart moved them. 0 guarantees "
                             f"nothing; it does not show they are exposed.{rank_note} "
                             f"hcrfast.targeted_bound(..., null_probes=True) aims a step at each mode and finds "
                             f"those the features do not see (+inf)")
        saved = p.get("checkpoint")
        read = saved.get("examples_read_back", 0) if isinstance(saved, dict) else 0
        lines.append(f"  wall time {self.seconds:.2f} s"
                     + (f" (this call's: {read} of {counted(std.shape[0], 'example')} read back from the checkpoint, "
                        f"whose seconds above were timed by the call that computed them)" if read else ""))
        return "\n".join(lines)
