//! An outside tester's attacks on the per-task counters (issue 37): what an
//! unprivileged user can write (cgroup names, environment), what the
//! kubelet's directories can hold, floods of tasks, driver reloads,
//! renumbered GPUs, the previous release's state and MIG.

use super::tasks::{slurm, task_value, tasks_tree, Runs, Tree, POD, SLUID};
use super::*;
use serde_json::json;

const BUSY: &str = "nvidia_gpu_task_busy_seconds_total";
const ENERGY: &str = "nvidia_gpu_task_energy_joules_total";
const HELD: &str = "nvidia_gpu_task_held_seconds_total";

/// One H100 busy `busy` % with `processes` (pid, SM %), 100 W.
fn one_gpu(dir: &Path, busy: u32, processes: &[(u32, u32)]) -> String {
    let mut toml = format!(
        "description = \"one GPU for attacks. Follows: tests/scenarios/tasks.toml\"\n\
         [[gpu]]\nuuid = \"GPU-7a5c0000-0000-4000-8000-0000000000aa\"\nname = \"NVIDIA H100 80GB HBM3\"\n\
         samples = {{ period_us = 200000, gpu = [{busy}] }}\ntotal_energy_mj = 1000\nenergy_mw = 100000\nprocesses = [\n"
    );
    for (pid, sm) in processes {
        toml += &format!("  {{ pid = {pid}, used_memory = 1000, sm = [{sm}] }},\n");
    }
    toml += "]\n";
    let scenario = dir.join("attack.toml");
    fs::write(&scenario, toml).unwrap();
    scenario.to_str().unwrap().to_owned()
}

fn sum(text: &str, family: &str, labels: &[(&str, &str)]) -> f64 {
    select(&parsed(text), family, labels)
        .iter()
        .map(|(_, v)| v)
        .sum()
}

fn state_ok(text: &str) -> Option<f64> {
    value(&parsed(text), "nvidia_gpu_collector_state_ok", &[])
}

/// pid 1001 (job 4711, 40 %) exits mid-window and the pid goes to a
/// process of job 4799 that then runs on the GPU (started before NVML last
/// saw the pid busy): the window's share goes to one of them, never both,
/// and the tasks still add up to the GPU's busy time.
#[test]
fn a_pid_reused_by_another_job_is_counted_once() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("tasks", t0);
    runs.at("tasks", t0 + 10 * SECOND);
    let cgroup = "/system.slice/slurmstepd.scope/job_4799/step_0/user/task_0";
    tree.process(1001, 1001, cgroup, (t0 + 12 * SECOND) / SECOND, "");
    let third = runs.at("tasks", t0 + 20 * SECOND);
    let gpu0 = [("gpu", "0")];
    // 60 % of 20 s, all of it the tasks'.
    assert!(close(sum(&third, BUSY, &gpu0), 12.0), "{third}");
    let old = task_value(&third, BUSY, "0", &slurm("4711"));
    let new = task_value(&third, BUSY, "0", &slurm("4799"));
    assert!(close(old + new, 8.0), "{third}");
    // The new job held the GPU from its start only (8 s), the old one no
    // more after the previous run.
    assert!(task_value(&third, HELD, "0", &slurm("4799")) <= 8.0 + 1e-9);
}

