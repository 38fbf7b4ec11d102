"""Bound quality against LSQR effort on one zoo model: the same problem at several ``iter_lim`` caps.

Algorithm 1's bound is certified by forward passes whatever ε the solves return, so a capped solve
still gives a valid bound, only a possibly lower one. This measures how much of the bound each cap
keeps, and what it costs, where a full solve is expensive (ResNet-18, Swin-T: p ≈ 25,000).

    python benchmarks/lsqr_budget.py resnet18 --examples 1 --restarts 2 --iterations 3 \\
        --iter-lims 100,300,none --threads 1 --json out.json

Random inputs of the model's geometry (normalized), its published σ scale and start size, random
weights. Each row: wall time, LSQR steps per solve (median, max), products per example, median and
90th percentile of the bound, and the ratio of the median to that of the last (most accurate) row.

``--solver krylov`` runs ``bound(solver="krylov")`` instead (its default stopping rules,
``hcrfast.krylov.DEFAULT_OPTIONS``): the cap is then the size of each example's one Krylov basis,
and every solve is a projection on it (``hcrfast.krylov``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race import add_reorth_option, apply_reorth_option, machine_info, products_per_example  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import krylov, zoo  # noqa: E402
from hcrfast.backend import to_host  # noqa: E402


def random_workload(name: str, examples: int, device: str, first: int = 0):
    """A zoo model (random weights unless the zoo trains its own) on seeded random inputs of its geometry,
    normalized, and σ = its published scale × RMS of their features: ``(zm, model, x, features, sigma)``.
    The problem of this script, ``krylov_depth.py`` and last session's ResNet-18 tables. ``first``: skip
    that many inputs of the seeded stream (example ``first`` is the same image as in a batch from 0)."""
    zm = zoo.build(name)
    model = zm.features.eval().to(device)
    g = torch.Generator().manual_seed(0)
    x = zm.normalize(torch.rand((first + examples,) + tuple(zm.input_shape), generator=g)[first:]).to(device)
    with torch.no_grad():
        features = model(x)
    return zm, model, x, features, hcrfast.rms_sigma(features, zm.sigma_scale)


def workload_from_args(args):
    """:func:`random_workload` of :func:`add_workload_arguments`' ``args`` on the CPU, torch's threads set
    from ``args.threads`` first where given: ``(zm, model, x, features, sigma, example_ids)``."""
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    zm, model, x, features, sigma = random_workload(args.model, args.examples, "cpu", args.first)
    return zm, model, x, features, sigma, np.arange(args.first, args.first + args.examples)


def _index(text: str) -> int:
    """argparse type of ``--first``: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: pass an index >= 0")
    return value


