//! The NVML session and its error policy: the only code that loads and
//! initialises NVML ([`Session`]) and classifies its errors.
//!
//! Error policy, applied by [`reader::DeviceReader`] to every call a collector
//! makes:
//! - "not supported" (and a symbol the driver lacks) leaves the field out, logged
//!   at debug level only;
//! - an error that means the GPU cannot be read at all ([`device_fatal`]) marks the
//!   GPU down: its readings are dropped and it gets `nvidia_gpu_up 0` with a reason;
//! - any other error leaves the field out, is logged as a warning and is counted
//!   in `nvidia_gpu_collector_read_errors`.
//!
//! Every call is bracketed in [`InFlight`] so a watchdog can name a call that hangs.
//! `fields` (the batched field read), `samples` (sample buffers) and `mig` (MIG
//! enumeration) are the NVML reads that several collectors share; `unwrapped`
//! the functions nvml-wrapper lacks; `facts` is what the info read found of a
//! GPU (its chip) that decides how they read it. Every `unsafe` call into NVML
//! is in this module: the collectors forbid `unsafe`.

pub mod fabric;
pub mod facts;
pub mod fields;
pub mod mig;
pub mod reader;
pub mod samples;
pub mod temperature;
pub mod unwrapped;

use std::mem::ManuallyDrop;
use std::path::Path;
use std::time::Instant;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device as NvmlDevice, Nvml};
use nvml_wrapper_sys::bindings::NvmlLib;

use crate::inflight::{InFlight, Scope};
use crate::metrics;
use crate::reason::Reason;
use crate::snapshot::Sample;

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
pub fn unsupported(error: &NvmlError) -> bool {
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

/// An initialised NVML: the host-wide facts and the GPU count, and handles on
/// request. It is never shut down: the process exits right after publishing,
/// and the kernel releases NVML's driver handles with its file descriptors;
/// `nvmlShutdown` only repeats that work, and measured 4-9 ms of a 60 ms run on
/// an H200.
pub struct Session {
    nvml: ManuallyDrop<Nvml>,
    /// `nvidia_gpu_driver_info`.
    pub host: Vec<Sample>,
    /// The driver version, empty if it could not be read.
    pub driver_version: String,
    /// How many GPUs NVML enumerates (at most [`MAX_GPUS`]).
    pub count: u32,
}

impl Session {
    /// Loads NVML from `library`, initialises it and reads the host-wide facts.
    pub fn open(library: &Path, inflight: &InFlight) -> Result<Session, InitError> {
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
        Ok(Session {
            nvml: ManuallyDrop::new(nvml),
            host: vec![info],
            driver_version,
            count,
        })
    }

    /// The handle of GPU `index`, or why the GPU is down.
    pub fn handle(&self, index: u32, inflight: &InFlight) -> Result<NvmlDevice<'_>, Reason> {
        inflight.enter(Scope::Gpu(index), "nvmlDeviceGetHandleByIndex_v2");
        let handle = self.nvml.device_by_index(index);
        inflight.leave();
        handle.map_err(|e| {
            log::warn!("GPU {index}: nvmlDeviceGetHandleByIndex_v2: {e}; reporting it down");
            reason(&e)
        })
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

/// `nvidia_gpu_driver_info`, with the labels NVML could tell, and the driver
/// version alone.
fn driver_info(nvml: &Nvml, inflight: &InFlight) -> (Sample, String) {
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
    // Always written, empty when unreadable: the series keeps its labels.
    let versions = [driver, cuda, nvml_version].map(Option::unwrap_or_default);
    let sample = metrics::DRIVER_INFO.sample_with(versions, 1.0);
    (sample, driver_version)
}
