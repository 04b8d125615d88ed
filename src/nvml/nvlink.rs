//! NVLink links: state, error counters and data counters.

use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::sys_exports::field_id::{
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

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let mut links = Vec::new();
    for link in 0..MAX_LINKS {
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
    let mut requests = Vec::with_capacity(links.len() * 2);
    for &(link, active) in &links {
        let label = link.to_string();
        reader.push(
            Sample::new(&metrics::NVLINK_ACTIVE, if active { 1.0 } else { 0.0 })
                .with("link", label.clone()),
        );
        for (counter, counter_label) in ERROR_COUNTERS {
            if let Some(count) = reader.read("nvmlDeviceGetNvLinkErrorCounter", |d| {
                d.link_wrapper_for(link).error_counter(counter)
            }) {
                reader.push(
                    Sample::new(&metrics::NVLINK_ERRORS, count as f64)
                        .with("link", label.clone())
                        .with("counter", counter_label),
                );
            }
        }
        for id in [
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ] {
            requests.push(Field { id, scope: link });
        }
    }
    let values = fields::read(reader, &requests);
    for (request, value) in requests.iter().zip(values) {
        let Some(kib) = value else { continue };
        let family = if request.id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX {
            &metrics::NVLINK_TRANSMIT
        } else {
            &metrics::NVLINK_RECEIVE
        };
        reader
            .push(Sample::new(family, kib * BYTES_PER_KIB).with("link", request.scope.to_string()));
    }
}
