"""What keep_targeted_eps costs: bound(targets="low:8") on the digits model (random weights, the 500 test
    digits), checkpointed in chunks of 64, with the targeted steps dropped (the default) and kept: checkpoint
    size, the steps held by the result, wall time, and the median bound (the same either way).

    OMP_NUM_THREADS=1 python benchmarks/keep_targeted_eps.py
"""
import sys, tempfile, time
from pathlib import Path

if len(sys.argv) > 1:   # it takes no arguments: --help ran the whole workload
    print(__doc__)
    raise SystemExit(0 if sys.argv[1] in ("-h", "--help") else 2)
import numpy as np, torch, hcrfast
from hcrfast import data, zoo
torch.set_num_threads(1)
zm = zoo.build("digits", seed=0)
model = zm.features.eval()
x, _ = data.load("digits", split="test")
x = zm.normalize(x).double()
with torch.no_grad():
    sigma = hcrfast.rms_sigma(model.double()(x), 1.0)
hcrfast.bound(model, x[:2], sigma, targets="low:8")  # the process's one-time costs, before any timing
for keep in (False, True):
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, targets="low:8", keep_targeted_eps=keep, checkpoint=d, chunk_size=64)
        wall = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in Path(d).glob("*.npz"))
        eps = 0 if res.targeted.eps is None else res.targeted.eps.nbytes
        print(f"keep_targeted_eps={keep}: {x.shape[0]} examples, {wall:.2f} s, checkpoint {size/2**20:.2f} MiB, "
              f"targeted.eps {eps/2**20:.2f} MiB, median bound {np.median(res.std):.6g}")
