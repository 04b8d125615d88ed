#!/usr/bin/env bash
# Every scenario's file, served by Debian's real prometheus-node-exporter running
# as the prometheus user: each of our series must come back unchanged,
# node_textfile_scrape_error must be 0 and node_exporter must log no error.
# Needs: prometheus-node-exporter, curl or python3, the release binary and the
# fake NVML (make build).
set -euo pipefail
cd "$(dirname "$0")/../.."

exporter=target/release/nvidia-textfile-exporter
fake=target/debug/libfake_nvml.so
node_exporter=$(command -v prometheus-node-exporter || true)
[ -n "$node_exporter" ] || { echo "prometheus-node-exporter is not installed" >&2; exit 1; }

work=$(mktemp -d)
chmod 755 "$work"
mkdir -m 755 "$work/textfile"
pid=
cleanup() {
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
runuser -u prometheus -- "$node_exporter" \
    --web.listen-address="127.0.0.1:$port" \
    --collector.disable-defaults --collector.textfile \
    --collector.textfile.directory="$work/textfile" >"$work/node-exporter.log" 2>&1 &
pid=$!
for _ in $(seq 50); do
    python3 - "$port" <<'PY' 2>/dev/null && break
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=1)
PY
    sleep 0.1
done

# The product scenarios; fault-* (hangs, hostile input) and bench-* scenarios
# have their own harnesses.
scenarios=$(ls tests/scenarios/*.toml | grep -v -e /fault- -e /bench-)
failures=0
for scenario in $scenarios; do
    name=$(basename "$scenario" .toml)
    # Each scenario is another host: its own state, so that no GPU of the one
    # before is reported as having left enumeration.
    args=(--output-dir "$work/textfile" --state-dir "$work/state-$name" --nvml-lib "$fake")
    # Per-process series too, so they are checked against node_exporter as well.
    args+=(--collector processes --collector pcie-throughput)
    status=0
    FAKE_NVML_SCENARIO=$scenario "$exporter" "${args[@]}" 2>/dev/null || status=$?
    if python3 tests/e2e/compare_scrape.py "$port" "$work/textfile/nvidia_gpu.prom" "$name" "$status"; then
        :
    else
        failures=$((failures + 1))
    fi
done

if grep -i -E 'level=(error|warn)|error gathering' "$work/node-exporter.log"; then
    echo "node_exporter logged errors (above)" >&2
    failures=$((failures + 1))
fi
total=$(echo "$scenarios" | wc -l)
echo "node_exporter end to end: $((total - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
