//! The pure merge of the previous state with this run's readings.

use super::problem::Problem;
use std::collections::BTreeMap;

use super::schema::{GpuState, State, MAX_FIXED, MAX_GPUS, MAX_PARTS, VERSION};
use crate::snapshot::Device;

/// `next` with this run's GPU readings merged in, within the bounds: what a
/// run did not read (a GPU down, totals, links, GPUs not seen while there is
/// room) keeps what it had.
pub(super) fn merge(
    mut next: State,
    devices: &[Device],
    states: &BTreeMap<String, GpuState>,
    driver_version: &str,
) -> Result<State, Problem> {
    next.version = VERSION;
    if next.driver_version != driver_version {
        for gpu in next.gpus.values_mut() {
            *gpu = gpu.after_driver_change();
        }
        next.driver_version = driver_version.to_owned();
    }
    for device in devices.iter().filter(|d| !d.uuid.is_empty()) {
        let before = next.gpus.remove(&device.uuid).unwrap_or_default();
        let mut gpu = states
            .get(&device.uuid)
            .cloned()
            .unwrap_or_else(|| before.clone());
        for (stream, carry) in &before.carries {
            gpu.carries.entry(*stream).or_insert(*carry);
        }
        // A part this run did not set keeps what it had, while there is
        // room: what is stored is never more than the next run reads.
        for (name, kept) in &before.parts {
            if gpu.parts.len() < MAX_PARTS {
                gpu.parts
                    .entry(name.clone())
                    .or_insert_with(|| kept.clone());
            }
        }
        gpu.index = device.index;
        let or_before =
            |read: &String, known: &String| if read.is_empty() { known } else { read }.clone();
        gpu.pci_bus_id = or_before(&device.pci_bus_id, &before.pci_bus_id);
        gpu.serial = or_before(&device.serial, &before.serial);
        while gpu.fixed.len() + gpu.fixed_labels.len() > MAX_FIXED {
            if gpu.fixed_labels.pop_last().is_none() {
                gpu.fixed.pop_last();
            }
        }
        next.gpus.insert(device.uuid.clone(), gpu);
    }
    let mut excess = next.gpus.len().saturating_sub(MAX_GPUS);
    next.gpus.retain(|uuid, _| {
        let unseen = excess > 0 && !devices.iter().any(|d| &d.uuid == uuid);
        excess -= usize::from(unseen);
        !unseen
    });
    if next.gpus.len() > MAX_GPUS {
        return Err(Problem::TooManyGpus(next.gpus.len()));
    }
    Ok(next)
}
