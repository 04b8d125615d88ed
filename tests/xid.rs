//! The xid collector against real journal files (written by
//! systemd-journal-remote, package systemd-journal-remote): how it fails,
//! says so and recovers. Counting itself is in `tests/cli.rs`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// systemd-journal-remote, which turns journal export text into journal files
/// the way journald writes them.
const JOURNAL_REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// GPU 0 of h100x8 is at 00000000:18:00.0.
const GPU0: &str =
    r#"nvidia_gpu_xid_errors_total{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"}"#;
const GPU0_79: &str = r#"nvidia_gpu_xid_errors_by_code_total{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10",code="79"}"#;
const XID79: &str =
    "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
const SUCCESS: &str = r#"nvidia_gpu_collector_success{collector="xid"}"#;
const DURATION: &str = r#"nvidia_gpu_collector_step_duration_seconds{collector="xid"}"#;

/// The fake NVML, built next to the binary by `cargo test --workspace`.
fn fake_nvml() -> PathBuf {
    let lib = Path::new(EXE).with_file_name("libfake_nvml.so");
    assert!(
        lib.exists(),
        "{} is missing: build it with `cargo build -p fake-nvml` (make test does)",
        lib.display()
    );
    lib
}

/// This boot's id as the journal writes it.
fn journal_boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .replace('-', "")
}

/// One kernel line of this boot in journal export format.
fn kernel_entry(monotonic: u64, message: &str) -> String {
    format!(
        "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={monotonic}\n_BOOT_ID={}\n\
         _TRANSPORT=kernel\nSYSLOG_FACILITY=0\nPRIORITY=4\n_HOSTNAME=gpu1\n\
         MESSAGE={message}\n\n",
        1_700_000_000_000_000 + monotonic,
        journal_boot_id()
    )
}

/// Writes `export` as the journal file `dir/name`.
fn write_journal(dir: &Path, name: &str, export: &str) {
    use std::io::Write;
    let mut child = Command::new(JOURNAL_REMOTE)
        .arg(format!("--output={}", dir.join(name).display()))
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("systemd-journal-remote (apt-get install systemd-journal-remote)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(export.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// One run of h100x8 with the state in `state` (read and stored) and the
/// journal files in `journal`, with `PATH` set to `path` if given: its exit
/// must be 0 (the xid collector never fails the run). Returns its text and
/// standard error.
fn run(state: &Path, journal: &Path, path: Option<&str>) -> (String, String) {
    run_with(state, journal, path, &[])
}

/// [`run`] with the further arguments `args`.
fn run_with(state: &Path, journal: &Path, path: Option<&str>, args: &[&str]) -> (String, String) {
    let mut command = Command::new(EXE);
    command
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .arg("--state-dir")
        .arg(state)
        .arg("--journal-dir")
        .arg(journal)
        .args(["--stdout", "--write-state"])
        .args(args)
        .env(
            "FAKE_NVML_SCENARIO",
            Path::new(ROOT).join("tests/scenarios/h100x8.toml"),
        )
        .env_remove("RUST_LOG");
    if let Some(path) = path {
        command.env("PATH", path);
    }
    let output = command.output().expect("run the exporter");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    (String::from_utf8(output.stdout).unwrap(), stderr)
}

/// The value of the one series `series` (name and labels exactly).
fn value(text: &str, series: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
        .collect();
    assert!(values.len() <= 1, "{series} written twice");
    values.first().copied()
}

/// Replaces the state file's host entries for which `edit` gives a new line
/// (`None` drops the line), keeping its end line's count right.
fn edit_state(state: &Path, edit: impl Fn(&str) -> Option<Option<String>>) {
    let path = state.join("state");
    let text = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with("end ")) {
        match edit(line) {
            Some(Some(new)) => lines.push(new),
            Some(None) => {}
            None => lines.push(line.to_owned()),
        }
    }
    let count = lines.len();
    lines.push(format!("end {count}"));
    let edited = lines.join("\n") + "\n";
    assert_ne!(edited, text, "the edit changed nothing");
    fs::write(&path, edited).unwrap();
}

/// A `journalctl` early in `PATH` is never run: the exporter runs as root and
/// starts journalctl by its absolute path.
#[test]
fn journalctl_is_never_looked_up_in_path() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    write_journal(journal.path(), "a.journal", &kernel_entry(1000, XID79));
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
    let (text, stderr) = run(state.path(), journal.path(), Some(&path));
    assert!(!ran.exists(), "the journalctl in PATH ran");
    assert_eq!(value(&text, GPU0), Some(1.0), "{stderr}");
    assert_eq!(value(&text, SUCCESS), Some(1.0));
}

