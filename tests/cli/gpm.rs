//! GPM metrics: the window, its faults and its pause file.

use super::*;

#[test]
fn gpm_faults_leave_out_only_what_failed() {
    let state = tempfile::tempdir().unwrap();
    let args = ["--stdout", "--write-state", "--gpm-window", "200ms"];
    let output = ex().run_args("gpm-faults", state.path(), &args, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.code(), Some(0), "{stderr}");
    let text = String::from_utf8(output.stdout).unwrap();
    assert_promtool("gpm-faults", &text);
    let samples = parsed(&text);
    let of = |family: &str, gpu: &str| select(&samples, family, &[("gpu", gpu)]);
    let one = |family: &str, gpu: &str| value(&samples, family, &[("gpu", gpu)]);
    // GPU 0: NaN, 130 % and -1 % are dropped and counted; the rest is kept.
    assert!(of("nvidia_gpu_sm_active_ratio", "0").is_empty());
    assert!(of("nvidia_gpu_dram_active_ratio", "0").is_empty());
    let fp32 = Series::new(
        "nvidia_gpu_pipe_active_ratio",
        &[
            ("gpu", "0"),
            ("uuid", "GPU-0a000000-0000-4000-8000-000000000000"),
            ("pipe", "fp32"),
        ],
    );
    assert_eq!(of("nvidia_gpu_pipe_active_ratio", "0"), [(&fp32, 0.005)]);
    assert_eq!(of("nvidia_gpu_sm_occupancy_ratio", "0").len(), 1);
    assert_eq!(one("nvidia_gpu_collector_read_errors", "0"), Some(3.0));
    for impossible in ["NaN", "130", "-1"] {
        assert!(
            stderr.contains(&format!("read {impossible}, which is impossible")),
            "{stderr}"
        );
    }
    // GPU 1: a profiler holds the counters; GPU 2: no permission. Left out with
    // their reason, not counted as read errors, one line each.
    for (gpu, reason) in [("1", "counters_in_use"), ("2", "no_permission")] {
        let uuid = format!(
            "GPU-0{}000000-0000-4000-8000-000000000000",
            ["a", "b", "c"][gpu.parse::<usize>().unwrap()]
        );
        let unavailable = Series::new(
            "nvidia_gpu_gpm_unavailable",
            &[("gpu", gpu), ("uuid", &uuid), ("reason", reason)],
        );
        assert_eq!(of("nvidia_gpu_gpm_unavailable", gpu), [(&unavailable, 1.0)]);
        assert!(of("nvidia_gpu_graphics_engine_active_ratio", gpu).is_empty());
        assert!(of("nvidia_gpu_gpm_window_seconds", gpu).is_empty());
        assert_eq!(one("nvidia_gpu_collector_read_errors", gpu), Some(0.0));
        assert_eq!(one("nvidia_gpu_utilization_ratio", gpu), Some(0.8));
        assert_eq!(
            stderr
                .lines()
                .filter(|l| l.contains(&format!("GPU {gpu}: GPM metrics ({reason}) left out:")))
                .count(),
            1,
            "{stderr}"
        );
    }
    assert!(
        stderr.contains("NVreg_RestrictProfilingToAdminUsers"),
        "{stderr}"
    );
    // GPU 3: nvmlGpmMetricsGet fails: a counted read error.
    assert_eq!(one("nvidia_gpu_collector_read_errors", "3"), Some(1.0));
    assert!(of("nvidia_gpu_graphics_engine_active_ratio", "3").is_empty());
    // GPU 4 has no GPM: nothing at all, no reason either.
    assert!(!samples
        .keys()
        .any(|s| s.label("gpu") == Some("4") && s.label("reason").is_some()));
    assert!(device_series(&samples)
        .iter()
        .all(|s| !(s.label("gpu") == Some("4")
            && (s.name.contains("_active_ratio") || s.name.contains("gpm")))));

    // The next run says nothing more about what has not changed.
    let again = ex().run_args("gpm-faults", state.path(), &args, &[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!stderr.contains("GPM metrics"), "{stderr}");
    let reason = [("gpu", "2"), ("reason", "no_permission")];
    let unavailable = value(&again.samples(), "nvidia_gpu_gpm_unavailable", &reason);
    assert_eq!(unavailable, Some(1.0));
}

#[test]
fn gpm_window_holds_the_other_reads() {
    // GPU 0's temperature read takes 400 ms. The other reads are taken at the
    // end of the window, started as long before it as they took in the
    // previous run: once a run has learnt that, a 500 ms window lasts about
    // the window, not window + reads.
    let state = tempfile::tempdir().unwrap();
    let args = ["--stdout", "--write-state", "--gpm-window", "500ms"];
    let first = ex().run_args("gpm-faults", state.path(), &args, &[]);
    assert_eq!(first.code(), Some(0));
    let started = Instant::now();
    let output = ex().run_args("gpm-faults", state.path(), &args, &[]);
    let wall = started.elapsed();
    assert_eq!(output.code(), Some(0));
    assert!(wall >= Duration::from_millis(500), "{wall:?}");
    assert!(
        wall < Duration::from_millis(800),
        "{wall:?}: reads outside the window?"
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let window = value_in(&text, "nvidia_gpu_gpm_window_seconds", &[("gpu", "0")]).unwrap();
    assert!((0.5..0.6).contains(&window), "{window}");
    let temperature = value_in(&text, "nvidia_gpu_temperature_celsius", &[("gpu", "0")]);
    assert!(temperature.is_some(), "{text}");
}

#[test]
fn gpm_window_is_honoured_and_zero_turns_it_off() {
    let started = Instant::now();
    let output = exporter("h100x8", &["--stdout", "--gpm-window", "200ms"]);
    let wall = started.elapsed();
    assert_eq!(output.code(), Some(0));
    assert!(wall >= Duration::from_millis(200), "{wall:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    for gpu in 0..8 {
        let gpu = gpu.to_string();
        let window = value_in(&text, "nvidia_gpu_gpm_window_seconds", &[("gpu", &gpu)]);
        let window = window.unwrap_or_else(|| panic!("GPU {gpu}: no window"));
        assert!((0.2..0.5).contains(&window), "GPU {gpu}: {window}");
    }
    let output = exporter("h100x8", &["--stdout", "--gpm-window", "0"]);
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        !text.contains("_active_ratio") && !text.contains("nvidia_gpu_gpm_"),
        "{text}"
    );
    // As does switching the collector off.
    let output = exporter("h100x8", &["--stdout", "--no-collector", "gpm"]);
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(!text.contains("nvidia_gpu_sm_") && !text.contains("nvidia_gpu_gpm_"));
}

#[test]
fn gpm_pause_file_pauses_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let pause = dir.path().join("gpm-paused");
    fs::write(&pause, "").unwrap();
    let started = Instant::now();
    let output = exporter(
        "h100x8",
        &["--stdout", "--gpm-pause-file", pause.to_str().unwrap()],
    );
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "paused runs do not wait"
    );
    assert_eq!(output.code(), Some(0));
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let samples = parsed(&text);
    let paused = select(
        &samples,
        "nvidia_gpu_gpm_unavailable",
        &[("reason", "paused")],
    );
    assert_eq!(paused.len(), 8, "{text}");
    assert!(paused.iter().all(|(_, v)| *v == 1.0), "{paused:?}");
    assert!(select(&samples, "nvidia_gpu_sm_active_ratio", &[]).is_empty());
}

