"""How many bytes does ``hcrfast.sigma_for`` keep per example between its calls?

One ``hcrfast.bound`` call inside ``hcrfast.algorithm.reusing_factors`` (an unbounded budget) on a zoo
model with random weights: the store then holds each example's dense factor or Krylov basis, what a
search's later calls take instead of building their own. Divide a budget (``reuse_bytes``, 1 GiB on a
GPU by default) by the bytes per example to see how many examples a search serves.

Usage::

    python benchmarks/reuse_store_size.py resnet18 --examples 1 --solver krylov --json out.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

import hcrfast
from hcrfast import algorithm, zoo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=zoo.NAMES)
    ap.add_argument("--examples", type=int, default=1)
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--solver", choices=("auto", "dense", "krylov"), default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    zm = zoo.build(args.model, seed=args.seed)
    x = zm.normalize(torch.rand((args.examples,) + tuple(zm.input_shape),
                                generator=torch.Generator().manual_seed(args.seed)))
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(zm.features(x), zm.sigma_scale)
    t0 = time.perf_counter()
    with algorithm.reusing_factors(2**62) as store:
        res = hcrfast.bound(zm.features, x, sigma, size=zm.size, restarts=args.restarts,
                            iterations=args.iterations, solver=args.solver)
    seconds = time.perf_counter() - t0
    p = res.params
    steps = None if p["krylov"] is None else p["krylov"].get("steps_median")
    per_example = store.used / args.examples
    print(f"{args.model} {tuple(zm.input_shape)}, {p['n_features']} features, {p['n_inputs']} inputs, {p['dtype']}, "
          f"solver {p['solver']}" + (f" (median basis {steps:g} steps)" if steps is not None else "") +
          f": {per_example / 1e6:.1f} MB kept per example ({store.used} bytes for {args.examples}); "
          f"1 GiB holds {int(2**30 // per_example) if per_example else 'any number of'} examples; "
          f"the call took {seconds:.1f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(argv=sys.argv, model=args.model, input_shape=list(zm.input_shape), examples=args.examples,
                           restarts=args.restarts, iterations=args.iterations, solver=p["solver"],
                           n_features=p["n_features"], n_inputs=p["n_inputs"], dtype=p["dtype"],
                           krylov_steps_median=steps, store_bytes=store.used, bytes_per_example=per_example,
                           seconds=seconds, threads=args.threads, machine=platform.processor() or platform.machine(),
                           torch=torch.__version__, date=time.strftime("%Y-%m-%d")), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
