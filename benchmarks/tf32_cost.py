"""What TF32 (or bfloat16) tensor-core products cost the bounds: emulated on a CPU, for real on a GPU.

On an H100 a float32 convolution or matmul runs several times faster with TF32 (``bound(tf32=True)``):
each operand is rounded to 10 mantissa bits and the products are accumulated in float32. The bound stays
certified either way (its forward passes are float64), but the perturbations the solver finds come from
those products, and so does their quality. On a CPU a dispatch mode emulates the rounding: it rounds the
float32 operands of every convolution, convolution backward and matmul to ``--mantissa`` bits (nearest,
ties to even; 10 is TF32, 7 is bfloat16's operands with float32 accumulation) wherever torch's settings
would let a GPU use TF32 (switched on for both, as on the GPU; not inside hcrfast's IEEE blocks, the
Krylov basis' Gram-Schmidt and projections) and runs
``bound(tf32=True)`` under it, beside the same ``bound`` in IEEE float32. On a GPU (``--device cuda``)
the "tf32" rows run with torch's TF32 switched on instead (``--emulate`` keeps the emulation there), and
the product errors are given both ways, which tells how well the emulation stands for the hardware:

    python benchmarks/tf32_cost.py resnet18 --examples 1 --restarts 25 --iterations 10 --threads 1 \
        --mode tf32 --json out_tf32.json
    python benchmarks/tf32_cost.py resnet18 --device cuda --examples 2 --mode both --json out_gpu.json

``--scope products`` rounds in the model's Jacobian products alone (the restart steps' forward passes in
IEEE float32), ``--scope forwards`` everywhere but there: which of the two costs the bound.
``--mode`` ieee / tf32 / both / errors (the product errors alone): one process per mode lets two cores
run both at once; ``--seeds N`` runs each mode at ``bound(seed=0..N-1)``, since the median moves by a
few percent from one draw of the restarts to the next and one pair of runs cannot tell that from the
rounding. Each run reports the relative error of one J v and one Jᵀu against IEEE (random v, u), its
wall time, and the median and 90th percentile bound. Random inputs of the model's geometry, its
published σ scale and start size, random weights (``lsqr_budget.py``'s problem). The emulation's times
say nothing of a GPU's.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lsqr_budget import add_workload_arguments, random_workload  # noqa: E402
from race import machine_info  # noqa: E402

import hcrfast  # noqa: E402
from hcrfast import dense, validation  # noqa: E402
from hcrfast.bindings import TorchJacobian, from_torch, ieee_float32, to_torch  # noqa: E402

aten = torch.ops.aten
CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)
MATMULS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)


def _tf32_allowed(kind: str) -> bool:
    """Whether torch's settings now let a GPU's ``kind`` ("conv" or "matmul") products use TF32: what the
    emulation follows, so that hcrfast's own ``ieee_float32`` blocks (the Krylov basis' Gram-Schmidt and
    projections) stay IEEE under it as they do on the hardware."""
    if kind == "conv":
        knob = torch.backends.cudnn.conv
        return knob.fp32_precision == "tf32" if hasattr(knob, "fp32_precision") else torch.backends.cudnn.allow_tf32
    knob = torch.backends.cuda.matmul
    return knob.fp32_precision == "tf32" if hasattr(knob, "fp32_precision") else knob.allow_tf32


def round_mantissa(t, bits: int):
    """A float32 tensor rounded to ``bits`` explicit mantissa bits (nearest, ties to even); others as they are."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    drop = 23 - bits
    i = t.contiguous().view(torch.int32)
    lsb = (i >> drop) & 1
    rounded = ((i + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)).view(torch.float32).view(t.shape)
    return torch.where(torch.isfinite(t), rounded, t)


class ReducedProducts(TorchDispatchMode):
    """Round the float32 operands of convolutions (forward and backward) and matmuls to ``bits``, where torch's
    settings would let a GPU use TF32 for them; entered, it switches TF32 on for both as
    :func:`hardware_tf32` does (and restores the settings on exit)."""

    def __init__(self, bits: int):
        super().__init__()
        self.bits = bits
        self._settings = None

    def __enter__(self):
        self._settings = hardware_tf32()
        self._settings.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._settings.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (func in CONVOLUTIONS and _tf32_allowed("conv")) or (func in MATMULS and _tf32_allowed("matmul")):
            args = tuple(round_mantissa(a, self.bits) for a in args)
        return func(*args, **(kwargs or {}))


def _ieee_probe(check):
    """``check_independent`` with the emulation set aside, as ``bound(tf32=True)`` sets real TF32 aside for it:
    rounding at 2⁻¹¹ lets one row alone round otherwise than in the batch, which the probe would read as
    examples mixed."""
    def probe(*args, **kwargs):
        with _disable_current_modes():
            return check(*args, **kwargs)
    return probe


