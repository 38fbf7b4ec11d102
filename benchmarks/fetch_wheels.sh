#!/usr/bin/env bash
# Before a GPU lease, on THIS machine: download the wheels of hcrfast's dependencies that the device
# image lacks into .whl/ (ignored by git), for the device's Python (3.12, x86-64). The lease's calls
# then name .whl in the device tool's `carry`, and gpu_session.sh installs them (offline, --no-deps)
# into /tmp/hcrfast_site on the device before anything runs.
#
#   bash benchmarks/fetch_wheels.sh            # nvtx (the device has only the C library, nvidia-nvtx)
#   PY_VERSION=3.11 bash benchmarks/fetch_wheels.sh nvtx==0.2.17
#
# The device image's packages: /work/.library/device/KINDS.md ("Python packages already there").
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
[ "$#" -gt 0 ] || set -- "nvtx==0.2.17"
# .whl holds this fetch's wheels only: one left from an earlier fetch for another Python or version made the
# device's pip refuse the install (the device installs each wheel on its own since, 2026-12-02)
rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$@"
ls -l .whl
