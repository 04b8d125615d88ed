//! The only code that loads NVML, calls its C functions or holds `unsafe` for
//! it; it knows nothing of the exporter (no metrics, state or output). Every
//! device call is declared once ([`calls`]) and made through [`DeviceReader`].

/// `lib.nvmlName(args)`, or `function, args` for one looked up already.
macro_rules! raw_call {
    ($lib:ident . $name:ident ($($arg:expr),* $(,)?)) => {
        nvml_wrapper::error::nvml_sym($lib.$name.as_ref())
            .and_then(|function| raw_call!(function $(, $arg)*))
    };
    ($function:expr $(, $arg:expr)* $(,)?) => {{
        let function = $function;
        // SAFETY: every call site passes what the function expects: a live handle
        // of the NVML in use, and pointers to what it writes (a buffer, its length).
        nvml_wrapper::error::nvml_try(unsafe { function($($arg),*) })
    }};
}

/// A looked-up NVML function of a handle and `args`, as `symbol!(lib)` gives
/// it.
macro_rules! getter {
    ($($arg:ty),*) => {
        Result<
            &unsafe extern "C" fn(
                nvml_wrapper_sys::bindings::nvmlDevice_t, $($arg),*
            ) -> nvml_wrapper_sys::bindings::nvmlReturn_t,
            nvml_wrapper::error::NvmlError,
        >
    };
}

pub mod calls;
mod error;
pub mod fabric;
pub mod fields;
pub mod health;
mod inflight;
pub mod mig;
mod reader;
pub mod record;
pub mod samples;
pub mod unwrapped;

use std::mem::ManuallyDrop;
use std::path::Path;
use std::time::Instant;

use nvml_wrapper::error::{nvml_sym, NvmlError};
use nvml_wrapper::{Device as NvmlDevice, Nvml};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, NvmlLib};

pub use error::{Code, Error, Failure};
pub use inflight::{InFlight, Scope};
pub use reader::DeviceReader;

pub mod types {
    pub use nvml_wrapper::enum_wrappers::device::{
        Brand, Clock, ComputeMode, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy,
        PerformanceState, RetirementCause, Sampling, TemperatureSensor, TemperatureThreshold,
    };
    pub use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
    pub use nvml_wrapper::enums::device::{DeviceArchitecture, UsedGpuMemory};
    pub use nvml_wrapper::enums::gpm::GpmMetricId;
    pub use nvml_wrapper::struct_wrappers::device::ProcessInfo;
    pub use nvml_wrapper::structs::device::MigMode;
    pub use nvml_wrapper::sys_exports::field_id;
    pub use nvml_wrapper::{Device, GpmSample};
}

/// NVML could not be used at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitError {
    pub failure: Failure,
    /// What NVML or the loader said.
    pub detail: String,
}

impl InitError {
    fn from_nvml(call: &str, error: &NvmlError) -> Self {
        InitError {
            failure: Failure::of(error),
            detail: format!("{call}: {error}"),
        }
    }
}

/// More GPUs than one host holds: a larger count from NVML is a sentinel.
const MAX_GPUS: u32 = 64;

/// The host calls, as the watchdog, the logs and the errors name them.
const INIT: &str = "nvmlInit_v2";
const COUNT: &str = "nvmlDeviceGetCount_v2";
const HANDLE: &str = "nvmlDeviceGetHandleByIndex_v2";
const DRIVER_VERSION: &str = "nvmlSystemGetDriverVersion";

/// `read`, named `call` to the watchdog while it runs.
fn host<T>(
    inflight: &InFlight,
    call: &'static str,
    read: impl FnOnce() -> Result<T, NvmlError>,
) -> Result<T, InitError> {
    let answer = inflight.during(Scope::Host, call, read);
    answer.map_err(|e| InitError::from_nvml(call, &e))
}

/// Never shut down: the process exits right after publishing.
pub struct Session {
    nvml: ManuallyDrop<Nvml>,
    pub versions: Versions,
    /// At most `MAX_GPUS`.
    pub count: u32,
}

