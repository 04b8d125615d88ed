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
use test_support::{lookup, parsed, select, Exporter, Outcome, Run};

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
    let samples = parsed(&text);
    assert_eq!(
        lookup(&samples, "nvidia_gpu_collector_up"),
        Some(1.0),
        "{text}"
    );
    let errors = select(&samples, "nvidia_gpu_collector_read_errors", &[]);
    assert!(!errors.is_empty(), "{text}");
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

// ---- GPUs that hang, slow starts and reads, renumbered GPUs -------------------

/// h100x8's text with `lines` added: `(Some(i), line)` to GPU `i`'s table,
/// `(None, line)` to `[system]`.
fn h100x8_with(lines: &[(Option<usize>, &str)]) -> String {
    let text = fs::read_to_string(ex().scenario("h100x8")).unwrap();
    let mut starts: Vec<usize> = text.match_indices("[[gpu]]\n").map(|(i, _)| i).collect();
    starts.push(text.len());
    let mut out = text[..starts[0]].to_owned();
    for (index, bounds) in starts.windows(2).enumerate() {
        let table = &text[bounds[0]..bounds[1]];
        let (header, rest) = table.split_at("[[gpu]]\n".len());
        out.push_str(header);
        for (_, line) in lines.iter().filter(|(gpu, _)| *gpu == Some(index)) {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(rest);
    }
    for (_, line) in lines.iter().filter(|(gpu, _)| gpu.is_none()) {
        out = out.replacen("[system]\n", &format!("[system]\n{line}\n"), 1);
    }
    out
}

/// `text` written as scenario `name` in `dir`; its path.
fn scenario_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    fs::write(&path, text).unwrap();
    path
}

