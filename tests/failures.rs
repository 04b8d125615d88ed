//! The real binary against the fake NVML where the run's surroundings fail:
//! standard output or error that nobody reads, a state directory others can
//! write or another run holds, values the exporter must not invent, command
//! lines whose durations overflow.

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use test_support::journal::{journal_entry, write_journal};
use test_support::{select, Exporter, Outcome, Run};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The binary against the fake NVML, scenarios from tests/scenarios.
fn ex() -> &'static Exporter {
    static EXPORTER: OnceLock<Exporter> = OnceLock::new();
    EXPORTER.get_or_init(|| Exporter::beside(EXE, ROOT))
}

/// A `--stdout` run of `scenario_name` with the state in `state`.
fn run(scenario_name: &str, state: &Path, args: &[&str]) -> Outcome {
    ex().run(scenario_name)
        .stdout()
        .state_dir(state)
        .args(args)
        .finish()
        .expect("run the exporter")
}

/// A pipe whose buffer is already full: a write to it blocks until someone
/// reads, and nobody will. Returns the read end (keep it open) and the write end.
fn full_pipe() -> (std::io::PipeReader, std::io::PipeWriter) {
    let (reader, mut writer) = std::io::pipe().unwrap();
    let fd = writer.as_raw_fd();
    // SAFETY: fcntl on a pipe end this function owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert_eq!(
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) },
        0
    );
    let chunk = [b'x'; 4096];
    loop {
        match writer.write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the pipe: {e}"),
        }
    }
    // The exporter inherits the pipe as it would get it from a shell: blocking.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }, 0);
    (reader, writer)
}

/// How long after `--timeout` a run may still be seen: the hard stop's quarter
/// second plus the start and end of a process on a busy machine.
const GRACE: Duration = Duration::from_millis(750);

/// Runs `run`, a run with `--timeout 1s`, and asserts that it ends at its
/// deadline with status 5 (it is killed, and this fails, if still going after
/// 4 s).
fn ends_at_the_deadline(run: Run) {
    let output = run.limit(4.0).finish().expect("the run ended");
    let took = Duration::from_secs_f64(output.elapsed);
    assert_eq!(output.code(), Some(5), "after {took:?}");
    assert!(took < Duration::from_secs(1) + GRACE, "took {took:?}");
}

/// `--stdout` into a pipe nobody reads: the run ends at its deadline with
/// status 5 instead of waiting for a reader.
#[test]
fn a_run_whose_stdout_nobody_reads_ends_at_the_deadline() {
    let (_reader, writer) = full_pipe();
    ends_at_the_deadline(
        ex().run("h100x8")
            .stdout()
            .args(["--timeout", "1s", "--gpm-window", "0"])
            .stdio(writer, Stdio::null()),
    );
}

/// A hung NVML while standard error (the journal's stream, say) takes nothing:
/// the hard stop still ends the run with status 5, without waiting to log.
#[test]
fn the_hard_stop_does_not_wait_for_a_blocked_stderr() {
    let (_reader, writer) = full_pipe();
    ends_at_the_deadline(
        ex().run("fault-system-hang")
            .args(["--timeout", "1s"])
            .stdio(Stdio::null(), writer),
    );
}

/// A run that logs warnings (a failing getter) while standard error takes
/// nothing still publishes its file in time: log lines are dropped, not
/// waited for.
#[test]
fn a_blocked_stderr_costs_log_lines_not_the_file() {
    let (_reader, writer) = full_pipe();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = ex()
        .run("fault-read-error")
        .output_dir(dir.path())
        .args(["--timeout", "2s", "--gpm-window", "0"])
        .stdio(Stdio::null(), writer)
        .finish()
        .unwrap();
    assert_eq!(output.code(), Some(0), "{output:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let text = fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap();
    assert!(text.contains("nvidia_gpu_collector_up 1\n"), "{text}");
    assert!(text.contains("nvidia_gpu_collector_read_errors{"), "{text}");
}

/// The run's `nvidia_gpu_collector_state_ok`.
fn state_ok(output: &Outcome) -> Option<f64> {
    output.series("nvidia_gpu_collector_state_ok")
}

/// The state file's content and inode: a store replaces the file.
fn state_file(dir: &Path) -> (String, u64) {
    let path = dir.join("state");
    (
        fs::read_to_string(&path).unwrap(),
        fs::metadata(&path).unwrap().ino(),
    )
}

const WRITE_STATE: &[&str] = &["--write-state", "--gpm-window", "0"];

/// A state directory with a state this boot wrote, used by the next run.
fn trusted_state() -> (tempfile::TempDir, PathBuf) {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("state");
    let output = run("h100x8", &dir, WRITE_STATE);
    assert_eq!(output.code(), Some(0), "{output:?}");
    let output = run("h100x8", &dir, WRITE_STATE);
    assert_eq!(state_ok(&output), Some(1.0), "{output:?}");
    (parent, dir)
}

/// A state that others could have written is neither believed nor replaced:
/// the run starts afresh, says why, and reports the state as not ok.
#[test]
fn a_state_others_can_write_is_not_trusted() {
    let untrusted = |dir: &Path, what: &str| {
        let before = state_file(dir);
        let output = run("h100x8", dir, WRITE_STATE);
        assert_eq!(output.code(), Some(0), "{what}: {output:?}");
        assert_eq!(state_ok(&output), Some(0.0), "{what}");
        let stderr = output.err();
        assert!(stderr.contains("not trusted"), "{what}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{what}: said once: {stderr}");
        before
    };
    let set_mode = |path: &Path, mode: u32| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    };

    let (_parent, dir) = trusted_state();
    set_mode(&dir, 0o777);
    let before = untrusted(&dir, "world-writable directory");
    assert_eq!(state_file(&dir), before, "stored into it");
    set_mode(&dir, 0o1777);
    untrusted(&dir, "sticky world-writable directory");
    set_mode(&dir, 0o775);
    untrusted(&dir, "group-writable directory");
    set_mode(&dir, 0o755);
    set_mode(&dir.join("state"), 0o664);
    untrusted(&dir, "group-writable file");
    set_mode(&dir.join("state"), 0o644);
    let output = run("h100x8", &dir, WRITE_STATE);
    assert_eq!(state_ok(&output), Some(1.0), "{output:?}");

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // A root run and a file that belongs to nobody.
        let path = std::ffi::CString::new(dir.join("state").into_os_string().into_encoded_bytes())
            .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, 65534) }, 0);
        untrusted(&dir, "file of another user");
    }
}

