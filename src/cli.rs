//! Command-line interface.
//!
//! This file depends only on `clap` and `humantime` because `build.rs` includes it
//! to generate the man page from the same definition.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// The longest `--timeout` accepted: a run must end well within a timer period
/// that users may stretch to a few minutes.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// Writes one snapshot of every NVIDIA GPU, read through NVML, to a Prometheus
/// textfile for node_exporter's textfile collector, then exits.
///
/// Run it every 15 seconds from the shipped systemd timer (or cron). Each run
/// replaces the output file atomically. When NVML cannot be read (driver not
/// loaded, library missing, a hung driver call) the file still gets replaced,
/// holding nvidia_gpu_collector_up 0 and an error metric naming the reason, so a
/// failure never looks like fresh data; a lost GPU gets nvidia_gpu_up 0 with its
/// reason while the other GPUs are reported in full.
#[derive(Debug, Parser)]
#[command(
    name = "nvidia-textfile-exporter",
    version,
    after_help = EXIT_STATUS_HELP,
)]
pub struct Cli {
    /// Directory that node_exporter's textfile collector reads
    /// (--collector.textfile.directory).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/prometheus/node-exporter"
    )]
    pub output_dir: PathBuf,

    /// Name of the file written in the output directory; must end in .prom.
    #[arg(long, value_name = "NAME", default_value = "nvidia_gpu.prom", value_parser = parse_output_file)]
    pub output_file: String,

    /// Print the metrics on standard output instead of writing the file.
    #[arg(long)]
    pub stdout: bool,

    /// Give up on NVML after this long (e.g. 10s, 1500ms) and write a timeout
    /// error instead; also how long to wait for another run's lock. At most 5m.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_timeout)]
    pub timeout: Duration,

    /// NVML library to load: a file name searched like dlopen(3) does, or a path.
    #[arg(long, value_name = "PATH", default_value = "libnvidia-ml.so.1")]
    pub nvml_lib: PathBuf,

    /// Enable a collector that is off by default (repeatable). Default set:
    /// utilization, memory, thermal, power, clocks, pcie, health, media, modes,
    /// nvlink, mig.
    #[arg(long = "collector", value_name = "NAME", value_enum)]
    pub enable: Vec<Collector>,

    /// Disable a collector that is on by default (repeatable).
    #[arg(long = "no-collector", value_name = "NAME", value_enum)]
    pub disable: Vec<Collector>,

    /// Read the GPUs one after another on one thread instead of each on its
    /// own: slower with several GPUs; for comparison, or for a driver that
    /// misbehaves under concurrent calls.
    #[arg(long)]
    pub sequential: bool,

    /// Where to read process owners from when the processes collector is on.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub procfs: PathBuf,
}

/// Groups of metric families that can be switched on and off.
/// `nvidia_gpu_up`, `nvidia_gpu_info` and the collector's own metrics are always written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Collector {
    /// GPU and memory utilization ratios, count of compute processes.
    Utilization,
    /// Device memory used/free/total/reserved, BAR1 memory.
    Memory,
    /// GPU and HBM temperatures, temperature thresholds, fans.
    Thermal,
    /// Power draw, energy counter, power limits.
    Power,
    /// Clocks, max clocks, performance state, clock event reasons, violation counters.
    Clocks,
    /// PCIe link generation/width, replays, byte counters.
    Pcie,
    /// PCIe throughput sampled by NVML over 20 ms per direction (off by default: slow).
    PcieThroughput,
    /// ECC mode and errors, retired pages, remapped rows.
    Health,
    /// Video encoder/decoder utilization and encoder sessions.
    Media,
    /// Persistence, compute and MIG modes.
    Modes,
    /// NVLink state, error counters, data counters per link.
    Nvlink,
    /// MIG devices with their memory.
    Mig,
    /// Per-process GPU memory with owner attribution from /proc (off by default: pids churn series).
    Processes,
}

impl Collector {
    /// Collectors that are on unless disabled.
    pub const DEFAULT: [Collector; 11] = [
        Collector::Utilization,
        Collector::Memory,
        Collector::Thermal,
        Collector::Power,
        Collector::Clocks,
        Collector::Pcie,
        Collector::Health,
        Collector::Media,
        Collector::Modes,
        Collector::Nvlink,
        Collector::Mig,
    ];
}

impl Cli {
    /// The collectors this run uses: the default set, plus `--collector`, minus
    /// `--no-collector` (which wins when both name one).
    pub fn collectors(&self) -> Vec<Collector> {
        let mut enabled: Vec<Collector> = Collector::DEFAULT.to_vec();
        enabled.extend(&self.enable);
        enabled.sort();
        enabled.dedup();
        enabled.retain(|c| !self.disable.contains(c));
        enabled
    }
}

/// The exit statuses, as printed at the end of `--help` and in the man page.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  all GPUs were read and the file was written
  2  bad command line
  3  NVML could not be used (library missing, driver not loaded, no permission, ...);
     the file now says why
  4  at least one GPU is down (lost, or failing every read); the file says which
  5  NVML did not answer within --timeout; the file says so
  6  another run held the lock of the output file for --timeout; the file says
     so unless that run published meanwhile
  7  the output file could not be written (nothing was changed)

Logging goes to standard error and is quiet for a healthy run; set RUST_LOG=debug
to see every unsupported field.";

fn parse_output_file(name: &str) -> Result<String, String> {
    if name.contains('/') {
        return Err("must be a file name, not a path (use --output-dir for the directory)".into());
    }
    if name.starts_with('.') {
        return Err("must not start with '.': node_exporter would not read it".into());
    }
    if name.len() <= ".prom".len() || !name.ends_with(".prom") {
        return Err(
            "must end in .prom: node_exporter's textfile collector reads only *.prom".into(),
        );
    }
    Ok(name.to_owned())
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if timeout.is_zero() {
        return Err("must be longer than zero".into());
    }
    if timeout > MAX_TIMEOUT {
        return Err(format!(
            "must be at most {}",
            humantime::format_duration(MAX_TIMEOUT)
        ));
    }
    Ok(timeout)
}
