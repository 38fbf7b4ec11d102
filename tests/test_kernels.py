"""The NumPy twins of the kernels against oracles no one here wrote.

``scipy.fft.dctn``/``idctn`` (norm="ortho") for the DCT, ``np.linalg.norm`` for
the row norms, and plain per-problem loops for the LSQR and restart updates.
Also the dispatch layer in :mod:`hcrfast.kernels` on NumPy inputs.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.fft
import torch

from hcrfast import kernels
from hcrfast.kernels import twins

SEED = 20240611

# float64 against a float64 oracle; float32 against the float64 oracle of the same (rounded) input
TOL = {
    np.float64: {"rtol": 1e-12, "atol": 1e-12},
    np.float32: {"rtol": 1e-5, "atol": 1e-5},
}

DCT_SHAPES = [(4, 1, 28, 28), (4, 3, 32, 32), (2, 3, 91, 91), (5, 224, 224), (2, 3, 7, 13)]


def _normal(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------
# DCT
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", DCT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_dct2_matches_scipy_dctn(shape, dtype):
    x = _normal(shape, dtype, SEED)
    y = twins.dct2(x)
    assert y.shape == x.shape and y.dtype == dtype
    expected = scipy.fft.dctn(x.astype(np.float64), axes=(-2, -1), norm="ortho")
    np.testing.assert_allclose(y, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", DCT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_idct2_matches_scipy_idctn_and_inverts_dct2(shape, dtype):
    y = _normal(shape, dtype, SEED + 1)
    x = twins.idct2(y)
    assert x.shape == y.shape and x.dtype == dtype
    expected = scipy.fft.idctn(y.astype(np.float64), axes=(-2, -1), norm="ortho")
    np.testing.assert_allclose(x, expected, **TOL[dtype])
    np.testing.assert_allclose(twins.dct2(x), y, **TOL[dtype])
    np.testing.assert_allclose(twins.idct2(twins.dct2(y)), y, **TOL[dtype])


def test_dct2_of_a_single_image_without_leading_axes():
    x = _normal((7, 13), np.float64, SEED + 2)
    np.testing.assert_allclose(twins.dct2(x), scipy.fft.dctn(x, norm="ortho"), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(twins.idct2(x), scipy.fft.idctn(x, norm="ortho"), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 7, 13, 28, 32, 91, 224])
def test_dct_matrix_is_scipy_dct_and_orthonormal(n):
    c = twins.dct_matrix(n)
    # column j of C is the DCT of the unit vector e_j
    np.testing.assert_allclose(c, scipy.fft.dct(np.eye(n), norm="ortho", axis=0), rtol=0, atol=1e-13)
    np.testing.assert_allclose(c @ c.T, np.eye(n), rtol=0, atol=1e-13)
    np.testing.assert_allclose(c.T @ c, np.eye(n), rtol=0, atol=1e-13)
    c32 = twins.dct_matrix(n, dtype=np.float32)
    assert c32.dtype == np.float32
    np.testing.assert_allclose(c32, c, rtol=0, atol=1e-7)


@pytest.mark.parametrize("shape", [(3, 1, 28, 28), (2, 3, 91, 91), (2, 3, 7, 13)], ids=str)
def test_dct2_preserves_norms(shape):
    x = _normal(shape, np.float64, SEED + 3)
    y = twins.dct2(x)
    np.testing.assert_allclose(np.linalg.norm(y, axis=(-2, -1)), np.linalg.norm(x, axis=(-2, -1)), rtol=1e-12)
    # inner products too (C is orthogonal, not merely norm-preserving on these draws)
    z = _normal(shape, np.float64, SEED + 4)
    np.testing.assert_allclose(np.sum(y * twins.dct2(z)), np.sum(x * z), rtol=1e-10)


# ---------------------------------------------------------------------------
# Row norms and normalization
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(5,), (4, 37), (3, 2, 3, 5), (2, 1, 28, 28)], ids=str)
def test_row_norms_match_linalg_norm(shape, dtype):
    a = _normal(shape, dtype, SEED + 5)
    norms = twins.row_norms(a)
    assert norms.shape == (shape[0],) and norms.dtype == dtype
    expected = np.linalg.norm(a.astype(np.float64).reshape(shape[0], -1), axis=1)
    np.testing.assert_allclose(norms, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("target", [1.0, 2.5, "per-row"])
def test_normalize_rows_hits_targets(target, dtype):
    a = _normal((4, 3, 5), dtype, SEED + 6)
    if target == "per-row":
        target = np.random.default_rng(SEED + 7).uniform(0.1, 10.0, size=4)
    scaled, norms = twins.normalize_rows(a, target)
    assert scaled.shape == a.shape and scaled.dtype == dtype and norms.dtype == dtype
    np.testing.assert_allclose(norms, np.linalg.norm(a.reshape(4, -1), axis=1), **TOL[dtype])
    np.testing.assert_allclose(np.linalg.norm(scaled.reshape(4, -1), axis=1),
                               np.broadcast_to(target, (4,)), rtol=TOL[dtype]["rtol"])
    # a positive rescaling of each row: same direction
    scale = np.broadcast_to(target, (4,)) / np.linalg.norm(a.astype(np.float64).reshape(4, -1), axis=1)
    expected = a.astype(np.float64) * scale[:, None, None]
    np.testing.assert_allclose(scaled, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_normalize_rows_keeps_zero_rows_zero_without_warnings(dtype):
    a = _normal((4, 37), dtype, SEED + 8)
    a[[1, 3]] = 0
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        scaled, norms = twins.normalize_rows(a, np.array([1.0, 2.0, 3.0, 4.0]))
        scaled_scalar, _ = twins.normalize_rows(a, 1.0)
        all_zero, all_zero_norms = twins.normalize_rows(np.zeros((3, 5), dtype))
    for out in (scaled, scaled_scalar):
        assert np.all(out[[1, 3]] == 0)
        assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(norms[[1, 3]], 0)
    np.testing.assert_allclose(np.linalg.norm(scaled[[0, 2]], axis=1), [1.0, 3.0], rtol=TOL[dtype]["rtol"])
    np.testing.assert_array_equal(all_zero, 0)
    np.testing.assert_array_equal(all_zero_norms, 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("where", ["in place", "separate"])
def test_normalize_rows_into_out(where, dtype):
    a = _normal((5, 2, 7), dtype, SEED + 10)
    a[2] = 0
    original = a.copy()
    out = a if where == "in place" else np.full_like(a, np.nan)
    scaled, norms = twins.normalize_rows(a, 2.0, out=out)
    assert scaled is out
    flat = original.astype(np.float64).reshape(5, -1)
    n = np.linalg.norm(flat, axis=1)
    np.testing.assert_allclose(norms, n, **TOL[dtype])
    expected = np.where(n[:, None] > 0, 2.0 * flat / np.where(n > 0, n, 1)[:, None], 0.0)
    np.testing.assert_allclose(scaled.reshape(5, -1), expected, **TOL[dtype])
    if where == "separate":
        np.testing.assert_array_equal(a, original)


def test_normalize_rows_to_target_zero_gives_zeros():
    a = _normal((3, 4), np.float64, SEED + 9)
    scaled, _ = twins.normalize_rows(a, 0.0)
    np.testing.assert_array_equal(scaled, 0)


# ---------------------------------------------------------------------------
# LSQR and restart updates
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(5, 37), (3, 2, 3, 5)], ids=str)
def test_lsqr_update_xw_matches_a_loop_per_problem(shape, dtype):
    rng = np.random.default_rng(SEED + 10)
    x, w, v = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    t1, t2 = rng.standard_normal(shape[0]), rng.standard_normal(shape[0])
    t1[1], t2[1], v[1] = 0.0, 1.0, 0.0  # a frozen problem, as the batched LSQR passes it
    expected_x, expected_w = x.astype(np.float64), w.astype(np.float64)
    for b in range(shape[0]):
        expected_x[b] = x[b] + t1[b] * w[b]
        expected_w[b] = v[b] + t2[b] * w[b]
    x_in, w_in = x.copy(), w.copy()
    x_out, w_out = twins.lsqr_update_xw(x_in, w_in, v, t1, t2)
    assert x_out is x_in and w_out is w_in  # in place
    assert x_out.dtype == dtype and w_out.dtype == dtype
    np.testing.assert_allclose(x_out, expected_x, **TOL[dtype])
    np.testing.assert_allclose(w_out, expected_w, **TOL[dtype])
    np.testing.assert_array_equal(x_out[1], x[1])
    np.testing.assert_array_equal(w_out[1], w[1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("target", [1.0, "per-row"])
def test_restart_update_matches_direct_computation(target, dtype):
    rng = np.random.default_rng(SEED + 11)
    f0 = rng.standard_normal((4, 3, 5)).astype(dtype)
    fp = (f0 + 1e-2 * rng.standard_normal((4, 3, 5))).astype(dtype)
    fp[2] = f0[2]  # no change in problem 2: z = 0
    if target == "per-row":
        target = rng.uniform(0.5, 2.0, size=4)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        z, znorm, ztilde = twins.restart_update(fp, f0, target)
    expected_z = fp - f0
    expected_norm = np.linalg.norm(expected_z.astype(np.float64).reshape(4, -1), axis=1)
    t = np.broadcast_to(target, (4,))
    expected_tilde = np.zeros((4, 3, 5))
    for b in range(4):
        if expected_norm[b] > 0:
            expected_tilde[b] = t[b] * expected_z[b] / expected_norm[b]
    np.testing.assert_array_equal(z, expected_z)
    assert z.dtype == znorm.dtype == ztilde.dtype == dtype
    np.testing.assert_allclose(znorm, expected_norm, rtol=TOL[dtype]["rtol"], atol=0)
    np.testing.assert_allclose(ztilde, expected_tilde, **TOL[dtype])
    assert np.all(ztilde[2] == 0) and znorm[2] == 0


# ---------------------------------------------------------------------------
# Dispatch layer (NumPy inputs always run the twins)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("impl", kernels.IMPLS)
def test_dispatch_runs_the_twins_on_numpy(impl):
    rng = np.random.default_rng(SEED + 12)
    a = rng.standard_normal((3, 4, 5))
    target = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(kernels.row_norms(a, impl=impl), twins.row_norms(a))
    for got, want in zip(kernels.row_normalize(a, target, impl=impl), twins.normalize_rows(a, target)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(kernels.restart_update(a, 0.5 * a, 2.0, impl=impl), twins.restart_update(a, 0.5 * a, 2.0)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(kernels.dct2(a, impl=impl), twins.dct2(a))
    np.testing.assert_array_equal(kernels.idct2(a, impl=impl), twins.idct2(a))
    x, w, v = a.copy(), 2 * a, 3 * a
    x_twin, w_twin = twins.lsqr_update_xw(a.copy(), 2 * a, v, target, target)
    x_out, w_out = kernels.lsqr_update_xw(x, w, v, target, target, impl=impl)
    assert x_out is x and w_out is w
    np.testing.assert_array_equal(x, x_twin)
    np.testing.assert_array_equal(w, w_twin)


@pytest.mark.parametrize("impl", kernels.IMPLS)
@pytest.mark.parametrize("where", ["in place", "separate"])
def test_dispatch_row_normalize_writes_into_out(impl, where):
    """kernels.row_normalize(..., out=) fills ``out`` (LSQR passes out=u to normalize in place)."""
    a = _normal((4, 3, 5), np.float64, SEED + 13)
    a[1] = 0
    flat = a.reshape(4, -1).copy()
    n = np.linalg.norm(flat, axis=1)
    expected = np.where(n[:, None] > 0, 2.0 * flat / np.where(n > 0, n, 1)[:, None], 0.0).reshape(a.shape)
    out = a if where == "in place" else np.full_like(a, np.nan)
    scaled, norms = kernels.row_normalize(a, 2.0, out=out, impl=impl)
    assert scaled is out
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(norms, n, rtol=1e-12)


def test_dispatch_rejects_unknown_impl():
    with pytest.raises(ValueError, match="impl must be one of"):
        kernels.dct2(np.zeros((2, 2)), impl="cuda")


def test_importing_kernels_needs_no_numba_cuda():
    code = (
        "import sys, hcrfast.kernels, hcrfast.kernels.cuda\n"
        "loaded = [m for m in ('numba.cuda', 'cupy') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("grid", [4, (16, 7), (8, 16), 200, 4096])
def test_launches_turn_off_numbas_low_occupancy_warning_for_that_moment_only(grid):
    """Every launch (one block a row of a small batch is no mistake; the warning's threshold is 128 blocks
    in some numba-cuda releases, twice the SMs, 264 on an H100, in others) is configured with Numba's own
    warning switch off, then the switch is put back; the warnings module is left alone, so a user's
    warning shown once is not shown again after each launch."""
    from hcrfast.kernels import cuda as cuda_kernels

    config = cuda_kernels._numba_config()
    seen = []

    class Kernel:  # what numba's dispatcher reads when a launch is configured
        def __getitem__(self, launch):
            seen.append(config.CUDA_LOW_OCCUPANCY_WARNINGS)
            return lambda *args: None

    saved = getattr(config, "CUDA_LOW_OCCUPANCY_WARNINGS", 1)
    config.CUDA_LOW_OCCUPANCY_WARNINGS = 1
    try:
        def shout():  # one place in the code: "default" shows its warning there once
            warnings.warn("shown once here", UserWarning)

        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("default")
            shout()
            cuda_kernels._configured(Kernel(), grid, 32, None)()
            shout()
        assert seen == [0] and config.CUDA_LOW_OCCUPANCY_WARNINGS == 1
        assert len(got) == 1
    finally:
        config.CUDA_LOW_OCCUPANCY_WARNINGS = saved


def test_foreign_streams_are_wrapped_once_per_context_and_handle(monkeypatch):
    """A CuPy or torch stream gets one Numba wrapper per context, reused at every launch (numba-cuda's
    launch-configuration cache is keyed on the stream object); another handle or another context gets
    its own, and a context's store is bounded."""
    from types import SimpleNamespace

    from hcrfast.kernels import cuda as cuda_kernels

    made = []
    contexts = [SimpleNamespace(extras={}), SimpleNamespace(extras={})]
    current = {"context": contexts[0]}

    def external_stream(ptr):
        made.append(ptr)
        return SimpleNamespace(handle=ptr, n=len(made))

    fake = SimpleNamespace(external_stream=external_stream, current_context=lambda: current["context"])
    monkeypatch.setattr(cuda_kernels, "cuda", fake)

    torch_like, cupy_like = SimpleNamespace(cuda_stream=0xA0), SimpleNamespace(ptr=0xB0)
    first = cuda_kernels._numba_stream(torch_like)
    assert cuda_kernels._numba_stream(torch_like) is first and first.handle == 0xA0
    other = cuda_kernels._numba_stream(cupy_like)
    assert other is not first and other.handle == 0xB0 and cuda_kernels._external_stream(0xB0) is other
    assert made == [0xA0, 0xB0]
    current["context"] = contexts[1]                 # another device (or a context made after a close)
    assert cuda_kernels._numba_stream(torch_like) is not first and made == [0xA0, 0xB0, 0xA0]
    assert cuda_kernels._numba_stream(None) == 0 and len(made) == 3
    for ptr in range(cuda_kernels._MAX_EXTERNAL_STREAMS + 5):   # bounded, however many streams come
        cuda_kernels._external_stream(0x1000 + ptr)
    assert len(contexts[1].extras["hcrfast_external_streams"]) <= cuda_kernels._MAX_EXTERNAL_STREAMS
    current["context"] = SimpleNamespace()           # a Numba without the per-context store: a fresh one
    assert cuda_kernels._external_stream(0xC0) is not cuda_kernels._external_stream(0xC0)


