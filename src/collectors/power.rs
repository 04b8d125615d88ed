//! Power draw, energy and power limits. The draw is a 1 s average on some
//! architectures and instantaneous on others: the second power reading is the
//! one the draw is not.

use nvml::calls;
use nvml::types::field_id::{
    NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING,
};
use nvml::types::DeviceArchitecture;

use crate::collector::{Collector, Gpu, Hooks, PER_MILLI};
use crate::facts::{Chip, GpuFacts};
use crate::metrics::{self, families};

families! {
    FAMILIES;
    POWER: Gauge(Watts), "nvidia_gpu_power_watts", [],
        "Power drawn by the GPU and its memory (nvmlDeviceGetPowerUsage): averaged over the last second on Ampere except GA100 (A100, A30, A800) and newer, instantaneous on GA100 and older architectures.";
    ENERGY: Counter(Joules), "nvidia_gpu_energy_joules_total", [],
        "Energy consumed by the GPU since the driver was last loaded.";
    POWER_LIMIT: Gauge(Watts), "nvidia_gpu_power_limit_watts", [],
        "Power limit the GPU enforces now (the lowest of all limiters).";
    POWER_DEFAULT_LIMIT: Gauge(Watts), "nvidia_gpu_power_default_limit_watts", [],
        "Power limit the GPU has by default.";
    POWER_AVERAGE: Gauge(Watts), "nvidia_gpu_power_average_watts", [],
        "Power drawn by the GPU, averaged by the driver over the last second (nvidia-smi: Average Power Draw); only where nvidia_gpu_power_watts is instantaneous (GA100 and older, or an architecture NVML does not name).";
    POWER_INSTANT: Gauge(Watts), "nvidia_gpu_power_instant_watts", [],
        "Power drawn by the GPU at the moment of reading (nvidia-smi: Instantaneous Power Draw; driver 535+); only where nvidia_gpu_power_watts is a 1 s average (Ampere except GA100, and newer).";
    POWER_SMOOTHING_LIFETIME: Gauge(Ratio), "nvidia_gpu_power_smoothing_lifetime_remaining_ratio", [],
        "Share of its lifetime the power-smoothing circuitry has left (Blackwell and newer; driver 575+).";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "power",
    default: true,
    help: "Power draw and, by architecture, the instantaneous power or the driver's 1 s average (whichever the draw is not), energy counter, enforced and default power limit, the power-smoothing circuitry's lifetime left.",
    families: FAMILIES,
    hooks: Hooks {
        fields_for: Some(by_architecture),
        ..Hooks::read(read, FIELDS)
    },
};

pub(super) const FIELDS: &[u32] = &[NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION];

const LIFETIME: u32 = NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING;

/// The second power reading, and on Blackwell and newer the power-smoothing
/// circuitry's lifetime left (258 from driver 580.82 on, 263 before:
/// `nvml::fields::driver_id`).
fn by_architecture(facts: &GpuFacts) -> &'static [u32] {
    match (draw_is_averaged(facts), facts.is_blackwell_or_newer()) {
        (true, true) => &[NVML_FI_DEV_POWER_INSTANT, LIFETIME],
        (true, false) => &[NVML_FI_DEV_POWER_INSTANT],
        (false, _) => &[NVML_FI_DEV_POWER_AVERAGE],
    }
}

/// Ampere but GA100, and newer; an architecture not named counts as
/// instantaneous.
fn draw_is_averaged(facts: &GpuFacts) -> bool {
    match &facts.architecture {
        Some(Ok(DeviceArchitecture::Ampere)) => facts.chip() != Chip::Ga100,
        Some(Ok(DeviceArchitecture::Ada | DeviceArchitecture::Hopper))
        | Some(Ok(DeviceArchitecture::Blackwell))
        | Some(Err(_)) => true,
        Some(Ok(
            DeviceArchitecture::Kepler
            | DeviceArchitecture::Maxwell
            | DeviceArchitecture::Pascal
            | DeviceArchitecture::Volta
            | DeviceArchitecture::Turing
            | DeviceArchitecture::Unknown,
        ))
        | None => false,
    }
}

