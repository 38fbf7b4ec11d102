"""``hcrfast.bound(solver="dense")`` against ``"lsqr"`` and ``"krylov"`` on one zoo model, same problem.

Random inputs of the model's geometry (normalized), its published σ scale and start size, random
weights unless the zoo builds trained ones. Prints wall time, Jacobian products per example, and the
median / 90th percentile of the bound for each solver; ``--json`` writes them.

    python benchmarks/dense_vs_lsqr.py cifar10 --examples 1 --restarts 1 --iterations 1 --threads 1

``--targets SPEC`` times each solver a second time with ``bound(targets=SPEC)`` (Algorithm 1 plus the
targeted modes), so the targets' extra cost is read off one run.
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

from race import machine_info, products_per_example  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import zoo  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=("digits", "mnist", "cifar10"))
    ap.add_argument("--examples", type=int, default=1)
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--solvers", default="dense,lsqr", help="comma-separated: dense, lsqr, krylov, auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--targets", default=None, help="also time each solver with bound(targets=SPEC), e.g. low:16")
    ap.add_argument("--double", action="store_true", help="the model and inputs in float64 (default float32)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    zm = zoo.build(args.model)
    model = zm.features.eval()
    g = torch.Generator().manual_seed(0)
    x = zm.normalize(torch.rand((args.examples,) + tuple(zm.input_shape), generator=g))
    if args.double:
        model, x = model.double(), x.double()
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), zm.sigma_scale)
    # Algorithm 1's steps alone (singular_steps=0): the solvers are compared on the same steps, and LSQR's
    # factorization gives no singular directions (the default "auto" takes none there)
    kw = dict(size=zm.size, iterations=args.iterations, restarts=args.restarts, singular_steps=0)
    hcrfast.bound(model, x[:1], sigma, **{**kw, "restarts": 1, "iterations": 1})  # the process's one-time costs
    rows = []
    print(f"{args.model}: {args.examples} examples x R {args.restarts} x i {args.iterations}, s = {zm.size:g}, "
          f"sigma = {sigma:.4g}, torch threads {torch.get_num_threads()}")
    runs = [(solver, None) for solver in args.solvers.split(",")]
    if args.targets:
        runs = [run for solver, _ in runs for run in ((solver, None), (solver, args.targets))]
    for solver, targets in runs:
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, solver=solver, targets=targets, **kw)
        seconds = time.perf_counter() - t0
        h = res.to_numpy()
        dense = res.params["solver"] == "dense"
        recycled = res.params["solver"] == "krylov"
        label = solver if targets is None else f"{solver}+targets"
        row = dict(solver=solver, targets=targets, seconds=seconds,
                   targeted=res.params["targeted"] and dict(
                       res.params["targeted"], timings=res.targeted.timings,
                       shared_factorization=res.targeted.params.get("shared_factorization", False)),
                   products_per_example=(float(res.params["dense"]["jacobian_products"]) if dense
                                         else res.params["krylov"]["products_per_example"] if recycled
                                         else products_per_example(h.lsqr_iterations, res.params["warm_start"])),
                   median=float(np.median(h.std)), p90=float(np.quantile(h.std, 0.9)),
                   examples_bounding_nothing=int((h.std.reshape(len(x), -1) == 0).all(axis=1).sum()),
                   lsqr_itn_summary=dict(median=float(np.median(h.lsqr_iterations)),
                                         max=int(h.lsqr_iterations.max()), total=int(h.lsqr_iterations.sum())),
                   lsqr_istop_counts={str(int(c)): int(k) for c, k in zip(*np.unique(h.lsqr_istop, return_counts=True))},
                   dense=res.params["dense"], krylov=res.params["krylov"])
        rows.append(row)
        print(f"  {label:>13}: {seconds:8.1f} s  products/ex {row['products_per_example']:9.0f}  median "
              f"{row['median']:.5g}  p90 {row['p90']:.5g}  all-0 examples {row['examples_bounding_nothing']}" + (
                  f"  rank {res.params['dense']['rank_median']:.0f}" if dense
                  else f"  basis steps median {res.params['krylov']['steps_median']:.0f}" if recycled
                  else f"  LSQR steps median {np.median(h.lsqr_iterations):.0f}"),
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            command="python benchmarks/dense_vs_lsqr.py " + " ".join(sys.argv[1:] if argv is None else argv),
            args=vars(args), sigma=sigma, machine=machine_info("cpu"), rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
