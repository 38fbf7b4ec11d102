"""``hcrfast dp``: DP-SGD reconstruction bounds on the command line.

``hcrfast dp table``  prints :func:`hcrfast.dp.report` over a parameter grid.
``hcrfast dp figure`` runs the linear-layer attack on real images over a sigma
grid and plots MSE, PSNR and NCC against the bounds (after Ziller et al.,
Figure 1).
"""
from __future__ import annotations

import argparse
import csv
import decimal
import itertools
import math
import os
import sys
from pathlib import Path

import numpy as np

from hcrfast import dp
from hcrfast.cli import float_literal, int_literal  # a float as typed: 1e-400 is not 0

_TABLE_COLUMNS = (
    "sigma", "C", "N", "T", "kappa", "sigma_eff", "mu",
    "worst_case_success", "mse", "psnr", "ncc", "psnr_finite_n", "ncc_finite_n", "data_range",
)
_DEFAULT_SIGMAS = tuple(float(s) for s in np.logspace(-2, 1, 13))
_PHOTO_PATCH = 64


def add_subparser(subparsers) -> None:
    """Register ``dp`` and its subcommands ``table`` and ``figure``."""
    parser = subparsers.add_parser(
        "dp",
        help="DP-SGD reconstruction bounds for a prior-free adversary",
        description="Reconstruction bounds for DP-SGD against a prior-free adversary "
        "(Ziller et al.; the formulas are in hcrfast.dp's docstrings).",
    )
    dp_sub = parser.add_subparsers(dest="dp_command", metavar="SUBCOMMAND")
    dp_sub.required = True

    table = dp_sub.add_parser(
        "table",
        help="bounds over a grid of (sigma, C, N, T, kappa)",
        description="One row per combination of the grid: the worst-case success "
        "bound, the MSE lower bound (on E[MSE]), and PSNR and NCC bounds. Which are rigorous: "
        "psnr bounds the PSNR of the expected MSE, 10 log10(R^2 T / C^2 sigma^2), not E[PSNR], which "
        "may exceed it by about 4.34/N dB; psnr_finite_n bounds E[PSNR]. ncc is the population "
        "(large-N) bound, which the mean sample Pearson coefficient may exceed by O(1/N) (about 3% "
        "at N = 10); ncc_finite_n bounds that mean rigorously, needs N >= 3 and reads nan below. "
        "Every quantity must be a normal float64: a sigma for which one is not (for C = T = 1, "
        "outside about 1.5e-154 .. 1.3e154, where C^2 sigma^2 / T leaves float64) is refused "
        "with the range that works for its C, N and T.",
    )
    # (action="extend": --sigma 1 --sigma 2 is both values, where the last flag alone was kept; the defaults
    # are filled in after parsing, as extend would add to a default list)
    table.add_argument("--sigma", type=float_literal, nargs="+", action="extend", required=True,
                       help="noise multiplier(s) sigma (the flag may be repeated)")
    table.add_argument("--C", type=float_literal, nargs="+", action="extend", default=None,
                       help="clipping norm(s) C (default 1)")
    table.add_argument("--N", type=int_literal, nargs="+", action="extend", required=True,
                       help="data dimension(s) N, e.g. 784 for 28x28 images")
    table.add_argument("--T", type=int_literal, nargs="+", action="extend", default=None,
                       help="number(s) of DP-SGD steps T (default 1; 1e4 reads as 10000)")
    table.add_argument("--kappa", type=float_literal, nargs="+", action="extend", default=None,
                       help="prior success probability(ies) kappa in (0, 1) (default 0.1)")
    table.add_argument("--data-range", type=float_literal, default=1.0,
                       help="max(X) - min(X) for PSNR (default 1, images in [0, 1])")
    table.add_argument("--format", choices=("table", "csv"), default="table",
                       help="aligned table or CSV (default table)")
    table.set_defaults(func=_run_table)

    figure = dp_sub.add_parser(
        "figure",
        help="empirical attack vs bounds over a sigma grid (PNG)",
        description="Simulate the linear-layer attack on real images (scikit-learn's "
        "digits, or patches of its two sample photographs) and plot MSE, PSNR and "
        "NCC against the bounds.",
    )
    figure.add_argument("--out", required=True, help="output PNG file")
    figure.add_argument("--source", choices=("digits", "photo"), default="digits",
                        help="digits (default): 8x8 handwritten digits in [0, 1]; photo: 64x64 "
                        "grayscale patches of scikit-learn's sample photographs")
    figure.add_argument("--sigmas", type=float_literal, nargs="+", action="extend", default=None,
                        help="noise multipliers to simulate (default 13 values, 1e-2..10; the flag may be repeated)")
    figure.add_argument("--n-images", type=int, default=None,
                        help="number of images (default 64 digits, or all 30 photo patches; at most 30 for photo)")
    figure.add_argument("--C", type=float_literal, default=1.0, help="clipping norm (default 1)")
    figure.add_argument("--T", type=int_literal, default=1, help="DP-SGD steps averaged (default 1)")
    figure.add_argument("--repeats", type=int, default=16,
                        help="independent noise draws per image and sigma (default 16)")
    figure.add_argument("--seed", type=int, default=0, help="seed of image choice and noise (default 0)")
    figure.add_argument("--dpi", type=int, default=150, help="PNG resolution (default 150)")
    figure.set_defaults(func=_run_figure)


