//! The real binary against the fake NVML where the run's surroundings fail:
//! standard output or error that nobody reads, a state directory others can
//! write or another run holds, values the exporter must not invent, command
//! lines whose durations overflow.

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The fake NVML, built next to the binary by `cargo build -p fake-nvml`.
fn fake_nvml() -> PathBuf {
    let lib = Path::new(EXE).with_file_name("libfake_nvml.so");
    assert!(
        lib.exists(),
        "{} is missing: build it with `cargo build -p fake-nvml` (make test does)",
        lib.display()
    );
    lib
}

fn scenario(name: &str) -> PathBuf {
    Path::new(ROOT)
        .join("tests/scenarios")
        .join(format!("{name}.toml"))
}

/// The exporter on `scenario` (a path) with the state in `state` and XID
/// errors read from `journal` (an empty directory unless a test says more).
fn command(scenario: &Path, state: &Path, journal: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(EXE);
    command
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .arg("--state-dir")
        .arg(state)
        .arg("--journal-dir")
        .arg(journal)
        .args(args)
        .env("FAKE_NVML_SCENARIO", scenario)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

fn run(scenario_name: &str, state: &Path, args: &[&str]) -> Output {
    let journal = tempfile::tempdir().unwrap();
    command(&scenario(scenario_name), state, journal.path(), args)
        .output()
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

/// Waits for `child` until `limit`; kills it and fails if it is still running
/// then. Returns its status and how long it ran.
fn wait_at_most(mut child: Child, started: Instant, limit: Duration) -> (ExitStatus, Duration) {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, started.elapsed());
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the run was still going after {limit:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// How long after `--timeout` a run may still be seen: the hard stop's quarter
/// second plus the start and end of a process on a busy machine.
const GRACE: Duration = Duration::from_millis(750);

/// `--stdout` into a pipe nobody reads: the run ends at its deadline with
/// status 5 instead of waiting for a reader.
#[test]
fn a_run_whose_stdout_nobody_reads_ends_at_the_deadline() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let (_reader, writer) = full_pipe();
    let started = Instant::now();
    let child = command(
        &scenario("h100x8"),
        state.path(),
        journal.path(),
        &["--stdout", "--timeout", "1s", "--gpm-window", "0"],
    )
    .stdout(writer)
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let (status, took) = wait_at_most(child, started, Duration::from_secs(4));
    assert_eq!(status.code(), Some(5), "after {took:?}");
    assert!(took < Duration::from_secs(1) + GRACE, "took {took:?}");
}

/// A hung NVML while standard error (the journal's stream, say) takes nothing:
/// the hard stop still ends the run with status 5, without waiting to log.
#[test]
fn the_hard_stop_does_not_wait_for_a_blocked_stderr() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (_reader, writer) = full_pipe();
    let started = Instant::now();
    let child = command(
        &scenario("fault-system-hang"),
        state.path(),
        journal.path(),
        &[
            "--output-dir",
            out.path().to_str().unwrap(),
            "--timeout",
            "1s",
        ],
    )
    .stdout(Stdio::null())
    .stderr(writer)
    .spawn()
    .unwrap();
    let (status, took) = wait_at_most(child, started, Duration::from_secs(4));
    assert_eq!(status.code(), Some(5), "after {took:?}");
    assert!(took < Duration::from_secs(1) + GRACE, "took {took:?}");
}

fn state_ok(output: &Output) -> Option<f64> {
    let text = std::str::from_utf8(&output.stdout).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("nvidia_gpu_collector_state_ok "))
        .map(|value| value.parse().unwrap())
}

/// The state file's content and inode: a store replaces the file.
fn state_file(dir: &Path) -> (String, u64) {
    let path = dir.join("state");
    (
        fs::read_to_string(&path).unwrap(),
        fs::metadata(&path).unwrap().ino(),
    )
}

const WRITE_STATE: &[&str] = &["--stdout", "--write-state", "--gpm-window", "0"];

/// A state directory with a state this boot wrote, used by the next run.
fn trusted_state() -> (tempfile::TempDir, PathBuf) {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("state");
    let output = run("h100x8", &dir, WRITE_STATE);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
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
        assert_eq!(output.status.code(), Some(0), "{what}: {output:?}");
        assert_eq!(state_ok(&output), Some(0.0), "{what}");
        let stderr = String::from_utf8_lossy(&output.stderr);
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
    let started = Instant::now();
    let output = run(
        "h100x8",
        &dir,
        &[
            "--stdout",
            "--write-state",
            "--gpm-window",
            "0",
            "--timeout",
            "2s",
        ],
    );
    assert!(started.elapsed() < Duration::from_secs(2) + GRACE);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(state_ok(&output), Some(0.0));
    let stderr = String::from_utf8_lossy(&output.stderr);
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
    let text = fs::read_to_string(scenario("fault-read-error")).unwrap();
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
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let output = command(&path, state.path(), journal.path(), &["--stdout"])
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    let links: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("nvidia_gpu_nvlink_links{"))
        .collect();
    // GPU 0 answers for its two links; GPU 1's probes all fail; GPU 2's answer.
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(links.iter().all(|l| l.ends_with(" 2")), "{links:?}");
    assert!(!links.iter().any(|l| l.contains("gpu=\"1\"")), "{links:?}");
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
        let mut all = vec!["--stdout"];
        all.extend_from_slice(args);
        let output = run("h100x8", state.path(), &all);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

/// `nvidia_gpu_collector_duration_seconds` covers the run up to rendering,
/// the XID read after NVML included (here a journal of 30,000 kernel lines).
#[test]
fn the_duration_covers_the_reads_after_nvml() {
    let journal = tempfile::tempdir().unwrap();
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .replace('-', "");
    let mut export = String::new();
    for n in 1..=30_000u64 {
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={n}\n_BOOT_ID={boot_id}\n\
             _TRANSPORT=kernel\nSYSLOG_FACILITY=0\nPRIORITY=6\nMESSAGE=line {n}\n\n",
            1_700_000_000_000_000 + n
        ));
    }
    let mut remote = Command::new("/lib/systemd/systemd-journal-remote")
        .arg(format!(
            "--output={}",
            journal.path().join("system.journal").display()
        ))
        .arg("-")
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("systemd-journal-remote");
    remote
        .stdin
        .take()
        .unwrap()
        .write_all(export.as_bytes())
        .unwrap();
    assert!(remote.wait().unwrap().success());
    let state = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = command(
        &scenario("h100x8"),
        state.path(),
        journal.path(),
        &["--stdout", "--gpm-window", "0", "--timeout", "5s"],
    )
    .output()
    .unwrap();
    let took = started.elapsed().as_secs_f64();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("{prefix}: {text}"))
            .parse()
            .unwrap()
    };
    let duration = value("nvidia_gpu_collector_duration_seconds ");
    let xid = value("nvidia_gpu_collector_step_duration_seconds{collector=\"xid\"} ");
    assert!(xid > 0.02, "the XID step took only {xid} s");
    assert!(
        duration >= xid && duration <= took,
        "{duration} of {took}, the XID step {xid}"
    );
}
