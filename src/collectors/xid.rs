//! XID errors, counted exactly from the kernel log between runs.
//!
//! The NVIDIA driver logs every XID error to the kernel log, e.g.
//! `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off
//! the bus.` (older drivers: no pid). A run reads the kernel lines logged since
//! the previous run, counts the XIDs by GPU (the PCI bus id in the message
//! against the bus ids NVML reported) and code, and adds them to running totals
//! kept in the state (its `xid` field). The state is per boot, so the
//! totals start at 0 each boot and never go backwards within one.
//!
//! This module touches neither NVML nor the textfile directory: it reads the
//! kernel log and returns plain data (samples for the snapshot, counts for the
//! state).
//!
//! Sources, in order:
//! 1. the systemd journal's kernel transport (`_TRANSPORT=kernel`, facility
//!    kern): `journalctl -o export` from a cursor kept in the state, or from the
//!    start of this boot (`_BOOT_ID`) on the first run. A line written by a user
//!    (`logger "NVRM: Xid …"`, a write to /dev/kmsg) is never counted: it has
//!    another transport or facility. journalctl is started by its absolute path
//!    ([`JOURNALCTL`]), never looked up in `PATH`: the exporter runs as root.
//! 2. `/dev/kmsg` where no journal exists (no journalctl, or no journal files),
//!    read without blocking; records of the kern facility only, after the last
//!    sequence number kept in the state.
//! 3. Neither: the collector fails (see below), with one message per boot.
//!
//! Bounded reads: journalctl's output is parsed as it arrives, entry by entry,
//! keeping at most [`MAX_VALUE`] bytes of any field, so memory does not grow
//! with the backlog. A read ends at the run's deadline or after
//! [`MAX_BYTES_PER_RUN`] bytes, whichever comes first (journalctl is killed);
//! the entries parsed completely by then are counted and the cursor names the
//! last of them, so the next run goes on after it and nothing is counted twice
//! or missed. Such a cut read is not a success: the counts lag behind the log.
//!
//! Failures are visible: the registry writes `nvidia_gpu_collector_success
//! {collector="xid"}` 0 whenever [`collect`] returns an error (no kernel log,
//! journalctl failing, a read cut short, this boot's id unknown). The XID
//! series are then still written with the counts known from the state (which
//! is only ever loaded for this boot), so they never vanish the way they do
//! with `--no-collector xid`.
//!
//! No double counting: the cursor names the last entry counted; journald keeps
//! it meaningful across rotation (an archived file is still read) and vacuuming
//! (the cursor's boot id and monotonic time still position the read). Should
//! journalctl refuse the cursor (a damaged state, say), the read restarts from
//! the monotonic time of that entry within this boot, and entries at or before
//! it are skipped.
//!
//! Recounting: where no position is left (the cursor refused and no time of
//! its entry kept, or that refused too) or a stored count is impossible (more
//! than [`MAX_COUNT`]: a damaged state), the collector
//! recounts this boot's kernel log from its start into a separate set of
//! totals, kept in the state as its `recount` until the read reaches the end
//! of the log (over several runs if the deadline cuts it). Meanwhile the
//! counts known before are published, so no series goes backwards (which
//! `increase()` would take for a counter reset, i.e. new XIDs). When the
//! recount is complete, every count becomes the larger of the two. That is
//! exact: the totals are this boot's, and a read of this boot's kernel entries
//! from its start sees every entry the old totals counted (they are this
//! boot's too) plus those logged since, so the recount is at least the old
//! count and is the true one. Only if journald already vacuumed the start of
//! this boot can the recount be lower; the old count is then the better lower
//! bound and is kept. A damaged count is dropped before the recount, so it is
//! replaced by the recount.
//!
//! Impossible counts: a count is at most [`MAX_COUNT`] (2^32) per series and
//! boot; counting saturates there, and a stored count above it is damage.

use std::fs;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Instant;

use super::hooks::HostRun;
use crate::metrics;
use crate::snapshot::Snapshot;
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

