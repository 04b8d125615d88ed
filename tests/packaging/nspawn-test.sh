#!/bin/bash
# Package test under a real systemd: boots a minimal Debian (debootstrap) with
# systemd-nspawn, installs the .deb and checks, inside:
#  - lintian of the suite (newer than the host's) passes the package;
#  - postinst creates a missing textfile directory, enables and starts the timer;
#    systemd-analyze verify says nothing about the units under that systemd;
#  - without a GPU: at least three runs, 15 s +- 1 s apart, seen in the journal
#    (failures are logged), a fresh error file that node_exporter's user reads
#    and Debian's node_exporter serves with node_textfile_scrape_error 0;
#  - with the fake NVML configured through /etc/default: healthy runs leave
#    nothing in the journal (and without LogLevelMax= systemd would log);
#  - with journald keeping no files (Storage=none), the xid collector reads
#    /dev/kmsg under the unit's sandbox: it reads past a record written there
#    (a line from user space, which never counts) with success 1; drop-ins
#    without the unit's CAP_SYSLOG (where kernel.dmesg_restrict=1) or its
#    DeviceAllow= for it (where device ACLs are enforced) make it fail;
#  - a shared textfile directory keeps its owner and mode; a deleted one fails
#    the run with exit status 7 (logged), not the unit with 226/NAMESPACE;
#  - the cron example, installed by hand, runs the exporter 15 s apart;
#  - the Slurm hook, run as slurmd runs it, records a job's GPU, which the
#    sandboxed timer's runs count; without NVML it exits 0 and says why in the
#    journal;
#  - dpkg -r stops the timer and deletes the output, dpkg -P leaves nothing.
# Then it powers the container off.
#
#   tests/packaging/nspawn-test.sh [SUITE]
#
# SUITE is the Debian release booted: bookworm (Debian 12, systemd 252, the
# default) or trixie (Debian 13, systemd 257); `make test-packaging` runs both.
#
# The root file system is cached as a tarball in $NTE_TEST_CACHE (default
# /var/cache/nvidia-textfile-exporter-tests); without it debootstrap fetches it
# (DEBOOTSTRAP_MIRROR overrides apt's default mirror).
# Needs: root, debootstrap, systemd-container, util-linux (nsenter), curl,
# dpkg-dev, debhelper, cargo, python3. The host's PID 1 need not be systemd.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need_root
need_commands debootstrap systemd-nspawn nsenter curl python3 cargo tar

SUITE=${1:-bookworm}
# The systemd each suite ships: the test checks that it booted the one meant.
case "$SUITE" in
    bookworm) SYSTEMD_VERSION=252 ;;
    trixie) SYSTEMD_VERSION=257 ;;
    *) die "unknown suite $SUITE (bookworm or trixie)" ;;
esac
INCLUDE=systemd,systemd-sysv,dbus,cron,prometheus-node-exporter
# The package is checked with lintian of each suite: Debian 12's runs on the
# host (host-test.sh), newer ones inside. Installed with apt after debootstrap
# (debootstrap --include fails configuring lintian's perl modules).
EXTRA=
[ "$SUITE" = bookworm ] || EXTRA=lintian
CACHE=${NTE_TEST_CACHE:-/var/cache/nvidia-textfile-exporter-tests}
KEY=$(printf '%s %s %s\n' "$SUITE" "$INCLUDE" "$EXTRA" | sha256sum | cut -c1-12)
TARBALL=$CACHE/rootfs-$SUITE-$KEY.tar
MACHINE=nte-test-$$
# Debian 12 hosts use the unified cgroup hierarchy; give the container one too.
export SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=${SYSTEMD_NSPAWN_UNIFIED_HIERARCHY:-1}

