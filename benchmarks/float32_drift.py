"""Do a linear model's bounds scale with sigma when sigma * size is small next to its features?

A linear map 64 -> 80 with a bias (3 random 8x8 inputs, R = 3, i = 2) in float32 and float64: for each
solver (the dense solve and LSQR, without singular steps, which are not iterated; and the defaults, with
them) and each scale c, the per-mode ratio bound(c * sigma) / (c * bound(sigma)), sigma the features'
RMS, and whether bound warned that float32's rounding set Algorithm 1's steps
(``hcrfast.algorithm._dtype_drift``). A linearized model's bounds are proportional to sigma: any
departure is rounding. The bounds stay certified either way (float64 forward passes).

Usage::

    python benchmarks/float32_drift.py [--scales 1e-1,1e-2,1e-3,1e-4] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

import numpy as np
import torch

import hcrfast


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="1e-1,1e-2,1e-3,1e-4", help="the scales c, comma-separated")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    scales = [float(c) for c in args.scales.split(",")]
    torch.set_num_threads(1)
    rows = []
    print(f"{'dtype':>8} {'solver':>14} {'c':>7} {'min ratio':>10} {'median':>8} {'max ratio':>10}  warned")
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 80)).to(dtype).eval()
        x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(3)).to(dtype)
        with torch.no_grad():
            sigma = float(hcrfast.rms_sigma(model(x), 1.0))
        for name, kw in (("dense", dict(solver="dense", singular_steps=0)),
                         ("lsqr", dict(solver="lsqr", singular_steps=0)), ("defaults", {})):
            kw = dict(kw, restarts=3, iterations=2)
            base = hcrfast.bound(model, x, sigma, **kw)
            for c in scales:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    res = hcrfast.bound(model, x, sigma * c, **kw)
                ratio = res.std / (c * base.std)
                warned = any("strayed from the float64 ones" in str(w.message) for w in caught)
                row = dict(dtype=str(dtype).replace("torch.", ""), solver=name, scale=c, min=float(ratio.min()),
                           median=float(np.median(ratio)), max=float(ratio.max()), warned=warned)
                rows.append(row)
                print(f"{row['dtype']:>8} {name:>14} {c:>7.0e} {row['min']:>10.4f} {row['median']:>8.4f} "
                      f"{row['max']:>10.4f}  {'yes' if warned else 'no'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(rows=rows, argv=sys.argv[1:]), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
