//! Per task (a Slurm job, a pod's container, a container, a unit, a user)
//! and GPU: SM-busy seconds, energy and seconds held, counted exactly from
//! run to run through the state, and the memory it holds now. The GPU thread
//! reads the window and the energy counter; the host step names each
//! process's task and advances the GPU's [`Ledger`] ([`account`], pure).

use std::collections::BTreeMap;

use nvml::calls;
use nvml::mig;
use nvml::types::field_id::NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION;

use crate::allocation::{self, Allocation, Device as AllocatedDevice, Task};
use crate::collector::{Collector, Gpu, Hooks, HostError, HostRun};
use crate::compute;
use crate::metrics::families;
use crate::owner::kubernetes::Pod;
use crate::owner::slurm::Job;
use crate::owner::{with_ids, Owner, Owners};
use crate::procfs;
use crate::samples;
use crate::snapshot::{Device, SlurmJob, TaskReading};
use crate::state::schema::{Damage, MAX_SAID};
use crate::state::Problem;
use crate::task::{account, Given, Holder, Ledger, Seen, MAX_HOLDERS};

families! {
    FAMILIES;
    TASK_BUSY: Counter(Seconds), "nvidia_gpu_task_busy_seconds_total", ["gpu_instance_id"] + crate::owner::LABELS,
        "SM-busy time of the task on the GPU: the GPU's busy time (nvidia_gpu_busy_seconds_total{engine=\"gpu\"}) by the share NVML gives the task's processes, counted from run to run; a GPU's tasks add up to it over the windows in which NVML names processes, and time NVML's sample buffer no longer held when read (no GPM window, a timer period longer than the buffer) is counted at its window's mean (an estimate). Absent until NVML has given the GPU's processes their shares while the task held it (never on a GPU in MIG mode or without per-process utilization).";
    TASK_ENERGY: Counter(Joules), "nvidia_gpu_task_energy_joules_total", ["gpu_instance_id"] + crate::owner::LABELS,
        "The GPU's energy between runs by the task's share of its busy time (all of it for the only task holding a GPU without busy time); the rest is in nvidia_gpu_unattributed_energy_joules_total.";
    TASK_HELD: Counter(Seconds), "nvidia_gpu_task_held_seconds_total", ["gpu_instance_id"] + crate::owner::LABELS,
        "Time a process of the task was on the GPU (NVML lists it with a context there), from its start or the previous run.";
    TASK_ALLOCATED: Counter(Seconds), "nvidia_gpu_task_allocated_seconds_total", ["gpu_instance_id"] + crate::owner::LABELS,
        "Time the scheduler had given the GPU (or its MIG instance, gpu_instance_id) to the task, whether or not a process of it ran there: a Slurm job (its hook's records exact to the prolog and epilog, or a mapping directory), a pod's container (the kubelet's device-plugin checkpoint, while the pod's control group exists).";
    TASK_MEMORY: Gauge(Bytes), "nvidia_gpu_task_memory_used_bytes", ["gpu_instance_id"] + crate::owner::LABELS,
        "Device memory the task's processes hold now (while it holds the GPU).";
    UNATTRIBUTED_ENERGY: Counter(Joules), "nvidia_gpu_unattributed_energy_joules_total", [],
        "The GPU's energy between runs that no known task used: idle windows with no or several holders, and the share of processes whose task is unknown.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "tasks",
    default: true,
    help: "Per task (Slurm job, Kubernetes pod's container, container, systemd unit, else user) and GPU: SM-busy seconds, energy, seconds held and seconds allocated (the GPUs a Slurm job or pod was given, process or not), counted from run to run, and the memory it holds; the GPU's energy no task used.",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS)
        .with_early(compute::early)
        .with_host(host)
        .needing(&["xid"]),
};

/// Field values this collector takes from the batch.
pub(super) const FIELDS: &[u32] = &[NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION];

