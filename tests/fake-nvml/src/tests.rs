//! Unit tests: layouts, scenario parsing, and calls through the exports.
//!
//! The library keeps one global state, and tests run on parallel threads, so
//! every test that touches it holds `LOCK` for its whole duration.

use std::ffi::{c_char, c_uint, c_ulonglong, CStr};
use std::mem::{align_of, offset_of, size_of};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings as sys;

use crate::exports::*;
use crate::ffi::*;
use crate::scenario::{self, all_symbols, DEVICE_SYMBOLS};
use crate::state::{gpu_handle, guard, mig_handle, plan, SCENARIO_ENV};

// ---------------------------------------------------------------------------
// Layouts

macro_rules! same_layout {
    ($ours:ty, $theirs:ty, [$($field:ident),*]) => {{
        assert_eq!(size_of::<$ours>(), size_of::<$theirs>(), "size of {}", stringify!($ours));
        assert_eq!(align_of::<$ours>(), align_of::<$theirs>(), "align of {}", stringify!($ours));
        $(
            assert_eq!(
                offset_of!($ours, $field),
                offset_of!($theirs, $field),
                "offset of {}.{}",
                stringify!($ours),
                stringify!($field)
            );
        )*
    }};
}

#[test]
fn layouts_match_nvml_bindings() {
    same_layout!(nvmlSample_t, sys::nvmlSample_t, [timeStamp, sampleValue]);
    same_layout!(
        nvmlProcessUtilizationSample_t,
        sys::nvmlProcessUtilizationSample_t,
        [pid, timeStamp, smUtil, memUtil, encUtil, decUtil]
    );
    same_layout!(
        nvmlPciInfo_t,
        sys::nvmlPciInfo_t,
        [
            busIdLegacy,
            domain,
            bus,
            device,
            pciDeviceId,
            pciSubSystemId,
            busId
        ]
    );
    same_layout!(nvmlMemory_t, sys::nvmlMemory_t, [total, free, used]);
    same_layout!(
        nvmlMemory_v2_t,
        sys::nvmlMemory_v2_t,
        [version, total, reserved, free, used]
    );
    same_layout!(
        nvmlBAR1Memory_t,
        sys::nvmlBAR1Memory_t,
        [bar1Total, bar1Free, bar1Used]
    );
    same_layout!(nvmlUtilization_t, sys::nvmlUtilization_t, [gpu, memory]);
    same_layout!(
        nvmlMarginTemperature_t,
        sys::nvmlMarginTemperature_t,
        [version, marginTemperature]
    );
    same_layout!(nvmlC2cModeInfo_t, sys::nvmlC2cModeInfo_v1_t, [isC2cEnabled]);
    same_layout!(
        nvmlRepairStatus_t,
        sys::nvmlRepairStatus_v1_t,
        [version, bChannelRepairPending, bTpcRepairPending]
    );
    same_layout!(
        nvmlRowRemapperHistogramValues_t,
        sys::nvmlRowRemapperHistogramValues_t,
        [max, high, partial, low, none]
    );
    same_layout!(
        nvmlEccSramUniqueUncorrectedErrorEntry_t,
        sys::nvmlEccSramUniqueUncorrectedErrorEntry_v1_t,
        [
            unit,
            location,
            sublocation,
            extlocation,
            address,
            isParity,
            count
        ]
    );
    same_layout!(
        nvmlEccSramUniqueUncorrectedErrorCounts_t,
        sys::nvmlEccSramUniqueUncorrectedErrorCounts_v1_t,
        [version, entryCount, entries]
    );
    same_layout!(
        nvmlEccSramErrorStatus_t,
        sys::nvmlEccSramErrorStatus_v1_t,
        [
            version,
            aggregateUncParity,
            aggregateUncSecDed,
            aggregateCor,
            volatileUncParity,
            volatileUncSecDed,
            volatileCor,
            aggregateUncBucketL2,
            aggregateUncBucketSm,
            aggregateUncBucketPcie,
            aggregateUncBucketMcu,
            aggregateUncBucketOther,
            bThresholdExceeded
        ]
    );
    same_layout!(
        nvmlPlatformInfo_t,
        sys::nvmlPlatformInfo_v2_t,
        [
            version,
            ibGuid,
            chassisSerialNumber,
            slotNumber,
            trayIndex,
            hostId,
            peerType,
            moduleId
        ]
    );
    same_layout!(
        nvmlTemperature_t,
        sys::nvmlTemperature_v1_t,
        [version, sensorType, temperature]
    );
    same_layout!(
        nvmlGpuFabricInfo_t,
        sys::nvmlGpuFabricInfo_t,
        [clusterUuid, status, cliqueId, state]
    );
    same_layout!(
        nvmlGpuFabricInfo_v2_t,
        sys::nvmlGpuFabricInfo_v2_t,
        [version, clusterUuid, status, cliqueId, state, healthMask]
    );
    same_layout!(
        nvmlGpuFabricInfo_v3_t,
        sys::nvmlGpuFabricInfo_v3_t,
        [
            version,
            clusterUuid,
            status,
            cliqueId,
            state,
            healthMask,
            healthSummary
        ]
    );
    same_layout!(
        nvmlViolationTime_t,
        sys::nvmlViolationTime_t,
        [referenceTime, violationTime]
    );
    same_layout!(nvmlValue_t, sys::nvmlValue_t, []);
    same_layout!(
        nvmlFieldValue_t,
        sys::nvmlFieldValue_t,
        [
            fieldId,
            scopeId,
            timestamp,
            latencyUsec,
            valueType,
            nvmlReturn,
            value
        ]
    );
    same_layout!(
        nvmlProcessInfo_t,
        sys::nvmlProcessInfo_t,
        [pid, usedGpuMemory, gpuInstanceId, computeInstanceId]
    );
    same_layout!(
        nvmlGpmSupport_t,
        sys::nvmlGpmSupport_t,
        [version, isSupportedDevice]
    );
    same_layout!(
        nvmlGpmMetricInfo_t,
        sys::nvmlGpmMetric_t__bindgen_ty_1,
        [shortName, longName, unit]
    );
    same_layout!(
        nvmlGpmMetric_t,
        sys::nvmlGpmMetric_t,
        [metricId, nvmlReturn, value, metricInfo]
    );
    same_layout!(
        nvmlGpmMetricsGet_t,
        sys::nvmlGpmMetricsGet_t,
        [version, numMetrics, sample1, sample2, metrics]
    );
    assert_eq!(
        NVML_GPM_METRIC_MAX,
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX as usize
    );
    assert_eq!(NVML_GPM_SUPPORT_VERSION, sys::NVML_GPM_SUPPORT_VERSION);
    assert_eq!(
        NVML_GPM_METRICS_GET_VERSION,
        sys::NVML_GPM_METRICS_GET_VERSION
    );
    assert_eq!(
        size_of::<nvmlGpmSample_t>(),
        size_of::<sys::nvmlGpmSample_t>()
    );
    assert_eq!(size_of::<nvmlDevice_t>(), size_of::<sys::nvmlDevice_t>());
    assert_eq!(size_of::<nvmlReturn_t>(), size_of::<sys::nvmlReturn_t>());
}

#[test]
fn return_codes_match_nvml_bindings() {
    let expected = [
        ("SUCCESS", sys::nvmlReturn_enum_NVML_SUCCESS),
        (
            "UNINITIALIZED",
            sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        ),
        (
            "INVALID_ARGUMENT",
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        ),
        (
            "NOT_SUPPORTED",
            sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        ),
        (
            "NO_PERMISSION",
            sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        ),
        (
            "ALREADY_INITIALIZED",
            sys::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED,
        ),
        ("NOT_FOUND", sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND),
        (
            "INSUFFICIENT_SIZE",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        ),
        (
            "INSUFFICIENT_POWER",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
        ),
        (
            "DRIVER_NOT_LOADED",
            sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        ),
        ("TIMEOUT", sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT),
        ("IRQ_ISSUE", sys::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE),
        (
            "LIBRARY_NOT_FOUND",
            sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND,
        ),
        (
            "FUNCTION_NOT_FOUND",
            sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
        ),
        (
            "CORRUPTED_INFOROM",
            sys::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM,
        ),
        ("GPU_IS_LOST", sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
        (
            "RESET_REQUIRED",
            sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
        ),
        (
            "OPERATING_SYSTEM",
            sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM,
        ),
        (
            "LIB_RM_VERSION_MISMATCH",
            sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        ),
        ("IN_USE", sys::nvmlReturn_enum_NVML_ERROR_IN_USE),
        ("MEMORY", sys::nvmlReturn_enum_NVML_ERROR_MEMORY),
        ("NO_DATA", sys::nvmlReturn_enum_NVML_ERROR_NO_DATA),
        (
            "VGPU_ECC_NOT_SUPPORTED",
            sys::nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
        ),
        (
            "INSUFFICIENT_RESOURCES",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        ),
        (
            "FREQ_NOT_SUPPORTED",
            sys::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED,
        ),
        (
            "ARGUMENT_VERSION_MISMATCH",
            sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        ),
        ("UNKNOWN", sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN),
    ];
    assert_eq!(RETURN_CODES.len(), expected.len());
    for (name, code) in expected {
        assert_eq!(return_code_by_name(name), Some(code), "{name}");
        assert_eq!(return_code_name(code), Some(name));
    }
    assert_eq!(
        NVML_MEMORY_V2,
        (size_of::<sys::nvmlMemory_v2_t>() as u32) | (2 << 24)
    );
}

#[test]
fn error_strings_are_static_c_strings() {
    let text = |code| {
        unsafe { CStr::from_ptr(nvmlErrorString(code)) }
            .to_str()
            .unwrap()
    };
    assert_eq!(text(NVML_SUCCESS), "Success");
    assert_eq!(text(NVML_ERROR_GPU_IS_LOST), "GPU is lost");
    assert_eq!(text(NVML_ERROR_UNKNOWN), "Unknown Error");
    assert_eq!(text(12345), "Unknown Error");
    assert_eq!(nvmlErrorString(9), nvmlErrorString(9));
}

#[test]
fn symbol_lists_have_no_duplicates() {
    let mut all: Vec<&str> = all_symbols().collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n);
    assert_eq!(n, 90);
}

