//! The exported NVML entry points.
//!
//! Each one has NVML's C signature and runs its body through [`guard`], so a
//! panic answers `NVML_ERROR_UNKNOWN` instead of unwinding into C.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::ffi::*;
use crate::scenario::{
    pattern_value, Gpu, Memory, Scenario, Text, CLOCK_ENV, CLOCK_FROM_ENV, DEFAULT_CLOCK_US,
    MAX_MIG_SLOTS,
};
use crate::state::{
    device_call, device_call_asking, gpu_call, gpu_handle, guard, handle_by_index, init, loaded,
    mig_handle, sample_alloc, sample_free, sample_live, sample_take, sample_taken, shutdown,
    system_call, OnMig, Ret,
};

/// `referenceTime` of every `nvmlViolationTime_t` (a fixed timestamp, µs).
pub const VIOLATION_REFERENCE_TIME: u64 = 1_717_200_000_000_000;

/// Defines `#[no_mangle]` exports; `SYM` inside a body is the symbol's name.
macro_rules! export {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block)*) => {$(
        /// NVML entry point of the same name, answering from the scenario.
        ///
        /// # Safety
        ///
        /// Pointer arguments must be null or valid for the reads and writes
        /// NVML documents for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvmlReturn_t {
            #[allow(dead_code)]
            const SYM: &str = stringify!($name);
            guard(|| -> Ret { $body })
        }
    )*};
}

/// Defines device getters that write one value taken from the GPU's scenario
/// entry (`None` answers `NVML_ERROR_NOT_SUPPORTED`); MIG handles get NOT_SUPPORTED.
macro_rules! scalar {
    ($(fn $name:ident($out:ident: *mut $ty:ty) = |$g:ident| $value:expr;)*) => {$(
        export! {
            fn $name(device: nvmlDevice_t, $out: *mut $ty) {
                let d = device_call(SYM, device, !$out.is_null(), OnMig::NotSupported)?;
                let $g: &Gpu = d.gpu();
                put($out, $value)
            }
        }
    )*};
}

/// Writes `value` through `out`, or answers NOT_SUPPORTED when it is absent.
unsafe fn put<T>(out: *mut T, value: Option<T>) -> Ret {
    out.write(value.ok_or(NVML_ERROR_NOT_SUPPORTED)?);
    Ok(())
}

/// Copies a string with its NUL into a caller buffer of `length` bytes.
unsafe fn put_str(buf: *mut c_char, length: c_uint, value: Option<&Text>) -> Ret {
    let bytes = &value.ok_or(NVML_ERROR_NOT_SUPPORTED)?.0;
    if bytes.len() + 1 > length as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
    buf.add(bytes.len()).write(0);
    Ok(())
}

fn enable(on: bool) -> nvmlEnableState_t {
    if on {
        NVML_FEATURE_ENABLED
    } else {
        NVML_FEATURE_DISABLED
    }
}

fn clock(
    clocks: Option<&crate::scenario::Clocks>,
    kind: nvmlClockType_t,
) -> Result<Option<u32>, nvmlReturn_t> {
    let Some(c) = clocks else {
        return Ok(None);
    };
    Ok(match kind {
        0 => c.graphics,
        1 => c.sm,
        2 => c.memory,
        3 => c.video,
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    })
}

fn memory_v1(m: &Memory) -> nvmlMemory_t {
    // The v1 struct has no `reserved`: NVML counts reserved memory as used.
    nvmlMemory_t {
        total: m.total,
        free: m.free,
        used: m.used + m.reserved,
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Synthetic page address `i` retired for `cause` (page aligned, distinct).
fn retired_page_address(cause: u32, i: u32) -> c_ulonglong {
    0x1_0000_0000 + u64::from(cause) * 0x1000_0000 + u64::from(i) * 0x1000
}

/// Shared body of `nvmlDeviceGetRetiredPages` and `_v2`.
unsafe fn retired_pages(
    sym: &str,
    device: nvmlDevice_t,
    cause: u32,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    let d = device_call(sym, device, !page_count.is_null(), OnMig::NotSupported)?;
    let pages = d
        .gpu()
        .retired_pages
        .as_ref()
        .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    let n = match cause {
        0 => pages.single_bit_ecc,
        1 => pages.double_bit_ecc,
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    }
    .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    if *page_count < n {
        *page_count = n;
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *page_count = n;
    if n == 0 {
        return Ok(());
    }
    if addresses.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    for i in 0..n {
        addresses
            .add(i as usize)
            .write(retired_page_address(cause, i));
        if !timestamps.is_null() {
            // Seconds since the epoch, one page a day before the reference time.
            let ts = VIOLATION_REFERENCE_TIME / 1_000_000 - u64::from(n - i) * 86_400;
            timestamps.add(i as usize).write(ts);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// System

export! {
    fn nvmlInit_v2() {
        init()
    }

    fn nvmlInitWithFlags(_flags: c_uint) {
        init()
    }

    fn nvmlShutdown() {
        shutdown()
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        let s = system_call(SYM, !version.is_null())?;
        put_str(version, length, s.system.driver_version.as_ref())
    }

    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        let s = system_call(SYM, !version.is_null())?;
        put_str(version, length, s.system.nvml_version.as_ref())
    }

    fn nvmlSystemGetCudaDriverVersion(cudaDriverVersion: *mut c_int) {
        let s = system_call(SYM, !cudaDriverVersion.is_null())?;
        put(cudaDriverVersion, s.system.cuda_driver_version)
    }

    fn nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion: *mut c_int) {
        let s = system_call(SYM, !cudaDriverVersion.is_null())?;
        put(cudaDriverVersion, s.system.cuda_driver_version)
    }

    fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) {
        let s = system_call(SYM, !deviceCount.is_null())?;
        if let Some(code) = s.system.device_count_error {
            return Err(code.0);
        }
        put(deviceCount, Some(s.gpus.len() as c_uint))
    }

    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) {
        let handle = handle_by_index(SYM, index, !device.is_null())?;
        put(device, Some(handle))
    }
}

/// `nvmlErrorString`: a static, NUL-terminated description of `result`.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    std::panic::catch_unwind(|| {
        RETURN_CODES
            .iter()
            .find(|(_, code, _)| *code == result)
            .map_or(c"Unknown Error", |(_, _, text)| text)
    })
    .unwrap_or(c"Unknown Error")
    .as_ptr()
}

