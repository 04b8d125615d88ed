//! Memory health: ECC mode and error counters, retired pages, remapped rows.

use std::ffi::c_uint;

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
use nvml_wrapper::error::{nvml_sym, nvml_try};

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

const ECC_COUNTERS: [(MemoryError, &str, EccCounter, &str); 4] = [
    (
        MemoryError::Corrected,
        "corrected",
        EccCounter::Volatile,
        "volatile",
    ),
    (
        MemoryError::Uncorrected,
        "uncorrected",
        EccCounter::Volatile,
        "volatile",
    ),
    (
        MemoryError::Corrected,
        "corrected",
        EccCounter::Aggregate,
        "aggregate",
    ),
    (
        MemoryError::Uncorrected,
        "uncorrected",
        EccCounter::Aggregate,
        "aggregate",
    ),
];

const RETIREMENT_CAUSES: [(RetirementCause, &str); 2] = [
    (
        RetirementCause::MultipleSingleBitEccErrors,
        "single_bit_ecc",
    ),
    (RetirementCause::DoubleBitEccError, "double_bit_ecc"),
];

fn flag(on: bool) -> f64 {
    if on {
        1.0
    } else {
        0.0
    }
}

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let ecc = reader.read("nvmlDeviceGetEccMode", |d| d.is_ecc_enabled());
    if let Some(mode) = &ecc {
        reader.gauge(&metrics::ECC_ENABLED, flag(mode.currently_enabled));
        reader.gauge(&metrics::ECC_PENDING_ENABLED, flag(mode.pending_enabled));
    }
    // Error counters only mean something while ECC is on; NVML answers "not
    // supported" otherwise anyway, so skip the calls.
    if ecc.is_some_and(|mode| mode.currently_enabled) {
        for (error, error_label, counter, counter_label) in ECC_COUNTERS {
            if let Some(count) = reader.read("nvmlDeviceGetTotalEccErrors", |d| {
                d.total_ecc_errors(error, counter)
            }) {
                reader.push(
                    Sample::new(&metrics::ECC_ERRORS, count as f64)
                        .with("type", error_label)
                        .with("scope", counter_label),
                );
            }
        }
    }
    for (cause, label) in RETIREMENT_CAUSES {
        if let Some(pages) = reader.read("nvmlDeviceGetRetiredPages_v2", |d| d.retired_pages(cause))
        {
            reader.push(
                Sample::new(&metrics::RETIRED_PAGES, pages.len() as f64).with("cause", label),
            );
        }
    }
    if let Some(pending) = reader.read("nvmlDeviceGetRetiredPagesPendingStatus", |d| {
        d.are_pages_pending_retired()
    }) {
        reader.gauge(&metrics::RETIRED_PAGES_PENDING, flag(pending));
    }
    if let Some([correctable, uncorrectable, pending, failure]) =
        reader.read_raw("nvmlDeviceGetRemappedRows", |lib, handle| {
            let get = nvml_sym(lib.nvmlDeviceGetRemappedRows.as_ref())?;
            let mut rows: [c_uint; 4] = [0; 4];
            let [a, b, c, d] = &mut rows;
            // SAFETY: four valid out-pointers.
            nvml_try(unsafe { get(handle, a, b, c, d) })?;
            Ok(rows)
        })
    {
        for (count, label) in [
            (correctable, "correctable"),
            (uncorrectable, "uncorrectable"),
        ] {
            reader
                .push(Sample::new(&metrics::REMAPPED_ROWS, f64::from(count)).with("cause", label));
        }
        reader.gauge(&metrics::REMAPPED_ROWS_PENDING, flag(pending != 0));
        reader.gauge(&metrics::REMAPPED_ROWS_FAILURE, flag(failure != 0));
    }
}
