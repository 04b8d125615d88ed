//! The real binary against the fake NVML (`tests/fake-nvml`), one scenario each.
//!
//! Golden files in `tests/golden/<case>.prom` are the exact output with the
//! values that change every run (durations, timestamp) replaced by `<duration>`
//! and `<timestamp>` after they were checked. `UPDATE_GOLDEN=1 cargo test`
//! rewrites them; review the diff line by line before committing.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use test_support::checks::{check_file, compare, gpus, uuid_of};
use test_support::golden;
use test_support::journal::{journal_entry, write_journal, XID79};
use test_support::{
    any_named, exposition, lookup, promtool, select, value, Calls, Exporter, Outcome, Samples,
    Series,
};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

mod command_line;
mod deadline;
mod families;
mod gpm;
mod identity;
mod nvlink;
mod nvml_faults;
mod processes;
mod publishing;
mod readings;
mod utilization;
mod xid;

/// The binary against the fake NVML, scenarios from tests/scenarios.
fn ex() -> &'static Exporter {
    static EXPORTER: std::sync::OnceLock<Exporter> = std::sync::OnceLock::new();
    EXPORTER.get_or_init(|| Exporter::beside(EXE, ROOT))
}

/// The fake NVML, built next to the binary by `cargo build -p fake-nvml`.
fn fake_nvml() -> PathBuf {
    ex().lib.clone()
}

fn scenario(name: &str) -> PathBuf {
    ex().scenario(name)
}

fn exporter(scenario_name: &str, args: &[&str]) -> Outcome {
    let state = tempfile::tempdir().unwrap();
    exporter_with_state(scenario_name, state.path(), args, &[])
}

/// Runs the exporter with the state directory `state` (each test its own, so
/// that no run sees another test's state), and extra environment `env`.
/// `--stdout` and `--output-dir DIR` in `args` choose where the file goes;
/// without either it goes to a temporary directory.
fn exporter_with_state(
    scenario_name: &str,
    state: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Outcome {
    let mut run = ex().run(scenario_name).state_dir(state);
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        run = match *arg {
            "--stdout" => run.stdout(),
            "--output-dir" => run.output_dir(*rest.next().expect("--output-dir DIR")),
            arg => run.arg(arg),
        };
    }
    for (key, value) in env {
        run = run.env(key, value);
    }
    run.finish().expect("run the exporter")
}

fn golden_dir() -> PathBuf {
    Path::new(ROOT).join("tests/golden")
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `promtool check metrics` must print nothing and succeed.
fn promtool_check(case: &str, text: &str) {
    if let Err(said) = promtool(text.as_bytes()) {
        panic!("{case}: promtool: {said}");
    }
}

/// Runs `scenario` with `--stdout` and checks exit status, stderr, strict
/// parsing, promtool and the golden file; returns the normalized text.
fn golden_case(case: &str, scenario_name: &str, args: &[&str], status: i32) -> (String, Samples) {
    let started = now();
    let mut all_args = vec!["--stdout"];
    all_args.extend_from_slice(args);
    let output = exporter(scenario_name, &all_args);
    let finished = now();
    let stderr = output.err();
    assert_eq!(output.code(), Some(status), "{case}: {stderr}");
    if status == 0 {
        assert!(stderr.is_empty(), "{case}: a healthy run printed {stderr}");
    }
    if let Err(e) = output.parsed() {
        panic!("{case}: {e}");
    }
    promtool_check(case, &output.text());
    let normalized = golden::normalize(&output.stdout, started, finished);
    golden::check(&golden_dir(), case, &normalized);
    (String::from_utf8(normalized).unwrap(), output.samples())
}

/// The series that belong to a GPU (have a `gpu` label).
fn device_series(samples: &Samples) -> Vec<&Series> {
    samples
        .keys()
        .filter(|s| s.label("gpu").is_some())
        .collect()
}

/// The samples of a complete file.
fn parsed(text: &str) -> Samples {
    exposition::parse(text).unwrap_or_else(|e| panic!("{e}:\n{text}"))
}

fn bad_input(args: &[&str], status: i32, message: &str) {
    let output = Command::new(EXE).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(status), "{args:?}: {stderr}");
    let first = stderr.lines().next().unwrap_or("");
    assert!(first.contains(message), "{args:?}: first line {first:?}");
    assert!(output.stdout.is_empty());
}

/// `demo-h100x8` (Hopper, both power fields and an idle encoder as NVML
/// answers them without NVENC) with `edit` applied, written to `dir/name.toml`.
fn demo_h100x8_with(dir: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = fs::read_to_string(scenario("demo-h100x8")).unwrap();
    let path = dir.join(format!("{name}.toml"));
    fs::write(&path, edit(text)).unwrap();
    path
}

