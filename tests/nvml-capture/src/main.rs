//! Records what a real `libnvidia-ml.so` answers to the calls the exporter
//! makes, as a scenario file the fake NVML replays (tests/fake-nvml/README.md).
//! The field values are those of the exporter's own `nvmlDeviceGetFieldValues`
//! calls: a run with every collector on is made first (`capture::read_every_gpu`)
//! and each of its calls recorded (`nvml::record`), as NVML answers a field
//! differently by the batch it is in.
//!
//! ```sh
//! nvml-capture [--lib PATH] [--gpm-window-ms N] "DESCRIPTION" > capture.toml
//! ```
//!
//! Each GPU's section holds, as the fake's keys, every value NVML gave, and,
//! as comments, every call with its return code. A key left out is a call
//! that answered NOT_SUPPORTED (the fake's rule); a symbol that failed with
//! the same other code every time it was called is in `errors`; one the
//! library lacks is in `missing_symbols`. The sample buffers and the
//! per-process utilization answers are kept as recorded (`recording`), the
//! latter for several `lastSeenTimeStamp`s, and the file's `recorded_at_us`
//! is the moment of capture, so that a replay sees the buffers as they were.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, CStr};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nvidia_textfile_exporter::capture;
use nvml_wrapper_sys::bindings::*;

const NOT_SUPPORTED: nvmlReturn_t = 3;
const INVALID_ARGUMENT: nvmlReturn_t = 2;
const FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
/// `NVML_VALUE_NOT_AVAILABLE` for a process's memory.
const NOT_AVAILABLE: u64 = u64::MAX;

/// NVML's error names, as the fake's scenarios spell them.
fn code_name(rc: nvmlReturn_t) -> String {
    const NAMES: [&str; 26] = [
        "SUCCESS",
        "UNINITIALIZED",
        "INVALID_ARGUMENT",
        "NOT_SUPPORTED",
        "NO_PERMISSION",
        "ALREADY_INITIALIZED",
        "NOT_FOUND",
        "INSUFFICIENT_SIZE",
        "INSUFFICIENT_POWER",
        "DRIVER_NOT_LOADED",
        "TIMEOUT",
        "IRQ_ISSUE",
        "LIBRARY_NOT_FOUND",
        "FUNCTION_NOT_FOUND",
        "CORRUPTED_INFOROM",
        "GPU_IS_LOST",
        "RESET_REQUIRED",
        "OPERATING_SYSTEM",
        "LIB_RM_VERSION_MISMATCH",
        "IN_USE",
        "MEMORY",
        "NO_DATA",
        "VGPU_ECC_NOT_SUPPORTED",
        "INSUFFICIENT_RESOURCES",
        "FREQ_NOT_SUPPORTED",
        "ARGUMENT_VERSION_MISMATCH",
    ];
    NAMES
        .get(rc as usize)
        .map_or_else(|| "UNKNOWN".to_owned(), |name| (*name).to_owned())
}

/// Calls `lib.$sym(args…)`, FUNCTION_NOT_FOUND when the library lacks it.
macro_rules! raw {
    ($lib:expr, $sym:ident($($arg:expr),* $(,)?)) => {
        match $lib.$sym.as_ref() {
            // SAFETY: the arguments are the ones NVML documents for the call,
            // out-pointers to live locals of the right type.
            Ok(f) => unsafe { f($($arg),*) },
            Err(_) => FUNCTION_NOT_FOUND,
        }
    };
}

/// One device call recorded on `$gpu`: `$what` names its arguments.
macro_rules! call {
    ($gpu:expr, $sym:ident($($arg:expr),*), $what:expr) => {{
        let rc = raw!($gpu.lib, $sym($gpu.handle, $($arg),*));
        $gpu.record(stringify!($sym), $what, rc)
    }};
}

/// One `nvmlDeviceGetFieldValues` call of the exporter's run: the device (its
/// handle's address), the entries as NVML wrote them, the return code.
type FieldCall = (usize, Vec<nvmlFieldValue_t>, nvmlReturn_t);

/// Every field-value call of the run, in the order each GPU made them.
static FIELD_CALLS: Mutex<Vec<FieldCall>> = Mutex::new(Vec::new());

fn record_field_call(device: nvmlDevice_t, values: &[nvmlFieldValue_t], code: nvmlReturn_t) {
    let call = (device as usize, values.to_vec(), code);
    FIELD_CALLS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(call);
}

/// What one GPU answered.
struct Capture<'l> {
    lib: &'l NvmlLib,
    handle: nvmlDevice_t,
    /// `key = value` lines of the GPU's table, in order.
    keys: Vec<String>,
    /// Every call as `symbol(arguments) -> CODE`.
    calls: Vec<String>,
    /// Return codes by symbol.
    codes: BTreeMap<&'static str, Vec<nvmlReturn_t>>,
}

impl<'l> Capture<'l> {
    /// Records a call's code; true on SUCCESS.
    fn record(&mut self, symbol: &'static str, what: &str, rc: nvmlReturn_t) -> bool {
        self.calls
            .push(format!("{symbol}({what}) -> {}", code_name(rc)));
        self.codes.entry(symbol).or_default().push(rc);
        rc == 0
    }

    fn key(&mut self, key: &str, value: impl std::fmt::Display) {
        self.keys.push(format!("{key} = {value}"));
    }

    /// An inline table of the entries that were read; none: no key.
    fn table(&mut self, key: &str, entries: Vec<(&str, Option<String>)>) {
        let read: Vec<String> = entries
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k} = {v}")))
            .collect();
        if !read.is_empty() {
            self.key(key, format!("{{ {} }}", read.join(", ")));
        }
    }

    /// A string getter (UUID, name, serial, VBIOS); the text, decoded lossily
    /// as the exporter decodes it.
    fn string(
        &mut self,
        key: &str,
        symbol: &'static str,
        f: Option<unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t>,
    ) -> Option<String> {
        let mut buffer = [0 as c_char; 256];
        let rc = match f {
            // SAFETY: the buffer's length is passed with it.
            Some(f) => unsafe { f(self.handle, buffer.as_mut_ptr(), buffer.len() as c_uint) },
            None => FUNCTION_NOT_FOUND,
        };
        if !self.record(symbol, "", rc) {
            return None;
        }
        // SAFETY: NVML wrote a NUL-terminated string into the buffer.
        let bytes = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_bytes();
        self.key(key, text(bytes));
        Some(String::from_utf8_lossy(bytes).into_owned())
    }

    fn u32_getter(
        &mut self,
        key: &str,
        symbol: &'static str,
        f: Option<unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t>,
    ) -> Option<u32> {
        let mut value: c_uint = 0;
        let rc = match f {
            // SAFETY: one out-pointer to a live local.
            Some(f) => unsafe { f(self.handle, &mut value) },
            None => FUNCTION_NOT_FOUND,
        };
        self.record(symbol, "", rc).then(|| {
            self.key(key, value);
            value
        })
    }
}

