//! XID errors, counted exactly from the kernel log between runs.
//!
//! The NVIDIA driver logs every XID error to the kernel log, e.g.
//! `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off
//! the bus.` (older drivers: no pid). A run reads the kernel lines logged since
//! the previous run, counts the XIDs by GPU (the PCI bus id in the message
//! against the bus ids NVML reported) and code, and adds them to running totals
//! kept in the state (host entries under `xid.`). The state is per boot, so the
//! totals start at 0 each boot and never go backwards within one.
//!
//! This module touches neither NVML nor the textfile directory: it reads the
//! kernel log and returns plain data (samples for the snapshot, entries for the
//! state).
//!
//! Sources, in order:
//! 1. the systemd journal's kernel transport (`_TRANSPORT=kernel`, facility
//!    kern): `journalctl -o export` from a cursor kept in the state, or from the
//!    start of this boot (`_BOOT_ID`) on the first run. A line written by a user
//!    (`logger "NVRM: Xid …"`, a write to /dev/kmsg) is never counted: it has
//!    another transport or facility. The child runs under the run's deadline and
//!    is killed at it; the entries read until then count and the cursor moves to
//!    the last of them, so a long backlog is worked off over several runs.
//! 2. `/dev/kmsg` where no journal exists (no journalctl, or no journal files),
//!    read without blocking; records of the kern facility only, after the last
//!    sequence number kept in the state.
//! 3. Neither: the XID families are left out, with one message per boot.
//!
//! No double counting: the cursor names the last entry counted; journald keeps
//! it meaningful across rotation (an archived file is still read) and vacuuming
//! (the cursor's boot id and monotonic time still position the read). Should
//! journalctl refuse the cursor (a damaged state, say), the read restarts from
//! the monotonic time of that entry within this boot, and entries at or before
//! it are skipped. If that fails too, nothing is counted in this run and the
//! state is left as it was.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Instant;

use super::HostRun;
use crate::metrics;
use crate::snapshot::{Sample, Snapshot};
use crate::state::boot_id;

/// Where the kernel log is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The systemd journal: the system's, or the journal files in a directory
    /// (`--journal-dir`).
    Journal(Option<PathBuf>),
    /// The kernel's log buffer, `/dev/kmsg`.
    Kmsg(PathBuf),
}

impl Source {
    fn label(&self) -> &'static str {
        match self {
            Source::Journal(_) => "journal",
            Source::Kmsg(_) => "kmsg",
        }
    }
}

/// The directories journald writes to.
const SYSTEM_JOURNALS: [&str; 2] = ["/var/log/journal", "/run/log/journal"];

/// The xid collector (a host-level row of the registry): counts the XID errors
/// logged since the previous run into the running totals kept in the state
/// and adds them to the snapshot. It runs only after NVML was read, whose GPUs'
/// bus ids attribute the XIDs, so a run without them leaves the kernel log for
/// the next; while no kernel log can be read, the position and totals stay as
/// they are, so nothing is counted twice when it is back.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), String> {
    let mut counts = Counts::from_state(run.memory.host());
    let Some(source) = choose(run.journal_dir) else {
        if !counts.unavailable {
            log::warn!(
                "no kernel log to count XID errors from (no journal files, /dev/kmsg not \
                 readable); the XID families are left out"
            );
        }
        counts.unavailable = true;
        run.memory.replace_host(STATE_PREFIX, counts.to_state());
        return Err("no kernel log to count XID errors from".to_owned());
    };
    let gpus = gpus_of(run.snapshot);
    match read(&source, &mut counts, &gpus, &boot_id(), run.until) {
        Ok(()) => {
            add_samples(&counts, run.snapshot);
            run.memory.replace_host(STATE_PREFIX, counts.to_state());
            Ok(())
        }
        Err(error) => Err(format!(
            "cannot count XID errors: {error}; the XID families are left out"
        )),
    }
}

