//! Memory and SRAM health, repairs waiting for a reset, and the recovery
//! action the driver asks for.

use std::iter::zip;

use nvml::calls;
use nvml::types::field_id::{
    NVML_FI_DEV_ECC_CURRENT, NVML_FI_DEV_ECC_DBE_AGG_TOTAL, NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    NVML_FI_DEV_ECC_PENDING, NVML_FI_DEV_ECC_SBE_AGG_TOTAL, NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
};
use nvml::types::{EccCounter, MemoryError, RetirementCause};

use crate::collector::{flag, Collector, Gpu, Hooks};
use crate::metrics::families;

families! {
    FAMILIES;
    ECC_ENABLED: Gauge(Number), "nvidia_gpu_ecc_enabled", [],
        "1 if ECC is enabled now.";
    ECC_PENDING_ENABLED: Gauge(Number), "nvidia_gpu_ecc_pending_enabled", [],
        "1 if ECC will be enabled after the next reboot.";
    ECC_ERRORS: Counter(Count), "nvidia_gpu_ecc_errors_total", ["type", "scope"],
        "ECC errors by type (corrected, uncorrected) and scope (volatile: since the driver loaded; aggregate: lifetime).";
    RETIRED_PAGES: Gauge(Number), "nvidia_gpu_retired_pages", ["cause"],
        "Memory pages retired, by cause (single_bit_ecc, double_bit_ecc).";
    RETIRED_PAGES_PENDING: Gauge(Number), "nvidia_gpu_retired_pages_pending", [],
        "1 if pages are waiting to be retired at the next reboot.";
    REMAPPED_ROWS: Gauge(Number), "nvidia_gpu_remapped_rows", ["cause"],
        "Memory rows remapped, by cause (correctable, uncorrectable).";
    REMAPPED_ROWS_INACTIVE: Gauge(Number), "nvidia_gpu_remapped_rows_inactive", ["cause"],
        "Memory rows remapped that are no longer in use, by cause (correctable, uncorrectable); from drivers that know NVML fields 301 and 302 (580.159 does).";
    REMAPPED_ROWS_PENDING: Gauge(Number), "nvidia_gpu_remapped_rows_pending", [],
        "1 if a row remap is waiting for a GPU reset.";
    REMAPPED_ROWS_FAILURE: Gauge(Number), "nvidia_gpu_remapped_rows_failure", [],
        "1 if a row remap failed: the GPU needs service.";
    ROW_REMAPPER_BANKS: Gauge(Number), "nvidia_gpu_row_remapper_banks", ["availability"],
        "Memory banks by the reserved rows they have left to remap rows into: max (all), high, partial, low, none (a bank with none left cannot remap another row).";
    MEMORY_UNREPAIRABLE: Gauge(Number), "nvidia_gpu_memory_unrepairable", [],
        "1 if the GPU has memory that can no longer be repaired: the GPU needs service.";
    REPAIR_PENDING: Gauge(Number), "nvidia_gpu_repair_pending", ["kind"],
        "1 if a repair of this kind (tpc, channel) waits for the GPU's next reset.";
    SRAM_ECC_ERRORS: Counter(Count), "nvidia_gpu_sram_ecc_errors_total", ["type", "scope"],
        "SRAM ECC errors by type (corrected, uncorrected_parity, uncorrected_sec_ded) and scope (volatile: since the driver loaded; aggregate: lifetime).";
    SRAM_ECC_LOCATION_ERRORS: Counter(Count), "nvidia_gpu_sram_ecc_location_errors_total", ["location"],
        "Uncorrected SRAM ECC errors over the GPU's lifetime by where they occurred (l2, sm, pcie, microcontroller, other).";
    SRAM_ECC_UNIQUE_UNCORRECTED: Gauge(Number), "nvidia_gpu_sram_ecc_unique_uncorrected_errors", ["detection"],
        "Unique uncorrected SRAM ECC errors (NVML's entries: one per SRAM address with uncorrected errors) over the GPU's lifetime, by how they were detected (parity, sec_ded) (Blackwell and newer, driver 580+).";
    SRAM_ECC_THRESHOLD_EXCEEDED: Gauge(Number), "nvidia_gpu_sram_ecc_threshold_exceeded", [],
        "1 if the SRAM ECC errors exceed the threshold of NVIDIA's field diagnostics: the GPU needs service.";
    RECOVERY_ACTION: Gauge(Number), "nvidia_gpu_recovery_action", ["action"],
        "Recovery action the driver asks for, as a state set: 1 for the current action (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain, bus_reset, system_reboot; unknown for a newer one), 0 for the others.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "health",
    default: true,
    help: "ECC mode and errors, retired pages, remapped rows and the banks' rows left to remap into, SRAM ECC errors, TPC and channel repairs waiting for a reset, memory past repair, the recovery action the driver asks for.",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS),
};

