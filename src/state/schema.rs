//! The state file's one schema (version [`VERSION`]): what one run leaves for
//! the next, each collector's part a typed field, its codec derived by serde
//! (JSON). A type here only holds values; the code that decides what they mean
//! is in the collector that owns the field, the rules of the file (trust,
//! bounds, lock) in `state`.
//!
//! A field missing from a file is its default, so that a field added later
//! needs no new version: the version changes when a field's meaning does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The version this exporter writes; `state::v1` reads the one before.
pub const VERSION: u32 = 2;

/// Everything one run leaves for the next.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// Always [`VERSION`] in a file this exporter wrote.
    pub version: u32,
    /// `/proc/sys/kernel/random/boot_id` of the boot that wrote it.
    pub boot_id: String,
    /// The NVIDIA driver version it was written under; empty if unknown.
    pub driver_version: String,
    /// The xid collector's position in the kernel log and its counts.
    pub xid: XidCounts,
    /// Per GPU, by UUID.
    pub gpus: BTreeMap<String, GpuState>,
}

/// What the previous runs left for one GPU. Its identity and [`Self::carries`]
/// last the boot; the other fields belong to the driver they were read under
/// and are dropped when it changes ([`Self::after_driver_change`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuState {
    pub index: u32,
    /// `00000000:17:00.0`; empty when it could not be read.
    pub pci_bus_id: String,
    /// Empty when the GPU has none or it could not be read.
    pub serial: String,
    /// The sample streams' positions and running totals (`nvml::samples`),
    /// which a driver reload does not invalidate: they are integrated from
    /// wall-clock-stamped samples.
    pub carries: BTreeMap<Stream, Carry>,
    /// How long the GPU's reads took in the previous run, µs (`gpus`).
    pub reads_us: Option<u64>,
    /// How long its windows took to close in the previous run (the second
    /// GPM samples and the metrics), µs (`gpus`).
    pub closing_us: Option<u64>,
    /// Already reported as having left enumeration (`gpus`).
    pub left_enumeration: bool,
    /// Why GPM was unavailable in the previous run, its label (`gpm`).
    pub gpm_unavailable: Option<String>,
    /// Readings that do not change while the driver is loaded, by name
    /// (`threshold.shutdown`, …); `None`: NVML does not support it.
    pub fixed: BTreeMap<String, Option<i64>>,
    /// The NVLink links seen active under this driver, one bit per link
    /// (`nvlink`).
    pub links_seen_active: u64,
}

impl GpuState {
    /// What of this GPU's state lasts a change of the driver: its identity
    /// and its running totals.
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

/// One of NVML's sample streams whose totals the state carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Gpu,
    Memory,
    Encoder,
    Decoder,
    /// The GPU engine's samples as per-process utilization reads them (its
    /// own carry, so that it does not depend on what `utilization` consumed).
    Processes,
}

/// What one sample stream carries from run to run (see `nvml::samples`).
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

/// The xid collector's running totals and its position in the kernel log.
/// The position is kept whatever happens to the totals: a position lost with
/// totals kept would count the boot again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct XidCounts {
    /// `journal` or `kmsg`: the source the position belongs to; empty before
    /// the first read of a boot.
    pub source: String,
    /// Set while no kernel log can be read (so that this is said once); the
    /// position and totals of the last source stay as they were meanwhile.
    pub unavailable: bool,
    /// The journal cursor of the last kernel entry read (completely).
    pub cursor: Option<String>,
    /// That entry's `__MONOTONIC_TIMESTAMP` (µs since boot).
    pub monotonic: Option<u64>,
    /// The sequence number of the last /dev/kmsg record read.
    pub kmsg_seq: Option<u64>,
    /// The totals published: every XID from the start of this boot up to the
    /// position (while no recount is under way).
    pub totals: XidTotals,
    /// A recount of this boot from its start, under way: the XIDs from the
    /// start of the boot up to the position.
    pub recount: Option<XidTotals>,
}

/// XID counts per GPU UUID and per unattributed bus id, each per code.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct XidTotals {
    /// Per GPU UUID, per code.
    pub gpus: BTreeMap<String, BTreeMap<u32, u64>>,
    /// Per normalised bus id that matched no GPU, per code.
    pub unattributed: BTreeMap<String, BTreeMap<u32, u64>>,
    /// Lines saying a GPU fell off the bus (outside an Xid line), per GPU UUID.
    pub fallen_off_bus: BTreeMap<String, u64>,
    /// The same, per normalised bus id that matched no GPU.
    pub fallen_off_bus_unattributed: BTreeMap<String, u64>,
    /// NVSwitch SXids: one record per switch, bus id, code and severity.
    pub sxids: Vec<SxidCount>,
}

/// The count of one NVSwitch SXid series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SxidCount {
    /// N of `nvidia-nvswitchN`.
    pub switch: u32,
    /// The switch's normalised PCI bus id.
    pub pci_bus_id: String,
    pub code: u32,
    /// `fatal` or `non_fatal`.
    pub severity: String,
    pub count: u64,
}

impl XidTotals {
    /// How many series (id and code) the totals hold.
    pub fn series(&self) -> usize {
        let xids: usize = self
            .gpus
            .values()
            .chain(self.unattributed.values())
            .map(BTreeMap::len)
            .sum();
        let fallen = self.fallen_off_bus.len() + self.fallen_off_bus_unattributed.len();
        xids + fallen + self.sxids.len()
    }
}
