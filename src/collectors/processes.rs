//! Per-process GPU memory and SM utilization; the host step adds the owners
//! from procfs.

use std::collections::HashMap;
use std::path::Path;

use crate::collector::{Collector, Gpu, Hooks, HostError, HostRun};
use crate::compute;
use crate::metrics::families;
use crate::procfs::{self, Owner, Users};
use crate::snapshot::{Device, LabelValue};

families! {
    FAMILIES;
    PROCESS_MEMORY_USED: Gauge(Bytes), "nvidia_gpu_process_memory_used_bytes", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Device memory used by a compute process, with its owner (only with --collector processes).";
    PROCESS_UTILIZATION: Gauge(Ratio), "nvidia_gpu_process_utilization_ratio", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Fraction of the GPU's sample periods since the previous run in which a compute process's kernels ran, NVML's one mean per process (0-1; the processes of a GPU add up to its utilization), with its owner (only with --collector processes).";
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

fn read(reader: &mut Gpu<'_>) {
    compute::list(reader, true);
}

/// The host step: each GPU's processes become samples, with their owners
/// from procfs.
fn owners(run: &mut HostRun<'_>) -> Result<(), HostError> {
    attribute(
        &mut run.snapshot.devices,
        run.procfs,
        &Users::new(run.until),
    );
    Ok(())
}

/// Turns every device's processes into samples labelled with their ids and
/// owner (read once per pid).
fn attribute(devices: &mut [Device], procfs: &Path, users: &Users) {
    let mut owners: HashMap<u32, Owner> = HashMap::new();
    for device in devices {
        for process in std::mem::take(&mut device.processes) {
            let owner = owners
                .entry(process.pid)
                .or_insert_with(|| Owner::read(procfs, &process.pid.to_string(), users));
            let id = |id: Option<u32>| id.map(|id| LabelValue::Owned(id.to_string()));
            let ids = [
                Some(process.pid),
                process.gpu_instance_id,
                process.compute_instance_id,
            ];
            let labels = procfs::labels(ids.map(id), owner);
            if let Some(bytes) = process.memory_bytes {
                let sample = PROCESS_MEMORY_USED.sample_some(labels.clone(), bytes as f64);
                device.samples.push(sample);
            }
            if let Some(ratio) = process.sm_ratio {
                device
                    .samples
                    .push(PROCESS_UTILIZATION.sample_some(labels, ratio));
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
        let mut devices = vec![Device {
            processes: vec![
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
            ],
            ..Device::default()
        }];
        let users = Users::new(Instant::now() + Duration::from_secs(5));
        attribute(&mut devices, root.path(), &users);
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
        assert!(devices[0].processes.is_empty());
    }
}
