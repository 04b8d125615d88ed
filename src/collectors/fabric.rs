//! The NVLink fabric of NVSwitch systems: registration, cluster and clique,
//! health. Nothing on a GPU on no fabric (read once per driver).

use crate::collector::Gpu;
use crate::metrics;
use crate::nvml::fabric::{self, Condition, FabricState, Summary};

/// The state key under which "this GPU is on a fabric" is kept per driver.
const KEY: &str = "fabric";

pub(super) fn read(reader: &mut Gpu<'_>) {
    // Read once per driver: `Some(None)` is a GPU on no fabric.
    if reader.read_fixed(KEY, fabric::CALL, |d| fabric::on_fabric(d).map(i64::from))
        != Some(Some(1))
    {
        return;
    }
    let Some(info) = reader.fabric_info() else {
        return;
    };
    for state in FabricState::ALL {
        let value = if state == info.state { 1.0 } else { 0.0 };
        reader.push(metrics::FABRIC_STATE.sample_with([state.label()], value));
    }
    reader.gauge(metrics::FABRIC_STATUS, f64::from(info.status));
    reader.push(
        metrics::FABRIC_INFO.sample_with([info.cluster_uuid, info.clique_id.to_string()], 1.0),
    );
    if let Some(mask) = info.health_mask {
        for condition in Condition::ALL {
            if let Some(holds) = condition.holds(mask) {
                let value = if holds { 1.0 } else { 0.0 };
                reader.push(metrics::FABRIC_HEALTH.sample_with([condition.label()], value));
            }
        }
    }
    if let Some(summary) = info.summary {
        for each in Summary::ALL {
            let value = if each == summary { 1.0 } else { 0.0 };
            reader.push(metrics::FABRIC_HEALTH_SUMMARY.sample_with([each.label()], value));
        }
    }
}
