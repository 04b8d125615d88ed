//! The GPU's NVLink fabric (NVSwitch systems: HGX, NVL72): whether the Fabric
//! Manager registered the GPU, in which cluster and clique, and the fabric's
//! health, from `nvmlDeviceGetGpuFabricInfoV` (struct version 3, else 2) or,
//! on drivers before it, `nvmlDeviceGetGpuFabricInfo` (no health).
//!
//! On a GPU without NVSwitch the call succeeds with state
//! `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED` (an H200 PCIe/NVL board, driver 580:
//! v3 answers SUCCESS with state 0, v1 and v2 of the versioned call answer
//! ARGUMENT_VERSION_MISMATCH); [`FabricInfo::read`] turns that into "not
//! supported", so no series is written for it.

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Device as NvmlDevice;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t, NvmlLib,
    NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    NVML_GPU_FABRIC_STATE_NOT_STARTED, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
};

use super::reader::DeviceReader;

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)`.
const VERSION_3: u32 = std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as u32 | (3 << 24);
/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`.
const VERSION_2: u32 = std::mem::size_of::<nvmlGpuFabricInfo_v2_t>() as u32 | (2 << 24);
/// NVML_ERROR_ARGUMENT_VERSION_MISMATCH, which nvml-wrapper 0.13 does not name.
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

/// The NVML function named in logs and errors.
pub const CALL: &str = "nvmlDeviceGetGpuFabricInfoV";

/// Where the GPU's registration with the Fabric Manager stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricState {
    NotStarted,
    InProgress,
    Completed,
}

impl FabricState {
    /// Every state, in the order of NVML's values.
    pub const ALL: [FabricState; 3] = [
        FabricState::NotStarted,
        FabricState::InProgress,
        FabricState::Completed,
    ];

    /// The `state` label value.
    pub fn label(self) -> &'static str {
        match self {
            FabricState::NotStarted => "not_started",
            FabricState::InProgress => "in_progress",
            FabricState::Completed => "completed",
        }
    }
}

/// A fabric health condition of the health mask's 2-bit fields (nvml.h
/// `NVML_GPU_FABRIC_HEALTH_MASK_*`: 0 not supported, 1 the condition holds,
/// 2 it does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    DegradedBandwidth,
    RouteRecovery,
    RouteUnhealthy,
    AccessTimeoutRecovery,
    /// The 4-bit incorrect-configuration field: 0 not supported, 1 none,
    /// 2 and up a kind of misconfiguration (system GUID, chassis serial, no
    /// partition, too few NVLinks).
    IncorrectConfiguration,
}

impl Condition {
    pub const ALL: [Condition; 5] = [
        Condition::DegradedBandwidth,
        Condition::RouteRecovery,
        Condition::RouteUnhealthy,
        Condition::AccessTimeoutRecovery,
        Condition::IncorrectConfiguration,
    ];

    /// The `condition` label value.
    pub fn label(self) -> &'static str {
        match self {
            Condition::DegradedBandwidth => "degraded_bandwidth",
            Condition::RouteRecovery => "route_recovery",
            Condition::RouteUnhealthy => "route_unhealthy",
            Condition::AccessTimeoutRecovery => "access_timeout_recovery",
            Condition::IncorrectConfiguration => "incorrect_configuration",
        }
    }

    /// Shift and mask of the field in `healthMask` (nvml.h
    /// `NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*` / `_WIDTH_*`; the "width" is the
    /// field's mask).
    fn field(self) -> (u32, u32) {
        match self {
            Condition::DegradedBandwidth => (0, 0x3),
            Condition::RouteRecovery => (2, 0x3),
            Condition::RouteUnhealthy => (4, 0x3),
            Condition::AccessTimeoutRecovery => (6, 0x3),
            Condition::IncorrectConfiguration => (8, 0xf),
        }
    }

    /// Whether the condition holds by `mask`; `None` where the driver does
    /// not report it (field 0) or the value is one nvml.h does not define.
    pub fn holds(self, mask: u32) -> Option<bool> {
        let (shift, width) = self.field();
        let value = (mask >> shift) & width;
        match (self, value) {
            (_, 0) => None,
            (Condition::IncorrectConfiguration, 1) => Some(false),
            (Condition::IncorrectConfiguration, 2..=5) => Some(true),
            (Condition::IncorrectConfiguration, _) => None,
            (_, 1) => Some(true),
            (_, 2) => Some(false),
            _ => None,
        }
    }
}

