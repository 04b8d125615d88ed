//! What a run publishes and how it exits, decided from what the GPUs' reading
//! gave: every file holds the collector series; a failed run no reading of a
//! GPU, only what a host step that needs nothing of NVML (the kernel log's
//! counts) adds for the GPUs the state knows of this boot.

use std::collections::BTreeMap;

use crate::exit::Exit;
use crate::metrics;
use crate::phases::Reading;
use crate::reason::Reason;
use crate::samples;
use crate::snapshot::{Device, Sample, Snapshot, Status};
use crate::state::schema::GpuState;
use crate::state::StateFile;
use crate::timing::Budget;
use crate::watchdog::Stopped;

/// The snapshot to publish and how the run should exit.
#[derive(Debug)]
pub struct Outcome {
    pub snapshot: Snapshot,
    /// What each GPU leaves for the next run, by UUID.
    pub states: BTreeMap<String, GpuState>,
    pub exit: Exit,
    /// The driver version NVML was read under; `None`: store nothing of this run.
    pub driver_version: Option<String>,
    /// Why the run failed, if it did.
    pub failed: Option<Reason>,
}

impl Outcome {
    /// The GPUs' reading, or why there is none (logged here, once).
    pub fn of(collected: Result<Reading, Stopped>, budget: &Budget) -> Outcome {
        let reading = match collected {
            Ok(reading) => reading,
            Err(stopped) => return stopped_because(stopped, budget),
        };
        let mut finished = reading.devices;
        let down = finished.iter().any(|f| f.device.status != Status::Up);
        let exit = match (reading.timed_out, down) {
            (true, _) => Exit::Timeout,
            (false, true) => Exit::DeviceDown,
            (false, false) => Exit::Success,
        };
        let mut host = collector_samples(None, budget);
        host.extend(reading.host);
        let states = (finished.iter_mut())
            .filter(|f| !f.device.uuid.is_empty())
            .filter_map(|f| Some((f.device.uuid.clone(), f.state.take()?)))
            .collect();
        let devices = finished.into_iter().map(|f| f.device).collect();
        Outcome {
            snapshot: Snapshot { host, devices },
            states,
            exit,
            driver_version: Some(reading.driver_version),
            failed: None,
        }
    }

    /// A snapshot that says only that the run failed for `reason`.
    pub fn failed(reason: Reason, exit: Exit, budget: &Budget) -> Outcome {
        Outcome {
            snapshot: Snapshot {
                host: collector_samples(Some(reason), budget),
                devices: Vec::new(),
            },
            states: BTreeMap::new(),
            exit,
            driver_version: None,
            failed: Some(reason),
        }
    }

    /// A failed run's devices: the GPUs `state` knows of this boot, down for
    /// the run's reason, with no readings (only what a host step that needs
    /// nothing of NVML adds); false where the state knows none.
    pub fn with_known_gpus(&mut self, state: &StateFile) -> bool {
        let Some(reason) = self.failed.filter(|_| state.continues_totals()) else {
            return false;
        };
        let known = state.previous().gpus.iter().map(|(uuid, gpu)| Device {
            index: gpu.index,
            uuid: uuid.clone(),
            pci_bus_id: gpu.pci_bus_id.clone(),
            serial: gpu.serial.clone(),
            status: Status::Down {
                reason,
                stuck_in: None,
            },
            ..Device::default()
        });
        self.snapshot.devices.extend(known);
        !self.snapshot.devices.is_empty()
    }

    /// Sets `nvidia_gpu_collector_duration_seconds` to the time since the
    /// run started (right before rendering, to cover every read).
    pub fn stamp_duration(&mut self, budget: &Budget) {
        let elapsed = budget.started.elapsed().as_secs_f64();
        let family = metrics::COLLECTOR_DURATION.family();
        let duration = self.snapshot.host.iter_mut().filter(|s| s.family == family);
        duration.for_each(|sample| sample.value = elapsed);
    }
}

/// Logs why NVML gave no reading; the run failed for that reason.
fn stopped_because(stopped: Stopped, budget: &Budget) -> Outcome {
    let (reason, exit) = match stopped {
        Stopped::Nvml(error) => {
            let (reason, detail) = (Reason::from(error.failure), error.detail);
            log::error!(
                "cannot use NVML ({reason}): {detail}\nhint: {}",
                reason.hint()
            );
            (reason, Exit::NvmlUnavailable)
        }
        Stopped::NotStarted(e) => {
            log::error!("cannot start the NVML thread: {e}");
            (Reason::ExporterResources, Exit::NvmlUnavailable)
        }
        Stopped::Late(stuck_in) => {
            log::error!(
                "NVML did not answer within the run's --timeout {}; stuck in {stuck_in}. The \
                 driver may be hung: check `dmesg` for Xid errors and whether `nvidia-smi` \
                 also hangs.",
                humantime::format_duration(budget.timeout),
            );
            (Reason::Timeout, Exit::Timeout)
        }
        Stopped::Ended => {
            log::error!("the NVML thread ended without a result (see the panic above)");
            (Reason::ExporterBug, Exit::NvmlUnavailable)
        }
    };
    Outcome::failed(reason, exit, budget)
}

/// The collector samples of every file; `error`: why the run failed, if it did.
fn collector_samples(error: Option<Reason>, budget: &Budget) -> Vec<Sample> {
    // When the snapshot was taken: the end of reading, or the failure.
    // In whole ms, as Prometheus' timestamps are.
    let timestamp = (samples::now_us() / 1000) as f64 / 1000.0;
    let mut samples = vec![
        metrics::COLLECTOR_UP.sample(if error.is_some() { 0.0 } else { 1.0 }),
        metrics::COLLECTOR_DURATION.sample(budget.started.elapsed().as_secs_f64()),
        metrics::COLLECTOR_TIMESTAMP.sample(timestamp),
        metrics::COLLECTOR_BUILD_INFO.sample_with([env!("CARGO_PKG_VERSION")], 1.0),
    ];
    samples.extend(error.map(|e| metrics::COLLECTOR_ERROR.sample_with([e.label()], 1.0)));
    samples
}
