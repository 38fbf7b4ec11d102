"""Figures and the HTML page of ``hcrfast reproduce`` (METHOD.md §3, "Figures").

* ``hist_all.png``, ``hist_lowfreq.png``: histograms (256 bins) of the
  max-over-restarts bounds, all DCT modes and the ``lowfreq``×``lowfreq``
  lowest modes of every channel. Infinite bounds (D = 0) cannot be placed on an
  axis: they are left out and counted in the title.
* ``reconstructions.png``: an original and two "reconstructions" per example:
  to the DCT of the normalized image add a Rademacher (±1) sign times the bound,
  invert the DCT, undo the normalization, clip to [0, 1]. An unbiased estimator
  whose error had the size of the bound would look like this.
* ``bound_images.png``: the inverse DCT of the bounds, averaged over channels,
  per example, on one colour scale.
* ``bound_modes.png``: the median bound of every DCT mode over the examples, on a log colour
  scale; medians of 0 and of +inf in colours of their own, counted in a legend.
* ``report.html``: the numbers of ``summary.json`` and every figure on one page,
  plain HTML and CSS (no JavaScript), figures by relative path.
"""
from __future__ import annotations

import html
import shlex
import math
from pathlib import Path

import numpy as np

from hcrfast.kernels import dct2, idct2
from hcrfast.krylov import MAX_STEPS
from hcrfast.results import targets_baseline

__all__ = ["reconstructions", "write_figures", "write_html"]

_N_SHOW = 8
_RECON_STREAM = 0x7265636F  # "reco": the sign draws, apart from every noise stream of a run


class _Canvas:
    """The three of pyplot's calls the figures use, on figures of their own: a ``matplotlib.figure.Figure`` draws
    to a file through the Agg canvas it is given, without pyplot. ``matplotlib.use("Agg")`` switched the whole
    process's backend: after ``hcrfast.cli.main([...])`` (or a report) in a notebook or an interactive session,
    ``plt.show()`` showed nothing; and pyplot's figures live on in its registry until closed."""

    @staticmethod
    def subplots(nrows: int = 1, ncols: int = 1, *, figsize, squeeze: bool = True, **figure_kw):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize, **figure_kw)
        FigureCanvasAgg(fig)
        return fig, fig.subplots(nrows, ncols, squeeze=squeeze)

    @staticmethod
    def close(fig) -> None:
        fig.clear()

    @staticmethod
    def Rectangle(*args, **kwargs):  # noqa: N802 - pyplot's name
        from matplotlib.patches import Rectangle

        return Rectangle(*args, **kwargs)


def _pyplot() -> _Canvas:
    """The figures' drawing calls, which leave matplotlib's backend and pyplot's figures as they were."""
    return _Canvas()


# ----------------------------------------------------------------------------------------
# the maths of the figures


def reconstructions(images: np.ndarray, std: np.ndarray, normalization, rng: np.random.Generator) -> np.ndarray:
    """One "reconstruction" per image: ``clip(unnormalize(idct2(dct2(normalize(x)) + s·b)), 0, 1)``.

    Parameters
    ----------
    images : (B, C, H, W) array in [0, 1]
    std : (B, C, H, W) array
        Bounds on the DCT coefficients of the normalized images; must be finite.
    normalization : ((mean per channel), (std per channel))
    rng : numpy Generator
        Draws the Rademacher signs s.
    """
    mean = np.asarray(normalization[0], dtype=np.float64).reshape(-1, 1, 1)
    scale = np.asarray(normalization[1], dtype=np.float64).reshape(-1, 1, 1)
    xn = (images.astype(np.float64) - mean) / scale
    signs = rng.choice(np.array([-1.0, 1.0]), size=std.shape)
    rec = idct2(dct2(xn) + signs * std) * scale + mean
    return np.clip(rec, 0.0, 1.0)


def bound_images(std: np.ndarray) -> np.ndarray:
    """Inverse DCT of the bounds, averaged over channels: (B, H, W)."""
    return idct2(std).mean(axis=1)


# ----------------------------------------------------------------------------------------
# figures