# --------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------
# The inputs echoed in each row: printed with every digit they have, so that distinct
# inputs never print alike (--kappa 0.999999999 read as 1 at 6 digits).
_INPUT_COLUMNS = frozenset({"sigma", "C", "kappa", "data_range"})
#: The bounds of the aligned table, by the direction their 6 digits round in: an upper bound up, a lower bound
#: down (to the nearest, 0.304213 printed a worst_case_success of 0.3042132564 below the API's value, and
#: -2.27887 a psnr upper bound of -2.278867).
_ROUNDED_UP = frozenset({"worst_case_success", "psnr", "ncc", "psnr_finite_n", "ncc_finite_n"})
_ROUNDED_DOWN = frozenset({"mse"})


def _format_value(value, exact: bool = False, column: str | None = None) -> str:
    """6 significant digits for the aligned table's results; every digit (the shortest repr that reads
    back as the same float64) for CSV, where 0.99999977 must not read as 1, and for the inputs of the
    aligned table, there without a trailing ``.0`` (``1``, ``255``, ``0.999999999``)."""
    if isinstance(value, (int, np.integer)):
        return str(value)
    if exact:
        return repr(float(value))
    if column in _INPUT_COLUMNS:
        text = repr(float(value))
        return text[:-2] if text.endswith(".0") else text
    text = f"{value:.6g}"
    up, down = column in _ROUNDED_UP, column in _ROUNDED_DOWN
    if not math.isfinite(value) or not (up or down):
        return text
    # past the value's own rounding (a few ulps: 30.000000000000004 still prints 30), 6 digits toward the side
    # the bound holds on
    off = float(text) - value if down else value - float(text)
    if off <= 4.0 * math.ulp(value):
        return text
    context = decimal.Context(prec=6, rounding=decimal.ROUND_CEILING if up else decimal.ROUND_FLOOR)
    return f"{float(context.plus(decimal.Decimal(float(value)))):.6g}"


