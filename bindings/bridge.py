"""Zero-copy exchange between torch tensors and the solver's arrays.

CPU: ``torch.from_numpy`` / ``Tensor.numpy()`` share memory. CUDA: DLPack
(``torch.from_dlpack`` / ``cupy.from_dlpack``) shares device memory.

Stream rule: hcrfast issues all of its CuPy work and all of its torch work on
one stream, torch's current stream, which :func:`solver_stream` hands to CuPy
(``cupy.cuda.ExternalStream``). Work on the two sides is then ordered by the
stream itself and no event or synchronisation is needed at the hand-over.
"""
from __future__ import annotations

import contextlib
import sys
import warnings

import numpy as np
import torch

from hcrfast.backend import import_cupy, is_cupy_array

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def to_torch(a) -> torch.Tensor:
    """View a NumPy or CuPy array as a torch tensor, without copying."""
    if is_cupy_array(a):
        return torch.from_dlpack(a)
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    raise TypeError(f"expected a NumPy or CuPy array, got {type(a).__name__}")


def from_torch(t: torch.Tensor):
    """View a torch tensor as a NumPy (CPU) or CuPy (CUDA) array, without copying.

    A tensor that is not contiguous is made contiguous first (that one copies).
    """
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.is_cuda:
        return import_cupy().from_dlpack(t)
    return t.numpy()


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array (an index, say) as a tensor on ``device``, without the host waiting for the device.

    ``torch.as_tensor(a, device="cuda")`` copies from pageable memory and synchronizes the
    stream; a copy from pinned memory with ``non_blocking=True`` is only queued on torch's
    current stream, behind the work that reads it (torch keeps the pinned block until the copy
    has run). On the CPU the tensor shares ``a``'s memory, as ``torch.as_tensor`` would.
    """
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def array_module_for(device: torch.device):
    """NumPy for CPU tensors, CuPy for CUDA tensors."""
    if device.type == "cuda":
        return import_cupy()
    if device.type == "cpu":
        return np
    raise NotImplementedError(f"hcrfast runs on CPU or CUDA devices, not {device.type!r}")


@contextlib.contextmanager
def solver_stream(device: torch.device):
    """Make CuPy issue its work on torch's current stream for ``device`` (no-op on CPU).

    ``device`` also becomes torch's and CuPy's current device for the block, so that
    DLPack hand-overs of tensors on a second GPU are exported from their own device.
    """
    if device.type != "cuda":
        yield None
        return
    cupy = import_cupy()
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(index).cuda_stream, index)
        with cupy.cuda.Device(index), stream:
            yield stream


def release_device_memory(device: torch.device) -> None:
    """Give the cached free blocks of torch's and CuPy's memory pools back to the device.

    torch and CuPy keep separate pools: after an out-of-memory error the solver's
    freed vectors sit in CuPy's pool, where torch cannot reuse them until released.
    """
    if device.type != "cuda":
        return
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


#: The float32 settings of torch that may trade precision for speed: cuBLAS matmuls and
#: cuDNN convolutions in TF32 (10-bit mantissa) on Ampere and later GPUs.
_FP32_KNOBS = ("matmul", "conv")


def _fp32_knob(name):
    return torch.backends.cuda.matmul if name == "matmul" else torch.backends.cudnn.conv


@contextlib.contextmanager
def ieee_float32(enabled: bool = True):
    """Run the block with float32 matmuls and convolutions in full IEEE float32 (no TF32).

    torch's defaults let cuDNN convolutions use TF32 (about 1e-3 relative error), which
    makes a GPU's ``J v`` and ``Jᵀu`` differ from each other and from the CPU's by far more
    than LSQR's tolerances. The previous settings are restored afterwards. With
    ``enabled=False`` the block runs with whatever the caller set. Uses torch's
    ``fp32_precision`` settings where they exist, the ``allow_tf32`` flags otherwise
    (torch refuses a mix of the two APIs).
    """
    if not enabled:
        yield
        return
    if all(hasattr(_fp32_knob(k), "fp32_precision") for k in _FP32_KNOBS):
        saved = {k: _fp32_knob(k).fp32_precision for k in _FP32_KNOBS}
        try:
            for k in _FP32_KNOBS:
                _fp32_knob(k).fp32_precision = "ieee"
            yield
        finally:
            for k, value in saved.items():
                _fp32_knob(k).fp32_precision = value
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # pragma: no cover - old torch
    try:  # pragma: no cover
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        yield
    finally:  # pragma: no cover
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
