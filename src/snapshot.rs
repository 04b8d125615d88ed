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

use crate::metrics::{Family, Labelled};
use crate::state::schema::GpuState;

/// A label value that is usually a static string and only sometimes owned.
pub type LabelValue = Cow<'static, str>;

/// One `name="value"` pair beyond the identity labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub name: &'static str,
    pub value: LabelValue,
}

/// One sample of one family. Made by the constructors of [`Labelled`]
/// (below), which label it with the names its family declares, in their
/// order.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub family: &'static Family,
    pub labels: Vec<Label>,
    pub value: f64,
}

/// The constructors of samples: the family's handle gives the label names,
/// in declared order, and its type the number of values.
impl<const N: usize> Labelled<N> {
    /// A sample with one value for each declared label, in declared order:
    /// a wrong number of values does not compile, and the names cannot be
    /// misspelled or reordered.
    ///
    /// ```
    /// use nvidia_textfile_exporter::metrics;
    ///
    /// let sample = metrics::ECC_ERRORS.sample_with(["corrected", "volatile"], 3.0);
    /// let names: Vec<&str> = sample.labels.iter().map(|l| l.name).collect();
    /// assert_eq!(names, ["type", "scope"]);
    /// ```
    ///
    /// `nvidia_gpu_ecc_errors_total` declares two labels, so one value is
    /// refused at compile time:
    ///
    /// ```compile_fail,E0308
    /// use nvidia_textfile_exporter::metrics;
    ///
    /// metrics::ECC_ERRORS.sample_with(["corrected"], 3.0);
    /// ```
    pub fn sample_with<V: Into<LabelValue>>(self, values: [V; N], value: f64) -> Sample {
        self.sample_some(values.map(|v| Some(v.into())), value)
    }

    /// Like [`Self::sample_with`], but a label whose value is `None` is left
    /// out: for the per-process families, whose instance ids and owner are
    /// known only for some processes.
    pub fn sample_some(self, values: [Option<LabelValue>; N], value: f64) -> Sample {
        let labels = self
            .family()
            .labels
            .iter()
            .zip(values)
            .filter_map(|(&name, value)| {
                Some(Label {
                    name,
                    value: value?,
                })
            })
            .collect();
        Sample {
            family: self.family(),
            labels,
            value,
        }
    }
}

impl Labelled<0> {
    /// A sample with no labels beyond the identity ones.
    pub fn sample(self, value: f64) -> Sample {
        Sample {
            family: self.family(),
            labels: Vec::new(),
            value,
        }
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
    /// What the readers leave for the next run (see `state`); `None` for a
    /// GPU that could not be read, which keeps what it had.
    pub state: Option<GpuState>,
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
