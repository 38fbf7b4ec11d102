"""Algorithm 1 of the paper, batched over examples × restarts, and the HCR bound.

For every example θ and restart r, starting from a scaled noise draw z,

    z̃ = ‖z‖ · z(j−1)/‖z(j−1)‖;  ε(j) = argmin ‖J ε − z̃‖ (LSQR);  z(j) = a(θ+ε(j)) − a(θ)

for j = 1..i, then the bound ``|(Q ε)_k| / sqrt(D(z_ε))`` per coordinate with
``D(z) = expm1(‖z‖²/σ²)``. All B·R problems of a chunk are one batched LSQR.
``z_ε`` always comes from forward passes; with ``certify`` it is recomputed in
float64 for the reported bound. Guarantees of confidentiality via
Hammersley-Chapman-Robbins bounds, Algorithm 1 and eqs. (5), (6), (12).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import json
import math
import numbers
import threading
import time
import warnings
import weakref

import numpy as np
import torch

from hcrfast import dense, krylov, profiling, validation
from hcrfast.backend import get_array_module, to_host, trim_host_heap, warnings_ignored
from hcrfast.checkpoint import FORMAT as CHECKPOINT_FORMAT
from hcrfast.checkpoint import (RESUME_BITWISE, Checkpoint, arithmetic_of, key_batch_fingerprint, key_model_fingerprint,
                                gaps as checkpoint_gaps, model_fingerprint, sha256_tensors, shown_value,
                                taken_back_on_failure)
from hcrfast.distributed import ShardError, World, differences, join_timeout
from hcrfast.bindings import TorchJacobian, array_module_for, from_torch, release_device_memory, to_torch
from hcrfast.bindings.double_backward import native_rnn_for
from hcrfast import kernels
from hcrfast.lsqr import LSQROptions, lsqr
from hcrfast.noise import (D_ROUNDING_UNIT, Gaussian, Laplace, MonteCarlo, accepts_per_feature_sigma, as_noise,
                           divergence_of, shown_damp)
from hcrfast.results import Bounds, counted, json_default, run_record

#: LSQR settings of :func:`bound` unless the caller passes ``lsqr=``.
# atol = btol = 1e-5: the loosest setting whose median bound matched the published method's in
# the CPU race (benchmarks/README.md); 1e-4 was 13% looser.
DEFAULT_LSQR = LSQROptions(atol=1e-5, btol=1e-5, conlim=1e8, iter_lim=None, check_every=8)

#: Rows × (n + p) values per chunk when ``chunk_size`` is not given.
_CHUNK_ELEMENTS = 2**24

#: How :func:`bound` solves Algorithm 1's least-squares steps.
SOLVERS = ("auto", "lsqr", "dense", "krylov")

#: ``solver="auto"`` takes the dense solve on the CPU up to this many input values per example
#: while an example's J takes at most ``DENSE_SOLVE_MAX_VALUES`` (n·p) values. Measured on one CPU
#: thread (benchmarks/README.md): MNIST MLP (p = 784), 32 examples × 25 restarts × 10: 4.9 s against
#: 89 s for warm-started LSQR, at a slightly higher median bound; CIFAR-10 CNN (p = n = 3072), one
#: example: J and its factorization 55.5 s, one LSQR solve from zero 284 s (1,260 steps), R = 25 × i = 6
#: such problems per example. On CUDA "auto" takes the Krylov basis instead (not measured on a GPU
#: yet; chosen by count): where the space reaches J's row space it gives the dense solve's steps
#: (MNIST MLP: 801 products per example, every row the model computed, against LSQR's 50,735, median
#: within 0.5% of the dense solve's) with all its work batched on the device except a k × k tridiagonal
#: eigendecomposition per example on the host (4.5 ms at k = 386), where the dense solve needs a float64
#: eigendecomposition of an ~400 × 400 Gram matrix per example (10,000 of them for the MNIST target), which
#: GPU libraries run one matrix at a time. Inputs beyond these limits take the basis on any device
#: (ImageNet geometries: p = 24,843, where J alone would take 5 GB per example).
DENSE_SOLVE_MAX_INPUTS = 4096
DENSE_SOLVE_MAX_VALUES = 2**24

#: ``solver="auto"`` takes the Krylov basis (:mod:`hcrfast.krylov`) for inputs beyond the dense solve's
#: limits. Measured on ResNet-18 (p = 24,843; benchmarks/README.md, one CPU thread, one example): at
#: R = 2, i = 10 warm-started LSQR reached a median bound of 0.158 with 15,686 products per example in
#: 748 s; the basis 0.127-0.146 (81-93%) with 1,501-8,193. At the published R = 25 the basis' cost
#: barely moves (1,500 steps: 3,001 products, 212 s, median 0.237), while LSQR's grows ~12x (about
#: 196,000 products per example, hours here; ~12 million row-steps for the 128 x 25 x 10 GPU target,
#: beyond 10 minutes on one H100 by the FLOP count). At equal R LSQR is tighter; at any budget
#: that fits, the basis is. ``solver="lsqr"`` remains one argument away.
KRYLOV_MIN_INPUTS = DENSE_SOLVE_MAX_INPUTS + 1
#: ``bound(singular_steps="auto")``: this many of J's smallest singular directions (at most min(n, p)),
#: certified as steps, where the dense or Krylov solve gives them (and Gaussian noise); else none.
#: 64, each direction certified with both signs, raised the median bound 1.05× (CIFAR-10 CNN) to 2.89×
#: (MNIST MLP) in 1.04× to 1.14× Algorithm 1's time (benchmarks/README.md, "twelfth session"; one sign:
#: 1.04× to 3.90× on five models, Swin-T the 3.90×, "eleventh session").
AUTO_SINGULAR_STEPS = 64

#: What an infinite bound's reason says of its step (after "example E, restart R: " or the like), in
#: ``infinite_reasons`` of ``bound`` and of ``hcrfast reproduce``'s bounds.npz alike.
INFINITE_REASON = ("a(theta+eps) == a(theta) in float64, so D = 0; no unbiased estimator exists for the "
                   "coordinates this eps moves (their bound is +inf)")

#: Values (J in float64, its live-row factor and pseudo-inverse) per chunk of the dense solve on CPUs.
_DENSE_ELEMENTS = 2**26

#: ``iterates="all"`` on CPUs: values per chunk for the earlier steps, held to be screened and certified
#: (:func:`_earlier_chunk`), beside each solver's own budget.
_EARLIER_ELEMENTS = 2**26
#: The earlier steps' float64 values per step and (n + p), measured: their steps and shifts kept through the
#: solve, stacked for the screen, the certified rows and the certifying pass's arrays (MNIST MLP, R = 200,
#: i = 50, chunk 2: ~0.5 GiB an example, 4.2 × R·(i − 1)·(n + p)·8 bytes).
_EARLIER_PER_STEP = 4

#: ``Bounds.lsqr_istop`` of a problem solved by the dense path (no LSQR ran; SciPy's codes are ≥ 0).
DENSE_ISTOP = -1

#: ``Bounds.lsqr_istop`` of a step solved by projection onto its example's Krylov basis
#: (``solver="krylov"``); the step that built the basis keeps its LSQR code and step count.
KRYLOV_ISTOP = -2

#: Values (the kept Lanczos vectors, :func:`hcrfast.krylov.basis_values`) per chunk of the Krylov
#: solve on CPUs: 1 GiB in float32.
_KRYLOV_ELEMENTS = 2**28


def rms_sigma(features, scale: float = 1.0) -> float:
    """σ = scale × RMS of the features, as in the published runs.

    RMS = sqrt(mean of the squared feature entries over all given examples).
    """
    scale = validation.positive_float("scale", scale)
    if isinstance(features, torch.Tensor):
        validation.strided_tensor("features", features)   # (a sparse tensor's mean was of its stored values)
        # .double() of a complex tensor drops the imaginary part with a mere warning; a bool tensor is
        # no feature vector. Integers are taken, as in arrays and lists.
        if features.is_complex() or features.dtype == torch.bool:
            fix = ("pass the real features that are released, e.g. features.real or features.abs()"
                   if features.is_complex() else "pass the model's outputs, model(batch)")
            raise TypeError(f"features must be a tensor of real numbers, got dtype "
                            f"{validation.dtype_name(features.dtype)}; {fix}")
        f = features.detach().double()
    else:
        try:
            values = np.asarray(features)
        except (TypeError, ValueError, RuntimeError) as exc:  # e.g. a tuple of tensors that require grad
            raise TypeError(f"features must be a tensor, an array or a list of numbers, got "
                            f"{type(features).__name__} that NumPy cannot read ({exc}); pass the model's output "
                            f"tensor itself, e.g. model(batch) (under torch.no_grad())") from exc
        if values.dtype.kind not in "iuf":  # as before: NumPy arrays and lists of real numbers
            raise TypeError(f"features must hold real numbers, got an array of dtype {values.dtype}; pass the "
                            f"model's outputs as a float tensor or array"
                            + (", e.g. features.real or abs(features)" if values.dtype.kind == "c" else ""))
        f = torch.as_tensor(values.astype(np.float64))
    if not f.numel():   # (its mean is NaN: "the features' RMS is nan" did not say why)
        raise ValueError(f"features are empty (shape {tuple(f.shape)}): sigma = scale x RMS needs at least one "
                         f"feature value; pass the model's outputs on a non-empty batch")
    rms = float(torch.sqrt(torch.mean(f * f)))
    if rms == 0 or math.isinf(rms):  # f * f under- or overflowed: scaled by the largest first
        rms = validation.scaled_norm(f) / math.sqrt(f.numel())
    if not math.isfinite(rms) or rms <= 0:
        raise ValueError(f"the features' RMS is {rms!r}; sigma = scale x RMS needs non-zero finite features")
    return scale * rms


def start_vectors(example_ids, restarts: int, n: int, *, seed: int, size: float, sigma: float | None = None,
                  noise=None, workers: int | None = None) -> np.ndarray:
    """Algorithm 1's start vectors z = (s/√n)·Z, Z one noise draw, shape (len(ids)·R, n).

    Z is drawn from ``noise`` (default ``Gaussian(sigma)``). Example e draws from
    its own stream ``default_rng([seed, e])``, so results do not depend on
    chunking, sharding, threads or the device.

    The built-in laws (Gaussian, Laplace) fill examples on ``workers`` threads
    (default: the CPU count, capped at 16) when there are more than 2**20 values:
    NumPy releases the GIL while it fills an array, and each example has its own
    generator, so the result is bitwise that of one thread. A user's Monte Carlo
    sampler is always called from this thread.
    """
    restarts = validation.positive_int("restarts", restarts)
    n = validation.positive_int("n", n)
    seed = validation.seed(seed)
    size = validation.positive_float("size", size, "; typical values are 1/200, 1/500, 1/1000")
    workers = None if workers is None else validation.positive_int("workers", workers)
    if noise is None and sigma is None:
        raise TypeError("start_vectors needs the noise: pass sigma (the Gaussian noise std) or noise (a law such "
                        "as hcrfast.Laplace(b))")
    if noise is not None and sigma is not None:
        raise ValueError(f"pass sigma or noise, not both (got sigma={sigma!r} and noise={noise!r}); "
                         f"sigma=s is noise=hcrfast.Gaussian(s)")
    law = as_noise(validation.sigma_or_law(sigma) if noise is None else noise)
    if not isinstance(example_ids, (np.ndarray, torch.Tensor)):
        try:
            example_ids = list(example_ids)
        except TypeError:   # (a count such as 5 is not an id list: each id seeds its own example's stream)
            count = (int(example_ids) if isinstance(example_ids, numbers.Integral)
                     and not isinstance(example_ids, bool) and example_ids >= 0 else None)
            raise TypeError(f"example_ids must be a sequence of non-negative integers, one id per example (each "
                            f"seeds its example's stream), got {type(example_ids).__name__} {example_ids!r}; "
                            + (f"for {count} examples pass range({count})" if count is not None
                               else "pass e.g. range(B) for B examples")) from None
    ids = np.asarray(example_ids)
    if ids.ndim != 1 or ids.size and ids.dtype.kind not in "iu":
        raise TypeError(f"example_ids must be a sequence of non-negative integers (each seeds its example's "
                        f"stream), got an array of shape {ids.shape} and dtype {ids.dtype}")
    if ids.size and ids.min() < 0:
        raise ValueError(f"example_ids must be non-negative integers (each seeds its example's stream), got "
                         f"{ids[ids < 0][:10].tolist()}")
    ids = [int(e) for e in ids]
    out = np.empty((len(ids) * restarts, n))
    scale = size / math.sqrt(n)

    def fill(i):
        out[i * restarts:(i + 1) * restarts] = scale * law.sample(np.random.default_rng([seed, ids[i]]), (restarts, n))

    if workers is None:
        # the cores this process may use, no more than torch's thread count: the user's say on it
        from hcrfast.kernels._lapack import cores

        workers = min(cores(), 16) if out.size > 2**20 else 1
    if workers > 1 and len(ids) > 1 and isinstance(law, (Gaussian, Laplace)):
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(fill, range(len(ids))))
    else:
        for i in range(len(ids)):
            fill(i)
    return out


def _features(model, x: torch.Tensor) -> torch.Tensor:
    """Features of the rows of ``x``, flat; a forward that runs out of memory is split in halves.

    The forwards of a chunk (restart steps, float64 certification) come after its LSQR
    solves: splitting them keeps that work instead of failing the whole chunk.
    """
    return forward(model, x).reshape(x.shape[0], -1)


#: On CPUs, the rows a forward pass without autograd runs at once are held to this many bytes (32 MiB) of the model's
#: largest activation (:func:`_piece_rows`). A chunk is sized for its solver, and its certifying passes run every
#: restart's rows, and every earlier iterate's, at once: a 3 × 32-channel CNN on 28 × 28 inputs peaked 5.4 GiB above
#: its start for 32 examples at the defaults, 1.2 GiB in pieces (1.8 GiB at 128 MiB a piece, 1.5 s slower;
#: 2026-12-02, ``benchmarks/forward_pieces.py``; ~16 GB predicted at its automatic chunk of 93 before), where the kernel's
#: out-of-memory killer, not a MemoryError that :func:`_halved` would split, ends a run. Fixed, not taken from the
#: free memory: the pieces, and so the rounding of the passes, are the same on every machine.
FORWARD_PIECE_BYTES = 2**25


def _piece_rows(model, x: torch.Tensor) -> int | None:
    """The most rows of ``x`` one forward pass of ``model`` runs at once on a CPU: :data:`FORWARD_PIECE_BYTES` over
    the bytes of its largest activation for one row (:func:`_measuring`'s count, in ``x``'s dtype); None for no
    limit (CUDA, whose allocations fail and are halved; a model not measured yet, or that cannot be)."""
    counts = getattr(_SCOPE, "counts", None)
    if counts is None or x.device.type != "cpu" or x.ndim == 0 or x.shape[0] < 2:
        return None
    largest, _, columns = counts.get(_measured_as(model)) or (None, None, 0)
    # float64 convolutions on a CPU fill a column buffer of the whole piece (:func:`_conv_columns`)
    numel = largest and max(largest, columns if x.dtype == torch.float64 else 0)
    # (at least 2 rows: a model ending in .squeeze() returns (10,) for one row, which no piece of (B, 10) joins)
    return None if not numel else max(2, FORWARD_PIECE_BYTES // (numel * x.element_size()))


def _conv_columns(module, args, out) -> int:
    """The values of the column buffer a convolution without dilation (torch's ``_ConvNd``) fills for its whole
    batch on its float64 path on CPUs (``slow_conv2d``/``3d``, ``slow_conv_transpose``: mkldnn takes float32 and
    bfloat16, not float64): ``in_channels / groups × kernel`` values per output position (a transposed one's:
    ``out_channels / groups × kernel`` per input position), and where ``groups`` > 1 2.5 times its output more
    (each group's input and output copied); 0 for other modules. A 3 × 3 one of 32 to 32 channels in float64 took
    9.1 times its output (a 3 × 3 × 3 one 27 times; groups of 2, 4 and 32, 5.2, 4.4 and 2.4 times, transposed
    5.2, 3.2 and 1.3, 2026-12-02): pieces of 32 MiB of outputs peaked at ~300 MiB. A dilated one unfolds one
    example at a time (0.1 times)."""
    if not isinstance(module, torch.nn.modules.conv._ConvNd) or any(d != 1 for d in module.dilation):
        return 0
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    spatial = len(module.kernel_size)
    if x is None or not isinstance(out, torch.Tensor) or out.ndim != spatial + 2 or x.ndim != spatial + 2:
        return 0
    kernel = math.prod(module.kernel_size)
    copies = 5 * out.numel() // 2 if module.groups > 1 else 0
    if module.transposed:
        return out.shape[0] * module.out_channels // module.groups * kernel * math.prod(x.shape[2:]) + copies
    return out.shape[0] * module.in_channels // module.groups * kernel * math.prod(out.shape[2:]) + copies


#: On CPUs, the bytes a chunk's recorded product graphs (J v and Jᵀ u over every problem's row) may take: the LSQR
#: and Krylov chunks are held to it (:func:`_graph_row_bytes`), beside their budgets of values. Their budgets
#: counted the solver's vectors only: a 3 × 32-channel CNN on 28 × 28 inputs, 256 examples × 25 restarts in one
#: chunk under LSQR, peaked 5.6 GiB above its start with the forward pieces, ~900 KB a row (13.4 GiB without
#: either budget; 1.75 GiB in chunks of 71 with both: 2026-12-02, ``benchmarks/forward_pieces.py``). Fixed, as
#: the chunk sizes are.
GRAPH_BYTES = 2**31
#: A row's graph against the sum of its activations (:func:`_measuring`'s count): that CNN's rows took ~1.5 times it
#: (reverse mode's J v differentiates the backward, whose own graph holds the activations' gradients too).
_GRAPH_PER_ACTIVATION = 2


def _graph_row_bytes(model, x: torch.Tensor) -> int | None:
    """On CPUs, the bytes one row's recorded product graph may take: :data:`_GRAPH_PER_ACTIVATION` × the values of
    all of its submodules' outputs for one row (counted in this call's first forward), in ``x``'s dtype; None where
    not counted (CUDA measures its graphs instead, :func:`_free_and_graph_bytes`)."""
    counts = getattr(_SCOPE, "counts", None)
    if counts is None or x.device.type != "cpu":
        return None
    total = (counts.get(_measured_as(model)) or (None, None, 0))[1]
    return None if not total else _GRAPH_PER_ACTIVATION * total * x.element_size()


#: ``_SCOPE.counts``, per public call (:func:`pieces_scope`): per Module, ``(largest, total, columns)``, the values of
#: its submodules' largest output and of all their outputs for one row of its input, and of its convolutions' largest
#: float64 column buffer (:func:`_conv_columns`) (None: not measurable), as :func:`_measuring` saw them in its first
#: forward of the call.
_SCOPE = threading.local()


@contextlib.contextmanager
def pieces_scope():
    """A public call's forwards (:func:`hcrfast.validation.entry_point`): models are measured afresh at their first
    forward in it, so the same call made twice in one process runs its forwards in the same pieces, and so gives the
    same bits (a count kept from an earlier call pieced the second call's first forward, which the first call ran
    whole). Nested calls (a sweep's) have their own, as a direct call does; outside any, nothing is pieced."""
    outer = getattr(_SCOPE, "counts", None)
    _SCOPE.counts = {}
    try:
        yield
    finally:
        _SCOPE.counts = outer


#: hcrfast's own copies of a model (float64 to certify, float32 of a float16 model) -> the model they copy, whose
#: activations they share in count: :func:`note_copy`.
_COPY_OF: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def note_copy(copy_, model) -> None:
    """``copy_`` is a copy of ``model`` in another dtype: its forwards are pieced by ``model``'s activations."""
    if isinstance(copy_, torch.nn.Module) and isinstance(model, torch.nn.Module) and copy_ is not model:
        try:
            _COPY_OF[copy_] = model
        except TypeError:   # (not weakly referable)
            pass


def _measured_as(model):
    while model in _COPY_OF if isinstance(model, torch.nn.Module) else False:
        model = _COPY_OF[model]
    return model


def _output_tensors(out, depth: int = 0):
    """The tensors in a module's output, however nested in tuples, lists and dicts (an LSTM's
    ``(PackedSequence, (h, c))``: one level deep, none of them was counted)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif depth < 8 and isinstance(out, (tuple, list, dict)):
        for item in (out.values() if isinstance(out, dict) else out):
            yield from _output_tensors(item, depth + 1)


def _unmeasured(model, x: torch.Tensor) -> bool:
    """Whether :func:`_measuring` would count ``model``'s forward of ``x`` (a Module on a CPU, in a call's scope,
    not counted yet in it)."""
    counts = getattr(_SCOPE, "counts", None)
    owner = _measured_as(model)
    return (counts is not None and x.device.type == "cpu" and isinstance(owner, torch.nn.Module)
            and owner not in counts)


@contextlib.contextmanager
def _measuring(model, x: torch.Tensor):
    """Where the Module ``model`` has not been measured in this call (:func:`pieces_scope`), hooks that count, per
    forward of the block, its submodules' largest output and the sum of their outputs per row of the model's own
    input; the largest of those of its forwards that returned are kept on a clean exit. Only for rows ``x`` on a CPU
    (CUDA's allocations fail, and are halved: no hook slows its forwards).
    The forward measured is one hcrfast runs anyway, whose output it uses: a model that changes at its first call
    (a counter) is seen as before, where a forward of its own, on a row of zeros, hid such a change."""
    if not _unmeasured(model, x):
        yield
        return
    counts, owner = _SCOPE.counts, _measured_as(model)
    # Per outer call of the model (a forward split on out-of-memory makes several, and a failed one is left out):
    # its rows, its largest output and their sum per row, whether a submodule of the user's own model was seen;
    # the block keeps the largest of each over its calls that returned.
    user = validation.user_model(model)
    users = {id(m) for m in user.modules() if m is not user} if isinstance(user, torch.nn.Module) else set()
    call = dict(rows=0, largest=0, total=0, columns=0, seen=False)
    kept = dict(largest=0, total=0, columns=0, seen=False)
    depth, handles = [0], []
    # (this thread's forwards only: the hooks are on the Module, which another thread may run meanwhile, and its
    # forwards changed the count from run to run, or left it None)
    thread = threading.get_ident()

    def pre(module, args):   # (first of the pre-hooks: the rows the model's own call is given, not a user hook's)
        if threading.get_ident() != thread:
            return
        if depth[0] == 0:
            first = args[0] if args else None
            call.update(rows=first.shape[0] if isinstance(first, torch.Tensor) and first.ndim > 0 else 0,
                        largest=0, total=0, columns=0, seen=False)
        depth[0] += 1

    def hook(module, args, out):
        if call["rows"] > 0 and threading.get_ident() == thread:
            call["seen"] |= id(module) in users
            for t in _output_tensors(out):
                per_row = -(-t.numel() // call["rows"])
                call["largest"] = max(call["largest"], per_row)
                call["total"] += per_row
            call["columns"] = max(call["columns"], -(-_conv_columns(module, args, out) // call["rows"]))

    def done(module, args, out):   # (last of the model's hooks, and called where its forward raised: out None)
        if threading.get_ident() != thread:
            return
        depth[0] -= 1
        if depth[0] == 0 and out is not None and call["rows"] > 0:
            kept.update(largest=max(kept["largest"], call["largest"]), total=max(kept["total"], call["total"]),
                        columns=max(kept["columns"], call["columns"]), seen=kept["seen"] or call["seen"])

    # (run eagerly where the forward is compiled: torch.compile traced them, and refused the closure's model as
    # "already tracked for mutation")
    pre, hook, done = (torch.compiler.disable(f) for f in (pre, hook, done))
    try:   # (one handle at a time: a submodule that refuses a hook leaves none of the others behind)
        handles.append(model.register_forward_pre_hook(pre, prepend=True))
        for m in model.modules():
            handles.append(m.register_forward_hook(hook))
        handles.append(model.register_forward_hook(done, always_call=True))
    except Exception:   # (TorchScript without hooks: not measured, no pieces, as before)
        for h in handles:
            h.remove()
        counts[owner] = None
        yield
        return
    try:
        yield
        # not counted: a model whose user's own submodules run without their hooks (torch.jit.trace's), or a plain
        # function inside hcrfast's wrapper, shows the outputs around it only; so does a Module without submodules
        # other than torch's own layers (nn.Linear: its output is all it holds), whose forward computes by
        # functions (a 4096-wide hidden layer was not seen, and its pieces ran 50 MiB of it; a traced or
        # torch.fx graph of it alike); nor one whose forward never returned
        blind = (not isinstance(user, torch.nn.Module) or (bool(users) and not kept["seen"])
                 or (not users and not type(user).__module__.startswith("torch.nn.modules.")))
        counts[owner] = None if blind or not kept["largest"] else (kept["largest"], kept["total"], kept["columns"])
    finally:
        for h in handles:
            h.remove()


#: On CPUs, the C heap's free pages are given back (:func:`hcrfast.backend.trim_host_heap`) after every this many
#: pieces of a forward, and after its last.
_TRIM_EVERY = 8


def _in_pieces(compute, join, rows: int | None, x: torch.Tensor, *more):
    """:func:`_halved` of ``compute`` on pieces of about ``rows`` rows of ``x`` (and of every other argument), as
    many as at most ``rows`` rows take, of sizes one apart and of at least 2 rows (a last piece of one row, the
    rest of a division, was the one row a model ending in ``.squeeze()`` returns without its batch axis), joined
    pairwise in a balanced tree; one call where ``rows`` is None or covers ``x``."""
    B = x.shape[0]
    if rows is None or B <= rows:
        return _halved(compute, join, x, *more)
    count = max(1, min(-(-B // rows), B // 2))
    bounds = [B * i // count for i in range(count + 1)]
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        parts.append(_halved(compute, join, x[lo:hi], *(a[lo:hi] for a in more)))
        if len(parts) % _TRIM_EVERY == 0 and x.device.type == "cpu":
            trim_host_heap()
    while len(parts) > 1:
        parts = [join(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    if x.device.type == "cpu":
        trim_host_heap()
    return parts[0]


def _halved(compute, join, x: torch.Tensor, *more):
    """``compute(x, *more)``; where it runs out of memory, ``join`` of the same on the first and on the
    second half of the rows of ``x`` and of every other argument (recursively: one row that does not
    fit raises), after the torch and CuPy pools gave their cached blocks back."""
    try:
        return compute(x, *more)
    except Exception as exc:  # noqa: BLE001 - only out-of-memory is split
        if not _is_oom_of(exc, x.shape[0]) or x.shape[0] < 2:
            raise
    # Out of the except block: the exception's frames no longer hold the failed pass's memory.
    release_device_memory(x.device)
    half = x.shape[0] // 2
    return join(_halved(compute, join, x[:half], *(a[:half] for a in more)),
                _halved(compute, join, x[half:], *(a[half:] for a in more)))


def _features_pair(model, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_features` of ``x`` and of ``y`` (as many rows), computed in the same pieces: halved
    together on out-of-memory, so that a row the model maps identically comes out bitwise equal in
    both (D = 0 is decided by that equality, and a device's kernels may round differently for other
    batch shapes)."""
    def both(x, y):
        with torch.no_grad():
            return model(x).reshape(x.shape[0], -1), model(y).reshape(y.shape[0], -1)

    with _measuring(model, x):
        return _in_pieces(both, lambda a, b: (torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])),
                          _piece_rows(model, x), x, y)


