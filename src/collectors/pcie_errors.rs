//! PCIe error counters the GPU keeps (driver 535+), by kind. Off by default:
//! twelve field values a run, and a healthy GPU counts many (read as rates).

use nvml::types::field_id::{
    NVML_FI_DEV_PCIE_COUNT_BAD_DLLP, NVML_FI_DEV_PCIE_COUNT_BAD_TLP,
    NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS, NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    NVML_FI_DEV_PCIE_COUNT_LANE_ERROR, NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR,
    NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED, NVML_FI_DEV_PCIE_COUNT_NAKS_SENT,
    NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR, NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR,
    NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ, NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER,
};

use crate::collector::{Collector, Gpu, Hooks};
use crate::metrics::families;

families! {
    FAMILIES;
    PCIE_ERRORS: Counter(Count), "nvidia_gpu_pcie_errors_total", ["kind"],
        "PCIe link events counted by the GPU since the driver was loaded, by kind: l0_to_recovery, correctable, nak_received, nak_sent, receiver, bad_tlp, bad_dllp, non_fatal, fatal, unsupported_request, lcrc, lane (only with --collector pcie-errors).";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "pcie-errors",
    default: false,
    help: "PCIe error counters by kind: L0 to recovery, correctable, NAKs, receiver, bad TLP/DLLP, non-fatal, fatal, unsupported request, LCRC, lane (12 field values a run).",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS),
};

/// nvml.h `NVML_FI_DEV_PCIE_*`, 169 and 173-183.
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

pub(super) const FIELDS: &[u32] = &{
    let mut ids = [0; KINDS.len()];
    let mut i = 0;
    while i < ids.len() {
        ids[i] = KINDS[i].0;
        i += 1;
    }
    ids
};

fn read(gpu: &mut Gpu<'_>) {
    for (field, kind) in KINDS {
        let count = gpu.nvml.field(field);
        gpu.gauge_with(PCIE_ERRORS, [kind], count);
    }
}
