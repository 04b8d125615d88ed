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
use test_support::{exposition, promtool, select, value, Exporter, Outcome, Samples, Series};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

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

/// What each golden case shows.
#[test]
fn h100x8_healthy_every_gpu_complete() {
    let (text, _) = golden_case("h100x8", "h100x8", &[], 0);
    for gpu in 0..8 {
        assert!(
            text.contains(&format!("nvidia_gpu_up{{gpu=\"{gpu}\",")),
            "gpu {gpu}"
        );
    }
    assert!(text.contains("nvidia_gpu_collector_up 1\n"));
    assert!(!text.contains("nvidia_gpu_collector_error{"));
    assert_eq!(
        text.matches("# TYPE nvidia_gpu_energy_joules_total counter\n")
            .count(),
        1
    );
    // The small families, with the scenario's raw values in base units.
    let id = "gpu=\"7\",uuid=\"GPU-94f06ad3-7b1c-4e3f-85a2-1d8e4c9b0f67\"";
    for series in [
        format!("nvidia_gpu_jpeg_utilization_ratio{{{id}}} 0.31\n"),
        format!("nvidia_gpu_ofa_utilization_ratio{{{id}}} 0\n"),
        format!("nvidia_gpu_temperature_margin_celsius{{{id}}} 26\n"),
        format!("nvidia_gpu_power_instant_watts{{{id}}} 451.342\n"),
    ] {
        assert!(text.contains(&series), "missing {series}");
    }
    // GPM on every GPU: percentages as ratios, eight pipes, the window.
    assert_eq!(text.matches("nvidia_gpu_sm_active_ratio{").count(), 8);
    assert_eq!(text.matches("nvidia_gpu_pipe_active_ratio{").count(), 8 * 8);
    assert_eq!(text.matches("nvidia_gpu_gpm_window_seconds{").count(), 8);
    assert!(text.contains("nvidia_gpu_sm_active_ratio{gpu=\"7\",uuid=\"GPU-94f06ad3-7b1c-4e3f-85a2-1d8e4c9b0f67\"} 0.008\n"));
    assert!(text.contains(",pipe=\"tensor\"} 0.643\n"));
}

#[test]
fn geforce_unsupported_fields_are_absent_not_zero() {
    let (text, _) = golden_case("geforce", "geforce", &[], 0);
    assert!(
        !text.contains("nvidia_gpu_ecc_"),
        "ECC on a card without ECC"
    );
    assert!(!text.contains("nvidia_gpu_nvlink_"));
    // The info series keeps one label set: an unsupported serial is empty.
    assert!(text.contains(",serial=\"\","));
    assert!(text.contains("nvidia_gpu_fan_speed_ratio{"));
    // No GPM before Hopper, and nothing says it is missing.
    assert!(!text.contains("_active_ratio") && !text.contains("nvidia_gpu_gpm_"));
}

#[test]
fn lost_gpu_reported_down_others_complete() {
    let (text, samples) = golden_case("lost-gpu", "lost-gpu", &[], 4);
    assert!(text.contains("nvidia_gpu_up{gpu=\"2\",uuid=\"\"} 0\n"));
    assert!(text.contains("nvidia_gpu_down_reason{gpu=\"2\",uuid=\"\",reason=\"gpu_lost\"} 1\n"));
    let gpu2: Vec<_> = device_series(&samples)
        .into_iter()
        .filter(|s| s.label("gpu") == Some("2"))
        .collect();
    assert_eq!(
        gpu2.len(),
        2,
        "only up and down_reason for the lost GPU: {gpu2:?}"
    );
    for gpu in [0, 1, 3] {
        assert!(text.contains(&format!("nvidia_gpu_power_watts{{gpu=\"{gpu}\"")));
    }
    assert!(text.contains("nvidia_gpu_collector_up 1\n"));
}

#[test]
fn mig_devices_listed_under_their_parent() {
    let (text, _) = golden_case("h100-mig", "h100-mig", &[], 0);
    assert_eq!(text.matches("nvidia_gpu_mig_info{").count(), 3);
    for profile in ["3g.40gb", "2g.20gb", "1g.10gb"] {
        assert!(
            text.contains(&format!(",profile=\"{profile}\"}} 1\n")),
            "{profile}"
        );
    }
    assert_eq!(text.matches("nvidia_gpu_mig_memory_free_bytes{").count(), 3);
    assert_eq!(
        text.matches("nvidia_gpu_mig_memory_reserved_bytes{")
            .count(),
        3
    );
    assert!(text.contains("nvidia_gpu_mig_enabled{gpu=\"0\""));
    // GPM per GPU instance, labelled like the other MIG series.
    for (gi, sm_active) in [("2", "0.855"), ("3", "0.27399999999999997"), ("9", "0")] {
        assert!(
            text.contains(&format!(
                "nvidia_gpu_mig_sm_active_ratio{{gpu=\"0\",uuid=\"GPU-a7c3e915-2f4d-4b80-9e16-c5d8b2f07a43\",gpu_instance_id=\"{gi}\"}} {sm_active}\n"
            )),
            "GPU instance {gi}"
        );
    }
    assert_eq!(
        text.matches("nvidia_gpu_mig_pipe_active_ratio{").count(),
        3 * 8
    );
    // The whole GPU answers no GPM metric in MIG mode (in this scenario).
    assert!(!text.contains("nvidia_gpu_sm_active_ratio{"));
}

#[test]
fn init_failures_write_only_collector_metrics_with_reason() {
    for (scenario_name, reason) in [
        ("init-driver-not-loaded", "driver_not_loaded"),
        ("init-no-permission", "no_permission"),
        ("init-lib-rm-version-mismatch", "driver_library_mismatch"),
        ("init-unknown", "unknown"),
    ] {
        let (text, samples) = golden_case(scenario_name, scenario_name, &[], 3);
        assert!(
            text.contains("nvidia_gpu_collector_up 0\n"),
            "{scenario_name}"
        );
        assert!(
            text.contains(&format!(
                "nvidia_gpu_collector_error{{reason=\"{reason}\"}} 1\n"
            )),
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
    let started = now();
    let output = ex()
        .run("h100x8")
        .stdout()
        .lib("/nonexistent/libnvidia-ml.so.1")
        .finish()
        .unwrap();
    assert_eq!(output.code(), Some(3));
    let text = golden::normalize(&output.stdout, started, now());
    golden::check(&golden_dir(), "library-not-found", &text);
    assert!(output.err().contains("container toolkit"));
}

#[test]
fn collectors_can_be_switched() {
    let (text, _) = golden_case(
        "h100x8-minimal",
        "h100x8",
        &[
            "--no-collector",
            "nvlink",
            "--no-collector",
            "clocks",
            "--no-collector",
            "health",
        ],
        0,
    );
    assert!(!text.contains("nvidia_gpu_nvlink_"));
    assert!(!text.contains("nvidia_gpu_clock_hertz"));
    assert!(!text.contains("nvidia_gpu_ecc_"));
    assert!(text.contains("nvidia_gpu_power_watts"));
}

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

#[test]
fn processes_are_attributed_from_procfs() {
    let procfs = tempfile::tempdir().unwrap();
    let docker = "4f".repeat(32);
    for (pid, comm, uid, cgroup) in [
        (
            "301122",
            "python",
            "0",
            "0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0\n".to_string(),
        ),
        (
            "301123",
            "tricky\"comm\\",
            "65534",
            format!("0::/system.slice/docker-{docker}.scope\n"),
        ),
    ] {
        let dir = procfs.path().join(pid);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        fs::write(
            dir.join("status"),
            format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .unwrap();
        fs::write(dir.join("cgroup"), cgroup).unwrap();
    }
    let procfs_arg = procfs.path().to_str().unwrap();
    let output = exporter(
        "h100x8",
        &[
            "--stdout",
            "--collector",
            "processes",
            "--procfs",
            procfs_arg,
        ],
    );
    assert_eq!(output.code(), Some(0));
    let text = String::from_utf8(output.stdout).unwrap();
    promtool_check("processes", &text);
    let line = |pid: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("nvidia_gpu_process_memory_used_bytes{")
                    && l.contains(&format!("pid=\"{pid}\""))
            })
            .unwrap_or_else(|| panic!("no series for pid {pid}:\n{text}"))
            .to_owned()
    };
    let slurm = line("301122");
    assert!(
        slurm.contains(
            "comm=\"python\",user=\"root\",systemd_unit=\"slurmstepd.scope\",slurm_job_id=\"4711\""
        ),
        "{slurm}"
    );
    assert!(slurm.ends_with("} 77842087936"), "{slurm}");
    let container = line("301123");
    assert!(
        container.contains("comm=\"tricky\\\"comm\\\\\""),
        "{container}"
    );
    assert!(
        container.contains(&format!("container_id=\"{docker}\"")),
        "{container}"
    );
    // A pid with no /proc entry (another pid namespace, or gone) keeps only its pid.
    let gone = line("77310");
    assert!(gone.contains("pid=\"77310\"} "), "{gone}");
}

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
    assert!(text.contains("nvidia_gpu_collector_up 1\n"));
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".nvidia_gpu.prom.lock", "nvidia_gpu.prom"]);
}

fn bad_input(args: &[&str], status: i32, message: &str) {
    let output = Command::new(EXE).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(status), "{args:?}: {stderr}");
    let first = stderr.lines().next().unwrap_or("");
    assert!(first.contains(message), "{args:?}: first line {first:?}");
    assert!(output.stdout.is_empty());
}

