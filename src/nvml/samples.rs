//! NVML's sample buffers, the one home of their reading and integration:
//! engine utilization (`nvmlDeviceGetSamples`) and per-process utilization
//! (`nvmlDeviceGetProcessUtilization`) are fetched by one growing-buffer loop
//! ([`fetch`]) and integrated by one rule ([`integrate`]).
//!
//! `nvmlDeviceGetUtilizationRates` is a point reading of NVML's last sample
//! period, so a 15 s timer sees one sample in 75 and aliases any periodic load.
//! NVML also keeps a ring buffer of samples per engine (on an H200 with driver
//! 580: 71 samples 200 ms apart, 14.2 s); with `lastSeenTimeStamp` it returns
//! those newer than it, in the order they were taken, or `NVML_ERROR_NOT_FOUND`
//! when there are none. Each run reads the samples since the last one the
//! previous run consumed (the whole buffer on a first run) and keeps, in a
//! [`Carry`] in the state (`state::schema`): that timestamp, the sample period, and running
//! totals of busy and sampled time.
//!
//! The one integration rule (a sample is the average over the period that ends
//! at its timestamp):
//! - the period is the smallest positive gap between consecutive timestamps of
//!   the answer, taken before any sample is dropped (else the last one known);
//! - a sample's interval is the gap to the previous timestamp, capped by the
//!   period: time the buffer no longer covers (a timer period longer than the
//!   buffer, missed runs, a GPU reset) is not filled in, so `sampled` grows
//!   slower than wall time there; the first sample of a run follows the
//!   previous run's last timestamp, or (first run, clock step) claims one
//!   period; a duplicate timestamp covers nothing;
//! - a sample with an impossible value (above 100 %) is dropped and claims no
//!   time, but still ends the interval of the one before it;
//! - timestamps are CPU wall-clock µs: where they go backwards within one
//!   answer, the clock was stepped back, and only the samples after the last
//!   step are consumed; after a step back NVML has nothing newer than our last
//!   timestamp, so when the system clock is behind it, the whole buffer is read
//!   again and its samples up to now are taken ([`clock_step`]).
//!
//! Per-process utilization is NVML's own mean over the GPU's samples newer
//! than the `lastSeenTimeStamp` it is asked with, one entry per process
//! ([`fetch_processes`]): asked from the start of the GPU's window, it covers
//! the same window.
//!
//! The totals only grow: within a boot the state keeps them across GPU resets
//! and driver reloads; a lost or damaged state starts them at 0, which
//! Prometheus sees as a reset.

use std::ffi::c_uint;
use std::time::{SystemTime, UNIX_EPOCH};

use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper_sys::bindings::{
    nvmlProcessUtilizationSample_t, nvmlReturn_t, nvmlSample_t, nvmlValueType_t,
};

use super::reader::DeviceReader;
use crate::metrics;

pub use crate::state::schema::Carry;

/// The time one consumed sample stands for: `(start, end]` in µs, and how
/// much of it is claimed (0 for a dropped or duplicate sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub start_us: u64,
    pub end_us: u64,
    pub claimed_us: u64,
}

/// What one run's samples gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// The carry for the next run, totals included.
    pub carry: Carry,
    /// Time-weighted mean of the consumed samples (0-1); the plain mean where
    /// they cover no time (a single sample with no period known yet); `None`
    /// when nothing was consumed.
    pub ratio: Option<f64>,
    /// Sample values above 100 %, which were dropped.
    pub rejected: Vec<u64>,
    /// One per consumed sample, in order (per-process integration uses them).
    pub intervals: Vec<Interval>,
}

/// One sample as NVML returned it: timestamp (µs) and percent.
pub type Point = (u64, u64);

