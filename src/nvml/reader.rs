//! Reading one GPU: NVML's calls under the error policy of `nvml` (counted,
//! logged once, or the GPU down), the batched field values, and the GPU's
//! state from the previous run and for the next. Samples are the collectors'.

use std::time::Instant;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::MigMode;
use nvml_wrapper::Device as NvmlDevice;

use super::facts::GpuFacts;
use super::fields::{self, Field};
use super::{device_fatal, reason, unsupported};
use crate::inflight::{InFlight, Scope};
use crate::reason::Reason;
use crate::state::schema::GpuState;

/// One GPU's NVML reads under the error policy.
pub struct DeviceReader<'n> {
    device: &'n NvmlDevice<'n>,
    index: u32,
    inflight: &'n InFlight,
    read_errors: u32,
    /// Set by the first device-fatal error; from then on nothing is read.
    fault: Option<Reason>,
    /// The batch read before the collectors run; an entry's error is handled
    /// when it is taken.
    prefetched: Vec<(u32, Option<Result<f64, NvmlError>>)>,
    previous_state: GpuState,
    next_state: GpuState,
    keeps_totals: bool,
    facts: GpuFacts,
    /// Read once per run however many collectors ask.
    mig_mode: Option<Option<MigMode>>,
    compute_processes: Option<Option<Vec<ProcessInfo>>>,
    /// How often each warning was seen: the first is logged, the repeats
    /// summed up once in [`Self::finish`].
    seen: Vec<(String, u32)>,
}

impl<'n> DeviceReader<'n> {
    pub fn new(device: &'n NvmlDevice<'n>, index: u32, inflight: &'n InFlight) -> Self {
        DeviceReader {
            device,
            index,
            inflight,
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

    /// Applies the error policy to an error of `call` obtained some other way.
    pub fn note(&mut self, call: &str, error: &NvmlError) {
        let index = self.index;
        if unsupported(error) {
            log::debug!("GPU {index}: {call}: {error}");
        } else if device_fatal(error) {
            log::warn!("GPU {index}: {call}: {error}; reporting the GPU down");
            self.fault = Some(reason(error));
        } else {
            self.count_error(format!("GPU {index}: {call}: {error}"));
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

    /// `count` as `call` returned it, if no hardware exceeds `max`; else (a
    /// sentinel) dropped, logged and counted.
    pub fn bounded(&mut self, call: &str, count: u32, max: u32) -> Option<u32> {
        if count <= max {
            return Some(count);
        }
        self.count_error(format!(
            "GPU {}: {call} returned {count}, more than any GPU has ({max}); ignored",
            self.index
        ));
        None
    }

    /// Reads the field values `ids` (scope 0) in one call, for the collectors
    /// to take with [`Self::field`].
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

    /// Reads `fields` in one call, each entry's error left to the caller
    /// (`None` in all when the call itself failed).
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

    /// A prefetched field value that has no other source.
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
    /// function that gives the same reading; a reading that fails both ways
    /// counts as one error (the fallback's).
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

    /// The GPU's MIG mode (current and pending), read once per run.
    pub fn mig_mode(&mut self) -> Option<MigMode> {
        if self.mig_mode.is_none() {
            self.mig_mode = Some(self.read("nvmlDeviceGetMigMode", |d| d.mig_mode()));
        }
        self.mig_mode.clone().flatten()
    }

    /// The GPU's running compute processes, read once per run.
    pub fn compute_processes(&mut self) -> Option<Vec<ProcessInfo>> {
        if self.compute_processes.is_none() {
            let call = "nvmlDeviceGetComputeRunningProcesses_v3";
            self.compute_processes = Some(self.read(call, |d| d.running_compute_processes()));
        }
        self.compute_processes.clone().flatten()
    }

    /// A reading fixed while the driver is loaded: the state's value under
    /// `name`, else read through `call`; kept for the next run. `Some(None)`:
    /// not supported (kept too); `None`: failed (read again next run) or down.
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

    /// Hands the reader what the previous run left for this GPU, and
    /// [`Self::keeps_totals`].
    pub fn set_previous_state(&mut self, state: GpuState, keeps_totals: bool) {
        self.previous_state = state;
        self.keeps_totals = keeps_totals;
    }

    /// Whether running totals kept in the state may be published for this
    /// GPU: not when the state is unusable this run or the identity is not
    /// its own (a counter restarting from 0 would read as a reset).
    pub fn keeps_totals(&self) -> bool {
        self.keeps_totals
    }

    /// What the previous run left for this GPU.
    pub fn previous_state(&self) -> &GpuState {
        &self.previous_state
    }

    /// What this run leaves for the next (starts empty; see
    /// `state::StateFile::store`).
    pub fn next_state(&mut self) -> &mut GpuState {
        &mut self.next_state
    }

    /// Counts a read error that no NVML call returned (an impossible
    /// value), logged once.
    pub fn count_error(&mut self, message: String) {
        self.read_errors += 1;
        self.warn_once(message);
    }

    /// The repeated warnings summed up; what this run leaves for the next
    /// and how many reads failed, or why the GPU is down.
    pub fn finish(self) -> Result<(GpuState, u32), Reason> {
        for (message, count) in &self.seen {
            if *count > 1 {
                log::warn!("{message} (seen {count} times in this run)");
            }
        }
        match self.fault {
            Some(fault) => Err(fault),
            None => Ok((self.next_state, self.read_errors)),
        }
    }

    /// Calls `read` without the error policy, for callers that take some
    /// errors as answers; `None` when the GPU is down. Pass other errors to
    /// [`DeviceReader::note`].
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
