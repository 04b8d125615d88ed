//! What a manager of cgroups is: made once per run (`Default`), asked in
//! turn what it makes of a process's cgroup path (`claim(&self, path:
//! &[&str], process: &Proc, node: &Node)`, `path` its components), it answers
//! with a [`Claim`] of its own owner kind.

use std::path::PathBuf;
use std::time::Instant;

use crate::procfs::Procfs;

/// What a manager makes of a cgroup path.
#[derive(Debug, PartialEq)]
pub enum Claim<K> {
    /// Not a path it makes: the next manager is asked.
    Pass,
    /// Its path, naming no one more specific than the process's user.
    User,
    /// Its path, and the owner it names there.
    Owner(K),
}

/// What managers may read: `/proc` (a process's environment) and the
/// kubelet's log directories, until the run's host deadline.
pub struct Node {
    pub procfs: Procfs,
    pub pod_logs: PathBuf,
    pub container_logs: PathBuf,
    pub until: Instant,
}

/// Component `i` of a path, `""` past its end.
pub fn at<'a>(path: &[&'a str], i: usize) -> &'a str {
    path.get(i).copied().unwrap_or("")
}
