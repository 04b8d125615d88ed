//! The kernel log as typed events: the driver's lines of this boot after a
//! saved [`Position`], read from the systemd journal ([`journal`]) or, where
//! there is none, `/dev/kmsg` ([`kmsg`]).
//!
//! Only the kernel's own lines count: facility kern (0), and in the journal
//! the kernel transport. A line written from user space (`logger "NVRM: Xid
//! …"`, a write to /dev/kmsg) has another transport or facility and is never
//! an event. A read is bounded by the caller's deadline and, in the journal,
//! by [`journal::MAX_BYTES_PER_RUN`]; the position then names the last entry
//! read completely, so the next read goes on from there, skipping nothing and
//! repeating nothing. This module knows neither NVML nor the state: the caller
//! keeps the position and attributes the events.

pub mod journal;
pub mod kmsg;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Instant;

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
        if let Some(dir) = journal_dir {
            return Some(Source::Journal(Some(dir.to_path_buf())));
        }
        if journal::system_journal_exists() {
            return Some(Source::Journal(None));
        }
        let kmsg = Path::new(kmsg::KMSG);
        match kmsg::open(kmsg) {
            Ok(_) => Some(Source::Kmsg(kmsg.to_path_buf())),
            Err(e) => {
                log::debug!("cannot open {}: {e}", kmsg.display());
                None
            }
        }
    }
}

/// Where a read goes on from. A journal read starts after `cursor`; without
/// one (journalctl refused it: the caller drops it), after the entries of
/// `monotonic` µs since boot and before; without either, at the boot's start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    /// The journal cursor of the last entry read.
    pub cursor: Option<String>,
    /// That entry's `__MONOTONIC_TIMESTAMP`.
    pub monotonic: Option<u64>,
    /// The sequence number of the last /dev/kmsg record read.
    pub kmsg_seq: Option<u64>,
}

/// How a read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Everything logged by then was read.
    Complete,
    /// The deadline passed first.
    Deadline,
    /// journalctl wrote [`journal::MAX_BYTES_PER_RUN`] bytes first.
    Bound,
}

/// Why a read failed. The position names the last entry read before.
#[derive(Debug)]
pub enum Error {
    /// None of [`journal::JOURNALCTL`] is a file.
    NoJournalctl,
    /// journalctl could not be started, read or waited for.
    Journalctl(io::Error),
    /// journalctl exited with a failure (its reason is on our stderr).
    Failed(ExitStatus),
    /// /dev/kmsg could not be opened or read.
    Kmsg(PathBuf, io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoJournalctl => {
                write!(f, "no journalctl at {}", journal::JOURNALCTL.join(" or "))
            }
            Error::Journalctl(e) => write!(f, "cannot run journalctl: {e}"),
            Error::Failed(status) => write!(f, "journalctl failed ({status})"),
            Error::Kmsg(path, e) => write!(f, "cannot read {}: {e}", path.display()),
        }
    }
}

/// Reads `source` from `at` until `until`, handing each event of the kernel's
/// own lines to `on_event` and moving `at` to each entry read. `boot_id` is
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

/// A kernel line the driver logs about a GPU or NVSwitch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `NVRM: Xid (PCI:0000:3b:00): 79, pid=…` (older drivers: `Xid (0000:3b:00)`).
    Xid { bus: String, code: u32 },
    /// `nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 …`:
    /// the one line of an SXid that names its severity (its `Data {…}` and
    /// `Severity 0 Engine instance …` lines repeat the code, not the event).
    SXid {
        switch: u32,
        bus: String,
        code: u32,
        severity: Severity,
    },
    /// A GPU that fell off the bus, in a line that is not an Xid:
    /// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`, at probe time
    /// `NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: …) installed in this system
    /// has fallen off the bus …`, older drivers `NVRM: GPU at 0000:01:00.0 has
    /// fallen off the bus.`
    FallenOffBus { bus: String },
}

