# Helpers shared by the package tests (sourced, bash).
# shellcheck shell=bash
# shellcheck disable=SC2034 # variables used by the scripts that source this

PACKAGE=nvidia-textfile-exporter
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TEXTFILE_DIR=/var/lib/prometheus/node-exporter
FAILED=0
PASSED=0
STARTED=$(date +%s)

say() { printf '\n== %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }
ok() { PASSED=$((PASSED + 1)); printf '   ok: %s\n' "$*"; }
fail() { FAILED=$((FAILED + 1)); printf '   FAIL: %s\n' "$*"; }
die() { printf 'FATAL: %s\n' "$*" >&2; exit 1; }

# check DESCRIPTION COMMAND...: runs COMMAND, passes when it exits 0.
check() {
    local what=$1
    shift
    if "$@"; then ok "$what"; else fail "$what"; fi
}

# Prints "N passed, N failed" (the closing line test runners understand) and
# returns non-zero on any failure.
finish() {
    local name=$1
    printf '\n%s: %d s\n' "$name" "$(($(date +%s) - STARTED))"
    printf '%d passed, %d failed\n' "$PASSED" "$FAILED"
    [ "$FAILED" -eq 0 ]
}

# exit_code NAME: the exit status the binary documents for NAME (e.g.
# NvmlUnavailable; case, `_` and `-` ignored), from `--generate exit-codes`.
exit_code() {
    "${EXPORTER:-$ROOT/target/release/$PACKAGE}" --generate exit-codes | awk -F '\t' -v want="$1" '
        function key(s) { s = tolower(s); gsub(/[^a-z0-9]/, "", s); return s }
        key($2) == key(want) { print $1; found = 1 }
        END { exit !found }'
}

need_root() { [ "$(id -u)" -eq 0 ] || die "run as root: the test installs and removes the package"; }

need_commands() {
    local missing=() command
    for command in "$@"; do
        command -v "$command" >/dev/null || missing+=("$command")
    done
    [ ${#missing[@]} -eq 0 ] || die "missing commands: ${missing[*]}"
}

# build_debs DIR: builds the package twice into DIR, as the version `make deb`
# gives (Cargo.toml's + "-1", the newest in packaging/debian/changelog) and as
# the next Debian revision for the upgrade test; sets DEB_OLD and DEB_NEW.
build_debs() {
    local dir=$1 cargo_version
    cargo_version=$(python3 -c 'import tomllib; print(tomllib.load(open("'"$ROOT"'/Cargo.toml", "rb"))["package"]["version"])')
    DEB_OLD=$(DEB_OUT_DIR=$dir/old DEB_VERSION=$cargo_version-1 "$ROOT/packaging/build-package.sh" | tail -n 1)
    DEB_NEW=$(DEB_OUT_DIR=$dir/new DEB_VERSION=$cargo_version-2 "$ROOT/packaging/build-package.sh" | tail -n 1)
    if [ ! -f "$DEB_OLD" ] || [ ! -f "$DEB_NEW" ]; then die "package build failed"; fi
    note "built $(basename "$DEB_OLD") and $(basename "$DEB_NEW")"
}

# fake_nvml: sets FAKE_NVML to the test library (building it when its crate is
# there) and SCENARIO, or leaves FAKE_NVML empty when there is none.
fake_nvml() {
    FAKE_NVML=
    SCENARIO=$ROOT/tests/scenarios/h100x8.toml
    [ -f "$ROOT/tests/fake-nvml/Cargo.toml" ] && [ -f "$SCENARIO" ] || return 0
    local lib=${CARGO_TARGET_DIR:-$ROOT/target}/debug/libfake_nvml.so
    if [ ! -f "$lib" ]; then
        # shellcheck disable=SC2086 # CARGO_BUILD_FLAGS is a list of flags
        (cd "$ROOT" && ${CARGO:-cargo} build ${CARGO_BUILD_FLAGS---locked} -p fake-nvml >&2) ||
            die "cannot build fake-nvml"
    fi
    FAKE_NVML=$lib
}

# logged LOG COMMAND...: runs COMMAND with its output in LOG, shown on failure.
logged() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 && return 0
    sed 's/^/      | /' "$log"
    return 1
}

# lintian_clean DEB: lintian --fail-on error,warning, printing what it says
# (but its note about running as root).
lintian_clean() {
    local output status
    output=$(lintian --fail-on error,warning "$1" 2>&1)
    status=$?
    output=$(grep -v '^running with root privileges is not recommended!$' <<<"$output")
    [ -n "$output" ] && printf '      | %s\n' "$output"
    [ "$status" -eq 0 ] && [ -z "$output" ]
}

# metric FILE NAME_WITH_LABELS: prints the value of one sample of a text exposition.
metric() { awk -v name="$2" '$1 == name { print $2; found = 1 } END { exit !found }' "$1"; }

# no_output DESCRIPTION COMMAND...: passes when COMMAND succeeds and prints nothing.
no_output() {
    local what=$1 output
    shift
    if output=$("$@" 2>&1) && [ -z "$output" ]; then
        ok "$what"
    else
        fail "$what"
        printf '%s\n' "$output" | sed 's/^/      | /'
    fi
}
