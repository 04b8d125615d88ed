//! What a read of the kernel log gives: the [`Event`]s of the driver's lines,
//! the [`Position`] reached, or why it stopped short ([`Error`]).

use std::io;
use std::process::ExitStatus;

use serde::Serialize;

/// The most bytes of journalctl's output one run reads (about 160,000 lines).
pub const MAX_BYTES_PER_RUN: u64 = 64 << 20;

/// Where a read goes on from: after the journal entry of `cursor`; without
/// one, after the entries at or before `monotonic` µs since boot; without
/// either, at the boot's start. /dev/kmsg: after the record `kmsg_seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Position {
    pub cursor: Option<String>,
    pub monotonic: Option<u64>,
    pub kmsg_seq: Option<u64>,
}

/// Why a read did not reach the end of the log; the position names the last
/// entry read before.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no kernel log (no journal files, /dev/kmsg not readable)")]
    NoSource,
    #[error("reading the kernel log did not finish by the run's deadline")]
    Deadline,
    #[error("journalctl wrote more than {MAX_BYTES_PER_RUN} bytes in this run")]
    Bound,
    #[error(
        "{0} kernel log record(s) were overwritten in /dev/kmsg before this run could \
         read them: XIDs among them are not counted (a journal keeps them: install \
         systemd-journald, or run the timer more often)"
    )]
    Lost(u64),
    /// What could not be done (run journalctl, read /dev/kmsg), and why.
    #[error("cannot {0}: {1}")]
    Io(String, io::Error),
    #[error("journalctl failed ({0}): {1}")]
    Failed(ExitStatus, String),
}

/// A kernel line the driver logs about a GPU or NVSwitch (docs/design.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `NVRM: Xid (PCI:0000:3b:00): 79, pid=…` (with ` GPU-I:01` and
    /// ` GPU-CI:00` after the id for a MIG instance).
    Xid { bus: BusId, code: u32 },
    /// `nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 …`:
    /// the one line of an SXid that names its severity.
    SXid {
        switch: u32,
        bus: BusId,
        code: u32,
        /// `fatal`, `non_fatal` or `correctable`.
        severity: &'static str,
    },
    /// A GPU that fell off the bus, in a line that is not an Xid.
    FallenOffBus { bus: BusId },
}

/// Codes above are garbled (NVIDIA's catalogs end well below).
const MAX_XID: u32 = 9999;
const MAX_SXID: u32 = 99_999;

impl Event {
    /// The event a kernel record is, if it is a driver line in its exact
    /// shape from its first byte (so no quoted or echoed text counts).
    pub fn parse(record: &str) -> Option<Event> {
        let record = record.strip_suffix('\n').unwrap_or(record);
        xid(record)
            .or_else(|| sxid(record))
            .or_else(|| fallen_off_bus(record))
    }
}

/// `NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, …`
/// (krcReportXid); what follows the code (pid, a process name) is not read.
fn xid(record: &str) -> Option<Event> {
    let (bus, rest) = pci(record.strip_prefix("NVRM: Xid (PCI:")?, false)?;
    let rest =
        instance(rest, " GPU-I:").map_or(rest, |rest| instance(rest, " GPU-CI:").unwrap_or(rest));
    let (code, rest) = decimal(rest.strip_prefix("): ")?, 1)?;
    (rest.starts_with(", ") && code <= MAX_XID).then_some(Event::Xid { bus, code })
}

/// The text after `label` and its `%02u` instance id.
fn instance<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    Some(decimal(text.strip_prefix(label)?, 2)?.1)
}

/// `nvidia-nvswitch%d: SXid (PCI:%04x:%02x:%02x.%x): %05d, Fatal|Non-fatal|Correctable, …`
/// (NVSWITCH_PRINT_SXID).
fn sxid(record: &str) -> Option<Event> {
    let (switch, rest) = decimal(record.strip_prefix("nvidia-nvswitch")?, 1)?;
    let (bus, rest) = pci(rest.strip_prefix(": SXid (PCI:")?, true)?;
    let (code, rest) = decimal(rest.strip_prefix("): ")?, 5)?;
    let severity = [
        (", Fatal, ", "fatal"),
        (", Non-fatal, ", "non_fatal"),
        (", Correctable, ", "correctable"),
    ]
    .into_iter()
    .find_map(|(printed, label)| rest.starts_with(printed).then_some(label))?;
    (code <= MAX_SXID).then_some(Event::SXid {
        switch,
        bus,
        code,
        severity,
    })
}

