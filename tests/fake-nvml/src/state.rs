//! Library state shared by all threads: the loaded scenario, the init
//! reference count, device handles, and the per-call precedence
//! (hang → delays → errors → lost → value).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::ffi::*;
use crate::scenario::{self, Gpu, MigDevice, Scenario, MAX_GPUS, MAX_MIG_SLOTS};

/// Environment variable naming the scenario file read by `nvmlInit`.
pub const SCENARIO_ENV: &str = "FAKE_NVML_SCENARIO";

/// Environment variable: `off` loads the scenario without its faults
/// ([`Scenario::without_faults`]).
pub const FAULTS_ENV: &str = "FAKE_NVML_FAULTS";

/// Environment variable naming a file (opened for appending at the first
/// call) that gets a line for every call that reads the scenario: the
/// function's name and the device, `-` for none, `G` for GPU G, `G/M` for the
/// MIG device at index M of GPU G's `mig_devices`; `nvmlDeviceGetFieldValues`
/// adds the fields asked, `id:scope,…`.
pub const CALL_LOG_ENV: &str = "FAKE_NVML_CALL_LOG";

static CALL_LOG: OnceLock<Option<Mutex<File>>> = OnceLock::new();

/// Appends `sym device` to the call log, where [`CALL_LOG_ENV`] names one.
fn log_call(sym: &str, device: std::fmt::Arguments) {
    let log = CALL_LOG.get_or_init(|| {
        let path = std::env::var_os(CALL_LOG_ENV).filter(|p| !p.is_empty())?;
        let file = OpenOptions::new().create(true).append(true).open(path);
        file.ok().map(Mutex::new)
    });
    if let Some(file) = log {
        let line = format!("{sym} {device}\n");
        // One write a line: lines of calls from several threads do not mix.
        let _ = file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(line.as_bytes());
    }
}

/// What an export's body returns: `Ok` becomes `NVML_SUCCESS`.
pub type Ret = Result<(), nvmlReturn_t>;

struct Loaded {
    scenario: Arc<Scenario>,
    /// `nvmlInit` calls not yet matched by `nvmlShutdown` (NVML counts them).
    refs: u32,
}

static STATE: Mutex<Option<Loaded>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<Loaded>> {
    // A panic while holding the lock cannot leave the Option half-written.
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs an export's body: a panic becomes `NVML_ERROR_UNKNOWN`.
pub fn guard(body: impl FnOnce() -> Ret) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

fn hang_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// `nvmlInit_v2` / `nvmlInitWithFlags`.
pub fn init() -> Ret {
    {
        let mut st = state();
        if let Some(loaded) = st.as_mut() {
            loaded.refs += 1;
            return Ok(());
        }
    }
    let scenario = load_scenario().map_err(|why| {
        eprintln!("fake-nvml: {why}");
        NVML_ERROR_UNKNOWN
    })?;
    let system = &scenario.system;
    if system.init_hang {
        hang_forever();
    }
    if system.init_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(system.init_delay_ms));
    }
    if let Some(code) = system.init_error {
        return Err(code.0);
    }
    let mut st = state();
    match st.as_mut() {
        // Another thread finished its own init while this one was reading.
        Some(loaded) => loaded.refs += 1,
        None => {
            *st = Some(Loaded {
                scenario: Arc::new(scenario),
                refs: 1,
            })
        }
    }
    Ok(())
}

fn load_scenario() -> Result<Scenario, String> {
    let path = std::env::var_os(SCENARIO_ENV)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("{SCENARIO_ENV} is not set"))?;
    let shown = path.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let scenario = scenario::parse(&text).map_err(|e| format!("{shown}: {e}"))?;
    match std::env::var(FAULTS_ENV).as_deref() {
        Err(_) | Ok("" | "on") => Ok(scenario),
        Ok("off") => Ok(scenario.without_faults()),
        Ok(other) => Err(format!("{FAULTS_ENV}={other}: expected on or off")),
    }
}

/// `nvmlShutdown`: the last matching call forgets the scenario.
pub fn shutdown() -> Ret {
    let scenario = loaded()?;
    delay(global_delay(&scenario, "nvmlShutdown"));
    let mut st = state();
    match st.as_mut() {
        None => Err(NVML_ERROR_UNINITIALIZED),
        Some(loaded) if loaded.refs > 1 => {
            loaded.refs -= 1;
            Ok(())
        }
        Some(_) => {
            *st = None;
            Ok(())
        }
    }
}

/// The current scenario, or `NVML_ERROR_UNINITIALIZED`.
pub fn loaded() -> Result<Arc<Scenario>, nvmlReturn_t> {
    state()
        .as_ref()
        .map(|l| Arc::clone(&l.scenario))
        .ok_or(NVML_ERROR_UNINITIALIZED)
}