/// Names a user can give cgroups in their own delegated subtree (and, on
/// a kernel that takes a line feed in a name, the lines those make), and
/// units whose names need escaping: the user's processes stay the user's,
/// the exposition stays valid.
#[test]
fn hostile_cgroup_names_place_nothing_and_are_escaped() {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    let mine = "/user.slice/user-1000.slice/user@1000.service/app.slice";
    let pod_systemd = POD.replace('-', "_");
    let id = "ab".repeat(32);
    let long = "x".repeat(4000);
    let forged = [
        format!("0::{mine}/slurmstepd.scope/job_4711/step_0"),
        format!("0::{mine}/job_4711"),
        format!("0::{mine}/kubepods.slice/kubepods-pod{pod_systemd}.slice"),
        format!("0::{mine}/kubepods/pod{POD}/{id}"),
        format!("0::{mine}/docker-{id}.scope"),
        format!("0::{mine}/a\"b\\c.service"),
        format!("0::{mine}/{long}.service"),
        // Pure v2: a line feed adds a second unified line after the real one.
        format!("0::{mine}/x\n0::/system.slice/slurmstepd.scope/job_4711/step_0"),
        // Hybrid (v1 lines first, the unified line last): a name in the
        // delegated name=systemd hierarchy adds lines before the real ones.
        format!(
            "1:name=systemd:{mine}/x\n0::/system.slice/slurmstepd.scope/job_4711/step_0\n0::{mine}/x"
        ),
        format!("1:name=systemd:{mine}/x\n1:devices:/slurm/uid_1000/job_99/step_0\n0::/"),
        format!(
            "1:name=systemd:{mine}/x\n1:cpu:/kubepods/pod{POD}/{id}\n0::/"
        ),
    ];
    let mut processes = Vec::new();
    for (n, cgroup) in forged.iter().enumerate() {
        let pid = 3000 + n as u32;
        tree.process(pid, 1000, "/", start, "SLURM_JOB_ID=4711 ");
        fs::write(
            tree.dir.path().join(format!("proc/{pid}/cgroup")),
            format!("{cgroup}\n"),
        )
        .unwrap();
        processes.push((pid, 5));
    }
    // Root's units with names that need escaping.
    tree.process(3100, 0, "/system.slice/q\"uo\\te.service", start, "");
    processes.push((3100, 5));
    let dir = tempfile::tempdir().unwrap();
    let scenario = one_gpu(dir.path(), 100, &processes);
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(&scenario, t0);
    let second = runs.at(&scenario, t0 + 10 * SECOND);
    let samples = parsed(&second);
    let busy = select(&samples, BUSY, &[]);
    // Two tasks: the user (uid 1000) and the unit.
    assert_eq!(busy.len(), 2, "{second}");
    let unit = select(&samples, BUSY, &[("systemd_unit", "q\"uo\\te.service")]);
    assert_eq!(unit.len(), 1, "{second}");
    assert!((unit[0].1 - 10.0 / 12.0).abs() < 1e-5, "{second}");
    let user: Vec<_> = busy
        .iter()
        .filter(|(s, _)| s.label("user").is_some())
        .collect();
    assert_eq!(user.len(), 1, "{second}");
    assert!((user[0].1 - 10.0 * 11.0 / 12.0).abs() < 1e-5, "{second}");
}

