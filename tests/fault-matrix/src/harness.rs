//! Running the exporter and looking at what it left: processes, mounts and the
//! scratch directory (cleaned up by [`cleanup`], also on SIGTERM/SIGHUP), the
//! checks every row shares, a concurrent reader of the file, and inotify.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::exposition::{self, Samples, Series};

pub const OUT_FILE: &str = "nvidia_gpu.prom";
pub const LOCK_FILE: &str = ".nvidia_gpu.prom.lock";
/// Values that differ from run to run, compared by presence only. Whether a run
/// had the previous run's state depends on the row's history.
const VOLATILE: [&str; 4] = [
    "nvidia_gpu_collector_duration_seconds",
    "nvidia_gpu_collector_step_duration_seconds",
    "nvidia_gpu_collector_timestamp_seconds",
    "nvidia_gpu_collector_state_ok",
];

/// Why a row did not pass.
#[derive(Debug)]
pub enum Fail {
    /// An expectation did not hold; the outcome is what was seen, if known.
    Failed(String, Option<String>),
    /// The row cannot run here (not root, a tool missing).
    Skipped(String),
}

pub type R<T> = Result<T, Fail>;

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Fail {
        Fail::Failed(format!("harness error: {e}"), None)
    }
}

pub fn fail<T>(message: String) -> R<T> {
    Err(Fail::Failed(message, None))
}

/// `expect!(condition, "message {}", x)`: the row fails with the message.
macro_rules! expect {
    ($cond:expr, $($msg:tt)+) => {
        let ok: bool = $cond;
        if !ok {
            return $crate::harness::fail(format!($($msg)+));
        }
    };
}

pub fn short(text: &str, n: usize) -> String {
    text.trim().chars().take(n).collect()
}

// ---------------------------------------------------------------------------
// Cleanup of everything this run creates.

struct Janitor {
    pids: Vec<(u32, bool)>, // live children, and whether each leads its own process group
    mounts: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

static JANITOR: Mutex<Janitor> = Mutex::new(Janitor {
    pids: Vec::new(),
    mounts: Vec::new(),
    dirs: Vec::new(),
});

fn janitor() -> std::sync::MutexGuard<'static, Janitor> {
    JANITOR.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn remove_at_exit(dir: &Path) {
    janitor().dirs.push(dir.to_path_buf());
}

/// Kills the children still running, unmounts, removes the scratch directory.
pub fn cleanup() {
    let mut j = janitor();
    for (pid, group) in j.pids.drain(..).rev() {
        let pid = pid as i32;
        // SAFETY: signals to a child of ours that has not been reaped.
        unsafe { libc::kill(if group { -pid } else { pid }, libc::SIGKILL) };
    }
    for path in std::mem::take(&mut j.mounts).iter().rev() {
        umount_quietly(path);
    }
    for dir in j.dirs.drain(..).rev() {
        let _ = fs::remove_dir_all(dir);
    }
}

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_signal(sig: i32) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// SIGTERM and SIGHUP end the matrix through [`cleanup`], so no mount is left.
/// (A handler, not a blocked mask: children inherit a mask, and the exporter
/// must see SIGTERM; exec resets handlers.)
pub fn clean_up_on_signals() {
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, note_signal as *const () as libc::sighandler_t) };
    }
    thread::spawn(|| loop {
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            cleanup();
            std::process::exit(128 + sig);
        }
        thread::sleep(Duration::from_millis(50));
    });
}

