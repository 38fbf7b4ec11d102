"""Processes started by ``torchrun``: which one this is, and how they agree.

``hcrfast reproduce`` and ``hcrfast.bound(..., shard=True)`` share their chunks of examples
among the processes through a folder every process sees. The processes meet at a few named
steps (:meth:`World.agree`) through the process group's key-value store: each posts what it
holds (its call's key, rank 0's choices) and waits for the others. A process that fails in
between posts its error instead, so the others raise it at their next step rather than wait
forever, a process that never comes is named after ``HCRFAST_SHARD_TIMEOUT`` seconds at the
first step, and one that dies (``kill -9``, out of memory: no error posted) is named once it has
given no sign of life for a minute (each process beats from a thread of its own, computing or
waiting). No tensor collective is involved: the same code serves gloo and NCCL groups.

A process group hcrfast creates stays up for the life of the process (later calls reuse it;
a second ``init_process_group`` would hang in its rendezvous) and is destroyed at exit.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import json
import os
import threading
import time
import uuid
from pathlib import Path

import torch

__all__ = ["World", "ShardError", "join_timeout"]

_TIMEOUT_ENV = "HCRFAST_SHARD_TIMEOUT"
_DEFAULT_JOIN_TIMEOUT = 1800.0  # torch's own default for a collective
# Each process of a session beats (a counter in the store) every _BEAT seconds from a thread of its own,
# computing or waiting; one whose counter has not moved for _SILENT seconds is dead (killed, out of
# memory, its machine lost). torchrun's agent stops the others then; a group launched by hand does not.
_BEAT = 2.0
_SILENT = 60.0
# The index of this process's next shared call (by its rank: a process has one), where the processes'
# calls meet. A process the others gave up waiting for at a call (marked absent there) skips that index.
_next_call = collections.defaultdict(int)
_next_call_lock = threading.Lock()


def _new_lock_in_child() -> None:
    """A forked child starts with its own lock (hcrfast.validation's reason: one held at the fork stays held)."""
    global _next_call_lock
    _next_call_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


#: What a failed store operation raises: torch's DistError (DistNetworkError, DistStoreError), a RuntimeError
_STORE_ERRORS = getattr(torch.distributed, "DistError", RuntimeError) if torch.distributed.is_available() \
    else RuntimeError


class ShardError(RuntimeError):
    """Another process failed, disagreed or did not come. ``from_others``: every process raises it
    (another's failure, or a disagreement all of them see), so it is not posted again."""

    def __init__(self, message: str, *, from_others: bool = True):
        super().__init__(message)
        self.from_others = from_others


def join_timeout() -> float:
    """Seconds the first step waits for every process: ``HCRFAST_SHARD_TIMEOUT``, else 30 minutes."""
    text = os.environ.get(_TIMEOUT_ENV)
    if text is None:
        return _DEFAULT_JOIN_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{_TIMEOUT_ENV}={text!r} is not a positive number of seconds; unset it for the default "
                         f"({_DEFAULT_JOIN_TIMEOUT:g}) or set e.g. {_TIMEOUT_ENV}=3600")
    return value


