//! This boot's kernel entries from the systemd journal: `journalctl -o export`
//! from a [`Position`], parsed on a thread of its own as the output arrives
//! (at most [`MAX_VALUE`] bytes of a field kept, a bounded queue of entries),
//! until journalctl ends, the deadline passes or [`MAX_BYTES_PER_RUN`] bytes
//! were read (then journalctl is killed; an entry cut off is not read).
//!
//! journalctl starts at the cursor with `--cursor`, not `--after-cursor`: the
//! latter always skips one entry after seeking, and once the file holding the
//! cursor's entry is vacuumed the seek lands on the next entry, which is then
//! skipped (systemd 252, tests/xid.rs). The entry equal to the cursor is
//! dropped here instead. Without a cursor, a cursor of the boot id and
//! monotonic time starts at that time, and entries at or before it are
//! dropped.

use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use super::{Ended, Error, Event, Position};

/// Where journalctl is, in the order tried. Only these absolute paths: a
/// `PATH` lookup by a program running as root would start whatever a writable
/// directory early in `PATH` holds.
pub const JOURNALCTL: [&str; 2] = ["/usr/bin/journalctl", "/bin/journalctl"];

/// The directories journald writes to.
const SYSTEM_JOURNALS: [&str; 2] = ["/var/log/journal", "/run/log/journal"];

/// The most bytes of journalctl's output one run reads: about 160,000 kernel
/// lines of about 400 bytes. A larger backlog (the first run of a boot with a
/// noisy kernel) is worked off over several runs of bounded time; memory does
/// not depend on it.
pub const MAX_BYTES_PER_RUN: u64 = 64 << 20;

/// The most bytes of a field's value kept: a kernel line is at most about
/// 1 KiB (a /dev/kmsg record 8 KiB), a cursor about 150 bytes.
pub const MAX_VALUE: usize = 8 << 10;

/// Whether journalctl and journal files of the system exist.
pub(super) fn system_journal_exists() -> bool {
    journalctl().is_some()
        && SYSTEM_JOURNALS
            .iter()
            .any(|dir| has_journal_files(Path::new(dir)))
}

fn journalctl() -> Option<&'static Path> {
    JOURNALCTL.iter().map(Path::new).find(|path| path.is_file())
}

/// Whether `dir` or a directory in it (`<machine-id>/`) holds a journal file.
fn has_journal_files(dir: &Path) -> bool {
    let journal = |path: &Path| {
        path.extension()
            .is_some_and(|e| e == "journal" || e == "journal~")
    };
    let files = |dir: &Path| fs::read_dir(dir).into_iter().flatten().flatten();
    files(dir).any(|e| journal(&e.path()) || files(&e.path()).any(|e| journal(&e.path())))
}

/// One journal entry: the fields read here.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Entry {
    cursor: String,
    monotonic: Option<u64>,
    facility: Option<String>,
    message: String,
}

