//! Video encoder (where the chip has one), decoder, JPEG and optical flow
//! utilization, and encoder sessions.

use nvml::calls;
use nvml::types::Sampling;

use crate::collector::{
    point, read_engine, read_engines_early, Collector, Engine, Gpu, Hooks, BUSY, SAMPLED,
};
use crate::metrics::{self, families};
use crate::state::schema::Stream;

families! {
    FAMILIES [BUSY, SAMPLED];
    ENCODER_UTILIZATION: Gauge(Ratio), "nvidia_gpu_encoder_utilization_ratio", [],
        "Mean fraction of time the video encoder was busy, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples, the point reading of its last sample period.";
    DECODER_UTILIZATION: Gauge(Ratio), "nvidia_gpu_decoder_utilization_ratio", [],
        "Mean fraction of time the video decoder was busy, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples, the point reading of its last sample period.";
    ENCODER_SESSIONS: Gauge(Number), "nvidia_gpu_encoder_sessions", [],
        "Active video encoder sessions.";
    ENCODER_FPS: Gauge(Number), "nvidia_gpu_encoder_average_fps", [],
        "Average frames per second over the active encoder sessions.";
    ENCODER_LATENCY: Gauge(Seconds), "nvidia_gpu_encoder_average_latency_seconds", [],
        "Average encode latency over the active encoder sessions.";
    JPEG_UTILIZATION: Gauge(Ratio), "nvidia_gpu_jpeg_utilization_ratio", [],
        "Fraction of the last sample period during which the JPEG decoders (NVJPG) were busy (0-1).";
    OFA_UTILIZATION: Gauge(Ratio), "nvidia_gpu_ofa_utilization_ratio", [],
        "Fraction of the last sample period during which the optical flow accelerator (OFA) was busy (0-1).";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "media",
    default: true,
    help: "Video encoder/decoder utilization over the samples since the previous run, their busy and sampled time, JPEG and OFA utilization, encoder sessions.",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]).with_early(early),
};

const ENCODER: Engine = Engine {
    label: "encoder",
    ratio: ENCODER_UTILIZATION,
    sampling: Sampling::EncoderUtilization,
    stream: Stream::Encoder,
};
const DECODER: Engine = Engine {
    label: "decoder",
    ratio: DECODER_UTILIZATION,
    sampling: Sampling::DecoderUtilization,
    stream: Stream::Decoder,
};

const MICROSECONDS_PER_SECOND: f64 = 1e6;

fn early(gpu: &mut Gpu<'_>) {
    if gpu.facts().has_video_encoder() {
        read_engines_early(gpu, &[ENCODER]);
    }
    read_engines_early(gpu, &[DECODER]);
}

fn read(gpu: &mut Gpu<'_>) {
    if gpu.facts().has_video_encoder() {
        read_encoder(gpu);
    } else {
        log::debug!(
            "GPU {}: no video encoder on this chip ({:?}); encoder families left out",
            gpu.index(),
            gpu.facts().chip()
        );
    }
    if !read_engine(gpu, DECODER) {
        if let Some(info) = gpu.nvml.read(calls::DECODER_UTILIZATION, ()) {
            point(gpu, DECODER, info.utilization);
        }
    }
    read_accelerators(gpu);
}

fn read_encoder(gpu: &mut Gpu<'_>) {
    if !read_engine(gpu, ENCODER) {
        if let Some(info) = gpu.nvml.read(calls::ENCODER_UTILIZATION, ()) {
            point(gpu, ENCODER, info.utilization);
        }
    }
    if let Some(stats) = gpu.nvml.read(calls::ENCODER_STATS, ()) {
        gpu.gauge(ENCODER_SESSIONS, f64::from(stats.session_count));
        gpu.gauge(ENCODER_FPS, f64::from(stats.average_fps));
        let latency = f64::from(stats.average_latency) / MICROSECONDS_PER_SECOND;
        gpu.gauge(ENCODER_LATENCY, latency);
    }
}

fn read_accelerators(gpu: &mut Gpu<'_>) {
    let jpeg = gpu.nvml.read(calls::JPEG_UTILIZATION, ());
    let ofa = gpu.nvml.read(calls::OFA_UTILIZATION, ());
    for (percent, family) in [(jpeg, JPEG_UTILIZATION), (ofa, OFA_UTILIZATION)] {
        if let Some(percent) = percent.map(f64::from) {
            gpu.push_read(family.sample(metrics::ratio(percent)), percent);
        }
    }
}
