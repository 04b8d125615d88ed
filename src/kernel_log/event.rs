//! What a read of the kernel log gives: the [`Event`]s of the driver's lines,
//! the [`Position`] reached, or why it stopped short ([`Error`]).

use std::fmt;
use std::io;
use std::process::ExitStatus;

use serde::{Deserialize, Serialize};

/// The most bytes of journalctl's output one run reads: about 160,000 kernel
/// lines. A larger backlog is worked off over several runs.
pub const MAX_BYTES_PER_RUN: u64 = 64 << 20;

/// Where a read goes on from: after the journal entry of `cursor`; without
/// one, after the entries at or before `monotonic` µs since boot; without
/// either, at the boot's start. /dev/kmsg: after the record `kmsg_seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Position {
    pub cursor: Option<String>,
    pub monotonic: Option<u64>,
    pub kmsg_seq: Option<u64>,
}

/// Why a read did not reach the end of the log; the position names the last
/// entry read before.
#[derive(Debug)]
pub enum Error {
    /// Neither journal files (with journalctl) nor a readable /dev/kmsg.
    NoSource,
    /// Cut by the deadline or by [`MAX_BYTES_PER_RUN`].
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
        let bytes = MAX_BYTES_PER_RUN;
        match self {
            Error::NoSource => {
                f.write_str("no kernel log (no journal files, /dev/kmsg not readable)")
            }
            Error::Io(what, e) => write!(f, "cannot {what}: {e}"),
            Error::Failed(status, said) => write!(f, "journalctl failed ({status}): {said}"),
            Error::Deadline => {
                f.write_str("reading the kernel log did not finish by the run's deadline")
            }
            Error::Bound => write!(f, "journalctl wrote more than {bytes} bytes in this run"),
        }
    }
}

impl std::error::Error for Error {}

/// A kernel line the driver logs about a GPU or NVSwitch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `NVRM: Xid (PCI:0000:3b:00): 79, pid=…` (older drivers: `Xid (0000:3b:00)`).
    Xid { bus: BusId, code: u32 },
    /// `nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 …`:
    /// the one line of an SXid that names its severity.
    SXid {
        switch: u32,
        bus: BusId,
        code: u32,
        /// `fatal` or `non_fatal`.
        severity: &'static str,
    },
    /// A GPU that fell off the bus, in a line that is not an Xid:
    /// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.` (and the
    /// probe-time and older drivers' wordings, see the tests).
    FallenOffBus { bus: BusId },
}

/// Codes above these are not XIDs or SXids (NVIDIA's catalogs end well
/// below): a garbled line must not create series without bound.
const MAX_XID: u32 = 9999;
const MAX_SXID: u32 = 99_999;

impl Event {
    /// The event a kernel message is, if any. Only a message that starts as
    /// the driver's do (`NVRM: `, `nvidia-nvswitchN: `) is one, not text a
    /// user got the kernel to echo (an unknown mount option, say).
    pub fn parse(message: &str) -> Option<Event> {
        if let Some((inside, rest)) = message.strip_prefix("NVRM: Xid (").and_then(parens) {
            let bus = BusId::parse(inside.strip_prefix("PCI:").unwrap_or(inside))?;
            let code = leading_number(rest).filter(|code| *code <= MAX_XID)?;
            return Some(Event::Xid { bus, code });
        }
        if let Some((name, rest)) = message.split_once(": SXid (") {
            let switch = name.strip_prefix("nvidia-nvswitch")?.parse().ok()?;
            let (inside, rest) = parens(rest)?;
            let bus = BusId::parse(inside.strip_prefix("PCI:").unwrap_or(inside))?;
            let code = leading_number(rest).filter(|code| *code <= MAX_SXID)?;
            return Some(Event::SXid {
                switch,
                bus,
                code,
                severity: match rest.split(',').nth(1).map(str::trim) {
                    Some("Fatal") => "fatal",
                    Some("Non-fatal") => "non_fatal",
                    _ => return None,
                },
            });
        }
        let driver = message.strip_prefix("NVRM: ")?;
        driver.contains("fallen off the bus").then_some(())?;
        // The first `GPU ` (or `GPU at `) of the driver's text followed by a bus id.
        let not_id = |c: char| !(c.is_ascii_hexdigit() || c == ':' || c == '.');
        driver.split("GPU ").skip(1).find_map(|text| {
            let id = text.trim_start_matches("at ").split(not_id).next()?;
            let bus = BusId::parse(id.trim_end_matches([':', '.']))?;
            Some(Event::FallenOffBus { bus })
        })
    }
}

