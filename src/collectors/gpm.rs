//! GPM: activity from two samples of the GPU's performance counters a window
//! apart (docs/design.md, "GPM"); a GPU in MIG mode is also sampled per GPU
//! instance.

use std::time::Instant;

use nvml::types::{GpmMetricId, GpmSample};
use nvml::{calls, mig, Code};
use serde::{Deserialize, Serialize};

use crate::collector::{Collector, Gpu, Hooks, Settings, Window};
use crate::metrics::{self, families, Labelled};
use crate::snapshot::Sample as MetricSample;
use crate::state::schema::Part;
use crate::timing::{AFTER_WINDOW, MIN_WINDOW};

families! {
    FAMILIES;
    SM_ACTIVE: Gauge(Ratio), "nvidia_gpu_sm_active_ratio", [],
        "Fraction of the GPM window during which an SM had at least one warp resident, averaged over all SMs (0-1).";
    SM_OCCUPANCY: Gauge(Ratio), "nvidia_gpu_sm_occupancy_ratio", [],
        "Warps resident on the SMs as a fraction of the most they can hold, averaged over the GPM window (0-1).";
    GRAPHICS_ENGINE_ACTIVE: Gauge(Ratio), "nvidia_gpu_graphics_engine_active_ratio", [],
        "Fraction of the GPM window during which the graphics or compute engine was busy (0-1).";
    DRAM_ACTIVE: Gauge(Ratio), "nvidia_gpu_dram_active_ratio", [],
        "Device memory bandwidth used as a fraction of its peak, over the GPM window (0-1).";
    PIPE_ACTIVE: Gauge(Ratio), "nvidia_gpu_pipe_active_ratio", ["pipe"],
        "Fraction of the GPM window during which a pipe was active, by pipe (tensor: any tensor pipe; tensor_hmma, tensor_imma, tensor_dfma, fp64, fp32, fp16, integer) (0-1).";
    GPM_WINDOW: Gauge(Seconds), "nvidia_gpu_gpm_window_seconds", [],
        "Time between the two GPM samples the GPM metrics of this GPU were computed from.";
    GPM_UNAVAILABLE: Gauge(Number), "nvidia_gpu_gpm_unavailable", ["reason"],
        "1 with the reason the GPM metrics of a GPU that supports GPM are missing from this run (no_permission, counters_in_use, paused, window_too_short); absent when they were read.";
    MIG_SM_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_sm_active_ratio", ["gpu_instance_id"],
        "nvidia_gpu_sm_active_ratio of one MIG GPU instance, over its SMs (0-1).";
    MIG_SM_OCCUPANCY: Gauge(Ratio), "nvidia_gpu_mig_sm_occupancy_ratio", ["gpu_instance_id"],
        "nvidia_gpu_sm_occupancy_ratio of one MIG GPU instance (0-1).";
    MIG_GRAPHICS_ENGINE_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_graphics_engine_active_ratio", ["gpu_instance_id"],
        "nvidia_gpu_graphics_engine_active_ratio of one MIG GPU instance (0-1).";
    MIG_DRAM_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_dram_active_ratio", ["gpu_instance_id"],
        "nvidia_gpu_dram_active_ratio of one MIG GPU instance (0-1).";
    MIG_PIPE_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_pipe_active_ratio", ["gpu_instance_id", "pipe"],
        "nvidia_gpu_pipe_active_ratio of one MIG GPU instance, by pipe (0-1).";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "gpm",
    default: true,
    help: "SM activity and occupancy, tensor and other pipes, DRAM bandwidth over --gpm-window (GPM, Hopper and newer).",
    families: FAMILIES,
    hooks: Hooks {
        open: Some(open),
        ..Hooks::NONE
    },
};

