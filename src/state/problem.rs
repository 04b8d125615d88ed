//! Why the state could not be used or stored: each run says it once.

use std::path::PathBuf;

use super::schema::{Damage, MAX_GPUS, MAX_SIZE};
use crate::fsutil::FileError;

/// Why the previous state could not be used, or this run's not stored.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("no state yet (first run with this state directory)")]
    Missing,
    #[error("the state file is unusable ({0}); starting afresh")]
    Corrupt(Damage),
    #[error("the state file is from another boot; starting afresh")]
    OtherBoot,
    #[error(
        "cannot read this boot's id (/proc/sys/kernel/random/boot_id); \
         the state is neither used nor stored"
    )]
    UnknownBoot,
    #[error(transparent)]
    Io(#[from] FileError),
    #[error("cannot encode the state: {0}")]
    Encode(serde_json::Error),
    #[error(
        "the state is not trusted: the state directory {} is {1}; nothing is \
         stored in it; {RULE}",
        .0.display()
    )]
    UntrustedDir(PathBuf, Distrust),
    #[error(
        "the state is not trusted: {} is {1}; this run replaces it; {RULE}",
        .0.display()
    )]
    UntrustedFile(PathBuf, Distrust),
    #[error(
        "another run held {} until this run stopped waiting; this run neither \
         uses nor stores the state",
        .0.display()
    )]
    Busy(PathBuf),
    #[error(
        "the state directory did not answer in time while {0} (a frozen or \
         hung file system?); this run's totals are left out or not stored"
    )]
    TimedOut(&'static str),
    #[error(
        "the state keeps no more: the state would be {0} bytes, more than {MAX_SIZE}; not stored"
    )]
    TooLarge(usize),
    #[error("the state keeps no more: {0} GPUs, more than {MAX_GPUS}; not stored")]
    TooManyGpus(usize),
    #[error("the state keeps no more: more than {0} tasks on a GPU; new ones are not counted")]
    TooManyTasks(usize),
}

const RULE: &str = "starting afresh. Only the running user or root may be able to write the \
                    state directory and file (owner, and no group or world write permission)";

/// Why the state directory or file could have been written by another user.
#[derive(Debug, thiserror::Error)]
pub enum Distrust {
    #[error("not a directory")]
    NotADirectory,
    #[error("not a regular file (a symbolic link?)")]
    NotARegularFile,
    #[error("{0} bytes long, more than the {MAX_SIZE} that {MAX_GPUS} GPUs need")]
    TooLong(u64),
    #[error("owned by uid {0}, neither the running user (uid {1}) nor root")]
    Owner(u32, u32),
    #[error("writable by others (mode {0:04o})")]
    Writable(u32),
}