/// One run of `scenario_path` at the fixed clock, without GPM (not needed
/// here, and its window would slow the test): its text and the NVML calls it
/// made.
fn run_without_gpm(scenario_path: &Path, state: &Path) -> (String, Calls) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let text = run_at_with(
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
                value_of(text, "nvidia_gpu_collector_read_errors", &[("gpu", &gpu)]).unwrap()
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
    let same_driver = demo_h100x8_with(
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
        &demo_h100x8_with(dir.path(), "healthy", |t| t),
        state.path(),
    );
    let (text, calls) = run_without_gpm(&same_driver, state.path());
    assert_eq!(errors(&text), 0.0, "{text}");
    assert_eq!(calls.total(symbol), 0, "{calls:?}");
    // A new driver forgets it: read again, and the fault is seen.
    let new_driver = demo_h100x8_with(
        dir.path(),
        "new-driver",
        failing("driver_version = \"580.65.06\""),
    );
    let (again, calls) = run_without_gpm(&new_driver, state.path());
    assert_eq!(errors(&again), 8.0 * per_gpu);
    assert_eq!(calls.total(symbol) as f64, 8.0 * per_gpu, "{calls:?}");
    text
}

/// The exit status a run of `scenario_name` with only `collector` must have:
/// 3 where NVML is unusable, 4 where a GPU is down (in fault-lost-midread only
/// when the collector makes the call that finds it lost: the temperature, read
/// by `thermal`), else 0.
fn expected_status(scenario_name: &str, collector: &str) -> i32 {
    match scenario_name {
        "fault-device-count" => 3,
        s if s.starts_with("init-") => 3,
        "lost-gpu" | "fault-handle-error" => 4,
        "fault-lost-midread" if collector == "thermal" => 4,
        _ => 0,
    }
}

/// A `--stdout` run of `scenario_name` (a name or a path) with the state in
/// `state` (read and stored) and the journal files in `journal`.
fn journal_run(scenario_name: &str, state: &Path, journal: &Path) -> Outcome {
    ex().run(scenario_name)
        .stdout()
        .state_dir(state)
        .journal_dir(journal)
        .arg("--write-state")
        .finish()
        .expect("run the exporter")
}

/// The XID series of one run with their values.
fn xid_run(state: &Path, journal: &Path) -> Samples {
    let output = journal_run("h100x8", state, journal);
    assert!(
        output.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut samples = output.samples();
    samples.retain(|s, _| s.name.starts_with("nvidia_gpu_xid_"));
    samples
}

/// GPU 0 of h100x8 is at 00000000:18:00.0, GPU 1 at 00000000:2A:00.0.
const GPU0: (&str, &[(&str, &str)]) = ("nvidia_gpu_xid_errors_total", &[("gpu", "0")]);

const GPU1: (&str, &[(&str, &str)]) = ("nvidia_gpu_xid_errors_total", &[("gpu", "1")]);

const GPU0_79: (&str, &[(&str, &str)]) = (
    "nvidia_gpu_xid_errors_by_code_total",
    &[
        ("gpu", "0"),
        ("uuid", "GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"),
        ("code", "79"),
    ],
);

/// The value of one XID series of a run.
fn xids(run: &Samples, (name, labels): (&str, &[(&str, &str)])) -> Option<f64> {
    value(run, name, labels)
}

/// One run of `scenario_name` at the fake NVML clock `clock_us` with the state
/// directory `state` (read and stored); checks it succeeded and returns its text.
fn run_at(scenario_name: &str, state: &Path, clock_us: u64, args: &[&str]) -> String {
    run_at_with(scenario_name, state, clock_us, args, &[])
}

/// [`run_at`] with the extra environment `env`.
fn run_at_with(
    scenario_name: &str,
    state: &Path,
    clock_us: u64,
    args: &[&str],
    env: &[(&str, &str)],
) -> String {
    let clock = clock_us.to_string();
    let mut all_args = vec!["--stdout", "--write-state"];
    all_args.extend_from_slice(args);
    let mut all_env = vec![("FAKE_NVML_CLOCK_US", clock.as_str())];
    all_env.extend_from_slice(env);
    let output = exporter_with_state(scenario_name, state, &all_args, &all_env);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.code(), Some(0), "{stderr}");
    let text = String::from_utf8(output.stdout).unwrap();
    promtool_check(scenario_name, &text);
    text
}

/// The value of the one sample of `name` whose labels include `labels`.
fn value_of(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    value(&parsed(text), name, labels)
}

/// Busy and sampled seconds of the GPU engine, and its utilization ratio.
fn window_of(text: &str) -> (f64, f64, Option<f64>) {
    let engine = &[("engine", "gpu")];
    (
        value_of(text, "nvidia_gpu_busy_seconds_total", engine).expect("busy"),
        value_of(text, "nvidia_gpu_sampled_seconds_total", engine).expect("sampled"),
        value_of(text, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]),
    )
}

