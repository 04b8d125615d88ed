//! NVML unusable, a GPU down, a getter failing or missing, hostile strings: what each fault leaves.
//!
//! Every fault that needs no root, mounts, kills or a real node_exporter (the
//! fault matrix, tests/fault-matrix, has those). Failure cases start from a
//! directory holding a complete file of a healthy run, so that "replaced" shows.

use super::*;

#[test]
fn lost_gpu_reported_down_others_complete() {
    let (text, samples) = golden::case(ex(), "lost-gpu", "lost-gpu", &[], 4);
    assert_eq!(
        lookup(&samples, r#"nvidia_gpu_up{gpu="2",uuid=""}"#),
        Some(0.0)
    );
    let reason = r#"nvidia_gpu_down_reason{gpu="2",uuid="",reason="gpu_lost"}"#;
    assert_eq!(lookup(&samples, reason), Some(1.0), "{text}");
    let gpu2: Vec<_> = device_series(&samples)
        .into_iter()
        .filter(|s| s.label("gpu") == Some("2"))
        .collect();
    assert_eq!(
        gpu2.len(),
        2,
        "only up and down_reason for the lost GPU: {gpu2:?}"
    );
    for gpu in ["0", "1", "3"] {
        let power = value(&samples, "nvidia_gpu_power_watts", &[("gpu", gpu)]);
        assert!(power.is_some(), "GPU {gpu}");
    }
    assert_eq!(lookup(&samples, "nvidia_gpu_collector_up"), Some(1.0));
}

#[test]
fn init_failures_write_only_collector_metrics_with_reason() {
    for (scenario_name, reason) in [
        ("init-driver-not-loaded", "driver_not_loaded"),
        ("init-no-permission", "no_permission"),
        ("init-lib-rm-version-mismatch", "driver_library_mismatch"),
        ("init-unknown", "unknown"),
    ] {
        let (text, samples) = golden::case(ex(), scenario_name, scenario_name, &[], 3);
        let up = lookup(&samples, "nvidia_gpu_collector_up");
        assert_eq!(up, Some(0.0), "{scenario_name}");
        let error = format!("nvidia_gpu_collector_error{{reason=\"{reason}\"}}");
        assert_eq!(
            lookup(&samples, &error),
            Some(1.0),
            "{scenario_name}: {text}"
        );
        assert!(
            device_series(&samples).is_empty(),
            "{scenario_name}: {text}"
        );
        assert!(!text.contains("nvidia_gpu_driver_info"), "{scenario_name}");
    }
}

#[test]
fn init_failure_stderr_says_what_to_check() {
    let output = exporter("init-driver-not-loaded", &["--stdout"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("driver_not_loaded"), "{stderr}");
    assert!(stderr.contains("lsmod | grep nvidia"), "{stderr}");
}

#[test]
fn missing_library_is_library_not_found() {
    let started = golden::now();
    let output = ex()
        .run("h100x8")
        .stdout()
        .lib("/nonexistent/libnvidia-ml.so.1")
        .finish()
        .unwrap();
    assert_eq!(output.code(), Some(3));
    let text = golden::normalize(&output.stdout, started, golden::now());
    golden::check(&ex().golden_dir(), "library-not-found", &text);
    assert!(output.err().contains("container toolkit"));
}

/// A hang inside nvml-wrapper's init (in nvmlSystemGetDriverVersion) is named
/// as that call.
#[test]
fn a_hang_is_named_by_the_call_that_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let output = exporter(
        "fault-system-hang",
        &[
            "--output-dir",
            dir.path().to_str().unwrap(),
            "--timeout",
            "1s",
        ],
    );
    assert_eq!(output.code(), Some(5));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("stuck in nvmlSystemGetDriverVersion (host)"),
        "{stderr}"
    );
    assert!(!stderr.contains("nvmlInit_v2"), "{stderr}");
}

