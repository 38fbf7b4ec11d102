"""Checks at the boundary of the public API, done once per call.

Messages name the offending value and say how to fix it. ``ValueError`` for
bad values, ``TypeError`` for bad types.
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import copy
import functools
import inspect
import textwrap
import math
import numbers
import os
import re
import sys
import threading
import warnings

import numpy as np
import scipy.sparse  # noqa: F401  (its import adds a warnings filter: hcrfast's import, not a call, makes it)
import torch

from hcrfast.backend import host_argument, warnings_ignored


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def _inside_hcrfast(filename: str) -> bool:
    """A frame of hcrfast's three packages (or of contextlib, between its context managers' frames)."""
    import hcrfast.bindings
    import hcrfast.kernels

    roots = [os.path.dirname(m.__file__) + os.sep for m in (sys.modules["hcrfast"], hcrfast.kernels, hcrfast.bindings)]
    return filename == contextlib.__file__ or any(filename.startswith(root) for root in roots)


class HcrfastWarning(Warning):
    """What every warning hcrfast issues is, besides its kind (:class:`HcrfastUserWarning`,
    :class:`HcrfastRuntimeWarning`): ``warnings.filterwarnings("ignore", category=hcrfast.HcrfastWarning)``
    silences hcrfast's and no other's, and the command line tells its own warnings from those of the user's model."""


class HcrfastUserWarning(HcrfastWarning, UserWarning):
    """A :class:`UserWarning` of hcrfast's: an argument or a model it had to change or could not honour."""


class HcrfastRuntimeWarning(HcrfastWarning, RuntimeWarning):
    """A :class:`RuntimeWarning` of hcrfast's: a search or a solve that ended short of what was asked."""


def tagged(category) -> type:
    """``category`` as hcrfast issues it: UserWarning and RuntimeWarning as their :class:`HcrfastWarning` kinds."""
    if issubclass(category, HcrfastWarning):
        return category
    return {UserWarning: HcrfastUserWarning, RuntimeWarning: HcrfastRuntimeWarning}.get(category, category)


#: ``(said, named)``: while a call runs on a problem rescaled for it, the text its warnings say of the noise
#: (``Gaussian(sigma=1)``) and what it stands for in the caller's units (:func:`named_as`).
_NAMED = contextvars.ContextVar("hcrfast_named", default=None)


@contextlib.contextmanager
def named_as(said: str, named: str):
    """Within the block, :func:`warn` writes ``named`` for the first ``said`` of a message: a sweep or search that
    runs ``bound`` at σ = k on the features divided by its sigma0 has that call's warnings name the σ the caller
    gave (``Gaussian(sigma=1e+300) (sigma0 x 1: ...)``), not the k it ran at, read as a σ nobody passed."""
    token = _NAMED.set((said, named))
    try:
        yield
    finally:
        _NAMED.reset(token)


def warn(message: str, category=UserWarning) -> None:
    """``warnings.warn`` naming the user's line: the first frame outside hcrfast, however deep the call
    (a fixed ``stacklevel`` goes stale as soon as a wrapper or a helper adds a frame); the category
    :func:`tagged` as hcrfast's; the noise named in the caller's units within :func:`named_as`."""
    named = _NAMED.get()
    if named is not None and named[0] in message:
        message = message.replace(named[0], named[1], 1)
    level, frame = 1, sys._getframe(0)
    while frame is not None and _inside_hcrfast(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, tagged(category), stacklevel=level)


def say(text: str) -> None:
    """A progress line on standard error, best-effort: a process without one (``sys.stderr`` None: pythonw, some
    services) prints nothing, where ``print(file=None)`` wrote it to standard output, among the results; a closed
    stream or a reader gone (a broken pipe: ``hcrfast bound ... 2>&1 | head``) loses the line, not the run and
    its finished work."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        try:
            stream.write(text + "\n")
        except UnicodeEncodeError:   # an ASCII stream (PYTHONIOENCODING=ascii): σ and a path's é as escapes
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write((text + "\n").encode(encoding, "backslashreplace").decode(encoding))
        flush = getattr(stream, "flush", None)   # (a logging wrapper may have write() alone)
        if flush is not None:
            flush()
    except (OSError, ValueError, LookupError):   # BrokenPipeError, EIO; "I/O operation on closed file"
        pass


def seed(value) -> int:
    """A seed of ``numpy.random.default_rng``: a non-negative integer (NumPy's own integers too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"seed must be a non-negative integer, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"seed must be a non-negative integer, got {value}")
    return int(value)


def positive_float(name: str, value, hint: str = "") -> float:
    value = host_argument(name, value)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if (value.size if isinstance(value, np.ndarray) else value.numel()) != 1:
            raise TypeError(f"{name} must be one number, got an array of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}{hint}")
    return value


SIGMA_HINT = ("; pass the noise std of the released features, e.g. hcrfast.rms_sigma(features, 1.0), "
              "or a noise law such as hcrfast.Laplace(b)")


GAUSSIAN_HINT = ("; pass the noise std of the released features, e.g. hcrfast.rms_sigma(features, 1.0), or "
                 "one std per feature")


def sigma_or_law(value, *, laws: bool = True):
    """The ``sigma`` argument of ``bound``, ``targeted_bound`` and the attack: a noise law passes; else one
    positive number. ``laws``: whether the caller takes other laws than Gaussian (said in the messages)."""
    from hcrfast.noise import NoiseLaw

    if isinstance(value, NoiseLaw):
        return value
    value = host_argument("sigma", value)
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]  # [0.05]: one number (one std per feature is a longer sequence)
    hint = SIGMA_HINT if laws else GAUSSIAN_HINT
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, torch.Tensor, np.ndarray)):
        raise TypeError(f"sigma must be a real number, got {type(value).__name__}{hint}"
                        + (" (any i.i.d. density: hcrfast.MonteCarlo.from_scipy(dist))" if laws else ""))
    return positive_float("sigma", value, hint)


def real_array(value) -> np.ndarray:
    """``value`` (numbers, a sequence of them, an array or tensor) as a float64 array; TypeError for strings
    ("0.5"), bools (also one among numbers: NumPy makes [0.5, True] 0.5, 1.0), complex numbers and other objects.
    Fractions are taken, as :func:`hcrfast.bound` takes them (``sweep_sigma``'s scales, ``dithered_accuracy``'s σ)."""
    from hcrfast.noise import detached

    if isinstance(value, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in value):
        raise TypeError("bool among the numbers")
    given = np.asarray(detached(value))   # (a list of tensors that require grad: their values)
    if given.dtype.kind == "O" and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in given.flat):
        given = given.astype(np.float64)   # fractions.Fraction(1, 2)
    if given.dtype.kind not in "iuf":
        raise TypeError(f"not real numbers (dtype {given.dtype})")
    return given.astype(np.float64)


def jacobian_mode(value) -> str:
    """``jacobian=`` of :func:`hcrfast.bound` and the attack: "reverse" or "forward"; "auto" (the default of
    :func:`hcrfast.targeted_bound`, whose LSQR path reads it as "reverse") is "reverse"."""
    choice("jacobian", value, ("reverse", "forward", "auto"))
    return "reverse" if value == "auto" else value


#: True inside a call run on its batch divided by a power of two (:func:`hcrfast.noise.accepts_per_feature_sigma`):
#: steps whose ‖ε‖² overflows are refused there (:class:`StepsOutOfRange`), to run the call again undivided.
INPUTS_DIVIDED = contextvars.ContextVar("hcrfast_inputs_divided", default=False)


class StepsOutOfRange(ValueError):
    """A call's steps ε, or their feature shifts, left the range its dtype holds (overflowed, or came out 0):
    σ·size too far from the features' scale for the solver. :func:`hcrfast.noise.accepts_per_feature_sigma` runs
    a call on a batch it divided by a power of two (:func:`hcrfast.noise.input_scale`) again on the batch as it
    is when this is raised, before saying it: the division assumes steps the inputs' size, which a model that
    does not normalize its inputs does not take."""


def dtype_name(dtype) -> str:
    """``torch.float32`` → ``"float32"``: how messages name a dtype."""
    return str(dtype).replace("torch.", "")


def choice(name: str, value, options) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return value


def model_and_batch(model, batch, basis: str, *, forward_only: bool = False) -> torch.Tensor:
    """The checks every public entry point makes of its model and batch; returns the batch. ``forward_only``: the
    caller runs forward passes only (no Jacobian), so parameters made under torch.inference_mode are fine."""
    if not callable(model):
        raise TypeError(f"model must be a torch.nn.Module (or callable), got {type(model).__name__}")
    batch = check_batch(batch, basis)
    model_dtype_device(model, batch, forward_only=forward_only)
    return batch


