//! Container runtimes: a container's processes are in the scope its runtime
//! made below a system slice, `<slice>/{docker,cri-containerd,crio,libpod}-<64
//! hex>.scope`, or in cgroup v1 `docker/<id>`.

use super::systemd::unit;
use super::manager::{at, Claim, Node};
use crate::procfs::Proc;

label_set! {
    /// A container by its id.
    #[serde(transparent)]
    pub struct Container {
        pub id: String => "container_id",
    }
}

#[derive(Default)]
pub struct Runtime;

impl Runtime {
    pub fn claim(&self, path: &[&str], _: &Proc, _: &Node) -> Claim<Container> {
        let container = |id: String| Claim::Owner(Container { id });
        if at(path, 0) == "docker" {
            return container_id(at(path, 1)).map_or(Claim::User, container);
        }
        unit(path)
            .and_then(container_id)
            .map_or(Claim::Pass, container)
    }
}

/// A container id from `<runtime>-<id>.scope`, or a bare 64-hex-digit id.
pub fn container_id(component: &str) -> Option<String> {
    let id = component.strip_suffix(".scope").map_or(component, |stem| {
        ["docker-", "cri-containerd-", "crio-", "libpod-"]
            .iter()
            .find_map(|prefix| stem.strip_prefix(prefix))
            .unwrap_or("")
    });
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{owner_of, root, ID};
    use super::super::Owner;
    use super::*;

    #[test]
    fn a_container_is_read_where_its_runtime_puts_it() {
        let container = Some(Owner::Container(Container { id: ID.into() }));
        for cgroup in [
            format!("0::/system.slice/docker-{ID}.scope"),
            format!("0::/machine.slice/libpod-{ID}.scope/container"),
            format!("9:cpu:/docker/{ID}"),
        ] {
            assert_eq!(owner_of(&cgroup, ""), container, "{cgroup}");
        }
        assert_eq!(owner_of("9:cpu:/docker/x", ""), root());
    }
}
