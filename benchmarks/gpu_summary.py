"""One table of what a ``gpu_session.sh`` call ran and what it measured, printed as its last lines.

The device tool returns only the last 12,000 characters of a call's output, and a lease has no
time to fetch and read files before the next call: this puts the verdicts where the reply shows
them. It reads, in the session folder (``benchmarks/results/gpu_session`` by default):

* ``ledger.tsv``: one line per command (stage, status, seconds, command, call) from ``gpu_session.sh``;
* ``tests.out``: pytest's closing line of the GPU tests;
* ``gpu_targets_*.json`` (``gpu_targets.py``), ``race_*.json`` (``race.py``) and
  ``bench_gpu_kernels.json``, ``bench_gpu_products.json`` and ``bench_gpu_attention.json`` (pytest-benchmark).

Standard library only, so that it runs, and says what did, even where torch or CuPy fails to
import. Usage: ``python benchmarks/gpu_summary.py [FOLDER]``.
"""
from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

#: Issue #5's ratio over the reference method on the same GPU, at equal median bound.
RACE_TARGET = 50.0
_PYTEST_CLOSING = re.compile(r"\b\d+ (passed|failed|skipped|errors?|deselected)\b")


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {"_error": f"{path.name}: {err}"}


def stages(folder: Path) -> list[str]:
    """One line per stage, in the order they first ran: commands, statuses, seconds; the stages of each
    call under a line naming it where the folder holds more than one (two calls on one warm machine)."""
    path = folder / "ledger.tsv"
    if not path.exists():
        return ["(no ledger.tsv: no command ran)"]
    calls: dict[str, dict[str, list[tuple[str, int]]]] = {}
    with path.open(newline="") as fh:
        for row in csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):  # raw commands, quotes and all
            if len(row) >= 3:
                call = row[4] if len(row) >= 5 else ""
                calls.setdefault(call, {}).setdefault(row[0], []).append(
                    (row[1], int(row[2]) if row[2].isdigit() else 0))
    lines = [f"{'stage':<16} {'commands':>8}  {'status':<34} {'seconds':>7}"]
    for call, rows in calls.items():
        if len(calls) > 1:
            lines.append(f"-- call {call or '(unnamed)'}")
        for stage, runs in rows.items():
            counts: dict[str, int] = {}
            for status, _ in runs:
                counts[status] = counts.get(status, 0) + 1
            status = ", ".join(f"{n} {s}" for s, n in counts.items())
            extra = ""
            if stage == "tests":
                extra = "  " + pytest_closing(folder / "tests.out")
            lines.append(f"{stage:<16} {len(runs):>8}  {status:<34} {sum(s for _, s in runs):>7}{extra}")
    return lines


