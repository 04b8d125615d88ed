//! Which NVML call each reading thread is inside, so that a watchdog can name
//! the call that hung.
//!
//! Readers bracket every NVML call with [`InFlight::enter`] and
//! [`InFlight::leave`]; [`InFlight::describe`] lists the calls that were entered
//! and not yet left. Plain data: no NVML types.

use std::fmt;
use std::sync::Mutex;

/// Who is calling: the host-wide part of a run, or the thread of one GPU.
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

/// The calls in progress, one at most per scope.
#[derive(Debug, Default)]
pub struct InFlight {
    calls: Mutex<Vec<(Scope, &'static str)>>,
}

impl InFlight {
    /// Records that `scope` is entering `call`.
    pub fn enter(&self, scope: Scope, call: &'static str) {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        match calls.iter_mut().find(|(s, _)| *s == scope) {
            Some(entry) => entry.1 = call,
            None => calls.push((scope, call)),
        }
    }

    /// Records that `scope` returned from its call.
    pub fn leave(&self, scope: Scope) {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls.retain(|(s, _)| *s != scope);
    }

    /// The calls in progress, e.g. `nvmlDeviceGetPowerUsage (GPU 1)`, by scope.
    pub fn describe(&self) -> String {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if calls.is_empty() {
            return "no NVML call (the run was still starting or finishing)".into();
        }
        calls.sort();
        calls
            .iter()
            .map(|(scope, call)| format!("{call} ({scope})"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_calls_not_yet_left() {
        let inflight = InFlight::default();
        inflight.enter(Scope::Gpu(1), "nvmlDeviceGetPowerUsage");
        inflight.enter(Scope::Host, "nvmlInit_v2");
        inflight.enter(Scope::Gpu(0), "nvmlDeviceGetName");
        inflight.leave(Scope::Host);
        inflight.enter(Scope::Gpu(0), "nvmlDeviceGetUUID");
        assert_eq!(
            inflight.describe(),
            "nvmlDeviceGetUUID (GPU 0), nvmlDeviceGetPowerUsage (GPU 1)"
        );
        inflight.leave(Scope::Gpu(0));
        inflight.leave(Scope::Gpu(1));
        assert!(inflight.describe().starts_with("no NVML call"));
    }
}
