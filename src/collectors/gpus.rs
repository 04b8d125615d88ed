//! Reading every GPU: the phases of a run over the registry's hooks.
//!
//! 1. Identity: each GPU's handle and info (UUID, PCI bus id, serial), one GPU
//!    after another, then [`identity::resolve`] over all of them and the GPUs
//!    this boot has seen. A GPU that left enumeration is reported down
//!    (`not_enumerated`) under the identity the state kept.
//! 2. Per GPU (each on its own thread, or one after another with
//!    `--sequential`): the previous run's state of the resolved identity, every
//!    collector's `open` (GPM's first sample), a wait until the reads can end
//!    as the windows do, the batched field read and every `read`, then every
//!    window's close. So the point readings (temperature, power, memory) are
//!    taken at the end of the windows, just before the file is written.
//!
//! How long the reads of a GPU take is kept in the state (`reads_us`), so
//! that the next run starts them that long before its windows end.

use std::collections::BTreeMap;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use nvml_wrapper::Device as NvmlDevice;

use super::hooks::{Collector, Settings, Window};
use super::info;
use crate::identity::{self, Identity};
use crate::inflight::InFlight;
use crate::nvml::reader::{self, DeviceReader};
use crate::nvml::{InitError, Session};
use crate::reason::Reason;
use crate::snapshot::{Device, KnownGpu, Sample};
use crate::state::schema::GpuState;

/// What the previous run left that the GPUs' reading uses.
#[derive(Debug, Clone, Default)]
pub struct PreviousState {
    /// Each GPU's state by UUID.
    pub gpus: BTreeMap<String, GpuState>,
    /// The driver version the state was written under.
    pub driver_version: String,
    /// The GPUs this boot has seen.
    pub known: Vec<KnownGpu>,
    /// Whether running totals continue from the state this run (see
    /// `state::StateFile::continues_totals`).
    pub totals: bool,
}

/// What a successful read produced.
#[derive(Debug)]
pub struct Reading {
    /// Host-wide samples (driver versions).
    pub host: Vec<Sample>,
    /// The driver version, empty if it could not be read.
    pub driver_version: String,
    /// One entry per GPU in index order, then the GPUs that left enumeration.
    pub devices: Vec<Device>,
}

/// Time added to the kept duration of the reads, so that they end
/// before the windows do.
const READS_MARGIN: Duration = Duration::from_millis(20);
/// The duration assumed for the reads when none is kept (a cold run on
/// an H200 takes about 50 ms).
const READS_FIRST: Duration = Duration::from_millis(100);

/// Loads NVML from `library` and reads every GPU as `settings` say.
pub fn read(
    library: &Path,
    settings: &Settings,
    previous: &PreviousState,
    inflight: &InFlight,
) -> Result<Reading, InitError> {
    let session = Session::open(library, inflight)?;
    let states = states_for(previous, &session.driver_version);
    let handles: Vec<Result<NvmlDevice<'_>, Reason>> = (0..session.count)
        .map(|index| session.handle(index, inflight))
        .collect();
    let mut reads = Vec::with_capacity(handles.len());
    let mut readers = Vec::with_capacity(handles.len());
    for (index, handle) in (0..session.count).zip(&handles) {
        match handle {
            Ok(device) => {
                let mut reader = DeviceReader::new(device, index, inflight);
                reads.push(info::read(&mut reader));
                readers.push(Ok(reader));
            }
            Err(why) => {
                reads.push(identity::Read {
                    index,
                    ..identity::Read::default()
                });
                readers.push(Err(*why));
            }
        }
    }
    let resolution = identity::resolve(&reads, &previous.known);
    let gpus: Vec<Gpu<'_>> = readers
        .into_iter()
        .zip(resolution.identities)
        .zip(0..session.count)
        .map(|((reader, identity), index)| Gpu {
            index,
            reader,
            // What is kept under a UUID two GPUs share is neither's.
            state: states
                .get(&identity.uuid)
                .filter(|_| identity.unique)
                .cloned()
                .unwrap_or_default(),
            keeps_totals: previous.totals && identity.unique,
            identity,
        })
        .collect();
    let mut devices = if settings.parallel {
        read_in_parallel(gpus, settings)
    } else {
        read_in_sequence(gpus, settings)
    };
    for gone in resolution.missing {
        let mut state = states.get(&gone.uuid).cloned().unwrap_or_default();
        // Said once, when it leaves; the file says it every run.
        if !std::mem::replace(&mut state.left_enumeration, true) {
            log::warn!(
                "GPU {} ({}, {}) is no longer enumerated by NVML; reporting it down",
                gone.index,
                gone.uuid,
                gone.pci_bus_id
            );
        }
        let identity = Identity {
            uuid: gone.uuid,
            pci_bus_id: gone.pci_bus_id,
            serial: gone.serial,
            unique: true,
        };
        let mut device = reader::down(gone.index, &identity, Reason::NotEnumerated);
        // Its running totals stay in the state for when it comes back.
        device.state = Some(state);
        devices.push(device);
    }
    Ok(Reading {
        host: session.host,
        driver_version: session.driver_version,
        devices,
    })
}

