"""NVTX ranges in one ``hcrfast`` domain around the hot phases.

``annotate(name)`` marks a range for Nsight Systems (``nsys profile
--trace=cuda,nvtx``). With no profiler attached the ``nvtx`` package's
ranges cost well under a microsecond. Without that package (a machine
whose image lacks it), a CUDA build of torch still emits the ranges through
``torch.cuda.nvtx``, which has no domains: the names are prefixed
``hcrfast:`` instead. With neither, a null context is used.
"""
from __future__ import annotations

import contextlib
import functools
import threading

DOMAIN = "hcrfast"

#: The ranges open in each thread (its ident -> their names, innermost last): what ``progress=True``'s heartbeat
#: names where a chunk runs long without a line of its own (:func:`open_ranges`).
_OPEN: dict = {}


@functools.lru_cache(maxsize=1)
def _nvtx():
    try:
        import nvtx
    except ImportError:  # nvtx is a declared dependency, but a bare GPU image may lack it
        return None
    return nvtx


@functools.lru_cache(maxsize=1)
def _torch_nvtx():
    """``torch.cuda.nvtx`` where torch has CUDA and a device, else None."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.nvtx


@functools.lru_cache(maxsize=None)
def _range(name: str):
    nvtx = _nvtx()
    if nvtx is None:
        return None
    return nvtx.annotate(message=name, domain=DOMAIN)


def annotate(name: str):
    """A context manager marking ``name`` as an NVTX range in the ``hcrfast`` domain, and as open in this
    thread (:func:`open_ranges`) while it is."""
    if _range(name) is not None:
        return _tracked(name)
    torch_nvtx = _torch_nvtx()
    if torch_nvtx is not None:
        return _Tracked(name, torch_nvtx.range(f"{DOMAIN}:{name}"))
    return _tracked(name)


def open_ranges(thread: int) -> tuple:
    """The names of the ranges open in the thread of ident ``thread``, outermost first."""
    return tuple(_OPEN.get(thread, ()))


class _Tracked:
    """A range (``inner``: NVTX's, or a null context) also recorded in :data:`_OPEN` while it is open."""

    __slots__ = ("name", "inner")

    def __init__(self, name: str, inner):
        self.name, self.inner = name, inner

    def __enter__(self):
        names = _OPEN.setdefault(threading.get_ident(), [])
        names.append(self.name)
        try:
            return self.inner.__enter__()
        except BaseException:   # not entered, so never exited: the name goes now (a Ctrl-C in NVTX's push, say)
            names.pop()
            raise

    def __exit__(self, *exc):
        try:
            return self.inner.__exit__(*exc)
        finally:
            names = _OPEN.get(threading.get_ident())
            if names:
                names.pop()


@functools.lru_cache(maxsize=None)
def _tracked(name: str) -> _Tracked:
    """The one :class:`_Tracked` of ``name`` over the ``nvtx`` package's cached range (or a null context),
    which hold no state of a use: shared by every use, nested or in other threads."""
    rng = _range(name)
    return _Tracked(name, rng if rng is not None else contextlib.nullcontext())