/// Where journalctl is, in the order tried. Only these absolute paths: a
/// `PATH` lookup by a program running as root would start whatever a writable
/// directory early in `PATH` holds.
pub const JOURNALCTL: [&str; 2] = ["/usr/bin/journalctl", "/bin/journalctl"];

/// The most bytes of journalctl's output one run reads. One kernel line is
/// about 400 bytes of export output, so this is about 160,000 lines: a
/// backlog beyond it (the first run after a boot with a noisy kernel) is
/// worked off over several runs, each of bounded time and CPU, while the
/// common run (a few new lines) is far below it. Memory does not depend on it
/// (the output is parsed as it arrives).
pub const MAX_BYTES_PER_RUN: u64 = 64 << 20;

/// The most bytes of one field's value kept: a kernel line is at most about
/// 1 KiB (a /dev/kmsg record at most 8 KiB), a cursor about 150 bytes. The
/// rest of a longer value is skipped, not buffered.
pub const MAX_VALUE: usize = 8 << 10;

/// The most XIDs one series (one GPU or bus id, one code) can count in one
/// boot. An XID is an error event the driver logs as a kernel line of about
/// 100 bytes; 2^32 of them would be one every 7 ms for a year of uptime and
/// over 400 GB of kernel log, so a stored count above this comes from a
/// damaged state, not from the driver. Counting saturates here. The sum over
/// all codes (at most `MAX_CODE` + 1 of them) stays below 2^53, exact as an
/// `f64`, and within `Family::plausible` for counters.
pub const MAX_COUNT: u64 = 1 << 32;

/// How a read of the kernel log ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Everything logged by then was read.
    Complete,
    /// Cut short (the deadline, the byte bound), saying why: the position is
    /// at the last entry read, and the next run goes on from there.
    Cut(String),
}

/// The xid collector (a host-level row of the registry): counts the XID errors
/// logged since the previous run into the running totals kept in the state
/// and adds them to the snapshot. It runs only after NVML was read, whose GPUs'
/// bus ids attribute the XIDs, so a run without them leaves the kernel log for
/// the next; while no kernel log can be read, the position and totals stay as
/// they are, so nothing is counted twice when it is back. An error says why
/// this run did not read the log to its end (already logged here); the counts
/// known are published all the same.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), String> {
    let Some(boot_id) = boot_id() else {
        // No state was loaded either (see `state::boot_id`): nothing is known
        // to be this boot's, and the journal cannot be filtered by boot.
        let error = "cannot read this boot's id: the kernel log and the state cannot be told \
                     to be this boot's";
        log::warn!("cannot count XID errors: {error}");
        return Err(error.into());
    };
    if !run.state.continues_totals() {
        // The counts and the journal position are in a state this run cannot
        // use (already said when it was loaded): counting from nothing would
        // publish a reset, then a jump when the next run continues them.
        return Err("the state cannot be used this run; the XID counts are left out".into());
    }
    let mut counts = run.state.previous().xid.clone();
    if let Some(damage) = counts.take_damage() {
        log::warn!(
            "the state holds an impossible XID count ({damage}); ignoring it and recounting \
             this boot's kernel log from its start"
        );
        counts.start_recount();
    }
    let gpus = gpus_of(run.snapshot);
    let result = match choose(run.journal_dir) {
        None => {
            if !counts.unavailable {
                log::warn!(
                    "no kernel log to count XID errors from (no journal files, /dev/kmsg not \
                     readable); publishing the counts known so far"
                );
            }
            counts.unavailable = true;
            Err("no kernel log to count XID errors from".to_owned())
        }
        Some(source) => match read(&source, &mut counts, &gpus, &boot_id, run.until) {
            Ok(Ended::Complete) => Ok(()),
            Ok(Ended::Cut(why)) => {
                log::warn!(
                    "{why}; counted the kernel lines read by then, the rest follows in the \
                     next runs"
                );
                Err(why)
            }
            Err(error) => {
                log::warn!("cannot count XID errors: {error}; publishing the counts known so far");
                Err(error)
            }
        },
    };
    add_samples(&counts, run.snapshot);
    run.state.set_xid(counts);
    result
}

