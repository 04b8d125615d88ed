//! The only code that touches the state directory: what one short-lived run
//! remembers for the next.
//!
//! One small versioned text file, `<dir>/state`, replaced atomically (temporary
//! file, rename) under the run's lock (`--stdout --write-state` takes no lock:
//! of two overlapping writers the last wins, and each writes a whole state).
//! It belongs to one boot and one driver version, and holds per GPU (by UUID)
//! its identity (index, PCI bus id, serial) and the readers' own entries
//! (`key value`), plus host-wide entries.
//!
//! State is an optimisation of truth, never a condition for a snapshot:
//! [`load`] never fails the run. A missing, corrupt, truncated, foreign-version
//! or other-boot file gives an empty [`State`] and a [`Problem`] that the run
//! shows as `nvidia_gpu_collector_state_ok 0` and one line on stderr.
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
use std::fs::{self, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::snapshot::{Device, KnownGpu};

/// The first line of every state file; the number is the format's version.
const MAGIC: &str = "nvidia-textfile-exporter-state 1";

/// The state file's name inside the state directory.
const FILE_NAME: &str = "state";

/// A state file larger than this is not ours (a few hundred bytes per GPU).
const MAX_SIZE: u64 = 4 << 20;

/// Entries under keys starting with this belong to the boot, not to the
/// driver: they are kept when the driver changes (running totals the exporter
/// integrates itself from wall-clock-stamped samples, which a driver reload
/// does not invalidate; see `nvml::window`).
pub const BOOT_PREFIX: &str = "boot.";

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

    /// The state the previous run left for this boot, or an empty state and
    /// why it is empty.
    pub fn load(&self, boot_id: &str) -> Result<State, Problem> {
        let path = self.path();
        let text = match read_regular(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Problem::Missing),
            Err(e) => return Err(Problem::Io(format!("cannot read {}: {e}", path.display()))),
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
        match fs::create_dir(&self.dir) {
            // systemd's StateDirectory= creates it for the service; a run by
            // hand creates the last component itself, like systemd would.
            Ok(()) => log::info!("created the state directory {}", self.dir.display()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_problem("create the directory for", e)),
        }
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
}

impl Memory {
    /// Loads the state of this boot from `dir`. A problem is logged here, once:
    /// a missing state (the first run) at info level, anything else as a
    /// warning; the run goes on with an empty state.
    pub fn load(dir: StateDir) -> Self {
        let Some(boot_id) = boot_id() else {
            // A state cannot be told to be this boot's: none is used, and
            // `store` writes none (the empty boot id of `previous` says so).
            let problem = Problem::Io(
                "cannot read this boot's id (/proc/sys/kernel/random/boot_id); \
                 the state is neither used nor stored"
                    .into(),
            );
            log::warn!("{problem}");
            return Memory {
                dir,
                previous: State::default(),
                problem: Some(problem),
                host_next: Vec::new(),
            };
        };
        let (previous, problem) = match dir.load(&boot_id) {
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
    /// run are kept (by UUID) for as long as this boot lasts.
    pub fn store(&mut self, devices: &[Device], driver_version: &str) {
        if self.previous.boot_id.is_empty() {
            // The boot id is unknown (see `load`).
            return;
        }
        let mut next = self.previous.clone();
        if next.driver_version != driver_version {
            for gpu in next.gpus.values_mut() {
                gpu.entries.retain(|key, _| key.starts_with(BOOT_PREFIX));
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
                gpu.entries.retain(|key, _| {
                    key.starts_with(BOOT_PREFIX) && !device.remembered.contains_key(key)
                });
                gpu.entries.extend(device.remembered.clone());
            }
        }
        if let Err(problem) = self.dir.store(&next) {
            log::warn!("{problem}");
            self.problem = Some(problem);
        }
    }
}

/// Reads a regular file without following a symlink or blocking on a FIFO.
fn read_regular(path: &Path) -> io::Result<String> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() || metadata.len() > MAX_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file of a sensible size",
        ));
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
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
    let fine = |key: &str, value: &str| word(key) && !value.contains(['\n', '\r']);
    for (key, value) in &state.host {
        if fine(key, value) {
            lines.push(format!("host {key} {value}"));
        }
    }
    let or_dash = |text: &str| {
        if word(text) {
            text.to_owned()
        } else {
            "-".into()
        }
    };
    for (uuid, gpu) in &state.gpus {
        if !word(uuid) {
            continue;
        }
        lines.push(format!(
            "gpu {uuid} {} {} {}",
            gpu.index,
            or_dash(&gpu.pci_bus_id),
            or_dash(&gpu.serial)
        ));
        for (key, value) in &gpu.entries {
            if fine(key, value) {
                lines.push(format!("set {uuid} {key} {value}"));
            }
        }
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
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "boot" => state.boot_id = rest.to_owned(),
            "driver" => state.driver_version = rest.to_owned(),
            "host" => {
                let (key, value) = rest.split_once(' ').ok_or("a host line without a value")?;
                state.host.insert(key.to_owned(), value.to_owned());
            }
            "gpu" => {
                let fields: Vec<&str> = rest.split(' ').collect();
                let [uuid, index, bus, serial] = fields[..] else {
                    return Err(format!("bad gpu line {line:?}"));
                };
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
        let mut memory = Memory::load(StateDir::new(dir.path()));
        memory.store(
            &[device(&[
                ("boot.util.gpu", "1 2"),
                ("boot.util.decoder", "3 4"),
                ("gpm.reason", "x"),
            ])],
            "580",
        );
        let mut memory = Memory::load(StateDir::new(dir.path()));
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
