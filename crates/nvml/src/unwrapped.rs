//! The NVML functions nvml-wrapper does not wrap, or wraps lossily (invalid
//! UTF-8, enum values newer than it knows, the pre-R535 clock event reasons).

use std::ffi::{c_char, c_uint};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMarginTemperature_t, nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
    nvmlTemperature_v1_t,
};

use super::{out, struct_version};

/// A value newer than nvml-wrapper knows is `Err(raw)`.
pub type Known<E> = Result<E, c_uint>;

#[derive(Debug, Clone, Copy)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for the GPU's next reset.
    pub pending: bool,
    /// A remapping failed.
    pub failure: bool,
}

pub(crate) fn known<E: TryFrom<c_uint>>(
    getter: getter!(*mut c_uint),
    handle: nvmlDevice_t,
) -> Result<Known<E>, NvmlError> {
    let raw = out(getter, handle, 0)?;
    Ok(E::try_from(raw).map_err(|_| raw))
}

pub(crate) fn engine_percent(
    getter: getter!(*mut c_uint, *mut c_uint),
    handle: nvmlDevice_t,
) -> Result<u32, NvmlError> {
    let (mut percent, mut period_us): (c_uint, c_uint) = (0, 0);
    raw_call!(getter?, handle, &mut percent, &mut period_us).map(|()| percent)
}

pub(crate) fn margin_temperature(
    getter: getter!(*mut nvmlMarginTemperature_t),
    handle: nvmlDevice_t,
) -> Result<i32, NvmlError> {
    let info = nvmlMarginTemperature_t {
        version: struct_version::<nvmlMarginTemperature_t>(1),
        marginTemperature: 0,
    };
    out(getter, handle, info).map(|info| info.marginTemperature)
}

pub(crate) fn temperature(
    getter: getter!(*mut nvmlTemperature_v1_t),
    handle: nvmlDevice_t,
) -> Result<i32, NvmlError> {
    let info = nvmlTemperature_v1_t {
        version: struct_version::<nvmlTemperature_v1_t>(1),
        sensorType: nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
        temperature: 0,
    };
    out(getter, handle, info).map(|info| info.temperature)
}

pub(crate) fn remapped_rows(
    getter: getter!(*mut c_uint, *mut c_uint, *mut c_uint, *mut c_uint),
    handle: nvmlDevice_t,
) -> Result<RemappedRows, NvmlError> {
    let [mut a, mut b, mut c, mut d]: [c_uint; 4] = [0; 4];
    raw_call!(getter?, handle, &mut a, &mut b, &mut c, &mut d)?;
    Ok(RemappedRows {
        correctable: a,
        uncorrectable: b,
        pending: c != 0,
        failure: d != 0,
    })
}

/// Large enough for every NVML string (the longest documented buffer is 96 bytes).
const STRING_BUFFER: c_uint = 256;

/// Decodes invalid UTF-8 lossily.
pub(crate) fn text(
    getter: getter!(*mut c_char, c_uint),
    handle: nvmlDevice_t,
) -> Result<String, NvmlError> {
    let mut buffer = [0u8; STRING_BUFFER as usize];
    raw_call!(getter?, handle, buffer.as_mut_ptr().cast(), STRING_BUFFER)?;
    Ok(c_text(&buffer))
}

/// The bytes before the first NUL, invalid UTF-8 decoded lossily.
pub(crate) fn c_text(bytes: &[u8]) -> String {
    let text = bytes.split(|&byte| byte == 0).next().unwrap_or_default();
    String::from_utf8_lossy(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings::nvmlReturn_t;

    /// A string getter that writes `SAMPLE` and checks the length it is given.
    unsafe extern "C" fn write_sample(
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
        let getter: unsafe extern "C" fn(_, _, _) -> _ = write_sample;
        let decoded = text(Ok(&getter), handle);
        assert_eq!(decoded.ok().as_deref(), Some("GPU-\u{fffd}\u{fffd}"));
        let missing = text(Err(NvmlError::FunctionNotFound), handle);
        assert!(matches!(missing, Err(NvmlError::FunctionNotFound)));
    }
}
