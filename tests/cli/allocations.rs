//! What a job or pod was given: allocations read from the kubelet's
//! checkpoint, the Slurm hook's records and the mapping directories, counted
//! through the binary against the fake NVML (tests/scenarios/tasks.toml:
//! GPU 0 draws 300 W, GPU 1 200 W on the fake's clock).

use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use super::tasks::{task_value, tasks_tree, Runs, Tree, POD};
use super::*;

pub(super) const GPU0: &str = "GPU-7a5c0000-0000-4000-8000-000000000000";
pub(super) const GPU1: &str = "GPU-7a5c0000-0000-4000-8000-000000000001";
/// A pod with no process on any GPU.
pub(super) const IDLE_POD: &str = "0b6a7c52-1d2e-4f3a-8b9c-0d1e2f3a4b5c";
pub(super) const ALLOCATED: &str = "nvidia_gpu_task_allocated_seconds_total";
pub(super) const ENERGY: &str = "nvidia_gpu_task_energy_joules_total";
const BUSY: &str = "nvidia_gpu_task_busy_seconds_total";

/// Where the sources of a test live: `cgroup/`, `hook/`, `jobstats/`, `dcgm/`
/// and the checkpoint, beside the tree of /proc.
pub(super) struct Node {
    pub(super) tree: Tree,
    pub(super) dir: tempfile::TempDir,
}

impl Node {
    pub(super) fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        for sub in [
            "cgroup/kubepods.slice/kubepods-besteffort.slice",
            "hook",
            "jobstats",
            "dcgm",
            "journal",
        ] {
            fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let boot = journal_entry(
            1000,
            "kernel",
            "nvidia-nvlink: Nvlink Core is being initialized",
        );
        write_journal(&dir.path().join("journal"), "system@1.journal", &boot);
        let tree = tasks_tree();
        fs::create_dir(
            tree.dir
                .path()
                .join(format!("pods/ml_notebook-0_{IDLE_POD}")),
        )
        .unwrap();
        Node { tree, dir }
    }

    pub(super) fn path(&self, sub: &str) -> String {
        self.dir.path().join(sub).to_str().unwrap().to_owned()
    }

    pub(super) fn args(&self) -> Vec<String> {
        [
            "--kubelet-checkpoint",
            &self.path("checkpoint"),
            "--dra-checkpoint",
            &self.path("dra.json"),
            "--slurm-hook-dir",
            &self.path("hook"),
            "--job-map",
            &format!("gpustat:{}", self.path("jobstats")),
            "--job-map",
            &format!("dcgm:{}", self.path("dcgm")),
            "--cgroupfs",
            &self.path("cgroup"),
            "--journal-dir",
            &self.path("journal"),
        ]
        .map(String::from)
        .to_vec()
    }

    pub(super) fn runs(&self) -> Runs {
        Runs::with(&self.tree, &self.args())
    }

    /// The pod's control group, as the kubelet makes it while the pod runs.
    pub(super) fn pod_runs(&self, uid: &str) {
        let slice = format!(
            "cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
            uid.replace('-', "_")
        );
        fs::create_dir_all(self.dir.path().join(slice)).unwrap();
    }

