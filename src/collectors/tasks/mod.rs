//! Per task (a Slurm job, a pod's container, a container, a unit, a user)
//! and GPU: SM-busy seconds, energy and seconds held, counted exactly from
//! run to run through the state, and the memory it holds now. The GPU thread
//! reads the window and the energy counter; the host step names each
//! process's task and advances the GPU's [`Ledger`] ([`account`], pure).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::collector::{HostError, HostRun};
use crate::metrics::families;
use crate::owner::{self, Placement, Pods, Task};
use crate::procfs::Users;
use crate::snapshot::{LabelValue, Process};

families! {
    FAMILIES;
    TASK_BUSY: Counter(Seconds), "nvidia_gpu_task_busy_seconds_total", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "SM-busy time of the task on the GPU: the GPU's busy time (nvidia_gpu_busy_seconds_total{engine=\"gpu\"}) by the share NVML gives the task's processes, counted from run to run; a GPU's tasks add up to it over the windows in which NVML names processes.";
    TASK_ENERGY: Counter(Joules), "nvidia_gpu_task_energy_joules_total", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "The GPU's energy between runs by the task's share of its busy time (all of it for the only task holding a GPU without busy time); the rest is in nvidia_gpu_unattributed_energy_joules_total.";
    TASK_HELD: Counter(Seconds), "nvidia_gpu_task_held_seconds_total", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "Time a process of the task was on the GPU (NVML lists it with a context there), from its start or the previous run.";
    TASK_MEMORY: Gauge(Bytes), "nvidia_gpu_task_memory_used_bytes", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "Device memory the task's processes hold now (while it holds the GPU).";
    UNATTRIBUTED_ENERGY: Counter(Joules), "nvidia_gpu_unattributed_energy_joules_total", [],
        "The GPU's energy between runs that no known task used: idle windows with no or several holders, and the share of processes whose task is unknown.";
}

mod ledger;

pub use ledger::{Holder, Ledger};
use ledger::{account, Seen, Window, MAX_HOLDERS};

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
                .and_then(|environ| owner::slurm_job_id(&environ, &sluid)),
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

