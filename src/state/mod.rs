//! The only code that touches the state directory: one file, `state`, in
//! the schema of [`schema::State`] (the previous release's format, `v1`, is
//! read once on the upgrade), replaced atomically under the lock
//! `.state.lock`. It is used only if no one but the running user and root can
//! have written it (like OpenSSH's `StrictModes`) and within the bounds, and
//! only by the run's deadline. It never fails the run: a [`Problem`] costs the
//! state, shown as `nvidia_gpu_collector_state_ok 0` and one line on stderr.
//! In parts: `store` (trust, the lock, bounded I/O; it knows no collector),
//! `codec` (the text: serde, the previous format, the bounds), `merge` (the
//! pure merge of the previous state with this run's readings), and here the
//! run's use of them ([`StateFile`]).

mod bounded;
mod codec;
mod merge;
mod problem;
pub mod schema;
mod store;
mod v1;

pub use problem::Problem;
pub use store::StateDir;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::Path;
use std::time::{Duration, Instant};

use log::Level;

use crate::fsutil;
use crate::snapshot::Device;
use schema::{GpuState, State, VERSION};

/// How long past the lock wait loading may take on a file system that works.
const ANSWER: Duration = Duration::from_millis(100);

/// One run's use of the state: what the previous run left, what this run
/// leaves, and whether both went right (`nvidia_gpu_collector_state_ok`).
#[derive(Debug)]
pub struct StateFile {
    dir: StateDir,
    previous: State,
    problem: Option<Problem>,
    /// What this run leaves, before the GPUs' readings are merged in: the
    /// previous state with the parts the host steps set.
    next: State,
    /// The lock, held from loading to storing; `None`: nothing is stored.
    lock: Option<File>,
}

impl StateFile {
    /// Loads this boot's state by `until` + `ANSWER`, with `to_store` under the
    /// lock taken by `until` (without it nothing is stored). A problem is
    /// logged here, once; the run goes on with an empty state.
    pub fn open(dir: StateDir, until: Instant, to_store: bool) -> Self {
        let boot = boot_id();
        let mut file = StateFile {
            dir: dir.clone(),
            previous: State {
                version: VERSION,
                boot_id: boot.clone().unwrap_or_default(),
                ..State::default()
            },
            problem: None,
            next: State::default(),
            lock: None,
        };
        let Some(boot_id) = boot else {
            file.fail(Problem::UnknownBoot);
            return file;
        };
        let taken = fsutil::within(until + ANSWER, move || {
            let lock = to_store.then(|| dir.lock(until)).transpose()?;
            Ok((lock, dir.load(&boot_id)))
        });
        let what = match to_store {
            true => "taking the lock and reading the state",
            false => "reading the state",
        };
        let (lock, loaded) = taken
            .unwrap_or(Err(Problem::TimedOut(what)))
            .unwrap_or_else(|problem| (None, Err(problem)));
        file.lock = lock;
        match loaded {
            Ok(state) => file.previous = state,
            Err(problem) => file.fail(problem),
        }
        file.next = file.previous.clone();
        file
    }

    /// What the previous run left (empty when it cannot be used).
    pub fn previous(&self) -> &State {
        &self.previous
    }

    /// What this run leaves for the next: a host step sets its part here.
    pub fn next(&mut self) -> &mut State {
        &mut self.next
    }

    /// Whether the previous state was used and this run's was stored.
    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }

    /// Whether running totals continue: false when a state may exist but
    /// cannot be used now (totals from 0 would read as a reset). A part kept
    /// within its bound this run (a flood of tasks) leaves the rest in use.
    pub fn continues_totals(&self) -> bool {
        matches!(
            self.problem,
            None | Some(
                Problem::Missing
                    | Problem::Corrupt(_)
                    | Problem::OtherBoot
                    | Problem::TooManyTasks(_)
            )
        )
    }

    /// Stores, by `until`, the previous state with `states` (by UUID) merged in.
    pub fn store(
        &mut self,
        devices: &[Device],
        states: &BTreeMap<String, GpuState>,
        driver_version: &str,
        until: Instant,
    ) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        let next = std::mem::take(&mut self.next);
        let next = match merge::merge(next, devices, states, driver_version) {
            Ok(next) => next,
            Err(problem) => return self.fail(problem),
        };
        let dir = self.dir.clone();
        // Held until the store ends, even past the deadline: no other run
        // takes the lock while the temporary file exists.
        let stored = fsutil::within(until, move || {
            let stored = dir.store(&next);
            drop(lock);
            stored
        });
        if let Err(problem) = stored.unwrap_or(Err(Problem::TimedOut("storing the state"))) {
            self.fail(problem);
        }
    }

    /// Marks the state this run leaves as not whole (`state_ok` 0) for a
    /// bound whose owner logs it once.
    pub fn bounded(&mut self, problem: Problem) {
        self.problem.get_or_insert(problem);
    }

    /// Logs `problem` (a missing state at info level) and keeps it.
    fn fail(&mut self, problem: Problem) {
        let missing = matches!(problem, Problem::Missing);
        log::log!(if missing { Level::Info } else { Level::Warn }, "{problem}");
        self.problem = Some(problem);
    }
}

