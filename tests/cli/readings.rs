//! What each GPU reading is, where it comes from and how often it is read.

use super::*;

/// What each golden case shows.
#[test]
fn h100x8_healthy_every_gpu_complete() {
    let (text, samples) = golden::case(ex(), "h100x8", "h100x8", &[], 0);
    for gpu in 0..8 {
        let gpu = gpu.to_string();
        let up = value(&samples, "nvidia_gpu_up", &[("gpu", &gpu)]);
        assert_eq!(up, Some(1.0), "gpu {gpu}");
    }
    assert_eq!(lookup(&samples, "nvidia_gpu_collector_up"), Some(1.0));
    assert!(select(&samples, "nvidia_gpu_collector_error", &[]).is_empty());
    assert_eq!(
        text.matches("# TYPE nvidia_gpu_energy_joules_total counter\n")
            .count(),
        1
    );
    // The small families, with the scenario's raw values in base units.
    let id = "gpu=\"7\",uuid=\"GPU-94f06ad3-7b1c-4e3f-85a2-1d8e4c9b0f67\"";
    for (family, want) in [
        ("nvidia_gpu_jpeg_utilization_ratio", 0.31),
        ("nvidia_gpu_ofa_utilization_ratio", 0.0),
        ("nvidia_gpu_temperature_margin_celsius", 26.0),
        ("nvidia_gpu_power_instant_watts", 451.342),
    ] {
        let series = format!("{family}{{{id}}}");
        assert_eq!(lookup(&samples, &series), Some(want), "{series}");
    }
    // GPM on every GPU: percentages as ratios, eight pipes, the window.
    for (family, count) in [
        ("nvidia_gpu_sm_active_ratio", 8),
        ("nvidia_gpu_pipe_active_ratio", 8 * 8),
        ("nvidia_gpu_gpm_window_seconds", 8),
    ] {
        assert_eq!(select(&samples, family, &[]).len(), count, "{family}");
    }
    let sm_active = format!("nvidia_gpu_sm_active_ratio{{{id}}}");
    assert_eq!(lookup(&samples, &sm_active), Some(0.008));
    let tensor = [("gpu", "0"), ("pipe", "tensor")];
    assert_eq!(
        value(&samples, "nvidia_gpu_pipe_active_ratio", &tensor),
        Some(0.643)
    );
}

#[test]
fn geforce_unsupported_fields_are_absent_not_zero() {
    let (text, samples) = golden::case(ex(), "geforce", "geforce", &[], 0);
    assert!(
        !text.contains("nvidia_gpu_ecc_"),
        "ECC on a card without ECC"
    );
    assert!(!text.contains("nvidia_gpu_nvlink_"));
    // The info series keeps one label set: an unsupported serial is empty.
    let info = select(&samples, "nvidia_gpu_info", &[("gpu", "0")]);
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].0.label("serial"), Some(""));
    assert!(!select(&samples, "nvidia_gpu_fan_speed_ratio", &[]).is_empty());
    // No GPM before Hopper, and nothing says it is missing.
    assert!(!text.contains("_active_ratio") && !text.contains("nvidia_gpu_gpm_"));
}

#[test]
fn mig_devices_listed_under_their_parent() {
    let (_, samples) = golden::case(ex(), "h100-mig", "h100-mig", &[], 0);
    assert_eq!(select(&samples, "nvidia_gpu_mig_info", &[]).len(), 3);
    for profile in ["3g.40gb", "2g.20gb", "1g.10gb"] {
        let info = value(&samples, "nvidia_gpu_mig_info", &[("profile", profile)]);
        assert_eq!(info, Some(1.0), "{profile}");
    }
    for family in [
        "nvidia_gpu_mig_memory_free_bytes",
        "nvidia_gpu_mig_memory_reserved_bytes",
    ] {
        assert_eq!(select(&samples, family, &[]).len(), 3, "{family}");
    }
    assert!(value(&samples, "nvidia_gpu_mig_enabled", &[("gpu", "0")]).is_some());
    // GPM per GPU instance, labelled like the other MIG series.
    for (gi, sm_active) in [("2", 0.855), ("3", 0.274), ("9", 0.0)] {
        let series = format!(
            "nvidia_gpu_mig_sm_active_ratio{{gpu=\"0\",uuid=\"GPU-a7c3e915-2f4d-4b80-9e16-c5d8b2f07a43\",gpu_instance_id=\"{gi}\"}}"
        );
        assert_eq!(
            lookup(&samples, &series),
            Some(sm_active),
            "GPU instance {gi}"
        );
    }
    assert_eq!(
        select(&samples, "nvidia_gpu_mig_pipe_active_ratio", &[]).len(),
        3 * 8
    );
    // The whole GPU answers no GPM metric in MIG mode (in this scenario).
    assert!(select(&samples, "nvidia_gpu_sm_active_ratio", &[]).is_empty());
}

