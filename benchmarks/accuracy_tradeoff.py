"""The most noise a utility target allows, and the confidentiality it buys, on the digits model.

Trains the digits MLP as ``hcrfast reproduce digits`` does (``hcrfast.train``, seed 0; or ``--weights``),
takes the first N test digits and, for each target accuracy: ``hcrfast.sigma_for_accuracy`` (the head's
accuracy on D noisy copies of every input's features, seed 0) and then ``hcrfast.bound`` at the σ found
(the published s = 1/200, R restarts, i = 10). One row per target: σ / RMS, the accuracy there and just
above it, the median bound over all modes and over the 4×4 lowest, and the seconds of each part.
``--metric top2`` scores the head's two best classes; ``--metric cosine`` the features themselves (no head,
no labels: each noisy copy's cosine with the clean features, as for an embedding released as it is).

Usage::

    python benchmarks/accuracy_tradeoff.py [--targets 0.95,0.9,0.8] [--examples 500] [--draws 25]
                                           [--restarts 25] [--weights PATH] [--metric accuracy|topK|cosine]
                                           [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import hcrfast
from hcrfast import data, zoo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="0.95,0.9,0.8", help="accuracies to keep, comma-separated")
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--draws", type=int, default=25, help="noisy copies per input (reproduce: one per restart)")
    ap.add_argument("--restarts", type=int, default=25)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--weights", default=None, help="a digits state dict (default: train one, seed 0)")
    ap.add_argument("--metric", default="accuracy", help="accuracy (default), topK, or cosine (no head)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    targets = [float(t) for t in args.targets.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        weights = args.weights
        if weights is None:
            from hcrfast.train import train

            weights = Path(tmp) / "digits_state_dict.pt"
            train("digits", out=weights, seed=0, progress=False)
        zm = zoo.build("digits", weights=weights)
    images, labels = data.load("digits", split="test", limit=args.examples)
    x = zm.normalize(images)
    model, head = zm.features.eval(), zm.head.eval()
    if args.metric == "cosine":  # the features as released, no head: no labels either
        head, labels = None, None
    with torch.no_grad():
        rms = hcrfast.rms_sigma(model(x), 1.0)
    rows = []
    print(f"digits: {len(x)} test digits, features RMS {rms:.6g}, {args.draws} draws, R = {args.restarts}, "
          f"i = {args.iterations}, metric {args.metric}")
    print(f"{'target':>7} {'sigma/RMS':>10} {args.metric:>16} {'above':>8} {'median bound':>13} {'4x4 low':>8} "
          f"{'search s':>9} {'bound s':>8}")
    for target in targets:
        t0 = time.perf_counter()
        found = hcrfast.sigma_for_accuracy(model, head, x, labels, target, draws=args.draws, seed=0,
                                           metric=args.metric)
        t1 = time.perf_counter()
        res = hcrfast.bound(model, x, found.sigma, restarts=args.restarts, iterations=args.iterations)
        t2 = time.perf_counter()
        std = np.asarray(res.std, dtype=np.float64)
        row = dict(target=target, scale=found.scale, sigma=found.sigma, rms=rms,
                   accuracy=found.utility.dithered, stderr=found.utility.stderr, clean=found.utility.clean,
                   above_scale=found.above_scale, above_accuracy=None if found.above is None else found.above.dithered,
                   sigmas_tried=len(found.history), median_bound=float(np.median(std)),
                   median_bound_low4=float(np.median(std[:, :, :4, :4])), search_seconds=t1 - t0,
                   bound_seconds=t2 - t1, note=found.note)
        rows.append(row)
        print(f"{target:>7g} {found.scale:>10.4g} {row['accuracy']:>8.4f} ± {row['stderr']:.4f} "
              f"{row['above_accuracy'] if row['above_accuracy'] is not None else float('nan'):>8.4f} "
              f"{row['median_bound']:>13.4g} {row['median_bound_low4']:>8.4g} {row['search_seconds']:>9.2f} "
              f"{row['bound_seconds']:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python benchmarks/accuracy_tradeoff.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "examples": len(x), "metric": args.metric, "draws": args.draws, "restarts": args.restarts,
            "iterations": args.iterations,
            "clean_accuracy": rows[0]["clean"] if rows else None, "rows": rows,
            "versions": {"hcrfast": hcrfast.__version__, "torch": torch.__version__}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