// ---------------------------------------------------------------------------
// Identity

export! {
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let d = device_call(SYM, device, !uuid.is_null(), OnMig::Answers)?;
        match d.mig() {
            Some(mig) => put_str(uuid, length, Some(&mig.uuid)),
            None => put_str(uuid, length, d.gpu().uuid.as_ref()),
        }
    }

    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let d = device_call(SYM, device, !name.is_null(), OnMig::Answers)?;
        match d.mig() {
            Some(mig) => put_str(name, length, mig.name.as_ref()),
            None => put_str(name, length, d.gpu().name.as_ref()),
        }
    }

    fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) {
        let d = device_call(SYM, device, !serial.is_null(), OnMig::NotSupported)?;
        put_str(serial, length, d.gpu().serial.as_ref())
    }

    fn nvmlDeviceGetVbiosVersion(device: nvmlDevice_t, version: *mut c_char, length: c_uint) {
        let d = device_call(SYM, device, !version.is_null(), OnMig::NotSupported)?;
        put_str(version, length, d.gpu().vbios_version.as_ref())
    }

    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let d = device_call(SYM, device, !pci.is_null(), OnMig::NotSupported)?;
        let p = d.gpu().pci.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let mut info = nvmlPciInfo_t {
            busIdLegacy: [0; 16],
            domain: p.domain,
            bus: p.bus,
            device: p.device,
            pciDeviceId: p.pci_device_id,
            pciSubSystemId: p.pci_subsystem_id,
            busId: [0; 32],
        };
        let legacy = format!("{:04X}:{:02X}:{:02X}.0", p.domain, p.bus, p.device);
        for (dst, src) in info.busIdLegacy.iter_mut().zip(legacy.bytes().take(15)) {
            *dst = src as c_char;
        }
        for (dst, src) in info.busId.iter_mut().zip(p.bus_id.0.iter().take(31)) {
            *dst = *src as c_char;
        }
        put(pci, Some(info))
    }
}

scalar! {
    fn nvmlDeviceGetBrand(type_: *mut nvmlBrandType_t) = |g| g.brand;
    fn nvmlDeviceGetArchitecture(arch: *mut nvmlDeviceArchitecture_t) = |g| g.architecture;
    fn nvmlDeviceGetMinorNumber(minorNumber: *mut c_uint) = |g| g.minor_number;
}

// ---------------------------------------------------------------------------
// Utilization, memory, temperature, power, clocks

