"""How the bound grows with the size of the Krylov basis (``bound(solver="krylov")``), from one build.

The Golub–Kahan vectors of a k-step run are the first k of a longer run's, so one basis of the largest
depth, built once per example (LSQR on restart 0's start vector with every vector kept and
reorthogonalized, no stopping test), is truncated to each depth (``KrylovBasis.truncated``) and
Algorithm 1 runs on each truncation: the bound a ``solver="krylov"`` run with ``iter_lim=k`` would give,
at the price of one build.

    python benchmarks/krylov_depth.py resnet18 --examples 1 --restarts 2 --iterations 10 \\
        --depths 500,1000,2000,4096 --threads 1 --json out.json

With ``--krylov-pilots P`` each example builds P bases, one from each of restarts 0..P−1's start vectors,
and restart r is solved in pilot r mod P's (``bound(krylov_pilots=P)``); every depth is then each pilot's
step count, so a depth k costs ~P·(2k + 1) products per example. Comparing ``--krylov-pilots 25 --depths
20,41,82,163`` with ``--depths 512,1024,2048,4096`` compares many short bases with one long one at equal
products, across budgets, from two builds.

Each row also gives the element-wise max of the bounds of the depths so far (``median_max_over_depths``): every
depth's bounds are certified by forward passes, so their max is a bound too, what a run that tried every
listed depth (one build, Algorithm 1's forward passes once per depth) would report.

With ``--union`` each depth also solves every restart in the union of its example's pilot bases
(``krylov_union.py``: J is known on all P·k vectors, so no more products), once per ``--union-tau``, and
reports that bound and its element-wise max with the pilots' own; the max over depths then takes in the
union's bounds too.

Random inputs of the model's geometry (normalized), its published σ scale and start size, random weights:
the same problem as ``lsqr_budget.py`` (whose JSON ``--reference-json`` reads for the ratios).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lsqr_budget import add_workload_arguments, random_workload  # noqa: E402
from krylov_union import UnionSolver, describe  # noqa: E402
from race import machine_info  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import algorithm, krylov  # noqa: E402
from hcrfast.bindings import TorchJacobian, array_module_for, ieee_float32, solver_stream  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(ap, iterations=10)
    ap.add_argument("--depths", default="500,1000,2000,4096", help="comma-separated basis sizes k")
    ap.add_argument("--krylov-pilots", type=int, default=1,
                    help="bases per example (restarts 0..P-1 start them; restart r is solved in pilot r mod P's)")
    ap.add_argument("--check-every", type=int, default=krylov.DEFAULT_OPTIONS.check_every,
                    help="basis steps between host checks (default bound()'s; each check may roll a block back)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--reference-json", default=None,
                    help="an lsqr_budget.py JSON of the same problem: its last row's median is the reference")
    ap.add_argument("--iterates", default="all", choices=("all", "last"),
                    help="bound(iterates=...): every iterate's certified bound (default since 2026-11-29's eighth "
                         "session) or the last one's alone (what this script's earlier results took)")
    ap.add_argument("--union", action="store_true",
                    help="also solve every restart in the union of its example's pilot bases (krylov_union.py) "
                         "and report that bound and the element-wise max of both")
    ap.add_argument("--union-tau", type=lambda v: [float(t) for t in v.split(",")], default=[0.1],
                    help="--union: keep the union's directions whose singular value in W is at least this share "
                         "of the largest (comma-separated: one union solve each)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    depths = sorted(int(d) for d in args.depths.split(","))
    if depths[0] < 1:
        raise SystemExit(f"--depths must be positive integers, got {args.depths!r}")
    pilots = args.krylov_pilots
    if not 1 <= pilots <= args.restarts:
        raise SystemExit(f"--krylov-pilots {pilots}: pass 1..--restarts ({args.restarts}); the pilots are restarts "
                         "0..P-1")
    if args.check_every < 1:
        raise SystemExit(f"--check-every {args.check_every}: pass a step count >= 1 (bound()'s default is "
                         f"{krylov.DEFAULT_OPTIONS.check_every})")
    zm, model, x, f0, sigma = random_workload(args.model, args.examples, args.device, args.first)
    ids = np.arange(args.first, args.first + args.examples)
    n = f0[0].numel()
    reference = None
    if args.reference_json:
        ref = json.loads(Path(args.reference_json).read_text())
        for key in ("examples", "restarts", "iterations", "first"):  # pilots may differ: equal products
            if ref["args"].get(key, 0) != getattr(args, key) or ref["args"]["model"] != args.model:
                raise SystemExit(f"--reference-json is another problem ({key}: {ref['args'].get(key, 0)!r})")
        reference = ref["rows"][-1]
    print(f"{args.model}: {args.examples} examples x R {args.restarts} x i {args.iterations}, s = {zm.size:g}, "
          f"sigma = {sigma:.4g}, {pilots} pilot(s), depths {depths}, {args.device}, "
          f"torch threads {torch.get_num_threads()}", flush=True)

    xp = array_module_for(x.device)
    # bound()'s pilots: restarts 0..P-1 of each example's start vectors, example-major
    starts = hcrfast.start_vectors(ids, args.restarts, n, seed=0, size=zm.size, sigma=sigma)
    pilot = np.ascontiguousarray(starts.reshape(args.examples, args.restarts, n)[:, :pilots].reshape(-1, n))
    t0 = time.perf_counter()

    def progress(steps, active):
        if steps % 256 == 0:
            print(f"  basis: {steps} steps ({time.perf_counter() - t0:.0f} s)", flush=True)

    # As bound() builds it: on the solver's stream, with IEEE float32 products (cuDNN defaults to TF32).
    with solver_stream(x.device), ieee_float32():
        full = krylov.build(TorchJacobian(model, x.repeat_interleave(pilots, dim=0)),
                            xp.asarray(pilot, dtype=np.float32),
                            hcrfast.LSQROptions(atol=0, btol=0, conlim=0, iter_lim=depths[-1],
                                                check_every=args.check_every),
                            progress=progress)
    build_seconds = time.perf_counter() - t0
    print(f"  basis of {full.steps.tolist()} steps built in {build_seconds:.1f} s; steps run twice "
          f"(rolled-back blocks) {full.redone.tolist()}, steps through the operator {full.passes.tolist()}",
          flush=True)

    rows = []
    real_build = krylov.build
    best = None  # element-wise max of the bounds over the depths so far: each is certified, so is their max
    for k in depths:
        basis = full.truncated(k)

        def cached(op, b, options=None, **kw):  # bound()'s own build call, answered from the long build
            if tuple(b.shape) != (args.examples * pilots, n):
                raise RuntimeError(f"unexpected pilot shape {tuple(b.shape)}")
            return basis

        algorithm.krylov.build = cached
        try:
            t1 = time.perf_counter()
            res = hcrfast.bound(model, x, sigma, size=zm.size, restarts=args.restarts, iterations=args.iterations,
                                solver="krylov", krylov_pilots=pilots, iterates=args.iterates,
                                lsqr=hcrfast.LSQROptions(iter_lim=k),
                                chunk_size=args.examples, singular_steps=0,   # the bases' Algorithm 1 alone
                                example_ids=ids)
            seconds = time.perf_counter() - t1
        finally:
            algorithm.krylov.build = real_build
        h = res.to_numpy()
        unions = []
        h_std = h.std
        for tau in (args.union_tau if args.union else ()):
            t2 = time.perf_counter()
            solver = UnionSolver(basis, pilots, tau=tau)
            factor_seconds = time.perf_counter() - t2
            real_solve = algorithm.krylov.solve
            algorithm.krylov.build, algorithm.krylov.solve = cached, solver
            try:
                t2 = time.perf_counter()
                ures = hcrfast.bound(model, x, sigma, size=zm.size, restarts=args.restarts,
                                     iterations=args.iterations, solver="krylov", krylov_pilots=pilots,
                                     iterates=args.iterates,
                                     lsqr=hcrfast.LSQROptions(iter_lim=k), chunk_size=args.examples,
                                     singular_steps=0, example_ids=ids).to_numpy()
                union_seconds = time.perf_counter() - t2
            finally:
                algorithm.krylov.build, algorithm.krylov.solve = real_build, real_solve
            info = describe(solver)
            del solver
            both = np.maximum(h.std, ures.std)
            h_std = np.maximum(h_std, ures.std)
            unions.append(dict(info, union_factor_seconds=factor_seconds, union_seconds=union_seconds,
                               union_median=float(np.median(ures.std)), union_p90=float(np.quantile(ures.std, 0.9)),
                               union_median_per_example=np.median(ures.std.reshape(args.examples, -1), axis=1).tolist(),
                               max_of_both_median=float(np.median(both)), max_of_both_p90=float(np.quantile(both, 0.9)),
                               union_beats_pilots_share=float(np.mean(ures.std > h.std))))
            u = unions[-1]
            print(f"           union of the pilots, tau {tau:g}: {u['union_dims']} of {u['union_vectors']} directions "
                  f"kept, rank {u['union_rank']}, factored in {factor_seconds:.1f} s; median {u['union_median']:.5g} "
                  f"p90 {u['union_p90']:.5g} ({union_seconds:.1f} s); max with the pilots' own: median "
                  f"{u['max_of_both_median']:.5g} p90 {u['max_of_both_p90']:.5g}; union higher on "
                  f"{100 * u['union_beats_pilots_share']:.1f}% of the modes", flush=True)
        best = h_std if best is None else np.maximum(best, h_std)
        # per example: its pilots' products together (each basis 2k + 1)
        products = (2 * basis.steps + 1).reshape(args.examples, pilots).sum(axis=1)
        row = dict(depth=k, pilots=pilots, steps=basis.steps.tolist(), rank=basis.rank.tolist(),
                   smallest_ritz_value=[float(s[r - 1]) if r else None for s, r in zip(basis.ritz, basis.rank)],
                   largest_ritz_value=[float(s[0]) if r else None for s, r in zip(basis.ritz, basis.rank)],
                   products_per_example=float(np.mean(products)),
                   seconds_after_build=seconds,
                   seconds_build_estimate=build_seconds * float(np.mean(basis.steps)) / max(1.0, float(np.mean(full.steps))),
                   median=float(np.median(h.std)), p90=float(np.quantile(h.std, 0.9)),
                   median_max_over_depths=float(np.median(best)), p90_max_over_depths=float(np.quantile(best, 0.9)))
        if unions:
            row["pilots_median_per_example"] = np.median(h.std.reshape(args.examples, -1), axis=1).tolist()
            row["union"] = unions
        if reference is not None:
            row["median_vs_reference"] = row["median"] / reference["median"]
            row["p90_vs_reference"] = row["p90"] / reference["p90"]
        rows.append(row)
        print(f"  k {k:>6}: products/ex {row['products_per_example']:7.0f}  median {row['median']:.5g}  "
              f"p90 {row['p90']:.5g}  Ritz values [{row['smallest_ritz_value'][0]:.3g}, {row['largest_ritz_value'][0]:.3g}]"
              + (f"  vs reference median {row['median_vs_reference']:.3f} p90 {row['p90_vs_reference']:.3f}"
                 if reference else "") + f"  ({seconds:.1f} s after the build)"
              + (f"  max over depths so far: median {row['median_max_over_depths']:.5g} "
                 f"p90 {row['p90_max_over_depths']:.5g}" if len(rows) > 1 else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            command="python benchmarks/krylov_depth.py " + " ".join(sys.argv[1:] if argv is None else argv),
            args=vars(args), sigma=sigma, build_seconds=build_seconds, reference=reference,
            build_redone=full.redone.tolist(), build_operator_steps=full.passes.tolist(),
            machine=machine_info(args.device), rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