def test_twins_take_zero_size_batches_as_the_cuda_kernels_do():
    """The NumPy/CuPy twins (what impl='auto' runs) on zero-size shapes give empty results of the right shape,
    as the CUDA kernels do under the simulator (they raised: NumPy cannot infer -1 for 0 rows, and the DCT
    matrix of size 0 divided by 0)."""
    from hcrfast.kernels import twins

    assert kernels.row_norms(np.zeros((0, 5))).shape == (0,)
    np.testing.assert_array_equal(kernels.row_norms(np.zeros((3, 0))), np.zeros(3))
    scaled, norms = twins.normalize_rows(np.zeros((0, 2, 3)), 2.0)
    assert scaled.shape == (0, 2, 3) and norms.shape == (0,)
    z, znorm, zt = twins.restart_update(np.zeros((0, 4)), np.zeros((0, 4)), np.zeros(0))
    assert z.shape == zt.shape == (0, 4) and znorm.shape == (0,)
    for shape in ((2, 0, 3), (2, 3, 0), (0, 4, 4), (1, 0, 0)):
        x = np.zeros(shape)
        assert kernels.dct2(x).shape == shape and kernels.idct2(x).shape == shape


@pytest.mark.parametrize("call,error,match", [
    (lambda k: k.dct2(np.arange(6).reshape(2, 3)), TypeError, r"x must hold float32 or float64, got int64"),
    (lambda k: k.idct2(np.ones((2, 3), dtype=bool)), TypeError, r"y must hold float32 or float64, got bool"),
    (lambda k: k.dct2(np.ones(5)), ValueError, r"x must have shape \(\.\.\., H, W\), got \(5,\)"),
    (lambda k: k.dct2(torch.ones(2, 3)), TypeError, r"x must be a NumPy or CuPy array, got Tensor"),
    (lambda k: k.dct2([[1.0, 2.0]]), TypeError, r"x must be a NumPy or CuPy array, got list"),
    (lambda k: k.row_normalize(np.array([[3, 4], [1, 0]]), 1.0), TypeError, r"a must hold float32 or float64"),
    (lambda k: k.idct2(np.ones((2, 3), dtype=np.longdouble)), TypeError, r"y must hold float32 or float64"),
    (lambda k: k.restart_update(np.ones((1, 2), np.float32), np.ones((1, 2)), 1.0), TypeError,
     r"features is float64 but features_perturbed is float32"),
    (lambda k: k.lsqr_update_xw(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), np.ones((2, 2)),
                                np.ones(2), np.ones(2)), TypeError, r"v is float64 but x is float32"),
    (lambda k: k.row_normalize(np.ones((1, 2)), np.ones(3)), ValueError, r"target must have shape \(1,\)"),
    (lambda k: k.row_normalize(np.ones((2, 2)), np.ones(1)), ValueError, r"target must have shape \(2,\)"),
    (lambda k: k.restart_update(np.ones((1, 2)), np.ones((1, 2)), np.ones(2)), ValueError,
     r"target must have shape \(1,\)"),
    (lambda k: k.restart_update(np.ones((1, 2)), np.ones(2), 1.0), ValueError, r"features has \(2,\)"),
    (lambda k: k.lsqr_update_xw(*[np.ones((2, 2))] * 3, np.ones(1), np.ones(2)), ValueError,
     r"t1 must have shape \(2,\)"),
    (lambda k: k.lsqr_update_xw(np.ones((2, 2)), np.ones((2, 3)), np.ones((2, 2)), np.ones(2), np.ones(2)),
     ValueError, r"x has shape \(2, 2\) but w has \(2, 3\)"),
])
def test_the_dispatch_refuses_what_the_cuda_kernels_refuse(call, error, match):
    """On NumPy data the twins ran whatever they were given: an integer batch's DCT came out all 0 (its DCT
    matrix cast to int), an integer row_normalize truncated its rows, a (3,) target on one row gave three, a
    (1,) t1 was broadcast over two problems, longdouble ran (at float64's accuracy),
    mixed dtypes were promoted. The dispatch now refuses them as the CUDA kernels do."""
    with pytest.raises(error, match=match):
        call(kernels)


