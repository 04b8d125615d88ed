//! The collector registry: the one place a collector is defined.
//!
//! A row gives the name used by `--collector`/`--no-collector`, whether it is on
//! by default, its one-line help, the families it may emit, the field ids it
//! takes from the per-GPU batch and its reader. The command line's value list,
//! the default set, `--help`, the man page and the README's list all come from
//! [`ALL`] (the README is checked against it by a test). Adding a collector is
//! one row here and one reader file.
//!
//! Invariants (checked by tests): names are unique kebab-case; every family is
//! emitted by at most one collector; a collector's reader emits only its
//! families (checked end to end against every scenario in `tests/cli.rs`).

use super::reader::DeviceReader;
use super::{clocks, health, media, memory, mig, modes, nvlink, pcie, power, processes};
use super::{gpm, thermal, utilization};
use crate::metrics::{self, Family};

/// A group of metric families that can be switched on and off.
pub struct Collector {
    /// The name on the command line.
    pub name: &'static str,
    /// On unless `--no-collector` names it.
    pub default: bool,
    /// One line for `--help`, the man page and the README.
    pub help: &'static str,
    /// The families its reader may emit.
    pub families: &'static [&'static Family],
    /// Field ids its reader takes from the GPU's batched field read.
    pub(super) fields: &'static [u32],
    /// Reads this collector's families from one GPU.
    pub(super) read: fn(&mut DeviceReader<'_>),
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for Collector {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Collector {}

/// Every collector, in output order.
pub static ALL: &[Collector] = &[
    Collector {
        name: "utilization",
        default: true,
        help: "GPU and memory utilization ratios, count of compute processes.",
        families: &[
            &metrics::UTILIZATION,
            &metrics::MEMORY_UTILIZATION,
            &metrics::PROCESSES,
        ],
        fields: &[],
        read: utilization::read,
    },
    Collector {
        name: "memory",
        default: true,
        help: "Device memory used/free/total/reserved, BAR1 memory.",
        families: &[
            &metrics::MEMORY_USED,
            &metrics::MEMORY_FREE,
            &metrics::MEMORY_TOTAL,
            &metrics::MEMORY_RESERVED,
            &metrics::BAR1_USED,
            &metrics::BAR1_TOTAL,
        ],
        fields: &[],
        read: memory::read,
    },
    Collector {
        name: "thermal",
        default: true,
        help: "GPU and HBM temperatures, temperature thresholds, fans.",
        families: &[
            &metrics::TEMPERATURE,
            &metrics::MEMORY_TEMPERATURE,
            &metrics::TEMPERATURE_THRESHOLD,
            &metrics::FAN_SPEED,
        ],
        fields: thermal::FIELDS,
        read: thermal::read,
    },
    Collector {
        name: "power",
        default: true,
        help: "Power draw, energy counter, power limits.",
        families: &[
            &metrics::POWER,
            &metrics::ENERGY,
            &metrics::POWER_LIMIT,
            &metrics::POWER_DEFAULT_LIMIT,
            &metrics::POWER_MIN_LIMIT,
            &metrics::POWER_MAX_LIMIT,
        ],
        fields: power::FIELDS,
        read: power::read,
    },
    Collector {
        name: "clocks",
        default: true,
        help: "Clocks, max clocks, performance state, clock event reasons, violation counters.",
        families: &[
            &metrics::CLOCK,
            &metrics::CLOCK_MAX,
            &metrics::PERFORMANCE_STATE,
            &metrics::CLOCKS_EVENT,
            &metrics::VIOLATION,
        ],
        fields: clocks::FIELDS,
        read: clocks::read,
    },
    Collector {
        name: "pcie",
        default: true,
        help: "PCIe link generation/width, replays, byte counters.",
        families: &[
            &metrics::PCIE_GENERATION,
            &metrics::PCIE_MAX_GENERATION,
            &metrics::PCIE_WIDTH,
            &metrics::PCIE_MAX_WIDTH,
            &metrics::PCIE_REPLAYS,
            &metrics::PCIE_TRANSMIT,
            &metrics::PCIE_RECEIVE,
        ],
        fields: pcie::FIELDS,
        read: pcie::read,
    },
    Collector {
        name: "pcie-throughput",
        default: false,
        help: "PCIe throughput sampled by NVML over 20 ms per direction (slow).",
        families: &[
            &metrics::PCIE_TRANSMIT_THROUGHPUT,
            &metrics::PCIE_RECEIVE_THROUGHPUT,
        ],
        fields: &[],
        read: pcie::read_throughput,
    },
    Collector {
        name: "health",
        default: true,
        help: "ECC mode and errors, retired pages, remapped rows.",
        families: &[
            &metrics::ECC_ENABLED,
            &metrics::ECC_PENDING_ENABLED,
            &metrics::ECC_ERRORS,
            &metrics::RETIRED_PAGES,
            &metrics::RETIRED_PAGES_PENDING,
            &metrics::REMAPPED_ROWS,
            &metrics::REMAPPED_ROWS_PENDING,
            &metrics::REMAPPED_ROWS_FAILURE,
        ],
        fields: health::FIELDS,
        read: health::read,
    },
    Collector {
        name: "media",
        default: true,
        help: "Video encoder/decoder utilization and encoder sessions.",
        families: &[
            &metrics::ENCODER_UTILIZATION,
            &metrics::DECODER_UTILIZATION,
            &metrics::ENCODER_SESSIONS,
            &metrics::ENCODER_FPS,
            &metrics::ENCODER_LATENCY,
        ],
        fields: &[],
        read: media::read,
    },
    Collector {
        name: "modes",
        default: true,
        help: "Persistence, compute and MIG modes.",
        families: &[
            &metrics::PERSISTENCE_MODE,
            &metrics::COMPUTE_MODE,
            &metrics::MIG_ENABLED,
            &metrics::MIG_PENDING_ENABLED,
        ],
        fields: &[],
        read: modes::read,
    },
    Collector {
        name: "nvlink",
        default: true,
        help: "NVLink state, error counters, data counters per link.",
        families: &[
            &metrics::NVLINK_ACTIVE,
            &metrics::NVLINK_ERRORS,
            &metrics::NVLINK_TRANSMIT,
            &metrics::NVLINK_RECEIVE,
        ],
        fields: nvlink::FIELDS,
        read: nvlink::read,
    },
    Collector {
        name: "mig",
        default: true,
        help: "MIG devices with their memory.",
        families: &[
            &metrics::MIG_INFO,
            &metrics::MIG_MEMORY_USED,
            &metrics::MIG_MEMORY_TOTAL,
        ],
        fields: &[],
        read: mig::read,
    },
    Collector {
        name: gpm::COLLECTOR,
        default: true,
        help: "SM activity and occupancy, tensor and other pipes, DRAM bandwidth over --gpm-window (GPM, Hopper and newer).",
        families: &[
            &metrics::SM_ACTIVE,
            &metrics::SM_OCCUPANCY,
            &metrics::GRAPHICS_ENGINE_ACTIVE,
            &metrics::DRAM_ACTIVE,
            &metrics::PIPE_ACTIVE,
            &metrics::GPM_WINDOW,
            &metrics::GPM_UNAVAILABLE,
            &metrics::MIG_SM_ACTIVE,
            &metrics::MIG_SM_OCCUPANCY,
            &metrics::MIG_GRAPHICS_ENGINE_ACTIVE,
            &metrics::MIG_DRAM_ACTIVE,
            &metrics::MIG_PIPE_ACTIVE,
        ],
        fields: &[],
        // Closes the window `gpm::open` opened before the other collectors
        // ran; `read_device` runs it last.
        read: gpm::read,
    },
    Collector {
        name: "processes",
        default: false,
        help: "Per-process GPU memory with owner attribution from /proc (pids churn series).",
        families: &[&metrics::PROCESS_MEMORY_USED],
        fields: &[],
        read: processes::read,
    },
];

/// The collector called `name`.
pub fn by_name(name: &str) -> Option<&'static Collector> {
    ALL.iter().find(|collector| collector.name == name)
}

/// The collectors that are on by default, in output order.
pub fn defaults() -> impl Iterator<Item = &'static Collector> {
    ALL.iter().filter(|collector| collector.default)
}

/// The collector that may emit `family`, if one does (the always-written
/// families belong to none).
pub fn owner(family: &Family) -> Option<&'static Collector> {
    ALL.iter()
        .find(|collector| collector.families.iter().any(|f| f.index == family.index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_kebab_case() {
        let mut seen = HashSet::new();
        for collector in ALL {
            assert!(seen.insert(collector.name), "duplicate {}", collector.name);
            assert!(collector
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'-'));
            assert!(collector.help.ends_with('.'), "{}", collector.name);
        }
    }

    #[test]
    fn every_family_has_at_most_one_collector() {
        let mut seen = HashSet::new();
        for collector in ALL {
            for family in collector.families {
                assert!(seen.insert(family.name), "{} listed twice", family.name);
            }
        }
    }

    #[test]
    fn readme_lists_every_collector_with_its_default() {
        let readme = include_str!("../../README.md");
        for collector in ALL {
            let row = format!(
                "| `{}` | {} | {} |",
                collector.name,
                if collector.default { "on" } else { "off" },
                collector.help
            );
            assert!(readme.contains(&row), "README lacks the row\n{row}");
        }
    }
}
