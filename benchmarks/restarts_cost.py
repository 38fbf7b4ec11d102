"""What more restarts cost and buy where every restart solves against one factor or basis per example.

With ``solver="dense"`` (J factored once per example) or a Krylov basis that exhausts the space (one
pilot), a restart costs Algorithm 1's i forward passes and i small projected solves, no Jacobian
product: R is then the cheap way to a higher bound (each mode's bound is the max over the restarts).
This times ``hcrfast.bound`` on the race's problem (the MNIST-geometry MLP on the digits test split,
σ = ``--sigma-scale`` × RMS of the features, s = ``--size``) at each R of ``--restarts``, per solver; or,
with ``--model cifar10`` (any zoo name but ``mnist`` and ``digits``), on ``krylov_depth.py``'s problem: the
zoo model with random weights on seeded random inputs, its published σ scale and start size.

    python benchmarks/restarts_cost.py --examples 32 --restarts 1,5,25,100,400 --solvers dense,krylov \\
        --threads 1 --json out.json

Where the pilots' bases are short of the space (ResNet-18's 25 pilots of 163 steps), restarts sharing
a pilot land on the same bounds: ``krylov_depth.py --restarts 100 --krylov-pilots 25`` against
``--restarts 25`` (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lsqr_budget import random_workload  # noqa: E402
from race import build_problem, machine_info  # noqa: E402

import hcrfast  # noqa: E402


def _products(params) -> float | None:
    """Jacobian products per example the call counted: J's build (dense) or the bases' (Krylov)."""
    if params.get("solver") == "dense" and params.get("dense"):
        return float(params["dense"]["jacobian_products"])
    if params.get("solver") == "krylov" and params.get("krylov"):
        return float(params["krylov"]["products_per_example"])
    return None


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp", choices=("mlp", "digits", "cifar10", "resnet18", "swin_t"),
                    help="mlp, digits: the race's problems; a zoo name: krylov_depth.py's (random weights and inputs)")
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--restarts", default="1,5,25,100", help="comma-separated R")
    ap.add_argument("--solvers", default="dense,krylov", help="comma-separated bound(solver=...)")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--size", type=float, default=1 / 200, help="s (the race's models; a zoo model runs at its own)")
    ap.add_argument("--sigma-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    try:
        restarts = [int(r) for r in args.restarts.split(",")]
    except ValueError:
        ap.error(f"--restarts must be comma-separated integers, got {args.restarts!r}")
    if min(restarts) < 1:
        ap.error(f"--restarts must be >= 1 each, got {args.restarts!r}")
    solvers = args.solvers.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model in ("mlp", "digits"):
        model, x = build_problem(args.model, args.examples, seed=args.seed, device="cpu")
        with torch.no_grad():
            sigma = args.sigma_scale * float(model(x).double().pow(2).mean().sqrt())
    else:  # its published σ scale and start size, as krylov_depth.py runs it
        zm, model, x, _, sigma = random_workload(args.model, args.examples, "cpu")
        args.size = zm.size
    print(f"{args.model}: {args.examples} examples x i {args.iterations}, s = {args.size}, sigma = {sigma:.4g}, "
          f"torch threads {torch.get_num_threads()}", flush=True)
    hcrfast.bound(model, x[:1], sigma, restarts=1, iterations=1, size=args.size)  # first calls outside the timing
    rows = []
    for solver in solvers:
        for R in restarts:
            t0 = time.perf_counter()
            res = hcrfast.bound(model, x, sigma, restarts=R, iterations=args.iterations, size=args.size,
                                solver=solver, seed=args.seed)
            wall = time.perf_counter() - t0
            std = np.asarray(res.std, dtype=np.float64)
            row = {"solver": solver, "restarts": R, "wall_s": wall, "median": float(np.median(std)),
                   "p90": float(np.percentile(std, 90)),
                   "products_per_example": _products(res.params)}
            rows.append(row)
            print(f"  {solver:7s} R {R:4d}: {wall:7.2f} s  median {row['median']:.5f}  p90 {row['p90']:.5f}  "
                  f"products/ex {row['products_per_example']}", flush=True)
    out = {"script": "restarts_cost.py", "argv": sys.argv[1:] if argv is None else list(argv),
           "model": args.model, "examples": args.examples, "iterations": args.iterations, "size": args.size,
           "sigma": sigma, "machine": machine_info("cpu"), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
