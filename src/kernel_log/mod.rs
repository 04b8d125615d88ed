//! The kernel log as typed [`Event`]s: the driver's lines of this boot after a
//! [`Position`], from the systemd journal ([`journal`]) or else `/dev/kmsg`
//! ([`kmsg`]); only the kernel's own lines (facility kern, kernel transport).
//! It knows neither NVML nor the state.

mod event;
pub mod journal;
mod kmsg;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Instant;

pub use event::{BusId, Event};

/// Where a read goes on from: after the journal entry of `cursor`; without
/// one, after the entries at or before `monotonic` µs since boot; without
/// either, at the boot's start. /dev/kmsg: after the record `kmsg_seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    pub cursor: Option<String>,
    pub monotonic: Option<u64>,
    pub kmsg_seq: Option<u64>,
}

/// Why a read did not reach the end of the log; the position names the last
/// entry read before.
#[derive(Debug)]
pub enum Error {
    /// Cut by the deadline or by [`journal::MAX_BYTES_PER_RUN`] ([`Error::is_cut`]).
    Deadline,
    Bound,
    /// What could not be done (run journalctl, read /dev/kmsg), and why.
    Io(String, io::Error),
    /// journalctl exited with a failure, saying this on its stderr. A refused
    /// cursor fails as a journal it cannot open does (status 1).
    Failed(ExitStatus, String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = journal::MAX_BYTES_PER_RUN;
        match self {
            Error::Io(what, e) => write!(f, "cannot {what}: {e}"),
            Error::Failed(status, said) => write!(f, "journalctl failed ({status}): {said}"),
            Error::Deadline => {
                f.write_str("reading the kernel log did not finish by the run's deadline")
            }
            Error::Bound => write!(f, "journalctl wrote more than {bytes} bytes in this run"),
        }
    }
}

impl Error {
    pub fn is_cut(&self) -> bool {
        matches!(self, Error::Deadline | Error::Bound)
    }
}

impl std::error::Error for Error {}

/// Where the kernel log is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The systemd journal: the system's, or the files in a directory.
    Journal(Option<PathBuf>),
    /// The kernel's ring buffer, /dev/kmsg.
    Kmsg,
}

impl Source {
    /// The source's name, kept with the position it belongs to.
    pub fn label(&self) -> &'static str {
        match self {
            Source::Journal(_) => "journal",
            Source::Kmsg => "kmsg",
        }
    }

    /// `journal_dir` if given; else the system journal if journalctl and
    /// journal files exist; else `/dev/kmsg` if it opens; else none.
    pub fn choose(journal_dir: Option<&Path>) -> Option<Source> {
        match journal_dir {
            Some(dir) => Some(Source::Journal(Some(dir.to_path_buf()))),
            None if journal::system_journal_exists() => Some(Source::Journal(None)),
            None => {
                let unreadable = |e: &io::Error| log::debug!("cannot open {}: {e}", kmsg::KMSG);
                kmsg::open()
                    .inspect_err(unreadable)
                    .ok()
                    .map(|_| Source::Kmsg)
            }
        }
    }

    /// Reads from `at` until `until`, handing each event of the kernel's own
    /// lines to `on_event` and moving `at` past each entry read. `boot_id` is
    /// this boot's as the journal writes it (no dashes).
    pub fn read(
        &self,
        at: &mut Position,
        boot_id: &str,
        until: Instant,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<(), Error> {
        let on_line = &mut |line: &str| Event::parse(line).into_iter().for_each(&mut *on_event);
        match self {
            Source::Journal(dir) => journal::read(dir.as_deref(), at, boot_id, until, on_line),
            Source::Kmsg => kmsg::read(at, until, on_line),
        }
    }
}
