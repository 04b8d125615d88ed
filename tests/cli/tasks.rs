//! Per-task counters: owners from a test tree of /proc and the kubelet's log
//! directories, counted from run to run through the state.

use super::*;

pub(super) const POD: &str = "3f0c8a52-9b1e-4c7d-8e2f-5a6b7c8d9e01";
const POD_CGROUPFS: &str = "5e1d2c3b-4a59-4687-9a0b-1c2d3e4f5a6b";
pub(super) const SLUID: &str = "sEKNKTV3WPV500";

/// A /proc and kubelet log tree: `proc/`, `pods/`, `containers/`.
pub(super) struct Tree {
    pub(super) dir: tempfile::TempDir,
    pub(super) boot_s: u64,
}

impl Tree {
    pub(super) fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["proc", "pods", "containers"] {
            fs::create_dir(dir.path().join(sub)).unwrap();
        }
        // The host's own boot: the exporter counts process starts (ticks
        // after boot) on its boot clock.
        let uptime = fs::read_to_string("/proc/uptime").unwrap();
        let uptime_s: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
        let boot_s = now_on_the_sample_grid() / SECOND - uptime_s as u64;
        fs::write(
            dir.path().join("proc/stat"),
            format!("cpu 1 2 3\nbtime {boot_s}\n"),
        )
        .unwrap();
        Tree { dir, boot_s }
    }

    /// A start a minute ago (Unix time, whole seconds).
    pub(super) fn a_minute_ago(&self) -> u64 {
        now_on_the_sample_grid() / SECOND - 60
    }

    pub(super) fn path(&self, sub: &str) -> String {
        self.dir.path().join(sub).to_str().unwrap().to_owned()
    }

    /// Process `pid` of user `uid` in `cgroup`, started at `start_s` (Unix
    /// time, whole seconds), with `environ`.
    pub(super) fn process(&self, pid: u32, uid: u32, cgroup: &str, start_s: u64, environ: &str) {
        let dir = self.dir.path().join("proc").join(pid.to_string());
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let ticks = (start_s - self.boot_s) * 100;
        let stat = format!("{pid} (py) thon) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {ticks} 1 1");
        fs::write(dir.join("stat"), stat).unwrap();
        fs::write(
            dir.join("status"),
            format!("Name:\tpy\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .unwrap();
        fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
        fs::write(dir.join("environ"), environ.replace(' ', "\0")).unwrap();
    }

    pub(super) fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["--gpm-window", "0", "--procfs"].map(String::from).to_vec();
        args.push(self.path("proc"));
        args.push("--pod-log-dir".into());
        args.push(self.path("pods"));
        args.push("--container-log-dir".into());
        args.push(self.path("containers"));
        args
    }
}

/// Runs at the fake NVML's clock from `t0` (now, on the sample grid) with a
/// state of their own, the tree as /proc and the kubelet's directories.
pub(super) struct Runs {
    pub(super) t0: u64,
    state: tempfile::TempDir,
    args: Vec<String>,
}

impl Runs {
    pub(super) fn new(tree: &Tree) -> Runs {
        Runs::with(tree, &[])
    }

    /// Runs with `more` arguments after the tree's.
    pub(super) fn with(tree: &Tree, more: &[String]) -> Runs {
        let state = tempfile::tempdir().unwrap();
        let (t0, mut args) = (now_on_the_sample_grid(), tree.args());
        args.extend_from_slice(more);
        Runs { t0, state, args }
    }

    /// A checked run of `scenario` at the clock `clock_us`; its text.
    pub(super) fn at(&self, scenario: &str, clock_us: u64) -> String {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        ex().run_at(scenario, self.state.path(), clock_us, &args)
    }

    /// An unchecked run of `scenario` at the clock `clock_us`.
    pub(super) fn outcome_at(&self, scenario: &str, clock_us: u64) -> Outcome {
        let clock = clock_us.to_string();
        let mut args = vec!["--stdout", "--write-state"];
        args.extend(self.args.iter().map(String::as_str));
        let env = [("FAKE_NVML_CLOCK_US", clock.as_str())];
        ex().run_args(scenario, self.state.path(), &args, &env)
    }

