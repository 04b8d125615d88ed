//! Which NVML call each reading thread is inside, so that a watchdog can name
//! the call that hung.

use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::thread::{self, ThreadId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Host,
    Gpu(u32),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Host => f.write_str("host"),
            Scope::Gpu(index) => write!(f, "GPU {index}"),
        }
    }
}

/// One call at most per thread.
#[derive(Debug, Default)]
pub struct InFlight {
    calls: Mutex<Vec<(ThreadId, Scope, &'static str)>>,
}

impl InFlight {
    /// `make()`, the thread's call, named `call` (of `scope`) while it runs.
    pub fn during<T>(&self, scope: Scope, call: &'static str, make: impl FnOnce() -> T) -> T {
        let me = thread::current().id();
        self.held().push((me, scope, call));
        let answer = make();
        self.held().retain(|(thread, _, _)| *thread != me);
        answer
    }

    pub fn call_of(&self, scope: Scope) -> Option<&'static str> {
        self.held().iter().find(|c| c.1 == scope).map(|c| c.2)
    }

    /// E.g. `nvmlDeviceGetPowerUsage (GPU 1)`, by scope.
    pub fn describe(&self) -> String {
        let mut calls: Vec<(Scope, &str)> = self.held().iter().map(|c| (c.1, c.2)).collect();
        if calls.is_empty() {
            return "no NVML call (the run was still starting or finishing)".into();
        }
        calls.sort();
        let described: Vec<String> = calls.iter().map(|(s, c)| format!("{c} ({s})")).collect();
        described.join(", ")
    }

    /// A thread that panicked holding the lock left the list whole.
    fn held(&self) -> MutexGuard<'_, Vec<(ThreadId, Scope, &'static str)>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn describes_calls_not_yet_left_by_any_thread() {
        let inflight = InFlight::default();
        // Two threads inside their calls until the checks are done.
        let (inside, done) = (Barrier::new(3), Barrier::new(3));
        let hold = |call| {
            inflight.during(Scope::Gpu(1), call, || {
                inside.wait();
                done.wait();
            })
        };
        thread::scope(|s| {
            s.spawn(|| hold("nvmlDeviceGetPowerUsage"));
            s.spawn(|| hold("nvmlDeviceGetName"));
            inside.wait();
            inflight.during(Scope::Host, "nvmlInit_v2", || ());
            let during = inflight.during(Scope::Gpu(0), "nvmlDeviceGetUUID", || {
                (inflight.describe(), inflight.call_of(Scope::Gpu(0)))
            });
            let after = (inflight.describe(), inflight.call_of(Scope::Gpu(0)));
            // Checked once the threads are let go, so a failure cannot hang them.
            done.wait();
            assert_eq!(
                during.0,
                "nvmlDeviceGetUUID (GPU 0), nvmlDeviceGetName (GPU 1), nvmlDeviceGetPowerUsage (GPU 1)"
            );
            assert_eq!(during.1, Some("nvmlDeviceGetUUID"));
            assert!(!after.0.contains("GPU 0"));
            assert_eq!(after.1, None);
        });
        assert_eq!(inflight.call_of(Scope::Gpu(1)), None);
    }
}
