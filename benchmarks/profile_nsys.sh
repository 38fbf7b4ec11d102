#!/usr/bin/env bash
# Profile one representative hcrfast.bound run under Nsight Systems, on a GPU machine.
#
#   bash benchmarks/profile_nsys.sh [OUT_PREFIX] [extra profile_cpu.py arguments...]
#
# Workload: the race's MLP problem (MNIST geometry, digits at 28x28, sigma = RMS),
# 32 examples x 25 restarts x 10 outer iterations, DEFAULT_LSQR, on CUDA, without
# the Python timers (profile_cpu.py --plain). hcrfast marks its phases with NVTX
# ranges in the "hcrfast" domain: jvp, vjp, lsqr, lsqr.init, lsqr.block, restart,
# certify, bound, dct.
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/nsys_mlp}
shift || true

if ! "${PYTHON:-python3}" -c "import nvtx" 2>/dev/null; then
    echo "note: the Python package nvtx is missing: hcrfast's ranges come from torch.cuda.nvtx, named hcrfast:<phase> in the default domain." >&2
fi
# nsys: $NSYS, the PATH's, or one an Nsight install left off the PATH (the device tool's image has no nsys
# on its PATH, only the copy inside Nsight Compute, which records but could not convert its trace there).
NSYS=${NSYS:-$(command -v nsys || ls -1 /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys \
    /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -n 1 || true)}
if [ -z "$NSYS" ] || [ ! -x "$NSYS" ]; then
    echo "nsys (Nsight Systems CLI) is not on PATH nor in /opt/nvidia; install it or set NSYS=/path/to/nsys." >&2
    echo "Without it: python benchmarks/profile_cpu.py --device cuda times each phase (synchronizing at each boundary)." >&2
    exit 1
fi
echo "nsys: $NSYS" >&2
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "torch sees no CUDA device: nothing to profile here (see profile_cpu.py for the CPU)." >&2
    exit 1
fi

"$NSYS" profile --trace=cuda,nvtx,osrt --sample=none --force-overwrite=true -o "$OUT" \
    "$PY" benchmarks/profile_cpu.py --device cuda --plain \
        --examples 32 --restarts 25 --iterations 10 "$@"
if [ ! -f "$OUT.nsys-rep" ]; then
    if [ -f "$OUT.qdstrm" ]; then
        echo "nsys recorded $OUT.qdstrm but made no report of it (its QdstrmImporter is missing here):" >&2
        echo "copy it to a machine with Nsight Systems and run: QdstrmImporter -i $OUT.qdstrm" >&2
    else
        echo "nsys wrote no report ($OUT.nsys-rep)." >&2
    fi
    exit 1
fi

cat <<EOF

Report written to $OUT.nsys-rep. To read it:

  # time per NVTX range (hcrfast@jvp, hcrfast@vjp, hcrfast@lsqr.block, ...): the share of
  # lsqr.block not covered by jvp + vjp is the solver's own vector work
  $NSYS stats --report nvtx_sum $OUT.nsys-rep
  # (older nsys releases call it nvtxsum / nvtxppsum)

  # which kernels run and how long (cuBLAS GEMMs of the model vs CuPy/Numba vector kernels)
  $NSYS stats --report cuda_gpu_kern_sum $OUT.nsys-rep

  # host-side CUDA API time: cudaStreamSynchronize / cudaMemcpy*DtoH calls count the host
  # syncs (LSQR should sync once every check_every steps, and never per product)
  $NSYS stats --report cuda_api_sum $OUT.nsys-rep
  $NSYS stats --report cuda_gpu_mem_time_sum $OUT.nsys-rep

  # or open the timeline in the GUI: nsys-ui $OUT.nsys-rep
EOF
