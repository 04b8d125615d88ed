//! Device memory and BAR1 memory.

use crate::collector::{Collector, Gpu, Hooks};
use crate::metrics::families;
use nvml::calls;

families! {
    FAMILIES;
    MEMORY_USED: Gauge(Bytes), "nvidia_gpu_memory_used_bytes", [],
        "Device memory allocated (NVML memory info v2: excluding reserved memory).";
    MEMORY_FREE: Gauge(Bytes), "nvidia_gpu_memory_free_bytes", [],
        "Device memory not allocated.";
    MEMORY_TOTAL: Gauge(Bytes), "nvidia_gpu_memory_total_bytes", [],
        "Device memory in total.";
    MEMORY_RESERVED: Gauge(Bytes), "nvidia_gpu_memory_reserved_bytes", [],
        "Device memory reserved by the driver and firmware.";
    BAR1_USED: Gauge(Bytes), "nvidia_gpu_bar1_memory_used_bytes", [],
        "BAR1 (CPU-mappable) memory in use.";
    BAR1_TOTAL: Gauge(Bytes), "nvidia_gpu_bar1_memory_total_bytes", [],
        "BAR1 (CPU-mappable) memory in total.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "memory",
    default: true,
    help: "Device memory used/free/total/reserved, BAR1 memory.",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]),
};

fn read(gpu: &mut Gpu<'_>) {
    if let Some(memory) = gpu.nvml.read(calls::MEMORY_INFO, ()) {
        gpu.gauge(MEMORY_USED, memory.used as f64);
        gpu.gauge(MEMORY_FREE, memory.free as f64);
        gpu.gauge(MEMORY_TOTAL, memory.total as f64);
        gpu.gauge(MEMORY_RESERVED, memory.reserved as f64);
    }
    if let Some(bar1) = gpu.nvml.read(calls::BAR1_MEMORY_INFO, ()) {
        gpu.gauge(BAR1_USED, bar1.used as f64);
        gpu.gauge(BAR1_TOTAL, bar1.total as f64);
    }
}
