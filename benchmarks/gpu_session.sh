#!/usr/bin/env bash
# Everything a GPU machine should run for hcrfast, in stages, so that a short lease is spent
# in few, full calls. Each stage appends to one log and writes its JSON next to it.
#
#   LEASE_S=450 bash benchmarks/gpu_session.sh lease     # the first call of a lease (see below)
#   LEASE_S=260 bash benchmarks/gpu_session.sh lease2    # the second, at once: budget_left_s - 90
#   bash benchmarks/gpu_session.sh STAGE [STAGE ...]
#
#   lease     = setup mnist race tests: the issues' MNIST and 50x targets, then the GPU tests (the targets
#             first: the tests stage takes what is left, and 58 tests may not all finish in it)
#   lease2    = setup resnet18-krylov tf32 mnist-dense modes kernels profile: the ResNet-18 target (25 Krylov
#             pilots per example, 8 examples a call, extrapolated), what TF32 does to its time and bounds, the
#             MNIST target with the dense
#             solve on the device (the first call ran MNIST with the default), then with
#             what is left the modes, the kernels against the libraries (short rounds), and where the
#             Krylov basis' MNIST time goes (the first H100 run, 2026-11-27, found it host-bound)
#   setup     install hcrfast without dependencies (offline: --no-build-isolation), the carried wheels,
#             print the versions and the device, find libNVVM for numba-cuda
#   tests     a warm-up first, once per machine (the first compilations of CuPy's and the Numba kernels,
#             timed, so that no test spends its timeout on them; the timing scripts warm up themselves;
#             WARM_UP=0 skips it),
#             then pytest -m gpu -v on the files that hold GPU tests (GPU vs CPU, zero-copy, no host copy
#             inside LSQR, kernels vs twins), each test's name as it runs; the CPU suites are CI's
#   retest    pytest -m gpu -k "$RETEST": the GPU tests an earlier call failed
#   profile   one MNIST slice (1,250 x 25 x 10) under gpu_targets.py --profile (host time per hcrfast
#             phase, GPU time per kernel), then benchmarks/gs_variants.py (the Gram-Schmidt pass' forms)
#   kernels   pytest-benchmark of the dense solve's Gram eigendecompositions (host LAPACK vs cuSOLVER one
#             by one through torch vs batched: cusolverDnXsyevBatched, CuPy's syevjBatched),
#             the kernels (Numba vs twin on CuPy vs library), the batched LSQR -> bench_gpu_kernels.json
#             (chooses the "auto" kernels); then ResNet-18's and Swin-T's products (JVP by double VJP through
#             the lean graph and torch's, forward mode) -> bench_gpu_products.json; ViT-B/16's (the lean
#             graph's attention vs the MATH backend's graph) -> bench_gpu_attention.json; lean_zoo.py (the
#             lean graph vs torch's on seven torchvision models, 8 rows) -> lean_zoo_gpu.json
#   modes     the MNIST MLP at 1,000 examples: what solver="auto" takes on CUDA (the Krylov basis) vs the
#             dense solve (its Gram matrices on the host's LAPACK, the default, vs cuSOLVER batched on the
#             device, vs cuSOLVER one by one through torch, vs CuPy's syevjBatched), the basis' B_k'B_k
#             decomposed on the device (--eig-impl cusolver) instead of the host,
#             JVP by double VJP vs forward mode, LSQR, "auto" Gram-Schmidt vs two passes every step, the
#             solver's arrays in torch's caching allocator (the default) vs CuPy's own pool; by MODES:
#             compaction on vs off, Numba vs twin kernels, TF32, cold starts
#   mnist     the issue's target: 10,000 examples, R = 25, i = 10 (< 60 s, >= 85% in JVP/VJP),
#             with solver="auto" (the Krylov basis on CUDA), in MNIST_SLICES (2) calls
#   mnist-dense  the same target with the dense solve, its Gram matrices decomposed on the device
#             (--dense-eigh ${DENSE_EIGH:-cusolver}: cusolverDnXsyevBatched), in MNIST_SLICES calls
#   race      the reference method vs hcrfast on the same GPU (MNIST MLP, 32 examples, R = 2; the
#             dense solve's rows with its Gram matrices on the host's LAPACK and on the device;
#             the reference's joint SciPy LSQR needs ~35k host-driven products at that size; at
#             256 x R = 25 it needs > 390k, far beyond one call)
#   resnet18-krylov  the issue's target, ResNet-18 at 91x91, 128 x 25 x 10 (< 10 min), with
#             solver="krylov" and RESNET_PILOTS (default auto: 25 reorthogonalized Krylov bases of 163
#             steps per example, each restart's steps projected on its pilot's: ~2 x 4,096 products per
#             example instead of LSQR's ~25 x 7,800; at equal products a higher median bound than one
#             basis of 4,096 steps on CPU, benchmarks/README.md), in RESNET_SLICES (16: 8 examples a call)
#             slices under what the call has left: what is not done by then is extrapolated. With ONE
#             basis of 4,096 steps the H100 took 98.9 s for a call of 4 (23 ms a step, 13.8 ms of it in
#             the model's products at a batch of 4, far from filling the GPU; the Gram-Schmidt passes
#             ~1 ms): 3,163 s extrapolated. 25 pilots make 163 steps of 200 rows a call of 8, in the
#             same memory (25 x 164 x 2 x ~25,000 float32 values, 0.8 GB an example).
#   resnet18  the same target with LSQR (warm starts), in 16 slices of 8 examples, likewise
#   tf32      ResNet-18 at 2 examples, R = 25, i = 10, the defaults, IEEE float32 vs the hardware's TF32
#             (benchmarks/tf32_cost.py): the time and the median bound both ways, and the product errors of
#             TF32 against those of the CPU's emulation of it (which put ResNet-18's median 6-7% lower, 2026-11-29)
#   summary   the table of what ran (also printed by itself at the end of every call)
#
# The lease (device tool, 2026-11): 15 minutes of device time per task IN ALL, machine start
# (a minute or more), every call, idle waits and the close included; one call at most 600 s; a
# machine left idle 30 s goes back, and a later call starts a bare one. So: two calls at most,
# the second issued at once after the first replies. LEASE_S (default 450) is the wall time of
# this whole call: every command runs under `timeout` sized to what the call has left (and to its
# own cap), a command that would get less than its minimum (MIN, default MIN_RUN_S = 20; the race
# 90, MNIST 90, the kernels 60, ResNet-18 120 (its Krylov run 150), the dense MNIST 60, a mode 50: less could not finish it) is skipped and
# recorded as such, and the in-run time budgets of gpu_targets.py follow the same clock; RESERVE_S
# (15) is kept for the summary. Give the device tool a timeout_s ~30 s above LEASE_S (a command killed
# at its cap gets 10 s of grace). For the second
# call, LEASE_S = the status' budget_left_s minus ~90 s (the command's start, transfers, the close).
#
# MODES="--jacobian forward|--solver dense" picks the modes ('|'-separated).
#
# Results go to a local folder and, after every command and every PACK_EVERY_S (20) s during one, into
# ONE tarball in $OUT (the tool brings back at most 8 files), replaced whole (written aside, then
# renamed: a call killed mid-write keeps the last complete one): $OUT/gpu_session.tgz + the log. So a
# call the device tool kills (its limit, or the session's device time) still brings back every slice a
# script had written. Each command's output also goes
# to <stage>.out and a line to ledger.tsv (stage, status, seconds, command, call) in that folder, which
# the summary (benchmarks/gpu_summary.py) reads with the JSONs.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${GPU_SESSION_DEST:-benchmarks/results/gpu_session}
LOG="${OUT:-$DEST}/gpu_session.log"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
TIMEOUT_S=${TIMEOUT_S:-240}

