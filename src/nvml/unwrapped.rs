//! The NVML functions nvml-wrapper does not wrap, or wraps lossily (strings
//! that must survive invalid UTF-8, enum values newer than it knows), as typed
//! reads of [`DeviceReader`] under its error policy. With `fields`, `samples`
//! and `mig`, the only code that calls NVML's C functions itself: the
//! collectors forbid `unsafe`.

use std::ffi::{c_char, c_uint, c_ulonglong, CStr};

use nvml_wrapper::enum_wrappers::device::{Brand, ComputeMode, PerformanceState};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlMarginTemperature_t, nvmlReturn_t, NvmlLib};

use super::reader::DeviceReader;

/// A string NVML keeps of a GPU.
#[derive(Debug, Clone, Copy)]
pub enum Text {
    Uuid,
    Name,
    Serial,
    VbiosVersion,
}

/// Clock event reasons: those holding the clocks now, or those the GPU can report.
#[derive(Debug, Clone, Copy)]
pub enum EventReasons {
    Current,
    Supported,
}

/// An engine read like the decoder: percent busy over its last sampling period.
#[derive(Debug, Clone, Copy)]
pub enum Accelerator {
    /// The JPEG decoders (NVJPG).
    Jpeg,
    /// The optical flow accelerator (OFA).
    OpticalFlow,
}

/// `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for the GPU's next reset.
    pub pending: bool,
    /// A remapping failed.
    pub failure: bool,
}

/// An NVML enum read through a getter that writes one C unsigned int.
pub trait NvmlEnum: TryFrom<c_uint, Error = NvmlError> {
    const CALL: &'static str;
    fn getter(lib: &NvmlLib) -> Result<&EnumGetter, NvmlError>;
}

/// The name of NVML function `$name` and its lookup.
macro_rules! symbol {
    ($name:ident) => {
        (stringify!($name), |lib| nvml_sym(lib.$name.as_ref()))
    };
}

macro_rules! nvml_enums {
    ($($type:ty => $symbol:ident;)*) => {$(
        impl NvmlEnum for $type {
            const CALL: &'static str = stringify!($symbol);
            fn getter(lib: &NvmlLib) -> Result<&EnumGetter, NvmlError> {
                nvml_sym(lib.$symbol.as_ref())
            }
        }
    )*};
}

nvml_enums! {
    Brand => nvmlDeviceGetBrand;
    DeviceArchitecture => nvmlDeviceGetArchitecture;
    PerformanceState => nvmlDeviceGetPerformanceState;
    ComputeMode => nvmlDeviceGetComputeMode;
}

impl<'n> DeviceReader<'n> {
    /// One of the GPU's strings, invalid UTF-8 decoded lossily instead of
    /// failing, so a hostile or corrupted string cannot hide a GPU.
    pub fn text(&mut self, text: Text) -> Option<String> {
        let (call, symbol): (_, Symbol<StringGetter>) = match text {
            Text::Uuid => symbol!(nvmlDeviceGetUUID),
            Text::Name => symbol!(nvmlDeviceGetName),
            Text::Serial => symbol!(nvmlDeviceGetSerial),
            Text::VbiosVersion => symbol!(nvmlDeviceGetVbiosVersion),
        };
        self.read_raw(call, |lib, handle| c_string(symbol(lib)?, handle))
    }

    /// Reads an enum, converted with nvml-wrapper's `TryFrom`. Only the return
    /// code goes through the error policy (so a return code newer than
    /// nvml-wrapper is a counted error); a value newer than nvml-wrapper knows
    /// is `Some(Err(raw))`, for the caller to label as unknown.
    pub fn read_enum<E: NvmlEnum>(&mut self) -> Option<Result<E, c_uint>> {
        let raw = self.read_raw(E::CALL, |lib, handle| {
            let getter = E::getter(lib)?;
            let mut value: c_uint = 0;
            // SAFETY: the getter writes one C enum (an unsigned int) through the pointer.
            nvml_try(unsafe { getter(handle, &mut value) })?;
            Ok(value)
        })?;
        Some(E::try_from(raw).map_err(|_| {
            log::debug!(
                "GPU {}: {}: value {raw} is newer than this exporter",
                self.index(),
                E::CALL
            );
            raw
        }))
    }

    /// The clock event reason bits (`nvmlClocksEventReason*`), through the
    /// deprecated `*ClocksThrottleReasons` names on drivers older than R535.
    pub fn clocks_event_reasons(&mut self, which: EventReasons) -> Option<u64> {
        let (call, symbol): (_, Symbol<MaskGetter>) = match which {
            EventReasons::Current => ("nvmlDeviceGetCurrentClocksEventReasons", |lib| {
                let symbol = lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref();
                nvml_sym(symbol.or(lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref()))
            }),
            EventReasons::Supported => ("nvmlDeviceGetSupportedClocksEventReasons", |lib| {
                let symbol = lib.nvmlDeviceGetSupportedClocksEventReasons.as_ref();
                nvml_sym(symbol.or(lib.nvmlDeviceGetSupportedClocksThrottleReasons.as_ref()))
            }),
        };
        self.read_raw(call, |lib, handle| {
            let get = symbol(lib)?;
            let mut mask = 0;
            // SAFETY: NVML writes one u64 through the pointer.
            nvml_try(unsafe { get(handle, &mut mask) })?;
            Ok(mask)
        })
    }