/// Entries in the kubelet's log directories that are no Kubernetes names
/// (more parts, upper case, quotes, line feeds, too long) name nothing;
/// the pod keeps its UID.
#[test]
fn hostile_pod_and_container_log_names_name_nothing() {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    let id = "c0".repeat(32);
    let pod_systemd = POD.replace('-', "_");
    tree.process(
        4000,
        0,
        &format!("/kubepods.slice/kubepods-pod{pod_systemd}.slice/cri-containerd-{id}.scope"),
        start,
        "",
    );
    let pods = tree.dir.path().join("pods");
    for name in [
        format!("ml_trainer_0_{POD}"),
        format!("ML_trainer-0_{POD}"),
        format!("ml_tr\"ainer_{POD}"),
        format!("ml_tr\nainer_{POD}"),
        format!("ml_trainer-0_{}", POD.to_uppercase()),
    ] {
        fs::create_dir(pods.join(name)).unwrap();
    }
    let containers = tree.dir.path().join("containers");
    for name in [
        format!("trainer-0_ml_py\"torch-{id}.log"),
        format!("trainer-0_ml_py\\torch-{id}.log"),
        format!("trainer-0_ml_x_y-{id}.log"),
        format!("trainer-0_ml_pytorch-{}.log", id.to_uppercase()),
    ] {
        fs::write(containers.join(name), "").unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let scenario = one_gpu(dir.path(), 50, &[(4000, 50)]);
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(&scenario, t0);
    let second = runs.at(&scenario, t0 + 10 * SECOND);
    let samples = parsed(&second);
    let busy = select(&samples, BUSY, &[("k8s_pod_uid", POD)]);
    assert_eq!(busy.len(), 1, "{second}");
    let series = &busy[0].0;
    for label in ["k8s_namespace_name", "k8s_pod_name", "k8s_container_name"] {
        assert_eq!(series.label(label), None, "{second}");
    }
    assert!(close(busy[0].1, 5.0), "{second}");
}

/// A job's process sets SLURM_JOB_ID (its environment is its own): under
/// a `job_<N>` cgroup the number is the cgroup's; under a SLUID the number
/// is taken only with the SLUID of that very job (and the series keeps
/// the SLUID), never another job's SLUID.
#[test]
fn a_forged_slurm_job_id_in_the_environment() {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    let other = "sEKNKTV3WPV501";
    tree.process(
        5001,
        1000,
        "/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0",
        start,
        "SLURM_JOB_ID=9999 SLURM_JOB_SLUID=sEKNKTV3WPV500 ",
    );
    tree.process(
        5002,
        1000,
        &format!("/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_0"),
        start,
        &format!("SLURM_JOB_ID=9998 SLURM_JOB_SLUID={other} "),
    );
    tree.process(
        5003,
        1000,
        &format!("/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_0"),
        start,
        "SLURM_JOB_ID=9997",
    );
    tree.process(
        5004,
        54321,
        "/user.slice/user-1000.slice/session-1.scope",
        start,
        &format!("SLURM_JOB_ID=4711 SLURM_JOB_SLUID={SLUID} "),
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = one_gpu(
        dir.path(),
        80,
        &[(5001, 20), (5002, 20), (5003, 20), (5004, 20)],
    );
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(&scenario, t0);
    let second = runs.at(&scenario, t0 + 10 * SECOND);
    let samples = parsed(&second);
    for forged in ["9999", "9998", "9997"] {
        assert!(
            select(&samples, BUSY, &[("slurm_job_id", forged)]).is_empty(),
            "{second}"
        );
    }
    assert!(close(task_value(&second, BUSY, "0", &slurm("4711")), 2.0));
    // Both SLUID processes: the job by its SLUID alone.
    let sluid = select(&samples, BUSY, &[("slurm_job_sluid", SLUID)]);
    assert_eq!(sluid.len(), 1, "{second}");
    assert_eq!(sluid[0].0.label("slurm_job_id"), None, "{second}");
    assert!(close(sluid[0].1, 4.0), "{second}");
    // The session's process is its user's.
    assert!(
        close(sum(&second, BUSY, &[("user", "54321")]), 2.0),
        "{second}"
    );
}

/// 300 tasks (a unit apiece) on one GPU, then 300 others while the first
/// linger: past the bound of 256 the new ones are not counted, state_ok is
/// 0 and one line says so, the counted ones never add up to more than the
/// GPU, and once the flood has passed the state is ok again.
#[test]
fn a_flood_of_short_tasks_keeps_the_bound_and_doubles_nothing() {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    let dir = tempfile::tempdir().unwrap();
    let flood = |first: u32| -> Vec<(u32, u32)> {
        (0..300)
            .map(|n| {
                let pid = first + n;
                tree.process(pid, 0, &format!("/system.slice/t-{pid}.service"), start, "");
                (pid, 1)
            })
            .collect()
    };
    let state = tempfile::tempdir().unwrap();
    let args = tree.args();
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.push("--write-state");
    let t0 = now_on_the_sample_grid();
    let run = |scenario: &str, at: u64| {
        let clock = at.to_string();
        let mut with = vec!["--stdout"];
        with.extend_from_slice(&all);
        ex().run_args(
            scenario,
            state.path(),
            &with,
            &[("FAKE_NVML_CLOCK_US", &clock)],
        )
    };
    let first = flood(10_000);
    let scenario = one_gpu(dir.path(), 100, &first);
    let one = run(&scenario, t0);
    let two = run(&scenario, t0 + 10 * SECOND);
    let second = String::from_utf8(two.stdout.clone()).unwrap();
    assert_promtool("flood", &second);
    assert_eq!(select(&parsed(&second), BUSY, &[]).len(), 256);
    assert_eq!(state_ok(&second), Some(0.0));
    // The bound costs the tasks only: the kernel log's step, after them,
    // still counts from the state.
    let xid = [("collector", "xid")];
    assert_eq!(
        value_in(&second, "nvidia_gpu_collector_success", &xid),
        Some(1.0),
        "{second}"
    );
    // Everything counted is within the GPU: 10 s busy, 1 kJ.
    assert!(sum(&second, BUSY, &[]) <= 10.0 + 1e-6, "{second}");
    let energy = sum(&second, ENERGY, &[]);
    let nobody = value_in(&second, "nvidia_gpu_unattributed_energy_joules_total", &[]).unwrap();
    assert!(close(energy + nobody, 1000.0), "{energy} + {nobody}");
    let next = flood(20_000);
    let scenario = one_gpu(dir.path(), 100, &next);
    let three = run(&scenario, t0 + 20 * SECOND);
    let third = String::from_utf8(three.stdout.clone()).unwrap();
    assert_eq!(select(&parsed(&third), BUSY, &[]).len(), 256);
    let energy = sum(&third, ENERGY, &[]);
    let nobody = value_in(&third, "nvidia_gpu_unattributed_energy_joules_total", &[]).unwrap();
    assert!(close(energy + nobody, 2000.0), "{energy} + {nobody}");
    // One line for the bound, in the run it began.
    let said = |o: &Outcome| {
        String::from_utf8_lossy(&o.stderr)
            .matches("tasks on a GPU")
            .count()
    };
    assert_eq!(said(&one) + said(&two) + said(&three), 1);
    // With the flood gone the state is ok again, the counted tasks linger
    // (ten minutes of the wall clock, which the fake's clock does not move).
    let quiet = one_gpu(dir.path(), 0, &[]);
    let four = run(&quiet, t0 + 30 * SECOND);
    let fourth = String::from_utf8(four.stdout.clone()).unwrap();
    assert_eq!(state_ok(&fourth), Some(1.0), "{fourth}");
    assert_eq!(select(&parsed(&fourth), BUSY, &[]).len(), 256, "{fourth}");
    assert_eq!(said(&four), 0);
}

/// The driver reloads between runs: the energy counter starts again from
/// (almost) 0. That window's energy goes to nobody (no task, and not
/// unattributed either), and the counting goes on from the new counter.
#[test]
fn a_driver_reload_moves_no_energy_counter_back() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let dir = tempfile::tempdir().unwrap();
    let toml = fs::read_to_string(ex().scenario("tasks")).unwrap();
    let reloaded = dir.path().join("reloaded.toml");
    fs::write(
        &reloaded,
        toml.replace("total_energy_mj = 100000000", "total_energy_mj = 5"),
    )
    .unwrap();
    let reloaded = reloaded.to_str().unwrap();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let second = runs.at("tasks", t0 + 10 * SECOND);
    let third = runs.at(reloaded, t0 + 20 * SECOND);
    let fourth = runs.at(reloaded, t0 + 30 * SECOND);
    let energy = |text: &str| task_value(text, ENERGY, "0", &slurm("4711"));
    let nobody = |text: &str| {
        value_in(
            text,
            "nvidia_gpu_unattributed_energy_joules_total",
            &[("gpu", "0")],
        )
        .unwrap()
    };
    assert!(close(energy(&second), 2000.0), "{second}");
    assert!(close(energy(&third), 2000.0), "{third}");
    assert!(close(energy(&fourth), 4000.0), "{fourth}");
    assert_eq!(nobody(&third), nobody(&second));
    assert_eq!(nobody(&fourth), nobody(&second));
    // Busy time and time held go on.
    assert!(close(task_value(&fourth, BUSY, "0", &slurm("4711")), 12.0));
}

/// The GPUs swap their indices (a renumbering): each task's counters follow
/// its GPU's UUID, none starts again or moves to the other GPU.
#[test]
fn a_renumbered_gpu_keeps_its_tasks() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let dir = tempfile::tempdir().unwrap();
    let toml = fs::read_to_string(ex().scenario("tasks")).unwrap();
    let (head, rest) = toml.split_once("[[gpu]]").unwrap();
    let (gpu0, gpu1) = rest.split_once("[[gpu]]").unwrap();
    let swapped = dir.path().join("swapped.toml");
    fs::write(&swapped, format!("{head}[[gpu]]{gpu1}\n[[gpu]]{gpu0}")).unwrap();
    let swapped = swapped.to_str().unwrap();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    runs.at("tasks", t0 + 10 * SECOND);
    let third = runs.at(swapped, t0 + 20 * SECOND);
    // Job 4711's GPU (UUID …000) is now index 1.
    assert!(
        close(task_value(&third, BUSY, "1", &slurm("4711")), 8.0),
        "{third}"
    );
    assert!(
        close(task_value(&third, ENERGY, "1", &slurm("4711")), 4000.0),
        "{third}"
    );
    let sluid = [("slurm_job_sluid", SLUID)];
    assert!(close(task_value(&third, BUSY, "0", &sluid), 6.0), "{third}");
    assert!(select(
        &parsed(&third),
        BUSY,
        &[("gpu", "0"), ("slurm_job_id", "4711")]
    )
    .is_empty());
}

