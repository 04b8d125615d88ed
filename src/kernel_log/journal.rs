//! This boot's kernel entries from the systemd journal: `journalctl -o export`
//! parsed on a thread of its own as it arrives, until journalctl ends, the
//! deadline passes or [`MAX_BYTES_PER_RUN`] bytes were read (then it is
//! killed; an entry cut off is not read). The read starts with `--cursor`, not
//! `--after-cursor` (docs/design.md says why), and drops the cursor's entry.

use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use super::event::{Error, Position, MAX_BYTES_PER_RUN};

/// Where journalctl is, in the order tried: never looked up in `PATH`, where
/// a program running as root would start whatever a writable directory holds.
const JOURNALCTL: [&str; 2] = ["/usr/bin/journalctl", "/bin/journalctl"];

/// The most bytes of a field's value kept: a kernel line is at most about
/// 1 KiB (a /dev/kmsg record 8 KiB), a cursor about 150 bytes.
const MAX_VALUE: usize = 8 << 10;

/// Whether journalctl and the system's journal files exist (in the directory
/// or its `<machine-id>/`).
pub(super) fn system_journal_exists() -> bool {
    let files = |dir: &Path| fs::read_dir(dir).into_iter().flatten().flatten();
    let journal = |path: PathBuf| {
        path.extension()
            .is_some_and(|e| e == "journal" || e == "journal~")
    };
    let has_files = |dir: &str| {
        files(Path::new(dir))
            .map(|e| e.path())
            .any(|p| files(&p).any(|f| journal(f.path())) || journal(p))
    };
    let dirs = ["/var/log/journal", "/run/log/journal"];
    journalctl().is_some() && dirs.into_iter().any(has_files)
}

fn journalctl() -> Option<&'static Path> {
    JOURNALCTL.iter().map(Path::new).find(|path| path.is_file())
}

/// One journal entry: the fields used here.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Entry {
    cursor: String,
    monotonic: Option<u64>,
    facility: Option<String>,
    message: String,
}

/// See [`super::Source::read`]; `dir` replaces the system journal, `on_line`
/// gets the kernel's own messages.
pub(super) fn read(
    dir: Option<&Path>,
    at: &mut Position,
    boot_id: &str,
    until: Instant,
    on_line: &mut dyn FnMut(&str),
) -> Result<(), Error> {
    let not_found = || io::Error::new(io::ErrorKind::NotFound, JOURNALCTL.join(" or "));
    let start = |e| Error::Io("run journalctl".into(), e);
    let mut command = Command::new(journalctl().ok_or_else(not_found).map_err(start)?);
    if let Some(dir) = dir {
        command.arg("--directory").arg(dir);
    }
    // Without a cursor, from the entry's time on (a cursor journalctl makes).
    let skip_through = at.monotonic.filter(|_| at.cursor.is_none());
    let by_time = skip_through.map(|m| format!("b={boot_id};m={m:x}"));
    let cursor = at.cursor.clone().or(by_time);
    command.args(cursor.map(|cursor| format!("--cursor={cursor}")));
    let child = command
        .args(["--no-pager", "--quiet", "--output=export"])
        .arg("--output-fields=MESSAGE,SYSLOG_FACILITY")
        .arg("_TRANSPORT=kernel")
        .arg(format!("_BOOT_ID={boot_id}"))
        .env("SYSTEMD_COLORS", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(start)?;
    stream(child, until, &mut |entry| {
        if Some(&entry.cursor) == at.cursor.as_ref() {
            return; // the entry read last, still in the journal
        }
        let after = skip_through.is_none_or(|t| entry.monotonic.is_some_and(|m| m > t));
        if after && entry.facility.as_deref().is_none_or(|f| f == "0") {
            on_line(&entry.message);
        }
        at.cursor = Some(entry.cursor);
        at.monotonic = entry.monotonic.or(at.monotonic);
    })
}

/// Hands each entry of `child`'s export output to `on_entry` until it exits
/// (its status decides), `until` passes or the byte bound is reached (then it
/// is killed).
fn stream(mut child: Child, until: Instant, on_entry: &mut dyn FnMut(Entry)) -> Result<(), Error> {
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    // Entries travel in batches of up to 256 (sent when the output read so
    // far is used up), at most four queued.
    let (batches, parsed) = mpsc::sync_channel(4);
    let parser = thread::spawn(move || {
        let mut batch = Vec::new();
        let ended = parse(stdout, &mut |entry, drained| {
            batch.push(entry);
            (batch.len() < 256 && !drained) || batches.send(std::mem::take(&mut batch)).is_ok()
        });
        let _ = batches.send(batch);
        ended
    });
    // The first 64 KiB of what journalctl says (read to the end: it never blocks on it).
    let said = thread::spawn(move || {
        let mut said = Vec::new();
        let _ = stderr.by_ref().take(1 << 16).read_to_end(&mut said);
        let _ = io::copy(&mut stderr, &mut io::sink());
        String::from_utf8_lossy(&said).trim().to_owned()
    });
    let failed = |e| Error::Io("read journalctl's output".into(), e);
    let cut = loop {
        // A queued batch is received even after the deadline: look first.
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Some(Error::Deadline);
        }
        match parsed.recv_timeout(left) {
            Ok(batch) => batch.into_iter().for_each(&mut *on_entry),
            Err(mpsc::RecvTimeoutError::Timeout) => break Some(Error::Deadline),
            Err(mpsc::RecvTimeoutError::Disconnected) => match parser.join() {
                Ok(Ok(false)) => break None, // the output ended
                Ok(bound) => break Some(bound.map_or_else(failed, |_| Error::Bound)),
                Err(panic) => std::panic::resume_unwind(panic),
            },
        }
    };
    if let Some(cut) = cut {
        // The parser thread ends once journalctl's output closes.
        let _ = child.kill();
        let _ = child.wait();
        return Err(cut);
    }
    let status = child.wait().map_err(failed)?;
    let said = said.join().unwrap_or_default();
    let exited = status.success();
    exited.then_some(()).ok_or(Error::Failed(status, said))
}

