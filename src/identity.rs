//! GPU identity, resolved once from this run's reads and the GPUs this boot
//! has seen, so that no GPU takes another's (rules: docs/design.md,
//! "Identity"). A UUID two GPUs read is kept by both, `unique` by neither.

use crate::snapshot::KnownGpu;

/// Empty strings: unreadable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Read {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub serial: String,
}

impl Read {
    pub fn unread(index: u32) -> Read {
        Read {
            index,
            ..Read::default()
        }
    }
}

/// Empty strings: not known at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub uuid: String,
    pub pci_bus_id: String,
    pub serial: String,
    /// The UUID is known and no other GPU of this run has it.
    pub unique: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolution {
    /// In the order of the reads.
    pub identities: Vec<Identity>,
    /// GPUs this boot knew that this run did not enumerate; none while a GPU
    /// of this run cannot be told.
    pub missing: Vec<KnownGpu>,
}

pub fn resolve(reads: &[Read], known: &[KnownGpu]) -> Resolution {
    // What this run read of one kind, where it read it.
    let read = |of: fn(&Read) -> &str| -> Vec<&str> {
        reads
            .iter()
            .map(of)
            .filter(|text| !text.is_empty())
            .collect()
    };
    let (read_uuids, read_buses) = (read(|r| &r.uuid), read(|r| &r.pci_bus_id));
    let accounted = |k: &KnownGpu| {
        read_uuids.contains(&k.uuid.as_str())
            || (!k.pci_bus_id.is_empty() && read_buses.contains(&k.pci_bus_id.as_str()))
    };
    let untold = reads
        .iter()
        .filter(|r| r.uuid.is_empty() && r.pci_bus_id.is_empty())
        .count();
    // Every known GPU is here: the GPU at an index is the one that was there.
    let none_left = known.iter().filter(|k| !accounted(k)).count() <= untold;
    let mut identities: Vec<Identity> = reads
        .iter()
        .map(|read| {
            let found = if !read.uuid.is_empty() {
                known.iter().find(|k| k.uuid == read.uuid)
            } else if !read.pci_bus_id.is_empty() {
                known.iter().find(|k| {
                    k.is_at(&read.pci_bus_id, &read.serial)
                        && !read_uuids.contains(&k.uuid.as_str())
                })
            } else if none_left {
                let mut at_index = known
                    .iter()
                    .filter(|k| k.index == read.index && !accounted(k));
                // Two GPUs known at one index: which one cannot be told.
                match (at_index.next(), at_index.next()) {
                    (Some(only), None) => Some(only),
                    _ => None,
                }
            } else {
                None
            };
            // What this run read, else what is known.
            let pick = |mine: &str, theirs: Option<&str>| {
                let theirs = theirs.filter(|_| mine.is_empty());
                theirs.unwrap_or(mine).to_owned()
            };
            Identity {
                uuid: pick(&read.uuid, found.map(|k| k.uuid.as_str())),
                pci_bus_id: pick(&read.pci_bus_id, found.map(|k| k.pci_bus_id.as_str())),
                serial: pick(&read.serial, found.map(|k| k.serial.as_str())),
                unique: false,
            }
        })
        .collect();
    let uuids: Vec<String> = identities.iter().map(|i| i.uuid.clone()).collect();
    for identity in &mut identities {
        let holders = uuids.iter().filter(|uuid| **uuid == identity.uuid).count();
        identity.unique = !identity.uuid.is_empty() && holders == 1;
    }
    // A GPU that cannot be told could be any: then none has left.
    let all_told = identities.iter().all(|i| !i.uuid.is_empty());
    let missing = known
        .iter()
        .filter(|_| all_told)
        .filter(|k| {
            !identities.iter().any(|i| i.uuid == k.uuid)
                && (k.pci_bus_id.is_empty() || !read_buses.contains(&k.pci_bus_id.as_str()))
        })
        .cloned()
        .collect();
    Resolution {
        identities,
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(index: u32, uuid: &str, bus: &str) -> Read {
        Read {
            index,
            uuid: uuid.into(),
            pci_bus_id: bus.into(),
            serial: String::new(),
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

    fn uuids(resolution: &Resolution) -> Vec<&str> {
        resolution
            .identities
            .iter()
            .map(|i| i.uuid.as_str())
            .collect()
    }

    #[test]
    fn a_lost_gpu_keeps_its_uuid_and_its_bus_id() {
        let known = [known(0, "GPU-a", "0:17"), known(1, "GPU-b", "0:2a")];
        let resolution = resolve(&[read(0, "GPU-a", "0:17"), read(1, "", "")], &known);
        assert_eq!(uuids(&resolution), ["GPU-a", "GPU-b"]);
        assert_eq!(resolution.identities[1].pci_bus_id, "0:2a");
        assert!(resolution.missing.is_empty());
    }

    #[test]
    fn a_uuid_read_alone_gets_its_known_bus_id() {
        let known = [known(0, "GPU-a", "0:17")];
        let resolution = resolve(&[read(0, "GPU-a", "")], &known);
        assert_eq!(resolution.identities[0].pci_bus_id, "0:17");
    }

    #[test]
    fn a_gpu_found_by_bus_id_continues_its_identity() {
        let known = [known(0, "GPU-a", "0:17"), known(1, "GPU-b", "0:2a")];
        // Renumbered: the GPU at bus 0:2a is now index 0 and its UUID failed.
        let resolution = resolve(&[read(0, "", "0:2a")], &known);
        assert_eq!(uuids(&resolution), ["GPU-b"]);
        assert_eq!(resolution.missing, [known[0].clone()]);
    }

    #[test]
    fn a_renumbered_gpu_never_takes_another_gpus_uuid() {
        let known = [known(0, "GPU-a", "0:17"), known(1, "GPU-b", "0:2a")];
        // GPU-a left; GPU-b is index 0 now and reads fine; index 1 reads nothing.
        let resolution = resolve(&[read(0, "GPU-b", "0:2a"), read(1, "", "")], &known);
        assert_eq!(uuids(&resolution), ["GPU-b", ""]);
        // Index 0's known UUID was GPU-a, but nothing of this run says it is
        // the one at index 1: it is not given away, and not said to have left
        // either (the GPU at index 1 may be it).
        assert!(resolution.missing.is_empty());
        let taken = resolve(&[read(0, "", ""), read(1, "GPU-a", "0:17")], &known);
        assert_eq!(uuids(&taken), ["", "GPU-a"]);
    }

    #[test]
    fn a_gpu_renumbered_into_a_departed_gpus_index_is_not_it() {
        // GPU-a left; GPU-b is index 0 now, and its UUID and bus id fail.
        let known = [known(0, "GPU-a", "0:17"), known(1, "GPU-b", "0:2a")];
        let resolution = resolve(&[read(0, "", "")], &known);
        assert_eq!(uuids(&resolution), [""]);
        assert!(resolution.missing.is_empty());
    }

    #[test]
    fn two_gpus_known_at_one_index_leave_it_unknown() {
        // GPU-b left; GPU-c, renumbered, took its index 1; now GPU-c's reads fail.
        let known = [
            known(0, "GPU-a", "0:17"),
            known(1, "GPU-b", "0:2a"),
            known(1, "GPU-c", "0:3d"),
        ];
        let resolution = resolve(&[read(0, "GPU-a", "0:17"), read(1, "", "")], &known);
        assert_eq!(uuids(&resolution), ["GPU-a", ""]);
        assert!(!resolution.identities[1].unique);
        // GPU 1 could be GPU-b or GPU-c: neither is said to have left.
        assert!(resolution.missing.is_empty());
    }

    #[test]
    fn a_uuid_two_gpus_read_is_not_unique() {
        let resolution = resolve(
            &[
                read(0, "GPU-a", "0:17"),
                read(1, "GPU-a", "0:2a"),
                read(2, "GPU-c", "0:3d"),
            ],
            &[],
        );
        let unique: Vec<bool> = resolution.identities.iter().map(|i| i.unique).collect();
        assert_eq!(unique, [false, false, true]);
    }

    #[test]
    fn a_gpu_that_left_enumeration_is_missing() {
        let known = [
            known(0, "GPU-a", "0:17"),
            known(1, "GPU-b", "0:2a"),
            known(2, "GPU-c", "0:3d"),
        ];
        let resolution = resolve(
            &[read(0, "GPU-a", "0:17"), read(1, "GPU-c", "0:3d")],
            &known,
        );
        assert_eq!(resolution.missing, [known[1].clone()]);
        // A GPU replaced at the same bus id has not left.
        let replaced = resolve(&[read(0, "GPU-z", "0:17")], &known[..1]);
        assert!(replaced.missing.is_empty());
    }
}
