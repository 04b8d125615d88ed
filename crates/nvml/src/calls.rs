//! Every NVML device call: one line gives the function's name (what the
//! watchdog, the logs and the remembered NOT_SUPPORTED say), its arguments,
//! its answer and how it is made; raw calls look up the named symbol with
//! `symbol!(lib)` (`Self::NAME` for a lookup by name), so a line cannot name
//! one function and call another.

use std::fmt::Debug;

use nvml_wrapper::error::{nvml_sym, NvmlError};
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::struct_wrappers::device::{
    BAR1MemoryInfo, MemoryInfo, PciInfo, Utilization, ViolationTime,
};
use nvml_wrapper::structs::device::{
    EccModeState, EncoderStats, PowerManagementConstraints, RetiredPage, UtilizationInfo,
};

use crate::fabric::FabricInfo;
use crate::fields::{self, Field};
use crate::health::{self, PlatformInfo, RemapperHistogram, RepairsPending, SramEcc, SramUnique};
use crate::samples::{self, Point, ProcessEntry};
use crate::types::*;
use crate::unwrapped::{self, Known, RemappedRows};
use crate::{out, raw};

/// One NVML function, made through [`crate::DeviceReader`].
pub trait Call: Copy {
    const NAME: &'static str;
    /// Whether a NOT_SUPPORTED is remembered: not for a call asked anew each
    /// run (`each_run`).
    const REMEMBERED: bool;
    type Args<'a, 'n: 'a>: Debug;
    type Answer<'n>;
    fn make<'a, 'n: 'a>(
        device: &Device<'n>,
        args: Self::Args<'a, 'n>,
    ) -> Result<Self::Answer<'n>, NvmlError>;

    /// The name and arguments a NOT_SUPPORTED is remembered under, e.g.
    /// `nvmlDeviceGetPowerUsage`, `nvmlDeviceGetClockInfo(Video)`.
    fn key<'a, 'n: 'a>(args: &Self::Args<'a, 'n>) -> Option<String> {
        Self::REMEMBERED.then(|| match format!("{args:?}") {
            unit if unit == "()" => Self::NAME.to_owned(),
            args => format!("{}({args})", Self::NAME),
        })
    }
}

macro_rules! remembered {
    () => {
        true
    };
    (each_run) => {
        false
    };
}

/// `NAME: nvmlFunction(args) -> Answer[, each_run] = |device| how;`, or
/// `= raw read;` for `raw(device, |lib, handle| read(symbol!(lib), handle))`.
macro_rules! calls {
    ($($(#[$doc:meta])* $name:ident: $symbol:ident($($arg:ident: $ty:ty),*) -> $answer:ty
        $(, $each_run:ident)? = $(raw $read:path)? $(|$d:ident| $make:expr)?;)*) => {$(
        $(#[$doc])*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name;

        impl Call for $name {
            const NAME: &'static str = stringify!($symbol);
            const REMEMBERED: bool = remembered!($($each_run)?);
            #[allow(unused_parens)]
            type Args<'a, 'n: 'a> = ($($ty),*);
            type Answer<'n> = $answer;

            #[allow(unused_parens)]
            fn make<'a, 'n: 'a>(
                device: &Device<'n>,
                ($($arg),*): Self::Args<'a, 'n>,
            ) -> Result<Self::Answer<'n>, NvmlError> {
                #[allow(unused_macros)]
                macro_rules! symbol {
                    ($lib:ident) => {
                        nvml_sym($lib.$symbol.as_ref())
                    };
                }
                $(raw(device, |lib, handle| $read(symbol!(lib), handle)))?
                $({
                    let $d = device;
                    $make
                })?
            }
        }
    )*};
}

