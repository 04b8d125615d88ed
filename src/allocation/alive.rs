//! Whether a job or pod still runs, from the control groups its manager made
//! (`owner` reads the same paths for a process): a checkpoint keeps a
//! finished pod's entries, and a record or mapping file whose epilog did not
//! run would otherwise count for ever. Where the node shows no such control
//! groups (another hierarchy, a container without the host's), every task
//! counts as running.

use std::path::{Path, PathBuf};

use super::model::Task;
use crate::owner::slurm::is_sluid;

/// Where the kubelet puts pods: the systemd driver's slice, the cgroupfs
/// driver's directory, in cgroup v2 or else v1's memory hierarchy.
const KUBEPODS: [&str; 4] = [
    "kubepods.slice",
    "kubepods",
    "memory/kubepods.slice",
    "memory/kubepods",
];

/// QoS classes below which the kubelet puts a pod's cgroup.
const QOS: [&str; 3] = ["", "burstable", "besteffort"];

pub struct Cgroups {
    /// Each `[<node>_]slurmstepd.scope` (one per slurmd on the node).
    slurm: Vec<PathBuf>,
    /// One of them names a job by SLUID (Slurm 26.05 without
    /// `CgroupJobIdPaths=yes`) rather than `job_<id>`.
    by_sluid: bool,
    /// `kubepods.slice` (systemd driver) or `kubepods` (cgroupfs driver).
    kubepods: Option<PathBuf>,
}

impl Cgroups {
    pub fn new(root: &Path) -> Cgroups {
        let slices = [root.join("system.slice"), root.to_owned()];
        let entries = slices
            .iter()
            .flat_map(|slice| std::fs::read_dir(slice).into_iter().flatten().flatten());
        let slurm: Vec<PathBuf> = entries
            .filter(|e| {
                let name = e.file_name();
                name.to_str()
                    .is_some_and(|n| n.ends_with("slurmstepd.scope"))
            })
            .map(|e| e.path())
            .filter(|scope| scope.is_dir())
            .collect();
        let by_sluid = slurm.iter().any(|scope| names_a_sluid(scope));
        let kubepods = KUBEPODS
            .iter()
            .map(|top| root.join(top))
            .find(|dir| dir.is_dir());
        Cgroups {
            slurm,
            by_sluid,
            kubepods,
        }
    }

    /// Whether the node shows Slurm's job control groups.
    pub fn shows_slurm(&self) -> bool {
        !self.slurm.is_empty()
    }

    /// False only where the node shows its manager's cgroups without the task's.
    pub fn runs(&self, task: &Task) -> bool {
        match task {
            Task::Slurm { job_id, sluid } => {
                let has = |name: &str| self.slurm.iter().any(|scope| scope.join(name).is_dir());
                !self.shows_slurm()
                    || has(&format!("job_{job_id}"))
                    || sluid.as_deref().map_or(self.by_sluid, has)
            }
            Task::Pod { uid, .. } => self.kubepods.as_ref().is_none_or(|top| pod_runs(top, uid)),
        }
    }
}

/// Whether the scope names a job by SLUID: then a job known only by its
/// number cannot be told gone.
fn names_a_sluid(scope: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(scope) else {
        return true;
    };
    entries
        .flatten()
        .any(|e| e.file_name().to_str().is_some_and(is_sluid))
}

fn pod_runs(top: &Path, uid: &str) -> bool {
    let systemd = top.extension().is_some_and(|e| e == "slice");
    QOS.iter().any(|qos| {
        let dir = match (systemd, *qos) {
            (true, "") => top.join(format!("kubepods-pod{}.slice", uid.replace('-', "_"))),
            (true, qos) => top
                .join(format!("kubepods-{qos}.slice"))
                .join(format!("kubepods-{qos}-pod{}.slice", uid.replace('-', "_"))),
            (false, qos) => top.join(qos).join(format!("pod{uid}")),
        };
        dir.is_dir()
    })
}