/// A TOML string (an array of bytes where it is not UTF-8, as the fake takes).
fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    c if c.is_control() => write!(out, "\\u{:04X}", c as u32).unwrap(),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        Err(_) => format!("{bytes:?}"),
    }
}

fn c_text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    text(&bytes)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut lib_path = String::from("libnvidia-ml.so.1");
    let mut gpm_window = Duration::from_millis(1000);
    let mut description = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--lib" => lib_path = args.next().expect("--lib PATH"),
            "--gpm-window-ms" => {
                let ms = args.next().and_then(|v| v.parse().ok());
                gpm_window = Duration::from_millis(ms.expect("--gpm-window-ms N"));
            }
            _ if description.is_none() => description = Some(arg),
            _ => {
                eprintln!("usage: nvml-capture [--lib PATH] [--gpm-window-ms N] DESCRIPTION");
                std::process::exit(2);
            }
        }
    }
    // SAFETY: loading the NVML library runs its initialisers, nothing else.
    let lib = match unsafe { NvmlLib::new(&lib_path) } {
        Ok(lib) => lib,
        Err(error) => {
            eprintln!("nvml-capture: {lib_path}: {error}");
            std::process::exit(1);
        }
    };
    let rc = raw!(lib, nvmlInit_v2());
    if rc != 0 {
        eprintln!("nvml-capture: nvmlInit_v2: {}", code_name(rc));
        std::process::exit(1);
    }
    nvml::record::field_values(record_field_call);
    if let Err(error) = capture::read_every_gpu(Path::new(&lib_path)) {
        eprintln!("nvml-capture: the exporter's run: {}", error.detail);
        std::process::exit(1);
    }
    let mut out = String::new();
    let description = description.unwrap_or_else(|| "a capture".to_owned());
    writeln!(out, "description = {}", text(description.as_bytes())).unwrap();
    let mut missing = Vec::new();
    let mut gpus = Vec::new();
    let mut count: c_uint = 0;
    let rc = raw!(lib, nvmlDeviceGetCount_v2(&mut count));
    let system = system(&lib);
    for index in 0..if rc == 0 { count } else { 0 } {
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        let rc = raw!(lib, nvmlDeviceGetHandleByIndex_v2(index, &mut handle));
        let mut gpu = Capture {
            lib: &lib,
            handle,
            keys: Vec::new(),
            calls: Vec::new(),
            codes: BTreeMap::new(),
        };
        gpu.record("nvmlDeviceGetHandleByIndex_v2", &index.to_string(), rc);
        let recording = if rc == 0 {
            read_gpu(&mut gpu, gpm_window)
        } else {
            String::new()
        };
        gpus.push(render_gpu(&gpu, &mut missing, &recording));
    }
    // After the last read: every recorded sample was taken by then.
    writeln!(out, "recorded_at_us = {}", now_us()).unwrap();
    missing.sort_unstable();
    missing.dedup();
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(|m| format!("\"{m}\"")).collect();
        writeln!(out, "missing_symbols = [{}]", names.join(", ")).unwrap();
    }
    writeln!(out, "\n[system]\n{system}").unwrap();
    for gpu in gpus {
        out.push_str(&gpu);
    }
    raw!(lib, nvmlShutdown());
    print!("{out}");
}

/// The `[system]` table's lines.
fn system(lib: &NvmlLib) -> String {
    let mut lines = Vec::new();
    let (mut driver, mut nvml) = ([0 as c_char; 96], [0 as c_char; 96]);
    if raw!(lib, nvmlSystemGetDriverVersion(driver.as_mut_ptr(), 96)) == 0 {
        lines.push(format!("driver_version = {}", c_text(&driver)));
    }
    if raw!(lib, nvmlSystemGetNVMLVersion(nvml.as_mut_ptr(), 96)) == 0 {
        lines.push(format!("nvml_version = {}", c_text(&nvml)));
    }
    let mut cuda = 0;
    if raw!(lib, nvmlSystemGetCudaDriverVersion_v2(&mut cuda)) == 0 {
        lines.push(format!("cuda_driver_version = {cuda}"));
    }
    lines.join("\n")
}

/// One GPU's `[[gpu]]` section: the keys, `errors`, the calls as comments,
/// then the recording.
fn render_gpu(gpu: &Capture<'_>, missing: &mut Vec<&'static str>, recording: &str) -> String {
    let mut out = String::from("\n[[gpu]]\n");
    for call in &gpu.calls {
        writeln!(out, "# {call}").unwrap();
    }
    for key in &gpu.keys {
        writeln!(out, "{key}").unwrap();
    }
    let mut errors = Vec::new();
    for (symbol, codes) in &gpu.codes {
        let first = codes[0];
        if codes.iter().all(|&c| c == first) {
            match first {
                0 | NOT_SUPPORTED => {}
                FUNCTION_NOT_FOUND => missing.push(symbol),
                // A link or slot past the last one answers this; that is an
                // argument, not the symbol, failing.
                INVALID_ARGUMENT if codes.len() > 1 => {}
                code => errors.push(format!("{symbol} = \"{}\"", code_name(code))),
            }
        }
    }
    if !errors.is_empty() {
        writeln!(out, "errors = {{ {} }}", errors.join(", ")).unwrap();
    }
    out.push_str(recording);
    out
}

