//! The only code that touches the state directory: what one short-lived run
//! remembers for the next.
//!
//! One small versioned text file, `<dir>/state`, replaced atomically (temporary
//! file, rename). A run that stores the state holds an advisory `flock` on
//! `<dir>/.state.lock` from loading to storing ([`Memory::load_to_store`]), so
//! that two writers (two output files, or `--stdout --write-state` next to the
//! timer's run) take turns instead of storing totals computed from the same
//! previous state. It belongs to one boot and one driver version, and holds
//! per GPU (by UUID) its identity (index, PCI bus id, serial) and the readers'
//! own entries (`key value`), plus host-wide entries.
//!
//! The state decides what the exporter publishes as fact (running totals), so
//! it is used only if nobody but the running user and root can have written it
//! (OpenSSH's `StrictModes`, [`untrusted_dir`], [`untrusted_file`]): the
//! directory is owned by the running user or root and neither group- nor
//! world-writable (a sticky world-writable directory such as /tmp included:
//! others could create the state's names first); the file is a regular file
//! with the same owners and modes. Nothing is stored in a directory that fails
//! this. Its parent directories are not checked. The file is read only up to
//! [`MAX_SIZE`], what [`MAX_GPUS`] GPUs can need, so a planted file cannot cost
//! the run more than a little memory.
//!
//! State is an optimisation of truth, never a condition for a snapshot:
//! [`Memory::load`] and [`Memory::load_to_store`] never fail the run. A
//! missing, corrupt, truncated, foreign-version, other-boot, untrusted or
//! locked file gives an empty [`State`] and a
//! [`Problem`] that the run shows as `nvidia_gpu_collector_state_ok 0` and one
//! line on stderr.
//!
//! Format (version 1), one record per line, fields separated by one space, the
//! last field running to the end of the line:
//! ```text
//! nvidia-textfile-exporter-state 1
//! boot <boot id>
//! driver <driver version>
//! host <key> <value>
//! gpu <uuid> <index> <pci bus id or -> <serial or ->
//! set <uuid> <key> <value>
//! end <number of lines before this one>
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::snapshot::{Device, KnownGpu};

/// The first line of every state file; the number is the format's version.
const MAGIC: &str = "nvidia-textfile-exporter-state 1";

/// The state file's name inside the state directory.
const FILE_NAME: &str = "state";

/// The lock file's name inside the state directory.
const LOCK_NAME: &str = ".state.lock";

/// The most GPUs a state remembers (more than any host has).
pub const MAX_GPUS: usize = 64;

/// The most entries one GPU keeps (its readers write about ten).
const MAX_GPU_ENTRIES: usize = 32;

/// The most host-wide entries (XID counts per GPU and code among them).
const MAX_HOST_ENTRIES: usize = 16 * MAX_GPUS;

/// The longest line (a journal cursor, the longest value, is about 120 bytes).
const MAX_LINE: usize = 256;

/// The most lines a state file has: magic, boot, driver, host entries, per
/// GPU its line and entries, end.
const MAX_LINES: usize = 3 + MAX_HOST_ENTRIES + MAX_GPUS * (1 + MAX_GPU_ENTRIES) + 1;

/// A state file larger than this is not ours (about 800 kB).
const MAX_SIZE: u64 = (MAX_LINES * MAX_LINE) as u64;

/// Entries under keys starting with this belong to the boot, not to the
/// driver: they are kept when the driver changes (running totals the exporter
/// integrates itself from wall-clock-stamped samples, which a driver reload
/// does not invalidate; see `nvml::window`).
pub const BOOT_PREFIX: &str = "boot.";

/// Whether the entry `key` lasts the boot (a running total), rather than only
/// the driver it was read under.
pub fn lasts_the_boot(key: &str) -> bool {
    key.starts_with(BOOT_PREFIX)
}

/// What the previous run left for one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuState {
    pub index: u32,
    /// `00000000:17:00.0`; empty when it could not be read.
    pub pci_bus_id: String,
    /// Empty when the GPU has none or it could not be read.
    pub serial: String,
    /// Readers' entries, e.g. the last sample timestamp they consumed.
    pub entries: BTreeMap<String, String>,
}

/// Everything one run remembers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// `/proc/sys/kernel/random/boot_id` of the boot that wrote it.
    pub boot_id: String,
    /// The NVIDIA driver version it was written under; empty if unknown.
    pub driver_version: String,
    /// Host-wide entries (a journal cursor, say).
    pub host: BTreeMap<String, String>,
    /// Per GPU, by UUID.
    pub gpus: BTreeMap<String, GpuState>,
}

