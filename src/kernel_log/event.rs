//! What a read of the kernel log gives: the [`Event`]s of the driver's lines
//! and how the read ended, with the [`Position`] it reached.

use std::fmt;
use std::io;
use std::process::ExitStatus;

/// Where a read goes on from: after the journal entry of `cursor`; without
/// one (refused: the caller drops it), after the entries at or before
/// `monotonic` µs since boot; without either, at the boot's start. /dev/kmsg:
/// after the record `kmsg_seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    pub cursor: Option<String>,
    pub monotonic: Option<u64>,
    pub kmsg_seq: Option<u64>,
}

/// How a read ended: everything logged by then read, or cut by the deadline
/// or by [`super::journal::MAX_BYTES_PER_RUN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Complete,
    Deadline,
    Bound,
}

/// Why a read failed; the position names the last entry read before.
#[derive(Debug)]
pub enum Error {
    /// What could not be done (start journalctl, read /dev/kmsg), and why.
    Io(String, io::Error),
    /// journalctl exited with a failure, saying this on its stderr. A refused
    /// cursor fails as a journal it cannot open does (status 1).
    Failed(ExitStatus, String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(what, e) => write!(f, "cannot {what}: {e}"),
            Error::Failed(status, said) => write!(f, "journalctl failed ({status}): {said}"),
        }
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
        /// `fatal` or `non_fatal`.
        severity: &'static str,
    },
    /// A GPU that fell off the bus, in a line that is not an Xid:
    /// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`, at probe time
    /// `NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: …) installed in this system
    /// has fallen off the bus …`, older drivers `NVRM: GPU at 0000:01:00.0 has
    /// fallen off the bus.`
    FallenOffBus { bus: String },
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
                Some("Fatal") => "fatal",
                Some("Non-fatal") => "non_fatal",
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
    let mut parts: Vec<&str> = text
        .split_once('.')
        .map_or(text, |(id, _)| id)
        .split(':')
        .collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let hex = |part: &str, digits| {
        let fits = !part.is_empty() && part.len() <= digits;
        fits.then(|| u32::from_str_radix(part, 16).ok()).flatten()
    };
    let [domain, bus, device] = parts[..] else {
        return None;
    };
    let (domain, bus, device) = (hex(domain, 8)?, hex(bus, 2)?, hex(device, 2)?);
    Some(format!("{domain:08X}:{bus:02X}:{device:02X}"))
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

    /// The lines of NVIDIA/nvtrust#124 (driver 570.195.03), leptonai/gpud#338
    /// and Red Hat solution 6619941 (as leptonai/gpud's sxid tests quote it):
    /// an SXid is a `Data {…}` line, the line with its severity and a
    /// `Severity N Engine instance` line; only the second is the event.
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
                severity: "non_fatal"
            })
        );
        let fatal =
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up";
        assert!(matches!(
            Event::parse(fatal),
            Some(Event::SXid {
                switch: 0,
                code: 20034,
                severity: "fatal",
                ..
            })
        ));
        for repeat in [
            "Data {0x0000002b, 0x0000002b, 0x00000000, 0x0000002b, 0x80005302}",
            "Severity 0 Engine instance 44 Sub-engine instance 00",
            "Severity 1 Engine instance 30 Sub-engine instance 00",
        ] {
            assert_eq!(Event::parse(&format!("{at}{repeat}")), None, "{repeat}");
        }
    }

    /// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.` (the driver's
    /// per-device line, logged after an Xid 79 or alone: NVIDIA/NVSentinel#155,
    /// #195), NVSentinel#155's probe-time record of three lines (driver
    /// 570.158.01) and Bumblebee-Project/Bumblebee#554 (old drivers).
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