/// Integrates `samples` (in NVML's order) into `carry` by the module's one
/// rule. `anchored`: NVML returned only samples newer than `carry.last_us`, so
/// the first one follows it; false when the whole buffer was read again after
/// a clock step.
pub fn integrate(carry: Carry, samples: &[Point], anchored: bool) -> Window {
    // Samples before the last backward step belong to the old clock.
    let start = (1..samples.len())
        .rev()
        .find(|&i| samples[i].0 < samples[i - 1].0)
        .unwrap_or(0);
    let stepped = start > 0;
    let fresh: Vec<Point> = samples[start..]
        .iter()
        .copied()
        .filter(|&(ts, _)| stepped || !anchored || ts > carry.last_us)
        .collect();
    // The period comes from every fresh timestamp, dropped samples included.
    let period = fresh
        .windows(2)
        .map(|pair| pair[1].0.saturating_sub(pair[0].0))
        .filter(|&gap| gap > 0)
        .min()
        .unwrap_or(carry.period_us);
    let mut previous = (anchored && !stepped && carry.last_us > 0).then_some(carry.last_us);
    let (mut busy, mut sampled) = (0u64, 0u64);
    let mut rejected = Vec::new();
    let mut intervals = Vec::with_capacity(fresh.len());
    let mut plain = (0u64, 0u64);
    for &(ts, value) in &fresh {
        let interval = match previous {
            Some(before) if ts >= before => (ts - before).min(period),
            _ => period,
        };
        previous = Some(ts);
        if !metrics::plausible_percent(value as f64) {
            rejected.push(value);
            intervals.push(Interval {
                start_us: ts.saturating_sub(interval),
                end_us: ts,
                claimed_us: 0,
            });
            continue;
        }
        busy += value * interval;
        sampled += interval;
        plain = (plain.0 + value, plain.1 + 1);
        intervals.push(Interval {
            start_us: ts.saturating_sub(interval),
            end_us: ts,
            claimed_us: interval,
        });
    }
    let ratio = if sampled > 0 {
        Some(busy as f64 / sampled as f64 / 100.0)
    } else if plain.1 == 0 {
        None
    } else {
        Some(plain.0 as f64 / plain.1 as f64 / 100.0)
    };
    Window {
        carry: Carry {
            last_us: fresh.last().map_or(carry.last_us, |&(ts, _)| ts),
            period_us: period,
            busy_percent_us: carry.busy_percent_us.saturating_add(busy),
            sampled_us: carry.sampled_us.saturating_add(sampled),
        },
        ratio,
        rejected,
        intervals,
    }
}

/// One process's entry as NVML gave it: pid, timestamp (µs), SM percent.
pub type ProcessEntry = (u32, u64, u64);

/// How far behind our last timestamp the system clock must be before the
/// buffer is read again as after a clock step (NVML stamps samples shortly
/// before we read them; a second covers any skew between the two).
const CLOCK_STEP_SLACK_US: u64 = 1_000_000;

/// Whether the system clock (µs) is behind the last consumed timestamp: the
/// clock was stepped back, and NVML will have nothing newer than it until the
/// clock catches up.
pub fn clock_step(last_us: u64, now_us: u64) -> bool {
    last_us > 0 && now_us.saturating_add(CLOCK_STEP_SLACK_US) < last_us
}

/// The system clock in µs, as NVML stamps samples.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What reading a stream found.
pub enum Outcome {
    /// NVML keeps no samples for this stream (MIG mode, older GPUs): the
    /// caller falls back to a point reading.
    Unsupported,
    /// Read; `window` is `None` when nothing could be consumed (a counted
    /// error: the previous totals stand). `carry` is what stands now.
    Read {
        carry: Carry,
        window: Option<Window>,
    },
}

/// Reads the samples of `sampling` since `previous` (the stream's carry from
/// the previous run, `None` for none or damaged) and integrates them,
/// rereading the whole buffer after a clock step.
pub fn read(reader: &mut DeviceReader<'_>, sampling: Sampling, previous: Option<Carry>) -> Outcome {
    let carry = previous.unwrap_or_default();
    let answer = match fetch_samples(reader, sampling, carry.last_us) {
        None => None,
        Some(Err(error)) if super::unsupported(&error) => {
            reader.note("nvmlDeviceGetSamples", &error);
            return Outcome::Unsupported;
        }
        Some(Err(error)) => Some(Err(error)),
        Some(Ok(samples)) if samples.is_empty() && clock_step(carry.last_us, now_us()) => {
            log::info!(
                "GPU {}: the clock is behind the last sample taken ({} µs); \
                 reading NVML's whole buffer again",
                reader.index(),
                carry.last_us
            );
            fetch_samples(reader, sampling, 0).map(|answer| {
                answer.map(|samples| {
                    let now = now_us();
                    let taken: Vec<Point> =
                        samples.into_iter().filter(|&(ts, _)| ts <= now).collect();
                    (taken, false)
                })
            })
        }
        Some(Ok(samples)) => Some(Ok((samples, true))),
    };
    let window = match answer {
        None => None,
        Some(Err(error)) => {
            reader.note("nvmlDeviceGetSamples", &error);
            None
        }
        Some(Ok((samples, anchored))) => Some(integrate(carry, &samples, anchored)),
    };
    let carry = window.as_ref().map_or(carry, |w| w.carry);
    Outcome::Read { carry, window }
}

/// Room for more samples than NVML keeps (71 on an H200); a larger buffer is
/// asked for by size if NVML says it has more.
const INITIAL_CAPACITY: c_uint = 256;
/// More samples than any driver keeps: a larger count is not believed.
const MAX_CAPACITY: c_uint = 1 << 16;

