#!/bin/bash
# On a host with an NVIDIA GPU and driver: does the sandboxed unit still read
# the real NVML? Not part of `make test` (CI has no GPU).
#
#   tests/packaging/gpu-host-check.sh --prepare DIR   # on a build host (Debian)
#   tests/packaging/gpu-host-check.sh PACKAGE.deb [DIR] # on the GPU host
#
# --prepare writes to DIR what a GPU host without systemd needs to rebuild the
# unit's seccomp filters: seccomp-run (static; needs gcc, libseccomp-dev) and
# the syscalls the unit's SystemCallFilter= lines allow (systemd-analyze).
#
# Prints the driver's device nodes and /proc/devices groups (what DeviceAllow=
# char-nvidia* matches), runs the packaged binary plainly, then:
#  - where systemd is PID 1: installs the package, runs the service once with
#    all its hardening and checks the file (then purges the package, unless it
#    was installed before);
#  - elsewhere (a container): runs the binary with what can be rebuilt without
#    systemd (user namespace mapping only root, no capabilities, no new
#    privileges, no network, and with DIR the seccomp filters of
#    SystemCallFilter=, MemoryDenyWriteExecute=, RestrictAddressFamilies=)
#    and says what was not checked.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ "${1:-}" = --prepare ]; then
    dir=${2:?usage: $0 --prepare DIR}
    mkdir -p "$dir"
    cc -O2 -static -o "$dir/seccomp-run" "$ROOT/tests/packaging/seccomp-run.c" -lseccomp || exit 1
    # The allow list minus the deny lists, in the order of the unit's lines.
    python3 - "$ROOT/systemd/$PACKAGE.service" >"$dir/allowed-syscalls" <<'EOF'
import subprocess, sys

def expand(item):
    if not item.startswith("@"):
        return {item}
    out = subprocess.run(["systemd-analyze", "syscall-filter", item],
                         capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            names |= expand(line)
    return names

allowed = set()
for line in open(sys.argv[1]):
    if not line.startswith("SystemCallFilter="):
        continue
    value = line.split("=", 1)[1].strip()
    items = set().union(*(expand(i) for i in value.lstrip("~").split()))
    if value.startswith("~"):
        allowed -= items
    else:
        allowed |= items
print("\n".join(sorted(allowed)))
EOF
    note "wrote $dir/seccomp-run and $dir/allowed-syscalls ($(wc -l <"$dir/allowed-syscalls") names)"
    exit 0
fi

DEB=${1:?usage: $0 PACKAGE.deb [DIR]}
PREPARED=${2:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

say "driver"
# shellcheck disable=SC2012 # for a person to read
ls -la /dev/nvidia* /dev/nvidia-caps 2>&1 | sed "s/^/   /"
note "/proc/devices: $(awk '$2 ~ /^nvidia/ { printf "%s=%s ", $2, $1 }' /proc/devices)"
note "NVML: $(ldconfig -p | awk '/libnvidia-ml\.so\.1 / { print $NF; exit }')"
note "PID 1: $(cat /proc/1/comm)"

say "packaged binary, plain run"
dpkg-deb -x "$DEB" "$WORK/pkg"
BIN=$WORK/pkg/usr/bin/$PACKAGE
mkdir "$WORK/plain"
"$BIN" --timeout 5s --output-dir "$WORK/plain"
status=$?
check "exit 0, got $status" test "$status" = 0
check "nvidia_gpu_collector_up 1" test "$(metric "$WORK/plain/nvidia_gpu.prom" nvidia_gpu_collector_up)" = 1
note "GPUs: $(grep -c '^nvidia_gpu_info{' "$WORK/plain/nvidia_gpu.prom")," \
    "samples: $(grep -vc '^#' "$WORK/plain/nvidia_gpu.prom")"

if [ "$(cat /proc/1/comm)" = systemd ] && [ -d /run/systemd/system ]; then
    say "the packaged service, with all its sandboxing"
    installed_before=$(dpkg-query -W -f '${db:Status-Status}' "$PACKAGE" 2>/dev/null)
    check "dpkg -i" logged "$WORK/dpkg.log" dpkg -i "$DEB"
    systemctl start "$PACKAGE.service"
    check "run succeeded" test "$(systemctl show -P Result -P ExecMainStatus "$PACKAGE.service" | tr '\n' ' ')" = "success 0 "
    out=$TEXTFILE_DIR/nvidia_gpu.prom
    check "nvidia_gpu_collector_up 1" test "$(metric "$out" nvidia_gpu_collector_up)" = 1
    check "same series as the plain run" \
        diff <(grep -v '^#' "$WORK/plain/nvidia_gpu.prom" | sed 's/[ ].*//' | sort -u) \
        <(grep -v '^#' "$out" | sed 's/[ ].*//' | sort -u)
    journalctl -q --no-pager -u "$PACKAGE.service" -n 20 | sed 's/^/   journal: /'
    if [ "$installed_before" != installed ]; then
        dpkg -P "$PACKAGE" >/dev/null 2>&1
    fi
else
    say "no systemd: user namespace (root only), no capabilities, no new privileges, no network"
    need_commands unshare setpriv
    mkdir "$WORK/sandbox"
    seccomp=()
    if [ -n "$PREPARED" ]; then
        seccomp=("$PREPARED/seccomp-run" "$PREPARED/allowed-syscalls")
    fi
    unshare --user --map-root-user --net --mount -- \
        setpriv --no-new-privs --bounding-set=-all --inh-caps=-all -- \
        "${seccomp[@]}" "$BIN" --timeout 5s --output-dir "$WORK/sandbox"
    status=$?
    check "exit 0, got $status" test "$status" = 0
    check "nvidia_gpu_collector_up 1" test "$(metric "$WORK/sandbox/nvidia_gpu.prom" nvidia_gpu_collector_up)" = 1
    check "same series as the plain run" \
        diff <(grep -v '^#' "$WORK/plain/nvidia_gpu.prom" | sed 's/[ ].*//' | sort -u) \
        <(grep -v '^#' "$WORK/sandbox/nvidia_gpu.prom" | sed 's/[ ].*//' | sort -u)
    if [ -n "$PREPARED" ]; then
        note "not checked without systemd: DevicePolicy=/DeviceAllow=, ProtectProc=, ProtectSystem=, other Protect*/Restrict*"
    else
        note "not checked without systemd: seccomp (no DIR), DevicePolicy=/DeviceAllow=, ProtectProc=, ProtectSystem=, other Protect*/Restrict*"
    fi
fi

finish "GPU host check"
