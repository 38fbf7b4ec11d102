"""Torch Jacobian operators against dense torch.func Jacobians; the zero-copy bridge."""
import contextlib

import numpy as np
import pytest
import torch

from hcrfast.bindings import TorchJacobian, from_torch, to_device, to_torch

_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def conv_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(3 * 3 * 3, 7), torch.nn.Tanh()).double().eval()


def mlp_model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(50, 40), torch.nn.ReLU(),
                               torch.nn.Linear(40, 30), torch.nn.Softplus()).double().eval()


def dense_jacobians(model, x):
    """(B, n, p) Jacobians from torch.func.jacrev, example by example."""
    jac = torch.func.vmap(torch.func.jacrev(lambda xi: model(xi[None])[0].reshape(-1)))(x)
    return jac.reshape(x.shape[0], -1, x[0].numel()).detach().numpy()


def assert_products_match(op, J, seed):
    """``op``'s J v and Jᵀ u against the dense (B, n, p) Jacobians ``J``, for random v and u, in float64."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((op.batch, op.n_cols))
    u = rng.standard_normal((op.batch, op.n_rows))
    np.testing.assert_allclose(op.matvec(v), np.einsum("bij,bj->bi", J, v), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.rmatvec(u), np.einsum("bij,bi->bj", J, u), rtol=1e-12, atol=1e-12)
    return v, u


CASES = [(conv_model, (4, 2, 8, 8)), (mlp_model, (5, 2, 5, 5))]


@pytest.mark.parametrize("mode", ["reverse", "forward"])
@pytest.mark.parametrize("make,shape", CASES)
def test_products_match_dense_jacobian(make, shape, mode):
    model = make()
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    J = dense_jacobians(model, x)
    op = TorchJacobian(model, x, mode=mode)
    assert (op.batch, op.n_rows, op.n_cols) == J.shape
    v, _ = assert_products_match(op, J, 3)
    # the same operator applied again (the recorded graph is reused) gives the same answer
    np.testing.assert_array_equal(op.matvec(v), op.matvec(v))


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_dot_test(mode):
    model = conv_model()
    x = torch.randn(3, 2, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    op = TorchJacobian(model, x, mode=mode)
    rng = np.random.default_rng(5)
    v = rng.standard_normal((3, op.n_cols))
    w = rng.standard_normal((3, op.n_rows))
    lhs = np.einsum("bi,bi->b", op.matvec(v), w)
    rhs = np.einsum("bi,bi->b", v, op.rmatvec(w))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)


def test_take_restricts_to_rows():
    model = mlp_model()
    x = torch.randn(6, 2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    op = TorchJacobian(model, x)
    rows = np.array([4, 1])
    sub = op.take(rows)
    v = np.random.default_rng(7).standard_normal((6, op.n_cols))
    np.testing.assert_allclose(sub.matvec(v[rows]), op.matvec(v)[rows], rtol=1e-13)


def test_products_do_not_touch_parameter_gradients():
    model = mlp_model()
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    op = TorchJacobian(model, x)
    op.matvec(np.ones((2, 50)))
    op.rmatvec(np.ones((2, 30)))
    assert all(p.grad is None for p in model.parameters())


def test_bridge_is_zero_copy_on_cpu():
    a = np.random.default_rng(8).standard_normal((4, 9)).astype(np.float32)
    t = to_torch(a)
    assert t.data_ptr() == a.ctypes.data
    back = from_torch(t)
    assert back.ctypes.data == a.ctypes.data
    t2 = torch.randn(3, 5)
    assert from_torch(t2).ctypes.data == t2.data_ptr()


def test_operator_output_shares_memory_with_torch_result(monkeypatch):
    """matvec hands the solver the tensor torch produced, not a copy of it."""
    import hcrfast.bindings.jacobian as jac

    produced = []
    real = jac.from_torch
    monkeypatch.setattr(jac, "from_torch", lambda t: produced.append(t) or real(t))
    model = mlp_model()
    op = TorchJacobian(model, torch.randn(2, 2, 5, 5, dtype=torch.float64))
    out = op.matvec(np.ones((2, 50)))
    assert out.ctypes.data == produced[-1].data_ptr()


def test_to_device_on_cpu_is_the_host_array_itself():
    a = np.arange(5, dtype=np.int64)[::-1]  # not contiguous: copied once, to a long tensor
    t = to_device(a, torch.device("cpu"))
    assert t.dtype == torch.int64 and t.tolist() == [4, 3, 2, 1, 0]
    b = np.arange(4)
    assert to_device(b, torch.device("cpu")).data_ptr() == b.ctypes.data


def test_bridge_rejects_other_types():
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        to_torch([1.0, 2.0])


def _fp32_settings():
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


def _tf32_state():
    """torch's float32 settings as every reader sees them; the legacy cuDNN reader may refuse ("raises")."""
    cudnn = torch.backends.cudnn
    try:
        flag = cudnn.allow_tf32
    except RuntimeError:
        flag = "raises"
    return (torch.backends.cuda.matmul.fp32_precision, cudnn.fp32_precision, cudnn.conv.fp32_precision,
            cudnn.rnn.fp32_precision, flag)


def _caller_legacy(value):
    torch.backends.cudnn.allow_tf32 = value


def _caller_conv_only():    # a mix torch itself refuses to read back
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.conv.fp32_precision = "ieee"


def _caller_matmul_tf32():
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.fp32_precision = "tf32"


