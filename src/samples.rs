//! NVML's utilization sample buffers, integrated into a [`Carry`]
//! (docs/design.md, "Utilization"). A run with a window open reads each
//! buffer when the window opens and again at its end ([`Fetched`]), so the
//! buffer has to hold only the time between runs.

use std::time::{SystemTime, UNIX_EPOCH};

use nvml::calls;
use nvml::samples::{Point, ProcessEntry};
use nvml::types::Sampling;
use nvml::DeviceReader;

use crate::metrics;

pub use crate::state::schema::Carry;

/// The time one consumed sample stands for; `claimed_us` is 0 for a dropped
/// or duplicate sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub start_us: u64,
    pub claimed_us: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Integrated {
    pub carry: Carry,
    /// Time-weighted mean of the consumed samples (0-1), the plain mean where
    /// they cover no time; `None` when nothing was consumed.
    pub ratio: Option<f64>,
    /// Sample values above 100 %, dropped.
    pub rejected: Vec<u64>,
    /// One per consumed sample.
    pub intervals: Vec<Interval>,
    /// Time before a sample that NVML's buffer no longer held when read
    /// (samples missed between runs), µs: counted nowhere.
    pub unread_us: u64,
}

/// How much longer than the period a gap between two samples may be and
/// still be one sample's interval (NVML's timer jitters by a few ms); a
/// longer gap lost samples, and its sample covers one period.
fn contiguous(gap: u64, period: u64) -> bool {
    gap <= period.saturating_add(period / 2)
}

/// The sample period: the median of the positive gaps between the
/// `samples`' timestamps (one odd gap cannot shrink it), else `known`.
fn period_of(samples: &[Point], known: u64) -> u64 {
    let mut gaps: Vec<u64> = samples
        .windows(2)
        .map(|pair| pair[1].0.saturating_sub(pair[0].0))
        .filter(|&gap| gap > 0)
        .collect();
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2).copied().unwrap_or(known)
}

/// `samples` in NVML's order. `anchored`: NVML returned only samples newer
/// than `carry.last_us`, so the first one follows it.
pub fn integrate(carry: Carry, samples: &[Point], anchored: bool) -> Integrated {
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
    let period = period_of(&fresh, carry.period_us);
    let mut previous = (anchored && !stepped && carry.last_us > 0).then_some(carry.last_us);
    let (mut busy, mut sampled, mut unread) = (0u64, 0u64, 0u64);
    let mut rejected = Vec::new();
    let mut intervals = Vec::with_capacity(fresh.len());
    let mut plain = (0u64, 0u64);
    for &(ts, value) in &fresh {
        let interval = match previous {
            Some(before) if ts >= before && contiguous(ts - before, period) => ts - before,
            Some(before) if ts >= before => {
                unread += ts - before - period;
                period
            }
            _ => period,
        };
        previous = Some(ts);
        let plausible = metrics::plausible_percent(value as f64);
        intervals.push(Interval {
            start_us: ts.saturating_sub(interval),
            claimed_us: if plausible { interval } else { 0 },
        });
        if plausible {
            busy += value * interval;
            sampled += interval;
            plain = (plain.0 + value, plain.1 + 1);
        } else {
            rejected.push(value);
        }
    }
    let ratio = match (sampled, plain.1) {
        (0, 0) => None,
        (0, count) => Some(plain.0 as f64 / (count as f64 * 100.0)),
        _ => Some(busy as f64 / (sampled as f64 * 100.0)),
    };
    Integrated {
        carry: Carry {
            last_us: fresh.last().map_or(carry.last_us, |&(ts, _)| ts),
            period_us: period,
            busy_percent_us: carry.busy_percent_us.saturating_add(busy),
            sampled_us: carry.sampled_us.saturating_add(sampled),
        },
        ratio,
        rejected,
        intervals,
        unread_us: unread,
    }
}

const CLOCK_STEP_SLACK_US: u64 = 1_000_000;

/// The system clock is behind the last consumed timestamp: NVML has nothing
/// newer until it catches up, so the whole buffer is read again.
pub fn clock_step(last_us: u64, now_us: u64) -> bool {
    last_us > 0 && now_us.saturating_add(CLOCK_STEP_SLACK_US) < last_us
}

/// As NVML stamps samples.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A run's answers of NVML's sample buffers. One fetch serves every later
/// read of the same buffer whose last sample is not older (the GPU engine's
/// is read for utilization and for the processes' window). A buffer read
/// early, as a window opened ([`Fetched::early`]), is read again once, at
/// the first read after, for the samples since: together they are what one
/// read would give from a buffer long enough to hold the whole window.
#[derive(Debug, Default)]
pub struct Fetched {
    answers: Vec<Answer>,
    /// `Some` once the processes' early read was taken (see `compute`): its
    /// answer, if any, taken once by the read.
    pub processes: Option<Option<EarlyProcesses>>,
    /// The processes' shares could not be read this run: their window is
    /// left to the next run.
    pub shares_failed: bool,
}

#[derive(Debug)]
struct Answer {
    sampling: Sampling,
    /// The `lastSeenTimeStamp` asked with.
    from: u64,
    samples: Vec<Point>,
    /// Read early: the samples since are still to be read.
    early: bool,
}

/// The processes' means since the previous run, read as the windows opened.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlyProcesses {
    /// The last GPU engine sample read with them: where the later read starts.
    pub split: u64,
    pub entries: Vec<ProcessEntry>,
}

