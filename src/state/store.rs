//! The state directory: whether it and its file can be trusted (only the
//! running user and root may have written them), the lock, and the file read
//! and replaced within its size bound. It knows no collector.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::codec::{parse, render};
use super::problem::{Distrust, Problem};
use super::schema::{State, MAX_SIZE};
use crate::fsutil::{self, io_error, FileError, Foreign};

const FILE_NAME: &str = "state";
const LOCK_NAME: &str = ".state.lock";
/// Temporary files of an atomic replacement.
const TEMP_PREFIX: &str = ".state.";

/// Why a user other than the running one and root could have written it.
fn distrust(metadata: &fs::Metadata) -> Option<Distrust> {
    let euid = rustix::process::geteuid().as_raw();
    fsutil::foreign(metadata).map(|foreign| match foreign {
        Foreign::Owner(uid) => Distrust::Owner(uid, euid),
        Foreign::Writable(mode) => Distrust::Writable(mode),
    })
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    pub(super) dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StateDir { dir: dir.into() }
    }

    /// An error if the directory is not trusted (a missing one is not).
    fn check(&self) -> Result<(), Problem> {
        let why = match fs::metadata(&self.dir) {
            Ok(metadata) if !metadata.is_dir() => Some(Distrust::NotADirectory),
            Ok(metadata) => distrust(&metadata),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error("inspect", &self.dir)(e).into()),
        };
        why.map_or(Ok(()), |why| {
            Err(Problem::UntrustedDir(self.dir.clone(), why))
        })
    }

    /// Creates the directory if missing (mode 0755, like StateDirectory=;
    /// no mkdir otherwise: it waits on a frozen file system), then checks it.
    fn create(&self) -> Result<(), Problem> {
        if !self.dir.is_dir() {
            match fs::DirBuilder::new().mode(0o755).create(&self.dir) {
                Ok(()) => log::info!("created the state directory {}", self.dir.display()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error("create the state directory", &self.dir)(e).into()),
            }
        }
        self.check()
    }

    /// Takes the state's lock by `until`, creating the directory if need be,
    /// and removes the temporary files of killed runs (no writer holds it).
    pub(super) fn lock(&self, until: Instant) -> Result<File, Problem> {
        self.create()?;
        let path = self.dir.join(LOCK_NAME);
        let lock = fsutil::lock_by(&path, until)?.ok_or(Problem::Busy(path))?;
        match fsutil::remove_temp_files(&self.dir, TEMP_PREFIX, |_| true) {
            Ok(0) => {}
            Ok(n) => log::info!(
                "removed {n} temporary state file(s) left by killed runs in {}",
                self.dir.display()
            ),
            Err(error) => log::warn!("{error}"),
        }
        Ok(lock)
    }

    /// The state the previous run left for this boot.
    pub(super) fn load(&self, boot_id: &str) -> Result<State, Problem> {
        self.check()?;
        let state = parse(&read_trusted(&self.dir.join(FILE_NAME))?).map_err(Problem::Corrupt)?;
        if state.boot_id != boot_id {
            return Err(Problem::OtherBoot);
        }
        Ok(state)
    }

    /// Replaces the state file; no fsync: a crash of the machine ends its boot.
    pub(super) fn store(&self, state: &State) -> Result<(), Problem> {
        let text = render(state)?;
        self.create()?;
        fsutil::replace(&self.dir, FILE_NAME, text.as_bytes(), TEMP_PREFIX, false)?;
        Ok(())
    }
}

/// The state file's text if it can be trusted, at most [`MAX_SIZE`] bytes.
fn read_trusted(path: &Path) -> Result<String, Problem> {
    let untrusted = |why| Err(Problem::UntrustedFile(path.to_path_buf(), why));
    let file = match fsutil::open_regular(path, OpenOptions::new().read(true), "read") {
        Err(FileError::NotRegularFile(_)) => return untrusted(Distrust::NotARegularFile),
        Err(FileError::Io(_, _, e)) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Problem::Missing)
        }
        opened => opened?,
    };
    let metadata = file.metadata().map_err(io_error("read", path))?;
    if metadata.len() > MAX_SIZE {
        return untrusted(Distrust::TooLong(metadata.len()));
    }
    if let Some(why) = distrust(&metadata) {
        return untrusted(why);
    }
    let mut text = String::new();
    let read = file.take(MAX_SIZE).read_to_string(&mut text);
    read.map_err(io_error("read", path))?;
    Ok(text)
}