/// A version 2 state from the release before the tasks (no `tasks` in its
/// GPUs) is taken: state_ok 1, the tasks start at 0, the next run counts.
#[test]
fn a_state_of_the_previous_release_is_taken_and_tasks_start_at_zero() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let file = runs.state().join("state");
    let mut json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(json["version"], 2);
    for (_, gpu) in json["gpus"].as_object_mut().unwrap() {
        assert!(gpu.as_object_mut().unwrap().remove("tasks").is_some());
    }
    fs::write(&file, json.to_string() + "\n").unwrap();
    let second = runs.at("tasks", t0 + 10 * SECOND);
    assert_eq!(state_ok(&second), Some(1.0), "{second}");
    assert_eq!(task_value(&second, BUSY, "0", &slurm("4711")), 0.0);
    assert_eq!(task_value(&second, ENERGY, "0", &slurm("4711")), 0.0);
    assert_eq!(
        value_in(
            &second,
            "nvidia_gpu_unattributed_energy_joules_total",
            &[("gpu", "0")]
        ),
        Some(0.0)
    );
    let third = runs.at("tasks", t0 + 20 * SECOND);
    assert!(
        close(task_value(&third, BUSY, "0", &slurm("4711")), 4.0),
        "{third}"
    );
}

/// MIG: two jobs on two GPU instances of one GPU. Each is a task per
/// instance (`gpu_instance_id`), held time counts, and the energy of a GPU
/// with several holders and no shares is nobody's, not split by guess. NVML
/// measures no busy time there: no task has a busy series (none is idle).
#[test]
fn mig_instances_are_tasks_of_their_own() {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    for (pid, job) in [(61204, 1), (61377, 2)] {
        tree.process(
            pid,
            1000,
            &format!("/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"),
            start,
            "",
        );
    }
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("h100-mig", t0);
    let second = runs.at("h100-mig", t0 + 10 * SECOND);
    let samples = parsed(&second);
    let one = select(
        &samples,
        HELD,
        &[("slurm_job_id", "1"), ("gpu_instance_id", "2")],
    );
    let two = select(
        &samples,
        HELD,
        &[("slurm_job_id", "2"), ("gpu_instance_id", "3")],
    );
    assert_eq!((one.len(), two.len()), (1, 1), "{second}");
    assert!(one[0].1 > 0.0 && two[0].1 > 0.0, "{second}");
    assert_eq!(sum(&second, ENERGY, &[]), 0.0, "{second}");
    assert!(select(&samples, BUSY, &[]).is_empty(), "{second}");
}

