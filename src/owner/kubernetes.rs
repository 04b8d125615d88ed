//! Kubernetes: a pod's processes are in the cgroup the kubelet made for the
//! pod, `kubepods.slice/[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid with
//! _>.slice/<runtime>-<id>.scope` (systemd driver) or
//! `kubepods/[<qos>/]pod<uid>/<id>` (cgroupfs driver). Namespace and name
//! come from the kubelet's `<namespace>_<name>_<uid>` log directory, the
//! container's name from `<pod>_<namespace>_<container>-<id>.log` below
//! `/var/log/containers` (Kubernetes names hold no `_`).

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fs;
use std::path::Path;

use super::manager::{at, Claim, Node};
use super::runtime::container_id;
use crate::bounded;
use crate::procfs::Proc;

label_set! {
    /// A pod's container by the pod's UID, named where the kubelet's logs
    /// name it.
    pub struct Pod {
        pub namespace: Option<String> => "k8s_namespace_name",
        pub name: Option<String> => "k8s_pod_name",
        pub uid: String => "k8s_pod_uid",
        pub container: Option<String> => "k8s_container_name",
    }
}

#[derive(Default)]
pub struct Kubernetes {
    /// Read once, and only for a run with a pod's process.
    names: OnceCell<Names>,
}

impl Kubernetes {
    pub fn claim(&self, path: &[&str], _: &Proc, node: &Node) -> Claim<Pod> {
        if at(path, 0) != "kubepods.slice" && at(path, 0) != "kubepods" {
            return Claim::Pass;
        }
        // The pod is the first or (under a QoS class) the second level below.
        for i in [1, 2] {
            if let Some(uid) = pod_uid(at(path, i)) {
                let container = container_id(at(path, i + 1));
                return Claim::Owner(self.names(node).pod(uid, container.as_deref()));
            }
        }
        Claim::User
    }

    /// The kubelet's names, read once a run.
    pub(super) fn names(&self, node: &Node) -> &Names {
        self.names.get_or_init(|| read_names(node))
    }
}

/// The kubelet's names, read on a thread of its own until the deadline
/// (a hung file system names nothing).
fn read_names(node: &Node) -> Names {
    let (pods, containers) = (node.pod_logs.clone(), node.container_logs.clone());
    let read = move || Names::read(&pods, &containers);
    bounded::call("pods", node.until, read).unwrap_or_else(|_| {
        log::warn!("the kubelet's log directories did not answer in time; pods are not named");
        Names::default()
    })
}

/// Pods and containers as the kubelet's log directories name them.
#[derive(Debug, Default)]
pub(super) struct Names {
    /// Namespace and name by pod UID.
    pods: HashMap<String, (String, String)>,
    /// Container name by container id.
    containers: HashMap<String, String>,
}

impl Names {
    /// Reads both directories; one that cannot be read names nothing.
    fn read(pod_logs: &Path, container_logs: &Path) -> Names {
        let entries = |dir: &Path| -> Vec<String> {
            let entries = fs::read_dir(dir).into_iter().flatten().flatten();
            entries
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        };
        let mut names = Names::default();
        for entry in entries(pod_logs) {
            if let [namespace, name, uid] = entry.split('_').collect::<Vec<_>>()[..] {
                if is_uid(uid) && is_name(namespace) && is_name(name) {
                    let pod = (namespace.to_owned(), name.to_owned());
                    names.pods.insert(uid.to_owned(), pod);
                }
            }
        }
        for entry in entries(container_logs) {
            let Some((stem, id)) = entry.strip_suffix(".log").and_then(|s| s.rsplit_once('-'))
            else {
                continue;
            };
            if let [_, _, container] = stem.split('_').collect::<Vec<_>>()[..] {
                if container_id(id).is_some() && is_name(container) {
                    names.containers.insert(id.to_owned(), container.to_owned());
                }
            }
        }
        names
    }

    pub(super) fn pod(&self, uid: String, container_id: Option<&str>) -> Pod {
        let (namespace, name) = self.pods.get(&uid).cloned().unzip();
        let container = container_id.and_then(|id| self.containers.get(id).cloned());
        Pod {
            namespace,
            name,
            uid,
            container,
        }
    }
}

