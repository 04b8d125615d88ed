//! Recordings of real NVML (tests/captures, made by tests/nvml-capture on the
//! GPU machine) replayed by the fake: the exporter's output on each is a
//! golden file, and what a real GPU answers is held against what the
//! exporter makes of it. The capture tool itself is checked by capturing the
//! fake: a replay of a capture reads what the original scenario reads, and
//! the tool asks for field values in the exporter's own calls.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use test_support::exposition::{parse, value, Samples};
use test_support::{golden, Calls, Exporter, Outcome};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn ex() -> &'static Exporter {
    static EXPORTER: OnceLock<Exporter> = OnceLock::new();
    EXPORTER.get_or_init(|| Exporter::beside(EXE, ROOT))
}

fn captures() -> PathBuf {
    Path::new(ROOT).join("tests/captures")
}

/// The capture tool, built beside the binary.
fn capture_tool() -> PathBuf {
    let tool = Path::new(EXE).with_file_name("nvml-capture");
    assert!(
        tool.exists(),
        "{} is missing: build it with `cargo build -p nvml-capture` (make test does)",
        tool.display()
    );
    tool
}

/// One `--stdout` run of `scenario` (a path) with `args`.
fn snapshot(scenario: &Path, args: &[&str]) -> Outcome {
    ex().run(scenario.to_str().unwrap())
        .stdout()
        .args(args)
        .finish()
        .expect("run the exporter")
}

/// The run's file, parsed, without the values that are the run's own.
fn steady_file(output: &Outcome) -> Samples {
    steady(parse(&String::from_utf8_lossy(&output.stdout)).unwrap())
}

/// The families whose value is the run's own (its time and durations).
const VOLATILE: [&str; 4] = [
    "nvidia_gpu_collector_duration_seconds",
    "nvidia_gpu_collector_timestamp_seconds",
    "nvidia_gpu_collector_step_duration_seconds",
    "nvidia_gpu_gpm_window_seconds",
];

fn steady(samples: Samples) -> Samples {
    samples
        .into_iter()
        .filter(|(series, _)| !VOLATILE.contains(&series.name.as_str()))
        .collect()
}

