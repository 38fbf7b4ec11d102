"""hcrfast.bound: validity against the exact least-squares covariance, rigor, determinism."""
import dataclasses
import math
import functools
import os
import subprocess
import textwrap
import threading
import re
import warnings

import sys

import numpy as np
import pytest
import scipy.fft
import torch

import hcrfast
from hcrfast import validation
from hcrfast.noise import Gaussian
from hcrfast.targeted import DenseDirections

FAST = hcrfast.LSQROptions(atol=1e-8, btol=1e-8, iter_lim=200)

#: bound() with Algorithm 1's steps alone (no singular steps, which bound(singular_steps="auto") adds with
#: the dense and Krylov solves): what the oracles of Algorithm 1 below compute
algorithm1 = functools.partial(hcrfast.bound, singular_steps=0)


def linear_model(W, b, input_shape):
    """a(θ) = W θ + b on flattened inputs, float64."""
    n, p = W.shape
    lin = torch.nn.Linear(p, n).double()
    with torch.no_grad():
        lin.weight.copy_(torch.as_tensor(W))
        lin.bias.copy_(torch.as_tensor(b))
    return torch.nn.Sequential(torch.nn.Flatten(), lin).eval()


def dct_basis(input_shape):
    """Q (p×p): row k is the k-th orthonormal 2-D DCT-II mode per channel, from scipy.fft."""
    p = int(np.prod(input_shape))
    eye = np.eye(p).reshape((p,) + tuple(input_shape))
    return scipy.fft.dctn(eye, axes=(-2, -1), norm="ortho").reshape(p, p).T


def matrix_with_condition(rng, n, p, cond):
    U, _ = np.linalg.qr(rng.standard_normal((n, p)))
    V, _ = np.linalg.qr(rng.standard_normal((p, p)))
    return (U * np.logspace(0, -np.log10(cond), p)) @ V.T * 3.0


@pytest.mark.parametrize("cond", [1.0, 30.0, 1e3])
@pytest.mark.parametrize("basis", ["dct", "pixel"])
@pytest.mark.parametrize("linearize_at", ["input", "current"])
def test_never_exceeds_least_squares_std_on_linear_models(cond, basis, linearize_at):
    """std_k² ≤ σ²[Q (WᵀW)⁻¹ Qᵀ]_kk, the variance of the (unbiased, efficient) LS estimator."""
    rng = np.random.default_rng(int(cond))
    shape = (2, 3, 4)
    p, n = 24, 40
    W = matrix_with_condition(rng, n, p, cond)
    model = linear_model(W, rng.standard_normal(n), shape)
    x = torch.as_tensor(rng.standard_normal((3,) + shape))
    sigma = 0.7
    res = hcrfast.bound(model, x, sigma, size=0.01, iterations=3, restarts=4, basis=basis,
                        linearize_at=linearize_at, lsqr=FAST)
    Q = dct_basis(shape) if basis == "dct" else np.eye(p)
    crb = sigma**2 * np.diag(Q @ np.linalg.inv(W.T @ W) @ Q.T)
    std = res.std.reshape(3, p)
    assert np.all(np.isfinite(std)) and np.all(std >= 0)
    ratio = std**2 / crb
    assert ratio.max() <= 1 + 1e-9
    assert np.median(ratio) > 0.01  # and not vacuous


@pytest.mark.parametrize("solver", ["lsqr", "dense", "krylov"])
@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("n", [24, 16, 10])
def test_algorithm_1_on_linear_models_matches_the_closed_form(iterations, n, solver):
    """For a(θ) = Wθ + b and exact solves: ε(1) = W⁺z, and from j = 2 on ε = (‖z‖/‖P z‖) W⁺z with
    P = W W⁺ (z(1) = P z is rescaled to ‖z‖, and W⁺ P = W⁺), so z_ε = W ε has norm ‖z‖.
    n = 10 < p: W has a 6-dimensional null space, and the minimum-norm solution is the one."""
    rng = np.random.default_rng(n + iterations)
    p = 16
    W = matrix_with_condition(rng, n, p, 20.0) if n >= p else matrix_with_condition(rng, p, n, 20.0).T
    model = linear_model(W, rng.standard_normal(n), (1, 4, 4))
    x = torch.as_tensor(rng.standard_normal((3, 1, 4, 4)))
    sigma, size, R = 0.4, 0.02, 3
    res = algorithm1(model, x, sigma, size=size, iterations=iterations, restarts=R, basis="pixel",
                        lsqr=None if solver == "dense" else hcrfast.LSQROptions(atol=1e-12, btol=1e-12, iter_lim=500),
                        seed=5, solver=solver, warm_start=False, iterates="last")
    assert res.params["solver"] == solver
    z0 = hcrfast.start_vectors(np.arange(3), R, n, seed=5, size=size, sigma=sigma)
    eps = z0 @ np.linalg.pinv(W).T
    if iterations > 1:
        eps *= (np.linalg.norm(z0, axis=1) / np.linalg.norm(eps @ W.T, axis=1))[:, None]
    d = np.expm1(np.linalg.norm(eps @ W.T, axis=1) ** 2 / sigma**2).reshape(3, R)
    expected = (np.abs(eps).reshape(3, R, p) / np.sqrt(d)[..., None]).max(axis=1)
    np.testing.assert_allclose(res.std.reshape(3, p), expected, rtol=1e-7)
    np.testing.assert_allclose(res.divergence, d, rtol=1e-7)
    # the MSE bound (eq. 6) is the largest over the restarts, and its restart's eps and z are the ones kept
    mse = (np.sum(eps**2, axis=1).reshape(3, R) / p) / d
    np.testing.assert_array_equal(res.best_restart, mse.argmax(axis=1))
    np.testing.assert_allclose(res.mse, mse.max(axis=1), rtol=1e-7)
    np.testing.assert_allclose(res.eps.reshape(3, p), eps.reshape(3, R, p)[np.arange(3), res.best_restart], rtol=1e-7,
                               atol=1e-12)


def tanh_mlp(*widths):
    """Flatten, then Linear + Tanh between each pair of ``widths``: a curved float64 model in eval mode."""
    layers = [torch.nn.Flatten()]
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers).double().eval()


@pytest.mark.parametrize("solver", ["lsqr", "dense", "krylov"])
@pytest.mark.parametrize("n", [24, 10])
def test_every_iterate_bounds_the_modes_on_linear_models_in_closed_form(n, solver):
    """iterates="all" (the default): each mode takes the largest certified bound of ε(1) = W⁺z and of
    ε(j ≥ 2) = (‖z‖/‖P z‖) W⁺z (the closed forms of the test above) over the restarts; the eq.-(6) bound,
    its step and restart are of whichever (restart, iterate) has the largest, and ``divergence`` stays
    the last iterate's."""
    rng = np.random.default_rng(7 * n)
    p = 16
    W = matrix_with_condition(rng, n, p, 20.0) if n >= p else matrix_with_condition(rng, p, n, 20.0).T
    model = linear_model(W, rng.standard_normal(n), (1, 4, 4))
    x = torch.as_tensor(rng.standard_normal((3, 1, 4, 4)))
    sigma, size, R = 0.4, 0.02, 3
    res = algorithm1(model, x, sigma, size=size, iterations=3, restarts=R, basis="pixel",
                        lsqr=None if solver == "dense" else hcrfast.LSQROptions(atol=1e-12, btol=1e-12, iter_lim=500),
                        seed=5, solver=solver, warm_start=False)
    assert res.params["iterates"] == "all"
    z0 = hcrfast.start_vectors(np.arange(3), R, n, seed=5, size=size, sigma=sigma)
    eps1 = z0 @ np.linalg.pinv(W).T
    eps2 = eps1 * (np.linalg.norm(z0, axis=1) / np.linalg.norm(eps1 @ W.T, axis=1))[:, None]
    std, mse, d = [], [], []
    for eps in (eps1, eps2):
        d.append(np.expm1(np.linalg.norm(eps @ W.T, axis=1) ** 2 / sigma**2).reshape(3, R))
        std.append((np.abs(eps).reshape(3, R, p) / np.sqrt(d[-1])[..., None]).max(axis=1))
        mse.append((np.sum(eps**2, axis=1).reshape(3, R) / p) / d[-1])
    np.testing.assert_allclose(res.std.reshape(3, p), np.maximum(*std), rtol=1e-7)
    if n > p:  # z(1) = P z is shorter than z: ε(1) has the smaller D per |ε_k|, so it is the one that counts
        assert (std[0] > std[1] * (1 + 1e-9)).all()
    else:      # W has full row rank: P z = z and every iterate is ε(1)
        np.testing.assert_allclose(std[0], std[1], rtol=1e-9)
    np.testing.assert_allclose(res.divergence, d[1], rtol=1e-7)
    np.testing.assert_allclose(res.mse, np.maximum(*mse).max(axis=1), rtol=1e-7)
    both = np.stack(mse, axis=1).reshape(3, 2 * R)   # (example, iterate · R + restart)
    np.testing.assert_array_equal(res.best_restart, both.argmax(axis=1) % R)
    pick = np.stack([eps1, eps2]).reshape(2, 3, R, p).transpose(1, 0, 2, 3).reshape(3, 2 * R, p)
    np.testing.assert_allclose(res.eps.reshape(3, p), pick[np.arange(3), both.argmax(axis=1)], rtol=1e-7, atol=1e-12)
    # and "last" is the paper's ε(i) alone
    last = algorithm1(model, x, sigma, size=size, iterations=3, restarts=R, basis="pixel",
                         lsqr=None if solver == "dense" else hcrfast.LSQROptions(atol=1e-12, btol=1e-12, iter_lim=500),
                         seed=5, solver=solver, warm_start=False, iterates="last")
    np.testing.assert_allclose(last.std.reshape(3, p), std[1], rtol=1e-7)


