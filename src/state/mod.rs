//! The only code that touches the state directory: what one short-lived run
//! leaves for the next.
//!
//! One small file, `<dir>/state`, in the one versioned schema of
//! [`schema::State`] (JSON), replaced atomically (temporary file, rename). A
//! run that stores the state holds an advisory `flock` on `<dir>/.state.lock`
//! from loading to storing ([`StateFile::load_to_store`]), so that two writers
//! (two output files, or `--stdout --write-state` next to the timer's run)
//! take turns instead of storing totals computed from the same previous state.
//! It belongs to one boot and one driver version. The format before the
//! schema (version 1, `v1`) is read once, on the upgrade, and replaced.
//!
//! The state decides what the exporter publishes as fact (running totals), so
//! it is used only if nobody but the running user and root can have written it
//! (OpenSSH's `StrictModes`, [`untrusted_dir`], [`untrusted_file`]): the
//! directory is owned by the running user or root and neither group- nor
//! world-writable (a sticky world-writable directory such as /tmp included:
//! others could create the state's names first); the file is a regular file
//! with the same owners and modes. Nothing is stored in a directory that fails
//! this. Its parent directories are not checked.
//!
//! Bounds: the file is read only up to [`MAX_SIZE`], what [`MAX_GPUS`] GPUs
//! can need, so a planted file cannot cost the run more than a little memory;
//! a file holding more than the bounds ([`MAX_GPUS`] GPUs, [`MAX_XID_SERIES`]
//! XID series, [`MAX_FIXED`] fixed readings a GPU) is damaged. What is stored
//! never exceeds them: a bound costs totals (left out, `state_ok 0`), never
//! the kernel log's position, so nothing is ever counted twice.
//!
//! State is an optimisation of truth, never a condition for a snapshot:
//! [`StateFile::load`], [`StateFile::load_to_store`] and [`StateFile::store`]
//! never fail the run, and every access to the directory is bounded by the
//! run's deadline (a frozen or hung file system costs the state, not the
//! snapshot). A missing, corrupt, truncated, foreign-version, other-boot,
//! untrusted, locked or unanswered file gives an empty [`State`] and a
//! [`Problem`] that the run shows as `nvidia_gpu_collector_state_ok 0` and one
//! line on stderr.

pub mod schema;
mod v1;

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::fsutil::{self, FileError, Replace};
use crate::snapshot::{Device, KnownGpu};
use schema::{State, XidCounts, XidTotals, VERSION};

/// The state file's name inside the state directory.
const FILE_NAME: &str = "state";

/// The lock file's name inside the state directory.
const LOCK_NAME: &str = ".state.lock";

/// The start of a temporary state file's name (it ends in `.tmp`).
const TEMP_PREFIX: &str = ".state.";

/// The most GPUs a state keeps (more than any host has).
pub const MAX_GPUS: usize = 64;

/// The most XID series (GPU or bus id, and code) the totals keep, and a
/// recount beside them: 64 GPUs with 64 distinct codes each in one boot.
pub const MAX_XID_SERIES: usize = 64 * MAX_GPUS;

/// The most fixed readings one GPU keeps (its readers keep four).
pub const MAX_FIXED: usize = 32;

/// How long a file system that works may take to answer beyond a wait for
/// the lock: loading gives up then.
const ANSWER: Duration = Duration::from_millis(100);

/// A state file larger than this is not ours: the bounds above with long
/// identifiers as long as NVML's fit in it.
pub const MAX_SIZE: u64 = 2 << 20;