export! {
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) {
        let d = device_call(SYM, device, !utilization.is_null(), OnMig::NotSupported)?;
        let u = d.gpu().utilization.as_ref().map(|u| nvmlUtilization_t {
            gpu: u.gpu,
            memory: u.memory,
        });
        put(utilization, u)
    }

    fn nvmlDeviceGetMarginTemperature(
        device: nvmlDevice_t,
        marginTempInfo: *mut nvmlMarginTemperature_t,
    ) {
        let d = device_call(SYM, device, !marginTempInfo.is_null(), OnMig::NotSupported)?;
        if (*marginTempInfo).version != NVML_MARGIN_TEMPERATURE_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        put(
            marginTempInfo,
            d.gpu().margin_temperature.map(|margin| nvmlMarginTemperature_t {
                version: NVML_MARGIN_TEMPERATURE_V1,
                marginTemperature: margin,
            }),
        )
    }

    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) {
        let d = device_call(SYM, device, !memory.is_null(), OnMig::Answers)?;
        let m = match d.mig() {
            Some(mig) => mig.memory.as_ref(),
            None => d.gpu().memory.as_ref(),
        };
        put(memory, m.map(memory_v1))
    }

    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) {
        let d = device_call(SYM, device, !memory.is_null(), OnMig::Answers)?;
        if (*memory).version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let m = match d.mig() {
            Some(mig) => mig.memory.as_ref(),
            None => d.gpu().memory.as_ref(),
        };
        put(
            memory,
            m.map(|m| nvmlMemory_v2_t {
                version: NVML_MEMORY_V2,
                total: m.total,
                reserved: m.reserved,
                free: m.free,
                used: m.used,
            }),
        )
    }

    fn nvmlDeviceGetBAR1MemoryInfo(device: nvmlDevice_t, bar1Memory: *mut nvmlBAR1Memory_t) {
        let d = device_call(SYM, device, !bar1Memory.is_null(), OnMig::NotSupported)?;
        let b = d.gpu().bar1.as_ref().map(|b| nvmlBAR1Memory_t {
            bar1Total: b.total,
            bar1Free: b.free,
            bar1Used: b.used,
        });
        put(bar1Memory, b)
    }

    fn nvmlDeviceGetTemperature(
        device: nvmlDevice_t,
        sensorType: nvmlTemperatureSensors_t,
        temp: *mut c_uint,
    ) {
        let d = device_call(SYM, device, !temp.is_null(), OnMig::NotSupported)?;
        if sensorType != 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        put(temp, d.gpu().temperature)
    }

    fn nvmlDeviceGetTemperatureV(device: nvmlDevice_t, temperature: *mut nvmlTemperature_t) {
        let d = device_call(SYM, device, !temperature.is_null(), OnMig::NotSupported)?;
        if (*temperature).version != NVML_TEMPERATURE_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if (*temperature).sensorType != 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let celsius = d.gpu().temperature.ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        // A sentinel beyond the signed range stays one (INT_MAX), rather
        // than wrapping to a plausible -1.
        (*temperature).temperature = c_int::try_from(celsius).unwrap_or(c_int::MAX);
        Ok(())
    }

    fn nvmlDeviceGetGpuFabricInfo(device: nvmlDevice_t, gpuFabricInfo: *mut nvmlGpuFabricInfo_t) {
        let d = device_call(SYM, device, !gpuFabricInfo.is_null(), OnMig::NotSupported)?;
        let f = d.gpu().fabric.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        gpuFabricInfo.write(nvmlGpuFabricInfo_t {
            clusterUuid: f.cluster_uuid,
            status: f.status,
            cliqueId: f.clique_id,
            state: f.state,
        });
        Ok(())
    }

    fn nvmlDeviceGetGpuFabricInfoV(
        device: nvmlDevice_t,
        gpuFabricInfo: *mut nvmlGpuFabricInfo_v3_t,
    ) {
        let d = device_call(SYM, device, !gpuFabricInfo.is_null(), OnMig::NotSupported)?;
        let f = d.gpu().fabric.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let version = (*gpuFabricInfo).version;
        match (version, f.max_version) {
            (NVML_GPU_FABRIC_INFO_V3, 3) => gpuFabricInfo.write(nvmlGpuFabricInfo_v3_t {
                version,
                clusterUuid: f.cluster_uuid,
                status: f.status,
                cliqueId: f.clique_id,
                state: f.state,
                healthMask: f.health_mask,
                healthSummary: f.health_summary,
            }),
            (NVML_GPU_FABRIC_INFO_V2, 2) => {
                gpuFabricInfo
                    .cast::<nvmlGpuFabricInfo_v2_t>()
                    .write(nvmlGpuFabricInfo_v2_t {
                        version,
                        clusterUuid: f.cluster_uuid,
                        status: f.status,
                        cliqueId: f.clique_id,
                        state: f.state,
                        healthMask: f.health_mask,
                    })
            }
            _ => return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        }
        Ok(())
    }

    fn nvmlDeviceGetTemperatureThreshold(
        device: nvmlDevice_t,
        thresholdType: nvmlTemperatureThresholds_t,
        temp: *mut c_uint,
    ) {
        let d = device_call(SYM, device, !temp.is_null(), OnMig::NotSupported)?;
        let t = d.gpu().temperature_thresholds.as_ref();
        let value = match thresholdType {
            0 => t.and_then(|t| t.shutdown),
            1 => t.and_then(|t| t.slowdown),
            2 => t.and_then(|t| t.mem_max),
            3 => t.and_then(|t| t.gpu_max),
            // Acoustic and GPS thresholds: valid types the fake never supports.
            4..=7 => None,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(temp, value)
    }

    fn nvmlDeviceGetPowerManagementLimitConstraints(
        device: nvmlDevice_t,
        minLimit: *mut c_uint,
        maxLimit: *mut c_uint,
    ) {
        let outs_ok = !minLimit.is_null() && !maxLimit.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let c = d.gpu().power_limit_constraints_mw.as_ref();
        put(minLimit, c.map(|c| c.min))?;
        put(maxLimit, c.map(|c| c.max))
    }

    fn nvmlDeviceGetClockInfo(device: nvmlDevice_t, type_: nvmlClockType_t, clock_: *mut c_uint) {
        let d = device_call(SYM, device, !clock_.is_null(), OnMig::NotSupported)?;
        put(clock_, clock(d.gpu().clocks_mhz.as_ref(), type_)?)
    }

    fn nvmlDeviceGetMaxClockInfo(
        device: nvmlDevice_t,
        type_: nvmlClockType_t,
        clock_: *mut c_uint,
    ) {
        let d = device_call(SYM, device, !clock_.is_null(), OnMig::NotSupported)?;
        put(clock_, clock(d.gpu().max_clocks_mhz.as_ref(), type_)?)
    }

    fn nvmlDeviceGetFanSpeed_v2(device: nvmlDevice_t, fan: c_uint, speed: *mut c_uint) {
        let d = device_call(SYM, device, !speed.is_null(), OnMig::NotSupported)?;
        let fans = d.gpu().fan_speeds.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let value = fans.get(fan as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        put(speed, Some(*value))
    }

    fn nvmlDeviceGetViolationStatus(
        device: nvmlDevice_t,
        perfPolicyType: nvmlPerfPolicyType_t,
        violTime: *mut nvmlViolationTime_t,
    ) {
        let d = device_call(SYM, device, !violTime.is_null(), OnMig::NotSupported)?;
        let v = d.gpu().violations_ns.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let value = match perfPolicyType {
            0 => v.power,
            1 => v.thermal,
            2 => v.sync_boost,
            3 => v.board_limit,
            4 => v.low_utilization,
            5 => v.reliability,
            10 => v.total_app_clocks,
            11 => v.total_base_clocks,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(
            violTime,
            value.map(|ns| nvmlViolationTime_t {
                referenceTime: VIOLATION_REFERENCE_TIME,
                violationTime: ns,
            }),
        )
    }

    fn nvmlDeviceGetPcieThroughput(
        device: nvmlDevice_t,
        counter: nvmlPcieUtilCounter_t,
        value: *mut c_uint,
    ) {
        let d = device_call(SYM, device, !value.is_null(), OnMig::NotSupported)?;
        let p = d.gpu().pcie.as_ref();
        let kbps = match counter {
            0 => p.and_then(|p| p.tx_kbps),
            1 => p.and_then(|p| p.rx_kbps),
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(value, kbps)
    }

    fn nvmlDeviceGetFieldValues(
        device: nvmlDevice_t,
        valuesCount: c_int,
        values: *mut nvmlFieldValue_t,
    ) {
        let outs_ok = valuesCount >= 0 && (valuesCount == 0 || !values.is_null());
        // The fields asked, for the call log.
        let asked: Vec<String> = match outs_ok {
            true => (0..valuesCount as usize)
                .map(|i| {
                    let v = &*values.add(i);
                    format!("{}:{}", v.fieldId, v.scopeId)
                })
                .collect(),
            false => Vec::new(),
        };
        let d = device_call_asking(SYM, device, outs_ok, OnMig::NotSupported, &asked.join(","))?;
        let fields = &d.gpu().fields;
        let signed = &d.gpu().signed_fields;
        let double = &d.gpu().double_fields;
        let timestamp = now_us();
        for i in 0..valuesCount as usize {
            let v = &mut *values.add(i);
            let key = (v.fieldId, Some(v.scopeId));
            let any_scope = (v.fieldId, None);
            let found = fields.get(&key).or_else(|| fields.get(&any_scope));
            let found_signed = signed.get(&key).or_else(|| signed.get(&any_scope));
            let found_double = double.get(&key).or_else(|| double.get(&any_scope));
            v.timestamp = timestamp;
            v.latencyUsec = 0;
            v.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v.nvmlReturn = NVML_SUCCESS;
            v.value.ullVal = 0;
            match (found, found_signed, found_double) {
                (Some(value), _, _) => v.value.ullVal = *value,
                (None, Some(value), _) => {
                    v.valueType = NVML_VALUE_TYPE_SIGNED_INT;
                    v.value.siVal = *value;
                }
                (None, None, Some(value)) => {
                    v.valueType = NVML_VALUE_TYPE_DOUBLE;
                    v.value.dVal = *value;
                }
                (None, None, None) => v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED,
            }
        }
        Ok(())
    }
}

scalar! {
    fn nvmlDeviceGetPowerUsage(power: *mut c_uint) = |g| g.power_usage_mw;
    fn nvmlDeviceGetEnforcedPowerLimit(limit: *mut c_uint) = |g| g.enforced_power_limit_mw;
    fn nvmlDeviceGetPowerManagementLimit(limit: *mut c_uint) = |g| g.power_limit_mw;
    fn nvmlDeviceGetPowerManagementDefaultLimit(defaultLimit: *mut c_uint) =
        |g| g.default_power_limit_mw;
    fn nvmlDeviceGetPerformanceState(pState: *mut nvmlPstates_t) = |g| g.pstate;
    fn nvmlDeviceGetNumFans(numFans: *mut c_uint) =
        |g| g.fan_speeds.as_ref().map(|f| f.len() as c_uint);
    fn nvmlDeviceGetFanSpeed(speed: *mut c_uint) =
        |g| g.fan_speeds.as_ref().and_then(|f| f.first().copied());
    fn nvmlDeviceGetCurrentClocksEventReasons(clocksEventReasons: *mut c_ulonglong) =
        |g| g.clocks_event_reasons;
    fn nvmlDeviceGetCurrentClocksThrottleReasons(clocksThrottleReasons: *mut c_ulonglong) =
        |g| g.clocks_event_reasons;
    fn nvmlDeviceGetSupportedClocksEventReasons(supportedClocksEventReasons: *mut c_ulonglong) =
        |g| g.supported_clocks_event_reasons;
    fn nvmlDeviceGetSupportedClocksThrottleReasons(
        supportedClocksThrottleReasons: *mut c_ulonglong
    ) = |g| g.supported_clocks_event_reasons;
    fn nvmlDeviceGetCurrPcieLinkGeneration(currLinkGen: *mut c_uint) =
        |g| g.pcie.as_ref().and_then(|p| p.gen);
    fn nvmlDeviceGetMaxPcieLinkGeneration(maxLinkGen: *mut c_uint) =
        |g| g.pcie.as_ref().and_then(|p| p.max_gen);
    fn nvmlDeviceGetCurrPcieLinkWidth(currLinkWidth: *mut c_uint) =
        |g| g.pcie.as_ref().and_then(|p| p.width);
    fn nvmlDeviceGetMaxPcieLinkWidth(maxLinkWidth: *mut c_uint) =
        |g| g.pcie.as_ref().and_then(|p| p.max_width);
    fn nvmlDeviceGetPcieReplayCounter(value: *mut c_uint) =
        |g| g.pcie.as_ref().and_then(|p| p.replay_counter);
}

// ---------------------------------------------------------------------------
// ECC, retired pages, remapped rows

export! {
    fn nvmlDeviceGetEccMode(
        device: nvmlDevice_t,
        current: *mut nvmlEnableState_t,
        pending: *mut nvmlEnableState_t,
    ) {
        let outs_ok = !current.is_null() && !pending.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let m = d.gpu().ecc_mode.as_ref();
        put(current, m.map(|m| enable(m.current)))?;
        put(pending, m.map(|m| enable(m.pending)))
    }

    fn nvmlDeviceGetTotalEccErrors(
        device: nvmlDevice_t,
        errorType: nvmlMemoryErrorType_t,
        counterType: nvmlEccCounterType_t,
        eccCounts: *mut c_ulonglong,
    ) {
        let d = device_call(SYM, device, !eccCounts.is_null(), OnMig::NotSupported)?;
        let e = d.gpu().ecc_errors.as_ref();
        let value = match (errorType, counterType) {
            (0, 0) => e.and_then(|e| e.volatile_corrected),
            (1, 0) => e.and_then(|e| e.volatile_uncorrected),
            (0, 1) => e.and_then(|e| e.aggregate_corrected),
            (1, 1) => e.and_then(|e| e.aggregate_uncorrected),
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(eccCounts, value)
    }

    fn nvmlDeviceGetRetiredPages(
        device: nvmlDevice_t,
        cause: nvmlPageRetirementCause_t,
        pageCount: *mut c_uint,
        addresses: *mut c_ulonglong,
    ) {
        retired_pages(SYM, device, cause, pageCount, addresses, std::ptr::null_mut())
    }

    fn nvmlDeviceGetRetiredPages_v2(
        device: nvmlDevice_t,
        cause: nvmlPageRetirementCause_t,
        pageCount: *mut c_uint,
        addresses: *mut c_ulonglong,
        timestamps: *mut c_ulonglong,
    ) {
        retired_pages(SYM, device, cause, pageCount, addresses, timestamps)
    }

    fn nvmlDeviceGetRetiredPagesPendingStatus(
        device: nvmlDevice_t,
        isPending: *mut nvmlEnableState_t,
    ) {
        let d = device_call(SYM, device, !isPending.is_null(), OnMig::NotSupported)?;
        let pending = d.gpu().retired_pages.as_ref().and_then(|r| r.pending);
        put(isPending, pending.map(enable))
    }

    fn nvmlDeviceGetRemappedRows(
        device: nvmlDevice_t,
        corrRows: *mut c_uint,
        uncRows: *mut c_uint,
        isPending: *mut c_uint,
        failureOccurred: *mut c_uint,
    ) {
        let outs_ok = !corrRows.is_null()
            && !uncRows.is_null()
            && !isPending.is_null()
            && !failureOccurred.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let r = d.gpu().remapped_rows.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        put(corrRows, Some(r.correctable))?;
        put(uncRows, Some(r.uncorrectable))?;
        put(isPending, Some(c_uint::from(r.pending)))?;
        put(failureOccurred, Some(c_uint::from(r.failure)))
    }

    fn nvmlDeviceGetRowRemapperHistogram(
        device: nvmlDevice_t,
        values: *mut nvmlRowRemapperHistogramValues_t,
    ) {
        let d = device_call(SYM, device, !values.is_null(), OnMig::NotSupported)?;
        let h = d.gpu().row_remapper_histogram.as_ref();
        put(
            values,
            h.map(|h| nvmlRowRemapperHistogramValues_t {
                max: h.max,
                high: h.high,
                partial: h.partial,
                low: h.low,
                none: h.none,
            }),
        )
    }

    fn nvmlDeviceGetRepairStatus(device: nvmlDevice_t, repairStatus: *mut nvmlRepairStatus_t) {
        let d = device_call(SYM, device, !repairStatus.is_null(), OnMig::NotSupported)?;
        if (*repairStatus).version != NVML_REPAIR_STATUS_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let r = d.gpu().repair_status.as_ref();
        put(
            repairStatus,
            r.map(|r| nvmlRepairStatus_t {
                version: NVML_REPAIR_STATUS_V1,
                bChannelRepairPending: c_uint::from(r.channel),
                bTpcRepairPending: c_uint::from(r.tpc),
            }),
        )
    }

    fn nvmlDeviceGetSramEccErrorStatus(
        device: nvmlDevice_t,
        status: *mut nvmlEccSramErrorStatus_t,
    ) {
        let d = device_call(SYM, device, !status.is_null(), OnMig::NotSupported)?;
        if (*status).version != NVML_ECC_SRAM_ERROR_STATUS_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let e = d.gpu().sram_ecc.as_ref();
        put(
            status,
            e.map(|e| nvmlEccSramErrorStatus_t {
                version: NVML_ECC_SRAM_ERROR_STATUS_V1,
                aggregateUncParity: e.aggregate_unc_parity,
                aggregateUncSecDed: e.aggregate_unc_sec_ded,
                aggregateCor: e.aggregate_cor,
                volatileUncParity: e.volatile_unc_parity,
                volatileUncSecDed: e.volatile_unc_sec_ded,
                volatileCor: e.volatile_cor,
                aggregateUncBucketL2: e.aggregate_unc_bucket_l2,
                aggregateUncBucketSm: e.aggregate_unc_bucket_sm,
                aggregateUncBucketPcie: e.aggregate_unc_bucket_pcie,
                aggregateUncBucketMcu: e.aggregate_unc_bucket_mcu,
                aggregateUncBucketOther: e.aggregate_unc_bucket_other,
                bThresholdExceeded: c_uint::from(e.threshold_exceeded),
            }),
        )
    }

    fn nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts(
        device: nvmlDevice_t,
        counts: *mut nvmlEccSramUniqueUncorrectedErrorCounts_t,
    ) {
        let d = device_call(SYM, device, !counts.is_null(), OnMig::NotSupported)?;
        if (*counts).version != NVML_ECC_SRAM_UNIQUE_COUNTS_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let entries = d.gpu().sram_unique.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let room = (*counts).entryCount as usize;
        (*counts).entryCount = entries.len() as c_uint;
        if (*counts).entries.is_null() {
            return Ok(());
        }
        if room < entries.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, e) in entries.iter().enumerate() {
            (*counts).entries.add(i).write(nvmlEccSramUniqueUncorrectedErrorEntry_t {
                unit: e.unit,
                location: e.location,
                sublocation: e.sublocation,
                extlocation: e.extlocation,
                address: e.address,
                isParity: c_uint::from(e.is_parity),
                count: e.count,
            });
        }
        Ok(())
    }

    fn nvmlDeviceGetUnrepairableMemoryFlag_v1(
        device: nvmlDevice_t,
        unrepairableMemoryStatus: *mut nvmlUnrepairableMemoryStatus_t,
    ) {
        let out = unrepairableMemoryStatus;
        let d = device_call(SYM, device, !out.is_null(), OnMig::NotSupported)?;
        let flag = d.gpu().memory_unrepairable;
        put(
            out,
            flag.map(|on| nvmlUnrepairableMemoryStatus_t {
                bUnrepairableMemory: c_uint::from(on),
            }),
        )
    }

    fn nvmlDeviceGetC2cModeInfoV(device: nvmlDevice_t, c2cModeInfo: *mut nvmlC2cModeInfo_t) {
        let d = device_call(SYM, device, !c2cModeInfo.is_null(), OnMig::NotSupported)?;
        let on = d.gpu().c2c_enabled;
        put(
            c2cModeInfo,
            on.map(|on| nvmlC2cModeInfo_t {
                isC2cEnabled: c_uint::from(on),
            }),
        )
    }

    fn nvmlDeviceGetPlatformInfo(device: nvmlDevice_t, platformInfo: *mut nvmlPlatformInfo_t) {
        let d = device_call(SYM, device, !platformInfo.is_null(), OnMig::NotSupported)?;
        let p = d.gpu().platform.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let version = (*platformInfo).version;
        let accepted = match p.max_version.unwrap_or(2) {
            1 => version == NVML_PLATFORM_INFO_V1,
            _ => version == NVML_PLATFORM_INFO_V1 || version == NVML_PLATFORM_INFO_V2,
        };
        if !accepted {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let mut serial = [0u8; 16];
        let bytes = &p.chassis_serial.0[..p.chassis_serial.0.len().min(16)];
        serial[..bytes.len()].copy_from_slice(bytes);
        put(
            platformInfo,
            Some(nvmlPlatformInfo_t {
                version,
                ibGuid: p.ib_guid,
                chassisSerialNumber: serial,
                slotNumber: p.slot,
                trayIndex: p.tray,
                hostId: p.host_id,
                peerType: p.peer_type,
                moduleId: p.module_id,
            }),
        )
    }
}

// ---------------------------------------------------------------------------
// Encoder, decoder, modes

export! {
    fn nvmlDeviceGetEncoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        samplingPeriodUs: *mut c_uint,
    ) {
        let outs_ok = !utilization.is_null() && !samplingPeriodUs.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let e = d.gpu().encoder.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let (Some(u), Some(p)) = (e.utilization, e.sampling_period_us) else {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        };
        put(utilization, Some(u))?;
        put(samplingPeriodUs, Some(p))
    }

    fn nvmlDeviceGetDecoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        samplingPeriodUs: *mut c_uint,
    ) {
        let outs_ok = !utilization.is_null() && !samplingPeriodUs.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let dec = d.gpu().decoder.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        put(utilization, Some(dec.utilization))?;
        put(samplingPeriodUs, Some(dec.sampling_period_us))
    }

    fn nvmlDeviceGetEncoderStats(
        device: nvmlDevice_t,
        sessionCount: *mut c_uint,
        averageFps: *mut c_uint,
        averageLatency: *mut c_uint,
    ) {
        let outs_ok = !sessionCount.is_null() && !averageFps.is_null() && !averageLatency.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let e = d.gpu().encoder.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let (Some(s), Some(f), Some(l)) = (e.session_count, e.average_fps, e.average_latency_us)
        else {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        };
        put(sessionCount, Some(s))?;
        put(averageFps, Some(f))?;
        put(averageLatency, Some(l))
    }

    fn nvmlDeviceGetJpgUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        samplingPeriodUs: *mut c_uint,
    ) {
        let outs_ok = !utilization.is_null() && !samplingPeriodUs.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let jpeg = d.gpu().jpeg.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        put(utilization, Some(jpeg.utilization))?;
        put(samplingPeriodUs, Some(jpeg.sampling_period_us))
    }

    fn nvmlDeviceGetOfaUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        samplingPeriodUs: *mut c_uint,
    ) {
        let outs_ok = !utilization.is_null() && !samplingPeriodUs.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let ofa = d.gpu().ofa.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        put(utilization, Some(ofa.utilization))?;
        put(samplingPeriodUs, Some(ofa.sampling_period_us))
    }

    fn nvmlDeviceGetMigMode(
        device: nvmlDevice_t,
        currentMode: *mut c_uint,
        pendingMode: *mut c_uint,
    ) {
        let outs_ok = !currentMode.is_null() && !pendingMode.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        let m = d.gpu().mig_mode.as_ref();
        put(currentMode, m.map(|m| m.current))?;
        put(pendingMode, m.map(|m| m.pending))
    }
}