LEASE_S=${LEASE_S:-450}
RESERVE_S=${RESERVE_S:-15}
MIN_RUN_S=${MIN_RUN_S:-20}
DEADLINE=$(( $(date +%s) + LEASE_S ))
STAGE=setup

say() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
pack() {
    if [ -n "${OUT:-}" ]; then
        tar -czf "$OUT/.gpu_session.tgz.part" -C "$DEST" . 2>/dev/null && mv -f "$OUT/.gpu_session.tgz.part" "$OUT/gpu_session.tgz"
    fi
}
# ledger STATUS SECONDS COMMAND: one row (stage, status, seconds, command, call); the call (its start and
# stages) tells the rows of two calls on one warm machine apart, which share the folder
CALL="$(date -u +%H:%M:%S) $*"
ledger() { printf '%s\t%s\t%s\t%s\t%s\n' "$STAGE" "$1" "$2" "${3//$'\t'/ }" "$CALL" >> "$DEST/ledger.tsv"; }
# fit CAP: the seconds a command may run now, its cap or what the call has left before its reserve
fit() { local left=$(( DEADLINE - $(date +%s) - RESERVE_S )); echo $(( left < $1 ? left : $1 )); }
# run CMD...: under `timeout` (T, default TIMEOUT_S, cut to fit the call), logged, recorded, packed.
# --line-buffered: a command killed at the tool's limit must not lose grep's last 4 KiB of output
run() {
    local t t0 rc
    t=$(fit "${T:-$TIMEOUT_S}")
    if (( t < ${MIN:-$MIN_RUN_S} )); then
        say "SKIPPED ($t s left of LEASE_S=$LEASE_S): $*"
        ledger skipped 0 "$*"
        return 125
    fi
    t0=$(date +%s)
    local packer=
    if [ -n "${OUT:-}" ]; then  # what the command writes reaches $OUT while it runs, not only after it
        # TERM ends it at once while it sleeps (wait is interrupted; its sleep is ended too) and only after a
        # tar it is running (the trap waits for it): never two tars on the same .part file. Its output goes
        # nowhere: a sleep left holding the call's stdout kept the device tool's reply waiting.
        ( trap 'kill "$s" 2>/dev/null; exit 0' TERM; s=
          while :; do sleep "${PACK_EVERY_S:-20}" & s=$!; wait "$s"; pack; done ) >/dev/null 2>&1 & packer=$!
    fi
    timeout -k 10 "$t" "$@" 2>&1 | grep --line-buffered -v "FutureWarning\|warnings.warn" | tee -a "$LOG" "$DEST/$STAGE.out"
    rc="${PIPESTATUS[0]}"
    if [ -n "$packer" ]; then kill "$packer" 2>/dev/null; wait "$packer" 2>/dev/null; fi
    case "$rc" in
        0) ledger ok $(( $(date +%s) - t0 )) "$*" ;;
        124|137) say "TIMEOUT after $t s: $*"; ledger timeout $(( $(date +%s) - t0 )) "$*" ;;
        *) ledger "rc=$rc" $(( $(date +%s) - t0 )) "$*" ;;
    esac
    pack
    return "$rc"
}
# budget CAP OVERHEAD: a gpu_targets.py --time-budget for a command capped at CAP s that spends
# OVERHEAD s outside its slices (imports, model, warm-up): what is left of the fitted cap, or 0
# (stop after the first slice)
budget() { local t; t=$(fit "$1"); echo $(( t - $2 > 0 ? t - $2 : 0 )); }
summary() {
    STAGE=summary
    "$PY" benchmarks/gpu_summary.py "$DEST" 2>&1 | tee -a "$LOG" "$DEST/summary.txt"
    if [ "${PIPESTATUS[0]}" != 0 ]; then  # the table failed: the raw ledger still says what ran
        echo "== ledger (stage, status, seconds, command, call)" | tee -a "$LOG"
        tee -a "$LOG" < "$DEST/ledger.tsv" 2>/dev/null
    fi
    pack
}