def _histogram(path: Path, values: np.ndarray, *, title: str, xlabel: str) -> dict:
    plt = _pyplot()
    values = values.ravel()
    finite = values[np.isfinite(values)]
    n_inf = int(values.size - finite.size)
    positive = finite[finite > 0]
    n_zero = int(finite.size - positive.size)
    # log-x when the bounds are positive and span more than a decade (they usually span several).
    log_x = positive.size > 0 and positive.max() > 10 * positive.min()
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    shown = positive if log_x else finite
    if shown.size and not shown.any():
        ax.text(0.5, 0.5, f"all {shown.size:,} finite bounds are 0: they bound nothing", ha="center", va="center",
                transform=ax.transAxes)
    elif shown.size:
        if log_x:
            bins = np.logspace(np.log10(shown.min()), np.log10(shown.max()), 257)
            ax.set_xscale("log")
            _plain_log_ticks(ax, shown.max() / shown.min())
        else:
            bins = 256
        ax.hist(shown, bins=bins, color="tab:blue")
        med = float(np.median(shown))  # of what is drawn: a median of 0 has no place on a log axis
        ax.axvline(med, color="tab:red", linestyle="--", linewidth=1.2,
                   label=f"median {med:.3g}" + (" (of the values shown)" if shown.size < finite.size else ""))
        ax.legend(loc="upper right", fontsize=9)
    else:
        ax.text(0.5, 0.5, "no finite bounds to show", ha="center", va="center", transform=ax.transAxes)
    notes = [f"{shown.size:,} values"]
    if n_inf:
        notes.append(f"{n_inf:,} infinite (D = 0) left out")
    if log_x and n_zero:
        notes.append(f"{n_zero:,} zeros left out (log axis)")
    ax.set_title(f"{title}\n" + "; ".join(notes), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count (256 bins)")
    ax.grid(True, alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"infinite_left_out": n_inf, "zeros_left_out": n_zero if log_x else 0, "log_x": bool(log_x)}


def _plain_log_ticks(ax, span: float, axis: str = "x") -> None:
    """Tick labels 0.5, 1, 2, 5, 10 rather than 5×10⁻¹ ... on a log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    which = ax.xaxis if axis == "x" else ax.yaxis
    which.set_major_formatter(plain)
    if span < 300:  # under ~2.5 decades there is room to label 2 and 5 as well
        which.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        which.set_minor_formatter(plain)
    else:
        which.set_minor_formatter(NullFormatter())


def _panel_inches(side: int) -> float:
    """Inches per image panel: small images (8, 28, 32 pixels) small, ImageNet's 91 larger."""
    return 1.45 if side <= 32 else 2.0


def _wrap(text: str, fig) -> str:
    """Break a title to the figure's width (about 12 characters per inch at 9 pt)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(30, int(12 * fig.get_size_inches()[0]))))


def _show(ax, img: np.ndarray, **kwargs):
    """Draw a (C, H, W) image: grey for one channel, RGB for three."""
    if img.shape[0] == 1:
        return ax.imshow(img[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", **kwargs)
    return ax.imshow(np.transpose(img, (1, 2, 0)), interpolation="nearest", **kwargs)


def _infinite_panel(ax, text="bound = ∞\n(D = 0)"):
    ax.set_facecolor("0.85")
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=8)


def _clean_axes(ax):
    ax.set_xticks([])
    ax.set_yticks([])


def _reconstruction_figure(path, images, std, normalization, labels, show, seed):
    plt = _pyplot()
    rng = np.random.default_rng([seed, _RECON_STREAM])
    finite = np.isfinite(std[show]).reshape(len(show), -1).all(axis=1)
    safe = np.where(np.isfinite(std[show]), std[show], 0.0)
    draws = [reconstructions(images[show], safe, normalization, rng) for _ in range(2)]
    panel = _panel_inches(images.shape[-1])
    fig, axes = plt.subplots(3, len(show), figsize=(panel * len(show) + 1.2, 3 * panel + 0.6), squeeze=False,
                             constrained_layout=True)
    rows = ["original", "+ sign·bound\n(draw 1)", "+ sign·bound\n(draw 2)"]
    for j, i in enumerate(show):
        _show(axes[0, j], images[i])
        axes[0, j].set_title(f"#{i} (label {labels[i]})", fontsize=8)
        for r, rec in enumerate(draws, 1):
            if finite[j]:
                _show(axes[r, j], rec[j])
            else:
                _infinite_panel(axes[r, j])
        for r in range(3):
            _clean_axes(axes[r, j])
    for r, text in enumerate(rows):
        axes[r, 0].set_ylabel(text, fontsize=9)
    fig.suptitle(_wrap("Reconstructions at the bound: DCT of the normalized image + Rademacher sign × bound, "
                       "inverse DCT, unnormalized, clipped to [0, 1]", fig), fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bound_image_figure(path, std, show):
    plt = _pyplot()
    finite = np.isfinite(std[show]).reshape(len(show), -1).all(axis=1)
    imgs = bound_images(np.where(np.isfinite(std[show]), std[show], 0.0))
    ok = imgs[finite]
    # The inverse DCT of non-negative coefficients is signed: a diverging map centred at 0. The
    # DC and lowest modes add up at pixel (0, 0), which would dwarf everything else on a
    # max-scaled map: the scale stops at the 99th percentile of |value| and that corner saturates.
    hi = float(np.percentile(np.abs(ok), 99)) if ok.size else 1.0
    hi = hi if hi > 0 else 1.0
    lo = -hi
    panel = _panel_inches(std.shape[-1])
    fig, axes = plt.subplots(1, len(show), figsize=(panel * len(show) + 1.6, panel + 0.9), squeeze=False,
                             constrained_layout=True)
    im = None
    for j, i in enumerate(show):
        ax = axes[0, j]
        if finite[j]:
            im = ax.imshow(imgs[j], cmap="RdBu_r", vmin=lo, vmax=hi, interpolation="nearest")
        else:
            _infinite_panel(ax)
        ax.set_title(f"#{i}", fontsize=8)
        _clean_axes(ax)
    if im is not None:
        fig.colorbar(im, ax=axes[0, :].tolist(), shrink=0.9, label="normalized units", extend="both")
    fig.suptitle(_wrap("Bound images: inverse DCT of the bounds, averaged over channels (one colour scale, "
                       "clipped at the 99th percentile of |value|)", fig),
                 fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# bound_modes.png's colours for the modes the log colour scale cannot place: a median of 0 (it bounds nothing)
# and one of +inf (D = 0: no unbiased estimator there), each its own, neither in magma nor the cyan box's
_MODE_ZERO_COLOUR, _MODE_INFINITE_COLOUR = "0.72", "tab:blue"


def _modes_figure(path, std, lowfreq) -> dict:
    """``bound_modes.png``: the median over the examples of each DCT mode's bound, channels averaged, on a log
    colour scale; modes whose median is 0 or +inf, which that scale cannot place, in colours of their own,
    counted in a legend, and a note on the axes where no mode's median is finite and above 0.

    Returns the figure's texts (``title``, ``notes`` on the axes, ``legend``) and the counts ``zero_modes``,
    ``infinite_modes``, ``positive_modes``."""
    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    # median over examples of each mode, channels averaged; infinite bounds count as large values in the
    # median (a median is still defined), a mode infinite where a channel's median is
    per_mode = np.median(std, axis=0).mean(axis=0)
    infinite, zero = np.isinf(per_mode), per_mode == 0
    positive = np.isfinite(per_mode) & (per_mode > 0)
    counts = {"zero_modes": int(zero.sum()), "infinite_modes": int(infinite.sum()),
              "positive_modes": int(positive.sum())}
    fig, ax = plt.subplots(figsize=(4.6, 4.4), constrained_layout=True)
    if positive.any():
        from matplotlib.colors import LogNorm
        from matplotlib.ticker import FuncFormatter

        values = per_mode[positive]
        im = ax.imshow(np.where(positive, per_mode, np.nan), cmap="magma",
                       norm=LogNorm(vmin=values.min(), vmax=values.max()), interpolation="nearest")
        fig.colorbar(im, ax=ax, label="median bound (normalized units)", format=FuncFormatter(lambda v, _: f"{v:g}"))
    handles = []
    for mask, colour, label in ((zero, _MODE_ZERO_COLOUR, f"median 0 (bounds nothing): {counts['zero_modes']:,}"),
                                (infinite, _MODE_INFINITE_COLOUR,
                                 f"median +∞ (D = 0): {counts['infinite_modes']:,}")):
        if mask.any():
            ax.imshow(np.ma.masked_where(~mask, np.ones(mask.shape)), cmap=ListedColormap([colour]), vmin=0,
                      vmax=1, interpolation="nearest")
            handles.append(Patch(facecolor=colour, edgecolor="black", linewidth=0.5, label=label))
    notes = []
    if not positive.any():
        kinds = [f"{n:,} {what}" for n, what in ((counts["zero_modes"], "are 0 (they bound nothing)"),
                                                 (counts["infinite_modes"], "are +∞ (D = 0)")) if n]
        notes.append(f"No mode's median bound is\nfinite and above 0: of the {per_mode.size:,} modes,\n"
                     + ",\n".join(kinds) + "\n(nothing for a colour scale)")
        ax.text(0.5, 0.5, notes[0], ha="center", va="center", fontsize=8, transform=ax.transAxes,
                bbox=dict(facecolor="white", edgecolor="0.5", alpha=0.9))
    H, W = per_mode.shape
    ax.add_patch(plt.Rectangle((-0.5, -0.5), min(lowfreq, W), min(lowfreq, H), fill=False, edgecolor="cyan",
                               linewidth=1.5))
    ax.set_xlabel("horizontal frequency k_w")
    ax.set_ylabel("vertical frequency k_h")
    title = f"Median bound per DCT mode\ncyan: the {lowfreq}×{lowfreq} low-frequency block"
    ax.set_title(title, fontsize=9)
    legend = None
    if handles:   # below the axes: over the image it would hide modes
        legend = fig.legend(handles=handles, loc="outside lower center", fontsize=8, ncols=1,
                            title="modes off the colour scale", title_fontsize=8)
    texts = {"title": ax.get_title(), "notes": [t.get_text() for t in ax.texts],
             "legend": [] if legend is None else [t.get_text() for t in legend.get_texts()], **counts}
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return texts


def write_figures(out, *, images, std, normalization, lowfreq, labels, seed, name) -> dict:
    """Write every PNG into ``out``; return ``{figure: {"file": name, ...notes}}``.

    Parameters
    ----------
    images : (N, C, H, W) array in [0, 1], the evaluated examples
    std : (N, C, H, W) array, the bounds on the DCT of the normalized images
    normalization : ((mean per channel), (std per channel))
    lowfreq : int, side of the low-frequency block
    labels : (N,) int array
    seed : int, seeds the sign draws of the reconstructions
    name : str, the experiment (titles)
    """
    out = Path(out)
    figures = {}
    notes = _histogram(out / "hist_all.png", std, title=f"{name}: HCR bounds, all {std[0].size} DCT modes",
                       xlabel="bound on the std of an unbiased estimator (normalized units)")
    figures["hist_all"] = {"file": "hist_all.png", **notes}
    low = std[:, :, :lowfreq, :lowfreq]
    notes = _histogram(out / "hist_lowfreq.png", low,
                       title=f"{name}: HCR bounds, {lowfreq}×{lowfreq} lowest DCT modes per channel",
                       xlabel="bound on the std of an unbiased estimator (normalized units)")
    figures["hist_lowfreq"] = {"file": "hist_lowfreq.png", **notes}
    show = list(range(min(_N_SHOW, std.shape[0])))
    _reconstruction_figure(out / "reconstructions.png", images, std, normalization, labels, show, seed)
    figures["reconstructions"] = {"file": "reconstructions.png", "examples": show}
    _bound_image_figure(out / "bound_images.png", std, show)
    figures["bound_images"] = {"file": "bound_images.png", "examples": show}
    _modes_figure(out / "bound_modes.png", std, lowfreq)
    figures["bound_modes"] = {"file": "bound_modes.png"}
    return figures


# ----------------------------------------------------------------------------------------
# HTML

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.warn { background: #fff3cd; border: 2px solid #e0a800; padding: 0.6em 1em; font-weight: bold; }
.note { color: #555; font-size: 0.92em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.92em; }
code { background: #f5f5f5; padding: 0 0.2em; }
"""


def _baseline(targeted: dict) -> str:
    """What a run's targeted gains are over (``baseline``, absent from runs made before the singular steps)."""
    return targeted.get("baseline", targets_baseline(0))


def _share(value) -> str:
    """A fraction as a percentage; "n/a" where summary.json holds null (a statistic over nothing)."""
    return "n/a" if value is None else f"{value:.1%}"


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isinf(v):
            return "∞"
        return f"{v:.4g}"
    return str(v)


def _computed_with(run) -> str:
    """The versions the chunks record (summary.json's ``run``, :func:`hcrfast.results.merged_run`): theirs where
    they agree, each set seen where they differ, or that a chunk recorded none."""
    if not isinstance(run, dict) or "versions" not in run:
        return "not recorded (a summary written before runs recorded them)"

    def said(versions):
        if versions is None:
            return "not recorded (chunks written before chunks recorded them)"
        return ", ".join(f"{name} {value}" for name, value in versions.items() if value is not None)

    if run["versions"] is not None:
        return said(run["versions"]) + " (every chunk)"
    seen = (run.get("differ") or {}).get("versions") or [None]
    return f"the chunks differ, {len(seen)} sets: " + "; ".join(f"({said(v)})" for v in seen)


def _table(rows, header=None) -> str:
    e = html.escape
    parts = ["<table>"]
    if header:
        parts.append("<tr>" + "".join(f'<th class="{"l" if i == 0 else ""}">{e(h)}</th>'
                                      for i, h in enumerate(header)) + "</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f'<td class="{"l" if i == 0 else ""}">{e(_fmt(c))}</td>'
                                      for i, c in enumerate(row)) + "</tr>")
    parts.append("</table>")
    return "\n".join(parts)