/// NVML unusable, for every reason: exit 3, the good file replaced by one that
/// holds only collector series and the one reason, and stderr naming it. The
/// library loses its init function or the function every GPU's handle comes
/// from (no GPU can be read: a collector error, not every GPU down) in a copy
/// that no longer exports it, as a wrong or ancient libnvidia-ml.
#[test]
fn unusable_nvml_replaces_a_good_file_with_its_reason() {
    let libs = tempfile::tempdir().unwrap();
    let init = test_support::scenario::missing_symbols(
        &test_support::scenario::load(&scenario("fault-missing-init")).unwrap(),
    );
    let init: Vec<&str> = init.iter().map(String::as_str).collect();
    let cases = [
        ("init-driver-not-loaded", None, "driver_not_loaded"),
        ("init-no-permission", None, "no_permission"),
        (
            "init-lib-rm-version-mismatch",
            None,
            "driver_library_mismatch",
        ),
        ("init-unknown", None, "unknown"),
        ("fault-device-count", None, "unknown"),
        (
            "h100x8",
            Some(libs.path().join("absent/libnvidia-ml.so.1")),
            "library_not_found",
        ),
        (
            "fault-missing-init",
            Some(ex().fake_without(libs.path(), &init)),
            "missing_symbol",
        ),
        (
            "h100x8",
            Some(ex().fake_without(libs.path(), &["nvmlDeviceGetHandleByIndex_v2"])),
            "missing_symbol",
        ),
    ];
    for (scenario_name, lib, reason) in cases {
        let (dir, state) = ex().seeded("fault-read-error", false);
        let mut run = ex()
            .run(scenario_name)
            .output_dir(dir.path())
            .state_dir(state.path());
        if let Some(lib) = lib {
            run = run.lib(lib);
        }
        let run = run.finish().unwrap();
        let at = format!("{scenario_name}, {reason}: {run:?}");
        assert_eq!(run.code(), Some(3), "{at}");
        assert!(run.t_file.is_some(), "{at}: the good file stayed");
        check_file(&run.path(), Some(reason)).unwrap_or_else(|e| panic!("{at}: {e}"));
        assert!(
            run.err().contains(&format!("cannot use NVML ({reason})")),
            "{at}"
        );
    }
}

/// A library older than some optional functions (the energy counter, the
/// Clocks*EventReasons names): exactly the energy series is left out, clock
/// event reasons come from the older *ThrottleReasons names, nothing is counted
/// as a read error and nothing is logged.
#[test]
fn missing_optional_symbols_leave_out_only_their_readings() {
    let libs = tempfile::tempdir().unwrap();
    let path = scenario("fault-missing-optional");
    let missing =
        test_support::scenario::missing_symbols(&test_support::scenario::load(&path).unwrap());
    let missing: Vec<&str> = missing.iter().map(String::as_str).collect();
    assert!(missing.contains(&"nvmlDeviceGetTotalEnergyConsumption"));
    let lib = ex().fake_without(libs.path(), &missing);
    let run = ex()
        .run("fault-missing-optional")
        .lib(lib)
        .finish()
        .unwrap();
    run.assert_status(0);
    assert!(run.stderr.is_empty(), "{run:?}");
    let samples = check_file(&run.path(), None).unwrap();
    let (energy, rest): (Samples, Samples) = ex()
        .baseline("fault-missing-optional")
        .into_iter()
        .partition(|(s, _)| s.name == "nvidia_gpu_energy_joules_total");
    assert!(
        !energy.is_empty(),
        "the baseline has no energy series to lose"
    );
    assert!(
        samples
            .keys()
            .any(|s| s.name == "nvidia_gpu_clocks_event_active"),
        "no clock event reasons: no fallback to the ClocksThrottleReasons names"
    );
    // The read error counters are in the comparison: 0, as without the fault.
    compare(&samples, &rest, "file vs. baseline without energy").unwrap();
}

/// One getter fails with UNKNOWN on GPU 1, the name with INSUFFICIENT_SIZE on
/// GPU 2: each reading is left out (the info series keeps its label set, the
/// name empty), counted once and named on stderr; everything else is as
/// without the faults.
#[test]
fn a_failing_getter_leaves_out_only_its_reading() {
    let mut expected = ex().baseline("fault-read-error");
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let run = ex()
        .run("fault-read-error")
        .output_dir(dir.path())
        .state_dir(state.path())
        .finish()
        .unwrap();
    run.assert_status(0);
    let samples = check_file(&run.path(), None).unwrap();
    let (uuid1, uuid2) = (
        uuid_of(&expected, "1").unwrap(),
        uuid_of(&expected, "2").unwrap(),
    );
    let power1 = Series::new("nvidia_gpu_power_watts", &[("gpu", "1"), ("uuid", &uuid1)]);
    assert!(expected.remove(&power1).is_some(), "no power of GPU 1");
    let info2 = expected
        .keys()
        .find(|s| s.name == "nvidia_gpu_info" && s.label("gpu") == Some("2"))
        .cloned()
        .expect("nvidia_gpu_info of GPU 2");
    let mut emptied = info2.clone();
    emptied
        .labels
        .iter_mut()
        .filter(|(k, _)| k == "name")
        .for_each(|(_, v)| v.clear());
    let value = expected.remove(&info2).unwrap();
    expected.insert(emptied, value);
    for (gpu, uuid) in [("1", &uuid1), ("2", &uuid2)] {
        let errors = Series::new(
            "nvidia_gpu_collector_read_errors",
            &[("gpu", gpu), ("uuid", uuid)],
        );
        expected.insert(errors, 1.0);
    }
    compare(
        &samples,
        &expected,
        "file vs. baseline less the failed reads",
    )
    .unwrap();
    for call in ["GPU 1: nvmlDeviceGetPowerUsage", "GPU 2: nvmlDeviceGetName"] {
        assert!(
            run.err().contains(call),
            "stderr does not name {call}: {run:?}"
        );
    }
}