def add_workload_arguments(ap, *, iterations: int) -> None:
    """The arguments of :func:`random_workload`'s problem (shared with ``krylov_depth.py``)."""
    ap.add_argument("model", choices=zoo.NAMES)
    ap.add_argument("--examples", type=int, default=1)
    ap.add_argument("--first", type=_index, default=0,
                    help="the examples are inputs FIRST.. of the seeded stream, seeded as examples FIRST.. "
                         "(bound's example_ids); sigma from their own features")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=iterations)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(ap, iterations=3)
    ap.add_argument("--iter-lims", default="100,300,none",
                    help="comma-separated LSQR iter_lim caps; 'none' is DEFAULT_LSQR's 2·max(n, p)")
    ap.add_argument("--solver", default="lsqr", choices=("lsqr", "krylov"))
    ap.add_argument("--krylov-pilots", type=int, default=1, help="bound(krylov_pilots=...) with --solver krylov")
    add_reorth_option(ap)
    ap.add_argument("--targets", default=None,
                    help="bound(targets=SPEC), e.g. low:8: also the targeted bounds (with --solver krylov their "
                         "directions come from the basis); the row reports the lift over Algorithm 1")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    apply_reorth_option(args.reorth_passes)
    caps = [None if c.strip().lower() == "none" else int(c) for c in args.iter_lims.split(",")]
    zm, model, x, _, sigma = random_workload(args.model, args.examples, args.device, args.first)
    print(f"{args.model}, solver {args.solver}: {args.examples} examples"
          f"{f' from {args.first}' if args.first else ''} x R {args.restarts} x i {args.iterations}, "
          f"s = {zm.size:g}, "
          f"sigma = {sigma:.4g}, {args.device}, torch threads {torch.get_num_threads()}", flush=True)
    # the process's one-time costs outside the timing (the first cap's row paid them: 0.4 s against 0.0 s)
    hcrfast.bound(model, x[:1], sigma, size=zm.size, restarts=1, iterations=1, solver=args.solver, singular_steps=0,
                  **({"krylov_pilots": 1} if args.solver == "krylov" else {}))
    if args.device == "cuda":
        torch.cuda.synchronize()
    rows = []
    for cap in caps:
        base = krylov.DEFAULT_OPTIONS if args.solver == "krylov" else hcrfast.DEFAULT_LSQR
        opts = dataclasses.replace(base, iter_lim=cap)
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, size=zm.size, restarts=args.restarts, iterations=args.iterations,
                            lsqr=opts, solver=args.solver, targets=args.targets,
                            singular_steps=0,   # Algorithm 1 (and targets): what the cap changes
                            example_ids=np.arange(args.first, args.first + args.examples),
                            **({"krylov_pilots": args.krylov_pilots} if args.solver == "krylov" else {}))
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        h = res.to_numpy()
        recycled = res.params["solver"] == "krylov"
        # krylov: the bases' LSQRs, at the pilots' first steps
        solves = h.lsqr_iterations[:, :args.krylov_pilots, :1] if recycled else h.lsqr_iterations
        row = dict(solver=args.solver, iter_lim=cap, seconds=seconds, steps_median=float(np.median(solves)),
                   steps_max=int(solves.max()),
                   steps_first_solve_median=float(np.median(h.lsqr_iterations[..., 0])),
                   products_per_example=(res.params["krylov"]["products_per_example"] if recycled else
                                         products_per_example(h.lsqr_iterations, res.params["warm_start"])),
                   krylov=res.params["krylov"], reorth_passes=krylov.REORTH_PASSES if recycled else None,
                   median=float(np.median(h.std)), p90=float(np.quantile(h.std, 0.9)),
                   istop=sorted(set(h.lsqr_istop.ravel().tolist())))
        if args.targets:
            sel = np.broadcast_to(to_host(res.targeted.targeted), h.std.shape)
            alg1, both = h.std_algorithm1[sel], h.std[sel]
            row["targets"] = dict(spec=args.targets, method=res.targeted.method, seconds=res.targeted.timings["total"],
                                  modes_lifted_fraction=float(np.mean(both > alg1)),
                                  median_algorithm1=float(np.median(alg1)), median_with_targets=float(np.median(both)),
                                  median_gain=float(np.median(both / np.where(alg1 > 0, alg1, np.nan))))
            # the modes not targeted, which the targeted steps bound too (each bounds every mode it moves)
            alg1_o, both_o = h.std_algorithm1[~sel], h.std[~sel]
            if alg1_o.size:
                row["targets"].update(
                    other_modes=int(alg1_o.size), other_modes_lifted_fraction=float(np.mean(both_o > alg1_o)),
                    other_median_algorithm1=float(np.median(alg1_o)), other_median_with_targets=float(np.median(both_o)),
                    other_median_gain=float(np.median(both_o / np.where(alg1_o > 0, alg1_o, np.nan))))
        rows.append(row)
        print(f"  iter_lim {str(cap):>5}: {seconds:8.1f} s  steps/solve median {row['steps_median']:6.0f} "
              f"(first solve {row['steps_first_solve_median']:.0f}, max {row['steps_max']})  products/ex "
              f"{row['products_per_example']:8.0f}  median {row['median']:.5g}  p90 {row['p90']:.5g}  "
              f"istop {row['istop']}", flush=True)
        if args.targets:
            t = row["targets"]
            print(f"    targets {t['spec']} ({t['method']}, {t['seconds']:.1f} s): lifted {t['modes_lifted_fraction']:.1%} "
                  f"of the targeted modes, median there {t['median_algorithm1']:.5g} -> {t['median_with_targets']:.5g} "
                  f"(median gain {t['median_gain']:.2f}x)", flush=True)
            if "other_modes" in t:
                print(f"    and of the {t['other_modes']} other modes {t['other_modes_lifted_fraction']:.1%}, median there "
                      f"{t['other_median_algorithm1']:.5g} -> {t['other_median_with_targets']:.5g} "
                      f"(median gain {t['other_median_gain']:.2f}x)", flush=True)
    for row in rows:
        row["median_vs_last"] = row["median"] / rows[-1]["median"]
    print("  median bound relative to the last row: "
          + ", ".join(f"{r['iter_lim']}: {r['median_vs_last']:.4f}" for r in rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            command="python benchmarks/lsqr_budget.py " + " ".join(sys.argv[1:] if argv is None else argv),
            args=vars(args), sigma=sigma, machine=machine_info(args.device), rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
