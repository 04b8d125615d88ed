//! This boot's kernel entries from `journalctl -o json`, parsed as they
//! arrive, until journalctl ends, the deadline or [`MAX_BYTES_PER_RUN`] (then
//! it is killed). The read starts with `--cursor` and drops the cursor's entry
//! (docs/design.md, "Source").

use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use serde::{de::Error as _, Deserialize, Deserializer};

use super::event::{Error, Position, MAX_BYTES_PER_RUN};
use crate::bounded::Threads;

/// Where journalctl is, in the order tried: never looked up in `PATH`.
const JOURNALCTL: [&str; 2] = ["/usr/bin/journalctl", "/bin/journalctl"];

/// The most bytes of an entry's line: a /dev/kmsg record is 8 KiB at most,
/// four times that as JSON bytes.
const MAX_LINE: u64 = 64 << 10;

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
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
struct Entry {
    #[serde(rename = "__CURSOR")]
    cursor: String,
    #[serde(rename = "__MONOTONIC_TIMESTAMP")]
    monotonic: Option<String>,
    syslog_facility: Option<String>,
    #[serde(default, deserialize_with = "text")]
    message: String,
}

/// A field's value, also given as its bytes (not UTF-8, or control characters).
fn text<'de, D: Deserializer<'de>>(value: D) -> Result<String, D::Error> {
    let bytes = match serde_json::Value::deserialize(value)? {
        serde_json::Value::String(text) => return Ok(text),
        bytes => Vec::<u8>::deserialize(bytes).map_err(D::Error::custom)?,
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// See [`super::source::Source::read`]; `dir` replaces the system journal, `on_line`
/// gets the kernel's own messages.
pub(super) fn read(
    dir: Option<&Path>,
    at: &mut Position,
    boot_id: &str,
    until: Instant,
    on_line: &mut dyn FnMut(&str),
) -> Result<(), Error> {
    let boot_id = boot_id.replace('-', ""); // as the journal writes it
    let not_found = || io::Error::new(io::ErrorKind::NotFound, JOURNALCTL.join(" or "));
    let start = |e| Error::Io("run journalctl".into(), e);
    // Without a cursor, from the entry's time on (a cursor journalctl makes).
    let skip_through = at.monotonic.filter(|_| at.cursor.is_none());
    let by_time = skip_through.map(|m| format!("b={boot_id};m={m:x}"));
    let cursor = at.cursor.clone().or(by_time);
    // A socket: a read gives up at `until` even while another process holds it.
    let (output, theirs) = UnixStream::pair().map_err(start)?;
    let child = Command::new(journalctl().ok_or_else(not_found).map_err(start)?)
        .args(dir.iter().flat_map(|dir| [Path::new("--directory"), dir]))
        .args(cursor.map(|cursor| format!("--cursor={cursor}")))
        .args(["--no-pager", "--quiet", "--all", "--output=json"])
        .arg("--output-fields=MESSAGE,SYSLOG_FACILITY")
        .arg("_TRANSPORT=kernel")
        .arg(format!("_BOOT_ID={boot_id}"))
        .env("SYSTEMD_COLORS", "0")
        .stdin(Stdio::null())
        .stdout(OwnedFd::from(theirs))
        .stderr(Stdio::piped())
        .spawn()
        .map_err(start)?;
    stream(child, ReadBy(output, until), &mut |entry| {
        if Some(&entry.cursor) == at.cursor.as_ref() {
            return; // the entry read last, still in the journal
        }
        let monotonic = entry.monotonic.and_then(|m| m.parse().ok());
        let after = skip_through.is_none_or(|t| monotonic.is_some_and(|m| m > t));
        if after && entry.syslog_facility.is_none_or(|f| f == "0") {
            on_line(&entry.message);
        }
        at.cursor = Some(entry.cursor);
        at.monotonic = monotonic.or(at.monotonic);
    })
}

/// Hands each entry of `child`'s `output` to `on_entry` until it ends, its
/// deadline passes or the byte bound is reached (then `child` is killed).
fn stream(mut child: Child, output: ReadBy, on_entry: &mut dyn FnMut(Entry)) -> Result<(), Error> {
    let mut stderr = child.stderr.take().expect("piped");
    // The first 64 KiB of what journalctl says (read to the end: it never blocks on it).
    let said = Threads::default();
    let _ = said.spawn("journalctl", move |said| {
        let mut text = Vec::new();
        let _ = stderr.by_ref().take(1 << 16).read_to_end(&mut text);
        let _ = io::copy(&mut stderr, &mut io::sink());
        let _ = said.send(String::from_utf8_lossy(&text).trim().to_owned());
    });
    let (said, end) = (said.waiting(), output.1);
    let read = parse(output, on_entry);
    if !matches!(read, Ok(false)) {
        let _ = child.kill();
    }
    match (read, child.wait()) {
        (Err(e), _) if e.kind() == io::ErrorKind::WouldBlock => Err(Error::Deadline),
        (Ok(true), _) => Err(Error::Bound),
        (Err(e), _) | (_, Err(e)) => Err(Error::Io("read journalctl's output".into(), e)),
        (_, Ok(status)) if status.success() => Ok(()),
        (_, Ok(status)) => Err(Error::Failed(status, said.next_by(end).unwrap_or_default())),
    }
}

/// Reads from a socket until a deadline; then each read fails with `WouldBlock`.
struct ReadBy(UnixStream, Instant);

impl Read for ReadBy {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.1.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.0.set_read_timeout(Some(left))?;
        self.0.read(buf)
    }
}

/// Hands each complete entry to `on_entry`; true if the output ended at the
/// byte bound. A line not an entry is skipped.
fn parse(output: impl Read, on_entry: &mut dyn FnMut(Entry)) -> io::Result<bool> {
    let mut reader = BufReader::new(output.take(MAX_BYTES_PER_RUN));
    let mut line = Vec::new();
    while (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line)? > 0 {
        if line.pop_if(|b| *b == b'\n').is_none() {
            reader.skip_until(b'\n')?; // cut off, or longer than kept
        } else if let Ok(entry) = serde_json::from_slice(&line) {
            on_entry(entry);
        }
        line.clear();
    }
    Ok(reader.get_ref().limit() == 0)
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
        assert!(!parse(data, &mut |e| all.push(e)).unwrap());
        let mut trickled = Vec::new();
        parse(Trickle(data), &mut |e| trickled.push(e)).unwrap();
        assert_eq!(trickled, all);
        all
    }

    #[test]
    fn json_output_parses_with_binary_fields_and_a_truncated_end() {
        let data = concat!(
            r#"{"__CURSOR":"c1","__MONOTONIC_TIMESTAMP":"10","SYSLOG_FACILITY":"0","#,
            r#""MESSAGE":"one","_BOOT_ID":"b"}"#,
            "\nnot json\n\n",
            r#"{"__CURSOR":"c2","MESSAGE":[97,10,10,98,61,1,99,255]}"#,
            "\n",
            r#"{"__CURSOR":"c3","MESSAGE":"cut"#,
        );
        let entries = entries(data.as_bytes());
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].monotonic.as_deref(), Some("10"));
        assert_eq!(entries[0].syslog_facility.as_deref(), Some("0"));
        assert_eq!(entries[0].message, "one");
        assert_eq!(entries[1].message, "a\n\nb=\u{1}c\u{fffd}");
        assert_eq!(entries[1].cursor, "c2");
        assert_eq!(entries[1].syslog_facility, None);
    }

    #[test]
    fn a_huge_line_is_skipped_past_not_kept() {
        let huge = "x".repeat(2 * MAX_LINE as usize);
        let data =
            format!("{{\"__CURSOR\":\"c1\",\"MESSAGE\":\"{huge}\"}}\n{{\"__CURSOR\":\"c2\"}}\n");
        let entries = entries(data.as_bytes());
        assert_eq!(entries.len(), 1);
        assert_eq!(
            (entries[0].cursor.as_str(), entries[0].message.as_str()),
            ("c2", "")
        );
    }

    /// `script` run by sh, and its output read by `until`.
    fn child(script: &str, until: Instant) -> (Child, ReadBy) {
        let (output, theirs) = UnixStream::pair().unwrap();
        let child = Command::new("/bin/sh")
            .args(["-c", script])
            .stdout(OwnedFd::from(theirs))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (child, ReadBy(output, until))
    }

    #[test]
    fn a_stream_ends_at_the_byte_bound_the_deadline_and_the_exit_status() {
        let far = Instant::now() + Duration::from_secs(60);
        let run = |script: &str, until, on_entry: &mut dyn FnMut(Entry)| {
            let (child, output) = child(script, until);
            stream(child, output, on_entry)
        };
        // One endless entry: never handed on, memory bounded, cut at the bound.
        let mut seen = 0;
        let ended = run("yes __CURSOR=c", far, &mut |_| seen += 1);
        assert!(matches!(ended, Err(Error::Bound)), "{ended:?}");
        assert_eq!(seen, 0);

        let started = Instant::now();
        let soon = started + Duration::from_millis(200);
        let script = r#"printf '{"__CURSOR":"c1"}\n'; exec sleep 30"#;
        let ended = run(script, soon, &mut |e| {
            assert_eq!(e.cursor, "c1");
            seen += 1;
        });
        assert!(matches!(ended, Err(Error::Deadline)), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(seen, 1);
        // A process left holding the output (a wrapper that does not exec):
        // the read still ends at the deadline.
        let started = Instant::now();
        let soon = started + Duration::from_millis(200);
        let script = r#"printf '{"__CURSOR":"c1"}\n'; sleep 5 & wait"#;
        let ended = run(script, soon, &mut |_| seen += 1);
        assert!(matches!(ended, Err(Error::Deadline)), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(seen, 2);
        // Busy at the deadline: killed there, the entries read by then count.
        let (mut seen, soon) = (0, Instant::now() + Duration::from_millis(100));
        let ended = run(r#"yes '{"__CURSOR":"c"}'"#, soon, &mut |_| seen += 1);
        assert!(matches!(ended, Err(Error::Deadline)), "{ended:?}");
        assert!(seen > 0);

        let ended = run("echo no >&2; exit 3", far, &mut |_| {});
        assert!(
            matches!(ended, Err(Error::Failed(s, ref said)) if s.code() == Some(3) && said == "no"),
            "{ended:?}"
        );
        assert!(matches!(run("true", far, &mut |_| {}), Ok(())));
    }
}
