"""How far are the bounds a sigma search hands back, with factors kept, from a direct call at that sigma?

On the tests' tanh MLP (64 inputs, 40 tanh units, 30 features; 8 random inputs, R = 3, i = 4), for a
scalar sigma0 and a per-feature profile, each solver and dtype: ``hcrfast.sigma_for`` (factors kept
across its calls; a profile run as the scalar sigma on the features divided by it) against
``hcrfast.bound`` called alone at the sigma found. Prints the largest and median relative difference
over the modes, and that of the median bound.

Usage::

    python benchmarks/reuse_rounding.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

import hcrfast


def _net(dtype):
    torch.manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 40), torch.nn.Tanh(), torch.nn.Linear(40, 30))
    return net.to(dtype).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"{'dtype':>8} {'sigma0':>8} {'solver':>7} {'calls':>5} {'max rel':>9} {'median rel':>10} {'median bound rel':>16}")
    for dtype in (torch.float32, torch.float64):
        model = _net(dtype)
        x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(1)).to(dtype)
        for sigma0 in ("scalar", "profile"):
            for solver in ("dense", "krylov"):
                kw = dict(restarts=3, iterations=4, solver=solver)
                found = hcrfast.sigma_for(model, x, 0.3, **kw, **(
                    dict(sigma0=np.linspace(0.05, 0.5, 30)) if sigma0 == "profile" else {}))
                direct = hcrfast.bound(model, x, found.sigma, **kw)
                a = np.asarray(found.bounds.std, dtype=np.float64).ravel()
                b = np.asarray(direct.std, dtype=np.float64).ravel()
                ok = np.isfinite(b) & (b > 0)
                rel = np.abs(a[ok] - b[ok]) / b[ok]
                row = dict(dtype=str(dtype).split(".")[-1], sigma0=sigma0, solver=solver, calls=len(found.history),
                           reused=[h["reused_examples"] for h in found.history], max_rel=float(rel.max()),
                           median_rel=float(np.median(rel)),
                           median_bound_rel=float(abs(np.median(a) / np.median(b) - 1)))
                rows.append(row)
                print(f"{row['dtype']:>8} {sigma0:>8} {solver:>7} {row['calls']:>5d} {row['max_rel']:>9.2g} "
                      f"{row['median_rel']:>10.2g} {row['median_bound_rel']:>16.2g}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(argv=sys.argv, rows=rows, torch=torch.__version__, date=time.strftime("%Y-%m-%d")), fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
