//! End to end: nvml-wrapper dlopens the built cdylib, as the exporter does.
//!
//! Cargo builds the library target (cdylib included) before it runs this
//! integration test, so `libfake_nvml.so` lies next to or above the test
//! executable; if it is missing anyway, the test builds it with cargo.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use nvml_wrapper::enum_wrappers::device::{Brand, Clock, TemperatureSensor};
use nvml_wrapper::enums::device::{DeviceArchitecture, SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;

const LIB_NAME: &str = "libfake_nvml.so";

fn find_cdylib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/<test> → look in deps/ and in target/<profile>/.
    let deps = exe.parent()?;
    [deps.join(LIB_NAME), deps.parent()?.join(LIB_NAME)]
        .into_iter()
        .find(|p| p.is_file())
}

fn cdylib() -> PathBuf {
    if let Some(path) = find_cdylib() {
        return path;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "fake-nvml", "--lib"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build -p fake-nvml");
    assert!(status.success(), "cargo build -p fake-nvml failed");
    find_cdylib().unwrap_or_else(|| {
        panic!(
            "{LIB_NAME} not found next to {:?} even after cargo build",
            std::env::current_exe().unwrap()
        )
    })
}

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(name)
}

/// The library's state and the env var are process-wide: one test at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn init(scenario_file: &str) -> (MutexGuard<'static, ()>, Result<Nvml, NvmlError>) {
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var(fake_nvml::SCENARIO_ENV, scenario(scenario_file));
    let lib = cdylib();
    let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init();
    (guard, nvml)
}

#[test]
fn h100x8_through_nvml_wrapper() {
    let (_g, nvml) = init("h100x8.toml");
    let nvml = nvml.expect("init with h100x8.toml");
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.90.07");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.90.07");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    assert_eq!(nvml.device_count().unwrap(), 8);

    let mut uuids = Vec::new();
    let mut processes = 0;
    for i in 0..8 {
        let d = nvml.device_by_index(i).unwrap();
        assert_eq!(d.name().unwrap(), "NVIDIA H100 80GB HBM3");
        assert_eq!(d.architecture().unwrap(), DeviceArchitecture::Hopper);
        assert_eq!(d.brand().unwrap(), Brand::Nvidia);
        uuids.push(d.uuid().unwrap());

        let mem = d.memory_info().unwrap();
        assert_eq!(mem.total, 81559 * 1024 * 1024);
        assert_eq!(mem.total, mem.reserved + mem.used + mem.free);

        let power = d.power_usage().unwrap();
        assert!((50_000..=700_000).contains(&power), "{power} mW");
        assert_eq!(d.enforced_power_limit().unwrap(), 700_000);
        assert_eq!(d.max_clock_info(Clock::SM).unwrap(), 1980);
        assert_eq!(d.max_clock_info(Clock::Memory).unwrap(), 2619);
        assert!(d.temperature(TemperatureSensor::Gpu).unwrap() < 87);
        assert_eq!(d.current_pcie_link_gen().unwrap(), 5);
        assert_eq!(d.current_pcie_link_width().unwrap(), 16);
        assert_eq!(d.minor_number().unwrap(), i);
        let pci = d.pci_info().unwrap();
        assert!(pci.bus_id.starts_with("00000000:"), "{}", pci.bus_id);
        assert_eq!(pci.pci_device_id, 0x2330_10de);
        assert!(d.is_ecc_enabled().unwrap().currently_enabled);
        assert!(d.fan_speed(0).is_err());

        for link in 0..18 {
            assert!(d.link_wrapper_for(link).is_active().unwrap());
        }
        assert!(d.link_wrapper_for(18).is_active().is_err());

        for proc_ in d.running_compute_processes().unwrap() {
            assert!(matches!(proc_.used_gpu_memory, UsedGpuMemory::Used(b) if b > 0));
            assert_eq!(proc_.gpu_instance_id, None);
            processes += 1;
        }

        let fields = d
            .field_values_for(&[FieldId(82), FieldId(197), FieldId(198), FieldId(83)])
            .unwrap();
        let value = |s: &Result<FieldValueSample, NvmlError>| match s.as_ref().unwrap().value {
            Ok(SampleValue::U64(v)) => v,
            ref other => panic!("{other:?}"),
        };
        assert!((30..=95).contains(&value(&fields[0])), "HBM temperature");
        assert!(value(&fields[1]) > 0 && value(&fields[2]) > 0, "PCIe bytes");
        assert!(matches!(
            fields[3].as_ref().unwrap().value,
            Err(NvmlError::NotSupported)
        ));
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 8, "UUIDs are distinct");
    assert!(processes >= 6);
}

