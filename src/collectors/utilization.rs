//! Utilization ratios of the GPU and its memory, integrated from NVML's sample
//! buffers (`nvml::samples`), their busy and sampled totals, and the count of
//! compute processes. [`Engine`] and [`read_engine`] serve `media` too.

use nvml_wrapper::enum_wrappers::device::Sampling;

use super::hooks::Gpu;
use crate::metrics::{self, Labelled};
use crate::nvml::samples::{self, Carry, Outcome};
use crate::state::schema::Stream;

/// One NVML sampling engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Engine {
    Gpu,
    Memory,
    Encoder,
    Decoder,
}

impl Engine {
    /// The `engine` label value.
    pub fn label(self) -> &'static str {
        match self {
            Engine::Gpu => "gpu",
            Engine::Memory => "memory",
            Engine::Encoder => "encoder",
            Engine::Decoder => "decoder",
        }
    }

    /// The ratio family it feeds.
    pub fn ratio(self) -> Labelled<0> {
        match self {
            Engine::Gpu => metrics::UTILIZATION,
            Engine::Memory => metrics::MEMORY_UTILIZATION,
            Engine::Encoder => metrics::ENCODER_UTILIZATION,
            Engine::Decoder => metrics::DECODER_UTILIZATION,
        }
    }

    /// Its sample buffer.
    pub fn sampling_type(self) -> Sampling {
        match self {
            Engine::Gpu => Sampling::GpuUtilization,
            Engine::Memory => Sampling::MemoryUtilization,
            Engine::Encoder => Sampling::EncoderUtilization,
            Engine::Decoder => Sampling::DecoderUtilization,
        }
    }

    /// The stream whose carry the state keeps for it.
    fn stream(self) -> Stream {
        match self {
            Engine::Gpu => Stream::Gpu,
            Engine::Memory => Stream::Memory,
            Engine::Encoder => Stream::Encoder,
            Engine::Decoder => Stream::Decoder,
        }
    }
}

/// Reads `engine`'s samples since the previous run and pushes its ratio (if
/// any sample is new) and its busy and sampled totals. False where NVML keeps
/// no samples for it: the caller falls back to a point reading.
pub(super) fn read_engine(reader: &mut Gpu<'_>, engine: Engine) -> bool {
    let previous = reader.previous_carry(engine.stream());
    let Outcome::Read { carry, window } = samples::read(reader, engine.sampling_type(), previous)
    else {
        return false;
    };
    if let Some(window) = window {
        for value in window.rejected {
            reader.reject(engine.ratio().family(), value as f64 / 100.0);
        }
        if let Some(ratio) = window.ratio {
            reader.gauge(engine.ratio(), ratio);
        }
    }
    // Totals that cannot continue from run to run are left out, not
    // restarted (see `DeviceReader::keeps_totals`).
    if !reader.keeps_totals() {
        return true;
    }
    if carry != Carry::default() {
        reader.next_state().carries.insert(engine.stream(), carry);
    }
    for (family, value) in [
        (metrics::BUSY, carry.busy_seconds()),
        (metrics::SAMPLED, carry.sampled_seconds()),
    ] {
        reader.push(family.sample_with([engine.label()], value));
    }
    true
}

/// Pushes a point reading in percent of NVML's sample period as `engine`'s
/// ratio (impossible values rejected).
pub(super) fn point(reader: &mut Gpu<'_>, engine: Engine, percent: u32) {
    let percent = f64::from(percent);
    reader.push_read(engine.ratio().sample(percent / 100.0), percent);
}

pub(super) fn read(reader: &mut Gpu<'_>) {
    let gpu = read_engine(reader, Engine::Gpu);
    let memory = read_engine(reader, Engine::Memory);
    // Where NVML keeps no samples (MIG mode), its point reading of the last
    // sample period is all there is; the HELP says so.
    if !gpu || !memory {
        log::debug!(
            "GPU {}: no utilization samples; using nvmlDeviceGetUtilizationRates",
            reader.index()
        );
        if let Some(rates) = reader.read("nvmlDeviceGetUtilizationRates", |d| d.utilization_rates())
        {
            if !gpu {
                point(reader, Engine::Gpu, rates.gpu);
            }
            if !memory {
                point(reader, Engine::Memory, rates.memory);
            }
        }
    }
    if let Some(processes) = reader.compute_processes() {
        reader.gauge(metrics::PROCESSES, processes.len() as f64);
    }
}