fn umount_quietly(path: &Path) {
    let quiet = |args: &[&str]| {
        Command::new("umount")
            .args(args)
            .arg(path)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !quiet(&[]) {
        quiet(&["-l"]);
    }
}

pub fn mount_tmpfs(path: &Path, size: &str) -> R<()> {
    fs::create_dir_all(path)?;
    let opts = format!("size={size},mode=0755");
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
        .arg(path)
        .output()?;
    expect!(
        out.status.success(),
        "mount tmpfs: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    janitor().mounts.push(path.to_path_buf());
    Ok(())
}

pub fn umount(path: &Path) {
    let mut j = janitor();
    if let Some(i) = j.mounts.iter().position(|m| m == path) {
        j.mounts.remove(i);
        umount_quietly(path);
    }
}

/// A child process, killed when dropped while still running.
pub struct Proc {
    pub child: Child,
    group: bool,
    pub rc: Option<i32>,
}

impl Proc {
    pub fn spawn(cmd: &mut Command, group: bool) -> R<Proc> {
        if group {
            cmd.process_group(0);
        }
        let child = cmd.spawn()?;
        janitor().pids.push((child.id(), group));
        Ok(Proc {
            child,
            group,
            rc: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, as a negative signal number when killed; `None` while it runs.
    pub fn poll(&mut self) -> Option<i32> {
        if self.rc.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.reaped(status);
            }
        }
        self.rc
    }

    fn reaped(&mut self, status: std::process::ExitStatus) {
        let pid = self.child.id();
        janitor().pids.retain(|(p, _)| *p != pid);
        self.rc = Some(
            status
                .code()
                .unwrap_or_else(|| -status.signal().unwrap_or(0)),
        );
    }

    pub fn signal(&mut self, sig: i32) {
        if self.poll().is_none() {
            let pid = self.pid() as i32;
            // SAFETY: our unreaped child (or its process group).
            unsafe { libc::kill(if self.group { -pid } else { pid }, sig) };
        }
    }

    pub fn wait(&mut self, limit: f64) -> R<i32> {
        let deadline = Instant::now() + Duration::from_secs_f64(limit);
        loop {
            if let Some(rc) = self.poll() {
                return Ok(rc);
            }
            if Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                return fail(format!(
                    "a process was still running after {limit} s (killed)"
                ));
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.poll().is_none() {
            self.signal(libc::SIGKILL);
            if let Ok(status) = self.child.wait() {
                self.reaped(status);
            }
        }
    }
}

pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

pub fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------
// What a file says.

/// `promtool check metrics`'s complaints about the file ("" when silent).
pub fn promtool(path: &Path) -> R<String> {
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(File::open(path)?)
        .output()?;
    let mut text = String::from_utf8_lossy(&[out.stdout, out.stderr].concat())
        .trim()
        .to_string();
    if !out.status.success() && text.is_empty() {
        text = format!("promtool exit {}", out.status);
    }
    Ok(text)
}

/// {gpu index: {series without gpu/uuid: value}} and the host-wide samples.
pub fn gpus(samples: &Samples) -> (BTreeMap<String, Samples>, Samples) {
    let (mut per_gpu, mut host) = (BTreeMap::<String, Samples>::new(), Samples::new());
    for (s, &v) in samples {
        match s.label("gpu") {
            Some(gpu) => per_gpu
                .entry(gpu.to_string())
                .or_default()
                .insert(s.without(&["gpu", "uuid"]), v),
            None => host.insert(s.clone(), v),
        };
    }
    (per_gpu, host)
}

/// The failure reasons the file names, e.g. `["timeout"]` or `["gpu2:gpu_lost"]`.
pub fn reasons(samples: &Samples) -> Vec<String> {
    let mut out = Vec::new();
    for (s, &v) in samples {
        let reason = s.label("reason").unwrap_or_default();
        if s.name == "nvidia_gpu_collector_error" && v == 1.0 {
            out.push(reason.to_string());
        }
        if s.name == "nvidia_gpu_down_reason" && v == 1.0 {
            out.push(format!(
                "gpu{}:{reason}",
                s.label("gpu").unwrap_or_default()
            ));
        }
    }
    out
}

pub fn collector_up(samples: &Samples) -> Option<f64> {
    samples
        .get(&Series::new("nvidia_gpu_collector_up", &[]))
        .copied()
}

pub type Keys = BTreeSet<Series>;

pub fn keys(samples: &Samples) -> Keys {
    samples.keys().cloned().collect()
}

/// The pid in a temporary file's name `.nvidia_gpu.prom.<pid>.<random>.tmp`.
pub fn temp_pid(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix(".nvidia_gpu.prom.")?
        .strip_suffix(".tmp")?;
    let (pid, random) = rest.split_once('.')?;
    let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (digits && !random.is_empty() && !random.contains('.')).then(|| pid.parse().ok())?
}

pub fn temp_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.retain(|n| temp_pid(n).is_some());
    names.sort();
    names
}

pub fn load(path: &Path) -> R<Samples> {
    let data = fs::read(path)?;
    exposition::parse_bytes(&data)
        .or_else(|e| fail(format!("{OUT_FILE} is not a complete exposition file: {e}")))
}

/// Parses the published file, runs promtool and, for a failed run, checks that
/// only collector series with the one expected reason are left.
pub fn check_file(path: &Path, failure: Option<&str>) -> R<Samples> {
    expect!(path.exists(), "{OUT_FILE} does not exist");
    let samples = load(path)?;
    let complaints = promtool(path)?;
    expect!(
        complaints.is_empty(),
        "promtool check metrics: {}",
        short(&complaints, 300)
    );
    let up = collector_up(&samples);
    expect!(up.is_some(), "no nvidia_gpu_collector_up");
    if let Some(failure) = failure {
        expect!(up == Some(0.0), "nvidia_gpu_collector_up is not 0");
        let foreign: BTreeSet<&str> = samples
            .keys()
            .filter(|s| !s.name.starts_with("nvidia_gpu_collector_") || s.label("gpu").is_some())
            .map(|s| s.name.as_str())
            .collect();
        expect!(
            foreign.is_empty(),
            "series other than the collector's survived the failure: {foreign:?}"
        );
        let errors: Vec<&Series> = samples
            .keys()
            .filter(|s| s.name == "nvidia_gpu_collector_error")
            .collect();
        expect!(
            errors.len() == 1,
            "{} nvidia_gpu_collector_error series",
            errors.len()
        );
        let reason = errors[0].label("reason");
        expect!(
            reason == Some(failure) && samples[errors[0]] == 1.0,
            "reason={reason:?}, expected {failure:?}"
        );
    } else {
        expect!(
            up == Some(1.0),
            "nvidia_gpu_collector_up is {up:?}, reason {:?}",
            reasons(&samples)
        );
    }
    let left = temp_files(path.parent().unwrap_or(Path::new(".")));
    expect!(left.is_empty(), "temporary files left: {left:?}");
    Ok(samples)
}

/// Same series and, except run timings, the same values.
pub fn compare(actual: &Samples, expected: &Samples, what: &str) -> R<()> {
    let missing: Vec<_> = expected
        .keys()
        .filter(|s| !actual.contains_key(s))
        .collect();
    let extra: Vec<_> = actual
        .keys()
        .filter(|s| !expected.contains_key(s))
        .collect();
    expect!(
        missing.is_empty(),
        "{what}: missing {} series, e.g. {}",
        missing.len(),
        missing[0]
    );
    expect!(
        extra.is_empty(),
        "{what}: {} unexpected series, e.g. {}",
        extra.len(),
        extra[0]
    );
    for (s, v) in expected {
        let a = actual[s];
        expect!(
            VOLATILE.contains(&s.name.as_str()) || a == *v,
            "{what}: {s} is {a}, expected {v}"
        );
    }
    Ok(())
}

pub fn file_id(path: &Path) -> Option<(u64, i64, i64, u64)> {
    fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

// ---------------------------------------------------------------------------
// A reader that reads the file as fast as it can, on its own thread (a second
// CPU), and checks that every read is one of the complete files it expects.

#[derive(Default)]
pub struct ReaderStats {
    pub reads: usize,
    pub missing: usize,
    pub bad: Vec<String>,
    pub seen: BTreeMap<String, usize>,
    pub first: BTreeMap<String, Vec<u8>>,
}

pub struct Reader {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<ReaderStats>,
}

impl Reader {
    pub fn start(path: PathBuf, kinds: Vec<(String, Keys)>) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut st = ReaderStats::default();
            while !flag.load(Ordering::Relaxed) {
                let Ok(data) = fs::read(&path) else {
                    st.missing += 1;
                    continue;
                };
                st.reads += 1;
                let why = match exposition::parse_bytes(&data) {
                    Err(e) => format!("{e}; {} bytes, ends {:?}", data.len(), tail(&data)),
                    Ok(samples) => {
                        let got = keys(&samples);
                        if let Some((kind, _)) = kinds.iter().find(|(_, k)| *k == got) {
                            *st.seen.entry(kind.clone()).or_default() += 1;
                            st.first.entry(kind.clone()).or_insert(data);
                            continue;
                        }
                        let some: Vec<String> = got.iter().take(2).map(|s| s.to_string()).collect();
                        format!("a parseable file with {} series that is no complete render (e.g. {some:?})", got.len())
                    }
                };
                if st.bad.len() < 5 {
                    st.bad.push(format!("read {}: {why}", st.reads));
                }
            }
            st
        });
        Reader { stop, thread }
    }

    pub fn finish(self) -> R<ReaderStats> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .or_else(|_| fail("the reader thread panicked".into()))
    }
}

