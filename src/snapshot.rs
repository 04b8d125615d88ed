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
//! - a device that failed holds only its `up` and down-reason samples, never
//!   partial readings.

use std::borrow::Cow;

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
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// NVML's index of the GPU (the `gpu` label).
    pub index: u32,
    /// NVML's UUID (`GPU-…`); empty when NVML could not tell it.
    pub uuid: String,
    pub samples: Vec<Sample>,
}

/// Everything one run writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Samples without device labels.
    pub host: Vec<Sample>,
    /// GPUs in index order.
    pub devices: Vec<Device>,
}

impl Snapshot {
    /// Gives each GPU whose UUID could not be read the UUID `known` lists for its
    /// index, so a GPU that fell off the bus keeps the series it had.
    pub fn fill_missing_uuids(&mut self, known: &[(u32, String)]) {
        for device in self.devices.iter_mut().filter(|d| d.uuid.is_empty()) {
            if let Some((_, uuid)) = known.iter().find(|(index, _)| *index == device.index) {
                device.uuid.clone_from(uuid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_missing_uuids_are_filled() {
        let device = |index, uuid: &str| Device {
            index,
            uuid: uuid.into(),
            samples: Vec::new(),
        };
        let mut snapshot = Snapshot {
            host: Vec::new(),
            devices: vec![device(0, "GPU-now"), device(1, ""), device(2, "")],
        };
        snapshot.fill_missing_uuids(&[(0, "GPU-old".into()), (1, "GPU-b".into())]);
        let uuids: Vec<&str> = snapshot.devices.iter().map(|d| d.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-now", "GPU-b", ""]);
    }
}