calls! {
    /// Decoded lossily, so a hostile or corrupted string cannot hide a GPU.
    UUID: nvmlDeviceGetUUID() -> String = raw unwrapped::text;
    NAME: nvmlDeviceGetName() -> String = raw unwrapped::text;
    SERIAL: nvmlDeviceGetSerial() -> String = raw unwrapped::text;
    VBIOS_VERSION: nvmlDeviceGetVbiosVersion() -> String = raw unwrapped::text;
    BRAND: nvmlDeviceGetBrand() -> Known<Brand> = raw unwrapped::known;
    ARCHITECTURE: nvmlDeviceGetArchitecture() -> Known<DeviceArchitecture> = raw unwrapped::known;
    PERFORMANCE_STATE: nvmlDeviceGetPerformanceState() -> Known<PerformanceState>
        = raw unwrapped::known;
    COMPUTE_MODE: nvmlDeviceGetComputeMode() -> Known<ComputeMode> = raw unwrapped::known;
    PCI_INFO: nvmlDeviceGetPciInfo_v3() -> PciInfo = |d| d.pci_info();
    MINOR_NUMBER: nvmlDeviceGetMinorNumber() -> u32 = |d| d.minor_number();
    /// Milliwatts.
    POWER_USAGE: nvmlDeviceGetPowerUsage() -> u32 = |d| d.power_usage();
    /// Millijoules since the driver was loaded.
    TOTAL_ENERGY: nvmlDeviceGetTotalEnergyConsumption() -> u64 = |d| d.total_energy_consumption();
    ENFORCED_POWER_LIMIT: nvmlDeviceGetEnforcedPowerLimit() -> u32 = |d| d.enforced_power_limit();
    DEFAULT_POWER_LIMIT: nvmlDeviceGetPowerManagementDefaultLimit() -> u32
        = |d| d.power_management_limit_default();
    POWER_LIMIT_CONSTRAINTS: nvmlDeviceGetPowerManagementLimitConstraints()
        -> PowerManagementConstraints = |d| d.power_management_limit_constraints();
    UTILIZATION_RATES: nvmlDeviceGetUtilizationRates() -> Utilization = |d| d.utilization_rates();
    /// In NVML's order; a value that is no percentage is `u64::MAX`.
    SAMPLES: nvmlDeviceGetSamples(sampling: Sampling, last_seen: u64) -> Vec<Point>, each_run
        = |d| raw(d, |lib, h| samples::fetch(symbol!(lib), h, sampling, last_seen));
    PROCESS_UTILIZATION: nvmlDeviceGetProcessUtilization(last_seen: u64) -> Vec<ProcessEntry>,
        each_run = |d| raw(d, |lib, h| samples::processes(symbol!(lib), h, last_seen));
    /// Asked every run: a NOT_SUPPORTED remembered would hide a job's
    /// processes, and with them its held time and energy, for 40 runs.
    COMPUTE_PROCESSES: nvmlDeviceGetComputeRunningProcesses_v3() -> Vec<ProcessInfo>, each_run
        = |d| d.running_compute_processes();
    ENCODER_UTILIZATION: nvmlDeviceGetEncoderUtilization() -> UtilizationInfo
        = |d| d.encoder_utilization();
    DECODER_UTILIZATION: nvmlDeviceGetDecoderUtilization() -> UtilizationInfo
        = |d| d.decoder_utilization();
    ENCODER_STATS: nvmlDeviceGetEncoderStats() -> EncoderStats = |d| d.encoder_stats();
    /// Percent busy over the engine's last sampling period (driver 535+).
    JPEG_UTILIZATION: nvmlDeviceGetJpgUtilization() -> u32 = raw unwrapped::engine_percent;
    OFA_UTILIZATION: nvmlDeviceGetOfaUtilization() -> u32 = raw unwrapped::engine_percent;
    MEMORY_INFO: nvmlDeviceGetMemoryInfo_v2() -> MemoryInfo = |d| d.memory_info();
    BAR1_MEMORY_INFO: nvmlDeviceGetBAR1MemoryInfo() -> BAR1MemoryInfo = |d| d.bar1_memory_info();
    /// MHz.
    CLOCK_INFO: nvmlDeviceGetClockInfo(clock: Clock) -> u32 = |d| d.clock_info(clock);
    /// MHz.
    MAX_CLOCK_INFO: nvmlDeviceGetMaxClockInfo(clock: Clock) -> u32 = |d| d.max_clock_info(clock);
    VIOLATION_STATUS: nvmlDeviceGetViolationStatus(policy: PerformancePolicy) -> ViolationTime
        = |d| d.violation_status(policy);
    /// Through the deprecated `*ClocksThrottleReasons` name before R535.
    CLOCKS_EVENT_REASONS: nvmlDeviceGetCurrentClocksEventReasons() -> u64 = |d| raw(d, |lib, h| {
        out(symbol!(lib).or(nvml_sym(lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref())), h, 0)
    });
    SUPPORTED_CLOCKS_EVENT_REASONS: nvmlDeviceGetSupportedClocksEventReasons() -> u64
        = |d| raw(d, |lib, h| {
            out(symbol!(lib).or(nvml_sym(lib.nvmlDeviceGetSupportedClocksThrottleReasons.as_ref())), h, 0)
        });
    PERSISTENCE_MODE: nvmlDeviceGetPersistenceMode() -> bool = |d| d.is_in_persistent_mode();
    MIG_MODE: nvmlDeviceGetMigMode() -> MigMode = |d| d.mig_mode();
    MIG_DEVICE_COUNT: nvmlDeviceGetMaxMigDeviceCount() -> u32 = |d| d.mig_device_count();
    MIG_DEVICE: nvmlDeviceGetMigDeviceHandleByIndex(slot: u32) -> Device<'n>
        = |d| d.mig_device_by_index(slot);
    /// Of a MIG device.
    GPU_INSTANCE_ID: nvmlDeviceGetGpuInstanceId() -> u32
        = |d| raw(d, |lib, h| out(symbol!(lib), h, 0));
    /// Of a MIG device.
    COMPUTE_INSTANCE_ID: nvmlDeviceGetComputeInstanceId() -> u32
        = |d| raw(d, |lib, h| out(symbol!(lib), h, 0));
    ECC_MODE: nvmlDeviceGetEccMode() -> EccModeState = |d| d.is_ecc_enabled();
    TOTAL_ECC_ERRORS: nvmlDeviceGetTotalEccErrors(error: MemoryError, counter: EccCounter) -> u64
        = |d| d.total_ecc_errors(error, counter);
    RETIRED_PAGES: nvmlDeviceGetRetiredPages_v2(cause: RetirementCause) -> Vec<RetiredPage>
        = |d| d.retired_pages(cause);
    RETIRED_PAGES_PENDING: nvmlDeviceGetRetiredPagesPendingStatus() -> bool
        = |d| d.are_pages_pending_retired();
    /// Ampere and newer.
    REMAPPED_ROWS: nvmlDeviceGetRemappedRows() -> RemappedRows = raw unwrapped::remapped_rows;
    MAX_PCIE_GENERATION: nvmlDeviceGetMaxPcieLinkGeneration() -> u32 = |d| d.max_pcie_link_gen();
    MAX_PCIE_WIDTH: nvmlDeviceGetMaxPcieLinkWidth() -> u32 = |d| d.max_pcie_link_width();
    PCIE_GENERATION: nvmlDeviceGetCurrPcieLinkGeneration() -> u32
        = |d| d.current_pcie_link_gen();
    PCIE_WIDTH: nvmlDeviceGetCurrPcieLinkWidth() -> u32 = |d| d.current_pcie_link_width();
    PCIE_REPLAY_COUNTER: nvmlDeviceGetPcieReplayCounter() -> u32 = |d| d.pcie_replay_counter();
    /// KiB/s.
    PCIE_THROUGHPUT: nvmlDeviceGetPcieThroughput(counter: PcieUtilCounter) -> u32
        = |d| d.pcie_throughput(counter);
    /// °C, where the driver has it (NVML 12.5+) and its struct version.
    TEMPERATURE_V: nvmlDeviceGetTemperatureV() -> i32 = raw unwrapped::temperature;
    /// °C.
    TEMPERATURE: nvmlDeviceGetTemperature(sensor: TemperatureSensor) -> u32
        = |d| d.temperature(sensor);
    /// °C.
    TEMPERATURE_THRESHOLD: nvmlDeviceGetTemperatureThreshold(threshold: TemperatureThreshold)
        -> u32 = |d| d.temperature_threshold(threshold);
    /// T.Limit in °C (driver 555+).
    MARGIN_TEMPERATURE: nvmlDeviceGetMarginTemperature() -> i32 = raw unwrapped::margin_temperature;
    FAN_COUNT: nvmlDeviceGetNumFans() -> u32 = |d| d.num_fans();
    /// Percent of the fan's maximum.
    FAN_SPEED: nvmlDeviceGetFanSpeed_v2(fan: u32) -> u32 = |d| d.fan_speed(fan);
    NVLINK_ACTIVE: nvmlDeviceGetNvLinkState(link: u32) -> bool
        = |d| d.link_wrapper_for(link).is_active();
    NVLINK_ERROR_COUNTER: nvmlDeviceGetNvLinkErrorCounter(link: u32, counter: ErrorCounter)
        -> u64 = |d| d.link_wrapper_for(link).error_counter(counter);
    /// A reading taken once per driver, outside the batch.
    FIELD: nvmlDeviceGetFieldValues(field: Field) -> f64 = |d| raw(d, |lib, h| {
        fields::fetch(symbol!(lib), h, d.nvml().field_id_scheme(), &[field])?
            .pop()
            .unwrap_or(Err(NvmlError::NotSupported))
    });
    /// Each field's own answer; an undocumented value type is `UnexpectedVariant`.
    FIELD_VALUES: nvmlDeviceGetFieldValues(fields: &'a [Field]) -> Vec<Result<f64, NvmlError>>,
        each_run = |d| raw(d, |lib, h| fields::fetch(symbol!(lib), h, d.nvml().field_id_scheme(), fields));
    /// NOT_SUPPORTED where the GPU is on no NVLink fabric.
    FABRIC_INFO: nvmlDeviceGetGpuFabricInfoV() -> FabricInfo = |d| raw(d, FabricInfo::read);
    GPM_SUPPORT: nvmlGpmQueryDeviceSupport() -> bool = |d| d.gpm_support();
    GPM_SAMPLE: nvmlGpmSampleGet() -> GpmSample<'n> = |d| d.gpm_sample();
    GPM_MIG_SAMPLE: nvmlGpmMigSampleGet(gpu_instance: u32) -> GpmSample<'n>
        = |d| d.gpm_mig_sample(gpu_instance);
    /// Each metric's own answer.
    GPM_METRICS: nvmlGpmMetricsGet(
        first: &'a GpmSample<'n>, second: &'a GpmSample<'n>, ids: &'a [GpmMetricId]
    ) -> Vec<Result<f64, NvmlError>>, each_run = |d| Ok(gpm_metrics_get(d.nvml(), first, second, ids)?
        .into_iter().map(|metric| metric.map(|m| m.value)).collect());
    REPAIR_STATUS: nvmlDeviceGetRepairStatus() -> RepairsPending = raw health::repair_status;
    REMAPPER_HISTOGRAM: nvmlDeviceGetRowRemapperHistogram() -> RemapperHistogram
        = raw health::remapper_histogram;
    SRAM_ECC: nvmlDeviceGetSramEccErrorStatus() -> SramEcc = raw health::sram_ecc;
    SRAM_UNIQUE: nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts() -> SramUnique
        = raw health::sram_unique;
    PLATFORM_INFO: nvmlDeviceGetPlatformInfo() -> PlatformInfo = raw health::platform_info;
    C2C_ENABLED: nvmlDeviceGetC2cModeInfoV() -> bool = raw health::c2c_enabled;
    /// Newer than the bindings: looked up by its name.
    MEMORY_UNREPAIRABLE: nvmlDeviceGetUnrepairableMemoryFlag_v1() -> bool
        = |d| raw(d, |lib, h| health::memory_unrepairable(lib, Self::NAME, h));
}