/// Reads everything the exporter reads of one GPU into `gpu`; returns the
/// `[gpu.recording]` tables.
fn read_gpu(gpu: &mut Capture<'_>, gpm_window: Duration) -> String {
    identity(gpu);
    readings(gpu);
    fields(gpu);
    processes(gpu);
    if let Some(gpm) = gpm(gpu, gpm_window) {
        gpu.key("gpm", gpm);
    }
    // The buffers last, so that they hold the GPM window too.
    recording(gpu)
}

/// The identity keys.
fn identity(gpu: &mut Capture<'_>) {
    let lib = gpu.lib;
    gpu.string(
        "uuid",
        "nvmlDeviceGetUUID",
        lib.nvmlDeviceGetUUID.as_ref().ok().copied(),
    );
    gpu.string(
        "name",
        "nvmlDeviceGetName",
        lib.nvmlDeviceGetName.as_ref().ok().copied(),
    );
    gpu.string(
        "serial",
        "nvmlDeviceGetSerial",
        lib.nvmlDeviceGetSerial.as_ref().ok().copied(),
    );
    gpu.string(
        "vbios_version",
        "nvmlDeviceGetVbiosVersion",
        lib.nvmlDeviceGetVbiosVersion.as_ref().ok().copied(),
    );
    let mut brand: nvmlBrandType_t = 0;
    if call!(gpu, nvmlDeviceGetBrand(&mut brand), "") {
        gpu.key("brand", brand);
    }
    let mut architecture: nvmlDeviceArchitecture_t = 0;
    if call!(gpu, nvmlDeviceGetArchitecture(&mut architecture), "") {
        gpu.key("architecture", architecture);
    }
    gpu.u32_getter(
        "minor_number",
        "nvmlDeviceGetMinorNumber",
        lib.nvmlDeviceGetMinorNumber.as_ref().ok().copied(),
    );
    // SAFETY: plain data.
    let mut pci: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    if call!(gpu, nvmlDeviceGetPciInfo_v3(&mut pci), "") {
        gpu.key(
            "pci",
            format!(
                "{{ bus_id = {}, domain = {}, bus = {}, device = {}, pci_device_id = {}, pci_subsystem_id = {} }}",
                c_text(&pci.busId),
                pci.domain,
                pci.bus,
                pci.device,
                pci.pciDeviceId,
                pci.pciSubSystemId
            ),
        );
    }
}

