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
use std::time::Instant;

use crate::bounded;

pub mod alive;
mod dra;
mod file;
mod kubelet;
mod mapping;
mod model;
pub mod spool;

pub use mapping::JobMap;
pub use model::{Allocation, Device, Edge, Task};

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
        let clock = model::Clock::now();
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