/// The symbol lists are the exports: every `fn nvml…` that exports.rs defines
/// (each through `export!` or `scalar!`) is listed once, and nothing else is.
#[test]
fn symbol_lists_are_what_exports_rs_defines() {
    let source = include_str!("exports.rs");
    let mut defined: Vec<&str> = source
        .split("fn ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| name.starts_with("nvml"))
        .collect();
    defined.sort_unstable();
    let mut listed: Vec<&str> = all_symbols().collect();
    listed.sort_unstable();
    assert_eq!(defined, listed);
}

#[test]
fn panics_become_unknown() {
    let code = guard(|| panic!("boom"));
    assert_eq!(code, NVML_ERROR_UNKNOWN);
    assert_eq!(guard(|| Ok(())), NVML_SUCCESS);
    assert_eq!(guard(|| Err(NVML_ERROR_NO_DATA)), NVML_ERROR_NO_DATA);
}

// ---------------------------------------------------------------------------
// Scenario parsing

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

#[test]
fn every_shipped_scenario_and_capture_parses() {
    let mut seen = 0;
    let captures = scenarios_dir().join("../captures");
    let files = std::fs::read_dir(scenarios_dir())
        .expect("tests/scenarios exists")
        .chain(std::fs::read_dir(captures).expect("tests/captures exists"));
    for entry in files {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let s = scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let description = s.description.as_deref().unwrap_or("");
        assert!(
            !description.trim().is_empty(),
            "{}: needs a description",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 9, "only {seen} scenarios and captures found");
}

#[test]
fn unknown_keys_are_rejected() {
    for bad in [
        "[system]\ndriver_versoin = \"1\"\n",
        "[[gpu]]\npower_usage = 1\n",
        "[[gpu]]\npci = { bus_id = \"0\", domain = 0, bus = 0, device = 0, pci_device_id = 0, pci_subsystem_id = 0, slot = 1 }\n",
        "[[gpu]]\nnvlinks = [ { active = true, errors = { replay = 0, crc = 1 } } ]\n",
        "bogus = 1\n",
    ] {
        assert!(scenario::parse(bad).is_err(), "accepted: {bad}");
    }
}

#[test]
fn parse_errors_are_one_line_with_a_line_number() {
    let e = scenario::parse("description = \"x\"\n\n[[gpu]]\ntemprature = 3\n").unwrap_err();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.starts_with("line 4:"), "{e}");
    assert!(e.contains("temprature"), "{e}");
}

#[test]
fn symbol_names_and_error_names_are_checked() {
    let bad = [
        "[[gpu]]\nerrors = { nvmlDeviceGetPowerUsag = \"UNKNOWN\" }\n",
        "[[gpu]]\nerrors = { nvmlDeviceGetPowerUsage = \"NVML_ERROR_UNKNOWN\" }\n",
        "[[gpu]]\nerrors = { nvmlDeviceGetPowerUsage = \"SUCCESS\" }\n",
        "[[gpu]]\nhang = [\"nvmlSystemGetDriverVersion\"]\n",
        "[[gpu]]\ndelays_ms = { nvmlInit_v2 = 5 }\n",
        "[system]\nerrors = { nvmlDeviceGetName = \"UNKNOWN\" }\n",
        "delays_us = { nvmlFoo = 1 }\n",
        "missing_symbols = [\"nvmlDeviceGetPowerUsage2\"]\n",
        "[[gpu]]\nfield_values = { \"82:x\" = 1 }\n",
        "[[gpu]]\nmig_devices = [ { slot = 8, uuid = \"MIG-x\", gpu_instance_id = 1, compute_instance_id = 0 } ]\n",
        "[[gpu]]\nname = [65, 0, 66]\n",
    ];
    for text in bad {
        assert!(scenario::parse(text).is_err(), "accepted: {text}");
    }
    let good = "description = \"ok\"\nmissing_symbols = [\"nvmlDeviceGetTotalEnergyConsumption\"]\n\
                delays_us = { nvmlDeviceGetCount_v2 = 1, nvmlShutdown = 2 }\n\
                [system]\nerrors = { nvmlSystemGetDriverVersion = \"GPU_IS_LOST\" }\n\
                [[gpu]]\nname = [0xff, 0x41]\nerrors = { nvmlDeviceGetHandleByIndex_v2 = \"UNKNOWN\" }\n\
                field_values = { \"82\" = 45, \"138:3\" = 7 }\n";
    let s = scenario::parse(good).unwrap();
    assert_eq!(s.gpus[0].name.as_ref().unwrap().0, vec![0xff, 0x41]);
    assert_eq!(s.gpus[0].fields.get(&(138, Some(3))), Some(&7));
    assert_eq!(s.gpus[0].fields.get(&(82, None)), Some(&45));
}

#[test]
fn without_faults_keeps_only_the_values() {
    let text = "missing_symbols = [\"nvmlInit_v2\"]\ndelays_us = { nvmlShutdown = 2 }\n\
                [system]\ndriver_version = \"550\"\ninit_error = \"UNKNOWN\"\ninit_delay_ms = 3\n\
                init_hang = true\ndevice_count_error = \"UNKNOWN\"\n\
                errors = { nvmlSystemGetDriverVersion = \"UNKNOWN\" }\n\
                [[gpu]]\ntemperature = 40\nlost = true\nerrors = { nvmlDeviceGetName = \"UNKNOWN\" }\n\
                delays_ms = { nvmlDeviceGetName = 1 }\nhang = [\"nvmlDeviceGetName\"]\n";
    let s = scenario::parse(text).unwrap().without_faults();
    assert!(s.missing_symbols.is_empty() && s.delays_us.is_empty());
    let sys = &s.system;
    assert!(sys.init_error.is_none() && sys.init_delay_ms == 0 && !sys.init_hang);
    assert!(sys.device_count_error.is_none() && sys.errors.is_empty());
    assert_eq!(sys.driver_version.as_ref().unwrap().0, b"550");
    let g = &s.gpus[0];
    assert!(!g.lost && g.errors.is_empty() && g.delays_ms.is_empty() && g.hang.is_empty());
    assert_eq!(g.temperature, Some(40));
}

// ---------------------------------------------------------------------------
// Calls through the exports

static LOCK: Mutex<()> = Mutex::new(());
static FILES: AtomicUsize = AtomicUsize::new(0);

/// Holds the global lock; on drop, shuts the library fully down.
struct Session {
    _lock: MutexGuard<'static, ()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        while unsafe { nvmlShutdown() } == NVML_SUCCESS {}
    }
}

fn lock() -> Session {
    let lock = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let session = Session { _lock: lock };
    while unsafe { nvmlShutdown() } == NVML_SUCCESS {}
    session
}