@pytest.mark.parametrize("one_iterate_a_slice", [False, True])
def test_every_iterate_bound_is_the_max_over_runs_stopped_at_each_iterate(one_iterate_a_slice, monkeypatch):
    """On a curved model, bound(iterates="all") with i iterations equals, mode by mode, the max of
    bound(iterations=j, iterates="last") over j = 1..i (Algorithm 1 is deterministic, so the run stopped
    at j took the same ε(j)), and the eq.-(6) fields agree with the step they name; also when the earlier
    iterates' bounds are taken one iterate at a time (what a chunk too large for one slice does)."""
    from hcrfast import algorithm

    if one_iterate_a_slice:
        monkeypatch.setattr(algorithm, "_EARLIER_VALUES", 1)
    torch.manual_seed(3)
    model = tanh_mlp(36, 30, 24)
    x = torch.randn(2, 1, 6, 6, dtype=torch.float64)
    sigma = 0.05
    for solver in ("dense", "lsqr"):
        kw = dict(size=0.5, restarts=3, solver=solver, lsqr=None if solver == "dense" else FAST)
        res = algorithm1(model, x, sigma, iterations=4, **kw)
        runs = [algorithm1(model, x, sigma, iterations=j, iterates="last", **kw) for j in range(1, 5)]
        np.testing.assert_allclose(res.std, np.max([r.std for r in runs], axis=0), rtol=1e-12)
        np.testing.assert_allclose(res.mse, np.max([r.mse for r in runs], axis=0), rtol=1e-12)
        assert (res.std > runs[-1].std * (1 + 1e-9)).any(), "no earlier iterate helped: the test shows nothing"
        with torch.no_grad():
            z = model(x + torch.as_tensor(res.eps)) - model(x)
        np.testing.assert_allclose(res.z, z.reshape(2, -1).numpy(), rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(res.mse, (res.eps.reshape(2, -1) ** 2).mean(axis=1)
                                   / np.expm1((z.reshape(2, -1).numpy() ** 2).sum(axis=1) / sigma**2), rtol=1e-9)
        np.testing.assert_array_equal(res.divergence, runs[-1].divergence)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("law", ["gaussian", "laplace"])
def test_screening_the_earlier_iterates_loses_nothing(dtype, law, monkeypatch):
    """bound(iterates="all") certifies only the earlier steps whose uncertified shift says they could raise
    some mode's bound (or eq. (6)): the bounds, eq.-(6) fields and reasons equal those of certifying every
    step (the screen off: margin inf), in float32 (where the model's rounding brackets each step) and float64,
    under Gaussian and Laplace noise, with the DCT's modes and the pixels'; and the screen leaves steps out."""
    from hcrfast import algorithm

    torch.manual_seed(3)
    model = tanh_mlp(36, 30, 24).to(dtype)
    x = torch.randn(3, 1, 6, 6, dtype=dtype)
    noise = hcrfast.Gaussian(0.05) if law == "gaussian" else hcrfast.Laplace(0.05)
    for solver, basis in (("dense", "dct"), ("lsqr", "pixel")):
        kw = dict(size=0.5, restarts=4, iterations=5, solver=solver, basis=basis,
                  lsqr=None if solver == "dense" else FAST)
        screened = hcrfast.bound(model, x, noise, **kw)
        with monkeypatch.context() as m:
            m.setattr(algorithm, "_SCREEN_MARGIN", float("inf"))
            every = hcrfast.bound(model, x, noise, **kw)
        assert every.params["earlier_iterates"] == dict(every.params["earlier_iterates"], steps=48, certified=48,
                                                         screened=False)
        info = screened.params["earlier_iterates"]
        assert info["screened"] and info["steps"] == 48 and 0 < info["certified"] < 48, info
        assert info["margin"] >= algorithm._SCREEN_MARGIN * algorithm._SCREEN_FLOOR   # never below the floor
        assert f"earlier iterates: {info['certified']} of 48 steps certified" in screened.summary()
        assert "earlier iterates" not in every.summary()
        # every step certified by the screen: no "others" to speak of (a user read "675 of 675 ...; the others")
        screened.params["earlier_iterates"] = dict(info, certified=48)
        assert "earlier iterates: all 48 steps certified\n" in screened.summary() + "\n"
        assert "the others" not in screened.summary()
        np.testing.assert_allclose(screened.std, every.std, rtol=1e-12, atol=0)
        np.testing.assert_allclose(screened.mse, every.mse, rtol=1e-12, atol=0)
        np.testing.assert_array_equal(screened.best_restart, every.best_restart)
        np.testing.assert_allclose(screened.eps, every.eps, rtol=1e-12, atol=0)
        np.testing.assert_allclose(screened.z, every.z, rtol=1e-9, atol=1e-15)
        np.testing.assert_array_equal(screened.divergence, every.divergence)
        assert screened.infinite_reasons == every.infinite_reasons


def test_a_chunks_float64_features_at_its_inputs_are_taken_once_for_its_earlier_and_singular_steps():
    """The earlier iterates' certification and each piece of the singular steps' took a(θ) of the chunk in float64
    again: the same pass of the same rows, 4 % of a CIFAR-10 CNN call (a profiling pass; 64.1 -> 60.1 s at 4
    examples x 5 x 3, the same bits). Taken once a chunk now: here 2 chunks, each with its earlier iterates and 4
    pieces of singular steps (3 x 2 x 6 rows in pieces of 3 x 4, 3 of them), counted by the model's float64
    forwards of exactly the chunk's inputs (one more a chunk is another pass's); the bounds are those of taking it
    at every call."""
    from hcrfast import algorithm

    class Seen(torch.nn.Module):
        def __init__(self, net, x):
            super().__init__()
            self.net, self.x, self.hits = net, x, 0

        def forward(self, t):
            if t.dtype == torch.float64 and not torch.is_grad_enabled():
                self.hits += sum(bool(torch.equal(t, self.x[i:i + 3])) for i in (0, 3))
            return self.net(t)

    torch.manual_seed(0)
    x = torch.randn(6, 1, 4, 4, dtype=torch.float64)
    model = Seen(tanh_mlp(16, 12, 6), x).eval()
    kw = dict(restarts=4, iterations=3, seed=0, solver="dense", chunk_size=3, singular_steps=6)
    got = hcrfast.bound(model, x, 0.05, **kw)
    assert model.hits == 2 * (1 + 1)
    calls = []
    real = algorithm._certified_iterates
    with pytest.MonkeyPatch.context() as m:   # as before: a(θ) taken at every call
        m.setattr(algorithm, "_certified_iterates", lambda *a, at=None: calls.append(1) or real(*a))
        model.hits = 0
        before = hcrfast.bound(model, x, 0.05, **kw)
    assert len(calls) == 2 * (1 + 3) and model.hits == 2 * (4 + 1)
    assert before.std.tobytes() == got.std.tobytes()


def test_the_screen_runs_on_a_chunks_first_examples_first_and_on_the_others_where_it_pays(monkeypatch):
    """On the MNIST MLP a float64 forward costs about what the screen's arithmetic on a step does: the screen spared
    61 of 14,400 steps of 64 examples and the call took 35 % longer with it (a profiling pass). On the CPU it now
    runs on an eighth of a chunk's examples first (all of a chunk of fewer than 4; all on CUDA), and on the others
    only where it spared at least half of those examples' moved steps; else every step is certified, as without a
    screen. A count, not a time: the same call decides the same way every time. By hand, with a screen that
    certifies one step in ``keep``; then on a model, the bounds whichever way it decides."""
    from hcrfast import algorithm

    calls, keep = [], [2]

    def fake(eps, z, eps64, *args, restarts, **kwargs):
        calls.append(eps64.shape[0] // restarts)
        take = np.zeros(eps.shape[0], dtype=bool)
        take[::keep[0]] = True
        return take.reshape(eps64.shape[0] // restarts, -1), 1.0

    m, K, R, p, n = 16, 6, 2, 5, 3
    eps, z = np.ones((m * K, p)), np.ones((m * K, n))
    eps64, z64, mag = np.ones((m * R, p)), np.ones((m * R, n)), np.ones((m, n))
    kw = dict(restarts=R, input_shape=(1, 1, p), basis="pixel", unit=2.0**-24)

    def run(sample=True, rows=m):
        calls.clear()
        return algorithm._screen_in_part(eps[:rows * K], z[:rows * K], eps64[:rows * R], z64[:rows * R],
                                         z64[:rows * R], mag[:rows], None, sample=sample, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(algorithm, "_screen_earlier", fake)
        take, margin = run()   # half of the first 2 examples' 12 steps spared: it pays
        assert calls == [2, 14] and take.shape == (m, K) and take.sum() == m * K // 2 and margin == 1.0
        keep[0] = 1   # none spared: every step certified
        assert run() == (None, None) and calls == [2]
        take, _ = run(sample=False)   # (CUDA: one screen of all)
        assert calls == [m] and take.shape == (m, K)
        take, _ = run(rows=3)   # (fewer than 4 examples: one screen of all)
        assert calls == [3] and take.shape == (3, K)
    torch.manual_seed(3)
    model = tanh_mlp(36, 30, 24)
    x = torch.randn(8, 1, 6, 6, dtype=torch.float64)
    kw = dict(size=0.5, restarts=4, iterations=5, solver="dense")
    results = {}
    for spared in (0.0, 2.0):   # the others screened, or not
        monkeypatch.setattr(algorithm, "_SCREEN_SPARED", spared)
        results[spared] = hcrfast.bound(model, x, 0.05, **kw)
    screened, every = results[0.0], results[2.0]
    assert every.params["earlier_iterates"]["certified"] == 8 * 4 * 4
    assert screened.params["earlier_iterates"]["certified"] < 8 * 4 * 4
    # declined on every chunk: not "screened" (it said so, with a margin of 0: a review)
    assert (every.params["earlier_iterates"]["screened"], every.params["earlier_iterates"]["margin"]) == (False, None)
    assert screened.params["earlier_iterates"]["screened"] and screened.params["earlier_iterates"]["margin"] >= 1
    again = hcrfast.bound(model, x, 0.05, **kw)   # (the same call, the same decision: equal, params included)
    assert again == results[2.0]
    np.testing.assert_allclose(screened.std, every.std, rtol=1e-12, atol=0)
    np.testing.assert_allclose(screened.mse, every.mse, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(screened.best_restart, every.best_restart)


@pytest.mark.parametrize("basis", ["dct", "pixel"])
@pytest.mark.parametrize("law", [hcrfast.Gaussian(0.7), hcrfast.Laplace(0.4)], ids=["gaussian", "laplace"])
def test_the_screen_keeps_every_step_that_sets_a_mode_s_max(basis, law):
    """_screen_earlier on random steps whose shifts are exact (what the bracket allows, at any margin): the
    max over the last iterates and the steps it keeps is, mode by mode, the max over all steps (the DCT by
    SciPy), and so is eq. (6)'s largest step; a step ε = 0 is never kept, one with a NaN always (its
    certification then refuses it), and it keeps fewer steps than there are."""
    from hcrfast import algorithm

    rng = np.random.default_rng(7)
    m, R, k, n, shape = 3, 4, 5, 6, (2, 4, 5)
    p, K = int(np.prod(shape)), k * R
    eps = (rng.standard_normal((m * K, p)) * rng.uniform(0.2, 1.0, (m * K, 1))).astype(np.float32)
    eps[1] = 0
    eps[K + 2, 3] = np.nan
    z = (rng.standard_normal((m * K, n)) * rng.uniform(0.5, 1.5, (m * K, 1))).astype(np.float32)
    z[1] = 0
    eps64, z64 = rng.standard_normal((m * R, p)) * 0.8, rng.standard_normal((m * R, n))
    magnitude = np.abs(rng.standard_normal((m, n))) + 1.0
    take, margin = algorithm._screen_earlier(eps, z, eps64, z64, z64.astype(np.float32), magnitude, law, restarts=R,
                                             input_shape=shape, basis=basis, unit=2.0**-24)
    assert take.shape == (m, K) and margin > 0
    assert not take[0, 1] and take[1, 2] and 0 < take.sum() < m * K

    def modes(e):
        e = e.reshape((-1,) + shape).astype(np.float64)
        return np.abs(scipy.fft.dctn(e, axes=(-2, -1), norm="ortho") if basis == "dct" else e).reshape(len(e), -1)

    d = law.divergence(z.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        steps = (modes(eps) / np.sqrt(d)[:, None]).reshape(m, K, p)
    steps[~np.isfinite(steps)] = 0                       # the ε = 0 and NaN rows bound nothing here
    last = (modes(eps64) / np.sqrt(law.divergence(z64))[:, None]).reshape(m, R, p).max(axis=1)
    every = np.maximum(last, steps.max(axis=1))
    kept = np.maximum(last, np.where(take[..., None], steps, 0).max(axis=1))
    np.testing.assert_array_equal(kept, every)
    sq = np.nan_to_num((eps.astype(np.float64) ** 2).sum(axis=1) / p).reshape(m, K)
    with np.errstate(invalid="ignore", divide="ignore"):
        mse = np.nan_to_num(sq / d.reshape(m, K))
    mse_last = ((eps64**2).sum(axis=1) / p / law.divergence(z64)).reshape(m, R).max(axis=1)
    for b in range(m):
        best = mse[b].argmax()
        assert take[b, best] or mse[b, best] <= mse_last[b]


def test_steps_the_screen_leaves_out_bound_nothing(monkeypatch):
    """A screen that leaves every earlier step out gives exactly iterates="last": the steps it does not
    certify enter as ε = 0, which bound nothing; one that keeps them all gives the unscreened bounds. And a
    screen that trusts the uncertified shifts outright (margin 0) reports no bound above what certifying
    every step gives: whatever it chooses, only certified steps are reported."""
    from hcrfast import algorithm

    torch.manual_seed(4)
    model = tanh_mlp(36, 30, 24).float()
    x = torch.randn(3, 1, 6, 6)
    kw = dict(size=0.5, restarts=4, iterations=5, solver="dense")
    last = hcrfast.bound(model, x, 0.05, iterates="last", **kw)
    with monkeypatch.context() as m:
        m.setattr(algorithm, "_screen_earlier", lambda eps, z, eps64, *a, **k: (np.zeros(
            (eps64.shape[0] // 4, eps.shape[0] // (eps64.shape[0] // 4)), dtype=bool), 1.0))
        none = hcrfast.bound(model, x, 0.05, **kw)
    assert none.params["earlier_iterates"]["certified"] == 0
    np.testing.assert_array_equal(none.std, last.std)
    np.testing.assert_array_equal(none.mse, last.mse)
    np.testing.assert_array_equal(none.best_restart, last.best_restart)
    with monkeypatch.context() as m:
        m.setattr(algorithm, "_SCREEN_MARGIN", float("inf"))
        every = hcrfast.bound(model, x, 0.05, **kw)
    assert (every.std > last.std * (1 + 1e-6)).any(), "no earlier iterate helped: the test shows nothing"
    with monkeypatch.context() as m:
        m.setattr(algorithm, "_SCREEN_MARGIN", 0.0)
        trusting = hcrfast.bound(model, x, 0.05, **kw)
    assert np.all(trusting.std <= every.std * (1 + 1e-12))
    assert np.all(trusting.std >= last.std)


def test_a_monte_carlo_divergence_is_not_screened():
    """A Monte Carlo D is an estimate, not monotone in each |z_j| for certain: every earlier step is
    certified there, and iterates="last" reports no screening."""
    torch.manual_seed(5)
    model = tanh_mlp(16, 12, 8)
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    noise = hcrfast.MonteCarlo.from_scipy(scipy.stats.norm(scale=0.3), n_samples=2_000)
    res = hcrfast.bound(model, x, noise, size=0.5, restarts=2, iterations=3, solver="dense")
    assert res.params["earlier_iterates"] == dict(res.params["earlier_iterates"], steps=8, certified=8,
                                                   screened=False)
    last = hcrfast.bound(model, x, 0.3, size=0.5, restarts=2, iterations=3, solver="dense", iterates="last")
    assert last.params["earlier_iterates"] is None


def test_bound_is_computed_from_forward_passes_not_the_linearization():
    """Large perturbations of a curved model: z_ε is a(θ+ε) − a(θ), not J ε."""
    torch.manual_seed(0)
    model = tanh_mlp(16, 20, 20)
    x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
    sigma = 0.2
    for iterates in ("all", "last"):
        res = hcrfast.bound(model, x, sigma, size=2.0, iterations=2, restarts=3, lsqr=FAST, iterates=iterates)
        eps = torch.as_tensor(res.eps)
        with torch.no_grad():
            z_forward = (model(x + eps) - model(x)).numpy()
        np.testing.assert_allclose(res.z, z_forward, rtol=1e-12, atol=1e-15)
        jv = torch.func.jvp(model, (x,), (eps,))[1].detach().numpy()
        assert np.linalg.norm(jv - z_forward) > 1e-3 * np.linalg.norm(z_forward)  # really nonlinear here
        d = np.expm1((z_forward**2).sum(axis=1) / sigma**2)
        if iterates == "last":  # divergence is of the last iterates, which eps then is one of
            np.testing.assert_allclose(res.divergence[np.arange(2), res.best_restart], d, rtol=1e-12)
        np.testing.assert_allclose(res.mse, (res.eps.reshape(2, -1) ** 2).mean(axis=1) / d, rtol=1e-12)
        coords = np.abs(scipy.fft.dctn(res.eps, axes=(-2, -1), norm="ortho")) / np.sqrt(d)[:, None, None, None]
        assert np.all(res.std >= coords * (1 - 1e-12))


@pytest.mark.filterwarnings("ignore:certify=False. every feature shift")  # uncertified on purpose
def test_certified_float64_matches_direct_recomputation_for_float32_models():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.ReLU(),
                                torch.nn.Linear(24, 24), torch.nn.ReLU()).eval()
    x = torch.rand(3, 1, 4, 4)
    sigma = hcrfast.rms_sigma(model(x).detach(), 1.0)
    res = hcrfast.bound(model, x, sigma, size=0.05, iterations=2, restarts=3,
                        lsqr=hcrfast.LSQROptions(atol=1e-4, btol=1e-4, iter_lim=50))
    assert res.std.dtype == np.float64
    m64 = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.ReLU(),
                              torch.nn.Linear(24, 24), torch.nn.ReLU()).double()
    m64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    with torch.no_grad():
        x64 = x.double()
        z = (m64(x64 + torch.as_tensor(res.eps)) - m64(x64)).numpy()
    np.testing.assert_allclose(res.z, z, rtol=1e-12, atol=1e-15)
    uncertified = hcrfast.bound(model, x, sigma, size=0.05, iterations=2, restarts=3, certify=False,
                                lsqr=hcrfast.LSQROptions(atol=1e-4, btol=1e-4, iter_lim=50))
    np.testing.assert_allclose(uncertified.std, res.std, rtol=1e-3)


@pytest.mark.filterwarnings("ignore:certify=False. every feature shift")  # uncertified on purpose
@pytest.mark.parametrize("solver", ["lsqr", "dense"])
def test_uncertified_float32_shift_rounded_to_zero_claims_no_infinite_bound(solver):
    """Features of order 100 in float32 and σ = 1e-5: ‖Jε‖ ≈ sσ = 5e-8 is below their ulp (7.6e-6),
    so the uncertified float32 passes see a(θ+ε) == a(θ) though W is invertible, and the least-squares
    estimator (an unbiased one) has a finite std. Those restarts must bound nothing (0), with a reason
    and a warning, never +inf; certified, the same call gives finite bounds below the LS std."""
    rng = np.random.default_rng(5)
    shape = (1, 4, 4)
    W = matrix_with_condition(rng, 16, 16, 3.0)
    model = linear_model(W, np.full(16, 100.0), shape).float()
    x = torch.rand(4, *shape, generator=torch.Generator().manual_seed(0))
    sigma = 1e-5
    kw = dict(iterations=2, restarts=3, basis="pixel", solver=solver, lsqr=FAST if solver == "lsqr" else None)
    with pytest.warns(UserWarning, match=r"exactly unchanged in uncertified float32 .* D = 0 is not established"):
        res = hcrfast.bound(model, x, sigma, certify=False, **kw)
    assert not np.isinf(res.std).any() and not np.isinf(res.mse).any() and res.infinite_reasons == []
    # (a restart whose shift came out as one float32 ulp instead has a huge D: a tiny finite bound)
    unchanged = np.argwhere(res.divergence == 0)
    assert len(unchanged) > 0
    assert res.params["zero_step_reasons"] == [
        f"example {e}, restart {r}: a(theta+eps) == a(theta) in float32, not float64 (certify=False): float32 may "
        f"have rounded the features' shift away, so D = 0 is not established and this restart bounds nothing (0); "
        f"certify=True decides it" for e, r in unchanged]
    exact = sigma * np.sqrt(np.diag(np.linalg.inv(W.T @ W)))
    certified = hcrfast.bound(model, x, sigma, **kw)
    assert np.all(np.isfinite(certified.std)) and np.all(certified.std > 0)
    assert np.all(certified.std.reshape(4, -1) <= exact * (1 + 1e-3))


@pytest.mark.parametrize("solver", ["lsqr", "dense"])
def test_float64_shift_below_resolution_claims_no_infinite_bound(solver):
    """A full-rank float64 linear model with inputs of order 1, features of order 1e4 and σ = 1e-12:
    the feature shifts (~5e-15) are below float64's resolution of the features (~2e-12), so
    a(θ+ε) == a(θ) exactly, though ε is applied and the least-squares estimator has a finite std. Such a D = 0 is rounding: the same
    direction scaled up moves the features, so it bounds nothing (0) instead of +inf, with a reason
    and a warning; so do the shifts float64 gives too coarsely for D (beyond _ROUNDING_LIMIT: without
    it, targeted bounds reached 1.45x the exact std here). Inputs the model ignores still get +inf
    (test_zero_divergence_gives_infinite_bound_with_reason)."""
    rng = np.random.default_rng(0)
    shape = (1, 4, 5)
    W = rng.standard_normal((24, 20))
    model = linear_model(W, 1e4 * rng.standard_normal(24), shape)
    x = torch.as_tensor(rng.standard_normal((3,) + shape))
    sigma = 1e-12
    exact = sigma * np.sqrt(np.diag(np.linalg.inv(W.T @ W)))  # pixel basis
    kw = dict(iterations=3, restarts=4, basis="pixel", solver=solver, lsqr=FAST if solver == "lsqr" else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = hcrfast.bound(model, x, sigma, **kw)
        tb = hcrfast.targeted_bound(model, x, sigma, basis="pixel")
    text = " ".join(str(w.message) for w in caught)
    assert not np.isinf(res.std).any() and res.infinite_reasons == [] and not np.isinf(tb.std).any()
    assert "below float64's resolution" in text and "D is not established and they bound nothing (0)" in text
    reasons = res.params["zero_step_reasons"]
    assert len([r for r in reasons if "below float64's resolution" in r]) == int((res.divergence == 0).sum()) > 0
    assert len([r for r in reasons if "within float64's rounding" in r]) == int((res.divergence > 0).sum())
    assert np.all(res.std == 0) and np.all(res.mse == 0)  # every restart is rounded away or coarse: D not established
    for got in (res.std, tb.std):  # nothing above the exact std
        assert np.all(got.reshape(3, -1) <= exact * (1 + 1e-3))
    # a sigma float64 resolves against these features: finite bounds, the targeted ones at the exact std
    # times sqrt(s^2 / expm1(s^2)) (s = 1/200), no warning of rounding; below it by D's bracket for float64's
    # rounding of features of order 1e4 against shifts of order 1e-5 (algorithm._widened: ~2.7e-6 here), not above
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tb = hcrfast.targeted_bound(model, x, 1e-2, basis="pixel")
    want = np.tile(1e-2 / sigma * exact * np.sqrt(0.005**2 / np.expm1(0.005**2)), (3, 1))
    np.testing.assert_allclose(tb.std.reshape(3, -1), want, rtol=1e-5)
    assert np.all(tb.std.reshape(3, -1) <= want * (1 + 1e-12))


class OffsetLinear(torch.nn.Module):
    """W x, then ``offset`` added to every feature (``constant=False``) or one constant feature of that size
    appended (``constant=True``)."""

    def __init__(self, W, offset, constant):
        super().__init__()
        self.W, self.offset, self.constant = torch.as_tensor(W), offset, constant

    def forward(self, x):
        f = x.flatten(1) @ self.W.T
        return torch.cat([f, torch.full_like(f[:, :1], self.offset)], 1) if self.constant else f + self.offset


def test_rounding_guards_neither_pass_a_false_inf_nor_zero_a_resolved_bound():
    """Features offset by 1e17 at σ = 1e-2: every shift rounds away and even a step of 1e-3 of the
    inputs is below the features' resolution (a false +inf for all 60 entries before); the JVP sizes the
    probe that shows it. A constant feature of 1e12 beside moving ones adds no rounding to their shifts
    (its z is exactly 0): the bounds stay the exact ones (they were all zeroed by a norm-based estimate)."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((24, 20))
    x = torch.as_tensor(rng.standard_normal((3, 1, 4, 5)))
    exact = np.sqrt(np.diag(np.linalg.inv(W.T @ W)))  # per unit σ, pixel basis
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        far = OffsetLinear(W, 1e17, constant=False).eval()
        res = hcrfast.bound(far, x, 1e-2, iterations=2, restarts=2, basis="pixel", solver="dense")
        tb = hcrfast.targeted_bound(far, x, 1e-2, basis="pixel")
    assert not np.isinf(res.std).any() and not np.isinf(tb.std).any()
    assert np.all(tb.std.reshape(3, -1) <= 1e-2 * exact * (1 + 1e-3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no rounding warning either
        tb = hcrfast.targeted_bound(OffsetLinear(W, 1e12, constant=True).eval(), x, 0.05, basis="pixel")
    np.testing.assert_allclose(tb.std.reshape(3, -1), np.tile(0.05 * exact * np.sqrt(0.005**2 / np.expm1(0.005**2)),
                                                              (3, 1)), rtol=1e-6)


def test_the_resolution_of_the_features_is_their_largest_not_their_smallest():
    """As test_rounding_guards_neither_pass_a_false_inf_nor_zero_a_resolved_bound (features offset by 1e17,
    every shift rounded away), with one feature of exactly 0 beside them: float64 resolves the features to
    u times their largest magnitude, and the zero feature must not make the probe too small to show it."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((24, 20))
    x = torch.as_tensor(rng.standard_normal((3, 1, 4, 5)))
    far = OffsetLinear(W, 1e17, constant=False)
    model = lambda t: torch.cat([far(t), torch.zeros_like(far(t)[:, :1])], 1)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = hcrfast.bound(model, x, 1e-2, iterations=2, restarts=2, basis="pixel", solver="dense")
    assert not np.isinf(res.std).any() and res.infinite_reasons == []


def test_shifts_float64_gives_to_within_the_limit_keep_their_bounds_with_a_warning():
    """Features offset by 1e4 at σ = 1e-4: float64's rounding of each shift is ~1e-5 of it, between
    _ROUNDING_TOLERANCE and _ROUNDING_LIMIT: the bounds stand (finite, positive, at most the exact
    least-squares std), with a warning of how far D may be off and how far it was taken up; they are not zeroed."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((24, 20))
    x = torch.as_tensor(rng.standard_normal((3, 1, 4, 5)))
    exact = 1e-4 * np.sqrt(np.diag(np.linalg.inv(W.T @ W)))  # pixel basis
    with pytest.warns(UserWarning, match=r"may move D, and the bounds with it, by up to ~1e-05 \(relative\); D is "
                                         r"taken 32x that far up, so their bounds are lower by up to ~0\.000\d"):
        res = algorithm1(OffsetLinear(W, 1e4, constant=False).eval(), x, 1e-4, iterations=2, restarts=2,
                            basis="pixel", solver="dense")
    assert res.params["zero_step_reasons"] == []
    assert res.params["rounding"]["restarts"] == 6 and 1e-6 < res.params["rounding"]["worst"] < 1e-3  # 3 x 2, kept
    assert np.all(res.std > 0) and np.all(res.mse > 0)
    assert np.all(res.std.reshape(3, -1) <= exact * (1 + 1e-3))
    # the singular steps' rounding is counted apart from the restarts', each with its own warning
    with pytest.warns(UserWarning) as caught:
        with_steps = hcrfast.bound(OffsetLinear(W, 1e4, constant=False).eval(), x, 1e-4, iterations=2, restarts=2,
                                   basis="pixel", solver="dense", singular_steps=4)
    said = [str(w.message) for w in caught]
    assert any(m.startswith("6 restarts' steps moved the features so little") for m in said), said
    assert any(m.startswith("24 singular steps moved the features so little") for m in said), said  # 3 x 4 x 2
    assert with_steps.params["rounding"]["restarts"] == 6 and with_steps.params["rounding"]["singular_steps"] == 24


class SecondOrder(torch.nn.Module):
    """A straight-through feature per input (its forward value is 1 whatever x, its derivative the identity)
    beside (x_0 − x_1)² + 1, whose derivative is 0 at inputs with x_0 = x_1 but which a step moving x_0 − x_1
    by δ changes by δ²: a D = 0 from float64 rounding that only a second-order probe shows."""

    def forward(self, x):
        flat = x.flatten(1)
        return torch.cat([flat - flat.detach() + 1.0, (flat[:, :1] - flat[:, 1:2]) ** 2 + 1.0], 1)


def test_a_second_order_shift_rounded_away_is_no_infinite_bound():
    """Steps of ~1e-9 move (x_0 − x_1)² + 1 by ~1e-18, which float64 rounds away next to 1; the features
    do move (the true D is tiny but not 0), so no +inf; the probe sized sqrt(u) times the inputs shows it."""
    x = torch.rand(2, 1, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[:, 0, 0, 1] = x[:, 0, 0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = hcrfast.bound(SecondOrder().eval(), x, 1e-7, iterations=1, restarts=2, basis="pixel", solver="lsqr",
                            lsqr=FAST)
    assert np.all(res.divergence == 0)
    assert not np.isinf(res.std).any() and res.infinite_reasons == []
    assert all("below float64's resolution" in r for r in res.params["zero_step_reasons"])


class DeadBeyond(torch.nn.Module):
    """relu(sum(x) - threshold): dead at x and for any step that raises sum(x) by less than ``margin``;
    beside it a live feature, pixel (0, 0) + 1, that the DC mode's (cleaned) null-space step leaves alone."""

    def __init__(self, x, margin):
        super().__init__()
        self.threshold = float(x.sum()) + margin

    def forward(self, t):
        a = t.flatten(1).sum(1, keepdim=True) - self.threshold
        return torch.cat([torch.relu(torch.cat([a, a - 1.0], 1)), t[:, 0, 0, 0:1] + 1.0], 1)


@pytest.mark.parametrize("units", [1.0, 1e-4, 1e-5])
def test_a_dead_relu_keeps_the_infinite_bound_its_null_step_certifies(units):
    """The DC mode's null-space step (1e-2 of the inputs' RMS) leaves the features exactly unchanged,
    really: +inf stands, in any units of the inputs (a probe at 1e-3 of the inputs' largest value woke
    the ReLU and took it away; one sized in absolute units did so for inputs of order 1e-4)."""
    x = units * torch.rand(1, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tb = hcrfast.targeted_bound(DeadBeyond(x, 0.5 * units).eval(), x, 0.05, targets="low:1", method="dense",
                                null_probes=True)
    assert np.isinf(tb.std.reshape(-1)[0]) and tb.from_null_space.ravel()[0]
    assert "a step in the local null space of the Jacobian leaves a(theta+eps) == a(theta) in float64" in \
        tb.infinite_reasons[0]


def test_gaussian_divergence_matches_monte_carlo():
    """E[(f(Z−z)/f(Z) − 1)²] by simulation against exp(‖z‖²/σ²) − 1."""
    rng = np.random.default_rng(0)
    sigma = 1.3
    for znorm in (0.3, 0.8):
        z = rng.standard_normal(5)
        z *= znorm * sigma / np.linalg.norm(z)
        Z = sigma * rng.standard_normal((2_000_000, 5))
        ratio = np.exp(-(((Z - z) ** 2).sum(axis=1) - (Z**2).sum(axis=1)) / (2 * sigma**2))
        samples = (ratio - 1) ** 2
        mc, se = samples.mean(), samples.std() / np.sqrt(samples.size)
        exact = Gaussian(sigma).divergence(z[None])[0]
        assert abs(mc - exact) < 4 * se
        assert se < 0.05 * exact  # the check has power


class FrozenFeatures(torch.nn.Module):
    """Features that do not move although the Jacobian says they do (a straight-through map)."""

    def forward(self, x):
        flat = x.flatten(1)
        return (flat - flat.detach()) + 1.0


@pytest.mark.parametrize("solver", ["lsqr", "dense", "krylov"])
def test_zero_divergence_gives_infinite_bound_with_reason(solver):
    x = torch.rand(2, 1, 4, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            res = algorithm1(FrozenFeatures().eval(), x, 0.5, iterations=2, restarts=2, solver=solver,
                                lsqr=None if solver == "dense" else FAST)  # the dense solve runs no LSQR
    assert np.all(res.divergence == 0)
    assert np.all(np.isinf(res.std[np.abs(scipy.fft.dctn(res.eps, axes=(-2, -1), norm="ortho")) > 0]))
    assert not np.any(np.isnan(res.std)) and np.all(np.isinf(res.mse))
    assert len(res.infinite_reasons) == 4 and "D = 0" in res.infinite_reasons[0]
    assert "+inf" in res.summary()


def test_same_seed_same_result_and_chunking_and_ids_do_not_matter():
    rng = np.random.default_rng(3)
    W = matrix_with_condition(rng, 30, 16, 10.0)
    model = linear_model(W, np.zeros(30), (1, 4, 4))
    x = torch.as_tensor(rng.standard_normal((5, 1, 4, 4)))
    kw = dict(iterations=2, restarts=3, lsqr=FAST)
    a = hcrfast.bound(model, x, 0.3, seed=7, **kw)
    b = hcrfast.bound(model, x, 0.3, seed=7, **kw)
    np.testing.assert_array_equal(a.std, b.std)
    c = hcrfast.bound(model, x, 0.3, seed=8, **kw)
    assert not np.array_equal(a.std, c.std)
    chunked = hcrfast.bound(model, x, 0.3, seed=7, chunk_size=2, **kw)
    # Batches of other sizes round differently inside torch's matmul: equal to the LSQR tolerance.
    np.testing.assert_allclose(chunked.std, a.std, rtol=1e-6)
    part = hcrfast.bound(model, x[3:], 0.3, seed=7, example_ids=[3, 4], **kw)
    np.testing.assert_allclose(part.std, a.std[3:], rtol=1e-6)


class OutOfMemoryAbove(torch.nn.Module):
    """``inner``, but raising CUDA's out-of-memory error on batches above a row limit
    (``grad_rows`` while autograd records, as for the LSQR products; ``rows`` otherwise)."""

    def __init__(self, inner, *, rows=10**9, grad_rows=10**9):
        super().__init__()
        self.inner, self.rows, self.grad_rows = inner, rows, grad_rows
        self.refused = 0

    def forward(self, x):
        limit = self.grad_rows if torch.is_grad_enabled() else self.rows
        if x.shape[0] > limit:
            self.refused += 1
            raise torch.cuda.OutOfMemoryError(f"fake: {x.shape[0]} rows > {limit}")
        return self.inner(x)


def _small_tanh_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 20)).double().eval()


def test_a_chunk_out_of_memory_in_its_products_is_halved_and_nothing_is_lost():
    inner = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(5).standard_normal((6, 1, 4, 4)))
    kw = dict(iterations=2, restarts=2, lsqr=FAST, seed=3)
    want = hcrfast.bound(inner, x, 0.2, chunk_size=1, **kw)
    tight = OutOfMemoryAbove(inner, grad_rows=4).eval()  # 6 and 3 examples x 2 restarts do not fit; 1 does
    got = hcrfast.bound(tight, x, 0.2, chunk_size=6, **kw)
    assert tight.refused >= 2
    np.testing.assert_allclose(got.std, want.std, rtol=1e-6)
    np.testing.assert_array_equal(got.lsqr_iterations, want.lsqr_iterations)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
@pytest.mark.parametrize("solver", ["krylov", "lsqr", "dense"])
def test_one_example_out_of_memory_is_raised_with_what_it_holds_and_the_fixes(solver, monkeypatch):
    """Chunks halve down to one example; one that still does not fit raises the allocator's own error
    (its type kept, so callers' handlers still catch it), with a note of what one example holds by count
    (here 3 pilots of 8 steps of 20 features and 16 inputs, as the chunk size counts them) and how to hold less."""
    inner = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(5).standard_normal((2, 1, 4, 4)))
    tight = OutOfMemoryAbove(inner, grad_rows=2).eval()   # the entry probe (2 rows) fits, no example (3 rows)
    kw = dict(iterations=2, restarts=3, seed=3, solver=solver)
    if solver == "krylov":
        kw.update(krylov_pilots=3, lsqr=hcrfast.LSQROptions(atol=0, btol=0, conlim=0, iter_lim=8))
    if solver == "dense":  # its J is built by vmapped products, whose rows the model does not see: J itself fails
        from hcrfast import dense

        def no_room(model, x, **kw):
            raise torch.cuda.OutOfMemoryError(f"fake: J of {x.shape[0]} example(s)")

        monkeypatch.setattr(dense, "jacobian", no_room)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="fake") as info:
        hcrfast.bound(tight, x, 0.2, chunk_size=2, **kw)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert f"one example alone ran out of memory (chunks are halved down to 1, no further) with solver={solver!r}, " \
           f"16 inputs and 20 features, R = 3" in note
    if solver == "krylov":
        # what hcrfast.krylov.basis_values counts: U, V and a growth copy (3 (k+1)(n+p)) and 2k² eigenvector values
        want = 3 * (3 * 9 * (20 + 16) + 2 * 8 * 8) * 8 / 2**30
        assert f"3 pilot(s) (asked for) of up to 8 steps, ~{want:.2g} GiB as the chunk size counts them" in note
        assert "krylov_pilots=" in note and "solver='lsqr'" in note
    elif solver == "dense":
        assert f"~{(5 * 20 * 16 + 20 * 20 + 8 * 3 * (20 + 16)) * 8 / 2**30:.2g} GiB in float64" in note
    else:
        assert "fewer restarts" in note
    if solver == "dense":
        return
    # any other error in a chunk of one example gets no such note
    with pytest.raises(ZeroDivisionError) as info:
        hcrfast.bound(lambda t: 1 / 0 if torch.is_grad_enabled() and t.shape[0] > 2 else inner(t), x, 0.2,
                      chunk_size=2, **kw)
    assert "one example alone" not in "".join(getattr(info.value, "__notes__", []))


def test_forward_passes_out_of_memory_are_split_without_losing_the_chunk():
    inner = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(6).standard_normal((4, 1, 4, 4)))
    kw = dict(iterations=2, restarts=3, lsqr=FAST, seed=4)
    want = hcrfast.bound(inner, x, 0.2, **kw)
    tight = OutOfMemoryAbove(inner, rows=5).eval()  # the restart and certify forwards (12 rows) do not fit
    got = hcrfast.bound(tight, x, 0.2, chunk_size=4, **kw)
    assert tight.refused >= 2
    np.testing.assert_allclose(got.std, want.std, rtol=1e-6)
    # Split forwards round differently in the last bit, which can move a stopping test by one step.
    assert np.abs(got.lsqr_iterations - want.lsqr_iterations).max() <= 1
    from hcrfast.algorithm import _features

    with torch.no_grad():
        np.testing.assert_allclose(_features(OutOfMemoryAbove(inner, rows=1), x), inner(x), rtol=1e-12, atol=1e-15)
    with pytest.raises(torch.cuda.OutOfMemoryError):  # one row that does not fit is not retried forever
        _features(OutOfMemoryAbove(inner, rows=0), x[:1])
    with pytest.raises(ZeroDivisionError):  # any other error is not retried
        _features(lambda t: 1 / 0, x)


class _RowsSeen(torch.nn.Module):
    """A small CNN (8 channels of 6 x 6 before its pooling) recording the rows of each forward without autograd."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.Tanh(), torch.nn.AvgPool2d(2),
                                       torch.nn.Flatten(), torch.nn.Linear(8 * 3 * 3, 5))
        self.rows = []

    def forward(self, x):
        if not torch.is_grad_enabled():
            self.rows.append(x.shape[0])
        return self.net(x)


def test_forward_passes_on_cpus_run_in_pieces_held_to_their_largest_activation(monkeypatch):
    """A chunk's certifying passes ran every restart's rows, and every earlier iterate's, at once: a 3 x 32-channel
    CNN on 28 x 28 inputs peaked 5.4 GiB above its start for 32 examples at the defaults (1.2 GiB in pieces),
    where the out-of-memory killer ends a run before any MemoryError could be split. The rows a forward runs at
    once are now held to FORWARD_PIECE_BYTES of the model's largest activation per row, counted by hooks during
    its first forward that hcrfast runs anyway: here 8 x 6 x 6 values (the convolution's and the Tanh's outputs),
    by hand, in float32; in float64, for the model and its float64 copy alike, the convolution's column buffer,
    1 x 3 x 3 values per output position (1 x 3 x 3 x 6 x 6). The bounds are the same problem's, to float64's
    rounding of another batch shape."""
    from hcrfast import algorithm

    model = _RowsSeen().double().eval()
    x = torch.as_tensor(np.random.default_rng(3).standard_normal((4, 1, 6, 6)))
    per_row = 9 * 6 * 6 * 8
    with algorithm.pieces_scope():   # (a public call's: hcrfast.validation.entry_point)
        assert algorithm._piece_rows(model, x) is None   # (not measured yet: its first forward runs whole)
        algorithm.forward(model, x)
        assert algorithm._SCOPE.counts[model][0::2] == (8 * 6 * 6, 9 * 6 * 6)
        assert algorithm._piece_rows(model, torch.zeros(10, 1, 6, 6, dtype=torch.float64)) == 2**25 // per_row
        assert algorithm._piece_rows(model, torch.zeros(10, 1, 6, 6)) == 2**25 // (8 * 6 * 6 * 4)   # (float32)
        algorithm.forward(lambda t: t, x)
        assert algorithm._piece_rows(lambda t: t, x) is None   # (a callable has no modules to measure)
        float32 = _RowsSeen().eval()   # its float64 copy is pieced by the model's count, in float64's bytes
        copy64 = hcrfast.validation.float64_model(float32, x.float(), True)
        algorithm.forward(float32, x.float())
        assert algorithm._piece_rows(copy64, x) == 2**25 // per_row
    assert algorithm._piece_rows(model, x) is None   # (outside a call: nothing kept, nothing pieced)
    kw = dict(iterations=3, restarts=4, seed=1, solver="dense")
    want = hcrfast.bound(model, x, 0.3, **kw)
    assert max(model.rows) >= 4 * 4   # (the last iterates certified at once: examples x restarts)
    monkeypatch.setattr(algorithm, "FORWARD_PIECE_BYTES", 3 * per_row)
    model.rows.clear()
    got = hcrfast.bound(model, x, 0.3, **kw)
    # the entry and exit checks run a few rows of their own (at most 8, and 5 rows of one example), not pieced
    assert model.rows and max(model.rows) <= hcrfast.validation.REPEAT_ROWS
    assert sorted(model.rows).count(3) >= 10
    seen, model.rows = model.rows, []   # the same call again: measured afresh, in the same pieces, to the same bits
    assert hcrfast.bound(model, x, 0.3, **kw).std.tobytes() == got.std.tobytes() and model.rows == seen
    np.testing.assert_allclose(got.std, want.std, rtol=1e-12)
    np.testing.assert_allclose(got.divergence, want.divergence, rtol=1e-12)
    with torch.no_grad():   # (the pieces joined in the rows' order)
        np.testing.assert_array_equal(algorithm.forward(model, x), model(x))


@pytest.mark.parametrize("solver", ["lsqr", "krylov"])
def test_cpu_chunks_of_the_matrix_free_solvers_are_held_to_their_graphs_memory(solver, monkeypatch):
    """The LSQR and Krylov chunks on CPUs counted the solver's vectors only: a 3 x 32-channel CNN, 256 examples x 25
    restarts under LSQR in one chunk, peaked 5.6 GiB above its start in its product graphs. A chunk's rows (examples
    x restarts, or x pilots) are now held to GRAPH_BYTES of twice the sum of a row's activations, counted by hand
    here: the float32 outputs of the convolution (8 x 6 x 6), Tanh (the same), the pooling and Flatten (8 x 3 x 3
    each), and the Linear, the Sequential and the model itself (5 each)."""
    from hcrfast import algorithm

    model = _RowsSeen().eval()
    x = torch.as_tensor(np.random.default_rng(3).standard_normal((6, 1, 6, 6)), dtype=torch.float32)
    row = 2 * (288 + 288 + 72 + 72 + 5 + 5 + 5) * 4
    restarts = 3
    rows = restarts if solver == "lsqr" else 1   # (Krylov: one pilot's graph per example)
    monkeypatch.setattr(algorithm, "GRAPH_BYTES", 2 * rows * row + 1)   # two examples' rows a chunk
    kw = dict(iterations=2, restarts=restarts, seed=0, solver=solver, certify=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = hcrfast.bound(model, x, 0.3, **kw)
        assert got.params["run"]["chunk_size"] == 2
        monkeypatch.setattr(algorithm, "GRAPH_BYTES", 2**31)
        assert hcrfast.bound(model, x, 0.3, **kw).params["run"]["chunk_size"] == 6


class _FailsOnceAfterItsFirstBlock(torch.nn.Module):
    """A two-block CNN whose forward runs out of memory once, after its first block, when ``fail`` is set."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Tanh())
        self.b = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(144, 6))
        self.fail = False

    def forward(self, x):
        h = self.a(x)
        if self.fail and x.shape[0] > 3:
            self.fail = False
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:1] DefaultCPUAllocator: can't allocate memory")
        return self.b(h)


def test_the_activation_count_is_one_forwards_whatever_splits_it_and_sees_through_hcrfasts_wrappers():
    """The count summed the outputs of every forward in its block: a first forward split on out-of-memory (the
    failed attempt's first block and both halves) counted 1620 values a row against 594, which changed the
    automatic chunk; a traced model inside hcrfast's per-feature wrapper was counted by the wrapper's outputs,
    though alone it is not counted. Now one forward's count (the largest of those that returned), and the test of
    what the hooks saw is on the user's own model. By hand: Conv2d and Tanh 144 values a row each, Sequential a 144,
    Flatten 144, Linear, Sequential b and the model 6 each; the Conv2d's float64 column buffer 1 x 3 x 3 x 36."""
    from hcrfast import algorithm

    model = _FailsOnceAfterItsFirstBlock().eval()
    x = torch.randn(6, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    for fail in (False, True):
        model.fail = fail
        with algorithm.pieces_scope():
            algorithm.forward(model, x)
            assert algorithm._SCOPE.counts[model] == (144, 4 * 144 + 3 * 6, 9 * 36)
        assert not model.fail
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Tanh(), torch.nn.Flatten(),
                              torch.nn.Linear(144, 6)).eval()
    traced = torch.jit.trace(net, x)
    for user in (traced, lambda t: net(t)):
        wrapped = hcrfast.noise.PerFeatureStd(user, np.full(6, 0.3))
        with algorithm.pieces_scope():
            algorithm.forward(wrapped, x)
            assert algorithm._SCOPE.counts[wrapped] is None
    wrapped = hcrfast.noise.PerFeatureStd(net, np.full(6, 0.3))
    with algorithm.pieces_scope():
        algorithm.forward(wrapped, x)
        assert algorithm._SCOPE.counts[wrapped][0] == 144


def test_the_activation_count_leaves_no_hook_behind_and_knows_what_it_cannot_see():
    """The count's hooks were registered in one expression: a submodule that refuses a hook (a scripted one) left the
    root's and the first children's hooks on the model for good. A user's pre-hook that doubles the rows halved the
    count (ours ran after it); a traced model, whose submodules run without their hooks, was counted by its output
    alone (pieces without limit): now not counted (no pieces, as before)."""
    from hcrfast import algorithm

    x = torch.randn(4, 1, 4, 4)

    def hooks(model):
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    scripted = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh(),
                                   torch.jit.script(torch.nn.Linear(8, 8))).eval()
    with algorithm.pieces_scope():
        algorithm.forward(scripted, x)
        assert algorithm._SCOPE.counts[scripted] is None
    hcrfast.bound(scripted, x, 0.1, iterations=2, restarts=2)
    assert hooks(scripted) == 0
    doubled = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8)).eval()
    doubled.register_forward_pre_hook(lambda m, args: (torch.cat([args[0], args[0]]),))
    with algorithm.pieces_scope():
        algorithm.forward(doubled, x)
        assert algorithm._SCOPE.counts[doubled][0] == 2 * 16   # (Flatten's 16 values a row, twice the rows)
    traced = torch.jit.trace(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 64), torch.nn.Linear(64, 8)),
                             x)
    with algorithm.pieces_scope():
        algorithm.forward(traced, x)
        assert algorithm._SCOPE.counts[traced] is None
    assert hooks(doubled) == 1


