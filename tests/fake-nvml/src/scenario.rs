//! The scenario file: what the fake reports, in NVML's raw units.
//!
//! A key that is absent means the GPU does not support that field, so its
//! getter answers `NVML_ERROR_NOT_SUPPORTED`. Unknown keys are rejected, so a
//! typo in a scenario fails loudly at `nvmlInit` instead of silently turning a
//! field into "not supported". See the crate's README for the full schema.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::ffi::{nvmlReturn_t, return_code_by_name, RETURN_CODES};

/// Most GPUs one scenario may describe (handles live in a fixed table).
pub const MAX_GPUS: usize = 64;
/// MIG device slots per GPU (`slot` must be below this).
pub const MAX_MIG_SLOTS: usize = 8;

/// System symbols whose result the `[system] errors` map may override.
pub const SYSTEM_ERROR_SYMBOLS: &[&str] = &[
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
];

/// Symbols that take a device (or, for `nvmlDeviceGetHandleByIndex_v2`, select
/// one by index): the keys of a GPU's `errors`, `delays_ms` and `hang`.
pub const DEVICE_SYMBOLS: &[&str] = &[
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetMarginTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRowRemapperHistogram",
    "nvmlDeviceGetRepairStatus",
    "nvmlDeviceGetSramEccErrorStatus",
    "nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts",
    "nvmlDeviceGetPlatformInfo",
    "nvmlDeviceGetUnrepairableMemoryFlag_v1",
    "nvmlDeviceGetC2cModeInfoV",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetEncoderStats",
    "nvmlDeviceGetJpgUtilization",
    "nvmlDeviceGetOfaUtilization",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
];

/// Symbols that read no scenario value (no per-symbol errors or delays).
pub const OTHER_SYMBOLS: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
];

/// Every symbol the library exports.
pub fn all_symbols() -> impl Iterator<Item = &'static str> {
    OTHER_SYMBOLS
        .iter()
        .chain(SYSTEM_ERROR_SYMBOLS)
        .chain(DEVICE_SYMBOLS)
        .copied()
}