fn global_delay(scenario: &Scenario, sym: &str) -> Duration {
    Duration::from_micros(scenario.delays_us.get(sym).copied().unwrap_or(0))
}

fn delay(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}

/// Entry of a system call: init check, null out-pointer check (`outs_ok`),
/// then global delay, then `[system] errors`.
pub fn system_call(sym: &str, outs_ok: bool) -> Result<Arc<Scenario>, nvmlReturn_t> {
    let scenario = loaded()?;
    log_call(sym, format_args!("-"));
    if !outs_ok {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if scenario.system.hang.iter().any(|hung| hung == sym) {
        hang_forever();
    }
    delay(global_delay(&scenario, sym));
    if let Some(code) = scenario.system.errors.get(sym) {
        return Err(code.0);
    }
    Ok(scenario)
}

/// What a device call does before it looks at the value.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub hang: bool,
    pub delay: Duration,
    pub error: Option<nvmlReturn_t>,
}

/// Precedence for `sym` on GPU `gpu`: hang → delays → errors → lost.
pub fn plan(scenario: &Scenario, gpu: usize, sym: &str, honour_lost: bool) -> Plan {
    let g = &scenario.gpus[gpu];
    let per_device = Duration::from_millis(g.delays_ms.get(sym).copied().unwrap_or(0));
    let error = g
        .errors
        .get(sym)
        .map(|c| c.0)
        .or((honour_lost && g.lost).then_some(NVML_ERROR_GPU_IS_LOST));
    Plan {
        hang: g.hang.iter().any(|h| h == sym),
        delay: global_delay(scenario, sym) + per_device,
        error,
    }
}

fn execute(plan: Plan) -> Ret {
    if plan.hang {
        hang_forever();
    }
    delay(plan.delay);
    plan.error.map_or(Ok(()), Err)
}

// Handles are addresses inside these tables, so they stay distinct and
// checkable across re-inits: GPU i is &GPU_HANDLES[i]; MIG slot s of GPU i is
// &MIG_HANDLES[i * MAX_MIG_SLOTS + s].
static GPU_HANDLES: [u8; MAX_GPUS] = [0; MAX_GPUS];
static MIG_HANDLES: [u8; MAX_GPUS * MAX_MIG_SLOTS] = [0; MAX_GPUS * MAX_MIG_SLOTS];

pub fn gpu_handle(index: usize) -> nvmlDevice_t {
    GPU_HANDLES[index..].as_ptr() as nvmlDevice_t
}

pub fn mig_handle(gpu: usize, slot: usize) -> nvmlDevice_t {
    MIG_HANDLES[gpu * MAX_MIG_SLOTS + slot..].as_ptr() as nvmlDevice_t
}

fn offset_in(handle: nvmlDevice_t, table: &[u8]) -> Option<usize> {
    let offset = (handle as usize).wrapping_sub(table.as_ptr() as usize);
    (offset < table.len()).then_some(offset)
}

/// A device handle resolved against the current scenario.
pub struct Dev {
    pub scenario: Arc<Scenario>,
    pub gpu: usize,
    /// Index into the GPU's `mig_devices` when the handle is a MIG device.
    pub mig: Option<usize>,
}

impl Dev {
    pub fn gpu(&self) -> &Gpu {
        &self.scenario.gpus[self.gpu]
    }

    pub fn mig(&self) -> Option<&MigDevice> {
        self.mig.map(|m| {
            &self
                .gpu()
                .mig_devices
                .as_ref()
                .expect("resolved MIG handle")[m]
        })
    }
}

fn resolve(
    scenario: &Scenario,
    handle: nvmlDevice_t,
) -> Result<(usize, Option<usize>), nvmlReturn_t> {
    if let Some(gpu) = offset_in(handle, &GPU_HANDLES) {
        if gpu < scenario.gpus.len() {
            return Ok((gpu, None));
        }
    } else if let Some(offset) = offset_in(handle, &MIG_HANDLES) {
        let (gpu, slot) = (offset / MAX_MIG_SLOTS, offset % MAX_MIG_SLOTS);
        let mig = scenario.gpus.get(gpu).and_then(|g| {
            g.mig_devices
                .as_ref()?
                .iter()
                .position(|m| m.slot as usize == slot)
        });
        if let Some(mig) = mig {
            return Ok((gpu, Some(mig)));
        }
    }
    Err(NVML_ERROR_INVALID_ARGUMENT)
}

/// Whether a symbol answers on a MIG device handle.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnMig {
    Answers,
    NotSupported,
}

