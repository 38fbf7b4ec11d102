"""How far uncertified bounds (certify=False, float32 passes) can land above the valid bound.

Float32 linear models a(θ) = Wθ + b (torch's default init, 16 → 16, 4 seeds, 2 examples each),
σ ∈ {0.05, 0.01}, DCT basis: the largest ratio of ``targeted_bound``'s std to the exact
least-squares (Cramér–Rao) std ``σ·sqrt(diag(Q (WᵀW)⁻¹ Qᵀ))``, per size s and certify. A valid
bound has ratio ≤ 1; the targeted bound reaches sqrt(s²/expm1(s²)) ≈ 1 − s²/4 of it.

    python benchmarks/uncertified_rounding.py
"""
from __future__ import annotations

import warnings

import numpy as np
import scipy.fft
import torch

import hcrfast


def main() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # certify=False warns that its bounds are uncertified: measured here
    Q = scipy.fft.dctn(np.eye(16).reshape(16, 1, 4, 4), axes=(-2, -1), norm="ortho").reshape(16, 16).T
    worst = {}
    for seed in range(4):
        torch.manual_seed(seed)
        lin = torch.nn.Linear(16, 16)
        model = torch.nn.Sequential(torch.nn.Flatten(), lin).eval()
        x = torch.randn(2, 1, 4, 4)
        W = lin.weight.detach().double().numpy()
        for size in (1 / 200, 1 / 1000):
            for sigma in (0.05, 0.01):
                crb = sigma * np.sqrt(np.diag(Q @ np.linalg.inv(W.T @ W) @ Q.T))
                for certify in (False, True):
                    t = hcrfast.targeted_bound(model, x, sigma, certify=certify, size=size)
                    ratio = float((np.asarray(t.std).reshape(2, -1) / crb).max())
                    worst[(certify, size)] = max(worst.get((certify, size), 0.0), ratio)
    for (certify, size), ratio in sorted(worst.items()):
        print(f"certify={certify!s:5}  size={size:g}:  max std / exact LS std = {ratio:.8f}")


if __name__ == "__main__":
    main()