/// The pod UID of `kubepods[-<qos>]-pod<uid>.slice` (systemd driver, `_` for
/// `-`) or `pod<uid>` (cgroupfs driver).
fn pod_uid(component: &str) -> Option<String> {
    let uid = match component.strip_suffix(".slice") {
        Some(stem) => stem.rsplit_once("-pod")?.1.replace('_', "-"),
        None => component.strip_prefix("pod")?.to_owned(),
    };
    is_uid(&uid).then_some(uid)
}

/// Whether `text` is a pod UID as the kubelet writes it: a lower-case UUID
/// (8-4-4-4-12), or a static pod's 32 hex digits (the hash of its manifest).
pub(crate) fn is_uid(text: &str) -> bool {
    let hex = |g: &&str| g.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let groups: Vec<&str> = text.split('-').collect();
    let uuid = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
    (uuid || (text.len() == 32 && groups.len() == 1)) && groups.iter().all(hex)
}

/// Whether `text` can be a Kubernetes name (DNS subdomain: lower-case
/// letters, digits, `-` and `.`, at most 253).
pub(crate) fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::super::tests::{owner_of, root, ID};
    use super::super::Owner;
    use super::*;

    const UID: &str = "3f0c8a52-9b1e-4c7d-8e2f-5a6b7c8d9e01";

    fn pod(uid: &str) -> Option<Owner> {
        let (namespace, name, container) = (None, None, None);
        let uid = uid.to_owned();
        Some(Owner::Pod(Pod { namespace, name, uid, container }))
    }

    #[test]
    fn a_pod_is_read_where_the_kubelet_puts_it() {
        let systemd_uid = UID.replace('-', "_");
        let cases = [
            // systemd driver (QoS class, guaranteed), cgroupfs driver.
            format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd_uid}.slice/cri-containerd-{ID}.scope"),
            format!("0::/kubepods.slice/kubepods-pod{systemd_uid}.slice/crio-{ID}.scope"),
            format!("0::/kubepods/burstable/pod{UID}/{ID}"),
            format!("0::/kubepods/pod{UID}"),
        ];
        for cgroup in &cases {
            assert_eq!(owner_of(cgroup, ""), pod(UID), "{cgroup}");
        }
        // A static pod's UID is its manifest's hash.
        let static_pod = "0::/kubepods.slice/kubepods-podd41d8cd98f00b204e9800998ecf8427e.slice";
        assert_eq!(owner_of(static_pod, ""), pod("d41d8cd98f00b204e9800998ecf8427e"));
        assert_eq!(owner_of("0::/kubepods.slice/x.scope", ""), root());
    }

    #[test]
    fn pods_and_containers_are_named_by_the_kubelets_directories() {
        let root = tempfile::tempdir().unwrap();
        let (pods, containers) = (root.path().join("pods"), root.path().join("containers"));
        fs::create_dir_all(pods.join(format!("ml_trainer-0_{UID}"))).unwrap();
        fs::create_dir_all(pods.join("bad_name_with_parts_x")).unwrap();
        fs::create_dir_all(pods.join(format!("Upper_x_{UID}"))).unwrap();
        fs::create_dir_all(&containers).unwrap();
        let log = containers.join(format!("trainer-0_ml_pytorch-{ID}.log"));
        fs::write(log, "").unwrap();
        let names = Names::read(&pods, &containers);
        let expected = Pod {
            namespace: Some("ml".into()),
            name: Some("trainer-0".into()),
            uid: UID.to_owned(),
            container: Some("pytorch".into()),
        };
        assert_eq!(names.pod(UID.to_owned(), Some(ID)), expected);
        let other = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        assert_eq!(Some(Owner::Pod(names.pod(other.to_owned(), None))), pod(other));
        let missing = Names::read(&root.path().join("none"), &root.path().join("none"));
        assert_eq!(Some(Owner::Pod(missing.pod(UID.to_owned(), Some(ID)))), pod(UID));
    }
}
