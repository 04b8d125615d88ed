//! PCIe error counters the GPU keeps (driver 535+), as one counter family with
//! the kind as a label. Off by default: twelve field values a run (about
//! 0.18 ms each on an H200, driver 580; its capture, tests/captures, holds
//! 3279 L0→recovery transitions and hundreds of receiver, bad TLP and NAK
//! counts on an idle, healthy GPU: read them as rates, not as faults).

use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_PCIE_COUNT_BAD_DLLP, NVML_FI_DEV_PCIE_COUNT_BAD_TLP,
    NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS, NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    NVML_FI_DEV_PCIE_COUNT_LANE_ERROR, NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR,
    NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED, NVML_FI_DEV_PCIE_COUNT_NAKS_SENT,
    NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR, NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR,
    NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ, NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER,
};

use crate::collector::Gpu;
use crate::metrics;

/// The counters (nvml.h `NVML_FI_DEV_PCIE_*`, 169 and 173-183) with their
/// `kind` label values.
const KINDS: [(u32, &str); 12] = [
    (NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER, "l0_to_recovery"),
    (NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS, "correctable"),
    (NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED, "nak_received"),
    (NVML_FI_DEV_PCIE_COUNT_NAKS_SENT, "nak_sent"),
    (NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR, "receiver"),
    (NVML_FI_DEV_PCIE_COUNT_BAD_TLP, "bad_tlp"),
    (NVML_FI_DEV_PCIE_COUNT_BAD_DLLP, "bad_dllp"),
    (NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR, "non_fatal"),
    (NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR, "fatal"),
    (
        NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ,
        "unsupported_request",
    ),
    (NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR, "lcrc"),
    (NVML_FI_DEV_PCIE_COUNT_LANE_ERROR, "lane"),
];

/// Field values this collector takes from the per-GPU batch.
pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER,
    NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS,
    NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED,
    NVML_FI_DEV_PCIE_COUNT_NAKS_SENT,
    NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR,
    NVML_FI_DEV_PCIE_COUNT_BAD_TLP,
    NVML_FI_DEV_PCIE_COUNT_BAD_DLLP,
    NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR,
    NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ,
    NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR,
    NVML_FI_DEV_PCIE_COUNT_LANE_ERROR,
];

pub(super) fn read(reader: &mut Gpu<'_>) {
    for (field, kind) in KINDS {
        if let Some(count) = reader.field(field) {
            reader.push(metrics::PCIE_ERRORS.sample_with([kind], count));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_batched() {
        let kinds: Vec<u32> = KINDS.iter().map(|(field, _)| *field).collect();
        assert_eq!(kinds, FIELDS);
    }
}
