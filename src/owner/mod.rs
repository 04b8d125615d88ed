//! A GPU process's owner: the task it works for, read from where its manager
//! put it. [`Owner`] is the one model of it: each kind's labels are declared
//! once, beside its manager, and every family that names an owner carries
//! all of them ([`LABELS`]) after its own, so two families never
//! label one process differently. Only what root wrote counts: a manager
//! reads a cgroup path at the positions its daemon creates (a user's own
//! delegated subtree, `user.slice`, makes the user the owner). What the node
//! cannot tell is left out.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::procfs::{Proc, Procfs};
use crate::snapshot::LabelValue;
use manager::{Claim, Node};

mod manager;

/// An owner kind's labels, in its families' order.
pub trait LabelSet {
    const NAMES: &'static [&'static str];
    fn values(&self) -> Vec<Option<LabelValue>>;
}

/// An owner kind: a struct whose fields are its labels, each named once.
macro_rules! label_set {
    ($(#[$meta:meta])* pub struct $kind:ident { $(pub $field:ident: $ty:ty => $label:literal,)* }) => {
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        $(#[$meta])*
        pub struct $kind { $(pub $field: $ty,)* }

        impl $crate::owner::LabelSet for $kind {
            const NAMES: &'static [&'static str] = &[$($label),*];
            fn values(&self) -> Vec<Option<$crate::snapshot::LabelValue>> {
                // A `String` always, an `Option` where set.
                vec![$(Option::<String>::from(self.$field.clone()).map($crate::snapshot::LabelValue::Owned)),*]
            }
        }
    };
}

/// The managers, asked in this order (most specific first; the session's
/// claims every path), one line each: its module and type, and the owner
/// kind it names (its variant of [`Owner`], its name in the state).
macro_rules! managers {
    ($($module:ident::$manager:ident => $variant:ident($kind:ident) as $tag:literal,)*) => {
        $(pub mod $module;)*

        /// Who a process works for.
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum Owner {
            $(#[serde(rename = $tag)] $variant($module::$kind),)*
        }

        /// Every owner label, in the managers' order.
        pub const LABELS: [&str; COUNT] =
            $crate::metrics::join(&[$(<$module::$kind as LabelSet>::NAMES),*]);

        impl Owner {
            /// Every owner label's value: this kind's, the others' `None`.
            fn labels(&self) -> Vec<Option<LabelValue>> {
                let mut all = Vec::with_capacity(COUNT);
                $(match self {
                    Owner::$variant(kind) => all.extend(kind.values()),
                    _ => all.extend(<$module::$kind as LabelSet>::NAMES.iter().map(|_| None)),
                })*
                all
            }
        }

        /// How many owner labels there are.
        pub const COUNT: usize = 0 $(+ <$module::$kind as LabelSet>::NAMES.len())*;

        #[derive(Default)]
        struct Managers {
            $($module: $module::$manager,)*
        }

        impl Managers {
            /// The first claim of a manager that makes `path`.
            fn claim(&self, path: &[&str], process: &Proc, node: &Node) -> Claim<Owner> {
                $(match self.$module.claim(path, process, node) {
                    Claim::Pass => {}
                    Claim::User => return Claim::User,
                    Claim::Owner(kind) => return Claim::Owner(Owner::$variant(kind)),
                })*
                Claim::Pass
            }
        }
    };
}

managers! {
    slurm::Slurm => Slurm(Job) as "slurm",
    kubernetes::Kubernetes => Pod(Pod) as "pod",
    runtime::Runtime => Container(Container) as "container",
    systemd::Systemd => Unit(Unit) as "unit",
    session::Session => User(User) as "user",
}

/// A sample's label values: `ids`, then the owner's (all `None` where
/// unknown).
pub fn with_ids<const I: usize, const N: usize>(
    ids: [Option<LabelValue>; I],
    owner: Option<&Owner>,
) -> [Option<LabelValue>; N] {
    const { assert!(I + COUNT == N, "the label count differs") };
    let owner = owner.map(Owner::labels).into_iter().flatten();
    let mut all = ids.into_iter().chain(owner);
    std::array::from_fn(|_| all.next().flatten())
}

/// What a run knows of a process.
#[derive(Debug, Clone)]
pub struct Known {
    pub proc: Proc,
    /// `None` where its control group or, for a user's, its uid cannot be read.
    pub owner: Option<Owner>,
}

/// Each process's record and owner, read once per pid per run and given to
/// every step that asks.
pub struct Owners {
    node: Node,
    managers: Managers,
    known: HashMap<u32, Known>,
}

impl Owners {
    /// Owners from `/proc` below `procfs` and the kubelet's log directories,
    /// read until `until`.
    pub fn new(procfs: &Path, pod_logs: &Path, container_logs: &Path, until: Instant) -> Owners {
        Owners {
            node: Node {
                procfs: Procfs::new(procfs, until),
                pod_logs: pod_logs.to_owned(),
                container_logs: container_logs.to_owned(),
                until,
            },
            managers: Managers::default(),
            known: HashMap::new(),
        }
    }

    /// A pod's container, named as a process of it would be.
    pub fn pod(&self, uid: String, container: Option<String>) -> Owner {
        let names = self.managers.kubernetes.names(&self.node);
        Owner::Pod(kubernetes::Pod {
            container,
            ..names.pod(uid, None)
        })
    }

    pub fn of(&mut self, pid: u32) -> &Known {
        let (node, managers) = (&self.node, &self.managers);
        self.known.entry(pid).or_insert_with(|| {
            let proc = node.procfs.read(pid);
            let owner = owner(&proc, node, managers);
            Known { proc, owner }
        })
    }
}

/// The owner from `/proc/<pid>/cgroup`: the unified (v2) line's path, or
/// where that is the root (v1 or hybrid hierarchies), the first v1 line a
/// manager names an owner at; else the process's user. The kernel writes
/// one line per hierarchy, their ids falling (the unified `0` last); a text
/// that does not (a line feed in a name, which kernels before 5.2 take,
/// adding lines of its own: before the real `0::` line where the name is in
/// a v1 hierarchy a user was delegated, `name=systemd` in hybrid setups)
/// names only the user.
fn owner(process: &Proc, node: &Node, managers: &Managers) -> Option<Owner> {
    let cgroup = process.cgroup.as_deref()?;
    let claim = |path: &str| {
        let path: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        managers.claim(&path, process, node)
    };
    let ids: Option<Vec<u32>> = (cgroup.lines())
        .map(|line| line.split_once(':')?.0.parse().ok())
        .collect();
    let unified = cgroup.lines().find_map(|line| line.strip_prefix("0::"));
    let claimed = if !ids.is_some_and(|ids| ids.windows(2).all(|w| w[0] > w[1])) {
        Claim::User
    } else if let Some(path) = unified.filter(|path| !path.trim_matches('/').is_empty()) {
        claim(path)
    } else {
        let legacy = cgroup.lines().filter(|line| !line.starts_with("0::"));
        let mut claims = legacy
            .filter_map(|line| line.splitn(3, ':').nth(2))
            .map(claim);
        claims
            .find(|claim| matches!(claim, Claim::Owner(_)))
            .unwrap_or(Claim::User)
    };
    match claimed {
        Claim::Owner(owner) => Some(owner),
        Claim::Pass | Claim::User => managers.session.user(process, node.until).map(Owner::User),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::fs;
    use std::time::Duration;

    pub const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "3f0c8a52-9b1e-4c7d-8e2f-5a6b7c8d9e01";

    /// The owner of a process of root's in `cgroup` with `environ`.
    pub fn owner_of(cgroup: &str, environ: &str) -> Option<Owner> {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("7");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("status"), "Uid:\t0\t0\t0\t0\n").unwrap();
        fs::write(dir.join("cgroup"), cgroup).unwrap();
        fs::write(dir.join("environ"), environ).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let none = root.path().join("none");
        let mut owners = Owners::new(root.path(), &none, &none, until);
        owners.of(7).owner.clone()
    }

    pub fn root() -> Option<Owner> {
        let name = "root".to_owned();
        Some(Owner::User(session::User { name }))
    }

    /// A user may make any cgroup below their own `user@.service` (and
    /// inside a container or job their processes are in): names that look
    /// like a job, pod or container there say nothing.
    #[test]
    fn names_a_user_can_make_name_the_user() {
        let forged = [
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_4711/x".to_owned(),
            format!("0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod{UID}.slice"),
            format!("0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{ID}.scope"),
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4711".to_owned(),
            "0::/job_4711/step_0".to_owned(),
            format!("0::/pod{UID}"),
            String::new(),
            "garbage\n\n:::\n".to_owned(),
        ];
        for cgroup in &forged {
            assert_eq!(owner_of(cgroup, ""), root(), "{cgroup}");
        }
        // A line feed in a name of the user's cannot add a unified line,
        // nor (hybrid, legacy) lines before the real ones.
        let mine = "/user.slice/user-1000.slice/user@1000.service/x";
        let job = "/system.slice/slurmstepd.scope/job_4711/step_0";
        for cgroup in [
            format!("0::{mine}\n0::{job}"),
            format!("1:name=systemd:{mine}\n0::{job}\n0::{mine}"),
            format!("1:name=systemd:{mine}\n1:devices:/slurm/uid_1000/job_99\n0::/"),
        ] {
            assert_eq!(owner_of(&cgroup, ""), root(), "{cgroup}");
        }
    }

    /// `/proc/<pid>/cgroup` as the kernel writes it, bytes that are no
    /// UTF-8 included, decoded lossily: the manager's components still
    /// place the process, the user's own name the user.
    #[test]
    fn names_that_are_no_utf8_are_read_where_their_manager_put_them() {
        let mine = "0::/user.slice/user-1000.slice/user@1000.service/app.slice";
        for forged in [
            "/\u{fffd}\u{fffd}.scope",
            "/slurmstepd.scope/job_4711\u{fffd}/step_0",
        ] {
            assert_eq!(owner_of(&format!("{mine}{forged}"), ""), root());
        }
        let job = owner_of(
            "0::/system.slice/slurmstepd.scope/job_12/step_0/user/\u{fffd}",
            "",
        );
        assert!(matches!(job, Some(Owner::Slurm(_))), "{job:?}");
        // A job number is digits: a replaced byte makes none.
        let broken = "0::/system.slice/slurmstepd.scope/job_1\u{fffd}2/step_0";
        assert_eq!(owner_of(broken, ""), root());
    }

    #[test]
    fn a_gone_process_has_no_owner_and_each_pid_is_read_once() {
        let root = tempfile::tempdir().unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let mut owners = Owners::new(root.path(), root.path(), root.path(), until);
        assert_eq!(owners.of(7).owner, None);
        let dir = root.path().join("7");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("cgroup"), "0::/system.slice/a.service\n").unwrap();
        assert_eq!(owners.of(7).owner, None);
    }

    /// Every owner kind's labels, declared once, in order; a family's own
    /// labels first; the state names kinds as before.
    #[test]
    fn the_owner_labels_are_every_kinds_in_the_managers_order() {
        let names: [&str; 1 + COUNT] = crate::metrics::join(&[&["gpu_instance_id"], &LABELS]);
        let first = ["gpu_instance_id", "slurm_job_id", "slurm_job_sluid"];
        assert_eq!(names[..3], first);
        assert_eq!(
            LABELS[4..],
            [
                "k8s_pod_uid",
                "k8s_container_name",
                "container_id",
                "systemd_unit",
                "user"
            ]
        );
        let unit = Owner::Unit(systemd::Unit {
            name: "a.service".into(),
        });
        let values: [_; 10] = with_ids([Some("2".into())], Some(&unit));
        let set: Vec<_> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i, v.as_deref()?)))
            .collect();
        assert_eq!(set, [(0, "2"), (8, "a.service")]);
        let json = serde_json::to_string(&[unit, root().unwrap()]).unwrap();
        assert_eq!(json, r#"[{"unit":"a.service"},{"user":"root"}]"#);
    }
}
