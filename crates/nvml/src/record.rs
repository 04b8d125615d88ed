//! A recorder of NVML's answers for the capture tool (tests/nvml-capture): set
//! once, it sees every `nvmlDeviceGetFieldValues` call the process makes, each
//! entry as NVML wrote it, so that a capture holds the answers to the calls a
//! run makes. The exporter sets none.

use std::sync::OnceLock;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlFieldValue_t,
    nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND as FUNCTION_NOT_FOUND, nvmlReturn_t,
};

/// Called with the device, the entries (as sent where the call failed) and
/// the call's return code (FUNCTION_NOT_FOUND where the library lacks it).
pub type FieldValues = fn(nvmlDevice_t, &[nvmlFieldValue_t], nvmlReturn_t);

static FIELD_VALUES: OnceLock<FieldValues> = OnceLock::new();

/// Sets the recorder of the field-value calls; false if one was set before.
pub fn field_values(recorder: FieldValues) -> bool {
    FIELD_VALUES.set(recorder).is_ok()
}

/// `code`: what the call returned, or why it could not be made (the lookup).
pub(crate) fn answered(
    device: nvmlDevice_t,
    values: &[nvmlFieldValue_t],
    code: &Result<nvmlReturn_t, NvmlError>,
) {
    if let Some(recorder) = FIELD_VALUES.get() {
        let code = *code.as_ref().unwrap_or(&FUNCTION_NOT_FOUND);
        recorder(device, values, code);
    }
}