#[test]
fn batched_field_values_are_used_before_single_calls() {
    let (_, samples) = golden::case(ex(), "fields-preferred", "fields-preferred", &[], 0);
    let id = "gpu=\"0\",uuid=\"GPU-6b1d3e0a-4c52-4f7e-9a18-0d2c5e7b3f41\"";
    for (series, want) in [
        (format!("nvidia_gpu_ecc_enabled{{{id}}}"), 1.0),
        (
            format!("nvidia_gpu_ecc_errors_total{{{id},type=\"corrected\",scope=\"volatile\"}}"),
            12.0,
        ),
        (
            format!("nvidia_gpu_ecc_errors_total{{{id},type=\"uncorrected\",scope=\"aggregate\"}}"),
            2.0,
        ),
        (
            format!("nvidia_gpu_violation_seconds_total{{{id},policy=\"power\"}}"),
            1.5,
        ),
        (
            format!("nvidia_gpu_violation_seconds_total{{{id},policy=\"low_utilization\"}}"),
            9.0,
        ),
        (
            format!("nvidia_gpu_energy_joules_total{{{id}}}"),
            123456.789,
        ),
        (format!("nvidia_gpu_pcie_replays_total{{{id}}}"), 7.0),
        (
            format!("nvidia_gpu_memory_temperature_celsius{{{id}}}"),
            64.0,
        ),
        // The failing single functions were never needed.
        (format!("nvidia_gpu_collector_read_errors{{{id}}}"), 0.0),
    ] {
        assert_eq!(lookup(&samples, &series), Some(want), "{series}");
    }
}