class World:
    """This process's place among torchrun's processes (or alone)."""

    def __init__(self, device_type: str, *, set_device: bool = True):
        self.rank, self.size, self.local_rank, self.dist = 0, 1, 0, None
        self._prefix = None  # of this session's keys in the store
        self._at_end = []  # what to run when the session ends
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()  # by the caller, perhaps without torchrun
        if initialized or ("WORLD_SIZE" in os.environ and "RANK" in os.environ):
            if not dist.is_available():
                raise NotImplementedError("WORLD_SIZE and RANK are set (torchrun?) but this torch build has "
                                          "no torch.distributed; run a single process instead")
            self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if device_type == "cuda" and set_device:
                torch.cuda.set_device(self.local_rank)
            if not initialized:
                # The group's timeout bounds its creation, which waits for every process to join: a process that
                # never calls was waited for 72 hours, HCRFAST_SHARD_TIMEOUT ignored. hcrfast's own steps poll the
                # store with their own limits and run no collective, whatever the chunks' hours on a CPU.
                wait = join_timeout()
                try:
                    dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo",
                                            timeout=datetime.timedelta(seconds=wait))
                except Exception as exc:   # (torch's DistStoreError, or a RuntimeError naming the timeout)
                    if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                        raise
                    raise ShardError(f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: the other "
                                     f"processes did not all join within {wait:g} s, or the store at "
                                     f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} could not be "
                                     f"reached (torch: "
                                     f"{str(exc).splitlines()[0][:200]}); every process of the job must make the "
                                     f"same call (a process that failed or skipped it before joining never comes; "
                                     f"set {_TIMEOUT_ENV}=SECONDS to wait longer for a slow start)",
                                     from_others=False) from exc
                atexit.register(_destroy, dist)
            self.dist = dist
            self.rank, self.size = dist.get_rank(), dist.get_world_size()

    @property
    def tag(self) -> str:
        return "" if self.size == 1 else f" [rank {self.rank}/{self.size}]"

    @contextlib.contextmanager
    def session(self, what: str):
        """One shared call (``what`` names it in messages). An exception raised inside is posted
        for the other processes, which raise :class:`ShardError` naming it at their next step."""
        self._at_end = []
        if self.size == 1:
            try:
                yield self
            finally:
                self._run_at_end()
            return
        store = self._store()
        # Keys unique to this call of this job (and of this restart, under torchrun's elastic agent,
        # whose store outlives the workers it restarts).
        base = f"hcrfast/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        with _next_call_lock:
            call = _next_call[self.rank]
            while store.check([f"{base}{call}/absent/{self.rank}"]):  # the others gave up waiting for it there
                call += 1
            _next_call[self.rank] = call + 1
        self._prefix, self._what, self._steps = f"{base}{call}/", what, 0
        self._heard = {}  # rank -> (its beat counter, when this process saw it move)
        stop = threading.Event()
        beating = threading.Thread(target=_beat, args=(store, f"{self._prefix}beat/{self.rank}", stop),
                                   name="hcrfast-shard-beat", daemon=True)
        beating.start()
        try:
            yield self
        except BaseException as exc:
            if not getattr(exc, "from_others", False):
                with contextlib.suppress(Exception):  # the store may be gone too; the error itself matters
                    store.set(f"{self._prefix}failed/{self.rank}", f"{type(exc).__name__}: {exc}")
                    store.add(f"{self._prefix}failures", 1)
            raise
        else:  # a process still waiting at a step this one never reached is told so
            with contextlib.suppress(Exception):
                store.set(f"{self._prefix}left/{self.rank}", str(self._steps))  # after its last step's key
                store.add(f"{self._prefix}lefts", 1)
        finally:
            stop.set()
            beating.join(timeout=2 * _BEAT)  # a beat stuck on a store gone away is left behind (a daemon)
            self._prefix = None
            self._run_at_end()

    def at_end(self, call, *args, **kwargs) -> None:
        """Run ``call(*args, **kwargs)`` when this process leaves the session, however it leaves it."""
        self._at_end.append((call, args, kwargs))

    def _run_at_end(self) -> None:
        for call, args, kwargs in reversed(self._at_end):
            with contextlib.suppress(Exception):  # tidying up; the call's own outcome matters
                call(*args, **kwargs)
        self._at_end = []

    def agree(self, step: str, payload=None, *, timeout: float | None = None) -> list:
        """Every process's ``payload`` (JSON-able), by rank, once all have reached ``step``.

        The processes' steps meet in order: the n-th ``agree`` of each process is the same step,
        or all of them raise :class:`ShardError` naming where each one is (they took different
        paths, e.g. with other arguments). Also raises it if another process failed first, left
        the call without reaching this step, or, with ``timeout`` seconds (None: wait as long as
        it takes), did not come; those that did not come are named, and marked absent so that
        their next call skips this one."""
        if self.size == 1:
            return [payload]
        if self._prefix is None:
            raise RuntimeError("World.agree is called inside World.session only")
        try:
            return self._agree(step, payload, timeout)
        except _STORE_ERRORS as exc:
            raise self._store_lost(exc, step) from exc

    def _store_lost(self, exc, step: str) -> ShardError:
        """The error to raise where the process group's store failed under :meth:`agree` (torch's
        ``DistNetworkError: Broken pipe``, raised bare, each failed beat logging a C++ trace meanwhile)."""
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        return ShardError(f"{self._what}: the process group's store at {where} stopped answering while rank "
                          f"{self.rank} of {self.size} was at step {step!r} (torch: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}): rank 0 "
                          f"holds it where the processes were started by hand (torchrun's agent holds it otherwise), "
                          f"so rank 0 was killed, ran out of memory or lost its machine; what was finished is kept: "
                          f"run the same call again on every process to resume", from_others=False)

    def _agree(self, step: str, payload, timeout: float | None) -> list:
        store = self._store()
        index, self._steps = self._steps, self._steps + 1
        keys = [f"{self._prefix}step{index}/{r}" for r in range(self.size)]
        store.set(keys[self.rank], json.dumps(dict(step=step, payload=payload)))
        t0, pause = time.monotonic(), 0.01
        while not store.check(keys):
            if store.add(f"{self._prefix}failures", 0):
                failed = [f"rank {r}: {store.get(f'{self._prefix}failed/{r}').decode()}" for r in range(self.size)
                          if store.check([f"{self._prefix}failed/{r}"])]
                raise ShardError(f"{self._what} stopped on rank {self.rank} because another process failed: "
                                 + "; ".join(failed))
            # A process writes `left` after its last step's key: `left` first, then no key, is conclusive.
            gone = ([r for r in range(self.size) if store.check([f"{self._prefix}left/{r}"])
                     and not store.check([keys[r]])] if store.add(f"{self._prefix}lefts", 0) else [])
            if gone:  # every process still waiting sees it: not posted
                raise ShardError(f"{self._what}: rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} "
                                 f"finished the call without reaching the step {step!r} that rank {self.rank} waits "
                                 f"at: the processes took different paths; give every process the same call")
            silent = self._silent([r for r in range(self.size) if not store.check([keys[r]])])
            if silent:  # dead: its error never comes, nor its key
                raise ShardError(
                    f"{self._what}: rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} of {self.size} "
                    f"stopped answering ({_SILENT:g} s without a sign of life: killed, out of memory, or its machine "
                    f"lost) while rank {self.rank} waited at step {step!r}; what was finished is kept: run the same "
                    f"call again on every process to resume", from_others=False)
            if timeout is not None and time.monotonic() - t0 > timeout:
                missing = [r for r in range(self.size) if not store.check([keys[r]])]
                for r in missing:
                    store.set(f"{self._prefix}absent/{r}", "1")
                raise ShardError(
                    f"{self._what}: rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of "
                    f"{self.size} did not come within {timeout:g} s; every process of the job must make the same "
                    f"call (set {_TIMEOUT_ENV}=SECONDS to wait longer for a slow start)", from_others=False)
            time.sleep(pause)
            pause = min(1.0, pause * 2)
        got = [json.loads(store.get(k)) for k in keys]
        if len({g["step"] for g in got}) > 1:  # every process sees it: not posted
            where = ", ".join(f"rank {r} at {g['step']!r}" for r, g in enumerate(got))
            raise ShardError(f"{self._what}: the processes reached different steps ({where}): they took different "
                             f"paths; give every process the same call")
        return [g["payload"] for g in got]

    def _silent(self, ranks) -> list:
        """Those of ``ranks`` whose beat has not moved for ``_SILENT`` seconds, as this process saw it."""
        store, now, silent = self._store(), time.monotonic(), []
        for r in ranks:
            count = store.add(f"{self._prefix}beat/{r}", 0)
            seen, since = self._heard.get(r, (None, now))
            if count != seen:
                self._heard[r] = (count, now)
            elif count and now - since > _SILENT:  # 0: not come yet (the first step's timeout waits for it)
                silent.append(r)
        return silent

    def mark_folder(self, folder) -> str | None:
        """Rank 0 leaves a file in ``folder`` for the others to find (taken back by
        :meth:`check_folder`, or however the session ends); its name, None on the other ranks."""
        if self.rank != 0 or self.size == 1:
            return None
        token = Path(folder) / f".shard-{uuid.uuid4().hex}"
        token.touch()
        self.at_end(token.unlink, missing_ok=True)
        return token.name

    def check_folder(self, folder, name: str, label: str) -> None:
        """Every process looks for rank 0's file ``name`` (from :meth:`mark_folder`) in its own
        ``folder``. Where one misses it, every process raises :class:`ShardError` naming the folders,
        after a step, so that an error of rank 0 in the meantime (which took its file back) is raised
        instead. Rank 0 then takes its file back. ``label`` names the argument (``checkpoint``, ``--out``)."""
        if self.size == 1:
            return
        seen = self.agree("folder", dict(found=(Path(folder) / name).is_file(), folder=str(folder)))
        if self.rank == 0:
            (Path(folder) / name).unlink(missing_ok=True)
        lost = [f"rank {r}'s {s['folder']!r}" for r, s in enumerate(seen) if not s["found"]]
        if lost:
            raise ShardError(f"{self._what}: {label} {seen[0]['folder']!r} on rank 0, but {', '.join(lost)} is not "
                             f"that folder (rank 0's file {name} is not in it): every process must pass the same "
                             f"{label}, on a filesystem they all see")

    def _store(self):
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()


#: Failed beats in a row after which a process stops beating: its store is gone (rank 0 killed, in a group started
#: by hand), which the next step's wait names; each failed beat logged torch's C++ trace of the broken pipe, every
#: 2 s until then (20 of them). One failure alone (a store slow to answer) does not stop it.
_FAILED_BEATS = 3


def _beat(store, key: str, stop: threading.Event) -> None:
    """Add 1 to ``key`` every ``_BEAT`` seconds until ``stop`` (this process is alive), or until
    :data:`_FAILED_BEATS` of them failed in a row."""
    failed = 0
    while failed < _FAILED_BEATS:
        try:
            store.add(key, 1)
            failed = 0
        except Exception:   # noqa: BLE001 - whatever the store raised: the waits name what follows
            failed += 1
        if stop.wait(_BEAT):
            return


def _destroy(dist) -> None:
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()


def differences(mine: dict, theirs: dict) -> list[str]:
    """The keys whose values differ between two calls' keys, sorted."""
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