impl Session {
    pub fn open(library: &Path, inflight: &InFlight) -> Result<Session, InitError> {
        let started = Instant::now();
        let nvml = init(library, inflight)?;
        log::trace!("loading and initialising NVML took {:?}", started.elapsed());
        let count = host(inflight, COUNT, || nvml.device_count())?;
        if count > MAX_GPUS {
            return Err(InitError {
                failure: Failure::Unknown,
                detail: format!(
                    "{COUNT} returned {count}, more GPUs than any host has \
                     ({MAX_GPUS}); NVML is not answering sensibly"
                ),
            });
        }
        // A library without it is unusable, not a host whose GPUs are all down.
        if count > 0 {
            nvml_sym(nvml.lib().nvmlDeviceGetHandleByIndex_v2.as_ref())
                .map_err(|e| InitError::from_nvml(HANDLE, &e))?;
        }
        let versions = versions(&nvml, inflight);
        Ok(Session {
            nvml: ManuallyDrop::new(nvml),
            versions,
            count,
        })
    }

    pub fn handle(&self, index: u32, inflight: &InFlight) -> Result<NvmlDevice<'_>, Failure> {
        let lookup = || self.nvml.device_by_index(index);
        let handle = inflight.during(Scope::Gpu(index), HANDLE, lookup);
        handle.map_err(|e| {
            log::warn!("GPU {index}: {HANDLE}: {e}; reporting it down");
            Failure::of(&e)
        })
    }
}

/// NVML_ERROR_ARGUMENT_VERSION_MISMATCH, which nvml-wrapper 0.13 does not name.
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

/// `NVML_STRUCT_VERSION(T, version)`: the `version` field of a versioned struct.
const fn struct_version<T>(version: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | (version << 24)
}

/// `getter(handle, &mut value)`: what NVML wrote over `value`.
fn out<S>(getter: getter!(*mut S), handle: nvmlDevice_t, mut value: S) -> Result<S, NvmlError> {
    raw_call!(getter?, handle, &mut value).map(|()| value)
}

fn raw<T>(device: &NvmlDevice<'_>, read: impl FnOnce(&NvmlLib, nvmlDevice_t) -> T) -> T {
    // SAFETY: the handle stays valid while `device` (and so NVML) lives, and
    // goes only to NVML's own functions.
    read(device.nvml().lib(), unsafe { device.handle() })
}

/// `nvmlInit_v2` on a handle of our own, so that the watchdog can name it,
/// then nvml-wrapper's init (it reads the driver version).
fn init(library: &Path, inflight: &InFlight) -> Result<Nvml, InitError> {
    inflight.during(Scope::Host, INIT, || {
        // SAFETY: loading a library runs its initialisers; this is the library
        // the user named as NVML, which the wrapper loads the same way below.
        let lib = unsafe { NvmlLib::new(library.as_os_str()) }
            .map_err(|e| InitError::from_nvml("dlopen", &NvmlError::from(e)))?;
        raw_call!(lib.nvmlInit_v2()).map_err(|e| InitError::from_nvml(INIT, &e))?;
        // Loaded and initialised until the process ends: dropping would only
        // dlclose.
        std::mem::forget(lib);
        Ok(())
    })?;
    host(inflight, DRIVER_VERSION, || {
        Nvml::builder().lib_path(library.as_os_str()).init()
    })
}

/// One NVML cannot tell is empty.
#[derive(Debug, Clone)]
pub struct Versions {
    pub driver: String,
    pub cuda: String,
    pub nvml: String,
}

fn versions(nvml: &Nvml, inflight: &InFlight) -> Versions {
    let host_read = |call: &'static str, read: &dyn Fn() -> Result<String, NvmlError>| {
        host(inflight, call, read)
            .inspect_err(|e| log::debug!("{}", e.detail))
            .unwrap_or_default()
    };
    Versions {
        driver: host_read(DRIVER_VERSION, &|| nvml.sys_driver_version()),
        cuda: host_read("nvmlSystemGetCudaDriverVersion_v2", &|| {
            nvml.sys_cuda_driver_version()
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
        }),
        nvml: host_read("nvmlSystemGetNVMLVersion", &|| nvml.sys_nvml_version()),
    }
}
