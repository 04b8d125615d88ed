//! Utilization of the GPU and its memory, and the count of compute processes.

use nvml::calls;
use nvml::types::Sampling;

use crate::collector::{
    point, read_engine, read_engines_early, Collector, Engine, Gpu, Hooks, BUSY, SAMPLED,
};
use crate::metrics::families;
use crate::state::schema::Stream;

families! {
    FAMILIES [BUSY, SAMPLED];
    UTILIZATION: Gauge(Ratio), "nvidia_gpu_utilization_ratio", [],
        "Mean fraction of time a kernel ran on the GPU, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples (MIG mode), the point reading of its last sample period.";
    MEMORY_UTILIZATION: Gauge(Ratio), "nvidia_gpu_memory_utilization_ratio", [],
        "Mean fraction of time device memory was read or written, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples (MIG mode), the point reading of its last sample period.";
    PROCESSES: Gauge(Number), "nvidia_gpu_processes", [],
        "Compute processes running on the GPU.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "utilization",
    default: true,
    help: "GPU and memory utilization over the samples since the previous run, busy and sampled time, count of compute processes.",
    families: FAMILIES,
    hooks: Hooks::read(read, &[]).with_early(early),
};

const GPU: Engine = Engine {
    label: "gpu",
    ratio: UTILIZATION,
    sampling: Sampling::GpuUtilization,
    stream: Stream::Gpu,
};
const MEMORY: Engine = Engine {
    label: "memory",
    ratio: MEMORY_UTILIZATION,
    sampling: Sampling::MemoryUtilization,
    stream: Stream::Memory,
};

fn early(gpu: &mut Gpu<'_>) {
    read_engines_early(gpu, &[GPU, MEMORY]);
}

fn read(gpu: &mut Gpu<'_>) {
    let gpu_sampled = read_engine(gpu, GPU);
    let memory_sampled = read_engine(gpu, MEMORY);
    // No samples in MIG mode; the HELP says so.
    if !gpu_sampled || !memory_sampled {
        log::debug!(
            "GPU {}: no utilization samples; using nvmlDeviceGetUtilizationRates",
            gpu.index()
        );
        if let Some(rates) = gpu.nvml.read(calls::UTILIZATION_RATES, ()) {
            if !gpu_sampled {
                point(gpu, GPU, rates.gpu);
            }
            if !memory_sampled {
                point(gpu, MEMORY, rates.memory);
            }
        }
    }
    let processes = gpu.nvml.compute_processes();
    gpu.gauge(PROCESSES, processes.map(|processes| processes.len() as f64));
}