/// Why the previous state could not be used, or this run's not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// No state file yet: the first run, or a new state directory.
    Missing,
    /// The file is not a state file of a version this exporter reads, or is
    /// damaged.
    Corrupt(String),
    /// The file was written during another boot: its counters and timestamps
    /// mean nothing now.
    OtherBoot,
    /// The state could not be read or written.
    Io(String),
    /// The directory or the file could have been written by another user
    /// (see the module's rule); the state is neither used nor stored.
    Untrusted(String),
    /// Another run held the state's lock until this run's wait ended; the
    /// state is neither used nor stored.
    Busy(PathBuf),
    /// The state directory did not answer by the deadline (a frozen or hung
    /// file system): `what` is what the run was doing.
    TimedOut(&'static str),
    /// More than the bounds would have been stored: what was left out.
    Bounded(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => f.write_str("no state yet (first run with this state directory)"),
            Problem::Corrupt(why) => {
                write!(f, "the state file is unusable ({why}); starting afresh")
            }
            Problem::OtherBoot => {
                f.write_str("the state file is from another boot; starting afresh")
            }
            Problem::Io(why) => f.write_str(why),
            Problem::Untrusted(why) => write!(
                f,
                "the state is not trusted: {why}; starting afresh. Only the running user \
                 or root may be able to write the state directory and file (owner, and no \
                 group or world write permission)"
            ),
            Problem::Busy(lock) => write!(
                f,
                "another run held {} until this run stopped waiting; this run neither \
                 uses nor stores the state",
                lock.display()
            ),
            Problem::TimedOut(what) => write!(
                f,
                "the state directory did not answer in time while {what} (a frozen or \
                 hung file system?); this run's totals are left out or not stored"
            ),
            Problem::Bounded(what) => write!(f, "the state keeps no more: {what}"),
        }
    }
}

impl From<FileError> for Problem {
    fn from(error: FileError) -> Self {
        Problem::Io(error.to_string())
    }
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StateDir { dir: dir.into() }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Why the directory is not trusted, if it is not; a directory that does
    /// not exist (yet) is not a problem here.
    fn check_dir(&self) -> Result<(), Problem> {
        match fs::metadata(&self.dir) {
            Ok(metadata) => match untrusted_dir(&metadata) {
                Some(why) => Err(Problem::Untrusted(format!(
                    "the state directory {} is {why}; nothing is stored in it",
                    self.dir.display()
                ))),
                None => Ok(()),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Problem::Io(format!(
                "cannot inspect {}: {e}",
                self.dir.display()
            ))),
        }
    }

    /// Creates the directory if it is missing: systemd's StateDirectory=
    /// creates it for the service; a run by hand creates the last component
    /// itself, like systemd would (mode 0755 whatever the umask allows more).
    /// An existing directory is left alone (no mkdir, which waits on a
    /// frozen file system even when the directory exists).
    fn create(&self) -> Result<(), Problem> {
        if self.dir.is_dir() {
            return Ok(());
        }
        match fs::DirBuilder::new().mode(0o755).create(&self.dir) {
            Ok(()) => log::info!("created the state directory {}", self.dir.display()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(Problem::Io(format!(
                    "cannot create the state directory {}: {e}",
                    self.dir.display()
                )))
            }
        }
        Ok(())
    }

    /// Takes the state's lock, creating the directory if need be, waiting
    /// until `until`; `Busy` if another run still holds it then. The lock is
    /// released when the file returned is dropped (or its process dies).
    pub fn lock(&self, until: Instant) -> Result<File, Problem> {
        self.create()?;
        self.check_dir()?;
        let path = self.dir.join(LOCK_NAME);
        fsutil::lock_by(&path, until)?.ok_or(Problem::Busy(path))
    }

    /// Removes the temporary files of runs killed while storing. Call it
    /// holding the lock: every writer holds it while its temporary file
    /// exists, so any other is stale.
    fn remove_stale_temp_files(&self) {
        match fsutil::remove_temp_files(&self.dir, TEMP_PREFIX, |_| true) {
            Ok(0) => {}
            Ok(n) => log::info!(
                "removed {n} temporary state file(s) left by killed runs in {}",
                self.dir.display()
            ),
            Err(error) => log::warn!("{error}"),
        }
    }

    /// The state the previous run left for this boot, or why there is none.
    pub fn load(&self, boot_id: &str) -> Result<State, Problem> {
        self.check_dir()?;
        let path = self.path();
        let text = match read_trusted(&path) {
            Ok(text) => text,
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Problem::Missing)
            }
            Err(ReadError::Io(e)) => {
                return Err(Problem::Io(format!("cannot read {}: {e}", path.display())))
            }
            Err(ReadError::Untrusted(why)) => {
                return Err(Problem::Untrusted(format!(
                    "{} is {why}; this run replaces it",
                    path.display()
                )))
            }
        };
        let state = parse(&text).map_err(Problem::Corrupt)?;
        if state.boot_id != boot_id {
            return Err(Problem::OtherBoot);
        }
        Ok(state)
    }

    /// Replaces the state file with `state`, atomically.
    pub fn store(&self, state: &State) -> Result<(), Problem> {
        let text = render(state)?;
        self.create()?;
        self.check_dir()?;
        // No fsync: the state belongs to one boot, so after a crash of the
        // machine it is discarded anyway, and a rename is atomic for every
        // reader while the machine runs. Syncing would only add a wait on the
        // disk to every run.
        let how = Replace {
            temp_prefix: TEMP_PREFIX,
            mode: 0o644,
            sync: false,
        };
        fsutil::replace(&self.dir, FILE_NAME, text.as_bytes(), how)?;
        Ok(())
    }
}

