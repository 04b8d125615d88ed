//! MIG enumeration, the one place that walks a GPU's MIG slots.
//!
//! A GPU in MIG mode has up to [`MAX_MIG_DEVICES`] slots
//! (`nvmlDeviceGetMaxMigDeviceCount`), each empty (NOT_FOUND) or holding a MIG
//! device. [`devices`] returns the populated ones with their instance ids;
//! every consumer (the `mig` collector, GPM per GPU instance) uses it, so they
//! agree on which MIG devices exist.
//!
//! An impossible slot count (a sentinel such as 4294967295) is counted as a
//! read error and clamped to the slots a GPU can have: the MIG devices that
//! exist are still listed.

use std::ffi::c_uint;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Device as NvmlDevice;

use super::reader::DeviceReader;
use super::unwrapped::c_string;

/// The most MIG devices one GPU can hold (7 on A100/H100/H200; NVML's own
/// limit is 8 GPU instances).
pub const MAX_MIG_DEVICES: u32 = 8;

/// A populated MIG slot.
pub struct MigDevice<'n> {
    pub handle: NvmlDevice<'n>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// The MIG devices of a GPU in MIG mode, in slot order; none when MIG is off,
/// unreadable or the GPU is down. A slot whose instance ids cannot be read is
/// skipped (its errors counted).
pub fn devices<'n>(reader: &mut DeviceReader<'n>) -> Vec<MigDevice<'n>> {
    let enabled = reader.mig_mode().is_some_and(|mode| mode.current == 1);
    if !enabled {
        return Vec::new();
    }
    let call = "nvmlDeviceGetMaxMigDeviceCount";
    let Some(count) = reader.read(call, |d| d.mig_device_count()) else {
        return Vec::new();
    };
    let slots = reader
        .bounded(call, count, MAX_MIG_DEVICES)
        .unwrap_or(MAX_MIG_DEVICES);
    let mut found = Vec::new();
    for slot in 0..slots {
        let handle = match reader.try_read("nvmlDeviceGetMigDeviceHandleByIndex", |d| {
            d.mig_device_by_index(slot)
        }) {
            None => break,
            Some(Ok(handle)) => handle,
            // An empty slot; beyond the last slot a clamped count may ask for,
            // NVML answers INVALID_ARGUMENT, which ends the walk quietly.
            Some(Err(NvmlError::NotFound)) => continue,
            Some(Err(NvmlError::InvalidArg)) if count > MAX_MIG_DEVICES => break,
            Some(Err(error)) => {
                reader.note("nvmlDeviceGetMigDeviceHandleByIndex", &error);
                continue;
            }
        };
        let ids = (
            reader.read("nvmlDeviceGetGpuInstanceId", |_| {
                instance_id(&handle, Instance::Gpu)
            }),
            reader.read("nvmlDeviceGetComputeInstanceId", |_| {
                instance_id(&handle, Instance::Compute)
            }),
        );
        if let (Some(gpu_instance_id), Some(compute_instance_id)) = ids {
            found.push(MigDevice {
                handle,
                gpu_instance_id,
                compute_instance_id,
            });
        }
    }
    found
}

impl MigDevice<'_> {
    /// The MIG device's name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"), decoded
    /// lossily; read as `nvmlDeviceGetName`.
    pub fn name(&self) -> Result<String, NvmlError> {
        // SAFETY: a live MIG handle of the NVML instance in use.
        let (lib, handle) = unsafe { (self.handle.nvml().lib(), self.handle.handle()) };
        c_string(nvml_sym(lib.nvmlDeviceGetName.as_ref())?, handle)
    }
}

enum Instance {
    Gpu,
    Compute,
}

/// The GPU or compute instance id of a MIG device (not wrapped by nvml-wrapper).
fn instance_id(mig: &NvmlDevice<'_>, instance: Instance) -> Result<u32, NvmlError> {
    // SAFETY: `mig` is a live MIG handle of the NVML instance in use.
    let (lib, handle) = unsafe { (mig.nvml().lib(), mig.handle()) };
    let get = match instance {
        Instance::Gpu => nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?,
        Instance::Compute => nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?,
    };
    let mut id: c_uint = 0;
    // SAFETY: one valid out-pointer.
    nvml_try(unsafe { get(handle, &mut id) })?;
    Ok(id)
}
