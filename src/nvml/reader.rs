//! Reading one GPU: the error policy of `nvml` in one place.

use std::time::Instant;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::MigMode;
use nvml_wrapper::Device as NvmlDevice;

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::facts::GpuFacts;
use super::fields::{self, Field};
use super::{device_fatal, reason, unsupported};
use crate::identity::Identity;
use crate::inflight::{InFlight, Scope};
use crate::metrics::{self, Family, Labelled, Merge};
use crate::reason::Reason;
use crate::snapshot::{Device, Sample};
use crate::state::schema::GpuState;

/// Collects the samples of one GPU while applying the error policy.
pub struct DeviceReader<'n> {
    device: &'n NvmlDevice<'n>,
    index: u32,
    inflight: &'n InFlight,
    samples: Vec<Sample>,
    read_errors: u32,
    /// Set by the first device-fatal error; from then on nothing is read.
    fault: Option<Reason>,
    /// Field values read in one batch before the collectors run (see
    /// [`Self::prefetch`]); an entry's error is handled when it is taken.
    prefetched: Vec<(u32, Option<Result<f64, NvmlError>>)>,
    /// What the previous run left for this GPU.
    previous_state: GpuState,
    /// What this run leaves for the next.
    next_state: GpuState,
    /// See [`Self::keeps_totals`]; false until [`Self::set_previous_state`].
    keeps_totals: bool,
    /// What the info read found (see [`Self::facts`]).
    facts: GpuFacts,
    /// MIG mode, read once per run however many collectors ask (see
    /// [`Self::mig_mode`]); `None` until the first read.
    mig_mode: Option<Option<MigMode>>,
    /// The running compute processes, read once per run (see
    /// [`Self::compute_processes`]).
    compute_processes: Option<Option<Vec<ProcessInfo>>>,
    /// How often each (call, error) was seen: the first is logged, the repeats
    /// are summed up once in [`Self::finish`], so a loop cannot flood the log.
    seen: Vec<(String, u32)>,
}

impl<'n> DeviceReader<'n> {
    pub fn new(device: &'n NvmlDevice<'n>, index: u32, inflight: &'n InFlight) -> Self {
        DeviceReader {
            device,
            index,
            inflight,
            samples: Vec::with_capacity(256),
            read_errors: 0,
            fault: None,
            prefetched: Vec::new(),
            seen: Vec::new(),
            previous_state: GpuState::default(),
            next_state: GpuState::default(),
            keeps_totals: false,
            facts: GpuFacts::default(),
            mig_mode: None,
            compute_processes: None,
        }
    }

    /// NVML's index of the GPU.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Keeps what the info read found, for the collectors that follow.
    pub fn set_facts(&mut self, facts: GpuFacts) {
        self.facts = facts;
    }

    /// What the info read found of this GPU (all empty before it ran).
    pub fn facts(&self) -> &GpuFacts {
        &self.facts
    }

