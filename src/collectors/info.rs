//! `nvidia_gpu_info` and the GPU's identity, read first on every GPU. Every
//! label is written, empty when unknown, so the series keeps one label set.

use nvml::calls;

use crate::collector::Gpu;
use crate::facts::GpuFacts;
use crate::identity;
use crate::metrics;

pub(crate) fn read(gpu: &mut Gpu<'_>) -> identity::Read {
    let uuid = gpu.nvml.read(calls::UUID, ());
    let name = gpu.nvml.read(calls::NAME, ());
    let pci = gpu.nvml.read(calls::PCI_INFO, ());
    let (pci_device_id, pci_bus_id) = pci.map(|pci| (pci.pci_device_id, pci.bus_id)).unzip();
    let serial = gpu.nvml.read(calls::SERIAL, ());
    let vbios = gpu.nvml.read(calls::VBIOS_VERSION, ());
    let brand = gpu.nvml.read(calls::BRAND, ());
    let architecture = gpu.nvml.read(calls::ARCHITECTURE, ());
    let minor = gpu.nvml.read(calls::MINOR_NUMBER, ());
    let name = name.unwrap_or_default();
    gpu.set_facts(GpuFacts {
        architecture: architecture.clone(),
        name: name.clone(),
        pci_device_id,
    });
    let identity = identity::Read {
        index: gpu.index(),
        uuid: uuid.unwrap_or_default(),
        pci_bus_id: pci_bus_id.unwrap_or_default(),
        serial: serial.unwrap_or_default(),
    };
    gpu.push(metrics::INFO.sample_with(
        [
            name,
            identity.pci_bus_id.clone(),
            identity.serial.clone(),
            vbios.unwrap_or_default(),
            enum_label(brand),
            enum_label(architecture),
            minor.map(|m| m.to_string()).unwrap_or_default(),
        ],
        1.0,
    ));
    identity
}

/// `unknown` for a value newer than this exporter knows, empty when unread.
fn enum_label<E: std::fmt::Debug>(read: Option<Result<E, u32>>) -> String {
    match read {
        Some(Ok(value)) => format!("{value:?}").to_lowercase(),
        Some(Err(_)) => "unknown".to_owned(),
        None => String::new(),
    }
}
