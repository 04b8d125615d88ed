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
//! emitted by at most one collector, except those in [`SHARED`], whose label
//! values are split between collectors; a collector's reader emits only its
//! families (checked end to end against every scenario in `tests/cli.rs`).

use std::path::Path;
use std::time::Instant;

use super::reader::DeviceReader;
use super::{clocks, health, limits, media, memory, mig, modes, nvlink, pcie, power, processes};
use super::{gpm, thermal, utilization};
use crate::metrics::{self, Family};
use crate::snapshot::{Sample, Snapshot};
use crate::state::Memory;

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
    /// How its families are read.
    pub(super) read: Read,
}

/// The two kinds of collector.
#[derive(Clone, Copy)]
pub(super) enum Read {
    /// Reads this collector's families from one GPU, through NVML.
    Device(fn(&mut DeviceReader<'_>)),
    /// Host-level: reads outside NVML, after it (the kernel log for XID
    /// errors, `crate::xid`), attributing its per-GPU samples to the GPUs NVML
    /// reported. Its `fields` are empty. It returns why it did not read all it
    /// had to (a failure, or a read cut short by the deadline), having logged
    /// that itself as it sees fit (it knows whether it already said so).
    Host(fn(&mut HostRun<'_>) -> Result<(), String>),
}

/// What a host-level collector works with, once NVML was read: the snapshot
/// to add to, the state, when it must be done, and where the kernel log is.
pub struct HostRun<'a> {
    pub snapshot: &'a mut Snapshot,
    pub memory: &'a mut Memory,
    pub until: Instant,
    /// Journal files to read instead of the system journal (`--journal-dir`).
    pub journal_dir: Option<&'a Path>,
}

impl Collector {
    /// Runs this collector if it is a host-level one, and says in the host
    /// samples whether it worked and how long it took
    /// (`nvidia_gpu_collector_success` and `_step_duration_seconds`, labelled
    /// with its name), so that a failing collector never looks the same as one
    /// switched off. A device collector has already run inside `nvml::read`.
    pub fn read_host(&self, run: &mut HostRun<'_>) {
        if let Read::Host(read) = self.read {
            let started = Instant::now();
            let result = read(run);
            let took = started.elapsed().as_secs_f64();
            if let Err(error) = &result {
                log::debug!("collector {}: {error}", self.name);
            }
            let success = if result.is_ok() { 1.0 } else { 0.0 };
            run.snapshot.host.extend([
                Sample::new(&metrics::COLLECTOR_SUCCESS, success).with("collector", self.name),
                Sample::new(&metrics::COLLECTOR_STEP_DURATION, took).with("collector", self.name),
            ]);
        }
    }
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
        help: "GPU and memory utilization over the samples since the previous run, busy and sampled time, count of compute processes.",
        families: &[
            &metrics::UTILIZATION,
            &metrics::MEMORY_UTILIZATION,
            &metrics::PROCESSES,
            &metrics::BUSY,
            &metrics::SAMPLED,
        ],
        fields: &[],
        read: Read::Device(utilization::read),
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
        read: Read::Device(memory::read),
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
            &metrics::TEMPERATURE_MARGIN,
        ],
        fields: thermal::FIELDS,
        read: Read::Device(thermal::read),
    },
    Collector {
        name: "power",
        default: true,
        help: "Power draw and the driver's average, energy counter, enforced and default power limit.",
        families: &[
            &metrics::POWER,
            &metrics::ENERGY,
            &metrics::POWER_LIMIT,
            &metrics::POWER_DEFAULT_LIMIT,
            &metrics::POWER_AVERAGE,
        ],
        fields: power::FIELDS,
        read: Read::Device(power::read),
    },
    Collector {
        name: "clocks",
        default: true,
        help: "Clocks, performance state, clock event reasons, violation counters.",
        families: &[
            &metrics::CLOCK,
            &metrics::PERFORMANCE_STATE,
            &metrics::CLOCKS_EVENT,
            &metrics::VIOLATION,
        ],
        fields: clocks::FIELDS,
        read: Read::Device(clocks::read),
    },
    Collector {
        name: "pcie",
        default: true,
        help: "PCIe link generation and width now, replays, byte counters.",
        families: &[
            &metrics::PCIE_GENERATION,
            &metrics::PCIE_WIDTH,
            &metrics::PCIE_REPLAYS,
            &metrics::PCIE_TRANSMIT,
            &metrics::PCIE_RECEIVE,
        ],
        fields: pcie::FIELDS,
        read: Read::Device(pcie::read),
    },
    Collector {
        name: "limits",
        default: false,
        help: "Hardware maxima fixed while the driver is loaded: max clocks, power limit range, PCIe max generation and width.",
        families: &[
            &metrics::CLOCK_MAX,
            &metrics::POWER_MIN_LIMIT,
            &metrics::POWER_MAX_LIMIT,
            &metrics::PCIE_MAX_GENERATION,
            &metrics::PCIE_MAX_WIDTH,
        ],
        fields: &[],
        read: Read::Device(limits::read),
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
        read: Read::Device(pcie::read_throughput),
    },
    Collector {
        name: "health",
        default: true,
        help: "ECC mode and errors, retired pages, remapped rows, the recovery action the driver asks for.",
        families: &[
            &metrics::ECC_ENABLED,
            &metrics::ECC_PENDING_ENABLED,
            &metrics::ECC_ERRORS,
            &metrics::RETIRED_PAGES,
            &metrics::RETIRED_PAGES_PENDING,
            &metrics::REMAPPED_ROWS,
            &metrics::REMAPPED_ROWS_PENDING,
            &metrics::REMAPPED_ROWS_FAILURE,
            &metrics::RECOVERY_ACTION,
        ],
        fields: health::FIELDS,
        read: Read::Device(health::read),
    },
    Collector {
        name: "media",
        default: true,
        help: "Video encoder/decoder utilization over the samples since the previous run, their busy and sampled time, JPEG and OFA utilization, encoder sessions.",
        families: &[
            &metrics::ENCODER_UTILIZATION,
            &metrics::DECODER_UTILIZATION,
            &metrics::ENCODER_SESSIONS,
            &metrics::ENCODER_FPS,
            &metrics::ENCODER_LATENCY,
            &metrics::BUSY,
            &metrics::SAMPLED,
            &metrics::JPEG_UTILIZATION,
            &metrics::OFA_UTILIZATION,
        ],
        fields: &[],
        read: Read::Device(media::read),
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
        read: Read::Device(modes::read),
    },
    Collector {
        name: "nvlink",
        default: true,
        help: "NVLink links and active links, error and data counters summed over the links (batched field reads).",
        families: &[
            &metrics::NVLINK_LINKS,
            &metrics::NVLINK_LINKS_ACTIVE,
            &metrics::NVLINK_ERRORS,
            &metrics::NVLINK_TRANSMIT,
            &metrics::NVLINK_RECEIVE,
        ],
        fields: nvlink::FIELDS,
        read: Read::Device(nvlink::read),
    },
    Collector {
        name: "nvlink-links",
        default: false,
        help: "NVLink state, error and data counters per link (up to 7 series a link; CRC counters one call per link and counter).",
        families: &[
            &metrics::NVLINK_LINK_ACTIVE,
            &metrics::NVLINK_LINK_ERRORS,
            &metrics::NVLINK_LINK_TRANSMIT,
            &metrics::NVLINK_LINK_RECEIVE,
        ],
        fields: nvlink::LINKS_FIELDS,
        read: Read::Device(nvlink::read_links),
    },
    Collector {
        name: "mig",
        default: true,
        help: "MIG devices with their profile and memory.",
        families: &[
            &metrics::MIG_INFO,
            &metrics::MIG_MEMORY_USED,
            &metrics::MIG_MEMORY_TOTAL,
            &metrics::MIG_MEMORY_FREE,
            &metrics::MIG_MEMORY_RESERVED,
        ],
        fields: &[],
        read: Read::Device(mig::read),
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
        read: Read::Device(gpm::read),
    },
    Collector {
        name: "processes",
        default: false,
        help: "Per-process GPU memory and SM utilization with owner attribution from /proc (pids churn series).",
        families: &[&metrics::PROCESS_MEMORY_USED, &metrics::PROCESS_UTILIZATION],
        fields: &[],
        read: Read::Device(processes::read),
    },
    Collector {
        name: "xid",
        default: true,
        help: "XID errors counted exactly from the kernel log (systemd journal, else /dev/kmsg).",
        families: &[
            &metrics::XID_ERRORS,
            &metrics::XID_ERRORS_BY_CODE,
            &metrics::XID_UNATTRIBUTED,
        ],
        fields: &[],
        read: Read::Host(crate::xid::collect),
    },
];

/// Families that more than one collector emits, each with its own values of
/// the `engine` label: gpu and memory from `utilization`, encoder and decoder
/// from `media` (each reads the sample buffers of its own engines).
pub static SHARED: &[&Family] = &[&metrics::BUSY, &metrics::SAMPLED];

/// The collector called `name`.
pub fn by_name(name: &str) -> Option<&'static Collector> {
    ALL.iter().find(|collector| collector.name == name)
}

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
