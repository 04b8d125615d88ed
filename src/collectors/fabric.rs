//! The NVLink fabric of NVSwitch systems. Nothing on a GPU on no fabric (read
//! once per driver).

use crate::collector::{flag, Collector, Fixed, Gpu, Hooks};
use crate::metrics::families;
use nvml::calls;
use nvml::fabric::{Condition, FabricState, Summary};

families! {
    FAMILIES;
    FABRIC_STATE: Gauge(Number), "nvidia_gpu_fabric_state", ["state"],
        "Registration of the GPU with the NVLink fabric (Fabric Manager), as a state set: 1 for the current state (not_started, in_progress, completed), 0 for the others.";
    FABRIC_STATUS: Gauge(Number), "nvidia_gpu_fabric_status", [],
        "NVML return code of the GPU's fabric registration: 0 success; meaningful once the state is completed.";
    FABRIC_INFO: Gauge(Number), "nvidia_gpu_fabric_info", ["cluster_uuid", "clique_id"],
        "The NVLink fabric cluster and clique of the GPU as labels; always 1.";
    FABRIC_HEALTH: Gauge(Number), "nvidia_gpu_fabric_health_condition", ["condition"],
        "1 if this fabric health condition holds, 0 if not, by condition (degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery, incorrect_configuration); absent where the driver does not report it.";
    FABRIC_HEALTH_SUMMARY: Gauge(Number), "nvidia_gpu_fabric_health", ["summary"],
        "The driver's summary of the fabric's health (struct version 3), as a state set: 1 for the current one (healthy, unhealthy, limited_capacity), 0 for the others.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "fabric",
    default: true,
    help: "NVLink fabric of NVSwitch systems: registration state and status, cluster and clique, health conditions and summary (nothing on GPUs on no fabric; that answer is read once per driver).",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]),
};

/// Whether the GPU is on a fabric.
const ON_FABRIC: Fixed = Fixed("fabric");

fn read(gpu: &mut Gpu<'_>) {
    // `Some(None)` is a GPU on no fabric.
    if gpu.read_fixed(ON_FABRIC, calls::FABRIC_INFO, (), |_| 1) != Some(Some(1)) {
        return;
    }
    let Some(info) = gpu.nvml.read(calls::FABRIC_INFO, ()) else {
        return;
    };
    for state in FabricState::ALL {
        gpu.push(FABRIC_STATE.sample_with([state.label()], flag(state == info.state)));
    }
    gpu.gauge(FABRIC_STATUS, f64::from(info.status));
    gpu.push(FABRIC_INFO.sample_with([info.cluster_uuid, info.clique_id.to_string()], 1.0));
    if let Some(mask) = info.health_mask {
        for condition in Condition::ALL {
            let holds = condition.holds(mask).map(flag);
            gpu.gauge_with(FABRIC_HEALTH, [condition.label()], holds);
        }
    }
    if let Some(summary) = info.summary {
        for each in Summary::ALL {
            gpu.push(FABRIC_HEALTH_SUMMARY.sample_with([each.label()], flag(each == summary)));
        }
    }
}