/// The point readings, in the fake's keys.
fn readings(gpu: &mut Capture<'_>) {
    let lib = gpu.lib;
    let mut utilization = nvmlUtilization_t { gpu: 0, memory: 0 };
    if call!(gpu, nvmlDeviceGetUtilizationRates(&mut utilization), "") {
        gpu.key(
            "utilization",
            format!(
                "{{ gpu = {}, memory = {} }}",
                utilization.gpu, utilization.memory
            ),
        );
    }
    let mut memory = nvmlMemory_v2_t {
        version: std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | 2 << 24,
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    if call!(gpu, nvmlDeviceGetMemoryInfo_v2(&mut memory), "") {
        gpu.key(
            "memory",
            format!(
                "{{ total = {}, reserved = {}, used = {}, free = {} }}",
                memory.total, memory.reserved, memory.used, memory.free
            ),
        );
    }
    let mut bar1 = nvmlBAR1Memory_t {
        bar1Total: 0,
        bar1Free: 0,
        bar1Used: 0,
    };
    if call!(gpu, nvmlDeviceGetBAR1MemoryInfo(&mut bar1), "") {
        gpu.key(
            "bar1",
            format!(
                "{{ total = {}, used = {}, free = {} }}",
                bar1.bar1Total, bar1.bar1Used, bar1.bar1Free
            ),
        );
    }
    let mut value: c_uint = 0;
    let mut versioned = nvmlTemperature_t {
        version: std::mem::size_of::<nvmlTemperature_t>() as c_uint | 1 << 24,
        sensorType: 0,
        temperature: 0,
    };
    // The fake answers both from one key; the versioned call's code is kept.
    call!(
        gpu,
        nvmlDeviceGetTemperatureV(&mut versioned),
        "NVML_TEMPERATURE_GPU"
    );
    if call!(
        gpu,
        nvmlDeviceGetTemperature(0, &mut value),
        "NVML_TEMPERATURE_GPU"
    ) {
        gpu.key("temperature", value);
    }
    let mut thresholds = Vec::new();
    for (kind, key) in ["shutdown", "slowdown", "mem_max", "gpu_max"]
        .into_iter()
        .enumerate()
    {
        let mut value: c_uint = 0;
        let read = call!(
            gpu,
            nvmlDeviceGetTemperatureThreshold(kind as c_uint, &mut value),
            &format!("type {kind}")
        );
        thresholds.push((key, read.then(|| value.to_string())));
    }
    gpu.table("temperature_thresholds", thresholds);
    let mut margin = nvmlMarginTemperature_t {
        version: std::mem::size_of::<nvmlMarginTemperature_t>() as c_uint | 1 << 24,
        marginTemperature: 0,
    };
    if call!(gpu, nvmlDeviceGetMarginTemperature(&mut margin), "") {
        gpu.key("margin_temperature", margin.marginTemperature);
    }
    for (key, symbol, f) in [
        (
            "power_usage_mw",
            "nvmlDeviceGetPowerUsage",
            lib.nvmlDeviceGetPowerUsage.as_ref().ok().copied(),
        ),
        (
            "power_limit_mw",
            "nvmlDeviceGetPowerManagementLimit",
            lib.nvmlDeviceGetPowerManagementLimit.as_ref().ok().copied(),
        ),
        (
            "enforced_power_limit_mw",
            "nvmlDeviceGetEnforcedPowerLimit",
            lib.nvmlDeviceGetEnforcedPowerLimit.as_ref().ok().copied(),
        ),
        (
            "default_power_limit_mw",
            "nvmlDeviceGetPowerManagementDefaultLimit",
            lib.nvmlDeviceGetPowerManagementDefaultLimit
                .as_ref()
                .ok()
                .copied(),
        ),
    ] {
        gpu.u32_getter(key, symbol, f);
    }
    let mut pstate: nvmlPstates_t = 0;
    if call!(gpu, nvmlDeviceGetPerformanceState(&mut pstate), "") {
        gpu.key("pstate", pstate);
    }
    let mut energy: u64 = 0;
    if call!(gpu, nvmlDeviceGetTotalEnergyConsumption(&mut energy), "") {
        gpu.key("total_energy_mj", energy);
    }
    let (mut min, mut max) = (0, 0);
    if call!(
        gpu,
        nvmlDeviceGetPowerManagementLimitConstraints(&mut min, &mut max),
        ""
    ) {
        gpu.key(
            "power_limit_constraints_mw",
            format!("{{ min = {min}, max = {max} }}"),
        );
    }
    for (key, max_clock) in [("clocks_mhz", false), ("max_clocks_mhz", true)] {
        let mut entries = Vec::new();
        for (kind, name) in ["graphics", "sm", "memory", "video"]
            .into_iter()
            .enumerate()
        {
            let mut mhz: c_uint = 0;
            let what = format!("clock type {kind}");
            let read = if max_clock {
                call!(
                    gpu,
                    nvmlDeviceGetMaxClockInfo(kind as c_uint, &mut mhz),
                    &what
                )
            } else {
                call!(gpu, nvmlDeviceGetClockInfo(kind as c_uint, &mut mhz), &what)
            };
            entries.push((name, read.then(|| mhz.to_string())));
        }
        gpu.table(key, entries);
    }
    let mut fans: c_uint = 0;
    if call!(gpu, nvmlDeviceGetNumFans(&mut fans), "") {
        let mut speeds = Vec::new();
        for fan in 0..fans.min(16) {
            let mut speed: c_uint = 0;
            if call!(
                gpu,
                nvmlDeviceGetFanSpeed_v2(fan, &mut speed),
                &format!("fan {fan}")
            ) {
                speeds.push(speed.to_string());
            }
        }
        gpu.key("fan_speeds", format!("[{}]", speeds.join(", ")));
    }
    let mut reasons: u64 = 0;
    if call!(
        gpu,
        nvmlDeviceGetCurrentClocksEventReasons(&mut reasons),
        ""
    ) {
        gpu.key("clocks_event_reasons", reasons);
    }
    if call!(
        gpu,
        nvmlDeviceGetSupportedClocksEventReasons(&mut reasons),
        ""
    ) {
        gpu.key("supported_clocks_event_reasons", reasons);
    }
    let mut violations = Vec::new();
    for (policy, key) in [
        (0, "power"),
        (1, "thermal"),
        (2, "sync_boost"),
        (3, "board_limit"),
        (4, "low_utilization"),
        (5, "reliability"),
        (10, "total_app_clocks"),
        (11, "total_base_clocks"),
    ] {
        let mut time = nvmlViolationTime_t {
            referenceTime: 0,
            violationTime: 0,
        };
        let read = call!(
            gpu,
            nvmlDeviceGetViolationStatus(policy, &mut time),
            &format!("policy {policy}")
        );
        violations.push((key, read.then(|| time.violationTime.to_string())));
    }
    gpu.table("violations_ns", violations);
    pcie(gpu);
    ecc(gpu);
    health(gpu);
    media(gpu);
    modes(gpu);
    nvlinks(gpu);
    fabric(gpu);
}

/// `nvmlDeviceGetGpuFabricInfoV` with struct version 3 (an H200 of driver 580
/// answers v1 and v2 with ARGUMENT_VERSION_MISMATCH), as `fabric`.
fn fabric(gpu: &mut Capture<'_>) {
    // SAFETY: plain data.
    let mut info: nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
    info.version = std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as c_uint | 3 << 24;
    if call!(gpu, nvmlDeviceGetGpuFabricInfoV(&mut info), "version 3") {
        gpu.key(
            "fabric",
            format!(
                "{{ state = {}, status = {}, cluster_uuid = {:?}, clique_id = {}, health_mask = {}, health_summary = {} }}",
                info.state, info.status, info.clusterUuid, info.cliqueId, info.healthMask, info.healthSummary
            ),
        );
    }
}

fn pcie(gpu: &mut Capture<'_>) {
    let mut entries = Vec::new();
    let mut value: c_uint = 0;
    let read = call!(gpu, nvmlDeviceGetCurrPcieLinkGeneration(&mut value), "");
    entries.push(("gen", read.then(|| value.to_string())));
    let read = call!(gpu, nvmlDeviceGetMaxPcieLinkGeneration(&mut value), "");
    entries.push(("max_gen", read.then(|| value.to_string())));
    let read = call!(gpu, nvmlDeviceGetCurrPcieLinkWidth(&mut value), "");
    entries.push(("width", read.then(|| value.to_string())));
    let read = call!(gpu, nvmlDeviceGetMaxPcieLinkWidth(&mut value), "");
    entries.push(("max_width", read.then(|| value.to_string())));
    let read = call!(gpu, nvmlDeviceGetPcieReplayCounter(&mut value), "");
    entries.push(("replay_counter", read.then(|| value.to_string())));
    let read = call!(gpu, nvmlDeviceGetPcieThroughput(0, &mut value), "TX");
    entries.push(("tx_kbps", read.then(|| value.to_string())));
    let read = call!(gpu, nvmlDeviceGetPcieThroughput(1, &mut value), "RX");
    entries.push(("rx_kbps", read.then(|| value.to_string())));
    gpu.table("pcie", entries);
}

fn ecc(gpu: &mut Capture<'_>) {
    let (mut current, mut pending): (nvmlEnableState_t, nvmlEnableState_t) = (0, 0);
    if call!(gpu, nvmlDeviceGetEccMode(&mut current, &mut pending), "") {
        gpu.key(
            "ecc_mode",
            format!(
                "{{ current = {}, pending = {} }}",
                current == 1,
                pending == 1
            ),
        );
    }
    let mut errors = Vec::new();
    for (kind, counter, key) in [
        (0, 0, "volatile_corrected"),
        (1, 0, "volatile_uncorrected"),
        (0, 1, "aggregate_corrected"),
        (1, 1, "aggregate_uncorrected"),
    ] {
        let mut count: u64 = 0;
        let read = call!(
            gpu,
            nvmlDeviceGetTotalEccErrors(kind, counter, &mut count),
            &format!("error type {kind}, counter {counter}")
        );
        errors.push((key, read.then(|| count.to_string())));
    }
    gpu.table("ecc_errors", errors);
    let mut pages = Vec::new();
    for (cause, key) in [(0, "single_bit_ecc"), (1, "double_bit_ecc")] {
        let mut count: c_uint = 0;
        let null = std::ptr::null_mut();
        let rc = raw!(
            gpu.lib,
            nvmlDeviceGetRetiredPages_v2(gpu.handle, cause, &mut count, null, null)
        );
        // A count asked with no buffer: SUCCESS or INSUFFICIENT_SIZE both tell it.
        let read = rc == 0 || rc == INSUFFICIENT_SIZE;
        gpu.record(
            "nvmlDeviceGetRetiredPages_v2",
            &format!("cause {cause}"),
            if read { 0 } else { rc },
        );
        pages.push((key, read.then(|| count.to_string())));
    }
    let mut pending: nvmlEnableState_t = 0;
    let read = call!(
        gpu,
        nvmlDeviceGetRetiredPagesPendingStatus(&mut pending),
        ""
    );
    pages.push(("pending", read.then(|| (pending == 1).to_string())));
    gpu.table("retired_pages", pages);
    let (mut corrected, mut uncorrected, mut pending, mut failure) = (0, 0, 0, 0);
    if call!(
        gpu,
        nvmlDeviceGetRemappedRows(&mut corrected, &mut uncorrected, &mut pending, &mut failure),
        ""
    ) {
        gpu.key(
            "remapped_rows",
            format!(
                "{{ correctable = {corrected}, uncorrectable = {uncorrected}, pending = {}, failure = {} }}",
                pending == 1,
                failure == 1
            ),
        );
    }
}

/// The repair status, the row remapper's histogram, SRAM ECC (struct version
/// 1 each) and the platform info (version 2, else 1, as the exporter asks).
fn health(gpu: &mut Capture<'_>) {
    let mut repair = nvmlRepairStatus_v1_t {
        version: std::mem::size_of::<nvmlRepairStatus_v1_t>() as c_uint | 1 << 24,
        bChannelRepairPending: 0,
        bTpcRepairPending: 0,
    };
    if call!(gpu, nvmlDeviceGetRepairStatus(&mut repair), "version 1") {
        gpu.key(
            "repair_status",
            format!(
                "{{ channel = {}, tpc = {} }}",
                repair.bChannelRepairPending != 0,
                repair.bTpcRepairPending != 0
            ),
        );
    }
    let mut h = nvmlRowRemapperHistogramValues_t {
        max: 0,
        high: 0,
        partial: 0,
        low: 0,
        none: 0,
    };
    if call!(gpu, nvmlDeviceGetRowRemapperHistogram(&mut h), "") {
        gpu.key(
            "row_remapper_histogram",
            format!(
                "{{ max = {}, high = {}, partial = {}, low = {}, none = {} }}",
                h.max, h.high, h.partial, h.low, h.none
            ),
        );
    }
    // SAFETY: plain data.
    let mut e: nvmlEccSramErrorStatus_v1_t = unsafe { std::mem::zeroed() };
    e.version = std::mem::size_of::<nvmlEccSramErrorStatus_v1_t>() as c_uint | 1 << 24;
    if call!(gpu, nvmlDeviceGetSramEccErrorStatus(&mut e), "version 1") {
        gpu.key(
            "sram_ecc",
            format!(
                "{{ aggregate_unc_parity = {}, aggregate_unc_sec_ded = {}, aggregate_cor = {}, volatile_unc_parity = {}, volatile_unc_sec_ded = {}, volatile_cor = {}, aggregate_unc_bucket_l2 = {}, aggregate_unc_bucket_sm = {}, aggregate_unc_bucket_pcie = {}, aggregate_unc_bucket_mcu = {}, aggregate_unc_bucket_other = {}, threshold_exceeded = {} }}",
                e.aggregateUncParity, e.aggregateUncSecDed, e.aggregateCor, e.volatileUncParity,
                e.volatileUncSecDed, e.volatileCor, e.aggregateUncBucketL2, e.aggregateUncBucketSm,
                e.aggregateUncBucketPcie, e.aggregateUncBucketMcu, e.aggregateUncBucketOther,
                e.bThresholdExceeded != 0
            ),
        );
    }
    sram_unique(gpu);
    let mut c2c = nvmlC2cModeInfo_v1_t { isC2cEnabled: 0 };
    if call!(gpu, nvmlDeviceGetC2cModeInfoV(&mut c2c), "") {
        gpu.key("c2c_enabled", c2c.isC2cEnabled != 0);
    }
    // R590, newer than the bindings: looked up by name.
    // SAFETY: NVML exports this name with this signature (nvml.h, R590).
    let getter = unsafe {
        gpu.lib
            .__library
            .get::<unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t>(
                b"nvmlDeviceGetUnrepairableMemoryFlag_v1\0",
            )
    };
    let mut unrepairable: c_uint = 0;
    let rc = match &getter {
        // SAFETY: the struct is one unsigned int.
        Ok(f) => unsafe { f(gpu.handle, &mut unrepairable) },
        Err(_) => FUNCTION_NOT_FOUND,
    };
    if gpu.record("nvmlDeviceGetUnrepairableMemoryFlag_v1", "", rc) {
        gpu.key("memory_unrepairable", unrepairable != 0);
    }
    for version in [2, 1] {
        // SAFETY: plain data.
        let mut p: nvmlPlatformInfo_v2_t = unsafe { std::mem::zeroed() };
        p.version = std::mem::size_of::<nvmlPlatformInfo_v2_t>() as c_uint | version << 24;
        let rc = raw!(gpu.lib, nvmlDeviceGetPlatformInfo(gpu.handle, &mut p));
        gpu.record(
            "nvmlDeviceGetPlatformInfo",
            &format!("version {version}"),
            rc,
        );
        if rc == ARGUMENT_VERSION_MISMATCH {
            continue;
        }
        if rc == 0 {
            gpu.key(
                "platform",
                format!(
                    "{{ ib_guid = {:?}, chassis_serial = {:?}, slot = {}, tray = {}, host_id = {}, peer_type = {}, module_id = {}, max_version = {version} }}",
                    p.ibGuid, p.chassisSerialNumber, p.slotNumber, p.trayIndex, p.hostId, p.peerType, p.moduleId
                ),
            );
        }
        break;
    }
}

/// The SRAM locations with uncorrected errors: their count first, then the
/// entries, as the exporter asks.
fn sram_unique(gpu: &mut Capture<'_>) {
    let version =
        std::mem::size_of::<nvmlEccSramUniqueUncorrectedErrorCounts_v1_t>() as c_uint | 1 << 24;
    let mut counts = nvmlEccSramUniqueUncorrectedErrorCounts_v1_t {
        version,
        entryCount: 0,
        entries: std::ptr::null_mut(),
    };
    // INSUFFICIENT_SIZE still gives the count, as the exporter takes it.
    let rc = raw!(
        gpu.lib,
        nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts(gpu.handle, &mut counts)
    );
    let symbol = "nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts";
    if !gpu.record(symbol, "entries NULL", rc) && rc != INSUFFICIENT_SIZE {
        return;
    }
    // SAFETY: plain integers.
    let mut entries = vec![unsafe { std::mem::zeroed() }; counts.entryCount as usize];
    counts.entries = entries.as_mut_ptr();
    if counts.entryCount > 0
        && !call!(
            gpu,
            nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts(&mut counts),
            &format!("{} entries", entries.len())
        )
    {
        return;
    }
    entries.truncate(counts.entryCount as usize);
    let entries: Vec<String> = entries
        .iter()
        .map(|e: &nvmlEccSramUniqueUncorrectedErrorEntry_v1_t| {
            format!(
                "{{ unit = {}, location = {}, sublocation = {}, extlocation = {}, address = {}, is_parity = {}, count = {} }}",
                e.unit, e.location, e.sublocation, e.extlocation, e.address, e.isParity != 0, e.count
            )
        })
        .collect();
    gpu.key("sram_unique", format!("[{}]", entries.join(", ")));
}

fn media(gpu: &mut Capture<'_>) {
    let (mut utilization, mut period): (c_uint, c_uint) = (0, 0);
    let mut encoder = Vec::new();
    if call!(
        gpu,
        nvmlDeviceGetEncoderUtilization(&mut utilization, &mut period),
        ""
    ) {
        encoder.push(("utilization", Some(utilization.to_string())));
        encoder.push(("sampling_period_us", Some(period.to_string())));
    }
    let (mut sessions, mut fps, mut latency) = (0, 0, 0);
    if call!(
        gpu,
        nvmlDeviceGetEncoderStats(&mut sessions, &mut fps, &mut latency),
        ""
    ) {
        encoder.push(("session_count", Some(sessions.to_string())));
        encoder.push(("average_fps", Some(fps.to_string())));
        encoder.push(("average_latency_us", Some(latency.to_string())));
    }
    gpu.table("encoder", encoder);
    for key in ["decoder", "jpeg", "ofa"] {
        let read = match key {
            "decoder" => call!(
                gpu,
                nvmlDeviceGetDecoderUtilization(&mut utilization, &mut period),
                ""
            ),
            "jpeg" => call!(
                gpu,
                nvmlDeviceGetJpgUtilization(&mut utilization, &mut period),
                ""
            ),
            _ => call!(
                gpu,
                nvmlDeviceGetOfaUtilization(&mut utilization, &mut period),
                ""
            ),
        };
        if read {
            gpu.key(
                key,
                format!("{{ utilization = {utilization}, sampling_period_us = {period} }}"),
            );
        }
    }
}

fn modes(gpu: &mut Capture<'_>) {
    let mut state: nvmlEnableState_t = 0;
    if call!(gpu, nvmlDeviceGetPersistenceMode(&mut state), "") {
        gpu.key("persistence_mode", state == 1);
    }
    let mut mode: nvmlComputeMode_t = 0;
    if call!(gpu, nvmlDeviceGetComputeMode(&mut mode), "") {
        gpu.key("compute_mode", mode);
    }
    let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
    if call!(gpu, nvmlDeviceGetMigMode(&mut current, &mut pending), "") {
        gpu.key(
            "mig_mode",
            format!("{{ current = {current}, pending = {pending} }}"),
        );
    }
    let mut count: c_uint = 0;
    if call!(gpu, nvmlDeviceGetMaxMigDeviceCount(&mut count), "") {
        gpu.key("max_mig_device_count", count);
    }
}

/// The links' state and error counters, as `nvlinks`: links 0, 1, … up to
/// the first NVML does not know, none where link 0 is not supported.
fn nvlinks(gpu: &mut Capture<'_>) {
    let mut links = Vec::new();
    for link in 0..NVML_NVLINK_MAX_LINKS {
        let mut active: nvmlEnableState_t = 0;
        let rc = raw!(
            gpu.lib,
            nvmlDeviceGetNvLinkState(gpu.handle, link, &mut active)
        );
        gpu.record("nvmlDeviceGetNvLinkState", &format!("link {link}"), rc);
        if rc == NOT_SUPPORTED && link == 0 {
            return;
        }
        if rc == INVALID_ARGUMENT {
            break;
        }
        let mut errors = Vec::new();
        for (counter, key) in ["replay", "recovery", "crc_flit", "crc_data", "ecc_data"]
            .into_iter()
            .enumerate()
        {
            let mut value: u64 = 0;
            let read = call!(
                gpu,
                nvmlDeviceGetNvLinkErrorCounter(
                    link,
                    counter as nvmlNvLinkErrorCounter_t,
                    &mut value
                ),
                &format!("link {link}, counter {counter}")
            );
            if read {
                errors.push(format!("{key} = {value}"));
            }
        }
        let active = if rc == 0 {
            format!("active = {}, ", active == 1)
        } else {
            String::new()
        };
        links.push(format!(
            "{{ {active}errors = {{ {} }} }}",
            errors.join(", ")
        ));
    }
    if !links.is_empty() {
        gpu.key("nvlinks", format!("[\n    {},\n]", links.join(",\n    ")));
    }
}

/// One entry's answer in a `nvmlDeviceGetFieldValues` call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    Unsigned(u64),
    /// Signed, even where it is not negative: the fake answers it so.
    Signed(i64),
    /// A double, as its bits.
    Double(u64),
    /// A value type NVML does not document.
    Unknown(nvmlValueType_t),
    /// The entry's own return code.
    Failed(nvmlReturn_t),
}

