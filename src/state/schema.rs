//! The state file's one schema (JSON by serde), its bounds, and what makes a
//! file [`Damage`]d. A field missing from a file is its default: the version
//! changes when a field's meaning does. What a collector keeps across runs
//! is a [`Part`] it declares in its own file, kept under its name in
//! [`GpuState::parts`]: the schema, the codec and the merge know none of
//! them (the sample carries, the task ledger and the XID counts, with
//! bounded readers of their own, are typed fields).

use std::collections::{BTreeMap, BTreeSet};

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::bounded;

use crate::kernel_log::{Counts, MAX_SERIES};
use crate::task::Ledger as TaskLedger;

/// The version this exporter writes; `state::v1` reads the one before.
pub const VERSION: u32 = 2;

/// The most GPUs a state keeps (more than any host has).
pub const MAX_GPUS: usize = 64;
/// The most fixed readings, numbers and labels, one GPU keeps (its readers
/// keep a few).
pub const MAX_FIXED: usize = 32;
/// The most labels one fixed reading keeps (an `_info` series' labels:
/// platform keeps 5).
pub const MAX_LABELS: usize = 8;
/// The most parts one GPU keeps, and the longest one's text: small values
/// (a part larger than that needs a typed field with a bounded reader).
pub const MAX_PARTS: usize = 8;
pub const MAX_PART_BYTES: usize = 512;
/// The most unsupported calls one GPU keeps (about 60 calls are declared,
/// some of them per clock, link or counter).
pub const MAX_UNSUPPORTED: usize = 256;
/// The most problems [`State::said`] keeps.
pub const MAX_SAID: usize = 16;
/// A larger state file is not ours. Every bound filled, with NVML's
/// identifiers, takes 22.6 MiB: per GPU under 352 KiB (its task ledger, 256
/// holders of up to 1 KiB with their totals and 1024 processes, 313 KiB; 256
/// unsupported calls, 21 KiB; its fixed readings), and the XID series twice
/// (totals and a recount), 1.2 MiB of the 2 MiB.
pub const MAX_SIZE: u64 = (2 << 20) + MAX_GPUS as u64 * (352 << 10);

/// What is wrong with a state file.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    #[error("not a state file: {0}")]
    NotJson(serde_json::Error),
    #[error("version {0} is not {VERSION}")]
    Version(u32),
    #[error(transparent)]
    Schema(serde_json::Error),
    #[error("more than {MAX_GPUS} GPUs")]
    Gpus,
    #[error("more than {MAX_FIXED} fixed readings for {0}")]
    Fixed(String),
    #[error("more than {MAX_SERIES} XID series")]
    XidSeries,
    #[error("a task ledger beyond its bounds for {0}")]
    Tasks(String),
    /// A version 1 file's damage that names no line.
    #[error("{0}")]
    V1(&'static str),
    /// A version 1 line (or the UUID it names) and what is wrong with it.
    #[error("{0} {1:?}")]
    V1Line(&'static str, String),
    #[error("the XID count xid.{0} is {1:?}, not a number")]
    XidCount(String, String),
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
    #[serde(deserialize_with = "bounded::xid")]
    pub xid: Counts,
    /// Per GPU UUID.
    #[serde(deserialize_with = "gpus")]
    pub gpus: BTreeMap<String, GpuState>,
    /// The host's problems the last run logged (its allocation sources'),
    /// at most [`MAX_SAID`]: one that lasts is logged once, when it begins.
    #[serde(deserialize_with = "said")]
    pub said: Vec<String>,
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
    /// The collectors' parts, by [`Part::NAME`].
    #[serde(deserialize_with = "parts")]
    pub parts: BTreeMap<String, Kept>,
    /// Readings fixed while the driver is loaded, by name; `None`: not supported.
    #[serde(deserialize_with = "fixed")]
    pub fixed: BTreeMap<String, Option<i64>>,
    /// Readings fixed while the driver is loaded whose value is the labels
    /// of an `_info` series, by name; `None`: not supported.
    #[serde(deserialize_with = "fixed_labels")]
    pub fixed_labels: BTreeMap<String, Option<Vec<String>>>,
    /// The calls that answered NOT_SUPPORTED under this driver.
    pub unsupported: Unsupported,
    /// The tasks collector's accounting (kept across a driver reload).
    #[serde(deserialize_with = "bounded::ledger")]
    pub tasks: TaskLedger,
}

/// The declared NVML calls (with their arguments) a GPU answered
/// NOT_SUPPORTED under one driver and MIG mode (enabling MIG changes what a
/// GPU supports, without a driver change): they are not made again for
/// [`Unsupported::RUNS`] runs, then asked afresh (an answer that was only
/// for the moment costs a reading at most that long).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Unsupported {
    /// The current MIG mode they were answered under; `None`: unknown.
    pub mig_mode: Option<u32>,
    #[serde(deserialize_with = "unsupported")]
    pub calls: BTreeSet<String>,
    /// The runs since they were last asked.
    pub runs: u32,
}