def test_the_dense_jacobians_passes_on_a_cpu_are_held_to_the_graphs_budget(monkeypatch):
    """The dense J's vmapped passes were sized by values only (2^24 over n + p a row): a 3 x 32-channel CNN with 512
    features took every example's 512 rows in one pass, ~205 MiB an example (4,909 MiB above start for 24
    examples). Its rows per pass are now held to GRAPH_BYTES over a row's graph, as the LSQR and Krylov chunks are
    (923 MiB, and 2x sooner). By hand here: the float64 outputs of the convolution (8 x 6 x 6), Tanh (the same),
    the pooling and Flatten (8 x 3 x 3 each), the Linear, the Sequential and the model (5 each), twice; the same
    bounds to rounding."""
    from hcrfast import algorithm, dense

    model = _RowsSeen().double().eval()
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((6, 1, 6, 6)))
    kw = dict(iterations=2, restarts=2, seed=0, solver="dense")
    passes = []
    real = dense._fill_jacobian
    monkeypatch.setattr(dense, "_fill_jacobian", lambda out, f, x, mode, rows, *a, **k:
                        passes.append(rows) or real(out, f, x, mode, rows, *a, **k))
    row = 2 * (288 + 288 + 72 + 72 + 5 + 5 + 5) * 8
    want = hcrfast.bound(model, x, 0.2, **kw)   # (the last J is the solve's; the checks' before it ask their rows)
    assert passes[-1] == min(dense.default_chunk_rows(5, 36), 2**31 // row) == 2**31 // row
    monkeypatch.setattr(algorithm, "GRAPH_BYTES", 7 * row)
    passes.clear()
    got = hcrfast.bound(model, x, 0.2, **kw)
    assert passes[-1] == 7
    np.testing.assert_allclose(got.std, want.std, rtol=1e-12)


class _Squeezed(torch.nn.Module):
    """A model ending in .squeeze(), as many classifiers do: (B, 8) for B rows, (8,) for one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 8))
        self.rows = []

    def forward(self, x):
        if not torch.is_grad_enabled():
            self.rows.append(x.shape[0])
        return self.net(x).squeeze()


def test_float64_convolutions_pieces_count_their_column_buffers():
    """torch's float64 convolutions on CPUs (no mkldnn) unfold the whole piece into a column buffer,
    in_channels / groups x kernel values per output position: 9.1 times a 3 x 3 convolution's output of 32 to 32
    channels, and pieces held to 32 MiB of outputs peaked at ~300 MiB (a targeted_bound of 4 examples of a CNN,
    592 MiB in all). The buffer's values per row are counted (torch's own F.unfold gives them), and float64
    pieces held to them; float32 ones (mkldnn) to the outputs. A 400-row forward now peaks within the budget."""
    from hcrfast import algorithm

    for groups in (1, 4):   # (grouped: each group's columns, and 2.5 outputs of copies; a review's finding)
        conv = torch.nn.Conv2d(8, 16, (3, 5), stride=2, padding=1, groups=groups)
        x = torch.zeros(3, 8, 11, 13)
        cols = torch.nn.functional.unfold(x[:, :8 // groups], (3, 5), stride=2, padding=1)
        out = conv(x)
        assert algorithm._conv_columns(conv, (x,), out) == cols.numel() + (5 * out.numel() // 2 if groups > 1 else 0)
    for conv, x in ((torch.nn.Conv1d(4, 6, 7), torch.zeros(2, 4, 20)),
                    (torch.nn.Conv3d(4, 6, 3, padding=1), torch.zeros(2, 4, 5, 6, 7)),
                    (torch.nn.ConvTranspose2d(4, 6, 3, groups=2), torch.zeros(2, 4, 5, 7)),
                    (torch.nn.Conv2d(4, 6, 3, dilation=2), torch.zeros(2, 4, 9, 9))):
        want = {torch.nn.Conv1d: 2 * 4 * 7 * 14, torch.nn.Conv3d: 2 * 4 * 27 * 5 * 6 * 7,
                torch.nn.ConvTranspose2d: 2 * 3 * 9 * 5 * 7 + 5 * (2 * 6 * 7 * 9) // 2,
                torch.nn.Conv2d: 0}[type(conv)]   # (dilated: 0)
        assert algorithm._conv_columns(conv, (x,), conv(x)) == want
    assert algorithm._conv_columns(torch.nn.Linear(3, 4), (torch.zeros(2, 3),), torch.zeros(2, 4)) == 0
    code = textwrap.dedent("""
        import torch
        from hcrfast import algorithm
        torch.set_num_threads(1)
        model = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.Tanh()).double().eval()
        x = torch.rand(400, 32, 28, 28, dtype=torch.float64)
        def vm(field):
            line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
            return int(line.split()[1]) / 1024
        with algorithm.pieces_scope():
            algorithm.forward(model, x[:16])
            base = vm("VmRSS")
            algorithm.forward(model, x)
        print(vm("VmHWM") - base)
    """)
    if not os.path.exists("/proc/self/status"):
        pytest.skip("reads peak memory from /proc/self/status: Linux only")
    peaks = []
    for _ in range(3):   # (the least of three: glibc's heap at times grows past the pieces, to ~330 MiB once in 3)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        peaks.append(float(done.stdout.strip().splitlines()[-1]))
    # the output (78 MiB for 400 rows) and its pieces': 32 MiB of columns a piece (~150 MiB in all), not the ~300
    # of 167 rows' (~330 MiB every time)
    assert min(peaks) < 200, peaks


def test_pieces_have_two_rows_or_more_so_a_squeezed_models_pieces_join(monkeypatch):
    """The pieces were ``rows`` rows and the rest: 7 rows in pieces of 3 ran 3, 3 and 1, and a model ending in
    .squeeze() returned (8,) for the last, which torch.cat refused against (3, 8) ("Tensors must have same number
    of dimensions"), where the whole batch ran. The pieces are now as many as the budget needs, of sizes one apart
    and of 2 rows at least (2, 2 and 3 here), to the unpieced bounds."""
    from hcrfast import algorithm

    model = _Squeezed().double().eval()
    x = torch.as_tensor(np.random.default_rng(5).standard_normal((7, 1, 4, 4)))
    kw = dict(iterations=2, restarts=2, seed=0, solver="dense")
    want = hcrfast.bound(model, x, 0.2, **kw)
    monkeypatch.setattr(algorithm, "FORWARD_PIECE_BYTES", 3 * 32 * 8)   # (the Linear's 32 float64 values a row)
    model.rows.clear()
    got = hcrfast.bound(model, x, 0.2, **kw)
    assert [2, 2, 3] == model.rows[1:4]   # (the probe's second forward of the batch; the probes' rows alone: 1s)
    np.testing.assert_allclose(got.std, want.std, rtol=1e-12)
    with algorithm.pieces_scope():
        algorithm.forward(model, x)
        for B, sizes in ((7, [2, 2, 3]), (6, [3, 3]), (3, [3]), (2, [2])):
            model.rows.clear()
            out = algorithm.forward(model, x[:B])
            assert model.rows == sizes and out.shape == (B, 8)


def test_a_calls_first_forward_counts_on_its_first_rows_and_runs_the_rest_in_pieces(monkeypatch):
    """A call's first forward of a model ran the whole batch at once (it is the one the activations are counted
    in): a 3 x 32-channel CNN took 290 KB a row in it, 1.16 GiB above its start for 4,000 inputs in
    dithered_accuracy, 17 GB for the 60,000 MNIST training images. Its first FIRST_PIECE_ROWS rows now run first,
    counted, and the rest in the pieces that count gives (here 3 rows: the Linear's 32 float64 values); a batch of
    fewer than twice as many runs whole. The features are the whole batch's, to the rounding of other shapes."""
    from hcrfast import algorithm

    model = _Squeezed().double().eval()
    monkeypatch.setattr(algorithm, "FORWARD_PIECE_BYTES", 3 * 32 * 8)
    x = torch.as_tensor(np.random.default_rng(6).standard_normal((40, 1, 4, 4)))
    with torch.no_grad():
        whole = model.net(x)
    for B, sizes in ((40, [16, 3, 3, 3, 3, 3, 3, 3, 3]), (31, [31])):
        model.rows.clear()
        with algorithm.pieces_scope():
            got = algorithm.forward(model, x[:B])
            assert algorithm._SCOPE.counts[model] == (32, 16 + 32 + 32 + 8 + 8 + 8, 0)   # (no convolution)
        assert model.rows == sizes
        np.testing.assert_allclose(got, whole[:B], rtol=1e-13)
    model.rows.clear()   # dithered_accuracy's features (which ran whole, with no call's count at all)
    u = hcrfast.dithered_accuracy(model, None, x, None, 0.1, draws=2, metric="cosine")
    assert model.rows[0] == 16 and max(model.rows[1:]) <= max(3, hcrfast.validation.REPEAT_ROWS) and u.clean == 1.0


@pytest.mark.parametrize("kind, shape", [("sum", "()"), ("transpose", "(3, 40)")])
def test_a_model_without_its_batch_axis_first_is_named_with_its_shape_whatever_the_first_piece(kind, shape):
    """A call's first forward runs 16 rows first: a model returning a sum, or its features transposed, had its
    pieces joined by torch.cat, which failed ("zero-dimensional tensor ... cannot be concatenated", told as the
    model's own error) or showed a shape (6, 16) the model never returned. The whole batch now runs again, and the
    check names the shape it returns, as for a batch of fewer rows; the head's alike in dithered_accuracy."""
    lin = torch.nn.Linear(16, 3).eval()
    fn = {"sum": lambda t: lin(t.flatten(1)).sum(), "transpose": lambda t: lin(t.flatten(1)).T}[kind]

    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return fn(x)

    x = torch.randn(40, 1, 4, 4)
    with pytest.raises(ValueError, match=re.escape(f"the model returned shape {shape} for a batch of 40 examples")):
        hcrfast.bound(Bad().eval(), x, 0.1, iterations=1, restarts=2)
    with pytest.raises(ValueError, match=re.escape(f"the head returned {shape} for 40 feature vectors")):
        hcrfast.dithered_accuracy(torch.nn.Flatten().eval(), Bad().eval(), x, None, 0.1, draws=1, metric="cosine")


def test_a_forward_in_pieces_gives_the_c_heaps_free_pages_back_every_8_pieces_and_at_its_end(monkeypatch):
    """glibc kept extending its heap over the freed buffers of a forward's pieces, at times: a CNN's certifying
    forward in 2 MiB pieces rose to 3.7 GiB of RSS with 245 MiB in use, in 2 of 6 runs (3.4-3.8 GiB against
    0.5 GiB for the same call). Its free pages are now given back (malloc_trim) after every 8 pieces and after the
    last: 3 of 3 runs at 487-491 MiB. The pieces' outputs are unchanged."""
    import platform

    from hcrfast import algorithm, backend

    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert backend._malloc_trim() is not None
    trims = []
    monkeypatch.setattr(algorithm, "trim_host_heap", lambda: trims.append(len(seen)))
    seen = []

    def compute(t):
        seen.append(t.shape[0])
        return t * 2

    x = torch.arange(40.0).reshape(20, 2)
    out = algorithm._in_pieces(compute, lambda a, b: torch.cat([a, b]), 2, x)
    assert seen == [2] * 10 and trims == [8, 10] and torch.equal(out, x * 2)
    trims.clear()
    algorithm._in_pieces(compute, lambda a, b: torch.cat([a, b]), None, x)   # (one piece: nothing freed between)
    assert trims == []
    backend.trim_host_heap()   # (the real one: harmless where there is no glibc)


class _Nested(torch.nn.Module):
    """Returns its 40-wide hidden layer inside a dict inside a tuple, beside an LSTM's (PackedSequence, (h, c))."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 40)
        self.lstm = torch.nn.LSTM(4, 24)

    def forward(self, x):
        h = self.lin(x.flatten(1))
        seq = torch.nn.utils.rnn.pack_padded_sequence(x.flatten(2).permute(2, 0, 1)[:4], [4] * x.shape[0])
        return ({"hidden": h},), self.lstm(seq)


class _Functional(torch.nn.Module):
    """A 16 -> 4096 -> 8 MLP of Parameters and functions, no submodule."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(4096, 16) / 4)
        self.w2 = torch.nn.Parameter(torch.randn(8, 4096) / 64)

    def forward(self, x):
        return torch.tanh(x.flatten(1) @ self.w1.T) @ self.w2.T


def test_the_activation_count_sees_nested_outputs_and_not_what_no_submodule_shows():
    """The count looked one level into a tuple or list: an LSTM's (PackedSequence, (h, c)) and a tuple holding a
    dict were not counted (an LSTM of 256 was counted as the 8 features after it, 128 times too few). A Module
    without submodules, computing by functions, was counted by its output alone (its 4096-wide hidden layer
    unseen: pieces of 50 MiB of it against 32); now not counted (no pieces, as before), as a torch module alone
    (nn.Linear: its output is all it holds) still is."""
    from hcrfast import algorithm

    x = torch.randn(5, 1, 4, 4)
    nested = torch.nn.Sequential(_Nested()).eval()
    with algorithm.pieces_scope():
        algorithm.forward(nested, x)
        # per row: the Linear's 40; the LSTM's packed data (4 steps x 24), its batch sizes (4 int64 values over 5
        # rows: 1 a row), its h and c (24 each); and _Nested's and the Sequential's outputs, the dict's 40 and the
        # LSTM's, each
        lstm = 4 * 24 + 1 + 24 + 24
        assert algorithm._SCOPE.counts[nested] == (4 * 24, 40 + lstm + 2 * (40 + lstm), 0)
    functional, linear = _Functional().eval(), torch.nn.Linear(16, 8).eval()
    graph = torch.fx.symbolic_trace(_Functional()).eval()   # (a torch class, but no layer of torch's own)
    with algorithm.pieces_scope():
        for m in (functional, linear, graph):
            algorithm.forward(m, x.flatten(1))
        assert algorithm._SCOPE.counts[functional] is None and algorithm._SCOPE.counts[graph] is None
        assert algorithm._SCOPE.counts[linear] == (8, 8, 0)


def test_the_activation_count_leaves_other_threads_forwards_of_the_model_out():
    """The hooks are on the Module, and another thread running it meanwhile (a server) was counted too: the count
    changed from run to run, or came out None (no pieces). Here the model's forward has another thread run its
    first layer on 1,000 rows of 64 values, and waits for it: that forward is not counted."""
    from hcrfast import algorithm

    class Served(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 8)

        def forward(self, x):
            other = threading.Thread(target=lambda: self.lin(torch.randn(1000, 64, 16)))
            other.start()
            other.join()
            return self.lin(x.flatten(1))

    model = Served().eval()
    with algorithm.pieces_scope():
        algorithm.forward(model, torch.randn(4, 1, 4, 4))
        assert algorithm._SCOPE.counts[model] == (8, 16, 0)


class BatchShaped(torch.nn.Module):
    """Features that never move (a straight-through constant) but whose last bits depend on the batch
    size, as a device's kernels may round differently for other shapes; the first pass of more than one
    row without autograd after ``armed`` is set runs out of memory, once (a transient shortage); with
    ``skip`` = k the (k+1)-th such pass does, the first k run whole."""

    armed = failed = False
    skip = 0

    def forward(self, x):
        if self.armed and not self.failed and not torch.is_grad_enabled() and x.shape[0] > 1:
            if self.skip:
                self.skip -= 1
            else:
                self.failed = True
                raise torch.cuda.OutOfMemoryError("fake: once")
        flat = x.flatten(1)
        return flat - flat.detach() + 1.0 + x.shape[0] * 2.0**-40


@pytest.mark.parametrize("probe", ["certify", "rounded_away", "features_move"])
def test_the_two_passes_behind_a_d_of_0_are_split_alike(probe):
    """D = 0 is decided by comparing a(θ+ε) with a(θ) bit for bit: a transient out-of-memory error that
    splits one of the two passes and not the other made them differ by the batch shape's rounding, so a
    valid +inf was lost. Both passes are now split together."""
    from hcrfast import algorithm

    x = torch.as_tensor(np.random.default_rng(0).standard_normal((4, 1, 2, 2)))
    eps = np.full((4, 4), 1e-3)
    model = BatchShaped()
    model.armed = True
    if probe == "certify":
        _, z = algorithm._certified_shift(model, x, eps)
        assert model.failed and np.all(z == 0)
    elif probe == "rounded_away":
        model.skip = 1  # a(θ), whose largest value sizes the probe, runs whole: the probe's pair fails
        assert not algorithm._rounded_away(model, x, eps).any()  # still unchanged: a real D = 0
        assert model.failed
    elif probe == "features_move":  # the probe behind 'J = 0 here' (a blind example)
        assert not algorithm._features_move(model, x).any() and model.failed


@pytest.mark.parametrize("entry", ["bound", "targeted_bound", "gauss_newton_attack"])
def test_the_whole_batch_forward_out_of_memory_is_split_too(entry):
    """The first forwards of a call (the clean features and the independence probe) run on the whole
    batch: they are split as every later one, so a batch that fits only chunk by chunk still runs."""
    inner = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((12, 1, 4, 4)))
    call = getattr(hcrfast, entry)
    kw = dict(bound=dict(iterations=2, restarts=2, solver="dense"), targeted_bound=dict(targets="low:2"),
              gauss_newton_attack=dict(draws=2, steps=2))[entry]
    want = call(inner, x, 0.2, chunk_size=2, **kw)
    tight = OutOfMemoryAbove(inner, rows=8).eval()  # the whole batch (12 rows) does not fit; a chunk does
    got = call(tight, x, 0.2, chunk_size=2, **kw)
    assert tight.refused >= 2
    # split forwards round in the last bits, which the attack's iterations carry along (2e-10 seen)
    np.testing.assert_allclose(got.std, want.std, rtol=1e-10 if entry != "gauss_newton_attack" else 1e-7)


