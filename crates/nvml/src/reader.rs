//! One GPU's NVML calls under the error policy: not supported left out
//! quietly, other errors counted and logged once, a device-fatal one marks the
//! GPU down.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Instant;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::MigMode;
use nvml_wrapper::Device as NvmlDevice;

use super::calls::Call;
use super::fields::{self, Field};
use super::{Error, Failure, InFlight, Scope};

/// E.g. `nvmlDeviceGetPowerUsage`, `nvmlDeviceGetClockInfo(Video)`.
fn unsupported_key<A: Debug>(name: &str, args: &A) -> String {
    match format!("{args:?}") {
        unit if unit == "()" => name.to_owned(),
        args => format!("{name}({args})"),
    }
}

pub struct DeviceReader<'n> {
    device: &'n NvmlDevice<'n>,
    index: u32,
    inflight: &'n InFlight,
    read_errors: u32,
    /// Set by the first device-fatal error; from then on nothing is read.
    fault: Option<Failure>,
    /// An entry's error is handled when it is taken.
    prefetched: Vec<(u32, Option<Result<f64, NvmlError>>)>,
    /// Calls that answered NOT_SUPPORTED: not made again.
    unsupported: BTreeSet<String>,
    /// Read once per run however many collectors ask.
    mig_mode: Option<Option<MigMode>>,
    compute_processes: Option<Option<Vec<ProcessInfo>>>,
    /// The first of each warning is logged, the repeats summed up in
    /// [`Self::finish`].
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
            unsupported: BTreeSet::new(),
            mig_mode: None,
            compute_processes: None,
        }
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// `None` when not supported, failed (counted) or the GPU is down.
    pub fn read<A: Debug, T>(&mut self, call: Call<A, T>, args: A) -> Option<T> {
        self.try_read(call, args)?.map_err(|e| self.note(&e)).ok()
    }

    /// [`Self::read`] of one of the GPU's MIG devices.
    pub fn read_on<A, T>(
        &mut self,
        device: &NvmlDevice<'_>,
        call: Call<A, T>,
        args: A,
    ) -> Option<T> {
        self.read_by(call.name, |_| (call.make)(device, args))
    }

    /// Without the error policy (pass errors to [`Self::note`]); `None` when
    /// the GPU is down. A call known NOT_SUPPORTED answers so without being made.
    pub fn try_read<A: Debug, T>(&mut self, call: Call<A, T>, args: A) -> Option<Result<T, Error>> {
        let key = unsupported_key(call.name, &args);
        if self.unsupported.contains(&key) {
            return self
                .fault
                .is_none()
                .then(|| Err(Error::new(call.name, NvmlError::NotSupported)));
        }
        let answer = self.attempt(call.name, |d| (call.make)(d, args))?;
        if matches!(answer, Err(NvmlError::NotSupported)) {
            self.unsupported.insert(key);
        }
        Some(answer.map_err(|e| Error::new(call.name, e)))
    }

    pub fn assume_unsupported(&mut self, calls: BTreeSet<String>) {
        self.unsupported = calls;
    }

    pub fn unsupported_calls(&self) -> &BTreeSet<String> {
        &self.unsupported
    }

    pub(crate) fn read_by<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlDevice<'n>) -> Result<T, NvmlError>,
    ) -> Option<T> {
        let answer = self.attempt(call, read)?;
        answer.map_err(|e| self.note(&Error::new(call, e))).ok()
    }

    /// Applies the error policy to an error obtained some other way.
    pub fn note(&mut self, error: &Error) {
        let (index, call) = (self.index, error.call);
        if error.is_unsupported() {
            log::debug!("GPU {index}: {call}: {error}");
        } else if error.is_device_fatal() {
            log::warn!("GPU {index}: {call}: {error}; reporting the GPU down");
            self.fault = Some(error.failure());
        } else {
            self.count_error(format!("GPU {index}: {call}: {error}"));
        }
    }

    /// A count above `max`, which no hardware exceeds, is a sentinel:
    /// dropped, logged and counted.
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

    /// For the collectors to take with [`Self::field`].
    pub fn prefetch(&mut self, ids: &[u32]) {
        let requests: Vec<Field> = ids.iter().map(|&id| Field { id, scope: 0 }).collect();
        let values = self.fetch_fields(&requests);
        self.prefetched = ids.iter().copied().zip(values).collect();
    }

    /// `None` where a field is not supported or failed (counted).
    pub fn read_fields(&mut self, fields: &[Field]) -> Vec<Option<f64>> {
        self.fetch_fields(fields)
            .into_iter()
            .map(|value| {
                value?
                    .map_err(|e| self.note(&Error::new(fields::CALL, e)))
                    .ok()
            })
            .collect()
    }

    /// `None` in all when the call itself failed.
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

    /// The value for every caller, the error once (so it is counted once).
    fn take_field(&mut self, id: u32) -> Option<Result<f64, NvmlError>> {
        let entry = &mut self
            .prefetched
            .iter_mut()
            .find(|(field, _)| *field == id)?
            .1;
        match entry {
            Some(Ok(value)) => Some(Ok(*value)),
            _ => entry.take(),
        }
    }

    pub fn field(&mut self, id: u32) -> Option<f64> {
        let value = self.take_field(id)?;
        value
            .map_err(|e| self.note(&Error::new(fields::CALL, e)))
            .ok()
    }

    /// A reading that fails both ways counts as one error (the fallback's).
    pub fn field_or(
        &mut self,
        id: u32,
        fallback: impl FnOnce(&mut Self) -> Option<f64>,
    ) -> Option<f64> {
        match self
            .take_field(id)
            .map(|value| value.map_err(|e| Error::new(fields::CALL, e)))
        {
            Some(Ok(value)) => return Some(value),
            Some(Err(error)) if !error.is_unsupported() && !error.is_device_fatal() => {
                log::debug!(
                    "GPU {}: {} field {id}: {error}; trying the function",
                    self.index,
                    fields::CALL
                );
            }
            Some(Err(error)) => self.note(&error),
            None => {}
        }
        fallback(self)
    }

    pub fn mig_mode(&mut self) -> Option<MigMode> {
        if self.mig_mode.is_none() {
            self.mig_mode = Some(self.read_by("nvmlDeviceGetMigMode", |d| d.mig_mode()));
        }
        self.mig_mode.clone().flatten()
    }

    pub fn compute_processes(&mut self) -> Option<Vec<ProcessInfo>> {
        if self.compute_processes.is_none() {
            let call = "nvmlDeviceGetComputeRunningProcesses_v3";
            self.compute_processes = Some(self.read_by(call, |d| d.running_compute_processes()));
        }
        self.compute_processes.clone().flatten()
    }

    /// A read error no NVML call returned (an impossible value), logged once.
    pub fn count_error(&mut self, message: String) {
        self.read_errors += 1;
        match self.seen.iter_mut().find(|(seen, _)| *seen == message) {
            Some((_, count)) => *count += 1,
            None => {
                log::warn!("{message}");
                self.seen.push((message, 1));
            }
        }
    }

    /// How many reads failed so far this run (NOT_SUPPORTED is no failure).
    pub fn read_errors(&self) -> u32 {
        self.read_errors
    }

    /// How many reads failed, or why the GPU is down.
    pub fn finish(self) -> Result<u32, Failure> {
        for (message, count) in &self.seen {
            if *count > 1 {
                log::warn!("{message} (seen {count} times in this run)");
            }
        }
        match self.fault {
            Some(fault) => Err(fault),
            None => Ok(self.read_errors),
        }
    }

    /// `None` when the GPU is down.
    pub(crate) fn attempt<T>(
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
