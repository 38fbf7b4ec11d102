"""How large is the singular value of B_k that a float64 Krylov basis gets from its step past exhaustion?

A basis run to its exhausted space (J of rank r) takes one step more on rounding noise: k = r + 1
steps, and B_k a singular value that is no direction of J. ``hcrfast.krylov.RITZ_NOISE`` drops
every singular value under ``RITZ_NOISE · k · sqrt(max(n, p)) · eps64`` of the largest; this prints
that noise value in those units (and whether a basis kept more than r), for random float64 stacks
``n × p`` of rank r with singular values from 1 to ``cond``, two examples a batch, 12 seeds each.

Usage::

    python benchmarks/krylov_noise_step.py
"""
from __future__ import annotations

import math

import numpy as np

from hcrfast import krylov
from hcrfast.operators import DenseBatchOperator

SHAPES = ((150, 120, 100, 1e-2), (150, 120, 100, 1e-4), (60, 80, 30, 1e-2), (300, 200, 150, 1e-3))


def stack(rng, batch, n, p, values):
    A = np.empty((batch, n, p))
    for b in range(batch):
        U, _ = np.linalg.qr(rng.standard_normal((n, len(values))))
        V, _ = np.linalg.qr(rng.standard_normal((p, len(values))))
        A[b] = (U * values) @ V.T
    return A


def main() -> int:
    eps = float(np.finfo(np.float64).eps)
    print(f"RITZ_NOISE = {krylov.RITZ_NOISE:g}: singular values of B_k under that many k*sqrt(max(n, p))*eps64 "
          f"of the largest count as zero")
    print(f"{'n x p, rank, cond':>24}  {'steps':>6}  {'noise / (k sqrt(N) eps), max':>29}  {'ranks above r':>13}")
    for n, p, r, cond in SHAPES:
        units, steps, over = [], set(), 0
        for seed in range(12):
            rng = np.random.default_rng(seed)
            A = stack(rng, 2, n, p, np.logspace(0, math.log10(cond), r))
            basis = krylov.build(DenseBatchOperator(A), rng.standard_normal((2, n)))
            steps.update(int(k) for k in basis.steps)
            over += int((basis.rank > r).sum())
            for e in range(2):
                ritz = basis.ritz[e] / basis.ritz[e][0]
                if len(ritz) > r:
                    units.append(ritz[r] / (basis.steps[e] * math.sqrt(max(n, p)) * eps))
        worst = f"{max(units):.3g}" if units else "-"
        print(f"{f'{n} x {p}, {r}, {cond:g}':>24}  {'/'.join(map(str, sorted(steps))):>6}  {worst:>29}  {over:>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
