//! The run's timing policy, in one place (docs/design.md, "Timing"): how
//! `--timeout` splits between the GPUs, the host steps and publishing, how
//! long identities may take, the GPM window, and when each GPU's reads start.
//!
//! ```text
//! lock, NVML init | identities | windows open ... reads | 2nd samples | host steps | publish
//!                                                       ^ gpus_end    ^ reading_ends ^ end
//! ```
//!
//! A GPU that hangs takes at most the time up to `gpus_end`: the host steps
//! (the kernel log's XIDs, the tasks) keep a slot of their own after it.

use std::time::{Duration, Instant};

use humantime::format_duration;

/// The longest `--timeout` (and `--gpm-window`): well within a long timer period.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// How long after the deadline the hard stop ends a run that is still blocked.
pub const HARD_STOP_GRACE: Duration = Duration::from_millis(250);

/// What a run keeps back from `timeout` to render and publish: a fifth, at most 1 s.
pub fn publish_reserve(timeout: Duration) -> Duration {
    (timeout / 5).min(Duration::from_secs(1))
}

/// The time a run with `timeout` may wait and read: all but the publish reserve.
pub fn reading_time(timeout: Duration) -> Duration {
    timeout - publish_reserve(timeout)
}

/// What the reading time keeps back for the host steps, which a hung GPU
/// cannot take: a tenth of it, at most 500 ms.
pub fn host_reserve(timeout: Duration) -> Duration {
    (reading_time(timeout) / 10).min(Duration::from_millis(500))
}

/// The time a run with `timeout` may wait and read the GPUs: the reading
/// time less the host steps' reserve.
pub fn gpus_time(timeout: Duration) -> Duration {
    reading_time(timeout) - host_reserve(timeout)
}

/// A run's time, computed once from `--timeout` when it starts: its named
/// instants, in the order they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub started: Instant,
    pub timeout: Duration,
    /// The GPUs are read (their windows, reads and closes) by then.
    pub gpus_end: Instant,
    /// The host steps end, and with them reading.
    pub host_end: Instant,
    /// Storing the state gives up.
    pub storing_end: Instant,
    /// The file is published.
    pub end: Instant,
    /// A run still blocked is ended ([`HARD_STOP_GRACE`] past `end`).
    pub hard_stop: Instant,
}

impl Budget {
    pub fn new(started: Instant, timeout: Duration) -> Budget {
        let host_end = started + reading_time(timeout);
        Budget {
            started,
            timeout,
            gpus_end: started + gpus_time(timeout),
            host_end,
            storing_end: host_end + publish_reserve(timeout) / 2,
            end: started + timeout,
            hard_stop: started + timeout + HARD_STOP_GRACE,
        }
    }

    /// When a wait that starts now before the GPUs are read gives up (the
    /// locks), and when the GPUs' identities must be read.
    pub fn halfway(&self, now: Instant) -> Instant {
        now + self.gpus_end.saturating_duration_since(now) / 2
    }

    /// How long past `gpus_end` the watchdog waits for the GPUs once NVML is
    /// open: a quarter of the publish reserve, at most 50 ms; the GPUs'
    /// readings are handed over by then.
    pub fn handoff(&self) -> Instant {
        self.gpus_end + (publish_reserve(self.timeout) / 4).min(Duration::from_millis(50))
    }
}

/// The shortest GPM window: on an H200 a 50 ms window read all zeros.
pub const MIN_WINDOW: Duration = Duration::from_millis(100);

/// The GPM window when `--gpm-window` is not given (shortened to fit).
const DEFAULT_WINDOW: Duration = Duration::from_secs(1);

/// The time kept after the GPM window for the second sample and the metrics.
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
        match humantime::parse_duration(text).map_err(WindowError::Unreadable)? {
            window if !window.is_zero() && window < MIN_WINDOW => Err(WindowError::TooShort),
            // No run holds a window longer than the longest timeout, GPM on or off.
            window if window > MAX_TIMEOUT => Err(WindowError::TooLong),
            window => Ok(WindowRequest::Exactly(window)),
        }
    }
}

/// Why a `--gpm-window` cannot be used.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum WindowError {
    #[error(transparent)]
    Unreadable(humantime::DurationError),
    #[error(
        "must be auto, 0 (off) or at least {}: shorter windows read zeros",
        format_duration(MIN_WINDOW)
    )]
    TooShort,
    #[error(
        "must be at most {}: the window must fit in --timeout",
        format_duration(MAX_TIMEOUT)
    )]
    TooLong,
    #[error(
        "--gpm-window {} does not fit in the time a run may read ({}): the second GPM \
         sample needs {} after the window; use a longer --timeout, a shorter \
         --gpm-window or --gpm-window auto",
        format_duration(*.window),
        format_duration(*.reading),
        format_duration(AFTER_WINDOW)
    )]
    DoesNotFit { window: Duration, reading: Duration },
}

