//! Which NVML call each reading thread is inside, so that a watchdog can name
//! the call that hung.

use std::fmt;
use std::sync::Mutex;
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
    pub fn enter(&self, scope: Scope, call: &'static str) {
        let me = thread::current().id();
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        match calls.iter_mut().find(|(thread, _, _)| *thread == me) {
            Some(entry) => *entry = (me, scope, call),
            None => calls.push((me, scope, call)),
        }
    }

    pub fn leave(&self) {
        let me = thread::current().id();
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls.retain(|(thread, _, _)| *thread != me);
    }

    pub fn call_of(&self, scope: Scope) -> Option<&'static str> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls.iter().find(|c| c.1 == scope).map(|c| c.2)
    }

    /// E.g. `nvmlDeviceGetPowerUsage (GPU 1)`, by scope.
    pub fn describe(&self) -> String {
        let held = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let mut calls: Vec<(Scope, &str)> = held.iter().map(|c| (c.1, c.2)).collect();
        if calls.is_empty() {
            return "no NVML call (the run was still starting or finishing)".into();
        }
        calls.sort();
        let described: Vec<String> = calls.iter().map(|(s, c)| format!("{c} ({s})")).collect();
        described.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_calls_not_yet_left_by_any_thread() {
        let inflight = InFlight::default();
        thread::scope(|s| {
            s.spawn(|| inflight.enter(Scope::Gpu(1), "nvmlDeviceGetPowerUsage"));
            s.spawn(|| inflight.enter(Scope::Gpu(1), "nvmlDeviceGetName"));
        });
        inflight.enter(Scope::Host, "nvmlInit_v2");
        inflight.leave();
        inflight.enter(Scope::Gpu(0), "nvmlDeviceGetUUID");
        assert_eq!(
            inflight.describe(),
            "nvmlDeviceGetUUID (GPU 0), nvmlDeviceGetName (GPU 1), nvmlDeviceGetPowerUsage (GPU 1)"
        );
        assert_eq!(inflight.call_of(Scope::Gpu(0)), Some("nvmlDeviceGetUUID"));
        inflight.leave();
        assert!(!inflight.describe().contains("GPU 0"));
        assert_eq!(inflight.call_of(Scope::Gpu(0)), None);
    }
}