// `ALL` is the test's.
#[allow(dead_code)]
mod unavailable {
    crate::reason::constants! {
        /// Why the GPM metrics of a GPU that supports GPM are missing.
        pub enum Unavailable {
            fn label;
            fn hint;
        }
        NoPermission => ("no_permission",
            "the driver keeps the performance counters from processes without \
             CAP_SYS_ADMIN (NVreg_RestrictProfilingToAdminUsers=1, its default); \
             set that option to 0, or grant the unit the capability (README, GPM), \
             or turn GPM off with --no-collector gpm");
        CountersInUse => ("counters_in_use",
            "another tool holds the performance counters (Nsight Compute, DCGM \
             profiling); GPM metrics return when it releases them");
        Paused => ("paused", "the GPM pause file exists (--gpm-pause-file); remove it to resume");
        /// The time left is shorter than [`crate::timing::MIN_WINDOW`] (which reads zeros).
        WindowTooShort => ("window_too_short",
            "--timeout leaves the window less than 100ms once NVML has started and \
             the reads have their time; lengthen --timeout, or turn GPM off with \
             --gpm-window 0");
    }
}
pub use unavailable::Unavailable;

impl Unavailable {
    fn from_code(code: Code) -> Option<Self> {
        match code {
            Code::NoPermission => Some(Unavailable::NoPermission),
            Code::InUse => Some(Unavailable::CountersInUse),
            _ => None,
        }
    }
}

const METRICS: [(GpmMetricId, Report); 12] = {
    use GpmMetricId::*;
    use Report::{Engine, Pipe};
    [
        (
            GraphicsUtil,
            Engine(GRAPHICS_ENGINE_ACTIVE, MIG_GRAPHICS_ENGINE_ACTIVE),
        ),
        (SmUtil, Engine(SM_ACTIVE, MIG_SM_ACTIVE)),
        (SmOccupancy, Engine(SM_OCCUPANCY, MIG_SM_OCCUPANCY)),
        (DramBwUtil, Engine(DRAM_ACTIVE, MIG_DRAM_ACTIVE)),
        (AnyTensorUtil, Pipe("tensor")),
        (HmmaTensorUtil, Pipe("tensor_hmma")),
        (ImmaTensorUtil, Pipe("tensor_imma")),
        (DfmaTensorUtil, Pipe("tensor_dfma")),
        (Fp64Util, Pipe("fp64")),
        (Fp32Util, Pipe("fp32")),
        (Fp16Util, Pipe("fp16")),
        (IntegerUtil, Pipe("integer")),
    ]
};

#[derive(Debug, Clone, Copy)]
enum Report {
    /// The whole GPU's family, and the GPU instances' one.
    Engine(Labelled<0>, Labelled<1>),
    /// As this `pipe` of `nvidia_gpu_pipe_active_ratio` (or of its MIG twin).
    Pipe(&'static str),
}

impl Report {
    fn sample(self, gi: Option<u32>, ratio: f64) -> MetricSample {
        match (self, gi) {
            (Report::Engine(gpu, _), None) => gpu.sample(ratio),
            (Report::Engine(_, mig), Some(gi)) => mig.sample_with([gi.to_string()], ratio),
            (Report::Pipe(pipe), None) => PIPE_ACTIVE.sample_with([pipe], ratio),
            (Report::Pipe(pipe), Some(gi)) => {
                MIG_PIPE_ACTIVE.sample_with([gi.to_string(), pipe.to_owned()], ratio)
            }
        }
    }
}

/// The most GPU instances one GPU has (7 on H100/H200).
const MAX_GPU_INSTANCES: usize = 8;

/// A sample of the GPU (`None`) or of a GPU instance, taken at the midpoint
/// of its call.
type Taken<'n> = (Option<u32>, Instant, GpmSample<'n>);

struct GpuWindow<'n> {
    firsts: Vec<Taken<'n>>,
    ends: Instant,
}

fn open<'n>(gpu: &mut Gpu<'n>, settings: &Settings) -> Option<Box<dyn Window<'n> + 'n>> {
    // Nothing unavailable unless this run says so.
    gpu.next_state().set_part(&Said(None));
    if settings.gpm_window.is_zero() || !gpu.nvml.read(calls::GPM_SUPPORT, ())? {
        return None;
    }
    if settings.gpm_paused {
        unavailable(gpu, Unavailable::Paused);
        return None;
    }
    let latest = settings.budget.gpus_end.checked_sub(AFTER_WINDOW);
    let Some(latest) =
        latest.filter(|latest| latest.saturating_duration_since(Instant::now()) >= MIN_WINDOW)
    else {
        unavailable(gpu, Unavailable::WindowTooShort);
        return None;
    };
    let mut targets = vec![None];
    for device in mig::devices(&mut gpu.nvml) {
        let gi = Some(device.gpu_instance_id);
        if !targets.contains(&gi) && targets.len() <= MAX_GPU_INSTANCES {
            targets.push(gi);
        }
    }
    let firsts = take_each(gpu, targets)?;
    let ends = latest.min(firsts.first()?.1 + settings.gpm_window);
    Some(Box::new(GpuWindow { firsts, ends }))
}

