//! Utilization ratios of the GPU and its memory (from NVML's sample buffers,
//! see `window`), and the count of compute processes.

use super::reader::DeviceReader;
use super::window::{self, Engine, Outcome};
use crate::metrics;

/// NVML reports utilization in percent of its sample period; a reading above 100
/// is not a utilization and is dropped rather than exported.
pub(super) fn percent_to_ratio(percent: u32) -> Option<f64> {
    (percent <= 100).then(|| f64::from(percent) / 100.0)
}

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let gpu = window::read(reader, Engine::Gpu);
    let memory = window::read(reader, Engine::Memory);
    // Where NVML keeps no samples (MIG mode), its point reading of the last
    // sample period is all there is; the HELP says so.
    let fallback: Vec<Engine> = [(Engine::Gpu, gpu), (Engine::Memory, memory)]
        .into_iter()
        .filter(|(_, outcome)| matches!(outcome, Outcome::Unsupported))
        .map(|(engine, _)| engine)
        .collect();
    if !fallback.is_empty() {
        log::debug!(
            "GPU {}: no utilization samples; using nvmlDeviceGetUtilizationRates",
            reader.index()
        );
        if let Some(rates) = reader.read("nvmlDeviceGetUtilizationRates", |d| d.utilization_rates())
        {
            for engine in fallback {
                let percent = match engine {
                    Engine::Gpu => rates.gpu,
                    _ => rates.memory,
                };
                match percent_to_ratio(percent) {
                    Some(ratio) => reader.gauge(engine.family(), ratio),
                    None => reader.reject(engine.family(), f64::from(percent)),
                }
            }
        }
    }
    if let Some(processes) = reader.compute_processes() {
        reader.gauge(&metrics::PROCESSES, processes.len() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_converts_to_ratio_and_rejects_impossible_values() {
        assert_eq!(percent_to_ratio(0), Some(0.0));
        assert_eq!(percent_to_ratio(87), Some(0.87));
        assert_eq!(percent_to_ratio(100), Some(1.0));
        assert_eq!(percent_to_ratio(101), None);
        assert_eq!(percent_to_ratio(u32::MAX), None);
    }
}
