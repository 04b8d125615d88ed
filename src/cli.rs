//! Command-line interface: clap types stop here. Every option's help, default
//! and values are defined once, below; `--generate man` renders them too.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Parser;

use crate::allocation::{JobMap, Sources};
use crate::collectors::{self, Collector, HostInputs, Settings};
use crate::exit::Exit;
pub use crate::hook::Hook;
pub use crate::timing::MAX_TIMEOUT;
use crate::timing::{self, Budget, WindowError, WindowRequest as GpmWindowRequest};

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
    about = "write NVIDIA GPU metrics for node_exporter's textfile collector",
    after_help = Exit::help(),
    // A later value of an option replaces an earlier one, so that ARGS in
    // /etc/default can override what the unit's ExecStart sets.
    args_override_self = true,
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

    /// The whole run's deadline (e.g. 10s, 1500ms; at most 5m): waiting for
    /// another run's lock, reading NVML and writing the file. A run that cannot
    /// read in time writes a timeout (or busy) error file before it. The
    /// packaged unit passes 14s, with --gpm-window auto.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_timeout)]
    pub timeout: Duration,

    /// NVML library to load: a file name searched like dlopen(3) does, or a path.
    #[arg(long, value_name = "PATH", default_value = "libnvidia-ml.so.1")]
    pub nvml_lib: PathBuf,

    /// Enable a collector (repeatable).
    #[arg(long = "collector", value_name = "NAME", value_parser = collector_parser(),
          long_help = collector_long_help())]
    pub enable: Vec<&'static Collector>,

    /// Disable a collector that is on by default (repeatable).
    #[arg(long = "no-collector", value_name = "NAME", value_parser = collector_parser())]
    pub disable: Vec<&'static Collector>,

    /// Read the GPUs one after another on one thread instead of each on its
    /// own: slower with several GPUs, and a GPU stuck in a call also holds up
    /// the GPUs after it; for comparison, or for a driver that misbehaves
    /// under concurrent calls.
    #[arg(long)]
    pub sequential: bool,

    /// Directory where a run leaves what the next one needs (sample
    /// timestamps, running totals, GPU identities). Its own directory, never
    /// the textfile directory; created if missing. A missing or broken state
    /// never costs a snapshot (see nvidia_gpu_collector_state_ok).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/nvidia-textfile-exporter"
    )]
    pub state_dir: PathBuf,

    /// With --stdout: also store the state (by default --stdout only reads it).
    #[arg(long, requires = "stdout")]
    pub write_state: bool,

    /// Read XID errors from the journal files in DIR (journalctl --directory)
    /// instead of the system journal or /dev/kmsg: for tests, or a journal
    /// kept elsewhere.
    #[arg(long, value_name = "DIR")]
    pub journal_dir: Option<PathBuf>,

    /// GPM window (Hopper and newer): the time between the two samples of the
    /// performance counters that SM activity and occupancy, pipe and DRAM
    /// activity are computed from (e.g. 1s, 500ms; at least 100ms; 0 turns GPM
    /// off; auto: as long as --timeout allows, what the package's unit uses to
    /// cover most of the timer's period). The other readings are taken at the
    /// window's end, so a run on a GPU with GPM lasts about this long. A window
    /// given here must fit in --timeout; the default, 1s, is shortened to fit a
    /// short --timeout (and GPM is off when not even 100ms fit). Any window is
    /// shortened in a run whose NVML started late or whose reads take longer
    /// than the previous run's, so that the reads still end in time.
    #[arg(long, value_name = "DURATION|auto")]
    pub gpm_window: Option<GpmWindowRequest>,

    /// While this file exists, no GPM sample is taken (the GPUs report
    /// nvidia_gpu_gpm_unavailable{reason="paused"}), leaving the performance
    /// counters to a profiler; like `dcgmi profile --pause`.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/run/nvidia-textfile-exporter/gpm-paused"
    )]
    pub gpm_pause_file: PathBuf,

    /// Where to read process owners from (the processes and tasks collectors).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub procfs: PathBuf,

    /// The kubelet's pod log directory (its podLogsDir), whose
    /// <namespace>_<name>_<uid> entries name the pods of GPU processes.
    #[arg(long, value_name = "DIR", default_value = "/var/log/pods")]
    pub pod_log_dir: PathBuf,

    /// The kubelet's container log links, <pod>_<namespace>_<container>-<id>.log,
    /// which name the containers of GPU processes.
    #[arg(long, value_name = "DIR", default_value = "/var/log/containers")]
    pub container_log_dir: PathBuf,

    /// The kubelet's device-plugin checkpoint: the GPUs and MIG instances
    /// given to each pod's containers (the tasks collector's seconds
    /// allocated). A missing file is a node without Kubernetes.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    )]
    pub kubelet_checkpoint: PathBuf,

    /// NVIDIA's DRA driver's checkpoint: the GPUs and MIG instances of the
    /// resource claims it prepared, given to the pods they are reserved for.
    /// A missing file is a node without the driver.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json"
    )]
    pub dra_checkpoint: PathBuf,

    /// Where the Slurm hook (--slurm-hook) keeps its records of the jobs'
    /// GPUs, read by every run.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/run/nvidia-textfile-exporter/slurm"
    )]
    pub slurm_hook_dir: PathBuf,

    /// A directory of GPU-to-job files that another tool's prolog keeps,
    /// read as FORMAT:DIR (repeatable): gpustat (Princeton jobstats', files
    /// /run/gpustat/<GPU index or UUID> holding "<job id> <uid>") or dcgm
    /// (dcgm-exporter's --hpc-job-mapping-dir, files <GPU index> holding job
    /// ids one a line).
    #[arg(
        long = "job-map",
        value_name = "FORMAT:DIR",
        default_value = "gpustat:/run/gpustat"
    )]
    pub job_maps: Vec<JobMap>,

    /// The control group root, which tells whether an allocated job or pod
    /// still runs.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/cgroup")]
    pub cgroupfs: PathBuf,

    /// Run as Slurm's Prolog or Epilog (as root, with the job's
    /// environment): record the job's GPUs and their energy counters in
    /// --slurm-hook-dir, so that its seconds allocated and energy are exact
    /// to its start and end, then exit 0 whatever failed (said in the
    /// journal). NVML gets at most a second.
    #[arg(long, value_name = "WHEN", value_parser = hook_parser(),
          conflicts_with_all = ["stdout", "job_report"])]
    pub slurm_hook: Option<Hook>,

    /// Print a Slurm job's totals on this node from the state and the hook's
    /// records, as one JSON object (per GPU: seconds allocated, busy and held,
    /// energy, peak memory), then exit: for the epilog, to put into the job's
    /// comment or a completion record.
    #[arg(long, value_name = "JOB_ID", conflicts_with = "stdout")]
    pub job_report: Option<String>,

    /// Print generated documentation or data and exit: the man page, the metric
    /// families, the collectors or the exit statuses (tab-separated).
    #[arg(long, value_name = "WHAT", hide = true)]
    pub generate: Option<Generate>,
}

