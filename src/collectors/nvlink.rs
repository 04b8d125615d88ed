//! NVLink: the counters summed over the links (`nvlink`) and per link
//! (`nvlink-links`). The link count is read, never a compiled-in maximum;
//! NVLink 5 (Blackwell) counters replace the Hopper ones where the GPU has them.

use nvml::fields::Field;
use nvml::types::field_id::{
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    NVML_FI_DEV_NVLINK_GET_STATE, NVML_FI_DEV_NVLINK_LINK_COUNT,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
};
use nvml::types::ErrorCounter;
use nvml::{calls, Code, DeviceReader};
use serde::{Deserialize, Serialize};

use crate::collector::{flag, Collector, Fixed, Gpu, Hooks};
use crate::metrics::{families, Labelled};
use crate::snapshot::LabelValue;
use crate::state::schema::Part;

families! {
    FAMILIES;
    NVLINK_LINKS: Gauge(Number), "nvidia_gpu_nvlink_links", [],
        "NVLink links the GPU has.";
    NVLINK_LINKS_ACTIVE: Gauge(Number), "nvidia_gpu_nvlink_links_active", [],
        "NVLink links that are active.";
    NVLINK_ERRORS: Counter(Count), "nvidia_gpu_nvlink_errors_total", ["counter"],
        "NVLink errors summed over the GPU's links, by counter (replay, recovery, crc_flit, crc_data; effective, symbol on NVLink 5).";
    NVLINK_TRANSMIT: Counter(Bytes), "nvidia_gpu_nvlink_transmit_bytes_total", [],
        "Data bytes sent over NVLink, summed over the GPU's links.";
    NVLINK_RECEIVE: Counter(Bytes), "nvidia_gpu_nvlink_receive_bytes_total", [],
        "Data bytes received over NVLink, summed over the GPU's links.";
    NVLINK_RECOVERIES: Counter(Count), "nvidia_gpu_nvlink_recoveries_total", ["result"],
        "NVLink link recoveries summed over the GPU's links, by result (successful, failed); NVLink 5 (Blackwell) and newer.";
    NVLINK_LINKS_LOST: Gauge(Number), "nvidia_gpu_nvlink_links_lost", [],
        "NVLink links that were active earlier in this boot (under this driver) and are not active now.";
}

families! {
    LINKS_FAMILIES;
    NVLINK_LINK_ACTIVE: Gauge(Number), "nvidia_gpu_nvlink_link_active", ["link"],
        "1 if the NVLink link is active, by link (only with --collector nvlink-links).";
    NVLINK_LINK_ERRORS: Counter(Count), "nvidia_gpu_nvlink_link_errors_total", ["link", "counter"],
        "NVLink errors by link and counter: replay, recovery, crc_flit, crc_data; effective, symbol on NVLink 5 (only with --collector nvlink-links).";
    NVLINK_LINK_RECOVERIES: Counter(Count), "nvidia_gpu_nvlink_link_recoveries_total", ["link", "result"],
        "NVLink link recoveries by link and result (successful, failed); NVLink 5 and newer (only with --collector nvlink-links).";
    NVLINK_LINK_BIT_ERROR: Gauge(Ratio), "nvidia_gpu_nvlink_link_bit_error_ratio", ["link", "kind"],
        "NVLink bit error rate the link reports, by link and kind (effective, symbol); NVLink 5 and newer (only with --collector nvlink-links).";
    NVLINK_LINK_TRANSMIT: Counter(Bytes), "nvidia_gpu_nvlink_link_transmit_bytes_total", ["link"],
        "Data bytes sent over the NVLink link, by link (only with --collector nvlink-links).";
    NVLINK_LINK_RECEIVE: Counter(Bytes), "nvidia_gpu_nvlink_link_receive_bytes_total", ["link"],
        "Data bytes received over the NVLink link, by link (only with --collector nvlink-links).";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "nvlink",
    default: true,
    help: "NVLink links, active links and links lost since they were active this boot, error, recovery and data counters summed over the links (batched field reads; NVLink 5 counters on Blackwell).",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS),
};

pub(super) static LINKS: Collector = Collector {
    name: "nvlink-links",
    default: false,
    help: "NVLink state, error and data counters per link (up to 7 series a link; CRC counters one call per link and counter), on NVLink 5 recoveries, effective and symbol errors and bit error rates instead of the Hopper counters (up to 9 a link, no extra calls).",
    families: LINKS_FAMILIES,
    hooks: Hooks::read(read_links, LINKS_FIELDS),
};

