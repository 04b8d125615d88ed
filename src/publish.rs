//! The only code that touches the textfile directory: a [`Publisher`] takes
//! the lock `.<file>.lock` by a deadline and replaces `<file>` atomically
//! through `.<file>.<pid>.<random>.tmp` (which node_exporter ignores).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::fsutil::{self, FileError};

/// Where the metrics go.
#[derive(Debug, Clone)]
pub struct Target {
    dir: PathBuf,
    file_name: String,
}

impl Target {
    /// A target file `file_name` (a plain `*.prom` name `cli` checked) in `dir`.
    pub fn new(dir: impl Into<PathBuf>, file_name: impl Into<String>) -> Self {
        Target {
            dir: dir.into(),
            file_name: file_name.into(),
        }
    }

    /// The published file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.file_name)
    }

    fn check_dir(&self) -> Result<(), FileError> {
        let missing = || FileError::MissingDirectory(self.dir.clone());
        self.dir.is_dir().then_some(()).ok_or_else(missing)
    }

    /// Removes the temporary files whose writer is gone (under the lock).
    fn remove_stale_temp_files(&self) -> Result<usize, FileError> {
        let prefix = format!(".{}.", self.file_name);
        let writer_gone = |name: &str| {
            temp_file_pid(name, &prefix)
                .is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists())
        };
        fsutil::remove_temp_files(&self.dir, &prefix, writer_gone)
    }

    /// Replaces the target file with `text` (under the lock, but for the benchmark).
    pub fn publish(&self, text: &str) -> Result<(), FileError> {
        self.check_dir()?;
        let prefix = format!(".{}.{}.", self.file_name, std::process::id());
        fsutil::replace(&self.dir, &self.file_name, text.as_bytes(), &prefix, true)
    }

    /// Which file is published now (device and inode): every publish renames
    /// a new file into place, so a change means another run published.
    pub fn published_file(&self) -> Option<(u64, u64)> {
        let metadata = fs::metadata(self.path()).ok()?;
        Some((metadata.dev(), metadata.ino()))
    }
}

/// How publishing ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// This run's file is in place.
    Written,
    /// This run did not get the lock, and the holder published while it
    /// waited: its fresh file is left in place.
    LeftHoldersFile,
}

/// One run's use of a target; dropping it releases the lock.
#[derive(Debug)]
pub struct Publisher<'t> {
    target: &'t Target,
    lock: Option<File>,
    published_before: Option<(u64, u64)>,
}

impl<'t> Publisher<'t> {
    /// Waits for the lock until `until`; with it, removes stale temporary files.
    pub fn begin(target: &'t Target, until: Instant) -> Result<Self, FileError> {
        let published_before = target.published_file();
        target.check_dir()?;
        let path = target.dir.join(format!(".{}.lock", target.file_name));
        let lock = fsutil::lock_by(&path, until)?;
        if lock.is_some() {
            match target.remove_stale_temp_files() {
                Ok(0) => {}
                Ok(n) => log::info!("removed {n} temporary file(s) left by killed runs"),
                Err(error) => log::warn!("{error}"),
            }
        }
        Ok(Publisher {
            target,
            lock,
            published_before,
        })
    }

    /// Whether this run holds the lock (and so may read NVML and publish).
    pub fn holds_lock(&self) -> bool {
        self.lock.is_some()
    }

    /// Whether another run published since this one began.
    pub fn superseded(&self) -> bool {
        self.target.published_file() != self.published_before
    }

    /// Publishes `text`, unless this run is busy and the holder published.
    pub fn publish(self, text: &str) -> Result<Published, FileError> {
        if !self.holds_lock() && self.superseded() {
            return Ok(Published::LeftHoldersFile);
        }
        self.target.publish(text)?;
        Ok(Published::Written)
    }
}

/// Writes `text` to fd 1 by `until`, unbuffered, in pieces of `PIPE_BUF` bytes
/// ([`fsutil::write_polled`]).
pub fn write_stdout(text: &[u8], until: Instant) -> io::Result<bool> {
    fsutil::write_polled(io::stdout(), text, libc::PIPE_BUF, until)
}

