//! A collector's registry row and hooks, what its hooks are given, and the
//! sampled engines.

use std::collections::hash_map::{Entry, HashMap};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use nvml::calls::Call;
use nvml::types::{Clock, Sampling};
use nvml::DeviceReader;

use crate::facts::GpuFacts;
use crate::identity::Identity;
use crate::metrics::{self, families, Family, Labelled, Merge};
use crate::owner::Owners;
use crate::reason::Reason;
use crate::samples::{self, Carry};
use crate::snapshot::{BusyWindow, Device, Process, Sample, Snapshot, Status, TaskReading};
use crate::state::schema::{GpuState, Stream, Unsupported};
use crate::state::StateFile;

families! {
    // Emitted by utilization and media, each with its own `engine` values.
    SHARED;
    BUSY: Counter(Seconds), "nvidia_gpu_busy_seconds_total", ["engine"],
        "Time the engine (gpu, memory, encoder, decoder) was busy, integrated from NVML's utilization samples: all of it while they cover wall time, else the sampled part (see nvidia_gpu_sampled_seconds_total); rate(busy)/rate(nvidia_gpu_sampled_seconds_total) is its exact mean utilization.";
    SAMPLED: Counter(Seconds), "nvidia_gpu_sampled_seconds_total", ["engine"],
        "Time covered by the NVML samples integrated into nvidia_gpu_busy_seconds_total, by engine; grows with wall time where runs read the buffers at both ends of a GPM window, slower where samples were missed (no GPM window and a timer period longer than NVML's buffer, missed runs).";
}