/// Bytes the kernel takes that are no UTF-8, in a cgroup's name (a user
/// may name one so in their delegated subtree) or a command's (any process
/// may): the process is counted all the same, where its manager placed it,
/// and such a name places it nowhere else.
#[test]
fn names_that_are_no_utf8_neither_hide_nor_place_a_process() {
    let tree = Tree::new();
    let start = tree.a_minute_ago();
    let mine = b"0::/user.slice/user-1000.slice/user@1000.service/app.slice".to_vec();
    let id = "ab".repeat(32);
    let cgroups: [(u32, u32, Vec<u8>); 5] = [
        (6001, 1000, [&mine[..], b"/\xff\xfe.scope\n"].concat()),
        (
            6002,
            1000,
            [&mine[..], b"/slurmstepd.scope/job_4711\xff/step_0\n"].concat(),
        ),
        (
            6003,
            1000,
            [&mine[..], b"/docker-", id.as_bytes(), b".scope/\xc3\n"].concat(),
        ),
        (6004, 0, b"0::/system.slice/tr\xffain.service\n".to_vec()),
        (6005, 1000, [&mine[..], b"/session.scope\n"].concat()),
    ];
    let mut processes = Vec::new();
    for (pid, uid, cgroup) in &cgroups {
        tree.process(*pid, *uid, "/", start, "");
        let dir = tree.dir.path().join(format!("proc/{pid}"));
        fs::write(dir.join("cgroup"), cgroup).unwrap();
        processes.push((*pid, 20));
    }
    // A command named with bytes that are no UTF-8 (status's Name line).
    let status = b"Name:\tpy\xff\nUid:\t1000\t1000\t1000\t1000\n";
    fs::write(tree.dir.path().join("proc/6005/status"), status).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenario = one_gpu(dir.path(), 100, &processes);
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(&scenario, t0);
    let second = runs.at(&scenario, t0 + 10 * SECOND);
    let samples = parsed(&second);
    let busy = select(&samples, BUSY, &[]);
    // Two tasks: the user (uid 1000, four processes) and root's unit.
    assert_eq!(busy.len(), 2, "{second}");
    let user: Vec<_> = busy
        .iter()
        .filter(|(s, _)| s.label("user").is_some())
        .collect();
    assert_eq!(user.len(), 1, "{second}");
    assert!(close(user[0].1, 8.0), "{second}");
    let unit = select(&samples, BUSY, &[("systemd_unit", "tr\u{fffd}ain.service")]);
    assert_eq!(unit.len(), 1, "{second}");
    assert!(close(unit[0].1, 2.0), "{second}");
    let nobody = value_in(&second, "nvidia_gpu_unattributed_energy_joules_total", &[]);
    assert_eq!(nobody, Some(0.0), "{second}");
}

