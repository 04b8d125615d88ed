//! GPM (GPU Performance Monitoring, Hopper and newer): SM activity and
//! occupancy, graphics engine, DRAM bandwidth and per-pipe activity, computed by
//! NVML from two samples of the GPU's performance counters taken a window apart.
//!
//! The window is the run's: [`open`] takes the first sample right after the
//! GPU's identity, every other collector reads the GPU while the window runs,
//! and [`read`] (run last) sleeps what is left of `--gpm-window`, takes the
//! second sample and asks `nvmlGpmMetricsGet` for the metrics. So a run lasts
//! about NVML init + max(reads, window), not their sum.
//!
//! - A GPU without GPM (`nvmlGpmQueryDeviceSupport` says no) gets nothing.
//! - NVML's metrics are percentages: converted to ratios; NaN and values outside
//!   0-100 % are dropped, logged and counted (`reject`). A short window reads
//!   zeros (50 ms did on an H200), hence a minimum `--gpm-window`.
//! - Counters that may not be read now leave the metrics out with
//!   `nvidia_gpu_gpm_unavailable{reason}`, never a read error: `no_permission`
//!   (the driver's default `NVreg_RestrictProfilingToAdminUsers=1` keeps them
//!   from processes without CAP_SYS_ADMIN), `counters_in_use` (a profiler such
//!   as Nsight Compute or DCGM profiling holds them), `paused` (the pause file
//!   exists). The reason is remembered so that the log says it once when it
//!   starts, not every run (see `super::log_gpm_changes`).
//! - MIG: on a GPU in MIG mode, each GPU instance is sampled with
//!   `nvmlGpmMigSampleGet` and reported with its `gpu_instance_id`.

use std::ffi::c_uint;
use std::time::{Duration, Instant};

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpmSupport_t, NvmlLib,
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION,
};

use super::mig::{self, Instance};
use super::reader::DeviceReader;
use crate::metrics::{self, Family};
use crate::snapshot::Sample as MetricSample;

/// The collector's name in the registry.
pub const COLLECTOR: &str = "gpm";

/// The key under which a run remembers why GPM was unavailable.
pub(super) const MEMORY_KEY: &str = "gpm_unavailable";

/// The shortest `--gpm-window` accepted: on an H200 a 50 ms window read all
/// zeros, 1 s windows read right.
pub const MIN_WINDOW: Duration = Duration::from_millis(100);

/// The time kept after the window for the second sample and the metrics
/// (0.05-0.7 ms and 1-3 ms a GPU on an H200), before reading must end.
pub const AFTER_WINDOW: Duration = Duration::from_millis(200);

/// How this run measures GPM.
#[derive(Debug, Clone, Default)]
pub struct GpmOptions {
    /// The window between the two samples; zero turns GPM off.
    pub window: Duration,
    /// The pause file exists: sample nothing.
    pub paused: bool,
    /// The window ends by then at the latest (the run's reading deadline less
    /// [`AFTER_WINDOW`]); set by the watchdog.
    pub latest_end: Option<Instant>,
}

/// Why the GPM metrics of a GPU that supports GPM are missing from a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    NoPermission,
    CountersInUse,
    Paused,
}

impl Unavailable {
    pub const ALL: [Unavailable; 3] = [
        Unavailable::NoPermission,
        Unavailable::CountersInUse,
        Unavailable::Paused,
    ];

    /// The `reason` label of `nvidia_gpu_gpm_unavailable`.
    pub fn label(self) -> &'static str {
        match self {
            Unavailable::NoPermission => "no_permission",
            Unavailable::CountersInUse => "counters_in_use",
            Unavailable::Paused => "paused",
        }
    }

    /// What the log line says about it.
    pub fn hint(self) -> &'static str {
        match self {
            Unavailable::NoPermission => {
                "the driver keeps the performance counters from processes without \
                 CAP_SYS_ADMIN (NVreg_RestrictProfilingToAdminUsers=1, its default); \
                 set that option to 0, or grant the unit the capability (README, GPM), \
                 or turn GPM off with --no-collector gpm"
            }
            Unavailable::CountersInUse => {
                "another tool holds the performance counters (Nsight Compute, DCGM \
                 profiling); GPM metrics return when it releases them"
            }
            Unavailable::Paused => {
                "the GPM pause file exists (--gpm-pause-file); remove it to resume"
            }
        }
    }

    fn from_error(error: &NvmlError) -> Option<Self> {
        match error {
            NvmlError::NoPermission => Some(Unavailable::NoPermission),
            // NVML_ERROR_IN_USE, and INSUFFICIENT_RESOURCES (23), which newer
            // drivers may return while a profiler holds the counters.
            NvmlError::InUse | NvmlError::UnexpectedVariant(23) => Some(Unavailable::CountersInUse),
            _ => None,
        }
    }

    fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.label() == label)
    }
}

