"""What running the model and the head in pieces saves in ``hcrfast.dithered_accuracy`` (and so
``sigma_for_accuracy`` and ``reproduce``'s accuracies). The head ran on every noisy copy of a chunk at once, up
to 2^24 feature values (examples × draws rows), however wide its own layers; the model's features of the whole
batch ran at once. Both now run in pieces of ``hcrfast.algorithm.FORWARD_PIECE_BYTES`` of their largest
activation per row, as ``bound``'s do (the model's first ``FIRST_PIECE_ROWS`` rows first, counted). Peak memory
and time with the pieces and without them (as before 2026-12-02's twenty-ninth session), each in a fresh process.

    python benchmarks/head_pieces.py --examples 170000 --width 512 --threads 1 \
        --json benchmarks/results/head_pieces_cpu_20261202.json
    python benchmarks/head_pieces.py --model cnn --examples 4000 --draws 1 --threads 1 \
        --json benchmarks/results/model_pieces_cnn_cpu_20261202.json

``--model linear``: a Linear of 20 inputs to ``--features`` features; the head: Linear(features, width), Tanh,
Linear(width, 5) (random weights, seed 0), in float32; labels are the head's clean classes; σ = 0.3.
``--model cnn``: forward_pieces.py's 3 × 32-channel CNN on 28 × 28 inputs, no head, the cosine of each noisy
copy with the clean features; σ = 0.1. Peak RSS is read from ``/proc/self/status`` (VmHWM), in MiB, over the
process's RSS just before the call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forward_pieces import _vm, both_ways, cnn, write_json  # noqa: E402  (the same model, measures, rows)


def one(model_name: str, examples: int, features: int, width: int, pieces: bool, threads: int, draws: int) -> dict:
    """One call in this process: its peak memory over the RSS before it, and its time."""
    import torch

    import hcrfast
    from hcrfast import algorithm

    torch.set_num_threads(threads)
    if not pieces:
        algorithm.FORWARD_PIECE_BYTES = algorithm.FIRST_PIECE_ROWS = 2**62
    torch.manual_seed(0)
    if model_name == "cnn":
        model, head, labels, sigma, metric = cnn(32), None, None, 0.1, "cosine"
        x = torch.rand(examples, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    else:
        model = torch.nn.Linear(20, features).eval()
        head = torch.nn.Sequential(torch.nn.Linear(features, width), torch.nn.Tanh(),
                                   torch.nn.Linear(width, 5)).eval()
        x = torch.randn(examples, 20, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            labels = head(model(x)).argmax(dim=1).numpy()
        sigma, metric = 0.3, "accuracy"
    base = _vm("VmRSS")
    t0 = time.perf_counter()
    u = hcrfast.dithered_accuracy(model, head, x, labels, sigma, draws=draws, metric=metric)
    seconds = time.perf_counter() - t0
    return dict(pieces=pieces, peak_mib_over_base=round(_vm("VmHWM") - base, 1), seconds=round(seconds, 3),
                clean=u.clean, dithered=u.dithered, piece_bytes=algorithm.FORWARD_PIECE_BYTES)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="linear", choices=["linear", "cnn"])
    ap.add_argument("--examples", type=int, default=170_000)
    ap.add_argument("--features", type=int, default=10)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="where to write the two rows and the machine (default: print only)")
    ap.add_argument("--one", choices=["pieces", "whole"], help=argparse.SUPPRESS)   # (the child process's row)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.model, args.examples, args.features, args.width, args.one == "pieces",
                             args.threads, args.draws)))
        return 0
    if not os.path.exists("/proc/self/status"):
        print("head_pieces.py reads peak memory from /proc/self/status: Linux only", file=sys.stderr)
        return 2
    rows = both_ways(__file__, ["--model", args.model, "--examples", str(args.examples), "--features", str(args.features), "--width",
                                str(args.width), "--draws", str(args.draws), "--threads", str(args.threads)],
                     lambda r: f"accuracy clean {r['clean']:.6g}, dithered {r['dithered']:.6g}")
    if rows is None:
        return 1
    if args.json:
        write_json(args.json, "head_pieces.py", argv, rows, model=args.model, examples=args.examples,
                   features=args.features,
                   width=args.width, draws=args.draws, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
