"""What the dense solve's rank tolerance costs the bounds: ``sqrt(max(n, p))·eps`` (the default since
2026-11-30, the Krylov basis' rule) against numpy's ``max(n, p)·eps`` (the rule before), same seeds, one
process.

The old rule is restored for one call by passing it through ``hcrfast.dense._checked`` (the Gram-matrix
driver stays "eigh" for float32 Jacobians under both). Per example: the median bound under each rule and
their ratio; and the median over the batch. Random-weight zoo models on seeded random inputs of their
geometry, their published σ scale and start size (``lsqr_budget.random_workload``), R = 25, i = 10.

    python benchmarks/rank_rule.py mnist --examples 32 --threads 1 --json out.json
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
from race import machine_info  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import dense  # noqa: E402


def run(name: str, examples: int, rule: str, restarts: int = 25, iterations: int = 10):
    """``bound`` on the workload under ``rule`` ("sqrt": the default; "max": numpy's, as before): (seconds,
    per-example medians, the batch's median)."""
    real = dense._checked

    def old(J, rtol, driver):
        got = real(J, rtol, driver)
        return max(J.shape[1], J.shape[2]) * torch.finfo(J.dtype).eps if rtol is None else got

    zm, model, x, _, sigma = random_workload(name, examples, "cpu")
    if rule == "max":
        dense._checked = old
    try:
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, size=zm.size, solver="dense", restarts=restarts, iterations=iterations)
        seconds = time.perf_counter() - t0
    finally:
        dense._checked = real
    std = np.asarray(res.std).reshape(examples, -1)
    return seconds, np.median(std, axis=1), float(np.median(std))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=("digits", "mnist", "cifar10"))
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--restarts", type=int, default=25)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args.model, 1, "sqrt", 2, 2)   # warm-up, not recorded: the first call compiles kernels, trains digits
    rows = {}
    for rule in ("max", "sqrt"):
        seconds, per, median = run(args.model, args.examples, rule, args.restarts, args.iterations)
        rows[rule] = dict(seconds=seconds, median=median, per_example=per.tolist())
        print(f"{args.model}, {args.examples} examples, rank rule {rule}(n, p)*eps: {seconds:.1f} s, "
              f"median bound {median:.6g}", flush=True)
    ratio = np.asarray(rows["sqrt"]["per_example"]) / np.asarray(rows["max"]["per_example"])
    print(f"per-example median ratio sqrt/max: min {ratio.min():.4f}, max {ratio.max():.4f}, "
          f"{int(np.sum(np.abs(ratio - 1) > 1e-9))} of {len(ratio)} examples changed", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            command=" ".join(["python", "benchmarks/rank_rule.py", *(argv or sys.argv[1:])]), model=args.model,
            examples=args.examples, restarts=args.restarts, iterations=args.iterations, threads=torch.get_num_threads(), machine=machine_info("cpu"), rules=rows,
            ratio=ratio.tolist()), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
