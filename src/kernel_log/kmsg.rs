//! The kernel's ring buffer, `/dev/kmsg`, where no journal exists: read
//! without blocking, one record per read, after the last sequence number read.

use std::fs::{self, File};
use std::io::{self, Read};
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

/// See [`super::Source::read`]; `file` is [`open`]'s, `on_line` gets the kernel's own messages.
pub(super) fn read(
    mut file: &File,
    at: &mut Position,
    until: Instant,
    on_line: &mut dyn FnMut(&str),
) -> Result<(), Error> {
    // A record is at most about 8 KiB.
    let mut buffer = vec![0u8; 1 << 14];
    while Instant::now() < until {
        let n = match file.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            // Records were overwritten while reading: go on with the next.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::Io(format!("read {KMSG}"), e)),
        };
        match parse(&buffer[..n]) {
            Some((facility, seq, message)) if at.kmsg_seq.is_none_or(|last| seq > last) => {
                if facility == 0 {
                    on_line(&message);
                }
                at.kmsg_seq = Some(seq);
            }
            _ => {} // not a record, or one read before
        }
    }
    Err(Error::Deadline)
}

/// A record's facility, sequence number and message: `<prio>,<seq>,<µs>,
/// <flags>[,…];<message>\n`, then continuation lines (` KEY=value`). Line
/// feeds within the message are escaped (`\x0a`).
fn parse(record: &[u8]) -> Option<(u32, u64, String)> {
    let text = String::from_utf8_lossy(record);
    let (header, rest) = text.split_once(';')?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    let message = rest.split('\n').next().unwrap_or_default();
    Some((prio >> 3, seq, message.into()))
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
}
