//! Per-process GPU memory and SM utilization. Only the pid is known here;
//! `procfs` adds the owner.

use std::collections::HashMap;
use std::ffi::c_uint;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t;

use super::reader::DeviceReader;
use super::window;
use crate::metrics;
use crate::snapshot::Sample;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let Some(processes) = reader.compute_processes() else {
        return;
    };
    let utilization = utilization(reader);
    for process in processes {
        let mut labels = vec![("pid", process.pid.to_string())];
        if let Some(id) = process.gpu_instance_id {
            labels.push(("gpu_instance_id", id.to_string()));
        }
        if let Some(id) = process.compute_instance_id {
            labels.push(("compute_instance_id", id.to_string()));
        }
        let labelled = |family, value| {
            labels
                .iter()
                .fold(Sample::new(family, value), |sample, (name, value)| {
                    sample.with(name, value.clone())
                })
        };
        // NVML cannot always tell (no permission, some MIG setups): such a process
        // is still counted in nvidia_gpu_processes but has no memory reading.
        if let UsedGpuMemory::Used(bytes) = process.used_gpu_memory {
            reader.push(labelled(&metrics::PROCESS_MEMORY_USED, bytes as f64));
        }
        if let Some(ratio) = utilization.as_ref().and_then(|u| u.ratio(process.pid)) {
            reader.push(labelled(&metrics::PROCESS_UTILIZATION, ratio));
        }
    }
}

/// The state key of the per-process window: `last_us period_us`.
const KEY: &str = "boot.util.process";

/// One run's per-process samples.
#[derive(Debug, Default, PartialEq)]
struct Utilization {
    /// Busy percent × µs, by pid.
    busy: HashMap<u32, u64>,
    /// The time the window spans, µs; 0 when it cannot be told.
    window_us: u64,
    /// SM percent values and their count by pid, for a window of no length.
    plain: HashMap<u32, (u64, u64)>,
}

impl Utilization {
    /// The process's mean SM utilization over the window. NVML lists only
    /// processes that used the GPU in a sample period, so a process missing
    /// from a window of known length was idle (0).
    fn ratio(&self, pid: u32) -> Option<f64> {
        if self.window_us > 0 {
            let busy = self.busy.get(&pid).copied().unwrap_or(0);
            return Some((busy as f64 / self.window_us as f64 / 100.0).min(1.0));
        }
        let (sum, count) = self.plain.get(&pid).copied()?;
        Some(sum as f64 / count as f64 / 100.0)
    }
}

/// One entry as NVML gave it: pid, timestamp (µs), SM percent.
type Entry = (u32, u64, u64);

/// Integrates the entries since `last_us` (the previous run's last timestamp;
/// 0 for none). Each entry stands for one sample period (the smallest positive
/// difference between timestamps, or `period_us` from before); the window
/// runs from `last_us` (on a first run, one period before the oldest entry) to
/// the newest entry. Returns the utilization and the next `last_us period_us`.
fn integrate(entries: &[Entry], last_us: u64, period_us: u64) -> Option<(Utilization, u64, u64)> {
    let mut fresh: Vec<Entry> = entries
        .iter()
        .copied()
        .filter(|&(_, ts, sm)| ts > last_us && sm <= 100)
        .collect();
    // A process's entry repeated for one timestamp covers that period once.
    fresh.sort_unstable_by_key(|&(pid, ts, _)| (ts, pid));
    fresh.dedup_by_key(|&mut (pid, ts, _)| (ts, pid));
    let newest = fresh.iter().map(|&(_, ts, _)| ts).max()?;
    let mut stamps: Vec<u64> = fresh.iter().map(|&(_, ts, _)| ts).collect();
    stamps.sort_unstable();
    stamps.dedup();
    let period = stamps
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .min()
        .unwrap_or(period_us);
    let start = if last_us > 0 {
        last_us
    } else {
        stamps[0].saturating_sub(period)
    };
    let mut utilization = Utilization {
        window_us: if period > 0 { newest - start } else { 0 },
        ..Utilization::default()
    };
    for &(pid, _, sm) in &fresh {
        *utilization.busy.entry(pid).or_default() += sm * period;
        let plain = utilization.plain.entry(pid).or_default();
        plain.0 += sm;
        plain.1 += 1;
    }
    Some((utilization, newest, period))
}