scalar! {
    fn nvmlDeviceGetPersistenceMode(mode: *mut nvmlEnableState_t) =
        |g| g.persistence_mode.map(enable);
    fn nvmlDeviceGetComputeMode(mode: *mut nvmlComputeMode_t) = |g| g.compute_mode;
    fn nvmlDeviceGetMaxMigDeviceCount(count: *mut c_uint) = |g| g.max_mig_device_count;
}

// ---------------------------------------------------------------------------
// NVLink

export! {
    fn nvmlDeviceGetNvLinkState(
        device: nvmlDevice_t,
        link: c_uint,
        isActive: *mut nvmlEnableState_t,
    ) {
        let d = device_call(SYM, device, !isActive.is_null(), OnMig::NotSupported)?;
        let links = d.gpu().nvlinks.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let l = links.get(link as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        put(isActive, l.active.map(enable))
    }

    fn nvmlDeviceGetNvLinkErrorCounter(
        device: nvmlDevice_t,
        link: c_uint,
        counter: nvmlNvLinkErrorCounter_t,
        counterValue: *mut c_ulonglong,
    ) {
        let d = device_call(SYM, device, !counterValue.is_null(), OnMig::NotSupported)?;
        let links = d.gpu().nvlinks.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let l = links.get(link as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let e = l.errors.as_ref();
        let value = match counter {
            0 => e.and_then(|e| e.replay),
            1 => e.and_then(|e| e.recovery),
            2 => e.and_then(|e| e.crc_flit),
            3 => e.and_then(|e| e.crc_data),
            4 => e.and_then(|e| e.ecc_data),
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        put(counterValue, value)
    }
}

// ---------------------------------------------------------------------------
// MIG

export! {
    fn nvmlDeviceGetMigDeviceHandleByIndex(
        device: nvmlDevice_t,
        index: c_uint,
        migDevice: *mut nvmlDevice_t,
    ) {
        let d = device_call(SYM, device, !migDevice.is_null(), OnMig::NotSupported)?;
        let migs = d.gpu().mig_devices.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let max = d.gpu().max_mig_device_count.map_or(MAX_MIG_SLOTS, |m| m as usize);
        if index as usize >= max.min(MAX_MIG_SLOTS) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if !migs.iter().any(|m| m.slot == index) {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        put(migDevice, Some(mig_handle(d.gpu, index as usize)))
    }

    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, isMigDevice: *mut c_uint) {
        let d = device_call(SYM, device, !isMigDevice.is_null(), OnMig::Answers)?;
        put(isMigDevice, Some(c_uint::from(d.mig.is_some())))
    }

    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        let d = device_call(SYM, device, !id.is_null(), OnMig::Answers)?;
        let mig = d.mig().ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        put(id, Some(mig.gpu_instance_id))
    }

    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        let d = device_call(SYM, device, !id.is_null(), OnMig::Answers)?;
        let mig = d.mig().ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        put(id, Some(mig.compute_instance_id))
    }

    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        migDevice: nvmlDevice_t,
        device: *mut nvmlDevice_t,
    ) {
        let d = device_call(SYM, migDevice, !device.is_null(), OnMig::Answers)?;
        if d.mig.is_none() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        put(device, Some(gpu_handle(d.gpu)))
    }
}