#[test]
fn bad_command_lines_are_refused_clearly() {
    bad_input(&["--frobnicate"], 2, "unexpected argument '--frobnicate'");
    bad_input(
        &["--timeout", "soon"],
        2,
        "invalid value 'soon' for '--timeout",
    );
    bad_input(&["--timeout", "0s"], 2, "must be longer than zero");
    bad_input(&["--timeout", "1h"], 2, "must be at most 5m");
    bad_input(&["--output-file", "gpu.txt"], 2, "must end in .prom");
    bad_input(
        &["--output-file", "../x.prom"],
        2,
        "must be a file name, not a path",
    );
    bad_input(
        &["--output-file", ".hidden.prom"],
        2,
        "must not start with '.'",
    );
    bad_input(
        &["--no-collector", "everything"],
        2,
        "invalid value 'everything'",
    );
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
fn help_documents_exit_statuses_and_version_prints() {
    let help = Command::new(EXE).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8(help.stdout).unwrap();
    for needle in [
        "Exit status:",
        "  5  the run did not finish within --timeout",
        "--output-dir",
        "--no-collector",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}");
    }
    let version = Command::new(EXE).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8(version.stdout).unwrap(),
        format!("nvidia-textfile-exporter {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn lost_gpu_keeps_the_uuid_it_had() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let state = dir.path().join("state");
    // A healthy run (the same scenario without its faults) lets the state
    // learn every GPU's identity.
    let healthy = exporter_with_state(
        "lost-gpu",
        &state,
        &["--output-dir", out],
        &[("FAKE_NVML_FAULTS", "off")],
    );
    assert_eq!(healthy.code(), Some(0), "{healthy:?}");
    let text = fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap();
    let uuid = text
        .lines()
        .find_map(|l| l.strip_prefix("nvidia_gpu_up{gpu=\"2\",uuid=\""))
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    assert!(
        text.contains("nvidia_gpu_collector_state_ok 0\n"),
        "first run: {text}"
    );
    // Then GPU 2 is lost, twice in a row: it keeps its UUID both times.
    for run in 1..=2 {
        let output = exporter_with_state("lost-gpu", &state, &["--output-dir", out], &[]);
        assert_eq!(output.code(), Some(4), "run {run}");
        let text = fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap();
        for series in [
            format!("nvidia_gpu_up{{gpu=\"2\",uuid=\"{uuid}\"}} 0\n"),
            format!("nvidia_gpu_down_reason{{gpu=\"2\",uuid=\"{uuid}\",reason=\"gpu_lost\"}} 1\n"),
            "nvidia_gpu_collector_state_ok 1\n".to_owned(),
        ] {
            assert!(text.contains(&series), "run {run}: {text}");
        }
    }
    // A damaged state costs nothing but the memory: the run publishes in full
    // and says so.
    fs::write(
        state.join("state"),
        "nvidia-textfile-exporter-state 1\nboot x\n",
    )
    .unwrap();
    let output = exporter_with_state("lost-gpu", &state, &["--output-dir", out], &[]);
    assert_eq!(output.code(), Some(4));
    let text = fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap();
    assert!(text.contains("nvidia_gpu_collector_state_ok 0\n"), "{text}");
    assert!(
        text.contains("nvidia_gpu_up{gpu=\"2\",uuid=\"\"} 0\n"),
        "{text}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("state file"), "{stderr}");
}

#[test]
fn batched_field_values_are_used_before_single_calls() {
    let (text, _) = golden_case("fields-preferred", "fields-preferred", &[], 0);
    for series in [
        "nvidia_gpu_ecc_enabled{gpu=\"0\",uuid=\"GPU-6b1d3e0a-4c52-4f7e-9a18-0d2c5e7b3f41\"} 1",
        "type=\"corrected\",scope=\"volatile\"} 12",
        "type=\"uncorrected\",scope=\"aggregate\"} 2",
        "policy=\"power\"} 1.5",
        "policy=\"low_utilization\"} 9",
        "nvidia_gpu_energy_joules_total{gpu=\"0\",uuid=\"GPU-6b1d3e0a-4c52-4f7e-9a18-0d2c5e7b3f41\"} 123456.789",
        "nvidia_gpu_pcie_replays_total{gpu=\"0\",uuid=\"GPU-6b1d3e0a-4c52-4f7e-9a18-0d2c5e7b3f41\"} 7",
        "nvidia_gpu_memory_temperature_celsius{gpu=\"0\",uuid=\"GPU-6b1d3e0a-4c52-4f7e-9a18-0d2c5e7b3f41\"} 64",
    ] {
        assert!(text.contains(series), "missing {series}");
    }
    // The failing single functions were never needed.
    assert!(text.contains("nvidia_gpu_collector_read_errors{gpu=\"0\",uuid=\"GPU-6b1d3e0a-4c52-4f7e-9a18-0d2c5e7b3f41\"} 0"));
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
/// here, and its window would slow the test).
fn run_without_gpm(scenario_path: &Path, state: &Path) -> String {
    run_at(
        scenario_path.to_str().unwrap(),
        state,
        T0,
        &["--no-collector", "gpm"],
    )
}

#[test]
fn the_second_power_reading_is_the_one_the_draw_is_not() {
    // Hopper: the draw is a 1 s average; field 185 is answered but not read.
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let text = run_without_gpm(&demo_h100x8_with(dir.path(), "as-is", |t| t), state.path());
    let instant =
        |text: &str, gpu: &str| value_of(text, "nvidia_gpu_power_instant_watts", &[("gpu", gpu)]);
    let average =
        |text: &str, gpu: &str| value_of(text, "nvidia_gpu_power_average_watts", &[("gpu", gpu)]);
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
    let encoder_families =
        |text: &str| text.contains("nvidia_gpu_encoder_") || text.contains("engine=\"encoder\"");
    // GH100 (H100) by its PCI device id: NVML answers the encoder's calls (an
    // idle encoder, as on a real H200), yet no encoder family is written; the
    // decoder is still read.
    let state = tempfile::tempdir().unwrap();
    let text = run_without_gpm(&demo_h100x8_with(dir.path(), "as-is", |t| t), state.path());
    assert!(!encoder_families(&text), "{text}");
    assert!(text.contains("engine=\"decoder\""), "{text}");
    // The same answers from another chip (AD102, L40S): the encoder is read.
    let with_encoder = demo_h100x8_with(dir.path(), "with-encoder", |t| {
        t.replace("pci_device_id = 0x233010de", "pci_device_id = 0x26b910de")
            .replace("NVIDIA H100 80GB HBM3", "NVIDIA L40S")
    });
    let state = tempfile::tempdir().unwrap();
    let text = run_without_gpm(&with_encoder, state.path());
    assert!(
        text.contains("nvidia_gpu_encoder_sessions{gpu=\"7\","),
        "{text}"
    );
    assert!(text.contains("engine=\"encoder\""), "{text}");
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
    assert_eq!(
        errors(&run_without_gpm(&same_driver, fresh.path())),
        8.0 * per_gpu
    );
    // Remembered by a healthy first run, it is not read again.
    run_without_gpm(
        &demo_h100x8_with(dir.path(), "healthy", |t| t),
        state.path(),
    );
    let text = run_without_gpm(&same_driver, state.path());
    assert_eq!(errors(&text), 0.0, "{text}");
    // A new driver forgets it: read again, and the fault is seen.
    let new_driver = demo_h100x8_with(
        dir.path(),
        "new-driver",
        failing("driver_version = \"580.65.06\""),
    );
    assert_eq!(
        errors(&run_without_gpm(&new_driver, state.path())),
        8.0 * per_gpu
    );
    text
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
    assert!(
        text.contains("nvidia_gpu_collector_error{reason=\"busy\"} 1\n"),
        "{text}"
    );
    assert!(device_series(&parsed(&text)).is_empty());

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

#[test]
fn nvlink_counters_come_from_one_batched_read() {
    let (text, _) = golden_case(
        "nvlink-fields",
        "nvlink-fields",
        &["--no-collector", "mig", "--collector", "nvlink-links"],
        0,
    );
    let id = "gpu=\"0\",uuid=\"GPU-0c7e5a91-2b3d-4f60-8e14-a9d2c6b07f35\"";
    for series in [
        format!("nvidia_gpu_nvlink_link_active{{{id},link=\"2\"}} 0"),
        format!("nvidia_gpu_nvlink_link_errors_total{{{id},link=\"0\",counter=\"crc_data\"}} 20"),
        format!("nvidia_gpu_nvlink_link_errors_total{{{id},link=\"3\",counter=\"crc_flit\"}} 2"),
        format!("nvidia_gpu_nvlink_link_errors_total{{{id},link=\"3\",counter=\"replay\"}} 5"),
        format!("nvidia_gpu_nvlink_link_errors_total{{{id},link=\"1\",counter=\"recovery\"}} 1"),
        format!("nvidia_gpu_nvlink_link_transmit_bytes_total{{{id},link=\"0\"}} 1024000"),
        format!("nvidia_gpu_nvlink_link_receive_bytes_total{{{id},link=\"3\"}} 9216"),
        // The per-GPU totals: link state by function where the state field is
        // not offered; replay/recovery/data summed over the per-link fields.
        format!("nvidia_gpu_nvlink_links{{{id}}} 4"),
        format!("nvidia_gpu_nvlink_links_active{{{id}}} 3"),
        format!("nvidia_gpu_nvlink_errors_total{{{id},counter=\"replay\"}} 8"),
        format!("nvidia_gpu_nvlink_errors_total{{{id},counter=\"recovery\"}} 1"),
        format!("nvidia_gpu_nvlink_transmit_bytes_total{{{id}}} 1041408"),
        format!("nvidia_gpu_nvlink_receive_bytes_total{{{id}}} 2077696"),
        format!("nvidia_gpu_collector_read_errors{{{id}}} 0"),
    ] {
        assert!(text.contains(&series), "missing {series}");
    }
    assert!(!text.contains("link=\"4\""), "probed past the link count");
    assert!(
        !text.contains("} 999\n"),
        "replay/recovery read by function, not field"
    );
    // No cheap CRC source (the per-GPU CRC fields are not offered, as on an
    // H200): the totals leave the CRC counters out rather than call per link.
    assert!(!text.contains(",counter=\"crc_flit\"} 3\n"));
    assert!(!text.contains("uuid=\"GPU-0c7e5a91-2b3d-4f60-8e14-a9d2c6b07f35\",counter=\"crc_"));
}

/// The NVLink scenarios: the default set stays within 100 series a GPU (it was
/// 162 on the demo H100 with per-link series) and holds no per-link series.
#[test]
fn default_set_stays_within_100_series_per_nvlink_gpu() {
    for scenario_name in ["h100x8", "nvlink-fields"] {
        let output = exporter(scenario_name, &["--stdout"]);
        assert_eq!(output.code(), Some(0), "{scenario_name}");
        let (text, samples) = (output.text(), output.samples());
        let gpus: std::collections::BTreeSet<&str> =
            samples.keys().filter_map(|s| s.label("gpu")).collect();
        assert!(!gpus.is_empty());
        for gpu in gpus {
            let series = samples
                .keys()
                .filter(|s| s.label("gpu") == Some(gpu))
                .count();
            assert!(
                series <= 100,
                "{scenario_name}: GPU {gpu} has {series} series"
            );
            assert!(
                value(&samples, "nvidia_gpu_nvlink_links", &[("gpu", gpu)]).is_some(),
                "{scenario_name}: GPU {gpu} lacks its NVLink totals"
            );
        }
        assert!(
            !text.contains("link=\""),
            "{scenario_name}: per-link series by default"
        );
        assert!(!text.contains("nvidia_gpu_nvlink_link_"), "{scenario_name}");
    }
}

/// With both NVLink collectors on, each per-GPU total equals the sum of the
/// per-link values (the per-link CRC counters come from the single function,
/// the totals from NVML's per-GPU fields), and the link counts agree.
#[test]
fn nvlink_totals_equal_the_sum_of_the_links() {
    for (scenario_name, counters) in [
        (
            "h100x8",
            &["replay", "recovery", "crc_flit", "crc_data"][..],
        ),
        ("nvlink-fields", &["replay", "recovery"][..]),
    ] {
        let output = exporter(scenario_name, &["--stdout", "--collector", "nvlink-links"]);
        assert_eq!(output.code(), Some(0), "{scenario_name}");
        let samples = output.samples();
        let gpus: std::collections::BTreeSet<&str> =
            samples.keys().filter_map(|s| s.label("gpu")).collect();
        for gpu in gpus {
            let of = |name: &str| select(&samples, name, &[("gpu", gpu)]);
            let one = |name: &str| -> f64 {
                let found = of(name);
                assert_eq!(found.len(), 1, "{scenario_name} GPU {gpu}: {name}");
                found[0].1
            };
            let at = format!("{scenario_name} GPU {gpu}");
            let links = of("nvidia_gpu_nvlink_link_active");
            assert_eq!(one("nvidia_gpu_nvlink_links"), links.len() as f64, "{at}");
            let active: f64 = links.iter().map(|s| s.1).sum();
            assert_eq!(one("nvidia_gpu_nvlink_links_active"), active, "{at}");
            for counter in counters {
                let per_link: Vec<f64> = of("nvidia_gpu_nvlink_link_errors_total")
                    .iter()
                    .filter(|s| s.0.label("counter") == Some(counter))
                    .map(|s| s.1)
                    .collect();
                assert_eq!(per_link.len(), links.len(), "{at}: {counter}");
                let total: Vec<f64> = of("nvidia_gpu_nvlink_errors_total")
                    .iter()
                    .filter(|s| s.0.label("counter") == Some(counter))
                    .map(|s| s.1)
                    .collect();
                assert_eq!(total, [per_link.iter().sum::<f64>()], "{at}: {counter}");
            }
            for (total, per_link) in [
                (
                    "nvidia_gpu_nvlink_transmit_bytes_total",
                    "nvidia_gpu_nvlink_link_transmit_bytes_total",
                ),
                (
                    "nvidia_gpu_nvlink_receive_bytes_total",
                    "nvidia_gpu_nvlink_link_receive_bytes_total",
                ),
            ] {
                let per_link = of(per_link);
                assert_eq!(per_link.len(), links.len(), "{at}: {total}");
                let sum: f64 = per_link.iter().map(|s| s.1).sum();
                assert!(sum > 0.0, "{at}: {total}");
                assert_eq!(one(total), sum, "{at}: {total}");
            }
        }
    }
}

/// The per-link families appear only with `--collector nvlink-links`, and that
/// collector alone writes no totals.
#[test]
fn per_link_families_only_with_the_opt_in_collector() {
    let default = String::from_utf8(exporter("h100x8", &["--stdout"]).stdout).unwrap();
    let links_only = String::from_utf8(
        exporter(
            "h100x8",
            &[
                "--stdout",
                "--no-collector",
                "nvlink",
                "--collector",
                "nvlink-links",
            ],
        )
        .stdout,
    )
    .unwrap();
    for family in [
        "nvidia_gpu_nvlink_link_active",
        "nvidia_gpu_nvlink_link_errors_total",
        "nvidia_gpu_nvlink_link_transmit_bytes_total",
        "nvidia_gpu_nvlink_link_receive_bytes_total",
    ] {
        let type_line = format!("# TYPE {family} ");
        assert!(!default.contains(&type_line), "{family} by default");
        assert!(
            links_only.contains(&type_line),
            "{family} missing when asked for"
        );
    }
    // 18 links x (state, 4 error counters, 2 data counters) on each of 8 GPUs.
    assert_eq!(links_only.matches("link=\"").count(), 8 * 18 * 7);
    assert!(!links_only.contains("nvidia_gpu_nvlink_links"));
    assert!(!links_only.contains("# TYPE nvidia_gpu_nvlink_errors_total "));
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
        let started = now();
        let mut run = ex()
            .run(scenario_name)
            .output_dir(dir.path())
            .args(["--timeout", "2500ms"])
            .own_process_group()
            .finish()
            .unwrap();
        let ended = now();
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

/// The unit's start timeout is longer than any `--timeout` the command line
/// accepts plus the hard stop's grace, so systemd never kills a run before it
/// has written its file.
#[test]
fn unit_start_timeout_outlasts_every_allowed_timeout() {
    let unit = fs::read_to_string(Path::new(ROOT).join("systemd/nvidia-textfile-exporter.service"))
        .unwrap();
    let value = unit
        .lines()
        .find_map(|line| line.strip_prefix("TimeoutStartSec="))
        .expect("TimeoutStartSec= in the unit");
    let start_timeout = humantime::parse_duration(value.trim()).unwrap();
    let longest = nvidia_textfile_exporter::cli::MAX_TIMEOUT
        + nvidia_textfile_exporter::timing::HARD_STOP_GRACE;
    assert!(start_timeout > longest + Duration::from_secs(5), "{value}");
    let refused = Command::new(EXE)
        .args(["--timeout", "301s", "--stdout"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

/// The labels of every sample of every golden file, beyond `gpu` and `uuid`,
/// are ones its family declares (`--generate families`).
#[test]
fn golden_samples_carry_only_declared_labels() {
    let table = Command::new(EXE)
        .args(["--generate", "families"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    let declared: std::collections::HashMap<&str, Vec<&str>> = table
        .lines()
        .map(|line| {
            let mut cells = line.split('\t');
            let name = cells.next().unwrap();
            let labels = cells.nth(1).unwrap();
            (name, labels.split(',').filter(|l| !l.is_empty()).collect())
        })
        .collect();
    let mut checked = 0;
    for entry in fs::read_dir(Path::new(ROOT).join("tests/golden")).unwrap() {
        let path = entry.unwrap().path();
        // The placeholders of the run's own values, as numbers again.
        let text = fs::read_to_string(&path)
            .unwrap()
            .replace(" <duration>\n", " 0\n")
            .replace(" <timestamp>\n", " 0\n")
            .replace(" <window>\n", " 0\n");
        let samples =
            exposition::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for series in samples.keys() {
            let name = series.name.as_str();
            let labels = declared
                .get(name)
                .unwrap_or_else(|| panic!("{name} undeclared"));
            for (label, _) in &series.labels {
                assert!(
                    label == "gpu" || label == "uuid" || labels.contains(&label.as_str()),
                    "{name} carries undeclared label {label}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "only {checked} labels checked");
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

/// Each collector, run alone on every scenario a run can read (all but the
/// ones where NVML hangs), exits with the status the scenario calls for, emits
/// only the families its registry row lists (plus the always-written ones),
/// and emits at least one of its own families on some scenario.
#[test]
fn collectors_emit_only_their_registered_families() {
    let table = Command::new(EXE)
        .args(["--generate", "collectors"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    let rows: Vec<(&str, Vec<&str>)> = table
        .lines()
        .map(|line| {
            let cells: Vec<&str> = line.split('\t').collect();
            (cells[0], cells[2].split(',').collect())
        })
        .collect();
    assert!(rows.len() > 10, "{table}");
    let always = [
        "nvidia_gpu_collector_up",
        "nvidia_gpu_collector_error",
        "nvidia_gpu_collector_duration_seconds",
        "nvidia_gpu_collector_timestamp_seconds",
        "nvidia_gpu_collector_build_info",
        "nvidia_gpu_collector_read_errors",
        "nvidia_gpu_collector_state_ok",
        // Written by the registry for every host-level collector that is on.
        "nvidia_gpu_collector_success",
        "nvidia_gpu_collector_step_duration_seconds",
        "nvidia_gpu_driver_info",
        "nvidia_gpu_up",
        "nvidia_gpu_down_reason",
        "nvidia_gpu_info",
        // Said for every collector with a host step (xid, processes).
        "nvidia_gpu_collector_success",
        "nvidia_gpu_collector_step_duration_seconds",
    ];
    let mut scenarios: Vec<String> = fs::read_dir(Path::new(ROOT).join("tests/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|n| n.strip_suffix(".toml").map(String::from))
        .filter(|n| !n.contains("hang"))
        .collect();
    scenarios.sort();
    assert!(scenarios.len() >= 25, "{scenarios:?}");
    let procfs = tempfile::tempdir().unwrap();
    let procfs = procfs.path().to_str().unwrap();
    // Which collectors wrote one of their own families somewhere; two threads
    // share the scenarios.
    let wrote = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let check = |scenario_name: &str| {
        for (collector, families) in &rows {
            let mut args = vec!["--stdout", "--procfs", procfs, "--gpm-window", "100ms"];
            for (other, _) in &rows {
                let switch = if other == collector {
                    "--collector"
                } else {
                    "--no-collector"
                };
                args.extend([switch, other]);
            }
            let output = exporter(scenario_name, &args);
            let at = format!("{scenario_name}, only {collector}");
            let want = expected_status(scenario_name, collector);
            assert_eq!(output.code(), Some(want), "{at}: {}", output.err());
            let file = output.parsed().unwrap_or_else(|e| panic!("{at}: {e}"));
            let names = file
                .families
                .keys()
                .chain(file.samples.keys().map(|s| &s.name));
            for name in names {
                assert!(
                    always.contains(&name.as_str()) || families.contains(&name.as_str()),
                    "{at}: emitted {name}"
                );
                if families.contains(&name.as_str()) {
                    wrote.lock().unwrap().insert(collector.to_string());
                }
            }
        }
    };
    std::thread::scope(|scope| {
        let (odd, even): (Vec<_>, Vec<_>) =
            scenarios.iter().enumerate().partition(|(i, _)| i % 2 == 1);
        for half in [odd, even] {
            let check = &check;
            scope.spawn(move || half.iter().for_each(|(_, name)| check(name)));
        }
    });
    let wrote = wrote.into_inner().unwrap();
    let silent: Vec<&str> = rows
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| !wrote.contains(*c))
        .collect();
    assert!(
        silent.is_empty(),
        "collectors that wrote none of their families on any scenario: {silent:?}"
    );
}

/// No scenario, with every collector on, writes a series twice; the scenario
/// whose NVML lists a pid twice and two MIG devices with the same ids is
/// merged (process memory summed).
#[test]
fn no_series_is_ever_written_twice() {
    let procfs = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for entry in fs::read_dir(Path::new(ROOT).join("tests/scenarios")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let name = name.strip_suffix(".toml").unwrap();
        if name.contains("hang") || name.starts_with("bench") {
            continue;
        }
        let mut args = vec!["--stdout", "--timeout", "5s", "--procfs"];
        args.push(procfs.path().to_str().unwrap());
        let table = Command::new(EXE)
            .args(["--generate", "collectors"])
            .output()
            .unwrap();
        let table = String::from_utf8(table.stdout).unwrap();
        let names: Vec<String> = table
            .lines()
            .map(|l| l.split('\t').next().unwrap().to_owned())
            .collect();
        for collector in &names {
            args.extend(["--collector", collector.as_str()]);
        }
        // The strict parser refuses a series written twice.
        if let Err(e) = exporter(name, &args).parsed() {
            panic!("{name}: {e}");
        }
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} scenarios");
    let text = String::from_utf8(
        exporter(
            "fault-duplicates",
            &[
                "--stdout",
                "--collector",
                "processes",
                "--procfs",
                procfs.path().to_str().unwrap(),
            ],
        )
        .stdout,
    )
    .unwrap();
    let pid = text
        .lines()
        .find(|l| {
            l.starts_with("nvidia_gpu_process_memory_used_bytes{") && l.contains("pid=\"61377\"")
        })
        .unwrap();
    assert!(pid.ends_with(" 7516193768"), "{pid}");
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
    for family in [
        "nvidia_gpu_temperature_celsius{",
        "nvidia_gpu_memory_temperature_celsius{",
        "nvidia_gpu_power_watts{",
        "nvidia_gpu_energy_joules_total{",
    ] {
        assert!(!text.contains(family), "{family} exported: {text}");
    }
    // An impossible MIG slot count (4294967295) is counted and clamped: the
    // MIG devices that exist are still listed.
    assert!(text.contains("nvidia_gpu_mig_info{"), "{text}");
    assert!(text.contains("nvidia_gpu_collector_read_errors{gpu=\"0\",uuid=\"GPU-a7c3e915-2f4d-4b80-9e16-c5d8b2f07a43\"} 5\n"), "{text}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 5, "{stderr}");
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

// ---- XID errors from a real journal ------------------------------------------

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

#[test]
fn xids_count_exactly_across_runs_and_a_rotated_and_vacuumed_journal() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    // Every GPU starts at 0, before any XID.
    write_journal(
        journal.path(),
        "system@1.journal",
        &journal_entry(
            1000,
            "kernel",
            "nvidia-nvlink: Nvlink Core is being initialized",
        ),
    );
    let run = xid_run(state.path(), journal.path());
    assert_eq!(select(&run, "nvidia_gpu_xid_errors_total", &[]).len(), 8);
    assert_eq!(xids(&run, GPU0), Some(0.0));
    assert_eq!(xids(&run, GPU0_79), None);

    // The first XID; a spoofed one from user space (logger) and an older
    // driver's line for GPU 1 without pid; a bus id that matches no GPU.
    let mut export = journal_entry(2000, "kernel", XID79);
    export += &journal_entry(2001, "syslog", XID79);
    export += &journal_entry(
        2002,
        "kernel",
        "NVRM: Xid (PCI:0000:2a:00): 13, Graphics Exception: ESR 0x405840=0x0",
    );
    export += &journal_entry(
        2003,
        "kernel",
        "NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    );
    write_journal(journal.path(), "system@2.journal", &export);
    let run = xid_run(state.path(), journal.path());
    assert_eq!(
        xids(&run, GPU0),
        Some(1.0),
        "the logger line must not count: {run:?}"
    );
    assert_eq!(xids(&run, GPU0_79), Some(1.0));
    assert_eq!(xids(&run, GPU1), Some(1.0));
    assert_eq!(
        value(
            &run,
            "nvidia_gpu_xid_unattributed_errors_total",
            &[("pci_bus_id", "00000000:EE:00"), ("code", "79")]
        ),
        Some(1.0)
    );
    // Nothing new: nothing counted twice.
    assert_eq!(xid_run(state.path(), journal.path()), run);

    // Rotation: the active file is archived and a new one written; then the
    // archived files are vacuumed. The cursor's file is gone: no double count.
    write_journal(
        journal.path(),
        "system@3.journal",
        &journal_entry(3000, "kernel", XID79),
    );
    let run = xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(2.0));
    fs::remove_file(journal.path().join("system@1.journal")).unwrap();
    fs::remove_file(journal.path().join("system@2.journal")).unwrap();
    write_journal(
        journal.path(),
        "system@4.journal",
        &journal_entry(4000, "kernel", XID79),
    );
    let run = xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(3.0), "{run:?}");
    assert_eq!(
        xids(&run, GPU1),
        Some(1.0),
        "totals outlive the journal files"
    );
}

#[test]
fn an_invalid_cursor_restarts_from_the_last_entrys_time_without_double_counting() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let export = journal_entry(1000, "kernel", XID79)
        + &journal_entry(1000, "kernel", "a line at the same time");
    write_journal(journal.path(), "a.journal", &export);
    assert_eq!(
        xids(&xid_run(state.path(), journal.path()), GPU0),
        Some(1.0)
    );
    // A damaged cursor (its monotonic time is kept): journalctl refuses it.
    let path = state.path().join("state");
    let mut file: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    assert!(file["xid"]["cursor"].is_string(), "{file}");
    file["xid"]["cursor"] = "garbage".into();
    fs::write(&path, file.to_string()).unwrap();
    write_journal(
        journal.path(),
        "b.journal",
        &journal_entry(2000, "kernel", XID79),
    );
    let run = xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(2.0), "{run:?}");
    assert_eq!(
        xids(&xid_run(state.path(), journal.path()), GPU0),
        Some(2.0)
    );
}

#[test]
fn ten_thousand_xids_in_one_window_count_exactly() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let mut export = String::new();
    for i in 0..10_000u64 {
        export += &journal_entry(1000 + 2 * i, "kernel", XID79);
        export += &journal_entry(
            1001 + 2 * i,
            "kernel",
            "NVRM: GPU at PCI:0000:18:00: GPU-5a8f0c3e",
        );
    }
    write_journal(journal.path(), "a.journal", &export);
    let run = xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(10_000.0));
    assert_eq!(xids(&run, GPU0_79), Some(10_000.0));
    assert_eq!(
        xids(&xid_run(state.path(), journal.path()), GPU0),
        Some(10_000.0)
    );
}

#[test]
fn no_collector_xid_leaves_the_families_out() {
    let output = exporter("h100x8", &["--stdout", "--no-collector", "xid"]);
    assert!(output.success());
    assert!(!String::from_utf8(output.stdout)
        .unwrap()
        .contains("nvidia_gpu_xid_"));
}

/// One run of `scenario_name` at the fake NVML clock `clock_us` with the state
/// directory `state` (read and stored); checks it succeeded and returns its text.
fn run_at(scenario_name: &str, state: &Path, clock_us: u64, args: &[&str]) -> String {
    let clock = clock_us.to_string();
    let mut all_args = vec!["--stdout", "--write-state"];
    all_args.extend_from_slice(args);
    let output = exporter_with_state(
        scenario_name,
        state,
        &all_args,
        &[("FAKE_NVML_CLOCK_US", &clock)],
    );
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

/// A 50 % duty cycle (1 s busy, 1 s idle) read every 10 s gives 0.5 every run
/// and busy/sampled grow by exactly 5 s/10 s; the first run takes NVML's whole
/// buffer (71 samples, 14.2 s; the duplicated newest sample covers nothing).
#[test]
fn duty_cycle_is_read_completely_every_window() {
    let state = tempfile::tempdir().unwrap();
    let first = run_at("duty-cycle", state.path(), T0, &[]);
    let (busy, sampled, ratio) = window_of(&first);
    assert!(close(sampled, 14.2), "{first}");
    // Samples k-70..=k with k at a busy start: 36 busy of 71.
    assert!(close(busy, 7.2), "{first}");
    assert!(close(ratio.unwrap(), 36.0 / 71.0));
    assert!(close(
        value_of(
            &first,
            "nvidia_gpu_memory_utilization_ratio",
            &[("gpu", "0")]
        )
        .unwrap(),
        0.8 * 36.0 / 71.0
    ));
    let (mut busy, mut sampled) = (busy, sampled);
    for run in 1..=4 {
        let text = run_at("duty-cycle", state.path(), T0 + run * 10 * SECOND, &[]);
        let (now_busy, now_sampled, ratio) = window_of(&text);
        assert_eq!(ratio, Some(0.5), "run {run}");
        assert!(
            close(now_busy - busy, 5.0),
            "run {run}: {now_busy} after {busy}"
        );
        assert!(close(now_sampled - sampled, 10.0), "run {run}");
        (busy, sampled) = (now_busy, now_sampled);
    }
    // Encoder and decoder keep no samples here: point readings, no counters.
    let text = run_at("duty-cycle", state.path(), T0 + 50 * SECOND, &[]);
    assert_eq!(
        value_of(
            &text,
            "nvidia_gpu_decoder_utilization_ratio",
            &[("gpu", "0")]
        ),
        Some(0.03)
    );
    assert!(!text.contains("engine=\"decoder\""), "{text}");
    assert!(text.contains("nvidia_gpu_collector_state_ok 1\n"));
}

/// A timer period longer than NVML's buffer: the missing time is not invented,
/// it shows as sampled time growing slower than wall time.
#[test]
fn a_gap_longer_than_the_buffer_shows_in_sampled_time() {
    let state = tempfile::tempdir().unwrap();
    let (_, before, _) = window_of(&run_at("duty-cycle", state.path(), T0, &[]));
    let (_, after, ratio) = window_of(&run_at("duty-cycle", state.path(), T0 + 30 * SECOND, &[]));
    assert!(close(after - before, 14.2), "{before} -> {after}");
    assert!(ratio.is_some());
}

/// Two runs with no sample in between: the ratio is left out (nothing new to
/// average), the counters stay as they were.
#[test]
fn no_new_samples_leave_the_ratio_out_and_the_counters_alone() {
    let state = tempfile::tempdir().unwrap();
    let first = window_of(&run_at("duty-cycle", state.path(), T0, &[]));
    let second = window_of(&run_at("duty-cycle", state.path(), T0 + 100_000, &[]));
    assert_eq!((second.0, second.1), (first.0, first.1));
    assert_eq!(second.2, None);
}

/// The clock stepped back: nothing is counted twice and the counters never go
/// back; a small step costs the time until the clock passes the last sample
/// again, a large one (the system clock behind the last sample) re-reads the
/// buffer.
#[test]
fn a_clock_stepped_back_counts_nothing_twice() {
    let state = tempfile::tempdir().unwrap();
    let first = window_of(&run_at("duty-cycle", state.path(), T0, &[]));
    let stepped = window_of(&run_at("duty-cycle", state.path(), T0 - 5 * SECOND, &[]));
    assert_eq!((stepped.0, stepped.1, stepped.2), (first.0, first.1, None));
    let later = window_of(&run_at("duty-cycle", state.path(), T0 + 10 * SECOND, &[]));
    assert!(close(later.1 - first.1, 10.0));
    assert_eq!(later.2, Some(0.5));

    // Samples stamped a day ahead of the system clock, then the clock put right.
    let aligned = now_on_the_sample_grid();
    let ahead = window_of(&run_at(
        "duty-cycle",
        state.path(),
        aligned + 86_400 * SECOND,
        &[],
    ));
    let back = window_of(&run_at(
        "duty-cycle",
        state.path(),
        aligned - 3_600 * SECOND,
        &[],
    ));
    assert!(ahead.1 >= later.1 && ahead.0 >= later.0);
    assert!(close(back.1 - ahead.1, 14.2), "{ahead:?} -> {back:?}");
    assert!(back.2.is_some());
    let after = window_of(&run_at(
        "duty-cycle",
        state.path(),
        aligned - 3_590 * SECOND,
        &[],
    ));
    assert!(close(after.1 - back.1, 10.0));
    assert_eq!(after.2, Some(0.5));
}

/// A GPU reset empties NVML's buffer: the counters continue from the state and
/// cover only the samples taken since.
#[test]
fn a_gpu_reset_continues_the_counters() {
    let reset = 1_800_000_000_000_000;
    let state = tempfile::tempdir().unwrap();
    let before = window_of(&run_at(
        "duty-cycle",
        state.path(),
        reset - 10 * SECOND,
        &[],
    ));
    let after = window_of(&run_at("duty-cycle", state.path(), reset + 4 * SECOND, &[]));
    assert!(close(after.1 - before.1, 4.0), "{before:?} -> {after:?}");
    assert!(after.0 >= before.0);
}

/// Lost or damaged state: the run still publishes, from the whole buffer,
/// and says so in nvidia_gpu_collector_state_ok.
#[test]
fn missing_or_corrupt_state_still_publishes() {
    let state = tempfile::tempdir().unwrap();
    let first = run_at("duty-cycle", state.path(), T0, &[]);
    assert!(first.contains("nvidia_gpu_collector_state_ok 0\n"));
    fs::write(state.path().join("state"), "garbage\n").unwrap();
    let output = exporter_with_state(
        "duty-cycle",
        state.path(),
        &["--stdout"],
        &[("FAKE_NVML_CLOCK_US", &(T0 + 10 * SECOND).to_string())],
    );
    assert_eq!(output.code(), Some(0));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("nvidia_gpu_collector_state_ok 0\n"));
    let (_, sampled, ratio) = window_of(&text);
    assert!(close(sampled, 14.2));
    assert!(ratio.is_some());
}

/// Where NVML keeps no samples (MIG mode), the point reading, said in HELP;
/// no counters are invented.
#[test]
fn mig_mode_falls_back_to_the_point_reading() {
    let state = tempfile::tempdir().unwrap();
    let text = run_at("mig-point-reading", state.path(), T0, &[]);
    assert_eq!(
        value_of(&text, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]),
        Some(0.42)
    );
    assert_eq!(
        value_of(
            &text,
            "nvidia_gpu_memory_utilization_ratio",
            &[("gpu", "0")]
        ),
        Some(0.07)
    );
    assert!(!text.contains("nvidia_gpu_busy_seconds_total{"));
    assert!(
        text.contains("# HELP nvidia_gpu_utilization_ratio ")
            && text.contains("(MIG mode), the point reading")
    );
}

/// Per process: the mean SM utilization since the previous run, with the same
/// owner labels as its memory series.
#[test]
fn process_utilization_is_the_mean_since_the_previous_run() {
    let state = tempfile::tempdir().unwrap();
    let procfs = tempfile::tempdir().unwrap();
    let dir = procfs.path().join("4242");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("comm"), "train\n").unwrap();
    fs::write(dir.join("cgroup"), "0::/system.slice/train.service\n").unwrap();
    let args = [
        "--collector",
        "processes",
        "--procfs",
        procfs.path().to_str().unwrap(),
    ];
    let owner = &[
        ("pid", "4242"),
        ("comm", "train"),
        ("systemd_unit", "train.service"),
    ];
    // NVML's per-process entry is a whole percent: the process alone on its
    // GPU reads the GPU's window to within its rounding.
    let first = run_at("duty-cycle", state.path(), T0, &args);
    let process = value_of(&first, "nvidia_gpu_process_utilization_ratio", owner).unwrap();
    let gpu = value_of(&first, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]).unwrap();
    assert!((process - gpu).abs() <= 0.005, "{process} {gpu}\n{first}");
    assert_eq!(process, 0.51);
    assert!(value_of(&first, "nvidia_gpu_process_memory_used_bytes", owner).is_some());
    for run in 1..=2 {
        let text = run_at("duty-cycle", state.path(), T0 + run * 10 * SECOND, &args);
        assert_eq!(
            value_of(&text, "nvidia_gpu_process_utilization_ratio", owner),
            Some(0.5)
        );
    }
}

/// The lines of `family` (with its `{`), of GPU `gpu`.
fn gpu_lines<'t>(text: &'t str, family: &str, gpu: u32) -> Vec<&'t str> {
    let prefix = format!("{family}{{gpu=\"{gpu}\",");
    text.lines().filter(|l| l.starts_with(&prefix)).collect()
}

#[test]
fn gpm_faults_leave_out_only_what_failed() {
    let state = tempfile::tempdir().unwrap();
    let args = ["--stdout", "--write-state", "--gpm-window", "200ms"];
    let output = exporter_with_state("gpm-faults", state.path(), &args, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.code(), Some(0), "{stderr}");
    let text = String::from_utf8(output.stdout).unwrap();
    promtool_check("gpm-faults", &text);
    // GPU 0: NaN, 130 % and -1 % are dropped and counted; the rest is kept.
    assert!(gpu_lines(&text, "nvidia_gpu_sm_active_ratio", 0).is_empty());
    assert!(gpu_lines(&text, "nvidia_gpu_dram_active_ratio", 0).is_empty());
    assert_eq!(
        gpu_lines(&text, "nvidia_gpu_pipe_active_ratio", 0),
        ["nvidia_gpu_pipe_active_ratio{gpu=\"0\",uuid=\"GPU-0a000000-0000-4000-8000-000000000000\",pipe=\"fp32\"} 0.005"]
    );
    assert_eq!(
        gpu_lines(&text, "nvidia_gpu_sm_occupancy_ratio", 0).len(),
        1
    );
    assert!(gpu_lines(&text, "nvidia_gpu_collector_read_errors", 0)[0].ends_with("} 3"));
    for impossible in ["NaN", "130", "-1"] {
        assert!(
            stderr.contains(&format!("read {impossible}, which is impossible")),
            "{stderr}"
        );
    }
    // GPU 1: a profiler holds the counters; GPU 2: no permission. Left out with
    // their reason, not counted as read errors, one line each.
    for (gpu, reason) in [(1, "counters_in_use"), (2, "no_permission")] {
        assert_eq!(
            gpu_lines(&text, "nvidia_gpu_gpm_unavailable", gpu),
            [format!(
                "nvidia_gpu_gpm_unavailable{{gpu=\"{gpu}\",uuid=\"GPU-0{}000000-0000-4000-8000-000000000000\",reason=\"{reason}\"}} 1",
                ["a", "b", "c"][gpu as usize]
            )]
        );
        assert!(gpu_lines(&text, "nvidia_gpu_graphics_engine_active_ratio", gpu).is_empty());
        assert!(gpu_lines(&text, "nvidia_gpu_gpm_window_seconds", gpu).is_empty());
        assert!(gpu_lines(&text, "nvidia_gpu_collector_read_errors", gpu)[0].ends_with("} 0"));
        assert!(gpu_lines(&text, "nvidia_gpu_utilization_ratio", gpu)[0].ends_with("} 0.8"));
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
    assert!(gpu_lines(&text, "nvidia_gpu_collector_read_errors", 3)[0].ends_with("} 1"));
    assert!(gpu_lines(&text, "nvidia_gpu_graphics_engine_active_ratio", 3).is_empty());
    // GPU 4 has no GPM: nothing at all.
    assert!(!text.contains("{gpu=\"4\",uuid=\"GPU-0e000000-0000-4000-8000-000000000000\",reason"));
    assert!(device_series(&parsed(&text))
        .iter()
        .all(|s| !(s.label("gpu") == Some("4")
            && (s.name.contains("_active_ratio") || s.name.contains("gpm")))));

    // The next run says nothing more about what has not changed.
    let again = exporter_with_state("gpm-faults", state.path(), &args, &[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!stderr.contains("GPM metrics"), "{stderr}");
    assert!(String::from_utf8_lossy(&again.stdout).contains("reason=\"no_permission\"} 1"));
}

#[test]
fn gpm_window_holds_the_other_reads() {
    // GPU 0's temperature read takes 400 ms. The other reads are taken at the
    // end of the window, started as long before it as they took in the
    // previous run: once a run has learnt that, a 500 ms window lasts about
    // the window, not window + reads.
    let state = tempfile::tempdir().unwrap();
    let args = ["--stdout", "--write-state", "--gpm-window", "500ms"];
    let first = exporter_with_state("gpm-faults", state.path(), &args, &[]);
    assert_eq!(first.code(), Some(0));
    let started = Instant::now();
    let output = exporter_with_state("gpm-faults", state.path(), &args, &[]);
    let wall = started.elapsed();
    assert_eq!(output.code(), Some(0));
    assert!(wall >= Duration::from_millis(500), "{wall:?}");
    assert!(
        wall < Duration::from_millis(800),
        "{wall:?}: reads outside the window?"
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let window: f64 = gpu_lines(&text, "nvidia_gpu_gpm_window_seconds", 0)[0]
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.5..0.6).contains(&window), "{window}");
    assert!(text.contains("nvidia_gpu_temperature_celsius{gpu=\"0\""));
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
        let line = gpu_lines(&text, "nvidia_gpu_gpm_window_seconds", gpu);
        let window: f64 = line[0].rsplit(' ').next().unwrap().parse().unwrap();
        assert!((0.2..0.5).contains(&window), "{line:?}");
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
    assert_eq!(text.matches("reason=\"paused\"} 1\n").count(), 8);
    assert!(!text.contains("nvidia_gpu_sm_active_ratio{"));
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
        stderr.contains("--gpm-window 1s does not fit in the time a run may read (800ms)"),
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
    // NVML init takes 1.35 s of a 2 s timeout: reading ends at 1.6 s, the
    // window at 1.4 s, so it is cut to about 50 ms, which would read zeros.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slow-init.toml");
    let text = fs::read_to_string(scenario("h100x8"))
        .unwrap()
        .replace("[system]\n", "[system]\ninit_delay_ms = 1350\n");
    fs::write(&path, text).unwrap();
    let state = tempfile::tempdir().unwrap();
    let output = exporter_with_state(
        "h100x8",
        state.path(),
        &["--stdout", "--timeout", "2s"],
        &[("FAKE_NVML_SCENARIO", path.to_str().unwrap())],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.code(), Some(0), "{stderr}");
    let text = String::from_utf8(output.stdout).unwrap();
    // Said in the file and logged once (not again while it stays so).
    assert!(
        text.contains(
            r#"uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10",reason="window_too_short"} 1"#
        ),
        "{text}"
    );
    assert!(
        stderr.contains("GPU 0: GPM metrics (window_too_short) left out"),
        "{stderr}"
    );
    assert!(gpu_lines(&text, "nvidia_gpu_gpm_window_seconds", 0).is_empty());
    assert!(gpu_lines(&text, "nvidia_gpu_graphics_engine_active_ratio", 0).is_empty());
    assert!(gpu_lines(&text, "nvidia_gpu_utilization_ratio", 0)[0].contains("} 0.97"));
}

/// MIG mode and the process list are read once per GPU and run, however many
/// collectors use them: a failing call is seen (and counted) once.
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
    let output = exporter_with_state(
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
        &[("FAKE_NVML_SCENARIO", path.to_str().unwrap())],
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let errors = text
        .lines()
        .find(|l| l.starts_with("nvidia_gpu_collector_read_errors{gpu=\"0\""))
        .unwrap();
    assert!(errors.ends_with(" 2"), "{errors}");
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
        let output = exporter_with_state(
            "h100x8",
            &dir.path().join("state"),
            &["--stdout", "--gpm-window", "0"],
            &[("FAKE_NVML_SCENARIO", path.to_str().unwrap())],
        );
        let text = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        let errors = text
            .lines()
            .find(|l| l.starts_with("nvidia_gpu_collector_read_errors{gpu=\"0\""))
            .unwrap();
        assert!(
            !text.contains("nvidia_gpu_power_watts{gpu=\"0\""),
            "{code}: power exported"
        );
        assert_eq!(errors.ends_with(" 1"), counted, "{code}: {errors}");
        assert_eq!(
            stderr.contains("GPU 0: nvmlDeviceGetPowerUsage"),
            counted,
            "{code}: {stderr}"
        );
    }
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
    assert!(
        second.contains("uuid=\"GPU-d0c7c1e5-5a1e-4b0d-9c3e-200000000001\""),
        "{second}"
    );
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
    assert!(
        text.contains(
            r#"nvidia_gpu_up{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"} 0"#
        ),
        "{text}"
    );
    let run = parsed(text);
    assert_eq!(value(&run, GPU0.0, GPU0.1), Some(1.0), "{text}");
    assert_eq!(value(&run, GPU0_79.0, GPU0_79.1), Some(1.0), "{text}");
    assert!(
        !text.contains("nvidia_gpu_xid_unattributed_errors_total{"),
        "{text}"
    );
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
        let gone = r#"{gpu="1",uuid="GPU-c41e7b92-6d30-4a8f-b1e5-7d09f2c6a354""#;
        for line in [
            format!("nvidia_gpu_up{gone}}} 0"),
            format!(r#"nvidia_gpu_down_reason{gone},reason="not_enumerated"}} 1"#),
            format!("nvidia_gpu_xid_errors_total{gone}}} 1"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        // The GPU now at index 1 is the old index 2, up, under its own UUID.
        assert!(
            text.contains(
                r#"nvidia_gpu_up{gpu="1",uuid="GPU-7e2d94a1-38c5-4f0b-a6d7-e51b0c83f926"} 1"#
            ),
            "{text}"
        );
        assert_eq!(text.matches("nvidia_gpu_up{").count(), 8, "{text}");
        promtool_check("not-enumerated", text);
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

// ---- Faults -------------------------------------------------------------------
//
// Every fault that needs no root, mounts, kills or a real node_exporter (the
// fault matrix, tests/fault-matrix, has those). Failure cases start from a
// directory holding a complete file of a healthy run, so that "replaced" shows.

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
            Some(fake_without(libs.path(), &init)),
            "missing_symbol",
        ),
        (
            "h100x8",
            Some(fake_without(
                libs.path(),
                &["nvmlDeviceGetHandleByIndex_v2"],
            )),
            "missing_symbol",
        ),
    ];
    for (scenario_name, lib, reason) in cases {
        let (dir, state) = seeded("fault-read-error", false);
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
    let lib = fake_without(libs.path(), &missing);
    let run = ex()
        .run("fault-missing-optional")
        .lib(lib)
        .finish()
        .unwrap();
    run.assert_status(0);
    assert!(run.stderr.is_empty(), "{run:?}");
    let samples = check_file(&run.path(), None).unwrap();
    let (energy, rest): (Samples, Samples) = baseline("fault-missing-optional")
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
    let mut expected = baseline("fault-read-error");
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
        let (dir, state) = seeded(scenario_name, true);
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

/// Sequential reads keep the one deadline too, in the worst case: the lock is
/// held until just before reading must end (0.1 s before, at 0.8 x --timeout),
/// then a device call hangs. The file, GPU 1 down with reason timeout and its
/// call named, is in place by --timeout (0.1 s of slack for a loaded machine),
/// the process and all it started gone right after.
#[test]
fn sequential_reads_keep_the_one_deadline_after_a_long_lock_wait() {
    let (dir, state) = seeded("fault-read-error", false);
    let lock = fs::File::open(dir.path().join(test_support::LOCK_FILE)).unwrap();
    lock.lock().unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
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

/// A directory where the file belongs: exit 7 with one line naming the rename
/// and the path; the directory and what it holds stay, no temporary file is
/// left.
#[test]
fn a_directory_in_the_files_place_fails_cleanly() {
    let (dir, state) = seeded("geforce", false);
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
    let complete = test_support::checks::keys(&baseline("fault-slow"));
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
    let (dir, state) = seeded("fault-slow", false);
    let file = dir.path().join(test_support::OUT_FILE);
    let reader = test_support::Reader::start(
        file.clone(),
        vec![("complete".into(), complete), ("busy".into(), busy.clone())],
    );
    let start = || {
        ex().run("fault-slow")
            .output_dir(dir.path())
            .state_dir(state.path())
            .args(["--timeout", "1s"])
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

/// A process alone on its GPU, busy 1 s / idle 1 s as the GPU is, read every
/// 15 s from NVML's 14.2 s buffer: its ratio is the GPU's (one window, one gap
/// rule), not the GPU's less the 0.8 s the buffer no longer holds.
#[test]
fn a_process_reads_what_its_gpu_reads_when_runs_are_longer_apart_than_the_buffer() {
    let state = tempfile::tempdir().unwrap();
    let args = ["--collector", "processes", "--gpm-window", "0"];
    run_at("duty-cycle", state.path(), T0, &args);
    for n in 1..=3 {
        let text = run_at("duty-cycle", state.path(), T0 + n * 15 * SECOND, &args);
        let gpu = value_of(&text, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]).unwrap();
        let process = value_of(
            &text,
            "nvidia_gpu_process_utilization_ratio",
            &[("pid", "4242")],
        )
        .unwrap();
        assert!(
            (process - gpu).abs() < 0.01,
            "run {n}: process {process}, GPU {gpu}"
        );
        assert!((gpu - 0.5).abs() < 0.05, "run {n}: GPU {gpu}");
    }
}

/// Samples with an impossible value (101 %) are dropped and claim no time: a
/// first run over a full 71-sample buffer alternating 0 % and 101 % counts the
/// 36 good samples' 7.2 s, never more than the buffer holds.
#[test]
fn impossible_samples_claim_no_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("impossible.toml");
    let text = fs::read_to_string(scenario("duty-cycle"))
        .unwrap()
        .replace(
            "gpu = [100, 100, 100, 100, 100, 0, 0, 0, 0, 0]",
            "gpu = [0, 101]",
        )
        .replace(", duplicate_last = true", "");
    fs::write(&path, text).unwrap();
    let state = tempfile::tempdir().unwrap();
    let output = exporter_with_state(
        "duty-cycle",
        state.path(),
        &["--stdout", "--gpm-window", "0"],
        &[
            ("FAKE_NVML_SCENARIO", path.to_str().unwrap()),
            ("FAKE_NVML_CLOCK_US", &T0.to_string()),
        ],
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let engine = &[("engine", "gpu")];
    let sampled = value_of(&text, "nvidia_gpu_sampled_seconds_total", engine).unwrap();
    let busy = value_of(&text, "nvidia_gpu_busy_seconds_total", engine).unwrap();
    assert!((sampled - 7.2).abs() < 1e-9, "sampled {sampled}\n{text}");
    assert_eq!(busy, 0.0, "{text}");
    assert_eq!(
        value_of(&text, "nvidia_gpu_collector_read_errors", &[("gpu", "0")]),
        Some(35.0),
        "{text}"
    );
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

/// A run whose state another run holds (its lock) publishes no running
/// totals rather than totals from 0, so the counters never go back; the next
/// run continues the stored ones.
#[test]
fn a_run_without_the_state_leaves_the_totals_out() {
    let state = tempfile::tempdir().unwrap();
    let busy = |o: &Outcome| {
        let text = String::from_utf8(o.stdout.clone()).unwrap();
        value_of(&text, "nvidia_gpu_busy_seconds_total", &[("engine", "gpu")])
    };
    let first = stored_run("duty-cycle", state.path(), T0, &[]);
    let before = busy(&first).expect("a first run keeps totals");
    let lock = fs::File::create(state.path().join(".state.lock")).unwrap();
    lock.lock().unwrap();
    let locked = stored_run(
        "duty-cycle",
        state.path(),
        T0 + 15 * SECOND,
        &["--timeout", "1s"],
    );
    let text = String::from_utf8(locked.stdout.clone()).unwrap();
    assert_eq!(busy(&locked), None, "{text}");
    assert!(
        !text.contains("nvidia_gpu_sampled_seconds_total{"),
        "{text}"
    );
    assert!(!text.contains("nvidia_gpu_xid_errors_total{"), "{text}");
    assert!(
        text.contains("nvidia_gpu_collector_success{collector=\"xid\"} 0\n"),
        "{text}"
    );
    assert!(text.contains("nvidia_gpu_collector_state_ok 0\n"), "{text}");
    // The window's own ratio is still published.
    assert!(text.contains("nvidia_gpu_utilization_ratio{"), "{text}");
    drop(lock);
    let after = stored_run("duty-cycle", state.path(), T0 + 30 * SECOND, &[]);
    assert!(busy(&after).unwrap() > before);
}

/// A GPU whose UUID is not known (its read fails, the state knows none) and
/// two GPUs that read the same UUID publish no running totals: they could not
/// continue from run to run, or would overwrite each other's.
#[test]
fn gpus_without_an_identity_of_their_own_publish_no_totals() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = duty_cycle_with(dir.path(), "unknown", |t| {
        t.replacen(
            "[[gpu]]\n",
            "[[gpu]]\nerrors = { nvmlDeviceGetUUID = \"UNKNOWN\" }\n",
            1,
        )
    });
    let twins = duty_cycle_with(dir.path(), "twins", |t| {
        let gpu = &t[t.find("[[gpu]]").unwrap()..];
        let second = gpu.replace("00000000:19:00.0", "00000000:1A:00.0");
        format!("{t}\n{second}")
    });
    for scenario in [unknown, twins] {
        let state = tempfile::tempdir().unwrap();
        for n in 0..3 {
            let output = stored_run(&scenario, state.path(), T0 + n * 15 * SECOND, &[]);
            let text = String::from_utf8(output.stdout).unwrap();
            assert!(text.contains("nvidia_gpu_up{gpu=\"0\""), "{text}");
            assert!(!text.contains("nvidia_gpu_busy_seconds_total{"), "{text}");
            assert!(
                !text.contains("nvidia_gpu_sampled_seconds_total{"),
                "{text}"
            );
            promtool_check("no-own-identity", &text);
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
        let output = journal_run(path.to_str().unwrap(), state.path(), journal.path());
        String::from_utf8(output.stdout).unwrap()
    };
    run(&edited_scenario(dir.path(), "healthy", |t| t));
    run(&edited_scenario(dir.path(), "seven", seven));
    // The GPU now at index 1 (GPU-7e2d…, formerly index 2) reads neither its
    // UUID nor its bus id.
    let text = run(&edited_scenario(dir.path(), "unreadable", |t| {
        let t = seven(t);
        let second = t.match_indices("[[gpu]]\n").nth(1).unwrap().0 + "[[gpu]]\n".len();
        format!(
            "{}errors = {{ nvmlDeviceGetUUID = \"UNKNOWN\", nvmlDeviceGetPciInfo_v3 = \"UNKNOWN\" }}\n{}",
            &t[..second],
            &t[second..]
        )
    }));
    assert!(
        text.contains("nvidia_gpu_up{gpu=\"1\",uuid=\"\"} 1\n"),
        "{text}"
    );
    assert!(
        !text.contains("uuid=\"GPU-c41e7b92-6d30-4a8f-b1e5-7d09f2c6a354\"} 1"),
        "{text}"
    );
    assert!(!text.contains("not_enumerated"), "{text}");
}

/// After the clock steps back, a process alone on its GPU still reads what
/// the GPU reads (both from the buffer read again), not 0.
#[test]
fn a_process_reads_its_gpus_utilization_after_a_clock_step() {
    // Samples stamped a day ahead of the system clock, then the clock put
    // right: the system clock is behind the last sample consumed.
    let aligned = now_on_the_sample_grid();
    let state = tempfile::tempdir().unwrap();
    let args = ["--collector", "processes"];
    stored_run("duty-cycle", state.path(), aligned + 86_400 * SECOND, &args);
    let stepped = stored_run("duty-cycle", state.path(), aligned - 3_600 * SECOND, &args);
    let text = String::from_utf8(stepped.stdout).unwrap();
    let gpu = value_of(&text, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]).unwrap();
    let process = value_of(
        &text,
        "nvidia_gpu_process_utilization_ratio",
        &[("pid", "4242")],
    )
    .unwrap();
    assert!((process - gpu).abs() < 0.01, "process {process}, GPU {gpu}");
    assert!(gpu > 0.3, "{text}");
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
            let output = exporter_with_state("gpm-faults", state.path(), &args, &[]);
            assert_eq!(output.code(), Some(0), "{mode:?} run {run}: {output:?}");
            let text = String::from_utf8(output.stdout).unwrap();
            // The window chosen, 1.96 s, shortened where the reads need the
            // room, or longer where the reads ran past it; always within the
            // 2.4 s a run may read. With --sequential GPU 0's window ends as
            // its reads do, before the other GPUs' reads and closes (a first
            // run expects 5 x 130 ms of them, and half as much again).
            let shortest = if mode.is_empty() { 1.8 } else { 1.2 };
            let window = value_of(&text, "nvidia_gpu_gpm_window_seconds", &[("gpu", "0")]).unwrap();
            assert!(
                (shortest..2.4).contains(&window),
                "{mode:?} run {run}: {window}"
            );
        }
    }
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

/// HGX H100 with NVSwitches: the fabric is completed on both GPUs; a health
/// mask that is not zero (every condition "false") is no fault, and the
/// degraded GPU says degraded bandwidth and limited capacity, nothing else.
#[test]
fn hgx_fabric_completed_healthy_and_degraded() {
    let (_, samples) = golden_case("hgx-h100-fabric", "hgx-h100-fabric", &[], 0);
    let condition = |gpu, condition| {
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health_condition",
            gpu,
            &[("condition", condition)],
        )
    };
    for gpu in ["0", "1"] {
        let state = |state| {
            gpu_value(
                &samples,
                "nvidia_gpu_fabric_state",
                gpu,
                &[("state", state)],
            )
        };
        assert_eq!(state("completed"), Some(1.0));
        assert_eq!(state("not_started"), Some(0.0));
        for healthy in [
            "route_recovery",
            "route_unhealthy",
            "access_timeout_recovery",
            "incorrect_configuration",
        ] {
            assert_eq!(condition(gpu, healthy), Some(0.0), "GPU {gpu} {healthy}");
        }
    }
    assert_eq!(condition("0", "degraded_bandwidth"), Some(0.0));
    assert_eq!(condition("1", "degraded_bandwidth"), Some(1.0));
    let summary = |gpu, summary| {
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health",
            gpu,
            &[("summary", summary)],
        )
    };
    assert_eq!(summary("0", "healthy"), Some(1.0));
    assert_eq!(summary("1", "limited_capacity"), Some(1.0));
}

/// Older drivers: struct version 2 (no summary) and the unversioned call
/// (no health at all) give what they have.
#[test]
fn fabric_from_older_drivers_gives_what_they_have() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = scenario_edited(
        dir.path(),
        "hgx-h100-fabric",
        &[(
            "health_summary = 1 }",
            "health_summary = 1, max_version = 2 }",
        )],
    );
    let run = ex().run(&v2).stdout().finish().unwrap();
    run.assert_status(0);
    let samples = run.samples();
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health_condition",
            "0",
            &[("condition", "degraded_bandwidth")]
        ),
        Some(0.0)
    );
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health",
            "0",
            &[("summary", "healthy")]
        ),
        None
    );
    assert!(run.stderr.is_empty(), "{run:?}");

    let lib = fake_without(dir.path(), &["nvmlDeviceGetGpuFabricInfoV"]);
    let run = ex()
        .run("hgx-h100-fabric")
        .stdout()
        .lib(lib)
        .finish()
        .unwrap();
    run.assert_status(0);
    assert!(run.stderr.is_empty(), "{run:?}");
    let samples = run.samples();
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_state",
            "1",
            &[("state", "completed")]
        ),
        Some(1.0)
    );
    assert!(!samples
        .keys()
        .any(|s| s.name.starts_with("nvidia_gpu_fabric_health")));
}

/// GB200: the NVLink 5 counters, summed by default and per link on request
/// (link 7's 505 recoveries, its bit error rates), the Hopper counters absent; the clock event
/// times at the ids drivers from 580.82 answer them (269-271).
#[test]
fn gb200_nvlink5_counters_and_clique() {
    golden_case("gb200-nvl72", "gb200-nvl72", &[], 0);
    let (_, samples) = golden_case(
        "gb200-nvl72-links",
        "gb200-nvl72",
        &["--collector", "nvlink-links"],
        0,
    );
    let link = |name, link: &str, labels: &[(&str, &str)]| {
        let mut all = vec![("link", link)];
        all.extend_from_slice(labels);
        gpu_value(&samples, name, "0", &all)
    };
    assert_eq!(
        link(
            "nvidia_gpu_nvlink_link_recoveries_total",
            "7",
            &[("result", "successful")]
        ),
        Some(505.0)
    );
    assert_eq!(
        link(
            "nvidia_gpu_nvlink_link_recoveries_total",
            "6",
            &[("result", "successful")]
        ),
        Some(0.0)
    );
    assert_eq!(
        link(
            "nvidia_gpu_nvlink_link_errors_total",
            "7",
            &[("counter", "effective")]
        ),
        Some(12.0)
    );
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_clocks_event_seconds_total",
            "0",
            &[("reason", "sw_thermal_slowdown")]
        ),
        Some(2.5)
    );
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_info",
            "0",
            &[("clique_id", "3")]
        ),
        Some(1.0)
    );
}