#[test]
fn the_second_power_reading_is_the_one_the_draw_is_not() {
    // Hopper: the draw is a 1 s average; field 185 is answered but not read.
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let text = run_without_gpm(
        &ex().edited("demo-h100x8", dir.path(), "as-is", |t| t),
        state.path(),
    )
    .0;
    let instant =
        |text: &str, gpu: &str| value_in(text, "nvidia_gpu_power_instant_watts", &[("gpu", gpu)]);
    let average =
        |text: &str, gpu: &str| value_in(text, "nvidia_gpu_power_average_watts", &[("gpu", gpu)]);
    for gpu in 0..8 {
        let gpu = gpu.to_string();
        assert!(instant(&text, &gpu).is_some(), "GPU {gpu}:\n{text}");
    }
    assert_eq!(instant(&text, "0"), Some(675.488));
    assert!(!text.contains("nvidia_gpu_power_average_watts"), "{text}");

    // GA100 (A100): the draw is instantaneous; field 186 is answered but not read.
    let text = exporter("lost-gpu", &["--stdout"]);
    let text = String::from_utf8(text.stdout).unwrap();
    for gpu in ["0", "1", "3"] {
        assert!(average(&text, gpu).is_some(), "GPU {gpu}:\n{text}");
    }
    assert_eq!(average(&text, "0"), Some(344.871));
    assert!(!text.contains("nvidia_gpu_power_instant_watts"), "{text}");

    // The same A100s named as a GA102 board (and with its device id): averaged.
    let a40 = fs::read_to_string(scenario("lost-gpu"))
        .unwrap()
        .replace("NVIDIA A100-SXM4-80GB", "NVIDIA A40")
        .replace("pci_device_id = 0x20b210de", "pci_device_id = 0x223510de");
    let path = dir.path().join("a40.toml");
    fs::write(&path, a40).unwrap();
    let text = exporter(path.to_str().unwrap(), &["--stdout"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert_eq!(instant(&text, "0"), Some(347.102));
    assert!(!text.contains("nvidia_gpu_power_average_watts"), "{text}");
}

#[test]
fn a_gpu_without_a_video_encoder_reads_no_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let engine = |text: &str, engine: &str| {
        let samples = parsed(text);
        samples.keys().any(|s| s.label("engine") == Some(engine))
    };
    let encoder_families =
        |text: &str| any_named(&parsed(text), "nvidia_gpu_encoder_") || engine(text, "encoder");
    // GH100 (H100) by its PCI device id: NVML answers the encoder's calls (an
    // idle encoder, as on a real H200), yet no encoder family is written; the
    // decoder is still read.
    let state = tempfile::tempdir().unwrap();
    let text = run_without_gpm(
        &ex().edited("demo-h100x8", dir.path(), "as-is", |t| t),
        state.path(),
    )
    .0;
    assert!(!encoder_families(&text), "{text}");
    assert!(engine(&text, "decoder"), "{text}");
    // The same answers from another chip (AD102, L40S): the encoder is read.
    let with_encoder = ex().edited("demo-h100x8", dir.path(), "with-encoder", |t| {
        t.replace("pci_device_id = 0x233010de", "pci_device_id = 0x26b910de")
            .replace("NVIDIA H100 80GB HBM3", "NVIDIA L40S")
    });
    let state = tempfile::tempdir().unwrap();
    let text = run_without_gpm(&with_encoder, state.path()).0;
    let sessions = value_in(&text, "nvidia_gpu_encoder_sessions", &[("gpu", "7")]);
    assert!(sessions.is_some(), "{text}");
    assert!(engine(&text, "encoder"), "{text}");
}

/// Temperature thresholds are the board's: read once per driver, and
/// still published from the state while their call would fail.
#[test]
fn temperature_thresholds_are_read_once_per_driver() {
    let text = fixed_reading_is_read_once_per_driver("nvmlDeviceGetTemperatureThreshold", 4.0);
    let thresholds = parsed(&text)
        .keys()
        .filter(|s| s.name == "nvidia_gpu_temperature_threshold_celsius")
        .count();
    assert_eq!(thresholds, 8 * 4, "{text}");
}

/// Sentinels where readings belong are never exported: each is counted and
/// logged, and an absurd MIG device count does not make the run loop.
#[test]
fn sentinels_are_dropped_and_counted() {
    let started = Instant::now();
    let output = exporter("fault-sentinels", &["--stdout"]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(output.code(), Some(0));
    let text = String::from_utf8(output.stdout).unwrap();
    let samples = parsed(&text);
    for family in [
        "nvidia_gpu_temperature_celsius",
        "nvidia_gpu_memory_temperature_celsius",
        "nvidia_gpu_power_watts",
        "nvidia_gpu_energy_joules_total",
    ] {
        let exported = select(&samples, family, &[]);
        assert!(exported.is_empty(), "{family} exported: {text}");
    }
    // An impossible MIG slot count (4294967295) is counted and clamped: the
    // MIG devices that exist are still listed.
    let mig = select(&samples, "nvidia_gpu_mig_info", &[]);
    assert!(!mig.is_empty(), "{text}");
    let errors = "nvidia_gpu_collector_read_errors{gpu=\"0\",uuid=\"GPU-a7c3e915-2f4d-4b80-9e16-c5d8b2f07a43\"}";
    assert_eq!(lookup(&samples, errors), Some(5.0), "{text}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 5, "{stderr}");
}

/// MIG mode and the process list are read once per GPU and run, however many
/// collectors use them (the fake's call log shows it on every GPU, as it
/// shows each GPU's handle asked once): a failing call is seen (and counted)
/// once.
#[test]
fn shared_readings_are_read_once_per_run() {
    let dir = tempfile::tempdir().unwrap();
    let text = fs::read_to_string(scenario("h100x8")).unwrap().replacen(
        "[[gpu]]\n",
        "[[gpu]]\nerrors = { nvmlDeviceGetMigMode = \"UNKNOWN\", nvmlDeviceGetComputeRunningProcesses_v3 = \"UNKNOWN\" }\n",
        1,
    );
    let path = dir.path().join("scenario.toml");
    fs::write(&path, text).unwrap();
    let log = dir.path().join("calls");
    let output = ex().run_args(
        "h100x8",
        &dir.path().join("state"),
        &[
            "--stdout",
            "--gpm-window",
            "0",
            "--collector",
            "processes",
            "--procfs",
            dir.path().to_str().unwrap(),
        ],
        &[
            ("FAKE_NVML_SCENARIO", path.to_str().unwrap()),
            ("FAKE_NVML_CALL_LOG", log.to_str().unwrap()),
        ],
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let errors = value_in(&text, "nvidia_gpu_collector_read_errors", &[("gpu", "0")]);
    assert_eq!(errors, Some(2.0), "{text}");
    let calls = Calls::read(&log);
    let samples = parsed(&text);
    for gpu in 0..8 {
        let gpu = gpu.to_string();
        // nvml-wrapper asks the count, then the list: one read is two calls,
        // or one where the count fails (GPU 0) or is 0.
        let processes = select(
            &samples,
            "nvidia_gpu_process_memory_used_bytes",
            &[("gpu", &gpu)],
        );
        for (call, want) in [
            ("nvmlDeviceGetHandleByIndex_v2", 1),
            ("nvmlDeviceGetMigMode", 1),
            (
                "nvmlDeviceGetComputeRunningProcesses_v3",
                if processes.is_empty() { 1 } else { 2 },
            ),
        ] {
            assert_eq!(calls.count(call, &gpu), want, "GPU {gpu}: {call}");
        }
    }
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr.matches("nvmlDeviceGetMigMode").count(),
        1,
        "{stderr}"
    );
}

/// Only NOT_SUPPORTED means "unsupported" (left out quietly); every other
/// return code, including the ones newer than the NVML bindings know
/// (ARGUMENT_VERSION_MISMATCH = 25, INSUFFICIENT_RESOURCES, FREQ_NOT_SUPPORTED),
/// is a counted, logged read error.
#[test]
fn only_not_supported_is_quiet_every_other_code_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    for (code, counted) in [
        ("NOT_SUPPORTED", false),
        ("ARGUMENT_VERSION_MISMATCH", true),
        ("INSUFFICIENT_RESOURCES", true),
        ("FREQ_NOT_SUPPORTED", true),
        ("UNKNOWN", true),
    ] {
        let text = fs::read_to_string(scenario("h100x8")).unwrap().replacen(
            "[[gpu]]\n",
            &format!("[[gpu]]\nerrors = {{ nvmlDeviceGetPowerUsage = \"{code}\" }}\n"),
            1,
        );
        let path = dir.path().join(format!("{code}.toml"));
        fs::write(&path, text).unwrap();
        let output = ex().run_args(
            "h100x8",
            &dir.path().join("state"),
            &["--stdout", "--gpm-window", "0"],
            &[("FAKE_NVML_SCENARIO", path.to_str().unwrap())],
        );
        let text = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        let errors = value_in(&text, "nvidia_gpu_collector_read_errors", &[("gpu", "0")]);
        assert_eq!(
            value_in(&text, "nvidia_gpu_power_watts", &[("gpu", "0")]),
            None,
            "{code}: power exported"
        );
        let want = if counted { 1.0 } else { 0.0 };
        assert_eq!(errors, Some(want), "{code}: {text}");
        assert_eq!(
            stderr.contains("GPU 0: nvmlDeviceGetPowerUsage"),
            counted,
            "{code}: {stderr}"
        );
    }
}

/// The H200 as it answers (driver 580): no fabric series, the PCIe counters,
/// the T.Limit thresholds -8/-2; its link trained at Gen2 x8 of Gen5 x16.
#[test]
fn pcie_trained_low_shows_against_its_maxima() {
    let (_, samples) = golden::case(
        ex(),
        "pcie-trained-low",
        "pcie-trained-low",
        &["--collector", "pcie-errors"],
        0,
    );
    assert!(!samples
        .keys()
        .any(|s| s.name.starts_with("nvidia_gpu_fabric")));
    let value = |name| gpu_value(&samples, name, "0", &[]);
    assert_eq!(value("nvidia_gpu_pcie_link_generation"), Some(2.0));
    assert_eq!(value("nvidia_gpu_pcie_link_max_generation"), Some(5.0));
    assert_eq!(value("nvidia_gpu_pcie_link_width"), Some(8.0));
    assert_eq!(value("nvidia_gpu_pcie_link_max_width"), Some(16.0));
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_pcie_errors_total",
            "0",
            &[("kind", "l0_to_recovery")]
        ),
        Some(3279.0)
    );
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_temperature_margin_threshold_celsius",
            "0",
            &[("threshold", "shutdown")]
        ),
        Some(-8.0)
    );
}

