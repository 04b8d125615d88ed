//! Which GPU is which from run to run: UUIDs kept, GPUs lost or gone, identities that cannot be told.

use super::xid::{GPU0, GPU0_79};
use super::*;

#[test]
fn lost_gpu_keeps_the_uuid_it_had() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let state = dir.path().join("state");
    // A healthy run (the same scenario without its faults) lets the state
    // learn every GPU's identity.
    let healthy = ex().run_args(
        "lost-gpu",
        &state,
        &["--output-dir", out],
        &[("FAKE_NVML_FAULTS", "off")],
    );
    assert_eq!(healthy.code(), Some(0), "{healthy:?}");
    let samples = healthy.samples();
    let uuid = uuid_of(&samples, "2").unwrap();
    assert_eq!(
        lookup(&samples, "nvidia_gpu_collector_state_ok"),
        Some(0.0),
        "first run"
    );
    // Then GPU 2 is lost, twice in a row: it keeps its UUID both times.
    for run in 1..=2 {
        let output = ex().run_args("lost-gpu", &state, &["--output-dir", out], &[]);
        assert_eq!(output.code(), Some(4), "run {run}");
        let samples = output.samples();
        for (series, want) in [
            (format!("nvidia_gpu_up{{gpu=\"2\",uuid=\"{uuid}\"}}"), 0.0),
            (
                format!("nvidia_gpu_down_reason{{gpu=\"2\",uuid=\"{uuid}\",reason=\"gpu_lost\"}}"),
                1.0,
            ),
            ("nvidia_gpu_collector_state_ok".to_owned(), 1.0),
        ] {
            assert_eq!(lookup(&samples, &series), Some(want), "run {run}: {series}");
        }
    }
    // A damaged state costs nothing but the memory: the run publishes in full
    // and says so.
    fs::write(
        state.join("state"),
        "nvidia-textfile-exporter-state 1\nboot x\n",
    )
    .unwrap();
    let output = ex().run_args("lost-gpu", &state, &["--output-dir", out], &[]);
    assert_eq!(output.code(), Some(4));
    let samples = output.samples();
    assert_eq!(lookup(&samples, "nvidia_gpu_collector_state_ok"), Some(0.0));
    assert_eq!(
        lookup(&samples, r#"nvidia_gpu_up{gpu="2",uuid=""}"#),
        Some(0.0)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("state file"), "{stderr}");
}

/// A GPU whose UUID cannot be read for one run continues the running totals
/// the state keeps for it (found by its PCI bus id): no counter goes back
/// within a boot.
#[test]
fn a_uuid_read_failure_does_not_reset_the_busy_counters() {
    busy_counters_survive("errors = { nvmlDeviceGetUUID = \"UNKNOWN\" }");
}

/// Neither the UUID nor the PCI bus id can be read for one run (errors that
/// do not mark the GPU down): the GPU is known by its index, and its running
/// totals still only grow.
#[test]
fn uuid_and_bus_id_read_failures_do_not_reset_the_busy_counters() {
    busy_counters_survive(
        "errors = { nvmlDeviceGetUUID = \"UNKNOWN\", nvmlDeviceGetPciInfo_v3 = \"UNKNOWN\" }",
    );
}

