//! C types and constants of the NVML API, as far as the fake needs them.
//!
//! The structs mirror `nvml.h` field for field; the crate's tests compare their
//! size, alignment and field offsets with the generated bindings that
//! `nvml-wrapper-sys` ships, so a layout drift is caught at `cargo test`.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_ulonglong, c_ushort, CStr};

/// `nvmlReturn_t`: every NVML entry point returns one of these codes.
pub type nvmlReturn_t = c_uint;
/// `nvmlEnableState_t`
pub type nvmlEnableState_t = c_uint;
/// `nvmlBrandType_t`
pub type nvmlBrandType_t = c_uint;
/// `nvmlDeviceArchitecture_t`
pub type nvmlDeviceArchitecture_t = c_uint;
/// `nvmlPstates_t`
pub type nvmlPstates_t = c_uint;
/// `nvmlComputeMode_t`
pub type nvmlComputeMode_t = c_uint;
/// `nvmlTemperatureSensors_t`
pub type nvmlTemperatureSensors_t = c_uint;
/// `nvmlTemperatureThresholds_t`
pub type nvmlTemperatureThresholds_t = c_uint;
/// `nvmlClockType_t`
pub type nvmlClockType_t = c_uint;
/// `nvmlPerfPolicyType_t`
pub type nvmlPerfPolicyType_t = c_uint;
/// `nvmlPcieUtilCounter_t`
pub type nvmlPcieUtilCounter_t = c_uint;
/// `nvmlMemoryErrorType_t`
pub type nvmlMemoryErrorType_t = c_uint;
/// `nvmlEccCounterType_t`
pub type nvmlEccCounterType_t = c_uint;
/// `nvmlPageRetirementCause_t`
pub type nvmlPageRetirementCause_t = c_uint;
/// `nvmlNvLinkErrorCounter_t`
pub type nvmlNvLinkErrorCounter_t = c_uint;
/// `nvmlValueType_t`
pub type nvmlValueType_t = c_uint;

