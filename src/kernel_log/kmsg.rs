//! The kernel's ring buffer, `/dev/kmsg`, where no journal exists: read
//! without blocking, one record per read, after the last sequence number read.

use std::fs::{self, File};
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Instant;

use super::event::{Error, Position};

pub(super) const KMSG: &str = "/dev/kmsg";

/// Opens the ring buffer for reads that never block.
pub(super) fn open() -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(KMSG)
}

/// See [`super::source::Source::read`]; records overwritten before they were read
/// are [`Error::Lost`] (the position moves on).
pub(super) fn read(
    mut file: &File,
    at: &mut Position,
    until: Instant,
    on_line: &mut dyn FnMut(&str),
) -> Result<(), Error> {
    // A record is at most about 8 KiB.
    let mut buffer = vec![0u8; 1 << 14];
    let mut lost = 0;
    while Instant::now() < until {
        match file.read(&mut buffer) {
            Ok(0) => return lost_or_done(lost),
            Ok(n) => lost += take(&buffer[..n], at, on_line),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return lost_or_done(lost),
            // Records were overwritten while reading (the next read says how
            // many), or a signal came.
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::Interrupted) => {}
            Err(e) => return Err(Error::Io(format!("read {KMSG}"), e)),
        }
    }
    Err(Error::Deadline)
}

fn lost_or_done(lost: u64) -> Result<(), Error> {
    match lost {
        0 => Ok(()),
        lost => Err(Error::Lost(lost)),
    }
}

/// Hands `record`'s message to `on_line` if it is the kernel's and after
/// `at`, and moves `at` past it; how many records between were lost.
fn take(record: &[u8], at: &mut Position, on_line: &mut dyn FnMut(&str)) -> u64 {
    let Some((facility, seq, message)) = parse(record) else {
        return 0; // not a record
    };
    if at.kmsg_seq.is_some_and(|last| seq <= last) {
        return 0; // read before
    }
    if facility == 0 {
        on_line(&message);
    }
    let lost = at.kmsg_seq.map_or(0, |last| seq - last - 1);
    at.kmsg_seq = Some(seq);
    lost
}

/// A record's facility, sequence number and message, unescaped (`\xHH`) as
/// the journal gives it: `<prio>,<seq>,<µs>,<flags>[,…];<message>\n`, then
/// continuation lines (` KEY=value`).
fn parse(record: &[u8]) -> Option<(u32, u64, String)> {
    let split = record.iter().position(|&b| b == b';')?;
    let header = std::str::from_utf8(&record[..split]).ok()?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    let escaped = record[split + 1..].split(|&b| b == b'\n').next()?;
    Some((prio >> 3, seq, unescape(escaped)))
}

/// `escaped` with each `\xHH` replaced by its byte.
fn unescape(escaped: &[u8]) -> String {
    let digit = |b: &u8| char::from(*b).to_digit(16).map(|d| d as u8);
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some((&byte, after)) = rest.split_first() {
        if let [b'x', high, low, tail @ ..] = after {
            if let (b'\\', Some(high), Some(low)) = (byte, digit(high), digit(low)) {
                bytes.push(high << 4 | low);
                rest = tail;
                continue;
            }
        }
        bytes.push(byte);
        rest = after;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_log::event::Event;

    #[test]
    fn records_give_facility_and_sequence() {
        let kernel =
            b"4,1021,5000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x\n SUBSYSTEM=pci\n";
        let (facility, seq, message) = parse(kernel).unwrap();
        assert_eq!((facility, seq), (0, 1021));
        assert!(matches!(
            Event::parse(&message),
            Some(Event::Xid { code: 79, .. })
        ));
        // A line written to /dev/kmsg from user space gets the user facility.
        let user = parse(b"12,1022,5001,-;NVRM: Xid (PCI:0000:3b:00): 79\n").unwrap();
        assert_eq!(user.0, 1);
        assert_eq!(parse(b"garbage"), None);
    }

    /// A record after a gap in the sequence numbers says how many were
    /// overwritten before they were read; the first read of a boot has none.
    #[test]
    fn a_gap_after_the_position_is_lost_records() {
        let mut at = Position::default();
        let mut lines = Vec::new();
        let mut on_line = |line: &str| lines.push(line.to_owned());
        assert_eq!(take(b"4,500,1,-;first\n", &mut at, &mut on_line), 0);
        assert_eq!(take(b"4,501,2,-;next\n", &mut at, &mut on_line), 0);
        assert_eq!(take(b"4,501,2,-;next\n", &mut at, &mut on_line), 0);
        assert_eq!(take(b"4,2000,3,-;after\n", &mut at, &mut on_line), 1498);
        assert_eq!(at.kmsg_seq, Some(2000));
        assert_eq!(lines, ["first", "next", "after"]);
    }

    /// The kernel's escapes are undone: the probe-time record's line feeds,
    /// a `\` and a byte above 126 read as logged; a forged line after an
    /// escaped line feed stays inside its record.
    #[test]
    fn escaped_messages_read_as_logged() {
        let probe = b"3,7,9,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) \
                      installed in this system has\\x0aNVRM: fallen off the bus and is not \
                      responding to commands.\\x0a\n";
        let (_, _, message) = parse(probe).unwrap();
        assert!(matches!(
            Event::parse(&message),
            Some(Event::FallenOffBus { .. })
        ));
        let (_, _, message) = parse(b"6,8,9,-;a\\x5cx41 \\xc3\\xa9 \\x4 \\\n").unwrap();
        assert_eq!(message, "a\\x41 \u{e9} \\x4 \\");
        let mismatch = b"4,9,9,-;NVRM: API mismatch: the client has the version 1\\x0aNVRM: \
                         GPU 0000:18:00.0: GPU has fallen off the bus., but\\x0aNVRM: this \
                         kernel module has the version 570.86.15.\n";
        let (facility, _, message) = parse(mismatch).unwrap();
        assert_eq!((facility, Event::parse(&message)), (0, None));
    }
}