/// The GPU thread's part: the processes and their window (listed once with
/// the processes collector), the energy counter, and the ledger carried to
/// the host step; nothing where this run's totals cannot continue the
/// state's (the next run then starts the ledger afresh).
fn read(gpu: &mut Gpu<'_>) {
    // With no process listed now or at the previous run, no share can be
    // any task's (a process that came and went between runs has no task).
    // A GPU given to a task counts its idle windows too.
    let previous = &gpu.previous_state().tasks;
    let given = previous.totals.iter().any(|(_, t)| t.allocated_us > 0);
    let known = !previous.processes.is_empty() || given;
    let window = compute::list(gpu, known);
    let energy_mj = gpu
        .nvml
        .field_or(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, |nvml| {
            nvml.read(calls::TOTAL_ENERGY, ()).map(|mj| mj as f64)
        })
        .map(|mj| mj as u64)
        // A window whose shares could not be read is left to the next run,
        // and so is its energy: the ledger keeps its baseline.
        .filter(|_| !gpu.fetched.shares_failed);
    if gpu.keeps_totals() {
        gpu.next_state().tasks = gpu.previous_state().tasks.clone();
        let instances = mig::devices(&mut gpu.nvml)
            .iter()
            .filter_map(|mig| {
                let uuid = gpu.nvml.read_on(&mig.handle, calls::UUID, ())?;
                Some((uuid, mig.gpu_instance_id))
            })
            .collect();
        gpu.tasks = Some(TaskReading {
            window,
            energy_mj,
            instances,
        });
    }
}

