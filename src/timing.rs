//! The run's timing policy, in one place: how `--timeout` is split between
//! reading and publishing, how long the GPUs' identities may take, how long
//! the GPM window is, and when each GPU's reads start.
//!
//! A run, from its start to `--timeout`:
//!
//! ```text
//! lock, NVML init | identities | windows open ... reads | 2nd samples | publish
//!                                                       ^ reading_ends ^ end
//! ```
//!
//! Invariants:
//! - a wait for the state's lock leaves half the time to reading
//!   ([`waiting_ends`]);
//! - [`publish_reserve`] is kept for rendering and publishing, whatever
//!   happens before: reading ends by `reading_ends`, storing the state by
//!   [`storing_ends`];
//! - the identities of the GPUs are awaited for at most [`identities_end`]; a
//!   GPU that has not answered by then is read no further (it timed out);
//! - a GPU's reads may run past what they are expected to take by half as
//!   much again, and by at least [`reads_reserve`] of the time left (see
//!   [`schedule`]): the GPM window is shortened so that they still end before
//!   its second sample is due. A slow start of NVML or reads that grow from
//!   run to run cost window length, never the run;
//! - a GPU whose reads the deadline cut leaves how long they had run by then
//!   ([`cut_reads`]), so the next run starts them early enough.

use std::time::{Duration, Instant};

/// How long after the deadline the hard stop ends a run that is still blocked.
pub const HARD_STOP_GRACE: Duration = Duration::from_millis(250);

/// The most a run keeps back from its timeout for rendering and publishing.
const MAX_PUBLISH_RESERVE: Duration = Duration::from_secs(1);

/// What a run with `timeout` keeps back for rendering and publishing: a fifth
/// of it, at most [`MAX_PUBLISH_RESERVE`].
pub fn publish_reserve(timeout: Duration) -> Duration {
    (timeout / 5).min(MAX_PUBLISH_RESERVE)
}

/// When storing the state gives up, for a run reading until `reading_ends`
/// with `timeout`: half of the publish reserve after it, so that a state
/// directory that does not answer (a frozen file system) still leaves the
/// other half to publish the file.
pub fn storing_ends(reading_ends: Instant, timeout: Duration) -> Instant {
    reading_ends + publish_reserve(timeout) / 2
}

/// When a wait that starts `now` before reading (the state's lock) gives up:
/// half of what is left until `reading_ends`, so that the reading keeps the
/// other half.
pub fn waiting_ends(now: Instant, reading_ends: Instant) -> Instant {
    now + reading_ends.saturating_duration_since(now) / 2
}

/// How long past `reading_ends` the watchdog waits for the GPUs' readings
/// once NVML is open (they are handed over at `reading_ends` at the latest,
/// by a thread that makes no NVML call then): a quarter of the publish
/// reserve, at most 50 ms.
pub fn handoff(timeout: Duration) -> Duration {
    (publish_reserve(timeout) / 4).min(Duration::from_millis(50))
}

/// When the GPUs' identities must have been read, for a run whose NVML
/// opened `now`: a quarter of the time left to read. A GPU that has not
/// answered by then is not read further, so that the others keep most of the
/// time (and the GPM window) for themselves.
pub fn identities_end(now: Instant, reading_ends: Instant) -> Instant {
    now + reading_ends.saturating_duration_since(now) / 4
}

/// The shortest GPM window: on an H200 a 50 ms window read all zeros, 1 s
/// windows read right.
pub const MIN_WINDOW: Duration = Duration::from_millis(100);

/// The time kept after the GPM window for the second sample and the metrics
/// (0.05-0.7 ms and 1-3 ms a GPU on an H200), before reading must end.
pub const AFTER_WINDOW: Duration = Duration::from_millis(200);

/// The `--gpm-window` a user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowRequest {
    /// `auto`: the longest window the run's time to read leaves.
    Longest,
    /// A duration; zero turns GPM off.
    Exactly(Duration),
}

impl std::str::FromStr for WindowRequest {
    type Err = WindowError;

    fn from_str(text: &str) -> Result<Self, WindowError> {
        if text == "auto" {
            return Ok(WindowRequest::Longest);
        }
        let window = humantime::parse_duration(text).map_err(WindowError::Unreadable)?;
        if !window.is_zero() && window < MIN_WINDOW {
            return Err(WindowError::TooShort);
        }
        Ok(WindowRequest::Exactly(window))
    }
}

/// Why a `--gpm-window` cannot be used.
#[derive(Debug, PartialEq)]
pub enum WindowError {
    /// Neither `auto` nor a duration.
    Unreadable(humantime::DurationError),
    /// Neither 0 nor at least [`MIN_WINDOW`].
    TooShort,
    /// `window` and the second sample do not fit in `reading`, the time a run
    /// may read.
    DoesNotFit { window: Duration, reading: Duration },
}

impl std::fmt::Display for WindowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = humantime::format_duration;
        match self {
            WindowError::Unreadable(error) => error.fmt(f),
            WindowError::TooShort => write!(
                f,
                "must be auto, 0 (off) or at least {}: shorter windows read zeros",
                format(MIN_WINDOW)
            ),
            WindowError::DoesNotFit { window, reading } => write!(
                f,
                "--gpm-window {} does not fit in the time a run may read ({}): the second GPM \
                 sample needs {} after the window; use a longer --timeout, a shorter \
                 --gpm-window or --gpm-window auto",
                format(*window),
                format(*reading),
                format(AFTER_WINDOW),
            ),
        }
    }
}

