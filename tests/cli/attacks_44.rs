//! An outside tester's attacks on the tasks' busy time where NVML's buffer
//! lost samples: each failed on the binary it was written against.

use super::tasks::{slurm, task_value, Runs, Tree};
use super::*;

/// One H100 without GPM, busy 100 % in every sample; `processes` as given.
fn one_gpu(dir: &Path, name: &str, processes: &str) -> String {
    let toml = format!(
        "description = \"attack 44: one H100, no GPM, busy 100 %\"\n\
         [[gpu]]\n\
         uuid = \"GPU-a4400000-0000-4000-8000-000000000000\"\n\
         name = \"NVIDIA H100 80GB HBM3\"\n\
         architecture = 9\n\
         pci = {{ bus_id = \"00000000:18:00.0\", domain = 0, bus = 0x18, device = 0, pci_device_id = 0x233010de, pci_subsystem_id = 0x16c110de }}\n\
         samples = {{ period_us = 200000, gpu = [100] }}\n\
         total_energy_mj = 100000000\n\
         energy_mw = 300000\n\
         processes = [{processes}]\n"
    );
    let path = dir.join(name);
    fs::write(&path, toml).unwrap();
    path.to_str().unwrap().to_owned()
}

const BUSY_PROCESS: &str = "{ pid = 1001, used_memory = 1000, sm = [100] }";
const JOB_77: &str = "/system.slice/slurmstepd.scope/job_77/step_0/user/task_0";

/// The wall clock (NVML's sample stamps) jumps an hour ahead between two
/// runs a moment apart (a clock step, as chrony makes on a host whose RTC
/// was wrong), or runs were missed for an hour: the hour before the
/// buffer's first sample is not read. The GPU's own counters hold what was
/// sampled (14.2 s); the task's busy seconds are estimated over at most
/// twice that (28.4 s at the window's mean), never the hour.
#[test]
fn a_forward_clock_step_adds_at_most_twice_the_sampled_time() {
    let tree = Tree::new();
    tree.process(1001, 0, JOB_77, tree.a_minute_ago(), "");
    let dir = tempfile::tempdir().unwrap();
    let busy = one_gpu(dir.path(), "busy.toml", BUSY_PROCESS);
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(&busy, t0 - 3600 * SECOND);
    let second = runs.at(&busy, t0);
    let task_busy = task_value(
        &second,
        "nvidia_gpu_task_busy_seconds_total",
        "0",
        &slurm("77"),
    );
    assert!(
        close(task_busy, 3.0 * 14.2),
        "busy {task_busy} s:\n{second}"
    );
}

/// The previous run was an hour ago on NVML's clock (runs missed, or the
/// clock stepped) and the only process started after it: the time the
/// buffer lost is no time of its job's, which gets the sampled part only.
#[test]
fn the_unread_estimate_charges_no_time_before_the_task_started() {
    let tree = Tree::new();
    let dir = tempfile::tempdir().unwrap();
    let idle = one_gpu(dir.path(), "idle.toml", "");
    let busy = one_gpu(dir.path(), "busy.toml", BUSY_PROCESS);
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(&idle, t0 - 3600 * SECOND);
    tree.process(1001, 0, JOB_77, t0 / SECOND - 2, "");
    let second = runs.at(&busy, t0);
    let task_busy = task_value(
        &second,
        "nvidia_gpu_task_busy_seconds_total",
        "0",
        &slurm("77"),
    );
    // The fake's process is busy in every sample of the buffer (14.2 s).
    assert!(close(task_busy, 14.2), "busy {task_busy} s:\n{second}");
}
