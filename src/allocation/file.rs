//! A source's file, read only as root's files are: a regular file (no
//! symlink followed, no FIFO waited on) owned by root or the running user,
//! that no one else may write, within a size bound.

use std::fs::{self, OpenOptions};
use std::io::Read;
use std::path::Path;
use std::time::SystemTime;

use serde::de::DeserializeOwned;

use crate::fsutil::{self, open_regular, Foreign};

/// Why a source's file was not read.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{0}")]
    Open(#[from] crate::fsutil::FileError),
    #[error("not a directory")]
    NotADirectory,
    #[error("owned by uid {0}, not root's")]
    Owner(u32),
    #[error("writable by others (mode {0:o})")]
    Writable(u32),
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    #[error("cannot be read: {0}")]
    Read(#[from] std::io::Error),
}

/// Whether a file or directory with `metadata` is root's (or the running
/// user's) alone.
pub fn trusted(metadata: &fs::Metadata) -> Result<(), Refused> {
    match fsutil::foreign(metadata) {
        Some(Foreign::Owner(uid)) => Err(Refused::Owner(uid)),
        Some(Foreign::Writable(mode)) => Err(Refused::Writable(mode)),
        None => Ok(()),
    }
}

/// The text of `path` and when it was last written, if trusted and at most
/// `max` bytes; `Ok(None)` where it does not exist.
pub fn read(path: &Path, max: u64) -> Result<Option<(Vec<u8>, SystemTime)>, Refused> {
    let file = match open_regular(path, OpenOptions::new().read(true), "open") {
        Ok(file) => file,
        Err(crate::fsutil::FileError::Io(_, _, e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e.into()),
    };
    let metadata = file.metadata()?;
    trusted(&metadata)?;
    if metadata.len() > max {
        return Err(Refused::TooLarge(max));
    }
    let mut text = Vec::new();
    file.take(max + 1).read_to_end(&mut text)?;
    if text.len() as u64 > max {
        return Err(Refused::TooLarge(max));
    }
    Ok(Some((text, metadata.modified()?)))
}

/// The JSON value of `path` (read as [`read`] reads it); `Ok(None)` where it
/// does not exist, and one that is not a `T` is "not a `what`".
pub fn json<T: DeserializeOwned>(path: &Path, max: u64, what: &str) -> Result<Option<T>, String> {
    let Some((text, _)) = read(path, max).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| format!("not a {what} ({e})"))
}

/// The names in directory `dir`, if it is trusted: at most `max` of them (in
/// name order, the rest said in the error); `Ok(None)` where it does not exist.
pub fn names(dir: &Path, max: usize) -> Result<Option<(Vec<String>, bool)>, Refused> {
    let metadata = match fs::symlink_metadata(dir) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !metadata.is_dir() {
        return Err(Refused::NotADirectory);
    }
    trusted(&metadata)?;
    let mut names: Vec<String> = fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.'))
        .collect();
    names.sort();
    let more = names.len() > max;
    names.truncate(max);
    Ok(Some((names, more)))
}
