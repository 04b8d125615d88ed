//! What the newest drivers say about a GPU's health, through functions
//! nvml-wrapper does not wrap: pending TPC and channel repairs (R580), the row
//! remapper's histogram, SRAM ECC errors (R550) and where a GPU of a rack sits
//! (R570), memory that can no longer be repaired (first in the R590 header;
//! driver 580.159 answers it). Each is
//! NOT_SUPPORTED, or its symbol missing, where a GPU or driver lacks it.

use std::ffi::c_uint;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlC2cModeInfo_v1_t, nvmlDevice_t, nvmlEccSramUniqueUncorrectedErrorCounts_v1_t,
    nvmlEccSramUniqueUncorrectedErrorEntry_v1_t, nvmlPlatformInfo_v2_t, nvmlReturn_t, NvmlLib,
};

use super::unwrapped::c_text;
use super::{out, struct_version, ARGUMENT_VERSION_MISMATCH};

use nvml_wrapper_sys::bindings::{nvmlEccSramErrorStatus_v1_t, nvmlRepairStatus_v1_t};

/// Repairs waiting for the GPU's next reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairsPending {
    pub tpc: bool,
    pub channel: bool,
}

/// Memory banks by the reserved rows they have left: all of them (`max`),
/// `high`, `partial`, `low`, `none`; as NVML writes them.
pub use nvml_wrapper_sys::bindings::nvmlRowRemapperHistogramValues_t as RemapperHistogram;

/// SRAM ECC errors since the driver loaded (`volatile`) and over the GPU's
/// lifetime (`aggregate`), the lifetime's uncorrected ones by where they
/// occurred, and whether the error threshold of field diagnostics is exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SramEcc {
    pub volatile: SramErrors,
    pub aggregate: SramErrors,
    pub locations: SramLocations,
    pub threshold_exceeded: bool,
}

/// SRAM ECC errors by type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SramErrors {
    pub corrected: u64,
    pub uncorrected_parity: u64,
    pub uncorrected_sec_ded: u64,
}

/// Uncorrected SRAM ECC errors by where they occurred.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SramLocations {
    pub l2: u64,
    pub sm: u64,
    pub pcie: u64,
    pub microcontroller: u64,
    pub other: u64,
}

/// Distinct SRAM locations with uncorrected ECC errors, by how they were
/// detected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SramUnique {
    pub parity: u32,
    pub sec_ded: u32,
}

/// Where a GPU of a rack (GB200 NVL72) sits (`nvmlPlatformInfo_v2_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformInfo {
    /// Empty from a driver that knows only struct version 1 (a rack GUID
    /// in its place).
    pub chassis_serial: String,
    /// In the chassis, switches included.
    pub slot: u8,
    /// Among the compute trays.
    pub tray: u8,
    /// The node within the slot.
    pub host_id: u8,
    /// The GPU within the node.
    pub module_id: u8,
}

/// The version words ([`struct_version`]): v1 and v2 share one layout.
const PLATFORM_V2: u32 = struct_version::<nvmlPlatformInfo_v2_t>(2);
const PLATFORM_V1: u32 = struct_version::<nvmlPlatformInfo_v2_t>(1);

/// Ampere and newer, driver 580 and later.
pub(crate) fn repair_status(
    getter: getter!(*mut nvmlRepairStatus_v1_t),
    handle: nvmlDevice_t,
) -> Result<RepairsPending, NvmlError> {
    let status = nvmlRepairStatus_v1_t {
        version: struct_version::<nvmlRepairStatus_v1_t>(1),
        bChannelRepairPending: 0,
        bTpcRepairPending: 0,
    };
    let status = out(getter, handle, status)?;
    Ok(RepairsPending {
        tpc: status.bTpcRepairPending != 0,
        channel: status.bChannelRepairPending != 0,
    })
}

/// Ampere and newer.
pub(crate) fn remapper_histogram(
    getter: getter!(*mut RemapperHistogram),
    handle: nvmlDevice_t,
) -> Result<RemapperHistogram, NvmlError> {
    // SAFETY: plain integers, for which zero is a value.
    out(getter, handle, unsafe { std::mem::zeroed() })
}

/// Ampere and newer; root only.
pub(crate) fn sram_ecc(
    getter: getter!(*mut nvmlEccSramErrorStatus_v1_t),
    handle: nvmlDevice_t,
) -> Result<SramEcc, NvmlError> {
    // SAFETY: plain integers, for which zero is a value.
    let mut status: nvmlEccSramErrorStatus_v1_t = unsafe { std::mem::zeroed() };
    status.version = struct_version::<nvmlEccSramErrorStatus_v1_t>(1);
    let s = out(getter, handle, status)?;
    Ok(SramEcc {
        volatile: SramErrors {
            corrected: s.volatileCor,
            uncorrected_parity: s.volatileUncParity,
            uncorrected_sec_ded: s.volatileUncSecDed,
        },
        aggregate: SramErrors {
            corrected: s.aggregateCor,
            uncorrected_parity: s.aggregateUncParity,
            uncorrected_sec_ded: s.aggregateUncSecDed,
        },
        locations: SramLocations {
            l2: s.aggregateUncBucketL2,
            sm: s.aggregateUncBucketSm,
            pcie: s.aggregateUncBucketPcie,
            microcontroller: s.aggregateUncBucketMcu,
            other: s.aggregateUncBucketOther,
        },
        threshold_exceeded: s.bThresholdExceeded != 0,
    })
}