/// A time (µs) at a 2 s boundary, so that a busy second starts there.
const T0: u64 = 1_750_000_000_000_000;

const SECOND: u64 = 1_000_000;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
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
        |text: &str| value_of(text, "nvidia_gpu_busy_seconds_total", &[("engine", "gpu")]).unwrap();
    let first = run_at("duty-cycle", state.path(), T0, &[]);
    let clock = (T0 + 10 * SECOND).to_string();
    let output = exporter_with_state(
        "duty-cycle",
        state.path(),
        &["--stdout", "--write-state"],
        &[
            ("FAKE_NVML_SCENARIO", failing_path.to_str().unwrap()),
            ("FAKE_NVML_CLOCK_US", &clock),
        ],
    );
    let second = String::from_utf8(output.stdout).unwrap();
    let third = run_at("duty-cycle", state.path(), T0 + 20 * SECOND, &[]);
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

/// h100x8 with `edit` applied, as a scenario file in `dir`.
fn edited_scenario(dir: &Path, name: &str, edit: impl FnOnce(String) -> String) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    fs::write(&path, edit(fs::read_to_string(scenario("h100x8")).unwrap())).unwrap();
    path
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
        let output = journal_run(
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
    let healthy = edited_scenario(dir.path(), "healthy", |text| text);
    assert_eq!(run(&healthy).0, Some(0));
    write_journal(
        journal.path(),
        "system.journal",
        &journal_entry(5_000_000, "kernel", xid),
    );
    let failing = edited_scenario(dir.path(), "failing", edit);
    (0..runs).map(|_| run(&failing)).collect()
}

/// A fresh output directory holding the file of a successful run of
/// `scenario_name` (without its faults when `faults_off`), and the state
/// directory that run wrote.
fn seeded(scenario_name: &str, faults_off: bool) -> (tempfile::TempDir, tempfile::TempDir) {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let run = ex()
        .run(scenario_name)
        .output_dir(dir.path())
        .state_dir(state.path());
    let run = if faults_off { run.faults_off() } else { run };
    run.finish().unwrap().assert_status(0);
    (dir, state)
}

/// What `scenario_name` gives without its faults (`--stdout`).
fn baseline(scenario_name: &str) -> Samples {
    let run = ex()
        .run(scenario_name)
        .stdout()
        .faults_off()
        .finish()
        .unwrap();
    run.assert_status(0);
    run.samples()
}

/// A copy of the fake NVML in `dir` for which `dlsym` fails for `symbols`.
fn fake_without(dir: &Path, symbols: &[&str]) -> PathBuf {
    let lib = dir.join(format!("libfake_nvml-without-{}.so", symbols.join("-")));
    test_support::library_without(&fake_nvml(), symbols, "nvmlShutdown", &lib).unwrap();
    lib
}

/// duty-cycle with `edit` applied, as a scenario file in `dir`.
fn duty_cycle_with(dir: &Path, name: &str, edit: impl FnOnce(String) -> String) -> String {
    let path = dir.join(format!("{name}.toml"));
    fs::write(
        &path,
        edit(fs::read_to_string(scenario("duty-cycle")).unwrap()),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// One run at the fake clock `clock_us` with the state in `state`, stored.
fn stored_run(scenario: &str, state: &Path, clock_us: u64, args: &[&str]) -> Outcome {
    let mut all = vec!["--stdout", "--write-state", "--gpm-window", "0"];
    all.extend_from_slice(args);
    exporter_with_state(
        scenario,
        state,
        &all,
        &[("FAKE_NVML_CLOCK_US", &clock_us.to_string())],
    )
}

/// The system clock in µs, on the 2 s grid of duty-cycle's sample pattern.
fn now_on_the_sample_grid() -> u64 {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    now_us / (2 * SECOND) * (2 * SECOND)
}

/// A scenario's text without its second GPU (index 1): what NVML lists after
/// a driver reload without that GPU.
fn without_the_second_gpu(text: String) -> String {
    let starts: Vec<usize> = text.match_indices("[[gpu]]\n").map(|(i, _)| i).collect();
    format!("{}{}", &text[..starts[1]], &text[starts[2]..])
}

/// A scenario file written from `name`'s text with each `(from, to)` replaced
/// (each must occur), in `dir`.
fn scenario_edited(dir: &Path, name: &str, edits: &[(&str, &str)]) -> String {
    let mut text = fs::read_to_string(scenario(name)).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{name} lacks {from}");
        text = text.replace(from, to);
    }
    let path = dir.join(format!("{name}-edited.toml"));
    fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The value of the series `name` with `labels` of GPU `gpu`.
fn gpu_value(samples: &Samples, name: &str, gpu: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut all = vec![("gpu", gpu)];
    all.extend_from_slice(labels);
    test_support::exposition::value(samples, name, &all)
}
