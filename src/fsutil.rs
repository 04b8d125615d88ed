//! The file primitives `publish`, `state`, `allocation` and `logging` share,
//! none knowing which directory it works in.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{self, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use crate::bounded::{self, Unfinished};

/// Why a file operation failed; each names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(
        "{} is not a regular file (a FIFO, device, symlink or directory?); \
         remove it so the exporter can use the name",
        .0.display()
    )]
    NotRegularFile(PathBuf),
    #[error("output directory {} does not exist", .0.display())]
    MissingDirectory(PathBuf),
    /// What failed (`open`, `rename temporary file onto`, …), on which path, why.
    #[error("cannot {0} {}: {2}", .1.display())]
    Io(&'static str, PathBuf, io::Error),
}

/// Why a user other than the running one and root could have written a
/// file or directory: its owner, or a mode that lets others write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    Owner(u32),
    Writable(u32),
}

/// [`Foreign`], if the file or directory with `metadata` is not the running
/// user's or root's alone.
pub fn foreign(metadata: &fs::Metadata) -> Option<Foreign> {
    let euid = rustix::process::geteuid().as_raw();
    let (uid, mode) = (metadata.uid(), metadata.mode() & 0o7777);
    if uid != euid && uid != 0 {
        Some(Foreign::Owner(uid))
    } else {
        (mode & 0o022 != 0).then_some(Foreign::Writable(mode))
    }
}

/// The error of `action` on `path`, as a closure for `map_err`.
pub fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FileError {
    let path = path.to_path_buf();
    move |error| FileError::Io(action, path, error)
}

/// Opens `path` only if it is a regular file, never following a symlink
/// (`O_NOFOLLOW`) nor blocking on a FIFO (`O_NONBLOCK`).
pub fn open_regular(
    path: &Path,
    options: &mut OpenOptions,
    action: &'static str,
) -> Result<File, FileError> {
    let file = options
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP | libc::ENXIO) => FileError::NotRegularFile(path.to_path_buf()),
            _ => io_error(action, path)(source),
        })?;
    if !file.metadata().map_err(io_error(action, path))?.is_file() {
        return Err(FileError::NotRegularFile(path.to_path_buf()));
    }
    Ok(file)
}

/// Takes an exclusive `flock` on the lock file `path` (created mode 0600),
/// waiting until `until`: `Ok(None)` if another process still held it then.
/// Dropping the file, or the holder's death, releases it.
pub fn lock_by(path: &Path, until: Instant) -> Result<Option<File>, FileError> {
    let file = open_regular(
        path,
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600),
        "open lock file",
    )?;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(fs::TryLockError::WouldBlock) if Instant::now() < until => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(fs::TryLockError::WouldBlock) => return Ok(None),
            Err(fs::TryLockError::Error(source)) => return Err(io_error("lock", path)(source)),
        }
    }
}

/// Replaces `dir/name` with `bytes` (mode 0644) atomically, through a
/// temporary file `<temp_prefix>….tmp` in `dir` that is removed if anything
/// fails; with `sync`, the file and the directory are fsynced.
pub fn replace(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    temp_prefix: &str,
    sync: bool,
) -> Result<(), FileError> {
    let mut temp = tempfile::Builder::new()
        .prefix(temp_prefix)
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(io_error("create a temporary file in", dir))?;
    let temp_path = temp.path().to_path_buf();
    let file = temp.as_file_mut();
    file.write_all(bytes)
        .map_err(io_error("write", &temp_path))?;
    file.set_permissions(Permissions::from_mode(0o644))
        .map_err(io_error("set permissions of", &temp_path))?;
    if sync {
        file.sync_all().map_err(io_error("sync", &temp_path))?;
    }
    let target = dir.join(name);
    temp.persist(&target)
        .map_err(|e| io_error("rename temporary file onto", &target)(e.error))?;
    if sync {
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error("sync directory", dir))?;
    }
    Ok(())
}