/// Readings fixed per driver (PCIe maxima, T.Limit thresholds, "on no
/// fabric") are read on the first run and taken from the state after: the
/// second run makes none of those calls (the fake's call log) and gives the
/// same values with none of them answering.
#[test]
fn fixed_readings_are_read_once_per_driver() {
    let state = tempfile::tempdir().unwrap();
    let fixed = [
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
    ];
    let logs = tempfile::tempdir().unwrap();
    let (first_log, second_log) = (logs.path().join("first"), logs.path().join("second"));
    let first = ex().run_args(
        "pcie-trained-low",
        state.path(),
        &["--stdout", "--write-state"],
        &[("FAKE_NVML_CALL_LOG", first_log.to_str().unwrap())],
    );
    assert_eq!(first.code(), Some(0));
    let calls = Calls::read(&first_log);
    for call in fixed {
        assert_eq!(calls.count(call, "0"), 1, "{call}: {calls:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let failing = ex().replaced(
        dir.path(),
        "pcie-trained-low",
        &[(
            "fabric = { state = 0 }",
            "fabric = { state = 0 }\nerrors = { nvmlDeviceGetGpuFabricInfoV = \"UNKNOWN\", nvmlDeviceGetMaxPcieLinkGeneration = \"UNKNOWN\", nvmlDeviceGetMaxPcieLinkWidth = \"UNKNOWN\" }",
        )],
    );
    let second = ex().run_args(
        &failing,
        state.path(),
        &["--stdout", "--write-state"],
        &[("FAKE_NVML_CALL_LOG", second_log.to_str().unwrap())],
    );
    assert_eq!(second.code(), Some(0));
    let calls = Calls::read(&second_log);
    for call in fixed {
        assert_eq!(calls.total(call), 0, "{call} called again: {calls:?}");
    }
    let samples = second.samples();
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_collector_read_errors", "0", &[]),
        Some(0.0)
    );
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_pcie_link_max_width", "0", &[]),
        Some(16.0)
    );
}