    pub(super) fn write(&self, sub: &str, text: &str) {
        let path = self.dir.path().join(sub);
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// The hook as slurmd runs it, the fake clock at `clock_us`, `env` added.
    pub(super) fn hook_with(&self, when: &str, env: &[(&str, &str)], clock_us: u64) -> Outcome {
        let state = tempfile::tempdir().unwrap();
        let clock = clock_us.to_string();
        let args = ["--slurm-hook", when, "--slurm-hook-dir", &self.path("hook")];
        let mut all = vec![("FAKE_NVML_CLOCK_US", clock.as_str())];
        all.extend_from_slice(env);
        ex().run_args("tasks", state.path(), &args, &all)
    }

    /// The hook for `job` on `gpus` (`SLURM_JOB_GPUS`), which exits 0.
    pub(super) fn hook(&self, when: &str, job: &str, gpus: &str, clock_us: u64) -> Outcome {
        let env = [
            ("SLURM_JOB_ID", job),
            ("SLURM_JOB_UID", "1000"),
            ("SLURM_JOB_GPUS", gpus),
        ];
        let out = self.hook_with(when, &env, clock_us);
        assert_eq!(out.code(), Some(0), "{}", out.err());
        out
    }

    /// The hook's record of `job`.
    pub(super) fn record(&self, job: &str) -> serde_json::Value {
        let path = self.dir.path().join(format!("hook/job_{job}.json"));
        serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
    }

    /// `--job-report job` on the runs' state: its status, JSON and stderr.
    pub(super) fn report(
        &self,
        runs: &Runs,
        job: &str,
    ) -> (Option<i32>, serde_json::Value, String) {
        let out = ex()
            .run("tasks")
            .state_dir(runs.state())
            .args(["--job-report", job, "--slurm-hook-dir", &self.path("hook")])
            .finish()
            .unwrap();
        let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        (out.code(), json, out.err().to_string())
    }
}

pub(super) fn pod(uid: &str) -> Vec<(&str, &str)> {
    vec![("k8s_pod_uid", uid)]
}

pub(super) fn job(id: &str) -> Vec<(&str, &str)> {
    vec![("slurm_job_id", id)]
}

/// The checkpoint of a kubelet before 1.20 (a list) or since (by NUMA node).
fn checkpoint(entries: &[(&str, &str, &str)], by_node: bool) -> String {
    let entries: Vec<String> = entries
        .iter()
        .map(|(uid, container, id)| {
            let ids = if by_node {
                format!("{{\"-1\":[\"{id}\"]}}")
            } else {
                format!("[\"{id}\"]")
            };
            format!(
                "{{\"PodUID\":\"{uid}\",\"ContainerName\":\"{container}\",\
                 \"ResourceName\":\"nvidia.com/gpu\",\"DeviceIDs\":{ids},\"AllocResp\":\"CgA=\"}}"
            )
        })
        .collect();
    format!(
        "{{\"Data\":{{\"PodDeviceEntries\":[{}],\"RegisteredDevices\":{{\"nvidia.com/gpu\":[\"{GPU0}\",\"{GPU1}\"]}}}},\"Checksum\":1}}",
        entries.join(",")
    )
}

/// A pod given GPU 1 with no process of its own: seconds allocated, all the
/// GPU's energy (it had the GPU alone), busy 0 once measured; in both
/// shapes of the checkpoint. A finished pod's entry (its control group
/// gone), another resource's devices and a replica are handled as such.
#[test]
fn a_pod_given_a_gpu_without_a_process_counts_its_time_and_energy() {
    for by_node in [false, true] {
        let node = Node::new();
        node.pod_runs(IDLE_POD);
        let finished = "9c9d9e9f-0000-4000-8000-000000000001";
        node.write(
            "checkpoint",
            &checkpoint(
                &[
                    (IDLE_POD, "notebook", GPU1),
                    (finished, "old", GPU0),
                    (IDLE_POD, "notebook", "mlx5_0"),
                ],
                by_node,
            ),
        );
        let runs = node.runs();
        let started = Instant::now();
        runs.at("tasks", runs.t0);
        let second = runs.at("tasks", runs.t0 + 15 * SECOND);
        let elapsed = started.elapsed().as_secs_f64();
        let idle = pod(IDLE_POD);
        let allocated = task_value(&second, ALLOCATED, "1", &idle);
        assert!(
            allocated > 0.0 && allocated <= elapsed,
            "{allocated} of {elapsed}"
        );
        // 200 W for 15 s on the fake's clock, all of it the pod's.
        assert!(
            close(task_value(&second, ENERGY, "1", &idle), 3000.0),
            "{second}"
        );
        let names = [("k8s_namespace_name", "ml"), ("k8s_pod_name", "notebook-0")];
        assert_eq!(select(&parsed(&second), ALLOCATED, &names).len(), 1);
        let unattributed = value_in(
            &second,
            "nvidia_gpu_unattributed_energy_joules_total",
            &[("gpu", "1")],
        );
        assert_eq!(unattributed, Some(0.0));
        assert!(
            select(&parsed(&second), ALLOCATED, &pod(finished)).is_empty(),
            "{second}"
        );
        // The next window with shares measures its busy time: none.
        let third = runs.at("tasks", runs.t0 + 30 * SECOND);
        assert_eq!(task_value(&third, BUSY, "1", &idle), 0.0);
        assert_eq!(
            value_in(
                &third,
                "nvidia_gpu_collector_success",
                &[("collector", "tasks")]
            ),
            Some(1.0)
        );
    }
}

/// NVIDIA's DRA driver's checkpoint, as release 25.12 writes it (v2 with
/// v1 beside it; a MIG instance under `concrete`) and as 25.3 did (v1
/// alone): the completed claims' devices given to the pods they are
/// reserved for; a claim still being prepared is not given yet.
#[test]
fn a_dra_claim_gives_its_devices_to_its_pods() {
    let claim = |state: &str, uid: &str, devices: &str| {
        format!(
            "{{\"checkpointState\":\"{state}\",\"status\":{{\"reservedFor\":[{{\"resource\":\"pods\",\"name\":\"notebook-0\",\"uid\":\"{uid}\"}}]}},\"preparedDevices\":[{{\"devices\":[{devices}],\"configState\":{{}}}}]}}"
        )
    };
    let gpu = |uuid: &str| {
        format!("{{\"gpu\":{{\"info\":{{\"uuid\":\"{uuid}\"}},\"device\":{{\"DeviceName\":\"gpu-1\"}}}},\"mig\":null}}")
    };
    let v2 = format!(
        "{{\"checksum\":1,\"v1\":{{\"preparedClaims\":{{}}}},\"v2\":{{\"checksum\":2,\"preparedClaims\":{{\"c1\":{},\"c2\":{}}}}}}}",
        claim("PrepareCompleted", IDLE_POD, &gpu(GPU1)),
        claim("PrepareStarted", POD, &gpu(GPU0)),
    );
    let v1 = format!(
        "{{\"checksum\":1,\"v1\":{{\"preparedClaims\":{{\"c1\":{}}}}}}}",
        claim("", IDLE_POD, &gpu(GPU1)).replace("\"checkpointState\":\"\",", "")
    );
    for checkpoint in [v2, v1] {
        let node = Node::new();
        node.pod_runs(IDLE_POD);
        node.pod_runs(POD);
        node.write("dra.json", &checkpoint);
        let runs = node.runs();
        runs.at("tasks", runs.t0);
        let second = runs.at("tasks", runs.t0 + 15 * SECOND);
        assert!(
            task_value(&second, ALLOCATED, "1", &pod(IDLE_POD)) > 0.0,
            "{checkpoint}"
        );
        assert!(
            close(task_value(&second, ENERGY, "1", &pod(IDLE_POD)), 3000.0),
            "{second}"
        );
        assert!(
            select(&parsed(&second), ALLOCATED, &pod(POD)).is_empty(),
            "{second}"
        );
        let success = value_in(
            &second,
            "nvidia_gpu_collector_success",
            &[("collector", "tasks")],
        );
        assert_eq!(success, Some(1.0), "{second}");
    }
}

/// A time-sliced replica and a MIG instance are shared: time allocated, the
/// energy by shares as before.
#[test]
fn a_replica_and_a_mig_instance_are_given_but_not_whole() {
    let node = Node::new();
    node.pod_runs(POD);
    node.write(
        "checkpoint",
        &checkpoint(&[(POD, "pytorch", &format!("{GPU0}::3"))], true),
    );
    let runs = node.runs();
    runs.at("tasks", runs.t0);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    let labels = [("k8s_pod_uid", POD), ("k8s_container_name", "pytorch")];
    assert!(task_value(&second, ALLOCATED, "0", &labels) > 0.0);
    // Its process's share of the busy time (20 of 60 %): a third of 4500 J.
    assert!(
        close(task_value(&second, ENERGY, "0", &labels), 1500.0),
        "{second}"
    );

    let mig = Node::new();
    mig.pod_runs(IDLE_POD);
    let instance = "MIG-c80e5d37-91a2-5f4b-a6d3-7e1f0b9c8d24";
    mig.write(
        "checkpoint",
        &checkpoint(&[(IDLE_POD, "notebook", instance)], false),
    );
    let state = tempfile::tempdir().unwrap();
    let mut args: Vec<&str> = vec!["--gpm-window", "0"];
    let more = mig.args();
    args.extend(more.iter().map(String::as_str));
    ex().run_at("h100-mig", state.path(), runs.t0, &args);
    let text = ex().run_at("h100-mig", state.path(), runs.t0 + 15 * SECOND, &args);
    let samples = parsed(&text);
    let instance = [("gpu_instance_id", "3"), ("k8s_pod_uid", IDLE_POD)];
    assert_eq!(select(&samples, ALLOCATED, &instance).len(), 1, "{text}");
}

/// A damaged or hostile source costs only the allocations it names: the
/// step says so (success 0) and the other sources still count.
#[test]
fn a_damaged_or_hostile_source_costs_only_its_own_allocations() {
    type Damage = fn(&Node);
    let cases: [(&str, Damage); 4] = [
        ("not json", |n| n.write("checkpoint", "{\"Data\":")),
        ("writable by others", |n| {
            n.write(
                "checkpoint",
                &checkpoint(&[(IDLE_POD, "notebook", GPU1)], true),
            );
            let path = n.dir.path().join("checkpoint");
            fs::set_permissions(path, fs::Permissions::from_mode(0o666)).unwrap();
        }),
        ("a symlink", |n| {
            n.write(
                "elsewhere",
                &checkpoint(&[(IDLE_POD, "notebook", GPU1)], true),
            );
            std::os::unix::fs::symlink(
                n.dir.path().join("elsewhere"),
                n.dir.path().join("checkpoint"),
            )
            .unwrap();
        }),
        ("a bad entry", |n| {
            let good = checkpoint(&[(IDLE_POD, "notebook", GPU1)], true);
            let bad = good.replace("[{\"PodUID\"", "[{\"PodUID\":7},{\"PodUID\"");
            n.write("checkpoint", &bad);
        }),
    ];
    for (case, damage) in cases {
        let node = Node::new();
        node.pod_runs(IDLE_POD);
        damage(&node);
        node.write("jobstats/1", "4713 1000\n");
        let runs = node.runs();
        let first = runs.outcome_at("tasks", runs.t0);
        let said = "those allocations are not counted";
        assert!(first.err().contains(said), "{case}: {}", first.err());
        // Said once, when it began; the step says it every run.
        let second = runs.outcome_at("tasks", runs.t0 + 15 * SECOND);
        assert!(!second.err().contains(said), "{case}: {}", second.err());
        let second = second.text();
        let success = value_in(
            &second,
            "nvidia_gpu_collector_success",
            &[("collector", "tasks")],
        );
        assert_eq!(success, Some(0.0), "{case}");
        assert!(
            task_value(&second, ALLOCATED, "1", &job("4713")) > 0.0,
            "{case}"
        );
        let pods = select(&parsed(&second), ALLOCATED, &pod(IDLE_POD)).len();
        assert_eq!(pods, usize::from(case == "a bad entry"), "{case}: {second}");
    }
}

/// jobstats' files (a GPU's index or UUID, "<job> <uid>") and dcgm-exporter's
/// (an index, job ids one a line: shared) as those tools write them.
#[test]
fn the_mapping_directories_are_read_as_their_tools_write_them() {
    let node = Node::new();
    node.write("jobstats/1", "777 1000\n");
    node.write(&format!("jobstats/{GPU0}"), "4711 1000\n");
    node.write("dcgm/0", "778\n779\n");
    node.write("dcgm/x", "garbage");
    let runs = node.runs();
    runs.at("tasks", runs.t0);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    for (gpu, id) in [("1", "777"), ("0", "4711"), ("0", "778"), ("0", "779")] {
        assert!(task_value(&second, ALLOCATED, gpu, &job(id)) > 0.0, "{id}");
    }
    // The job whose process runs there is one task: its busy time and its
    // allocation in the same series.
    assert!(task_value(&second, BUSY, "0", &job("4711")) > 0.0);
    // Shared: the idle jobs get no energy of their own.
    assert_eq!(task_value(&second, ENERGY, "0", &job("778")), 0.0);
    let success = value_in(
        &second,
        "nvidia_gpu_collector_success",
        &[("collector", "tasks")],
    );
    assert_eq!(success, Some(0.0), "dcgm/x is no GPU");
}

/// The hook at prolog and epilog: the job's energy is the counter's
/// difference between its two edges, whatever the runs' times, and the job
/// report says it; a GPU given to one job after another splits at the
/// second one's prolog.
#[test]
fn the_hook_makes_a_jobs_energy_exact_to_its_edges() {
    let node = Node::new();
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let prolog = node.hook("prolog", "900", "0", t0 + 5 * SECOND);
    assert_eq!(prolog.code(), Some(0), "{}", prolog.err());
    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(node.dir.path().join("hook/job_900.json")).unwrap())
            .unwrap();
    assert_eq!(record["gpus"][0]["uuid"], GPU0, "{record}");
    let second = runs.at("tasks", t0 + 15 * SECOND);
    // 300 W from the prolog (5 s) to the run (15 s).
    assert!(
        close(task_value(&second, ENERGY, "0", &job("900")), 3000.0),
        "{second}"
    );
    // An XID of GPU 0 while the job has it.
    let xid = "NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=python, Graphics Exception";
    let export = journal_entry(2000, "kernel", xid);
    write_journal(
        &node.dir.path().join("journal"),
        "system@2.journal",
        &export,
    );
    assert_eq!(
        node.hook("epilog", "900", "0", t0 + 20 * SECOND).code(),
        Some(0)
    );
    let third = runs.at("tasks", t0 + 30 * SECOND);
    assert!(
        close(task_value(&third, ENERGY, "0", &job("900")), 4500.0),
        "{third}"
    );
    let allocated = task_value(&third, ALLOCATED, "0", &job("900"));
    let after = runs.at("tasks", t0 + 45 * SECOND);
    assert_eq!(
        task_value(&after, ALLOCATED, "0", &job("900")),
        allocated,
        "ended at the epilog"
    );