#[test]
fn every_listed_symbol_is_exported() {
    let (_g, nvml) = init("geforce.toml");
    let nvml = nvml.unwrap();
    let lib = &nvml.lib().__library;
    for sym in fake_nvml::scenario::all_symbols() {
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(sym.as_bytes()) };
        assert!(found.is_ok(), "{sym} is not exported");
    }
}

#[test]
fn geforce_reports_not_supported_where_consumer_cards_do() {
    let (_g, nvml) = init("geforce.toml");
    let nvml = nvml.unwrap();
    assert_eq!(nvml.device_count().unwrap(), 1);
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.name().unwrap(), "NVIDIA GeForce RTX 4090");
    assert_eq!(d.brand().unwrap(), Brand::GeForce);
    assert_eq!(d.architecture().unwrap(), DeviceArchitecture::Ada);
    assert_eq!(d.memory_info().unwrap().total, 24564 * 1024 * 1024);
    assert_eq!(d.num_fans().unwrap(), 2);
    assert_eq!(d.fan_speed(1).unwrap(), 41);
    assert_eq!(d.power_management_limit_default().unwrap(), 450_000);
    assert!(d.total_energy_consumption().unwrap() > 0);
    assert!(d.encoder_utilization().is_ok());
    assert!(d.decoder_utilization().is_ok());
    assert!(matches!(d.serial(), Err(NvmlError::NotSupported)));
    assert!(matches!(d.is_ecc_enabled(), Err(NvmlError::NotSupported)));
    assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        d.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(d.running_compute_processes().unwrap().len(), 1);
}

#[test]
fn lost_gpu_keeps_its_handle_but_answers_gpu_lost() {
    let (_g, nvml) = init("lost-gpu.toml");
    let nvml = nvml.unwrap();
    assert_eq!(nvml.device_count().unwrap(), 4);
    for i in [0, 1, 3] {
        assert!(nvml.device_by_index(i).unwrap().power_usage().is_ok());
    }
    let lost = nvml.device_by_index(2).unwrap();
    assert!(matches!(lost.power_usage(), Err(NvmlError::GpuLost)));
    assert!(matches!(lost.uuid(), Err(NvmlError::GpuLost)));
    assert!(matches!(lost.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        lost.running_compute_processes(),
        Err(NvmlError::GpuLost)
    ));
}

#[test]
fn mig_devices_through_nvml_wrapper() {
    let (_g, nvml) = init("h100-mig.toml");
    let nvml = nvml.unwrap();
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.mig_device_count().unwrap(), 7);
    assert!(matches!(
        d.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    let mut total = 0;
    for slot in 0..3 {
        let m = d.mig_device_by_index(slot).unwrap();
        assert!(m.mig_is_mig_device_handle().unwrap());
        assert!(m.uuid().unwrap().starts_with("MIG-"));
        total += m.memory_info().unwrap().total;
        assert!(m.mig_parent_device().is_ok());
    }
    assert!(total < d.memory_info().unwrap().total);
    assert!(matches!(d.mig_device_by_index(3), Err(NvmlError::NotFound)));
    let procs = d.running_compute_processes().unwrap();
    assert_eq!(procs[0].gpu_instance_id, Some(2));
}

#[test]
fn init_failures_map_to_nvml_errors() {
    for (file, check) in [
        (
            "init-driver-not-loaded.toml",
            (|e| matches!(e, NvmlError::DriverNotLoaded)) as fn(&NvmlError) -> bool,
        ),
        ("init-no-permission.toml", |e| {
            matches!(e, NvmlError::NoPermission)
        }),
        ("init-lib-rm-version-mismatch.toml", |e| {
            matches!(e, NvmlError::LibRmVersionMismatch)
        }),
        ("init-unknown.toml", |e| matches!(e, NvmlError::Unknown)),
    ] {
        let (_g, nvml) = init(file);
        let err = nvml
            .err()
            .unwrap_or_else(|| panic!("{file}: init succeeded"));
        assert!(check(&err), "{file}: {err:?}");
    }
}