WORK=$(mktemp -d /var/tmp/nte-nspawn-test.XXXXXX)
NSPAWN_PID=
LEADER=
cleanup() {
    if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
        kill "$NSPAWN_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$NSPAWN_PID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# ct COMMAND...: runs COMMAND inside the container (all its namespaces).
ct() {
    nsenter --target "$LEADER" --all -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive SYSTEMD_PAGER= "$@"
}
# ct_net COMMAND...: runs a host COMMAND in the container's network namespace.
ct_net() { nsenter --target "$LEADER" --net -- "$@"; }
cursor() { ct journalctl -n 0 --show-cursor -q | sed -n 's/^-- cursor: //p'; }
# since CURSOR [journalctl options]: the journal after CURSOR.
since() {
    local c=$1
    shift
    ct journalctl --no-pager -q --after-cursor="$c" "$@"
}
# wait_for SECONDS COMMAND...: polls COMMAND every 0.5 s.
wait_for() {
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.5
    done
}
# spacing_ok T1 T2 ...: every gap between consecutive times (s) is 15 +- 1.
spacing_ok() {
    python3 - "$@" <<'EOF'
import sys
t = [float(x) for x in sys.argv[1:]]
gaps = [b - a for a, b in zip(t, t[1:])]
print("      gaps: " + ", ".join(f"{g:.2f} s" for g in gaps))
sys.exit(0 if gaps and all(abs(g - 15) <= 1 for g in gaps) else 1)
EOF
}
# journal_has CURSOR TEXT [journalctl options]: TEXT (fixed string) is in the
# journal after CURSOR.
journal_has() {
    local c=$1 text=$2
    shift 2
    since "$c" "$@" | grep -qF -- "$text"
}
not() { ! "$@"; }
quietly() { "$@" >/dev/null 2>&1; }
scrape() { ct_net curl -fsS --max-time 5 http://127.0.0.1:9100/metrics -o "$1"; }
OUT=$TEXTFILE_DIR/nvidia_gpu.prom
# kmsg_seq_of TEXT: the sequence number of the last /dev/kmsg record holding
# TEXT (the container shares the host's ring buffer).
kmsg_seq_of() {
    python3 - "$1" <<'EOF'
import os, sys
fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
seq = ""
while True:
    try:
        record = os.read(fd, 1 << 14)
    except BlockingIOError:
        break
    except BrokenPipeError:
        continue
    head, _, message = record.decode(errors="replace").partition(";")
    if sys.argv[1] in message:
        seq = head.split(",")[1]
print(seq)
EOF
}

# ---------------------------------------------------------------------------
say "root file system ($SUITE minbase + ${INCLUDE}${EXTRA:+, then $EXTRA})"
t0=$(date +%s)
if [ ! -f "$TARBALL" ]; then
    note "no cached $TARBALL: debootstrap"
    mkdir -p "$CACHE"
    # shellcheck disable=SC2086 # an unset mirror is no argument
    if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$WORK/bootstrap" \
        ${DEBOOTSTRAP_MIRROR:-} >"$WORK/debootstrap.log" 2>&1; then
        tail -n 20 "$WORK/debootstrap.log"
        die "debootstrap failed"
    fi
    # shellcheck disable=SC2086 # EXTRA is a list of packages
    if [ -n "$EXTRA" ] && ! systemd-nspawn --quiet --register=no --keep-unit --directory="$WORK/bootstrap" \
        --pipe env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $EXTRA \
        >"$WORK/apt.log" 2>&1; then
        tail -n 20 "$WORK/apt.log"
        die "apt-get install $EXTRA failed"
    fi
    # A machine id is made at each boot; apt's lists are not needed.
    : >"$WORK/bootstrap/etc/machine-id"
    rm -rf "$WORK/bootstrap/var/lib/apt/lists/"* "$WORK/bootstrap/var/cache/apt/archives/"*.deb
    tar --numeric-owner --xattrs -C "$WORK/bootstrap" -cf "$TARBALL.tmp" . && mv "$TARBALL.tmp" "$TARBALL"
    rm -rf "$WORK/bootstrap"
    note "debootstrap and cache: $(($(date +%s) - t0)) s"
else
    note "cached: $TARBALL"
fi
mkdir "$WORK/root"
tar --numeric-owner --xattrs -C "$WORK/root" -xf "$TARBALL" || die "cannot unpack $TARBALL"
note "root file system ready: $(($(date +%s) - t0)) s"

say "package and fake NVML"
mkdir "$WORK/share"
DEB=$(DEB_OUT_DIR=$WORK/deb "$ROOT/packaging/build-package.sh" | tail -n 1)
[ -f "$DEB" ] || die "package build failed"
cp "$DEB" "$WORK/share/package.deb"
fake_nvml
if [ -n "$FAKE_NVML" ]; then
    cp "$FAKE_NVML" "$WORK/share/libfake_nvml.so"
    cp "$SCENARIO" "$WORK/share/scenario.toml"
else
    note "no fake NVML (tests/fake-nvml): the healthy-run checks are skipped"
fi

# ---------------------------------------------------------------------------
say "boot"
t0=$(date +%s)
# --register=no --keep-unit: the host's PID 1 is not systemd (no machined, no
# system bus to ask for a scope). --private-network: node_exporter's :9100
# stays inside. --capability=CAP_SYSLOG: a host's PID 1 has it, nspawn drops it
# by default; the unit keeps it to read /dev/kmsg where kernel.dmesg_restrict=1.
systemd-nspawn --quiet --register=no --keep-unit --private-network --capability=CAP_SYSLOG \
    --machine="$MACHINE" --directory="$WORK/root" --bind-ro="$WORK/share:/mnt/nte" \
    --console=read-only --boot >"$WORK/console.log" 2>&1 &
NSPAWN_PID=$!
for _ in $(seq 100); do
    LEADER=$(pgrep -P "$NSPAWN_PID" | head -n 1)
    [ -n "$LEADER" ] && [ "$(cat "/proc/$LEADER/comm" 2>/dev/null)" = systemd ] && break
    LEADER=
    kill -0 "$NSPAWN_PID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$LEADER" ]; then
    cat "$WORK/console.log"
    die "the container did not start"
fi
# Until PID 1 listens, systemctl cannot connect and prints no state.
state=
for _ in $(seq 100); do
    state=$(timeout 60 nsenter --target "$LEADER" --all -- /bin/systemctl is-system-running --wait 2>/dev/null)
    [ -n "$state" ] && break
    sleep 0.2
done
note "system state: $state, $(($(date +%s) - t0)) s"
check "booted (running or degraded)" test "$state" = running -o "$state" = degraded
[ "$state" = degraded ] && ct systemctl --failed --no-legend
check "systemd $SYSTEMD_VERSION inside" grep -q "^systemd $SYSTEMD_VERSION " <<<"$(ct systemctl --version)"
if [ "$SUITE" != bookworm ]; then
    check "lintian of $SUITE ($(ct lintian --version)) --fail-on error,warning" \
        logged "$WORK/lintian.log" ct lintian --fail-on error,warning /mnt/nte/package.deb
fi

# ---------------------------------------------------------------------------
say "install (textfile directory missing, as without prometheus-node-exporter)"
ct rmdir "$TEXTFILE_DIR" || die "cannot remove the empty $TEXTFILE_DIR"
c_install=$(cursor)
check "dpkg -i" logged "$WORK/dpkg.log" ct dpkg -i /mnt/nte/package.deb
check "postinst created $TEXTFILE_DIR root:root 0755" \
    test "$(ct stat -c '%U:%G %a' "$TEXTFILE_DIR")" = "root:root 755"
check "timer enabled" test "$(ct systemctl is-enabled nvidia-textfile-exporter.timer)" = enabled
check "timer active" test "$(ct systemctl is-active nvidia-textfile-exporter.timer)" = active
check "nothing installed in /etc/cron.d" test -z "$(ct find /etc/cron.d -name '*nvidia*')"
# This suite's systemd knows every directive of the units (an older one would
# say "Unknown key" here and ignore it). The minimal root has no man(1):
# the host test checks the Documentation= page.
no_output "systemd-analyze verify of the installed units (systemd $SYSTEMD_VERSION)" \
    ct systemd-analyze verify --man=no nvidia-textfile-exporter.service nvidia-textfile-exporter.timer
# Control: a directive this systemd does not know is reported.
ct mkdir -p /run/systemd/system/nvidia-textfile-exporter.service.d
ct sh -c 'printf "[Service]\nNoSuchDirective=yes\n" >/run/systemd/system/nvidia-textfile-exporter.service.d/unknown.conf'
# (systemd 252 and 257 word it "Unknown key 'X' in section [Service]".)
check "control: verify reports an unknown directive" \
    grep -qE "Unknown key (name )?'NoSuchDirective'" <<<"$(ct systemd-analyze verify --man=no nvidia-textfile-exporter.service 2>&1)"
ct rm -r /run/systemd/system/nvidia-textfile-exporter.service.d
score=$(ct systemd-analyze security nvidia-textfile-exporter.service 2>&1 | sed -n 's/.*Overall exposure level for [^:]*: //p')
note "systemd-analyze security (running manager): $score"

say "no GPU: the timer runs every 15 s, failures are logged, the error file is served"
# A failed run ends with this manager message (notice, passes LogLevelMax=notice).
runs() {
    since "$c_install" -u nvidia-textfile-exporter.service -o json |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("MESSAGE", "").startswith("nvidia-textfile-exporter.service: Main process exited"):
        print(int(m["__REALTIME_TIMESTAMP"]) / 1e6)'
}
three_runs() { [ "$(runs | wc -l)" -ge 3 ]; }
t0=$(date +%s)
check "three runs within 50 s" wait_for 50 three_runs
note "waited $(($(date +%s) - t0)) s"
# shellcheck disable=SC2046 # one argument per run time
check "runs 15 s +- 1 s apart" spacing_ok $(runs)
check "failure logged: status=3" \
    journal_has "$c_install" 'status=3/' -u nvidia-textfile-exporter.service
check "exporter's error logged at error priority (journalctl -p err)" \
    journal_has "$c_install" 'cannot use NVML (library_not_found)' -u nvidia-textfile-exporter.service -p err
check "its hint line logged at error priority too" \
    journal_has "$c_install" 'hint: libnvidia-ml.so.1 could not be loaded' -u nvidia-textfile-exporter.service -p err
check "journal lines do not repeat the program name" \
    not journal_has "$c_install" 'nvidia-textfile-exporter: error:' -u nvidia-textfile-exporter.service
ct cat "$OUT" >"$WORK/error.prom" 2>/dev/null
check "error file: nvidia_gpu_collector_up 0" test "$(metric "$WORK/error.prom" nvidia_gpu_collector_up)" = 0
check "error file: reason library_not_found" \
    test "$(metric "$WORK/error.prom" 'nvidia_gpu_collector_error{reason="library_not_found"}')" = 1
age=$(python3 -c 'import sys, time; print(int(time.time() - float(sys.argv[1])))' \
    "$(metric "$WORK/error.prom" nvidia_gpu_collector_timestamp_seconds)")
check "error file is fresh (${age} s old)" test "$age" -le 16
check "file root:root 0644" test "$(ct stat -c '%U:%G %a' "$OUT")" = "root:root 644"
check "readable by node_exporter's user (prometheus)" quietly ct runuser -u prometheus -- cat "$OUT"
check "node_exporter (Debian's service) scraped" scrape "$WORK/metrics"
check "served: nvidia_gpu_collector_up 0" test "$(metric "$WORK/metrics" nvidia_gpu_collector_up)" = 0
check "served: node_textfile_scrape_error 0" test "$(metric "$WORK/metrics" node_textfile_scrape_error)" = 0

# ---------------------------------------------------------------------------
if [ -n "$FAKE_NVML" ]; then
    say "healthy runs (fake NVML set in /etc/default): nothing in the journal"
    ct install -D -m 0644 /mnt/nte/libfake_nvml.so /usr/local/lib/nte-test/libfake_nvml.so
    ct install -D -m 0644 /mnt/nte/scenario.toml /usr/local/lib/nte-test/scenario.toml
    ct sh -c 'cat >/etc/default/nvidia-textfile-exporter' <<'EOF'
ARGS="--timeout 5s --nvml-lib /usr/local/lib/nte-test/libfake_nvml.so"
FAKE_NVML_SCENARIO=/usr/local/lib/nte-test/scenario.toml
EOF
    healthy() { ct grep -qx 'nvidia_gpu_collector_up 1' "$OUT"; }
    check "next run reads the fake GPUs" wait_for 20 healthy
    c_healthy=$(cursor)
    starts=()
    last=$(ct systemctl show -P InvocationID nvidia-textfile-exporter.service)
    t0=$(date +%s)
    while [ ${#starts[@]} -lt 2 ] && [ "$(($(date +%s) - t0))" -lt 40 ]; do
        sleep 0.5
        id=$(ct systemctl show -P InvocationID nvidia-textfile-exporter.service)
        if [ "$id" != "$last" ] && [ "$(ct systemctl show -P ActiveState nvidia-textfile-exporter.service)" = inactive ]; then
            last=$id
            check "run $id: Result=success, status 0" test "$(ct systemctl show -P Result -P ExecMainStatus nvidia-textfile-exporter.service | tr '\n' ' ')" = "success 0 "
            starts+=("$(ct systemctl show -P ExecMainStartTimestampMonotonic nvidia-textfile-exporter.service |
                awk '{ printf "%.6f", $1 / 1e6 }')")
        fi
    done
    check "two more healthy runs seen" test ${#starts[@]} -ge 2
    check "healthy runs 15 s +- 1 s apart" spacing_ok "${starts[@]}"
    no_output "journal: nothing about the unit during healthy runs" \
        since "$c_healthy" -u nvidia-textfile-exporter.service -u nvidia-textfile-exporter.timer
    check "journal: no line at all naming nvidia-textfile-exporter" \
        not journal_has "$c_healthy" nvidia-textfile-exporter
    check "node_exporter scraped" scrape "$WORK/metrics"
    check "served: nvidia_gpu_collector_up 1" test "$(metric "$WORK/metrics" nvidia_gpu_collector_up)" = 1
    check "served: 8 GPUs" test "$(grep -c '^nvidia_gpu_info{' "$WORK/metrics")" = 8
    check "served: node_textfile_scrape_error 0" test "$(metric "$WORK/metrics" node_textfile_scrape_error)" = 0
    check "served: XID counters for 8 GPUs (the journal is readable under the sandbox)" \
        test "$(grep -c '^nvidia_gpu_xid_errors_total{' "$WORK/metrics")" = 8
    check "the service keeps its state in StateDirectory= (/var/lib/nvidia-textfile-exporter)" \
        ct test -s /var/lib/nvidia-textfile-exporter/state
    check "healthy runs use the previous run's state (state_ok 1)" \
        test "$(metric "$WORK/metrics" nvidia_gpu_collector_state_ok)" = 1

    say "the Slurm hook, as slurmd runs it: a job's GPU counted by the sandboxed timer"
    hook() {
        ct env SLURM_JOB_ID="$1" SLURM_JOB_UID=0 SLURM_JOB_GPUS=1 \
            FAKE_NVML_SCENARIO=/usr/local/lib/nte-test/scenario.toml \
            /usr/bin/nvidia-textfile-exporter --nvml-lib "$2" --slurm-hook prolog
    }
    c_hook=$(cursor)
    check "hook: prolog exits 0" hook 42 /usr/local/lib/nte-test/libfake_nvml.so
    check "hook: the job's record in /run/nvidia-textfile-exporter/slurm, with its GPU's UUID" \
        ct grep -q '"uuid":"GPU-' /run/nvidia-textfile-exporter/slurm/job_42.json
    allocated() {
        scrape "$WORK/metrics" &&
            grep -q '^nvidia_gpu_task_allocated_seconds_total{gpu="1",.*slurm_job_id="42"' "$WORK/metrics"
    }
    check "served: the job's seconds allocated on GPU 1 (the unit reads /run)" wait_for 40 allocated
    check "hook: without NVML it still exits 0" hook 43 /nonexistent/libnvidia-ml.so.1
    check "hook: and says why in the journal" \
        wait_for 10 journal_has "$c_hook" 'job 43, Prolog: NVML could not be used'
    check "hook: and in the record" ct grep -q 'NVML could not be used' /run/nvidia-textfile-exporter/slurm/job_43.json

    say "no journal files (journald Storage=none): the xid collector reads /dev/kmsg"
    # The exporter reads the journal where /var/log/journal or /run/log/journal
    # holds journal files, else /dev/kmsg. Storage=volatile keeps files in
    # /run/log/journal, so only Storage=none leaves none; the directories are
    # moved aside meanwhile (journald keeps no file open with Storage=none).
    # nspawn gives the container no /dev/kmsg: it is made as on a host.
    ct mkdir -p /run/systemd/journald.conf.d
    ct sh -c 'printf "[Journal]\nStorage=none\n" >/run/systemd/journald.conf.d/nte-test.conf'
    ct systemctl restart systemd-journald
    for d in /var/log/journal /run/log/journal; do
        ct sh -c "[ ! -d $d ] || mv $d $d.nte-test"
    done
    ct sh -c '[ -e /dev/kmsg ] || mknod -m 0644 /dev/kmsg c 1 11'
    check "no journal files where the exporter looks" \
        test -z "$(ct find /var/log/journal /run/log/journal -name '*.journal*' 2>/dev/null)"
    # A line written from user space gets the user facility: read, never counted.
    marker="nte-test-$$-$(date +%s)"
    ct sh -c "echo '<3>NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=$marker' >/dev/kmsg"
    seq=$(kmsg_seq_of "$marker")
    # xid_run: one run of the service now; prints the state's source and
    # position, and the file's xid success.
    xid_run() {
        ct systemctl start nvidia-textfile-exporter.service 2>/dev/null
        ct cat /var/lib/nvidia-textfile-exporter/state | python3 -c '
import json, sys
xid = json.load(sys.stdin).get("xid", {})
print(xid.get("source") or "-", xid.get("kmsg_seq") or 0)'
        ct cat "$OUT" | awk '$1 == "nvidia_gpu_collector_success{collector=\"xid\"}" { print $2 }'
    }
    read -r source kseq success <<<"$(xid_run | tr '\n' ' ')"
    note "record $seq written; state: source $source, kmsg_seq $kseq; xid success $success"
    check "the xid collector read /dev/kmsg under the unit (source kmsg)" test "$source" = kmsg
    check "it read past the record written (kmsg_seq >= $seq)" test -n "$seq" -a "$kseq" -ge "${seq:-1}"
    check "xid success 1" test "$success" = 1
    check "the user-space line counts nothing" not ct grep -q 'code="79"' "$OUT"
    # Control: without the unit's DeviceAllow=/dev/kmsg the read is refused,
    # where this systemd enforces device ACLs (BPF device programs; a
    # container's may not, and then DevicePolicy=closed allows everything).
    if ct systemd-run --quiet --wait -p DevicePolicy=closed \
        dd if=/dev/kmsg of=/dev/null count=1 iflag=nonblock status=none 2>/dev/null; then
        note "device ACLs are not enforced in this container: DeviceAllow=/dev/kmsg not checked"
    else
        ct mkdir -p /run/systemd/system/nvidia-textfile-exporter.service.d
        ct sh -c 'printf "[Service]\nDeviceAllow=\nDeviceAllow=char-nvidia* rw\n" >/run/systemd/system/nvidia-textfile-exporter.service.d/control.conf'
        ct systemctl daemon-reload
        read -r _ _ success <<<"$(xid_run | tr '\n' ' ')"
        check "control: without DeviceAllow=/dev/kmsg the xid collector fails (success $success)" test "$success" = 0
        ct rm -r /run/systemd/system/nvidia-textfile-exporter.service.d
        ct systemctl daemon-reload
    fi
    # Control: without CAP_SYSLOG (kernel.dmesg_restrict=1 here) the read is refused.
    if [ "$(cat /proc/sys/kernel/dmesg_restrict)" = 1 ]; then
        ct mkdir -p /run/systemd/system/nvidia-textfile-exporter.service.d
        ct sh -c 'printf "[Service]\nCapabilityBoundingSet=\n" >/run/systemd/system/nvidia-textfile-exporter.service.d/control.conf'
        ct systemctl daemon-reload
        read -r _ _ success <<<"$(xid_run | tr '\n' ' ')"
        check "control: without CAP_SYSLOG the xid collector fails (success $success)" test "$success" = 0
        ct rm -r /run/systemd/system/nvidia-textfile-exporter.service.d
        ct systemctl daemon-reload
    fi
    ct rm /run/systemd/journald.conf.d/nte-test.conf
    for d in /var/log/journal /run/log/journal; do
        ct sh -c "[ ! -d $d.nte-test ] || { rm -rf $d; mv $d.nte-test $d; }"
    done
    ct systemctl restart systemd-journald

    # Control: the same healthy run without the filter is logged by systemd.
    ct mkdir -p /run/systemd/system/nvidia-textfile-exporter.service.d
    ct sh -c 'printf "[Service]\nLogLevelMax=debug\n" >/run/systemd/system/nvidia-textfile-exporter.service.d/control.conf'
    ct systemctl daemon-reload
    c_control=$(cursor)
    ct systemctl start nvidia-textfile-exporter.service
    check "control: without LogLevelMax=notice a healthy run logs 'Deactivated successfully'" \
        journal_has "$c_control" 'Deactivated successfully' -u nvidia-textfile-exporter.service
    ct rm -r /run/systemd/system/nvidia-textfile-exporter.service.d
    ct systemctl daemon-reload
fi

say "the textfile directory: shared mode kept, a deleted one reported"
ct systemctl stop nvidia-textfile-exporter.timer
ct chgrp prometheus "$TEXTFILE_DIR"
ct chmod 0775 "$TEXTFILE_DIR"
ct rm -f "$OUT"
ct systemctl start nvidia-textfile-exporter.service 2>/dev/null
check "owner and mode kept (root:prometheus 775)" \
    test "$(ct stat -c '%U:%G %a' "$TEXTFILE_DIR" 2>&1)" = "root:prometheus 775"
check "file written" ct test -s "$OUT"
ct chgrp root "$TEXTFILE_DIR"
ct chmod 0755 "$TEXTFILE_DIR"
c_missing=$(cursor)
ct rm -rf "$TEXTFILE_DIR"
ct systemctl start nvidia-textfile-exporter.service 2>/dev/null
publish_failed=$(exit_code PublishFailed) || die "no PublishFailed in --generate exit-codes"
check "run failed with exit status $publish_failed, not 226/NAMESPACE" \
    test "$(ct systemctl show -p ExecMainStatus --value nvidia-textfile-exporter.service)" = "$publish_failed"
check "failure logged: status=$publish_failed" \
    wait_for 10 journal_has "$c_missing" "status=$publish_failed/" -u nvidia-textfile-exporter.service
ct mkdir -m 0755 "$TEXTFILE_DIR"
ct systemctl start nvidia-textfile-exporter.service 2>/dev/null
check "file written once the directory is back" ct test -s "$OUT"

# ---------------------------------------------------------------------------
say "cron example instead of the timer"
ct systemctl disable --now nvidia-textfile-exporter.timer 2>/dev/null
ct cp /usr/share/doc/nvidia-textfile-exporter/examples/cron.d/nvidia-textfile-exporter /etc/cron.d/
ct rm -f "$OUT"
stamps=()
t0=$(date +%s)
while [ ${#stamps[@]} -lt 2 ] && [ "$(($(date +%s) - t0))" -lt 80 ]; do
    sleep 0.5
    stamp=$(ct cat "$OUT" 2>/dev/null | awk '$1 == "nvidia_gpu_collector_timestamp_seconds" { print $2 }')
    if [ -n "$stamp" ] && { [ ${#stamps[@]} -eq 0 ] || [ "$stamp" != "${stamps[-1]}" ]; }; then
        stamps+=("$stamp")
    fi
done
note "waited $(($(date +%s) - t0)) s"
check "cron ran the exporter twice" test ${#stamps[@]} -ge 2
check "cron runs 15 s +- 1 s apart" spacing_ok "${stamps[@]}"
check "cron's jobs are in the journal" \
    journal_has "$c_install" 'CMD (sleep 15; [ -x /usr/bin/nvidia-textfile-exporter ]' -t CRON
# End cron with its jobs (all in cron.service's cgroup) before removing.
ct rm /etc/cron.d/nvidia-textfile-exporter
ct systemctl kill --signal=KILL cron.service
ct systemctl enable --now nvidia-textfile-exporter.timer 2>/dev/null

# ---------------------------------------------------------------------------
say "dpkg -r"
check "timer active before" test "$(ct systemctl is-active nvidia-textfile-exporter.timer)" = active
check "dpkg -r" logged "$WORK/dpkg.log" ct dpkg -r nvidia-textfile-exporter
check "timer stopped" test "$(ct systemctl is-active nvidia-textfile-exporter.timer)" = inactive
check "service not running" test "$(ct systemctl is-active nvidia-textfile-exporter.service)" = inactive
# Removed but not purged, the timer's unit is gone: debhelper 13.11 no longer
# masks it (Debian bug #1021027).
check "timer unit gone (LoadState=not-found)" \
    test "$(ct systemctl show -P LoadState nvidia-textfile-exporter.timer)" = not-found
check "nvidia_gpu.prom gone" ct test ! -e "$OUT"
check "lock file gone" ct test ! -e "$TEXTFILE_DIR/.nvidia_gpu.prom.lock"
check "node_exporter scraped" scrape "$WORK/metrics"
check "node_exporter no longer serves nvidia metrics" not grep -q '^nvidia_gpu' "$WORK/metrics"

say "dpkg -P"
check "dpkg -P" logged "$WORK/dpkg.log" ct dpkg -P nvidia-textfile-exporter
check "dpkg -L fails" not quietly ct dpkg -L nvidia-textfile-exporter
check "/etc/default/nvidia-textfile-exporter gone" ct test ! -e /etc/default/nvidia-textfile-exporter
left=$(ct find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /mnt \) -prune \
    -o -name '*nvidia-textfile-exporter*' -print 2>/dev/null)
no_output "no file named *nvidia-textfile-exporter* left anywhere" printf '%s' "$left"
check "no unit known to systemd" \
    test -z "$(ct systemctl list-unit-files --no-legend 'nvidia-textfile-exporter*')"
check "textfile directory of prometheus-node-exporter kept" ct test -d "$TEXTFILE_DIR"

# ---------------------------------------------------------------------------
say "shutdown"
t0=$(date +%s)
ct systemctl poweroff
for _ in $(seq 150); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.2; done
check "container powered off" not kill -0 "$NSPAWN_PID" 2>/dev/null
wait "$NSPAWN_PID" 2>/dev/null
NSPAWN_PID=
note "shutdown: $(($(date +%s) - t0)) s"

finish "package systemd test ($SUITE)"