/// The GPM window a run with `timeout` asks for: a given duration if it fits
/// with [`AFTER_WINDOW`]; else what `auto` (or the default) leaves after that
/// and [`reads_reserve`], zero under [`MIN_WINDOW`]. [`schedule`] may shorten it.
pub fn gpm_window(
    given: Option<WindowRequest>,
    timeout: Duration,
) -> Result<Duration, WindowError> {
    let reading = gpus_time(timeout);
    let fits = reading.saturating_sub(AFTER_WINDOW);
    let chosen = fits.saturating_sub(reads_reserve(reading));
    let window = match given {
        Some(WindowRequest::Exactly(window)) if window > fits => {
            return Err(WindowError::DoesNotFit { window, reading })
        }
        Some(WindowRequest::Exactly(window)) => return Ok(window),
        Some(WindowRequest::Longest) => chosen,
        None => DEFAULT_WINDOW.min(chosen),
    };
    Ok(Some(window)
        .filter(|w| *w >= MIN_WINDOW)
        .unwrap_or_default())
}

/// The time kept, out of `reading`, for reads past their estimate: a tenth, at most 1 s.
fn reads_reserve(reading: Duration) -> Duration {
    (reading / 10).min(Duration::from_secs(1))
}

/// A GPU's reads and window close when the state kept none, and the margins
/// added to what it kept.
const READS_FIRST: Duration = Duration::from_millis(100);
const READS_MARGIN: Duration = Duration::from_millis(20);
const CLOSING_FIRST: Duration = Duration::from_millis(5);
const CLOSING_MARGIN: Duration = Duration::from_millis(5);

/// How long the phases of one GPU after its windows open are expected to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    pub reads: Duration,
    /// The close of the windows, from their end: zero without windows.
    pub closing: Duration,
}

impl Estimate {
    /// What the previous run took (from the state) or a first guess, plus a margin.
    pub fn new(reads: Option<Duration>, closing: Option<Duration>, windowed: bool) -> Estimate {
        let closing = closing.unwrap_or(CLOSING_FIRST) + CLOSING_MARGIN;
        Estimate {
            reads: reads.unwrap_or(READS_FIRST) + READS_MARGIN,
            closing: if windowed { closing } else { Duration::ZERO },
        }
    }

    fn total(self) -> Duration {
        self.reads + self.closing
    }
}

/// The duration kept for a phase the deadline cut: all the time the run had.
pub fn cut(opened: Instant, reading_ends: Instant) -> Duration {
    reading_ends.saturating_duration_since(opened)
}

/// When the reads start, and by when each GPU's windows must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// When the reads start; `None`: at once (no window is open).
    pub reads_start: Option<Instant>,
    /// Per GPU, in the order given, the latest end of its windows.
    pub windows_end_by: Vec<Instant>,
}

/// The schedule of `gpus` read one after another over windows ending at
/// `windows_end` (`None`: no window), shortened (never under [`MIN_WINDOW`])
/// so that the whole may overrun by half its estimate (at least
/// [`reads_reserve`]) and still end [`AFTER_WINDOW`] before `reading_ends`.
pub fn schedule(
    now: Instant,
    reading_ends: Instant,
    windows_end: Option<Instant>,
    gpus: &[Estimate],
) -> Schedule {
    // `from` less `by`, never before `now`.
    let back = |from: Instant, by: Duration| from.checked_sub(by).unwrap_or(now).max(now);
    let left = reading_ends.saturating_duration_since(now);
    let total: Duration = gpus.iter().map(|gpu| gpu.total()).sum();
    let done_by = back(
        reading_ends,
        AFTER_WINDOW + (total / 2).max(reads_reserve(left)),
    );
    let first_reads = gpus.first().map_or(Duration::ZERO, |gpu| gpu.reads);
    let start = windows_end.map_or(now, |end| back(end, first_reads).min(back(done_by, total)));
    let shortest = (now + MIN_WINDOW).min(back(reading_ends, AFTER_WINDOW));
    let mut before = Duration::ZERO;
    let windows_end_by = gpus
        .iter()
        .map(|gpu| {
            let reads_end = before + gpu.reads;
            before += gpu.total();
            // The latest end that leaves the GPUs after this one what they need.
            let latest = back(done_by, total.saturating_sub(reads_end));
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
        assert_eq!(publish_reserve(Duration::from_secs(30)), 1_000 * MS);
    }

    #[test]
    fn the_units_budget_names_each_instant() {
        let now = Instant::now();
        let budget = Budget::new(now, 14_000 * MS);
        assert_eq!(budget.gpus_end, now + 12_500 * MS);
        assert_eq!(budget.host_end, now + 13_000 * MS);
        assert_eq!(budget.storing_end, now + 13_500 * MS);
        assert_eq!(budget.end, now + 14_000 * MS);
        assert_eq!(budget.hard_stop, now + 14_250 * MS);
        assert_eq!(budget.handoff(), now + 12_550 * MS);
        assert_eq!(budget.halfway(now + 2_500 * MS), now + 7_500 * MS);
    }

    #[test]
    fn the_host_steps_keep_a_tenth_of_the_reading_time_at_most_half_a_second() {
        // --timeout 2s: 1.6 s to read, 160 ms of it the host steps'.
        assert_eq!(host_reserve(Duration::from_secs(2)), 160 * MS);
        assert_eq!(gpus_time(Duration::from_secs(2)), 1_440 * MS);
        // The unit's 14 s: 13 s to read, the GPUs 12.5 s of it.
        assert_eq!(gpus_time(Duration::from_secs(14)), 12_500 * MS);
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