/// A pid NVML saw busy in the window whose process exited, taken by a
/// process of another job that started after NVML last saw the pid busy,
/// the previous run never having seen the pid: its start proves the new
/// job did not do that work, so the share is nobody's (unattributed).
#[test]
fn a_reused_pid_the_previous_run_never_saw_bills_no_job() {
    let tree = Tree::new();
    tree.process(7001, 0, "/system.slice/a.service", tree.a_minute_ago(), "");
    let dir = tempfile::tempdir().unwrap();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at(&one_gpu(dir.path(), 100, &[(7001, 50)]), t0);
    // Started 15 s after the window's last sample.
    let cgroup = "/system.slice/slurmstepd.scope/job_4799/step_0/user/task_0";
    tree.process(7002, 1000, cgroup, (t0 + 25 * SECOND) / SECOND, "");
    let scenario = one_gpu(dir.path(), 100, &[(7001, 50), (7002, 50)]);
    let second = runs.at(&scenario, t0 + 10 * SECOND);
    let unit = [("systemd_unit", "a.service")];
    assert!(
        close(task_value(&second, BUSY, "0", &unit), 5.0),
        "{second}"
    );
    assert_eq!(
        task_value(&second, BUSY, "0", &slurm("4799")),
        0.0,
        "{second}"
    );
    assert_eq!(
        task_value(&second, ENERGY, "0", &slurm("4799")),
        0.0,
        "{second}"
    );
    // 100 W for 10 s: half the unit's, half nobody's.
    assert!(
        close(task_value(&second, ENERGY, "0", &unit), 500.0),
        "{second}"
    );
    let nobody = value_in(&second, "nvidia_gpu_unattributed_energy_joules_total", &[]);
    assert!(close(nobody.unwrap(), 500.0), "{second}");
}

