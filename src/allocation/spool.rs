//! The Slurm hook's records (`--slurm-hook-dir`, on /run: a boot's): one
//! file per job, `job_<id>.json`, that the prolog writes and the epilog
//! completes, with each GPU's energy counter at both edges, so that a job's
//! time and energy are its own to the edge. Written atomically by the hook
//! (root's, as slurmd runs it), read by the runs; the hook removes records
//! finished an hour ago. A record left open (no epilog) ends where another
//! job's prolog takes its GPU, or where its job's control group is gone.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{file, is_digits, Allocation, Device, Edge, Task};

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

impl GpuEdges {
    pub fn device(&self) -> Option<Device> {
        let by_uuid = self.uuid.as_deref().and_then(Device::from_uuid);
        match by_uuid.or_else(|| Device::from_uuid(&self.name)) {
            Some((device, _)) => Some(device),
            None if is_digits(&self.name) => self
                .name
                .parse()
                .ok()
                .map(|index| Device::Index(index, None)),
            None => None,
        }
    }
}

fn path(dir: &Path, job_id: &str) -> PathBuf {
    dir.join(format!("job_{job_id}.json"))
}

/// The records' allocations; a record that is not one costs only its own.
pub fn read(dir: &Path) -> (Vec<Allocation>, Vec<String>) {
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
    let mut allocations = Vec::new();
    for name in names {
        let Some(job_id) = name
            .strip_prefix("job_")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        match load_from(&dir.join(&name)) {
            Ok(Some(record)) if record.job_id == job_id && is_digits(job_id) => {
                allocations.extend(allocations_of(&record))
            }
            Ok(Some(_)) => problems.push(named(format!("{name} names another job"))),
            Ok(None) => {}
            Err(why) => problems.push(named(format!("{name}: {why}"))),
        }
    }
    close_taken(&mut allocations);
    (allocations, problems)
}

fn allocations_of(record: &Record) -> Vec<Allocation> {
    let task = Task::Slurm {
        job_id: record.job_id.clone(),
        sluid: record.sluid.clone(),
    };
    record
        .gpus
        .iter()
        .filter_map(|gpu| {
            Some(Allocation {
                device: gpu.device()?,
                task: task.clone(),
                shared: false,
                start: gpu.prolog,
                end: gpu.epilog,
            })
        })
        .collect()
}

/// A record left open on a GPU that a later job's prolog took ends there.
fn close_taken(allocations: &mut [Allocation]) {
    let mut starts: BTreeMap<&Device, Vec<Edge>> = BTreeMap::new();
    let snapshot: Vec<(Device, Option<Edge>)> = allocations
        .iter()
        .map(|a| (a.device.clone(), a.start))
        .collect();
    for (device, start) in &snapshot {
        if let Some(start) = start {
            starts.entry(device).or_default().push(*start);
        }
    }
    for allocation in allocations.iter_mut().filter(|a| a.end.is_none()) {
        let Some(start) = allocation.start else {
            continue;
        };
        let later = starts.get(&allocation.device).into_iter().flatten();
        allocation.end = later
            .filter(|edge| edge.at_us > start.at_us)
            .min_by_key(|edge| edge.at_us)
            .copied();
    }
}

fn load_from(path: &Path) -> Result<Option<Record>, String> {
    let Some((text, _)) = file::read(path, MAX_SIZE).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| format!("not a record ({e})"))
}

/// The job's record, if there is one to add to.
pub fn load(dir: &Path, job_id: &str) -> Result<Option<Record>, String> {
    load_from(&path(dir, job_id))
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

/// Removes the records finished more than [`KEEP_US`] before `now_us`.
pub fn prune(dir: &Path, now_us: u64) {
    let Ok(Some((names, _))) = file::names(dir, MAX_RECORDS * 2) else {
        return;
    };
    for name in names.iter().filter(|n| n.starts_with("job_")) {
        let path = dir.join(name);
        let Ok(Some(record)) = load_from(&path) else {
            continue;
        };
        let ended = record.gpus.iter().map(|gpu| gpu.epilog.map(|e| e.at_us));
        let ended: Option<Vec<u64>> = ended.collect();
        if ended.is_some_and(|at| at.iter().all(|&at| at.saturating_add(KEEP_US) < now_us)) {
            let _ = fs::remove_file(path);
        }
    }
}