/// Four GPUs of eight, each stuck in a different call (two in their identity:
/// the handle and the UUID; two in their readings), cost only themselves: at
/// the deadline the other four are published in full, each stuck GPU is down
/// with reason `timeout` and its call named on stderr, the run exits 5 by its
/// `--timeout`, and no thread stuck in the driver keeps the process.
#[test]
fn a_hung_gpu_costs_only_itself() {
    let stuck = [
        (0, "nvmlDeviceGetUUID"),
        (1, "nvmlDeviceGetHandleByIndex_v2"),
        (2, "nvmlDeviceGetTemperatureV"),
        (3, "nvmlDeviceGetPowerUsage"),
    ];
    let hangs: Vec<String> = stuck
        .iter()
        .map(|(_, call)| format!("hang = [\"{call}\"]"))
        .collect();
    let lines: Vec<(Option<usize>, &str)> = stuck
        .iter()
        .zip(&hangs)
        .map(|((gpu, _), line)| (Some(*gpu), line.as_str()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let hung = scenario_file(dir.path(), "hung", &h100x8_with(&lines));
    let healthy = ex()
        .run("h100x8")
        .args(["--timeout", "2s"])
        .finish()
        .unwrap();
    healthy.assert_status(0);
    let mut run = ex()
        .run(hung.to_str().unwrap())
        .args(["--timeout", "2s"])
        .own_process_group()
        .limit(5.0)
        .finish()
        .unwrap();
    let at = format!("{run:?}");
    run.assert_status(5);
    assert!(
        run.elapsed < 2.0 + GRACE.as_secs_f64(),
        "{at}: {:.3} s",
        run.elapsed
    );
    let samples = test_support::checks::check_file(&run.path(), None).unwrap();
    let (gpus, _) = test_support::checks::gpus(&samples);
    let (expected, _) = test_support::checks::gpus(&healthy.samples());
    // In full, but for the GPM window, which the wait for the stuck
    // identities shortened.
    let window = test_support::Series::new("nvidia_gpu_gpm_window_seconds", &[]);
    for gpu in 4..8 {
        let gpu = gpu.to_string();
        let (mut got, mut want) = (gpus[&gpu].clone(), expected[&gpu].clone());
        assert!(
            got.remove(&window).is_some() && want.remove(&window).is_some(),
            "{at}"
        );
        test_support::checks::compare(&got, &want, &gpu).unwrap();
    }
    for (gpu, call) in stuck {
        let labels = [("gpu", gpu.to_string())];
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            test_support::value(&samples, "nvidia_gpu_up", &labels),
            Some(0.0),
            "GPU {gpu}: {at}"
        );
        let mut timeout = labels.clone();
        timeout.push(("reason", "timeout"));
        assert_eq!(
            test_support::value(&samples, "nvidia_gpu_down_reason", &timeout),
            Some(1.0),
            "GPU {gpu}: {at}"
        );
        // Its up and reason, and the kernel log's counters (XIDs, fallen off the bus).
        let readings: Vec<&str> = gpus[&gpu.to_string()]
            .keys()
            .map(|s| s.name.as_str())
            .filter(|name| {
                !name.starts_with("nvidia_gpu_xid_") && *name != "nvidia_gpu_fallen_off_bus_total"
            })
            .collect();
        assert_eq!(
            readings,
            ["nvidia_gpu_down_reason", "nvidia_gpu_up"],
            "GPU {gpu}: {at}"
        );
        let said = format!("GPU {gpu} did not finish");
        let line = run
            .err()
            .lines()
            .find(|l| l.contains(&said))
            .map(String::from);
        assert!(
            line.as_ref()
                .is_some_and(|l| l.contains(&format!("stuck in {call}"))),
            "GPU {gpu}, {call}: {line:?}: {at}"
        );
    }
    // GPUs stuck after their identity keep it.
    for gpu in ["2", "3"] {
        assert_eq!(
            test_support::checks::uuid_of(&samples, gpu),
            test_support::checks::uuid_of(&healthy.samples(), gpu),
            "{at}"
        );
    }
    assert!(run.proc.group_gone(), "{at}: a process of the run is left");
}

/// A run's file under `--timeout 14s --gpm-window auto` (the unit's), its
/// samples; asserts a full file (every GPU up) within the timeout.
fn unit_run(scenario: &Path, state: &Path, extra: &[&str], at: &str) -> test_support::Samples {
    let mut args = vec!["--timeout", "14s", "--gpm-window", "auto"];
    args.extend_from_slice(extra);
    let run = ex()
        .run(scenario.to_str().unwrap())
        .state_dir(state)
        .args(&args)
        .limit(20.0)
        .finish()
        .unwrap();
    let at = format!("{at}: {run:?}");
    assert_eq!(run.code(), Some(0), "{at}");
    assert!(run.elapsed < 14.0, "{at}");
    let samples = test_support::checks::check_file(&run.path(), None).unwrap();
    let up: Vec<f64> = select(&samples, "nvidia_gpu_up", &[])
        .iter()
        .map(|(_, v)| *v)
        .collect();
    assert!(
        !up.is_empty() && up.iter().all(|v| *v == 1.0),
        "{at}: {up:?}"
    );
    let windows = select(&samples, "nvidia_gpu_gpm_window_seconds", &[]);
    assert_eq!(windows.len(), up.len(), "{at}: GPM of every GPU");
    samples
}

/// 64 GPUs: h100x8's first GPU 64 times, under UUIDs and bus ids of their
/// own, each GPU's temperature read taking `read_ms`.
fn sixty_four_gpus(read_ms: u32) -> String {
    gpus_like_the_first(
        64,
        &format!("delays_ms = {{ nvmlDeviceGetTemperatureV = {read_ms} }}"),
    )
}

/// With the unit's `--timeout 14s --gpm-window auto`, reads that outgrow
/// their estimate (64 GPUs one after another, 50 ms each and then 90 ms) and
/// an NVML that starts late (1.5 s, without persistence mode; four GPUs whose
/// reads take 400 ms) publish in full run after run: the window is what
/// gives, never the run.
#[test]
fn the_auto_window_leaves_the_reads_room() {
    let dir = tempfile::tempdir().unwrap();
    let slow_start = h100x8_with(&[
        (None, "init_delay_ms = 1500"),
        (Some(0), "delays_ms = { nvmlDeviceGetTemperatureV = 400 }"),
        (Some(1), "delays_ms = { nvmlDeviceGetTemperatureV = 400 }"),
        (Some(2), "delays_ms = { nvmlDeviceGetTemperatureV = 400 }"),
        (Some(3), "delays_ms = { nvmlDeviceGetTemperatureV = 400 }"),
    ]);
    let slow_start = scenario_file(dir.path(), "slow-start", &slow_start);
    let faster = scenario_file(dir.path(), "reads-50ms", &sixty_four_gpus(50));
    let slower = scenario_file(dir.path(), "reads-90ms", &sixty_four_gpus(90));
    std::thread::scope(|s| {
        s.spawn(|| {
            let state = tempfile::tempdir().unwrap();
            for run in 0..2 {
                unit_run(
                    &slow_start,
                    state.path(),
                    &[],
                    &format!("slow start, run {run}"),
                );
            }
        });
        s.spawn(|| {
            let state = tempfile::tempdir().unwrap();
            unit_run(&faster, state.path(), &["--sequential"], "64 GPUs, 50 ms");
            unit_run(&slower, state.path(), &["--sequential"], "64 GPUs, 90 ms");
        });
    });
}

/// A GPU renumbered into the index of a GPU that left, whose UUID and PCI
/// reads fail (or that is lost), is not published under the departed GPU's
/// UUID (nor, up, continuing its totals): it cannot be told, so it has no
/// UUID, and nothing is said to have left while it cannot be told.
#[test]
fn a_renumbered_gpu_never_takes_a_departed_gpus_uuid() {
    let text = fs::read_to_string(ex().scenario("h100x8")).unwrap();
    let starts: Vec<usize> = text.match_indices("[[gpu]]\n").map(|(i, _)| i).collect();
    // GPU 0 left; the old GPU 1 is index 0 now.
    let without_first = format!("{}{}", &text[..starts[0]], &text[starts[1]..]);
    let dir = tempfile::tempdir().unwrap();
    for (name, fault) in [
        (
            "unreadable",
            "errors = { nvmlDeviceGetUUID = \"UNKNOWN\", nvmlDeviceGetPciInfo_v3 = \"UNKNOWN\" }",
        ),
        ("lost", "lost = true"),
    ] {
        let state = tempfile::tempdir().unwrap();
        let before = run(
            "h100x8",
            state.path(),
            &["--write-state", "--gpm-window", "0"],
        );
        before.assert_status(0);
        let departed = test_support::checks::uuid_of(&before.samples(), "0").unwrap();
        let renumbered = without_first.replacen("[[gpu]]\n", &format!("[[gpu]]\n{fault}\n"), 1);
        let file = scenario_file(dir.path(), name, &renumbered);
        let after = run(
            file.to_str().unwrap(),
            state.path(),
            &["--write-state", "--gpm-window", "0"],
        );
        let at = format!("{name}: {after:?}");
        let samples = after.samples();
        let uuid = test_support::checks::uuid_of(&samples, "0");
        assert!(uuid.is_some(), "{at}");
        assert_ne!(uuid.as_deref(), Some(departed.as_str()), "{at}");
        assert!(
            !samples
                .keys()
                .any(|s| s.label("uuid") == Some(departed.as_str())),
            "{at}: a series under the departed GPU's UUID"
        );
    }
}

/// Standard error a pipe of another user (a run under setpriv): the run,
/// which may not reopen it through /proc, still says why it exits 7 (an
/// output directory it may not write). Needs root to change users; skipped
/// otherwise.
#[test]
fn error_lines_reach_a_stderr_the_run_cannot_reopen() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run the exporter as another user");
        return;
    }
    let (out, state, journal) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    // The output directory is root's (0755): the other user may not write it.
    fs::set_permissions(out.path(), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(state.path(), Some(65534), Some(65534)).unwrap();
    fs::set_permissions(journal.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let output = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(EXE)
        .arg("--nvml-lib")
        .arg(&ex().lib)
        .arg("--output-dir")
        .arg(out.path())
        .arg("--state-dir")
        .arg(state.path())
        .arg("--journal-dir")
        .arg(journal.path())
        .args(["--timeout", "3s", "--gpm-window", "0"])
        .env("FAKE_NVML_SCENARIO", ex().scenario("geforce"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(7), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("nvidia-textfile-exporter: error: ")
                && l.contains(&out.path().display().to_string())),
        "{stderr}"
    );
}

// ---- Timing that learns: slow calls cost one run at most ---------------------

/// `count` runs of `scenario` in a row with the state in `state`, the fake
/// clock 15 s further each run (the unit's timer), `args` added; their exit
/// statuses, each run's stderr kept for the message.
fn runs_in_a_row(scenario: &Path, state: &Path, args: &[&str], count: u64) -> Vec<Outcome> {
    const T0: u64 = 1_717_200_000_000_000;
    (1..=count)
        .map(|run| {
            ex().run(scenario.to_str().unwrap())
                .stdout()
                .state_dir(state)
                .args(["--write-state", "--gpm-window", "auto"])
                .args(args)
                .env("FAKE_NVML_CLOCK_US", (T0 + run * 15_000_000).to_string())
                .limit(10.0)
                .finish()
                .unwrap()
        })
        .collect()
}

/// The exit statuses of `runs`, and what they said, for a failure message.
fn statuses(runs: &[Outcome]) -> (Vec<Option<i32>>, String) {
    let codes = runs.iter().map(Outcome::code).collect();
    let said = runs
        .iter()
        .map(|r| r.err())
        .collect::<Vec<_>>()
        .join("\n---\n");
    (codes, said)
}

/// A GPM call slower than the time kept after the window for the second
/// sample and the metrics (600 ms, `--timeout 3s`) times out once at most:
/// the time the windows took to close is remembered, and the next runs keep
/// it after the window. Before, it timed out about three runs in four.
#[test]
fn a_slow_window_close_times_out_once_at_most() {
    let dir = tempfile::tempdir().unwrap();
    for call in ["nvmlGpmSampleGet", "nvmlGpmMetricsGet"] {
        let line = format!("delays_ms = {{ {call} = 600 }}");
        let slow = scenario_file(dir.path(), call, &h100x8_with(&[(Some(0), &line)]));
        let state = tempfile::tempdir().unwrap();
        let runs = runs_in_a_row(&slow, state.path(), &["--timeout", "3s"], 4);
        let (codes, said) = statuses(&runs);
        assert_eq!(codes[1..], [Some(0); 3], "{call}: {codes:?}\n{said}");
        let samples = runs[3].samples();
        assert!(
            test_support::value(&samples, "nvidia_gpu_gpm_window_seconds", &[("gpu", "0")])
                .is_some_and(|seconds| seconds >= 0.1),
            "{call}: GPU 0's GPM window\n{said}"
        );
    }
}

/// Reads that grow past their estimate (GPU 0's field value reads taking
/// 1.5 s, five calls of 300 ms; `--timeout 3s`) cost one timed-out run: the
/// next run gives them all the time it has, and measures them. Before, the
/// cut duration the state kept grew by half a run, and two runs timed out.
#[test]
fn reads_cut_by_the_deadline_recover_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let line = "delays_ms = { nvmlDeviceGetFieldValues = 300 }";
    let slow = scenario_file(dir.path(), "slow-fields", &h100x8_with(&[(Some(0), line)]));
    let state = tempfile::tempdir().unwrap();
    let runs = runs_in_a_row(&slow, state.path(), &["--timeout", "3s"], 3);
    let (codes, said) = statuses(&runs);
    assert_eq!(codes, [Some(5), Some(0), Some(0)], "{said}");
}

