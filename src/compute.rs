//! A GPU's compute processes and their shares of the window since the
//! previous run, listed once per run for the collectors that ask
//! (processes, tasks).

use nvml::samples::{fetch_processes, ProcessEntry};
use nvml::types::{Sampling, UsedGpuMemory};

use crate::collector::Gpu;
use crate::metrics;
use crate::samples::{self, Carry};
use crate::snapshot::{BusyWindow, Process};
use crate::state::schema::Stream;

/// Lists the GPU's processes with their shares of the window since the
/// previous run, once per run whichever collectors ask (processes, tasks);
/// the window, where NVML gave shares over one.
pub fn list(reader: &mut Gpu<'_>, shares_when_idle: bool) -> Option<BusyWindow> {
    if let Some((window, complete)) = reader.process_window {
        if complete || !shares_when_idle {
            return window;
        }
    }
    reader.process_window = Some((None, true));
    let listed = reader.nvml.compute_processes()?;
    // The shares of processes that all left before this run cost a call
    // (about 3 ms) that a caller may not need.
    let fetch = !listed.is_empty() || shares_when_idle;
    let (window, shares) = utilization(reader, fetch).unzip();
    reader.process_window = Some((window, fetch));
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

/// A pid's share of the window (0-1) and NVML's time of it (µs).
type Share = (u32, f64, u64);

/// Each process's mean SM utilization over the window and NVML's time of
/// it, by pid: NVML's newest possible entry per pid (one over 100 % is
/// impossible and dropped).
fn ratios(mut entries: Vec<ProcessEntry>) -> Vec<Share> {
    entries.retain(|&(_, _, sm)| metrics::plausible_percent(sm as f64));
    entries.sort_unstable_by_key(|&(pid, ts, _)| (pid, std::cmp::Reverse(ts)));
    entries.dedup_by_key(|&mut (pid, _, _)| pid);
    let ratio = |(pid, ts, sm): ProcessEntry| (pid, metrics::ratio(sm as f64), ts);
    entries.into_iter().map(ratio).collect()
}

/// The share of `pid` and when NVML saw it; NVML lists only processes that
/// used the GPU in the window, so a process missing was idle (0).
fn share_of(ratios: &[Share], pid: u32) -> (f64, Option<u64>) {
    ratios
        .iter()
        .find(|&&(p, _, _)| p == pid)
        .map_or((0.0, None), |&(_, r, seen)| (r, Some(seen)))
}

/// The GPU engine's samples since the previous run, then the processes'
/// utilization over the same window; `None` when it covers no time.
fn utilization(reader: &mut Gpu<'_>, fetch: bool) -> Option<(BusyWindow, Vec<Share>)> {
    let previous = reader.previous_carry(Stream::Processes);
    let (carry, integrated) = samples::read(
        &mut reader.nvml,
        &mut reader.fetched,
        Sampling::GpuUtilization,
        previous,
    )?;
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
    if !fetch {
        return Some((window, Vec::new()));
    }
    Some((
        window,
        fetch_processes(&mut reader.nvml, since).map(ratios)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_process_is_its_mean_and_a_missing_pid_was_idle() {
        let ratios = ratios(vec![(7, 10, 40), (7, 20, 50), (9, 20, 101), (8, 5, 25)]);
        assert_eq!(share_of(&ratios, 7), (0.5, Some(20)));
        assert_eq!(share_of(&ratios, 8).0, 0.25);
        assert_eq!(share_of(&ratios, 9).0, 0.0);
        assert_eq!(share_of(&ratios, 6).0, 0.0);
    }
}
