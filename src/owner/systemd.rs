//! systemd: a service's or scope's processes are in its unit's cgroup below
//! system slices (`user.slice` is a user's delegated subtree: the user's).

use super::manager::{Claim, Node};
use crate::procfs::Proc;

label_set! {
    /// A systemd unit by its name.
    #[serde(transparent)]
    pub struct Unit {
        pub name: String => "systemd_unit",
    }
}

#[derive(Default)]
pub struct Systemd;

impl Systemd {
    pub fn claim(&self, path: &[&str], _: &Proc, _: &Node) -> Claim<Unit> {
        match unit(path) {
            Some(name) if name.ends_with(".service") || name.ends_with(".scope") => {
                Claim::Owner(Unit { name: name.into() })
            }
            _ => Claim::Pass,
        }
    }
}

/// The component below a path's leading slices, where they are system
/// slices (not `user.slice`).
pub fn unit<'a>(path: &[&'a str]) -> Option<&'a str> {
    let first = path.first()?;
    if !first.ends_with(".slice") || *first == "user.slice" {
        return None;
    }
    path.iter().copied().find(|c| !c.ends_with(".slice"))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{owner_of, root};
    use super::super::Owner;
    use super::*;

    #[test]
    fn a_unit_is_read_below_system_slices() {
        let unit = |name: &str| Some(Owner::Unit(Unit { name: name.into() }));
        let cases = [
            ("0::/system.slice/inference.service", unit("inference.service")),
            ("0::/system.slice/system-train.slice/train@3.service", unit("train@3.service")),
            ("0::/system.slice/tr\u{fffd}ain.service\n", unit("tr\u{fffd}ain.service")),
            ("0::/system.slice", root()),
            ("0::/init.scope", root()),
        ];
        for (cgroup, owner) in cases {
            assert_eq!(owner_of(cgroup, ""), owner, "{cgroup}");
        }
    }
}
