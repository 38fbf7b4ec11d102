"""Each kernel's NumPy twin vs the best library routine for the same maths.

CPU: ``hcrfast.kernels.twins`` on NumPy vs SciPy/NumPy (``scipy.fft.dctn`` for the
DCT, ``np.linalg.norm`` for row norms, out-of-place broadcasting for the LSQR
update). GPU (skipped without one): the twin on CuPy vs the Numba CUDA kernel
vs CuPy's own routine (``cupyx.scipy.fft.dctn``, ``cupy.linalg.norm``).

Sizes: 800 rows × 784 (32 examples × 25 restarts of the MNIST MLP) for the
vector kernels; the DCT on the same 800 × 1 × 28 × 28 and on 16 × 3 × 91 × 91
(ImageNet inputs), float64 as in the bound.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
from hcrfast.kernels import twins

ROWS, COLS = 800, 784
DCT_SHAPES = {"mnist": (800, 1, 28, 28), "imagenet": (16, 3, 91, 91)}


@pytest.fixture(scope="module")
def vecs():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    x, w, v = (rng.standard_normal((ROWS, COLS)).astype(np.float32) for _ in range(3))
    t1 = rng.standard_normal(ROWS).astype(np.float32)
    t2 = (0.5 * rng.uniform(-1, 1, ROWS)).astype(np.float32)  # |t2| < 1: repeated in-place calls stay bounded
    return a, x, w, v, t1, t2


def _dct_input(name):
    return np.random.default_rng(1).standard_normal(DCT_SHAPES[name])


# The vector kernels' results, checked once before each benchmark times them (a benchmark of a wrong
# kernel must fail, not report a time): against the formulas written out in NumPy on float64 copies of
# the inputs, never against the twin (the thing benchmarked on the CPU, and the GPU's fallback). The
# inputs are float32: tests/test_kernels.py's float32 tolerances (a wrong kernel is off by O(1)).
RTOL, ATOL = 1e-5, 1e-5


def _host(a) -> np.ndarray:
    """A NumPy or CuPy array as a float64 NumPy array."""
    return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)


def _check_row_norms(got, a):
    np.testing.assert_allclose(_host(got), np.linalg.norm(_host(a), axis=1), rtol=RTOL, atol=ATOL,
                               err_msg="row norms")


def _check_normalize_rows(got, a, target):
    scaled, norms = got
    a = _host(a)
    n = np.linalg.norm(a, axis=1)
    np.testing.assert_allclose(_host(norms), n, rtol=RTOL, atol=ATOL, err_msg="norms")
    np.testing.assert_allclose(_host(scaled), a * (target / n)[:, None], rtol=RTOL, atol=ATOL,
                               err_msg="rows rescaled to the target norm")


def _check_lsqr_update_xw(got, x, w, v, t1, t2):
    x, w, v, t1, t2 = (_host(c) for c in (x, w, v, t1, t2))
    np.testing.assert_allclose(_host(got[0]), x + t1[:, None] * w, rtol=RTOL, atol=ATOL, err_msg="x + t1 w")
    np.testing.assert_allclose(_host(got[1]), v + t2[:, None] * w, rtol=RTOL, atol=ATOL, err_msg="v + t2 w")


def _check_restart_update(got, a, w, target):
    z = _host(a) - _host(w)
    n = np.linalg.norm(z, axis=1)
    np.testing.assert_allclose(_host(got[0]), z, rtol=RTOL, atol=ATOL, err_msg="z = a(θ+ε) - a(θ)")
    np.testing.assert_allclose(_host(got[1]), n, rtol=RTOL, atol=ATOL, err_msg="||z||")
    np.testing.assert_allclose(_host(got[2]), z * (_host(target) / n)[:, None], rtol=RTOL, atol=ATOL,
                               err_msg="target z / ||z||")


# ---------------------------------------------------------------- CPU


@pytest.mark.parametrize("shape", list(DCT_SHAPES))
@pytest.mark.parametrize("impl", ["twin", "scipy"])
def test_dct2_cpu(benchmark, shape, impl):
    x = _dct_input(shape)
    fn = (lambda: twins.dct2(x)) if impl == "twin" else (lambda: scipy.fft.dctn(x, axes=(-2, -1), norm="ortho"))
    y = benchmark(fn)
    np.testing.assert_allclose(y, scipy.fft.dctn(x, axes=(-2, -1), norm="ortho"), atol=1e-10)


@pytest.mark.parametrize("impl", ["twin", "numpy"])
def test_row_norms_cpu(benchmark, vecs, impl):
    a = vecs[0]
    fn = (lambda: twins.row_norms(a)) if impl == "twin" else (lambda: np.linalg.norm(a, axis=1))
    _check_row_norms(fn(), a)
    benchmark(fn)


@pytest.mark.parametrize("impl", ["twin", "numpy"])
def test_normalize_rows_cpu(benchmark, vecs, impl):
    a = vecs[0]

    def library():
        n = np.linalg.norm(a, axis=1)
        return a / np.where(n > 0, n, 1)[:, None], n

    fn = (lambda: twins.normalize_rows(a, 1.0)) if impl == "twin" else library
    _check_normalize_rows(fn(), a, 1.0)
    benchmark(fn)


@pytest.mark.parametrize("impl", ["twin", "numpy"])
def test_lsqr_update_xw_cpu(benchmark, vecs, impl):
    def update(x, w, v, t1, t2):
        if impl == "twin":
            return twins.lsqr_update_xw(x, w, v, t1, t2)
        return x + t1[:, None] * w, v + t2[:, None] * w  # the textbook out-of-place form

    _check_lsqr_update_xw(update(*(c.copy() for c in vecs[1:])), *vecs[1:])  # in place: on copies
    _, x, w, v, t1, t2 = (c.copy() for c in vecs)
    benchmark(lambda: update(x, w, v, t1, t2))


@pytest.mark.parametrize("impl", ["twin", "numpy"])
def test_restart_update_cpu(benchmark, vecs, impl):
    a, _, w, *_ = vecs
    target = np.full(ROWS, 0.01, dtype=np.float32)

    def library():
        z = a - w
        n = np.linalg.norm(z, axis=1)
        return z, n, z * (target / n)[:, None]

    fn = (lambda: twins.restart_update(a, w, target)) if impl == "twin" else library
    _check_restart_update(fn(), a, w, target)
    benchmark(fn)


# ---------------------------------------------------------------- GPU


def _cuda_sync():
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def _gpu_bench(benchmark, fn):
    def run():
        out = fn()
        _cuda_sync()
        return out

    return benchmark(run)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(DCT_SHAPES))
@pytest.mark.parametrize("impl", ["twin", "numba", "cupyx"])
def test_dct2_gpu(benchmark, shape, impl):
    import cupy
    import cupyx.scipy.fft

    from hcrfast import kernels

    x = cupy.asarray(_dct_input(shape))
    if impl == "cupyx":
        fn = lambda: cupyx.scipy.fft.dctn(x, axes=(-2, -1), norm="ortho")
    else:
        fn = lambda: kernels.dct2(x, impl=impl)
    y = _gpu_bench(benchmark, fn)
    np.testing.assert_allclose(cupy.asnumpy(y), scipy.fft.dctn(_dct_input(shape), axes=(-2, -1), norm="ortho"), atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["twin", "numba", "cupy"])
def test_row_norms_gpu(benchmark, vecs, impl):
    import cupy

    from hcrfast import kernels

    a = cupy.asarray(vecs[0])
    fn = (lambda: cupy.linalg.norm(a, axis=1)) if impl == "cupy" else (lambda: kernels.row_norms(a, impl=impl))
    _check_row_norms(fn(), vecs[0])
    _gpu_bench(benchmark, fn)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["twin", "numba"])
def test_row_normalize_gpu(benchmark, vecs, impl):
    import cupy

    from hcrfast import kernels

    a = cupy.asarray(vecs[0])
    fn = lambda: kernels.row_normalize(a, 1.0, impl=impl)
    _check_normalize_rows(fn(), vecs[0], 1.0)
    _gpu_bench(benchmark, fn)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["twin", "numba", "cupy"])
def test_lsqr_update_xw_gpu(benchmark, vecs, impl):
    import cupy

    from hcrfast import kernels

    def update(x, w, v, t1, t2):
        if impl == "cupy":
            return x + t1[:, None] * w, v + t2[:, None] * w
        return kernels.lsqr_update_xw(x, w, v, t1, t2, impl=impl)

    _check_lsqr_update_xw(update(*(cupy.asarray(c) for c in vecs[1:])), *vecs[1:])  # in place: on copies
    _, x, w, v, t1, t2 = (cupy.asarray(c) for c in vecs)
    _gpu_bench(benchmark, lambda: update(x, w, v, t1, t2))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["twin", "numba"])
def test_restart_update_gpu(benchmark, vecs, impl):
    import cupy

    from hcrfast import kernels

    a, w = cupy.asarray(vecs[0]), cupy.asarray(vecs[2])
    target = cupy.full(ROWS, 0.01, dtype=cupy.float32)
    fn = lambda: kernels.restart_update(a, w, target, impl=impl)
    _check_restart_update(fn(), vecs[0], vecs[2], target)
    _gpu_bench(benchmark, fn)