/// The source to use: `journal_dir` if given; else the system journal if
/// `journalctl` and journal files exist; else `/dev/kmsg` if it can be opened;
/// else none.
pub fn choose(journal_dir: Option<&Path>) -> Option<Source> {
    if let Some(dir) = journal_dir {
        return Some(Source::Journal(Some(dir.to_path_buf())));
    }
    let journalctl = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("journalctl").is_file())
    });
    if journalctl
        && SYSTEM_JOURNALS
            .iter()
            .any(|dir| has_journal_files(Path::new(dir)))
    {
        return Some(Source::Journal(None));
    }
    let kmsg = Path::new("/dev/kmsg");
    match open_kmsg(kmsg) {
        Ok(_) => Some(Source::Kmsg(kmsg.to_path_buf())),
        Err(e) => {
            log::debug!("cannot open {}: {e}", kmsg.display());
            None
        }
    }
}

/// Whether `dir` or a directory in it (journald's `<machine-id>/`) holds a
/// `*.journal` file.
fn has_journal_files(dir: &Path) -> bool {
    let journal = |path: &Path| {
        path.extension()
            .is_some_and(|e| e == "journal" || e == "journal~")
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        journal(&path)
            || (path.is_dir()
                && fs::read_dir(&path)
                    .map(|inner| inner.flatten().any(|e| journal(&e.path())))
                    .unwrap_or(false))
    })
}

/// One XID error: the GPU's normalised PCI bus id and the XID code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// `00000000:3B:00` (see [`normalize_bus_id`]).
    pub bus: String,
    pub code: u32,
}

/// Codes above this are not XIDs (NVIDIA's catalog ends well below it): a
/// garbled line must not create series without bound.
const MAX_CODE: u32 = 9999;

