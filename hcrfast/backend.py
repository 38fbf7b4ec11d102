"""One array namespace per call: NumPy on the CPU, CuPy on the GPU.

The namespace is chosen from the data (as PyLops' ``get_array_module``); CuPy
is imported only when a CUDA array is actually seen or asked for, so CPU
installs never need it.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import types
import warnings

import numpy as np

_INSTALL_HINT = (
    'install the GPU extra that matches your CUDA driver: '
    'pip install "hcrfast[cuda12]" or pip install "hcrfast[cuda13]"'
)


@contextlib.contextmanager
def warnings_ignored(*specs):
    """Ignore, for the block, the warnings each ``(message regex or None, category)`` of ``specs`` matches (a
    message matches from its start, case-insensitively, as ``warnings.filterwarnings`` has it): filters of the
    block's own, put first in ``warnings.filters`` and taken out again by identity, in place.

    ``warnings.catch_warnings`` (and ``simplefilter`` / ``filterwarnings``) would tell the ``warnings`` module
    that its filters changed, which empties every module's record of the warnings it has shown already: with
    Python's default filters a warning repeated from one line is shown once, and after each hcrfast call that
    used them it came again (a training-mode model's warning once per call of a loop, of a σ sweep, and the
    user's own once-per-line warnings of other libraries too). Nor does ``catch_warnings`` keep a filter
    another thread added meanwhile: it puts back a copy of the list taken before. The ``ignore`` filters added
    here need neither: that module records only warnings it has shown, so none of its records are stale.

    They go into the list the ``warnings`` module reads now: under Python 3.14's context-aware warnings, inside
    a caller's ``catch_warnings`` that is its context's list (``warnings._get_filters()``), not
    ``warnings.filters``. They are taken out of that list, and of the one read at the block's end where another
    (a ``catch_warnings`` another thread entered meanwhile copies the list, and its exit would otherwise put
    back the original with them still in it)."""
    ours = [("ignore", None if message is None else re.compile(message, re.I), category, None, 0)
            for message, category in specs]
    target = _filters_now()
    for item in reversed(ours):
        target.insert(0, item)
    try:
        yield
    finally:
        now = _filters_now()
        for kept in (target,) if now is target else (target, now):
            for item in ours:
                for i, entry in enumerate(kept):
                    if entry is item:
                        del kept[i]
                        break


def _filters_now() -> list:
    """The filter list ``warnings.warn`` reads in this thread and context (``warnings.filters`` before 3.14)."""
    current = (getattr(warnings, "_get_filters", None)
               or getattr(sys.modules.get("_py_warnings"), "_get_filters", None))
    found = current() if callable(current) else None
    return found if isinstance(found, list) else warnings.filters


@functools.lru_cache(maxsize=1)
def import_cupy() -> types.ModuleType:
    """Import CuPy once, or raise an ImportError that says what to install."""
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(f"CuPy is needed for CUDA inputs but is not installed; {_INSTALL_HINT}") from exc
    return cupy


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device (probed once)."""
    try:
        cupy = import_cupy()
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def is_cupy_array(a) -> bool:
    """True for a CuPy array, without importing CuPy when it was never loaded."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(a, cupy.ndarray)


def host_argument(name: str, value):
    """An argument (σ, example ids, a target mask) given as a CuPy array, copied to the host on purpose (an
    argument, read once, not solver data); a torch tensor on the meta device refused, since it holds no
    values. Anything else as it is."""
    if is_cupy_array(value):
        return value.get()
    if getattr(value, "is_meta", False) and type(value).__module__.startswith("torch"):
        raise TypeError(f"{name} is a tensor on the meta device, which holds no values; pass one with data "
                        f"(on the CPU or the model's device)")
    return value


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim   # (the process's own C library: musl has none)
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_host_heap() -> None:
    """Give the free pages of the C heap back to the system (glibc's ``malloc_trim(0)``; nothing elsewhere).

    A forward in many pieces frees each piece's buffers (a few MiB: below glibc's mmap threshold, so on its
    heap) and keeps only their outputs; glibc went on extending the heap rather than reuse the holes between
    them, at times: a 3 × 32-channel CNN's certifying forward in 2 MiB pieces rose from 940 to 3,730 MiB of
    RSS with 245 MiB of it in use, in 2 of 6 runs (2026-12-02). A call took ~0.02 ms on a small heap, and ~4 ms on
    that one (802 calls, one after every piece, added ~3 s: hence one every 8 pieces)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def one_number(value):
    """A tensor or array of one element (torch, NumPy or CuPy: ``torch.tensor(1.0)``, ``np.array([0.5])``) as its
    number, as :func:`hcrfast.bound` takes one; else ``value`` (a NumPy scalar is a number already)."""
    count = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", None)
    if count == 1 and callable(getattr(value, "item", None)) and not isinstance(value, np.generic):
        return value.item()
    return value


def get_array_module(*arrays) -> types.ModuleType:
    """The namespace (``numpy`` or ``cupy``) of the given arrays.

    Raises
    ------
    TypeError
        When NumPy and CuPy arrays are mixed in one call.
    """
    kinds = {is_cupy_array(a) for a in arrays if a is not None and not np.isscalar(a)}
    if len(kinds) > 1:
        raise TypeError("mixed NumPy and CuPy arrays in one call; move them all to one device first")
    if kinds == {True}:
        return import_cupy()
    return np


def to_host(a) -> np.ndarray:
    """A deliberate device-to-host copy (a no-op for NumPy arrays)."""
    return a.get() if is_cupy_array(a) else np.asarray(a)


def available_memory() -> int | None:
    """Bytes of memory this process can get without swapping, or None where nothing can be read: the
    system's (Linux ``MemAvailable``; elsewhere the free physical pages), and no more than what its
    control group's memory limit leaves (:func:`cgroup_memory_left`: a container's limit, which the
    system's figure does not see)."""
    system = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    system = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if system is None:
        try:
            system = int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, OSError, ValueError):
            pass
    group = cgroup_memory_left()
    if group is None:
        return system
    return group if system is None else min(system, group)