impl<'n> Window<'n> for GpuWindow<'n> {
    fn ends(&self) -> Instant {
        self.ends
    }

    fn end_by(&mut self, latest: Instant) {
        self.ends = self.ends.min(latest);
    }

    fn close(self: Box<Self>, gpu: &mut Gpu<'n>) {
        std::thread::sleep(self.ends.saturating_duration_since(Instant::now()));
        let Some(seconds) = take_each(gpu, self.firsts.iter().map(|first| first.0)) else {
            return;
        };
        let ids = METRICS.map(|(id, _)| id);
        let mut window_seconds = None;
        for (target, second_at, second) in seconds {
            let Some((_, first_at, first)) = self.firsts.iter().find(|first| first.0 == target)
            else {
                continue;
            };
            // A window cut short reads zeros: better nothing than a false idle.
            if second_at - *first_at < MIN_WINDOW {
                return unavailable(gpu, Unavailable::WindowTooShort);
            }
            let samples = (first, &second, &ids[..]);
            let Some(values) = gpu.nvml.read_each(calls::GPM_METRICS, samples) else {
                continue;
            };
            let mut any = false;
            for ((_, report), value) in METRICS.iter().zip(values) {
                let Some(percent) = value else { continue };
                any |= gpu.push_read(report.sample(target, metrics::ratio(percent)), percent);
            }
            if any && window_seconds.is_none() {
                window_seconds = Some((second_at - *first_at).as_secs_f64());
            }
        }
        gpu.gauge(GPM_WINDOW, window_seconds);
    }
}

/// A sample of each target but those not supported, failed (counted) or of
/// a GPU down; `None` once GPM is unavailable (said).
fn take_each<'n>(
    gpu: &mut Gpu<'n>,
    targets: impl IntoIterator<Item = Option<u32>>,
) -> Option<Vec<Taken<'n>>> {
    let expected = |error: &nvml::Error| Unavailable::from_code(error.code()).is_some();
    let mut taken = Vec::new();
    for target in targets {
        let (before, nvml) = (Instant::now(), &mut gpu.nvml);
        let read = match target {
            None => nvml.read_expecting(calls::GPM_SAMPLE, (), expected),
            Some(gi) => nvml.read_expecting(calls::GPM_MIG_SAMPLE, gi, expected),
        };
        let at = before + before.elapsed() / 2;
        match read {
            Some(Ok(sample)) => taken.push((target, at, sample)),
            Some(Err(error)) => {
                if let Some(why) = Unavailable::from_code(error.code()) {
                    unavailable(gpu, why);
                    return None;
                }
            }
            None => {}
        }
    }
    Some(taken)
}

/// Why GPM was unavailable in the previous run, its label: said once.
#[derive(Serialize, Deserialize)]
struct Said(Option<String>);

impl Part for Said {
    const NAME: &'static str = "gpm.unavailable";
}

/// Logged when the reason is new.
fn unavailable(gpu: &mut Gpu<'_>, why: Unavailable) {
    let Said(said) = gpu.previous_state().part().unwrap_or(Said(None));
    if said.as_deref() != Some(why.label()) {
        let level = if why == Unavailable::Paused {
            log::Level::Info
        } else {
            log::Level::Warn
        };
        let (index, label, hint) = (gpu.index(), why.label(), why.hint());
        log::log!(level, "GPU {index}: GPM metrics ({label}) left out: {hint}");
    }
    gpu.push(GPM_UNAVAILABLE.sample_with([why.label()], 1.0));
    gpu.next_state()
        .set_part(&Said(Some(why.label().to_owned())));
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Unavailable::from_code(Code::NoPermission),
            Some(Unavailable::NoPermission)
        );
        assert_eq!(
            Unavailable::from_code(Code::InUse),
            Some(Unavailable::CountersInUse)
        );
        assert_eq!(Unavailable::from_code(Code::Other), None);
        assert_eq!(Unavailable::from_code(Code::NotSupported), None);
    }
}
