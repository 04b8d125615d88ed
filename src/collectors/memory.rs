//! Device memory and BAR1 memory.

use crate::collector::Gpu;
use crate::metrics;

pub(super) fn read(reader: &mut Gpu<'_>) {
    if let Some(memory) = reader.read("nvmlDeviceGetMemoryInfo_v2", |d| d.memory_info()) {
        reader.gauge(metrics::MEMORY_USED, memory.used as f64);
        reader.gauge(metrics::MEMORY_FREE, memory.free as f64);
        reader.gauge(metrics::MEMORY_TOTAL, memory.total as f64);
        reader.gauge(metrics::MEMORY_RESERVED, memory.reserved as f64);
    }
    if let Some(bar1) = reader.read("nvmlDeviceGetBAR1MemoryInfo", |d| d.bar1_memory_info()) {
        reader.gauge(metrics::BAR1_USED, bar1.used as f64);
        reader.gauge(metrics::BAR1_TOTAL, bar1.total as f64);
    }
}
