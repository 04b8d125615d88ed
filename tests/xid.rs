//! The xid collector against real journal files (written by
//! systemd-journal-remote, package systemd-journal-remote): how it fails,
//! says so and recovers, how it keeps counting across vacuuming, and the
//! NVSwitch and fallen-off-the-bus lines it counts beside the XIDs. XID
//! counting itself is in `tests/cli/`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
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
    for absent in ["nvidia_gpu_xid_", "nvidia_gpu_collector_success", DURATION] {
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