@pytest.mark.skipif(not hasattr(torch.backends.cudnn, "rnn"), reason="torch before the fp32_precision settings")
@pytest.mark.parametrize("caller", [lambda: None, lambda: _caller_legacy(True), lambda: _caller_legacy(False),
                                    _caller_conv_only, _caller_matmul_tf32],
                         ids=["defaults", "legacy-on", "legacy-off", "conv-only", "matmul-tf32"])
def test_ieee_float32_leaves_torchs_cudnn_flags_readable_and_restores_them(caller):
    """Inside the block, model code that reads torch.backends.cudnn.allow_tf32 or enters
    torch.backends.cudnn.flags() runs (both raised while conv alone was set to IEEE: torch refuses
    to read cuDNN's flags while they disagree); matmuls, convolutions and recurrent layers are IEEE
    (not TF32); afterwards every reader sees what the caller had set, whichever API set it."""
    from hcrfast.bindings import ieee_float32

    saved = _tf32_state()
    try:
        caller()
        before = _tf32_state()
        with ieee_float32():
            inside = _tf32_state()
            with torch.backends.cudnn.flags(enabled=True):
                pass
        assert inside[0] == inside[2] == inside[3] == "ieee" and inside[4] is False
        assert _tf32_state() == before
    finally:
        torch.backends.cudnn.allow_tf32 = saved[4] if saved[4] != "raises" else True
        (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.fp32_precision,
         torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision) = saved[:4]


def test_ieee_float32_on_a_torch_with_only_the_allow_tf32_flags(monkeypatch):
    """torch before the fp32_precision settings (pyproject allows 2.3) has neither them nor cudnn.rnn: the
    block turns its two allow_tf32 flags off and restores them (a lookup of cudnn.rnn raised there)."""
    import types

    from hcrfast.bindings import ieee_float32

    matmul, cudnn = types.SimpleNamespace(allow_tf32=True), types.SimpleNamespace(allow_tf32=True)
    monkeypatch.setattr(torch, "backends", types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul),
                                                                 cudnn=cudnn))
    with ieee_float32():
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, False)
    assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="torch before the fp32_precision settings")
def test_ieee_float32_sets_and_restores_torch_precision():
    from hcrfast.bindings import ieee_float32

    saved = _fp32_settings()
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        with ieee_float32():
            assert _fp32_settings() == ("ieee", "ieee")
        assert _fp32_settings() == ("tf32", "tf32")
        with pytest.raises(ZeroDivisionError), ieee_float32():
            1 / 0
        assert _fp32_settings() == ("tf32", "tf32")
        with ieee_float32(False):
            assert _fp32_settings() == ("tf32", "tf32")
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