/// The running kernel's boot id (with dashes), if it reads as one.
fn boot_id() -> Option<String> {
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
    use crate::fsutil::io_error;
    use crate::kernel_log::{Series, XidOf, MAX_SERIES as MAX_XID_SERIES};
    use codec::{parse, render};
    use problem::Distrust;
    use schema::Part;
    use schema::{Damage, MAX_FIXED, MAX_GPUS, MAX_LABELS, MAX_SIZE, MAX_UNSUPPORTED};
    use serde::{Deserialize, Serialize};
    use std::fs::Permissions;
    use std::io;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

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
        state.xid.position.cursor = Some("s=ab;i=1;b=cd x".into());
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
    fn every_problem_says_what_it_said_as_a_string() {
        let rule = "starting afresh. Only the running user or root may be able to write the \
                    state directory and file (owner, and no group or world write permission)";
        let dir = PathBuf::from("/var/lib/x");
        let io = io::Error::from(io::ErrorKind::PermissionDenied);
        let cases = [
            (
                Problem::Missing,
                "no state yet (first run with this state directory)".to_owned(),
            ),
            (
                Problem::Corrupt(Damage::XidCount("gpu.G.79".into(), "x".into())),
                "the state file is unusable (the XID count xid.gpu.G.79 is \"x\", not a number); \
                 starting afresh"
                    .into(),
            ),
            (
                Problem::OtherBoot,
                "the state file is from another boot; starting afresh".into(),
            ),
            (
                Problem::UnknownBoot,
                "cannot read this boot's id (/proc/sys/kernel/random/boot_id); the state is \
                 neither used nor stored"
                    .into(),
            ),
            (
                Problem::Io(io_error("read", &dir)(io)),
                "cannot read /var/lib/x: permission denied".into(),
            ),
            (
                Problem::UntrustedDir(dir.clone(), Distrust::Writable(0o1777)),
                format!(
                    "the state is not trusted: the state directory /var/lib/x is writable by \
                     others (mode 1777); nothing is stored in it; {rule}"
                ),
            ),
            (
                Problem::UntrustedFile(dir.join("state"), Distrust::Owner(7, 0)),
                format!(
                    "the state is not trusted: /var/lib/x/state is owned by uid 7, neither the \
                     running user (uid 0) nor root; this run replaces it; {rule}"
                ),
            ),
            (
                Problem::UntrustedFile(dir.join("state"), Distrust::TooLong(26 << 20)),
                format!(
                    "the state is not trusted: /var/lib/x/state is 27262976 bytes long, more \
                     than the 25165824 that 64 GPUs need; this run replaces it; {rule}"
                ),
            ),
            (
                Problem::Busy(dir.join(".state.lock")),
                "another run held /var/lib/x/.state.lock until this run stopped waiting; this \
                 run neither uses nor stores the state"
                    .into(),
            ),
            (
                Problem::TimedOut("storing the state"),
                "the state directory did not answer in time while storing the state (a frozen \
                 or hung file system?); this run's totals are left out or not stored"
                    .into(),
            ),
            (
                Problem::TooLarge(26 << 20),
                "the state keeps no more: the state would be 27262976 bytes, more than 25165824; \
                 not stored"
                    .into(),
            ),
            (
                Problem::TooManyGpus(65),
                "the state keeps no more: 65 GPUs, more than 64; not stored".into(),
            ),
        ];
        for (problem, text) in cases {
            assert_eq!(problem.to_string(), text);
        }
        let damages = [
            (Damage::Version(3), "version 3 is not 2"),
            (Damage::Gpus, "more than 64 GPUs"),
            (
                Damage::Fixed("GPU-a".into()),
                "more than 32 fixed readings for GPU-a",
            ),
            (Damage::XidSeries, "more than 4096 XID series"),
            (Damage::V1("not a state file"), "not a state file"),
            (Damage::V1("truncated"), "truncated"),
            (
                Damage::V1("truncated (line count does not match)"),
                "truncated (line count does not match)",
            ),
            (
                Damage::V1("truncated (no end line)"),
                "truncated (no end line)",
            ),
            (
                Damage::V1("text after the end line"),
                "text after the end line",
            ),
            (
                Damage::V1("a host line without a value"),
                "a host line without a value",
            ),
            (
                Damage::V1Line("bad gpu line", "gpu a".into()),
                "bad gpu line \"gpu a\"",
            ),
            (
                Damage::V1Line("bad index in", "gpu a x".into()),
                "bad index in \"gpu a x\"",
            ),
            (
                Damage::V1Line("bad set line", "set a".into()),
                "bad set line \"set a\"",
            ),
            (
                Damage::V1Line("unknown line", "x".into()),
                "unknown line \"x\"",
            ),
            (
                Damage::V1Line("an entry for an unlisted GPU", "GPU-b".into()),
                "an entry for an unlisted GPU \"GPU-b\"",
            ),
        ];
        for (damage, text) in damages {
            assert_eq!(damage.to_string(), text);
        }
        assert_eq!(Distrust::NotADirectory.to_string(), "not a directory");
        let not_regular = Distrust::NotARegularFile.to_string();
        assert_eq!(not_regular, "not a regular file (a symbolic link?)");
        let garbage = parse("garbage\n").unwrap_err().to_string();
        assert!(
            garbage.starts_with("not a state file: expected value"),
            "{garbage}"
        );
    }

    #[test]
    fn round_trips() {
        assert_eq!(parse(&render(&sample()).unwrap()).unwrap(), sample());
    }

    #[test]
    fn damaged_and_foreign_files_are_refused_with_a_reason() {
        let text = render(&sample()).unwrap();
        assert!(parse(&text[..text.len() - 8]).is_err());
        assert!(parse("garbage\n").is_err());
        let newer = text.replacen("\"version\":2", "\"version\":3", 1);
        assert!(
            parse(&newer).unwrap_err().to_string().contains("version"),
            "{newer}"
        );
        let wrong_type = text.replacen("\"reads_us\":98", "\"reads_us\":\"x\"", 1);
        assert!(parse(&wrong_type).is_err());
    }

    #[test]
    fn load_and_store_through_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let states = StateDir::new(dir.path());
        assert!(matches!(states.load("b0"), Err(Problem::Missing)));
        states.store(&sample()).unwrap();
        assert_eq!(states.load("b0").unwrap(), sample());
        assert!(matches!(states.load("b1"), Err(Problem::OtherBoot)));
        fs::write(
            dir.path().join("state"),
            "{\"version\":2,\"boot_id\":\"b0\"",
        )
        .unwrap();
        assert!(matches!(states.load("b0"), Err(Problem::Corrupt(_))));
        let created = StateDir::new(dir.path().join("created"));
        created.store(&sample()).unwrap();
        assert_eq!(created.load("b0").unwrap(), sample());
        let missing = StateDir::new(dir.path().join("absent/deeper"));
        assert!(matches!(missing.store(&sample()), Err(Problem::Io(_))));
    }

    /// A task ledger at its bounds, every holder a pod of the longest names.
    fn largest_ledger() -> crate::task::Ledger {
        use crate::owner::{kubernetes::Pod, Owner};
        use crate::task::ledger::{Holder, Totals, MAX_HOLDERS, MAX_PROCESSES};
        let name = |n: usize| format!("{n:a>253}");
        let totals = (0..MAX_HOLDERS)
            .map(|n| {
                let task = Owner::Pod(Pod {
                    uid: format!("{n:0>8}-0000-0000-0000-000000000000"),
                    namespace: Some(name(n)),
                    name: Some(name(n)),
                    container: Some(name(n)),
                });
                let max = Totals {
                    busy_us: u64::MAX,
                    energy_mj: u64::MAX,
                    held_us: u64::MAX,
                    allocated_us: u64::MAX,
                    memory_peak_bytes: u64::MAX,
                    xid_errors: u64::MAX,
                    seen_us: u64::MAX,
                    measured: true,
                };
                let gpu_instance_id = Some(u32::MAX);
                (
                    Holder {
                        task,
                        gpu_instance_id,
                    },
                    max,
                )
            })
            .collect();
        let processes = (0..MAX_PROCESSES)
            .map(|n| (u32::MAX, u64::MAX, n % MAX_HOLDERS))
            .collect();
        crate::task::Ledger {
            at_us: u64::MAX,
            energy_mj: Some(u64::MAX),
            unattributed_mj: u64::MAX,
            totals,
            processes,
            refused: true,
            xids: Some(u64::MAX),
        }
    }

    /// The largest state the bounds allow, with identifiers as long as NVML's
    /// (a UUID buffer is 96 bytes), one of its fixed readings labels.
    fn largest() -> State {
        let long = |n: usize| format!("{n:0>95}");
        let mut state = sample();
        state.gpus.clear();
        for n in 0..MAX_XID_SERIES {
            let id = XidOf::Gpu(long(n));
            state
                .xid
                .totals
                .0
                .insert(Series::Xid { id, code: 9999 }, 1 << 32);
        }
        state.xid.recount = Some(state.xid.totals.clone());
        state.xid.position.cursor = Some("x".repeat(8 << 10));
        for n in 0..MAX_GPUS {
            let mut gpu = GpuState {
                pci_bus_id: long(n),
                serial: long(n),
                ..sample().gpus["GPU-a"].clone()
            };
            gpu.tasks = largest_ledger();
            gpu.fixed.clear();
            for f in 1..MAX_FIXED {
                gpu.fixed.insert(long(f), Some(i64::MAX));
            }
            // One reader keeps labels (platform: 5 of them).
            let labels = Some(vec![long(0); MAX_LABELS]);
            gpu.fixed_labels.insert(long(0), labels);
            // A call's name (at most 42 bytes) with its arguments.
            let call = |c: usize| format!("{c:a>80}");
            gpu.unsupported.calls = (0..MAX_UNSUPPORTED).map(call).collect();
            state.gpus.insert(long(n), gpu);
        }
        state
    }

    #[test]
    fn the_largest_state_the_bounds_allow_fits_and_no_more_is_read() {
        let text = render(&largest()).unwrap();
        assert!(text.len() as u64 <= MAX_SIZE, "{} bytes", text.len());
        assert!(parse(&text).unwrap() == largest(), "not read back");
        let mut more = largest();
        more.gpus.insert("GPU-65".into(), GpuState::default());
        assert!(parse(&render(&more).unwrap())
            .unwrap_err()
            .to_string()
            .contains("GPUs"));
        let mut more = largest();
        let id = XidOf::Gpu("GPU-a".into());
        more.xid.totals.0.insert(Series::Xid { id, code: 1 }, 1);
        assert!(parse(&render(&more).unwrap())
            .unwrap_err()
            .to_string()
            .contains("XID"));
        let mut more = largest();
        let fixed = &mut more.gpus.values_mut().next().unwrap().fixed;
        fixed.insert("one more".into(), None);
        assert!(parse(&render(&more).unwrap())
            .unwrap_err()
            .to_string()
            .contains("fixed"));
    }

    /// `state` rendered is refused as damaged, the error naming `bound`.
    fn refused(state: &State, bound: &str) {
        let error = parse(&render(state).unwrap()).unwrap_err().to_string();
        assert!(error.contains(bound), "{error}, not {bound:?}");
    }

    /// Each collection of the state one element past its bound.
    #[test]
    fn every_collection_past_its_bound_is_damage() {
        use crate::owner::{session::User, Owner};
        use crate::task::ledger::{Holder, Totals, MAX_HOLDERS, MAX_PROCESSES};
        let with_gpu = |change: &dyn Fn(&mut GpuState)| {
            let mut state = sample();
            change(state.gpus.get_mut("GPU-a").unwrap());
            state
        };
        let mut gpus = sample();
        gpus.gpus = (0..=MAX_GPUS)
            .map(|n| (n.to_string(), GpuState::default()))
            .collect();
        refused(&gpus, "more than 64 GPUs");
        let fixed = |gpu: &mut GpuState| {
            gpu.fixed = (0..=MAX_FIXED).map(|n| (n.to_string(), None)).collect();
        };
        refused(&with_gpu(&fixed), "more than 32 fixed readings");
        let labelled = |gpu: &mut GpuState| {
            gpu.fixed.clear();
            let labels = Some(vec![String::new()]);
            let fixed = (0..=MAX_FIXED).map(|n| (n.to_string(), labels.clone()));
            gpu.fixed_labels = fixed.collect();
        };
        refused(&with_gpu(&labelled), "more than 32 fixed readings");
        let labels = |gpu: &mut GpuState| {
            let labels = Some(vec![String::new(); MAX_LABELS + 1]);
            gpu.fixed_labels.insert("platform".into(), labels);
        };
        refused(&with_gpu(&labels), "more than 8 labels of a fixed reading");
        let unsupported = |gpu: &mut GpuState| {
            let calls = (0..=MAX_UNSUPPORTED).map(|n| n.to_string());
            gpu.unsupported.calls = calls.collect();
        };
        refused(&with_gpu(&unsupported), "more than 256 unsupported calls");
        let parts = |gpu: &mut GpuState| {
            let kept = |n: usize| schema::Kept {
                across_drivers: false,
                value: serde_json::value::to_raw_value(&n).unwrap(),
            };
            gpu.parts = (0..=schema::MAX_PARTS)
                .map(|n| (n.to_string(), kept(n)))
                .collect();
        };
        refused(&with_gpu(&parts), "more than 8 parts");
        let long_part = |gpu: &mut GpuState| {
            let text = "x".repeat(schema::MAX_PART_BYTES);
            let value = serde_json::value::to_raw_value(&text).unwrap();
            let kept = schema::Kept {
                across_drivers: false,
                value,
            };
            gpu.parts.insert("test.long".into(), kept);
        };
        refused(&with_gpu(&long_part), "a part longer than 512 bytes");
        let holders = |gpu: &mut GpuState| {
            let holder = |n: usize| Holder {
                task: Owner::User(User {
                    name: n.to_string(),
                }),
                gpu_instance_id: None,
            };
            let totals = (0..=MAX_HOLDERS).map(|n| (holder(n), Totals::default()));
            gpu.tasks.totals = totals.collect();
        };
        refused(&with_gpu(&holders), "more than 256 task holders");
        let processes = |gpu: &mut GpuState| {
            gpu.tasks.processes = vec![(1, 1, 0); MAX_PROCESSES + 1];
        };
        refused(&with_gpu(&processes), "more than 1024 task processes");
        let series = |n| Series::Xid {
            id: XidOf::Gpu("GPU-a".into()),
            code: n,
        };
        let mut xids = sample();
        xids.xid.totals.0 = (0..=MAX_XID_SERIES as u32)
            .map(|n| (series(n), 1))
            .collect();
        refused(&xids, "more than 4096 XID series");
        let mut recount = sample();
        recount.xid.recount = Some(xids.xid.totals.clone());
        refused(&recount, "more than 4096 XID series");
    }

    /// A damaged file of the accepted size holding 1.3 million GPUs (each
    /// of them would take some 650 bytes read, 0.9 GB in all) is refused
    /// where its 65th GPU begins: no more of it is read.
    #[test]
    fn reading_stops_at_the_first_gpu_past_the_bound() {
        let gpus: String = (0..1_300_000).map(|n| format!("\"{n}\":{{}},")).collect();
        let text =
            format!("{{\"version\":2,\"boot_id\":\"b0\",\"gpus\":{{{gpus}\"end\":{{}}}}}}\n");
        assert!(text.len() as u64 <= MAX_SIZE, "{} bytes", text.len());
        let Err(Damage::Schema(error)) = parse(&text) else {
            panic!("not refused as damaged while read");
        };
        // The column (from 1) of the last character of the 65th GPU's key.
        let at_65th = text.find("\"64\":").unwrap() + "\"64\"".len();
        assert_eq!((error.line(), error.column()), (1, at_65th), "{error}");
        assert!(error.to_string().contains("more than 64 GPUs"), "{error}");
    }

    #[test]
    fn a_second_writer_waits_for_the_lock_then_neither_uses_nor_stores() {
        let dir = tempfile::tempdir().unwrap();
        let states = StateDir::new(dir.path());
        let far = || Instant::now() + Duration::from_secs(5);
        let mut first = StateFile::open(states.clone(), Instant::now(), true);
        first.store(&[], &BTreeMap::new(), "580", far());
        let stored = fs::read_to_string(dir.path().join("state")).unwrap();
        // The first store gave its lock back; the second run holds it now.
        let holder = StateFile::open(states.clone(), Instant::now(), true);
        assert!(holder.lock.is_some());
        let started = Instant::now();
        let until = started + Duration::from_millis(100);
        let mut second = StateFile::open(states.clone(), until, true);
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(matches!(second.problem, Some(Problem::Busy(_))));
        second.store(&[], &BTreeMap::new(), "999", far());
        assert_eq!(
            fs::read_to_string(dir.path().join("state")).unwrap(),
            stored
        );
        drop(holder);
        let third = StateFile::open(states, Instant::now(), true);
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
        assert_eq!(states.load("b0").unwrap(), sample());
        let file = dir.path().join("state/state");
        mode(&file, 0o646);
        assert!(matches!(
            states.load("b0"),
            Err(Problem::UntrustedFile(..) | Problem::UntrustedDir(..))
        ));
        mode(&file, 0o644);
        for writable in [0o775, 0o757, 0o1777] {
            mode(states.dir.as_path(), writable);
            assert!(matches!(
                states.load("b0"),
                Err(Problem::UntrustedFile(..) | Problem::UntrustedDir(..))
            ));
            assert!(matches!(
                states.store(&sample()),
                Err(Problem::UntrustedFile(..) | Problem::UntrustedDir(..))
            ));
        }
        mode(states.dir.as_path(), 0o755);
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &file).unwrap();
        assert!(matches!(
            states.load("b0"),
            Err(Problem::UntrustedFile(..) | Problem::UntrustedDir(..))
        ));
    }

    /// A collector's part, for the tests.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Seen(u32);

    impl Part for Seen {
        const NAME: &'static str = "test.seen";
    }

    #[test]
    fn running_totals_and_parts_not_set_again_are_kept_the_rest_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let carry = |last_us| Carry {
            last_us,
            ..Carry::default()
        };
        let device = Device {
            uuid: "GPU-a".into(),
            ..Device::default()
        };
        let left = |carries: &[(Stream, u64)], reads_us: Option<u64>, seen: Option<u32>| {
            let mut state = GpuState {
                carries: carries.iter().map(|&(s, last)| (s, carry(last))).collect(),
                reads_us,
                ..GpuState::default()
            };
            if let Some(seen) = seen {
                state.set_part(&Seen(seen));
            }
            BTreeMap::from([("GPU-a".to_owned(), state)])
        };
        let far = || Instant::now() + Duration::from_secs(5);
        let mut state_file = StateFile::open(StateDir::new(dir.path()), far(), true);
        let first = left(&[(Stream::Gpu, 1), (Stream::Decoder, 3)], Some(7), Some(4));
        state_file.store(std::slice::from_ref(&device), &first, "580", far());
        drop(state_file);
        let mut state_file = StateFile::open(StateDir::new(dir.path()), far(), true);
        let second = left(&[(Stream::Gpu, 5)], None, None);
        state_file.store(std::slice::from_ref(&device), &second, "580", far());
        let gpu = &StateDir::new(dir.path())
            .load(&boot_id().unwrap())
            .unwrap()
            .gpus["GPU-a"];
        let carries: Vec<(Stream, u64)> =
            gpu.carries.iter().map(|(s, c)| (*s, c.last_us)).collect();
        assert_eq!(carries, [(Stream::Gpu, 5), (Stream::Decoder, 3)]);
        assert_eq!((gpu.reads_us, gpu.part::<Seen>()), (None, Some(Seen(4))));
        // A part set again replaces; one of another shape reads as none.
        let mut state_file = StateFile::open(StateDir::new(dir.path()), far(), true);
        state_file.store(&[device], &left(&[], None, Some(9)), "580", far());
        let gpu = &StateDir::new(dir.path())
            .load(&boot_id().unwrap())
            .unwrap()
            .gpus["GPU-a"];
        assert_eq!(gpu.part::<Seen>(), Some(Seen(9)));
        #[derive(Debug, Serialize, Deserialize)]
        struct Other(String);
        impl Part for Other {
            const NAME: &'static str = "test.seen";
        }
        assert!(gpu.part::<Other>().is_none());
    }
}