/// What `--generate` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Generate {
    Man,
    Families,
    Collectors,
    ExitCodes,
    Reasons,
}

/// Accepts the name of any registered collector.
fn collector_parser() -> impl TypedValueParser<Value = &'static Collector> {
    PossibleValuesParser::new(
        collectors::ALL
            .iter()
            .map(|c| PossibleValue::new(c.name).help(c.help)),
    )
    .map(|name| {
        collectors::ALL
            .iter()
            .find(|c| c.name == name)
            .copied()
            .expect("the parser accepts only registered names")
    })
}

/// Accepts prolog or epilog.
fn hook_parser() -> impl TypedValueParser<Value = Hook> {
    PossibleValuesParser::new(["prolog", "epilog"]).map(|when| match when.as_str() {
        "prolog" => Hook::Prolog,
        _ => Hook::Epilog,
    })
}

/// `--collector`'s long help, with the default set taken from the registry.
fn collector_long_help() -> String {
    let names = |default: bool| {
        collectors::ALL
            .iter()
            .filter(|c| c.default == default)
            .map(|c| c.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "Enable a collector (repeatable). On by default: {}. Off by default: {}. \
         nvidia_gpu_up, nvidia_gpu_info, nvidia_gpu_driver_info and the \
         nvidia_gpu_collector_* series are always written.",
        names(true),
        names(false)
    )
}

impl Cli {
    /// Checks what the parser cannot check option by option.
    pub fn check(&self) -> Result<(), Conflict> {
        if self.collectors().iter().any(|c| c.opens_window()) {
            self.gpm_window().map_err(Conflict::GpmWindow)?;
        }
        // The state is the exporter's own: node_exporter's directory is shared
        // with other collectors and readable by its user.
        let same = |a: &std::path::Path, b: &std::path::Path| {
            a.components().eq(b.components())
                || matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
        };
        if !self.stdout && same(&self.state_dir, &self.output_dir) {
            return Err(Conflict::StateInOutput(self.state_dir.clone()));
        }
        Ok(())
    }

    /// The GPM window this run asks for (see `timing::gpm_window`).
    fn gpm_window(&self) -> Result<Duration, WindowError> {
        timing::gpm_window(self.gpm_window, self.timeout)
    }

    /// What the host steps read besides NVML.
    pub fn host_inputs(&self) -> HostInputs {
        HostInputs {
            journal_dir: self.journal_dir.clone(),
            procfs: self.procfs.clone(),
            pod_logs: self.pod_log_dir.clone(),
            container_logs: self.container_log_dir.clone(),
            allocations: Sources {
                kubelet_checkpoint: self.kubelet_checkpoint.clone(),
                dra_checkpoint: self.dra_checkpoint.clone(),
                slurm_hook_dir: self.slurm_hook_dir.clone(),
                job_maps: self.job_maps.clone(),
                cgroupfs: self.cgroupfs.clone(),
            },
        }
    }

    /// What this run's collectors are asked to do.
    pub fn settings(&self, budget: Budget) -> Settings {
        Settings {
            collectors: self.collectors(),
            parallel: !self.sequential,
            budget,
            gpm_window: self.gpm_window().unwrap_or_default(),
            gpm_paused: self.gpm_pause_file.exists(),
        }
    }

    /// The collectors this run uses, in registry order: the default set, plus
    /// `--collector`, minus `--no-collector` (which wins when both name one).
    pub fn collectors(&self) -> Vec<&'static Collector> {
        collectors::ALL
            .iter()
            .filter(|c| c.default || self.enable.contains(c))
            .filter(|c| !self.disable.contains(c))
            .copied()
            .collect()
    }
}