/// Entry of a device call: init check, handle check, null out-pointer check
/// (`outs_ok`), then the precedence chain, then MIG support.
pub fn device_call(
    sym: &str,
    handle: nvmlDevice_t,
    outs_ok: bool,
    on_mig: OnMig,
) -> Result<Dev, nvmlReturn_t> {
    device_call_asking(sym, handle, outs_ok, on_mig, "")
}

/// [`device_call`] whose call log line ends in what it was asked (`asked`,
/// after a space where not empty).
pub fn device_call_asking(
    sym: &str,
    handle: nvmlDevice_t,
    outs_ok: bool,
    on_mig: OnMig,
    asked: &str,
) -> Result<Dev, nvmlReturn_t> {
    let scenario = loaded()?;
    let (gpu, mig) = resolve(&scenario, handle)?;
    let space = if asked.is_empty() { "" } else { " " };
    match mig {
        None => log_call(sym, format_args!("{gpu}{space}{asked}")),
        Some(mig) => log_call(sym, format_args!("{gpu}/{mig}{space}{asked}")),
    }
    if !outs_ok {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    execute(plan(&scenario, gpu, sym, true))?;
    if mig.is_some() && on_mig == OnMig::NotSupported {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    }
    Ok(Dev { scenario, gpu, mig })
}

/// `nvmlDeviceGetHandleByIndex_v2`: the selected GPU's hang/delays/errors
/// apply, `lost` does not (NVML still hands out a lost GPU's handle).
pub fn handle_by_index(sym: &str, index: u32, outs_ok: bool) -> Result<nvmlDevice_t, nvmlReturn_t> {
    let scenario = loaded()?;
    if !outs_ok {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let index = index as usize;
    if index >= scenario.gpus.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    log_call(sym, format_args!("{index}"));
    execute(plan(&scenario, index, sym, false))?;
    Ok(gpu_handle(index))
}

/// What a GPM sample holds once taken: which GPU (and GPU instance) and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub gpu: usize,
    pub gpu_instance: Option<u32>,
    pub at: Instant,
}

/// Live GPM samples by address: `None` until a sample is taken into it. Kept
/// apart from the scenario: a sample outlives `nvmlShutdown` only as a leak.
static SAMPLES: Mutex<Option<HashMap<usize, Option<Taken>>>> = Mutex::new(None);

fn samples() -> MutexGuard<'static, Option<HashMap<usize, Option<Taken>>>> {
    SAMPLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// `nvmlGpmSampleAlloc`: a fresh, distinct address.
pub fn sample_alloc() -> nvmlGpmSample_t {
    let address = Box::into_raw(Box::new(0u64)) as usize;
    samples()
        .get_or_insert_with(HashMap::new)
        .insert(address, None);
    address as nvmlGpmSample_t
}

/// `nvmlGpmSampleFree`: `INVALID_ARGUMENT` for an address not allocated (or
/// freed already).
pub fn sample_free(sample: nvmlGpmSample_t) -> Ret {
    let address = sample as usize;
    let removed = samples().as_mut().and_then(|m| m.remove(&address));
    match removed {
        // SAFETY: the address came from Box::into_raw in sample_alloc and was
        // still registered, so it is freed exactly once.
        Some(_) => drop(unsafe { Box::from_raw(address as *mut u64) }),
        None => return Err(NVML_ERROR_INVALID_ARGUMENT),
    }
    Ok(())
}

/// Whether `sample` is a live allocation.
pub fn sample_live(sample: nvmlGpmSample_t) -> bool {
    samples()
        .as_ref()
        .is_some_and(|m| m.contains_key(&(sample as usize)))
}

/// Records that `sample` was taken now.
pub fn sample_take(sample: nvmlGpmSample_t, gpu: usize, gpu_instance: Option<u32>) -> Ret {
    let mut guard = samples();
    let slot = guard
        .as_mut()
        .and_then(|m| m.get_mut(&(sample as usize)))
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    *slot = Some(Taken {
        gpu,
        gpu_instance,
        at: Instant::now(),
    });
    Ok(())
}

/// What `sample` holds: `INVALID_ARGUMENT` if it is not live or not taken.
pub fn sample_taken(sample: nvmlGpmSample_t) -> Result<Taken, nvmlReturn_t> {
    samples()
        .as_ref()
        .and_then(|m| m.get(&(sample as usize)).copied().flatten())
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// The number of live GPM samples (tests check that callers free them).
pub fn live_samples() -> usize {
    samples().as_ref().map_or(0, HashMap::len)
}

/// The precedence chain of `sym` on GPU `gpu`, for a call that names the GPU
/// through something other than a handle (`nvmlGpmMetricsGet`: its samples).
pub fn gpu_call(scenario: &Scenario, gpu: usize, sym: &str) -> Ret {
    log_call(sym, format_args!("{gpu}"));
    execute(plan(scenario, gpu, sym, true))
}
