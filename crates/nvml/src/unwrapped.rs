//! The NVML functions nvml-wrapper does not wrap, or wraps lossily (invalid
//! UTF-8, enum values newer than it knows, the pre-R535 clock event reasons).

use std::ffi::{c_char, c_uint, c_ulonglong};

use nvml_wrapper::enum_wrappers::device::{
    Brand, ComputeMode, PerformanceState, TemperatureSensor,
};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::{nvml_sym, NvmlError};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMarginTemperature_t, nvmlReturn_t,
    nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU, nvmlTemperature_v1_t, NvmlLib,
};

use super::{raw, struct_version, DeviceReader, Error, ARGUMENT_VERSION_MISMATCH};

#[derive(Debug, Clone, Copy)]
pub enum Text {
    Uuid,
    Name,
    Serial,
    VbiosVersion,
}

/// Those holding the clocks now, or those the GPU can report.
#[derive(Debug, Clone, Copy)]
pub enum EventReasons {
    Current,
    Supported,
}

/// An engine read like the decoder.
#[derive(Debug, Clone, Copy)]
pub enum Accelerator {
    Jpeg,
    OpticalFlow,
}

#[derive(Debug, Clone, Copy)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for the GPU's next reset.
    pub pending: bool,
    /// A remapping failed.
    pub failure: bool,
}

pub trait NvmlEnum: TryFrom<c_uint, Error = NvmlError> {
    const GETTER: (&'static str, Symbol<UintGetter>);
}

macro_rules! nvml_enums {
    ($($type:ty => $symbol:ident;)*) => {$(
        impl NvmlEnum for $type {
            const GETTER: (&'static str, Symbol<UintGetter>) = symbol!($symbol);
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
    /// Decoded lossily, so a hostile or corrupted string cannot hide a GPU.
    pub fn text(&mut self, text: Text) -> Option<String> {
        let (call, symbol): (_, Symbol<StringGetter>) = match text {
            Text::Uuid => symbol!(nvmlDeviceGetUUID),
            Text::Name => symbol!(nvmlDeviceGetName),
            Text::Serial => symbol!(nvmlDeviceGetSerial),
            Text::VbiosVersion => symbol!(nvmlDeviceGetVbiosVersion),
        };
        self.read_raw(call, |lib, handle| c_string(symbol(lib), handle))
    }

    /// A value newer than nvml-wrapper knows is `Some(Err(raw))`.
    pub fn read_enum<E: NvmlEnum>(&mut self) -> Option<Result<E, c_uint>> {
        let (call, symbol) = E::GETTER;
        let raw = self.read_raw(call, |lib, handle| {
            let mut value: c_uint = 0;
            raw_call!(symbol(lib), handle, &mut value).map(|()| value)
        })?;
        let index = self.index();
        Some(E::try_from(raw).map_err(|_| {
            log::debug!("GPU {index}: {call}: value {raw} is newer than this exporter");
            raw
        }))
    }

    /// Through the deprecated `*ClocksThrottleReasons` names before R535.
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
            let mut mask = 0;
            raw_call!(symbol(lib), handle, &mut mask).map(|()| mask)
        })
    }

    /// Percent busy over the engine's last sampling period (driver 535+).
    pub fn accelerator_percent(&mut self, engine: Accelerator) -> Option<u32> {
        let (call, symbol): (_, Symbol<AcceleratorGetter>) = match engine {
            Accelerator::Jpeg => symbol!(nvmlDeviceGetJpgUtilization),
            Accelerator::OpticalFlow => symbol!(nvmlDeviceGetOfaUtilization),
        };
        self.read_raw(call, |lib, handle| {
            let (mut percent, mut period_us): (c_uint, c_uint) = (0, 0);
            raw_call!(symbol(lib), handle, &mut percent, &mut period_us).map(|()| percent)
        })
    }

    /// T.Limit in °C (driver 555+).
    pub fn margin_temperature(&mut self) -> Option<i32> {
        self.read_raw("nvmlDeviceGetMarginTemperature", |lib, handle| {
            let mut info = nvmlMarginTemperature_t {
                version: struct_version::<nvmlMarginTemperature_t>(1),
                marginTemperature: 0,
            };
            raw_call!(lib.nvmlDeviceGetMarginTemperature(handle, &mut info))
                .map(|()| info.marginTemperature)
        })
    }

    /// °C, from the deprecated `nvmlDeviceGetTemperature` where the driver
    /// lacks `nvmlDeviceGetTemperatureV` (NVML 12.5+) or its struct version.
    pub fn gpu_temperature(&mut self) -> Option<f64> {
        const CALL: &str = "nvmlDeviceGetTemperatureV";
        let answer = self.try_read_raw(CALL, |lib, handle| {
            let mut info = nvmlTemperature_v1_t {
                version: struct_version::<nvmlTemperature_v1_t>(1),
                sensorType: nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
                temperature: 0,
            };
            raw_call!(lib.nvmlDeviceGetTemperatureV(handle, &mut info)).map(|()| info.temperature)
        })?;
        match answer {
            Ok(celsius) => return Some(f64::from(celsius)),
            Err(NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound) => {}
            Err(NvmlError::UnexpectedVariant(ARGUMENT_VERSION_MISMATCH)) => {}
            Err(error) => {
                self.note(&Error::new(CALL, error));
                return None;
            }
        }
        let sensor = TemperatureSensor::Gpu;
        self.read_by("nvmlDeviceGetTemperature", |d| d.temperature(sensor))
            .map(f64::from)
    }

    /// Ampere and newer.
    pub fn remapped_rows(&mut self) -> Option<RemappedRows> {
        self.read_raw("nvmlDeviceGetRemappedRows", |lib, handle| {
            let [mut a, mut b, mut c, mut d]: [c_uint; 4] = [0; 4];
            raw_call!(lib.nvmlDeviceGetRemappedRows(handle, &mut a, &mut b, &mut c, &mut d))?;
            Ok(RemappedRows {
                correctable: a,
                uncorrectable: b,
                pending: c != 0,
                failure: d != 0,
            })
        })
    }

    /// [`DeviceReader::read`] of the raw library and handle.
    pub(crate) fn read_raw<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlLib, nvmlDevice_t) -> Result<T, NvmlError>,
    ) -> Option<T> {
        self.read_by(call, |device| raw(device, read))
    }