def test_forward_mode_entry_points_do_not_pass_on_torchs_jit_warning():
    """torch.func.jvp loads torch's decompositions through the deprecated torch.jit.script once per
    process (a FutureWarning about torch's internals); every forward-mode entry point loads them
    through the bindings' quiet jvp. A fresh process with that warning turned into an error."""
    import subprocess
    import sys
    code = (
        "import torch, hcrfast\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh()).double().eval()\n"
        "x = torch.randn(2, 6, dtype=torch.float64)\n"
        "hcrfast.bound(m, x, 0.5, basis='pixel', solver='dense', restarts=1, iterations=1)\n"   # J forward: p < n
        "hcrfast.bound(m, x, 0.5, basis='pixel', solver='lsqr', jacobian='forward', restarts=1, iterations=1)\n"
        "hcrfast.targeted_bound(m, x, 0.5, basis='pixel', method='dense', jacobian='forward')\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_cupy_allocator_setting_is_checked(monkeypatch):
    """HCRFAST_CUPY_ALLOCATOR: torch by default (unset or empty), cupy on request, anything else
    refused with the value and the choices (the allocations themselves are test_gpu.py's)."""
    from hcrfast.bindings.bridge import cupy_allocator_choice

    monkeypatch.delenv("HCRFAST_CUPY_ALLOCATOR", raising=False)
    assert cupy_allocator_choice() == "torch"
    monkeypatch.setenv("HCRFAST_CUPY_ALLOCATOR", "")
    assert cupy_allocator_choice() == "torch"
    monkeypatch.setenv("HCRFAST_CUPY_ALLOCATOR", " CuPy ")
    assert cupy_allocator_choice() == "cupy"
    monkeypatch.setenv("HCRFAST_CUPY_ALLOCATOR", "rmm")
    with pytest.raises(ValueError, match=r"HCRFAST_CUPY_ALLOCATOR='rmm' is not one of torch, cupy"):
        cupy_allocator_choice()


class _FakeCupy:
    """Just the CuPy names ``_cupy_allocations`` and ``torch_malloc`` read, recording what they are asked."""

    def __init__(self, allocator=None, stream_ptr=7):
        import types

        self.pool = types.SimpleNamespace()
        self.pool.malloc = types.MethodType(lambda pool, size: ("pool", size), self.pool)
        self.installed = []
        current = self.pool.malloc if allocator is None else allocator
        self.cuda = types.SimpleNamespace(
            get_allocator=lambda: current,
            using_allocator=lambda fn: self.installed.append(fn) or contextlib.nullcontext(),
            get_current_stream=lambda: types.SimpleNamespace(ptr=stream_ptr),
            UnownedMemory=lambda ptr, size, owner, device: ("unowned", ptr, size, owner, device),
            MemoryPointer=lambda mem, offset: ("pointer", mem, offset))

    def get_default_memory_pool(self):
        return self.pool


def test_cupy_allocations_replace_only_cupys_default_pool(monkeypatch):
    """torch's allocator is installed over CuPy's default pool, and not over an allocator the caller
    chose, under HCRFAST_CUPY_ALLOCATOR=cupy or when torch does not cache device memory."""
    import types

    from hcrfast.bindings.bridge import _cupy_allocations

    stream = types.SimpleNamespace(ptr=7)
    monkeypatch.delenv("HCRFAST_CUPY_ALLOCATOR", raising=False)
    monkeypatch.delenv("PYTORCH_NO_CUDA_MEMORY_CACHING", raising=False)
    fake = _FakeCupy()
    with _cupy_allocations(fake, stream, 0):
        pass
    (installed,) = fake.installed
    assert installed.args == (fake, 7, 0, fake.pool.malloc)
    users = _FakeCupy(allocator=lambda size: ("rmm", size))
    with _cupy_allocations(users, stream, 0):
        pass
    assert users.installed == []
    for env, value in (("HCRFAST_CUPY_ALLOCATOR", "cupy"), ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")):
        monkeypatch.setenv(env, value)
        fake = _FakeCupy()
        with _cupy_allocations(fake, stream, 0):
            pass
        assert fake.installed == [], env
        monkeypatch.delenv(env)


def test_torch_malloc_leaves_other_streams_and_empty_arrays_to_others():
    """On a stream that is not the solver's the fallback serves; a 0-byte array needs no block."""
    from hcrfast.bindings.bridge import torch_malloc

    fake = _FakeCupy(stream_ptr=9)
    assert torch_malloc(fake, 7, 0, fake.pool.malloc, 4096) == ("pool", 4096)
    fake = _FakeCupy(stream_ptr=7)
    assert torch_malloc(fake, 7, 0, fake.pool.malloc, 0) == ("pointer", ("unowned", 0, 0, None, 0), 0)


class _Cube(torch.autograd.Function):
    """x**3 with a once-differentiable backward (reverse mode's J v needs a double backward) and a jvp."""

    @staticmethod
    def forward(x):
        return x**3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * grad

    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * tangent


class _CubeModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.lin = torch.nn.Linear(6, 4).double()

    def forward(self, x):
        return _Cube.apply(self.lin(x))


def test_take_keeps_forward_mode_for_a_model_reverse_mode_cannot_differentiate_twice():
    """op.take(rows) of a forward-mode operator is a forward-mode operator: J v at the rows, against the
    analytic Jacobian diag(3 h^2) W (h = W x + b), where reverse mode's double backward fails."""
    model = _CubeModel()
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    W, b = model.lin.weight.detach().numpy(), model.lin.bias.detach().numpy()
    h = x.numpy() @ W.T + b
    J = 3 * h[:, :, None] ** 2 * W[None]  # (B, 4, 6)
    rows = np.array([3, 0])
    v = np.random.default_rng(11).standard_normal((2, 6))
    with pytest.raises(RuntimeError):
        TorchJacobian(model, x[rows]).matvec(v)  # reverse mode: once_differentiable refuses J v
    sub = TorchJacobian(model, x, mode="forward").take(rows)
    np.testing.assert_allclose(sub.matvec(v), np.einsum("bij,bj->bi", J[rows], v), rtol=1e-12, atol=1e-12)
    u = np.random.default_rng(12).standard_normal((2, 4))
    np.testing.assert_allclose(sub.rmatvec(u), np.einsum("bij,bi->bj", J[rows], u), rtol=1e-12, atol=1e-12)


def test_from_torch_makes_a_non_contiguous_tensor_contiguous():
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4).T  # a transposed view: not contiguous
    a = from_torch(t)
    assert a.flags.c_contiguous
    np.testing.assert_array_equal(a, np.arange(12.0).reshape(3, 4).T)


# ------------------------------------------------ mode "reverse": the lean double backward of convolutions and norms


class _Block(torch.nn.Module):
    """A residual block as in ResNet: conv-BN-ReLU-conv-BN plus a strided 1×1 shortcut with its own BN."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(13)
        nn = torch.nn
        self.main = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4))
        self.short = nn.Sequential(nn.Conv2d(3, 4, 1, stride=2, bias=False), nn.BatchNorm2d(4))
        for bn in (self.main[1], self.main[4], self.short[1]):  # running statistics other than 0 and 1
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x):
        return torch.relu(self.main(x) + self.short(x))


def _affine(norm):
    """A norm layer with weights and biases other than 1 and 0."""
    norm.weight.data.uniform_(0.5, 1.5)
    norm.bias.data.uniform_(-0.2, 0.2)
    return norm


class _InputDependentWeights(torch.nn.Module):
    """Weights computed from the input (a modulated convolution, an adaptive layer norm): the Jacobian runs
    through them too, so the lean Functions, which hold weights constant, must leave these calls to torch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(37)
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.norm = torch.nn.Linear(2, 3)

    def forward(self, x):
        style = x.mean(dim=(2, 3))                                       # (B, 2)
        out = torch.cat([torch.nn.functional.conv2d(x[b:b + 1], self.conv.weight * (1 + style[b, 0]),
                                                    self.conv.bias * style[b, 1], padding=1)
                         for b in range(x.shape[0])])
        gamma = self.norm(style)                                         # (B, 3)
        return torch.cat([torch.nn.functional.layer_norm(out[b:b + 1].transpose(1, 3), (3,), gamma[b], None)
                          for b in range(x.shape[0])])


class _SqueezeExcitation(torch.nn.Module):
    """MobileNetV3's squeeze-and-excitation block (torchvision's, with its hardsigmoid gate) after a convolution."""

    def __init__(self):
        super().__init__()
        from torchvision.ops import SqueezeExcitation

        torch.manual_seed(56)
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.se = SqueezeExcitation(8, 4, scale_activation=torch.nn.Hardsigmoid)
        torch.nn.init.normal_(self.se.fc2.weight, std=15.0)  # gates on both sides of the kinks at ±3

    def forward(self, x):
        return self.se(self.conv(x))


def _lean_cases():
    nn = torch.nn

    def seq(*layers, seed):
        torch.manual_seed(seed)
        return nn.Sequential(*layers, nn.Tanh())

    return {
        # even sizes under stride 2: the forward's floor drops a remainder, conv_transpose's output_padding is 1
        "conv1d-stride-dilation": (lambda: seq(nn.Conv1d(2, 3, 3, stride=2, padding=1, dilation=2), seed=14), (3, 2, 14)),
        "conv2d-groups-bias": (lambda: seq(nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), groups=2), seed=15),
                               (2, 4, 10, 8)),
        "conv3d": (lambda: seq(nn.Conv3d(2, 2, 2, stride=2, bias=False), seed=16), (2, 2, 5, 4, 5)),
        "conv2d-padding-same-odd": (lambda: seq(nn.Conv2d(2, 3, 4, padding="same"), seed=17), (2, 2, 7, 7)),
        "conv2d-padding-same": (lambda: seq(nn.Conv2d(2, 3, 3, padding="same", dilation=(2, 1)), seed=26), (2, 2, 7, 6)),
        "conv1d-padding-valid": (lambda: seq(nn.Conv1d(2, 3, 3, padding="valid"), seed=27), (2, 2, 9)),
        "conv2d-reflect": (lambda: seq(nn.Conv2d(2, 3, 3, padding=2, padding_mode="reflect"), seed=18), (2, 2, 6, 7)),
        "conv-transpose2d": (lambda: seq(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                                         seed=32), (2, 4, 4, 5)),
        "conv-transpose1d-dilation": (lambda: seq(nn.ConvTranspose1d(2, 3, 3, stride=3, output_padding=2, dilation=2),
                                                  seed=33), (2, 2, 5)),
        "conv-transpose1d-padding-over-stride": (lambda: seq(nn.ConvTranspose1d(2, 3, 3, output_padding=1, dilation=2),
                                                             seed=34), (2, 2, 5)),  # left to torch
        "batchnorm1d-no-affine": (lambda: seq(nn.Linear(5, 4), nn.BatchNorm1d(4, affine=False), seed=19), (3, 5)),
        "layernorm": (lambda: seq(nn.Linear(5, 6), _affine(nn.LayerNorm(6)), seed=28), (3, 5)),
        "layernorm-two-dims-no-affine": (lambda: seq(nn.Conv1d(2, 3, 2), nn.LayerNorm((3, 4), elementwise_affine=False),
                                                     seed=29), (2, 2, 5)),
        "conv2d-weight-norm": (lambda: seq(torch.nn.utils.parametrizations.weight_norm(nn.Conv2d(2, 3, 3, padding=1)),
                                           seed=38), (2, 2, 5, 4)),
        "conv1d-legacy-weight-norm": (lambda: seq(torch.nn.utils.weight_norm(nn.Conv1d(2, 3, 3)), seed=39), (2, 2, 7)),
        "resnet-block": (_Block, (2, 3, 10, 10)),
        "weights-from-the-input": (_InputDependentWeights, (2, 2, 5, 4)),
    }


