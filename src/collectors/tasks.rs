//! Per task (a Slurm job, a pod's container, a container, a unit, a user)
//! and GPU: SM-busy seconds, energy and seconds held, counted exactly from
//! run to run through the state, and the memory it holds now. The GPU thread
//! reads the window and the energy counter; the host step names each
//! process's task and advances the GPU's [`Ledger`] ([`account`], pure).

use std::cell::{Cell, OnceCell};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nvml::calls;
use nvml::types::field_id::NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION;

use crate::bounded;
use crate::collector::{Collector, Gpu, Hooks, HostError, HostRun};
use crate::compute;
use crate::metrics::families;
use crate::procfs::{self, Users};
use crate::snapshot::{LabelValue, Process, TaskReading};
use crate::state::schema::Damage;
use crate::state::Problem;
use crate::task::owner::{self, Placement, Pods, Task};
use crate::task::{account, Holder, Ledger, Seen, MAX_HOLDERS};

families! {
    FAMILIES;
    TASK_BUSY: Counter(Seconds), "nvidia_gpu_task_busy_seconds_total", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "SM-busy time of the task on the GPU: the GPU's busy time (nvidia_gpu_busy_seconds_total{engine=\"gpu\"}) by the share NVML gives the task's processes, counted from run to run; a GPU's tasks add up to it over the windows in which NVML names processes, and time NVML's sample buffer no longer held when read (no GPM window, a timer period longer than the buffer) is counted at its window's mean (an estimate). Absent until NVML has given the GPU's processes their shares while the task held it (never on a GPU in MIG mode or without per-process utilization).";
    TASK_ENERGY: Counter(Joules), "nvidia_gpu_task_energy_joules_total", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "The GPU's energy between runs by the task's share of its busy time (all of it for the only task holding a GPU without busy time); the rest is in nvidia_gpu_unattributed_energy_joules_total.";
    TASK_HELD: Counter(Seconds), "nvidia_gpu_task_held_seconds_total", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "Time a process of the task was on the GPU (NVML lists it with a context there), from its start or the previous run.";
    TASK_MEMORY: Gauge(Bytes), "nvidia_gpu_task_memory_used_bytes", ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid", "k8s_namespace_name", "k8s_pod_name", "k8s_pod_uid", "k8s_container_name", "container_id", "systemd_unit", "user"],
        "Device memory the task's processes hold now (while it holds the GPU).";
    UNATTRIBUTED_ENERGY: Counter(Joules), "nvidia_gpu_unattributed_energy_joules_total", [],
        "The GPU's energy between runs that no known task used: idle windows with no or several holders, and the share of processes whose task is unknown.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "tasks",
    default: true,
    help: "Per task (Slurm job, Kubernetes pod's container, container, systemd unit, else user) and GPU: SM-busy seconds, energy and seconds held, counted from run to run, and the memory it holds; the GPU's energy no task used.",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS)
        .with_early(compute::early)
        .with_host(host),
};

/// Field values this collector takes from the batch.
pub(super) const FIELDS: &[u32] = &[NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION];

/// The GPU thread's part: the processes and their window (listed once with
/// the processes collector), the energy counter, and the ledger carried to
/// the host step; nothing where this run's totals cannot continue the
/// state's (the next run then starts the ledger afresh).
fn read(reader: &mut Gpu<'_>) {
    // With no process listed now or at the previous run, no share can be
    // any task's (a process that came and went between runs has no task).
    let known = !reader.previous_state().tasks.processes.is_empty();
    let window = compute::list(reader, known);
    let energy_mj = reader
        .nvml
        .field_or(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, |nvml| {
            nvml.read(calls::TOTAL_ENERGY, ()).map(|mj| mj as f64)
        })
        .map(|mj| mj as u64)
        // A window whose shares could not be read is left to the next run,
        // and so is its energy: the ledger keeps its baseline.
        .filter(|_| !reader.fetched.shares_failed());
    if reader.keeps_totals() {
        reader.next_state().tasks = reader.previous_state().tasks.clone();
        reader.tasks = Some(TaskReading { window, energy_mj });
    }
}

