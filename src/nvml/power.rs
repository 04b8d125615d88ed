//! Power draw and energy.

use super::reader::DeviceReader;
use crate::metrics;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    if let Some(milliwatts) = reader.read("nvmlDeviceGetPowerUsage", |d| d.power_usage()) {
        reader.gauge(&metrics::POWER, f64::from(milliwatts) / 1000.0);
    }
    if let Some(millijoules) = reader.read("nvmlDeviceGetTotalEnergyConsumption", |d| {
        d.total_energy_consumption()
    }) {
        reader.gauge(&metrics::ENERGY, millijoules as f64 / 1000.0);
    }
}