    /// Calls NVML function `call` through `read`. `None` when the field is not
    /// supported, failed (counted) or the GPU is already down.
    pub fn read<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlDevice<'n>) -> Result<T, NvmlError>,
    ) -> Option<T> {
        match self.try_read(call, read)? {
            Ok(value) => Some(value),
            Err(error) => {
                self.note(call, &error);
                None
            }
        }
    }

    /// Applies the error policy to an error of `call` that was obtained some other
    /// way (one entry of a batched call, say).
    pub fn note(&mut self, call: &str, error: &NvmlError) {
        let index = self.index;
        if unsupported(error) {
            log::debug!("GPU {index}: {call}: {error}");
        } else if device_fatal(error) {
            log::warn!("GPU {index}: {call}: {error}; reporting the GPU down");
            self.fault = Some(reason(error));
        } else {
            self.read_errors += 1;
            let message = format!("GPU {index}: {call}: {error}");
            self.warn_once(message);
        }
    }

    /// Logs `message` as a warning the first time this run sees it.
    fn warn_once(&mut self, message: String) {
        match self.seen.iter_mut().find(|(seen, _)| *seen == message) {
            Some((_, count)) => *count += 1,
            None => {
                log::warn!("{message}");
                self.seen.push((message, 1));
            }
        }
    }

    /// `count` as NVML returned it from `call`, if no hardware can exceed it
    /// (`max`); an impossible count (a sentinel such as 4294967295) is dropped,
    /// logged and counted, so that no loop runs over it.
    pub fn bounded(&mut self, call: &str, count: u32, max: u32) -> Option<u32> {
        if count <= max {
            return Some(count);
        }
        self.read_errors += 1;
        let message = format!(
            "GPU {}: {call} returned {count}, more than any GPU has ({max}); ignored",
            self.index
        );
        self.warn_once(message);
        None
    }

    /// Reads the field values `ids` (scope 0) in one `nvmlDeviceGetFieldValues`
    /// call, for the collectors to take with [`Self::field`]: one driver round
    /// trip instead of one call per reading.
    pub fn prefetch(&mut self, ids: &[u32]) {
        let requests: Vec<Field> = ids.iter().map(|&id| Field { id, scope: 0 }).collect();
        let values = self.fetch_fields(&requests);
        self.prefetched = ids.iter().copied().zip(values).collect();
    }

    /// Reads `fields` in one call. Each entry is `None` where that field is not
    /// supported or failed (errors other than "not supported" are counted).
    pub fn read_fields(&mut self, fields: &[Field]) -> Vec<Option<f64>> {
        self.fetch_fields(fields)
            .into_iter()
            .map(|value| match value? {
                Ok(number) => Some(number),
                Err(error) => {
                    self.note(fields::CALL, &error);
                    None
                }
            })
            .collect()
    }

    /// Reads `fields` in one call and leaves each entry's error to the caller:
    /// `None` for every entry when the call itself failed (that failure is
    /// already handled by the error policy).
    fn fetch_fields(&mut self, requests: &[Field]) -> Vec<Option<Result<f64, NvmlError>>> {
        if requests.is_empty() {
            return Vec::new();
        }
        let scheme = self.device.nvml().field_id_scheme();
        match self.read_raw(fields::CALL, |lib, handle| {
            fields::fetch(lib, handle, scheme, requests)
        }) {
            Some(values) => values.into_iter().map(Some).collect(),
            None => requests.iter().map(|_| None).collect(),
        }
    }

    /// Takes the prefetched entry of field `id`, once.
    fn take_field(&mut self, id: u32) -> Option<Result<f64, NvmlError>> {
        self.prefetched
            .iter_mut()
            .find(|(field, _)| *field == id)
            .and_then(|(_, value)| value.take())
    }

    /// A prefetched field value that has no other source: `None` if it was not
    /// prefetched or NVML could not give it (a failure is handled by the error
    /// policy here).
    pub fn field(&mut self, id: u32) -> Option<f64> {
        match self.take_field(id)? {
            Ok(value) => Some(value),
            Err(error) => {
                self.note(fields::CALL, &error);
                None
            }
        }
    }

    /// A prefetched field value, or else what `fallback` reads through the
    /// function that gives the same reading. A batch entry that failed is not
    /// counted itself (logged at debug level): the fallback's own read is, so
    /// one reading that fails both ways counts as one error.
    pub fn field_or(
        &mut self,
        id: u32,
        fallback: impl FnOnce(&mut Self) -> Option<f64>,
    ) -> Option<f64> {
        match self.take_field(id) {
            Some(Ok(value)) => return Some(value),
            Some(Err(error)) if !unsupported(&error) && !device_fatal(&error) => {
                log::debug!(
                    "GPU {}: {} field {id}: {error}; trying the function",
                    self.index,
                    fields::CALL
                );
            }
            Some(Err(error)) => self.note(fields::CALL, &error),
            None => {}
        }
        fallback(self)
    }

    /// The GPU's MIG mode (current and pending), read through NVML the first
    /// time a collector asks in this run and kept for the others.
    pub fn mig_mode(&mut self) -> Option<MigMode> {
        if let Some(mode) = &self.mig_mode {
            return mode.clone();
        }
        let mode = self.read("nvmlDeviceGetMigMode", |d| d.mig_mode());
        self.mig_mode = Some(mode.clone());
        mode
    }

    /// The GPU's running compute processes, read the first time a collector
    /// asks in this run and kept for the others.
    pub fn compute_processes(&mut self) -> Option<Vec<ProcessInfo>> {
        if let Some(processes) = &self.compute_processes {
            return processes.clone();
        }
        let processes = self.read("nvmlDeviceGetComputeRunningProcesses_v3", |d| {
            d.running_compute_processes()
        });
        self.compute_processes = Some(processes.clone());
        processes
    }

    /// A reading that does not change while the driver is loaded (a property
    /// of the board): the value the previous run left under `name` in the
    /// state's fixed readings (kept only under the same driver), else read
    /// through `call`; kept for the next run either way. `Some(None)`: NVML
    /// does not support it (kept too, logged at debug level); `None`: the
    /// read failed (counted, and read again next run) or the GPU is down.
    pub fn read_fixed(
        &mut self,
        name: &str,
        call: &'static str,
        read: impl FnOnce(&NvmlDevice<'n>) -> Result<i64, NvmlError>,
    ) -> Option<Option<i64>> {
        let value = match self.previous_state.fixed.get(name) {
            Some(&value) => value,
            None => match self.try_read(call, read)? {
                Ok(value) => Some(value),
                Err(error) if unsupported(&error) => {
                    self.note(call, &error);
                    None
                }
                Err(error) => {
                    self.note(call, &error);
                    return None;
                }
            },
        };
        self.next_state.fixed.insert(name.to_owned(), value);
        Some(value)
    }

    /// Hands the reader what the previous run left for this GPU, and whether
    /// this GPU's running totals can continue from run to run
    /// ([`Self::keeps_totals`]).
    pub fn set_previous_state(&mut self, state: GpuState, keeps_totals: bool) {
        self.previous_state = state;
        self.keeps_totals = keeps_totals;
    }

    /// Whether running totals (counters kept in the state) may be published
    /// and kept for this GPU: false when the state cannot be used or
    /// stored this run, or the GPU's identity is not its own (unknown, or a
    /// UUID two GPUs share). A counter that cannot continue would restart
    /// from 0, which `rate()` reads as a reset and a jump; it is left out.
    pub fn keeps_totals(&self) -> bool {
        self.keeps_totals
    }

    /// What the previous run left for this GPU.
    pub fn previous_state(&self) -> &GpuState {
        &self.previous_state
    }

    /// What this run leaves for the next, for the collectors to fill in: it
    /// starts empty, and the state keeps the running totals not carried
    /// again (see `state::StateFile::store`).
    pub fn next_state(&mut self) -> &mut GpuState {
        &mut self.next_state
    }

    /// Adds a sample; a value no GPU can produce (see [`Family::admits`]: a
    /// sentinel) is dropped, logged and counted.
    pub fn push(&mut self, sample: Sample) {
        let value = sample.value;
        self.push_read(sample, value);
    }

    /// Adds a sample converted from what NVML read (`read`, a percentage
    /// say): like [`Self::push`], but a rejection logs `read`. Whether the
    /// sample was kept.
    pub fn push_read(&mut self, sample: Sample, read: f64) -> bool {
        let admitted = sample.family.admits(sample.value);
        if admitted {
            self.samples.push(sample);
        } else {
            self.reject(sample.family, read);
        }
        admitted
    }

    /// Drops an impossible reading of `family` (a sentinel, a utilization above
    /// 100 %), logged and counted like a failed read.
    pub fn reject(&mut self, family: &Family, value: f64) {
        let message = format!(
            "GPU {}: {} read {value}, which is impossible; dropped",
            self.index, family.name
        );
        self.warn_once(message);
        self.read_errors += 1;
    }

    /// Adds a sample of a family without labels.
    pub fn gauge(&mut self, family: Labelled<0>, value: f64) {
        self.push(family.sample(value));
    }

    /// The GPU's samples, or only its down state if a fatal error occurred.
    pub fn finish(mut self, identity: &Identity) -> Device {
        for (message, count) in &self.seen {
            if *count > 1 {
                log::warn!("{message} (seen {count} times in this run)");
            }
        }
        if let Some(fault) = self.fault {
            return down(self.index, identity, fault);
        }
        let merged = merge_duplicates(&mut self.samples);
        if merged > 0 {
            log::warn!(
                "GPU {}: NVML listed {merged} reading(s) twice (the same pid or MIG instance); merged",
                self.index
            );
        }
        self.samples.push(metrics::UP.sample(1.0));
        self.samples
            .push(metrics::COLLECTOR_READ_ERRORS.sample(f64::from(self.read_errors)));
        Device {
            index: self.index,
            uuid: identity.uuid.clone(),
            pci_bus_id: identity.pci_bus_id.clone(),
            serial: identity.serial.clone(),
            samples: self.samples,
            state: Some(self.next_state),
        }
    }
}

