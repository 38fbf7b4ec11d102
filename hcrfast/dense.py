"""The dense path: whole per-example Jacobians, their SVD, and per-mode Cramér–Rao directions.

For moderate input sizes p the Jacobian ``J_b = ∂a(θ_b)/∂θ_b`` (n × p) of every
example fits in memory. One SVD ``J = U S Vᵀ`` in float64 then gives at once

(a) Algorithm 1's limit: the right singular vector of the smallest non-zero
    singular value (the direction the iteration converges to as s → 0);
(b) for every mode k of a basis Q (rows ``q_kᵀ``, ``q_k = Qᵀ e_k``), the
    Cramér–Rao-optimal direction restricted to the identifiable part (the row
    space of J)::

        ε_k ∝ (JᵀJ)⁺ q_k = V_r S_r⁻² V_rᵀ q_k,   ‖J ε_k‖ = ‖S_r⁻¹ V_rᵀ q_k‖,

    whose linearized bound ``σ·|q_kᵀε_k| / ‖J ε_k‖ = σ·sqrt(q_kᵀ (JᵀJ)⁺ q_k)`` is the
    largest any ε in the row space can give (Cauchy–Schwarz; METHOD.md §4);
(c) the local null space of J: its dimension, and per mode the component
    ``u_k = (I − V_r V_rᵀ) q_k`` of ``q_k`` that no small change of the features
    can reveal.

Nothing here is a bound: the directions are candidates, and
:func:`hcrfast.targeted.targeted_bound` certifies each one by forward passes.

Rank tolerance: singular values ``≤ S_max · sqrt(max(n, p)) · eps(dtype of J)`` count as
zero, with the machine epsilon of the dtype the Jacobian was *computed* in (a float32
Jacobian carries errors of about that size even after the cast to float64): the
spectral norm of n × p independent rounding errors of relative size eps, the Krylov
basis' rule (:mod:`hcrfast.krylov`). Until 2026-11-30 it was numpy.linalg.matrix_rank's
``max(n, p) · eps``, which dropped real small directions of ill-conditioned float32
maps (a map with J exact and condition ~1e5: median bound 0.25 of the exact
least-squares std, against 0.83 now and the Krylov basis' 0.83; one example of 32
of the MNIST MLP rose 1.7×, none fell).
"""
from __future__ import annotations

import contextlib
import gc
import math
import re
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import vjp, vmap

from hcrfast import kernels, validation
from hcrfast.backend import warnings_ignored
from hcrfast.bindings import array_module_for, jvp
from hcrfast.bindings.jacobian import composite_attention
from hcrfast.bindings.double_backward import native_rnn_for
from hcrfast.kernels import symmetric

#: How the "eigh" driver's Gram matrices are decomposed (:func:`hcrfast.kernels.symmetric.eigh_batch`):
#: "auto" (LAPACK's dsyevd on the host, a matrix per thread on every core, for two or more matrices;
#: ``torch.linalg.eigh`` for one), "lapack", "torch", or on CUDA the batched device routines
#: "cusolver" (cusolverDnXsyevBatched) and "cupy" (syevjBatched), whose results are checked.
EIGH_IMPL = "auto"

#: How the Jacobian is built (:func:`jacobian`).
JACOBIAN_MODES = ("auto", "forward", "reverse")

#: Rows × (n + p) values per batched pass when ``chunk_size`` is not given
#: (the CPU budget of :func:`hcrfast.bound`).
_CHUNK_ELEMENTS = 2**24