def pytest_closing(path: Path) -> str:
    """pytest's last summary line ('32 passed in 95.1s'), or why there is none."""
    if not path.exists():
        return "(no pytest output)"
    text = path.read_text(errors="replace").splitlines()
    found = [line.strip(" =") for line in text if _PYTEST_CLOSING.search(line)]
    if found:
        return found[-1]
    # -v names each test's outcome as it ends: what a killed run had done
    done = {word: sum(bool(re.search(rf"::\S+ {word}\b", line)) for line in text)
            for word in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    so_far = ", ".join(f"{n} {word.lower()}" for word, n in done.items() if n)
    return f"(pytest printed no closing line: killed or crashed{'; before that ' + so_far if so_far else ''})"


def _safe(line, r) -> str:
    """``line(r)``, or why it could not be read: one file of another layout costs its line, not the table."""
    try:
        return line(r)
    except Exception as err:  # noqa: BLE001 - any layout problem, named
        return f"  unreadable ({type(err).__name__}: {err}): {str(r)[:120]}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def target_line(r: dict) -> str:
    """One gpu_targets.py run: size, solver and options, time (extrapolated if cut short), share, bound."""
    if "_error" in r:
        return f"  unreadable {r['_error']}"
    cuda = str(r.get("device", "")).startswith("cuda")
    opts = [f"solver={r.get('solver')}"]
    opts += [f"{k}={r.get(k)}" for k, default in (("jacobian", "reverse"), ("kernels", "auto"), ("tf32", False),
                                                  ("cupy_allocator", "torch"), ("warm_start", True))
             if r.get(k, default) not in (default, None)]
    if r.get("solver") == "dense" and r.get("dense_eigh_impl"):   # what ran; what was asked where it differs
        ran, asked = r["dense_eigh_impl"], r.get("dense_eigh_asked")
        opts.append(f"eigh={ran}" + (f" (asked {asked})" if asked not in (None, ran) else ""))
    if r.get("solver") == "krylov" and r.get("krylov_eig_impl") not in (None, "auto"):
        opts.append(f"eig={r['krylov_eig_impl']}")
    if r.get("solver") == "krylov" and r.get("krylov_pilots") not in (None, 1):
        opts.append(f"pilots={r['krylov_pilots']}")
    if r.get("solver") == "krylov" and r.get("lsqr", {}).get("iter_lim") is not None:
        opts.append(f"steps<={r['lsqr']['iter_lim']}")
    if r.get("krylov_reorth_passes") not in (None, 1) and r.get("solver") == "krylov":
        opts.append(f"reorth={r['krylov_reorth_passes']}")
    if r.get("lsqr", {}).get("compact_below") == 0:
        opts.append("compact_below=0")
    size = f"{r['examples']}x{r['restarts']}x{r['iterations']}"
    if r["complete"]:
        time_s = f"{r['seconds']:.1f} s"
    else:
        time_s = f"{r['extrapolated_seconds']:.0f} s extrapolated from {r['examples_done']}/{r['examples']}"
    verdicts = ""
    if cuda and r.get("at_target_size") and r.get("target_seconds") is not None:
        verdicts += f" (< {r['target_seconds']:.0f} s: {_verdict(r['extrapolated_seconds'] < r['target_seconds'])})"
    # Issue #5's share is the time inside the model's JVP/VJP. The dense solve's J is built by the model's
    # vmapped VJPs (or JVPs): those count, beside the operator's products (its probes), as gpu_targets.py's
    # model_products_share counts them; for the other solvers the two shares are the same.
    where = "GPU timeline" if cuda else "wall time"
    if r.get("solver") == "dense" and r.get("model_products_share") is not None:
        inside = r["model_products_share"]
        share = (f", the model's JVP/VJP {inside:.1%} of the {where} (building J {inside - r['jvp_vjp_share']:.1%}, "
                 f"the operator's {r['jvp_vjp_share']:.1%})")
    else:
        inside = r["jvp_vjp_share"]
        share = f", JVP/VJP {inside:.1%} of the {where}"
    if cuda and r.get("at_target_size"):
        share += f" (>= {r['jvp_vjp_target']:.0%}: {_verdict(inside >= r['jvp_vjp_target'])})"
    bound = r.get("bound", {})
    return (f"  {r['workload']} {size} [{r.get('device')}] {' '.join(opts)}: {time_s}{verdicts}{share}; "
            f"{r['products_per_example']:.0f} products/example, median bound {bound.get('median', float('nan')):.4g}"
            + (f", peak {r['peak_torch_bytes'] / 2**30:.1f} GiB" if "peak_torch_bytes" in r else ""))


def _mixed_pair(r: dict) -> str | None:
    """Why a race's reference row and its hcrfast rows are no pair (measured on other machines), or None.

    race.py refuses a ``--reference-json`` from another device or CPU thread count and keeps the
    reference's machine as ``reference_machine``; a JSON from before that may still hold such a pair."""
    here, there = r.get("machine") or {}, r.get("reference_machine")
    if there is None:
        if "[from " in str(r["reference"].get("method", "")):
            return "the reference row is an earlier run's, its machine unrecorded"
        return None
    if r["args"].get("device") == "cuda":
        if there.get("gpu") != here.get("gpu"):
            return f"the reference ran on the GPU {there.get('gpu')!r}, hcrfast on {here.get('gpu')!r}"
    elif there.get("torch_threads") != here.get("torch_threads"):
        return (f"the reference ran on {there.get('torch_threads')} torch thread(s), hcrfast on "
                f"{here.get('torch_threads')}")
    return None


def race_line(r: dict) -> str:
    """One race.py run: the reference's time and median, hcrfast's fastest row reaching it, the ratio."""
    if "_error" in r:
        return f"  unreadable {r['_error']}"
    a, ref = r["args"], r["reference"]
    head = (f"  race {a['model']} {a['examples']}x{a['restarts']}x{a['iterations']} [{a['device']}]: reference "
            f"{ref['seconds']:.1f} s to median {ref['median']:.5g}; ")
    best = r.get("time_to_reference_median")
    if not best:
        return head + "no hcrfast row reached the reference's median bound"
    ratio = ref["seconds"] / best["seconds"]
    mixed = _mixed_pair(r)
    verdict = (f" (no verdict: {mixed})" if mixed else
               f" (>= {RACE_TARGET:.0f}x: {_verdict(ratio >= RACE_TARGET)})" if a["device"] == "cuda" else "")
    rows_done = r.get("main_rows_done", "all")
    unfinished = ("" if r.get("complete", True) else "; the LSQR sweep did not finish" if rows_done == "all"
                  else f"; stopped after {len(rows_done)} hcrfast row(s), the rest did not finish")
    rows = [r[k] for k in ("hcrfast_default", "hcrfast_dense") if r.get(k)] + list(r.get("hcrfast_dense_more") or [])
    rows += [r[k] for k in ("hcrfast_current", "hcrfast_input") if r.get(k)]
    each = "".join(f"\n    {row['method'][:60]}: FAILED ({row['error'][:100]})" if "error" in row else
                   f"\n    {row['method'][:60]}: {row['seconds']:.2f} s, median {row['median']:.5g}, "
                   f"{ref['seconds'] / row['seconds']:.1f}x" for row in rows)
    return (head + f"hcrfast {best['seconds']:.2f} s to {best['median']:.5g} ({best['method']}): {ratio:.1f}x{verdict}"
            + unfinished + each)


def tf32_lines(r: dict) -> str:
    """``tf32_cost.py``: the product errors each way, then each seed's time and median, IEEE against TF32."""
    model, device = r["args"]["model"], r["args"]["device"]
    out = [f"  {model} [{device}], {r['args']['examples']} example(s) x R {r['args']['restarts']} x i "
           f"{r['args']['iterations']}: " + "; ".join(
               f"{kind} J v error {e['jvp']:.2e}, J^T u {e['vjp']:.2e}" for kind, e in r["errors"].items())]
    out += [f"    seed {row['seed']} {row['mode']} ({row['kind']}): {row['seconds']:.1f} s, median {row['median']:.5g}"
            for row in r["rows"]]
    ratio = r.get("summary", {}).get("tf32_over_ieee")
    if ratio:
        seconds = ratio.get("seconds", [])
        out.append(f"    tf32 / ieee: median x{ratio['mean']:.4f}, time x{sum(seconds) / max(len(seconds), 1):.3f}")
    if r.get("complete") is False:   # written after each row: a run killed at its cap stops here
        out.append(f"    incomplete: the run stopped after {len(r['rows'])} row(s)")
    return "\n".join(out)


def kernel_lines(path: Path, limit: int = 40) -> str:
    """pytest-benchmark's medians, one line each (at most ``limit``)."""
    if path.stat().st_size == 0:   # pytest-benchmark leaves it empty when every benchmark skipped
        return "  (no benchmark ran: every one skipped)"
    r = _load(path)
    if "_error" in r:
        return f"  unreadable {r['_error']}"
    rows = sorted(r.get("benchmarks", []), key=lambda b: (b.get("group") or "", b["name"]))
    lines = [f"  {b['name']:<64} median {b['stats']['median'] * 1e3:10.3f} ms" for b in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more in {path.name}")
    return "\n".join(lines or ["  (no benchmark ran)"])


def summarize(folder: Path) -> str:
    targets = [_load(p) for p in sorted(folder.glob("gpu_targets_*.json"))]
    races = [_load(p) for p in sorted(folder.glob("race_*.json")) if not p.name.endswith("_reference.json")]
    machine = next((r["machine"] for r in targets + races if "machine" in r), {})
    head = " | ".join(f"{k} {machine[k]}" for k in ("gpu", "torch", "cupy") if machine.get(k))
    out = [f"== hcrfast GPU session summary ({folder}){': ' + head if head else ''}", *stages(folder)]
    if targets:
        out.append("gpu_targets.py:")
        out += [_safe(target_line, r) for r in targets]
    if races:
        out.append("race.py:")
        out += [_safe(race_line, r) for r in races]
    finished = [p.stem.rsplit("_", 1) for p in sorted(folder.glob("race_*.json")) if not p.stem.endswith("_reference")]
    orphans = [p for p in sorted(folder.glob("race_*_reference.json"))   # race_<model>_<device>_<stamp>_reference
               if not any(prefix == p.stem[:-len("_reference")].rsplit("_", 1)[0]
                          and stamp >= p.stem[:-len("_reference")].rsplit("_", 1)[1] for prefix, stamp in finished)]
    for p in orphans:  # the reference finished, the hcrfast rows did not
        ref = _load(p).get("reference", {})
        out.append(f"  {p.name}: reference only ({ref.get('seconds', float('nan')):.1f} s, median "
                   f"{ref.get('median', float('nan')):.5g}); the hcrfast rows did not finish")
    tf32 = [_load(p) for p in sorted(folder.glob("tf32_cost_*.json"))]
    if tf32:
        out.append("tf32_cost.py:")
        out += [_safe(tf32_lines, r) for r in tf32]
    for name in ("bench_gpu_kernels.json", "bench_gpu_products.json", "bench_gpu_attention.json"):
        if (folder / name).exists():
            out.append(f"{name}:")
            out += _safe(kernel_lines, folder / name).split("\n")
    return "\n".join(out)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):   # (read as a folder's name before)
        print(f"usage: python benchmarks/gpu_summary.py [FOLDER]  (default benchmarks/results/gpu_session)\n\n"
              f"{(__doc__ or '').strip()}")
        return 0
    folder = Path(args[0] if args else "benchmarks/results/gpu_session")
    print(summarize(folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