/// Opaque target of a device handle.
#[repr(C)]
pub struct nvmlDevice_st {
    _unused: [u8; 0],
}
/// `nvmlDevice_t`: an opaque pointer.
pub type nvmlDevice_t = *mut nvmlDevice_st;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: nvmlReturn_t = 5;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_INSUFFICIENT_POWER: nvmlReturn_t = 8;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_IRQ_ISSUE: nvmlReturn_t = 11;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: nvmlReturn_t = 12;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_CORRUPTED_INFOROM: nvmlReturn_t = 14;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_RESET_REQUIRED: nvmlReturn_t = 16;
pub const NVML_ERROR_OPERATING_SYSTEM: nvmlReturn_t = 17;
pub const NVML_ERROR_LIB_RM_VERSION_MISMATCH: nvmlReturn_t = 18;
pub const NVML_ERROR_IN_USE: nvmlReturn_t = 19;
pub const NVML_ERROR_MEMORY: nvmlReturn_t = 20;
pub const NVML_ERROR_NO_DATA: nvmlReturn_t = 21;
pub const NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: nvmlReturn_t = 22;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
pub const NVML_ERROR_FREQ_NOT_SUPPORTED: nvmlReturn_t = 24;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// Every return code the fake knows: scenario name (NVML's name without the
/// `NVML_ERROR_` prefix), numeric value, and the text `nvmlErrorString` gives.
pub const RETURN_CODES: &[(&str, nvmlReturn_t, &CStr)] = &[
    ("SUCCESS", NVML_SUCCESS, c"Success"),
    ("UNINITIALIZED", NVML_ERROR_UNINITIALIZED, c"Uninitialized"),
    (
        "INVALID_ARGUMENT",
        NVML_ERROR_INVALID_ARGUMENT,
        c"Invalid Argument",
    ),
    ("NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED, c"Not Supported"),
    (
        "NO_PERMISSION",
        NVML_ERROR_NO_PERMISSION,
        c"Insufficient Permissions",
    ),
    (
        "ALREADY_INITIALIZED",
        NVML_ERROR_ALREADY_INITIALIZED,
        c"Already Initialized",
    ),
    ("NOT_FOUND", NVML_ERROR_NOT_FOUND, c"Not Found"),
    (
        "INSUFFICIENT_SIZE",
        NVML_ERROR_INSUFFICIENT_SIZE,
        c"Insufficient Size",
    ),
    (
        "INSUFFICIENT_POWER",
        NVML_ERROR_INSUFFICIENT_POWER,
        c"Insufficient External Power",
    ),
    (
        "DRIVER_NOT_LOADED",
        NVML_ERROR_DRIVER_NOT_LOADED,
        c"Driver Not Loaded",
    ),
    ("TIMEOUT", NVML_ERROR_TIMEOUT, c"Timeout"),
    (
        "IRQ_ISSUE",
        NVML_ERROR_IRQ_ISSUE,
        c"Interrupt request issue",
    ),
    (
        "LIBRARY_NOT_FOUND",
        NVML_ERROR_LIBRARY_NOT_FOUND,
        c"NVML Shared Library Not Found",
    ),
    (
        "FUNCTION_NOT_FOUND",
        NVML_ERROR_FUNCTION_NOT_FOUND,
        c"Function Not Found",
    ),
    (
        "CORRUPTED_INFOROM",
        NVML_ERROR_CORRUPTED_INFOROM,
        c"Corrupted infoROM",
    ),
    ("GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST, c"GPU is lost"),
    (
        "RESET_REQUIRED",
        NVML_ERROR_RESET_REQUIRED,
        c"GPU requires restart",
    ),
    (
        "OPERATING_SYSTEM",
        NVML_ERROR_OPERATING_SYSTEM,
        c"The operating system has blocked the request.",
    ),
    (
        "LIB_RM_VERSION_MISMATCH",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        c"RM has detected an NVML/RM version mismatch.",
    ),
    ("IN_USE", NVML_ERROR_IN_USE, c"In use by another client"),
    ("MEMORY", NVML_ERROR_MEMORY, c"Insufficient Memory"),
    ("NO_DATA", NVML_ERROR_NO_DATA, c"No data"),
    (
        "VGPU_ECC_NOT_SUPPORTED",
        NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
        c"The requested vgpu operation is not available on target device, because ECC is enabled",
    ),
    (
        "INSUFFICIENT_RESOURCES",
        NVML_ERROR_INSUFFICIENT_RESOURCES,
        c"Ran out of critical resources, other than memory",
    ),
    (
        "FREQ_NOT_SUPPORTED",
        NVML_ERROR_FREQ_NOT_SUPPORTED,
        c"Frequency not supported",
    ),
    (
        "ARGUMENT_VERSION_MISMATCH",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        c"Argument version mismatch",
    ),
    ("UNKNOWN", NVML_ERROR_UNKNOWN, c"Unknown Error"),
];

pub const NVML_FEATURE_DISABLED: nvmlEnableState_t = 0;
pub const NVML_FEATURE_ENABLED: nvmlEnableState_t = 1;

pub const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: nvmlValueType_t = 3;
/// `NVML_VALUE_TYPE_DOUBLE`
pub const NVML_VALUE_TYPE_DOUBLE: nvmlValueType_t = 0;
/// `NVML_VALUE_TYPE_SIGNED_INT`
pub const NVML_VALUE_TYPE_SIGNED_INT: nvmlValueType_t = 5;

/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned long long (used memory of a process
/// that NVML cannot attribute).
pub const NVML_VALUE_NOT_AVAILABLE_ULL: c_ulonglong = c_ulonglong::MAX;

/// `nvmlPciInfo_t` (the v3 layout: legacy bus id first, 32-byte bus id last).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

/// `nvmlMemory_t`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`: callers set `version` to [`NVML_MEMORY_V2`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`: the struct size with the version in the top byte.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

/// `nvmlMarginTemperature_v1_t`: callers set `version` to [`NVML_MARGIN_TEMPERATURE_V1`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlMarginTemperature_t {
    pub version: c_uint,
    pub marginTemperature: c_int,
}

/// `NVML_STRUCT_VERSION(MarginTemperature, 1)`.
pub const NVML_MARGIN_TEMPERATURE_V1: c_uint =
    (std::mem::size_of::<nvmlMarginTemperature_t>() as c_uint) | (1 << 24);

/// `nvmlRepairStatus_v1_t`: callers set `version` to [`NVML_REPAIR_STATUS_V1`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlRepairStatus_t {
    pub version: c_uint,
    pub bChannelRepairPending: c_uint,
    pub bTpcRepairPending: c_uint,
}

/// `NVML_STRUCT_VERSION(RepairStatus, 1)`.
pub const NVML_REPAIR_STATUS_V1: c_uint =
    (std::mem::size_of::<nvmlRepairStatus_t>() as c_uint) | (1 << 24);

/// `nvmlRowRemapperHistogramValues_t` (no version field).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlRowRemapperHistogramValues_t {
    pub max: c_uint,
    pub high: c_uint,
    pub partial: c_uint,
    pub low: c_uint,
    pub none: c_uint,
}

