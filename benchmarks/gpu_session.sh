#!/usr/bin/env bash
# Everything a GPU machine should run for hcrfast, in stages, so that a short lease is spent
# in few, full calls. Each stage appends to one log and writes its JSON next to it.
#
#   bash benchmarks/gpu_session.sh STAGE [STAGE ...]
#
#   setup     install hcrfast without dependencies (offline: --no-build-isolation) and print
#             the versions and the device
#   tests     pytest -m gpu (GPU vs CPU, zero-copy, no host copy inside LSQR, kernels vs twins); the
#             CPU suites are CI's
#   kernels   pytest-benchmark of the kernels (Numba vs twin on CuPy vs library) and the batched
#             LSQR on the GPU -> bench_gpu_kernels.json (chooses the "auto" kernels)
#   modes     the MNIST MLP at 1,000 examples: JVP by double VJP vs forward mode, compaction
#             of stopped problems on vs off, Numba vs twin kernels, TF32, and what solver="auto"
#             takes on CUDA (the Krylov basis, "auto" Gram-Schmidt vs two passes every step) vs LSQR
#             (warm and cold starts) vs the dense solve, the solver's arrays in torch's caching
#             allocator (the default) vs CuPy's own pool
#   mnist     the issue's target: 10,000 examples, R = 25, i = 10 (< 60 s, >= 85% in JVP/VJP),
#             with solver="auto" (the Krylov basis on CUDA)
#   race      the reference method vs hcrfast on the same GPU (MNIST MLP, 32 examples, R = 2:
#             the reference's joint SciPy LSQR needs ~35k host-driven products at that size; at
#             256 x R = 25 it needs > 390k, far beyond one 10-minute call)
#   resnet18-krylov  the issue's target, ResNet-18 at 91x91, 128 x 25 x 10 (< 10 min), with
#             solver="krylov" (what "auto" takes: one reorthogonalized Krylov basis per example, every
#             step projected on it: ~2 x 4,096 products per example instead of LSQR's ~25 x 7,800),
#             in 4 slices of 32 under a 360-s budget: what is not done by then is extrapolated
#   resnet18  the same target with LSQR (warm starts), in 16 slices of 8 examples under a 360-s
#             budget (an estimate puts the whole run near 1e17 FLOP in IEEE float32, beyond one call)
#   tf32      ResNet-18 at 2 examples, R = 25, i = 1, IEEE float32 (the default) vs --tf32
#
# MODES="--jacobian forward|--solver dense" picks the modes ('|'-separated; the default set, six,
# fits one call).
#
# Every command runs under `timeout` (TIMEOUT_S, default 240 s) so that one slow run cannot eat
# the device tool's 10-minute call. Results go to a local folder and, after every command, into
# ONE tarball in $OUT (the tool brings back at most 8 files): $OUT/gpu_session.tgz + the log.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=benchmarks/results/gpu_session
mkdir -p "$DEST"
LOG="${OUT:-$DEST}/gpu_session.log"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
TIMEOUT_S=${TIMEOUT_S:-240}

say() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
pack() { if [ -n "${OUT:-}" ]; then tar -czf "$OUT/gpu_session.tgz" -C "$DEST" . 2>/dev/null; fi; }
# --line-buffered: a command killed at the tool's limit must not lose grep's last 4 KiB of output
run() {
    timeout -k 10 "$TIMEOUT_S" "$@" 2>&1 | grep --line-buffered -v "FutureWarning\|warnings.warn" | tee -a "$LOG"
    local rc="${PIPESTATUS[0]}"
    [ "$rc" = 124 ] && say "TIMEOUT after ${TIMEOUT_S} s: $*"
    pack
    return "$rc"
}

ensure_installed() {
    if "$PY" -c "import hcrfast.kernels, hcrfast.bindings" 2>/dev/null; then return 0; fi
    say "install hcrfast (editable, no dependencies, no build isolation: the machine is offline)"
    if ! run "$PY" -m pip install -q --no-deps --no-build-isolation -e .; then
        # Last resort: the layout of the wheel, put together by hand (kernels/ and bindings/
        # become hcrfast.kernels and hcrfast.bindings, as pyproject's package-dir maps them).
        say "pip failed; staging the package layout on PYTHONPATH instead"
        stage=/tmp/hcrfast_stage && rm -rf "$stage" && mkdir -p "$stage"
        cp -r hcrfast "$stage/" && cp -r kernels "$stage/hcrfast/kernels" && cp -r bindings "$stage/hcrfast/bindings"
        export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
        # `python -m pytest` / `python -c` put the repo root first on sys.path, where ./hcrfast
        # (without kernels/ and bindings/) would shadow the staged package: don't add it.
        export PYTHONSAFEPATH=1
    fi
}

