//! Who owns a GPU process (command, user, systemd unit, container, Slurm job),
//! from `/proc/<pid>`. [`Owner::read`] never fails: what cannot be read is left
//! out; values are decoded lossily; each pid is looked up once per run.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::time::Instant;

use nix::unistd::User;

use crate::bounded::{self, Unfinished};
use crate::snapshot::LabelValue;
use crate::task::owner::{placement, real_uid, Placement};

/// What `/proc/<pid>` says about a process's owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    pub comm: Option<String>,
    pub user: Option<String>,
    pub systemd_unit: Option<String>,
    pub container_id: Option<String>,
    pub slurm_job_id: Option<String>,
}

impl Owner {
    /// Reads the owner of `pid` below `procfs`; unreadable parts stay `None`.
    pub fn read(procfs: &Path, pid: &str, users: &Users) -> Owner {
        let dir = procfs.join(pid);
        let text = |name: &str| read_lossy(&dir.join(name));
        Owner {
            comm: text("comm").map(|c| c.trim_end_matches('\n').to_owned()),
            user: text("status")
                .as_deref()
                .and_then(real_uid)
                .map(|uid| users.name(uid)),
            ..text("cgroup").map(|c| of_cgroup(&c)).unwrap_or_default()
        }
    }
}

/// A `/proc` file's text, decoded lossily: bytes that are no UTF-8, which a
/// process may put in its command's name and a user in a cgroup's, never make
/// it unreadable. A replaced byte is no ASCII, so it cannot make a line, a
/// path component or any name [`placement`] reads at a manager's position.
pub fn read_lossy(path: &Path) -> Option<String> {
    let bytes = fs::read(path).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A per-process sample's labels: `ids` (pid, GPU and compute instance), then
/// the owner's; a `None` is left out.
pub fn labels(ids: [Option<LabelValue>; 3], owner: &Owner) -> [Option<LabelValue>; 8] {
    let [pid, gpu_instance, compute_instance] = ids;
    let owned = |value: &Option<String>| value.clone().map(LabelValue::Owned);
    [
        pid,
        gpu_instance,
        compute_instance,
        owned(&owner.comm),
        owned(&owner.user),
        owned(&owner.systemd_unit),
        owned(&owner.container_id),
        owned(&owner.slurm_job_id),
    ]
}

/// User names by uid from the user database (NSS), looked up once per uid and
/// never past `until` (after one that did not answer, owners are shown by uid).
#[derive(Debug)]
pub struct Users {
    names: RefCell<HashMap<u32, String>>,
    until: Instant,
    gave_up: Cell<bool>,
}

impl Users {
    pub fn new(until: Instant) -> Users {
        Users {
            names: RefCell::new(HashMap::new()),
            until,
            gave_up: Cell::new(false),
        }
    }

    /// The user's name, or else the uid as text.
    pub fn name(&self, uid: u32) -> String {
        if let Some(name) = self.names.borrow().get(&uid) {
            return name.clone();
        }
        let name = self.bounded_lookup(uid).unwrap_or_else(|| uid.to_string());
        self.names.borrow_mut().insert(uid, name.clone());
        name
    }

    /// getpwuid_r(3) on a thread of its own, waited for until `until`.
    fn bounded_lookup(&self, uid: u32) -> Option<String> {
        if self.gave_up.get() {
            return None;
        }
        match bounded::call("nss", self.until, move || User::from_uid(uid.into())) {
            Ok(user) => return user.ok().flatten().map(|user| user.name),
            Err(Unfinished::NotStarted(e)) => {
                log::warn!("cannot start a thread for user lookups: {e}; owners shown by uid")
            }
            Err(Unfinished::Late | Unfinished::Ended) => log::warn!(
                "the user database (NSS) did not name uid {uid} in time; \
                 process owners of this run are shown by uid"
            ),
        }
        self.gave_up.set(true);
        None
    }
}

/// The owner's cgroup labels where its manager placed it (see
/// `task::owner`: what a user names in their own subtree says nothing).
fn of_cgroup(cgroup: &str) -> Owner {
    let owner = Owner::default();
    match placement(cgroup) {
        Placement::Slurm(id) if id.bytes().all(|b| b.is_ascii_digit()) => Owner {
            slurm_job_id: Some(id),
            ..owner
        },
        Placement::Pod { container_id, .. } => Owner {
            container_id,
            ..owner
        },
        Placement::Container(id) => Owner {
            container_id: Some(id),
            ..owner
        },
        Placement::Unit(unit) => Owner {
            systemd_unit: Some(unit),
            ..owner
        },
        Placement::Slurm(_) | Placement::User => owner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels are the task's (`task::owner` tests every shape).
    #[test]
    fn cgroup_labels_are_where_the_manager_placed_the_process() {
        let id = "a".repeat(64);
        let docker = of_cgroup(&format!("0::/system.slice/docker-{id}.scope\n"));
        assert_eq!(docker.container_id.as_deref(), Some(id.as_str()));
        let pod = format!("0::/kubepods/burstable/pod3f0c8a52-9b1e-4c7d-8e2f-5a6b7c8d9e01/{id}");
        assert_eq!(of_cgroup(&pod).container_id.as_deref(), Some(id.as_str()));
        let job = of_cgroup("0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0\n");
        assert_eq!(job.slurm_job_id.as_deref(), Some("4711"));
        assert_eq!(job.systemd_unit, None);
        let unit = of_cgroup("0::/system.slice/trainer.service\n");
        assert_eq!(unit.systemd_unit.as_deref(), Some("trainer.service"));
        // A user's own cgroups name nothing.
        let forged = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4711\n";
        assert_eq!(of_cgroup(forged), Owner::default());
        assert_eq!(of_cgroup("garbage\n\n:::\n"), Owner::default());
    }

    #[test]
    fn users_and_uids() {
        let users = Users::new(Instant::now() + std::time::Duration::from_secs(5));
        assert_eq!(users.name(0), "root");
        // No system has a user with the largest uid below the invalid one.
        assert_eq!(users.name(4_294_967_294), "4294967294");
        assert_eq!(
            real_uid("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n"),
            Some(1000)
        );
        assert_eq!(real_uid("Name:\tpython\n"), None);
    }

    #[test]
    fn reads_a_fake_proc_and_tolerates_missing_pids() {
        let root = tempfile::tempdir().unwrap();
        let pid = root.path().join("77");
        fs::create_dir(&pid).unwrap();
        fs::write(pid.join("comm"), b"py\xfftorch\n").unwrap();
        fs::write(pid.join("status"), "Uid:\t0\t0\t0\t0\n").unwrap();
        fs::write(
            pid.join("cgroup"),
            "0::/system.slice/slurmstepd.scope/job_5/step_0\n",
        )
        .unwrap();
        let users = Users::new(Instant::now() + std::time::Duration::from_secs(5));
        let owner = Owner::read(root.path(), "77", &users);
        assert_eq!(owner.comm.as_deref(), Some("py\u{fffd}torch"));
        assert_eq!(owner.user.as_deref(), Some("root"));
        assert_eq!(owner.slurm_job_id.as_deref(), Some("5"));
        assert_eq!(Owner::read(root.path(), "78", &users), Owner::default());
    }
}
