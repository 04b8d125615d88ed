//! Video encoder and decoder.

use super::reader::DeviceReader;
use super::utilization::percent_to_ratio;
use crate::metrics;

const MICROSECONDS_PER_SECOND: f64 = 1e6;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let encoder = reader.read("nvmlDeviceGetEncoderUtilization", |d| {
        d.encoder_utilization()
    });
    let decoder = reader.read("nvmlDeviceGetDecoderUtilization", |d| {
        d.decoder_utilization()
    });
    for (info, family) in [
        (encoder, &metrics::ENCODER_UTILIZATION),
        (decoder, &metrics::DECODER_UTILIZATION),
    ] {
        let Some(info) = info else { continue };
        match percent_to_ratio(info.utilization) {
            Some(ratio) => reader.gauge(family, ratio),
            None => reader.reject(family, f64::from(info.utilization)),
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