for stage in "$@"; do
    case "$stage" in
    setup)
        ensure_installed
        say "environment"
        run nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        run "$PY" - <<'EOF'
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
for d in ("cupy-cuda13x", "cupy-cuda12x", "numba", "numba-cuda", "numpy", "scipy", "torchvision", "nvtx",
          "scikit-learn", "matplotlib", "pytest-benchmark"):  # --no-deps: a missing one shows here, not mid-run
    try:
        print(f"  {d} {md.version(d)}")
    except md.PackageNotFoundError:
        print(f"  {d} -")
from hcrfast.backend import cuda_available
print("hcrfast sees CuPy + CUDA:", cuda_available())
EOF
        say "smoke: one Numba kernel and one twin on a CuPy array, on torch's stream"
        run "$PY" - <<'EOF'
import numba.cuda, torch
numba.cuda.detect()
import cupy as cp
from hcrfast import kernels
from hcrfast.bindings import solver_stream
with solver_stream(torch.device("cuda")):
    a = cp.arange(32, dtype=cp.float32).reshape(4, 8)
    for impl in ("numba", "twin"):
        print(impl, cp.asnumpy(kernels.row_norms(a, impl=impl)))
EOF
        ;;
    tests)
        ensure_installed
        # Only the GPU tests: CI runs the CPU suites (the simulator's among them) on every submission.
        say "pytest -m gpu"
        run "$PY" -m pytest tests -m gpu -q -rs -p no:cacheprovider
        ;;
    kernels)
        ensure_installed
        say "kernel and LSQR benchmarks on the GPU"
        run "$PY" -m pytest benchmarks/test_bench_kernels.py benchmarks/test_bench_lsqr.py benchmarks/test_bench_bridge.py \
            -m gpu --benchmark-only -q -p no:cacheprovider --benchmark-columns=min,median,max,rounds \
            --benchmark-json "$DEST/bench_gpu_kernels.json"
        ;;
    modes)
        ensure_installed
        # The default set fits one 600-s call (6 x 75 s plus the install); the others:
        # MODES="--compact-below 0|--kernels twin|--kernels numba|--tf32|--cold-start"
        IFS='|' read -r -a modes <<< "${MODES:---jacobian reverse|--reorth-passes 2|--solver dense|--solver lsqr|--jacobian forward|--cupy-allocator cupy}"
        if (( ${#modes[@]} * ${MODE_TIMEOUT_S:-75} > 540 )); then
            say "note: ${#modes[@]} modes x ${MODE_TIMEOUT_S:-75} s may outlast one 600-s call; split MODES over calls"
        fi
        for flags in "${modes[@]}"; do
            say "gpu_targets mnist --examples 1000 $flags"
            TIMEOUT_S=${MODE_TIMEOUT_S:-75} run "$PY" benchmarks/gpu_targets.py mnist --examples 1000 --slices 4 \
                --time-budget 45 $flags --out "$DEST"
        done
        ;;
    mnist)
        ensure_installed
        say "gpu_targets mnist (10,000 x 25 x 10, solver auto)"
        TIMEOUT_S=${MNIST_TIMEOUT_S:-240} run "$PY" benchmarks/gpu_targets.py mnist --slices 4 --time-budget 180 \
            --progress --out "$DEST"
        ;;
    race)
        ensure_installed
        say "race on the GPU: reference vs hcrfast (MNIST MLP, 32 examples, R = 2, i = 10)"
        TIMEOUT_S=${RACE_TIMEOUT_S:-300} run "$PY" benchmarks/race.py --model mlp --examples 32 --restarts 2 \
            --iterations 10 --size 0.005 --device cuda --sweep-budget 60 --out "$DEST"
        ;;
    resnet18)
        ensure_installed
        say "gpu_targets resnet18 --solver lsqr (128 x 25 x 10 in 16 slices, 360-s budget, the rest extrapolated)"
        TIMEOUT_S=${RESNET_TIMEOUT_S:-480} run "$PY" benchmarks/gpu_targets.py resnet18 --solver lsqr --slices 16 \
            --time-budget "${RESNET_BUDGET_S:-360}" --progress --out "$DEST"
        ;;
    resnet18-krylov)
        ensure_installed
        say "gpu_targets resnet18 --solver krylov (128 x 25 x 10 in 4 slices, 360-s budget, the rest extrapolated)"
        TIMEOUT_S=${RESNET_TIMEOUT_S:-480} run "$PY" benchmarks/gpu_targets.py resnet18 --solver krylov --slices 4 \
            --time-budget "${RESNET_BUDGET_S:-360}" --progress --out "$DEST"
        ;;
    tf32)
        ensure_installed
        for flags in "" "--tf32"; do
            say "gpu_targets resnet18 --examples 2 --iterations 1 $flags"
            TIMEOUT_S=${TF32_TIMEOUT_S:-150} run "$PY" benchmarks/gpu_targets.py resnet18 --examples 2 --iterations 1 \
                --solver lsqr $flags --out "$DEST"
        done
        ;;
    *)
        echo "unknown stage '$stage'; stages: setup tests kernels modes mnist race resnet18 resnet18-krylov tf32" >&2
        exit 2
        ;;
    esac
done
