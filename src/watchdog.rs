//! One deadline per run, and the watchdogs that keep it.
//!
//! Invariants: [`collect`] returns by `gpus_end` plus `timing::handoff`,
//! whatever NVML does (a stuck worker is abandoned, never joined); its snapshot
//! always holds the collector series, and on failure no device series;
//! [`Deadline::arm`] ends a run still blocked after the deadline with
//! [`Exit::Timeout`], naming the phase it was in.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::bounded::{Threads, Unfinished};
use crate::collector::Finished;
use crate::exit::Exit;
use crate::logging;
use crate::metrics;
use crate::phases::Reading;
use crate::reason::Reason;
use crate::snapshot::{Sample, Snapshot, Status};
use crate::state::schema::GpuState;
use crate::timing::{self, HARD_STOP_GRACE};
use nvml::{InFlight, InitError};

/// The snapshot to publish and how the run should exit.
#[derive(Debug)]
pub struct Outcome {
    pub snapshot: Snapshot,
    /// What each GPU leaves for the next run, by UUID.
    pub states: BTreeMap<String, GpuState>,
    pub exit: Exit,
    /// The driver version NVML was read under; `None`: store nothing of this run.
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

    /// When waiting and reading (the GPUs, then the host steps) must give
    /// up, leaving the time to publish.
    pub fn reading_ends(&self) -> Instant {
        self.started + timing::reading_time(self.timeout)
    }

    /// When the GPUs must be read, leaving the host steps their own time.
    pub fn gpus_end(&self) -> Instant {
        self.started + timing::gpus_time(self.timeout)
    }

    pub fn storing_ends(&self) -> Instant {
        timing::storing_ends(self.reading_ends(), self.timeout)
    }

    /// When a wait that starts now before reading gives up.
    pub fn waiting_ends(&self) -> Instant {
        timing::halfway(Instant::now(), self.gpus_end())
    }

    /// Records what the run is doing, for the hard stop's message.
    pub fn enter(&self, phase: &'static str) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
    }