def _device_row(s: dict) -> str:
    """Where the bounds were computed: the arithmetic the chunks record (on the CPU with torch's thread count
    then), not this run's alone, which may have read every chunk back with other ``--threads``."""
    now = s["device"]
    chunks = [a for a in s.get("chunks_arithmetic") or [] if a != "not recorded"]
    if not chunks or chunks == [now]:
        return now
    if len(chunks) == 1:
        return f"bounds computed on {chunks[0]}; this run: {now}"
    return (f"bounds computed on {'; '.join(chunks)} (chunks of different arithmetic: they agree to rounding, "
            f"not bitwise); this run: {now}")


def _steps_bounding(s: dict) -> str:
    """Which certified steps a reproduce run's bounds are the largest over, as its summary says they ran
    (``iterates``, absent before it was kept: the last; ``singular_steps``; ``targeted``)."""
    steps = (f"every iterate ε(1) … ε({s['iterations']}) of each of the R = {s['restarts']:,} restarts"
             if s.get("iterates", "last") == "all"
             else f"the last iterate ε({s['iterations']}) of each of the R = {s['restarts']:,} restarts")
    more = ([f"{s['singular_steps']:,} singular steps per example (each direction with both signs)"]
            if s.get("singular_steps") else []) + (["the targeted steps"] if s.get("targeted") else [])
    return ("Each bound is the largest, per mode, over " + ", ".join([steps] + more[:-1])
            + (f" and {more[-1]}" if more else ""))


def _best_step(s: dict) -> str:
    """The step whose eq. (6) a reproduce run reports: Algorithm 1's largest, the singular steps aside."""
    return ("step with the largest (of any restart and iterate)" if s.get("iterates", "last") == "all"
            else "best restart")