fn write_scenario(text: &str) -> PathBuf {
    let n = FILES.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("fake-nvml-unit-{}-{n}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

/// Locks, points the env var at `text`, and runs `nvmlInit_v2`.
fn start(text: &str) -> Session {
    let session = lock();
    std::env::set_var(SCENARIO_ENV, write_scenario(text));
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_SUCCESS);
    session
}

const TWO_GPUS: &str = r#"
description = "unit test: one H100 with MIG and one bare GPU"
[system]
driver_version = "550.90.07"
nvml_version = "12.550.90.07"
cuda_driver_version = 12040

[[gpu]]
uuid = "GPU-11111111-2222-3333-4444-555555555555"
name = "NVIDIA H100 80GB HBM3"
serial = "1650123456789"
vbios_version = "96.00.74.00.01"
brand = 2
architecture = 9
minor_number = 0
pci = { bus_id = "00000000:18:00.0", domain = 0, bus = 0x18, device = 0, pci_device_id = 0x233010de, pci_subsystem_id = 0x16c110de }
utilization = { gpu = 87, memory = 45 }
memory = { total = 85520809984, reserved = 637534208, used = 42949672960, free = 41933602816 }
bar1 = { total = 137438953472, used = 52428800, free = 137386524672 }
temperature = 65
temperature_thresholds = { shutdown = 92, slowdown = 89 }
power_usage_mw = 412345
total_energy_mj = 123456789
power_limit_mw = 700000
enforced_power_limit_mw = 700000
default_power_limit_mw = 700000
power_limit_constraints_mw = { min = 200000, max = 700000 }
clocks_mhz = { graphics = 1980, sm = 1980, memory = 2619 }
max_clocks_mhz = { graphics = 1980, sm = 1980, memory = 2619, video = 1980 }
pstate = 0
clocks_event_reasons = 0x1
supported_clocks_event_reasons = 0x1ff
violations_ns = { power = 1000000, thermal = 0 }
pcie = { gen = 5, max_gen = 5, width = 16, max_width = 16, replay_counter = 0, tx_kbps = 1000, rx_kbps = 2000 }
ecc_mode = { current = true, pending = false }
ecc_errors = { volatile_corrected = 1, volatile_uncorrected = 2, aggregate_corrected = 3, aggregate_uncorrected = 4 }
retired_pages = { single_bit_ecc = 2, double_bit_ecc = 0, pending = true }
remapped_rows = { correctable = 1, uncorrectable = 0, pending = false, failure = true }
encoder = { utilization = 5, sampling_period_us = 167000, session_count = 1, average_fps = 30, average_latency_us = 900 }
decoder = { utilization = 6, sampling_period_us = 167000 }
persistence_mode = true
compute_mode = 0
mig_mode = { current = 1, pending = 1 }
nvlinks = [ { active = true, errors = { replay = 1, recovery = 2, crc_flit = 3, crc_data = 4 } }, { active = false } ]
field_values = { "82" = 45, "138:0" = 123456, "138" = 99 }
max_mig_device_count = 7
mig_devices = [
  { slot = 0, uuid = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", gpu_instance_id = 1, compute_instance_id = 0, memory = { total = 10737418240, reserved = 0, used = 1073741824, free = 9663676416 } },
  { slot = 2, uuid = "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee", gpu_instance_id = 2, compute_instance_id = 0 },
]
processes = [
  { pid = 4242, used_memory = 1073741824 },
  { pid = 4343, used_memory = 2147483648, gpu_instance_id = 1, compute_instance_id = 0 },
  { pid = 4444 },
]

[[gpu]]
name = "bare"
fan_speeds = [45, 47]
processes = []
"#;

unsafe fn get_str(
    f: impl Fn(*mut c_char, c_uint) -> nvmlReturn_t,
    len: usize,
) -> Result<Vec<u8>, nvmlReturn_t> {
    let mut buf = vec![0x55 as c_char; len];
    match f(buf.as_mut_ptr(), len as c_uint) {
        NVML_SUCCESS => Ok(CStr::from_ptr(buf.as_ptr()).to_bytes().to_vec()),
        code => Err(code),
    }
}

fn handle(index: u32) -> nvmlDevice_t {
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(index, &mut h) },
        NVML_SUCCESS
    );
    h
}

#[test]
fn calls_before_init_are_uninitialized() {
    let _s = lock();
    let mut n = 0;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    unsafe {
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_UNINITIALIZED);
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(0, &mut h),
            NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(
            nvmlDeviceGetPowerUsage(gpu_handle(0), &mut n),
            NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
        let v = get_str(|b, l| nvmlSystemGetDriverVersion(b, l), 80);
        assert_eq!(v, Err(NVML_ERROR_UNINITIALIZED));
    }
}

#[test]
fn init_fails_without_a_usable_scenario() {
    let _s = lock();
    std::env::remove_var(SCENARIO_ENV);
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_ERROR_UNKNOWN);
    std::env::set_var(SCENARIO_ENV, "/nonexistent/fake-nvml.toml");
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_ERROR_UNKNOWN);
    std::env::set_var(SCENARIO_ENV, write_scenario("[[gpu]]\nnot_a_key = 1\n"));
    assert_eq!(unsafe { nvmlInitWithFlags(0) }, NVML_ERROR_UNKNOWN);
    let mut n = 0;
    assert_eq!(
        unsafe { nvmlDeviceGetCount_v2(&mut n) },
        NVML_ERROR_UNINITIALIZED
    );
}

#[test]
fn init_errors_and_delay() {
    let _s = lock();
    for (name, code) in [
        ("DRIVER_NOT_LOADED", 9),
        ("NO_PERMISSION", 4),
        ("LIB_RM_VERSION_MISMATCH", 18),
        ("UNKNOWN", 999),
    ] {
        let text = format!("[system]\ninit_error = \"{name}\"\ninit_delay_ms = 20\n");
        std::env::set_var(SCENARIO_ENV, write_scenario(&text));
        let t = Instant::now();
        assert_eq!(unsafe { nvmlInit_v2() }, code);
        assert!(t.elapsed() >= Duration::from_millis(20));
        let mut n = 0;
        assert_eq!(
            unsafe { nvmlDeviceGetCount_v2(&mut n) },
            NVML_ERROR_UNINITIALIZED
        );
    }
}

#[test]
fn init_is_reference_counted_and_reinit_rereads() {
    let _s = lock();
    std::env::set_var(SCENARIO_ENV, write_scenario("[[gpu]]\n[[gpu]]\n"));
    let mut n = 0;
    unsafe {
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        assert_eq!(nvmlInitWithFlags(1), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(n, 2);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_UNINITIALIZED);
        std::env::set_var(SCENARIO_ENV, write_scenario("[[gpu]]\n[[gpu]]\n[[gpu]]\n"));
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(n, 3);
    }
}

