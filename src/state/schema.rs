//! The state file's one schema (JSON by serde), each collector's part a
//! typed field, its bounds, and what makes a file [`Damage`]d. A field missing
//! from a file is its default: the version changes when a field's meaning does.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The version this exporter writes; `state::v1` reads the one before.
pub const VERSION: u32 = 2;

/// The most GPUs a state keeps (more than any host has).
pub const MAX_GPUS: usize = 64;
/// The most XID series (id and code) in the totals, and in a recount.
pub const MAX_XID_SERIES: usize = 64 * MAX_GPUS;
/// The most fixed readings one GPU keeps (its readers keep four).
pub const MAX_FIXED: usize = 32;
/// A larger state file is not ours (the bounds fit with NVML's identifiers).
pub const MAX_SIZE: u64 = 2 << 20;

/// What is wrong with a state file.
#[derive(Debug)]
pub enum Damage {
    NotJson(serde_json::Error),
    Version(u32),
    Schema(serde_json::Error),
    Gpus,
    Fixed(String),
    XidSeries,
    NotV1,
    Truncated,
    LineCount,
    NoEnd,
    AfterEnd,
    HostWithoutValue,
    GpuLine(String),
    Index(String),
    SetLine(String),
    UnknownLine(String),
    UnlistedGpu(String),
    /// A version 1 XID count's key (after `xid.`) and its value, no number.
    XidCount(String, String),
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::NotJson(e) => write!(f, "not a state file: {e}"),
            Damage::Version(version) => write!(f, "version {version} is not {VERSION}"),
            Damage::Schema(e) => e.fmt(f),
            Damage::Gpus => write!(f, "more than {MAX_GPUS} GPUs"),
            Damage::Fixed(uuid) => write!(f, "more than {MAX_FIXED} fixed readings for {uuid}"),
            Damage::XidSeries => write!(f, "more than {MAX_XID_SERIES} XID series"),
            Damage::NotV1 => f.write_str("not a state file"),
            Damage::Truncated => f.write_str("truncated"),
            Damage::LineCount => f.write_str("truncated (line count does not match)"),
            Damage::NoEnd => f.write_str("truncated (no end line)"),
            Damage::AfterEnd => f.write_str("text after the end line"),
            Damage::HostWithoutValue => f.write_str("a host line without a value"),
            Damage::GpuLine(line) => write!(f, "bad gpu line {line:?}"),
            Damage::Index(line) => write!(f, "bad index in {line:?}"),
            Damage::SetLine(line) => write!(f, "bad set line {line:?}"),
            Damage::UnknownLine(line) => write!(f, "unknown line {line:?}"),
            Damage::UnlistedGpu(uuid) => write!(f, "an entry for an unlisted GPU {uuid:?}"),
            Damage::XidCount(key, value) => {
                write!(f, "the XID count xid.{key} is {value:?}, not a number")
            }
        }
    }
}

/// Everything one run leaves for the next.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    pub version: u32,
    /// `/proc/sys/kernel/random/boot_id` of the boot that wrote it.
    pub boot_id: String,
    /// The NVIDIA driver version it was written under; empty if unknown.
    pub driver_version: String,
    pub xid: XidCounts,
    /// Per GPU UUID.
    pub gpus: BTreeMap<String, GpuState>,
}

/// One GPU's state: its identity and [`Self::carries`] last the boot, the
/// rest belongs to the driver it was read under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuState {
    pub index: u32,
    /// `00000000:17:00.0`; empty when it could not be read.
    pub pci_bus_id: String,
    /// Empty when the GPU has none or it could not be read.
    pub serial: String,
    /// The sample streams' positions and running totals (`nvml::samples`).
    pub carries: BTreeMap<Stream, Carry>,
    /// How long the GPU's reads took in the previous run, µs.
    pub reads_us: Option<u64>,
    /// How long its windows took to close in the previous run, µs.
    pub closing_us: Option<u64>,
    /// Already reported as having left enumeration.
    pub left_enumeration: bool,
    /// Why GPM was unavailable in the previous run, its label.
    pub gpm_unavailable: Option<String>,
    /// Readings fixed while the driver is loaded, by name; `None`: not supported.
    pub fixed: BTreeMap<String, Option<i64>>,
    /// The NVLink links seen active under this driver, one bit per link.
    pub links_seen_active: u64,
}

