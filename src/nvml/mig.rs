//! MIG devices: one `nvidia_gpu_mig_info` and memory readings per populated
//! slot, under the parent GPU's `gpu`/`uuid` labels.

use std::ffi::c_uint;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Device as NvmlDevice;

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

/// The most MIG devices one GPU can hold (7 on A100/H100/H200; NVML's own
/// limit is 8 GPU instances).
pub(super) const MAX_MIG_DEVICES: u32 = 8;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let enabled = reader
        .read("nvmlDeviceGetMigMode", |d| d.mig_mode())
        .is_some_and(|mode| mode.current == 1);
    if !enabled {
        return;
    }
    let slots = reader
        .read("nvmlDeviceGetMaxMigDeviceCount", |d| d.mig_device_count())
        .and_then(|count| reader.bounded("nvmlDeviceGetMaxMigDeviceCount", count, MAX_MIG_DEVICES))
        .unwrap_or(0);
    for slot in 0..slots {
        match reader.try_read("nvmlDeviceGetMigDeviceHandleByIndex", |d| {
            d.mig_device_by_index(slot)
        }) {
            None => return,
            Some(Ok(mig)) => read_mig_device(reader, &mig),
            // An empty slot.
            Some(Err(NvmlError::NotFound)) => {}
            Some(Err(error)) => reader.note("nvmlDeviceGetMigDeviceHandleByIndex", &error),
        }
    }
}

fn read_mig_device(reader: &mut DeviceReader<'_>, mig: &NvmlDevice<'_>) {
    let Some(mig_uuid) = reader.read("nvmlDeviceGetUUID", |_| mig.uuid()) else {
        return;
    };
    let (Some(gpu_instance_id), Some(compute_instance_id)) = (
        reader.read("nvmlDeviceGetGpuInstanceId", |_| {
            instance_id(mig, Instance::Gpu)
        }),
        reader.read("nvmlDeviceGetComputeInstanceId", |_| {
            instance_id(mig, Instance::Compute)
        }),
    ) else {
        return;
    };
    let gi = gpu_instance_id.to_string();
    let ci = compute_instance_id.to_string();
    reader.push(
        Sample::new(&metrics::MIG_INFO, 1.0)
            .with("gpu_instance_id", gi.clone())
            .with("compute_instance_id", ci.clone())
            .with("mig_uuid", mig_uuid),
    );
    if let Some(memory) = reader.read("nvmlDeviceGetMemoryInfo_v2", |_| mig.memory_info()) {
        for (family, bytes) in [
            (&metrics::MIG_MEMORY_USED, memory.used),
            (&metrics::MIG_MEMORY_TOTAL, memory.total),
        ] {
            reader.push(
                Sample::new(family, bytes as f64)
                    .with("gpu_instance_id", gi.clone())
                    .with("compute_instance_id", ci.clone()),
            );
        }
    }
}

pub(super) enum Instance {
    Gpu,
    Compute,
}

/// The GPU or compute instance id of a MIG device (not wrapped by nvml-wrapper).
pub(super) fn instance_id(mig: &NvmlDevice<'_>, instance: Instance) -> Result<u32, NvmlError> {
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
