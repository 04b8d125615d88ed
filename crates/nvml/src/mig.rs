//! The one walk of a GPU's MIG slots, so that every consumer agrees on which
//! MIG devices exist.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device as NvmlDevice;

use super::calls::{Call, COMPUTE_INSTANCE_ID, GPU_INSTANCE_ID, MIG_DEVICE, MIG_DEVICE_COUNT};
use super::DeviceReader;

/// NVML's limit of 8 GPU instances.
pub const MAX_MIG_DEVICES: u32 = 8;

pub struct MigDevice<'n> {
    pub handle: NvmlDevice<'n>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// In slot order; a slot whose ids cannot be read is skipped, an impossible
/// slot count clamped to [`MAX_MIG_DEVICES`] (both counted).
pub fn devices<'n>(reader: &mut DeviceReader<'n>) -> Vec<MigDevice<'n>> {
    let enabled = reader.mig_mode().is_some_and(|mode| mode.current == 1);
    let Some(count) = enabled.then(|| reader.read(MIG_DEVICE_COUNT, ())).flatten() else {
        return Vec::new();
    };
    // The count is checked (and an impossible one counted) once a run,
    // however many collectors walk the slots.
    let slots = match reader.mig_slots {
        Some(slots) => slots,
        None => reader.bounded(MIG_DEVICE_COUNT::NAME, count, MAX_MIG_DEVICES),
    };
    reader.mig_slots = Some(slots);
    // An empty slot; beyond the last slot a clamped count may ask for, NVML
    // answers INVALID_ARGUMENT, which ends the walk quietly.
    let expected = |error: &NvmlError| match error {
        NvmlError::NotFound => true,
        NvmlError::InvalidArg => count > MAX_MIG_DEVICES,
        _ => false,
    };
    let mut found = Vec::new();
    for slot in 0..slots.unwrap_or(MAX_MIG_DEVICES) {
        let handle = match reader.read_expecting(MIG_DEVICE, slot, |e| expected(&e.nvml)) {
            Some(Ok(handle)) => handle,
            Some(Err(error)) if matches!(error.nvml, NvmlError::InvalidArg) => break,
            Some(Err(_)) | None => continue,
        };
        let gpu_instance_id = reader.read_on(&handle, GPU_INSTANCE_ID, ());
        let compute_instance_id = reader.read_on(&handle, COMPUTE_INSTANCE_ID, ());
        if let (Some(gpu_instance_id), Some(compute_instance_id)) =
            (gpu_instance_id, compute_instance_id)
        {
            found.push(MigDevice {
                handle,
                gpu_instance_id,
                compute_instance_id,
            });
        }
    }
    found
}