#: Where :func:`cgroup_memory_left` reads (tests point them at a fake tree).
_PROC_CGROUP = "/proc/self/cgroup"
_CGROUP_ROOT = "/sys/fs/cgroup"

#: A cgroup "limit" at or above this is no limit (v1 writes 2**63 rounded down to a page).
_NO_LIMIT = 2**60


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat_value(path: str, key: str) -> int:
    try:
        with open(path) as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_memory_left() -> int | None:
    """Bytes the memory limit of this process's control group leaves, or None where it has none (or none
    can be read): ``limit − (usage − inactive file pages)``, the inactive page cache being what the
    kernel reclaims first (as ``docker stats`` counts). cgroup v2 (``memory.max``, ``memory.current``,
    ``memory.stat``), the tightest over the group and its parents, or v1 (``memory.limit_in_bytes``,
    ``memory.usage_in_bytes``, ``memory.stat``); a group path that the container does not show is read
    at the mount's root, which a container sees as its own group."""
    try:
        with open(_PROC_CGROUP) as fh:
            lines = [line.strip().split(":", 2) for line in fh if line.count(":") >= 2]
    except OSError:
        return None
    left = []
    for hid, controllers, path in lines:
        if hid == "0" and controllers == "":      # v2: the unified hierarchy
            base, files = _CGROUP_ROOT, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            base, files = os.path.join(_CGROUP_ROOT, "memory"), (
                "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        dirs = [os.path.join(base, *parts[:i]) for i in range(len(parts), -1, -1)]
        if not os.path.isdir(dirs[0]):           # the group's path is the host's: the container sees its root
            dirs = [base]
        for d in dirs:
            limit = _read_int(os.path.join(d, files[0]))
            usage = _read_int(os.path.join(d, files[1]))
            if limit is None or limit >= _NO_LIMIT or usage is None:
                continue
            inactive = _stat_value(os.path.join(d, "memory.stat"), files[2])
            left.append(max(0, limit - max(0, usage - inactive)))
    return min(left) if left else None
