"""Bounds on small nonlinear models against their exact values: each model's forward pass re-evaluated in
60-digit arithmetic (mpmath) with its weights taken as exact reals, so that neither D nor z inherits float64's
rounding of the passes hcrfast certifies with (``algorithm._widened``, ``_rounding_slope``)."""

import numpy as np
import pytest
import torch

import hcrfast

mpmath = pytest.importorskip("mpmath")

_ACT = {torch.nn.Tanh: mpmath.tanh, torch.nn.Sigmoid: lambda v: 1 / (1 + mpmath.exp(-v)),
        torch.nn.Softplus: lambda v: mpmath.log1p(mpmath.exp(v))}


def mlp(act, dtype, seed, p=16, hidden=12, n=10):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(p, hidden), act(), torch.nn.Linear(hidden, n),
                               act()).to(dtype).eval()


def exact_features(model, rows):
    """The model's features at each row of ``rows`` (float64 inputs, exact as given), in 60-digit arithmetic."""
    layers = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) if isinstance(m, torch.nn.Linear)
              else _ACT[type(m)] for m in model[1:]]
    out = []
    with mpmath.workdps(60):
        for row in rows:
            v = [mpmath.mpf(float(t)) for t in row]
            for layer in layers:
                if callable(layer):
                    v = [layer(t) for t in v]
                else:
                    W, b = layer
                    v = [mpmath.fdot([mpmath.mpf(float(w)) for w in Wi], v) + mpmath.mpf(float(bi))
                         for Wi, bi in zip(W, b)]
            out.append(v)
    return out


def exact_divergence(model, x, eps, sigma):
    """expm1(‖a(θ+ε) − a(θ)‖²/σ²) exactly, θ + ε as float64 applies it; one per row of ``eps`` (rows of x)."""
    x64 = x.double().reshape(len(x), -1)
    pert = x64 + torch.as_tensor(np.asarray(eps)).reshape(x64.shape)
    a, b = exact_features(model, pert.numpy()), exact_features(model, x64.numpy())
    with mpmath.workdps(60):
        return [mpmath.expm1(mpmath.fsum((u - v) ** 2 for u, v in zip(ra, rb)) / mpmath.mpf(sigma) ** 2)
                for ra, rb in zip(a, b)], (pert - x64).numpy()


@pytest.mark.parametrize("act,dtype", [(torch.nn.Sigmoid, torch.float32), (torch.nn.Tanh, torch.float64),
                                       (torch.nn.Softplus, torch.float32)])
def test_no_bound_passes_the_exact_one_of_its_step_through_the_passes_rounding(act, dtype):
    """float64's own rounding of a(θ+ε) − a(θ), ~1e-13 of D at ordinary σ, was never counted in D: about one
    mode in ten of these MLPs passed the exact |ε_k|/√D of its step, by up to 5.5e-14 (sigmoid, float32). D
    is now taken at the far end of the passes' rounding bracket: each bound is at most the exact one, and
    within 1e-9 of it."""
    model = mlp(act, dtype, seed=3)
    x = torch.randn(12, 1, 4, 4, generator=torch.Generator().manual_seed(4)).to(dtype)
    sigma = hcrfast.rms_sigma(model(x).detach(), 1.0)
    res = hcrfast.bound(model, x, sigma, restarts=1, iterations=2, iterates="last", singular_steps=0,
                        basis="pixel", solver="dense")
    d, eps = exact_divergence(model, x, res.eps, sigma)
    with mpmath.workdps(60):
        for e in range(len(x)):
            assert mpmath.mpf(float(res.divergence[e, 0])) >= d[e]
            for k in range(eps.shape[1]):
                exact = abs(mpmath.mpf(float(eps[e, k]))) / mpmath.sqrt(d[e])
                got = mpmath.mpf(float(res.std.reshape(len(x), -1)[e, k]))
                assert got <= exact and got >= exact * (1 - 1e-9)


def test_a_huge_step_nearly_in_the_null_space_counts_the_rounding_of_its_own_terms():
    """Inputs ×30 saturate a tanh MLP: J is nearly singular and the targeted steps are huge (max|ε| ~1e9 and
    more) while their shifts stay of order σ: ``W(θ + ε) + b`` cancels terms of size |W||ε| down to them, and
    float64 rounds those terms, not the shift. The rounding estimate, sized from θ alone, was 1e12 times too
    small and a bound passed the exact one by 4e-4 (60-digit oracle), with no warning. Now the estimate
    counts the step's own terms (``_rounding_slope``): each step's D is at least its exact D."""
    model = mlp(torch.nn.Tanh, torch.float64, seed=2, hidden=20, n=20)
    x = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 30
    sigma = hcrfast.rms_sigma(model(x).detach(), 1.0)
    res = hcrfast.targeted_bound(model, x, sigma, targets="all", size=0.1, null_probes=False)
    eps = np.asarray(res.eps).reshape(res.eps.shape[1], -1)
    assert np.abs(eps).max() > 1e8   # the case: steps far beyond the inputs
    d, _ = exact_divergence(model, x.expand(len(eps), -1, -1, -1), eps, sigma)
    got = np.asarray(res.divergence).reshape(-1)
    with mpmath.workdps(60):
        for k in range(len(eps)):
            if got[k] > 0:
                assert mpmath.mpf(float(got[k])) >= d[k], k


