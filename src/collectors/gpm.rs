//! GPM (GPU Performance Monitoring, Hopper and newer): SM activity and
//! occupancy, graphics engine, DRAM bandwidth and per-pipe activity, computed by
//! NVML from two samples of the GPU's performance counters taken a window apart.
//!
//! The window is the run's: [`open`] takes the first sample right after the
//! GPU's identity, the other collectors read the GPU at the window's end (see
//! `gpus`), and [`GpuWindow::close`] sleeps what is left of `--gpm-window`
//! (shortened where the reads, and the close itself, need the time:
//! `timing::schedule`, which learns how long the close took from the state),
//! takes the second sample and asks `nvmlGpmMetricsGet` for the metrics. So a
//! run lasts about NVML init + the window, and what it publishes is as fresh as
//! the window's end.
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
//!   exists). The reason is kept in the state so that the log says it once when it
//!   starts, not every run.
//! - MIG: on a GPU in MIG mode, each GPU instance is sampled with
//!   `nvmlGpmMigSampleGet` and reported with its `gpu_instance_id`.

use std::ffi::c_uint;
use std::time::Instant;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpmSupport_t, NvmlLib,
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION,
};

use super::hooks::{Settings, Window};
use crate::metrics::{self, Labelled};
use crate::nvml::mig;
use crate::nvml::reader::DeviceReader;
use crate::snapshot::Sample as MetricSample;
use crate::timing::{AFTER_WINDOW, MIN_WINDOW};

/// Why the GPM metrics of a GPU that supports GPM are missing from a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    NoPermission,
    CountersInUse,
    Paused,
    /// What `--timeout` leaves after NVML started, less the reads' time, is
    /// shorter than [`MIN_WINDOW`] (a window that short reads zeros).
    WindowTooShort,
}

impl Unavailable {
    /// The `reason` label of `nvidia_gpu_gpm_unavailable`.
    pub fn label(self) -> &'static str {
        match self {
            Unavailable::NoPermission => "no_permission",
            Unavailable::CountersInUse => "counters_in_use",
            Unavailable::Paused => "paused",
            Unavailable::WindowTooShort => "window_too_short",
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
            Unavailable::WindowTooShort => {
                "--timeout leaves the window less than 100ms once NVML has started and \
                 the reads have their time; lengthen --timeout, or turn GPM off with \
                 --gpm-window 0"
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
}

/// What GPM measures, by NVML metric id (`nvmlGpmMetricId_t`, nvml.h), and
/// how it is reported.
const METRICS: &[(c_uint, Report)] = &[
    (
        1,
        Report::Engine(
            metrics::GRAPHICS_ENGINE_ACTIVE,
            metrics::MIG_GRAPHICS_ENGINE_ACTIVE,
        ),
    ), // GRAPHICS_UTIL
    (
        2,
        Report::Engine(metrics::SM_ACTIVE, metrics::MIG_SM_ACTIVE),
    ), // SM_UTIL
    (
        3,
        Report::Engine(metrics::SM_OCCUPANCY, metrics::MIG_SM_OCCUPANCY),
    ), // SM_OCCUPANCY
    (
        10,
        Report::Engine(metrics::DRAM_ACTIVE, metrics::MIG_DRAM_ACTIVE),
    ), // DRAM_BW_UTIL
    (5, Report::Pipe("tensor")),      // ANY_TENSOR_UTIL
    (7, Report::Pipe("tensor_hmma")), // HMMA_TENSOR_UTIL
    (9, Report::Pipe("tensor_imma")), // IMMA_TENSOR_UTIL
    (6, Report::Pipe("tensor_dfma")), // DFMA_TENSOR_UTIL
    (11, Report::Pipe("fp64")),       // FP64_UTIL
    (12, Report::Pipe("fp32")),       // FP32_UTIL
    (13, Report::Pipe("fp16")),       // FP16_UTIL
    (4, Report::Pipe("integer")),     // INTEGER_UTIL
];

/// How one GPM metric is reported.
#[derive(Debug, Clone, Copy)]
enum Report {
    /// In a family of its own: the one of the whole GPU, and the one of a MIG
    /// GPU instance (labelled with its `gpu_instance_id`).
    Engine(Labelled<0>, Labelled<1>),
    /// As this `pipe` of `nvidia_gpu_pipe_active_ratio` (or of its MIG twin).
    Pipe(&'static str),
}

impl Report {
    /// The sample of `ratio` measured on `target`.
    fn sample(self, target: Target, ratio: f64) -> MetricSample {
        match (self, target) {
            (Report::Engine(gpu, _), Target::Gpu) => gpu.sample(ratio),
            (Report::Engine(_, mig), Target::Instance(gi)) => {
                mig.sample_with([gi.to_string()], ratio)
            }
            (Report::Pipe(pipe), Target::Gpu) => metrics::PIPE_ACTIVE.sample_with([pipe], ratio),
            (Report::Pipe(pipe), Target::Instance(gi)) => {
                metrics::MIG_PIPE_ACTIVE.sample_with([gi.to_string(), pipe.to_owned()], ratio)
            }
        }
    }
}

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

/// A GPU's open GPM window, from [`open`] to its close.
struct GpuWindow<'n> {
    measurements: Vec<Measurement<'n>>,
    /// When the second samples are due.
    ends: Instant,
}

/// Opens the GPM window of a GPU: checks support, allocates the samples and
/// takes the first ones. Nothing is opened when GPM is off, unsupported,
/// paused or refused.
pub(super) fn open<'n>(
    reader: &mut DeviceReader<'n>,
    settings: &Settings,
) -> Option<Box<dyn Window<'n> + 'n>> {
    if settings.gpm_window.is_zero() || !supported(reader) {
        return None;
    }
    if settings.gpm_paused {
        unavailable(reader, Unavailable::Paused);
        return None;
    }
    // The window must end by the time its second sample needs; what is left
    // of that once NVML has started may be too short to read anything but
    // zeros (a slow start, a short --timeout).
    let latest = settings.reading_ends.checked_sub(AFTER_WINDOW);
    if latest.is_none_or(|latest| latest.saturating_duration_since(Instant::now()) < MIN_WINDOW) {
        unavailable(reader, Unavailable::WindowTooShort);
        return None;
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
                return None;
            }
            Taken::Down => return None,
        }
    }
    let first = measurements.first()?;
    let ends = match latest {
        Some(latest) => latest.min(first.first_at + settings.gpm_window),
        None => first.first_at + settings.gpm_window,
    };
    Some(Box::new(GpuWindow { measurements, ends }))
}

