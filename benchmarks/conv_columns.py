"""What counting float64 convolutions' column buffers saves (``hcrfast.algorithm._conv_columns``). torch's float64
convolutions on CPUs (no mkldnn) unfold the whole piece into a column buffer of ``in_channels / groups × kernel``
values per output position, 9.1 times a 3 × 3 convolution's output of 32 to 32 channels: pieces held to
``FORWARD_PIECE_BYTES`` of outputs peaked near ten times it. The certifying passes run the model's float64 copy, so
every CNN's certification did. Each row below is a fresh process, with the columns counted (as now) or not (as
before 2026-12-02's thirtieth session); same model, inputs and results.

    python benchmarks/conv_columns.py --json benchmarks/results/conv_columns_cpu_20261202.json

The model: forward_pieces.py's 3 × 32-channel CNN on 28 × 28 inputs (10 features), σ = 0.1, one torch thread.
``targeted``: ``targeted_bound`` of ``--examples-targeted`` examples, ``targets="low:8"``, dense directions;
``bound``: ``bound`` of ``--examples`` examples, 4 restarts, 2 iterations (the automatic solver). Peak RSS is
read from ``/proc/self/status`` (VmHWM), in MiB, over the process's RSS just before the call.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forward_pieces import _vm, child_row, cnn, write_json  # noqa: E402  (the same model, measures, record)


def one(call: str, examples: int, counted: bool) -> dict:
    """One call in this process: its peak memory over the RSS before it, its time, and a digest of its bounds."""
    import numpy as np
    import torch

    import hcrfast
    from hcrfast import algorithm

    torch.set_num_threads(1)
    if not counted:
        algorithm._conv_columns = lambda *args: 0
    torch.manual_seed(0)
    model = cnn(32)
    x = torch.rand(examples, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    base = _vm("VmRSS")
    t0 = time.perf_counter()
    if call == "targeted":
        std = hcrfast.targeted_bound(model, x, 0.1, targets="low:8", method="dense").std
    else:
        std = hcrfast.bound(model, x, 0.1, restarts=4, iterations=2, seed=0).std
    seconds = time.perf_counter() - t0
    std = np.ascontiguousarray(np.asarray(std, dtype=np.float64))
    return dict(call=call, examples=examples, columns_counted=counted, peak_mib_over_base=round(_vm("VmHWM") - base, 1),
                seconds=round(seconds, 3), median_std=float(np.median(std)),
                std_sha256=hashlib.sha256(std.tobytes()).hexdigest()[:16])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--examples-targeted", type=int, default=4)
    ap.add_argument("--json", type=Path, help="where to write the rows and the machine (default: print only)")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)   # (a child process's row: call, examples, counted)
    args = ap.parse_args(argv)
    if args.one:
        call, examples, counted = args.one
        print(json.dumps(one(call, int(examples), counted == "1")))
        return 0
    if not os.path.exists("/proc/self/status"):
        print("conv_columns.py reads peak memory from /proc/self/status: Linux only", file=sys.stderr)
        return 2
    rows = []
    for call, examples in (("targeted", args.examples_targeted), ("bound", args.examples)):
        pair = []
        for counted in ("0", "1"):
            r = child_row(__file__, [call, str(examples), counted], call)
            if r is None:
                return 1
            pair.append(r)
            print(f"{call:8s} columns {'counted' if r['columns_counted'] else 'not counted':11s}: peak "
                  f"{r['peak_mib_over_base']:7.1f} MiB, {r['seconds']:6.2f} s, median {r['median_std']:.6g}, "
                  f"bounds {r['std_sha256']}")
        before, now = pair
        print(f"{call:8s}: {before['peak_mib_over_base'] / max(now['peak_mib_over_base'], 1e-9):.2f}x less memory, "
              f"{before['seconds'] / now['seconds']:.2f}x the speed, same bounds: "
              f"{before['std_sha256'] == now['std_sha256']}")
        rows += pair
    if args.json:
        write_json(args.json, "conv_columns.py", argv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