def test_a_split_forward_of_a_model_that_returns_no_tensor_is_named_not_a_torch_cat_error():
    inner = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((4, 1, 4, 4)))

    class Dict(torch.nn.Module):
        def forward(self, t):
            return {"features": inner(t)}

    with pytest.raises(TypeError, match="must return a torch.Tensor of features, got dict"):
        hcrfast.bound(OutOfMemoryAbove(Dict(), rows=2).eval(), x, 0.2)


class RecordsPrecision(torch.nn.Module):
    """``inner``, noting torch's float32 matmul and convolution settings at every call."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, set()

    def forward(self, x):
        self.seen.add((torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision))
        return self.inner(x)


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="torch before the fp32_precision settings")
@pytest.mark.parametrize("tf32", [False, True])
def test_bound_runs_in_ieee_float32_unless_tf32_is_allowed(tf32):
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((2, 1, 4, 4)))
    model = RecordsPrecision(_small_tanh_net()).eval()
    try:
        torch.backends.cuda.matmul.fp32_precision = torch.backends.cudnn.conv.fp32_precision = "tf32"
        res = hcrfast.bound(model, x, 0.2, iterations=1, restarts=1, lsqr=FAST, tf32=tf32)
        # with tf32, only the probe of how the model treats its rows runs in IEEE float32
        assert model.seen == ({("tf32", "tf32"), ("ieee", "ieee")} if tf32 else {("ieee", "ieee")})
        assert res.params["tf32"] is tf32
        assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == ("tf32", "tf32")
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


class RoundsLikeTF32(torch.nn.Module):
    """``inner``, with an error of the kind TF32 makes where torch allows it: 1e-3 of the features,
    and another one for a row alone than in a batch (cuBLAS and cuDNN pick other kernels)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        out = self.inner(x)
        if torch.backends.cuda.matmul.fp32_precision == "tf32" and out.dtype == torch.float32:  # (never float64)
            out = out * (1 + 1e-3 * (x.shape[0] == 1))
        return out


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="torch before the fp32_precision settings")
@pytest.mark.parametrize("entry", ["bound", "targeted_bound"])
def test_tf32_rounding_is_not_taken_for_examples_mixed(entry):
    """The probe that refuses models mixing a batch's rows compares a row alone with the batch at
    1e-4; under tf32=True it runs in IEEE float32, where TF32's kernel-dependent rounding is absent."""
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((3, 1, 4, 4))).float()
    model = RoundsLikeTF32(_small_tanh_net().float()).eval()   # TF32 rounds float32 only: its float64 copy is IEEE
    call = functools.partial(getattr(hcrfast, entry), model, x, 0.2)
    kwargs = dict(targets=[0, 5]) if entry == "targeted_bound" else dict(iterations=1, restarts=1, lsqr=FAST)
    try:
        torch.backends.cuda.matmul.fp32_precision = torch.backends.cudnn.conv.fp32_precision = "tf32"
        res = call(tf32=True, **kwargs)
        assert np.all(np.isfinite(res.std)) and np.all(res.std.reshape(3, -1)[:, 0] > 0)  # mode 0 of each example
        # the same probe run in TF32 reads the 1e-3 as examples mixed: the test can fail
        with pytest.raises(ValueError, match="mixes the examples"), torch.no_grad():
            validation.probe_independent(model, x, model(x).reshape(3, -1))
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


def test_out_of_memory_errors_are_recognised():
    from hcrfast.algorithm import _is_oom

    class OutOfMemoryError(Exception):  # CuPy's is cupy.cuda.memory.OutOfMemoryError
        pass

    assert _is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert _is_oom(MemoryError())
    with pytest.raises(RuntimeError) as cpu:  # torch's CPU allocator (32 PiB), a plain RuntimeError
        torch.empty(2**55, dtype=torch.uint8)
    assert _is_oom(cpu.value)
    assert _is_oom(OutOfMemoryError("Out of memory allocating 1,048,576 bytes"))
    assert _is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    # CuPy's CUDARuntimeError (a RuntimeError) outside its pool, numba-cuda's CudaAPIError (not one)
    assert _is_oom(RuntimeError("cudaErrorMemoryAllocation: out of memory"))
    # torch's AcceleratorError, where an allocation outside its caching allocator failed
    accelerator_error = getattr(torch, "AcceleratorError", RuntimeError)
    assert _is_oom(accelerator_error("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"))
    assert not _is_oom(accelerator_error("CUDA error: an illegal memory access was encountered"))

    class CudaAPIError(Exception):
        pass

    assert _is_oom(CudaAPIError("[CUresult.CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY"))
    assert not _is_oom(CudaAPIError("[CUresult.CUDA_ERROR_INVALID_VALUE] Call to cuLaunchKernel"))
    assert not _is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert not _is_oom(ValueError("out of memory"))


@pytest.mark.parametrize("linearize_at", ["input", "current"])
def test_warm_start_computes_algorithm_1s_iterates_with_fewer_lsqr_steps(linearize_at):
    """Solved to high accuracy, warm and cold starts give the same Algorithm 1 iterates (the
    same bound); at the default tolerance the warm solves after the first need far fewer steps."""
    model = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(8).standard_normal((3, 1, 4, 4)))
    tight = hcrfast.LSQROptions(atol=1e-13, btol=1e-13, conlim=1e14, iter_lim=2000)
    # Algorithm 1's last iterates (iterates="all" would also take the earlier ones, which differ
    # more where the solves stop early)
    kw = dict(iterations=4, restarts=2, seed=2, linearize_at=linearize_at, iterates="last")
    warm = hcrfast.bound(model, x, 0.2, lsqr=tight, warm_start=True, **kw)
    cold = hcrfast.bound(model, x, 0.2, lsqr=tight, warm_start=False, **kw)
    np.testing.assert_allclose(warm.std, cold.std, rtol=1e-6)
    np.testing.assert_allclose(warm.divergence, cold.divergence, rtol=1e-8)
    assert warm.params["warm_start"] and not cold.params["warm_start"]
    # An ill-conditioned 64-input net, where a solve from zero takes many steps.
    rng = np.random.default_rng(9)
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 96), torch.nn.Tanh(),
                              torch.nn.Linear(96, 80)).double().eval()
    with torch.no_grad():
        net[1].weight.copy_(torch.as_tensor(matrix_with_condition(rng, 96, 64, 1e3)))
    x = torch.as_tensor(rng.standard_normal((3, 1, 8, 8)))
    warm = hcrfast.bound(net, x, 0.2, warm_start=True, solver="lsqr", **kw)
    cold = hcrfast.bound(net, x, 0.2, warm_start=False, solver="lsqr", **kw)
    np.testing.assert_array_equal(warm.lsqr_iterations[..., 0], cold.lsqr_iterations[..., 0])
    assert warm.lsqr_iterations[..., 1:].sum() < 0.5 * cold.lsqr_iterations[..., 1:].sum()
    assert np.median(warm.std) >= 0.95 * np.median(cold.std)
    with pytest.raises(TypeError, match="warm_start must be True or False"):
        hcrfast.bound(model, x, 0.2, warm_start="yes", **kw)


def test_on_a_linear_model_the_warm_start_of_every_later_solve_is_its_exact_solution():
    """a = Wθ + b with n > p: z(j−1) = W ε(j−1) exactly, so z̃(j) = c·z(j−1) with c = ‖z‖/‖z(j−1)‖ (here
    about sqrt(n/p), as z(1) is z projected on W's range) is solved by x0 = c·ε(j−1): LSQR stops at its
    first test, where a start from zero (or from a wrongly scaled ε(j−1)) runs a whole solve."""
    rng = np.random.default_rng(4)
    W = matrix_with_condition(rng, 40, 24, 30.0)
    model = linear_model(W, rng.standard_normal(40), (1, 4, 6))
    x = torch.as_tensor(rng.standard_normal((3, 1, 4, 6)))
    kw = dict(iterations=3, restarts=2, basis="pixel", solver="lsqr", lsqr=FAST)
    warm = hcrfast.bound(model, x, 0.3, warm_start=True, **kw)
    cold = hcrfast.bound(model, x, 0.3, warm_start=False, **kw)
    assert np.all(cold.lsqr_iterations[..., 1:] >= 10)
    assert np.all(warm.lsqr_iterations[..., 1:] <= 2)
    np.testing.assert_allclose(warm.std, cold.std, rtol=1e-6)


def test_with_lsqr_damping_every_solve_starts_from_zero_whatever_warm_start_says():
    """LSQR from x0 (SciPy's semantics) minimizes ||J eps - z||^2 + damp^2 ||eps - x0||^2: with damp > 0 a warm
    solve pulled toward the last step, not 0, and its bounds were those of another problem (39% from the damped
    solve's on a tanh MLP, where the README said "same iterates when solved exactly"). With damping the call now
    solves every step from zero, says so, and records it."""
    model = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(8).standard_normal((3, 1, 4, 4)))
    damped = hcrfast.LSQROptions(damp=0.5, atol=1e-14, btol=1e-14, conlim=0, iter_lim=400)
    kw = dict(iterations=4, restarts=2, seed=2, solver="lsqr", lsqr=damped)
    with pytest.warns(UserWarning, match=r"warm_start=True does not apply with LSQROptions\(damp=0.5\)"):
        warm = hcrfast.bound(model, x, 0.2, warm_start=True, **kw)
    cold = hcrfast.bound(model, x, 0.2, warm_start=False, **kw)
    np.testing.assert_array_equal(warm.std, cold.std)
    np.testing.assert_array_equal(warm.lsqr_iterations, cold.lsqr_iterations)
    assert warm.params["warm_start"] is False
    # the damped solve itself: each of the first solves against SciPy's LSQR on the same J and z
    # (tests/test_lsqr.py holds the solver to SciPy's iterates); here the call's own: damping shrinks eps
    undamped = hcrfast.bound(model, x, 0.2, warm_start=False, **{**kw, "lsqr": dataclasses.replace(damped, damp=0.0)})
    assert np.linalg.norm(cold.eps) < np.linalg.norm(undamped.eps)


def _relu_net_with_dead_units():
    """64 → 96 ReLU (a third of the units off for inputs of size ~1) → 80: J has zero rows and a null space."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 96), torch.nn.ReLU(),
                              torch.nn.Linear(96, 40), torch.nn.ReLU()).double().eval()
    with torch.no_grad():
        net[1].bias[:32] = -100.0
    return net


def test_dense_solver_is_algorithm_1_with_exact_minimum_norm_solves():
    """The test's own Algorithm 1: J from torch.func.jacrev, each step numpy.linalg.lstsq (the
    minimum-norm least-squares solution), z from the test's forward passes; then the bound."""
    net = _relu_net_with_dead_units()
    rng = np.random.default_rng(4)
    x = torch.as_tensor(rng.standard_normal((3, 1, 8, 8)))
    sigma, size, R, iterations = 0.3, 0.05, 3, 4
    res = algorithm1(net, x, sigma, size=size, iterations=iterations, restarts=R, seed=1, solver="dense")
    assert res.params["solver"] == "dense" and np.all(res.lsqr_istop == -1) and np.all(res.lsqr_iterations == 0)
    with torch.no_grad():
        f0 = net(x).numpy()
    z0 = hcrfast.start_vectors(np.arange(3), R, 40, seed=1, size=size, sigma=sigma).reshape(3, R, 40)
    want, want_last = np.zeros((3, 64)), np.zeros((3, 64))
    ranks, nonzero_rows = [], []
    for b in range(3):
        J = torch.func.jacrev(lambda t: net(t[None]).reshape(-1))(x[b]).reshape(40, 64).detach().numpy()
        assert 0 < (np.abs(J).max(axis=1) == 0).sum() < 40  # dead features: zero rows
        ranks.append(np.linalg.matrix_rank(J))
        nonzero_rows.append((np.abs(J).max(axis=1) > 0).sum())
        target = np.linalg.norm(z0[b], axis=1)
        zt = z0[b]
        for j in range(iterations):
            eps = np.linalg.lstsq(J, zt.T, rcond=None)[0].T                      # (R, 64)
            with torch.no_grad():
                z = net(x[b] + torch.as_tensor(eps).reshape(R, 1, 8, 8)).numpy() - f0[b]
            zt = z * (target / np.linalg.norm(z, axis=1))[:, None]
            d = np.expm1(np.linalg.norm(z, axis=1) ** 2 / sigma**2)
            coords = np.abs(scipy.fft.dctn(eps.reshape(R, 8, 8), axes=(-2, -1), norm="ortho")).reshape(R, 64)
            # iterates="all" (the default): every iterate's bounds, the max kept
            want[b] = np.maximum(want[b], (coords / np.sqrt(d)[:, None]).max(axis=0))
        want_last[b] = (coords / np.sqrt(d)[:, None]).max(axis=0)
    np.testing.assert_allclose(res.std.reshape(3, 64), want, rtol=1e-9)
    last = algorithm1(net, x, sigma, size=size, iterations=iterations, restarts=R, seed=1, solver="dense",
                         iterates="last")
    np.testing.assert_allclose(last.std.reshape(3, 64), want_last, rtol=1e-9)
    assert res.params["dense"]["rank_min"] == min(ranks)
    # J by VJPs of its nonzero rows alone, found by 2 JVPs and checked by a VJP (40 VJPs pulled back every row)
    assert res.params["dense"]["jacobian_products"] == np.mean(nonzero_rows) + 3 + 1 < 40
    assert "dense solve" in res.summary() and "LSQR iterations" not in res.summary()


def test_dense_solver_agrees_with_lsqr_solved_tightly():
    net = _relu_net_with_dead_units()
    x = torch.as_tensor(np.random.default_rng(6).standard_normal((2, 1, 8, 8)))
    kw = dict(size=0.05, iterations=3, restarts=2)
    dense = algorithm1(net, x, 0.3, solver="dense", **kw)
    tight = hcrfast.LSQROptions(atol=1e-14, btol=1e-14, conlim=1e15, iter_lim=2000)
    lsqr = algorithm1(net, x, 0.3, lsqr=tight, warm_start=False, **kw)
    assert lsqr.params["solver"] == "lsqr"  # lsqr options given: auto keeps LSQR
    np.testing.assert_allclose(dense.std, lsqr.std, rtol=1e-6)


def test_solver_auto_and_bad_solver_arguments():
    from hcrfast.algorithm import DENSE_SOLVE_MAX_INPUTS, resolve_solver

    net = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(2).standard_normal((2, 1, 4, 4)))
    assert hcrfast.bound(net, x, 0.2, iterations=1, restarts=1).params["solver"] == "dense"  # CPU, small p
    assert hcrfast.bound(net, x, 0.2, iterations=1, restarts=1, linearize_at="current").params["solver"] == "lsqr"
    assert resolve_solver("auto", "input", torch.device("cpu"), 10, DENSE_SOLVE_MAX_INPUTS + 1) == "krylov"
    assert resolve_solver("auto", "input", torch.device("cuda"), 10, DENSE_SOLVE_MAX_INPUTS + 1) == "krylov"
    assert resolve_solver("auto", "current", torch.device("cpu"), 10, DENSE_SOLVE_MAX_INPUTS + 1) == "lsqr"
    assert resolve_solver("auto", "input", torch.device("cpu"), 10, DENSE_SOLVE_MAX_INPUTS + 1,
                          lsqr_given=True) == "lsqr"
    assert resolve_solver("auto", "input", torch.device("cuda"), 10, 16) == "krylov"
    assert resolve_solver("auto", "current", torch.device("cuda"), 10, 16) == "lsqr"
    assert resolve_solver("auto", "input", torch.device("cpu"), 10, 16, lsqr_given=True) == "lsqr"
    assert resolve_solver("lsqr", "input", torch.device("cpu"), 10, 16) == "lsqr"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_solver("dense", "input", torch.device("cpu"), 10, DENSE_SOLVE_MAX_INPUTS) == "dense"
    # asked for beyond its limits (ResNet-18 at 91x91: 1000 features x 24,843 inputs): done, with its cost
    with pytest.warns(UserWarning, match=r"24,843,000 values, 0\.9 GiB .* 1,000 VJPs or 24,843 JVPs.*'krylov'"):
        assert resolve_solver("dense", "input", torch.device("cpu"), 1000, 3 * 91 * 91) == "dense"
    with pytest.raises(ValueError, match="linearize_at='input' or solver='lsqr'"):
        hcrfast.bound(net, x, 0.2, solver="dense", linearize_at="current")
    with pytest.raises(ValueError, match="solver must be one of"):
        hcrfast.bound(net, x, 0.2, solver="exact")