/// The text up to the next `)`, and what follows that `):`.
fn parens(text: &str) -> Option<(&str, &str)> {
    let (inside, rest) = text.split_once(')')?;
    Some((inside, rest.strip_prefix(':')?.trim_start()))
}

/// The decimal number `text` starts with.
fn leading_number(text: &str) -> Option<u32> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    text[..digits].parse().ok()
}

/// A PCI bus id as `DDDDDDDD:BB:DD` (domain in 8 hex digits, upper case, no
/// function), so that the driver's `0000:3b:00` and NVML's `00000000:3B:00.0`
/// compare equal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BusId(String);

impl BusId {
    /// `None` if `text` is not a bus id (`[domain:]bus:device[.function]`).
    pub fn parse(text: &str) -> Option<BusId> {
        let hex = |part: Option<&str>, digits: usize| {
            let part = part.filter(|part| !part.is_empty() && part.len() <= digits)?;
            u32::from_str_radix(part, 16).ok()
        };
        let mut parts = text.trim().split('.').next()?.rsplit(':');
        let (device, bus) = (hex(parts.next(), 2)?, hex(parts.next(), 2)?);
        let domain = hex(Some(parts.next().unwrap_or("0")), 8)?;
        let id = format!("{domain:08X}:{bus:02X}:{device:02X}");
        parts.next().is_none().then_some(BusId(id))
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(id: &str) -> BusId {
        BusId(id.into())
    }

    #[test]
    fn xid_lines_of_new_and_old_drivers_parse() {
        let new =
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
        let xid = |id: &str, code| Some(Event::Xid { bus: bus(id), code });
        assert_eq!(Event::parse(new), xid("00000000:3B:00", 79));
        let old = "NVRM: Xid (0000:01:00): 13, Graphics Exception: ESR 0x405840=0x0";
        assert_eq!(Event::parse(old), xid("00000000:01:00", 13));
        for not_xid in [
            "tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:18:00): 79'",
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
                bus: bus("00000000:04:00"),
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
        let echoed = format!("tmpfs: Unknown parameter '{fatal}'");
        assert_eq!(Event::parse(&echoed), None);
    }

    /// `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.` (the driver's
    /// per-device line, logged after an Xid 79 or alone: NVIDIA/NVSentinel#155,
    /// #195), NVSentinel#155's probe-time record of three lines (driver
    /// 570.158.01) and Bumblebee-Project/Bumblebee#554 (old drivers).
    #[test]
    fn fallen_off_the_bus_lines_name_their_gpu() {
        let fallen = |id: &str| Some(Event::FallenOffBus { bus: bus(id) });
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
        let echoed =
            "tmpfs: Unknown parameter 'NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.'";
        assert_eq!(Event::parse(echoed), None);
    }

    #[test]
    fn bus_ids_of_nvml_and_the_driver_compare_equal() {
        let parse = BusId::parse;
        assert_eq!(parse("00000000:3B:00.0"), parse("0000:3b:00"));
        assert_eq!(parse("0001:c1:1f"), Some(bus("00000001:C1:1F")));
        assert_eq!(parse(" 3b:00.1 "), Some(bus("00000000:3B:00")));
        for not_bus in [
            "",
            "3b",
            "000000000:3b:00",
            "0:0:3b:00",
            "0000:3b:",
            "0000:3b:100",
        ] {
            assert_eq!(parse(not_bus), None, "{not_bus}");
        }
    }
}