// ---------------------------------------------------------------------------
// Processes

export! {
    fn nvmlDeviceGetComputeRunningProcesses_v3(
        device: nvmlDevice_t,
        infoCount: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        let d = device_call(SYM, device, !infoCount.is_null(), OnMig::NotSupported)?;
        let procs = d.gpu().processes.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let n = procs.len() as c_uint;
        if n == 0 {
            *infoCount = 0;
            return Ok(());
        }
        if *infoCount < n {
            *infoCount = n;
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if infos.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for (i, p) in procs.iter().enumerate() {
            infos.add(i).write(nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
                gpuInstanceId: p.gpu_instance_id,
                computeInstanceId: p.compute_instance_id,
            });
        }
        *infoCount = n;
        Ok(())
    }
}

export! {
    fn nvmlDeviceGetTotalEnergyConsumption(device: nvmlDevice_t, energy: *mut c_ulonglong) {
        let d = device_call(SYM, device, !energy.is_null(), OnMig::NotSupported)?;
        let g = d.gpu();
        let grown = match g.energy_mw {
            Some(mw) => {
                let elapsed_us = clock_us(&d.scenario)?.saturating_sub(DEFAULT_CLOCK_US);
                (u128::from(mw) * u128::from(elapsed_us) / 1_000_000) as u64
            }
            None => 0,
        };
        put(energy, g.total_energy_mj.map(|mj| mj + grown))
    }
}

