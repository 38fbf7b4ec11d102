"""Convolutions, eval-mode batch norms and layer norms whose double backward does only the work ``J v`` needs.

Mode "reverse" of :class:`~hcrfast.bindings.TorchJacobian` gets ``J v`` by differentiating the graph
of ``Jᵀ d`` with respect to ``d`` (double VJP). That second backward is linear in ``d`` and, for a
convolution with fixed weights, is one convolution ``conv(v_l, W)`` per layer. torch's double
backward of a convolution (``_convolution_double_backward``) also computes the weight gradient
``conv(ggI, gO)`` whenever its input has a gradient, mask or no mask, and throws it away: a second
convolution per layer, of the weight-gradient kind. Eval-mode batch norm's double backward
(``NativeBatchNormBackwardBackward0``) runs training-mode formulas for an affine map, and layer
norm's is a composite of ~60 operations that computes every input's gradient.

Inside :class:`lean_double_backward` the three are recorded through autograd Functions whose first
backward is written in differentiable operations: a convolution's ``Jᵀ`` is ``conv_transpose(gy, W)``
(whose own backward respects the mask: one convolution; and a transposed convolution's is a
convolution, which has the same waste in torch), an eval batch norm's ``Jᵀ`` is ``gy · s``
with ``s = weight / sqrt(running_var + eps)``, a layer norm's ``r · (g − mean(g) − x̂ · mean(g · x̂))``
with ``g = gy · weight`` and ``x̂``, ``r`` held. The forward values are the same calls as without the
mode; so, on the CPU measured, are the products of convolutions and batch norms, bit for bit (a layer
norm's differ by rounding). On ResNet-18 (3 × 91 × 91, 2 rows, 1 CPU thread) a JVP took 195.1 ms
without the mode and 85.6 ms with it, a VJP ~102 ms either way, and the recorded graph kept 19.8 MiB of
activations per row instead of 39.4 (benchmarks/README.md).

Attention is the other case, for another reason: torch's fused kernels (flash, memory-efficient, the
CPU's flash) have no double backward at all, so mode "reverse" failed on every transformer that calls
``scaled_dot_product_attention`` (timm, Hugging Face) or ``nn.MultiheadAttention`` (torchvision's ViT,
``nn.TransformerEncoder``) unless the user chose the MATH backend. Under the mode the call keeps its
fused kernel in the forward and gets ``Jᵀ`` in four matrix products with the softmax ``P`` held;
``nn.MultiheadAttention``'s functional form, which calls the kernel out of the mode's sight, is asked
for its weights instead, which makes it write the attention as matrix products and a softmax (same
output; the weights are dropped). On ViT-B/16 (2 rows, 1 CPU thread) the products took what the MATH
backend's graph takes (JVP 840.9 ms against 868.1, VJP 879.0 against 857.1). Left to torch: dropout,
batch shapes that differ between q, k and v (other than grouped-query heads), masks computed from
the input.

``hardsigmoid`` likewise: torch's ``hardsigmoid_backward`` has no derivative, so every MobileNetV3 (its
squeeze-and-excitation gates) failed; recorded through ``_Hardsigmoid``, its slope (1/6 inside ±3) held.

RNN calls (``torch.lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``: ``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) on CUDA run
with cuDNN off, for that call alone: cuDNN's RNN backward runs in training mode only and has no double
backward; torch's own implementation has both. :class:`native_rnn` does only that, for the products
that do not record under this mode (forward mode, the dense solve's ``torch.func``).

Weights are held constant: these Functions give no gradient to a layer's weights (or masks), and take
only those whose autograd graph does not reach the input the mode is given (``TorchJacobian`` gives its
x): parameters, and what is computed from them alone (a weight-normalized convolution's weight, an
attention bias from a small network). A weight computed from the input (a modulated convolution, an
adaptive norm) is part of the Jacobian, and its call is torch's. Without inputs, the mode takes only
weights that need no gradient or are a module's parameters. Calls they do not
cover pass through unchanged, those too: ``padding="same"`` where torch pads one side more than the
other, a transposed convolution's output padding at or over its stride, unbatched inputs,
training-mode batch norm, inputs that need no gradient, tensor subclasses, anything under autocast.
"""
from __future__ import annotations