    /// Starts the hard stop: [`HARD_STOP_GRACE`] after the deadline, it logs the
    /// phase the run is stuck in and ends the process with [`Exit::Timeout`].
    pub fn arm(&self) {
        let deadline = self.clone();
        let spawned = Threads::<()>::default().spawn("hard-stop", move |_| {
            let stop = deadline.end() + HARD_STOP_GRACE;
            while Instant::now() < stop {
                thread::sleep(stop.saturating_duration_since(Instant::now()));
            }
            // The phase's lock is only ever held to copy a pointer; the
            // stuck thread may hold the logger's (see `logging::emergency`).
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

    /// The collector samples of every file; `error`: why the run failed, if it did.
    fn samples(&self, error: Option<Reason>) -> Vec<Sample> {
        // When the snapshot was taken: the end of reading, or the failure.
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_millis() as f64 / 1000.0);
        let mut samples = vec![
            metrics::COLLECTOR_UP.sample(if error.is_some() { 0.0 } else { 1.0 }),
            metrics::COLLECTOR_DURATION.sample(self.started.elapsed().as_secs_f64()),
            metrics::COLLECTOR_TIMESTAMP.sample(timestamp),
            metrics::COLLECTOR_BUILD_INFO.sample_with([env!("CARGO_PKG_VERSION")], 1.0),
        ];
        samples.extend(error.map(|e| metrics::COLLECTOR_ERROR.sample_with([e.label()], 1.0)));
        samples
    }

    /// Sets the snapshot's `nvidia_gpu_collector_duration_seconds` to the time
    /// since the run started (right before rendering, to cover every read).
    pub fn stamp_duration(&self, snapshot: &mut Snapshot) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let family = metrics::COLLECTOR_DURATION.family();
        let duration = snapshot.host.iter_mut().filter(|s| s.family == family);
        duration.for_each(|sample| sample.value = elapsed);
    }

    /// A snapshot that says only that the run failed for `reason`.
    pub fn failed(&self, reason: Reason, exit: Exit) -> Outcome {
        Outcome {
            snapshot: Snapshot {
                host: self.samples(Some(reason)),
                devices: Vec::new(),
            },
            states: BTreeMap::new(),
            exit,
            driver_version: None,
        }
    }
}

/// Ends the process at once, without exit handlers or library destructors
/// (libnvidia-ml's may wait for locks a stuck call holds) and flushing nothing.
#[allow(unsafe_code)]
pub fn exit_now(exit: Exit) -> ! {
    // SAFETY: _exit(2) only ends the process; stderr is unbuffered.
    unsafe { libc::_exit(i32::from(exit.code())) }
}

/// How the reading thread gets on.
enum Progress {
    /// NVML is open: the reading hands over its GPUs by `gpus_end`.
    Opened,
    Done(Result<Reading, InitError>),
}

/// Runs `read` (every NVML call of the run) on a thread of its own; `read` calls
/// the function it is given once NVML is open, else it is given up at `gpus_end`.
pub fn collect<F>(read: F, deadline: &Deadline) -> Outcome
where
    F: FnOnce(&Arc<InFlight>, &dyn Fn()) -> Result<Reading, InitError> + Send + 'static,
{
    let (inflight, threads) = (Arc::new(InFlight::default()), Threads::default());
    let worker = Arc::clone(&inflight);
    let spawned = threads.spawn("nvml", move |sender| {
        let opened = sender.clone();
        let reading = read(&worker, &move || drop(opened.send(Progress::Opened)));
        let _ = sender.send(Progress::Done(reading));
    });
    let (progress, mut until) = (threads.waiting(), deadline.gpus_end());
    let received = spawned.map_err(Unfinished::NotStarted).and_then(|()| loop {
        match progress.next_by(until)? {
            Progress::Opened => until = deadline.gpus_end() + timing::handoff(deadline.timeout),
            Progress::Done(reading) => return Ok(reading),
        }
    });
    match received {
        Ok(Ok(reading)) => {
            let down = reading
                .devices
                .iter()
                .any(|d| d.device.status != Status::Up);
            let exit = match (reading.timed_out, down) {
                (true, _) => Exit::Timeout,
                (false, true) => Exit::DeviceDown,
                (false, false) => Exit::Success,
            };
            let mut host = deadline.samples(None);
            host.extend(reading.host);
            let mut states = BTreeMap::new();
            let mut devices = Vec::with_capacity(reading.devices.len());
            for Finished { device, state } in reading.devices {
                if let Some(state) = state.filter(|_| !device.uuid.is_empty()) {
                    states.insert(device.uuid.clone(), state);
                }
                devices.push(device);
            }
            Outcome {
                snapshot: Snapshot { host, devices },
                states,
                exit,
                driver_version: Some(reading.driver_version),
            }
        }
        Ok(Err(error)) => {
            let (reason, detail) = (Reason::from(error.failure), error.detail);
            log::error!(
                "cannot use NVML ({reason}): {detail}\nhint: {}",
                reason.hint()
            );
            deadline.failed(reason, Exit::NvmlUnavailable)
        }
        Err(Unfinished::NotStarted(e)) => {
            log::error!("cannot start the NVML thread: {e}");
            deadline.failed(Reason::ExporterResources, Exit::NvmlUnavailable)
        }
        Err(Unfinished::Late) => {
            log::error!(
                "NVML did not answer within the run's --timeout {}; stuck in {}. The driver \
                 may be hung: check `dmesg` for Xid errors and whether `nvidia-smi` also hangs.",
                humantime::format_duration(deadline.timeout),
                inflight.describe()
            );
            deadline.failed(Reason::Timeout, Exit::Timeout)
        }
        Err(Unfinished::Ended) => {
            log::error!("the NVML thread ended without a result (see the panic above)");
            deadline.failed(Reason::ExporterBug, Exit::NvmlUnavailable)
        }
    }
}