#: On CPUs, the rows of a call's first forward of a model (the one :func:`_measuring` counts) run before the others,
#: which then run in the pieces that count gives, where the batch has twice as many: the first forward of a whole
#: batch ran whole, and a 3 × 32-channel CNN on 28 × 28 inputs took 290 KB a row in it (1.16 GiB above its start for
#: 4,000 inputs, 2026-12-02; a batch of the 60,000 MNIST training images, 17 GB).
FIRST_PIECE_ROWS = 16


def forward(model, x: torch.Tensor):
    """``model(x)`` without autograd, split in halves (and concatenated) where it runs out of memory:
    what the model returns, unchecked (:func:`hcrfast.validation.features_of` checks it). On a CPU, in pieces of
    the model's activations (:func:`_piece_rows`); its first forward in a call counts them on
    :data:`FIRST_PIECE_ROWS` rows first."""
    def run(rows):
        with torch.no_grad():
            return model(rows)

    def join(first, second):
        if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
            return first  # no tensor to join: validation.features_of names what the model returned
        return torch.cat([first, second])

    if x.ndim > 0 and x.shape[0] >= 2 * FIRST_PIECE_ROWS and _unmeasured(model, x):
        with _measuring(model, x):
            first = _halved(run, join, x[:FIRST_PIECE_ROWS])
        if not isinstance(first, torch.Tensor) or first.ndim == 0 or first.shape[0] != FIRST_PIECE_ROWS:
            # no batch axis first (a sum, a transpose): the whole batch's output, for the check to name as it is
            # (joined pieces failed in torch.cat, or showed a shape the model never returned)
            return _halved(run, join, x)
        return join(first, _in_pieces(run, join, _piece_rows(model, x), x[FIRST_PIECE_ROWS:]))
    with _measuring(model, x):
        return _in_pieces(run, join, _piece_rows(model, x), x)


def _join(world: World, checkpoint, key: dict, example_ids, features, chunk_size, device, arithmetic=None,
          required: tuple = ()):
    """The first steps of a sharded :func:`bound`: every process checks that it makes rank 0's call, before
    anything is written; then rank 0 opens the checkpoint (writing or checking its key) and every process
    checks that it sees rank 0's folder. Returns ``(checkpoint, chunk_size)``, the chunk size rank 0's.
    ``arithmetic``: what each chunk records (default :func:`hcrfast.checkpoint.arithmetic_of` the device)."""
    arithmetic = arithmetic_of(device) if arithmetic is None else arithmetic
    saved = token = None
    mine = json.loads(json.dumps(key, sort_keys=True, default=str))
    every = world.agree("join", dict(key=mine, chunk_size=chunk_size), timeout=join_timeout())
    first = every[0]
    diffs = []
    for r, other in enumerate(every[1:], 1):
        fields = [f"{k} ({shown_value(first['key'], k)} on rank 0, {shown_value(other['key'], k)} on rank {r})"
                  for k in differences(first["key"], other["key"])]
        if fields:
            diffs.append(f"rank {r} differs in {', '.join(fields)}")
    if diffs:
        raise ShardError(f"hcrfast.bound(shard=True): the processes do not make the same call: {'; '.join(diffs)}; "
                         f"make the same call (model, batch, sigma, arguments) on every process")
    if world.rank == 0:   # (a refusal here reaches the others at the next step)
        saved = Checkpoint(checkpoint, key, example_ids, features, arithmetic, chunk_size=first["chunk_size"],
                           required=required)
        token = world.mark_folder(saved.path)
    world.check_folder(checkpoint, world.agree("opened", token, timeout=join_timeout())[0], "checkpoint")
    if world.rank != 0:
        saved = Checkpoint(checkpoint, key, example_ids, features, arithmetic, chunk_size=first["chunk_size"],
                           required=required)
    return saved, first["chunk_size"]


