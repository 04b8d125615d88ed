//! What a manager of cgroups is: asked in turn what it makes of a process's
//! cgroup path, it answers with a [`Claim`] of its own owner kind.

use std::path::Path;
use std::time::Instant;

use crate::procfs::{Proc, Procfs};

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

/// A manager of cgroups (Slurm, the kubelet, …), made once per run.
pub trait Manager {
    /// The owner kind it names.
    type Kind;
    fn new(node: &Node) -> Self;
    /// What it makes of the cgroup at `path` (its components) that holds
    /// `process`; the process's environment is `procfs`'s to read.
    fn claim(&self, path: &[&str], process: &Proc, procfs: &Procfs) -> Claim<Self::Kind>;
}

/// What managers may read beyond `/proc`.
pub struct Node<'a> {
    pub pod_logs: &'a Path,
    pub container_logs: &'a Path,
    pub until: Instant,
}

/// Component `i` of a path, `""` past its end.
pub fn at<'a>(path: &[&'a str], i: usize) -> &'a str {
    path.get(i).copied().unwrap_or("")
}
