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

DOMAIN = "hcrfast"


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
    """A context manager marking ``name`` as an NVTX range in the ``hcrfast`` domain."""
    rng = _range(name)
    if rng is not None:
        return rng
    torch_nvtx = _torch_nvtx()
    if torch_nvtx is not None:
        return torch_nvtx.range(f"{DOMAIN}:{name}")
    return contextlib.nullcontext()
