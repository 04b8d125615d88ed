//! What a collector is: its registry row and hooks (here), and what its
//! hooks are given: the per-GPU context ([`Gpu`]), the host step's run
//! ([`HostRun`]), the sampled engines two collectors share (`engines`), the
//! units NVML reads in (`units`) and the finished device (`finish`).

mod engines;
mod finish;
mod gpu;
mod units;

pub use engines::{point, read_engine, read_engines_early, Engine, BUSY, SAMPLED, SHARED};
pub use finish::{down, Finished};
pub use gpu::{Fixed, Gpu};
pub use units::{flag, CLOCK_DOMAINS, HERTZ_PER_MEGAHERTZ, PER_MILLI};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::facts::GpuFacts;
use crate::metrics::Family;
use crate::owner::Owners;
use crate::snapshot::Snapshot;
use crate::state::schema::GpuState;
use crate::state::StateFile;
use crate::timing::Budget;

/// A window over one GPU (GPM's two samples); the other reads are taken at
/// its end.
pub trait Window<'n> {
    fn ends(&self) -> Instant;
    fn end_by(&mut self, latest: Instant);
    /// Waits for the window's end and pushes its readings.
    fn close(self: Box<Self>, gpu: &mut Gpu<'n>);
}

/// A group of metric families that can be switched on and off.
pub struct Collector {
    pub name: &'static str,
    /// On unless `--no-collector` names it.
    pub default: bool,
    /// One line for `--help`, the man page and the README.
    pub help: &'static str,
    pub families: &'static [&'static Family],
    pub(crate) hooks: Hooks,
}

/// What a collector does in each phase of a run (see `phases`).
#[derive(Clone, Copy)]
pub(crate) struct Hooks {
    /// Field ids `read` takes from the GPU's batched field read.
    pub(crate) fields: &'static [u32],
    /// More field ids, by the GPU's facts.
    pub(crate) fields_for: Option<fn(&GpuFacts) -> &'static [u32]>,
    /// Opens a window before any other reading, closed after every `read`.
    pub(crate) open: Option<OpenHook>,
    /// Reads taken as the windows open, where one is (NVML's sample
    /// buffers): `read` at their end then covers the whole time since the
    /// previous run with a buffer that holds only the time between runs.
    pub(crate) early: Option<fn(&mut Gpu<'_>)>,
    pub(crate) read: Option<fn(&mut Gpu<'_>)>,
    /// Runs once the GPUs were read; an error makes
    /// `nvidia_gpu_collector_success` 0.
    pub(crate) host: Option<HostHook>,
    /// The host step needs nothing of NVML: it runs in a run NVML failed
    /// too, over the GPUs the state knows of this boot.
    pub(crate) host_without_nvml: bool,
    /// The host steps whose results this one reads (the `xid` step's counts
    /// for the tasks'): it runs after them, in any registry order.
    pub(crate) needs: &'static [&'static str],
}

/// `None`: nothing to measure.
type OpenHook = for<'n> fn(&mut Gpu<'n>, &Settings) -> Option<Box<dyn Window<'n> + 'n>>;

type HostHook = fn(&mut HostRun<'_>) -> Result<(), HostError>;

/// The host step's own typed error.
pub type HostError = Box<dyn std::error::Error + Send + Sync>;

impl Hooks {
    pub(crate) const NONE: Hooks = Hooks {
        fields: &[],
        fields_for: None,
        open: None,
        early: None,
        read: None,
        host: None,
        host_without_nvml: false,
        needs: &[],
    };

    pub(crate) const fn read(read: fn(&mut Gpu<'_>), fields: &'static [u32]) -> Hooks {
        Hooks {
            read: Some(read),
            fields,
            ..Hooks::NONE
        }
    }

    pub(crate) const fn with_host(self, host: HostHook) -> Hooks {
        Hooks {
            host: Some(host),
            ..self
        }
    }

    /// [`Hooks::with_host`] of a step that needs nothing of NVML.
    pub(crate) const fn with_host_without_nvml(self, host: HostHook) -> Hooks {
        Hooks {
            host: Some(host),
            host_without_nvml: true,
            ..self
        }
    }

    /// A host step that reads what the steps `needs` leave this run.
    pub(crate) const fn needing(self, needs: &'static [&'static str]) -> Hooks {
        Hooks { needs, ..self }
    }

    pub(crate) const fn with_early(self, early: fn(&mut Gpu<'_>)) -> Hooks {
        Hooks {
            early: Some(early),
            ..self
        }
    }
}

/// What this run's collectors are asked to do, resolved from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The collectors that are on, in registry order.
    pub collectors: Vec<&'static Collector>,
    /// Read each GPU on a thread of its own.
    pub parallel: bool,
    /// The run's time: the GPUs are read by `gpus_end`.
    pub budget: Budget,
    /// Zero turns GPM off.
    pub gpm_window: Duration,
    /// The GPM pause file exists.
    pub gpm_paused: bool,
}

/// What the host steps read besides NVML, as the command line gives it
/// (built once by `cli`): a host step's new input is a field here and its
/// option there.
#[derive(Debug, Clone, Default)]
pub struct HostInputs {
    /// Journal files to read instead of the system journal (`--journal-dir`).
    pub journal_dir: Option<PathBuf>,
    /// `/proc` (`--procfs`).
    pub procfs: PathBuf,
    /// The kubelet's pod log directory and `/var/log/containers`, which name pods.
    pub pod_logs: PathBuf,
    pub container_logs: PathBuf,
    /// Where the GPUs given to jobs and pods are read.
    pub allocations: crate::allocation::Sources,
}

/// What a host step is given: the run's snapshot and state, its time, its
/// inputs and the processes' owners.
pub struct HostRun<'a> {
    pub snapshot: &'a mut Snapshot,
    pub state: &'a mut StateFile,
    pub until: Instant,
    pub inputs: &'a HostInputs,
    /// The processes' records and owners, read once per pid for every step.
    pub owners: &'a mut Owners,
    /// The state each GPU leaves, by UUID: a host step may set its part.
    pub states: &'a mut BTreeMap<String, GpuState>,
    /// The host steps that ran this run and succeeded, so far.
    pub succeeded: Vec<&'static str>,
}

impl Collector {
    pub(crate) fn fields(&self, facts: &GpuFacts) -> impl Iterator<Item = u32> + '_ {
        let chosen = self.hooks.fields_for.map_or(&[][..], |pick| pick(facts));
        self.hooks.fields.iter().chain(chosen).copied()
    }

    /// Takes `--gpm-window`.
    pub fn opens_window(&self) -> bool {
        self.hooks.open.is_some()
    }
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for Collector {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Collector {}