/// The whole record `NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen off the bus.`
/// (osHandleGpuLost), or the probe-time record of rm_is_supported_device.
fn fallen_off_bus(record: &str) -> Option<Event> {
    const PROBE_END: &str = ") installed in this system has\nNVRM: fallen off the bus and is \
                             not responding to commands.";
    let (bus, end) = if let Some(rest) = record.strip_prefix("NVRM: GPU ") {
        let (bus, rest) = pci(rest, true)?;
        (bus, rest == ": GPU has fallen off the bus.")
    } else {
        let (bus, rest) = pci(record.strip_prefix("NVRM: The NVIDIA GPU ")?, true)?;
        let rest = rest.strip_prefix("\nNVRM: (PCI ID: ")?;
        let (_, rest) = hex(rest, 4, 4)?;
        let (_, rest) = hex(rest.strip_prefix(':')?, 4, 4)?;
        (bus, rest == PROBE_END)
    };
    end.then_some(Event::FallenOffBus { bus })
}

/// A PCI id as the driver prints it, `%04x:%02x:%02x` and with `function`
/// `.%x`; and the text after it.
fn pci(text: &str, function: bool) -> Option<(BusId, &str)> {
    let (domain, rest) = hex(text, 4, 8)?;
    let (bus, rest) = hex(rest.strip_prefix(':')?, 2, 2)?;
    let (device, mut rest) = hex(rest.strip_prefix(':')?, 2, 2)?;
    if function {
        rest = hex(rest.strip_prefix('.')?, 1, 1)?.1;
    }
    Some((BusId::new(domain, bus, device), rest))
}

/// The `%x` number `text` starts with, of `min..=max` lower-case digits.
fn hex(text: &str, min: usize, max: usize) -> Option<(u32, &str)> {
    let digits = text
        .bytes()
        .take_while(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        .count();
    let number = u32::from_str_radix(&text[..digits], 16).ok()?;
    (min..=max)
        .contains(&digits)
        .then_some((number, &text[digits..]))
}

/// The `%d` number `text` starts with, of at least `min` digits.
fn decimal(text: &str, min: usize) -> Option<(u32, &str)> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    (digits >= min).then_some(())?;
    Some((text[..digits].parse().ok()?, &text[digits..]))
}

/// A PCI bus id as `DDDDDDDD:BB:DD` (upper case, no function): the driver's
/// `0000:3b:00` equals NVML's `00000000:3B:00.0`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BusId(String);

impl BusId {
    fn new(domain: u32, bus: u32, device: u32) -> BusId {
        BusId(format!("{domain:08X}:{bus:02X}:{device:02X}"))
    }

