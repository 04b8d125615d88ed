//! Per task (a Slurm job, a pod's container, a container, a unit, a user)
//! and GPU: SM-busy seconds, energy and seconds held, counted exactly from
//! run to run through the state, and the memory it holds now. The GPU thread
//! reads the window and the energy counter; the host step names each
//! process's task and advances the GPU's [`Ledger`] ([`account`], pure).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::collector::{HostError, HostRun};
use crate::metrics::families;
use crate::owner::{self, Placement, Pods, Task};
use crate::procfs::Users;
use crate::snapshot::{LabelValue, Process};

families! {
    FAMILIES;
    TASK_BUSY: Counter(Seconds), "nvidia_gpu_task_busy_seconds_total", ["gpu_instance_id", "slurm_job_id", "slurm_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "SM-busy time of the task on the GPU: the GPU's busy time (nvidia_gpu_busy_seconds_total{engine=\"gpu\"}) by the share NVML gives the task's processes, counted from run to run; a GPU's tasks add up to it over the windows in which NVML names processes.";
    TASK_ENERGY: Counter(Joules), "nvidia_gpu_task_energy_joules_total", ["gpu_instance_id", "slurm_job_id", "slurm_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "The GPU's energy between runs by the task's share of its busy time (all of it for the only task holding a GPU without busy time); the rest is in nvidia_gpu_unattributed_energy_joules_total.";
    TASK_HELD: Counter(Seconds), "nvidia_gpu_task_held_seconds_total", ["gpu_instance_id", "slurm_job_id", "slurm_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "Time a process of the task was on the GPU (NVML lists it with a context there), from its start or the previous run.";
    TASK_MEMORY: Gauge(Bytes), "nvidia_gpu_task_memory_used_bytes", ["gpu_instance_id", "slurm_job_id", "slurm_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "Device memory the task's processes hold now (while it holds the GPU).";
    UNATTRIBUTED_ENERGY: Counter(Joules), "nvidia_gpu_unattributed_energy_joules_total", [],
        "The GPU's energy between runs that no known task used: idle windows with no or several holders, and the share of processes whose task is unknown.";
}

/// A task on a GPU: who, and on which MIG instance (where NVML says).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Holder {
    pub task: Task,
    pub gpu_instance_id: Option<u32>,
}

/// One holder's running totals on one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// SM-busy time: the GPU's busy time by the holder's share, µs.
    pub busy_us: u64,
    /// Energy by the holder's share of the busy time, mJ.
    pub energy_mj: u64,
    /// Time a process of the holder was listed on the GPU, µs.
    pub held_us: u64,
    /// Wall time (µs since the epoch) it last held the GPU or was charged.
    pub seen_us: u64,
}

/// A GPU's task accounting as one run leaves it for the next. `at_us` 0: no
/// run to count from (the next run only sets the baseline).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ledger {
    /// Wall time of the run it is up to, µs since the epoch.
    pub at_us: u64,
    /// The GPU's energy counter at that run, mJ.
    pub energy_mj: Option<u64>,
    /// Energy of windows (or their parts) no known holder used, mJ.
    pub unattributed_mj: u64,
    pub totals: Vec<(Holder, Totals)>,
    /// The processes listed at that run: pid, start time (µs since the
    /// epoch), holder; how a share NVML gives a pid that has since exited or
    /// been reused finds the holder it ran for.
    pub processes: Vec<(u32, u64, Holder)>,
}

/// The most holders a GPU's ledger keeps (past it, new ones are not counted).
pub const MAX_HOLDERS: usize = 256;
/// The most processes a GPU's ledger remembers.
pub const MAX_PROCESSES: usize = 1024;
/// How long a holder's series stay after it last held the GPU: every
/// scrape interval up to this sees its last increment.
pub const LINGER_US: u64 = 10 * 60 * 1_000_000;

/// The window of the processes' shares: the GPU engine's busy and covered
/// time since the previous run, from its samples (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub busy_us: u64,
    pub length_us: u64,
}

/// A process of this run as the host step knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub pid: u32,
    /// Listed by NVML now (it holds the GPU); else only its share is known.
    pub listed: bool,
    /// The holder of the process now running as `pid`, and its start time.
    pub now: Option<(Holder, u64)>,
    /// Its mean share of the window (0-1) and NVML's newest sample time of
    /// it (µs since the epoch).
    pub share: Option<(f64, u64)>,
}

/// What [`account`] gives: the next ledger, and whether a holder was not
/// counted for [`MAX_HOLDERS`].
#[derive(Debug, PartialEq)]
pub struct Accounted {
    pub ledger: Ledger,
    pub refused: bool,
}