def float32_for_float16(model, batch: torch.Tensor, *, copied: str | None = None):
    """``(model, batch)``, or float32 copies of a float16 Module and batch, with a warning (``copied``: the
    caller's own words where the copy was made, for one that computes no certified bounds). The solver's arrays
    would be float16, whose range (65504) the sums of squares of LSQR's and the Krylov basis' norms overflow
    for features in the hundreds (an inf step, a NaN tridiagonal), and whose arithmetic NumPy emulates
    slowly. The copy holds the same weights (float16 values are float32 values), the bounds are certified by
    a float64 copy's passes as ever, and the solver's steps only choose which ε to certify. A callable that
    is not a Module stays in float16; so, with a warning, does a Module that cannot be copied, or whose copy
    fails on a float32 example or does not give float32 features for it (a cast inside its forward).

    Called before :func:`entry_point`, so it does what the entry point would for the copy's check: outside
    torch.inference_mode (a call under it made the copies inference tensors, which autograd refuses to save
    for the Jacobian products), and the copy in eval mode, its flags restored for the entry point to switch
    and warn about as for any model (in training mode the check's forward updated the copy's BatchNorm
    running statistics, whose bounds were then of another model, and BatchNorm1d refused its one row, which
    left a model that runs in eval mode in float16). The user's model is not touched: only its copy runs."""
    if batch.dtype != torch.float16 or not isinstance(model, torch.nn.Module):
        return model, batch
    try:
        # (eval_mode's warning: the entry point says it of the copy, as of any model)
        with warnings_ignored((None, Warning)), torch.inference_mode(False):
            model32 = copy.deepcopy(model).float()
            _note_copy(model32, model)
            batch32 = batch.float()
            with eval_mode(model32), torch.no_grad():   # a forward that casts to float16 itself (x.half()) stays
                out = model32(batch32[:1])
    except Exception as exc:   # (deepcopy raises TypeError for what cannot be pickled, a lock say)
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        warn(f"the model ({_class_name(model)}) and batch are float16, and hcrfast could not run a float32 copy of "
             f"the model ({type(exc).__name__}: {text}), so hcrfast solves in float16, whose range (65504) the "
             f"solver's sums of squares overflow for features in the hundreds (an inf step, a NaN result); pass "
             f"model.float() and batch.float(), or make the model copyable (copy.deepcopy) with a forward that "
             f"keeps its input's dtype")
        return model, batch
    if not (isinstance(out, torch.Tensor) and out.dtype == torch.float32):
        got = dtype_name(out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        warn(f"the model ({_class_name(model)}) and batch are float16, and a float32 copy of the model returns {got} "
             f"features for a float32 example (a cast inside its forward), so hcrfast solves in float16, whose range "
             f"(65504) the solver's sums of squares overflow for features in the hundreds (an inf step, a NaN "
             f"result); make the forward keep its input's dtype (drop the cast) for hcrfast to run the float32 copy")
        return model, batch
    said = copied or ("the model and batch are float16: hcrfast solves with a float32 copy of the model (float16's "
                      "range, 65504, overflows the solver's sums of squares for features in the hundreds) and "
                      "certifies the bounds in float64 as always (with certify=False, the feature shifts are the "
                      "float32 copy's); pass model.float() and batch.float() to silence this")
    # the class named, so a second model of another class met at the same line is warned about too
    warn(said.replace("the model and batch", f"the model ({_class_name(model)}) and batch", 1))
    return model32, batch32


def lsqr_options(options):
    """``options`` if it is an ``hcrfast.LSQROptions`` (or None), else a TypeError."""
    from hcrfast.lsqr import LSQROptions

    if options is not None and not isinstance(options, LSQROptions):
        raise TypeError(f"lsqr must be an hcrfast.LSQROptions, got {type(options).__name__}")
    return options


def chunk_size(value):
    """None (automatic) or a positive integer number of examples per chunk."""
    return None if value is None else positive_int("chunk_size", value)


def warn_uncertified(batch: torch.Tensor, certify: bool) -> None:
    """With ``certify=False`` and a batch below float64: the bounds are not certified, say so (once per call)."""
    if certify or batch.dtype == torch.float64:
        return
    name = dtype_name(batch.dtype)
    warn(f"certify=False: every feature shift z_eps comes from forward passes in {name}, whose rounding moves D "
         f"either way, so these bounds are not certified: they can come out above the valid bound by that rounding "
         f"(the smaller size, the more); certify=True (a float64 copy of the model) or a float64 model and batch "
         f"certifies them")


def float64_model(model, batch: torch.Tensor, certify: bool):
    """The model that certifies (computes ``z_ε`` in float64): a float64 copy of a torch Module, the
    model itself for a float64 batch or ``certify=False``. A plain function cannot be copied to float64."""
    if not certify or batch.dtype == torch.float64:
        return model
    if not isinstance(model, torch.nn.Module):
        name = getattr(model, "__qualname__", type(model).__name__)
        raise TypeError(
            f"certify=True recomputes every feature shift in float64 with a float64 copy of the model, which only "
            f"a torch.nn.Module gives, but the model is {type(model).__name__} {name!r}; make it a Module (a "
            f"subclass of torch.nn.Module whose forward calls your function, with the modules it uses as its "
            f"attributes), or pass a float64 model and batch, or certify=False (z_eps then comes from forward "
            f"passes in {dtype_name(batch.dtype)}, exact up to that rounding)")
    fixes = (f"or pass a float64 model and batch, or certify=False (z_eps then comes from forward passes in "
             f"{dtype_name(batch.dtype)}, exact up to that rounding)")
    # .double() of a TorchScript module reads .grad of its non-leaf parameters; torch warns about it
    with warnings_ignored((r"The \.grad attribute of a Tensor that is not a leaf", UserWarning)):
        try:
            model64 = copy.deepcopy(model).double()
            _note_copy(model64, model)
        except RuntimeError as exc:  # e.g. torch.nn.utils.weight_norm's computed (non-leaf) weights
            pruned = _pruned(model)
            if not pruned and "deepcopy protocol" not in str(exc):
                # out of memory (the copy's weights), or the model's own __deepcopy__: its error, said of the copy
                _note_float64_copy(exc)
                raise
            fix = (f"the model is pruned with torch.nn.utils.prune, whose masked weights (weight_orig * weight_mask) "
                   f"are computed, not leaves: make the pruning permanent first, "
                   f"{'; '.join(pruned[:4])}{' ...' if len(pruned) > 4 else ''}" if pruned else
                   "with torch.nn.utils.weight_norm or spectral_norm use torch.nn.utils.parametrizations.weight_norm / "
                   "spectral_norm, which copy")
            raise TypeError(f"certify=True recomputes every feature shift in float64 with a float64 copy of the model, "
                            f"but the model cannot be copied (torch: {exc}); {fix}, {fixes}") from None
    # Checked on one example now, not after the whole solve: a forward that casts its input
    # (x.float(), x.to(self.dtype)), keeps tensors outside its parameters and buffers, or has
    # frozen TorchScript constants is not converted by .double().
    try:
        with torch.no_grad():
            out = model64(batch[:1].double())
    except RuntimeError as exc:
        from hcrfast.algorithm import _is_oom   # (imported here: algorithm imports this module)

        if _is_oom(exc):   # the copy's forward out of memory: not a cast in the model, and the CLI says it so
            _note_float64_copy(exc)
            raise
        exported = ("; an exported program (torch.export) keeps the dtypes it was exported for: export a float64 "
                    "model (torch.export.export(model.double(), (batch.double(),), ...)) and pass it with a float64 "
                    "batch" if _exported(model) else "")
        raise TypeError(f"certify=True recomputes every feature shift in float64 with a float64 copy of the model "
                        f"(copy.deepcopy(model).double()), but that copy fails on a float64 example (torch: "
                        f"{str(exc).splitlines()[0]}): some tensor or cast in its forward stays "
                        f"{dtype_name(batch.dtype)} (a cast such as x.float(), tensors kept outside its parameters "
                        f"and buffers, frozen TorchScript constants){exported}; make the forward follow its input's "
                        f"dtype, {fixes}") from None
    if isinstance(out, torch.Tensor) and out.dtype != torch.float64:
        raise TypeError(f"certify=True recomputes every feature shift in float64 with a float64 copy of the model, "
                        f"but that copy returns {dtype_name(out.dtype)} features (a cast at the end of its forward, "
                        f"e.g. .float()), so the certification would not be in float64; drop that cast, {fixes}")
    _same_function(model, batch, out, fixes)
    return model64


#: :func:`_same_function`: the largest gap, over the largest feature, between the model's features of an example
#: and its float64 copy's that the model's rounding is taken to explain: float32 rounds at ~1e-7, TF32 at ~5e-4 of
#: the features (``tf32=True``), a float16 model's float32 copy like float32.
COPY_GAP_LIMIT = 1e-2


def _note_copy(copy_, model) -> None:
    """:func:`hcrfast.algorithm.note_copy`: the copy's CPU forwards pieced by the model's activations."""
    from hcrfast.algorithm import note_copy

    note_copy(copy_, model)


def _same_function(model, batch: torch.Tensor, out, fixes: str) -> None:
    """Refuse a float64 copy whose features ``out`` of ``batch[:1]`` are not the model's own up to its rounding
    (:data:`COPY_GAP_LIMIT`): the certification would be of another function. A forward that branches on its
    input's dtype (a float32-only fused or quantized path with another float64 fallback) gave bounds 100 times
    those of the model it was called with, certified by the copy's function, with a warning that called them
    rigorous still (2026-12-02)."""
    if not isinstance(out, torch.Tensor) or not bool(torch.isfinite(out).all()):
        return   # (the features' own checks name a model whose features are not finite)
    from hcrfast.bindings import ieee_float32

    # the model's own function in its dtype: not the caller's autocast (bfloat16 rounds ResNets' features at
    # ~1e-2) nor TF32, whose rounding is no other function
    kind = batch.device.type
    with torch.no_grad(), ieee_float32(True), (torch.autocast(kind, enabled=False) if _autocast_on(kind)
                                               else contextlib.nullcontext()):
        own = model(batch[:1])
    if not isinstance(own, torch.Tensor) or own.numel() != out.numel() or not bool(torch.isfinite(own).all()):
        return
    own = own.detach().double().reshape(-1)
    scale = max(float(out.abs().max()), float(own.abs().max()))
    gap = float((own - out.reshape(-1)).abs().max())
    if gap > COPY_GAP_LIMIT * scale:
        raise ValueError(f"certify=True recomputes every feature shift in float64 with a float64 copy of the model "
                         f"(copy.deepcopy(model).double()), but on the batch's first example that copy's features "
                         f"differ from the model's by up to {gap:.3g}, {gap / scale:.3g} of the largest feature, "
                         f"far past {dtype_name(batch.dtype)}'s rounding: the copy computes another function (a "
                         f"forward that branches on its input's dtype, a {dtype_name(batch.dtype)}-only fused or "
                         f"quantized path with another float64 fallback), or the model loses most of its digits in "
                         f"{dtype_name(batch.dtype)} (a small difference of large values), so its bounds would be "
                         f"certified for a function other than the one it computes; make the forward compute the "
                         f"same function in float64, or pass a float64 model and batch (model.double(), "
                         f"batch.double(): the function bounded is then the float64 one), or certify=False "
                         f"(z_eps then comes from forward passes in {dtype_name(batch.dtype)})")


def _note_float64_copy(exc: BaseException) -> None:
    exc.add_note("hcrfast: raised while making and checking the float64 copy of the model that certifies the bounds "
                 "(certify=True); certify=False, or a float64 model and batch, makes none")


def _pruned(model) -> list[str]:
    """``torch.nn.utils.prune.remove(model[1], 'weight')`` (its module's path) for each tensor of ``model`` pruned with
    torch.nn.utils.prune (a forward pre-hook of type BasePruningMethod on its module), root first."""
    from torch.nn.utils import prune

    if getattr(model, "wraps_user_model", False):  # noise.PerFeatureStd: named as the user's model
        return _pruned(model.model)
    try:
        modules = list(model.named_modules())
    except (AttributeError, RuntimeError):
        return []

    def path(name):   # model[1].conv, not model.1.conv
        return "model" + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in name.split(".") if part)

    return [f"torch.nn.utils.prune.remove({path(name)}, {hook._tensor_name!r})"
            for name, module in modules for hook in module._forward_pre_hooks.values()
            if isinstance(hook, prune.BasePruningMethod)]