/// The one sizing loop of the sample calls: calls `call` with a buffer and its
/// length, growing the buffer while NVML says it needs more (up to
/// [`MAX_CAPACITY`]); NOT_FOUND (nothing since `lastSeenTimeStamp`) is an empty
/// answer.
fn fetch<T: Clone>(
    zero: T,
    mut call: impl FnMut(*mut T, &mut c_uint) -> nvmlReturn_t,
) -> Result<Vec<T>, NvmlError> {
    let mut capacity = INITIAL_CAPACITY;
    loop {
        let mut buffer = vec![zero.clone(); capacity as usize];
        let mut count = capacity;
        match nvml_try(call(buffer.as_mut_ptr(), &mut count)) {
            Ok(()) => {
                buffer.truncate(count.min(capacity) as usize);
                return Ok(buffer);
            }
            Err(NvmlError::NotFound) => return Ok(Vec::new()),
            Err(NvmlError::InsufficientSize(_)) if count > capacity && count <= MAX_CAPACITY => {
                capacity = count;
            }
            Err(error) => return Err(error),
        }
    }
}

/// One `nvmlDeviceGetSamples` answer: the samples newer than `last_seen`, in
/// NVML's order. `None` when the GPU is already down.
fn fetch_samples(
    reader: &mut DeviceReader<'_>,
    sampling: Sampling,
    last_seen: u64,
) -> Option<Result<Vec<Point>, NvmlError>> {
    reader.try_read_raw("nvmlDeviceGetSamples", |lib, handle| {
        let call = nvml_sym(lib.nvmlDeviceGetSamples.as_ref())?;
        let mut value_type: nvmlValueType_t = 0;
        // SAFETY: nvmlSample_t is plain data; zero is a valid value.
        let zero: nvmlSample_t = unsafe { std::mem::zeroed() };
        let samples = fetch(zero, |buffer, count| {
            // SAFETY: `count` is the buffer's length; NVML writes at most that many.
            unsafe {
                call(
                    handle,
                    sampling.as_c(),
                    last_seen,
                    &mut value_type,
                    count,
                    buffer,
                )
            }
        })?;
        Ok(samples
            .iter()
            .map(|sample| (sample.timeStamp, percent(value_type, sample)))
            .collect())
    })
}

/// One `nvmlDeviceGetProcessUtilization` answer since `last_seen`. `None`
/// when the GPU is already down.
pub fn fetch_processes(
    reader: &mut DeviceReader<'_>,
    last_seen: u64,
) -> Option<Result<Vec<ProcessEntry>, NvmlError>> {
    reader.try_read_raw("nvmlDeviceGetProcessUtilization", |lib, handle| {
        let call = nvml_sym(lib.nvmlDeviceGetProcessUtilization.as_ref())?;
        // SAFETY: plain data; zero is a valid value.
        let zero: nvmlProcessUtilizationSample_t = unsafe { std::mem::zeroed() };
        let entries = fetch(zero, |buffer, count| {
            // SAFETY: `count` is the buffer's length; NVML writes at most that many.
            unsafe { call(handle, buffer, count, last_seen) }
        })?;
        Ok(entries
            .iter()
            .map(|e| (e.pid, e.timeStamp, u64::from(e.smUtil)))
            .collect())
    })
}

