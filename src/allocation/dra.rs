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

use std::path::Path;

use serde_json::Value;

use super::{file, Allocation, Device, Task};

/// Far more than a node's claims take.
const MAX_SIZE: u64 = 4 << 20;

/// The checkpoint's GPU allocations; a checkpoint that is not one costs
/// all of them, a claim that is not one only its own.
pub fn read(path: &Path) -> (Vec<Allocation>, Vec<String>) {
    let named = |why: String| format!("the DRA driver's checkpoint {}: {why}", path.display());
    let text = match file::read(path, MAX_SIZE) {
        Ok(Some((text, _))) => text,
        Ok(None) => return Default::default(),
        Err(why) => return (Vec::new(), vec![named(why.to_string())]),
    };
    let checkpoint: Value = match serde_json::from_slice(&text) {
        Ok(checkpoint) => checkpoint,
        Err(e) => return (Vec::new(), vec![named(format!("not JSON ({e})"))]),
    };
    let (claims, v2) = match (
        &checkpoint["v2"]["preparedClaims"],
        &checkpoint["v1"]["preparedClaims"],
    ) {
        (Value::Object(claims), _) => (claims, true),
        (Value::Null, Value::Object(claims)) => (claims, false),
        (Value::Null, Value::Null) => return Default::default(),
        _ => return (Vec::new(), vec![named("no prepared claims".into())]),
    };
    let (mut allocations, mut problems) = (Vec::new(), Vec::new());
    for (uid, claim) in claims {
        if v2 && claim["checkpointState"] != "PrepareCompleted" {
            continue;
        }
        match allocations_of(claim) {
            Some(found) => allocations.extend(found),
            None => problems.push(named(format!("claim {uid:?} is not a prepared claim"))),
        }
    }
    (allocations, problems)
}

/// A claim's devices for each pod it is reserved for.
fn allocations_of(claim: &Value) -> Option<Vec<Allocation>> {
    let pods: Vec<&str> = claim["status"]["reservedFor"]
        .as_array()?
        .iter()
        .filter(|consumer| consumer["resource"] == "pods")
        .map(|pod| {
            pod["uid"]
                .as_str()
                .filter(|uid| crate::owner::kubernetes::is_uid(uid))
        })
        .collect::<Option<_>>()?;
    let mut devices = Vec::new();
    for group in claim["preparedDevices"].as_array()? {
        for device in group["devices"].as_array()? {
            let uuid = match (&device["gpu"], &device["mig"]) {
                (Value::Object(gpu), _) => &gpu["info"]["uuid"],
                (_, Value::Object(mig)) if mig.contains_key("concrete") => {
                    &mig["concrete"]["migUUID"]
                }
                (_, Value::Object(mig)) => &mig["info"]["uuid"],
                // A GPU passed through to a VM (vfio) is not NVML's.
                _ => continue,
            };
            devices.push(Device::from_uuid(uuid.as_str()?)?.0);
        }
    }
    let shared = pods.len() > 1;
    Some(
        pods.iter()
            .flat_map(|uid| {
                devices.iter().map(move |device| Allocation {
                    device: device.clone(),
                    task: Task::Pod {
                        uid: (*uid).to_owned(),
                        container: None,
                    },
                    shared,
                    start: None,
                    uid: None,
                    end: None,
                })
            })
            .collect(),
    )
}