def checkpoint_folder(value):
    """None or a folder path (str or os.PathLike): the ``checkpoint`` argument, ``~`` expanded to the user's home
    (as a shell would; not a folder named ``~``)."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a folder path (str or os.PathLike) or None, got {value!r}")
    if value is not None and not os.fspath(value).strip():
        raise ValueError(f"checkpoint={os.fspath(value)!r} names no folder (it would write into the current "
                         f"directory); pass a folder, e.g. checkpoint='runs/bounds', or None for no checkpoint")
    return value if value is None else os.path.expanduser(value)


def flag(name: str, value) -> bool:
    """A True/False argument (NumPy's bool too); anything else is a TypeError."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def example_ids(ids, batch_size: int) -> np.ndarray:
    """Global indices of a batch's examples (default 0..B−1), checked: B non-negative integers."""
    if ids is None:
        return np.arange(batch_size)
    ids = host_argument("example_ids", ids)
    if isinstance(ids, (list, tuple)):   # (Python ints past int64: NumPy makes them float64, which the next names)
        big = [v for v in ids if isinstance(v, int) and not isinstance(v, bool) and v > np.iinfo(np.int64).max]
        if big:
            raise ValueError(f"example_ids must be {batch_size} non-negative integers up to 2**63 - 1 (they seed the "
                             f"noise with NumPy's int64), got {big[0]}")
    ids = np.asarray(ids)
    if ids.shape != (batch_size,) or ids.dtype.kind not in "iu" or np.any(ids < 0):
        raise ValueError(f"example_ids must be {batch_size} non-negative integers (one per example), "
                         f"got an array of shape {ids.shape} and dtype {ids.dtype}")
    values, counts = np.unique(ids, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(f"example_ids must be distinct (each id seeds its example's own noise, so repeated ids "
                         f"give distinct examples the same draws); repeated: {values[counts > 1][:10].tolist()}")
    if ids.size and ids.max() > np.iinfo(np.int64).max:
        raise ValueError(f"example_ids must fit in int64 (they seed NumPy's streams), got {int(ids.max())}")
    return ids.astype(np.int64)  # one dtype: the same ids in int32 make the same checkpoint key


def scaled_norm(t: torch.Tensor) -> float:
    """‖t‖₂ in float64 without its squares leaving float64's range (a J v of 1e-200 has a norm; its squares
    underflow to 0, which made the adjoint check's tolerance 0)."""
    t = t.detach().double()
    top = float(t.abs().max()) if t.numel() else 0.0
    return top * float((t / top).norm()) if 0 < top < math.inf else top


def batch_tensor(batch) -> None:
    """Refuses what is not a tensor of at least one example (any dtype: :func:`check_batch`, its one caller,
    then refuses what no derivative reaches, integer ids included)."""
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"batch must be a torch.Tensor of shape (B, ...), got {type(batch).__name__}; "
                        f"convert with torch.as_tensor(batch)")
    strided_tensor("batch", batch)
    if batch.ndim >= 1 and batch.shape[0] == 0:
        raise ValueError(f"batch is empty (shape {tuple(batch.shape)}): pass at least one example, (B, ...) with "
                         f"B >= 1")


def strided_tensor(name: str, t: torch.Tensor) -> None:
    """Refuses a sparse, nested or MKL-DNN tensor (torch's own errors came from deep inside a forward or a
    reduction, naming an operator), saying how to make it dense."""
    if t.is_nested:
        raise TypeError(f"{name} is a nested tensor (examples of different shapes), but hcrfast bounds a batch of "
                        f"examples of one shape; pad them to one shape (torch.nested.to_padded_tensor({name}, 0.0)) "
                        f"or call hcrfast once per shape")
    if t.layout != torch.strided:
        kind = str(t.layout).replace("torch.", "").lstrip("_")
        raise TypeError(f"{name} is a {kind} tensor, but hcrfast takes dense (strided) tensors only; pass "
                        f"{name}.to_dense()")


def check_batch(batch, basis: str) -> torch.Tensor:
    batch_tensor(batch)
    if batch.device.type not in ("cpu", "cuda"):
        raise ValueError(f"batch is on {batch.device}, but hcrfast runs on the CPU (NumPy) or a CUDA GPU (CuPy) "
                         f"only; move the model and batch to one of them: model.cpu() and batch.cpu(), or "
                         f"model.cuda() and batch.cuda()")
    if not batch.is_floating_point():
        if batch.is_complex():
            fix = "split it into real and imaginary channels (torch.view_as_real) inside a wrapper model"
        else:
            fix = ("for images stored as integers, pass batch.float() (scaled and normalized as the model "
                   "expects); token or class ids are out of any derivative's reach: bound the embedded input "
                   "instead (the model from after its embedding layer, with batch = embedding(ids))")
        raise TypeError(f"batch must be a real floating-point tensor (the bound is on unbiased estimators of a "
                        f"continuous input), got dtype {batch.dtype}; {fix}")
    if batch.dtype == torch.bfloat16:
        raise TypeError("batch is torch.bfloat16, which the solver's arrays (NumPy, CuPy) cannot hold; run in float32: "
                        "pass model.float() and batch.float() (bounds are certified in float64 either way)")
    if batch.ndim < 2:
        raise ValueError(f"batch must have a leading batch axis, got shape {tuple(batch.shape)}; "
                         f"for one example pass batch[None] (shape (1, {', '.join(map(str, batch.shape))}))")
    if basis == "dct" and batch.ndim < 3:
        raise ValueError(f"basis='dct' transforms the last two axes (H, W), but the examples have shape "
                         f"{tuple(batch.shape[1:])}; pass basis='pixel' for vector inputs, or for the 1-D DCT of "
                         f"a signal the batch as batch[:, None] (examples of shape (1, {batch.shape[1]})) with a "
                         f"model that drops that axis (lambda x: model(x[:, 0]) in an nn.Module): the DCT of a "
                         f"length-1 axis is the identity")
    if batch[0].numel() == 0:
        raise ValueError(f"each example of the batch has no values (shape {tuple(batch.shape[1:])}): there is "
                         f"no input to bound; pass examples with at least one value")
    finite_inputs(batch)
    # A copy: a model that writes into its input (nn.ReLU(inplace=True) first) cannot change the caller's
    # batch, and a tensor made under torch.inference_mode becomes one autograd can differentiate at. Contiguous
    # (row-major), whatever the batch's layout: a channels_last batch gave bounds other at rounding level, which a
    # resumed call mixed with its first chunks' unseen (the checkpoint's key hashes the values, not the strides).
    with torch.inference_mode(False):
        return batch.detach().clone(memory_format=torch.contiguous_format)


def finite_inputs(batch: torch.Tensor) -> None:
    """Refuses a batch holding NaN or inf, naming the examples."""
    bad = _nonfinite_rows(batch)
    if bad:
        raise ValueError(f"batch contains NaN or inf in examples {bad[:10]}{' ...' if len(bad) > 10 else ''}; "
                         f"clean or drop those examples")


def _nonfinite_rows(t: torch.Tensor) -> list[int]:
    if t.numel() == 0:   # (no rows, or rows of nothing: reshape(B, -1) cannot infer -1)
        return []
    finite = torch.isfinite(t.reshape(t.shape[0], -1)).all(dim=1)
    return torch.nonzero(~finite).flatten().tolist()


def model_dtype_device(model, batch: torch.Tensor, *, forward_only: bool = False) -> None:
    lazy = _uninitialized_lazy(model)
    if lazy:   # (torch's own error named a method of its tensors, not the module)
        raise ValueError(f"the model's {', '.join(lazy[:4])}{' ...' if len(lazy) > 4 else ''} "
                         f"{'is a lazy module' if len(lazy) == 1 else 'are lazy modules'} whose parameters are not "
                         f"initialized yet (a lazy module infers its shapes on its first forward); run the model once "
                         f"on an example first to initialize them (model(batch[:1])), then call hcrfast")
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    if not forward_only and any(p.is_inference() for p in params):
        raise ValueError("the model's parameters were made under torch.inference_mode, and autograd cannot "
                         "differentiate through them; create or load the model outside it (calling hcrfast "
                         "inside torch.inference_mode is fine)")
    for p in params:
        if p.is_floating_point():
            if p.dtype != batch.dtype:
                raise TypeError(f"the model's parameters are {p.dtype} but the batch is {batch.dtype}; "
                                f"cast one to the other (e.g. batch.to({p.dtype}))")
            if p.device != batch.device:
                raise ValueError(f"the model is on {p.device} but the batch is on {batch.device}; "
                                 f"move both to one device (model.to(device), batch.to(device))")
            break
    elsewhere = [name for name, p in (model.named_parameters() if params else ()) if p.device != batch.device]
    if elsewhere:   # a model split over devices: torch's own error named no parameter
        raise ValueError(f"the model's parameters {elsewhere[:5]}{' ...' if len(elsewhere) > 5 else ''} are not on "
                         f"{batch.device}, the batch's device (a model split over devices is not supported); move the "
                         f"whole model there (model.to({str(batch.device)!r}))")


def _uninitialized_lazy(model) -> list[str]:
    """The modules of ``model`` (torch.nn.LazyLinear and friends) whose parameters are still uninitialized, named
    as "submodule NAME (TYPE)" ("model (TYPE)" for the root)."""
    if getattr(model, "wraps_user_model", False):  # noise.PerFeatureStd: named as the user's model
        return _uninitialized_lazy(model.model)
    if not isinstance(model, torch.nn.Module):
        return []
    try:
        modules = list(model.named_modules())
    except (AttributeError, RuntimeError):   # frozen TorchScript modules list no submodules
        return []
    return [f"submodule {name} ({type(m).__name__})" if name else f"root ({type(m).__name__})"
            for name, m in modules
            if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()]


def _dtype_mismatch_note(model, batch: torch.Tensor, exc: Exception) -> str:
    """For a callable that is not a Module whose first forward failed on dtypes (torch's "mat1 and mat2 must have
    the same dtype, but got Double and Float"): what to do, naming the batch's dtype; "" otherwise. hcrfast casts
    a Module (its float64 copy), not the tensors a closure holds."""
    model = user_model(model)   # (inside noise.PerFeatureStd, ScaledInputs)
    if isinstance(model, torch.nn.Module) or not isinstance(exc, RuntimeError):
        return ""
    aliases = {"double": "float64", "float": "float32", "half": "float16"}
    named = {aliases.get(word.lower(), word.lower())
             for word in re.findall(r"bfloat16|float64|float32|float16|double|half|float", str(exc), flags=re.I)}
    if len(named) < 2:   # (one dtype named: another kind of error, a device mismatch say)
        return ""
    name = dtype_name(batch.dtype)
    note = (f"hcrfast: the batch is {name}, and the model (a {type(model).__name__}, not a torch.nn.Module, whose "
            f"tensors hcrfast cannot cast) computes with tensors of another dtype: give it {name} parameters (for "
            f"torch.func.functional_call, {{k: v.to(torch.{name}) for k, v in params.items()}})")
    if batch.dtype == torch.float64:
        note += ", or pass a float32 batch with certify=False (z_eps then comes from float32 forward passes)"
    return note


def features_of(model, batch: torch.Tensor, *, flat: bool = True) -> torch.Tensor:
    """Run the model once (split where it runs out of memory) and check what it returns: (B, n)
    features, all finite (``flat=False``: in the model's own shape, (B, ...))."""
    from hcrfast.algorithm import forward  # here: algorithm imports this module

    finite_inputs(batch)  # (and NaN != NaN would pass for an in-place write below)
    before = batch.clone()
    try:
        out = forward(model, batch)
    except Exception as exc:
        # (Python >= 3.11: the error itself, with what it was given; not where hcrfast's own wrapper of the model
        # refused an argument of the call, a per-feature sigma that does not fit the features, say)
        if hasattr(exc, "add_note") and not getattr(exc, "hcrfast_argument", False):
            exc.add_note(_dtype_mismatch_note(model, batch, exc) or
                         f"hcrfast: the model raised this on its first forward pass over the batch, of shape "
                         f"{tuple(batch.shape)}, {dtype_name(batch.dtype)}, on {batch.device}: check that the model "
                         f"takes a batch of this shape, dtype and device")
        raise
    if not torch.equal(batch, before):  # else its next forwards see other inputs: "random", wrongly
        raise ValueError("the model writes into its input in place: its forward changed the batch it was given "
                         "(torchvision's normalize(..., inplace=True), x.sub_(mean), nn.ReLU(inplace=True) first, "
                         "...); hcrfast runs it many times on the same inputs and differentiates with respect to "
                         "them: make those steps out of place (normalize(..., inplace=False), x = x - mean, "
                         "nn.ReLU(inplace=False))")
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model must return a torch.Tensor of features, got {type(out).__name__}; "
                        f"wrap it so that it returns the feature tensor only")
    if out.ndim == 0 or out.shape[0] != batch.shape[0]:
        raise ValueError(f"the model returned shape {tuple(out.shape)} for a batch of {batch.shape[0]} examples; "
                         f"it must keep the batch axis first")
    if out[0].numel() == 0:
        raise ValueError("the model returned no features (0 entries per example)")
    if out.dtype != batch.dtype:
        if not out.dtype.is_floating_point:  # (running both in an integer or complex dtype is no way out)
            raise TypeError(f"the model returns {dtype_name(out.dtype)} features for a {dtype_name(batch.dtype)} "
                            f"batch; the bounds need real floating-point features: make the model return the "
                            f"batch's dtype (drop the cast, rounding or complex step at its end)")
        # (bfloat16 is refused as a batch dtype, and autocast gives bfloat16 or float16 features whatever the
        # model's dtype: no use in running both in it)
        kind = batch.device.type
        if _autocast_on(kind) and out.dtype == torch.get_autocast_dtype(kind) and _autocast_made(model, batch, kind):
            raise TypeError(f"the model returns {dtype_name(out.dtype)} features for a {dtype_name(batch.dtype)} "
                            f"batch because hcrfast was called under torch.autocast ({kind}, "
                            f"{dtype_name(out.dtype)}); the solver works in one dtype: call hcrfast outside the "
                            f"autocast region (or inside torch.autocast({kind!r}, enabled=False)), or, to bound "
                            f"the model as autocast runs it, return y.to(x.dtype) at the end of its forward")
        both = ("" if out.dtype in (torch.bfloat16, torch.float16)
                else f", or run both in {dtype_name(out.dtype)} (model.to({out.dtype}), batch.to({out.dtype}))")
        raise TypeError(f"the model returns {dtype_name(out.dtype)} features for a "
                        f"{dtype_name(batch.dtype)} batch; the solver works in one dtype: make the "
                        f"model return the batch's dtype (drop the cast at its end; under torch.autocast, "
                        f"return y.to(x.dtype)){both}")
    bad = _nonfinite_rows(out)
    if bad:
        raise ValueError(f"the model's features contain NaN or inf for examples {bad[:10]}"
                         f"{' ...' if len(bad) > 10 else ''}; check those inputs and the model")
    return out.reshape(out.shape[0], -1) if flat else out


def _autocast_on(kind: str) -> bool:
    """Whether the caller's torch.autocast is on for device type ``kind``."""
    try:
        return torch.is_autocast_enabled(kind)
    except RuntimeError:   # a device type autocast does not know (meta)
        return False


def _autocast_made(model, batch: torch.Tensor, kind: str) -> bool:
    """Whether the model returns the batch's dtype outside the caller's autocast (one more forward, on the way to
    a refusal): else the half features are the model's own cast, and leaving the autocast would not help."""
    try:
        with torch.autocast(kind, enabled=False), torch.no_grad():
            out = model(batch)
    except Exception:
        return False
    return isinstance(out, torch.Tensor) and out.dtype == batch.dtype


#: Held by every public entry point for its whole call: the calls switch process-wide torch settings
#: (TF32) and the model's training flag, so calls from several threads run one at a time.
_ONE_CALL = threading.RLock()


def _new_lock_in_child() -> None:
    """A forked child starts with its own _ONE_CALL: one held by another of the parent's threads at the fork (a
    multiprocessing 'fork' pool made while a call ran) is owned by a thread the child does not have, and every
    call in the child waited for it forever."""
    global _ONE_CALL
    _ONE_CALL = threading.RLock()
    _CALLS.kept = []   # (the forking thread's calls, were it inside one: the child's next call is an outer one)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


