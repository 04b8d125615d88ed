//! PCIe link generation and width against their maxima (read once per
//! driver: a link that trained low shows), replays and traffic.

use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    NVML_FI_DEV_PCIE_REPLAY_COUNTER,
};

use crate::collector::Gpu;
use crate::metrics;

/// NVML reports PCIe throughput in KiB/s.
const BYTES_PER_KIB: f64 = 1024.0;

pub(super) fn read(reader: &mut Gpu<'_>) {
    if let Some(Some(generation)) = reader.read_fixed(
        "pcie.max_generation",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        |d| d.max_pcie_link_gen().map(i64::from),
    ) {
        reader.gauge(metrics::PCIE_MAX_GENERATION, generation as f64);
    }
    if let Some(Some(width)) =
        reader.read_fixed("pcie.max_width", "nvmlDeviceGetMaxPcieLinkWidth", |d| {
            d.max_pcie_link_width().map(i64::from)
        })
    {
        reader.gauge(metrics::PCIE_MAX_WIDTH, width as f64);
    }
    if let Some(generation) = reader.read("nvmlDeviceGetCurrPcieLinkGeneration", |d| {
        d.current_pcie_link_gen()
    }) {
        reader.gauge(metrics::PCIE_GENERATION, f64::from(generation));
    }
    if let Some(width) = reader.read("nvmlDeviceGetCurrPcieLinkWidth", |d| {
        d.current_pcie_link_width()
    }) {
        reader.gauge(metrics::PCIE_WIDTH, f64::from(width));
    }
    let replays = reader.field_or(NVML_FI_DEV_PCIE_REPLAY_COUNTER, |reader| {
        reader
            .read("nvmlDeviceGetPcieReplayCounter", |d| {
                d.pcie_replay_counter()
            })
            .map(f64::from)
    });
    if let Some(replays) = replays {
        reader.gauge(metrics::PCIE_REPLAYS, replays);
    }
    if let Some(bytes) = reader.field(NVML_FI_DEV_PCIE_COUNT_TX_BYTES) {
        reader.gauge(metrics::PCIE_TRANSMIT, bytes);
    }
    if let Some(bytes) = reader.field(NVML_FI_DEV_PCIE_COUNT_RX_BYTES) {
        reader.gauge(metrics::PCIE_RECEIVE, bytes);
    }
}

/// Field values this collector takes from the per-GPU batch.
pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
];

/// The sampled throughput: each direction blocks for NVML's 20 ms window.
pub(super) fn read_throughput(reader: &mut Gpu<'_>) {
    for (counter, family) in [
        (PcieUtilCounter::Send, metrics::PCIE_TRANSMIT_THROUGHPUT),
        (PcieUtilCounter::Receive, metrics::PCIE_RECEIVE_THROUGHPUT),
    ] {
        if let Some(kib) = reader.read("nvmlDeviceGetPcieThroughput", |d| {
            d.pcie_throughput(counter)
        }) {
            reader.gauge(family, f64::from(kib) * BYTES_PER_KIB);
        }
    }
}