@pytest.mark.parametrize("case", list(_lean_cases()))
def test_lean_double_backward_products_match_torch_func_jacobians(case):
    """Mode "reverse" records convolutions and norms through lean_double_backward: J v and Jᵀ u
    against torch.func.jacrev's dense Jacobians (not recorded under the mode), in float64."""
    make, shape = _lean_cases()[case]
    model = make().double().eval()
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(20))
    J = dense_jacobians(model, x)
    op = TorchJacobian(model, x)
    assert_products_match(op, J, 21)
    assert all(p.grad is None for p in model.parameters())


class _AtenCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten operators run inside, with a convolution backward's output mask."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.calls.append((name, tuple(args[-1])) if name == "convolution_backward" else name)
        return func(*args, **(kwargs or {}))

    def convolutions(self):
        return [c for c in self.calls if "convolution" in (c[0] if isinstance(c, tuple) else c)]


@pytest.mark.parametrize("lean", [True, False])
def test_lean_double_backward_runs_one_convolution_per_layer_in_a_jvp(lean, monkeypatch):
    """The point of the mode: a JVP by double VJP runs one convolution per convolution layer (a convolution
    backward for the input alone: torch's own double backward also runs the weight gradient's) and no
    batch-norm backward. Counted at the aten level, with torch's own graph (LEAN_DOUBLE_BACKWARD = False)
    as the control that the count can fail."""
    import hcrfast.bindings.jacobian as jac

    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", lean)
    model = _Block().double().eval()
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(22))
    op = TorchJacobian(model, x)
    v = np.random.default_rng(23).standard_normal((2, op.n_cols))
    u = np.random.default_rng(24).standard_normal((2, op.n_rows))
    op.matvec(v)  # the graph is recorded outside the count
    with _AtenCalls() as jvp_ops:
        op.matvec(v)
    with _AtenCalls() as vjp_ops:
        op.rmatvec(u)
    batch_norm = [c for c in jvp_ops.calls if "batch_norm" in str(c)]
    input_only = [("convolution_backward", (True, False, False))] * 3
    if lean:
        assert jvp_ops.convolutions() == input_only and not batch_norm
        assert vjp_ops.convolutions() == ["convolution"] * 3  # Jᵀ u: a transposed convolution per layer
    else:  # torch's graph does more: what the mode removes
        assert jvp_ops.convolutions() != input_only or batch_norm


