//! Kubernetes: the kubelet's device-plugin checkpoint
//! (`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`), JSON that
//! the kubelet replaces atomically: `{"Data": {"PodDeviceEntries": [{"PodUID",
//! "ContainerName", "ResourceName", "DeviceIDs", …}], …}, "Checksum"}`.
//! `DeviceIDs` is a list before Kubernetes 1.20 and a map from NUMA node
//! (`"-1"` without topology) to a list since. NVIDIA's device plugin names
//! GPUs and MIG instances by UUID, a time-sliced replica with a `::<n>`
//! suffix; entries of other resources (ids that are no UUID) are not GPUs.
//! An init container's devices go to the pod's next container, both entries
//! kept: a device is counted once per pod, for the last container given it.
//! The kubelet keeps a finished pod's entries until its next allocation, so
//! a pod counts only while its control group exists (`alive`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::file;
use super::model::{Allocation, Device, Task};
use crate::owner::kubernetes::{is_name, is_uid};

/// Far more than a node's checkpoint holds (about 300 bytes an entry).
const MAX_SIZE: u64 = 4 << 20;

#[derive(Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "DeviceIDs")]
    devices: DeviceIds,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum DeviceIds {
    /// Kubernetes 1.20 and later: by NUMA node.
    ByNode(BTreeMap<String, Vec<String>>),
    List(Vec<String>),
}

/// The checkpoint's GPU allocations; a checkpoint that is not one costs
/// all of them, an entry that is not one only its own.
pub fn read(path: &Path) -> (Vec<Allocation>, Vec<String>) {
    let named = |why: String| format!("the kubelet's checkpoint {}: {why}", path.display());
    match file::json::<Checkpoint>(path, MAX_SIZE, "checkpoint") {
        Ok(Some(checkpoint)) => {
            let (allocations, problems) = parse(checkpoint.data.entries.unwrap_or_default());
            (allocations, problems.into_iter().map(named).collect())
        }
        Ok(None) => Default::default(),
        Err(why) => (Vec::new(), vec![named(why)]),
    }
}

fn parse(entries: Vec<serde_json::Value>) -> (Vec<Allocation>, Vec<String>) {
    let (mut allocations, mut problems) = (Vec::new(), Vec::new());
    for (n, entry) in entries.into_iter().enumerate() {
        let entry = match serde_json::from_value::<Entry>(entry) {
            Ok(entry) => entry,
            Err(e) => {
                problems.push(format!("entry {n} is not a pod's devices ({e})"));
                continue;
            }
        };
        if !is_uid(&entry.pod_uid) || !is_name(&entry.container) {
            problems.push(format!("entry {n} names no pod's container"));
            continue;
        }
        let ids = match entry.devices {
            DeviceIds::ByNode(nodes) => nodes.into_values().flatten().collect(),
            DeviceIds::List(ids) => ids,
        };
        for id in ids {
            // Other resources' devices (NICs, FPGAs) are not GPUs.
            let Some((device, shared)) = Device::from_uuid(&id) else {
                continue;
            };
            let task = Task::Pod {
                uid: entry.pod_uid.clone(),
                container: Some(entry.container.clone()),
            };
            // The kubelet gives an init container's devices to the next
            // container of the pod and keeps both entries: one device is the
            // pod's once, its last container's (entries are in the order
            // given).
            let same_pod = |a: &Allocation| {
                a.device == device
                    && matches!(&a.task, Task::Pod { uid, .. } if *uid == entry.pod_uid)
            };
            allocations.retain(|a| !same_pod(a));
            allocations.push(Allocation {
                device,
                task,
                shared,
                start: None,
                uid: None,
                end: None,
            });
        }
    }
    (allocations, problems)
}
