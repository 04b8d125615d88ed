//! Reading one GPU: the error policy of `nvml` in one place.

use std::ffi::{c_char, c_uint, CStr};
use std::time::Instant;

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::Device as NvmlDevice;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t, NvmlLib};

use std::collections::BTreeMap;

use super::fields::{self, Field};
use super::identity::Identity;
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
    /// What the previous run remembered of this GPU.
    recalled: BTreeMap<String, String>,
    /// What this run leaves for the next.
    remembered: BTreeMap<String, String>,
    /// How often each (call, error) was seen: the first is logged, the repeats
    /// are summed up once in [`Self::finish`], so a loop cannot flood the log.
    seen: Vec<(String, u32)>,
    /// The GPM window opened before the other collectors ran (see `gpm`).
    pub(super) window: Option<super::gpm::Window<'n>>,
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
            recalled: BTreeMap::new(),
            remembered: BTreeMap::new(),
            window: None,
        }
    }

    /// NVML's index of the GPU.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The NVML library, for buffers that outlive one call (GPM samples).
    pub fn lib(&self) -> &'n NvmlLib {
        self.device.nvml().lib()
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

    /// Hands the reader what the previous run remembered of this GPU.
    pub fn recall_from(&mut self, memory: BTreeMap<String, String>) {
        self.recalled = memory;
    }

    /// What the previous run remembered under `key`, if anything.
    #[allow(dead_code)] // used by the sample-window readers
    pub fn recall(&self, key: &str) -> Option<&str> {
        self.recalled.get(key).map(String::as_str)
    }

    /// Leaves `value` under `key` for the next run (a one-word key; the value
    /// must hold no line break).
    pub fn remember(&mut self, key: &str, value: String) {
        self.remembered.insert(key.to_owned(), value);
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
        let message = format!(
            "GPU {}: {} read {value}, which is impossible; dropped",
            self.index, family.name
        );
        self.warn_once(message);
        self.read_errors += 1;
    }

    /// Adds a sample without extra labels.
    pub fn gauge(&mut self, family: &'static Family, value: f64) {
        self.push(Sample::new(family, value));
    }

    /// The GPU's samples, or only its down state if a fatal error occurred.
    pub fn finish(mut self, uuid: String, identity: Identity) -> Device {
        for (message, count) in &self.seen {
            if *count > 1 {
                log::warn!("{message} (seen {count} times in this run)");
            }
        }
        if let Some(fault) = self.fault {
            let mut device = down(self.index, uuid, fault);
            device.pci_bus_id = identity.pci_bus_id;
            device.serial = identity.serial;
            return device;
        }
        self.samples.push(Sample::new(&metrics::UP, 1.0));
        self.samples.push(Sample::new(
            &metrics::COLLECTOR_READ_ERRORS,
            f64::from(self.read_errors),
        ));
        Device {
            index: self.index,
            uuid,
            pci_bus_id: identity.pci_bus_id,
            serial: identity.serial,
            samples: self.samples,
            remembered: self.remembered,
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
        ..Device::default()
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

impl<'n> DeviceReader<'n> {
    /// Reads a getter that writes one C enum and converts the value with
    /// nvml-wrapper's `TryFrom`. Only the return code goes through the error
    /// policy (so a return code newer than nvml-wrapper is a counted error); a
    /// value newer than nvml-wrapper knows is `Some(Err(raw))`, for the caller
    /// to label as unknown.
    pub fn read_enum<E: TryFrom<c_uint, Error = NvmlError>>(
        &mut self,
        call: &'static str,
        symbol: impl FnOnce(&NvmlLib) -> Result<&EnumGetter, NvmlError>,
    ) -> Option<Result<E, c_uint>> {
        let raw = self.read_raw(call, |lib, handle| {
            let getter = symbol(lib)?;
            let mut value: c_uint = 0;
            // SAFETY: the getter writes one C enum (an unsigned int) through the pointer.
            nvml_try(unsafe { getter(handle, &mut value) })?;
            Ok(value)
        })?;
        Some(E::try_from(raw).map_err(|_| {
            log::debug!(
                "GPU {}: {call}: value {raw} is newer than this exporter",
                self.index
            );
            raw
        }))
    }
}

/// The signature shared by NVML's getters of one enum value.
pub(super) type EnumGetter = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;

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
