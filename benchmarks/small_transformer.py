"""A small vision transformer on MNIST-sized inputs, bounded by each solver: what the default costs.

A 2-layer ``nn.TransformerEncoder`` (width 64, 4 heads, random weights, eval mode) over the 16 patches of
7×7 of a 28×28 input: 784 inputs, 1,024 features. More features than inputs, so the dense solve (what
``solver="auto"`` takes on the CPU here) builds J in forward mode: 784 JVPs per example, through
attention on the MATH backend (torch's fused kernels have no forward AD; before 2026-11-29 the default
failed on this model). The script times the dense J in both modes, then ``bound`` with each solver at
the published settings (R = 25, i = 10, s = 1/200, σ = 1 × RMS of the features), and prints the medians.

    python benchmarks/small_transformer.py --examples 8 --threads 1 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race import machine_info  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import dense  # noqa: E402


class SmallViT(torch.nn.Module):
    """7×7 patches of a 1×28×28 input embedded to ``width``, then ``layers`` encoder layers: (B, 16, width)."""

    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Conv2d(1, width, 7, stride=7)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(self.embed(x).flatten(2).transpose(1, 2))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--solvers", nargs="+", default=["dense", "krylov", "lsqr"],
                    choices=["dense", "krylov", "lsqr"])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")

    model = SmallViT().eval()
    x = torch.rand(args.examples, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), 1.0)
    out = {"machine": machine_info("cpu"), "args": vars(args) | {"json": str(args.json)}, "sigma": float(sigma),
           "jacobian_seconds": {}, "bound": {}}
    for mode in ("forward", "reverse"):
        dense.jacobian(model, x[:1], mode=mode)  # first calls (torch's decompositions, allocations) outside
        t0 = time.perf_counter()
        dense.jacobian(model, x, mode=mode)
        out["jacobian_seconds"][mode] = time.perf_counter() - t0
        print(f"dense J of {args.examples} examples in {mode} mode: {out['jacobian_seconds'][mode]:.2f} s", flush=True)
    for solver in args.solvers:
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, solver=solver)
        row = dict(seconds=time.perf_counter() - t0, median=float(np.median(res.std)),
                   p90=float(np.quantile(res.std, 0.9)), solver=res.params["solver"])
        out["bound"][solver] = row
        print(f"bound, solver={solver}: {row['seconds']:.1f} s, median {row['median']:.5f}, p90 {row['p90']:.5f}",
              flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