/// The text of `state`; an error if it would exceed [`MAX_SIZE`] (only
/// identifiers far longer than NVML's can make it).
fn render(state: &State) -> Result<String, Problem> {
    let mut text = serde_json::to_string(state)
        .map_err(|e| Problem::Io(format!("cannot encode the state: {e}")))?;
    text.push('\n');
    if text.len() as u64 > MAX_SIZE {
        return Err(Problem::Bounded(format!(
            "the state would be {} bytes, more than {MAX_SIZE}; not stored",
            text.len()
        )));
    }
    Ok(text)
}

/// Parses a state file of this version (or of version 1, converted); the
/// error says what is wrong with it.
fn parse(text: &str) -> Result<State, String> {
    if text.starts_with(v1::MAGIC) {
        return v1::parse(text).and_then(within_bounds);
    }
    /// The one field every version has.
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let version: Version =
        serde_json::from_str(text).map_err(|e| format!("not a state file: {e}"))?;
    if version.version != VERSION {
        return Err(format!("version {} is not {VERSION}", version.version));
    }
    let state: State = serde_json::from_str(text).map_err(|e| e.to_string())?;
    within_bounds(state)
}

/// `state` if it holds no more than what is ever stored.
fn within_bounds(state: State) -> Result<State, String> {
    if state.gpus.len() > MAX_GPUS {
        return Err(format!("more than {MAX_GPUS} GPUs"));
    }
    if let Some((uuid, _)) = state
        .gpus
        .iter()
        .find(|(_, gpu)| gpu.fixed.len() > MAX_FIXED)
    {
        return Err(format!("more than {MAX_FIXED} fixed readings for {uuid}"));
    }
    let xid = &state.xid;
    if xid.totals.series() > MAX_XID_SERIES
        || xid
            .recount
            .as_ref()
            .is_some_and(|r| r.series() > MAX_XID_SERIES)
    {
        return Err(format!("more than {MAX_XID_SERIES} XID series"));
    }
    Ok(state)
}

/// Drops whole ids (SXids and unattributed bus ids first, then GPUs, the last first)
/// from `totals` until they hold at most [`MAX_XID_SERIES`] series; returns
/// how many ids were dropped.
fn shed(totals: &mut XidTotals) -> usize {
    let mut dropped = 0;
    while totals.series() > MAX_XID_SERIES {
        // Host-level series first (SXids, bus ids no GPU has), then GPUs.
        let popped = totals.sxids.pop().is_some()
            || totals.fallen_off_bus_unattributed.pop_last().is_some()
            || totals.unattributed.pop_last().is_some()
            || totals.gpus.pop_last().is_some()
            || totals.fallen_off_bus.pop_last().is_some();
        if !popped {
            break;
        }
        dropped += 1;
    }
    dropped
}

/// One run's use of the state file: what the previous run left, what this run
/// leaves, and whether both went right (`nvidia_gpu_collector_state_ok`).
#[derive(Debug)]
pub struct StateFile {
    dir: StateDir,
    previous: State,
    problem: Option<Problem>,
    /// The xid collector's counts for the next run, if it ran.
    xid_next: Option<XidCounts>,
    /// The state's lock, held until the run ends (or the store ends); `None`
    /// for a run that only reads the state, or did not get the lock
    /// ([`Self::store`] stores nothing then).
    lock: Option<File>,
}