/// A sample's value in percent, whatever type NVML gave it (utilization
/// samples are unsigned ints; the others are converted, a negative or
/// non-finite value becomes an impossible one that is then rejected).
fn percent(value_type: nvmlValueType_t, sample: &nvmlSample_t) -> u64 {
    const IMPOSSIBLE: u64 = u64::MAX;
    // SAFETY: NVML says which member of the union it wrote.
    unsafe {
        match value_type {
            0 => {
                let value = sample.sampleValue.dVal;
                if value.is_finite() && value >= 0.0 {
                    value.round() as u64
                } else {
                    IMPOSSIBLE
                }
            }
            1 => u64::from(sample.sampleValue.uiVal),
            // `unsigned long` is 64 bits on the Linux targets NVML supports.
            #[allow(clippy::unnecessary_cast)]
            2 => sample.sampleValue.ulVal as u64,
            3 => sample.sampleValue.ullVal,
            4 => u64::try_from(sample.sampleValue.sllVal).unwrap_or(IMPOSSIBLE),
            5 => u64::try_from(sample.sampleValue.siVal).unwrap_or(IMPOSSIBLE),
            6 => u64::from(sample.sampleValue.usVal),
            _ => IMPOSSIBLE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;

    /// `n` samples 200 ms apart ending at `end`, alternating 5 busy / 5 idle.
    fn duty(end: u64, n: u64) -> Vec<Point> {
        (0..n)
            .map(|i| {
                let ts = end - (n - 1 - i) * 200 * MS;
                let k = ts / (200 * MS);
                (ts, if k % 10 < 5 { 100 } else { 0 })
            })
            .collect()
    }

    #[test]
    fn first_run_takes_the_whole_buffer_one_period_for_the_first_sample() {
        let window = integrate(Carry::default(), &duty(20_000 * MS, 70), true);
        assert_eq!(window.ratio, Some(0.5));
        assert_eq!(window.carry.sampled_us, 70 * 200 * MS);
        assert_eq!(window.carry.busy_percent_us, 35 * 200 * MS * 100);
        assert_eq!(window.carry.period_us, 200 * MS);
        assert_eq!(window.carry.last_us, 20_000 * MS);
    }

    #[test]
    fn later_runs_continue_from_the_last_timestamp() {
        let first = integrate(Carry::default(), &duty(20_000 * MS, 70), true);
        let next = integrate(first.carry, &duty(30_000 * MS, 50), true);
        assert_eq!(next.ratio, Some(0.5));
        assert_eq!(next.carry.sampled_us, 120 * 200 * MS);
        assert_eq!(next.carry.busy_percent_us * 2, next.carry.sampled_us * 100);
    }

    #[test]
    fn a_gap_is_not_filled_in() {
        let first = integrate(Carry::default(), &duty(20_000 * MS, 70), true);
        // 30 s later, but the buffer holds only 71 samples (14.2 s).
        let next = integrate(first.carry, &duty(50_000 * MS, 71), true);
        assert_eq!(
            next.carry.sampled_us - first.carry.sampled_us,
            71 * 200 * MS
        );
    }

    #[test]
    fn duplicates_cover_nothing_and_old_samples_are_not_counted_twice() {
        let carry = Carry {
            last_us: 1_000 * MS,
            period_us: 200 * MS,
            ..Carry::default()
        };
        let samples = [
            (1_000 * MS, 100), // already consumed
            (1_200 * MS, 100),
            (1_200 * MS, 100),
            (1_400 * MS, 0),
        ];
        let window = integrate(carry, &samples, true);
        assert_eq!(window.carry.sampled_us, 400 * MS);
        assert_eq!(window.ratio, Some(0.5));
    }

    #[test]
    fn only_samples_after_a_backward_step_are_taken() {
        let carry = Carry {
            last_us: 9_000 * MS,
            period_us: 200 * MS,
            ..Carry::default()
        };
        // Old clock up to 10 s, then stepped back to 5 s.
        let samples = [
            (9_800 * MS, 0),
            (10_000 * MS, 0),
            (5_000 * MS, 100),
            (5_200 * MS, 100),
        ];
        let window = integrate(carry, &samples, true);
        assert_eq!(window.carry.sampled_us, 400 * MS);
        assert_eq!(window.ratio, Some(1.0));
        assert_eq!(window.carry.last_us, 5_200 * MS);
    }

    #[test]
    fn nothing_new_keeps_the_totals_and_gives_no_ratio() {
        let carry = Carry {
            last_us: 5,
            period_us: 2,
            busy_percent_us: 300,
            sampled_us: 6,
        };
        let window = integrate(carry, &[], true);
        assert_eq!(window.carry, carry);
        assert_eq!(window.ratio, None);
    }

    #[test]
    fn one_sample_without_a_period_is_a_plain_mean_and_impossible_values_are_dropped() {
        let window = integrate(Carry::default(), &[(7, 40), (8, 250)], true);
        assert_eq!(window.rejected, vec![250]);
        assert_eq!(window.ratio, Some(0.4));
        // The period (1 µs) comes from both timestamps; the dropped sample
        // claims none of it.
        assert_eq!(window.carry.sampled_us, 1);
        let lone = integrate(Carry::default(), &[(7, 40)], true);
        assert_eq!((lone.ratio, lone.carry.sampled_us), (Some(0.4), 0));
    }

    #[test]
    fn impossible_samples_claim_no_time_and_leave_the_period_alone() {
        // A full 71-sample buffer (14.2 s) alternating 0 % and an impossible
        // 101 %: the period stays 200 ms and a first run claims the 36 good
        // samples' 7.2 s, never more than the buffer.
        let buffer: Vec<Point> = (0..71u64)
            .map(|k| {
                (
                    10_000_000 + k * 200 * MS,
                    if k.is_multiple_of(2) { 0 } else { 101 },
                )
            })
            .collect();
        let window = integrate(Carry::default(), &buffer, true);
        assert_eq!(window.carry.period_us, 200 * MS);
        assert_eq!(window.carry.sampled_us, 36 * 200 * MS);
        assert_eq!(window.rejected.len(), 35);
        assert_eq!(window.ratio, Some(0.0));
        let claimed: u64 = window.intervals.iter().map(|i| i.claimed_us).sum();
        assert_eq!(claimed, window.carry.sampled_us);
    }

    #[test]
    fn a_clock_behind_the_last_timestamp_is_a_step() {
        assert!(!clock_step(0, 5));
        assert!(!clock_step(10_000_000, 10_000_000));
        assert!(!clock_step(10_500_000, 10_000_000));
        assert!(clock_step(12_000_000, 10_000_000));
    }
}
