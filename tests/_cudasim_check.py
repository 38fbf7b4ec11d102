"""Check the Numba CUDA kernels against their NumPy twins, without a GPU.

Two modes, each run in its own process by ``tests/test_kernels_cudasim.py``:

``NUMBA_ENABLE_CUDASIM=1 python tests/_cudasim_check.py [--dtype {float32,float64}]``
    Runs every kernel under the CUDA simulator on small shapes, in float32 and
    float64 (or the dtypes given; the test runs one process per dtype), through the public wrappers (NumPy and Numba device-array inputs)
    and through raw launches on deliberately small grids (so that every
    grid-stride loop takes more than one trip). Every output buffer is filled
    with NaN before the kernel runs, so an element a kernel forgets to write
    shows up as a mismatch.

``python tests/_cudasim_check.py --ptx``
    Compiles every kernel for sm_90 with the real CUDA target (type inference,
    lowering and NVVM), which needs libNVVM but no GPU or driver.

Exit status: 0 when everything matches, 1 with one line per mismatch, 2 when
run in the wrong environment, 77 when ``--ptx`` finds no libNVVM.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback

import numpy as np

SEED = 20240611
FAILURES: list[str] = []
CHECKS = 0

TOLERANCE = {
    np.dtype(np.float32): {"rtol": 1e-5, "atol": 1e-5},
    np.dtype(np.float64): {"rtol": 1e-12, "atol": 1e-12},
}


def fail(message: str) -> None:
    FAILURES.append(message)
    print("MISMATCH:", message, flush=True)


def check_close(name, got, want, dtype) -> None:
    """got (host array) equals want within the dtype's tolerance, and every element was written."""
    global CHECKS
    CHECKS += 1
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return fail(f"{name}: shape {got.shape}, expected {want.shape}")
    if got.dtype != np.dtype(dtype):
        return fail(f"{name}: dtype {got.dtype}, expected {np.dtype(dtype)}")
    unwritten = np.isnan(got) & ~np.isnan(want)
    if unwritten.any():
        return fail(f"{name}: {int(unwritten.sum())} of {got.size} elements left unwritten (NaN), "
                    f"first at {tuple(int(i) for i in np.argwhere(unwritten)[0])}")
    tol = TOLERANCE[np.dtype(dtype)]
    if not np.allclose(got, want, **tol):
        err = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
        return fail(f"{name}: max abs error {err:.3g} exceeds rtol={tol['rtol']}, atol={tol['atol']}")


def check_true(name, condition, detail="") -> None:
    global CHECKS
    CHECKS += 1
    if not condition:
        fail(f"{name}: {detail}" if detail else name)