def test_start_vectors_have_the_published_scale():
    z = hcrfast.start_vectors(np.arange(50), 4, 400, seed=0, size=0.01, sigma=2.0)
    norms = np.linalg.norm(z, axis=1)
    assert z.shape == (200, 400)
    np.testing.assert_allclose(norms.mean(), 0.01 * 2.0, rtol=0.01)
    np.testing.assert_allclose(np.expm1((norms / 2.0) ** 2).mean(), 0.01**2, rtol=0.02)


@pytest.mark.parametrize("law", [hcrfast.Gaussian(2.0), hcrfast.Laplace(0.7)], ids=["gaussian", "laplace"])
@pytest.mark.parametrize("workers", [1, 3])
def test_start_vectors_are_each_examples_own_stream(law, workers):
    """Threads or not, row block e is exactly (s/sqrt(n)) * law drawn from default_rng([seed, e])."""
    ids, R, n, s = [11, 0, 5, 2**40], 3, 64, 0.01
    z = hcrfast.start_vectors(ids, R, n, seed=9, size=s, noise=law, workers=workers)
    for i, e in enumerate(ids):
        rng = np.random.default_rng([9, e])
        draw = 2.0 * rng.standard_normal((R, n)) if isinstance(law, hcrfast.Gaussian) else rng.laplace(0.0, 0.7, (R, n))
        np.testing.assert_array_equal(z[i * R:(i + 1) * R], (s / np.sqrt(n)) * draw)


def test_rms_sigma():
    f = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert hcrfast.rms_sigma(f, 2.0) == pytest.approx(2.0 * np.sqrt(25 / 4))


def test_results_summary_and_to_numpy():
    rng = np.random.default_rng(4)
    model = linear_model(matrix_with_condition(rng, 20, 16, 5.0), np.zeros(20), (1, 4, 4))
    res = hcrfast.bound(model, torch.as_tensor(rng.standard_normal((2, 1, 4, 4))), 1.0,
                        iterations=2, restarts=2, lsqr=FAST)
    host = res.to_numpy()
    assert isinstance(host.std, np.ndarray) and host.std.shape == (2, 1, 4, 4)
    assert host.lsqr_iterations.shape == (2, 2, 2) and host.lsqr_istop.shape == (2, 2, 2)
    text = res.summary()
    assert "HCR bounds for 2 examples" in text and "LSQR iterations" in text


@pytest.mark.parametrize("method", ["dense", "lsqr"])
def test_targets_lift_the_targeted_modes_to_the_least_squares_std(method):
    rng = np.random.default_rng(21)
    shape, p, n = (1, 4, 4), 16, 24
    W = matrix_with_condition(rng, n, p, 100.0)
    model = linear_model(W, rng.standard_normal(n), shape)
    x = torch.as_tensor(rng.standard_normal((2,) + shape))
    plain = hcrfast.bound(model, x, 0.5, iterations=2, restarts=3, lsqr=FAST)
    res = hcrfast.bound(model, x, 0.5, iterations=2, restarts=3, lsqr=FAST, targets="low:2",
                        targeted_method=method)
    crb = 0.25 * np.diag(dct_basis(shape) @ np.linalg.inv(W.T @ W) @ dct_basis(shape).T).reshape(shape)
    low = np.zeros(shape, dtype=bool)
    low[0, :2, :2] = True
    ratio = res.std / np.sqrt(crb)
    assert np.all(ratio <= 1 + 1e-9)
    assert np.all(ratio[:, low] > 0.99)
    # the other modes: Algorithm 1's, or a targeted step's where it moves them more (test below)
    assert np.all(res.std >= plain.std) and np.any(res.std[:, ~low] > plain.std[:, ~low])
    assert res.targeted is not None and res.params["targets"] == "low:2"


def test_a_1d_signal_gets_its_1d_dct_through_the_fix_the_error_names():
    """basis='dct' refuses (B, L) inputs, naming two fixes; the second, batch[:, None] with a model that
    drops the axis, bounds the modes of the 1-D orthonormal DCT-II (scipy.fft.dct): every mode targeted
    on a linear model reaches σ²[C (WᵀW)⁻¹ Cᵀ]_kk to the finite size's factor."""
    rng = np.random.default_rng(8)
    L, n, sigma, size = 12, 20, 0.3, 0.01
    W = matrix_with_condition(rng, n, L, 10.0)
    inner = linear_model(W, rng.standard_normal(n), (L,))
    x = torch.as_tensor(rng.standard_normal((2, L)))
    with pytest.raises(ValueError, match=r"basis='pixel' for vector inputs.*batch\[:, None\].*\(1, 12\)"):
        hcrfast.bound(inner, x, sigma)

    class DropAxis(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x[:, 0])

    res = hcrfast.bound(DropAxis(inner).eval(), x[:, None], sigma, size=size, iterations=2, restarts=2, targets="all")
    C = scipy.fft.dct(np.eye(L), axis=0, norm="ortho")             # column j: the DCT of e_j
    crb = sigma**2 * np.diag(C @ np.linalg.inv(W.T @ W) @ C.T)
    np.testing.assert_allclose(res.std.reshape(2, L) ** 2, np.broadcast_to(crb * size**2 / np.expm1(size**2), (2, L)),
                               rtol=2e-3)


def test_mse_from_modes_reaches_the_least_squares_mse_where_eq6_cannot():
    """The unbiased LS estimator's MSE per coordinate is σ² tr((WᵀW)⁻¹)/p, whatever the basis. Eq. (6),
    one ε, reaches at most σ²‖(WᵀW)⁻¹‖₂/p; (1/p)Σ_k std_k² with every mode targeted reaches the trace (to
    the finite size's factor s²/expm1(s²)), never passes it, and is never below eq. (6)."""
    rng = np.random.default_rng(5)
    shape, p, n = (1, 4, 4), 16, 24
    W = matrix_with_condition(rng, n, p, 30.0)
    model = linear_model(W, rng.standard_normal(n), shape)
    x = torch.as_tensor(rng.standard_normal((3,) + shape))
    sigma, size = 0.5, 0.01
    cov = sigma**2 * np.linalg.inv(W.T @ W)
    exact, eq6_limit = np.trace(cov) / p, np.linalg.eigvalsh(cov)[-1] / p
    res = hcrfast.bound(model, x, sigma, size=size, iterations=4, restarts=3, targets="all")
    plain = hcrfast.bound(model, x, sigma, size=size, iterations=4, restarts=3)
    for r in (res, plain):
        np.testing.assert_allclose(r.mse_from_modes, (np.asarray(r.std).reshape(3, p) ** 2).mean(axis=1), rtol=1e-12)
        assert np.all(r.mse_from_modes >= r.mse * (1 - 1e-12)) and np.all(r.mse_from_modes <= exact * (1 + 1e-9))
    assert np.all(res.mse <= eq6_limit * (1 + 1e-9)) and eq6_limit < 0.5 * exact  # eq. (6) cannot get near
    np.testing.assert_allclose(res.mse_from_modes, exact * size**2 / np.expm1(size**2), rtol=1e-3)
    assert "from the per-mode bounds (.mse_from_modes): median" in res.summary()


def test_mse_from_modes_is_inf_only_where_a_mode_is_and_saturates_past_float64():
    """+inf needs a mode bounded by +inf (D = 0); finite bounds whose squares pass float64's range give
    float64's largest value (a lower bound still), not a false +inf."""
    from test_results import bounds_with_std

    huge = np.finfo(np.float64).max / 4
    res = bounds_with_std([[1.0, 2.0, np.inf], [huge, huge, 3.0]])
    np.testing.assert_array_equal(res.mse_from_modes, [np.inf, np.finfo(np.float64).max])
    # row 0: bounds of 0 add nothing; row 1: the sum of squares passes float64's range, their mean does not
    # (and row 2: the largest square alone passes it, the mean does not)
    some = bounds_with_std([[3e150, 0.0, 4e150], [1.2e154] * 3])
    np.testing.assert_allclose(some.mse_from_modes, [25e300 / 3, 1.44e308], rtol=1e-14)
    np.testing.assert_allclose(bounds_with_std([[2e154, 0.0, 0.0], [1.0] * 3]).mse_from_modes, [2e154 / 3 * 2e154, 1.0],
                               rtol=1e-14)


@pytest.mark.parametrize("solver", ["dense", "lsqr"])
def test_targeted_steps_bound_every_mode_they_move(solver):
    """Each targeted step ε_k, certified for its own mode k, bounds every mode j by |(Qε_k)_j|/√D_k ((5) with
    the same ε): bound() reports the max of those too. Oracle: scipy's DCT of the returned ε_k and D from
    the exact shift W ε_k; on a linear model none passes the least-squares std, and modes that are not
    targeted are lifted above Algorithm 1's."""
    rng = np.random.default_rng(23)
    shape, p, n, sigma = (1, 4, 4), 16, 24, 0.5
    W = matrix_with_condition(rng, n, p, 100.0)
    model = linear_model(W, rng.standard_normal(n), shape)
    x = torch.as_tensor(rng.standard_normal((3,) + shape))
    kw = dict(iterations=2, restarts=3, solver=solver, lsqr=None if solver == "dense" else FAST)
    res = hcrfast.bound(model, x, sigma, targets="low:2", keep_targeted_eps=True, **kw)
    t = res.targeted
    eps = np.asarray(t.eps)                                            # (3, 4, 1, 4, 4)
    D = np.expm1(np.einsum("bkn,bkn->bk", *(eps.reshape(3, 4, p) @ W.T,) * 2) / sigma**2)
    np.testing.assert_allclose(t.divergence, D, rtol=1e-9)
    coords = np.abs(scipy.fft.dctn(eps, axes=(-2, -1), norm="ortho").reshape(3, 4, p))
    cross = (coords / np.sqrt(D)[..., None]).max(axis=1)
    expected = np.maximum(np.maximum(np.asarray(res.std_algorithm1).reshape(3, p), np.asarray(t.std).reshape(3, p)),
                          cross)
    # D is taken past float64's rounding of the passes (algorithm._widened): ~1e-11 here
    np.testing.assert_allclose(res.std.reshape(3, p), expected, rtol=1e-9)
    crb = sigma**2 * np.diag(dct_basis(shape) @ np.linalg.inv(W.T @ W) @ dct_basis(shape).T)
    assert np.all(res.std.reshape(3, p) ** 2 <= crb * (1 + 1e-9))
    others = ~np.asarray(t.targeted).reshape(p)
    lifted = res.std.reshape(3, p)[:, others] > np.asarray(res.std_algorithm1).reshape(3, p)[:, others]
    assert lifted.mean() > 0.2
    assert "their steps also bound the other modes, and lifted" in res.summary()


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_bound_drops_the_targeted_steps_unless_kept_and_bounds_the_same(solver, tmp_path):
    """bound(targets=) keeps each chunk's bounds on every mode and drops its (K, p) steps, unless
    keep_targeted_eps=True: the same bounds bitwise, saved and checkpointed without the steps, and a
    checkpoint of one setting refused by the other. Oracle for std_every_mode: scipy's DCT of the kept
    steps over √D (test_targeted_steps_bound_every_mode_they_move checks those against W)."""
    rng = np.random.default_rng(31)
    shape, p, n, sigma = (1, 4, 4), 16, 24, 0.5
    model = linear_model(matrix_with_condition(rng, n, p, 100.0), rng.standard_normal(n), shape)
    x = torch.as_tensor(rng.standard_normal((3,) + shape))
    kw = dict(iterations=2, restarts=3, solver=solver, targets="low:2", chunk_size=2)
    kept = hcrfast.bound(model, x, sigma, keep_targeted_eps=True, **kw)
    res = hcrfast.bound(model, x, sigma, **kw)
    assert res.targeted.eps is None and kept.targeted.eps.shape == (3, 4) + shape
    assert res.params["targeted"]["eps_kept"] is False and kept.params["targeted"]["eps_kept"] is True
    np.testing.assert_array_equal(res.std, kept.std)
    np.testing.assert_array_equal(res.targeted.std_every_mode, kept.targeted.std_every_mode)
    coords = np.abs(scipy.fft.dctn(np.asarray(kept.targeted.eps), axes=(-2, -1), norm="ortho").reshape(3, 4, p))
    cross = (coords / np.sqrt(np.asarray(kept.targeted.divergence))[..., None]).max(axis=1)
    np.testing.assert_allclose(np.asarray(res.targeted.std_every_mode).reshape(3, p),
                               np.maximum(np.asarray(kept.targeted.std).reshape(3, p), cross), rtol=1e-12)

    res.save(tmp_path / "bounds.npz")
    back = hcrfast.Bounds.load(tmp_path / "bounds.npz")
    assert back.targeted.eps is None and "targeted.eps" not in np.load(tmp_path / "bounds.npz").files
    np.testing.assert_array_equal(back.targeted.std_every_mode, res.targeted.std_every_mode)

    folder = tmp_path / "ckpt"
    first = hcrfast.bound(model, x, sigma, checkpoint=folder, **kw)
    chunks = sorted(folder.glob("chunk_*.npz"))
    assert len(chunks) == 2
    for chunk in chunks:
        files = np.load(chunk).files
        assert "targeted.std_every_mode" in files and "targeted.eps" not in files
    again = hcrfast.bound(model, x, sigma, checkpoint=folder, **kw)  # read back, not computed
    assert again.params["checkpoint"]["examples_read_back"] == 3
    np.testing.assert_array_equal(again.std, first.std)
    np.testing.assert_array_equal(first.std, res.std)
    with pytest.raises(hcrfast.CheckpointMismatchError, match="keep_targeted_eps"):
        hcrfast.bound(model, x, sigma, checkpoint=folder, keep_targeted_eps=True, **kw)


def test_keep_targeted_eps_without_targets_or_not_a_flag_is_refused():
    x = torch.rand(2, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"keep_targeted_eps=True keeps the targeted steps, but targets=None"):
        hcrfast.bound(FrozenFeatures().eval(), x, 0.5, keep_targeted_eps=True)
    with pytest.raises(TypeError, match="keep_targeted_eps"):
        hcrfast.bound(FrozenFeatures().eval(), x, 0.5, targets="low:2", keep_targeted_eps="yes")


def test_cross_bounds_leave_out_steps_whose_own_bound_was_withheld():
    """A targeted step the rounding guards zeroed (own bound 0), one with D = 0 or D = inf, or a null-space
    probe's, bounds no other mode through the cross bounds; the others give |(Qε)_j|/√D exactly (pixel
    basis: Q = I)."""
    from hcrfast.algorithm import _cross_bounds
    from hcrfast.targeted import TargetedBounds

    shape, p = (1, 2, 2), 4
    eps = np.array([[[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [7.0, 7.0, 7.0, 7.0]]])
    d = np.array([[4.0, 1.0, 0.0, np.inf]])
    std = np.zeros((1, p))
    std[0, :] = [0.5, 0.0, np.inf, 0.0]  # mode 1's step zeroed by a guard; mode 2's D = 0 (+inf, its own)
    t = TargetedBounds(std=std.reshape((1,) + shape), targeted=np.ones(shape, bool), modes=np.arange(4),
                       divergence=d, eps=eps.reshape((1, 4) + shape), infinite=np.isinf(std).reshape((1,) + shape),
                       from_null_space=np.zeros((1, 4), bool), null_dim=None, null_fraction=None,
                       lsqr_iterations=None, lsqr_istop=None, method="dense")
    got, exact = _cross_bounds(t, "pixel", shape), np.array([[0.5, 1.0, 0.0, 0.0]])
    assert np.all(got <= exact)   # rounded down (hcrfast.algorithm.coordinates_down), by a few ulps only
    np.testing.assert_allclose(got, exact, rtol=1e-14)
    # a null-space probe's step (D rounding by design, unguarded) bounds its own mode only
    t.from_null_space = np.array([[True, False, False, False]])
    np.testing.assert_array_equal(_cross_bounds(t, "pixel", shape), [[0.0, 0.0, 0.0, 0.0]])


def test_dense_solve_shares_its_factorization_with_the_targeted_modes():
    """With solver="dense", bound(targets=...) derives the targeted directions from the J it already
    built and factored: the same certified bounds as targeted_bound computing its own, on a ReLU net
    with dead units (zero rows of J), and the least-squares std on a linear model."""
    model = _relu_net_with_dead_units()
    x = torch.as_tensor(np.random.default_rng(5).standard_normal((3, 1, 8, 8)))
    res = hcrfast.bound(model, x, 0.3, iterations=2, restarts=3, solver="dense", targets="low:3", chunk_size=2)
    assert res.params["solver"] == "dense" and res.targeted.params["shared_factorization"]
    own = hcrfast.targeted_bound(model, x, 0.3, targets="low:3", null_probes=False)
    assert not own.params["shared_factorization"]
    np.testing.assert_allclose(res.targeted.std, own.std, rtol=1e-9)
    np.testing.assert_array_equal(res.targeted.null_dim, own.null_dim)

    rng = np.random.default_rng(22)
    shape, p, n = (1, 4, 4), 16, 24
    W = matrix_with_condition(rng, n, p, 100.0)
    lin = linear_model(W, rng.standard_normal(n), shape)
    xl = torch.as_tensor(rng.standard_normal((2,) + shape))
    res = hcrfast.bound(lin, xl, 0.5, iterations=2, restarts=3, solver="dense", targets="low:2")
    crb = 0.25 * np.diag(dct_basis(shape) @ np.linalg.inv(W.T @ W) @ dct_basis(shape).T).reshape(shape)
    np.testing.assert_allclose(res.std[:, 0, :2, :2] / np.sqrt(crb[0, :2, :2]), 1.0, atol=0.01)
    with pytest.raises(ValueError, match="directions="):
        hcrfast.targeted_bound(lin, xl, 0.5, targets="low:3",
                               directions=DenseDirections.empty(2, 4, p, "reverse", "cpu"))
    with pytest.raises(ValueError, match="method='lsqr'"):
        hcrfast.targeted_bound(lin, xl, 0.5, targets="low:4", method="lsqr",
                               directions=DenseDirections.empty(2, 4, p, "reverse", "cpu"))


def test_laplace_noise_never_exceeds_the_least_squares_variance():
    """Under Laplace(b) noise least squares is still unbiased, with variance 2b²[(WᵀW)⁻¹]_kk:
    no valid lower bound may exceed it. The Monte Carlo law of the same density agrees and,
    its D being an upper confidence bound, is never larger than the closed form."""
    import scipy.stats

    rng = np.random.default_rng(31)
    shape, p, n = (1, 4, 4), 16, 24
    W = matrix_with_condition(rng, n, p, 30.0)
    model = linear_model(W, rng.standard_normal(n), shape)
    x = torch.as_tensor(rng.standard_normal((2,) + shape))
    b = 0.4
    kw = dict(iterations=2, restarts=3, basis="pixel", lsqr=FAST, size=0.05)
    res = hcrfast.bound(model, x, hcrfast.Laplace(b), **kw)
    ls_var = 2 * b**2 * np.diag(np.linalg.inv(W.T @ W))
    ratio = res.std.reshape(2, p) ** 2 / ls_var
    assert np.all(ratio <= 1 + 1e-9) and np.median(ratio) > 0.01
    assert "Laplace" in res.params["noise"] and res.params["sigma"] is None
    mc = hcrfast.bound(model, x, hcrfast.MonteCarlo.from_scipy(scipy.stats.laplace(scale=b), n_samples=20_000), **kw)
    # both laws draw the start vectors from the same stream (checked), so every restart's steps are the
    # same: the last iterates' D (divergence) compare shift by shift (the step with the largest eq.-(6)
    # bound, eps and z, may be another iterate under each law)
    last = dict(kw, iterates="last")
    np.testing.assert_array_equal(
        hcrfast.bound(model, x, hcrfast.Laplace(b), **last).z,
        hcrfast.bound(model, x, hcrfast.MonteCarlo.from_scipy(scipy.stats.laplace(scale=b), n_samples=20_000),
                      **last).z)
    assert np.all(mc.divergence >= res.divergence * (1 - 1e-12))
    np.testing.assert_allclose(mc.std, res.std, rtol=0.1)
    with pytest.raises(NotImplementedError, match="Gaussian"):
        hcrfast.bound(model, x, hcrfast.Laplace(b), targets="all", **kw)


def test_a_monte_carlo_law_is_raised_to_confidence_1_minus_delta_over_its_statements():
    """The max over R restarts holds at level c only if each restart's upper bound on D holds at
    1 − (1 − c)/R (Bonferroni): the D reported is that law's bound on the kept restart's z."""
    from scipy import stats

    model = linear_model(np.random.default_rng(0).standard_normal((6, 16)), np.zeros(6), (1, 4, 4))
    x = torch.as_tensor(np.random.default_rng(1).standard_normal((2, 1, 4, 4)))
    law = hcrfast.MonteCarlo.from_scipy(stats.laplace(scale=0.3), n_samples=2000, confidence=0.99)
    res = hcrfast.bound(model, x, law, iterations=1, restarts=4, lsqr=FAST)
    strict = law.with_confidence(1 - 0.01 / 4)
    assert res.params["noise"] == strict.describe() and res.params["noise_asked"] == law.describe()
    # (past float64's rounding of z: algorithm._widened, 4e-11 here)
    np.testing.assert_allclose(res.divergence[np.arange(2), res.best_restart], strict.divergence(res.z), rtol=1e-9)
    # every iterate certified: each example's bound is a max over R·i statements, each at 1 − (1 − c)/(R·i)
    every = hcrfast.bound(model, x, law, iterations=3, restarts=4, lsqr=FAST, singular_steps=0)
    assert every.params["iterates"] == "all"
    assert every.params["noise"] == law.with_confidence(1 - 0.01 / 12).describe()
    last = hcrfast.bound(model, x, law, iterations=3, restarts=4, lsqr=FAST, iterates="last")
    assert last.params["noise"] == strict.describe()


def test_targeted_bounds_found_chunk_by_chunk_equal_one_chunk_and_number_examples_over_the_batch():
    """bound(targets=...) finds the targeted bounds chunk by chunk: the same bounds as in one chunk, and
    the +inf reasons name the examples by their place in the whole batch."""
    x = torch.rand(5, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    kw = dict(iterations=2, restarts=2, targets="low:2", solver="dense", keep_targeted_eps=True)
    one = algorithm1(FrozenFeatures().eval(), x, 0.5, chunk_size=5, **kw)
    many = algorithm1(FrozenFeatures().eval(), x, 0.5, chunk_size=2, **kw)
    assert len(one.targeted.infinite_reasons) == 5 * 4  # every example, every targeted mode
    assert many.targeted.infinite_reasons == one.targeted.infinite_reasons
    assert many.targeted.infinite_reasons[-1].startswith("example 4,")
    assert many.infinite_reasons == one.infinite_reasons
    for name in ("std", "divergence", "eps", "infinite", "from_null_space", "null_dim", "null_fraction",
                 "std_every_mode"):
        np.testing.assert_allclose(getattr(many.targeted, name), getattr(one.targeted, name), rtol=1e-12,
                                   err_msg=name)
    np.testing.assert_array_equal(many.std, one.std)
    assert many.targeted.timings.keys() == one.targeted.timings.keys()


class Gate(torch.nn.Module):
    """Records when its forward runs; with ``hold``, its first forward waits for ``release``."""

    def __init__(self, log, name, hold=False):
        super().__init__()
        self.inner, self.log, self.name, self.hold = _small_tanh_net().float(), log, name, hold
        self.inside, self.release = threading.Event(), threading.Event()

    def forward(self, x):
        self.log.append((self.name, self.training, torch.backends.cudnn.conv.fp32_precision))
        if self.hold and not self.inside.is_set():
            self.inside.set()
            assert self.release.wait(30)
        return self.inner(x)


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="torch before the fp32_precision settings")
def test_calls_from_several_threads_run_one_at_a_time():
    """A call switches process-wide settings (TF32) and its model's training flag for its duration, so a
    second thread's call waits until the first is done: here it must not reach its model while the first
    call is held inside its own, and both end with the caller's settings and flags."""
    log = []
    a, b = Gate(log, "a", hold=True), Gate(log, "b")  # both in training mode: switched to eval for the call
    x = torch.as_tensor(np.random.default_rng(7).standard_normal((2, 1, 4, 4)), dtype=torch.float32)
    # certify=False: the gates' events cannot be deep-copied into a float64 model
    kw = dict(iterations=1, restarts=1, solver="lsqr", lsqr=hcrfast.LSQROptions(iter_lim=5), certify=False)
    done = []

    def call(model):
        done.append(hcrfast.bound(model, x, 0.2, **kw))

    saved = torch.backends.cudnn.conv.fp32_precision
    try:
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "the model was in training mode"
            first = threading.Thread(target=call, args=(a,))
            second = threading.Thread(target=call, args=(b,))
            first.start()
            assert a.inside.wait(30)
            second.start()
            second.join(0.5)  # time enough to reach its model, were it not waiting for the first call
            assert [name for name, *_ in log] == ["a"]
            a.release.set()
            first.join(60)
            second.join(60)
        assert len(done) == 2
        names = [name for name, *_ in log]
        assert names[0] == "a" and "b" in names and "a" not in names[names.index("b"):]
        assert {(training, precision) for _, training, precision in log} == {(False, "ieee")}
        assert a.training and b.training and torch.backends.cudnn.conv.fp32_precision == "tf32"
    finally:
        a.release.set()
        torch.backends.cudnn.conv.fp32_precision = saved


@pytest.mark.parametrize("kw,error,match", [
    (dict(n=0), ValueError, r"n must be at least 1, got 0"),
    (dict(n=2.5), TypeError, r"n must be an integer, got 2\.5"),
    (dict(restarts=0), ValueError, r"restarts must be at least 1, got 0"),
    (dict(restarts="3"), TypeError, r"restarts must be an integer, got '3'"),
    (dict(size=-1), ValueError, r"size must be a positive finite number, got -1\.0; typical values"),
    (dict(size=0.0), ValueError, r"size must be a positive finite number, got 0\.0"),
    (dict(size=float("nan")), ValueError, r"size must be a positive finite number, got nan"),
    (dict(size="0.01"), TypeError, r"size must be a real number, got str"),
    (dict(seed=-1), ValueError, r"seed must be a non-negative integer, got -1"),
    (dict(seed=1.0), TypeError, r"seed must be a non-negative integer, got 1\.0"),
    (dict(workers=0), ValueError, r"workers must be at least 1, got 0"),
    (dict(example_ids=[0, -3]), ValueError, r"example_ids must be non-negative integers .* got \[-3\]"),
    (dict(example_ids=[0.5, 1.0]), TypeError, r"example_ids must be a sequence of non-negative integers .* float64"),
    (dict(example_ids=[True]), TypeError, r"example_ids .* dtype bool"),
    (dict(example_ids=[[0, 1]]), TypeError, r"example_ids .* shape \(1, 2\)"),
    (dict(sigma=None), TypeError, r"start_vectors needs the noise: pass sigma .* or noise"),
    (dict(sigma=-1.0), ValueError, r"sigma must be a positive finite number, got -1\.0"),
    (dict(sigma=True), TypeError, r"sigma must be a real number, got bool"),
    (dict(noise=hcrfast.Laplace(1.0)), ValueError, r"pass sigma or noise, not both"),
])
def test_start_vectors_checks_every_argument(kw, error, match):
    args = dict(example_ids=[0, 1], restarts=2, n=4, seed=0, size=0.01, sigma=1.0)
    args.update(kw)
    with pytest.raises(error, match=match):
        hcrfast.start_vectors(args.pop("example_ids"), args.pop("restarts"), args.pop("n"), **args)


def test_start_vectors_takes_the_ids_it_took():
    want = hcrfast.start_vectors([0, 1, 2], 2, 5, seed=3, size=0.01, sigma=1.0)
    for ids in (range(3), np.arange(3, dtype=np.uint8), torch.arange(3), (np.int64(i) for i in range(3))):
        np.testing.assert_array_equal(hcrfast.start_vectors(ids, np.int64(2), np.int32(5), seed=np.uint8(3),
                                                            size=np.float64(0.01), sigma=1.0), want)
    assert hcrfast.start_vectors([], 2, 5, seed=3, size=0.01, sigma=1.0).shape == (0, 5)


@pytest.mark.parametrize("features,match", [
    (torch.tensor([[3 + 4j, 0j]]), r"tensor of real numbers, got dtype complex64; .*features\.real"),
    (torch.tensor([[True]]), r"tensor of real numbers, got dtype bool; pass the model's outputs"),
    (np.array([[3 + 4j, 0j]]), r"features must hold real numbers, got an array of dtype complex128; .*real"),
    (np.array([[True]]), r"features must hold real numbers, got an array of dtype bool"),
    (["a"], r"features must hold real numbers, got an array of dtype <U1"),
])
def test_rms_sigma_refuses_complex_and_non_real_features(features, match):
    """A complex tensor's imaginary part was dropped (with a mere warning) and an RMS of the real part given."""
    with pytest.raises(TypeError, match=match):
        hcrfast.rms_sigma(features)


@pytest.mark.parametrize("features", [torch.tensor([]), torch.zeros(0, 10), np.zeros((3, 0)), []])
def test_rms_sigma_of_no_features_says_they_are_empty(features):
    """Empty features were refused as "the features' RMS is nan", which did not say why."""
    with pytest.raises(ValueError, match=r"features are empty \(shape \(.*\)\): sigma = scale x RMS needs at least"):
        hcrfast.rms_sigma(features)


def test_rms_sigma_still_takes_real_arrays_and_lists():
    want = np.sqrt(25 / 4)
    for f in (torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float16), torch.tensor([[3, 4], [0, 0]]),
              np.float32([[3, 4], [0, 0]]),
              np.array([[3, 4], [0, 0]]), [[3, 4], [0, 0]], [[3.0, 4.0], [0.0, 0.0]]):
        assert hcrfast.rms_sigma(f) == pytest.approx(want)


