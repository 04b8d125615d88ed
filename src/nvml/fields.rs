//! NVML field values (`nvmlDeviceGetFieldValues`): several readings, possibly
//! per scope (NVLink link), in one call.

use std::mem;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlFieldValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE as DOUBLE,
    nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT as SIGNED_INT,
    nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG as SIGNED_LONG_LONG,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT as UNSIGNED_INT,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG as UNSIGNED_LONG,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG as UNSIGNED_LONG_LONG, NvmlLib,
};

/// One requested field: NVML field id and scope id (the link for NVLink fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub id: u32,
    pub scope: u32,
}

/// The NVML function behind every field read.
pub const CALL: &str = "nvmlDeviceGetFieldValues";

/// Reads `fields` in one `nvmlDeviceGetFieldValues` call on `handle`: the
/// call's own error, or one entry per field with that entry's error (a value
/// type NVML did not document is `UnexpectedVariant`). The reader applies its
/// error policy to both (`DeviceReader::read_fields`, `prefetch`).
pub fn fetch(
    lib: &NvmlLib,
    handle: nvmlDevice_t,
    fields: &[Field],
) -> Result<Vec<Result<f64, NvmlError>>, NvmlError> {
    let get = nvml_sym(lib.nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<nvmlFieldValue_t> = fields
        .iter()
        .map(|field| {
            // SAFETY: nvmlFieldValue_t is plain old data; all-zero is valid.
            let mut value: nvmlFieldValue_t = unsafe { mem::zeroed() };
            value.fieldId = field.id;
            value.scopeId = field.scope;
            value
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: `values` holds `count` initialised entries for NVML to fill.
    nvml_try(unsafe { get(handle, count, values.as_mut_ptr()) })?;
    Ok(values
        .iter()
        .map(|value| {
            nvml_try(value.nvmlReturn)?;
            // SAFETY: `valueType` says which union member NVML wrote.
            let number = unsafe {
                match value.valueType {
                    DOUBLE => Some(value.value.dVal),
                    UNSIGNED_INT => Some(f64::from(value.value.uiVal)),
                    UNSIGNED_LONG => Some(value.value.ulVal as f64),
                    UNSIGNED_LONG_LONG => Some(value.value.ullVal as f64),
                    SIGNED_LONG_LONG => Some(value.value.sllVal as f64),
                    SIGNED_INT => Some(f64::from(value.value.siVal)),
                    _ => None,
                }
            };
            number.ok_or(NvmlError::UnexpectedVariant(value.valueType))
        })
        .collect())
}