/// Two writers of one state directory take turns: while another run holds the
/// state's lock, a run does not use or replace the state, and says so.
#[test]
fn a_run_does_not_use_a_state_another_run_holds() {
    let (_parent, dir) = trusted_state();
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".state.lock"))
        .unwrap();
    lock.lock().unwrap();
    let before = state_file(&dir);
    let output = run(
        "h100x8",
        &dir,
        &[WRITE_STATE, &["--timeout", "2s"]].concat(),
    );
    let took = Duration::from_secs_f64(output.elapsed);
    assert!(took < Duration::from_secs(2) + GRACE, "took {took:?}");
    assert_eq!(output.code(), Some(0), "{output:?}");
    assert_eq!(state_ok(&output), Some(0.0));
    let stderr = output.err();
    assert!(stderr.contains("another run"), "{stderr}");
    assert_eq!(state_file(&dir), before, "stored while another run held it");
    drop(lock);
    let output = run("h100x8", &dir, WRITE_STATE);
    assert_eq!(state_ok(&output), Some(1.0), "{output:?}");
}

/// Where every NVLink state probe fails, the number of links is unknown: no
/// `nvidia_gpu_nvlink_links` series rather than the number of probes.
#[test]
fn a_link_count_comes_only_from_links_that_answered() {
    let text = fs::read_to_string(ex().scenario("fault-read-error")).unwrap();
    let failing = r#"errors = { nvmlDeviceGetPowerUsage = "UNKNOWN" }"#;
    assert!(text.contains(failing), "the scenario changed");
    let derived = tempfile::tempdir().unwrap();
    let path = derived.path().join("nvlink-state-unknown.toml");
    fs::write(
        &path,
        text.replace(
            failing,
            r#"errors = { nvmlDeviceGetNvLinkState = "UNKNOWN" }"#,
        ),
    )
    .unwrap();
    let output = ex()
        .run(path.to_str().unwrap())
        .stdout()
        .finish()
        .expect("run the exporter");
    let samples = output.samples();
    let links = select(&samples, "nvidia_gpu_nvlink_links", &[]);
    // GPU 0 answers for its two links; GPU 1's probes all fail; GPU 2's answer.
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(links.iter().all(|(_, v)| *v == 2.0), "{links:?}");
    assert!(
        !links.iter().any(|(s, _)| s.label("gpu") == Some("1")),
        "{links:?}"
    );
}

/// Durations that overflow when added to are usage errors, not panics.
#[test]
fn huge_durations_are_usage_errors() {
    let state = tempfile::tempdir().unwrap();
    for args in [
        &["--gpm-window", "18446744073709551615s 900ms"][..],
        &["--gpm-window", "18446744073709551615s"],
        &[
            "--gpm-window",
            "18446744073709551615s",
            "--no-collector",
            "gpm",
        ],
        &["--timeout", "18446744073709551615s"],
        &["--timeout", "18446744073709551615s 999999999ns"],
    ] {
        let output = run("h100x8", state.path(), args);
        let stderr = output.err();
        assert_eq!(output.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

/// `nvidia_gpu_collector_duration_seconds` covers the run up to rendering,
/// the XID read after NVML included (here a journal of 30,000 kernel lines).
#[test]
fn the_duration_covers_the_reads_after_nvml() {
    let journal = tempfile::tempdir().unwrap();
    let export: String = (1..=30_000u64)
        .map(|n| journal_entry(n, "kernel", &format!("line {n}")))
        .collect();
    write_journal(journal.path(), "system.journal", &export);
    let output = ex()
        .run("h100x8")
        .stdout()
        .journal_dir(journal.path())
        .args(["--gpm-window", "0", "--timeout", "5s"])
        .finish()
        .expect("run the exporter");
    let took = output.elapsed;
    assert_eq!(output.code(), Some(0), "{output:?}");
    let value = |series: &str| -> f64 {
        output
            .series(series)
            .unwrap_or_else(|| panic!("{series}: {}", output.text()))
    };
    let duration = value("nvidia_gpu_collector_duration_seconds");
    let xid = value(r#"nvidia_gpu_collector_step_duration_seconds{collector="xid"}"#);
    assert!(xid > 0.02, "the XID step took only {xid} s");
    assert!(
        duration >= xid && duration <= took,
        "{duration} of {took}, the XID step {xid}"
    );
}