    pub(super) fn state(&self) -> &Path {
        self.state.path()
    }
}

/// GPU 0 of tests/scenarios/tasks.toml answering `symbol` with `error`,
/// written in `dir`; its path.
pub(super) fn gpu0_failing(dir: &Path, symbol: &str, error: &str) -> String {
    let toml = fs::read_to_string(ex().scenario("tasks")).unwrap();
    let energy = "energy_mw = 300000\n";
    assert_eq!(toml.matches(energy).count(), 1);
    let failing = format!("{energy}errors = {{ {symbol} = \"{error}\" }}\n");
    let scenario = dir.join(format!("{symbol}-{error}.toml"));
    fs::write(&scenario, toml.replace(energy, &failing)).unwrap();
    scenario.to_str().unwrap().to_owned()
}

/// The tasks of tests/scenarios/tasks.toml, started ten minutes ago.
pub(super) fn tasks_tree() -> Tree {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    let container = "c0".repeat(32);
    let pod_systemd = POD.replace('-', "_");
    tree.process(
        1001,
        1000,
        "/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0",
        start,
        "",
    );
    tree.process(
        1002,
        0,
        &format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_systemd}.slice/cri-containerd-{container}.scope"),
        start,
        "",
    );
    fs::create_dir(tree.dir.path().join(format!("pods/ml_trainer-0_{POD}"))).unwrap();
    let log = format!("containers/trainer-0_ml_pytorch-{container}.log");
    fs::write(tree.dir.path().join(log), "").unwrap();
    tree.process(
        2001,
        1000,
        &format!("/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_0"),
        start,
        &format!("SLURM_JOB_ID=4712 SLURM_JOB_SLUID={SLUID} "),
    );
    tree.process(
        2002,
        0,
        &format!("/kubepods/besteffort/pod{POD_CGROUPFS}/{}", "d1".repeat(32)),
        start,
        "",
    );
    tree.process(
        2003,
        0,
        "/user.slice/user-0.slice/session-4.scope",
        start,
        "",
    );
    tree.process(2004, 0, "/system.slice/inference.service", start, "");
    tree.process(
        2005,
        0,
        &format!("/system.slice/docker-{}.scope", "e2".repeat(32)),
        start,
        "",
    );
    tree
}

/// A task's value of `family` on GPU `gpu`, found by its labels.
pub(super) fn task_value(text: &str, family: &str, gpu: &str, labels: &[(&str, &str)]) -> f64 {
    let samples = parsed(text);
    let mut all = vec![("gpu", gpu)];
    all.extend_from_slice(labels);
    let found = select(&samples, family, &all);
    assert_eq!(found.len(), 1, "{family} {all:?}:\n{text}");
    found[0].1
}

pub(super) fn slurm(id: &str) -> Vec<(&str, &str)> {
    vec![("slurm_job_id", id)]
}

