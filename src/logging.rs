//! Log lines on standard error, never blocking: `nvidia-textfile-exporter:
//! <level>: <message>`, or, when stderr is the journal (`JOURNAL_STREAM`),
//! `<3>` (error), `<4>` (warning) or `<5>` (the rest, which the unit's
//! `LogLevelMax=notice` keeps) before each line (sd-daemon(3)).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use libc::PIPE_BUF;
use log::Level;
use rustix::fs::{self, FileType, Mode, OFlags};
use rustix::net::{self, SendFlags};

use crate::fsutil;

/// The program name on lines that do not go to the journal.
const PROGRAM: &str = "nvidia-textfile-exporter";

/// Whether [`init`] found stderr to be the journal stream, for [`emergency`].
static JOURNAL: AtomicBool = AtomicBool::new(false);

/// Installs the logger: `warn` unless `RUST_LOG` says otherwise. A reader of
/// stderr that takes nothing loses log lines, never the run's file or deadline.
pub fn init() {
    let journal = stderr_is_journal();
    JOURNAL.store(journal, Ordering::Relaxed);
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .target(env_logger::Target::Pipe(Box::new(NonBlockingStderr)))
        .format(move |out, record| {
            let message = record.args().to_string();
            out.write_all(prefixed(journal, record.level(), &message).as_bytes())
        })
        .init();
}

/// Logs `message` as an error for a process about to `_exit`, through neither
/// the logger nor Rust's `Stderr` (a blocked thread may hold their locks).
pub fn emergency(message: &str) {
    let text = prefixed(JOURNAL.load(Ordering::Relaxed), Level::Error, message);
    write_to_stderr_nonblocking(text.as_bytes());
}

/// Each line of `message`, prefixed for `level`: in the journal, by its syslog priority.
fn prefixed(journal: bool, level: Level, message: &str) -> String {
    let prefix = match (journal, level) {
        (true, Level::Error) => "<3>".to_owned(),
        (true, Level::Warn) => "<4>".to_owned(),
        (true, Level::Info | Level::Debug | Level::Trace) => "<5>".to_owned(),
        (false, _) => format!("{PROGRAM}: {}: ", level.as_str().to_lowercase()),
    };
    message
        .lines()
        .map(|line| format!("{prefix}{line}\n"))
        .collect()
}

/// Standard error for the logger, written by [`write_to_stderr_nonblocking`].
struct NonBlockingStderr;

impl Write for NonBlockingStderr {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        write_to_stderr_nonblocking(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One write of `bytes` to fd 2 that never blocks, leaving the flags of fd 2's
/// file description (perhaps a shell's) alone.
fn write_to_stderr_nonblocking(bytes: &[u8]) {
    // Rust's `Stderr` for its descriptor only, never its lock.
    let fd = &io::stderr();
    let Ok(stat) = fs::fstat(fd) else { return };
    match FileType::from_raw_mode(stat.st_mode) {
        // A file takes a write at once, at fd 2's own offset.
        FileType::RegularFile => drop(rustix::io::write(fd, bytes)),
        // The journal's stream: send(2) takes a per-call flag.
        FileType::Socket => {
            let _ = net::send(fd, bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
        }
        // A pipe or a terminal (docs/design.md, "Timing").
        kind => {
            let flags = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
            if let Ok(reopened) = fs::open("/proc/self/fd/2", flags, Mode::empty()) {
                let _ = rustix::io::write(reopened, bytes);
            } else {
                let fifo = kind == FileType::Fifo;
                let piece = if fifo { PIPE_BUF } else { 256 };
                // What fd 2 does not take now is dropped.
                let _ = fsutil::write_polled(fd, bytes, piece, Instant::now());
            }
        }
    }
}

/// Whether fd 2 is the journal stream `JOURNAL_STREAM` (`<device>:<inode>`) names.
fn stderr_is_journal() -> bool {
    let stream = std::env::var("JOURNAL_STREAM").unwrap_or_default();
    let ids = stream
        .split_once(':')
        .map(|(d, i)| (d.parse::<u64>(), i.parse::<u64>()));
    let (Some((Ok(device), Ok(inode))), Ok(stat)) = (ids, fs::fstat(io::stderr())) else {
        return false;
    };
    stat.st_dev == device && stat.st_ino == inode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_err_warnings_warning_and_the_rest_passes_log_level_max() {
        assert_eq!(prefixed(true, Level::Error, "a"), "<3>a\n");
        assert_eq!(prefixed(true, Level::Warn, "a"), "<4>a\n");
        assert_eq!(prefixed(true, Level::Debug, "a"), "<5>a\n");
    }

    #[test]
    fn every_line_carries_the_prefix() {
        assert_eq!(prefixed(true, Level::Warn, "a\nb"), "<4>a\n<4>b\n");
        assert_eq!(
            prefixed(false, Level::Error, "a\nb"),
            "nvidia-textfile-exporter: error: a\nnvidia-textfile-exporter: error: b\n"
        );
    }
}
