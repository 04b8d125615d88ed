//! The only code that touches NVML.
//!
//! [`read`] loads the library, initialises it, reads host-wide facts and then
//! every GPU, each on its own thread, and returns plain [`snapshot`] data:
//! values converted to base units, fields the GPU does not support left out.
//!
//! Error policy, applied by [`reader::DeviceReader`]:
//! - "not supported" (and a symbol the driver lacks) leaves the field out, logged
//!   at debug level only;
//! - an error that means the GPU cannot be read at all ([`device_fatal`]) marks the
//!   GPU down: its readings are dropped and it gets `nvidia_gpu_up 0` with a reason;
//! - any other error leaves the field out, is logged as a warning and is counted
//!   in `nvidia_gpu_collector_read_errors`.
//!
//! Every call is bracketed in [`InFlight`] so a watchdog can name a call that hangs.
//!
//! [`snapshot`]: crate::snapshot

mod clocks;
mod fields;
mod gpm;
mod health;
mod identity;
mod limits;
mod media;
mod memory;
mod mig;
mod modes;
mod nvlink;
mod pcie;
mod power;
mod processes;
mod reader;
pub mod registry;
mod thermal;
mod utilization;
mod window;

use std::collections::BTreeMap;
use std::path::Path;
use std::thread;
use std::time::Instant;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device as NvmlDevice, Nvml};
use nvml_wrapper_sys::bindings::NvmlLib;

use crate::inflight::{InFlight, Scope};
use crate::metrics;
use crate::reason::Reason;
use crate::snapshot::{Device, KnownGpu, Sample};

pub use gpm::COLLECTOR as GPM_COLLECTOR;
pub use gpm::{GpmOptions, AFTER_WINDOW as AFTER_GPM_WINDOW, MIN_WINDOW as MIN_GPM_WINDOW};
pub use registry::Collector;

/// What a successful read produced.
#[derive(Debug)]
pub struct Reading {
    /// Host-wide samples (driver versions).
    pub host: Vec<Sample>,
    /// The driver version, empty if it could not be read.
    pub driver_version: String,
    /// One entry per GPU, in index order.
    pub devices: Vec<Device>,
}

/// NVML could not be used at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitError {
    /// Why: the `reason` label of `nvidia_gpu_collector_error`.
    pub reason: Reason,
    /// What NVML or the loader said.
    pub detail: String,
}

impl InitError {
    fn from_nvml(call: &str, error: &NvmlError) -> Self {
        InitError {
            reason: reason(error),
            detail: format!("{call}: {error}"),
        }
    }
}

/// The failure reason for an NVML error.
pub fn reason(error: &NvmlError) -> Reason {
    match error {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => Reason::LibraryNotFound,
        NvmlError::DriverNotLoaded => Reason::DriverNotLoaded,
        NvmlError::NoPermission => Reason::NoPermission,
        NvmlError::LibRmVersionMismatch => Reason::DriverLibraryMismatch,
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => Reason::MissingSymbol,
        NvmlError::GpuLost => Reason::GpuLost,
        NvmlError::ResetRequired => Reason::ResetRequired,
        NvmlError::Uninitialized => Reason::Uninitialized,
        NvmlError::Timeout => Reason::DriverTimeout,
        NvmlError::IrqIssue => Reason::IrqIssue,
        NvmlError::InsufficientPower => Reason::InsufficientPower,
        NvmlError::CorruptedInfoROM => Reason::CorruptedInforom,
        NvmlError::InsufficientMemory => Reason::OutOfMemory,
        NvmlError::OperatingSystem => Reason::OperatingSystem,
        _ => Reason::Unknown,
    }
}

/// Errors after which nothing more can be read from a GPU: it is reported down.
pub fn device_fatal(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::GpuLost
            | NvmlError::ResetRequired
            | NvmlError::DriverNotLoaded
            | NvmlError::Uninitialized
            | NvmlError::LibRmVersionMismatch
    )
}

/// Errors that only mean "this GPU or driver does not have this field": NVML's
/// NOT_SUPPORTED, a function the library lacks (an older driver), and NO_DATA
/// (nothing to report yet). Every other code, including return codes newer than
/// nvml-wrapper knows (`UnexpectedVariant`: ARGUMENT_VERSION_MISMATCH from a
/// newer driver, INSUFFICIENT_RESOURCES, ...), is a counted, logged read error.
/// Enum values newer than nvml-wrapper knows are not errors at all: see
/// `DeviceReader::read_enum`.
fn unsupported(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound
            | NvmlError::NoData
    )
}

