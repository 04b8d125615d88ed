//! The real binary against the fake NVML (`tests/fake-nvml`), one scenario each.
//!
//! Golden files in `tests/golden/<case>.prom` are the exact output with the two
//! values that change every run (duration, timestamp) replaced by `<duration>`
//! and `<timestamp>` after they were checked. `UPDATE_GOLDEN=1 cargo test`
//! rewrites them; review the diff line by line before committing.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The fake NVML, built next to the binary by `cargo test --workspace`.
fn fake_nvml() -> PathBuf {
    let lib = Path::new(EXE).with_file_name("libfake_nvml.so");
    assert!(
        lib.exists(),
        "{} is missing: build it with `cargo build -p fake-nvml` (make test does)",
        lib.display()
    );
    lib
}

fn scenario(name: &str) -> PathBuf {
    Path::new(ROOT)
        .join("tests/scenarios")
        .join(format!("{name}.toml"))
}

fn exporter(scenario_name: &str, args: &[&str]) -> Output {
    let state = tempfile::tempdir().unwrap();
    exporter_with_state(scenario_name, state.path(), args, &[])
}

/// Runs the exporter with the state directory `state` (each test its own, so
/// that no run sees another test's state), and extra environment `env`.
fn exporter_with_state(
    scenario_name: &str,
    state: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    Command::new(EXE)
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .env("FAKE_NVML_SCENARIO", scenario(scenario_name))
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .output()
        .expect("run the exporter")
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Checks the per-run values and replaces them with placeholders.
fn normalize(text: &str, started: f64, finished: f64) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("nvidia_gpu_collector_duration_seconds ") {
            let duration: f64 = value.parse().unwrap();
            assert!(
                (0.0..=finished - started + 0.001).contains(&duration),
                "{line}"
            );
            out.push_str("nvidia_gpu_collector_duration_seconds <duration>\n");
        } else if let Some(value) = line.strip_prefix("nvidia_gpu_collector_timestamp_seconds ") {
            let timestamp: f64 = value.parse().unwrap();
            assert!(
                timestamp >= started - 0.001 && timestamp <= finished,
                "{line}"
            );
            out.push_str("nvidia_gpu_collector_timestamp_seconds <timestamp>\n");
        } else if let Some((series, value)) = line
            .strip_prefix("nvidia_gpu_gpm_window_seconds{")
            .and_then(|rest| rest.split_once("} "))
        {
            // The window actually measured: at least the shortest --gpm-window,
            // within the run.
            let window: f64 = value.parse().unwrap();
            assert!(
                (0.1..=finished - started + 0.001).contains(&window),
                "{line}"
            );
            out.push_str(&format!(
                "nvidia_gpu_gpm_window_seconds{{{series}}} <window>\n"
            ));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn check_golden(case: &str, text: &str) {
    let path = Path::new(ROOT)
        .join("tests/golden")
        .join(format!("{case}.prom"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
    if expected != text {
        for (number, (want, got)) in expected.lines().zip(text.lines()).enumerate() {
            assert_eq!(want, got, "{case}: first difference at line {}", number + 1);
        }
        assert_eq!(
            expected.lines().count(),
            text.lines().count(),
            "{case}: line count"
        );
    }
}

/// `promtool check metrics` must print nothing and succeed.
fn promtool_check(case: &str, text: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) must be installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.is_empty(),
        "{case}: promtool: {said}"
    );
}

/// Runs `scenario` with `--stdout` and checks exit status, stderr, promtool and
/// the golden file; returns the normalized text.
fn golden_case(case: &str, scenario_name: &str, args: &[&str], status: i32) -> String {
    let started = now();
    let mut all_args = vec!["--stdout"];
    all_args.extend_from_slice(args);
    let output = exporter(scenario_name, &all_args);
    let finished = now();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(status), "{case}: {stderr}");
    if status == 0 {
        assert!(stderr.is_empty(), "{case}: a healthy run printed {stderr}");
    }
    let text = String::from_utf8(output.stdout).unwrap();
    promtool_check(case, &text);
    let normalized = normalize(&text, started, finished);
    check_golden(case, &normalized);
    normalized
}

fn device_series(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains("gpu=\""))
        .collect()
}