/// Why the previous state could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// No state file yet: the first run, or a new state directory.
    Missing,
    /// The file is not a state file of this version, or is damaged.
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
        }
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
    fn create(&self) -> Result<(), Problem> {
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
        let io_problem = |e: io::Error| Problem::Io(format!("cannot lock {}: {e}", path.display()));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io_problem)?;
        if !file.metadata().map_err(io_problem)?.is_file() {
            return Err(Problem::Io(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(fs::TryLockError::WouldBlock) if Instant::now() < until => {
                    thread::sleep(Duration::from_millis(20));
                }
                Err(fs::TryLockError::WouldBlock) => return Err(Problem::Busy(path)),
                Err(fs::TryLockError::Error(e)) => return Err(io_problem(e)),
            }
        }
    }

    /// The state the previous run left for this boot, or an empty state and
    /// why it is empty.
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
        let io_problem = |action: &str, e: io::Error| {
            Problem::Io(format!(
                "cannot {action} the state in {}: {e}",
                self.dir.display()
            ))
        };
        self.create()?;
        self.check_dir()?;
        let mut temp = tempfile::Builder::new()
            .prefix(".state.")
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(|e| io_problem("create", e))?;
        let file = temp.as_file_mut();
        // No fsync: the state belongs to one boot, so after a crash of the
        // machine it is discarded anyway, and a rename is atomic for every
        // reader while the machine runs. Syncing would only add a wait on the
        // disk to every run.
        file.write_all(render(state).as_bytes())
            .and_then(|()| file.set_permissions(Permissions::from_mode(0o644)))
            .map_err(|e| io_problem("write", e))?;
        temp.persist(self.path())
            .map_err(|e| io_problem("replace", e.error))?;
        Ok(())
    }
}

/// One run's use of the state: what the previous run left, what this run
/// leaves, and whether both went right (`nvidia_gpu_collector_state_ok`).
#[derive(Debug)]
pub struct Memory {
    dir: StateDir,
    previous: State,
    problem: Option<Problem>,
    /// Host entries this run replaces, by key prefix (see [`Self::replace_host`]).
    host_next: Vec<(String, BTreeMap<String, String>)>,
    /// The state's lock, held until the run ends; `None` for a run that only
    /// reads the state, or did not get the lock ([`Self::store`] stores
    /// nothing then).
    lock: Option<File>,
}

impl Memory {
    /// Loads the state of this boot from `dir`, for a run that does not store
    /// it (`--stdout`): no lock, [`Self::store`] stores nothing. A problem is
    /// logged here, once: a missing state (the first run) at info level,
    /// anything else as a warning; the run goes on with an empty state.
    pub fn load(dir: StateDir) -> Self {
        let Some(boot_id) = boot_id() else {
            return Self::unknown_boot(dir);
        };
        let loaded = dir.load(&boot_id);
        Self::with(dir, boot_id, loaded, None)
    }

