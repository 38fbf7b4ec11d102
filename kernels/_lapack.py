"""SciPy's LAPACK called from Python threads, one matrix per call, without the GIL.

``scipy.linalg.cython_lapack`` exports every LAPACK routine of the LAPACK SciPy ships as a C
function pointer. Called through :mod:`ctypes`, such a pointer runs with the GIL released
(ctypes drops it around every foreign call), so Python threads run one matrix each on every
core, with no compilation step (a Numba ``nogil`` loop over the same routine costs ~2-4 s of
compilation once per process). Meanwhile BLAS is held to one thread: LAPACK's own BLAS calls
would otherwise start a thread per core inside each of our threads.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import threading

import numpy as np

#: Calls that overlap (a user's own threads) take turns: BLAS's thread count is the process's, and
#: the last one out would restore the limit another call had set (leaving BLAS on one thread).
LOCK = threading.Lock()


def _new_lock_in_child() -> None:
    """A forked child starts with its own LOCK: one held by another of the parent's threads at the fork (a
    multiprocessing 'fork' pool made while a call ran) would stay held in the child forever."""
    global LOCK
    LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


@functools.cache
def routine(name: str, n_args: int):
    """The LAPACK routine ``name`` of SciPy's LAPACK, as a ctypes function of ``n_args`` pointers
    (Fortran passes every argument by reference)."""
    import scipy.linalg.cython_lapack as lapack

    capsule = lapack.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, get_name(capsule))
    return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_args))(address)


def cores() -> int:
    """Threads this process may run: the cores it may run on, and no more than torch's thread count
    (``torch.set_num_threads``, ``hcrfast bound --threads``), which is the user's say on it."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    import torch

    return max(1, min(n, torch.get_num_threads()))


def workers(per_thread_bytes: int, available: int | None) -> int:
    """Threads: one per core (:func:`cores`), but no more than the per-thread workspaces that fit in a
    quarter of the ``available`` memory (bytes, :func:`hcrfast.backend.available_memory`: a container's
    memory limit included; None: unreadable, 8 GiB assumed)."""
    available = available or 8 * 2**30
    return max(1, min(cores(), available // 4 // max(1, per_thread_bytes)))


def chunks(costs: np.ndarray, threads: int) -> list[tuple[int, int]]:
    """Contiguous index ranges of about equal summed ``costs``, at most ``threads`` of them."""
    g = len(costs)
    if g == 0:
        return []
    work = np.cumsum(np.asarray(costs, dtype=np.float64))
    n = max(1, min(threads, g))
    bounds = np.searchsorted(work, work[-1] * np.arange(1, n) / n, side="right")
    edges = [0, *sorted(set(int(b) for b in bounds) - {0, g}), g]
    return list(zip(edges[:-1], edges[1:]))


def run(task, ranges) -> None:
    """``task(lo, hi)`` for every range, in a thread each, with BLAS held to one thread."""
    with LOCK:
        try:
            from threadpoolctl import threadpool_limits
            limit = threadpool_limits(1, user_api="blas")
        except ImportError:  # a declared dependency; without it BLAS may oversubscribe the cores
            limit = None
        try:
            if len(ranges) > 1:
                with concurrent.futures.ThreadPoolExecutor(max_workers=len(ranges)) as pool:
                    list(pool.map(lambda r: task(*r), ranges))
            elif ranges:
                task(*ranges[0])
        finally:
            if limit is not None:
                limit.restore_original_limits()
