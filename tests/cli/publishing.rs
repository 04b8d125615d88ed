//! Where the file goes and how it is replaced: permissions, the lock, special files, overlapping runs, stderr.

use super::*;

#[test]
fn publishes_world_readable_file_and_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let output = exporter("h100x8", &["--output-dir", out]);
    assert_eq!(
        output.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.stderr.is_empty() && output.stdout.is_empty());
    let file = dir.path().join("nvidia_gpu.prom");
    assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o644);
    let text = fs::read_to_string(&file).unwrap();
    assert_eq!(lookup(&parsed(&text), "nvidia_gpu_collector_up"), Some(1.0));
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".nvidia_gpu.prom.lock", "nvidia_gpu.prom"]);
}

#[test]
fn missing_or_unwritable_output_directory_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent");
    let output = exporter("h100x8", &["--output-dir", missing.to_str().unwrap()]);
    assert_eq!(output.code(), Some(7));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("nvidia-textfile-exporter: error: "),
        "{stderr}"
    );
    assert!(stderr.contains(missing.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!missing.exists(), "the directory was created");
    // procfs refuses new files even to root.
    let output = exporter("h100x8", &["--output-dir", "/proc"]);
    assert_eq!(output.code(), Some(7));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/proc"));
}

#[test]
fn busy_lock_writes_busy_unless_the_holder_published_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let lock = fs::File::create(dir.path().join(".nvidia_gpu.prom.lock")).unwrap();
    lock.lock().unwrap();

    // A holder that never publishes: the file must say busy.
    let output = exporter("h100x8", &["--output-dir", out, "--timeout", "300ms"]);
    assert_eq!(output.code(), Some(6));
    let text = fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap();
    let samples = parsed(&text);
    assert_eq!(
        lookup(&samples, r#"nvidia_gpu_collector_error{reason="busy"}"#),
        Some(1.0),
        "{text}"
    );
    assert!(device_series(&samples).is_empty());

    // A holder that publishes while we wait: its fresh file stays.
    let child = Command::new(EXE)
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .args(["--output-dir", out, "--timeout", "2s"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("FAKE_NVML_SCENARIO", scenario("h100x8"))
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Published as every run publishes: a new file renamed into place.
    fs::write(dir.path().join("fresh.tmp"), "fresh 1\n").unwrap();
    fs::rename(
        dir.path().join("fresh.tmp"),
        dir.path().join("nvidia_gpu.prom"),
    )
    .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(6));
    assert_eq!(
        fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap(),
        "fresh 1\n"
    );
    drop(lock);

    // Once the lock is free, runs succeed again.
    assert_eq!(exporter("h100x8", &["--output-dir", out]).code(), Some(0));
}

/// A FIFO where the lock or the output file belongs is refused at once with a
/// message (the lock) or replaced (the output), never waited on.
#[test]
fn special_files_never_hang_a_run() {
    let mkfifo = |path: &Path| {
        let status = Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success());
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    mkfifo(&dir.path().join(".nvidia_gpu.prom.lock"));
    let started = Instant::now();
    let output = exporter(
        "h100x8",
        &["--output-dir", out, "--timeout", "3s", "--gpm-window", "0"],
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(output.code(), Some(7));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("is not a regular file"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    mkfifo(&dir.path().join("nvidia_gpu.prom"));
    let started = Instant::now();
    let output = exporter(
        "h100x8",
        &["--output-dir", out, "--timeout", "3s", "--gpm-window", "0"],
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(output.code(), Some(0), "{output:?}");
    assert!(fs::metadata(dir.path().join("nvidia_gpu.prom"))
        .unwrap()
        .is_file());
}

/// `--stdout` into a pipe closed early ends quietly with the run's status.
#[test]
fn stdout_into_a_closed_pipe_exits_quietly() {
    let mut child = Command::new(EXE)
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .args(["--stdout", "--state-dir", "/nonexistent/state"])
        .env("FAKE_NVML_SCENARIO", scenario("h100x8"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// When stderr is the journal stream systemd announced, every line carries its
/// syslog priority and not the program name; otherwise lines name the program.
#[test]
fn journal_lines_carry_their_priority() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let file = fs::File::create(&log).unwrap();
    let stream = format!(
        "{}:{}",
        file.metadata().unwrap().dev(),
        file.metadata().unwrap().ino()
    );
    let state = dir.path().join("state");
    let status = Command::new(EXE)
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--stdout"])
        .arg("--state-dir")
        .arg(&state)
        .env("JOURNAL_STREAM", &stream)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(3));
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.starts_with("<3>cannot use NVML (library_not_found)"),
        "{text}"
    );
    assert!(text.lines().all(|l| l.starts_with("<3>")), "{text}");
    assert!(!text.contains("nvidia-textfile-exporter:"), "{text}");
    // Another stream (stderr redirected elsewhere): plain lines.
    let output = Command::new(EXE)
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--stdout"])
        .arg("--state-dir")
        .arg(&state)
        .env("JOURNAL_STREAM", &stream)
        .output()
        .unwrap();
    let text = String::from_utf8(output.stderr).unwrap();
    assert!(
        text.starts_with("nvidia-textfile-exporter: error: cannot use NVML"),
        "{text}"
    );
}

/// A directory where the file belongs: exit 7 with one line naming the rename
/// and the path; the directory and what it holds stay, no temporary file is
/// left.
#[test]
fn a_directory_in_the_files_place_fails_cleanly() {
    let (dir, state) = ex().seeded("geforce", false);
    let target = dir.path().join(test_support::OUT_FILE);
    fs::remove_file(&target).unwrap();
    fs::create_dir(&target).unwrap();
    fs::write(target.join("keep"), "old").unwrap();
    let run = ex()
        .run("geforce")
        .output_dir(dir.path())
        .state_dir(state.path())
        .finish()
        .unwrap();
    assert_eq!(run.code(), Some(7), "{run:?}");
    let stderr = run.err();
    let line = stderr.strip_suffix('\n').unwrap_or(&stderr);
    assert!(!line.contains('\n'), "not one line: {stderr}");
    assert!(
        line.starts_with("nvidia-textfile-exporter: error: "),
        "{stderr}"
    );
    assert!(line.contains("rename"), "{stderr}");
    assert!(line.contains(&target.display().to_string()), "{stderr}");
    assert_eq!(fs::read_to_string(target.join("keep")).unwrap(), "old");
    assert_eq!(test_support::temp_files(dir.path()), Vec::<String>::new());
}

/// 100 runs, 20 at a time, on one directory while a reader reads the file
/// without pause: each run exits 0 or 6 (busy: it says so, or that the holder
/// published meanwhile), a successful one silently; every read is a complete
/// render or a complete busy file, and so is the file left at the end.
#[test]
fn overlapping_runs_only_ever_show_complete_files() {
    let complete = test_support::checks::keys(&ex().baseline("fault-slow"));
    let busy = {
        let dir = tempfile::tempdir().unwrap();
        let lock = fs::File::create(dir.path().join(test_support::LOCK_FILE)).unwrap();
        lock.lock().unwrap();
        let run = ex()
            .run("fault-slow")
            .output_dir(dir.path())
            .args(["--timeout", "100ms"])
            .finish()
            .unwrap();
        run.assert_status(6);
        test_support::checks::keys(&check_file(&run.path(), Some("busy")).unwrap())
    };
    let (dir, state) = ex().seeded("fault-slow", false);
    let file = dir.path().join(test_support::OUT_FILE);
    let reader = test_support::Reader::start(
        file.clone(),
        vec![("complete".into(), complete), ("busy".into(), busy.clone())],
    );
    let start = || {
        ex().run("fault-slow")
            .output_dir(dir.path())
            .state_dir(state.path())
            // Time to read under the load of 20 runs at once on two cores:
            // a run that timed out would write a (complete) timeout file.
            .args(["--timeout", "3s"])
            .start()
            .unwrap()
    };
    let t0 = Instant::now();
    let (mut running, mut started, mut outcomes) = (Vec::new(), 0, Vec::new());
    while started < 100 || !running.is_empty() {
        while running.len() < 20 && started < 100 {
            running.push(start());
            started += 1;
        }
        let mut i = 0;
        while i < running.len() {
            if running[i].proc.poll().is_some() {
                outcomes.push(running.swap_remove(i).wait().unwrap());
            } else {
                i += 1;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the runs took over 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = reader.finish().unwrap();
    stats.check().unwrap();
    let mut succeeded = 0;
    for run in &outcomes {
        let stderr = run.err();
        match run.code() {
            Some(0) => {
                assert!(stderr.is_empty(), "a successful run wrote {stderr}");
                succeeded += 1;
            }
            Some(6) => assert!(
                stderr.contains("reason=\"busy\"") || stderr.contains("published meanwhile"),
                "a busy run without a busy message: {stderr}"
            ),
            _ => panic!("{run:?}"),
        }
    }
    assert!(succeeded >= 1, "no run succeeded");
    let last = parsed(&fs::read_to_string(&file).unwrap());
    let is_busy = test_support::checks::keys(&last) == busy;
    check_file(&file, is_busy.then_some("busy")).unwrap();
}
