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
//! (With `--sequential` each GPU's reads and then its windows' close follow
//! the previous GPU's: reads 0, close 0, reads 1, close 1, ...)
//!
//! Invariants:
//! - a wait for the state's lock leaves half the time to reading
//!   ([`waiting_ends`]);
//! - [`publish_reserve`] is kept for rendering and publishing, whatever
//!   happens before: reading ends by `reading_ends`, storing the state by
//!   [`storing_ends`];
//! - the identities of the GPUs are awaited for at most [`identities_end`]
//!   (half the time to read); a GPU that has not answered by then is read no
//!   further (it timed out);
//! - a GPU's reads and its windows' close are expected to take what they took
//!   in the previous run ([`Estimate`]), and may run past that by half as
//!   much again, and by at least [`reads_reserve`] of the time left (see
//!   [`schedule`]): the GPM window is shortened so that they still end
//!   [`AFTER_WINDOW`] before `reading_ends`. A slow start of NVML, reads that
//!   grow from run to run, a slow second sample cost window length, never the
//!   run;
//! - a phase (reads, close) the deadline cut leaves all the time the run had
//!   ([`cut`]): the next run gives it all it can and measures it, so a phase
//!   that grew times out one run at most.

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
/// opened `now`: half of the time left to read. A GPU that has not answered
/// by then is not read further, so that the others keep the other half (and
/// their GPM window) for themselves; a GPU slow in its identity but
/// answering, and many GPUs read one after another, get the time they need
/// where the run has it. (A quarter did not leave 64 GPUs read one after
/// another at 55 ms each enough.)
pub fn identities_end(now: Instant, reading_ends: Instant) -> Instant {
    now + reading_ends.saturating_duration_since(now) / 2
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

/// Time added to the duration of a GPU's window close the state kept.
const CLOSING_MARGIN: Duration = Duration::from_millis(5);

/// The duration assumed for the close of a GPU's windows when the state kept
/// none (1-3 ms on an H200; [`AFTER_WINDOW`] covers more after the last one).
const CLOSING_FIRST: Duration = Duration::from_millis(5);

/// How long the phases of one GPU that follow its windows' opening are
/// expected to take: its reads, then the close of its windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// The reads.
    pub reads: Duration,
    /// The close of the windows, from their end: zero without windows.
    pub closing: Duration,
}

impl Estimate {
    /// What the previous run took (from the state: `reads`, and `closing`
    /// for the windows' close), or a first guess, each plus a margin; no
    /// closing without windows.
    pub fn new(reads: Option<Duration>, closing: Option<Duration>, windowed: bool) -> Estimate {
        Estimate {
            reads: reads.unwrap_or(READS_FIRST) + READS_MARGIN,
            closing: if windowed {
                closing.unwrap_or(CLOSING_FIRST) + CLOSING_MARGIN
            } else {
                Duration::ZERO
            },
        }
    }

    fn total(self) -> Duration {
        self.reads + self.closing
    }
}

/// What a phase of a GPU (its reads, or its windows' close) that the
/// deadline cut leaves as its duration, in a run whose NVML opened at
/// `opened` and whose reading ends at `reading_ends`: all the time the run
/// had to read. It took more than it had, by how much is unknown: so the next
/// run gives it all the time it can (its reads start at once, its windows
/// are as short as they may be), measures it, and plans from that, and one
/// timed-out run is the most a phase that grew costs. (Kept as what it had
/// run instead, the estimate grew by half a run at a time, and a close that
/// had not run at all was remembered as quick.)
pub fn cut(opened: Instant, reading_ends: Instant) -> Duration {
    reading_ends.saturating_duration_since(opened)
}

/// When the reads of a GPU (or of GPUs read one after another) start, and
/// by when each GPU's windows must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// When the reads start; `None`: at once (no window is open).
    pub reads_start: Option<Instant>,
    /// Per GPU, in the order given, the latest end of its windows: earlier
    /// ends are kept, later ones shortened to it.
    pub windows_end_by: Vec<Instant>,
}