import contextlib
import inspect
import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_FORWARD = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_CONV = {f: nd for nd, f in _FORWARD.items()}
_CONV_T = {f: nd for nd, f in _TRANSPOSE.items()}
_MHA = F.multi_head_attention_forward
_RNN = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)  # what nn.LSTM, nn.GRU and nn.RNN call
_COVERED = (*_CONV, *_CONV_T, F.batch_norm, F.layer_norm, F.hardsigmoid, F.scaled_dot_product_attention, _MHA,
            *_RNN)
_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_T_ARGS = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
_CONV_T_DEFAULTS = dict(bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1)
_CONV_DEFAULTS = dict(bias=None, stride=1, padding=0, dilation=1, groups=1)
_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_BN_DEFAULTS = dict(weight=None, bias=None, training=False, momentum=0.1, eps=1e-5)
_LN_ARGS = ("input", "normalized_shape", "weight", "bias", "eps")
_LN_DEFAULTS = dict(weight=None, bias=None, eps=1e-5)
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
_MHA_SIGNATURE = inspect.signature(_MHA)


def _per_dim(value, nd: int) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * nd


def _int_padding(padding, weight, dilation, nd: int):
    """A convolution's padding as integers per dimension, or None where it is not symmetric: ``"same"``
    with an odd total ``d·(k − 1)`` (torch pads the extra element on one side only)."""
    if padding == "valid":
        return (0,) * nd
    if padding == "same":
        totals = [dilation[i] * (weight.shape[2 + i] - 1) for i in range(nd)]
        return None if any(t % 2 for t in totals) else tuple(t // 2 for t in totals)
    return _per_dim(padding, nd)


def _autocast_on() -> bool:
    """Autocast changes dtypes inside the calls (a layer norm runs in float32 on a half input), which these
    Functions' backwards do not follow: under it every call is torch's own."""
    try:
        return torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def _bind(names, defaults, args, kwargs) -> dict:
    bound = dict(defaults)
    bound.update(zip(names, args))
    bound.update(kwargs)
    return bound


class _Conv(torch.autograd.Function):
    """``y = conv(x, W) + b`` with ``Jᵀ gy = conv_transpose(gy, W)`` in differentiable operations."""

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation, groups):
        return _FORWARD[x.dim() - 2](x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, _, stride, padding, dilation, groups = inputs
        ctx.save_for_backward(weight)
        ctx.conv = (stride, padding, dilation, groups)
        # conv_transpose's output size is (out − 1)·s − 2p + d·(k − 1) + 1 + output_padding; the input
        # size less the rest is the remainder the forward's floor dropped, in [0, s).
        k = weight.shape[2:]
        ctx.output_padding = tuple(
            x.shape[2 + i] - ((output.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k[i] - 1) + 1)
            for i in range(len(k)))

    @staticmethod
    def backward(ctx, gy):
        (weight,) = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        gx = _TRANSPOSE[gy.dim() - 2](gy, weight, None, stride, padding, ctx.output_padding, groups, dilation)
        return gx, None, None, None, None, None, None


class _ConvTranspose(torch.autograd.Function):
    """``y = conv_transpose(x, W) + b`` with ``Jᵀ gy = conv(gy, W)`` in differentiable operations (where each
    output padding is under its stride, so that the convolution gives back x's size)."""

    @staticmethod
    def forward(x, weight, bias, stride, padding, output_padding, groups, dilation):
        return _TRANSPOSE[x.dim() - 2](x, weight, bias, stride, padding, output_padding, groups, dilation)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, weight, _, stride, padding, _, groups, dilation = inputs
        ctx.save_for_backward(weight)
        ctx.conv = (stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, gy):
        (weight,) = ctx.saved_tensors
        return _FORWARD[gy.dim() - 2](gy, weight, None, *ctx.conv), None, None, None, None, None, None, None


class _EvalBatchNorm(torch.autograd.Function):
    """Eval-mode batch norm, ``y = (x − μ) · s + b``, with ``Jᵀ gy = gy · s`` in differentiable operations."""

    @staticmethod
    def forward(x, running_mean, running_var, weight, bias, eps):
        return F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, _, running_var, weight, _, eps = inputs
        scale = torch.rsqrt(running_var + eps)
        if weight is not None:
            scale = scale * weight
        ctx.save_for_backward(scale.detach().reshape((1, -1) + (1,) * (x.dim() - 2)))

    @staticmethod
    def backward(ctx, gy):
        (scale,) = ctx.saved_tensors
        return gy * scale.to(gy.dtype), None, None, None, None, None


class _LayerNorm(torch.autograd.Function):
    """Layer norm over the last dimensions, ``y = x̂ · w + b``, ``x̂ = (x − μ) · r``, ``r = 1/sqrt(var + eps)``.

    ``Jᵀ gy = r · (g − mean(g) − x̂ · mean(g · x̂))`` with ``g = gy · w``. A plain backward (a VJP) runs
    torch's own kernel on the forward's μ and r; one that records a graph (the create-graph backward of
    a double VJP) writes it in differentiable operations with ``x̂`` and ``r`` held, linear in ``gy``."""

    @staticmethod
    def forward(x, normalized_shape, weight, bias, eps):
        out, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
        return out, mean, rstd

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, normalized_shape, weight, _, _ = inputs
        _, mean, rstd = output
        ctx.mark_non_differentiable(mean, rstd)
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.normalized_shape = normalized_shape

    @staticmethod
    def backward(ctx, gy, _mean, _rstd):
        x, mean, rstd, weight = ctx.saved_tensors
        if not (torch.is_grad_enabled() and gy.requires_grad):
            gx = torch.ops.aten.native_layer_norm_backward(gy, x, ctx.normalized_shape, mean, rstd, weight, None,
                                                           [True, False, False])[0]
            return gx, None, None, None, None
        dims = tuple(range(-len(ctx.normalized_shape), 0))
        xhat = (x.detach() - mean) * rstd
        g = gy if weight is None else gy * weight.detach()
        gx = rstd * (g - g.mean(dim=dims, keepdim=True) - xhat * (g * xhat).mean(dim=dims, keepdim=True))
        return gx, None, None, None, None


class _Hardsigmoid(torch.autograd.Function):
    """``y = clamp(x/6 + 1/2, 0, 1)`` with ``Jᵀ gy = gy/6`` where ``−3 < x < 3`` (torch's kernel's mask), in
    differentiable operations: torch's ``hardsigmoid_backward`` has no derivative at all, so every model with
    one (MobileNetV3's squeeze-and-excitation blocks) failed the double backward."""

    @staticmethod
    def forward(x):
        return F.hardsigmoid(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(((x > -3) & (x < 3)).to(x.dtype) / 6)

    @staticmethod
    def backward(ctx, gy):
        (slope,) = ctx.saved_tensors
        return gy * slope


class _Attention(torch.autograd.Function):
    """``y = P v``, ``P = softmax(q kᵀ · scale + mask)`` (torch's ``scaled_dot_product_attention``, fused
    kernel and all, in the forward) with ``Jᵀ`` in differentiable operations, ``P`` held:
    ``gv = Pᵀ gy``, ``gs = P ⊙ (gP − rowsum(gP ⊙ P))`` with ``gP = gy vᵀ``, ``gq = gs k · scale``,
    ``gk = gsᵀ q · scale``. torch's fused kernels (flash, memory-efficient, the CPU's flash) have no
    double backward; this one is four matrix products, linear in ``gy``."""

    @staticmethod
    def forward(q, k, v, mask, is_causal, scale):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, mask, is_causal, scale = inputs
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        wide = torch.promote_types(q.dtype, torch.float32)  # half-precision scores in float32, as fused kernels
        s = q.to(wide) @ k.to(wide).transpose(-2, -1) * scale
        if is_causal:  # top-left aligned, as torch's (L, S) tril
            s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), -math.inf)
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
        ctx.save_for_backward(q, k, v, torch.softmax(s, dim=-1).to(q.dtype))
        ctx.scale = scale

    @staticmethod
    def backward(ctx, gy):
        q, k, v, p = (t.detach() for t in ctx.saved_tensors)
        gp = gy @ v.transpose(-2, -1)
        gs = p * (gp - (gp * p).sum(dim=-1, keepdim=True))
        grads = [gs @ k * ctx.scale if ctx.needs_input_grad[0] else None,
                 gs.transpose(-2, -1) @ q * ctx.scale if ctx.needs_input_grad[1] else None,
                 p.transpose(-2, -1) @ gy if ctx.needs_input_grad[2] else None]
        return *grads, None, None, None