impl<'n> Window<'n> for GpuWindow<'n> {
    fn ends(&self) -> Instant {
        self.ends
    }

    fn end_by(&mut self, latest: Instant) {
        self.ends = self.ends.min(latest);
    }

    fn close(self: Box<Self>, reader: &mut DeviceReader<'n>) {
        close(*self, reader);
    }
}

/// Takes the second samples when the window ends and exports the metrics.
fn close(window: GpuWindow<'_>, reader: &mut DeviceReader<'_>) {
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
        // A window cut short by the deadline (the first samples came late)
        // reads zeros, not the GPU's activity: nothing is better than a false
        // idle, and the file says why.
        if second_at - measurement.first_at < MIN_WINDOW {
            return unavailable(reader, Unavailable::WindowTooShort);
        }
        let Some(values) = metrics_get(reader, measurement) else {
            continue;
        };
        let mut any = false;
        for ((id, report), value) in METRICS.iter().zip(values) {
            let Some(percent) = value else { continue };
            let sample = report.sample(measurement.target, percent / 100.0);
            if !(0.0..=100.0).contains(&percent) {
                log::debug!("GPM metric {id}: {percent}");
                reader.reject(sample.family, percent);
                continue;
            }
            reader.push(sample);
            any = true;
        }
        if any && window_seconds.is_none() {
            window_seconds = Some((second_at - measurement.first_at).as_secs_f64());
        }
    }
    if let Some(seconds) = window_seconds {
        reader.gauge(metrics::GPM_WINDOW, seconds);
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
    let mut ids = Vec::new();
    for device in mig::devices(reader) {
        if !ids.contains(&device.gpu_instance_id) && ids.len() < MAX_GPU_INSTANCES {
            ids.push(device.gpu_instance_id);
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

/// Leaves the GPU's GPM metrics out of this run for `why`, logged when the
/// reason is new (the previous run had none, or another), not every run.
fn unavailable(reader: &mut DeviceReader<'_>, why: Unavailable) {
    if reader.previous_state().gpm_unavailable.as_deref() != Some(why.label()) {
        let message = format!(
            "GPU {}: GPM metrics ({}) left out: {}",
            reader.index(),
            why.label(),
            why.hint()
        );
        if why == Unavailable::Paused {
            log::info!("{message}");
        } else {
            log::warn!("{message}");
        }
    }
    reader.push(metrics::GPM_UNAVAILABLE.sample_with([why.label()], 1.0));
    reader.next_state().gpm_unavailable = Some(why.label().to_owned());
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
        let all = [
            Unavailable::NoPermission,
            Unavailable::CountersInUse,
            Unavailable::Paused,
            Unavailable::WindowTooShort,
        ];
        let labels: Vec<&str> = all.iter().map(|u| u.label()).collect();
        assert_eq!(
            labels,
            [
                "no_permission",
                "counters_in_use",
                "paused",
                "window_too_short"
            ]
        );
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
