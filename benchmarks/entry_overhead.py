"""What the checks every entry point added on 2026-12-01 cost, against one forward of the batch.

Two costs per call (per chunk of ``hcrfast reproduce``, which calls ``bound`` per chunk):

- the features of a few examples (``hcrfast.validation.REPEAT_ROWS``) computed again after the solve
  (``hcrfast.algorithm._StillTheSameFunction``: one forward of those rows in the model's dtype and two of the
  float64 copy), which refuses a model that changed itself during the call;
- a copy of the model's buffers on entry, compared and put back on exit (``hcrfast.validation._buffer_copies``,
  ``_restore_buffers``), which gives the caller the model's buffers as they were.

Timed on torchvision models with random weights, one thread, against one float32 forward of the batch; a
``bound`` call runs hundreds of such forwards' worth of products, so these are the whole of what the checks add.

Usage::

    taskset -c 1 python benchmarks/entry_overhead.py [--models resnet18,mobilenet_v3_small] [--sizes 91,224]
        [--batch 8] [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import torch
import torchvision

from hcrfast import algorithm, validation


def _seconds(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v3_small")
    ap.add_argument("--sizes", default="91,224", help="input heights = widths, comma-separated")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"{'model':>20} {'input':>16} {'forward (s)':>12} {'end check (s)':>14} {'ratio':>6} {'buffers (ms)':>13} "
          f"{'buffer MB':>10}")
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        model64 = copy.deepcopy(model).double()
        megabytes = sum(b.numel() * b.element_size() for b in model.buffers()) / 2**20
        for size in (int(s) for s in args.sizes.split(",")):
            x = torch.randn(args.batch, 3, size, size, generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                features = model(x)
                forward = _seconds(lambda: model(x))

            def end_check():
                algorithm._StillTheSameFunction(model64, x, 1e-3, torch.float64, model, features, 1e-4).check()

            check = _seconds(end_check, 1)
            buffers = _seconds(lambda: validation._restore_buffers(validation._buffer_copies(model)))
            rows.append(dict(model=name, input=[args.batch, 3, size, size], forward_seconds=forward,
                             end_check_seconds=check, buffers_seconds=buffers, buffer_megabytes=megabytes,
                             rows=min(validation.REPEAT_ROWS, args.batch)))
            print(f"{name:>20} {str((args.batch, 3, size, size)):>16} {forward:12.3f} {check:14.3f} "
                  f"{check / forward:6.1f} {buffers * 1e3:13.2f} {megabytes:10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=1, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
