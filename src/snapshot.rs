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

impl Snapshot {
    /// Gives each GPU whose UUID could not be read the UUID an earlier run knew
    /// it by, so that a GPU that fell off the bus keeps its series; but only
    /// when the identity is confirmed, so that no GPU ever takes another's UUID:
    /// - a GPU whose PCI bus id was read takes the UUID known at that bus id
    ///   (and serial, where both runs read one);
    /// - a GPU with no bus id takes the UUID known at its index only if no other
    ///   GPU of this snapshot has that UUID or that bus id (the GPU at the index
    ///   is still the one that was there, not a renumbered neighbour).
    pub fn fill_missing_uuids(&mut self, known: &[KnownGpu]) {
        let taken_uuids: Vec<String> = self
            .devices
            .iter()
            .filter(|d| !d.uuid.is_empty())
            .map(|d| d.uuid.clone())
            .collect();
        let read_buses: Vec<String> = self
            .devices
            .iter()
            .filter(|d| !d.pci_bus_id.is_empty())
            .map(|d| d.pci_bus_id.clone())
            .collect();
        for device in self.devices.iter_mut().filter(|d| d.uuid.is_empty()) {
            let found = if device.pci_bus_id.is_empty() {
                known.iter().find(|k| {
                    k.index == device.index
                        && !taken_uuids.contains(&k.uuid)
                        && (k.pci_bus_id.is_empty() || !read_buses.contains(&k.pci_bus_id))
                })
            } else {
                known.iter().find(|k| {
                    k.is_at(&device.pci_bus_id, &device.serial) && !taken_uuids.contains(&k.uuid)
                })
            };
            if let Some(k) = found {
                device.uuid.clone_from(&k.uuid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: u32, uuid: &str, bus: &str) -> Device {
        Device {
            index,
            uuid: uuid.into(),
            pci_bus_id: bus.into(),
            ..Device::default()
        }
    }

    fn known(index: u32, uuid: &str, bus: &str) -> KnownGpu {
        KnownGpu {
            index,
            uuid: uuid.into(),
            pci_bus_id: bus.into(),
            serial: String::new(),
        }
    }

    fn uuids(snapshot: &Snapshot) -> Vec<&str> {
        snapshot.devices.iter().map(|d| d.uuid.as_str()).collect()
    }

    #[test]
    fn a_lost_gpu_keeps_the_uuid_known_at_its_index() {
        let mut snapshot = Snapshot {
            host: Vec::new(),
            devices: vec![
                device(0, "GPU-a", "A"),
                device(1, "", ""),
                device(2, "", ""),
            ],
        };
        snapshot.fill_missing_uuids(&[known(0, "GPU-old", "A"), known(1, "GPU-b", "B")]);
        assert_eq!(uuids(&snapshot), ["GPU-a", "GPU-b", ""]);
    }

    #[test]
    fn a_renumbered_gpu_never_takes_another_gpus_uuid() {
        // GPU-a (bus A) vanished; GPU-b (bus B) is now index 0 and its UUID read
        // failed while it is up: it is found by its bus id, not by index 0.
        let before = [known(0, "GPU-a", "A"), known(1, "GPU-b", "B")];
        let mut snapshot = Snapshot {
            host: Vec::new(),
            devices: vec![device(0, "", "B")],
        };
        snapshot.fill_missing_uuids(&before);
        assert_eq!(uuids(&snapshot), ["GPU-b"]);
        // Nothing readable at index 0 while another GPU sits on bus A now: the
        // index alone does not confirm GPU-a.
        let mut snapshot = Snapshot {
            host: Vec::new(),
            devices: vec![device(0, "", ""), device(1, "GPU-c", "A")],
        };
        snapshot.fill_missing_uuids(&before);
        assert_eq!(uuids(&snapshot), ["", "GPU-c"]);
        // A bus id that no earlier run saw gives no UUID.
        let mut snapshot = Snapshot {
            host: Vec::new(),
            devices: vec![device(0, "", "Z")],
        };
        snapshot.fill_missing_uuids(&before);
        assert_eq!(uuids(&snapshot), [""]);
    }
}