/// A GPU that fell off the bus keeps the bus id the state knew, so the Xid 79
/// that explains it counts on its own counter, not as unattributed.
#[test]
fn a_lost_gpus_xid_79_counts_as_its_own() {
    let runs = after_a_healthy_run(
        XID79,
        |text| text.replacen("[[gpu]]\n", "[[gpu]]\nlost = true\n", 1),
        1,
    );
    let (status, text, _) = &runs[0];
    assert_eq!(*status, Some(4), "{text}");
    let run = parsed(text);
    assert_eq!(
        lookup(
            &run,
            r#"nvidia_gpu_up{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"}"#
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(value(&run, GPU0.0, GPU0.1), Some(1.0), "{text}");
    assert_eq!(value(&run, GPU0_79.0, GPU0_79.1), Some(1.0), "{text}");
    let unattributed = select(&run, "nvidia_gpu_xid_unattributed_errors_total", &[]);
    assert!(unattributed.is_empty(), "{text}");
}

/// A GPU that leaves enumeration within a boot (the count falls after a driver
/// reload) is reported down as not_enumerated, with its XID counters, under
/// the identity the state kept, run after run; the others keep theirs.
#[test]
fn a_gpu_that_leaves_enumeration_is_reported_down() {
    // The second GPU (index 1, bus 00000000:2A:00.0) is gone.
    let runs = after_a_healthy_run(
        "NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        without_the_second_gpu,
        2,
    );
    // Logged when it leaves, not again every run.
    let said: Vec<usize> = runs
        .iter()
        .map(|(_, _, stderr)| stderr.matches("is no longer enumerated").count())
        .collect();
    assert_eq!(said, [1, 0], "{runs:?}");
    for (status, text, _) in &runs {
        assert_eq!(*status, Some(4), "{text}");
        let samples = parsed(text);
        let gone = r#"{gpu="1",uuid="GPU-c41e7b92-6d30-4a8f-b1e5-7d09f2c6a354""#;
        for (series, want) in [
            (format!("nvidia_gpu_up{gone}}}"), 0.0),
            (
                format!(r#"nvidia_gpu_down_reason{gone},reason="not_enumerated"}}"#),
                1.0,
            ),
            (format!("nvidia_gpu_xid_errors_total{gone}}}"), 1.0),
        ] {
            assert_eq!(lookup(&samples, &series), Some(want), "{series}:\n{text}");
        }
        // The GPU now at index 1 is the old index 2, up, under its own UUID.
        let now = r#"nvidia_gpu_up{gpu="1",uuid="GPU-7e2d94a1-38c5-4f0b-a6d7-e51b0c83f926"}"#;
        assert_eq!(lookup(&samples, now), Some(1.0), "{text}");
        assert_eq!(select(&samples, "nvidia_gpu_up", &[]).len(), 8, "{text}");
        assert_promtool("not-enumerated", text);
    }
}

/// UNKNOWN from nvmlDeviceGetUUID (a transient error, not a lost GPU): the GPU
/// stays up with every reading a run without the fault has, the failed read
/// counted, and its UUID continues from the state (the previous run's). It is
/// never reported up with its readings dropped, nor down.
#[test]
fn a_uuid_read_failure_keeps_the_gpu_up_with_all_its_readings() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let run = |faults: bool| {
        let run = ex()
            .run("fault-uuid-error")
            .output_dir(dir.path())
            .state_dir(state.path());
        let run = if faults { run } else { run.faults_off() };
        let done = run.finish().unwrap();
        let samples = check_file(&done.path(), None).unwrap_or_else(|e| panic!("{done:?}: {e}"));
        (done, samples)
    };
    let (healthy, before) = run(false);
    healthy.assert_status(0);
    let (faulty, after) = run(true);
    faulty.assert_status(0);
    let mut want = gpus(&before).0["1"].clone();
    want.insert(Series::new("nvidia_gpu_collector_read_errors", &[]), 1.0);
    compare(&gpus(&after).0["1"], &want, "GPU 1").unwrap();
    compare(&gpus(&after).0["0"], &gpus(&before).0["0"], "GPU 0").unwrap();
    assert_eq!(uuid_of(&after, "1"), uuid_of(&before, "1"));
    assert!(uuid_of(&after, "1").is_some_and(|u| u.starts_with("GPU-")));
    assert!(faulty.err().contains("nvmlDeviceGetUUID"), "{faulty:?}");
}

/// A GPU whose UUID is not known (its read fails, the state knows none) and
/// two GPUs that read the same UUID publish no running totals: they could not
/// continue from run to run, or would overwrite each other's.
#[test]
fn gpus_without_an_identity_of_their_own_publish_no_totals() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = ex().edited("duty-cycle", dir.path(), "unknown", |t| {
        t.replacen(
            "[[gpu]]\n",
            "[[gpu]]\nerrors = { nvmlDeviceGetUUID = \"UNKNOWN\" }\n",
            1,
        )
    });
    let twins = ex().edited("duty-cycle", dir.path(), "twins", |t| {
        let gpu = &t[t.find("[[gpu]]").unwrap()..];
        let second = gpu.replace("00000000:19:00.0", "00000000:1A:00.0");
        format!("{t}\n{second}")
    });
    for scenario in [unknown, twins] {
        let state = tempfile::tempdir().unwrap();
        for n in 0..3 {
            let output = ex().stored_run(
                scenario.to_str().unwrap(),
                state.path(),
                T0 + n * 15 * SECOND,
                &[],
            );
            let text = String::from_utf8(output.stdout).unwrap();
            let samples = parsed(&text);
            let up = value(&samples, "nvidia_gpu_up", &[("gpu", "0")]);
            assert!(up.is_some(), "{text}");
            for family in [
                "nvidia_gpu_busy_seconds_total",
                "nvidia_gpu_sampled_seconds_total",
            ] {
                assert!(select(&samples, family, &[]).is_empty(), "{text}");
            }
            assert_promtool("no-own-identity", &text);
        }
    }
}

/// Two GPUs the state knows at one index (one left enumeration, the other took
/// its index) and the GPU there cannot be read: it is not given either's UUID,
/// and no GPU is said to have left while one cannot be told.
#[test]
fn an_index_two_known_gpus_share_tells_no_identity() {
    let seven = without_the_second_gpu;
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let run = |path: &Path| {
        let output = ex().journal_run(path.to_str().unwrap(), state.path(), journal.path());
        String::from_utf8(output.stdout).unwrap()
    };
    run(&ex().edited("h100x8", dir.path(), "healthy", |t| t));
    run(&ex().edited("h100x8", dir.path(), "seven", seven));
    // The GPU now at index 1 (GPU-7e2d…, formerly index 2) reads neither its
    // UUID nor its bus id.
    let text = run(&ex().edited("h100x8", dir.path(), "unreadable", |t| {
        let t = seven(t);
        let second = t.match_indices("[[gpu]]\n").nth(1).unwrap().0 + "[[gpu]]\n".len();
        format!(
            "{}errors = {{ nvmlDeviceGetUUID = \"UNKNOWN\", nvmlDeviceGetPciInfo_v3 = \"UNKNOWN\" }}\n{}",
            &t[..second],
            &t[second..]
        )
    }));
    let samples = parsed(&text);
    assert_eq!(
        lookup(&samples, r#"nvidia_gpu_up{gpu="1",uuid=""}"#),
        Some(1.0),
        "{text}"
    );
    let either = samples.iter().filter(|(s, v)| {
        s.label("uuid") == Some("GPU-c41e7b92-6d30-4a8f-b1e5-7d09f2c6a354") && **v == 1.0
    });
    assert_eq!(either.count(), 0, "{text}");
    assert!(!text.contains("not_enumerated"), "{text}");
}

/// Three runs of duty-cycle 10 s apart, the second with `errors` on its GPU:
/// the busy total keeps growing under the GPU's own UUID.
fn busy_counters_survive(errors: &str) {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let failing = fs::read_to_string(scenario("duty-cycle"))
        .unwrap()
        .replacen("[[gpu]]\n", &format!("[[gpu]]\n{errors}\n"), 1);
    let failing_path = dir.path().join("uuid-fails.toml");
    fs::write(&failing_path, failing).unwrap();
    let busy =
        |text: &str| value_in(text, "nvidia_gpu_busy_seconds_total", &[("engine", "gpu")]).unwrap();
    let first = ex().run_at("duty-cycle", state.path(), T0, &[]);
    let clock = (T0 + 10 * SECOND).to_string();
    let output = ex().run_args(
        "duty-cycle",
        state.path(),
        &["--stdout", "--write-state"],
        &[
            ("FAKE_NVML_SCENARIO", failing_path.to_str().unwrap()),
            ("FAKE_NVML_CLOCK_US", &clock),
        ],
    );
    let second = String::from_utf8(output.stdout).unwrap();
    let third = ex().run_at("duty-cycle", state.path(), T0 + 20 * SECOND, &[]);
    let own = "GPU-d0c7c1e5-5a1e-4b0d-9c3e-200000000001";
    let samples = parsed(&second);
    assert_eq!(uuid_of(&samples, "0").as_deref(), Some(own), "{second}");
    let engine = [("uuid", own), ("engine", "gpu")];
    let under_own = value(&samples, "nvidia_gpu_busy_seconds_total", &engine);
    assert!(under_own.is_some(), "{second}");
    assert!(
        busy(&second) > busy(&first),
        "{} then {}",
        busy(&first),
        busy(&second)
    );
    assert!(
        busy(&third) > busy(&second),
        "{} then {}",
        busy(&second),
        busy(&third)
    );
}

/// A healthy h100x8 run with a state directory, then a kernel line `xid` in
/// the journal and runs of h100x8 changed by `edit` (their exit statuses,
/// texts and standard errors, `runs` of them): how a GPU that fails after a
/// good run is reported.
fn after_a_healthy_run(
    xid: &str,
    edit: impl FnOnce(String) -> String,
    runs: usize,
) -> Vec<(Option<i32>, String, String)> {
    let (state, dir, journal) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let run = |scenario_file: &Path| {
        let output = ex().journal_run(
            scenario_file.to_str().unwrap(),
            state.path(),
            journal.path(),
        );
        (
            output.code(),
            String::from_utf8(output.stdout.clone()).unwrap(),
            output.err(),
        )
    };
    let healthy = ex().edited("h100x8", dir.path(), "healthy", |text| text);
    assert_eq!(run(&healthy).0, Some(0));
    write_journal(
        journal.path(),
        "system.journal",
        &journal_entry(5_000_000, "kernel", xid),
    );
    let failing = ex().edited("h100x8", dir.path(), "failing", edit);
    (0..runs).map(|_| run(&failing)).collect()
}