impl StateFile {
    /// Loads the state of this boot from `dir` (giving up [`ANSWER`] after
    /// `until`), for a run that
    /// does not store it (`--stdout`): no lock, [`Self::store`] stores
    /// nothing. A problem is logged here, once: a missing state (the first
    /// run) at info level, anything else as a warning; the run goes on with
    /// an empty state.
    pub fn load(dir: StateDir, until: Instant) -> Self {
        let Some(boot_id) = boot_id() else {
            return Self::unknown_boot(dir);
        };
        let reading = dir.clone();
        let id = boot_id.clone();
        let loaded = fsutil::within(until + ANSWER, move || reading.load(&id))
            .unwrap_or(Err(Problem::TimedOut("reading the state")));
        Self::with(dir, boot_id, loaded, None)
    }

    /// Takes the state's lock, waiting until `until`, and loads the state of
    /// this boot from `dir`, for a run that stores it: the lock is held until
    /// this is dropped (or its store ends), so no other writer stores in
    /// between; temporary files of killed runs are removed. Without the lock
    /// (another run held it, the directory is untrusted, cannot be created or
    /// did not answer in time) the run goes on with an empty state and
    /// stores nothing.
    pub fn load_to_store(dir: StateDir, until: Instant) -> Self {
        let Some(boot_id) = boot_id() else {
            return Self::unknown_boot(dir);
        };
        let locking = dir.clone();
        let id = boot_id.clone();
        let taken = fsutil::within(until + ANSWER, move || {
            let lock = locking.lock(until)?;
            locking.remove_stale_temp_files();
            Ok((lock, locking.load(&id)))
        });
        match taken {
            Some(Ok((lock, loaded))) => Self::with(dir, boot_id, loaded, Some(lock)),
            Some(Err(problem)) => Self::with(dir, boot_id, Err(problem), None),
            None => Self::with(
                dir,
                boot_id,
                Err(Problem::TimedOut("taking the lock and reading the state")),
                None,
            ),
        }
    }

    /// A run whose boot id cannot be read: no state can be told to be this
    /// boot's, so none is used and (without the lock) none is stored.
    fn unknown_boot(dir: StateDir) -> Self {
        let problem = Problem::Io(
            "cannot read this boot's id (/proc/sys/kernel/random/boot_id); \
             the state is neither used nor stored"
                .into(),
        );
        log::warn!("{problem}");
        StateFile {
            dir,
            previous: State::default(),
            problem: Some(problem),
            xid_next: None,
            lock: None,
        }
    }

    fn with(
        dir: StateDir,
        boot_id: String,
        loaded: Result<State, Problem>,
        lock: Option<File>,
    ) -> Self {
        let (previous, problem) = match loaded {
            Ok(state) => (state, None),
            Err(problem) => {
                if problem == Problem::Missing {
                    log::info!("{problem}");
                } else {
                    log::warn!("{problem}");
                }
                let empty = State {
                    version: VERSION,
                    boot_id,
                    ..State::default()
                };
                (empty, Some(problem))
            }
        };
        StateFile {
            dir,
            previous,
            problem,
            xid_next: None,
            lock,
        }
    }

    /// What the previous run left (empty when it cannot be used).
    pub fn previous(&self) -> &State {
        &self.previous
    }

    /// Makes [`Self::store`] keep `counts` as the xid collector's.
    pub fn set_xid(&mut self, counts: XidCounts) {
        self.xid_next = Some(counts);
    }