def _attention(a: dict, constant):
    """``scaled_dot_product_attention`` through :class:`_Attention` where it covers the call, else None:
    no dropout, q, k and v of one batch shape (grouped-query k and v repeated to q's heads, as torch's
    ``enable_gqa`` does), a constant mask."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not (a["dropout_p"] == 0.0 and q.dim() >= 2 and k.dim() == q.dim() == v.dim() and k.shape[:-1] == v.shape[:-1]
            and not any(t.is_nested for t in (q, k, v)) and any(t.requires_grad for t in (q, k, v))
            and not (a["is_causal"] and mask is not None) and constant(mask)):
        return None
    if (a["enable_gqa"] and q.dim() >= 3 and q.shape[:-3] == k.shape[:-3] and 0 < k.shape[-3] < q.shape[-3]
            and q.shape[-3] % k.shape[-3] == 0):
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    if q.shape[:-2] != k.shape[:-2]:
        return None
    return _Attention.apply(q, k, v, mask, bool(a["is_causal"]), a["scale"])


def _rnn_without_cudnn(func, args, kwargs):
    """An RNN call (``torch.lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``) whose input is on CUDA, run with cuDNN
    off, else as it is. cuDNN's RNN backward runs in training mode only ("cudnn RNN backward can only be
    called in training mode": an eval-mode model fails even a VJP) and has no double backward; torch's own
    implementation (fused cells whose backward, when a graph is recorded, is written in differentiable
    operations) has both. Only this call's flag is switched, and restored."""
    if not (args and isinstance(args[0], torch.Tensor) and args[0].is_cuda and torch.backends.cudnn.enabled):
        return func(*args, **kwargs)
    torch.backends.cudnn.enabled = False
    try:
        return func(*args, **kwargs)
    finally:
        torch.backends.cudnn.enabled = True