impl Answer {
    /// A value the scenario holds as a key (TOML has no NaN or infinity
    /// the fake would answer): an integer, or a finite double.
    fn is_plain(&self) -> bool {
        match *self {
            Answer::Unsigned(_) | Answer::Signed(_) => true,
            Answer::Double(bits) => f64::from_bits(bits).is_finite(),
            Answer::Unknown(_) | Answer::Failed(_) => false,
        }
    }

    /// What NVML wrote into `value`.
    fn of(value: &nvmlFieldValue_t) -> Answer {
        if value.nvmlReturn != 0 {
            return Answer::Failed(value.nvmlReturn);
        }
        // SAFETY: NVML says which member of the union it wrote.
        unsafe {
            match value.valueType {
                0 => Answer::Double(value.value.dVal.to_bits()),
                1 => Answer::Unsigned(u64::from(value.value.uiVal)),
                // `unsigned long` is 64 bits on the Linux targets NVML supports.
                #[allow(clippy::unnecessary_cast)]
                2 => Answer::Unsigned(value.value.ulVal as u64),
                3 => Answer::Unsigned(value.value.ullVal),
                4 => Answer::Signed(value.value.sllVal),
                5 => Answer::Signed(i64::from(value.value.siVal)),
                6 => Answer::Unsigned(u64::from(value.value.usVal)),
                other => Answer::Unknown(other),
            }
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Answer::Unsigned(v) => write!(f, "SUCCESS, {v}"),
            Answer::Signed(v) => write!(f, "SUCCESS, signed {v}"),
            Answer::Double(bits) => write!(f, "SUCCESS, a double: {}", f64::from_bits(bits)),
            Answer::Unknown(t) => write!(f, "SUCCESS, value type {t}"),
            Answer::Failed(rc) => f.write_str(&code_name(rc)),
        }
    }
}