@contextlib.contextmanager
def entry_point(model, device, *, tf32: bool = False):
    """What every public entry point runs in: :func:`model_kept` (one call at a time in the process, the model in
    eval mode, its buffers given back as they were on entry), the solver on its stream, and IEEE float32 matmuls
    and convolutions unless ``tf32``."""
    from hcrfast.bindings import ieee_float32, solver_stream

    kind = getattr(device, "type", None) or torch.device(device).type
    if _autocast_on(kind):   # the caller's own: hcrfast leaves it on, as the model may rely on it
        warn(f"hcrfast was called under torch.autocast ({kind}, {str(torch.get_autocast_dtype(kind))[6:]}): the "
             f"model's float32 passes run in that dtype inside it, which steers the solver's steps (a mode's bound "
             f"moved 3.6x under bfloat16 in a test) and can break the dense solve's torch.func; the bounds are still "
             f"certified by the float64 passes, which autocast does not cast. Call hcrfast outside the autocast "
             f"region (or inside torch.autocast({kind!r}, enabled=False))")
    from hcrfast.algorithm import pieces_scope

    _import_leaving_filters()
    with (_ONE_CALL, torch.inference_mode(False), model_kept(model), _guards_named(model), solver_stream(device),
          ieee_float32(not tf32), pieces_scope()):
        yield


def _import_leaving_filters() -> None:
    """Import SymPy, if torch has not yet, with the filter its import adds to :data:`warnings.filters` taken out
    again: torch imports it lazily, at a process's first ``torch.autograd.grad`` (``torch.fx.experimental.
    symbolic_shapes``) or ``torch.func`` transform, and SymPy's import adds one (``once``,
    ``SymPyDeprecationWarning``) that hcrfast's first call left in the caller's list. Imported here, before the
    call's first gradient, torch finds it loaded and its use of it is unchanged; SymPy's deprecation warnings are
    then shown as Python's defaults say (ignored outside ``__main__``), not once each.

    Only SymPy's own filters are taken out (their category is SymPy's), in place: a filter another thread adds
    meanwhile stays (``warnings.catch_warnings`` would have put back a copy of the list taken before, without it).
    An import interrupted (Ctrl-C) takes its half-imported modules out of ``sys.modules``: left there, every later
    gradient of the process failed on ``sympy.logic``. (SciPy's sparse package, whose import adds a filter too, is
    imported with hcrfast itself: its filter is the import's, as SciPy means it, not a call's.)"""
    if "sympy" in sys.modules:
        return
    before = list(warnings.filters)
    try:
        import sympy  # noqa: F401
    except ImportError:   # (torch's own import of it would fail the same way, where it needs it)
        return
    except BaseException:
        for name in [m for m in sys.modules if m == "sympy" or m.startswith("sympy.")]:
            del sys.modules[name]
        raise
    added = [f for f in warnings.filters if f not in before and "sympy" in getattr(f[2], "__module__", "")]
    for item in added:
        warnings.filters.remove(item)
    if added:
        getattr(warnings, "_filters_mutated", lambda: None)()   # (the module's cache of filter decisions)


#: The models (their :func:`_kept_key`) of the hcrfast calls this thread is inside, outermost first
#: (:func:`model_kept`, :func:`nested`).
_CALLS = threading.local()


def _kept_key(model) -> int:
    """What tells two calls on the same model apart from calls on others: the Module kept (:func:`module_of`),
    or the callable itself."""
    owner = module_of(model.model if getattr(model, "wraps_user_model", False) else model)
    return id(owner if owner is not None else model)


def nested(model) -> bool:
    """Whether this thread is inside another hcrfast call on the same ``model`` (this call's :func:`model_kept`
    opened inside it): ``hcrfast.bound(targets=...)`` calls the public ``targeted_bound`` once per chunk, inside its
    own call, which keeps the model's buffers and checks that the model stayed the same function for the whole call
    already. A call on another model made from inside one (a user's metric that calls hcrfast) is not nested."""
    return _kept_key(model) in getattr(_CALLS, "kept", [])[:-1]


@contextlib.contextmanager
def model_kept(model, name: str = "model"):
    """What hcrfast runs a user's model in, entry points and the helpers that run it outside them
    (``dithered_accuracy``, ``sigma_for``'s own sigma0): one call at a time in the process (:data:`_ONE_CALL`),
    the model in eval mode (:func:`eval_mode`; ``name``: what its warning calls it), and its buffers as they were on
    entry on exit, also on error (:func:`_buffers_kept`). Opened inside another (:func:`nested`), it leaves the
    buffers to the outer one, which gives them back at the end of the whole call: one copy of them per call, not
    one per chunk. The caller's torch random number generators are not touched: a model that draws from them
    moves them as any call of it would (forking them rewound the process-wide generator on exit, under another
    thread that drew from it meanwhile: its draws came again)."""
    with _ONE_CALL:
        if not hasattr(_CALLS, "kept"):
            _CALLS.kept = []
        key = _kept_key(model)
        outer = key not in _CALLS.kept   # (an inner call on another model keeps that one's buffers itself)
        _CALLS.kept.append(key)
        try:
            with _buffers_kept(model, keep=outer), eval_mode(model, name, keep_buffers=outer):
                yield
        finally:
            _CALLS.kept.pop()


#: :func:`_buffers_kept`: the copies of the model's buffers that stay on their own device, in bytes, in all
#: (beyond it, the largest buffers are copied to host memory: a GPU run keeps its memory for the solve).
BUFFER_COPIES_ON_DEVICE = 64 * 2 ** 20


def module_of(model):
    """The Module whose training flags and buffers hcrfast keeps for ``model``: the model, or the Module of a bound
    method (``hcrfast.bound(m.forward, ...)``, ``m.encode``: called directly, never through ``Module.__call__``,
    where :func:`_modules_met_in_eval_mode`'s hook would see it); None for another callable."""
    if inspect.ismethod(model) and isinstance(model.__self__, torch.nn.Module):
        return model.__self__
    return model if isinstance(model, torch.nn.Module) else None


@contextlib.contextmanager
def _buffers_kept(model, keep: bool = True):
    """The buffers of the model's Module (:func:`module_of`; for ``noise.PerFeatureStd``, its own and those of the
    user's model inside it) as they were on entry, on exit (also on error; ``keep=False``: nothing done). A forward
    that counts its calls in a buffer ended a bound call with 12 in it (also a refused call). Those of a callable
    that is not a Module are kept as its modules are met (:func:`_modules_met_in_eval_mode`).

    Buffers: a copy of each on entry (under no_grad); on exit, each buffer changed in place (its version counter
    moved, or its values differ: BatchNorm's kernel moves no counter) gets its values back, and each one replaced
    (``self.calls = self.calls + 1``) gets its original tensor back; unchanged buffers are not written (their
    version counters stay as they were; one holding NaN compares unequal and is written). Cost: one copy of the
    model's buffers for the call (parameters are not copied), and the time of a copy and a comparison of each.
    Measured with torchvision's models: ResNet-18 0.04 MB of buffers (against 47 MB of parameters), ResNet-50 0.21 MB,
    DenseNet-121 0.34 MB, ViT-B/16 none; 50 BatchNorm2d(512) (150 buffers) 7.5 ms a call on the CPU.
    Up to :data:`BUFFER_COPIES_ON_DEVICE` in all they stay on their device; the largest buffers beyond it are
    copied to host memory (a transfer each way only for those), so huge buffers cost host memory, not the GPU's."""
    saved = _buffer_copies(model) if keep else []
    try:
        yield
    finally:
        _restore_buffers(saved)


def _owned_buffers(model) -> list:
    """``(module, label, name, tensor)`` for each buffer of the Module of ``model`` (:func:`module_of`; for a wrapper
    of the user's model, ``noise.PerFeatureStd``, its own and those of the model inside it), ``label`` its path."""
    roots = [module_of(model)]
    if getattr(model, "wraps_user_model", False):
        roots.append(module_of(user_model(model)))
    owned, seen = [], set()
    for root in roots:
        if root is None:
            continue
        try:
            modules = list(root.named_modules())
        except (AttributeError, RuntimeError):   # frozen TorchScript modules list no submodules
            modules = [("", root)]
        for prefix, module in modules:
            if id(module) in seen:
                continue
            seen.add(id(module))
            owned += [(module, f"{prefix}.{name}" if prefix else name, name, tensor)
                      for name, tensor in _own_buffers(module)]
    return owned


def _own_buffers(module) -> list:
    """``(name, tensor)`` for each buffer ``module`` holds itself (not its submodules')."""
    try:
        items = list(module._buffers.items())
    except AttributeError:   # (TorchScript's modules keep theirs elsewhere)
        items = list(module.named_buffers(recurse=False))
    return [(name, tensor) for name, tensor in items
            if isinstance(tensor, torch.Tensor) and not isinstance(tensor, torch.nn.parameter.UninitializedBuffer)]


def _buffer_copies(model) -> list:
    """``(module, label, name, tensor, version, copy)`` for each buffer of ``model`` (:func:`_buffers_kept`)."""
    return _copies(_owned_buffers(model))


def _copies(owned) -> list:
    """``(module, label, name, tensor, version, copy)`` for each ``(module, label, name, tensor)`` of ``owned``, the
    smallest first, kept on their device up to :data:`BUFFER_COPIES_ON_DEVICE` in all. ``version`` is None for an
    inference tensor (made under torch.inference_mode: it has no version counter, and reading it raises), whose
    values alone tell whether it changed."""
    on_device, saved = 0, []
    with torch.no_grad():
        for module, label, name, tensor in sorted(owned, key=lambda o: _nbytes(o[3])):
            size = _nbytes(tensor)
            keep_here = tensor.device.type == "cpu" or on_device + size <= BUFFER_COPIES_ON_DEVICE
            on_device += size if keep_here and tensor.device.type != "cpu" else 0
            saved.append((module, label, name, tensor, None if tensor.is_inference() else tensor._version,
                          tensor.clone() if keep_here else tensor.to("cpu", copy=True)))
    return saved