    /// Takes the state's lock, waiting until `until`, and loads the state of
    /// this boot from `dir`, for a run that stores it: the lock is held until
    /// this memory is dropped, so no other writer stores in between. Without
    /// the lock (another run held it, the directory is untrusted or cannot be
    /// created) the run goes on with an empty state and stores nothing.
    pub fn load_to_store(dir: StateDir, until: Instant) -> Self {
        let Some(boot_id) = boot_id() else {
            return Self::unknown_boot(dir);
        };
        match dir.lock(until) {
            Ok(lock) => {
                let loaded = dir.load(&boot_id);
                Self::with(dir, boot_id, loaded, Some(lock))
            }
            Err(problem) => Self::with(dir, boot_id, Err(problem), None),
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
        Memory {
            dir,
            previous: State::default(),
            problem: Some(problem),
            host_next: Vec::new(),
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
                    boot_id,
                    ..State::default()
                };
                (empty, Some(problem))
            }
        };
        Memory {
            dir,
            previous,
            problem,
            host_next: Vec::new(),
            lock,
        }
    }

    /// The host-wide entries the previous run left.
    pub fn host(&self) -> &BTreeMap<String, String> {
        &self.previous.host
    }

    /// Makes [`Self::store`] replace every host entry whose key starts with
    /// `prefix` by `entries` (whose keys all start with it); entries of other
    /// prefixes are kept. Host entries survive a driver change: they do not
    /// come from the driver.
    pub fn replace_host(&mut self, prefix: &str, entries: BTreeMap<String, String>) {
        debug_assert!(entries.keys().all(|key| key.starts_with(prefix)));
        self.host_next.push((prefix.to_owned(), entries));
    }

    /// Whether the previous state was used and this run's was stored.
    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }

    /// Whether running totals continue this run: the previous state was used,
    /// or there was none to use (the first run of a boot, a damaged or
    /// another boot's file: the totals start at 0 and the next run continues
    /// them). False when a state may exist but this run cannot use it (another
    /// run holds its lock, it is untrusted or unreadable, the boot id is
    /// unknown): totals published from 0 would read as a reset and then a jump
    /// when the next run continues the stored ones, so they are left out.
    pub fn continues_totals(&self) -> bool {
        matches!(
            self.problem,
            None | Some(Problem::Missing | Problem::Corrupt(_) | Problem::OtherBoot)
        )
    }

    /// The readers' entries per GPU UUID, and the driver they belong to.
    pub fn entries(&self) -> (BTreeMap<String, BTreeMap<String, String>>, String) {
        let entries = self
            .previous
            .gpus
            .iter()
            .map(|(uuid, gpu)| (uuid.clone(), gpu.entries.clone()))
            .collect();
        (entries, self.previous.driver_version.clone())
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
    /// `driver_version` (a driver change drops all but the [`BOOT_PREFIX`]
    /// entries). A GPU that is down this run keeps the entries it had,
    /// so its running totals continue when it comes back; GPUs not seen this
    /// run are kept (by UUID) for as long as this boot lasts, up to
    /// [`MAX_GPUS`] in all. Stores nothing without the state's lock.
    pub fn store(&mut self, devices: &[Device], driver_version: &str) {
        if self.lock.is_none() {
            return;
        }
        let mut next = self.previous.clone();
        if next.driver_version != driver_version {
            for gpu in next.gpus.values_mut() {
                gpu.entries.retain(|key, _| lasts_the_boot(key));
            }
            next.driver_version = driver_version.to_owned();
        }
        for (prefix, entries) in &self.host_next {
            next.host.retain(|key, _| !key.starts_with(prefix.as_str()));
            next.host.extend(entries.clone());
        }
        for device in devices.iter().filter(|d| !d.uuid.is_empty()) {
            let gpu = next.gpus.entry(device.uuid.clone()).or_default();
            gpu.index = device.index;
            if !device.pci_bus_id.is_empty() {
                gpu.pci_bus_id.clone_from(&device.pci_bus_id);
            }
            if !device.serial.is_empty() {
                gpu.serial.clone_from(&device.serial);
            }
            if !device.remembered.is_empty() {
                // Running totals (`boot.` entries) that this run did not write
                // again (an engine not supported this run, a collector switched
                // off for a while) are kept, so they never go back within a
                // boot; other entries are this run's alone.
                gpu.entries
                    .retain(|key, _| lasts_the_boot(key) && !device.remembered.contains_key(key));
                gpu.entries.extend(device.remembered.clone());
            }
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
        if let Err(problem) = self.dir.store(&next) {
            log::warn!("{problem}");
            self.problem = Some(problem);
        }
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
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => ReadError::Untrusted("a symbolic link".into()),
            _ => ReadError::Io(e),
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
/// to belong to this boot: [`Memory`] neither loads nor stores a state, and
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

/// A field that must be one word: non-empty, no whitespace.
fn word(value: &str) -> bool {
    !value.is_empty() && !value.contains(char::is_whitespace)
}

/// The text of `state`. Entries whose key is not one word or whose value holds
/// a line break are left out (readers only store numbers and cursors).
pub fn render(state: &State) -> String {
    let mut lines = vec![
        MAGIC.to_owned(),
        format!("boot {}", state.boot_id),
        format!("driver {}", state.driver_version),
    ];
    // What `parse` would refuse is left out: entries beyond the limits, lines
    // longer than MAX_LINE.
    let fine = |key: &str, value: &str| word(key) && !value.contains(['\n', '\r']);
    let short = |line: &String| line.len() <= MAX_LINE;
    lines.extend(
        state
            .host
            .iter()
            .filter(|(key, value)| fine(key, value))
            .map(|(key, value)| format!("host {key} {value}"))
            .filter(short)
            .take(MAX_HOST_ENTRIES),
    );
    let or_dash = |text: &str| {
        if word(text) {
            text.to_owned()
        } else {
            "-".into()
        }
    };
    let gpus = state.gpus.iter().filter_map(|(uuid, gpu)| {
        let line = format!(
            "gpu {uuid} {} {} {}",
            gpu.index,
            or_dash(&gpu.pci_bus_id),
            or_dash(&gpu.serial)
        );
        (word(uuid) && short(&line)).then_some((uuid, gpu, line))
    });
    for (uuid, gpu, line) in gpus.take(MAX_GPUS) {
        lines.push(line);
        lines.extend(
            gpu.entries
                .iter()
                .filter(|(key, value)| fine(key, value))
                .map(|(key, value)| format!("set {uuid} {key} {value}"))
                .filter(short)
                .take(MAX_GPU_ENTRIES),
        );
    }
    let count = lines.len();
    lines.push(format!("end {count}"));
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// Parses a state file; the error says what is wrong with it.
pub fn parse(text: &str) -> Result<State, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some(MAGIC) => {}
        Some(first) if first.starts_with("nvidia-textfile-exporter-state ") => {
            return Err(format!("version {:?} is not 1", &first[31..]))
        }
        _ => return Err("not a state file".into()),
    }
    if !text.ends_with('\n') {
        return Err("truncated".into());
    }
    let mut state = State::default();
    let mut count = 1;
    let mut ended = false;
    for line in lines {
        if ended {
            return Err("text after the end line".into());
        }
        // Limits before anything is kept: a file within MAX_SIZE could
        // otherwise hold hundreds of thousands of tiny lines.
        if count >= MAX_LINES {
            return Err(format!("more than {MAX_LINES} lines"));
        }
        if line.len() > MAX_LINE {
            return Err(format!("a line longer than {MAX_LINE} bytes"));
        }
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "boot" => state.boot_id = rest.to_owned(),
            "driver" => state.driver_version = rest.to_owned(),
            "host" => {
                let (key, value) = rest.split_once(' ').ok_or("a host line without a value")?;
                if state.host.len() >= MAX_HOST_ENTRIES {
                    return Err(format!("more than {MAX_HOST_ENTRIES} host entries"));
                }
                state.host.insert(key.to_owned(), value.to_owned());
            }
            "gpu" => {
                let fields: Vec<&str> = rest.split(' ').collect();
                let [uuid, index, bus, serial] = fields[..] else {
                    return Err(format!("bad gpu line {line:?}"));
                };
                if state.gpus.len() >= MAX_GPUS {
                    return Err(format!("more than {MAX_GPUS} GPUs"));
                }
                let undash = |text: &str| {
                    if text == "-" {
                        String::new()
                    } else {
                        text.to_owned()
                    }
                };
                state.gpus.insert(
                    uuid.to_owned(),
                    GpuState {
                        index: index
                            .parse()
                            .map_err(|_| format!("bad index in {line:?}"))?,
                        pci_bus_id: undash(bus),
                        serial: undash(serial),
                        entries: BTreeMap::new(),
                    },
                );
            }
            "set" => {
                let mut fields = rest.splitn(3, ' ');
                let (Some(uuid), Some(key), Some(value)) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    return Err(format!("bad set line {line:?}"));
                };
                let gpu = state
                    .gpus
                    .get_mut(uuid)
                    .ok_or_else(|| format!("an entry for an unlisted GPU {uuid:?}"))?;
                if gpu.entries.len() >= MAX_GPU_ENTRIES {
                    return Err(format!("more than {MAX_GPU_ENTRIES} entries for {uuid}"));
                }
                gpu.entries.insert(key.to_owned(), value.to_owned());
            }
            "end" => {
                if rest.parse() != Ok(count) {
                    return Err("truncated (line count does not match)".into());
                }
                ended = true;
                continue;
            }
            _ => return Err(format!("unknown line {line:?}")),
        }
        count += 1;
    }
    if !ended {
        return Err("truncated (no end line)".into());
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        let mut gpu = GpuState {
            index: 1,
            pci_bus_id: "00000000:17:00.0".into(),
            serial: String::new(),
            entries: BTreeMap::new(),
        };
        gpu.entries
            .insert("utilization.last_us".into(), "1700000000000000".into());
        let mut state = State {
            boot_id: "b0".into(),
            driver_version: "580.1".into(),
            ..State::default()
        };
        state
            .host
            .insert("xid.cursor".into(), "s=ab;i=1;b=cd x".into());
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
        assert_eq!(parse(&render(&sample())), Ok(sample()));
    }

    #[test]
    fn damaged_files_are_refused_with_a_reason() {
        let text = render(&sample());
        let truncated = &text[..text.len() - 8];
        assert!(parse(truncated).unwrap_err().contains("truncated"));
        let without_end: String = text.lines().take(4).map(|l| format!("{l}\n")).collect();
        assert!(parse(&without_end).unwrap_err().contains("truncated"));
        assert!(parse("garbage\n").is_err());
        let newer = text.replacen("state 1", "state 2", 1);
        assert!(parse(&newer).unwrap_err().contains("version"));
        let orphan = text.replace("set GPU-a", "set GPU-b");
        assert!(parse(&orphan).is_err());
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
            "nvidia-textfile-exporter-state 1\nboot b0\n",
        )
        .unwrap();
        assert!(matches!(states.load("b0"), Err(Problem::Corrupt(_))));
        let created = StateDir::new(dir.path().join("created"));
        created.store(&sample()).unwrap();
        assert_eq!(created.load("b0"), Ok(sample()));
        let missing = StateDir::new(dir.path().join("absent/deeper"));
        assert!(matches!(missing.store(&sample()), Err(Problem::Io(_))));
    }

    #[test]
    fn no_more_is_read_than_64_gpus_need_and_no_more_is_written() {
        let mut big = sample();
        for n in 0..=MAX_GPUS {
            let mut gpu = GpuState::default();
            for e in 0..=MAX_GPU_ENTRIES {
                gpu.entries.insert(format!("k{e}"), "v".into());
            }
            big.gpus.insert(format!("GPU-{n}"), gpu);
        }
        for h in 0..=MAX_HOST_ENTRIES {
            big.host.insert(format!("h{h}"), "v".into());
        }
        big.host.insert("long".into(), "x".repeat(MAX_LINE));
        let text = render(&big);
        assert!(text.len() as u64 <= MAX_SIZE);
        let read = parse(&text).unwrap();
        assert_eq!(read.gpus.len(), MAX_GPUS);
        assert!(read
            .gpus
            .values()
            .all(|g| g.entries.len() == MAX_GPU_ENTRIES));
        assert_eq!(read.host.len(), MAX_HOST_ENTRIES);

        // What render leaves out, a planted file cannot make parse keep.
        let with_lines = |extra: &str, count: usize| {
            let mut lines: Vec<String> = render(&sample()).lines().map(str::to_owned).collect();
            lines.pop();
            lines.extend((0..count).map(|n| extra.replace('N', &n.to_string())));
            lines.push(format!("end {}", lines.len()));
            lines.join("\n") + "\n"
        };
        let gpus = parse(&with_lines("gpu GPU-N 0 - -", MAX_GPUS)).unwrap_err();
        assert!(gpus.contains("GPUs"), "{gpus}");
        let entries = parse(&with_lines("set GPU-a kN v", MAX_GPU_ENTRIES)).unwrap_err();
        assert!(entries.contains("entries"), "{entries}");
        let lines = parse(&with_lines("host kN v", MAX_LINES)).unwrap_err();
        assert!(lines.contains("lines") || lines.contains("host"), "{lines}");
        let long = parse(&with_lines(&format!("host k {}", "x".repeat(MAX_LINE)), 1));
        assert!(long.unwrap_err().contains("longer"));
    }

    #[test]
    fn a_second_writer_waits_for_the_lock_then_neither_uses_nor_stores() {
        let dir = tempfile::tempdir().unwrap();
        let states = StateDir::new(dir.path());
        let mut first = Memory::load_to_store(states.clone(), Instant::now());
        first.store(&[], "580");
        let stored = fs::read_to_string(dir.path().join("state")).unwrap();
        let started = Instant::now();
        let until = started + Duration::from_millis(100);
        let mut second = Memory::load_to_store(states.clone(), until);
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(matches!(second.problem, Some(Problem::Busy(_))));
        second.store(&[], "999");
        assert_eq!(
            fs::read_to_string(dir.path().join("state")).unwrap(),
            stored
        );
        drop(first);
        let third = Memory::load_to_store(states, Instant::now());
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
    fn running_totals_not_written_again_are_kept_other_entries_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let device = |entries: &[(&str, &str)]| Device {
            uuid: "GPU-a".into(),
            remembered: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Device::default()
        };
        let until = Instant::now();
        let mut memory = Memory::load_to_store(StateDir::new(dir.path()), until);
        memory.store(
            &[device(&[
                ("boot.util.gpu", "1 2"),
                ("boot.util.decoder", "3 4"),
                ("gpm.reason", "x"),
            ])],
            "580",
        );
        drop(memory);
        let mut memory = Memory::load_to_store(StateDir::new(dir.path()), until);
        memory.store(&[device(&[("boot.util.gpu", "5 6")])], "580");
        let entries = &StateDir::new(dir.path())
            .load(&boot_id().unwrap())
            .unwrap()
            .gpus["GPU-a"]
            .entries;
        let keys: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            keys,
            [("boot.util.decoder", "3 4"), ("boot.util.gpu", "5 6")]
        );
    }
}