/// The exporter's `nvmlDeviceGetFieldValues` calls of this GPU, recorded in
/// its run, ids as the driver numbers them: each call and every entry that is
/// not a plain answer in the comments, the answers as `field_values`,
/// `signed_field_values` and `double_field_values` (keyed `id:scope` where the field
/// was asked at a link other than 0); a field asked twice keeps its first
/// answer, the per-GPU batch's, and a different one later is a comment.
fn fields(gpu: &mut Capture<'_>) {
    let calls = FIELD_CALLS.lock().unwrap_or_else(|e| e.into_inner());
    let handle = gpu.handle as usize;
    let mine = calls.iter().filter(|(device, ..)| *device == handle);
    let mut answers: BTreeMap<(u32, u32), Answer> = BTreeMap::new();
    for (_, values, rc) in mine {
        // A batch of several links names its fields with their scope.
        let links = values.iter().any(|value| value.scopeId != 0);
        let name = |value: &nvmlFieldValue_t| match links {
            true => format!("{}:{}", value.fieldId, value.scopeId),
            false => value.fieldId.to_string(),
        };
        let what = match &values[..] {
            [one] => format!("field {}", name(one)),
            all if links => {
                let last = all.iter().map(|value| value.scopeId).max().unwrap_or(0);
                format!("{} fields, links up to {last}", all.len())
            }
            all => format!("{} fields", all.len()),
        };
        if !gpu.record("nvmlDeviceGetFieldValues", &what, *rc) {
            continue;
        }
        for value in values {
            let answer = Answer::of(value);
            let key = name(value);
            match answers.get(&(value.fieldId, value.scopeId)) {
                Some(&first) if first != answer => gpu.calls.push(format!(
                    "field {key} -> {answer}, differs from its first answer {first} (kept)"
                )),
                Some(_) => {}
                None => {
                    answers.insert((value.fieldId, value.scopeId), answer);
                    if !answer.is_plain() && answer != Answer::Failed(NOT_SUPPORTED) {
                        gpu.calls.push(format!("field {key} -> {answer}"));
                    }
                }
            }
        }
    }
    // A field asked only at scope 0 is keyed by its id alone.
    let scoped: Vec<u32> = answers
        .keys()
        .filter(|(_, scope)| *scope != 0)
        .map(|(id, _)| *id)
        .collect();
    let (mut entries, mut signed, mut double) = (Vec::new(), Vec::new(), Vec::new());
    for (&(id, scope), answer) in &answers {
        let key = if scoped.contains(&id) {
            format!("{id}:{scope}")
        } else {
            id.to_string()
        };
        match answer {
            Answer::Unsigned(v) => entries.push(format!("\"{key}\" = {v}")),
            Answer::Signed(v) => signed.push(format!("\"{key}\" = {v}")),
            // `{:?}` keeps a point, so that TOML reads a float.
            Answer::Double(bits) if answer.is_plain() => {
                double.push(format!("\"{key}\" = {:?}", f64::from_bits(*bits)));
            }
            _ => {}
        }
    }
    if !entries.is_empty() {
        gpu.key("field_values", format!("{{ {} }}", entries.join(", ")));
    }
    if !signed.is_empty() {
        gpu.key(
            "signed_field_values",
            format!("{{ {} }}", signed.join(", ")),
        );
    }
    if !double.is_empty() {
        gpu.key(
            "double_field_values",
            format!("{{ {} }}", double.join(", ")),
        );
    }
}