/// More locations than this are an error (INSUFFICIENT_SIZE).
const SRAM_UNIQUE_MAX: u32 = 4096;

/// Blackwell and newer, driver 580 and later; NOT_SUPPORTED while ECC is off.
/// Asks the count first, then the entries; errors that arrive between the
/// two calls (INSUFFICIENT_SIZE) make it ask once more.
pub(crate) fn sram_unique(
    getter: getter!(*mut nvmlEccSramUniqueUncorrectedErrorCounts_v1_t),
    handle: nvmlDevice_t,
) -> Result<SramUnique, NvmlError> {
    let getter = getter?;
    let mut entries: Vec<nvmlEccSramUniqueUncorrectedErrorEntry_v1_t> = Vec::new();
    for _ in 0..3 {
        let mut counts = nvmlEccSramUniqueUncorrectedErrorCounts_v1_t {
            version: struct_version::<nvmlEccSramUniqueUncorrectedErrorCounts_v1_t>(1),
            entryCount: entries.len() as c_uint,
            entries: if entries.is_empty() {
                std::ptr::null_mut()
            } else {
                entries.as_mut_ptr()
            },
        };
        let answer = raw_call!(getter, handle, &mut counts);
        // The locations NVML has, whatever it answers.
        let count = counts.entryCount.min(SRAM_UNIQUE_MAX);
        match answer {
            Ok(()) if count as usize <= entries.len() => {
                entries.truncate(count as usize);
                let parity = entries.iter().filter(|e| e.isParity != 0).count() as u32;
                return Ok(SramUnique {
                    parity,
                    sec_ded: count - parity,
                });
            }
            Ok(()) | Err(NvmlError::InsufficientSize(_)) => {
                // SAFETY: plain integers, for which zero is a value.
                entries = vec![unsafe { std::mem::zeroed() }; count as usize];
            }
            Err(e) => return Err(e),
        }
    }
    Err(NvmlError::InsufficientSize(None))
}

/// Blackwell and newer: struct version 2, else 1 where the driver answers
/// ARGUMENT_VERSION_MISMATCH.
pub(crate) fn platform_info(
    getter: getter!(*mut nvmlPlatformInfo_v2_t),
    handle: nvmlDevice_t,
) -> Result<PlatformInfo, NvmlError> {
    let getter = getter?;
    let ask = |version: c_uint| {
        // SAFETY: plain integers and bytes, for which zero is a value.
        let mut info: nvmlPlatformInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = version;
        raw_call!(getter, handle, &mut info).map(|()| info)
    };
    let (info, v2) = match ask(PLATFORM_V2) {
        Err(NvmlError::UnexpectedVariant(ARGUMENT_VERSION_MISMATCH)) => (ask(PLATFORM_V1)?, false),
        answer => (answer?, true),
    };
    Ok(PlatformInfo {
        chassis_serial: if v2 {
            c_text(&info.chassisSerialNumber)
        } else {
            String::new()
        },
        slot: info.slotNumber,
        tray: info.trayIndex,
        host_id: info.hostId,
        module_id: info.moduleId,
    })
}

/// `nvmlUnrepairableMemoryStatus_v1_t` (nvml.h of CUDA 13.1; no version field).
#[repr(C)]
struct UnrepairableMemoryStatus {
    unrepairable: c_uint,
}

type UnrepairableGetter =
    unsafe extern "C" fn(nvmlDevice_t, *mut UnrepairableMemoryStatus) -> nvmlReturn_t;

/// Hopper and newer, first in the R590 header (driver 580.159 answers it):
/// newer than the bindings, so the
/// symbol is looked up by name.
pub(crate) fn memory_unrepairable(
    lib: &NvmlLib,
    name: &str,
    handle: nvmlDevice_t,
) -> Result<bool, NvmlError> {
    // SAFETY: NVML exports this name with this signature (nvml.h, R590).
    let getter = unsafe { lib.__library.get::<UnrepairableGetter>(name.as_bytes()) }
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let status = UnrepairableMemoryStatus { unrepairable: 0 };
    out(Ok(&*getter), handle, status).map(|status| status.unrepairable != 0)
}

/// Superchips (GH200, GB200), driver 545 and later. `nvmlC2cModeInfo_v1_t`
/// has no version field, though nvml.h defines a version word for it.
pub(crate) fn c2c_enabled(
    getter: getter!(*mut nvmlC2cModeInfo_v1_t),
    handle: nvmlDevice_t,
) -> Result<bool, NvmlError> {
    let mode = nvmlC2cModeInfo_v1_t { isC2cEnabled: 0 };
    out(getter, handle, mode).map(|mode| mode.isC2cEnabled != 0)
}
