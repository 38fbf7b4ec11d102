"""Warm vs cold LSQR starts in Algorithm 1 (``hcrfast.bound(warm_start=...)``), and the dense solve, same problem.

Cold: every solve j starts from zero (the published scripts). Warm (the default): solve
j > 1 starts from ``c·ε(j−1)``, which nearly solves it. For each LSQR tolerance the table
gives wall time, products (JVP + VJP, the x0 product included) per example, and the
median and 90th percentile of the bound (larger is tighter), on the race's MNIST MLP. A last
row runs ``solver="dense"`` (every step solved exactly; products: the min(n, p) that build J).

    python benchmarks/warm_start.py --examples 8 --restarts 2 --iterations 10 --tols 1e-4,1e-5,1e-7 --threads 1
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

from race import build_problem, machine_info, products_per_example  # noqa: E402

import hcrfast  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--tols", default="1e-4,1e-5,1e-7", help="atol = btol values")
    ap.add_argument("--linearize-at", default="input", choices=("input", "current"))
    ap.add_argument("--no-dense", action="store_true", help="skip the solver='dense' row")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, x = build_problem("mlp", args.examples, seed=0, device="cpu")
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x))
    # the process's one-time costs (imports, first compilations, the dense solve's first LAPACK calls) outside
    # the timing, for each solver timed: the first row paid them (dense 3.2 s against 0.7 s in a second run)
    for solver in ("lsqr", "dense"):
        hcrfast.bound(model, x[:1], sigma, restarts=1, iterations=1, solver=solver)
    rows = []
    print(f"{'atol=btol':>9} {'start':>5} {'wall s':>8} {'products/ex':>12} {'itn j=1':>8} {'itn j>1':>8} "
          f"{'median':>9} {'p90':>9}")
    for tol in (float(t) for t in args.tols.split(",")):
        for warm in (False, True):
            t0 = time.perf_counter()
            res = hcrfast.bound(model, x, sigma, restarts=args.restarts, iterations=args.iterations,
                                linearize_at=args.linearize_at, lsqr=hcrfast.LSQROptions(atol=tol, btol=tol),
                                warm_start=warm, solver="lsqr")
            seconds = time.perf_counter() - t0
            itn = res.lsqr_iterations
            row = dict(tol=tol, start="warm" if warm else "cold", seconds=seconds,
                       products_per_example=products_per_example(itn, warm),
                       itn_first=float(np.median(itn[..., 0])), itn_later=float(np.median(itn[..., 1:])),
                       median=float(np.median(res.std)), p90=float(np.quantile(res.std, 0.9)))
            rows.append(row)
            print(f"{tol:9.0e} {row['start']:>5} {seconds:8.1f} {row['products_per_example']:12.0f} "
                  f"{row['itn_first']:8.0f} {row['itn_later']:8.0f} {row['median']:9.5f} {row['p90']:9.5f}", flush=True)
    if not args.no_dense and args.linearize_at == "input":
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, restarts=args.restarts, iterations=args.iterations, solver="dense",
                            singular_steps=0)   # Algorithm 1's steps alone, as the LSQR rows
        seconds = time.perf_counter() - t0
        row = dict(tol=None, start="dense", seconds=seconds,
                   products_per_example=float(res.params["dense"]["jacobian_products"]), itn_first=0.0, itn_later=0.0,
                   median=float(np.median(res.std)), p90=float(np.quantile(res.std, 0.9)),
                   rank_median=res.params["dense"]["rank_median"])
        rows.append(row)
        print(f"{'exact':>9} {'dense':>5} {seconds:8.1f} {row['products_per_example']:12.0f} {0:8.0f} {0:8.0f} "
              f"{row['median']:9.5f} {row['p90']:9.5f}   (rank of J median {row['rank_median']:.0f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(command="python benchmarks/warm_start.py " + " ".join(
            sys.argv[1:] if argv is None else argv), args=vars(args), sigma=sigma, machine=machine_info("cpu"),
            rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
