//! `nvidia_gpu_info`: the GPU's static facts as labels of a value-1 sample.
//!
//! Every label is always written, empty when NVML could not tell it (not
//! supported, or a read that failed this run), so the series keeps one label set
//! from run to run instead of turning into a new series on a transient failure.

use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::nvml_sym;

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

/// The PCI bus id (`00000000:17:00.0`) and serial as read for the info sample,
/// for the caller to confirm identities with; empty when unreadable.
#[derive(Debug, Default)]
pub(super) struct Identity {
    pub pci_bus_id: String,
    pub serial: String,
}

pub(super) fn read(reader: &mut DeviceReader<'_>) -> Identity {
    let name = reader.read_string("nvmlDeviceGetName", |lib| {
        nvml_sym(lib.nvmlDeviceGetName.as_ref())
    });
    let pci_bus_id = reader
        .read("nvmlDeviceGetPciInfo_v3", |d| d.pci_info())
        .map(|pci| pci.bus_id);
    let serial = reader.read_string("nvmlDeviceGetSerial", |lib| {
        nvml_sym(lib.nvmlDeviceGetSerial.as_ref())
    });
    let vbios = reader.read_string("nvmlDeviceGetVbiosVersion", |lib| {
        nvml_sym(lib.nvmlDeviceGetVbiosVersion.as_ref())
    });
    let brand = reader.read_enum::<Brand>("nvmlDeviceGetBrand", |lib| {
        nvml_sym(lib.nvmlDeviceGetBrand.as_ref())
    });
    let architecture = reader.read_enum::<DeviceArchitecture>("nvmlDeviceGetArchitecture", |lib| {
        nvml_sym(lib.nvmlDeviceGetArchitecture.as_ref())
    });
    let minor = reader.read("nvmlDeviceGetMinorNumber", |d| d.minor_number());
    let identity = Identity {
        pci_bus_id: pci_bus_id.unwrap_or_default(),
        serial: serial.unwrap_or_default(),
    };
    reader.push(
        Sample::new(&metrics::INFO, 1.0)
            .with("name", name.unwrap_or_default())
            .with("pci_bus_id", identity.pci_bus_id.clone())
            .with("serial", identity.serial.clone())
            .with("vbios_version", vbios.unwrap_or_default())
            .with("brand", enum_label(brand))
            .with("architecture", enum_label(architecture))
            .with(
                "minor_number",
                minor.map(|m| m.to_string()).unwrap_or_default(),
            ),
    );
    identity
}

/// The label of an enum read: its lower-case name, `unknown` for a value newer
/// than this exporter knows, empty when it could not be read.
fn enum_label<E: std::fmt::Debug>(read: Option<Result<E, u32>>) -> String {
    match read {
        Some(Ok(value)) => format!("{value:?}").to_lowercase(),
        Some(Err(_)) => "unknown".to_owned(),
        None => String::new(),
    }
}