/// What each golden case shows.
#[test]
fn h100x8_healthy_every_gpu_complete() {
    let text = golden_case("h100x8", "h100x8", &[], 0);
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
    // GPM on every GPU: percentages as ratios, eight pipes, the window.
    assert_eq!(text.matches("nvidia_gpu_sm_active_ratio{").count(), 8);
    assert_eq!(text.matches("nvidia_gpu_pipe_active_ratio{").count(), 8 * 8);
    assert_eq!(text.matches("nvidia_gpu_gpm_window_seconds{").count(), 8);
    assert!(text.contains("nvidia_gpu_sm_active_ratio{gpu=\"7\",uuid=\"GPU-94f06ad3-7b1c-4e3f-85a2-1d8e4c9b0f67\"} 0.008\n"));
    assert!(text.contains(",pipe=\"tensor\"} 0.643\n"));
}

#[test]
fn geforce_unsupported_fields_are_absent_not_zero() {
    let text = golden_case("geforce", "geforce", &[], 0);
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
    let text = golden_case("lost-gpu", "lost-gpu", &[], 4);
    assert!(text.contains("nvidia_gpu_up{gpu=\"2\",uuid=\"\"} 0\n"));
    assert!(text.contains("nvidia_gpu_down_reason{gpu=\"2\",uuid=\"\",reason=\"gpu_lost\"} 1\n"));
    let gpu2: Vec<_> = device_series(&text)
        .into_iter()
        .filter(|l| l.contains("gpu=\"2\""))
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
    let text = golden_case("h100-mig", "h100-mig", &[], 0);
    assert_eq!(text.matches("nvidia_gpu_mig_info{").count(), 3);
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
        let text = golden_case(scenario_name, scenario_name, &[], 3);
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
        assert!(device_series(&text).is_empty(), "{scenario_name}: {text}");
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
    let output = Command::new(EXE)
        .args(["--stdout", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let text = normalize(&String::from_utf8(output.stdout).unwrap(), started, now());
    check_golden("library-not-found", &text);
    assert!(String::from_utf8_lossy(&output.stderr).contains("container toolkit"));
}

#[test]
fn collectors_can_be_switched() {
    let text = golden_case(
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
    let strip = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| {
                !l.starts_with("nvidia_gpu_collector_duration")
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
    assert_eq!(output.status.code(), Some(0));
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
        output.status.code(),
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

#[test]
fn failure_replaces_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    assert_eq!(
        exporter("h100x8", &["--output-dir", out]).status.code(),
        Some(0)
    );
    assert_eq!(
        exporter("init-driver-not-loaded", &["--output-dir", out])
            .status
            .code(),
        Some(3)
    );
    let text = fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap();
    assert!(text.contains("nvidia_gpu_collector_error{reason=\"driver_not_loaded\"} 1"));
    assert!(
        device_series(&text).is_empty(),
        "stale device series survived: {text}"
    );
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
    assert_eq!(output.status.code(), Some(7));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!missing.exists(), "the directory was created");
    // procfs refuses new files even to root.
    let output = exporter("h100x8", &["--output-dir", "/proc"]);
    assert_eq!(output.status.code(), Some(7));
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
    assert_eq!(healthy.status.code(), Some(0), "{healthy:?}");
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
        assert_eq!(output.status.code(), Some(4), "run {run}");
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
    assert_eq!(output.status.code(), Some(4));
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
    let text = golden_case("fields-preferred", "fields-preferred", &[], 0);
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

#[test]
fn busy_lock_writes_busy_unless_the_holder_published_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let lock = fs::File::create(dir.path().join(".nvidia_gpu.prom.lock")).unwrap();
    lock.lock().unwrap();

    // A holder that never publishes: the file must say busy.
    let output = exporter("h100x8", &["--output-dir", out, "--timeout", "300ms"]);
    assert_eq!(output.status.code(), Some(6));
    let text = fs::read_to_string(dir.path().join("nvidia_gpu.prom")).unwrap();
    assert!(
        text.contains("nvidia_gpu_collector_error{reason=\"busy\"} 1\n"),
        "{text}"
    );
    assert!(device_series(&text).is_empty());

    // A holder that publishes while we wait: its fresh file stays.
    let child = Command::new(EXE)
        .arg("--nvml-lib")
        .arg(fake_nvml())
        .args(["--output-dir", out, "--timeout", "2s"])
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
    assert_eq!(
        exporter("h100x8", &["--output-dir", out]).status.code(),
        Some(0)
    );
}

#[test]
fn nvlink_counters_come_from_one_batched_read() {
    let text = golden_case(
        "nvlink-fields",
        "nvlink-fields",
        &["--no-collector", "mig"],
        0,
    );
    let id = "gpu=\"0\",uuid=\"GPU-0c7e5a91-2b3d-4f60-8e14-a9d2c6b07f35\"";
    for series in [
        format!("nvidia_gpu_nvlink_active{{{id},link=\"2\"}} 0"),
        format!("nvidia_gpu_nvlink_errors_total{{{id},link=\"0\",counter=\"crc_data\"}} 20"),
        format!("nvidia_gpu_nvlink_errors_total{{{id},link=\"3\",counter=\"crc_flit\"}} 2"),
        format!("nvidia_gpu_nvlink_errors_total{{{id},link=\"3\",counter=\"replay\"}} 5"),
        format!("nvidia_gpu_nvlink_errors_total{{{id},link=\"1\",counter=\"recovery\"}} 1"),
        format!("nvidia_gpu_nvlink_transmit_bytes_total{{{id},link=\"0\"}} 1024000"),
        format!("nvidia_gpu_nvlink_receive_bytes_total{{{id},link=\"3\"}} 9216"),
        format!("nvidia_gpu_collector_read_errors{{{id}}} 0"),
    ] {
        assert!(text.contains(&series), "missing {series}");
    }
    assert!(!text.contains("link=\"4\""), "probed past the link count");
    assert!(
        !text.contains("} 999\n"),
        "replay/recovery read by function, not field"
    );
}

/// The whole run keeps one deadline: a lock held for part of it and then a hung
/// NVML still give an error file before `--timeout` (plus a small margin), and
/// the process is gone by then.
#[test]
fn one_deadline_bounds_lock_wait_and_nvml_together() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let lock = fs::File::create(dir.path().join(".nvidia_gpu.prom.lock")).unwrap();
    lock.lock().unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1000));
        drop(lock);
    });
    let started = Instant::now();
    let output = exporter(
        "fault-init-hang",
        &["--output-dir", out, "--timeout", "2500ms"],
    );
    let elapsed = started.elapsed();
    releaser.join().unwrap();
    assert_eq!(output.status.code(), Some(5), "{output:?}");
    assert!(
        elapsed < Duration::from_millis(2500 + 150),
        "the run took {elapsed:?}"
    );
    let path = dir.path().join("nvidia_gpu.prom");
    let text = fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("nvidia_gpu_collector_error{reason=\"timeout\"} 1\n"),
        "{text}"
    );
    let written = fs::metadata(&path).unwrap().modified().unwrap();
    let written = written.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(written < now() + 0.001, "written after the run ended");
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
        + nvidia_textfile_exporter::watchdog::HARD_STOP_GRACE;
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
        let text = fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let labels = declared
                .get(name)
                .unwrap_or_else(|| panic!("{name} undeclared"));
            for label in label_names(line) {
                assert!(
                    label == "gpu" || label == "uuid" || labels.contains(&label),
                    "{name} carries undeclared label {label}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "only {checked} labels checked");
}

/// The label names of one sample line of our own (well-formed) output.
fn label_names(line: &str) -> Vec<&str> {
    let Some((_, rest)) = line.split_once('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut rest = rest;
    while let Some((name, value)) = rest.split_once("=\"") {
        names.push(name.trim_start_matches(','));
        // Skip the escaped value up to its closing quote.
        let mut escaped = false;
        let end = value
            .char_indices()
            .find(|&(_, c)| {
                let close = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                close
            })
            .map(|(at, _)| at)
            .unwrap();
        rest = &value[end + 1..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// Each collector, run alone on every product scenario, emits only the families
/// its registry row lists (plus the always-written ones).
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
    let always = [
        "nvidia_gpu_collector_up",
        "nvidia_gpu_collector_duration_seconds",
        "nvidia_gpu_collector_timestamp_seconds",
        "nvidia_gpu_collector_build_info",
        "nvidia_gpu_collector_read_errors",
        "nvidia_gpu_collector_state_ok",
        "nvidia_gpu_driver_info",
        "nvidia_gpu_up",
        "nvidia_gpu_info",
    ];
    let procfs = tempfile::tempdir().unwrap();
    for scenario_name in [
        "h100x8",
        "geforce",
        "h100-mig",
        "nvlink-fields",
        "fields-preferred",
    ] {
        for (collector, families) in &rows {
            let mut args = vec!["--stdout", "--procfs", procfs.path().to_str().unwrap()];
            for (other, _) in &rows {
                args.extend([
                    if other == collector {
                        "--collector"
                    } else {
                        "--no-collector"
                    },
                    other,
                ]);
            }
            let output = exporter(scenario_name, &args);
            let text = String::from_utf8(output.stdout).unwrap();
            for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
                let name = line.split(' ').nth(2).unwrap();
                assert!(
                    always.contains(&name) || families.contains(&name),
                    "{scenario_name}: collector {collector} emitted {name}"
                );
            }
        }
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
    assert_eq!(output.status.code(), Some(0), "{stderr}");
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
                .filter(|l| l.contains(&format!("GPM metrics ({reason}) left out on GPU {gpu}:")))
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
    assert!(device_series(&text)
        .iter()
        .all(|l| !(l.contains("gpu=\"4\"") && (l.contains("_active_ratio") || l.contains("gpm")))));

    // The next run says nothing more about what has not changed.
    let again = exporter_with_state("gpm-faults", state.path(), &args, &[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!stderr.contains("left out on GPU"), "{stderr}");
    assert!(String::from_utf8_lossy(&again.stdout).contains("reason=\"no_permission\"} 1"));
}

#[test]
fn gpm_window_holds_the_other_reads() {
    // GPU 0's temperature read takes 400 ms: inside a 500 ms window the run
    // lasts about the window, not window + reads.
    let started = Instant::now();
    let output = exporter("gpm-faults", &["--stdout", "--gpm-window", "500ms"]);
    let wall = started.elapsed();
    assert_eq!(output.status.code(), Some(0));
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
    assert_eq!(output.status.code(), Some(0));
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
    assert_eq!(output.status.code(), Some(0));
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
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--gpm-window 1s does not fit in --timeout 1s"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    let output = exporter("h100x8", &["--stdout", "--gpm-window", "50ms"]);
    assert_eq!(output.status.code(), Some(2));
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
    assert_eq!(output.status.code(), Some(0));
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
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        stderr.contains("GPU 0: the GPM window was cut to"),
        "{stderr}"
    );
    assert!(gpu_lines(&text, "nvidia_gpu_gpm_window_seconds", 0).is_empty());
    assert!(gpu_lines(&text, "nvidia_gpu_graphics_engine_active_ratio", 0).is_empty());
    assert!(gpu_lines(&text, "nvidia_gpu_utilization_ratio", 0)[0].ends_with("} 0.97"));
}
