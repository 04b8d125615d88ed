//! The xid collector against real journal files (written by
//! systemd-journal-remote, package systemd-journal-remote): how it fails,
//! says so and recovers, how it keeps counting across vacuuming, and the
//! NVSwitch and fallen-off-the-bus lines it counts beside the XIDs; what a
//! user forges counts nothing, from the journal and from the kernel's own
//! /dev/kmsg. XID counting itself is in `tests/cli/`.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use tempfile::TempDir;

use test_support::journal::{
    journal_entry, journal_entry_binary, write_journal, write_journal_bytes, XID79,
};
use test_support::{promtool, Exporter, Outcome};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// GPU 0 of h100x8 is at 00000000:18:00.0.
const GPU0: &str =
    r#"nvidia_gpu_xid_errors_total{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"}"#;
const GPU0_79: &str = r#"nvidia_gpu_xid_errors_by_code_total{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10",code="79"}"#;
const SUCCESS: &str = r#"nvidia_gpu_collector_success{collector="xid"}"#;
const DURATION: &str = r#"nvidia_gpu_collector_step_duration_seconds{collector="xid"}"#;

/// The binary against the fake NVML, scenarios from tests/scenarios.
fn ex() -> &'static Exporter {
    static EXPORTER: OnceLock<Exporter> = OnceLock::new();
    EXPORTER.get_or_init(|| Exporter::beside(EXE, ROOT))
}

/// One run of h100x8 with the state in `state` (read and stored) and the
/// journal files in `journal`, with `PATH` set to `path` if given: its exit
/// must be 0 (the xid collector never fails the run).
fn run(state: &Path, journal: &Path, path: Option<&str>) -> Outcome {
    run_with(state, journal, path, &[])
}

/// [`run`] with the further arguments `args`.
fn run_with(state: &Path, journal: &Path, path: Option<&str>, args: &[&str]) -> Outcome {
    let mut run = ex()
        .run("h100x8")
        .stdout()
        .state_dir(state)
        .journal_dir(journal)
        .arg("--write-state")
        .args(args);
    if let Some(path) = path {
        run = run.env("PATH", path);
    }
    let output = run.finish().expect("run the exporter");
    output.assert_status(0);
    output
}

/// A fresh state directory and a journal directory holding the file
/// `a.journal` with `export`.
fn state_and_journal(export: &str) -> (TempDir, TempDir) {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    write_journal(journal.path(), "a.journal", export);
    (state, journal)
}

/// Adds the journal file `name` with an Xid 79 of GPU 0 at `monotonic`.
fn add_xid79(journal: &Path, name: &str, monotonic: u64) {
    write_journal(journal, name, &journal_entry(monotonic, "kernel", XID79));
}

/// Changes the xid collector's part of the state file (its `xid` object)
/// with `edit`.
fn edit_state(state: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = state.join("state");
    let mut file: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    let before = file.clone();
    edit(&mut file["xid"]);
    assert_ne!(file, before, "the edit changed nothing");
    fs::write(&path, file.to_string()).unwrap();
}

/// A `journalctl` early in `PATH` is never run: the exporter runs as root and
/// starts journalctl by its absolute path.
#[test]
fn journalctl_is_never_looked_up_in_path() {
    let (state, journal) = state_and_journal(&journal_entry(1000, "kernel", XID79));
    let planted = tempfile::tempdir().unwrap();
    let ran = planted.path().join("ran");
    let script = planted.path().join("journalctl");
    fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", ran.display()),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", planted.path().display());
    let out = run(state.path(), journal.path(), Some(&path));
    assert!(!ran.exists(), "the journalctl in PATH ran");
    assert_eq!(out.series(GPU0), Some(1.0), "{}", out.err());
    assert_eq!(out.series(SUCCESS), Some(1.0));
}

