//! Power draw, energy and power limits. NVML reports milliwatts and millijoules.
//!
//! `nvmlDeviceGetPowerUsage` means one thing or another by architecture (NVML
//! reference: "On Ampere (except GA100) or newer GPUs, the API returns power
//! averaged over 1 sec interval. On GA100 and older architectures,
//! instantaneous power is returned."). The second power reading is the one the
//! draw is not, so that no GPU pays for a field that repeats the draw (on an
//! H200 the 1 s average field read exactly the draw and cost 3.3 ms of a 54 ms
//! run): the instantaneous power where the draw is averaged, the driver's 1 s
//! average where it is instantaneous. Never both.

use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
};

use crate::metrics;
use crate::nvml::reader::{DeviceReader, GpuFacts};

pub(super) const PER_MILLI: f64 = 1000.0;

/// Field values this collector takes from every GPU's batch: the energy (same
/// millijoules as `nvmlDeviceGetTotalEnergyConsumption`).
pub(super) const FIELDS: &[u32] = &[NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION];

/// The second power reading of a GPU with these facts (milliwatts, driver
/// 535+; no function offers either): the instantaneous power where the draw is
/// a 1 s average, else the driver's 1 s average.
pub(super) fn second_reading(facts: &GpuFacts) -> &'static [u32] {
    if draw_is_averaged(facts) {
        &[NVML_FI_DEV_POWER_INSTANT]
    } else {
        &[NVML_FI_DEV_POWER_AVERAGE]
    }
}

/// Whether `nvmlDeviceGetPowerUsage` returns power averaged over 1 s on this
/// GPU: on Ampere except GA100, Ada, Hopper, Blackwell and architectures newer
/// than this exporter knows. Where NVML does not name the architecture (not
/// read, or `NVML_DEVICE_ARCH_UNKNOWN`) the draw is taken as instantaneous, so
/// the driver's average is read: true on every GPU, only redundant on newer ones.
fn draw_is_averaged(facts: &GpuFacts) -> bool {
    match &facts.architecture {
        Some(Ok(DeviceArchitecture::Ampere)) => !is_ga100(facts),
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

/// PCI device ids of the GA100 chip (A100, A30, A800, their X/engineering
/// variants and the CMP 170HX), without the vendor half.
const GA100_DEVICE_IDS: std::ops::RangeInclusive<u32> = 0x2080..=0x20FF;

/// Product names of GA100 boards, as words of `nvmlDeviceGetName`
/// (`NVIDIA A100-SXM4-80GB`, `NVIDIA A30`, `NVIDIA A800 80GB PCIe`).
const GA100_NAMES: &[&str] = &["A100", "A100X", "A30", "A30X", "A800", "AX800"];

/// Whether an Ampere GPU is a GA100 (its draw instantaneous): by its PCI device
/// id where NVML gave it, and by its product name, so that either alone
/// suffices. A word must match whole: `A10`, `A16`, `A40` and `RTX A1000` are
/// other Ampere chips.
fn is_ga100(facts: &GpuFacts) -> bool {
    let by_id = facts
        .pci_device_id
        .is_some_and(|id| GA100_DEVICE_IDS.contains(&(id >> 16)));
    let by_name = facts
        .name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| GA100_NAMES.contains(&word));
    by_id || by_name
}

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    if let Some(milliwatts) = reader.read("nvmlDeviceGetPowerUsage", |d| d.power_usage()) {
        reader.gauge(&metrics::POWER, f64::from(milliwatts) / PER_MILLI);
    }
    let energy = reader.field_or(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, |reader| {
        reader
            .read("nvmlDeviceGetTotalEnergyConsumption", |d| {
                d.total_energy_consumption()
            })
            .map(|millijoules| millijoules as f64)
    });
    if let Some(millijoules) = energy {
        reader.gauge(&metrics::ENERGY, millijoules / PER_MILLI);
    }
    if let Some(milliwatts) = reader.read("nvmlDeviceGetEnforcedPowerLimit", |d| {
        d.enforced_power_limit()
    }) {
        reader.gauge(&metrics::POWER_LIMIT, f64::from(milliwatts) / PER_MILLI);
    }
    if let Some(milliwatts) = reader.read("nvmlDeviceGetPowerManagementDefaultLimit", |d| {
        d.power_management_limit_default()
    }) {
        reader.gauge(
            &metrics::POWER_DEFAULT_LIMIT,
            f64::from(milliwatts) / PER_MILLI,
        );
    }
    // Only the one `second_reading` chose was batched; the other is `None`.
    for (field, family) in [
        (NVML_FI_DEV_POWER_INSTANT, &metrics::POWER_INSTANT),
        (NVML_FI_DEV_POWER_AVERAGE, &metrics::POWER_AVERAGE),
    ] {
        if let Some(milliwatts) = reader.field(field) {
            reader.gauge(family, milliwatts / PER_MILLI);
        }
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
    fn ga100_boards_have_an_instantaneous_draw_by_name() {
        for name in [
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA A100X",
            "NVIDIA A30",
            "NVIDIA A800-SXM4-80GB",
            "NVIDIA A800 40GB Active",
        ] {
            assert!(!draw_is_averaged(&ampere(name)), "{name}");
            assert_eq!(second_reading(&ampere(name)), [NVML_FI_DEV_POWER_AVERAGE]);
        }
    }

    #[test]
    fn ga100_is_known_by_its_pci_device_id_whatever_its_name() {
        for id in [0x20B2_10DE, 0x20B7_10DE, 0x20F5_10DE, 0x20C2_10DE] {
            let gpu = GpuFacts {
                pci_device_id: Some(id),
                ..ampere("NVIDIA Graphics Device")
            };
            assert!(!draw_is_averaged(&gpu), "{id:#x}");
        }
        // GA102 (A40) by id, with a name that says nothing.
        let a40 = GpuFacts {
            pci_device_id: Some(0x2235_10DE),
            ..ampere("NVIDIA Graphics Device")
        };
        assert!(draw_is_averaged(&a40));
    }

    #[test]
    fn other_ampere_boards_average_their_draw() {
        for name in [
            "NVIDIA A10",
            "NVIDIA A10G",
            "NVIDIA A16",
            "NVIDIA A40",
            "NVIDIA A2",
            "NVIDIA RTX A1000 Laptop GPU",
            "NVIDIA RTX A3000 Laptop GPU",
            "NVIDIA RTX A6000",
            "NVIDIA GeForce RTX 3090",
            "",
        ] {
            assert!(draw_is_averaged(&ampere(name)), "{name}");
            assert_eq!(second_reading(&ampere(name)), [NVML_FI_DEV_POWER_INSTANT]);
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
            second_reading(&facts(None, "NVIDIA H100 80GB HBM3")),
            [NVML_FI_DEV_POWER_AVERAGE]
        );
    }
}
