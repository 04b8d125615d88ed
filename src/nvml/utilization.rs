//! Utilization ratios and the count of compute processes.

use super::reader::DeviceReader;
use crate::metrics;

/// NVML reports utilization in percent of its sample period; a reading above 100
/// is not a utilization and is dropped rather than exported.
pub(super) fn percent_to_ratio(percent: u32) -> Option<f64> {
    (percent <= 100).then(|| f64::from(percent) / 100.0)
}

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    if let Some(rates) = reader.read("nvmlDeviceGetUtilizationRates", |d| d.utilization_rates()) {
        for (family, percent) in [
            (&metrics::UTILIZATION, rates.gpu),
            (&metrics::MEMORY_UTILIZATION, rates.memory),
        ] {
            match percent_to_ratio(percent) {
                Some(ratio) => reader.gauge(family, ratio),
                None => reader.reject(family, f64::from(percent)),
            }
        }
    }
    if let Some(count) = reader.read("nvmlDeviceGetComputeRunningProcesses_v3", |d| {
        d.running_compute_processes_count()
    }) {
        reader.gauge(&metrics::PROCESSES, f64::from(count));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_converts_to_ratio_and_rejects_impossible_values() {
        assert_eq!(percent_to_ratio(0), Some(0.0));
        assert_eq!(percent_to_ratio(87), Some(0.87));
        assert_eq!(percent_to_ratio(100), Some(1.0));
        assert_eq!(percent_to_ratio(101), None);
        assert_eq!(percent_to_ratio(u32::MAX), None);
    }
}