/// A reason remembered by a run, if it is one.
pub(super) fn remembered(label: Option<&String>) -> Option<Unavailable> {
    label.and_then(|l| Unavailable::from_label(l))
}

/// What GPM measures, by NVML metric id (`nvmlGpmMetricId_t`, nvml.h), the
/// family of the whole GPU, the family of a MIG GPU instance, and the `pipe`.
const METRICS: &[(c_uint, &Family, &Family, Option<&str>)] = &[
    (
        1,
        &metrics::GRAPHICS_ENGINE_ACTIVE,
        &metrics::MIG_GRAPHICS_ENGINE_ACTIVE,
        None,
    ), // GRAPHICS_UTIL
    (2, &metrics::SM_ACTIVE, &metrics::MIG_SM_ACTIVE, None), // SM_UTIL
    (3, &metrics::SM_OCCUPANCY, &metrics::MIG_SM_OCCUPANCY, None), // SM_OCCUPANCY
    (10, &metrics::DRAM_ACTIVE, &metrics::MIG_DRAM_ACTIVE, None), // DRAM_BW_UTIL
    (
        5,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("tensor"),
    ), // ANY_TENSOR_UTIL
    (
        7,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("tensor_hmma"),
    ), // HMMA_TENSOR_UTIL
    (
        9,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("tensor_imma"),
    ), // IMMA_TENSOR_UTIL
    (
        6,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("tensor_dfma"),
    ), // DFMA_TENSOR_UTIL
    (
        11,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("fp64"),
    ), // FP64_UTIL
    (
        12,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("fp32"),
    ), // FP32_UTIL
    (
        13,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("fp16"),
    ), // FP16_UTIL
    (
        4,
        &metrics::PIPE_ACTIVE,
        &metrics::MIG_PIPE_ACTIVE,
        Some("integer"),
    ), // INTEGER_UTIL
];

/// The most GPU instances one GPU has (7 on H100/H200).
const MAX_GPU_INSTANCES: usize = 8;

/// A sample buffer from `nvmlGpmSampleAlloc`, freed when dropped.
struct GpmSample<'n> {
    lib: &'n NvmlLib,
    handle: nvmlGpmSample_t,
}

impl Drop for GpmSample<'_> {
    fn drop(&mut self) {
        if let Ok(free) = nvml_sym(self.lib.nvmlGpmSampleFree.as_ref()) {
            // SAFETY: the handle came from nvmlGpmSampleAlloc and is freed once.
            unsafe { free(self.handle) };
        }
    }
}

/// What is sampled: the whole GPU, or one MIG GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Gpu,
    Instance(u32),
}

/// The two samples of one target and when the first was taken.
struct Measurement<'n> {
    target: Target,
    first: GpmSample<'n>,
    second: GpmSample<'n>,
    /// Midpoint of the first sample's call.
    first_at: Instant,
}

/// A GPU's open GPM window, from [`open`] to [`read`].
pub(super) struct Window<'n> {
    measurements: Vec<Measurement<'n>>,
    /// When the second samples are due.
    ends: Instant,
}

/// Opens the GPM window of a GPU: checks support, allocates the samples and
/// takes the first ones. Nothing is opened when GPM is off, unsupported,
/// paused or refused.
pub(super) fn open(reader: &mut DeviceReader<'_>, options: &GpmOptions) {
    if options.window.is_zero() || !supported(reader) {
        return;
    }
    if options.paused {
        unavailable(reader, Unavailable::Paused);
        return;
    }
    let mut targets = vec![Target::Gpu];
    targets.extend(gpu_instances(reader).into_iter().map(Target::Instance));
    let mut measurements = Vec::with_capacity(targets.len());
    for target in targets {
        let (Some(first), Some(second)) = (alloc(reader), alloc(reader)) else {
            break;
        };
        match take(reader, target, &first) {
            Taken::At(first_at) => measurements.push(Measurement {
                target,
                first,
                second,
                first_at,
            }),
            Taken::Skipped => {}
            Taken::Unavailable(why) => {
                unavailable(reader, why);
                return;
            }
            Taken::Down => return,
        }
    }
    let Some(first) = measurements.first() else {
        return;
    };
    let mut ends = first.first_at + options.window;
    if let Some(latest) = options.latest_end {
        ends = ends.min(latest);
    }
    reader.window = Some(Window { measurements, ends });
}