/// NVML 13 deprecates nvmlDeviceGetTemperature, nvmlDeviceGetViolationStatus
/// and the *ClocksThrottleReasons calls: the replacements are used, and a
/// driver without a call (old or new) costs only that reading, quietly.
#[test]
fn deprecated_calls_are_replaced_and_any_one_may_be_missing() {
    let libs = tempfile::tempdir().unwrap();
    let full = ex().baseline("h100x8");
    for (missing, lost) in [
        (vec!["nvmlDeviceGetTemperature"], None),
        (vec!["nvmlDeviceGetTemperatureV"], None),
        (
            vec!["nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"],
            Some("nvidia_gpu_temperature_celsius"),
        ),
        // h100x8 has no violation fields: the function was its only source.
        (
            vec!["nvmlDeviceGetViolationStatus"],
            Some("nvidia_gpu_violation_seconds_total"),
        ),
        (
            vec![
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                "nvmlDeviceGetSupportedClocksThrottleReasons",
            ],
            None,
        ),
    ] {
        let lib = ex().fake_without(libs.path(), &missing);
        let run = ex().run("h100x8").stdout().lib(lib).finish().unwrap();
        run.assert_status(0);
        assert!(run.stderr.is_empty(), "{missing:?}: {run:?}");
        let got = run.samples();
        for (series, value) in &full {
            if series.name.starts_with("nvidia_gpu_collector_")
                || Some(series.name.as_str()) == lost
            {
                continue;
            }
            assert!(
                got.contains_key(series),
                "{missing:?}: {series:?} ({value}) is missing"
            );
        }
        if let Some(lost) = lost {
            assert!(!got.keys().any(|s| s.name == lost), "{missing:?}");
        }
    }
}