def _run_table(args: argparse.Namespace) -> int:
    # Every row is computed before anything is printed, so a bad value fails
    # cleanly instead of leaving half a table on stdout.
    rows = [
        dp.report(sigma=sigma, C=C, N=N, T=T, kappa=kappa, data_range=args.data_range)
        for sigma, C, N, T, kappa in itertools.product(args.sigma, args.C or [1.0], args.N, args.T or [1],
                                                       args.kappa or [0.1])
    ]
    cells = [[_format_value(row[col], exact=args.format == "csv", column=col) for col in _TABLE_COLUMNS]
             for row in rows]
    if args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(_TABLE_COLUMNS)
        writer.writerows(cells)
        return 0
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(_TABLE_COLUMNS)]
    print("  ".join(col.rjust(w) for col, w in zip(_TABLE_COLUMNS, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return 0


# --------------------------------------------------------------------------
# figure
# --------------------------------------------------------------------------
def load_digits_images() -> np.ndarray:
    """scikit-learn's 8x8 handwritten digits (shipped, no download), in [0, 1]."""
    from sklearn.datasets import load_digits

    return load_digits().images.astype(np.float64) / 16.0


def load_photo_patches(patch: int = _PHOTO_PATCH) -> np.ndarray:
    """Grayscale ``patch`` x ``patch`` tiles of scikit-learn's two sample photographs.

    Each 427x640 photograph (shipped with scikit-learn) is converted to
    luminance (ITU-R 601 weights) in [0, 1], downsampled 2x by block means
    and cut into non-overlapping tiles: 15 tiles of 64x64 per photograph.
    """
    from sklearn.datasets import load_sample_images

    tiles = []
    for rgb in load_sample_images().images:
        gray = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) / 255.0
        h, w = (gray.shape[0] // 2) * 2, (gray.shape[1] // 2) * 2
        small = gray[:h, :w].reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))
        for i in range(small.shape[0] // patch):
            for j in range(small.shape[1] // patch):
                tiles.append(small[i * patch:(i + 1) * patch, j * patch:(j + 1) * patch])
    return np.stack(tiles)


def _choose_images(source: str, n_images: int | None, rng: np.random.Generator) -> np.ndarray:
    pool = load_digits_images() if source == "digits" else load_photo_patches()
    if n_images is None:  # the default: 64, or every photo patch there is
        n_images = min(64, len(pool))
    if not 1 <= n_images <= len(pool):
        raise ValueError(
            f"--n-images must be between 1 and {len(pool)} for --source {source}, got {n_images}"
        )
    return pool[np.sort(rng.choice(len(pool), size=n_images, replace=False))]


def _band(ax, x, values, color, label):
    """Mean over all attacks as a line, their 16-84 % range (about +-1 s.d.) as a band.

    Percentiles rather than mean +- s.d. so the band stays meaningful on log axes.
    """
    low, high = np.percentile(values, [16.0, 84.0], axis=1)
    ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
    ax.plot(x, values.mean(axis=1), "o-", color=color, markersize=3.5, label=label)


def _run_figure(args: argparse.Namespace) -> int:
    from hcrfast.report import _pyplot

    plt = _pyplot()   # figures of their own: the process's matplotlib backend stays as it was
    out = _figure_path(args.out)
    sigmas = np.sort(np.asarray(args.sigmas or _DEFAULT_SIGMAS, dtype=np.float64))
    for s in sigmas:
        # Validates sigma, C and T up front, and that C^2 sigma^2 / T is a normal float64.
        dp.effective_sigma(sigma=float(s), T=args.T)
        dp.mse_lower_bound(sigma=float(s), C=args.C, T=args.T)
    if args.dpi < 10:
        raise ValueError(f"dpi must be at least 10, got {args.dpi}")
    if args.repeats < 1:
        raise ValueError(f"repeats must be a positive number of noise draws, got {args.repeats}")
    if args.seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {args.seed} (--seed)")

    root = np.random.SeedSequence(args.seed)
    image_seed, *noise_seeds = root.spawn(1 + len(sigmas))
    images = _choose_images(args.source, args.n_images, np.random.default_rng(image_seed))
    n_images, N = images.shape[0], images[0].size
    flat = images.reshape(n_images, -1)
    norms = np.linalg.norm(flat, axis=1)
    beta = 1.0 / np.maximum(1.0, norms / args.C)
    mean_square = np.mean(flat**2, axis=1)

    # Each image attacked `repeats` times per sigma: the mean curve then has a
    # small Monte Carlo error and the band shows the spread of single attacks.
    attacked = np.repeat(images, args.repeats, axis=0)
    mse = np.empty((len(sigmas), len(attacked)))
    psnr, ncc = np.empty_like(mse), np.empty_like(mse)
    for k, (sigma, noise_seed) in enumerate(zip(sigmas, noise_seeds)):
        recon = dp.simulate_attack(attacked, sigma=float(sigma), C=args.C, T=args.T,
                                   seed=np.random.default_rng(noise_seed))
        m = dp.attack_metrics(attacked, recon)
        mse[k], psnr[k], ncc[k] = m.mse, m.psnr, m.ncc

    # All images here lie in [0, 1], so R = 1 bounds every image's max - min.
    data_range = 1.0
    mse_bound = np.array([dp.mse_lower_bound(sigma=s, C=args.C, T=args.T) for s in sigmas])
    mse_closed = np.array([
        np.mean([dp.expected_mse(sigma=s, C=args.C, T=args.T, beta=b, mean_square=q)
                 for b, q in zip(beta, mean_square)])
        for s in sigmas
    ])
    psnr_bound = np.array([dp.psnr_upper_bound(sigma=s, C=args.C, T=args.T,
                                               data_range=data_range, N=N) for s in sigmas])
    ncc_bound = np.array([dp.ncc_upper_bound(sigma=s, N=N, T=args.T) for s in sigmas])
    ncc_free = np.array([dp.ncc_upper_bound(sigma=s, T=args.T) for s in sigmas])
    ncc_rigorous = np.array([dp.ncc_upper_bound(sigma=s, N=N, T=args.T, finite_n=True) for s in sigmas])

    emp, bnd = "tab:blue", "tab:red"
    label = f"attack: mean, 16–84 % band\n({n_images} images × {args.repeats} noise draws)"
    jensen = psnr_bound[0] - dp.psnr_upper_bound(sigma=sigmas[0], C=args.C, T=args.T,
                                                 data_range=data_range)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), constrained_layout=True)
    t_note = "" if args.T == 1 else f"/{args.T}"

    ax = axes[0]
    _band(ax, sigmas, mse, emp, label)
    ax.plot(sigmas, mse_closed, ":", color="black", linewidth=1.2,
            label="closed form $(1-\\beta)^2\\overline{x^2} + C^2\\sigma^2" + t_note + "$")
    ax.plot(sigmas, mse_bound, "--", color=bnd, linewidth=1.8,
            label=f"lower bound $C^2\\sigma^2{t_note}$")
    ax.set_yscale("log")
    ax.set_ylabel("MSE (lower is a better attack)")
    ax.set_title("MSE  ≥  bound")

    ax = axes[1]
    _band(ax, sigmas, psnr, emp, label)
    ax.plot(sigmas, psnr_bound, "--", color=bnd, linewidth=1.8,
            label=f"upper bound $10\\log_{{10}}(R^2{'T' if args.T > 1 else ''}/C^2\\sigma^2)$"
                  f" + {jensen:.2g} dB,\nR = 1 (finite-N Jensen term)")
    ax.set_ylabel("PSNR (dB)")
    ax.set_title("PSNR  ≤  bound")

    ax = axes[2]
    _band(ax, sigmas, ncc, emp, label)
    ax.plot(sigmas, ncc_rigorous, "--", color=bnd, linewidth=1.8,
            label=f"upper bound on the mean NCC,\nexact at N = {N} (clipping limit)")
    ax.plot(sigmas, ncc_bound, ":", color="black", linewidth=1.2,
            label=f"population $\\sqrt{{1/(1+N\\sigma^2{t_note})}}$,\nwhich the mean may exceed by O(1/N)")
    ax.plot(sigmas, ncc_free, "-.", color="tab:gray", linewidth=1.2,
            label=f"data-free population $\\sqrt{{1/(1+\\sigma^2{t_note})}}$")
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("NCC (Pearson correlation)")
    ax.set_title("NCC  ≤  bound")

    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("noise multiplier $\\sigma$")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="best")

    source = {"digits": "sklearn digits (8×8)", "photo": f"sample-photo patches ({_PHOTO_PATCH}×{_PHOTO_PATCH})"}
    fig.suptitle(
        f"Linear-layer reconstruction under DP-SGD: {source[args.source]}, N = {N}, "
        f"C = {args.C:g}, T = {args.T}; {int(np.sum(beta < 1))}/{n_images} images clipped",
        fontsize=11,
    )
    fig.savefig(out, dpi=args.dpi)
    plt.close(fig)
    print(f"wrote {out}")
    return 0


def _figure_path(out: str) -> Path:
    """Where ``--out`` writes, checked before the attacks run: ``.png`` added to a name without a
    suffix (as matplotlib would, so the printed path is the written one), never a folder, its folder there."""
    path = Path(out)
    if path.is_dir() or os.fspath(out).endswith(("/", os.sep)):  # Path() drops the separator that names a folder
        raise ValueError(f"--out {out} {'is' if path.is_dir() else 'names'} a folder; pass a file name, e.g. "
                         f"{path / 'dp_figure.png'}")
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    from matplotlib.backend_bases import FigureCanvasBase

    # (matplotlib picks the format from the suffix, in any case; one it cannot write fails after the attacks)
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        common = [f".{f}" for f in ("png", "pdf", "svg") if f in formats]
        others = [f".{f}" for f in sorted(formats) if f".{f}" not in common]
        raise ValueError(f"--out {out}: matplotlib writes no {path.suffix} files; pass a name ending in one of "
                         f"{', '.join(common + others)} (no suffix: .png)")
    if not path.parent.is_dir():
        raise ValueError(f"--out {out}: the folder {path.parent} does not exist; create it or pass another path")
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"--out {out}: cannot write to {path.parent}; pass a path you can write to")
    return path