    /// NVML's bus id (`[domain:]bus:device[.function]`); `None` if it is not one.
    pub fn parse(text: &str) -> Option<BusId> {
        let hex = |part: Option<&str>, digits: usize| {
            let part = part.filter(|part| !part.is_empty() && part.len() <= digits)?;
            u32::from_str_radix(part, 16).ok()
        };
        let mut parts = text.trim().split('.').next()?.rsplit(':');
        let (device, bus) = (hex(parts.next(), 2)?, hex(parts.next(), 2)?);
        let domain = hex(Some(parts.next().unwrap_or("0")), 8)?;
        let whole = parts.next().is_none();
        whole.then(|| BusId::new(domain, bus, device))
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

    /// krcReportXid's shapes: with and without pid and name (R570 on), of
    /// a MIG instance (` GPU-I:` and ` GPU-CI:` after the id).
    #[test]
    fn xid_lines_parse_in_the_drivers_shapes() {
        let xid = |id: &str, code| Some(Event::Xid { bus: bus(id), code });
        let line =
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
        assert_eq!(Event::parse(line), xid("00000000:3B:00", 79));
        let no_pid = "NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception: ESR 0x405840=0x0";
        assert_eq!(Event::parse(no_pid), xid("00000000:01:00", 13));
        let mig = "NVRM: Xid (PCI:0000:c1:00 GPU-I:02 GPU-CI:00): 43, pid=7, name=x, Ch 8";
        assert_eq!(Event::parse(mig), xid("00000000:C1:00", 43));
        let instance = "NVRM: Xid (PCI:0000:c1:00 GPU-I:13): 31, pid=7, name=x, fault";
        assert_eq!(Event::parse(instance), xid("00000000:C1:00", 31));
        for not_xid in [
            "tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:18:00): 79'",
            "NVRM: GPU at PCI:0000:3b:00: GPU-1234",
            "NVRM: Xid (PCI:zz:3b:00): 79, x",
            "NVRM: Xid (PCI:0000:3B:00): 79, x",
            "NVRM: Xid (PCI:0000:3b:00.0): 79, x",
            "NVRM: Xid (PCI:0000:3b:00): , x",
            "NVRM: Xid (PCI:0000:3b:00): 79",
            "NVRM: Xid (PCI:0000:3b:00): 123456, x",
            "NVRM: Xid (0000:3b:00): 79, x",
            "Xid (PCI:0000:3b:00): 79, x",
            " NVRM: Xid (PCI:0000:3b:00): 79, x",
        ] {
            assert_eq!(Event::parse(not_xid), None, "{not_xid}");
        }
    }

    /// Kernel records whose first bytes a user chooses (a process name of at
    /// most 15 bytes, a file name) or that carry a client's text after the
    /// driver's prefix (the API mismatch's version string, up to 63 bytes
    /// with line feeds; a process name in an Xid) count nothing of what
    /// they quote.
    #[test]
    fn text_a_user_chooses_counts_nothing() {
        let forged = [
            // show_signal_msg: comm, pid, then the faulting file's name.
            "NVRM: x[18231]: segfault at 0 ip 00005577b91e817a sp 00007ffc3836a380 error 6 in \
             GPU 0000:18:00.0 has fallen off the bus[117a,5577b91e8000+1000] likely on CPU 1 \
             (core 1, socket 0)",
            "NVRM: Xid (PCI:[18232]: segfault at 0 ip 0000 sp 0000 error 6 in \
             0000:18:00): 79, x[117a,5577b91e8000+1000]",
            "NVRM: GPU 0000:[9]: segfault at 0 in 18:00.0: GPU has fallen off the bus.[1,2+3]",
            // RmPerformVersionCheck before R575: the client's version string.
            "NVRM: API mismatch: the client has the version 1\nNVRM: GPU 0000:18:00.0: GPU has \
             fallen off the bus., but\nNVRM: this kernel module has the version 570.86.15.  \
             Please\nNVRM: make sure that this kernel module and all NVIDIA driver\nNVRM: \
             components have the same version.",
            "NVRM: API mismatch: the client has the version 1\nNVRM: Xid (PCI:0000:18:00): 79, x, \
             but\nNVRM: this kernel module has the version 570.86.15.  Please",
            // R575 on: the client's process name first.
            "NVRM: API mismatch: the client 'NVRM: Xid (PCI:' (pid 77)\nNVRM: has the version \
             580.95.05, but this kernel module has\nNVRM: the version 580.65.06.  Please make \
             sure that this\nNVRM: kernel module and all NVIDIA driver components\nNVRM: have \
             the same version.",
            // nv_kthread_q's warning and the late unmap name the process.
            "nv_kthread_q: task: NVRM: GPU 0000: bad",
            "NVRM: VM: nvidia_vma_release: late unmap, comm: NVRM: Xid (PCI:, 0x0000",
        ];
        for record in forged {
            assert_eq!(Event::parse(record), None, "{record}");
        }
        // A process name in a real Xid line does not add a second event.
        let named = "NVRM: Xid (PCI:0000:3b:00): 13, pid=9, name=a\nNVRM: GPU 0000:18:00.0: GPU \
                     has fallen off the bus., Graphics Exception";
        assert_eq!(
            Event::parse(named),
            Some(Event::Xid {
                bus: bus("00000000:3B:00"),
                code: 13
            })
        );
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
        let correctable = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 12028, Correctable, Link 02";
        assert!(matches!(
            Event::parse(correctable),
            Some(Event::SXid {
                severity: "correctable",
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
        for not_sxid in [
            format!("tmpfs: Unknown parameter '{fatal}'"),
            "nvidia-nvswitch0: SXid (PCI:0000:05:00): 20034, Fatal, Link 30".into(),
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 2003, Fatal, Link 30".into(),
            "nvidia-nvswitchx: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30".into(),
        ] {
            assert_eq!(Event::parse(&not_sxid), None, "{not_sxid}");
        }
    }

    /// osHandleGpuLost's line (logged after an Xid 79 or alone:
    /// NVIDIA/NVSentinel#155, #195) and rm_is_supported_device's probe-time
    /// record of three lines (NVSentinel#155, driver 570.158.01).
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
        assert_eq!(
            Event::parse(&format!("{probe}\n")),
            fallen("00000000:B3:00")
        );
        for not_fallen in [
            "NVRM: GPU has fallen off the bus.",
            "NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
            "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus. x",
            "NVRM: GPU 0000:3b:00: GPU has fallen off the bus.",
            "tmpfs: Unknown parameter 'NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.'",
            &probe.replace("10de", "10DE"),
            &probe.replace('\n', " "),
        ] {
            assert_eq!(Event::parse(not_fallen), None, "{not_fallen}");
        }
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