/// The source to use: `journal_dir` if given; else the system journal if
/// journalctl and journal files exist; else `/dev/kmsg` if it can be opened;
/// else none.
pub fn choose(journal_dir: Option<&Path>) -> Option<Source> {
    if let Some(dir) = journal_dir {
        return Some(Source::Journal(Some(dir.to_path_buf())));
    }
    if journalctl_path().is_some()
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

/// The first of [`JOURNALCTL`] that is a file.
fn journalctl_path() -> Option<&'static Path> {
    JOURNALCTL.iter().map(Path::new).find(|path| path.is_file())
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

/// XID counts per GPU UUID and per unattributed bus id, each per code.
pub use crate::state::schema::XidTotals as Totals;

impl Totals {
    /// Counts `xid` for the GPU at its bus id in `gpus` (normalised bus id,
    /// UUID), or as unattributed; saturates at [`MAX_COUNT`].
    pub fn add(&mut self, xid: &Xid, gpus: &[(String, String)]) {
        let codes = match gpus.iter().find(|(bus, _)| *bus == xid.bus) {
            Some((_, uuid)) => self.gpus.entry(uuid.clone()).or_default(),
            None => self.unattributed.entry(xid.bus.clone()).or_default(),
        };
        let count = codes.entry(xid.code).or_default();
        *count = count.saturating_add(1).min(MAX_COUNT);
    }

    /// Raises every count to at least the one in `other`.
    fn raise_to(&mut self, other: &Totals) {
        for (mine, theirs) in [
            (&mut self.gpus, &other.gpus),
            (&mut self.unattributed, &other.unattributed),
        ] {
            for (id, codes) in theirs {
                let into = mine.entry(id.clone()).or_default();
                for (code, count) in codes {
                    let at = into.entry(*code).or_default();
                    *at = (*at).max(*count);
                }
            }
        }
    }
}

/// The running totals and the read position, as kept in the state.
pub use crate::state::schema::XidCounts as Counts;

impl Counts {
    /// Drops every impossible count (above [`MAX_COUNT`]: damage, not
    /// something the driver logged) and describes the first, if any.
    pub fn take_damage(&mut self) -> Option<String> {
        let mut damage = None;
        for (which, totals) in std::iter::once(("", &mut self.totals))
            .chain(self.recount.iter_mut().map(|recount| ("recount ", recount)))
        {
            for (id, codes) in totals.gpus.iter_mut().chain(&mut totals.unattributed) {
                codes.retain(|code, count| {
                    let possible = *count <= MAX_COUNT;
                    if !possible && damage.is_none() {
                        damage = Some(format!(
                            "the {which}count of XID {code} for {id} is {count}, more than \
                             {MAX_COUNT}"
                        ));
                    }
                    possible
                });
            }
        }
        damage
    }

    /// Counts `xid` (see [`Totals::add`]) into the recount under way, if any,
    /// else into the totals.
    pub fn add(&mut self, xid: &Xid, gpus: &[(String, String)]) {
        self.recount
            .as_mut()
            .unwrap_or(&mut self.totals)
            .add(xid, gpus);
    }

    /// Starts recounting this boot from its start (see the module doc).
    pub fn start_recount(&mut self) {
        self.recount = Some(Totals::default());
        self.forget_position();
    }

    /// Ends a recount under way that has read to the end of the log: every
    /// total becomes the larger of the two (see the module doc).
    fn finish_recount(&mut self) {
        if let Some(recount) = self.recount.take() {
            self.totals.raise_to(&recount);
        }
    }

    fn forget_position(&mut self) {
        self.cursor = None;
        self.monotonic = None;
        self.kmsg_seq = None;
    }
}

/// Reads the kernel log from `source` since the position in `counts` until
/// `until`, adding the XIDs found to `counts` (attributed to `gpus`: normalised
/// bus id, UUID) and moving the position to the last entry read, whether the
/// read completes, is cut short or fails. `boot_id` is this boot's (as in
/// /proc/sys/kernel/random/boot_id; the journal writes it without dashes).
pub fn read(
    source: &Source,
    counts: &mut Counts,
    gpus: &[(String, String)],
    boot_id: &str,
    until: Instant,
) -> Result<Ended, String> {
    let boot_id = &boot_id.replace('-', "");
    counts.unavailable = false;
    if counts.source != source.label() {
        counts.forget_position();
        if !counts.source.is_empty() {
            // Lines already counted from the other source would be counted
            // again from the start of this one: count from now on.
            log::info!(
                "XID source changed from {} to {} during this boot; counting new lines only",
                counts.source,
                source.label()
            );
            counts.source = source.label().into();
            counts.recount = None;
            return skip_to_end(source, counts, boot_id, until);
        }
        counts.source = source.label().into();
    }
    let ended = match source {
        Source::Journal(dir) => read_journal(dir.as_deref(), counts, gpus, boot_id, until)?,
        Source::Kmsg(path) => read_kmsg(path, counts, gpus, until)?,
    };
    if ended == Ended::Complete {
        counts.finish_recount();
    }
    Ok(ended)
}

/// Moves the position to the end of the log without counting.
fn skip_to_end(
    source: &Source,
    counts: &mut Counts,
    boot_id: &str,
    until: Instant,
) -> Result<Ended, String> {
    let mut scratch = counts.clone();
    let ended = read(source, &mut scratch, &[], boot_id, until)?;
    counts.cursor = scratch.cursor;
    counts.monotonic = scratch.monotonic;
    counts.kmsg_seq = scratch.kmsg_seq;
    Ok(ended)
}

/// One journal entry as `journalctl -o export` gives it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Entry {
    cursor: String,
    monotonic: Option<u64>,
    facility: Option<String>,
    message: String,
}

