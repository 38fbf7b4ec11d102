"""The lean double backward across torchvision's architectures: J v through the lean graph against
torch's own graph, and the time of each.

For each model (random weights, nothing downloaded; eval mode) on a few random inputs, mode "reverse"
of ``TorchJacobian`` records the forward twice, under ``lean_double_backward`` and without it
(``LEAN_DOUBLE_BACKWARD``), and runs the same J v and Jᵀ u through both: the largest difference,
relative to the largest entry, says the lean graph computes torch's products (float32 rounding); the
medians say what it saves. Where torch's own graph cannot run the double backward (fused attention,
hardsigmoid), that is recorded instead of a time, and the lean graph's products are compared with
forward mode's (``torch.func.jvp`` and ``vjp``) instead.

    python benchmarks/lean_zoo.py --size 96 --rows 2 --repeats 5 --threads 1 --json out.json
    python benchmarks/lean_zoo.py --models resnet50 convnext_tiny   # a subset
    python benchmarks/lean_zoo.py --device cuda --rows 8             # on a GPU (CuPy arrays, synced timings)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race import machine_info  # noqa: E402

import hcrfast.bindings.jacobian as jac  # noqa: E402
from hcrfast.bindings import TorchJacobian  # noqa: E402

MODELS = ("resnet50", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf", "densenet121",
          "vit_b_16")


def build(name: str) -> torch.nn.Module:
    """torchvision's ``name`` with random weights (seed 0), its classifier as the features; a ViT at its
    own 224 (its position embeddings fix the size), its zero-initialized head drawn at random."""
    import torchvision.models as tvm

    torch.manual_seed(0)
    model = getattr(tvm, name)()
    if name.startswith("vit"):
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    return model.eval()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)  # a CuPy array on CUDA


def timed(call, arg, repeats: int, device: str) -> tuple[float, np.ndarray]:
    call(arg)  # the recorded graph, outside the timing
    _sync(device)
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call(arg)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), _host(out)


def measure(name: str, size: int, rows: int, repeats: int, device: str = "cpu") -> dict:
    model = build(name).to(device)
    size = 224 if name.startswith("vit") else size
    x = torch.randn(rows, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)
    rng = np.random.default_rng(2)
    row = {"model": name, "input": [rows, 3, size, size], "device": device}
    if device == "cuda":
        import cupy

        from hcrfast.bindings import solver_stream

        to_device, stream = cupy.asarray, solver_stream(x.device)
    else:
        to_device, stream = (lambda a: a), contextlib.nullcontext()
    results, v, u = {}, None, None
    for lean in (True, False):
        jac.LEAN_DOUBLE_BACKWARD = lean
        try:
            with stream:
                op = TorchJacobian(model, x)
                if v is None:
                    v = to_device(rng.standard_normal((rows, op.n_cols)).astype(np.float32))
                    u = to_device(rng.standard_normal((rows, op.n_rows)).astype(np.float32))
                jvp_s, jv = timed(op.matvec, v, repeats, device)
                vjp_s, jtu = timed(op.rmatvec, u, repeats, device)
            results[lean] = dict(jvp_ms=1e3 * jvp_s, vjp_ms=1e3 * vjp_s, jv=jv, jtu=jtu)
        except RuntimeError as exc:
            results[lean] = dict(error=str(exc).splitlines()[0][:200])
        finally:
            jac.LEAN_DOUBLE_BACKWARD = True
    for lean, key in ((True, "lean"), (False, "torch")):
        r = results[lean]
        row[key] = {k: (round(val, 2) if isinstance(val, float) else val) for k, val in r.items()
                    if k not in ("jv", "jtu")}
    if "jv" in results[True] and "jv" not in results[False]:  # torch's graph fails: forward mode is the oracle
        # (attention on the MATH backend, nn.MultiheadAttention's fast path off: neither has forward AD)
        fast = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with sdpa_kernel(SDPBackend.MATH), stream:
                op = TorchJacobian(model, x, mode="forward")
                results[False].update(jv=_host(op.matvec(v)), jtu=_host(op.rmatvec(u)))
        finally:
            torch.backends.mha.set_fastpath_enabled(fast)
        row["oracle"] = "forward mode (torch.func.jvp, vjp; MATH attention)"
    # the features' and J v's scale: random weights leave some of these networks nearly dead (mobilenet_v3_small's
    # largest feature 1.2e-9 at 96x96, efficientnet_b0's 1.1e-14 at 32x32), where a relative difference of 0
    # compares tiny products, and says little of the lean graph
    with torch.no_grad():
        row["max_abs_feature"] = float(model(x).abs().max())
    if "jv" in results[True] and "jv" in results[False]:
        row["max_abs_jv"] = float(np.abs(results[False]["jv"]).max())
        for product in ("jv", "jtu"):
            a, b = results[True][product], results[False][product]
            row[f"{product}_rel_diff"] = float(np.abs(a - b).max() / np.abs(b).max())
    if "jvp_ms" in results[True] and "jvp_ms" in results[False]:
        row["jvp_speedup"] = round(results[False]["jvp_ms"] / results[True]["jvp_ms"], 2)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--size", type=int, default=96, help="input height and width (a ViT takes 224)")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'model':<20} {'JVP lean':>10} {'JVP torch':>10} {'ratio':>6} {'VJP lean':>10} {'VJP torch':>10} "
          f"{'J v diff':>9} {'Jᵀu diff':>9}")
    for name in args.models:
        row = measure(name, args.size, args.rows, args.repeats, args.device)
        rows.append(row)
        lean, torch_ = row["lean"], row["torch"]
        if "error" in torch_:
            print(f"{name:<20} {lean.get('jvp_ms', float('nan')):>10.1f} {'fails':>10} {'':>6} "
                  f"{lean.get('vjp_ms', float('nan')):>10.1f} {'fails':>10} {row.get('jv_rel_diff', np.nan):>9.1e} "
                  f"{row.get('jtu_rel_diff', np.nan):>9.1e}  (against forward mode; torch's graph: "
                  f"{torch_['error'][:60]})"
                  + (f"  (features at most {row['max_abs_feature']:.1e}: nearly dead with random weights)"
                     if row["max_abs_feature"] < 1e-6 else ""))
        else:
            print(f"{name:<20} {lean['jvp_ms']:>10.1f} {torch_['jvp_ms']:>10.1f} {row['jvp_speedup']:>6.2f} "
                  f"{lean['vjp_ms']:>10.1f} {torch_['vjp_ms']:>10.1f} {row['jv_rel_diff']:>9.1e} "
                  f"{row['jtu_rel_diff']:>9.1e}"
                  + (f"  (features at most {row['max_abs_feature']:.1e}: nearly dead with random weights; the "
                     f"diffs compare tiny products)" if row["max_abs_feature"] < 1e-6 else ""), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"machine": machine_info(args.device), "args": settings, "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