def _nbytes(tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` holds: a sparse tensor's indices and values (its numel() is its dense size)."""
    if tensor.layout == torch.strided:
        return tensor.numel() * tensor.element_size()
    parts = _sparse_parts(tensor)
    return sum(t.numel() * t.element_size() for t in parts) if parts else tensor.numel() * tensor.element_size()


def _sparse_parts(tensor: torch.Tensor):
    """The index and value tensors of a sparse tensor, as stored (coalescing would make new ones); None for another
    layout."""
    if tensor.layout == torch.sparse_coo:
        return tensor._indices(), tensor._values()
    if tensor.layout in (torch.sparse_csr, torch.sparse_bsr):
        return tensor.crow_indices(), tensor.col_indices(), tensor.values()
    if tensor.layout in (torch.sparse_csc, torch.sparse_bsc):
        return tensor.ccol_indices(), tensor.row_indices(), tensor.values()
    return None


def _same_values(tensor: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether ``tensor`` holds ``values`` (a copy of it, maybe on another device), for any layout: torch.equal
    takes strided tensors only (a sparse buffer, a GCN's normalized adjacency, raised NotImplementedError), so the
    sparse layouts compare their index and value tensors; another layout is reported changed (written back)."""
    values = values.to(tensor.device)
    if tensor.layout != values.layout or tensor.shape != values.shape or tensor.dtype != values.dtype:
        return False
    if tensor.layout == torch.strided:
        return _equal_or_both_nan(tensor, values)
    mine, theirs = _sparse_parts(tensor), _sparse_parts(values)
    return mine is not None and all(a.shape == b.shape and _equal_or_both_nan(a, b) for a, b in zip(mine, theirs))


def _equal_or_both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal, with NaN equal to NaN: a buffer holding NaN that nothing wrote was taken for changed at every
    call, and written back (an expanded one, of stride 0, could not be: warned of at every call)."""
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b]))


def _restore_buffers(saved: list) -> None:
    """Each buffer of ``saved`` (:func:`_copies`) as it was: its values written back where they changed, the tensor
    put back where it was replaced. A buffer that cannot be restored is warned about, naming it: this runs at the
    end of a call (also a failed one), whose result, or error, it must not replace."""
    for module, label, name, tensor, version, values in saved:
        try:
            # (torch's batch_norm updates its running statistics without moving their version counters: compared)
            if (version is not None and tensor._version != version) or not _same_values(tensor, values):
                with torch.no_grad(), torch.inference_mode(tensor.is_inference()):
                    tensor.copy_(values)
            current = getattr(module, name, None)
            if not (current is tensor or (isinstance(current, torch.Tensor) and current.layout == tensor.layout
                                          and current.layout == torch.strided and current.shape == tensor.shape
                                          and current.dtype == tensor.dtype and current.device == tensor.device
                                          and current.data_ptr() == tensor.data_ptr())):
                setattr(module, name, tensor)   # replaced: the tensor it held on entry (TorchScript's wrappers differ)
        except Exception as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            warn(f"hcrfast could not give the model's buffer {label!r} ({tuple(tensor.shape)}, {tensor.layout}) back "
                 f"as it was on entry ({type(exc).__name__}: {text[:200]}): if the model's forward changes it, it may "
                 f"hold what the call's forwards left there; reset it yourself if it matters")


@contextlib.contextmanager
def _guards_named(model):
    """A note on torch.export's guard failures (an AssertionError "Guard failed: input.size()[0] == 3"): hcrfast runs
    the model on other batch sizes than the batch's, which an exported program's shape guards refuse unless its
    batch axis was exported as dynamic, and without bounds that the chunks pass."""
    try:
        yield
    except AssertionError as exc:
        if "Guard failed" in str(exc) and _exported(model) and hasattr(exc, "add_note"):
            exc.add_note("hcrfast: the model is an exported program (torch.export) whose shape guards refuse this "
                         "input: hcrfast runs it on other batch sizes than the batch's (single examples, chunks, each "
                         "example's restarts stacked); export it with a dynamic batch axis and no upper bound, "
                         "dynamic_shapes=({0: torch.export.Dim('batch')},), or pass the original nn.Module")
        raise


def _exported(model) -> bool:
    """Whether ``model`` is, or holds, a module that refuses to switch modes (torch.export's)."""
    try:
        return isinstance(model, torch.nn.Module) and any(_refuses_mode_switch(m) for m in model.modules())
    except (AttributeError, RuntimeError):
        return False


def _frozen_mode_hint(model) -> str:
    """What to add to a refusal of a model whose mode its ``.eval()`` cannot change: TorchScript whose graph runs
    BatchNorm or dropout in training mode (a traced model keeps the mode it was traced in), or torch.export's
    program, frozen in the mode it was exported in; "" otherwise. A scripted model (torch.jit.script) reads its
    modules' flags as it runs, and a model traced after .eval() has eval mode in its graph: nothing to add to their
    refusals, which have reasons of their own (a torch.rand in the forward, a statistic of the batch)."""
    if not isinstance(model, torch.nn.Module):
        return ""
    try:
        modules = list(model.modules())
    except (AttributeError, RuntimeError):
        modules = [model]
    scripts = [m for m in modules if isinstance(m, torch.jit.ScriptModule)]
    frozen = _traced_in_training_mode(scripts) if scripts else False
    if frozen or frozen is None:
        return (f". The model is TorchScript{'' if frozen else ', and if it was traced in training mode'}: a traced "
                f"model (torch.jit.trace, or loaded with torch.jit.load) keeps the mode it was traced in (its graph "
                f"{'runs' if frozen else 'then runs'} BatchNorm or dropout with training=True), and its .eval() does "
                f"not reach it; trace it again after .eval() (torch.jit.trace(model.eval(), example)), or pass the "
                f"original nn.Module")
    if _exported(model):
        return (". The model is an exported program (torch.export), frozen in the mode it was exported in: export it "
                "again after .eval() (torch.export.export(model.eval(), ...)), or pass the original nn.Module")
    return ""


#: :func:`_traced_in_training_mode`: the TorchScript operators whose training flag a trace fixes in its graph, and
#: the position of that flag among their inputs.
_TRAINING_FLAG = {"aten::batch_norm": 5, "aten::native_batch_norm": 5, "aten::_native_batch_norm_legit": 5,
                  "aten::dropout": 2, "aten::dropout_": 2, "aten::feature_dropout": 2, "aten::feature_dropout_": 2,
                  "aten::alpha_dropout": 2, "aten::alpha_dropout_": 2, "aten::feature_alpha_dropout": 2,
                  "aten::feature_alpha_dropout_": 2, "aten::rrelu": 3}


def _traced_in_training_mode(scripts) -> bool | None:
    """Whether the graph of one of the TorchScript modules ``scripts`` runs BatchNorm or dropout with training=True
    fixed in it (a constant: a model traced, or traced and then saved and loaded, in training mode; a scripted
    module reads its flag as it runs); None where a graph cannot be read."""
    unread = False
    for module in scripts:
        try:
            graph = module.inlined_graph
        except Exception:   # (a ScriptModule without a forward, say: its own submodules are in the list too)
            unread = True
            continue
        for node in graph.nodes():
            at = _TRAINING_FLAG.get(node.kind())
            if at is None:
                continue
            flag = list(node.inputs())[at] if at < len(list(node.inputs())) else None
            if flag is not None and flag.node().kind() == "prim::Constant" and flag.toIValue() is True:
                return True
    return None if unread else False


@contextlib.contextmanager
def eval_mode(model, name: str = "model", *, keep_buffers: bool = False):
    """Run in eval mode; a model found in training mode is switched, warned about, and restored
    (``name``: what the warning calls it). A module whose ``eval()`` refuses (torch.export's
    ``ExportedProgram.module()``: its graph is frozen in the mode it was exported in, whatever its flag, which
    reads True) keeps its flags, and so do its submodules; the modules around it are switched by hand. Its
    graph runs as exported: dropout or BatchNorm with batch statistics baked into it is refused by the probes
    (:func:`probe_independent`), naming the fix. A bound method of a Module (``m.forward``) runs with that Module in
    eval mode (:func:`module_of`); another callable's modules, and those a bound method calls outside its Module,
    are switched as they are called (:func:`_modules_met_in_eval_mode`, which with ``keep_buffers`` gives their
    buffers back too). A Module's calls to modules outside its own tree are not: a global hook for every Module
    call (tried on 2026-12-01) switched and restored a BatchNorm that another thread was training, cost up to 1.4x
    on models of many small modules, made torch.compile warn of global hooks at every call, and ran modules created
    inside the forward (a fresh Dropout each call) in eval mode, bounding a function the user never runs."""
    inner = user_model(model)   # (inside noise.PerFeatureStd, ScaledInputs)
    owner = module_of(inner)
    if owner is not None and owner is not inner:   # a bound method: its Module, and the modules it calls outside it
        with _tree_in_eval_mode(owner, name), _modules_met_in_eval_mode(name, keep_buffers=keep_buffers, kept=owner):
            yield model
        return
    if owner is None and callable(inner):
        with _modules_met_in_eval_mode(name, keep_buffers=keep_buffers, kept=module_of(model)):
            yield model
        return
    with _tree_in_eval_mode(model, name):
        yield model


@contextlib.contextmanager
def _tree_in_eval_mode(model, name: str):
    """The modules of the Module ``model`` in eval mode, those in training mode warned about, every flag restored on
    exit (:func:`eval_mode`), also those of a model entered in eval mode: a forward that calls ``self.train()`` left
    it in training mode after the call."""
    try:   # a submodule may have been left in eval mode on purpose
        flags = [(m, m.training) for m in model.modules()]
    except (AttributeError, RuntimeError):   # frozen TorchScript modules list no submodules
        flags = []
    training = _in_training_mode(model)
    if not training:
        try:
            yield
        finally:
            for m, flag in flags:
                if m.training != flag:
                    m.training = flag
        return
    try:   # every flag restored however the call ends: a warning raised as an error (-W error) included
        try:
            model.eval()
        except NotImplementedError:   # "Calling eval() is not supported yet." (or train(), from a submodule's)
            for m, flag in flags:
                m.training = flag
            training = _eval_around_frozen(model)
        if training and _mode_matters(model, training):   # said once the switch is done: a switch that failed
            # warned of one it never made; a tree whose modules compute the same in both modes is switched unsaid
            which = (f"the {name} was" if training[0] == "" else f"the {name}'s submodule {training[0]} was"
                     if len(training) == 1 else f"{len(training)} of the {name}'s submodules "
                     f"({', '.join(training[:4])}{', ...' if len(training) > 4 else ''}) were")
            warn(f"{which} in training mode ({_class_name(model)}); hcrfast switched the {name} to eval mode for "
                 f"this call (BatchNorm with running statistics, no dropout) and restores it afterwards. "
                 f"Call {name}.eval() first to silence this.")
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def user_model(model):
    """The user's model inside hcrfast's own wrappers (``wraps_user_model``: noise.PerFeatureStd, one std per
    feature or a σ far from 1; noise.ScaledInputs, inputs far from 1), any number deep; ``model`` itself if none."""
    while getattr(model, "wraps_user_model", False):
        model = model.model
    return model


def _class_name(model) -> str:
    """The model's class, as a warning names it: Python shows a warning once per text and line, so a second
    model of another class met at the same line is still warned about."""
    return type(user_model(model)).__qualname__


def _refuses_mode_switch(module) -> bool:
    """A module whose ``train``/``eval`` is replaced on the instance (torch.export's ``ExportedProgram.module()``,
    whose two raise NotImplementedError): frozen in the mode it was made in."""
    return "train" in vars(module) or "eval" in vars(module)


def _eval_around_frozen(model) -> list[str]:
    """Where ``model.eval()`` refused: the training flag of each module cleared by hand, but for the modules that
    refuse the switch (:func:`_refuses_mode_switch`) and theirs, left as they are; the names of those cleared
    that were in training mode. The caller restores every flag."""
    switched = []

    def visit(prefix, module):
        if _refuses_mode_switch(module):
            return
        if module.training:
            switched.append(prefix)
            module.training = False
        for child_name, child in module.named_children():
            visit(f"{prefix}.{child_name}" if prefix else child_name, child)

    visit("", model)
    return switched


@contextlib.contextmanager
def _modules_met_in_eval_mode(name: str, *, keep_buffers: bool = False, kept=None):
    """:func:`eval_mode` for the modules a model calls that :func:`eval_mode` cannot list: those of a callable that
    is not a Module (a closure, a lambda, a bound method); never those of ``kept`` (a bound method's Module or
    ``noise.PerFeatureStd``, whose modes are switched, and buffers kept, already). Each module in training mode that this thread calls while the context is open is switched to eval
    mode as its forward starts (a global forward pre-hook) and restored on exit, with a warning naming them; one
    that refuses the switch
    (:func:`_refuses_mode_switch`, torch.export's) keeps its flags, and so do its submodules. A closure over a
    BatchNorm in training mode had its running statistics updated by hcrfast's first forward, before the batch
    probe refused the model. With ``keep_buffers``, the
    buffers of each module met (and of its submodules) are copied as it is first called, before its forward runs,
    and given back on exit as :func:`_buffers_kept` gives a Module's (a closure over a module that counts its calls
    in a buffer ended a call with 18 there).

    Cost: every module call while it is open goes through the hook (torch's slower path for hooked calls, then a
    set lookup), about 1 µs a module call on the CPU (67 Identity modules: 40 µs a forward without, 108 µs with;
    ad hoc, 2026-12-01)."""
    thread, met, seen, saved, known, frozen = threading.get_ident(), {}, set(), [], set(), set()
    own = set()   # (the modules of kept: their modes switched, and their buffers kept, already)
    if kept is not None:
        try:
            tree_modules = list(kept.modules())
        except (AttributeError, RuntimeError):   # frozen TorchScript modules list no submodules
            tree_modules = [kept]
        own.update(id(m) for m in tree_modules)
        seen.update(own)

    def keep(module):
        try:
            modules = list(module.named_modules())
        except (AttributeError, RuntimeError):   # frozen TorchScript modules list no submodules
            modules = [("", module)]
        owned = []
        for prefix, sub in modules:
            if id(sub) not in seen:
                seen.add(id(sub))
                label = type(module).__name__ + (f".{prefix}" if prefix else "")
                owned += [(sub, f"{label}.{buffer}", buffer, tensor) for buffer, tensor in _own_buffers(sub)]
        saved.extend(_copies(owned))

    def pre_hook(module, args):
        if id(module) in own or threading.get_ident() != thread:
            return
        if keep_buffers and id(module) not in seen:
            keep(module)
        if id(module) not in known:   # first met: one that refuses the switch keeps its mode, and its submodules too
            known.add(id(module))
            if _refuses_mode_switch(module):
                try:
                    frozen.update(id(m) for m in module.modules())
                except (AttributeError, RuntimeError):   # (frozen TorchScript)
                    frozen.add(id(module))
        if getattr(module, "training", False) and id(module) not in frozen:   # (frozen TorchScript has none)
            met.setdefault(id(module), (module, True))
            module.training = False

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    try:
        yield
    finally:
        handle.remove()
        for module, flag in met.values():
            module.training = flag
        _restore_buffers(saved)
        if any(_reads_training_flag(type(module)) for module, _ in met.values()):
            kinds = sorted({type(module).__name__ for module, _ in met.values()})
            warn(f"the {name} (a callable, not a Module) calls {len(met)} module(s) in training mode "
                 f"({', '.join(kinds[:6])}{', ...' if len(kinds) > 6 else ''}); hcrfast switched each to eval mode "
                 f"as it was called (BatchNorm with running statistics, no dropout) and restored them afterwards. "
                 f"Call .eval() on the modules it uses first to silence this.")


def _mode_matters(model, names: list[str]) -> bool:
    """Whether any of the modules of ``model`` named ``names`` (:func:`_in_training_mode`'s) may compute otherwise in
    training mode (:func:`_reads_training_flag`): a fresh ``nn.Linear`` head, or a Sequential of Linear and ReLU,
    computes the same in both modes, and its switch is nothing to warn about."""
    inner = user_model(model)
    try:
        modules = dict(inner.named_modules())
    except (AttributeError, RuntimeError):   # frozen TorchScript modules list no submodules
        return True
    return any(name not in modules or _reads_training_flag(type(modules[name])) for name in names)


@functools.lru_cache(maxsize=None)
def _reads_training_flag(cls) -> bool:
    """Whether a module of class ``cls`` may read its training flag: its class or a base below ``nn.Module`` names
    ``training`` in its code (``self.training``, ``training=``, ``getattr(self, "training")``,
    ``self.__dict__["training"]``; docstrings aside), hands ``self`` to a function (a helper outside the class may
    read the flag there), or its source cannot be read (a class made in a REPL or by exec, TorchScript's). Dropout,
    BatchNorm, InstanceNorm, the RNNs and MultiheadAttention do; Linear, the convolutions, pooling, activations,
    LayerNorm and the containers do not. A user's class counts by its own code, helper methods included."""
    for base in cls.__mro__:
        if base in (torch.nn.Module, object):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            return True
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "training"
                    or isinstance(node, ast.Name) and node.id == "training"
                    or isinstance(node, ast.keyword) and node.arg == "training"
                    or isinstance(node, ast.Constant) and node.value == "training"
                    or isinstance(node, ast.Call) and _hands_self_out(node)):
                return True
    return False


#: Built-ins that take ``self`` without reading its training flag (:func:`_reads_training_flag`; ``getattr(self,
#: "training")`` is seen by its string).
_SELF_SAFE_CALLS = frozenset({"super", "isinstance", "issubclass", "type", "id", "hasattr", "getattr", "setattr",
                              "delattr", "len", "iter", "repr", "str", "hash", "callable", "print", "format", "enumerate",
                              "list", "tuple", "zip", "reversed", "sorted", "chain", "dir", "vars"})


def _hands_self_out(call) -> bool:
    """Whether the call node ``call`` passes ``self`` to a function other than those of :data:`_SELF_SAFE_CALLS`."""
    if isinstance(call.func, ast.Name) and call.func.id in _SELF_SAFE_CALLS:
        return False
    return any(isinstance(a, ast.Name) and a.id == "self" for a in [*call.args, *(k.value for k in call.keywords)])


def _in_training_mode(model) -> list[str]:
    """The names of the modules of ``model`` in training mode ("" for the model itself), root first.
    A submodule in training mode under a model in eval mode counts too: its forwards would update
    running statistics or draw dropout masks."""
    if not isinstance(model, torch.nn.Module):
        return []
    if getattr(model, "wraps_user_model", False):  # noise.PerFeatureStd mirrors its model's flag
        return _in_training_mode(model.model)
    try:
        return [name for name, m in model.named_modules() if getattr(m, "training", False)]
    except (AttributeError, RuntimeError):  # frozen TorchScript modules list no submodules
        return [""] if getattr(model, "training", False) else []


def check_independent(model, batch: torch.Tensor, features: torch.Tensor, *, mode: str = "reverse",
                      rtol: float = 1e-4, tf32: bool = False) -> None:
    """:func:`probe_independent` of the model, in IEEE float32 arithmetic.

    With ``tf32`` (the call lets float32 matmuls and convolutions use TF32) the probe runs in
    IEEE float32 all the same, against features computed that way: it asks how the model
    treats the rows of a batch, not about its arithmetic, and TF32 rounds at ~5e-4 of the
    features, with cuBLAS and cuDNN free to take other kernels for one row than for the
    batch, which the probe would read as examples mixed at its 1e-4 tolerance.
    """
    if not tf32:  # the entry point runs in IEEE float32 already
        return probe_independent(model, batch, features, mode=mode, rtol=rtol)
    from hcrfast.bindings import ieee_float32

    with ieee_float32(True):
        probe_independent(model, batch, features_of(model, batch), mode=mode, rtol=rtol)


#: :func:`check_repeatable`: a gap between two float64 computations of the same features, over the feature
#: shift the bounds rest on (size × the noise's scale), above which D is not that of a function of the input
#: (refused), and above which it may have moved D (warned), as float64's rounding (``hcrfast.algorithm``).
REPEAT_LIMIT = 1e-3
REPEAT_TOLERANCE = 1e-6
#: Gaps up to this share of the norm of an example's rounding scale are float64's rounding (another batch
#: size takes other kernels), not a model that changes: left to the rounding guards, which see shifts that small.
REPEAT_ROUNDING = 2.0 ** -40
#: The examples :func:`check_repeatable` probes, spread evenly over the batch from its first to its last (their
#: forwards hold a few rows, whatever the batch).
REPEAT_ROWS = 8


def noise_shift(noise, size: float) -> float:
    """The feature shift Algorithm 1's steps aim at, ``‖z‖ ≈ size × the law's RMS``: the law's RMS from 4096
    draws of a fixed generator (any law, a user's included)."""
    draws = np.abs(np.asarray(noise.sample(np.random.default_rng(0), (1, 4096)), dtype=np.float64))
    top = float(draws.max())   # (scaled: a law of scale 1e-200 squares to 0)
    return float(size * top * np.sqrt(np.mean((draws / top) ** 2))) if top > 0 else 0.0


def check_repeatable(model64, batch: torch.Tensor, shift: float, *, jacobian: str = "reverse") -> None:
    """Refuse a certifying (float64) model whose features are not a function of each input at the scale the
    bounds need. On :data:`REPEAT_ROWS` examples spread evenly over the batch, its first and last included (a
    probe: the memory of a few rows, whatever the batch), their features computed again, in reverse order and
    one example at a time, against those of the probe batch, by each example's gap, past float64's rounding
    (:data:`REPEAT_ROUNDING` of the norm of its features' rounding scale,
    :func:`hcrfast.algorithm._rounding_magnitude`: ``|a_i|``, or the input-sized terms ``|J(θ⊙r)|_i`` a feature
    may cancel down from, where one row and a batch round differently), over ``shift`` (:func:`noise_shift`):
    above :data:`REPEAT_LIMIT` refused, above :data:`REPEAT_TOLERANCE` warned. :func:`probe_independent`
    checks the model's own dtype at 1e-4 of the features' size, which the noise of a slightly random model
    (2e-5 on features of order 1, against shifts of 1.5e-3) or a faint mix of the batch's examples passed:
    their bounds came out up to 1.066× a deterministic model's."""
    from hcrfast.algorithm import _rounding_magnitude
    from hcrfast.bindings import from_torch, to_torch

    # spread over the batch: a model random or mixing the batch only for some inputs (its later examples, of
    # another class or scale) passed a probe of the first rows
    k, last = min(REPEAT_ROWS, batch.shape[0]), batch.shape[0] - 1
    rows = [i * last // (k - 1) for i in range(k)] if k > 1 else list(range(k))   # distinct: last >= k - 1
    x64 = batch[rows].double()
    with torch.no_grad():
        probe = model64(x64).reshape(k, -1)
        again = model64(x64).reshape(k, -1)
        flipped = model64(x64.flip(0)).reshape(k, -1).flip(0)
        alone = torch.cat([model64(x64[i:i + 1]).reshape(1, -1) for i in range(k)])

    def worst_gap(allowance):
        gaps = {what: ((other - probe).norm(dim=1) - allowance).clamp_min(0).max() for what, other in (
            ("a second call", again), ("the batch in reverse order", flipped), ("each example alone", alone))}
        what, worst = max(gaps.items(), key=lambda kv: float(kv[1]))
        return what, worst, (float(worst) / shift if shift > 0 else (math.inf if float(worst) > 0 else 0.0))

    # the features' own norm first (|a_i| <= m_i: a smaller allowance); the rounding scale's JVP only if needed
    what, worst, ratio = worst_gap(REPEAT_ROUNDING * probe.norm(dim=1))
    if ratio > REPEAT_TOLERANCE:
        scale = to_torch(_rounding_magnitude(model64, x64, from_torch(probe), jacobian)).reshape(k, -1)
        what, worst, ratio = worst_gap(REPEAT_ROUNDING * scale.norm(dim=1))
    if not ratio > REPEAT_TOLERANCE:   # (NaN features are refused elsewhere)
        return
    text = (f"the float64 model's features of one example differ by up to {float(worst):.3g} (norm, past float64's "
            f"rounding) between a batch of {k} examples and {what}, {ratio:.3g} of the feature shifts the bounds "
            f"rest on (size x the noise's scale = {shift:.3g})")
    if ratio > REPEAT_LIMIT:
        raise ValueError(f"{text}: the features are not a fixed function of each input (a forward that draws random "
                         f"numbers, updates its own state, or mixes the examples of a batch, or a float32 step inside "
                         f"the float64 copy), so D(z) would carry that change and the bounds would not be rigorous; "
                         f"make the forward deterministic, stateless, example by example and in its input's dtype")
    warn(f"{text}: D may carry that change, and the bounds with it, by about {2 * ratio:.2g} (relative); make the "
         f"forward deterministic, stateless, example by example and in its input's dtype")


def _finite_in_float64(model, probe: torch.Tensor, tangent: torch.Tensor, mode: str) -> bool:
    """Whether example 0's J v, inf in the model's dtype, is finite from a float64 copy (an overflow, not an
    infinite derivative such as sqrt's at 0). False where no copy can be made or run."""
    from hcrfast.bindings import TorchJacobian, from_torch, to_torch

    try:
        with warnings_ignored((None, Warning)):
            model64 = copy.deepcopy(model).double()
        jv = to_torch(TorchJacobian(model64, probe[:1].double(), mode=mode).matvec(
            from_torch(tangent[:1].double().reshape(1, -1))))
    except Exception:   # a plain function, a cast inside the forward: say what the dtype's J v says
        return False
    return bool(torch.isfinite(jv).all())


#: :func:`_missed_by_jv`: the central differences' step h, relative to example 0's RMS over the tangent's. Small
#: enough that a ReLU kink is rarely crossed (a pre-activation within ~1e-6 of its scale from 0), large enough that
#: float64's rounding (~1e-16 of the features) stays ~1e-10 of a derivative of the features' own size.
FD_STEP = 2.0 ** -20
#: A feature's difference counts only above this share of the largest feature: float64's rounding, deep inside a
#: model, is ~1e-14 of it (a flat model's differences are rounding, not a dependence), and stays below
#: :data:`FD_SMOOTH` of any difference above this.
FD_FLOOR = 2.0 ** -32
#: J v misses a feature that moves when ``2 h |J v_j|`` is below this share of its difference: far below a float32
#: J v's rounding (~1e-7 of ‖J v‖) on any feature that carries a real share of the differences.
FD_MISSED = 1e-2
#: Where a feature is smooth over the step, its one-sided differences (x to x + h v, x − h v to x) agree, and its
#: difference over h/2 is half that over h, to ~h of it; a kink or a jump inside the step (ReLU, max-pool, a
#: straight-through rounding or fake quantization, whose J v is not 0 where the features stand still) breaks one or
#: the other by far more than this share: such features are not counted as missed. (Tested: with one-sided
#: agreement alone, at 2^-4 or 2^-6, a 4-layer CNN with straight-through fake quantization of its activations
#: (steps 1e-2 to 1e-5) was warned about on up to 16 inputs of 60 per step, its crossed steps summing to a
#: smooth-looking difference on a few features; with both tests, on none of 240 at 2^-6 and none of 160 here.)
FD_SMOOTH = 2.0 ** -8
#: The share of ``‖f(x + h v) − f(x − h v)‖²`` (over the features that move, :data:`FD_FLOOR`) that the missed
#: features must hold to be warned about: not one feature near a kink among many.
FD_SHARE = 0.1


def _missed_by_jv(model, probe: torch.Tensor, tangent: torch.Tensor, jv0: torch.Tensor):
    """``(count, share)``: how many features of example 0 move along ``tangent[0]`` but not by J v (``jv0``), and
    their share of ``‖d‖²`` (``(0, 0.0)``: none); None where the check cannot run (a plain function, a model that
    cannot be copied to float64, or whose copy fails, returns another dtype or non-finite features).

    Central differences in float64 (a copy of the model unless it is float64 already), in one forward of the five
    rows ``x + t h v``, ``t = −1, −1/2, 0, 1/2, 1``, with ``h =`` :data:`FD_STEP` × RMS(x) / RMS(v):
    ``d = f(x + h v) − f(x − h v) ≈ 2 h J v``. Feature j is missed where ``|d_j| >`` :data:`FD_FLOOR` × max|f|,
    ``2 h |J v_j| <`` :data:`FD_MISSED` × ``|d_j|``, and it is smooth over the step (:data:`FD_SMOOTH`). A
    .detach(), torch.no_grad() section or NumPy round trip on part of the path from input to features is constant
    to both of autograd's modes, so their adjoint check passes; the differences see it. A straight-through
    estimator (J v ≠ 0, d = 0) is not missed.
    """
    if not isinstance(model, torch.nn.Module):
        return None
    x, v = probe[:1].detach().double(), tangent[:1].detach().double()
    try:
        with warnings_ignored((None, Warning)):   # the copy's and its forward's, said already by the model's own
            model64 = model if probe.dtype == torch.float64 else copy.deepcopy(model).double()
            x_rms = scaled_norm(x) / math.sqrt(x.numel())
            h = FD_STEP * (x_rms if x_rms > 0 else 1.0) / (scaled_norm(v) / math.sqrt(v.numel()))
            with torch.no_grad():
                out = model64(torch.cat([x + t * h * v for t in (-1.0, -0.5, 0.0, 0.5, 1.0)]))
    except Exception:   # (the float64 certification names what fails, where it is asked for)
        return None
    if (not isinstance(out, torch.Tensor) or out.dtype != torch.float64 or out.shape[0] != 5
            or out[0].numel() != jv0.numel() or not bool(torch.isfinite(out).all())):
        return None
    low, low_half, mid, high_half, high = out.detach().reshape(5, -1)
    d = high - low
    tolerance = FD_SMOOTH * d.abs()
    smooth = (((high - mid) - (mid - low)).abs() <= tolerance) & ((d - 2 * (high_half - low_half)).abs() <= tolerance)
    moves = d.abs() > FD_FLOOR * out.abs().max()
    missed = moves & smooth & (2 * h * jv0.detach().double().reshape(-1).abs() < FD_MISSED * d.abs())
    if not bool(missed.any()):
        return 0, 0.0
    top = float(d.abs().max())   # (scaled: differences of 1e-200 square to 0)
    share = float(((d[missed] / top) ** 2).sum() / ((d[moves] / top) ** 2).sum())
    return int(missed.sum()), share


def _ignores_its_input(model, probe: torch.Tensor) -> bool:
    """Whether ``model``'s features of ``probe`` stay exactly as they are under a few random steps of the inputs,
    of 1e-3 to 1e-1 of their RMS (or absolute, for inputs of 0): a model that never reads its input (a forward on
    torch.zeros_like(x)), told apart from one whose path to the features autograd cannot follow (.detach())."""
    try:
        with torch.no_grad():
            x = probe[:1]
            base = model(x)
            gen = torch.Generator(device="cpu").manual_seed(0)
            rms = float(x.double().pow(2).mean().sqrt()) or 1.0
            for size in (1e-3, 1e-2, 1e-1):
                step = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device, x.dtype) * (size * rms)
                if not torch.equal(model(x + step), base):
                    return False
        return True
    except Exception:   # (the model's own failure on the steps: not this question's to answer)
        return False


def probe_forward(fn, batch: torch.Tensor, outputs: torch.Tensor, *, name: str, why: str,
                  rtol: float = 1e-4) -> None:
    """Refuse ``fn`` (a model or a head that is only run forward: :func:`hcrfast.dithered_accuracy`'s) whose
    ``outputs`` for ``batch`` are not those of a fixed function of each example: the first two probes of
    :func:`probe_independent`, with no derivative, on a few rows (0, 1, 2 and the last): those rows as a batch of
    their own twice (the same outputs, else it draws random numbers or changes its state), and each alone (its
    outputs in the whole batch, else it mixes the examples). ``name`` names ``fn`` in the refusal, ``why`` says
    what such outputs would spoil. ``rtol`` is relative to the largest output, and at least 4 ulps of their dtype;
    outputs that are not floating point (class labels) must match to within that of their largest."""
    B = batch.shape[0]
    rows = sorted({0, 1, 2, B - 1} & set(range(B)))
    dtype = outputs.dtype if outputs.is_floating_point() else torch.float32
    kind = batch.device.type
    if _autocast_on(kind) and dtype != torch.float64:
        # (float32 arithmetic runs in autocast's dtype, where one row alone rounds apart from the batch at its eps;
        # autocast leaves float64 as it is)
        dtype = max(dtype, torch.get_autocast_dtype(kind), key=lambda t: torch.finfo(t).eps)
    rtol = max(rtol, 4 * torch.finfo(dtype).eps)
    want = outputs.detach().reshape(B, -1)[rows].double()
    finite = torch.isfinite(want)
    scale = float(want[finite].abs().max()) if bool(finite.any()) else 0.0
    scale = max(scale, torch.finfo(torch.float64).tiny)

    def gap(got, against=want) -> float:
        """The largest difference over the finite outputs, relative to ``scale``; inf where the shapes or the
        places and values of the non-finite outputs (a log-probability's -inf) differ."""
        if not isinstance(got, torch.Tensor) or got.numel() != against.numel():
            return math.inf
        got = got.detach().reshape(against.shape).double()
        here = torch.isfinite(against)
        if not torch.equal(torch.isfinite(got), here) or not torch.equal(torch.nan_to_num(got[~here]),
                                                                         torch.nan_to_num(against[~here])):
            return math.inf
        return float((got[here] - against[here]).abs().max()) / scale if bool(here.any()) else 0.0

    with torch.no_grad():
        part = batch[rows]
        first, second = fn(part.clone()), fn(part.clone())
        try:
            alone = _joined([fn(batch[i:i + 1].clone()).reshape(1, -1) for i in rows], batch.device.type)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "more than 1 value per channel when training" in said and _batch_statistics_hint(fn):
                raise ValueError(f"the {name} ran on {B} examples but fails on one alone ({said}): a BatchNorm of it "
                                 f"normalizes with the batch's statistics, so {why}{_batch_statistics_hint(fn)}") \
                    from exc
            raise ValueError(f"the {name} ran on {B} examples but fails on one alone ({said}); it is run on batches "
                             f"of other sizes, so its forward must take any batch size (a BatchNorm with the "
                             f"batch's statistics needs more than one; reshape with x.flatten(1), not a fixed "
                             f"batch size)") from exc
    moved = gap(second, first.detach().double()) if isinstance(first, torch.Tensor) else math.inf
    if moved > rtol:
        raise ValueError(f"the {name} gives other outputs for the same inputs at each call (relative change "
                         f"{moved:.2e} between two calls): it draws random numbers (dropout called with "
                         f"training=True, torch.randn/rand or a random augmentation in its forward) or updates "
                         f"its own state as it runs, so {why}: make its forward deterministic and stateless"
                         + _frozen_mode_hint(fn))
    mixed = max(gap(first), gap(alone))
    if mixed > rtol:
        raise ValueError(f"the {name} mixes the examples of a batch (the outputs of one depend on the others: relative "
                         f"change {mixed:.2e} between a few examples in the whole batch, as a batch of their own and "
                         f"alone), so {why}: use BatchNorm in eval mode with running statistics and no attention "
                         f"or normalization across the batch axis" + _batch_statistics_hint(fn) + _frozen_mode_hint(fn))


def _joined(pieces, kind: str) -> torch.Tensor:
    """``torch.cat(pieces)`` outside the caller's autocast: under a CPU autocast to bfloat16, cat of float16
    pieces raises ("Unexpected floating ScalarType in at::autocast::prioritize"), which the probes read as a
    model that fails on one example alone."""
    with torch.autocast(kind, enabled=False) if _autocast_on(kind) else contextlib.nullcontext():
        return torch.cat(pieces)


def _batch_statistics_hint(model) -> str:
    """Where ``model`` holds BatchNorm modules that normalize with the batch's statistics even in eval mode
    (``track_running_stats=False``), what a refusal of mixed examples adds: their names and the fix."""
    names = []
    if isinstance(model, torch.nn.Module):
        try:
            names = [f"{n} ({type(m).__name__})" if n else type(m).__name__ for n, m in model.named_modules()
                     if isinstance(m, torch.nn.modules.batchnorm._NormBase) and not m.track_running_stats]
        except (AttributeError, RuntimeError):
            names = []
    if not names:
        return ""
    return (f". Its {', '.join(names[:4])}{' ...' if len(names) > 4 else ''} "
            f"{'has' if len(names) == 1 else 'have'} track_running_stats=False, which normalizes with the batch's "
            f"statistics in eval mode too: train with running statistics, or use GroupNorm or LayerNorm")


def probe_independent(model, batch: torch.Tensor, features: torch.Tensor, *, mode: str = "reverse",
                      rtol: float = 1e-4) -> None:
    """Refuse models that mix the examples of a batch, are random, or whose Jacobian products
    cannot be computed the way :func:`hcrfast.bound` will compute them (``mode``).

    Cheap probes: (1) a second forward of the batch gives the same features (else the model is
    random); (2) examples 0, 1, 2 and the last, each alone, give their features in the batch;
    (3) a JVP whose tangent is non-zero on example 0 only leaves the other rows of the first
    three unchanged; (4) that JVP is finite and adjoint to reverse mode's VJP (forward mode: no
    no_grad section that only one mode sees; reverse mode: the derivative of the backward is
    right). BatchNorm with batch statistics, attention across the batch or a statistic of the batch
    fail (2) or (3). (5) Warned, not refused: float64 finite differences of example 0 along the same
    tangent move features that J v says do not (:func:`_missed_by_jv`): a .detach(), torch.no_grad()
    section or NumPy round trip on part of the path, constant to both modes, which (4) cannot see.
    ``rtol`` is relative to the largest feature, and at least 4 ulps of the features' dtype (a
    float16 model may round one example differently alone than in a batch).
    """
    from hcrfast.algorithm import forward  # split where it runs out of memory, as every later forward
    from hcrfast.bindings import TorchJacobian, from_torch, to_torch

    B = batch.shape[0]
    rtol = max(rtol, 4 * torch.finfo(features.dtype).eps)
    probe = batch[:3] if B >= 2 else batch.repeat(2, *([1] * (batch.ndim - 1)))
    with torch.no_grad():
        scale = features.abs().max().clamp_min(torch.finfo(features.dtype).tiny)
        again = forward(model, batch).reshape(B, -1)
        noise_gap = (again - features).abs().max() / scale
        if noise_gap > rtol:
            raise ValueError(
                f"the model gives other features for the same batch at each call (relative change "
                f"{float(noise_gap):.2e} between two calls): it draws random numbers (dropout called with "
                f"training=True, torch.randn/rand or a random augmentation in its forward) or updates its own "
                f"state as it runs. HCR bounds are for a "
                f"fixed feature map plus the released noise: make the forward deterministic and stateless (its "
                f"only randomness is the noise hcrfast models){_frozen_mode_hint(model)}")
        # Each probe row alone against the same row in the whole batch: a statistic of the batch (its
        # max, its mean) that one row dominates leaves that row's features alone as in the batch.
        rows = sorted({0, 1, 2, B - 1} & set(range(B)))
        try:
            alone = _joined([model(batch[i:i + 1]).reshape(1, -1) for i in rows], batch.device.type)
        except (RuntimeError, ValueError, IndexError, AssertionError) as exc:   # (the last: torch.export's guards)
            try:   # the whole batch again: a model that now fails on it too fails for its own reasons
                model(batch)
            except Exception:
                if hasattr(exc, "add_note"):
                    exc.add_note("hcrfast: the model raised this on a later call, and fails on the whole batch now "
                                 "too, which it ran before: not a matter of the batch size")
                raise exc from None
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "more than 1 value per channel when training" in said and _batch_statistics_hint(model):
                raise ValueError(f"the model ran on the batch of {B} examples but fails on one example alone (torch: "
                                 f"{said}): a BatchNorm of it normalizes with the batch's statistics, so each "
                                 f"example's features would depend on the others'{_batch_statistics_hint(model)}") \
                    from exc
            if "more than 1 value per channel when training" in said:   # (BatchNorm's, on one example)
                raise ValueError(f"the model ran on the batch of {B} examples but fails on one example alone (torch: "
                                 f"{said}): a BatchNorm runs in training mode, with the batch's statistics, though "
                                 f"hcrfast switched the model's own modules to eval mode: one outside its tree (held "
                                 f"in a list or a global, not a registered submodule) or one its forward switches "
                                 f"back (self.train()); call .eval() on it, or register it as a submodule, so that "
                                 f"each example's features do not depend on the others'") from exc
            raise ValueError(f"the model ran on the batch of {B} examples but fails on one example alone (torch: "
                             f"{said}); hcrfast runs it on "
                             f"other batch sizes (single examples, chunks, each example's restarts stacked), so its "
                             f"forward must take any batch size: reshape with x.flatten(1) or x.view(x.shape[0], -1), "
                             f"not a fixed batch size"
                             + (" (an exported program: export it with a dynamic batch axis and no upper bound, "
                                "dynamic_shapes=({0: torch.export.Dim('batch')},), or pass the original nn.Module)"
                                if _exported(model) else "")) from exc
        value_gap = (alone - features[rows]).abs().max() / scale
        gen = torch.Generator(device="cpu").manual_seed(0)
        tangent = torch.zeros_like(probe)
        tangent[0] = torch.randn(probe.shape[1:], generator=gen, dtype=probe.dtype).to(probe.device)

    ops = {}  # the operators of the probe, by mode: reverse mode's recorded graph serves J^T u too

    def product(how, chosen=True):
        try:
            ops[how] = TorchJacobian(model, probe, mode=how)
            return to_torch(ops[how].matvec(from_torch(tangent.reshape(probe.shape[0], -1))))
        except RuntimeError as exc:
            explain(exc, how, chosen)
            raise

    def explain(exc, how, chosen=True):
        """Raise the ValueError naming the fix for torch's error ``exc`` from a product in mode ``how``
        (``chosen``: the mode the call asked for); return where there is none to name."""
        text = str(exc)
        if "in-place operation" in text:
            raise ValueError(f"the model writes into its input in place (torch: {text}); hcrfast differentiates "
                             f"the features with respect to the input: make its first layers out of place (e.g. "
                             f"nn.ReLU(inplace=False))") from exc
        twice = "double backward" in text or "donated buffers" in text or "differentiate twice" in text
        if how == "reverse" and ("not have been used in the graph" in text or "is not implemented" in text):
            twice = once_differentiable()  # J^T u works, only its own derivative (J v) does not
        if chosen and how == "reverse" and twice:
            raise ValueError(f"the model cannot be differentiated twice (torch: {text.splitlines()[0]}), which "
                             f"jacobian='reverse' (the default) does for J v (torch.compile's compiled backward, "
                             f"@once_differentiable functions and fused attention kernels refuse it; hcrfast "
                             f"reroutes attention calls without dropout, not others); pass "
                             f"jacobian='forward' (forward-mode AD: an autograd.Function needs setup_context and "
                             f"a jvp staticmethod for it), or for a compiled model the module before compiling "
                             f"(model._orig_mod), or for attention run the call under "
                             f"torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)") from exc
        if how == "forward" and ("setup_context" in text or "forward AD" in text or "forward-mode" in text
                                 or "is not implemented" in text):
            try:
                product("reverse", chosen=False)
                other = "pass jacobian='reverse' (the default), or "
            except (RuntimeError, ValueError):
                other = "reverse mode fails on it too; "
            # (Not attention: hcrfast's JVPs run it on the MATH backend with the fast path off.)
            raise ValueError(f"the model does not support forward-mode AD (torch: {text.splitlines()[0]}), which "
                             f"jacobian='forward' uses for J v; {other}give its autograd.Functions "
                             f"setup_context and a jvp staticmethod") from exc
        if ("does not require grad" in text or "not have been used in the graph" in text
                or "doesn't have storage" in text):  # the last: forward mode's dual tensor in NumPy
            if _ignores_its_input(model, probe):
                raise ValueError(f"the model's features do not depend on its input: torch finds no path from input to "
                                 f"features (torch: {text.splitlines()[0]}), and steps of the inputs of up to 10% of "
                                 f"their size leave the features exactly as they are. No unbiased estimator of the "
                                 f"input exists from such features (every mode's bound would be +inf); check that the "
                                 f"model reads its input (not torch.zeros_like(x) or a constant)") from exc
            raise ValueError(f"the model's features are not differentiable with respect to its input (torch: "
                             f"{text}); hcrfast needs their Jacobian: remove .detach(), NumPy round trips, "
                             f"torch.no_grad() and non-differentiable steps (torch.round, argmax, quantized "
                             f"layers: bound the float model they were quantized from) from the path from "
                             f"input to features, or give them a straight-through gradient") from exc

    def once_differentiable():
        """Whether one backward pass (J^T u) runs where the double one failed (a detached model fails both)
        and gives a derivative: torch.round and friends give J^T u = 0, whose graph holds no u to
        differentiate again, and are not differentiable, not once-differentiable."""
        try:
            jtu = TorchJacobian(model, probe, mode="reverse").rmatvec(from_torch(torch.ones_like(features[:1]).expand(
                probe.shape[0], -1).contiguous()))
        except RuntimeError:
            return False
        return bool(to_torch(jtu).any())

    try:
        jv = product(mode)
        bad = ~torch.isfinite(jv[0])
        if bool(bad.any()) and not bool(torch.isnan(jv[0]).any()) and jv.dtype != torch.float64 and _finite_in_float64(
                model, probe, tangent, mode):
            raise ValueError(f"the model's Jacobian product J v at example 0 overflows {dtype_name(jv.dtype)} (inf in "
                             f"{int(bad.sum())} of its {bad.numel()} features, jacobian={mode!r}) though the features "
                             f"are finite: a derivative beyond the dtype's range (exp of a large input, say); run the "
                             f"model and batch in float64 (model.double(), batch.double()), or scale the inputs or "
                             f"features nearer 1")
        if bool(bad.any()):
            how_jv = "double backward" if mode == "reverse" else "forward AD"
            raise ValueError(f"the model's Jacobian product J v at example 0 is NaN or inf in {int(bad.sum())} of its "
                             f"{bad.numel()} features (jacobian={mode!r}) though the features are finite: an operation "
                             f"whose derivative is undefined at this input, or whose {how_jv} is (a square root or a "
                             f"norm at 0; torch.cdist between a point and itself, whose double backward is NaN there "
                             f"once either side has more than 25 points); make it differentiable "
                             f"there (an eps inside the root: torch.sqrt(d2 + 1e-12); the zero distances left out of "
                             f"the features)")
        own = jv[0].abs().max()
        if mode == "forward" and float(own) == 0:
            # Forward mode differentiates through .detach() to an exact 0 without a word; reverse mode
            # refuses it (a ValueError from product). A model that is flat at this input passes, and so
            # does one whose ops reverse mode cannot run (no double backward): nothing to tell then.
            try:
                product("reverse", chosen=False)
            except RuntimeError:
                pass
        if float(own) > 0:
            # LSQR also needs J^T u, by reverse mode; the two must be adjoint. Forward mode goes through
            # torch.no_grad() sections that reverse mode sees as constants; in reverse mode J v comes from
            # the derivative of the backward, which an operation can get wrong (its double backward, or a
            # backward written by hand that is not linear in its gradient).
            gen = torch.Generator(device="cpu").manual_seed(1)
            u = torch.randn(jv.shape, generator=gen, dtype=jv.dtype).to(jv.device)
            try:
                reverse = ops.get("reverse") or TorchJacobian(model, probe, mode="reverse")
                jtu = to_torch(reverse.rmatvec(from_torch(u)))
            except RuntimeError as exc:
                explain(exc, "reverse", chosen=False)
                raise
            left = float((jv.double() * u.double()).sum())
            right = float((tangent.reshape(jtu.shape).double() * jtu.double()).sum())
            # 1e-3 of |J v| |u|, or float16's rounding (3e-2 of it), plus the rounding of the two products, 64 ulps
            # of |v| |J^T u|: a tangent nearly in J's null space (an example of a scale-invariant model drawn
            # from the same seed as it) has J v ~ 0, whose rounding passed 1e-3 of |J v| |u|. (Not 1e-3 of
            # |v| |J^T u|, about sqrt(p/n) times |J v| |u|: at 224x224x3 inputs and 10 features a J v 20% off
            # passed that.)
            tol = (max(1e-3, 32 * torch.finfo(jv.dtype).eps) * scaled_norm(jv) * scaled_norm(u)
                   + 64 * torch.finfo(jv.dtype).eps * scaled_norm(tangent) * scaled_norm(jtu))
            if abs(left - right) > tol and mode == "forward":
                raise ValueError(f"forward and reverse mode give different Jacobians for this model (<J v, u> = "
                                 f"{left:.4g} but <v, J^T u> = {right:.4g}): a torch.no_grad() or .detach() section "
                                 f"that forward mode differentiates through and reverse mode does not; remove it from "
                                 f"the path from input to features (jacobian='reverse' names it)")
            if abs(left - right) > tol:
                raise ValueError(f"the model's J v (by differentiating its backward pass, jacobian='reverse') is not "
                                 f"the adjoint of its J^T u (<J v, u> = {left:.4g} but <v, J^T u> = {right:.4g}): an "
                                 f"operation whose double backward is wrong, an autograd.Function whose backward is "
                                 f"not linear in its incoming gradient, or arithmetic coarser than the features' dtype "
                                 f"inside the model (torch.autocast to bfloat16 or float16 rounds at ~1e-2, past this "
                                 f"check's 1e-3): fix that backward or drop the autocast, or where it is torch's own "
                                 f"operation pass jacobian='forward' (forward-mode AD, checked against J^T u the same "
                                 f"way)")
        leak = jv[1:].abs().max()
        mixed = leak > rtol * max(float(own), float(torch.finfo(jv.dtype).tiny))
        if value_gap > rtol and not mixed:
            # rows alone unlike the batch, and no JVP leak: the batch itself may give other features now (a model
            # that changed between probe (1)'s forwards and these), which is no mixing of examples
            with torch.no_grad():
                drift = (forward(model, batch).reshape(B, -1) - features).abs().max() / scale
            if drift > rtol:
                raise ValueError(
                    f"the model gives other features for the same batch from one call to the next (relative change "
                    f"{float(drift):.2e} between its first forward and one a few calls later, and no example's "
                    f"derivative reaches another's features): it updates its own state as it runs (a counter, a cache, "
                    f"a schedule in its forward). HCR bounds are for a fixed feature map plus the released noise: make "
                    f"the forward deterministic and stateless{_frozen_mode_hint(model)}")
        if value_gap > rtol or mixed:
            raise ValueError(
                "the model mixes the examples of a batch (features of one example depend on the others: "
                f"relative change {float(value_gap):.2e} alone vs in batch, cross-example JVP leak "
                f"{float(leak):.2e} vs {float(own):.2e}). HCR bounds are per example: use BatchNorm in eval "
                "mode with running statistics (model.eval()) and no attention or normalization across the batch "
                "axis" + _batch_statistics_hint(model) + _frozen_mode_hint(model))
        missed = _missed_by_jv(model, probe, tangent, jv[0])
        if missed is not None and missed[1] >= FD_SHARE:
            count, share = missed
            warn(f"J v (jacobian={mode!r}) misses how {count} of the {jv[0].numel()} features of example 0 move: "
                 f"finite differences in float64 along the probe's direction say they do ({share:.0%} of the change), "
                 f"J v says not (below {FD_MISSED:g} of it). Likely a .detach(), torch.no_grad() section or NumPy "
                 f"round trip on part of the path from input to features, constant to both autograd modes (so J v and "
                 f"J^T u agree). The bounds stay valid (certified by float64 forward passes) but are blind along that "
                 f"dependence: they come out low, often 0. Remove it, or give it a straight-through gradient "
                 f"(x + (f(x) - x).detach() for a step f)")
    finally:   # the closures refer to each other (product and explain): a cycle that kept the model, the probe
        # and their Jacobian operators alive past the call, until Python's cycle collector ran (GPU memory held)
        product = explain = None
        ops.clear()