/// The pid in a temporary file name `<prefix><pid>.<random>.tmp`, if `name` is one.
fn temp_file_pid(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_suffix(".tmp")?;
    let (pid, random) = rest.split_once('.')?;
    pid.parse().ok().filter(|_| !random.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn publish_writes_world_readable_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::new(dir.path(), "nvidia_gpu.prom");
        target.publish("a 1\n").unwrap();
        target.publish("a 2\n").unwrap();
        let path = dir.path().join("nvidia_gpu.prom");
        assert_eq!(fs::read_to_string(&path).unwrap(), "a 2\n");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
        assert_eq!(entries(dir.path()), ["nvidia_gpu.prom"]);
    }

    #[test]
    fn publish_into_missing_directory_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        let err = Target::new(&missing, "x.prom")
            .publish("a 1\n")
            .unwrap_err();
        assert!(matches!(err, FileError::MissingDirectory(_)));
        assert!(err.to_string().contains("absent"), "{err}");
    }

    #[test]
    fn failed_rename_keeps_old_file_and_removes_temp() {
        let dir = tempfile::tempdir().unwrap();
        // A directory in the target's place makes the rename fail after the write.
        fs::create_dir(dir.path().join("x.prom")).unwrap();
        fs::write(dir.path().join("x.prom/keep"), "old").unwrap();
        let err = Target::new(dir.path(), "x.prom")
            .publish("a 1\n")
            .unwrap_err();
        assert!(err.to_string().contains("rename"), "{err}");
        assert_eq!(entries(dir.path()), ["x.prom"]);
        assert_eq!(
            fs::read_to_string(dir.path().join("x.prom/keep")).unwrap(),
            "old"
        );
    }

    #[test]
    fn every_publish_is_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::new(dir.path(), "x.prom");
        assert_eq!(target.published_file(), None);
        target.publish("a 1\n").unwrap();
        let first = target.published_file().expect("published");
        target.publish("a 1\n").unwrap();
        assert_ne!(target.published_file(), Some(first));
    }

    #[test]
    fn special_files_are_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::new(dir.path(), "x.prom");
        let fifo = |name: &str| {
            let path = dir.path().join(name);
            rustix::fs::mkfifoat(rustix::fs::CWD, &path, 0o600.into()).unwrap();
        };
        fifo(".x.prom.lock");
        let err = Publisher::begin(&target, Instant::now()).unwrap_err();
        assert!(matches!(err, FileError::NotRegularFile(_)), "{err}");
        fs::remove_file(dir.path().join(".x.prom.lock")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(".x.prom.lock")).unwrap();
        let err = Publisher::begin(&target, Instant::now()).unwrap_err();
        assert!(matches!(err, FileError::NotRegularFile(_)), "{err}");
    }

    #[test]
    fn a_busy_run_leaves_a_file_the_holder_published() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::new(dir.path(), "x.prom");
        let holder = Publisher::begin(&target, Instant::now()).unwrap();
        assert!(holder.holds_lock());
        let waiter = Publisher::begin(&target, Instant::now()).unwrap();
        assert!(!waiter.holds_lock() && !waiter.superseded());
        assert_eq!(holder.publish("a 1\n").unwrap(), Published::Written);
        assert!(waiter.superseded());
        assert_eq!(
            waiter.publish("busy\n").unwrap(),
            Published::LeftHoldersFile
        );
        assert_eq!(fs::read_to_string(target.path()).unwrap(), "a 1\n");
    }

    #[test]
    fn temp_names_parse_only_our_pattern() {
        let prefix = ".nvidia_gpu.prom.";
        assert_eq!(
            temp_file_pid(".nvidia_gpu.prom.123.AbC9.tmp", prefix),
            Some(123)
        );
        assert_eq!(temp_file_pid(".nvidia_gpu.prom.lock", prefix), None);
        assert_eq!(temp_file_pid("nvidia_gpu.prom", prefix), None);
        assert_eq!(temp_file_pid(".nvidia_gpu.prom.x.AbC.tmp", prefix), None);
        assert_eq!(temp_file_pid(".other.prom.12.AbC.tmp", prefix), None);
    }

    #[test]
    fn stale_temp_files_of_dead_pids_are_removed_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::new(dir.path(), "nvidia_gpu.prom");
        let dead = ".nvidia_gpu.prom.4294967.zzz.tmp"; // above any pid_max
        let live = format!(".nvidia_gpu.prom.{}.zzz.tmp", std::process::id());
        fs::write(dir.path().join(dead), "partial").unwrap();
        fs::write(dir.path().join(&live), "in progress").unwrap();
        fs::write(dir.path().join("other.prom"), "x 1\n").unwrap();
        assert_eq!(target.remove_stale_temp_files().unwrap(), 1);
        assert_eq!(entries(dir.path()), [live.as_str(), "other.prom"]);
    }

    #[test]
    fn lock_is_exclusive_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::new(dir.path(), "nvidia_gpu.prom");
        let held = Publisher::begin(&target, Instant::now()).unwrap();
        assert!(held.holds_lock(), "first lock");
        let started = Instant::now();
        let deadline = started + Duration::from_millis(100);
        let second = Publisher::begin(&target, deadline).unwrap();
        assert!(!second.holds_lock(), "second lock taken");
        assert!(started.elapsed() >= Duration::from_millis(100));
        drop(held);
        assert!(Publisher::begin(&target, Instant::now())
            .unwrap()
            .holds_lock());
    }
}
