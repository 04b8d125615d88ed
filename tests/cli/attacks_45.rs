//! An outside tester's attacks on the restructured exporter: the run's
//! budget against /proc, the state's parts, and the NOT_SUPPORTED memo now
//! applied to every call. Each failed on the binary it was written against.

use super::tasks::{gpu0_failing, slurm, task_value, tasks_tree, Runs};
use super::*;

/// A file of `/proc/<pid>` that never answers (here a FIFO no one writes
/// in place of `cgroup`; on a host, a read waiting on a kernel lock): only
/// the environment is read on a thread of its own, so the host step blocks
/// the main thread, the hard stop ends the run at --timeout and nothing is
/// published. The file must be in place by --timeout, as it is when a GPU
/// hangs; the tasks step may fail (`nvidia_gpu_collector_success 0`).
#[test]
fn a_proc_file_that_never_answers_still_leaves_the_file_in_place() {
    let tree = tasks_tree();
    for file in ["cgroup", "stat", "status"] {
        let path = tree.dir.path().join("proc/1001").join(file);
        let _ = fs::remove_file(&path);
        let made = Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(made.success());
    }
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut args = tree.args();
    let out_dir = out.path().to_str().unwrap().to_owned();
    args.extend(["--timeout", "2s", "--output-dir", &out_dir].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let outcome = ex().run_args("tasks", state.path(), &args, &[]);
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2600), "{took:?}");
    let file = out.path().join("nvidia_gpu.prom");
    assert!(
        file.exists(),
        "nothing published in {took:?} (exit {:?}): {}",
        outcome.code(),
        outcome.err()
    );
    let text = fs::read_to_string(&file).unwrap();
    assert_eq!(value_in(&text, "nvidia_gpu_up", &[("gpu", "1")]), Some(1.0));
}

/// The `"parts":{…}` object of every GPU in the state text replaced by
/// `parts`.
fn with_parts(state: &str, parts: &str) -> String {
    let key = "\"parts\":{";
    let mut out = String::new();
    let mut rest = state;
    while let Some(at) = rest.find(key) {
        out.push_str(&rest[..at]);
        let body = &rest[at + key.len() - 1..];
        let mut depth = 0;
        let mut end = 0;
        for (i, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push_str("\"parts\":");
        out.push_str(parts);
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

/// A state whose GPUs keep 8 parts no collector of this build sets (parts
/// of a release that had others: the merge keeps a part a run did not set,
/// and never drops one): it is read (8 is the bound), the run adds its own
/// parts and stores 9, which the next run refuses as damaged, so every
/// running total, task ledger and XID count starts again at 0. What is
/// stored must never exceed what is read.
#[test]
fn a_run_never_stores_more_parts_than_the_next_run_reads() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let path = runs.state().join("state");
    let text = fs::read_to_string(&path).unwrap();
    let old: Vec<String> = (0..8)
        .map(|i| format!("\"old.part{i}\":{{\"value\":{i}}}"))
        .collect();
    let crafted = with_parts(&text, &format!("{{{}}}", old.join(",")));
    assert_ne!(crafted, text);
    fs::write(&path, crafted).unwrap();
    let second = runs.at("tasks", t0 + 15 * SECOND);
    let ok = |text: &str| value_in(text, "nvidia_gpu_collector_state_ok", &[]);
    assert_eq!(ok(&second), Some(1.0), "{second}");
    let third = runs.at("tasks", t0 + 30 * SECOND);
    assert_eq!(
        ok(&third),
        Some(1.0),
        "the state the second run stored:\n{third}"
    );
    let busy = |text: &str| {
        value_in(
            text,
            "nvidia_gpu_busy_seconds_total",
            &[("gpu", "0"), ("engine", "gpu")],
        )
        .unwrap()
    };
    assert!(busy(&third) > busy(&second), "{second}\n{third}");
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` answers NOT_SUPPORTED in one
/// run (a transient answer) and its processes again in the next: it is asked
/// every run. Remembered for 40 runs (10 minutes of the timer), as other
/// NOT_SUPPORTED answers are, the GPU's tasks would not be seen: no busy
/// time, their energy unattributed, their memory and process series gone,
/// ten minutes of every job's accounting on the GPU lost for good.
#[test]
fn a_process_list_not_supported_once_is_read_again_the_next_run() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let dir = tempfile::tempdir().unwrap();
    let failing = gpu0_failing(
        dir.path(),
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "NOT_SUPPORTED",
    );
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let second = runs.outcome_at(&failing, t0 + 15 * SECOND);
    assert!(second.success(), "{}", second.err());
    let third = runs.at("tasks", t0 + 30 * SECOND);
    let fourth = runs.at("tasks", t0 + 45 * SECOND);
    let memory = parsed(&third);
    let job = select(
        &memory,
        "nvidia_gpu_task_memory_used_bytes",
        &[("gpu", "0"), ("slurm_job_id", "4711")],
    );
    assert_eq!(job.len(), 1, "the job's processes are not read:\n{third}");
    let busy = |text: &str| {
        task_value(
            text,
            "nvidia_gpu_task_busy_seconds_total",
            "0",
            &slurm("4711"),
        )
    };
    // 40 % of the 15 s between the third and the fourth run (14.2 s of it
    // sampled).
    assert!(busy(&fourth) - busy(&third) > 5.5, "{third}\n{fourth}");
    let nobody = value_in(
        &fourth,
        "nvidia_gpu_unattributed_energy_joules_total",
        &[("gpu", "0")],
    )
    .unwrap();
    let before = value_in(
        &third,
        "nvidia_gpu_unattributed_energy_joules_total",
        &[("gpu", "0")],
    )
    .unwrap();
    assert_eq!(nobody, before, "{fourth}");
}
