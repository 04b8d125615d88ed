//! MIG devices: `nvidia_gpu_mig_info` and memory per MIG device, under the
//! parent GPU's labels.

use crate::collector::Gpu;
use crate::metrics;
use crate::nvml::mig::{self, MigDevice};

pub(super) fn read(reader: &mut Gpu<'_>) {
    for device in mig::devices(reader) {
        read_mig_device(reader, &device);
    }
}

fn read_mig_device(reader: &mut Gpu<'_>, mig: &MigDevice<'_>) {
    let Some(mig_uuid) = reader.read("nvmlDeviceGetUUID", |_| mig.handle.uuid()) else {
        return;
    };
    // The profile ends the name: one unprivileged call, and it names a
    // compute instance's profile too. Empty when unreadable.
    let profile = reader
        .read("nvmlDeviceGetName", |_| mig.name())
        .map(|name| profile(&name).to_owned())
        .unwrap_or_default();
    let gi = mig.gpu_instance_id.to_string();
    let ci = mig.compute_instance_id.to_string();
    reader.push(metrics::MIG_INFO.sample_with([gi.clone(), ci.clone(), mig_uuid, profile], 1.0));
    if let Some(memory) = reader.read("nvmlDeviceGetMemoryInfo_v2", |_| mig.handle.memory_info()) {
        for (family, bytes) in [
            (metrics::MIG_MEMORY_USED, memory.used),
            (metrics::MIG_MEMORY_TOTAL, memory.total),
            (metrics::MIG_MEMORY_FREE, memory.free),
            (metrics::MIG_MEMORY_RESERVED, memory.reserved),
        ] {
            reader.push(family.sample_with([gi.clone(), ci.clone()], bytes as f64));
        }
    }
}

/// The MIG profile at the end of a MIG device's name, or "" if the name holds
/// none.
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
