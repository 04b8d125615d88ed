//! Hardware maxima that cannot change while the driver stays loaded: maximum
//! clocks, the range a power limit may be set in, the widest and fastest PCIe
//! link the GPU and system support. Off by default: eight series per GPU that
//! never move, and seven NVML calls per run.

use super::clocks::{DOMAINS, HERTZ_PER_MEGAHERTZ};
use super::power::PER_MILLI;
use crate::metrics;
use crate::nvml::reader::DeviceReader;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    for (clock, label) in DOMAINS {
        if let Some(mhz) = reader.read("nvmlDeviceGetMaxClockInfo", |d| d.max_clock_info(clock)) {
            reader.push(
                metrics::CLOCK_MAX.sample_with([label], f64::from(mhz) * HERTZ_PER_MEGAHERTZ),
            );
        }
    }
    if let Some(limits) = reader.read("nvmlDeviceGetPowerManagementLimitConstraints", |d| {
        d.power_management_limit_constraints()
    }) {
        reader.gauge(
            metrics::POWER_MIN_LIMIT,
            f64::from(limits.min_limit) / PER_MILLI,
        );
        reader.gauge(
            metrics::POWER_MAX_LIMIT,
            f64::from(limits.max_limit) / PER_MILLI,
        );
    }
    if let Some(generation) = reader.read("nvmlDeviceGetMaxPcieLinkGeneration", |d| {
        d.max_pcie_link_gen()
    }) {
        reader.gauge(metrics::PCIE_MAX_GENERATION, f64::from(generation));
    }
    if let Some(width) = reader.read("nvmlDeviceGetMaxPcieLinkWidth", |d| d.max_pcie_link_width()) {
        reader.gauge(metrics::PCIE_MAX_WIDTH, f64::from(width));
    }
}