/// The host step: names each process's task, advances every GPU's ledger
/// and writes its series.
fn host(run: &mut HostRun<'_>) -> Result<(), HostError> {
    // Boot time, not the wall clock: a clock step moves no count. NVML's
    // sample times are the wall clock's.
    let now_us = procfs::boot_us();
    let wall_us = samples::now_us();
    let to_boot = |wall: u64| wall.saturating_sub(wall_us.saturating_sub(now_us));
    let too_many = Problem::TooManyTasks(MAX_HOLDERS);
    let (mut refused, mut damaged) = (false, None);
    let found = allocation::read(&run.inputs.allocations, run.until);
    // Each problem logged when it begins, not every run while it lasts.
    let said = &run.state.previous().said;
    for problem in &found.problems {
        match said.contains(problem) {
            false => log::warn!("{problem}; those allocations are not counted"),
            true => log::debug!("{problem} (still)"),
        }
    }
    run.state.next().said = found.problems.iter().take(MAX_SAID).cloned().collect();
    // This run's XID counts, where the xid step counted them (it runs first).
    let xids_counted = run.succeeded.contains(&"xid");
    for device in &mut run.snapshot.devices {
        let (Some(reading), Some(state)) = (device.tasks.take(), run.states.get_mut(&device.uuid))
        else {
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
        let seen: Vec<Seen> = device
            .processes
            .iter()
            .map(|process| {
                let known = run.owners.of(process.pid);
                let holder = |task| Holder {
                    task,
                    gpu_instance_id: process.gpu_instance_id,
                };
                let now = known.owner.clone().map(holder).zip(known.proc.started_us);
                Seen {
                    pid: process.pid,
                    listed: process.listed,
                    now: now.map(|(holder, start)| (named(holder, &state.tasks), start)),
                    share: process.sm_ratio.zip(process.sm_seen_us.map(to_boot)),
                }
            })
            .collect();
        let (given, jobs) = given(
            &found.allocations,
            device,
            &reading,
            &seen,
            &state.tasks,
            run.owners,
        );
        device.slurm_jobs = jobs;
        let xids = xids_counted.then(|| run.state.next().xid.xids_of(&device.uuid));
        let (energy_mj, window) = (reading.energy_mj, reading.window);
        let next = account(&state.tasks, now_us, energy_mj, window, &seen, &given, xids);
        if next.refused && !state.tasks.refused {
            log::warn!("GPU {}: {too_many}", device.index);
        }
        refused |= next.refused;
        state.tasks = next;
        let mut memory: BTreeMap<&Holder, u64> = BTreeMap::new();
        for (process, seen) in device.processes.iter().zip(&seen) {
            if let (Some((holder, _)), Some(bytes)) = (&seen.now, process.memory_bytes) {
                *memory.entry(holder).or_default() += bytes;
            }
        }
        let samples = &mut device.samples;
        let seconds = |us: u64| us as f64 / 1e6;
        for (holder, totals) in &mut state.tasks.totals {
            let instance = holder.gpu_instance_id.map(|id| id.to_string().into());
            let labels = with_ids([instance], Some(&holder.task));
            if totals.measured {
                samples.push(TASK_BUSY.sample_some(labels.clone(), seconds(totals.busy_us)));
            }
            if totals.allocated_us > 0 || given.iter().any(|g| g.holder == *holder) {
                let allocated = seconds(totals.allocated_us);
                samples.push(TASK_ALLOCATED.sample_some(labels.clone(), allocated));
            }
            samples.extend([
                TASK_ENERGY.sample_some(labels.clone(), totals.energy_mj as f64 / 1e3),
                TASK_HELD.sample_some(labels.clone(), seconds(totals.held_us)),
            ]);
            if let Some(&bytes) = memory.get(holder) {
                totals.memory_peak_bytes = totals.memory_peak_bytes.max(bytes);
                samples.push(TASK_MEMORY.sample_some(labels, bytes as f64));
            }
        }
        samples.push(UNATTRIBUTED_ENERGY.sample(state.tasks.unattributed_mj as f64 / 1e3));
    }
    if refused {
        run.state.bounded(too_many);
    }
    if let Some(uuid) = damaged {
        run.state.bounded(Problem::Corrupt(Damage::Tasks(uuid)));
    }
    match found.problems.len() {
        0 => Ok(()),
        n => Err(format!("{n} allocation sources could not be read").into()),
    }
}

/// The tasks `allocations` give this GPU or its MIG instances, each named
/// as the GPU's processes (or, before, the ledger) name the same task; and
/// the Slurm jobs it is allocated to now.
fn given(
    allocations: &[Allocation],
    device: &Device,
    reading: &TaskReading,
    seen: &[Seen],
    ledger: &Ledger,
    owners: &Owners,
) -> (Vec<Given>, Vec<SlurmJob>) {
    let (mut given, mut jobs): (Vec<Given>, Vec<SlurmJob>) = Default::default();
    for allocation in allocations {
        let instance = match &allocation.device {
            AllocatedDevice::Uuid(uuid) if *uuid == device.uuid => None,
            AllocatedDevice::Uuid(uuid) => {
                match reading.instances.iter().find(|(u, _)| u == uuid) {
                    Some(&(_, gi)) => Some(gi),
                    None => continue,
                }
            }
            AllocatedDevice::Instance(uuid, gi) if *uuid == device.uuid => Some(*gi),
            // An instance the GPU does not have (a file left from another
            // MIG layout) is no one's.
            AllocatedDevice::Index(index, Some(gi))
                if *index == device.index && reading.instances.iter().any(|(_, g)| g == gi) =>
            {
                Some(*gi)
            }
            AllocatedDevice::Index(index, None) if *index == device.index => None,
            _ => continue,
        };
        if let (Task::Slurm { job_id, .. }, None) = (&allocation.task, allocation.end) {
            let same = |j: &&mut SlurmJob| j.job_id == *job_id && j.gpu_instance_id == instance;
            match jobs.iter_mut().find(same) {
                Some(known) => known.uid = known.uid.or(allocation.uid),
                None => jobs.push(SlurmJob {
                    gpu_instance_id: instance,
                    job_id: job_id.clone(),
                    uid: allocation.uid,
                }),
            }
        }
        let task = match &allocation.task {
            Task::Slurm { job_id, sluid } => Owner::Slurm(Job {
                job_id: Some(job_id.clone()),
                sluid: sluid.clone(),
            }),
            Task::Pod { uid, container } => owners.pod(uid.clone(), container.clone()),
        };
        let holder = Holder {
            task,
            gpu_instance_id: instance,
        };
        let known = seen.iter().filter_map(|p| p.now.as_ref().map(|(h, _)| h));
        let holder = known
            .chain(ledger.totals.iter().map(|(h, _)| h))
            .find(|h| h.gpu_instance_id == instance && same_task(&h.task, &holder.task))
            .cloned()
            .unwrap_or_else(|| named(holder, ledger));
        let next = Given {
            holder,
            start: allocation.start,
            end: allocation.end,
            whole: instance.is_none() && !allocation.shared,
        };
        // One allocation per holder: the one whose edges are known.
        match given.iter_mut().find(|g| g.holder == next.holder) {
            Some(known) if known.start.is_none() && next.start.is_some() => *known = next,
            Some(_) => {}
            None => given.push(next),
        }
    }
    (given, jobs)
}

/// Whether two owners are one task: a Slurm job by its number (a process
/// also knows its SLUID), a pod's container by the pod's UID and the
/// container's name where both know it.
fn same_task(a: &Owner, b: &Owner) -> bool {
    match (a, b) {
        // Two SLUIDs that differ are two jobs, whatever number a job's
        // environment claims.
        (Owner::Slurm(a), Owner::Slurm(b)) => match (&a.sluid, &b.sluid) {
            (Some(x), Some(y)) => x == y,
            _ => a.job_id.is_some() && a.job_id == b.job_id,
        },
        (Owner::Pod(a), Owner::Pod(b)) => {
            a.uid == b.uid
                && (a.container.is_none() || b.container.is_none() || a.container == b.container)
        }
        _ => false,
    }
}

/// `holder`, a pod the kubelet's directories no longer (or not yet) name
/// taking the names the ledger knows it by: a pod's series keep their
/// labels while its log directory comes and goes.
fn named(holder: Holder, ledger: &Ledger) -> Holder {
    let Owner::Pod(Pod {
        uid,
        namespace: None,
        container,
        ..
    }) = &holder.task
    else {
        return holder;
    };
    let known = ledger.totals.iter().map(|(known, _)| known).find(|known| {
        matches!(&known.task, Owner::Pod(Pod { uid: u, container: c, .. }) if u == uid && c == container)
            && known.gpu_instance_id == holder.gpu_instance_id
    });
    known.cloned().unwrap_or(holder)
}

#[cfg(test)]
mod tests {
    use super::super::processes;
    use super::*;
    use crate::snapshot::{BusyWindow, Process, Snapshot};
    use crate::state::schema::GpuState;
    use crate::state::{StateDir, StateFile};
    use std::time::{Duration, Instant};

    type Step = fn(&mut HostRun<'_>) -> Result<(), HostError>;

    /// One snapshot through `steps`: its samples, as text, held time left out
    /// (it runs on the host's clock).
    fn host_steps(steps: &[Step]) -> Vec<String> {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("77");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            "0::/system.slice/slurmstepd.scope/job_5/x\n",
        )
        .unwrap();
        let stat = "77 (py) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 1 1";
        std::fs::write(dir.join("stat"), stat).unwrap();
        let process = Process {
            pid: 77,
            memory_bytes: Some(1024),
            sm_ratio: Some(0.5),
            listed: true,
            ..Process::default()
        };
        let window = BusyWindow {
            busy_us: 1_000_000,
            length_us: 2_000_000,
            unread_us: 0,
        };
        let tasks = TaskReading {
            window: Some(window),
            energy_mj: Some(5_000),
            ..TaskReading::default()
        };
        let device = Device {
            uuid: "GPU-0".into(),
            processes: vec![process],
            tasks: Some(tasks),
            ..Device::default()
        };
        let mut snapshot = Snapshot {
            devices: vec![device],
            ..Snapshot::default()
        };
        let until = Instant::now() + Duration::from_secs(5);
        let mut state = StateFile::open(StateDir::new(root.path().join("state")), until, false);
        let mut owners = Owners::new(root.path(), root.path(), root.path(), until);
        let mut states = BTreeMap::from([("GPU-0".to_owned(), GpuState::default())]);
        let mut run = HostRun {
            snapshot: &mut snapshot,
            state: &mut state,
            until,
            inputs: &crate::collector::HostInputs::default(),
            owners: &mut owners,
            states: &mut states,
            succeeded: Vec::new(),
        };
        for step in steps {
            step(&mut run).unwrap();
        }
        let samples = snapshot.devices.remove(0).samples;
        let held = |s: &&crate::snapshot::Sample| s.family != TASK_HELD.family();
        let mut text: Vec<String> = samples
            .iter()
            .filter(held)
            .map(|s| format!("{s:?}"))
            .collect();
        text.sort();
        text
    }

    /// Neither host step changes what the other reads: both orders write
    /// the same samples, the task's among them.
    #[test]
    fn the_host_steps_write_the_same_in_either_order() {
        let tasks_first = host_steps(&[host as Step, processes::owners]);
        assert!(tasks_first
            .iter()
            .any(|s| s.contains("nvidia_gpu_task_memory_used_bytes")));
        assert!(tasks_first
            .iter()
            .any(|s| s.contains("nvidia_gpu_process_memory_used_bytes")));
        assert_eq!(tasks_first, host_steps(&[processes::owners as Step, host]));
    }
}
