//! For Princeton's jobstats and gpudash (off by default): each GPU's (or MIG
//! instance's) Slurm job as the values their older queries read, the job's
//! number and its user's uid, with jobstats' labels (`jobid`, `userid`,
//! `minor_number`, `GPU_I_ID`). A value that is an id cannot be made from a
//! label by a recording rule, so these are the exporter's own, under names
//! in snake case that packaging/prometheus/jobstats-compat.yml records as
//! jobstats' `nvidia_gpu_jobId` and `nvidia_gpu_jobUid` (and takes `userid`
//! from). It reads what the `tasks` host step found (it runs after it).

use crate::collector::{Collector, Hooks, HostError, HostRun};
use crate::metrics::{families, INFO};
use crate::snapshot::Device;

families! {
    FAMILIES;
    JOB_ID: Gauge(Number), "nvidia_gpu_jobstats_job_id", ["GPU_I_ID", "minor_number", "jobid", "userid"],
        "The Slurm job the GPU (or its MIG instance, GPU_I_ID) is allocated to, as its value: the job's number (recorded as jobstats' nvidia_gpu_jobId by packaging/prometheus/jobstats-compat.yml).";
    JOB_UID: Gauge(Number), "nvidia_gpu_jobstats_job_uid", ["GPU_I_ID", "minor_number", "jobid", "userid"],
        "The uid of the user of the Slurm job the GPU (or its MIG instance) is allocated to, as its value (recorded as jobstats' nvidia_gpu_jobUid); where the hook or jobstats' files say it.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "jobstats",
    default: false,
    help: "For jobstats and gpudash: the Slurm job each GPU is allocated to and its user's uid as values (nvidia_gpu_jobstats_job_id, nvidia_gpu_jobstats_job_uid), with jobstats' labels; needs the tasks collector's allocations.",
    families: FAMILIES,
    hooks: Hooks::NONE.with_host(host).needing(&["tasks"]),
};

fn host(run: &mut HostRun<'_>) -> Result<(), HostError> {
    for device in &mut run.snapshot.devices {
        let minor = minor_number(device);
        let samples = &mut device.samples;
        for job in &device.slurm_jobs {
            let Ok(number) = job.job_id.parse::<f64>() else {
                continue;
            };
            let id = |id: Option<u32>| id.map(|id| id.to_string().into());
            let labels = || {
                let (job_id, minor) = (job.job_id.clone().into(), minor.clone().map(Into::into));
                [id(job.gpu_instance_id), minor, Some(job_id), id(job.uid)]
            };
            samples.push(JOB_ID.sample_some(labels(), number));
            if let Some(uid) = job.uid {
                samples.push(JOB_UID.sample_some(labels(), f64::from(uid)));
            }
        }
    }
    Ok(())
}

/// The GPU's minor number, as its info series says it.
fn minor_number(device: &Device) -> Option<String> {
    let info = device.samples.iter().find(|s| s.family == INFO.family())?;
    let label = info.labels.iter().find(|l| l.name == "minor_number")?;
    Some(label.value.to_string()).filter(|m| !m.is_empty())
}
