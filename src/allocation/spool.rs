//! The Slurm hook's records (`--slurm-hook-dir`, on /run: a boot's): one
//! file per job, `job_<id>.json`, that the prolog writes and the epilog
//! completes, with each GPU's energy counter at both edges, so that a job's
//! time and energy are its own to the edge. Written atomically by the hook
//! (root's, as slurmd runs it), read by the runs; the hook removes records
//! finished an hour ago. A record left open (no epilog) ends where another
//! job's prolog takes its GPU, or where its job's control group is gone.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::file;
use super::model::{is_digits, number, Allocation, Device, Edge, Task};

/// A record of a job on 64 GPUs is about 12 KiB.
const MAX_SIZE: u64 = 64 << 10;
/// More jobs than a node runs in an hour.
const MAX_RECORDS: usize = 4096;
/// How long a finished record stays for the runs to count its end.
pub const KEEP_US: u64 = 3600 * 1_000_000;

/// One job's allocation on this node, as its prolog and epilog saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub job_id: String,
    /// `SLURM_JOB_SLUID`, where Slurm (25.11 and later) set it.
    #[serde(default)]
    pub sluid: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    pub gpus: Vec<GpuEdges>,
    /// What the hook could not do, in its words.
    #[serde(default)]
    pub problems: Vec<String>,
}

/// One GPU of the job: how Slurm named it and its two edges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEdges {
    /// A UUID, or a number: Slurm's index of the GPU (see [`Device::Index`]).
    pub name: String,
    /// Its UUID, where NVML said.
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub prolog: Option<Edge>,
    #[serde(default)]
    pub epilog: Option<Edge>,
}

impl Record {
    /// The job it records.
    fn task(&self) -> Task {
        Task::Slurm {
            job_id: self.job_id.clone(),
            sluid: self.sluid.clone(),
        }
    }
}

impl GpuEdges {
    /// Whether both name one GPU: by UUID where both know it, else by
    /// Slurm's name (a prolog that could not read NVML knows only that).
    pub fn same_gpu(&self, other: &GpuEdges) -> bool {
        match (&self.uuid, &other.uuid) {
            (Some(a), Some(b)) => a == b,
            _ => {
                let names = |g: &GpuEdges| [Some(g.name.clone()), g.uuid.clone()].into_iter();
                names(self)
                    .flatten()
                    .any(|a| names(other).flatten().any(|b| a == b))
            }
        }
    }

    pub fn device(&self) -> Option<Device> {
        let by_uuid = self.uuid.as_deref().and_then(Device::from_uuid);
        match by_uuid.or_else(|| Device::from_uuid(&self.name)) {
            Some((device, _)) => Some(device),
            None => Some(Device::Index(number(&self.name)?, None)),
        }
    }
}

fn path(dir: &Path, job_id: &str) -> PathBuf {
    dir.join(format!("job_{job_id}.json"))
}

/// The records in `dir`; a record that is not one costs only its own.
pub fn records(dir: &Path) -> (Vec<Record>, Vec<String>) {
    let named = |why: String| format!("the Slurm hook's records in {}: {why}", dir.display());
    let (names, more) = match file::names(dir, MAX_RECORDS) {
        Ok(Some(names)) => names,
        Ok(None) => return Default::default(),
        Err(why) => return (Vec::new(), vec![named(why.to_string())]),
    };
    let mut problems = Vec::new();
    if more {
        problems.push(named(format!(
            "more than {MAX_RECORDS}; the rest are not read"
        )));
    }
    let mut records = Vec::new();
    for name in names {
        let Some(job_id) = name
            .strip_prefix("job_")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        match file::json::<Record>(&dir.join(&name), MAX_SIZE, "record") {
            Ok(Some(record)) if record.job_id == job_id && is_digits(job_id) => {
                records.push(record)
            }
            Ok(Some(_)) => problems.push(named(format!("{name} names another job"))),
            Ok(None) => {}
            Err(why) => problems.push(named(format!("{name}: {why}"))),
        }
    }
    (records, problems)
}

/// The records' allocations. With `close_open`, a GPU's record left open
/// (no epilog) ends at the next prolog on that GPU (for a node whose
/// control groups cannot tell a job gone; where they can, a job sharing
/// its GPU stays allocated until its own epilog).
pub fn allocations(records: &[Record], close_open: bool) -> Vec<Allocation> {
    let allocation = |record: &Record, gpu: &GpuEdges| {
        Some(Allocation {
            device: gpu.device()?,
            task: record.task(),
            shared: false,
            start: gpu.prolog,
            end: end_of(records, gpu, close_open),
            uid: record.uid,
        })
    };
    records
        .iter()
        .flat_map(|r| r.gpus.iter().filter_map(move |g| allocation(r, g)))
        .collect()
}

/// Where the GPU's part of the record ends: its epilog, else with
/// `close_open` the first prolog on the GPU after its own, if either is known.
fn end_of(records: &[Record], gpu: &GpuEdges, close_open: bool) -> Option<Edge> {
    match (gpu.epilog, gpu.prolog) {
        (None, Some(start)) if close_open => records
            .iter()
            .flat_map(|r| &r.gpus)
            .filter(|g| g.same_gpu(gpu))
            .filter_map(|g| g.prolog)
            .filter(|edge| edge.at_us > start.at_us)
            .min_by_key(|edge| edge.at_us),
        (end, _) => end,
    }
}

/// The job's record, if there is one to add to.
pub fn load(dir: &Path, job_id: &str) -> Result<Option<Record>, String> {
    file::json(&path(dir, job_id), MAX_SIZE, "record")
}

/// Replaces the job's record atomically, making the directory (0755) if
/// missing.
pub fn store(dir: &Path, record: &Record) -> io::Result<()> {
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)?;
    }
    let mut temp = tempfile::Builder::new()
        .prefix(".job_")
        .permissions(fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)?;
    temp.write_all(&serde_json::to_vec(record).map_err(io::Error::other)?)?;
    temp.persist(path(dir, &record.job_id))?;
    Ok(())
}

/// Removes the records whose every GPU ended (see [`allocations`]) more
/// than [`KEEP_US`] before `now_us`, and those of jobs `gone` says ended
/// whose last edge is that old.
pub fn prune(dir: &Path, now_us: u64, close_open: bool, gone: &dyn Fn(&Task) -> bool) {
    let (records, _) = records(dir);
    let old = |at_us: u64| at_us.saturating_add(KEEP_US) < now_us;
    for record in &records {
        let last = record
            .gpus
            .iter()
            .flat_map(|g| [g.prolog, g.epilog])
            .flatten()
            .map(|e| e.at_us)
            .max();
        let ended = |gpu| end_of(&records, gpu, close_open).is_some_and(|end| old(end.at_us));
        let finished = record.gpus.iter().all(ended);
        if finished || (last.is_some_and(old) && gone(&record.task())) {
            let _ = fs::remove_file(path(dir, &record.job_id));
        }
    }
}
