//! The mapping directories sites already keep for other tools, read as those
//! tools write them, one file per GPU that a job's prolog writes and its
//! epilog removes:
//! - `gpustat` (Princeton's jobstats, `/run/gpustat`): a file named by the
//!   GPU's Slurm index (`CUDA_VISIBLE_DEVICES` in the prolog), or its
//!   `GPU-`/`MIG-` UUID, holding `<job id> <uid>`;
//! - `dcgm` (dcgm-exporter's `--hpc-job-mapping-dir`): a file named by the
//!   GPU's index (`<index>.<gpu instance>` for a MIG instance) holding the
//!   ids of the jobs on it, one a line.
//!
//! A file's last write is its allocation's start.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::file;
use super::model::{is_digits, number, Allocation, Clock, Device, Edge, Task};

/// A file per GPU holds a line or two.
const MAX_SIZE: u64 = 4096;
/// More files than GPUs and MIG instances a node has.
const MAX_FILES: usize = 512;
/// Jobs sharing one GPU in one file.
const MAX_JOBS: usize = 64;

/// Which tool wrote the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Princeton jobstats' `/run/gpustat` files.
    Gpustat,
    Dcgm,
}

/// `--job-map FORMAT:DIR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobMap {
    pub format: Format,
    pub dir: PathBuf,
}

impl FromStr for JobMap {
    type Err = String;

    fn from_str(text: &str) -> Result<JobMap, String> {
        let (format, dir) = text
            .split_once(':')
            .ok_or("expected FORMAT:DIR (gpustat:/run/gpustat, dcgm:DIR)")?;
        let format = match format {
            "gpustat" => Format::Gpustat,
            "dcgm" => Format::Dcgm,
            other => return Err(format!("unknown format {other:?}: gpustat or dcgm")),
        };
        if dir.is_empty() {
            return Err("the directory is empty".into());
        }
        Ok(JobMap {
            format,
            dir: dir.into(),
        })
    }
}

/// The directory's allocations; a file that is not one of its format costs
/// only its own.
pub fn read(map: &JobMap, clock: &Clock) -> (Vec<Allocation>, Vec<String>) {
    let dir = &map.dir;
    let named = |why: String| format!("job map {}: {why}", dir.display());
    let (names, more) = match file::names(dir, MAX_FILES) {
        Ok(Some(names)) => names,
        Ok(None) => return Default::default(),
        Err(why) => return (Vec::new(), vec![named(why.to_string())]),
    };
    let (mut allocations, mut problems) = (Vec::new(), Vec::new());
    if more {
        problems.push(named(format!(
            "more than {MAX_FILES} files; the rest are not read"
        )));
    }
    for name in names {
        match read_file(map.format, &dir.join(&name), &name, clock) {
            Ok(found) => allocations.extend(found),
            Err(why) => problems.push(named(format!("{name}: {why}"))),
        }
    }
    (allocations, problems)
}

fn read_file(
    format: Format,
    path: &Path,
    name: &str,
    clock: &Clock,
) -> Result<Vec<Allocation>, String> {
    let device = device(name).ok_or("a name that is no GPU")?;
    let Some((text, written)) = file::read(path, MAX_SIZE).map_err(|e| e.to_string())? else {
        // Removed since listed: the job ended.
        return Ok(Vec::new());
    };
    let text = String::from_utf8(text).map_err(|_| "not text")?;
    let mut words = text.split_whitespace();
    let lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let (jobs, uid): (Vec<&str>, _) = match format {
        // `<job id> <uid>`
        Format::Gpustat => (words.next().into_iter().collect(), words.next()),
        Format::Dcgm => (lines.collect(), None),
    };
    let uid = uid.and_then(|uid| uid.parse().ok());
    if jobs.len() > MAX_JOBS || !jobs.iter().all(|job| is_digits(job)) {
        return Err("not job ids".into());
    }
    // A file stamped after now (the clock stepped back since it was
    // written) holds from the previous run, as one with no time.
    let start = clock.boot_us_of(written).map(|at_us| Edge {
        at_us,
        energy_mj: None,
    });
    let shared = jobs.len() > 1;
    Ok(jobs
        .into_iter()
        .map(|job| Allocation {
            device: device.clone(),
            task: Task::Slurm {
                job_id: job.to_owned(),
                sluid: None,
            },
            shared,
            start,
            end: None,
            uid,
        })
        .collect())
}

/// The device a file's name means: a UUID, a GPU's index, or
/// `<index>.<gpu instance>` (dcgm-exporter's, and jobstats' own exporter's).
fn device(name: &str) -> Option<Device> {
    if let Some((device, false)) = Device::from_uuid(name) {
        return Some(device);
    }
    match name.split_once('.') {
        Some((gpu, instance)) => Some(Device::Index(number(gpu)?, Some(number(instance)?))),
        None => Some(Device::Index(number(name)?, None)),
    }
}