#[test]
fn round_trip_system_and_identity() {
    let _s = start(TWO_GPUS);
    unsafe {
        assert_eq!(
            get_str(|b, l| nvmlSystemGetDriverVersion(b, l), 80).unwrap(),
            b"550.90.07"
        );
        assert_eq!(
            get_str(|b, l| nvmlSystemGetNVMLVersion(b, l), 80).unwrap(),
            b"12.550.90.07"
        );
        let mut cuda = 0;
        assert_eq!(nvmlSystemGetCudaDriverVersion_v2(&mut cuda), NVML_SUCCESS);
        assert_eq!(cuda, 12040);
        assert_eq!(nvmlSystemGetCudaDriverVersion(&mut cuda), NVML_SUCCESS);
        let mut n = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(n, 2);
        let h0 = handle(0);
        let h1 = handle(1);
        assert_ne!(h0, h1);
        assert_eq!(h0, handle(0));
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(2, &mut h),
            NVML_ERROR_INVALID_ARGUMENT
        );

        assert_eq!(
            get_str(|b, l| nvmlDeviceGetName(h0, b, l), 96).unwrap(),
            b"NVIDIA H100 80GB HBM3"
        );
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetUUID(h0, b, l), 80).unwrap(),
            b"GPU-11111111-2222-3333-4444-555555555555"
        );
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetSerial(h0, b, l), 30).unwrap(),
            b"1650123456789"
        );
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetVbiosVersion(h0, b, l), 32).unwrap(),
            b"96.00.74.00.01"
        );
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetSerial(h1, b, l), 30),
            Err(NVML_ERROR_NOT_SUPPORTED)
        );

        let mut pci: nvmlPciInfo_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetPciInfo_v3(h0, &mut pci), NVML_SUCCESS);
        assert_eq!(
            CStr::from_ptr(pci.busId.as_ptr()).to_bytes(),
            b"00000000:18:00.0"
        );
        assert_eq!(
            CStr::from_ptr(pci.busIdLegacy.as_ptr()).to_bytes(),
            b"0000:18:00.0"
        );
        assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x18, 0));
        assert_eq!(pci.pciDeviceId, 0x233010de);
        assert_eq!(pci.pciSubSystemId, 0x16c110de);
        assert_eq!(
            nvmlDeviceGetPciInfo_v3(h1, &mut pci),
            NVML_ERROR_NOT_SUPPORTED
        );

        let mut v = 0;
        assert_eq!(nvmlDeviceGetBrand(h0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 2);
        assert_eq!(nvmlDeviceGetArchitecture(h0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 9);
        assert_eq!(nvmlDeviceGetMinorNumber(h0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 0);
        assert_eq!(nvmlDeviceGetBrand(h1, &mut v), NVML_ERROR_NOT_SUPPORTED);
    }
}

#[test]
fn round_trip_metrics() {
    let _s = start(TWO_GPUS);
    let (h0, h1) = (handle(0), handle(1));
    unsafe {
        let mut u = nvmlUtilization_t::default();
        assert_eq!(nvmlDeviceGetUtilizationRates(h0, &mut u), NVML_SUCCESS);
        assert_eq!((u.gpu, u.memory), (87, 45));

        let mut m1 = nvmlMemory_t::default();
        assert_eq!(nvmlDeviceGetMemoryInfo(h0, &mut m1), NVML_SUCCESS);
        assert_eq!(m1.total, 85520809984);
        assert_eq!(m1.free, 41933602816);
        assert_eq!(m1.used, 42949672960 + 637534208);

        let mut m2 = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            ..Default::default()
        };
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(h0, &mut m2), NVML_SUCCESS);
        assert_eq!(
            (m2.total, m2.reserved, m2.used, m2.free),
            (85520809984, 637534208, 42949672960, 41933602816)
        );
        m2.version = 1;
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(h0, &mut m2),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );

        let mut bar1 = nvmlBAR1Memory_t::default();
        assert_eq!(nvmlDeviceGetBAR1MemoryInfo(h0, &mut bar1), NVML_SUCCESS);
        assert_eq!(bar1.bar1Used, 52428800);

        let mut v: c_uint = 0;
        assert_eq!(nvmlDeviceGetTemperature(h0, 0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 65);
        assert_eq!(
            nvmlDeviceGetTemperature(h0, 1, &mut v),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetTemperatureThreshold(h0, 0, &mut v),
            NVML_SUCCESS
        );
        assert_eq!(v, 92);
        assert_eq!(
            nvmlDeviceGetTemperatureThreshold(h0, 1, &mut v),
            NVML_SUCCESS
        );
        assert_eq!(v, 89);
        assert_eq!(
            nvmlDeviceGetTemperatureThreshold(h0, 2, &mut v),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetTemperatureThreshold(h0, 8, &mut v),
            NVML_ERROR_INVALID_ARGUMENT
        );

        assert_eq!(nvmlDeviceGetPowerUsage(h0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 412345);
        assert_eq!(
            nvmlDeviceGetPowerUsage(h1, &mut v),
            NVML_ERROR_NOT_SUPPORTED
        );
        let mut e: c_ulonglong = 0;
        assert_eq!(
            nvmlDeviceGetTotalEnergyConsumption(h0, &mut e),
            NVML_SUCCESS
        );
        assert_eq!(e, 123456789);
        for f in [
            nvmlDeviceGetEnforcedPowerLimit,
            nvmlDeviceGetPowerManagementLimit,
            nvmlDeviceGetPowerManagementDefaultLimit,
        ] {
            assert_eq!(f(h0, &mut v), NVML_SUCCESS);
            assert_eq!(v, 700000);
        }
        let (mut lo, mut hi) = (0, 0);
        assert_eq!(
            nvmlDeviceGetPowerManagementLimitConstraints(h0, &mut lo, &mut hi),
            NVML_SUCCESS
        );
        assert_eq!((lo, hi), (200000, 700000));

        assert_eq!(nvmlDeviceGetClockInfo(h0, 1, &mut v), NVML_SUCCESS);
        assert_eq!(v, 1980);
        assert_eq!(
            nvmlDeviceGetClockInfo(h0, 3, &mut v),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetClockInfo(h0, 4, &mut v),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(nvmlDeviceGetMaxClockInfo(h0, 2, &mut v), NVML_SUCCESS);
        assert_eq!(v, 2619);
        assert_eq!(nvmlDeviceGetPerformanceState(h0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 0);

        assert_eq!(nvmlDeviceGetNumFans(h0, &mut v), NVML_ERROR_NOT_SUPPORTED);
        assert_eq!(nvmlDeviceGetFanSpeed(h0, &mut v), NVML_ERROR_NOT_SUPPORTED);
        assert_eq!(nvmlDeviceGetNumFans(h1, &mut v), NVML_SUCCESS);
        assert_eq!(v, 2);
        assert_eq!(nvmlDeviceGetFanSpeed(h1, &mut v), NVML_SUCCESS);
        assert_eq!(v, 45);
        assert_eq!(nvmlDeviceGetFanSpeed_v2(h1, 1, &mut v), NVML_SUCCESS);
        assert_eq!(v, 47);
        assert_eq!(
            nvmlDeviceGetFanSpeed_v2(h1, 2, &mut v),
            NVML_ERROR_INVALID_ARGUMENT
        );

        for f in [
            nvmlDeviceGetCurrentClocksEventReasons,
            nvmlDeviceGetCurrentClocksThrottleReasons,
        ] {
            assert_eq!(f(h0, &mut e), NVML_SUCCESS);
            assert_eq!(e, 1);
        }
        for f in [
            nvmlDeviceGetSupportedClocksEventReasons,
            nvmlDeviceGetSupportedClocksThrottleReasons,
        ] {
            assert_eq!(f(h0, &mut e), NVML_SUCCESS);
            assert_eq!(e, 0x1ff);
        }

        let mut vt = nvmlViolationTime_t::default();
        assert_eq!(nvmlDeviceGetViolationStatus(h0, 0, &mut vt), NVML_SUCCESS);
        assert_eq!(vt.violationTime, 1000000);
        assert_eq!(vt.referenceTime, VIOLATION_REFERENCE_TIME);
        assert_eq!(
            nvmlDeviceGetViolationStatus(h0, 2, &mut vt),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetViolationStatus(h0, 7, &mut vt),
            NVML_ERROR_INVALID_ARGUMENT
        );

        for (f, want) in [
            (
                nvmlDeviceGetCurrPcieLinkGeneration as unsafe extern "C" fn(_, _) -> _,
                5,
            ),
            (nvmlDeviceGetMaxPcieLinkGeneration, 5),
            (nvmlDeviceGetCurrPcieLinkWidth, 16),
            (nvmlDeviceGetMaxPcieLinkWidth, 16),
            (nvmlDeviceGetPcieReplayCounter, 0),
        ] {
            assert_eq!(f(h0, &mut v), NVML_SUCCESS);
            assert_eq!(v, want);
            assert_eq!(f(h1, &mut v), NVML_ERROR_NOT_SUPPORTED);
        }
        assert_eq!(nvmlDeviceGetPcieThroughput(h0, 0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 1000);
        assert_eq!(nvmlDeviceGetPcieThroughput(h0, 1, &mut v), NVML_SUCCESS);
        assert_eq!(v, 2000);
        assert_eq!(
            nvmlDeviceGetPcieThroughput(h0, 2, &mut v),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn round_trip_field_values() {
    let _s = start(TWO_GPUS);
    let h0 = handle(0);
    unsafe {
        let mut values: Vec<nvmlFieldValue_t> = (0..4)
            .map(|_| std::mem::zeroed::<nvmlFieldValue_t>())
            .collect();
        values[0].fieldId = 82;
        values[1].fieldId = 138;
        values[1].scopeId = 0;
        values[2].fieldId = 138;
        values[2].scopeId = 5;
        values[3].fieldId = 197;
        assert_eq!(
            nvmlDeviceGetFieldValues(h0, 4, values.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(values[0].nvmlReturn, NVML_SUCCESS);
        assert_eq!(values[0].valueType, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG);
        assert_eq!(values[0].value.ullVal, 45);
        assert!(values[0].timestamp > 0);
        assert_eq!(values[1].value.ullVal, 123456);
        // No "138:5" entry: the scope-less "138" answers.
        assert_eq!(values[2].value.ullVal, 99);
        assert_eq!(values[3].nvmlReturn, NVML_ERROR_NOT_SUPPORTED);
        assert_eq!(
            nvmlDeviceGetFieldValues(h0, 0, std::ptr::null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(
            nvmlDeviceGetFieldValues(h0, 1, std::ptr::null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetFieldValues(h0, -1, values.as_mut_ptr()),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn round_trip_ecc_modes_and_links() {
    let _s = start(TWO_GPUS);
    let (h0, h1) = (handle(0), handle(1));
    unsafe {
        let (mut cur, mut pend) = (9, 9);
        assert_eq!(nvmlDeviceGetEccMode(h0, &mut cur, &mut pend), NVML_SUCCESS);
        assert_eq!((cur, pend), (NVML_FEATURE_ENABLED, NVML_FEATURE_DISABLED));
        assert_eq!(
            nvmlDeviceGetEccMode(h1, &mut cur, &mut pend),
            NVML_ERROR_NOT_SUPPORTED
        );
        let mut e: c_ulonglong = 0;
        for (et, ct, want) in [(0, 0, 1), (1, 0, 2), (0, 1, 3), (1, 1, 4)] {
            assert_eq!(
                nvmlDeviceGetTotalEccErrors(h0, et, ct, &mut e),
                NVML_SUCCESS
            );
            assert_eq!(e, want);
        }
        assert_eq!(
            nvmlDeviceGetTotalEccErrors(h0, 2, 0, &mut e),
            NVML_ERROR_INVALID_ARGUMENT
        );

        let mut count: c_uint = 0;
        let mut addrs = [0 as c_ulonglong; 4];
        let mut stamps = [0 as c_ulonglong; 4];
        assert_eq!(
            nvmlDeviceGetRetiredPages(h0, 0, &mut count, addrs.as_mut_ptr()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        count = 4;
        assert_eq!(
            nvmlDeviceGetRetiredPages_v2(
                h0,
                0,
                &mut count,
                addrs.as_mut_ptr(),
                stamps.as_mut_ptr()
            ),
            NVML_SUCCESS
        );
        assert_eq!(count, 2);
        assert_ne!(addrs[0], addrs[1]);
        assert!(stamps[0] > 0 && stamps[0] < stamps[1]);
        count = 0;
        assert_eq!(
            nvmlDeviceGetRetiredPages(h0, 1, &mut count, std::ptr::null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(count, 0);
        let mut pending = 0;
        assert_eq!(
            nvmlDeviceGetRetiredPagesPendingStatus(h0, &mut pending),
            NVML_SUCCESS
        );
        assert_eq!(pending, NVML_FEATURE_ENABLED);

        let (mut c, mut u, mut p, mut f) = (9, 9, 9, 9);
        assert_eq!(
            nvmlDeviceGetRemappedRows(h0, &mut c, &mut u, &mut p, &mut f),
            NVML_SUCCESS
        );
        assert_eq!((c, u, p, f), (1, 0, 0, 1));
        assert_eq!(
            nvmlDeviceGetRemappedRows(h1, &mut c, &mut u, &mut p, &mut f),
            NVML_ERROR_NOT_SUPPORTED
        );

        let (mut a, mut b, mut z) = (0, 0, 0);
        assert_eq!(
            nvmlDeviceGetEncoderUtilization(h0, &mut a, &mut b),
            NVML_SUCCESS
        );
        assert_eq!((a, b), (5, 167000));
        assert_eq!(
            nvmlDeviceGetDecoderUtilization(h0, &mut a, &mut b),
            NVML_SUCCESS
        );
        assert_eq!((a, b), (6, 167000));
        assert_eq!(
            nvmlDeviceGetEncoderStats(h0, &mut a, &mut b, &mut z),
            NVML_SUCCESS
        );
        assert_eq!((a, b, z), (1, 30, 900));
        assert_eq!(nvmlDeviceGetPersistenceMode(h0, &mut a), NVML_SUCCESS);
        assert_eq!(a, NVML_FEATURE_ENABLED);
        assert_eq!(nvmlDeviceGetComputeMode(h0, &mut a), NVML_SUCCESS);
        assert_eq!(a, 0);
        assert_eq!(nvmlDeviceGetMigMode(h0, &mut a, &mut b), NVML_SUCCESS);
        assert_eq!((a, b), (1, 1));

        assert_eq!(nvmlDeviceGetNvLinkState(h0, 0, &mut a), NVML_SUCCESS);
        assert_eq!(a, NVML_FEATURE_ENABLED);
        assert_eq!(nvmlDeviceGetNvLinkState(h0, 1, &mut a), NVML_SUCCESS);
        assert_eq!(a, NVML_FEATURE_DISABLED);
        assert_eq!(
            nvmlDeviceGetNvLinkState(h0, 2, &mut a),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetNvLinkState(h1, 0, &mut a),
            NVML_ERROR_NOT_SUPPORTED
        );
        for (counter, want) in [(0, 1), (1, 2), (2, 3), (3, 4)] {
            assert_eq!(
                nvmlDeviceGetNvLinkErrorCounter(h0, 0, counter, &mut e),
                NVML_SUCCESS
            );
            assert_eq!(e, want);
        }
        assert_eq!(
            nvmlDeviceGetNvLinkErrorCounter(h0, 1, 0, &mut e),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetNvLinkErrorCounter(h0, 0, 9, &mut e),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn processes_follow_the_sizing_protocol() {
    let _s = start(TWO_GPUS);
    let (h0, h1) = (handle(0), handle(1));
    unsafe {
        let mut count: c_uint = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h0, &mut count, std::ptr::null_mut()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 3);
        let mut infos = [nvmlProcessInfo_t::default(); 8];
        count = 2;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h0, &mut count, infos.as_mut_ptr()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 3);
        count = 8;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h0, &mut count, infos.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(count, 3);
        assert_eq!(infos[0].pid, 4242);
        assert_eq!(infos[0].usedGpuMemory, 1073741824);
        assert_eq!(infos[0].gpuInstanceId, u32::MAX);
        assert_eq!(infos[1].gpuInstanceId, 1);
        assert_eq!(infos[1].computeInstanceId, 0);
        assert_eq!(infos[2].usedGpuMemory, NVML_VALUE_NOT_AVAILABLE_ULL);
        count = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h1, &mut count, std::ptr::null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(count, 0);
    }
}

#[test]
fn strings_honour_the_buffer_length() {
    let _s = start(TWO_GPUS);
    let h0 = handle(0);
    let name = b"NVIDIA H100 80GB HBM3";
    unsafe {
        // Exactly value + NUL fits; one byte less does not.
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetName(h0, b, l), name.len() + 1).unwrap(),
            name
        );
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetName(h0, b, l), name.len()),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(
            get_str(|b, l| nvmlSystemGetDriverVersion(b, l), 9),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(
            get_str(|b, l| nvmlSystemGetDriverVersion(b, l), 10).unwrap(),
            b"550.90.07"
        );
        let mut buf = [0x55 as c_char; 8];
        assert_eq!(
            nvmlDeviceGetUUID(h0, buf.as_mut_ptr(), 8),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(buf, [0x55; 8], "nothing written on INSUFFICIENT_SIZE");
    }
}

#[test]
fn invalid_handles_and_null_pointers() {
    let _s = start(TWO_GPUS);
    let h0 = handle(0);
    let mut v = 0;
    let mut local = 0u8;
    unsafe {
        let bogus = [
            std::ptr::null_mut(),
            (&mut local as *mut u8).cast::<nvmlDevice_st>(),
            gpu_handle(2),
            mig_handle(0, 1),
            mig_handle(1, 0),
        ];
        for h in bogus {
            assert_eq!(
                nvmlDeviceGetPowerUsage(h, &mut v),
                NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetUUID(h, [0; 80].as_mut_ptr(), 80),
                NVML_ERROR_INVALID_ARGUMENT
            );
        }
        let null = std::ptr::null_mut();
        assert_eq!(nvmlDeviceGetCount_v2(null), NVML_ERROR_INVALID_ARGUMENT);
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(0, null.cast()),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetPowerUsage(h0, null),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetName(h0, null.cast(), 64),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlSystemGetDriverVersion(null.cast(), 64),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(h0, null.cast()),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetEccMode(h0, &mut v, null),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h0, null, null.cast()),
            NVML_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn mig_handles() {
    let _s = start(TWO_GPUS);
    let (h0, h1) = (handle(0), handle(1));
    unsafe {
        let mut count = 0;
        assert_eq!(nvmlDeviceGetMaxMigDeviceCount(h0, &mut count), NVML_SUCCESS);
        assert_eq!(count, 7);
        let mut m0: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h0, 0, &mut m0),
            NVML_SUCCESS
        );
        let mut m2: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h0, 2, &mut m2),
            NVML_SUCCESS
        );
        assert!(m0 != m2 && m0 != h0 && m0 != h1);
        let mut m: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h0, 1, &mut m),
            NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h0, 7, &mut m),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h1, 0, &mut m),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(m0, 0, &mut m),
            NVML_ERROR_NOT_SUPPORTED
        );

        let mut is_mig = 9;
        assert_eq!(nvmlDeviceIsMigDeviceHandle(m0, &mut is_mig), NVML_SUCCESS);
        assert_eq!(is_mig, 1);
        assert_eq!(nvmlDeviceIsMigDeviceHandle(h0, &mut is_mig), NVML_SUCCESS);
        assert_eq!(is_mig, 0);
        let mut id = 0;
        assert_eq!(nvmlDeviceGetGpuInstanceId(m2, &mut id), NVML_SUCCESS);
        assert_eq!(id, 2);
        assert_eq!(nvmlDeviceGetComputeInstanceId(m2, &mut id), NVML_SUCCESS);
        assert_eq!(id, 0);
        assert_eq!(
            nvmlDeviceGetGpuInstanceId(h0, &mut id),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetComputeInstanceId(h0, &mut id),
            NVML_ERROR_INVALID_ARGUMENT
        );
        let mut parent: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m0, &mut parent),
            NVML_SUCCESS
        );
        assert_eq!(parent, h0);
        assert_eq!(
            nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h0, &mut parent),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetUUID(m0, b, l), 80).unwrap(),
            b"MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
        );
        let mut mem = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            ..Default::default()
        };
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(m0, &mut mem), NVML_SUCCESS);
        assert_eq!(mem.total, 10737418240);
        let mut mem1 = nvmlMemory_t::default();
        assert_eq!(nvmlDeviceGetMemoryInfo(m0, &mut mem1), NVML_SUCCESS);
        assert_eq!(mem1.used, 1073741824);
        assert_eq!(
            nvmlDeviceGetMemoryInfo(m2, &mut mem1),
            NVML_ERROR_NOT_SUPPORTED
        );
        let mut v = 0;
        assert_eq!(
            nvmlDeviceGetPowerUsage(m0, &mut v),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            get_str(|b, l| nvmlDeviceGetName(m0, b, l), 96),
            Err(NVML_ERROR_NOT_SUPPORTED)
        );
    }
}

const FAULTS: &str = r#"
description = "unit test: faults"
delays_us = { nvmlDeviceGetTemperature = 30000 }
[system]
driver_version = "550.90.07"
device_count_error = "TIMEOUT"
errors = { nvmlSystemGetDriverVersion = "NO_PERMISSION" }

[[gpu]]
name = "ok"
temperature = 50
power_usage_mw = 100000
processes = []
delays_ms = { nvmlDeviceGetPowerUsage = 40, nvmlDeviceGetTemperature = 20 }
errors = { nvmlDeviceGetPowerUsage = "UNKNOWN", nvmlDeviceGetHandleByIndex_v2 = "GPU_IS_LOST" }

[[gpu]]
name = "lost"
power_usage_mw = 100000
temperature = 50
lost = true
errors = { nvmlDeviceGetTemperature = "NO_DATA" }
hang = ["nvmlDeviceGetTemperature", "nvmlDeviceGetName"]
mig_devices = [ { slot = 0, uuid = "MIG-x", gpu_instance_id = 1, compute_instance_id = 0 } ]
"#;

#[test]
fn system_errors() {
    let _s = start(FAULTS);
    unsafe {
        let mut n = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_TIMEOUT);
        assert_eq!(
            get_str(|b, l| nvmlSystemGetDriverVersion(b, l), 80),
            Err(NVML_ERROR_NO_PERMISSION)
        );
        assert_eq!(
            get_str(|b, l| nvmlSystemGetNVMLVersion(b, l), 80),
            Err(NVML_ERROR_NOT_SUPPORTED)
        );
    }
}

#[test]
fn precedence_delays_then_errors_then_lost() {
    let _s = start(FAULTS);
    unsafe {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // Per-device error on the handle lookup itself.
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(0, &mut h),
            NVML_ERROR_GPU_IS_LOST
        );
        // A lost GPU still hands out its handle.
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut h), NVML_SUCCESS);
        let (ok, lost) = (gpu_handle(0), h);

        let mut v = 0;
        let t = Instant::now();
        assert_eq!(nvmlDeviceGetPowerUsage(ok, &mut v), NVML_ERROR_UNKNOWN);
        assert!(
            t.elapsed() >= Duration::from_millis(40),
            "delay before the error"
        );

        // Global (30 ms) and per-device (20 ms) delays add up, then the value.
        let t = Instant::now();
        assert_eq!(nvmlDeviceGetTemperature(ok, 0, &mut v), NVML_SUCCESS);
        assert_eq!(v, 50);
        assert!(t.elapsed() >= Duration::from_millis(50));

        assert_eq!(
            nvmlDeviceGetPowerUsage(lost, &mut v),
            NVML_ERROR_GPU_IS_LOST
        );
        let mut m: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(lost, 0, &mut m),
            NVML_ERROR_GPU_IS_LOST
        );
        let mut count = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(ok, &mut count, std::ptr::null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(lost, &mut count, std::ptr::null_mut()),
            NVML_ERROR_GPU_IS_LOST
        );
    }
}

