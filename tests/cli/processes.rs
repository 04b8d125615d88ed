//! Per-process series: owners from procfs and utilization.

use super::*;

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
    assert_promtool("processes", &text);
    let samples = parsed(&text);
    // The process's series without its GPU's labels, and its value.
    let series = |pid: &str| {
        let found = select(
            &samples,
            "nvidia_gpu_process_memory_used_bytes",
            &[("pid", pid)],
        );
        assert_eq!(found.len(), 1, "pid {pid}:\n{text}");
        (found[0].0.without(&["gpu", "uuid"]), found[0].1)
    };
    let owner = |pid, labels: &[(&str, &str)]| {
        let mut all = vec![("pid", pid)];
        all.extend_from_slice(labels);
        Series::new("nvidia_gpu_process_memory_used_bytes", &all)
    };
    // The owner's labels are its task's: a job's process names no user.
    let slurm = [("comm", "python"), ("slurm_job_id", "4711")];
    assert_eq!(series("301122"), (owner("301122", &slurm), 77842087936.0));
    let (container, _) = series("301123");
    assert_eq!(
        container.label("comm"),
        Some("tricky\"comm\\"),
        "{container}"
    );
    assert_eq!(
        container.label("container_id"),
        Some(docker.as_str()),
        "{container}"
    );
    // A pid with no /proc entry (another pid namespace, or gone) keeps only its pid.
    assert_eq!(series("77310").0, owner("77310", &[]));
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
    let first = ex().run_at("duty-cycle", state.path(), T0, &args);
    let process = value_in(&first, "nvidia_gpu_process_utilization_ratio", owner).unwrap();
    let gpu = value_in(&first, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]).unwrap();
    assert!((process - gpu).abs() <= 0.005, "{process} {gpu}\n{first}");
    assert_eq!(process, 0.51);
    assert!(value_in(&first, "nvidia_gpu_process_memory_used_bytes", owner).is_some());
    for run in 1..=2 {
        let text = ex().run_at("duty-cycle", state.path(), T0 + run * 10 * SECOND, &args);
        assert_eq!(
            value_in(&text, "nvidia_gpu_process_utilization_ratio", owner),
            Some(0.5)
        );
    }
}

/// A process alone on its GPU, busy 1 s / idle 1 s as the GPU is, read every
/// 15 s from NVML's 14.2 s buffer: its ratio is the GPU's (one window, one gap
/// rule), not the GPU's less the 0.8 s the buffer no longer holds.
#[test]
fn a_process_reads_what_its_gpu_reads_when_runs_are_longer_apart_than_the_buffer() {
    let state = tempfile::tempdir().unwrap();
    let args = ["--collector", "processes", "--gpm-window", "0"];
    ex().run_at("duty-cycle", state.path(), T0, &args);
    for n in 1..=3 {
        let text = ex().run_at("duty-cycle", state.path(), T0 + n * 15 * SECOND, &args);
        let (gpu, process) = gpu_and_process_4242(&text);
        assert!(
            (process - gpu).abs() < 0.01,
            "run {n}: process {process}, GPU {gpu}"
        );
        assert!((gpu - 0.5).abs() < 0.05, "run {n}: GPU {gpu}");
    }
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
    ex().stored_run("duty-cycle", state.path(), aligned + 86_400 * SECOND, &args);
    let stepped = ex().stored_run("duty-cycle", state.path(), aligned - 3_600 * SECOND, &args);
    let text = String::from_utf8(stepped.stdout).unwrap();
    let (gpu, process) = gpu_and_process_4242(&text);
    assert!((process - gpu).abs() < 0.01, "process {process}, GPU {gpu}");
    assert!(gpu > 0.3, "{text}");
}

/// GPU 0's utilization ratio and that of its process 4242 (duty-cycle.toml).
fn gpu_and_process_4242(text: &str) -> (f64, f64) {
    let gpu = value_in(text, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]).unwrap();
    let pid = [("pid", "4242")];
    let process = value_in(text, "nvidia_gpu_process_utilization_ratio", &pid).unwrap();
    (gpu, process)
}
