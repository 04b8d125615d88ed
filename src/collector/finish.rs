//! A GPU's readings made a device: down with its reason, or up with its
//! samples, duplicates merged.

use std::collections::hash_map::{Entry, HashMap};

use crate::identity::Identity;
use crate::metrics::{self, Merge};
use crate::reason::Reason;
use crate::snapshot::{Device, Sample, Status};
use crate::state::schema::GpuState;

/// `state: None` keeps what the state file had.
#[derive(Debug, Default)]
pub struct Finished {
    pub device: Device,
    pub state: Option<GpuState>,
}

/// `stuck_in`: the NVML call it hung in, if known.
pub fn down(
    index: u32,
    identity: &Identity,
    reason: Reason,
    stuck_in: Option<&'static str>,
) -> Device {
    Device {
        status: Status::Down { reason, stuck_in },
        samples: vec![
            metrics::UP.sample(0.0),
            metrics::DOWN_REASON.sample_with([reason.label()], 1.0),
        ],
        ..identified(index, identity)
    }
}

impl From<Device> for Finished {
    fn from(device: Device) -> Finished {
        Finished {
            device,
            state: None,
        }
    }
}

pub(super) fn identified(index: u32, identity: &Identity) -> Device {
    Device {
        index,
        uuid: identity.uuid.clone(),
        pci_bus_id: identity.pci_bus_id.clone(),
        serial: identity.serial.clone(),
        ..Device::default()
    }
}

/// Merges samples of one family and labels by its [`Merge`] rule, at the
/// first one's position. How many were merged away.
pub(super) fn merge_duplicates(samples: &mut Vec<Sample>) -> usize {
    let key = |sample: &Sample| {
        let labels = sample.labels.iter().map(|l| (l.name, l.value.clone()));
        (sample.family.name, labels.collect::<Vec<_>>())
    };
    let total = samples.len();
    let mut first = HashMap::with_capacity(total);
    let mut kept: Vec<Sample> = Vec::with_capacity(total);
    for sample in samples.drain(..) {
        match first.entry(key(&sample)) {
            Entry::Vacant(slot) => {
                slot.insert(kept.len());
                kept.push(sample);
            }
            Entry::Occupied(slot) => {
                let earlier = &mut kept[*slot.get()];
                earlier.value = match earlier.family.merge() {
                    Merge::Sum => earlier.value + sample.value,
                    Merge::Max => earlier.value.max(sample.value),
                };
            }
        }
    }
    *samples = kept;
    total - samples.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::families;

    families! {
        MEMORY: Gauge(Bytes), "nvidia_gpu_test_memory_bytes", ["pid", "user"], "Bytes.";
        INFO: Gauge(Number), "nvidia_gpu_test_info", ["id", "profile"], "A state.";
    }

    #[test]
    fn duplicates_merge_bytes_summed_states_kept() {
        // The pid alone, as for a process whose owner is unknown.
        let process =
            |pid: &'static str, bytes: f64| MEMORY.sample_some([Some(pid.into()), None], bytes);
        let mig = |used: f64| INFO.sample_with(["1", "1g.10gb"], used);
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
