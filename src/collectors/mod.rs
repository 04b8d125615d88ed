//! The collectors: the registry ([`ALL`], where a collector is defined: its
//! name, default, help, families, batched fields and [`Hooks`]) and one file
//! per collector. The command line, `--help`, the man page and the README
//! come from it. Invariants (tested): names unique kebab-case; a family
//! emitted by one collector only, except the [`SHARED`] ones; a reader emits
//! only its families (end to end, in `tests/cli/`).

mod clocks;
mod fabric;
mod gpm;
mod health;
mod info;
mod limits;
mod media;
mod memory;
mod mig;
mod modes;
mod nvlink;
mod pcie;
mod pcie_errors;
mod power;
mod processes;
mod thermal;
mod utilization;
pub mod xid;

use crate::metrics::{self, Family};

/// The families of a row, by their handles' names in `metrics`.
macro_rules! families {
    ($($family:ident),* $(,)?) => {
        &[$(metrics::$family.family()),*]
    };
}

use crate::collector::Hooks;
pub use crate::collector::{Collector, HostRun, Settings};

/// Reads a GPU's identity and its info sample: first, on every GPU.
pub(crate) use info::read as identify;

/// Every collector, in output order.
pub static ALL: &[Collector] = &[
    Collector {
        name: "utilization",
        default: true,
        help: "GPU and memory utilization over the samples since the previous run, busy and sampled time, count of compute processes.",
        families: families![UTILIZATION, MEMORY_UTILIZATION, PROCESSES, BUSY, SAMPLED],
        fields: &[],
        hooks: Hooks::read(utilization::read),
    },
    Collector {
        name: "memory",
        default: true,
        help: "Device memory used/free/total/reserved, BAR1 memory.",
        families: families![
            MEMORY_USED, MEMORY_FREE, MEMORY_TOTAL, MEMORY_RESERVED, BAR1_USED, BAR1_TOTAL,
        ],
        fields: &[],
        hooks: Hooks::read(memory::read),
    },
    Collector {
        name: "thermal",
        default: true,
        help: "GPU and HBM temperatures, temperature thresholds, fans, thermal margin and the margins the GPU slows down and shuts down at, time held down by thermal and power-brake slowdown.",
        families: families![
            TEMPERATURE, MEMORY_TEMPERATURE, TEMPERATURE_THRESHOLD, FAN_SPEED, TEMPERATURE_MARGIN,
            TEMPERATURE_MARGIN_THRESHOLD, SLOWDOWN,
        ],
        fields: thermal::FIELDS,
        hooks: Hooks::read(thermal::read),
    },
    Collector {
        name: "power",
        default: true,
        help: "Power draw and, by architecture, the instantaneous power or the driver's 1 s average (whichever the draw is not), energy counter, enforced and default power limit.",
        families: families![
            POWER, ENERGY, POWER_LIMIT, POWER_DEFAULT_LIMIT, POWER_AVERAGE, POWER_INSTANT,
        ],
        fields: power::FIELDS,
        hooks: Hooks::read(power::read).with_fields_for(power::second_reading),
    },
    Collector {
        name: "clocks",
        default: true,
        help: "Clocks, performance state, clock event reasons, violation counters.",
        families: families![CLOCK, PERFORMANCE_STATE, CLOCKS_EVENT, VIOLATION],
        fields: clocks::FIELDS,
        hooks: Hooks::read(clocks::read),
    },
    Collector {
        name: "pcie",
        default: true,
        help: "PCIe link generation and width now and their maxima (read once per driver), replays, byte counters.",
        families: families![
            PCIE_GENERATION, PCIE_MAX_GENERATION, PCIE_WIDTH, PCIE_MAX_WIDTH, PCIE_REPLAYS,
            PCIE_TRANSMIT, PCIE_RECEIVE,
        ],
        fields: pcie::FIELDS,
        hooks: Hooks::read(pcie::read),
    },
    Collector {
        name: "pcie-errors",
        default: false,
        help: "PCIe error counters by kind: L0 to recovery, correctable, NAKs, receiver, bad TLP/DLLP, non-fatal, fatal, unsupported request, LCRC, lane (12 field values a run).",
        families: families![PCIE_ERRORS],
        fields: pcie_errors::FIELDS,
        hooks: Hooks::read(pcie_errors::read),
    },
    Collector {
        name: "limits",
        default: false,
        help: "Hardware maxima fixed while the driver is loaded: max clocks, power limit range.",
        families: families![CLOCK_MAX, POWER_MIN_LIMIT, POWER_MAX_LIMIT],
        fields: &[],
        hooks: Hooks::read(limits::read),
    },
    Collector {
        name: "pcie-throughput",
        default: false,
        help: "PCIe throughput sampled by NVML over 20 ms per direction (slow).",
        families: families![PCIE_TRANSMIT_THROUGHPUT, PCIE_RECEIVE_THROUGHPUT],
        fields: &[],
        hooks: Hooks::read(pcie::read_throughput),
    },
    Collector {
        name: "health",
        default: true,
        help: "ECC mode and errors, retired pages, remapped rows, the recovery action the driver asks for.",
        families: families![
            ECC_ENABLED, ECC_PENDING_ENABLED, ECC_ERRORS, RETIRED_PAGES, RETIRED_PAGES_PENDING,
            REMAPPED_ROWS, REMAPPED_ROWS_PENDING, REMAPPED_ROWS_FAILURE, RECOVERY_ACTION,
        ],
        fields: health::FIELDS,
        hooks: Hooks::read(health::read),
    },
    Collector {
        name: "media",
        default: true,
        help: "Video encoder/decoder utilization over the samples since the previous run, their busy and sampled time, JPEG and OFA utilization, encoder sessions.",
        families: families![
            ENCODER_UTILIZATION, DECODER_UTILIZATION, ENCODER_SESSIONS, ENCODER_FPS,
            ENCODER_LATENCY, BUSY, SAMPLED, JPEG_UTILIZATION, OFA_UTILIZATION,
        ],
        fields: &[],
        hooks: Hooks::read(media::read),
    },
    Collector {
        name: "modes",
        default: true,
        help: "Persistence, compute and MIG modes.",
        families: families![PERSISTENCE_MODE, COMPUTE_MODE, MIG_ENABLED, MIG_PENDING_ENABLED],
        fields: &[],
        hooks: Hooks::read(modes::read),
    },
    Collector {
        name: "nvlink",
        default: true,
        help: "NVLink links, active links and links lost since they were active this boot, error, recovery and data counters summed over the links (batched field reads; NVLink 5 counters on Blackwell).",
        families: families![
            NVLINK_LINKS, NVLINK_LINKS_ACTIVE, NVLINK_LINKS_LOST, NVLINK_ERRORS, NVLINK_RECOVERIES,
            NVLINK_TRANSMIT, NVLINK_RECEIVE,
        ],
        fields: nvlink::FIELDS,
        hooks: Hooks::read(nvlink::read),
    },
    Collector {
        name: "nvlink-links",
        default: false,
        help: "NVLink state, error and data counters per link (up to 7 series a link; CRC counters one call per link and counter), on NVLink 5 recoveries, effective and symbol errors and bit error rates instead of the Hopper counters (up to 9 a link, no extra calls).",
        families: families![
            NVLINK_LINK_ACTIVE, NVLINK_LINK_ERRORS, NVLINK_LINK_RECOVERIES, NVLINK_LINK_BIT_ERROR,
            NVLINK_LINK_TRANSMIT, NVLINK_LINK_RECEIVE,
        ],
        fields: nvlink::LINKS_FIELDS,
        hooks: Hooks::read(nvlink::read_links),
    },
    Collector {
        name: "fabric",
        default: true,
        help: "NVLink fabric of NVSwitch systems: registration state and status, cluster and clique, health conditions and summary (nothing on GPUs on no fabric; that answer is read once per driver).",
        families: families![
            FABRIC_STATE, FABRIC_STATUS, FABRIC_INFO, FABRIC_HEALTH, FABRIC_HEALTH_SUMMARY,
        ],
        fields: &[],
        hooks: Hooks::read(fabric::read),
    },
    Collector {
        name: "mig",
        default: true,
        help: "MIG devices with their profile and memory.",
        families: families![
            MIG_INFO, MIG_MEMORY_USED, MIG_MEMORY_TOTAL, MIG_MEMORY_FREE, MIG_MEMORY_RESERVED,
        ],
        fields: &[],
        hooks: Hooks::read(mig::read),
    },
    Collector {
        name: "gpm",
        default: true,
        help: "SM activity and occupancy, tensor and other pipes, DRAM bandwidth over --gpm-window (GPM, Hopper and newer).",
        families: families![
            SM_ACTIVE, SM_OCCUPANCY, GRAPHICS_ENGINE_ACTIVE, DRAM_ACTIVE, PIPE_ACTIVE, GPM_WINDOW,
            GPM_UNAVAILABLE, MIG_SM_ACTIVE, MIG_SM_OCCUPANCY, MIG_GRAPHICS_ENGINE_ACTIVE,
            MIG_DRAM_ACTIVE, MIG_PIPE_ACTIVE,
        ],
        fields: &[],
        hooks: Hooks::open(gpm::open),
    },
    Collector {
        name: "processes",
        default: false,
        help: "Per-process GPU memory and SM utilization with owner attribution from /proc (pids churn series).",
        families: families![PROCESS_MEMORY_USED, PROCESS_UTILIZATION],
        fields: &[],
        hooks: Hooks::read(processes::read).with_host(processes::owners),
    },
    Collector {
        name: "xid",
        default: true,
        help: "XID errors, NVSwitch SXids and GPUs fallen off the bus, counted exactly from the kernel log (systemd journal, else /dev/kmsg).",
        families: families![
            XID_ERRORS, XID_ERRORS_BY_CODE, XID_UNATTRIBUTED, FALLEN_OFF_BUS,
            FALLEN_OFF_BUS_UNATTRIBUTED, NVSWITCH_SXID_ERRORS,
        ],
        fields: &[],
        hooks: Hooks::NONE.with_host(xid::collect),
    },
];

/// Families more than one collector emits, each its own `engine` values.
pub static SHARED: &[&Family] = &[metrics::BUSY.family(), metrics::SAMPLED.family()];

/// The collectors that are on by default, in output order.
pub fn defaults() -> impl Iterator<Item = &'static Collector> {
    ALL.iter().filter(|collector| collector.default)
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
                if SHARED.iter().any(|shared| shared.index == family.index) {
                    continue;
                }
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
