"""Wall time of targeted_bound, method dense vs lsqr, MLP geometry Flatten→Linear(p,p)→ReLU→Linear(p,p)→ReLU.

Usage: ``THREADS=1 python benchmarks/crossover_dense.py 8 16 28`` (image sides: p = 64, 256, 784);
2 examples, targets "low:8". Prints one line per size.
"""
import sys, time, warnings
import numpy as np, torch
warnings.simplefilter("ignore", FutureWarning)
import hcrfast
from hcrfast.targeted import targeted_bound

def mlp(side, seed=0):
    p = side * side
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(p, p), torch.nn.ReLU(),
                               torch.nn.Linear(p, p), torch.nn.ReLU()).eval()

if {"-h", "--help"} & set(sys.argv[1:]) or any(not a.isdigit() for a in sys.argv[1:]):
    print(__doc__)   # (it read "--help" as an image side: a ValueError)
    raise SystemExit(0 if {"-h", "--help"} & set(sys.argv[1:]) else 2)
torch.set_num_threads(int(__import__("os").environ.get("THREADS", "1")))
warm = mlp(4)
targeted_bound(warm, torch.randn(1, 1, 4, 4), 1.0, method="dense", targets="low:2")
targeted_bound(warm, torch.randn(1, 1, 4, 4), 1.0, method="lsqr", targets="low:2")
torch.manual_seed(1)
for side in [int(s) for s in sys.argv[1:]]:
    model = mlp(side)
    x = torch.randn(2, 1, side, side, generator=torch.Generator().manual_seed(2))
    sigma = hcrfast.rms_sigma(model(x).detach(), 1.0)
    out = {}
    for method in ("dense", "lsqr"):
        t = time.perf_counter()
        r = targeted_bound(model, x, sigma, targets="low:8", method=method)
        out[method] = (time.perf_counter() - t, r)
    d, l = out["dense"][1], out["lsqr"][1]
    both = d.std[:, d.targeted]; lb = l.std[:, l.targeted]
    print(f"p={side*side:4d} dense {out['dense'][0]:6.2f} s  lsqr {out['lsqr'][0]:6.2f} s  "
          f"null_dim {d.null_dim.tolist()}  lsqr itn max {l.lsqr_iterations.max(axis=(0,1)).tolist()} "
          f"istop {np.unique(l.lsqr_istop).tolist()}  dense timings { {k: round(v,2) for k,v in d.timings.items()} }  "
          f"inf(dense) {int(d.infinite.sum())}/{both.size}  median dense/lsqr {np.median(both[np.isfinite(both)]/lb[np.isfinite(both)]):.3g}", flush=True)
