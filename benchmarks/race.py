"""Side-by-side race: the published scripts' method (``reference_method.py``) vs ``hcrfast.bound``.

Both run in one process on the same problem: the same model, inputs, σ, s, i, R
and start vectors (``hcrfast.start_vectors``). The table reports wall time,
Jacobian products (JVP + VJP) per example, and the median and 90th percentile
of the per-mode bounds; then the cheapest hcrfast LSQR setting whose median
bound reaches the reference's median, so that a faster but looser run cannot
pass as a win.

    python benchmarks/race.py --model mlp --examples 32 --restarts 25 --iterations 10 \
        --size 0.005 --out benchmarks/results/

Models: ``mlp`` is the MNIST geometry (Flatten → Linear(784,784) → ReLU →
Linear(784,784) → ReLU, ``hcrfast.zoo.build("mnist", seed=...)``, random init)
fed real images: sklearn's digits (``hcrfast.data.load("digits")``, test split)
upsampled bilinearly to 28×28 and normalized with MNIST's mean and std.
``digits`` is the zoo's 64-64-64 model on the 8×8 digits, for quick checks.
σ = ``--sigma-scale`` × RMS of the features of the evaluated examples.

Products per example: SciPy's and hcrfast's LSQR both do one VJP to start a
solve and one JVP + one VJP per iteration, so a solve of ``itn`` iterations
costs ``2·itn + 1`` products. The reference's joint solve applies the
block-diagonal operator, so each of its products is one product per example;
hcrfast's count is ``Σ_{r,j} (2·itn[b,r,j] + 1)`` averaged over the examples b: what each
problem needed. Its batch runs in lockstep, so a problem that stopped rides along until the next
look compacts it out: the rows that went through the model's Jacobian (``rows/ex``,
``model_products_per_example``: every ``TorchJacobian`` product of the call, counted at the
operator, the probes of ``bound`` included) are what it cost, the figure to set beside the
reference's, whose joint solve multiplies every example at every step.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import scipy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_method import reference_bound

import hcrfast
from hcrfast import data, zoo

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


# ---------------------------------------------------------------------------------------
# problem


def build_problem(model_name: str, examples: int, *, seed: int, device: str):
    """(features model in eval mode, normalized inputs (B, C, H, W)) on ``device``."""
    images, _ = data.load("digits", split="test")
    if examples > images.shape[0]:
        raise ValueError(f"--examples {examples}: the digits test split has only {images.shape[0]} images")
    images = images[:examples]
    if model_name == "mlp":
        zm = zoo.build("mnist", seed=seed)
        x = torch.nn.functional.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
        x = (x.clamp(0, 1) - MNIST_MEAN) / MNIST_STD
    elif model_name == "digits":
        zm = zoo.build("digits", seed=seed)
        x = zm.normalize(images)
    else:
        raise ValueError(f"--model must be 'mlp' or 'digits', got {model_name!r}")
    model = zm.features.eval().to(device)
    return model, x.float().contiguous().to(device)


def products_per_example(itn, warm_start: bool = False) -> float:
    """``Σ_{r,j} (2·itn + 1)`` per example, averaged over examples; ``itn`` (B, R, i).

    A warm-started solve (``bound(warm_start=True)``, solves j > 1) also pays ``A x0``: one more.
    """
    itn = np.asarray(itn)
    extra = itn.shape[1] * (itn.shape[2] - 1) if warm_start else 0
    return float(np.mean(np.sum(2 * itn + 1, axis=(1, 2)))) + extra


def count_arg(least: int):
    """An argparse type: an integer of at least ``least``, refused where it is parsed, so that argparse names
    the option and the value (``--iterations 0`` failed deep in the reference's solve, ``zero-size array to
    reduction operation``, and ``--examples 0`` as a NaN RMS of no features)."""
    from hcrfast._bound_cli import count_at_least

    return functools.partial(count_at_least, least=least, fix=f"pass an integer >= {least}")


#: Counts (examples, restarts, iterations, threads, ...) and seeds (default_rng takes none below 0).
positive_int, seed_int = count_arg(1), count_arg(0)


def add_reorth_option(ap) -> None:
    """``--reorth-passes``: the Krylov basis' Gram–Schmidt passes (:data:`hcrfast.krylov.REORTH_PASSES`)."""
    ap.add_argument("--reorth-passes", default=None, choices=("auto", "1", "2"),
                    help="with the Krylov solver: hcrfast.krylov.REORTH_PASSES (default 'auto': one Gram-Schmidt "
                         "pass per vector, checked, two where it was not enough)")