type Labelled<T> = (T, &'static str);

const CORRECTED: (MemoryError, &str) = (MemoryError::Corrected, "corrected");
const UNCORRECTED: (MemoryError, &str) = (MemoryError::Uncorrected, "uncorrected");
const VOLATILE: (EccCounter, &str) = (EccCounter::Volatile, "volatile");
const AGGREGATE: (EccCounter, &str) = (EccCounter::Aggregate, "aggregate");

/// The field id, then the same counter as function arguments.
const ECC_COUNTERS: [(u32, Labelled<MemoryError>, Labelled<EccCounter>); 4] = [
    (NVML_FI_DEV_ECC_SBE_VOL_TOTAL, CORRECTED, VOLATILE),
    (NVML_FI_DEV_ECC_DBE_VOL_TOTAL, UNCORRECTED, VOLATILE),
    (NVML_FI_DEV_ECC_SBE_AGG_TOTAL, CORRECTED, AGGREGATE),
    (NVML_FI_DEV_ECC_DBE_AGG_TOTAL, UNCORRECTED, AGGREGATE),
];

const RETIREMENT_CAUSES: [(RetirementCause, &str); 2] = [
    (
        RetirementCause::MultipleSingleBitEccErrors,
        "single_bit_ecc",
    ),
    (RetirementCause::DoubleBitEccError, "double_bit_ecc"),
];

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (driver 570+, newer than the bindings).
pub(super) const FI_GPU_RECOVERY_ACTION: u32 = 230;

/// `NVML_FI_DEV_REMAPPED_ROWS_{COR,UNC}_INACTIVE`, newer than the bindings
/// (driver 580.159 answers them).
const FI_REMAPPED_ROWS_INACTIVE: [(u32, &str); 2] = [(301, "correctable"), (302, "uncorrectable")];

/// `nvmlDeviceGpuRecoveryAction_t` values 0..=7: 0-4 since R570, 5 (recover
/// the IMEX domain) after R595, 6 (reset the PCIe bus) and 7 (reboot the
/// system) since NVML v615 (its change log).
const RECOVERY_ACTIONS: [&str; 8] = [
    "none",
    "gpu_reset",
    "node_reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
];

pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_ECC_CURRENT,
    NVML_FI_DEV_ECC_PENDING,
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    FI_GPU_RECOVERY_ACTION,
    FI_REMAPPED_ROWS_INACTIVE[0].0,
    FI_REMAPPED_ROWS_INACTIVE[1].0,
];