@pytest.mark.parametrize("norm", ["parametrizations", "legacy"])
def test_lean_double_backward_holds_weights_computed_from_parameters_alone(norm):
    """A weight-normalized convolution's weight is computed from its parameters (g · v / ‖v‖) in the forward:
    it needs a gradient and is no parameter, but its graph never reaches the input, so the recorded call is
    lean (one convolution in a JVP, not torch's two). The residual block's weights computed from the input
    are the other side (test above)."""
    wrap = (torch.nn.utils.parametrizations.weight_norm if norm == "parametrizations"
            else torch.nn.utils.weight_norm)
    torch.manual_seed(40)
    model = torch.nn.Sequential(wrap(torch.nn.Conv2d(2, 3, 3, padding=1)), torch.nn.Tanh()).double().eval()
    x = torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(41))
    op = TorchJacobian(model, x)
    v = np.random.default_rng(42).standard_normal((2, op.n_cols))
    op.matvec(v)
    with _AtenCalls() as jvp_ops:
        op.matvec(v)
    assert jvp_ops.convolutions() == [("convolution_backward", (True, False, False))], jvp_ops.convolutions()


def test_lean_double_backward_leaves_forward_values_and_other_calls_unchanged():
    """Under the mode a model's output is bit for bit its output without it; a call the mode does not cover
    (no gradient wanted, training-mode batch norm) is torch's own."""
    from hcrfast.bindings.double_backward import lean_double_backward

    model = _Block().double().eval()
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(25))
    plain = model(x.requires_grad_(True))
    with lean_double_backward():
        lean = model(x)
        with torch.no_grad():
            no_grad = model(x)
        bn = torch.nn.BatchNorm2d(3).double().train()
        trained = bn(x)
    torch.testing.assert_close(lean, plain, rtol=0, atol=0)
    torch.testing.assert_close(no_grad, plain.detach(), rtol=0, atol=0)
    assert "NativeBatchNormBackward" in type(trained.grad_fn).__name__
    assert torch.allclose(bn.running_mean, 0.1 * x.detach().mean(dim=(0, 2, 3)))  # training updated its statistics


@pytest.mark.parametrize("padding,kernel,lean", [("same", 3, True), ("valid", 4, True), (1, 3, True), ("same", 4, False)])
def test_lean_double_backward_covers_string_padding_where_it_is_symmetric(padding, kernel, lean):
    """padding="valid" is 0 and "same" is d·(k − 1)/2 on both sides where that total is even: those go through
    the lean Function; an odd total (torch pads one side more) is left to torch."""
    from hcrfast.bindings.double_backward import _Conv, lean_double_backward

    conv = torch.nn.Conv2d(2, 3, kernel, padding=padding).double()
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    with lean_double_backward():
        y = conv(x)
    assert (type(y.grad_fn).__name__ == _Conv.__name__ + "Backward") == lean
    torch.testing.assert_close(y, conv(x), rtol=0, atol=0)


def test_lean_double_backward_jvp_through_a_layer_norm_runs_under_a_third_of_the_operations(monkeypatch):
    """torch's double backward of a layer norm is a composite of ~60 operations (every input's gradient, one
    kernel launch each on a GPU); under the lean graph a JVP through it is a few elementwise operations and
    two means. Counted at the aten level, the whole JVP, lean against torch's graph."""
    import hcrfast.bindings.jacobian as jac

    torch.manual_seed(30)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), _affine(torch.nn.LayerNorm(6)), torch.nn.GELU()).double().eval()
    x = torch.randn(3, 5, dtype=torch.float64)
    v = np.random.default_rng(31).standard_normal((3, 5))
    counts, products = {}, {}
    for lean in (True, False):
        monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", lean)
        op = TorchJacobian(model, x)
        op.matvec(v)
        with _AtenCalls() as jvp_ops:
            products[lean] = op.matvec(v)
        counts[lean] = len(jvp_ops.calls)
    assert 3 * counts[True] <= counts[False], counts  # 22 against 77 with torch 2.14
    np.testing.assert_allclose(products[True], products[False], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("lean", [True, False])
def test_lean_double_backward_runs_one_convolution_per_transposed_convolution_in_a_jvp(lean, monkeypatch):
    """A transposed convolution's double backward in torch also computes the weight gradient; under the lean
    graph a JVP through one is one convolution backward for the input. torch's graph as the control."""
    import hcrfast.bindings.jacobian as jac

    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", lean)
    torch.manual_seed(35)
    model = torch.nn.Sequential(torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
                                torch.nn.Tanh()).double().eval()
    op = TorchJacobian(model, torch.randn(2, 3, 4, 4, dtype=torch.float64))
    v = np.random.default_rng(36).standard_normal((2, op.n_cols))
    op.matvec(v)
    with _AtenCalls() as jvp_ops:
        op.matvec(v)
    assert (jvp_ops.convolutions() == [("convolution_backward", (True, False, False))]) == lean, jvp_ops.convolutions()


def test_lean_double_backward_leaves_calls_under_autocast_to_torch():
    """Under autocast a call runs in another dtype than its input's; the mode leaves such calls to torch."""
    from hcrfast.bindings.double_backward import _Conv, _LayerNorm, lean_double_backward

    conv, norm = torch.nn.Conv2d(2, 3, 3), torch.nn.LayerNorm(4)
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    h = torch.randn(2, 4, requires_grad=True)
    with lean_double_backward():
        assert type(conv(x).grad_fn).__name__ == _Conv.__name__ + "Backward"
        assert type(norm(h).grad_fn).__name__.startswith(_LayerNorm.__name__)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert type(conv(x).grad_fn).__name__ != _Conv.__name__ + "Backward"
            assert not type(norm(h).grad_fn).__name__.startswith(_LayerNorm.__name__)


# ------------------------------------------------ attention: torch's fused kernels have no double backward


class _Attention(torch.nn.Module):
    """Self-attention (or cross-attention on a constant memory) written with scaled_dot_product_attention, as
    timm and Hugging Face models write it; q, k and v are projections of the input."""

    def __init__(self, mask=None, is_causal=False, scale=None, cross=False, dropout_p=0.0, gqa=False):
        super().__init__()
        torch.manual_seed(41)
        self.proj = torch.nn.Linear(4, 3 * 8)
        self.memory = torch.nn.Parameter(torch.randn(1, 2, 7, 4))
        self.mask, self.is_causal, self.scale, self.cross, self.dropout_p, self.gqa = (mask, is_causal, scale, cross,
                                                                                        dropout_p, gqa)

    def forward(self, x):                                   # (B, L, 4) → (B, 2 heads, L, 4)
        q, k, v = self.proj(x).view(x.shape[0], x.shape[1], 2, 3, 4).permute(3, 0, 2, 1, 4)
        if self.cross:
            k = self.memory.expand(x.shape[0], -1, -1, -1)
            v = 2 * k
        if self.gqa:
            k, v = k[:, :1], v[:, :1]
        extra = dict(enable_gqa=True) if self.gqa else {}
        return torch.tanh(torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=self.mask, dropout_p=self.dropout_p, is_causal=self.is_causal, scale=self.scale,
            **extra))


