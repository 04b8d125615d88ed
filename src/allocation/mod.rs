//! What the node's schedulers gave whom: the GPUs and MIG instances
//! allocated to a Slurm job or a pod, whether or not a process runs on them,
//! read from the node's own files (no API, no credentials). One file per
//! source: the kubelet's device-plugin checkpoint ([`kubelet`]), NVIDIA's
//! DRA driver's checkpoint ([`dra`]), the Slurm
//! hook's records ([`spool`], exact edges), and the mapping directories
//! sites keep for other tools ([`mapping`]). A file is read only if root or
//! the running user wrote it and no one else can change it ([`file`]); a
//! damaged one costs the allocations it names, said in [`Found::problems`],
//! never the others. An allocation whose job or pod no longer runs (its
//! control group is gone, [`alive`]) is left out. It knows no NVML: GPUs are
//! named as the source names them ([`Device`]), and the `tasks` collector
//! finds them.

use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::bounded;

pub mod alive;
mod dra;
mod file;
mod kubelet;
mod mapping;
pub mod spool;

pub use mapping::JobMap;

/// Where the allocations are read (the command line's options).
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub kubelet_checkpoint: PathBuf,
    pub dra_checkpoint: PathBuf,
    pub slurm_hook_dir: PathBuf,
    pub job_maps: Vec<JobMap>,
    /// The control group root, which tells a job or pod that still runs.
    pub cgroupfs: PathBuf,
}

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
fn is_uuid(text: &str) -> bool {
    let groups: Vec<usize> = text.split('-').map(str::len).collect();
    groups == [8, 4, 4, 4, 12] && text.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
}

/// A decimal number of at most 20 digits.
fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit())
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

/// What the sources gave, and what could not be read.
#[derive(Debug, Default)]
pub struct Found {
    pub allocations: Vec<Allocation>,
    pub problems: Vec<String>,
}

impl Found {
    fn add(&mut self, (allocations, problems): (Vec<Allocation>, Vec<String>)) {
        self.allocations.extend(allocations);
        self.problems.extend(problems);
    }
}

/// Reads every source on a thread of its own until `until` (a file system
/// that does not answer gives no allocations, and says so).
pub fn read(sources: &Sources, until: Instant) -> Found {
    let sources = sources.clone();
    let read = move || {
        let mut found = Found::default();
        let clock = Clock::now();
        found.add(kubelet::read(&sources.kubelet_checkpoint));
        found.add(dra::read(&sources.dra_checkpoint));
        let cgroups = alive::Cgroups::new(&sources.cgroupfs);
        let (records, problems) = spool::records(&sources.slurm_hook_dir);
        found.add((
            spool::allocations(&records, !cgroups.shows_slurm()),
            problems,
        ));
        for map in &sources.job_maps {
            found.add(mapping::read(map, &clock));
        }
        found
            .allocations
            .retain(|a| a.end.is_some() || cgroups.runs(&a.task));
        found
    };
    bounded::call("allocations", until, read).unwrap_or_else(|_| Found {
        allocations: Vec::new(),
        problems: vec!["the allocations' files did not answer in time".into()],
    })
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
    fn boot_us_of(&self, wall: SystemTime) -> Option<u64> {
        let ago = self.wall.duration_since(wall).ok()?;
        Some(self.boot_us.saturating_sub(ago.as_micros() as u64))
    }
}