def test_the_cached_dct_matrix_cannot_be_changed_by_a_caller():
    """``dct_matrix`` hands out its cached array: a caller that scaled it in place (``c *= 2``) made every later
    DCT, and ``hcrfast.bound``'s bounds, 4× what they were. It is read-only now; the DCT still matches SciPy's."""
    c = twins.dct_matrix(4)
    with pytest.raises(ValueError, match="read-only"):
        c *= 2
    x = np.random.default_rng(0).standard_normal((3, 4, 4))
    np.testing.assert_allclose(kernels.dct2(x), scipy.fft.dctn(x, axes=(-2, -1), norm="ortho"), atol=1e-12)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
@pytest.mark.parametrize("module, name", [("hcrfast.kernels._lapack", "LOCK"), ("hcrfast.kernels.symmetric",
                                                                                  "_CUSOLVER_LOCK"),
                                          ("hcrfast.validation", "_ONE_CALL"), ("hcrfast.distributed", "_next_call_lock")])
def test_a_child_forked_while_another_thread_holds_a_lock_gets_its_own(module, name):
    """A multiprocessing 'fork' pool made while another thread was inside a call: the child inherited the lock
    held, by a thread the child does not have, and its first call hung forever."""
    import importlib
    import threading

    mod = importlib.import_module(module)
    held, release = threading.Event(), threading.Event()

    def hold():
        with getattr(mod, name):
            held.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(timeout=30)
    try:
        pid = os.fork()
        if pid == 0:   # the child: exit 0 if it can take the lock, 1 if not within 5 s
            os._exit(0 if getattr(mod, name).acquire(timeout=5) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_cuda_wrappers_per_row_parameters_take_integers_and_torch_tensors():
    """kernels.cuda's per-row targets (row_normalize's target, restart_update's, LSQR's t1 and t2): integer NumPy
    arrays, which the twins take, were refused ("must be a floating array"); their cast then read a torch tensor's
    dtype with NumPy, which refused every torch tensor ("Cannot interpret 'torch.float64' as a data type"), where
    a CUDA tensor had passed. Here the launch's device view is faked as the real one makes it: a view with a NumPy
    dtype."""
    import torch

    from hcrfast.kernels import cuda as kc

    class Launch:   # (the real one: a Numba device view of the array, through __cuda_array_interface__)
        def device(self, values, name):
            return values.numpy() if isinstance(values, torch.Tensor) else values

    got = kc._per_row(Launch(), "target", np.array([1, 2, 3]), 3)
    assert got.dtype == np.float64 and got.tolist() == [1.0, 2.0, 3.0]
    assert kc._per_row(Launch(), "target", torch.ones(3, dtype=torch.float64), 3).dtype == np.float64
    with pytest.raises(TypeError, match="must be a floating array, got bool"):
        kc._per_row(Launch(), "target", np.array([True, False, True]), 3)

