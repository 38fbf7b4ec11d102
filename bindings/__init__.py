"""Bridges between torch and the solver's arrays, and torch Jacobian operators."""
from hcrfast.bindings.bridge import (array_module_for, from_torch, ieee_float32, release_device_memory, solver_stream,
                                     to_device, to_torch)
from hcrfast.bindings.jacobian import TorchJacobian, jvp

__all__ = ["TorchJacobian", "array_module_for", "from_torch", "ieee_float32", "jvp", "release_device_memory",
           "solver_stream", "to_device", "to_torch"]
