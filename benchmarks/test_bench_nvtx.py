"""What an NVTX range costs when no profiler is attached (the issue: "near-zero cost").

hcrfast opens about two ranges per LSQR step (the JVP's and the VJP's, in the bindings) and one
per block of ``check_every`` steps; a product costs tens of microseconds on a GPU (a kernel
launch alone is several) and far more on the CPU. Compared here: ``profiling.annotate`` through
the ``nvtx`` package (what runs where it is installed), through ``torch.cuda.nvtx`` (its fallback on
a CUDA machine without the package; skipped without CUDA), and an empty ``with`` block.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from hcrfast import profiling


def _enter_exit(make):
    def once():
        with make():
            pass
    return once


def test_nvtx_package_range(benchmark):
    if profiling._nvtx() is None:
        pytest.skip("the nvtx package is not installed")
    benchmark(_enter_exit(lambda: profiling.annotate("lsqr.block")))


@pytest.mark.gpu
def test_torch_nvtx_range(benchmark):
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda.nvtx needs CUDA")
    benchmark(_enter_exit(lambda: torch.cuda.nvtx.range("hcrfast:lsqr.block")))


def test_empty_with_block(benchmark):
    benchmark(_enter_exit(contextlib.nullcontext))
