//! Per-process GPU memory and SM utilization; the host step adds each
//! process's command and owner, the labels `tasks` gives its task.

use crate::collector::{Collector, Gpu, Hooks, HostError, HostRun};
use crate::compute;
use crate::metrics::families;
use crate::owner::{with_ids, Owners};
use crate::snapshot::{Device, LabelValue};

families! {
    FAMILIES;
    PROCESS_MEMORY_USED: Gauge(Bytes), "nvidia_gpu_process_memory_used_bytes", ["pid", "gpu_instance_id", "compute_instance_id", "comm"] + crate::owner::LABELS,
        "Device memory used by a compute process, with its command and owner, labelled as its task (only with --collector processes).";
    PROCESS_UTILIZATION: Gauge(Ratio), "nvidia_gpu_process_utilization_ratio", ["pid", "gpu_instance_id", "compute_instance_id", "comm"] + crate::owner::LABELS,
        "Fraction of the GPU's sample periods since the previous run in which a compute process's kernels ran, NVML's one mean per process (0-1; the processes of a GPU add up to its utilization), with its command and owner (only with --collector processes).";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "processes",
    default: false,
    help: "Per-process GPU memory and SM utilization with owner attribution from /proc (pids churn series).",
    families: FAMILIES,
    hooks: Hooks::read(read, &[])
        .with_early(compute::early)
        .with_host(owners),
};

fn read(gpu: &mut Gpu<'_>) {
    compute::list(gpu, true);
}

/// The host step: each GPU's processes become samples, with their owners.
pub(super) fn owners(run: &mut HostRun<'_>) -> Result<(), HostError> {
    attribute(&mut run.snapshot.devices, run.owners);
    Ok(())
}

/// Adds every device's processes as samples labelled with their ids,
/// command and owner; the processes stay for other steps.
fn attribute(devices: &mut [Device], owners: &mut Owners) {
    for device in devices {
        for process in &device.processes {
            let known = owners.of(process.pid);
            let id = |id: Option<u32>| id.map(|id| id.to_string().into());
            let comm = known.proc.comm.clone().map(LabelValue::Owned);
            let ids = [
                id(Some(process.pid)),
                id(process.gpu_instance_id),
                id(process.compute_instance_id),
                comm,
            ];
            let labels = with_ids(ids, known.owner.as_ref());
            let samples = &mut device.samples;
            if let Some(bytes) = process.memory_bytes {
                samples.push(PROCESS_MEMORY_USED.sample_some(labels.clone(), bytes as f64));
            }
            if let Some(ratio) = process.sm_ratio {
                samples.push(PROCESS_UTILIZATION.sample_some(labels, ratio));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Process;
    use std::fs;
    use std::time::{Duration, Instant};

    /// A process on a MIG instance with its memory and a gone one with only
    /// its share: ids first, then the owner, in declared order.
    #[test]
    fn processes_become_samples_with_their_ids_and_owner() {
        let root = tempfile::tempdir().unwrap();
        let pid = root.path().join("77");
        fs::create_dir(&pid).unwrap();
        fs::write(pid.join("comm"), "python\n").unwrap();
        let cgroup = "0::/system.slice/slurmstepd.scope/job_5/step_0\n";
        fs::write(pid.join("cgroup"), cgroup).unwrap();
        let processes = vec![
            Process {
                pid: 77,
                gpu_instance_id: Some(2),
                compute_instance_id: Some(0),
                memory_bytes: Some(1024),
                listed: true,
                ..Process::default()
            },
            Process {
                pid: 78,
                sm_ratio: Some(0.5),
                ..Process::default()
            },
        ];
        let mut devices = vec![Device {
            processes: processes.clone(),
            ..Device::default()
        }];
        let until = Instant::now() + Duration::from_secs(5);
        let mut owners = Owners::new(root.path(), root.path(), root.path(), until);
        attribute(&mut devices, &mut owners);
        let written: Vec<(&str, f64, Vec<String>)> = devices[0]
            .samples
            .iter()
            .map(|sample| {
                let labels = sample.labels.iter();
                let pairs = labels.map(|l| format!("{}={}", l.name, l.value)).collect();
                (sample.family.name, sample.value, pairs)
            })
            .collect();
        let owned = |pairs: &[&str]| pairs.iter().map(|p| p.to_string()).collect();
        let mig = [
            "pid=77",
            "gpu_instance_id=2",
            "compute_instance_id=0",
            "comm=python",
            "slurm_job_id=5",
        ];
        assert_eq!(
            written,
            [
                ("nvidia_gpu_process_memory_used_bytes", 1024.0, owned(&mig)),
                (
                    "nvidia_gpu_process_utilization_ratio",
                    0.5,
                    owned(&["pid=78"])
                ),
            ]
        );
        assert_eq!(devices[0].processes, processes);
    }
}
