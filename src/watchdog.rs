//! One deadline per run, and the watchdogs that keep it.
//!
//! `--timeout` bounds the whole run, from start to the published file. A
//! [`Deadline`] splits it in two: the lock wait and the NVML reading must end by
//! [`Deadline::reading_ends`], which leaves a reserve (`timing::publish_reserve`)
//! for rendering and publishing the file, error file included.
//!
//! Invariants:
//! - [`collect`] returns by `reading_ends` plus a few milliseconds
//!   (`timing::handoff`), whatever NVML does: a worker stuck in a driver call is
//!   abandoned, never joined. A hang before the GPUs are read (NVML's init, the
//!   device count) fails the whole run (`reason="timeout"`); once NVML is open,
//!   a GPU stuck in a call costs only itself (see `collectors::gpus`);
//! - the snapshot it returns always holds `nvidia_gpu_collector_up`, the build
//!   info, the run's timestamp (when reading ended, or the failure) and a
//!   duration that [`Deadline::stamp_duration`] sets again right before
//!   rendering; on failure also `nvidia_gpu_collector_error{reason}` and no
//!   device series at all;
//! - [`Deadline::arm`] ends the process with [`Exit::Timeout`] shortly after the
//!   deadline if anything else blocks (a file system that hangs, `/proc` reads,
//!   a standard output or error nobody reads), naming the phase it was in
//!   without waiting to log it, so no run outlives its timeout.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::exit::Exit;
use crate::inflight::InFlight;
use crate::logging;
use crate::metrics;
use crate::nvml::InitError;
use crate::phases::Reading;
use crate::reason::Reason;
use crate::snapshot::{Sample, Snapshot};
use crate::timing::{self, HARD_STOP_GRACE};

/// The snapshot to publish and how the run should exit.
#[derive(Debug)]
pub struct Outcome {
    pub snapshot: Snapshot,
    pub exit: Exit,
    /// The driver version NVML was read under; `None` when NVML was not read
    /// (then nothing of this run may be stored).
    pub driver_version: Option<String>,
}

/// When a run started and when it must be done.
#[derive(Debug, Clone)]
pub struct Deadline {
    started: Instant,
    timeout: Duration,
    phase: Arc<Mutex<&'static str>>,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub fn start(timeout: Duration) -> Self {
        Deadline {
            started: Instant::now(),
            timeout,
            phase: Arc::new(Mutex::new("starting")),
        }
    }

    /// When the whole run must be done, its file published.
    pub fn end(&self) -> Instant {
        self.started + self.timeout
    }

    /// When waiting and reading must give up, so that the file (an error file if
    /// need be) is still published by [`Self::end`].
    pub fn reading_ends(&self) -> Instant {
        self.end() - timing::publish_reserve(self.timeout)
    }

    /// When storing the state gives up (see `timing::storing_ends`).
    pub fn storing_ends(&self) -> Instant {
        timing::storing_ends(self.reading_ends(), self.timeout)
    }

    /// When a wait before reading gives up that must leave the reading time
    /// (the state's lock; see `timing::waiting_ends`).
    pub fn waiting_ends(&self) -> Instant {
        timing::waiting_ends(Instant::now(), self.reading_ends())
    }

    /// Records what the run is doing, for the hard stop's message.
    pub fn enter(&self, phase: &'static str) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
    }

    /// Starts the hard stop: a thread that, [`HARD_STOP_GRACE`] after the
    /// deadline, logs the phase the run is stuck in and ends the process with
    /// [`Exit::Timeout`] without running destructors.
    pub fn arm(&self) {
        let deadline = self.clone();
        let spawned = thread::Builder::new()
            .name("hard-stop".into())
            .spawn(move || {
                let stop = deadline.end() + HARD_STOP_GRACE;
                loop {
                    let now = Instant::now();
                    if now >= stop {
                        break;
                    }
                    thread::sleep(stop - now);
                }
                // The phase's lock is only ever held to copy a pointer. The
                // message goes out without the logger: the stuck thread may
                // hold stderr's lock, blocked writing to a stalled journal.
                let phase = *deadline.phase.lock().unwrap_or_else(|e| e.into_inner());
                logging::emergency(&format!(
                    "the run did not finish within --timeout {} (stuck {phase}); \
                     exiting without publishing",
                    humantime::format_duration(deadline.timeout)
                ));
                exit_now(Exit::Timeout)
            });
        if let Err(e) = spawned {
            log::warn!("cannot start the hard-stop thread: {e}");
        }
    }

    /// The collector samples every published file carries; `error` is the
    /// reason the run failed, if it did.
    fn samples(&self, error: Option<Reason>) -> Vec<Sample> {
        // When the snapshot was taken: the end of reading (the GPUs' point
        // readings are taken just before it), or the failure.
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_millis() as f64 / 1000.0);
        let mut samples = vec![
            metrics::COLLECTOR_UP.sample(if error.is_some() { 0.0 } else { 1.0 }),
            metrics::COLLECTOR_DURATION.sample(self.started.elapsed().as_secs_f64()),
            metrics::COLLECTOR_TIMESTAMP.sample(timestamp),
            metrics::COLLECTOR_BUILD_INFO.sample_with([env!("CARGO_PKG_VERSION")], 1.0),
        ];
        if let Some(reason) = error {
            samples.push(metrics::COLLECTOR_ERROR.sample_with([reason.label()], 1.0));
        }
        samples
    }

    /// Sets `nvidia_gpu_collector_duration_seconds` in `snapshot` to the time
    /// since the run started. Called right before rendering, so that it covers
    /// every read (process owners, the kernel log, the state), not only NVML.
    pub fn stamp_duration(&self, snapshot: &mut Snapshot) {
        let elapsed = self.started.elapsed().as_secs_f64();
        for sample in &mut snapshot.host {
            if sample.family == metrics::COLLECTOR_DURATION.family() {
                sample.value = elapsed;
            }
        }
    }

    /// A snapshot that says only that the run failed for `reason`.
    pub fn failed(&self, reason: Reason, exit: Exit) -> Outcome {
        Outcome {
            snapshot: Snapshot {
                host: self.samples(Some(reason)),
                devices: Vec::new(),
            },
            exit,
            driver_version: None,
        }
    }
}

