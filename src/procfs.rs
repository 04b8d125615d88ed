//! The one reader of `/proc/<pid>`: a process's command, control group, real
//! uid and start as a typed [`Proc`], and its environment on request, under
//! the run's deadline. What cannot be read is `None`; text is decoded lossily.

use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::bounded;

/// What `/proc/<pid>` says of a process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    /// `comm`, without its line feed.
    pub comm: Option<String>,
    /// `cgroup`, as the kernel wrote it.
    pub cgroup: Option<String>,
    /// The real uid (the `Uid:` line of `status`).
    pub uid: Option<u32>,
    /// When it started, µs after boot (field 22 of `stat`).
    pub started_us: Option<u64>,
}

/// How long one process's files may take: a read waits on kernel locks
/// (the cgroup's on `cgroup_mutex`) that a stuck kernel or process can hold.
const READ_LIMIT: Duration = Duration::from_millis(100);

/// `/proc` below its root (`--procfs`), read until a deadline.
#[derive(Debug)]
pub struct Procfs {
    root: PathBuf,
    until: Instant,
    /// A process's files did not answer in time: none are read again.
    gave_up: Cell<bool>,
    /// An environment did not answer in time: none is read again.
    environ_gave_up: Cell<bool>,
}

impl Procfs {
    pub fn new(root: &Path, until: Instant) -> Procfs {
        Procfs {
            root: root.to_owned(),
            until,
            gave_up: Cell::new(false),
            environ_gave_up: Cell::new(false),
        }
    }

    /// What `/proc/<pid>` says, read on a thread of its own for at most
    /// [`READ_LIMIT`]; after a process whose files did not answer, only the
    /// pid of each (no owner): the run's file is in place in time.
    pub fn read(&self, pid: u32) -> Proc {
        let unread = Proc {
            pid,
            ..Proc::default()
        };
        if self.gave_up.get() {
            return unread;
        }
        let dir = self.root.join(pid.to_string());
        let until = self.until.min(Instant::now() + READ_LIMIT);
        bounded::call("proc", until, move || read_proc(pid, &dir)).unwrap_or_else(|_| {
            log::warn!(
                "/proc/{pid} did not answer in time; this run's processes are left without owners"
            );
            self.gave_up.set(true);
            unread
        })
    }

    /// The environment of `pid`, read on a thread of its own until the
    /// deadline: reading it waits for the process's memory map, which a
    /// process stuck in the driver can hold; after one that did not answer,
    /// none.
    pub fn environ(&self, pid: u32) -> Option<Vec<u8>> {
        if self.environ_gave_up.get() {
            return None;
        }
        let path = self.root.join(pid.to_string()).join("environ");
        let read = bounded::call("environ", self.until, move || fs::read(path));
        read.map(Result::ok).unwrap_or_else(|_| {
            log::warn!(
                "a process's environment did not answer in time; owners named by it are left out"
            );
            self.environ_gave_up.set(true);
            None
        })
    }
}

/// What the files of `dir`, process `pid`'s, say.
fn read_proc(pid: u32, dir: &Path) -> Proc {
    let text = |name: &str| read_lossy(&dir.join(name));
    Proc {
        pid,
        comm: text("comm").map(|c| c.trim_end_matches('\n').to_owned()),
        cgroup: text("cgroup"),
        uid: text("status").as_deref().and_then(real_uid),
        started_us: fs::read(dir.join("stat"))
            .ok()
            .as_deref()
            .and_then(started_us),
    }
}

/// A `/proc` file's text, decoded lossily: bytes that are no UTF-8, which a
/// process may put in its command's name and a user in a cgroup's, never make
/// it unreadable. A replaced byte is no ASCII, so it cannot make a line, a
/// path component or any name a manager reads at its position.
fn read_lossy(path: &Path) -> Option<String> {
    let bytes = fs::read(path).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The real uid from the `Uid:` line of `status`.
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
}

/// Field 22 of `stat` (clock ticks after boot) in µs.
fn started_us(stat: &[u8]) -> Option<u64> {
    // The command name (field 2) may hold anything: fields after its `)`.
    let after = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let ticks: u64 = String::from_utf8_lossy(after)
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    Some(ticks * 1_000_000 / rustix::param::clock_ticks_per_second())
}

/// µs since boot: the clock of process starts, which a step of the wall
/// clock does not move.
pub fn boot_us() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_a_fake_proc_and_tolerates_missing_pids() {
        let root = tempfile::tempdir().unwrap();
        let pid = root.path().join("77");
        fs::create_dir(&pid).unwrap();
        fs::write(pid.join("comm"), b"py\xfftorch\n").unwrap();
        fs::write(pid.join("status"), "Name:\tpy\nUid:\t1000\t0\t0\t0\n").unwrap();
        fs::write(pid.join("cgroup"), b"0::/system.slice/a\xff.service\n").unwrap();
        fs::write(pid.join("environ"), b"A=1\0").unwrap();
        // Field 22 is 250 ticks after boot, past a command name with `)`.
        let stat = "77 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 250 1000 10";
        fs::write(pid.join("stat"), stat).unwrap();
        let procfs = Procfs::new(root.path(), Instant::now() + Duration::from_secs(5));
        let read = procfs.read(77);
        assert_eq!(read.comm.as_deref(), Some("py\u{fffd}torch"));
        assert_eq!(
            read.cgroup.as_deref(),
            Some("0::/system.slice/a\u{fffd}.service\n")
        );
        assert_eq!(read.uid, Some(1000));
        let per_second = rustix::param::clock_ticks_per_second();
        assert_eq!(read.started_us, Some(250 * 1_000_000 / per_second));
        assert_eq!(procfs.environ(77).as_deref(), Some(&b"A=1\0"[..]));
        assert_eq!(
            procfs.read(78),
            Proc {
                pid: 78,
                ..Proc::default()
            }
        );
        assert_eq!(real_uid("Name:\tpython\n"), None);
    }
}