class _BiasedAttention(_Attention):
    """A relative-position bias computed by a small network from fixed offsets (as in T5 or Swin V2), passed
    as the float mask: it needs a gradient but never reaches the input, so the call stays lean."""

    def __init__(self):
        super().__init__()
        self.bias_net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        self.register_buffer("offsets", (torch.arange(5.0)[:, None] - torch.arange(5.0)[None, :])[..., None] / 5)

    def forward(self, x):
        self.mask = self.bias_net(self.offsets.to(x.dtype)).permute(2, 0, 1)[None]   # (1, 2 heads, 5, 5)
        return super().forward(x)


class _MultiheadSelfAttention(torch.nn.Module):
    def __init__(self, padding=None, **kwargs):
        super().__init__()
        torch.manual_seed(42)
        self.attn = torch.nn.MultiheadAttention(4, 2, batch_first=True)
        self.padding, self.kwargs = padding, kwargs  # padding: (S,) bool, the keys every example masks out

    def forward(self, x):
        extra = {} if self.padding is None else dict(key_padding_mask=self.padding.expand(x.shape[0], -1))
        return self.attn(x, x, x, need_weights=False, **self.kwargs, **extra)[0]


class _Decoder(torch.nn.Module):
    """nn.TransformerDecoder over the input, cross-attending to a learned memory of 7 tokens."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(60)
        self.memory = torch.nn.Parameter(torch.randn(1, 7, 4))
        self.decoder = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(4, 2, 16, batch_first=True), 1)

    def forward(self, x):
        return self.decoder(x, self.memory.expand(x.shape[0], -1, -1))


def _attention_cases():
    gen = torch.Generator().manual_seed(43)
    nn = torch.nn
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    return {
        "plain": lambda: _Attention(),
        "causal": lambda: _Attention(is_causal=True),
        "bool-mask": lambda: _Attention(mask=torch.rand(5, 5, generator=gen) > 0.3),
        "float-mask-per-head": lambda: _Attention(mask=torch.randn(1, 2, 5, 5, generator=gen, dtype=torch.float64)),
        "cross-causal-scale": lambda: _Attention(cross=True, is_causal=True, scale=0.3),  # L = 5 queries, S = 7 keys
        "bias-from-parameters": lambda: _BiasedAttention(),
        "grouped-query-causal": lambda: _Attention(gqa=True, is_causal=True),
        "multihead": lambda: _MultiheadSelfAttention(),
        "multihead-causal": lambda: _MultiheadSelfAttention(attn_mask=nn.Transformer.generate_square_subsequent_mask(
            5, dtype=torch.float64), is_causal=True),
        "multihead-bool-mask": lambda: _MultiheadSelfAttention(attn_mask=~causal),
        "multihead-key-padding": lambda: _MultiheadSelfAttention(
            padding=torch.tensor([False, False, True, False, True])),
        "transformer-decoder": lambda: _Decoder(),
        "transformer-encoder": lambda: (torch.manual_seed(44), nn.TransformerEncoder(
            nn.TransformerEncoderLayer(4, 2, 16, batch_first=True), 2, enable_nested_tensor=False))[1],
    }


@pytest.mark.parametrize("case", list(_attention_cases()))
def test_lean_double_backward_differentiates_fused_attention_twice(case, monkeypatch):
    """torch's fused attention kernels (here the CPU's flash kernel) refuse the double backward of mode
    "reverse"; under lean_double_backward the call keeps its kernel in the forward and gets a backward in
    matrix products, nn.MultiheadAttention its own softmax form. J v and Jᵀ u against torch.func.jacrev
    under the MATH backend, in float64; without the mode, torch's graph fails on the same model."""
    import hcrfast.bindings.jacobian as jac
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = _attention_cases()[case]().double().eval()
    x = torch.randn(2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(45))
    with sdpa_kernel(SDPBackend.MATH):
        J = dense_jacobians(model, x)
    op = TorchJacobian(model, x)
    v, _ = assert_products_match(op, J, 46)
    assert np.abs(J).max() > 1e-3 and all(p.grad is None for p in model.parameters())
    recorded = _graph_names(op._recorded()[1])
    assert ("_AttentionBackward" in recorded) == (case not in ("multihead", "multihead-causal", "multihead-bool-mask",
                                                               "multihead-key-padding", "transformer-decoder",
                                                               "transformer-encoder")), recorded
    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", False)
    if case == "bias-from-parameters":  # a mask that needs a gradient sends torch to its MATH backend
        return
    if case == "grouped-query-causal" and _TORCH < (2, 14):  # torch 2.8's CPU flash kernel takes no grouped-query
        return  # heads: MATH runs it, whose graph differentiates twice (measured on 2.8; 2.14 fails as below)
    with pytest.raises(RuntimeError, match="derivative for .*scaled_dot_product.* is not implemented"):
        TorchJacobian(model, x).matvec(v)


