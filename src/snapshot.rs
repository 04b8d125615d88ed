//! One run's readings as plain data: no NVML types, no I/O.
//!
//! A [`Snapshot`] is what `render` turns into text. It holds host-wide samples
//! (collector health, driver versions) and one [`Device`] per GPU. Every device
//! sample is rendered with the device's `gpu` and `uuid` labels first, so readers
//! only attach the labels that distinguish samples within a family (`clock`,
//! `reason`, ...).
//!
//! Invariants the producers keep:
//! - sample values are finite and already in base units (the `nvml` reader
//!   converts, and drops what it cannot convert);
//! - within one device and family, label sets are distinct;
//! - a device that failed holds only its `up` and down-reason samples (and its
//!   XID counters, which come from the kernel log, not from the GPU), never
//!   partial readings.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::metrics::Family;

/// A label value that is usually a static string and only sometimes owned.
pub type LabelValue = Cow<'static, str>;

/// One `name="value"` pair beyond the identity labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub name: &'static str,
    pub value: LabelValue,
}

/// One sample of one family.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub family: &'static Family,
    pub labels: Vec<Label>,
    pub value: f64,
}

impl Sample {
    /// A sample with no labels beyond the identity ones.
    pub fn new(family: &'static Family, value: f64) -> Self {
        Sample {
            family,
            labels: Vec::new(),
            value,
        }
    }

    /// Adds a label; labels render in the order they were added. `name` must be
    /// one of the family's declared labels.
    pub fn with(mut self, name: &'static str, value: impl Into<LabelValue>) -> Self {
        debug_assert!(
            self.family.labels.contains(&name),
            "{} does not declare the label {name}",
            self.family.name
        );
        self.labels.push(Label {
            name,
            value: value.into(),
        });
        self
    }
}

/// Everything read from one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Device {
    /// NVML's index of the GPU (the `gpu` label).
    pub index: u32,
    /// NVML's UUID (`GPU-…`); empty when NVML could not tell it.
    pub uuid: String,
    /// PCI bus id (`00000000:17:00.0`); empty when NVML could not tell it.
    pub pci_bus_id: String,
    /// Board serial; empty when the GPU has none or NVML could not tell it.
    pub serial: String,
    pub samples: Vec<Sample>,
    /// What the readers want the next run to know (see `state`), by key.
    pub remembered: BTreeMap<String, String>,
}

/// Everything one run writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Samples without device labels.
    pub host: Vec<Sample>,
    /// GPUs in index order.
    pub devices: Vec<Device>,
}

/// A GPU as an earlier run knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownGpu {
    pub index: u32,
    pub uuid: String,
    /// Empty when it was not known.
    pub pci_bus_id: String,
    /// Empty when it was not known.
    pub serial: String,
}

impl KnownGpu {
    /// Whether this is the GPU at PCI bus id `bus` (read this run, not empty)
    /// with `serial` (where both runs read one).
    pub fn is_at(&self, bus: &str, serial: &str) -> bool {
        !bus.is_empty()
            && self.pci_bus_id == bus
            && (self.serial.is_empty() || serial.is_empty() || self.serial == serial)
    }
}