// Sample buffers

/// "Now" for the sample buffers: `FAKE_NVML_CLOCK_US`, else
/// `FAKE_NVML_CLOCK_FROM_US` plus the time since the first clock read of
/// this process, else the scenario's `clock` (a fixed default, or the wall
/// clock). An unparsable variable answers `NVML_ERROR_UNKNOWN`.
fn clock_us(scenario: &Scenario) -> Result<u64, nvmlReturn_t> {
    static FIRST_READ: OnceLock<Instant> = OnceLock::new();
    let running = std::env::var(CLOCK_FROM_ENV).ok().map(|from| {
        let since = FIRST_READ.get_or_init(Instant::now).elapsed().as_micros();
        match from.trim().parse::<u64>() {
            Ok(from) => (from + u64::try_from(since).unwrap_or(0)).to_string(),
            Err(_) => from,
        }
    });
    let env = std::env::var(CLOCK_ENV).ok().or(running);
    let wall = u64::try_from(now_us()).unwrap_or(0);
    scenario
        .clock
        .now_us(
            env.as_deref(),
            wall,
            scenario.recorded_at_us.unwrap_or(DEFAULT_CLOCK_US),
        )
        .map_err(|why| {
            eprintln!("fake-nvml: {why}");
            NVML_ERROR_UNKNOWN
        })
}