    /// Percent busy over the engine's last sampling period (driver 535+).
    pub fn accelerator_percent(&mut self, engine: Accelerator) -> Option<u32> {
        let (call, symbol): (_, Symbol<AcceleratorGetter>) = match engine {
            Accelerator::Jpeg => symbol!(nvmlDeviceGetJpgUtilization),
            Accelerator::OpticalFlow => symbol!(nvmlDeviceGetOfaUtilization),
        };
        self.read_raw(call, |lib, handle| {
            let get = symbol(lib)?;
            let (mut percent, mut period_us): (c_uint, c_uint) = (0, 0);
            // SAFETY: two valid out-pointers.
            nvml_try(unsafe { get(handle, &mut percent, &mut period_us) })?;
            Ok(percent)
        })
    }

    /// The thermal margin (T.Limit) in °C, from `nvmlDeviceGetMarginTemperature`
    /// (driver 555+).
    pub fn margin_temperature(&mut self) -> Option<i32> {
        /// `NVML_STRUCT_VERSION(MarginTemperature, 1)`.
        const VERSION_1: u32 = std::mem::size_of::<nvmlMarginTemperature_t>() as u32 | (1 << 24);
        self.read_raw("nvmlDeviceGetMarginTemperature", |lib, handle| {
            let get = nvml_sym(lib.nvmlDeviceGetMarginTemperature.as_ref())?;
            let mut info = nvmlMarginTemperature_t {
                version: VERSION_1,
                marginTemperature: 0,
            };
            // SAFETY: one valid out-pointer to a struct of the version it names.
            nvml_try(unsafe { get(handle, &mut info) })?;
            Ok(info.marginTemperature)
        })
    }

    /// The rows remapped in HBM (Ampere and newer).
    pub fn remapped_rows(&mut self) -> Option<RemappedRows> {
        self.read_raw("nvmlDeviceGetRemappedRows", |lib, handle| {
            let get = nvml_sym(lib.nvmlDeviceGetRemappedRows.as_ref())?;
            let [mut a, mut b, mut c, mut d]: [c_uint; 4] = [0; 4];
            // SAFETY: four valid out-pointers.
            nvml_try(unsafe { get(handle, &mut a, &mut b, &mut c, &mut d) })?;
            Ok(RemappedRows {
                correctable: a,
                uncorrectable: b,
                pending: c != 0,
                failure: d != 0,
            })
        })
    }

    /// Like [`DeviceReader::read`], but hands `read` the raw library and handle.
    pub(super) fn read_raw<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlLib, nvmlDevice_t) -> Result<T, NvmlError>,
    ) -> Option<T> {
        // SAFETY: the handle stays valid while the reader's device (and so NVML) lives.
        self.read(call, |device| unsafe {
            read(device.nvml().lib(), device.handle())
        })
    }

    /// Like [`DeviceReader::try_read`], but hands `read` the raw library and
    /// handle: for calls whose errors are partly answers (NOT_FOUND meaning
    /// "no new samples").
    pub(super) fn try_read_raw<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlLib, nvmlDevice_t) -> Result<T, NvmlError>,
    ) -> Option<Result<T, NvmlError>> {
        // SAFETY: the handle stays valid while the reader's device (and so NVML) lives.
        self.try_read(call, |device| unsafe {
            read(device.nvml().lib(), device.handle())
        })
    }
}

/// Looks up one NVML function in the loaded library.
type Symbol<F> = fn(&NvmlLib) -> Result<&F, NvmlError>;

/// The signature shared by NVML's getters of one enum value.
pub type EnumGetter = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;

/// The signature of the clock event reason getters.
type MaskGetter = unsafe extern "C" fn(nvmlDevice_t, *mut c_ulonglong) -> nvmlReturn_t;

/// The signature of `nvmlDeviceGetJpgUtilization` and `…OfaUtilization`.
type AcceleratorGetter =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut c_uint) -> nvmlReturn_t;

/// The signature shared by NVML's string getters (name, UUID, serial, ...).
type StringGetter = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;

/// Large enough for every NVML string (the longest documented buffer is 96 bytes).
const STRING_BUFFER: usize = 256;

/// Calls a string getter on `handle` with the one buffer size every string is
/// read with, decoding invalid UTF-8 lossily.
pub(super) fn c_string(getter: &StringGetter, handle: nvmlDevice_t) -> Result<String, NvmlError> {
    let mut buffer = [0 as c_char; STRING_BUFFER];
    // SAFETY: the buffer's length is passed; NVML NUL-terminates within it.
    nvml_try(unsafe { getter(handle, buffer.as_mut_ptr(), STRING_BUFFER as c_uint) })?;
    // SAFETY: NVML returned success, so the buffer holds a C string.
    let text = unsafe { CStr::from_ptr(buffer.as_ptr()) };
    Ok(text.to_string_lossy().into_owned())
}