/// An SXid's severity, as the NVSwitch driver writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Fatal,
    NonFatal,
}

impl Severity {
    /// The label value (and state word).
    pub fn label(self) -> &'static str {
        match self {
            Severity::Fatal => "fatal",
            Severity::NonFatal => "non_fatal",
        }
    }

    pub fn from_label(label: &str) -> Option<Severity> {
        [Severity::Fatal, Severity::NonFatal]
            .into_iter()
            .find(|s| s.label() == label)
    }
}

/// Codes above these are not XIDs or SXids (NVIDIA's catalogs end well
/// below): a garbled line must not create series without bound.
const MAX_XID: u32 = 9999;
const MAX_SXID: u32 = 99_999;

impl Event {
    /// The event a kernel message is, if any.
    pub fn parse(message: &str) -> Option<Event> {
        if let Some((inside, rest)) = after(message, "NVRM: Xid (") {
            let bus = normalize_bus_id(inside.strip_prefix("PCI:").unwrap_or(inside))?;
            let code = leading_number(rest).filter(|code| *code <= MAX_XID)?;
            return Some(Event::Xid { bus, code });
        }
        if let Some((inside, rest)) = after(message, ": SXid (") {
            let name = &message[..message.find(": SXid (")?];
            let switch = name.rsplit_once("nvidia-nvswitch")?.1.parse().ok()?;
            let bus = normalize_bus_id(inside.strip_prefix("PCI:").unwrap_or(inside))?;
            let code = leading_number(rest).filter(|code| *code <= MAX_SXID)?;
            let severity = match rest.split(',').nth(1).map(str::trim) {
                Some("Fatal") => Severity::Fatal,
                Some("Non-fatal") => Severity::NonFatal,
                _ => return None,
            };
            return Some(Event::SXid {
                switch,
                bus,
                code,
                severity,
            });
        }
        if !message.contains("fallen off the bus") {
            return None;
        }
        let rest = &message[message.find("NVRM: ")?..];
        rest.match_indices("GPU ").find_map(|(at, _)| {
            let id = rest[at + 4..].trim_start_matches("at ");
            let end = id
                .find(|c: char| !(c.is_ascii_hexdigit() || c == ':' || c == '.'))
                .unwrap_or(id.len());
            let bus = normalize_bus_id(id[..end].trim_end_matches([':', '.']))?;
            Some(Event::FallenOffBus { bus })
        })
    }
}

/// The text between `opening` and the next `)`, and what follows that `):`.
fn after<'m>(message: &'m str, opening: &str) -> Option<(&'m str, &'m str)> {
    let rest = &message[message.find(opening)? + opening.len()..];
    let (inside, rest) = rest.split_once(')')?;
    Some((inside, rest.strip_prefix(':')?.trim_start()))
}

/// The decimal number `text` starts with.
fn leading_number(text: &str) -> Option<u32> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    text[..digits].parse().ok()
}

