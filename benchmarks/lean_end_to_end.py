"""``hcrfast.bound`` end to end with the lean double backward and with torch's own graph, on a torchvision
model's convolutional features (random weights, nothing downloaded): what the cheaper JVPs give a whole run.

    python benchmarks/lean_end_to_end.py efficientnet_b0 --size 96 --examples 1 --threads 1 \\
        --json benchmarks/results/lean_end_to_end_efficientnet_b0_cpu.json

Both runs take the same inputs, σ (``--sigma-scale`` × the RMS of the clean features), seed and solver
(``--solver``, default "krylov": the JVP-heavy matrix-free basis; "auto" may pick the dense solve, which
runs no JVP); the bounds must agree (the same J, to float32 rounding), and the times and the profiled
JVP/VJP seconds are printed side by side.
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

from gpu_targets import ProductTimer  # noqa: E402
from race import machine_info  # noqa: E402

import hcrfast  # noqa: E402
import hcrfast.bindings.jacobian as jac  # noqa: E402


def features(name: str) -> torch.nn.Module:
    """The model's convolutional trunk (``.features``), random weights (seed 0), eval mode."""
    import torchvision.models as tvm

    torch.manual_seed(0)
    return getattr(tvm, name)().features.eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a torchvision model with a .features trunk (efficientnet_b0, "
                                  "mobilenet_v3_small, ...)")
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--examples", type=int, default=1)
    ap.add_argument("--restarts", type=int, default=25)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--sigma-scale", type=float, default=2.0)
    ap.add_argument("--solver", default="krylov")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = features(args.model)
    x = torch.randn(args.examples, 3, args.size, args.size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), args.sigma_scale)
    runs = {}
    for name, lean in (("lean", True), ("torch", False)):
        jac.LEAN_DOUBLE_BACKWARD = lean
        try:
            with ProductTimer(x.device) as timer:
                t0 = time.perf_counter()
                res = hcrfast.bound(model, x, sigma, restarts=args.restarts, iterations=args.iterations,
                                    solver=args.solver)
                wall = time.perf_counter() - t0
        except ValueError as exc:  # torch's graph refuses the double backward (hardsigmoid, fused attention)
            runs[name] = dict(error=str(exc)[:300])
            print(f"{name:>6}: fails: {exc}"[:200], flush=True)
            continue
        finally:
            jac.LEAN_DOUBLE_BACKWARD = True
        inside = timer.totals()
        runs[name] = dict(wall_s=round(wall, 2), jvp_s=round(inside["jvp"], 2), vjp_s=round(inside["vjp"], 2),
                          jvp_rows=timer.rows["jvp"], vjp_rows=timer.rows["vjp"],
                          median_bound=float(np.median(res.std)), p90_bound=float(np.quantile(res.std, 0.9)))
        print(f"{name:>6}: {wall:8.1f} s  (JVP {runs[name]['jvp_s']:.1f} s, VJP {runs[name]['vjp_s']:.1f} s)  "
              f"median bound {runs[name]['median_bound']:.6g}", flush=True)
    ratio = None
    if "error" not in runs["torch"]:
        ratio = runs["torch"]["wall_s"] / runs["lean"]["wall_s"]
        agree = abs(runs["lean"]["median_bound"] / runs["torch"]["median_bound"] - 1)
        print(f"speed-up {ratio:.2f}x; medians differ by {agree:.1e} (relative)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"machine": machine_info("cpu"), "args": settings,
                                         "input": [args.examples, 3, args.size, args.size], "sigma": float(sigma),
                                         "runs": runs, "speedup": ratio and round(ratio, 2)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