#[test]
fn precedence_plan_puts_hang_first() {
    let s = scenario::parse(FAULTS).unwrap();
    // Hang beats the error and `lost` (the call would never return).
    let p = plan(&s, 1, "nvmlDeviceGetTemperature", true);
    assert!(p.hang);
    assert_eq!(p.delay, Duration::from_micros(30000));
    assert_eq!(p.error, Some(NVML_ERROR_NO_DATA));
    assert!(plan(&s, 1, "nvmlDeviceGetName", true).hang);
    // The errors map beats `lost`; `lost` beats the value.
    let p = plan(&s, 1, "nvmlDeviceGetPowerUsage", true);
    assert!(!p.hang);
    assert_eq!(p.error, Some(NVML_ERROR_GPU_IS_LOST));
    // Handle lookups ignore `lost`.
    assert_eq!(
        plan(&s, 1, "nvmlDeviceGetHandleByIndex_v2", false).error,
        None
    );
    let p = plan(&s, 0, "nvmlDeviceGetPowerUsage", true);
    assert_eq!(p.delay, Duration::from_millis(40));
    assert_eq!(p.error, Some(NVML_ERROR_UNKNOWN));
    assert!(!plan(&s, 0, "nvmlDeviceGetTemperature", true).hang);
}

#[test]
fn every_device_symbol_can_be_configured() {
    // Each device symbol is accepted in errors, delays_ms and hang.
    for sym in DEVICE_SYMBOLS {
        let text = format!(
            "[[gpu]]\nerrors = {{ {sym} = \"UNKNOWN\" }}\ndelays_ms = {{ {sym} = 1 }}\nhang = [\"{sym}\"]\n"
        );
        scenario::parse(&text).unwrap_or_else(|e| panic!("{sym}: {e}"));
    }
}

