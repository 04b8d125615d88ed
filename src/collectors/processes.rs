//! Per-process GPU memory and SM utilization; the host step adds the owners
//! from procfs.

use nvml::samples::{fetch_processes, ProcessEntry};
use nvml::types::{Sampling, UsedGpuMemory};

use crate::collector::{Gpu, HostError, HostRun};
use crate::metrics::{self, families};
use crate::procfs::{self, Owner, Users};
use crate::samples::{self, Carry, SampleRead};
use crate::snapshot::LabelValue;
use crate::state::schema::Stream;

families! {
    FAMILIES;
    PROCESS_MEMORY_USED: Gauge(Bytes), "nvidia_gpu_process_memory_used_bytes", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Device memory used by a compute process, with its owner (only with --collector processes).";
    PROCESS_UTILIZATION: Gauge(Ratio), "nvidia_gpu_process_utilization_ratio", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Fraction of the GPU's sample periods since the previous run in which a compute process's kernels ran, NVML's one mean per process (0-1; the processes of a GPU add up to its utilization), with its owner (only with --collector processes).";
}

pub(super) fn read(reader: &mut Gpu<'_>) {
    let Some(processes) = reader.nvml.compute_processes() else {
        return;
    };
    let utilization = utilization(reader);
    let listed: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    for process in processes {
        let id = |id: Option<u32>| id.map(|id| LabelValue::Owned(id.to_string()));
        let ids = [
            Some(process.pid),
            process.gpu_instance_id,
            process.compute_instance_id,
        ]
        .map(id);
        // The owner is not known yet: `owners` adds it.
        let labels = procfs::labels(ids, &Owner::default());
        // NVML cannot always tell (no permission, some MIG setups): such a process
        // is still counted in nvidia_gpu_processes but has no memory reading.
        if let UsedGpuMemory::Used(bytes) = process.used_gpu_memory {
            reader.push(PROCESS_MEMORY_USED.sample_some(labels.clone(), bytes as f64));
        }
        if let Some(utilization) = &utilization {
            let ratio = utilization.ratio(process.pid);
            reader.push(PROCESS_UTILIZATION.sample_some(labels.clone(), ratio));
        }
    }
    // A process that used the GPU in the window but is gone by now (or is
    // not a compute process) still has its share: without it the processes
    // would not add up to the GPU.
    for (pid, ratio) in utilization.iter().flat_map(Utilization::ratios) {
        if !listed.contains(&pid) {
            let labels = procfs::labels(
                [Some(LabelValue::Owned(pid.to_string())), None, None],
                &Owner::default(),
            );
            reader.push(PROCESS_UTILIZATION.sample_some(labels, ratio));
        }
    }
}

/// The host step: owner labels from procfs on every per-process sample.
pub(super) fn owners(run: &mut HostRun<'_>) -> Result<(), HostError> {
    let per_process = [PROCESS_MEMORY_USED, PROCESS_UTILIZATION];
    procfs::attribute(
        run.snapshot,
        &per_process,
        run.procfs,
        &Users::new(run.until),
    );
    Ok(())
}

/// One run's per-process SM utilization: each process's mean SM percent
/// over the GPU samples since the window's start.
#[derive(Debug, Default, PartialEq)]
struct Utilization {
    /// Mean SM percent by pid; a pid listed twice keeps its newest entry.
    percent: Vec<(u32, u64)>,
}

impl Utilization {
    /// From NVML's entries: the newest possible one per pid (an entry over
    /// 100 % is impossible and dropped).
    fn from_entries(mut entries: Vec<ProcessEntry>) -> Self {
        entries.retain(|&(_, _, sm)| metrics::plausible_percent(sm as f64));
        entries.sort_unstable_by_key(|&(pid, ts, _)| (pid, std::cmp::Reverse(ts)));
        entries.dedup_by_key(|&mut (pid, _, _)| pid);
        Utilization {
            percent: entries.into_iter().map(|(pid, _, sm)| (pid, sm)).collect(),
        }
    }

    /// Every listed process's ratio, by pid.
    fn ratios(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        self.percent
            .iter()
            .map(|&(pid, sm)| (pid, metrics::ratio(sm as f64)))
    }

    /// The process's mean SM utilization over the window; NVML lists only
    /// processes that used the GPU in it, so a process missing was idle (0).
    fn ratio(&self, pid: u32) -> f64 {
        self.ratios()
            .find(|&(p, _)| p == pid)
            .map_or(0.0, |(_, r)| r)
    }
}

/// The GPU engine's samples since the previous run, then the processes'
/// utilization over the same window; `None` when it covers no time.
fn utilization(reader: &mut Gpu<'_>) -> Option<Utilization> {
    let previous = reader.previous_carry(Stream::Processes);
    let SampleRead::Read { carry, integrated } =
        samples::read(&mut reader.nvml, Sampling::GpuUtilization, previous)
    else {
        return None;
    };
    if reader.keeps_totals() && carry != Carry::default() {
        reader.next_state().carries.insert(Stream::Processes, carry);
    }
    let integrated = integrated?;
    if integrated.intervals.iter().all(|i| i.claimed_us == 0) {
        return None;
    }
    let since = integrated.intervals.first()?.start_us;
    fetch_processes(&mut reader.nvml, since).map(Utilization::from_entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_process_is_its_mean_and_a_missing_pid_was_idle() {
        let utilization =
            Utilization::from_entries(vec![(7, 10, 40), (7, 20, 50), (9, 20, 101), (8, 5, 25)]);
        assert_eq!(utilization.ratio(7), 0.5);
        assert_eq!(utilization.ratio(8), 0.25);
        assert_eq!(utilization.ratio(9), 0.0);
        assert_eq!(utilization.ratio(6), 0.0);
    }
}
