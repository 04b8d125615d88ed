//! One run's readings as plain data, what `render` writes: host samples and
//! one [`Device`] per GPU (rendered with its `gpu` and `uuid` labels first).
//! Values are finite, in base units; label sets distinct within a device and
//! family; a down device holds only `up`, its down reason and XID counters.

use std::borrow::Cow;

use crate::metrics::{Family, Labelled};
use crate::reason::Reason;

/// A label value that is usually a static string and only sometimes owned.
pub type LabelValue = Cow<'static, str>;

/// One `name="value"` pair beyond the identity labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub name: &'static str,
    pub value: LabelValue,
}

/// One sample of one family, made by the constructors of [`Labelled`].
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub family: &'static Family,
    pub labels: Vec<Label>,
    pub value: f64,
}

impl<const N: usize> Labelled<N> {
    /// A sample with one value for each declared label, in declared order;
    /// a wrong number does not compile:
    ///
    /// ```compile_fail,E0308
    /// use nvidia_textfile_exporter::metrics;
    ///
    /// metrics::COLLECTOR_ERROR.sample_with(["timeout", "busy"], 1.0);
    /// ```
    pub fn sample_with<V: Into<LabelValue>>(self, values: [V; N], value: f64) -> Sample {
        self.sample_some(values.map(|v| Some(v.into())), value)
    }

    /// Like [`Self::sample_with`], leaving out a label whose value is `None`.
    pub fn sample_some(self, values: [Option<LabelValue>; N], value: f64) -> Sample {
        let labels = self
            .family()
            .labels
            .iter()
            .zip(values)
            .filter_map(|(&name, value)| value.map(|value| Label { name, value }))
            .collect();
        Sample {
            family: self.family(),
            labels,
            value,
        }
    }
}

impl Labelled<0> {
    /// A sample with no labels beyond the identity ones.
    pub fn sample(self, value: f64) -> Sample {
        self.sample_some([], value)
    }
}

/// Everything read from one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Device {
    /// NVML's index of the GPU (the `gpu` label).
    pub index: u32,
    /// NVML's UUID (`GPU-…`); empty when NVML could not tell it.
    pub uuid: String,
    /// PCI bus id (`00000000:17:00.0`); empty when NVML could not tell it.
    pub pci_bus_id: String,
    /// Board serial; empty when the GPU has none or NVML could not tell it.
    pub serial: String,
    /// Read, or down and why: the run's exit status comes from these.
    pub status: Status,
    pub samples: Vec<Sample>,
    /// Its compute processes, which become samples once their owners are known.
    pub processes: Vec<Process>,
    /// What the tasks' accounting needs beyond the processes; `None` when the
    /// tasks collector did not read this GPU.
    pub tasks: Option<TaskReading>,
    /// The Slurm jobs the GPU (or a MIG instance of it) is allocated to now,
    /// as the tasks host step found them.
    pub slurm_jobs: Vec<SlurmJob>,
}

/// A Slurm job a GPU or MIG instance is allocated to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmJob {
    pub gpu_instance_id: Option<u32>,
    pub job_id: String,
    pub uid: Option<u32>,
}

/// The GPU engine's busy and sampled time since the previous run (µs), over
/// which NVML gave the processes their shares, and the time before them
/// that its buffer no longer held when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyWindow {
    pub busy_us: u64,
    pub length_us: u64,
    pub unread_us: u64,
}

/// A GPU's readings for its tasks' accounting.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskReading {
    pub window: Option<BusyWindow>,
    /// The energy counter, mJ.
    pub energy_mj: Option<u64>,
    /// Its MIG instances' UUIDs with their GPU instance ids, by which
    /// schedulers give them.
    pub instances: Vec<(String, u32)>,
}

/// Whether a GPU was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Status {
    #[default]
    Up,
    /// Not read for this reason; a timed-out GPU names the NVML call it was
    /// stuck in, where it was in one.
    Down {
        reason: Reason,
        stuck_in: Option<&'static str>,
    },
}

/// A process on a GPU (or a MIG instance of it) as NVML listed it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Process {
    pub pid: u32,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// Device memory it holds; `None` where NVML cannot tell.
    pub memory_bytes: Option<u64>,
    /// Its share of the GPU's busy time since the previous run (0-1); `None`: not read.
    pub sm_ratio: Option<f64>,
    /// NVML's newest sample of its share (µs since the epoch).
    pub sm_seen_us: Option<u64>,
    /// NVML lists it on the GPU now (else only its share of the window is known).
    pub listed: bool,
}

impl Process {
    /// Whether `other` is the same process on the same instance.
    pub fn is(&self, other: &Process) -> bool {
        (self.pid, self.gpu_instance_id, self.compute_instance_id)
            == (other.pid, other.gpu_instance_id, other.compute_instance_id)
    }
}

/// Everything one run writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Samples without device labels.
    pub host: Vec<Sample>,
    /// GPUs in index order.
    pub devices: Vec<Device>,
}

/// A GPU as an earlier run knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownGpu {
    pub index: u32,
    pub uuid: String,
    /// Empty when it was not known.
    pub pci_bus_id: String,
    /// Empty when it was not known.
    pub serial: String,
}

impl KnownGpu {
    /// Whether this is the GPU at bus id `bus` (not empty) with `serial`
    /// (where both runs read one).
    pub fn is_at(&self, bus: &str, serial: &str) -> bool {
        !bus.is_empty()
            && self.pci_bus_id == bus
            && (self.serial.is_empty() || serial.is_empty() || self.serial == serial)
    }
}