def write_html(path, summary: dict, figures: dict) -> Path:
    """Write ``report.html``: the summary's numbers and the figures (relative paths)."""
    e = html.escape
    s = summary
    path = Path(path)
    body = [f"<h1>hcrfast reproduce {e(s['experiment'])}</h1>"]
    if not s.get("trained_weights", s.get("published_weights", True)):  # its name before 2026-11-23
        body.append(f'<p class="warn">The model is not the published one: {e(s["weights"])}. '
                    f"The bounds and accuracies below are NOT the paper's.</p>")
    tg = s.get("targeted")
    if tg:
        g = tg["gain_over_algorithm1_all_modes"]
        body.append(f"<p>Targeted bounds ({html.escape(str(tg['targets']))}): the Cramér–Rao direction of each targeted "
                    f"mode, certified, bounds its own mode and every other it moves: together they lifted "
                    f"{tg['modes_lifted_fraction']:.1%} of all bounds above {html.escape(_baseline(tg))}; gain "
                    f"(bound / that bound) over all modes: median {_fmt(g['q50'])}, 95% {_fmt(g['q95'])}"
                    f"{_gain_pairs_left_out(g)}.</p>")
    if s.get("singular_steps"):
        lifted = s.get("singular_steps_lifted")   # absent from runs made before it was kept
        if lifted:   # the (example, mode) bounds of the examples that took them
            modes = (s["bounds"]["finite"] + s["bounds"]["infinite"]) // max(1, s["examples"])
            total = lifted["examples"] * modes
        fewest = ((lifted or {}).get("directions") or {}).get("fewest", s["singular_steps"])
        body.append(f"<p>Each example's bounds include {s['singular_steps']:,} certified steps along J's smallest "
                    f"singular directions (--singular-steps; each direction with both signs), each bounding every mode "
                    f"it moves"
                    + (f" (an example had as few as {fewest:,} such directions: the rest, past its rank or its Krylov "
                       f"bases' kept vectors, are steps of 0 and bound nothing)" if fewest < s["singular_steps"]
                       else "")
                    + (f": they raised {lifted['modes_lifted']:,} of the {total:,} (example, mode) bounds above "
                       f"Algorithm 1's ({lifted['modes_lifted'] / max(1, total):.1%}; {lifted['seconds']:.1f} s)"
                       if lifted else "") + ".</p>")
        if s.get("solver") == "dense" and fewest < s["singular_steps"]:   # J's rank, where below the steps asked for
            body.append(f"<p>J's rank was as low as {fewest:,} at an example, below its inputs: J has a local null "
                        f"space there. Every step above lies in J's row space; steps along the null space move the "
                        f"features only at second order or by rounding, so the modes with a component there can have "
                        f"far larger bounds than these (+inf where the features ignore the step), which "
                        f"<code>hcrfast.targeted_bound(..., null_probes=True)</code> certifies.</p>")
    inf = s["infinite"]
    if inf["coordinates"]:
        targeted = inf.get("targeted_steps", 0)
        body.append(f'<p class="warn">{inf["coordinates"]:,} bounds ({inf["fraction"]:.3%}) are infinite, from '
                    f'{inf["restarts_with_zero_divergence"]:,} restarts'
                    + (f" and {targeted:,} targeted (example, mode) steps" if targeted else "")
                    + f' in {inf["examples_affected"]:,} examples: '
                    f"{e(inf['reason'])}. They are left out of the histograms and quantiles.</p>")
    zero = s.get("zero_steps") or {}
    if zero.get("restarts"):
        body.append(f'<p class="warn">{zero["restarts"]:,} restarts in {zero["examples_affected"]:,} examples bound '
                    f'nothing (0) by their last iterate: {e(zero["reason"])}.</p>')
    rounding = s.get("rounding") or {}
    if rounding.get("restarts"):
        body.append(f'<p class="warn">{rounding["restarts"]:,} restarts are exact only to float64\'s rounding: '
                    f'{e(rounding["reason"])} (~{rounding["worst_relative_error"]:.1g}).</p>')
    if rounding.get("dtype_drift"):
        body.append(f'<p class="warn">{rounding["dtype_drift"]:,} restarts\' steps followed the model\'s rounding: '
                    f'{e(rounding["dtype_drift_reason"])} (up to {rounding["worst_dtype_drift"]:.2g}).</p>')
    if rounding.get("singular_steps"):
        body.append(f'<p class="warn">{rounding["singular_steps"]:,} singular steps (counted apart from the restarts) '
                    f'are likewise exact only to float64\'s rounding '
                    f'(~{rounding.get("worst_relative_error_singular", 0.0):.1g}).</p>')
    body.append(
        f"<p>Hammersley-Chapman-Robbins lower bounds on the standard deviation of any unbiased "
        f"estimator of the {e(s['bounds_on'])}, given the features released with Gaussian noise of "
        f"standard deviation σ added (“dithering”). The images are normalized as (x − mean)/std with "
        f"mean {e(_fmt_list(s['normalization']['mean']))} and std "
        f"{e(_fmt_list(s['normalization']['std']))}; a bound times its channel's std is in the units "
        f"of the [0, 1] image (the MSE bound, per coordinate, in squared normalized units). Each bound is "
        f"certified: the feature shift of its perturbation is recomputed by float64 forward passes, never "
        f"taken from the linear approximation. It holds for every unbiased estimator; a biased one (using a "
        f"prior over the images, say) can do better.</p>")
    med, med_px = s["bounds"].get("q50"), s.get("bounds_pixel_units", {}).get("q50")
    if med is not None and med_px is not None:
        n_zero, n_all = s["bounds"].get("zero", 0), s["bounds"]["finite"] + s["bounds"]["infinite"]
        body.append(f"<p><b>Median bound: {med:.4g} (normalized units) = {med_px:.4g} in [0, 1] pixel "
                    f"units.</b>"
                    + (f" That is {med_px:.3g}× the pixels' whole range: no unbiased estimator comes near the "
                       f"images, but a biased one (one that clips to [0, 1], or uses a prior over the images) can."
                       if math.isfinite(med_px) and med_px > 1.0 else "")
                    + (f' <span class="warn">{n_zero:,} of the {n_all:,} bounds are 0, which bounds nothing '
                       f'(among the quantiles below, as the valid lower bounds they are; see the restarts that '
                       f'bound nothing above).</span>' if n_zero else "")
                    + f" Clean accuracy {s['accuracy']['clean']:.3f}; with the noise "
                    f"{s['accuracy']['dithered']:.3f}.</p>")
    body.append(f"<p class=\"note\">Command: <code>{e(_rerun_line(s) if s.get('command') else '')}</code></p>")

    body.append("<h2>Run</h2>")
    lsqr = s["lsqr_options"]
    dense = s.get("solver") == "dense"
    body.append(_table([
        ("experiment", s["experiment"]),
        ("weights", s["weights"]),
        ("examples", s["examples"]),
        ("restarts R", s["restarts"]),
        ("iterations i", s["iterations"]),
        ("start size s", s["size"]),
        ("limit setting", s["limit"]),
        ("σ = scale × RMS", f"{s['sigma_scale']:g} × {s['rms']:.4g} = {s['sigma']:.4g}"),
        ("seed", s["seed"]),
        ("linearization point", s["linearize_at"]),
        ("steps that bound", "every iterate ε(1) … ε(i) of each restart, each certified (the largest bound per mode)"
         if s.get("iterates", "last") == "all" else "each restart's last iterate ε(i) (the paper's Algorithm 1)"),
        ("solver", "dense: J built and factored once per example, every step exact" if dense
         else ("krylov: one reorthogonalized LSQR per example keeps its Krylov basis; every step projected on it"
               if (s.get("krylov_pilots") or 1) == 1 else
               f"krylov: {s['krylov_pilots']} reorthogonalized LSQRs (pilots) per example keep their Krylov bases; "
               f"restart r's steps projected on pilot r mod {s['krylov_pilots']}'s")
         if s.get("solver") == "krylov"
         else f"LSQR, {'warm' if s.get('warm_start', True) else 'cold'} starts"),
        ("LSQR atol / btol / iter_lim",
         "not used" if dense else
         f"{lsqr['atol']:g} / {lsqr['btol']:g} / "
         + (str(lsqr["iter_lim"]) if lsqr["iter_lim"] is not None
            else f"{MAX_STEPS} basis steps (never more than min(features, inputs))" if s.get("solver") == "krylov"
            else "2 × the inputs (SciPy's cap)")),
        ("chunks × examples per chunk", f"{s['chunks']} × {min(s['chunk_examples'], s['examples'])}"),
        ("processes", s["world_size"]),
        ("device", _device_row(s)),
    ]))

    acc = s["accuracy"]
    draws = acc["dithered_per_draw"]
    body.append("<h2>Accuracy</h2>")
    body.append(_table([
        ("clean features", acc["clean"]),
        (f"dithered features (mean over {len(draws)} noise draws)", acc["dithered"]),
        ("dithered, worst / best draw", f"{min(draws):.4g} / {max(draws):.4g}"),
    ], header=("", "accuracy")))

    body.append("<h2>Bounds</h2>")
    q = ("q5", "q25", "q50", "q75", "q95")
    rows = []
    for label, d in (("all DCT modes", s["bounds"]),
                     ("all DCT modes, in [0, 1] pixel units (× channel std)", s.get("bounds_pixel_units", {})),
                     (f"{s['lowfreq']}×{s['lowfreq']} low-frequency block", s["bounds_lowfreq"]),
                     ("MSE bound per example (eq. 6)", s["mse_bound"]),
                     ("MSE bound per example from the per-mode bounds, (1/p) Σ std²", s.get("mse_bound_modes", {})),
                     ("divergence D per restart that bounds something", s["divergence"])):
        rows.append((label, *(d.get(k) for k in q), d.get("finite"), d.get("infinite")))
    body.append(_table(rows, header=("", "5%", "25%", "50%", "75%", "95%", "finite", "infinite")))
    body.append(f'<p class="note">Quantiles over the finite values. {e(_steps_bounding(s))}; the MSE bound of '
                f"eq. 6 is (1/p)‖ε‖²/D of the {_best_step(s)}, and the one from the per-mode bounds (each mode's "
                f"variance is at least its bound squared) is at least as large.</p>")

    for key, caption in (
        ("hist_all", "Histogram of all bounds (256 bins)."),
        ("hist_lowfreq", (f"Histogram of the bounds of the {s['lowfreq']}×{s['lowfreq']} lowest DCT modes "
                          f"of every channel.")),
        ("bound_modes", "Median bound of every DCT mode over the examples (channels averaged)."),
        ("reconstructions", ("Top: the original image. Below: two draws of the DCT of the normalized image "
                             "plus a Rademacher (±1) sign times the bound, inverse DCT, unnormalized and "
                             "clipped to [0, 1]: what an estimate in error by the bound looks like.")),
        ("bound_images", "Inverse DCT of the bounds, averaged over channels (normalized units)."),
    ):
        if key not in figures:
            continue
        f = figures[key]
        extra = ""
        if f.get("infinite_left_out"):
            extra += f" {f['infinite_left_out']:,} infinite bounds are left out."
        if f.get("zeros_left_out"):
            extra += f" {f['zeros_left_out']:,} zero bounds are left out (log axis)."
        body.append(f'<figure><img src="{e(f["file"])}" alt="{e(key)}">'
                    f"<figcaption>{e(caption + extra)}</figcaption></figure>")

    ls = s["lsqr"]
    if dense:
        body.append("<h2>Solver</h2>")
        body.append(f"<p>{ls['solves']} least-squares steps (examples × restarts × iterations), each solved "
                    f"exactly as J⁺z̃ from one float64 factorization of every example's Jacobian: no LSQR ran.</p>")
    elif s.get("solver") == "krylov":
        body.append("<h2>Solver</h2>")
        pilots = s.get("krylov_pilots") or 1
        body.append(f"<p>{ls['solves']} least-squares steps (examples × restarts × iterations). "
                    + ("One reorthogonalized LSQR per example (on restart 0's start vector) built a Krylov basis of "
                       "J; every step was then solved in that space" if pilots == 1 else
                       f"{pilots} reorthogonalized LSQRs per example (pilots: restarts 0..{pilots - 1}'s start "
                       f"vectors) each built a Krylov basis of J; restart r's steps were then solved in pilot "
                       f"r mod {pilots}'s space")
                    + f", with no further model product. Basis steps per {'example' if pilots == 1 else 'pilot'}: "
                    f"max {ls['iterations_max']}, {ls['iterations_total']} in all.</p>")
        body.append(_table([(f"istop {c}", ls["istop_meaning"][c], n) for c, n in ls["istop_counts"].items()],
                           header=("stop code", "meaning", "steps")))
    else:
        body.append("<h2>LSQR</h2>")
        body.append(_table([
            ("solves (examples × restarts × iterations)", ls["solves"]),
            ("iterations per solve: median / mean / max",
             f"{ls['iterations_median']:g} / {ls['iterations_mean']:.1f} / {ls['iterations_max']}"),
            ("iterations in total", ls["iterations_total"]),
        ]))
        body.append(_table([(f"istop {c}", ls["istop_meaning"][c], n) for c, n in ls["istop_counts"].items()],
                           header=("stop code", "meaning", "solves")))

    body.append("<h2>Timings and versions</h2>")
    t = s["timings"]
    v = s["versions"]
    body.append(_table([
        ("bound computation, all chunks (s)", t["bound_seconds_all_chunks"]),
        ("chunks computed by this run (all processes) / reused", f"{t['chunks_computed_this_run']} / {t['chunks_reused']}"),
        ("data loading and clean features (s)", t["data_and_features_seconds"]),
        ("figures (s)", t.get("figures_seconds")),
        ("wall time of this run (s)", t.get("wall_seconds_this_run")),
        # every version summary.json records (hcrfast --version's list: SciPy's LAPACK runs the dense solve)
        ("versions of this run", ", ".join(f"{name} {value}" for name, value in v.items() if value is not None)),
        # a resumed run read chunks back that other sessions computed: those sessions' versions, not this one's
        ("versions the bounds were computed with", _computed_with(s.get("run"))),
    ]))
    body.append('<p class="note">All numbers: <a href="summary.json">summary.json</a>. All arrays: '
                "<code>bounds.npz</code> (<code>std</code> (N, C, H, W) bounds; <code>mse</code>; "
                "<code>eps</code>, <code>z</code> of the best restart; <code>divergence</code> (N, R); "
                "<code>labels</code>; <code>lsqr_iterations</code>, <code>lsqr_istop</code> (N, R, i); "
                "<code>params</code> as JSON).</p>")

    page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>hcrfast reproduce {e(s['experiment'])}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
    from hcrfast.checkpoint import atomic_write_text

    atomic_write_text(Path(path), _utf8(page))
    return path


