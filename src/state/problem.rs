//! Why the state could not be used or stored: each run says it once.

use std::fmt;
use std::path::PathBuf;

use super::schema::{Damage, MAX_GPUS, MAX_SIZE};
use crate::fsutil::FileError;

/// Why the previous state could not be used, or this run's not stored.
#[derive(Debug)]
pub enum Problem {
    Missing,
    /// Not a state file of a version this exporter reads, or damaged.
    Corrupt(Damage),
    OtherBoot,
    UnknownBoot,
    Io(FileError),
    Encode(serde_json::Error),
    /// The directory could have been written by another user: nothing is stored in it.
    UntrustedDir(PathBuf, Distrust),
    UntrustedFile(PathBuf, Distrust),
    /// Another run held this lock until this run's wait ended.
    Busy(PathBuf),
    /// The state directory did not answer by the deadline while doing this.
    TimedOut(&'static str),
    /// Bounds: the bytes the state would have, the GPUs.
    TooLarge(usize),
    TooManyGpus(usize),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = "starting afresh. Only the running user or root may be able to write the \
                    state directory and file (owner, and no group or world write permission)";
        let bound = "the state keeps no more:";
        match self {
            Problem::Missing => f.write_str("no state yet (first run with this state directory)"),
            Problem::Corrupt(why) => {
                write!(f, "the state file is unusable ({why}); starting afresh")
            }
            Problem::OtherBoot => {
                f.write_str("the state file is from another boot; starting afresh")
            }
            Problem::UnknownBoot => f.write_str(
                "cannot read this boot's id (/proc/sys/kernel/random/boot_id); \
                 the state is neither used nor stored",
            ),
            Problem::Io(error) => error.fmt(f),
            Problem::Encode(e) => write!(f, "cannot encode the state: {e}"),
            Problem::UntrustedDir(dir, why) => write!(
                f,
                "the state is not trusted: the state directory {} is {why}; nothing is \
                 stored in it; {rule}",
                dir.display()
            ),
            Problem::UntrustedFile(path, why) => write!(
                f,
                "the state is not trusted: {} is {why}; this run replaces it; {rule}",
                path.display()
            ),
            Problem::Busy(lock) => write!(
                f,
                "another run held {} until this run stopped waiting; this run neither \
                 uses nor stores the state",
                lock.display()
            ),
            Problem::TimedOut(what) => write!(
                f,
                "the state directory did not answer in time while {what} (a frozen or \
                 hung file system?); this run's totals are left out or not stored"
            ),
            Problem::TooLarge(bytes) => write!(
                f,
                "{bound} the state would be {bytes} bytes, more than {MAX_SIZE}; not stored"
            ),
            Problem::TooManyGpus(n) => {
                write!(f, "{bound} {n} GPUs, more than {MAX_GPUS}; not stored")
            }
        }
    }
}

impl From<FileError> for Problem {
    fn from(error: FileError) -> Self {
        Problem::Io(error)
    }
}

/// Why the state directory or file could have been written by another user.
#[derive(Debug)]
pub enum Distrust {
    NotADirectory,
    /// Opened as a file, it is none (a symlink, a FIFO, a directory).
    NotARegularFile,
    TooLong(u64),
    /// The owner's uid, and the running user's.
    Owner(u32, u32),
    Writable(u32),
}

impl fmt::Display for Distrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distrust::NotADirectory => f.write_str("not a directory"),
            Distrust::NotARegularFile => f.write_str("not a regular file (a symbolic link?)"),
            Distrust::TooLong(len) => write!(
                f,
                "{len} bytes long, more than the {MAX_SIZE} that {MAX_GPUS} GPUs need"
            ),
            Distrust::Owner(uid, euid) => write!(
                f,
                "owned by uid {uid}, neither the running user (uid {euid}) nor root"
            ),
            Distrust::Writable(mode) => write!(f, "writable by others (mode {mode:04o})"),
        }
    }
}