def default_chunk_rows(n: int, p: int) -> int:
    """Example rows (examples × tangents) per batched pass: a fixed element budget."""
    return max(1, _CHUNK_ELEMENTS // (n + p))


def basis_vectors(input_shape, basis: str, modes, device=None):
    """``q_k = Qᵀ e_k`` for the given flat mode indices, shape (K, p), float64.

    Q is the orthonormal 2-D DCT-II over the last two axes of each channel
    (``scipy.fft.dctn(..., axes=(-2, -1), norm="ortho")``), i.e. ``Q = I_C ⊗ C_H ⊗ C_W``
    on row-major flattened inputs, or the identity for ``basis="pixel"``. As Q is
    orthogonal, ``Qᵀ e_k = Q⁻¹ e_k`` is the inverse DCT of the unit mode k.

    Returns an array of the namespace of ``device`` (NumPy on the CPU, CuPy on CUDA).
    """
    validation.choice("basis", basis, ("dct", "pixel"))
    xp = array_module_for(torch.device("cpu") if device is None else torch.device(device))
    input_shape = tuple(input_shape)
    p = math.prod(input_shape)
    modes = xp.asarray(modes, dtype=xp.int64).reshape(-1)
    e = xp.zeros((modes.shape[0], p))
    e[xp.arange(modes.shape[0]), modes] = 1.0
    if basis == "pixel":
        return e
    return kernels.idct2(e.reshape((modes.shape[0],) + input_shape)).reshape(modes.shape[0], p)


def resolve_jacobian_mode(mode: str, n: int, p: int) -> str:
    """``"auto"``: forward mode (p JVPs) when p < n, reverse mode (n VJPs) otherwise.

    One JVP (a forward pass of the tangent) and one VJP (a backward pass of the
    cotangent) cost about the same in FLOPs, so the cheaper mode is the one with
    fewer products: min(n, p). A tie goes to reverse mode: torch.func's forward-mode
    AD is the slower of the two per product on CPUs (MNIST MLP, n = p = 784, 8
    examples, one thread: 0.48-0.64 s forward against 0.29-0.44 s reverse).
    Reverse mode also stores one forward pass's activations.
    """
    validation.choice("jacobian", mode, JACOBIAN_MODES)
    if mode != "auto":
        return mode
    return "forward" if p < n else "reverse"


#: What to pass instead where torch.func cannot build J: the LSQR paths, for each place a dense J is built.
LSQR_INSTEAD = ("pass solver='lsqr' for Algorithm 1's steps, and for targets targeted_method='lsqr' "
                "(hcrfast.bound) or method='lsqr' (hcrfast.targeted_bound)")


#: The devices (type, index) :func:`warm_up` has run on in this process.
_WARMED: set = set()


def warm_up(device) -> None:
    """Load, before a chunk holds its memory, what the dense solve's and the Krylov basis' first chunk load there:
    torch.func's transforms (their first use imports torch._dynamo, some 900 modules in all) and, on the CPU,
    SciPy's LAPACK (dsyevd, dstevd: OpenBLAS mapped and its buffers taken by one small call). Under a memory limit,
    loading them inside the first chunk failed as an ImportError ("failed to map segment"), a SystemError in the
    import machinery, OpenBLAS's own abort or a hang, where a chunk's own allocations are halved (an ad-hoc pass of
    2026-12-01, ulimit -v). Once per device and process; a failure here is left to the chunk to meet."""
    device = torch.device(device)
    kind = device.type
    # per device (cuda:1's libraries load on it as cuda:0's did), under the one-call lock of the entry point
    key = (kind, device.index if device.index is not None or kind != "cuda" else torch.cuda.current_device())
    if key in _WARMED:
        return
    _WARMED.add(key)
    dynamo_before = "torch._dynamo" in sys.modules
    try:
        # no draw from torch's global RNG (a Linear's init drew: the caller's seeded draws moved on a process's first
        # call), and in eval mode (the pre-hook open around this, for the modules a model calls outside its own tree,
        # took it for one of them)
        tiny = torch.nn.utils.skip_init(torch.nn.Linear, 2, 2, dtype=torch.float64, device=device).eval()
        with torch.no_grad():
            tiny.weight.fill_(1.0)
            tiny.bias.fill_(0.0)
        x = torch.ones(1, 2, dtype=torch.float64, device=device)
        jacobian(tiny, x, mode="reverse", skip_zero_rows=True)
        jacobian(tiny, x, mode="forward")
        if kind == "cpu":
            from hcrfast.kernels import _lapack

            _lapack.routine("dstevd", 11)
            symmetric._lapack_host(np.eye(2)[None].copy(), np.array([2]))
    except Exception:   # noqa: BLE001 - (what fails here fails, or halves, in the chunk, where it is reported)
        pass
    if not dynamo_before and "torch._dynamo" in sys.modules:
        # Importing torch._dynamo runs torch.fx's wrap(), whose frame holds itself (inspect.currentframe() in a
        # local): a cycle that keeps every frame below it alive, the entry point's with the user's model and batch
        # (on a GPU, their memory), until Python's cycle collector next runs, which may be long after the call. It
        # is garbage already: collected now, once per process (a fifth of a second, after the import's second).
        gc.collect()


def jacobian(model, x: torch.Tensor, *, mode: str = "auto", chunk_size: int | None = None,
             skip_zero_rows: bool = False, return_products: bool = False, return_mode: bool = False):
    """The full Jacobian of every example, shape (B, n, p), in the dtype of ``x``.

    Forward mode pushes unit tangents ``e_j`` through ``torch.func.jvp``, vmapped
    over a chunk of j; the same tangent on every example of the batch gives
    column j of every ``J_b`` at once, since the model treats examples
    independently. Reverse mode pulls unit cotangents back through one recorded
    ``torch.func.vjp`` (what ``jacrev`` does), giving rows of every ``J_b``.
    vmap batches only the tangents: the primal forward pass runs once per chunk.

    With ``skip_zero_rows`` (reverse mode), the rows that are identically zero are found first and
    not pulled back: a feature behind a ReLU that is off at θ has a zero row, about half of them in
    the MNIST MLP and the CIFAR-10 CNN. Two JVPs along random Gaussian tangents tell them: row i
    counts as zero where both ``(J t)_i`` are exactly 0 (for a nonzero row each is 0 only by an exact
    cancellation in rounding), and one VJP of a random cotangent on those rows checks that reverse
    mode agrees (an example where it does not gets every row). Each pass then pulls back, for every
    example, its own next live row, so the passes number the most live rows of an example, not n.
    A model whose forward-mode AD torch.func cannot run, or with no zero row, gets every row the
    usual way. The values are jacrev's up to the last bit (the batched products group the rows
    differently). The dense solve drops zero rows anyway (:func:`min_norm_solver`), and a row wrongly
    taken for zero would only leave the solve less tight: its step is still certified by forward
    passes.

    The J built is checked against plain autograd: ``uᵀ J_b`` against one backward pass of a random
    ``u`` per example. torch.func can be wrong where plain autograd is right (in torch 2.14 vmap over
    ``torch.cdist``'s backward gives wrong rows, so ``jacrev`` does too); a J that fails is built again
    one row at a time by plain backward passes, with a warning. A wrong J would only loosen the bounds
    (each step is certified by forward passes), or leave none ("every step's eps came out 0").

    Parameters
    ----------
    model : callable
        (B, *input_shape) → (B, ...) features; must not mix examples.
    x : torch.Tensor, shape (B, *input_shape)
    mode : {"auto", "forward", "reverse"}
        See :func:`resolve_jacobian_mode`. Where "auto" takes forward mode and the model has an
        operation without forward AD (an ``autograd.Function`` without a ``jvp`` staticmethod, CUDA's
        fused RNN cells), J is built in reverse mode instead (n VJPs instead of p JVPs, the same J);
        ``return_mode`` says which ran. (Attention runs in forward mode: :func:`hcrfast.bindings.jvp`.)
    chunk_size : int, optional
        At most this many example rows (examples × tangents) per vmapped pass;
        default :func:`default_chunk_rows`, and on a CPU within a public call also
        :data:`hcrfast.algorithm.GRAPH_BYTES` over a row's graph (its activations, counted in the call's first
        forward: :func:`hcrfast.algorithm._graph_row_bytes`).
    skip_zero_rows : bool
        Reverse mode: find J's zero rows by two JVPs (checked by a VJP) and pull back only the others
        (above).
    return_products : bool
        Also return, per example, the products that built its J: ``(J, products)`` with ``products`` a
        (B,) int64 NumPy array: p JVPs (forward mode), n VJPs (reverse mode), with ``skip_zero_rows``
        the VJPs of the rows pulled back and the probes' 2 JVPs and 1 VJP (2 JVPs alone where they found
        no zero row), and 1 VJP that checks J against plain autograd (below). (In a pass every example
        of a chunk rides along until the one with the most rows to pull back is done: these are what
        each needed.)
    return_mode : bool
        Also return the mode J was built in, "forward" or "reverse", last in the tuple.
    """
    B = x.shape[0]
    input_shape = tuple(x.shape[1:])
    p = math.prod(input_shape)

    def f(t):
        with native_rnn_for(model):  # cuDNN's RNN backward refuses eval mode
            return model(t).reshape(t.shape[0], -1)

    from hcrfast import algorithm  # here: algorithm imports this module

    def _is_oom(exc):   # (oneDNN's "could not create a primitive" too, where the chunk's examples can be split)
        return algorithm._is_oom_of(exc, B)

    with torch.no_grad():
        n = f(x[:1]).shape[1]
    asked, mode = mode, resolve_jacobian_mode(mode, n, p)
    if chunk_size is None:
        rows = default_chunk_rows(n, p)
        # On a CPU, also held to the product graphs' budget (the rows' activations, as the LSQR and Krylov chunks):
        # a 3 x 32-channel CNN with 512 features took ~205 MiB an example in one pass of every row
        graph = algorithm._graph_row_bytes(model, x)
        if graph:
            rows = max(1, min(rows, algorithm.GRAPH_BYTES // graph))
    else:
        rows = validation.positive_int("chunk_size", chunk_size)

    def build(mode):
        live, probes = (_nonzero_rows(f, x, n, rows) if skip_zero_rows and mode == "reverse"
                        else (None, np.zeros(B, dtype=np.int64)))
        out = (torch.empty if live is None else torch.zeros)((B, n, p), dtype=x.dtype, device=x.device)
        _fill_jacobian(out, f, x, mode, rows, live, graph=x.is_cuda and _has_rnn_cells(model))
        return out, live, probes

    try:
        try:
            with _slow_batching_unsaid():
                out, live, probes = build(mode)
        except RuntimeError as exc:
            if (asked != "auto" or mode != "forward" or not _lacks_forward_ad(exc) or _is_oom(exc)
                    or _is_device_failure(exc)):
                raise
            # An operation without forward AD (an autograd.Function without a jvp staticmethod, CUDA's
            # fused RNN cells): the same J from n VJPs instead of p JVPs.
            mode = "reverse"
            with _slow_batching_unsaid():
                out, live, probes = build(mode)
    except RuntimeError as exc:
        if _is_oom(exc) or _is_device_failure(exc):  # the caller halves the chunk; a device fault is no vmap limit
            raise
        # The plain-autograd probes of the entry point passed: what fails here is torch.func's.
        forward_hint = (", and in forward mode, asked for here, any operation without forward AD: "
                        "jacobian='auto' builds J in reverse mode then")
        text = str(exc)
        first = text.splitlines()[0] if text else type(exc).__name__
        if any(k in text for k in ("vmap", "captured Tensor", "Batching rule", "functorch", "BatchedTensor")):
            if "generate_vmap_rule" in text:
                cause, fix = ("an autograd.Function without vmap support is the cause",
                              "give it generate_vmap_rule = True or a vmap staticmethod")
            elif "NYI" in text or "not implemented" in text.lower():
                cause, fix = ("vmap has no rule for an operation of the forward (named there)",
                              "write that step with operations vmap supports")
            elif _backward_hooked(model):
                cause, fix = (f"the backward hooks on the submodules {', '.join(map(repr, _backward_hooked(model)[:3]))} "
                              f"(register_full_backward_hook: an autograd.Function vmap cannot batch) are the likely "
                              f"cause",
                              "remove the hooks while hcrfast runs (they fire on its products too)")
            else:
                cause, fix = ("a forward that changes its own buffers or attributes in place is the usual cause",
                              "keep the forward free of in-place changes to the model's state")
            raise ValueError(f"building J for the dense solve runs the model under torch.func.vmap, which this "
                             f"model's forward does not support (torch: {first}); {cause}: {LSQR_INSTEAD}, which "
                             f"need no vmap, or {fix}") from exc
        # (oneDNN's "could not create a primitive" is also its allocation failure under a memory limit: halved
        # down to this one example by then, and said so)
        from hcrfast.algorithm import _NO_PRIMITIVE

        memory = ("; oneDNN, the CPU's convolutions, also raises it where memory runs out under a limit (ulimit -v, "
                  "a container's): where the model runs under torch.func without one, a process with more memory, "
                  "or a fresh process with chunk_size=1, is the fix" if _NO_PRIMITIVE in text else "")
        raise ValueError(f"building J for the dense solve runs the model under torch.func (vmap over "
                         f"{'jvp' if mode == 'forward' else 'vjp'}), which this model's forward does not support "
                         f"(torch: {first}; activation checkpointing is a known case"
                         f"{forward_hint if mode == 'forward' else ''}{memory}): {LSQR_INSTEAD}, which need plain "
                         f"autograd only") from exc

    def count(live, probes, mode):  # the products that built J, and the one VJP that checked it
        if live is not None:
            return live.sum(dim=1).cpu().numpy().astype(np.int64) + probes + 1
        return np.full(B, p if mode == "forward" else n, dtype=np.int64) + probes + 1

    products = count(live, probes, mode)
    if not _agrees_with_autograd(out, f, x, rows):
        # torch.func gave another J than plain autograd: a batching rule of torch's that is wrong (vmap over
        # torch.cdist's backward gives wrong rows in torch 2.14). Every row again, one plain backward each.
        validation.warn(f"torch.func.vmap gave this model a Jacobian that plain autograd contradicts (a wrong "
                        f"batching rule in torch: torch.cdist's backward is one), so the dense solve built J again "
                        f"one row at a time, {n} backward passes per chunk; solver='lsqr' or 'krylov' use plain "
                        f"autograd only")
        out, mode = _rows_by_autograd(f, x, n, p), "reverse"
        products = products + count(None, 0, mode)   # the wrong J's products were spent too
        if not _agrees_with_autograd(out, f, x, rows):
            raise RuntimeError("the dense solve's J, built one row at a time by plain autograd, disagrees with "
                               "plain autograd's own product: the model's forward is not deterministic")
    if not (return_products or return_mode):
        return out
    got = (out, products) if return_products else (out,)
    return got + (mode,) if return_mode else got


def _agrees_with_autograd(J: torch.Tensor, f, x: torch.Tensor, rows: int) -> bool:
    """Whether ``uᵀ J_b`` is plain autograd's ``J_bᵀ u`` for a random ``u`` per example (one backward pass of
    at most ``rows`` examples at a time, what a vmapped pass of ``rows`` takes): a J that torch.func built
    wrong (a wrong batching rule) fails it.
    Loose (1e-2 of the product's largest entry below float64, 1e-8 in float64: TF32 and another kernel
    round differently; a wrong rule is off by the whole product), so it never refuses a right J."""
    B, n, p = J.shape
    g = torch.Generator().manual_seed(0xC4EC)
    tol = 1e-8 if J.dtype == torch.float64 else 1e-2
    for b0 in range(0, B, max(1, rows)):
        xb = x[b0:b0 + max(1, rows)].detach()
        u = torch.randn((xb.shape[0], n), generator=g, dtype=J.dtype).to(J.device)
        with torch.enable_grad():
            xg = xb.clone().requires_grad_(True)
            (want,) = torch.autograd.grad(f(xg), xg, u)
        got = torch.bmm(u[:, None, :], J[b0:b0 + xb.shape[0]])[:, 0]                  # uᵀ J_b, (b, p)
        want = want.reshape(got.shape)
        scale = torch.maximum(got.abs().amax(dim=1), want.abs().amax(dim=1))       # (0 where both are: agree)
        if bool(((got - want).abs().amax(dim=1) > tol * scale).any()):
            return False
    return True


def _rows_by_autograd(f, x: torch.Tensor, n: int, p: int) -> torch.Tensor:
    """Every J_b, shape (B, n, p), from n plain backward passes through one recorded forward, no torch.func."""
    B = x.shape[0]
    out = torch.empty((B, n, p), dtype=x.dtype, device=x.device)
    with torch.enable_grad():
        xg = x.detach().clone().requires_grad_(True)
        y = f(xg)
        cot = torch.zeros_like(y)
        for i in range(n):
            cot.zero_()
            cot[:, i] = 1
            (row,) = torch.autograd.grad(y, xg, cot, retain_graph=i < n - 1)
            out[:, i] = row.reshape(B, p)
    return out


def _lacks_forward_ad(exc: BaseException) -> bool:
    """torch's refusal of forward-mode AD for an operation (an ``autograd.Function`` without a ``jvp``
    staticmethod, an ATen kernel with no forward derivative)."""
    text = str(exc)
    return any(k in text for k in ("forward AD", "forward mode AD", "forward-mode AD", "jvp function"))


#: What torch, cuBLAS and cuDNN say of a fault of the device or its libraries (not of the model's code).
_DEVICE_FAULTS = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error", "device-side assert")


def _is_device_failure(exc: BaseException) -> bool:
    """A fault of the GPU or its libraries (torch's AcceleratorError, cuBLAS, cuDNN), raised as it is: the
    advice for a forward that torch.func cannot run would send the user after the wrong cause."""
    return type(exc).__name__ == "AcceleratorError" or any(k in str(exc) for k in _DEVICE_FAULTS)


#: The start of torch's UserWarning for an operation without a batching rule, which vmap then runs one row at a
#: time (torch/autograd/graph.py; the native LSTM's ``aten::mkldnn_rnn_layer_backward`` on the CPU): a matter
#: of speed inside hcrfast's own vmaps, shown to the caller ahead of hcrfast's own refusal or result.
_SLOW_BATCHING = "There is a performance drop because we have not yet implemented the batching rule"


@contextlib.contextmanager
def _slow_batching_unsaid():
    """Ignore torch's :data:`_SLOW_BATCHING` warning, and no other, while hcrfast's vmaps build J
    (:func:`hcrfast.backend.warnings_ignored`: ``warnings.filterwarnings`` would have moved a caller's equal filter
    to the front, and left it there)."""
    with warnings_ignored((re.escape(_SLOW_BATCHING), UserWarning)):
        yield


def _nonzero_rows(f, x: torch.Tensor, n: int, rows: int):
    """``(live, probes)``: ``live`` (B, n) bool, the rows of every J_b to pull back, or None (all of them);
    ``probes`` (B,) int64, the products spent finding them (:func:`jacobian`).

    Two JVPs along random Gaussian tangents mark the rows where both are exactly 0. Forward and reverse
    mode need not agree on that (a straight-through estimator's ``jvp`` may say 0 where its ``backward``
    passes the gradient on), so one VJP per example checks the marked rows: a random cotangent on them
    alone must pull back to exactly 0, or that example gets every row. None where the JVPs find no zero
    row, or where torch.func's forward mode cannot run the model. At most ``rows`` example rows a pass."""
    B = x.shape[0]
    g = torch.Generator().manual_seed(0x5EED)
    live = torch.empty((B, n), dtype=torch.bool, device=x.device)
    per = max(1, rows // 2)
    try:
        with torch.no_grad():
            for b0 in range(0, B, per):
                xb = x[b0:b0 + per].detach()
                tangents = torch.randn((2,) + tuple(xb.shape), generator=g, dtype=x.dtype).to(x.device)
                probes = vmap(lambda t, xb=xb: jvp(f, (xb,), (t,))[1])(tangents)       # (2, b, n)
                live[b0:b0 + per] = (probes != 0).any(dim=0)
    except RuntimeError as exc:
        from hcrfast.algorithm import _is_oom_of  # here: algorithm imports this module

        if _is_oom_of(exc, B) or _is_device_failure(exc):
            raise
        return None, np.zeros(B, dtype=np.int64)   # every row pulled back; the build reports what torch.func cannot run
    if bool(live.all()):
        return None, np.full(B, 2, dtype=np.int64)
    with torch.no_grad():
        for b0 in range(0, B, rows):
            xb = x[b0:b0 + rows].detach()
            _, pullback = vjp(f, xb)
            cot = torch.randn((xb.shape[0], n), generator=g, dtype=x.dtype).to(x.device)
            back = pullback(cot * ~live[b0:b0 + rows])[0].reshape(xb.shape[0], -1)
            live[b0:b0 + rows] |= (back != 0).any(dim=1)[:, None]   # a marked row is not zero: all rows
    return live, np.full(B, 3, dtype=np.int64)


def _has_rnn_cells(model) -> bool:
    """Whether ``model`` is a module with an RNN or an LSTM/GRU cell in it (on CUDA, torch's fused cells)."""
    kinds = (torch.nn.RNNBase, torch.nn.LSTMCell, torch.nn.GRUCell)
    return isinstance(model, torch.nn.Module) and any(isinstance(m, kinds) for m in model.modules())


def _fill_jacobian(out: torch.Tensor, f, x: torch.Tensor, mode: str, rows: int, live=None, *,
                   graph: bool = False) -> None:
    """``out[b] = J_b`` (n × p) for every example of ``x``, ``rows`` example rows per vmapped pass. With
    ``live`` (B, n) bool (reverse mode; ``out`` zeroed), only those rows are pulled back, each example's
    own in every pass.

    ``graph``: the vmapped pullbacks run with ``create_graph=True`` (grad mode on inside the backward). For
    CUDA's fused LSTM/GRU cells: without grad mode their backward is a CUDA kernel with no batching rule
    (``_thnn_fused_lstm_cell_backward_impl``, ``_thnn_fused_gru_cell_backward``), which vmap runs one row at
    a time, with a warning; with it, torch's differentiable composite backward, which vmap batches."""
    B, n, p = out.shape
    input_shape = tuple(x.shape[1:])
    group = min(B, rows)
    with torch.no_grad():  # torch.func differentiates inside; the outer no_grad keeps the parameters out of it
        for g0 in range(0, B, group):
            xg = x[g0:g0 + group].detach()
            bg = xg.shape[0]
            per_pass = max(1, rows // bg)
            if mode == "forward":
                def column(t, xg=xg):
                    return jvp(f, (xg,), (t.expand(xg.shape),))[1]

                for j0 in range(0, p, per_pass):
                    j1 = min(p, j0 + per_pass)
                    tangents = torch.zeros((j1 - j0, p), dtype=x.dtype, device=x.device)
                    tangents[torch.arange(j1 - j0), torch.arange(j0, j1)] = 1.0
                    cols = vmap(column)(tangents.reshape((j1 - j0,) + input_shape))  # (c, bg, n)
                    out[g0:g0 + bg, :, j0:j1] = cols.permute(1, 2, 0)
            elif live is not None:
                with composite_attention():  # vmap batches the MATH backend's backward, not the fused kernels'
                    _, pullback = vjp(f, xg)
                lg = live[g0:g0 + bg]
                counts = lg.sum(dim=1)
                # per example its live rows first (then its zero rows, whose pullbacks are the zeros out holds)
                order = torch.argsort((~lg).to(torch.int8), dim=1, stable=True)
                steps = int(counts.max()) if bg else 0
                at = torch.arange(bg, device=x.device)

                def own_rows(c, pullback=pullback):
                    return pullback(c, create_graph=graph)[0]

                for t0 in range(0, steps, per_pass):
                    t1 = min(steps, t0 + per_pass)
                    idx = order[:, t0:t1].T                                              # (c, bg): row of each
                    valid = torch.arange(t0, t1, device=x.device)[:, None] < counts[None, :]
                    cot = torch.zeros((t1 - t0, bg, n), dtype=x.dtype, device=x.device)
                    cot.scatter_(2, idx[:, :, None], valid[:, :, None].to(x.dtype))
                    got = vmap(own_rows)(cot).reshape(t1 - t0, bg, p)                     # zero where not valid
                    out[g0 + at[None, :].expand_as(idx), idx] = got
            else:
                with composite_attention():  # vmap batches the MATH backend's backward, not the fused kernels'
                    _, pullback = vjp(f, xg)

                def row(c, bg=bg, pullback=pullback):
                    return pullback(c.expand(bg, n), create_graph=graph)[0]

                for i0 in range(0, n, per_pass):
                    i1 = min(n, i0 + per_pass)
                    cot = torch.zeros((i1 - i0, n), dtype=x.dtype, device=x.device)
                    cot[torch.arange(i1 - i0), torch.arange(i0, i1)] = 1.0
                    rows_ = vmap(row)(cot)  # (c, bg, *input_shape)
                    out[g0:g0 + bg, i0:i1, :] = rows_.reshape(i1 - i0, bg, p).permute(1, 0, 2)


@dataclass
class CramerRaoDirections:
    """Per (example, mode) candidates from :meth:`DenseDecomposition.directions`.

    Attributes
    ----------
    eps : torch.Tensor, shape (B, K, p)
        ``(JᵀJ)⁺ q_k`` scaled to linearized feature shift ``‖J ε‖ = 1``; zero where
        ``q_k`` has no component in the row space.
    linear_std : torch.Tensor, shape (B, K)
        ``sqrt(q_kᵀ (JᵀJ)⁺ q_k)``: the linear-regime Cramér–Rao std per unit σ.
        A diagnostic of the linearization, not a bound.
    null_part : torch.Tensor, shape (B, K, p)
        ``(I − V_r V_rᵀ) q_k``, the component of ``q_k`` in the null space of J.
    null_fraction : torch.Tensor, shape (B, K)
        ``‖null_part‖ / ‖q_k‖``.
    """

    eps: torch.Tensor
    linear_std: torch.Tensor
    null_part: torch.Tensor
    null_fraction: torch.Tensor


@dataclass
class DenseDecomposition:
    """The SVD of every example's Jacobian, in float64.

    Attributes
    ----------
    singular_values : torch.Tensor, shape (B, min(n, p))
        Descending.
    right_vectors : torch.Tensor, shape (B, p, p)
        V: column i is the right singular vector of ``singular_values[:, i]``;
        the columns from ``rank`` on span the null space.
    tol : torch.Tensor, shape (B,)
        Singular values ``≤ tol`` count as zero.
    rank : torch.Tensor, shape (B,), int64
    n_features : int
    """

    singular_values: torch.Tensor
    right_vectors: torch.Tensor
    tol: torch.Tensor
    rank: torch.Tensor
    n_features: int

    @property
    def null_dim(self) -> torch.Tensor:
        """Dimension of the local null space of J, ``p − rank``, shape (B,)."""
        return self.right_vectors.shape[-1] - self.rank

    @property
    def weakest(self) -> torch.Tensor:
        """Algorithm 1's limit direction: the right singular vector of the smallest
        non-zero singular value, shape (B, p) (zero for an example whose J is 0)."""
        idx = (self.rank - 1).clamp_min(0)
        v = self.right_vectors.gather(2, idx[:, None, None].expand(-1, self.right_vectors.shape[1], 1))[..., 0]
        return torch.where((self.rank > 0)[:, None], v, torch.zeros_like(v))

    @property
    def smallest_singular_value(self) -> torch.Tensor:
        """The smallest non-zero singular value per example, shape (B,) (0 where J is 0)."""
        idx = (self.rank - 1).clamp_min(0)
        s = self.singular_values.gather(1, idx[:, None])[:, 0]
        return torch.where(self.rank > 0, s, torch.zeros_like(s))

    def directions(self, q: torch.Tensor) -> CramerRaoDirections:
        """Cramér–Rao directions and null components for the basis vectors ``q`` (K, p).

        ``ε_k = V_r S_r⁻² V_rᵀ q_k / ‖S_r⁻¹ V_rᵀ q_k‖`` (so ``‖J ε_k‖ = 1``); module
        docstring (b), (c).
        """
        s = self.singular_values
        m = s.shape[1]
        keep = s > self.tol[:, None]
        inv_s = torch.where(keep, 1.0 / torch.where(keep, s, torch.ones_like(s)), torch.zeros_like(s))
        vm = self.right_vectors[:, :, :m]                                # (B, p, m)
        q = q.to(dtype=torch.float64, device=vm.device)
        coef = torch.einsum("bpm,kp->bkm", vm, q)                        # V_mᵀ q_k
        scaled = coef * inv_s[:, None, :]                                # S_r⁻¹ V_rᵀ q_k
        linear_std = torch.linalg.vector_norm(scaled, dim=2)             # = ‖J (JᵀJ)⁺ q_k‖
        eps = torch.einsum("bpm,bkm->bkp", vm, scaled * inv_s[:, None, :])
        safe = torch.where(linear_std > 0, linear_std, torch.ones_like(linear_std))
        eps = eps / safe[..., None]
        in_range = torch.einsum("bpm,bkm->bkp", vm, coef * keep[:, None, :].to(coef.dtype))
        null_part = q[None] - in_range
        null_fraction = torch.linalg.vector_norm(null_part, dim=2) / torch.linalg.vector_norm(q, dim=1)[None]
        return CramerRaoDirections(eps=eps, linear_std=linear_std, null_part=null_part,
                                   null_fraction=null_fraction)


#: How :func:`decompose` factors J.
DRIVERS = ("auto", "svd", "eigh")


def _checked(J: torch.Tensor, rtol: float | None, driver: str) -> float:
    """Validate a (B, n, p) stack of Jacobians and a driver; the rank tolerance (default
    ``sqrt(max(n, p)) · eps(J.dtype)``)."""
    if J.ndim != 3:
        raise ValueError(f"Shape mismatch: expected Jacobians of shape (B, n, p), got {tuple(J.shape)}")
    validation.choice("driver", driver, DRIVERS)
    return math.sqrt(max(J.shape[1], J.shape[2], 1)) * torch.finfo(J.dtype).eps if rtol is None else rtol


def _auto_driver(rtol: float, m: int) -> str:
    """"eigh" (a Gram matrix of size m in float64) while it resolves singular values down to
    ``rtol · s_max`` (``rtol² ≥ m · eps64``: the Gram matrix's eigenvalues there within a few percent,
    its absolute errors ~m·eps64·λmax), "svd" otherwise. Float32 Jacobians take "eigh" (eps32² ≈ 64·eps64)."""
    return "eigh" if rtol**2 >= m * torch.finfo(torch.float64).eps else "svd"


def decompose(J: torch.Tensor, *, rtol: float | None = None, driver: str = "auto") -> DenseDecomposition:
    """SVD of every ``J_b`` (B, n, p) in float64, with the rank tolerance of the module docstring.

    Parameters
    ----------
    J : torch.Tensor, shape (B, n, p)
    rtol : float, optional
        Relative rank tolerance; default ``sqrt(max(n, p)) · eps(J.dtype)``.
    driver : {"auto", "svd", "eigh"}
        ``"svd"``: ``torch.linalg.svd`` of J. ``"eigh"``: the eigendecomposition of
        JᵀJ (float64), s = sqrt(λ): several times faster on CPUs (784×784: 0.7 s
        against 5-7 s here), but forming JᵀJ squares the condition number, so
        singular values below about ``sqrt(p · eps64) · s_max`` are lost in
        rounding. ``"auto"`` uses "eigh" when the rank tolerance is well above
        that (``rtol² ≥ p · eps64``: always for float32 Jacobians, whose
        own errors are larger) and "svd" otherwise (float64 Jacobians).
        V is complete (p columns) either way, so the null space is available
        also when n < p.
    """
    rtol = _checked(J, rtol, driver)
    B, n, p = J.shape
    if driver == "auto":
        driver = _auto_driver(rtol, p)
    J64 = J.to(torch.float64)
    m = min(n, p)
    if driver == "svd":
        _, s, vh = torch.linalg.svd(J64, full_matrices=n < p)
        v = vh.transpose(1, 2)
    else:
        lam, v = symmetric.eigh_batch(J64.transpose(1, 2) @ J64, impl=EIGH_IMPL)  # ascending
        lam, v = lam.flip(-1), v.flip(-1)
        s = lam[:, :m].clamp_min(0).sqrt()
    tol = s[:, 0] * rtol if m else torch.zeros(B, dtype=torch.float64, device=J.device)
    rank = (s > tol[:, None]).sum(dim=1)
    return DenseDecomposition(singular_values=s, right_vectors=v, tol=tol, rank=rank, n_features=n)


@dataclass
class MinNormSolver:
    """Minimum-norm least-squares solutions ``ε = J⁺ z`` for every example's J, many z at a time.

    What LSQR converges to from a zero start, computed exactly (up to the rank
    tolerance of the module docstring): ``solve(z)`` is ``z_live @ M`` with ``M``
    (B, k, p) the pseudo-inverse restricted to the ``k`` live rows of each J (rows
    that are not identically zero; a ReLU feature that is off at θ has a zero row and
    no ε can move it, so dropping it changes nothing and shrinks the factorization).

    Attributes
    ----------
    rows : torch.Tensor, shape (B, k), int64
        Indices of each example's live rows first (padded with dead ones).
    matrix : torch.Tensor, shape (B, k, p), float64
        ``(J⁺)ᵀ`` on those rows: row i of ``matrix[b]`` is column ``rows[b, i]`` of J_b⁺
        (zero for padding rows).
    rank : torch.Tensor, shape (B,), int64
        Singular values above the tolerance.
    live_rows : torch.Tensor, shape (B,), int64
    driver : str
        ``"eigh"`` (Gram matrix of the smaller side) or ``"svd"``.
    """

    rows: torch.Tensor
    matrix: torch.Tensor
    rank: torch.Tensor
    live_rows: torch.Tensor
    driver: str
    jacobian_products: np.ndarray | None = None   # (B,): the products that built each J, where the builder said
    jacobian_mode: str | None = None   # "forward" or "reverse": how J was built, where the builder said
    smallest: torch.Tensor | None = None   # (B, K, p) float64: unit right singular vectors of J's K smallest kept
    #                                        singular values (min_norm_solver(smallest=K)); zero rows past the rank
    smallest_values: torch.Tensor | None = None   # (B, K): those singular values, ‖J v‖ computed from J (0 for
    #                                               the zero rows)

    @property
    def null_dim(self) -> torch.Tensor:
        """Dimension of the local null space of J, ``p − rank``, shape (B,)."""
        return self.matrix.shape[-1] - self.rank

    def solve(self, z: torch.Tensor) -> torch.Tensor:
        """``J_b⁺ z_{b,r}`` for z of shape (B, R, n) (any float dtype); float64 (B, R, p)."""
        B, R, _ = z.shape
        picked = z.to(torch.float64).gather(2, self.rows[:, None, :].expand(B, R, -1))
        return picked @ self.matrix

    def directions(self, q: torch.Tensor, J: torch.Tensor) -> CramerRaoDirections:
        """Cramér–Rao directions and null components for the basis vectors ``q`` (K, p), from this
        factorization of ``J`` (B, n, p) (the Jacobians it was built from; only ``J q`` is formed).

        What :meth:`DenseDecomposition.directions` gives, without the p × p right singular vectors:
        ``w_k = (J⁺)ᵀ q_k`` (its live rows are ``matrix · q_k``), ``(JᵀJ)⁺ q_k = J⁺ w_k`` and
        ``‖J (JᵀJ)⁺ q_k‖ = ‖w_k‖``; the row-space part of ``q_k`` is ``J⁺ J q_k``.
        """
        q = q.to(dtype=torch.float64, device=self.matrix.device)
        w = torch.einsum("bip,kp->bki", self.matrix, q)                  # live rows of (J⁺)ᵀ q_k
        linear_std = torch.linalg.vector_norm(w, dim=2)
        safe = torch.where(linear_std > 0, linear_std, torch.ones_like(linear_std))
        eps = (w @ self.matrix) / safe[..., None]                        # J⁺ w_k / ‖w_k‖
        # J q_k on the live rows only (solve reads no other row): half the float64 copy and product.
        B, k = self.rows.shape
        live = J.gather(1, self.rows[:, :, None].expand(B, k, J.shape[2])).to(torch.float64)
        jq = torch.einsum("bip,kp->bki", live, q)                        # live rows of J q_k
        null_part = q[None] - jq @ self.matrix                            # (I − J⁺J) q_k
        null_fraction = torch.linalg.vector_norm(null_part, dim=2) / torch.linalg.vector_norm(q, dim=1)[None]
        return CramerRaoDirections(eps=eps, linear_std=linear_std, null_part=null_part,
                                   null_fraction=null_fraction)


def min_norm_solver(J: torch.Tensor, *, rtol: float | None = None, driver: str = "auto",
                    smallest: int = 0) -> MinNormSolver:
    """Factor every ``J_b`` (B, n, p) once for :meth:`MinNormSolver.solve`.

    Rank tolerance and drivers as :func:`decompose` (``rtol`` relative to the largest
    singular value, default ``sqrt(max(n, p)) · eps(J.dtype)``; ``"auto"`` takes the Gram matrix
    when ``rtol² ≥ m · eps64``, which holds for float32 Jacobians), but the Gram
    matrix is that of the smaller side after dropping J's zero rows: k × k with k live
    rows when k ≤ p, else p × p. On the MNIST MLP (p = 784, about 390 live rows of 784)
    this is ~6× faster than the p × p eigendecomposition of :func:`decompose`.

    ``smallest=K`` also keeps the unit right singular vectors of each J's K smallest singular values
    above the tolerance, from the same factorization (``.smallest``, ``.smallest_values``): the
    directions ``bound(singular_steps=K)`` certifies.
    """
    rtol = _checked(J, rtol, driver)
    B, n, p = J.shape
    if n == 0:   # no features: nothing moves, every ε = J⁺ z is 0 (the factorization below needs a row)
        dev, zeros64 = J.device, torch.zeros((B, 0, p), dtype=torch.float64, device=J.device)
        out = MinNormSolver(rows=torch.zeros((B, 0), dtype=torch.int64, device=dev), matrix=zeros64,
                            rank=torch.zeros(B, dtype=torch.int64, device=dev),
                            live_rows=torch.zeros(B, dtype=torch.int64, device=dev),
                            driver="svd" if driver == "svd" else "eigh")
        if smallest:
            out.smallest = torch.zeros((B, int(smallest), p), dtype=torch.float64, device=dev)
            out.smallest_values = torch.zeros((B, int(smallest)), dtype=torch.float64, device=dev)
        return out
    J64 = J.to(torch.float64)
    live = J64.abs().amax(dim=2) > 0 if p else torch.zeros((B, n), dtype=torch.bool, device=J.device)
    live_rows = live.sum(dim=1)
    k = max(1, int(live_rows.max())) if B else 1
    rows = torch.argsort((~live).to(torch.int8), dim=1, stable=True)[:, :k]
    Jr = J64.gather(1, rows[:, :, None].expand(B, k, p)) * live.gather(1, rows)[:, :, None]
    if driver == "auto":
        driver = _auto_driver(rtol, min(k, p))
    if driver == "svd":
        u, s, vh = torch.linalg.svd(Jr, full_matrices=False)               # Jr = U S Vh
        smax = s[:, :1]
        keep = s > rtol * smax
        inv = torch.where(keep, 1.0 / torch.where(keep, s, torch.ones_like(s)), torch.zeros_like(s))
        matrix = (u * inv[:, None, :]) @ vh                                 # (J⁺)ᵀ = U S⁺ Vh
        vals = s
    else:
        gram = Jr @ Jr.transpose(1, 2) if k <= p else Jr.transpose(1, 2) @ Jr
        # s² = λ; k ≤ p: example b's Gram matrix is its leading live_rows[b] block (zero elsewhere)
        lam, vec = symmetric.eigh_batch(gram, live_rows if k <= p else None, impl=EIGH_IMPL)
        lmax = torch.nn.functional.pad(lam, (0, 1)).amax(dim=1, keepdim=True)   # ≥ 0; 0 where p = 0
        keep = lam > (rtol**2) * lmax
        # The kept eigenvalues are each Gram matrix's largest, so its last columns (eigh_batch: ascending,
        # after the padding's zeros): only the batch's largest rank r of them enter (Gram)⁺, which is then
        # never formed. A ReLU MLP's J (784 × 784 on MNIST) has rank ~390, and (J⁺)ᵀ from V_r costs 2·m·r·p
        # flops where V Λ⁺ Vᵀ and its product cost m³ + m²·p (m = min(k, p)): half of them there.
        r = max(1, int(keep.sum(dim=1).max())) if B else 1
        lam, vec, keep = lam[:, -r:], vec[:, :, -r:], keep[:, -r:]
        inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))
        # k ≤ p: J⁺ = Jᵀ (J Jᵀ)⁺, so (J⁺)ᵀ = (J Jᵀ)⁺ J = V_r Λ_r⁻¹ (V_rᵀ J);
        # k > p: J⁺ = (JᵀJ)⁺ Jᵀ, so (J⁺)ᵀ = J (JᵀJ)⁺ = ((J V_r) Λ_r⁻¹) V_rᵀ.
        if k <= p:
            matrix = (vec * inv[:, None, :]) @ (vec.transpose(1, 2) @ Jr)
        else:
            matrix = ((Jr @ vec) * inv[:, None, :]) @ vec.transpose(1, 2)
        vals = torch.sqrt(torch.clamp(lam, min=0.0))
    rank = keep.sum(dim=1)
    out = MinNormSolver(rows=rows, matrix=matrix, rank=rank, live_rows=live_rows, driver=driver)
    if smallest:
        K = min(int(smallest), vals.shape[1])
        at = torch.topk(torch.where(keep, vals, torch.full_like(vals, math.inf)), K, dim=1, largest=False).indices
        got = keep.gather(1, at)                                             # fewer kept than K: zero rows
        values = torch.where(got, vals.gather(1, at), torch.zeros_like(vals[:, :K]))
        if driver == "svd":
            dirs = vh.gather(1, at[:, :, None].expand(B, K, p))               # rows of Vh: unit already
        elif k <= p:   # v = Jrᵀ u / s, unit
            u = vec.gather(2, at[:, None, :].expand(B, k, K))                 # (B, k, K)
            dirs = (u.transpose(1, 2) @ Jr) / torch.where(got, values, torch.ones_like(values))[:, :, None]
        else:          # JᵀJ's own eigenvectors
            dirs = vec.gather(2, at[:, None, :].expand(B, p, K)).transpose(1, 2)
        if driver != "svd":
            # The Gram matrix squares J's condition: its small eigenpairs carry absolute errors of order
            # eps·λmax, so Jᵀu/s is not unit and s not ‖J v‖ there. Each direction is made unit and its
            # value taken from J itself (k·p·K flops, no model product), so that every step's linearized
            # shift is size·σ as asked.
            dirs = dirs / torch.clamp(torch.linalg.vector_norm(dirs, dim=2, keepdim=True), min=1e-300)
            values = torch.where(got, torch.linalg.vector_norm(dirs @ Jr.transpose(1, 2), dim=2),
                                 torch.zeros_like(values))
            got = got & (values > 0)
        pad = int(smallest) - K   # fewer singular values than asked: zero rows, value 0
        out.smallest = torch.nn.functional.pad(torch.where(got[:, :, None], dirs, torch.zeros_like(dirs)),
                                               (0, 0, 0, pad))
        out.smallest_values = torch.nn.functional.pad(values, (0, pad))
    return out


def _backward_hooked(model) -> list[str]:
    """The submodules of ``model`` with backward hooks (``register_full_backward_hook`` and its pre-hook):
    torch wraps their outputs in an autograd.Function that torch.func.vmap cannot batch."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [name or type(model).__name__ for name, m in model.named_modules()
            if getattr(m, "_backward_hooks", None) or getattr(m, "_backward_pre_hooks", None)]

