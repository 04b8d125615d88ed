//! `nvidia_gpu_info`: the GPU's static facts as labels of a value-1 sample.

use nvml_wrapper::error::nvml_sym;

use super::reader::DeviceReader;
use crate::metrics;
use crate::snapshot::Sample;

pub(super) fn read(reader: &mut DeviceReader<'_>) {
    let mut info = Sample::new(&metrics::INFO, 1.0);
    if let Some(name) = reader.read_string("nvmlDeviceGetName", |lib| {
        nvml_sym(lib.nvmlDeviceGetName.as_ref())
    }) {
        info = info.with("name", name);
    }
    if let Some(pci) = reader.read("nvmlDeviceGetPciInfo_v3", |d| d.pci_info()) {
        info = info.with("pci_bus_id", pci.bus_id);
    }
    if let Some(serial) = reader.read_string("nvmlDeviceGetSerial", |lib| {
        nvml_sym(lib.nvmlDeviceGetSerial.as_ref())
    }) {
        info = info.with("serial", serial);
    }
    if let Some(vbios) = reader.read_string("nvmlDeviceGetVbiosVersion", |lib| {
        nvml_sym(lib.nvmlDeviceGetVbiosVersion.as_ref())
    }) {
        info = info.with("vbios_version", vbios);
    }
    if let Some(brand) = reader.read("nvmlDeviceGetBrand", |d| d.brand()) {
        info = info.with("brand", format!("{brand:?}").to_lowercase());
    }
    if let Some(architecture) = reader.read("nvmlDeviceGetArchitecture", |d| d.architecture()) {
        info = info.with("architecture", format!("{architecture:?}").to_lowercase());
    }
    if let Some(minor) = reader.read("nvmlDeviceGetMinorNumber", |d| d.minor_number()) {
        info = info.with("minor_number", minor.to_string());
    }
    reader.push(info);
}