impl Unsupported {
    /// 40 runs: 10 minutes of the timer.
    pub const RUNS: u32 = 40;
}

impl GpuState {
    pub fn after_driver_change(&self) -> GpuState {
        let across = self.parts.iter().filter(|(_, kept)| kept.across_drivers);
        GpuState {
            index: self.index,
            pci_bus_id: self.pci_bus_id.clone(),
            serial: self.serial.clone(),
            carries: self.carries.clone(),
            parts: across
                .map(|(name, kept)| (name.clone(), kept.clone()))
                .collect(),
            tasks: self.tasks.clone(),
            ..GpuState::default()
        }
    }

    /// The part `P` kept, if it reads as one (a part of another shape, a
    /// damaged one, is none: its collector starts it afresh).
    pub fn part<P: Part>(&self) -> Option<P> {
        serde_json::from_str(self.parts.get(P::NAME)?.value.get()).ok()
    }

    /// Keeps `part` for the next run; one whose text is longer than
    /// [`MAX_PART_BYTES`] is not kept (logged).
    pub fn set_part<P: Part>(&mut self, part: &P) {
        let value = serde_json::value::to_raw_value(part).ok();
        let Some(value) = value.filter(|value| value.get().len() <= MAX_PART_BYTES) else {
            return log::warn!("the state part {} is too large to keep", P::NAME);
        };
        let kept = Kept {
            across_drivers: P::ACROSS_DRIVERS,
            value,
        };
        self.parts.insert(P::NAME.to_owned(), kept);
    }
}

/// What a collector keeps across runs on one GPU, in its own serde form:
/// declared beside the code that reads it, kept under [`Part::NAME`], kept
/// where a run did not set it (`merge`) and, unless [`Part::ACROSS_DRIVERS`],
/// forgotten with the driver's state.
pub trait Part: Serialize + DeserializeOwned {
    /// Its key, unique among the parts (the collector's name first).
    const NAME: &'static str;
    /// It outlives a driver change.
    const ACROSS_DRIVERS: bool = false;
}

/// A part as the state keeps it: its text, read by its collector.
#[derive(Debug, Clone, Serialize)]
pub struct Kept {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub across_drivers: bool,
    pub value: Box<RawValue>,
}

impl<'de> Deserialize<'de> for Kept {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Read {
            #[serde(default)]
            across_drivers: bool,
            value: Box<RawValue>,
        }
        let read = Read::deserialize(d)?;
        if read.value.get().len() > MAX_PART_BYTES {
            return Err(D::Error::custom(format_args!(
                "a part longer than {MAX_PART_BYTES} bytes"
            )));
        }
        Ok(Kept {
            across_drivers: read.across_drivers,
            value: read.value,
        })
    }
}

impl PartialEq for Kept {
    fn eq(&self, other: &Kept) -> bool {
        self.across_drivers == other.across_drivers && self.value.get() == other.value.get()
    }
}

impl Eq for Kept {}

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

/// [`State::gpus`]: at most [`MAX_GPUS`].
fn gpus<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, GpuState>, D::Error> {
    bounded::map(d, MAX_GPUS, "GPUs")
}

/// [`GpuState::fixed`]: at most [`MAX_FIXED`] (with the labels, checked
/// once both are read).
fn fixed<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Option<i64>>, D::Error> {
    bounded::map(d, MAX_FIXED, "fixed readings")
}

/// One fixed reading's labels: at most [`MAX_LABELS`].
struct Labels(Vec<String>);

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        bounded::seq(d, MAX_LABELS, "labels of a fixed reading").map(Labels)
    }
}

/// [`GpuState::fixed_labels`]: at most [`MAX_FIXED`], each of at most
/// [`MAX_LABELS`] labels.
fn fixed_labels<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Option<Vec<String>>>, D::Error> {
    let read: BTreeMap<String, Option<Labels>> = bounded::map(d, MAX_FIXED, "fixed readings")?;
    let labels = |(name, labels): (String, Option<Labels>)| (name, labels.map(|l| l.0));
    Ok(read.into_iter().map(labels).collect())
}

/// [`State::said`]: at most [`MAX_SAID`].
fn said<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    bounded::seq(d, MAX_SAID, "problems said")
}

/// [`GpuState::parts`]: at most [`MAX_PARTS`].
fn parts<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Kept>, D::Error> {
    bounded::map(d, MAX_PARTS, "parts")
}

/// [`Unsupported::calls`]: at most [`MAX_UNSUPPORTED`].
fn unsupported<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<String>, D::Error> {
    bounded::seq(d, MAX_UNSUPPORTED, "unsupported calls")
}
