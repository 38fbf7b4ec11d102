"""Zero-copy exchange between torch tensors and the solver's arrays.

CPU: ``torch.from_numpy`` / ``Tensor.numpy()`` share memory. CUDA: DLPack
(``torch.from_dlpack`` / ``cupy.from_dlpack``) shares device memory.

Stream rule: hcrfast issues all of its CuPy work and all of its torch work on
one stream, torch's current stream, which :func:`solver_stream` hands to CuPy
(``cupy.cuda.ExternalStream``). Work on the two sides is then ordered by the
stream itself and no event or synchronisation is needed at the hand-over.

Memory rule: in the same block CuPy allocates from torch's caching allocator
(:func:`torch_malloc`), so the two libraries draw on one pool.
``HCRFAST_CUPY_ALLOCATOR=cupy`` gives CuPy its own pool back.
"""
from __future__ import annotations

import contextlib
import functools
import os
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
        with cupy.cuda.Device(index), stream, _cupy_allocations(cupy):
            yield stream


#: Environment variable choosing where the solver's CuPy arrays live on the GPU: ``torch`` (the
#: default: in torch's caching allocator, one pool for the model's tensors and the solver's
#: vectors) or ``cupy`` (CuPy's own memory pool beside torch's).
ALLOCATOR_ENV = "HCRFAST_CUPY_ALLOCATOR"
_ALLOCATORS = ("torch", "cupy")


def cupy_allocator_choice() -> str:
    """``HCRFAST_CUPY_ALLOCATOR`` (``torch`` when unset), checked."""
    choice = os.environ.get(ALLOCATOR_ENV, "torch").strip().lower() or "torch"
    if choice not in _ALLOCATORS:
        raise ValueError(f"{ALLOCATOR_ENV}={os.environ[ALLOCATOR_ENV]!r} is not one of {', '.join(_ALLOCATORS)}: "
                         f"'torch' puts the solver's CuPy arrays in torch's caching allocator (the default), "
                         f"'cupy' in CuPy's own memory pool; set it to one of them or unset it")
    return choice


def _cupy_allocations(cupy):
    """Within :func:`solver_stream`: CuPy allocates from torch's caching allocator (see :func:`torch_malloc`),
    unless ``HCRFAST_CUPY_ALLOCATOR=cupy``. CuPy's allocator setting is thread-local and restored after."""
    if cupy_allocator_choice() == "cupy":
        return contextlib.nullcontext()
    return cupy.cuda.using_allocator(functools.partial(torch_malloc, cupy))


def torch_malloc(cupy, size: int):
    """A CuPy allocation (``cupy.cuda.alloc``'s interface) carved from torch's caching allocator.

    With two pools, the blocks the solver frees stay in CuPy's pool, where the model's next
    forward or backward pass cannot use them: it runs out of memory with the memory idle, and
    the chunk is halved and computed again. With one pool they are reused at once, and
    ``torch.cuda.mem_get_info`` / ``memory_allocated`` see the solver too. The block is a
    ``torch.uint8`` tensor owned by the CuPy memory object; torch frees it when the last CuPy
    array on it dies. torch ties a block to the stream it was allocated on, so this path is
    taken only when CuPy's current stream is torch's (as :func:`solver_stream` makes it);
    on any other stream the allocation comes from CuPy's own pool.
    """
    device = cupy.cuda.Device().id
    if cupy.cuda.get_current_stream().ptr != torch.cuda.current_stream(device).cuda_stream:
        return cupy.get_default_memory_pool().malloc(size)
    block = torch.empty(size, dtype=torch.uint8, device=device)
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(block.data_ptr(), size, block, device), 0)


def release_device_memory(device: torch.device) -> None:
    """Give the cached free blocks of torch's and CuPy's memory pools back to the device.

    The solver's arrays live in torch's pool by default, but CuPy's own pool serves
    allocations on other streams and every allocation under ``HCRFAST_CUPY_ALLOCATOR=cupy``;
    its freed blocks stay there, where torch cannot reuse them until released.
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