/// The GPUs' state the previous run left, as this driver may use it: all of
/// it under the same driver, only the identities and the boot's running
/// totals after a change.
fn states_for(previous: &PreviousState, driver_version: &str) -> BTreeMap<String, GpuState> {
    if previous.driver_version == driver_version {
        return previous.gpus.clone();
    }
    if !previous.gpus.is_empty() {
        log::info!(
            "the driver changed ({} -> {driver_version}): using only the boot's running \
             totals of the previous run's state",
            previous.driver_version
        );
    }
    previous
        .gpus
        .iter()
        .map(|(uuid, gpu)| (uuid.clone(), gpu.after_driver_change()))
        .collect()
}

/// One enumerated GPU on its way through the phases.
struct Gpu<'n> {
    index: u32,
    reader: Result<DeviceReader<'n>, Reason>,
    identity: Identity,
    state: GpuState,
    keeps_totals: bool,
}

/// A GPU whose windows are open.
struct Opened<'n> {
    reader: DeviceReader<'n>,
    identity: Identity,
    windows: Vec<Box<dyn Window<'n> + 'n>>,
    /// When the first window ends, if one is open.
    windows_end: Option<Instant>,
    /// How long the reads are expected to take (the previous run's, plus a
    /// margin).
    lead: Duration,
    /// When the reads started and ended, once they ran.
    reads: Option<(Instant, Instant)>,
}

impl<'n> Gpu<'n> {
    /// Phase 2a: hands the reader the GPU's previous state and opens every
    /// collector's window.
    fn open(self, settings: &Settings) -> Result<Opened<'n>, Box<Device>> {
        let mut reader = match self.reader {
            Ok(reader) => reader,
            Err(why) => return Err(Box::new(reader::down(self.index, &self.identity, why))),
        };
        reader.set_previous_state(self.state, self.keeps_totals);
        let lead = reader
            .previous_state()
            .reads_us
            .map_or(READS_FIRST, Duration::from_micros)
            + READS_MARGIN;
        let windows: Vec<_> = settings
            .collectors
            .iter()
            .filter_map(|c| c.hooks.open.and_then(|open| open(&mut reader, settings)))
            .collect();
        let windows_end = windows.iter().map(|w| w.ends()).min();
        Ok(Opened {
            reader,
            identity: self.identity,
            windows,
            windows_end,
            lead,
            reads: None,
        })
    }
}

