#!/usr/bin/env bash
# The fabric, NVLink 5, PCIe and slowdown readings on a real GPU host: what the
# driver answers, and what they cost.
#
#   tests/gpu/links_cost.sh OLD NEW [ROUNDS]
#
# OLD and NEW are two exporter binaries (before and after). Prints:
#   1. NEW's new series as this driver answers them (fabric, PCIe maxima and
#      error counters, T.Limit thresholds, clock event times, NVLink links lost
#      and NVLink 5 counters), with --collector pcie-errors;
#   2. tests/gpu/cost.py: steady runs (state kept, as the timer's runs) of OLD,
#      NEW and NEW with --collector pcie-errors, beside nvidia-smi;
#   3. cold runs (a fresh state directory each: every once-per-driver reading
#      is taken) of OLD and NEW, median wall time in ms.
# Needs python3 and nvidia-smi (cost.py's baseline).
set -eu
cd "$(dirname "$0")/../.."
old=$(realpath "$1")
new=$(realpath "$2")
rounds=${3:-30}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/journal"
printf '#!/bin/sh\nexec %s "$@" --collector pcie-errors\n' "$new" >"$work/new-pcie-errors"
chmod +x "$work/new-pcie-errors"

echo "== what the driver answers (NEW, --collector pcie-errors)"
"$new" --stdout --gpm-window 0 --journal-dir "$work/journal" --state-dir "$work/facts" \
    --collector pcie-errors --collector nvlink-links |
    grep -E '^nvidia_gpu_(fabric|pcie_link|pcie_errors|temperature_margin|clocks_event_seconds|nvlink_(links|recoveries|link_recoveries|link_bit_error)|collector_read_errors)' ||
    true

echo "== steady runs"
python3 tests/gpu/cost.py "$rounds" old="$old" new="$new" new+pcie-errors="$work/new-pcie-errors"

echo "== cold runs (fresh state each)"
python3 - "$rounds" "$old" "$new" "$work" <<'EOF'
import statistics, subprocess, sys, tempfile, time
rounds, binaries, work = int(sys.argv[1]), sys.argv[2:4], sys.argv[4]
walls = {b: [] for b in binaries}
for _ in range(rounds):
    for binary in binaries:
        state = tempfile.mkdtemp(dir=work)
        started = time.perf_counter()
        subprocess.run([binary, "--stdout", "--write-state", "--state-dir", state,
                        "--journal-dir", work + "/journal", "--gpm-window", "0"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        walls[binary].append((time.perf_counter() - started) * 1000)
for name, binary in zip(("old", "new"), binaries):
    print(f"{name:<4} cold wall ms: median {statistics.median(walls[binary]):.2f}")
EOF