/// Merges samples of the same family and labels, so that no series is ever
/// written twice (node_exporter would drop the file's later duplicates on every
/// scrape), by the family's [`Merge`] rule: byte and counter values are summed
/// (one pid listed twice holds both amounts), other values keep the largest (a
/// state or `_info` stays 1). The first sample's position is kept. Returns how many samples were merged away.
fn merge_duplicates(samples: &mut Vec<Sample>) -> usize {
    let key = |sample: &Sample| {
        let mut key = sample.family.index.to_string();
        for label in &sample.labels {
            key.push('\0');
            key.push_str(label.name);
            key.push('\0');
            key.push_str(&label.value);
        }
        key
    };
    let mut first: HashMap<String, usize> = HashMap::with_capacity(samples.len());
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

/// A GPU reported down for `reason`, with no other readings but its
/// identity (for XID attribution and the state).
pub fn down(index: u32, identity: &Identity, reason: Reason) -> Device {
    Device {
        index,
        uuid: identity.uuid.clone(),
        pci_bus_id: identity.pci_bus_id.clone(),
        serial: identity.serial.clone(),
        samples: vec![
            metrics::UP.sample(0.0),
            metrics::DOWN_REASON.sample_with([reason.label()], 1.0),
        ],
        ..Device::default()
    }
}

impl<'n> DeviceReader<'n> {
    /// Calls `read` without applying the error policy, for callers that treat some
    /// errors as answers (an empty MIG slot, a link beyond the last). `None` when
    /// the GPU is already down. Pass other errors to [`DeviceReader::note`].
    pub fn try_read<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlDevice<'n>) -> Result<T, NvmlError>,
    ) -> Option<Result<T, NvmlError>> {
        if self.fault.is_some() {
            return None;
        }
        let scope = Scope::Gpu(self.index);
        self.inflight.enter(scope, call);
        let started = Instant::now();
        let result = read(self.device);
        self.inflight.leave();
        log::trace!("GPU {}: {call} took {:?}", self.index, started.elapsed());
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::LabelValue;

    #[test]
    fn duplicates_merge_bytes_summed_states_kept() {
        let process = |pid: &'static str, bytes: f64| {
            // The pid alone, as for a process whose owner is unknown.
            let mut labels: [Option<LabelValue>; 8] = Default::default();
            labels[0] = Some(pid.into());
            metrics::PROCESS_MEMORY_USED.sample_some(labels, bytes)
        };
        let mig = |used: f64| metrics::MIG_INFO.sample_with(["1", "0", "MIG-x", "1g.10gb"], used);
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