/// The collector's reader, run after all others: closes the window [`open`]
/// opened (if it did) and exports the metrics.
pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let Some(window) = reader.window.take() else {
        return;
    };
    let wait = window.ends.saturating_duration_since(Instant::now());
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
    let mut results = Vec::with_capacity(window.measurements.len());
    for measurement in &window.measurements {
        match take(reader, measurement.target, &measurement.second) {
            Taken::At(second_at) => results.push((measurement, second_at)),
            Taken::Skipped => {}
            Taken::Unavailable(why) => return unavailable(reader, why),
            Taken::Down => return,
        }
    }
    let mut window_seconds = None;
    for (measurement, second_at) in results {
        // A window cut short by the deadline (a slow start) reads zeros, not
        // the GPU's activity: nothing is better than a false idle.
        let measured = second_at - measurement.first_at;
        if measured < MIN_WINDOW {
            log::warn!(
                "GPU {}: the GPM window was cut to {measured:?} by --timeout; GPM left out",
                reader.index()
            );
            continue;
        }
        let Some(values) = metrics_get(reader, measurement) else {
            continue;
        };
        let mut any = false;
        for ((id, gpu_family, mig_family, pipe), value) in METRICS.iter().zip(values) {
            let Some(percent) = value else { continue };
            let family = match measurement.target {
                Target::Gpu => *gpu_family,
                Target::Instance(_) => *mig_family,
            };
            if !(0.0..=100.0).contains(&percent) {
                log::debug!("GPM metric {id}: {percent}");
                reader.reject(family, percent);
                continue;
            }
            let mut sample = MetricSample::new(family, percent / 100.0);
            if let Target::Instance(gi) = measurement.target {
                sample = sample.with("gpu_instance_id", gi.to_string());
            }
            if let Some(pipe) = pipe {
                sample = sample.with("pipe", *pipe);
            }
            reader.push(sample);
            any = true;
        }
        if any && window_seconds.is_none() {
            window_seconds = Some((second_at - measurement.first_at).as_secs_f64());
        }
    }
    if let Some(seconds) = window_seconds {
        reader.gauge(&metrics::GPM_WINDOW, seconds);
    }
}

/// Whether NVML says the GPU supports GPM.
fn supported(reader: &mut DeviceReader<'_>) -> bool {
    reader
        .read_raw("nvmlGpmQueryDeviceSupport", |lib, device| {
            let query = nvml_sym(lib.nvmlGpmQueryDeviceSupport.as_ref())?;
            let mut support = nvmlGpmSupport_t {
                version: NVML_GPM_SUPPORT_VERSION,
                isSupportedDevice: 0,
            };
            // SAFETY: one versioned struct, written by NVML.
            nvml_try(unsafe { query(device, &mut support) })?;
            Ok(support.isSupportedDevice != 0)
        })
        .unwrap_or(false)
}

/// The GPU instance ids of a GPU in MIG mode (none otherwise), each once.
fn gpu_instances(reader: &mut DeviceReader<'_>) -> Vec<u32> {
    let enabled = reader.mig_mode().is_some_and(|mode| mode.current == 1);
    if !enabled {
        return Vec::new();
    }
    let slots = reader
        .read("nvmlDeviceGetMaxMigDeviceCount", |d| d.mig_device_count())
        .and_then(|count| {
            reader.bounded(
                "nvmlDeviceGetMaxMigDeviceCount",
                count,
                mig::MAX_MIG_DEVICES,
            )
        })
        .unwrap_or(0);
    let mut ids = Vec::new();
    for slot in 0..slots {
        let device = match reader.try_read("nvmlDeviceGetMigDeviceHandleByIndex", |d| {
            d.mig_device_by_index(slot)
        }) {
            None => break,
            Some(Ok(device)) => device,
            Some(Err(NvmlError::NotFound)) => continue,
            Some(Err(error)) => {
                reader.note("nvmlDeviceGetMigDeviceHandleByIndex", &error);
                continue;
            }
        };
        if let Some(id) = reader.read("nvmlDeviceGetGpuInstanceId", |_| {
            mig::instance_id(&device, Instance::Gpu)
        }) {
            if !ids.contains(&id) && ids.len() < MAX_GPU_INSTANCES {
                ids.push(id);
            }
        }
    }
    ids
}

fn alloc<'n>(reader: &mut DeviceReader<'n>) -> Option<GpmSample<'n>> {
    let lib = reader.lib();
    let handle = reader.read_raw("nvmlGpmSampleAlloc", |lib, _| {
        let alloc = nvml_sym(lib.nvmlGpmSampleAlloc.as_ref())?;
        let mut sample: nvmlGpmSample_t = std::ptr::null_mut();
        // SAFETY: one out-pointer.
        nvml_try(unsafe { alloc(&mut sample) })?;
        Ok(sample)
    })?;
    Some(GpmSample { lib, handle })
}

enum Taken {
    /// The sample was taken; the midpoint of the call.
    At(Instant),
    /// This target cannot be sampled (not supported, or a counted error).
    Skipped,
    Unavailable(Unavailable),
    /// The GPU is down.
    Down,
}

