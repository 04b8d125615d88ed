#!/usr/bin/env bash
# Process owners are named through NSS, not only /etc/passwd: a process runs as
# a user that exists only in libnss-extrausers' database, and the exporter's
# processes collector must name it. The NSS configuration is changed in a
# private mount namespace only (unshare -m), so the host is left as it was.
# Needs root and libnss-extrausers (tests/install-deps.sh installs it).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${EXPORTER:-$ROOT/target/release/nvidia-textfile-exporter}
NVML=${FAKE_NVML:-$ROOT/target/debug/libfake_nvml.so}
[ "$(id -u)" -eq 0 ] || { echo "nss-users: needs root (unshare -m, setpriv)" >&2; exit 1; }

WORK=$(mktemp -d)
# The bind mount needs a mount point; one this test creates is removed again.
made_mount_point=
[ -d /var/lib/extrausers ] || { mkdir /var/lib/extrausers && made_mount_point=yes; }
cleanup() {
    kill "$SLEEPER" 2>/dev/null || true
    rm -rf "$WORK"
    [ -z "$made_mount_point" ] || rmdir /var/lib/extrausers
}
trap cleanup EXIT
USER_UID=61234
USER_NAME=ldap-only-alice
if getent passwd "$USER_UID" >/dev/null; then
    echo "nss-users: uid $USER_UID exists on this host; pick another" >&2
    exit 1
fi

# A process of that uid, which the fake NVML lists as running on GPU 0.
setpriv --reuid "$USER_UID" --regid "$USER_UID" --clear-groups sleep 60 &
SLEEPER=$!
sed "s/{ pid = 301122, /{ pid = $SLEEPER, /" "$ROOT/tests/scenarios/h100x8.toml" >"$WORK/scenario.toml"
grep -q "pid = $SLEEPER," "$WORK/scenario.toml"

mkdir -p "$WORK/extrausers"
echo "$USER_NAME:x:$USER_UID:$USER_UID:LDAP-only user:/nonexistent:/usr/sbin/nologin" >"$WORK/extrausers/passwd"
: >"$WORK/extrausers/group"
: >"$WORK/extrausers/shadow"
sed 's/^passwd:.*/passwd:         files extrausers/' /etc/nsswitch.conf >"$WORK/nsswitch.conf"

run() {
    FAKE_NVML_SCENARIO=$WORK/scenario.toml "$BIN" --nvml-lib "$NVML" --stdout \
        --state-dir "$WORK/state" --collector processes
}
export -f run
export BIN NVML WORK
# Control: without the module the owner is the bare uid.
run | grep -F "pid=\"$SLEEPER\"" | grep -qF "user=\"$USER_UID\"" ||
    { echo "nss-users: FAIL: control run did not show the bare uid" >&2; exit 1; }
# With it (private mounts only), the name.
unshare -m bash -c "
    mount --bind '$WORK/extrausers' /var/lib/extrausers
    mount --bind '$WORK/nsswitch.conf' /etc/nsswitch.conf
    getent passwd $USER_UID | grep -q '^$USER_NAME:' || { echo 'nss-users: extrausers not active' >&2; exit 1; }
    run" >"$WORK/out.prom"
if grep -F "pid=\"$SLEEPER\"" "$WORK/out.prom" | grep -qF "user=\"$USER_NAME\""; then
    echo "nss-users: ok: uid $USER_UID named $USER_NAME through NSS (extrausers)"
else
    echo "nss-users: FAIL: the process of uid $USER_UID is not named $USER_NAME:" >&2
    grep -F "pid=\"$SLEEPER\"" "$WORK/out.prom" >&2 || true
    exit 1
fi
