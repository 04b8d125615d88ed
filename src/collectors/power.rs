//! Power draw, energy and power limits. NVML reports milliwatts and millijoules.

use crate::metrics;
use crate::nvml::reader::DeviceReader;

use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
};

pub(super) const PER_MILLI: f64 = 1000.0;

/// Field values this collector takes from the per-GPU batch: the energy (same
/// millijoules as `nvmlDeviceGetTotalEnergyConsumption`) and the power the
/// driver averaged over one second (milliwatts; Ampere and later, driver 535+;
/// no function offers it).
pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    NVML_FI_DEV_POWER_AVERAGE,
];

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    if let Some(milliwatts) = reader.read("nvmlDeviceGetPowerUsage", |d| d.power_usage()) {
        reader.gauge(&metrics::POWER, f64::from(milliwatts) / PER_MILLI);
    }
    let energy = reader.field_or(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, |reader| {
        reader
            .read("nvmlDeviceGetTotalEnergyConsumption", |d| {
                d.total_energy_consumption()
            })
            .map(|millijoules| millijoules as f64)
    });
    if let Some(millijoules) = energy {
        reader.gauge(&metrics::ENERGY, millijoules / PER_MILLI);
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
    if let Some(milliwatts) = reader.field(NVML_FI_DEV_POWER_AVERAGE) {
        reader.gauge(&metrics::POWER_AVERAGE, milliwatts / PER_MILLI);
    }
}
