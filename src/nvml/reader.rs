//! Reading one GPU: the error policy of `nvml` in one place.

use std::ffi::{c_char, c_uint, CStr};
use std::time::Instant;

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::Device as NvmlDevice;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t, NvmlLib};

use super::fields::{self, Field};
use super::{device_fatal, reason, unsupported};
use crate::inflight::{InFlight, Scope};
use crate::metrics::{self, Family};
use crate::reason::Reason;
use crate::snapshot::{Device, Sample};

/// Collects the samples of one GPU while applying the error policy.
pub(super) struct DeviceReader<'n> {
    device: &'n NvmlDevice<'n>,
    index: u32,
    inflight: &'n InFlight,
    samples: Vec<Sample>,
    read_errors: u32,
    /// Set by the first device-fatal error; from then on nothing is read.
    fault: Option<Reason>,
    /// Field values read in one batch before the collectors run (see [`Self::prefetch`]).
    prefetched: Vec<(u32, Option<f64>)>,
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
        }
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
            log::warn!("GPU {index}: {call}: {error}");
            self.read_errors += 1;
        }
    }

    /// Reads the field values `ids` (scope 0) in one `nvmlDeviceGetFieldValues`
    /// call, for the collectors to take with [`Self::field`]: one driver round
    /// trip instead of one call per reading.
    pub fn prefetch(&mut self, ids: &[u32]) {
        let requests: Vec<Field> = ids.iter().map(|&id| Field { id, scope: 0 }).collect();
        let values = fields::read(self, &requests);
        self.prefetched = ids.iter().copied().zip(values).collect();
    }

    /// A prefetched field value; `None` if it was not prefetched or NVML could
    /// not give it (the caller then falls back to the function call).
    pub fn field(&self, id: u32) -> Option<f64> {
        self.prefetched
            .iter()
            .find(|(field, _)| *field == id)
            .and_then(|(_, value)| *value)
    }

    /// Adds a sample; a non-finite value (never valid NVML data) is dropped.
    pub fn push(&mut self, sample: Sample) {
        if sample.value.is_finite() {
            self.samples.push(sample);
        } else {
            self.reject(sample.family, sample.value);
        }
    }

    /// Drops an impossible reading of `family` (a sentinel, a utilization above
    /// 100 %), logged and counted like a failed read.
    pub fn reject(&mut self, family: &Family, value: f64) {
        log::warn!(
            "GPU {}: {} read {value}, which is impossible; dropped",
            self.index,
            family.name
        );
        self.read_errors += 1;
    }

    /// Adds a sample without extra labels.
    pub fn gauge(&mut self, family: &'static Family, value: f64) {
        self.push(Sample::new(family, value));
    }

    /// The GPU's samples, or only its down state if a fatal error occurred.
    pub fn finish(mut self, uuid: String) -> Device {
        if let Some(fault) = self.fault {
            return down(self.index, uuid, fault);
        }
        self.samples.push(Sample::new(&metrics::UP, 1.0));
        self.samples.push(Sample::new(
            &metrics::COLLECTOR_READ_ERRORS,
            f64::from(self.read_errors),
        ));
        Device {
            index: self.index,
            uuid,
            samples: self.samples,
        }
    }
}

/// A GPU reported down for `reason`, with no other readings.
pub(super) fn down(index: u32, uuid: String, reason: Reason) -> Device {
    Device {
        index,
        uuid,
        samples: vec![
            Sample::new(&metrics::UP, 0.0),
            Sample::new(&metrics::DOWN_REASON, 1.0).with("reason", reason.label()),
        ],
    }
}

/// Raw access for the calls nvml-wrapper does not wrap, or wraps lossily.
impl<'n> DeviceReader<'n> {
    /// Like [`DeviceReader::read`], but hands `read` the raw library and handle.
    pub fn read_raw<T>(
        &mut self,
        call: &'static str,
        read: impl FnOnce(&NvmlLib, nvmlDevice_t) -> Result<T, NvmlError>,
    ) -> Option<T> {
        // SAFETY: the handle stays valid while `self.device` (and so NVML) lives.
        self.read(call, |device| unsafe {
            read(device.nvml().lib(), device.handle())
        })
    }

    /// Reads a string getter, decoding invalid UTF-8 lossily instead of failing,
    /// so a hostile or corrupted string cannot hide a GPU.
    pub fn read_string(
        &mut self,
        call: &'static str,
        symbol: impl FnOnce(&NvmlLib) -> Result<&StringGetter, NvmlError>,
    ) -> Option<String> {
        self.read_raw(call, |lib, handle| {
            let getter = symbol(lib)?;
            let mut buffer = [0 as c_char; STRING_BUFFER];
            // SAFETY: the buffer's length is passed; NVML NUL-terminates within it.
            nvml_try(unsafe { getter(handle, buffer.as_mut_ptr(), STRING_BUFFER as c_uint) })?;
            // SAFETY: NVML returned success, so the buffer holds a C string.
            let text = unsafe { CStr::from_ptr(buffer.as_ptr()) };
            Ok(text.to_string_lossy().into_owned())
        })
    }
}

/// Large enough for every NVML string (the longest documented buffer is 96 bytes).
const STRING_BUFFER: usize = 256;

/// The signature shared by NVML's string getters (name, UUID, serial, ...).
pub(super) type StringGetter =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;

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