/// A whole scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What the scenario shows (every shipped scenario has one).
    #[serde(default)]
    pub description: Option<String>,
    /// Where the sample buffers' "now" comes from when `FAKE_NVML_CLOCK_US`
    /// is unset.
    #[serde(default)]
    pub clock: Clock,
    /// A capture's time (µs): "now" of the fixed clock, so that a recording
    /// replays at the moment it was taken.
    pub recorded_at_us: Option<u64>,
    /// Read by the tests, which load a copy of the library in which these
    /// exports are made local (tests/fake-nvml/README.md); the fake itself
    /// only checks the names.
    #[serde(default)]
    pub missing_symbols: Vec<String>,
    #[serde(default)]
    pub system: System,
    /// Extra latency in microseconds for every call of a symbol, on all devices.
    #[serde(default)]
    pub delays_us: BTreeMap<String, u64>,
    #[serde(default, rename = "gpu")]
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    pub driver_version: Option<Text>,
    pub nvml_version: Option<Text>,
    pub cuda_driver_version: Option<i32>,
    pub init_error: Option<ErrorCode>,
    #[serde(default)]
    pub init_delay_ms: u64,
    #[serde(default)]
    pub init_hang: bool,
    pub device_count_error: Option<ErrorCode>,
    #[serde(default)]
    pub errors: BTreeMap<String, ErrorCode>,
    /// System calls that never return (as a driver stuck in a reset).
    #[serde(default)]
    pub hang: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub uuid: Option<Text>,
    pub name: Option<Text>,
    pub serial: Option<Text>,
    pub vbios_version: Option<Text>,
    pub brand: Option<u32>,
    pub architecture: Option<u32>,
    pub minor_number: Option<u32>,
    pub pci: Option<Pci>,
    pub utilization: Option<Utilization>,
    pub memory: Option<Memory>,
    pub bar1: Option<Bar1>,
    pub temperature: Option<u32>,
    pub temperature_thresholds: Option<TemperatureThresholds>,
    pub margin_temperature: Option<i32>,
    pub power_usage_mw: Option<u32>,
    pub total_energy_mj: Option<u64>,
    /// The energy counter grows at this power (mW) on the sample clock:
    /// `total_energy_mj` at [`DEFAULT_CLOCK_US`], more after it.
    pub energy_mw: Option<u64>,
    pub power_limit_mw: Option<u32>,
    pub enforced_power_limit_mw: Option<u32>,
    pub default_power_limit_mw: Option<u32>,
    pub power_limit_constraints_mw: Option<PowerLimitConstraints>,
    pub clocks_mhz: Option<Clocks>,
    pub max_clocks_mhz: Option<Clocks>,
    pub pstate: Option<u32>,
    pub fan_speeds: Option<Vec<u32>>,
    pub clocks_event_reasons: Option<u64>,
    pub supported_clocks_event_reasons: Option<u64>,
    pub violations_ns: Option<Violations>,
    pub pcie: Option<Pcie>,
    pub ecc_mode: Option<EccMode>,
    pub ecc_errors: Option<EccErrors>,
    pub retired_pages: Option<RetiredPages>,
    pub remapped_rows: Option<RemappedRows>,
    /// `nvmlDeviceGetRowRemapperHistogram`: banks by rows left.
    pub row_remapper_histogram: Option<RowRemapperHistogram>,
    /// `nvmlDeviceGetRepairStatus` (R580, Ampere and newer).
    pub repair_status: Option<RepairStatus>,
    /// `nvmlDeviceGetSramEccErrorStatus` (R550, Ampere and newer).
    pub sram_ecc: Option<SramEcc>,
    /// `nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts` (R580, Blackwell
    /// and newer): the SRAM locations with uncorrected errors.
    pub sram_unique: Option<Vec<SramUniqueEntry>>,
    /// `nvmlDeviceGetUnrepairableMemoryFlag_v1` (R590, Hopper and newer).
    pub memory_unrepairable: Option<bool>,
    /// `nvmlDeviceGetC2cModeInfoV` (R545, superchips).
    pub c2c_enabled: Option<bool>,
    /// `nvmlDeviceGetPlatformInfo` (Blackwell and newer).
    pub platform: Option<Platform>,
    pub encoder: Option<Encoder>,
    pub decoder: Option<Decoder>,
    pub jpeg: Option<Decoder>,
    pub ofa: Option<Decoder>,
    pub persistence_mode: Option<bool>,
    pub compute_mode: Option<u32>,
    pub mig_mode: Option<MigMode>,
    pub nvlinks: Option<Vec<NvLink>>,
    /// Answer the NVLink field values from `nvlinks` (see [`nvlink_fields`]).
    #[serde(default)]
    pub nvlink_fields: bool,
    #[serde(default)]
    pub field_values: BTreeMap<String, u64>,
    /// Like `field_values`, answered as `NVML_VALUE_TYPE_SIGNED_INT` (a
    /// negative T.Limit threshold); a key in both is rejected.
    #[serde(default)]
    pub signed_field_values: BTreeMap<String, i32>,
    /// Like `field_values`, answered as `NVML_VALUE_TYPE_DOUBLE` (as the
    /// driver answers some fields, by the batch they are in); a key in
    /// another table is rejected.
    #[serde(default)]
    pub double_field_values: BTreeMap<String, f64>,
    /// `nvmlDeviceGetGpuFabricInfo(V)`; absent: both answer NOT_SUPPORTED.
    pub fabric: Option<Fabric>,
    pub max_mig_device_count: Option<u32>,
    pub mig_devices: Option<Vec<MigDevice>>,
    pub processes: Option<Vec<Process>>,
    /// NVML's utilization sample buffers (`nvmlDeviceGetSamples`,
    /// `nvmlDeviceGetProcessUtilization`); absent: not supported.
    pub samples: Option<Samples>,
    /// What a real GPU's sample calls answered, replayed instead of
    /// `samples` (tests/nvml-capture writes it).
    pub recording: Option<Recording>,
    /// GPM metrics of the whole GPU; present means the GPU supports GPM.
    pub gpm: Option<Gpm>,
    #[serde(default)]
    pub lost: bool,
    #[serde(default)]
    pub errors: BTreeMap<String, ErrorCode>,
    #[serde(default)]
    pub delays_ms: BTreeMap<String, u64>,
    #[serde(default)]
    pub hang: Vec<String>,
    /// `field_values` keyed by `(fieldId, scopeId)`; filled by validation.
    #[serde(skip)]
    pub fields: HashMap<(u32, Option<u32>), u64>,
    /// `signed_field_values` keyed likewise; filled by validation.
    #[serde(skip)]
    pub signed_fields: HashMap<(u32, Option<u32>), i32>,
    /// `double_field_values` keyed likewise; filled by validation.
    #[serde(skip)]
    pub double_fields: HashMap<(u32, Option<u32>), f64>,
}

