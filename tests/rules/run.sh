#!/usr/bin/env bash
# Tests of the Prometheus alerting rules and the Grafana dashboard.
#
#   1. promtool check rules            the rule files are valid
#   2. promtool test rules             every recording rule gives the expected series for a
#                                      small fleet; every alert fires above its threshold and
#                                      stays quiet just below it or before its `for`
#   3. check.py static                 every metric name is a family the exporter generates
#                                      (--generate families), a recorded one, or
#                                      node_exporter's; rule and dashboard structure
#   4. check.py output                 names, labels and label values against what the
#                                      exporter writes for every tests/scenarios/*.toml
#   5. e2e.py                          exporter -> node_exporter -> Prometheus on 127.0.0.1,
#                                      alerts read back from /api/v1/alerts, every dashboard
#                                      query evaluated
#
# Needs: promtool and prometheus (Debian package prometheus), prometheus-node-exporter,
# python3 with yaml (python3-yaml), cargo. Exits 1 on any failure.
# Environment: EXPORTER and FAKE_NVML point at prebuilt binaries and skip the build.
set -u
cd "$(dirname "$0")/../.." || exit 1

rules=packaging/prometheus/nvidia-gpu-alerts.yml
recording=packaging/prometheus/nvidia-gpu-rules.yml
compat=packaging/prometheus/dcgm-exporter-compat.yml
jobstats=packaging/prometheus/jobstats-compat.yml
cargo=${CARGO:-cargo}
passed=0
failed=0
failures=()

python=${PYTHON:-python3}
if ! "$python" -c 'import yaml' 2>/dev/null && /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
    python=/usr/bin/python3
fi

missing=()
command -v promtool >/dev/null || missing+=("promtool (apt-get install prometheus)")
command -v prometheus >/dev/null || missing+=("prometheus (apt-get install prometheus)")
command -v prometheus-node-exporter >/dev/null || command -v node_exporter >/dev/null ||
    missing+=("node_exporter (apt-get install prometheus-node-exporter)")
"$python" -c 'import yaml' 2>/dev/null || missing+=("python3 yaml (apt-get install python3-yaml)")
if [ ${#missing[@]} -gt 0 ]; then
    printf 'tests/rules: missing %s\n' "${missing[@]}" >&2
    echo "rules: 0 passed, 1 failed"
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# step NAME COMMAND...: runs it, prints its output indented, counts it.
step() {
    local name=$1 start end status tenths
    shift
    start=$(date +%s%N)
    "$@" >"$work/out" 2>&1
    status=$?
    end=$(date +%s%N)
    tenths=$(((end - start) / 100000000))
    sed 's/^/    /' "$work/out"
    if [ $status -eq 0 ]; then
        passed=$((passed + 1))
        printf 'ok   %-38s %3d.%ds\n' "$name" $((tenths / 10)) $((tenths % 10))
    else
        failed=$((failed + 1))
        failures+=("$name")
        printf 'FAIL %-38s %3d.%ds (exit %d)\n' "$name" $((tenths / 10)) $((tenths % 10)) "$status"
    fi
    return $status
}

build() {
    "$cargo" build --release --locked -q && "$cargo" build --locked -q -p fake-nvml
}

step "promtool check rules" promtool check rules "$recording" "$rules" "$compat" "$jobstats"
step "promtool test rules" promtool test rules tests/rules/nvidia-gpu-rules.test.yml \
    tests/rules/nvidia-gpu-alerts.test.yml tests/rules/action-attacks.test.yml \
    tests/rules/dcgm-exporter-compat.test.yml tests/rules/jobstats-compat.test.yml \
    tests/rules/attacks-47.test.yml
exporter=${EXPORTER:-target/release/nvidia-textfile-exporter}
fake=${FAKE_NVML:-target/debug/libfake_nvml.so}
built=0
if [ -n "${EXPORTER:-}" ] && [ -n "${FAKE_NVML:-}" ]; then
    built=1
elif step "build exporter and fake NVML" build; then
    built=1
fi
if [ $built -eq 1 ]; then
    step "metric names, rule and dashboard shape" "$python" tests/rules/check.py static "$exporter"
    step "against exporter output" "$python" tests/rules/check.py output "$exporter" "$fake"
    step "short-for copy of the rules" "$python" tests/rules/check.py short-for "$work/rules.yml" 2s \
        "$recording" "$rules"
    step "end to end through Prometheus" timeout 240 "$python" tests/rules/e2e.py \
        "$exporter" "$fake" "$work/rules.yml" 120
fi

if [ $failed -gt 0 ]; then
    printf 'failed: %s\n' "${failures[@]}"
fi
echo "rules: $passed passed, $failed failed"
[ $failed -eq 0 ]