/// The health summary of struct version 3 (`NVML_GPU_FABRIC_HEALTH_SUMMARY_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    Healthy,
    Unhealthy,
    LimitedCapacity,
}

impl Summary {
    pub const ALL: [Summary; 3] = [
        Summary::Healthy,
        Summary::Unhealthy,
        Summary::LimitedCapacity,
    ];

    /// The `summary` label value.
    pub fn label(self) -> &'static str {
        match self {
            Summary::Healthy => "healthy",
            Summary::Unhealthy => "unhealthy",
            Summary::LimitedCapacity => "limited_capacity",
        }
    }

    fn from_raw(raw: u8) -> Option<Summary> {
        match raw {
            1 => Some(Summary::Healthy),
            2 => Some(Summary::Unhealthy),
            3 => Some(Summary::LimitedCapacity),
            _ => None,
        }
    }
}

/// What NVML said of a GPU on an NVLink fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricInfo {
    pub state: FabricState,
    /// The NVML return code of the registration (`status`, 0 = success);
    /// meaningful once the state is completed.
    pub status: u32,
    /// The cluster UUID, as 32 hex digits in 8-4-4-4-12 form.
    pub cluster_uuid: String,
    pub clique_id: u32,
    /// `healthMask`; `None` from the unversioned call.
    pub health_mask: Option<u32>,
    /// `healthSummary`; `None` below struct version 3 or where not supported.
    pub summary: Option<Summary>,
}

/// The fields every version of the struct shares, as read.
struct Raw {
    state: u8,
    status: u32,
    cluster_uuid: [u8; 16],
    clique_id: u32,
    health_mask: Option<u32>,
    summary: Option<u8>,
}

impl FabricInfo {
    /// Reads the fabric info of `handle`. `Err(NotSupported)` where the GPU
    /// is on no fabric (state NOT_SUPPORTED, or the driver lacks both calls);
    /// a state nvml.h does not define is `UnexpectedVariant`.
    pub fn read(lib: &NvmlLib, handle: nvmlDevice_t) -> Result<FabricInfo, NvmlError> {
        let raw = match lib.nvmlDeviceGetGpuFabricInfoV.as_ref() {
            Ok(_) => match read_v3(lib, handle) {
                Err(NvmlError::UnexpectedVariant(ARGUMENT_VERSION_MISMATCH)) => {
                    read_v2(lib, handle)?
                }
                other => other?,
            },
            Err(_) => read_v1(lib, handle)?,
        };
        let state = match u32::from(raw.state) {
            NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => return Err(NvmlError::NotSupported),
            NVML_GPU_FABRIC_STATE_NOT_STARTED => FabricState::NotStarted,
            NVML_GPU_FABRIC_STATE_IN_PROGRESS => FabricState::InProgress,
            NVML_GPU_FABRIC_STATE_COMPLETED => FabricState::Completed,
            other => return Err(NvmlError::UnexpectedVariant(other)),
        };
        Ok(FabricInfo {
            state,
            status: raw.status,
            cluster_uuid: uuid_text(&raw.cluster_uuid),
            clique_id: raw.clique_id,
            health_mask: raw.health_mask,
            summary: raw.summary.and_then(Summary::from_raw),
        })
    }
}

fn read_v3(lib: &NvmlLib, handle: nvmlDevice_t) -> Result<Raw, NvmlError> {
    let get = nvml_sym(lib.nvmlDeviceGetGpuFabricInfoV.as_ref())?;
    // SAFETY: plain old data; all-zero is valid.
    let mut info: nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
    info.version = VERSION_3;
    // SAFETY: one valid out-pointer to a struct of the version it names (the
    // binding's `nvmlGpuFabricInfoV_t` is the v3 struct).
    nvml_try(unsafe { get(handle, &mut info) })?;
    Ok(Raw {
        state: info.state,
        status: info.status,
        cluster_uuid: info.clusterUuid,
        clique_id: info.cliqueId,
        health_mask: Some(info.healthMask),
        summary: Some(info.healthSummary),
    })
}