/// The GPU's NVLink fabric info, raw (nvml.h `nvmlGpuFabricInfo_v3_t`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fabric {
    /// `NVML_GPU_FABRIC_STATE_*`: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// An NVML return code (0 success).
    #[serde(default)]
    pub status: u32,
    /// 16 bytes.
    #[serde(default)]
    pub cluster_uuid: [u8; 16],
    #[serde(default)]
    pub clique_id: u32,
    /// Written by struct versions 2 and 3 only.
    #[serde(default)]
    pub health_mask: u32,
    /// Written by struct version 3 only.
    #[serde(default)]
    pub health_summary: u8,
    /// The one struct version `nvmlDeviceGetGpuFabricInfoV` accepts (2 or 3,
    /// default 3); any other answers ARGUMENT_VERSION_MISMATCH, as the H200
    /// of driver 580 answers v1 and v2.
    #[serde(default = "fabric_version")]
    pub max_version: u32,
}

fn fabric_version() -> u32 {
    3
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pci {
    pub bus_id: Text,
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    pub total: u64,
    #[serde(default)]
    pub reserved: u64,
    pub used: u64,
    pub free: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bar1 {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemperatureThresholds {
    pub shutdown: Option<u32>,
    pub slowdown: Option<u32>,
    pub mem_max: Option<u32>,
    pub gpu_max: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerLimitConstraints {
    pub min: u32,
    pub max: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clocks {
    pub graphics: Option<u32>,
    pub sm: Option<u32>,
    pub memory: Option<u32>,
    pub video: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Violations {
    pub power: Option<u64>,
    pub thermal: Option<u64>,
    pub sync_boost: Option<u64>,
    pub board_limit: Option<u64>,
    pub low_utilization: Option<u64>,
    pub reliability: Option<u64>,
    pub total_app_clocks: Option<u64>,
    pub total_base_clocks: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pcie {
    pub gen: Option<u32>,
    pub max_gen: Option<u32>,
    pub width: Option<u32>,
    pub max_width: Option<u32>,
    pub replay_counter: Option<u32>,
    pub tx_kbps: Option<u32>,
    pub rx_kbps: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EccMode {
    pub current: bool,
    pub pending: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EccErrors {
    pub volatile_corrected: Option<u64>,
    pub volatile_uncorrected: Option<u64>,
    pub aggregate_corrected: Option<u64>,
    pub aggregate_uncorrected: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetiredPages {
    pub single_bit_ecc: Option<u32>,
    pub double_bit_ecc: Option<u32>,
    pub pending: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowRemapperHistogram {
    pub max: u32,
    pub high: u32,
    pub partial: u32,
    pub low: u32,
    pub none: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairStatus {
    pub channel: bool,
    pub tpc: bool,
}

/// `nvmlEccSramErrorStatus_v1_t`'s fields; absent ones are 0.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SramEcc {
    pub aggregate_unc_parity: u64,
    pub aggregate_unc_sec_ded: u64,
    pub aggregate_cor: u64,
    pub volatile_unc_parity: u64,
    pub volatile_unc_sec_ded: u64,
    pub volatile_cor: u64,
    pub aggregate_unc_bucket_l2: u64,
    pub aggregate_unc_bucket_sm: u64,
    pub aggregate_unc_bucket_pcie: u64,
    pub aggregate_unc_bucket_mcu: u64,
    pub aggregate_unc_bucket_other: u64,
    pub threshold_exceeded: bool,
}

/// `nvmlEccSramUniqueUncorrectedErrorEntry_v1_t`'s fields; absent ones are 0.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SramUniqueEntry {
    pub unit: u32,
    pub location: u32,
    pub sublocation: u32,
    pub extlocation: u32,
    pub address: u32,
    pub is_parity: bool,
    pub count: u32,
}

/// `nvmlPlatformInfo_v2_t`'s fields (v1 answers `chassis_serial` as its
/// rack GUID).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Platform {
    pub ib_guid: [u8; 16],
    /// Up to 16 bytes (13 used on Blackwell).
    pub chassis_serial: Text,
    pub slot: u8,
    pub tray: u8,
    pub host_id: u8,
    pub peer_type: u8,
    pub module_id: u8,
    /// The highest struct version it accepts (1 or 2, default 2).
    pub max_version: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Encoder {
    pub utilization: Option<u32>,
    pub sampling_period_us: Option<u32>,
    pub session_count: Option<u32>,
    pub average_fps: Option<u32>,
    pub average_latency_us: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decoder {
    pub utilization: u32,
    pub sampling_period_us: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigMode {
    pub current: u32,
    pub pending: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLink {
    pub active: Option<bool>,
    pub errors: Option<NvLinkErrors>,
    /// Data sent and received (KiB), answered only as field values.
    pub tx_kib: Option<u64>,
    pub rx_kib: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkErrors {
    pub replay: Option<u64>,
    pub recovery: Option<u64>,
    pub crc_flit: Option<u64>,
    pub crc_data: Option<u64>,
    pub ecc_data: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDevice {
    pub slot: u32,
    pub uuid: Text,
    pub name: Option<Text>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub memory: Option<Memory>,
    /// GPM metrics of this device's GPU instance (`nvmlGpmMigSampleGet`).
    pub gpm: Option<Gpm>,
}

/// GPM metrics in percent, as `nvmlGpmMetricsGet` answers them between two
/// samples; an absent metric answers `NOT_SUPPORTED` in its own entry. `nan`
/// and values beyond 0-100 are allowed (to test what the caller does).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpm {
    pub graphics: Option<f64>,
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub integer: Option<f64>,
    pub tensor: Option<f64>,
    pub tensor_dfma: Option<f64>,
    pub tensor_hmma: Option<f64>,
    pub tensor_imma: Option<f64>,
    pub dram: Option<f64>,
    pub fp64: Option<f64>,
    pub fp32: Option<f64>,
    pub fp16: Option<f64>,
}

impl Gpm {
    /// The value of NVML metric `id` (`nvmlGpmMetricId_t`).
    pub fn metric(&self, id: u32) -> Option<f64> {
        match id {
            1 => self.graphics,
            2 => self.sm_active,
            3 => self.sm_occupancy,
            4 => self.integer,
            5 => self.tensor,
            6 => self.tensor_dfma,
            7 => self.tensor_hmma,
            9 => self.tensor_imma,
            10 => self.dram,
            11 => self.fp64,
            12 => self.fp32,
            13 => self.fp16,
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    /// Bytes; absent means NVML could not attribute memory (`NVML_VALUE_NOT_AVAILABLE`).
    pub used_memory: Option<u64>,
    #[serde(default = "no_instance")]
    pub gpu_instance_id: u32,
    #[serde(default = "no_instance")]
    pub compute_instance_id: u32,
    /// SM utilization pattern (percent) over the GPU's sample clock, for
    /// `nvmlDeviceGetProcessUtilization`; absent: the process never appears there.
    pub sm: Option<Vec<u32>>,
}

/// A real GPU's answers to the sample calls, as tests/nvml-capture recorded
/// them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    /// `nvmlDeviceGetSamples`' buffer per engine (`gpu`, `memory`, `encoder`,
    /// `decoder`) as `[timestamp_us, percent]`, oldest first; an engine left
    /// out answers NOT_SUPPORTED.
    #[serde(default)]
    pub samples: BTreeMap<String, Vec<(u64, u32)>>,
    /// `nvmlDeviceGetProcessUtilization`'s answers, each for the
    /// `lastSeenTimeStamp` it was asked with; absent: NOT_SUPPORTED.
    pub process_utilization: Option<Vec<ProcessAnswer>>,
}

/// One `nvmlDeviceGetProcessUtilization` answer of a recording.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessAnswer {
    pub last_seen_us: u64,
    /// `[pid, timeStamp, smUtil, memUtil, encUtil, decUtil]` as NVML wrote
    /// them; none: NOT_FOUND.
    pub entries: Vec<[u64; 6]>,
}

impl Recording {
    /// The recorded samples of sampling type `kind` (1 GPU, 2 memory, 3
    /// encoder, 4 decoder) taken at or before `now_us`.
    pub fn samples(&self, kind: u32, now_us: u64) -> Option<Vec<(u64, u32)>> {
        let name = ["gpu", "memory", "encoder", "decoder"].get(kind.checked_sub(1)? as usize)?;
        let recorded = self.samples.get(*name)?;
        Some(
            recorded
                .iter()
                .copied()
                .filter(|&(ts, _)| ts <= now_us)
                .collect(),
        )
    }

    /// The answer recorded for `last_seen`: the one asked with the latest
    /// `lastSeenTimeStamp` not after it (else the earliest), its entries
    /// newer than `last_seen`.
    pub fn process_entries(&self, last_seen: u64) -> Option<Vec<[u64; 6]>> {
        let answers = self.process_utilization.as_ref()?;
        let answer = answers
            .iter()
            .filter(|a| a.last_seen_us <= last_seen)
            .max_by_key(|a| a.last_seen_us)
            .or_else(|| answers.iter().min_by_key(|a| a.last_seen_us))?;
        Some(
            answer
                .entries
                .iter()
                .copied()
                .filter(|e| e[1] > last_seen)
                .collect(),
        )
    }
}

/// A GPU's sample buffers: every `period_us` (timestamps are multiples of
/// it) one sample per engine, the newest `buffer` kept, generated from the
/// clock `FAKE_NVML_CLOCK_US`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Samples {
    pub period_us: u64,
    #[serde(default = "default_buffer")]
    pub buffer: u32,
    /// Percent patterns per engine: sample k (timestamp k × period_us) has
    /// `pattern[k % len]`; an engine left out answers NOT_SUPPORTED.
    pub gpu: Option<Vec<u32>>,
    pub memory: Option<Vec<u32>>,
    pub encoder: Option<Vec<u32>>,
    pub decoder: Option<Vec<u32>>,
    /// Spans `[from_us, to_us)` in which no sample was taken.
    #[serde(default)]
    pub gaps: Vec<Gap>,
    /// Times at which the buffer was emptied (a GPU reset, a driver reload):
    /// samples at or before the latest one not after now are gone.
    #[serde(default)]
    pub resets_us: Vec<u64>,
    /// The newest sample is returned twice (same timestamp).
    #[serde(default)]
    pub duplicate_last: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gap {
    pub from_us: u64,
    pub to_us: u64,
}

/// The H200's buffer: 71 samples (14 s at 200 ms).
fn default_buffer() -> u32 {
    71
}

/// The clock the sample buffers are generated from, when
/// `FAKE_NVML_CLOCK_US` is unset (so that output is the same every run).
pub const DEFAULT_CLOCK_US: u64 = 1_717_200_000_000_000;

/// Environment variable giving the fake's "now" in µs of wall time.
pub const CLOCK_ENV: &str = "FAKE_NVML_CLOCK_US";

/// Environment variable giving the fake's "now" at its first clock read in
/// a process, µs of wall time; from then on the clock runs with the
/// process's own time, as a GPU's does during a run (`CLOCK_ENV` wins).
pub const CLOCK_FROM_ENV: &str = "FAKE_NVML_CLOCK_FROM_US";

/// The scenario's `clock`: what "now" is for the sample buffers when
/// [`CLOCK_ENV`] is unset (a test that sets the variable always wins).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// [`DEFAULT_CLOCK_US`], so that one run's output is the same every time
    /// (golden files).
    #[default]
    Fixed,
    /// The system's wall clock, so that each run finds the samples taken
    /// since the previous one, as on a real GPU (the demo).
    Wall,
}

impl Clock {
    /// "Now" in µs: `env` (the value of [`CLOCK_ENV`], if set) parsed, else
    /// this clock, with `wall_us` the system's time. An `env` that is not a
    /// number is an error naming it.
    pub fn now_us(self, env: Option<&str>, wall_us: u64, fixed_us: u64) -> Result<u64, String> {
        match env {
            Some(text) => text
                .trim()
                .parse()
                .map_err(|_| format!("{CLOCK_ENV}={text:?} is not a number of µs")),
            None => Ok(match self {
                Clock::Fixed => fixed_us,
                Clock::Wall => wall_us,
            }),
        }
    }
}

impl Samples {
    /// The timestamps in the buffer at `now_us`, oldest first.
    pub fn timestamps(&self, now_us: u64) -> Vec<u64> {
        let period = self.period_us;
        let cutoff = self
            .resets_us
            .iter()
            .copied()
            .filter(|&r| r <= now_us)
            .max();
        let mut stamps = Vec::new();
        let mut k = now_us / period;
        while stamps.len() < self.buffer as usize {
            let ts = k * period;
            if cutoff.is_some_and(|c| ts <= c) {
                break;
            }
            match self.gaps.iter().find(|g| g.from_us <= ts && ts < g.to_us) {
                // Jump to the last sample before the gap.
                Some(gap) => match gap.from_us.checked_sub(1) {
                    Some(before) => k = before / period,
                    None => break,
                },
                None => {
                    stamps.push(ts);
                    match k.checked_sub(1) {
                        Some(next) => k = next,
                        None => break,
                    }
                }
            }
        }
        stamps.reverse();
        if self.duplicate_last {
            if let Some(&last) = stamps.last() {
                stamps.push(last);
            }
        }
        stamps
    }

    /// The pattern of sampling type `kind` (1 GPU, 2 memory, 3 encoder, 4 decoder).
    pub fn pattern(&self, kind: u32) -> Option<&[u32]> {
        match kind {
            1 => self.gpu.as_deref(),
            2 => self.memory.as_deref(),
            3 => self.encoder.as_deref(),
            4 => self.decoder.as_deref(),
            _ => None,
        }
    }
}

/// Sample k's value in `pattern`.
pub fn pattern_value(pattern: &[u32], ts: u64, period_us: u64) -> u32 {
    pattern[((ts / period_us) % pattern.len() as u64) as usize]
}

fn no_instance() -> u32 {
    u32::MAX
}

/// A string value: a TOML string, or an array of raw bytes (for invalid UTF-8).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Text(pub Vec<u8>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;

        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of byte values (0..=255)")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.as_bytes().to_vec()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                let mut bytes = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    bytes.push(b);
                }
                Ok(Text(bytes))
            }
        }

        deserializer.deserialize_any(TextVisitor)
    }
}

/// An NVML error named without its `NVML_ERROR_` prefix, e.g. `"GPU_IS_LOST"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub nvmlReturn_t);

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        match return_code_by_name(&name) {
            Some(0) | None => {
                let known: Vec<&str> = RETURN_CODES
                    .iter()
                    .filter(|(_, code, _)| *code != 0)
                    .map(|(n, _, _)| *n)
                    .collect();
                Err(de::Error::custom(format!(
                    "unknown NVML error `{name}`, expected one of {}",
                    known.join(", ")
                )))
            }
            Some(code) => Ok(ErrorCode(code)),
        }
    }
}

/// Parses and checks a scenario. The error is one line, ready for stderr.
pub fn parse(text: &str) -> Result<Scenario, String> {
    let mut scenario: Scenario = toml::from_str(text).map_err(|e| {
        let message = e.message().replace('\n', " ");
        match e.span() {
            Some(span) => {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!("line {line}: {message}")
            }
            None => message,
        }
    })?;
    scenario.validate()?;
    Ok(scenario)
}

fn check_symbols<'a>(
    what: &str,
    names: impl IntoIterator<Item = &'a String>,
    allowed: &[&[&str]],
) -> Result<(), String> {
    for name in names {
        if !allowed.iter().any(|set| set.contains(&name.as_str())) {
            return Err(format!(
                "{what}: `{name}` is not a symbol that can be used here"
            ));
        }
    }
    Ok(())
}

fn check_text(what: &str, text: &Option<Text>, max_len: usize) -> Result<(), String> {
    if let Some(Text(bytes)) = text {
        if bytes.contains(&0) {
            return Err(format!("{what}: NUL byte inside a string"));
        }
        if bytes.len() > max_len {
            return Err(format!("{what}: longer than {max_len} bytes"));
        }
    }
    Ok(())
}

/// Longest string the fake accepts (NVML's largest string buffers are 96 bytes).
const MAX_TEXT: usize = 95;

impl Scenario {
    /// The same scenario with every fault removed (`FAKE_NVML_FAULTS=off`):
    /// no missing symbols, init or call errors, delays, hangs or lost GPUs.
    /// What the GPUs report then is the baseline a faulty run is compared with.
    pub fn without_faults(mut self) -> Scenario {
        self.missing_symbols.clear();
        self.delays_us.clear();
        let system = &mut self.system;
        system.init_error = None;
        system.init_delay_ms = 0;
        system.init_hang = false;
        system.device_count_error = None;
        system.errors.clear();
        system.hang.clear();
        for gpu in &mut self.gpus {
            gpu.lost = false;
            gpu.errors.clear();
            gpu.delays_ms.clear();
            gpu.hang.clear();
        }
        self
    }

    fn validate(&mut self) -> Result<(), String> {
        let exported: Vec<&str> = all_symbols().collect();
        check_symbols("missing_symbols", &self.missing_symbols, &[&exported])?;
        check_symbols(
            "delays_us",
            self.delays_us.keys(),
            &[SYSTEM_ERROR_SYMBOLS, DEVICE_SYMBOLS, &["nvmlShutdown"]],
        )?;
        check_symbols(
            "system.errors",
            self.system.errors.keys(),
            &[SYSTEM_ERROR_SYMBOLS],
        )?;
        check_symbols("system.hang", &self.system.hang, &[SYSTEM_ERROR_SYMBOLS])?;
        check_text(
            "system.driver_version",
            &self.system.driver_version,
            MAX_TEXT,
        )?;
        check_text("system.nvml_version", &self.system.nvml_version, MAX_TEXT)?;
        if self.gpus.len() > MAX_GPUS {
            return Err(format!(
                "{} [[gpu]] entries; the fake supports at most {MAX_GPUS}",
                self.gpus.len()
            ));
        }
        for (i, gpu) in self.gpus.iter_mut().enumerate() {
            let at = |what: &str| format!("gpu[{i}].{what}");
            check_symbols(&at("errors"), gpu.errors.keys(), &[DEVICE_SYMBOLS])?;
            check_symbols(&at("delays_ms"), gpu.delays_ms.keys(), &[DEVICE_SYMBOLS])?;
            check_symbols(&at("hang"), &gpu.hang, &[DEVICE_SYMBOLS])?;
            check_text(&at("uuid"), &gpu.uuid, MAX_TEXT)?;
            check_text(&at("name"), &gpu.name, MAX_TEXT)?;
            check_text(&at("serial"), &gpu.serial, MAX_TEXT)?;
            check_text(&at("vbios_version"), &gpu.vbios_version, MAX_TEXT)?;
            if let Some(pci) = &gpu.pci {
                check_text(&at("pci.bus_id"), &Some(pci.bus_id.clone()), 31)?;
            }
            let mut slots = [false; MAX_MIG_SLOTS];
            for (m, mig) in gpu.mig_devices.iter().flatten().enumerate() {
                let slot = mig.slot as usize;
                if slot >= MAX_MIG_SLOTS {
                    return Err(at(&format!(
                        "mig_devices[{m}].slot: {slot} is not below {MAX_MIG_SLOTS}"
                    )));
                }
                if std::mem::replace(&mut slots[slot], true) {
                    return Err(at(&format!("mig_devices[{m}].slot: {slot} appears twice")));
                }
                check_text(
                    &at(&format!("mig_devices[{m}].uuid")),
                    &Some(mig.uuid.clone()),
                    MAX_TEXT,
                )?;
                check_text(&at(&format!("mig_devices[{m}].name")), &mig.name, MAX_TEXT)?;
            }
            if gpu.samples.is_some() && gpu.recording.is_some() {
                return Err(at("samples and recording exclude each other"));
            }
            if let Some(samples) = &gpu.samples {
                if samples.period_us == 0 || samples.buffer == 0 {
                    return Err(at("samples: period_us and buffer must be positive"));
                }
                for kind in 1..=4 {
                    if samples.pattern(kind).is_some_and(<[u32]>::is_empty) {
                        return Err(at("samples: an engine pattern is empty"));
                    }
                }
            }
            for (p, process) in gpu.processes.iter().flatten().enumerate() {
                if process.sm.as_ref().is_some_and(Vec::is_empty) {
                    return Err(at(&format!("processes[{p}].sm is empty")));
                }
            }
            let mut fields = if gpu.nvlink_fields {
                nvlink_fields(gpu.nvlinks.as_deref().unwrap_or_default())
            } else {
                HashMap::new()
            };
            for (key, value) in &gpu.field_values {
                let parsed = parse_field_key(key).ok_or_else(|| {
                    at(&format!(
                        "field_values: key `{key}` is neither \"fieldId\" nor \"fieldId:scopeId\""
                    ))
                })?;
                fields.insert(parsed, *value);
            }
            let mut signed = HashMap::new();
            for (key, value) in &gpu.signed_field_values {
                let parsed = parse_field_key(key).ok_or_else(|| {
                    at(&format!(
                        "signed_field_values: key `{key}` is neither \"fieldId\" nor \"fieldId:scopeId\""
                    ))
                })?;
                if fields.contains_key(&parsed) {
                    return Err(at(&format!(
                        "signed_field_values: key `{key}` is in field_values too"
                    )));
                }
                signed.insert(parsed, *value);
            }
            let mut double = HashMap::new();
            for (key, value) in &gpu.double_field_values {
                let parsed = parse_field_key(key).ok_or_else(|| {
                    at(&format!(
                        "double_field_values: key `{key}` is neither \"fieldId\" nor \"fieldId:scopeId\""
                    ))
                })?;
                if fields.contains_key(&parsed) || signed.contains_key(&parsed) {
                    return Err(at(&format!(
                        "double_field_values: key `{key}` is in another table of field values too"
                    )));
                }
                double.insert(parsed, *value);
            }
            gpu.fields = fields;
            gpu.signed_fields = signed;
            gpu.double_fields = double;
        }
        Ok(())
    }
}

/// NVLink field ids (nvml.h `NVML_FI_DEV_NVLINK_*`).
pub mod nvlink_field {
    pub const CRC_FLIT_TOTAL: u32 = 38;
    pub const CRC_DATA_TOTAL: u32 = 45;
    pub const REPLAY_TOTAL: u32 = 52;
    pub const RECOVERY_TOTAL: u32 = 59;
    pub const LINK_COUNT: u32 = 91;
    pub const DATA_TX: u32 = 138;
    pub const DATA_RX: u32 = 139;
    pub const DL_REPLAY: u32 = 161;
    pub const DL_RECOVERY: u32 = 162;
    pub const GET_STATE: u32 = 165;
}

/// Picks one counter of a link's errors.
type Pick = fn(&NvLinkErrors) -> Option<u64>;

/// The field values `nvlink_fields = true` derives from `nvlinks`: the link
/// count; per link (scoped) the state, DL replay and recovery counters and the
/// data counters; per GPU the CRC flit/data, replay and recovery totals, each
/// only where every link has that value (so totals equal the per-link sums).
fn nvlink_fields(links: &[NvLink]) -> HashMap<(u32, Option<u32>), u64> {
    use nvlink_field::*;
    let mut fields = HashMap::new();
    fields.insert((LINK_COUNT, None), links.len() as u64);
    let errors = |l: &NvLink, pick: Pick| l.errors.as_ref().and_then(pick);
    for (i, l) in links.iter().enumerate() {
        let scope = Some(i as u32);
        let per_link = [
            (GET_STATE, l.active.map(u64::from)),
            (DL_REPLAY, errors(l, |e| e.replay)),
            (DL_RECOVERY, errors(l, |e| e.recovery)),
            (DATA_TX, l.tx_kib),
            (DATA_RX, l.rx_kib),
        ];
        for (id, value) in per_link {
            if let Some(value) = value {
                fields.insert((id, scope), value);
            }
        }
    }
    let totals: [(u32, Pick); 4] = [
        (CRC_FLIT_TOTAL, |e| e.crc_flit),
        (CRC_DATA_TOTAL, |e| e.crc_data),
        (REPLAY_TOTAL, |e| e.replay),
        (RECOVERY_TOTAL, |e| e.recovery),
    ];
    for (id, pick) in totals {
        let sum: Option<u64> = links.iter().map(|l| errors(l, pick)).sum();
        if let Some(sum) = sum {
            fields.insert((id, None), sum);
        }
    }
    fields
}

fn parse_field_key(key: &str) -> Option<(u32, Option<u32>)> {
    match key.split_once(':') {
        Some((id, scope)) => Some((id.trim().parse().ok()?, Some(scope.trim().parse().ok()?))),
        None => Some((key.trim().parse().ok()?, None)),
    }
}