/// journalctl failing (here: its directory is gone) is not the collector
/// switched off: the counts known stay, with success 0; and it recovers. A
/// collector switched off has neither counts nor success series.
#[test]
fn a_failing_journal_keeps_the_counts_and_says_so() {
    let (state, journal) = state_and_journal(&journal_entry(1000, "kernel", XID79));
    let out = run(state.path(), journal.path(), None);
    assert_eq!(out.series(GPU0), Some(1.0));
    assert_eq!(out.series(SUCCESS), Some(1.0));
    let duration = out.series(DURATION).expect("a duration");
    assert!((0.0..10.0).contains(&duration), "{duration}");

    let gone = journal.path().join("gone");
    let out = run(state.path(), &gone, None);
    let (text, stderr) = (out.text(), out.err());
    assert_eq!(out.series(SUCCESS), Some(0.0), "{text}");
    assert!(out.series(DURATION).is_some());
    assert_eq!(out.series(GPU0), Some(1.0), "counts vanished: {text}");
    assert_eq!(out.series(GPU0_79), Some(1.0));
    assert!(stderr.contains("journalctl failed"), "{stderr}");

    add_xid79(journal.path(), "b.journal", 2000);
    let out = run(state.path(), journal.path(), None);
    assert_eq!(out.series(GPU0), Some(2.0));
    assert_eq!(out.series(SUCCESS), Some(1.0));

    let out = run_with(
        state.path(),
        journal.path(),
        None,
        &["--no-collector", "xid"],
    );
    let samples = out.samples();
    let text = out.text();
    assert!(samples.keys().any(|s| s.name == "nvidia_gpu_up"), "{text}");
    for absent in ["nvidia_gpu_xid_", "{collector=\"xid\"}"] {
        assert!(!text.contains(absent), "{absent} in {text}");
    }
}

/// A cursor journalctl refuses, with no time of its entry kept: the boot is
/// recounted from its start, exactly, instead of XID counting stopping for
/// the rest of the boot.
#[test]
fn a_refused_cursor_without_a_position_recounts_the_boot() {
    let export =
        journal_entry(1000, "kernel", XID79) + &journal_entry(1001, "kernel", "a line after it");
    let (state, journal) = state_and_journal(&export);
    assert_eq!(
        run(state.path(), journal.path(), None).series(GPU0),
        Some(1.0)
    );
    edit_state(state.path(), |xid| {
        xid["cursor"] = "garbage".into();
        xid["monotonic"] = serde_json::Value::Null;
    });
    add_xid79(journal.path(), "b.journal", 2000);
    let out = run(state.path(), journal.path(), None);
    let stderr = out.err();
    assert_eq!(out.series(GPU0), Some(2.0), "{stderr}");
    assert_eq!(out.series(GPU0_79), Some(2.0));
    assert_eq!(out.series(SUCCESS), Some(1.0));
    assert!(stderr.contains("recounting"), "{stderr}");
    // Back to normal: nothing counted twice, no further warning.
    let out = run(state.path(), journal.path(), None);
    assert_eq!(out.series(GPU0), Some(2.0));
    assert_eq!(out.err(), "");
}

/// A stored count no boot can reach (2^64 - 1, which would be published as
/// 1.8e19 and wrap to 0 on the next XID) is damage: ignored, said once, and the
/// count recounted from the journal.
#[test]
fn an_impossible_stored_count_is_recounted_not_published() {
    let (state, journal) = state_and_journal(&journal_entry(1000, "kernel", XID79));
    assert_eq!(
        run(state.path(), journal.path(), None).series(GPU0_79),
        Some(1.0)
    );
    edit_state(state.path(), |xid| {
        // One record, `[{"xid": {"id": {"gpu": uuid}, "code": 79}}, count]`.
        let records = xid["totals"].as_array_mut().unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0][0]["xid"]["code"], 79);
        records[0][1] = u64::MAX.into();
    });
    add_xid79(journal.path(), "b.journal", 2000);
    let out = run(state.path(), journal.path(), None);
    let stderr = out.err();
    assert_eq!(out.series(GPU0_79), Some(2.0), "{}", out.text());
    assert_eq!(out.series(GPU0), Some(2.0));
    assert!(stderr.contains("impossible XID count"), "{stderr}");
    let out = run(state.path(), journal.path(), None);
    assert_eq!(out.series(GPU0), Some(2.0));
    assert_eq!(out.err(), "", "said once");
}

