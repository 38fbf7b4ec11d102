"""The Krylov basis' Gram–Schmidt pass (hcrfast.krylov's ``orthogonalize``), written several ways, timed.

One pass takes a vector ``t`` per example (m, n) off the ``k`` kept vectors ``Q`` (m, k, n):
``t -= (t Qᵀ) Q``. It reads Q twice (2·m·k·n values), so its floor is memory bandwidth; the
effective GB/s below says how far each form is from it. Forms:

* ``bmm-view``: what krylov.py runs, ``Q = U[:, :k]``, a view into the capacity buffer (m, cap+1, n);
* ``bmm-contig``: the same products on a contiguous Q;
* ``bmm-qt``: the coefficients as ``Q tᵀ`` (m, k, 1) instead of ``t Qᵀ`` (m, 1, k);
* ``baddbmm``: the subtraction fused into the second product (``torch.baddbmm(t, c, Q, alpha=-1)``);
* ``vecdot``: ``torch.linalg.vecdot`` and a broadcast sum (elementwise, an (m, k, n) temporary).

Each form's result is checked against float64 before it is timed.

    python benchmarks/gs_variants.py --device cuda --examples 1250 --dim 784 --steps 128 384
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race import machine_info  # noqa: E402


def forms():
    def bmm_view(t, Q):
        return t - torch.bmm(torch.bmm(t, Q.transpose(1, 2)), Q)

    def bmm_qt(t, Q):
        c = torch.bmm(Q, t.transpose(1, 2))                 # (m, k, 1)
        return t - torch.bmm(c.transpose(1, 2), Q)

    def baddbmm(t, Q):
        return torch.baddbmm(t, torch.bmm(t, Q.transpose(1, 2)), Q, alpha=-1)

    def vecdot(t, Q):
        c = torch.linalg.vecdot(Q, t)                         # (m, k)
        return t - (c[..., None] * Q).sum(1, keepdim=True)

    return {"bmm-view": (bmm_view, False), "bmm-contig": (bmm_view, True), "bmm-qt": (bmm_qt, False),
            "baddbmm": (baddbmm, False), "vecdot": (vecdot, False)}


def time_form(fn, t, Q, reps: int, device: torch.device) -> float:
    fn(t, Q)
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn(t, Q)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(t, Q)
    return (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--examples", type=int, default=1250)
    ap.add_argument("--dim", type=int, default=784)
    ap.add_argument("--steps", type=int, nargs="+", default=[128, 384])
    ap.add_argument("--capacity", type=int, default=512, help="rows of the buffer Q is a view of (bmm-view)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None, help="a JSON file for the table")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gs_variants: no CUDA device; skipped")
        return 0
    if device.type == "cuda":  # krylov.py runs its Gram-Schmidt in IEEE float32
        torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device=device).manual_seed(0)
    m, n = args.examples, args.dim
    rows = []
    for k in args.steps:
        if k > args.capacity:
            raise SystemExit(f"--steps {k} exceeds --capacity {args.capacity}")
        buf = torch.randn((m, args.capacity + 1, n), generator=g, device=device, dtype=dtype)
        buf /= n ** 0.5  # rows of norm ~1 (the timing does not need them orthonormal)
        Q = buf[:, :k]
        t = torch.randn((m, 1, n), generator=g, device=device, dtype=dtype)
        want = t.double() - (t.double() @ Q.double().transpose(1, 2)) @ Q.double()
        for name, (fn, contig) in forms().items():
            q = buf[:, :k].contiguous() if contig else buf[:, :k]
            got = fn(t, q)
            err = float((got.double() - want).abs().max() / want.abs().max())
            seconds = time_form(fn, t, q, args.reps, device)
            gbs = 2 * m * k * n * buf.element_size() / seconds / 1e9
            rows.append(dict(form=name, steps=k, examples=m, dim=n, dtype=args.dtype, seconds=seconds, gb_per_s=gbs,
                             rel_error=err))
            print(f"  k={k:4d} {name:<11} {seconds * 1e3:8.3f} ms  {gbs:7.1f} GB/s  rel.err {err:.1e}", flush=True)
            del q
        del buf, Q, want
    if args.out:
        # race.machine_info: the versions (hcrfast's and its git commit among them), the CPU, and on CUDA the GPU
        info = machine_info("cuda" if device.type == "cuda" else "cpu")
        info["device"] = info.get("gpu", "cpu")
        Path(args.out).write_text(json.dumps(dict(machine=info, rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
