"""Bridge overhead: ``TorchJacobian.matvec/rmatvec`` vs the same torch calls on tensors.

Each pair runs the same autograd work on the same data: the "plain" side calls
torch directly on tensors (for mode "reverse" on the operator's own recorded
graph), the "bridge" side goes through the operator with NumPy arrays in and
out (``torch.from_numpy`` / ``.numpy()`` views, reshapes, NVTX ranges). The
difference is what hcrfast adds per product. Rows: 8 (fixed costs dominate)
and 800 (32 examples × 25 restarts, the race's size).
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hcrfast.bindings import TorchJacobian
from torch.func import jvp, vjp

from hcrfast.zoo import build

ROWS = (8, 800)


@pytest.fixture(scope="module")
def mlp():
    return build("mnist", seed=0).features.eval()


def _setup(mlp, rows, mode):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, 28, 28, generator=g)
    op = TorchJacobian(mlp, x, mode=mode)
    v = np.random.default_rng(rows).standard_normal((rows, 784)).astype(np.float32)
    u = np.random.default_rng(rows + 1).standard_normal((rows, op.n_rows)).astype(np.float32)
    return x, op, v, u


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("mode", ["reverse", "forward"])
@pytest.mark.parametrize("side", ["bridge", "plain"])
def test_jvp(benchmark, mlp, rows, mode, side):
    x, op, v, _ = _setup(mlp, rows, mode)
    if side == "bridge":
        op.matvec(v)  # record the graph outside the timing, as in a solve
        fn = lambda: op.matvec(v)
    elif mode == "reverse":
        _, _, d, jtd = op._recorded()
        t = torch.from_numpy(v).reshape(x.shape)
        fn = lambda: torch.autograd.grad(jtd, d, t, retain_graph=True)[0]
    else:
        t = torch.from_numpy(v).reshape(x.shape)
        f = lambda y: mlp(y).reshape(y.shape[0], -1)

        def fn():
            with torch.no_grad():
                return jvp(f, (x,), (t,))[1]
    out = benchmark(fn)
    assert tuple(out.shape) == (rows, 784)
    benchmark.extra_info.update(rows=rows, mode=mode, side=side)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("mode", ["reverse", "forward"])
@pytest.mark.parametrize("side", ["bridge", "plain"])
def test_vjp(benchmark, mlp, rows, mode, side):
    x, op, _, u = _setup(mlp, rows, mode)
    if side == "bridge":
        op.rmatvec(u)  # record the graph / vjp function outside the timing, as in a solve
        fn = lambda: op.rmatvec(u)
    elif mode == "reverse":
        xg, out, _, _ = op._recorded()
        c = torch.from_numpy(u)
        fn = lambda: torch.autograd.grad(out, xg, c, retain_graph=True)[0]
    else:
        with torch.no_grad():
            _, vjp_fn = vjp(lambda y: mlp(y).reshape(y.shape[0], -1), x)
        c = torch.from_numpy(u)

        def fn():
            with torch.no_grad():
                return vjp_fn(c)[0]
    out = benchmark(fn)
    assert out.shape[0] == rows
    benchmark.extra_info.update(rows=rows, mode=mode, side=side)


# ---------------------------------------------------------------- GPU: the DLPack bridge


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("product", ["jvp", "vjp"])
@pytest.mark.parametrize("side", ["bridge", "plain"])
def test_product_gpu(benchmark, mlp, rows, product, side):
    """Mode "reverse" on CUDA: CuPy arrays through ``TorchJacobian`` (DLPack both ways, on the
    solver stream) vs the same autograd call on tensors; each round ends with a device sync."""
    import copy

    import cupy

    from hcrfast.bindings import solver_stream

    model = copy.deepcopy(mlp).cuda()
    x, _, v, u = _setup(mlp, rows, "reverse")
    x = x.cuda()
    with solver_stream(x.device):
        op = TorchJacobian(model, x, mode="reverse")
        arr = cupy.asarray(v if product == "jvp" else u)
        if side == "bridge":
            call = op.matvec if product == "jvp" else op.rmatvec
            call(arr)  # record the graph outside the timing
            fn = lambda: call(arr)
        else:
            xg, out, d, jtd = op._recorded()
            t = torch.from_dlpack(arr)
            fn = ((lambda: torch.autograd.grad(jtd, d, t.reshape(x.shape), retain_graph=True)[0])
                  if product == "jvp" else (lambda: torch.autograd.grad(out, xg, t, retain_graph=True)[0]))

        def timed():
            res = fn()
            torch.cuda.synchronize()
            return res

        res = benchmark(timed)
    assert res.shape[0] == rows
    benchmark.extra_info.update(rows=rows, product=product, side=side, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("allocator", ["torch", "cupy"])
def test_allocation_gpu(benchmark, allocator, monkeypatch):
    """What one CuPy allocation costs on the host in the solver's block: a block of torch's caching
    allocator (hcrfast's default, a Python call per allocation) vs CuPy's own pool. 64 arrays of
    800 × 784 float32 (one LSQR iteration's vectors at the race's size) made and dropped per round."""
    import cupy

    from hcrfast.bindings import solver_stream

    monkeypatch.setenv("HCRFAST_CUPY_ALLOCATOR", allocator)
    with solver_stream(torch.device("cuda")):
        def churn():
            arrays = [cupy.empty((800, 784), dtype=cupy.float32) for _ in range(64)]
            return len(arrays)

        churn()  # both pools warm
        assert benchmark(churn) == 64
    benchmark.extra_info.update(allocator=allocator, arrays=64, device="cuda")


# ---------------------------------------------------------------- ResNet-18, Swin-T: JVP by double VJP vs forward mode

# "reverse": the double VJP recorded under lean_double_backward (the default); "reverse-torch": torch's
# own graph, whose double backward of a convolution also runs its weight gradient (the first H100 run's
# 44.1 s of JVPs against 12.4 s of VJPs); "forward": torch.func.jvp, which recomputes the forward pass.
# A VJP under the lean graph is a transposed convolution per layer where torch's is a convolution
# backward for the input: the same work, timed both ways to show it.
RESNET_MODES = ["reverse", "reverse-torch", "forward"]
# ViT-B/16: torch's fused attention has no double backward and no forward AD, so torch's graph
# ("reverse-math") and forward mode run under the MATH backend; "reverse" keeps the fused forward.
VIT_MODES = ["reverse", "reverse-math", "forward-math"]


def _vit_b_16():
    """torchvision's ViT-B/16 with random weights (no download), its zero-initialized head drawn at random
    (else J = 0): the attention model of the suites, at its own 224 × 224."""
    from torchvision.models import vit_b_16

    torch.manual_seed(0)
    model = vit_b_16()
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def _zoo_products(benchmark, monkeypatch, rows, mode, product, device, name="resnet18"):
    import hcrfast.bindings.jacobian as jac
    from torch.nn.attention import SDPBackend, sdpa_kernel

    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", mode not in ("reverse-torch", "reverse-math"))
    math_backend = sdpa_kernel(SDPBackend.MATH) if mode.endswith("-math") else contextlib.nullcontext()
    if mode == "forward-math":  # nn.MultiheadAttention's fast path has no forward AD either: off for the test
        monkeypatch.setattr(torch.backends.mha, "get_fastpath_enabled", lambda: False)
    model = (_vit_b_16() if name == "vit_b_16" else build(name, seed=0).features).eval().to(device)
    size = 224 if name == "vit_b_16" else 91
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 3, size, size, generator=g).to(device)
    if device == "cuda":
        import cupy

        from hcrfast.bindings import solver_stream
        to_array, sync, stream = cupy.asarray, torch.cuda.synchronize, solver_stream(x.device)
    else:
        to_array, sync, stream = (lambda a: a), (lambda: None), contextlib.nullcontext()
    with stream, math_backend:
        op = TorchJacobian(model, x, mode=mode.split("-")[0])
        cols = op.n_cols if product == "jvp" else op.n_rows
        arr = to_array(np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32))
        call = op.matvec if product == "jvp" else op.rmatvec
        saved = {}  # the activations the recorded graph keeps (mode "reverse"), by storage: not the weights
        weights = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}

        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        counting = (torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if not mode.startswith("forward")
                    else contextlib.nullcontext())  # torch.func's vjp refuses the hooks
        with counting:
            call(arr)  # the recorded graph / vjp function, outside the timing

        def timed():
            res = call(arr)
            sync()
            return res

        res = benchmark.pedantic(timed, rounds=5, iterations=1, warmup_rounds=1)
    assert res.shape[0] == rows
    benchmark.extra_info.update(rows=rows, mode=mode, product=product, device=device, model=name,
                                saved_mib_per_row=sum(saved.values()) / rows / 2**20 if not mode.startswith("forward") else None)


@pytest.mark.gpu
@pytest.mark.parametrize("name,rows", [("resnet18", 8), ("resnet18", 32), ("swin_t", 8)])
@pytest.mark.parametrize("mode", RESNET_MODES)
@pytest.mark.parametrize("product", ["jvp", "vjp"])
def test_zoo_product_gpu(benchmark, monkeypatch, name, rows, mode, product):
    """The ResNet-18 target's products (3 × 91 × 91 inputs, 25,088 features) through ``TorchJacobian``
    on CUDA, each round ending with a device sync, and Swin-T's (its layer norms: fewer kernels in the
    lean graph's JVP, a Python autograd node each in its VJP)."""
    _zoo_products(benchmark, monkeypatch, rows, mode, product, "cuda", name)


# On the CPU each of these builds an ImageNet model and times its products (seconds a round): "slow", so
# that `-m "not slow"` runs without them, as test_bench_bound.py's ResNet-18 and Swin-T.
@pytest.mark.parametrize("name", [pytest.param("resnet18", marks=pytest.mark.slow),
                                  pytest.param("swin_t", marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", RESNET_MODES)
@pytest.mark.parametrize("product", ["jvp", "vjp"])
def test_zoo_product_cpu(benchmark, monkeypatch, name, mode, product):
    """The same on the CPU, 2 rows, and Swin-T's (one convolution, layer norms: a smaller gain)."""
    _zoo_products(benchmark, monkeypatch, 2, mode, product, "cpu", name)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", VIT_MODES)
@pytest.mark.parametrize("product", ["jvp", "vjp"])
def test_attention_product_gpu(benchmark, monkeypatch, mode, product):
    """ViT-B/16's products, 8 rows on CUDA: the lean graph's attention (torch's fused kernel forward, a
    backward in four matrix products) against the MATH backend's graph and forward mode."""
    _zoo_products(benchmark, monkeypatch, 8, mode, product, "cuda", "vit_b_16")


@pytest.mark.slow  # ViT-B/16 at 224 x 224 on the CPU, every parametrization
@pytest.mark.parametrize("mode", VIT_MODES)
@pytest.mark.parametrize("product", ["jvp", "vjp"])
def test_attention_product_cpu(benchmark, monkeypatch, mode, product):
    """The same on the CPU, 2 rows."""
    _zoo_products(benchmark, monkeypatch, 2, mode, product, "cpu", "vit_b_16")
