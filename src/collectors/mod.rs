//! Collectors, a layer above `nvml`: the registry, the one place a collector
//! is defined, and the readers (one file each).
//!
//! A row gives the name used by `--collector`/`--no-collector`, whether it is on
//! by default, its one-line help, the families it may emit, the field ids it
//! takes from the per-GPU batch (fixed, plus those its [`Hooks::fields_for`]
//! picks from the GPU's facts), and its [`Hooks`]: what it does in each phase
//! of a run. The command line's value list, the default set, `--help`, the man
//! page and the README's list all come from [`ALL`] (the README is checked
//! against it by a test); the phases run every row's hooks without naming a
//! collector ([`gpus`] per GPU, [`run_host`] after the GPUs). Adding a
//! collector is one row here and one reader file.
//!
//! Invariants (checked by tests): names are unique kebab-case; every family is
//! emitted by at most one collector, except those in [`SHARED`], whose label
//! values are split between collectors; a collector's reader emits only its
//! families (checked end to end against every scenario in `tests/cli.rs`).

// NVML's C functions are called only in `nvml`: the collectors module forbids
// `unsafe` (lib.rs).
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
        families: &[
            metrics::UTILIZATION.family(),
            metrics::MEMORY_UTILIZATION.family(),
            metrics::PROCESSES.family(),
            metrics::BUSY.family(),
            metrics::SAMPLED.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(utilization::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "memory",
        default: true,
        help: "Device memory used/free/total/reserved, BAR1 memory.",
        families: &[
            metrics::MEMORY_USED.family(),
            metrics::MEMORY_FREE.family(),
            metrics::MEMORY_TOTAL.family(),
            metrics::MEMORY_RESERVED.family(),
            metrics::BAR1_USED.family(),
            metrics::BAR1_TOTAL.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(memory::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "thermal",
        default: true,
        help: "GPU and HBM temperatures, temperature thresholds, fans, thermal margin and the margins the GPU slows down and shuts down at, time held down by thermal and power-brake slowdown.",
        families: &[
            metrics::TEMPERATURE.family(),
            metrics::MEMORY_TEMPERATURE.family(),
            metrics::TEMPERATURE_THRESHOLD.family(),
            metrics::FAN_SPEED.family(),
            metrics::TEMPERATURE_MARGIN.family(),
            metrics::TEMPERATURE_MARGIN_THRESHOLD.family(),
            metrics::SLOWDOWN.family(),
        ],
        fields: thermal::FIELDS,
        hooks: Hooks {
            read: Some(thermal::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "power",
        default: true,
        help: "Power draw and, by architecture, the instantaneous power or the driver's 1 s average (whichever the draw is not), energy counter, enforced and default power limit.",
        families: &[
            metrics::POWER.family(),
            metrics::ENERGY.family(),
            metrics::POWER_LIMIT.family(),
            metrics::POWER_DEFAULT_LIMIT.family(),
            metrics::POWER_AVERAGE.family(),
            metrics::POWER_INSTANT.family(),
        ],
        fields: power::FIELDS,
        hooks: Hooks {
            fields_for: Some(power::second_reading),
            read: Some(power::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "clocks",
        default: true,
        help: "Clocks, performance state, clock event reasons, violation counters.",
        families: &[
            metrics::CLOCK.family(),
            metrics::PERFORMANCE_STATE.family(),
            metrics::CLOCKS_EVENT.family(),
            metrics::VIOLATION.family(),
        ],
        fields: clocks::FIELDS,
        hooks: Hooks {
            read: Some(clocks::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "pcie",
        default: true,
        help: "PCIe link generation and width now and their maxima (read once per driver), replays, byte counters.",
        families: &[
            metrics::PCIE_GENERATION.family(),
            metrics::PCIE_MAX_GENERATION.family(),
            metrics::PCIE_WIDTH.family(),
            metrics::PCIE_MAX_WIDTH.family(),
            metrics::PCIE_REPLAYS.family(),
            metrics::PCIE_TRANSMIT.family(),
            metrics::PCIE_RECEIVE.family(),
        ],
        fields: pcie::FIELDS,
        hooks: Hooks {
            read: Some(pcie::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "pcie-errors",
        default: false,
        help: "PCIe error counters by kind: L0 to recovery, correctable, NAKs, receiver, bad TLP/DLLP, non-fatal, fatal, unsupported request, LCRC, lane (12 field values a run).",
        families: &[metrics::PCIE_ERRORS.family()],
        fields: pcie_errors::FIELDS,
        hooks: Hooks {
            read: Some(pcie_errors::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "limits",
        default: false,
        help: "Hardware maxima fixed while the driver is loaded: max clocks, power limit range.",
        families: &[
            metrics::CLOCK_MAX.family(),
            metrics::POWER_MIN_LIMIT.family(),
            metrics::POWER_MAX_LIMIT.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(limits::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "pcie-throughput",
        default: false,
        help: "PCIe throughput sampled by NVML over 20 ms per direction (slow).",
        families: &[
            metrics::PCIE_TRANSMIT_THROUGHPUT.family(),
            metrics::PCIE_RECEIVE_THROUGHPUT.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(pcie::read_throughput),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "health",
        default: true,
        help: "ECC mode and errors, retired pages, remapped rows, the recovery action the driver asks for.",
        families: &[
            metrics::ECC_ENABLED.family(),
            metrics::ECC_PENDING_ENABLED.family(),
            metrics::ECC_ERRORS.family(),
            metrics::RETIRED_PAGES.family(),
            metrics::RETIRED_PAGES_PENDING.family(),
            metrics::REMAPPED_ROWS.family(),
            metrics::REMAPPED_ROWS_PENDING.family(),
            metrics::REMAPPED_ROWS_FAILURE.family(),
            metrics::RECOVERY_ACTION.family(),
        ],
        fields: health::FIELDS,
        hooks: Hooks {
            read: Some(health::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "media",
        default: true,
        help: "Video encoder/decoder utilization over the samples since the previous run, their busy and sampled time, JPEG and OFA utilization, encoder sessions.",
        families: &[
            metrics::ENCODER_UTILIZATION.family(),
            metrics::DECODER_UTILIZATION.family(),
            metrics::ENCODER_SESSIONS.family(),
            metrics::ENCODER_FPS.family(),
            metrics::ENCODER_LATENCY.family(),
            metrics::BUSY.family(),
            metrics::SAMPLED.family(),
            metrics::JPEG_UTILIZATION.family(),
            metrics::OFA_UTILIZATION.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(media::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "modes",
        default: true,
        help: "Persistence, compute and MIG modes.",
        families: &[
            metrics::PERSISTENCE_MODE.family(),
            metrics::COMPUTE_MODE.family(),
            metrics::MIG_ENABLED.family(),
            metrics::MIG_PENDING_ENABLED.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(modes::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "nvlink",
        default: true,
        help: "NVLink links, active links and links lost since they were active this boot, error, recovery and data counters summed over the links (batched field reads; NVLink 5 counters on Blackwell).",
        families: &[
            metrics::NVLINK_LINKS.family(),
            metrics::NVLINK_LINKS_ACTIVE.family(),
            metrics::NVLINK_LINKS_LOST.family(),
            metrics::NVLINK_ERRORS.family(),
            metrics::NVLINK_RECOVERIES.family(),
            metrics::NVLINK_TRANSMIT.family(),
            metrics::NVLINK_RECEIVE.family(),
        ],
        fields: nvlink::FIELDS,
        hooks: Hooks {
            read: Some(nvlink::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "nvlink-links",
        default: false,
        help: "NVLink state, error and data counters per link (up to 7 series a link; CRC counters one call per link and counter), on NVLink 5 recoveries, effective and symbol errors and bit error rates instead of the Hopper counters (up to 9 a link, no extra calls).",
        families: &[
            metrics::NVLINK_LINK_ACTIVE.family(),
            metrics::NVLINK_LINK_ERRORS.family(),
            metrics::NVLINK_LINK_RECOVERIES.family(),
            metrics::NVLINK_LINK_BIT_ERROR.family(),
            metrics::NVLINK_LINK_TRANSMIT.family(),
            metrics::NVLINK_LINK_RECEIVE.family(),
        ],
        fields: nvlink::LINKS_FIELDS,
        hooks: Hooks {
            read: Some(nvlink::read_links),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "fabric",
        default: true,
        help: "NVLink fabric of NVSwitch systems: registration state and status, cluster and clique, health conditions and summary (nothing on GPUs on no fabric; that answer is read once per driver).",
        families: &[
            metrics::FABRIC_STATE.family(),
            metrics::FABRIC_STATUS.family(),
            metrics::FABRIC_INFO.family(),
            metrics::FABRIC_HEALTH.family(),
            metrics::FABRIC_HEALTH_SUMMARY.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(fabric::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "mig",
        default: true,
        help: "MIG devices with their profile and memory.",
        families: &[
            metrics::MIG_INFO.family(),
            metrics::MIG_MEMORY_USED.family(),
            metrics::MIG_MEMORY_TOTAL.family(),
            metrics::MIG_MEMORY_FREE.family(),
            metrics::MIG_MEMORY_RESERVED.family(),
        ],
        fields: &[],
        hooks: Hooks {
            read: Some(mig::read),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "gpm",
        default: true,
        help: "SM activity and occupancy, tensor and other pipes, DRAM bandwidth over --gpm-window (GPM, Hopper and newer).",
        families: &[
            metrics::SM_ACTIVE.family(),
            metrics::SM_OCCUPANCY.family(),
            metrics::GRAPHICS_ENGINE_ACTIVE.family(),
            metrics::DRAM_ACTIVE.family(),
            metrics::PIPE_ACTIVE.family(),
            metrics::GPM_WINDOW.family(),
            metrics::GPM_UNAVAILABLE.family(),
            metrics::MIG_SM_ACTIVE.family(),
            metrics::MIG_SM_OCCUPANCY.family(),
            metrics::MIG_GRAPHICS_ENGINE_ACTIVE.family(),
            metrics::MIG_DRAM_ACTIVE.family(),
            metrics::MIG_PIPE_ACTIVE.family(),
        ],
        fields: &[],
        hooks: Hooks {
            open: Some(gpm::open),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "processes",
        default: false,
        help: "Per-process GPU memory and SM utilization with owner attribution from /proc (pids churn series).",
        families: &[metrics::PROCESS_MEMORY_USED.family(), metrics::PROCESS_UTILIZATION.family()],
        fields: &[],
        hooks: Hooks {
            read: Some(processes::read),
            host: Some(processes::owners),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "xid",
        default: true,
        help: "XID errors, NVSwitch SXids and GPUs fallen off the bus, counted exactly from the kernel log (systemd journal, else /dev/kmsg).",
        families: &[
            metrics::XID_ERRORS.family(),
            metrics::XID_ERRORS_BY_CODE.family(),
            metrics::XID_UNATTRIBUTED.family(),
            metrics::FALLEN_OFF_BUS.family(),
            metrics::FALLEN_OFF_BUS_UNATTRIBUTED.family(),
            metrics::NVSWITCH_SXID_ERRORS.family(),
        ],
        fields: &[],
        hooks: Hooks {
            host: Some(xid::collect),
            ..Hooks::NONE
        },
    },
];

/// Families that more than one collector emits, each with its own values of
/// the `engine` label: gpu and memory from `utilization`, encoder and decoder
/// from `media` (each reads the sample buffers of its own engines).
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
