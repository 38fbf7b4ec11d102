"""What ``hcrfast.bound(..., checkpoint=DIR)`` costs: the same call timed without a checkpoint, with
one (every chunk written as it finishes), and made again on the finished folder (all read back).

    python benchmarks/checkpoint_cost.py --examples 64 --chunk-size 8 --threads 1 \
        --json benchmarks/results/checkpoint_cost_mlp_cpu.json

Each timing is the best of ``--repeats`` calls (a fresh folder for every call with a checkpoint).
The bounds of the three calls are checked to be equal before anything is reported.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from race import build_problem, device_ready, machine_info  # noqa: E402

import hcrfast  # noqa: E402


def _timed(call, device: str):
    t0 = time.perf_counter()
    res = call()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp", choices=("mlp", "digits"))
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--restarts", type=int, default=25)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--chunk-size", type=int, default=8)
    ap.add_argument("--solver", default="auto", choices=("auto", "lsqr", "dense", "krylov"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not device_ready(args, "checkpoint_cost"):
        return 0
    model, x = build_problem(args.model, args.examples, seed=0, device=args.device)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x))
    kw = dict(restarts=args.restarts, iterations=args.iterations, chunk_size=args.chunk_size, solver=args.solver)

    # the process's one-time costs outside the timing: the first call paid them, and it was always "plain" (a
    # checkpoint "cost" -70% in a fresh process)
    hcrfast.bound(model, x[:1], sigma, **{**kw, "restarts": 1, "iterations": 1, "chunk_size": None})
    if args.device == "cuda":
        torch.cuda.synchronize()
    times = {"plain": [], "checkpoint": [], "read_back": []}
    results = {}
    for _ in range(args.repeats):
        folder = Path(tempfile.mkdtemp(prefix="hcrfast-ck-"))
        try:
            t, results["plain"] = _timed(lambda: hcrfast.bound(model, x, sigma, **kw), args.device)
            times["plain"].append(t)
            t, results["checkpoint"] = _timed(lambda: hcrfast.bound(model, x, sigma, checkpoint=folder, **kw),
                                              args.device)
            times["checkpoint"].append(t)
            written = sum(f.stat().st_size for f in folder.iterdir())
            files = len(list(folder.glob("chunk_*.npz")))
            t, results["read_back"] = _timed(lambda: hcrfast.bound(model, x, sigma, checkpoint=folder, **kw),
                                             args.device)
            times["read_back"].append(t)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    plain = results["plain"].to_numpy()
    for name in ("checkpoint", "read_back"):
        other = results[name].to_numpy()
        for field in ("std", "mse", "divergence"):
            if not np.array_equal(getattr(plain, field), getattr(other, field)):
                raise SystemExit(f"checkpoint_cost: the {name} call's {field} differs from the plain call's")
    assert results["read_back"].params["checkpoint"]["examples_read_back"] == args.examples

    best = {k: min(v) for k, v in times.items()}
    print(f"{args.model}, {args.examples} examples x {args.restarts} x {args.iterations}, chunks of "
          f"{args.chunk_size}, solver {plain.params['solver']}, best of {args.repeats}:")
    print(f"  no checkpoint        {best['plain']:8.3f} s")
    print(f"  checkpoint           {best['checkpoint']:8.3f} s  ({best['checkpoint'] / best['plain'] - 1:+.1%}; "
          f"{written / 2**20:.1f} MiB in {files} chunk files)")
    print(f"  all read back        {best['read_back']:8.3f} s  ({best['read_back'] / best['plain']:.1%} of a computed call)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            args=vars(args), solver=plain.params["solver"], seconds=times, best=best, bytes_written=written, chunk_files=files,
            bounds_equal=True, machine=machine_info(args.device)), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