/// journald vacuums the archived file that holds the cursor's entry while an
/// older file of this boot stays. `journalctl --after-cursor` then seeks to
/// the cursor's place, lands on the next entry and skips it as if it were the
/// cursor's own (systemd 252): the next XID was lost, with success 1.
#[test]
fn the_first_xid_after_a_vacuumed_cursor_entry_is_counted() {
    let (state, journal) = state_and_journal(&journal_entry(1000, "kernel", XID79));
    let after = journal_entry(
        1500,
        "kernel",
        "nvidia-nvlink: Nvlink Core is being initialized",
    );
    write_journal(journal.path(), "b.journal", &after);
    assert_eq!(
        run(state.path(), journal.path(), None).series(GPU0),
        Some(1.0)
    );

    fs::remove_file(journal.path().join("b.journal")).unwrap();
    add_xid79(journal.path(), "c.journal", 3000);
    let out = run(state.path(), journal.path(), None);
    assert_eq!(
        out.series(GPU0),
        Some(2.0),
        "the XID after the vacuumed cursor: {}",
        out.err()
    );
    assert_eq!(out.series(SUCCESS), Some(1.0));
    assert_eq!(out.err(), "");
    // Nothing counted twice: not the older file's XID, not the cursor's own.
    assert_eq!(
        run(state.path(), journal.path(), None).series(GPU0),
        Some(2.0)
    );
    // Rotation: a new file beside the cursor's.
    add_xid79(journal.path(), "d.journal", 4000);
    assert_eq!(
        run(state.path(), journal.path(), None).series(GPU0),
        Some(3.0)
    );
}

/// An SXid as driver 570.195.03 logs it (NVIDIA/nvtrust#124): a `Data` line,
/// the line with its severity, a `Severity 0 Engine instance` line.
fn sxid_22013(monotonic: u64) -> String {
    let at = "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, ";
    [
        "Data {0x0000002b, 0x0000002b, 0x00000000, 0x0000002b, 0x80005302, 0x00000000}",
        "Non-fatal, Link 44 Minion Link DLREQ interrupt",
        "Severity 0 Engine instance 44 Sub-engine instance 00",
    ]
    .iter()
    .enumerate()
    .map(|(i, line)| journal_entry(monotonic + i as u64, "kernel", &format!("{at}{line}")))
    .collect()
}

const SXID_22013: &str = r#"nvidia_gpu_nvswitch_sxid_errors_total{switch="3",pci_bus_id="00000000:04:00",code="22013",sxid_severity="non_fatal"}"#;
const SXID_20034: &str = r#"nvidia_gpu_nvswitch_sxid_errors_total{switch="0",pci_bus_id="00000000:05:00",code="20034",sxid_severity="fatal"}"#;
const GPU0_FALLEN: &str =
    r#"nvidia_gpu_fallen_off_bus_total{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"}"#;
const B3_FALLEN: &str =
    r#"nvidia_gpu_fallen_off_bus_unattributed_total{pci_bus_id="00000000:B3:00"}"#;

