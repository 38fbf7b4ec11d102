"""The Jacobian of a torch model as a batched linear operator for the solver.

For a model ``a`` and linearization points ``x`` of shape (B, ...), row b of
``matvec(v)`` is ``J_b v_b`` and row b of ``rmatvec(u)`` is ``J_bᵀ u_b``, with
``J_b = ∂a(x_b)/∂x_b``. The model's parameters are constants and nothing is
accumulated in ``.grad``. The model must treat the examples of a batch
independently (checked by :func:`hcrfast.validation.check_independent`).

Two ways to get the products, chosen by ``mode``:

``"reverse"`` (default)
    One forward pass at ``x`` is recorded once per operator. ``Jᵀu`` is a
    backward pass through it; ``J v`` is the "double-VJP" identity
    ``J v = ∂/∂d ⟨Jᵀ d, v⟩``: a backward pass through the (linear in ``d``)
    graph of ``Jᵀ d``. Both reuse the recorded forward, so each product costs
    about one backward pass. Needs ops with double-backward support. The
    forward is recorded under :class:`~hcrfast.bindings.double_backward.lean_double_backward`
    (while ``LEAN_DOUBLE_BACKWARD`` is true), which spares convolutions and eval batch
    norms the double-backward work ``J v`` does not read, and gives fused attention and
    hardsigmoid, which torch cannot differentiate twice, a backward that can be.
``"forward"``
    ``torch.func.jvp`` (forward-mode AD) and ``torch.func.vjp``; recomputes
    the forward pass inside each JVP. Works for any model ``torch.func``
    supports; attention runs on torch's MATH backend inside a JVP
    (:func:`composite_attention`: its fused kernels have no forward AD).

On CPU, with the 784-784-784 MLP and 800 rows, "reverse" took 13 ms per JVP
and "forward" 42 ms (one forward pass: 15 ms); see the benchmarks.
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.func
from torch.func import vjp
from torch.nn.attention import SDPBackend, sdpa_kernel

from hcrfast import profiling
from hcrfast.backend import warnings_ignored
from hcrfast.bindings.bridge import from_torch, to_torch
from hcrfast.bindings.double_backward import lean_double_backward, native_rnn_for

MODES = ("reverse", "forward")

# Mode "reverse" records its forward under lean_double_backward (module double_backward): one
# convolution per layer in a JVP instead of two. False records torch's own graph (for comparison).
LEAN_DOUBLE_BACKWARD = True


@functools.cache
def _load_jvp_decompositions() -> None:
    # torch's forward-mode AD loads its decompositions on first use through torch.jit.script,
    # which warns (FutureWarning, torch >= 2.9) about torch's own internals; load them once
    # here, quietly, so that the warning does not reach the user of every entry point.
    with warnings_ignored((r".*torch\.jit\.script.*", FutureWarning)):
        try:
            import torch._decomp.decompositions_for_jvp  # noqa: F401  (imported for its side effect)
        except ImportError:  # a torch that loads them elsewhere (or not at all): its warning, if any, stays
            pass


@contextlib.contextmanager
def composite_attention():
    """Attention written in composite operations (the MATH backend, no fast path), for the length of a JVP
    or of the dense solve's vmapped VJPs.

    torch's fused attention kernels (flash, memory-efficient, cuDNN's, the CPU's flash) have no
    forward AD, and neither has the fast path of ``nn.MultiheadAttention`` and
    ``nn.TransformerEncoderLayer`` (``_native_multi_head_attention``,
    ``_transformer_encoder_layer_fwd``), which eval mode takes without gradients: every
    transformer failed ``torch.func.jvp``. Inside, ``scaled_dot_product_attention`` runs on the
    MATH backend and the fast path is off (both process-wide switches, restored on exit; public
    entry points hold one call at a time). A JVP of attention needs its softmax matrix anyway, which
    the MATH backend forms; the values are the fused kernels' to float rounding. Models without
    attention are untouched. The dense solve also records its reverse-mode J under it: vmap has no
    batching rule for the fused kernels' backward (torch falls back to a loop, with a warning), and
    has one for the MATH backend's matrix products.
    """
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


def jvp(func, primals, tangents):
    """``torch.func.jvp``, without torch's warning about its own use of ``torch.jit.script``, with
    attention on kernels that have forward AD (:func:`composite_attention`)."""
    _load_jvp_decompositions()
    with composite_attention():
        return torch.func.jvp(func, primals, tangents)


class TorchJacobian:
    """``J = ∂ model(x) / ∂x`` at the rows of ``x``, applied matrix-free.

    Parameters
    ----------
    model : torch.nn.Module or callable
        Maps a batch (B, *input_shape) to features (B, *feature_shape).
    x : torch.Tensor, shape (B, *input_shape)
        The linearization points, on the model's device and in its dtype.
    mode : {"reverse", "forward"}
        How the products are computed (module docstring).
    """

    def __init__(self, model, x: torch.Tensor, *, mode: str = "reverse"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.model = model
        self.x = x.detach()
        self.mode = mode
        self.batch = x.shape[0]
        self.input_shape = tuple(x.shape[1:])
        self.n_cols = math.prod(self.input_shape)
        self._graph = None
        self._vjp_fn = None
        self._n_rows = None

    def _f(self, x):
        return self.model(x).reshape(x.shape[0], -1)

    @property
    def n_rows(self) -> int:
        if self._n_rows is None:
            with torch.no_grad():
                self._n_rows = self._f(self.x[:1]).shape[1]
        return self._n_rows

    def _recorded(self):
        """(x, a(x), d, Jᵀd) with graphs kept, recorded once (mode "reverse")."""
        if self._graph is None:
            x = self.x.clone().requires_grad_(True)
            # Weights computed from the parameters alone (weight norm, an attention bias) are held
            # constant too: the mode walks their graph for x.
            lean = lean_double_backward(inputs=(x,)) if LEAN_DOUBLE_BACKWARD else contextlib.nullcontext()
            with torch.enable_grad(), lean:
                out = self._f(x)
                d = torch.zeros_like(out, requires_grad=True)
                (jtd,) = torch.autograd.grad(out, x, d, create_graph=True)
            self._graph = (x, out, d, jtd)
            self._n_rows = out.shape[1]
        return self._graph

    def matvec(self, v):
        """``J v``: (B, n_cols) array → (B, n_rows) array."""
        with profiling.annotate("jvp"):
            tangent = to_torch(v).reshape(self.x.shape)
            if self.mode == "reverse":
                _, _, d, jtd = self._recorded()
                (out,) = torch.autograd.grad(jtd, d, tangent, retain_graph=True)
            else:
                with torch.no_grad(), native_rnn_for(self.model):
                    _, out = jvp(self._f, (self.x,), (tangent,))
        return from_torch(out)

    def rmatvec(self, u):
        """``Jᵀ u``: (B, n_rows) array → (B, n_cols) array."""
        with profiling.annotate("vjp"):
            cotangent = to_torch(u)
            if self.mode == "reverse":
                x, out, _, _ = self._recorded()
                (res,) = torch.autograd.grad(out, x, cotangent, retain_graph=True)
            else:
                with torch.no_grad():
                    if self._vjp_fn is None:
                        with native_rnn_for(self.model):
                            _, self._vjp_fn = vjp(self._f, self.x)
                    (res,) = self._vjp_fn(cotangent)
        return from_torch(res.reshape(self.batch, -1))

    def take(self, rows) -> "TorchJacobian":
        """The operator at a subset of the linearization points."""
        index = to_torch(rows).to(self.x.device)
        return TorchJacobian(self.model, self.x[index], mode=self.mode)
