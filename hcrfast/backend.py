"""One array namespace per call: NumPy on the CPU, CuPy on the GPU.

The namespace is chosen from the data (as PyLops' ``get_array_module``); CuPy
is imported only when a CUDA array is actually seen or asked for, so CPU
installs never need it.
"""
from __future__ import annotations

import functools
import os
import sys
import types

import numpy as np

_INSTALL_HINT = (
    'install the GPU extra that matches your CUDA driver: '
    'pip install "hcrfast[cuda12]" or pip install "hcrfast[cuda13]"'
)


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
    """Bytes of memory the system can give without swapping (Linux ``MemAvailable``; elsewhere the free
    physical pages), or None where neither can be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None