#[test]
fn concurrent_calls_from_many_threads() {
    let _s = start(TWO_GPUS);
    std::thread::scope(|scope| {
        for t in 0..8 {
            scope.spawn(move || {
                for _ in 0..500 {
                    let h = handle(t % 2);
                    let mut v = 0;
                    let code = unsafe { nvmlDeviceGetPowerUsage(h, &mut v) };
                    if t % 2 == 0 {
                        assert_eq!((code, v), (NVML_SUCCESS, 412345));
                    } else {
                        assert_eq!(code, NVML_ERROR_NOT_SUPPORTED);
                    }
                    let name = unsafe { get_str(|b, l| nvmlDeviceGetName(h, b, l), 96) };
                    assert!(name.is_ok());
                }
            });
        }
    });
}

const SAMPLED: &str = r#"
description = "unit test: sample buffers"
[[gpu]]
samples = { period_us = 100, buffer = 5, gpu = [100, 0], gaps = [ { from_us = 250, to_us = 450 } ], resets_us = [50], duplicate_last = true }
processes = [ { pid = 7, sm = [0, 30] }, { pid = 8 } ]
"#;

#[test]
fn sample_buffers_follow_the_clock_gaps_resets_and_lastseen() {
    let buffers = scenario::parse(SAMPLED)
        .unwrap()
        .gpus
        .remove(0)
        .samples
        .unwrap();
    // Sample times are multiples of the period; none in the gap; none at or
    // before the reset; the newest five, the last one twice.
    assert_eq!(buffers.timestamps(1000), [600, 700, 800, 900, 1000, 1000]);
    assert_eq!(buffers.timestamps(520), [100, 200, 500, 500]);
    assert_eq!(buffers.timestamps(40), [0, 0]);

    let _s = start(SAMPLED);
    let h = handle(0);
    std::env::set_var(scenario::CLOCK_ENV, "520");
    unsafe {
        let mut kind: nvmlValueType_t = 9;
        let mut count: c_uint = 0;
        let none = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetSamples(h, 1, 0, &mut kind, &mut count, none),
            NVML_SUCCESS
        );
        assert_eq!((kind, count), (1, 4));
        let mut buf = [nvmlSample_t {
            timeStamp: 0,
            sampleValue: nvmlValue_t { ullVal: 0 },
        }; 8];
        count = 2;
        assert_eq!(
            nvmlDeviceGetSamples(h, 1, 0, &mut kind, &mut count, buf.as_mut_ptr()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(count, 4);
        count = 8;
        assert_eq!(
            nvmlDeviceGetSamples(h, 1, 150, &mut kind, &mut count, buf.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(count, 3);
        let got: Vec<(u64, u32)> = buf[..3]
            .iter()
            .map(|s| (s.timeStamp, s.sampleValue.uiVal))
            .collect();
        assert_eq!(got, [(200, 100), (500, 0), (500, 0)]);
        assert_eq!(
            nvmlDeviceGetSamples(h, 1, 500, &mut kind, &mut count, buf.as_mut_ptr()),
            NVML_ERROR_NOT_FOUND
        );
        // An engine without a pattern, and other sampling types: not supported.
        assert_eq!(
            nvmlDeviceGetSamples(h, 2, 0, &mut kind, &mut count, none),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetSamples(h, 0, 0, &mut kind, &mut count, none),
            NVML_ERROR_NOT_SUPPORTED
        );

        // Per process: one entry, its mean over the samples since
        // lastSeenTimeStamp (100, 200, 500: 30, 0, 30), stamped with the
        // newest it was busy in, as the H200 answers.
        let mut entries = [nvmlProcessUtilizationSample_t::default(); 8];
        count = 8;
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, entries.as_mut_ptr(), &mut count, 0),
            NVML_SUCCESS
        );
        let got: Vec<(u32, u64, u32)> = entries[..count as usize]
            .iter()
            .map(|e| (e.pid, e.timeStamp, e.smUtil))
            .collect();
        assert_eq!(got, [(7, 500, 20)]);
        count = 8;
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, entries.as_mut_ptr(), &mut count, 150),
            NVML_SUCCESS
        );
        assert_eq!((count, entries[0].smUtil), (1, 15));
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, entries.as_mut_ptr(), &mut count, 500),
            NVML_ERROR_NOT_FOUND
        );
    }
    std::env::remove_var(scenario::CLOCK_ENV);
}

const RECORDED: &str = r#"
description = "unit test: a recording replayed"
recorded_at_us = 1000
[[gpu]]
processes = [ { pid = 7 } ]
[gpu.recording]
samples = { gpu = [[600, 50], [800, 40], [1200, 10]] }
process_utilization = [
    { last_seen_us = 0, entries = [[7, 800, 45, 1, 0, 0]] },
    { last_seen_us = 700, entries = [[7, 800, 40, 1, 0, 0]] },
]
"#;

#[test]
fn a_recording_answers_as_recorded_at_its_own_time() {
    let _s = start(RECORDED);
    let h = handle(0);
    unsafe {
        let mut kind: nvmlValueType_t = 9;
        let mut count: c_uint = 8;
        let mut buf = [nvmlSample_t {
            timeStamp: 0,
            sampleValue: nvmlValue_t { ullVal: 0 },
        }; 8];
        // "now" is the recording's time: the sample at 1200 is not taken yet.
        assert_eq!(
            nvmlDeviceGetSamples(h, 1, 0, &mut kind, &mut count, buf.as_mut_ptr()),
            NVML_SUCCESS
        );
        let got: Vec<(u64, u32)> = buf[..count as usize]
            .iter()
            .map(|s| (s.timeStamp, s.sampleValue.uiVal))
            .collect();
        assert_eq!(got, [(600, 50), (800, 40)]);
        assert_eq!(
            nvmlDeviceGetSamples(h, 2, 0, &mut kind, &mut count, buf.as_mut_ptr()),
            NVML_ERROR_NOT_SUPPORTED
        );
        let mut entries = [nvmlProcessUtilizationSample_t::default(); 8];
        // The answer asked with the latest lastSeenTimeStamp not after ours.
        for (last_seen, sm) in [(0, 45), (650, 45), (700, 40), (750, 40)] {
            count = 8;
            assert_eq!(
                nvmlDeviceGetProcessUtilization(h, entries.as_mut_ptr(), &mut count, last_seen),
                NVML_SUCCESS
            );
            assert_eq!((count, entries[0].pid, entries[0].smUtil), (1, 7, sm));
        }
        count = 8;
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, entries.as_mut_ptr(), &mut count, 800),
            NVML_ERROR_NOT_FOUND
        );
    }
}

