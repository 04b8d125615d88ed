//! The Slurm hook (`--slurm-hook prolog|epilog`): slurmd runs it as root at
//! a job's start and end on each of its nodes, with `SLURM_JOB_ID` and the
//! job's GPUs in its environment. It reads each GPU's energy counter, writes
//! the job's record (`allocation::spool`) and always exits 0: a prolog that
//! fails or times out drains the node, so what it could not do (NVML not
//! answering, a hung GPU, no GPUs named) is said in the record and the
//! journal instead. NVML gets at most a second (or `--timeout`, if
//! shorter); a GPU that does not answer by then costs its own reading only.
//! A job without GPUs leaves no record and says nothing.
//! It takes no lock a run holds, so a stuck run never delays it.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use nvml::{calls, DeviceReader, InFlight, Session};

use crate::allocation::alive::Cgroups;
use crate::allocation::spool::{self, GpuEdges, Record};
use crate::allocation::{Device, Edge};
use crate::bounded::{Threads, Unfinished};
use crate::owner::slurm::{is_job_number, is_sluid};
use crate::procfs::boot_us;

/// Which end of the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Prolog,
    Epilog,
}

/// The most NVML is given.
const NVML_LIMIT: Duration = Duration::from_secs(1);

/// What NVML said of one GPU.
struct Read {
    uuid: Option<String>,
    index: u32,
    energy_mj: Option<u64>,
    at_us: u64,
}

/// Runs the hook; every failure is said, none fails the job.
pub fn run(hook: Hook, library: &Path, timeout: Duration, dir: &Path, cgroupfs: &Path) {
    let started = boot_us();
    let Some(job_id) = std::env::var("SLURM_JOB_ID")
        .ok()
        .filter(|id| is_job_number(id))
    else {
        say("SLURM_JOB_ID is not a job number; nothing recorded");
        return;
    };
    let names = job_gpus();
    // A job without GPUs (most jobs on a node's CPUs) has nothing to record.
    if names.is_empty() {
        log::debug!("job {job_id} has no GPUs");
        return;
    }
    let mut problems = Vec::new();
    let until = Instant::now() + timeout.min(NVML_LIMIT);
    let reads = read_gpus(library, until, &mut problems);
    let mut record = match (hook, spool::load(dir, &job_id)) {
        (Hook::Epilog, Ok(Some(record))) => record,
        (_, Err(why)) => {
            problems.push(format!("the job's record was replaced: {why}"));
            Record::default()
        }
        _ => Record::default(),
    };
    record.job_id = job_id.clone();
    record.uid = std::env::var("SLURM_JOB_UID")
        .ok()
        .and_then(|u| u.parse().ok());
    record.sluid = std::env::var("SLURM_JOB_SLUID")
        .ok()
        .filter(|s| is_sluid(s));
    if hook == Hook::Prolog {
        record.gpus.clear();
    }
    for name in &names {
        let read = reads.iter().find(|r| names_gpu(name, r));
        if read.is_none_or(|r| r.energy_mj.is_none()) && !reads.is_empty() {
            problems.push(format!("GPU {name}: no energy reading"));
        }
        let edge = Edge {
            at_us: read.map_or(started, |r| r.at_us),
            energy_mj: read.and_then(|r| r.energy_mj),
        };
        let at = match record.gpus.iter().position(|g| &g.name == name) {
            Some(at) => at,
            None => {
                record.gpus.push(GpuEdges {
                    name: name.clone(),
                    ..GpuEdges::default()
                });
                record.gpus.len() - 1
            }
        };
        let gpu = &mut record.gpus[at];
        if gpu.uuid.is_none() {
            gpu.uuid = read.and_then(|r| r.uuid.clone());
        }
        match hook {
            Hook::Prolog => gpu.prolog = Some(edge),
            Hook::Epilog => gpu.epilog = Some(edge),
        }
    }
    for problem in &problems {
        say(&format!("job {job_id}, {hook:?}: {problem}"));
    }
    record.problems.extend(problems);
    record.problems.truncate(64);
    if let Err(e) = spool::store(dir, &record) {
        say(&format!(
            "job {job_id}: cannot write its record in {}: {e}",
            dir.display()
        ));
    }
    let cgroups = Cgroups::new(cgroupfs);
    spool::prune(dir, boot_us(), !cgroups.shows_slurm(), &|task| {
        !cgroups.runs(task)
    });
}

