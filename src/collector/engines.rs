//! The sampled engines `utilization` and `media` share: each engine's ratio
//! and its busy and sampled totals, integrated from NVML's sample buffers.

use nvml::types::Sampling;

use crate::metrics::{self, families, Labelled};
use crate::samples::{self, Carry};
use crate::state::schema::Stream;

use super::gpu::Gpu;

families! {
    // Emitted by utilization and media, each with its own `engine` values.
    SHARED;
    BUSY: Counter(Seconds), "nvidia_gpu_busy_seconds_total", ["engine"],
        "Time the engine (gpu, memory, encoder, decoder) was busy, integrated from NVML's utilization samples: all of it while they cover wall time, else the sampled part (see nvidia_gpu_sampled_seconds_total); rate(busy)/rate(nvidia_gpu_sampled_seconds_total) is its exact mean utilization.";
    SAMPLED: Counter(Seconds), "nvidia_gpu_sampled_seconds_total", ["engine"],
        "Time covered by the NVML samples integrated into nvidia_gpu_busy_seconds_total, by engine; grows with wall time where runs read the buffers at both ends of a GPM window, slower where samples were missed (no GPM window and a timer period longer than NVML's buffer, missed runs).";
}

/// One NVML sampling engine, and the stream whose carry the state keeps.
#[derive(Clone, Copy)]
pub struct Engine {
    pub label: &'static str,
    pub ratio: Labelled<0>,
    pub sampling: Sampling,
    pub stream: Stream,
}

/// Pushes the ratio (if any sample is new) and the busy and sampled totals.
/// False where NVML keeps no samples: the caller falls back to [`point`].
pub fn read_engine(gpu: &mut Gpu<'_>, engine: Engine) -> bool {
    let previous = gpu.previous_carry(engine.stream);
    let Some((carry, integrated)) =
        samples::read(&mut gpu.nvml, &mut gpu.fetched, engine.sampling, previous)
    else {
        return false;
    };
    if let Some(integrated) = integrated {
        for value in integrated.rejected {
            gpu.reject(engine.ratio.family(), metrics::ratio(value as f64));
        }
        gpu.gauge(engine.ratio, integrated.ratio);
    }
    if !gpu.keeps_totals() {
        return true;
    }
    if carry != Carry::default() {
        gpu.next_state().carries.insert(engine.stream, carry);
    }
    gpu.push(BUSY.sample_with([engine.label], carry.busy_seconds()));
    gpu.push(SAMPLED.sample_with([engine.label], carry.sampled_seconds()));
    true
}

/// Reads the engines' sample buffers as the windows open (see `Hooks::early`).
pub fn read_engines_early(gpu: &mut Gpu<'_>, engines: &[Engine]) {
    for engine in engines {
        gpu.fetched.early(&mut gpu.nvml, engine.sampling);
    }
}

/// A point reading, in percent of NVML's sample period, as the ratio.
pub fn point(gpu: &mut Gpu<'_>, engine: Engine, percent: u32) {
    let percent = f64::from(percent);
    gpu.push_read(engine.ratio.sample(metrics::ratio(percent)), percent);
}