/// `nvmlEccSramErrorStatus_v1_t`: callers set `version` to
/// [`NVML_ECC_SRAM_ERROR_STATUS_V1`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlEccSramErrorStatus_t {
    pub version: c_uint,
    pub aggregateUncParity: c_ulonglong,
    pub aggregateUncSecDed: c_ulonglong,
    pub aggregateCor: c_ulonglong,
    pub volatileUncParity: c_ulonglong,
    pub volatileUncSecDed: c_ulonglong,
    pub volatileCor: c_ulonglong,
    pub aggregateUncBucketL2: c_ulonglong,
    pub aggregateUncBucketSm: c_ulonglong,
    pub aggregateUncBucketPcie: c_ulonglong,
    pub aggregateUncBucketMcu: c_ulonglong,
    pub aggregateUncBucketOther: c_ulonglong,
    pub bThresholdExceeded: c_uint,
}

/// `NVML_STRUCT_VERSION(EccSramErrorStatus, 1)`.
pub const NVML_ECC_SRAM_ERROR_STATUS_V1: c_uint =
    (std::mem::size_of::<nvmlEccSramErrorStatus_t>() as c_uint) | (1 << 24);

/// `nvmlEccSramUniqueUncorrectedErrorEntry_v1_t`: one SRAM location with
/// uncorrected errors.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlEccSramUniqueUncorrectedErrorEntry_t {
    pub unit: c_uint,
    pub location: c_uint,
    pub sublocation: c_uint,
    pub extlocation: c_uint,
    pub address: c_uint,
    pub isParity: c_uint,
    pub count: c_uint,
}

/// `nvmlEccSramUniqueUncorrectedErrorCounts_v1_t`: callers set `version` to
/// [`NVML_ECC_SRAM_UNIQUE_COUNTS_V1`] and `entryCount` to the room in
/// `entries` (NULL asks the count only).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlEccSramUniqueUncorrectedErrorCounts_t {
    pub version: c_uint,
    pub entryCount: c_uint,
    pub entries: *mut nvmlEccSramUniqueUncorrectedErrorEntry_t,
}

/// `NVML_STRUCT_VERSION(EccSramUniqueUncorrectedErrorCounts, 1)`.
pub const NVML_ECC_SRAM_UNIQUE_COUNTS_V1: c_uint =
    (std::mem::size_of::<nvmlEccSramUniqueUncorrectedErrorCounts_t>() as c_uint) | (1 << 24);

/// `nvmlPlatformInfo_v2_t`; `nvmlPlatformInfo_v1_t` has the same layout
/// (a rack GUID where v2 has the chassis serial number).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlPlatformInfo_t {
    pub version: c_uint,
    pub ibGuid: [u8; 16],
    pub chassisSerialNumber: [u8; 16],
    pub slotNumber: u8,
    pub trayIndex: u8,
    pub hostId: u8,
    pub peerType: u8,
    pub moduleId: u8,
}

/// `NVML_STRUCT_VERSION(PlatformInfo, 1)` and `(PlatformInfo, 2)`.
pub const NVML_PLATFORM_INFO_V1: c_uint =
    (std::mem::size_of::<nvmlPlatformInfo_t>() as c_uint) | (1 << 24);
pub const NVML_PLATFORM_INFO_V2: c_uint =
    (std::mem::size_of::<nvmlPlatformInfo_t>() as c_uint) | (2 << 24);

/// `nvmlUnrepairableMemoryStatus_v1_t` (R590; no version field, absent
/// from the bindings).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlUnrepairableMemoryStatus_t {
    pub bUnrepairableMemory: c_uint,
}

/// `nvmlC2cModeInfo_v1_t` (no version field).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlC2cModeInfo_t {
    pub isC2cEnabled: c_uint,
}

/// `nvmlTemperature_v1_t` (`nvmlDeviceGetTemperatureV`): callers set
/// `version` to [`NVML_TEMPERATURE_V1`] and `sensorType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlTemperature_t {
    pub version: c_uint,
    pub sensorType: nvmlTemperatureSensors_t,
    pub temperature: c_int,
}

/// `NVML_STRUCT_VERSION(Temperature, 1)`.
pub const NVML_TEMPERATURE_V1: c_uint =
    (std::mem::size_of::<nvmlTemperature_t>() as c_uint) | (1 << 24);

/// `nvmlGpuFabricInfo_t` (`nvmlDeviceGetGpuFabricInfo`, unversioned).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlGpuFabricInfo_t {
    pub clusterUuid: [u8; 16],
    pub status: nvmlReturn_t,
    pub cliqueId: c_uint,
    pub state: u8,
}