/// A capture of the fake, replayed with every collector on, reads what the
/// scenario reads.
#[test]
fn a_capture_of_the_fake_replays_what_the_scenario_reads() {
    let temp = tempfile::tempdir().unwrap();
    // Not h100-mig: the tool does not capture MIG devices (no MIG GPU has
    // been lent to record one; that scenario follows the NVML reference).
    for scenario in [
        "h100x8",
        "geforce",
        "duty-cycle",
        "lost-gpu",
        "hgx-h100-fabric",
        "gb200-nvl72",
        "b200",
        "gh200",
        "pcie-trained-low",
    ] {
        let original = ex().scenario(scenario);
        let captured = Command::new(capture_tool())
            .args(["--lib", ex().lib.to_str().unwrap(), "--gpm-window-ms", "1"])
            .arg(format!("a capture of {scenario}"))
            .env("FAKE_NVML_SCENARIO", &original)
            .output()
            .unwrap();
        assert!(captured.status.success(), "{scenario}: {captured:?}");
        let path = temp.path().join(format!("{scenario}.toml"));
        std::fs::write(&path, &captured.stdout).unwrap();
        let mut args = every_collector();
        args.extend(["--gpm-window", "100ms"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (expected, replayed) = (snapshot(&original, &args), snapshot(&path, &args));
        assert_eq!(expected.status, replayed.status, "{scenario}");
        let (expected, replayed) = (steady_file(&expected), steady_file(&replayed));
        let differ: Vec<String> = expected
            .iter()
            .filter(|(series, v)| replayed.get(*series) != Some(*v))
            .map(|(series, v)| format!("{series:?}: {v} → {:?}", replayed.get(series)))
            .chain(
                replayed
                    .keys()
                    .filter(|series| !expected.contains_key(*series))
                    .map(|series| format!("{series:?} only in the replay")),
            )
            .collect();
        assert!(differ.is_empty(), "{scenario}:\n{}", differ.join("\n"));
    }
}

/// `--collector NAME` for every collector that is off by default.
fn every_collector() -> Vec<String> {
    let listing = Command::new(EXE)
        .args(["--generate", "collectors"])
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    let off = listing.lines().filter_map(|line| {
        let mut columns = line.split('\t');
        let name = columns.next()?;
        (columns.next()? == "off").then_some(name)
    });
    let args: Vec<String> = off
        .flat_map(|name| ["--collector", name])
        .map(String::from)
        .collect();
    assert!(args.len() >= 8, "{listing}");
    args
}

/// The capture tool asks for the field values in the exporter's own calls:
/// on each GPU of each scenario, its `nvmlDeviceGetFieldValues` calls ask,
/// in order, what the exporter's run with every collector on and no state
/// (the readings kept once per driver are taken) asks: the per-GPU batch,
/// the thermal margin thresholds and the NVLink 5 probe alone, the per-link
/// batches, the same field ids (as the driver numbers them), scopes and sizes.
#[test]
fn a_capture_asks_for_the_fields_in_the_exporters_own_calls() {
    let every = every_collector();
    let temp = tempfile::tempdir().unwrap();
    // NVLink: Hopper's 18 links and their count field (h100x8, hgx-h100-fabric),
    // NVLink 5 (gb200-nvl72, b200), 4 links read from their fields
    // (nvlink-fields), links counted by probing (fault-duplicates); none
    // (geforce and the H200 captures); MIG (h100-mig).
    let scenarios = [
        "h100x8",
        "geforce",
        "duty-cycle",
        "hgx-h100-fabric",
        "gb200-nvl72",
        "b200",
        "gh200",
        "pcie-trained-low",
        "nvlink-fields",
        "fields-preferred",
        "fault-duplicates",
        "h100-mig",
    ];
    let captured = ["h200-idle", "h200-load", "h100-idle", "h100-load"]
        .map(|c| captures().join(format!("{c}.toml")));
    let paths = scenarios
        .map(|s| ex().scenario(s))
        .into_iter()
        .chain(captured);
    for (n, path) in paths.enumerate() {
        let (exporter_log, capture_log) = (
            temp.path().join(format!("{n}.exporter")),
            temp.path().join(format!("{n}.capture")),
        );
        let run = ex()
            .run(path.to_str().unwrap())
            .stdout()
            .args(&every)
            .args(["--gpm-window", "100ms"])
            .call_log(&exporter_log)
            .finish()
            .unwrap();
        assert!(run.success(), "{}: {}", path.display(), run.err());
        let capture = Command::new(capture_tool())
            .args(["--lib", ex().lib.to_str().unwrap(), "--gpm-window-ms", "1"])
            .arg("a capture")
            .env("FAKE_NVML_SCENARIO", &path)
            .env("FAKE_NVML_CALL_LOG", &capture_log)
            .output()
            .unwrap();
        assert!(capture.status.success(), "{}: {capture:?}", path.display());
        let (exporter, capture) = (Calls::read(&exporter_log), Calls::read(&capture_log));
        let devices = |calls: &Calls| -> BTreeSet<String> {
            let fields = calls.0.iter().filter(|c| c.0 == "nvmlDeviceGetFieldValues");
            fields.map(|c| c.1.clone()).collect()
        };
        assert_eq!(devices(&exporter), devices(&capture), "{}", path.display());
        assert!(!devices(&exporter).is_empty(), "{}", path.display());
        for device in devices(&exporter) {
            let (asked, captured) = (
                exporter.field_batches(&device),
                capture.field_batches(&device),
            );
            let sizes = |batches: &[Vec<&str>]| batches.iter().map(Vec::len).collect::<Vec<_>>();
            assert!(
                asked == captured,
                "{} GPU {device}: the exporter asked batches of {:?} fields, the capture {:?}\n{asked:?}\n{captured:?}",
                path.display(),
                sizes(&asked),
                sizes(&captured),
            );
        }
    }
}

/// A capture replayed with `args`: a healthy run (status 0, nothing on
/// stderr), promtool-clean, its golden file `tests/golden/<capture>.prom`.
fn replay(capture: &str, args: &[&str]) -> Samples {
    let path = captures().join(format!("{capture}.toml"));
    golden::case(ex(), capture, path.to_str().unwrap(), args, 0).1
}

#[test]
fn the_idle_h200_replays_its_golden_file() {
    let samples = replay("h200-idle", &["--gpm-window", "100ms"]);
    let gpu = [("gpu", "0")];
    let utilization = value(&samples, "nvidia_gpu_utilization_ratio", &gpu).unwrap();
    assert!(utilization < 0.05, "{utilization}");
    assert_eq!(value(&samples, "nvidia_gpu_up", &gpu), Some(1.0));
}

/// The H100 captured with the exporter's own field calls (driver 580.159.04):
/// its replay holds every field the exporter asks for, those the one large
/// batch of the H200's capture lost among them (fields 193 and 194, the
/// thermal margin thresholds, are asked alone).
#[test]
fn the_h100_captures_replay_their_golden_files() {
    let samples = replay("h100-idle", &["--gpm-window", "100ms"]);
    let gpu = [("gpu", "0")];
    assert_eq!(value(&samples, "nvidia_gpu_up", &gpu), Some(1.0));
    let margin = "nvidia_gpu_temperature_margin_threshold_celsius";
    assert!(samples.keys().any(|s| s.name == margin), "no {margin}");
    let loaded = replay(
        "h100-load",
        &["--gpm-window", "100ms", "--collector", "processes"],
    );
    let utilization = value(&loaded, "nvidia_gpu_utilization_ratio", &gpu).unwrap();
    assert!(utilization > 0.05, "{utilization}");
}

/// The pid of the one process in the loaded H200's capture (the load).
fn load_pid() -> String {
    let capture = std::fs::read_to_string(captures().join("h200-load.toml")).unwrap();
    let listed = capture.split_once("processes = [{ pid = ").unwrap().1;
    listed.split(',').next().unwrap().to_owned()
}

/// The H200 answers `nvmlDeviceGetProcessUtilization` with one entry per
/// process, its mean over the window asked for: the load alone on the GPU
/// reads what the GPU reads, to NVML's whole percent.
#[test]
fn a_process_alone_on_the_loaded_h200_reads_its_gpus_utilization() {
    let args = ["--collector", "processes", "--gpm-window", "100ms"];
    let samples = replay("h200-load", &args);
    let gpu = value(&samples, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]).unwrap();
    let pid = load_pid();
    let process = value(
        &samples,
        "nvidia_gpu_process_utilization_ratio",
        &[("gpu", "0"), ("pid", &pid)],
    )
    .unwrap();
    assert!(gpu > 0.2, "the load shows: {gpu}");
    assert!(
        (process - gpu).abs() <= 0.01,
        "process {process}, GPU {gpu}"
    );
}

/// A process that used the GPU in the window and exited before the run (in
/// NVML's utilization answer, no longer in its process list) keeps its share:
/// the processes still add up to the GPU.
#[test]
fn a_process_gone_by_the_run_keeps_its_share_of_the_window() {
    let capture = std::fs::read_to_string(captures().join("h200-load.toml")).unwrap();
    let whole_buffer = capture
        .lines()
        .find(|l| l.trim_start().starts_with("{ last_seen_us = 0,"))
        .unwrap();
    let fields: Vec<&str> = whole_buffer.split(", ").collect();
    let (stamp, sm): (u64, u64) = (fields[2].parse().unwrap(), fields[3].parse().unwrap());
    // The load's share split between it and a process that has exited.
    let split = whole_buffer
        .replace(&format!(", {sm}, "), ", 22, ")
        .replace(
            "]] },",
            &format!("], [999, {stamp}, {}, 0, 0, 0]] }},", sm - 22),
        );
    let temp = tempfile::tempdir().unwrap();
    let path = temp.path().join("exited.toml");
    std::fs::write(&path, capture.replace(whole_buffer, &split)).unwrap();
    let output = snapshot(
        &path,
        &["--collector", "processes", "--gpm-window", "100ms"],
    );
    assert_eq!(
        output.status,
        0,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let samples = steady_file(&output);
    let share = |pid| {
        value(
            &samples,
            "nvidia_gpu_process_utilization_ratio",
            &[("gpu", "0"), ("pid", pid)],
        )
    };
    let pid = load_pid();
    assert_eq!(share(&pid), Some(0.22));
    assert_eq!(share("999"), Some((sm - 22) as f64 / 100.0));
    let gpu = value(&samples, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]).unwrap();
    assert!(
        (0.22 + (sm - 22) as f64 / 100.0 - gpu).abs() <= 0.01,
        "{gpu}"
    );
}