fn read(gpu: &mut Gpu<'_>) {
    recovery_action(gpu);
    // A failing batch entry is counted only through the fallback.
    let current = gpu.nvml.field_or(NVML_FI_DEV_ECC_CURRENT, |_| None);
    let pending = gpu.nvml.field_or(NVML_FI_DEV_ECC_PENDING, |_| None);
    let ecc = match (current, pending) {
        (Some(current), Some(pending)) => Some((current != 0.0, pending != 0.0)),
        _ => gpu
            .nvml
            .read(calls::ECC_MODE, ())
            .map(|mode| (mode.currently_enabled, mode.pending_enabled)),
    };
    gpu.gauge(ECC_ENABLED, ecc.map(|(current, _)| flag(current)));
    gpu.gauge(ECC_PENDING_ENABLED, ecc.map(|(_, pending)| flag(pending)));
    // Error counters only mean something while ECC is on.
    if ecc.is_some_and(|(current, _)| current) {
        for (field, (error, error_label), (counter, counter_label)) in ECC_COUNTERS {
            let count = gpu.nvml.field_or(field, |nvml| {
                nvml.read(calls::TOTAL_ECC_ERRORS, (error, counter))
                    .map(|count| count as f64)
            });
            gpu.gauge_with(ECC_ERRORS, [error_label, counter_label], count);
        }
    }
    for (cause, label) in RETIREMENT_CAUSES {
        let pages = gpu.nvml.read(calls::RETIRED_PAGES, cause);
        gpu.gauge_with(RETIRED_PAGES, [label], pages.map(|p| p.len() as f64));
    }
    let pending = gpu.nvml.read(calls::RETIRED_PAGES_PENDING, ());
    gpu.gauge(RETIRED_PAGES_PENDING, pending.map(flag));
    if let Some(rows) = gpu.nvml.read(calls::REMAPPED_ROWS, ()) {
        let counts = [rows.correctable, rows.uncorrectable];
        for (count, label) in zip(counts, ["correctable", "uncorrectable"]) {
            gpu.push(REMAPPED_ROWS.sample_with([label], f64::from(count)));
        }
        gpu.gauge(REMAPPED_ROWS_PENDING, flag(rows.pending));
        for (field, cause) in FI_REMAPPED_ROWS_INACTIVE {
            let count = gpu.nvml.field(field);
            gpu.gauge_with(REMAPPED_ROWS_INACTIVE, [cause], count);
        }
        gpu.gauge(REMAPPED_ROWS_FAILURE, flag(rows.failure));
    }
    if let Some(b) = gpu.nvml.read(calls::REMAPPER_HISTOGRAM, ()) {
        let banks = [b.max, b.high, b.partial, b.low, b.none];
        for (count, label) in zip(banks, ["max", "high", "partial", "low", "none"]) {
            gpu.push(ROW_REMAPPER_BANKS.sample_with([label], f64::from(count)));
        }
    }
    if let Some(repair) = gpu.nvml.read(calls::REPAIR_STATUS, ()) {
        for (pending, kind) in [(repair.tpc, "tpc"), (repair.channel, "channel")] {
            gpu.push(REPAIR_PENDING.sample_with([kind], flag(pending)));
        }
    }
    let unrepairable = gpu.nvml.read(calls::MEMORY_UNREPAIRABLE, ());
    gpu.gauge(MEMORY_UNREPAIRABLE, unrepairable.map(flag));
    sram_ecc(gpu);
}

fn sram_ecc(gpu: &mut Gpu<'_>) {
    let Some(sram) = gpu.nvml.read(calls::SRAM_ECC, ()) else {
        return;
    };
    for (errors, scope) in [(sram.volatile, "volatile"), (sram.aggregate, "aggregate")] {
        for (count, kind) in [
            (errors.corrected, "corrected"),
            (errors.uncorrected_parity, "uncorrected_parity"),
            (errors.uncorrected_sec_ded, "uncorrected_sec_ded"),
        ] {
            gpu.push(SRAM_ECC_ERRORS.sample_with([kind, scope], count as f64));
        }
    }
    let at = sram.locations;
    for (count, location) in [
        (at.l2, "l2"),
        (at.sm, "sm"),
        (at.pcie, "pcie"),
        (at.microcontroller, "microcontroller"),
        (at.other, "other"),
    ] {
        gpu.push(SRAM_ECC_LOCATION_ERRORS.sample_with([location], count as f64));
    }
    gpu.gauge(SRAM_ECC_THRESHOLD_EXCEEDED, flag(sram.threshold_exceeded));
    // NVML documents the unique errors for Blackwell and newer.
    if !gpu.facts().is_blackwell_or_newer() {
        return;
    }
    if let Some(unique) = gpu.nvml.read(calls::SRAM_UNIQUE, ()) {
        for (count, detection) in [(unique.parity, "parity"), (unique.sec_ded, "sec_ded")] {
            let sample = SRAM_ECC_UNIQUE_UNCORRECTED.sample_with([detection], f64::from(count));
            gpu.push(sample);
        }
    }
}

/// A value newer than this exporter knows is `action="unknown"`.
fn recovery_action(gpu: &mut Gpu<'_>) {
    let Some(value) = gpu.nvml.field(FI_GPU_RECOVERY_ACTION) else {
        return;
    };
    if !gpu.state_set(RECOVERY_ACTION, &RECOVERY_ACTIONS, value) {
        let name = RECOVERY_ACTION.family().name;
        log::debug!("{name}: recovery action {value} is newer than this exporter");
    }
}