@contextlib.contextmanager
def hardware_tf32():
    """torch's TF32 on for float32 matmuls and cuDNN convolutions (torch's defaults have it for convolutions
    only), the previous settings restored afterwards. The ``allow_tf32`` setters move cuDNN's own setting too
    (``ieee_float32``'s docstring); on torch >= 2.9 the conv and matmul ``fp32_precision`` are named "tf32"
    as well. If the hardware's products come out equal to IEEE's, the errors printed say so."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    precise = hasattr(matmul, "fp32_precision")
    saved = (matmul.fp32_precision, cudnn.fp32_precision, cudnn.conv.fp32_precision) if precise else \
        (matmul.allow_tf32, cudnn.allow_tf32)
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = True
        if precise:
            matmul.fp32_precision = cudnn.conv.fp32_precision = "tf32"
        yield
    finally:
        if precise:
            matmul.fp32_precision, cudnn.fp32_precision, cudnn.conv.fp32_precision = saved
        else:
            matmul.allow_tf32, cudnn.allow_tf32 = saved


def reduced(kind: str, bits: int):
    """The context a "tf32" row runs in: the emulation (``"emulated"``) or the hardware's TF32 (``"hardware"``)."""
    return ReducedProducts(bits) if kind == "emulated" else hardware_tf32()


@contextlib.contextmanager
def exact(kind: str):
    """Undo ``reduced(kind, ...)`` inside it: the emulation set aside, IEEE float32."""
    with (_disable_current_modes() if kind == "emulated" else contextlib.nullcontext()), ieee_float32(True):
        yield


# where the model's Jacobian products are taken: the matrix-free solvers' J v and Jᵀu, the dense solve's J
PRODUCTS = ((TorchJacobian, "matvec"), (TorchJacobian, "rmatvec"), (dense, "jacobian"))


@contextlib.contextmanager
def scoped(kind: str, bits: int, scope: str):
    """The context of a "tf32" row's ``bound``: TF32 everywhere (``"all"``, what ``tf32=True`` does on a GPU),
    in the model's Jacobian products alone (``"products"``: the forward passes of Algorithm 1's restart
    steps in IEEE float32), or everywhere but there (``"forwards"``)."""
    if scope == "all":
        with reduced(kind, bits):
            yield
        return
    inner = (lambda: reduced(kind, bits)) if scope == "products" else (lambda: exact(kind))
    outer = exact(kind) if scope == "products" else reduced(kind, bits)
    saved = [getattr(owner, name) for owner, name in PRODUCTS]

    def wrap(f):
        @functools.wraps(f)
        def within(*args, **kwargs):
            with inner():
                return f(*args, **kwargs)
        return within

    try:
        for (owner, name), f in zip(PRODUCTS, saved):
            setattr(owner, name, wrap(f))
        with outer:
            yield
    finally:
        for (owner, name), f in zip(PRODUCTS, saved):
            setattr(owner, name, f)