def test_rms_sigma_of_features_whose_squares_leave_float64s_range():
    """Features of 1e200 or 1e-200 have that RMS: their squares over- or underflow, so the mean is taken of
    the features scaled by the largest (it was inf and 0.0, refused as features that are not finite or 0);
    features in range keep the plain formula's bits."""
    for v in (1e200, 1e-200, 1e-160, 3e153):
        f = torch.tensor([[v, -v], [v / 2, 0.0]], dtype=torch.float64)
        assert hcrfast.rms_sigma(f) == pytest.approx(v * np.sqrt(2.25 / 4), rel=1e-15)
    f = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert hcrfast.rms_sigma(f) == float(torch.sqrt(torch.mean(f * f)))
    for bad, word in ((torch.zeros(3), "0.0"), (torch.tensor([math.inf, 1.0]), "inf"),
                      (torch.tensor([math.nan, 1.0]), "nan")):
        with pytest.raises(ValueError, match=f"the features' RMS is {word}; sigma = scale x RMS needs"):
            hcrfast.rms_sigma(bad)
    feats = torch.nn.Linear(3, 2)(torch.ones(1, 3))           # requires grad, inside a tuple
    with pytest.raises(TypeError, match=r"features must be a tensor, an array or a list of numbers, got tuple"):
        hcrfast.rms_sigma((feats,))


def test_dense_solve_says_which_lsqr_options_it_does_not_use():
    """solver='dense' runs no LSQR: tolerances given to it are named as unused (its kernels choice is used)."""
    model, x = linear_model(np.eye(16), np.zeros(16), (1, 4, 4)), torch.rand(2, 1, 4, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"solver='dense' solves every step exactly and runs no LSQR, so these "
                                         r"lsqr options go unused: atol, iter_lim"):
        hcrfast.bound(model, x, 0.5, iterations=1, restarts=2, solver="dense",
                      lsqr=hcrfast.LSQROptions(atol=0.5, iter_lim=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hcrfast.bound(model, x, 0.5, iterations=1, restarts=2, solver="dense",
                      lsqr=hcrfast.LSQROptions(kernels="twin"))


def test_targeted_method_is_checked_without_targets():
    with pytest.raises(ValueError, match="targeted_method"):
        hcrfast.bound(linear_model(np.eye(16), np.zeros(16), (1, 4, 4)), torch.rand(2, 1, 4, 4, dtype=torch.float64),
                      0.5, targeted_method="x")


def test_progress_speaks_from_inside_a_long_lsqr_chunk(capsys, monkeypatch):
    """Under LSQR one chunk of the automatic size (2^24 values) can run for many minutes: lines come
    from its solves too, at LSQR's host checks (at most every algorithm._PROGRESS_EVERY seconds, 0
    here), naming the step, the iteration and the problems still running; the bounds are the quiet run's."""
    from hcrfast import algorithm

    net = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(8).standard_normal((3, 1, 4, 4)))
    kw = dict(iterations=2, restarts=2, solver="lsqr", lsqr=hcrfast.LSQROptions(atol=1e-8, btol=1e-8, iter_lim=16))
    quiet = hcrfast.bound(net, x, 0.2, **kw)
    monkeypatch.setattr(algorithm, "_PROGRESS_EVERY", 0.0)
    loud = hcrfast.bound(net, x, 0.2, progress=True, **kw)
    lines = capsys.readouterr().err.strip().splitlines()
    inside = [line for line in lines if "LSQR iteration" in line]
    assert inside[0].startswith("hcrfast.bound: examples 0-2 of 3: step 1/2, LSQR iteration 0, 6 of 6 problems running (")
    assert any(re.match(r"hcrfast.bound: examples 0-2 of 3: step 2/2, LSQR iteration \d+, 0 of 6 problems running", line)
               for line in inside), inside
    np.testing.assert_array_equal(loud.std, quiet.std)


@pytest.mark.parametrize("solver", ["dense", "krylov"])
def test_out_of_memory_in_the_rounding_probe_is_split_not_taken_for_rounding(solver):
    """The float64 JVP of _rounded_away runs on every restart whose D = 0 at once (examples x
    restarts rows, beyond the rows the dense and Krylov chunks were sized for): torch's
    OutOfMemoryError is a RuntimeError, and was read as 'no JVP', so a straight-through map's valid
    +inf bounds all became 0 with a warning blaming sigma."""
    x = torch.rand(2, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    kw = dict(iterations=2, restarts=4, solver=solver)
    want = hcrfast.bound(FrozenFeatures().eval(), x, 0.5, **kw)
    tight = OutOfMemoryAbove(FrozenFeatures(), grad_rows=3).eval()  # 8 restarts' rows do not fit, 2 do
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = hcrfast.bound(tight, x, 0.5, **kw)
    assert tight.refused >= 1
    np.testing.assert_array_equal(got.std, want.std)
    assert np.isinf(got.std).sum() == np.isinf(want.std).sum() > 0


@pytest.mark.parametrize("solver", ["dense", "lsqr"])
def test_features_cancelled_down_from_large_inputs_are_no_silent_rounding(solver):
    """a(θ) = W(θ − m) on inputs near 1e6 (the bias cancels the offset): features of order 1, so a
    rounding estimate from |a| alone says float64 resolves the shifts to ~1e-12, but Wθ (~1e6) rounds at
    ~1e-10 and at σ = 3e-5 moved the targeted bounds to 1.04x the exact least-squares variance (and
    mse_from_modes above trace(cov)/p) with no warning. The estimate must count the input-sized terms: the
    bounds stay at most the exact ones, and a warning says rounding decided D."""
    rng = np.random.default_rng(3)
    shape, p = (1, 4, 5), 20
    W = rng.standard_normal((30, p))
    x = torch.as_tensor(1e6 + rng.standard_normal((2,) + shape))
    model = linear_model(W, -(W @ x.reshape(2, -1).mean(0).numpy()), shape)
    sigma = 3e-5
    Q = dct_basis(shape)
    cov = Q @ np.linalg.inv(W.T @ W) @ Q.T
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = hcrfast.bound(model, x, sigma, targets="all", solver=solver, targeted_method=solver, restarts=3,
                            iterations=2, lsqr=FAST if solver == "lsqr" else None)
    assert any("float64's rounding" in str(w.message) for w in caught)
    assert np.all(res.std.reshape(2, -1) ** 2 <= sigma**2 * np.diag(cov) * (1 + 1e-3))
    assert np.all(res.mse_from_modes <= sigma**2 * np.trace(cov) / p * (1 + 1e-3))


@pytest.mark.parametrize("basis", ["pixel", "dct"])
def test_each_bound_is_at_most_the_exact_one_of_its_certified_step(basis):
    """A bound is |c_k|/√D from float64 arithmetic: D (a sum of n terms, then expm1) and c_k (a DCT of ε) may
    each round either way, and the bound with them could pass the exact |c_k|/√D of the very step it reports
    by an ulp or a few. Both are rounded outward (hcrfast.noise.divergence_of, algorithm.coordinates_down):
    every bound is at most the exact one of its step (ε and z as reported), from 40-digit mpmath, over 16
    examples; the pixel basis, exact in c_k, and the DCT both."""
    mpmath = pytest.importorskip("mpmath")
    shape = (1, 4, 5)
    p = math.prod(shape)
    gen = torch.Generator().manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(p, 30, bias=False)).double().eval()
    with torch.no_grad():
        model[1].weight.copy_(torch.randn(30, p, generator=gen, dtype=torch.float64))
    x = torch.randn((16,) + shape, generator=gen, dtype=torch.float64)
    sigma = 0.37
    res = hcrfast.bound(model, x, sigma, restarts=1, iterations=2, iterates="last", singular_steps=0, basis=basis)
    H, W = shape[1:]
    with mpmath.workdps(40):
        def dct_matrix(N):
            return [[mpmath.sqrt(mpmath.mpf(1 if k == 0 else 2) / N) * mpmath.cos(mpmath.pi * (2 * j + 1) * k / (2 * N))
                     for j in range(N)] for k in range(N)]

        ch, cw = dct_matrix(H), dct_matrix(W)
        for e in range(x.shape[0]):
            eps = [[mpmath.mpf(float(v)) for v in row] for row in res.eps[e].reshape(H, W)]
            d = mpmath.expm1(mpmath.fsum(mpmath.mpf(float(v)) ** 2 for v in res.z[e].ravel()) / mpmath.mpf(sigma) ** 2)
            norm = mpmath.sqrt(mpmath.fsum(v ** 2 for row in eps for v in row))
            for k in range(H):
                for m in range(W):
                    c = eps[k][m] if basis == "pixel" else mpmath.fsum(
                        ch[k][h] * cw[m][w] * eps[h][w] for h in range(H) for w in range(W))
                    got = mpmath.mpf(float(res.std[e, 0, k, m]))
                    assert got <= abs(c) / mpmath.sqrt(d)
                    # lowered by its rounding only: c's, and D's bracket for the passes' (algorithm._widened)
                    assert got >= (abs(c) - 1e-13 * norm) / mpmath.sqrt(d) * (1 - 1e-9)


class _NoisyOrMixing(torch.nn.Module):
    """tanh(Wx + b), plus ``noise`` × randn, plus ``mix`` × the batch's mean, plus ``pair`` × row 4 on row 3."""

    def __init__(self, noise=0.0, mix=0.0, pair=0.0):
        super().__init__()
        self.lin = torch.nn.Linear(36, 20)
        self.noise, self.mix, self.pair = noise, mix, pair

    def forward(self, x):
        y = torch.tanh(self.lin(x.flatten(1)))
        if self.mix:
            y = y + self.mix * y.mean(0, keepdim=True)
        if self.pair and len(y) > 4:
            y = torch.cat([y[:3], y[3:4] + self.pair * y[4:5], y[4:]])
        return y + self.noise * torch.randn_like(y) if self.noise else y


@pytest.mark.parametrize("kind", [dict(noise=2e-5), dict(mix=3e-5), dict(pair=0.5)])
@pytest.mark.parametrize("entry", ["bound", "targeted_bound"])
def test_features_that_are_not_a_function_of_each_input_at_the_shifts_scale_are_refused(kind, entry):
    """A model slightly random (2e-5 on features of order 1), mixing the batch faintly (3e-5 × its mean) or
    mixing two rows the entry probe does not look at passed it (1e-4 of the features' size): bounds came out
    up to 1.066× the deterministic model's, with no warning (the dense solve blamed torch's batching rules).
    What counts is the gap against the feature shifts, size·σ = 1.5e-3: refused, with the gap and the shift."""
    torch.manual_seed(0)
    x = torch.randn(6, 1, 6, 6)
    model = _NoisyOrMixing(**kind).eval()
    call = hcrfast.bound if entry == "bound" else hcrfast.targeted_bound
    kw = dict(restarts=2, iterations=2) if entry == "bound" else dict(targets="low:2")
    with pytest.raises(ValueError, match=r"not a fixed function of each input .* shifts the bounds rest on|"
                                         r"of the feature shifts the bounds rest on .*not a fixed function"):
        call(model, x, 0.3, **kw)


def test_a_model_random_far_below_the_shifts_scale_warns_then_passes_silently():
    """Randomness of 1e-9 on features of order 1 moves D by ~1e-5 at shifts of 1.5e-3: a warning naming that
    share; 1e-12, ~1e-8: nothing said, and the bounds are the deterministic model's to 1e-7."""
    torch.manual_seed(0)
    x = torch.randn(4, 1, 6, 6)
    clean = _NoisyOrMixing().eval()
    exact = hcrfast.bound(clean, x, 0.3, restarts=2, iterations=2)
    for noise, warned in ((1e-9, True), (1e-12, False)):
        model = _NoisyOrMixing(noise=noise).eval()
        model.load_state_dict(clean.state_dict())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = hcrfast.bound(model, x, 0.3, restarts=2, iterations=2)
        said = [str(w.message) for w in caught if "feature shifts the bounds rest on" in str(w.message)]
        assert bool(said) == warned, said
        np.testing.assert_allclose(res.std, exact.std, rtol=1e-4 if warned else 1e-7)


class _Asin(torch.nn.Module):
    def forward(self, x):
        return torch.asin(x.flatten(1))


def test_features_nan_beside_the_inputs_are_named_as_the_models_domain():
    """asin at 0.99999: θ + ε leaves its domain, the features come out NaN, and the NaN spreads to the later
    iterates' ε. The error said σ asked for steps float64 cannot hold, advising the σ and the float64 model
    the call already had; it now names the model's domain (and overflow, the other way to NaN)."""
    x = torch.full((2, 1, 4, 4), 0.99999, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"features came out NaN at theta \+ eps in 4 of 4 steps although their "
                                         r"eps is finite .* not defined just beside these inputs"):
        hcrfast.bound(_Asin().eval(), x, 1.5, restarts=2, iterations=2)


class _Square(torch.nn.Module):
    def forward(self, x):
        return x.flatten(1) ** 2


def test_a_zero_derivative_where_a_finite_step_moves_the_features_is_named_j_0():
    """x**2 at a black example: torch's J is 0 there though a finite step moves the features. Its restarts
    were said to have eps 0 from "a step outside the range the solver's dtype resolves"; they are J = 0, and
    the +inf of targeted_bound's null probes (for inputs the features do not see) is not offered."""
    x = torch.zeros(2, 1, 4, 4)
    x[1] = torch.rand(1, 4, 4, generator=torch.Generator().manual_seed(0)) + 0.5
    with pytest.warns(UserWarning, match=r"2 restarts found J = 0 at their example .*torch's derivative of them is 0"):
        res = hcrfast.bound(_Square().eval(), x, 1.0, restarts=2, iterations=2)
    reasons = res.params["zero_step_reasons"]
    assert len(reasons) == 2 and all(r.startswith("example 0") for r in reasons)
    assert all("J = 0 here (torch's derivative of the features is 0" in r and "null_probes" not in r for r in reasons)
    assert float(res.std[0].max()) == 0.0 and float(res.std[1].min()) > 0
    with pytest.raises(ValueError, match=r"piecewise constant .* or flat at these inputs \(x\*\*2 or x\*\*3 at 0\)"):
        hcrfast.bound(_Square().eval(), torch.zeros(2, 1, 4, 4), 0.05, restarts=2, iterations=2)


class _CancelledOffset(torch.nn.Module):
    """Wx + b with b = −W·1e6: inputs near 1e6 whose offset the bias takes away (one row and a batch round
    differently, at ~u·|Wx|)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 16)
        with torch.no_grad():
            self.lin.bias.copy_(-self.lin.weight.sum(1) * 1e6)

    def forward(self, x):
        return self.lin(x.reshape(len(x), -1))


def test_the_repeat_check_allows_float64_rounding_where_features_cancel_down_and_probes_a_few_rows():
    """A deterministic model whose features cancel a large input offset rounds differently alone than in a
    batch (6.5e-10 against shifts of 5e-7): the check refused it as random. Its allowance now scales with the
    rounding guard's m_i (|J(θ⊙r)|), and it probes 8 examples, not the batch three times over (2.8 GB more
    for a conv net at B = 1000)."""
    torch.manual_seed(0)
    model = _CancelledOffset().double().eval()
    x = torch.rand(12, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 1e6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hcrfast.bound(model, x, 1e-4, restarts=2, iterations=2, singular_steps=0, solver="dense")
    assert not [w for w in caught if "bounds rest on" in str(w.message)]
    sizes = []
    hook = model.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[0]))
    from hcrfast import validation

    validation.check_repeatable(model, x, 1.0)
    hook.remove()
    assert max(sizes) <= validation.REPEAT_ROWS


def test_a_targeted_method_without_targets_is_refused_as_keep_targeted_eps_is():
    """targeted_method='dense' with no targets ran as if it changed something; keep_targeted_eps=True without
    targets was already refused. Both now name the fix."""
    model = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((2, 1, 4, 4)))
    with pytest.raises(ValueError, match=r"targeted_method='dense' chooses how the targeted steps are found, but "
                                         r"targets=None asks for none"):
        hcrfast.bound(model, x, 0.2, restarts=1, iterations=1, targeted_method="dense")


@pytest.mark.parametrize("solver", ["dense", "lsqr", "krylov"])
def test_a_float16_model_is_solved_in_float32_with_its_bounds_below_the_exact_std(solver):
    """A float16 linear model whose features are in the hundreds: the solver's sums of squares overflowed
    float16 (65504), LSQR's steps came out inf and the Krylov basis' tridiagonal NaN. hcrfast now solves with
    a float32 copy (the same weights), with a warning: the bounds are those of the float32 model and batch,
    and stay below the exact least-squares std of the float16 weights (pixel basis: σ·sqrt(diag((WᵀW)⁻¹)))."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(16, 24)
    with torch.no_grad():
        lin.weight.mul_(600)
        lin.bias.mul_(600)
    model = lin.half().eval()
    x = torch.randn(2, 16).half()
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x))
    kw = dict(restarts=2, iterations=2, solver=solver, basis="pixel")
    with pytest.warns(UserWarning, match="float16: hcrfast solves with a float32 copy"):
        res = hcrfast.bound(model, x, sigma, **kw)
    same = hcrfast.bound(model.float(), x.float(), sigma, **kw)
    np.testing.assert_array_equal(res.std, same.std)
    W = model.weight.detach().double().numpy()
    exact = sigma * np.sqrt(np.diag(np.linalg.inv(W.T @ W)))
    assert np.all(np.isfinite(res.std)) and np.all(res.std <= exact * (1 + 1e-9))
    assert np.median(res.std / exact) > 0.05       # a bound, not a vacuous 0


