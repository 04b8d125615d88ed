//! Power draw, energy and power limits. NVML reports milliwatts and millijoules.

use super::reader::DeviceReader;
use crate::metrics;

const PER_MILLI: f64 = 1000.0;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    if let Some(milliwatts) = reader.read("nvmlDeviceGetPowerUsage", |d| d.power_usage()) {
        reader.gauge(&metrics::POWER, f64::from(milliwatts) / PER_MILLI);
    }
    if let Some(millijoules) = reader.read("nvmlDeviceGetTotalEnergyConsumption", |d| {
        d.total_energy_consumption()
    }) {
        reader.gauge(&metrics::ENERGY, millijoules as f64 / PER_MILLI);
    }
    if let Some(milliwatts) = reader.read("nvmlDeviceGetEnforcedPowerLimit", |d| {
        d.enforced_power_limit()
    }) {
        reader.gauge(&metrics::POWER_LIMIT, f64::from(milliwatts) / PER_MILLI);
    }
    if let Some(milliwatts) = reader.read("nvmlDeviceGetPowerManagementDefaultLimit", |d| {
        d.power_management_limit_default()
    }) {
        reader.gauge(
            &metrics::POWER_DEFAULT_LIMIT,
            f64::from(milliwatts) / PER_MILLI,
        );
    }
    if let Some(limits) = reader.read("nvmlDeviceGetPowerManagementLimitConstraints", |d| {
        d.power_management_limit_constraints()
    }) {
        reader.gauge(
            &metrics::POWER_MIN_LIMIT,
            f64::from(limits.min_limit) / PER_MILLI,
        );
        reader.gauge(
            &metrics::POWER_MAX_LIMIT,
            f64::from(limits.max_limit) / PER_MILLI,
        );
    }
}
