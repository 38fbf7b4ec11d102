"""``hcrfast reproduce NAME``: a published experiment end to end (:mod:`hcrfast.reproduce`)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import warnings

import numpy as np
import torch

from hcrfast import reproduce, zoo
from hcrfast._bound_cli import pilots_arg, steps_arg
from hcrfast.cli import as_typed, float_literal
from hcrfast.validation import say


def _fraction(x: float) -> str:
    return f"1/{round(1 / x)}" if abs(1 / x - round(1 / x)) < 1e-9 else f"{x:g}"


def tolerance_arg(field: str):
    """The type of ``--lsqr-atol`` or ``--lsqr-btol`` (``field``: LSQROptions' ``atol`` or ``btol``): a finite number
    >= 0, as typed (LSQROptions' own message names its Python fields); a refusal names that flag's default."""
    default = getattr(reproduce.hcrfast.DEFAULT_LSQR, field)

    def parse(text: str) -> float:
        value = float_literal(text)
        if not (np.isfinite(value) and value >= 0):
            raise argparse.ArgumentTypeError(f"{text}: pass a finite number >= 0 (default {default:g})")
        return value

    parse.__name__ = f"lsqr_{field}"   # argparse names the type in its "invalid ... value" message
    return parse


def _epilog() -> str:
    rows = ["defaults are the experiment's published parameters (those of the paper's experiments):",
            "  name      examples  sigma scale  size (--limit)   iterations (--limit)"]
    for name in reproduce.EXPERIMENTS:
        p = zoo.published_parameters(name)
        size = f"{_fraction(p['size'])} ({_fraction(p['size_limit'])})"
        rows.append(f"  {name:<9}{p['examples']:>8,}  {p['sigma_scale']:>11g}    {size:<15}"
                    f"  {p['iterations']:>2} ({p['iterations_limit']})"
                    + ("   (not in the paper)" if name == "digits" else ""))
    return "\n".join(rows) + """

weights: digits is trained on first use (saved in OUT, reused); mnist and cifar10
need `hcrfast train NAME` first and --weights NAME_state_dict.pt; resnet18 and
swin_t run randomly initialized (NOT the published results) unless given
--weights default (downloads torchvision's weights once) or --weights PATH.

The run is resumable: rerun the same command after an interruption. Under
`torchrun --nproc_per_node=N` the chunks are shared among the N processes.
"""


def add_subparser(subparsers) -> None:
    """Register ``reproduce``."""
    p = subparsers.add_parser(
        "reproduce",
        help="run a published experiment: bounds, accuracies, figures and an HTML report",
        description="Run one of the paper's experiments (or the small digits one) end to end and "
        "write bounds.npz, summary.json, figures and report.html into --out.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", choices=reproduce.EXPERIMENTS, help="experiment")
    g = p.add_argument_group("experiment parameters (default: the published ones)")
    g.add_argument("--examples", type=int, default=None, metavar="N",
                   help="evaluate the first N test images (ImageNet: N evenly spaced validation images)")
    g.add_argument("--restarts", type=int, default=reproduce.DEFAULT_RESTARTS, metavar="R",
                   help=f"start vectors per example; bounds are the max over them "
                        f"(default {reproduce.DEFAULT_RESTARTS}, the published runs'). With the dense solve more cost "
                        f"forward passes only (MNIST MLP, R = 100 against 25: a 0.5%% higher median for 2.1x the time with the "
                        f"default singular steps, which lift most of what restarts did; 21%% for 1.5x without them)")
    g.add_argument("--iterations", type=int, default=None, metavar="I", help="outer iterations of Algorithm 1")
    g.add_argument("--size", type=float_literal, default=None, metavar="S",
                   help="start-vector size s (e.g. 0.005 = 1/200)")
    g.add_argument("--sigma-scale", type=float_literal, default=None, metavar="K",
                   help="sigma = K x RMS of the clean features")
    g.add_argument("--sweep", default=None, metavar="K1,K2,...",
                   help="run the experiment at each sigma = K x the published sigma (or --sigma-scale's), in the "
                        "order given: OUT/scale_K/ holds each run (resumable by itself), OUT/sweep.json and "
                        "OUT/report.html the bounds and the accuracies at every sigma and the trade between them "
                        "(default OUT: runs/NAME_sweep, runs/NAME_limit_sweep with --limit)")
    g.add_argument("--limit", action="store_true",
                   help="the 'limit' setting: the default size and iterations become the values in "
                        "parentheses below (default --out runs/NAME_limit)")
    g.add_argument("--seed", type=int, default=0, help="seed of the start vectors and the dithering (default 0)")
    g.add_argument("--linearize-at", choices=("input", "current"), default="input",
                   help="apply the Jacobian at the input (the paper) or at the current point "
                        "(the published scripts); default input")
    g.add_argument("--cold-start", action="store_true",
                   help="start every LSQR solve from zero, as the published scripts (default: warm starts, "
                        "see hcrfast.bound's warm_start)")
    g.add_argument("--last-iterate", action="store_true",
                   help="bound by Algorithm 1's last iterate alone, as the paper (default: every iterate, each "
                        "certified, the largest bound per mode; see hcrfast.bound's iterates)")
    g.add_argument("--solver", choices=("auto", "lsqr", "dense", "krylov"), default="auto",
                   help="how each least-squares step is solved: matrix-free LSQR; dense (J built once per "
                        "example and factored, every step exact); krylov (one reorthogonalized LSQR per example "
                        "keeps its Krylov basis, every step is projected on it). dense and krylov need "
                        "--linearize-at input. auto: dense on the CPU for inputs of at most 4096 values whose J "
                        "(features x inputs) holds at most 2^24 values (digits, MNIST, CIFAR-10), krylov on CUDA and beyond "
                        "(ImageNet models), LSQR otherwise")
    g.add_argument("--krylov-pilots", type=pilots_arg, default="auto", metavar="S",
                   help="with the Krylov solver: restarts 0..S-1 each build their own Krylov basis and restart r "
                        "uses pilot r mod S's (S times the products and memory). Default 'auto': 1 where one "
                        "basis exhausts the space (min(features, inputs) <= 4096) or --lsqr-iter-lim is given, "
                        "else one per restart (at most 100, and 2^30 basis values an example): up to R = 25 "
                        "sharing one basis' 4,096 steps, at most 246 each, beyond 160 each (ImageNet models: a "
                        "higher median bound at equal products; deeper pilots gave lower bounds, and restarts "
                        "sharing a pilot its bounds again)")
    g.add_argument("--targets", default=None, metavar="SPEC",
                   help="also aim one perturbation at each of these DCT modes (Cramer-Rao direction), e.g. "
                        "'low:8' (the 8x8 lowest frequencies per channel) or 'all'; the bound per mode is the "
                        "largest of Algorithm 1's and the targeted steps' (each bounds every mode it moves), and the "
                        "summary reports the gain")
    g.add_argument("--singular-steps", type=steps_arg, default="auto", metavar="K",
                   help="also certify a step along each of J's K smallest singular directions (from the dense or "
                        "Krylov solve's own factorization); each bounds every mode it moves (default auto: 64 with "
                        "the dense or Krylov solve, none with LSQR; 0: none, Algorithm 1 alone)")
    g.add_argument("--lsqr-atol", type=tolerance_arg("atol"), default=None,
                   help=f"LSQR atol (default {reproduce.hcrfast.DEFAULT_LSQR.atol:g}; the Krylov basis: 0, it runs "
                        f"until J's rank is exhausted). Any --lsqr-* option makes --solver auto use LSQR")
    g.add_argument("--lsqr-btol", type=tolerance_arg("btol"), default=None,
                   help=f"LSQR btol (default {reproduce.hcrfast.DEFAULT_LSQR.btol:g}; the Krylov basis: 0)")
    g.add_argument("--lsqr-iter-lim", type=int, default=None,
                   help="LSQR iteration limit per solve (default 2 x the number of inputs; the Krylov basis: "
                        "4096 steps)")

    g = p.add_argument_group("model and data")
    g.add_argument("--weights", default=None, metavar="PATH|default",
                   help="state dict (from `hcrfast train`), or 'default' for torchvision's ImageNet weights")
    g.add_argument("--data", "--data-root", dest="data", default=None, metavar="DIR",
                   help="data directory (default ./data; ./data/imagenet for ImageNet)")
    g.add_argument("--download", action="store_true", help="download MNIST/CIFAR-10 into --data if missing")

    g = p.add_argument_group("execution")
    g.add_argument("--out", default=None, metavar="DIR", help="output directory (default runs/NAME)")
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    g.add_argument("--chunk-examples", "--chunk-size", dest="chunk_examples", type=int, default=None, metavar="K",
                   help="examples per resumable chunk (default: digits/mnist 64, cifar10 32, "
                        "resnet18/swin_t 8)")
    g.add_argument("--threads", type=int, default=None, metavar="T",
                   help="torch CPU threads (default: 1 for digits, whose 64x64 layers gain nothing "
                        "from more and slow down badly on a busy machine; torch's default otherwise)")
    g.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    # Test hooks, not shown in --help: a short digits training, and a hard exit after K
    # chunks (os._exit, as a kill would) for the resume test.
    g.add_argument("--train-epochs", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--test-crash-after-chunks", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_run)


def check_targets_flag(targets, flag: str = "--targets") -> None:
    """``--targets`` (or another ``flag`` naming modes) on a command line (reproduce, bound): 'all' or
    'low:K'; the rest of what ``hcrfast.bound(targets=...)`` takes has no spelling there."""
    if targets is not None and targets != "all" and not targets.startswith("low:"):
        raise ValueError(f"{flag} takes 'all' or 'low:K' (the K x K lowest DCT frequencies of every channel), got "
                         f"{targets!r}; lists of modes and masks are for the Python API")


def _run(args: argparse.Namespace) -> int:
    from hcrfast._bound_cli import expand_user

    expand_user(args, "out", "weights", "data")
    check_targets_flag(args.targets)
    # Measured on 2 shared cores, one 64-example digits chunk (25 restarts, 10 iterations):
    # 7.1 s with 1 thread and 7.6 s with 2 on an idle machine, 10.7 s and 48.5 s while other
    # jobs kept the load at 5 (idle intra-op threads spin and wait on each other).
    threads = args.threads if args.threads is not None else (1 if args.name == "digits" else None)
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {threads}")
    # One OUT holds one kind of run (a sweep's page and sweep.json beside a plain run's report, or the
    # reverse, would describe another run than the files beside them): refused before anything is written
    from hcrfast._bound_cli import _check_out_kind

    out = Path(args.out if args.out is not None else Path("runs") / (
        f"{args.name}{'_limit' if args.limit else ''}{'_sweep' if args.sweep is not None else ''}"))
    if out.is_dir():
        _check_out_kind(out, "reproduce_sweep" if args.sweep is not None else "reproduce")
    _check_outputs(args, out)
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings():   # (main may run in-process: the caller's filters come back as they were)
            # run() warns about a randomly initialized ImageNet model and also prints a banner; the
            # command line shows the banner only.
            warnings.filterwarnings("ignore", message=r".*RANDOMLY INITIALIZED", category=UserWarning)
            if args.sweep is not None:
                return _sweep(args)
            result = _reproduce(args)
    finally:
        torch.set_num_threads(saved_threads)  # main() may be called in-process (tests, notebooks)
    if result.summary is not None:
        print(f"report: {result.report_path}")
        print(f"bounds: {result.bounds_path}")
        print(f"summary: {result.summary_path}")
    return 0


#: What `hcrfast reproduce --sweep` writes in its OUT beside each sigma's run folder (scale_K, a run each)
_SWEEP_OUTPUTS = ("sweep.json", "report.html", "bounds_vs_sigma.png", "tradeoff.png")


def _check_outputs(args: argparse.Namespace, out: Path) -> None:
    """Refuse, before anything runs, an OUT (and with --sweep each sigma's run folder in it) that holds a file
    of the user's where the run writes one (hcrfast._bound_cli.check_outputs)."""
    import os

    from hcrfast._bound_cli import check_outputs
    from hcrfast.calibrate import scale_folder

    rank = int(os.environ.get("RANK", "0"))
    runs = [out]
    if args.sweep is not None:
        from hcrfast._bound_cli import sweep_scales

        check_outputs(out, _SWEEP_OUTPUTS, _SWEEP_OUTPUTS, ("scale_*/run.json",), "hcrfast reproduce ", rank)
        runs = [out / scale_folder(k) for k in sweep_scales(args.sweep)]
    for folder in runs:
        check_outputs(folder, reproduce.REPRODUCE_OUTPUTS, reproduce.REPRODUCE_OUTPUTS, ("run.json",),
                      "hcrfast reproduce ", rank)


def _reproduce(args: argparse.Namespace):
    return reproduce.run(
        args.name,
        examples=args.examples,
        restarts=args.restarts,
        iterations=args.iterations,
        size=args.size,
        sigma_scale=args.sigma_scale,
        limit=args.limit,
        seed=args.seed,
        device=args.device,
        out=args.out,
        data_root=args.data,
        download=args.download,
        weights=args.weights,
        chunk_examples=args.chunk_examples,
        linearize_at=args.linearize_at,
        targets=args.targets,
        warm_start=not args.cold_start,
        iterates="last" if args.last_iterate else "all",
        solver=args.solver,
        lsqr_atol=args.lsqr_atol,
        lsqr_btol=args.lsqr_btol,
        lsqr_iter_lim=args.lsqr_iter_lim,
        krylov_pilots=args.krylov_pilots,
        singular_steps=args.singular_steps,
        progress=not args.no_progress,
        train_epochs=args.train_epochs,
        crash_after_chunks=args.test_crash_after_chunks,
    )


def _sweep(args: argparse.Namespace) -> int:
    """``--sweep``: one full run per sigma, each in its own folder, then the sweep's summary and page."""
    from hcrfast._bound_cli import shell_fix, sweep_scales
    from hcrfast.calibrate import scale_folder
    from hcrfast.checkpoint import atomic_write_text
    from hcrfast.report import write_reproduce_sweep_report

    scales = sweep_scales(args.sweep)
    published = zoo.published_parameters(args.name)["sigma_scale"]
    base = published if args.sigma_scale is None else args.sigma_scale
    if not (np.isfinite(base) and base > 0):
        raise ValueError(f"--sigma-scale {as_typed(base)}: pass a positive finite number")
    root = Path(args.out if args.out is not None else
                Path("runs") / f"{args.name}{'_limit' if args.limit else ''}_sweep")
    if root.exists() and not root.is_dir():
        raise ValueError(f"--out {root} is a file; pass a folder for the sweep (it is created if missing)")
    levels, weights = [], args.weights
    for i, k in enumerate(scales):
        if not args.no_progress:
            say(f"hcrfast reproduce {args.name}: sweep {i + 1}/{len(scales)}: sigma = {k:g} x {base:g} x RMS")
        run_args = argparse.Namespace(**{**vars(args), "sigma_scale": k * base, "out": root / scale_folder(k),
                                         "weights": weights})
        try:
            result = _reproduce(run_args)
        except reproduce.CheckpointMismatchError as exc:   # deleting this sigma's run alone: the next is refused
            raise shell_fix(exc, root) from None
        if weights is None and args.name in reproduce._TRAINED_HERE:  # trained by the first run: the others take it
            weights = str(run_args.out / f"{args.name}_state_dict.pt")
        if result.summary is None:  # not rank 0 of a distributed run
            continue
        s = result.summary
        per_draw = np.asarray(s["accuracy"]["dithered_per_draw"], dtype=np.float64)
        levels.append({
            "scale": k, "sigma_scale": s["sigma_scale"], "sigma": s["sigma"], "sigma_rms": s["sigma"],
            "run": str(result.out), "report": str(result.report_path), "bounds": str(result.bounds_path),
            "std": s["bounds"], "bounds_lowfreq": s["bounds_lowfreq"], "mse_bound_modes": s["mse_bound_modes"],
            "infinite": s["infinite"]["coordinates"],
            "utility": {"clean": s["accuracy"]["clean"], "dithered": s["accuracy"]["dithered"],
                        "stderr": float(per_draw.std(ddof=1) / np.sqrt(per_draw.size)) if per_draw.size > 1 else 0.0,
                        "draws": int(per_draw.size)},
            "bound_seconds": s["timings"]["bound_seconds_all_chunks"],
        })
    if not levels:
        return 0
    summary = {"experiment": args.name, "limit": bool(args.limit), "scales": scales, "sigma_scale_unit": base,
               "published_sigma_scale": published, "rms": levels[0]["sigma"] / levels[0]["sigma_scale"],
               "lowfreq": zoo.published_parameters(args.name)["lowfreq"], "levels": levels}
    root.mkdir(parents=True, exist_ok=True)
    from hcrfast._bound_cli import _listed_outputs, write_outputs

    # listed as hcrfast's before they are written (the OUT was checked for the user's files at their names)
    write_outputs(root, (_listed_outputs(root) or set()) | set(_SWEEP_OUTPUTS))
    atomic_write_text(root / "sweep.json", json.dumps(summary, indent=1) + "\n")
    page = write_reproduce_sweep_report(root, summary)
    write_outputs(root, _SWEEP_OUTPUTS)
    print(f"{args.name}: {len(levels)} sigmas (x {base:g} x RMS {summary['rms']:.6g}):")
    for lv in levels:
        print(f"  scale {lv['scale']:g} (sigma {lv['sigma']:.6g}): median bound {lv['std']['q50']:.6g}, "
              f"{summary['lowfreq']}x{summary['lowfreq']} low-frequency median {lv['bounds_lowfreq']['q50']:.6g}; "
              f"accuracy clean {lv['utility']['clean']:.4f}, dithered {lv['utility']['dithered']:.4f}; "
              f"run {lv['run']}")
    print(f"report: {page}")
    print(f"summary: {root / 'sweep.json'}")
    return 0
