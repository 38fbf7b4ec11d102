"""What does ``hcrfast.sigma_for`` cost? Bound calls and seconds per search, on a zoo model.

Each search starts at σ0 = the RMS of the clean features (σ-scale 1, as published) and looks for the
smallest σ whose certified bounds' quantile reaches the target; every call it makes is one full
``hcrfast.bound`` of the inputs. The table gives, per (target, quantile, statistic), the calls made,
the σ found as a multiple of σ0, the certified statistic over the target, and the search's seconds
over one plain ``bound`` call's at σ0 (same arguments, the faster of two calls made first).

Usage::

    python benchmarks/sigma_search.py mnist --examples 16 --restarts 5 --threads 1 --json out.json

``--profile feature-std`` searches one std per feature instead, σ0 = each feature's std over the
inputs (floored at 1e-3 of their RMS, so that dead features get some noise), scaled as one.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
import torch

import hcrfast
import hcrfast.calibrate
from hcrfast import zoo

SEARCHES = ((0.3, 0.5, "std"), (1.0, 0.5, "std"), (0.3, 0.05, "std"), (0.3, 0.5, "rmse"), (0.1, 0.5, "std"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=("digits", "mnist", "cifar10"))
    ap.add_argument("--examples", type=int, default=16)
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse-bytes", type=int, default=None,
                    help="sigma_for's reuse_bytes (default its own, taken once for every search; 0: every call "
                         "builds its own factor)")
    ap.add_argument("--profile", choices=("rms", "feature-std"), default="rms",
                    help="sigma0: one number, the features' RMS (default), or one std per feature, each "
                         "feature's std over the inputs")
    ap.add_argument("--sweep", default=None, metavar="SCALES",
                    help="instead of the searches: time hcrfast.sweep_sigma over these comma-separated scales of "
                         "sigma0 against one plain bound call per scale, and check their bounds agree")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    zm = zoo.build(args.model, seed=args.seed)
    x = torch.randn(args.examples, *zm.input_shape, generator=torch.Generator().manual_seed(args.seed + 1))
    kw = dict(restarts=args.restarts, iterations=args.iterations)

    with torch.no_grad():
        feats = zm.features(x).reshape(len(x), -1).double()
    sigma0 = hcrfast.rms_sigma(feats, 1.0)
    if args.profile == "feature-std":
        sigma0 = np.maximum(feats.std(0).numpy(), 1e-3 * sigma0)
    times = []
    for _ in range(2):  # the first call pays one-off costs (imports, first kernels): the faster of two
        t0 = time.perf_counter()
        base = hcrfast.bound(zm.features, x, sigma0, **kw)
        times.append(time.perf_counter() - t0)
    one = min(times)
    median0 = float(np.median(np.asarray(base.std, dtype=np.float64)))
    reuse = hcrfast.calibrate.default_reuse_bytes(x.device) if args.reuse_bytes is None else args.reuse_bytes
    print(f"{args.model}, {args.examples} random inputs x {args.restarts} restarts x {args.iterations}, solver "
          f"{base.params['solver']}, {args.threads} thread(s), reuse_bytes {reuse}, sigma0 {args.profile}: one "
          f"bound call at sigma0 "
          f"{one:.2f} s, median bound {median0:.4g}")
    if args.sweep:
        return _sweep(args, zm, x, sigma0, kw, reuse, one, base)
    print(f"{'target':>7} {'q':>5} {'stat':>5} {'calls':>5} {'sigma/sigma0':>12} {'stat/target':>11} "
          f"{'seconds':>8} {'x one call':>10}")
    rows = []
    for target, q, stat in SEARCHES:
        t0 = time.perf_counter()
        found = hcrfast.sigma_for(zm.features, x, target, sigma0=sigma0, quantile=q, statistic=stat,
                                  reuse_bytes=reuse, **kw)
        sec = time.perf_counter() - t0
        row = dict(target=target, quantile=q, statistic=stat, calls=len(found.history), scale=found.scale,
                   value=found.statistic, met=found.met, within_rtol=found.within_rtol, seconds=sec,
                   seconds_over_one_call=sec / one, history=found.history)
        rows.append(row)
        print(f"{target:>7g} {q:>5g} {stat:>5} {row['calls']:>5d} {found.scale:>12.4g} "
              f"{found.statistic / target:>11.4f} {sec:>8.2f} {sec / one:>10.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(_run(args, base, reuse, one), median_bound_at_sigma0=median0, searches=rows), fh,
                      indent=1)
    return 0


def _run(args, base, reuse, one) -> dict:
    """What every JSON of this script records of its run: arguments, solver, budget, machine, date."""
    return dict(argv=sys.argv, model=args.model, examples=args.examples, restarts=args.restarts,
                iterations=args.iterations, threads=args.threads, solver=base.params["solver"], profile=args.profile,
                reuse_bytes=reuse, one_call_seconds=one, machine=platform.processor() or platform.machine(),
                torch=torch.__version__, date=time.strftime("%Y-%m-%d"))


def _sweep(args, zm, x, sigma0, kw, reuse, one, base) -> int:
    """``--sweep``: sweep_sigma over the scales against a plain bound call at each, same arguments."""
    scales = [float(v) for v in args.sweep.split(",")]
    t0 = time.perf_counter()
    sweep = hcrfast.sweep_sigma(zm.features, x, scales, sigma0=sigma0, reuse_bytes=reuse, **kw)
    swept = time.perf_counter() - t0
    plain, worst = [], 0.0
    for k, got in zip(scales, sweep.bounds):
        t0 = time.perf_counter()
        direct = hcrfast.bound(zm.features, x, k * sigma0, **kw)
        plain.append(time.perf_counter() - t0)
        a, b = np.asarray(got.std, dtype=np.float64), np.asarray(direct.std, dtype=np.float64)
        ok = np.isfinite(b) & (b > 0)
        worst = max(worst, float(np.max(np.abs(a[ok] - b[ok]) / b[ok])) if ok.any() else 0.0)
    print(f"{'scale':>7} {'median bound':>12} {'sweep s':>8} {'plain s':>8} {'reused':>6}")
    for k, m, s_sweep, s_plain, used in zip(scales, sweep.statistic(), sweep.seconds, plain, sweep.reused_examples):
        print(f"{k:>7g} {m:>12.4g} {s_sweep:>8.2f} {s_plain:>8.2f} {used:>6d}")
    print(f"sweep {swept:.2f} s, plain calls {sum(plain):.2f} s ({sum(plain) / swept:.2f}x); largest relative "
          f"difference of a bound from the plain call's: {worst:.2g}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(_run(args, base, reuse, one), scales=scales, median_bounds=sweep.statistic().tolist(),
                           sweep_seconds=swept, sweep_call_seconds=sweep.seconds,
                           reused_examples=sweep.reused_examples, plain_call_seconds=plain,
                           plain_over_sweep=sum(plain) / swept, max_relative_difference=worst), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