def check_raises(name, exc_type, fn) -> None:
    global CHECKS
    CHECKS += 1
    try:
        fn()
    except exc_type as exc:
        print(f"  ok {name}: {exc_type.__name__}: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - report the wrong type
        return fail(f"{name}: raised {type(exc).__name__}: {exc}, expected {exc_type.__name__}")
    fail(f"{name}: no {exc_type.__name__} raised")


def section(fn):
    """Run one group of checks; an exception counts as a failure and the run goes on."""
    def run():
        start = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001
            fail(f"{fn.__name__} raised:\n{traceback.format_exc()}")
        print(f"{fn.__name__}: {time.perf_counter() - start:.1f} s", flush=True)
    return run


# ---------------------------------------------------------------------------
# Simulator mode
# ---------------------------------------------------------------------------


def simulator_checks(dtypes) -> None:
    from numba import config

    if not config.ENABLE_CUDASIM:
        print("set NUMBA_ENABLE_CUDASIM=1 before running this script (or pass --ptx)", file=sys.stderr)
        sys.exit(2)

    from numba import cuda

    from hcrfast.kernels import cuda as kc
    from hcrfast.kernels import twins

    # Poison every buffer the wrappers allocate, so unwritten elements are NaN.
    allocations = [0]
    device_array = cuda.device_array

    def poisoned_device_array(shape, dtype=np.float64, *args, **kwargs):
        out = device_array(shape, dtype, *args, **kwargs)
        out.copy_to_device(np.full(out.shape, np.nan, dtype=out.dtype))
        allocations[0] += 1
        return out

    cuda.device_array = poisoned_device_array

    # Poison shared memory too: the simulator allocates it with np.empty, whose contents are
    # whatever memory it reuses, so a tile a kernel forgets to fill would be caught only by luck.
    # (kernelapi's own numpy reference is swapped: wrapping FakeCUDAShared.array would change the
    # call site it keys allocations by.)
    import types

    from numba.cuda.simulator import kernelapi

    class PoisonedNumpy(types.ModuleType):
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(shape, dtype=float, *args, **kwargs):
            out = np.empty(shape, dtype, *args, **kwargs)
            if out.dtype.kind == "f":
                out.fill(np.nan)
            return out

    kernelapi.np = PoisonedNumpy("numpy")

    def nan(shape, dtype):
        return cuda.to_device(np.full(shape, np.nan, dtype=dtype))

    def is_device(a):
        return bool(getattr(a, "__cuda_ndarray__", False))

    rng = np.random.default_rng(SEED)

    def rows(shape, dtype, zero_row=None):
        a = rng.standard_normal(shape).astype(dtype)
        if zero_row is not None:
            a[zero_row] = 0
        return a

    @section
    def row_normalize():
        for dtype in dtypes:
            tag = np.dtype(dtype).name
            a = rows((3, 37), dtype, zero_row=1)
            want_scaled, want_norms = twins.normalize_rows(a, 1.0)
            scaled, norms = kc.row_normalize(a, 1.0)
            check_true(f"row_normalize[{tag}] returns NumPy for NumPy input",
                       isinstance(scaled, np.ndarray) and isinstance(norms, np.ndarray))
            check_close(f"row_normalize[{tag}] scaled", scaled, want_scaled, dtype)
            check_close(f"row_normalize[{tag}] norms", norms, want_norms, dtype)
            check_true(f"row_normalize[{tag}] zero row stays zero", np.all(scaled[1] == 0), f"{scaled[1]}")
            check_close(f"row_normalize[{tag}] unit norms", np.linalg.norm(scaled[[0, 2]], axis=1),
                        np.ones(2, dtype), dtype)

            # per-row targets, Numba device arrays in and out, more than 2 axes
            a = rows((3, 2, 3, 5), dtype, zero_row=2)
            target = np.array([0.3, 2.0, 3.0])  # 0.3: a float64 target truncated to float32 shows
            want_scaled, want_norms = twins.normalize_rows(a, target)
            scaled, norms = kc.row_normalize(cuda.to_device(a), cuda.to_device(target))
            check_true(f"row_normalize[{tag}] returns device arrays for device input",
                       is_device(scaled) and is_device(norms))
            check_close(f"row_normalize[{tag}] per-row target scaled", scaled.copy_to_host(), want_scaled, dtype)
            check_close(f"row_normalize[{tag}] per-row target norms", norms.copy_to_host(), want_norms, dtype)
            check_true(f"row_normalize[{tag}] per-row zero row stays zero",
                       np.all(scaled.copy_to_host()[2] == 0))
            # integer per-row targets, which the twins and the dispatch layer take: as float64 (they were refused)
            a = rows((3, 7), dtype)
            want_scaled, want_norms = twins.normalize_rows(a, np.array([1, 2, 3]))
            scaled, norms = kc.row_normalize(a, np.array([1, 2, 3]))
            check_close(f"row_normalize[{tag}] integer per-row targets scaled", scaled, want_scaled, dtype)
            check_close(f"row_normalize[{tag}] integer per-row targets norms", norms, want_norms, dtype)

            # out=: in place and into another array, host and device
            for where in ("in place", "separate"):
                a = rows((4, 29), dtype, zero_row=3)
                want_scaled, want_norms = twins.normalize_rows(a, 1.5)
                host = a.copy()
                out = host if where == "in place" else nan(host.shape, dtype).copy_to_host()
                scaled, norms = kc.row_normalize(host, 1.5, out=out)
                check_true(f"row_normalize[{tag}] out= {where} (host) returns out", scaled is out)
                check_close(f"row_normalize[{tag}] out= {where} (host) scaled", out, want_scaled, dtype)
                check_close(f"row_normalize[{tag}] out= {where} (host) norms", norms, want_norms, dtype)
                dev = cuda.to_device(a)
                dev_out = dev if where == "in place" else nan(a.shape, dtype)
                scaled, norms = kc.row_normalize(dev, 1.5, out=dev_out)
                check_true(f"row_normalize[{tag}] out= {where} (device) returns out", scaled is dev_out)
                check_close(f"row_normalize[{tag}] out= {where} (device) scaled", dev_out.copy_to_host(),
                            want_scaled, dtype)
            check_raises("row_normalize out of another shape", ValueError,
                         lambda: kc.row_normalize(rows((4, 29), dtype), 1.0, out=np.zeros((4, 28), dtype)))

            check_close(f"row_norms[{tag}]", kc.row_norms(a), twins.row_norms(a), dtype)

            # row_norms passes its input as the kernel's `scaled` too: with write_scaled off it
            # must stay as it is. 70 columns get 128 threads (a non-power of two there breaks the
            # tree reduction); 300 get the largest block, 256, the size of the shared buffer.
            for n_cols in (70, 300):
                a = rows((2, n_cols), dtype, zero_row=1)
                dev = cuda.to_device(a)
                check_close(f"row_norms[{tag}] {n_cols} columns (device)", kc.row_norms(dev).copy_to_host(),
                            twins.row_norms(a), dtype)
                check_true(f"row_norms[{tag}] {n_cols} columns leaves its input alone",
                           np.array_equal(dev.copy_to_host(), a))

            # raw launch, one block of 32 threads: both grid-stride loops take several trips
            a = rows((3, 37), dtype, zero_row=0)
            target = np.array([1.0, 0.25, 4.0])
            want_scaled, want_norms = twins.normalize_rows(a, target)
            scaled, norms = nan((3, 37), dtype), nan((3,), dtype)
            kc._kernels(np.dtype(dtype)).row_normalize[1, 32](
                cuda.to_device(a), cuda.to_device(target), 0.0, True, True, scaled, norms)
            check_close(f"row_normalize kernel[{tag}] 1 block x 32 threads, scaled",
                        scaled.copy_to_host(), want_scaled, dtype)
            check_close(f"row_normalize kernel[{tag}] 1 block x 32 threads, norms",
                        norms.copy_to_host(), want_norms, dtype)

    @section
    def lsqr_update_xw():
        for dtype in dtypes:
            tag = np.dtype(dtype).name
            x, w, v = (rows((3, 37), dtype) for _ in range(3))
            t1 = rng.standard_normal(3)
            t2 = rng.standard_normal(3)
            t1[1], t2[1], v[1] = 0.0, 1.0, 0.0  # a frozen problem
            want_x, want_w = twins.lsqr_update_xw(x.copy(), w.copy(), v, t1, t2)
            x_in, w_in = x.copy(), w.copy()
            got_x, got_w = kc.lsqr_update_xw(x_in, w_in, v, t1, t2)
            check_true(f"lsqr_update_xw[{tag}] updates NumPy inputs in place", got_x is x_in and got_w is w_in)
            check_close(f"lsqr_update_xw[{tag}] x", x_in, want_x, dtype)
            check_close(f"lsqr_update_xw[{tag}] w", w_in, want_w, dtype)
            # elementwise, no reduction: under the simulator the kernel rounds exactly as the twin's
            # in-place NumPy ops (float64 steps on float32 rows), which a tolerance cannot see
            check_true(f"lsqr_update_xw[{tag}] bit-exact roundings",
                       np.array_equal(x_in, want_x) and np.array_equal(w_in, want_w))
            check_true(f"lsqr_update_xw[{tag}] frozen problem unchanged",
                       np.array_equal(x_in[1], x[1]) and np.array_equal(w_in[1], w[1]))

            # device arrays, more than 2 axes, float32 per-problem steps
            shape = (3, 2, 3, 5)
            x, w, v = (rows(shape, dtype) for _ in range(3))
            t1, t2 = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
            want_x, want_w = twins.lsqr_update_xw(x.copy(), w.copy(), v, t1, t2)
            xd, wd = cuda.to_device(x), cuda.to_device(w)
            kc.lsqr_update_xw(xd, wd, cuda.to_device(v), cuda.to_device(t1), cuda.to_device(t2))
            check_close(f"lsqr_update_xw[{tag}] device x", xd.copy_to_host(), want_x, dtype)
            check_close(f"lsqr_update_xw[{tag}] device w", wd.copy_to_host(), want_w, dtype)

            # raw launch on a 1 × 1 grid of 32 × 1 threads: rows and columns both stride
            x, w, v = (rows((3, 37), dtype) for _ in range(3))
            t1, t2 = rng.standard_normal(3), rng.standard_normal(3)
            want_x, want_w = twins.lsqr_update_xw(x.copy(), w.copy(), v, t1, t2)
            xd, wd = cuda.to_device(x), cuda.to_device(w)
            kc._kernels(np.dtype(dtype)).lsqr_update_xw[(1, 1), (32, 1)](
                xd, wd, cuda.to_device(v), cuda.to_device(t1), cuda.to_device(t2))
            check_close(f"lsqr_update_xw kernel[{tag}] 1x1 grid, x", xd.copy_to_host(), want_x, dtype)
            check_close(f"lsqr_update_xw kernel[{tag}] 1x1 grid, w", wd.copy_to_host(), want_w, dtype)
            check_true(f"lsqr_update_xw kernel[{tag}] 1x1 grid bit-exact roundings",
                       np.array_equal(xd.copy_to_host(), want_x) and np.array_equal(wd.copy_to_host(), want_w))

    @section
    def restart_update():
        for dtype in dtypes:
            tag = np.dtype(dtype).name
            f0 = rows((3, 37), dtype)
            fp = rows((3, 37), dtype)
            fp[1] = f0[1]  # z = 0 in row 1
            for target in (0.7, np.array([0.5, 1.0, 0.3])):  # 0.7, 0.3: not exact in float32
                kind = "scalar" if np.ndim(target) == 0 else "per-row"
                want = twins.restart_update(fp, f0, target)
                got = kc.restart_update(fp, f0, target)
                for name, g, wnt in zip(("z", "znorm", "ztilde"), got, want):
                    check_close(f"restart_update[{tag}, {kind} target] {name}", g, wnt, dtype)
                check_true(f"restart_update[{tag}, {kind}] zero row stays zero", np.all(got[2][1] == 0))

            fp4, f04 = rows((3, 2, 3, 5), dtype), rows((3, 2, 3, 5), dtype)
            want = twins.restart_update(fp4, f04, 1.5)
            got = kc.restart_update(cuda.to_device(fp4), cuda.to_device(f04), 1.5)
            check_true(f"restart_update[{tag}] returns device arrays", all(is_device(g) for g in got))
            for name, g, wnt in zip(("z", "znorm", "ztilde"), got, want):
                check_close(f"restart_update[{tag}, device] {name}", g.copy_to_host(), wnt, dtype)

            # raw launch: one block of 32 threads
            target = np.array([1.0, 2.0, 0.5])
            want = twins.restart_update(fp, f0, target)
            outs = (nan((3, 37), dtype), nan((3,), dtype), nan((3, 37), dtype))
            kc._kernels(np.dtype(dtype)).restart_update[1, 32](
                cuda.to_device(fp), cuda.to_device(f0), cuda.to_device(target), 0.0, True, *outs)
            for name, g, wnt in zip(("z", "znorm", "ztilde"), outs, want):
                check_close(f"restart_update kernel[{tag}] 1 block x 32 threads, {name}",
                            g.copy_to_host(), wnt, dtype)

    @section
    def dct():
        # (1, 3, 5, 7) goes in and out as Numba device arrays; (8, 8) has no leading
        # axes and runs in float64 only (the simulator is slow); (5, 20) has more column
        # tiles than row tiles, so grid x and y (and blockIdx.x and .y) cannot be swapped
        shapes = [(2, 1, 8, 8), (1, 3, 5, 7), (1, 1, 28, 28), (8, 8), (1, 5, 20)]
        for dtype in dtypes:
            tag = np.dtype(dtype).name
            for shape in shapes:
                if shape == (8, 8) and dtype == np.float32:
                    continue
                x = rows(shape, dtype)
                if shape == (1, 3, 5, 7):
                    y_dev = kc.dct2(cuda.to_device(x))
                    back_dev = kc.idct2(y_dev)
                    check_true(f"dct2/idct2[{tag}] return device arrays for device input",
                               is_device(y_dev) and is_device(back_dev))
                    y, back = y_dev.copy_to_host(), back_dev.copy_to_host()
                else:
                    y = kc.dct2(x)
                    back = kc.idct2(y)
                check_close(f"dct2[{tag}] {shape}", y, twins.dct2(x), dtype)
                check_close(f"idct2[{tag}] {shape}", back, twins.idct2(y), dtype)
                check_close(f"idct2(dct2(x))[{tag}] {shape}", back, x, dtype)

            # raw launch, batch 3 on a grid of depth 1: the batch loop strides
            a = rows((3, 5, 7), dtype)
            b = rows((1, 7, 6), dtype)
            out = nan((3, 5, 6), dtype)
            kc._kernels(np.dtype(dtype)).batched_matmul[(1, 1, 1), (16, 16)](
                cuda.to_device(a), cuda.to_device(b), out)
            check_close(f"batched_matmul kernel[{tag}] batch-strided", out.copy_to_host(), a @ b, dtype)

    @section
    def launch_config():
        # block_sum's tree reduction needs a power of two, and the shared buffer holds _MAX_ROW_THREADS
        bad = [n for n in range(1, 2049)
               if not (kc._MIN_ROW_THREADS <= kc._row_threads(n) <= kc._MAX_ROW_THREADS
                       and kc._row_threads(n) & (kc._row_threads(n) - 1) == 0)]
        check_true("row threads: a power of two within the shared buffer", not bad, f"bad for n_cols {bad[:5]}")

    @section
    def errors():
        a = rows((3, 37), np.float64)
        check_raises("integer input", TypeError, lambda: kc.row_normalize(np.ones((3, 4), dtype=np.int64)))
        check_raises("float16 input", TypeError, lambda: kc.dct2(np.ones((2, 4, 4), dtype=np.float16)))
        check_raises("target of the wrong length", ValueError, lambda: kc.row_normalize(a, np.ones(4)))
        check_raises("restart shape mismatch", ValueError, lambda: kc.restart_update(a, a[:, :36].copy(), 1.0))
        check_raises("restart dtype mismatch", TypeError,
                     lambda: kc.restart_update(a, a.astype(np.float32), 1.0))
        check_raises("mixed NumPy and device arrays", TypeError,
                     lambda: kc.restart_update(a, cuda.to_device(a), 1.0))
        x = np.zeros((37, 3)).T  # not C-contiguous: an in-place update cannot go through a copy
        check_raises("non-contiguous x", ValueError,
                     lambda: kc.lsqr_update_xw(x, np.zeros((3, 37)), np.zeros((3, 37)), np.ones(3), np.ones(3)))
        check_raises("DCT of a 1-D array", ValueError, lambda: kc.dct2(np.ones(8)))
        empty_scaled, empty_norms = kc.row_normalize(np.ones((0, 5)))
        check_true("empty batch", empty_scaled.shape == (0, 5) and empty_norms.shape == (0,))

    for run in (row_normalize, lsqr_update_xw, restart_update, dct, launch_config, errors):
        run()
    check_true("outputs were poisoned", allocations[0] > 0, "the NaN-filling allocator was never called")


# ---------------------------------------------------------------------------
# PTX mode
# ---------------------------------------------------------------------------


def ptx_checks() -> None:
    from numba import config

    if config.ENABLE_CUDASIM:
        print("--ptx needs the real CUDA target: unset NUMBA_ENABLE_CUDASIM", file=sys.stderr)
        sys.exit(2)
    from numba.cuda.cudadrv import nvvm

    if not nvvm.is_available():
        print("libNVVM not found; skipping the PTX compile check")
        sys.exit(77)

    import types

    import numba.cuda.dispatcher
    from numba import cuda

    from hcrfast.kernels import cuda as kc

    # Device functions are compiled for the current device's compute capability;
    # with no GPU here, say sm_90 (H100/H200).
    numba.cuda.dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))

    for dtype in ("float32", "float64"):
        kernels = kc._kernels(np.dtype(dtype))
        m2, v1 = f"{dtype}[:, ::1]", f"{dtype}[::1]"
        signatures = {
            # scalar target (the norms buffer stands in for the unused targets) and per-row float64 targets
            "row_normalize": [f"void({m2}, {v1}, float64, boolean, boolean, {m2}, {v1})",
                              f"void({m2}, float64[::1], float64, boolean, boolean, {m2}, {v1})"],
            "restart_update": [f"void({m2}, {m2}, {v1}, float64, boolean, {m2}, {v1}, {m2})",
                               f"void({m2}, {m2}, float64[::1], float64, boolean, {m2}, {v1}, {m2})"],
            "lsqr_update_xw": [f"void({m2}, {m2}, {m2}, float64[::1], float64[::1])",
                               f"void({m2}, {m2}, {m2}, float32[::1], float32[::1])"],
            "batched_matmul": [f"void({dtype}[:, :, ::1], {dtype}[:, :, ::1], {dtype}[:, :, ::1])"],
        }
        for name, sigs in signatures.items():
            for sig in sigs:
                start = time.perf_counter()
                try:
                    ptx, _ = cuda.compile_ptx(getattr(kernels, name).py_func, sig, cc=(9, 0))
                except Exception:  # noqa: BLE001
                    fail(f"{name} {sig} does not compile:\n{traceback.format_exc()}")
                    continue
                check_true(f"{name} {sig} PTX", ".entry" in ptx, "no kernel entry in the PTX")
                if dtype == "float32" and name != "lsqr_update_xw":
                    # float32 kernels compute in float32: float64 targets are only loaded and
                    # converted, and an f64 arithmetic op would be a silent promotion
                    f64_ops = set(re.findall(r"\b[a-z]+(?:\.[a-z0-9]+)*\.f64\b", ptx))
                    f64_ops -= {"ld.param.f64", "ld.global.f64", "cvt.rn.f32.f64"}
                    check_true(f"{name} {sig} stays float32", not f64_ops,
                               f"float64 instructions in a float32 kernel: {sorted(f64_ops)}")
                print(f"  compiled {name} {sig} in {time.perf_counter() - start:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptx", action="store_true", help="compile to PTX instead of simulating")
    parser.add_argument("--dtype", choices=("float32", "float64"), action="append",
                        help="simulate this dtype only (repeatable; default both)")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.ptx:
        ptx_checks()
    else:
        simulator_checks(tuple(np.dtype(d).type for d in (args.dtype or ("float32", "float64"))))
    elapsed = time.perf_counter() - start
    if FAILURES:
        print(f"\nFAILED: {len(FAILURES)} of {CHECKS} checks ({elapsed:.1f} s):", file=sys.stderr)
        for message in FAILURES:
            print(f"  - {message}", file=sys.stderr)
        return 1
    print(f"all {CHECKS} checks passed in {elapsed:.1f} s "
          f"(NUMBA_ENABLE_CUDASIM={os.environ.get('NUMBA_ENABLE_CUDASIM', '')!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
