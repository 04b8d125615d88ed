//! A GPU's compute processes and their shares of the window since the
//! previous run, listed once per run for the collectors that ask
//! (processes, tasks).

use nvml::calls::PROCESS_UTILIZATION;
use nvml::samples::ProcessEntry;
use nvml::types::{Sampling, UsedGpuMemory};

use crate::collector::Gpu;
use crate::metrics;
use crate::samples::{self, Carry, EarlyProcesses, Integrated};
use crate::snapshot::{BusyWindow, Process};
use crate::state::schema::Stream;

/// Lists the GPU's processes with their shares of the window since the
/// previous run, once per run whichever collectors ask (processes, tasks);
/// the window, where NVML gave shares over one.
pub fn list(gpu: &mut Gpu<'_>, shares_when_idle: bool) -> Option<BusyWindow> {
    match gpu.process_window {
        Some((window, complete)) if complete || !shares_when_idle => return window,
        _ => {}
    }
    gpu.process_window = Some((None, true));
    let listed = gpu.nvml.compute_processes()?;
    // The shares of processes that all left before this run cost a call
    // (about 3 ms) that a caller may not need.
    let fetch = !listed.is_empty() || shares_when_idle;
    let (window, shares) = utilization(gpu, fetch).unzip();
    gpu.process_window = Some((window, fetch));
    let share = |pid| shares.as_deref().map(|s| share_of(s, pid));
    for process in &listed {
        let share = share(process.pid);
        gpu.process(Process {
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
            gpu.process(Process {
                pid,
                sm_ratio: Some(ratio),
                sm_seen_us: Some(seen),
                ..Process::default()
            });
        }
    }
    window
}

/// The processes' means since the previous run and the GPU engine's
/// samples they split, read as the windows open (see `Hooks::early`), once
/// whichever collectors ask: [`list`] reads the rest at their end.
pub fn early(gpu: &mut Gpu<'_>) {
    if gpu.fetched.processes.is_some() {
        return;
    }
    let since = gpu
        .previous_carry(Stream::Processes)
        .map_or(0, |carry| carry.last_us);
    let split = gpu
        .fetched
        .early(&mut gpu.nvml, Sampling::GpuUtilization)
        .and_then(|samples| samples.last().map(|&(ts, _)| ts));
    let early = split.and_then(|split| {
        let entries = gpu.nvml.read(PROCESS_UTILIZATION, since)?;
        Some(EarlyProcesses { split, entries })
    });
    gpu.fetched.processes = Some(early);
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

/// The processes' shares over two windows that follow each other, weighted
/// by their lengths (µs): what one answer over both would have given.
fn combine(
    (first, first_us): (Vec<Share>, u64),
    (second, second_us): (Vec<Share>, u64),
) -> Vec<Share> {
    let total = (first_us + second_us).max(1) as f64;
    let mut pids: Vec<u32> = first
        .iter()
        .chain(&second)
        .map(|&(pid, _, _)| pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    let mean = |pid| {
        let ((a, seen_a), (b, seen_b)) = (share_of(&first, pid), share_of(&second, pid));
        let ratio = (a * first_us as f64 + b * second_us as f64) / total;
        (pid, ratio, seen_a.max(seen_b).unwrap_or_default())
    };
    pids.into_iter().map(mean).collect()
}

/// The GPU engine's samples since the previous run, then the processes'
/// utilization over the same window (read in two parts where they were read
/// early too); `None` when it covers no time. The window is consumed (its
/// carry kept for the next run) unless its shares, where wanted, failed: a
/// failed read leaves it (and the tasks its energy) to the next run.
fn utilization(gpu: &mut Gpu<'_>, fetch: bool) -> Option<(BusyWindow, Vec<Share>)> {
    let previous = gpu.previous_carry(Stream::Processes);
    let (carry, integrated) = samples::read(
        &mut gpu.nvml,
        &mut gpu.fetched,
        Sampling::GpuUtilization,
        previous,
    )?;
    let consume = |gpu: &mut Gpu<'_>| {
        if gpu.keeps_totals() && carry != Carry::default() {
            gpu.next_state().carries.insert(Stream::Processes, carry);
        }
    };
    let claimed = |i: &Integrated| i.intervals.iter().any(|i| i.claimed_us > 0);
    let Some(integrated) = integrated.filter(claimed) else {
        consume(gpu);
        return None;
    };
    let since = integrated.intervals.first()?.start_us;
    let before = previous.unwrap_or_default();
    let window = BusyWindow {
        busy_us: carry.busy_percent_us.saturating_sub(before.busy_percent_us) / 100,
        length_us: carry.sampled_us.saturating_sub(before.sampled_us),
        unread_us: integrated.unread_us,
    };
    let early = gpu.fetched.processes.take().flatten();
    let end = carry.last_us;
    let shares = match early {
        // Shares not wanted: the window is spent without them.
        _ if !fetch => Some(Some(Vec::new())),
        Some(EarlyProcesses { split, entries }) if since < split && split < end => {
            let joined = |later| combine((ratios(entries), split - since), (later, end - split));
            shares_since(gpu, split).map(|later| later.map(joined))
        }
        _ => shares_since(gpu, since),
    };
    let Some(shares) = shares else {
        // The read failed (counted): the window is left to the next run.
        gpu.fetched.shares_failed = true;
        return None;
    };
    // Where NVML keeps no means per process, the window is spent too.
    consume(gpu);
    shares.map(|shares| (window, shares))
}

/// The processes' means since `since`; `Some(None)` where NVML keeps none
/// (NOT_SUPPORTED), `None` where the read failed (counted) or the GPU is down.
fn shares_since(gpu: &mut Gpu<'_>, since: u64) -> Option<Option<Vec<Share>>> {
    let read = gpu
        .nvml
        .read_expecting(PROCESS_UTILIZATION, since, nvml::Error::is_unsupported)?;
    Some(read.ok().map(ratios))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_windows_weigh_their_shares_by_their_lengths() {
        // 8 s with pid 7 at 50 % and pid 9 at 10 %, then 2 s with pid 9
        // alone at 100 %: as one answer over 10 s would be.
        let first = vec![(7, 0.5, 100), (9, 0.1, 90)];
        let second = vec![(9, 1.0, 120)];
        let both = combine((first, 8_000_000), (second, 2_000_000));
        assert_eq!(both.len(), 2);
        assert_eq!((both[0].0, both[0].2), (7, 100));
        assert!((both[0].1 - 0.4).abs() < 1e-12);
        assert_eq!((both[1].0, both[1].2), (9, 120));
        assert!((both[1].1 - 0.28).abs() < 1e-12);
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