#[test]
fn each_task_gets_its_share_of_busy_time_and_energy_from_run_to_run() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    let first = runs.at("tasks", t0);
    // The first run sets the baseline: every task at 0.
    assert_eq!(
        task_value(
            &first,
            "nvidia_gpu_task_busy_seconds_total",
            "0",
            &slurm("4711")
        ),
        0.0
    );
    let second = runs.at("tasks", t0 + 10 * SECOND);
    let busy = |gpu, labels: &[(&str, &str)]| {
        task_value(&second, "nvidia_gpu_task_busy_seconds_total", gpu, labels)
    };
    let energy = |gpu, labels: &[(&str, &str)]| {
        task_value(&second, "nvidia_gpu_task_energy_joules_total", gpu, labels)
    };
    let pod = [
        ("k8s_namespace_name", "ml"),
        ("k8s_pod_name", "trainer-0"),
        ("k8s_pod_uid", POD),
        ("k8s_container_name", "pytorch"),
    ];
    // GPU 0: busy 60 % of 10 s, shared 40:20; 300 W for 10 s.
    assert!(close(busy("0", &slurm("4711")), 4.0), "{second}");
    assert!(close(busy("0", &pod), 2.0), "{second}");
    assert!(close(energy("0", &slurm("4711")), 2000.0), "{second}");
    assert!(close(energy("0", &pod), 1000.0), "{second}");
    // GPU 1: busy 50 %, shared 30:10:5:5 (an idle container gets nothing);
    // 200 W.
    let sluid = [("slurm_job_id", "4712"), ("slurm_job_sluid", SLUID)];
    let cgroupfs = [("k8s_pod_uid", POD_CGROUPFS)];
    let user = [("user", "root")];
    let unit = [("systemd_unit", "inference.service")];
    let container = "e2".repeat(32);
    let docker = [("container_id", container.as_str())];
    for (labels, seconds, joules) in [
        (&sluid[..], 3.0, 1200.0),
        (&cgroupfs[..], 1.0, 400.0),
        (&user[..], 0.5, 200.0),
        (&unit[..], 0.5, 200.0),
        (&docker[..], 0.0, 0.0),
    ] {
        assert!(close(busy("1", labels), seconds), "{labels:?}: {second}");
        assert!(close(energy("1", labels), joules), "{labels:?}: {second}");
    }
    // The owners add up to the GPU's busy time and energy.
    let gpu_busy = value_in(
        &second,
        "nvidia_gpu_busy_seconds_total",
        &[("gpu", "1"), ("engine", "gpu")],
    );
    let first_busy = value_in(
        &first,
        "nvidia_gpu_busy_seconds_total",
        &[("gpu", "1"), ("engine", "gpu")],
    );
    assert!(
        close(gpu_busy.unwrap() - first_busy.unwrap(), 5.0),
        "{second}"
    );
    let unattributed = value_in(
        &second,
        "nvidia_gpu_unattributed_energy_joules_total",
        &[("gpu", "1")],
    );
    assert_eq!(unattributed, Some(0.0));
    // Held since the previous run (the processes started before it), and
    // the memory each task holds now.
    let held = task_value(&second, "nvidia_gpu_task_held_seconds_total", "1", &docker);
    assert!(held > 0.0 && held < 60.0, "{held}");
    let memory = task_value(
        &second,
        "nvidia_gpu_task_memory_used_bytes",
        "0",
        &slurm("4711"),
    );
    assert_eq!(memory, 20e9);
}

#[test]
fn a_task_that_exits_or_whose_pid_is_reused_keeps_its_share() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("tasks", t0);
    runs.at("tasks", t0 + 10 * SECOND);
    // Before the third run the pod's process has exited, and the job's pid
    // belongs to a process of another job that started when the window
    // ended (after NVML last saw the pid busy).
    fs::remove_dir_all(tree.dir.path().join("proc/1002")).unwrap();
    let cgroup = "/system.slice/slurmstepd.scope/job_4799/step_0/user/task_0";
    tree.process(1001, 1000, cgroup, (t0 + 21 * SECOND) / SECOND, "");
    let third = runs.at("tasks", t0 + 20 * SECOND);
    let pod = [("k8s_pod_uid", POD)];
    let busy = |labels: &[(&str, &str)]| {
        task_value(&third, "nvidia_gpu_task_busy_seconds_total", "0", labels)
    };
    assert!(close(busy(&slurm("4711")), 8.0), "{third}");
    assert!(close(busy(&pod), 4.0), "{third}");
    assert_eq!(busy(&slurm("4799")), 0.0, "{third}");
    // The exited pod holds no memory now; its series stay (until 10 min
    // after it last held the GPU).
    let samples = parsed(&third);
    let memory = select(
        &samples,
        "nvidia_gpu_task_memory_used_bytes",
        &[("k8s_pod_uid", POD)],
    );
    assert!(memory.is_empty(), "{third}");
}

#[test]
fn a_lost_state_starts_the_tasks_afresh_and_counts_nothing_twice() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let second = runs.at("tasks", t0 + 10 * SECOND);
    assert!(close(
        task_value(
            &second,
            "nvidia_gpu_task_busy_seconds_total",
            "0",
            &slurm("4711")
        ),
        4.0
    ));
    // The state is lost: the next run only sets a new baseline.
    for entry in fs::read_dir(runs.state()).unwrap() {
        fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let third = runs.at("tasks", t0 + 20 * SECOND);
    assert_eq!(
        task_value(
            &third,
            "nvidia_gpu_task_busy_seconds_total",
            "0",
            &slurm("4711")
        ),
        0.0
    );
    assert_eq!(
        value_in(
            &third,
            "nvidia_gpu_unattributed_energy_joules_total",
            &[("gpu", "0")]
        ),
        Some(0.0)
    );
    let fourth = runs.at("tasks", t0 + 30 * SECOND);
    assert!(close(
        task_value(
            &fourth,
            "nvidia_gpu_task_busy_seconds_total",
            "0",
            &slurm("4711")
        ),
        4.0
    ));
}