/// One run of `scenario_path` at the fixed clock, without GPM (not needed
/// here, and its window would slow the test): its text and the NVML calls it
/// made.
fn run_without_gpm(scenario_path: &Path, state: &Path) -> (String, Calls) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let text = ex().run_at_with(
        scenario_path.to_str().unwrap(),
        state,
        T0,
        &["--no-collector", "gpm"],
        &[("FAKE_NVML_CALL_LOG", log.path().to_str().unwrap())],
    );
    (text, Calls::read(log.path()))
}

/// A fault injected into `symbol` (called `per_gpu` times a GPU) is seen on
/// a run without state, not on one whose state a healthy run left under the
/// same driver, and again after a driver change. Returns the text of the run
/// that used the state.
fn fixed_reading_is_read_once_per_driver(symbol: &str, per_gpu: f64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let errors = |text: &str| -> f64 {
        (0..8)
            .map(|gpu| {
                let gpu = gpu.to_string();
                value_in(text, "nvidia_gpu_collector_read_errors", &[("gpu", &gpu)]).unwrap()
            })
            .sum()
    };
    // The fault goes into every GPU's table, after its `uuid` line.
    let failing = |driver: &'static str| {
        move |text: String| {
            let mut out = String::with_capacity(text.len());
            for line in text.lines() {
                out.push_str(line);
                out.push('\n');
                if line.starts_with("uuid = ") {
                    out.push_str(&format!("errors = {{ {symbol} = \"UNKNOWN\" }}\n"));
                }
            }
            out.replace("driver_version = \"570.133.20\"", driver)
        }
    };
    let same_driver = ex().edited(
        "demo-h100x8",
        dir.path(),
        "same-driver",
        failing("driver_version = \"570.133.20\""),
    );
    // Without a remembered value the injected fault is seen on every GPU.
    let fresh = tempfile::tempdir().unwrap();
    let (text, calls) = run_without_gpm(&same_driver, fresh.path());
    assert_eq!(errors(&text), 8.0 * per_gpu);
    assert_eq!(calls.total(symbol) as f64, 8.0 * per_gpu, "{calls:?}");
    // Remembered by a healthy first run, it is not read again: not called.
    run_without_gpm(
        &ex().edited("demo-h100x8", dir.path(), "healthy", |t| t),
        state.path(),
    );
    let (text, calls) = run_without_gpm(&same_driver, state.path());
    assert_eq!(errors(&text), 0.0, "{text}");
    assert_eq!(calls.total(symbol), 0, "{calls:?}");
    // A new driver forgets it: read again, and the fault is seen.
    let new_driver = ex().edited(
        "demo-h100x8",
        dir.path(),
        "new-driver",
        failing("driver_version = \"580.65.06\""),
    );
    let (again, calls) = run_without_gpm(&new_driver, state.path());
    assert_eq!(errors(&again), 8.0 * per_gpu);
    assert_eq!(calls.total(symbol) as f64, 8.0 * per_gpu, "{calls:?}");
    text
}

/// A call the GPU answered NOT_SUPPORTED (a GeForce's ECC mode and retired
/// pages) is made on the first run only: the next run under the same driver
/// does not make it and gives the same families; a new driver asks again.
#[test]
fn unsupported_calls_are_made_once_per_driver() {
    let state = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let run = |scenario: &str, log: &str| {
        let log = logs.path().join(log);
        let env = [("FAKE_NVML_CALL_LOG", log.to_str().unwrap())];
        let out = ex().run_args(scenario, state.path(), &["--stdout", "--write-state"], &env);
        assert_eq!(out.code(), Some(0), "{}", out.err());
        let families: Vec<String> = out.samples().keys().map(|s| s.name.clone()).collect();
        (families, Calls::read(&log))
    };
    let unsupported = [
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetRetiredPagesPendingStatus",
    ];
    let (first, calls) = run("geforce", "first");
    for call in unsupported {
        assert_eq!(calls.count(call, "0"), 1, "{call}: {calls:?}");
    }
    let (second, calls) = run("geforce", "second");
    for call in unsupported {
        assert_eq!(calls.total(call), 0, "{call} made again: {calls:?}");
    }
    assert_eq!(second, first);
    let dir = tempfile::tempdir().unwrap();
    let upgraded = ex().replaced(dir.path(), "geforce", &[("550.90.07", "550.127.05")]);
    let (_, calls) = run(&upgraded, "third");
    for call in unsupported {
        assert_eq!(calls.count(call, "0"), 1, "{call}: {calls:?}");
    }
}

