//! The GPU's NVLink fabric (NVSwitch systems), from
//! `nvmlDeviceGetGpuFabricInfoV` (struct version 3, else 2) or the older
//! `nvmlDeviceGetGpuFabricInfo`.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t, NvmlLib,
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
};

use super::{struct_version, ARGUMENT_VERSION_MISMATCH};

const VERSION_3: u32 = struct_version::<nvmlGpuFabricInfo_v3_t>(3);
/// The v2 struct is a prefix of v3 (without the summary): NVML writes no more.
const VERSION_2: u32 = struct_version::<nvmlGpuFabricInfo_v2_t>(2);

/// `ALL`: the variants in NVML's order (from 1).
macro_rules! labelled {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$doc:meta])* $variant:ident = $label:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$doc])* $variant,)* }

        impl $name {
            pub const ALL: [$name; [$($label),*].len()] = [$($name::$variant),*];

            pub fn label(self) -> &'static str {
                match self { $($name::$variant => $label,)* }
            }
        }
    };
}

labelled! {
    /// The GPU's registration with the Fabric Manager.
    pub enum FabricState {
        NotStarted = "not_started",
        InProgress = "in_progress",
        Completed = "completed",
    }
}

labelled! {
    /// A field of the health mask (`NVML_GPU_FABRIC_HEALTH_MASK_*`).
    pub enum Condition {
        DegradedBandwidth = "degraded_bandwidth",
        RouteRecovery = "route_recovery",
        RouteUnhealthy = "route_unhealthy",
        AccessTimeoutRecovery = "access_timeout_recovery",
        /// 0 not supported, 1 none, 2 and up a kind of misconfiguration.
        IncorrectConfiguration = "incorrect_configuration",
    }
}

labelled! {
    /// The health summary of struct version 3 (`NVML_GPU_FABRIC_HEALTH_SUMMARY_*`).
    pub enum Summary {
        Healthy = "healthy",
        Unhealthy = "unhealthy",
        LimitedCapacity = "limited_capacity",
    }
}

impl Condition {
    /// Shift and width (nvml.h): two bits each in order, four for the
    /// configuration.
    fn field(self) -> (u32, u32) {
        let configuration = self == Condition::IncorrectConfiguration;
        (2 * self as u32, if configuration { 0xf } else { 0x3 })
    }

    /// `None` where the driver does not report it (field 0) or the value is
    /// one nvml.h does not define.
    pub fn holds(self, mask: u32) -> Option<bool> {
        let (shift, width) = self.field();
        match ((mask >> shift) & width, self) {
            (1, Condition::IncorrectConfiguration) => Some(false),
            (2..=5, Condition::IncorrectConfiguration) => Some(true),
            (_, Condition::IncorrectConfiguration) | (0 | 3, _) => None,
            (value, _) => Some(value == 1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricInfo {
    pub state: FabricState,
    /// The registration's NVML return code, once the state is completed.
    pub status: u32,
    /// In 8-4-4-4-12 form.
    pub cluster_uuid: String,
    pub clique_id: u32,
    /// `None` from the unversioned call.
    pub health_mask: Option<u32>,
    /// `None` below struct version 3 or where not supported.
    pub summary: Option<Summary>,
}

impl FabricInfo {
    /// `Err(NotSupported)` where the GPU is on no fabric (state
    /// NOT_SUPPORTED, or the driver lacks both calls).
    pub fn read(lib: &NvmlLib, handle: nvmlDevice_t) -> Result<FabricInfo, NvmlError> {
        // SAFETY: plain old data; all-zero is valid.
        let zeroed = || -> nvmlGpuFabricInfo_v3_t { unsafe { std::mem::zeroed() } };
        let mut info = zeroed();
        let health_mask = if lib.nvmlDeviceGetGpuFabricInfoV.is_err() {
            // SAFETY: plain old data; all-zero is valid.
            let mut v1: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
            raw_call!(lib.nvmlDeviceGetGpuFabricInfo(handle, &mut v1))?;
            (info.state, info.status, info.clusterUuid) = (v1.state, v1.status, v1.clusterUuid);
            info.cliqueId = v1.cliqueId;
            None
        } else {
            let mut versioned = |version| {
                info = zeroed();
                info.version = version;
                raw_call!(lib.nvmlDeviceGetGpuFabricInfoV(handle, &mut info))
            };
            match versioned(VERSION_3) {
                Err(NvmlError::UnexpectedVariant(ARGUMENT_VERSION_MISMATCH)) => {
                    versioned(VERSION_2)
                }
                other => other,
            }?;
            Some(info.healthMask)
        };
        let state = info.state;
        if u32::from(state) == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED {
            return Err(NvmlError::NotSupported);
        }
        Ok(FabricInfo {
            state: numbered(&FabricState::ALL, state)
                .ok_or(NvmlError::UnexpectedVariant(state.into()))?,
            status: info.status,
            cluster_uuid: uuid_text(&info.clusterUuid),
            clique_id: info.cliqueId,
            health_mask,
            summary: numbered(&Summary::ALL, info.healthSummary),
        })
    }
}

/// NVML numbers from 1; 0 is none.
fn numbered<T: Copy>(all: &[T], raw: u8) -> Option<T> {
    all.get(usize::from(raw).checked_sub(1)?).copied()
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let mut text: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    for at in [20, 16, 12, 8] {
        text.insert(at, '-');
    }
    text
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

    #[test]
    fn states_and_summaries_are_numbered_as_in_the_bindings() {
        use nvml_wrapper_sys::bindings::*;
        let states = [
            (NVML_GPU_FABRIC_STATE_NOT_STARTED, FabricState::NotStarted),
            (NVML_GPU_FABRIC_STATE_IN_PROGRESS, FabricState::InProgress),
            (NVML_GPU_FABRIC_STATE_COMPLETED, FabricState::Completed),
        ];
        for (raw, state) in states {
            assert_eq!(numbered(&FabricState::ALL, raw as u8), Some(state));
        }
        let summaries = [
            (NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY, Summary::Healthy),
            (NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY, Summary::Unhealthy),
            (
                NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
                Summary::LimitedCapacity,
            ),
        ];
        for (raw, summary) in summaries {
            assert_eq!(numbered(&Summary::ALL, raw as u8), Some(summary));
        }
        assert_eq!(numbered(&Summary::ALL, 0), None);
        assert_eq!(numbered(&FabricState::ALL, 4), None);
        assert_eq!(FabricState::InProgress.label(), "in_progress");
        assert_eq!(Condition::ALL.len(), 5);
    }
}
