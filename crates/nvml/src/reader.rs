//! One GPU's NVML calls under the error policy: not supported left out
//! quietly, other errors counted and logged once, a device-fatal one marks the
//! GPU down.

use std::collections::BTreeSet;
use std::time::Instant;

use nvml_wrapper::error::NvmlError;

use super::calls::{Call, COMPUTE_PROCESSES, FIELD_VALUES, MIG_MODE};
use super::fields::Field;
use super::types::{Device as NvmlDevice, MigMode, ProcessInfo};
use super::{Error, Failure, InFlight, Scope};

pub struct DeviceReader<'n> {
    device: &'n NvmlDevice<'n>,
    index: u32,
    inflight: &'n InFlight,
    read_errors: u32,
    /// Set by the first device-fatal error; from then on nothing is read.
    fault: Option<Failure>,
    /// An entry's error is handled when it is taken.
    prefetched: Vec<(u32, Option<Result<f64, Error>>)>,
    /// Calls that answered NOT_SUPPORTED: not made again.
    unsupported: BTreeSet<String>,
    /// Read once per run however many collectors ask.
    mig_mode: Option<Option<MigMode>>,
    /// How many MIG slots to walk (the count read and bounded once a run).
    pub(crate) mig_slots: Option<Option<u32>>,
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
            mig_slots: None,
            compute_processes: None,
        }
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// `None` when not supported, failed (counted) or the GPU is down.
    pub fn read<'a, C: Call>(&mut self, call: C, args: C::Args<'a, 'n>) -> Option<C::Answer<'n>> {
        self.ask(call, None, args, |_| false)?.ok()
    }

    /// [`Self::read`] of one of the GPU's MIG devices (a NOT_SUPPORTED
    /// there is not remembered).
    pub fn read_on<'a, C: Call>(
        &mut self,
        device: &NvmlDevice<'n>,
        call: C,
        args: C::Args<'a, 'n>,
    ) -> Option<C::Answer<'n>> {
        self.ask(call, Some(device), args, |_| false)?.ok()
    }

    /// [`Self::read`], but the errors `expected` picks come back to the
    /// caller instead of being counted.
    pub fn read_expecting<'a, C: Call>(
        &mut self,
        call: C,
        args: C::Args<'a, 'n>,
        expected: impl Fn(&Error) -> bool,
    ) -> Option<Result<C::Answer<'n>, Error>> {
        self.ask(call, None, args, expected)
    }

    /// [`Self::read`] of a call that answers each entry on its own; an
    /// entry's error is counted as the call's.
    pub fn read_each<'a, C>(&mut self, call: C, args: C::Args<'a, 'n>) -> Option<Vec<Option<f64>>>
    where
        C: for<'x> Call<Answer<'x> = Vec<Result<f64, NvmlError>>>,
    {
        let answers = self.read(call, args)?.into_iter();
        let mut note = |e| self.note(&Error::new(C::NAME, e));
        Some(answers.map(|a| a.map_err(&mut note).ok()).collect())
    }

    pub fn assume_unsupported(&mut self, calls: BTreeSet<String>) {
        self.unsupported = calls;
    }

    pub fn unsupported_calls(&self) -> &BTreeSet<String> {
        &self.unsupported
    }

    /// The error policy: not supported logged quietly, device-fatal marks the
    /// GPU down, any other error counted and logged once.
    fn note(&mut self, error: &Error) {
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
        let values = self.read(FIELD_VALUES, &requests).unwrap_or_default();
        let error = |e| Error::new(FIELD_VALUES::NAME, e);
        let values = values.into_iter().map(|v| Some(v.map_err(error)));
        self.prefetched = ids.iter().copied().zip(values).collect();
    }

    /// The value for every caller, the error once (so it is counted once);
    /// `None` where it was not prefetched (or the prefetch failed) or its error
    /// was taken.
    fn take_field(&mut self, id: u32) -> Option<Result<f64, Error>> {
        let (_, entry) = self.prefetched.iter_mut().find(|(field, _)| *field == id)?;
        match entry {
            Some(Ok(value)) => Some(Ok(*value)),
            _ => entry.take(),
        }
    }

    pub fn field(&mut self, id: u32) -> Option<f64> {
        self.take_field(id)?.map_err(|e| self.note(&e)).ok()
    }

    /// A reading that fails both ways counts as one error (the fallback's).
    pub fn field_or(
        &mut self,
        id: u32,
        fallback: impl FnOnce(&mut Self) -> Option<f64>,
    ) -> Option<f64> {
        match self.take_field(id) {
            Some(Ok(value)) => return Some(value),
            Some(Err(error)) if !error.is_unsupported() && !error.is_device_fatal() => {
                log::debug!(
                    "GPU {}: {} field {id}: {error}; trying the function",
                    self.index,
                    FIELD_VALUES::NAME
                );
            }
            Some(Err(error)) => self.note(&error),
            None => {}
        }
        fallback(self)
    }

    pub fn mig_mode(&mut self) -> Option<MigMode> {
        if self.mig_mode.is_none() {
            self.mig_mode = Some(self.read(MIG_MODE, ()));
        }
        self.mig_mode.clone().flatten()
    }

    pub fn compute_processes(&mut self) -> Option<Vec<ProcessInfo>> {
        if self.compute_processes.is_none() {
            self.compute_processes = Some(self.read(COMPUTE_PROCESSES, ()));
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

    /// How many reads failed, or why the GPU is down.
    pub fn finish(self) -> Result<u32, Failure> {
        for (message, count) in self.seen.iter().filter(|(_, count)| *count > 1) {
            log::warn!("{message} (seen {count} times in this run)");
        }
        self.fault.map_or(Ok(self.read_errors), Err)
    }

    /// The one door: `call` made (on `device`, else the GPU) unless the GPU
    /// is down or it is known NOT_SUPPORTED, its error handled by
    /// [`Self::note`] unless `expected`. `None`: no answer.
    fn ask<'a, C: Call>(
        &mut self,
        _: C,
        device: Option<&NvmlDevice<'n>>,
        args: C::Args<'a, 'n>,
        expected: impl Fn(&Error) -> bool,
    ) -> Option<Result<C::Answer<'n>, Error>> {
        if self.fault.is_some() {
            return None;
        }
        let key = device.is_none().then(|| C::key(&args)).flatten();
        let answer = match &key {
            Some(key) if self.unsupported.contains(key) => Err(NvmlError::NotSupported),
            _ => {
                let (index, call) = (self.index, C::NAME);
                let make = || C::make(device.unwrap_or(self.device), args);
                let started = Instant::now();
                let answer = self.inflight.during(Scope::Gpu(index), call, make);
                log::trace!("GPU {index}: {call} took {:?}", started.elapsed());
                answer
            }
        };
        if let (Err(NvmlError::NotSupported), Some(key)) = (&answer, key) {
            self.unsupported.insert(key);
        }
        match answer.map_err(|e| Error::new(C::NAME, e)) {
            Err(error) if !expected(&error) => {
                self.note(&error);
                None
            }
            answer => Some(answer),
        }
    }
}
