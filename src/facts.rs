//! What the info read found of a GPU, and the one place a GPU's chip is
//! recognised (NVML names the architecture, not the chip).

use nvml::types::DeviceArchitecture;

/// Set once per run before any other collector runs; a fact NVML could not
/// tell is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFacts {
    /// `Some(Err(raw))` for a value newer than this exporter knows.
    pub architecture: Option<Result<DeviceArchitecture, u32>>,
    /// E.g. `NVIDIA A100-SXM4-80GB`.
    pub name: String,
    /// The vendor id in its low 16 bits (e.g. `0x20B210DE`).
    pub pci_device_id: Option<u32>,
}

/// The chips some reading rule depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chip {
    /// Ampere GA100: A100, A30, A800 (no NVENC; an instantaneous power draw).
    Ga100,
    /// Hopper GH100: H100, H200, H800, H20, GH200 (no NVENC).
    Gh100,
    Other,
}

const GA100_NAMES: &[&str] = &["A100", "A100X", "A30", "A30X", "A800", "AX800"];
const GH100_NAMES: &[&str] = &["H100", "H200", "H800", "H20", "GH200"];

impl GpuFacts {
    /// By the PCI device id where NVML gave it (whatever the name says), else
    /// by a whole word of the product name (`A10` is no `A100`).
    pub fn chip(&self) -> Chip {
        let words = || self.name.split(|c: char| !c.is_ascii_alphanumeric());
        let named = |names: &[&str]| words().any(|word| names.contains(&word));
        match self.pci_device_id.map(|id| id >> 16) {
            Some(0x2080..=0x20FF) => Chip::Ga100,
            Some(0x2300..=0x237F) => Chip::Gh100,
            Some(_) => Chip::Other,
            None if named(GA100_NAMES) => Chip::Ga100,
            None if named(GH100_NAMES) => Chip::Gh100,
            None => Chip::Other,
        }
    }

    /// Blackwell, or an architecture after Orin (`NVML_DEVICE_ARCH_T23X`,
    /// 11), the last that nvml.h names: what NVML documents its rack and
    /// power-smoothing calls for. Hopper answers them with zeros it has no
    /// hardware for.
    pub fn is_blackwell_or_newer(&self) -> bool {
        const T23X: u32 = 11;
        match self.architecture {
            Some(Ok(DeviceArchitecture::Blackwell)) => true,
            Some(Err(raw)) => raw > T23X,
            _ => false,
        }
    }

    /// GA100 and GH100 have no NVENC though NVML answers its calls.
    pub fn has_video_encoder(&self) -> bool {
        !matches!(self.chip(), Chip::Ga100 | Chip::Gh100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> GpuFacts {
        GpuFacts {
            name: name.to_owned(),
            ..GpuFacts::default()
        }
    }

    fn with_id(id: u32, name: &str) -> GpuFacts {
        GpuFacts {
            pci_device_id: Some(id),
            ..named(name)
        }
    }

    #[test]
    fn chips_are_known_by_their_pci_device_id_whatever_their_name() {
        for id in [0x20B2_10DE, 0x20B7_10DE, 0x20F5_10DE, 0x20C2_10DE] {
            let gpu = with_id(id, "NVIDIA Graphics Device");
            assert_eq!(gpu.chip(), Chip::Ga100, "{id:#x}");
            assert!(!gpu.has_video_encoder(), "{id:#x}");
        }
        for id in [
            0x2330_10DE,
            0x2331_10DE,
            0x2321_10DE,
            0x2324_10DE,
            0x2329_10DE,
            0x2335_10DE,
            0x2342_10DE,
        ] {
            let gpu = with_id(id, "NVIDIA Graphics Device");
            assert_eq!(gpu.chip(), Chip::Gh100, "{id:#x}");
            assert!(!gpu.has_video_encoder(), "{id:#x}");
        }
        // GA102 (A40), AD102 (RTX 4090), AD102 (L40S), GB100 (B200): other
        // chips, with an encoder, even under a GA100 or GH100 name.
        for (id, name) in [
            (0x2235_10DE, "NVIDIA A100-SXM4-80GB"),
            (0x2684_10DE, "NVIDIA GeForce RTX 4090"),
            (0x26B9_10DE, "NVIDIA H100 80GB HBM3"),
            (0x2901_10DE, "NVIDIA B200"),
        ] {
            let gpu = with_id(id, name);
            assert_eq!(gpu.chip(), Chip::Other, "{id:#x}");
            assert!(gpu.has_video_encoder(), "{id:#x}");
        }
        // The ends of the ranges.
        assert_eq!(with_id(0x2080_10DE, "").chip(), Chip::Ga100);
        assert_eq!(with_id(0x20FF_10DE, "").chip(), Chip::Ga100);
        assert_eq!(with_id(0x207F_10DE, "").chip(), Chip::Other);
        assert_eq!(with_id(0x2100_10DE, "").chip(), Chip::Other);
        assert_eq!(with_id(0x2300_10DE, "").chip(), Chip::Gh100);
        assert_eq!(with_id(0x237F_10DE, "").chip(), Chip::Gh100);
        assert_eq!(with_id(0x22FF_10DE, "").chip(), Chip::Other);
        assert_eq!(with_id(0x2380_10DE, "").chip(), Chip::Other);
    }

    #[test]
    fn without_an_id_the_product_name_tells_the_chip() {
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
            assert_eq!(named(name).chip(), Chip::Ga100, "{name}");
            assert!(!named(name).has_video_encoder(), "{name}");
        }
        for name in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe",
            "NVIDIA H100 NVL",
            "NVIDIA H100-SXM5-80GB",
            "NVIDIA H200",
            "NVIDIA H200 NVL",
            "NVIDIA H800",
            "NVIDIA H20",
            "NVIDIA GH200 480GB",
        ] {
            assert_eq!(named(name).chip(), Chip::Gh100, "{name}");
            assert!(!named(name).has_video_encoder(), "{name}");
        }
    }

    #[test]
    fn a_name_matches_only_as_a_whole_word() {
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
            "NVIDIA H1000",
            "NVIDIA H2000",
            "NVIDIA H200X",
            "NVIDIA GH2000",
            "NVIDIA L40S",
            "NVIDIA GeForce RTX 4090",
        ] {
            assert_eq!(named(name).chip(), Chip::Other, "{name}");
            assert!(named(name).has_video_encoder(), "{name}");
        }
    }

    #[test]
    fn an_unknown_gpu_reads_its_encoder() {
        let unknown = GpuFacts::default();
        assert_eq!(unknown.chip(), Chip::Other);
        assert!(unknown.has_video_encoder());
        // The architecture alone does not name the chip.
        let hopper = GpuFacts {
            architecture: Some(Ok(DeviceArchitecture::Hopper)),
            ..GpuFacts::default()
        };
        assert_eq!(hopper.chip(), Chip::Other);
        assert!(hopper.has_video_encoder());
    }
}
