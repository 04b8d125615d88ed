//! `--job-report <id>`: a Slurm job's totals on this node, as one JSON
//! object for its epilog to put into the job's comment or a completion
//! record. Per GPU (or MIG instance) the job was given or ran on: seconds
//! allocated, busy and held, energy, peak memory and XIDs, from the state's task
//! ledgers (as of the last run, at most one timer period before the epilog);
//! where the hook recorded both edges of a whole GPU, seconds allocated and
//! energy are the edges' own (epilog − prolog), exact.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::allocation::spool;
use crate::exit::Exit;
use crate::owner::slurm::is_job_number;
use crate::owner::Owner;
use crate::state::{StateDir, StateFile};

/// The report.
#[derive(Debug, Serialize)]
struct Report {
    slurm_job_id: String,
    node: String,
    gpus: Vec<Gpu>,
}

/// One GPU's or MIG instance's part of it (by default, one the state has
/// not counted the job on).
#[derive(Debug, Default, Serialize)]
struct Gpu {
    gpu: u32,
    uuid: String,
    gpu_instance_id: Option<u32>,
    allocated_seconds: f64,
    /// Absent where NVML gave no per-process shares (MIG).
    busy_seconds: Option<f64>,
    held_seconds: f64,
    energy_joules: f64,
    memory_peak_bytes: u64,
    /// XIDs the GPU logged while the job held or was given it; absent where
    /// they were not counted (the xid collector off).
    xid_errors: Option<u64>,
    /// Seconds allocated and energy from the hook's prolog and epilog.
    exact: bool,
}

/// Whether another job's edges on a GPU overlap `from_us`..`to_us` (an
/// open one from its prolog on).
fn overlaps(other: &spool::GpuEdges, from_us: u64, to_us: u64) -> bool {
    let start = other.prolog.map_or(0, |e| e.at_us);
    let end = other.epilog.map_or(u64::MAX, |e| e.at_us);
    start < to_us && from_us < end
}

/// Prints the report of `job_id` on standard output.
pub fn print(job_id: &str, state_dir: &Path, hook_dir: &Path) -> Exit {
    if !is_job_number(job_id) {
        log::error!("--job-report: {job_id:?} is not a Slurm job number");
        return Exit::Usage;
    }
    let until = Instant::now() + Duration::from_secs(2);
    let state = StateFile::open(StateDir::new(state_dir), until, false);
    let (records, _) = spool::records(hook_dir);
    let record = records.iter().find(|r| r.job_id == job_id);
    let mut gpus = Vec::new();
    for (uuid, gpu) in &state.previous().gpus {
        for (holder, totals) in &gpu.tasks.totals {
            if !matches!(&holder.task, Owner::Slurm(job) if job.job_id.as_deref() == Some(job_id)) {
                continue;
            }
            gpus.push(Gpu {
                gpu: gpu.index,
                uuid: uuid.clone(),
                gpu_instance_id: holder.gpu_instance_id,
                allocated_seconds: totals.allocated_us as f64 / 1e6,
                busy_seconds: totals.measured.then_some(totals.busy_us as f64 / 1e6),
                held_seconds: totals.held_us as f64 / 1e6,
                energy_joules: totals.energy_mj as f64 / 1e3,
                memory_peak_bytes: totals.memory_peak_bytes,
                xid_errors: gpu.tasks.xids.map(|_| totals.xid_errors),
                exact: false,
            });
        }
    }
    // The hook's edges: exact where they are, and a GPU no run counted yet
    // (a job shorter than the timer's period) from them alone.
    for edges in record.iter().flat_map(|r| &r.gpus) {
        let (Some(uuid), Some(prolog), Some(epilog)) = (&edges.uuid, edges.prolog, edges.epilog)
        else {
            continue;
        };
        let at = match gpus
            .iter()
            .position(|g| g.uuid == *uuid && g.gpu_instance_id.is_none())
        {
            Some(at) => at,
            None => {
                let index = state.previous().gpus.get(uuid).map(|g| g.index);
                let Some(index) = index.or_else(|| edges.name.parse().ok()) else {
                    continue;
                };
                gpus.push(Gpu {
                    gpu: index,
                    uuid: uuid.clone(),
                    ..Gpu::default()
                });
                gpus.len() - 1
            }
        };
        let line = &mut gpus[at];
        line.allocated_seconds = epilog.at_us.saturating_sub(prolog.at_us) as f64 / 1e6;
        // The counter's difference is the job's only where it had the GPU
        // alone and the counter did not start again between.
        let shared = records
            .iter()
            .filter(|r| r.job_id != job_id)
            .flat_map(|r| &r.gpus)
            .filter(|other| other.same_gpu(edges))
            .any(|other| overlaps(other, prolog.at_us, epilog.at_us));
        if let (Some(from), Some(to), false) = (prolog.energy_mj, epilog.energy_mj, shared) {
            if to >= from {
                line.energy_joules = (to - from) as f64 / 1e3;
                line.exact = true;
            }
        }
    }
    let report = Report {
        slurm_job_id: job_id.to_owned(),
        node: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default(),
        gpus,
    };
    match serde_json::to_string(&report) {
        Ok(text) => {
            println!("{text}");
            Exit::Success
        }
        Err(e) => {
            log::error!("--job-report: {e}");
            Exit::Usage
        }
    }
}