/// The running compute processes, as `processes`.
fn processes(gpu: &mut Capture<'_>) {
    // SAFETY: plain data.
    let zero: nvmlProcessInfo_t = unsafe { std::mem::zeroed() };
    let mut buffer = vec![zero; 256];
    let mut count = buffer.len() as c_uint;
    if !call!(
        gpu,
        nvmlDeviceGetComputeRunningProcesses_v3(&mut count, buffer.as_mut_ptr()),
        ""
    ) {
        return;
    }
    let mut entries = Vec::new();
    for p in &buffer[..count as usize] {
        let memory = if p.usedGpuMemory == NOT_AVAILABLE {
            String::new()
        } else {
            format!(", used_memory = {}", p.usedGpuMemory)
        };
        entries.push(format!(
            "{{ pid = {}{memory}, gpu_instance_id = {}, compute_instance_id = {} }}",
            p.pid, p.gpuInstanceId, p.computeInstanceId
        ));
    }
    gpu.key("processes", format!("[{}]", entries.join(", ")));
}

/// Two GPM samples `window` apart and the metrics between them, as `gpm`.
fn gpm(gpu: &mut Capture<'_>, window: Duration) -> Option<String> {
    let mut support = nvmlGpmSupport_t {
        version: 1,
        isSupportedDevice: 0,
    };
    if !call!(gpu, nvmlGpmQueryDeviceSupport(&mut support), "") || support.isSupportedDevice == 0 {
        return None;
    }
    let lib = gpu.lib;
    let mut samples: [nvmlGpmSample_t; 2] = [std::ptr::null_mut(); 2];
    for sample in &mut samples {
        if raw!(lib, nvmlGpmSampleAlloc(sample)) != 0 {
            return None;
        }
    }
    let mut taken = call!(gpu, nvmlGpmSampleGet(samples[0]), "first");
    std::thread::sleep(window);
    taken &= call!(gpu, nvmlGpmSampleGet(samples[1]), "second");
    let mut text = None;
    if taken {
        // SAFETY: plain data; the pointers in metricInfo stay null.
        let mut get: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
        get.version = 1;
        get.sample1 = samples[0];
        get.sample2 = samples[1];
        let ids = [
            (1, "graphics"),
            (2, "sm_active"),
            (3, "sm_occupancy"),
            (4, "integer"),
            (5, "tensor"),
            (6, "tensor_dfma"),
            (7, "tensor_hmma"),
            (9, "tensor_imma"),
            (10, "dram"),
            (11, "fp64"),
            (12, "fp32"),
            (13, "fp16"),
        ];
        get.numMetrics = ids.len() as c_uint;
        for (slot, (id, _)) in ids.iter().enumerate() {
            get.metrics[slot].metricId = *id;
        }
        let rc = raw!(lib, nvmlGpmMetricsGet(&mut get));
        gpu.record(
            "nvmlGpmMetricsGet",
            &format!("{} ms", window.as_millis()),
            rc,
        );
        if rc == 0 {
            let read: Vec<String> = ids
                .iter()
                .enumerate()
                .filter(|(slot, _)| get.metrics[*slot].nvmlReturn == 0)
                .map(|(slot, (_, name))| format!("{name} = {:?}", get.metrics[slot].value))
                .collect();
            text = Some(format!("{{ {} }}", read.join(", ")));
        }
    }
    for sample in samples {
        raw!(lib, nvmlGpmSampleFree(sample));
    }
    text
}