fn read_v2(lib: &NvmlLib, handle: nvmlDevice_t) -> Result<Raw, NvmlError> {
    let get = nvml_sym(lib.nvmlDeviceGetGpuFabricInfoV.as_ref())?;
    // SAFETY: plain old data; all-zero is valid.
    let mut info: nvmlGpuFabricInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = VERSION_2;
    // SAFETY: the v2 struct is a prefix of v3, and `version` tells NVML to
    // write no more than v2 holds.
    nvml_try(unsafe { get(handle, (&mut info as *mut nvmlGpuFabricInfo_v2_t).cast()) })?;
    Ok(Raw {
        state: info.state,
        status: info.status,
        cluster_uuid: info.clusterUuid,
        clique_id: info.cliqueId,
        health_mask: Some(info.healthMask),
        summary: None,
    })
}

fn read_v1(lib: &NvmlLib, handle: nvmlDevice_t) -> Result<Raw, NvmlError> {
    let get = nvml_sym(lib.nvmlDeviceGetGpuFabricInfo.as_ref())?;
    // SAFETY: plain old data; all-zero is valid.
    let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: one valid out-pointer to the unversioned struct.
    nvml_try(unsafe { get(handle, &mut info) })?;
    Ok(Raw {
        state: info.state,
        status: info.status,
        cluster_uuid: info.clusterUuid,
        clique_id: info.cliqueId,
        health_mask: None,
        summary: None,
    })
}

/// 16 bytes as a UUID (`01234567-89ab-cdef-0123-456789abcdef`).
fn uuid_text(bytes: &[u8; 16]) -> String {
    let mut text = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

impl DeviceReader<'_> {
    /// The GPU's fabric info; `None` where it is on no fabric (logged at
    /// debug level), the read failed (counted) or the GPU is down.
    pub fn fabric_info(&mut self) -> Option<FabricInfo> {
        self.read_raw(CALL, FabricInfo::read)
    }
}

/// Whether `device` is on a fabric: `Err(NotSupported)` where it is not, for
/// [`DeviceReader::read_fixed`] to keep per driver.
pub fn on_fabric(device: &NvmlDevice<'_>) -> Result<bool, NvmlError> {
    // SAFETY: the handle stays valid while `device` (and so NVML) lives.
    let handle = unsafe { device.handle() };
    FabricInfo::read(device.nvml().lib(), handle).map(|_| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_fields_follow_nvml_h() {
        // Every 2-bit field "false" (2) and the configuration "none" (1):
        // a non-zero mask that says the fabric is healthy.
        let healthy = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8;
        for condition in Condition::ALL {
            assert_eq!(condition.holds(healthy), Some(false), "{condition:?}");
            assert_eq!(condition.holds(0), None, "{condition:?}");
        }
        let degraded = 1 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8;
        assert_eq!(Condition::DegradedBandwidth.holds(degraded), Some(true));
        assert_eq!(Condition::RouteRecovery.holds(degraded), Some(false));
        // Too few NVLinks (5) is an incorrect configuration.
        assert_eq!(Condition::IncorrectConfiguration.holds(5 << 8), Some(true));
        assert_eq!(Condition::IncorrectConfiguration.holds(9 << 8), None);
        assert_eq!(Condition::AccessTimeoutRecovery.holds(3 << 6), None);
    }

    #[test]
    fn shifts_match_the_bindings() {
        use nvml_wrapper_sys::bindings::*;
        let bindings = [
            (
                Condition::DegradedBandwidth,
                NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
                NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW,
            ),
            (
                Condition::RouteRecovery,
                NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
                NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_RECOVERY,
            ),
            (
                Condition::RouteUnhealthy,
                NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
                NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY,
            ),
            (
                Condition::AccessTimeoutRecovery,
                NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
                NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ACCESS_TIMEOUT_RECOVERY,
            ),
            (
                Condition::IncorrectConfiguration,
                NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION,
                NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION,
            ),
        ];
        for (condition, shift, width) in bindings {
            assert_eq!(condition.field(), (shift, width), "{condition:?}");
        }
    }

    #[test]
    fn cluster_uuid_is_written_as_a_uuid() {
        let bytes = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(uuid_text(&bytes), "01234567-89ab-cdef-0123-456789abcdef");
    }
}
