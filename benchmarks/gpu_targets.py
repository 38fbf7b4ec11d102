"""The issue's end-to-end targets: one ``hcrfast.bound`` call at the published size, timed.

Workloads (random weights, as the issue allows for timing; ``hcrfast.zoo`` architectures):

* ``mnist``: the MLP 784-784-784 on 28×28 inputs, 10,000 examples, R = 25, i = 10,
  s = 1/200, σ = RMS of the features. Target on one H100: under 60 s.
* ``resnet18``: ResNet-18 cut at its 512×7×7 features, 3×91×91 inputs (upsampled to 224
  inside the model), 128 examples, R = 25, i = 10, s = 1/500, σ = 2×RMS. Target: under 10 min.
* ``cifar10``, ``swin_t``: the other two experiments at their published parameters.

Inputs: for ``mnist`` the digits test images (the only images that ship with the
repository) upsampled to 28×28 and cycled to the requested count — every example still
has its own start vectors, since example e draws from ``default_rng([seed, e])``; for the
others, uniform random images in [0, 1]. Pass ``--mnist-root`` to use the real MNIST test
split from local files instead.

What it reports, besides the wall time of the call:

* the share of the **GPU timeline** spent inside the model's JVP/VJP: a pair of CUDA
  events is recorded on torch's current stream around every ``TorchJacobian.matvec`` and
  ``rmatvec`` (events do not synchronize the host, so the run is not perturbed), summed
  after the call and divided by the time between two events bracketing the ``bound`` call
  (summed over the calls with ``--slices``: the host work between them counts in neither).
  Target: at least 85%. On the CPU the same pairs are wall-clock timers.
* products (JVP + VJP) per example, median and 90th percentile of the bound, peak device
  memory, the versions and the device.

A small warm-up call (2 examples, R = 2, i = 1) runs first and is reported apart: it pays
the one-time costs of a process (CUDA context, cuBLAS handles, CuPy and Numba kernel
compilation), which no later call pays again.

Usage::

    python benchmarks/gpu_targets.py mnist --out benchmarks/results/
    python benchmarks/gpu_targets.py resnet18 --out benchmarks/results/
    python benchmarks/gpu_targets.py mnist --device cpu --examples 8 --restarts 2 --iterations 2   # smoke test
    python benchmarks/gpu_targets.py resnet18 --slices 16 --time-budget 420 --out benchmarks/results/

``--profile`` adds where the time goes: the host's wall time inside each hcrfast phase (the NVTX ranges of
``hcrfast.profiling.annotate``; nested phases count in each, and a phase that waits for the GPU counts the
wait) and the GPU kernels' time by name (``torch.profiler``), with how much of the GPU timeline no kernel ran
(the host's share: launches, synchronizations, host-side eigendecompositions). It perturbs the run (each
torch op is recorded); the timings of the target are those without it::

    python benchmarks/gpu_targets.py mnist --examples 1250 --profile --out benchmarks/results/

``--slices N`` splits the examples into N ``bound`` calls and rewrites the JSON after each (a run
killed at a time limit keeps what it finished; its figures combine the slices done, as one call over
their examples would give them); ``--time-budget S`` stops after the slice that
passes S seconds and reports the examples done, with the time extrapolated to all of them.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race import (MNIST_MEAN, MNIST_STD, add_reorth_option, apply_reorth_option, machine_info,  # noqa: E402
                  positive_int, products_per_example, quantiles)

import hcrfast  # noqa: E402
from hcrfast import data, krylov, zoo  # noqa: E402
from hcrfast.kernels import symmetric, tridiagonal  # noqa: E402
from hcrfast import dense as dense_mod  # noqa: E402
from hcrfast._bound_cli import steps_arg  # noqa: E402
from hcrfast._repro_cli import pilots_arg  # noqa: E402
from hcrfast.bindings import jacobian as jacobian_mod  # noqa: E402
from hcrfast.bindings.bridge import ALLOCATOR_ENV, cupy_allocator_choice  # noqa: E402

#: name: (examples, restarts, iterations, target seconds or None) of the issue.
TARGETS = {
    "mnist": (10_000, 25, 10, 60.0),
    "resnet18": (128, 25, 10, 600.0),
    "cifar10": (2_500, 25, 6, None),
    "swin_t": (128, 25, 10, None),
}
JVP_VJP_TARGET = 0.85


class ProductTimer:
    """Time inside ``TorchJacobian.matvec``/``rmatvec``: CUDA event pairs on the GPU, wall clock on the CPU."""

    #: (owner, attribute, name): TorchJacobian's products, and the dense solve's two phases
    #: (building J by vmapped products, factoring it), timed apart from the products.
    TIMED = ((jacobian_mod.TorchJacobian, "matvec", "jvp"), (jacobian_mod.TorchJacobian, "rmatvec", "vjp"),
             (dense_mod, "jacobian", "dense_jacobian"), (dense_mod, "min_norm_solver", "dense_factor"))

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pairs = {name: [] for _, _, name in self.TIMED}
        self.seconds = {name: 0.0 for _, _, name in self.TIMED}
        self.rows = {"jvp": 0, "vjp": 0}
        self._depth = 0
        self._saved = []

    def _wrap(self, name, fn):
        timer = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if name in timer.rows:
                timer.rows[name] += args[1].shape[0]     # (operator, array): rows of the product
            if timer._depth:  # a product nested in another is already inside its pair
                return fn(*args, **kwargs)
            timer._depth += 1
            try:
                if timer.cuda:
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    out = fn(*args, **kwargs)
                    stop.record()
                    timer.pairs[name].append((start, stop))
                else:
                    t0 = time.perf_counter()
                    out = fn(*args, **kwargs)
                    timer.seconds[name] += time.perf_counter() - t0
                return out
            finally:
                timer._depth -= 1

        return timed

    def __enter__(self):
        for owner, attr, name in self.TIMED:
            original = getattr(owner, attr)
            self._saved.append((owner, attr, original))
            setattr(owner, attr, self._wrap(name, original))
        return self

    def __exit__(self, *exc):
        for owner, attr, original in self._saved:
            setattr(owner, attr, original)
        self._saved.clear()

    def totals(self) -> dict:
        """Seconds per kind (call after the device is synchronized)."""
        if self.cuda:
            for name, pairs in self.pairs.items():
                self.seconds[name] += sum(a.elapsed_time(b) for a, b in pairs) / 1e3
                pairs.clear()
        return dict(self.seconds)


class EighRoutes:
    """Which implementation decomposed the dense solve's Gram matrices, call by call, while entered.

    ``hcrfast.dense.EIGH_IMPL = "auto"`` is resolved inside each ``symmetric.eigh_batch`` call (LAPACK on
    the host for two or more float64 matrices, else torch) and a device routine's failed matrices are
    redone by LAPACK: neither is recorded by ``bound``. Seen here from the routines each call reached:
    ``_device_eigh`` (its impl), ``_lapack_host`` ("lapack"), or neither ("torch")."""

    def __init__(self):
        self.calls: dict[str, int] = {}
        self._saved = []

    def __enter__(self):
        route: list[str] = []
        eigh, device, lapack = symmetric.eigh_batch, symmetric._device_eigh, symmetric._lapack_host

        def on_device(A, orders, impl, differentiable):
            route.append(impl)
            return device(A, orders, impl, differentiable)

        def on_host(*args, **kwargs):
            route.append("lapack")
            return lapack(*args, **kwargs)

        @functools.wraps(eigh)
        def seen(*args, **kwargs):
            route.clear()
            out = eigh(*args, **kwargs)
            name = "+".join(dict.fromkeys(route)) or "torch"   # "cusolver+lapack": some redone on the host
            self.calls[name] = self.calls.get(name, 0) + 1
            return out

        for attr, fn in (("eigh_batch", seen), ("_device_eigh", on_device), ("_lapack_host", on_host)):
            self._saved.append((attr, getattr(symmetric, attr)))
            setattr(symmetric, attr, fn)
        return self

    def __exit__(self, *exc):
        for attr, original in self._saved:
            setattr(symmetric, attr, original)
        self._saved.clear()

    def resolved(self) -> str | None:
        """The implementation that ran ("lapack"), several with their call counts ("lapack x3, torch x1"),
        or None where no Gram matrix was decomposed (the SVD driver)."""
        if len(self.calls) <= 1:
            return next(iter(self.calls), None)
        return ", ".join(f"{name} x{n}" for name, n in self.calls.items())


class PhaseProfile:
    """``--profile``: host wall time per hcrfast phase and GPU kernel time per kernel name.

    The phases are the ranges of :func:`hcrfast.profiling.annotate`, which is swapped for a timer around
    the NVTX range for the duration (every hcrfast module calls it through the module, at call time).
    The kernels come from ``torch.profiler`` (CPU and CUDA activities: CuPy's and Numba's kernels on
    the solver's stream are in CUDA's activity too, CUPTI sees every launch of the process).
    """

    def __init__(self, device: torch.device, top: int = 25):
        self.cuda = device.type == "cuda"
        self.top = top
        self.ranges: dict[str, list] = {}
        self.prof = None

    def __enter__(self):
        from hcrfast import profiling

        self._profiling, self._annotate = profiling, profiling.annotate
        ranges, original = self.ranges, profiling.annotate

        @contextlib.contextmanager
        def timed(name):
            t0 = time.perf_counter()
            with original(name), torch.profiler.record_function(f"hcrfast:{name}"):
                yield
            entry = ranges.setdefault(name, [0.0, 0])
            entry[0] += time.perf_counter() - t0
            entry[1] += 1

        profiling.annotate = timed
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.prof.__exit__(*exc)
        self._profiling.annotate = self._annotate
        return False

    def report(self, wall: float) -> dict:
        kernels: dict[str, list] = {}
        spans = []
        for e in self.prof.events():
            # The hcrfast ranges (record_function above) are mirrored on the GPU timeline as CUDA events
            # of their own: not kernels (the H100 profile of 2026-11-27 counted them, 30.8 s of "kernels"
            # in a 21.5 s slice whose real kernels ran ~1.1 s).
            if (self.cuda and getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
                    and not e.name.startswith("hcrfast:")):
                us = e.time_range.elapsed_us()
                k = kernels.setdefault(e.name, [0.0, 0])
                k[0] += us / 1e6
                k[1] += 1
                spans.append((e.time_range.start, e.time_range.end))
        busy = 0.0  # the union of the kernels' intervals: time some kernel ran
        end = -np.inf
        for a, b in sorted(spans):
            if b > end:
                busy += (b - max(a, end)) / 1e6
                end = b
        ordered = sorted(kernels.items(), key=lambda kv: -kv[1][0])
        return dict(
            wall_seconds=wall,
            ranges={name: dict(seconds=v[0], calls=v[1]) for name, v in sorted(self.ranges.items(),
                                                                             key=lambda kv: -kv[1][0])},
            kernel_seconds=sum(v[0] for v in kernels.values()), kernel_launches=sum(v[1] for v in kernels.values()),
            gpu_busy_seconds=busy,
            kernels=[dict(name=name[:160], seconds=v[0], launches=v[1]) for name, v in ordered[:self.top]])


def profile_report(p: dict) -> str:
    lines = [f"  profile (perturbed by the profiler): {p['wall_seconds']:.2f} s wall; GPU busy {p['gpu_busy_seconds']:.2f} s "
             f"({p['kernel_launches']:,} kernels, {p['kernel_seconds']:.2f} s summed)"]
    lines.append("  host wall per hcrfast phase (nested phases count in each):")
    for name, r in p["ranges"].items():
        lines.append(f"    {name:<16} {r['seconds']:8.2f} s  {r['calls']:>8,} calls")
    lines.append("  GPU kernels by time:")
    for k in p["kernels"]:
        lines.append(f"    {k['seconds']:8.3f} s {k['launches']:>8,}x  {k['name'][:110]}")
    return "\n".join(lines)


def build_workload(name: str, examples: int, device: str, *, mnist_root=None, seed: int = 0):
    """(ZooModel, features model on ``device`` in eval mode, normalized inputs on ``device``)."""
    zm = zoo.build(name, seed=seed)
    if name == "mnist":
        if mnist_root is not None:
            images, _ = data.load("mnist", split="test", root=mnist_root, limit=examples)
            if images.shape[0] < examples:
                raise ValueError(f"--examples {examples}: {mnist_root} holds only {images.shape[0]} test images")
            x = zm.normalize(images)
        else:
            digits, _ = data.load("digits", split="test")
            idx = torch.arange(examples) % digits.shape[0]
            up = torch.nn.functional.interpolate(digits[idx], size=(28, 28), mode="bilinear", align_corners=False)
            x = (up.clamp(0, 1) - MNIST_MEAN) / MNIST_STD
    else:
        g = torch.Generator().manual_seed(seed)
        x = zm.normalize(torch.rand((examples,) + tuple(zm.input_shape), generator=g))
    return zm, zm.features.eval().to(device), x.float().contiguous().to(device)


#: The keys of ``Bounds.params`` the summary reads, kept for every slice.
SLICE_PARAMS = ("solver", "lsqr", "warm_start", "iterates", "dense", "krylov", "singular_steps")


def combined_params(slices: list) -> dict:
    """The :data:`SLICE_PARAMS` one ``bound`` call over all the examples of ``slices`` (a list of
    ``(examples, params)``, one per call) would report: per-example figures as example-weighted means, counts
    and seconds summed, the fewest directions the least of the slices'. The settings (solver, options, warm
    start, iterates, pilots) are each call's: the same kwargs, resolved from the same sizes."""
    (_, first), done = slices[0], sum(n for n, _ in slices)

    def mean(get):
        return sum(n * get(p) for n, p in slices) / done

    out = {key: first[key] for key in ("solver", "lsqr", "warm_start", "iterates")}
    out["dense"] = None if first["dense"] is None else dict(
        jacobian_products=mean(lambda p: p["dense"]["jacobian_products"]))
    out["krylov"] = None if first["krylov"] is None else dict(
        pilots=first["krylov"]["pilots"], products_per_example=mean(lambda p: p["krylov"]["products_per_example"]),
        steps_redone_mean=mean(lambda p: p["krylov"]["steps_redone_mean"]))
    steps = [p["singular_steps"] for _, p in slices]
    directions = [s["directions"] for s in steps if s is not None and s["directions"] is not None]
    out["singular_steps"] = None if steps[0] is None else dict(
        steps[0], examples=sum(s["examples"] for s in steps), modes_lifted=sum(s["modes_lifted"] for s in steps),
        seconds=sum(s["seconds"] for s in steps),
        # as bound() counts them over its chunks: over the slices that counted them
        directions=None if not directions else dict(total=sum(d["total"] for d in directions),
                                                    fewest=min(d["fewest"] for d in directions)))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args, on_slice=None) -> dict:
    """The measurement; ``on_slice(partial result)`` after every slice but the last."""
    device = torch.device(args.device)
    default_examples, default_restarts, default_iterations, target = TARGETS[args.workload]
    examples = args.examples or default_examples
    restarts = args.restarts or default_restarts
    iterations = args.iterations or default_iterations
    if args.threads:
        torch.set_num_threads(args.threads)
    apply_reorth_option(args.reorth_passes)
    krylov.EIG_IMPL = args.eig_impl
    dense_mod.EIGH_IMPL = args.dense_eigh
    jacobian_mod.LEAN_DOUBLE_BACKWARD = args.double_backward == "lean"
    if args.tf32:
        # bound(tf32=True) only stops forcing IEEE float32: it runs with the caller's settings, and
        # torch's defaults keep float32 matmuls in IEEE (only cuDNN convolutions default to TF32).
        # Turn TF32 on for both, or --tf32 would change nothing for the MLP.
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"
        else:  # torch < 2.9
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    zm, model, x = build_workload(args.workload, examples, args.device, mnist_root=args.mnist_root)
    with torch.no_grad():
        feats = torch.cat([model(c) for c in x.split(1024)])
    sigma = hcrfast.rms_sigma(feats, zm.sigma_scale)
    changes = {k: v for k, v in (("kernels", args.kernels), ("compact_below", args.compact_below)) if v is not None}
    if args.krylov_steps is not None:
        changes["iter_lim"] = args.krylov_steps
    # "auto" is resolved as a user's bound() call without lsqr= would resolve it (--cold-start is about
    # LSQR's warm starts, so it keeps LSQR); the options are that solver's defaults with this script's changes.
    solver = ("lsqr" if args.solver == "auto" and args.cold_start
              else hcrfast.algorithm.resolve_solver(args.solver, "input", device, int(feats[0].numel()),
                                                    int(x[0].numel())))
    n_features = int(feats[0].numel())
    del feats
    # The dense solve runs no LSQR: its options would go unused (bound() warns, once per call, and the JSON
    # would record tolerances no solve met), so it gets none but what was asked (its kernels serve the DCT),
    # as race.py passes them.
    opts = (hcrfast.LSQROptions(**changes) if changes else None) if solver == "dense" else dataclasses.replace(
        krylov.DEFAULT_OPTIONS if solver == "krylov" else hcrfast.DEFAULT_LSQR, **changes)
    kw = dict(size=zm.size, iterations=iterations, restarts=restarts, jacobian=args.jacobian, lsqr=opts,
              chunk_size=args.chunk_size, tf32=args.tf32, warm_start=not args.cold_start, solver=solver,
              iterates=args.iterates, singular_steps=args.singular_steps)
    if args.krylov_pilots not in (None, 1, "auto") and solver != "krylov":
        raise SystemExit(f"gpu_targets: --krylov-pilots {args.krylov_pilots} needs the Krylov solver, "
                         f"but this run solves with {solver!r}; add --solver krylov")
    if solver == "krylov" and args.krylov_pilots is not None:  # else bound()'s default
        kw["krylov_pilots"] = args.krylov_pilots

    t0 = time.perf_counter()
    # The warm-up pays compilation and allocation, not a whole Krylov basis: 8 steps are enough.
    warm_kw = {**kw, "restarts": 2, "iterations": 1, "chunk_size": None}
    if solver == "krylov":
        warm_kw["lsqr"] = dataclasses.replace(opts, iter_lim=8)
        # as many pilots as the timed calls run (up to its 2 restarts), "auto" resolved as they resolve it
        asked = kw.get("krylov_pilots", inspect.signature(hcrfast.bound).parameters["krylov_pilots"].default)
        pilots, _ = krylov.resolve_pilots(asked, n_features, int(x[0].numel()), restarts, opts, solver=solver)
        warm_kw["krylov_pilots"] = min(pilots, warm_kw["restarts"])
    hcrfast.bound(model, x[:2], sigma, **warm_kw)
    if solver == "krylov" and krylov.EIG_IMPL == "numba":
        # compiled once per process: here, not in the timed calls
        tridiagonal.eigh_tridiagonal_batch(np.ones((1, 2)), np.zeros((1, 2)), [2], rtol=0.0, impl="numba")
    _sync(device)
    warmup = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    slices = [ids for ids in np.array_split(np.arange(examples), max(1, min(args.slices, examples))) if ids.size]
    parts = []          # per slice: (std, lsqr_iterations, number of infinite reasons, its bound()'s params)

    def summary(wall: float, timeline: float, inside: dict) -> dict:
        done = sum(p[0].shape[0] for p in parts)
        std = np.concatenate([p[0] for p in parts])
        itn = np.concatenate([p[1] for p in parts])
        # the slices' accounts combined: what one call over the examples done would report, not the last slice's
        params = combined_params([(p[0].shape[0], p[3]) for p in parts])
        return dict(
            workload=args.workload, examples=examples, examples_done=done, complete=done == examples,
            slices=len(slices), slices_done=len(parts), restarts=restarts, iterations=iterations,
            size=zm.size, sigma=sigma, sigma_scale=zm.sigma_scale, jacobian=args.jacobian,
            kernels=params["lsqr"]["kernels"],
            double_backward=args.double_backward if args.jacobian == "reverse" else None, tf32=args.tf32,
            cupy_allocator=cupy_allocator_choice() if device.type == "cuda" else None,
            # as the call resolved them (krylov_pilots="auto" sets each pilot's iter_lim); of the dense solve's,
            # the one it uses (bound() fills in DEFAULT_LSQR's tolerances, which no dense step meets)
            lsqr=(params["lsqr"] if params["solver"] != "dense" else dict(kernels=params["lsqr"]["kernels"])),
            inputs="mnist test files" if args.mnist_root else ("digits upsampled, cycled" if args.workload == "mnist"
                                                              else "uniform random images"),
            device=str(device), warmup_seconds=warmup, seconds=wall, timeline_seconds=timeline,
            extrapolated_seconds=wall * examples / done,
            jvp_seconds=inside["jvp"], vjp_seconds=inside["vjp"],
            dense_jacobian_seconds=inside["dense_jacobian"], dense_factor_seconds=inside["dense_factor"],
            model_products_share=(inside["jvp"] + inside["vjp"] + inside["dense_jacobian"]) / timeline,
            jvp_vjp_share=(inside["jvp"] + inside["vjp"]) / timeline,
            rows_through_jvp=timer.rows["jvp"], rows_through_vjp=timer.rows["vjp"],
            solver=params["solver"],
            products_per_example=(params["dense"]["jacobian_products"] if params["solver"] == "dense"
                                  else params["krylov"]["products_per_example"]  # measured: riding along included
                                  if params["solver"] == "krylov"
                                  else products_per_example(itn, params["warm_start"])),
            krylov_steps_median=(float(np.median(itn[:, 0, 0])) if params["solver"] == "krylov" else None),
            krylov_steps_redone_mean=(params["krylov"]["steps_redone_mean"] if params["solver"] == "krylov" else None),
            krylov_pilots=(params["krylov"]["pilots"] if params["solver"] == "krylov" else None),
            krylov_pilots_asked=(kw.get("krylov_pilots", "bound's default") if params["solver"] == "krylov"
                                 else None),
            krylov_reorth_passes=(krylov.REORTH_PASSES if params["solver"] == "krylov" else None),
            krylov_eig_impl=(krylov.EIG_IMPL if params["solver"] == "krylov" else None),
            # what ran (EighRoutes: "auto" resolved, fallbacks seen), beside what was asked
            dense_eigh_impl=(eigh_routes.resolved() if params["solver"] == "dense" else None),
            dense_eigh_asked=(dense_mod.EIGH_IMPL if params["solver"] == "dense" else None),
            dense_eigh_calls=(dict(eigh_routes.calls) if params["solver"] == "dense" else None),
            warm_start=params["warm_start"], iterates=params["iterates"],
            singular_steps=params["singular_steps"],
            median_lsqr_iterations=float(np.median(itn)),
            bound=quantiles(std), n_infinite_reasons=sum(p[2] for p in parts),
            target_seconds=target, jvp_vjp_target=JVP_VJP_TARGET,
            at_target_size=(examples, restarts, iterations) == (default_examples, default_restarts,
                                                                default_iterations),
            machine=machine_info("cuda" if device.type == "cuda" else "cpu"),
        )

    profiler = PhaseProfile(device) if args.profile else contextlib.nullcontext()
    with ProductTimer(device) as timer, profiler, EighRoutes() as eigh_routes:
        # Wall time and GPU timeline count the bound() calls only: each slice is bracketed by its own
        # pair (events on the GPU), so the host work between slices (the result's copy to the host,
        # the JSON written after each) is in neither the time nor the share's denominator.
        wall = timeline = 0.0
        inside = {"jvp": 0.0, "vjp": 0.0}
        for k, ids in enumerate(slices):
            if device.type == "cuda":
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
            t0 = time.perf_counter()
            res = hcrfast.bound(model, x[int(ids[0]):int(ids[-1]) + 1], sigma, example_ids=ids,
                                progress=args.progress, **kw)
            _sync(device)
            call = time.perf_counter() - t0
            wall += call
            if device.type == "cuda":
                end.record()
                end.synchronize()
                timeline += begin.elapsed_time(end) / 1e3
            else:
                timeline += call
            inside = timer.totals()
            host = res.to_numpy()
            parts.append((host.std.reshape(len(ids), -1), host.lsqr_iterations, len(res.infinite_reasons),
                          {key: res.params[key] for key in SLICE_PARAMS}))
            if on_slice is not None and k + 1 < len(slices):
                on_slice(summary(wall, timeline, inside))
            if args.time_budget is not None and wall > args.time_budget and k + 1 < len(slices):
                print(f"  time budget {args.time_budget:g} s spent after slice {k + 1}/{len(slices)}: stopping; "
                      f"the figures below are for the examples done, the time extrapolated", flush=True)
                break
            if len(slices) > 1:
                print(f"  slice {k + 1}/{len(slices)}: {sum(p[0].shape[0] for p in parts)}/{examples} examples, "
                      f"{wall:.1f} s", flush=True)

    out = summary(wall, timeline, inside)
    if args.profile:
        out["profile"] = profiler.report(wall)
    if device.type == "cuda":
        # With the torch allocator (the default) these include the solver's CuPy arrays; with
        # HCRFAST_CUPY_ALLOCATOR=cupy those sit in CuPy's pool, whose size at the end is below.
        out["peak_torch_bytes"] = int(torch.cuda.max_memory_allocated(device))
        out["peak_torch_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
        try:
            import cupy

            out["cupy_pool_bytes"] = int(cupy.get_default_memory_pool().total_bytes())
            out["numba_cuda"] = _version("numba-cuda")
            out["driver"] = int(cupy.cuda.runtime.driverGetVersion())
        except ImportError:
            pass
    return out


def _version(dist: str):
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def report(r: dict) -> str:
    verdict = ""
    if r["target_seconds"] is not None and r["device"].startswith("cuda") and r["at_target_size"]:
        met = r["extrapolated_seconds"] < r["target_seconds"]
        verdict = (f" (target < {r['target_seconds']:.0f} s: {'met' if met else 'MISSED'}"
                   f"{'' if r['complete'] else ', extrapolated'})")
    # Issue #5's share: the time inside the model's JVP/VJP, which for the dense solve includes building J
    # (the model's vmapped products): its verdict goes on the dense line, the other solvers' on the JVP/VJP line.
    dense = r["solver"] == "dense"
    share_verdict = ""
    if r["device"].startswith("cuda"):
        inside = r["model_products_share"] if dense else r["jvp_vjp_share"]
        share_verdict = f" (target >= {r['jvp_vjp_target']:.0%}: {'met' if inside >= r['jvp_vjp_target'] else 'MISSED'})"
    gpu = r["machine"].get("gpu", r["machine"]["cpu_model"])
    return "\n".join([
        f"{r['workload']}: {r['examples']} examples x R={r['restarts']} x i={r['iterations']}, s={r['size']:g}, "
        f"sigma={r['sigma']:.4g} ({r['sigma_scale']:g} x RMS), jacobian={r['jacobian']}, kernels={r['kernels']}, "
        + (f"compact_below={r['lsqr']['compact_below']:g}, " if "compact_below" in r["lsqr"] else "")
        + f"tf32={r['tf32']}, warm_start={r['warm_start']}, "
        f"iterates={r.get('iterates', 'last')}, "
        + (f"singular_steps={r['singular_steps']['count']}, " if r.get("singular_steps") else "")
        + f"on {gpu}; inputs: {r['inputs']}",
        f"  warm-up call {r['warmup_seconds']:.1f} s (one-time costs of the process)",
        (f"  hcrfast.bound: {r['seconds']:.2f} s wall"
         + (f" in {r.get('slices_done', r['slices'])} calls" if r["slices"] > 1 else "")
         + ("" if r["complete"] else f" for {r['examples_done']} of {r['examples']} examples (time budget spent); "
            f"extrapolated to all: {r['extrapolated_seconds']:.0f} s") + verdict),
        f"  inside JVP/VJP: {r['jvp_seconds'] + r['vjp_seconds']:.2f} s = {r['jvp_vjp_share']:.1%} of the "
        f"{'GPU timeline' if r['device'].startswith('cuda') else 'wall time'}{'' if dense else share_verdict} "
        f"(JVP {r['jvp_seconds']:.2f} s, VJP {r['vjp_seconds']:.2f} s)",
    ] + ([f"  dense solve: building J {r['dense_jacobian_seconds']:.2f} s, factoring it "
          f"{r['dense_factor_seconds']:.2f} s (eigh: {r.get('dense_eigh_impl')}, asked {r.get('dense_eigh_asked')}); "
          f"the model's products (J's vmapped VJPs included) "
          f"{r['model_products_share']:.1%} of the {'GPU timeline' if r['device'].startswith('cuda') else 'wall time'}"
          f"{share_verdict}"]
         if dense else []) + [
        f"  products per example {r['products_per_example']:.0f}; "
        + (f"Krylov basis steps median {r['krylov_steps_median']:.0f}" if r.get("krylov_steps_median") is not None
           else f"median LSQR iterations per solve {r['median_lsqr_iterations']:.0f}")
        + f"; bound median {r['bound']['median']:.4g}, p90 {r['bound']['p90']:.4g}, "
        f"{r['bound']['n_inf']} infinite",
    ] + ([f"  peak memory: torch {r['peak_torch_bytes'] / 2**30:.1f} GiB allocated, "
          f"{r.get('peak_torch_reserved_bytes', 0) / 2**30:.1f} GiB reserved; CuPy pool "
          f"{r.get('cupy_pool_bytes', 0) / 2**30:.1f} GiB (solver arrays in {r.get('cupy_allocator')}'s pool)"]
         if "peak_torch_bytes" in r else []))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="the issue's end-to-end GPU targets, one bound() call each")
    ap.add_argument("workload", choices=sorted(TARGETS))
    ap.add_argument("--examples", type=positive_int, default=None, help="default: the target's")
    ap.add_argument("--restarts", type=positive_int, default=None)
    ap.add_argument("--iterations", type=positive_int, default=None)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--jacobian", default="reverse", choices=("reverse", "forward"))
    ap.add_argument("--double-backward", default="lean", choices=("lean", "torch"),
                    help="--jacobian reverse: record the forward under lean_double_backward (one convolution a "
                         "layer per JVP; hcrfast.bindings.jacobian.LEAN_DOUBLE_BACKWARD) or torch's own graph")
    ap.add_argument("--kernels", default=None, choices=("auto", "twin", "numba"))
    ap.add_argument("--compact-below", type=float, default=None,
                    help="LSQROptions.compact_below (0: never compact stopped problems out of the batch)")
    ap.add_argument("--cold-start", action="store_true", help="bound(warm_start=False): every LSQR solve from zero")
    ap.add_argument("--iterates", default="all", choices=("all", "last"),
                    help="bound(iterates=...): every iterate's certified bound (default) or the last one's alone")
    ap.add_argument("--singular-steps", type=steps_arg, default="auto",
                    help="bound(singular_steps=K): a certified step along each of J's K smallest singular directions "
                         "(default auto: bound()'s, 64 with the dense or Krylov solve; 0: Algorithm 1 alone)")
    ap.add_argument("--solver", default="auto", choices=("auto", "lsqr", "dense", "krylov"),
                    help="bound(solver=...); auto: what bound() takes without lsqr= options (on CUDA the Krylov "
                         "basis; with --cold-start, LSQR). dense: J "
                         "built per example and factored (its products are not timed as JVP/VJP). krylov: one "
                         "reorthogonalized basis per example (hcrfast.krylov.DEFAULT_OPTIONS), every step projected")
    ap.add_argument("--krylov-steps", type=positive_int, default=None,
                    help="with --solver krylov: the basis' step limit (iter_lim; default hcrfast.krylov.MAX_STEPS)")
    ap.add_argument("--krylov-pilots", type=pilots_arg, default=None,
                    help="with --solver krylov: bound(krylov_pilots=...), bases per example (restart r is solved "
                         "in the basis of pilot r mod pilots); each pilot's basis runs up to --krylov-steps; "
                         "'auto': hcrfast.krylov.resolve_pilots (ResNet-18: 25 pilots of 163 steps); default: "
                         "bound()'s")
    add_reorth_option(ap)
    ap.add_argument("--eig-impl", default="auto", choices=("auto", "twin", "numba", "lapack", "cusolver", "cupy"),
                    help="with the Krylov basis: how B_k'B_k's eigendecompositions run (hcrfast.krylov.EIG_IMPL; "
                         "twin: SciPy one by one; lapack (auto): LAPACK through ctypes without the GIL, a thread per "
                         "core; numba: the same from a Numba loop; cusolver, cupy: written out dense and decomposed "
                         "on the device by cusolverDnXsyevBatched or CuPy's syevjBatched)")
    ap.add_argument("--dense-eigh", default="auto", choices=("auto", "torch", "lapack", "cusolver", "cupy"),
                    help="with the dense solve: how the Gram matrices' eigendecompositions run (hcrfast.dense.EIGH_IMPL; "
                         "torch: torch.linalg.eigh where J is (cuSOLVER one matrix at a time on CUDA), lapack: "
                         "LAPACK on the host, a matrix per thread; auto: lapack for two or more; cusolver: "
                         "cusolverDnXsyevBatched on the device, cupy: CuPy's syevjBatched on the device)")
    ap.add_argument("--tf32", action="store_true", help="bound(tf32=True): TF32 float32 matmuls and convolutions")
    ap.add_argument("--cupy-allocator", default=None, choices=("torch", "cupy"),
                    help="where the solver's CuPy arrays live: torch's caching allocator (hcrfast's default) or "
                         "CuPy's own pool (sets HCRFAST_CUPY_ALLOCATOR)")
    ap.add_argument("--chunk-size", type=positive_int, default=None,
                    help="examples per chunk (default: from free memory)")
    ap.add_argument("--mnist-root", default=None, help="real MNIST test files (torchvision layout) for 'mnist'")
    ap.add_argument("--threads", type=positive_int, default=None)
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--slices", type=positive_int, default=1,
                    help="split the examples into this many bound() calls (each example keeps its start vectors); "
                         "the JSON is rewritten after every slice, so a run killed by a time limit leaves its figures")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds: stop after the slice that passes it and extrapolate the time to all examples")
    ap.add_argument("--profile", action="store_true",
                    help="also report the host time per hcrfast phase and the GPU time per kernel (torch.profiler; "
                         "slows the run: time the target without it)")
    ap.add_argument("--out", default=None, help="directory for gpu_targets_<workload>_<device>_<date>.json")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cupy_allocator is not None:
        os.environ[ALLOCATOR_ENV] = args.cupy_allocator
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_targets: --device cuda but torch sees no CUDA device; skipped (use --device cpu for a smoke run).")
        return 0
    if args.time_budget is not None and not args.time_budget >= 0:
        ap.error(f"--time-budget {args.time_budget}: pass seconds >= 0 (0 stops after the first slice)")
    path = None
    if args.out:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        path = Path(args.out) / f"gpu_targets_{args.workload}_{args.device}_{stamp}.json"
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(r):
        if path is not None:
            path.write_text(json.dumps(r, indent=2, default=float))

    r = run(args, on_slice=write)
    print(report(r), flush=True)
    if "profile" in r:
        print(profile_report(r["profile"]), flush=True)
    write(r)
    if path is not None:
        print(f"  written {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