fn tail(data: &[u8]) -> String {
    String::from_utf8_lossy(&data[data.len().saturating_sub(60)..]).into_owned()
}

pub fn check_reader(work: &Path, stats: &ReaderStats, allow_missing: bool) -> R<()> {
    expect!(stats.reads > 0, "the reader never read the file");
    expect!(
        stats.bad.is_empty(),
        "the reader saw {}+ incomplete files: {}",
        stats.bad.len(),
        stats.bad[0]
    );
    expect!(
        allow_missing || stats.missing == 0,
        "the file was missing {} times",
        stats.missing
    );
    for (kind, data) in &stats.first {
        let path = work.join(format!("reader-{kind}.prom"));
        fs::write(&path, data)?;
        let complaints = promtool(&path)?;
        expect!(
            complaints.is_empty(),
            "promtool on a {kind} file the reader saw: {}",
            short(&complaints, 200)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// inotify, to kill a run while its temporary file exists (between create and rename).

/// Sends `sig` to `proc` as soon as it creates its temporary file; true if it did.
pub fn kill_on_temp_create(dir: &Path, proc: &mut Proc, sig: i32, limit: f64) -> R<bool> {
    // SAFETY: plain system calls on a descriptor we own and close below.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(Fail::Skipped(format!(
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        )));
    }
    let result = watch(fd, dir, proc, sig, limit);
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    result
}