def product_errors(model, x, bits: int, kinds) -> dict:
    """Relative errors of a forward, one J v and one Jᵀu (random v, u) under each of ``kinds``, against IEEE
    float32: ``{kind: {"forward", "jvp", "vjp"}}``."""
    g = torch.Generator().manual_seed(1)

    def products():
        J = TorchJacobian(model, x)
        with torch.no_grad():
            y = model(x).reshape(x.shape[0], -1)
        return (y, to_torch(J.matvec(from_torch(v))), to_torch(J.rmatvec(from_torch(u))))

    with ieee_float32(True):
        J = TorchJacobian(model, x)
        v = torch.randn(x.shape[0], J.n_cols, generator=g).to(x.device)
        u = torch.randn(x.shape[0], J.n_rows, generator=g).to(x.device)
        exact = products()
    out = {}
    for kind in kinds:
        with reduced(kind, bits):
            got = products()
        out[kind] = {name: float((a.double() - e.double()).norm() / e.double().norm())
                     for name, a, e in zip(("forward", "jvp", "vjp"), got, exact)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(ap, iterations=10)
    ap.add_argument("--mode", default="both", choices=("ieee", "tf32", "both", "errors"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--emulate", action="store_true", help="on a GPU too, emulate the rounding instead of its TF32")
    ap.add_argument("--scope", default="all", choices=("all", "products", "forwards"),
                    help="where the tf32 rows round: everywhere (bound(tf32=True) on a GPU), in the model's Jacobian "
                         "products alone (the restart steps' forward passes in IEEE), or everywhere but there")
    ap.add_argument("--mantissa", type=int, default=10, help="explicit mantissa bits of the emulated operands "
                    "(10: TF32, 7: bfloat16)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="run each mode with bound(seed=0..SEEDS-1): the median's spread over restarts' draws, to "
                         "read the emulation's change against")
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds are FIRST_SEED.. (to split them over processes)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not 1 <= args.mantissa <= 22:
        ap.error(f"--mantissa {args.mantissa}: pass 1..22 (10 for TF32, 7 for bfloat16)")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here; run on a GPU machine or pass --device cpu")
    kind = "hardware" if args.device == "cuda" and not args.emulate else "emulated"
    if kind == "hardware" and args.mantissa != 10:
        ap.error(f"--mantissa {args.mantissa} on a GPU: its TF32 keeps 10 bits; add --emulate to emulate others")
    if args.threads:
        torch.set_num_threads(args.threads)
    zm, model, x, _, sigma = random_workload(args.model, args.examples, args.device, args.first)
    ids = np.arange(args.first, args.first + args.examples)
    kw = dict(size=zm.size, restarts=args.restarts, iterations=args.iterations, example_ids=ids)
    kinds = ("emulated", "hardware") if args.device == "cuda" else ("emulated",)
    errors = product_errors(model, x[:2], args.mantissa, kinds)
    for k, e in errors.items():
        print(f"{args.model} on {args.device}, {k} {args.mantissa}-bit operands: relative error against IEEE float32: "
              f"forward {e['forward']:.2e}, J v {e['jvp']:.2e}, Jᵀu {e['vjp']:.2e}", flush=True)
    rows, summary = [], {}

    def write(complete: bool):   # after every row too: a run killed at its cap keeps the rows it finished
        if args.json:
            out = dict(command=" ".join(sys.argv), args=vars(args), sigma=sigma, errors=errors, rows=rows,
                       summary=summary, complete=complete, machine=machine_info(args.device),
                       when=time.strftime("%Y-%m-%dT%H:%M:%S"))
            Path(args.json).write_text(json.dumps(out, indent=1))

    write(False)
    if args.mode != "errors":
        hcrfast.bound(model, x[:1], sigma, size=zm.size, restarts=2, iterations=2)  # one-time costs out of the timing
    for seed in range(args.first_seed, args.first_seed + args.seeds) if args.mode != "errors" else ():
        for mode in (("ieee", "tf32") if args.mode == "both" else (args.mode,)):
            if mode == "tf32":
                real_check = validation.check_independent
                validation.check_independent = _ieee_probe(real_check)
                try:
                    with scoped(kind, args.mantissa, args.scope):
                        res = hcrfast.bound(model, x, sigma, tf32=True, seed=seed, **kw).to_numpy()
                finally:
                    validation.check_independent = real_check
            else:
                res = hcrfast.bound(model, x, sigma, seed=seed, **kw).to_numpy()
            row = dict(mode=mode, kind=kind if mode == "tf32" else "ieee", scope=args.scope if mode == "tf32" else None,
                       seed=seed,
                       mantissa=args.mantissa if mode == "tf32" else 23, seconds=res.seconds,
                       solver=res.params["solver"], median=float(np.median(res.std)),
                       p90=float(np.quantile(res.std, 0.9)), infinite=int(np.isinf(res.std).sum()))
            rows.append(row)
            write(False)
            print(f"  seed {seed} {mode}{f' ({kind}, {args.scope})' if mode == 'tf32' else ''}: {res.seconds:.1f} s, "
                  f"solver {row['solver']}, median {row['median']:.5g}, p90 {row['p90']:.5g}", flush=True)
    for mode in sorted({r["mode"] for r in rows}):
        medians = np.array([r["median"] for r in rows if r["mode"] == mode])
        summary[mode] = dict(mean_median=float(medians.mean()), min_median=float(medians.min()),
                             max_median=float(medians.max()))
        print(f"{mode}: median bound over {len(medians)} seed(s): mean {medians.mean():.5g}, "
              f"range {medians.min():.5g}..{medians.max():.5g}", flush=True)
    if len(summary) == 2:
        ratios = [t["median"] / i["median"] for i, t in zip(rows[0::2], rows[1::2])]
        seconds = [t["seconds"] / i["seconds"] for i, t in zip(rows[0::2], rows[1::2])]
        summary["tf32_over_ieee"] = dict(per_seed=ratios, mean=float(np.mean(ratios)), seconds=seconds)
        print(f"tf32 / ieee, seed by seed: medians {', '.join(f'{r:.4f}' for r in ratios)} (mean {np.mean(ratios):.4f}); "
              f"times {', '.join(f'{r:.3f}' for r in seconds)}", flush=True)
    write(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