def test_on_cpu_the_automatic_chunk_holds_the_earlier_iterates_to_their_budget(tmp_path, monkeypatch):
    """iterates="all" keeps every earlier step of a chunk to screen and certify: a chunk sized for the solver
    alone held 6.2 GiB of them at R = 200, i = 50 on the MNIST MLP (0.9 GiB with iterates="last"). On CPUs the
    automatic chunk is now also held to algorithm._EARLIER_ELEMENTS for them (here: 2 examples of 3 × 2
    earlier steps), and gives the bounds of that chunk size passed by hand; iterates="last" keeps one chunk."""
    from hcrfast import algorithm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh()).eval()
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    kw = dict(restarts=3, iterations=3)
    monkeypatch.setattr(algorithm, "_EARLIER_ELEMENTS", 2 * algorithm._EARLIER_PER_STEP * 3 * 2 * (12 + 16))
    capped = hcrfast.bound(model, x, 0.05, checkpoint=tmp_path / "all", **kw)
    assert len(list((tmp_path / "all").glob("chunk_*.npz"))) == 3
    assert capped == hcrfast.bound(model, x, 0.05, chunk_size=2, **kw)
    hcrfast.bound(model, x, 0.05, iterates="last", checkpoint=tmp_path / "last", **kw)
    assert len(list((tmp_path / "last").glob("chunk_*.npz"))) == 1


class _Locked(torch.nn.Module):
    """A float16 model holding a lock: copy.deepcopy raises TypeError (cannot pickle '_thread.lock')."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.lock = threading.Lock()

    def forward(self, t):
        return torch.tanh(self.lin(t.flatten(1)))


class _CastsToHalf(torch.nn.Module):
    """A forward that casts its input to float16 itself: its float32 copy fails on a float32 batch."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, t):
        return torch.tanh(self.lin(t.flatten(1).half()))


@pytest.mark.parametrize("make", [_Locked, _CastsToHalf])
def test_a_float16_model_without_a_working_float32_copy_runs_in_float16_as_before(make):
    """A float16 model that cannot be copied, or whose copy casts back to float16, is solved as it is (it was
    before the float32 copy; with the copy, bound raised TypeError or a dtype mismatch), with certify=False
    since neither can be copied to float64 either: the bounds of its own float16 passes."""
    torch.manual_seed(0)
    model = make().half().eval()
    x = torch.randn(2, 1, 4, 4).half()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = hcrfast.bound(model, x, 0.1, certify=False, iterations=2, restarts=2)
    assert res.std.shape == (2, 1, 4, 4) and np.all(res.std >= 0) and np.any(res.std > 0)
    assert not [w for w in caught if "solves with a float32 copy" in str(w.message)]


def test_a_float16_model_reuses_its_factors_across_sigmas():
    """The factor store that sigma_for searches with keys on the model: on the float32 copy, a new object each
    call, a float16 model rebuilt every factor at every sigma. It keys on the user's model."""
    from hcrfast.algorithm import reusing_factors

    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float16):
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh()).to(dtype).eval()
        x = torch.randn(2, 1, 4, 4).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with reusing_factors(1 << 26):
                reused = [hcrfast.bound(model, x, s, iterations=2, restarts=2, solver="dense").params["reuse"]["examples"]
                          for s in (0.1, 0.2)]
        assert reused == [0, 2], dtype


def test_the_eta_leaves_out_the_first_chunks_one_off_costs(monkeypatch):
    """The first chunk's time holds a call's one-off costs: an ETA from the time per example since the call
    began said 247 s where 108 were left (800 examples). After a second chunk it is the later chunks' rate."""
    from hcrfast import algorithm

    clock = iter([0.0, 10.0, 11.0, 12.0])   # first chunk: 10 s for 10 examples (warm-up); then 1 s per 10
    monkeypatch.setattr(algorithm.time, "perf_counter", lambda: next(clock))
    eta = algorithm._Eta(algorithm.time.perf_counter())
    assert eta(10, 90) == pytest.approx(90.0)      # the first chunk's rate: nothing better yet
    assert eta(20, 80) == pytest.approx(8.0)       # 1 s per 10 since the first chunk, not 11 s per 20
    assert eta(30, 70) == pytest.approx(7.0)


@pytest.mark.parametrize("ids, hint", [(5, r"for 5 examples pass range\(5\)"), (None, r"pass e\.g\. range\(B\)")])
def test_start_vectors_refuses_a_count_for_the_example_ids_by_name(ids, hint):
    """start_vectors(5, ...) failed with list(5)'s "'int' object is not iterable", naming no argument."""
    with pytest.raises(TypeError, match=r"example_ids must be a sequence of non-negative integers.*" + hint):
        hcrfast.start_vectors(ids, 2, 3, seed=0, size=0.01, sigma=1.0)
    assert hcrfast.start_vectors(range(5), 2, 3, seed=0, size=0.01, sigma=1.0).shape == (10, 3)


def test_quick_krylov_bases_print_no_lines_of_their_own(capsys):
    """progress=True printed each basis' first and last steps, 3 lines a chunk (150 for 400 examples in chunks
    of 8): a chunk's line alone now, where its basis is built within _PROGRESS_EVERY seconds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh()).eval()
    hcrfast.bound(model, torch.randn(6, 1, 4, 4), 0.1, restarts=2, iterations=1, solver="krylov", chunk_size=2,
                  progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert not [line for line in lines if "still running" in line], lines
    assert sum("done" in line for line in lines) == 3, lines
    # the plan first: what the call computes, by which solver, in which chunks (a user saw none of it before the end)
    assert lines[0] == ("hcrfast.bound: 6 examples x 2 restarts x 1 iteration + 8 singular steps, by the Krylov "
                        "basis (1 pilot an example, at most 8 steps each), in 3 chunks of 2 (chunk_size); z_eps from "
                        "float64 forward passes"), lines


def test_a_slow_krylov_basis_says_how_far_it_got_and_where_it_ended(monkeypatch, capsys):
    """Past _PROGRESS_EVERY seconds a basis prints every 256 steps or that many seconds, and its last step, with the
    basis' step limit (a user saw 1304, 2840 ... steps and learned the goal, 3072, from the last line only)."""
    from hcrfast import algorithm

    clock = iter([0.0, 1.0, 11.0, 12.0, 13.0, 30.0, 31.0, 40.0, 51.0])
    monkeypatch.setattr(algorithm.time, "perf_counter", lambda: next(clock))
    report = algorithm._basis_progress(0, 4, 8, 0.0, limit=512)   # began at 0
    report(10, 4)     # 1 s: nothing yet
    report(20, 4)     # 11 s: the first line
    report(100, 4)    # 12 s: neither 256 steps nor 10 s since
    report(276, 2)    # 13 s: 256 steps since
    report(300, 1)    # 30 s: 10 s since
    report(310, 0)    # 31 s: the last step, after lines before
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("Krylov basis ")[1].split(" of at most 512 steps")[0] for line in lines] == ["20", "276", "300",
                                                                                                 "310"]
    assert lines[0].startswith("hcrfast.bound: examples 0-3 of 8: Krylov basis 20 of at most 512 steps")
    algorithm._basis_progress(5, 6, 8, 0.0)(7, 1)   # one example, began at 40 s: its line at 51 s
    assert capsys.readouterr().err.startswith("hcrfast.bound: example 5 of 8: Krylov basis 7 steps, 1 still running")


def test_the_first_eta_says_it_holds_the_one_off_costs(monkeypatch, capsys):
    from hcrfast import algorithm

    clock = iter([0.0, 10.0, 10.0, 11.0, 11.0])
    monkeypatch.setattr(algorithm.time, "perf_counter", lambda: next(clock))
    eta = algorithm._Eta(algorithm.time.perf_counter())
    algorithm._progress_line("hcrfast", "examples 10/100", 0.0, eta, 10, 100)
    algorithm._progress_line("hcrfast", "examples 20/100", 0.0, eta, 20, 100)
    first, second = capsys.readouterr().err.splitlines()
    assert first.endswith("ETA 90 s (from the first chunk, which holds the call's one-off costs))"), first
    assert second.endswith("ETA 8 s)"), second


def test_start_vectors_draw_on_no_more_threads_than_torch_is_given(monkeypatch):
    """start_vectors drew large batches on min(cpu_count, 16) threads whatever torch.set_num_threads said (the
    user's limit, which the LAPACK loops honour): one thread now where torch has one."""
    import concurrent.futures

    from hcrfast import algorithm

    seen = []
    real = concurrent.futures.ThreadPoolExecutor

    def spy(*args, **kwargs):
        seen.append(kwargs.get("max_workers"))
        return real(*args, **kwargs)

    monkeypatch.setattr(algorithm.concurrent.futures, "ThreadPoolExecutor", spy)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = hcrfast.start_vectors(range(4), 4, 70000, seed=0, size=0.005, sigma=0.1)
        torch.set_num_threads(2)
        two = hcrfast.start_vectors(range(4), 4, 70000, seed=0, size=0.005, sigma=0.1)
    finally:
        torch.set_num_threads(threads)
    assert seen in ([], [2]) and np.array_equal(one, two)   # (one core here: no pool at all)


def test_restarts_too_many_for_memory_are_named(monkeypatch):
    """restarts=10**12 ended in NumPy's "Unable to allocate 14.6 TiB", naming no argument. (NumPy's refusal is
    stood in for: a machine that overcommits memory might grant those zeros and go on to draw the steps.)"""
    real = np.zeros

    def zeros(shape, *args, **kwargs):
        if isinstance(shape, tuple) and 10**12 in shape:
            raise MemoryError("Unable to allocate 14.6 TiB for an array")
        return real(shape, *args, **kwargs)

    monkeypatch.setattr(np, "zeros", zeros)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh()).eval()
    with pytest.raises(MemoryError, match=r"2 examples x restarts=1000000000000 x iterations=2 .* pass fewer "
                                          r"restarts or iterations"):
        hcrfast.bound(model, torch.randn(2, 1, 4, 4), 0.1, restarts=10**12, iterations=2)


class _SwitchesAfter(torch.nn.Module):
    """A fixed tanh MLP whose features double once it has run ``calls`` forwards (a counter, as a cache filled or
    a warm-up schedule would): a model that changes itself once, during the call."""

    def __init__(self, calls: int):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh(),
                                       torch.nn.Linear(12, 10))
        self.calls, self.switch = 0, calls

    def forward(self, x):
        self.calls += 1
        return self.net(x) * (2.0 if self.calls > self.switch else 1.0)


@pytest.mark.parametrize("entry", ["dense", "lsqr", "targeted"])
def test_a_model_that_changes_itself_during_the_call_is_refused_wherever_it_switches(entry):
    """The entry checks refuse a forward that changes at each call, but one that doubled its features after its
    fifth call passed them: its bounds were those of the doubled function, half those of the function it computed
    when called. At whatever forward the model switches during a call, the call is now refused; where it never
    switches (or from its first forward on: a fixed function) the bounds are those of that fixed function."""
    x = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(1))

    def call(model, sigma=0.3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if entry == "targeted":
                return hcrfast.targeted_bound(model, x, sigma, targets=[0, 1]).std
            return hcrfast.bound(model, x, sigma, restarts=2, iterations=2, solver=entry).std

    fixed = call(_SwitchesAfter(10**9).eval())
    # doubled from its first forward on: a fixed function, whose bounds at 2 sigma are those of the net at sigma
    np.testing.assert_allclose(call(_SwitchesAfter(0).eval(), 0.6), fixed, rtol=1e-9)
    refused = []
    for calls in range(1, 13):
        model = _SwitchesAfter(calls).eval()
        try:
            got = call(model)
        except ValueError as exc:
            # (never "mixes the examples": the refusal at a switch between the probes' forwards said that, where
            # no example's derivative reached another's features)
            assert re.search(r"changed during this call|not a fixed function|other features for the same batch",
                             str(exc)), str(exc)
            refused.append(calls)
            continue
        assert model.calls <= calls, f"switched after forward {calls} of {model.calls}, and not refused"
        np.testing.assert_array_equal(got, fixed)
    assert 5 in refused   # the switch that passed every check before


@pytest.mark.parametrize("entry", ["dense", "lsqr", "targeted"])
def test_the_same_call_made_again_after_a_refusal_for_a_model_that_changed_does_not_return_its_chunks(entry,
                                                                                                       tmp_path):
    """A model that changed itself during a checkpointed call was refused at the end of the call, but the chunks
    the call had saved stayed: the same call made again (a fresh instance of the model) read every one back, had
    nothing left to compute, so its end check never ran, and returned bounds of two functions, ~0.5x those of the
    model at the first call's start. The refused call now removes its chunks: the same call made again computes
    afresh and is refused again, and the model that stays fixed gets its own bounds from that folder."""
    x = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    folder = tmp_path / "ck"

    def call(model, checkpoint=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if entry == "targeted":
                return hcrfast.targeted_bound(model, x, 0.3, targets=[0, 1], checkpoint=checkpoint).std
            return hcrfast.bound(model, x, 0.3, restarts=2, iterations=2, solver=entry, checkpoint=checkpoint).std

    fixed = call(_SwitchesAfter(10**9).eval())
    refusals = []
    for attempt in ("the call", "the same call made again"):   # (the second returned the first's mixture)
        with pytest.raises(ValueError, match="changed during this call") as refused:
            call(_SwitchesAfter(5).eval(), folder)
        refusals.append(str(refused.value))
    assert not folder.exists()   # the call made it: nothing of it is left
    np.testing.assert_array_equal(call(_SwitchesAfter(10**9).eval(), folder), fixed)
    for text in refusals:   # (the model changes during its first chunk: refused before that chunk's save)
        assert re.search(r"no chunk of this call was saved in .*: the check before its first save refused it; the key "
                         r"this call wrote was removed: the folder is as it was before the call", text), text


def test_a_chunk_size_above_the_batch_halves_from_the_examples_the_chunk_held():
    """6 examples at chunk_size=32: out of memory, the chunk halved to 16, then 8, each still all 6 examples, the
    same failing chunk computed again twice before 4 took effect."""
    inner = _small_tanh_net()
    x = torch.as_tensor(np.random.default_rng(5).standard_normal((6, 1, 4, 4)))
    kw = dict(iterations=2, restarts=2, lsqr=FAST, seed=3, solver="lsqr")
    tight = OutOfMemoryAbove(inner, grad_rows=8).eval()   # 6 or 3 examples x 2 restarts: refused; 2 x 2 fits
    halved = []
    import hcrfast.algorithm as algorithm_module
    real = algorithm_module._in_chunks

    def watched(*args, on_halve=None, **kwargs):
        def told(size):
            halved.append(size)
            if on_halve is not None:
                on_halve(size)
        return real(*args, on_halve=told, **kwargs)

    algorithm_module._in_chunks = watched
    try:
        got = hcrfast.bound(tight, x, 0.2, chunk_size=32, **kw)
    finally:
        algorithm_module._in_chunks = real
    assert halved == [3]   # half of the 6 it held (it went 16, 8, 4, each chunk of 16 and 8 all 6 examples again)
    np.testing.assert_allclose(got.std, hcrfast.bound(inner, x, 0.2, chunk_size=1, **kw).std, rtol=1e-6)


def test_a_last_iterate_of_zero_does_not_undo_the_earlier_iterates_it_certifies():
    """iterates='all', linearized at the current point, a saturating tanh and a sigma far above the features: J is 0
    at theta + eps(2), so eps(3) comes out 0. The call was refused ('every step's eps came out 0 ... outside the range
    the float64 solver resolves') though eps(1) and eps(2) are certified steps, and with more restarts the others were
    said to 'bound nothing (0)' though they bounded through their earlier iterates."""
    torch.manual_seed(2)
    m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 20), torch.nn.Tanh(),
                            torch.nn.Linear(20, 12)).double().eval()
    x = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(5)).double()
    kw = dict(size=1.5, restarts=1, linearize_at="current", warm_start=False, iterates="all")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        two = hcrfast.bound(m, x, 200.0, iterations=2, **kw)
        three = hcrfast.bound(m, x, 200.0, iterations=3, **kw)
    np.testing.assert_array_equal(three.std, two.std)   # eps(3) = 0 adds nothing, takes nothing away
    assert not three.params["zero_step_reasons"]


def test_every_warning_of_hcrfast_is_an_hcrfast_warning_that_one_filter_silences():
    """hcrfast's warnings are UserWarnings and RuntimeWarnings as before, and also ``hcrfast.HcrfastWarning``: one
    filter silences them and no other, and the command line tells them from the user's model's own."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 5), torch.nn.Dropout(0.1)).train()
    x = torch.randn(2, 1, 4, 4)

    class Warns(torch.nn.Module):   # the user's own warning, inside the forward
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, t):
            warnings.warn("the user's own", UserWarning)
            return self.m(t)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hcrfast.bound(Warns(), x, 0.5, restarts=2, iterations=2, singular_steps=99, solver="dense")
    ours = [w for w in caught if "the user's own" not in str(w.message)]
    assert len(ours) >= 2   # training mode switched; singular_steps capped
    assert all(issubclass(w.category, hcrfast.HcrfastWarning) and issubclass(w.category, UserWarning) for w in ours)
    assert not any(issubclass(w.category, hcrfast.HcrfastWarning) for w in caught if w not in ours)
    assert model.training
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=hcrfast.HcrfastWarning)
        hcrfast.bound(Warns(), x, 0.5, restarts=2, iterations=2, singular_steps=99, solver="dense")
    assert [str(w.message) for w in caught] and all("the user's own" in str(w.message) for w in caught)
    assert issubclass(hcrfast.HcrfastRuntimeWarning, RuntimeWarning)


def test_progress_says_what_a_long_chunk_is_doing_where_it_has_no_line_of_its_own(monkeypatch, capfd):
    """progress=True printed nothing for minutes where a chunk ran the dense solve, the certification's forward
    passes or the singular steps (ResNet-18 at 64x64: 117 s, the run's one line at its end). A heartbeat now says,
    every _HEARTBEAT_EVERY seconds without another line, which of hcrfast's phases the chunk is in."""
    import time

    from hcrfast import algorithm

    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh())

        def forward(self, t):
            time.sleep(0.01)
            return self.net(t)

    monkeypatch.setattr(algorithm, "_HEARTBEAT_EVERY", 0.2)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    model = Slow().double().eval()
    quiet = hcrfast.bound(model, x.double(), 0.3, restarts=2, iterations=3, solver="dense")
    assert "into this chunk" not in capfd.readouterr().err
    res = hcrfast.bound(model, x.double(), 0.3, restarts=2, iterations=3, solver="dense", progress=True)
    lines = [line for line in capfd.readouterr().err.splitlines() if "into this chunk" in line]
    assert lines, "no heartbeat"
    known = {"certify", "certify-screen", "dense-factor", "dense-solve", "restart", "singular-steps", "dct",
             "checkpoint", "setting up", "jvp", "vjp"}
    for line in lines:
        assert re.match(r"hcrfast.bound: examples 0-1 of 2: (.+), \d+ s into this chunk \(\d+\.\d s\)$", line), line
        phase = re.match(r"hcrfast.bound: examples 0-1 of 2: (.+), \d+ s", line).group(1)
        assert set(phase.split(" > ")) <= known, phase
    np.testing.assert_array_equal(res.std, quiet.std)
    assert not [t for t in threading.enumerate() if t.name == "hcrfast-heartbeat"]


def _ids_digest(ids):
    """The oracle of params["run"]["example_ids"]["sha256"]: hashlib's SHA-256 of the little-endian int64 ids."""
    import hashlib

    return hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()[:16]


def _tanh_mlp():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh()).double().eval()


def test_params_record_the_ids_chunk_size_threads_and_versions_a_rerun_needs():
    """example_ids [0, 1] and [7, 8] gave other bounds with identical params (minus timings), as did chunk_size
    auto and 1, and torch's thread count: a saved result did not say how to compute it again. params["run"]
    says, and == leaves it out."""
    model = _tanh_mlp()
    x = torch.as_tensor(np.random.default_rng(3).standard_normal((2, 1, 4, 4)))
    kw = dict(restarts=3, iterations=3, seed=5, solver="lsqr")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = hcrfast.bound(model, x, 0.5, **kw)
    finally:
        torch.set_num_threads(threads)
    b = hcrfast.bound(model, x, 0.5, example_ids=[7, 8], **kw)
    c = hcrfast.bound(model, x, 0.5, chunk_size=1, **kw)
    assert not np.array_equal(a.std, b.std)              # other noise: other bounds
    assert a.params["run"]["example_ids"] == dict(count=2, first=0, last=1, sha256=_ids_digest([0, 1]), ids=[0, 1])
    assert b.params["run"]["example_ids"] == dict(count=2, first=7, last=8, sha256=_ids_digest([7, 8]), ids=[7, 8])
    assert a.params["run"]["chunk_size"] == 2 and c.params["run"]["chunk_size"] == 1   # auto: the batch in one
    assert a.params["run"]["torch_threads"] == 1 and b.params["run"]["torch_threads"] == threads
    versions = a.params["run"]["versions"]
    assert versions["torch"] == torch.__version__ and versions["numpy"] == np.__version__
    assert versions["hcrfast"] == hcrfast.__version__ and versions["scipy"] == scipy.__version__
    # many ids: described, not listed
    many = hcrfast.bound(model, x[[0] * 17], 0.5, example_ids=range(100, 117), restarts=1, iterations=1,
                         solver="lsqr").params["run"]["example_ids"]
    assert many == dict(count=17, first=100, last=116, sha256=_ids_digest(range(100, 117)))
    # recorded, not compared: a call that differs only in them is the same result where the bits agree
    assert a.params["run"] != c.params["run"] and (a == c) == np.array_equal(a.std, c.std)