/// `count` GPUs: h100x8's first GPU `count` times, under UUIDs and bus ids
/// of their own, with `line` added to each.
fn gpus_like_the_first(count: u32, line: &str) -> String {
    let text = fs::read_to_string(ex().scenario("h100x8")).unwrap();
    let starts: Vec<usize> = text.match_indices("[[gpu]]\n").map(|(i, _)| i).collect();
    let block = &text[starts[0]..starts[1]];
    let uuid_line = block.lines().find(|l| l.starts_with("uuid = ")).unwrap();
    let pci_line = block.lines().find(|l| l.starts_with("pci = ")).unwrap();
    let mut out = text[..starts[0]].to_owned();
    for gpu in 0..count {
        let block = block
            .replace(
                uuid_line,
                &format!("uuid = \"GPU-00000000-0000-4000-8000-0000000000{gpu:02x}\""),
            )
            .replace(
                pci_line,
                &pci_line
                    .replace(
                        "00000000:18:00.0",
                        &format!("00000000:{:02X}:00.0", gpu + 1),
                    )
                    .replace("bus = 0x18", &format!("bus = {}", gpu + 1)),
            )
            .replacen("[[gpu]]\n", &format!("[[gpu]]\n{line}\n"), 1);
        out.push_str(&block);
    }
    out
}