/// Ends the process at once, without exit handlers or library destructors.
///
/// After a timeout a thread may still be inside a driver call; returning from
/// `main` would run libnvidia-ml's destructors, which can wait for locks that
/// the stuck call holds. Nothing is flushed: another thread may hold stdout's
/// lock, blocked on a reader that never reads (a run's metrics go to fd 1
/// unbuffered, see `publish::write_stdout`).
pub fn exit_now(exit: Exit) -> ! {
    extern "C" {
        fn _exit(status: i32) -> !;
    }
    // SAFETY: _exit(2) only ends the process; nothing the run wrote waits in a
    // buffer, and stderr is unbuffered.
    unsafe { _exit(i32::from(exit.code())) }
}

/// How the reading thread gets on.
enum Progress {
    /// NVML is open: from now on the reading hands over its GPUs by
    /// `reading_ends`, stuck or not.
    Opened,
    Done(Result<Reading, InitError>),
}

/// Runs `read` (every NVML call of the run) on a thread of its own, giving
/// up at `deadline.reading_ends()` if NVML has not opened by then. `read`
/// calls the function it is given once NVML is open.
pub fn collect<F>(read: F, deadline: &Deadline) -> Outcome
where
    F: FnOnce(&Arc<InFlight>, &dyn Fn()) -> Result<Reading, InitError> + Send + 'static,
{
    let inflight = Arc::new(InFlight::default());
    let (sender, receiver) = mpsc::channel();
    let worker = {
        let inflight = Arc::clone(&inflight);
        thread::Builder::new().name("nvml".into()).spawn(move || {
            let opened = sender.clone();
            let reading = read(&inflight, &move || {
                let _ = opened.send(Progress::Opened);
            });
            let _ = sender.send(Progress::Done(reading));
        })
    };
    if let Err(e) = worker {
        log::error!("cannot start the NVML thread: {e}");
        return deadline.failed(Reason::ExporterResources, Exit::NvmlUnavailable);
    }
    let mut until = deadline.reading_ends();
    let received = loop {
        let remaining = until.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(remaining) {
            Ok(Progress::Opened) => {
                until = deadline.reading_ends() + timing::handoff(deadline.timeout)
            }
            Ok(Progress::Done(reading)) => break Ok(reading),
            Err(error) => break Err(error),
        }
    };
    match received {
        Ok(Ok(reading)) => {
            let any_down = reading.devices.iter().any(|d| {
                d.samples
                    .iter()
                    .any(|s| s.family == metrics::DOWN_REASON.family())
            });
            let mut host = deadline.samples(None);
            host.extend(reading.host);
            Outcome {
                snapshot: Snapshot {
                    host,
                    devices: reading.devices,
                },
                exit: if reading.timed_out {
                    Exit::Timeout
                } else if any_down {
                    Exit::DeviceDown
                } else {
                    Exit::Success
                },
                driver_version: Some(reading.driver_version),
            }
        }
        Ok(Err(error)) => {
            log::error!(
                "cannot use NVML ({}): {}\nhint: {}",
                error.reason,
                error.detail,
                error.reason.hint()
            );
            deadline.failed(error.reason, Exit::NvmlUnavailable)
        }
        Err(RecvTimeoutError::Timeout) => {
            log::error!(
                "NVML did not answer within the run's --timeout {}; stuck in {}. The driver \
                 may be hung: check `dmesg` for Xid errors and whether `nvidia-smi` also hangs.",
                humantime::format_duration(deadline.timeout),
                inflight.describe()
            );
            deadline.failed(Reason::Timeout, Exit::Timeout)
        }
        Err(RecvTimeoutError::Disconnected) => {
            log::error!("the NVML thread ended without a result (see the panic above)");
            deadline.failed(Reason::ExporterBug, Exit::NvmlUnavailable)
        }
    }
}
