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

mod clocks;
mod gpm;
pub mod gpus;
mod health;
mod info;
mod limits;
mod media;
mod memory;
mod mig;
mod modes;
mod nvlink;
mod pcie;
mod power;
mod processes;
pub mod procfs;
mod thermal;
mod utilization;
pub mod xid;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::metrics::{self, Family};
use crate::nvml::facts::GpuFacts;
use crate::nvml::reader::DeviceReader;
use crate::snapshot::{Sample, Snapshot};
use crate::state::Memory;

pub use gpm::{window as gpm_window, WindowRequest as GpmWindowRequest};

/// A window a collector opened over one GPU (GPM's two samples): the other
/// reads of the GPU are taken at its end, so that what they publish is as
/// fresh as the window's result.
pub trait Window<'n> {
    /// When the window closes.
    fn ends(&self) -> Instant;
    /// Closes the window (waiting for its end) and pushes its readings.
    fn close(self: Box<Self>, reader: &mut DeviceReader<'n>);
}

/// A group of metric families that can be switched on and off.
pub struct Collector {
    /// The name on the command line.
    pub name: &'static str,
    /// On unless `--no-collector` names it.
    pub default: bool,
    /// One line for `--help`, the man page and the README.
    pub help: &'static str,
    /// The families its hooks may emit.
    pub families: &'static [&'static Family],
    /// Field ids its reader takes from the GPU's batched field read.
    fields: &'static [u32],
    hooks: Hooks,
}

/// What a collector does in each phase of a run; a phase it has no hook for
/// it skips. Per GPU, in this order: every `open`, then (once every window
/// says its reads may start) the batched field read and every `read`, then
/// every window's close; after all GPUs, every `host` step.
#[derive(Clone, Copy)]
struct Hooks {
    /// Field ids for the GPU's batch that depend on what the info read found
    /// (the architecture): a reading that adds information on one GPU and
    /// repeats another on the next is batched only where it adds. Added to
    /// the row's fixed `fields`; the batch stays one call per GPU.
    fields_for: Option<fn(&GpuFacts) -> &'static [u32]>,
    /// Opens a window over the GPU before any other reading (GPM's first
    /// sample), closed after every `read`.
    open: Option<OpenHook>,
    /// Reads the collector's families from one GPU.
    read: Option<fn(&mut DeviceReader<'_>)>,
    /// Host-level work once the GPUs were read: reading outside NVML (the
    /// kernel log) or completing their samples (process owners). An error
    /// says why it did not work (`nvidia_gpu_collector_success` 0).
    host: Option<HostHook>,
}

/// Opens a window over one GPU; `None` when there is nothing to measure.
type OpenHook = for<'n> fn(&mut DeviceReader<'n>, &Settings) -> Option<Box<dyn Window<'n> + 'n>>;

/// A host step; the error says why it did not work.
type HostHook = fn(&mut HostRun<'_>) -> Result<(), String>;

impl Hooks {
    const NONE: Hooks = Hooks {
        fields_for: None,
        open: None,
        read: None,
        host: None,
    };
}

/// What this run's collectors are asked to do, resolved from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The collectors that are on, in registry order.
    pub collectors: Vec<&'static Collector>,
    /// Read each GPU on a thread of its own.
    pub parallel: bool,
    /// When reading must be done (the run's deadline less the time kept for
    /// publishing).
    pub reading_ends: Instant,
    /// The GPM window; zero turns GPM off.
    pub gpm_window: Duration,
    /// The GPM pause file exists.
    pub gpm_paused: bool,
    /// Where process owners are read from.
    pub procfs: PathBuf,
    /// Journal files to read instead of the system journal (`--journal-dir`).
    pub journal_dir: Option<PathBuf>,
}

/// What a host step works with, once NVML was read: the snapshot to add to,
/// the state, when it must be done, and where to read from.
pub struct HostRun<'a> {
    pub snapshot: &'a mut Snapshot,
    pub memory: &'a mut Memory,
    pub until: Instant,
    /// Journal files to read instead of the system journal (`--journal-dir`).
    pub journal_dir: Option<&'a Path>,
    /// Where process owners are read from (`--procfs`).
    pub procfs: &'a Path,
}