def _linear32(dtype=torch.float32):
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 80)).to(dtype).eval()


def _drift_warnings(model, x, scale, **extra):
    import warnings
    with torch.no_grad():
        sigma = scale * float(hcrfast.rms_sigma(model(x), 1.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = hcrfast.bound(model, x, sigma, **{**dict(restarts=3, iterations=2, solver="dense", singular_steps=0),
                                                **extra})
    return res, sigma, [str(w.message) for w in caught if "strayed from the float64 ones" in str(w.message)]


def test_float32_steps_that_rounding_set_are_warned_of_and_stay_below_the_exact_bounds(tmp_path):
    """At 1e-4 of the features' RMS, a float32 linear model's a(θ+ε) − a(θ) is mostly float32's rounding,
    which then sets Algorithm 1's next steps (a mode's bound rose 11× over σ's scaling): said, and the
    certified bounds stay at or below the exact least-squares std; at the RMS, in float64, or with one
    iteration (no step follows a shift) nothing is said, nor where the singular steps give every bound. A
    resume says it as the first call did."""
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    model = _linear32()
    res, sigma, said = _drift_warnings(model, x, 1e-4)
    assert len(said) == 1 and said[0].startswith("9 restarts' last feature shifts") and "float32" in said[0], said
    assert res.params["rounding"]["dtype_drift"] == 9 and res.params["rounding"]["worst_drift"] > 0.1
    A = model[1].weight.detach().double().numpy()
    import scipy.fft
    C = np.stack([scipy.fft.dctn(np.eye(64)[j].reshape(8, 8), norm="ortho").ravel() for j in range(64)], 1)
    exact = sigma * np.sqrt(np.diag(C @ np.linalg.inv(A.T @ A) @ C.T)).reshape(1, 1, 8, 8)
    assert (res.std <= exact * (1 + 1e-9)).all()
    assert _drift_warnings(model, x, 1.0)[2] == []
    # the defaults' singular steps (not iterated) give every mode's largest bound here, which scales with sigma:
    # nothing to say
    at_rms, _, none = _drift_warnings(model, x, 1.0, singular_steps="auto")
    small, _, said_small = _drift_warnings(model, x, 1e-4, singular_steps="auto")
    assert none == said_small == [] and np.allclose(small.std, 1e-4 * at_rms.std, rtol=1e-6)
    assert _drift_warnings(_linear32(torch.float64), x.double(), 1e-4)[2] == []
    assert _drift_warnings(model, x, 1e-4, iterations=1)[2] == []
    first = _drift_warnings(model, x, 1e-4, checkpoint=tmp_path, chunk_size=1)[2]
    again, _, said_again = _drift_warnings(model, x, 1e-4, checkpoint=tmp_path, chunk_size=1)
    assert again.params["checkpoint"]["examples_read_back"] == 3
    assert said_again == first and first[0].split(" strayed")[0] == said[0].split(" strayed")[0]


def test_a_rounding_estimate_whose_jvp_raises_says_so():
    """The float64 JVPs that size the passes' rounding fell back in silence on any RuntimeError, the model's own
    included (a model raising on its 12th forward gave other bounds, unwarned). They warn now, naming it."""
    import warnings

    from hcrfast import algorithm

    class Raises(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("transient failure")

    x = torch.rand(2, 1, 4, 4, dtype=torch.float64)
    f0 = np.ones((2, 3))
    for got in (lambda: algorithm._rounding_magnitude(Raises(), x, f0), lambda: algorithm._rounding_slope(Raises(), x)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = got()
        said = [str(w.message) for w in caught]
        assert any("raised RuntimeError (transient failure)" in m and "if the model raised it, fix the model" in m
                   for m in said), said
        assert value is None or np.array_equal(value, f0)


def test_steps_below_the_inputs_resolution_are_named_so_not_as_underflow():
    """Inputs near 1e9 and sigma 1e-5: each step (~5e-8) is below float64's spacing of the inputs (1.2e-7), so
    theta + eps == theta; the refusal blamed the solver's underflow and offered a float64 model and batch, which
    these already are."""
    rng = np.random.default_rng(10)
    lin = torch.nn.Linear(6, 9, bias=False).double()
    with torch.no_grad():
        lin.weight.copy_(torch.as_tensor(rng.standard_normal((9, 6))))
    model = torch.nn.Sequential(torch.nn.Flatten(), lin).eval()
    x = torch.as_tensor(1e9 * (1 + 1e-3 * rng.standard_normal((2, 1, 2, 3))))
    with pytest.raises(ValueError, match=r"every step's eps came out 0.*the steps vanish once added to the inputs "
                                         r"\(theta \+ eps == theta in float64") as caught:
        hcrfast.bound(model, x, 1e-5, restarts=2, singular_steps=0, iterations=1)
    assert "float64 model and batch" not in str(caught.value)
