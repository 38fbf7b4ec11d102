"""What the CPU's memory budgets for activations save: the forward passes in pieces
(``hcrfast.algorithm.FORWARD_PIECE_BYTES``) and the LSQR and Krylov chunks held to their product graphs
(``GRAPH_BYTES``). Peak memory and time of ``hcrfast.bound`` on a small CNN whose activations dwarf its inputs and
features, with the budgets and without them (as before 2026-12-02), each in a fresh process (its peak RSS its own).

    python benchmarks/forward_pieces.py --examples 32 --channels 32 --threads 1 \
        --json benchmarks/results/forward_pieces_cnn_cpu_20261202.json
    python benchmarks/forward_pieces.py --examples 256 --channels 32 --threads 1 --solver lsqr --iterations 1 \
        --lsqr-iter-lim 5 --json benchmarks/results/graph_budget_cnn_lsqr_cpu_20261202.json
    python benchmarks/forward_pieces.py --examples 24 --features 512 --channels 32 --threads 1 --solver dense \
        --restarts 2 --iterations 1 --json benchmarks/results/dense_jacobian_cnn512_cpu_20261202.json

The model: three 3 × 3 convolutions of ``--channels`` channels with ReLU on 28 × 28 inputs, average-pooled to a
Linear of ``--features`` features (10; random weights, seed 0); σ = the features' RMS. Peak RSS is read from
``/proc/self/status`` (VmHWM), in MiB, over the process's RSS just before the call.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _vm(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def cnn(c: int, features: int = 10):
    """Three 3 × 3 convolutions of ``c`` channels with ReLU on 1-channel inputs, average-pooled to a Linear of
    ``features`` features, in eval mode (random weights from torch's current seed)."""
    import torch

    return torch.nn.Sequential(torch.nn.Conv2d(1, c, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(c, features)).eval()


def one(examples: int, channels: int, pieces: bool, threads: int, restarts: int, iterations: int,
        solver: str = "auto", lsqr_iter_lim: int | None = None, piece_bytes: int | None = None,
        graph_bytes: int | None = None, features: int = 10) -> dict:
    """One call in this process: its peak memory over the RSS before it, and its time."""
    import numpy as np
    import torch

    import hcrfast
    from hcrfast import algorithm

    torch.set_num_threads(threads)
    if not pieces:
        algorithm.FORWARD_PIECE_BYTES = algorithm.GRAPH_BYTES = algorithm.FIRST_PIECE_ROWS = 2**62
    else:   # (hcrfast's own budgets unless given: a toy run sets them small to make them bind)
        algorithm.FORWARD_PIECE_BYTES = piece_bytes or algorithm.FORWARD_PIECE_BYTES
        algorithm.GRAPH_BYTES = graph_bytes or algorithm.GRAPH_BYTES
    torch.manual_seed(0)
    model = cnn(channels, features)
    x = torch.rand(examples, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), 1.0)
    base = _vm("VmRSS")
    t0 = time.perf_counter()
    extra = {} if lsqr_iter_lim is None else dict(lsqr=hcrfast.LSQROptions(iter_lim=lsqr_iter_lim))
    res = hcrfast.bound(model, x, sigma, restarts=restarts, iterations=iterations, solver=solver, **extra)
    seconds = time.perf_counter() - t0
    return dict(pieces=pieces, peak_mib_over_base=round(_vm("VmHWM") - base, 1), seconds=round(seconds, 3),
                median_bound=float(np.median(res.std)),
                chunk_size=res.params["run"].get("chunk_size"), solver=res.params["solver"],
                piece_bytes=algorithm.FORWARD_PIECE_BYTES, graph_bytes=algorithm.GRAPH_BYTES)


def both_ways(script: str, args: list, what) -> list | None:
    """Run ``script --one whole`` and then ``--one pieces`` with ``args``, each in a fresh process (its peak RSS its
    own); print a line for each (``what(row)``: its result) and the ratios. The two rows, or None where one failed."""
    rows = []
    for kind in ("whole", "pieces"):
        done = subprocess.run([sys.executable, script, "--one", kind, *args], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"the {kind} run failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            return None
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{kind:6s}: peak {r['peak_mib_over_base']:8.1f} MiB over the process's RSS before the call, "
              f"{r['seconds']:7.2f} s, {what(r)}")
    whole, pieces = rows
    print(f"pieces: {whole['peak_mib_over_base'] / max(pieces['peak_mib_over_base'], 1e-9):.2f}x less memory, "
          f"{whole['seconds'] / pieces['seconds']:.2f}x the speed")
    return rows


def child_row(script: str, args: list, label: str) -> dict | None:
    """``script --one ARGS`` in a fresh process (its peak RSS and imports its own): the JSON row its last line
    prints, or None where it failed (its error printed, named ``label``)."""
    done = subprocess.run([sys.executable, script, "--one", *args], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"the {label} run failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_json(path: Path, script: str, argv, rows: list, **fields) -> None:
    """The two rows, the command that ran, ``fields`` and the machine, as JSON at ``path``."""
    import platform

    import torch

    out = dict(command=f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:]),
               **fields, rows=rows,
               machine=dict(python=platform.python_version(), torch=torch.__version__,
                            processor=platform.processor() or platform.machine(), cores=os.cpu_count()),
               date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--restarts", type=int, default=25)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--features", type=int, default=10, help="the CNN's output features")
    ap.add_argument("--solver", default="auto", choices=["auto", "dense", "lsqr", "krylov"])
    ap.add_argument("--lsqr-iter-lim", type=int, help="LSQR's step cap (default: hcrfast's)")
    ap.add_argument("--piece-bytes", type=int, help="the budgets' row: FORWARD_PIECE_BYTES (default: hcrfast's)")
    ap.add_argument("--graph-bytes", type=int, help="the budgets' row: GRAPH_BYTES (default: hcrfast's)")
    ap.add_argument("--json", type=Path, help="where to write the two rows and the machine (default: print only)")
    ap.add_argument("--one", choices=["pieces", "whole"], help=argparse.SUPPRESS)   # (the child process's row)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.examples, args.channels, args.one == "pieces", args.threads, args.restarts,
                             args.iterations, args.solver, args.lsqr_iter_lim, args.piece_bytes, args.graph_bytes,
                             args.features)))
        return 0
    if not os.path.exists("/proc/self/status"):
        print("forward_pieces.py reads peak memory from /proc/self/status: Linux only", file=sys.stderr)
        return 2
    cmd = ["--examples", str(args.examples), "--channels", str(args.channels), "--restarts", str(args.restarts),
           "--iterations", str(args.iterations), "--threads", str(args.threads), "--solver", args.solver,
           "--features", str(args.features)]
    for flag, value in (("--lsqr-iter-lim", args.lsqr_iter_lim), ("--piece-bytes", args.piece_bytes),
                        ("--graph-bytes", args.graph_bytes)):
        if value is not None:
            cmd += [flag, str(value)]
    rows = both_ways(__file__, cmd, lambda r: f"median bound {r['median_bound']:.6g} (chunk {r['chunk_size']}, "
                                              f"{r['solver']})")
    if rows is None:
        return 1
    if args.json:
        write_json(args.json, "forward_pieces.py", argv, rows, examples=args.examples, channels=args.channels,
                   features=args.features,
                   restarts=args.restarts, solver=args.solver, lsqr_iter_lim=args.lsqr_iter_lim,
                   iterations=args.iterations, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
