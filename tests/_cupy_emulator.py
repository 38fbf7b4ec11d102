"""A strict stand-in for CuPy on a machine without a GPU: hcrfast's device path, run on the CPU.

hcrfast writes its solver once on an array namespace ``xp`` (NumPy on the CPU, CuPy on CUDA), and
CI has no GPU. Code that is only right for NumPy (``np.asarray`` of a device array, a NumPy array
mixed into a device expression, a host read inside the LSQR loop) would pass every CPU test and
fail on the first GPU. This module runs that path here: its arrays hold their data in host memory,
but they behave the way CuPy 14's do wherever NumPy is more permissive:

* **No implicit conversion to NumPy.** ``np.asarray(a)``, ``np.array(a)``, ``np.savez(..., a)``
  raise CuPy's ``TypeError`` (its ``__array__``); ``a.get()`` / ``cupy.asnumpy(a)`` copy.
* **NumPy arrays are refused** by elementwise operations and by the module's functions (CuPy's
  ``TypeError: Unsupported type <class 'numpy.ndarray'>``), except where CuPy copies host data to
  the device: ``asarray``/``array``/``asanyarray``, index arrays, and assignment through advanced
  indices. A basic-slice assignment of a non-scalar NumPy array raises CuPy's ``ValueError``
  ("non-scalar numpy.ndarray cannot be used for fill").
* **Reductions and indexing return 0-d arrays**, never NumPy scalars; arrays have no ``__index__``.
* **Only CuPy's names exist** on the module, its ``linalg``/``fft``/``random`` and on arrays, and
  the module's functions take only CuPy's keyword arguments where CuPy's signature says which:
  ``cupy_api_names.json`` lists them (CuPy 14.2.0's ``dir()`` and ``inspect.signature``;
  ``test_gpu.py`` checks the names, and these rules, against the real CuPy when a GPU is there). NumPy functions called on these
  arrays dispatch as CuPy's ``__array_function__`` does: to the CuPy function of that name, or
  ``TypeError`` where CuPy has none.
* **Every host read of device data is counted** in :attr:`Emulator.reads`: ``get``/``asnumpy``,
  ``float``/``int``/``bool``/``complex``, ``item``/``tolist``/``tobytes``, boolean-mask indexing and
  ``nonzero``/``flatnonzero``/``argwhere`` (CuPy reads the count of True back to size the
  result), each as the name of what read. Host-to-device copies are counted in ``writes``.

What it does not model: streams, DLPack across devices, device memory and its exhaustion, the
Numba CUDA kernels (``tests/test_kernels_cudasim.py`` runs those under Numba's simulator), and
dtype promotion where CuPy and NumPy differ.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import types

import numpy as np

NAMES = json.loads(pathlib.Path(__file__).with_name("cupy_api_names.json").read_text())

_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")
#: module functions that read a count back to the host to size their result
_SYNCING = {"nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract"}
#: module functions that take host data and copy it to the device
_FROM_HOST = {"asarray", "array", "asanyarray"}
_SUBMODULES = ("linalg", "fft", "random")


class Emulator:
    """One fake ``cupy`` module with its own transfer counters."""

    def __init__(self):
        self.reads: list[str] = []
        self.writes = 0
        self.enabled = True  # read by the code that routes torch tensors here (tests' fixture)
        self.module = self._module()

    @contextlib.contextmanager
    def off(self):
        """Run the block on the plain NumPy path (the oracle), with the emulator still installed."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    # ---------------------------------------------------------------- conversions
    def wrap(self, value):
        """NumPy results as device arrays (NumPy scalars as 0-d arrays), recursively."""
        if isinstance(value, np.ndarray):
            return ndarray(value, self)
        if isinstance(value, np.generic):
            return ndarray(np.asarray(value), self)
        if isinstance(value, tuple):
            return tuple(self.wrap(v) for v in value)
        if isinstance(value, list):
            return [self.wrap(v) for v in value]
        return value

    def unwrap(self, value, where, from_host=False):
        """Device arrays as their NumPy data; a NumPy array is refused unless ``from_host``."""
        if isinstance(value, ndarray):
            return value._a
        if isinstance(value, np.ndarray):
            if not from_host:
                raise TypeError(f"Unsupported type {type(value)} (in {where}: a NumPy array where CuPy "
                                f"needs a device array; copy it with cupy.asarray first)")
            self.writes += 1
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(self.unwrap(v, where, from_host) for v in value)
        if hasattr(value, "__dlpack__") and not isinstance(value, np.generic):  # a torch tensor
            raise TypeError(f"Unsupported type {type(value)} (in {where})")
        return value

    def call(self, func, name, args, kwargs):
        from_host = name in _FROM_HOST
        args = self.unwrap(args, name, from_host)
        kwargs = {k: self.unwrap(v, name, from_host) for k, v in kwargs.items()}
        if name in _SYNCING:
            self.reads.append(name)
        return self.wrap(func(*args, **kwargs))

    # ---------------------------------------------------------------- the module
    def _function(self, func, name, keywords=None):
        def device_function(*args, **kwargs):
            unknown = sorted(set(kwargs) - set(keywords)) if keywords is not None else []
            if unknown:
                raise TypeError(f"{name}() got an unexpected keyword argument {unknown[0]!r} (CuPy's {name} "
                                f"takes {keywords})")
            return self.call(func, name, args, kwargs)
        device_function.__name__ = name
        return device_function

    def _namespace(self, modname, source, sub):
        module = types.ModuleType(modname)
        names, keywords = set(NAMES[sub]), NAMES["keywords"][sub]

        def getattr_(name):
            if name not in names or not hasattr(source, name):
                raise AttributeError(f"module {modname!r} has no attribute {name!r}")
            value = getattr(source, name)
            if callable(value) and not isinstance(value, type):  # dtypes (cupy.float64 is numpy's) pass
                value = self._function(value, name, keywords.get(name))
            setattr(module, name, value)
            return value
        module.__getattr__ = getattr_
        return module

    def _module(self):
        cupy = self._namespace("cupy", np, "module")
        cupy.__version__ = NAMES["cupy"] + "+cpu-emulator"
        cupy.ndarray = ndarray
        for sub in _SUBMODULES:
            setattr(cupy, sub, self._namespace(f"cupy.{sub}", getattr(np, sub), sub))

        def asnumpy(a, stream=None, order="C", out=None):
            return a.get() if isinstance(a, ndarray) else np.asarray(a, order=order)

        def get_array_module(*args):
            return cupy if any(isinstance(a, ndarray) for a in args) else np

        cupy.asnumpy, cupy.get_array_module = asnumpy, get_array_module
        runtime = types.SimpleNamespace(getDeviceCount=lambda: 0)  # no device: cuda_available() stays False
        cupy.cuda = types.SimpleNamespace(runtime=runtime)
        return cupy


