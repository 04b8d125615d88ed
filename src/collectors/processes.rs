//! Per-process GPU memory and SM utilization. Only the pid is known here;
//! `procfs` adds the owner after the GPUs were read (this collector's host step).

use nvml_wrapper::enums::device::UsedGpuMemory;

use super::hooks::HostRun;
use super::procfs::{self, Owner, Users};
use super::utilization::{previous_carry, Engine};
use crate::metrics;
use crate::nvml::reader::DeviceReader;
use crate::nvml::samples::{self, Carry, Outcome};
use crate::snapshot::LabelValue;
use crate::state::schema::Stream;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let Some(processes) = reader.compute_processes() else {
        return;
    };
    let utilization = utilization(reader);
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
            reader.push(metrics::PROCESS_MEMORY_USED.sample_some(labels.clone(), bytes as f64));
        }
        if let Some(ratio) = utilization.as_ref().and_then(|u| u.ratio(process.pid)) {
            reader.push(metrics::PROCESS_UTILIZATION.sample_some(labels.clone(), ratio));
        }
    }
}

/// The collector's host step: adds owner labels (comm, user, unit,
/// container, job) from procfs to the per-process samples of every GPU.
pub(super) fn owners(run: &mut HostRun<'_>) -> Result<(), String> {
    procfs::attribute(run.snapshot, run.procfs, &Users::new(run.until));
    Ok(())
}

/// One run's per-process samples.
#[derive(Debug, Default, PartialEq)]
struct Utilization {
    /// Busy percent × µs, by pid.
    busy: Vec<(u32, u64)>,
    /// The time the GPU's samples of the window cover, µs.
    sampled_us: u64,
}

impl Utilization {
    /// The process's mean SM utilization over the window; NVML lists only
    /// processes that used the GPU in a sample period, so a process missing
    /// from a window that covers time was idle (0). `None` when the window
    /// covers no time.
    fn ratio(&self, pid: u32) -> Option<f64> {
        if self.sampled_us == 0 {
            return None;
        }
        let busy = self
            .busy
            .iter()
            .find(|(p, _)| *p == pid)
            .map_or(0, |(_, busy)| *busy);
        Some((busy as f64 / self.sampled_us as f64 / 100.0).min(1.0))
    }
}

/// Reads the GPU engine's samples since the previous run, then
/// `nvmlDeviceGetProcessUtilization` over the time they cover, and integrates
/// each process over the GPU's intervals (`nvml::samples`); `None` when
/// nothing can be read. The process entries are fetched after the GPU's
/// samples and from the start of their window, so that an entry newer than
/// the GPU's newest sample counts in the next run, and after a clock step (the
/// GPU's whole buffer read again) the entries are too.
fn utilization(reader: &mut DeviceReader<'_>) -> Option<Utilization> {
    let previous = previous_carry(reader, Stream::Processes);
    let Outcome::Read { carry, window } =
        samples::read(reader, Engine::Gpu.sampling_type(), previous)
    else {
        return None;
    };
    if reader.keeps_totals() && carry != Carry::default() {
        reader.next_state().carries.insert(Stream::Processes, carry);
    }
    let window = window?;
    let since = window.intervals.first()?.start_us;
    let call = "nvmlDeviceGetProcessUtilization";
    let entries = match samples::fetch_processes(reader, since)? {
        Ok(entries) => entries,
        Err(error) => {
            // Unsupported is logged at debug level only; others are counted.
            reader.note(call, &error);
            return None;
        }
    };
    Some(Utilization {
        busy: samples::integrate_processes(&window.intervals, &entries),
        sampled_us: window.intervals.iter().map(|i| i.claimed_us).sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_pid_was_idle_and_no_window_gives_no_ratio() {
        let utilization = Utilization {
            busy: vec![(7, 50 * 1000)],
            sampled_us: 1000,
        };
        assert_eq!(utilization.ratio(7), Some(0.5));
        assert_eq!(utilization.ratio(8), Some(0.0));
        let empty = Utilization::default();
        assert_eq!(empty.ratio(7), None);
    }
}