def _chunk_perturbations(model, x, f0, z0, *, iterations, linearize_at, options, jacobian, warm_start=False,
                          min_norm=None, basis=None, krylov_pilots=1, progress=None, keep_iterates=False):
    """Run Algorithm 1 for the problems of one chunk (rows of ``x``: examples × restarts).

    Returns ``(eps, itn, istop, earlier)`` as solver arrays: the final ε (P, p), the
    LSQR iteration counts and stop codes (P, i), and with ``keep_iterates`` the iterates
    ε(1) … ε(i) with their feature shifts ``z = a(θ+ε) − a(θ)`` in the model's dtype, as the
    restart step computed them (a list of ((P, p), (P, n)) copies, the last entry's ε the final
    one itself; else the last entry alone): each earlier ε is a perturbation like the last, whose certified
    bound ``bound(iterates="all")`` takes too; its z tells :func:`_screen_earlier` whether
    certifying it can raise any mode's bound, and the last z how far the model dtype's shifts
    stray from the certified ones.

    With ``min_norm`` (a :class:`hcrfast.dense.MinNormSolver` of the chunk's examples at θ,
    rows of ``x`` grouped by example), every step is solved exactly, ``ε(j) = J⁺ z̃``: what
    LSQR from zero converges to. Iteration counts are then 0 and stop codes ``DENSE_ISTOP``.

    With ``warm_start``, solve j > 1 starts from ``x0 = c·ε(j−1)``, ``c = ‖z‖/‖z(j−1)‖``
    (LSQR's ``x0``, as SciPy's): since ``z̃(j) = c·z(j−1)`` and ``z(j−1) ≈ J ε(j−1)``,
    x0 leaves only the nonlinear part of ``z(j−1)`` to solve for, and the stopping
    tests still measure the residual against ‖z̃(j)‖. One extra JVP per problem and step.

    With ``basis`` (a :class:`hcrfast.krylov.KrylovBasis` of the chunk's examples at θ), every
    step is the best ε in the example's Krylov space, ``V_k B_k⁺ U_{k+1}ᵀ z̃``: no model product.
    Iteration counts are then 0 and stop codes ``KRYLOV_ISTOP`` (the caller reports the basis).
    """
    xp = array_module_for(x.device)
    target = kernels.row_norms(z0, impl=options.kernels)
    ztilde = z0
    eps = None
    # A problem whose z(j) is exactly 0 has found ε ≠ 0 that leaves the features unchanged
    # (D = 0, bound +inf); Algorithm 1 cannot go on from z = 0, so it keeps that ε.
    stuck = xp.zeros(x.shape[0], dtype=bool)
    znorm = None  # ‖z(j−1)‖, from the restart step of the previous solve
    itns, istops, earlier = [], [], []
    fixed_op = (TorchJacobian(model, x, mode=jacobian)
                if linearize_at == "input" and min_norm is None and basis is None else None)
    P = x.shape[0]
    for j in range(iterations):
        if min_norm is not None:
            with profiling.annotate("dense-solve"):
                B = min_norm.rows.shape[0]
                solved = min_norm.solve(to_torch(ztilde).reshape(B, P // B, -1)).reshape(P, -1).to(x.dtype)
                solved = from_torch(solved)
            eps = solved if eps is None else xp.where(stuck[:, None], eps, solved)
            itns.append(xp.zeros(P, dtype=xp.int64))
            istops.append(xp.full(P, DENSE_ISTOP, dtype=xp.int64))
        elif basis is not None:
            with profiling.annotate("krylov-solve"):
                solved = krylov.solve(basis, ztilde, pilots=krylov_pilots)
            eps = solved if eps is None else xp.where(stuck[:, None], eps, solved)
            itns.append(xp.zeros(P, dtype=xp.int64))
            istops.append(xp.full(P, KRYLOV_ISTOP, dtype=xp.int64))
        else:
            with profiling.annotate("lsqr"):
                if fixed_op is not None:  # J at θ: one recorded forward pass serves all i solves
                    op = fixed_op
                else:
                    op = TorchJacobian(model, x if eps is None else x + to_torch(eps).reshape(x.shape), mode=jacobian)
                x0 = None
                if warm_start and eps is not None:
                    # z̃(j) = c·z(j−1) ≈ c·J ε(j−1): c·ε(j−1) nearly solves this step already.
                    c = xp.where(znorm > 0, target / xp.where(znorm > 0, znorm, 1), 0).astype(eps.dtype)
                    x0 = eps * c[:, None]
                res = lsqr(op, ztilde, options, x0=x0,
                           progress=None if progress is None else functools.partial(progress, j))
            eps = res.x if eps is None else xp.where(stuck[:, None], eps, res.x)
            itns.append(res.itn)
            istops.append(res.istop)
        with profiling.annotate("restart"):
            fp = from_torch(_features(model, x + to_torch(eps).reshape(x.shape)))
            z, znorm, ztilde = kernels.restart_update(fp, f0, target, impl=options.kernels)
            stuck = stuck | (znorm == 0)
        if keep_iterates:   # copies: no solver path may then reuse their storage
            earlier.append((xp.copy(eps) if j < iterations - 1 else eps, xp.copy(z)))
        elif j == iterations - 1:   # the last shift alone: how far the model dtype's strayed (_dtype_drift)
            earlier.append((eps, z))
    return eps, xp.stack(itns, axis=1), xp.stack(istops, axis=1), earlier


def divergence_underflow(noise, count: int) -> str:
    """The error for ``D = 0`` with ``z ≠ 0``: reporting +inf there would be false."""
    return (f"D(z) is below what float64 resolves (2^-960, hcrfast.noise.D_FLOOR) for {count} steps whose features "
            f"did change: the shifts z are too small against {noise.describe().split(':')[0]} (or too small to "
            f"square in float64, below ~1e-154) for D to keep its digits, and their bounds would read too high, or "
            f"+inf, which only a shift of exactly 0 proves; pass a larger size, or a sigma nearer the feature "
            f"shifts' scale (rescaling the model's output and sigma together gives the same bounds)")


_FLOAT64_MAX = float(np.finfo(np.float64).max)


def _check_perturbations(eps64, shift, noise, size: float, dtype, *, intended=None, features_move=None,
                         derivative_vanishes=None, first=None) -> None:
    """Refuse a chunk whose perturbations left the range of ``dtype``: ε not finite or its feature
    shift (``z_ε`` or ``D``, one row per ε) NaN (σ·s too large for it), or every ε that was meant to
    be non-zero (rows ``intended``, default all) 0 (σ·s too small: the solver's vectors underflow, or
    ε vanishes added to the inputs). One host read. ``features_move()``, asked only then, tells that
    case from examples whose features do not depend on their input (J = 0: no ε exists), which pass;
    ``derivative_vanishes()``, asked where they do depend on it, tells piecewise-constant features
    (torch's J is 0 though a finite step moves them) from steps outside the dtype's range."""
    xp = get_array_module(eps64)
    eps_bad = ~xp.all(xp.isfinite(eps64), axis=1)
    # ‖ε‖² past float64: a step's bound is lowered by ‖ε‖'s rounding, taken from its square, and can come out 0, and
    # LSQR's norms lose accuracy (its bounds 3x below the dense solve's with steps of 1e155; the dense solve's
    # bounded every mode there exactly in the pixel basis, below in the DCT's). On a batch divided by a power of
    # two it is refused: the call runs again undivided (inputs of 1e-160 divided by 2^-531, σ = 1: every step
    # 1e157, every bound 0 with no word, 2026-12-02); elsewhere it is warned of, once the checks below passed.
    huge = xp.isfinite(eps64).all(axis=1) & ~xp.isfinite(xp.einsum("rp,rp->r", eps64, eps64))
    if validation.INPUTS_DIVIDED.get():
        eps_bad = eps_bad | huge
    bad = eps_bad | xp.any(xp.isnan(shift.reshape(shift.shape[0], -1)), axis=1)
    moved = xp.any(eps64 != 0, axis=1)
    if intended is not None:
        moved = moved | ~intended
    n_bad, n_eps_bad, n_moved, n_huge = (int(v) for v in to_host(xp.stack([bad.sum(), eps_bad.sum(), moved.sum(),
                                                                           huge.sum()])))
    if n_eps_bad and first is not None:   # a later iterate's NaN may come from the first's NaN features
        eps1, z1 = first
        outside = xp.all(xp.isfinite(eps1), axis=1) & xp.any(xp.isnan(z1.reshape(z1.shape[0], -1)), axis=1)
        n_outside = int(to_host(outside.sum()))
        if n_outside:
            n_bad, n_eps_bad = n_outside, 0
    name = validation.dtype_name(dtype)
    if n_moved == 0 and features_move is not None:
        if not features_move():
            return  # J = 0 at every example here: no step exists, whatever sigma; the caller reports each
        if derivative_vanishes is not None and derivative_vanishes():
            raise ValueError("every step's eps came out 0 because torch's derivative of the features is 0 at every "
                             "example, although a finite step of the inputs moves them: the features are piecewise "
                             "constant (floor, round, sign, argmax, a quantizer) or flat at these inputs (x**2 or "
                             "x**3 at 0), and Algorithm 1 follows the derivative, so it finds no direction whatever "
                             "sigma; bound inputs where the derivative is not 0, or the features before that step (a "
                             "model that returns them unrounded), or give the step a derivative (a straight-through "
                             "estimator) and certify the bound by its forward passes as usual")
    if n_bad and not n_eps_bad:   # ε finite, its features NaN: the model's domain, or its features overflowed
        raise ValueError(f"the model's features came out NaN at theta + eps in {n_bad} of {eps64.shape[0]} steps "
                         f"although their eps is finite ({noise.describe().split(':')[0]}, size={size:g}): the model "
                         f"is not defined just beside these inputs (a log, sqrt, asin or division outside its domain "
                         f"at theta + eps: bound inputs inside the model's domain, or a model defined around them), "
                         f"or its features overflowed there (then pass a sigma nearer the features' scale, "
                         f"hcrfast.rms_sigma(features, scale), or a smaller size)")
    if n_bad:
        raise validation.StepsOutOfRange(
                         f"{noise.describe().split(':')[0]} with size={size:g} asks for steps {name} cannot hold: "
                         f"eps or its feature shift overflowed (inf or NaN) in {n_bad} of {eps64.shape[0]} steps; "
                         f"pass a sigma nearer the features' scale (hcrfast.rms_sigma(features, scale))"
                         + (", a smaller size, or a float64 model and batch" if dtype != torch.float64
                            else " or a smaller size"))
    if n_moved == 0:
        raise validation.StepsOutOfRange(
                         f"{noise.describe().split(':')[0]} with size={size:g}: every step's eps came out 0, so no "
                         f"bound can be computed: the steps vanish once added to the inputs (theta + eps == theta in "
                         f"{name}: steps below the resolution of inputs this large, e.g. unnormalized values near "
                         f"1e9 with a small sigma), or they are outside the range the {name} solver resolves (its "
                         f"vectors' squares underflow or overflow); pass a sigma nearer the features' scale "
                         f"(hcrfast.rms_sigma(features, scale)), another size, inputs centred and scaled near 1 (the "
                         f"normalization inside the model)"
                         + (", or a float64 model and batch" if dtype != torch.float64 else ""))
    if n_huge and not validation.INPUTS_DIVIDED.get():
        validation.warn(f"{noise.describe().split(':')[0]} with size={size:g}: {n_huge} of {eps64.shape[0]} steps "
                        f"have a norm whose square overflows float64 (steps of ~1e154 or more): the bounds from them "
                        f"can come out below what such steps give (never above; LSQR's were 3x below at 1e155); pass "
                        f"a sigma nearer the features' scale (hcrfast.rms_sigma(features, scale)), or a smaller size")


def _random_vjp(model, x):
    """torch's ``Jᵀu`` of ``model``'s features at ``x`` for a fixed random ``u`` (one backward pass), flat
    per row; None where the features do not depend on ``x`` through autograd."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad(), native_rnn_for(model):  # cuDNN's RNN backward refuses eval mode
        f = model(x).reshape(x.shape[0], -1)
        if not f.requires_grad:
            return None
        u = torch.randn(f.shape, generator=torch.Generator(device="cpu").manual_seed(0), dtype=f.dtype)
        (g,) = torch.autograd.grad(f, x, u.to(f.device), allow_unused=True)
    return None if g is None else g.reshape(len(g), -1)


def _derivative_vanishes(model, x) -> bool:
    """Whether torch's derivative of ``model``'s features at ``x`` is exactly 0 (:func:`_random_vjp`)."""
    g = _random_vjp(model, x)
    return g is None or not bool(g.any())


def infinite_derivative(rows, start: int = 0) -> ValueError:
    """The error for examples (``rows``, offset by ``start``) where torch's derivative of the features
    is not finite: no Jacobian-based step exists there, whatever sigma or dtype."""
    shown = ", ".join(str(start + r) for r in rows[:10]) + (" ..." if len(rows) > 10 else "")
    return ValueError(f"the model's derivative is not finite at examples {shown} (inf or NaN in torch's Jacobian "
                      f"products): a step like sqrt, pow(x, a < 1), log or a norm has an infinite derivative at "
                      f"exactly 0 (sqrt of MNIST's black pixels, say), so Algorithm 1 has no step there, whatever "
                      f"sigma or dtype; make the forward differentiable at these inputs (sqrt(x + 1e-12), a clamp "
                      f"before log)")


def _nonfinite_derivative(model, x) -> list[int]:
    """Rows of ``x`` where torch's ``Jᵀu`` (:func:`_random_vjp`) is not finite; none where reverse mode
    cannot run (the products will say why)."""
    try:
        g = _random_vjp(model, x)
    except RuntimeError as exc:
        if _is_oom_of(exc, len(x)):  # the chunk is halved
            raise
        return []
    if g is None:
        return []
    return torch.nonzero(~torch.isfinite(g).all(dim=1)).flatten().tolist()


def _features_move(model, x) -> np.ndarray:
    """Per row of ``x``: whether a random step of 1e-3 × the inputs' largest magnitude changes ``model``'s
    features (in the model's own dtype)."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), x.dtype) \
        if isinstance(model, torch.nn.Module) else x.dtype
    x = x.to(dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    step = torch.randn(x.shape, generator=gen, dtype=dtype).to(x.device) * (1e-3 * float(x.abs().max() or 1.0))
    moved, still = _features_pair(model, x + step, x)
    return (moved != still).any(dim=1).cpu().numpy()


#: A step whose float64 features came out exactly unchanged (D = 0) is +inf only if they stay
#: unchanged once ε is scaled up (never down) far enough that float64 would resolve the shift:
#: by ``c`` with ``c·max|J ε|`` (its float64 JVP, free of cancellation against the features' size)
#: this factor above float64's rounding of the features, ``u·max|a|``, and, for a second-order shift
#: (where J ε = 0), ``c·max|ε|`` this factor times ``sqrt(u)`` of the inputs' largest magnitude
#: (relative to the inputs, so that their units do not matter). Inputs the model ignores, dead ReLUs
#: and straight-through constants stay +inf; a full-rank model at σ ~1e-12 of its features' scale,
#: or with features offset by 1e17, no longer reads as +inf. Rounding inside the model (a bias of
#: 1e15 that a later layer takes away) is beyond what the outputs show: float64 is taken as exact there.
_RESOLUTION_MARGIN = 1e3

#: z from float64 passes is taken as exact while its relative rounding error, estimated as
#: ``u · ‖a(θ)‖ / ‖z‖`` (u: float64's unit roundoff), stays below ``_ROUNDING_TOLERANCE``; up to
#: ``_ROUNDING_LIMIT`` a bound may sit about that much above the valid one and a warning says so
#: (σ·s ≲ 1e-10 × the features' scale); beyond, D is not established and the step bounds nothing (0).
#: (A full-rank linear model at σ ~1e-12 of its features' RMS had targeted bounds above the exact
#: least-squares std without the limit: tests/test_bound.py.)
_ROUNDING_TOLERANCE = 1e-6
_ROUNDING_LIMIT = 1e-3


def _rounded_away(model64, x, eps, jacobian: str = "reverse") -> np.ndarray:
    """Per row of ``eps`` (steps at the inputs ``x``, one row each, whose float64 features did not
    move): whether the features move once the step is scaled up far enough for float64 to resolve its
    shift (:data:`_RESOLUTION_MARGIN`): then that D = 0 was rounding, not a direction the features do
    not see. A JVP that cannot be taken counts as rounding; one that runs out of memory is split in
    halves (the rows are independent), never taken for rounding."""
    return _halved(lambda x, eps: _rounded_away_rows(model64, x, eps, jacobian),
                   lambda first, second: np.concatenate([first, second]), x, eps)


def _rounded_away_rows(model64, x, eps, jacobian: str) -> np.ndarray:
    """:func:`_rounded_away` on all rows at once."""
    x64 = x.double()
    step = to_torch(eps).double().reshape(x64.shape)
    flat = step.reshape(len(step), -1)
    a = _features(model64, x64)
    resolution = np.finfo(np.float64).eps / 2 * a.abs().amax(dim=1)  # float64's rounding of the features
    try:
        jv = to_torch(TorchJacobian(model64, x64, mode=jacobian).matvec(from_torch(flat.contiguous())))
    except RuntimeError as exc:
        if _is_oom_of(exc, len(x64)):  # torch.OutOfMemoryError is a RuntimeError: split by _rounded_away, not "rounding"
            raise
        return np.ones(len(flat), dtype=bool)
    jmax, size = jv.abs().amax(dim=1), flat.abs().amax(dim=1)
    first = torch.where(jmax > 0, _RESOLUTION_MARGIN * resolution / torch.where(jmax > 0, jmax, 1.0), 1.0)
    reach = x64.reshape(len(x64), -1).abs().amax(dim=1)
    reach = math.sqrt(np.finfo(np.float64).eps / 2) * torch.where(reach > 0, reach, torch.ones_like(reach))
    second = _RESOLUTION_MARGIN * reach / torch.where(size > 0, size, torch.ones_like(size))
    grow = torch.clamp(torch.maximum(first, second), min=1.0)
    probe = x64 + step * grow.reshape((-1,) + (1,) * (step.dim() - 1))
    moved, still = _features_pair(model64, probe, x64)  # a again, in the pieces of the probe's pass
    return (moved != still).any(dim=1).cpu().numpy()


def _rounding_error(f0, z64):
    """Per row: float64's relative rounding error in ``‖z‖²`` (hence in D, and twice that in a bound),
    to first order: ``u·Σ|a_i||z_i| / Σ z_i²`` with ``a`` the clean features (rows of ``f0``, in the
    units of ``z``): each ``z_i = a_i(θ+ε) − a_i(θ)`` carries up to ``u·|a_i|``, and a feature that
    does not move adds nothing. 0 where z = 0. Each row is scaled by its largest |z_i| first, so that a shift
    whose squares underflow (1e-200) reads as the coarse shift it is, not as 0."""
    xp = get_array_module(z64)
    z = z64.reshape(z64.shape[0], -1)
    top = xp.max(xp.abs(z), axis=1) if z.shape[1] else xp.zeros(z.shape[0])
    safe = xp.where(top > 0, top, 1.0)
    zs = z / safe[:, None]
    num = np.finfo(np.float64).eps / 2 * xp.einsum("ij,ij->i", xp.abs(f0.reshape(f0.shape[0], -1).astype(xp.float64)),
                                                     xp.abs(zs))
    den = xp.einsum("ij,ij->i", zs, zs) * safe
    with np.errstate(over="ignore"):
        return xp.where(top > 0, num / xp.where(den > 0, den, xp.inf), 0.0)


def _rounding_magnitude(model64, x, f0, jacobian: str = "reverse"):
    """Per example (row of ``x``) and feature: the size float64's rounding of ``a(θ+ε) − a(θ)`` scales with,
    for :func:`_rounding_error`: ``|a_i(θ)|`` (``f0``), or ``|(J (θ⊙r))_i|`` (r: fixed random signs) where
    larger: the size of the input-sized terms a feature may cancel down from. ``Wθ + b`` with ``b ≈ −Wθ``
    (an input offset that the bias or a normalization removes) rounds at ``u·|Wθ|``, not ``u·|a|``: a linear
    model with inputs near 1e6 and features near 1 gave targeted bounds 1.04x the exact least-squares
    variance at σ = 3e-5 with no warning (its rounding estimate was ~1e-12). A JVP that cannot be taken
    leaves ``|a|``."""
    xp = get_array_module(f0)
    mag = xp.abs(f0.reshape(f0.shape[0], -1).astype(xp.float64))
    x64 = x.double()
    flat = x64.reshape(len(x64), -1)
    signs = torch.randint(0, 2, flat.shape[1:], generator=torch.Generator().manual_seed(0)) * 2 - 1
    try:
        jv = TorchJacobian(model64, x64, mode=jacobian).matvec(from_torch((flat * signs.to(flat)).contiguous()))
    except RuntimeError as exc:
        if _is_oom(exc):
            raise
        _warn_no_rounding_jvp(exc, "|a(theta)| alone, blind to input-sized terms the features cancel")
        return mag
    return xp.maximum(mag, xp.abs(xp.asarray(jv).reshape(mag.shape).astype(xp.float64)))


def _warn_no_rounding_jvp(exc: RuntimeError, fallback: str) -> None:
    """Say that the float64 JVP of a rounding estimate raised, and what the estimate took instead: the error
    may be the model's own (it was swallowed silently, and the bounds moved), and the estimate is weaker."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    validation.warn(f"the float64 JVP that sizes the forward passes' rounding raised RuntimeError ({first[:200]}); "
                    f"the rounding estimate takes {fallback}: if the model raised it, fix the model; if its float64 "
                    f"copy has no forward-mode derivative, pass jacobian='forward' or 'reverse' (the other one)")


def _rounding_slope(model64, x, jacobian: str = "reverse"):
    """Per row of ``x`` and feature: ``|(J r)_i|`` at that input (r: the same fixed random signs as
    :func:`_rounding_magnitude`'s, each of size 1), what an input-sized term adds to a feature per unit of
    its size. None where a JVP cannot be taken."""
    xp = array_module_for(x.device)
    x64 = x.double()
    flat = x64.reshape(len(x64), -1)
    signs = torch.randint(0, 2, flat.shape[1:], generator=torch.Generator().manual_seed(0)) * 2 - 1
    try:
        jv = TorchJacobian(model64, x64, mode=jacobian).matvec(
            from_torch(signs.to(flat).expand(flat.shape).contiguous()))
    except RuntimeError as exc:
        if _is_oom(exc):
            raise
        _warn_no_rounding_jvp(exc, "no slope term (the rounding of steps far from the input is sized from "
                                   "the input's)")
        return None
    return xp.abs(xp.asarray(jv).reshape(len(x64), -1).astype(xp.float64))


def _far_slope(model64, x, owner, eps64, jacobian: str = "reverse"):
    """For the steps ``eps64`` (rows, float64 as applied) at the inputs ``x[owner]`` (``owner``: a host array of
    example indices, one per step) that reach past
    the inputs (max|ε| > max|θ|): :func:`_rounding_slope` at ``θ + ε``, zero rows for the others; None where
    no step does. ``W(θ + ε)`` rounds at ``u·|W|·|θ + ε|`` however small the shift it leaves, so a huge step
    nearly in J's null space (a near-singular J) cancels terms of size ``|W|·|ε|`` down to its shift, which
    the example's magnitude (:func:`_rounding_magnitude`, sized to θ) does not see: a float64 tanh MLP's
    step of max|ε| = 1e14 at inputs near 50 gave a bound 1.0004× the exact one in 60-digit arithmetic, its
    rounding estimate 3e12 times too small. J is taken at θ + ε, not θ, since a step that saturates the
    units (σ = 1e30 against tanh features) leaves its rounding there, not its terms' size."""
    xp = get_array_module(eps64)
    owner = np.asarray(owner)
    x64 = x.double().reshape(len(x), -1)
    reach = to_host(xp.max(xp.abs(eps64), axis=1)) if eps64.shape[1] else np.zeros(len(eps64))
    far = reach > x64.abs().amax(dim=1).cpu().numpy()[owner]
    if not far.any():
        return None
    rows = np.flatnonzero(far)
    at = torch.as_tensor(owner[rows], device=x.device)
    pert = x64[at] + to_torch(eps64[xp.asarray(rows)]).to(x64)
    got = _rounding_slope(model64, pert.reshape((len(rows),) + tuple(x.shape[1:])), jacobian)
    if got is None:
        return None
    out = xp.zeros((len(eps64), got.shape[1]))
    out[xp.asarray(rows)] = got
    return out


def _step_magnitude(magnitude, slope, eps64, z64):
    """Per step (rows of ``eps64``, ``z64``; ``magnitude`` the rows of their examples, ``slope`` the steps'
    :func:`_far_slope`, may be None) and feature: the size float64's rounding of its ``z = a(θ+ε) − a(θ)``
    scales with: the example's (:func:`_rounding_magnitude`), the step's own input-sized terms
    ``slope·max|ε|``, whichever is larger, plus ``|z|`` (``a(θ+ε)`` itself rounds at ``u·|a(θ) + z|``)."""
    xp = get_array_module(z64)
    mag = magnitude.astype(xp.float64)
    if slope is not None:
        reach = xp.max(xp.abs(eps64), axis=1, keepdims=True) if eps64.shape[1] else xp.zeros((len(eps64), 1))
        mag = xp.maximum(mag, slope * reach)
    mag = mag + xp.abs(z64)   # (a fresh array: the callers' are not touched)
    return mag


#: Each feature of a certified shift z = a(θ+ε) − a(θ) is taken to lie within ``_ROUNDING_BRACKET·u·m_j`` of
#: its float64 value (u = 2^-53, m_j :func:`_step_magnitude`), and D is taken at the bracket's far end from 0
#: (:func:`_widened`): D grows with every |z_j| (Gaussian, Laplace), so that D is not below the exact one.
#: Without it float64's rounding of the forward passes, ~1e-13 of D at ordinary σ, was never counted: about
#: one mode in ten passed the exact |c_k|/√D of its step by up to 5.5e-14 (tanh, sigmoid, softplus, GELU MLPs
#: against 60-digit arithmetic), and by 3e-7 at σ = 1e-6 of the features' RMS. The measured errors reached
#: ~6× the first-order estimate (:func:`_rounding_error`) there; the bracket is 32×, which costs
#: ~64 × that estimate on D, 32 × on a bound (~1e-12 at ordinary σ, 3e-5 where the warning starts).
_ROUNDING_BRACKET = 32


def _widened(z64, mag, eps64=None, slope=None, moved=None):
    """``z64`` with every feature moved away from 0 by ``_ROUNDING_BRACKET·u·mag`` (see there), on the rows
    ``moved`` (default: those with a nonzero shift; a shift of exactly 0 stays 0, for the +inf rules). A
    feature whose float64 shift is exactly 0 moves by no more than its linearized reach, ``slope·max|ε|``
    (:func:`_rounding_slope`) where known: a constant feature of 1e12 beside moving ones (J's row 0) has no
    shift for rounding to hide, and must not swamp theirs."""
    xp = get_array_module(z64)
    if moved is None:
        moved = xp.any(z64 != 0, axis=1)
    w = (_ROUNDING_BRACKET * np.finfo(np.float64).eps / 2) * mag
    if slope is not None and eps64 is not None:
        reach = xp.max(xp.abs(eps64), axis=1, keepdims=True) if eps64.shape[1] else xp.zeros((len(eps64), 1))
        w = xp.where(z64 == 0, xp.minimum(w, slope * reach), w)
    w = xp.where(moved[:, None], w, 0.0)
    return z64 + xp.copysign(w, z64)   # away from 0 (a shift of +0 or -0: by w either way, D is even in it)


def _coarse_shifts(rel):
    """``(coarse, risky, worst)`` of the rounding errors ``rel`` (:func:`_rounding_error`): the rows
    where it may move D by more than :data:`_ROUNDING_LIMIT` (they bound nothing, 0), how many
    others pass :data:`_ROUNDING_TOLERANCE`, and the largest such estimate (0 if none). One host read."""
    xp = get_array_module(rel)
    coarse = rel > _ROUNDING_LIMIT
    risky = (rel > _ROUNDING_TOLERANCE) & ~coarse
    n_risky, worst = (float(v) for v in to_host(xp.stack([risky.sum().astype(xp.float64),
                                                            xp.where(risky, rel, 0.0).max()])))
    return coarse, int(n_risky), worst


def _damp_hint(damp: float) -> str:
    """What the small-shift warnings add where LSQR's damping, not σ, made the steps small."""
    return (f"; or a smaller LSQROptions(damp={shown_damp(damp):g}): the damping shrinks every eps toward 0, "
            f"and with it the shifts" if damp > 0 else "")


def _warn_rounding(what: str, n_coarse: int, n_risky: int, worst: float, damp: float = 0.0) -> None:
    """The warnings for :func:`_coarse_shifts`' rows, ``what`` naming them ("restarts"); ``damp``
    LSQR's damping where Algorithm 1's steps were LSQR's."""
    if n_coarse:
        validation.warn(f"{n_coarse} {what} moved the features so little next to their size that float64's "
                        f"rounding of a(theta+eps) - a(theta) may move D by more than {_ROUNDING_LIMIT:g} (relative): "
                        f"D is not established and they bound nothing (0); pass a sigma nearer the features' scale "
                        f"(hcrfast.rms_sigma(features, scale)){_damp_hint(damp)}")
    if n_risky:
        validation.warn(f"{n_risky} {what} moved the features so little next to their size that float64's rounding "
                        f"of a(theta+eps) - a(theta) may move D, and the bounds with it, by up to ~{worst:.1g} "
                        f"(relative); D is taken {_ROUNDING_BRACKET}x that far up, so their bounds are lower by up to "
                        f"~{_ROUNDING_BRACKET * worst:.1g} to stay below the exact ones: pass a sigma nearer the "
                        f"features' scale (hcrfast.rms_sigma(features, scale)){_damp_hint(damp)}")


#: How far (relative) a restart's last shift in the model's dtype may stray from the certified
#: float64 one before :func:`_dtype_drift` counts it: past it, the dtype's rounding of
#: a(θ+ε) − a(θ) is a sizeable part of the z that set each next step's target.
_DRIFT_LIMIT = 0.1


def _dtype_drift(z, z64):
    """Per row, how far the shift ``z`` in the model's dtype strays from the certified float64 shift
    ``z64``, relative to ``‖z64‖`` (0 where ``z64`` is 0 or the stray not finite): a device array.

    Algorithm 1 sets each next step's target from ``z`` (the restart step, in the model's dtype).
    Where ``σ·size`` is small next to the features, that difference is mostly the dtype's rounding
    of the features: the steps then follow rounding. Their certified bounds stay rigorous, but
    they follow the rounding too: a linear float32 model's no longer scale with σ (some modes'
    rose 11× over σ's scaling at 1e-4 of the features' RMS, others did not). The last shift
    stands for the earlier ones: every step has the same size. :func:`_drift_count` counts the
    rows past ``_DRIFT_LIMIT`` whose bounds the result takes.
    """
    xp = get_array_module(z64)
    z64 = z64.astype(xp.float64)
    size = xp.sqrt(xp.sum(z64 * z64, axis=1))
    dz = z.astype(xp.float64) - z64
    stray = xp.where(size > 0, xp.sqrt(xp.sum(dz * dz, axis=1)) / xp.where(size > 0, size, 1.0), 0.0)
    return xp.where(xp.isfinite(stray), stray, 0.0)


def _drift_count(stray, taken) -> tuple[int, float]:
    """``(count, worst)`` of the rows of ``stray`` (:func:`_dtype_drift`, (m, R)) past ``_DRIFT_LIMIT``
    among those ``taken`` (a bool (m, 1) or (m, R): the examples where Algorithm 1's bound is some
    mode's largest, not the singular steps'): one host read."""
    xp = get_array_module(stray)
    past = (stray > _DRIFT_LIMIT) & taken
    count, worst = to_host(xp.stack([xp.sum(past).astype(xp.float64), xp.max(xp.where(past, stray, 0.0))]))
    return int(count), float(worst)


_BLIND = "J = 0 here"  # how a zero-step reason names a blind example (counted by the warnings)
_UNRESOLVED = "not float64"  # how a zero-step reason names D = 0 from uncertified lower-precision passes
_ROUNDED = "below float64's resolution"  # how it names D = 0 from a step float64 could not resolve
_COARSE = "within float64's rounding"  # how it names a shift too small for float64 to give D reliably

#: Why a restart bounds nothing, by the marker its zero-step reason carries (no marker: its eps came
#: out 0 in the solver's dtype): what the warnings, Bounds.summary and reproduce count.
_ZERO_STEP_MARKERS = (("at_zero_jacobian", _BLIND), ("rounded", _ROUNDED), ("coarse", _COARSE),
                      ("uncertified", _UNRESOLVED))


def zero_step_kind(reason: str) -> str:
    """The kind of one of ``params["zero_step_reasons"]``: "at_zero_jacobian", "rounded" (D = 0 below
    float64's resolution), "coarse" (D not established), "uncertified" or "eps_zero"."""
    return next((kind for kind, marker in _ZERO_STEP_MARKERS if marker in reason), "eps_zero")


def _zero_step_reasons(lost: np.ndarray, start: int, model, rows) -> list:
    """Why the restarts ``lost`` (examples × restarts, host bools) have ε = 0 and bound nothing: one line
    each, naming the cause: a step outside the range of the solver's dtype, or J = 0 at their example
    (``rows``: the chunk's inputs, one per example; a random step leaves the features unchanged)."""
    examples = np.flatnonzero(lost.any(axis=1))
    if examples.size == 0:
        return []
    chosen = rows[torch.as_tensor(examples)]
    still = (~_features_move(model, chosen)).tolist()
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), chosen.dtype) \
        if isinstance(model, torch.nn.Module) else chosen.dtype   # (the float64 copy, for a float32 batch)
    g = _random_vjp(model, chosen.to(dtype))   # torch's J: 0 at x**2 at 0, though a finite step moves the features
    flat = [True] * len(examples) if g is None else (~g.any(dim=1)).tolist()
    blind = dict(zip(examples.tolist(), still))
    why = {e: ("the features do not move with this example's input" if s else
               "torch's derivative of the features is 0 at this example's input, though a finite step moves them: "
               "x**2 or x**3 at 0, a quantizer" if f else None) for e, s, f in zip(examples.tolist(), still, flat)}
    tail = "; hcrfast.targeted_bound(..., null_probes=True) certifies +inf for the modes the features do not see"
    return [f"example {start + e}, restart {r}: " + (
        f"{_BLIND} ({why[e]}), so Algorithm 1 has no direction and this restart bounds nothing (0)"
        + (tail if blind[e] else "") if why[e] else
        "eps came out 0 (a step outside the range the solver's dtype resolves), so this restart bounds nothing (0)")
        for e, r in zip(*np.nonzero(lost))]


#: A mode's coordinate c = ⟨b, ε⟩ (b a unit vector: a DCT mode, a target's direction) is a float64 sum of
#: ``terms`` products, within about (terms + 8)·2^-53·‖ε‖ of the exact one (a transform by FFT: less); √D and
#: the division each round by half an ulp. :func:`coordinates_down` lowers |c| by twice the first and by a
#: relative :data:`_DIVISION_SLACK`, so that |c|/√D, D rounded up (:func:`hcrfast.noise.divergence_of`),
#: never exceeds the exact bound; a coordinate within its rounding of 0 bounds nothing.
_COORD_ROUNDING_TERMS = 16
_DIVISION_SLACK = 2.0 ** -50


def coordinates_down(coords, norms, terms: int):
    """|c| lowered by its float64 rounding (see :data:`_DIVISION_SLACK`): ``coords`` the magnitudes (any
    shape), ``norms`` ‖ε‖ of their steps broadcast against them, ``terms`` the products each sums (0: exact,
    the pixel basis)."""
    xp = get_array_module(coords)
    if terms:
        coords = xp.maximum(coords - (terms + _COORD_ROUNDING_TERMS) * D_ROUNDING_UNIT * norms, 0.0)
    return coords * (1.0 - _DIVISION_SLACK)


def coordinate_terms(basis: str, input_shape) -> int:
    """The products each mode coordinate of ``basis`` sums: H·W for the DCT over the last two axes, 0 (exact)
    for the pixel basis."""
    return math.prod(tuple(input_shape)[-2:]) if basis == "dct" else 0


#: Values of one slice of :func:`_cross_bounds`' (examples × targets × modes) coordinates.
_CROSS_VALUES = 1 << 24


def _cross_bounds(targeted, basis: str, input_shape) -> object:
    """Per example and mode j, the best bound the targeted steps give mode j: ``max_k |(Q ε_k)_j| / √D_k``,
    shape (B, p).

    A targeted step ε_k is aimed at mode k, but (5) holds for every coordinate with the same ε and D: its
    certified shift bounds every mode it moves. Only steps whose own bound is finite and positive count:
    not those the rounding guards zeroed, nor D = 0 steps, whose +inf is claimed for their own mode only,
    nor null-space probes (``targeted_bound``'s), whose D is rounding by design and skips those guards.
    ``hcrfast reproduce digits --targets low:4`` (16 of 64 modes targeted): 82.2% of the other 48 modes'
    bounds lifted above Algorithm 1's, median gain 1.84×; with ``low:8`` (every mode), 92.4% of the bounds
    lifted against 63.8% with each step counted for its own mode only.
    """
    xp = get_array_module(targeted.std)
    B, K = targeted.divergence.shape
    p = math.prod(input_shape)
    own = targeted.std.reshape(B, p)[:, xp.asarray(targeted.modes)]
    d = targeted.divergence
    valid = xp.isfinite(own) & (own > 0) & xp.isfinite(d) & (d > 0)
    if targeted.from_null_space is not None:  # a null-space probe's D is rounding by design: its own mode only
        valid &= ~xp.asarray(targeted.from_null_space, dtype=bool)
    inv_sqrt_d = xp.where(valid, 1.0 / xp.sqrt(xp.where(valid, d, 1.0)), 0.0)
    out = xp.zeros((B, p))
    if K == 0:
        return out
    step = max(1, _CROSS_VALUES // (K * p))
    for b0 in range(0, B, step):
        b1 = min(B, b0 + step)
        coords = targeted.eps[b0:b1].reshape(((b1 - b0) * K,) + tuple(input_shape))
        if basis == "dct":
            coords = kernels.dct2(coords)
        steps = targeted.eps[b0:b1].reshape(b1 - b0, K, p).astype(xp.float64)
        norms = xp.sqrt(xp.einsum("bkp,bkp->bk", steps, steps))
        lowered = coordinates_down(xp.abs(coords.reshape(b1 - b0, K, p)), norms[..., None],
                                   coordinate_terms(basis, input_shape))
        with np.errstate(over="ignore"):
            per_step = lowered * inv_sqrt_d[b0:b1, :, None]
        out[b0:b1] = xp.minimum(per_step.max(axis=1), _FLOAT64_MAX)
    return out


def _certified_shift(model64, x, eps):
    """ε as actually applied and ``z = a(θ+ε) − a(θ)`` in float64 (forward passes)."""
    x64, pert, eps64 = _applied64(x, eps)
    moved, still = _features_pair(model64, pert, x64)
    return from_torch(eps64), from_torch(moved - still)


def _applied64(x, eps):
    """``(x, x + ε, ε as applied)`` in float64, ε flat per row: exact where |x| >= |eps| (Fast2Sum), else
    within an ulp of eps (relative 1e-16)."""
    x64 = x.double()
    pert = x64 + to_torch(eps).reshape(x.shape).double()
    return x64, pert, (pert - x64).reshape(x.shape[0], -1)


#: ``bound(iterates="all")``: the earlier iterates' bounds are taken a slice of iterates at a time, each
#: slice's arithmetic holding a few arrays of at most this many values (examples × iterates × restarts ×
#: modes; one iterate a slice at least): 2 GiB of float64 for the ~4 of them at once.
_EARLIER_VALUES = 2**26


def _certified_iterates(model64, x, owner, eps, at=None):
    """:func:`_certified_shift` of the earlier iterates (``bound(iterates="all")``): the rows ``eps``, each a
    step at the example ``x[owner[row]]``, with ``a(θ)`` taken once per example instead of once per row,
    which halves the passes. The last iterates' certification computes both sides in the same pieces, so
    that an unchanged row is bitwise 0 there; here a row the model maps identically may come out a rounding
    apart (another batch shape), which the rounding guard then finds (D not established: 0, no +inf):
    never a bound the passes do not support. ``at``: a dict the chunk's calls share, holding ``a(θ)`` of ``x``
    once taken (the same pass of the same rows each time: the singular steps' pieces took it again, one
    float64 pass of the chunk a piece, 4 % of a CIFAR-10 CNN call)."""
    _, pert, eps64 = _applied64(x[owner], eps)
    if at is None or "still" not in at:
        still = _features(model64, x.double())
        if at is not None:
            at["still"] = still
    else:
        still = at["still"]
    moved = _features(model64, pert)
    return from_torch(eps64), from_torch(moved - still[owner])


#: :func:`_screen_earlier`: each earlier step's uncertified feature shift is taken to be within ``margin·u·
#: magnitude`` of the certified one, feature by feature (u: the model dtype's unit roundoff; magnitude:
#: :func:`_rounding_magnitude`), with ``margin`` per example ``_SCREEN_MARGIN`` times the largest stray of
#: its last iterates' uncertified D from their certified D, in units of that bracket's (at least
#: ``_SCREEN_FLOOR``). The last iterates' strays, in those units, were 0.99 (ResNet-18), 1.43 (CIFAR-10
#: CNN) and 1.68 (MNIST MLP) in float32; a margin of 1 would have lost nothing on any of them.
#: ``math.inf`` certifies every earlier iterate; 0 trusts the uncertified shifts outright.
_SCREEN_MARGIN = 2.0
_SCREEN_FLOOR = 0.5


def _screen_earlier(eps, z, eps64, z64, z_last, magnitude, noise, *, restarts: int, input_shape, basis, unit: float,
                    impl: str = "auto", slope=None, theta_max=None):
    """Which earlier iterates ``bound(iterates="all")`` certifies: the steps whose certified bound could
    raise some mode above what the certified steps give it. ``(take, margin)``: a bool (examples, k·R)
    host array and the widest margin used (a float).

    ``eps``, ``z``: the earlier steps, rows example-major (k·R an example), ``z`` the feature shift the restart
    step computed in the model's dtype, whose rounding ``unit`` is. ``eps64``, ``z64``: the last iterates,
    certified (R rows an example), and ``z_last`` their shifts as the restart step computed them. Each
    feature of a certified shift is taken to lie within ``margin·unit·magnitude`` of the uncertified one,
    ``margin`` calibrated on the example's last iterates (:data:`_SCREEN_MARGIN`), and D grows with each
    |z_j| (Gaussian, Laplace), so each step's D is bracketed, ``[D_lo, D_hi]``, and its bound on mode m,
    ``[lo, up] = |c_m|·[1/sqrt(D_hi), 1/sqrt(D_lo)]``.
    Per example and mode, ``L`` is the largest of the last iterates' certified bounds (0 where the rounding
    guard could zero them) and of the steps' ``lo`` (0 for steps the guard could zero); a step is certified
    where its ``up`` passes ``L`` on some mode, or where its ``lo`` is the one that set ``L`` (so ``L`` is
    certified); likewise for eq. (6), ``‖ε‖²/(p·D)``, whose largest step names ``mse``, ``eps``, ``z`` and
    ``best_restart``. A step not certified could thus not have raised any mode's bound nor eq. (6) (ties
    aside). Where the bracket does not hold (a model whose rounding the estimate misses), a mode may keep a
    smaller bound, but every bound reported stays one the float64 passes certify. A step whose bracket is
    not finite (D_lo = 0, ε not finite) is always certified, a step ε = 0 never (it bounds nothing). The
    mode coordinates are taken for a slice of examples at a time (:data:`_EARLIER_VALUES`)."""
    xp = get_array_module(eps)
    P, p = eps64.shape
    m = P // restarts
    K = eps.shape[0] // m
    n = z.shape[1]
    # ``slope``: the examples' :func:`_rounding_slope` (the cap of _widened), ``theta_max`` their max|θ| (a step
    # past it has its rounding sized by assess at θ + ε: _far_slope)
    theta_max = xp.full(m, xp.inf) if theta_max is None else xp.asarray(theta_max)
    # the last iterates' D and rounding as assess certifies them (float64's bracket: _widened)
    rows_slope = None if slope is None else xp.repeat(slope, restarts, axis=0)
    mag64 = _step_magnitude(xp.repeat(magnitude, restarts, axis=0), None, eps64, z64)
    d = divergence_of(noise, _widened(z64, mag64, eps64, rows_slope)).reshape(m, restarts)
    rel = _rounding_error(mag64, z64).reshape(m, restarts)
    del mag64, rows_slope
    # a step past the inputs' size has its rounding sized at θ + ε by assess (_far_slope): it sets no L here
    near = (xp.max(xp.abs(eps64), axis=1).reshape(m, restarts) <= theta_max[:, None]) if p else True
    ok = xp.isfinite(d) & (d > 0) & (rel <= _ROUNDING_LIMIT) & near
    inv_d = xp.where(ok, 1.0 / xp.where(ok, d, 1.0), 0.0)
    # the margin: how far the last iterates' uncertified D strayed from the certified, in units of the
    # first-order bracket's half-width (margin 1), the largest over the example's restarts
    unit_err = unit * xp.repeat(magnitude, restarts, axis=0)
    with np.errstate(over="ignore", invalid="ignore"):
        d_last = divergence_of(noise, z_last.astype(xp.float64)).reshape(m, restarts)
        half = divergence_of(noise, xp.abs(z64) + unit_err).reshape(m, restarts) - d
        stray = xp.where(ok & xp.isfinite(d_last) & (half > 0), xp.abs(d_last - d) / xp.where(half > 0, half, 1.0), 0.0)
    margin = _SCREEN_MARGIN * xp.maximum(stray.max(axis=1), _SCREEN_FLOOR)   # (m,)
    del unit_err
    z32 = z.astype(xp.float64)
    zz = xp.abs(z32).reshape(m, K, n)
    finite_eps = xp.where(xp.isfinite(eps), eps, 0).astype(xp.float64)
    err = (margin[:, None] * unit * magnitude).reshape(m, 1, n)
    with np.errstate(over="ignore", invalid="ignore"):
        d_lo = divergence_of(noise, xp.maximum(zz - err, 0.0).reshape(m * K, n)).reshape(m, K)
        # the far end also past float64's bracket of the certified passes (_widened), which assess adds
        hi = (zz + err).reshape(m * K, n)
        hi += (_ROUNDING_BRACKET * np.finfo(np.float64).eps / 2) * _step_magnitude(
            xp.repeat(magnitude, K, axis=0), None, finite_eps, hi)
        d_hi = divergence_of(noise, hi).reshape(m, K)
        del hi
    del zz
    finite = xp.all(xp.isfinite(eps), axis=1).reshape(m, K)
    sure = finite & xp.isfinite(d_lo) & (d_lo > 0)   # a bracket: else always certified
    up = xp.where(sure, 1.0 / xp.sqrt(xp.where(sure, d_lo, 1.0)), xp.inf)
    # a step float64's rounding might zero (the guard's coarse shifts) sets no lower bound
    fine = _rounding_error(_step_magnitude(xp.repeat(magnitude, K, axis=0), None, finite_eps, z32),
                           z32).reshape(m, K) <= _ROUNDING_LIMIT / 10
    # (a step past the inputs' size: its rounding is sized at θ + ε once certified, so it sets no lower bound)
    fine &= (xp.max(xp.abs(finite_eps), axis=1).reshape(m, K) <= theta_max[:, None]) if p else True
    del z32
    has_hi = sure & fine & xp.isfinite(d_hi) & (d_hi > 0)
    low = xp.where(has_hi, 1.0 / xp.sqrt(xp.where(has_hi, d_hi, 1.0)), 0.0)
    # ‖ε‖²/p, 0 for a step with a non-finite entry (always certified; huge finite entries beside it would give
    # inf, and inf·0 a NaN that no comparison passes)
    sq = xp.where(finite, (xp.einsum("ij,ij->i", finite_eps, finite_eps) / p).reshape(m, K), 0.0)
    del finite_eps
    with np.errstate(over="ignore", invalid="ignore"):
        # eq. (6): the last iterates' certified, then the steps' brackets
        lb_mse = ((xp.einsum("ij,ij->i", eps64, eps64).reshape(m, restarts) / p) * inv_d).max(axis=1)
        mse_lo, mse_up = sq * low * low, xp.where(sq > 0, sq * up * up, 0.0)
        take = ~sure | (mse_up > xp.maximum(lb_mse, mse_lo.max(axis=1))[:, None])
        lead = xp.argmax(mse_lo, axis=1)
        examples = xp.arange(m)
        take[examples, lead] |= mse_lo[examples, lead] > lb_mse
        per = max(1, _EARLIER_VALUES // max(1, K * p))   # examples a slice
        for b0 in range(0, m, per):
            b1 = min(m, b0 + per)
            mb = b1 - b0
            last = _mode_coords(eps64[b0 * restarts:b1 * restarts], input_shape, basis, impl).reshape(mb, restarts, p)
            lb = (last * xp.sqrt(inv_d[b0:b1])[..., None]).max(axis=1)   # (mb, p)
            del last
            c = _mode_coords(eps[b0 * K:b1 * K], input_shape, basis, impl).reshape(mb, K, p)
            c = xp.where(finite[b0:b1, :, None], c, 0.0)   # a NaN step (always certified) sets nothing here
            lo = c * low[b0:b1, :, None]
            best, at = lo.max(axis=1), lo.argmax(axis=1)   # (mb, p)
            del lo
            bound = xp.maximum(lb, best)
            c *= up[b0:b1, :, None]
            c[c != c] = 0.0   # 0 · inf: a mode the step does not move
            take[b0:b1] |= xp.any(c > bound[:, None, :], axis=2)
            del c
            # the steps whose lower bound set L somewhere: certified, so that L is
            rows, modes = xp.nonzero(best > lb)
            take[b0 + rows, at[rows, modes]] = True
    take &= xp.any(eps != 0, axis=1).reshape(m, K)   # ε = 0 (NaN counts as moved) bounds nothing: no pass
    return to_host(take), float(to_host(margin.max()))


#: :func:`_screen_in_part`: the examples of a chunk screened first, to see whether screening the others pays: an
#: eighth of them (at least one; all of a chunk of fewer than ``_SCREEN_SAMPLE_MIN``); the others are screened where
#: it spared at least ``_SCREEN_SPARED`` of their moved steps
_SCREEN_SAMPLE = 8
_SCREEN_SAMPLE_MIN = 4
_SCREEN_SPARED = 0.5


def _screen_in_part(eps, z, eps64, z64, z_last, magnitude, noise, *, restarts: int, input_shape, basis, unit: float,
                    impl: str = "auto", slope=None, theta_max=None, sample: bool = True):
    """:func:`_screen_earlier`, with ``sample`` (CPUs) on a chunk's first examples first, then on the others only
    where it spared at least :data:`_SCREEN_SPARED` of the first examples' moved steps; else ``(None, None)``:
    every step is certified, as where no screen runs. On the MNIST MLP a float64 forward costs about what the
    screen's arithmetic on a step does: the screen spared 61 of 14,400 steps of 64 examples and took 0.36 to
    1.1 s of a 2.0 to 3.5 s call (35 % less without it, the same bounds); on random inputs it spared 23 % and
    the call took 1.17 times as long as without it (benchmarks/screen_sample.py). On the CIFAR-10 CNN it spares
    ~85 %, each pass ~100 times its cost; ResNet-18 alike (2026-12-02). A count, not a time: the bounds of the steps certified come from
    float64 passes over other rows where the screen decides otherwise, and may differ by their rounding; a
    decision by the clock made the same call's bits differ from run to run."""
    m = eps64.shape[0] // restarts
    K = eps.shape[0] // m
    first = m if not sample or m < _SCREEN_SAMPLE_MIN else max(1, -(-m // _SCREEN_SAMPLE))

    def screen(b0, b1):
        return _screen_earlier(eps[b0 * K:b1 * K], z[b0 * K:b1 * K], eps64[b0 * restarts:b1 * restarts],
                               z64[b0 * restarts:b1 * restarts], z_last[b0 * restarts:b1 * restarts],
                               magnitude[b0:b1], noise, restarts=restarts, input_shape=input_shape, basis=basis,
                               unit=unit, impl=impl, slope=None if slope is None else slope[b0:b1],
                               theta_max=None if theta_max is None else theta_max[b0:b1])

    take, margin = screen(0, first)
    if first == m:
        return take, margin
    xp = get_array_module(eps)
    moved = np.asarray(to_host(xp.any(eps[:first * K] != 0, axis=1))).reshape(first, K)
    if (~take & moved).sum() >= _SCREEN_SPARED * moved.sum():   # (take: a host array)
        rest, rest_margin = screen(first, m)
        return np.concatenate([take, rest]), max(margin, rest_margin)
    return None, None   # every step certified (a screened step's bookkeeping cost the MLP's call 0.6 s more)


def _mode_coords(eps, input_shape, basis, impl: str = "auto"):
    """|coordinates| of the steps ``eps`` (rows) in the modes of ``basis`` ("dct": the orthonormal DCT-II
    over the last two axes of ``input_shape``; else the inputs' own), float64, one row each."""
    xp = get_array_module(eps)
    coords = eps.astype(xp.float64).reshape((eps.shape[0],) + tuple(input_shape))
    if basis == "dct":
        coords = kernels.dct2(coords, impl=impl)
    return xp.abs(coords.reshape(eps.shape[0], -1))


def _applied_shift(model, x, eps, f0):
    """Uncertified: ε as rounded into the input dtype and z in that dtype."""
    pert = x + to_torch(eps).reshape(x.shape)
    eps_applied = (pert - x).reshape(x.shape[0], -1)
    z = from_torch(_features(model, pert)) - f0
    xp = array_module_for(x.device)
    return from_torch(eps_applied).astype(xp.float64), z.astype(xp.float64)


def _auto_chunk(model, batch, restarts: int, n: int, p: int, jacobian: str) -> int:
    """Examples per chunk: a fixed element budget on the CPU; on CUDA, what fits in free memory.

    On CUDA the memory of one recorded product graph (a JVP and a VJP) is measured on
    two rows and scaled. Each problem counts it twice, since compaction records a graph
    for the problems still running while the chunk's first one is alive, plus the
    solver's ~16 vectors of n + p values. 60% of the free memory is used (after the
    torch and CuPy pools gave back their cached blocks); an out-of-memory error still
    halves the chunk.
    """
    if batch.device.type != "cuda":
        fit = max(1, _CHUNK_ELEMENTS // (restarts * (n + p)))
        graph = _graph_row_bytes(model, batch)
        return fit if graph is None else min(fit, max(1, GRAPH_BYTES // (graph * restarts)))
    free, graph_per_row = _free_and_graph_bytes(model, batch, n, jacobian)
    per_row = 2 * graph_per_row + 16 * (n + p) * batch.element_size() + 8 * (n + p)
    fit = int(0.6 * free) // per_row
    return max(1, fit // restarts)


def _free_and_graph_bytes(model, batch, n: int, jacobian: str) -> tuple[int, int]:
    """Free device memory (after the pools gave back their cached blocks) and the memory one row's
    recorded product graph (a JVP and a VJP) takes, measured on two rows."""
    torch.cuda.synchronize(batch.device)
    release_device_memory(batch.device)
    free, _ = torch.cuda.mem_get_info(batch.device)
    before = torch.cuda.memory_allocated(batch.device)
    torch.cuda.reset_peak_memory_stats(batch.device)
    rows = batch[:1].repeat_interleave(2, dim=0)
    probe = TorchJacobian(model, rows, mode=jacobian)
    probe.matvec(from_torch(torch.zeros_like(rows).reshape(2, -1)))
    probe.rmatvec(from_torch(torch.zeros((2, n), dtype=batch.dtype, device=batch.device)))
    graph_per_row = max(1, (torch.cuda.max_memory_allocated(batch.device) - before) // 2)
    del probe
    return free, graph_per_row


def resolve_solver(solver: str, linearize_at: str, device: torch.device, n: int, p: int, *,
                   lsqr_given: bool = False) -> str:
    """The solver ``bound(solver=...)`` uses. "auto", with ``linearize_at="input"`` and no LSQR options
    given: dense on the CPU for small inputs (the rule of :data:`DENSE_SOLVE_MAX_INPUTS`), the Krylov
    basis on CUDA and for inputs beyond those limits (:data:`KRYLOV_MIN_INPUTS`); LSQR otherwise
    (``linearize_at="current"``, or ``lsqr=`` options given)."""
    validation.choice("solver", solver, SOLVERS)
    beyond = p >= KRYLOV_MIN_INPUTS or n * p > DENSE_SOLVE_MAX_VALUES  # the dense solve's limits
    if solver == "dense" and beyond:
        validation.warn(f"solver='dense' builds every example's J: {n} features x {p} inputs = {n * p:,} values, "
                        f"{5 * n * p * 8 / 2**30:.1f} GiB of float64 work per example (J, its factor and "
                        f"pseudo-inverse), formed by {n:,} VJPs or {p:,} JVPs; that is beyond the dense "
                        f"solve's limits ({DENSE_SOLVE_MAX_INPUTS} inputs, {DENSE_SOLVE_MAX_VALUES:,} values), "
                        f"where solver='auto' takes the Krylov basis (solver='krylov')")
    if solver != "auto":
        return solver
    if linearize_at != "input" or lsqr_given:
        return "lsqr"
    if beyond:
        return "krylov"
    return "dense" if torch.device(device).type == "cpu" else "krylov"


def resolve_singular_steps(singular_steps, solver: str, n: int, p: int, *, gaussian: bool = True) -> int:
    """``singular_steps="auto"``: :data:`AUTO_SINGULAR_STEPS`, at most min(n, p) (J's rank), where the
    resolved ``solver`` is dense or Krylov (their factorizations give the directions without a model
    product) and the noise Gaussian (the steps are scaled to a Gaussian shift); else 0. A count is
    returned as given up to min(n, p), and capped there with a warning: J has no more singular directions."""
    if singular_steps != "auto":
        if singular_steps > min(n, p):
            warnings.warn(f"singular_steps={singular_steps}: J ({n} features x {p} inputs) has at most min(n, p) = "
                          f"{min(n, p)} singular directions; taking those {min(n, p)}", validation.HcrfastUserWarning,
                          stacklevel=3)
            return min(n, p)
        return singular_steps
    return min(AUTO_SINGULAR_STEPS, n, p) if solver in ("dense", "krylov") and gaussian else 0


def _pilots_need_krylov(krylov_pilots: int, solver: str) -> str:
    return (f"krylov_pilots={krylov_pilots} applies to solver='krylov' only, but this call solves with {solver!r}; "
            f"pass solver='krylov', or leave krylov_pilots at its default ('auto', which the other solvers ignore)")


def _dense_values(n: int, p: int, restarts: int) -> int:
    """Values one example of the dense solve holds on the host's path (:func:`_dense_chunk`)."""
    return 5 * n * p + n * n + 8 * restarts * (n + p)


def _dense_chunk(batch, restarts: int, n: int, p: int) -> int:
    """Examples per chunk of the dense solve: J (n·p) in float32 and float64, its live rows, the Gram
    matrix and the pseudo-inverse (≤ 4·n·p + n² float64 values) plus the restarts' vectors; on CUDA, with
    a device routine as ``dense.EIGH_IMPL``, also its own arrays (the Gram matrix symmetrized and copied,
    the eigenvectors, the core (Gram)⁺: ~6 more of order min(n, p)). The singular steps are left out
    (K = 64: their directions, steps and shifts ~2.5·K·(n + p) values, certified in pieces of the restarts'
    rows; a tenth of 5·n·p on the MNIST MLP), so that they leave the chunks, and so Algorithm 1's bounds,
    bitwise as without them."""
    per_example = _dense_values(n, p, restarts)
    if batch.device.type != "cuda":
        return max(1, _DENSE_ELEMENTS // per_example)
    from hcrfast.kernels import symmetric

    if dense.EIGH_IMPL in symmetric.DEVICE_IMPLS:
        per_example += 6 * min(n, p) ** 2
    torch.cuda.synchronize(batch.device)
    release_device_memory(batch.device)
    free, _ = torch.cuda.mem_get_info(batch.device)
    return max(1, int(0.5 * free) // (8 * per_example))


def _earlier_chunk(batch, earlier_steps: int, n: int, p: int) -> int | None:
    """On CPUs with ``iterates="all"``, the most examples a chunk may hold for their ``earlier_steps`` (R·(i − 1))
    earlier steps to fit :data:`_EARLIER_ELEMENTS`; None where there is no such cap (none, or CUDA, whose
    certifying pass is halved on out-of-memory). Without it a chunk sized for the solver alone held several
    GiB of earlier steps at large R·i (MNIST MLP, R = 200, i = 50: 6.2 GiB peak against 0.9 with
    ``iterates="last"``), where the kernel's out-of-memory killer, not a MemoryError, ends a run."""
    if not earlier_steps or batch.device.type == "cuda":
        return None
    return max(1, _EARLIER_ELEMENTS // (_EARLIER_PER_STEP * earlier_steps * (n + p)))


def _krylov_chunk(model, batch, restarts: int, n: int, p: int, jacobian: str, options: LSQROptions,
                  pilots: int = 1) -> int:
    """Examples per chunk of the Krylov solve: each keeps up to ``pilots`` ×
    :func:`hcrfast.krylov.basis_values` values; on CPUs a fixed budget, on CUDA what fits in free
    memory beside the product graphs and the restarts' vectors (measured as in :func:`_auto_chunk`).
    The singular steps are left out, as in :func:`_dense_chunk` (~2.5·K·(n + p) values against the
    bases' pilots·steps·(n + p))."""
    values = pilots * krylov.basis_values(n, p, options)
    if batch.device.type != "cuda":
        # the bases, and per pilot and restart ~16 rows of n + p 4-byte values: LSQR's vectors, the
        # restarts' z̃, ε, features and their float64 certification (R = 400 doubled the peak without); the
        # pilots' product graphs held to GRAPH_BYTES
        fit = max(1, _KRYLOV_ELEMENTS // (values + 16 * (pilots + restarts) * (n + p)))
        graph = _graph_row_bytes(model, batch)
        return fit if graph is None else min(fit, max(1, GRAPH_BYTES // (graph * pilots)))
    free, graph_per_row = _free_and_graph_bytes(model, batch, n, jacobian)
    # The basis, two product graphs (the chunk's and the compacted one's), LSQR's vectors on one row,
    # and the restarts' own vectors (z̃, ε, features, their float64 certification) on R rows.
    per_example = ((values + 16 * pilots * (n + p)) * batch.element_size() + 2 * pilots * graph_per_row
                   + restarts * 8 * (n + p) * 8)
    return max(1, int(0.6 * free) // per_example)


def _krylov_params(steps, ranks, pilots: int, redone=None, passes=None, auto: bool = False) -> dict:
    """``Bounds.params["krylov"]``: the bases' sizes (``steps``: examples × pilots) and their products
    per example: ``products_per_example``, what the model computed (``passes``: steps through the
    operator, :attr:`hcrfast.krylov.KrylovBasis.passes`, stopped examples riding along in their batch
    included; a negative entry, from a checkpoint written before they were counted, counts as
    ``steps + redone``), and ``products_needed_per_example``, what each basis needed (``redone``: steps
    run twice, :attr:`hcrfast.krylov.KrylovBasis.redone`); ``pilots_auto``: the pilots were chosen by
    ``krylov_pilots="auto"`` (:func:`hcrfast.krylov.resolve_pilots`)."""
    steps = np.asarray(steps).reshape(-1, pilots)
    redone = np.zeros_like(steps) if redone is None else np.asarray(redone).reshape(-1, pilots)
    needed = steps + redone
    passes = needed if passes is None else np.asarray(passes).reshape(-1, pilots)
    passes = np.where(passes < 0, needed, passes)
    return dict(pilots=pilots, pilots_auto=bool(auto), steps_median=float(np.median(steps)), steps_max=int(steps.max()),
                rank_median=float(np.median(ranks)), rank_min=int(np.min(ranks)),
                steps_redone_mean=float(redone.sum(axis=1).mean()),
                products_per_example=float(np.mean((2 * passes + 1).sum(axis=1))),
                products_needed_per_example=float(np.mean((2 * needed + 1).sum(axis=1))))


def _span(start: int, stop: int) -> str:
    """The progress lines' rows of a chunk: "example 4", "examples 0-7" (one example read "examples 0-0")."""
    return f"example {start}" if stop - start == 1 else f"examples {start}-{stop - 1}"


def _plan_line(examples: int, restarts: int, iterations: int, solver: str, pilots, steps: int, singular: int,
               chunk: int, given: bool, iterates: str, certify: bool) -> str:
    """``progress=True``'s first line of a :func:`bound` call: what it will compute, with which solver, in chunks
    of how many examples."""
    how = {"dense": "the dense solve (J built and factored once per example)",
           "lsqr": "LSQR (matrix-free, one solve per step)",
           "krylov": f"the Krylov basis ({counted(int(pilots), 'pilot')} an example, at most {steps} steps each)"
           }.get(solver, solver)
    chunks = -(-examples // max(1, chunk))
    return (f"{counted(examples, 'example')} x {counted(restarts, 'restart')} x {counted(iterations, 'iteration')}"
            f"{' (every iterate certified)' if iterates == 'all' and iterations > 1 else ''}"
            f"{f' + {singular} singular steps' if singular else ''}, by {how}, in {counted(chunks, 'chunk')} of "
            f"{min(chunk, examples)} {'(chunk_size)' if given else '(automatic)'}; z_eps from "
            f"{'float64' if certify else 'uncertified'} forward passes")


def _basis_progress(start: int, stop: int, total: int, t_start: float, who: str = "hcrfast.bound",
                    limit: int | None = None):
    """``progress=True``: once a chunk's basis has run :data:`_PROGRESS_EVERY` seconds, a line every 256
    steps or that many seconds, whichever comes first, and its last step where a line came before. A basis
    built sooner prints nothing (the chunk's own line follows): the first and last steps of every basis
    were printed, 3 lines a chunk, 150 for 400 examples in chunks of 8. ``limit``: the basis' step limit
    (:func:`hcrfast.krylov.step_limit`), said in each line (a basis may stop before it)."""
    span = _span(start, stop)
    of = f" of at most {limit}" if limit else ""
    began = time.perf_counter()
    last = [0, began, False]   # steps and time of the last line, whether there was one

    def report(steps, active):
        now = time.perf_counter()
        due = (last[2] if active == 0 else
               now - began >= _PROGRESS_EVERY and (steps - last[0] >= 256 or now - last[1] >= _PROGRESS_EVERY))
        if due:
            last[:] = [steps, now, True]
            validation.say(f"{who}: {span} of {total}: Krylov basis {steps}{of} steps, {active} "
                           f"still running ({now - t_start:.1f} s)")
            _said()
    return report


#: Seconds between the progress lines from inside a chunk (LSQR's solves, the attack's iterations).
_PROGRESS_EVERY = 10.0

#: Seconds a chunk of ``bound`` may run without a progress line before :func:`_heartbeat` says what it is doing.
_HEARTBEAT_EVERY = 30.0

#: When a progress line was last printed (time.monotonic: the progress lines' own clock, perf_counter, is left to
#: them alone; by any call, in any thread).
_LAST_LINE = [0.0]


def _said() -> None:
    _LAST_LINE[0] = time.monotonic()


@contextlib.contextmanager
def _heartbeat(on: bool, start: int, stop: int, total: int, t_start: float, tag: str = "", who: str = "hcrfast.bound",
               idle: str = "setting up"):
    """``progress=True``: while a chunk of examples ``start..stop-1`` runs, a line every :data:`_HEARTBEAT_EVERY`
    seconds without another progress line, naming what it is doing (the profiling ranges open in this thread,
    :func:`hcrfast.profiling.open_ranges`). The dense solve, the certification's forward passes, the singular
    steps and a Krylov basis of few steps print nothing of their own: a chunk of ResNet-18 at 64×64 printed
    nothing for 117 s (an ad hoc run, 2026-12-01). ``who`` begins the line (``hcrfast.gauss_newton_attack``, whose
    first Gauss-Newton step printed nothing for 220 s on a ResNet-18 trunk), ``idle`` names the phase where no
    range is open. A daemon thread that waits in steps of at most 1 s; nothing on the chunk's own path."""
    if not on:
        yield
        return
    me, done, began = threading.get_ident(), threading.Event(), time.monotonic()

    def beat():
        while not done.wait(min(1.0, _HEARTBEAT_EVERY / 3)):
            now = time.monotonic()
            if now - max(_LAST_LINE[0], began) >= _HEARTBEAT_EVERY:
                phases = [name for name in profiling.open_ranges(me) if name != "bound"]
                validation.say(f"{who}{tag}: {_span(start, stop)} of {total}: "
                               f"{' > '.join(phases[-2:]) if phases else idle}, {now - began:.0f} s into "
                               f"this chunk ({time.perf_counter() - t_start:.1f} s)")
                _said()

    thread = threading.Thread(target=beat, name="hcrfast-heartbeat", daemon=True)
    try:   # started inside: a Ctrl-C that lands in start() still stops the thread it started
        thread.start()
        yield
    finally:
        done.set()
        if thread.ident is not None:   # (join refuses a thread never started)
            thread.join()


def _every(t_start: float, line):
    """A progress reporter for inside a chunk: prints ``line(*args)`` and the seconds since
    ``t_start``, at most every :data:`_PROGRESS_EVERY` seconds."""
    last, every = [time.perf_counter()], _PROGRESS_EVERY

    def report(*args):
        now = time.perf_counter()
        if now - last[0] >= every:
            last[0] = now
            validation.say(f"{line(*args)} ({now - t_start:.1f} s)")
            _said()
    return report


def _lsqr_progress(start: int, stop: int, total: int, iterations: int, t_start: float, who: str = "hcrfast.bound"):
    """``progress=True`` under LSQR: lines from inside a chunk's solves (a chunk of the automatic size
    can take many minutes): its step of Algorithm 1, LSQR's iteration and the problems still running."""
    return _every(t_start, lambda j, steps, active, rows: (
        f"{who}: {_span(start, stop)} of {total}: step {j + 1}/{iterations}, LSQR iteration {steps}, "
        f"{active} of {rows} problems running"))


def _is_oom(exc: BaseException) -> bool:
    """Out of device or host memory: torch's and CuPy's errors, and cuBLAS/cuDNN allocation failures."""
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # CuPy's cupy.cuda.memory.OutOfMemoryError
        return True
    text = str(exc)
    # torch's AcceleratorError (a RuntimeError) says "CUDA error: out of memory" where an allocation
    # outside its caching allocator failed (a kernel module loaded lazily, a library's workspace)
    # torch's CPU allocator: "[enforce fail at alloc_cpu.cpp:...] DefaultCPUAllocator: can't allocate memory"
    if isinstance(exc, RuntimeError) and ("ALLOC_FAILED" in text or "CUDA out of memory" in text
                                          or "DefaultCPUAllocator: can't allocate memory" in text
                                          or "CUDA error: out of memory" in text
                                          or "cudaErrorMemoryAllocation" in text):  # CuPy's CUDARuntimeError
        return True
    # numba.cuda's CudaAPIError is no RuntimeError: "[CUresult.CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc ..."
    return type(exc).__name__ == "CudaAPIError" and "OUT_OF_MEMORY" in text


#: oneDNN's error (the CPU's convolutions) where it cannot allocate a primitive under a memory limit (``ulimit -v``,
#: a container's): ResNet-18 raised it at 4 examples a chunk where 1 ran. Some forwards raise it under torch.func
#: too (activation checkpointing), so it reads as out of memory only where there are rows to split: one example
#: alone still gets that error's own explanation.
_NO_PRIMITIVE = "could not create a primitive"


def _is_oom_of(exc: BaseException, rows: int) -> bool:
    """:func:`_is_oom`, or oneDNN's :data:`_NO_PRIMITIVE` where the ``rows`` that raised it can be split."""
    return _is_oom(exc) or (rows > 1 and isinstance(exc, RuntimeError) and _NO_PRIMITIVE in str(exc))


class _StillTheSameFunction:
    """The features of a few examples (:data:`validation.REPEAT_ROWS`, spread over the batch as
    :func:`validation.check_repeatable` takes them), computed again by :meth:`check` just before each chunk a
    checkpoint saves and, where none is saved, after the solve; it refuses a model whose features moved past
    rounding: those of the model that certifies (taken just before the solve) against its shifts' scale, and the
    model's own against its first forward's features (the entry checks' ``features``), at
    :func:`validation.probe_independent`'s tolerance. The checks at the start see a forward that changes at each
    call, or mixes the batch, but not one that changes once (a call counter, a cache filled, a schedule): a model
    that doubled its features after its fifth call passed them, and its bounds were of the function after the
    switch, half those of the one it computed when called. The chunks a call computed after such a change are of
    another function: the refusal says so, and such a chunk is never saved (checked before its save). A forward
    of a few rows on entry, then one or two (two where a float64 copy certifies) a check."""

    def __init__(self, model64, batch: torch.Tensor, shift: float, dtype: torch.dtype, model, features: torch.Tensor,
                 rtol: float):
        k, last = min(validation.REPEAT_ROWS, batch.shape[0]), batch.shape[0] - 1
        self.rows = [i * last // (k - 1) for i in range(k)] if k > 1 else list(range(k))
        self.model64, self.batch, self.shift, self.dtype = model64, batch, shift, dtype
        self.model, self.rtol = model, rtol
        self.first = features.detach().reshape(batch.shape[0], -1)[self.rows].clone()
        self.before = self._features(model64, dtype)

    def _features(self, model, dtype) -> torch.Tensor:
        with torch.no_grad():
            out = model(self.batch[self.rows].to(dtype))
        return out.detach().reshape(len(self.rows), -1).clone()

    def check(self, saved=None, *, shared: bool = False, chunk: tuple[int, int] | None = None) -> None:
        """Raise ValueError where the model changed during the call. ``saved``: the call's
        :class:`hcrfast.checkpoint.Checkpoint` (or None), whose chunks saved by this call are removed first
        (:meth:`~hcrfast.checkpoint.Checkpoint.discard`; ``shared``: processes share the folder, whose key
        stays), so that the same call made again computes them afresh rather than read them back as bounds.
        ``chunk``: the ``(start, stop)`` of the chunk about to be saved (None: the check after the solve)."""
        when = ("after the solve" if chunk is None else f"before example {chunk[0]} was saved" if chunk[1] - chunk[0] == 1
                else f"before examples {chunk[0]}..{chunk[1] - 1} were saved")
        after = self._features(self.model64, self.dtype)
        # float64's rounding as check_repeatable allows it; another dtype (certify=False) a few of its ulps
        share = validation.REPEAT_ROUNDING if self.dtype == torch.float64 else 4 * torch.finfo(self.dtype).eps
        gap = float(((after - self.before).norm(dim=1) - share * self.before.norm(dim=1)).clamp_min(0).max())
        text = None
        if gap > 0 and (self.shift <= 0 or gap / self.shift > validation.REPEAT_LIMIT):
            text = (f"the features of the model that certifies the bounds changed during this call: {when}, "
                    f"{len(self.rows)} examples' features differ from those it gave before by up to {gap:.3g} (norm), "
                    + (f"{gap / self.shift:.3g} of" if self.shift > 0 else "against")
                    + f" the feature shifts the bounds rest on (size x the noise's scale = {self.shift:.3g})")
        else:
            # (a float64 model, or certify=False: the model certifies itself, its forward just ran)
            same = self.model is self.model64 and self.first.dtype == self.dtype
            own = after if same else self._features(self.model, self.first.dtype)
            scale = float(self.first.abs().max())
            moved = float((own - self.first).abs().max())
            if moved > self.rtol * scale:
                text = (f"the model's features changed during this call: {when}, {len(self.rows)} examples' "
                        f"features differ from those of its first forward by up to {moved:.3g} ({moved / scale:.2e} of "
                        f"the largest feature; the checks on entry allow {self.rtol:.0e})")
        if text is None:
            return
        where = "" if saved is None else self._discarded(saved, shared)
        raise ValueError(f"{text}. The model changes itself as it runs (a call counter, a cache, a schedule or a "
                         f"switch in its forward), so its bounds would be of more than one function; make the forward "
                         f"a fixed function of its input{where}")

    @staticmethod
    def _discarded(saved, shared: bool) -> str:
        """Remove the chunks this call (this process) saved, and say so: what the refusal adds about ``saved``.

        With a checkpoint the model is checked just before each chunk is saved (:meth:`check` with ``chunk``), so a
        chunk computed after the model changed is refused before it reaches the folder, also in a call killed later,
        before its end; the chunks this call saved before it passed their checks, but the model changes itself as it
        runs, so they go too: the same call made again computes them afresh. The chunks this call read back from
        earlier calls are kept: each passed the check before its save (a chunk file written by hcrfast up to the
        twenty-first session was checked at its call's end only, not at all where that call was killed first).
        Under shard=True the other processes' chunks are theirs: each checks its own model and removes its own
        (their calls stop at their next step on this process's error, :meth:`World.agree`)."""
        removed, left, others = saved.discard(key_too=not shared)
        plural = removed != 1
        if removed or left:
            text = (f"; the {removed} chunk file{'s' if plural else ''} this call saved in {saved.path}, of more than "
                    f"one function, {'were' if plural else 'was'} removed: the same call made again computes "
                    f"{'them' if plural else 'it'} afresh")
        else:   # (refused before its first save)
            text = f"; no chunk of this call was saved in {saved.path}: the check before its first save refused it"
        if left:
            text += (f"; {len(left)} could not be removed ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}): "
                     f"delete {saved.path} before calling again")
        if others:
            text += (f"; the {others} chunk file{'s' if others != 1 else ''} of "
                     f"{'earlier calls or other processes' if shared else 'earlier calls'} there "
                     f"{'are' if others != 1 else 'is'} kept (each call since 2026-12-01 checks its model before each chunk it "
                     f"saves; an older one checked it at its end only, not at all where it was killed first: delete "
                     f"{saved.path} if such a call was)")
        elif not left and not shared and not (saved.path / "key.json").exists():
            text += (" (with the key this call wrote: the folder is as it was before the call)" if removed else
                     "; the key this call wrote was removed: the folder is as it was before the call")
        return text


class _Eta:
    """The seconds a call has left: the time per example of the chunks after its first, once there are any; the
    first chunk's until then. The first chunk's time holds the call's one-off costs (first compilations, the
    entry probes' float64 copies): counted in, the first ETAs of an 800-example MNIST run said 247 and 118 s
    where 108 and 93 were left."""

    def __init__(self, t_first: float):
        self.t_first = t_first
        self.mark = None   # (time, examples) at the end of the first chunk
        self.first = True  # whether the last estimate was the first chunk's (one-off costs in: likely high)

    def __call__(self, computed: int, left: int) -> float:
        now = time.perf_counter()
        if self.mark is None:
            self.mark = (now, computed)
        self.first = computed <= self.mark[1]
        if not self.first:
            return (now - self.mark[0]) / (computed - self.mark[1]) * left
        return (now - self.t_first) / computed * left


def _progress_line(who: str, done: str, t_start: float, eta: _Eta, computed: int, to_compute: int) -> None:
    """``progress=True``: "<who>: <done> done (elapsed, ETA)" on stderr; the ETA (:class:`_Eta`) extrapolates
    the time per example of the ``computed`` examples to the ``to_compute − computed`` left."""
    left = to_compute - computed
    seconds = eta(computed, left)
    eta_text = (f", ETA {seconds:.0f} s" + (" (from the first chunk, which holds the call's one-off costs)"
                                            if eta.first else "") if left else "")
    validation.say(f"{who}: {done} done ({time.perf_counter() - t_start:.1f} s{eta_text})")
    _said()


def _one_example_note(solver: str, n: int, p: int, restarts: int, pilots, options: LSQROptions, itemsize: int,
                      pilots_auto: bool) -> str:
    """What :func:`bound` adds to an out-of-memory error that a chunk of one example still raised: what
    one example holds with this solver, by count, and the ways to hold less."""
    gib = lambda values, size=itemsize: f"{values * size / 2**30:.2g} GiB"  # noqa: E731
    head = (f"hcrfast.bound: one example alone ran out of memory (chunks are halved down to 1, no further) with "
            f"solver={solver!r}, {p} inputs and {n} features, R = {restarts}. ")
    if solver == "krylov":
        k = krylov.step_limit(n, p, options)
        how = "chosen by krylov_pilots='auto' for R = %d" % restarts if pilots_auto else "asked for"
        return (head + f"Its Krylov bases: {pilots} pilot(s) ({how}) of up to {k} steps, ~"
                f"{gib(pilots * krylov.basis_values(n, p, options))} as the chunk size counts them (the kept vectors, "
                f"a buffer's growth copy, the eigenvectors), beside the model's product graphs for {pilots} rows. "
                f"Fewer pilots (krylov_pilots=, each restart past them shares a pilot's basis), fewer steps "
                f"(lsqr=dataclasses.replace(hcrfast.krylov.DEFAULT_OPTIONS, iter_lim=...)), fewer restarts, or "
                f"solver='lsqr' (~16 vectors per restart, many more products) hold less")
    if solver == "dense":
        return (head + f"Its Jacobian, factor and restarts' vectors: ~{gib(_dense_values(n, p, restarts), 8)} in "
                f"float64 as the chunk size counts them. solver='krylov' or 'lsqr' hold no J")
    return (head + f"Its {restarts} restarts run through the model's product graphs together (LSQR keeps ~16 vectors "
            f"per restart, ~{gib(16 * restarts * (n + p))}); fewer restarts, or a smaller input, hold less")


def _in_chunks(total: int, chunk: int, compute, device: torch.device, *, store=None, on_halve=None) -> int:
    """``compute(lo, hi)`` over ``0..total`` in chunks, then ``store(lo, hi, result)``.

    A chunk that runs out of memory is halved and computed again; finished chunks are
    kept. The retry happens outside the ``except`` block (whose traceback holds the
    failed chunk's arrays) after the torch and CuPy pools gave their cached blocks
    back. ``on_halve(new_chunk)`` is told of each halving. Returns the final chunk size.
    """
    lo = 0
    while lo < total:
        hi = min(total, lo + chunk)
        try:
            result = compute(lo, hi)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
            if not (_is_oom_of(exc, hi - lo) and hi - lo > 1):
                raise
            out_of_memory = True
        else:
            out_of_memory = False
        if out_of_memory:
            release_device_memory(device)
            # half of what the chunk held: a chunk size above what is left (the automatic one past the batch)
            # halved to one still above it computed the same failing chunk again
            chunk = max(1, (hi - lo) // 2)
            if on_halve is not None:
                on_halve(chunk)
            continue
        if store is not None:
            store(lo, hi, result)
        lo = hi
    return chunk


#: The processes' shared session of the sharded :func:`bound` call this thread is in (None: not sharded).
_SHARD_WORLD = contextvars.ContextVar("hcrfast_shard_world", default=None)


@dataclasses.dataclass
class _Reuse:
    """What :func:`bound` calls that differ by σ alone can share (:func:`hcrfast.sigma_for`): per chunk
    of examples, the dense solve's factor of J or the Krylov bases, and the targeted directions taken
    from them. None of them depends on σ (J is taken at the input; a Krylov space is that of the pilot's
    direction, whatever its length). Kept while they fit ``budget`` bytes. A call on another model (or
    other weights), batch or arguments empties the store first; calls with a per-feature σ, another
    noise law or LSQR neither use nor change it (:func:`hcrfast.sigma_for` searches a per-feature
    profile as a scalar σ on the features divided by it, which does use it)."""

    budget: int
    signature: tuple | None = None
    chunk_size: int | None = None   # the first call's, kept: a chunk is found again by its rows
    entries: dict = dataclasses.field(default_factory=dict)
    used: int = 0

    def match(self, signature: tuple) -> None:
        if signature != self.signature:
            self.signature, self.chunk_size, self.entries, self.used = signature, None, {}, 0

    def admit(self, key, value) -> None:
        size = _nbytes(value)
        if self.used + size <= self.budget:
            self.entries[key] = value
            self.used += size


def _nbytes(obj) -> int:
    """Bytes of the tensors and arrays inside ``obj`` (dataclasses, tuples, lists, dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if hasattr(obj, "nbytes") and not isinstance(obj, (str, bytes)):
        return int(obj.nbytes)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(_nbytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    return 0


#: The :class:`_Reuse` store of the :func:`reusing_factors` block this thread is in (None: none).
_REUSE = contextvars.ContextVar("hcrfast_reuse", default=None)


@contextlib.contextmanager
def reusing_factors(budget_bytes: int):
    """Within this block, :func:`bound` calls on the same model, batch and arguments, σ a scalar that may
    differ, share each chunk's dense factor or Krylov bases (up to ``budget_bytes``): the later calls
    compute only their solves and certification. Dense solves give bitwise the bounds of a call made
    alone; Krylov ones the same up to rounding (the basis of the first call's pilot, which at another
    σ is the same vector scaled). ``params["reuse"]`` says how many examples a call took from the store."""
    token = _REUSE.set(_Reuse(int(budget_bytes)))
    try:
        yield _REUSE.get()
    finally:
        _REUSE.reset(token)


def _sharded(fn):
    """With ``shard=True``, open the processes' shared session before anything else of ``fn`` runs
    (the checks of a per-feature sigma included), so that one process's error stops them all."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not validation.flag("shard", kwargs.get("shard", False)):
            return fn(*args, **kwargs)
        batch = args[1] if len(args) > 1 else kwargs.get("batch")
        world = World(getattr(batch, "device", torch.device("cpu")).type, set_device=False)
        with world.session("hcrfast.bound(shard=True)"):
            token = _SHARD_WORLD.set(world)
            try:
                return fn(*args, **kwargs)
            finally:
                _SHARD_WORLD.reset(token)

    return wrapper


@_sharded
@accepts_per_feature_sigma(scale_inputs=True)
def bound(model, batch, sigma, *, size: float = 1 / 200, iterations: int = 10, restarts: int = 25,
          seed: int = 0, linearize_at: str = "input", lsqr: LSQROptions | None = None, basis: str = "dct",
          certify: bool = True, jacobian: str = "reverse", chunk_size: int | None = None,
          example_ids=None, progress: bool = False, targets=None, targeted_method: str = "auto",
          keep_targeted_eps: bool = False, tf32: bool = False, warm_start: bool = True, solver: str = "auto",
          krylov_pilots: int | str = "auto", iterates: str = "all", singular_steps: int | str = "auto",
          null_probes: bool = False, checkpoint=None, shard: bool = False) -> Bounds:
    """HCR lower bounds on the standard deviation of unbiased estimators of the input.

    Parameters
    ----------
    model : torch.nn.Module
        Input batch (B, ...) → features (B, ...). Must not mix examples across
        the batch. Run in eval mode (a model in training mode is switched to
        eval for the call, with a warning, and switched back).
    batch : torch.Tensor, shape (B, ...)
        The inputs θ, on the model's device and in its dtype (float32 or float64; a float16 Module and batch
        are solved as a float32 copy, with a warning; bfloat16 is refused). The bounds are certified by a
        float64 copy's forward passes whatever the dtype (``certify=True``).
    sigma : float, array of one std per feature, or noise law
        Standard deviation of the Gaussian dithering of every feature; one std per
        feature (an array, tensor or list of the features' size: the problem is that of
        the features divided by them with σ = 1, ``params["noise"]`` names them); or a noise
        law: ``hcrfast.Gaussian(sigma)``, ``hcrfast.Laplace(b)``, or
        ``hcrfast.MonteCarlo(...)`` for any i.i.d. density (its D is an upper
        confidence bound; the confidence of each step is raised to 1 − (1 − c)/R,
        or 1 − (1 − c)/(R·i) with ``iterates="all"``, so that the max over every step
        certified holds at level c).
    size : float
        s: the start vector is (s/√n)·Z, so ‖z‖ ≈ s·σ and D ≈ s².
    iterations : int
        i, the LSQR solves of Algorithm 1 per restart.
    restarts : int
        R independent start vectors per example; bounds are maxima over them.
    seed : int
        Example e uses the noise stream ``default_rng([seed, e])``.
    linearize_at : {"input", "current"}
        Apply J at θ (the paper) or at θ + ε(j−1) (the published scripts).
    lsqr : LSQROptions, optional
        LSQR stopping rules; default :data:`DEFAULT_LSQR` (with ``solver="krylov"``: the
        basis' rules, default :data:`hcrfast.krylov.DEFAULT_OPTIONS`).
    basis : {"dct", "pixel"}
        Q: orthonormal 2-D DCT-II over the last two axes of each example
        (per channel), or the identity.
    certify : bool
        Recompute ``z_ε`` in float64 with a float64 copy of the model.
    jacobian : {"reverse", "forward", "auto"}
        How J v is computed (:class:`hcrfast.bindings.TorchJacobian`); "auto" is "reverse" (recorded so), as
        for :func:`hcrfast.targeted_bound`'s LSQR path, so that one set of keyword arguments serves both.
    chunk_size : int, optional
        Examples per chunk (all their restarts together); automatic when None: from free device memory on
        CUDA, fixed budgets of values on CPUs (the solver's, and with ``iterates="all"`` one for the earlier
        steps a chunk keeps). A chunk that runs out of memory is halved and retried.
    example_ids : sequence of int, optional
        Global indices of the examples (default 0..B−1), used only to seed
        their noise streams, so that a run split over calls, processes or
        machines draws exactly the noise of one whole run.
    progress : bool
        Print to stderr a line per chunk (examples done, elapsed seconds, ETA; the first chunk's ETA says
        it holds the call's one-off costs), and lines from inside a chunk: with ``solver="krylov"``, once a
        chunk's basis has run 10 s, one every 256 steps or 10 s, whichever comes first (and its last
        step); with ``solver="lsqr"``, at most one every 10 s (step of Algorithm 1, LSQR iteration,
        problems still running). Also a line where a chunk is halved for memory, where a ``checkpoint``
        gave examples back, and where a ``shard``'s process waits for the others.
    targets : "all", "low:K", sequence of modes, bool mask, or None
        Also aim one perturbation at each of these modes, the Cramér-Rao direction
        (:func:`hcrfast.targeted.targeted_bound`, with null-space probes only where ``null_probes``), and
        report, per mode, the largest certified bound: Algorithm 1's or any targeted step's
        (each step's certified shift bounds every mode it moves, not only its own). None: Algorithm 1
        only, as in the paper. Found chunk by chunk, after each chunk's Algorithm 1
        (from its J and factor with the dense solve, from its Krylov bases with the
        Krylov solve), so checkpoints and shards hold them too.
    targeted_method : {"auto", "dense", "lsqr"}
        How the targeted directions are found (``targeted_bound``'s ``method``).
    null_probes : bool
        With ``targets``: also certify, for each target mode with a component in the local null space
        of J, steps along that component (:func:`hcrfast.targeted.targeted_bound`'s null-space probes,
        from the dense J's factorization: ``solver="dense"``, or a ``targeted_method`` that resolves to
        "dense"), each for its own mode (their D is rounding by design: not counted for the others; the
        row-space steps they replace still are). Steps there move the features only at second order
        or by rounding, so such modes' bounds come out huge (+inf where the features stay exactly as they
        are: an input the model ignores). Default False: every step lies in J's row space, and the bounds
        are those of what J sees (the summary says where J has a null space).
    singular_steps : int or "auto"
        Also certify, per example, a step along each of J's ``singular_steps`` smallest singular
        directions (right singular vectors, from the dense solve's factorization, or the Ritz vectors
        of the Krylov bases: no model product), scaled to a linearized feature shift of ``size·σ``, and
        report per mode the largest bound (each step bounds every mode it moves, as a targeted step
        does). Each direction is certified with both signs (the factorization's sign is arbitrary, and
        on a curved model +v and -v move the features differently): two forward passes a direction
        (float64 with ``certify``); directions past an example's rank are steps of 0, with no pass. A count
        needs ``solver`` "dense" or "krylov" and Gaussian noise; one above min(n, p), J's largest possible
        rank, takes min(n, p), with a warning. ``mse``, ``eps``, ``z`` and ``best_restart`` stay Algorithm 1's;
        with ``targets``, ``std_algorithm1`` (what the targeted steps are weighed against) includes them.
        Default "auto": :data:`AUTO_SINGULAR_STEPS` (64, at most min(n, p)) where the solve is dense or
        Krylov and the noise Gaussian, else 0; ``params["singular_steps"]`` says how many were taken
        (a dict: ``count``, the modes they lifted, their directions), None where none were.
        0: none, Algorithm 1 alone (with ``iterates="last"``, the paper's).
    keep_targeted_eps : bool
        Keep every targeted step ε_k in ``result.targeted.eps`` (B·K·p float64 values: 12 GB
        for CIFAR-10's 2,500 test images with ``targets="low:8"``, 230 MB per 224×224 image).
        Default False: each chunk's steps are dropped once their bounds on every mode
        (``result.targeted.std_every_mode``) are taken, and checkpoints hold no steps; the
        bounds are the same. :func:`hcrfast.targeted.targeted_bound` always keeps them.
    warm_start : bool
        Start LSQR solve j > 1 of each restart from ``c·ε(j−1)``, ``c = ‖z‖/‖z(j−1)‖``,
        which nearly solves it (``z̃(j) = c·z(j−1) ≈ c·J ε(j−1)``), and stop on the
        residual a start from zero would stop at. The iteration is Algorithm 1's; each
        solve costs a few correction steps, and the small singular directions that a
        solve from zero leaves out at the tolerance build up over the i solves, so the
        bounds come out as tight as from-zero solves at a ~100× tighter tolerance (MNIST
        MLP: ``benchmarks/README.md``). False: every solve from zero, as the published
        scripts. A warm solve costs one extra JVP, not counted in ``lsqr_iterations``.
        With ``LSQROptions(damp > 0)`` it does not apply (LSQR from ``x0`` minimizes
        ``‖Jε − z̃‖² + damp²‖ε − x0‖²``, another problem): every solve starts from zero, with a
        warning, and ``params["warm_start"]`` is False.
        Irrelevant to the dense solve, whose every solve is exact.
    tf32 : bool
        Let float32 matmuls and convolutions of the model use TF32 on GPUs that have it
        (faster convolutions, each operand rounded to 10 mantissa bits). The bound stays
        certified by the float64 forwards, but the solver works on a noisier J: emulated on a
        CPU (``benchmarks/tf32_cost.py``), a forward moves by ~1e-3 of the features, ``J v`` and
        ``Jᵀu`` by 4e-4 of theirs on the MNIST MLP and by 3e-2 to 7e-2 on the CIFAR-10 CNN and
        ResNet-18, and the median bound came out 0% (CIFAR-10), 2.8% (MNIST) and 6.7%
        (ResNet-18) lower, all of it on ResNet-18 from the products. Default False: the call runs in IEEE float32 whatever torch's
        global settings (restored afterwards).
    solver : {"auto", "lsqr", "dense", "krylov"}
        How each step ``ε(j) = argmin ‖J ε − z̃‖`` is solved. "lsqr": matrix-free batched
        LSQR with the ``lsqr`` stopping rules. "dense": build every example's J once
        (min(n, p) products), factor it in float64 and solve every step exactly,
        ``ε(j) = J⁺ z̃`` (the minimum-norm solution LSQR from zero converges to; singular
        values under ``sqrt(max(n, p))·eps`` of J's dtype relative to the largest count as zero,
        :func:`hcrfast.dense.min_norm_solver`); needs ``linearize_at="input"``. "krylov": per
        example, one LSQR on restart 0's start vector with its Lanczos vectors kept and
        reorthogonalized (:mod:`hcrfast.krylov`), grown until the Krylov space is exhausted
        or ``iter_lim`` (default :data:`hcrfast.krylov.MAX_STEPS`; ``lsqr`` options replace
        :data:`hcrfast.krylov.DEFAULT_OPTIONS`), then every step is the best ε in that space,
        with no further model product: 2k + 1 products per example whatever R and i;
        k·(n + p) values of memory per example; needs ``linearize_at="input"``.
        ``lsqr_iterations[b, 0, 0]`` is the basis' size, ``params["krylov"]`` its summary.
        "auto", with ``linearize_at="input"`` and no ``lsqr`` options: dense on the CPU while
        p ≤ ``DENSE_SOLVE_MAX_INPUTS`` and n·p ≤ ``DENSE_SOLVE_MAX_VALUES`` (measured faster
        and at least as tight there), "krylov" on CUDA (see :data:`DENSE_SOLVE_MAX_INPUTS`)
        and beyond those limits (ResNet-18, Swin-T; see :data:`KRYLOV_MIN_INPUTS` for the
        measurements), LSQR otherwise (``linearize_at="current"``, ``lsqr`` options given).
        ``Bounds.params["solver"]`` says which ran.
    krylov_pilots : int or "auto"
        With ``solver="krylov"``: restarts 0..pilots−1 of each example each build their own
        basis, and restart r is solved in the basis of pilot ``r mod pilots``. More pilots cost
        ``pilots`` × the products and memory and bring more restarts their own Krylov space
        (pilots = restarts: every restart its own basis, recycled over its i steps). "auto"
        (the default, :func:`hcrfast.krylov.resolve_pilots`): one pilot where one basis exhausts the space
        (min(n, p) ≤ :data:`hcrfast.krylov.MAX_STEPS`) or ``iter_lim`` is given, and for the other
        solvers; beyond, a pilot per restart (at most :data:`hcrfast.krylov.AUTO_MAX_PILOTS`, 100, and past
        R = 25 what :data:`hcrfast.krylov.AUTO_MAX_BASIS_VALUES` holds; a warning names restarts left to share) of
        MAX_STEPS // R steps, at least :data:`hcrfast.krylov.AUTO_PILOT_STEPS` (ResNet-18: up to R = 25
        a higher median bound than one basis at equal products; past it 160 steps each, the products
        growing with R, since restarts sharing a short basis gave the same bounds) and at most
        :data:`hcrfast.krylov.AUTO_PILOT_MAX_STEPS` (246: deeper pilots gave lower bounds there; R = 25:
        25 pilots of 163 steps, R = 10: 10 of 246, R = 50: 50 of 160). Resolved before
        anything is keyed: ``params["krylov"]`` gives the pilots (and ``pilots_auto``),
        ``params["lsqr"]["iter_lim"]`` each one's steps. With ``targets``, each mode
        takes the direction of the pilot whose space bounds it tightest.
    iterates : {"all", "last"}
        Which steps of each restart bound the input. "all" (the default): every iterate
        ε(1) … ε(i) of Algorithm 1, each certified by its own forward passes (float64 ones with
        ``certify``: one of each earlier step, a(θ) once per example, in one more call per chunk;
        no more products), and each mode takes the
        largest bound over the restarts and their iterates; the max of valid bounds is valid.
        With ``certify`` (Gaussian or Laplace noise), an earlier step is certified only where
        the shift its restart step computed in the model's dtype, with a margin for that dtype's
        rounding, says it could raise some mode's bound or eq. (6): the others could not, and
        are left out (``params["earlier_iterates"]`` counts both; ResNet-18 certified 34 of
        225, a CIFAR-10 CNN 138 of 900; benchmarks/README.md, "ninth session").
        The iterations sharpen ε toward J's smallest singular directions, which tightens the bounds
        of the modes those directions move and loosens the others', so an earlier iterate often
        bounds a mode better (median over the modes, R = 25, i = 10: +127% on a random-weight CIFAR-10
        CNN, +3.8% on the MNIST MLP; benchmarks/README.md). "last": ε(i) only, the paper's
        Algorithm 1. ``mse``, ``eps``, ``z`` and ``best_restart`` are of the step (of any
        restart and iterate) with the largest eq.-(6) bound; ``divergence`` is of each restart's
        last iterate.
    checkpoint : str or os.PathLike, optional
        A folder (created if missing) where every finished chunk of examples is written at
        once (:mod:`hcrfast.checkpoint`). The same call made again after a crash or an
        interrupt reads the finished chunks and computes only the missing examples; a call
        whose model state, batch, sigma or arguments differ is refused with what differs.
        ``params["checkpoint"]`` says how many examples were read back.
    shard : bool
        Under ``torchrun`` (or a process group the caller initialized), every process makes
        the same call and computes every N-th piece of ``chunk_size`` examples (rank 0's
        size) into ``checkpoint``, a folder all processes see; once all are done every process
        reads the others' pieces and returns the whole result. Needs ``checkpoint``.
        ``params["shard"]`` says which rank this was and how many examples it computed.
        The processes first check that they make the same call on the same folder; an error
        on one process (or a process that does not come within ``HCRFAST_SHARD_TIMEOUT``
        seconds, 30 minutes by default) is raised on every process as
        :class:`hcrfast.distributed.ShardError`, naming the rank and its error.

    Returns
    -------
    Bounds
    """
    call = dict(locals())  # every argument as given, for _bound
    return _bound(**call, world=_SHARD_WORLD.get() if shard else None)


def _bound(model, batch, sigma, *, size, iterations, restarts, seed, linearize_at, lsqr, basis, certify, jacobian,
           chunk_size, example_ids, progress, targets, targeted_method, keep_targeted_eps, tf32, warm_start, solver,
           krylov_pilots, iterates, singular_steps, null_probes, checkpoint, shard, world) -> Bounds:
    """:func:`bound`, its arguments unchecked; ``world`` is this process's place in a sharded call (or None)."""
    t_start = time.perf_counter()
    threads = torch.get_num_threads()   # (params["run"]: the float32 solves' rounding follows it)
    noise = as_noise(validation.sigma_or_law(sigma))
    size = validation.positive_float("size", size, "; typical values are 1/200, 1/500, 1/1000")
    iterations = validation.positive_int("iterations", iterations)
    restarts = validation.positive_int("restarts", restarts)
    seed = validation.seed(seed)
    validation.choice("linearize_at", linearize_at, ("input", "current"))
    validation.choice("basis", basis, ("dct", "pixel"))
    jacobian = validation.jacobian_mode(jacobian)
    validation.choice("solver", solver, SOLVERS)
    validation.choice("iterates", iterates, ("all", "last"))
    if solver in ("dense", "krylov") and linearize_at != "input":
        raise ValueError(f"solver={solver!r} {'factors J' if solver == 'dense' else 'builds one Krylov basis of J'} "
                         f"at the input once, but linearize_at='current' needs a new J for every solve; pass "
                         f"linearize_at='input' or solver='lsqr'")
    for name, value in (("warm_start", warm_start), ("tf32", tf32), ("certify", certify), ("progress", progress),
                        ("keep_targeted_eps", keep_targeted_eps), ("null_probes", null_probes)):
        validation.flag(name, value)
    if null_probes and targets is None:
        raise ValueError("null_probes=True probes the null space of J for the target modes, but targets=None asks "
                         "for none: pass targets= (e.g. 'all' or 'low:8') or null_probes=False")
    if keep_targeted_eps and targets is None:
        raise ValueError("keep_targeted_eps=True keeps the targeted steps, but targets=None asks for none: pass "
                         "targets= (e.g. 'low:8') or leave keep_targeted_eps out")
    if targeted_method != "auto" and targets is None:   # (a method for no steps read as if it changed something)
        raise ValueError(f"targeted_method={targeted_method!r} chooses how the targeted steps are found, but "
                         f"targets=None asks for none: pass targets= (e.g. 'low:8') or leave targeted_method out")
    singular_auto = isinstance(singular_steps, str)
    if singular_auto:
        if singular_steps != "auto":
            raise ValueError(f"singular_steps={singular_steps!r}: pass 'auto', 0 (none) or a positive integer")
    elif isinstance(singular_steps, bool) or not isinstance(singular_steps, numbers.Integral):
        raise TypeError(f"singular_steps must be an integer or 'auto', got {singular_steps!r} "
                        f"({type(singular_steps).__name__})")
    elif singular_steps < 0:
        raise ValueError(f"singular_steps must be 0 (none), a positive integer (how many of J's smallest singular "
                         f"directions to certify as steps) or 'auto', got {singular_steps}")
    else:
        singular_steps = int(singular_steps)
    given_options = validation.lsqr_options(lsqr)
    options = given_options or (krylov.DEFAULT_OPTIONS if solver == "krylov" else DEFAULT_LSQR)
    if isinstance(krylov_pilots, str):
        if krylov_pilots != "auto":
            raise ValueError(f"krylov_pilots={krylov_pilots!r}: pass a positive integer or 'auto'")
    else:
        krylov_pilots = validation.positive_int("krylov_pilots", krylov_pilots)
    if krylov_pilots not in ("auto", 1) and solver in ("dense", "lsqr"):
        raise ValueError(_pilots_need_krylov(krylov_pilots, solver))
    if krylov_pilots != "auto" and krylov_pilots > restarts:
        raise ValueError(f"krylov_pilots={krylov_pilots} exceeds restarts={restarts}: the pilots are restarts "
                         f"0..krylov_pilots-1; pass at most {restarts}")
    chunk_size = validation.chunk_size(chunk_size)
    checkpoint = validation.checkpoint_folder(checkpoint)
    shard = world is not None
    if shard and checkpoint is None:
        raise ValueError("shard=True shares the chunks among the processes through the checkpoint folder; pass "
                         "checkpoint=DIR on a filesystem every process sees")
    if shard and world.size == 1:
        alone = ("its process group has 1 process" if world.dist is not None
                 else "not started by torchrun, and no process group")
        validation.warn(f"shard=True, but this process is alone ({alone}): it computes every example itself")
    batch = validation.model_and_batch(model, batch, basis)
    user_model = model   # (a float16 one is solved as a fresh float32 copy: the factor store keys on the user's)
    model, batch = validation.float32_for_float16(model, batch)
    from hcrfast.targeted import METHODS, parse_targets

    validation.choice("targeted_method", targeted_method, METHODS)  # checked without targets too
    if targets is not None:  # fail before the long run, not after it
        parse_targets(targets, batch.shape[1:], basis)
    example_ids = validation.example_ids(example_ids, batch.shape[0])
    noise_asked = noise.describe()  # what compare() matches an attack against
    if isinstance(noise, MonteCarlo):  # one statement per step that may bound a mode: R, or R·i with every iterate
        statements = restarts * (iterations if iterates == "all" else 1)
        noise = noise.with_confidence(1 - (1 - noise.confidence) / statements)
    gaussian_sigma = noise.sigma if isinstance(noise, Gaussian) else None
    if targets is not None and gaussian_sigma is None:
        raise NotImplementedError(f"targets= needs Gaussian noise (the targeted directions are scaled to a "
                                  f"Gaussian feature shift); got {noise.describe()}")
    if singular_steps and not singular_auto and gaussian_sigma is None:
        raise NotImplementedError(f"singular_steps={singular_steps} needs Gaussian noise (the steps are scaled to a "
                                  f"Gaussian feature shift); got {noise.describe()}: pass singular_steps=0")

    # A call that fails before its first chunk takes back the key it wrote (the corrected call may use the
    # folder); not where processes share the folder, whose others may be writing chunks into it.
    unshared = world is None or world.size == 1
    with validation.entry_point(model, batch.device, tf32=tf32), (
            taken_back_on_failure() if unshared else contextlib.nullcontext()):
        features = validation.features_of(model, batch)
        validation.check_independent(model, batch, features, mode=jacobian, tf32=tf32)
        xp = array_module_for(batch.device)
        B, n = features.shape
        input_shape = tuple(batch.shape[1:])
        p = math.prod(input_shape)
        solver_asked = solver   # ("auto": the messages name what it took)
        solver = resolve_solver(solver, linearize_at, batch.device, n, p, lsqr_given=lsqr is not None)
        # "auto" may have become "krylov": its basis has its own default rules, not LSQR's.
        options = given_options or (krylov.DEFAULT_OPTIONS if solver == "krylov" else DEFAULT_LSQR)
        # "auto" pilots: resolved here, before the checkpoint key and the chunk size see them
        pilots_auto = krylov_pilots == "auto"
        krylov_pilots, options = krylov.resolve_pilots(krylov_pilots, n, p, restarts, options, solver=solver)
        if warm_start and solver == "lsqr" and options.damp > 0:
            # LSQR from x0 (SciPy's) minimizes ||J eps - z||^2 + damp^2 ||eps - x0||^2: a warm solve would pull
            # toward the last step, not 0, and differ from the damped solve it stands for (bounds 39% apart)
            validation.warn(f"warm_start=True does not apply with LSQROptions(damp={shown_damp(options.damp):g}): "
                            f"LSQR started "
                            f"from x0 minimizes ||J eps - z||^2 + damp^2 ||eps - x0||^2, another problem than the "
                            f"damped one, so every solve starts from zero (params['warm_start'] is False); pass "
                            f"warm_start=False to silence this, or damp=0 for warm starts")
            warm_start = False
        if pilots_auto and 1 < krylov_pilots < restarts:
            validation.warn(f"krylov_pilots='auto' took {krylov_pilots} pilots (hcrfast.krylov.AUTO_MAX_PILOTS, and "
                            f"AUTO_MAX_BASIS_VALUES: their bases are held together) for "
                            f"R = {restarts}: restarts {krylov_pilots}..{restarts - 1} share their bases, and restarts "
                            f"sharing a basis this short of the space gave the same bounds on ResNet-18 (R = 100 on 25 "
                            f"pilots: R = 25's median), for i forward passes each; pass restarts={krylov_pilots}, or "
                            f"krylov_pilots={restarts} with lsqr=dataclasses.replace(hcrfast.krylov.DEFAULT_OPTIONS, "
                            f"iter_lim={options.iter_lim}) for a basis each ({restarts} × {options.iter_lim} steps of "
                            f"memory per example; without iter_lim each pilot runs up to "
                            f"hcrfast.krylov.MAX_STEPS = {krylov.MAX_STEPS})")
        # refused before resolve_singular_steps caps the count (and warns of the cap): the count the caller passed
        if singular_steps not in (0, "auto") and solver not in ("dense", "krylov"):
            raise ValueError(f"singular_steps={singular_steps} takes J's smallest singular directions from the dense "
                             f"solve's factorization or the Krylov basis, but this call solves with {solver!r}; pass "
                             f"solver='dense' or solver='krylov' (linearize_at='input'), or singular_steps=0")
        singular_steps = resolve_singular_steps(singular_steps, solver, n, p, gaussian=gaussian_sigma is not None)
        if krylov_pilots != 1 and solver != "krylov":
            raise ValueError(_pilots_need_krylov(krylov_pilots, solver))
        if solver == "dense" and given_options is not None:
            unused = [f.name for f in dataclasses.fields(LSQROptions) if f.name != "kernels"
                      and getattr(given_options, f.name) != getattr(LSQROptions(), f.name)]
            if unused:  # its kernels choice serves the DCT; the rest has nothing to stop
                validation.warn(f"solver='dense' solves every step exactly and runs no LSQR, so these lsqr options "
                                f"go unused: {', '.join(unused)} (its kernels choice is used); pass solver='lsqr' "
                                f"to solve by LSQR with them")
        # Per example (and pilot): the dense J's or the Krylov bases' ranks, and the Krylov steps run
        # twice (one-pass Gram–Schmidt blocks rolled back).
        ranks = np.zeros((B, krylov_pilots), dtype=np.int64)
        redone = np.zeros((B, krylov_pilots), dtype=np.int64)
        # Krylov steps through the operator; with the dense solve, the products that built each J
        passes = np.full((B, krylov_pilots), -1, dtype=np.int64)
        reuse = _REUSE.get()
        if reuse is not None and (solver not in ("dense", "krylov") or type(noise) is not Gaussian):
            reuse = None  # LSQR has nothing σ-free to keep; a per-feature σ changes the operator itself
        given_chunk = chunk_size is not None   # (the plan line's "(chunk_size)" against "(automatic)")
        if reuse is not None:
            # (the user's model: a ScaledInputs made afresh each call has an id of its own each call)
            reuse.match((id(validation.user_model(user_model)), model_fingerprint(model),
                         key_batch_fingerprint(model, batch), str(batch.device),
                         sha256_tensors(example_ids), solver, jacobian, json.dumps(dataclasses.asdict(options)),
                         krylov_pilots, int(seed), size, restarts, basis, tf32,
                         None if targets is None else sha256_tensors(np.asarray(
                             parse_targets(targets, tuple(batch.shape[1:]), basis), dtype=np.int64)),
                         targeted_method, singular_steps, bool(null_probes)))
            if chunk_size is None:
                chunk_size = reuse.chunk_size
        if chunk_size is None:
            chunk_size = (_dense_chunk(batch, restarts, n, p) if solver == "dense"
                          else _krylov_chunk(model, batch, restarts, n, p, jacobian, options, krylov_pilots)
                          if solver == "krylov"
                          else _auto_chunk(model, batch, restarts, n, p, jacobian))
            cap = _earlier_chunk(batch, restarts * (iterations - 1) if iterates == "all" else 0, n, p)
            chunk_size = chunk_size if cap is None else min(chunk_size, cap)
        if reuse is not None and reuse.chunk_size is None:
            reuse.chunk_size = chunk_size
        reused_factors = [0]  # examples whose factor or basis came from the store
        # Per chunk, computed here or read back (so that a resumed or sharded call counts the whole result):
        # iterates="all": earlier steps certified, of how many, the widest screen margin, examples;
        # singular_steps: examples given them, modes they lifted, seconds, directions taken in all and fewest
        # an example had (None: a chunk file from before them; 3 values: from before directions were counted)
        earlier_of, singular_of = {}, {}
        # Screening the earlier iterates needs D monotone in each |z_j| (Gaussian, Laplace; a Monte Carlo
        # D is an estimate) and the rounding of the model's forward passes (TF32: 10 bits).
        screen = (iterates == "all" and certify and isinstance(noise, (Gaussian, Laplace))
                  and math.isfinite(_SCREEN_MARGIN))
        unit = 2.0**-11 if tf32 and batch.dtype == torch.float32 else torch.finfo(batch.dtype).eps / 2
        modes_basis = basis   # compute() names its Krylov basis so
        model64 = validation.float64_model(model, batch, certify)
        validation.warn_uncertified(batch, certify)
        if certify or batch.dtype == torch.float64:
            validation.check_repeatable(model64, batch, validation.noise_shift(noise, size), jacobian=jacobian)
        unchanged = _StillTheSameFunction(
            model64, batch, validation.noise_shift(noise, size),
            torch.float64 if model64 is not model or batch.dtype == torch.float64 else batch.dtype, model, features,
            # probe_independent's tolerance (rows alone against the batch round apart); TF32's ~5e-4, 20x over
            1e-2 if tf32 and batch.dtype == torch.float32 else max(1e-4, 4 * torch.finfo(batch.dtype).eps))
        # the precision of the forward passes that give z_ε (float64 passes are taken as exact)
        z_dtype = "float64" if certify else validation.dtype_name(batch.dtype)
        z_exact = z_dtype == "float64"
        # The targeted directions, from the dense solve's J and factorization, or (targeted_method
        # "auto") from the Krylov basis: its space's Cramér-Rao directions cost no model product, where
        # targeted_bound's own LSQR would cost two solves per (example, mode).
        # The targeted bounds are found chunk by chunk, after Algorithm 1's, by targeted_bound.
        share = None  # where a chunk's targeted directions come from: "dense", "krylov" or None (its own)
        if targets is not None:
            from hcrfast.targeted import (DenseDirections, TargetedBounds, _warn_targeted, parse_targets, resolve_method,
                                          targeted_bound)

            modes = parse_targets(targets, input_shape, basis)
            if targeted_method != "lsqr":
                if solver == "dense" and resolve_method(targeted_method, n, p) == "dense":
                    share = "dense"
                elif solver == "krylov" and targeted_method == "auto":
                    share = "krylov"
            if share is not None:
                q_modes = to_torch(dense.basis_vectors(input_shape, basis, modes, batch.device))
            if null_probes and share != "dense" and not (
                    share is None and targeted_method != "lsqr" and resolve_method(targeted_method, n, p) == "dense"):
                took = "" if solver_asked == solver else f", which solver={solver_asked!r} took"
                raise ValueError("null_probes=True takes J's null space from its dense factorization, but the target "
                                 "modes' directions come from "
                                 + ("LSQR (targeted_method='lsqr')" if targeted_method == "lsqr" else
                                    f"the Krylov bases (solver='krylov'{took})" if share == "krylov" else
                                    f"LSQR (J of {n} x {p} values is past the dense limits)")
                                 + ("; pass targeted_method='dense'" if solver == "dense" else
                                    "; pass solver='dense' (or targeted_method='dense')") + ", or null_probes=False")
        targeted_of = {}  # chunk start -> its TargetedBounds

        try:
            std = xp.zeros((B, p))
            mse = xp.zeros(B)
            best_eps = xp.zeros((B, p))
            best_z = xp.zeros((B, n))
            divergence = xp.zeros((B, restarts))
            best_restart = xp.zeros(B, dtype=xp.int64)
            itn = xp.zeros((B, restarts, iterations), dtype=xp.int64)
            istop = xp.zeros((B, restarts, iterations), dtype=xp.int64)
        except MemoryError as exc:   # (NumPy's names a size only: say which arguments make it)
            raise MemoryError(f"the results of {B} examples x restarts={restarts} x iterations={iterations} "
                              f"(D per restart, iteration counts and stop codes per step: "
                              f"{B * restarts * (1 + 2 * iterations) * 8 / 2**30:.3g} GiB, beside {B} x {2 * p + n} "
                              f"values of the bounds and steps) do not fit in memory: pass fewer restarts or "
                              f"iterations, or bound the batch in parts") from exc
        results = dict(std=std, mse=mse, eps=best_eps, z=best_z, divergence=divergence, best_restart=best_restart,
                       lsqr_iterations=itn, lsqr_istop=istop)  # the rows a checkpoint keeps per chunk
        reasons_of = {}  # chunk start -> its lines of infinite_reasons
        zero_of = {}  # chunk start -> its lines of zero-step reasons (restarts whose eps is 0)
        risky_of = {}  # chunk start -> (restarts whose D float64 may have rounded by > 1e-6, the worst estimate)
        filled = set()  # the (start, stop) of every chunk whose rows are filled
        tag = "" if world is None else world.tag
        saved = None
        if checkpoint is not None:
            key = dict(
                format=CHECKPOINT_FORMAT, model=key_model_fingerprint(model), example_ids=sha256_tensors(example_ids),
                batch=key_batch_fingerprint(model, batch),
                noise=repr(noise), size=size, iterations=iterations, restarts=restarts, seed=int(seed),
                linearize_at=linearize_at, basis=basis, certify=bool(certify), jacobian=jacobian,
                lsqr=dataclasses.asdict(options), tf32=bool(tf32), warm_start=bool(warm_start), solver=solver,
                krylov_pilots=krylov_pilots)
            if iterates != "last":  # (absent for "last": checkpoints made before it was keyed, all "last", resume)
                key.update(iterates=iterates)
            if targets is not None:  # (absent without them: checkpoints made before they were keyed still resume)
                key.update(targets=f"{len(modes)} modes sha256:{sha256_tensors(np.asarray(modes, dtype=np.int64))}",
                           targeted_method=targeted_method)
                if keep_targeted_eps:  # chunk files with the steps; the default's hold none
                    key.update(keep_targeted_eps=True)
                if null_probes:  # (absent without them: the folders made before they were offered resume)
                    key.update(null_probes=True)
            if singular_steps:  # (absent without them: checkpoints made before they existed still resume)
                key.update(singular_steps=singular_steps)
            clean = features.detach().cpu().numpy()
            # the dense J's rows are pulled back per example since 2026-11-27 (last bits differ from before)
            arithmetic = arithmetic_of(batch.device) + ("; dense J by nonzero rows" if solver == "dense" else "")
            required = tuple(results) + ("ranks", "redone", "reasons")  # what every chunk file holds
            if world is None or world.size == 1:
                saved = Checkpoint(checkpoint, key, example_ids, clean, arithmetic, chunk_size=chunk_size,
                                   required=required)
            else:
                saved, chunk_size = _join(world, checkpoint, key, example_ids, clean, chunk_size, batch.device,
                                          arithmetic, required)
        if progress:   # what the call will do, before its first chunk (a user saw nothing of it until the end)
            validation.say(f"hcrfast.bound{tag}: " + _plan_line(B, restarts, iterations, solver, krylov_pilots,
                                                                 krylov.step_limit(n, p, options), singular_steps,
                                                                 chunk_size, given_chunk, iterates, certify))

        def f0_of(start, stop):  # the chunk's clean features, one row per restart
            return from_torch(features[start:stop].repeat_interleave(restarts, dim=0))

        def compute(start, stop):
            bad = _nonfinite_derivative(model, batch[start:stop])  # one backward pass: the step's premise
            if bad:
                raise infinite_derivative(bad, start)
            x = batch[start:stop].repeat_interleave(restarts, dim=0)
            f0 = f0_of(start, stop)
            with np.errstate(over="ignore"):  # an inf here is refused after the solve, with its cause
                z0 = xp.asarray(start_vectors(example_ids[start:stop], restarts, n, seed=seed, size=size, noise=noise),
                                dtype=f0.dtype)
            min_norm = targeted_dirs = basis = None
            kept = None if reuse is None else reuse.entries.get((start, stop))
            if kept is not None:  # an earlier call's, at another σ: nothing here depends on σ
                if solver == "krylov":
                    basis, targeted_dirs = kept
                else:
                    min_norm, targeted_dirs = kept
                if targeted_dirs is not None:
                    targeted_dirs = (targeted_dirs[0], 0.0)  # this call spent nothing on them
                reused_factors[0] += stop - start
            elif solver == "krylov":
                with profiling.annotate("krylov-basis"):
                    # Restarts 0..pilots-1 of each example start the bases, one each.
                    pilot = xp.ascontiguousarray(z0.reshape(stop - start, restarts, n)[:, :krylov_pilots]
                                                 .reshape(-1, n))
                    op = TorchJacobian(model, batch[start:stop].repeat_interleave(krylov_pilots, dim=0),
                                       mode=jacobian)
                    try:
                        with np.errstate(over="ignore", invalid="ignore"):  # as the solve below
                            basis = krylov.build(op, pilot, options,
                                                 progress=_basis_progress(
                                                     start, stop, B, t_start, f"hcrfast.bound{tag}",
                                                     krylov.step_limit(n, p, options)) if progress else None)
                    except krylov.BasisOverflow as exc:   # in LSQR's words for the same inputs (_check_perturbations)
                        raise validation.StepsOutOfRange(
                                         f"{noise.describe().split(':')[0]} with size={size:g} asks for steps "
                                         f"{validation.dtype_name(batch.dtype)} cannot hold: the Krylov basis "
                                         f"overflowed (inf or NaN) building from the first steps' target shifts "
                                         f"(basis {exc.row}, step {exc.k}); pass a sigma nearer the features' scale "
                                         f"(hcrfast.rms_sigma(features, scale))"
                                         + (", a smaller size, or a float64 model and batch"
                                            if batch.dtype != torch.float64 else " or a smaller size")) from exc
                if share is not None:
                    t0 = time.perf_counter()
                    with profiling.annotate("targeted-directions"):
                        targeted_dirs = (krylov.directions(basis, q_modes, pilots=krylov_pilots),
                                         time.perf_counter() - t0)
                if reuse is not None:
                    reuse.admit((start, stop), (basis, targeted_dirs))
            elif solver == "dense":
                with profiling.annotate("dense-factor"):
                    J, products, jac_mode = dense.jacobian(model, batch[start:stop], skip_zero_rows=True,
                                                           return_products=True, return_mode=True)
                    min_norm = dense.min_norm_solver(J, smallest=singular_steps)
                    min_norm.jacobian_products, min_norm.jacobian_mode = products, jac_mode
                if share is not None:
                    t0 = time.perf_counter()
                    with profiling.annotate("targeted-directions"):
                        targeted_dirs = (min_norm.directions(q_modes, J), time.perf_counter() - t0)
                del J
                if reuse is not None:
                    reuse.admit((start, stop), (min_norm, targeted_dirs))
            # A σ·s outside the dtype's range makes NaN or inf in the solve: _check_perturbations refuses
            # the chunk with the cause, so NumPy's warnings along the way would only be noise.
            with np.errstate(over="ignore", invalid="ignore"):
                eps, c_itn, c_istop, earlier = _chunk_perturbations(
                    model, x, f0, z0, iterations=iterations, linearize_at=linearize_at,
                    options=options, jacobian=jacobian, warm_start=warm_start, min_norm=min_norm, basis=basis,
                    krylov_pilots=krylov_pilots, keep_iterates=iterates == "all",
                    progress=_lsqr_progress(start, stop, B, iterations, t_start, f"hcrfast.bound{tag}")
                    if progress and solver == "lsqr"
                    else None)
            c_ranks = None if min_norm is None else min_norm.rank.cpu().numpy()
            if basis is not None:  # the pilots' first steps are where the products went
                first = (xp.arange(stop - start)[:, None] * restarts + xp.arange(krylov_pilots)[None, :]).ravel()
                c_itn[first, 0] = xp.asarray(basis.steps)
                c_istop[first, 0] = xp.asarray(basis.istop)
                c_ranks = basis.rank
            theta64 = {}   # a(θ) of the chunk in float64, once taken (_certified_iterates)
            with profiling.annotate("certify"):
                eps64, z64 = _certified_shift(model64, x, eps) if certify else _applied_shift(model, x, eps, f0)
            # every iterate certified: a restart whose last iterate came out 0 (J = 0 at the current point it was
            # linearized at: a saturated unit) still bounds by its earlier ones; only all of them 0 is refused
            earlier_moved = None
            if iterates == "all" and len(earlier) > 1:
                earlier_moved = xp.zeros(eps64.shape[0], dtype=bool)
                for e_i, _ in earlier[:-1]:
                    earlier_moved |= xp.any(xp.asarray(e_i) != 0, axis=1)
            _check_perturbations(eps64, z64, noise, size, batch.dtype,
                                 intended=None if earlier_moved is None else ~earlier_moved,
                                 features_move=lambda: bool(_features_move(model64 if certify else model, x).any()),
                                 derivative_vanishes=lambda: _derivative_vanishes(model, x),
                                 first=earlier[0] if iterates == "all" and earlier else None)
            earlier_shifts = magnitude = slope = None
            z_last = earlier.pop()[1]   # the last iterates' shifts in the model's dtype
            drift = (_dtype_drift(z_last, z64) if certify and iterations > 1 and batch.dtype != torch.float64
                     else None)
            if earlier:  # iterates="all": ε(1) … ε(i−1) of every row, certified in one call
                k, m = len(earlier), stop - start
                # rows example-major, then iterate, then restart: (m, k, R) flattened, one copy each
                stacked = xp.concatenate([e.reshape(m, 1, restarts, -1) for e, _ in earlier], axis=1)
                stacked = stacked.reshape(k * len(x), -1)
                shifts = xp.concatenate([zj.reshape(m, 1, restarts, -1) for _, zj in earlier], axis=1)
                shifts = shifts.reshape(k * len(x), -1)
                del earlier
                take = margin = None   # every earlier step, unless screened
                if screen:   # (certify=True only)
                    with profiling.annotate("certify-screen"):
                        magnitude = _rounding_magnitude(model64, batch[start:stop], from_torch(features[start:stop]),
                                                        jacobian)
                        slope = _rounding_slope(model64, batch[start:stop], jacobian)
                        with np.errstate(over="ignore", invalid="ignore"):
                            take, margin = _screen_in_part(
                                stacked, shifts, eps64, z64, z_last, magnitude, noise, restarts=restarts,
                                input_shape=input_shape, basis=modes_basis, unit=unit, impl=options.kernels,
                                slope=slope, theta_max=from_torch(batch[start:stop].double()
                                                                  .reshape(stop - start, -1).abs().amax(dim=1)),
                                sample=x.device.type == "cpu")
                            take = None if take is None else take.reshape(-1)
                picked = np.arange(k * len(x)) if take is None else np.flatnonzero(take)
                owner = torch.as_tensor(picked // (k * restarts), device=batch.device)
                rows_at = xp.asarray(picked)
                steps = stacked if take is None else stacked[rows_at]   # no copy of them all
                with profiling.annotate("certify"):
                    if not len(picked):
                        got = (xp.zeros((0, p)), xp.zeros((0, n)))
                    elif certify:
                        got = _certified_iterates(model64, batch[start:stop], owner, steps, at=theta64)
                    else:
                        got = _applied_shift(model, batch[start:stop][owner], steps, f0[xp.asarray(
                            picked // (k * restarts) * restarts)])
                if len(picked):
                    _check_perturbations(*got, noise, size, batch.dtype,
                                         features_move=lambda: bool(_features_move(model64 if certify else model, x)
                                                                    .any()),
                                         derivative_vanishes=lambda: _derivative_vanishes(model, x))
                del stacked, shifts, steps
                if take is None:
                    earlier_shifts = (got[0], got[1], None, None)
                else:  # the steps not certified bound nothing here (ε = 0, z = 0: a bound of 0)
                    e_all, z_all = xp.zeros((k * len(x), p)), xp.zeros((k * len(x), n))
                    e_all[rows_at], z_all[rows_at] = got
                    earlier_shifts = (e_all, z_all, take.reshape(m, k, restarts), margin)
                del got
            singular_shifts = None
            if singular_steps:   # J's smallest singular directions, each a step scaled to a shift of size·σ
                t0 = time.perf_counter()
                with profiling.annotate("singular-steps"):
                    if min_norm is not None:
                        dirs, values = min_norm.smallest, min_norm.smallest_values
                    else:
                        dirs, values = krylov.smallest_directions(basis, singular_steps, pilots=krylov_pilots)
                    # Both signs: the factorization's sign of each vector is arbitrary (LAPACK's and torch's
                    # eigensolvers differ), and where the model curves over a step this long, +v and -v move
                    # the features differently (race MLP: a median of 1.56 or 1.39 by the sign each took).
                    dirs, values = torch.cat([dirs, -dirs], dim=1).detach(), values.repeat(1, 2).detach()
                    m, rows = stop - start, 2 * singular_steps
                    scale = torch.where(values > 0, size * gaussian_sigma / torch.where(values > 0, values, 1.0), 0.0)
                    steps = from_torch((dirs * scale[..., None]).reshape(m * rows, p))
                    owner = torch.arange(m, device=batch.device).repeat_interleave(rows)
                    # Rows of value 0 (past an example's rank, or its basis' kept vectors) are steps of 0: their
                    # shift is 0 without a forward pass (ε = 0, z = 0: a bound of 0, as certified).
                    has = (values > 0).cpu().numpy()   # (m, 2K) on the host: one read for both uses
                    live = np.flatnonzero(has.reshape(-1))
                    every = len(live) == m * rows
                    got = ((xp.empty if every else xp.zeros)((m * rows, p)),
                           (xp.empty if every else xp.zeros)((m * rows, n)))
                    # in pieces of the chunk's restart rows, which its forward passes hold already
                    per = max(1, m * restarts)
                    with profiling.annotate("certify"):
                        for r0 in range(0, len(live), per):
                            r1 = min(len(live), r0 + per)
                            if every:
                                at = at_owner = slice(r0, r1)
                            else:
                                at = xp.asarray(live[r0:r1])
                                at_owner = torch.as_tensor(live[r0:r1], device=owner.device)
                            if certify:
                                piece = _certified_iterates(model64, batch[start:stop], owner[at_owner], steps[at],
                                                            at=theta64)
                            else:
                                piece = _applied_shift(model, batch[start:stop][owner[at_owner]],
                                                       steps[at].astype(from_torch(batch[:1]).dtype),
                                                       f0[xp.asarray(owner[at_owner].cpu().numpy() * restarts)])
                            got[0][at], got[1][at] = piece
                # directions each example has (value > 0: within its rank, or its bases' kept vectors)
                taken = has[:, :singular_steps].sum(axis=1)
                singular_shifts = (got[0], got[1], time.perf_counter() - t0, taken)
                del got, steps
            if basis is not None:
                again = (basis.redone, basis.passes)
            elif min_norm is not None and min_norm.jacobian_products is not None:  # the dense J's products
                again = (np.zeros(stop - start, dtype=np.int64), min_norm.jacobian_products)
            else:
                again = None
            return (eps64, z64, c_itn, c_istop, c_ranks, again, min_norm, targeted_dirs, earlier_shifts, magnitude,
                    slope, singular_shifts, drift, earlier_moved)

        def store(start, stop, result):
            (eps64, z64, c_itn, c_istop, c_ranks, again, min_norm, targeted_dirs, earlier_shifts,
             magnitude, slope, singular_shifts, drift, earlier_moved) = result
            screened, singular_done = [0, 0, 0.0], [0, 0, 0.0, 0, 0]   # this chunk's accounts
            if again is not None:
                redone[start:stop] = np.asarray(again[0]).reshape(stop - start, -1)
                passes[start:stop] = np.asarray(again[1]).reshape(stop - start, -1)
            if c_ranks is not None:
                ranks[start:stop] = np.asarray(c_ranks).reshape(stop - start, -1)
            if targets is not None:
                dirs = None
                if targeted_dirs is not None:
                    found, seconds = targeted_dirs
                    if min_norm is not None:
                        dirs = DenseDirections(eps=found.eps, null_part=found.null_part,
                                               null_fraction=found.null_fraction, null_dim=min_norm.null_dim,
                                               jacobian=min_norm.jacobian_mode,
                                               seconds=(0.0, seconds))
                    else:  # the Krylov space's directions: no null-space parts
                        dirs = DenseDirections.empty(stop - start, len(modes), p, jacobian, batch.device,
                                                     method="krylov")
                        dirs.eps[:] = found
                        dirs.seconds = (0.0, seconds)
                # bound()'s lsqr and chunk_size are Algorithm 1's; targeted_bound uses its own defaults.
                # Null-space probes only where asked for (null_probes=True): huge or infinite values there say
                # what J does not see, where by default the bounds are those of what it sees.
                # bound's summary speaks of its bounds of 0 itself, and bound warns once of the targeted steps
                # that rounding decided, over all chunks
                with warnings_ignored((r".* pairs got no direction", UserWarning),
                                      (r"\d+ targeted steps", UserWarning)):
                    targeted_of[start] = targeted_bound(
                        model, batch[start:stop], noise, targets=targets, size=size, method=targeted_method,
                        basis=basis, certify=certify, null_probes=bool(null_probes), tf32=tf32, directions=dirs)
                if not keep_targeted_eps:  # their bounds on every mode are taken: K·p values an example freed
                    targeted_of[start] = dataclasses.replace(targeted_of[start], eps=None)
            with profiling.annotate("bound"):
                m = stop - start

                def assess(eps64, z64, restarts=restarts):
                    """Steps (ε, z), ``restarts`` rows an example (example-major): their bounds and why some are
                    +inf or 0. The last iterates: a row per restart; with iterates="all" also ε(1) … ε(i−1),
                    (i−1)·R rows an example, iterate-major within it."""
                    nonlocal magnitude, slope
                    if z_exact:
                        if magnitude is None:   # the features' rounding scale: the batch's, then the step's
                            magnitude = _rounding_magnitude(model64 if certify else model, batch[start:stop],
                                                            from_torch(features[start:stop]), jacobian)
                        if slope is None:
                            slope = _rounding_slope(model64 if certify else model, batch[start:stop], jacobian)
                        rows_slope = None if slope is None else xp.repeat(slope, restarts, axis=0)
                        far = _far_slope(model64 if certify else model, batch[start:stop],
                                         np.arange(m * restarts) // restarts, eps64, jacobian)
                        mag = _step_magnitude(xp.repeat(magnitude, restarts, axis=0), far, eps64, z64)
                        rel = _rounding_error(mag, z64)
                        z_up = _widened(z64, mag, eps64, rows_slope)   # D past float64's rounding of the passes
                        del mag, rows_slope, far
                    else:
                        z_up = z64
                    with np.errstate(over="ignore"):  # D = inf (‖z‖ ≫ σ) gives bound 0, counted below
                        d = divergence_of(noise, z_up).reshape(m, restarts)
                    del z_up
                    coords = eps64.reshape((m * restarts,) + input_shape)
                    if basis == "dct":
                        with profiling.annotate("dct"):
                            coords = kernels.dct2(coords, impl=options.kernels)
                    norms = xp.sqrt(xp.einsum("ri,ri->r", eps64, eps64)).reshape(m, restarts, 1)
                    coords = coordinates_down(xp.abs(coords.reshape(m, restarts, p)), norms,
                                              coordinate_terms(basis, input_shape))
                    zero_d = d == 0
                    safe_d = xp.where(zero_d, 1.0, d)
                    moved = xp.any(eps64 != 0, axis=1).reshape(m, restarts)
                    # D = 0 proves +inf only where z_ε comes from float64 passes (taken as exact): features
                    # left unchanged by uncertified float32 passes may only have rounded the shift away, and
                    # float64 ones too where the same direction, scaled up, moves them.
                    unresolved = zero_d & moved & (not z_exact)
                    rounded = xp.zeros_like(zero_d)
                    if z_exact:
                        rows = np.flatnonzero(to_host(zero_d & moved).ravel())
                        if rows.size:
                            lost = _rounded_away(model64 if certify else model,
                                                 batch[start:stop][torch.as_tensor(rows // restarts)],
                                                 eps64[xp.asarray(rows)], jacobian)
                            rounded = rounded.ravel()
                            rounded[xp.asarray(rows[lost])] = True
                            rounded = rounded.reshape(zero_d.shape)
                        coarse, _, worst = _coarse_shifts(rel)
                        risky = ((rel > _ROUNDING_TOLERANCE) & ~coarse).reshape(zero_d.shape)
                        coarse = coarse.reshape(zero_d.shape)
                    else:
                        coarse, risky, worst = xp.zeros_like(zero_d), xp.zeros_like(zero_d), 0.0
                    unresolved = unresolved | rounded
                    infinite = zero_d & ~unresolved
                    # +inf is for D = 0 only: a finite bound beyond float64's range (σ ≥ 1e100 against
                    # saturated features) is reported as float64's largest value, still a lower bound.
                    with np.errstate(over="ignore"):
                        per_restart = xp.minimum(coords / xp.sqrt(safe_d)[..., None], _FLOAT64_MAX)
                        sq = (norms[..., 0] ** 2 / p) * (1.0 - (p + _COORD_ROUNDING_TERMS) * D_ROUNDING_UNIT)
                        mse_r = xp.where(zero_d, xp.where(infinite & (sq > 0), xp.inf, 0.0),
                                         xp.minimum(sq / safe_d, _FLOAT64_MAX))
                    per_restart = xp.where(infinite[..., None] & (coords > 0), xp.inf, per_restart)
                    per_restart = xp.where(zero_d[..., None] & ~(infinite[..., None] & (coords > 0)), 0.0, per_restart)
                    per_restart = xp.where(coarse[..., None], 0.0, per_restart)  # D not established
                    mse_r = xp.where(coarse, 0.0, mse_r)
                    return (per_restart, mse_r, d, zero_d, moved, unresolved, rounded, coarse, infinite,
                            risky, worst)

                (per_restart, mse_r, d, zero_d, moved, unresolved, rounded, coarse, infinite,
                 risky, worst) = assess(eps64, z64)
                std[start:stop] = per_restart.max(axis=1)
                best = xp.argmax(mse_r, axis=1)
                rows = xp.arange(m) * restarts + best
                mse[start:stop] = mse_r[xp.arange(m), best]
                best_restart[start:stop] = best
                best_eps[start:stop] = eps64[rows]
                best_z[start:stop] = z64[rows]
                divergence[start:stop] = d
                itn[start:stop] = c_itn.reshape(m, restarts, iterations)
                istop[start:stop] = c_istop.reshape(m, restarts, iterations)
                earlier_inf = []   # +inf from an earlier iterate: (example, restart, iterate)
                if earlier_shifts is not None:
                    # ε(j), j < i: certified like the last, so each mode takes the largest bound of all
                    e64, zz64, take, margin = earlier_shifts
                    k = e64.shape[0] // (m * restarts)
                    screened[0] += e64.shape[0] if take is None else int(take.sum())
                    screened[1] += e64.shape[0]
                    if margin is not None:
                        screened[2] = max(screened[2], margin)
                    e64, zz64 = e64.reshape(m, k, restarts, -1), zz64.reshape(m, k, restarts, -1)
                    final_inf = to_host(zero_d & moved & ~unresolved)
                    first_inf = {}   # one reason per restart: the last iterate's if it has one, else its first
                    per = max(1, min(k, _EARLIER_VALUES // max(1, m * restarts * p)))   # iterates a slice
                    for g in range(0, k, per):
                        h = min(k, g + per) - g
                        if take is not None and not take[:, g:g + h].any():
                            continue   # screened out: ε = 0 there, which bounds nothing
                        es = e64[:, g:g + h].reshape(m * h * restarts, -1)
                        zs = zz64[:, g:g + h].reshape(m * h * restarts, -1)
                        (pr, mr, _, zd, mv, unr, _, _, _, rk, w) = assess(es, zs, restarts=h * restarts)
                        std[start:stop] = xp.maximum(std[start:stop], pr.max(axis=1))
                        del pr
                        bj = xp.argmax(mr, axis=1)            # iterate g + 1 + bj // R, restart bj % R
                        top = mr[xp.arange(m), bj]
                        better = top > mse[start:stop]   # strictly: the last iterate, then the earliest, keeps ties
                        rows_j = xp.arange(m) * (h * restarts) + bj
                        mse[start:stop] = xp.where(better, top, mse[start:stop])
                        best_restart[start:stop] = xp.where(better, bj % restarts, best_restart[start:stop])
                        best_eps[start:stop] = xp.where(better[:, None], es[rows_j], best_eps[start:stop])
                        best_z[start:stop] = xp.where(better[:, None], zs[rows_j], best_z[start:stop])
                        risky = risky | rk.reshape(m, h, restarts).any(axis=1)   # a restart counts once
                        worst = max(worst, w)
                        zd, inf_j = to_host(xp.stack([zd & xp.any(zs != 0, axis=1).reshape(m, h * restarts),
                                                      zd & mv & ~unr]))
                        if zd.any():
                            raise ValueError(divergence_underflow(noise, int(zd.sum())))
                        for e, c in zip(*np.nonzero(inf_j)):   # iterate-major within an example: earliest first
                            if not final_inf[e, c % restarts]:
                                first_inf.setdefault((e, c % restarts), g + c // restarts + 1)
                        del es, zs
                    earlier_inf = [(e, r, j) for (e, r), j in sorted(first_inf.items())]
                    del e64, zz64
                singular_inf = []   # +inf from a singular step: (example, step)
                extra_risky, extra_worst = 0, 0.0   # singular steps whose D float64's rounding may move
                # the examples whose result takes Algorithm 1's bound on some mode (all, without singular steps)
                algorithm1_taken = xp.ones((m, 1), dtype=bool)
                if singular_shifts is not None:
                    # J's smallest singular directions, certified: each mode takes the larger bound
                    es, zs, seconds, taken = singular_shifts
                    K = es.shape[0] // m
                    (pr, _, _, zd, mv, unr, _, _, _, rk, w) = assess(es, zs, restarts=K)
                    top = pr.max(axis=1)
                    singular_done[0] += m
                    singular_done[1] += int(to_host((top > std[start:stop]).sum()))
                    singular_done[2] += seconds
                    singular_done[3:] = [int(taken.sum()), int(taken.min())]
                    algorithm1_taken = (std[start:stop] > top).reshape(m, -1).any(axis=1)[:, None]
                    std[start:stop] = xp.maximum(std[start:stop], top)
                    del pr, top
                    extra_risky, extra_worst = int(to_host(rk.sum())), w
                    zd, inf_k = to_host(xp.stack([zd & xp.any(zs != 0, axis=1).reshape(m, K), zd & mv & ~unr]))
                    if zd.any():
                        raise ValueError(divergence_underflow(noise, int(zd.sum())))
                    singular_inf = list(zip(*np.nonzero(inf_k)))
                    del es, zs
                risky_of[start] = (int(to_host(risky.sum())), worst, extra_risky, extra_worst,
                                   *((0, 0.0) if drift is None else
                                     _drift_count(drift.reshape(m, restarts), algorithm1_taken)))
                earlier_of[start] = screened + [m] if earlier_shifts is not None else None
                singular_of[start] = singular_done if singular_shifts is not None else None
                shifted = xp.any(z64 != 0, axis=1).reshape(m, restarts)
                zero_d, moved, underflow, unresolved, rounded, coarse = to_host(xp.stack([
                    zero_d, moved, zero_d & shifted, unresolved, rounded, coarse]))
                if underflow.any():
                    raise ValueError(divergence_underflow(noise, int(underflow.sum())))
                c_reasons = [f"example {start + e}, restart {r}: {INFINITE_REASON}"
                             for e, r in zip(*np.nonzero(zero_d & moved & ~unresolved))]
                c_reasons += [f"example {start + e}, restart {r}: its iterate {j} of {iterations}: {INFINITE_REASON}"
                              for e, r, j in earlier_inf]
                c_reasons += [f"example {start + e}, singular step {k % singular_steps} "
                              f"({'+' if k < singular_steps else '-'}v): {INFINITE_REASON}" for e, k in singular_inf]
                reasons_of[start] = c_reasons
                # (a restart whose earlier iterates moved bounds by them: its last iterate's 0 is no lost restart)
                lost = zero_d & ~moved & (True if earlier_moved is None else
                                          ~to_host(earlier_moved).reshape(m, restarts))
                c_zero = _zero_step_reasons(lost, start, model64 if certify else model, batch[start:stop])
                c_zero += [f"example {start + e}, restart {r}: a(theta+eps) == a(theta) in {z_dtype}, {_UNRESOLVED} "
                           f"(certify=False): {z_dtype} may have rounded the features' shift away, so D = 0 is not "
                           f"established and this restart bounds nothing (0); certify=True decides it"
                           for e, r in zip(*np.nonzero(unresolved & ~rounded))]
                c_zero += [f"example {start + e}, restart {r}: a(theta+eps) == a(theta) in float64, but J eps is not "
                           f"0 (or the features move once eps is scaled up): the shift is {_ROUNDED} against "
                           f"features of this size, so D = 0 is rounding, not a direction the features do not see, "
                           f"and this restart bounds nothing (0)"
                           for e, r in zip(*np.nonzero(rounded))]
                c_zero += [f"example {start + e}, restart {r}: a(theta+eps) - a(theta) is {_COARSE} of features "
                           f"this size (it may move D by more than {_ROUNDING_LIMIT:g}), so D is not established and "
                           f"this restart bounds nothing (0)" for e, r in zip(*np.nonzero(coarse))]
                zero_of[start] = c_zero
            if saved is not None:
                with profiling.annotate("checkpoint"):
                    part = {name: to_host(a[start:stop]) for name, a in results.items()}
                    if targets is not None:
                        t_arrays, t_meta = targeted_of[start].to_arrays()
                        part.update({f"targeted.{k}": v for k, v in t_arrays.items()},
                                    targeted_meta=np.array(json.dumps(t_meta, default=json_default)))
                    # the chunk's last forward (its certification's included) ran: a model that changed itself
                    # since the check before is refused here, before a chunk of another function is in the folder
                    unchanged.check(saved, shared=not unshared, chunk=(start, stop))
                    saved.save(start, stop, ranks=ranks[start:stop], redone=redone[start:stop],
                               passes=passes[start:stop],
                               reasons=np.array(c_reasons, dtype=str), zero_reasons=np.array(c_zero, dtype=str),
                               rounding=np.array(risky_of[start], dtype=np.float64),
                               **{name: np.array(acc, dtype=np.float64) for name, acc in
                                  (("earlier", earlier_of[start]), ("singular", singular_of[start])) if acc is not None},
                               **part)
            computed[0] += stop - start
            filled.add((start, stop))
            if progress:
                done = (f"examples {reused + computed[0]}/{B}" if not tag
                        else f"{computed[0]}/{computed[2]} of this process's examples")
                _progress_line(f"hcrfast.bound{tag}", done, t_start, computed[1], computed[0], computed[2])

        def beating(start, stop):
            with _heartbeat(progress, start, stop, B, t_start, tag):
                return compute(start, stop)

        def on_halve(chunk):
            if saved is not None:   # the chunks from here on are of this size: theirs to record
                saved.chunk_size = chunk
            if progress:
                validation.say(f"hcrfast.bound{tag}: out of memory, chunk halved to {chunk} examples")

        def read_back():
            """Fill the rows of the checkpoint's finished chunks that are not filled yet; the list of chunks."""
            with profiling.annotate("checkpoint"):
                finished = saved.finished()
                for start, stop, arrays in finished:
                    if (start, stop) in filled:
                        continue
                    filled.add((start, stop))
                    for name, a in results.items():
                        a[start:stop] = xp.asarray(arrays[name])
                    ranks[start:stop], redone[start:stop] = arrays["ranks"], arrays["redone"]
                    passes[start:stop] = arrays.get("passes", -1)  # (a file from before they were counted)
                    reasons_of[start] = [str(r) for r in arrays["reasons"]]
                    zero_of[start] = [str(r) for r in arrays.get("zero_reasons", [])]
                    # (restarts, worst, singular steps, their worst, restarts whose model-dtype shifts
                    # strayed, the worst stray: _dtype_drift); files before 2026-11-30 hold 2, the singular
                    # steps counted with the restarts, and before 2026-12-01 4, the strays not counted
                    n_risky, worst, n_sing, w_sing, n_drift, w_drift = (
                        list(arrays.get("rounding", (0, 0.0))) + [0, 0.0, 0, 0.0])[:6]
                    risky_of[start] = (int(n_risky), float(worst), int(n_sing), float(w_sing), int(n_drift),
                                       float(w_drift))
                    for name, of in (("earlier", earlier_of), ("singular", singular_of)):
                        of[start] = None if name not in arrays else [float(v) for v in arrays[name]]
                    if targets is not None:
                        targeted_of[start] = TargetedBounds.from_arrays(
                            {k[len("targeted."):]: v for k, v in arrays.items() if k.startswith("targeted.")},
                            json.loads(str(arrays["targeted_meta"])))
            return finished

        todo = [(0, B)]
        reused = 0
        if saved is not None:  # read back what an earlier call finished; compute the rest
            finished = read_back()
            reused = sum(stop - start for start, stop, _ in finished)
            todo = checkpoint_gaps(B, finished)
            if progress and reused:
                validation.say(f"hcrfast.bound{tag}: {reused} of {B} examples read back from {checkpoint}")
        if world is not None and world.size > 1:
            world.agree("listed")  # every process has listed the folder before any writes to it
            pieces = [(a, min(hi, a + chunk_size)) for lo, hi in todo for a in range(lo, hi, chunk_size)]
            todo = pieces[world.rank::world.size]
        if saved is not None and todo:
            saved.check_writable()  # before a chunk is computed, not when its file is written
        if todo and solver in ("dense", "krylov"):
            dense.warm_up(batch.device)   # its first chunk's imports and LAPACK, before a chunk holds its memory
        # examples computed by this call, since when, and how many it has to compute
        computed = [0, _Eta(time.perf_counter()), sum(hi - lo for lo, hi in todo)]
        try:
            for lo, hi in todo:
                chunk_size = _in_chunks(hi - lo, chunk_size, lambda a, b, lo=lo: beating(lo + a, lo + b), batch.device,
                                        store=lambda a, b, r, lo=lo: store(lo + a, lo + b, r), on_halve=on_halve)
        except Exception as exc:  # out of memory at one example (_in_chunks halves down to 1): say what it holds
            if _is_oom(exc) and hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(_one_example_note(solver, n, p, restarts, krylov_pilots, options, batch.element_size(),
                                               pilots_auto))
            raise
        # With a checkpoint, the check before the last chunk's save was the model's last forward: not run again
        if todo and saved is None:
            unchanged.check()
        if reuse is not None and todo:
            reuse.chunk_size = chunk_size  # halved where memory ran out: the next call starts there
        if world is not None and world.size > 1:
            if progress:
                validation.say(f"hcrfast.bound{tag}: this process's pieces are done; waiting for the others")
            # every piece is in the folder now (or a process's error is raised here); factors reused, all told
            reused_factors[0] = sum(world.agree("done", reused_factors[0]))
            missing = checkpoint_gaps(B, read_back())  # the other processes' pieces
            if missing:
                raise RuntimeError(f"rows {', '.join(f'{a}..{b - 1}' for a, b in missing)} of the batch are in no "
                                   f"chunk of {checkpoint} after every process finished: a process wrote them "
                                   f"elsewhere; every process must see the same folder")
        if saved is not None:
            saved.tidy()  # every chunk is final: what killed writers left goes
            saved.warn_mixed(RESUME_BITWISE)
        reasons = [line for start in sorted(reasons_of) for line in reasons_of[start]]
        zero_steps = [line for start in sorted(zero_of) for line in zero_of[start]]
        # Counted over the whole result, chunks read back from a checkpoint included, so that a
        # resumed call warns as the uninterrupted one did.
        kinds = collections.Counter(zero_step_kind(line) for line in zero_steps)
        n_blind, n_unresolved = kinds["at_zero_jacobian"], kinds["uncertified"]
        n_rounded, n_coarse = kinds["rounded"], kinds["coarse"]
        degenerate = (len(zero_steps) - n_blind - n_unresolved - n_rounded - n_coarse,
                      int(to_host(xp.isinf(divergence)).sum()), n_blind)
        # restarts whose D float64's rounding may move by more than _ROUNDING_TOLERANCE (bounds kept), the
        # largest such estimate: in params["rounding"] beside the warning
        n_risky, worst = sum(r[0] for r in risky_of.values()), max((r[1] for r in risky_of.values()), default=0.0)
        n_sing, w_sing = sum(r[2] for r in risky_of.values()), max((r[3] for r in risky_of.values()), default=0.0)
        damp = options.damp if solver == "lsqr" else 0.0
        _warn_rounding("restarts' steps", n_coarse, n_risky, worst, damp)
        _warn_rounding("singular steps", 0, n_sing, w_sing)
        n_drift = sum(r[4] for r in risky_of.values() if len(r) > 4)
        w_drift = max((r[5] for r in risky_of.values() if len(r) > 4), default=0.0)
        if n_drift:
            validation.warn(f"{n_drift} restarts' last feature shifts a(theta+eps) - a(theta) in "
                            f"{validation.dtype_name(batch.dtype)} strayed from the float64 ones by more than "
                            f"{_DRIFT_LIMIT:g} of their size (up to {w_drift:.2g}), at examples whose bounds take "
                            f"theirs on some mode: the model's rounding, more than its shift, set Algorithm 1's "
                            f"next steps, so those bounds (certified in float64, rigorous still) follow that "
                            f"rounding: they no longer scale with sigma and differ from a float64 model's; a "
                            f"sigma * size nearer the features' scale, or a float64 model and batch "
                            f"(model.double(), batch.double()), avoids it")
        if n_rounded:
            validation.warn(f"{n_rounded} restarts left the float64 features exactly unchanged, but J eps is not "
                            f"0 (or the features move once eps is scaled up): their shifts are {_ROUNDED} against features of this "
                            f"size (sigma * size too small next to the features), so D = 0 is rounding and they "
                            f"bound nothing (0); pass a sigma nearer the features' scale "
                            f"(hcrfast.rms_sigma(features, scale)){_damp_hint(damp)}; see params['zero_step_reasons']")
        if n_unresolved:
            validation.warn(f"{n_unresolved} restarts left the features exactly unchanged in uncertified "
                            f"{validation.dtype_name(batch.dtype)} forward passes (certify=False), which may have "
                            f"rounded the shift away: D = 0 is not established and they bound nothing (0); "
                            f"certify=True recomputes the shift in float64; see params['zero_step_reasons']")
        if degenerate[0]:
            validation.warn(f"{degenerate[0]} restarts' eps came out 0 in {validation.dtype_name(batch.dtype)} "
                            f"(their steps are outside the range it resolves): they bound nothing (0); see "
                            f"params['zero_step_reasons']")
        if degenerate[2]:
            validation.warn(f"{degenerate[2]} restarts found J = 0 at their example (its features do not move with "
                            f"its input, or torch's derivative of them is 0 there): they bound nothing (0); where the "
                            f"features do not see an input, hcrfast.targeted_bound(..., null_probes=True) certifies "
                            f"+inf for its modes; see params['zero_step_reasons']")
        if degenerate[1]:
            validation.warn(f"D(z) overflowed for {degenerate[1]} restarts (the model moved its features far beyond "
                            f"the noise for a step of the asked size), so they bound nothing (0); a smaller size "
                            f"gives finite D")

        targeted = None
        std_algorithm1 = None
        if targets is not None:
            targeted = TargetedBounds.concatenate([targeted_of[start] for start in sorted(targeted_of)], xp)
            std_algorithm1 = std.reshape((B,) + input_shape).copy()
            # Each targeted step bounds every mode it moves (taken chunk by chunk, with the steps); the max
            # of valid bounds is valid.
            std = xp.maximum(std, targeted.std_every_mode.reshape(B, p))
            reasons.extend(targeted.infinite_reasons)
            _warn_targeted(targeted.rounding, batch.dtype)  # chunks read back from a checkpoint included
        # Read on the solver's stream and allocator (a strided slice's get() copies on the device).
        krylov_steps = to_host(itn[:, :krylov_pilots, 0]) if solver == "krylov" else None

    # the accounts of every chunk of the result, computed by this call (any process) or read back
    earlier_acc = np.array([a for a in earlier_of.values() if a is not None]).reshape(-1, 4)
    singular_acc = np.array([a[:3] for a in singular_of.values() if a is not None]).reshape(-1, 3)
    taken_acc = np.array([a[3:5] for a in singular_of.values() if a is not None and len(a) >= 5]).reshape(-1, 2)
    params = dict(sigma=gaussian_sigma, noise=noise.describe(), noise_asked=noise_asked, size=size,
                  iterations=iterations,
                  restarts=restarts, seed=int(seed),
                  linearize_at=linearize_at, basis=basis, certify=certify, jacobian=jacobian,
                  lsqr=dataclasses.asdict(options), dtype=validation.dtype_name(batch.dtype), tf32=tf32,
                  warm_start=bool(warm_start), solver=solver, iterates=iterates,
                  earlier_iterates=None if iterates != "all" else dict(
                      steps=int(earlier_acc[:, 1].sum()), certified=int(earlier_acc[:, 0].sum()),
                      # (screened: where some chunk was; a chunk the screen declined on, _screen_in_part, certifies
                      # every step and records a margin of 0: a review found "screened" with a margin of 0 reported)
                      examples=int(earlier_acc[:, 3].sum()),
                      screened=bool(screen) and bool(earlier_acc[:, 2].max(initial=0.0) > 0),
                      margin=float(earlier_acc[:, 2].max()) if screen and earlier_acc[:, 2].max(initial=0.0) > 0
                      else None,
                      note="the steps eps(1) .. eps(i-1) of the examples' chunks (computed by this call, in any "
                           "process, or read back; chunk files from before 2026-11-30 did not record them), and "
                           "how many were certified: the others could not raise any mode's bound (their uncertified shifts, "
                           "with a margin for rounding, bound them below what the certified steps give); margin: "
                           "the widest bracket, in units of the model dtype's first-order rounding of the shift"),
                  dense=None if solver != "dense" else dict(
                      # ≤ 0: chunks from a checkpoint written before they were counted (every row pulled back)
                      jacobian_products=float(np.mean(np.where(passes[:, 0] <= 0, min(n, p), passes[:, 0]))),
                      rank_median=float(np.median(ranks)), rank_min=int(ranks.min())),
                  krylov=None if solver != "krylov" else _krylov_params(
                      krylov_steps, ranks, krylov_pilots, redone=redone, passes=passes, auto=pilots_auto),
                  device=str(batch.device), n_features=n, n_inputs=p,
                  checkpoint=None if saved is None else dict(path=str(saved.path), examples_read_back=reused,
                                                               # what the chunks' last bits depend on (arithmetic_of)
                                                               arithmetic=sorted(saved.arithmetics)),
                  reuse=None if reuse is None else dict(
                      examples=reused_factors[0], store_bytes=reuse.used, budget_bytes=reuse.budget,
                      note="the dense factors or Krylov bases of these examples came from an earlier call at "
                           "another sigma (hcrfast.sigma_for): this call made none of their products; the product "
                           "counts above are what building them cost"),
                  shard=None if world is None else dict(rank=world.rank, world_size=world.size,
                                                        examples_computed=computed[0]),
                  zero_step_reasons=zero_steps,
                  rounding=dict(restarts=n_risky, worst=worst, singular_steps=n_sing, worst_singular=w_sing,
                                dtype_drift=n_drift, worst_drift=w_drift),
                  singular_steps=None if not singular_steps else dict(
                      count=singular_steps, auto=singular_auto, examples=int(singular_acc[:, 0].sum()),
                      modes_lifted=int(singular_acc[:, 1].sum()), seconds=float(singular_acc[:, 2].sum()),
                      # directions the examples had (the rest, past an example's rank or its Krylov bases' kept
                      # vectors, are steps of 0 that bound nothing), over the chunks that counted them
                      directions=None if not len(taken_acc) else dict(
                          total=int(taken_acc[:, 0].sum()), fewest=int(taken_acc[:, 1].min())),
                      note="per example, a step along each of J's smallest singular directions (the dense "
                           "factorization's, or the Krylov bases' Ritz vectors), certified like Algorithm 1's: "
                           "modes_lifted counts the (example, mode) bounds they raised, over these examples' "
                           "chunks (computed by this call, in any process, or read back; chunk files from before "
                           "2026-11-30 did not record them), and seconds what they took when computed"),
                  targets=None if targets is None else (targets if isinstance(targets, str) else "list"),
                  targeted=None if targeted is None else dict(
                      method=targeted.method, n_targets=len(targeted.modes), seconds=targeted.timings["total"],
                      n_infinite=int(targeted.infinite.sum()), from_null_space=int(targeted.from_null_space.sum()),
                      eps_kept=bool(keep_targeted_eps)),
                  # the whole batch's ids (a resumed call's too), this call's last chunk size, threads, versions
                  run=run_record(example_ids, chunk_size, threads))
    return Bounds(
        std=std.reshape((B,) + input_shape), mse=mse, eps=best_eps.reshape((B,) + input_shape), z=best_z,
        divergence=divergence, best_restart=best_restart, lsqr_iterations=itn, lsqr_istop=istop,
        infinite_reasons=reasons, params=params, seconds=time.perf_counter() - t_start, targeted=targeted,
        std_algorithm1=std_algorithm1)
