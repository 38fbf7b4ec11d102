"""Processes started by ``torchrun``: which one this is, and the few collectives hcrfast needs.

``hcrfast reproduce`` and ``hcrfast.bound(..., shard=True)`` share their chunks of examples
among the processes through a folder every process sees; they only need a barrier and a
broadcast from rank 0, over gloo on the CPU and NCCL on CUDA.
"""
from __future__ import annotations

import datetime
import os

import torch

__all__ = ["World"]


class World:
    """This process's place among torchrun's processes (or alone)."""

    def __init__(self, device_type: str, *, set_device: bool = True):
        self.rank, self.size, self.local_rank, self.dist = 0, 1, 0, None
        self._owns_group = False
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
                # The final barrier waits for the slowest process's chunks, which can take hours
                # for the ImageNet models on a CPU: far beyond the 30-minute default. A failed
                # process is still noticed at once: torchrun stops the others.
                dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo",
                                        timeout=datetime.timedelta(hours=72))
                self._owns_group = True
            self.dist = dist
            self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def barrier(self) -> None:
        if self.dist is None:
            return
        if self.dist.get_backend() == "nccl":  # name the device: NCCL would guess it from the rank
            self.dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            self.dist.barrier()

    def from_rank0(self, obj):
        """``obj`` as rank 0 has it, on every rank."""
        if self.dist is None:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.dist is not None and self._owns_group:
            self.dist.destroy_process_group()

    @property
    def tag(self) -> str:
        return "" if self.size == 1 else f" [rank {self.rank}/{self.size}]"
