"""How large are a result file and its checkpoint where every restart bounds nothing?

A tanh MLP 64 -> 32 -> 16 on N random 8x8 inputs (R = 25, i = 2, the defaults otherwise) at sigma = 0.1
and at sigma = 1e-14 (too small: every restart gets a zero-step reason, one sentence each). For each:
the reasons, the bytes of bounds.npz and of the checkpoint's chunk files, the bytes of their numbers
alone, and of bounds.npz as plain ``np.savez`` would write the same members (text stored, not deflated).

Usage::

    python benchmarks/result_file_size.py [--examples 1000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

import hcrfast


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 16)).eval()
    x = torch.rand(args.examples, 1, 8, 8)
    rows = []
    print(f"{'sigma':>7} {'reasons':>8} {'bounds.npz MB':>14} {'numbers MB':>11} {'as np.savez MB':>15} "
          f"{'chunks MB':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for sigma in (0.1, 1e-14):
            folder = Path(tmp) / f"ck{sigma:g}"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = hcrfast.bound(model, x, sigma, restarts=25, iterations=2, checkpoint=folder)
            path = Path(tmp) / f"b{sigma:g}.npz"
            res.save(path)
            with zipfile.ZipFile(path) as z:
                numbers = sum(i.file_size for i in z.infolist() if i.filename != "meta.npy")
            with np.load(path) as z:
                np.savez(Path(tmp) / "plain.npz", **{k: z[k] for k in z.files})
            row = dict(sigma=sigma, reasons=len(res.params.get("zero_step_reasons", [])),
                       bounds_npz=path.stat().st_size, numbers=numbers,
                       as_np_savez=(Path(tmp) / "plain.npz").stat().st_size,
                       chunks=sum(f.stat().st_size for f in folder.glob("chunk_*.npz")))
            rows.append(row)
            print(f"{sigma:>7g} {row['reasons']:>8} {row['bounds_npz'] / 1e6:>14.2f} {numbers / 1e6:>11.2f} "
                  f"{row['as_np_savez'] / 1e6:>15.2f} {row['chunks'] / 1e6:>10.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(rows=rows, examples=args.examples), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