/// A window over one GPU (GPM's two samples); the other reads are taken at
/// its end.
pub trait Window<'n> {
    fn ends(&self) -> Instant;
    fn end_by(&mut self, latest: Instant);
    /// Waits for the window's end and pushes its readings.
    fn close(self: Box<Self>, reader: &mut Gpu<'n>);
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
    };

    pub(crate) const fn read(read: fn(&mut Gpu<'_>), fields: &'static [u32]) -> Hooks {
        Hooks {
            read: Some(read),
            fields,
            ..Hooks::NONE
        }
    }

    pub(crate) const fn open(open: OpenHook) -> Hooks {
        Hooks {
            open: Some(open),
            ..Hooks::NONE
        }
    }

    pub(crate) const fn with_host(self, host: HostHook) -> Hooks {
        Hooks {
            host: Some(host),
            ..self
        }
    }

    pub(crate) const fn with_early(self, early: fn(&mut Gpu<'_>)) -> Hooks {
        Hooks {
            early: Some(early),
            ..self
        }
    }

    pub(crate) const fn with_fields_for(self, pick: fn(&GpuFacts) -> &'static [u32]) -> Hooks {
        Hooks {
            fields_for: Some(pick),
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
    /// When the GPUs must be read (the host steps' time follows).
    pub gpus_end: Instant,
    /// Zero turns GPM off.
    pub gpm_window: Duration,
    /// The GPM pause file exists.
    pub gpm_paused: bool,
}

pub struct HostRun<'a> {
    pub snapshot: &'a mut Snapshot,
    pub state: &'a mut StateFile,
    pub until: Instant,
    /// Journal files to read instead of the system journal (`--journal-dir`).
    pub journal_dir: Option<&'a Path>,
    /// The processes' records and owners, read once per pid for every step.
    pub owners: &'a mut Owners,
    /// The state each GPU leaves, by UUID: a host step may set its part.
    pub states: &'a mut BTreeMap<String, GpuState>,
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

/// One GPU as its collectors see it; fields of the next state a run does
/// not set keep what they held (see `state`).
pub struct Gpu<'n> {
    pub nvml: DeviceReader<'n>,
    facts: GpuFacts,
    previous: GpuState,
    next: GpuState,
    keeps_totals: bool,
    samples: Vec<Sample>,
    processes: Vec<Process>,
    /// The processes' window once they were listed (`compute::list`), and
    /// whether their shares were read.
    pub process_window: Option<(Option<BusyWindow>, bool)>,
    pub tasks: Option<TaskReading>,
    /// The sample buffers fetched this run.
    pub fetched: samples::Fetched,
    /// Processes NVML listed twice, merged.
    merged: usize,
    /// Runs since the unsupported calls were last asked.
    unsupported_runs: u32,
}

impl<'n> Gpu<'n> {
    pub fn new(nvml: DeviceReader<'n>) -> Self {
        Gpu {
            nvml,
            facts: GpuFacts::default(),
            previous: GpuState::default(),
            next: GpuState::default(),
            keeps_totals: false,
            samples: Vec::with_capacity(256),
            processes: Vec::new(),
            process_window: None,
            tasks: None,
            fetched: samples::Fetched::default(),
            merged: 0,
            unsupported_runs: 0,
        }
    }

    /// A process listed twice on one instance is one: memory summed, the
    /// larger share kept.
    pub fn process(&mut self, process: Process) {
        let Some(earlier) = self.processes.iter_mut().find(|p| p.is(&process)) else {
            return self.processes.push(process);
        };
        self.merged += 1;
        earlier.memory_bytes = match (earlier.memory_bytes, process.memory_bytes) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        earlier.sm_ratio = match (earlier.sm_ratio, process.sm_ratio) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        earlier.sm_seen_us = earlier.sm_seen_us.max(process.sm_seen_us);
        earlier.listed |= process.listed;
    }

    pub fn index(&self) -> u32 {
        self.nvml.index()
    }

    /// What the info read found of this GPU (all empty before it ran).
    pub fn facts(&self) -> &GpuFacts {
        &self.facts
    }

    pub fn set_facts(&mut self, facts: GpuFacts) {
        self.facts = facts;
    }

    /// The calls answered NOT_SUPPORTED under the same MIG mode are not made
    /// again (see [`Unsupported`]).
    pub(crate) fn resume(&mut self, state: GpuState, keeps_totals: bool) {
        let known = &state.unsupported;
        if known.mig_mode == self.mig_mode() && known.runs < Unsupported::RUNS {
            self.nvml.assume_unsupported(known.calls.clone());
            self.unsupported_runs = known.runs + 1;
        }
        self.previous = state;
        self.keeps_totals = keeps_totals;
    }

    fn mig_mode(&mut self) -> Option<u32> {
        self.nvml.mig_mode().map(|mode| mode.current)
    }

    pub fn previous_state(&self) -> &GpuState {
        &self.previous
    }

    pub fn next_state(&mut self) -> &mut GpuState {
        &mut self.next
    }

    /// False when the state is unusable or not this GPU's: totals it keeps
    /// are then left out (a restart from 0 would read as a reset).
    pub fn keeps_totals(&self) -> bool {
        self.keeps_totals
    }

    /// A reading fixed while the driver is loaded, kept in the state under
    /// `name`. `Some(None)`: not supported (kept too); `None`: failed (made
    /// again next run) or down.
    pub fn read_fixed<A: std::fmt::Debug, T>(
        &mut self,
        name: &str,
        call: Call<A, T>,
        args: A,
        to_kept: fn(T) -> i64,
    ) -> Option<Option<i64>> {
        let (previous, next) = (&self.previous.fixed, &mut self.next.fixed);
        remembered(&mut self.nvml, previous, next, name, call, args, to_kept)
    }

    /// [`Self::read_fixed`] of a reading kept as the labels of an `_info` series.
    pub fn read_fixed_labels<A: std::fmt::Debug, T>(
        &mut self,
        name: &str,
        call: Call<A, T>,
        args: A,
        to_kept: fn(T) -> Vec<String>,
    ) -> Option<Option<Vec<String>>> {
        let (previous, next) = (&self.previous.fixed_labels, &mut self.next.fixed_labels);
        remembered(&mut self.nvml, previous, next, name, call, args, to_kept)
    }

    /// Labels kept in a shape no run writes (a damaged state): counted, and
    /// not kept, so that the next run reads them again.
    pub fn damaged_fixed_labels(&mut self, name: &str) {
        let index = self.index();
        self.nvml.count_error(format!(
            "GPU {index}: the state's {name} labels are damaged; read again next run"
        ));
        self.next.fixed_labels.remove(name);
    }

    /// A value no GPU can produce ([`Family::admits`]) is dropped, logged
    /// and counted.
    pub fn push(&mut self, sample: Sample) {
        let value = sample.value;
        self.push_read(sample, value);
    }

    /// [`Self::push`] logging `read`, the value NVML gave, on a rejection.
    /// Whether it was kept.
    pub fn push_read(&mut self, sample: Sample, read: f64) -> bool {
        let admitted = sample.family.admits(sample.value);
        if admitted {
            self.samples.push(sample);
        } else {
            self.reject(sample.family, read);
        }
        admitted
    }

    /// Counts a dropped impossible reading as a read error.
    pub fn reject(&mut self, family: &Family, value: f64) {
        let index = self.index();
        self.nvml.count_error(format!(
            "GPU {index}: {} read {value}, which is impossible; dropped",
            family.name
        ));
    }

    /// `None` for an impossible carry too: the totals start afresh.
    pub fn previous_carry(&self, stream: Stream) -> Option<Carry> {
        let carry = *self.previous_state().carries.get(&stream)?;
        if !carry.is_possible() {
            log::debug!(
                "the state's carry of {stream:?} is impossible; starting its totals afresh"
            );
            return None;
        }
        Some(carry)
    }

    pub fn gauge(&mut self, family: Labelled<0>, value: f64) {
        self.push(family.sample(value));
    }

    /// Only the down state if a fatal error occurred.
    pub fn finish(mut self, identity: &Identity) -> Finished {
        let index = self.index();
        self.next.unsupported = Unsupported {
            mig_mode: self.mig_mode(),
            calls: self.nvml.unsupported_calls().clone(),
            runs: self.unsupported_runs,
        };
        let read_errors = match self.nvml.finish() {
            Ok(read_errors) => read_errors,
            Err(fault) => return down(index, identity, fault.into(), None).into(),
        };
        let merged = merge_duplicates(&mut self.samples) + self.merged;
        if merged > 0 {
            log::warn!(
                "GPU {index}: NVML listed {merged} reading(s) twice (the same pid or MIG instance); merged"
            );
        }
        self.samples.push(metrics::UP.sample(1.0));
        self.samples
            .push(metrics::COLLECTOR_READ_ERRORS.sample(f64::from(read_errors)));
        Finished {
            device: Device {
                samples: self.samples,
                processes: self.processes,
                tasks: self.tasks,
                ..identified(index, identity)
            },
            state: Some(self.next),
        }
    }
}

/// The value of `name` kept in `next` or `previous`, else read and kept in
/// `next` (see [`Gpu::read_fixed`]).
fn remembered<A: std::fmt::Debug, T, V: Clone>(
    nvml: &mut DeviceReader<'_>,
    previous: &BTreeMap<String, Option<V>>,
    next: &mut BTreeMap<String, Option<V>>,
    name: &str,
    call: Call<A, T>,
    args: A,
    to_kept: fn(T) -> V,
) -> Option<Option<V>> {
    let value = match next.get(name).or(previous.get(name)) {
        Some(value) => value.clone(),
        None => match nvml.try_read(call, args)? {
            Ok(value) => Some(to_kept(value)),
            Err(error) => {
                nvml.note(&error);
                error.is_unsupported().then_some(None)?
            }
        },
    };
    next.insert(name.to_owned(), value.clone());
    Some(value)
}

/// `state: None` keeps what the state file had.
#[derive(Debug, Default)]
pub struct Finished {
    pub device: Device,
    pub state: Option<GpuState>,
}

/// `stuck_in`: the NVML call it hung in, if known.
pub fn down(
    index: u32,
    identity: &Identity,
    reason: Reason,
    stuck_in: Option<&'static str>,
) -> Device {
    Device {
        status: Status::Down { reason, stuck_in },
        samples: vec![
            metrics::UP.sample(0.0),
            metrics::DOWN_REASON.sample_with([reason.label()], 1.0),
        ],
        ..identified(index, identity)
    }
}

impl From<Device> for Finished {
    fn from(device: Device) -> Finished {
        Finished {
            device,
            state: None,
        }
    }
}

fn identified(index: u32, identity: &Identity) -> Device {
    Device {
        index,
        uuid: identity.uuid.clone(),
        pci_bus_id: identity.pci_bus_id.clone(),
        serial: identity.serial.clone(),
        ..Device::default()
    }
}

/// Merges samples of one family and labels by its [`Merge`] rule, at the
/// first one's position. How many were merged away.
fn merge_duplicates(samples: &mut Vec<Sample>) -> usize {
    let key = |sample: &Sample| {
        let labels = sample.labels.iter().map(|l| (l.name, l.value.clone()));
        (sample.family.name, labels.collect::<Vec<_>>())
    };
    let mut first = HashMap::with_capacity(samples.len());
    let mut kept: Vec<Sample> = Vec::with_capacity(samples.len());
    let total = samples.len();
    for sample in samples.drain(..) {
        match first.entry(key(&sample)) {
            Entry::Vacant(slot) => {
                slot.insert(kept.len());
                kept.push(sample);
            }
            Entry::Occupied(slot) => {
                let earlier = &mut kept[*slot.get()];
                let family = earlier.family;
                earlier.value = match family.merge() {
                    Merge::Sum => earlier.value + sample.value,
                    Merge::Max => earlier.value.max(sample.value),
                };
            }
        }
    }
    let merged = total - kept.len();
    *samples = kept;
    merged
}

pub const CLOCK_DOMAINS: [(Clock, &str); 4] = [
    (Clock::Graphics, "graphics"),
    (Clock::SM, "sm"),
    (Clock::Memory, "memory"),
    (Clock::Video, "video"),
];

pub fn flag(on: bool) -> f64 {
    f64::from(u8::from(on))
}

pub const HERTZ_PER_MEGAHERTZ: f64 = 1e6;

/// NVML reads power in milliwatts and energy in millijoules.
pub const PER_MILLI: f64 = 1000.0;

/// One NVML sampling engine, and the stream whose carry the state keeps.
#[derive(Clone, Copy)]
pub struct Engine {
    pub label: &'static str,
    pub ratio: Labelled<0>,
    pub sampling: Sampling,
    pub stream: Stream,
}

/// Pushes the ratio (if any sample is new) and the busy and sampled totals.
/// False where NVML keeps no samples: the caller falls back to [`point`].
pub fn read_engine(reader: &mut Gpu<'_>, engine: Engine) -> bool {
    let previous = reader.previous_carry(engine.stream);
    let Some((carry, integrated)) = samples::read(
        &mut reader.nvml,
        &mut reader.fetched,
        engine.sampling,
        previous,
    ) else {
        return false;
    };
    if let Some(integrated) = integrated {
        for value in integrated.rejected {
            reader.reject(engine.ratio.family(), metrics::ratio(value as f64));
        }
        if let Some(ratio) = integrated.ratio {
            reader.gauge(engine.ratio, ratio);
        }
    }
    if !reader.keeps_totals() {
        return true;
    }
    if carry != Carry::default() {
        reader.next_state().carries.insert(engine.stream, carry);
    }
    for (family, value) in [
        (BUSY, carry.busy_seconds()),
        (SAMPLED, carry.sampled_seconds()),
    ] {
        reader.push(family.sample_with([engine.label], value));
    }
    true
}

/// Reads the engines' sample buffers as the windows open (see `Hooks::early`).
pub fn read_engines_early(reader: &mut Gpu<'_>, engines: &[Engine]) {
    for engine in engines {
        reader.fetched.early(&mut reader.nvml, engine.sampling);
    }
}

/// A point reading, in percent of NVML's sample period, as the ratio.
pub fn point(reader: &mut Gpu<'_>, engine: Engine, percent: u32) {
    let percent = f64::from(percent);
    reader.push_read(engine.ratio.sample(metrics::ratio(percent)), percent);
}

#[cfg(test)]
mod tests {
    use super::*;

    families! {
        MEMORY: Gauge(Bytes), "nvidia_gpu_test_memory_bytes", ["pid", "user"], "Bytes.";
        INFO: Gauge(Number), "nvidia_gpu_test_info", ["id", "profile"], "A state.";
    }

    #[test]
    fn duplicates_merge_bytes_summed_states_kept() {
        // The pid alone, as for a process whose owner is unknown.
        let process =
            |pid: &'static str, bytes: f64| MEMORY.sample_some([Some(pid.into()), None], bytes);
        let mig = |used: f64| INFO.sample_with(["1", "1g.10gb"], used);
        let mut samples = vec![
            process("7", 100.0),
            mig(1.0),
            process("8", 5.0),
            process("7", 20.0),
            mig(1.0),
        ];
        assert_eq!(merge_duplicates(&mut samples), 2);
        let values: Vec<f64> = samples.iter().map(|s| s.value).collect();
        assert_eq!(values, [120.0, 1.0, 5.0]);
        assert_eq!(merge_duplicates(&mut samples), 0);
    }
}