/// See [`super::read`]; `dir` replaces the system journal.
pub(super) fn read(
    dir: Option<&Path>,
    at: &mut Position,
    boot_id: &str,
    until: Instant,
    on_event: &mut dyn FnMut(Event),
) -> Result<Ended, Error> {
    let mut command = Command::new(journalctl().ok_or(Error::NoJournalctl)?);
    if let Some(dir) = dir {
        command.arg("--directory").arg(dir);
    }
    command.args(["--no-pager", "--quiet", "--output=export"]);
    command.arg("--output-fields=MESSAGE,SYSLOG_FACILITY");
    let (cursor, skip_through) = match (&at.cursor, at.monotonic) {
        (Some(cursor), _) => (Some(cursor.clone()), None),
        (None, Some(monotonic)) => (
            Some(format!("b={boot_id};m={monotonic:x}")),
            Some(monotonic),
        ),
        (None, None) => (None, None),
    };
    if let Some(cursor) = &cursor {
        command.arg(format!("--cursor={cursor}"));
    }
    // journalctl's error lines go to our standard error as they are.
    let mut child = command
        .arg("_TRANSPORT=kernel")
        .arg(format!("_BOOT_ID={boot_id}"))
        .env("SYSTEMD_COLORS", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(Error::Journalctl)?;
    let stdout = child.stdout.take().expect("piped");
    let (entries, parsed) = mpsc::sync_channel(64);
    let parser = thread::spawn(move || parse(stdout, &mut |entry| entries.send(entry).is_ok()));
    let cut = loop {
        let left = until.saturating_duration_since(Instant::now());
        let entry = match parsed.recv_timeout(left) {
            Ok(entry) => entry,
            Err(mpsc::RecvTimeoutError::Timeout) => break Ok(Ended::Deadline),
            Err(mpsc::RecvTimeoutError::Disconnected) => match parser.join() {
                Ok(Ok(true)) => break Ok(Ended::Bound),
                Ok(Ok(false)) => break Err(None),
                Ok(Err(e)) => break Err(Some(e)),
                Err(panic) => std::panic::resume_unwind(panic),
            },
        };
        if Some(&entry.cursor) == at.cursor.as_ref() {
            continue; // the entry read last, still in the journal
        }
        let after = skip_through.is_none_or(|t| entry.monotonic.is_some_and(|m| m > t));
        if after && entry.facility.as_deref().is_none_or(|f| f == "0") {
            if let Some(event) = Event::parse(&entry.message) {
                on_event(event);
            }
        }
        at.cursor = Some(entry.cursor);
        at.monotonic = entry.monotonic.or(at.monotonic);
    };
    match cut {
        Err(None) => match child.wait().map_err(Error::Journalctl)? {
            status if status.success() => Ok(Ended::Complete),
            status => Err(Error::Failed(status)),
        },
        cut => {
            // The parser thread ends once journalctl's output closes.
            let _ = child.kill();
            let _ = child.wait();
            cut.map_err(|e| Error::Journalctl(e.expect("a read error")))
        }
    }
}

/// A line of export output.
enum Field {
    /// A field's name and (the first [`MAX_VALUE`] bytes of) its value.
    Value(Vec<u8>, Vec<u8>),
    /// The empty line that ends an entry.
    EndOfEntry,
}

/// Parses export output, handing each complete entry to `on_entry` until it
/// returns false or the output ends; true if it ended at the byte bound.
fn parse(output: impl Read, on_entry: &mut dyn FnMut(Entry) -> bool) -> io::Result<bool> {
    let mut limited = output.take(MAX_BYTES_PER_RUN);
    let mut reader = BufReader::new(&mut limited);
    let mut entry = Entry::default();
    loop {
        match next_field(&mut reader) {
            Ok(Some(Field::Value(key, value))) => set(&mut entry, &key, &value),
            Ok(Some(Field::EndOfEntry)) => {
                let done = std::mem::take(&mut entry);
                if !done.cursor.is_empty() && !on_entry(done) {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
    }
    drop(reader);
    Ok(limited.limit() == 0)
}

/// The next line; `None` at the end of the output. Text fields are
/// `KEY=value` lines; binary ones (a message with control characters) `KEY`,
/// a 64-bit little-endian length, the data and a line feed.
fn next_field(reader: &mut impl BufRead) -> io::Result<Option<Field>> {
    let mut key = Vec::new();
    if reader
        .by_ref()
        .take(MAX_VALUE as u64 + 64)
        .read_until(b'\n', &mut key)?
        == 0
    {
        return Ok(None);
    }
    if key.last() == Some(&b'\n') {
        key.pop();
    } else {
        reader.skip_until(b'\n')?; // longer than kept
    }
    if key.is_empty() {
        return Ok(Some(Field::EndOfEntry));
    }
    if let Some(eq) = key.iter().position(|&b| b == b'=') {
        let value = key.split_off(eq + 1);
        key.pop();
        return Ok(Some(Field::Value(key, value)));
    }
    let mut length = [0u8; 8];
    reader.read_exact(&mut length)?;
    let length = u64::from_le_bytes(length);
    let mut value = Vec::new();
    reader
        .by_ref()
        .take(length.min(MAX_VALUE as u64))
        .read_to_end(&mut value)?;
    let rest = length - value.len() as u64;
    if io::copy(&mut reader.by_ref().take(rest), &mut io::sink())? < rest {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    reader.read_exact(&mut [0u8])?;
    Ok(Some(Field::Value(key, value)))
}

fn set(entry: &mut Entry, key: &[u8], value: &[u8]) {
    let text = || String::from_utf8_lossy(value).into_owned();
    match key {
        b"__CURSOR" => entry.cursor = text(),
        b"__MONOTONIC_TIMESTAMP" => entry.monotonic = text().parse().ok(),
        b"SYSLOG_FACILITY" => entry.facility = Some(text()),
        b"MESSAGE" => entry.message = text(),
        _ => {}
    }
}