impl Fetched {
    /// Reads `sampling`'s whole buffer now, once per run; the samples it
    /// answered, `None` where it failed or NVML keeps none (asked again at
    /// the read, which counts the error).
    pub fn early(&mut self, reader: &mut DeviceReader<'_>, sampling: Sampling) -> Option<&[Point]> {
        if !self.answers.iter().any(|a| a.sampling == sampling) {
            let samples = reader
                .read_expecting(calls::SAMPLES, (sampling, 0), |_| true)?
                .ok()?;
            self.answers.push(Answer {
                sampling,
                from: 0,
                samples,
                early: true,
            });
        }
        let answer = self.answers.iter().find(|a| a.sampling == sampling)?;
        Some(&answer.samples)
    }

    fn fetch(
        &mut self,
        reader: &mut DeviceReader<'_>,
        sampling: Sampling,
        last_seen: u64,
    ) -> Answered {
        let position = self
            .answers
            .iter()
            .position(|a| a.sampling == sampling && a.from <= last_seen);
        let Some(position) = position else {
            let answer = fetch(reader, sampling, last_seen);
            if let Some(Ok(samples)) = &answer {
                self.answers.push(Answer {
                    sampling,
                    from: last_seen,
                    samples: samples.clone(),
                    early: false,
                });
            }
            return answer;
        };
        let answer = &mut self.answers[position];
        if answer.early {
            let newest = answer.samples.last().map_or(0, |&(ts, _)| ts);
            match fetch(reader, sampling, newest.max(last_seen))? {
                Ok(later) => answer.samples.extend(later),
                Err(error) => return Some(Err(error)),
            }
            answer.early = false;
        }
        let newer = answer.samples.iter().filter(|&&(ts, _)| ts > last_seen);
        Some(Ok(newer.copied().collect()))
    }
}

/// A read of a sample buffer: `None` where it failed (counted), `Err` only
/// where NVML keeps no samples of it.
type Answered = Option<Result<Vec<Point>, nvml::Error>>;

/// Reads `sampling`'s buffer since `last_seen` ([`Answered`]).
fn fetch(reader: &mut DeviceReader<'_>, sampling: Sampling, last_seen: u64) -> Answered {
    reader.read_expecting(
        calls::SAMPLES,
        (sampling, last_seen),
        nvml::Error::is_unsupported,
    )
}

/// The carry that stands now, and what was integrated (`None` after a
/// counted error); `None` where NVML keeps no samples for this stream (MIG
/// mode, older GPUs).
pub fn read(
    reader: &mut DeviceReader<'_>,
    fetched: &mut Fetched,
    sampling: Sampling,
    previous: Option<Carry>,
) -> Option<(Carry, Option<Integrated>)> {
    let carry = previous.unwrap_or_default();
    let answer = match fetched.fetch(reader, sampling, carry.last_us) {
        Some(Err(_)) => return None,
        Some(Ok(samples)) if samples.is_empty() && clock_step(carry.last_us, now_us()) => {
            log::info!(
                "GPU {}: the clock is behind the last sample taken ({} µs); \
                 reading NVML's whole buffer again",
                reader.index(),
                carry.last_us
            );
            let (answer, now) = (fetch(reader, sampling, 0), now_us());
            let taken = |samples: Vec<Point>| samples.into_iter().filter(|&(ts, _)| ts <= now);
            answer.map(|answer| answer.map(|samples| (taken(samples).collect(), false)))
        }
        other => other.map(|answer| answer.map(|samples| (samples, true))),
    };
    let integrated = answer
        .and_then(Result::ok)
        .map(|(samples, anchored)| integrate(carry, &samples, anchored));
    if let Some((window, first)) = integrated
        .as_ref()
        .and_then(|w| Some((w, w.intervals.first()?)))
    {
        log::debug!(
            "GPU {}: {sampling:?} samples integrated from {} to {} µs ({} samples, {} µs unread)",
            reader.index(),
            first.start_us,
            window.carry.last_us,
            window.intervals.len(),
            window.unread_us
        );
    }
    let carry = integrated.as_ref().map_or(carry, |w| w.carry);
    Some((carry, integrated))
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
        // Of the 16 s from the last sample read to the buffer's first one,
        // that sample covers one period; the rest was not read.
        assert_eq!(next.unread_us, 16_000 * MS - 200 * MS);
    }

    #[test]
    fn jittered_samples_cover_the_whole_time_and_one_odd_gap_keeps_the_period() {
        // 200 ms apart, give or take 2 ms, and one gap of 192 ms (as an H200
        // answered): every sample claims its own gap, so the samples cover
        // exactly the time from the previous run's last one to the newest.
        let gaps = [198, 202, 200, 192, 201, 199, 208, 200];
        let mut ts = 1_000_000 * MS;
        let carry = Carry {
            last_us: ts,
            period_us: 200 * MS,
            ..Carry::default()
        };
        let samples: Vec<Point> = gaps
            .iter()
            .map(|gap| {
                ts += gap * MS;
                (ts, 100)
            })
            .collect();
        let window = integrate(carry, &samples, true);
        assert_eq!(window.carry.period_us, 200 * MS);
        assert_eq!(window.carry.sampled_us, ts - carry.last_us);
        assert_eq!(window.carry.busy_percent_us, (ts - carry.last_us) * 100);
        assert_eq!(window.unread_us, 0);
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
