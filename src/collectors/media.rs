//! Video encoder and decoder utilization (sample buffers, else the point
//! reading) and encoder sessions, where the chip has an encoder
//! (`GpuFacts::has_video_encoder`); JPEG and optical flow utilization.

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
    if !read_engine(reader, Engine::DECODER) {
        if let Some(info) = reader.read("nvmlDeviceGetDecoderUtilization", |d| {
            d.decoder_utilization()
        }) {
            point(reader, Engine::DECODER, info.utilization);
        }
    }
    read_accelerators(reader);
}

/// The encoder's utilization (samples, else the point reading) and sessions.
fn read_encoder(reader: &mut Gpu<'_>) {
    if !read_engine(reader, Engine::ENCODER) {
        if let Some(info) = reader.read("nvmlDeviceGetEncoderUtilization", |d| {
            d.encoder_utilization()
        }) {
            point(reader, Engine::ENCODER, info.utilization);
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

/// JPEG decoder and optical flow accelerator utilization, where the GPU has
/// them.
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