/// The sample buffers (from 0) and the per-process answers (from 0, and
/// from a few of the GPU's own sample timestamps), as `[gpu.recording]`.
fn recording(gpu: &mut Capture<'_>) -> String {
    let mut buffers = Vec::new();
    let mut stamps = Vec::new();
    for (kind, name) in ["gpu", "memory", "encoder", "decoder"]
        .into_iter()
        .enumerate()
    {
        let kind = kind as nvmlSamplingType_t + 1;
        let mut value_type: nvmlValueType_t = 0;
        // SAFETY: plain data.
        let zero: nvmlSample_t = unsafe { std::mem::zeroed() };
        let mut buffer = vec![zero; 1024];
        let mut count = buffer.len() as c_uint;
        if !call!(
            gpu,
            nvmlDeviceGetSamples(kind, 0, &mut value_type, &mut count, buffer.as_mut_ptr()),
            &format!("type {kind}, lastSeen 0")
        ) {
            continue;
        }
        let points: Vec<String> = buffer[..count as usize]
            .iter()
            // SAFETY: utilization samples are unsigned ints (type 1).
            .map(|s| format!("[{}, {}]", s.timeStamp, unsafe { s.sampleValue.uiVal }))
            .collect();
        if kind == 1 {
            stamps = buffer[..count as usize]
                .iter()
                .map(|s| s.timeStamp)
                .collect();
        }
        buffers.push(format!("{name} = [{}]", points.join(", ")));
    }
    let mut answers = Vec::new();
    let mut asked: Vec<u64> = vec![0];
    // The buffer's second sample, its middle and a second before its end.
    for at in [1, stamps.len() / 2, stamps.len().saturating_sub(6)] {
        if let Some(&ts) = stamps.get(at) {
            asked.push(ts);
        }
    }
    asked.sort_unstable();
    asked.dedup();
    let mut supported = false;
    for last_seen in asked {
        // SAFETY: plain data.
        let zero: nvmlProcessUtilizationSample_t = unsafe { std::mem::zeroed() };
        let mut buffer = vec![zero; 1024];
        let mut count = buffer.len() as c_uint;
        let rc = raw!(
            gpu.lib,
            nvmlDeviceGetProcessUtilization(gpu.handle, buffer.as_mut_ptr(), &mut count, last_seen)
        );
        gpu.record(
            "nvmlDeviceGetProcessUtilization",
            &format!("lastSeen {last_seen}"),
            rc,
        );
        let entries: Vec<String> = match rc {
            0 => buffer[..count as usize]
                .iter()
                .map(|e| {
                    format!(
                        "[{}, {}, {}, {}, {}, {}]",
                        e.pid, e.timeStamp, e.smUtil, e.memUtil, e.encUtil, e.decUtil
                    )
                })
                .collect(),
            // NOT_FOUND: nothing since lastSeen.
            6 => Vec::new(),
            _ => continue,
        };
        supported = true;
        answers.push(format!(
            "    {{ last_seen_us = {last_seen}, entries = [{}] }},",
            entries.join(", ")
        ));
    }
    let mut out = String::from("[gpu.recording]\n");
    if supported {
        writeln!(out, "process_utilization = [\n{}\n]", answers.join("\n")).unwrap();
    }
    out.push_str("[gpu.recording.samples]\n");
    for buffer in buffers {
        writeln!(out, "{buffer}").unwrap();
    }
    out
}