def apply_reorth_option(value) -> None:
    if value is not None:
        from hcrfast import krylov

        krylov.REORTH_PASSES = value if value == "auto" else int(value)


def device_ready(args, script: str) -> bool:
    """False (having said why) when ``--device cuda`` finds no CUDA device; otherwise applies ``--threads``."""
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"{script}: --device cuda but torch sees no CUDA device; skipped.")
        return False
    if args.threads:
        torch.set_num_threads(args.threads)
    return True


def quantiles(std) -> dict:
    s = np.asarray(std, dtype=np.float64).ravel()
    return dict(median=float(np.median(s)), p90=float(np.quantile(s, 0.9)), n_inf=int(np.isinf(s).sum()))


REPO = Path(__file__).resolve().parent.parent


def git_commit(repo: Path = REPO) -> str | None:
    """The commit ``repo`` is checked out at, with "-dirty" when ``git status --porcelain`` lists anything
    (the code measured is then not exactly that commit's); None where it cannot be told: git missing, or no
    .git of ``repo``'s own (the GPU machine gets a copy of the working tree, perhaps without one; a
    repository above it would name another tree's commit)."""
    import subprocess

    def git(*cmd):
        return subprocess.run(("git", "-C", str(repo)) + cmd, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != repo.resolve():
            return None
        commit = git("rev-parse", "HEAD")
        return commit + ("-dirty" if git("status", "--porcelain") else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(device: str) -> dict:
    """The machine a JSON was measured on, and the code: hcrfast's version and the git commit of this
    checkout (:func:`git_commit`: "-dirty" if the tree differs from it, None without git). Beside the
    versions: the CPU's family/model numbers and the instruction set torch dispatches to
    (``torch.backends.cpu.get_cpu_capability``), since a VM's "AMD EPYC" can be another generation from
    session to session, with other float32 kernels (and so other rounding) under the same versions."""
    cpu, family_model = "unknown", {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    cpu = value.strip()
                elif key in ("cpu family", "model") and key not in family_model:
                    family_model[key] = value.strip()
                if line.strip() == "":  # the first processor's block is enough
                    break
    except OSError:
        pass
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # older torch
        capability = None
    info = dict(
        cpu_model=cpu, cpu_family=family_model.get("cpu family"), cpu_model_number=family_model.get("model"),
        torch_cpu_capability=capability, logical_cpus=os.cpu_count(),
        cpus_available=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        hcrfast=hcrfast.__version__, git_commit=git_commit(),
        torch=torch.__version__, numpy=np.__version__, scipy=scipy.__version__,
        python=platform.python_version(), torch_threads=torch.get_num_threads(),
        loadavg_start=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        hostname=platform.node(),
    )
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        try:
            import cupy
            info["cupy"] = cupy.__version__
        except ImportError:
            info["cupy"] = None
    return info


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------
# runs


def run_reference(model, x, sigma, args) -> dict:
    _sync(args.device)
    res = reference_bound(model, x, sigma, size=args.size, iterations=args.iterations,
                          restarts=args.restarts, seed=args.seed)
    _sync(args.device)
    return dict(
        method="reference (published scripts: joint scipy lsqr, restart by restart)",
        seconds=res.seconds, products_per_example=float(res.products), **quantiles(res.std),
        lsqr_itn_median=float(np.median(res.itn)), lsqr_itn_max=int(res.itn.max()),
        istop_counts={int(k): int(c) for k, c in zip(*np.unique(res.istop, return_counts=True))},
        _std=res.std,
    )


class RowCounter:
    """Rows through ``TorchJacobian.matvec`` / ``rmatvec`` while entered: one product per row."""

    def __init__(self):
        self.rows = 0
        self._saved = []

    def __enter__(self):
        from hcrfast.bindings.jacobian import TorchJacobian

        for name in ("matvec", "rmatvec"):
            original = getattr(TorchJacobian, name)

            def counted(op, a, _f=original):
                self.rows += a.shape[0]
                return _f(op, a)
            self._saved.append((TorchJacobian, name, original))
            setattr(TorchJacobian, name, counted)
        return self

    def __exit__(self, *exc):
        for owner, name, original in self._saved:
            setattr(owner, name, original)
        self._saved.clear()


def run_hcrfast(model, x, sigma, args, *, linearize_at: str, options=None, label=None, solver="lsqr",
                dense_eigh=None) -> dict:
    """One ``hcrfast.bound`` call. Products per example: LSQR's ``2·itn + 1`` per solve (+1 per warm
    start); the dense solve's are the ``min(n, p)`` products that build J (its forwards are not products);
    the Krylov solve's are its basis' (``params["krylov"]``: 2·steps + 1, rolled-back steps twice).
    ``dense_eigh``: ``hcrfast.dense.EIGH_IMPL`` for this call (how the dense solve's Gram matrices are
    decomposed), restored after it."""
    from hcrfast import dense

    saved = dense.EIGH_IMPL
    try:
        dense.EIGH_IMPL = dense_eigh or saved
        _sync(args.device)
        t0 = time.perf_counter()
        with RowCounter() as counter:
            b = hcrfast.bound(model, x, sigma, size=args.size, iterations=args.iterations, restarts=args.restarts,
                              seed=args.seed, linearize_at=linearize_at, lsqr=options, jacobian=args.jacobian,
                              warm_start=args.start == "warm", solver=solver)
        _sync(args.device)
    finally:
        dense.EIGH_IMPL = saved
    seconds = time.perf_counter() - t0
    h = b.to_numpy()
    used = b.params["solver"]
    products = (float(b.params["dense"]["jacobian_products"]) if used == "dense"
                else float(b.params["krylov"]["products_per_example"]) if used == "krylov"
                else products_per_example(h.lsqr_iterations, args.start == "warm"))
    return dict(
        method=label or f"hcrfast linearize_at={linearize_at}", solver=used,
        dense_eigh=(dense_eigh or saved) if used == "dense" else None, seconds=seconds, products_per_example=products,
        model_products_per_example=counter.rows / len(x) + (products if used == "dense" else 0.0),
        **quantiles(h.std),
        lsqr_itn_median=float(np.median(h.lsqr_iterations)), lsqr_itn_max=int(h.lsqr_iterations.max()),
        istop_counts={int(k): int(c) for k, c in zip(*np.unique(h.lsqr_istop, return_counts=True))},
        # the options the solves ran with (the Krylov basis' own rules where none were given); the dense solve
        # runs no LSQR, of its options it uses the kernels (bound() fills in DEFAULT_LSQR's tolerances)
        lsqr=b.params["lsqr"] if used != "dense" else dict(kernels=b.params["lsqr"]["kernels"]),
        linearize_at=linearize_at, start=args.start, _std=h.std,
    )


def sweep_grid(iter_lims, tols):
    """(iter_lim, tol) pairs in increasing cost order: iteration cap first, then looser tolerance first."""
    key = lambda it: math.inf if it is None else it
    return [(it, tol) for it in sorted(iter_lims, key=key) for tol in sorted(tols, reverse=True)]


def run_sweep(model, x, sigma, args, ref_median: float) -> tuple[list, dict | None]:
    """Run hcrfast over the LSQR grid; return all rows and the cheapest one that reaches ``ref_median``.

    Settings that cannot be cheaper than a passing one (cap ≥ and tolerance ≤)
    are skipped, and so is a tighter tolerance under a cap that every solve of
    the looser run already hit (istop 7 everywhere: the result would be identical).
    """
    rows, passing = [], []
    capped = set()  # iteration caps that every solve hit
    t_start = time.perf_counter()
    for it, tol in sweep_grid(args.sweep_iter_lims, args.sweep_tols):
        key = "inf" if it is None else it
        if any((it is None or (p_it is not None and it >= p_it)) and tol <= p_tol for p_it, p_tol in passing):
            rows.append(dict(iter_lim=key, tol=tol, skipped="dominated by a passing setting"))
            continue
        if it in capped:
            rows.append(dict(iter_lim=key, tol=tol, skipped="every solve hit this iter_lim already: identical result"))
            continue
        if args.sweep_budget and time.perf_counter() - t_start > args.sweep_budget:
            rows.append(dict(iter_lim=key, tol=tol, skipped=f"sweep budget of {args.sweep_budget} s spent"))
            continue
        opts = hcrfast.LSQROptions(atol=tol, btol=tol, conlim=hcrfast.DEFAULT_LSQR.conlim, iter_lim=it,
                                   check_every=hcrfast.DEFAULT_LSQR.check_every)
        r = run_hcrfast(model, x, sigma, args, linearize_at=args.sweep_linearize, options=opts,
                        label=f"hcrfast iter_lim={key} atol=btol={tol:g}, {args.start} start")
        r.pop("_std")
        r.update(iter_lim=key, tol=tol, reaches_reference=r["median"] >= ref_median)
        rows.append(r)
        print(f"  sweep iter_lim={key!s:>5} tol={tol:<6g} {r['seconds']:8.2f} s  products/ex {r['products_per_example']:9.0f}"
              f"  median {r['median']:.5g}  {'reaches' if r['reaches_reference'] else 'below'} the reference",
              flush=True)
        if r["reaches_reference"]:
            passing.append((it, tol))
        if set(r["istop_counts"]) == {7}:
            capped.add(it)
    ok = [r for r in rows if r.get("reaches_reference")]
    best = min(ok, key=lambda r: r["seconds"]) if ok else None
    if ok:
        fewest = min(ok, key=lambda r: r["products_per_example"])
        print(f"  fewest products among passing settings: iter_lim={fewest['iter_lim']}, tol={fewest['tol']:g} "
              f"({fewest['products_per_example']:.0f} per example; wall time is noisy on a shared machine, "
              f"products are not)", flush=True)
    return rows, best


_SAME_PROBLEM = ("model", "examples", "restarts", "iterations", "size", "sigma_scale", "seed", "model_seed")


def load_reference(path, args, sigma, info) -> tuple[dict, dict]:
    """The reference row of an earlier race JSON and the machine it was measured on, after checking it is
    the same problem and was timed where this run's rows will be: the same device (on CUDA the same GPU)
    and, on a CPU, the same torch thread count; a wall time from elsewhere is no term of a ratio.
    ``info``: this run's :func:`machine_info`."""
    saved = json.loads(Path(path).read_text())
    diff = {k: (saved["args"].get(k), getattr(args, k)) for k in _SAME_PROBLEM if saved["args"].get(k) != getattr(args, k)}
    if diff or not math.isclose(saved["sigma"], sigma, rel_tol=1e-9):
        raise ValueError(f"{path} is another problem: (saved, now) = {diff or {'sigma': (saved['sigma'], sigma)}}")
    # The reference's own machine: a JSON that reused a reference row carries that row's as reference_machine.
    machine = saved.get("reference_machine") or saved.get("machine") or {}
    rerun = "rerun the reference here (race.py without --reference-json; --out keeps it for later runs)"
    device = saved["args"].get("device", "cpu")
    if device != args.device:
        raise ValueError(f"{path}: its reference ran on --device {device}, this run on --device {args.device}: "
                         f"their wall times are not comparable; {rerun}")
    if args.device == "cuda" and machine.get("gpu") != info.get("gpu"):
        raise ValueError(f"{path}: its reference ran on the GPU {machine.get('gpu')!r}, this run on "
                         f"{info.get('gpu')!r}: their wall times are not comparable; {rerun}")
    if args.device == "cpu":
        # torch's thread count as it was (machine info; the --threads asked for in a JSON without it)
        threads = machine.get("torch_threads", saved["args"].get("threads"))
        if threads != info["torch_threads"]:
            raise ValueError(f"{path}: its reference ran on {threads} torch thread(s), this run on "
                             f"{info['torch_threads']}: their wall times are not comparable; {rerun} or pass "
                             f"--threads {threads}")
    ref = dict(saved["reference"])
    ref["method"] = ref["method"] + f" [from {Path(path).name}]"
    return ref, machine


# ---------------------------------------------------------------------------------------
# report


def table(rows, ref) -> str:
    head = (f"{'method':<58} {'wall s':>9} {'products/ex':>12} {'rows/ex':>9} {'median':>10} {'p90':>10}"
            f" {'time ratio':>10} {'median ratio':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        tr = r["seconds"] / ref["seconds"]
        mr = r["median"] / ref["median"] if ref["median"] else float("nan")
        rows = r.get("model_products_per_example", r["products_per_example"])
        lines.append(f"{r['method'][:58]:<58} {r['seconds']:9.2f} {r['products_per_example']:12.0f} {rows:9.0f} "
                     f"{r['median']:10.5g} {r['p90']:10.5g} {tr:10.3f} {mr:12.4f}")
    lines.append("time ratio = method / reference (below 1: faster); median ratio = method / reference "
                 "(at least 1: bounds as tight or tighter); products/ex: what each problem needed; rows/ex: "
                 "what went through the model's Jacobian (hcrfast: counted, stopped problems riding along in "
                 "their batch and bound's probes included; the dense solve: its J's products added)")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mlp", choices=("mlp", "digits"))
    ap.add_argument("--examples", type=positive_int, default=32)
    ap.add_argument("--restarts", type=positive_int, default=25)
    ap.add_argument("--iterations", type=positive_int, default=10)
    ap.add_argument("--size", type=float, default=1 / 200)
    ap.add_argument("--sigma-scale", type=float, default=1.0, help="sigma = scale x RMS of the features")
    ap.add_argument("--seed", type=seed_int, default=0, help="noise streams of the start vectors")
    ap.add_argument("--model-seed", type=seed_int, default=0, help="random init of the model")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--jacobian", default="reverse", choices=("reverse", "forward"), help="hcrfast's JVP mode")
    ap.add_argument("--start", default="warm", choices=("warm", "cold"),
                    help="hcrfast's LSQR solves j > 1: warm (bound's default) or from zero (the published scripts)")
    ap.add_argument("--dense-eigh", default="auto",
                    help="the dense solve's Gram eigendecompositions (hcrfast.dense.EIGH_IMPL), comma-separated: "
                         "one dense row per implementation (auto, torch, lapack, cusolver, cupy; the last two on "
                         "CUDA); the first is also the defaults row's where solver=auto takes the dense solve")
    ap.add_argument("--no-sweep", action="store_true", help="skip the time-to-reference-median sweep")
    ap.add_argument("--no-lsqr-rows", action="store_true",
                    help="skip the two DEFAULT_LSQR rows (linearize_at current and input): the GPU lease's race, "
                         "whose 120 s the reference (~51 s on an H100) and those rows (~45 s each) overran")
    ap.add_argument("--sweep-iter-lims", default="10,20,40,80,160,320,640,None")
    ap.add_argument("--sweep-tols", default="1e-2,1e-3,1e-4,1e-5,1e-6,1e-8")
    ap.add_argument("--sweep-linearize", default="current", choices=("current", "input"))
    ap.add_argument("--sweep-budget", type=float, default=None, help="seconds; later sweep points are skipped")
    ap.add_argument("--reference-json", default=None,
                    help="reuse the reference row of an earlier race JSON with the same problem, device (GPU) and, "
                         "on a CPU, torch thread count (its wall time was measured then, on that machine: its "
                         "machine info is kept as reference_machine)")
    ap.add_argument("--out", default=None, help="directory for race_<model>_<device>_<date>.json")
    args = ap.parse_args(argv)
    try:
        args.sweep_iter_lims = [None if s.strip().lower() == "none" else positive_int(s)
                                for s in args.sweep_iter_lims.split(",")]
    except argparse.ArgumentTypeError as err:
        ap.error(f"--sweep-iter-lims {args.sweep_iter_lims!r}: {err} or None for each")
    args.sweep_tols = [float(s) for s in args.sweep_tols.split(",")]
    from hcrfast.kernels.symmetric import IMPLS

    eighs = [e.strip() for e in args.dense_eigh.split(",")]
    bad = [e for e in eighs if e not in IMPLS]
    if bad or not eighs:
        ap.error(f"--dense-eigh {args.dense_eigh!r}: each of its comma-separated names must be one of {', '.join(IMPLS)}")
    args.dense_eigh = ",".join(eighs)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("race: --device cuda asked for but torch sees no CUDA device; skipped.")
            return 0
        try:
            import cupy  # noqa: F401
        except ImportError:
            print('race: --device cuda needs CuPy (pip install "hcrfast[cuda12]"); skipped.')
            return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(args.device)
    model, x = build_problem(args.model, args.examples, seed=args.model_seed, device=args.device)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x), args.sigma_scale)
    ref_machine = info   # the machine of the reference row: this one, or that of --reference-json's run
    if args.reference_json:   # checked before the warm-ups: a refused reference costs no device time
        try:
            ref, ref_machine = load_reference(args.reference_json, args, sigma, info)
        except ValueError as exc:   # (a message and exit 2, as argparse's refusals: not a traceback)
            print(f"race: --reference-json {exc}", file=sys.stderr)
            return 2
    # The first torch.func.jvp of a process loads torch's forward-AD decompositions
    # (seconds on a CPU). Both methods call it (the reference per product, hcrfast in
    # its independence check), so pay it once here rather than inside whichever runs first.
    t_warm = time.perf_counter()
    torch.func.jvp(model, (x[:1],), (torch.zeros_like(x[:1]),))
    info["first_jvp_warmup_seconds"] = time.perf_counter() - t_warm
    if args.device == "cuda":
        # hcrfast's first CUDA call of a process pays CuPy's kernel loads, cuBLAS's handles and torch's
        # lazily loaded kernels: outside both timings, as gpu_targets.py does (the reference has none).
        t_warm = time.perf_counter()
        from hcrfast import dense

        saved = dense.EIGH_IMPL
        runs = [("auto", "input", None)] + [("dense", "input", e) for e in args.dense_eigh.split(",")]
        for solver, linearize_at, eigh in runs + [("lsqr", "current", None)]:
            try:   # each --dense-eigh's first use (cuSOLVER's lookup and handle, CuPy's solver) too
                dense.EIGH_IMPL = eigh or saved
                hcrfast.bound(model, x[:2], sigma, size=args.size, iterations=1, restarts=2, seed=args.seed,
                              linearize_at=linearize_at, solver=solver,
                              lsqr=None if solver != "lsqr" else dataclasses.replace(hcrfast.DEFAULT_LSQR, iter_lim=8))
            except Exception as exc:  # the row itself will say so
                print(f"  warm-up of solver={solver} eigh={eigh}: {type(exc).__name__}: {exc}", flush=True)
            finally:
                dense.EIGH_IMPL = saved
        _sync(args.device)
        info["hcrfast_cuda_warmup_seconds"] = time.perf_counter() - t_warm
    print(f"race: model {args.model}, {args.examples} examples of shape {tuple(x.shape[1:])}, R={args.restarts}, "
          f"i={args.iterations}, s={args.size:g}, sigma={sigma:.5g} ({args.sigma_scale:g} x RMS), device {args.device}, "
          f"torch threads {torch.get_num_threads()}, load average {info['loadavg_start']}", flush=True)

    if args.reference_json:
        print(f"  reference (from {args.reference_json}): {ref['seconds']:.2f} s, median {ref['median']:.5g}", flush=True)
    else:
        ref = run_reference(model, x, sigma, args)
        print(f"  reference: {ref['seconds']:.2f} s, median {ref['median']:.5g}", flush=True)
        if args.out:  # the expensive row first, on its own: reusable with --reference-json if the rest dies
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
            part = out / f"race_{args.model}_{args.device}_{stamp}_reference.json"
            part.write_text(json.dumps(dict(args=vars(args), sigma=sigma, machine=info,
                                            reference={k: v for k, v in ref.items() if k != "_std"}),
                                       indent=2, default=str))
            print(f"  wrote {part} (the reference row alone)", flush=True)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    dflt = dns = cur = inp = None
    more_dense = []
    main_rows = []

    def write(sweep, best, fastest, complete, rows_done="all"):
        """The race's JSON: after every main row (a run killed in the next keeps those done), before the
        sweep and after it."""
        if not args.out:
            return None
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"race_{args.model}_{args.device}_{stamp}.json"
        payload = dict(command="python benchmarks/race.py " + " ".join(sys.argv[1:] if argv is None else argv),
                       args={k: v for k, v in vars(args).items()}, sigma=sigma, machine=info,
                       reference={k: v for k, v in ref.items() if k != "_std"}, reference_machine=ref_machine,
                       hcrfast_default=dflt, hcrfast_dense=dns, hcrfast_dense_more=more_dense, hcrfast_current=cur,
                       hcrfast_input=inp, sweep=sweep,
                       sweep_time_to_reference_median=best, time_to_reference_median=fastest,
                       complete=complete, main_rows_done=rows_done)
        path.write_text(json.dumps(payload, indent=2, default=str))
        return path

    def fastest_of(rows):
        reaching = [r for r in rows if r["median"] >= ref["median"]]
        return min(reaching, key=lambda r: r["seconds"]) if reaching else None

    def done(row):
        """A main row finished: its paired comparison with the reference (how often is hcrfast's bound at
        least the reference's, mode by mode), then the JSON so far."""
        if "_std" in ref:
            row["fraction_modes_ge_reference"] = float(np.mean(row["_std"] >= ref["_std"]))
        row.pop("_std", None)
        main_rows.append(row)
        write([], None, fastest_of(main_rows), complete=False, rows_done=[r["method"] for r in main_rows])

    dflt = run_hcrfast(model, x, sigma, args, linearize_at="input", solver="auto",
                       dense_eigh=args.dense_eigh.split(",")[0],
                       label="hcrfast defaults (solver=auto), linearize_at=input")
    dflt["method"] += f" -> {dflt['solver']}"
    print(f"  hcrfast defaults ({dflt['solver']}): {dflt['seconds']:.2f} s, median {dflt['median']:.5g}", flush=True)
    if dflt["solver"] != "lsqr":
        done(dflt)
    else:  # auto as LSQR is the input row: not a main row of its own, and its bounds stay out of the JSON
        dflt.pop("_std", None)
    dns = None
    # On CUDA "auto" takes the Krylov basis; the dense solve (J by vmapped VJPs, its Gram matrices
    # decomposed by each of --dense-eigh's implementations) is the other exact solver, and at the race's
    # 32 examples it may be the faster one: measured here, so that the choice can follow. Where "auto"
    # is the dense solve, its row has the first implementation already.
    eighs = [e for e in args.dense_eigh.split(",") if e]
    for i, eigh in enumerate(eighs):
        if dflt["solver"] == "dense" and i == 0:
            continue
        label = f"hcrfast dense solve (solver=dense, eigh {eigh}), linearize_at=input"
        try:
            row = run_hcrfast(model, x, sigma, args, linearize_at="input", solver="dense", dense_eigh=eigh,
                              label=label)
        except Exception as exc:   # one implementation failing (a cuSOLVER without the routine) costs its row only
            print(f"  hcrfast dense (eigh {eigh}): FAILED: {type(exc).__name__}: {exc}", flush=True)
            more_dense.append(dict(method=label, solver="dense", dense_eigh=eigh,
                                   error=f"{type(exc).__name__}: {exc}"))
            continue
        print(f"  hcrfast dense (eigh {eigh}): {row['seconds']:.2f} s, median {row['median']:.5g}", flush=True)
        if dns is None:
            dns = row
        else:
            more_dense.append(row)
        done(row)
    if args.no_lsqr_rows:
        print("  hcrfast DEFAULT_LSQR rows: skipped (--no-lsqr-rows)", flush=True)
    else:
        cur = run_hcrfast(model, x, sigma, args, linearize_at="current",
                          label=f"hcrfast DEFAULT_LSQR, linearize_at=current, {args.start} start")
        print(f"  hcrfast current: {cur['seconds']:.2f} s, median {cur['median']:.5g}", flush=True)
        done(cur)
        inp = run_hcrfast(model, x, sigma, args, linearize_at="input",
                          label=f"hcrfast DEFAULT_LSQR, linearize_at=input, {args.start} start")
        print(f"  hcrfast input: {inp['seconds']:.2f} s, median {inp['median']:.5g}", flush=True)
        done(inp)
    ref.pop("_std", None)

    write([], None, fastest_of(main_rows), complete=args.no_sweep)
    sweep, best = ([], None)
    if not args.no_sweep:
        print(f"sweep (linearize_at={args.sweep_linearize}): cheapest LSQR setting whose median reaches "
              f"the reference's {ref['median']:.5g}", flush=True)
        sweep, best = run_sweep(model, x, sigma, args, ref["median"])

    rows = [ref] + main_rows + ([best] if best else [])
    print()
    print(table(rows, ref))
    if not args.no_sweep:
        if best:
            print(f"LSQR sweep: time to reach the reference's median bound: {best['seconds']:.2f} s with "
                  f"iter_lim={best['iter_lim']}, atol=btol={best['tol']:g} "
                  f"({ref['seconds'] / best['seconds']:.2f}x faster than the reference)")
        else:
            print("LSQR sweep: no swept setting reached the reference's median bound")
    fastest = fastest_of(main_rows + ([best] if best else []))
    if fastest:
        print(f"time to reach the reference's median bound: {fastest['seconds']:.2f} s ({fastest['method']}), "
              f"{ref['seconds'] / fastest['seconds']:.2f}x faster than the reference")
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None

    path = write(sweep, best, fastest, complete=True)
    if path is not None:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