/// The sample buffer of sampling type `kind` at `now` as `(timestamp,
/// percent)`, oldest first: the recording's, else generated from the
/// scenario's streams; `None`: not supported.
fn sample_buffer(gpu: &Gpu, kind: c_uint, now: u64) -> Option<Vec<(u64, u32)>> {
    if let Some(recording) = &gpu.recording {
        return recording.samples(kind, now);
    }
    let buffers = gpu.samples.as_ref()?;
    let pattern = buffers.pattern(kind)?;
    Some(
        buffers
            .timestamps(now)
            .into_iter()
            .map(|ts| (ts, pattern_value(pattern, ts, buffers.period_us)))
            .collect(),
    )
}

/// `nvmlDeviceGetProcessUtilization`'s entries since `last_seen`: the
/// recording's, else one entry per process as the H200 answers (driver 580,
/// tests/captures/h200-load.toml): its mean SM percent over the GPU samples
/// newer than `last_seen` (idle periods count 0), stamped with the newest of
/// them it was busy in; a process idle over all of them is not listed.
/// (The synthetic streams of `samples`; a `recording` answers as recorded.)
/// `None`: not supported.
fn process_entries(gpu: &Gpu, last_seen: u64, now: u64) -> Option<Vec<[u64; 6]>> {
    if let Some(recording) = &gpu.recording {
        return recording.process_entries(last_seen);
    }
    let buffers = gpu.samples.as_ref()?;
    let mut stamps: Vec<u64> = buffers
        .timestamps(now)
        .into_iter()
        .filter(|&ts| ts > last_seen)
        .collect();
    // A sample NVML returns twice (`duplicate_last`) is one sample period.
    stamps.dedup();
    let mut entries = Vec::new();
    for process in gpu.processes.iter().flatten() {
        let Some(pattern) = &process.sm else { continue };
        let values: Vec<(u64, u64)> = stamps
            .iter()
            .map(|&ts| (ts, u64::from(pattern_value(pattern, ts, buffers.period_us))))
            .collect();
        let Some(&(newest, _)) = values.iter().rev().find(|&&(_, sm)| sm > 0) else {
            continue;
        };
        let total: u64 = values.iter().map(|&(_, sm)| sm).sum();
        let mean = (total + values.len() as u64 / 2) / values.len() as u64;
        entries.push([u64::from(process.pid), newest, mean, 0, 0, 0]);
    }
    Some(entries)
}

