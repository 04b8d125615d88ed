#!/usr/bin/env bash
# Do two processes sampling GPM at once disturb each other? Run on a host with a
# Hopper (or newer) GPU, from the repository root, as root:
#
#   gcc -O2 -o target/gpu/gpm_sampler tests/gpu/gpm_sampler.c -ldl     # anywhere
#   tests/gpu/gpm_concurrent.sh [EXPORTER] [SAMPLER] [GPULOAD]
#
# Defaults: target/release/nvidia-textfile-exporter, target/gpu/gpm_sampler,
# target/gpu/gpuload (optional: with it, the GPU runs a full spin load so that
# both clients should read about 100 % SM activity). GPU=N picks the GPU. ~40 s.
#
#   1. the sampler alone (1 s windows, 6 s): the reference;
#   2. the sampler (1 s windows, 14 s) while the exporter runs twice with
#      --gpm-window 5s: does either fail, and do their values agree?
#   3. two exporters with --gpm-window 5s at once, the sampler idle;
#   4. the exporter with the pause file: no GPM, reason="paused".
# Prints each exporter's SM activity, window and unavailable reason, and the
# sampler's failed calls; the summary says whether either side failed.
set -u
exporter=${1:-target/release/nvidia-textfile-exporter}
sampler=${2:-target/gpu/gpm_sampler}
gpuload=${3:-target/gpu/gpuload}
gpu=${GPU:-0}
work=$(mktemp -d)
load_pid=
cleanup() {
    [ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
for tool in "$exporter" "$sampler"; do
    [ -x "$tool" ] || { echo "$tool is not an executable (see the header)"; exit 2; }
done

problems=0
# exporter NAME [ARGS...]: one snapshot to $work/NAME.prom, a summary line.
exporter() {
    local name=$1 start end status
    shift
    start=$(date +%s%N)
    "$exporter" --stdout --state-dir "$work/state-$name" "$@" >"$work/$name.prom" 2>"$work/$name.err"
    status=$?
    end=$(date +%s%N)
    local line
    line=$(awk -v g="$gpu" '
        index($0, "{gpu=\"" g "\"") == 0 { next }
        /^nvidia_gpu_sm_active_ratio\{/ { sm = sprintf("%.2f%%", 100 * $NF) }
        /^nvidia_gpu_gpm_window_seconds\{/ { w = sprintf("%.3fs", $NF) }
        /^nvidia_gpu_gpm_unavailable\{/ { match($0, /reason="[^"]*"/); r = substr($0, RSTART, RLENGTH) }
        /^nvidia_gpu_collector_read_errors\{/ { e = $NF }
        END { printf "sm_active %s window %s read_errors %s %s", sm ? sm : "-", w ? w : "-", e, r }
    ' "$work/$name.prom")
    local ms=$(((end - start) / 1000000))
    printf '  exporter %-10s exit %d, %d.%03ds: %s\n' "$name" "$status" $((ms / 1000)) $((ms % 1000)) "$line"
    if [ -s "$work/$name.err" ]; then sed 's/^/      stderr: /' "$work/$name.err"; fi
    if [ "$status" -ne 0 ] || ! grep -q "^nvidia_gpu_sm_active_ratio{gpu=\"$gpu\"" "$work/$name.prom"; then
        [ "$name" = paused ] || problems=$((problems + 1))
    fi
}
# start_sampler NAME SECONDS: the second client in the background ($pid).
start_sampler() {
    "$sampler" "$2" 1000 "$gpu" >"$work/$1.sampler" 2>&1 &
    pid=$!
}
report_sampler() {
    local name=$1 pid=$2 status
    wait "$pid"
    status=$?
    echo "  sampler  $name exit $status: $(tail -1 "$work/$name.sampler")"
    grep -v ' ok \|^windows' "$work/$name.sampler" | sed 's/^/      /'
    [ "$status" -eq 0 ] || problems=$((problems + 1))
}

if [ -x "$gpuload" ]; then
    "$gpuload" spin 1000 0 60 0 1056 1024 "$gpu" >/dev/null 2>&1 &
    load_pid=$!
    sleep 3
    echo "load: gpuload spin 1056 x 1024 on GPU $gpu (both should read about 100 %)"
else
    echo "load: none ($gpuload missing; idle GPU, both should read about 0 %)"
fi

echo "1. sampler alone, 6 s"
start_sampler alone 6
report_sampler alone "$pid"
awk '/ ok sm_active/{print "      " $0}' "$work/alone.sampler" | tail -2

echo "2. sampler (14 s) and the exporter twice with --gpm-window 5s"
start_sampler with-exporter 14
sleep 2
exporter first --gpm-window 5s
exporter second --gpm-window 5s
report_sampler with-exporter "$pid"
awk '/ ok sm_active/{print "      " $0}' "$work/with-exporter.sampler" | tail -3

echo "3. two exporters at once, --gpm-window 5s"
exporter one --gpm-window 5s &
one=$!
exporter two --gpm-window 5s &
two=$!
wait "$one" "$two"
# The subshells' problem counts are lost: re-check their files.
for name in one two; do
    grep -q "^nvidia_gpu_sm_active_ratio{gpu=\"$gpu\"" "$work/$name.prom" || problems=$((problems + 1))
done

echo "4. the pause file"
touch "$work/paused"
exporter paused --gpm-window 5s --gpm-pause-file "$work/paused"
grep -q "reason=\"paused\"} 1" "$work/paused.prom" || problems=$((problems + 1))

echo
if [ "$problems" -eq 0 ]; then
    echo "PASS: no GPM call failed with two clients at once"
else
    echo "FAIL: $problems run(s) failed or lacked GPM (details above)"
    exit 1
fi
