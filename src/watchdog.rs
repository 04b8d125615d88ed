//! The run's deadline kept: the hard stop and the NVML worker.
//!
//! Invariants: [`collect`] returns by the budget's handoff, whatever NVML
//! does (a stuck worker is abandoned, never joined); [`Deadline::arm`] ends a
//! run still blocked at the hard stop with [`Exit::Timeout`], naming the
//! phase it was in.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::bounded::{Threads, Unfinished};
use crate::exit::Exit;
use crate::logging;
use crate::phases::Reading;
use crate::timing::Budget;
use nvml::{InFlight, InitError};

/// The run's budget and the phase it is in, for the hard stop's message.
#[derive(Debug, Clone)]
pub struct Deadline {
    pub budget: Budget,
    phase: Arc<Mutex<&'static str>>,
}

impl Deadline {
    pub fn start(timeout: Duration) -> Self {
        Deadline {
            budget: Budget::new(Instant::now(), timeout),
            phase: Arc::new(Mutex::new("starting")),
        }
    }

    /// Records what the run is doing, for the hard stop's message.
    pub fn enter(&self, phase: &'static str) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
    }

    /// Starts the hard stop: at the budget's `hard_stop`, it logs the phase
    /// the run is stuck in and ends the process with [`Exit::Timeout`].
    pub fn arm(&self) {
        let deadline = self.clone();
        let spawned = Threads::<()>::default().spawn("hard-stop", move |_| {
            let stop = deadline.budget.hard_stop;
            while Instant::now() < stop {
                thread::sleep(stop.saturating_duration_since(Instant::now()));
            }
            // The phase's lock is only ever held to copy a pointer; the
            // stuck thread may hold the logger's (see `logging::emergency`).
            let phase = *deadline.phase.lock().unwrap_or_else(|e| e.into_inner());
            logging::emergency(&format!(
                "the run did not finish within --timeout {} (stuck {phase}); \
                 exiting without publishing",
                humantime::format_duration(deadline.budget.timeout)
            ));
            exit_now(Exit::Timeout)
        });
        if let Err(e) = spawned {
            log::warn!("cannot start the hard-stop thread: {e}");
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

/// Why [`collect`] has no reading.
#[derive(Debug)]
pub enum Stopped {
    /// NVML could not be used.
    Nvml(InitError),
    /// The worker thread could not start.
    NotStarted(std::io::Error),
    /// NVML did not answer in time; the call it was stuck in.
    Late(String),
    /// The worker ended without a result (it panicked).
    Ended,
}

/// Runs `read` (every NVML call of the run) on a thread of its own; `read` calls
/// the function it is given once NVML is open, else it is given up at `gpus_end`.
pub fn collect<F>(read: F, budget: &Budget) -> Result<Reading, Stopped>
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
    let (progress, mut until) = (threads.waiting(), budget.gpus_end);
    let received = spawned.map_err(Unfinished::NotStarted).and_then(|()| loop {
        match progress.next_by(until)? {
            Progress::Opened => until = budget.handoff(),
            Progress::Done(reading) => return Ok(reading),
        }
    });
    match received {
        Ok(reading) => reading.map_err(Stopped::Nvml),
        Err(Unfinished::NotStarted(e)) => Err(Stopped::NotStarted(e)),
        Err(Unfinished::Late) => Err(Stopped::Late(inflight.describe())),
        Err(Unfinished::Ended) => Err(Stopped::Ended),
    }
}
