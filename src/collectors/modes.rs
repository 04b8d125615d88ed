//! Persistence, compute and MIG modes.

use nvml::calls;
use nvml::types::ComputeMode;

use crate::collector::{flag, Collector, Gpu, Hooks};
use crate::metrics::families;

families! {
    FAMILIES;
    PERSISTENCE_MODE: Gauge(Number), "nvidia_gpu_persistence_mode", [],
        "1 if persistence mode is on.";
    COMPUTE_MODE: Gauge(Number), "nvidia_gpu_compute_mode", ["mode"],
        "The compute mode as a label (default, exclusive_thread, exclusive_process, prohibited); always 1.";
    MIG_ENABLED: Gauge(Number), "nvidia_gpu_mig_enabled", [],
        "1 if MIG mode is enabled now.";
    MIG_PENDING_ENABLED: Gauge(Number), "nvidia_gpu_mig_pending_enabled", [],
        "1 if MIG mode will be enabled after the next GPU reset.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "modes",
    default: true,
    help: "Persistence, compute and MIG modes.",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]),
};

fn read(gpu: &mut Gpu<'_>) {
    let on = gpu.nvml.read(calls::PERSISTENCE_MODE, ());
    gpu.gauge(PERSISTENCE_MODE, on.map(flag));
    if let Some(mode) = gpu.nvml.read(calls::COMPUTE_MODE, ()) {
        let label = match mode {
            Ok(ComputeMode::Default) => "default",
            Ok(ComputeMode::ExclusiveThread) => "exclusive_thread",
            Ok(ComputeMode::Prohibited) => "prohibited",
            Ok(ComputeMode::ExclusiveProcess) => "exclusive_process",
            Err(_) => "unknown",
        };
        gpu.push(COMPUTE_MODE.sample_with([label], 1.0));
    }
    if let Some(mig) = gpu.nvml.mig_mode() {
        gpu.gauge(MIG_ENABLED, flag(mig.current == 1));
        gpu.gauge(MIG_PENDING_ENABLED, flag(mig.pending == 1));
    }
}