/// A NOT_SUPPORTED that was only for the moment costs its reading for at
/// most 40 runs (10 minutes of the timer): then the call is asked again.
#[test]
fn a_passing_not_supported_is_asked_again_within_forty_runs() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let refusing = ex().replaced(
        dir.path(),
        "geforce",
        &[(
            "pstate = 2",
            "pstate = 2\nerrors = { nvmlDeviceGetPowerUsage = \"NOT_SUPPORTED\" }",
        )],
    );
    let power = |scenario: &str| {
        let out = ex().run_args(scenario, state.path(), &["--stdout", "--write-state"], &[]);
        assert_eq!(out.code(), Some(0), "{}", out.err());
        gpu_value(&out.samples(), "nvidia_gpu_power_watts", "0", &[])
    };
    assert_eq!(power(&refusing), None);
    let answers: Vec<Option<f64>> = (0..41).map(|_| power("geforce")).collect();
    assert_eq!(answers[0], None, "not asked again at once");
    assert_eq!(answers[40], Some(187.432), "asked again within 40 runs");
}

/// What the newest drivers say about a GPU's health: the B200 asks to be
/// drained and reset, with a TPC repair and a row remap pending, banks low on
/// spare rows and SRAM errors past the diagnostics' threshold; the GB200
/// tells where it sits and its Grace C2C links, the GH200 its C2C errors.
/// Each is absent where the GPU answers NOT_SUPPORTED; a recovery action
/// newer than the exporter is `unknown`.
#[test]
fn health_of_the_newest_drivers() {
    let samples = exporter("b200", &["--stdout"]).samples();
    let b200 = |name, labels: &[(&str, &str)]| gpu_value(&samples, name, "0", labels);
    for (action, want) in [("drain_and_reset", 1.0), ("none", 0.0), ("bus_reset", 0.0)] {
        let labels = [("action", action)];
        assert_eq!(b200("nvidia_gpu_recovery_action", &labels), Some(want));
    }
    assert_eq!(
        b200("nvidia_gpu_repair_pending", &[("kind", "tpc")]),
        Some(1.0)
    );
    assert_eq!(
        b200("nvidia_gpu_repair_pending", &[("kind", "channel")]),
        Some(0.0)
    );
    let banks = |availability| {
        b200(
            "nvidia_gpu_row_remapper_banks",
            &[("availability", availability)],
        )
    };
    assert_eq!((banks("low"), banks("none")), (Some(2.0), Some(1.0)));
    let sram = [("type", "uncorrected_sec_ded"), ("scope", "aggregate")];
    assert_eq!(b200("nvidia_gpu_sram_ecc_errors_total", &sram), Some(3.0));
    let l2 = [("location", "l2")];
    assert_eq!(
        b200("nvidia_gpu_sram_ecc_location_errors_total", &l2),
        Some(3.0)
    );
    assert_eq!(
        b200("nvidia_gpu_sram_ecc_threshold_exceeded", &[]),
        Some(1.0)
    );
    let lifetime = "nvidia_gpu_power_smoothing_lifetime_remaining_ratio";
    assert_eq!(b200(lifetime, &[]), Some(0.88));
    assert_eq!(b200("nvidia_gpu_collector_read_errors", &[]), Some(0.0));
    assert_eq!(b200("nvidia_gpu_c2c_links", &[]), None);
    assert!(!any_named(&samples, "nvidia_gpu_platform_info"));

    let gb200 = exporter("gb200-nvl72", &["--stdout"]).samples();
    let info = select(&gb200, "nvidia_gpu_platform_info", &[("gpu", "0")]);
    assert_eq!(info.len(), 1);
    for (label, want) in [
        ("chassis_serial", "1821324000123"),
        ("slot", "7"),
        ("tray", "3"),
        ("host_id", "1"),
        ("module_id", "2"),
    ] {
        assert_eq!(info[0].0.label(label), Some(want), "{label}");
    }
    let bandwidth = "nvidia_gpu_c2c_link_max_bandwidth_bytes_per_second";
    assert_eq!(gpu_value(&gb200, bandwidth, "0", &[]), Some(45e9));
    assert_eq!(gpu_value(&gb200, lifetime, "0", &[]), Some(0.97));

    let (_, gh200) = golden::case(ex(), "gh200", "gh200", &[], 0);
    let crc = [("type", "crc")];
    assert_eq!(
        gpu_value(&gh200, "nvidia_gpu_c2c_link_errors_total", "0", &crc),
        Some(4.0)
    );
    let full = [("state", "full_power")];
    assert_eq!(
        gpu_value(&gh200, "nvidia_gpu_c2c_link_power_state", "0", &full),
        Some(1.0)
    );
    assert_eq!(gpu_value(&gh200, lifetime, "0", &[]), None);
    assert!(!any_named(&gh200, "nvidia_gpu_platform_info"));

    // The C2C mode and the GPU's place in the rack are read once per driver.
    let state = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    for (run, made) in [("first", 1), ("second", 0)] {
        let log = logs.path().join(run);
        let env = [("FAKE_NVML_CALL_LOG", log.to_str().unwrap())];
        let args = ["--stdout", "--write-state"];
        let out = ex().run_args("gb200-nvl72", state.path(), &args, &env);
        assert_eq!(out.code(), Some(0), "{}", out.err());
        let samples = out.samples();
        let enabled = gpu_value(&samples, "nvidia_gpu_c2c_enabled", "0", &[]);
        assert_eq!(enabled, Some(1.0), "{run}");
        let tray = [("tray", "3"), ("chassis_serial", "1821324000123")];
        let info = gpu_value(&samples, "nvidia_gpu_platform_info", "0", &tray);
        assert_eq!(info, Some(1.0), "{run}");
        let calls = Calls::read(&log);
        for call in ["nvmlDeviceGetC2cModeInfoV", "nvmlDeviceGetPlatformInfo"] {
            assert_eq!(calls.total(call), made, "{run}: {call}: {calls:?}");
        }
    }

    // Memory past repair, as driver 590 tells it (580 does not).
    let flag = gpu_value(&gh200, "nvidia_gpu_memory_unrepairable", "0", &[]);
    assert_eq!(flag, Some(0.0));
    assert!(!any_named(&gb200, "nvidia_gpu_memory_unrepairable"));
    let dir = tempfile::tempdir().unwrap();
    let edit = ("memory_unrepairable = false", "memory_unrepairable = true");
    let unrepairable = ex().replaced(dir.path(), "gh200", &[edit]);
    let samples = exporter(&unrepairable, &["--stdout"]).samples();
    let flag = gpu_value(&samples, "nvidia_gpu_memory_unrepairable", "0", &[]);
    assert_eq!(flag, Some(1.0));

    // The actions of NVML v615 and one newer than it.
    let dir = tempfile::tempdir().unwrap();
    for (value, action) in [("6", "bus_reset"), ("7", "system_reboot"), ("8", "unknown")] {
        let asks = ex().replaced(
            dir.path(),
            "gh200",
            &[("\"230\" = 0", &format!("\"230\" = {value}"))],
        );
        let samples = exporter(&asks, &["--stdout"]).samples();
        let asked = select(&samples, "nvidia_gpu_recovery_action", &[]);
        let on: Vec<_> = asked.iter().filter(|(_, v)| *v == 1.0).collect();
        assert_eq!(on.len(), 1, "{value}");
        assert_eq!(on[0].0.label("action"), Some(action), "{value}");
    }
}
