#!/bin/bash
# Package test on this host (Debian 12, root, no systemd needed as PID 1):
#  - static checks: shellcheck, lintian, the unit's systemd-analyze security
#    score, the cron example's syntax (Debian cron's `crontab -n`);
#  - dpkg -i, systemd-analyze verify of the installed units, one run of the
#    installed binary without NVML (error file, exit 3) and against the fake
#    NVML, scraped by the real node_exporter running as user prometheus;
#  - dpkg -r (output gone), reinstall, upgrade to a higher version (output
#    kept), dpkg -P (nothing left).
# It installs and purges the package: it refuses to run when the package is
# already installed. Needs: dpkg-dev, debhelper, lintian, shellcheck, cron, curl,
# prometheus-node-exporter, systemd (systemd-analyze), cargo, python3.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need_root
need_commands dpkg-buildpackage dh dpkg-deb dpkg-shlibdeps lintian shellcheck crontab curl systemd-analyze \
    prometheus-node-exporter runuser python3 cargo
getent passwd prometheus >/dev/null || die "no user prometheus (install prometheus-node-exporter)"
if dpkg-query -W -f '${db:Status-Status}' "$PACKAGE" 2>/dev/null | grep -qv '^not-installed$'; then
    die "$PACKAGE is installed here; purge it first (dpkg -P $PACKAGE)"
fi