/// The GPM window a run asks for: what was asked for (a duration must fit in
/// `reading`, the time a run may read for, with the time the second sample
/// needs; `auto` takes all of it but that and [`reads_reserve`]), or else
/// `default` shortened to what `reading` leaves after both; zero (GPM off)
/// when that is under [`MIN_WINDOW`]. [`schedule`] may shorten it further.
pub fn gpm_window(
    given: Option<WindowRequest>,
    default: Duration,
    reading: Duration,
) -> Result<Duration, WindowError> {
    let fits = reading.saturating_sub(AFTER_WINDOW);
    // A window the exporter chooses also leaves the other reads room to run
    // past its end.
    let chosen = fits.saturating_sub(reads_reserve(reading));
    let at_least_min = |window: Duration| {
        if window < MIN_WINDOW {
            Duration::ZERO
        } else {
            window
        }
    };
    match given {
        Some(WindowRequest::Exactly(window)) if window > fits => {
            Err(WindowError::DoesNotFit { window, reading })
        }
        Some(WindowRequest::Exactly(window)) => Ok(window),
        Some(WindowRequest::Longest) => Ok(at_least_min(chosen)),
        None => Ok(at_least_min(default.min(chosen))),
    }
}

/// The time kept for reads that run past their estimate, out of `reading`:
/// a tenth of it, at most 1 s. On an H200 the reads of one GPU take about
/// 50 ms.
fn reads_reserve(reading: Duration) -> Duration {
    (reading / 10).min(Duration::from_secs(1))
}

/// Time added to the duration of a GPU's reads the state kept.
const READS_MARGIN: Duration = Duration::from_millis(20);

/// The duration assumed for a GPU's reads when the state kept none (a cold run
/// on an H200 takes about 50 ms).
const READS_FIRST: Duration = Duration::from_millis(100);

/// How long a GPU's reads are expected to take: what they took in the
/// previous run (`previous`, from the state), or a first guess, plus a margin.
pub fn reads_estimate(previous: Option<Duration>) -> Duration {
    previous.unwrap_or(READS_FIRST) + READS_MARGIN
}

/// What a GPU whose reads started at `started` and were cut by the deadline
/// at `reading_ends` leaves as their duration: the time they had run (they
/// take at least that long).
pub fn cut_reads(started: Instant, reading_ends: Instant) -> Duration {
    reading_ends.saturating_duration_since(started)
}

/// When the reads of a GPU (or of GPUs read one after another) start, and
/// by when its windows must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// When the reads start; `None`: at once.
    pub reads_start: Option<Instant>,
    /// The latest end of the windows: earlier ends are kept, later ones
    /// shortened to it.
    pub windows_end_by: Instant,
}

/// The schedule of reads expected to take `estimate`, over windows that end
/// at `windows_end` (`None`: no window), for reading that ends at
/// `reading_ends`, planned at `now`.
///
/// The reads end as the windows do, and may run past their estimate by half
/// as much again (at least [`reads_reserve`] of the time left) and still be
/// done before the second samples are due ([`AFTER_WINDOW`] before
/// `reading_ends`): the windows are shortened to leave that. (The estimate
/// holds a margin of its own: 64 GPUs read one after another at 50 ms each
/// are expected to take 4.48 s, and 5.76 s at 90 ms each still fit.)
pub fn schedule(
    now: Instant,
    reading_ends: Instant,
    windows_end: Option<Instant>,
    estimate: Duration,
) -> Schedule {
    let left = reading_ends.saturating_duration_since(now);
    let overrun = (estimate / 2).max(reads_reserve(left));
    let latest = reading_ends
        .checked_sub(AFTER_WINDOW + overrun)
        .unwrap_or(now)
        .max(now);
    let reads_start = windows_end.map(|ends| {
        let ends = ends.min(latest);
        ends.checked_sub(estimate).unwrap_or(ends)
    });
    Schedule {
        reads_start,
        windows_end_by: latest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn reading_leaves_a_fifth_of_the_timeout_at_most_a_second_to_publish() {
        assert_eq!(publish_reserve(Duration::from_secs(2)), 400 * MS);
        assert_eq!(
            publish_reserve(Duration::from_secs(30)),
            MAX_PUBLISH_RESERVE
        );
    }

    #[test]
    fn reads_end_before_the_second_samples_however_late_the_start() {
        let now = Instant::now();
        let reading_ends = now + 13_000 * MS;
        // The unit's auto window from a start 1.5 s late (NVML without
        // persistence mode), a first run's estimate: shortened to leave 1 s.
        let plan = schedule(
            now,
            reading_ends,
            Some(now + 11_800 * MS),
            reads_estimate(None),
        );
        assert_eq!(plan.windows_end_by, now + 11_800 * MS);
        assert_eq!(plan.reads_start, Some(now + 11_680 * MS));
        // 64 GPUs one after another, 50 ms each last run: reads of 90 ms
        // each (5.76 s) still end before the second samples.
        let estimate = 64 * reads_estimate(Some(50 * MS));
        let plan = schedule(now, reading_ends, Some(now + 11_800 * MS), estimate);
        let start = plan.reads_start.unwrap();
        assert!(start + 64 * 90 * MS <= reading_ends - AFTER_WINDOW);
        assert_eq!(plan.windows_end_by, now + 10_560 * MS);
        assert_eq!(plan.windows_end_by, start + estimate);
        // Without a window the reads start at once; with too little time
        // left, the windows end now.
        assert_eq!(
            schedule(now, reading_ends, None, estimate).reads_start,
            None
        );
        let late = schedule(now, now + 100 * MS, Some(now + 50 * MS), estimate);
        assert_eq!(late.windows_end_by, now);
    }
}
