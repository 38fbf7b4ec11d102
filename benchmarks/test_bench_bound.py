"""``hcrfast.bound`` end to end on the experiments' models (``hcrfast.zoo``, random weights).

CPU sizes are small so that the suite runs in minutes on a laptop: the MNIST
MLP with 4 examples × 4 restarts × 2 outer iterations and the default LSQR;
the CIFAR CNN, ResNet-18 and Swin-T (3×91×91 inputs upsampled to 224) with
2 examples × 2 restarts × 1 iteration and ``iter_lim = 10``; the dense solve
(``solver="dense"``, which ignores the LSQR options) on MNIST and CIFAR at the
published R and i, since its cost hardly depends on them. GPU variants at
larger sizes are skipped without a GPU. Inputs are uniform random images in
[0, 1], normalized by each model's own ``normalize``; σ = ``sigma_scale`` × RMS.
One round each: a call is seconds to minutes, so the spread of a round is small
next to its length (and the load of a shared machine dominates anyway).
"""
from __future__ import annotations

import pytest
import torch

import hcrfast
from hcrfast.zoo import build

_MODELS = {}

# name: (examples, restarts, iterations, iter_lim) on CPU and on GPU
CPU_SIZES = {
    "mnist": (4, 4, 2, None),
    "cifar10": (2, 2, 1, 10),
    "resnet18": (2, 2, 1, 10),
    "swin_t": (2, 2, 1, 10),
}
GPU_SIZES = {
    "mnist": (256, 25, 10, None),
    "cifar10": (64, 25, 6, None),
    "resnet18": (16, 4, 2, 40),
    "swin_t": (16, 4, 2, 40),
}


def _model(name):
    if name not in _MODELS:
        _MODELS[name] = build(name, seed=0)
    return _MODELS[name]


def _problem(name, examples, device):
    zm = _model(name)
    g = torch.Generator().manual_seed(0)
    x = zm.normalize(torch.rand((examples,) + tuple(zm.input_shape), generator=g)).to(device)
    model = zm.features.eval().to(device)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), zm.sigma_scale)
    return zm, model, x, sigma


def _run(benchmark, name, sizes, device, solver="lsqr"):
    examples, restarts, iterations, iter_lim = sizes[name]
    zm, model, x, sigma = _problem(name, examples, device)
    opts = hcrfast.DEFAULT_LSQR if iter_lim is None else hcrfast.LSQROptions(
        atol=hcrfast.DEFAULT_LSQR.atol, btol=hcrfast.DEFAULT_LSQR.btol, iter_lim=iter_lim)
    if solver == "dense":   # it runs no LSQR: options given would go unused, and bound() warns of each call
        opts = None

    def call():
        res = hcrfast.bound(model, x, sigma, size=zm.size, iterations=iterations, restarts=restarts, lsqr=opts,
                            solver=solver)
        if device == "cuda":
            torch.cuda.synchronize()
        return res

    res = benchmark.pedantic(call, rounds=1, iterations=1, warmup_rounds=0)
    assert res.std.shape == x.shape
    benchmark.extra_info.update(model=name, examples=examples, restarts=restarts, iterations=iterations,
                                iter_lim=iter_lim, device=device, solver=solver,
                                lsqr_iterations_total=int(res.to_numpy().lsqr_iterations.sum()))


@pytest.mark.parametrize("name", [
    "mnist", "cifar10",
    pytest.param("resnet18", marks=pytest.mark.slow),
    pytest.param("swin_t", marks=pytest.mark.slow),
])
def test_bound_cpu(benchmark, name):
    _run(benchmark, name, CPU_SIZES, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_SIZES))
def test_bound_gpu(benchmark, name):
    _run(benchmark, name, GPU_SIZES, "cuda")


# The dense solve: J and its factorization once per example, then R × i exact steps.
DENSE_SIZES = {"mnist": (32, 25, 10, None), "cifar10": (2, 25, 6, None)}


@pytest.mark.parametrize("name", ["mnist", pytest.param("cifar10", marks=pytest.mark.slow)])
def test_bound_dense_cpu(benchmark, name):
    _run(benchmark, name, DENSE_SIZES, "cpu", solver="dense")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(DENSE_SIZES))
def test_bound_dense_gpu(benchmark, name):
    _run(benchmark, name, {"mnist": (1000, 25, 10, None), "cifar10": (64, 25, 6, None)}, "cuda", solver="dense")
