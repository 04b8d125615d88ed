//! MIG devices, under the parent GPU's labels.

use crate::collector::{Collector, Gpu, Hooks};
use crate::metrics::families;
use nvml::calls;
use nvml::mig;

families! {
    FAMILIES;
    MIG_INFO: Gauge(Number), "nvidia_gpu_mig_info", ["gpu_instance_id", "compute_instance_id", "mig_uuid", "profile"],
        "A MIG device of this GPU, with its ids and profile (e.g. 1g.10gb) as labels; always 1.";
    MIG_MEMORY_USED: Gauge(Bytes), "nvidia_gpu_mig_memory_used_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory allocated on the MIG device.";
    MIG_MEMORY_TOTAL: Gauge(Bytes), "nvidia_gpu_mig_memory_total_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory of the MIG device in total.";
    MIG_MEMORY_FREE: Gauge(Bytes), "nvidia_gpu_mig_memory_free_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory not allocated on the MIG device.";
    MIG_MEMORY_RESERVED: Gauge(Bytes), "nvidia_gpu_mig_memory_reserved_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory of the MIG device reserved by the driver and firmware.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "mig",
    default: true,
    help: "MIG devices with their profile and memory.",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]),
};

fn read(gpu: &mut Gpu<'_>) {
    for mig in mig::devices(&mut gpu.nvml) {
        let Some(mig_uuid) = gpu.nvml.read_on(&mig.handle, calls::UUID, ()) else {
            continue;
        };
        // From the name: one unprivileged call, and it names a compute
        // instance's profile too.
        let name = gpu.nvml.read_on(&mig.handle, calls::NAME, ());
        let profile = name.as_deref().map_or("", profile).to_owned();
        let gi = mig.gpu_instance_id.to_string();
        let ci = mig.compute_instance_id.to_string();
        gpu.push(MIG_INFO.sample_with([gi.clone(), ci.clone(), mig_uuid, profile], 1.0));
        if let Some(memory) = gpu.nvml.read_on(&mig.handle, calls::MEMORY_INFO, ()) {
            for (family, bytes) in [
                (MIG_MEMORY_USED, memory.used),
                (MIG_MEMORY_TOTAL, memory.total),
                (MIG_MEMORY_FREE, memory.free),
                (MIG_MEMORY_RESERVED, memory.reserved),
            ] {
                gpu.push(family.sample_with([gi.clone(), ci.clone()], bytes as f64));
            }
        }
    }
}

/// "" if the name holds none.
fn profile(name: &str) -> &str {
    name.rsplit_once("MIG ")
        .map_or("", |(_, profile)| profile.trim())
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