/// Parses export output, handing each complete entry to `on_entry` (with
/// whether the output read so far is used up) until it returns false or the
/// output ends; true if it ended at the byte bound.
fn parse(output: impl Read, on_entry: &mut dyn FnMut(Entry, bool) -> bool) -> io::Result<bool> {
    let mut limited = output.take(MAX_BYTES_PER_RUN);
    let mut reader = BufReader::new(&mut limited);
    let mut entry = Entry::default();
    loop {
        let (key, value) = match next_field(&mut reader) {
            Ok(Some(field)) => field,
            Err(e) if e.kind() != io::ErrorKind::UnexpectedEof => return Err(e),
            _ => break,
        };
        let text = || String::from_utf8_lossy(&value).into_owned();
        match &key[..] {
            b"" if value.is_empty() => {
                let done = std::mem::take(&mut entry);
                if !done.cursor.is_empty() && !on_entry(done, reader.buffer().is_empty()) {
                    break;
                }
            }
            b"__CURSOR" => entry.cursor = text(),
            b"__MONOTONIC_TIMESTAMP" => entry.monotonic = text().parse().ok(),
            b"SYSLOG_FACILITY" => entry.facility = Some(text()),
            b"MESSAGE" => entry.message = text(),
            _ => {}
        }
    }
    drop(reader);
    Ok(limited.limit() == 0)
}