/// SXids by switch, bus id, code and severity, and GPUs fallen off the bus
/// without an Xid line (NVIDIA/NVSentinel#155: a GPU that fell off at probe
/// time, one record of three lines, never enumerated), counted exactly between
/// runs like XIDs; the same lines from user space count nothing.
#[test]
fn sxids_and_gpus_fallen_off_the_bus_count_exactly_between_runs() {
    let fatal = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up";
    let fallen = "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.";
    let probe = "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this \
                 system has\nNVRM: fallen off the bus and is not responding to commands.";
    let mut export = sxid_22013(1000).into_bytes();
    for (at, transport, line) in [
        (1010, "kernel", fatal),
        (1011, "syslog", fatal),
        (1020, "kernel", fallen),
        (1021, "syslog", fallen),
    ] {
        export.extend(journal_entry(at, transport, line).into_bytes());
    }
    export.extend(journal_entry_binary(1030, probe));
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    write_journal_bytes(journal.path(), "a.journal", &export);
    let out = run(state.path(), journal.path(), None);
    let counts = |out: &Outcome| {
        [SXID_22013, SXID_20034, GPU0_FALLEN, B3_FALLEN, GPU0].map(|s| out.series(s))
    };
    assert_eq!(
        counts(&out),
        [1.0, 1.0, 1.0, 1.0, 0.0].map(Some),
        "{}",
        out.text()
    );
    let other_gpu = r#"nvidia_gpu_fallen_off_bus_total{gpu="1",uuid="GPU-"#;
    assert!(
        out.text().contains(other_gpu),
        "every GPU has its count from 0"
    );
    assert_eq!(out.series(SUCCESS), Some(1.0));
    if let Err(said) = promtool(out.text().as_bytes()) {
        panic!("promtool: {said}");
    }
    assert_eq!(
        counts(&run(state.path(), journal.path(), None)),
        counts(&out),
        "nothing new"
    );

    let mut more = sxid_22013(2000);
    more += &journal_entry(2010, "kernel", fallen);
    write_journal(journal.path(), "b.journal", &more);
    let out = run(state.path(), journal.path(), None);
    assert_eq!(
        counts(&out),
        [2.0, 1.0, 2.0, 1.0, 0.0].map(Some),
        "{}",
        out.text()
    );
}

/// A state and journal after a run that counted a real SXid and Xid 79.
fn real_counts() -> (TempDir, TempDir, Outcome) {
    let mut export = sxid_22013(1000).into_bytes();
    export.extend(journal_entry(1010, "kernel", XID79).into_bytes());
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    write_journal_bytes(journal.path(), "a.journal", &export);
    let before = run(state.path(), journal.path(), None);
    (state, journal, before)
}

/// What the kernel logs when a program segfaults (show_signal_msg): its
/// process name (`comm`, set with prctl) and its file's name come first and
/// last, both the user's choice.
fn segfault(comm: &str, file: &str) -> String {
    format!(
        "{comm}[18231]: segfault at 0 ip 00005577b91e817a sp 00007ffc3836a380 error 6 in \
         {file}[117a,5577b91e8000+1000] likely on CPU 1 (core 1, socket 0)"
    )
}

/// The driver's API mismatch record before R575: `version` is the client's
/// (up to 63 bytes, line feeds included).
fn api_mismatch(version: &str) -> String {
    format!(
        "NVRM: API mismatch: the client has the version {version}, but\nNVRM: this kernel \
         module has the version 570.86.15.  Please\nNVRM: make sure that this kernel module \
         and all NVIDIA driver\nNVRM: components have the same version."
    )
}

/// The counted series of a run (XIDs, SXids, fallen off the bus) as lines.
fn counted(out: &Outcome) -> Vec<String> {
    let text = out.text();
    let families = [
        "nvidia_gpu_xid_",
        "nvidia_gpu_fallen_off_bus",
        "nvidia_gpu_nvswitch_sxid",
    ];
    text.lines()
        .filter(|line| families.iter().any(|family| line.starts_with(family)))
        .map(str::to_owned)
        .collect()
}