/// journalctl failing (here: its directory is gone) is not the collector
/// switched off: the counts known stay, with success 0; and it recovers. A
/// collector switched off has neither counts nor success series.
#[test]
fn a_failing_journal_keeps_the_counts_and_says_so() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    write_journal(journal.path(), "a.journal", &kernel_entry(1000, XID79));
    let (text, _) = run(state.path(), journal.path(), None);
    assert_eq!(value(&text, GPU0), Some(1.0));
    assert_eq!(value(&text, SUCCESS), Some(1.0));
    let duration = value(&text, DURATION).expect("a duration");
    assert!((0.0..10.0).contains(&duration), "{duration}");

    let gone = journal.path().join("gone");
    let (text, stderr) = run(state.path(), &gone, None);
    assert_eq!(value(&text, SUCCESS), Some(0.0), "{text}");
    assert!(value(&text, DURATION).is_some());
    assert_eq!(value(&text, GPU0), Some(1.0), "counts vanished: {text}");
    assert_eq!(value(&text, GPU0_79), Some(1.0));
    assert!(stderr.contains("journalctl failed"), "{stderr}");

    write_journal(journal.path(), "b.journal", &kernel_entry(2000, XID79));
    let (text, _) = run(state.path(), journal.path(), None);
    assert_eq!(value(&text, GPU0), Some(2.0));
    assert_eq!(value(&text, SUCCESS), Some(1.0));

    let (text, _) = run_with(
        state.path(),
        journal.path(),
        None,
        &["--no-collector", "xid"],
    );
    assert!(text.contains("nvidia_gpu_up{"), "{text}");
    for absent in ["nvidia_gpu_xid_", "nvidia_gpu_collector_success", DURATION] {
        assert!(!text.contains(absent), "{absent} in {text}");
    }
}

/// A cursor journalctl refuses, with no time of its entry kept: the boot is
/// recounted from its start, exactly, instead of XID counting stopping for
/// the rest of the boot.
#[test]
fn a_refused_cursor_without_a_position_recounts_the_boot() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let export = kernel_entry(1000, XID79) + &kernel_entry(1001, "a line after it");
    write_journal(journal.path(), "a.journal", &export);
    assert_eq!(
        value(&run(state.path(), journal.path(), None).0, GPU0),
        Some(1.0)
    );
    edit_state(state.path(), |line| {
        if line.starts_with("host xid.cursor ") {
            Some(Some("host xid.cursor garbage".into()))
        } else if line.starts_with("host xid.monotonic ") {
            Some(None)
        } else {
            None
        }
    });
    write_journal(journal.path(), "b.journal", &kernel_entry(2000, XID79));
    let (text, stderr) = run(state.path(), journal.path(), None);
    assert_eq!(value(&text, GPU0), Some(2.0), "{stderr}");
    assert_eq!(value(&text, GPU0_79), Some(2.0));
    assert_eq!(value(&text, SUCCESS), Some(1.0));
    assert!(stderr.contains("recounting"), "{stderr}");
    // Back to normal: nothing counted twice, no further warning.
    let (text, stderr) = run(state.path(), journal.path(), None);
    assert_eq!(value(&text, GPU0), Some(2.0));
    assert_eq!(stderr, "");
}

/// A stored count no boot can reach (2^64 - 1, which would be published as
/// 1.8e19 and wrap to 0 on the next XID) is damage: ignored, said once, and the
/// count recounted from the journal.
#[test]
fn an_impossible_stored_count_is_recounted_not_published() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    write_journal(journal.path(), "a.journal", &kernel_entry(1000, XID79));
    assert_eq!(
        value(&run(state.path(), journal.path(), None).0, GPU0_79),
        Some(1.0)
    );
    edit_state(state.path(), |line| {
        let (key, _) = line.rsplit_once(' ')?;
        (key.starts_with("host xid.gpu.") && key.ends_with(".79"))
            .then(|| Some(format!("{key} {}", u64::MAX)))
    });
    write_journal(journal.path(), "b.journal", &kernel_entry(2000, XID79));
    let (text, stderr) = run(state.path(), journal.path(), None);
    assert_eq!(value(&text, GPU0_79), Some(2.0), "{text}");
    assert_eq!(value(&text, GPU0), Some(2.0));
    assert!(stderr.contains("impossible XID count"), "{stderr}");
    let (text, stderr) = run(state.path(), journal.path(), None);
    assert_eq!(value(&text, GPU0), Some(2.0));
    assert_eq!(stderr, "", "said once");
}
