"""Resumable :func:`hcrfast.bound` calls (``checkpoint=DIR``) and the atomic writes they rest on.

A checkpointed call writes ``DIR/key.json`` (everything that changes the numbers: the
arguments, σ or the noise law, the solver that runs, and SHA-256 fingerprints of the
model's state, the batch and the example ids), ``DIR/features.npy`` (the clean features of the
batch, which also catch a change the fingerprints do not see) and, as each chunk of examples finishes,
``DIR/chunk_<start>_<stop>.npz`` with that chunk's rows of every result array. Files are
written atomically (a temporary file, then ``os.replace``), so a process killed at any
point leaves finished chunks whole. The same call made again reads the finished chunks
and computes only the examples that are missing; a call with other arguments, another
model or another batch is refused, naming what differs; a folder written by another version of hcrfast (another
:data:`FORMAT`) is refused as that, whatever its arguments. A call refused at its end because its model changed
during it removes the chunks it saved (:meth:`Checkpoint.discard`): the same call made again computes them afresh
instead of reading back bounds of two functions. One process per folder: the
files carry no lock. :mod:`hcrfast.reproduce` uses the same writes and key check for its
runs (and shares its chunks among ``torchrun`` processes itself).
"""
from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import itertools
import json
import os
import shlex
import re
import stat
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from hcrfast import validation

__all__ = ["RESUME_BITWISE", "Checkpoint", "CheckpointMismatchError", "arithmetic_of", "atomic_savez", "atomic_write_bytes", "atomic_write_text",
           "batch_fingerprint", "check_key", "gaps", "model_fingerprint", "sha256_tensors", "taken_back_on_failure"]

#: What a chunk file holds; in the key, so that files of another layout are refused, not misread.
# /2: float64-rounded D = 0 bounds 0, not +inf; /3: the rounding estimate counts input-sized terms a
# feature cancels down from (algorithm._rounding_magnitude) (both 2026-11-25); /4: targeted parts carry
# their bounds on every mode (std_every_mode), and hcrfast.bound's drop the steps unless kept (2026-11-26);
# /5: D rounded up and mode coordinates down past float64's rounding, null-space probes' D at the top of their
# rounding bracket (2026-11-30): a chunk from before may hold bounds an ulp or a few above its step's exact one;
# /6: D past float64's rounding of the forward passes, sized to each step (algorithm._widened, _rounding_slope;
# 2026-11-30): a chunk from before may hold bounds ~1e-13 (at σ tiny or steps huge, up to 4e-4) above the exact one;
# /7: the dense solve's rank tolerance sqrt(max(n, p))·eps, not max(n, p)·eps (dense._checked; changed 2026-11-30
# without bumping /6, found and bumped 2026-12-01): a chunk from before lacks the directions between the two cuts
# (their modes bound 0, or up to 30x apart, on ill-conditioned models), and a resume mixed its rows with new ones.
# Every change of the numbers a chunk holds must bump it (and targeted.CHECKPOINT_FORMAT, reproduce._FORMAT):
# tests/test_checkpoint.py::test_the_numbers_a_chunk_holds_are_those_of_their_format pins them
FORMAT = "hcrfast.bound checkpoint/7"
_CHUNK_NAME = re.compile(r"^chunk_(\d+)_(\d+)\.npz$")
#: The temporary files a Checkpoint writes through (``.NAME.PID.tmp``), what :meth:`Checkpoint.tidy` removes
#: where their process is gone; group 2 is the PID.
_TEMPORARY_NAME = re.compile(r"^\.(chunk_\d+_\d+\.npz|key\.json|features\.npy|write_probe)\.(\d+)\.tmp$")
#: The Checkpoints opened inside :func:`taken_back_on_failure` (None outside one).
_OPENED = contextvars.ContextVar("hcrfast_checkpoints_opened", default=None)
#: Exceptions on which :func:`taken_back_on_failure` removes the chunks the failed call saved too (a tuple of
#: types; empty: none): set where the same call runs again otherwise (:func:`discarded_on`).
_DISCARD_ON = contextvars.ContextVar("hcrfast_checkpoints_discard_on", default=())


class CheckpointMismatchError(ValueError):
    """A checkpoint (or run folder) holds work made with other arguments, model or data."""


def _cannot_write(path: Path, exc: OSError) -> OSError:
    """``exc`` (an OSError of the temporary file or the rename) raised again naming ``path``, the file the
    user asked for: the same type and errno (ENOSPC stays ENOSPC), never the temporary name."""
    return type(exc)(exc.errno, f"cannot write {_q(path)} ({exc.strerror or exc})")


