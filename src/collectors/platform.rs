//! Where a GPU of a rack (GB200 NVL72) sits: chassis, slot, compute tray,
//! node and module, from `nvmlDeviceGetPlatformInfo` (Blackwell and newer),
//! read once per driver.

use nvml::calls;

use crate::collector::{Collector, Fixed, Gpu, Hooks};
use crate::metrics::families;

families! {
    FAMILIES;
    PLATFORM_INFO: Gauge(Number), "nvidia_gpu_platform_info", ["chassis_serial", "slot", "tray", "host_id", "module_id"],
        "Where the GPU sits in its rack as labels (Blackwell and newer): the chassis serial number (empty from a driver that knows only the first version of the call), the slot in the chassis (switches included), the compute tray, the node in the slot and the GPU's module in the node; always 1.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "platform",
    default: true,
    help: "Where the GPU sits in its rack (Blackwell and newer: GB200 NVL72): chassis serial number, slot, compute tray, node and module as labels, read once per driver.",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]),
};

const PLATFORM: Fixed = Fixed("platform");

fn read(gpu: &mut Gpu<'_>) {
    if !gpu.facts().is_blackwell_or_newer() {
        return;
    }
    let read = gpu.read_fixed(PLATFORM, calls::PLATFORM_INFO, (), |info| {
        vec![
            info.chassis_serial,
            info.slot.to_string(),
            info.tray.to_string(),
            info.host_id.to_string(),
            info.module_id.to_string(),
        ]
    });
    match read.flatten().map(<[String; 5]>::try_from) {
        Some(Ok(labels)) => gpu.push(PLATFORM_INFO.sample_with(labels, 1.0)),
        Some(Err(_)) => gpu.damaged_fixed_labels(PLATFORM),
        None => {}
    }
}