    let report = ex()
        .run("tasks")
        .state_dir(runs.state())
        .args([
            "--job-report",
            "900",
            "--slurm-hook-dir",
            &node.path("hook"),
        ])
        .finish()
        .unwrap();
    assert_eq!(report.code(), Some(0), "{}", report.err());
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let gpu = &report["gpus"][0];
    assert_eq!(gpu["uuid"], GPU0, "{report}");
    assert_eq!(gpu["energy_joules"], 4500.0, "{report}");
    assert_eq!(gpu["exact"], true, "{report}");
    assert_eq!(gpu["xid_errors"], 1, "{report}");
    let edges = record_edges(&node, "900");
    assert!(
        close(gpu["allocated_seconds"].as_f64().unwrap(), edges),
        "{report}"
    );

    // Job 901 from 50 s on, job 902 takes the GPU at 55 s without an epilog
    // of 901: 901 ends at 902's prolog.
    node.hook("prolog", "901", "0", t0 + 50 * SECOND);
    node.hook("prolog", "902", "0", t0 + 55 * SECOND);
    let next = runs.at("tasks", t0 + 60 * SECOND);
    assert!(
        close(task_value(&next, ENERGY, "0", &job("901")), 1500.0),
        "{next}"
    );
    assert!(
        close(task_value(&next, ENERGY, "0", &job("902")), 1500.0),
        "{next}"
    );
}