/// 64 GPUs with 100 tasks each (a unit apiece) fit the state's bounds:
/// every task is counted, and the state is kept.
#[test]
fn sixty_four_gpus_with_a_hundred_tasks_each_fit_the_bounds() {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    let dir = tempfile::tempdir().unwrap();
    let mut toml = String::from(
        "description = \"64 GPUs, 100 tasks each. Follows: tests/scenarios/tasks.toml\"\n",
    );
    for gpu in 0..64u32 {
        toml += &format!(
            "[[gpu]]\nuuid = \"GPU-7a5c0000-0000-4000-8000-{gpu:012}\"\nname = \"NVIDIA H100 80GB HBM3\"\n\
             samples = {{ period_us = 200000, gpu = [100] }}\ntotal_energy_mj = 1000\nenergy_mw = 100000\nprocesses = [\n"
        );
        for task in 0..100u32 {
            let pid = 10_000 + gpu * 100 + task;
            toml += &format!("  {{ pid = {pid}, used_memory = 1000, sm = [1] }},\n");
            tree.process(
                pid,
                0,
                &format!("/system.slice/task-{task}.service"),
                start,
                "",
            );
        }
        toml += "]\n";
    }
    let scenario = dir.path().join("many.toml");
    fs::write(&scenario, toml).unwrap();
    let scenario = scenario.to_str().unwrap();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(scenario, t0);
    let second = runs.at(scenario, t0 + 10 * SECOND);
    let samples = parsed(&second);
    let busy = select(&samples, "nvidia_gpu_task_busy_seconds_total", &[]);
    assert_eq!(busy.len(), 6400);
    // Each task: 1 % of 10 s on a GPU busy 100 %, normalised to the GPU.
    assert!(busy.iter().all(|(_, v)| close(*v, 0.1)), "{second}");
    assert_eq!(
        value(&samples, "nvidia_gpu_collector_state_ok", &[]),
        Some(1.0)
    );
}

/// A Slurm job under cgroup v1 (a hybrid host: the job in the controllers'
/// hierarchies, the unified one unused).
#[test]
fn a_slurm_job_under_cgroup_v1_is_its_task() {
    let tree = tasks_tree();
    let v1 = "12:memory:/slurm/uid_1000/job_99/step_0/task_0\n\
              4:devices:/slurm/uid_1000/job_99/step_0/task_0\n\
              1:name=systemd:/system.slice/slurmd.service\n0::/\n";
    fs::write(tree.dir.path().join("proc/2004/cgroup"), v1).unwrap();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let second = runs.at("tasks", t0 + 10 * SECOND);
    let busy = task_value(
        &second,
        "nvidia_gpu_task_busy_seconds_total",
        "1",
        &slurm("99"),
    );
    assert!(close(busy, 0.5), "{second}");
    assert!(!second.contains("inference.service"), "{second}");
}

