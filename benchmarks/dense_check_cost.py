"""What the dense solve's check of J against plain autograd costs.

``dense.jacobian`` checks every J it builds with one plain backward pass of a random cotangent per example
(``dense._agrees_with_autograd``): torch.func's vmap can build a J wrong (torch 2.14: ``torch.cdist``'s
backward). This times ``dense.jacobian`` on the race's problem (the MNIST-geometry MLP, skipping zero rows,
as ``bound`` calls it) with the check and with the check replaced by ``True``, alternating, median of
``--repeats`` each.

    python benchmarks/dense_check_cost.py --examples 32 --repeats 7 --threads 1
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race import build_problem  # noqa: E402

from hcrfast import dense  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, x = build_problem("mlp", args.examples, seed=0, device="cpu")
    checked = dense._agrees_with_autograd
    times = {"with the check": [], "without": []}
    dense.jacobian(model, x, skip_zero_rows=True)  # first calls outside the timing
    try:
        for _ in range(args.repeats):
            for label, check in (("with the check", checked), ("without", lambda *a: True)):
                dense._agrees_with_autograd = check
                t0 = time.perf_counter()
                dense.jacobian(model, x, skip_zero_rows=True)
                times[label].append(time.perf_counter() - t0)
    finally:
        dense._agrees_with_autograd = checked
    f = lambda t: model(t).reshape(t.shape[0], -1)  # noqa: E731
    J = dense.jacobian(model, x, skip_zero_rows=True)
    alone = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        assert checked(J, f, x, dense.default_chunk_rows(J.shape[1], J.shape[2]))
        alone.append(time.perf_counter() - t0)
    out = {k: float(np.median(v)) for k, v in times.items()} | {"the check alone": float(np.median(alone))}
    for k, v in out.items():
        print(f"{k:16s} {v * 1e3:8.1f} ms")
    return out


if __name__ == "__main__":
    main()
