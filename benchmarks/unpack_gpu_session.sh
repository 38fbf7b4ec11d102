#!/usr/bin/env bash
# After a lease, on THIS machine: unpack the gpu_session.tgz the device tool brought back into
# benchmarks/results/gpu_<device>_<date>/ (device from the JSONs' machine info; date the session's own,
# UTC: the earliest stamp in its JSONs' names (gpu_targets_*_<date>T<time>.json, race_*), else the
# earliest time the tarball records for its files (ledger.tsv, the .out files: the device's clock),
# today's only where it holds neither), with the call's log beside it, and print the summary of what it
# holds. Commit that folder.
#
#   bash benchmarks/unpack_gpu_session.sh FILES_AT/gpu_session.tgz [FILES_AT/gpu_session.log]
#
# A second call's tarball holds the first call's results too where the machine stayed warm, and not where
# it went cold between the calls (a fresh machine, a fresh folder): unpack BOTH calls' tarballs, each with
# its log (absolute paths, or relative to where you run this). Into a folder that exists: ledger.tsv's
# rows are merged (each row once), a .out or JSON of the same name and other content is kept beside the
# first as NAME.2.EXT (.3, ...), and the log keeps its own name when it differs (gpu_session.2.log).
set -euo pipefail
tgz=$(realpath "${1:?usage: unpack_gpu_session.sh PATH/gpu_session.tgz [PATH/gpu_session.log]}")
log=$(realpath -m "${2:-$(dirname "$tgz")/gpu_session.log}")
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tgz" -C "$tmp"
read -r device day <<<"$(python3 - "$tmp" <<'EOF'
import datetime, json, re, sys
from pathlib import Path
folder = Path(sys.argv[1])
names = []
for path in sorted(folder.glob("*.json")):
    try:
        machine = json.loads(path.read_text()).get("machine", {})
    except (ValueError, AttributeError):
        continue
    if machine.get("gpu"):
        names.append(machine["gpu"])
if not names:   # a call that wrote no JSON (setup and a warm-up only): nvidia-smi's line in setup.out
    setup = folder / "setup.out"
    lines = setup.read_text(errors="replace").splitlines() if setup.is_file() else []
    for head, row in zip(lines, lines[1:]):
        if head.startswith("name,") and row.strip() and "," in row:
            names.append(row.split(",")[0].strip())
            break
device = re.sub(r"[^A-Za-z0-9]+", "-", names[0]).strip("-").lower() if names else "unknown-gpu"
# The session's day: its JSONs' stamps first (written by the scripts from the device's clock), else the
# files' modification times as tar kept them (GNU tar restores them on extraction), else none (today's).
stamps = sorted(m.group(1) for p in folder.rglob("*.json") if (m := re.search(r"_(\d{8})T\d{6}", p.name)))
files = [p for p in folder.rglob("*") if p.is_file()]
if stamps:
    day = stamps[0]
elif files:
    first = min(p.stat().st_mtime for p in files)
    day = datetime.datetime.fromtimestamp(first, datetime.timezone.utc).strftime("%Y%m%d")
else:
    day = "-"
print(device, day)
EOF
)"
if [ "$day" = "-" ]; then
    day=$(date -u +%Y%m%d)
    echo "unpack_gpu_session: $tgz holds no dated file; the folder takes today's date, $day (rename it if" \
         "the session was another day)" >&2
fi
dest="${RESULTS_DIR:-benchmarks/results}/gpu_${device}_${day}"
mkdir -p "$dest"
# keep NEW at DEST/NAME, or beside it as NAME.2.EXT (.3, ...) where DEST/NAME holds something else
keep() {
    local new=$1 to=$2 base ext i=2
    if [ ! -e "$to" ] || cmp -s "$new" "$to"; then cp "$new" "$to"; return; fi
    base=${to%.*} ext=${to##*.}
    [ "$base" = "$to" ] && ext="" || ext=".$ext"
    while [ -e "$base.$i$ext" ] && ! cmp -s "$new" "$base.$i$ext"; do i=$((i + 1)); done
    cp "$new" "$base.$i$ext"
}
while IFS= read -r -d '' file; do
    rel=${file#"$tmp"/}
    mkdir -p "$dest/$(dirname "$rel")"
    if [ "$rel" = ledger.tsv ] && [ -f "$dest/ledger.tsv" ]; then
        awk '!seen[$0]++' "$dest/ledger.tsv" "$file" > "$tmp/.ledger" && mv "$tmp/.ledger" "$dest/ledger.tsv"
    else
        keep "$file" "$dest/$rel"
    fi
done < <(find "$tmp" -type f ! -name .ledger -print0 | sort -z)
[ -f "$log" ] && keep "$log" "$dest/$(basename "$log")"
python3 benchmarks/gpu_summary.py "$dest"
echo "unpacked into $dest ($(du -sh "$dest" | cut -f1)); commit it with the summary's verdicts in the message"