/// A process's environment that does not answer (its memory map held by a
/// process stuck in the driver; here a FIFO no one writes): the run ends by
/// its deadline, the job keeps its SLUID without the number.
#[test]
fn an_environment_that_does_not_answer_costs_only_the_job_number() {
    let tree = tasks_tree();
    let environ = tree.dir.path().join("proc/2001/environ");
    fs::remove_file(&environ).unwrap();
    let made = Command::new("mkfifo").arg(&environ).status().unwrap();
    assert!(made.success());
    let mut args = tree.args();
    args.extend(["--timeout", "3s"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let state = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let text = ex().run_at("tasks", state.path(), now_on_the_sample_grid(), &args);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let samples = parsed(&text);
    let job = select(
        &samples,
        "nvidia_gpu_task_busy_seconds_total",
        &[("slurm_job_sluid", SLUID)],
    );
    assert_eq!(job.len(), 1, "{text}");
    assert_eq!(job[0].0.label("slurm_job_id"), None, "{text}");
}

/// GPU 0's energy counter cannot be read in one run (a transient error; the
/// GPU stays up): that run charges nothing, and the next reading charges all
/// the energy since the last one, split by the shares it knows: none is lost.
#[test]
fn an_energy_reading_that_fails_loses_no_energy() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let dir = tempfile::tempdir().unwrap();
    let failing = gpu0_failing(dir.path(), "nvmlDeviceGetTotalEnergyConsumption", "UNKNOWN");
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let second = runs.at(&failing, t0 + 10 * SECOND);
    let third = runs.at("tasks", t0 + 20 * SECOND);
    let energy = |text: &str, labels: &[(&str, &str)]| {
        task_value(text, "nvidia_gpu_task_energy_joules_total", "0", labels)
    };
    let nobody = |text: &str| {
        value_in(
            text,
            "nvidia_gpu_unattributed_energy_joules_total",
            &[("gpu", "0")],
        )
    };
    let pod = [("k8s_pod_uid", POD)];
    assert_eq!(energy(&second, &slurm("4711")), 0.0, "{second}");
    assert_eq!(nobody(&second), Some(0.0), "{second}");
    // 300 W for the 20 s since the first run's reading, split 40:20.
    assert!(close(energy(&third, &slurm("4711")), 4000.0), "{third}");
    assert!(close(energy(&third, &pod), 2000.0), "{third}");
    assert_eq!(nobody(&third), Some(0.0), "{third}");
    // Busy time was counted in every window.
    let busy = task_value(
        &third,
        "nvidia_gpu_task_busy_seconds_total",
        "0",
        &slurm("4711"),
    );
    assert!(close(busy, 8.0), "{third}");
    let ok = value_in(&third, "nvidia_gpu_collector_state_ok", &[]);
    assert_eq!(ok, Some(1.0), "{third}");
}

/// A GPU whose processes' utilization NVML does not support: its tasks'
/// busy time is unknown, so they have no busy series (none published as
/// idle), but their time held and energy as ever; the other GPU's tasks
/// are counted as ever.
#[test]
fn tasks_whose_busy_time_nvml_does_not_measure_have_no_busy_series() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let dir = tempfile::tempdir().unwrap();
    let unsupported = gpu0_failing(
        dir.path(),
        "nvmlDeviceGetProcessUtilization",
        "NOT_SUPPORTED",
    );
    let t0 = runs.t0;
    let first = runs.at(&unsupported, t0);
    let second = runs.at(&unsupported, t0 + 10 * SECOND);
    for text in [&first, &second] {
        let samples = parsed(text);
        let busy = select(
            &samples,
            "nvidia_gpu_task_busy_seconds_total",
            &[("gpu", "0")],
        );
        assert!(busy.is_empty(), "{text}");
        let held = select(
            &samples,
            "nvidia_gpu_task_held_seconds_total",
            &[("gpu", "0")],
        );
        assert_eq!(held.len(), 2, "{text}");
    }
    let held = task_value(
        &second,
        "nvidia_gpu_task_held_seconds_total",
        "0",
        &slurm("4711"),
    );
    assert!(held > 0.0, "{second}");
    // Two holders and no shares: GPU 0's energy is nobody's, as before.
    let nobody = value_in(
        &second,
        "nvidia_gpu_unattributed_energy_joules_total",
        &[("gpu", "0")],
    );
    assert!(close(nobody.unwrap(), 3000.0), "{second}");
    let sluid = [("slurm_job_sluid", SLUID)];
    let busy = task_value(&second, "nvidia_gpu_task_busy_seconds_total", "1", &sluid);
    assert!(close(busy, 3.0), "{second}");
}

