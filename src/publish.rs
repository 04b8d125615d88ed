//! The only code that touches the textfile directory.
//!
//! Contract of [`Target::publish`]:
//! - readers of `<dir>/<file>` see either the previous complete file or the new
//!   complete file, never a mix: the text goes to a temporary file in the same
//!   directory (so the rename cannot cross file systems), is flushed, fsynced and
//!   made mode 0644, then renamed over the target, and the directory is fsynced;
//! - temporary files are named `.<file>.<pid>.<random>.tmp`: hidden and not ending
//!   in `.prom`, so node_exporter's textfile collector never reads them;
//! - a failed publish removes its temporary file and leaves the old file untouched;
//! - temporary files left by runs that were killed are removed by the next run
//!   ([`Target::remove_stale_temp_files`]), recognised by a pid that no longer exists.
//!
//! [`Target::lock`] serialises runs that share a target: the lock is an advisory
//! `flock` on `.<file>.lock`, released by the kernel when its holder dies, so a
//! crashed run never blocks the next one.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

/// Mode of the published file: node_exporter runs as another user and must read it.
const FILE_MODE: u32 = 0o644;

/// Where the metrics go.
#[derive(Debug, Clone)]
pub struct Target {
    dir: PathBuf,
    file_name: String,
}

/// Why publishing failed; each names the path involved.
#[derive(Debug)]
pub enum PublishError {
    /// The output directory does not exist or is not a directory.
    MissingDirectory(PathBuf),
    /// Creating, writing, syncing or renaming failed.
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PublishError::MissingDirectory(dir) => {
                write!(f, "output directory {} does not exist", dir.display())
            }
            PublishError::Io {
                action,
                path,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for PublishError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PublishError::MissingDirectory(_) => None,
            PublishError::Io { source, .. } => Some(source),
        }
    }
}

/// A held run lock; dropping it releases the lock.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

impl Target {
    /// A target file `file_name` in `dir`. The caller has validated `file_name`
    /// (a plain `*.prom` name, see `cli`).
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

    fn check_dir(&self) -> Result<(), PublishError> {
        if self.dir.is_dir() {
            Ok(())
        } else {
            Err(PublishError::MissingDirectory(self.dir.clone()))
        }
    }

    fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PublishError {
        let path = path.to_path_buf();
        move |source| PublishError::Io {
            action,
            path,
            source,
        }
    }

    /// Takes the run lock, waiting until `deadline`. `Ok(None)` means another run
    /// still held it at the deadline.
    pub fn lock(&self, deadline: Instant) -> Result<Option<RunLock>, PublishError> {
        self.check_dir()?;
        let path = self.dir.join(format!(".{}.lock", self.file_name));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(Self::io_error("open lock file", &path))?;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Some(RunLock { _file: file })),
                Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(20));
                }
                Err(fs::TryLockError::WouldBlock) => return Ok(None),
                Err(fs::TryLockError::Error(source)) => {
                    return Err(PublishError::Io {
                        action: "lock",
                        path,
                        source,
                    })
                }
            }
        }
    }

    fn temp_prefix(&self) -> String {
        format!(".{}.", self.file_name)
    }

    /// Removes temporary files whose writer process no longer exists. Returns how
    /// many were removed. Call it while holding the run lock.
    pub fn remove_stale_temp_files(&self) -> Result<usize, PublishError> {
        let prefix = self.temp_prefix();
        let entries = fs::read_dir(&self.dir).map_err(Self::io_error("list", &self.dir))?;
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| temp_file_pid(n, &prefix)) else {
                continue;
            };
            if Path::new("/proc").join(pid.to_string()).exists() {
                continue;
            }
            match fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(PublishError::Io {
                        action: "remove stale temporary file",
                        path: entry.path(),
                        source,
                    })
                }
            }
        }
        Ok(removed)
    }

    /// Atomically replaces the target file with `text` (see the module contract).
    pub fn publish(&self, text: &str) -> Result<(), PublishError> {
        self.check_dir()?;
        let mut temp = tempfile::Builder::new()
            .prefix(&format!("{}{}.", self.temp_prefix(), std::process::id()))
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(Self::io_error("create a temporary file in", &self.dir))?;
        let temp_path = temp.path().to_path_buf();
        let file = temp.as_file_mut();
        file.write_all(text.as_bytes())
            .map_err(Self::io_error("write", &temp_path))?;
        file.set_permissions(Permissions::from_mode(FILE_MODE))
            .map_err(Self::io_error("set permissions of", &temp_path))?;
        file.sync_all()
            .map_err(Self::io_error("sync", &temp_path))?;
        let target = self.path();
        temp.persist(&target).map_err(|e| PublishError::Io {
            action: "rename temporary file onto",
            path: target.clone(),
            source: e.error,
        })?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(Self::io_error("sync directory", &self.dir))?;
        Ok(())
    }
}

impl Target {
    /// Which file is published now: device and inode, `None` if there is none.
    /// Every publish renames a new file into place, so a change means another
    /// run published.
    pub fn published_file(&self) -> Option<(u64, u64)> {
        fs::metadata(self.path())
            .ok()
            .map(|metadata| (metadata.dev(), metadata.ino()))
    }

    /// The `gpu` index → `uuid` pairs of the GPUs the published file lists with a
    /// UUID (from its `nvidia_gpu_up` series), so that a GPU whose UUID can no
    /// longer be read keeps the identity it had. Empty if there is no file.
    pub fn previous_uuids(&self) -> Vec<(u32, String)> {
        let Ok(text) = fs::read_to_string(self.path()) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| {
                let labels = line.strip_prefix("nvidia_gpu_up{gpu=\"")?;
                let (index, rest) = labels.split_once("\",uuid=\"")?;
                let (uuid, _) = rest.split_once('"')?;
                let plain = !uuid.is_empty() && !uuid.contains('\\');
                plain.then(|| Some((index.parse().ok()?, uuid.to_owned())))?
            })
            .collect()
    }
}

/// The pid in a temporary file name `<prefix><pid>.<random>.tmp`, if `name` is one.
fn temp_file_pid(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_suffix(".tmp")?;
    let (pid, random) = rest.split_once('.')?;
    if random.is_empty() {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(matches!(err, PublishError::MissingDirectory(_)));
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
    fn previous_uuids_come_from_the_published_up_series() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::new(dir.path(), "x.prom");
        assert!(target.previous_uuids().is_empty());
        target
            .publish(concat!(
                "nvidia_gpu_up{gpu=\"0\",uuid=\"GPU-a\"} 1\n",
                "nvidia_gpu_up{gpu=\"1\",uuid=\"\"} 0\n",
                "nvidia_gpu_info{gpu=\"2\",uuid=\"GPU-c\",name=\"x\"} 1\n",
                "nvidia_gpu_up{gpu=\"3\",uuid=\"GPU-d\"} 0\n",
            ))
            .unwrap();
        assert_eq!(
            target.previous_uuids(),
            [(0, "GPU-a".to_owned()), (3, "GPU-d".to_owned())]
        );
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
        let held = target.lock(Instant::now()).unwrap().expect("first lock");
        let started = Instant::now();
        let deadline = started + Duration::from_millis(100);
        assert!(
            target.lock(deadline).unwrap().is_none(),
            "second lock taken"
        );
        assert!(started.elapsed() >= Duration::from_millis(100));
        drop(held);
        assert!(target.lock(Instant::now()).unwrap().is_some());
    }
}
