"""What ``hcrfast.validation.check_repeatable`` costs beside the ``hcrfast.bound`` call it guards: the float64
copy's features of 8 examples computed again, in reverse order and one at a time (and a JVP only where
their own norm leaves a gap), against the whole call.

    python benchmarks/repeat_check_cost.py --examples 32 --threads 1 \
        --json benchmarks/results/repeat_check_cost_mlp_cpu.json

Each timing is the best of ``--repeats``; the check is timed alone on the same float64 copy ``bound`` makes,
and it must pass (the race's models are deterministic and example by example).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from race import build_problem, device_ready, machine_info  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import validation  # noqa: E402


def _best(call, repeats: int, device: str) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp", choices=("mlp", "digits"))
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--restarts", type=int, default=25)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not device_ready(args, "repeat_check_cost"):
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    model, x = build_problem(args.model, args.examples, seed=0, device=args.device)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x))
    model64 = validation.float64_model(model, x, True)
    shift = validation.noise_shift(hcrfast.Gaussian(sigma), 1 / 200)
    check = _best(lambda: validation.check_repeatable(model64, x, shift), args.repeats, args.device)
    call = _best(lambda: hcrfast.bound(model, x, sigma, restarts=args.restarts, iterations=args.iterations),
                 args.repeats, args.device)
    print(f"{args.model}, {args.examples} examples x {args.restarts} x {args.iterations}, best of {args.repeats}: "
          f"check_repeatable {check:.4f} s, bound {call:.3f} s (the check inside it: {check / call:.2%})")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), check_seconds=check, bound_seconds=call,
                                                   share=check / call, machine=machine_info(args.device)),
                                              indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
