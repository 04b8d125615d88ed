//! What the sources give, as plain data: a device as a source names it, the
//! task it was given to, and the edges of the allocation on the boot clock.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// A GPU or MIG instance as a source names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Device {
    /// `GPU-…` or `MIG-…`, as NVML prints them.
    Uuid(String),
    /// A MIG instance in the form drivers before R470 printed
    /// (`MIG-GPU-<uuid>/<gpu instance>/<compute instance>`).
    Instance(String, u32),
    /// NVML's index (PCI bus id order), and a GPU instance id on it: how
    /// Slurm numbers GPUs (its GRES index: NVML's order with
    /// `AutoDetect=nvml`, the order of gres.conf's `File=/dev/nvidia<N>`
    /// lines without, which is the same where the driver numbered the
    /// devices in PCI order), and jobstats and DCGM after it.
    Index(u32, Option<u32>),
}

impl Device {
    /// A UUID as device plugins and Slurm write it: a time-sliced replica's
    /// `::<n>` suffix dropped (and reported as shared).
    pub fn from_uuid(text: &str) -> Option<(Device, bool)> {
        let (uuid, shared) = match text.split_once("::") {
            Some((uuid, replica)) if is_digits(replica) => (uuid, true),
            Some(_) => return None,
            None => (text, false),
        };
        if let Some(legacy) = uuid.strip_prefix("MIG-GPU-") {
            let mut parts = legacy.split('/');
            let (gpu, gi) = (parts.next()?, parts.next()?.parse().ok()?);
            return is_uuid(gpu).then(|| (Device::Instance(format!("GPU-{gpu}"), gi), shared));
        }
        let known = ["GPU-", "MIG-"]
            .iter()
            .any(|p| uuid.strip_prefix(p).is_some_and(is_uuid));
        known.then(|| (Device::Uuid(uuid.to_owned()), shared))
    }
}

/// Whether `text` is the hex-and-dash body of an NVML UUID.
pub fn is_uuid(text: &str) -> bool {
    let groups: Vec<usize> = text.split('-').map(str::len).collect();
    groups == [8, 4, 4, 4, 12] && text.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
}

/// A decimal number of at most 20 digits.
pub fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit())
}

/// `text` as a number, if it is one of decimal digits ([`is_digits`]).
pub fn number(text: &str) -> Option<u32> {
    is_digits(text).then(|| text.parse().ok())?
}

/// Whom a device was given.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Task {
    /// By number, and by SLUID where the hook was told it (Slurm 25.11).
    Slurm {
        job_id: String,
        sluid: Option<String>,
    },
    /// A pod's container; a DRA claim names only the pod.
    Pod {
        uid: String,
        container: Option<String>,
    },
}

/// A known instant of an allocation: when (µs after boot), and the GPU's
/// energy counter then (mJ) where it was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    pub at_us: u64,
    pub energy_mj: Option<u64>,
}

/// One device given to one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub device: Device,
    pub task: Task,
    /// A time-sliced replica, shared with other tasks.
    pub shared: bool,
    /// Its start and end where the source knows them; else it holds from
    /// the previous run to this one.
    pub start: Option<Edge>,
    pub end: Option<Edge>,
    /// A Slurm job's user, where the source says (the hook, jobstats' files).
    pub uid: Option<u32>,
}

/// The boot clock the edges are on, and the wall clock files are stamped by.
pub struct Clock {
    boot_us: u64,
    wall: SystemTime,
}

impl Clock {
    pub fn now() -> Clock {
        Clock {
            boot_us: crate::procfs::boot_us(),
            wall: SystemTime::now(),
        }
    }

    /// `wall` on the boot clock (0 before boot); `None` after now.
    pub fn boot_us_of(&self, wall: SystemTime) -> Option<u64> {
        let ago = self.wall.duration_since(wall).ok()?;
        Some(self.boot_us.saturating_sub(ago.as_micros() as u64))
    }
}