/// Takes a sample of `target` into `sample`.
fn take(reader: &mut DeviceReader<'_>, target: Target, sample: &GpmSample<'_>) -> Taken {
    let handle = sample.handle;
    let before = Instant::now();
    let (call, result) = match target {
        Target::Gpu => (
            "nvmlGpmSampleGet",
            reader.try_read("nvmlGpmSampleGet", |d| {
                raw(d, |lib, device| {
                    let get = nvml_sym(lib.nvmlGpmSampleGet.as_ref())?;
                    // SAFETY: a live device handle and sample buffer.
                    nvml_try(unsafe { get(device, handle) })
                })
            }),
        ),
        Target::Instance(gi) => (
            "nvmlGpmMigSampleGet",
            reader.try_read("nvmlGpmMigSampleGet", |d| {
                raw(d, |lib, device| {
                    let get = nvml_sym(lib.nvmlGpmMigSampleGet.as_ref())?;
                    // SAFETY: a live device handle and sample buffer.
                    nvml_try(unsafe { get(device, gi, handle) })
                })
            }),
        ),
    };
    let after = Instant::now();
    match result {
        None => Taken::Down,
        Some(Ok(())) => Taken::At(before + (after - before) / 2),
        Some(Err(error)) => match Unavailable::from_error(&error) {
            Some(why) => Taken::Unavailable(why),
            None => {
                reader.note(call, &error);
                Taken::Skipped
            }
        },
    }
}

/// Calls `f` with the raw library and device handle of `device`.
fn raw<T>(
    device: &nvml_wrapper::Device<'_>,
    f: impl FnOnce(&NvmlLib, nvmlDevice_t) -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    // SAFETY: the handle stays valid while `device` (and so NVML) lives.
    f(device.nvml().lib(), unsafe { device.handle() })
}

/// The percentages of [`METRICS`] between the two samples of `measurement`, in
/// that order; `None` for a metric NVML does not give (not supported quietly,
/// other errors counted). `None` in all when the call failed.
fn metrics_get(
    reader: &mut DeviceReader<'_>,
    measurement: &Measurement<'_>,
) -> Option<Vec<Option<f64>>> {
    let (first, second) = (measurement.first.handle, measurement.second.handle);
    let request = reader.read_raw("nvmlGpmMetricsGet", |lib, _| {
        let get = nvml_sym(lib.nvmlGpmMetricsGet.as_ref())?;
        // SAFETY: nvmlGpmMetricsGet_t is plain data; zero is a valid value.
        let mut request: Box<nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
        request.version = NVML_GPM_METRICS_GET_VERSION;
        request.numMetrics = METRICS.len() as c_uint;
        request.sample1 = first;
        request.sample2 = second;
        for (slot, (id, ..)) in request.metrics.iter_mut().zip(METRICS) {
            slot.metricId = *id;
        }
        // SAFETY: a versioned request holding two samples of the same target.
        nvml_try(unsafe { get(&mut *request) })?;
        Ok(request)
    })?;
    let mut values = Vec::with_capacity(METRICS.len());
    for metric in &request.metrics[..METRICS.len()] {
        values.push(match nvml_try(metric.nvmlReturn) {
            Ok(()) => Some(metric.value),
            Err(error) => {
                reader.note("nvmlGpmMetricsGet", &error);
                None
            }
        });
    }
    Some(values)
}

/// Leaves the GPU's GPM metrics out of this run for `why`.
fn unavailable(reader: &mut DeviceReader<'_>, why: Unavailable) {
    reader.push(MetricSample::new(&metrics::GPM_UNAVAILABLE, 1.0).with("reason", why.label()));
    reader.remember(MEMORY_KEY, why.label().to_owned());
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings as sys;

    #[test]
    fn metric_ids_are_nvmls() {
        let ids: Vec<c_uint> = METRICS.iter().map(|m| m.0).collect();
        assert_eq!(
            ids,
            [
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_IMMA_TENSOR_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_DFMA_TENSOR_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL,
                sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_INTEGER_UTIL,
            ]
        );
    }

    #[test]
    fn reasons_round_trip_and_errors_classify() {
        for why in Unavailable::ALL {
            assert_eq!(Unavailable::from_label(why.label()), Some(why));
        }
        assert_eq!(
            Unavailable::from_error(&NvmlError::NoPermission),
            Some(Unavailable::NoPermission)
        );
        assert_eq!(
            Unavailable::from_error(&NvmlError::InUse),
            Some(Unavailable::CountersInUse)
        );
        assert_eq!(Unavailable::from_error(&NvmlError::Unknown), None);
        assert_eq!(Unavailable::from_error(&NvmlError::NotSupported), None);
    }
}
