//! Where the kernel log is read from, and its read.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::event::{Error, Event, Position};
use super::{journal, kmsg};

/// Where the kernel log is read from.
#[derive(Debug)]
pub enum Source {
    /// The systemd journal: the system's, or the files in a directory.
    Journal(Option<PathBuf>),
    /// The kernel's ring buffer, /dev/kmsg, open for reads that never block.
    Kmsg(File),
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
    /// journal files exist; else `/dev/kmsg` if it opens.
    pub fn choose(journal_dir: Option<&Path>) -> Result<Source, Error> {
        match journal_dir {
            Some(dir) => Ok(Source::Journal(Some(dir.to_path_buf()))),
            None if journal::system_journal_exists() => Ok(Source::Journal(None)),
            None => kmsg::open()
                .inspect_err(|e| log::debug!("cannot open {}: {e}", kmsg::KMSG))
                .map(Source::Kmsg)
                .map_err(|_| Error::NoSource),
        }
    }

    /// Reads this boot's log from `at` until `until`, handing each event of
    /// the kernel's own lines to `on_event`; `at` moves past each entry read.
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
            Source::Kmsg(file) => kmsg::read(file, at, until, on_line),
        }
    }
}