impl Entry {
    /// Takes the field `key` with `value`, if it is one used here.
    fn set(&mut self, key: &[u8], value: &[u8]) {
        let text = || String::from_utf8_lossy(value).into_owned();
        match key {
            b"__CURSOR" => self.cursor = text(),
            b"__MONOTONIC_TIMESTAMP" => self.monotonic = text().parse().ok(),
            b"SYSLOG_FACILITY" => self.facility = Some(text()),
            b"MESSAGE" => self.message = text(),
            _ => {}
        }
    }
}

/// Why journalctl gave no (complete) read.
enum JournalError {
    /// It refused the cursor it was given.
    Refused(String),
    Failed(String),
}

fn read_journal(
    dir: Option<&Path>,
    counts: &mut Counts,
    gpus: &[(String, String)],
    boot_id: &str,
    until: Instant,
) -> Result<Ended, String> {
    let cursor = counts.cursor.clone();
    let error = match journalctl(dir, cursor.as_deref(), boot_id, until, &mut |entry| {
        count_entry(counts, gpus, None, entry)
    }) {
        Err(JournalError::Refused(error)) => error,
        Err(JournalError::Failed(error)) => return Err(error),
        Ok(ended) => return Ok(ended),
    };
    let error = match counts.monotonic {
        Some(monotonic) => {
            // Restart from the monotonic time of the last entry counted, in
            // this boot, skipping it and all before it.
            log::warn!(
                "journalctl refused the saved cursor ({error}); reading from the last \
                 entry's time in this boot instead"
            );
            let synthetic = format!("b={boot_id};m={monotonic:x}");
            match journalctl(dir, Some(&synthetic), boot_id, until, &mut |entry| {
                count_entry(counts, gpus, Some(monotonic), entry)
            }) {
                Err(JournalError::Refused(error)) => error,
                Err(JournalError::Failed(error)) => return Err(error),
                Ok(ended) => return Ok(ended),
            }
        }
        None => error,
    };
    log::warn!(
        "journalctl refused the saved position ({error}); recounting this boot's kernel log \
         from its start"
    );
    counts.start_recount();
    journalctl(dir, None, boot_id, until, &mut |entry| {
        count_entry(counts, gpus, None, entry)
    })
    .map_err(|(JournalError::Refused(error) | JournalError::Failed(error))| error)
}