/// A task whose busy time was measured keeps its busy series through a
/// window without shares (NVML's processes' utilization failing once): the
/// series does not come and go; it does not grow in that run, and the next
/// run counts the failed run's window, busy time and energy, with its own.
#[test]
fn a_busy_series_stays_through_a_window_without_shares() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let dir = tempfile::tempdir().unwrap();
    let failing = gpu0_failing(dir.path(), "nvmlDeviceGetProcessUtilization", "UNKNOWN");
    let t0 = runs.t0;
    runs.at("tasks", t0);
    runs.at("tasks", t0 + 10 * SECOND);
    let third = runs.at(&failing, t0 + 20 * SECOND);
    let busy = |text: &str| {
        task_value(
            text,
            "nvidia_gpu_task_busy_seconds_total",
            "0",
            &slurm("4711"),
        )
    };
    assert!(close(busy(&third), 4.0), "{third}");
    let fourth = runs.at("tasks", t0 + 30 * SECOND);
    // Nothing lost: 40 % of 30 s, and 300 W for 30 s split 40:20.
    assert!(close(busy(&fourth), 12.0), "{fourth}");
    let energy = |labels: &[(&str, &str)]| {
        task_value(&fourth, "nvidia_gpu_task_energy_joules_total", "0", labels)
    };
    let nobody = value_in(
        &fourth,
        "nvidia_gpu_unattributed_energy_joules_total",
        &[("gpu", "0")],
    );
    assert_eq!(nobody, Some(0.0), "{fourth}");
    assert!(close(energy(&slurm("4711")), 6000.0), "{fourth}");
    assert!(close(energy(&[("k8s_pod_uid", POD)]), 3000.0), "{fourth}");
}

/// The demo node (`make demo`) twice, from a state of its own, with `args`
/// added: the second run's text.
fn demo_twice(args: &[&str]) -> String {
    let node = format!("{ROOT}/tests/fixtures/demo-node");
    let (proc, pods, containers) = (
        format!("{node}/proc"),
        format!("{node}/pods"),
        format!("{node}/containers"),
    );
    let mut all = vec!["--procfs", &proc, "--pod-log-dir", &pods];
    all.extend(["--container-log-dir", &containers]);
    all.extend_from_slice(args);
    let (state, t0) = (tempfile::tempdir().unwrap(), now_on_the_sample_grid());
    ex().run_at("demo-h100x8", state.path(), t0, &all);
    ex().run_at("demo-h100x8", state.path(), t0 + 15 * SECOND, &all)
}

/// The processes collector reads the processes the tasks collector counts
/// and leaves them: with both on, the tasks' series are those of the
/// default run, and each process carries the labels of its task.
#[test]
fn tasks_count_the_same_with_the_processes_collector() {
    let alone = parsed(&demo_twice(&[]));
    let both_text = demo_twice(&["--collector", "tasks", "--collector", "processes"]);
    let both = parsed(&both_text);
    let tasks = |samples: &Samples| -> Vec<(Series, f64)> {
        let task =
            |s: &Series| s.name.starts_with("nvidia_gpu_task_") || s.name.contains("unattributed");
        samples
            .iter()
            .filter(|(s, _)| task(s))
            .map(|(s, &v)| (s.clone(), v))
            .collect()
    };
    let (alone, with) = (tasks(&alone), tasks(&both));
    assert_eq!(
        alone
            .iter()
            .filter(|(s, _)| s.name.starts_with("nvidia_gpu_task_"))
            .count(),
        40
    );
    assert_eq!(alone.len(), with.len(), "{both_text}");
    for ((series, a), (other, b)) in alone.iter().zip(&with) {
        assert_eq!(series, other);
        // Held time runs on the host's clock, which moves between the runs.
        let slack = if series.name.contains("held") {
            5.0
        } else {
            1e-9
        };
        assert!((a - b).abs() <= slack, "{series}: {a} and {b}");
    }
    let owner = |s: &Series| s.without(&["pid", "compute_instance_id", "comm"]).labels;
    let task_owners: Vec<_> = with.iter().map(|(s, _)| s.labels.clone()).collect();
    let processes = both
        .keys()
        .filter(|s| s.name == "nvidia_gpu_process_memory_used_bytes");
    let mut attributed = 0;
    for process in processes {
        if process.label("comm").is_some() {
            assert!(task_owners.contains(&owner(process)), "{process}");
            attributed += 1;
        }
    }
    assert!(attributed > 0, "{both_text}");
}