/// A GPU down (lost, lost in the middle of its reads, its handle refused):
/// exit 4; that GPU has only `nvidia_gpu_up 0`, its reason and its XID
/// counters (from the kernel log, which explains it), none of the readings
/// taken before it failed, under the UUID the previous run gave it; every
/// other GPU and the host-wide series are exactly as without the fault.
#[test]
fn a_gpu_down_keeps_its_uuid_and_the_others_are_unchanged() {
    for (scenario_name, down, reason) in [
        ("lost-gpu", "2", "gpu_lost"),
        ("fault-lost-midread", "0", "gpu_lost"),
        ("fault-handle-error", "1", "no_permission"),
    ] {
        let (dir, state) = ex().seeded(scenario_name, true);
        let before = check_file(&dir.path().join(test_support::OUT_FILE), None).unwrap();
        let run = ex()
            .run(scenario_name)
            .output_dir(dir.path())
            .state_dir(state.path())
            .finish()
            .unwrap();
        let at = format!("{scenario_name}: {run:?}");
        assert_eq!(run.code(), Some(4), "{at}");
        let after = check_file(&run.path(), None).unwrap_or_else(|e| panic!("{at}: {e}"));
        let ((gpus_before, host_before), (gpus_after, host_after)) = (gpus(&before), gpus(&after));
        compare(&host_after, &host_before, "host-wide series")
            .unwrap_or_else(|e| panic!("{at}: {e}"));
        assert!(
            gpus_after.keys().eq(gpus_before.keys()),
            "{at}: GPUs {:?}",
            gpus_after.keys()
        );
        for (gpu, series) in &gpus_before {
            let want = if gpu == down {
                let mut want = Samples::from([
                    (Series::new("nvidia_gpu_up", &[]), 0.0),
                    (
                        Series::new("nvidia_gpu_down_reason", &[("reason", reason)]),
                        1.0,
                    ),
                ]);
                want.extend(
                    series
                        .iter()
                        .filter(|(s, _)| {
                            // Counts from the kernel log stay with a down GPU.
                            s.name.starts_with("nvidia_gpu_xid_")
                                || s.name == "nvidia_gpu_fallen_off_bus_total"
                        })
                        .map(|(s, v)| (s.clone(), *v)),
                );
                want
            } else {
                series.clone()
            };
            compare(&gpus_after[gpu], &want, &format!("GPU {gpu}"))
                .unwrap_or_else(|e| panic!("{at}: {e}"));
        }
        assert!(run.err().contains(&format!("GPU {down}")), "{at}");
        assert_eq!(uuid_of(&after, down), uuid_of(&before, down), "{at}");
        assert!(
            uuid_of(&after, down).is_some_and(|u| u.starts_with("GPU-")),
            "{at}"
        );
    }
}

/// Hostile strings from NVML (quotes, backslashes, line feeds, braces, invalid
/// UTF-8, attempts to smuggle in a series) round-trip exactly through the
/// labels and smuggle nothing in; the run logs nothing.
#[test]
fn hostile_strings_round_trip_and_smuggle_nothing_in() {
    let doc = test_support::scenario::load(&scenario("fault-hostile")).unwrap();
    let run = ex().run("fault-hostile").finish().unwrap();
    run.assert_status(0);
    assert!(run.stderr.is_empty(), "{run:?}");
    let samples = check_file(&run.path(), None).unwrap();
    test_support::checks::check_hostile(&samples, &doc, "file").unwrap();
}
