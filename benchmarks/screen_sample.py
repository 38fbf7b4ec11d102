"""What screening a chunk's first examples first saves (``hcrfast.algorithm._screen_in_part``). ``iterates="all"``
certifies the earlier iterates that could raise a bound, found by a screen of their uncertified shifts
(``_screen_earlier``). On the MNIST MLP a float64 forward costs about what the screen's arithmetic on a step
does, and the screen spared few of them; it is now run on an eighth of a chunk's examples first, and on the
others only where it spared at least half of those examples' steps there. Each mode in a fresh process: the
screen on every example (as before 2026-12-02's thirtieth session), sampled (now), and none (every step
certified); the call timed ``--repeat`` times after a warm-up call, the median kept.

    python benchmarks/screen_sample.py --model mnist --examples 64 \\
        --json benchmarks/results/screen_sample_mnist_cpu_20261202.json
    python benchmarks/screen_sample.py --model cifar10 --examples 4 --repeat 1 \\
        --json benchmarks/results/screen_sample_cifar10_cpu_20261202.json

The workload is ``lsqr_budget.random_workload``'s (random weights, seeded inputs, σ from their features), at the
defaults (R = 25, i = 10), one torch thread.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forward_pieces import child_row, write_json  # noqa: E402  (a row a process, the record)

MODES = ("every", "sampled", "none")


def one(model_name: str, examples: int, mode: str, repeat: int) -> dict:
    """The timed calls of one mode in this process."""
    import numpy as np
    import torch

    import hcrfast
    from hcrfast import algorithm
    from lsqr_budget import random_workload

    torch.set_num_threads(1)
    if mode == "every":
        algorithm._SCREEN_SAMPLE_MIN = 2**62
    elif mode == "none":
        algorithm._SCREEN_MARGIN = float("inf")
    zm, model, x, _, sigma = random_workload(model_name, examples, "cpu", 0)
    hcrfast.bound(model, x[:2], sigma, size=zm.size, restarts=2, iterations=2)   # (warm-up)
    seconds, res = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, size=zm.size, seed=0)
        seconds.append(time.perf_counter() - t0)
    earlier = res.params["earlier_iterates"]
    return dict(mode=mode, seconds=[round(s, 3) for s in seconds], median_seconds=round(statistics.median(seconds), 3),
                certified=earlier["certified"], steps=earlier["steps"], median_bound=float(np.median(res.std)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mnist")
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="where to write the rows and the machine (default: print only)")
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)   # (a child process's row)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.model, args.examples, args.one, args.repeat)))
        return 0
    rows = []
    for mode in MODES:
        r = child_row(__file__, [mode, "--model", args.model, "--examples", str(args.examples), "--repeat",
                                 str(args.repeat)], mode)
        if r is None:
            return 1
        rows.append(r)
        print(f"screen {mode:8s}: {r['median_seconds']:8.3f} s (median of {len(r['seconds'])}), "
              f"{r['certified']:,} of {r['steps']:,} earlier steps certified, median bound {r['median_bound']:.6g}")
    every, sampled, _ = rows
    print(f"sampled: {every['median_seconds'] / sampled['median_seconds']:.2f}x the speed of screening every example")
    if args.json:
        write_json(args.json, "screen_sample.py", argv, rows, model=args.model, examples=args.examples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