/// Reads `nvmlDeviceGetProcessUtilization` since the previous run; `None`
/// when there is nothing new or it cannot be read.
fn utilization(reader: &mut DeviceReader<'_>) -> Option<Utilization> {
    let recalled: Vec<u64> = reader
        .recall(KEY)
        .map(|text| text.split(' ').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default();
    let (mut last_us, period_us) = match recalled[..] {
        [last, period] => (last, period),
        _ => (0, 0),
    };
    let call = "nvmlDeviceGetProcessUtilization";
    let entries = match reader.try_read_raw(call, |lib, handle| fetch(lib, handle, last_us))? {
        Ok(entries) => entries,
        Err(error) => {
            // Unsupported is logged at debug level only; others are counted.
            reader.note(call, &error);
            return None;
        }
    };
    let result = integrate(&entries, last_us, period_us);
    let (next_last, next_period) = match &result {
        Some((_, newest, period)) => (*newest, *period),
        None => {
            if window::clock_step(last_us, window::now_us()) {
                // Nothing is newer than a timestamp from before a clock step:
                // start afresh from the whole buffer next time.
                last_us = 0;
            }
            (last_us, period_us)
        }
    };
    if next_last > 0 {
        reader.remember(KEY, format!("{next_last} {next_period}"));
    }
    result.map(|(utilization, _, _)| utilization)
}

/// Room for the entries NVML returns (one per process per sample period);
/// more are asked for by size.
const ENTRY_BUFFER: usize = 1024;
/// More entries than any driver keeps.
const MAX_ENTRIES: c_uint = 1 << 16;

/// One `nvmlDeviceGetProcessUtilization` call; NOT_FOUND (nothing since
/// `last_seen`) is an empty answer.
fn fetch(
    lib: &nvml_wrapper_sys::bindings::NvmlLib,
    handle: nvml_wrapper_sys::bindings::nvmlDevice_t,
    last_seen: u64,
) -> Result<Vec<Entry>, NvmlError> {
    let call = nvml_sym(lib.nvmlDeviceGetProcessUtilization.as_ref())?;
    let mut capacity = ENTRY_BUFFER as c_uint;
    loop {
        // SAFETY: plain data; zero is a valid value.
        let mut buffer: Vec<nvmlProcessUtilizationSample_t> =
            vec![unsafe { std::mem::zeroed() }; capacity as usize];
        let mut count = capacity;
        // SAFETY: `count` is the buffer's length; NVML writes at most that many.
        let code = unsafe { call(handle, buffer.as_mut_ptr(), &mut count, last_seen) };
        match nvml_try(code) {
            Ok(()) => {
                buffer.truncate(count.min(capacity) as usize);
                return Ok(buffer
                    .iter()
                    .map(|e| (e.pid, e.timeStamp, u64::from(e.smUtil)))
                    .collect());
            }
            Err(NvmlError::NotFound) => return Ok(Vec::new()),
            Err(NvmlError::InsufficientSize(_)) if count > capacity && count <= MAX_ENTRIES => {
                capacity = count;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_share_the_window_and_absent_ones_were_idle() {
        // Samples every 100 µs from 1100 to 2000 after a run at 1000; pid 7 busy
        // 100 % in half of them, pid 8 50 % in all of them.
        let mut entries = Vec::new();
        for k in 1..=10u64 {
            let ts = 1000 + k * 100;
            if k % 2 == 0 {
                entries.push((7, ts, 100));
            }
            entries.push((8, ts, 50));
        }
        let (utilization, newest, period) = integrate(&entries, 1000, 0).unwrap();
        assert_eq!((newest, period), (2000, 100));
        assert_eq!(utilization.ratio(7), Some(0.5));
        assert_eq!(utilization.ratio(8), Some(0.5));
        assert_eq!(utilization.ratio(9), Some(0.0));
    }

    #[test]
    fn first_run_starts_one_period_before_the_oldest_entry() {
        let entries = [(7, 200, 100), (7, 300, 100), (7, 400, 0), (7, 500, 0)];
        let (utilization, _, _) = integrate(&entries, 0, 0).unwrap();
        assert_eq!(utilization.window_us, 400);
        assert_eq!(utilization.ratio(7), Some(0.5));
    }

    #[test]
    fn nothing_new_gives_nothing_and_a_lone_entry_is_its_own_mean() {
        assert_eq!(integrate(&[(7, 100, 60)], 100, 0), None);
        let (utilization, _, _) = integrate(&[(7, 200, 60)], 0, 0).unwrap();
        assert_eq!(utilization.ratio(7), Some(0.6));
        assert_eq!(utilization.ratio(8), None);
    }
}
