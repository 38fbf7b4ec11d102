"""Batched LSQR (``hcrfast.lsqr``) on dense batches, vs SciPy's LSQR problem by problem.

B = 256 random 784×784 float32 matrices (the MNIST geometry), a fixed number of
iterations (atol = btol = conlim = 0, so no problem stops early): the cost of
the solver's vector work plus 2 dense products per iteration. The SciPy loop
solves the same problems one after another with the same iteration count.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse.linalg as spla

from hcrfast.lsqr import LSQROptions, lsqr
from hcrfast.operators import DenseBatchOperator

B, M, N = 256, 784, 784
ITER_LIM = 20
FIXED = LSQROptions(atol=0.0, btol=0.0, conlim=0.0, iter_lim=ITER_LIM, check_every=8)


@pytest.fixture(scope="module")
def dense_batch():
    rng = np.random.default_rng(0)
    A = (rng.standard_normal((B, M, N), dtype=np.float32) / np.sqrt(N)).astype(np.float32)
    b = rng.standard_normal((B, M), dtype=np.float32)
    return A, b


def test_lsqr_batched_cpu(benchmark, dense_batch):
    A, b = dense_batch
    op = DenseBatchOperator(A)
    res = benchmark.pedantic(lsqr, args=(op, b, FIXED), rounds=3, iterations=1, warmup_rounds=1)
    assert (np.asarray(res.itn) == ITER_LIM).all()
    benchmark.extra_info.update(problems=B, shape=(M, N), iterations=ITER_LIM, dtype="float32")


def test_scipy_lsqr_loop_cpu(benchmark, dense_batch):
    A, b = dense_batch

    def loop():
        return [spla.lsqr(A[k], b[k], atol=0.0, btol=0.0, conlim=0.0, iter_lim=ITER_LIM)[2] for k in range(B)]

    itn = benchmark.pedantic(loop, rounds=3, iterations=1, warmup_rounds=1)
    assert all(i == ITER_LIM for i in itn)
    benchmark.extra_info.update(problems=B, shape=(M, N), iterations=ITER_LIM, dtype="float32")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["twin", "numba"])
def test_lsqr_batched_gpu(benchmark, dense_batch, impl):
    import cupy

    A, b = (cupy.asarray(a) for a in dense_batch)
    op = DenseBatchOperator(A)
    opts = LSQROptions(atol=0.0, btol=0.0, conlim=0.0, iter_lim=ITER_LIM, check_every=8, kernels=impl)

    def run():
        res = lsqr(op, b, opts)
        cupy.cuda.get_current_stream().synchronize()
        return res

    res = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    assert (cupy.asnumpy(res.itn) == ITER_LIM).all()
    benchmark.extra_info.update(problems=B, shape=(M, N), iterations=ITER_LIM, dtype="float32", kernels=impl)


class Diagonal:
    """A_k = diag(d) for every problem, d spread over [0.5, 2]: a product costs one pass, so the
    time is LSQR's own vector work, and 784 distinct values keep every problem iterating."""

    def __init__(self, batch, d):
        self.batch, self.n_rows, self.n_cols, self.d = batch, d.shape[-1], d.shape[-1], d

    def matvec(self, v):
        return self.d * v

    def rmatvec(self, u):
        return self.d * u

    def take(self, rows):
        return Diagonal(len(rows), self.d)


# Rows of the vector-work benchmarks: 32 examples x 25 restarts on the CPU; on the GPU, 1,000
# examples x 25 restarts (the 10,000-example MNIST run is ten times this per vector).
VECTOR_ROWS = {"cpu": 800, "gpu": 25_000}


def _vector_work(xp, rows, impl, sync=lambda: None):
    b = xp.asarray(np.random.default_rng(1).standard_normal((rows, M), dtype=np.float32))
    opts = LSQROptions(atol=0.0, btol=0.0, conlim=0.0, iter_lim=ITER_LIM, check_every=8, kernels=impl)
    op = Diagonal(rows, xp.asarray(np.linspace(0.5, 2.0, M, dtype=np.float32)))

    def run():
        res = lsqr(op, b, opts)
        sync()
        return res

    return run


def test_lsqr_vector_work_cpu(benchmark):
    run = _vector_work(np, VECTOR_ROWS["cpu"], "auto")
    res = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    assert (np.asarray(res.itn) == ITER_LIM).all()
    benchmark.extra_info.update(problems=VECTOR_ROWS["cpu"], n=M, iterations=ITER_LIM, dtype="float32",
                                note="time / iterations = LSQR vector work per step (products are one pass each)")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["twin", "numba"])
def test_lsqr_vector_work_gpu(benchmark, impl):
    import cupy

    run = _vector_work(cupy, VECTOR_ROWS["gpu"], impl, cupy.cuda.get_current_stream().synchronize)
    res = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    assert (cupy.asnumpy(res.itn) == ITER_LIM).all()
    benchmark.extra_info.update(problems=VECTOR_ROWS["gpu"], n=M, iterations=ITER_LIM, dtype="float32", kernels=impl)