const WALL: &str = r#"
description = "unit test: sample buffers on the wall clock"
clock = "wall"
[[gpu]]
samples = { period_us = 1000, buffer = 4, gpu = [40] }
"#;

fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[test]
fn clock_wall_follows_the_system_clock_unless_the_variable_is_set() {
    use scenario::Clock;
    // The variable wins; else the scenario's clock; `fixed` is the default.
    assert_eq!(
        Clock::Fixed.now_us(None, 5, scenario::DEFAULT_CLOCK_US),
        Ok(scenario::DEFAULT_CLOCK_US)
    );
    assert_eq!(Clock::Wall.now_us(None, 5, 0), Ok(5));
    assert_eq!(Clock::Wall.now_us(Some(" 520 "), 5, 0), Ok(520));
    let why = Clock::Wall.now_us(Some("soon"), 5, 0).unwrap_err();
    assert!(why.contains(scenario::CLOCK_ENV), "{why}");
    assert_eq!(scenario::parse("").unwrap().clock, Clock::Fixed);
    assert!(scenario::parse("clock = \"lunar\"\n").is_err());

    let _s = start(WALL);
    std::env::remove_var(scenario::CLOCK_ENV);
    let h = handle(0);
    let read = |since: u64| unsafe {
        let mut kind: nvmlValueType_t = 0;
        let mut count: c_uint = 8;
        let mut buf = [nvmlSample_t {
            timeStamp: 0,
            sampleValue: nvmlValue_t { ullVal: 0 },
        }; 8];
        let code = nvmlDeviceGetSamples(h, 1, since, &mut kind, &mut count, buf.as_mut_ptr());
        let stamps: Vec<u64> = buf[..count as usize].iter().map(|s| s.timeStamp).collect();
        (code, stamps)
    };
    let before = wall_us();
    let (code, stamps) = read(0);
    let after = wall_us();
    assert_eq!(code, NVML_SUCCESS);
    // The newest sample is the last period boundary at or before "now".
    let newest = *stamps.last().unwrap();
    assert_eq!(
        stamps,
        [newest - 3000, newest - 2000, newest - 1000, newest]
    );
    assert!(
        before / 1000 * 1000 <= newest && newest <= after,
        "{before} {newest} {after}"
    );
    // Time passes between runs, so a later read finds new samples (with the
    // fixed clock it would answer NOT_FOUND).
    std::thread::sleep(Duration::from_millis(3));
    let (code, later) = read(newest);
    assert_eq!(code, NVML_SUCCESS);
    assert!(
        !later.is_empty() && later.iter().all(|&ts| ts > newest),
        "{later:?}"
    );
    // A test that sets the variable still controls the clock.
    std::env::set_var(scenario::CLOCK_ENV, "520000");
    assert_eq!(read(0).1, [517000, 518000, 519000, 520000]);
    std::env::remove_var(scenario::CLOCK_ENV);
}

#[test]
fn margin_jpeg_ofa_mig_name_and_derived_nvlink_fields() {
    let _s = start(
        r#"
description = "small families"
[[gpu]]
margin_temperature = -3
jpeg = { utilization = 23, sampling_period_us = 167000 }
ofa = { utilization = 4, sampling_period_us = 167000 }
mig_mode = { current = 1, pending = 1 }
mig_devices = [ { slot = 0, uuid = "MIG-a", name = "NVIDIA H100 80GB HBM3 MIG 1g.10gb", gpu_instance_id = 9, compute_instance_id = 0 } ]
nvlink_fields = true
nvlinks = [
  { active = true, errors = { replay = 1, recovery = 2, crc_flit = 3, crc_data = 4 }, tx_kib = 10, rx_kib = 20 },
  { active = false, errors = { replay = 10, recovery = 20, crc_flit = 30 }, tx_kib = 1 },
]
field_values = { "91" = 7 }
[[gpu]]
"#,
    );
    let (h0, h1) = (handle(0), handle(1));
    unsafe {
        let mut margin = nvmlMarginTemperature_t {
            version: NVML_MARGIN_TEMPERATURE_V1,
            marginTemperature: 0,
        };
        assert_eq!(
            nvmlDeviceGetMarginTemperature(h0, &mut margin),
            NVML_SUCCESS
        );
        assert_eq!(margin.marginTemperature, -3);
        margin.version = 1;
        assert_eq!(
            nvmlDeviceGetMarginTemperature(h0, &mut margin),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        margin.version = NVML_MARGIN_TEMPERATURE_V1;
        assert_eq!(
            nvmlDeviceGetMarginTemperature(h1, &mut margin),
            NVML_ERROR_NOT_SUPPORTED
        );
        let (mut percent, mut period) = (0, 0);
        assert_eq!(
            nvmlDeviceGetJpgUtilization(h0, &mut percent, &mut period),
            NVML_SUCCESS
        );
        assert_eq!((percent, period), (23, 167000));
        assert_eq!(
            nvmlDeviceGetOfaUtilization(h0, &mut percent, &mut period),
            NVML_SUCCESS
        );
        assert_eq!(percent, 4);
        assert_eq!(
            nvmlDeviceGetOfaUtilization(h1, &mut percent, &mut period),
            NVML_ERROR_NOT_SUPPORTED
        );
        let mut mig: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h0, 0, &mut mig),
            NVML_SUCCESS
        );
        assert_eq!(
            get_str(|buf, len| nvmlDeviceGetName(mig, buf, len), 96).unwrap(),
            b"NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        );

        // Derived from `nvlinks`; an explicit field value wins; a total only
        // where every link has the counter.
        let requests = [
            (91, 0, Some(7)),
            (165, 0, Some(1)),
            (165, 1, Some(0)),
            (161, 1, Some(10)),
            (162, 0, Some(2)),
            (138, 0, Some(10)),
            (139, 1, None),
            (52, 0, Some(11)),
            (59, 0, Some(22)),
            (38, 0, Some(33)),
            (45, 0, None),
        ];
        let mut values: Vec<nvmlFieldValue_t> = requests
            .iter()
            .map(|&(id, scope, _)| {
                let mut v = std::mem::zeroed::<nvmlFieldValue_t>();
                v.fieldId = id;
                v.scopeId = scope;
                v
            })
            .collect();
        assert_eq!(
            nvmlDeviceGetFieldValues(h0, values.len() as i32, values.as_mut_ptr()),
            NVML_SUCCESS
        );
        for (value, &(id, scope, expected)) in values.iter().zip(&requests) {
            match expected {
                Some(expected) => {
                    assert_eq!(value.nvmlReturn, NVML_SUCCESS, "{id}:{scope}");
                    assert_eq!(value.value.ullVal, expected, "{id}:{scope}");
                }
                None => assert_eq!(value.nvmlReturn, NVML_ERROR_NOT_SUPPORTED, "{id}:{scope}"),
            }
        }
    }
}

