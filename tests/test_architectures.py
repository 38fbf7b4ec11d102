"""The Jacobian products across torchvision's architecture families, against torch.func.

One small input per family (random weights, eval mode, float32), chosen so that each family brings its own
operations to the lean double backward (``bindings/double_backward.py``) and to forward mode: squeeze-and-
excitation with hardsigmoid (MobileNetV3), SiLU and stochastic depth (EfficientNet), 2-D layer norm and
layer scale (ConvNeXt), concatenations (DenseNet), channel shuffles (ShuffleNet), windowed attention with a
relative-position bias, shifts and padding (Swin), a class token and position embeddings with the multi-head
fast path (ViT), grouped convolutions (RegNet, ResNeXt), 3-D convolutions (R3D), dilations and bilinear
upsampling (DeepLabV3), and the plain ResNet.

The oracle is torch.func (``jvp`` for J v, ``vjp`` for Jᵀ u), run by this file on the same float32 model with
attention on the MATH backend and the multi-head fast path off, the switches forward-mode AD needs and
nothing of hcrfast's. Each mode of ``TorchJacobian`` must give its products to float32 rounding (a relative
error of 1e-4 of the largest entry; the sweep that chose this list found at most 2.6e-6 across torchvision's
classification, segmentation and video models). Mode "reverse" without the lean graph, where torch can run it,
is compared too: the lean graph must not change what torch's own graph computes.
"""

import numpy as np
import pytest
import torch
import torchvision.models as tvm

import hcrfast.bindings.jacobian as jac
from hcrfast.bindings import TorchJacobian


class _SegmentationOut(torch.nn.Module):
    """torchvision's segmentation models return a dict; hcrfast takes the tensor of features."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def _vit():
    model = tvm.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                  mlp_dim=64, num_classes=10)
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts the head at 0: J = 0
    return model


#: (name, builder, input shape, whether torch's own graph has a double backward for it)
ARCHITECTURES = [
    ("resnet18", lambda: tvm.resnet18(num_classes=10), (3, 32, 32), True),
    ("mobilenet_v3_small", lambda: tvm.mobilenet_v3_small(num_classes=10), (3, 32, 32), False),  # hardsigmoid
    ("efficientnet_b0", lambda: tvm.efficientnet_b0(num_classes=10), (3, 32, 32), True),
    ("convnext_tiny", lambda: tvm.convnext_tiny(num_classes=10), (3, 32, 32), True),
    ("densenet121", lambda: tvm.densenet121(num_classes=10), (3, 32, 32), True),
    ("shufflenet_v2_x0_5", lambda: tvm.shufflenet_v2_x0_5(num_classes=10), (3, 32, 32), True),
    ("regnet_y_400mf", lambda: tvm.regnet_y_400mf(num_classes=10), (3, 32, 32), True),
    ("resnext50_32x4d", lambda: tvm.resnext50_32x4d(num_classes=10), (3, 32, 32), True),
    ("swin_t", lambda: tvm.swin_t(num_classes=10), (3, 64, 64), True),        # attention in matmuls
    ("vit", _vit, (3, 32, 32), False),                                          # fused attention, fast path
    ("r3d_18", lambda: tvm.video.r3d_18(num_classes=10), (3, 4, 32, 32), True),
    ("deeplabv3_mobilenet_v3_large", lambda: _SegmentationOut(tvm.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3)), (3, 32, 32), False),
]


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    scale = np.abs(want).max()
    assert scale > 0, f"{what}: the oracle's product is 0 (a model whose J vanishes tests nothing)"
    err = np.abs(got - want).max() / scale
    assert err < 1e-4, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("name,build,shape,torch_graph", ARCHITECTURES, ids=[a[0] for a in ARCHITECTURES])
def test_products_match_torch_func_across_architectures(name, build, shape, torch_graph, monkeypatch):
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn((2,) + shape, generator=torch.Generator().manual_seed(1))
    p = int(np.prod(shape))
    rng = np.random.default_rng(2)
    v = rng.standard_normal((2, p)).astype(np.float32)

    def f(t):
        return model(t).reshape(t.shape[0], -1)

    # the oracle is torch.func.jvp; hcrfast's switches (MATH attention, no multi-head fast path) only let it run
    with torch.no_grad(), jac.composite_attention():
        _, want_jv = torch.func.jvp(f, (x,), (torch.from_numpy(v).reshape(x.shape),))
    u = rng.standard_normal(tuple(want_jv.shape)).astype(np.float32)
    _, pullback = torch.func.vjp(f, x)
    (want_jtu,) = pullback(torch.from_numpy(u))
    want_jv, want_jtu = want_jv.numpy(), want_jtu.reshape(2, p).detach().numpy()

    for mode in ("reverse", "forward"):
        op = TorchJacobian(model, x, mode=mode)
        _close(op.matvec(v), want_jv, f"{name}, mode {mode}, J v")
        _close(op.rmatvec(u), want_jtu, f"{name}, mode {mode}, J^T u")
    assert torch.backends.mha.get_fastpath_enabled() and torch.backends.cuda.flash_sdp_enabled()

    monkeypatch.setattr(jac, "LEAN_DOUBLE_BACKWARD", False)
    if torch_graph:
        _close(TorchJacobian(model, x).matvec(v), want_jv, f"{name}, torch's graph, J v")
    else:  # the case the lean graph exists for: torch cannot differentiate it twice
        with pytest.raises(RuntimeError):
            TorchJacobian(model, x).matvec(v)
