//! Temperatures, thresholds, margins and fans, and the time held down by heat
//! and power brake.

use nvml::calls::{self, Call};
use nvml::types::field_id::{
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT, NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
};
use nvml::types::{TemperatureSensor, TemperatureThreshold};
use nvml::{Code, DeviceReader};

use crate::collector::{Collector, Fixed, Gpu, Hooks};
use crate::metrics::{self, families};
use nvml::fields::Field;

families! {
    FAMILIES;
    TEMPERATURE: Gauge(Celsius), "nvidia_gpu_temperature_celsius", [],
        "GPU die temperature.";
    MEMORY_TEMPERATURE: Gauge(Celsius), "nvidia_gpu_memory_temperature_celsius", [],
        "Memory (HBM) temperature.";
    TEMPERATURE_THRESHOLD: Gauge(Celsius), "nvidia_gpu_temperature_threshold_celsius", ["threshold"],
        "Temperature at which the GPU acts, by threshold: slowdown, shutdown, gpu_max, memory_max.";
    TEMPERATURE_MARGIN_THRESHOLD: Gauge(Celsius), "nvidia_gpu_temperature_margin_threshold_celsius", ["threshold"],
        "Thermal margin (nvidia_gpu_temperature_margin_celsius) at which the GPU acts, by threshold: slowdown, shutdown; negative: past the nearest slowdown threshold.";
    SLOWDOWN: Counter(Seconds), "nvidia_gpu_clocks_event_seconds_total", ["reason"],
        "Time the clocks were held down by this reason since the driver was loaded, by reason: sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown.";
    FAN_SPEED: Gauge(RatioOfMax), "nvidia_gpu_fan_speed_ratio", ["fan"],
        "Intended fan speed as a fraction of its maximum, by fan (may exceed 1 on some boards).";
    TEMPERATURE_MARGIN: Gauge(Celsius), "nvidia_gpu_temperature_margin_celsius", [],
        "Degrees the GPU is below its nearest slowdown threshold (nvidia-smi: GPU T.Limit Temp); negative once past it.";
}

pub(super) static COLLECTOR: Collector = Collector {
    name: "thermal",
    default: true,
    help: "GPU and HBM temperatures, temperature thresholds, fans, thermal margin and the margins the GPU slows down and shuts down at, time held down by thermal and power-brake slowdown.",
    families: FAMILIES,
    hooks: Hooks::read(read, FIELDS),
};

/// A threshold's label, and the name it is kept under: `<kind>.<label>`.
macro_rules! kept {
    ($kind:literal, $label:literal) => {
        ($label, Fixed(concat!($kind, ".", $label)))
    };
}

/// Read once per driver.
const THRESHOLDS: [(TemperatureThreshold, (&str, Fixed)); 4] = {
    use TemperatureThreshold::*;
    [
        (Slowdown, kept!("threshold", "slowdown")),
        (Shutdown, kept!("threshold", "shutdown")),
        (GpuMax, kept!("threshold", "gpu_max")),
        (MemoryMax, kept!("threshold", "memory_max")),
    ]
};

/// Margins at which the GPU acts (T.Limit scale, read once per driver).
const MARGIN_THRESHOLDS: [(u32, (&str, Fixed)); 2] = [
    (
        NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
        kept!("margin_threshold", "shutdown"),
    ),
    (
        NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
        kept!("margin_threshold", "slowdown"),
    ),
];

const FAN_COUNT: Fixed = Fixed("fan_count");

/// Clock event times in ns.
const SLOWDOWNS: [(u32, &str); 3] = [
    (
        NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
        "sw_thermal_slowdown",
    ),
    (
        NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
        "hw_thermal_slowdown",
    ),
    (
        NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
        "hw_power_brake_slowdown",
    ),
];

/// Dividing (not multiplying by 1e-9) keeps values exact in print.
const NANOSECONDS_PER_SECOND: f64 = 1e9;

pub(super) const FIELDS: &[u32] = &[
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
];

/// Boards have one to four.
const MAX_FANS: u32 = 16;

fn read(gpu: &mut Gpu<'_>) {
    let celsius = gpu_temperature(&mut gpu.nvml);
    gpu.gauge(TEMPERATURE, celsius);
    // NVML reports 0 for GPUs without an HBM sensor; 0 °C is not a reading.
    let memory = gpu.nvml.field(NVML_FI_DEV_MEMORY_TEMP);
    gpu.gauge(MEMORY_TEMPERATURE, memory.filter(|&celsius| celsius > 0.0));
    for (threshold, (label, fixed)) in THRESHOLDS {
        let celsius = gpu.read_fixed(fixed, calls::TEMPERATURE_THRESHOLD, threshold, i64::from);
        if let Some(Some(celsius)) = celsius {
            gpu.push(TEMPERATURE_THRESHOLD.sample_with([label], celsius as f64));
        }
    }
    let fans = gpu
        .read_fixed(FAN_COUNT, calls::FAN_COUNT, (), i64::from)
        .flatten()
        .and_then(|count| u32::try_from(count).ok())
        .and_then(|count| gpu.nvml.bounded(calls::FAN_COUNT::NAME, count, MAX_FANS))
        .unwrap_or(0);
    for fan in 0..fans {
        if let Some(percent) = gpu.nvml.read(calls::FAN_SPEED, fan) {
            gpu.push(FAN_SPEED.sample_with([fan.to_string()], metrics::ratio(f64::from(percent))));
        }
    }
    let margin = gpu.nvml.read(calls::MARGIN_TEMPERATURE, ());
    gpu.gauge(TEMPERATURE_MARGIN, margin.map(f64::from));
    for (id, (label, fixed)) in MARGIN_THRESHOLDS {
        let field = Field { id, scope: 0 };
        // Whole degrees: NVML answers these offsets as integers.
        let whole = |celsius: f64| celsius.round() as i64;
        if let Some(Some(celsius)) = gpu.read_fixed(fixed, calls::FIELD, field, whole) {
            gpu.push(TEMPERATURE_MARGIN_THRESHOLD.sample_with([label], celsius as f64));
        }
    }
    for (field, label) in SLOWDOWNS {
        let seconds = gpu.nvml.field(field).map(|ns| ns / NANOSECONDS_PER_SECOND);
        gpu.gauge_with(SLOWDOWN, [label], seconds);
    }
}

/// °C, from the deprecated `nvmlDeviceGetTemperature` where the driver lacks
/// `nvmlDeviceGetTemperatureV` (NVML 12.5+) or its struct version.
fn gpu_temperature(reader: &mut DeviceReader<'_>) -> Option<f64> {
    let not_in_driver = |error: &nvml::Error| error.code() == Code::NotInDriver;
    let celsius = match reader.read_expecting(calls::TEMPERATURE_V, (), not_in_driver)? {
        Ok(celsius) => f64::from(celsius),
        Err(_) => f64::from(reader.read(calls::TEMPERATURE, TemperatureSensor::Gpu)?),
    };
    Some(celsius)
}