    /// Whether the previous state was used and this run's was stored.
    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }

    /// Whether running totals continue this run: the previous state was used,
    /// or there was none to use (the first run of a boot, a damaged or
    /// another boot's file: the totals start at 0 and the next run continues
    /// them). False when a state may exist but this run cannot use it (another
    /// run holds its lock, it is untrusted, unreadable or did not answer in
    /// time, the boot id is unknown): totals published from 0 would read as a
    /// reset and then a jump when the next run continues the stored ones, so
    /// they are left out.
    pub fn continues_totals(&self) -> bool {
        matches!(
            self.problem,
            None | Some(Problem::Missing | Problem::Corrupt(_) | Problem::OtherBoot)
        )
    }

    /// The GPUs this boot has seen, for identities that cannot be read now.
    pub fn known_gpus(&self) -> Vec<KnownGpu> {
        self.previous
            .gpus
            .iter()
            .map(|(uuid, gpu)| KnownGpu {
                index: gpu.index,
                uuid: uuid.clone(),
                pci_bus_id: gpu.pci_bus_id.clone(),
                serial: gpu.serial.clone(),
            })
            .collect()
    }

    /// Stores what `devices` leave for the next run, read under
    /// `driver_version` (a driver change drops all but the identities and
    /// running totals), by `until`. A GPU that is down this run keeps what it
    /// had, so its running totals continue when it comes back; running
    /// totals a GPU did not carry this run (an engine not supported this run,
    /// a collector switched off for a while) are kept, so they never go back
    /// within a boot; GPUs not seen this run are kept (by UUID) for as long as
    /// this boot lasts, up to [`MAX_GPUS`] in all. Stores nothing without the
    /// state's lock.
    pub fn store(&mut self, devices: &[Device], driver_version: &str, until: Instant) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        match self.next(devices, driver_version) {
            Ok(next) => {
                let dir = self.dir.clone();
                // The lock goes with the store: held until it ends, even
                // past this run's deadline, so that no other run takes the
                // lock while this one's temporary file is being written.
                let stored = fsutil::within(until, move || {
                    let stored = dir.store(&next);
                    drop(lock);
                    stored
                });
                match stored {
                    Some(Ok(())) => {}
                    Some(Err(problem)) => self.fail(problem),
                    None => self.fail(Problem::TimedOut("storing the state")),
                }
            }
            Err(problem) => self.fail(problem),
        }
    }

    fn fail(&mut self, problem: Problem) {
        log::warn!("{problem}");
        self.problem = Some(problem);
    }

    /// The state this run leaves: the previous one with this run's readings
    /// merged in, within the bounds. An error when it cannot be (more GPUs
    /// seen this run than a state keeps); a bound that cost totals is logged
    /// and sets the problem, the state is stored all the same.
    fn next(&mut self, devices: &[Device], driver_version: &str) -> Result<State, Problem> {
        let mut next = self.previous.clone();
        next.version = VERSION;
        if next.driver_version != driver_version {
            for gpu in next.gpus.values_mut() {
                *gpu = gpu.after_driver_change();
            }
            next.driver_version = driver_version.to_owned();
        }
        if let Some(xid) = self.xid_next.take() {
            next.xid = xid;
        }
        for device in devices.iter().filter(|d| !d.uuid.is_empty()) {
            let before = next.gpus.remove(&device.uuid).unwrap_or_default();
            let mut gpu = match &device.state {
                Some(state) => {
                    let mut gpu = state.clone();
                    for (stream, carry) in &before.carries {
                        gpu.carries.entry(*stream).or_insert(*carry);
                    }
                    gpu
                }
                None => before.clone(),
            };
            gpu.index = device.index;
            let or_before =
                |read: &String, known: &String| if read.is_empty() { known } else { read }.clone();
            gpu.pci_bus_id = or_before(&device.pci_bus_id, &before.pci_bus_id);
            gpu.serial = or_before(&device.serial, &before.serial);
            while gpu.fixed.len() > MAX_FIXED {
                gpu.fixed.pop_last();
            }
            next.gpus.insert(device.uuid.clone(), gpu);
        }
        // Beyond what a state file may hold, GPUs not seen this run go first.
        let unseen: Vec<String> = next
            .gpus
            .keys()
            .filter(|uuid| !devices.iter().any(|d| &d.uuid == *uuid))
            .cloned()
            .collect();
        for uuid in unseen {
            if next.gpus.len() <= MAX_GPUS {
                break;
            }
            next.gpus.remove(&uuid);
        }
        if next.gpus.len() > MAX_GPUS {
            return Err(Problem::Bounded(format!(
                "{} GPUs, more than {MAX_GPUS}; not stored",
                next.gpus.len()
            )));
        }
        let dropped = shed(&mut next.xid.totals) + next.xid.recount.as_mut().map_or(0, shed);
        if dropped > 0 {
            // The kernel log's position is kept: these ids count from 0 again
            // (a reset), the others go on, and nothing is counted twice.
            self.fail(Problem::Bounded(format!(
                "the XID counts of {dropped} GPU(s) or bus id(s) beyond {MAX_XID_SERIES} \
                 series are dropped and start again at 0"
            )));
        }
        Ok(next)
    }
}

