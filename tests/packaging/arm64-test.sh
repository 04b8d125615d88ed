#!/bin/bash
# The arm64 package, cross-built on an amd64 host (`make deb ARCH=arm64`):
#  - lintian --fail-on error,warning is clean for the arm64 and the amd64 package;
#  - the arm64 package says Architecture: arm64, holds an AArch64 executable,
#    depends on libc6 as dpkg-shlibdeps computed it for arm64, and holds the same
#    files as the amd64 package;
#  - the packaged arm64 binary, run under qemu-user with Debian's arm64 C library
#    and the fake NVML cross-built for arm64, prints the same output (exit
#    status, stdout, stderr) as the packaged amd64 binary for every scenario
#    that has a golden file, with the default collectors and with the opt-in
#    ones added. Timestamps, durations and the GPM window are replaced as in
#    tests/cli/.
#
#   tests/packaging/arm64-test.sh     # `make test-arm64`, after tests/install-deps.sh --arm64
#
# Needs: cargo with the aarch64-unknown-linux-gnu target (rustup),
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, libc6:arm64, qemu-user-static,
# lintian, dpkg-dev, python3. No root.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need_commands cargo python3 lintian dpkg-deb readelf qemu-aarch64-static aarch64-linux-gnu-gcc

RUST_TARGET=aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}
# Debian's arm64 C library (libc6:arm64) puts the dynamic loader the binary
# names, /lib/ld-linux-aarch64.so.1, and its libraries in this host's
# multiarch paths, so qemu needs no other root.
QEMU=(qemu-aarch64-static -L /)
WORK=$(mktemp -d /var/tmp/nte-arm64-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# ---------------------------------------------------------------------------
say "build the packages"
t0=$(date +%s)
DEB_ARM64=$(DEB_OUT_DIR=$WORK/arm64 DEB_ARCH=arm64 "$ROOT/packaging/build-package.sh" | tail -n 1)
[ -f "$DEB_ARM64" ] || die "arm64 package build failed"
note "arm64 package (cross build): $(($(date +%s) - t0)) s"
t0=$(date +%s)
DEB_AMD64=$(DEB_OUT_DIR=$WORK/amd64 DEB_ARCH=amd64 "$ROOT/packaging/build-package.sh" | tail -n 1)
[ -f "$DEB_AMD64" ] || die "amd64 package build failed"
note "amd64 package: $(($(date +%s) - t0)) s"
t0=$(date +%s)
# shellcheck disable=SC2086 # CARGO_BUILD_FLAGS is a list of flags
(cd "$ROOT" && ${CARGO:-cargo} build ${CARGO_BUILD_FLAGS---locked} -p fake-nvml --target "$RUST_TARGET" >&2) ||
    die "cannot cross-build fake-nvml"
FAKE_ARM64=${CARGO_TARGET_DIR:-$ROOT/target}/$RUST_TARGET/debug/libfake_nvml.so
fake_nvml
[ -n "$FAKE_NVML" ] || die "no fake NVML (tests/fake-nvml)"
FAKE_AMD64=$FAKE_NVML
note "fake NVML for arm64: $(($(date +%s) - t0)) s"

for deb in "$DEB_ARM64" "$DEB_AMD64"; do
    check "lintian --fail-on error,warning $(basename "$deb")" lintian_clean "$deb"
done

say "the arm64 package"
check "Architecture: arm64" test "$(dpkg-deb -f "$DEB_ARM64" Architecture)" = arm64
depends=$(dpkg-deb -f "$DEB_ARM64" Depends)
note "Depends: $depends"
check "Depends: libc6 (>= 2.x) from dpkg-shlibdeps" grep -qE '^libc6 \(>= 2\.[0-9]+\)' <<<"$depends"
listing() { dpkg-deb -c "$1" | awk '{ print $6 }'; }
no_output "same files as the amd64 package" diff <(listing "$DEB_AMD64") <(listing "$DEB_ARM64")
dpkg-deb -x "$DEB_ARM64" "$WORK/root-arm64"
dpkg-deb -x "$DEB_AMD64" "$WORK/root-amd64"
BIN_ARM64=$WORK/root-arm64/usr/bin/$PACKAGE
BIN_AMD64=$WORK/root-amd64/usr/bin/$PACKAGE
check "usr/bin/$PACKAGE is an AArch64 executable" \
    grep -qE '^ *Machine: +AArch64$' <<<"$(readelf -h "$BIN_ARM64")"
check "its interpreter is /lib/ld-linux-aarch64.so.1" \
    grep -qF '[Requesting program interpreter: /lib/ld-linux-aarch64.so.1]' <<<"$(readelf -l "$BIN_ARM64")"
check "the fake NVML is an AArch64 library" \
    grep -qE '^ *Machine: +AArch64$' <<<"$(readelf -h "$FAKE_ARM64")"
check "runs under qemu-user: --version" \
    test "$("${QEMU[@]}" "$BIN_ARM64" --version)" = "$("$BIN_AMD64" --version)"

# ---------------------------------------------------------------------------
# normalized: the exporter's output with the values that change every run
# replaced, exactly as test-support's golden normalize() replaces them.
normalized() {
    sed -E -e 's/^nvidia_gpu_collector_duration_seconds .*/nvidia_gpu_collector_duration_seconds <duration>/' \
        -e 's/^nvidia_gpu_collector_timestamp_seconds .*/nvidia_gpu_collector_timestamp_seconds <timestamp>/' \
        -e 's/^(nvidia_gpu_collector_step_duration_seconds\{[^}]*\}) .*/\1 <duration>/' \
        -e 's/^(nvidia_gpu_gpm_window_seconds\{[^}]*\}) .*/\1 <window>/'
}
# run_case DIR SCENARIO FAKE BINARY... -- ARGS...: one run with a fresh state
# directory and an empty journal (as tests/cli/ does), its exit status,
# normalized stdout and stderr in DIR.
run_case() {
    local dir=$1 scenario=$2 fake=$3 command=() status
    shift 3
    while [ "$1" != -- ]; do command+=("$1"); shift; done
    shift
    mkdir -p "$dir/state" "$dir/journal"
    env -u RUST_LOG FAKE_NVML_SCENARIO="$scenario" "${command[@]}" --stdout --nvml-lib "$fake" \
        --state-dir "$dir/state" --journal-dir "$dir/journal" "$@" >"$dir/stdout" 2>"$dir/stderr"
    status=$?
    echo "$status" >"$dir/status"
    normalized <"$dir/stdout" >"$dir/stdout.normalized"
}
# same_output DIR_A DIR_B: equal status, normalized stdout and stderr.
same_output() {
    local part
    for part in status stdout.normalized stderr; do
        diff -u "$1/$part" "$2/$part" >"$WORK/diff" || { sed 's/^/      | /' "$WORK/diff" | head -n 40; return 1; }
    done
}

say "arm64 under qemu-user against amd64, every scenario with a golden file"
# The collectors that are off by default, but processes (it reads this host's
# /proc, which is no part of a scenario).
opt_in=()
while IFS=$'\t' read -r name default _; do
    [ "$default" = off ] && [ "$name" != processes ] && opt_in+=(--collector "$name")
done < <("$BIN_AMD64" --generate collectors)
note "opt-in collectors added in the second run: ${opt_in[*]}"
t0=$(date +%s)
cases=0
for golden in "$ROOT"/tests/golden/*.prom; do
    name=$(basename "$golden" .prom)
    scenario=$ROOT/tests/scenarios/$name.toml
    [ -f "$scenario" ] || continue
    for variant in default opt-in; do
        args=()
        [ "$variant" = opt-in ] && args=("${opt_in[@]}")
        dir=$WORK/cases/$name-$variant
        run_case "$dir/amd64" "$scenario" "$FAKE_AMD64" "$BIN_AMD64" -- "${args[@]}"
        run_case "$dir/arm64" "$scenario" "$FAKE_ARM64" "${QEMU[@]}" "$BIN_ARM64" -- "${args[@]}"
        check "$name ($variant): exit status $(cat "$dir/amd64/status"), $(grep -c . "$dir/amd64/stdout") lines, same on arm64" \
            same_output "$dir/amd64" "$dir/arm64"
        cases=$((cases + 1))
    done
done
check "scenarios compared (at least 8 with a golden file)" test "$cases" -ge 16
# The comparison covers both kinds of output: GPUs read, and runs that failed.
healthy=$(grep -l '^nvidia_gpu_info{' "$WORK"/cases/*/arm64/stdout | wc -l)
failed=$(grep -Lx 0 "$WORK"/cases/*/arm64/status | wc -l)
check "cases with GPUs read ($healthy) and failed runs ($failed)" test "$healthy" -gt 0 -a "$failed" -gt 0
note "runs: $(($(date +%s) - t0)) s"

finish "arm64 package test"
