//! Video encoder and decoder: utilization from NVML's sample buffers (see
//! `nvml::samples`), sessions; JPEG decoders and optical flow accelerator.
//!
//! A GPU without a video encoder (GA100, GH100: NVDEC but no NVENC) answers
//! the encoder's calls all the same, with an idle encoder and even an H264
//! capacity of 100, and its sample buffer costs about 3 ms cold: the encoder
//! is read only where the chip has one (see [`GpuFacts::has_video_encoder`]).
//!
//! [`GpuFacts::has_video_encoder`]: crate::nvml::facts::GpuFacts::has_video_encoder

use crate::collector::{point, read_engine, Engine, Gpu};
use crate::metrics;
use crate::nvml::unwrapped::Accelerator;

const MICROSECONDS_PER_SECOND: f64 = 1e6;

pub(super) fn read(reader: &mut Gpu<'_>) {
    if reader.facts().has_video_encoder() {
        read_encoder(reader);
    } else {
        log::debug!(
            "GPU {}: no video encoder on this chip ({:?}); encoder families left out",
            reader.index(),
            reader.facts().chip()
        );
    }
    // Where NVML keeps no samples, the point reading of its last sample period.
    if !read_engine(reader, Engine::Decoder) {
        if let Some(info) = reader.read("nvmlDeviceGetDecoderUtilization", |d| {
            d.decoder_utilization()
        }) {
            point(reader, Engine::Decoder, info.utilization);
        }
    }
    read_accelerators(reader);
}

/// The encoder's utilization (samples, else the point reading) and sessions.
fn read_encoder(reader: &mut Gpu<'_>) {
    // Where NVML keeps no samples, the point reading of its last sample period.
    if !read_engine(reader, Engine::Encoder) {
        if let Some(info) = reader.read("nvmlDeviceGetEncoderUtilization", |d| {
            d.encoder_utilization()
        }) {
            point(reader, Engine::Encoder, info.utilization);
        }
    }
    if let Some(stats) = reader.read("nvmlDeviceGetEncoderStats", |d| d.encoder_stats()) {
        reader.gauge(metrics::ENCODER_SESSIONS, f64::from(stats.session_count));
        reader.gauge(metrics::ENCODER_FPS, f64::from(stats.average_fps));
        reader.gauge(
            metrics::ENCODER_LATENCY,
            f64::from(stats.average_latency) / MICROSECONDS_PER_SECOND,
        );
    }
}

/// JPEG decoder (NVJPG) and optical flow accelerator (OFA) utilization, on
/// GPUs that have them (A100, H100/H200 and later; driver 535+): NVML answers
/// each like the decoder, percent over a sampling period (the period is not
/// exported, as for the encoder and decoder).
fn read_accelerators(reader: &mut Gpu<'_>) {
    for (engine, family) in [
        (Accelerator::Jpeg, metrics::JPEG_UTILIZATION),
        (Accelerator::OpticalFlow, metrics::OFA_UTILIZATION),
    ] {
        if let Some(percent) = reader.accelerator_percent(engine).map(f64::from) {
            reader.push_read(family.sample(percent / 100.0), percent);
        }
    }
}