/// Seconds between a record's prolog and epilog on its first GPU.
fn record_edges(node: &Node, job: &str) -> f64 {
    let path = node.dir.path().join(format!("hook/job_{job}.json"));
    let record: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    let at = |edge: &str| record["gpus"][0][edge]["at_us"].as_u64().unwrap();
    (at("epilog") - at("prolog")) as f64 / 1e6
}

/// The hook never delays a job: beside a run stuck on a hung GPU (holding
/// the locks), and with NVML itself hung, it ends within its second, exits
/// 0 and says what it could not do in the record.
#[test]
fn the_hook_ends_in_time_beside_a_stuck_run_and_on_a_hung_nvml() {
    let node = Node::new();
    let state = tempfile::tempdir().unwrap();
    let stuck = ex()
        .run("fault-device-hang")
        .state_dir(state.path())
        .args(["--timeout", "8s"])
        .start()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let started = Instant::now();
    let hook = node.hook("prolog", "903", "0", now_on_the_sample_grid());
    assert_eq!(hook.code(), Some(0), "{}", hook.err());
    assert!(started.elapsed().as_secs_f64() < 3.0);
    assert!(node.dir.path().join("hook/job_903.json").exists());
    drop(stuck.wait());

    let hung = ex()
        .run("fault-init-hang")
        .args([
            "--slurm-hook",
            "epilog",
            "--slurm-hook-dir",
            &node.path("hook"),
        ])
        .env("SLURM_JOB_ID", "903")
        .env("SLURM_JOB_GPUS", "0")
        .finish()
        .unwrap();
    assert_eq!(hung.code(), Some(0), "{}", hung.err());
    assert!(hung.err().contains("NVML did not answer"), "{}", hung.err());
    let record = fs::read_to_string(node.dir.path().join("hook/job_903.json")).unwrap();
    assert!(
        record.contains("\"epilog\"") && record.contains("NVML did not answer"),
        "{record}"
    );
}

