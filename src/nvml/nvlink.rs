//! NVLink links: state, error counters and data counters.

use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
};

use super::fields::{self, Field};
use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

/// `NVML_NVLINK_MAX_LINKS` of nvml.h.
const MAX_LINKS: u32 = 18;

/// NVML counts NVLink data in KiB.
const BYTES_PER_KIB: f64 = 1024.0;

/// The counters of `nvmlDeviceGetNvLinkErrorCounter`; the two CRC counters come
/// last, since [`LINK_FIELDS`] can replace the first two.
const ERROR_COUNTERS: [(ErrorCounter, &str); 4] = [
    (ErrorCounter::DlReplay, "replay"),
    (ErrorCounter::DlRecovery, "recovery"),
    (ErrorCounter::DlCrcFlit, "crc_flit"),
    (ErrorCounter::DlCrcData, "crc_data"),
];

/// Field values this collector takes from the per-GPU batch: the link count
/// bounds the per-link probing.
pub(super) const FIELDS: &[u32] = &[NVML_FI_DEV_NVLINK_LINK_COUNT];

/// Per-link fields read in one batch: the replay and recovery counters (same
/// counts as `nvmlDeviceGetNvLinkErrorCounter`) and the data counters. On an
/// H200 with 18 links each single error-counter call took about 1.1 ms.
///
/// CRC errors are not taken from `NVML_FI_DEV_NVLINK_ERROR_DL_CRC`: on H200s
/// (driver 580) it read 0 on every link while the function reported 4 to 36
/// CRC data errors per link, so flit and data CRC counts come from the function.
const LINK_FIELDS: [u32; 4] = [
    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
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
        let [replay, recovery, transmit, receive] = values else {
            continue;
        };
        let counters = match (replay, recovery) {
            (Some(replay), Some(recovery)) => {
                for (count, counter) in [(replay, "replay"), (recovery, "recovery")] {
                    reader.push(
                        Sample::new(&metrics::NVLINK_ERRORS, *count)
                            .with("link", label.clone())
                            .with("counter", counter),
                    );
                }
                &ERROR_COUNTERS[2..]
            }
            _ => &ERROR_COUNTERS[..],
        };
        read_error_counters(reader, link, &label, counters);
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

/// Error counters of one link, one call each (all four on drivers without the
/// per-link error fields).
fn read_error_counters(
    reader: &mut DeviceReader<'_>,
    link: u32,
    label: &str,
    counters: &[(ErrorCounter, &'static str)],
) {
    for &(counter, counter_label) in counters {
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