/// A PCI bus id as `DDDDDDDD:BB:DD` (domain in 8 hex digits, upper case, no
/// function), so that the driver's `0000:3b:00` and NVML's `00000000:3B:00.0`
/// compare equal. `None` if it is not a bus id.
pub fn normalize_bus_id(text: &str) -> Option<String> {
    let text = text.trim();
    let text = text.split_once('.').map_or(text, |(id, _function)| id);
    let parts: Vec<&str> = text.split(':').collect();
    let (domain, bus, device) = match parts[..] {
        [domain, bus, device] => (domain, bus, device),
        [bus, device] => ("0", bus, device),
        _ => return None,
    };
    let hex = |part: &str, digits: usize| {
        (!part.is_empty() && part.len() <= digits)
            .then(|| u32::from_str_radix(part, 16).ok())
            .flatten()
    };
    Some(format!(
        "{:08X}:{:02X}:{:02X}",
        hex(domain, 8)?,
        hex(bus, 2)?,
        hex(device, 2)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_lines_of_new_and_old_drivers_parse() {
        let new =
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
        let xid = |bus: &str, code| {
            Some(Event::Xid {
                bus: bus.into(),
                code,
            })
        };
        assert_eq!(Event::parse(new), xid("00000000:3B:00", 79));
        let old = "NVRM: Xid (0000:01:00): 13, Graphics Exception: ESR 0x405840=0x0";
        assert_eq!(Event::parse(old), xid("00000000:01:00", 13));
        for not_xid in [
            "NVRM: GPU at PCI:0000:3b:00: GPU-1234",
            "NVRM: Xid (PCI:zz:3b:00): 79, x",
            "NVRM: Xid (PCI:0000:3b:00): , x",
            "NVRM: Xid (PCI:0000:3b:00): 123456, x",
            "Xid (PCI:0000:3b:00): 79",
        ] {
            assert_eq!(Event::parse(not_xid), None, "{not_xid}");
        }
    }

    /// The lines of NVIDIA/nvtrust#124 (driver 570.195.03) and leptonai/gpud#338:
    /// an SXid is a `Data {…}` line, the line with its severity and a
    /// `Severity 0 Engine instance` line; only the second is the event.
    #[test]
    fn an_sxid_is_its_severity_line() {
        let at = "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, ";
        let sxid = Event::parse(&format!(
            "{at}Non-fatal, Link 44 Minion Link DLREQ interrupt"
        ));
        assert_eq!(
            sxid,
            Some(Event::SXid {
                switch: 3,
                bus: "00000000:04:00".into(),
                code: 22013,
                severity: Severity::NonFatal
            })
        );
        let fatal =
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up";
        assert!(matches!(
            Event::parse(fatal),
            Some(Event::SXid {
                switch: 0,
                code: 20034,
                severity: Severity::Fatal,
                ..
            })
        ));
        for repeat in [
            "Data {0x0000002b, 0x0000002b, 0x00000000, 0x0000002b, 0x80005302}",
            "Severity 0 Engine instance 44 Sub-engine instance 00",
        ] {
            assert_eq!(Event::parse(&format!("{at}{repeat}")), None, "{repeat}");
        }
    }

    /// The formats of the brief, NVIDIA/NVSentinel#155 (driver 570.158.01, one
    /// record of three lines) and Bumblebee-Project/Bumblebee#554 (old drivers).
    #[test]
    fn fallen_off_the_bus_lines_name_their_gpu() {
        let fallen = |bus: &str| Some(Event::FallenOffBus { bus: bus.into() });
        assert_eq!(
            Event::parse("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."),
            fallen("00000000:3B:00")
        );
        let probe = "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in \
                     this system has\nNVRM: fallen off the bus and is not responding to commands.";
        assert_eq!(Event::parse(probe), fallen("00000000:B3:00"));
        // /dev/kmsg escapes the record's line feeds.
        assert_eq!(
            Event::parse(&probe.replace('\n', "\\x0a")),
            fallen("00000000:B3:00")
        );
        assert_eq!(
            Event::parse("NVRM: GPU at 0000:01:00.0 has fallen off the bus."),
            fallen("00000000:01:00")
        );
        assert_eq!(Event::parse("NVRM: GPU has fallen off the bus."), None);
    }

    #[test]
    fn bus_ids_of_nvml_and_the_driver_compare_equal() {
        assert_eq!(
            normalize_bus_id("00000000:3B:00.0"),
            normalize_bus_id("0000:3b:00")
        );
        assert_eq!(normalize_bus_id("0001:c1:1f").unwrap(), "00000001:C1:1F");
        assert_eq!(normalize_bus_id("3b:00").unwrap(), "00000000:3B:00");
        assert_eq!(normalize_bus_id(""), None);
        assert_eq!(normalize_bus_id("000000000:3b:00"), None);
    }
}