/// Why a file or directory that the running user did not write cannot be
/// trusted: `None` if it can.
fn untrusted_owner_or_mode(metadata: &fs::Metadata) -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if metadata.uid() != euid && metadata.uid() != 0 {
        return Some(format!(
            "owned by uid {}, neither the running user (uid {euid}) nor root",
            metadata.uid()
        ));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Some(format!("writable by others (mode {mode:04o})"));
    }
    None
}

/// Why the state directory cannot be trusted, if it cannot: it must be a
/// directory owned by the running user or root and writable by no one else
/// (sticky or not).
fn untrusted_dir(metadata: &fs::Metadata) -> Option<String> {
    if !metadata.is_dir() {
        return Some("not a directory".into());
    }
    untrusted_owner_or_mode(metadata)
}

/// Why the state file cannot be trusted, if it cannot: it must be a regular
/// file owned by the running user or root, writable by no one else, of at
/// most [`MAX_SIZE`] bytes.
fn untrusted_file(metadata: &fs::Metadata) -> Option<String> {
    if !metadata.is_file() {
        return Some("not a regular file".into());
    }
    if metadata.len() > MAX_SIZE {
        return Some(format!(
            "{} bytes long, more than the {MAX_SIZE} that {MAX_GPUS} GPUs need",
            metadata.len()
        ));
    }
    untrusted_owner_or_mode(metadata)
}

/// Why [`read_trusted`] gave nothing.
enum ReadError {
    Io(io::Error),
    Untrusted(String),
}

/// Reads the state file without following a symlink or blocking on a FIFO,
/// if it passes [`untrusted_file`]; never more than [`MAX_SIZE`] bytes.
fn read_trusted(path: &Path) -> Result<String, ReadError> {
    let file =
        fsutil::open_regular(path, OpenOptions::new().read(true), "open").map_err(|error| {
            match error {
                FileError::NotRegularFile(_) => {
                    ReadError::Untrusted("not a regular file (a symbolic link?)".into())
                }
                FileError::Io { source, .. } => ReadError::Io(source),
            }
        })?;
    let metadata = file.metadata().map_err(ReadError::Io)?;
    if let Some(why) = untrusted_file(&metadata) {
        return Err(ReadError::Untrusted(why));
    }
    let mut text = String::new();
    file.take(MAX_SIZE)
        .read_to_string(&mut text)
        .map_err(ReadError::Io)?;
    Ok(text)
}

/// The boot id of the running kernel, as the kernel writes it (with dashes);
/// `None` if it cannot be read or is not one. Without it nothing can be told
/// to belong to this boot: [`StateFile`] neither loads nor stores a state, and
/// the XID collector does not read the journal (whose `_BOOT_ID=` filter with
/// an empty id would match nothing) and reports its failure.
pub fn boot_id() -> Option<String> {
    boot_id_in(Path::new("/proc/sys/kernel/random/boot_id"))
}