def test_calls_at_other_thread_counts_that_agree_bitwise_compare_equal():
    """A float64 dense solve gives the same bits at 1 and 2 torch threads: its results compare == though their
    params["run"] record other thread counts (recorded, not compared)."""
    model = _tanh_mlp()
    x = torch.as_tensor(np.random.default_rng(4).standard_normal((3, 1, 4, 4)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = hcrfast.bound(model, x, 0.5, restarts=3, iterations=2, solver="dense")
        torch.set_num_threads(2)
        two = hcrfast.bound(model, x, 0.5, restarts=3, iterations=2, solver="dense")
    finally:
        torch.set_num_threads(threads)
    assert (one.params["run"]["torch_threads"], two.params["run"]["torch_threads"]) == (1, 2)
    for name in ("std", "mse", "eps", "z", "divergence"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name), err_msg=name)
    assert one == two and not one != two


def test_a_resumed_result_records_the_whole_batch_and_the_resuming_calls_run(tmp_path):
    """A result merged from checkpoint chunks: params["run"] names every example's id (not the computed ones
    alone) and the resuming call's thread count and chunk size."""
    model = _tanh_mlp()
    x = torch.as_tensor(np.random.default_rng(5).standard_normal((3, 1, 4, 4)))
    ids = [4, 9, 20]
    kw = dict(restarts=2, iterations=2, solver="dense", example_ids=ids, checkpoint=tmp_path / "ck")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        whole = hcrfast.bound(model, x, 0.5, chunk_size=1, **kw)
        chunks = sorted((tmp_path / "ck").glob("chunk_*.npz"))
        assert len(chunks) == 3
        chunks[1].unlink()
        torch.set_num_threads(1)
        with pytest.warns(UserWarning, match="different arithmetic"):
            resumed = hcrfast.bound(model, x, 0.5, chunk_size=1, **kw)
    finally:
        torch.set_num_threads(threads)
    assert resumed.params["checkpoint"]["examples_read_back"] == 2
    run = resumed.params["run"]
    assert run["example_ids"] == dict(count=3, first=4, last=20, sha256=_ids_digest(ids), ids=ids)
    assert run["torch_threads"] == 1 and run["chunk_size"] == 1 and whole.params["run"]["torch_threads"] == 2
    assert resumed == whole       # float64 dense: the same bits at either thread count


class _Times(torch.nn.Module):
    """``model``'s features times ``c``."""

    def __init__(self, model, c):
        super().__init__()
        self.model, self.c = model, c

    def forward(self, x):
        return self.model(x) * self.c


@pytest.mark.parametrize("solver", ["lsqr", "krylov", "dense"])
def test_features_and_sigma_scaled_together_give_the_same_bounds(solver):
    """D depends on z/sigma alone, so features and sigma scaled by one c are the same problem. In float32, at
    c = 1e20 every solver refused ("overflowed": the steps' squares left float32) and at c = 1e-20 LSQR and
    the Krylov solve refused (every eps 0: their vectors' squares underflowed). A sigma that far from 1 now
    runs on the features divided by it, and the result reads as the sigma call's."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    x = torch.randn(3, 6)
    kw = dict(restarts=2, iterations=3, seed=0, solver=solver, basis="pixel")
    base = hcrfast.bound(net, x, 0.1, **kw)
    assert "features_divided_by" not in base.params
    for c in (1e20, 1e-20):
        got = hcrfast.bound(_Times(net, c).eval(), x, 0.1 * c, **kw)
        np.testing.assert_allclose(got.std, base.std, rtol=2e-3)
        np.testing.assert_allclose(np.asarray(got.z) / c, base.z, rtol=2e-3, atol=1e-3 * np.abs(base.z).max())
        assert got.params["sigma"] == 0.1 * c and got.params["features_divided_by"] == 0.1 * c
        assert got.params["noise"] == Gaussian(0.1 * c).describe() == got.params["noise_asked"]


def test_targeted_bounds_of_float64_features_near_1e_minus_160_are_those_near_1():
    """bound(targets=) on float64 features ~1e-160 with sigma to match overflowed in the dense minimum-norm
    directions (their squares, 1e-320, leave float64); they are the problem of features ~1 and sigma ~1."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).double().eval()
    x = torch.randn(3, 6, dtype=torch.float64)
    kw = dict(restarts=2, iterations=3, seed=0, solver="dense", basis="pixel", targets="all")
    base = hcrfast.bound(net, x, 0.1, **kw)
    got = hcrfast.bound(_Times(net, 1e-160).eval(), x, 1e-161, **kw)
    np.testing.assert_allclose(got.std, base.std, rtol=1e-6)
    np.testing.assert_allclose(got.targeted.std, base.targeted.std, rtol=1e-6)
    assert got.targeted.params["sigma"] == 1e-161


def test_a_checkpoint_begun_on_the_undivided_features_is_resumed_as_it_was_begun(tmp_path, monkeypatch):
    """A call at a sigma that far from 1 made before 2026-12-02 ran on the features as they are; its checkpoint,
    resumed by this version, was refused as another model and noise ("Make the same call", which it was). It
    is resumed as it was begun: every example read back, the same bits; a new folder divides."""
    import hcrfast.noise

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    model, x = _Times(net, 1e-11).eval(), torch.randn(3, 6)
    kw = dict(restarts=2, iterations=2, basis="pixel", solver="dense")
    with monkeypatch.context() as m:
        m.setattr(hcrfast.noise, "whitened_scale", lambda sigma, batch: None)   # as the versions before ran
        first = hcrfast.bound(model, x, 1e-12, checkpoint=tmp_path / "ck", **kw)
    again = hcrfast.bound(model, x, 1e-12, checkpoint=tmp_path / "ck", **kw)
    assert again.std.tobytes() == first.std.tobytes() and "features_divided_by" not in again.params
    assert again.params["checkpoint"]["examples_read_back"] == 3
    fresh = hcrfast.bound(model, x, 1e-12, checkpoint=tmp_path / "new", **kw)
    assert fresh.params["features_divided_by"] == 1e-12
    np.testing.assert_allclose(fresh.std, first.std, rtol=1e-4)


class _DividesInputs(torch.nn.Module):
    """``model`` on its inputs divided by ``c`` (its own normalization)."""

    def __init__(self, model, c):
        super().__init__()
        self.model, self.c = model, c

    def forward(self, x):
        return self.model(x / self.c)


@pytest.mark.parametrize("solver", ["lsqr", "krylov", "dense"])
def test_inputs_scaled_by_c_give_bounds_scaled_by_c(solver):
    """Inputs times c with a model that divides them by c first is the same problem in other units: every
    bound and step times c (mse times c^2). In float32 at c = 1e-20, LSQR and the Krylov solve refused
    ("overflowed": J ~ 1e20, their vectors' squares left float32), and at 1e30 they found every step 0; the
    refusals named sigma. A batch that far from 1 now runs divided by a power of two, exactly."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    x = torch.randn(3, 6)
    kw = dict(restarts=2, iterations=3, seed=0, solver=solver, basis="pixel")
    base = hcrfast.bound(net, x, 0.1, **kw)
    assert "inputs_divided_by" not in base.params
    for c in (1e-20, 1e30):
        got = hcrfast.bound(_DividesInputs(net, c).eval(), x * c, 0.1, **kw)
        np.testing.assert_allclose(got.std / c, base.std, rtol=2e-3)
        np.testing.assert_allclose(got.mse / c ** 2, base.mse, rtol=4e-3)
        np.testing.assert_allclose(np.asarray(got.eps) / c, base.eps, rtol=2e-3, atol=2e-3 * np.abs(base.eps).max())
        np.testing.assert_allclose(got.z, base.z, rtol=2e-3, atol=1e-3 * np.abs(base.z).max())
        k = math.log2(got.params["inputs_divided_by"])
        assert k == round(k) and abs(math.log2(c) - k) < 4


@pytest.mark.parametrize("solver", ["lsqr", "krylov", "dense"])
def test_tiny_inputs_of_a_model_that_does_not_normalize_them_are_bounded_as_they_are(solver, tmp_path):
    """Inputs of 1e-160 (and 1e-300) with sigma = 1 and a linear model that takes them as they are: the batch
    was divided by ~2^-531, which assumes steps the inputs' size, and the divided steps were ~1e157, whose
    squares overflowed: the dense and LSQR solves reported every bound 0 (and an mse 4e10 times too small)
    with no word, at 1e-300 LSQR and Krylov refused. Such a call now runs again on the batch as it is: the
    bounds are the inputs-near-1 call's (nothing depends on theta), below the least-squares std (an oracle of
    numpy's), and a checkpoint folder resumes it."""
    rng = np.random.default_rng(0)
    shape, n, p = (1, 4, 4), 20, 16
    W = rng.standard_normal((n, p))
    model = linear_model(W, np.zeros(n), shape)
    x = torch.as_tensor(rng.standard_normal((2,) + shape))
    kw = dict(restarts=3, iterations=3, seed=0, solver=solver)
    base = hcrfast.bound(model, x, 1.0, **kw)
    crb = np.diag(dct_basis(shape) @ np.linalg.inv(W.T @ W) @ dct_basis(shape).T)
    for c in (1e-160, 1e-300):
        got = hcrfast.bound(model, x * c, 1.0, **kw)
        assert "inputs_divided_by" not in got.params
        std = got.std.reshape(2, p)
        assert np.median(std) > 0.1 * np.median(np.sqrt(crb)) and (std ** 2 / crb).max() <= 1 + 1e-9
        np.testing.assert_allclose(got.std, base.std, rtol=1e-9)
        np.testing.assert_allclose(got.mse, base.mse, rtol=1e-9)
    first = hcrfast.bound(model, x * 1e-160, 1.0, checkpoint=tmp_path / "ck", **kw)
    again = hcrfast.bound(model, x * 1e-160, 1.0, checkpoint=tmp_path / "ck", **kw)
    assert again.params["checkpoint"]["examples_read_back"] == 2
    assert again.std.tobytes() == first.std.tobytes() and "inputs_divided_by" not in again.params
    # targeted_bound takes the same way
    want = hcrfast.targeted_bound(model, x, 1.0)
    np.testing.assert_allclose(hcrfast.targeted_bound(model, x * 1e-160, 1.0).std, want.std, rtol=1e-9)


class _RescalesTinyExamples(torch.nn.Module):
    """W θ, times 1e130 for an example whose values are all below 1e-130 (it normalizes those alone)."""

    def __init__(self, W):
        super().__init__()
        self.lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False).double()
        with torch.no_grad():
            self.lin.weight.copy_(torch.as_tensor(W))

    def forward(self, x):
        flat = x.flatten(1)
        tiny = flat.abs().amax(dim=1, keepdim=True) < 1e-130
        one = torch.tensor(1.0, dtype=flat.dtype)
        return self.lin(flat) * torch.where(tiny, 1e130 * one, one)


def test_a_divided_batch_whose_later_piece_fails_runs_again_in_its_empty_checkpoint_folder(tmp_path, capsys):
    """A review's findings on the rerun above: a call whose first piece finished on the divided batch and whose
    second failed was never run again with a checkpoint folder, even one empty before the call (the failed call's
    key and chunk stayed, and refused it; every later call resumed the divided one); now the failed call's own
    files are removed, the call runs again undivided, says so with progress=True, and its folder resumes. Steps
    whose ‖ε‖² overflows on a batch not divided are computed as before (the dense solve bounded every mode of a
    model of J ~ 1e-157 exactly, where the first version of the check refused them), with a warning; and the attack
    runs again undivided too (it refused the divided batch: its errors overflowed)."""
    rng = np.random.default_rng(1)
    W = rng.standard_normal((20, 16))
    model = _RescalesTinyExamples(W).eval()
    x = torch.as_tensor(rng.standard_normal((2, 1, 4, 4)))
    x[0] *= 1e-160   # normalized by the model: fine divided
    x[1] *= 1e-120   # taken as it is: its divided steps overflow
    kw = dict(restarts=3, iterations=3, seed=0, solver="dense", chunk_size=1)
    want = hcrfast.bound(model, x, 1.0, **kw)
    assert "inputs_divided_by" not in want.params
    first = hcrfast.bound(model, x, 1.0, checkpoint=tmp_path / "ck", progress=True, **kw)
    assert first.std.tobytes() == want.std.tobytes()
    assert "running again on the batch as it is" in capsys.readouterr().err
    again = hcrfast.bound(model, x, 1.0, checkpoint=tmp_path / "ck", **kw)
    assert again.params["checkpoint"]["examples_read_back"] == 2 and again.std.tobytes() == want.std.tobytes()
    # a folder begun on the divided batch by an earlier call (killed before its second piece) is not run again
    with pytest.MonkeyPatch.context() as m, warnings.catch_warnings():   # (made so: its second piece then lost)
        warnings.simplefilter("ignore")
        m.setattr(hcrfast.algorithm, "_check_perturbations", lambda *a, **k: None)
        hcrfast.bound(model, x, 1.0, checkpoint=tmp_path / "begun", **kw)
    (tmp_path / "begun" / "chunk_000000001_000000002.npz").unlink()
    with pytest.raises(hcrfast.validation.StepsOutOfRange) as err:
        hcrfast.bound(model, x, 1.0, checkpoint=tmp_path / "begun", **kw)
    assert "holds work begun on the divided batch by an earlier call: pass another folder" in str(err.value.__notes__)
    assert (tmp_path / "begun" / "chunk_000000000_000000001.npz").exists()   # (the earlier call's piece stays)
    # steps of ~1e155 on a batch near 1 (not divided): bounded as before, with a warning
    lin = linear_model(W * 1e-157, np.zeros(20), (1, 4, 4))
    near = torch.as_tensor(rng.standard_normal((2, 1, 4, 4)))
    for basis in ("pixel", "dct"):
        with pytest.warns(UserWarning, match="have a norm whose square overflows float64"):
            huge = hcrfast.bound(lin, near, 1.0, restarts=3, iterations=3, seed=0, solver="dense", basis=basis)
        unit = hcrfast.bound(linear_model(W, np.zeros(20), (1, 4, 4)), near, 1.0, restarts=3, iterations=3, seed=0,
                             solver="dense", basis=basis)
        if basis == "pixel":   # (exact coordinates: every mode's bound as at J ~ 1)
            np.testing.assert_allclose(huge.std * 1e-157, unit.std, rtol=1e-9)
        else:   # (the DCT's rounding, lowered by ‖ε‖ taken from its square: lower, never above, not 0)
            assert np.all(huge.std * 1e-157 <= unit.std * (1 + 1e-9)) and np.all(huge.std > 0)
    # bound(targets=) runs again too, and its own targeted_bound calls, with its directions, are not divided again
    # (they were, their directions not: bounds 6e-6 off, and a chunk run twice)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hcrfast.noise, "input_scale", lambda model, batch: None)
        undivided = hcrfast.bound(model, x, 1.0, targets=[0, 1], **kw)
    targeted = hcrfast.bound(model, x, 1.0, targets=[0, 1], **kw)
    assert targeted.std.tobytes() == undivided.std.tobytes()
    assert targeted.targeted.std.tobytes() == undivided.targeted.std.tobytes()
    # the attack
    plain = linear_model(W, np.zeros(20), (1, 4, 4))
    base = hcrfast.gauss_newton_attack(plain, near, 1.0, draws=2, seed=0)
    tiny = hcrfast.gauss_newton_attack(plain, near * 1e-160, 1.0, draws=2, seed=0)
    np.testing.assert_allclose(tiny.rmse, base.rmse, rtol=1e-9)
    assert "inputs_divided_by" not in tiny.params


def test_targeted_bounds_of_float64_inputs_near_1e_minus_150_are_those_near_1():
    """bound(targets=) and targeted_bound on float64 inputs ~1e-150 (the model dividing them) are the problem of
    inputs near 1, in units 1e-150 smaller."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).double().eval()
    x = torch.randn(3, 6, dtype=torch.float64)
    model, c = _DividesInputs(net, 1e-150).eval(), 1e-150
    kw = dict(restarts=2, iterations=3, seed=0, solver="dense", basis="pixel", targets="all")
    base, got = hcrfast.bound(net, x, 0.1, **kw), hcrfast.bound(model, x * c, 0.1, **kw)
    np.testing.assert_allclose(got.std / c, base.std, rtol=1e-6)
    np.testing.assert_allclose(got.targeted.std / c, base.targeted.std, rtol=1e-6)
    np.testing.assert_allclose(got.std_algorithm1 / c, base.std_algorithm1, rtol=1e-6)
    direct, want = (hcrfast.targeted_bound(m, b, 0.1, basis="pixel") for m, b in ((model, x * c), (net, x)))
    np.testing.assert_allclose(direct.std / c, want.std, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(direct.eps) / c, want.eps, rtol=1e-6, atol=1e-9 * np.abs(want.eps).max())


def test_a_checkpoint_begun_on_the_undivided_inputs_is_resumed_as_it_was_begun(tmp_path, monkeypatch):
    """As for sigma: a call on inputs that far from 1 begun before 2026-12-02 (on the inputs as they are) is
    resumed as it was begun, every example read back; a new folder divides."""
    import hcrfast.noise

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    model, x = _DividesInputs(net, 1e20).eval(), torch.randn(3, 6) * 1e20
    kw = dict(restarts=2, iterations=2, basis="pixel", solver="dense")
    with monkeypatch.context() as m:
        m.setattr(hcrfast.noise, "input_scale", lambda model, batch: None)   # as the versions before ran
        first = hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "ck", **kw)
    again = hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "ck", **kw)
    assert again.std.tobytes() == first.std.tobytes() and "inputs_divided_by" not in again.params
    assert again.params["checkpoint"]["examples_read_back"] == 3
    fresh = hcrfast.bound(model, x, 0.1, checkpoint=tmp_path / "new", **kw)
    k = math.log2(fresh.params["inputs_divided_by"])   # a power of two near the batch's typical magnitude
    assert k == round(k) and abs(k - math.log2(1e20)) < 4
    np.testing.assert_allclose(fresh.std, first.std, rtol=1e-4)


def test_an_lsqr_damp_is_read_in_the_units_of_the_call():
    """LSQR's damp weighs ||eps|| against ||J eps - z||: in J's units. With the features divided by a sigma far
    from 1 (or the inputs by a power of two) it was passed as given, to a J 1e20 times smaller: every step came
    out 0 (refused as a sigma far from the features). The problem in other units, damp in those units, gives the
    c = 1 bounds; params record the damp as given."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    x = torch.randn(3, 6)
    kw = dict(restarts=2, iterations=2, seed=0, solver="lsqr", basis="pixel")
    base = hcrfast.bound(net, x, 0.1, lsqr=hcrfast.LSQROptions(damp=2.0), **kw)
    c = 1e20
    features = hcrfast.bound(_Times(net, c).eval(), x, 0.1 * c, lsqr=hcrfast.LSQROptions(damp=2.0 * c), **kw)
    inputs = hcrfast.bound(_DividesInputs(net, 1 / c).eval(), x / c, 0.1, lsqr=hcrfast.LSQROptions(damp=2.0 * c), **kw)
    # (float32 LSQR: its rounding moves where a damped solve stops, single modes by up to ~4e-3 here)
    np.testing.assert_allclose(features.std, base.std, rtol=5e-3)
    np.testing.assert_allclose(inputs.std * c, base.std, rtol=5e-3)
    assert features.params["lsqr"]["damp"] == inputs.params["lsqr"]["damp"] == 2.0 * c


def test_a_checkpoint_of_a_far_sigma_resumed_at_another_names_sigma_alone():
    """A checkpoint made at sigma = 1e19 (features divided by it) and called again at 2e19 was refused with
    "model: 'PerFeatureStd:sha256:...' -> 'PerFeatureStd:sha256:...'; noise: 'ScaledGaussian(sigma=1.0, scale=1e+19)'
    -> ...": the user changed sigma alone, and was told the model changed, in hcrfast's internal names."""
    import tempfile

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    model, x = _Times(net, 1e20).eval(), torch.randn(2, 6)
    kw = dict(restarts=2, iterations=2, basis="pixel", solver="dense")
    with tempfile.TemporaryDirectory() as folder:
        hcrfast.bound(model, x, 1e19, checkpoint=folder, **kw)
        with pytest.raises(hcrfast.CheckpointMismatchError) as err:
            hcrfast.bound(model, x, 2e19, checkpoint=folder, **kw)
    text = str(err.value)
    assert ("(noise: 'Gaussian(sigma=1e+19) on the features divided by sigma' -> 'Gaussian(sigma=2e+19) on the "
            "features divided by sigma')") in text and "ScaledGaussian" not in text and "model:" not in text


def test_a_batch_of_mixed_scales_is_left_undivided_and_a_divisor_is_keyed():
    """Dividing a batch by its largest value (one tabular column in units of 1e20 among columns near 1) made the
    other columns ~1e-20 and their rows of J ~1e20: LSQR and the Krylov solve overflowed where the batch as it is
    ran. Only a batch whose typical value is far from 1 is divided now. And x and 2x divided by 2^k and 2^(k+1)
    are the same bits: a checkpoint of one resumed the other, wrong; the divisor is in the key."""
    import tempfile

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    unit = torch.tensor([1e20, 1, 1, 1, 1, 1.0])
    model, x = _DividesInputs(net, unit).eval(), torch.randn(3, 6) * unit
    kw = dict(restarts=2, iterations=2, basis="pixel")
    dense = hcrfast.bound(model, x, 0.1, solver="dense", **kw)
    krylov = hcrfast.bound(model, x, 0.1, solver="krylov", **kw)
    hcrfast.bound(model, x, 0.1, solver="lsqr", **kw)   # (refused as an overflow before)
    assert "inputs_divided_by" not in krylov.params and "inputs_divided_by" not in dense.params
    np.testing.assert_allclose(krylov.std, dense.std, rtol=1e-4)
    # values near 1e20 and one in units of 1e-30: divided by 2^66, that one would underflow (not bit for bit)
    tiny = torch.tensor([1e20] * 5 + [1e-30])
    assert hcrfast.noise.input_scale(_DividesInputs(net, tiny), torch.randn(3, 6) * tiny) is None
    far = _DividesInputs(net, 1e20).eval()
    x = torch.randn(3, 6) * 1e20
    with tempfile.TemporaryDirectory() as folder:
        hcrfast.bound(far, x, 0.1, solver="dense", checkpoint=folder, **kw)
        with pytest.raises(hcrfast.CheckpointMismatchError, match=r"\(batch: '.*; inputs divided by 2\^(\d+)' -> "
                                                                 r"'.*; inputs divided by 2\^(\d+)'\)"):
            hcrfast.bound(far, 2 * x, 0.1, solver="dense", checkpoint=folder, **kw)


def test_a_warning_quotes_lsqr_s_damp_as_given_where_the_features_are_divided():
    """The warm-start warning quoted LSQROptions(damp=0.1), the divided problem's value, for damp=1e18 at
    sigma = 1e19; it quotes what the user wrote."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8)).eval()
    with pytest.warns(hcrfast.HcrfastWarning, match=r"warm_start=True does not apply with LSQROptions\(damp=1e\+18\)"):
        hcrfast.bound(_Times(net, 1e20).eval(), torch.randn(2, 6), 1e19, restarts=2, iterations=2, basis="pixel",
                      solver="lsqr", lsqr=hcrfast.LSQROptions(damp=1e18))


def test_the_typical_value_of_a_batch_is_not_taken_from_one_column():
    """input_scale took every k-th value: with rows of 6 and 65,536 rows the stride was 6, and every value it
    saw was column 0's (units of 1e20): the batch was divided as if all of it were, where 4 such rows were not."""
    unit = torch.tensor([1e20, 1, 1, 1, 1, 1.0])
    net = torch.nn.Linear(6, 3)
    for rows in (4, 65536):
        x = torch.randn(rows, 6, generator=torch.Generator().manual_seed(0)) * unit
        assert hcrfast.noise.input_scale(_DividesInputs(net, unit), x) is None
    x = torch.randn(65536, 6, generator=torch.Generator().manual_seed(0)) * 1e20   # (all of it far: divided)
    assert hcrfast.noise.input_scale(_DividesInputs(net, 1e20), x) == 2.0 ** 66