/// B200 on an HGX board: fabric and NVLink 5 counters at zero.
#[test]
fn b200_fabric_and_nvlink5() {
    let (_, samples) = golden_case("b200", "b200", &[], 0);
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_nvlink_recoveries_total",
            "0",
            &[("result", "failed")]
        ),
        Some(0.0)
    );
}

/// The H200 as it answers (driver 580): no fabric series, the PCIe counters,
/// the T.Limit thresholds -8/-2; its link trained at Gen2 x8 of Gen5 x16.
#[test]
fn pcie_trained_low_shows_against_its_maxima() {
    let (_, samples) = golden_case(
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
/// second run gives the same values with none of those calls answering.
#[test]
fn fixed_readings_are_read_once_per_driver() {
    let state = tempfile::tempdir().unwrap();
    let first = exporter_with_state(
        "pcie-trained-low",
        state.path(),
        &["--stdout", "--write-state"],
        &[],
    );
    assert_eq!(first.code(), Some(0));
    let dir = tempfile::tempdir().unwrap();
    let failing = scenario_edited(
        dir.path(),
        "pcie-trained-low",
        &[(
            "fabric = { state = 0 }",
            "fabric = { state = 0 }\nerrors = { nvmlDeviceGetGpuFabricInfoV = \"UNKNOWN\", nvmlDeviceGetMaxPcieLinkGeneration = \"UNKNOWN\", nvmlDeviceGetMaxPcieLinkWidth = \"UNKNOWN\" }",
        )],
    );
    let second = exporter_with_state(&failing, state.path(), &["--stdout", "--write-state"], &[]);
    assert_eq!(second.code(), Some(0));
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

/// A link active earlier in this boot that is down now is counted lost (the
/// state remembers which links were seen active); a fresh state knows none,
/// and a link asleep is not lost.
#[test]
fn a_link_that_went_down_is_counted_lost() {
    let state = tempfile::tempdir().unwrap();
    let first = exporter_with_state(
        "nvlink-fields",
        state.path(),
        &["--stdout", "--write-state"],
        &[],
    );
    assert_eq!(first.code(), Some(0));
    assert_eq!(
        gpu_value(&first.samples(), "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(0.0)
    );
    let dir = tempfile::tempdir().unwrap();
    let down = scenario_edited(
        dir.path(),
        "nvlink-fields",
        &[(
            "{ active = true, errors = { replay = 999, recovery = 999, crc_flit = 2",
            "{ active = false, errors = { replay = 999, recovery = 999, crc_flit = 2",
        )],
    );
    let second = exporter_with_state(&down, state.path(), &["--stdout", "--write-state"], &[]);
    assert_eq!(second.code(), Some(0));
    let samples = second.samples();
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_active", "0", &[]),
        Some(2.0)
    );
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(1.0)
    );
    let fresh = exporter(&down, &["--stdout"]);
    assert_eq!(
        gpu_value(&fresh.samples(), "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(0.0)
    );
    // A link asleep (state field 2, NVML_NVLINK_STATE_SLEEP) is not active
    // and not lost.
    let asleep = scenario_edited(
        dir.path(),
        "nvlink-fields",
        &[("field_values = { ", "field_values = { \"165:1\" = 2, ")],
    );
    let third = exporter_with_state(&asleep, state.path(), &["--stdout", "--write-state"], &[]);
    assert_eq!(third.code(), Some(0), "{}", third.err());
    let samples = third.samples();
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_active", "0", &[]),
        Some(2.0)
    );
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(0.0)
    );
}

/// NVML 13 deprecates nvmlDeviceGetTemperature, nvmlDeviceGetViolationStatus
/// and the *ClocksThrottleReasons calls: the replacements are used, and a
/// driver without a call (old or new) costs only that reading, quietly.
#[test]
fn deprecated_calls_are_replaced_and_any_one_may_be_missing() {
    let libs = tempfile::tempdir().unwrap();
    let full = baseline("h100x8");
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
        let lib = fake_without(libs.path(), &missing);
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