/// Advances `previous` to the run at `now_us`: each holder's share of the
/// window's busy time, the energy since the previous run split by those
/// shares (all of it to the only holder of a window without busy time; to
/// nobody, `unattributed_mj`, where no known holder used it), and the time
/// held since the previous run or the process's start. Nothing is added
/// where `previous` has no run, or the energy counter went back (a driver
/// reload): those only set the baseline. Holders gone for [`LINGER_US`]
/// are dropped.
pub fn account(
    previous: &Ledger,
    now_us: u64,
    energy_mj: Option<u64>,
    window: Option<Window>,
    seen: &[Seen],
) -> Accounted {
    let mut totals: BTreeMap<Holder, Totals> = previous.totals.iter().cloned().collect();
    let mut refused = false;
    let mut charge = |holder: &Holder, add: &dyn Fn(&mut Totals)| {
        if totals.len() >= MAX_HOLDERS && !totals.contains_key(holder) {
            refused = true;
            return;
        }
        let entry = totals.entry(holder.clone()).or_default();
        add(entry);
        entry.seen_us = now_us;
    };
    let counting = previous.at_us != 0 && previous.at_us < now_us;
    // Who each share ran for: the process now at the pid, unless it started
    // after NVML last saw the pid busy (reused) and the previous run knew
    // the one before.
    let earlier = |pid: u32| previous.processes.iter().find(|p| p.0 == pid);
    let ran_for = |process: &Seen, last_us: u64| match (&process.now, earlier(process.pid)) {
        (Some((holder, start)), Some((_, was_start, was))) if start != was_start && *start > last_us => {
            Some(was.clone())
        }
        (Some((holder, _)), _) => Some(holder.clone()),
        (None, Some((_, _, was))) => Some(was.clone()),
        (None, None) => None,
    };
    let mut shares: BTreeMap<Holder, f64> = BTreeMap::new();
    let mut unknown = 0.0;
    for process in seen {
        if let Some((share, last_us)) = process.share.filter(|&(share, _)| share > 0.0) {
            match ran_for(process, last_us) {
                Some(holder) => *shares.entry(holder).or_default() += share,
                None => unknown += share,
            }
        }
    }
    let holding: Vec<&Holder> = {
        let mut holding: Vec<&Holder> = seen
            .iter()
            .filter(|p| p.listed)
            .filter_map(|p| p.now.as_ref().map(|(holder, _)| holder))
            .collect();
        holding.sort();
        holding.dedup();
        holding
    };
    let mut unattributed_mj = previous.unattributed_mj;
    if counting {
        let all: f64 = shares.values().sum::<f64>() + unknown;
        if let Some(window) = window.filter(|_| all > 0.0) {
            for (holder, share) in &shares {
                let busy = (window.busy_us as f64 * share / all).round() as u64;
                charge(holder, &|t: &mut Totals| t.busy_us += busy);
            }
        }
        let spent = match (previous.energy_mj, energy_mj) {
            (Some(before), Some(now)) if now >= before => now - before,
            _ => 0,
        };
        let mut given = 0;
        if all > 0.0 {
            for (holder, share) in &shares {
                let part = (spent as f64 * share / all).floor() as u64;
                given += part;
                charge(holder, &|t: &mut Totals| t.energy_mj += part);
            }
        } else if let [only] = holding[..] {
            given = spent;
            charge(only, &|t: &mut Totals| t.energy_mj += spent);
        }
        unattributed_mj += spent - given;
        for holder in &holding {
            let start = seen
                .iter()
                .filter(|p| p.listed)
                .filter_map(|p| p.now.as_ref())
                .filter(|(h, _)| h == *holder)
                .map(|&(_, start)| start)
                .min()
                .unwrap_or(0);
            let held = now_us.saturating_sub(start.max(previous.at_us));
            charge(holder, &|t: &mut Totals| t.held_us += held);
        }
    } else {
        for holder in &holding {
            charge(holder, &|_: &mut Totals| {});
        }
    }
    totals.retain(|_, t| now_us.saturating_sub(t.seen_us) <= LINGER_US);
    let processes = seen
        .iter()
        .filter(|p| p.listed)
        .filter_map(|p| p.now.as_ref().map(|(holder, start)| (p.pid, *start, holder.clone())))
        .take(MAX_PROCESSES)
        .collect();
    Accounted {
        ledger: Ledger {
            at_us: now_us,
            energy_mj,
            unattributed_mj,
            totals: totals.into_iter().collect(),
            processes,
        },
        refused,
    }
}

/// A run's task readings of one GPU, from its thread: the window of the
/// processes' shares and the energy counter.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    pub window: Option<Window>,
    pub energy_mj: Option<u64>,
}