/// The host step: names each process's task, advances every GPU's ledger
/// and writes its series.
fn host(run: &mut HostRun<'_>) -> Result<(), HostError> {
    // Boot time, not the wall clock: a clock step moves no count. NVML's
    // sample times are the wall clock's.
    let now_us = owner::boot_us();
    let wall_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let to_boot = |wall: u64| wall.saturating_sub(wall_us.saturating_sub(now_us));
    let users = Users::new(run.until);
    let environ = Environ {
        until: run.until,
        gave_up: Cell::new(false),
    };
    // Read once, and only for a run with a pod's process.
    let pods = OnceCell::new();
    let mut holders = HashMap::new();
    let (mut refused, mut damaged) = (false, None);
    let (pod_logs, container_logs, until) = (run.pod_logs, run.container_logs, run.until);
    for device in &mut run.snapshot.devices {
        let Some(reading) = device.tasks.take() else {
            continue;
        };
        let Some(state) = run.states.get_mut(&device.uuid) else {
            continue;
        };
        if let Some(implausible) = state.tasks.implausible() {
            log::warn!(
                "GPU {}: the state's task ledger is damaged ({implausible}); \
                 its tasks start afresh",
                device.index
            );
            state.tasks = Ledger::default();
            damaged.get_or_insert_with(|| device.uuid.clone());
        }
        let mut holder_of = |process: &Process| -> Option<(Holder, u64)> {
            let found = holders.entry(process.pid).or_insert_with(|| {
                let pods = || pods.get_or_init(|| read_pods(pod_logs, container_logs, until));
                task_of(run.procfs, process.pid, &users, &environ, pods)
            });
            let (task, start) = found.clone()?;
            let gpu_instance_id = process.gpu_instance_id;
            let holder = Holder {
                task,
                gpu_instance_id,
            };
            Some((named(holder, &state.tasks), start))
        };
        let seen: Vec<Seen> = device
            .processes
            .iter()
            .map(|process| Seen {
                pid: process.pid,
                listed: process.listed,
                now: holder_of(process),
                share: process.sm_ratio.zip(process.sm_seen_us.map(to_boot)),
            })
            .collect();
        let accounted = account(
            &state.tasks,
            now_us,
            reading.energy_mj,
            reading.window,
            &seen,
        );
        if accounted.refused && !state.tasks.refused {
            log::warn!(
                "GPU {}: {}",
                device.index,
                Problem::TooManyTasks(MAX_HOLDERS)
            );
        }
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
            if totals.measured {
                let busy = totals.busy_us as f64 / 1e6;
                device
                    .samples
                    .push(TASK_BUSY.sample_some(labels.clone(), busy));
            }
            device.samples.extend([
                TASK_ENERGY.sample_some(labels.clone(), totals.energy_mj as f64 / 1e3),
                TASK_HELD.sample_some(labels.clone(), totals.held_us as f64 / 1e6),
            ]);
            if let Some(&bytes) = memory.get(holder) {
                device
                    .samples
                    .push(TASK_MEMORY.sample_some(labels, bytes as f64));
            }
        }
        let unattributed = state.tasks.unattributed_mj as f64 / 1e3;
        device
            .samples
            .push(UNATTRIBUTED_ENERGY.sample(unattributed));
    }
    if refused {
        run.state.bounded(Problem::TooManyTasks(MAX_HOLDERS));
    }
    if let Some(uuid) = damaged {
        run.state.bounded(Problem::Corrupt(Damage::Tasks(uuid)));
    }
    Ok(())
}

/// The kubelet's names, read on a thread of its own until the deadline (a
/// hung file system names nothing).
fn read_pods(pods: &Path, containers: &Path, until: Instant) -> Pods {
    let (pods, containers) = (pods.to_owned(), containers.to_owned());
    bounded::call("pods", until, move || Pods::read(&pods, &containers)).unwrap_or_else(|_| {
        log::warn!("the kubelet's log directories did not answer in time; pods are not named");
        Pods::default()
    })
}

/// The task of process `pid` and its start time; `None` when it is gone.
fn task_of<'p>(
    procfs: &Path,
    pid: u32,
    users: &Users,
    environ: &Environ,
    pods: impl FnOnce() -> &'p Pods,
) -> Option<(Task, u64)> {
    let dir = procfs.join(pid.to_string());
    let start = owner::started_us(procfs, pid)?;
    let cgroup = procfs::read_lossy(&dir.join("cgroup"))?;
    let task = match owner::placement(&cgroup) {
        Placement::Slurm(id) if id.bytes().all(|b| b.is_ascii_digit()) => Task::Slurm {
            job_id: Some(id),
            sluid: None,
        },
        Placement::Slurm(sluid) => Task::Slurm {
            job_id: environ
                .read(dir.join("environ"))
                .and_then(|environ| owner::slurm_job_id(&environ, &sluid)),
            sluid: Some(sluid),
        },
        Placement::Pod { uid, container_id } => pods().task(uid, container_id.as_deref()),
        Placement::Container(id) => Task::Container(id),
        Placement::Unit(unit) => Task::Unit(unit),
        Placement::User => {
            let status = procfs::read_lossy(&dir.join("status"))?;
            Task::User(users.name(owner::real_uid(&status)?))
        }
    };
    Some((task, start))
}

/// Reads of processes' environments, each on a thread of its own until the
/// deadline (reading one waits for its process's memory map, which a process
/// stuck in the driver can hold); after one that did not answer, none.
struct Environ {
    until: Instant,
    gave_up: Cell<bool>,
}

impl Environ {
    fn read(&self, path: PathBuf) -> Option<Vec<u8>> {
        if self.gave_up.get() {
            return None;
        }
        match bounded::call("environ", self.until, move || std::fs::read(path)) {
            Ok(read) => read.ok(),
            Err(_) => {
                log::warn!("a process's environment did not answer in time; Slurm job numbers by SLUID left out");
                self.gave_up.set(true);
                None
            }
        }
    }
}

/// `holder`, a pod the kubelet's directories no longer (or not yet) name
/// taking the names the ledger knows it by: a pod's series keep their
/// labels while its log directory comes and goes.
fn named(holder: Holder, ledger: &Ledger) -> Holder {
    let Task::Pod {
        uid,
        namespace: None,
        container,
        ..
    } = &holder.task
    else {
        return holder;
    };
    let known = ledger.totals.iter().map(|(known, _)| known).find(|known| {
        matches!(&known.task, Task::Pod { uid: u, container: c, .. } if u == uid && c == container)
            && known.gpu_instance_id == holder.gpu_instance_id
    });
    known.cloned().unwrap_or(holder)
}

/// A holder's label values, in the families' order.
fn labels(holder: &Holder) -> [Option<LabelValue>; 10] {
    let owned = |value: &Option<String>| value.clone().map(LabelValue::Owned);
    let one = |value: &String| Some(LabelValue::Owned(value.clone()));
    let instance = holder
        .gpu_instance_id
        .map(|id| LabelValue::Owned(id.to_string()));
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
