#!/usr/bin/env bash
# Cost of the xid collector per run, against real journal files written by
# systemd-journal-remote (not part of make test; a measurement, not a test).
#
#   benches/xid_journal.sh [EXPORTER] [FAKE_NVML] [LINES]
#
# Builds a journal of LINES (default 100,000) kernel lines of this boot, one in
# ten an XID (GPU 0 of tests/scenarios/h100x8.toml), and measures, as medians
# of 10 runs:
#   - the first run, which reads the whole window, or as much of it as one run
#     reads (the count is checked exact once the runs have worked it off), and
#     the exporter's own peak resident memory (VmHWM, sampled until it exits;
#     journalctl's, a process of its own, is measured alone);
#   - the common case, a run with no new kernel line (cursor at the end);
#   - the same two with --no-collector xid, for the difference;
#   - journalctl alone for the common case.
set -euo pipefail
cd "$(dirname "$0")/.."
exe=${1:-target/release/nvidia-textfile-exporter}
fake=${2:-target/debug/libfake_nvml.so}
lines=${3:-100000}
remote=/lib/systemd/systemd-journal-remote
[ -x "$remote" ] || { echo "needs systemd-journal-remote (apt-get install systemd-journal-remote)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
boot=$(tr -d - </proc/sys/kernel/random/boot_id)
python3 - "$boot" "$lines" >"$work/export" <<'PY'
import sys
boot = sys.argv[1]
out = sys.stdout
for i in range(int(sys.argv[2])):
    mono = 1_000_000 + i * 10
    if i % 10 == 0:
        msg = "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
    else:
        msg = f"nvme nvme0: I/O {i} QID 3 timeout, completion polled"
    out.write(f"__REALTIME_TIMESTAMP={1_700_000_000_000_000 + mono}\n__MONOTONIC_TIMESTAMP={mono}\n"
              f"_BOOT_ID={boot}\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\nPRIORITY=4\n_HOSTNAME=gpu1\n"
              f"MESSAGE={msg}\n\n")
PY
mkdir "$work/journal"
"$remote" --output="$work/journal/system.journal" "$work/export" 2>/dev/null
echo "journal: $(du -sh "$work/journal" | cut -f1), $(journalctl --directory="$work/journal" -q _TRANSPORT=kernel | wc -l) kernel lines"

export FAKE_NVML_SCENARIO=tests/scenarios/h100x8.toml
args=(--nvml-lib "$fake" --stdout --write-state --journal-dir "$work/journal")
run() { "$exe" "${args[@]}" "$@"; }
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(((e - s) / 1000000)); }
# The peak resident memory of the command itself in KiB: its VmHWM, which only
# grows, read until it exits.
hwm() {
    local pid peak=0 now
    "$@" >/dev/null &
    pid=$!
    while now=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null) && [ -n "$now" ]; do
        peak=$now
        sleep 0.005
    done
    wait "$pid"
    echo "$peak"
}
# GNU time's maximum RSS in KiB (of the command and the children it waited for).
rss() { /usr/bin/time -f %M -o "$work/rss" "$@" >/dev/null; cat "$work/rss"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
xids=$((lines / 10))

first=() first_rss=() common=() none=() jc=()
for _ in $(seq 10); do
    rm -rf "$work/state"
    first+=("$(ms run --state-dir "$work/state")")
    # Later runs go on where a cut run stopped; five are plenty.
    for _ in $(seq 5); do
        count=$(run --state-dir "$work/state" | grep '^nvidia_gpu_xid_errors_total{gpu="0"' | awk '{print $2}')
        [ "$count" = "$xids" ] && break
    done
    [ "$count" = "$xids" ] || { echo "counted $count XIDs, not $xids" >&2; exit 1; }
    rm -rf "$work/state.rss"
    first_rss+=("$(hwm "$exe" "${args[@]}" --state-dir "$work/state.rss")")
    common+=("$(ms run --state-dir "$work/state")")
    none+=("$(ms run --state-dir "$work/state" --no-collector xid)")
    # The state is JSON (version 2); the exporter reads from --cursor.
    cursor=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["xid"]["cursor"])' "$work/state/state")
    jc+=("$(ms journalctl --directory="$work/journal" -q -o export --output-fields=MESSAGE,SYSLOG_FACILITY \
        --cursor="$cursor" _TRANSPORT=kernel _BOOT_ID="$boot")")
done
jc_rss=$(rss journalctl --directory="$work/journal" -q -o export --output-fields=MESSAGE,SYSLOG_FACILITY \
    _TRANSPORT=kernel _BOOT_ID="$boot")
printf 'first run, %s kernel lines with %s XIDs: %s ms (counted %s)\n' "$lines" "$xids" \
    "$(printf '%s\n' "${first[@]}" | median)" "$xids"
printf 'first run, peak RSS of the exporter itself:       %s KiB\n' "$(printf '%s\n' "${first_rss[@]}" | median)"
printf 'journalctl alone over the whole window, peak RSS: %s KiB\n' "$jc_rss"
printf 'no new kernel line:                               %s ms\n' "$(printf '%s\n' "${common[@]}" | median)"
printf 'without the xid collector:                        %s ms\n' "$(printf '%s\n' "${none[@]}" | median)"
printf 'journalctl alone, no new line:                    %s ms\n' "$(printf '%s\n' "${jc[@]}" | median)"
