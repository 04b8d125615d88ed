//! Video encoder and decoder: utilization from NVML's sample buffers (see
//! `nvml::samples`), sessions; JPEG decoders and optical flow accelerator.
//!
//! A GPU without a video encoder (GA100, GH100: NVDEC but no NVENC) answers
//! the encoder's calls all the same, with an idle encoder and even an H264
//! capacity of 100, and its sample buffer costs about 3 ms cold: the encoder
//! is read only where the chip has one (see [`GpuFacts::has_video_encoder`]).
//!
//! [`GpuFacts::has_video_encoder`]: crate::nvml::facts::GpuFacts::has_video_encoder

use super::utilization::{point, read_engine, Engine};
use crate::metrics;
use crate::nvml::reader::DeviceReader;

const MICROSECONDS_PER_SECOND: f64 = 1e6;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
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
    engines::read(reader);
}

/// The encoder's utilization (samples, else the point reading) and sessions.
fn read_encoder(reader: &mut DeviceReader<'_>) {
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

/// JPEG decoders and optical flow accelerator (nvml-wrapper wraps neither call).
mod engines {
    use std::ffi::c_uint;

    use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
    use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

    use crate::collectors::utilization::percent_to_ratio;
    use crate::metrics;
    use crate::nvml::reader::DeviceReader;

    /// JPEG decoder (NVJPG) and optical flow accelerator (OFA) utilization, on
    /// GPUs that have them (A100, H100/H200 and later; driver 535+): each a raw
    /// call that NVML answers like the decoder's, percent over a sampling period.
    pub(super) fn read(reader: &mut DeviceReader<'_>) {
        let jpeg = reader.read_raw("nvmlDeviceGetJpgUtilization", |lib, handle| {
            engine_utilization(nvml_sym(lib.nvmlDeviceGetJpgUtilization.as_ref())?, handle)
        });
        let ofa = reader.read_raw("nvmlDeviceGetOfaUtilization", |lib, handle| {
            engine_utilization(nvml_sym(lib.nvmlDeviceGetOfaUtilization.as_ref())?, handle)
        });
        for (percent, family) in [
            (jpeg, metrics::JPEG_UTILIZATION),
            (ofa, metrics::OFA_UTILIZATION),
        ] {
            let Some(percent) = percent else { continue };
            match percent_to_ratio(percent) {
                Some(ratio) => reader.gauge(family, ratio),
                None => reader.reject(family.family(), f64::from(percent)),
            }
        }
    }

    /// The signature of `nvmlDeviceGetJpgUtilization` and `…OfaUtilization`.
    type EngineUtilizationGetter =
        unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut c_uint) -> nvmlReturn_t;

    /// Percent busy over the engine's last sampling period (the period is not
    /// exported, as for the encoder and decoder).
    fn engine_utilization(
        get: &EngineUtilizationGetter,
        handle: nvmlDevice_t,
    ) -> Result<u32, NvmlError> {
        let (mut percent, mut period_us): (c_uint, c_uint) = (0, 0);
        // SAFETY: two valid out-pointers.
        nvml_try(unsafe { get(handle, &mut percent, &mut period_us) })?;
        Ok(percent)
    }
}
