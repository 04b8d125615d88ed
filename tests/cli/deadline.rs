//! The one deadline of a run, threads or one GPU after another.

use super::*;

#[test]
fn sequential_and_parallel_reads_render_the_same() {
    let parallel = exporter("h100x8", &["--stdout"]);
    let started = Instant::now();
    let sequential = exporter("h100x8", &["--stdout", "--sequential"]);
    // The GPM windows of all GPUs are open together: one window, not eight.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let strip = |o: &Outcome| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| {
                !l.starts_with("nvidia_gpu_collector_duration")
                    && !l.starts_with("nvidia_gpu_collector_step_duration_seconds{")
                    && !l.starts_with("nvidia_gpu_collector_timestamp")
                    && !l.starts_with("nvidia_gpu_gpm_window_seconds{")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&parallel), strip(&sequential));
}

/// The whole run keeps one deadline: a lock held for part of it and then a hung
/// NVML (in init: the timeout file; in a device call: that GPU down with reason
/// timeout, the others published) still give the file before `--timeout` (plus
/// a small margin for a loaded machine), and by then the process and
/// everything it started are gone.
#[test]
fn one_deadline_bounds_lock_wait_and_nvml_together() {
    for (scenario_name, stuck, whole_run) in [
        ("fault-init-hang", "stuck in nvmlInit_v2 (host)", true),
        (
            "fault-device-hang",
            "GPU 1 did not finish its reads by the deadline, stuck in nvmlDeviceGetPowerUsage",
            false,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let lock = fs::File::create(dir.path().join(".nvidia_gpu.prom.lock")).unwrap();
        lock.lock().unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1000));
            drop(lock);
        });
        let started = golden::now();
        let mut run = ex()
            .run(scenario_name)
            .output_dir(dir.path())
            .args(["--timeout", "2500ms"])
            .own_process_group()
            .finish()
            .unwrap();
        let ended = golden::now();
        releaser.join().unwrap();
        let at = format!("{scenario_name}: {run:?}");
        assert_eq!(run.code(), Some(5), "{at}");
        assert!(run.err().contains(stuck), "{at}");
        let failure = whole_run.then_some("timeout");
        let samples = check_file(&run.path(), failure).unwrap_or_else(|e| panic!("{at}: {e}"));
        if !whole_run {
            assert_eq!(
                test_support::checks::reasons(&samples),
                ["gpu1:timeout"],
                "{at}"
            );
        }
        let bound = 2.5 + 0.15;
        let t_file = run.t_file.expect("the file was replaced");
        assert!(t_file < bound, "{at}: file replaced after {t_file:.3} s");
        assert!(
            run.elapsed < bound,
            "{at}: exited after {:.3} s",
            run.elapsed
        );
        // The file's own time agrees: written by this run, within the bound.
        let written = fs::metadata(run.path()).unwrap().modified().unwrap();
        let written = written.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(
            (started..=started + bound).contains(&written) && written <= ended,
            "{at}: written {:.3} s after the start",
            written - started
        );
        // Nothing of the run is left: no thread stuck in NVML keeps a process.
        assert!(
            run.proc.group_gone(),
            "{at}: a process of the run is still there"
        );
    }
}

/// Sequential reads keep the one deadline too, in the worst case: the lock is
/// held until just before the GPUs' reading must end (0.09 s before, at 0.72
/// x --timeout), then a device call hangs. The file, GPU 1 down with reason timeout and its
/// call named, is in place by --timeout (0.1 s of slack for a loaded machine),
/// the process and all it started gone right after.
#[test]
fn sequential_reads_keep_the_one_deadline_after_a_long_lock_wait() {
    let (dir, state) = ex().seeded("fault-read-error", false);
    let lock = fs::File::open(dir.path().join(test_support::LOCK_FILE)).unwrap();
    lock.lock().unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1350));
        drop(lock);
    });
    let mut run = ex()
        .run("fault-device-hang")
        .output_dir(dir.path())
        .state_dir(state.path())
        .args(["--timeout", "2s", "--sequential"])
        .own_process_group()
        .finish()
        .unwrap();
    releaser.join().unwrap();
    let at = format!("{run:?}");
    assert_eq!(run.code(), Some(5), "{at}");
    assert!(
        run.err().contains(
            "GPU 1 did not finish its reads by the deadline, stuck in nvmlDeviceGetPowerUsage"
        ),
        "{at}"
    );
    // The state was seeded by a scenario with a third GPU, which this one
    // lacks: it is reported as no longer enumerated.
    let samples = check_file(&run.path(), None).unwrap_or_else(|e| panic!("{at}: {e}"));
    assert_eq!(
        test_support::checks::reasons(&samples),
        ["gpu1:timeout", "gpu2:not_enumerated"],
        "{at}"
    );
    assert_eq!(
        test_support::value(&samples, "nvidia_gpu_up", &[("gpu", "0")]),
        Some(1.0),
        "{at}"
    );
    let t_file = run.t_file.expect("the file was replaced");
    assert!(t_file <= 2.1, "{at}: file replaced after {t_file:.3} s");
    assert!(
        run.elapsed <= 2.3,
        "{at}: exited after {:.3} s",
        run.elapsed
    );
    assert!(run.proc.group_gone(), "{at}: a process of the run is left");
}