/// The schedule of GPUs read one after another (one GPU on a thread of its
/// own), each GPU's reads then its windows' close, expected to take `gpus`,
/// over windows that end at `windows_end` (the earliest; `None`: no window),
/// for reading that ends at `reading_ends`, planned at `now`.
///
/// The first GPU's reads end as its windows do, each later GPU's windows end
/// as its reads do, and the whole may run past its estimate by half as much
/// again (at least [`reads_reserve`] of the time left) and still be done
/// [`AFTER_WINDOW`] before `reading_ends`: the windows are shortened to leave
/// that, though never under [`MIN_WINDOW`] from `now` while the time exists.
/// So a GPU whose windows closed is handed over before the next GPU's reads,
/// and one stuck in a call costs only itself and the GPUs after it. (The
/// estimate holds a margin of its own: 64 GPUs read one after another at
/// 50 ms each are expected to take 4.8 s, and 5.8 s at 90 ms each still fit.)
pub fn schedule(
    now: Instant,
    reading_ends: Instant,
    windows_end: Option<Instant>,
    gpus: &[Estimate],
) -> Schedule {
    let left = reading_ends.saturating_duration_since(now);
    let total: Duration = gpus.iter().map(|gpu| gpu.total()).sum();
    let overrun = (total / 2).max(reads_reserve(left));
    let done_by = reading_ends
        .checked_sub(AFTER_WINDOW + overrun)
        .unwrap_or(now);
    let latest_start = done_by.checked_sub(total).unwrap_or(now).max(now);
    let first_reads = gpus.first().map_or(Duration::ZERO, |gpu| gpu.reads);
    let start = windows_end.map_or(now, |ends| {
        ends.checked_sub(first_reads)
            .unwrap_or(now)
            .min(latest_start)
            .max(now)
    });
    let shortest = (now + MIN_WINDOW)
        .min(reading_ends.checked_sub(AFTER_WINDOW).unwrap_or(now))
        .max(now);
    let mut before = Duration::ZERO;
    let windows_end_by = gpus
        .iter()
        .map(|gpu| {
            let reads_end = before + gpu.reads;
            before += gpu.total();
            // What the GPUs after this one still need once its windows end.
            let after = total.saturating_sub(reads_end);
            let latest = done_by.checked_sub(after).unwrap_or(now).max(now);
            (start + reads_end).min(latest).max(shortest)
        })
        .collect();
    Schedule {
        reads_start: windows_end.map(|_| start),
        windows_end_by,
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
        let first = Estimate::new(None, None, true);
        // The unit's auto window from a start 1.5 s late (NVML without
        // persistence mode), a first run's estimate: shortened to leave 1 s.
        let plan = schedule(now, reading_ends, Some(now + 11_800 * MS), &[first]);
        assert_eq!(plan.reads_start, Some(now + 11_670 * MS));
        assert_eq!(plan.windows_end_by, [now + 11_790 * MS]);
        // 64 GPUs one after another, 50 ms each last run: reads of 90 ms
        // each (5.76 s) and their closes still end before the second
        // samples' reserve; each GPU's windows end as its reads do.
        let one = Estimate::new(Some(50 * MS), Some(MS), true);
        let gpus = [one; 64];
        let plan = schedule(now, reading_ends, Some(now + 11_800 * MS), &gpus);
        let start = plan.reads_start.unwrap();
        assert!(start + 64 * (90 + 1) * MS <= reading_ends - AFTER_WINDOW);
        assert_eq!(plan.windows_end_by[0], start + one.reads);
        assert_eq!(plan.windows_end_by[1], start + one.total() + one.reads);
        assert_eq!(
            *plan.windows_end_by.last().unwrap(),
            start + 64 * one.total() - one.closing
        );
        // Without a window the reads start at once; with too little time
        // left, the windows end as early as they may.
        assert_eq!(schedule(now, reading_ends, None, &gpus).reads_start, None);
        let late = schedule(now, now + 100 * MS, Some(now + 50 * MS), &gpus);
        assert!(late.windows_end_by.iter().all(|end| *end == now));
    }

    #[test]
    fn a_phase_the_deadline_cut_gets_all_the_time_the_next_run() {
        let now = Instant::now();
        let reading_ends = now + 2_400 * MS;
        let all = cut(now, reading_ends);
        // Cut reads: they start at once, the window ends early enough for
        // them to run all the time there is but the reserves.
        let plan = schedule(
            now,
            reading_ends,
            Some(now + 2_000 * MS),
            &[Estimate::new(Some(all), None, true)],
        );
        assert_eq!(plan.reads_start, Some(now));
        // A cut close: the window is as short as a window may be.
        let plan = schedule(
            now,
            reading_ends,
            Some(now + 2_000 * MS),
            &[Estimate::new(None, Some(all), true)],
        );
        assert_eq!(plan.reads_start, Some(now));
        assert_eq!(plan.windows_end_by, [now + MIN_WINDOW]);
        // A close measured at 600 ms is kept after the window, with half as
        // much again.
        let slow = Estimate::new(Some(MS), Some(600 * MS), true);
        let plan = schedule(now, reading_ends, Some(now + 2_000 * MS), &[slow]);
        let end = plan.windows_end_by[0];
        assert!(end + slow.closing * 3 / 2 <= reading_ends - AFTER_WINDOW);
        assert!(end >= now + MIN_WINDOW);
    }
}
