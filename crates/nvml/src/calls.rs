//! Every device call made through nvml-wrapper: the NVML function's name (what
//! the watchdog and the logs say) and the call come from one line, so a caller
//! cannot name one call and make another.

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{
    BAR1MemoryInfo, MemoryInfo, PciInfo, Utilization, ViolationTime,
};
use nvml_wrapper::structs::device::{
    EccModeState, EncoderStats, PowerManagementConstraints, RetiredPage, UtilizationInfo,
};
use nvml_wrapper::Device;

use crate::fields::{self, Field};
use crate::health::{self, PlatformInfo, RemapperHistogram, RepairStatus, SramEcc, SramUnique};

pub struct Call<A, T> {
    pub name: &'static str,
    pub(crate) make: fn(&Device<'_>, A) -> Result<T, NvmlError>,
}

/// `NAME: nvmlFunction(args) -> Answer = |device, args| how;`
macro_rules! calls {
    ($($(#[$doc:meta])* $name:ident: $symbol:ident($($arg:ident: $ty:ty),*) -> $answer:ty
        = |$d:ident| $make:expr;)*) => {
        $($(#[$doc])*
        #[allow(unused_parens)]
        pub const $name: Call<($($ty),*), $answer> = Call {
            name: stringify!($symbol),
            make: |$d, ($($arg),*)| $make,
        };)*
    };
}

calls! {
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
    ENCODER_UTILIZATION: nvmlDeviceGetEncoderUtilization() -> UtilizationInfo
        = |d| d.encoder_utilization();
    DECODER_UTILIZATION: nvmlDeviceGetDecoderUtilization() -> UtilizationInfo
        = |d| d.decoder_utilization();
    ENCODER_STATS: nvmlDeviceGetEncoderStats() -> EncoderStats = |d| d.encoder_stats();
    MEMORY_INFO: nvmlDeviceGetMemoryInfo_v2() -> MemoryInfo = |d| d.memory_info();
    BAR1_MEMORY_INFO: nvmlDeviceGetBAR1MemoryInfo() -> BAR1MemoryInfo = |d| d.bar1_memory_info();
    /// MHz.
    CLOCK_INFO: nvmlDeviceGetClockInfo(clock: Clock) -> u32 = |d| d.clock_info(clock);
    /// MHz.
    MAX_CLOCK_INFO: nvmlDeviceGetMaxClockInfo(clock: Clock) -> u32 = |d| d.max_clock_info(clock);
    VIOLATION_STATUS: nvmlDeviceGetViolationStatus(policy: PerformancePolicy) -> ViolationTime
        = |d| d.violation_status(policy);
    PERSISTENCE_MODE: nvmlDeviceGetPersistenceMode() -> bool = |d| d.is_in_persistent_mode();
    ECC_MODE: nvmlDeviceGetEccMode() -> EccModeState = |d| d.is_ecc_enabled();
    TOTAL_ECC_ERRORS: nvmlDeviceGetTotalEccErrors(error: MemoryError, counter: EccCounter) -> u64
        = |d| d.total_ecc_errors(error, counter);
    RETIRED_PAGES: nvmlDeviceGetRetiredPages_v2(cause: RetirementCause) -> Vec<RetiredPage>
        = |d| d.retired_pages(cause);
    RETIRED_PAGES_PENDING: nvmlDeviceGetRetiredPagesPendingStatus() -> bool
        = |d| d.are_pages_pending_retired();
    MAX_PCIE_GENERATION: nvmlDeviceGetMaxPcieLinkGeneration() -> u32 = |d| d.max_pcie_link_gen();
    MAX_PCIE_WIDTH: nvmlDeviceGetMaxPcieLinkWidth() -> u32 = |d| d.max_pcie_link_width();
    PCIE_GENERATION: nvmlDeviceGetCurrPcieLinkGeneration() -> u32
        = |d| d.current_pcie_link_gen();
    PCIE_WIDTH: nvmlDeviceGetCurrPcieLinkWidth() -> u32 = |d| d.current_pcie_link_width();
    PCIE_REPLAY_COUNTER: nvmlDeviceGetPcieReplayCounter() -> u32 = |d| d.pcie_replay_counter();
    /// KiB/s.
    PCIE_THROUGHPUT: nvmlDeviceGetPcieThroughput(counter: PcieUtilCounter) -> u32
        = |d| d.pcie_throughput(counter);
    PCI_INFO: nvmlDeviceGetPciInfo_v3() -> PciInfo = |d| d.pci_info();
    MINOR_NUMBER: nvmlDeviceGetMinorNumber() -> u32 = |d| d.minor_number();
    UUID: nvmlDeviceGetUUID() -> String = |d| d.uuid();
    /// °C.
    TEMPERATURE_THRESHOLD: nvmlDeviceGetTemperatureThreshold(threshold: TemperatureThreshold)
        -> u32 = |d| d.temperature_threshold(threshold);
    FAN_COUNT: nvmlDeviceGetNumFans() -> u32 = |d| d.num_fans();
    /// Percent of the fan's maximum.
    FAN_SPEED: nvmlDeviceGetFanSpeed_v2(fan: u32) -> u32 = |d| d.fan_speed(fan);
    NVLINK_ACTIVE: nvmlDeviceGetNvLinkState(link: u32) -> bool
        = |d| d.link_wrapper_for(link).is_active();
    NVLINK_ERROR_COUNTER: nvmlDeviceGetNvLinkErrorCounter(link: u32, counter: ErrorCounter)
        -> u64 = |d| d.link_wrapper_for(link).error_counter(counter);
    GPM_SUPPORT: nvmlGpmQueryDeviceSupport() -> bool = |d| d.gpm_support();
    FIELD: nvmlDeviceGetFieldValues(field: Field) -> f64 = |d| fields::read_one(d, field);
    /// NOT_SUPPORTED where the GPU is on no NVLink fabric.
    ON_FABRIC: nvmlDeviceGetGpuFabricInfoV() -> bool = |d| crate::fabric::on_fabric(d);
    REPAIR_STATUS: nvmlDeviceGetRepairStatus() -> RepairStatus = |d| health::repair_status(d);
    REMAPPER_HISTOGRAM: nvmlDeviceGetRowRemapperHistogram() -> RemapperHistogram
        = |d| health::remapper_histogram(d);
    SRAM_ECC: nvmlDeviceGetSramEccErrorStatus() -> SramEcc = |d| health::sram_ecc(d);
    SRAM_UNIQUE: nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts() -> SramUnique
        = |d| health::sram_unique(d);
    PLATFORM_INFO: nvmlDeviceGetPlatformInfo() -> PlatformInfo = |d| health::platform_info(d);
    C2C_ENABLED: nvmlDeviceGetC2cModeInfoV() -> bool = |d| health::c2c_enabled(d);
    MEMORY_UNREPAIRABLE: nvmlDeviceGetUnrepairableMemoryFlag_v1() -> bool
        = |d| health::memory_unrepairable(d);
}