/// `nvmlGpuFabricInfo_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlGpuFabricInfo_v2_t {
    pub version: c_uint,
    pub clusterUuid: [u8; 16],
    pub status: nvmlReturn_t,
    pub cliqueId: c_uint,
    pub state: u8,
    pub healthMask: c_uint,
}

/// `nvmlGpuFabricInfo_v3_t` (`nvmlGpuFabricInfoV_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlGpuFabricInfo_v3_t {
    pub version: c_uint,
    pub clusterUuid: [u8; 16],
    pub status: nvmlReturn_t,
    pub cliqueId: c_uint,
    pub state: u8,
    pub healthMask: c_uint,
    pub healthSummary: u8,
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)`.
pub const NVML_GPU_FABRIC_INFO_V3: c_uint =
    (std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as c_uint) | (3 << 24);

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`.
pub const NVML_GPU_FABRIC_INFO_V2: c_uint =
    (std::mem::size_of::<nvmlGpuFabricInfo_v2_t>() as c_uint) | (2 << 24);

/// `nvmlBAR1Memory_t`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlBAR1Memory_t {
    pub bar1Total: c_ulonglong,
    pub bar1Free: c_ulonglong,
    pub bar1Used: c_ulonglong,
}

/// `nvmlUtilization_t`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlViolationTime_t`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlViolationTime_t {
    pub referenceTime: c_ulonglong,
    pub violationTime: c_ulonglong,
}

/// `nvmlValue_t`
#[repr(C)]
#[derive(Clone, Copy)]
pub union nvmlValue_t {
    pub dVal: f64,
    pub siVal: c_int,
    pub uiVal: c_uint,
    pub ulVal: c_ulong,
    pub ullVal: c_ulonglong,
    pub sllVal: i64,
    pub usVal: c_ushort,
}

/// `nvmlFieldValue_t`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlFieldValue_t {
    pub fieldId: c_uint,
    pub scopeId: c_uint,
    pub timestamp: i64,
    pub latencyUsec: i64,
    pub valueType: nvmlValueType_t,
    pub nvmlReturn: nvmlReturn_t,
    pub value: nvmlValue_t,
}

/// `nvmlProcessInfo_t` (the v2 struct that `nvmlDeviceGetComputeRunningProcesses_v3` fills).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// Scenario name of a return code, e.g. `"GPU_IS_LOST"`.
pub fn return_code_name(code: nvmlReturn_t) -> Option<&'static str> {
    RETURN_CODES
        .iter()
        .find(|(_, c, _)| *c == code)
        .map(|(n, _, _)| *n)
}

/// Return code for a scenario name such as `"DRIVER_NOT_LOADED"`.
pub fn return_code_by_name(name: &str) -> Option<nvmlReturn_t> {
    RETURN_CODES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, c, _)| *c)
}

/// `nvmlSample_t`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlSample_t {
    pub timeStamp: c_ulonglong,
    pub sampleValue: nvmlValue_t,
}

/// `nvmlProcessUtilizationSample_t`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

/// Opaque target of a GPM sample handle.
#[repr(C)]
pub struct nvmlGpmSample_st {
    _unused: [u8; 0],
}
/// `nvmlGpmSample_t`: an opaque pointer.
pub type nvmlGpmSample_t = *mut nvmlGpmSample_st;

/// `NVML_GPM_SUPPORT_VERSION`
pub const NVML_GPM_SUPPORT_VERSION: c_uint = 1;
/// `NVML_GPM_METRICS_GET_VERSION`
pub const NVML_GPM_METRICS_GET_VERSION: c_uint = 1;
/// `NVML_GPM_METRIC_MAX`: the size of `nvmlGpmMetricsGet_t::metrics`.
pub const NVML_GPM_METRIC_MAX: usize = 210;

/// `nvmlGpmSupport_t`
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlGpmSupport_t {
    pub version: c_uint,
    pub isSupportedDevice: c_uint,
}

/// The `metricInfo` of an `nvmlGpmMetric_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpmMetricInfo_t {
    pub shortName: *mut c_char,
    pub longName: *mut c_char,
    pub unit: *mut c_char,
}

/// `nvmlGpmMetric_t`
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpmMetric_t {
    pub metricId: c_uint,
    pub nvmlReturn: nvmlReturn_t,
    pub value: f64,
    pub metricInfo: nvmlGpmMetricInfo_t,
}

/// `nvmlGpmMetricsGet_t`
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpmMetricsGet_t {
    pub version: c_uint,
    pub numMetrics: c_uint,
    pub sample1: nvmlGpmSample_t,
    pub sample2: nvmlGpmSample_t,
    pub metrics: [nvmlGpmMetric_t; NVML_GPM_METRIC_MAX],
}
