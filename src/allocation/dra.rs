//! Kubernetes with NVIDIA's DRA driver: its kubelet plugin's checkpoint
//! (`/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json`), the claims
//! it prepared by claim UID. Since release 25.8 it writes `v2` (and `v1`,
//! only the completed claims, for downgrades), before that `v1` alone:
//! `{"v2": {"preparedClaims": {<uid>: {"checkpointState", "status":
//! {"reservedFor": [{"resource": "pods", "uid", …}]}, "preparedDevices":
//! [{"devices": [{"gpu": {"info": {"uuid"}}} | {"mig": {"concrete":
//! {"migUUID", …}}} (25.12; before, `{"info": {"uuid"}}`)]}]}}}}`. A claim
//! belongs to the pods it is reserved for (a claim holds no container); one
//! reserved for several pods is shared; one still being prepared, not yet
//! given. An unprepared claim is removed from the file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::file;
use super::model::{Allocation, Device, Task};

/// Far more than a node's claims take.
const MAX_SIZE: u64 = 4 << 20;

#[derive(Deserialize)]
struct Checkpoint {
    v1: Option<Claims>,
    v2: Option<Claims>,
}

#[derive(Deserialize)]
struct Claims {
    /// By claim UID; each read on its own, so one that is not a claim costs
    /// only itself.
    #[serde(rename = "preparedClaims", default)]
    prepared: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
struct Claim {
    /// `PrepareStarted` or `PrepareCompleted` (v2; v1 holds completed ones).
    #[serde(rename = "checkpointState", default)]
    state: Option<String>,
    #[serde(default)]
    status: Status,
    #[serde(rename = "preparedDevices", default)]
    groups: Vec<Group>,
}

#[derive(Default, Deserialize)]
struct Status {
    #[serde(rename = "reservedFor", default)]
    reserved_for: Vec<Consumer>,
}

#[derive(Deserialize)]
struct Consumer {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    uid: String,
}

#[derive(Deserialize)]
struct Group {
    #[serde(default)]
    devices: Vec<Prepared>,
}

/// One of a GPU, a MIG device or (passed through to a VM, not NVML's) a
/// vfio device.
#[derive(Deserialize)]
struct Prepared {
    gpu: Option<Described>,
    mig: Option<Mig>,
}

#[derive(Deserialize)]
struct Described {
    info: Uuid,
}

#[derive(Deserialize)]
struct Uuid {
    uuid: String,
}

/// Release 25.12 and later: `concrete`; before, `info`.
#[derive(Deserialize)]
struct Mig {
    concrete: Option<Concrete>,
    info: Option<Uuid>,
}

#[derive(Deserialize)]
struct Concrete {
    #[serde(rename = "migUUID")]
    mig_uuid: String,
}

/// The checkpoint's GPU allocations; a checkpoint that is not one costs
/// all of them, a claim that is not one only its own.
pub fn read(path: &Path) -> (Vec<Allocation>, Vec<String>) {
    let named = |why: String| format!("the DRA driver's checkpoint {}: {why}", path.display());
    let checkpoint: Checkpoint = match file::json(path, MAX_SIZE, "checkpoint") {
        Ok(Some(checkpoint)) => checkpoint,
        Ok(None) => return Default::default(),
        Err(why) => return (Vec::new(), vec![named(why)]),
    };
    let (claims, v2) = match (checkpoint.v2, checkpoint.v1) {
        (Some(claims), _) => (claims, true),
        (None, Some(claims)) => (claims, false),
        (None, None) => return Default::default(),
    };
    let (mut allocations, mut problems) = (Vec::new(), Vec::new());
    for (uid, claim) in claims.prepared {
        match serde_json::from_value::<Claim>(claim)
            .ok()
            .and_then(|c| allocations_of(c, v2))
        {
            Some(found) => allocations.extend(found),
            None => problems.push(named(format!("claim {uid:?} is not a prepared claim"))),
        }
    }
    (allocations, problems)
}

/// A claim's devices for each pod it is reserved for (none while it is
/// still being prepared).
fn allocations_of(claim: Claim, v2: bool) -> Option<Vec<Allocation>> {
    if v2 && claim.state.as_deref() != Some("PrepareCompleted") {
        return Some(Vec::new());
    }
    let pods: Vec<String> = claim
        .status
        .reserved_for
        .into_iter()
        .filter(|consumer| consumer.resource == "pods")
        .map(|pod| crate::owner::kubernetes::is_uid(&pod.uid).then_some(pod.uid))
        .collect::<Option<_>>()?;
    let mut devices = Vec::new();
    for prepared in claim.groups.into_iter().flat_map(|group| group.devices) {
        let mig = prepared.mig.and_then(|mig| match (mig.concrete, mig.info) {
            (Some(concrete), _) => Some(concrete.mig_uuid),
            (None, info) => info.map(|info| info.uuid),
        });
        // A GPU passed through to a VM (vfio) is not NVML's.
        let Some(uuid) = prepared.gpu.map(|gpu| gpu.info.uuid).or(mig) else {
            continue;
        };
        devices.push(Device::from_uuid(&uuid)?.0);
    }
    let shared = pods.len() > 1;
    let allocation = |uid: &String, device: &Device| Allocation {
        device: device.clone(),
        task: Task::Pod {
            uid: uid.clone(),
            container: None,
        },
        shared,
        start: None,
        end: None,
        uid: None,
    };
    let each_pod = pods
        .iter()
        .flat_map(|uid| devices.iter().map(move |d| allocation(uid, d)));
    Some(each_pod.collect())
}
