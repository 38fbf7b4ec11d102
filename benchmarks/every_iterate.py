"""What every iterate of Algorithm 1 bounds: ``bound(iterates="all")`` against each iterate ε(j) alone.

One ``bound`` call with ``iterates="all"`` (the default) records every step ε(j) its solver returns
(the dense solve's and the Krylov basis' solves, hooked). Each ε(j) is then certified HERE, independently
of the engine (float64 copy of the model, ``D = expm1(‖a(θ+ε) − a(θ)‖²/σ²)``, the DCT by SciPy), giving
the bounds of each iterate alone; their element-wise max must equal the engine's bounds (checked, the
run fails otherwise), and the last iterate's alone are what ``iterates="last"`` (the paper) reports.

    python benchmarks/every_iterate.py resnet18 --examples 1 --restarts 25 --iterations 10 --threads 1 \\
        --json out.json [--time-last] [--time-unscreened] [--repeat N]

``--time-last`` also times ``bound(iterates="last")`` on the same problem (a second call, as long as
the first): the cost of certifying every iterate. ``--time-unscreened`` times ``iterates="all"`` once more
with its screen off (every earlier step certified, ``algorithm._SCREEN_MARGIN = inf``) and checks that it
gives the same bounds: what the screen saves. Random inputs of the model's geometry, its published
σ scale and start size, random weights (``lsqr_budget.py``'s problem).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import scipy.fft
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lsqr_budget import add_workload_arguments, workload_from_args  # noqa: E402
from race import machine_info  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import algorithm, dense  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(ap, iterations=10)
    ap.add_argument("--solver", default="auto", choices=("auto", "dense", "krylov"),
                    help="bound(solver=...); the hooks record the dense and Krylov solves only")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--time-last", action="store_true", help="also time bound(iterates='last') (a second call)")
    ap.add_argument("--time-unscreened", action="store_true",
                    help="also time bound(iterates='all') certifying every earlier step (the screen off: a third call)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time the calls (iterates='all', and those --time-last / --time-unscreened add) this many "
                         "times more, in turn, and report the medians: for calls of a second or so")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    zm, model, x, f0, sigma, ids = workload_from_args(args)
    B, R, I = args.examples, args.restarts, args.iterations

    recorded = []
    real_krylov, real_dense = algorithm.krylov.solve, dense.MinNormSolver.solve

    def krylov_solve(*a, **k):
        out = real_krylov(*a, **k)
        recorded.append(np.array(out, dtype=np.float64))
        return out

    def dense_solve(self, *a, **k):
        out = real_dense(self, *a, **k)
        recorded.append(out.detach().to(torch.float64).reshape(-1, out.shape[-1]).numpy().copy())
        return out

    kw = dict(size=zm.size, restarts=R, iterations=I, solver=args.solver, example_ids=ids,
              singular_steps=0)   # Algorithm 1's iterates alone: what the script certifies again
    # one-time costs of the process (compilation, thread pools) out of the timed calls
    hcrfast.bound(model, x[:1], sigma, size=zm.size, restarts=2, iterations=2, solver=args.solver)
    algorithm.krylov.solve, dense.MinNormSolver.solve = krylov_solve, dense_solve
    try:
        res = hcrfast.bound(model, x, sigma, **kw).to_numpy()
    finally:
        algorithm.krylov.solve, dense.MinNormSolver.solve = real_krylov, real_dense
    solver = res.params["solver"]
    if solver not in ("dense", "krylov") or len(recorded) % I:
        raise SystemExit(f"every_iterate: solver {solver!r} recorded {len(recorded)} solves; pass --solver dense or krylov")
    chunks = len(recorded) // I
    steps = [np.concatenate([recorded[c * I + j] for c in range(chunks)]) for j in range(I)]  # per iterate
    screened = res.params["earlier_iterates"]
    print(f"{args.model}: {B} examples x R {R} x i {I}, sigma {sigma:.4g}, s {zm.size:g}, solver {solver}; "
          f"bound(iterates='all') {res.seconds:.1f} s, certifying {screened['certified']} of the "
          f"{screened['steps']} earlier steps", flush=True)

    model64 = copy.deepcopy(model).double()
    rows = x.double().repeat_interleave(R, 0)
    with torch.no_grad():
        a0 = model64(rows).reshape(rows.shape[0], -1)
    per_iterate, best = [], None
    for j, eps in enumerate(steps, 1):
        e = torch.as_tensor(eps.astype(np.float32 if x.dtype == torch.float32 else np.float64).astype(np.float64))
        applied = (rows + e.reshape(rows.shape)) - rows          # the step as added to the inputs
        with torch.no_grad():
            z = model64(rows + applied).reshape(rows.shape[0], -1) - a0
        d = torch.expm1((z * z).sum(1) / sigma**2).numpy().reshape(B, R)
        coords = np.abs(scipy.fft.dctn(applied.numpy(), axes=(-2, -1), norm="ortho").reshape(B, R, -1))
        std = (coords / np.sqrt(d)[..., None]).max(axis=1)
        best = std if best is None else np.maximum(best, std)
        last_std = std
        per_iterate.append(dict(iterate=j, median=float(np.median(std)), p90=float(np.quantile(std, 0.9)),
                                median_max_so_far=float(np.median(best))))
        print(f"  iterate {j:>2} alone: median {np.median(std):.5g}  p90 {np.quantile(std, 0.9):.5g}; "
              f"max over iterates 1..{j}: median {np.median(best):.5g}", flush=True)
    engine = res.std.reshape(B, -1)
    worst = float(np.max(np.abs(best - engine) / np.maximum(engine, 1e-300)))
    if worst > 1e-9:
        raise SystemExit(f"every_iterate: the engine's bounds differ from the max of the iterates certified here "
                         f"(relative {worst:.2e})")
    last = per_iterate[-1]
    print(f"bound(iterates='all'): median {np.median(engine):.5g} p90 {np.quantile(engine, 0.9):.5g}; the last iterate "
          f"alone (iterates='last'): median {last['median']:.5g} p90 {last['p90']:.5g}: "
          f"{100 * (np.median(engine) / last['median'] - 1):+.1f}% / {100 * (np.quantile(engine, 0.9) / last['p90'] - 1):+.1f}%"
          f"; engine vs the max here: {worst:.1e}", flush=True)
    timing = dict(all_seconds=res.seconds)
    if args.time_last:
        only = hcrfast.bound(model, x, sigma, iterates="last", **kw).to_numpy()
        gap = float(np.max(np.abs(only.std.reshape(B, -1) - last_std) / np.maximum(last_std, 1e-300)))
        timing.update(last_seconds=only.seconds, last_median=float(np.median(only.std)), last_vs_here=gap)
        if gap > 1e-9:
            raise SystemExit(f"every_iterate: bound(iterates='last') differs from the last iterate certified here "
                             f"(relative {gap:.2e})")
        print(f"bound(iterates='last'): {only.seconds:.1f} s (iterates='all' took {res.seconds:.1f} s: "
              f"{100 * (res.seconds / only.seconds - 1):+.1f}%), median {np.median(only.std):.5g} (the last iterate "
              f"certified here: {gap:.1e} apart)", flush=True)
    if args.time_unscreened:
        real_margin = algorithm._SCREEN_MARGIN
        algorithm._SCREEN_MARGIN = float("inf")
        try:
            every = hcrfast.bound(model, x, sigma, **kw).to_numpy()
        finally:
            algorithm._SCREEN_MARGIN = real_margin
        gap = float(np.max(np.abs(every.std.reshape(B, -1) - engine) / np.maximum(engine, 1e-300)))
        timing.update(unscreened_seconds=every.seconds, unscreened_vs_screened=gap)
        if gap > 1e-9:
            raise SystemExit(f"every_iterate: certifying every earlier step gives other bounds than the screened call "
                             f"(relative {gap:.2e})")
        print(f"bound(iterates='all') certifying all {every.params['earlier_iterates']['steps']} earlier steps: "
              f"{every.seconds:.1f} s against {res.seconds:.1f} s screened; the same bounds to {gap:.1e}", flush=True)
    if args.repeat > 1:   # short calls: their times, the three variants in turn, medians
        variants = {"all": {}}
        if args.time_last:
            variants["last"] = dict(iterates="last")
        if args.time_unscreened:
            variants["unscreened"] = {}
        times = {name: [] for name in variants}
        real_margin = algorithm._SCREEN_MARGIN
        for _ in range(args.repeat):
            for name, extra in variants.items():
                algorithm._SCREEN_MARGIN = float("inf") if name == "unscreened" else real_margin
                try:
                    times[name].append(hcrfast.bound(model, x, sigma, **kw, **extra).seconds)
                finally:
                    algorithm._SCREEN_MARGIN = real_margin
        timing["repeats"] = times
        timing["repeat_medians"] = {name: float(np.median(t)) for name, t in times.items()}
        print("repeated " + str(args.repeat) + "x in turn, median s: "
              + ", ".join(f"{name} {np.median(t):.3f}" for name, t in times.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            command="python benchmarks/every_iterate.py " + " ".join(sys.argv[1:] if argv is None else argv),
            args=vars(args), sigma=sigma, solver=solver, params_krylov=res.params.get("krylov"),
            earlier_iterates={k: v for k, v in screened.items() if k != "note"},
            median_all=float(np.median(engine)), p90_all=float(np.quantile(engine, 0.9)),
            median_last=last["median"], p90_last=last["p90"], engine_vs_here=worst, per_iterate=per_iterate,
            timing=timing, machine=machine_info("cpu")), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