/// Counts the XID in `entry` if it is the kernel's own line after
/// `skip_through` (a monotonic time), and moves the position to it.
fn count_entry(
    counts: &mut Counts,
    gpus: &[(String, String)],
    skip_through: Option<u64>,
    entry: Entry,
) {
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

/// Runs journalctl for this boot's kernel entries after `cursor` (or from the
/// boot's start), handing each complete entry to `on_entry` as it arrives,
/// until it exits, `until` passes or it wrote [`MAX_BYTES_PER_RUN`] bytes
/// (then it is killed and the read is cut).
fn journalctl(
    dir: Option<&Path>,
    cursor: Option<&str>,
    boot_id: &str,
    until: Instant,
    on_entry: &mut dyn FnMut(Entry),
) -> Result<Ended, JournalError> {
    let program = journalctl_path().ok_or_else(|| {
        JournalError::Failed(format!("no journalctl at {}", JOURNALCTL.join(" or ")))
    })?;
    let mut command = Command::new(program);
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
    let mut child = command
        .spawn()
        .map_err(|e| JournalError::Failed(format!("cannot run {}: {e}", program.display())))?;
    let mut parser = ExportParser::default();
    let streamed = stream(&mut child, until, MAX_BYTES_PER_RUN, &mut |data| {
        parser.feed(data, on_entry);
    })
    .map_err(JournalError::Failed)?;
    match streamed {
        Streamed::Cut(why) => Ok(Ended::Cut(format!("journalctl {why}"))),
        Streamed::Exited(status, _) if status.success() => Ok(Ended::Complete),
        Streamed::Exited(status, stderr) => {
            let error = format!("journalctl failed ({status}): {}", stderr.trim());
            if cursor.is_some() && stderr.contains("cursor") {
                Err(JournalError::Refused(error))
            } else {
                Err(JournalError::Failed(error))
            }
        }
    }
}

/// How a child's output ended.
#[derive(Debug)]
enum Streamed {
    /// It exited, with its standard error (the first 64 KiB).
    Exited(ExitStatus, String),
    /// It was killed: why.
    Cut(String),
}

/// Hands the standard output of `child` to `on_data` as it arrives, until
/// the child closes it, `until` passes or `max_bytes` were read (then it is
/// killed). Standard error is drained meanwhile so that the child never
/// blocks on it.
fn stream(
    child: &mut Child,
    until: Instant,
    max_bytes: u64,
    on_data: &mut dyn FnMut(&[u8]),
) -> Result<Streamed, String> {
    const MAX_STDERR: usize = 1 << 16;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (mut out_open, mut err_open) = (true, true);
    let mut errors = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut read_bytes = 0u64;
    let cut = loop {
        if !out_open && !err_open {
            break None;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Some("did not finish by the run's deadline".to_owned());
        }
        // A negative descriptor is ignored by poll(2): a closed stream.
        let mut fds = [
            (out_open, stdout.as_raw_fd()),
            (err_open, stderr.as_raw_fd()),
        ]
        .map(|(open, fd)| libc::pollfd {
            fd: if open { fd } else { -1 },
            events: libc::POLLIN,
            revents: 0,
        });
        let timeout = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
        // SAFETY: `fds` is a valid array of two pollfd for the whole call.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) } < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break Some(format!("could not be waited for ({error})"));
        }
        if fds[0].revents != 0 {
            match stdout.read(&mut buffer) {
                Ok(0) => out_open = false,
                Ok(n) => {
                    on_data(&buffer[..n]);
                    read_bytes += n as u64;
                    if read_bytes >= max_bytes {
                        break Some(format!("wrote more than {max_bytes} bytes in this run"));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Some(format!("could not be read ({e})")),
            }
        }
        if fds[1].revents != 0 {
            match stderr.read(&mut buffer) {
                Ok(0) => err_open = false,
                Ok(n) => {
                    let keep = n.min(MAX_STDERR.saturating_sub(errors.len()));
                    errors.extend_from_slice(&buffer[..keep]);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => err_open = false,
            }
        }
    };
    if let Some(why) = cut {
        let _ = child.kill();
        let _ = child.wait();
        return Ok(Streamed::Cut(why));
    }
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for journalctl: {e}"))?;
    Ok(Streamed::Exited(
        status,
        String::from_utf8_lossy(&errors).into_owned(),
    ))
}

/// Where [`ExportParser`] is within the output.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Parse {
    /// In a line: `KEY=value`, a binary field's name, or the empty line that
    /// ends an entry.
    #[default]
    Line,
    /// In the 64-bit little-endian length of a binary field's value.
    Length,
    /// In a binary field's value.
    Data,
    /// At the line feed after a binary field's value.
    DataEnd,
}

/// A parser of `journalctl -o export` output fed in pieces of any size, which
/// hands on each entry once its ending empty line arrives (so an entry cut off
/// by a kill is never handed on). Text fields are `KEY=value` lines; binary
/// fields (a message with control characters) are `KEY`, a little-endian
/// 64-bit length, the data and a line feed. It keeps at most [`MAX_VALUE`]
/// bytes of any value: its memory is bounded whatever the input.
#[derive(Debug, Default)]
struct ExportParser {
    at: Parse,
    /// The line so far (its first bytes only).
    line: Vec<u8>,
    /// The binary field being read: its name, length bytes, the bytes of its
    /// value still to come, and the first bytes of its value.
    field: Vec<u8>,
    length: Vec<u8>,
    remaining: u64,
    value: Vec<u8>,
    entry: Entry,
}

impl ExportParser {
    fn feed(&mut self, mut data: &[u8], on_entry: &mut dyn FnMut(Entry)) {
        while !data.is_empty() {
            match self.at {
                Parse::Line => match data.iter().position(|&b| b == b'\n') {
                    Some(end) => {
                        keep(&mut self.line, &data[..end], MAX_VALUE + 64);
                        data = &data[end + 1..];
                        self.end_line(on_entry);
                    }
                    None => {
                        keep(&mut self.line, data, MAX_VALUE + 64);
                        data = &[];
                    }
                },
                Parse::Length => {
                    let take = (8 - self.length.len()).min(data.len());
                    self.length.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if let Ok(bytes) = <[u8; 8]>::try_from(self.length.as_slice()) {
                        self.remaining = u64::from_le_bytes(bytes);
                        self.length.clear();
                        self.at = if self.remaining == 0 {
                            Parse::DataEnd
                        } else {
                            Parse::Data
                        };
                    }
                }
                Parse::Data => {
                    let take = usize::try_from(self.remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    keep(&mut self.value, &data[..take], MAX_VALUE);
                    self.remaining -= take as u64;
                    data = &data[take..];
                    if self.remaining == 0 {
                        self.at = Parse::DataEnd;
                    }
                }
                Parse::DataEnd => {
                    data = &data[1..];
                    self.entry.set(&self.field, &self.value);
                    self.field.clear();
                    self.value.clear();
                    self.at = Parse::Line;
                }
            }
        }
    }

    /// A line is complete.
    fn end_line(&mut self, on_entry: &mut dyn FnMut(Entry)) {
        if self.line.is_empty() {
            let entry = std::mem::take(&mut self.entry);
            if !entry.cursor.is_empty() {
                on_entry(entry);
            }
        } else if let Some(eq) = self.line.iter().position(|&b| b == b'=') {
            self.entry.set(&self.line[..eq], &self.line[eq + 1..]);
        } else {
            self.field.clone_from(&self.line);
            self.at = Parse::Length;
        }
        self.line.clear();
    }
}

/// Appends to `into` as much of `data` as fits in `limit` bytes in all.
fn keep(into: &mut Vec<u8>, data: &[u8], limit: usize) {
    let room = limit.saturating_sub(into.len()).min(data.len());
    into.extend_from_slice(&data[..room]);
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
) -> Result<Ended, String> {
    let mut file = open_kmsg(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // Each read returns one record; a record is at most about 8 KiB.
    let mut buffer = vec![0u8; 1 << 14];
    loop {
        if Instant::now() >= until {
            return Ok(Ended::Cut(format!(
                "reading {} did not finish by the run's deadline",
                path.display()
            )));
        }
        let n = match file.read(&mut buffer) {
            Ok(0) => return Ok(Ended::Complete),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Ended::Complete),
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
/// come from the kernel log, not from the GPU. A recount under way is not
/// published (see the module doc).
pub fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let codes = counts.totals.gpus.get(&device.uuid);
        let total = codes.map_or(0, |codes| {
            codes
                .values()
                .fold(0u64, |sum, count| sum.saturating_add(*count))
        });
        device
            .samples
            .push(metrics::XID_ERRORS.sample(total as f64));
        for (code, count) in codes.into_iter().flatten() {
            device
                .samples
                .push(metrics::XID_ERRORS_BY_CODE.sample_with([code.to_string()], *count as f64));
        }
    }
    for (bus, codes) in &counts.totals.unattributed {
        for (code, count) in codes {
            snapshot.host.push(
                metrics::XID_UNATTRIBUTED
                    .sample_with([bus.clone(), code.to_string()], *count as f64),
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
    use std::time::Duration;

    /// The entries `ExportParser` hands on when fed `data` in pieces of `piece`
    /// bytes.
    fn parse_export(data: &[u8], piece: usize) -> Vec<Entry> {
        let mut parser = ExportParser::default();
        let mut entries = Vec::new();
        for chunk in data.chunks(piece) {
            parser.feed(chunk, &mut |entry| entries.push(entry));
        }
        entries
    }

    fn xid(code: u32) -> Xid {
        Xid {
            bus: "00000000:3B:00".into(),
            code,
        }
    }

    #[test]
    fn a_huge_value_is_skipped_past_not_kept() {
        let mut data = b"__CURSOR=c1\nMESSAGE=".to_vec();
        data.extend(std::iter::repeat_n(b'x', 3 * MAX_VALUE));
        data.extend_from_slice(b"\nSYSLOG_FACILITY=0\n\n__CURSOR=c2\nMESSAGE\n");
        let size = 5 * MAX_VALUE as u64;
        data.extend_from_slice(&size.to_le_bytes());
        data.extend(std::iter::repeat_n(b'y', 5 * MAX_VALUE));
        data.extend_from_slice(b"\nSYSLOG_FACILITY=0\n\n");
        let entries = parse_export(&data, 4096);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].message.len(), MAX_VALUE + 64 - "MESSAGE=".len());
        assert_eq!(entries[0].facility.as_deref(), Some("0"));
        assert_eq!(entries[1].message.len(), MAX_VALUE);
        assert_eq!(entries[1].facility.as_deref(), Some("0"));
        assert_eq!(entries[1].cursor, "c2");
    }

    #[test]
    fn counts_saturate_and_impossible_stored_counts_are_damage() {
        let gpus = [("00000000:3B:00".to_owned(), "GPU-a".to_owned())];
        let mut totals = Totals::default();
        totals
            .gpus
            .entry("GPU-a".into())
            .or_default()
            .insert(79, MAX_COUNT);
        totals.add(&xid(79), &gpus);
        assert_eq!(totals.gpus["GPU-a"][&79], MAX_COUNT);
        let mut counts = Counts {
            totals: totals.clone(),
            ..Counts::default()
        };
        assert_eq!(counts.take_damage(), None);
        counts
            .totals
            .gpus
            .get_mut("GPU-a")
            .unwrap()
            .insert(13, MAX_COUNT + 1);
        let damage = counts.take_damage().unwrap();
        assert!(damage.contains("XID 13 for GPU-a"), "{damage}");
        assert_eq!(counts.totals.gpus["GPU-a"].get(&13), None);
        assert_eq!(counts.totals.gpus["GPU-a"][&79], MAX_COUNT);
        // The largest possible file stays exact and plausible.
        let most = (MAX_COUNT * (u64::from(MAX_CODE) + 1)) as f64;
        assert!(most < 2f64.powi(53));
        assert!(metrics::XID_ERRORS.family().plausible().contains(&most));
    }

    #[test]
    fn a_complete_recount_replaces_the_totals_but_never_lowers_them() {
        let gpus = [("00000000:3B:00".to_owned(), "GPU-a".to_owned())];
        let mut counts = Counts::default();
        for code in [79, 79, 13] {
            counts.add(&xid(code), &gpus);
        }
        counts.start_recount();
        // The journal still holds 79 three times (one logged since) but lost
        // the 13 to vacuuming; a new code 48.
        for code in [79, 79, 79, 48] {
            counts.add(&xid(code), &gpus);
        }
        assert_eq!(counts.totals.gpus["GPU-a"][&79], 2, "not before it ends");
        counts.finish_recount();
        assert_eq!(counts.recount, None);
        let codes = &counts.totals.gpus["GPU-a"];
        assert_eq!((codes[&79], codes[&13], codes[&48]), (3, 1, 1));
    }

    fn child(script: &str) -> Child {
        Command::new("/bin/sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_stream_is_cut_at_the_byte_bound_and_at_the_deadline() {
        let far = Instant::now() + Duration::from_secs(60);
        let mut read = 0;
        let streamed = stream(&mut child("yes"), far, 1 << 20, &mut |d| read += d.len());
        assert!(matches!(streamed, Ok(Streamed::Cut(ref why)) if why.contains("bytes")));
        assert!((1 << 20..(1 << 20) + (1 << 16)).contains(&read));

        let started = Instant::now();
        let soon = started + Duration::from_millis(200);
        let streamed = stream(
            &mut child("echo part; exec sleep 30"),
            soon,
            1 << 20,
            &mut |d| {
                assert_eq!(d, b"part\n");
            },
        );
        assert!(matches!(streamed, Ok(Streamed::Cut(ref why)) if why.contains("deadline")));
        assert!(started.elapsed() < Duration::from_secs(5));

        let streamed = stream(
            &mut child("echo out; echo err >&2; exit 3"),
            far,
            1 << 20,
            &mut |_| {},
        );
        let Ok(Streamed::Exited(status, stderr)) = streamed else {
            panic!("{streamed:?}");
        };
        assert_eq!((status.code(), stderr.as_str()), (Some(3), "err\n"));
    }

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
        assert_eq!(counts.totals.gpus["GPU-a"][&79], 2);
        assert_eq!(counts.totals.unattributed["00000000:99:00"][&79], 1);
        let round_trip = |counts: &Counts| -> Counts {
            serde_json::from_str(&serde_json::to_string(counts).unwrap()).unwrap()
        };
        assert_eq!(round_trip(&counts), counts);
        // A recount under way, also before its first XID.
        counts.start_recount();
        assert_eq!(round_trip(&counts), counts);
        counts.add(
            &Xid {
                bus: "00000000:3B:00".into(),
                code: 13,
            },
            &gpus,
        );
        assert_eq!(counts.totals.gpus["GPU-a"][&13], 1, "published totals stay");
        assert_eq!(counts.recount.as_ref().unwrap().gpus["GPU-a"][&13], 1);
        assert_eq!(round_trip(&counts), counts);
    }

    #[test]
    fn export_output_parses_with_binary_fields_and_a_truncated_end() {
        let mut data =
            b"__CURSOR=c1\n__MONOTONIC_TIMESTAMP=10\nSYSLOG_FACILITY=0\nMESSAGE=one\n\n".to_vec();
        data.extend_from_slice(b"__CURSOR=c2\nMESSAGE\n");
        data.extend_from_slice(&7u64.to_le_bytes());
        data.extend_from_slice(b"a\n\nb=\x01c\n\n");
        data.extend_from_slice(b"__CURSOR=c3\nMESSAGE=cut");
        // In one piece and byte by byte: the same entries, the cut one never.
        let entries = parse_export(&data, data.len());
        assert_eq!(parse_export(&data, 1), entries);
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