/// The job's GPUs: UUIDs where `CUDA_VISIBLE_DEVICES` has them (Slurm
/// 26.05's `env_uuid`), else Slurm's indexes from `SLURM_JOB_GPUS` or
/// `CUDA_VISIBLE_DEVICES` (NVML's indexes, `allocation::Device::Index`), at
/// most 64.
fn job_gpus() -> Vec<String> {
    let list = |var: &str| -> Vec<String> {
        let value = std::env::var(var).unwrap_or_default();
        let items = value.split(',').map(str::trim).filter(|s| !s.is_empty());
        items.take(64).map(str::to_owned).collect()
    };
    let visible = list("CUDA_VISIBLE_DEVICES");
    if !visible.is_empty() && visible.iter().all(|d| Device::from_uuid(d).is_some()) {
        return visible;
    }
    let numbers = match list("SLURM_JOB_GPUS") {
        numbers if numbers.is_empty() => visible,
        numbers => numbers,
    };
    numbers.into_iter().filter(|n| is_job_number(n)).collect()
}

/// Whether `name` (a UUID or an index) is the GPU `read`.
fn names_gpu(name: &str, read: &Read) -> bool {
    read.uuid.as_deref() == Some(name) || name.parse() == Ok(read.index)
}

/// What the NVML thread hands over.
enum Told {
    Count(u32),
    Gpu(Read),
    Failed(String),
}

/// Every GPU's UUID and energy counter, each GPU on a thread
/// of its own, as many as answered by `until`.
fn read_gpus(library: &Path, until: Instant, problems: &mut Vec<String>) -> Vec<Read> {
    let threads = Threads::default();
    let library = library.to_owned();
    let spawned = threads.spawn("nvml", move |told| {
        // Never shut down or freed: the process ends right after.
        let inflight: &'static InFlight = Box::leak(Box::default());
        let session: &'static Session = match Session::open(&library, inflight) {
            Ok(session) => Box::leak(Box::new(session)),
            Err(e) => return drop(told.send(Told::Failed(e.detail))),
        };
        let _ = told.send(Told::Count(session.count));
        let each: Threads<()> = Threads::default();
        for index in 0..session.count {
            let told = told.clone();
            let _ = each.spawn("gpu", move |_| {
                let Ok(handle) = session.handle(index, inflight) else {
                    return;
                };
                let mut reader = DeviceReader::new(&handle, index, inflight);
                let _ = told.send(Told::Gpu(Read {
                    uuid: reader.read(calls::UUID, ()),
                    index,
                    energy_mj: reader.read(calls::TOTAL_ENERGY, ()),
                    at_us: boot_us(),
                }));
            });
        }
    });
    if let Err(e) = spawned {
        problems.push(format!("no thread for NVML: {e}"));
        return Vec::new();
    }
    let waiting = threads.waiting();
    let (mut reads, mut count) = (Vec::new(), None);
    while count.is_none_or(|count| reads.len() < count as usize) {
        match waiting.next_by(until) {
            Ok(Told::Count(n)) => count = Some(n),
            Ok(Told::Gpu(read)) => reads.push(read),
            Ok(Told::Failed(detail)) => {
                problems.push(format!("NVML could not be used: {detail}"));
                break;
            }
            Err(Unfinished::Late) => {
                problems.push("NVML did not answer for every GPU within the hook's time".into());
                break;
            }
            // A GPU whose handle failed ends its thread without a reading.
            Err(_) => break,
        }
    }
    reads
}

/// A line for the journal (syslog's socket, as logger(1) sends) and stderr.
fn say(message: &str) {
    eprintln!("nvidia-textfile-exporter: {message}");
    if let Ok(socket) = UnixDatagram::unbound() {
        let line = format!(
            "<12>nvidia-textfile-exporter[{}]: {message}",
            std::process::id()
        );
        let _ = socket.send_to(line.as_bytes(), "/dev/log");
    }
}