/// Options that cannot be used together (see [`Cli::check`]).
#[derive(Debug, thiserror::Error)]
pub enum Conflict {
    #[error(transparent)]
    GpmWindow(WindowError),
    #[error(
        "--state-dir {} is the textfile directory (--output-dir); the state needs a \
         directory of its own",
        .0.display()
    )]
    StateInOutput(PathBuf),
}

/// Why clap refuses the value of `--output-file` or `--timeout`.
#[derive(Debug, thiserror::Error)]
pub enum BadValue {
    #[error("must be a file name, not a path (use --output-dir for the directory)")]
    Path,
    #[error("must not start with '.': node_exporter would not read it")]
    Hidden,
    #[error("must end in .prom: node_exporter's textfile collector reads only *.prom")]
    NotProm,
    #[error(transparent)]
    Unreadable(humantime::DurationError),
    #[error("must be longer than zero")]
    ZeroTimeout,
    #[error("must be at most {}", humantime::format_duration(MAX_TIMEOUT))]
    TooLong,
}

fn parse_output_file(name: &str) -> Result<String, BadValue> {
    match name {
        _ if name.contains('/') => Err(BadValue::Path),
        _ if name.starts_with('.') => Err(BadValue::Hidden),
        _ if name.len() <= ".prom".len() || !name.ends_with(".prom") => Err(BadValue::NotProm),
        _ => Ok(name.to_owned()),
    }
}