/// The opt-in jobstats collector: each GPU's Slurm job and its user's uid as
/// values, with jobstats' labels, from the allocations the tasks step found
/// (jobstats' file says the uid; dcgm-exporter's does not).
#[test]
fn the_jobstats_collector_gives_the_job_and_its_user_as_values() {
    let node = Node::new();
    node.write("jobstats/1", "777 1001\n");
    node.write("dcgm/0", "778\n");
    let mut args = node.args();
    args.extend(["--collector".into(), "jobstats".into()]);
    let runs = Runs::with(&node.tree, &args);
    let text = runs.at("tasks", runs.t0);
    let samples = parsed(&text);
    let job = [
        ("gpu", "1"),
        ("minor_number", "1"),
        ("jobid", "777"),
        ("userid", "1001"),
    ];
    assert_eq!(
        value(&samples, "nvidia_gpu_jobstats_job_id", &job),
        Some(777.0),
        "{text}"
    );
    assert_eq!(
        value(&samples, "nvidia_gpu_jobstats_job_uid", &job),
        Some(1001.0)
    );
    let dcgm = select(
        &samples,
        "nvidia_gpu_jobstats_job_id",
        &[("gpu", "0"), ("jobid", "778")],
    );
    assert_eq!(dcgm.len(), 1, "{text}");
    assert_eq!(dcgm[0].0.label("userid"), None);
    assert!(select(&samples, "nvidia_gpu_jobstats_job_uid", &[("jobid", "778")]).is_empty());
    // Off by default.
    let plain = Runs::with(&node.tree, &node.args()).at("tasks", runs.t0);
    assert!(!plain.contains("nvidia_gpu_jobstats_job_id"));
}

/// A job without GPUs (a CPU job on a GPU node runs the same prolog) leaves
/// no record and says nothing: no line in the journal per CPU job.
#[test]
fn the_hook_is_silent_for_a_job_without_gpus() {
    let node = Node::new();
    let state = tempfile::tempdir().unwrap();
    let out = ex()
        .run("tasks")
        .state_dir(state.path())
        .args([
            "--slurm-hook",
            "prolog",
            "--slurm-hook-dir",
            &node.path("hook"),
        ])
        .env("SLURM_JOB_ID", "992")
        .env("CUDA_VISIBLE_DEVICES", "NoDevFiles")
        .finish()
        .unwrap();
    assert_eq!(out.code(), Some(0));
    assert_eq!(out.err(), "");
    assert!(!node.dir.path().join("hook/job_992.json").exists());
}
