//! Log lines on standard error, in the form the reader of stderr expects.
//!
//! On a terminal or in a file: `nvidia-textfile-exporter: <level>: <message>`.
//! When stderr is the systemd journal (`JOURNAL_STREAM` names the same device
//! and inode as fd 2), every line instead starts with its syslog priority,
//! `<3>` for errors and `<4>` for warnings (sd-daemon(3)), and not with the
//! program name, which the journal records itself: so `journalctl -p err`
//! shows the exporter's errors. Info, debug and trace lines, which appear only
//! when `RUST_LOG` asks for them, are logged at notice (`<5>`), since the unit's
//! `LogLevelMax=notice` would drop lower priorities. Every line of a
//! multi-line message carries the prefix.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use log::Level;

/// The program name on lines that do not go to the journal.
const PROGRAM: &str = "nvidia-textfile-exporter";

/// Whether [`init`] found stderr to be the journal stream, for [`emergency`].
static JOURNAL: AtomicBool = AtomicBool::new(false);

/// Installs the logger: `warn` unless `RUST_LOG` says otherwise. Lines are
/// written without ever blocking ([`NonBlockingStderr`]): a reader of stderr
/// that takes nothing (a stalled journal, a full pipe) loses log lines, never
/// the run's file or its deadline.
pub fn init() {
    let journal = stderr_is_journal();
    JOURNAL.store(journal, Ordering::Relaxed);
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .target(env_logger::Target::Pipe(Box::new(NonBlockingStderr)))
        .format(move |out, record| {
            let message = record.args().to_string();
            for line in message.lines() {
                if journal {
                    writeln!(out, "<{}>{line}", priority(record.level()))?;
                } else {
                    let level = record.level().as_str().to_lowercase();
                    writeln!(out, "{PROGRAM}: {level}: {line}")?;
                }
            }
            Ok(())
        })
        .init();
}

/// Logs `message` as an error for a process about to `_exit`, in the form
/// [`init`]'s lines have, but through neither the logger nor Rust's `Stderr`
/// (another thread may hold their locks, blocked in a write) and without ever
/// blocking: when stderr (a pipe nobody reads, a stalled journal) does not
/// take the message at once, it is dropped.
pub fn emergency(message: &str) {
    let journal = JOURNAL.load(Ordering::Relaxed);
    let mut text = String::new();
    for line in message.lines() {
        if journal {
            text.push_str(&format!("<{}>{line}\n", priority(Level::Error)));
        } else {
            text.push_str(&format!("{PROGRAM}: error: {line}\n"));
        }
    }
    write_to_stderr_nonblocking(text.as_bytes());
}

/// Standard error for the logger, written by [`write_to_stderr_nonblocking`].
struct NonBlockingStderr;

impl Write for NonBlockingStderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        write_to_stderr_nonblocking(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One write of `bytes` to fd 2 that never blocks. The flags of fd 2's file
/// description are left alone: it may be shared with a shell, which
/// `O_NONBLOCK` would break.
fn write_to_stderr_nonblocking(bytes: &[u8]) {
    // SAFETY: fstat only writes the struct it is given.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(2, &mut stat) } != 0 {
        return;
    }
    match stat.st_mode & libc::S_IFMT {
        // A file takes a write without waiting for a reader, at fd 2's own
        // offset (a second description would write over the file's end).
        libc::S_IFREG => {
            // SAFETY: `bytes` is valid for its length; write only reads it.
            unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        }
        // The journal's stream: send(2) takes a per-call flag.
        libc::S_IFSOCK => {
            // SAFETY: as above.
            unsafe {
                libc::send(
                    2,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
        }
        // A pipe or a terminal: a new, non-blocking file description of the
        // same file, opened through /proc (a FIFO whose reader is gone fails
        // to open rather than block). A process may not reopen a pipe or
        // terminal of another user (a run under setpriv or runuser); then fd 2
        // itself, in pieces it takes whole without waiting.
        kind => {
            let flags = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
            // SAFETY: a NUL-terminated path; the descriptor is closed below.
            let fd = unsafe { libc::open(c"/proc/self/fd/2".as_ptr(), flags) };
            if fd >= 0 {
                // SAFETY: `fd` is open; `bytes` is valid for its length.
                unsafe {
                    libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                    libc::close(fd);
                }
            } else {
                write_while_ready(bytes, piece_that_never_waits(kind));
            }
        }
    }
}

/// The most a write to a pipe or terminal that poll(2) says is writable
/// takes without waiting: a pipe with a free slot takes `PIPE_BUF` bytes
/// whole (pipe(7)); a terminal is writable while under 256 bytes wait in its
/// buffer (`WAKEUP_CHARS`), with room for at least that many more.
fn piece_that_never_waits(kind: libc::mode_t) -> usize {
    if kind == libc::S_IFIFO {
        libc::PIPE_BUF
    } else {
        256
    }
}

/// Writes `bytes` to fd 2 in pieces of at most `piece` bytes, each only once
/// poll(2) says fd 2 takes it now; what it does not take at once is dropped.
fn write_while_ready(mut bytes: &[u8], piece: usize) {
    while !bytes.is_empty() {
        let mut ready = libc::pollfd {
            fd: 2,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd, no wait.
        let polled = unsafe { libc::poll(&mut ready, 1, 0) };
        if polled != 1 || ready.revents & libc::POLLOUT == 0 || ready.revents & libc::POLLERR != 0 {
            return;
        }
        let len = bytes.len().min(piece);
        // SAFETY: `bytes` is valid for `len` bytes; write only reads them.
        let written = unsafe { libc::write(2, bytes.as_ptr().cast(), len) };
        let Ok(written @ 1..) = usize::try_from(written) else {
            return;
        };
        bytes = &bytes[written..];
    }
}

/// The syslog priority a line of `level` is logged at in the journal.
fn priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info | Level::Debug | Level::Trace => 5,
    }
}

/// Whether fd 2 is the journal stream systemd announced in `JOURNAL_STREAM`
/// (`<device>:<inode>`); a child that inherited the variable but not the
/// stream (stderr redirected) is not.
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((device, inode)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(device), Ok(inode)) = (device.parse::<u64>(), inode.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat only writes the struct it is given.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(2, &mut stat) } != 0 {
        return false;
    }
    stat.st_dev == device && stat.st_ino == inode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_err_warnings_warning_and_the_rest_passes_log_level_max() {
        assert_eq!(priority(Level::Error), 3);
        assert_eq!(priority(Level::Warn), 4);
        assert_eq!(priority(Level::Debug), 5);
    }
}
