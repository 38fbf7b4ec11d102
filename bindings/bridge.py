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
import gc
import os
import sys

import numpy as np
import torch

from hcrfast.backend import import_cupy, is_cupy_array, warnings_ignored

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
        with warnings_ignored((None, DeprecationWarning)):  # CuPy 14 deprecates ExternalStream for Stream.from_external
            stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(index).cuda_stream, index)
        with cupy.cuda.Device(index):
            outer = cupy.cuda.get_current_stream()
            try:
                with stream, _cupy_allocations(cupy, stream, index):
                    yield stream
            finally:
                # CuPy work after the block (a result's .get()) runs on CuPy's stream of the caller; where
                # that is not torch's (a non-blocking torch stream), it waits for the block's last work,
                # on the device, without stopping the host.
                if outer.ptr != stream.ptr:
                    outer.wait_event(stream.record())


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


def _torch_caches_memory() -> bool:
    """False under ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, where every free would be a synchronizing cudaFree."""
    return os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "").strip().lower() not in ("1", "true", "yes", "on")


def _cupy_allocations(cupy, stream, device: int):
    """Within :func:`solver_stream`: CuPy allocates from torch's caching allocator (:func:`torch_malloc`).

    Left alone: under ``HCRFAST_CUPY_ALLOCATOR=cupy``, when torch does not cache device memory, and when
    the caller gave CuPy an allocator of their own (RMM, say): only CuPy's default pool is replaced.
    CuPy's allocator setting is thread-local and restored after the block.
    """
    current = cupy.cuda.get_allocator()
    if (cupy_allocator_choice() == "cupy" or not _torch_caches_memory()
            or getattr(current, "__self__", None) is not cupy.get_default_memory_pool()):
        return contextlib.nullcontext()
    return cupy.cuda.using_allocator(functools.partial(torch_malloc, cupy, stream.ptr, device, current))


class _TorchBlock:
    """Owner of one block of torch's caching allocator: gives it back when the last CuPy array on it dies."""

    __slots__ = ("ptr", "__weakref__")

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __del__(self):
        try:
            torch.cuda.caching_allocator_delete(self.ptr)
        except Exception:  # noqa: BLE001 - at interpreter exit torch may be gone before the array
            pass


def torch_malloc(cupy, stream_ptr: int, device: int, fallback, size: int):
    """A CuPy allocation (``cupy.cuda.alloc``'s interface) carved from torch's caching allocator.

    With two pools, the blocks the solver frees stay in CuPy's pool, where the model's next
    forward or backward pass cannot use them: it runs out of memory with the memory idle, and
    the chunk is halved and computed again. With one pool they are reused at once, and
    ``torch.cuda.mem_get_info`` / ``memory_allocated`` see the solver too. The block comes from
    ``torch.cuda.caching_allocator_alloc`` (torch's interface for other frameworks) on the
    solver's stream, and goes back when the CuPy memory object that owns it dies. torch ties a
    block to the stream it was allocated for, so this path is taken only while CuPy's current
    stream is the solver's; on any other stream ``fallback`` (CuPy's pool) serves.
    """
    if cupy.cuda.get_current_stream().ptr != stream_ptr:
        return fallback(size)
    if size == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
    block = _TorchBlock(torch.cuda.caching_allocator_alloc(size, device, stream_ptr))
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(block.ptr, size, block, device), 0)


def release_device_memory(device: torch.device) -> None:
    """Give the cached free blocks of torch's and CuPy's memory pools back to the device.

    The solver's arrays live in torch's pool by default, but CuPy's own pool serves
    allocations on other streams and every allocation under ``HCRFAST_CUPY_ALLOCATOR=cupy``;
    its freed blocks stay there, where torch cannot reuse them until released.
    """
    if device.type != "cuda":
        return
    gc.collect()  # arrays in reference cycles (a failed chunk's traceback) hold blocks of both pools
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


@contextlib.contextmanager
def ieee_float32(enabled: bool = True):
    """Run the block with float32 matmuls, convolutions and recurrent layers in full IEEE float32 (no TF32).

    torch's defaults let cuDNN convolutions use TF32 (about 1e-3 relative error in a forward
    pass, 3e-2 to 7e-2 in the ``J v`` of a CNN or ResNet-18, emulated: ``benchmarks/tf32_cost.py``),
    which makes a GPU's ``J v`` and ``Jᵀu`` differ from each other and from the CPU's by far more
    than LSQR's tolerances. The previous settings are restored afterwards, exactly. With
    ``enabled=False`` the block runs with whatever the caller set. Uses torch's
    ``fp32_precision`` settings where they exist, the ``allow_tf32`` flags otherwise.

    cuDNN keeps a third flag beside its conv and rnn settings, which only the ``allow_tf32``
    setter moves, and refuses to answer ``torch.backends.cudnn.allow_tf32`` (so does
    ``torch.backends.cudnn.flags()``, which model code uses) while the three disagree: setting
    conv (or conv and rnn) to "ieee" alone left every such read inside a call raising. So the
    setter turns all three off first, then conv and rnn are named "ieee".
    """
    if not enabled:
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    # cuDNN's own setting and its conv and rnn ones (torch >= 2.9; before, only the allow_tf32 flags)
    knobs = (cudnn, getattr(cudnn, "conv", None), getattr(cudnn, "rnn", None))
    if all(hasattr(k, "fp32_precision") for k in (matmul, *knobs)):
        saved_matmul = matmul.fp32_precision
        saved = [k.fp32_precision for k in knobs]
        try:
            saved_flag = cudnn.allow_tf32
        except RuntimeError:  # the caller's own settings disagree already: theirs to keep, restored as they were
            saved_flag = None
        try:
            matmul.fp32_precision = "ieee"
            cudnn.allow_tf32 = False
            cudnn.conv.fp32_precision = cudnn.rnn.fp32_precision = "ieee"
            yield
        finally:
            matmul.fp32_precision = saved_matmul
            if saved_flag is not None:
                cudnn.allow_tf32 = saved_flag
            for k, value in zip(knobs, saved):
                k.fp32_precision = value
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # old torch
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
