//! Running the exporter and looking at what it left: processes, mounts and the
//! scratch directory (cleaned up by [`cleanup`], also on SIGTERM/SIGHUP), the
//! checks every row shares, a concurrent reader of the file, and inotify.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{self};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::{self};
use std::time::{Duration, Instant};

pub use test_support::checks::{compare as compare_samples, keys, reasons};
use test_support::Samples;
pub use test_support::{temp_files, temp_pid, Proc, Reader, ReaderStats, LOCK_FILE, OUT_FILE};

/// Why a row did not pass.
#[derive(Debug)]
pub enum Fail {
    /// An expectation did not hold; the outcome is what was seen, if known.
    Failed(String, Option<String>),
    /// The row cannot run here (not root, a tool missing).
    Skipped(String),
}

pub type R<T> = Result<T, Fail>;

impl From<String> for Fail {
    fn from(e: String) -> Fail {
        Fail::Failed(e, None)
    }
}

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
    mounts: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

static JANITOR: Mutex<Janitor> = Mutex::new(Janitor {
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
    test_support::kill_all();
    let mut j = janitor();
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
    Ok(test_support::promtool(&fs::read(path)?)
        .err()
        .unwrap_or_default())
}

pub type Keys = BTreeSet<test_support::Series>;

/// The shared checks of a published file (test_support::checks::check_file).
pub fn check_file(path: &Path, failure: Option<&str>) -> R<Samples> {
    expect!(path.exists(), "{OUT_FILE} does not exist");
    test_support::checks::check_file(path, failure).or_else(fail)
}

/// Same series and, except run timings, the same values.
pub fn compare(actual: &Samples, expected: &Samples, what: &str) -> R<()> {
    compare_samples(actual, expected, what).or_else(fail)
}

pub fn file_id(path: &Path) -> Option<(u64, i64, i64, u64)> {
    fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

// ---------------------------------------------------------------------------
// What the concurrent reader (test_support::Reader) saw.

/// [`ReaderStats::check`]; the first file of each kind the reader saw is kept
/// in the scratch directory (`reader-<kind>.prom`, for `--keep`).
pub fn check_reader(work: &Path, stats: &ReaderStats) -> R<()> {
    for (kind, data) in &stats.first {
        fs::write(work.join(format!("reader-{kind}.prom")), data)?;
    }
    stats.check().or_else(fail)
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