fn watch(fd: i32, dir: &Path, proc: &mut Proc, sig: i32, limit: f64) -> R<bool> {
    let cdir = CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|e| Fail::Failed(e.to_string(), None))?;
    // SAFETY: a valid descriptor and NUL-terminated path.
    if unsafe { libc::inotify_add_watch(fd, cdir.as_ptr(), libc::IN_CREATE) } < 0 {
        return Err(Fail::Skipped(format!(
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        )));
    }
    let deadline = Instant::now() + Duration::from_secs_f64(limit);
    let mut buf = vec![0u8; 65536];
    let header = std::mem::size_of::<libc::inotify_event>();
    while proc.poll().is_none() && Instant::now() < deadline {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd; then a read into our buffer.
        let n = unsafe {
            if libc::poll(&mut pfd, 1, 50) <= 0 {
                continue;
            }
            libc::read(fd, buf.as_mut_ptr().cast(), buf.len())
        };
        let mut i = 0;
        while n > 0 && i + header <= n as usize {
            let len =
                u32::from_ne_bytes(buf[i + 12..i + 16].try_into().unwrap_or_default()) as usize;
            let name = &buf[i + header..(i + header + len).min(n as usize)];
            let name = String::from_utf8_lossy(name)
                .trim_end_matches('\0')
                .to_string();
            i += header + len;
            if temp_pid(&name) == Some(proc.pid()) {
                proc.signal(sig);
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A small deterministic generator (splitmix64) for the random kill moments.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, high).
    pub fn uniform(&mut self, high: f64) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * high
    }

    pub fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// A counter for unique log file names.
pub static LOGS: AtomicUsize = AtomicUsize::new(0);
