//! The one walk of a GPU's MIG slots, so that every consumer agrees on which
//! MIG devices exist.

use std::ffi::c_uint;

use nvml_wrapper::error::{nvml_sym, NvmlError};
use nvml_wrapper::Device as NvmlDevice;

use super::unwrapped::{c_string, Symbol, UintGetter};
use super::{raw, DeviceReader, Error};

/// NVML's limit of 8 GPU instances.
pub const MAX_MIG_DEVICES: u32 = 8;

const HANDLE_CALL: &str = "nvmlDeviceGetMigDeviceHandleByIndex";

pub struct MigDevice<'n> {
    pub handle: NvmlDevice<'n>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// In slot order; a slot whose ids cannot be read is skipped, an impossible
/// slot count clamped to [`MAX_MIG_DEVICES`] (both counted).
pub fn devices<'n>(reader: &mut DeviceReader<'n>) -> Vec<MigDevice<'n>> {
    let enabled = reader.mig_mode().is_some_and(|mode| mode.current == 1);
    let call = "nvmlDeviceGetMaxMigDeviceCount";
    let count = enabled.then(|| reader.read_by(call, |d| d.mig_device_count()));
    let Some(count) = count.flatten() else {
        return Vec::new();
    };
    let slots = reader.bounded(call, count, MAX_MIG_DEVICES);
    let mut found = Vec::new();
    for slot in 0..slots.unwrap_or(MAX_MIG_DEVICES) {
        let handle = match reader.attempt(HANDLE_CALL, |d| d.mig_device_by_index(slot)) {
            None => break,
            Some(Ok(handle)) => handle,
            // An empty slot; beyond the last slot a clamped count may ask for,
            // NVML answers INVALID_ARGUMENT, which ends the walk quietly.
            Some(Err(NvmlError::NotFound)) => continue,
            Some(Err(NvmlError::InvalidArg)) if count > MAX_MIG_DEVICES => break,
            Some(Err(error)) => {
                reader.note(&Error::new(HANDLE_CALL, error));
                continue;
            }
        };
        let ids = INSTANCE_IDS.map(|(call, getter)| {
            reader.read_by(call, |_| {
                raw(&handle, |lib, mig| {
                    let mut id: c_uint = 0;
                    raw_call!(getter(lib), mig, &mut id).map(|()| id)
                })
            })
        });
        if let [Some(gpu_instance_id), Some(compute_instance_id)] = ids {
            found.push(MigDevice {
                handle,
                gpu_instance_id,
                compute_instance_id,
            });
        }
    }
    found
}

impl DeviceReader<'_> {
    /// Decoded lossily.
    pub fn mig_name(&mut self, mig: &MigDevice<'_>) -> Option<String> {
        self.read_by("nvmlDeviceGetName", |_| {
            raw(&mig.handle, |lib, handle| {
                c_string(nvml_sym(lib.nvmlDeviceGetName.as_ref()), handle)
            })
        })
    }
}

const INSTANCE_IDS: [(&str, Symbol<UintGetter>); 2] = [
    symbol!(nvmlDeviceGetGpuInstanceId),
    symbol!(nvmlDeviceGetComputeInstanceId),
];