/// The boot id in the file at `path`: 32 hex digits, dashes allowed.
fn boot_id_in(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let id = text.trim();
    let digits = id.chars().filter(char::is_ascii_hexdigit).count();
    (digits == 32 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::Permissions;
    use std::os::unix::fs::PermissionsExt;

    use schema::{Carry, GpuState, Stream};

    fn sample() -> State {
        let mut gpu = GpuState {
            index: 1,
            pci_bus_id: "00000000:17:00.0".into(),
            reads_us: Some(98),
            ..GpuState::default()
        };
        gpu.carries.insert(
            Stream::Gpu,
            Carry {
                last_us: 1_700_000_000_000_000,
                ..Carry::default()
            },
        );
        gpu.fixed.insert("threshold.shutdown".into(), None);
        let mut state = State {
            version: VERSION,
            boot_id: "b0".into(),
            driver_version: "580.1".into(),
            ..State::default()
        };
        state.xid.cursor = Some("s=ab;i=1;b=cd x".into());
        state.gpus.insert("GPU-a".into(), gpu);
        state
    }

    #[test]
    fn a_boot_id_that_cannot_be_read_is_unknown_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        assert_eq!(boot_id_in(&path), None);
        for bad in [
            "",
            "\n",
            "not-a-boot-id\n",
            "0123456789abcdef0123456789abcdef00\n",
        ] {
            fs::write(&path, bad).unwrap();
            assert_eq!(boot_id_in(&path), None, "{bad:?}");
        }
        fs::write(&path, "5c1d5e8a-3f1b-4c2e-9a7d-0e6b2f4a8c10\n").unwrap();
        assert_eq!(
            boot_id_in(&path).as_deref(),
            Some("5c1d5e8a-3f1b-4c2e-9a7d-0e6b2f4a8c10")
        );
        assert!(boot_id().is_some(), "this machine's boot id reads");
    }

    #[test]
    fn round_trips() {
        assert_eq!(parse(&render(&sample()).unwrap()), Ok(sample()));
    }

    #[test]
    fn damaged_and_foreign_files_are_refused_with_a_reason() {
        let text = render(&sample()).unwrap();
        assert!(parse(&text[..text.len() - 8]).is_err());
        assert!(parse("garbage\n").is_err());
        let newer = text.replacen("\"version\":2", "\"version\":3", 1);
        assert!(parse(&newer).unwrap_err().contains("version"), "{newer}");
        let wrong_type = text.replacen("\"reads_us\":98", "\"reads_us\":\"x\"", 1);
        assert!(parse(&wrong_type).is_err());
    }

    #[test]
    fn load_and_store_through_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let states = StateDir::new(dir.path());
        assert_eq!(states.load("b0"), Err(Problem::Missing));
        states.store(&sample()).unwrap();
        assert_eq!(states.load("b0"), Ok(sample()));
        assert_eq!(states.load("b1"), Err(Problem::OtherBoot));
        fs::write(
            dir.path().join("state"),
            "{\"version\":2,\"boot_id\":\"b0\"",
        )
        .unwrap();
        assert!(matches!(states.load("b0"), Err(Problem::Corrupt(_))));
        let created = StateDir::new(dir.path().join("created"));
        created.store(&sample()).unwrap();
        assert_eq!(created.load("b0"), Ok(sample()));
        let missing = StateDir::new(dir.path().join("absent/deeper"));
        assert!(matches!(missing.store(&sample()), Err(Problem::Io(_))));
    }

    /// The largest state the bounds allow, with identifiers as long as NVML's
    /// (a UUID buffer is 96 bytes).
    fn largest() -> State {
        let long = |n: usize| format!("{n:0>95}");
        let mut state = sample();
        state.gpus.clear();
        let mut xid = XidTotals::default();
        for n in 0..MAX_XID_SERIES {
            xid.gpus.entry(long(n)).or_default().insert(9999, 1 << 32);
        }
        state.xid.totals = xid.clone();
        state.xid.recount = Some(xid);
        state.xid.cursor = Some("x".repeat(8 << 10));
        for n in 0..MAX_GPUS {
            let mut gpu = GpuState {
                pci_bus_id: long(n),
                serial: long(n),
                ..sample().gpus["GPU-a"].clone()
            };
            gpu.fixed.clear();
            for f in 0..MAX_FIXED {
                gpu.fixed.insert(long(f), Some(i64::MAX));
            }
            state.gpus.insert(long(n), gpu);
        }
        state
    }

    #[test]
    fn the_largest_state_the_bounds_allow_fits_and_no_more_is_read() {
        let text = render(&largest()).unwrap();
        assert!(text.len() as u64 <= MAX_SIZE, "{} bytes", text.len());
        assert!(parse(&text) == Ok(largest()), "not read back");
        let mut more = largest();
        more.gpus.insert("GPU-65".into(), GpuState::default());
        assert!(parse(&render(&more).unwrap()).unwrap_err().contains("GPUs"));
        let mut more = largest();
        more.xid
            .totals
            .gpus
            .entry("GPU-a".into())
            .or_default()
            .insert(1, 1);
        assert!(parse(&render(&more).unwrap()).unwrap_err().contains("XID"));
        let mut more = largest();
        let fixed = &mut more.gpus.values_mut().next().unwrap().fixed;
        fixed.insert("one more".into(), None);
        assert!(parse(&render(&more).unwrap())
            .unwrap_err()
            .contains("fixed"));
    }

    #[test]
    fn a_bound_drops_totals_never_the_position() {
        let mut memory = StateFile {
            dir: StateDir::new("/nonexistent"),
            previous: sample(),
            problem: None,
            xid_next: None,
            lock: None,
        };
        let mut counts = largest().xid;
        counts
            .totals
            .unattributed
            .entry("00000000:3B:00".into())
            .or_default()
            .insert(13, 1);
        memory.set_xid(counts.clone());
        let next = memory.next(&[], "580.1").unwrap();
        assert_eq!(next.xid.cursor, counts.cursor);
        assert!(
            next.xid.totals.unattributed.is_empty(),
            "the unattributed go first"
        );
        assert_eq!(next.xid.totals.gpus, counts.totals.gpus);
        assert!(matches!(memory.problem, Some(Problem::Bounded(_))));
        assert!(within_bounds(next).is_ok());
    }

    #[test]
    fn a_second_writer_waits_for_the_lock_then_neither_uses_nor_stores() {
        let dir = tempfile::tempdir().unwrap();
        let states = StateDir::new(dir.path());
        let far = || Instant::now() + Duration::from_secs(5);
        let mut first = StateFile::load_to_store(states.clone(), Instant::now());
        first.store(&[], "580", far());
        let stored = fs::read_to_string(dir.path().join("state")).unwrap();
        // The first store gave its lock back; the second run holds it now.
        let holder = StateFile::load_to_store(states.clone(), Instant::now());
        assert!(holder.lock.is_some());
        let started = Instant::now();
        let until = started + Duration::from_millis(100);
        let mut second = StateFile::load_to_store(states.clone(), until);
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(matches!(second.problem, Some(Problem::Busy(_))));
        second.store(&[], "999", far());
        assert_eq!(
            fs::read_to_string(dir.path().join("state")).unwrap(),
            stored
        );
        drop(holder);
        let third = StateFile::load_to_store(states, Instant::now());
        assert!(third.ok());
    }

    #[test]
    fn only_states_no_other_user_can_write_are_used() {
        let dir = tempfile::tempdir().unwrap();
        let states = StateDir::new(dir.path().join("state"));
        states.store(&sample()).unwrap();
        let mode = |path: &Path, mode: u32| {
            fs::set_permissions(path, Permissions::from_mode(mode)).unwrap();
        };
        assert_eq!(states.load("b0"), Ok(sample()));
        let file = dir.path().join("state/state");
        mode(&file, 0o646);
        assert!(matches!(states.load("b0"), Err(Problem::Untrusted(_))));
        mode(&file, 0o644);
        for writable in [0o775, 0o757, 0o1777] {
            mode(states.dir.as_path(), writable);
            assert!(matches!(states.load("b0"), Err(Problem::Untrusted(_))));
            assert!(matches!(
                states.store(&sample()),
                Err(Problem::Untrusted(_))
            ));
        }
        mode(states.dir.as_path(), 0o755);
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &file).unwrap();
        assert!(matches!(states.load("b0"), Err(Problem::Untrusted(_))));
    }

    #[test]
    fn running_totals_not_carried_again_are_kept_the_rest_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let carry = |last_us| Carry {
            last_us,
            ..Carry::default()
        };
        let device = |carries: &[(Stream, u64)], gpm: Option<&str>| Device {
            uuid: "GPU-a".into(),
            state: Some(GpuState {
                carries: carries.iter().map(|&(s, last)| (s, carry(last))).collect(),
                gpm_unavailable: gpm.map(str::to_owned),
                ..GpuState::default()
            }),
            ..Device::default()
        };
        let far = || Instant::now() + Duration::from_secs(5);
        let mut memory = StateFile::load_to_store(StateDir::new(dir.path()), far());
        let first = device(&[(Stream::Gpu, 1), (Stream::Decoder, 3)], Some("paused"));
        memory.store(&[first], "580", far());
        drop(memory);
        let mut memory = StateFile::load_to_store(StateDir::new(dir.path()), far());
        memory.store(&[device(&[(Stream::Gpu, 5)], None)], "580", far());
        let gpu = &StateDir::new(dir.path())
            .load(&boot_id().unwrap())
            .unwrap()
            .gpus["GPU-a"];
        let carries: Vec<(Stream, u64)> =
            gpu.carries.iter().map(|(s, c)| (*s, c.last_us)).collect();
        assert_eq!(carries, [(Stream::Gpu, 5), (Stream::Decoder, 3)]);
        assert_eq!(gpu.gpm_unavailable, None);
    }
}
