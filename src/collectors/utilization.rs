//! Utilization ratios of the GPU and its memory, integrated from NVML's sample
//! buffers (`nvml::samples`), their busy and sampled totals, and the count of
//! compute processes.

use crate::collector::{point, read_engine, Engine, Gpu};
use crate::metrics;

pub(super) fn read(reader: &mut Gpu<'_>) {
    let gpu = read_engine(reader, Engine::GPU);
    let memory = read_engine(reader, Engine::MEMORY);
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
                point(reader, Engine::GPU, rates.gpu);
            }
            if !memory {
                point(reader, Engine::MEMORY, rates.memory);
            }
        }
    }
    if let Some(processes) = reader.compute_processes() {
        reader.gauge(metrics::PROCESSES, processes.len() as f64);
    }
}
