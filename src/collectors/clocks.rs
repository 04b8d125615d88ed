//! Clock frequencies, the performance state and what holds the clocks down:
//! clock event reasons now, and violation time per policy as counters.

use nvml::calls;
use nvml::types::field_id::{
    NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT, NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
    NVML_FI_DEV_PERF_POLICY_POWER, NVML_FI_DEV_PERF_POLICY_RELIABILITY,
    NVML_FI_DEV_PERF_POLICY_SYNC_BOOST, NVML_FI_DEV_PERF_POLICY_THERMAL,
    NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS, NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS,
};
use nvml::types::PerformancePolicy;

use crate::collector::{flag, Collector, Gpu, Hooks, CLOCK_DOMAINS, HERTZ_PER_MEGAHERTZ};
use crate::metrics::families;

families! {
    FAMILIES;
    CLOCK: Gauge(Hertz), "nvidia_gpu_clock_hertz", ["clock"],
        "Current clock frequency by clock domain.";
    PERFORMANCE_STATE: Gauge(Number), "nvidia_gpu_performance_state", [],
        "Performance state: 0 (P0, maximum performance) to 15 (P15, minimum).";
    CLOCKS_EVENT: Gauge(Number), "nvidia_gpu_clocks_event_active", ["reason"],
        "1 if this reason is holding the clocks down now, 0 if not, by reason.";
    VIOLATION: Counter(Seconds), "nvidia_gpu_violation_seconds_total", ["policy"],
        "Time the clocks were held below their target by this policy, by policy.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "clocks",
    default: true,
    help: "Clocks, performance state, clock event reasons, violation counters.",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS),
};

/// nvml.h `nvmlClocksEventReason*`.
const EVENT_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// In [`FIELDS`] order.
const POLICIES: [(PerformancePolicy, &str); 8] = {
    use PerformancePolicy::*;
    [
        (Power, "power"),
        (Thermal, "thermal"),
        (SyncBoost, "sync_boost"),
        (BoardLimit, "board_limit"),
        (LowUtilization, "low_utilization"),
        (Reliability, "reliability"),
        (TotalAppClocks, "app_clocks"),
        (TotalBaseClocks, "base_clocks"),
    ]
};

pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_PERF_POLICY_POWER,
    NVML_FI_DEV_PERF_POLICY_THERMAL,
    NVML_FI_DEV_PERF_POLICY_SYNC_BOOST,
    NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
    NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
    NVML_FI_DEV_PERF_POLICY_RELIABILITY,
    NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS,
    NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS,
];

/// Dividing (not multiplying by 1e-9) keeps values exact in print.
const NANOSECONDS_PER_SECOND: f64 = 1e9;

fn read(gpu: &mut Gpu<'_>) {
    for (clock, label) in CLOCK_DOMAINS {
        if let Some(mhz) = gpu.nvml.read(calls::CLOCK_INFO, clock) {
            gpu.push(CLOCK.sample_with([label], f64::from(mhz) * HERTZ_PER_MEGAHERTZ));
        }
    }
    // P0..P15 as 0..15; NVML's "unknown" state (32) is not a number.
    if let Some(Ok(state)) = gpu.nvml.read(calls::PERFORMANCE_STATE, ()) {
        if let Some(number) = u8::try_from(state.as_c()).ok().filter(|&n| n < 16) {
            gpu.gauge(PERFORMANCE_STATE, f64::from(number));
        }
    }
    read_event_reasons(gpu);
    read_violations(gpu);
}

/// From the batch, else `nvmlDeviceGetViolationStatus`.
fn read_violations(gpu: &mut Gpu<'_>) {
    for ((policy, label), &field) in POLICIES.into_iter().zip(FIELDS) {
        let nanoseconds = gpu.nvml.field_or(field, |nvml| {
            nvml.read(calls::VIOLATION_STATUS, policy)
                .map(|time| time.violation_time as f64)
        });
        let seconds = nanoseconds.map(|ns| ns / NANOSECONDS_PER_SECOND);
        gpu.gauge_with(VIOLATION, [label], seconds);
    }
}

/// One sample per reason the GPU supports (all if it cannot say).
fn read_event_reasons(gpu: &mut Gpu<'_>) {
    let Some(active) = gpu.nvml.read(calls::CLOCKS_EVENT_REASONS, ()) else {
        return;
    };
    let supported = gpu.nvml.read(calls::SUPPORTED_CLOCKS_EVENT_REASONS, ());
    for (bit, label) in EVENT_REASONS {
        if supported.unwrap_or(u64::MAX) & bit != 0 {
            gpu.push(CLOCKS_EVENT.sample_with([label], flag(active & bit != 0)));
        }
    }
}