/// Runs the host step of every collector that has one, in registry order,
/// each said in the file: `nvidia_gpu_collector_success{collector}` and
/// `nvidia_gpu_collector_step_duration_seconds{collector}`. `enter` names the
/// phase for the watchdog.
pub fn run_host(
    collectors: &[&'static Collector],
    run: &mut HostRun<'_>,
    enter: &dyn Fn(&'static str),
) {
    for collector in collectors {
        let Some(host) = collector.hooks.host else {
            continue;
        };
        enter(collector.name);
        let started = Instant::now();
        let outcome = host(run);
        // The step logs its own failures (once, not every run).
        if let Err(why) = &outcome {
            log::debug!("collector {}: {why}", collector.name);
        }
        let samples = [
            Sample::new(
                &metrics::COLLECTOR_SUCCESS,
                f64::from(u8::from(outcome.is_ok())),
            ),
            Sample::new(
                &metrics::COLLECTOR_STEP_DURATION,
                started.elapsed().as_secs_f64(),
            ),
        ];
        run.snapshot.host.extend(
            samples
                .into_iter()
                .map(|s| s.with("collector", collector.name)),
        );
    }
}

impl Collector {
    /// The field ids it takes from the batch of a GPU with these facts.
    fn fields(&self, facts: &GpuFacts) -> impl Iterator<Item = u32> + '_ {
        let chosen = self.hooks.fields_for.map_or(&[][..], |pick| pick(facts));
        self.fields.iter().chain(chosen).copied()
    }

    /// Whether it opens a window over each GPU (and so takes the run's
    /// `--gpm-window`).
    pub fn opens_window(&self) -> bool {
        self.hooks.open.is_some()
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
            &metrics::MEMORY_USED,
            &metrics::MEMORY_FREE,
            &metrics::MEMORY_TOTAL,
            &metrics::MEMORY_RESERVED,
            &metrics::BAR1_USED,
            &metrics::BAR1_TOTAL,
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
        help: "GPU and HBM temperatures, temperature thresholds, fans.",
        families: &[
            &metrics::TEMPERATURE,
            &metrics::MEMORY_TEMPERATURE,
            &metrics::TEMPERATURE_THRESHOLD,
            &metrics::FAN_SPEED,
            &metrics::TEMPERATURE_MARGIN,
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
            &metrics::POWER,
            &metrics::ENERGY,
            &metrics::POWER_LIMIT,
            &metrics::POWER_DEFAULT_LIMIT,
            &metrics::POWER_AVERAGE,
            &metrics::POWER_INSTANT,
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
            &metrics::CLOCK,
            &metrics::PERFORMANCE_STATE,
            &metrics::CLOCKS_EVENT,
            &metrics::VIOLATION,
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
        help: "PCIe link generation and width now, replays, byte counters.",
        families: &[
            &metrics::PCIE_GENERATION,
            &metrics::PCIE_WIDTH,
            &metrics::PCIE_REPLAYS,
            &metrics::PCIE_TRANSMIT,
            &metrics::PCIE_RECEIVE,
        ],
        fields: pcie::FIELDS,
        hooks: Hooks {
            read: Some(pcie::read),
            ..Hooks::NONE
        },
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
            &metrics::PCIE_TRANSMIT_THROUGHPUT,
            &metrics::PCIE_RECEIVE_THROUGHPUT,
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
            &metrics::PERSISTENCE_MODE,
            &metrics::COMPUTE_MODE,
            &metrics::MIG_ENABLED,
            &metrics::MIG_PENDING_ENABLED,
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
        help: "NVLink links and active links, error and data counters summed over the links (batched field reads).",
        families: &[
            &metrics::NVLINK_LINKS,
            &metrics::NVLINK_LINKS_ACTIVE,
            &metrics::NVLINK_ERRORS,
            &metrics::NVLINK_TRANSMIT,
            &metrics::NVLINK_RECEIVE,
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
        help: "NVLink state, error and data counters per link (up to 7 series a link; CRC counters one call per link and counter).",
        families: &[
            &metrics::NVLINK_LINK_ACTIVE,
            &metrics::NVLINK_LINK_ERRORS,
            &metrics::NVLINK_LINK_TRANSMIT,
            &metrics::NVLINK_LINK_RECEIVE,
        ],
        fields: nvlink::LINKS_FIELDS,
        hooks: Hooks {
            read: Some(nvlink::read_links),
            ..Hooks::NONE
        },
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
        hooks: Hooks {
            open: Some(gpm::open),
            ..Hooks::NONE
        },
    },
    Collector {
        name: "processes",
        default: false,
        help: "Per-process GPU memory and SM utilization with owner attribution from /proc (pids churn series).",
        families: &[&metrics::PROCESS_MEMORY_USED, &metrics::PROCESS_UTILIZATION],
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
        help: "XID errors counted exactly from the kernel log (systemd journal, else /dev/kmsg).",
        families: &[
            &metrics::XID_ERRORS,
            &metrics::XID_ERRORS_BY_CODE,
            &metrics::XID_UNATTRIBUTED,
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
pub static SHARED: &[&Family] = &[&metrics::BUSY, &metrics::SAMPLED];

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