/// The totals the state keeps.
fn stored_totals(state: &Path) -> serde_json::Value {
    let text = fs::read_to_string(state.join("state")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["xid"]["totals"].clone()
}

/// Kernel lines that quote what a user chose, in the journal as the kernel
/// logged them (kernel transport, facility 0): a segfault whose process and
/// file name spell a GPU falling off the bus (of a GPU here, and of a bus id
/// no GPU has), and API mismatch records whose client version holds a line
/// of the driver's. None counts, adds a series or enters the state; a real
/// line after them does count.
#[test]
fn lines_a_user_forged_count_nothing_and_add_no_series() {
    let (state, journal, before) = real_counts();
    assert_eq!(before.series(GPU0), Some(1.0), "{}", before.text());
    let totals = stored_totals(state.path());

    let mut forged = Vec::new();
    for (at, line) in [
        (
            2000,
            segfault("NVRM: x", "GPU 0000:18:00.0 has fallen off the bus"),
        ),
        (
            2001,
            segfault("NVRM: x", "GPU 0000:e7:00.0 has fallen off the bus"),
        ),
        (2002, segfault("NVRM: Xid (PCI:", "0000:18:00): 79, x")),
    ] {
        forged.extend(journal_entry(at, "kernel", &line).into_bytes());
    }
    for (at, version) in [
        (
            2010,
            "1\nNVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
        ),
        (2011, "1\nNVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, x"),
        (
            2012,
            "1\nnvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, x",
        ),
    ] {
        forged.extend(journal_entry_binary(at, &api_mismatch(version)));
    }
    write_journal_bytes(journal.path(), "b.journal", &forged);
    let after = run(state.path(), journal.path(), None);
    assert_eq!(after.series(SUCCESS), Some(1.0), "{}", after.err());
    assert_eq!(counted(&after), counted(&before), "{}", after.text());
    assert_eq!(stored_totals(state.path()), totals);

    add_xid79(journal.path(), "c.journal", 3000);
    assert_eq!(
        run(state.path(), journal.path(), None).series(GPU0),
        Some(2.0)
    );
}

/// 100,000 forged lines between two runs, each naming another bus id, shed
/// no real count (the state's bound on series is never reached) and leave
/// the state usable.
#[test]
fn a_flood_of_forged_lines_sheds_no_real_count() {
    let (state, journal, before) = real_counts();
    assert_eq!(before.series(SXID_22013), Some(1.0), "{}", before.text());

    let mut flood = String::new();
    for i in 0..100_000u64 {
        let (domain, bus) = (i >> 8, i & 0xff);
        let file = format!("GPU {domain:04x}:{bus:02x}:00.0 has fallen off the bus");
        flood += &journal_entry(2000 + i, "kernel", &segfault("NVRM: x", &file));
    }
    write_journal(journal.path(), "b.journal", &flood);
    // A run may stop short of the end (its deadline): the next goes on.
    let mut after = run(state.path(), journal.path(), None);
    for _ in 0..3 {
        if after.series(SUCCESS) == Some(1.0) {
            break;
        }
        after = run(state.path(), journal.path(), None);
    }
    assert_eq!(after.series(SUCCESS), Some(1.0), "{}", after.err());
    assert_eq!(counted(&after), counted(&before));
    assert_eq!(after.series("nvidia_gpu_collector_state_ok"), Some(1.0));

    write_journal(journal.path(), "c.journal", &sxid_22013(200_000));
    let last = run(state.path(), journal.path(), None);
    assert_eq!(last.series(SXID_22013), Some(2.0), "{}", last.text());
}

/// The attack itself, through the kernel: a program run as `nobody`, named
/// `NVRM: x` and from a file named `GPU 0000:18:00.0 has fallen off the bus`
/// (GPU 0's bus), dereferences NULL; the kernel logs it with the kernel
/// facility. The exporter reads /dev/kmsg (no journal in its mount
/// namespace), moves past the line and counts nothing. Needs root, `cc`,
/// unshare and setpriv (util-linux), as `make test` has.
#[test]
fn a_segfault_in_the_kernels_own_log_counts_nothing() {
    assert_eq!(
        fs::metadata("/proc/self").unwrap().uid(),
        0,
        "needs root (to read /dev/kmsg and unshare a mount namespace): run it as make test does"
    );
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let source = dir.path().join("segv.c");
    fs::write(
        &source,
        "#include <sys/prctl.h>\nint main(int c, char **v) { prctl(PR_SET_NAME, v[1], 0, 0, 0); \
         *(volatile int *)0 = c; return 0; }\n",
    )
    .unwrap();
    let program = dir.path().join("GPU 0000:18:00.0 has fallen off the bus");
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&program)
        .arg(&source)
        .status();
    assert!(cc.expect("cc (gcc)").success());

    let state = tempfile::tempdir().unwrap();
    let kmsg_run = || {
        let hide = "for d in /var/log/journal /run/log/journal; do \
                    [ -d \"$d\" ] && mount -t tmpfs none \"$d\"; done; exec \"$@\"";
        let out = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                hide,
                "sh",
            ])
            .arg(EXE)
            .arg("--nvml-lib")
            .arg(&ex().lib)
            .args(["--stdout", "--write-state", "--state-dir"])
            .arg(state.path())
            .env("FAKE_NVML_SCENARIO", ex().scenario("h100x8"))
            .env_remove("RUST_LOG")
            .output()
            .expect("unshare (util-linux)");
        let text = String::from_utf8(out.stdout).unwrap();
        let stored = fs::read_to_string(state.path().join("state")).unwrap();
        let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
        (text, stored["xid"].clone())
    };
    let (_, first) = kmsg_run();
    assert_eq!(first["source"], "kmsg", "{first}");

    let crashed = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&program)
        .arg("NVRM: x")
        .status()
        .expect("setpriv (util-linux)");
    assert_eq!(crashed.signal(), Some(11), "the program segfaults");
    let seq = kmsg_records()
        .iter()
        .rev()
        .find(|(_, text)| text.starts_with("NVRM: x[") && text.contains(" has fallen off the bus["))
        .map(|(seq, _)| *seq)
        .expect("the kernel logged the segfault (/proc/sys/debug/exception-trace 1)");

    let (text, xid) = kmsg_run();
    assert!(xid["kmsg_seq"].as_u64() >= Some(seq), "read past it: {xid}");
    assert_eq!(xid["totals"], first["totals"], "{xid}");
    let gpu0 = r#"nvidia_gpu_fallen_off_bus_total{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"} 0"#;
    assert!(text.lines().any(|line| line == gpu0), "{text}");
    assert!(!text.contains("_unattributed_total{"), "{text}");
}

