//! Persistence, compute and MIG modes.

use nvml_wrapper::enum_wrappers::device::ComputeMode;

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    if let Some(on) = reader.read("nvmlDeviceGetPersistenceMode", |d| {
        d.is_in_persistent_mode()
    }) {
        reader.gauge(&metrics::PERSISTENCE_MODE, if on { 1.0 } else { 0.0 });
    }
    if let Some(mode) = reader.read("nvmlDeviceGetComputeMode", |d| d.compute_mode()) {
        let label = match mode {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveThread => "exclusive_thread",
            ComputeMode::Prohibited => "prohibited",
            ComputeMode::ExclusiveProcess => "exclusive_process",
        };
        reader.push(Sample::new(&metrics::COMPUTE_MODE, 1.0).with("mode", label));
    }
    if let Some(mig) = reader.read("nvmlDeviceGetMigMode", |d| d.mig_mode()) {
        reader.gauge(&metrics::MIG_ENABLED, f64::from(u8::from(mig.current == 1)));
        reader.gauge(
            &metrics::MIG_PENDING_ENABLED,
            f64::from(u8::from(mig.pending == 1)),
        );
    }
}