def _utf8(page: str) -> str:
    """``page`` with the bytes of a file name that is not UTF-8 (read by Python as lone surrogates) shown as
    ``\\xff``: the page says it is UTF-8, and is read back (its figures' names) as UTF-8."""
    return page.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _gain_pairs_left_out(g: dict) -> str:
    """What a median gain leaves out (:func:`hcrfast.reproduce._targeted_stats`; absent from runs before
    2026-12-01): the pairs lifted from a bound of 0 or to +inf, whose gain is infinite, and those +inf
    both ways."""
    if "pairs" not in g:
        return ""
    infinite = g["from_zero_baseline_lifted"] + g["to_infinite_by_targeted"]
    parts = [f"{g['finite']:,} of the {g['pairs']:,} (example, mode) pairs, whose baseline is finite and above 0"]
    if infinite:
        parts.append(f"{infinite:,} more were lifted from 0 or to +inf (an infinite gain)")
    if g["infinite_both"]:
        parts.append(f"{g['infinite_both']:,} were +inf without them")
    if g["from_zero_baseline_still_zero"]:
        parts.append(f"{g['from_zero_baseline_still_zero']:,} are 0 either way")
    return " (over " + "; ".join(parts) + ")"


def _attack_pairs(a: dict) -> tuple[bool, str]:
    """Which (input, mode) pairs an attack's ratios are over (:func:`hcrfast.compare`'s ``n_compared`` of
    ``n_modes``; the pairs whose bound is +inf or 0, or whose attack error is NaN, are left out):
    ``(True, "")`` where every pair was compared, ``(True, "over 48 of 80 pairs (32 with a bound of +inf
    left out)")`` where some were, ``(False, "no pair compared: all 80 bounds +inf")`` where none was, whose
    median and shares are NaN (summary.json: null). A summary from before the counts says nothing."""
    if "n_compared" not in a:
        return a.get("median") is not None and not math.isnan(a["median"]), ""
    n, kept = a["n_modes"], a["n_compared"]
    left = [(a["n_bound_infinite"], "+inf", "with a bound of +inf"), (a["n_bound_zero"], "0", "with a bound of 0"),
            (n - kept - a["n_bound_infinite"] - a["n_bound_zero"], "", "whose attack error is NaN")]
    left = [(k, value, what) for k, value, what in left if k]
    if kept == n:
        return True, ""
    if kept == 0:
        if len(left) == 1 and left[0][1]:
            return False, f"no pair compared: all {n:,} bounds {left[0][1]}"
        return False, f"no pair compared: of the {n:,} pairs, " + ", ".join(f"{k:,} {what}" for k, _, what in left)
    return True, (f"over {kept:,} of {n:,} pairs (" + ", ".join(f"{k:,} {what}" for k, _, what in left)
                  + " left out)")


def _attack_median_cell(a: dict) -> str:
    """A sweep table's attack median: its value and over which pairs (:func:`_attack_pairs`), or why none."""
    compared, pairs = _attack_pairs(a)
    if not compared:
        return f"– ({pairs})"
    return _fmt(a["median"]) + (f" {pairs}" if pairs else "")


def _finite_median(q: dict) -> str:
    """A median cell from :func:`hcrfast.reproduce._quantiles`: that of the finite values, with how many
    are +inf beside it (those are the strongest bounds, not missing ones), and ∞ where every one is."""
    if q.get("q50") is None:
        return "∞ (every input)" if q.get("infinite") else "–"
    return _fmt(q["q50"]) + (f" ({q['infinite']:,} of {q['finite'] + q['infinite']:,} inputs ∞)"
                             if q.get("infinite") else "")