/// More links than any GPU has: a larger count is a sentinel, and probing
/// without a count stops here.
const MAX_LINKS: u32 = 64;

/// NVLink 5 counters per link (nvml.h `NVML_FI_DEV_NVLINK_COUNT_*`).
const LINK_RECOVERY_SUCCESSFUL: u32 = 213;
const LINK_RECOVERY_FAILED: u32 = 214;
const LINK_RECOVERY_EVENTS: u32 = 215;
const EFFECTIVE_ERRORS: u32 = 219;
const SYMBOL_ERRORS: u32 = 221;
const EFFECTIVE_BER: u32 = 220;
const SYMBOL_BER: u32 = 222;

/// The counters (the first four, all the per-GPU collector reads), then the
/// bit error rates.
const NVLINK5_FIELDS: [u32; 6] = [
    LINK_RECOVERY_SUCCESSFUL,
    LINK_RECOVERY_FAILED,
    EFFECTIVE_ERRORS,
    SYMBOL_ERRORS,
    EFFECTIVE_BER,
    SYMBOL_BER,
];

/// The per-link collector's series of each of [`NVLINK5_FIELDS`].
const NVLINK5_SERIES: [(Labelled<2>, &str); 6] = [
    (NVLINK_LINK_RECOVERIES, "successful"),
    (NVLINK_LINK_RECOVERIES, "failed"),
    (NVLINK_LINK_ERRORS, "effective"),
    (NVLINK_LINK_ERRORS, "symbol"),
    (NVLINK_LINK_BIT_ERROR, "effective"),
    (NVLINK_LINK_BIT_ERROR, "symbol"),
];

const BYTES_PER_KIB: f64 = 1024.0;

pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_NVLINK_LINK_COUNT,
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
];

pub(super) const LINKS_FIELDS: &[u32] = &[NVML_FI_DEV_NVLINK_LINK_COUNT];

/// Field 165: 0 inactive, 1 active, 2 asleep (not lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    Active,
    Inactive,
    Asleep,
}

impl LinkState {
    fn from_active(active: bool) -> LinkState {
        if active {
            LinkState::Active
        } else {
            LinkState::Inactive
        }
    }
}

/// Links probed with `nvmlDeviceGetNvLinkState` where there is no count field.
fn read(gpu: &mut Gpu<'_>) {
    let (count, probed) = match link_count(&mut gpu.nvml) {
        Some(count) => (count, Vec::new()),
        None => match probe_links(&mut gpu.nvml, MAX_LINKS) {
            Some(probed) if probed.iter().any(Option::is_some) => (probed.len() as u32, probed),
            _ => return,
        },
    };
    if count == 0 {
        return;
    }
    let links: Vec<u32> = (0..count).collect();
    let (ids, values) = read_batch(gpu, &links, &LINK_FIELDS, &NVLINK5_FIELDS[..4]);
    let links: Vec<&[Option<f64>]> = values.chunks(ids.len()).collect();
    // Probed links count only when every probe answered.
    if probed.iter().all(Option::is_some) {
        gpu.gauge(NVLINK_LINKS, f64::from(count));
    }
    let states: Vec<Option<LinkState>> = (0..count)
        .zip(&links)
        .map(|(link, values)| match probed.get(link as usize) {
            Some(active) => active.map(LinkState::from_active),
            None => link_state(gpu, link, values[0]),
        })
        .collect();
    let active: Option<u32> = states
        .iter()
        .map(|state| state.map(|state| u32::from(state == LinkState::Active)))
        .sum();
    gpu.gauge(NVLINK_LINKS_ACTIVE, active.map(f64::from));
    count_lost(gpu, &states);
    // Only when every link answered (else a false reset).
    let sum = |id: u32| -> Option<f64> {
        let at = ids.iter().position(|&i| i == id)?;
        links.iter().map(|values| values[at]).sum()
    };
    // NVML's per-GPU total where the driver has it, else the links' sum.
    let nvml = &mut gpu.nvml;
    let replay = nvml.field(NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL);
    let replay = replay.or_else(|| sum(NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY));
    let recovery = nvml.field(NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL);
    let recovery = recovery.or_else(|| sum(NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY));
    let crc_flit = nvml.field(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL);
    let crc_data = nvml.field(NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL);
    let successful = sum(LINK_RECOVERY_SUCCESSFUL);
    for (family, label, count) in [
        (NVLINK_RECOVERIES, "successful", successful),
        (NVLINK_RECOVERIES, "failed", sum(LINK_RECOVERY_FAILED)),
        (NVLINK_ERRORS, "replay", replay),
        (NVLINK_ERRORS, "recovery", recovery),
        (NVLINK_ERRORS, "crc_flit", crc_flit),
        (NVLINK_ERRORS, "crc_data", crc_data),
        (NVLINK_ERRORS, "effective", sum(EFFECTIVE_ERRORS)),
        (NVLINK_ERRORS, "symbol", sum(SYMBOL_ERRORS)),
    ] {
        gpu.gauge_with(family, [label], count);
    }
    for (id, family) in [
        (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVLINK_TRANSMIT),
        (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVLINK_RECEIVE),
    ] {
        gpu.gauge(family, sum(id).map(|kib| kib * BYTES_PER_KIB));
    }
}

