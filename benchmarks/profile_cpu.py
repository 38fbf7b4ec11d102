"""Where the time of ``hcrfast.bound`` goes, by timing (no profiler needed).

Runs ``hcrfast.bound`` once on the race's MLP problem with timers wrapped, in this
script only, around the phases (monkeypatching; hcrfast itself is unchanged):

* ``jvp`` / ``vjp``: ``TorchJacobian.matvec`` / ``rmatvec`` — the model's own
  cost, the floor that no solver can go under for a given number of products;
* ``lsqr``: the batched LSQR minus the products it calls (vector work, the
  every-k host check, compaction);
* ``forward``: the forward passes of Algorithm 1's restart step, ``restart_update``;
* ``certify``: the float64 forward passes for the certified ``z``;
* ``dct``, ``validation`` and the rest of ``bound`` (setup, deepcopy of the
  float64 model, bound arithmetic);
* with ``--solver dense``: ``jacobian`` (building every example's J: its products
  are the floor here), ``factor`` (``min_norm_solver``) and ``dense-solve``;
* with ``--solver krylov``: ``krylov-build`` (the basis' LSQR and Gram–Schmidt, its
  products apart as ``krylov-build/jvp`` and ``/vjp``), ``krylov-factor`` (the
  tridiagonal eigendecompositions) and ``krylov-solve`` (the projections).

Times are exclusive (a phase's time excludes the phases nested in it) and listed
by their nesting path, e.g. ``lsqr/jvp``. A warm-up call on 2 examples (R = 2, i = 1,
LSQR or the Krylov basis stopped at 8 steps) runs first, untimed, as in ``race.py`` and ``gpu_targets.py``: the
process's one-time costs (torch's forward-AD decompositions at the first JVP, lazily
loaded kernels, first allocations) would otherwise land in the first phases. Usage::

    python benchmarks/profile_cpu.py --examples 32 --restarts 25 --iterations 10 --threads 1

``--plain`` runs the same workload without timers (for ``nsys``: see
``profile_nsys.sh``); ``--device cuda`` runs it on the GPU (timers then
synchronize the device at every boundary, which perturbs what they measure).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hcrfast.bindings import jacobian as jacobian_mod
from race import add_reorth_option, apply_reorth_option, build_problem, device_ready, positive_int

import hcrfast
from hcrfast import algorithm, dense, kernels, krylov, validation


class PhaseTimer:
    """Exclusive wall time per nesting path of the wrapped functions."""

    def __init__(self, sync=None):
        self.exclusive = defaultdict(float)
        self.calls = defaultdict(int)
        self.rows = defaultdict(int)  # rows that went through each kind of product
        self.path_rows = defaultdict(int)  # the same by nesting path: "lsqr/jvp" (the solves) apart from the probes
        self._stack = []  # [name, child_seconds]
        self._sync = sync or (lambda: None)

    def wrap(self, name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._sync()
            self._stack.append([name, 0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                elapsed = time.perf_counter() - t0
                path = "/".join(frame[0] for frame in self._stack)
                _, child = self._stack.pop()
                self.exclusive[path] += elapsed - child
                self.calls[path] += 1
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed


def _count_rows(timer: PhaseTimer, name: str, method):
    """Count the rows each product is applied to (frozen problems still in the batch included), in all and
    by the nesting path it ran in (wrapped inside the timer's own frame: the path ends in ``name``)."""

    @functools.wraps(method)
    def counted(self, arr):
        timer.rows[name] += arr.shape[0]
        timer.path_rows["/".join(frame[0] for frame in timer._stack)] += arr.shape[0]
        return method(self, arr)

    return counted


def install(timer: PhaseTimer):
    """Wrap the phases; returns a function that puts the originals back."""
    targets = [
        (jacobian_mod.TorchJacobian, "matvec", "jvp"),
        (jacobian_mod.TorchJacobian, "rmatvec", "vjp"),
        (algorithm, "lsqr", "lsqr"),
        (algorithm, "_features", "forward"),
        (algorithm, "_certified_shift", "certify"),
        (algorithm, "_applied_shift", "certify"),
        (kernels, "restart_update", "restart_update"),
        (kernels, "dct2", "dct"),
        (validation, "features_of", "validation"),
        (validation, "check_independent", "validation"),
        (dense, "jacobian", "jacobian"),
        (dense, "min_norm_solver", "factor"),
        (dense.MinNormSolver, "solve", "dense-solve"),
        (krylov, "build", "krylov-build"),
        (krylov, "_factors", "krylov-factor"),
        (krylov, "solve", "krylov-solve"),
    ]
    saved = []
    for owner, attr, name in targets:
        original = getattr(owner, attr)
        saved.append((owner, attr, original))
        fn = original
        if name in ("jvp", "vjp"):
            fn = _count_rows(timer, name, original)
        setattr(owner, attr, timer.wrap(name, fn))

    def restore():
        for owner, attr, original in saved:
            setattr(owner, attr, original)

    return restore


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="fraction of hcrfast.bound's wall time in JVP/VJP vs the rest")
    ap.add_argument("--model", default="mlp", choices=("mlp", "digits"))
    ap.add_argument("--examples", type=positive_int, default=32)
    ap.add_argument("--restarts", type=positive_int, default=25)
    ap.add_argument("--iterations", type=positive_int, default=10)
    ap.add_argument("--size", type=float, default=1 / 200)
    ap.add_argument("--linearize-at", default="input", choices=("input", "current"))
    ap.add_argument("--jacobian", default="reverse", choices=("reverse", "forward"))
    ap.add_argument("--tol", type=float, default=None, help="atol = btol (default: DEFAULT_LSQR's)")
    ap.add_argument("--iter-lim", type=positive_int, default=None)
    ap.add_argument("--solver", default="lsqr", choices=("lsqr", "dense", "krylov"))
    add_reorth_option(ap)
    ap.add_argument("--threads", type=positive_int, default=None)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--plain", action="store_true", help="no timers (for nsys)")
    ap.add_argument("--json", default=None, help="write the phase table here")
    args = ap.parse_args(argv)
    if not device_ready(args, "profile"):
        return 0
    apply_reorth_option(args.reorth_passes)

    model, x = build_problem(args.model, args.examples, seed=0, device=args.device)
    with torch.no_grad():
        sigma = hcrfast.rms_sigma(model(x))
    d = hcrfast.DEFAULT_LSQR
    opts = hcrfast.LSQROptions(atol=args.tol if args.tol else d.atol, btol=args.tol if args.tol else d.btol,
                               conlim=d.conlim, iter_lim=args.iter_lim, check_every=d.check_every)
    if args.solver == "krylov" and args.tol is None and args.iter_lim is None:
        opts = None  # the basis' own rules (hcrfast.krylov.DEFAULT_OPTIONS), not LSQR's
    if args.solver == "dense":
        # Every step solved exactly: no LSQR, so no options (as race.py passes them); given, bound() would
        # warn that they go unused, and the header would name tolerances the run never met.
        given = [f"{name} {value}" for name, value in (("--tol", args.tol), ("--iter-lim", args.iter_lim))
                 if value is not None]
        if given:
            ap.error(f"{' '.join(given)}: LSQR's stopping rules, but --solver dense runs no LSQR; leave them out, "
                     f"or pass --solver lsqr or krylov")
        opts = None
    kw = dict(size=args.size, iterations=args.iterations, restarts=args.restarts, linearize_at=args.linearize_at,
              jacobian=args.jacobian, lsqr=opts, solver=args.solver)

    sync = torch.cuda.synchronize if args.device == "cuda" else None
    # The warm-up: the same model, solver and options on 2 examples, R = 2, i = 1, untimed; LSQR and the
    # Krylov basis stopped at 8 steps (the dense solve has none to stop: its options as they are).
    t_warm = time.perf_counter()
    warm_kw = {**kw, "restarts": 2, "iterations": 1}
    if args.solver != "dense":
        warm_kw["lsqr"] = dataclasses.replace(opts if opts is not None else krylov.DEFAULT_OPTIONS, iter_lim=8)
    with warnings.catch_warnings():   # the timed call below gives the same warnings, once
        warnings.simplefilter("ignore")
        hcrfast.bound(model, x[:2], sigma, **warm_kw)
    if sync:
        sync()
    warmup = time.perf_counter() - t_warm
    timer = PhaseTimer(sync)
    restore = (lambda: None) if args.plain else install(timer)
    try:
        t0 = time.perf_counter()
        res = hcrfast.bound(model, x, sigma, **kw)
        if sync:
            sync()
        total = time.perf_counter() - t0
    finally:
        restore()

    itn = res.to_numpy().lsqr_iterations
    dense_run = res.params["solver"] == "dense"
    # Row-products: LSQR's 2·itn + 1 per solve, and a warm-started solve's A x0 (every solve of a restart
    # after its first, as race.products_per_example counts it); the dense solve's min(n, p) per example to
    # build J; the Krylov basis' 2k + 1 per example and pilot (its projections cost none), riding along
    # included, and needed_products without them (steps run twice included).
    if dense_run:
        products = needed_products = round(res.params["dense"]["jacobian_products"] * args.examples)
    elif res.params["solver"] == "krylov":
        products = int(round(res.params["krylov"]["products_per_example"] * args.examples))
        needed_products = int(round(res.params["krylov"]["products_needed_per_example"] * args.examples))
    else:
        warm = itn.shape[0] * itn.shape[1] * (itn.shape[2] - 1) if res.params["warm_start"] else 0
        products = needed_products = int(np.sum(2 * itn + 1)) + warm
    if dense_run:
        described = "every step solved exactly (no LSQR options)"
    elif opts is None:
        described = "the basis defaults"
    else:
        described = f"lsqr atol={opts.atol:g} btol={opts.btol:g} iter_lim={opts.iter_lim}"
    print(f"profile: {args.model}, {args.examples} examples x {args.restarts} restarts x {args.iterations} iterations, "
          f"jacobian={args.jacobian}, linearize_at={args.linearize_at}, solver {res.params['solver']}, {described}, "
          f"torch threads {torch.get_num_threads()}, device {args.device}")
    print(f"  warm-up call first (2 examples, R = 2, i = 1; the process's one-time costs): {warmup:.2f} s, "
          f"outside every figure below")
    print(f"  wall time {total:.2f} s; {products} row-products (JVP+VJP over all problems); "
          + (f"basis steps per example: median {res.params['krylov']['steps_median']:.0f}, "
           f"max {res.params['krylov']['steps_max']}, run twice {res.params['krylov']['steps_redone_mean']:.1f} "
           f"(reorthogonalization {krylov.REORTH_PASSES!r})" if res.params["solver"] == "krylov"
           else f"median LSQR iterations per solve {np.median(itn):.0f}"))
    std = res.to_numpy().std
    print(f"  bound median {np.median(std):.5f}, p90 {np.quantile(std, 0.9):.4f}")
    if args.plain:
        return 0

    rows = sorted(timer.exclusive.items(), key=lambda kv: -kv[1])
    accounted = sum(timer.exclusive.values())
    rows.append(("(rest of bound: setup, float64 model copy, bound arithmetic)", total - accounted))
    print(f"  {'phase (nesting path)':<62} {'seconds':>9} {'share':>7} {'calls':>7}")
    for path, sec in rows:
        print(f"  {path:<62} {sec:9.2f} {sec / total:7.1%} {timer.calls.get(path, ''):>7}")
    floor = sum(s for p, s in timer.exclusive.items()
                if p.endswith("jvp") or p.endswith("vjp") or p.split("/")[-1] == "jacobian")
    fwd = sum(s for p, s in timer.exclusive.items() if p.split("/")[-1] in ("forward", "certify"))
    print(f"  JVP + VJP (the model's own cost, the floor{'; J built' if args.solver == 'dense' else ''}): "
          f"{floor:.2f} s = {floor / total:.1%} of wall time")
    print(f"  forward passes (restart + certify):           {fwd:.2f} s = {fwd / total:.1%}")
    print(f"  everything else:                              {total - floor - fwd:.2f} s = "
          f"{(total - floor - fwd) / total:.1%}")
    applied = timer.rows["jvp"] + timer.rows["vjp"]
    # The share spent on stopped problems is of the solves' rows alone: bound's probes and checks (its JVP/VJP
    # outside the solves' phase, validation's included) push rows no solve needed, and counted in they read
    # as riding along.
    solve_phase = "krylov-build" if res.params["solver"] == "krylov" else "lsqr"
    in_solves = sum(n for path, n in timer.path_rows.items() if path.split("/")[0] == solve_phase)
    stopped_share = 1 - needed_products / in_solves if in_solves and not dense_run else None
    if stopped_share is not None:
        needed = ("2*steps+1 per basis, steps run twice included" if solve_phase == "krylov-build"
                  else "sum of 2*itn+1, and A x0 once per warm-started solve")
        print(f"  rows pushed through JVP/VJP: {applied}, {in_solves} of them in the solves ({solve_phase}; the "
              f"other {applied - in_solves}: bound's probes and checks, left out here); needed by the solves "
              f"({needed}): {needed_products} ({stopped_share:.1%} of the solves' product rows went to problems "
              f"already stopped)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            args=vars(args), total_seconds=total, warmup_seconds=warmup, products=products,
            lsqr=None if dense_run else res.params["lsqr"],   # the options the solves ran with
            phases={p: dict(seconds=s, calls=timer.calls.get(p)) for p, s in rows},
            jvp_vjp_fraction=floor / total, rows_through_products=applied,
            rows_in_solves=in_solves, products_needed=needed_products, stopped_rows_share=stopped_share,
            bound_median=float(np.median(std)), bound_p90=float(np.quantile(std, 0.9))), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