    /// [`DeviceReader::try_read`] of the raw library and handle.
    pub(crate) fn try_read_raw<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlLib, nvmlDevice_t) -> Result<T, NvmlError>,
    ) -> Option<Result<T, NvmlError>> {
        self.attempt(call, |device| raw(device, read))
    }
}

pub type Symbol<F> = fn(&NvmlLib) -> Result<&F, NvmlError>;

pub type UintGetter = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;
type MaskGetter = unsafe extern "C" fn(nvmlDevice_t, *mut c_ulonglong) -> nvmlReturn_t;
type AcceleratorGetter =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut c_uint) -> nvmlReturn_t;
type StringGetter = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;

/// Large enough for every NVML string (the longest documented buffer is 96 bytes).
const STRING_BUFFER: c_uint = 256;

/// Decodes invalid UTF-8 lossily.
pub(super) fn c_string(
    getter: Result<&StringGetter, NvmlError>,
    handle: nvmlDevice_t,
) -> Result<String, NvmlError> {
    let mut buffer = [0u8; STRING_BUFFER as usize];
    raw_call!(getter, handle, buffer.as_mut_ptr().cast(), STRING_BUFFER)?;
    let text = buffer.split(|&byte| byte == 0).next().unwrap_or_default();
    Ok(String::from_utf8_lossy(text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A string getter that writes `SAMPLE` and checks the length it is given.
    unsafe extern "C" fn getter(
        _: nvmlDevice_t,
        text: *mut c_char,
        length: c_uint,
    ) -> nvmlReturn_t {
        const SAMPLE: &[u8] = b"GPU-\xff\xfe\0ignored";
        assert_eq!(length, STRING_BUFFER);
        // SAFETY: the caller's buffer holds `length` bytes, more than SAMPLE.
        unsafe { std::ptr::copy_nonoverlapping(SAMPLE.as_ptr(), text.cast(), SAMPLE.len()) };
        0
    }

    #[test]
    fn strings_end_at_the_first_nul_and_invalid_utf8_is_replaced() {
        let handle = std::ptr::null_mut();
        let text = c_string(Ok(&(getter as StringGetter)), handle);
        assert_eq!(text.ok().as_deref(), Some("GPU-\u{fffd}\u{fffd}"));
        let missing = c_string(Err(NvmlError::FunctionNotFound), handle);
        assert!(matches!(missing, Err(NvmlError::FunctionNotFound)));
    }
}
