"""What ``bound(targets=...)`` and ``bound(singular_steps=K)`` add to Algorithm 1: bounds and time, in one
process, on one problem.

One ``bound`` call of Algorithm 1 alone (every iterate, ``singular_steps=0``: the defaults before
``singular_steps="auto"``), then one per target set (``--targets low:8,all``, without singular steps),
same seeds and chunks. For each: wall time, the median and 90th percentile of
every mode's bound, ``mse_from_modes``, how many modes the targeted steps lifted, and where the targeted
part's time went (directions, certification, the cross bounds). Each targeted call keeps its steps
(``keep_targeted_eps=True``, which changes no bound) and they are certified HERE, independently of the
engine (a float64 copy of the model, ``D = expm1(‖a(θ+ε) − a(θ)‖²/σ²)``, SciPy's DCT): every mode's bound
must be the max of Algorithm 1's and of every targeted step's on that mode (the run fails otherwise).
``--singular 16,64`` adds a call per count with ``singular_steps=K`` (J's K smallest singular directions,
each certified with both signs; 64 is the default's); those steps are not returned, so this script does not certify them again (tests/test_singular_steps.py
checks them against NumPy's SVD and forward passes of its own); every bound must still be at least Algorithm 1's.

    python benchmarks/targets_gain.py mnist --examples 32 --targets low:8,all --singular 16,64 --threads 1 \
        --json out.json

Random inputs of the model's geometry, its published σ scale and start size, random weights
(``lsqr_budget.py``'s problem); R = 25, i = 10 by default.
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


def independent_max(model64, x, eps, sigma, basis_shape, per: int = 64):
    """Per example and mode, ``max_k |(Q ε_k)_j| / sqrt(D_k)`` from this script's own float64 passes and
    SciPy's DCT; ``eps`` (B, K, ...) float64 as the engine applied them. (B, p)."""
    B, K = eps.shape[:2]
    eps = eps.reshape(B, K, -1)
    p = eps.shape[2]
    best = np.zeros((B, p))
    with torch.no_grad():
        a0 = model64(x.double()).reshape(B, -1)
    for b in range(B):
        for k0 in range(0, K, per):
            e = torch.as_tensor(eps[b, k0:k0 + per]).reshape((-1,) + tuple(basis_shape))
            with torch.no_grad():
                z = model64(x[b:b + 1].double() + e).reshape(len(e), -1) - a0[b]
            d = torch.expm1((z * z).sum(1) / sigma**2).numpy()
            c = np.abs(scipy.fft.dctn(e.numpy(), axes=(-2, -1), norm="ortho").reshape(len(e), p))
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.where(d[:, None] > 0, c / np.sqrt(d)[:, None], np.where(c > 0, np.inf, 0.0))
            best[b] = np.maximum(best[b], v.max(axis=0))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(ap, iterations=10)
    ap.set_defaults(restarts=25)
    ap.add_argument("--targets", default="low:8", help="comma-separated target sets for bound(targets=...)")
    ap.add_argument("--singular", default="", help="comma-separated counts for bound(singular_steps=K)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    zm, model, x, f0, sigma, ids = workload_from_args(args)
    B, R, I = args.examples, args.restarts, args.iterations
    kw = dict(size=zm.size, restarts=R, iterations=I, example_ids=ids, singular_steps=0)  # Algorithm 1 the base
    # one-time costs of the process (compilation, thread pools) out of the timed calls
    hcrfast.bound(model, x[:1], sigma, size=zm.size, restarts=2, iterations=2, targets="low:1")

    base = hcrfast.bound(model, x, sigma, **kw).to_numpy()
    std0 = base.std.reshape(B, -1)
    print(f"{args.model}: {B} examples x R {R} x i {I}, sigma {sigma:.4g}, s {zm.size:g}, solver "
          f"{base.params['solver']}", flush=True)
    rows = [dict(targets=None, seconds=base.seconds, median=float(np.median(std0)),
                 p90=float(np.quantile(std0, 0.9)), median_per_example=np.median(std0, axis=1).tolist(),
                 mse_from_modes_median=float(np.median(base.mse_from_modes)))]
    print(f"  targets None   : {base.seconds:8.2f} s  median {rows[0]['median']:.5g}  p90 {rows[0]['p90']:.5g}  "
          f"mse_from_modes {rows[0]['mse_from_modes_median']:.5g}", flush=True)
    model64 = copy.deepcopy(model).double()
    for spec in [s for s in args.targets.split(",") if s]:
        res = hcrfast.bound(model, x, sigma, targets=spec, keep_targeted_eps=True, **kw).to_numpy()
        std = res.std.reshape(B, -1)
        t = res.targeted
        mine = np.maximum(std0, independent_max(model64, x, t.eps, sigma, x.shape[1:]))
        worst = float(np.max(np.abs(mine - std) / np.maximum(std, 1e-300)))
        if worst > 1e-9 or not np.all(std >= std0):
            raise SystemExit(f"targets_gain: {spec}: the engine's bounds differ from Algorithm 1's max with the "
                             f"targeted steps certified here (relative {worst:.2e})")
        lifted = float(np.mean(std > std0))
        row = dict(targets=spec, n_targets=len(t.modes), seconds=res.seconds, median=float(np.median(std)),
                   p90=float(np.quantile(std, 0.9)), median_per_example=np.median(std, axis=1).tolist(),
                   mse_from_modes_median=float(np.median(res.mse_from_modes)), lifted_fraction=lifted,
                   median_gain_of_modes=float(np.median(std / np.where(std0 > 0, std0, np.inf))),
                   targeted_timings={k: float(v) for k, v in t.timings.items()}, independent_check=worst)
        rows.append(row)
        print(f"  targets {spec:<7}: {res.seconds:8.2f} s ({res.seconds / base.seconds:.2f}x)  median {row['median']:.5g} "
              f"({row['median'] / rows[0]['median']:.2f}x)  p90 {row['p90']:.5g}  mse_from_modes "
              f"{row['mse_from_modes_median']:.5g}; {len(t.modes)} targets lifted {100 * lifted:.1f}% of the modes "
              f"(median gain {row['median_gain_of_modes']:.3f}x); targeted part {t.timings['total']:.2f} s, "
              f"certification {t.timings.get('certify', 0.0):.2f} s; checked here to {worst:.1e}", flush=True)
    for count in [int(c) for c in args.singular.split(",") if c]:
        res = hcrfast.bound(model, x, sigma, **(kw | dict(singular_steps=count))).to_numpy()
        std = res.std.reshape(B, -1)
        if not np.all(std >= std0):
            raise SystemExit(f"targets_gain: singular_steps={count} lowered a bound below Algorithm 1's")
        lifted = float(np.mean(std > std0))
        row = dict(singular_steps=count, seconds=res.seconds, median=float(np.median(std)),
                   p90=float(np.quantile(std, 0.9)), median_per_example=np.median(std, axis=1).tolist(),
                   mse_from_modes_median=float(np.median(res.mse_from_modes)), lifted_fraction=lifted,
                   median_gain_of_modes=float(np.median(std / np.where(std0 > 0, std0, np.inf))),
                   singular_seconds=res.params["singular_steps"]["seconds"], independent_check=None)
        rows.append(row)
        print(f"  singular {count:<6}: {res.seconds:8.2f} s ({res.seconds / base.seconds:.2f}x)  median {row['median']:.5g} "
              f"({row['median'] / rows[0]['median']:.2f}x)  p90 {row['p90']:.5g}  mse_from_modes "
              f"{row['mse_from_modes_median']:.5g}; lifted {100 * lifted:.1f}% of the modes (median gain "
              f"{row['median_gain_of_modes']:.3f}x); the steps {row['singular_seconds']:.2f} s", flush=True)
    if args.json:
        out = dict(script="targets_gain.py", model=args.model, examples=B, first=args.first, restarts=R,
                   iterations=I, sigma=float(sigma), size=zm.size, solver=base.params["solver"],
                   threads=torch.get_num_threads(), machine=machine_info("cpu"), rows=rows,
                   command=" ".join(["python", "benchmarks/targets_gain.py"] + list(sys.argv[1:] if argv is None
                                                                                     else argv)))
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
