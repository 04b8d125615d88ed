//! NVML field values: several readings, possibly per scope (NVLink link), in
//! one call.

use std::mem;

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::FieldIdScheme;
use nvml_wrapper_sys::bindings::{
    self as sys, nvmlDevice_t, nvmlFieldValue_t, nvmlValueType_t, nvmlValue_t,
};

use crate::record;

/// The id in the bindings' numbering; the scope a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub id: u32,
    pub scope: u32,
}

/// Drivers from 580.82 renumbered ids 251-273 (NVML reference, "Known issues").
pub fn driver_id(scheme: FieldIdScheme, id: u32) -> u32 {
    match (scheme, id) {
        (FieldIdScheme::V12, id) => id,
        (FieldIdScheme::V13Update1, 251..=255) => id + 18,
        (FieldIdScheme::V13Update1, 256..=273) => id - 5,
        (FieldIdScheme::V13Update1, id) => id,
    }
}

/// An undocumented value type is `UnexpectedVariant`; no fields, no call.
pub(crate) fn fetch(
    getter: getter!(i32, *mut nvmlFieldValue_t),
    handle: nvmlDevice_t,
    scheme: FieldIdScheme,
    fields: &[Field],
) -> Result<Vec<Result<f64, NvmlError>>, NvmlError> {
    if fields.is_empty() {
        return Ok(Vec::new());
    }
    let mut values: Vec<nvmlFieldValue_t> = fields
        .iter()
        .map(|field| nvmlFieldValue_t {
            fieldId: driver_id(scheme, field.id),
            scopeId: field.scope,
            // SAFETY: nvmlFieldValue_t is plain old data; all-zero is valid.
            ..unsafe { mem::zeroed() }
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: a live handle, and the entries with their count.
    let code = getter.map(|getter| unsafe { getter(handle, count, values.as_mut_ptr()) });
    record::answered(handle, &values, &code);
    nvml_try(code?)?;
    Ok(values
        .iter()
        .map(|value| {
            nvml_try(value.nvmlReturn)?;
            number(value.valueType, &value.value)
                .ok_or(NvmlError::UnexpectedVariant(value.valueType))
        })
        .collect())
}

/// `None` for a type other than double and the signed and unsigned ints.
pub(super) fn number(value_type: nvmlValueType_t, value: &nvmlValue_t) -> Option<f64> {
    // SAFETY: `value_type` says which union member NVML wrote.
    unsafe {
        match value_type {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE => Some(value.dVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(f64::from(value.uiVal)),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(value.ulVal as f64),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(value.ullVal as f64),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => Some(value.sllVal as f64),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => Some(f64::from(value.siVal)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings::field_id::{
        NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
        NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, NVML_FI_PWR_SMOOTHING_ENABLED,
    };

    #[test]
    fn drivers_from_580_82_answer_the_clock_event_times_at_269_to_271() {
        let new = FieldIdScheme::V13Update1;
        assert_eq!(
            driver_id(new, NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN),
            269
        );
        assert_eq!(
            driver_id(new, NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN),
            271
        );
        assert_eq!(driver_id(new, NVML_FI_PWR_SMOOTHING_ENABLED), 251);
        for id in [1, 91, 193, 250, 274] {
            assert_eq!(driver_id(new, id), id);
        }
        for id in 0..300 {
            assert_eq!(driver_id(FieldIdScheme::V12, id), id);
        }
    }
}