#[test]
fn gpm_window_must_fit_in_the_timeout() {
    let output = exporter(
        "h100x8",
        &["--stdout", "--timeout", "1s", "--gpm-window", "1s"],
    );
    assert_eq!(output.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--gpm-window 1s does not fit in the time a run may read (720ms)"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    let output = exporter("h100x8", &["--stdout", "--gpm-window", "50ms"]);
    assert_eq!(output.code(), Some(2));
    // Without GPM the window does not matter.
    let output = exporter(
        "h100x8",
        &[
            "--stdout",
            "--timeout",
            "1s",
            "--gpm-window",
            "1s",
            "--no-collector",
            "gpm",
        ],
    );
    assert_eq!(output.code(), Some(0));
}

#[test]
fn gpm_window_cut_short_by_the_deadline_is_left_out() {
    // NVML init takes 1.2 s of a 2 s timeout: the GPUs' reading ends at
    // 1.44 s, the window at 1.24 s, so it is cut to about 40 ms, which would
    // read zeros.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slow-init.toml");
    let text = fs::read_to_string(scenario("h100x8"))
        .unwrap()
        .replace("[system]\n", "[system]\ninit_delay_ms = 1200\n");
    fs::write(&path, text).unwrap();
    let state = tempfile::tempdir().unwrap();
    let output = ex().run_args(
        "h100x8",
        state.path(),
        &["--stdout", "--timeout", "2s"],
        &[("FAKE_NVML_SCENARIO", path.to_str().unwrap())],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.code(), Some(0), "{stderr}");
    let text = String::from_utf8(output.stdout).unwrap();
    // Said in the file and logged once (not again while it stays so).
    let samples = parsed(&text);
    let too_short = [
        ("gpu", "0"),
        ("uuid", "GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"),
        ("reason", "window_too_short"),
    ];
    assert_eq!(
        lookup(
            &samples,
            &Series::new("nvidia_gpu_gpm_unavailable", &too_short).to_string()
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        stderr.contains("GPU 0: GPM metrics (window_too_short) left out"),
        "{stderr}"
    );
    let of = |family: &str| select(&samples, family, &[("gpu", "0")]);
    assert!(of("nvidia_gpu_gpm_window_seconds").is_empty());
    assert!(of("nvidia_gpu_graphics_engine_active_ratio").is_empty());
    let utilization = value(&samples, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]);
    assert!(
        utilization.is_some_and(|u| (0.97..0.98).contains(&u)),
        "{text}"
    );
}

/// A window the exporter chooses (`auto`) leaves the other reads room to run
/// past their expected time: GPU 0's temperature read takes 400 ms, and a
/// first run (nothing learnt yet), threads or one GPU after another, still
/// publishes in full within the timeout.
#[test]
fn slow_reads_fit_an_auto_window() {
    for mode in [&[][..], &["--sequential"][..]] {
        let state = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--stdout",
            "--write-state",
            "--timeout",
            "3s",
            "--gpm-window",
            "auto",
        ];
        args.extend_from_slice(mode);
        for run in 0..2 {
            let output = ex().run_args("gpm-faults", state.path(), &args, &[]);
            assert_eq!(output.code(), Some(0), "{mode:?} run {run}: {output:?}");
            let text = String::from_utf8(output.stdout).unwrap();
            // The window chosen, 1.744 s, shortened where the reads need the
            // room, or longer where the reads ran past it; always within the
            // 2.16 s the GPUs may take (2.4 s to read less the host steps'
            // 240 ms). With --sequential GPU 0's window ends as its reads
            // do, before the other GPUs' reads and closes (a first run
            // expects 5 x 130 ms of them, and half as much again).
            let shortest = if mode.is_empty() { 1.55 } else { 1.0 };
            let window = value_in(&text, "nvidia_gpu_gpm_window_seconds", &[("gpu", "0")]).unwrap();
            assert!(
                (shortest..2.16).contains(&window),
                "{mode:?} run {run}: {window}"
            );
        }
    }
}