def _infinite_sentence(coordinates: int, reasons: list) -> str:
    """How many bounds are +inf, and from how many certified steps (a step with D = 0 makes every mode it
    moves +inf, and each restart, iterate, singular or targeted step with D = 0 has a reason of its own)."""
    return (f"{coordinates:,} infinite bounds (D = 0: no unbiased estimator exists there), from "
            f"{len(reasons):,} step{'s' if len(reasons) != 1 else ''} that left the features unchanged")


def _fmt_list(values) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


# ----------------------------------------------------------------------------------------
# hcrfast bound's report (a user's own model: no labels, no normalization known)


def write_bound_report(out, summary: dict, std: np.ndarray) -> Path:
    """``report.html`` of ``hcrfast bound`` in ``out``, with its figures: the histogram of every bound and,
    in the DCT basis, the median bound per mode and the bound images of the first examples.

    ``std``: the bounds, (B, ...) as the inputs; the DCT figures take the last two axes as the image
    and every axis between them and the batch's as channels. Units: the model's inputs'.
    """
    e = html.escape
    out = Path(out)
    s = summary
    std = np.asarray(std, dtype=np.float64)
    figures = [("hist_all.png", "Every bound (example × mode): a histogram; infinite ones (D = 0) are counted "
                                "apart.")]
    _histogram(out / "hist_all.png", std, title=f"hcrfast bound: all {std[0].size:,} modes of {std.shape[0]:,} "
                                                f"inputs", xlabel="bound on the std of an unbiased estimator "
                                                                  "(the inputs' units)")
    dct = s["params"].get("basis") == "dct" and std.ndim >= 3
    if dct:
        images = std.reshape((std.shape[0], -1) + std.shape[-2:])
        low = min(8, *images.shape[-2:])
        _modes_figure(out / "bound_modes.png", images, low)
        figures.append(("bound_modes.png", "The median bound of each DCT mode over the inputs (channels "
                                           "averaged): low frequencies top left."))
        show = list(range(min(_N_SHOW, images.shape[0])))
        _bound_image_figure(out / "bound_images.png", images, show)
        figures.append(("bound_images.png", f"Bound images of the first {len(show)} inputs: the inverse DCT of "
                                            f"their bounds, channels averaged."))
    q = s["std"]
    body = [f"<h1>hcrfast bound {e(s['model'])}</h1>", _table(_run_rows(s) + [("bound seconds", s["bound_seconds"])]),
            "<h2>Bounds</h2>",
            "<p>Each number bounds from below the standard deviation of ANY unbiased estimator of that mode "
            "of the input, from the features dithered with the noise above (the Hammersley–Chapman–Robbins "
            "bound, certified by float64 forward passes).</p>",
            _table([("all modes", q.get("q5"), q.get("q25"), q.get("q50"), q.get("q75"), q.get("q95"),
                     q.get("infinite"), q.get("zero"))],
                   header=("", "5%", "25%", "median", "75%", "95%", "infinite", "zero (bound nothing)")),
            _table([("eq. (6), one ε", _finite_median(s["mse_bound"])),
                    ("from every mode's bound", _finite_median(s["mse_bound_modes"]))],
                   header=("bound on the MSE per coordinate, median over the inputs' finite bounds", "value"))]
    cal = s.get("calibration")
    if cal:
        what = ("per-mode bounds" if cal["statistic"] == "std" else "inputs' RMSE bounds") + (
            f" over the modes {cal['target_modes']}" if cal.get("target_modes") else "")
        verdict = ("met" if cal["met"] else "NOT met") + ("" if cal["within_rtol"] or not cal["met"]
                                                          else " (above the tolerance)")
        body += ["<h2>The noise: sigma searched for a target</h2>",
                 f"<p>The {cal['quantile']:g}-quantile of the {e(what)} had to reach {_fmt(cal['target_std'])}: "
                 f"{verdict}, at {_fmt(cal['scale'])} × the starting sigma, with {_fmt(cal['value'])}. Every sigma "
                 f"tried was one full certified bound of the inputs; the bounds above are those at the sigma "
                 f"found. {e(cal['note'][:1].upper() + cal['note'][1:])}.</p>",
                 _table([(i + 1, h["scale"], h["sigma"], h["statistic"], h["seconds"])
                         for i, h in enumerate(cal["history"])],
                        header=("call", "sigma / start", "sigma (RMS of the stds for one per feature)",
                                "statistic", "seconds"))]
    if s.get("targeted"):
        g = s["targeted"]["gain_over_algorithm1_all_modes"]
        body.append(f"<p>Targeted steps ({e(str(s['targeted']['targets']))}) lifted "
                    f"{s['targeted']['modes_lifted_fraction']:.1%} of the bounds above {e(_baseline(s['targeted']))}; "
                    f"gain over "
                    f"all modes: median {_fmt(g.get('q50'))}{_gain_pairs_left_out(g)}.</p>")
    sing = (s.get("params") or {}).get("singular_steps")
    if sing:
        fewest = (sing.get("directions") or {}).get("fewest", sing["count"])
        body.append(f"<p>Singular steps ({sing['count']:,} per example along J's smallest singular directions, "
                    f"each certified with both signs"
                    + (f"; an example had as few as {fewest:,} such directions: the rest, past its rank or its "
                       f"Krylov bases' kept vectors, are steps of 0 and bound nothing" if fewest < sing["count"]
                       else "")
                    + f") raised {sing['modes_lifted']:,} of the "
                    + (f"{sing['examples'] * int(np.prod(std.shape[1:])):,} " if "examples" in sing else "")
                    + "(example, mode) bounds.</p>")
    if s.get("infinite_reasons"):
        body.append(f"<p>{_infinite_sentence(q.get('infinite', 0), s['infinite_reasons'])}; the first: "
                    f"{e(s['infinite_reasons'][0])}</p>")
    if s.get("restarts_bounding_nothing"):
        body.append(f'<p class="note">{s["restarts_bounding_nothing"]:,} restarts bound nothing (0); '
                    f"summary.json's params['zero_step_reasons'] says why.</p>")
    if s.get("utility"):
        body += ["<h2>What the noise costs</h2>", _utility_paragraph(s)]
    found = s.get("accuracy_search")
    if found:
        alone = "the head alone on the dithered features" if s["head"].get("spec") else "the dithered features alone"
        body.append(f"<p>The sigma bounded is the largest the search found that keeps a dithered "
                    f"{e(_metric_label(s['utility']))} of at least {_fmt(found['min_accuracy'])}: "
                    f"{_fmt(found['scale'])} × the starting sigma" + ("" if found["above_scale"] is None else
                                f" (at {_fmt(found['above_scale'])} × it fell to {_fmt(found['above_accuracy'])})")
                    + f", after {len(found['history'])} sigmas tried, each {alone}, no bound. "
                      f"{e(found['note'][:1].upper() + found['note'][1:])}.</p>")
    a = s.get("attack")
    if a:
        compared, pairs = _attack_pairs(a)
        ratio = ((f"{pairs}, " if pairs else "") + f"median {_fmt(a['median'])} ({_share(a['fraction_below_1'])} "
                 f"below 1, where an efficient unbiased attacker at the bound would have "
                 f"{_share(a.get('fraction_below_1_efficient'))}; each mode's ratio for it: {_fmt(a['mc_band'][0])} "
                 f"to {_fmt(a['mc_band'][1])})")
        body += ["<h2>A real attacker beside the bounds</h2>",
                 f"<p>Gauss–Newton, {a['draws']} noisy draws per input from the {e(str(a['start']))}, "
                 f"{a['steps']} steps"
                 + (f": its error over the bound per mode, {e(ratio)}" if compared
                    else f"; {e(pairs)}, so there is no error over the bound to show")
                 + ". A biased attacker (one started at the "
                 "truth keeps it where the features say nothing) can beat the bound, which binds unbiased "
                 "ones only." + (f" {a['n_draws_unmoved']:,} draws took no step: their error is their start's, "
                                  f"and their ratios understate the attacker's." if a.get("n_draws_unmoved") else "")
                 + "</p>"]
    return _write_bound_page(out, body, figures)