/// More GPUs than one host can hold (HGX systems have 8 or 16): a larger count
/// from NVML is a sentinel, not hardware.
const MAX_GPUS: u32 = 64;

/// What to read and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The collectors to run on every GPU, in output order.
    pub collectors: Vec<&'static Collector>,
    /// Read each GPU on a thread of its own.
    pub parallel: bool,
    /// What the previous run remembered, per GPU UUID (see `state`).
    pub memory: BTreeMap<String, BTreeMap<String, String>>,
    /// The driver version the memory was written under: memory from another
    /// driver is not used.
    pub memory_driver: String,
    /// The GPUs this boot has seen, to find the memory of a GPU whose UUID
    /// cannot be read this run by its PCI bus id and serial.
    pub known: Vec<KnownGpu>,
    /// The GPM window (with the gpm collector).
    pub gpm: GpmOptions,
}

/// Loads NVML from `library` and reads every GPU as `options` say.
pub fn read(library: &Path, options: &Options, inflight: &InFlight) -> Result<Reading, InitError> {
    let started = Instant::now();
    let nvml = init(library, inflight)?;
    log::trace!("loading and initialising NVML took {:?}", started.elapsed());

    inflight.enter(Scope::Host, "nvmlDeviceGetCount_v2");
    let count = nvml
        .device_count()
        .map_err(|e| InitError::from_nvml("nvmlDeviceGetCount_v2", &e))?;
    inflight.leave();
    if count > MAX_GPUS {
        return Err(InitError {
            reason: Reason::Unknown,
            detail: format!(
                "nvmlDeviceGetCount_v2 returned {count}, more GPUs than any host has \
                 ({MAX_GPUS}); NVML is not answering sensibly"
            ),
        });
    }

    // Without this function no GPU can be read at all: a library that lacks it
    // is unusable (a collector error), not a host whose GPUs are all down.
    if count > 0 {
        if let Err(e) = nvml_sym(nvml.lib().nvmlDeviceGetHandleByIndex_v2.as_ref()) {
            return Err(InitError::from_nvml("nvmlDeviceGetHandleByIndex_v2", &e));
        }
    }
    let (info, driver_version) = driver_info(&nvml, inflight);
    let host = vec![info];
    let options = &if driver_version == options.memory_driver {
        options.clone()
    } else {
        if !options.memory.is_empty() {
            log::info!(
                "the driver changed ({} -> {driver_version}): using only the boot's \
                 running totals of the previous run's memory",
                options.memory_driver
            );
        }
        let boot_only = options
            .memory
            .iter()
            .map(|(uuid, entries)| {
                let kept = entries
                    .iter()
                    .filter(|(key, _)| key.starts_with(crate::state::BOOT_PREFIX))
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect();
                (uuid.clone(), kept)
            })
            .collect();
        Options {
            memory: boot_only,
            ..options.clone()
        }
    };
    log::trace!("count and driver info done at {:?}", started.elapsed());
    if !options.parallel {
        let devices = read_devices_sequentially(&nvml, count, options, inflight);
        log_gpm_changes(&devices, options);
        return Ok(finish(nvml, host, driver_version, devices));
    }
    let devices: Vec<Device> = thread::scope(|scope| {
        let workers: Vec<_> = (0..count)
            .map(|index| {
                let nvml = &nvml;
                thread::Builder::new()
                    .name(format!("gpu{index}"))
                    .spawn_scoped(scope, move || read_device(nvml, index, options, inflight))
            })
            .collect();
        workers
            .into_iter()
            .zip(0..count)
            .map(|(worker, index)| match worker {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| reader::down(index, String::new(), Reason::ExporterBug)),
                Err(e) => {
                    log::warn!("GPU {index}: cannot start a reading thread: {e}");
                    reader::down(index, String::new(), Reason::ExporterResources)
                }
            })
            .collect()
    });
    log_gpm_changes(&devices, options);
    Ok(finish(nvml, host, driver_version, devices))
}

/// Logs, once per reason, the GPUs whose GPM metrics became unavailable in this
/// run: a host without permission for the counters says so when it starts,
/// not every 15 s (`nvidia_gpu_gpm_unavailable` says it every run).
fn log_gpm_changes(devices: &[Device], options: &Options) {
    for why in gpm::Unavailable::ALL {
        let gpus: Vec<String> = devices
            .iter()
            .filter(|d| gpm::remembered(d.remembered.get(gpm::MEMORY_KEY)) == Some(why))
            .filter(|d| {
                let before = options.memory.get(&d.uuid);
                gpm::remembered(before.and_then(|m| m.get(gpm::MEMORY_KEY))) != Some(why)
            })
            .map(|d| d.index.to_string())
            .collect();
        if gpus.is_empty() {
            continue;
        }
        let message = format!(
            "GPM metrics ({}) left out on GPU {}: {}",
            why.label(),
            gpus.join(", "),
            why.hint()
        );
        if why == gpm::Unavailable::Paused {
            log::info!("{message}");
        } else {
            log::warn!("{message}");
        }
    }
}