fn parse_timeout(text: &str) -> Result<Duration, BadValue> {
    match humantime::parse_duration(text).map_err(BadValue::Unreadable)? {
        timeout if timeout.is_zero() => Err(BadValue::ZeroTimeout),
        timeout if timeout > MAX_TIMEOUT => Err(BadValue::TooLong),
        timeout => Ok(timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn collector_switches_resolve_against_the_registry() {
        let names = |cli: &Cli| cli.collectors().iter().map(|c| c.name).collect::<Vec<_>>();
        let defaults: Vec<&str> = collectors::ALL
            .iter()
            .filter(|c| c.default)
            .map(|c| c.name)
            .collect();
        assert_eq!(names(&parse(&[])), defaults);
        let with = names(&parse(&[
            "--collector",
            "processes",
            "--no-collector",
            "nvlink",
        ]));
        assert!(with.contains(&"processes") && !with.contains(&"nvlink"));
        assert!(
            names(&parse(&["--collector", "mig", "--no-collector", "mig"]))
                .iter()
                .all(|n| *n != "mig")
        );
        assert!(Cli::try_parse_from(["x", "--collector", "bogus"]).is_err());
    }

    #[test]
    fn bad_values_say_why() {
        let error = |args: &[&str]| {
            let error = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()));
            error.unwrap_err().to_string()
        };
        assert!(error(&["--output-file", "a/b.prom"]).contains("not a path"));
        assert!(error(&["--output-file", ".b.prom"]).contains("must not start with '.'"));
        assert!(error(&["--output-file", "b.txt"]).contains("must end in .prom"));
        assert!(error(&["--timeout", "0s"]).contains("must be longer than zero"));
        assert!(error(&["--timeout", "301s"]).contains("must be at most 5m"));
        assert!(error(&["--timeout", "x"]).contains("expected number"));
        let too_long = error(&["--gpm-window", "301s"]);
        assert!(too_long.contains("must be at most 5m: the window must fit in --timeout"));
    }

    #[test]
    fn the_state_directory_is_not_the_textfile_directory() {
        let same = parse(&["--output-dir", "/srv/prom", "--state-dir", "/srv/prom/"]);
        assert!(matches!(same.check(), Err(Conflict::StateInOutput(_))));
        let apart = parse(&["--output-dir", "/srv/prom", "--state-dir", "/srv/state"]);
        assert!(apart.check().is_ok());
    }

    #[test]
    fn a_later_value_replaces_an_earlier_one() {
        let cli = parse(&[
            "--timeout",
            "14s",
            "--gpm-window",
            "auto",
            "--gpm-window",
            "0",
        ]);
        assert_eq!(cli.gpm_window(), Ok(Duration::ZERO));
        assert_eq!(cli.timeout, Duration::from_secs(14));
        // The unit's options, then a user's shorter timeout: auto follows it.
        let cli = parse(&[
            "--timeout",
            "14s",
            "--gpm-window",
            "auto",
            "--timeout",
            "5s",
        ]);
        assert_eq!(cli.gpm_window(), Ok(Duration::from_millis(3040)));
        // The unit's: 13s of reading less the host steps' 500ms, 200ms and
        // the 1s kept for the reads.
        let unit = parse(&["--timeout", "14s", "--gpm-window", "auto"]);
        assert_eq!(unit.gpm_window(), Ok(Duration::from_millis(11300)));
        assert!(Cli::try_parse_from(["x", "--gpm-window", "50ms"]).is_err());
    }

    #[test]
    fn the_default_gpm_window_fits_the_timeout_a_given_one_must() {
        let ms = Duration::from_millis;
        let window = |args: &[&str]| parse(args).gpm_window();
        assert_eq!(window(&[]), Ok(ms(1000)));
        // 2s: the GPUs' reading ends at 1.44s (the host steps' 160ms
        // after), the window by 1.24s.
        assert_eq!(window(&["--timeout", "2s"]), Ok(ms(1000)));
        // 1s: the GPUs' reading ends at 720ms; 200ms for the second sample,
        // 72ms kept for reads that run late.
        assert_eq!(window(&["--timeout", "1s"]), Ok(ms(448)));
        assert_eq!(window(&["--timeout", "300ms"]), Ok(Duration::ZERO));
        assert!(parse(&["--timeout", "300ms"]).check().is_ok());
        let given = parse(&["--timeout", "1s", "--gpm-window", "1s"]);
        assert!(matches!(
            given.check(),
            Err(Conflict::GpmWindow(WindowError::DoesNotFit { .. }))
        ));
        assert_eq!(
            window(&["--timeout", "2s", "--gpm-window", "1240ms"]),
            Ok(ms(1240))
        );
        assert!(parse(&["--timeout", "2s", "--gpm-window", "1241ms"])
            .check()
            .is_err());
        assert_eq!(window(&["--gpm-window", "0"]), Ok(Duration::ZERO));
        // A window no run can hold is refused while parsing, GPM on or off.
        assert!(Cli::try_parse_from(["x", "--gpm-window", "18446744073709551615s"]).is_err());
        let longest = parse(&["--gpm-window", "5m", "--timeout", "5m"]);
        assert!(matches!(
            longest.check(),
            Err(Conflict::GpmWindow(WindowError::DoesNotFit { .. }))
        ));
    }
}