def _utility_paragraph(s: dict) -> str:
    u, h = s.get("utility") or s["sweep"]["levels"][0]["utility"], s["head"]  # (clean, draws: every level's)
    metric = u.get("metric", "accuracy")
    who = f"The head {html.escape(h['spec'])}" if h.get("spec") else "The features themselves (no head)"
    noise = "at this sigma" if "sweep" not in s else "at each sigma"
    # one draw measures no spread: its stderr of 0 is no standard error, and "± 0" would read as one
    spread = (f" ± {_fmt(u['stderr'])} (standard error over the draws)." if u["draws"] > 1
              else " (one draw: no standard error).")
    draws = (f"{u['draws']} noise draw{'s' if u['draws'] != 1 else ''} per input (the stream "
             f"{html.escape(u['noise_stream'])}), "
             + (f"{_fmt(u['dithered'])}{spread}" if "sweep" not in s else "as the table says."))
    if metric == "accuracy":
        return (f"<p>{who} classifies {u['clean']:.2%} of the {u['examples']:,} inputs right from their clean "
                f"features (accuracy {_fmt(u['clean'])}); from the dithered ones {noise}, {draws}</p>")
    if metric.startswith("top") and metric[3:].isdigit():
        return (f"<p>{who} ranks the label among its {metric[3:]} best classes for {u['clean']:.2%} of the "
                f"{u['examples']:,} inputs from their clean features (top-{metric[3:]} accuracy "
                f"{_fmt(u['clean'])}); from the dithered ones {noise}, {draws}</p>")
    if metric == "cosine":
        return (f"<p>{who}: the cosine similarity of each output on the dithered features {noise} with the output "
                f"on the clean ones, averaged over the {u['examples']:,} inputs and {draws}</p>")
    return (f"<p>{who}, scored by {html.escape(metric)} (higher is better): {_fmt(u['clean'])} on the clean "
            f"features, averaged over the {u['examples']:,} inputs; on the dithered ones {noise}, {draws}</p>")


def _metric_label(levels_or_utility) -> str:
    """What the utility numbers are: 'accuracy', 'top-5 accuracy', 'cosine similarity', a function's name."""
    u = levels_or_utility[0]["utility"] if isinstance(levels_or_utility, list) else levels_or_utility
    metric = u.get("metric", "accuracy")
    if metric.startswith("top") and metric[3:].isdigit():
        return f"top-{metric[3:]} accuracy"
    return "cosine similarity" if metric == "cosine" else metric


def _dithered_cell(u: dict) -> str:
    """A sweep table's dithered utility: "0.8125 ± 0.0102" (standard error over the draws), or with one
    draw, which measures no spread, "0.8125 (1 draw: no s.e.)": its stderr of 0 is no estimate."""
    if u.get("draws", 2) > 1:
        return f"{u['dithered']:.4f} ± {u['stderr']:.4f}"
    return f"{u['dithered']:.4f} (1 draw: no s.e.)"


