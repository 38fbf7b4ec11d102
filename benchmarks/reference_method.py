"""The published scripts' perturbation search, re-implemented as the baseline to beat.

METHOD.md §2, last paragraph: the published scripts (``codes/testers.py`` of
facebookresearch/hcrbounds, function ``iterate``) ran, for each restart in turn
and each of the ``i`` outer iterations, ONE ``scipy.sparse.linalg.lsqr`` over the
whole minibatch. The operator is the block-diagonal Jacobian of the batch, a
``LinearOperator`` of shape (B·n, B·p) whose products call ``torch.func.jvp``
(forward mode, recomputing the forward pass each call) and the function returned
by ``torch.func.vjp`` (one recorded forward per solve), copying every vector
numpy → torch → numpy. The solve uses ``atol = 2e-2 · min_b ‖z̃_b‖``, SciPy's
defaults otherwise (``btol = 1e-6``, ``conlim = 1e8``, ``iter_lim = 2·B·p``) and
``damp = 0``, and is linearized at the current point ``θ + ε(j−1)``; the
solution becomes ``ε(j)`` and ``z(j) = a(θ + ε(j)) − a(θ)`` by a forward pass.

What is the same as :func:`hcrfast.bound` (so that the race is fair): the model,
the inputs, σ, s, i, R, and the start vectors, which are exactly
``hcrfast.start_vectors(ids, R, n, seed=seed, size=s, sigma=σ)`` (the scripts drew
``np.random.normal`` noise; here both methods see the same draws). The bound of
each restart is ``|DCT(ε)| / sqrt(expm1(‖z‖²/σ²))`` in float64 and the reported
bound the element-wise max over restarts.

Two deliberate departures from the scripts' text, neither a handicap:

* NumPy ≥ 2 (NEP 50) promotes ``float64 scalar × float32 array`` to float64,
  which NumPy 1.x (the scripts' era) kept in float32. SciPy's LSQR would then
  hand ``matvec`` a float64 ``v``, which ``torch.func.jvp`` rejects for a float32
  model. ``matvec`` therefore casts ``v`` to float32, which is what the scripts'
  ``v`` was under NumPy 1.x.
* ``a(θ)`` is computed once, not once per restart, and the bound uses ``expm1``
  in float64 rather than ``exp(·) − 1`` on float32 norms.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.fft
import scipy.sparse.linalg
import torch

import hcrfast


@dataclass
class ReferenceResult:
    """What :func:`reference_bound` returns.

    Attributes
    ----------
    std : ndarray, shape (B, C, H, W)
        Per-DCT-mode bound, max over restarts, float64.
    mse : ndarray, shape (B,)
        ``max_r (1/p)‖ε_r‖² / D(z_{ε_r})``.
    products : int
        Jacobian products (JVP + VJP) per example over the whole run. Every
        product of the joint operator is one product for each example.
    seconds : float
        Wall time.
    itn : ndarray, shape (R, i)
        LSQR iterations of every joint solve.
    istop : ndarray, shape (R, i)
        SciPy stop code of every joint solve.
    divergence : ndarray, shape (B, R)
        ``D(z_ε)`` of every restart.
    """

    std: np.ndarray
    mse: np.ndarray
    products: int
    seconds: float
    itn: np.ndarray
    istop: np.ndarray
    divergence: np.ndarray
    params: dict = field(default_factory=dict)


def _joint_jacobian(model, perturbed: torch.Tensor, out_shape, counter: dict):
    """The block-diagonal Jacobian of the batch at ``perturbed``, as in the scripts."""
    (_, vjpfunc) = torch.func.vjp(model, perturbed)

    def rmatvec(u):
        counter["vjp"] += 1
        cot = torch.from_numpy(u.reshape(out_shape)).to(perturbed.device)
        return vjpfunc(cot)[0].cpu().detach().numpy().flatten()

    def matvec(v):
        counter["jvp"] += 1
        # float32: see the module docstring (NEP 50).
        tan = torch.from_numpy(np.asarray(v, dtype=np.float32).reshape(perturbed.shape)).to(perturbed.device)
        return torch.func.jvp(model, (perturbed,), (tan,))[1].cpu().detach().numpy().flatten()

    n_out = math.prod(out_shape)
    return scipy.sparse.linalg.LinearOperator(
        shape=(n_out, perturbed.numel()), matvec=matvec, rmatvec=rmatvec,
        matmat=matvec, rmatmat=rmatvec, dtype=np.float32)


def reference_bound(model, batch: torch.Tensor, sigma: float, *, size: float = 1 / 200,
                    iterations: int = 10, restarts: int = 25, seed: int = 0,
                    example_ids=None) -> ReferenceResult:
    """The published scripts' Algorithm 1 and HCR bound, restart after restart.

    Parameters
    ----------
    model : torch.nn.Module
        Features model in eval mode; (B, C, H, W) → (B, ...).
    batch : torch.Tensor, shape (B, C, H, W)
        Inputs θ, float32, on the model's device.
    sigma, size, iterations, restarts, seed, example_ids
        As in :func:`hcrfast.bound`.
    """
    t0 = time.perf_counter()
    B = batch.shape[0]
    ids = np.arange(B) if example_ids is None else np.asarray(example_ids)
    p = math.prod(batch.shape[1:])
    with torch.no_grad():
        output = model(batch)
    out_shape = tuple(output.shape)
    n = math.prod(out_shape[1:])
    output_np = output.cpu().detach().numpy().reshape(B, n)
    z0 = hcrfast.start_vectors(ids, restarts, n, seed=seed, size=size, sigma=sigma).reshape(B, restarts, n)

    std = np.zeros(batch.shape, dtype=np.float64)
    mse = np.zeros(B)
    itns = np.zeros((restarts, iterations), dtype=np.int64)
    istops = np.zeros((restarts, iterations), dtype=np.int64)
    divergence = np.zeros((B, restarts))
    counter = {"jvp": 0, "vjp": 0}

    for r in range(restarts):
        diff = z0[:, r, :]  # float64, like the scripts' (outputsa - output) / sqrt(n) / diffdiv
        target = np.linalg.norm(diff, axis=1)[:, None]
        perturbed = batch.clone()
        cdiff = diff.copy()
        for j in range(iterations):
            cdiff = cdiff / np.linalg.norm(cdiff, axis=1)[:, None] * target
            atol = 2e-2 * np.min(np.linalg.norm(cdiff, axis=1))
            op = _joint_jacobian(model, perturbed, out_shape, counter)
            delta, istop, itn = scipy.sparse.linalg.lsqr(op, cdiff.flatten(), atol=atol, damp=0)[:3]
            itns[r, j], istops[r, j] = itn, istop
            perturbed = batch + torch.from_numpy(delta.reshape(batch.shape)).float().to(batch.device)
            with torch.no_grad():
                outputpert = model(perturbed)
            cdiff = outputpert.cpu().detach().numpy().reshape(B, n) - output_np

        # The bound of this restart, as the scripts: eps as applied, z by forward passes.
        in_diff = (perturbed - batch).cpu().detach().numpy().astype(np.float64)
        out_diff = cdiff.astype(np.float64)
        d = np.expm1(np.einsum("bi,bi->b", out_diff, out_diff) / sigma**2)
        divergence[:, r] = d
        coords = np.abs(scipy.fft.dctn(in_diff, axes=(-2, -1), norm="ortho"))
        with np.errstate(divide="ignore", invalid="ignore"):
            hcr = coords / np.sqrt(d)[:, None, None, None]
            hcr = np.where(d[:, None, None, None] == 0, np.where(coords > 0, np.inf, 0.0), hcr)
            sq = np.einsum("bi,bi->b", in_diff.reshape(B, p), in_diff.reshape(B, p)) / p
            mse_r = np.where(d == 0, np.where(sq > 0, np.inf, 0.0), sq / d)
        std = np.maximum(std, hcr)
        mse = np.maximum(mse, mse_r)

    return ReferenceResult(
        std=std, mse=mse, products=counter["jvp"] + counter["vjp"], seconds=time.perf_counter() - t0,
        itn=itns, istop=istops, divergence=divergence,
        params=dict(sigma=sigma, size=size, iterations=iterations, restarts=restarts, seed=seed,
                    jvp=counter["jvp"], vjp=counter["vjp"]))


if __name__ == "__main__":   # (run as a script it did nothing and said nothing)
    print("benchmarks/reference_method.py is a module, imported by race.py; it runs nothing "
          "by itself:\n" + (__doc__ or "").strip().splitlines()[0])