/// The host step: names each process's task, advances every GPU's ledger
/// and writes its series.
pub(super) fn host(run: &mut HostRun<'_>) -> Result<(), HostError> {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let users = Users::new(run.until);
    let mut pods = None;
    let mut holders = HashMap::new();
    let mut refused = false;
    for device in &mut run.snapshot.devices {
        let Some(reading) = device.tasks.take() else {
            continue;
        };
        let Some(state) = run.states.get_mut(&device.uuid) else {
            continue;
        };
        let mut holder_of = |process: &Process| -> Option<(Holder, u64)> {
            let found = holders.entry(process.pid).or_insert_with(|| {
                let pods = || pods.get_or_insert_with(|| Pods::read(run.pod_logs, run.container_logs));
                task_of(run.procfs, process.pid, &users, pods)
            });
            let (task, start) = found.clone()?;
            let gpu_instance_id = process.gpu_instance_id;
            Some((Holder { task, gpu_instance_id }, start))
        };
        let seen: Vec<Seen> = device
            .processes
            .iter()
            .map(|process| Seen {
                pid: process.pid,
                listed: process.listed,
                now: holder_of(process),
                share: process.sm_ratio.zip(process.sm_last_us),
            })
            .collect();
        let accounted = account(&state.tasks, now_us, reading.energy_mj, reading.window, &seen);
        refused |= accounted.refused;
        state.tasks = accounted.ledger;
        let mut memory: BTreeMap<&Holder, u64> = BTreeMap::new();
        for (process, seen) in device.processes.iter().zip(&seen) {
            if let (Some((holder, _)), Some(bytes)) = (&seen.now, process.memory_bytes) {
                *memory.entry(holder).or_default() += bytes;
            }
        }
        for (holder, totals) in &state.tasks.totals {
            let labels = labels(holder);
            device.samples.extend([
                TASK_BUSY.sample_some(labels.clone(), totals.busy_us as f64 / 1e6),
                TASK_ENERGY.sample_some(labels.clone(), totals.energy_mj as f64 / 1e3),
                TASK_HELD.sample_some(labels.clone(), totals.held_us as f64 / 1e6),
            ]);
            if let Some(&bytes) = memory.get(holder) {
                device.samples.push(TASK_MEMORY.sample_some(labels, bytes as f64));
            }
        }
        let unattributed = state.tasks.unattributed_mj as f64 / 1e3;
        device.samples.push(UNATTRIBUTED_ENERGY.sample(unattributed));
    }
    if refused {
        run.state.lose_bound("tasks", MAX_HOLDERS);
        return Err(format!("more than {MAX_HOLDERS} tasks on a GPU; new ones are not counted").into());
    }
    Ok(())
}

/// The task of process `pid` and its start time; `None` when it is gone.
fn task_of<'p>(
    procfs: &Path,
    pid: u32,
    users: &Users,
    pods: impl FnOnce() -> &'p Pods,
) -> Option<(Task, u64)> {
    let dir = procfs.join(pid.to_string());
    let start = owner::started_us(procfs, pid)?;
    let cgroup = std::fs::read_to_string(dir.join("cgroup")).ok()?;
    let task = match owner::placement(&cgroup) {
        Placement::Slurm(id) if id.bytes().all(|b| b.is_ascii_digit()) => Task::Slurm {
            job_id: Some(id),
            sluid: None,
        },
        Placement::Slurm(sluid) => Task::Slurm {
            job_id: std::fs::read(dir.join("environ"))
                .ok()
                .and_then(|environ| owner::slurm_job_id(&environ)),
            sluid: Some(sluid),
        },
        Placement::Pod { uid, container_id } => pods().task(uid, container_id.as_deref()),
        Placement::Container(id) => Task::Container(id),
        Placement::Unit(unit) => Task::Unit(unit),
        Placement::User => {
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            Task::User(users.name(owner::real_uid(&status)?))
        }
    };
    Some((task, start))
}

/// A holder's label values, in the families' order.
fn labels(holder: &Holder) -> [Option<LabelValue>; 10] {
    let owned = |value: &Option<String>| value.clone().map(LabelValue::Owned);
    let one = |value: &String| Some(LabelValue::Owned(value.clone()));
    let instance = holder.gpu_instance_id.map(|id| LabelValue::Owned(id.to_string()));
    let mut labels: [Option<LabelValue>; 10] = Default::default();
    labels[0] = instance;
    match &holder.task {
        Task::Slurm { job_id, sluid } => (labels[1], labels[2]) = (owned(job_id), owned(sluid)),
        Task::Pod {
            uid,
            namespace,
            name,
            container,
        } => {
            (labels[3], labels[4]) = (owned(namespace), owned(name));
            (labels[5], labels[6]) = (one(uid), owned(container));
        }
        Task::Container(id) => labels[7] = one(id),
        Task::Unit(unit) => labels[8] = one(unit),
        Task::User(user) => labels[9] = one(user),
    }
    labels
}
