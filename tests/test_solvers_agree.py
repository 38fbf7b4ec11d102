"""The three solvers side by side on small nets, in float64 and float32.

Where the Krylov basis holds J's whole row space (these nets: exhausted within a few dozen steps) its
steps are the dense solve's, and so are the bounds; LSQR at its default tolerance comes close. The
dense solve is itself checked against numpy.linalg.lstsq and torch.func Jacobians (test_dense.py);
here it is the oracle of the other two, on nets with dead ReLUs (J rank-deficient), a bottleneck
(rank 10 of 64), saturating tanh and a convolution. A float64 Krylov basis that kept the direction of
its step past exhaustion (rounding noise) gave one example in 12 bounds of 0 on the ReLU net
(D overflowed); this sweep is what found it.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import hcrfast
from test_bound import algorithm1


def relu_mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 80), torch.nn.ReLU(), torch.nn.Linear(80, 40),
                               torch.nn.ReLU())


def tanh_mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 100), torch.nn.Tanh(), torch.nn.Linear(100, 100))


def bottleneck():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10), torch.nn.Tanh(), torch.nn.Linear(10, 64))


def cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(64, 30))


def square_relu():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU())


@pytest.mark.parametrize("make", [relu_mlp, tanh_mlp, bottleneck, cnn, square_relu])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_krylov_and_lsqr_give_the_dense_solves_bounds(make, dtype):
    torch.manual_seed(1 if make is not square_relu else 0)
    net = make().to(dtype).eval()
    x = torch.as_tensor(np.random.default_rng(2 if make is not square_relu else 1).standard_normal((12, 1, 8, 8)))
    x = x.to(dtype)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(net(x))
    kw = dict(restarts=3, iterations=3)
    dense = algorithm1(net, x, sigma, solver="dense", **kw).to_numpy()
    got = {}
    for solver in ("krylov", "lsqr"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no restart bounding nothing, no overflow
            got[solver] = algorithm1(net, x, sigma, solver=solver, **kw).to_numpy()
    assert np.all(dense.std > 0)
    krylov, lsqr = got["krylov"], got["lsqr"]
    assert krylov.params["krylov"]["rank_median"] == dense.params["dense"]["rank_median"]
    if dtype == torch.float64:
        np.testing.assert_allclose(krylov.std, dense.std, rtol=1e-6)
    else:  # float32 products: the bases' rounding moves single modes by up to a few percent
        ratio = krylov.std / dense.std
        assert np.median(ratio) == pytest.approx(1.0, abs=2e-3) and 0.9 < ratio.min() and ratio.max() < 1.1
    ratio = lsqr.std / dense.std
    assert np.median(ratio) == pytest.approx(1.0, abs=1e-2) and ratio.min() > 0.5