/// A well-formed state whose task totals no GPU can reach (near 2^64, as
/// damage or a bug could leave them): that GPU's ledger is ignored, said
/// once, state_ok 0, its tasks start again from a baseline (nothing of it
/// published, no counter wraps); the other GPU's tasks count on, and the
/// next run is ok.
#[test]
fn task_totals_no_gpu_can_reach_are_not_used() {
    let tree = tasks_tree();
    let runs = Runs::new(&tree);
    let t0 = runs.t0;
    runs.at("tasks", t0);
    runs.at("tasks", t0 + 10 * SECOND);
    let file = runs.state().join("state");
    let mut state: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    let ledger = &mut state["gpus"]["GPU-7a5c0000-0000-4000-8000-000000000000"]["tasks"];
    ledger["unattributed_mj"] = json!(u64::MAX - 5);
    for entry in ledger["totals"].as_array_mut().unwrap() {
        if entry[0]["task"]["slurm"]["job_id"] == "4711" {
            entry[1]["busy_us"] = json!(u64::MAX - 1000);
        }
    }
    fs::write(&file, state.to_string() + "\n").unwrap();
    let run = runs.outcome_at("tasks", t0 + 20 * SECOND);
    assert_eq!(run.code(), Some(0), "{}", run.err());
    let third = String::from_utf8(run.stdout.clone()).unwrap();
    assert_promtool("damaged ledger", &third);
    assert_eq!(state_ok(&third), Some(0.0), "{third}");
    assert_eq!(run.err().matches("task ledger").count(), 1, "{}", run.err());
    let nobody = |text: &str| {
        value_in(
            text,
            "nvidia_gpu_unattributed_energy_joules_total",
            &[("gpu", "0")],
        )
    };
    assert_eq!(nobody(&third), Some(0.0), "{third}");
    assert_eq!(
        task_value(&third, BUSY, "0", &slurm("4711")),
        0.0,
        "{third}"
    );
    let sluid = [("slurm_job_sluid", SLUID)];
    assert!(close(task_value(&third, BUSY, "1", &sluid), 6.0), "{third}");
    let fourth = runs.outcome_at("tasks", t0 + 30 * SECOND);
    assert_eq!(
        fourth.err().matches("task ledger").count(),
        0,
        "{}",
        fourth.err()
    );
    let fourth = String::from_utf8(fourth.stdout).unwrap();
    assert_eq!(state_ok(&fourth), Some(1.0), "{fourth}");
    assert!(
        close(task_value(&fourth, BUSY, "0", &slurm("4711")), 4.0),
        "{fourth}"
    );
    assert_eq!(nobody(&fourth), Some(0.0), "{fourth}");
}