def _tradeoff_figure(path: Path, levels: list) -> None:
    """The trade a noise level makes: the median bound (confidentiality) against the head's accuracy on
    the dithered features (utility), one point per sigma, labelled with its scale."""
    plt = _pyplot()
    med = np.array([np.nan if lv["std"]["q50"] is None else lv["std"]["q50"] for lv in levels], dtype=float)
    acc = np.array([lv["utility"]["dithered"] for lv in levels])
    # one draw measures no spread: no error bar (its stderr of 0 would draw a certainty it does not have)
    err = np.array([lv["utility"]["stderr"] if lv["utility"].get("draws", 2) > 1 else np.nan for lv in levels])
    order = np.argsort([lv["sigma_rms"] for lv in levels])
    fig, ax = plt.subplots(figsize=(6.4, 4.4), constrained_layout=True)
    what = _metric_label(levels)
    ax.errorbar(med[order], acc[order], yerr=err[order], fmt="o-", color="tab:green", capsize=3,
                label=f"{what} on the dithered features (± standard error)")
    ax.axhline(levels[0]["utility"]["clean"], color="0.4", linestyle="--", linewidth=1, label=f"clean {what}")
    for m, a, lv in zip(med, acc, levels):
        if np.isfinite(m):
            ax.annotate(f"{lv['scale']:g}×", (m, a), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if np.all(np.isfinite(med) & (med > 0)):
        ax.set_xscale("log")
        _plain_log_ticks(ax, med.max() / med.min(), "x")
    ax.set_xlabel("median bound on the std of an unbiased estimator (confidentiality)")
    ax.set_ylabel(f"{what} (utility)")
    ax.set_title("What each noise level buys and costs (points: sigma / the one given)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _run_rows(s: dict) -> list:
    """The rows that say what ``hcrfast bound`` ran: inputs, model, noise, basis, solver, sizes."""
    return [("inputs", f"{s['inputs']['examples']:,} of shape {tuple(s['inputs']['shape'])} from "
                       f"{s['inputs']['path']}"),
            ("model", s["model"] + (f" with weights {s['weights']['path']}" if s.get("weights") else "")),
            ("noise", ", ".join(f"{k} {_fmt(v)}" for k, v in s["noise"].items())),
            ("bounds on", s["bounds_on"]),
            ("solver", s["params"].get("solver")),
            ("restarts × iterations", f"{s['params'].get('restarts')} × {s['params'].get('iterations')}")] + (
               [("command", _rerun_line(s))] if s.get("command") else [])


def _rerun_line(s: dict) -> str:
    """summary.json's command, after ``cd`` to the folder its relative paths are read from (its ``cwd``;
    summaries before 2026-12-02 did not record it)."""
    where = f"cd {shell_word(s['cwd'])} && " if isinstance(s.get("cwd"), str) else ""
    try:
        words = shlex.split(s["command"])
    except ValueError:   # (not one hcrfast wrote)
        return where + s["command"]
    return where + " ".join(shell_word(w) for w in words)


def shell_word(word: str) -> str:
    """``word`` quoted for bash: :func:`shlex.quote`, or where it holds bytes that are not UTF-8 (a file name
    Python reads as lone surrogates) bash's ``$'...'`` with those bytes as ``\\xNN``, which a page in UTF-8 can
    show and bash reads back as the same bytes (the ``\\xff`` of plain quotes would be a backslash and "xff")."""
    if not any("\udc80" <= ch <= "\udcff" for ch in word):
        return shlex.quote(word)
    out = []
    for ch in word:
        if "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch in "\\'":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def _write_bound_page(out: Path, body: list, figures: list, title: str = "hcrfast bound") -> Path:
    e = html.escape
    body = body + ["<h2>Figures</h2>"]
    for name, caption in figures:
        body.append(f'<figure><img src="{e(name)}" alt="{e(name)}"><figcaption>{e(caption)}</figcaption></figure>')
    from hcrfast.checkpoint import atomic_write_text

    path = out / "report.html"
    atomic_write_text(path, _utf8(f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{e(title)}</title>"
                                  f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"))
    return path


def _sweep_figure(path: Path, levels: list) -> None:
    """The bounds' quantiles against sigma, log-log, with the line through the first median that bounds
    proportional to sigma would follow (a linear model's): where the curve leaves it, the model's
    nonlinearity shows."""
    plt = _pyplot()
    sig = np.array([lv["sigma_rms"] for lv in levels])
    order = np.argsort(sig)
    sig = sig[order]
    q = {k: np.array([np.nan if levels[i]["std"][k] is None else levels[i]["std"][k] for i in order], dtype=float)
         for k in ("q5", "q25", "q50", "q75", "q95")}
    fig, ax = plt.subplots(figsize=(6.4, 4.4), constrained_layout=True)
    ax.fill_between(sig, q["q5"], q["q95"], color="tab:blue", alpha=0.15, label="5%–95% of the finite bounds")
    ax.fill_between(sig, q["q25"], q["q75"], color="tab:blue", alpha=0.3, label="25%–75%")
    ax.plot(sig, q["q50"], "o-", color="tab:blue", label="median")
    first = np.flatnonzero(np.isfinite(q["q50"]) & (q["q50"] > 0))
    if first.size:
        i = first[0]
        ax.plot(sig, q["q50"][i] * sig / sig[i], "--", color="0.4", linewidth=1,
                label="∝ sigma (a linear model's bounds)")
    ax.set_xscale("log")  # sigma > 0
    _plain_log_ticks(ax, sig[-1] / sig[0], "x")
    shown = np.concatenate([q["q5"], q["q95"]])
    shown = shown[np.isfinite(shown) & (shown > 0)]
    if shown.size:  # bounds of 0 (bounding nothing) have no place on a log axis: linear then
        ax.set_yscale("log")
        _plain_log_ticks(ax, shown.max() / shown.min(), "y")
    ax.set_xlabel("sigma of the noise" + (" (RMS of the stds)" if any(lv["sigma"] is None for lv in levels) else ""))
    ax.set_ylabel("bound on the std of an unbiased estimator")
    n_inf = [lv["std"]["infinite"] for lv in levels]
    ax.set_title("Certified bounds against the noise" + (f"\n(infinite bounds left out: {', '.join(map(str, n_inf))} "
                                                          f"at each sigma)" if any(n_inf) else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_sweep_report(out, summary: dict) -> Path:
    """``report.html`` of ``hcrfast bound --sweep``: the bounds' quantiles at each sigma, as a table and as
    a curve against sigma (``bounds_vs_sigma.png``)."""
    out = Path(out)
    s = summary
    levels = s["sweep"]["levels"]
    _sweep_figure(out / "bounds_vs_sigma.png", levels)
    attack = all("attack" in lv for lv in levels)
    utility = all("utility" in lv for lv in levels)
    rows = [(lv["scale"], lv["sigma_rms"], lv["std"].get("q5"), lv["std"].get("q50"), lv["std"].get("q95"),
             lv["std"]["infinite"], lv["mse_bound_modes"].get("q50"), lv["call_seconds"], lv["reused_examples"])
            + ((_attack_median_cell(lv["attack"]),) if attack else ())
            + ((_dithered_cell(lv["utility"]),) if utility else ())
            for lv in levels]
    header = ("sigma / the one given", "sigma" + (" (RMS of the stds)" if any(lv["sigma"] is None for lv in levels)
                                                  else ""),
              "5%", "median", "95%", "infinite", "bound on the MSE per coordinate from every mode's bound, median over "
              "the inputs' finite bounds", "seconds",
              "inputs whose factors were reused") + (("attack error / bound, median",) if attack else ()) + (
              (f"{_metric_label(levels)}, dithered",) if utility else ())
    body = [f"<h1>hcrfast bound {html.escape(s['model'])}: {len(levels)} noise levels</h1>", _table(_run_rows(s)),
            "<h2>Bounds at each sigma</h2>",
            "<p>Each sigma is one full certified bound of the inputs (the same seed: the calls differ by sigma "
            "only). Each number bounds from below the standard deviation of ANY unbiased estimator of a mode "
            "of the input from the features dithered at that sigma; the quantiles are over every "
            "(input, mode) pair's finite bound. Each sigma's bounds: <code>sweep/scale_K/bounds.npz</code> "
            "(<code>hcrfast.Bounds.load</code>).</p>",
            _table(rows, header=header)]
    for lv in levels:
        if lv["infinite_reasons"]:
            body.append(f"<p>At {_fmt(lv['scale'])} × sigma, "
                        f"{_infinite_sentence(lv['std']['infinite'], lv['infinite_reasons'])}; the first: "
                        f"{html.escape(lv['infinite_reasons'][0])}</p>")
    figures = [("bounds_vs_sigma.png", "The bounds' quantiles against sigma (log-log); the dashed line is "
                                       "proportional to sigma through the first median.")]
    if utility:
        body += ["<h2>What the noise costs</h2>", _utility_paragraph(s)]
        _tradeoff_figure(out / "tradeoff.png", levels)
        figures.append(("tradeoff.png", "Confidentiality against utility: each sigma's median bound and the "
                                        f"{_metric_label(levels)} on the features dithered at that sigma."))
    return _write_bound_page(out, body, figures)


def write_reproduce_sweep_report(out, summary: dict) -> Path:
    """``report.html`` of ``hcrfast reproduce NAME --sweep``: each sigma's bounds and accuracies, the
    bounds against sigma and the trade between confidentiality and accuracy, with a link to each run."""
    e = html.escape
    out = Path(out)
    s, levels = summary, summary["levels"]
    _sweep_figure(out / "bounds_vs_sigma.png", levels)
    _tradeoff_figure(out / "tradeoff.png", levels)
    L = s["lowfreq"]
    rows = []
    for lv in levels:
        run = Path(lv["report"])
        rel = run.relative_to(out) if run.is_relative_to(out) else run
        rows.append(f'<tr><td class="l"><a href="{e(str(rel))}">{e(_fmt(lv["scale"]))}</a></td>'
                    + "".join(f"<td>{e(_fmt(v))}</td>" for v in (
                        lv["sigma"], lv["std"].get("q5"), lv["std"].get("q50"), lv["std"].get("q95"),
                        lv["bounds_lowfreq"].get("q50"), lv["infinite"], lv["utility"]["clean"],
                        _dithered_cell(lv["utility"]), lv["bound_seconds"]))
                    + "</tr>")
    header = ("sigma / the unit (each run's report)", "sigma", "5%", "median", "95%", f"median, {L}×{L} lowest modes",
              "infinite", "accuracy, clean", "accuracy, dithered (± s.e.)", "bound seconds")
    table = ("<table><tr>" + "".join(f'<th class="{"l" if i == 0 else ""}">{e(h)}</th>' for i, h in enumerate(header))
             + "</tr>\n" + "\n".join(rows) + "</table>")
    body = [f"<h1>hcrfast reproduce {e(s['experiment'])}{' (limit)' if s['limit'] else ''}: {len(levels)} noise "
            f"levels</h1>",
            f"<p>Each sigma is one full run of the experiment (its own folder, report and bounds), at sigma = scale × "
            f"{_fmt(s['sigma_scale_unit'])} × the RMS of the clean features ({_fmt(s['rms'])}; the published sigma "
            f"is {_fmt(s['published_sigma_scale'])} × RMS). The bounds are on the DCT coefficients of the normalized "
            f"images; the dithered accuracy is the head's on the features plus one noise draw per restart, "
            f"averaged over the draws.</p>", table]
    return _write_bound_page(out, body, [
        ("bounds_vs_sigma.png", "The bounds' quantiles against sigma (log-log); the dashed line is proportional to "
                                "sigma through the first median."),
        ("tradeoff.png", "Confidentiality against utility: each sigma's median bound and the head's accuracy on the "
                         "features dithered at that sigma.")], title=f"hcrfast reproduce {s['experiment']} sweep")