/// Identities that are slow but answer get the time they need where the run
/// has it: one GPU's UUID taking 1 s, and 16 GPUs read one after another
/// whose UUIDs take 60 ms each (`--timeout 4s`: 3.2 s to read), are
/// published in full, not down as stuck in `nvmlDeviceGetUUID`.
#[test]
fn slow_identities_that_answer_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let one = scenario_file(
        dir.path(),
        "slow-uuid",
        &h100x8_with(&[(Some(0), "delays_ms = { nvmlDeviceGetUUID = 1000 }")]),
    );
    let many = scenario_file(
        dir.path(),
        "sixteen-slow-uuids",
        &gpus_like_the_first(16, "delays_ms = { nvmlDeviceGetUUID = 60 }"),
    );
    for (scenario, extra) in [(&one, None), (&many, Some("--sequential"))] {
        let mut args = vec!["--timeout", "4s", "--gpm-window", "auto"];
        args.extend(extra);
        let run = ex()
            .run(scenario.to_str().unwrap())
            .stdout()
            .args(&args)
            .limit(8.0)
            .finish()
            .unwrap();
        let at = format!("{run:?}");
        assert_eq!(run.code(), Some(0), "{at}");
        let samples = run.samples();
        let up = select(&samples, "nvidia_gpu_up", &[]);
        assert!(
            !up.is_empty()
                && up
                    .iter()
                    .all(|(series, v)| *v == 1.0
                        && series.label("uuid").is_some_and(|u| !u.is_empty())),
            "{at}: {up:?}"
        );
    }
}

