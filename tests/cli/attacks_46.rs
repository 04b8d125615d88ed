//! An outside tester's attacks on issue 46 (what a job or pod was given):
//! hostile and odd allocation sources, the Slurm hook and the job report,
//! against the fake NVML (tests/scenarios/tasks.toml: GPU 0 draws 300 W,
//! GPU 1 200 W on the fake's clock). A test marked `DEFECT` asserts the
//! correct behaviour and failed on the binary it was written against.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Instant;

use super::allocations::{job, pod, Node, ALLOCATED, ENERGY, GPU0, GPU1, IDLE_POD};
use super::tasks::{task_value, POD, SLUID};
use super::*;

const UNATTRIBUTED: &str = "nvidia_gpu_unattributed_energy_joules_total";
const GPU_ENERGY: &str = "nvidia_gpu_energy_joules_total";

fn success(text: &str) -> Option<f64> {
    value_in(
        text,
        "nvidia_gpu_collector_success",
        &[("collector", "tasks")],
    )
}

/// The boot clock now, µs (the clock the hook's edges are on).
fn boot_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

fn pause(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// The sum of `family` over the series with `labels` on GPU `gpu` (0 if none).
fn sum(text: &str, family: &str, gpu: &str, labels: &[(&str, &str)]) -> f64 {
    let samples = parsed(text);
    let mut all = vec![("gpu", gpu)];
    all.extend_from_slice(labels);
    select(&samples, family, &all).iter().map(|(_, v)| v).sum()
}

/// Every counter (`…_total`) of `next` is at least its value in `prev`.
fn never_decrease(prev: &str, next: &str) -> Result<(), String> {
    let (a, b) = (parsed(prev), parsed(next));
    for (series, before) in &a {
        if !series.name.ends_with("_total") {
            continue;
        }
        if let Some(after) = b.get(series) {
            if after < before {
                return Err(format!("{series:?}: {before} -> {after}"));
            }
        }
    }
    Ok(())
}

/// On GPU `gpu`, the growth of the tasks' energy plus the unattributed energy
/// from `prev` to `next` is the GPU's energy growth (to a joule).
fn energy_conserved(prev: &str, next: &str, gpu: &str) -> Result<(), String> {
    let grown = |family: &str| sum(next, family, gpu, &[]) - sum(prev, family, gpu, &[]);
    let (gpu_j, tasks_j, none_j) = (grown(GPU_ENERGY), grown(ENERGY), grown(UNATTRIBUTED));
    if (gpu_j - tasks_j - none_j).abs() > 1.0 {
        return Err(format!(
            "GPU {gpu}: the GPU spent {gpu_j} J, the tasks got {tasks_j} J, unattributed {none_j} J"
        ));
    }
    Ok(())
}

/// A hook record as the hook writes it, for job `id` on one GPU.
fn record(
    id: &str,
    sluid: Option<&str>,
    name: &str,
    uuid: Option<&str>,
    prolog: Option<(u64, Option<u64>)>,
    epilog: Option<(u64, Option<u64>)>,
) -> String {
    let edge = |e: Option<(u64, Option<u64>)>| match e {
        Some((at, mj)) => serde_json::json!({"at_us": at, "energy_mj": mj}),
        None => serde_json::Value::Null,
    };
    serde_json::json!({
        "job_id": id,
        "sluid": sluid,
        "uid": 1000,
        "gpus": [{"name": name, "uuid": uuid, "prolog": edge(prolog), "epilog": edge(epilog)}],
        "problems": [],
    })
    .to_string()
}

/// The kubelet's checkpoint (since 1.20, by NUMA node).
fn checkpoint(entries: &[(&str, &str, &str)]) -> String {
    let entries: Vec<String> = entries
        .iter()
        .map(|(uid, container, id)| {
            format!(
                "{{\"PodUID\":\"{uid}\",\"ContainerName\":\"{container}\",\
                 \"ResourceName\":\"nvidia.com/gpu\",\"DeviceIDs\":{{\"-1\":[\"{id}\"]}},\"AllocResp\":\"CgA=\"}}"
            )
        })
        .collect();
    format!(
        "{{\"Data\":{{\"PodDeviceEntries\":[{}],\"RegisteredDevices\":{{}}}},\"Checksum\":1}}",
        entries.join(",")
    )
}

// ---------------------------------------------------------------------------
// The job report.

/// DEFECT: a job that starts and ends between two timer runs (a test job, a
/// failing job: the timer runs every minute) has its exact prolog and epilog
/// in the hook's record, yet `--job-report` in its epilog (as the docs show
/// it) prints `"gpus":[]`: the report lists only GPUs the state's ledgers
/// hold for the job, and no run has seen it yet.
#[test]
fn a_job_shorter_than_a_timer_period_has_its_gpus_in_its_report() {
    let node = Node::new();
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    node.hook("prolog", "990", "0", t0 + 5 * SECOND);
    node.hook("epilog", "990", "0", t0 + 10 * SECOND);
    let (code, report, err) = node.report(&runs, "990");
    assert_eq!(code, Some(0), "{err}");
    let gpus = report["gpus"].as_array().cloned().unwrap_or_default();
    assert_eq!(gpus.len(), 1, "{report}");
    assert_eq!(gpus[0]["uuid"], GPU0, "{report}");
    assert_eq!(gpus[0]["exact"], true, "{report}");
    // 300 W for 5 s on the fake's clock.
    assert_eq!(gpus[0]["energy_joules"], 1500.0, "{report}");
}

/// DEFECT: an energy counter that went back between the prolog and the
/// epilog (a driver reload, a GPU reset) makes the report claim an exact
/// 0 J (`saturating_sub`) where the state counted the job's energy.
#[test]
fn a_counter_reset_between_the_edges_is_not_an_exact_zero() {
    let node = Node::new();
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    pause(200);
    let prolog = boot_us();
    pause(300);
    let epilog = boot_us();
    node.write(
        "hook/job_991.json",
        &record(
            "991",
            None,
            "0",
            Some(GPU0),
            Some((prolog, Some(900_000_000))),
            Some((epilog, Some(1_000))),
        ),
    );
    let second = runs.at("tasks", t0 + 15 * SECOND);
    let counted = task_value(&second, ENERGY, "0", &job("991"));
    assert!(counted > 0.0, "{second}");
    let (_, report, _) = node.report(&runs, "991");
    let gpu = &report["gpus"][0];
    assert!(
        !(gpu["exact"] == true && gpu["energy_joules"] == 0.0),
        "the state counted {counted} J, the report says exactly 0: {report}"
    );
}

/// DEFECT: two jobs whose hook records overlap on one GPU (Slurm's
/// gres/shard or MPS give one GPU to several jobs at once) each get an
/// "exact" report of the counter's growth between their own edges, so the
/// overlap's energy is reported twice: more energy than the GPU spent.
#[test]
fn reports_of_jobs_sharing_a_gpu_do_not_claim_its_energy_twice() {
    let node = Node::new();
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    node.hook("prolog", "992", "0", t0 + 5 * SECOND);
    node.hook("prolog", "993", "0", t0 + 10 * SECOND);
    runs.at("tasks", t0 + 15 * SECOND);
    node.hook("epilog", "992", "0", t0 + 20 * SECOND);
    node.hook("epilog", "993", "0", t0 + 25 * SECOND);
    runs.at("tasks", t0 + 30 * SECOND);
    let energy = |job: &str| {
        node.report(&runs, job).1["gpus"][0]["energy_joules"]
            .as_f64()
            .unwrap_or(0.0)
    };
    let (a, b) = (energy("992"), energy("993"));
    // The GPU spent 300 W × 20 s between the first prolog and the last epilog.
    assert!(
        a + b <= 6000.0 + 1.0,
        "reports claim {a} J + {b} J of 6000 J"
    );
}

/// `--job-report` with ids that are no job number: a usage error, no panic;
/// with no state and no record: an empty report.
#[test]
fn the_job_report_refuses_bad_ids_and_copes_without_state() {
    let node = Node::new();
    let runs = node.runs();
    for bad in [
        "",
        "abc",
        "12a",
        "-1",
        " 5",
        "1/../2",
        "123456789012345678901",
        "५",
    ] {
        let (code, _, err) = node.report(&runs, bad);
        assert_ne!(code, Some(0), "{bad:?}");
        assert!(!err.contains("panicked"), "{bad:?}: {err}");
    }
    let (code, report, err) = node.report(&runs, "4711");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(report["gpus"], serde_json::json!([]), "{report}");
    // A damaged record and a damaged state are no panic either.
    node.write(
        "hook/job_4711.json",
        "{\"job_id\":\"4711\",\"gpus\":[{\"name\":",
    );
    fs::write(runs.state().join("state.json"), "{{{{").unwrap();
    let (code, _, err) = node.report(&runs, "4711");
    assert_eq!(code, Some(0), "{err}");
}

// ---------------------------------------------------------------------------
// The hook's records.

/// DEFECT: without an epilog (not installed, which the docs support: "a
/// prolog without an epilog ends where the next job's prolog takes the
/// GPU"), records are never pruned: prune removes only records with an
/// epilog. After 4096 jobs in a boot, the runs read only the first 4096
/// names and new jobs are not counted (and the step fails every run).
#[test]
fn records_a_later_prolog_closed_long_ago_are_pruned() {
    let node = Node::new();
    // 4096 jobs of a day ago... at 1 s after boot (all over an hour ago),
    // each closed by the next one's prolog.
    for n in 0..4096u64 {
        let id = (10_000 + n).to_string();
        node.write(
            &format!("hook/job_{id}.json"),
            &record(
                &id,
                None,
                "0",
                Some(GPU0),
                Some((1_000_000 + n * 1000, Some(1))),
                None,
            ),
        );
    }
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    node.hook("prolog", "20000", "1", t0 + 5 * SECOND);
    let second = runs.at("tasks", t0 + 15 * SECOND);
    let names = fs::read_dir(node.dir.path().join("hook")).unwrap().count();
    assert!(
        select(&parsed(&second), ALLOCATED, &job("20000")).len() == 1
            && success(&second) == Some(1.0),
        "job 20000 not counted with {names} records in the directory"
    );
}

/// DEFECT: a record whose prolog could not read NVML names its GPU by
/// Slurm's index only; the next job's prolog (NVML fine) names it by UUID,
/// and `close_taken` compares the two names, so the first job never ends:
/// it stays allocated (its seconds grow for ever where the node shows no
/// Slurm cgroups) and, overlapping, takes the GPU's energy from the job
/// really given it.
#[test]
fn an_open_record_by_index_ends_at_the_next_prolog_by_uuid() {
    let node = Node::new();
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    let state = tempfile::tempdir().unwrap();
    let blind = ex()
        .run("tasks")
        .lib("/nonexistent/libnvidia-ml.so.1")
        .state_dir(state.path())
        .args([
            "--slurm-hook",
            "prolog",
            "--slurm-hook-dir",
            &node.path("hook"),
        ])
        .env("SLURM_JOB_ID", "950")
        .env("SLURM_JOB_GPUS", "0")
        .finish()
        .unwrap();
    assert_eq!(blind.code(), Some(0), "{}", blind.err());
    assert_eq!(
        node.record("950")["gpus"][0]["uuid"],
        serde_json::Value::Null
    );
    pause(300);
    node.hook("prolog", "951", "0", t0 + 5 * SECOND);
    let second = runs.at("tasks", t0 + 15 * SECOND);
    pause(300);
    let third = runs.at("tasks", t0 + 30 * SECOND);
    let (before, after) = (
        task_value(&second, ALLOCATED, "0", &job("950")),
        task_value(&third, ALLOCATED, "0", &job("950")),
    );
    assert_eq!(
        before, after,
        "job 950 still allocated after job 951's prolog"
    );
    // Job 951 had the GPU alone from 15 s to 30 s: 300 W × 15 s.
    let energy = task_value(&third, ENERGY, "0", &job("951"))
        - task_value(&second, ENERGY, "0", &job("951"));
    assert!(
        (energy - 4500.0).abs() < 1.0,
        "job 951 got {energy} J of 4500"
    );
}

/// DEFECT: two jobs given one GPU at once through the hook (gres/shard,
/// MPS): the first one's record is closed at the second's prolog while the
/// first still runs (`close_taken` assumes a GPU is one job's), so the
/// first job loses the seconds from the second's prolog to the next run.
/// (On a node whose control groups show Slurm's jobs, as one sharing GPUs
/// with shards does: there a job's end is its epilog or its cgroup's.)
#[test]
fn a_job_sharing_its_gpu_stays_allocated_until_its_epilog() {
    let node = Node::new();
    for job in ["job_960", "job_961"] {
        let scope = node.dir.path().join("cgroup/system.slice/slurmstepd.scope");
        fs::create_dir_all(scope.join(job)).unwrap();
    }
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    node.hook("prolog", "960", "0", t0 + 5 * SECOND);
    node.hook("prolog", "961", "0", t0 + 10 * SECOND);
    pause(600);
    runs.at("tasks", t0 + 15 * SECOND);
    node.hook("epilog", "960", "0", t0 + 20 * SECOND);
    pause(100);
    node.hook("epilog", "961", "0", t0 + 25 * SECOND);
    let third = runs.at("tasks", t0 + 30 * SECOND);
    let r = node.record("960");
    let edges = (r["gpus"][0]["epilog"]["at_us"].as_u64().unwrap()
        - r["gpus"][0]["prolog"]["at_us"].as_u64().unwrap()) as f64
        / 1e6;
    let allocated = task_value(&third, ALLOCATED, "0", &job("960"));
    assert!(
        (allocated - edges).abs() < 0.05,
        "job 960 allocated {allocated} s, its prolog to its epilog {edges} s"
    );
}

/// DEFECT: (needs a GPU two jobs reach, as above) a process of job X in its
/// SLUID cgroup that sets `SLURM_JOB_ID` to another job's number takes that
/// job's allocation: `same_task` matches on the number alone although the
/// two SLUIDs differ, so the victim's seconds allocated and whole-GPU energy
/// go to a series labelled with the attacker's SLUID and the victim has none.
#[test]
fn a_forged_job_number_does_not_take_another_jobs_allocation() {
    let node = Node::new();
    let runs = node.runs();
    let t0 = runs.t0;
    runs.at("tasks", t0);
    // The tree's process 2001 on GPU 1 is in SLUID's cgroup and says
    // SLURM_JOB_ID=4712; the real job 4712 is another SLUID.
    let victim = "sEKNKTV3WPV501";
    assert_ne!(victim, SLUID);
    node.write(
        "hook/job_4712.json",
        &record(
            "4712",
            Some(victim),
            "1",
            Some(GPU1),
            Some((boot_us(), Some(200_000_000))),
            None,
        ),
    );
    pause(200);
    let second = runs.at("tasks", t0 + 15 * SECOND);
    let samples = parsed(&second);
    let theirs = select(
        &samples,
        ALLOCATED,
        &[("gpu", "1"), ("slurm_job_sluid", victim)],
    );
    let forged = select(
        &samples,
        ALLOCATED,
        &[("gpu", "1"), ("slurm_job_sluid", SLUID)],
    );
    assert!(
        theirs.len() == 1 && forged.is_empty(),
        "victim {theirs:?}, forger {forged:?}"
    );
}

/// Hostile records in the hook's directory: each costs only itself. A
/// FIFO, a directory, a symlink, a file others may write or another user
/// owns, one too large, deeply nested, naming another job, a name that is
/// no UTF-8, absurd edges (in the future, epilog before prolog, u64::MAX,
/// energy going back): no hang, no panic, the good record counts, the
/// output passes promtool, no counter goes back, energy is conserved.
#[test]
fn hostile_records_cost_only_themselves() {
    let node = Node::new();
    let hook = node.dir.path().join("hook");
    let now = boot_us();
    let gpu1 = |id: &str, p: Option<(u64, Option<u64>)>, e: Option<(u64, Option<u64>)>| {
        record(id, None, "1", Some(GPU1), p, e)
    };
    // The good one.
    node.write(
        "hook/job_42.json",
        &gpu1("42", Some((now, Some(200_000_000))), None),
    );
    // Absurd edges.
    node.write(
        "hook/job_43.json",
        &gpu1("43", Some((now + 3_600_000_000, None)), None),
    );
    node.write(
        "hook/job_44.json",
        &gpu1("44", Some((now, None)), Some((now - 10_000_000, None))),
    );
    node.write(
        "hook/job_45.json",
        &gpu1(
            "45",
            Some((u64::MAX, Some(u64::MAX))),
            Some((u64::MAX, Some(0))),
        ),
    );
    node.write(
        "hook/job_46.json",
        &gpu1("46", Some((0, Some(u64::MAX))), Some((1, Some(0)))),
    );
    node.write(
        "hook/job_47.json",
        &record(
            "47",
            None,
            "18446744073709551615",
            None,
            Some((now, None)),
            None,
        ),
    );
    node.write(
        "hook/job_48.json",
        &record(
            "48",
            Some("../../../.."),
            "1",
            Some("MIG-GPU-zz/1/0"),
            Some((now, None)),
            None,
        ),
    );
    // Another job's record.
    node.write("hook/job_49.json", &gpu1("4711", Some((now, None)), None));
    // Damaged files.
    node.write(
        "hook/job_50.json",
        &format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000))
            .chars()
            .take(60_000)
            .collect::<String>(),
    );
    node.write("hook/job_51.json", &" ".repeat(70 << 10));
    node.write(
        "hook/job_52.json",
        &format!(
            "{{\"job_id\":\"52\",\"gpus\":[{}]}}",
            vec!["{\"name\":\"1\"}"; 5000].join(",")
        ),
    );
    node.write("hook/job_53.json", &gpu1("53", Some((now, None)), None));
    fs::set_permissions(hook.join("job_53.json"), fs::Permissions::from_mode(0o666)).unwrap();
    node.write("hook/job_54.json", &gpu1("54", Some((now, None)), None));
    std::os::unix::fs::chown(hook.join("job_54.json"), Some(1234), Some(1234)).unwrap();
    let fifo = std::ffi::CString::new(hook.join("job_55.json").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    fs::create_dir(hook.join("job_56.json")).unwrap();
    std::os::unix::fs::symlink(hook.join("job_42.json"), hook.join("job_57.json")).unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"job_\xff.json");
    fs::write(hook.join(odd), gpu1("58", Some((now, None)), None)).unwrap();

    let runs = node.runs();
    let t0 = runs.t0;
    let started = Instant::now();
    let first = runs.at("tasks", t0);
    pause(200);
    let second = runs.at("tasks", t0 + 15 * SECOND);
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        task_value(&second, ALLOCATED, "1", &job("42")) > 0.0,
        "{second}"
    );
    assert_eq!(success(&second), Some(0.0));
    for bad in ["43", "44", "45", "46", "47", "49", "53", "54", "58"] {
        let samples = parsed(&second);
        let found = select(&samples, ALLOCATED, &job(bad));
        assert!(found.iter().all(|(_, v)| *v == 0.0), "job {bad}: {found:?}");
    }
    never_decrease(&first, &second).unwrap();
    energy_conserved(&first, &second, "1").unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    for (series, value) in select(&parsed(&second), ALLOCATED, &[]) {
        assert!(value <= elapsed, "{series:?}: {value} s in {elapsed} s");
    }
}
/// The hook with odd environments: it exits 0 at once, writes a record only
/// for a job number, and never a GPU that is none.
#[test]
fn the_hook_takes_odd_environments_in_its_stride() {
    let node = Node::new();
    let t = now_on_the_sample_grid();
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: &[Case] = &[
        (&[], None),
        (&[("SLURM_JOB_ID", "")], None),
        (&[("SLURM_JOB_ID", " 77")], None),
        (&[("SLURM_JOB_ID", "77x")], None),
        (&[("SLURM_JOB_ID", "../../etc/x")], None),
        (&[("SLURM_JOB_ID", "123456789012345678901")], None),
        (
            &[
                ("SLURM_JOB_ID", "78"),
                ("CUDA_VISIBLE_DEVICES", "NoDevFiles"),
            ],
            None,
        ),
        (
            &[
                ("SLURM_JOB_ID", "79"),
                ("SLURM_JOB_GPUS", " 1 , x, 1,,-1,99999999999"),
            ],
            Some("79"),
        ),
        (
            &[
                ("SLURM_JOB_ID", "80"),
                ("SLURM_JOB_SLUID", "not a sluid\n"),
                ("SLURM_JOB_UID", "-1"),
                ("SLURM_JOB_GPUS", "0"),
            ],
            Some("80"),
        ),
    ];
    for (env, written) in cases {
        let started = Instant::now();
        let out = node.hook_with("prolog", env, t);
        assert_eq!(out.code(), Some(0), "{env:?}: {}", out.err());
        assert!(started.elapsed() < Duration::from_secs(3), "{env:?}");
        if let Some(id) = written {
            let record = node.record(id);
            for gpu in record["gpus"].as_array().unwrap() {
                let name = gpu["name"].as_str().unwrap();
                assert!(
                    ["0", "1", "99999999999"].contains(&name),
                    "{env:?}: {record}"
                );
            }
            assert_eq!(record["sluid"], serde_json::Value::Null, "{record}");
        }
    }
    let names: Vec<String> = fs::read_dir(node.dir.path().join("hook"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for name in &names {
        assert!(
            ["job_79.json", "job_80.json"].contains(&name.as_str()),
            "{names:?}"
        );
    }
    // 15 000 GPUs named: at most 64 kept, quickly.
    let many: Vec<String> = (0..15_000).map(|n| n.to_string()).collect();
    let many = many.join(",");
    let started = Instant::now();
    node.hook_with(
        "prolog",
        &[("SLURM_JOB_ID", "81"), ("SLURM_JOB_GPUS", &many)],
        t,
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(node.record("81")["gpus"].as_array().unwrap().len() <= 64);
}

/// The hook run by a user who cannot write the directory (or where the
/// directory is a file) exits 0 within its second and says why.
#[test]
fn the_hook_that_cannot_write_exits_0_in_time() {
    let node = Node::new();
    let file = node.dir.path().join("a-file");
    fs::write(&file, "").unwrap();
    let started = Instant::now();
    let state = tempfile::tempdir().unwrap();
    let out = ex().run_args(
        "tasks",
        state.path(),
        &[
            "--slurm-hook",
            "epilog",
            "--slurm-hook-dir",
            file.join("sub").to_str().unwrap(),
        ],
        &[("SLURM_JOB_ID", "5"), ("SLURM_JOB_GPUS", "0")],
    );
    assert_eq!(out.code(), Some(0), "{}", out.err());
    assert!(out.err().contains("cannot write"), "{}", out.err());
    assert!(started.elapsed() < Duration::from_secs(3));

    // As nobody, a directory root's alone may write.
    fs::set_permissions(node.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let started = Instant::now();
    let nobody = Command::new(EXE)
        .args(["--nvml-lib", fake_nvml().to_str().unwrap()])
        .args([
            "--slurm-hook",
            "prolog",
            "--slurm-hook-dir",
            &node.path("hook"),
        ])
        .env("FAKE_NVML_SCENARIO", scenario("tasks"))
        .env("SLURM_JOB_ID", "6")
        .env("SLURM_JOB_GPUS", "0")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&nobody.stderr);
    assert_eq!(nobody.status.code(), Some(0), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(!node.dir.path().join("hook/job_6.json").exists());
}
/// Eight epilogs of one job at once (slurmd retrying) and a prolog beside
/// them: the record is whole, its prolog kept.
#[test]
fn concurrent_hooks_of_one_job_leave_one_whole_record() {
    let node = Node::new();
    let t = now_on_the_sample_grid();
    node.hook("prolog", "70", "0,1", t);
    let hooks: Vec<_> = (0..8)
        .map(|_| {
            let dir = node.path("hook");
            std::thread::spawn(move || {
                let state = tempfile::tempdir().unwrap();
                let args = ["--slurm-hook", "epilog", "--slurm-hook-dir", &dir];
                let clock = (t + 5 * SECOND).to_string();
                let env = [
                    ("FAKE_NVML_CLOCK_US", clock.as_str()),
                    ("SLURM_JOB_ID", "70"),
                    ("SLURM_JOB_GPUS", "0,1"),
                ];
                ex().run_args("tasks", state.path(), &args, &env).code()
            })
        })
        .collect();
    for hook in hooks {
        assert_eq!(hook.join().unwrap(), Some(0));
    }
    let record = node.record("70");
    for gpu in record["gpus"].as_array().unwrap() {
        assert!(
            gpu["prolog"].is_object() && gpu["epilog"].is_object(),
            "{record}"
        );
    }
    let stray = fs::read_dir(node.dir.path().join("hook")).unwrap().count();
    assert_eq!(stray, 1, "temporary files left");
}

// ---------------------------------------------------------------------------
// The checkpoints and the mapping directories.

/// DEFECT: the kubelet keeps an init container's device entry beside the
/// app container's, the same GPU (it reuses an init container's devices
/// for the app containers). The pod then has two holders of one whole GPU:
/// its seconds allocated count twice (GPU-hours per pod doubled) and,
/// the two "overlapping", neither gets the GPU's energy.
#[test]
fn an_init_containers_entry_does_not_double_a_pods_gpu() {
    let node = Node::new();
    node.pod_runs(IDLE_POD);
    node.write(
        "checkpoint",
        &checkpoint(&[
            (IDLE_POD, "fetch-model", GPU1),
            (IDLE_POD, "notebook", GPU1),
        ]),
    );
    let runs = node.runs();
    let started = Instant::now();
    let first = runs.at("tasks", runs.t0);
    pause(500);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    let elapsed = started.elapsed().as_secs_f64();
    let allocated = sum(&second, ALLOCATED, "1", &pod(IDLE_POD));
    // 200 W for 15 s, the pod's alone.
    let energy =
        sum(&second, ENERGY, "1", &pod(IDLE_POD)) - sum(&first, ENERGY, "1", &pod(IDLE_POD));
    assert!(
        allocated <= elapsed && (energy - 3000.0).abs() < 1.0,
        "the pod has {allocated} s allocated in {elapsed} s, {energy} J of 3000"
    );
}

/// Hostile checkpoints: names that are no Kubernetes names, a huge device
/// list, deep nesting, a file too large, a FIFO, a directory: the output
/// passes promtool (every run of Runs::at checks it), no label carries a
/// hostile name, the step says the damage.
#[test]
fn hostile_checkpoints_put_no_hostile_label_out() {
    let bad_names = [
        "a\"b",
        "x\ny",
        "UPPER",
        "-lead",
        "\\back",
        &"a".repeat(300),
        "}",
        "ok\u{0}",
    ];
    let mut entries: Vec<(String, String, String)> = bad_names
        .iter()
        .map(|n| (IDLE_POD.to_owned(), n.to_string(), GPU1.to_owned()))
        .collect();
    entries.push(("not-a-uid\"".into(), "notebook".into(), GPU1.into()));
    entries.push((IDLE_POD.into(), "notebook".into(), format!("{GPU0}::x")));
    entries.push((
        IDLE_POD.into(),
        "notebook".into(),
        format!("{GPU0}::99999999999999999999999"),
    ));
    entries.push((
        IDLE_POD.into(),
        "notebook".into(),
        "MIG-GPU-7a5c0000-0000-4000-8000-000000000000/99999999999/0".into(),
    ));
    let json_entries: Vec<String> = entries
        .iter()
        .map(|(u, c, d)| {
            serde_json::json!({"PodUID": u, "ContainerName": c, "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"-1": [d]}}).to_string()
        })
        .collect();
    let devices: Vec<String> = (0..20_000).map(|n| format!("\"dev{n}\"")).collect();
    let huge = format!(
        "{{\"PodUID\":\"{IDLE_POD}\",\"ContainerName\":\"notebook\",\"DeviceIDs\":[{}]}}",
        devices.join(",")
    );
    let nested = format!("{}{}", "{\"a\":".repeat(5000), "}".repeat(5000));
    let texts = [
        format!(
            "{{\"Data\":{{\"PodDeviceEntries\":[{},{huge}]}},\"Checksum\":1}}",
            json_entries.join(",")
        ),
        format!("{{\"Data\":{{\"PodDeviceEntries\":[{nested}]}}}}"),
        format!(
            "{{\"Data\":{{\"PodDeviceEntries\":[{}]}}}}",
            vec![huge.as_str(); 40].join(",")
        ),
    ];
    for (n, text) in texts.iter().enumerate() {
        let node = Node::new();
        node.pod_runs(IDLE_POD);
        node.write("checkpoint", text);
        let runs = node.runs();
        runs.at("tasks", runs.t0);
        let second = runs.at("tasks", runs.t0 + 15 * SECOND);
        assert_eq!(success(&second), Some(0.0), "case {n}");
        for (series, _) in select(&parsed(&second), ALLOCATED, &[]) {
            for (label, value) in &series.labels {
                assert!(
                    !value.contains(['"', '\n', '\\', '}']) && value.len() < 254,
                    "case {n}: {label}={value:?}"
                );
            }
        }
    }
    // A FIFO, a directory and a file of another user where the checkpoint
    // is: refused without waiting.
    for kind in ["fifo", "dir", "owner", "world-writable-dir"] {
        let node = Node::new();
        node.pod_runs(IDLE_POD);
        let path = node.dir.path().join("checkpoint");
        match kind {
            "fifo" => {
                let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            }
            "dir" => fs::create_dir(&path).unwrap(),
            "owner" => {
                node.write("checkpoint", &checkpoint(&[(IDLE_POD, "notebook", GPU1)]));
                std::os::unix::fs::chown(&path, Some(1234), None).unwrap();
            }
            _ => {
                node.write("jobstats/1", "777 1000\n");
                let dir = node.dir.path().join("jobstats");
                fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).unwrap();
            }
        }
        let runs = node.runs();
        let started = Instant::now();
        runs.at("tasks", runs.t0);
        let second = runs.at("tasks", runs.t0 + 15 * SECOND);
        assert!(started.elapsed() < Duration::from_secs(20), "{kind}");
        assert_eq!(success(&second), Some(0.0), "{kind}");
        assert!(
            select(&parsed(&second), ALLOCATED, &[]).is_empty(),
            "{kind}: {second}"
        );
    }
}

/// DRA checkpoints with hostile claims: a claim for a pod UID that is none,
/// for non-pod consumers, nested deep, a device with no UUID: no hostile
/// label, only the bad claim lost.
#[test]
fn hostile_dra_claims_cost_only_themselves() {
    let claim = |uid: &str, uuid: &str| {
        serde_json::json!({"checkpointState": "PrepareCompleted",
            "status": {"reservedFor": [{"resource": "pods", "uid": uid}]},
            "preparedDevices": [{"devices": [{"gpu": {"info": {"uuid": uuid}}}]}]})
    };
    let dra = serde_json::json!({"v2": {"preparedClaims": {
        "good": claim(IDLE_POD, GPU1),
        "bad-uid": claim("x\"}\n", GPU0),
        "bad-uuid": claim(POD, "GPU-\"}"),
        "no-array": {"checkpointState": "PrepareCompleted", "status": {"reservedFor": 7}},
        "users": {"checkpointState": "PrepareCompleted",
            "status": {"reservedFor": [{"resource": "deployments", "uid": "zzz"}]},
            "preparedDevices": [{"devices": [{"gpu": {"info": {"uuid": GPU0}}}]}]},
    }}});
    let node = Node::new();
    node.pod_runs(IDLE_POD);
    node.pod_runs(POD);
    node.write("dra.json", &dra.to_string());
    let runs = node.runs();
    runs.at("tasks", runs.t0);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    assert!(
        task_value(&second, ALLOCATED, "1", &pod(IDLE_POD)) > 0.0,
        "{second}"
    );
    assert_eq!(success(&second), Some(0.0));
    for (series, _) in select(&parsed(&second), ALLOCATED, &[]) {
        for (_, value) in &series.labels {
            assert!(!value.contains(['"', '\n', '}']), "{series:?}");
        }
    }
}

/// Mapping files with hostile contents: a FIFO as a GPU's file, huge and
/// negative job ids, 10 000 lines, a mtime in the future or before boot.
#[test]
fn hostile_mapping_files_cost_only_themselves() {
    let node = Node::new();
    node.write("jobstats/1", "777 1000\n");
    node.write("jobstats/0", "-5 1000\n");
    node.write("dcgm/0", &"1\n".repeat(10_000));
    node.write("dcgm/1", "99999999999999999999999999\n");
    node.write("dcgm/0.1", "778\n");
    let c = std::ffi::CString::new(node.path("dcgm/2")).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let runs = node.runs();
    let started = Instant::now();
    let first = runs.at("tasks", runs.t0);
    pause(200);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    let elapsed = started.elapsed().as_secs_f64();
    assert!(elapsed < 20.0);
    assert_eq!(success(&second), Some(0.0));
    let v = task_value(&second, ALLOCATED, "1", &job("777"));
    assert!(v > 0.0 && v <= elapsed, "{v}");
    never_decrease(&first, &second).unwrap();
    for gpu in ["0", "1"] {
        energy_conserved(&first, &second, gpu).unwrap();
    }
}

/// A pod's allocation that goes (its cgroup gone for a run) and comes back,
/// a job given a GPU that also runs a process there, a job counted by two
/// sources (the hook and jobstats): counters never go back, one series set
/// per task, no double count, energy conserved, over six runs.
#[test]
fn counters_never_go_back_as_allocations_come_and_go() {
    let node = Node::new();
    node.pod_runs(IDLE_POD);
    node.write(
        "checkpoint",
        &checkpoint(&[(IDLE_POD, "notebook", GPU1), (POD, "pytorch", GPU0)]),
    );
    node.pod_runs(POD);
    node.write("jobstats/0", "4711 1000\n");
    let runs = node.runs();
    let t0 = runs.t0;
    let started = Instant::now();
    let mut texts = vec![runs.at("tasks", t0)];
    node.hook("prolog", "4711", "0", t0 + 5 * SECOND);
    texts.push(runs.at("tasks", t0 + 15 * SECOND));
    let slice = node.dir.path().join(format!(
        "cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        IDLE_POD.replace('-', "_")
    ));
    fs::remove_dir(&slice).unwrap();
    texts.push(runs.at("tasks", t0 + 30 * SECOND));
    fs::create_dir(&slice).unwrap();
    node.write("checkpoint", &checkpoint(&[(IDLE_POD, "notebook", GPU1)]));
    texts.push(runs.at("tasks", t0 + 45 * SECOND));
    node.hook("epilog", "4711", "0", t0 + 50 * SECOND);
    texts.push(runs.at("tasks", t0 + 60 * SECOND));
    fs::remove_file(node.dir.path().join("jobstats/0")).unwrap();
    texts.push(runs.at("tasks", t0 + 75 * SECOND));
    let elapsed = started.elapsed().as_secs_f64();
    for pair in texts.windows(2) {
        never_decrease(&pair[0], &pair[1]).unwrap();
        for gpu in ["0", "1"] {
            energy_conserved(&pair[0], &pair[1], gpu).unwrap();
        }
    }
    let last = texts.last().unwrap();
    // One series set for job 4711 on GPU 0, its seconds at most the time.
    let samples = parsed(last);
    assert_eq!(
        select(
            &samples,
            ALLOCATED,
            &[("gpu", "0"), ("slurm_job_id", "4711")]
        )
        .len(),
        1,
        "{last}"
    );
    assert_eq!(
        select(&samples, ENERGY, &[("gpu", "0"), ("slurm_job_id", "4711")]).len(),
        1,
        "{last}"
    );
    for (series, value) in select(&samples, ALLOCATED, &[]) {
        assert!(value <= elapsed, "{series:?}: {value} of {elapsed}");
    }
}

/// Two jobs given one whole GPU by two sources at once (jobstats and the
/// dcgm map): neither is alone, the energy is not given twice.
#[test]
fn two_jobs_on_one_whole_gpu_share_its_energy_once() {
    let node = Node::new();
    node.write("jobstats/1", "801 1000\n");
    node.write("dcgm/1", "802\n");
    let runs = node.runs();
    let first = runs.at("tasks", runs.t0);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    energy_conserved(&first, &second, "1").unwrap();
    let given = task_value(&second, ENERGY, "1", &job("801"))
        + task_value(&second, ENERGY, "1", &job("802"));
    assert!(given <= 3000.0 + 1.0, "{given}");
    // And a job allocated by index (jobstats) and by UUID (a record) at
    // once is one task: one series, its seconds counted once.
    let node = Node::new();
    node.write("jobstats/1", "803 1000\n");
    node.write("dcgm/1", "803\n");
    node.write(&format!("jobstats/{GPU1}"), "803 1000\n");
    let runs = node.runs();
    let started = Instant::now();
    runs.at("tasks", runs.t0);
    node.hook("prolog", "803", "1", runs.t0 + 5 * SECOND);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    let elapsed = started.elapsed().as_secs_f64();
    let samples = parsed(&second);
    let allocated = select(&samples, ALLOCATED, &job("803"));
    assert_eq!(allocated.len(), 1, "{second}");
    assert!(allocated[0].1 <= elapsed);
}

/// DEFECT: (low) a MIG instance given by its UUID counts as such; but
/// dcgm's `<index>.<gi>` file naming a GPU instance that does not exist
/// (a stale file after the MIG layout changed) made a series for it. The
/// scenario's GPU has instances 2, 3 and 9: `0.9` is one, `0.5` is none.
#[test]
fn mig_allocations_name_their_instance() {
    let node = Node::new();
    node.pod_runs(IDLE_POD);
    let instance = "MIG-c80e5d37-91a2-5f4b-a6d3-7e1f0b9c8d24";
    node.write(
        "checkpoint",
        &checkpoint(&[(IDLE_POD, "notebook", instance)]),
    );
    node.write("dcgm/0.5", "812\n");
    node.write("dcgm/0.9", "813\n");
    let state = tempfile::tempdir().unwrap();
    let mut args: Vec<&str> = vec!["--gpm-window", "0"];
    let more = node.args();
    args.extend(more.iter().map(String::as_str));
    let t0 = now_on_the_sample_grid();
    ex().run_at("h100-mig", state.path(), t0, &args);
    let text = ex().run_at("h100-mig", state.path(), t0 + 15 * SECOND, &args);
    let samples = parsed(&text);
    assert_eq!(
        select(
            &samples,
            ALLOCATED,
            &[("gpu_instance_id", "3"), ("k8s_pod_uid", IDLE_POD)]
        )
        .len(),
        1,
        "{text}"
    );
    let ghost = select(&samples, ALLOCATED, &job("812"));
    assert!(
        ghost.is_empty(),
        "a GPU instance 5 that does not exist: {ghost:?}"
    );
    let real = [("gpu_instance_id", "9"), ("slurm_job_id", "813")];
    assert_eq!(select(&samples, ALLOCATED, &real).len(), 1, "{text}");
}

/// DEFECT: a mapping file whose last write is stamped after the wall clock's
/// now (the clock stepped back after the prolog wrote it: NTP correcting a
/// wrong RTC at boot) starts "now" on the clock of the read, which is after
/// the run's own now: the job is never counted, run after run, until the
/// wall clock passes the stamp.
#[test]
fn a_mapping_file_stamped_in_the_future_is_counted() {
    let node = Node::new();
    node.write("jobstats/1", "777 1000\n");
    let future = std::time::SystemTime::now() + Duration::from_secs(3600);
    let file = fs::File::options()
        .write(true)
        .open(node.dir.path().join("jobstats/1"))
        .unwrap();
    file.set_modified(future).unwrap();
    let runs = node.runs();
    runs.at("tasks", runs.t0);
    pause(200);
    runs.at("tasks", runs.t0 + 15 * SECOND);
    pause(200);
    let third = runs.at("tasks", runs.t0 + 30 * SECOND);
    let found = select(&parsed(&third), ALLOCATED, &job("777"))
        .iter()
        .map(|(_, v)| *v)
        .sum::<f64>();
    assert!(found > 0.3, "job 777 allocated {found} s over three runs");
}

/// DEFECT: (low) on a node with several slurmd (`<node>_slurmstepd.scope`,
/// which the owner reading knows), the liveness check looks only for
/// `slurmstepd.scope`, finds no Slurm cgroups and counts every Slurm
/// allocation as running: a jobstats file whose epilog did not remove it
/// keeps its long-gone job allocated.
#[test]
fn a_gone_job_on_a_multi_slurmd_node_is_not_allocated() {
    // Control: the same under plain slurmstepd.scope is not counted.
    {
        let node = Node::new();
        let scope = node.dir.path().join("cgroup/system.slice/slurmstepd.scope");
        fs::create_dir_all(scope.join("job_4711")).unwrap();
        node.write("jobstats/1", "4800 1000\n");
        let runs = node.runs();
        runs.at("tasks", runs.t0);
        let second = runs.at("tasks", runs.t0 + 15 * SECOND);
        assert!(
            select(&parsed(&second), ALLOCATED, &job("4800")).is_empty(),
            "{second}"
        );
    }
    let node = Node::new();
    let scope = node
        .dir
        .path()
        .join("cgroup/system.slice/node7_slurmstepd.scope");
    fs::create_dir_all(scope.join("job_4711")).unwrap();
    node.write("jobstats/1", "4800 1000\n");
    let runs = node.runs();
    runs.at("tasks", runs.t0);
    pause(100);
    let second = runs.at("tasks", runs.t0 + 15 * SECOND);
    let found = select(&parsed(&second), ALLOCATED, &job("4800"))
        .iter()
        .map(|(_, v)| *v)
        .sum::<f64>();
    assert_eq!(found, 0.0, "job 4800 (no cgroup) allocated {found} s");
}
