//! One run: read NVML on a worker thread under a watchdog and wrap the result in
//! the collector's own metrics.
//!
//! Invariants of [`collect`]:
//! - it returns within `timeout` plus a few milliseconds, whatever NVML does: a
//!   worker stuck in a driver call is abandoned, never joined, and the process
//!   may exit with it still blocked;
//! - the snapshot it returns always holds `nvidia_gpu_collector_up`, the build
//!   info, the run's timestamp and duration; on failure also
//!   `nvidia_gpu_collector_error{reason}` and no device series at all.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::exit::Exit;
use crate::inflight::InFlight;
use crate::metrics;
use crate::nvml;
use crate::snapshot::{Sample, Snapshot};

/// The snapshot to publish and how the run should exit.
#[derive(Debug)]
pub struct Outcome {
    pub snapshot: Snapshot,
    pub exit: Exit,
}

/// When and for how long a run read NVML.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    started: Instant,
    wall: SystemTime,
}

impl RunClock {
    pub fn start() -> Self {
        RunClock {
            started: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// The collector samples every published file carries; `error` is the
    /// reason the run failed, if it did.
    fn samples(&self, error: Option<&'static str>) -> Vec<Sample> {
        let timestamp = self
            .wall
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_millis() as f64 / 1000.0);
        let mut samples = vec![
            Sample::new(
                &metrics::COLLECTOR_UP,
                if error.is_some() { 0.0 } else { 1.0 },
            ),
            Sample::new(
                &metrics::COLLECTOR_DURATION,
                self.started.elapsed().as_secs_f64(),
            ),
            Sample::new(&metrics::COLLECTOR_TIMESTAMP, timestamp),
            Sample::new(&metrics::COLLECTOR_BUILD_INFO, 1.0)
                .with("version", env!("CARGO_PKG_VERSION")),
        ];
        if let Some(reason) = error {
            samples.push(Sample::new(&metrics::COLLECTOR_ERROR, 1.0).with("reason", reason));
        }
        samples
    }

    /// A snapshot that says only that the run failed for `reason`.
    pub fn failed(&self, reason: &'static str, exit: Exit) -> Outcome {
        Outcome {
            snapshot: Snapshot {
                host: self.samples(Some(reason)),
                devices: Vec::new(),
            },
            exit,
        }
    }
}

/// Reads every GPU through the NVML library at `library`, giving up after `timeout`.
pub fn collect(
    library: &Path,
    options: &nvml::Options,
    timeout: Duration,
    clock: RunClock,
) -> Outcome {
    let inflight = Arc::new(InFlight::default());
    let (sender, receiver) = mpsc::channel();
    let worker = {
        let inflight = Arc::clone(&inflight);
        let library = library.to_path_buf();
        let options = options.clone();
        thread::Builder::new().name("nvml".into()).spawn(move || {
            let _ = sender.send(nvml::read(&library, &options, &inflight));
        })
    };
    if let Err(e) = worker {
        log::error!("cannot start the NVML thread: {e}");
        return clock.failed("exporter_resources", Exit::NvmlUnavailable);
    }
    let remaining = timeout.saturating_sub(clock.started.elapsed());
    match receiver.recv_timeout(remaining) {
        Ok(Ok(reading)) => {
            let any_down = reading
                .devices
                .iter()
                .any(|d| d.samples.iter().any(|s| s.family == &metrics::DOWN_REASON));
            let mut host = clock.samples(None);
            host.extend(reading.host);
            Outcome {
                snapshot: Snapshot {
                    host,
                    devices: reading.devices,
                },
                exit: if any_down {
                    Exit::DeviceDown
                } else {
                    Exit::Success
                },
            }
        }
        Ok(Err(error)) => {
            log::error!(
                "cannot use NVML ({}): {}\nhint: {}",
                error.reason,
                error.detail,
                error.hint()
            );
            clock.failed(error.reason, Exit::NvmlUnavailable)
        }
        Err(RecvTimeoutError::Timeout) => {
            log::error!(
                "NVML did not answer within {}; stuck in {}. The driver may be hung: \
                 check `dmesg` for Xid errors and whether `nvidia-smi` also hangs.",
                humantime::format_duration(timeout),
                inflight.describe()
            );
            clock.failed("timeout", Exit::Timeout)
        }
        Err(RecvTimeoutError::Disconnected) => {
            log::error!("the NVML thread ended without a result (see the panic above)");
            clock.failed("exporter_bug", Exit::NvmlUnavailable)
        }
    }
}