/// The records in /dev/kmsg now: sequence number and message.
fn kmsg_records() -> Vec<(u64, String)> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("/dev/kmsg");
    let mut records = Vec::new();
    let mut buffer = vec![0u8; 1 << 14];
    loop {
        let n = match file.read(&mut buffer) {
            Ok(n) if n > 0 => n,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => continue,
            _ => return records,
        };
        let record = String::from_utf8_lossy(&buffer[..n]).into_owned();
        let Some((header, message)) = record.split_once(';') else {
            continue;
        };
        if let Some(seq) = header.split(',').nth(1).and_then(|s| s.parse().ok()) {
            records.push((seq, message.lines().next().unwrap_or_default().to_owned()));
        }
    }
}

/// Driver-shaped lines of 4,100 new series (a bus id each) after a real SXid
/// and XID: the first series stay counted and go on counting; the lines past
/// the state's bound of 4,096 series are refused, said in the log and by the
/// xid collector's success 0 (kernel lines a user can shape, such as a
/// cgroup name the kernel prints alone, cannot displace a real count).
#[test]
fn new_series_past_the_bound_never_displace_the_first() {
    let (state, journal, before) = real_counts();
    assert_eq!(before.series(SXID_22013), Some(1.0), "{}", before.text());

    let mut flood = String::new();
    for i in 0..4100u64 {
        let line = format!(
            "NVRM: Xid (PCI:{:04x}:{:02x}:00): 13, x",
            1 + (i >> 8),
            i & 0xff
        );
        flood += &journal_entry(2000 + i, "kernel", &line);
    }
    write_journal(journal.path(), "b.journal", &flood);
    let after = run(state.path(), journal.path(), None);
    assert_eq!(after.series(SXID_22013), Some(1.0), "{}", after.err());
    assert_eq!(after.series(GPU0_79), Some(1.0));
    assert_eq!(after.series(SUCCESS), Some(0.0));
    assert!(
        after.err().contains("beyond the bound of 4096 series"),
        "{}",
        after.err()
    );

    let mut more = sxid_22013(10_000);
    more += &journal_entry(10_010, "kernel", XID79);
    write_journal(journal.path(), "c.journal", &more);
    let last = run(state.path(), journal.path(), None);
    assert_eq!(last.series(SXID_22013), Some(2.0), "{}", last.text());
    assert_eq!(last.series(GPU0_79), Some(2.0));
    assert_eq!(last.series(SUCCESS), Some(1.0), "{}", last.err());
}