class ndarray(np.lib.mixins.NDArrayOperatorsMixin):  # noqa: N801 - CuPy's class name
    """A device array of the emulator: NumPy data, CuPy's rules (see the module docstring)."""

    __slots__ = ("_a", "_emu")

    def __init__(self, a: np.ndarray, emulator: Emulator):
        self._a, self._emu = a, emulator

    # ------------------------------------------------------------- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: self._emu.wrap(self._a.T))
    mT = property(lambda self: self._emu.wrap(self._a.mT))
    real = property(lambda self: self._emu.wrap(self._a.real))
    imag = property(lambda self: self._emu.wrap(self._a.imag))
    data = property(lambda self: types.SimpleNamespace(ptr=self._a.__array_interface__["data"][0]))

    def __getattr__(self, name):
        if name not in NAMES["ndarray"] or not hasattr(np.ndarray, name):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        method = getattr(self._a, name)
        emu = self._emu
        if name in ("item", "tolist", "tobytes"):
            def read(*args, **kwargs):
                emu.reads.append(name)
                return method(*args, **kwargs)
            return read
        return lambda *args, **kwargs: emu.call(method, name, args, kwargs)

    def get(self, stream=None, order="C", out=None):
        self._emu.reads.append("get")
        return np.array(self._a, order=order)

    def __repr__(self):
        return f"cupy-emulator {self._a!r}"

    # ------------------------------------------------------------- host reads
    def __array__(self, *args, **kwargs):
        raise TypeError(_IMPLICIT)

    def _read(self, kind, convert):
        self._emu.reads.append(kind)
        return convert(self._a)

    def __float__(self):
        return self._read("float", float)

    def __int__(self):
        return self._read("int", int)

    def __bool__(self):
        return self._read("bool", bool)

    def __complex__(self):
        return self._read("complex", complex)

    # ------------------------------------------------------------- indexing
    def _key(self, key):
        """The NumPy key, and whether it holds an advanced (array) index; boolean masks read back."""
        parts = key if isinstance(key, tuple) else (key,)
        out, advanced = [], False
        for k in parts:
            if isinstance(k, ndarray):
                k = k._a
            elif isinstance(k, (np.ndarray, list)):
                self._emu.writes += 1
                k = np.asarray(k)
            if isinstance(k, np.ndarray):
                advanced = True
                if k.dtype == bool:
                    self._emu.reads.append("mask index")
            out.append(k)
        return (tuple(out) if isinstance(key, tuple) else out[0]), advanced

    def __getitem__(self, key):
        key, _ = self._key(key)
        return self._emu.wrap(self._a[key])

    def __setitem__(self, key, value):
        key, advanced = self._key(key)
        if isinstance(value, ndarray):
            value = value._a
        elif isinstance(value, np.ndarray):
            if not advanced and value.ndim > 0:
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            self._emu.writes += 1
        elif hasattr(value, "__dlpack__") and not isinstance(value, np.generic):
            raise TypeError(f"Unsupported type {type(value)}")
        self._a[key] = value

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self._emu.wrap(row) for row in self._a)

    # ------------------------------------------------------------- protocols
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        emu = self._emu
        where = f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__
        for x in inputs:
            if not isinstance(x, (ndarray, np.ndarray, np.generic, int, float, complex, bool)):
                raise TypeError(f"Unsupported type {type(x)} (in {where})")
        args = emu.unwrap(inputs, where)
        out = kwargs.get("out")
        if out is not None:
            out = out if isinstance(out, tuple) else (out,)
            kwargs["out"] = emu.unwrap(out, where)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out  # the caller's own device arrays
        return emu.wrap(result)

    def __array_function__(self, func, types_, args, kwargs):
        parts = func.__module__.split(".")[1:]
        sub = parts[0] if parts and parts[0] in _SUBMODULES else None
        if parts and sub is None:  # numpy.lib.*, numpy._core.*: CuPy looks them up under cupy.*
            parts = []
        module = getattr(self._emu.module, sub) if sub else self._emu.module
        try:
            device_function = getattr(module, func.__name__)
        except AttributeError:
            return NotImplemented  # NumPy then raises: "no implementation found for ..."
        return device_function(*args, **kwargs)

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def check_rules(cupy, reads=None):
    """Assert the rules above on a CuPy module: the emulator's (with its read log) or the real one.

    ``test_cupy_emulated.py`` runs it on the emulator and ``test_gpu.py`` on CuPy itself, so the
    emulator's claims are checked against the library wherever a GPU is there.
    """
    import pytest

    a = cupy.arange(6, dtype=cupy.float64).reshape(2, 3)
    host = np.ones((2, 3))
    for implicit in (np.asarray, np.array):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
            implicit(a)
    for mixed in (lambda: a + host, lambda: host * a, lambda: cupy.where(a > 1, host, a),
                  lambda: cupy.concatenate([a, host])):
        with pytest.raises(TypeError):
            mixed()
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        a[:] = host
    with pytest.raises(AttributeError):
        cupy.errstate  # a NumPy name CuPy does not have
    with pytest.raises(TypeError):
        [0, 1, 2][cupy.int64(1) + a[0, 0].astype(cupy.int64)]  # no __index__
    for numpy_only_keyword in (lambda: cupy.mean(a, where=a > 0), lambda: np.mean(a, where=a > 0)):
        with pytest.raises(TypeError):
            numpy_only_keyword()
    total = a.sum()
    assert isinstance(total, cupy.ndarray) and total.shape == ()
    assert isinstance(a[0, 1], cupy.ndarray) and isinstance(np.sqrt(a), cupy.ndarray)
    assert isinstance(np.linalg.norm(a, axis=1), cupy.ndarray)  # NumPy functions dispatch to CuPy's
    rows = np.array([1, 0])
    assert a[rows].shape == (2, 3)  # host index arrays are copied to the device
    a[rows] = host * 2.0  # and so are values assigned through them
    assert float(a[0, 0]) == 2.0 and a.get().sum() == 12.0
    if reads is not None:
        del reads[:]
        float(total), int(total), bool(total), total.item(), a.get(), cupy.asnumpy(a), a[a > 1], cupy.flatnonzero(a)
        assert reads == ["float", "int", "bool", "item", "get", "get", "mask index", "flatnonzero"]
