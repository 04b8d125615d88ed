//! The types of the registry: a [`Collector`] row, the [`Hooks`] it runs in
//! each phase of a run, what those hooks are given ([`Settings`], a
//! [`HostRun`]) and the [`Window`] a hook may open; and [`run_host`], the host
//! phase. Every collector file and `gpus` import them from here; the registry
//! (`mod.rs`) imports the collector files, so no file imports one that
//! imports it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::metrics::{self, Family};
use crate::nvml::facts::GpuFacts;
use crate::nvml::reader::DeviceReader;
use crate::snapshot::Snapshot;
use crate::state::StateFile;

/// A window a collector opened over one GPU (GPM's two samples): the other
/// reads of the GPU are taken at its end, so that what they publish is as
/// fresh as the window's result.
pub trait Window<'n> {
    /// When the window closes.
    fn ends(&self) -> Instant;
    /// Shortens the window to end by `latest` (see `timing::schedule`).
    fn end_by(&mut self, latest: Instant);
    /// Closes the window (waiting for its end) and pushes its readings.
    fn close(self: Box<Self>, reader: &mut DeviceReader<'n>);
}

/// A group of metric families that can be switched on and off.
pub struct Collector {
    /// The name on the command line.
    pub name: &'static str,
    /// On unless `--no-collector` names it.
    pub default: bool,
    /// One line for `--help`, the man page and the README.
    pub help: &'static str,
    /// The families its hooks may emit.
    pub families: &'static [&'static Family],
    /// Field ids its reader takes from the GPU's batched field read.
    pub(super) fields: &'static [u32],
    pub(super) hooks: Hooks,
}

/// What a collector does in each phase of a run; a phase it has no hook for
/// it skips. Per GPU, in this order: every `open`, then (once every window
/// says its reads may start) the batched field read and every `read`, then
/// every window's close; after all GPUs, every `host` step.
#[derive(Clone, Copy)]
pub(super) struct Hooks {
    /// Field ids for the GPU's batch that depend on what the info read found
    /// (the architecture): a reading that adds information on one GPU and
    /// repeats another on the next is batched only where it adds. Added to
    /// the row's fixed `fields`; the batch stays one call per GPU.
    pub(super) fields_for: Option<fn(&GpuFacts) -> &'static [u32]>,
    /// Opens a window over the GPU before any other reading (GPM's first
    /// sample), closed after every `read`.
    pub(super) open: Option<OpenHook>,
    /// Reads the collector's families from one GPU.
    pub(super) read: Option<fn(&mut DeviceReader<'_>)>,
    /// Host-level work once the GPUs were read: reading outside NVML (the
    /// kernel log) or completing their samples (process owners). An error
    /// says why it did not work (`nvidia_gpu_collector_success` 0).
    pub(super) host: Option<HostHook>,
}

/// Opens a window over one GPU; `None` when there is nothing to measure.
type OpenHook = for<'n> fn(&mut DeviceReader<'n>, &Settings) -> Option<Box<dyn Window<'n> + 'n>>;

/// A host step; the error says why it did not work.
type HostHook = fn(&mut HostRun<'_>) -> Result<(), HostError>;

/// Why a host step did not work: the step's own typed error.
pub type HostError = Box<dyn std::error::Error + Send + Sync>;

impl Hooks {
    pub(super) const NONE: Hooks = Hooks {
        fields_for: None,
        open: None,
        read: None,
        host: None,
    };
}

/// What this run's collectors are asked to do, resolved from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The collectors that are on, in registry order.
    pub collectors: Vec<&'static Collector>,
    /// Read each GPU on a thread of its own.
    pub parallel: bool,
    /// When reading must be done (the run's deadline less the time kept for
    /// publishing).
    pub reading_ends: Instant,
    /// The GPM window; zero turns GPM off.
    pub gpm_window: Duration,
    /// The GPM pause file exists.
    pub gpm_paused: bool,
    /// Where process owners are read from.
    pub procfs: PathBuf,
    /// Journal files to read instead of the system journal (`--journal-dir`).
    pub journal_dir: Option<PathBuf>,
}

/// What a host step works with, once NVML was read: the snapshot to add to,
/// the state, when it must be done, and where to read from.
pub struct HostRun<'a> {
    pub snapshot: &'a mut Snapshot,
    pub state: &'a mut StateFile,
    pub until: Instant,
    /// Journal files to read instead of the system journal (`--journal-dir`).
    pub journal_dir: Option<&'a Path>,
    /// Where process owners are read from (`--procfs`).
    pub procfs: &'a Path,
}

/// Runs the host step of every collector that has one, in registry order,
/// each said in the file: `nvidia_gpu_collector_success{collector}` and
/// `nvidia_gpu_collector_step_duration_seconds{collector}`. `enter` names the
/// phase for the watchdog.
pub fn run_host(
    collectors: &[&'static Collector],
    run: &mut HostRun<'_>,
    enter: &dyn Fn(&'static str),
) {
    for collector in collectors {
        let Some(host) = collector.hooks.host else {
            continue;
        };
        enter(collector.name);
        let started = Instant::now();
        let outcome = host(run);
        // The step logs its own failures (once, not every run).
        if let Err(why) = &outcome {
            log::debug!("collector {}: {why}", collector.name);
        }
        let labels = [collector.name];
        run.snapshot.host.extend([
            metrics::COLLECTOR_SUCCESS.sample_with(labels, f64::from(u8::from(outcome.is_ok()))),
            metrics::COLLECTOR_STEP_DURATION.sample_with(labels, started.elapsed().as_secs_f64()),
        ]);
    }
}

impl Collector {
    /// The field ids it takes from the batch of a GPU with these facts.
    pub(super) fn fields(&self, facts: &GpuFacts) -> impl Iterator<Item = u32> + '_ {
        let chosen = self.hooks.fields_for.map_or(&[][..], |pick| pick(facts));
        self.fields.iter().chain(chosen).copied()
    }

    /// Whether it opens a window over each GPU (and so takes the run's
    /// `--gpm-window`).
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