/// Removes the temporary files `<prefix>….tmp` in `dir` that `stale` says
/// no writer holds; returns how many were removed.
pub fn remove_temp_files(
    dir: &Path,
    prefix: &str,
    stale: impl Fn(&str) -> bool,
) -> Result<usize, FileError> {
    let entries = fs::read_dir(dir).map_err(io_error("list", dir))?;
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let ours = |name: &&str| name.starts_with(prefix) && name.ends_with(".tmp") && stale(name);
        if name.to_str().filter(ours).is_none() {
            continue;
        }
        match fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("remove stale temporary file", &entry.path())(e)),
        }
    }
    Ok(removed)
}

/// Runs `work` on a thread of its own until `until`: `None` if it had not
/// ended by then (the thread is left behind, holding what it holds).
pub fn within<T: Send + 'static>(
    until: Instant,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let done = bounded::call("files", until, work);
    if let Err(Unfinished::NotStarted(e)) = &done {
        log::warn!("cannot start a thread for file I/O: {e}");
    }
    done.ok()
}

/// Writes `bytes` to `fd` by `until` (`Ok(false)`: it had not taken them all),
/// each write at most `piece` bytes after poll(2), so none blocks.
pub fn write_polled(fd: impl AsFd, bytes: &[u8], piece: usize, until: Instant) -> io::Result<bool> {
    let (fd, mut rest) = (fd.as_fd(), bytes);
    while !rest.is_empty() {
        let wait = Timespec::try_from(until.saturating_duration_since(Instant::now())).ok();
        let mut ready = [PollFd::from_borrowed_fd(fd, PollFlags::OUT)];
        match event::poll(&mut ready, wait.as_ref()) {
            Ok(0) => return Ok(false),
            Err(Errno::INTR) => continue,
            Err(error) => return Err(error.into()),
            // Ready, or POLLERR/POLLHUP: the write says which (EPIPE).
            Ok(_) => {}
        }
        match rustix::io::write(fd, &rest[..rest.len().min(piece)]) {
            Ok(written) => rest = &rest[written..],
            Err(Errno::INTR | Errno::AGAIN) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, 0o600.into()).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        for path in [&fifo, &link] {
            let opened = open_regular(path, OpenOptions::new().read(true), "open");
            assert!(
                matches!(opened, Err(FileError::NotRegularFile(_))),
                "{path:?}"
            );
            let locked = lock_by(path, Instant::now());
            assert!(
                matches!(locked, Err(FileError::NotRegularFile(_))),
                "{path:?}"
            );
        }
    }

    #[test]
    fn a_lock_is_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".lock");
        let held = lock_by(&path, Instant::now()).unwrap().expect("first lock");
        let started = Instant::now();
        let until = started + Duration::from_millis(100);
        assert!(lock_by(&path, until).unwrap().is_none(), "taken twice");
        assert!(started.elapsed() >= Duration::from_millis(100));
        drop(held);
        assert!(lock_by(&path, Instant::now()).unwrap().is_some());
    }

    #[test]
    fn only_stale_temp_files_of_the_prefix_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for name in [".a.1.tmp", ".a.2.tmp", ".a.lock", ".b.1.tmp", "a"] {
            fs::write(dir.path().join(name), "x").unwrap();
        }
        let removed = remove_temp_files(dir.path(), ".a.", |name| name != ".a.2.tmp").unwrap();
        assert_eq!(removed, 1);
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [".a.2.tmp", ".a.lock", ".b.1.tmp", "a"]);
    }

    #[test]
    fn work_past_the_deadline_is_left_behind() {
        let now = Instant::now();
        assert_eq!(within(now + Duration::from_secs(5), || 7), Some(7));
        let started = Instant::now();
        let late = within(started + Duration::from_millis(50), || {
            thread::sleep(Duration::from_secs(2));
        });
        assert_eq!(late, None);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
