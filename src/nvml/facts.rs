//! What the info read found of a GPU that decides how other collectors read
//! it, and the one place a GPU's chip is recognised.
//!
//! NVML names the architecture but not the chip, and some rules are the
//! chip's: GA100 returns an instantaneous power draw where the rest of Ampere
//! averages it (see `collectors::power`), and GA100 and GH100 have no video
//! encoder while NVML still answers the encoder's calls (see
//! [`GpuFacts::has_video_encoder`]). The chip is known by its PCI device id,
//! else by the product name.

use std::ops::RangeInclusive;

use nvml_wrapper::enums::device::DeviceArchitecture;

/// What the first reads of a GPU (its info) found that decides how other
/// collectors read it: which field to batch, which call adds nothing. Set once
/// per run by the info read, before any collector runs; a fact NVML could not
/// tell is empty, and each rule says what it assumes then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFacts {
    /// `nvmlDeviceGetArchitecture`: `None` when it could not be read,
    /// `Some(Err(raw))` for a value newer than this exporter knows.
    pub architecture: Option<Result<DeviceArchitecture, u32>>,
    /// `nvmlDeviceGetName` (e.g. `NVIDIA A100-SXM4-80GB`); empty when unread.
    pub name: String,
    /// The PCI device id with the vendor id in its low 16 bits
    /// (`nvmlPciInfo_t.pciDeviceId`, e.g. `0x20B210DE`); `None` when unread.
    pub pci_device_id: Option<u32>,
}

/// The chips some reading rule depends on; every other chip is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chip {
    /// Ampere GA100: A100, A30, A800 (no NVENC; an instantaneous power draw).
    Ga100,
    /// Hopper GH100: H100, H200, H800, H20, GH200 (no NVENC).
    Gh100,
    /// Any other chip, or one that neither the id nor the name tells.
    Other,
}

/// PCI device ids of the GA100 chip (A100, A30, A800, their X/engineering
/// variants and the CMP 170HX), without the vendor half.
const GA100_DEVICE_IDS: RangeInclusive<u32> = 0x2080..=0x20FF;

/// PCI device ids of the GH100 chip (H100 0x2330/0x2331/0x2321, H800 0x2324,
/// H20 0x2329, H200 0x2335, GH200 0x2342, …), without the vendor half.
const GH100_DEVICE_IDS: RangeInclusive<u32> = 0x2300..=0x237F;

/// Product names of GA100 boards, as words of `nvmlDeviceGetName`
/// (`NVIDIA A100-SXM4-80GB`, `NVIDIA A30`, `NVIDIA A800 80GB PCIe`).
const GA100_NAMES: &[&str] = &["A100", "A100X", "A30", "A30X", "A800", "AX800"];

/// Product names of GH100 boards, as words of `nvmlDeviceGetName`
/// (`NVIDIA H100 80GB HBM3`, `NVIDIA H200`, `NVIDIA GH200 480GB`).
const GH100_NAMES: &[&str] = &["H100", "H200", "H800", "H20", "GH200"];

impl GpuFacts {
    /// The GPU's chip: by its PCI device id where NVML gave it (an id outside
    /// the known ranges is `Other`, whatever the name says), else by a whole
    /// word of its product name (`A10`, `A16`, `A40` and `RTX A1000` are other
    /// Ampere chips; `H1000` is not `H100`); `Other` when neither was read.
    pub fn chip(&self) -> Chip {
        if let Some(id) = self.pci_device_id {
            let device = id >> 16;
            return if GA100_DEVICE_IDS.contains(&device) {
                Chip::Ga100
            } else if GH100_DEVICE_IDS.contains(&device) {
                Chip::Gh100
            } else {
                Chip::Other
            };
        }
        let named = |names: &[&str]| {
            self.name
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|word| names.contains(&word))
        };
        if named(GA100_NAMES) {
            Chip::Ga100
        } else if named(GH100_NAMES) {
            Chip::Gh100
        } else {
            Chip::Other
        }
    }

    /// Whether the GPU has a video encoder (NVENC) worth reading: false on
    /// GA100 and GH100, which have none (NVIDIA's Video Encode and Decode GPU
    /// Support Matrix: 0 NVENC, 5 to 7 NVDEC). NVML cannot tell: on an H200
    /// (driver 580) `nvmlDeviceGetEncoderCapacity` answered 100 for H264 and
    /// HEVC, and the encoder's utilization and stats an idle encoder, while its
    /// sample buffer costs about 3 ms cold. True for every other chip, and
    /// where the chip is not known, so that the encoder is then read as before.
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