#[test]
fn gpm_samples_metrics_and_mig_instances() {
    const GPM: &str = r#"
description = "unit test: GPM on a GPU in MIG mode, none on the second"
[[gpu]]
mig_mode = { current = 1, pending = 1 }
gpm = { sm_active = 42.5, dram = nan, tensor = 130.0 }
mig_devices = [
  { slot = 0, uuid = "MIG-a", gpu_instance_id = 3, compute_instance_id = 0, gpm = { sm_active = 12.0 } },
  { slot = 1, uuid = "MIG-b", gpu_instance_id = 5, compute_instance_id = 0 },
]
[[gpu]]
errors = { nvmlGpmSampleGet = "IN_USE" }
"#;
    let _s = start(GPM);
    let supported = |h| {
        let mut support = nvmlGpmSupport_t {
            version: NVML_GPM_SUPPORT_VERSION,
            isSupportedDevice: 7,
        };
        let code = unsafe { nvmlGpmQueryDeviceSupport(h, &mut support) };
        (code, support.isSupportedDevice)
    };
    assert_eq!(supported(handle(0)), (NVML_SUCCESS, 1));
    assert_eq!(supported(handle(1)), (NVML_SUCCESS, 0));
    let mut wrong = nvmlGpmSupport_t::default();
    assert_eq!(
        unsafe { nvmlGpmQueryDeviceSupport(handle(0), &mut wrong) },
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    );

    let alloc = || {
        let mut sample: nvmlGpmSample_t = std::ptr::null_mut();
        assert_eq!(unsafe { nvmlGpmSampleAlloc(&mut sample) }, NVML_SUCCESS);
        sample
    };
    let live = crate::state::live_samples();
    let (a, b, c, d) = (alloc(), alloc(), alloc(), alloc());
    assert_eq!(crate::state::live_samples(), live + 4);
    let request = |first, second| {
        // SAFETY: plain data.
        let mut r: Box<nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
        r.version = NVML_GPM_METRICS_GET_VERSION;
        r.numMetrics = 4;
        r.sample1 = first;
        r.sample2 = second;
        for (m, id) in r.metrics.iter_mut().zip([2, 10, 5, 3]) {
            m.metricId = id;
        }
        r
    };
    // Samples not taken yet are invalid.
    let mut r = request(a, b);
    assert_eq!(
        unsafe { nvmlGpmMetricsGet(&mut *r) },
        NVML_ERROR_INVALID_ARGUMENT
    );
    unsafe {
        assert_eq!(nvmlGpmSampleGet(handle(0), a), NVML_SUCCESS);
        assert_eq!(nvmlGpmMigSampleGet(handle(0), 3, c), NVML_SUCCESS);
        assert_eq!(nvmlGpmSampleGet(handle(0), b), NVML_SUCCESS);
        assert_eq!(nvmlGpmMigSampleGet(handle(0), 3, d), NVML_SUCCESS);
        assert_eq!(
            nvmlGpmMigSampleGet(handle(0), 5, d),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlGpmMigSampleGet(handle(0), 9, d),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(nvmlGpmSampleGet(handle(1), a), NVML_ERROR_IN_USE);
    }
    let mut r = request(a, b);
    assert_eq!(unsafe { nvmlGpmMetricsGet(&mut *r) }, NVML_SUCCESS);
    let got: Vec<_> = r.metrics[..4]
        .iter()
        .map(|m| (m.nvmlReturn, m.value))
        .collect();
    assert_eq!(got[0], (NVML_SUCCESS, 42.5));
    assert!(got[1].0 == NVML_SUCCESS && got[1].1.is_nan());
    assert_eq!(got[2], (NVML_SUCCESS, 130.0));
    assert_eq!(got[3].0, NVML_ERROR_NOT_SUPPORTED);
    // Per GPU instance.
    let mut r = request(c, d);
    assert_eq!(unsafe { nvmlGpmMetricsGet(&mut *r) }, NVML_SUCCESS);
    assert_eq!(
        (r.metrics[0].nvmlReturn, r.metrics[0].value),
        (NVML_SUCCESS, 12.0)
    );
    // Samples of different targets, or in the wrong order, do not make a window.
    let mut r = request(a, d);
    assert_eq!(
        unsafe { nvmlGpmMetricsGet(&mut *r) },
        NVML_ERROR_INVALID_ARGUMENT
    );
    let mut r = request(b, a);
    assert_eq!(
        unsafe { nvmlGpmMetricsGet(&mut *r) },
        NVML_ERROR_INVALID_ARGUMENT
    );
    for sample in [a, b, c, d] {
        assert_eq!(unsafe { nvmlGpmSampleFree(sample) }, NVML_SUCCESS);
    }
    assert_eq!(unsafe { nvmlGpmSampleFree(a) }, NVML_ERROR_INVALID_ARGUMENT);
    assert_eq!(crate::state::live_samples(), live);
}

#[test]
fn repair_status_remapper_histogram_sram_ecc_and_platform_info() {
    let _s = start(
        r#"
description = "health of the newest drivers"
[[gpu]]
repair_status = { channel = true, tpc = false }
row_remapper_histogram = { max = 10, high = 1, partial = 2, low = 3, none = 4 }
sram_ecc = { aggregate_unc_sec_ded = 3, aggregate_unc_bucket_l2 = 3, threshold_exceeded = true }
platform = { chassis_serial = "1821324000123", slot = 7, tray = 3, host_id = 1, module_id = 2, max_version = 1 }
memory_unrepairable = true
c2c_enabled = true
[[gpu]]
"#,
    );
    let (h0, h1) = (handle(0), handle(1));
    unsafe {
        let mut repair = nvmlRepairStatus_t {
            version: NVML_REPAIR_STATUS_V1,
            ..Default::default()
        };
        assert_eq!(nvmlDeviceGetRepairStatus(h0, &mut repair), NVML_SUCCESS);
        assert_eq!(
            (repair.bChannelRepairPending, repair.bTpcRepairPending),
            (1, 0)
        );
        repair.version = 1;
        assert_eq!(
            nvmlDeviceGetRepairStatus(h0, &mut repair),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        let mut histogram = nvmlRowRemapperHistogramValues_t::default();
        assert_eq!(
            nvmlDeviceGetRowRemapperHistogram(h0, &mut histogram),
            NVML_SUCCESS
        );
        assert_eq!((histogram.max, histogram.none), (10, 4));
        let mut sram = nvmlEccSramErrorStatus_t {
            version: NVML_ECC_SRAM_ERROR_STATUS_V1,
            ..Default::default()
        };
        assert_eq!(nvmlDeviceGetSramEccErrorStatus(h0, &mut sram), NVML_SUCCESS);
        assert_eq!((sram.aggregateUncSecDed, sram.aggregateCor), (3, 0));
        assert_eq!((sram.aggregateUncBucketL2, sram.bThresholdExceeded), (3, 1));
        // Version 2 is newer than this GPU's driver; version 1 answers.
        let mut platform = nvmlPlatformInfo_t {
            version: NVML_PLATFORM_INFO_V2,
            ..Default::default()
        };
        assert_eq!(
            nvmlDeviceGetPlatformInfo(h0, &mut platform),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        platform.version = NVML_PLATFORM_INFO_V1;
        assert_eq!(nvmlDeviceGetPlatformInfo(h0, &mut platform), NVML_SUCCESS);
        assert_eq!(&platform.chassisSerialNumber[..14], b"1821324000123\0");
        assert_eq!(
            (platform.slotNumber, platform.trayIndex, platform.moduleId),
            (7, 3, 2)
        );
        let mut unrepairable = nvmlUnrepairableMemoryStatus_t::default();
        assert_eq!(
            nvmlDeviceGetUnrepairableMemoryFlag_v1(h0, &mut unrepairable),
            NVML_SUCCESS
        );
        assert_eq!(unrepairable.bUnrepairableMemory, 1);
        let mut c2c = nvmlC2cModeInfo_t::default();
        assert_eq!(nvmlDeviceGetC2cModeInfoV(h0, &mut c2c), NVML_SUCCESS);
        assert_eq!(c2c.isC2cEnabled, 1);
        // A GPU without them.
        assert_eq!(
            nvmlDeviceGetC2cModeInfoV(h1, &mut c2c),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetUnrepairableMemoryFlag_v1(h1, &mut unrepairable),
            NVML_ERROR_NOT_SUPPORTED
        );
        repair.version = NVML_REPAIR_STATUS_V1;
        assert_eq!(
            nvmlDeviceGetRepairStatus(h1, &mut repair),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetRowRemapperHistogram(h1, &mut histogram),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetSramEccErrorStatus(h1, &mut sram),
            NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            nvmlDeviceGetPlatformInfo(h1, &mut platform),
            NVML_ERROR_NOT_SUPPORTED
        );
    }
}

#[test]
fn sram_locations_are_counted_then_listed() {
    let _s = start(
        r#"
description = "SRAM locations with uncorrected errors"
[[gpu]]
sram_unique = [{ unit = 1, address = 64, count = 3 }, { unit = 2, address = 8, is_parity = true, count = 1 }]
[[gpu]]
"#,
    );
    let (h0, h1) = (handle(0), handle(1));
    unsafe {
        let mut counts = nvmlEccSramUniqueUncorrectedErrorCounts_t {
            version: NVML_ECC_SRAM_UNIQUE_COUNTS_V1,
            entryCount: 0,
            entries: std::ptr::null_mut(),
        };
        let ask = nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts;
        assert_eq!(ask(h0, &mut counts), NVML_SUCCESS);
        assert_eq!(counts.entryCount, 2);
        let mut entries = [nvmlEccSramUniqueUncorrectedErrorEntry_t::default(); 2];
        counts.entries = entries.as_mut_ptr();
        counts.entryCount = 1;
        assert_eq!(ask(h0, &mut counts), NVML_ERROR_INSUFFICIENT_SIZE);
        assert_eq!(counts.entryCount, 2);
        assert_eq!(ask(h0, &mut counts), NVML_SUCCESS);
        assert_eq!(
            (entries[0].address, entries[0].isParity, entries[0].count),
            (64, 0, 3)
        );
        assert_eq!((entries[1].unit, entries[1].isParity), (2, 1));
        counts.version = 1;
        assert_eq!(ask(h0, &mut counts), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        counts.version = NVML_ECC_SRAM_UNIQUE_COUNTS_V1;
        assert_eq!(ask(h1, &mut counts), NVML_ERROR_NOT_SUPPORTED);
    }
}

#[test]
fn field_values_of_each_type() {
    let _s = start(
        r#"
description = "a field of each value type"
[[gpu]]
field_values = { "82" = 45 }
signed_field_values = { "193" = -8 }
double_field_values = { "270" = 0.0, "271:2" = 1.5 }
"#,
    );
    let h0 = handle(0);
    unsafe {
        let mut values: Vec<nvmlFieldValue_t> = (0..4)
            .map(|_| std::mem::zeroed::<nvmlFieldValue_t>())
            .collect();
        for (value, (id, scope)) in values
            .iter_mut()
            .zip([(82, 0), (193, 0), (270, 0), (271, 2)])
        {
            value.fieldId = id;
            value.scopeId = scope;
        }
        assert_eq!(
            nvmlDeviceGetFieldValues(h0, 4, values.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(values[0].valueType, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG);
        assert_eq!(values[1].valueType, NVML_VALUE_TYPE_SIGNED_INT);
        assert_eq!(values[1].value.siVal, -8);
        assert_eq!(values[2].valueType, NVML_VALUE_TYPE_DOUBLE);
        assert_eq!(values[2].value.dVal, 0.0);
        assert_eq!(
            (values[3].nvmlReturn, values[3].value.dVal),
            (NVML_SUCCESS, 1.5)
        );
    }
    let both = "description = \"x\"\n[[gpu]]\nfield_values = { \"82\" = 1 }\ndouble_field_values = { \"82\" = 1.0 }\n";
    let refused = crate::scenario::parse(both).map(|_| ()).unwrap_err();
    assert!(refused.contains("in another table"), "{refused}");
}