/// NVML's sizing protocol for the sample calls: none → `NOT_FOUND`; a null
/// buffer → the count; a count smaller than the entries → the count and
/// `INSUFFICIENT_SIZE`; else the entries to write (none for a null
/// buffer), the count set.
///
/// # Safety
/// `count` is valid.
unsafe fn sized<T, B>(
    entries: Vec<T>,
    buffer: *mut B,
    count: *mut c_uint,
) -> Result<Vec<T>, nvmlReturn_t> {
    if entries.is_empty() {
        return Err(NVML_ERROR_NOT_FOUND);
    }
    let n = entries.len() as c_uint;
    let room = *count;
    *count = n;
    if buffer.is_null() {
        return Ok(Vec::new());
    }
    if room < n {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    Ok(entries)
}

/// `NVML_VALUE_TYPE_UNSIGNED_INT`, the type of utilization samples.
const NVML_VALUE_TYPE_UNSIGNED_INT: nvmlValueType_t = 1;

export! {
    fn nvmlDeviceGetSamples(
        device: nvmlDevice_t,
        kind: c_uint,
        lastSeenTimeStamp: c_ulonglong,
        sampleValType: *mut nvmlValueType_t,
        sampleCount: *mut c_uint,
        samples: *mut nvmlSample_t,
    ) {
        let outs_ok = !sampleValType.is_null() && !sampleCount.is_null();
        let d = device_call(SYM, device, outs_ok, OnMig::NotSupported)?;
        if kind > 6 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let now = clock_us(&d.scenario)?;
        let buffer = sample_buffer(d.gpu(), kind, now).ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let newer: Vec<(u64, u32)> = buffer
            .into_iter()
            .filter(|&(ts, _)| ts > lastSeenTimeStamp)
            .collect();
        *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
        let out = sized(newer, samples, sampleCount)?;
        for (i, (ts, value)) in out.into_iter().enumerate() {
            samples.add(i).write(nvmlSample_t {
                timeStamp: ts,
                sampleValue: nvmlValue_t { uiVal: value },
            });
        }
        Ok(())
    }

    fn nvmlDeviceGetProcessUtilization(
        device: nvmlDevice_t,
        utilization: *mut nvmlProcessUtilizationSample_t,
        processSamplesCount: *mut c_uint,
        lastSeenTimeStamp: c_ulonglong,
    ) {
        let d = device_call(SYM, device, !processSamplesCount.is_null(), OnMig::NotSupported)?;
        let now = clock_us(&d.scenario)?;
        let entries = process_entries(d.gpu(), lastSeenTimeStamp, now)
            .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let out = sized(entries, utilization, processSamplesCount)?;
        for (i, [pid, ts, sm, mem, enc, dec]) in out.into_iter().enumerate() {
            let percent = |v: u64| v as c_uint;
            utilization.add(i).write(nvmlProcessUtilizationSample_t {
                pid: pid as c_uint,
                timeStamp: ts,
                smUtil: percent(sm),
                memUtil: percent(mem),
                encUtil: percent(enc),
                decUtil: percent(dec),
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// GPM (GPU Performance Monitoring)

export! {
    fn nvmlGpmQueryDeviceSupport(device: nvmlDevice_t, gpmSupport: *mut nvmlGpmSupport_t) {
        let d = device_call(SYM, device, !gpmSupport.is_null(), OnMig::NotSupported)?;
        if (*gpmSupport).version != NVML_GPM_SUPPORT_VERSION {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        (*gpmSupport).isSupportedDevice = c_uint::from(d.gpu().gpm.is_some());
        Ok(())
    }

    fn nvmlGpmSampleAlloc(gpmSample: *mut nvmlGpmSample_t) {
        loaded()?;
        if gpmSample.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        gpmSample.write(sample_alloc());
        Ok(())
    }

    fn nvmlGpmSampleFree(gpmSample: nvmlGpmSample_t) {
        loaded()?;
        sample_free(gpmSample)
    }

    fn nvmlGpmSampleGet(device: nvmlDevice_t, gpmSample: nvmlGpmSample_t) {
        let d = device_call(SYM, device, sample_live(gpmSample), OnMig::NotSupported)?;
        d.gpu().gpm.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        sample_take(gpmSample, d.gpu, None)
    }

    fn nvmlGpmMigSampleGet(
        device: nvmlDevice_t,
        gpuInstanceId: c_uint,
        gpmSample: nvmlGpmSample_t,
    ) {
        let d = device_call(SYM, device, sample_live(gpmSample), OnMig::NotSupported)?;
        d.gpu().gpm.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        let instance = d
            .gpu()
            .mig_devices
            .iter()
            .flatten()
            .find(|m| m.gpu_instance_id == gpuInstanceId)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        instance.gpm.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
        sample_take(gpmSample, d.gpu, Some(gpuInstanceId))
    }

    fn nvmlGpmMetricsGet(metricsGet: *mut nvmlGpmMetricsGet_t) {
        let scenario = loaded()?;
        if metricsGet.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let request = &mut *metricsGet;
        if request.version != NVML_GPM_METRICS_GET_VERSION {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let first = sample_taken(request.sample1)?;
        let second = sample_taken(request.sample2)?;
        if first.gpu != second.gpu
            || first.gpu_instance != second.gpu_instance
            || second.at < first.at
            || request.numMetrics as usize > NVML_GPM_METRIC_MAX
        {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        gpu_call(&scenario, first.gpu, SYM)?;
        let gpu = &scenario.gpus[first.gpu];
        let values = match first.gpu_instance {
            None => gpu.gpm.as_ref(),
            Some(gi) => gpu
                .mig_devices
                .iter()
                .flatten()
                .find(|m| m.gpu_instance_id == gi)
                .and_then(|m| m.gpm.as_ref()),
        };
        for metric in &mut request.metrics[..request.numMetrics as usize] {
            match values.and_then(|v| v.metric(metric.metricId)) {
                Some(value) => {
                    metric.nvmlReturn = NVML_SUCCESS;
                    metric.value = value;
                }
                None => {
                    metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                    metric.value = 0.0;
                }
            }
        }
        Ok(())
    }
}
