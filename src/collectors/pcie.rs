//! PCIe link generation and width against their maxima (read once per
//! driver), replays and traffic.

use nvml::calls;
use nvml::types::field_id::{
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    NVML_FI_DEV_PCIE_REPLAY_COUNTER,
};
use nvml::types::PcieUtilCounter;

use crate::collector::{Collector, Fixed, Gpu, Hooks};
use crate::metrics::families;

families! {
    FAMILIES;
    PCIE_GENERATION: Gauge(Number), "nvidia_gpu_pcie_link_generation", [],
        "Current PCIe link generation.";
    PCIE_MAX_GENERATION: Gauge(Number), "nvidia_gpu_pcie_link_max_generation", [],
        "Highest PCIe link generation the GPU and system support.";
    PCIE_WIDTH: Gauge(Number), "nvidia_gpu_pcie_link_width", [],
        "Current PCIe link width in lanes.";
    PCIE_MAX_WIDTH: Gauge(Number), "nvidia_gpu_pcie_link_max_width", [],
        "Widest PCIe link the GPU and system support, in lanes.";
    PCIE_REPLAYS: Counter(Count), "nvidia_gpu_pcie_replays_total", [],
        "PCIe replays (retransmitted packets) since the driver was loaded.";
    PCIE_TRANSMIT: Counter(Bytes), "nvidia_gpu_pcie_transmit_bytes_total", [],
        "Bytes the GPU sent over PCIe.";
    PCIE_RECEIVE: Counter(Bytes), "nvidia_gpu_pcie_receive_bytes_total", [],
        "Bytes the GPU received over PCIe.";
}

families! {
    THROUGHPUT_FAMILIES;
    PCIE_TRANSMIT_THROUGHPUT: Gauge(BytesPerSecond), "nvidia_gpu_pcie_transmit_throughput_bytes_per_second", [],
        "PCIe send throughput over a 20 ms sample (only with --collector pcie-throughput).";
    PCIE_RECEIVE_THROUGHPUT: Gauge(BytesPerSecond), "nvidia_gpu_pcie_receive_throughput_bytes_per_second", [],
        "PCIe receive throughput over a 20 ms sample (only with --collector pcie-throughput).";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "pcie",
    default: true,
    help: "PCIe link generation and width now and their maxima (read once per driver), replays, byte counters.",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS),
};

pub(super) static THROUGHPUT: Collector = Collector {
    name: "pcie-throughput",
    default: false,
    help: "PCIe throughput sampled by NVML over 20 ms per direction (slow).",
    families: THROUGHPUT_FAMILIES,
    hooks: Hooks::read(read_throughput, &[]),
};

const BYTES_PER_KIB: f64 = 1024.0;

const MAX_GENERATION: Fixed = Fixed("pcie.max_generation");
const MAX_WIDTH: Fixed = Fixed("pcie.max_width");

fn read(gpu: &mut Gpu<'_>) {
    let generation = gpu.read_fixed(MAX_GENERATION, calls::MAX_PCIE_GENERATION, (), i64::from);
    gpu.gauge(PCIE_MAX_GENERATION, generation.flatten().map(|g| g as f64));
    let width = gpu.read_fixed(MAX_WIDTH, calls::MAX_PCIE_WIDTH, (), i64::from);
    gpu.gauge(PCIE_MAX_WIDTH, width.flatten().map(|w| w as f64));
    let generation = gpu.nvml.read(calls::PCIE_GENERATION, ());
    gpu.gauge(PCIE_GENERATION, generation.map(f64::from));
    let width = gpu.nvml.read(calls::PCIE_WIDTH, ());
    gpu.gauge(PCIE_WIDTH, width.map(f64::from));
    let replays = gpu.nvml.field_or(NVML_FI_DEV_PCIE_REPLAY_COUNTER, |nvml| {
        nvml.read(calls::PCIE_REPLAY_COUNTER, ()).map(f64::from)
    });
    gpu.gauge(PCIE_REPLAYS, replays);
    let transmitted = gpu.nvml.field(NVML_FI_DEV_PCIE_COUNT_TX_BYTES);
    gpu.gauge(PCIE_TRANSMIT, transmitted);
    let received = gpu.nvml.field(NVML_FI_DEV_PCIE_COUNT_RX_BYTES);
    gpu.gauge(PCIE_RECEIVE, received);
}

pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
];

/// Each direction blocks for NVML's 20 ms window.
fn read_throughput(gpu: &mut Gpu<'_>) {
    for (counter, family) in [
        (PcieUtilCounter::Send, PCIE_TRANSMIT_THROUGHPUT),
        (PcieUtilCounter::Receive, PCIE_RECEIVE_THROUGHPUT),
    ] {
        let kib = gpu.nvml.read(calls::PCIE_THROUGHPUT, counter);
        gpu.gauge(family, kib.map(|kib| f64::from(kib) * BYTES_PER_KIB));
    }
}