impl Opened<'_> {
    /// Phase 2b: the batched field read and every collector's `read`.
    fn read(&mut self, collectors: &[&'static Collector]) {
        let started = Instant::now();
        let reader = &mut self.reader;
        let facts = reader.facts().clone();
        let mut fields: Vec<u32> = collectors
            .iter()
            .flat_map(|collector| collector.fields(&facts))
            .collect();
        // Collectors may share a field (the NVLink link count): ask for it once.
        fields.sort_unstable();
        fields.dedup();
        if !fields.is_empty() {
            reader.prefetch(&fields);
        }
        // The collectors of one GPU run one after another: NVML serialises the
        // calls of a device, and on an H200 reading them from several threads was
        // slower (73 ms against 62 ms a snapshot), so threads are used per GPU only.
        for read in collectors.iter().filter_map(|c| c.hooks.read) {
            read(reader);
        }
        let ended = Instant::now();
        reader.next_state().reads_us = u64::try_from((ended - started).as_micros()).ok();
        self.reads = Some((started, ended));
    }

    /// Phase 2c: closes the windows and returns the GPU's readings.
    fn close(mut self) -> Device {
        let had_windows = !self.windows.is_empty();
        for window in self.windows {
            window.close(&mut self.reader);
        }
        if let (true, Some((started, ended))) = (had_windows, self.reads) {
            let closed = Instant::now();
            log::debug!(
                "GPU {}: point readings taken from {} ms to {} ms before the windows closed",
                self.reader.index(),
                (closed - started).as_millis(),
                (closed - ended).as_millis()
            );
        }
        self.reader.finish(&self.identity)
    }
}

/// When reads that take `lead` start so that they end as the windows do
/// (`windows_end`); `None` (at once) without a window.
fn reads_start(windows_end: Option<Instant>, lead: Duration) -> Option<Instant> {
    windows_end.map(|ends| ends.checked_sub(lead).unwrap_or(ends))
}

/// Sleeps until `when`, if it is still ahead.
fn wait_until(when: Option<Instant>) {
    if let Some(wait) = when.map(|when| when.saturating_duration_since(Instant::now())) {
        if !wait.is_zero() {
            thread::sleep(wait);
        }
    }
}

/// Reads each GPU on a thread of its own.
fn read_in_parallel(gpus: Vec<Gpu<'_>>, settings: &Settings) -> Vec<Device> {
    thread::scope(|scope| {
        let workers: Vec<_> = gpus
            .into_iter()
            .map(|gpu| {
                let (index, identity) = (gpu.index, gpu.identity.clone());
                let worker = thread::Builder::new()
                    .name(format!("gpu{index}"))
                    .spawn_scoped(scope, move || {
                        let mut opened = match gpu.open(settings) {
                            Ok(opened) => opened,
                            Err(down) => return *down,
                        };
                        wait_until(reads_start(opened.windows_end, opened.lead));
                        opened.read(&settings.collectors);
                        opened.close()
                    });
                (index, identity, worker)
            })
            .collect();
        workers
            .into_iter()
            .map(|(index, identity, worker)| match worker {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| reader::down(index, &identity, Reason::ExporterBug)),
                Err(e) => {
                    log::warn!("GPU {index}: cannot start a reading thread: {e}");
                    reader::down(index, &identity, Reason::ExporterResources)
                }
            })
            .collect()
    })
}

/// Reads the GPUs one after another, but with their windows open together:
/// every GPU's windows open, then every GPU's reads, then every window's
/// close, so that N GPUs cost one window, not N.
fn read_in_sequence(gpus: Vec<Gpu<'_>>, settings: &Settings) -> Vec<Device> {
    let mut opened: Vec<Result<Opened<'_>, Box<Device>>> =
        gpus.into_iter().map(|gpu| gpu.open(settings)).collect();
    // One GPU's reads follow another's: they start as long before the first
    // window ends as all of them take.
    let ready: Vec<&Opened<'_>> = opened.iter().flatten().collect();
    let windows_end = ready.iter().filter_map(|gpu| gpu.windows_end).min();
    let lead = ready.iter().map(|gpu| gpu.lead).sum();
    wait_until(reads_start(windows_end, lead));
    for gpu in opened.iter_mut().flatten() {
        gpu.read(&settings.collectors);
    }
    opened
        .into_iter()
        .map(|gpu| match gpu {
            Ok(gpu) => gpu.close(),
            Err(down) => *down,
        })
        .collect()
}
