"""Do restarts that share a short Krylov basis end on one direction? (benchmarks/README.md, "more restarts").

On one example of a zoo model (random weights, seeded random input, float64), J is built by
``torch.func.jacrev``; the pilot's Krylov space of JᵀJ (restart 0's start vector, k steps, fully
reorthogonalized: the space ``bound(solver="krylov")`` builds) is taken for each k of ``--depths``, and
Algorithm 1 (i = 10, every step ``numpy.linalg.lstsq`` on J Q, z from forward passes) runs from R start
vectors in it. Printed per k: the pairwise |cos| of the R final steps and their |cos| with the basis'
smallest Ritz vector (the right singular vector of J Q of the smallest singular value), also after the
first step alone.

    python benchmarks/restart_directions.py cifar10 --depths 40,80,160,640 --restarts 8 --threads 2
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lsqr_budget import random_workload  # noqa: E402

import hcrfast  # noqa: E402


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=("digits", "mnist", "cifar10"), help="a zoo model whose J fits in memory")
    ap.add_argument("--depths", default="40,80,160,640")
    ap.add_argument("--restarts", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.restarts < 2:   # (the pairwise cosines need two: a bare "zero-size array" traceback before)
        ap.error(f"--restarts {args.restarts}: the restarts' pairwise directions need at least 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    zm, model, x, _, sigma = random_workload(args.model, 1, "cpu")
    model, x = model.double(), x.double()
    with torch.no_grad():
        f0 = model(x).reshape(-1).numpy()
    n, p, R = f0.size, x[0].numel(), args.restarts
    t0 = time.perf_counter()
    J = torch.func.jacrev(lambda t: model(t[None]).reshape(-1))(x[0]).reshape(n, p).detach().numpy()
    print(f"{args.model}: J {n} x {p} in {time.perf_counter() - t0:.1f} s; R = {R}, i = {args.iterations}", flush=True)
    z0 = hcrfast.start_vectors(np.arange(1), R, n, seed=0, size=zm.size, sigma=sigma).reshape(R, n)
    target = np.linalg.norm(z0, axis=1)
    rows = []
    for k in (int(d) for d in args.depths.split(",")):
        q = J.T @ z0[0]
        Q = [q / np.linalg.norm(q)]
        for _ in range(min(k, p) - 1):
            w = J.T @ (J @ Q[-1])
            for _ in range(2):
                w -= np.stack(Q, 1) @ (np.stack(Q, 0) @ w)
            Q.append(w / np.linalg.norm(w))
        # Orthonormal to rounding: past the space's exhaustion the Lanczos vectors are normalized rounding
        # noise, and two Gram-Schmidt passes leave them far enough from orthonormal (digits: 35 null
        # directions) that Q·lstsq put up to 17% of a step in J's null space; the QR keeps the span.
        Q = np.linalg.qr(np.stack(Q, 1))[0]
        JQ = J @ Q
        _, s, Wt = np.linalg.svd(JQ, full_matrices=False)
        vmin = Q @ Wt[-1]
        unit = lambda e: e / np.linalg.norm(e, axis=1, keepdims=True)  # noqa: E731
        first = unit((Q @ np.linalg.lstsq(JQ, z0.T, rcond=None)[0]).T)
        zt = z0
        for _ in range(args.iterations):
            eps = (Q @ np.linalg.lstsq(JQ, zt.T, rcond=None)[0]).T
            with torch.no_grad():
                z = model(x[0] + torch.as_tensor(eps).reshape(R, *x.shape[1:])).reshape(R, -1).numpy() - f0
            zt = z * (target / np.linalg.norm(z, axis=1))[:, None]
        e = unit(eps)
        pair = np.abs(e @ e.T)[~np.eye(R, dtype=bool)]
        row = dict(k=k, ritz_min=float(s[-1]), ritz_max=float(s[0]), pairwise_cos_median=float(np.median(pair)),
                   pairwise_cos_min=float(pair.min()), cos_smallest_ritz_median=float(np.median(np.abs(e @ vmin))),
                   cos_smallest_ritz_first_step_median=float(np.median(np.abs(first @ vmin))))
        rows.append(row)
        print(f"  k {k}: Ritz values [{s[-1]:.3g}, {s[0]:.3g}]; final steps' pairwise |cos| median "
              f"{row['pairwise_cos_median']:.3f} (min {row['pairwise_cos_min']:.3f}); |cos| with the smallest Ritz "
              f"vector median {row['cos_smallest_ritz_median']:.3f} (after step 1: "
              f"{row['cos_smallest_ritz_first_step_median']:.3f})", flush=True)
    return rows


if __name__ == "__main__":
    main()
