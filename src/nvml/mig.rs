//! MIG devices: one `nvidia_gpu_mig_info` and memory readings per populated
//! slot, under the parent GPU's `gpu`/`uuid` labels.

use std::ffi::{c_char, c_uint, CStr};

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Device as NvmlDevice;

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

/// The most MIG devices one GPU can hold (7 on A100/H100/H200; NVML's own
/// limit is 8 GPU instances).
pub(super) const MAX_MIG_DEVICES: u32 = 8;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let enabled = reader.mig_mode().is_some_and(|mode| mode.current == 1);
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
    // The profile is the end of the MIG device's name ("NVIDIA H100 80GB HBM3
    // MIG 1g.10gb"): one unprivileged call, where nvmlGpuInstanceGetInfo and
    // nvmlDeviceGetGpuInstanceProfileInfo take three and name only the GPU
    // instance's profile, not a smaller compute instance's ("1c.2g.20gb").
    // Kept empty when unreadable, so the series keeps its labels.
    let profile = reader
        .read("nvmlDeviceGetName", |_| name(mig))
        .map(|name| profile(&name).to_owned())
        .unwrap_or_default();
    let gi = gpu_instance_id.to_string();
    let ci = compute_instance_id.to_string();
    reader.push(
        Sample::new(&metrics::MIG_INFO, 1.0)
            .with("gpu_instance_id", gi.clone())
            .with("compute_instance_id", ci.clone())
            .with("mig_uuid", mig_uuid)
            .with("profile", profile),
    );
    if let Some(memory) = reader.read("nvmlDeviceGetMemoryInfo_v2", |_| mig.memory_info()) {
        for (family, bytes) in [
            (&metrics::MIG_MEMORY_USED, memory.used),
            (&metrics::MIG_MEMORY_TOTAL, memory.total),
            (&metrics::MIG_MEMORY_FREE, memory.free),
            (&metrics::MIG_MEMORY_RESERVED, memory.reserved),
        ] {
            reader.push(
                Sample::new(family, bytes as f64)
                    .with("gpu_instance_id", gi.clone())
                    .with("compute_instance_id", ci.clone()),
            );
        }
    }
}

/// The MIG profile at the end of a MIG device's name, or "" if the name holds
/// none.
fn profile(name: &str) -> &str {
    name.rsplit_once("MIG ")
        .map_or("", |(_, profile)| profile.trim())
}

/// The name of a MIG device, decoded lossily (nvml-wrapper's `name()` fails
/// on invalid UTF-8).
fn name(mig: &NvmlDevice<'_>) -> Result<String, NvmlError> {
    /// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
    const BUFFER: usize = 96;
    // SAFETY: `mig` is a live MIG handle of the NVML instance in use.
    let (lib, handle) = unsafe { (mig.nvml().lib(), mig.handle()) };
    let get = nvml_sym(lib.nvmlDeviceGetName.as_ref())?;
    let mut buffer = [0 as c_char; BUFFER];
    // SAFETY: the buffer's length is passed; NVML NUL-terminates within it.
    nvml_try(unsafe { get(handle, buffer.as_mut_ptr(), BUFFER as c_uint) })?;
    // SAFETY: NVML returned success, so the buffer holds a C string.
    let text = unsafe { CStr::from_ptr(buffer.as_ptr()) };
    Ok(text.to_string_lossy().into_owned())
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

#[cfg(test)]
mod tests {
    use super::profile;

    #[test]
    fn profile_is_the_end_of_the_mig_device_name() {
        assert_eq!(profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb"), "1g.10gb");
        assert_eq!(profile("NVIDIA H200 MIG 1c.2g.36gb"), "1c.2g.36gb");
        assert_eq!(profile("NVIDIA H100 80GB HBM3"), "");
    }
}
