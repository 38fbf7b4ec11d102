#!/usr/bin/env bash
# After a lease, on THIS machine: unpack the gpu_session.tgz the device tool brought back into
# benchmarks/results/gpu_<device>_<date>/ (device from the JSONs' machine info, date of today), with
# the call's log beside it, and print the summary of what it holds. Commit that folder.
#
#   bash benchmarks/unpack_gpu_session.sh FILES_AT/gpu_session.tgz [FILES_AT/gpu_session.log]
#
# A second call's tarball holds the first call's results too (same folder on a warm machine): unpack
# the last one, or both into the same folder (files of the same name are the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
tgz=${1:?usage: unpack_gpu_session.sh PATH/gpu_session.tgz [PATH/gpu_session.log]}
log=${2:-$(dirname "$tgz")/gpu_session.log}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tgz" -C "$tmp"
device=$(python3 - "$tmp" <<'EOF'
import json, re, sys
from pathlib import Path
names = []
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    try:
        machine = json.loads(path.read_text()).get("machine", {})
    except (ValueError, AttributeError):
        continue
    if machine.get("gpu"):
        names.append(machine["gpu"])
print(re.sub(r"[^A-Za-z0-9]+", "-", names[0]).strip("-").lower() if names else "unknown-gpu")
EOF
)
dest="${RESULTS_DIR:-benchmarks/results}/gpu_${device}_$(date -u +%Y%m%d)"
mkdir -p "$dest"
cp -r "$tmp"/. "$dest"/
[ -f "$log" ] && cp "$log" "$dest/"
python3 benchmarks/gpu_summary.py "$dest"
echo "unpacked into $dest ($(du -sh "$dest" | cut -f1)); commit it with the summary's verdicts in the message"