/// Loads and initialises NVML, naming each step for the watchdog.
///
/// nvml-wrapper's initialisation calls `nvmlInit_v2` and then
/// `nvmlSystemGetDriverVersion`, and either may hang. So `nvmlInit_v2` is called
/// first on a handle of our own (NVML counts initialisations, so the wrapper's
/// second call only raises the count), and a hang is then named exactly.
fn init(library: &Path, inflight: &InFlight) -> Result<Nvml, InitError> {
    inflight.enter(Scope::Host, "nvmlInit_v2");
    // SAFETY: loading a library runs its initialisers; this is the library the
    // user named as NVML, which the wrapper loads the same way below.
    let lib = unsafe { NvmlLib::new(library.as_os_str()) }
        .map_err(|e| InitError::from_nvml("dlopen", &NvmlError::from(e)))?;
    let init =
        nvml_sym(lib.nvmlInit_v2.as_ref()).map_err(|e| InitError::from_nvml("nvmlInit_v2", &e))?;
    // SAFETY: nvmlInit_v2 takes no arguments.
    nvml_try(unsafe { init() }).map_err(|e| InitError::from_nvml("nvmlInit_v2", &e))?;
    // The library stays loaded and initialised until the process ends (see
    // `finish`); dropping the handle would only dlclose our reference.
    std::mem::forget(lib);
    inflight.enter(Scope::Host, "nvmlSystemGetDriverVersion");
    let nvml = Nvml::builder()
        .lib_path(library.as_os_str())
        .init()
        .map_err(|e| InitError::from_nvml("nvmlSystemGetDriverVersion", &e))?;
    inflight.leave();
    Ok(nvml)
}

/// Returns what was read, deliberately without `nvmlShutdown`.
///
/// The process exits right after publishing, and the kernel releases NVML's
/// driver handles with its file descriptors; `nvmlShutdown` only repeats that
/// work, and measured 4-9 ms of a 60 ms run on an H200. So the library is left
/// initialised (and loaded) until the process ends.
fn finish(nvml: Nvml, host: Vec<Sample>, driver_version: String, devices: Vec<Device>) -> Reading {
    std::mem::forget(nvml);
    Reading {
        host,
        driver_version,
        devices,
    }
}

/// `nvidia_gpu_driver_info`, with the labels NVML could tell, and the driver
/// version alone.
fn driver_info(nvml: &Nvml, inflight: &InFlight) -> (Sample, String) {
    let mut sample = Sample::new(&metrics::DRIVER_INFO, 1.0);
    let host_read = |call: &'static str, read: &dyn Fn() -> Result<String, NvmlError>| {
        inflight.enter(Scope::Host, call);
        let value = read();
        inflight.leave();
        match value {
            Ok(value) => Some(value),
            Err(e) => {
                log::debug!("{call}: {e}");
                None
            }
        }
    };
    let driver = host_read("nvmlSystemGetDriverVersion", &|| nvml.sys_driver_version());
    let cuda = host_read("nvmlSystemGetCudaDriverVersion_v2", &|| {
        nvml.sys_cuda_driver_version()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
    });
    let nvml_version = host_read("nvmlSystemGetNVMLVersion", &|| nvml.sys_nvml_version());
    let driver_version = driver.clone().unwrap_or_default();
    for (name, value) in [
        ("driver_version", driver),
        ("cuda_version", cuda),
        ("nvml_version", nvml_version),
    ] {
        // Always written, empty when unreadable: the series keeps its labels.
        sample = sample.with(name, value.unwrap_or_default());
    }
    (sample, driver_version)
}

/// Reads one GPU; never fails: a GPU that cannot be read is returned down.
fn read_device(nvml: &Nvml, index: u32, options: &Options, inflight: &InFlight) -> Device {
    let device = match handle(nvml, index, inflight) {
        Ok(device) => device,
        Err(why) => return reader::down(index, String::new(), why),
    };
    let mut started = start_device(&device, index, options, inflight);
    started.read_in_window(options);
    started.finish()
}

