//! Video encoder and decoder: utilization from NVML's sample buffers (see
//! `window`), sessions.

use super::reader::DeviceReader;
use super::utilization::percent_to_ratio;
use super::window::{self, Engine, Outcome};
use crate::metrics;

const MICROSECONDS_PER_SECOND: f64 = 1e6;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    // Where NVML keeps no samples, the point reading of its last sample period.
    if let Outcome::Unsupported = window::read(reader, Engine::Encoder) {
        if let Some(info) = reader.read("nvmlDeviceGetEncoderUtilization", |d| {
            d.encoder_utilization()
        }) {
            point(reader, Engine::Encoder, info.utilization);
        }
    }
    if let Outcome::Unsupported = window::read(reader, Engine::Decoder) {
        if let Some(info) = reader.read("nvmlDeviceGetDecoderUtilization", |d| {
            d.decoder_utilization()
        }) {
            point(reader, Engine::Decoder, info.utilization);
        }
    }
    if let Some(stats) = reader.read("nvmlDeviceGetEncoderStats", |d| d.encoder_stats()) {
        reader.gauge(&metrics::ENCODER_SESSIONS, f64::from(stats.session_count));
        reader.gauge(&metrics::ENCODER_FPS, f64::from(stats.average_fps));
        reader.gauge(
            &metrics::ENCODER_LATENCY,
            f64::from(stats.average_latency) / MICROSECONDS_PER_SECOND,
        );
    }
}

fn point(reader: &mut DeviceReader<'_>, engine: Engine, percent: u32) {
    match percent_to_ratio(percent) {
        Some(ratio) => reader.gauge(engine.family(), ratio),
        None => reader.reject(engine.family(), f64::from(percent)),
    }
}
