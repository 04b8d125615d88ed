//! The chip-to-chip (C2C) links between a superchip's GPU and its Grace CPU
//! (GH200, GB200), from field values, and whether C2C is on (read once per
//! driver): on other GPUs only the mode, where the driver answers it (off).

use nvml::calls;
use nvml::types::field_id::{
    NVML_FI_DEV_C2C_LINK_COUNT, NVML_FI_DEV_C2C_LINK_ERROR_INTR, NVML_FI_DEV_C2C_LINK_ERROR_REPLAY,
    NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B, NVML_FI_DEV_C2C_LINK_GET_MAX_BW,
    NVML_FI_DEV_C2C_LINK_GET_STATUS, NVML_FI_DEV_C2C_LINK_POWER_STATE,
};

use crate::collector::{flag, Collector, Fixed, Gpu, Hooks};
use crate::metrics::families;

families! {
    FAMILIES;
    C2C_ENABLED: Gauge(Number), "nvidia_gpu_c2c_enabled", [],
        "1 if the GPU's C2C mode is on (read once per driver).";
    C2C_LINKS: Gauge(Number), "nvidia_gpu_c2c_links", [],
        "C2C links between the GPU and the CPU of its superchip.";
    C2C_ACTIVE: Gauge(Number), "nvidia_gpu_c2c_link_active", [],
        "1 if the C2C link is active.";
    C2C_MAX_BANDWIDTH: Gauge(BytesPerSecond), "nvidia_gpu_c2c_link_max_bandwidth_bytes_per_second", [],
        "Highest bandwidth of the active C2C links.";
    C2C_ERRORS: Counter(Count), "nvidia_gpu_c2c_link_errors_total", ["type"],
        "C2C link errors by type (crc, replay, replay_back_to_back: a replay of a replay).";
    C2C_POWER_STATE: Gauge(Number), "nvidia_gpu_c2c_link_power_state", ["state"],
        "Power state of the C2C link as a state set: 1 for the current state (full_power, low_power; unknown for another value), 0 for the others.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "c2c",
    default: true,
    help: "Chip-to-chip links between the GPU and the Grace CPU of its superchip (GH200, GB200): C2C mode (read once per driver), link count, state, bandwidth, errors and power state; on other GPUs only the mode, where the driver answers it.",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS),
};

const ENABLED: Fixed = Fixed("c2c.enabled");

/// NVML's MBps.
const BYTES_PER_MEGABYTE: f64 = 1e6;

const ERRORS: [(u32, &str); 3] = [
    (NVML_FI_DEV_C2C_LINK_ERROR_INTR, "crc"),
    (NVML_FI_DEV_C2C_LINK_ERROR_REPLAY, "replay"),
    (NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B, "replay_back_to_back"),
];

/// `NVML_C2C_POWER_STATE_*` values 0 and 1.
const POWER_STATES: [&str; 2] = ["full_power", "low_power"];

pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_C2C_LINK_COUNT,
    NVML_FI_DEV_C2C_LINK_GET_STATUS,
    NVML_FI_DEV_C2C_LINK_GET_MAX_BW,
    NVML_FI_DEV_C2C_LINK_ERROR_INTR,
    NVML_FI_DEV_C2C_LINK_ERROR_REPLAY,
    NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B,
    NVML_FI_DEV_C2C_LINK_POWER_STATE,
];

fn read(gpu: &mut Gpu<'_>) {
    let on = gpu.read_fixed(ENABLED, calls::C2C_ENABLED, (), i64::from);
    gpu.gauge(C2C_ENABLED, on.flatten().map(|on| on as f64));
    // A GPU without C2C answers NOT_SUPPORTED, or a count of 0.
    let Some(links) = gpu.nvml.field(NVML_FI_DEV_C2C_LINK_COUNT) else {
        return;
    };
    gpu.gauge(C2C_LINKS, links);
    if links == 0.0 {
        return;
    }
    let status = gpu.nvml.field(NVML_FI_DEV_C2C_LINK_GET_STATUS);
    gpu.gauge(C2C_ACTIVE, status.map(|status| flag(status != 0.0)));
    if let Some(megabytes) = gpu.nvml.field(NVML_FI_DEV_C2C_LINK_GET_MAX_BW) {
        gpu.gauge(C2C_MAX_BANDWIDTH, megabytes * BYTES_PER_MEGABYTE);
    }
    for (field, kind) in ERRORS {
        let count = gpu.nvml.field(field);
        gpu.gauge_with(C2C_ERRORS, [kind], count);
    }
    if let Some(state) = gpu.nvml.field(NVML_FI_DEV_C2C_LINK_POWER_STATE) {
        gpu.state_set(C2C_POWER_STATE, &POWER_STATES, state);
    }
}