class native_rnn(TorchFunctionMode):
    """Run the RNNs of the code inside without cuDNN on CUDA (:func:`_rnn_without_cudnn`): for the products
    that do not record under :class:`lean_double_backward` (forward mode, the dense solve's torch.func)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _RNN:
            return _rnn_without_cudnn(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


def native_rnn_for(model):
    """:class:`native_rnn` where ``model`` is a module with an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` in it, else a
    null context: a mode costs every torch call of the forward a Python dispatch (and turns off
    ``nn.MultiheadAttention``'s fast path)."""
    if isinstance(model, torch.nn.Module) and any(isinstance(m, torch.nn.RNNBase) for m in model.modules()):
        return native_rnn()
    return contextlib.nullcontext()


class lean_double_backward(TorchFunctionMode):
    """Record a model's forward so that its double backward skips work ``J v`` never reads.

    Use as a context manager around the forward pass (and the create-graph backward) whose graph
    will be differentiated twice; the backward passes themselves may run outside it.

    Parameters
    ----------
    inputs : tuple of torch.Tensor, optional
        The leaves the Jacobian is taken with respect to. Given, a weight (or mask) is held constant
        unless its autograd graph reaches one of them: a weight-normalized convolution's weight,
        computed from parameters alone, is constant; a weight computed from the input is torch's.
        Not given, only weights that need no gradient or are a module's parameters are held.
    """

    def __init__(self, inputs=None):
        super().__init__()
        self._inputs = None if inputs is None else tuple(inputs)
        self._free = set()  # autograd nodes from which no input is reached

    def _constant(self, *tensors) -> bool:
        """Whether these weights can be held constant. A weight computed from the input (a modulated
        convolution, an adaptive norm) carries part of the Jacobian: its call is torch's."""
        if self._inputs is None:
            return all(t is None or not t.requires_grad or isinstance(t, torch.nn.Parameter) for t in tensors)
        return all(t is None or not t.requires_grad or not self._reaches_input(t) for t in tensors)

    def _reaches_input(self, t) -> bool:
        """Whether ``t``'s autograd graph reaches an input: a walk to the leaves, each node seen once per
        call and, where no input was found, never walked again."""
        if t.grad_fn is None:
            return any(t is x for x in self._inputs)
        stack, seen = [t.grad_fn], set()
        while stack:
            node = stack.pop()
            if node is None or node in seen or node in self._free:
                continue
            seen.add(node)
            leaf = getattr(node, "variable", None)  # AccumulateGrad: a leaf that needs a gradient
            if leaf is not None and any(leaf is x for x in self._inputs):
                return True
            stack.extend(f for f, _ in node.next_functions)
        self._free |= seen
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RNN:
            return _rnn_without_cudnn(func, args, kwargs)
        if (func not in _COVERED or any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types)
                or _autocast_on()):
            return func(*args, **kwargs)
        if func in _CONV:
            nd = _CONV[func]
            a = _bind(_CONV_ARGS, _CONV_DEFAULTS, args, kwargs)
            x, dilation = a["input"], _per_dim(a["dilation"], nd)
            padding = _int_padding(a["padding"], a["weight"], dilation, nd) if x.dim() == nd + 2 else None
            if x.requires_grad and padding is not None and self._constant(a["weight"], a["bias"]):
                return _Conv.apply(x, a["weight"], a["bias"], _per_dim(a["stride"], nd), padding, dilation, a["groups"])
        elif func in _CONV_T:
            nd = _CONV_T[func]
            a = _bind(_CONV_T_ARGS, _CONV_T_DEFAULTS, args, kwargs)
            x, stride, out_pad = a["input"], _per_dim(a["stride"], nd), _per_dim(a["output_padding"], nd)
            if (x.requires_grad and x.dim() == nd + 2 and all(o < s for o, s in zip(out_pad, stride))
                    and self._constant(a["weight"], a["bias"])):
                return _ConvTranspose.apply(x, a["weight"], a["bias"], stride, _per_dim(a["padding"], nd), out_pad,
                                            a["groups"], _per_dim(a["dilation"], nd))
        elif func is F.batch_norm:
            a = _bind(_BN_ARGS, _BN_DEFAULTS, args, kwargs)
            x = a["input"]
            if (x.requires_grad and not a["training"] and a["running_mean"] is not None
                    and a["running_var"] is not None and x.dim() >= 2
                    and self._constant(a["running_mean"], a["running_var"], a["weight"], a["bias"])):
                return _EvalBatchNorm.apply(x, a["running_mean"], a["running_var"], a["weight"], a["bias"], a["eps"])
        elif func is F.layer_norm:
            a = _bind(_LN_ARGS, _LN_DEFAULTS, args, kwargs)
            shape = a["normalized_shape"]
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            if a["input"].requires_grad and a["input"].is_floating_point() and self._constant(a["weight"], a["bias"]):
                return _LayerNorm.apply(a["input"], shape, a["weight"], a["bias"], a["eps"])[0]
        elif func is F.hardsigmoid:
            x = args[0] if args else kwargs["input"]
            inplace = args[1] if len(args) > 1 else kwargs.get("inplace", False)
            if x.requires_grad and x.is_floating_point() and not inplace:
                return _Hardsigmoid.apply(x)
        elif func is F.scaled_dot_product_attention:
            out = _attention(_bind(_SDPA_ARGS, _SDPA_DEFAULTS, args, kwargs), self._constant)
            if out is not None:
                return out
        elif func is _MHA:
            # nn.MultiheadAttention's functional form calls scaled_dot_product_attention from inside, out of
            # this mode's sight, unless weights are asked for: then it writes the attention in matrix products
            # and a softmax, which torch differentiates twice. Same output; the weights are dropped.
            a = _MHA_SIGNATURE.bind(*args, **kwargs)
            a.apply_defaults()
            a = a.arguments
            if not a["need_weights"] and any(a[n].requires_grad for n in ("query", "key", "value")):
                a.update(need_weights=True, average_attn_weights=False)
                return func(**a)[0], None
        return func(*args, **kwargs)
