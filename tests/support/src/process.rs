//! Child processes that never outlive the tests: each is killed when its
//! [`Proc`] is dropped, and [`kill_all`] kills every one still running (the
//! fault matrix calls it when it is itself terminated).

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// Live children: (pid, whether it leads its own process group).
static LIVE: Mutex<Vec<(u32, bool)>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<(u32, bool)>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// SIGKILL to every child started through [`Proc::spawn`] and not yet reaped
/// (to its whole group where it leads one).
pub fn kill_all() {
    for (pid, group) in live().drain(..).rev() {
        let pid = pid as i32;
        // SAFETY: a signal to a child of ours that has not been reaped.
        unsafe { libc::kill(if group { -pid } else { pid }, libc::SIGKILL) };
    }
}

/// A child process, killed when dropped while still running.
pub struct Proc {
    pub child: Child,
    group: bool,
    rc: Option<i32>,
}

impl Proc {
    /// Starts `cmd`, in a process group of its own when `group` (so that
    /// [`Proc::group_gone`] can tell whether anything it started is left).
    pub fn spawn(cmd: &mut Command, group: bool) -> std::io::Result<Proc> {
        if group {
            cmd.process_group(0);
        }
        let child = cmd.spawn()?;
        live().push((child.id(), group));
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

    fn reaped(&mut self, status: ExitStatus) {
        let pid = self.child.id();
        live().retain(|(p, _)| *p != pid);
        self.rc = Some(
            status
                .code()
                .unwrap_or_else(|| -status.signal().unwrap_or(0)),
        );
    }

    /// Sends `sig` to the process (its group where it leads one) while it runs.
    pub fn signal(&mut self, sig: i32) {
        if self.poll().is_none() {
            let pid = self.pid() as i32;
            // SAFETY: our unreaped child (or its process group).
            unsafe { libc::kill(if self.group { -pid } else { pid }, sig) };
        }
    }

    /// Waits up to `limit` seconds; past it the process is killed and `Err`.
    pub fn wait(&mut self, limit: f64) -> Result<i32, String> {
        let deadline = Instant::now() + Duration::from_secs_f64(limit);
        loop {
            if let Some(rc) = self.poll() {
                return Ok(rc);
            }
            if Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                return Err(format!(
                    "a process was still running after {limit} s (killed)"
                ));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// For a process started with `group`: whether no process of its group is
    /// left (the children it started have ended too). False while it runs.
    pub fn group_gone(&mut self) -> bool {
        assert!(self.group, "not started in a process group of its own");
        // SAFETY: signal 0 only checks whether the group has a member.
        self.poll().is_some()
            && unsafe { libc::kill(-(self.pid() as i32), 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
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
