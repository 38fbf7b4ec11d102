"""The dense solve's factorization: its Gram matrices' eigendecompositions, ``torch.linalg.eigh`` vs
LAPACK on the host a matrix per thread (``hcrfast.kernels.symmetric``), on CPU and GPU.

The race's geometry: 32 examples of the MNIST MLP, each J with ~390 live rows of 784 (the other
features are ReLUs that are off), so 32 Gram matrices of order 390 in float64; and the whole
``dense.min_norm_solver`` around them (live rows, Gram products, pseudo-inverse). On CUDA torch runs
one cuSOLVER call per matrix (PyTorch batches orders ≤ 32 only); "lapack" copies the
Gram matrices to the host and the eigenvectors back; "cusolver" (cusolverDnXsyevBatched) and "cupy"
(CuPy's syevjBatched) decompose the whole batch on the device, and their results are checked there.
The GPU variants also run 1,024 examples, the size of a chunk of the MNIST target.
"""
from __future__ import annotations

import pytest
import torch

from hcrfast import dense
from hcrfast.kernels import symmetric

B, LIVE, P = 32, 390, 784


def _jacobians(device) -> torch.Tensor:
    """(B, 784, 784) float32, rows past ~LIVE zero (dead features), rank LIVE."""
    g = torch.Generator().manual_seed(0)
    J = torch.randn(B, 784, P, generator=g) / P**0.5
    live = torch.randint(LIVE - 10, LIVE + 10, (B,), generator=g)
    J[torch.arange(784)[None, :] >= live[:, None]] = 0.0
    return J.to(device)


def _grams(device) -> torch.Tensor:
    J = _jacobians("cpu")[:, :LIVE].double()
    return (J @ J.transpose(1, 2)).to(device)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _run(benchmark, fn, device, rounds=5, **info):
    fn()   # threads, handles, SciPy's LAPACK loaded
    _sync(device)
    benchmark.extra_info.update({"examples": B, "order": LIVE, **info})
    return benchmark.pedantic(lambda: (fn(), _sync(device)), rounds=rounds, iterations=1, warmup_rounds=0)


@pytest.mark.parametrize("impl", ["torch", "lapack"])
def test_gram_eigh_cpu(benchmark, impl):
    A = _grams("cpu")
    _run(benchmark, lambda: symmetric.eigh_batch(A, impl=impl), "cpu", impl=impl,
         threads=symmetric._workers(LIVE) if impl == "lapack" else torch.get_num_threads())


GPU_IMPLS = ["torch", "lapack", "cusolver", "cupy"]


@pytest.mark.gpu
@pytest.mark.parametrize("examples", [B, 1024])
@pytest.mark.parametrize("impl", GPU_IMPLS)
def test_gram_eigh_gpu(benchmark, cuda_device, impl, examples):
    if impl == "torch" and examples > B:
        pytest.skip("one cuSOLVER call per matrix: ~32 x the 32-matrix time")
    A = _grams(cuda_device).repeat(examples // B, 1, 1)
    # 1,024 matrices: 3 rounds after the first call (the GPU stage has 180 s for ~40 benchmarks)
    _run(benchmark, lambda: symmetric.eigh_batch(A, impl=impl), cuda_device, rounds=5 if examples == B else 3,
         impl=impl, examples=examples)


@pytest.mark.parametrize("impl", ["torch", "lapack"])
def test_min_norm_solver_cpu(benchmark, impl, monkeypatch):
    monkeypatch.setattr(dense, "EIGH_IMPL", impl)
    J = _jacobians("cpu")
    _run(benchmark, lambda: dense.min_norm_solver(J), "cpu", impl=impl)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", GPU_IMPLS)
def test_min_norm_solver_gpu(benchmark, cuda_device, impl, monkeypatch):
    monkeypatch.setattr(dense, "EIGH_IMPL", impl)
    J = _jacobians(cuda_device)
    _run(benchmark, lambda: dense.min_norm_solver(J), cuda_device, impl=impl)
