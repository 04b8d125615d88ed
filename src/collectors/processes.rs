//! Per-process GPU memory and SM utilization; the host step adds the owners
//! from procfs.

use std::collections::HashMap;
use std::path::Path;

use nvml::samples::{fetch_processes, ProcessEntry};
use nvml::types::{Sampling, UsedGpuMemory};

use crate::collector::{Gpu, HostError, HostRun};
use crate::metrics::{self, families};
use crate::procfs::{self, Owner, Users};
use crate::samples::{self, Carry};
use crate::snapshot::{BusyWindow, Device, LabelValue, Process};
use crate::state::schema::Stream;

families! {
    FAMILIES;
    PROCESS_MEMORY_USED: Gauge(Bytes), "nvidia_gpu_process_memory_used_bytes", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Device memory used by a compute process, with its owner (only with --collector processes).";
    PROCESS_UTILIZATION: Gauge(Ratio), "nvidia_gpu_process_utilization_ratio", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Fraction of the GPU's sample periods since the previous run in which a compute process's kernels ran, NVML's one mean per process (0-1; the processes of a GPU add up to its utilization), with its owner (only with --collector processes).";
}

pub(super) fn read(reader: &mut Gpu<'_>) {
    list(reader);
}

/// Lists the GPU's processes with their shares of the window since the
/// previous run, once per run whichever collectors ask (processes, tasks);
/// the window, where NVML gave shares over one.
pub(super) fn list(reader: &mut Gpu<'_>) -> Option<BusyWindow> {
    if let Some(window) = reader.process_window {
        return window;
    }
    reader.process_window = Some(None);
    let listed = reader.nvml.compute_processes()?;
    let (window, shares) = utilization(reader).unzip();
    reader.process_window = Some(window);
    let share = |pid| shares.as_deref().map(|s| share_of(s, pid));
    for process in &listed {
        let share = share(process.pid);
        reader.process(Process {
            pid: process.pid,
            gpu_instance_id: process.gpu_instance_id,
            compute_instance_id: process.compute_instance_id,
            // NVML cannot always tell (no permission, some MIG setups): such a
            // process is still counted in nvidia_gpu_processes.
            memory_bytes: match process.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            },
            sm_ratio: share.map(|(ratio, _)| ratio),
            sm_seen_us: share.and_then(|(_, seen)| seen),
            listed: true,
        });
    }
    // A process that used the GPU in the window but is gone by now (or is
    // not a compute process) still has its share: without it the processes
    // would not add up to the GPU.
    for &(pid, ratio, seen) in shares.iter().flatten() {
        if !listed.iter().any(|p| p.pid == pid) {
            reader.process(Process {
                pid,
                sm_ratio: Some(ratio),
                sm_seen_us: Some(seen),
                ..Process::default()
            });
        }
    }
    window
}

/// The host step: each GPU's processes become samples, with their owners
/// from procfs.
pub(super) fn owners(run: &mut HostRun<'_>) -> Result<(), HostError> {
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

/// Each process's mean SM utilization over the window and NVML's time of
/// it, by pid: NVML's newest possible entry per pid (one over 100 % is
/// impossible and dropped).
fn ratios(mut entries: Vec<ProcessEntry>) -> Vec<(u32, f64, u64)> {
    entries.retain(|&(_, _, sm)| metrics::plausible_percent(sm as f64));
    entries.sort_unstable_by_key(|&(pid, ts, _)| (pid, std::cmp::Reverse(ts)));
    entries.dedup_by_key(|&mut (pid, _, _)| pid);
    let ratio = |(pid, ts, sm): ProcessEntry| (pid, metrics::ratio(sm as f64), ts);
    entries.into_iter().map(ratio).collect()
}

/// The share of `pid` and when NVML saw it; NVML lists only processes that
/// used the GPU in the window, so a process missing was idle (0).
fn share_of(ratios: &[(u32, f64, u64)], pid: u32) -> (f64, Option<u64>) {
    ratios
        .iter()
        .find(|&&(p, _, _)| p == pid)
        .map_or((0.0, None), |&(_, r, seen)| (r, Some(seen)))
}

/// The GPU engine's samples since the previous run, then the processes'
/// utilization over the same window; `None` when it covers no time.
fn utilization(reader: &mut Gpu<'_>) -> Option<(BusyWindow, Vec<(u32, f64, u64)>)> {
    let previous = reader.previous_carry(Stream::Processes);
    let (carry, integrated) = samples::read(&mut reader.nvml, Sampling::GpuUtilization, previous)?;
    if reader.keeps_totals() && carry != Carry::default() {
        reader.next_state().carries.insert(Stream::Processes, carry);
    }
    let integrated = integrated?;
    if integrated.intervals.iter().all(|i| i.claimed_us == 0) {
        return None;
    }
    let since = integrated.intervals.first()?.start_us;
    let before = previous.unwrap_or_default();
    let window = BusyWindow {
        busy_us: carry.busy_percent_us.saturating_sub(before.busy_percent_us) / 100,
        length_us: carry.sampled_us.saturating_sub(before.sampled_us),
    };
    Some((
        window,
        fetch_processes(&mut reader.nvml, since).map(ratios)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
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
            "systemd_unit=slurmstepd.scope",
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

    #[test]
    fn one_entry_per_process_is_its_mean_and_a_missing_pid_was_idle() {
        let ratios = ratios(vec![(7, 10, 40), (7, 20, 50), (9, 20, 101), (8, 5, 25)]);
        assert_eq!(share_of(&ratios, 7), (0.5, Some(20)));
        assert_eq!(share_of(&ratios, 8).0, 0.25);
        assert_eq!(share_of(&ratios, 9).0, 0.0);
        assert_eq!(share_of(&ratios, 6).0, 0.0);
    }
}