/// With `--sequential` and GPM on, a GPU stuck in its readings (GPU 5, in
/// its temperature) costs itself and the GPUs after it, as `--help` says:
/// the GPUs before it are published. Before, every GPU's windows closed only
/// after every GPU's reads, so all eight were down.
#[test]
fn a_stuck_gpu_read_in_sequence_costs_only_those_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let hung = scenario_file(
        dir.path(),
        "hung-5",
        &h100x8_with(&[(Some(5), "hang = [\"nvmlDeviceGetTemperatureV\"]")]),
    );
    let mut run = ex()
        .run(hung.to_str().unwrap())
        .stdout()
        .args(["--timeout", "3s", "--sequential"])
        .own_process_group()
        .limit(6.0)
        .finish()
        .unwrap();
    let at = format!("{run:?}");
    assert_eq!(run.code(), Some(5), "{at}");
    let samples = run.samples();
    for index in 0..8 {
        let gpu = index.to_string();
        let up = test_support::value(&samples, "nvidia_gpu_up", &[("gpu", &gpu)]);
        let window =
            test_support::value(&samples, "nvidia_gpu_gpm_window_seconds", &[("gpu", &gpu)]);
        if index < 5 {
            assert_eq!((up, window.is_some()), (Some(1.0), true), "GPU {gpu}: {at}");
        } else {
            let timeout = [("gpu", gpu.as_str()), ("reason", "timeout")];
            assert_eq!(up, Some(0.0), "GPU {gpu}: {at}");
            assert_eq!(
                test_support::value(&samples, "nvidia_gpu_down_reason", &timeout),
                Some(1.0),
                "GPU {gpu}: {at}"
            );
        }
    }
    assert!(run.proc.group_gone(), "{at}: a process of the run is left");
}