impl GpuState {
    /// What lasts a change of the driver: the identity and running totals.
    pub fn after_driver_change(&self) -> GpuState {
        GpuState {
            index: self.index,
            pci_bus_id: self.pci_bus_id.clone(),
            serial: self.serial.clone(),
            carries: self.carries.clone(),
            ..GpuState::default()
        }
    }
}

/// One of NVML's sample streams whose running totals the state keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Gpu,
    Memory,
    Encoder,
    Decoder,
    /// The GPU engine's samples as per-process utilization reads them.
    Processes,
}

/// One sample stream's position and running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Carry {
    /// Timestamp (µs of CPU wall clock) of the last sample consumed; 0: none.
    pub last_us: u64,
    /// The sample period observed last; 0: not known yet.
    pub period_us: u64,
    /// Busy time so far: the sum of percent × µs.
    pub busy_percent_us: u64,
    /// Time the consumed samples covered so far, µs.
    pub sampled_us: u64,
}

impl Carry {
    /// Whether it can be a stream's: busy at most 100 % of the sampled time.
    pub fn is_possible(&self) -> bool {
        self.busy_percent_us <= self.sampled_us.saturating_mul(100)
    }

    pub fn busy_seconds(&self) -> f64 {
        self.busy_percent_us as f64 / 1e8
    }

    pub fn sampled_seconds(&self) -> f64 {
        self.sampled_us as f64 / 1e6
    }
}

/// The xid collector's position in the kernel log, kept whatever happens to
/// its totals (a position lost with totals kept would count the boot again).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct XidCounts {
    /// `journal` or `kmsg`, the position's source; empty before a boot's first read.
    pub source: String,
    /// Set while no kernel log can be read (so that it is said once).
    pub unavailable: bool,
    /// The journal cursor of the last kernel entry read (completely).
    pub cursor: Option<String>,
    /// That entry's `__MONOTONIC_TIMESTAMP` (µs since boot).
    pub monotonic: Option<u64>,
    /// The sequence number of the last /dev/kmsg record read.
    pub kmsg_seq: Option<u64>,
    /// Every XID from the start of this boot up to the position.
    pub totals: XidTotals,
    /// A recount of this boot up to the position, under way (not published).
    pub recount: Option<XidTotals>,
}

/// XID counts per GPU UUID and per bus id that matched no GPU, each per code.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct XidTotals {
    pub gpus: BTreeMap<String, BTreeMap<u32, u64>>,
    pub unattributed: BTreeMap<String, BTreeMap<u32, u64>>,
    /// Lines saying a GPU fell off the bus (outside an Xid line), per GPU UUID.
    pub fallen_off_bus: BTreeMap<String, u64>,
    pub fallen_off_bus_unattributed: BTreeMap<String, u64>,
    /// NVSwitch SXids: one record per switch, bus id, code and severity.
    pub sxids: Vec<SxidCount>,
}

/// The count of one NVSwitch SXid series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SxidCount {
    /// N of `nvidia-nvswitchN`.
    pub switch: u32,
    pub pci_bus_id: String,
    pub code: u32,
    /// `fatal` or `non_fatal`.
    pub severity: String,
    pub count: u64,
}

impl XidTotals {
    /// How many series (id and code) the totals hold.
    pub fn series(&self) -> usize {
        let per_code = self.gpus.values().chain(self.unattributed.values());
        let fallen = self.fallen_off_bus.len() + self.fallen_off_bus_unattributed.len();
        per_code.map(BTreeMap::len).sum::<usize>() + fallen + self.sxids.len()
    }
}
