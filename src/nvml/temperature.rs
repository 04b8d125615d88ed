//! The GPU's temperature from `nvmlDeviceGetTemperatureV` (NVML 12.5+), the
//! call NVML 13 keeps, or from `nvmlDeviceGetTemperature`, which NVML 13
//! deprecates, on drivers without it. A driver with neither costs only this
//! reading.

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU, nvmlTemperature_v1_t, NvmlLib,
};

use super::reader::DeviceReader;

/// `NVML_STRUCT_VERSION(Temperature, 1)`.
const VERSION_1: u32 = std::mem::size_of::<nvmlTemperature_v1_t>() as u32 | (1 << 24);

/// NVML_ERROR_ARGUMENT_VERSION_MISMATCH, which nvml-wrapper 0.13 does not name.
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

fn read_v(lib: &NvmlLib, handle: nvmlDevice_t) -> Result<i32, NvmlError> {
    let get = nvml_sym(lib.nvmlDeviceGetTemperatureV.as_ref())?;
    let mut info = nvmlTemperature_v1_t {
        version: VERSION_1,
        sensorType: nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
        temperature: 0,
    };
    // SAFETY: one valid out-pointer to a struct of the version it names.
    nvml_try(unsafe { get(handle, &mut info) })?;
    Ok(info.temperature)
}

impl DeviceReader<'_> {
    /// The GPU die temperature in °C; `None` where neither call answers (not
    /// supported, failed: counted once) or the GPU is down.
    pub fn gpu_temperature(&mut self) -> Option<f64> {
        const CALL: &str = "nvmlDeviceGetTemperatureV";
        match self.try_read_raw(CALL, read_v)? {
            Ok(celsius) => return Some(f64::from(celsius)),
            // An older driver: no such symbol, or a struct version it does not know.
            Err(NvmlError::FailedToLoadSymbol(_))
            | Err(NvmlError::FunctionNotFound)
            | Err(NvmlError::UnexpectedVariant(ARGUMENT_VERSION_MISMATCH)) => {}
            Err(error) => {
                self.note(CALL, &error);
                return None;
            }
        }
        self.read("nvmlDeviceGetTemperature", |d| {
            d.temperature(TemperatureSensor::Gpu)
        })
        .map(f64::from)
    }
}