fn read(gpu: &mut Gpu<'_>) {
    let watts = |milliwatts: u32| f64::from(milliwatts) / PER_MILLI;
    let milliwatts = gpu.nvml.read(calls::POWER_USAGE, ());
    gpu.gauge(POWER, milliwatts.map(watts));
    let energy = gpu
        .nvml
        .field_or(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, |nvml| {
            nvml.read(calls::TOTAL_ENERGY, ()).map(|mj| mj as f64)
        });
    gpu.gauge(ENERGY, energy.map(|mj| mj / PER_MILLI));
    let limit = gpu.nvml.read(calls::ENFORCED_POWER_LIMIT, ());
    gpu.gauge(POWER_LIMIT, limit.map(watts));
    let default_limit = gpu.nvml.read(calls::DEFAULT_POWER_LIMIT, ());
    gpu.gauge(POWER_DEFAULT_LIMIT, default_limit.map(watts));
    let instant = gpu.nvml.field(NVML_FI_DEV_POWER_INSTANT);
    gpu.gauge(POWER_INSTANT, instant.map(|mw| mw / PER_MILLI));
    let average = gpu.nvml.field(NVML_FI_DEV_POWER_AVERAGE);
    gpu.gauge(POWER_AVERAGE, average.map(|mw| mw / PER_MILLI));
    if let Some(percent) = gpu.nvml.field(LIFETIME) {
        let sample = POWER_SMOOTHING_LIFETIME.sample(metrics::ratio(percent));
        gpu.push_read(sample, percent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(architecture: Option<Result<DeviceArchitecture, u32>>, name: &str) -> GpuFacts {
        GpuFacts {
            architecture,
            name: name.to_owned(),
            pci_device_id: None,
        }
    }

    fn ampere(name: &str) -> GpuFacts {
        facts(Some(Ok(DeviceArchitecture::Ampere)), name)
    }

    #[test]
    fn ga100_has_an_instantaneous_draw_and_other_ampere_chips_average() {
        // The chip by name or by id (the rule itself is tested in `nvml::facts`).
        let a100_by_id = GpuFacts {
            pci_device_id: Some(0x20B2_10DE),
            ..ampere("NVIDIA Graphics Device")
        };
        for gpu in [
            ampere("NVIDIA A100-SXM4-80GB"),
            ampere("NVIDIA A30"),
            a100_by_id,
        ] {
            assert!(!draw_is_averaged(&gpu), "{gpu:?}");
            assert_eq!(by_architecture(&gpu), [NVML_FI_DEV_POWER_AVERAGE]);
        }
        let a40_by_id = GpuFacts {
            pci_device_id: Some(0x2235_10DE),
            ..ampere("NVIDIA Graphics Device")
        };
        for gpu in [
            ampere("NVIDIA A10"),
            ampere("NVIDIA RTX A1000 Laptop GPU"),
            ampere("NVIDIA GeForce RTX 3090"),
            ampere(""),
            a40_by_id,
        ] {
            assert!(draw_is_averaged(&gpu), "{gpu:?}");
            assert_eq!(by_architecture(&gpu), [NVML_FI_DEV_POWER_INSTANT]);
        }
    }

    #[test]
    fn newer_architectures_average_and_older_ones_do_not() {
        for arch in [
            DeviceArchitecture::Ada,
            DeviceArchitecture::Hopper,
            DeviceArchitecture::Blackwell,
        ] {
            // A GA100 name on another architecture does not make it one.
            assert!(
                draw_is_averaged(&facts(Some(Ok(arch.clone())), "NVIDIA A100")),
                "{arch:?}"
            );
        }
        // A value newer than this exporter knows: a newer architecture.
        assert!(draw_is_averaged(&facts(Some(Err(11)), "NVIDIA B300")));
        for arch in [
            DeviceArchitecture::Kepler,
            DeviceArchitecture::Maxwell,
            DeviceArchitecture::Pascal,
            DeviceArchitecture::Volta,
            DeviceArchitecture::Turing,
            DeviceArchitecture::Unknown,
        ] {
            assert!(
                !draw_is_averaged(&facts(Some(Ok(arch.clone())), "NVIDIA H100")),
                "{arch:?}"
            );
        }
        // Not read: the driver's average, which is right everywhere.
        assert_eq!(
            by_architecture(&facts(None, "NVIDIA H100 80GB HBM3")),
            [NVML_FI_DEV_POWER_AVERAGE]
        );
    }

    #[test]
    fn only_blackwell_and_newer_are_asked_the_smoothing_lifetime() {
        const LIFETIME: u32 = NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING;
        let asks =
            |architecture| by_architecture(&facts(architecture, "NVIDIA")).contains(&LIFETIME);
        assert!(asks(Some(Ok(DeviceArchitecture::Blackwell))));
        assert!(asks(Some(Err(12))));
        // Orin (NVML_DEVICE_ARCH_T23X), which nvml-wrapper does not name.
        assert!(!asks(Some(Err(11))));
        assert!(!asks(Some(Ok(DeviceArchitecture::Hopper))));
        assert!(!asks(Some(Ok(DeviceArchitecture::Ampere))));
        assert!(!asks(None));
    }
}