def _graph_names(t) -> set:
    """The names of the autograd nodes of ``t``'s graph."""
    names, stack, seen = set(), [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(f for f, _ in node.next_functions)
    return names


class _ClampGate(torch.nn.Module):
    def forward(self, t):
        return torch.clamp(t / 6 + 0.5, 0, 1)


def test_lean_double_backward_differentiates_hardsigmoid_twice(monkeypatch):
    """torch's hardsigmoid_backward has no derivative, so a JVP by double VJP failed on every model with a
    hardsigmoid (MobileNetV3's squeeze-and-excitation blocks); under the mode it runs. The oracle is
    torch.func.jacrev of the same block with the gate written as clamp(x/6 + 1/2, 0, 1): torch's own
    hardsigmoid backward multiplies by 1/6 rounded to float32 even in float64 (a relative 3e-8), the lean
    one by 1/6. Its slope is 0 at the kinks ±3 themselves, as torch's kernel's; without the mode torch's
    graph fails."""
    import copy

    import hcrfast.bindings.jacobian as jac

    model = _SqueezeExcitation().double().eval()
    x = torch.randn((2, 4, 5, 5), dtype=torch.float64, generator=torch.Generator().manual_seed(57))
    written_out = copy.deepcopy(model)
    written_out.se.scale_activation = _ClampGate()
    gates = model.se.fc2(torch.relu(model.se.fc1(model.conv(x).mean(dim=(2, 3), keepdim=True))))
    assert (gates.abs() < 3).any() and (gates.abs() > 3).any()  # both sides of the kinks
    assert_products_match(TorchJacobian(model, x), dense_jacobians(written_out, x), 58)

    gate = torch.nn.Hardsigmoid()
    kinks = torch.tensor([[-4.0, -3.0, -1.0, 0.0, 2.5, 3.0, 3.5]], dtype=torch.float64)
    jv = TorchJacobian(gate, kinks).matvec(np.ones((1, 7)))
    np.testing.assert_array_equal(jv, [[0, 0, 1 / 6, 1 / 6, 1 / 6, 0, 0]])
    kinks.requires_grad_(True)
    torch.nn.functional.hardsigmoid(kinks).backward(torch.ones_like(kinks))
    np.testing.assert_allclose(jv, kinks.grad.numpy(), rtol=1e-7, atol=0)  # torch's slope, its float32 1/6
    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", False)
    with pytest.raises(RuntimeError, match="derivative for aten::hardsigmoid_backward is not implemented"):
        TorchJacobian(gate, kinks.detach()).matvec(np.ones((1, 7)))


@pytest.mark.parametrize("gqa", [False, True], ids=["plain", "grouped-query"])
def test_lean_double_backward_leaves_attention_with_dropout_to_torch(gqa):
    """Dropout draws a mask the Function could not hold: the call is torch's own, grouped-query heads or not."""
    from hcrfast.bindings.double_backward import _Attention as Lean
    from hcrfast.bindings.double_backward import lean_double_backward

    model = _Attention(dropout_p=0.5, gqa=gqa)
    x = torch.randn(2, 5, 4, requires_grad=True)
    with lean_double_backward():
        assert not type(model(x).grad_fn.next_functions[0][0]).__name__.startswith(Lean.__name__)
        assert type(_Attention()(x).grad_fn.next_functions[0][0]).__name__.startswith(Lean.__name__)


def test_lean_attention_keeps_the_fused_forward_and_a_vjp_in_four_products():
    """The recorded forward is torch's own call (same values, bit for bit); a VJP through the attention runs
    four matrix products, a JVP through the recorded graph as many: no softmax is recomputed per product."""
    from hcrfast.bindings.double_backward import lean_double_backward

    model = _Attention().eval()
    x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(47))
    with torch.no_grad():
        plain = model(x)
    with lean_double_backward():
        lean = model(x.clone().requires_grad_(True))
    torch.testing.assert_close(lean, plain, rtol=0, atol=0)
    op = TorchJacobian(model, x)
    op.matvec(np.zeros((2, op.n_cols), np.float32))
    for call, arg in ((op.rmatvec, np.ones((2, op.n_rows), np.float32)),
                      (op.matvec, np.ones((2, op.n_cols), np.float32))):
        with _AtenCalls() as ops:
            call(arg)
        products = [c for c in ops.calls if c in ("bmm", "mm", "addmm", "matmul")]
        assert "_softmax" not in ops.calls and "_scaled_dot_product_flash_attention_for_cpu" not in ops.calls
        assert products.count("bmm") == 4, ops.calls