def _temporary_file(path: Path, tmp: Path):
    """``tmp`` created for writing, exclusively and without following a link there: a file or link planted at
    the predictable name is never written through. A regular file there is a temporary of a killed process
    that had this PID (or of this process): it is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    for attempt in (0, 1):
        try:
            return os.fdopen(os.open(tmp, flags, 0o666), "wb")   # (0o666 less the umask, as open() makes it)
        except FileExistsError:
            if attempt or not stat.S_ISREG(os.lstat(tmp).st_mode):
                raise FileExistsError(errno.EEXIST, f"cannot write {_q(path)}: its temporary name {_q(tmp)} is taken by "
                                                    f"something that is not a file hcrfast left (a link or a "
                                                    f"folder); remove it") from None
            tmp.unlink()


def atomic_write_bytes(path: Path, write, *, internal: bool = False) -> None:
    """Write through ``write(fileobj)`` into a temporary file beside ``path``, then rename it.

    A process killed at any point leaves either the old file, the complete new
    one, or a stray temporary file (``.NAME.PID.tmp``, shortened by :func:`fitting_name` where the file system
    takes no name that long); never a truncated ``path``. ``internal``: ``path`` is
    a name hcrfast chose inside a folder the user gave (a checkpoint's ``key.json``), so errors name that
    folder, not a path the user never passed.
    """
    path = Path(path)
    # (these are checked first: the errors of the writes below would name the temporary file)
    if not path.parent.is_dir():
        blocked = next((p for p in path.parents if os.path.lexists(p)), None)
        if blocked is not None and not blocked.is_dir():
            raise NotADirectoryError(f"cannot write {_q(path)}: {_q(blocked)} is a file, not a folder; pass a path "
                                     f"inside a folder")
        raise FileNotFoundError(f"cannot write {_q(path)}: the folder {_q(path.parent)} does not exist; create it first")
    if path.is_dir():
        if internal:
            raise IsADirectoryError(f"cannot write {_q(path)}: a folder is there, where hcrfast keeps a file of "
                                    f"{_q(path.parent)}; remove that folder, or pass another folder than {_q(path.parent)}")
        raise IsADirectoryError(f"cannot write {_q(path)}: it is a folder; pass the path of a file (a name inside "
                                f"{_q(path)}, say)")
    tmp = path.with_name(fitting_name(path.parent, f".{path.name}.{os.getpid()}.tmp"))
    created = False
    try:
        try:
            fh = _temporary_file(path, tmp)
        except FileExistsError:   # (its message says it)
            raise
        except OSError as exc:   # a folder that cannot be written, say
            raise _cannot_write(path, exc) from exc
        created = True
        try:
            with fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:   # the disk full (ENOSPC), a quota, an I/O error
            raise _cannot_write(path, exc) from exc
        try:
            os.replace(tmp, path)
        except OSError as exc:   # what became of path while it was written (a folder made there, say)
            raise _cannot_write(path, exc) from exc
        created = False
    finally:
        if created:   # (only the file this call made: whatever else is at that name is not ours)
            tmp.unlink(missing_ok=True)


def atomic_savez(path: Path, *, internal: bool = False, **arrays) -> None:
    atomic_write_bytes(path, lambda fh: _savez(fh, arrays), internal=internal)


def _savez(fh, arrays: dict) -> None:
    """``np.savez(fh, **arrays)``, but the text arrays (a result's JSON header, a chunk's reasons) deflated.

    Those hold one sentence per restart where restarts bound nothing (a sigma too small gives every restart
    its reason), stored 4 bytes a character and padded to the longest: 1,000 examples at R = 25 made a
    23 MB ``bounds.npz`` of 2.2 MB of numbers. The numbers stay stored as they are (they hardly compress and
    would cost the time). ``numpy.load`` reads either kind of member.
    """
    import time

    try:
        with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, value in arrays.items():
                arr = np.asanyarray(value)
                info = zipfile.ZipInfo(f"{name}.npy", date_time=time.localtime(time.time())[:6])
                info.compress_type = zipfile.ZIP_DEFLATED if arr.dtype.kind in "US" else zipfile.ZIP_STORED
                with zf.open(info, mode="w", force_zip64=True) as member:
                    np.lib.format.write_array(member, arr, allow_pickle=False)
    except Exception as exc:
        # A Ctrl-C (or SIGTERM's exit) that lands while a member is opened or closed leaves the member's handle
        # open, and ZipFile's close then raises "Can't close the ZIP file while there is an open writing
        # handle" over it: the interruption is what happened (the CLI says "interrupted" and how to resume)
        pending = _interruption(exc)
        if pending is not None:
            raise pending from None
        raise


def _interruption(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit (any BaseException that is not an Exception) that ``exc`` was raised
    while handling, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if not isinstance(exc, Exception):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def name_max(folder) -> int:
    """The longest file name, in bytes, that ``folder``'s file system takes (255 where it does not say)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):   # (Windows: no pathconf)
        return 255


def fitting_name(folder, name: str) -> str:
    """``name``, or where it is longer than ``folder``'s file system takes (a user's long file name with a
    suffix hcrfast adds: ``.NAME.PID.tmp``, ``NAME.resume``), its start, a fingerprint of the whole and its
    last 16 characters: the same long name always gives the same short one, and different ones different."""
    limit = name_max(folder)
    if len(os.fsencode(name)) <= limit:
        return name
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    tail = name[-16:]
    head = os.fsencode(name)[:max(0, limit - 18 - len(os.fsencode(tail)))].decode("utf-8", "ignore")
    return f"{head}~{digest}~{tail}" if head else f"{digest}~{tail}"


def _q(path) -> str:
    """A path in a message, as a shell would take it back (``delete 'runs/a b'``): quoted where it needs it."""
    return shlex.quote(os.fsdecode(path))


def atomic_write_text(path: Path, text: str, *, internal: bool = False) -> None:
    """``text`` as UTF-8, atomically (:func:`atomic_write_bytes`). A file name that is not UTF-8 (Python reads
    its bytes as lone surrogates, os.fsdecode) is written as those bytes again, the name the file system has:
    a strict encode failed after the whole run, at report.html."""
    atomic_write_bytes(path, lambda fh: fh.write(text.encode("utf-8", "surrogateescape")), internal=internal)


def sha256_tensors(*tensors) -> str:
    """SHA-256 of the bytes of torch tensors or NumPy arrays, in order (shapes and dtypes are not hashed)."""
    h = hashlib.sha256()
    for t in tensors:
        a = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
        h.update(a.tobytes())
    return h.hexdigest()


def batch_fingerprint(batch: torch.Tensor) -> str:
    """A checkpoint key's name for a batch: its shape, dtype and SHA-256."""
    return f"{tuple(batch.shape)} {str(batch.dtype).replace('torch.', '')} sha256:{sha256_tensors(batch)}"


def model_fingerprint(model) -> str:
    """A module's class and SHA-256 of its ``state_dict`` (parameter and buffer names, shapes, dtypes and
    values); a plain callable's qualified name only (what it closes over is not seen)."""
    if not isinstance(model, torch.nn.Module):
        return f"callable {getattr(model, '__module__', '?')}.{getattr(model, '__qualname__', type(model).__qualname__)}"
    h = hashlib.sha256(type(model).__qualname__.encode())
    for name, t in model.state_dict().items():
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(sha256_tensors(t).encode())
    return f"{type(model).__qualname__}:sha256:{h.hexdigest()}"


#: What an entry left out of a key means: keys leave out what older checkpoints never recorded (a call
#: with these values writes the key it always wrote, so old folders still resume); a mismatch names
#: the value, not the absence.
ABSENT_MEANS = {"iterates": "last", "singular_steps": 0, "keep_targeted_eps": False, "targets": None,
                "targeted_method": None}


def key_model_fingerprint(model) -> str:
    """A checkpoint key's name for the model: :func:`model_fingerprint` of the user's model inside those of
    hcrfast's wrappers whose own values other entries of the key hold already (``keyed_elsewhere``: the
    noise.PerFeatureStd of one std that a far σ runs on, whose σ the noise's repr holds; noise.ScaledInputs,
    whose divisor :func:`key_batch_fingerprint` adds to the batch's entry). A wrapper made elsewhere (a sweep's, dividing by its sigma0,
    which no other entry holds) keeps its fingerprint. Without that, a call at σ = 1e19 resumed at 2e19
    was told its model had changed, in the wrapper's name. A per-feature wrapper keeps its own fingerprint,
    as keys made before 2026-12-02 hold it."""
    while getattr(model, "keyed_elsewhere", False):   # (set by the wrapper that made it, which keys its value)
        model = model.model
    return model_fingerprint(model)


def key_batch_fingerprint(model, batch) -> str:
    """A checkpoint key's name for the batch a call runs on: :func:`batch_fingerprint`, and the ``key_note`` of
    each of hcrfast's wrappers around ``model`` that divided it (noise.ScaledInputs: "inputs divided by 2^k";
    the divided batches of x and 2x are the same bits, and a checkpoint of one resumed the other)."""
    notes = []
    while getattr(model, "keyed_elsewhere", False):
        if getattr(model, "key_note", None):
            notes.append(model.key_note)
        model = model.model
    return batch_fingerprint(batch) + "".join(f"; {note}" for note in notes)


#: How a mismatch names a noise run on the features divided by its σ (noise.ScaledGaussian's repr)
_SCALED_NOISE = re.compile(r"ScaledGaussian\(sigma=1\.0, scale=([^)]*)\)")


#: What a mismatch adds where both keys name hcrfast's wrapper that divides the features by stds (noise.PerFeatureStd):
#: its fingerprint holds the stds, which no other entry does where a sweep divides by its sigma0.
_WRAPPED_NOTE = (" (the model's features divided by stds: one std per feature, or sigma_for's or sweep_sigma's "
                 "sigma0; the stds, or the model, changed)")


def shown_value(key: dict, entry: str) -> str:
    """How a mismatch names ``key[entry]``: its repr, or what its absence means (:data:`ABSENT_MEANS`), a far
    σ's noise as the user's (a sharded call's ranks that differ are named alike: they showed None for an absent
    entry, 2026-12-02)."""
    text = repr(key[entry] if entry in key else ABSENT_MEANS.get(entry, "(absent)"))
    return _SCALED_NOISE.sub(r"Gaussian(sigma=\1) on the features divided by sigma", text) if entry == "noise" else text


def check_key(path: Path, stored: dict, key: dict, fix: str) -> None:
    """Raise :class:`CheckpointMismatchError` naming every entry where ``stored`` and ``key`` differ."""
    if stored == key:
        return
    value = shown_value
    diffs = [f"{k}: {value(stored, k)} -> {value(key, k)}" + _WRAPPED_NOTE * (k == "model" and all(
                 str(d.get(k, "")).startswith("PerFeatureStd:") for d in (stored, key)))
             for k in sorted(set(stored) | set(key)) if stored.get(k) != key.get(k)]
    raise CheckpointMismatchError(f"{_q(path)} holds work made with other arguments ({'; '.join(diffs)}). {fix}")


def _kind(fmt) -> str | None:
    """The call a checkpoint format names ("hcrfast.bound" of "hcrfast.bound checkpoint/6"), else None."""
    if isinstance(fmt, str) and " checkpoint/" in fmt:
        return fmt.rsplit(" checkpoint/", 1)[0]
    return None


def _check_kind(path: Path, stored, key: dict) -> None:
    """Refuse plainly a folder that holds another kind of call's checkpoint (a hcrfast.bound folder given to
    hcrfast.gauss_newton_attack, say): no call of this kind can resume it, and the entries where the two keys
    differ (every argument the two calls do not share) would only bury that."""
    ours = _kind(key.get("format"))
    theirs = _kind(stored.get("format")) if isinstance(stored, dict) else None
    if ours is None or theirs is None or theirs == ours:
        return
    raise CheckpointMismatchError(f"{_q(path)} holds an {theirs} checkpoint, which no {ours} call can resume; pass "
                                  f"another checkpoint folder for this {ours} call (or delete {_q(path)} to start anew)")


def _check_format(path: Path, stored: dict, key: dict) -> None:
    """Refuse plainly a folder of this kind of call written by another version of hcrfast (another format in its
    key, older or newer): no call of this version resumes it, whatever its arguments, and the entries where the two
    keys differ (a default that version did not record, say) would read as arguments the user changed."""
    if "format" not in key or stored.get("format") == key["format"]:
        return
    old = stored["format"] if "format" in stored else "(absent)"
    raise CheckpointMismatchError(f"{_q(path)} holds work written by another version of hcrfast (format: {old} -> "
                                  f"{key['format']}), whose chunks this version does not mix with its own; pass "
                                  f"another checkpoint folder (or delete {_q(path)}) to start anew")


def _json(obj) -> str:
    return json.dumps(obj, sort_keys=True, indent=1, default=str)


@contextlib.contextmanager
def taken_back_on_failure():
    """A call made inside that fails takes back what each :class:`Checkpoint` it opened wrote
    (:meth:`Checkpoint.take_back`): a folder that held no key before and holds no chunk is left as it was,
    so the corrected call may use it instead of being refused for the failed call's arguments."""
    opened = []
    token = _OPENED.set(opened)
    try:
        yield
    except BaseException as exc:
        for saved in reversed(opened):
            if isinstance(exc, _DISCARD_ON.get()):
                saved.discard()
            else:
                saved.take_back()
        raise
    finally:
        _OPENED.reset(token)


@contextlib.contextmanager
def discarded_on(*kinds):
    """Inside, a call that fails with one of ``kinds`` removes the chunks it saved as well as its key (as
    :meth:`Checkpoint.discard`): it is made again otherwise, whose key theirs would refuse (a batch divided by a
    power of two whose steps left float64, :func:`hcrfast.noise.accepts_per_feature_sigma`). The chunks of earlier
    calls, and a key they wrote, stay."""
    token = _DISCARD_ON.set(tuple(kinds))
    try:
        yield
    finally:
        _DISCARD_ON.reset(token)


class Checkpoint:
    """The finished chunks of one :func:`hcrfast.bound` (or :func:`hcrfast.targeted_bound`) call in
    folder ``path``.

    ``key`` is a JSON-able dict of everything that changes the numbers; ``example_ids`` the
    call's global example ids (each chunk file holds its own and they are checked on reading);
    ``features`` the clean features of the batch, stored by the first call and compared by the next
    (within :attr:`FEATURES_RTOL`).
    """

    #: A resumed call's clean features may differ from the stored ones by this much, relative to their
    #: largest magnitude (another device or library version rounds differently); more means another model.
    FEATURES_RTOL = 1e-4

    def __init__(self, path, key: dict, example_ids: np.ndarray, features=None, arithmetic: str | None = None,
                 *, chunk_size: int | None = None, required: tuple = ()):
        #: what this call computes with (:func:`arithmetic_of`), recorded in each chunk it saves; and every
        #: arithmetic of the chunks seen, read back or saved ("not recorded" for files from before)
        self.arithmetic, self.arithmetics = arithmetic, set()
        #: the examples per chunk this call plans (its chunks' rounding depends on their other examples),
        #: recorded in each chunk it saves; and every one the chunks seen record (files from before: none)
        self.chunk_size, self.chunk_sizes = chunk_size, set()
        #: arrays every chunk file must hold; one without them is set aside and computed again
        self.required = tuple(required)
        self.path = Path(path).expanduser()
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(f"the checkpoint folder {_q(path)} is a file; pass a folder (it is created if "
                                    f"missing)")
        #: the folders (deepest first) and files this call made, what :meth:`take_back` removes; whether it saved
        #: a chunk (still in the folder), and the chunk files it saved, what :meth:`discard` removes
        self._made = list(itertools.takewhile(lambda p: not os.path.lexists(p), (self.path, *self.path.parents)))
        self._wrote, self._saved, self._chunks = [], False, []
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(exc.errno, f"the checkpoint folder {_q(path)} cannot be created ({exc.strerror}); "
                                     f"pass a folder you can write to") from exc
        opened = _OPENED.get()
        if opened is not None:
            opened.append(self)
        self.key = json.loads(_json(key))  # as it reads back from key.json
        #: each chunk file holds it, and one made by another call is refused on reading, whatever key.json says
        self.key_sha256 = hashlib.sha256(_json(self.key).encode()).hexdigest()
        self.example_ids = np.asarray(example_ids, dtype=np.int64)
        key_path = self.path / "key.json"
        #: key.json written by this call: chunk files from before keys were kept per chunk cannot be checked
        self.key_written_here = not key_path.is_file()
        fix = (f"Make the same call (same model, batch, sigma and arguments) to resume it, or pass another "
               f"checkpoint folder (or delete {_q(self.path)}) to start anew.")
        if key_path.is_file():
            try:
                stored = json.loads(key_path.read_text(encoding="utf-8"))
                if not isinstance(stored, dict):   # (valid JSON, edited by hand: null, a list)
                    raise ValueError(f"it holds the JSON {json.dumps(stored)[:60]}, not an object of entries")
            except (OSError, ValueError) as exc:
                raise CheckpointMismatchError(f"{_q(key_path)} is unreadable ({exc}); delete {_q(self.path)} or pass "
                                              f"another checkpoint folder") from exc
            _check_kind(self.path, stored, self.key)
            _check_format(self.path, stored, self.key)
            check_key(self.path, stored, self.key, fix)
        else:
            atomic_write_text(key_path, _json(self.key) + "\n", internal=True)
            self._wrote.append(key_path)
        if features is not None:
            self._check_features(np.asarray(features, dtype=np.float64), fix)

    def _check_features(self, features: np.ndarray, fix: str) -> None:
        """The key fingerprints a module's state and a function's name only; the clean features of the
        batch also catch a function's closure or a module attribute outside its state_dict changing."""
        path = self.path / "features.npy"
        if not path.is_file():
            atomic_write_bytes(path, lambda fh: np.save(fh, features), internal=True)
            self._wrote.append(path)
            return
        try:
            stored = np.load(path, allow_pickle=False)
            if not isinstance(stored, np.ndarray):
                raise ValueError("not one array")
        except (OSError, ValueError, EOFError) as exc:   # written atomically: damaged from outside, not by a crash
            raise CheckpointMismatchError(
                f"{_q(path)} is unreadable ({exc}): the clean features this folder's work was checked against are lost. "
                f"Delete that file (this call writes it again, and checks the chunks against its own key) or pass "
                f"another checkpoint folder (or delete {_q(self.path)}) to start anew") from exc
        if stored.shape != features.shape:
            raise CheckpointMismatchError(f"{_q(self.path)} holds work on features of shape {stored.shape}, this call's "
                                          f"model gives {features.shape}. {fix}")
        gap = float(np.max(np.abs(stored - features), initial=0.0))
        scale = max(float(np.max(np.abs(stored), initial=0.0)), np.finfo(np.float64).tiny)
        if not gap <= self.FEATURES_RTOL * scale:
            raise CheckpointMismatchError(
                f"{_q(self.path)} holds work made with a model that gave other features for this batch (largest "
                f"difference {gap:.3g}, {gap / scale:.3g} of the largest feature): the model changed in a way its "
                f"fingerprint does not see (what a plain function closes over, or a module attribute outside its "
                f"state_dict). {fix}")

    def finished(self) -> list[tuple[int, int, dict]]:
        """``(start, stop, arrays)`` of every finished chunk, by start. A chunk file that cannot be
        read is reported and left out (its examples are computed again)."""
        total = len(self.example_ids)
        found = []
        for file in self.path.iterdir():
            m = _CHUNK_NAME.match(file.name)
            if m is None:
                continue
            start, stop = int(m.group(1)), int(m.group(2))
            try:
                arrays = _read_chunk(file)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:   # (zlib: a damaged
                # deflated text member)
                self._set_aside(file, f"is unreadable ({exc})", "unreadable")
                continue
            if "key_sha256" in arrays and str(arrays["key_sha256"]) != self.key_sha256:
                raise CheckpointMismatchError(
                    f"{_q(file)} was written by another call: the key it holds is not this call's (the folder's key.json "
                    f"was replaced or removed after it was written). Make that call to resume it; or move that one "
                    f"file out of the folder, and this call computes its examples again and keeps the other chunks; "
                    f"or delete {_q(self.path)} (or pass another checkpoint folder) to start anew")
            if "key_sha256" not in arrays and self.key_written_here:
                raise CheckpointMismatchError(
                    f"{_q(file)} is a chunk of a call {_q(self.path)} no longer names (its key.json was missing) and holds "
                    f"no key of its own (written by hcrfast before 2026-11-30): it cannot be checked against this call; "
                    f"delete {_q(self.path)} (or pass another checkpoint folder) to start anew")
            missing = [name for name in self.required if name not in arrays]
            if not (0 <= start < stop <= total and np.array_equal(arrays.get("example_ids"),
                                                                  self.example_ids[start:stop])):
                raise CheckpointMismatchError(
                    f"{_q(file)} holds examples {arrays.get('example_ids')} at rows {start}:{stop}, which this call "
                    f"(batch of {total}) does not have there; move that one file out of the folder (this call then "
                    f"computes those rows again and keeps the other chunks), or pass another checkpoint folder, or "
                    f"delete {_q(self.path)}")
            if missing:
                self._set_aside(file, f"lacks the arrays {', '.join(missing)}", "incomplete")
                continue
            found.append((start, stop, arrays, file))
        # Chunks of one call, by start (the longest first). Two calls made into the folder at once with other
        # chunk sizes leave overlapping ones: one cover of them is read, the others set aside.
        found.sort(key=lambda f: (f[0], -f[1]))
        kept = []
        for start, stop, arrays, file in found:
            if kept and start < kept[-1][1]:
                self._set_aside(file, f"overlaps rows {start}..{min(stop, kept[-1][1]) - 1} of another chunk",
                                "overlap")
                continue
            kept.append((start, stop, arrays))
            self.arithmetics.add(str(arrays["arithmetic"]) if "arithmetic" in arrays else "not recorded")
            if "chunk_size" in arrays:
                self.chunk_sizes.add(int(arrays["chunk_size"]))
        return kept

    def _set_aside(self, file: Path, why: str, suffix: str) -> None:
        """Move a chunk file that cannot be used out of the way of the chunks that will replace it, whatever
        their size, and say so."""
        aside = file.with_name(f".{file.name}.{suffix}")
        validation.warn(f"{_q(file)} {why}; computing its examples again where no other chunk holds them (the file "
                        f"is kept as {aside.name})")
        try:
            file.replace(aside)
        except OSError:
            pass  # another process moved it first

    def check_writable(self) -> None:
        """Refuse a folder this call cannot write its chunks into before it computes one (a read-only
        folder of finished chunks is still read)."""
        probe = self.path / f".write_probe.{os.getpid()}.tmp"
        try:
            _temporary_file(self.path, probe).close()   # (never through a link planted at that name)
            probe.unlink()
        except FileExistsError:   # (its message says what is in the way)
            raise
        except OSError as exc:
            raise OSError(exc.errno, f"checkpoint={str(self.path)!r}: the folder cannot be written "
                                     f"({exc.strerror}), and this call has examples left to compute; pass a folder "
                                     f"you can write to (copy the finished chunks there to keep them)") from exc

    def tidy(self) -> None:
        """Remove the temporary files (``.chunk_*.npz.PID.tmp``, ``.key.json.PID.tmp``,
        ``.features.npy.PID.tmp``, ``.write_probe.PID.tmp``) of processes killed while writing one: called
        when every chunk of the call is in the folder. A file whose PID is alive on this machine (another
        call's write, perhaps) is left alone."""
        for file in self.path.iterdir():
            m = _TEMPORARY_NAME.match(file.name)
            if m is None:
                continue
            try:
                pid = int(m.group(2))
                if pid != os.getpid():
                    os.kill(pid, 0)  # raises if no such process
                    continue
            except ProcessLookupError:
                pass
            except (ValueError, OSError):  # not our name, or a process of another user: leave it
                continue
            file.unlink(missing_ok=True)

    def take_back(self) -> None:
        """Remove what this call wrote (``key.json``, ``features.npy``, the folders it made) where the
        call failed before any chunk: its key would refuse the corrected call, for work the folder does not
        hold. Nothing is removed where the folder held a key before, or holds a chunk (of this call or not)."""
        key_path = self.path / "key.json"
        if self._saved or key_path not in self._wrote:
            return
        try:
            if any(_CHUNK_NAME.match(f.name) or f.name.startswith(".chunk_") for f in self.path.iterdir()):
                return
            for file in self._wrote:
                file.unlink(missing_ok=True)
            for folder in self._made:   # (deepest first; one that holds anything else stays)
                folder.rmdir()
        except OSError:
            pass   # the failure being raised is what the user needs to see

    def discard(self, *, key_too: bool = True) -> tuple[int, list[str], int]:
        """Remove the chunk files this call saved: the call is refused after saving them (its model changed
        itself during the call, :class:`hcrfast.algorithm._StillTheSameFunction`), so they are of more than one
        function, and the same call made again would read them back as its bounds. Then, with ``key_too``, what
        :meth:`take_back` removes where the folder holds no chunk any more (the key this call wrote, the folders
        it made): the folder is as it was before the call. Processes that share the folder (``shard=True``) pass
        ``key_too=False``: the others may be writing their chunks under that key now, and remove their own.

        Returns ``(removed, left, others)``: how many of this call's chunk files were removed, those that could
        not be (``"NAME (why)"``), and how many chunk files of earlier calls or other processes the folder
        holds (kept: they are not this call's)."""
        removed, left = 0, []
        for file in self._chunks:
            try:
                file.unlink()
                removed += 1
            except FileNotFoundError:   # (another call set it aside, or the user removed it: not in the folder)
                pass
            except OSError as exc:
                left.append(f"{file.name} ({exc.strerror or exc})")
        self._chunks = [f for f in self._chunks if f.name in {entry.split(" (")[0] for entry in left}]
        self._saved = bool(self._chunks)
        try:
            others = sum(1 for f in self.path.iterdir() if _CHUNK_NAME.match(f.name)) - len(self._chunks)
        except OSError:
            others = 0
        if key_too and not left:
            self.take_back()   # (nothing where chunks of others are left, or the key is an earlier call's)
        return removed, left, others

    def save(self, start: int, stop: int, **arrays) -> None:  # (the chunk's rows: start..stop-1)
        arrays["key_sha256"] = np.array(self.key_sha256)
        if self.arithmetic is not None:
            arrays["arithmetic"] = np.array(self.arithmetic)
            self.arithmetics.add(self.arithmetic)
        if self.chunk_size is not None:   # the size it was computed in: no larger than the call (a chunk of 8
            #                                 examples of a call of 8 under an automatic size of 49,932 is one of 8),
            # nor than the rows it was computed with where it refills a gap (a chunk set aside, of 2 examples,
            # computed again by a call in chunks of 3, is one of 2: those are the examples its rounding saw)
            # (a call's last chunk is short by its own size: it keeps the size it was planned in)
            size = min(int(self.chunk_size), len(self.example_ids))
            if stop < len(self.example_ids):
                size = min(size, stop - start)
            arrays["chunk_size"] = np.int64(size)
            self.chunk_sizes.add(size)
        file = self.path / f"chunk_{start:09d}_{stop:09d}.npz"
        atomic_savez(file, internal=True, example_ids=self.example_ids[start:stop], **arrays)
        # (saved once the file is there: a first save that fails, a full disk or an interrupt, leaves the key to
        # take_back, which keeps it where any chunk file, finished or temporary, is in the folder)
        self._saved = True
        self._chunks.append(file)

    def warn_mixed(self, resume_hint: str) -> None:
        """Warns where the chunks seen (read back and saved) were computed with different arithmetic: the
        result agrees with an uninterrupted call's to rounding only."""
        mixed_arithmetic(self.path, self.arithmetics, resume_hint)
        if len(self.chunk_sizes) > 1:
            sizes = sorted(self.chunk_sizes)
            validation.warn(f"{_q(self.path)}'s chunks were computed in chunks of different sizes ({', '.join(map(str, sizes))} "
                            f"examples): an example's results (bounds, or attack estimates) depend on its chunk's other "
                            f"examples through rounding, so they agree up to rounding, but are not bitwise those of one uninterrupted run; resume "
                            f"with the first call's chunk_size to keep them bitwise")


def _read_chunk(file: Path) -> dict:
    """The arrays of a chunk file (an ``.npz``), the file closed whatever happens; a file NumPy reads as
    something else (an ``.npy`` array, say) is a ValueError, as an unreadable one is."""
    with open(file, "rb") as fh:
        got = np.load(fh, allow_pickle=False)
        if not isinstance(got, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive of arrays")
        with got as z:
            return {k: z[k] for k in z.files}


def arithmetic_of(device) -> str:
    """What the last bits of a chunk's numbers depend on beyond its key: the GPU's name, or on the CPU the
    processor and torch's thread count (BLAS reductions split by thread). Not in the key (a resume on
    another machine is allowed); each chunk records it, and a merge of chunks made with different ones
    says so."""
    import platform

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return (f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
            f"torch threads {torch.get_num_threads()})")


#: What a merge of chunks of different arithmetic tells the user to do (the Python calls' checkpoints).
RESUME_BITWISE = ("resume with the first call's torch.set_num_threads (hcrfast bound: --threads) on the same kind "
                  "of device to keep them bitwise")


def mixed_arithmetic(where, arithmetics, resume_hint: str) -> None:
    """Warns where the chunks of one result were computed with different arithmetic (:func:`arithmetic_of`;
    ``"not recorded"`` for chunks from before it was)."""
    found = sorted(set(arithmetics))
    if len(found) > 1:
        validation.warn(f"{where}'s chunks were computed with different arithmetic ({'; '.join(found)}): the "
                        f"results (bounds, or attack estimates) agree up to rounding, but are not bitwise those of one uninterrupted run; "
                        f"{resume_hint}")


def gaps(total: int, finished) -> list[tuple[int, int]]:
    """The row ranges of ``0..total`` that no ``(start, stop, ...)`` of ``finished`` (sorted) covers."""
    out, lo = [], 0
    for start, stop, *_ in finished:
        if start > lo:
            out.append((lo, start))
        lo = max(lo, stop)
    if lo < total:
        out.append((lo, total))
    return out