/// Reads the GPUs one after another, but with their GPM windows open together:
/// every GPU's first GPM sample, then every GPU's other reads, then every
/// window's end, so that N GPUs cost one window, not N.
fn read_devices_sequentially(
    nvml: &Nvml,
    count: u32,
    options: &Options,
    inflight: &InFlight,
) -> Vec<Device> {
    let handles: Vec<Result<_, Reason>> = (0..count)
        .map(|index| handle(nvml, index, inflight))
        .collect();
    let mut started: Vec<Result<Started<'_>, Reason>> = handles
        .iter()
        .zip(0..count)
        .map(|(handle, index)| match handle {
            Ok(device) => Ok(start_device(device, index, options, inflight)),
            Err(why) => Err(*why),
        })
        .collect();
    for device in started.iter_mut().flatten() {
        device.read_in_window(options);
    }
    started
        .into_iter()
        .zip(0..count)
        .map(|(device, index)| match device {
            Ok(device) => device.finish(),
            Err(why) => reader::down(index, String::new(), why),
        })
        .collect()
}

/// The handle of GPU `index`, or why the GPU is down.
fn handle<'n>(nvml: &'n Nvml, index: u32, inflight: &InFlight) -> Result<NvmlDevice<'n>, Reason> {
    inflight.enter(Scope::Gpu(index), "nvmlDeviceGetHandleByIndex_v2");
    let handle = nvml.device_by_index(index);
    inflight.leave();
    handle.map_err(|e| {
        log::warn!("GPU {index}: nvmlDeviceGetHandleByIndex_v2: {e}; reporting it down");
        reason(&e)
    })
}

/// A GPU whose identity is read and whose GPM window is open.
struct Started<'n> {
    reader: reader::DeviceReader<'n>,
    uuid: String,
    identity: identity::Identity,
    /// The windowed collector, if it is on: run by [`Started::finish`].
    windowed: Option<&'static Collector>,
}

/// Reads the identity of a GPU and opens its GPM window (with the gpm
/// collector): its first sample is taken before any other reading.
fn start_device<'n>(
    device: &'n NvmlDevice<'n>,
    index: u32,
    options: &Options,
    inflight: &'n InFlight,
) -> Started<'n> {
    let mut reader = reader::DeviceReader::new(device, index, inflight);
    // A UUID that cannot be read does not stop the reading: the GPU is still
    // reported (and a previous file may supply the UUID); a fatal error marks
    // it down through the reader as for any other call.
    let uuid = reader
        .read_string("nvmlDeviceGetUUID", |lib| {
            nvml_sym(lib.nvmlDeviceGetUUID.as_ref())
        })
        .unwrap_or_default();
    let identity = identity::read(&mut reader);
    // A GPU whose UUID cannot be read this run continues the running totals
    // of the GPU this boot knew at its bus id; without them its counters
    // would restart from zero within a boot.
    let known_as = if uuid.is_empty() {
        options
            .known
            .iter()
            .find(|k| k.is_at(&identity.pci_bus_id, &identity.serial))
            .map(|k| k.uuid.as_str())
    } else {
        Some(uuid.as_str())
    };
    if let Some(memory) = known_as.and_then(|uuid| options.memory.get(uuid)) {
        reader.recall_from(memory.clone());
    }
    if options.collectors.iter().any(|c| windowed(c)) {
        gpm::open(&mut reader, &options.gpm);
    }
    Started {
        reader,
        uuid,
        identity,
        windowed: None,
    }
}

/// The collector whose reader closes a window opened in [`start_device`].
fn windowed(collector: &Collector) -> bool {
    collector.name == gpm::COLLECTOR
}

impl Started<'_> {
    /// Runs every collector but the windowed one.
    fn read_in_window(&mut self, options: &Options) {
        let reader = &mut self.reader;
        let mut fields: Vec<u32> = options
            .collectors
            .iter()
            .flat_map(|collector| collector.fields)
            .copied()
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
        for collector in options.collectors.iter().filter(|c| !windowed(c)) {
            if let registry::Read::Device(read) = collector.read {
                read(reader);
            }
        }
        self.windowed = options.collectors.iter().copied().find(|c| windowed(c));
    }

    /// Runs the windowed collector (it waits for the window's end) and returns
    /// the GPU's readings.
    fn finish(mut self) -> Device {
        if let Some(registry::Read::Device(read)) = self.windowed.map(|c| c.read) {
            read(&mut self.reader);
        }
        self.reader.finish(self.uuid, self.identity)
    }
}
