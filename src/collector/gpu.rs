//! One GPU as its collectors see it: its reader, facts, the state the
//! previous run left and the one this run leaves, and what was read.

use std::collections::BTreeMap;

use nvml::calls::Call;
use nvml::DeviceReader;

use crate::facts::GpuFacts;
use crate::identity::Identity;
use crate::metrics::{self, Family, Labelled};
use crate::samples::{self, Carry};
use crate::snapshot::{BusyWindow, Device, LabelValue, Process, Sample, TaskReading};
use crate::state::schema::{GpuState, Stream, Unsupported};

use super::finish::{down, identified, merge_duplicates, Finished};
use super::units::flag;

/// A reading fixed while the driver is loaded, by the name the state keeps
/// it under (written to disk: a name never changes).
#[derive(Debug, Clone, Copy)]
pub struct Fixed(pub &'static str);

/// What the state keeps of a fixed reading: a number, or the labels of an
/// `_info` series.
pub trait FixedValue: Clone {
    /// The state's fixed readings of this kind, by name.
    fn kept(state: &mut GpuState) -> &mut BTreeMap<String, Option<Self>>;
}

impl FixedValue for i64 {
    fn kept(state: &mut GpuState) -> &mut BTreeMap<String, Option<Self>> {
        &mut state.fixed
    }
}

impl FixedValue for Vec<String> {
    fn kept(state: &mut GpuState) -> &mut BTreeMap<String, Option<Self>> {
        &mut state.fixed_labels
    }
}

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
        let bytes = earlier.memory_bytes.into_iter().chain(process.memory_bytes);
        earlier.memory_bytes = bytes.reduce(u64::saturating_add);
        let ratios = earlier.sm_ratio.into_iter().chain(process.sm_ratio);
        earlier.sm_ratio = ratios.reduce(f64::max);
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

    /// A reading fixed while the driver is loaded: the value kept under its
    /// name in the next state or the previous one, else read, and kept in the
    /// next. `Some(None)`: not supported (kept too); `None`: failed (made
    /// again next run) or down.
    pub fn read_fixed<C: Call, V: FixedValue>(
        &mut self,
        Fixed(name): Fixed,
        call: C,
        args: C::Args<'_, 'n>,
        to_kept: fn(C::Answer<'n>) -> V,
    ) -> Option<Option<V>> {
        let next = V::kept(&mut self.next);
        let value = match next.get(name).or(V::kept(&mut self.previous).get(name)) {
            Some(value) => value.clone(),
            None => (self.nvml)
                .read_expecting(call, args, nvml::Error::is_unsupported)?
                .ok()
                .map(to_kept),
        };
        next.insert(name.to_owned(), value.clone());
        Some(value)
    }

    /// Labels kept in a shape no run writes (a damaged state): counted, and
    /// not kept, so that the next run reads them again.
    pub fn damaged_fixed_labels(&mut self, Fixed(name): Fixed) {
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

    /// Nothing where there is no `value` (it was not read).
    pub fn gauge(&mut self, family: Labelled<0>, value: impl Into<Option<f64>>) {
        self.gauge_with(family, [] as [&str; 0], value);
    }

    /// [`Self::gauge`] of a family with labels.
    pub fn gauge_with<const N: usize, V: Into<LabelValue>>(
        &mut self,
        family: Labelled<N>,
        labels: [V; N],
        value: impl Into<Option<f64>>,
    ) {
        if let Some(value) = value.into() {
            self.push(family.sample_with(labels, value));
        }
    }

    /// A state set of `value`, an index into `states`: 1 for the state it
    /// names, 0 for the others, and `unknown` 1 for another value. Whether it
    /// named one.
    pub fn state_set(&mut self, family: Labelled<1>, states: &[&'static str], value: f64) -> bool {
        let current = (0..states.len()).position(|index| value == index as f64);
        for (index, state) in states.iter().enumerate() {
            self.push(family.sample_with([*state], flag(current == Some(index))));
        }
        if current.is_none() {
            self.push(family.sample_with(["unknown"], 1.0));
        }
        current.is_some()
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