fn link_count(reader: &mut DeviceReader<'_>) -> Option<u32> {
    let count = reader.field(NVML_FI_DEV_NVLINK_LINK_COUNT)?;
    reader.bounded("NVML_FI_DEV_NVLINK_LINK_COUNT", count as u32, MAX_LINKS)
}

const NVLINK5_PROBE: Field = Field {
    id: LINK_RECOVERY_EVENTS,
    scope: 0,
};

/// Whether the GPU answers [`NVLINK5_PROBE`].
const NVLINK5: Fixed = Fixed("nvlink5");

fn has_nvlink5(gpu: &mut Gpu<'_>) -> bool {
    gpu.read_fixed(NVLINK5, calls::FIELD, NVLINK5_PROBE, |_| 1) == Some(Some(1))
}

/// The links seen active under this driver, one bit per link: a link seen
/// once and down now is lost.
#[derive(Default, Serialize, Deserialize)]
struct SeenActive(u64);

impl Part for SeenActive {
    const NAME: &'static str = "nvlink.seen_active";
}

/// Left out while a link seen active earlier in this boot has a state not
/// read this run.
fn count_lost(gpu: &mut Gpu<'_>, states: &[Option<LinkState>]) {
    let SeenActive(mut seen) = gpu.previous_state().part().unwrap_or_default();
    let (mut lost, mut unknown) = (0, false);
    for (link, state) in states.iter().enumerate().take(64) {
        let bit = 1u64 << link;
        match state {
            Some(LinkState::Active) => seen |= bit,
            Some(LinkState::Inactive) if seen & bit != 0 => lost += 1,
            None if seen & bit != 0 => unknown = true,
            _ => {}
        }
    }
    gpu.next_state().set_part(&SeenActive(seen));
    if !unknown {
        gpu.gauge(NVLINK_LINKS_LOST, f64::from(lost));
    }
}

/// Read of each link: the state (by the per-GPU collector only: the per-link
/// one probes each link), then the counters both collectors read. No CRC
/// counts: the CRC field read 0 on H200s (driver 580).
const LINK_FIELDS: [u32; 5] = [
    NVML_FI_DEV_NVLINK_GET_STATE,
    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
];

/// The field ids read of each link (`fields`, then `nvlink5_fields` where the
/// GPU has NVLink 5), and their values link after link in one batch (all
/// `None` where it failed).
fn read_batch(
    gpu: &mut Gpu<'_>,
    links: &[u32],
    fields: &[u32],
    nvlink5_fields: &[u32],
) -> (Vec<u32>, Vec<Option<f64>>) {
    let extra = if has_nvlink5(gpu) {
        nvlink5_fields
    } else {
        &[]
    };
    let ids: Vec<u32> = fields.iter().chain(extra).copied().collect();
    let requests: Vec<Field> = (links.iter())
        .flat_map(|&link| ids.iter().map(move |&id| Field { id, scope: link }))
        .collect();
    let values = gpu.nvml.read_each(calls::FIELD_VALUES, &requests);
    let values = values.unwrap_or_else(|| vec![None; requests.len()]);
    (ids, values)
}

/// The state field, else `nvmlDeviceGetNvLinkState`.
fn link_state(gpu: &mut Gpu<'_>, link: u32, state: Option<f64>) -> Option<LinkState> {
    match state {
        Some(0.0) => Some(LinkState::Inactive),
        Some(1.0) => Some(LinkState::Active),
        Some(2.0) => Some(LinkState::Asleep),
        Some(state) => {
            gpu.reject(NVLINK_LINKS_ACTIVE.family(), state);
            None
        }
        None => gpu
            .nvml
            .read(calls::NVLINK_ACTIVE, link)
            .map(LinkState::from_active),
    }
}