/// The XID in a kernel log message, if it is one:
/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=…` or `NVRM: Xid (0000:3b:00): 13, …`.
pub fn parse_message(message: &str) -> Option<Xid> {
    let rest = &message[message.find("NVRM: Xid (")? + "NVRM: Xid (".len()..];
    let (inside, rest) = rest.split_once(')')?;
    let bus = normalize_bus_id(inside.strip_prefix("PCI:").unwrap_or(inside))?;
    let rest = rest.strip_prefix(':')?.trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let code: u32 = rest[..digits].parse().ok()?;
    (code <= MAX_CODE).then_some(Xid { bus, code })
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

/// The running totals and the read position, as kept in the state's host
/// entries (all under `xid.`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// `journal` or `kmsg`: the source the position belongs to; empty before
    /// the first read of a boot.
    pub source: String,
    /// Set while no kernel log can be read (so that this is said once); the
    /// position and totals of the last source stay as they were meanwhile.
    pub unavailable: bool,
    /// The journal cursor of the last kernel entry read.
    pub cursor: Option<String>,
    /// That entry's `__MONOTONIC_TIMESTAMP` (µs since boot).
    pub monotonic: Option<u64>,
    /// The sequence number of the last /dev/kmsg record read.
    pub kmsg_seq: Option<u64>,
    /// Per GPU UUID, per code.
    pub gpus: BTreeMap<String, BTreeMap<u32, u64>>,
    /// Per normalised bus id that matched no GPU, per code.
    pub unattributed: BTreeMap<String, BTreeMap<u32, u64>>,
}

/// The prefix of every state entry of this module.
pub const STATE_PREFIX: &str = "xid.";

impl Counts {
    /// The counts kept in the state's host entries; entries that do not parse
    /// are ignored.
    pub fn from_state(host: &BTreeMap<String, String>) -> Self {
        let mut counts = Counts::default();
        for (key, value) in host {
            let Some(key) = key.strip_prefix(STATE_PREFIX) else {
                continue;
            };
            match key {
                "source" => counts.source.clone_from(value),
                "cursor" => counts.cursor = Some(value.clone()),
                "monotonic" => counts.monotonic = value.parse().ok(),
                "kmsg_seq" => counts.kmsg_seq = value.parse().ok(),
                "unavailable" => counts.unavailable = value == "1",
                _ => {
                    // gpu.<uuid>.<code> / bus.<bus id>.<code>
                    let Some((what, code)) = key.rsplit_once('.') else {
                        continue;
                    };
                    let (Ok(code), Ok(count)) = (code.parse::<u32>(), value.parse::<u64>()) else {
                        continue;
                    };
                    if let Some(uuid) = what.strip_prefix("gpu.") {
                        counts
                            .gpus
                            .entry(uuid.to_owned())
                            .or_default()
                            .insert(code, count);
                    } else if let Some(bus) = what.strip_prefix("bus.") {
                        counts
                            .unattributed
                            .entry(bus.to_owned())
                            .or_default()
                            .insert(code, count);
                    }
                }
            }
        }
        counts
    }

    /// The host entries that keep these counts.
    pub fn to_state(&self) -> BTreeMap<String, String> {
        let mut host = BTreeMap::new();
        let mut set = |key: String, value: String| {
            host.insert(format!("{STATE_PREFIX}{key}"), value);
        };
        set("source".into(), self.source.clone());
        if let Some(cursor) = &self.cursor {
            set("cursor".into(), cursor.clone());
        }
        if let Some(monotonic) = self.monotonic {
            set("monotonic".into(), monotonic.to_string());
        }
        if let Some(seq) = self.kmsg_seq {
            set("kmsg_seq".into(), seq.to_string());
        }
        if self.unavailable {
            set("unavailable".into(), "1".into());
        }
        for (uuid, codes) in &self.gpus {
            for (code, count) in codes {
                set(format!("gpu.{uuid}.{code}"), count.to_string());
            }
        }
        for (bus, codes) in &self.unattributed {
            for (code, count) in codes {
                set(format!("bus.{bus}.{code}"), count.to_string());
            }
        }
        host
    }

    /// Counts `xid` for the GPU at its bus id in `gpus` (normalised bus id,
    /// UUID), or as unattributed.
    pub fn add(&mut self, xid: &Xid, gpus: &[(String, String)]) {
        let codes = match gpus.iter().find(|(bus, _)| *bus == xid.bus) {
            Some((_, uuid)) => self.gpus.entry(uuid.clone()).or_default(),
            None => self.unattributed.entry(xid.bus.clone()).or_default(),
        };
        *codes.entry(xid.code).or_default() += 1;
    }
}

/// Reads the kernel log from `source` since the position in `counts` until
/// `until`, adding the XIDs found to `counts` (attributed to `gpus`: normalised
/// bus id, UUID) and moving the position. `boot_id` is this boot's (as in
/// /proc/sys/kernel/random/boot_id; the journal writes it without dashes). On
/// an error nothing is counted and the position stays.
pub fn read(
    source: &Source,
    counts: &mut Counts,
    gpus: &[(String, String)],
    boot_id: &str,
    until: Instant,
) -> Result<(), String> {
    let boot_id = &boot_id.replace('-', "");
    counts.unavailable = false;
    if counts.source != source.label() {
        if !counts.source.is_empty() {
            // Lines already counted from the other source would be counted
            // again from the start of this one: count from now on.
            log::info!(
                "XID source changed from {} to {} during this boot; counting new lines only",
                counts.source,
                source.label()
            );
            counts.source = source.label().into();
            counts.cursor = None;
            counts.monotonic = None;
            counts.kmsg_seq = None;
            return skip_to_end(source, counts, boot_id, until);
        }
        counts.source = source.label().into();
        counts.cursor = None;
        counts.monotonic = None;
        counts.kmsg_seq = None;
    }
    match source {
        Source::Journal(dir) => read_journal(dir.as_deref(), counts, gpus, boot_id, until),
        Source::Kmsg(path) => read_kmsg(path, counts, gpus, until),
    }
}

/// Moves the position to the end of the log without counting.
fn skip_to_end(
    source: &Source,
    counts: &mut Counts,
    boot_id: &str,
    until: Instant,
) -> Result<(), String> {
    let mut scratch = counts.clone();
    read(source, &mut scratch, &[], boot_id, until)?;
    counts.cursor = scratch.cursor;
    counts.monotonic = scratch.monotonic;
    counts.kmsg_seq = scratch.kmsg_seq;
    Ok(())
}

/// One journal entry as `journalctl -o export` gives it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Entry {
    cursor: String,
    monotonic: Option<u64>,
    facility: Option<String>,
    message: String,
}

fn read_journal(
    dir: Option<&Path>,
    counts: &mut Counts,
    gpus: &[(String, String)],
    boot_id: &str,
    until: Instant,
) -> Result<(), String> {
    let mut skip_through = None;
    let entries = match journalctl(dir, counts.cursor.as_deref(), boot_id, until) {
        Ok(entries) => entries,
        Err(error) if counts.cursor.is_some() && error.contains("cursor") => {
            // The cursor was refused: restart from the monotonic time of the
            // last entry counted, in this boot, skipping it and all before it.
            let Some(monotonic) = counts.monotonic else {
                return Err(error);
            };
            log::warn!(
                "journalctl refused the saved cursor ({error}); reading from the last \
                 entry's time in this boot instead"
            );
            skip_through = Some(monotonic);
            let synthetic = format!("b={boot_id};m={monotonic:x}");
            journalctl(dir, Some(&synthetic), boot_id, until)?
        }
        Err(error) => return Err(error),
    };
    for entry in entries {
        let after_position = match (skip_through, entry.monotonic) {
            (Some(through), Some(monotonic)) => monotonic > through,
            (Some(_), None) => false,
            (None, _) => true,
        };
        // Only the kernel's own lines: a message written to /dev/kmsg from
        // user space also has the kernel transport, but another facility.
        let kernel = entry.facility.as_deref().is_none_or(|f| f == "0");
        if after_position && kernel {
            if let Some(xid) = parse_message(&entry.message) {
                counts.add(&xid, gpus);
            }
        }
        counts.cursor = Some(entry.cursor);
        if entry.monotonic.is_some() {
            counts.monotonic = entry.monotonic;
        }
    }
    Ok(())
}

/// Runs journalctl for this boot's kernel entries after `cursor` (or from the
/// boot's start), returning the complete entries it wrote by `until` (killed
/// then if still running).
fn journalctl(
    dir: Option<&Path>,
    cursor: Option<&str>,
    boot_id: &str,
    until: Instant,
) -> Result<Vec<Entry>, String> {
    let mut command = Command::new("journalctl");
    if let Some(dir) = dir {
        command.arg("--directory").arg(dir);
    }
    command.args([
        "--no-pager",
        "--quiet",
        "--output=export",
        "--output-fields=MESSAGE,SYSLOG_FACILITY",
    ]);
    if let Some(cursor) = cursor {
        command.arg(format!("--after-cursor={cursor}"));
    }
    command
        .arg("_TRANSPORT=kernel")
        .arg(format!("_BOOT_ID={boot_id}"))
        .env("SYSTEMD_COLORS", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (output, status, stderr) = run_bounded(&mut command, until)?;
    let entries = parse_export(&output);
    match status {
        Some(status) if !status.success() => {
            Err(format!("journalctl failed ({status}): {}", stderr.trim()))
        }
        Some(_) => Ok(entries),
        None => {
            log::warn!(
                "journalctl did not finish within the run's deadline; counted the {} \
                 kernel lines it gave, the rest follows in the next runs",
                entries.len()
            );
            Ok(entries)
        }
    }
}

/// Runs `command`, collecting its standard output until it exits or `until`
/// passes (then it is killed). Returns the output, the exit status (`None`
/// when killed) and the standard error.
fn run_bounded(
    command: &mut Command,
    until: Instant,
) -> Result<(Vec<u8>, Option<std::process::ExitStatus>, String), String> {
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run journalctl: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (sender, receiver) = mpsc::channel::<Vec<u8>>();
    let reader = thread::Builder::new()
        .name("journalctl".into())
        .spawn(move || {
            let mut chunk = vec![0u8; 1 << 16];
            loop {
                match stdout.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if sender.send(chunk[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    let errors = thread::Builder::new()
        .name("journalctl-err".into())
        .spawn(move || {
            let mut text = Vec::new();
            let _ = (&mut stderr).take(1 << 16).read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        });
    if reader.is_err() || errors.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        return Err("cannot start a thread to read journalctl".into());
    }
    let mut output = Vec::new();
    let mut finished = true;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(left) {
            Ok(chunk) => output.extend_from_slice(&chunk),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                finished = false;
                break;
            }
        }
    }
    if !finished {
        let _ = child.kill();
        let _ = child.wait();
        // The entries written so far still count.
        while let Ok(chunk) = receiver.try_recv() {
            output.extend_from_slice(&chunk);
        }
        return Ok((output, None, String::new()));
    }
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for journalctl: {e}"))?;
    let stderr = errors.ok().and_then(|h| h.join().ok()).unwrap_or_default();
    Ok((output, Some(status), stderr))
}

/// The complete entries of `journalctl -o export` output; a truncated last
/// entry is dropped. Text fields are `KEY=value` lines; binary fields (a
/// message with control characters) are `KEY`, a little-endian 64-bit length,
/// the data and a line feed; an empty line ends an entry.
fn parse_export(data: &[u8]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut entry = Entry::default();
    let mut at = 0;
    while at < data.len() {
        let Some(end) = data[at..].iter().position(|&b| b == b'\n').map(|n| at + n) else {
            break;
        };
        let line = &data[at..end];
        if line.is_empty() {
            if !entry.cursor.is_empty() {
                entries.push(std::mem::take(&mut entry));
            }
            entry = Entry::default();
            at = end + 1;
            continue;
        }
        let (key, value, next) = match line.iter().position(|&b| b == b'=') {
            Some(eq) => (&line[..eq], &line[eq + 1..], end + 1),
            None => {
                let start = end + 1;
                let Some(size) = data.get(start..start + 8) else {
                    break;
                };
                let size = u64::from_le_bytes(size.try_into().expect("8 bytes")) as usize;
                let begin = start + 8;
                let Some(value) = begin
                    .checked_add(size)
                    .and_then(|stop| data.get(begin..stop))
                else {
                    break;
                };
                (line, value, begin + size + 1)
            }
        };
        let text = || String::from_utf8_lossy(value).into_owned();
        match key {
            b"__CURSOR" => entry.cursor = text(),
            b"__MONOTONIC_TIMESTAMP" => entry.monotonic = text().parse().ok(),
            b"SYSLOG_FACILITY" => entry.facility = Some(text()),
            b"MESSAGE" => entry.message = text(),
            _ => {}
        }
        at = next;
    }
    entries
}

fn open_kmsg(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// Reads `/dev/kmsg` records after the saved sequence number.
fn read_kmsg(
    path: &Path,
    counts: &mut Counts,
    gpus: &[(String, String)],
    until: Instant,
) -> Result<(), String> {
    let mut file = open_kmsg(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // Each read returns one record; a record is at most about 8 KiB.
    let mut buffer = vec![0u8; 1 << 14];
    while Instant::now() < until {
        let n = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // EPIPE: records were overwritten while reading; go on with the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let Some(record) = parse_kmsg_record(&buffer[..n]) else {
            continue;
        };
        if counts.kmsg_seq.is_some_and(|last| record.seq <= last) {
            continue;
        }
        if record.facility == 0 {
            if let Some(xid) = parse_message(&record.message) {
                counts.add(&xid, gpus);
            }
        }
        counts.kmsg_seq = Some(record.seq);
    }
    Ok(())
}

/// One `/dev/kmsg` record: `<prio>,<seq>,<µs>,<flags>[,…];<message>\n` with
/// continuation lines (` KEY=value`) after it.
#[derive(Debug, PartialEq, Eq)]
struct KmsgRecord {
    facility: u32,
    seq: u64,
    message: String,
}

fn parse_kmsg_record(record: &[u8]) -> Option<KmsgRecord> {
    let text = String::from_utf8_lossy(record);
    let (header, rest) = text.split_once(';')?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let seq: u64 = fields.next()?.parse().ok()?;
    let message = rest.split('\n').next().unwrap_or_default().to_owned();
    Some(KmsgRecord {
        facility: prio >> 3,
        seq,
        message,
    })
}

/// Adds the XID samples: for every GPU of the snapshot with a UUID, its total
/// (0 until its first XID) and its counts by code; for every unattributed bus
/// id, its counts by code (host samples). Down GPUs keep theirs: these counts
/// come from the kernel log, not from the GPU.
pub fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let codes = counts.gpus.get(&device.uuid);
        let total: u64 = codes.map_or(0, |codes| codes.values().sum());
        device
            .samples
            .push(Sample::new(&metrics::XID_ERRORS, total as f64));
        for (code, count) in codes.into_iter().flatten() {
            device.samples.push(
                Sample::new(&metrics::XID_ERRORS_BY_CODE, *count as f64)
                    .with("code", code.to_string()),
            );
        }
    }
    for (bus, codes) in &counts.unattributed {
        for (code, count) in codes {
            snapshot.host.push(
                Sample::new(&metrics::XID_UNATTRIBUTED, *count as f64)
                    .with("pci_bus_id", bus.clone())
                    .with("code", code.to_string()),
            );
        }
    }
}

/// The GPUs of `snapshot` to attribute XIDs to: normalised bus id and UUID.
/// A GPU without a UUID or bus id cannot take XIDs (they stay unattributed).
pub fn gpus_of(snapshot: &Snapshot) -> Vec<(String, String)> {
    snapshot
        .devices
        .iter()
        .filter(|d| !d.uuid.is_empty())
        .filter_map(|d| Some((normalize_bus_id(&d.pci_bus_id)?, d.uuid.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_of_new_and_old_drivers_parse() {
        let new =
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
        assert_eq!(
            parse_message(new),
            Some(Xid {
                bus: "00000000:3B:00".into(),
                code: 79
            })
        );
        let old = "NVRM: Xid (0000:01:00): 13, Graphics Exception: ESR 0x405840=0x0";
        assert_eq!(parse_message(old).unwrap().code, 13);
        assert_eq!(parse_message(old).unwrap().bus, "00000000:01:00");
        for not_xid in [
            "NVRM: GPU at PCI:0000:3b:00: GPU-1234",
            "NVRM: Xid (PCI:zz:3b:00): 79, x",
            "NVRM: Xid (PCI:0000:3b:00): , x",
            "NVRM: Xid (PCI:0000:3b:00): 123456, x",
            "Xid (PCI:0000:3b:00): 79",
        ] {
            assert_eq!(parse_message(not_xid), None, "{not_xid}");
        }
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

    #[test]
    fn counts_round_trip_through_the_state() {
        let mut counts = Counts {
            source: "journal".into(),
            cursor: Some("s=1;i=2;b=3;m=4;t=5;x=6".into()),
            monotonic: Some(4),
            ..Counts::default()
        };
        let gpus = [("00000000:3B:00".to_owned(), "GPU-a".to_owned())];
        for code in [79, 79, 13] {
            counts.add(
                &Xid {
                    bus: "00000000:3B:00".into(),
                    code,
                },
                &gpus,
            );
        }
        counts.add(
            &Xid {
                bus: "00000000:99:00".into(),
                code: 79,
            },
            &gpus,
        );
        assert_eq!(counts.gpus["GPU-a"][&79], 2);
        assert_eq!(counts.unattributed["00000000:99:00"][&79], 1);
        assert_eq!(Counts::from_state(&counts.to_state()), counts);
    }

    #[test]
    fn export_output_parses_with_binary_fields_and_a_truncated_end() {
        let mut data =
            b"__CURSOR=c1\n__MONOTONIC_TIMESTAMP=10\nSYSLOG_FACILITY=0\nMESSAGE=one\n\n".to_vec();
        data.extend_from_slice(b"__CURSOR=c2\nMESSAGE\n");
        data.extend_from_slice(&7u64.to_le_bytes());
        data.extend_from_slice(b"a\n\nb=\x01c\n\n");
        data.extend_from_slice(b"__CURSOR=c3\nMESSAGE=cut");
        let entries = parse_export(&data);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].monotonic, Some(10));
        assert_eq!(entries[0].facility.as_deref(), Some("0"));
        assert_eq!(entries[1].message, "a\n\nb=\u{1}c");
        assert_eq!(entries[1].cursor, "c2");
    }

    #[test]
    fn kmsg_records_give_facility_and_sequence() {
        let kernel = parse_kmsg_record(
            b"4,1021,5000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x\n SUBSYSTEM=pci\n",
        )
        .unwrap();
        assert_eq!((kernel.facility, kernel.seq), (0, 1021));
        assert_eq!(parse_message(&kernel.message).unwrap().code, 79);
        // A line written to /dev/kmsg from user space gets the user facility.
        let user = parse_kmsg_record(b"12,1022,5001,-;NVRM: Xid (PCI:0000:3b:00): 79\n").unwrap();
        assert_eq!(user.facility, 1);
        assert_eq!(parse_kmsg_record(b"garbage"), None);
    }
}