INSTALLED=
WHEELS=${WHEELS:-.whl}
WARM_MARK=${WARM_MARK:-/tmp/hcrfast_warm.done}   # once per machine: a second call on a warm one finds it
ensure_installed() {  # once per call: the check imports torch (seconds), and a lease has none to spare
    [ -n "$INSTALLED" ] && return 0
    INSTALLED=1
    # Wheels the image lacks, carried in $WHEELS (benchmarks/fetch_wheels.sh): installed once per machine,
    # put on the path by every call.
    if compgen -G "$WHEELS/*.whl" > /dev/null; then
        if [ ! -e /tmp/hcrfast_site/.done ]; then
            say "install the carried wheels: $(cd "$WHEELS" && echo *.whl)"
            # The wheels this Python can install, the newest of each project, in ONE pip call (--target per
            # wheel replaces a namespace package two share, nvidia/): a wheel for another Python
            # (fetch_wheels.sh with PY_VERSION) made pip refuse them all. packaging's tags tell (pip's own copy
            # where it is not installed); a name that is no wheel's is left out, said on stderr.
            local -a wheels
            mapfile -t wheels < <("$PY" - "$WHEELS"/*.whl <<'EOF'
import os, sys
try:
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename
except ImportError:
    try:
        from pip._vendor.packaging.tags import sys_tags
        from pip._vendor.packaging.utils import parse_wheel_filename
    except ImportError:
        print("\n".join(sys.argv[1:]))
        raise SystemExit
ours, newest = set(sys_tags()), {}
for path in sys.argv[1:]:
    name = os.path.basename(path)
    try:
        project, version, _, tags = parse_wheel_filename(name)
    except Exception:
        print(f"  (not a wheel's name, left out: {name})", file=sys.stderr)
        continue
    if not tags & ours:
        print(f"  (not for this Python, left out: {name})", file=sys.stderr)
    elif project not in newest or version > newest[project][0]:
        newest[project] = (version, path)
print("\n".join(path for _, path in newest.values()))
EOF
)
            if (( ${#wheels[@]} )); then
                local -a pip_args=(-m pip install -q --no-index --disable-pip-version-check --no-deps --no-compile
                                   --no-cache-dir --upgrade --target /tmp/hcrfast_site)
                if run "$PY" "${pip_args[@]}" "${wheels[@]}"; then
                    touch /tmp/hcrfast_site/.done
                else   # one bad wheel failed the call: each on its own, so that the others still go in
                    say "the carried wheels failed in one pip call; each on its own (a namespace package two share may be replaced)"
                    local whl all=1
                    for whl in "${wheels[@]}"; do run "$PY" "${pip_args[@]}" "$whl" || all=; done
                    [ -n "$all" ] && touch /tmp/hcrfast_site/.done
                fi
            fi
        fi
        export PYTHONPATH="/tmp/hcrfast_site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    if "$PY" -c "import hcrfast.kernels, hcrfast.bindings" 2>/dev/null; then return 0; fi
    say "install hcrfast (editable, no dependencies, no build isolation: the machine is offline)"
    if ! run "$PY" -m pip install -q --no-index --disable-pip-version-check --no-deps --no-build-isolation -e .; then
        # Last resort: the layout of the wheel, put together by hand (kernels/ and bindings/
        # become hcrfast.kernels and hcrfast.bindings, as pyproject's package-dir maps them).
        say "pip failed; staging the package layout on PYTHONPATH instead"
        local staged=/tmp/hcrfast_stage && rm -rf "$staged" && mkdir -p "$staged"
        cp -r hcrfast "$staged/" && cp -r kernels "$staged/hcrfast/kernels" && cp -r bindings "$staged/hcrfast/bindings"
        export PYTHONPATH="$staged${PYTHONPATH:+:$PYTHONPATH}"
        # `python -m pytest` / `python -c` put the repo root first on sys.path, where ./hcrfast
        # (without kernels/ and bindings/) would shadow the staged package: don't add it.
        export PYTHONSAFEPATH=1
    fi
}

# per_test_timeout: sets per_test, pytest's options that end one hung test (a stream that never drains)
# alone instead of letting it eat the stage: pytest-timeout, where the image has it (the device's does),
# after TEST_TIMEOUT_S (90). The thread method also ends a test stuck inside a CUDA call (the signal method
# waits for it to return to Python), dumping every thread's stack, and pytest with it: the stack says where.
per_test_timeout() {
    # the files that hold GPU tests (collecting all of tests/ costs ~30 s for 58 of 1,650 tests)
    mapfile -t gpu_test_files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
    per_test=()
    if "$PY" -c "import pytest_timeout" 2>/dev/null; then
        per_test=(--timeout "${TEST_TIMEOUT_S:-90}" --timeout-method thread)
    fi
}

warm_up() {  # at the start of the tests and retest stages (the timing scripts warm up themselves)
    local STAGE=warm-up   # its own ledger row and .out, not the tests stage's
    # The first CUDA calls of a machine compile: CuPy's kernels (NVRTC, cached in ~/.cupy for every later
    # process), the Numba kernels (per process: a smoke test here), cuBLAS's handles. Paid here, timed
    # item by item, so that the tests stage does not spend its per-test timeouts on CuPy's compilations;
    # an item that fails says so and the next runs. Once per machine (a second call finds it warm).
    local left=$(( DEADLINE - $(date +%s) - RESERVE_S ))
    if [ -e "$WARM_MARK" ]; then
        say "warm-up: done by an earlier call on this machine"
    elif [ "${WARM_UP:-1}" = 0 ]; then
        say "warm-up: skipped (WARM_UP=0)"
    elif (( left < ${WARMUP_TIMEOUT_S:-75} + ${WARMUP_LEAVES_S:-45} )); then
        # (the warm-up's cap and what the tests need after it: with less, the tests take the time themselves)
        say "warm-up: skipped ($left s left: the tests get them)"
        ledger skipped 0 "warm-up"
    else
    say "warm-up: a small bound() per dtype and solver, the Numba kernels (first compilations, timed)"
    T=${WARMUP_TIMEOUT_S:-75} run "$PY" - <<'EOF'
import time, traceback
import torch
import hcrfast
from hcrfast import kernels
from hcrfast.bindings import solver_stream

def timed(label, fn):
    t0 = time.perf_counter()
    try:
        fn()
        torch.cuda.synchronize()
        print(f"  {label}: {time.perf_counter() - t0:.1f} s", flush=True)
    except Exception:
        print(f"  {label}: FAILED after {time.perf_counter() - t0:.1f} s", flush=True)
        traceback.print_exc()

torch.manual_seed(0)
for dtype in (torch.float32, torch.float64):
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.Tanh()).to("cuda", dtype).eval()
    x = torch.randn(2, 1, 8, 8, device="cuda", dtype=dtype)
    name = str(dtype).replace("torch.", "")
    for solver in ("lsqr", "krylov", "dense"):
        timed(f"bound {name} solver={solver}",
              lambda: hcrfast.bound(net, x, 0.1, restarts=2, iterations=2, solver=solver))
    timed(f"bound {name} lsqr kernels=numba", lambda: hcrfast.bound(
        net, x, 0.1, restarts=2, iterations=2, lsqr=hcrfast.LSQROptions(kernels="numba", iter_lim=20)))
    timed(f"bound {name} targets=low:2", lambda: hcrfast.bound(net, x, 0.1, restarts=2, iterations=1, targets="low:2"))

def numba_kernels():
    import cupy as cp
    with solver_stream(torch.device("cuda")):
        for dtype in (cp.float32, cp.float64):
            a = cp.random.default_rng(0).standard_normal((4, 3, 28, 28)).astype(dtype)
            kernels.idct2(kernels.dct2(a, impl="numba"), impl="numba")
            rows = a.reshape(4, -1)
            kernels.row_normalize(rows, 2.0, impl="numba")
            kernels.restart_update(rows + 1, rows, cp.ones(4), impl="numba")
            x, w = rows.copy(), rows.copy()
            kernels.lsqr_update_xw(x, w, rows, cp.ones(4, dtype=dtype), cp.ones(4, dtype=dtype), impl="numba")
timed("the Numba kernels, both dtypes", numba_kernels)

def device_eigh(impl):
    # The batched cuSOLVER routines (library lookup, handle, CuPy's solver): loaded once here, and a first
    # word on whether they work at all before the stages that time them.
    import warnings
    from hcrfast.kernels import symmetric, tridiagonal
    g = torch.randn(6, 40, 60, device="cuda", dtype=torch.float64)
    A = g @ g.transpose(1, 2)
    ref, _ = symmetric.eigh_batch(A, impl="lapack")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, _ = symmetric.eigh_batch(A, impl=impl)
        tridiagonal.eigh_tridiagonal_device(torch.rand(6, 40, device="cuda", dtype=torch.float64) + 1,
                                            torch.rand(6, 40, device="cuda", dtype=torch.float64),
                                            [40, 39, 1, 0, 40, 20], rtol=1e-12, impl=impl)
    err = float((w - ref).abs().max() / ref.abs().max())
    print(f"    eigh_batch impl={impl}: max relative eigenvalue difference from LAPACK {err:.1e}; "
          f"{len(caught)} warning(s) {[str(c.message)[:80] for c in caught]}", flush=True)
for impl in ("cusolver", "cupy"):
    timed(f"batched device eigendecompositions, impl={impl}", lambda: device_eigh(impl))
EOF
    [ "$?" = 0 ] && touch "$WARM_MARK"
    fi
}

stages=()
for stage in "$@"; do
    case "$stage" in
    lease) stages+=(setup mnist race tests) ;;
    lease2) stages+=(setup resnet18-krylov tf32 mnist-dense modes kernels profile) ;;
    setup|tests|retest|profile|kernels|modes|mnist|mnist-dense|race|resnet18|resnet18-krylov|tf32|summary) stages+=("$stage") ;;
    *)
        echo "unknown stage '$stage'; stages: lease lease2 setup tests retest profile kernels modes mnist mnist-dense race resnet18 resnet18-krylov tf32 summary" >&2
        exit 2
        ;;
    esac
done
if [[ " ${stages[*]} " == *" retest "* ]] && [ -z "${RETEST:-}" ]; then   # before any work, not after the warm-up
    echo "retest needs RETEST, a pytest -k expression naming the GPU tests to run again" >&2
    exit 2
fi
mkdir -p "$DEST"   # after the stages are known: a refused call leaves nothing behind
say "gpu_session: ${stages[*]} (LEASE_S=$LEASE_S: done by $(date -u -d "@$DEADLINE" +%H:%M:%S))"

for stage in "${stages[@]}"; do
    STAGE=$stage
    case "$stage" in
    setup)
        ensure_installed
        say "environment"
        T=30 run nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        T=60 run "$PY" - <<'EOF'
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
for d in ("cupy-cuda13x", "cupy-cuda12x", "numba", "numba-cuda", "cuda-pathfinder", "numpy", "scipy", "torchvision",
          "nvtx", "scikit-learn", "matplotlib", "pytest-benchmark", "pytest-timeout", "setuptools"):  # --no-deps: a missing one shows here
    try:
        print(f"  {d} {md.version(d)}")
    except md.PackageNotFoundError:
        print(f"  {d} -")
from hcrfast.backend import cuda_available
print("hcrfast sees CuPy + CUDA:", cuda_available())
EOF
        # numba-cuda finds libNVVM through cuda-pathfinder: a pip wheel (none on the image) or the dynamic
        # loader's cache; CUDA_HOME does not help a toolkit laid out as lib/libnvvm.so. Where it is not
        # found, the folder that holds it goes on LD_LIBRARY_PATH for the rest of the call.
        nvvm_probe="from numba.cuda.cudadrv import nvvm; print('libNVVM', nvvm.NVVM().get_version(), 'found by numba')"
        say "libNVVM for the Numba kernels"
        T=60 run "$PY" -c "$nvvm_probe"
        rc=$?
        if [ "$rc" != 0 ] && [ "$rc" != 125 ]; then  # 125: skipped, no time left to look
            lib=$(ls /usr/local/cuda*/lib*/libnvvm.so* /usr/local/cuda*/nvvm/lib64/libnvvm.so* 2>/dev/null | head -1)
            if [ -n "$lib" ]; then
                export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                say "libNVVM not found by numba; trying $(dirname "$lib") on LD_LIBRARY_PATH"
                T=60 run "$PY" -c "$nvvm_probe"
            else
                say "no libnvvm.so under /usr/local/cuda*: the Numba kernels cannot compile here"
            fi
        fi
        ;;
    tests)
        ensure_installed
        warm_up
        # Only the GPU tests: CI runs the CPU suites (the simulator's among them) on every submission.
        say "pytest -m gpu"
        per_test_timeout
        T=${TESTS_TIMEOUT_S:-150} run "$PY" -m pytest "${gpu_test_files[@]}" -m gpu -v -rfEs --tb=short --durations=10 \
            -p no:cacheprovider "${per_test[@]}"
        ;;
    retest)
        ensure_installed
        warm_up
        # The GPU tests whose names match RETEST (a pytest -k expression): those an earlier call failed.
        say "pytest -m gpu -k '$RETEST'"
        per_test_timeout
        T=${RETEST_TIMEOUT_S:-90} run "$PY" -m pytest "${gpu_test_files[@]}" -m gpu -k "$RETEST" -v -rfEs --tb=short \
            -p no:cacheprovider "${per_test[@]}"
        ;;
    profile)
        ensure_installed
        # Where MNIST's time goes: one slice of the target (1,250 examples, R = 25, i = 10) under the
        # profiler (host time per hcrfast phase, GPU time per kernel), then the Gram-Schmidt pass's forms.
        say "gpu_targets mnist --examples 1250 --profile"
        MIN=40 T=${PROFILE_TIMEOUT_S:-75} run "$PY" benchmarks/gpu_targets.py mnist --examples 1250 --profile \
            --progress --out "$DEST"
        say "Gram-Schmidt forms (1,250 examples, 784 values, k = 128 and 384)"
        T=${GS_TIMEOUT_S:-45} run "$PY" benchmarks/gs_variants.py --device cuda --examples 1250 --dim 784 \
            --steps 128 384 --out "$DEST/gs_variants.json"
        ;;
    kernels)
        ensure_installed
        say "kernel and LSQR benchmarks on the GPU"
        # Short rounds (0.2 s of each benchmark, at least 3): ~30 benchmarks in under a minute; the JSON is
        # written at the end only, so the command is not started with less than MIN = 60 s.
        MIN=60 T=${KERNELS_TIMEOUT_S:-150} run "$PY" -m pytest benchmarks/test_bench_dense.py benchmarks/test_bench_kernels.py \
            benchmarks/test_bench_lsqr.py -m gpu --benchmark-only -q \
            -p no:cacheprovider --benchmark-max-time=0.2 --benchmark-min-rounds=3 \
            --benchmark-columns=min,median,max,rounds --benchmark-json "$DEST/bench_gpu_kernels.json"
        # The models' products apart (their own JSON, so that one timeout loses one half): ResNet-18 and
        # Swin-T, JVP by double VJP through the lean graph and torch's, and forward mode.
        say "ResNet-18 and Swin-T products on the GPU"
        MIN=45 T=${PRODUCTS_TIMEOUT_S:-90} run "$PY" -m pytest benchmarks/test_bench_bridge.py -m gpu -k "not attention" \
            --benchmark-only -q -p no:cacheprovider --benchmark-columns=min,median,max,rounds \
            --benchmark-json "$DEST/bench_gpu_products.json"
        # ViT-B/16's (the lean graph's attention against the MATH backend's graph, forward mode), last
        say "ViT-B/16 products on the GPU"
        MIN=30 T=${ATTENTION_TIMEOUT_S:-60} run "$PY" -m pytest benchmarks/test_bench_bridge.py -m gpu -k attention \
            --benchmark-only -q -p no:cacheprovider --benchmark-columns=min,median,max,rounds \
            --benchmark-json "$DEST/bench_gpu_attention.json"
        # and the lean graph against torch's across seven torchvision models (their products, both ways)
        say "the lean graph across torchvision's models on the GPU"
        MIN=40 T=${ZOO_TIMEOUT_S:-90} run "$PY" benchmarks/lean_zoo.py --device cuda --rows 8 --size 96 --repeats 5 \
            --json "$DEST/lean_zoo_gpu.json"
        ;;
    modes)
        ensure_installed
        # Ten by default, MODE_TIMEOUT_S (75) s each; those the call has no time left for are skipped, in
        # this order. Others: MODES="--compact-below 0|--kernels twin|--kernels numba|--tf32|--cold-start"
        IFS='|' read -r -a modes <<< "${MODES:---jacobian reverse|--solver dense|--solver dense --dense-eigh cusolver|--eig-impl cusolver|--solver dense --dense-eigh torch|--solver dense --dense-eigh cupy|--jacobian forward|--solver lsqr|--reorth-passes 2|--cupy-allocator cupy}"
        for flags in "${modes[@]}"; do
            say "gpu_targets mnist --examples 1000 $flags"
            # shellcheck disable=SC2086  # $flags is several words on purpose
            MIN=50 T=${MODE_TIMEOUT_S:-75} run "$PY" benchmarks/gpu_targets.py mnist --examples 1000 --slices 4 \
                --time-budget "$(budget "${MODE_TIMEOUT_S:-75}" 30)" $flags --out "$DEST"
        done
        ;;
    mnist)
        ensure_installed
        # Two calls of 5,000 (the first H100 run made 8 of 1,250: each call, and each chunk within one, pays
        # the basis' per-step host work once, whatever its size; bound() chunks by free memory itself).
        say "gpu_targets mnist (10,000 x 25 x 10, solver auto, ${MNIST_SLICES:-2} calls)"
        MIN=90 T=${MNIST_TIMEOUT_S:-130} run "$PY" benchmarks/gpu_targets.py mnist --slices "${MNIST_SLICES:-2}" \
            --time-budget "$(budget "${MNIST_TIMEOUT_S:-130}" 45)" --progress --out "$DEST"
        ;;
    mnist-dense)
        ensure_installed
        say "gpu_targets mnist --solver dense --dense-eigh ${DENSE_EIGH:-cusolver} (10,000 x 25 x 10, ${MNIST_SLICES:-2} calls)"
        MIN=60 T=${MNIST_DENSE_TIMEOUT_S:-110} run "$PY" benchmarks/gpu_targets.py mnist --solver dense \
            --dense-eigh "${DENSE_EIGH:-cusolver}" --slices "${MNIST_SLICES:-2}" \
            --time-budget "$(budget "${MNIST_DENSE_TIMEOUT_S:-110}" 40)" --progress --out "$DEST"
        ;;
    race)
        ensure_installed
        # No LSQR sweep: on this problem only its last points reach the reference's median (CPU: ~200 s of
        # points before them), while the defaults row (the Krylov basis on CUDA) does, and so does the dense
        # solve's row (run on CUDA beside the defaults); the JSON is rewritten after every row.
        say "race on the GPU: reference vs hcrfast (MNIST MLP, 32 examples, R = 2, i = 10)"
        # The LSQR rows (~45 s each on the H100, 2026-11-27) ran into the 120 s cap after the reference's ~51 s;
        # they are not the fastest row, so the lease skips them (--no-lsqr-rows): its time goes to the tests.
        MIN=${RACE_MIN_S:-90} T=${RACE_TIMEOUT_S:-120} run "$PY" benchmarks/race.py --model mlp --examples 32 \
            --restarts 2 --iterations 10 --size 0.005 --device cuda --no-sweep --no-lsqr-rows \
            --dense-eigh lapack,cusolver --out "$DEST"
        ;;
    resnet18)
        ensure_installed
        say "gpu_targets resnet18 --solver lsqr (128 x 25 x 10 in 16 slices, the rest extrapolated)"
        MIN=120 T=${RESNET_TIMEOUT_S:-540} run "$PY" benchmarks/gpu_targets.py resnet18 --solver lsqr --slices 16 \
            --time-budget "$(budget "${RESNET_TIMEOUT_S:-540}" 90)" --progress --out "$DEST"
        ;;
    resnet18-krylov)
        ensure_installed
        say "gpu_targets resnet18 --solver krylov --krylov-pilots ${RESNET_PILOTS:-auto} (128 x 25 x 10 in ${RESNET_SLICES:-16} slices, the rest extrapolated)"
        # MIN 150: a first slice of 8 examples (200 bases of 163 steps) must be able to finish (nothing is
        # written before it does); unmeasured on a GPU: 163 steps of 200 rows each, where one basis took
        # 4,096 steps of 4 rows at 23 ms a step
        MIN=150 T=${RESNET_TIMEOUT_S:-540} run "$PY" benchmarks/gpu_targets.py resnet18 --solver krylov \
            --krylov-pilots "${RESNET_PILOTS:-auto}" --slices "${RESNET_SLICES:-16}" \
            --time-budget "$(budget "${RESNET_TIMEOUT_S:-540}" 90)" --progress --out "$DEST"
        ;;
    tf32)
        ensure_installed
        say "tf32_cost resnet18 --device cuda --examples 2 (R = 25, i = 10): IEEE vs TF32"
        MIN=60 T=${TF32_TIMEOUT_S:-180} run "$PY" benchmarks/tf32_cost.py resnet18 --device cuda --examples 2 \
            --restarts 25 --iterations 10 --mode both --json "$DEST/tf32_cost_resnet18_gpu.json"
        ;;
    summary) ;;  # printed below, once, as every call's last lines
    esac
done
summary
