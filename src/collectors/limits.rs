//! Hardware maxima fixed while the driver is loaded: maximum clocks, the
//! power limit range. Off by default.

use crate::collector::{Collector, Gpu, Hooks, CLOCK_DOMAINS, HERTZ_PER_MEGAHERTZ, PER_MILLI};
use crate::metrics::families;
use nvml::calls;

families! {
    FAMILIES;
    POWER_MIN_LIMIT: Gauge(Watts), "nvidia_gpu_power_min_limit_watts", [],
        "Lowest power limit that can be set.";
    POWER_MAX_LIMIT: Gauge(Watts), "nvidia_gpu_power_max_limit_watts", [],
        "Highest power limit that can be set.";
    CLOCK_MAX: Gauge(Hertz), "nvidia_gpu_clock_max_hertz", ["clock"],
        "Maximum clock frequency by clock domain.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "limits",
    default: false,
    help: "Hardware maxima fixed while the driver is loaded: max clocks, power limit range.",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]),
};

fn read(gpu: &mut Gpu<'_>) {
    for (clock, label) in CLOCK_DOMAINS {
        if let Some(mhz) = gpu.nvml.read(calls::MAX_CLOCK_INFO, clock) {
            gpu.push(CLOCK_MAX.sample_with([label], f64::from(mhz) * HERTZ_PER_MEGAHERTZ));
        }
    }
    if let Some(limits) = gpu.nvml.read(calls::POWER_LIMIT_CONSTRAINTS, ()) {
        gpu.gauge(POWER_MIN_LIMIT, f64::from(limits.min_limit) / PER_MILLI);
        gpu.gauge(POWER_MAX_LIMIT, f64::from(limits.max_limit) / PER_MILLI);
    }
}
