//! NVLink links: state, error counters and data counters.

use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_NVLINK_ERROR_DL_CRC, NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, NVML_FI_DEV_NVLINK_LINK_COUNT,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
};

use super::fields::{self, Field};
use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

/// `NVML_NVLINK_MAX_LINKS` of nvml.h.
const MAX_LINKS: u32 = 18;

/// NVML counts NVLink data in KiB.
const BYTES_PER_KIB: f64 = 1024.0;

const ERROR_COUNTERS: [(ErrorCounter, &str); 4] = [
    (ErrorCounter::DlReplay, "replay"),
    (ErrorCounter::DlRecovery, "recovery"),
    (ErrorCounter::DlCrcFlit, "crc_flit"),
    (ErrorCounter::DlCrcData, "crc_data"),
];

/// Field values this collector takes from the per-GPU batch: the link count
/// bounds the per-link probing.
pub(super) const FIELDS: &[u32] = &[NVML_FI_DEV_NVLINK_LINK_COUNT];

/// Per-link fields read in one batch: the data-link error counters (same
/// counts as `nvmlDeviceGetNvLinkErrorCounter`) and the data counters. On an
/// H200 with 18 links the 72 single error-counter calls took 79 ms per GPU.
const LINK_FIELDS: [u32; 5] = [
    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
];

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let last = reader
        .field(NVML_FI_DEV_NVLINK_LINK_COUNT)
        .map_or(MAX_LINKS, |count| (count as u32).min(MAX_LINKS));
    let mut links = Vec::new();
    for link in 0..last {
        match reader.try_read("nvmlDeviceGetNvLinkState", |d| {
            d.link_wrapper_for(link).is_active()
        }) {
            None => return,
            Some(Ok(active)) => links.push((link, active)),
            // A GPU without NVLink says so for link 0; past the last link NVML
            // answers "invalid argument".
            Some(Err(NvmlError::NotSupported)) if link == 0 => return,
            Some(Err(NvmlError::InvalidArg)) => break,
            Some(Err(error)) => reader.note("nvmlDeviceGetNvLinkState", &error),
        }
    }
    let requests: Vec<Field> = links
        .iter()
        .flat_map(|&(link, _)| LINK_FIELDS.map(|id| Field { id, scope: link }))
        .collect();
    let values = fields::read(reader, &requests);
    for (&(link, active), values) in links.iter().zip(values.chunks(LINK_FIELDS.len())) {
        let label = link.to_string();
        reader.push(
            Sample::new(&metrics::NVLINK_ACTIVE, if active { 1.0 } else { 0.0 })
                .with("link", label.clone()),
        );
        let [replay, recovery, crc, transmit, receive] = values else {
            continue;
        };
        match (replay, recovery, crc) {
            (Some(replay), Some(recovery), Some(crc)) => {
                for (count, counter) in [(replay, "replay"), (recovery, "recovery"), (crc, "crc")] {
                    reader.push(
                        Sample::new(&metrics::NVLINK_ERRORS, *count)
                            .with("link", label.clone())
                            .with("counter", counter),
                    );
                }
            }
            _ => read_error_counters(reader, link, &label),
        }
        for (value, family) in [
            (transmit, &metrics::NVLINK_TRANSMIT),
            (receive, &metrics::NVLINK_RECEIVE),
        ] {
            if let Some(kib) = value {
                reader.push(Sample::new(family, kib * BYTES_PER_KIB).with("link", label.clone()));
            }
        }
    }
}

/// The error counters of one link, one call each: for drivers without the
/// per-link error fields (before R520). CRC errors then come as flit and data.
fn read_error_counters(reader: &mut DeviceReader<'_>, link: u32, label: &str) {
    for (counter, counter_label) in ERROR_COUNTERS {
        if let Some(count) = reader.read("nvmlDeviceGetNvLinkErrorCounter", |d| {
            d.link_wrapper_for(link).error_counter(counter)
        }) {
            reader.push(
                Sample::new(&metrics::NVLINK_ERRORS, count as f64)
                    .with("link", label.to_owned())
                    .with("counter", counter_label),
            );
        }
    }
}