/// The CRC counters last: [`LINK_FIELDS`] can replace the first two.
const ERROR_COUNTERS: [(ErrorCounter, &str); 4] = [
    (ErrorCounter::DlReplay, "replay"),
    (ErrorCounter::DlRecovery, "recovery"),
    (ErrorCounter::DlCrcFlit, "crc_flit"),
    (ErrorCounter::DlCrcData, "crc_data"),
];

/// `nvmlDeviceGetNvLinkState` of links 0, 1, … up to the first NVML does not
/// know (`None` where it failed; every link `None` when down); `None`: no NVLink.
fn probe_links(reader: &mut DeviceReader<'_>, last: u32) -> Option<Vec<Option<bool>>> {
    let mut links = Vec::new();
    for link in 0..last {
        // A GPU without NVLink says so for link 0; past the last link NVML
        // answers "invalid argument".
        let expected = |error: &nvml::Error| match error.code() {
            Code::NotSupported => link == 0,
            code => code == Code::InvalidArgument,
        };
        match reader.read_expecting(calls::NVLINK_ACTIVE, link, expected) {
            Some(Ok(active)) => links.push(Some(active)),
            Some(Err(error)) if error.code() == Code::NotSupported => return None,
            Some(Err(_)) => break,
            None => links.push(None),
        }
    }
    Some(links)
}

/// The batch, then the error counters it lacks, one call per link and counter.
fn read_links(gpu: &mut Gpu<'_>) {
    let last = link_count(&mut gpu.nvml).unwrap_or(MAX_LINKS);
    let Some(probed) = probe_links(&mut gpu.nvml, last) else {
        return;
    };
    let (links, active): (Vec<u32>, Vec<bool>) = (0..)
        .zip(probed)
        .filter_map(|(link, active)| Some((link, active?)))
        .unzip();
    let (ids, values) = read_batch(gpu, &links, &LINK_FIELDS[1..], &NVLINK5_FIELDS);
    for ((link, active), values) in links.into_iter().zip(active).zip(values.chunks(ids.len())) {
        let label = || LabelValue::from(link.to_string());
        gpu.push(NVLINK_LINK_ACTIVE.sample_with([label()], flag(active)));
        let Some(([replay, recovery, transmit, receive], nvlink5_values)) =
            values.split_first_chunk()
        else {
            continue;
        };
        for (&(family, kind), value) in NVLINK5_SERIES.iter().zip(nvlink5_values) {
            let is_ber = family.family() == NVLINK_LINK_BIT_ERROR.family();
            let value = value.map(|value| if is_ber { ber(value) } else { value });
            gpu.gauge_with(family, [label(), kind.into()], value);
        }
        let counters = match (replay, recovery) {
            (Some(replay), Some(recovery)) => {
                for (count, counter) in [(replay, "replay"), (recovery, "recovery")] {
                    gpu.push(NVLINK_LINK_ERRORS.sample_with([label(), counter.into()], *count));
                }
                &ERROR_COUNTERS[2..]
            }
            // NVLink 5 has none of the Hopper counters: nothing to call for.
            _ if !nvlink5_values.is_empty() => &[],
            _ => &ERROR_COUNTERS[..],
        };
        for &(counter, name) in counters {
            let count = gpu.nvml.read(calls::NVLINK_ERROR_COUNTER, (link, counter));
            let count = count.map(|count| count as f64);
            gpu.gauge_with(NVLINK_LINK_ERRORS, [label(), name.into()], count);
        }
        for (value, family) in [
            (transmit, NVLINK_LINK_TRANSMIT),
            (receive, NVLINK_LINK_RECEIVE),
        ] {
            gpu.gauge_with(family, [label()], value.map(|kib| kib * BYTES_PER_KIB));
        }
    }
}

/// Mantissa (bits 8-11) × 10^-exponent (bits 0-7).
fn ber(raw: f64) -> f64 {
    let bits = raw as u64;
    let exponent = (bits & 0xff) as i32;
    let mantissa = ((bits >> 8) & 0xf) as f64;
    mantissa * 10f64.powi(-exponent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_error_rates_decode_as_mantissa_times_ten_to_minus_exponent() {
        // 3 × 10^-12: mantissa 3 in bits 8-11, exponent 12 in bits 0-7.
        assert_eq!(ber(f64::from(3u32 << 8 | 12)), 3e-12);
        assert_eq!(ber(0.0), 0.0);
        assert_eq!(ber(f64::from(15u32 << 8 | 255)), 15.0 * 10f64.powi(-255));
    }
}
