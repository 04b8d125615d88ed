//! Journal files for the xid collector's tests: entries in journal export
//! format, written into real journal files by systemd-journal-remote (package
//! systemd-journal-remote) the way journald writes them, so that the
//! exporter's journalctl reads them as it reads the host's.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::{Exporter, Outcome, Samples};

/// systemd-journal-remote, which turns journal export text into journal files.
pub const JOURNAL_REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// An Xid 79 of GPU 0 of the scenario h100x8 (bus 00000000:18:00.0) as the
/// driver logs it.
pub const XID79: &str =
    "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";

/// This boot's id as the journal writes it (no dashes): entries of another
/// boot are not this boot's XIDs.
pub fn boot_id() -> &'static str {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    BOOT_ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .expect("this boot's id")
            .trim()
            .replace('-', "")
    })
}

/// One entry of this boot in export format at the monotonic time `monotonic`
/// (µs; the realtime follows from it). Kernel lines have the kernel transport
/// and facility 0; `logger` gives transport syslog, facility 1 (user).
pub fn journal_entry(monotonic: u64, transport: &str, message: &str) -> String {
    let facility = if transport == "kernel" { 0 } else { 1 };
    format!(
        "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={monotonic}\n_BOOT_ID={}\n\
         _TRANSPORT={transport}\nSYSLOG_FACILITY={facility}\nPRIORITY=4\n_HOSTNAME=gpu1\n\
         MESSAGE={message}\n\n",
        1_700_000_000_000_000 + monotonic,
        boot_id()
    )
}

/// [`journal_entry`] for a message of several lines (the driver's probe-time
/// "fallen off the bus" record), which export format writes as a binary field:
/// `MESSAGE`, its 64-bit little-endian length, the bytes and a line feed.
pub fn journal_entry_binary(monotonic: u64, message: &str) -> Vec<u8> {
    let text = journal_entry(monotonic, "kernel", "");
    let mut entry = text
        .strip_suffix("MESSAGE=\n\n")
        .expect("MESSAGE last")
        .as_bytes()
        .to_vec();
    entry.extend_from_slice(b"MESSAGE\n");
    entry.extend_from_slice(&(message.len() as u64).to_le_bytes());
    entry.extend_from_slice(message.as_bytes());
    entry.extend_from_slice(b"\n\n");
    entry
}

/// Writes `export` (entries from [`journal_entry`]) as the journal file
/// `dir/name`.
///
/// # Panics
/// When systemd-journal-remote is missing or refuses the text.
pub fn write_journal(dir: &Path, name: &str, export: &str) {
    write_journal_bytes(dir, name, export.as_bytes());
}

/// [`write_journal`] for export text with binary fields
/// ([`journal_entry_binary`]).
pub fn write_journal_bytes(dir: &Path, name: &str, export: &[u8]) {
    let mut child = Command::new(JOURNAL_REMOTE)
        .arg(format!("--output={}", dir.join(name).display()))
        .arg("-")
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("systemd-journal-remote (apt-get install systemd-journal-remote)");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(export)
        .expect("systemd-journal-remote reads the export");
    assert!(
        child.wait().expect("systemd-journal-remote ends").success(),
        "systemd-journal-remote refused the export"
    );
}

impl Exporter {
    /// A `--stdout` run of `scenario` (a name or a path) with the state in
    /// `state` (read and stored) and the journal files in `journal`.
    pub fn journal_run(&self, scenario: &str, state: &Path, journal: &Path) -> Outcome {
        self.run(scenario)
            .stdout()
            .state_dir(state)
            .journal_dir(journal)
            .arg("--write-state")
            .finish()
            .expect("run the exporter")
    }

    /// The XID series of one successful [`Exporter::journal_run`] of h100x8,
    /// with their values.
    pub fn xid_run(&self, state: &Path, journal: &Path) -> Samples {
        let output = self.journal_run("h100x8", state, journal);
        assert!(output.success(), "{}", output.err());
        let mut samples = output.samples();
        samples.retain(|s, _| s.name.starts_with("nvidia_gpu_xid_"));
        samples
    }
}