/// The next field, name and (the first [`MAX_VALUE`] bytes of) value; both
/// empty for the empty line that ends an entry; `None` at the end. Text fields
/// are `KEY=value` lines; binary ones (a message with control characters)
/// `KEY`, a 64-bit little-endian length, the data and a line feed.
fn next_field(reader: &mut impl BufRead) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut key = Vec::new();
    let mut line = reader.by_ref().take(MAX_VALUE as u64 + 64);
    if line.read_until(b'\n', &mut key)? == 0 {
        return Ok(None);
    }
    if key.pop_if(|b| *b == b'\n').is_none() {
        reader.skip_until(b'\n')?; // the rest of a line longer than kept
    }
    let eq = key.iter().position(|&b| b == b'=');
    if eq.is_some() || key.is_empty() {
        let value = key.split_off(eq.map_or(0, |eq| eq + 1));
        key.truncate(eq.unwrap_or(0));
        return Ok(Some((key, value)));
    }
    let mut length = [0u8; 8];
    reader.read_exact(&mut length)?;
    let mut data = reader.by_ref().take(u64::from_le_bytes(length));
    let mut value = Vec::new();
    data.by_ref()
        .take(MAX_VALUE as u64)
        .read_to_end(&mut value)?;
    io::copy(&mut data, &mut io::sink())?;
    if data.limit() > 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    reader.read_exact(&mut [0u8])?;
    Ok(Some((key, value)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Hands out one byte per read: fields split at every boundary.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(1);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn entries(data: &[u8]) -> Vec<Entry> {
        let mut all = Vec::new();
        assert!(!parse(data, &mut |e, _| {
            all.push(e);
            true
        })
        .unwrap());
        let mut trickled = Vec::new();
        parse(Trickle(data), &mut |e, _| {
            trickled.push(e);
            true
        })
        .unwrap();
        assert_eq!(trickled, all);
        all
    }

    #[test]
    fn export_output_parses_with_binary_fields_and_a_truncated_end() {
        let mut data =
            b"__CURSOR=c1\n__MONOTONIC_TIMESTAMP=10\nSYSLOG_FACILITY=0\nMESSAGE=one\n\n".to_vec();
        data.extend_from_slice(b"__CURSOR=c2\nMESSAGE\n");
        data.extend_from_slice(&7u64.to_le_bytes());
        data.extend_from_slice(b"a\n\nb=\x01c\n\n__CURSOR=c3\nMESSAGE=cut");
        let entries = entries(&data);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].monotonic, Some(10));
        assert_eq!(entries[0].facility.as_deref(), Some("0"));
        assert_eq!(entries[1].message, "a\n\nb=\u{1}c");
        assert_eq!(entries[1].cursor, "c2");
    }

    #[test]
    fn a_huge_value_is_skipped_past_not_kept() {
        let mut data = b"__CURSOR=c1\nMESSAGE=".to_vec();
        data.extend(std::iter::repeat_n(b'x', 3 * MAX_VALUE));
        data.extend_from_slice(b"\nSYSLOG_FACILITY=0\n\n__CURSOR=c2\nMESSAGE\n");
        data.extend_from_slice(&(5 * MAX_VALUE as u64).to_le_bytes());
        data.extend(std::iter::repeat_n(b'y', 5 * MAX_VALUE));
        data.extend_from_slice(b"\nSYSLOG_FACILITY=0\n\n");
        let entries = entries(&data);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].message.len(), MAX_VALUE + 64 - "MESSAGE=".len());
        assert_eq!(entries[1].message.len(), MAX_VALUE);
        assert_eq!(
            (entries[1].cursor.as_str(), entries[1].facility.as_deref()),
            ("c2", Some("0"))
        );
    }

    fn child(script: &str) -> Child {
        let mut command = Command::new("/bin/sh");
        command
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.spawn().unwrap()
    }

    #[test]
    fn a_stream_ends_at_the_byte_bound_the_deadline_and_the_exit_status() {
        let far = Instant::now() + Duration::from_secs(60);
        // One endless entry: never handed on, memory bounded, cut at the bound.
        let mut seen = 0;
        let ended = stream(child("yes __CURSOR=c"), far, &mut |_| seen += 1);
        assert!(matches!(ended, Err(Error::Bound)), "{ended:?}");
        assert_eq!(seen, 0);

        let started = Instant::now();
        let soon = started + Duration::from_millis(200);
        let ended = stream(
            child("printf '__CURSOR=c1\\n\\n'; exec sleep 30"),
            soon,
            &mut |e| {
                assert_eq!(e.cursor, "c1");
                seen += 1;
            },
        );
        assert!(matches!(ended, Err(Error::Deadline)), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(seen, 1);

        let ended = stream(child("echo no >&2; exit 3"), far, &mut |_| {});
        assert!(
            matches!(ended, Err(Error::Failed(s, ref said)) if s.code() == Some(3) && said == "no"),
            "{ended:?}"
        );
        assert!(matches!(stream(child("true"), far, &mut |_| {}), Ok(())));
    }
}
