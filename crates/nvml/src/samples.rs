//! NVML's utilization sample buffers; what they mean is the caller's.

use std::ffi::c_uint;

use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessUtilizationSample_t, nvmlSample_t, nvmlSamplingType_t,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT as UNSIGNED_SHORT, nvmlValueType_t,
};

use super::fields;

/// Timestamp (µs) and percent.
pub type Point = (u64, u64);

/// Pid, timestamp (µs), SM percent.
pub type ProcessEntry = (u32, u64, u64);

/// Room for more samples than NVML keeps (71 on an H200).
const INITIAL_CAPACITY: c_uint = 256;
/// More samples than any driver keeps: a larger count is not believed.
const MAX_CAPACITY: c_uint = 1 << 16;

/// Grows the buffer while NVML asks for more; NOT_FOUND (nothing new) is an
/// empty answer.
fn fetch_growing<T: Clone>(
    zero: T,
    mut call: impl FnMut(*mut T, &mut c_uint) -> Result<(), NvmlError>,
) -> Result<Vec<T>, NvmlError> {
    let mut capacity = INITIAL_CAPACITY;
    loop {
        let mut buffer = vec![zero.clone(); capacity as usize];
        let mut count = capacity;
        match call(buffer.as_mut_ptr(), &mut count) {
            Ok(()) => {
                buffer.truncate(count.min(capacity) as usize);
                return Ok(buffer);
            }
            Err(NvmlError::NotFound) => return Ok(Vec::new()),
            Err(NvmlError::InsufficientSize(_)) if count > capacity && count <= MAX_CAPACITY => {
                capacity = count;
            }
            Err(error) => return Err(error),
        }
    }
}

pub(crate) fn fetch(
    getter: getter!(
        nvmlSamplingType_t,
        u64,
        *mut nvmlValueType_t,
        *mut c_uint,
        *mut nvmlSample_t
    ),
    handle: nvmlDevice_t,
    sampling: Sampling,
    last_seen: u64,
) -> Result<Vec<Point>, NvmlError> {
    let getter = getter?;
    let mut value_type: nvmlValueType_t = 0;
    // SAFETY: nvmlSample_t is plain data; zero is a valid value.
    let zero: nvmlSample_t = unsafe { std::mem::zeroed() };
    let samples = fetch_growing(zero, |buffer, count| {
        raw_call!(
            getter,
            handle,
            sampling.as_c(),
            last_seen,
            &mut value_type,
            count,
            buffer
        )
    })?;
    let point = |sample: &nvmlSample_t| (sample.timeStamp, percent(value_type, sample));
    Ok(samples.iter().map(point).collect())
}

pub(crate) fn processes(
    getter: getter!(*mut nvmlProcessUtilizationSample_t, *mut c_uint, u64),
    handle: nvmlDevice_t,
    last_seen: u64,
) -> Result<Vec<ProcessEntry>, NvmlError> {
    let getter = getter?;
    // SAFETY: plain data; zero is a valid value.
    let zero: nvmlProcessUtilizationSample_t = unsafe { std::mem::zeroed() };
    let entries = fetch_growing(zero, |buffer, count| {
        raw_call!(getter, handle, buffer, count, last_seen)
    })?;
    let entry = |e: &nvmlProcessUtilizationSample_t| (e.pid, e.timeStamp, u64::from(e.smUtil));
    Ok(entries.iter().map(entry).collect())
}

/// A negative or non-finite value becomes an impossible one, to be rejected.
fn percent(value_type: nvmlValueType_t, sample: &nvmlSample_t) -> u64 {
    let value = match value_type {
        // SAFETY: NVML says which member of the union it wrote.
        UNSIGNED_SHORT => Some(f64::from(unsafe { sample.sampleValue.usVal })),
        _ => fields::number(value_type, &sample.sampleValue),
    };
    match value {
        Some(value) if value.is_finite() && value >= 0.0 => value.round() as u64,
        _ => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_of_any_value_type_is_read_as_percent() {
        // SAFETY: plain data; zero is a valid value.
        let zero: nvmlSample_t = unsafe { std::mem::zeroed() };
        let with = |set: &dyn Fn(&mut nvmlSample_t)| {
            let mut sample = zero;
            set(&mut sample);
            sample
        };
        let double = |v: f64| with(&|s| s.sampleValue.dVal = v);
        assert_eq!(percent(0, &double(41.6)), 42);
        assert_eq!(percent(0, &double(-1.0)), u64::MAX);
        assert_eq!(percent(0, &double(f64::NAN)), u64::MAX);
        assert_eq!(percent(1, &with(&|s| s.sampleValue.uiVal = 37)), 37);
        assert_eq!(percent(2, &with(&|s| s.sampleValue.ulVal = 38)), 38);
        assert_eq!(percent(3, &with(&|s| s.sampleValue.ullVal = 39)), 39);
        assert_eq!(percent(4, &with(&|s| s.sampleValue.sllVal = -3)), u64::MAX);
        assert_eq!(percent(5, &with(&|s| s.sampleValue.siVal = 40)), 40);
        assert_eq!(percent(6, &with(&|s| s.sampleValue.usVal = 41)), 41);
        assert_eq!(percent(7, &with(&|s| s.sampleValue.uiVal = 1)), u64::MAX);
        // A huge value stays impossible, and is logged as the same number.
        let huge = percent(3, &with(&|s| s.sampleValue.ullVal = u64::MAX - 1));
        assert_eq!(huge as f64, (u64::MAX - 1) as f64);
    }

    #[test]
    fn the_buffer_grows_to_what_nvml_asks_and_not_found_is_empty() {
        let mut asked = Vec::new();
        let grown = fetch_growing(0u8, |_, count| {
            asked.push(*count);
            if *count < 300 {
                *count = 300;
                return Err(NvmlError::InsufficientSize(Some(300)));
            }
            *count = 5;
            Ok(())
        });
        assert_eq!(grown.map(|buffer| buffer.len()).ok(), Some(5));
        assert_eq!(asked, [INITIAL_CAPACITY, 300]);
        let nothing = fetch_growing(0u8, |_, _| Err(NvmlError::NotFound));
        assert_eq!(nothing.ok(), Some(Vec::new()));
        let sentinel = fetch_growing(0u8, |_, count| {
            *count = u32::MAX;
            Err(NvmlError::InsufficientSize(None))
        });
        assert!(matches!(sentinel, Err(NvmlError::InsufficientSize(None))));
    }
}
