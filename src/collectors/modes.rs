//! Persistence, compute and MIG modes.

use nvml_wrapper::enum_wrappers::device::ComputeMode;

use crate::collector::Gpu;
use crate::metrics;

pub(super) fn read(reader: &mut Gpu<'_>) {
    if let Some(on) = reader.read("nvmlDeviceGetPersistenceMode", |d| {
        d.is_in_persistent_mode()
    }) {
        reader.gauge(metrics::PERSISTENCE_MODE, if on { 1.0 } else { 0.0 });
    }
    if let Some(mode) = reader.read_enum::<ComputeMode>() {
        let label = match mode {
            Ok(ComputeMode::Default) => "default",
            Ok(ComputeMode::ExclusiveThread) => "exclusive_thread",
            Ok(ComputeMode::Prohibited) => "prohibited",
            Ok(ComputeMode::ExclusiveProcess) => "exclusive_process",
            Err(_) => "unknown",
        };
        reader.push(metrics::COMPUTE_MODE.sample_with([label], 1.0));
    }
    if let Some(mig) = reader.mig_mode() {
        reader.gauge(metrics::MIG_ENABLED, f64::from(u8::from(mig.current == 1)));
        reader.gauge(
            metrics::MIG_PENDING_ENABLED,
            f64::from(u8::from(mig.pending == 1)),
        );
    }
}
