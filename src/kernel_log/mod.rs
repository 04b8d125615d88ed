//! The kernel log as typed events: the driver's lines of this boot after a
//! [`Position`], from the systemd journal ([`journal`]) or else `/dev/kmsg`
//! ([`kmsg`]). Only the kernel's own lines are events (facility kern; in the
//! journal, the kernel transport): `logger "NVRM: Xid …"` or a write to
//! /dev/kmsg never is. A read ends by the caller's deadline with the position
//! at the last entry read completely, so the next goes on from there. This
//! module knows neither NVML nor the state.

mod event;
pub mod journal;
pub mod kmsg;

use std::path::{Path, PathBuf};
use std::time::Instant;

pub use event::{normalize_bus_id, Ended, Error, Event, Position};

/// Where the kernel log is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The systemd journal: the system's, or the files in a directory.
    Journal(Option<PathBuf>),
    /// The kernel's ring buffer.
    Kmsg(PathBuf),
}

impl Source {
    /// The source's name, kept with the position it belongs to.
    pub fn label(&self) -> &'static str {
        match self {
            Source::Journal(_) => "journal",
            Source::Kmsg(_) => "kmsg",
        }
    }

    /// `journal_dir` if given; else the system journal if journalctl and
    /// journal files exist; else `/dev/kmsg` if it opens; else none.
    pub fn choose(journal_dir: Option<&Path>) -> Option<Source> {
        match journal_dir {
            Some(dir) => Some(Source::Journal(Some(dir.to_path_buf()))),
            None if journal::system_journal_exists() => Some(Source::Journal(None)),
            None => match kmsg::open(Path::new(kmsg::KMSG)) {
                Ok(_) => Some(Source::Kmsg(kmsg::KMSG.into())),
                Err(e) => {
                    log::debug!("cannot open {}: {e}", kmsg::KMSG);
                    None
                }
            },
        }
    }
}

/// Reads `source` from `at` until `until`, handing each event of the kernel's
/// own lines to `on_event` and moving `at` past each entry read. `boot_id` is
/// this boot's as the journal writes it (no dashes).
pub fn read(
    source: &Source,
    at: &mut Position,
    boot_id: &str,
    until: Instant,
    on_event: &mut dyn FnMut(Event),
) -> Result<Ended, Error> {
    match source {
        Source::Journal(dir) => journal::read(dir.as_deref(), at, boot_id, until, on_event),
        Source::Kmsg(path) => kmsg::read(path, at, until, on_event),
    }
}