WORK=$(mktemp -d /tmp/nte-host-test.XXXXXX)
EXPORTER_PID=
cleanup() {
    [ -n "$EXPORTER_PID" ] && kill "$EXPORTER_PID" 2>/dev/null
    if [ "${KEEP_INSTALLED:-0}" != 1 ] &&
        dpkg-query -W -f '${db:Status-Status}' "$PACKAGE" 2>/dev/null | grep -qv '^not-installed$'; then
        dpkg -P "$PACKAGE" >/dev/null 2>&1
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
say "static checks"
check "shellcheck: maintainer scripts and the Slurm examples (sh)" \
    shellcheck -s sh "$ROOT"/packaging/debian/postinst "$ROOT"/packaging/debian/postrm \
        "$ROOT"/packaging/examples/slurm/prolog "$ROOT"/packaging/examples/slurm/epilog
check "shellcheck: build and test scripts" \
    shellcheck -x "$ROOT"/packaging/build-package.sh "$ROOT"/tests/packaging/*.sh

security=$(systemd-analyze security --offline=true --threshold=20 \
    "$ROOT/systemd/$PACKAGE.service" 2>&1)
check "systemd-analyze security --offline=true: exposure <= 2.0 ($(printf '%s\n' "$security" | sed -n 's/.*Overall exposure level for [^:]*: //p'))" \
    systemd-analyze security --offline=true --threshold=20 "$ROOT/systemd/$PACKAGE.service" >/dev/null 2>&1

# crontab -n checks a user crontab (no user field): drop the user field of the
# cron.d lines, after checking that it is root.
cron_example=$ROOT/packaging/examples/cron.d/$PACKAGE
awk '/^[[:space:]]*(#|$)/ || /^[A-Za-z_]+=/ { print; next }
     { if ($6 != "root") { print "user field is not root: " $0 > "/dev/stderr"; exit 1 }
       $6 = ""; print }' "$cron_example" >"$WORK/crontab" &&
    check "cron example: crontab -n accepts it" crontab -n "$WORK/crontab"
check "cron example: four jobs per minute, 15 s apart, guarded by [ -x ]" \
    test "$(grep -cE '^\* \* \* \* \* root (sleep (15|30|45); )?\[ -x /usr/bin/nvidia-textfile-exporter \] && /usr/bin/nvidia-textfile-exporter( |$)' "$cron_example")" = 4

say "build the package (two versions)"
build_debs "$WORK/deb"
for deb in "$DEB_OLD" "$DEB_NEW"; do
    check "lintian --fail-on error,warning $(basename "$deb")" lintian_clean "$deb"
done
contents=$(dpkg-deb -c "$DEB_OLD" | awk '{ print $6 }' | sed 's|^\./|/|')
for path in "/usr/bin/$PACKAGE" /usr/lib/systemd/system/$PACKAGE.service /usr/lib/systemd/system/$PACKAGE.timer \
    "/etc/default/$PACKAGE" /usr/share/man/man1/$PACKAGE.1.gz /usr/share/doc/$PACKAGE/copyright \
    /usr/share/doc/$PACKAGE/changelog.Debian.gz /usr/share/doc/$PACKAGE/examples/cron.d/$PACKAGE \
    /usr/share/doc/$PACKAGE/examples/slurm/prolog /usr/share/doc/$PACKAGE/examples/slurm/epilog; do
    check "package holds $path" grep -qxF "$path" <<<"$contents"
done
if [ -f "$ROOT/README.md" ]; then
    check "package holds the README" grep -qxF "/usr/share/doc/$PACKAGE/README.md.gz" <<<"$contents"
fi
for doc in "$ROOT"/docs/*.md; do
    # dh_compress compresses the ones over 4 kB.
    path=/usr/share/doc/$PACKAGE/docs/$(basename "$doc")
    check "package holds $path(.gz)" grep -qxE "$path(\.gz)?" <<<"$contents"
done
for file in "$ROOT"/packaging/prometheus/*.yml "$ROOT"/packaging/grafana/*.json; do
    [ -f "$file" ] || continue
    check "package holds /usr/share/$PACKAGE/$(basename "$file")" \
        grep -qxF "/usr/share/$PACKAGE/$(basename "$file")" <<<"$contents"
done
check "conffiles lists /etc/default/$PACKAGE" \
    test "$(dpkg-deb --ctrl-tarfile "$DEB_OLD" | tar -xOf - ./conffiles)" = "/etc/default/$PACKAGE"
check "Depends computed by dpkg-shlibdeps" grep -q 'libc6 (>= ' <<<"$(dpkg-deb -f "$DEB_OLD" Depends)"
check "Recommends: prometheus-node-exporter" test "$(dpkg-deb -f "$DEB_OLD" Recommends)" = prometheus-node-exporter

# ---------------------------------------------------------------------------
say "install"
check "dpkg -i $(basename "$DEB_OLD")" logged "$WORK/dpkg.log" dpkg -i "$DEB_OLD"
no_output "systemd-analyze verify of the installed units" \
    systemd-analyze verify "$PACKAGE.service" "$PACKAGE.timer"
check "timer enabled (timers.target.wants link)" \
    test -L "/etc/systemd/system/timers.target.wants/$PACKAGE.timer"
check "textfile directory exists" test -d "$TEXTFILE_DIR"
OUT=$TEXTFILE_DIR/nvidia_gpu.prom

say "installed binary without NVML: the error file"
"/usr/bin/$PACKAGE" --timeout 5s --nvml-lib "$WORK/no-such-libnvidia-ml.so.1" 2>"$WORK/stderr"
status=$?
want=$(exit_code NvmlUnavailable) || die "no NvmlUnavailable in --generate exit-codes"
check "exit status $want (NVML unusable), got $status" test "$status" = "$want"
check "nvidia_gpu_collector_up 0" test "$(metric "$OUT" nvidia_gpu_collector_up)" = 0
check "nvidia_gpu_collector_error{reason=\"library_not_found\"} 1" \
    test "$(metric "$OUT" 'nvidia_gpu_collector_error{reason="library_not_found"}')" = 1
check "mode 0644" test "$(stat -c %a "$OUT")" = 644

fake_nvml
GPUS=0
if [ -n "$FAKE_NVML" ]; then
    say "installed binary against the fake NVML ($(basename "$SCENARIO"))"
    FAKE_NVML_SCENARIO=$SCENARIO "/usr/bin/$PACKAGE" --timeout 5s --nvml-lib "$FAKE_NVML" 2>"$WORK/stderr"
    status=$?
    check "exit status 0, got $status" test "$status" = 0
    check "quiet on success (nothing on stderr)" test ! -s "$WORK/stderr"
    check "nvidia_gpu_collector_up 1" test "$(metric "$OUT" nvidia_gpu_collector_up)" = 1
    GPUS=$(grep -c '^nvidia_gpu_info{' "$OUT")
    check "nvidia_gpu_info for 8 GPUs, got $GPUS" test "$GPUS" = 8
    check "state stored in /var/lib/$PACKAGE/state" test -f "/var/lib/$PACKAGE/state"
    FAKE_NVML_SCENARIO=$SCENARIO "/usr/bin/$PACKAGE" --timeout 5s --nvml-lib "$FAKE_NVML" 2>/dev/null
    check "the second run used the state (nvidia_gpu_collector_state_ok 1)" \
        test "$(metric "$OUT" nvidia_gpu_collector_state_ok)" = 1
else
    note "no fake NVML (tests/fake-nvml): node_exporter reads the error file"
fi

say "node_exporter (as user prometheus) serves the file"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
runuser -u prometheus -- prometheus-node-exporter --web.listen-address="127.0.0.1:$port" \
    --collector.disable-defaults --collector.textfile \
    --collector.textfile.directory="$TEXTFILE_DIR" >"$WORK/node-exporter.log" 2>&1 &
EXPORTER_PID=$!
for _ in $(seq 50); do
    curl -fsS "http://127.0.0.1:$port/metrics" -o "$WORK/metrics" 2>/dev/null && break
    sleep 0.2
done
check "scraped /metrics" test -s "$WORK/metrics"
check "node_textfile_scrape_error 0" test "$(metric "$WORK/metrics" node_textfile_scrape_error)" = 0
check "node_textfile_mtime_seconds for nvidia_gpu.prom" \
    grep -q "^node_textfile_mtime_seconds{file=\"$OUT\"}\|^node_textfile_mtime_seconds{file=\"nvidia_gpu.prom\"}" "$WORK/metrics"
if [ -n "$FAKE_NVML" ]; then
    check "nvidia_gpu_collector_up 1 served" test "$(metric "$WORK/metrics" nvidia_gpu_collector_up)" = 1
    check "nvidia_gpu_info for $GPUS GPUs served" test "$(grep -c '^nvidia_gpu_info{' "$WORK/metrics")" = "$GPUS"
else
    check "nvidia_gpu_collector_up 0 served" test "$(metric "$WORK/metrics" nvidia_gpu_collector_up)" = 0
fi
check "no error in node_exporter's log" bash -c "! grep -Ei 'level=(error|warn)' '$WORK/node-exporter.log'"
kill "$EXPORTER_PID" 2>/dev/null
wait "$EXPORTER_PID" 2>/dev/null
EXPORTER_PID=

# ---------------------------------------------------------------------------
say "boot: systemd-tmpfiles removes the previous boot's snapshot"
TMPFILES=/usr/lib/tmpfiles.d/$PACKAGE.conf
check "package holds $TMPFILES" grep -qxF "$TMPFILES" <<<"$contents"
touch "$TEXTFILE_DIR/other.prom"
check "snapshot there before" test -f "$OUT"
systemd-tmpfiles --remove "$TMPFILES"
check "kept by systemd-tmpfiles --remove without --boot" test -f "$OUT"
systemd-tmpfiles --boot --remove "$TMPFILES"
check "removed by systemd-tmpfiles --boot --remove" test ! -e "$OUT"
check "another collector's file kept" test -f "$TEXTFILE_DIR/other.prom"
rm -f "$TEXTFILE_DIR/other.prom"
# The checks below need the snapshot again.
"/usr/bin/$PACKAGE" --timeout 5s --nvml-lib "$WORK/no-such-libnvidia-ml.so.1" 2>/dev/null
check "snapshot written again" test -f "$OUT"

# ---------------------------------------------------------------------------
say "dpkg -r"
touch "$TEXTFILE_DIR/.nvidia_gpu.prom.999999.AbCdEf.tmp"
check "dpkg -r" logged "$WORK/dpkg.log" dpkg -r "$PACKAGE"
check "binary gone" test ! -e "/usr/bin/$PACKAGE"
check "nvidia_gpu.prom gone" test ! -e "$OUT"
check "lock file gone" test ! -e "$TEXTFILE_DIR/.nvidia_gpu.prom.lock"
check "temporary files gone" bash -c "! ls -A '$TEXTFILE_DIR' | grep -q '^\.nvidia_gpu\.prom\..*\.tmp$'"
check "conffile kept" test -f "/etc/default/$PACKAGE"
check "state: config-files" test "$(dpkg-query -W -f '${db:Status-Status}' "$PACKAGE")" = config-files
# debhelper 13.11 no longer masks units on removal (Debian bug #1021027): the
# unit file is gone, so nothing can start the timer; its enable link stays
# until purge, so a reinstall keeps the admin's choice.
check "timer not masked while removed (as dh_installsystemd 13.11 does)" \
    test ! -e "/etc/systemd/system/$PACKAGE.timer"
check "timer's enable link kept while removed" \
    test -L "/etc/systemd/system/timers.target.wants/$PACKAGE.timer"
check "the cron example's job does nothing now" \
    bash -c "[ -x /usr/bin/nvidia-textfile-exporter ] && /usr/bin/nvidia-textfile-exporter; test ! -e '$OUT'"

say "reinstall, then upgrade"
check "dpkg -i $(basename "$DEB_OLD") again" logged "$WORK/dpkg.log" dpkg -i "$DEB_OLD"
check "timer unmasked and enabled again" bash -c \
    "test ! -e /etc/systemd/system/$PACKAGE.timer && test -L /etc/systemd/system/timers.target.wants/$PACKAGE.timer"
"/usr/bin/$PACKAGE" --timeout 5s --nvml-lib "$WORK/no-such-lib.so" 2>/dev/null
check "dpkg -i $(basename "$DEB_NEW") (upgrade)" logged "$WORK/dpkg.log" dpkg -i "$DEB_NEW"
check "version is $(dpkg-deb -f "$DEB_NEW" Version)" \
    test "$(dpkg-query -W -f '${Version}' "$PACKAGE")" = "$(dpkg-deb -f "$DEB_NEW" Version)"
check "output kept across the upgrade" test -f "$OUT"
check "timer still enabled" test -L "/etc/systemd/system/timers.target.wants/$PACKAGE.timer"

# An output named in ARGS is cleaned up too.
sed -i 's|^ARGS=.*|ARGS="--timeout 5s --output-file custom_gpu.prom"|' "/etc/default/$PACKAGE"
"/usr/bin/$PACKAGE" --timeout 5s --output-file custom_gpu.prom --nvml-lib "$WORK/no-such-lib.so" 2>/dev/null
check "custom output written" test -f "$TEXTFILE_DIR/custom_gpu.prom"

say "dpkg -P"
check "dpkg -P" logged "$WORK/dpkg.log" dpkg -P "$PACKAGE"
check "dpkg -L fails" bash -c "! dpkg -L $PACKAGE >/dev/null 2>&1"
check "/etc/default/$PACKAGE gone" test ! -e "/etc/default/$PACKAGE"
check "nvidia_gpu.prom gone" test ! -e "$OUT"
check "custom output (from ARGS) gone" test ! -e "$TEXTFILE_DIR/custom_gpu.prom"
check "lock files gone" bash -c "! ls -A '$TEXTFILE_DIR' | grep -q '_gpu\.prom\.lock$'"
check "no unit links left in /etc/systemd/system" \
    test -z "$(find /etc/systemd/system -name "$PACKAGE*" 2>/dev/null)"
check "no deb-systemd-helper state left" \
    test -z "$(find /var/lib/systemd/deb-systemd-helper-enabled /var/lib/systemd/deb-systemd-helper-masked -name "*$PACKAGE*" 2>/dev/null)"
check "no file of the package left" \
    test -z "$(find /usr/bin /usr/lib/systemd /etc /usr/share/doc /usr/share/man /usr/share/lintian -name "$PACKAGE*" 2>/dev/null)"
check "no /usr/share/$PACKAGE left" test ! -e "/usr/share/$PACKAGE"
check "state directory /var/lib/$PACKAGE gone" test ! -e "/var/lib/$PACKAGE"
check "textfile directory of prometheus-node-exporter kept" test -d "$TEXTFILE_DIR"

finish "package host test"