# ------------------------------------------------ RNNs: cuDNN's backward refuses eval mode and the double backward


class _Recurrent(torch.nn.Module):
    """An LSTM over the rows of the input, then a GRU, features from both (batch first)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(53)
        self.lstm = torch.nn.LSTM(4, 5, num_layers=2, batch_first=True)
        self.gru = torch.nn.GRU(5, 3, batch_first=True, bidirectional=True)

    def forward(self, x):                                   # (B, T, 4)
        h, _ = self.lstm(x)
        g, _ = self.gru(torch.tanh(h))
        return torch.cat([h[:, -1], g.flatten(1)], dim=1)


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_rnn_calls_go_without_cudnn_in_every_product(mode, monkeypatch):
    """nn.LSTM and nn.GRU call torch.lstm and torch.gru; mode "reverse" (under lean_double_backward), forward
    mode and the dense solve's J (under native_rnn) route each call through _rnn_without_cudnn, which on
    CUDA switches cuDNN off for it (a GPU test runs that); the products still match autograd's Jacobian."""
    import hcrfast.bindings.double_backward as db
    from hcrfast import dense

    calls = []
    real = db._rnn_without_cudnn
    monkeypatch.setattr(db, "_rnn_without_cudnn", lambda func, args, kwargs: calls.append(func.__name__)
                        or real(func, args, kwargs))
    model = _Recurrent().double().eval()
    x = torch.randn(2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(54))
    # torch.func.vmap over examples cannot run nn.LSTM (its zero state has no batch dimension there): autograd's
    J = torch.stack([torch.autograd.functional.jacobian(lambda t: model(t[None])[0], x[b]).reshape(-1, 24)
                     for b in range(2)]).numpy()
    assert not calls
    assert_products_match(TorchJacobian(model, x, mode=mode), J, 55)
    assert calls[:2] == ["lstm", "gru"], calls
    calls.clear()
    np.testing.assert_allclose(dense.jacobian(model, x, mode=mode).numpy(), J, rtol=1e-12, atol=1e-12)
    assert calls[:2] == ["lstm", "gru"], calls


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: what _rnn_without_cudnn reads."""

    @property
    def is_cuda(self):
        return True


@pytest.mark.parametrize("fails", [False, True])
def test_rnn_without_cudnn_switches_only_its_own_call_and_restores_the_flag(fails, monkeypatch):
    from hcrfast.bindings.double_backward import _rnn_without_cudnn

    seen = []

    def call(*args, **kwargs):
        seen.append(torch.backends.cudnn.enabled)
        if fails:
            raise RuntimeError("out of memory")
        return "out"

    monkeypatch.setattr(torch.backends.cudnn, "enabled", True)
    on_cuda = torch.zeros(2).as_subclass(_OnCuda)
    with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
        assert _rnn_without_cudnn(call, (on_cuda, 1), {"batch_first": True}) == "out"
    assert seen == [False] and torch.backends.cudnn.enabled
    _rnn_without_cudnn(call, (torch.zeros(2),), {}) if not fails else None   # a CPU input: the flag as it is
    assert seen == ([False, True] if not fails else [False])
    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)  # off already: left off
    with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
        _rnn_without_cudnn(call, (on_cuda,), {})
    assert seen[-1] is False and not torch.backends.cudnn.enabled


def test_dense_jacobian_of_fused_attention_in_forward_mode_matches_autograd():
    """A self-attention layer with more features than inputs (p = 20 < n = 40): the dense solve's J is built
    in forward mode, which torch's fused CPU attention cannot run; hcrfast's JVPs run it on the MATH backend
    (composite_attention), so J is autograd's and the default bound runs, with the matrix-free one's bounds."""
    import hcrfast
    from hcrfast import dense

    model = _Attention().double().eval()
    x = torch.randn(2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(59))
    assert dense.resolve_jacobian_mode("auto", 40, 20) == "forward"
    with pytest.raises(NotImplementedError, match="forward AD"):  # torch alone
        torch.func.jvp(model, (x,), (x,))
    J, mode = dense.jacobian(model, x, return_mode=True)
    assert mode == "forward"
    want = torch.stack([torch.autograd.functional.jacobian(lambda t: model(t[None]).reshape(-1), x[b]).reshape(40, 20)
                        for b in range(2)])
    np.testing.assert_allclose(J.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
    res = hcrfast.bound(model, x, 0.05, restarts=2, iterations=1, singular_steps=0)
    assert res.params["solver"] == "dense" and res.params["dense"]["jacobian_products"] == 20 + 1
    lsqr = hcrfast.bound(model, x, 0.05, solver="lsqr", lsqr=hcrfast.LSQROptions(atol=1e-12, btol=1e-12),
                         restarts=2, iterations=1)
    np.testing.assert_allclose(res.std, lsqr.std, rtol=1e-5)




def test_composite_attention_restores_both_switches_when_the_jvp_raises():
    """The JVPs switch attention to the MATH backend and the multi-head fast path off, process-wide: both come
    back as they were, also when the model raises inside, and a user's own backend choice around the call
    is what stands after it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hcrfast.bindings import jvp

    def seen(t):
        seen.inside = (torch.backends.mha.get_fastpath_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                       torch.backends.cuda.math_sdp_enabled())
        raise RuntimeError("the model's own error")

    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="the model's own error"):
        jvp(seen, (x,), (x,))
    assert seen.inside == (False, False, True)
    assert torch.backends.mha.get_fastpath_enabled() and torch.backends.cuda.flash_sdp_enabled()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError):
            jvp(seen, (x,), (x,))
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.math_sdp_enabled()
