//! The one table of metric families this exporter can write.
//!
//! Every family is declared exactly once, here, with its full name, HELP text and
//! type. Readers attach samples to a `&'static Family`; the renderer walks [`ALL`]
//! in declaration order, so the output groups each family's samples together under
//! a single HELP/TYPE pair and its order never depends on how the data was read.
//!
//! Invariants (checked by the tests at the bottom):
//! - names are unique, start with [`PREFIX`] and are valid Prometheus metric names;
//! - counters, and only counters, end in `_total`;
//! - `ALL[i].index == i`.
//!
//! Adding a family is one row in the `families!` invocation below plus the code in
//! `nvml` that reads it.

/// Every metric name starts with this.
pub const PREFIX: &str = "nvidia_gpu_";

/// The Prometheus metric type of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

impl Kind {
    /// The word used on the `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// A metric family: one name, one HELP, one TYPE.
#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    /// Position in [`ALL`]; the renderer orders families by it.
    pub index: usize,
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
}

macro_rules! families {
    ($($ident:ident: $kind:ident, $name:literal, $help:literal;)*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum Position { $($ident),* }
        $(
            #[doc = $help]
            pub const $ident: Family = Family {
                index: Position::$ident as usize,
                name: $name,
                help: $help,
                kind: Kind::$kind,
            };
        )*
        /// Every family, in output order.
        pub const ALL: &[Family] = &[$($ident),*];
    };
}

families! {
    // Collector health. These are the only series written when NVML is unusable.
    COLLECTOR_UP: Gauge, "nvidia_gpu_collector_up",
        "1 if this run read NVML, 0 if it could not (see nvidia_gpu_collector_error).";
    COLLECTOR_ERROR: Gauge, "nvidia_gpu_collector_error",
        "1 with the reason this run could not read NVML; absent when the run succeeded.";
    COLLECTOR_DURATION: Gauge, "nvidia_gpu_collector_duration_seconds",
        "Wall time this run spent reading NVML.";
    COLLECTOR_TIMESTAMP: Gauge, "nvidia_gpu_collector_timestamp_seconds",
        "Unix time at which this run took its snapshot.";
    COLLECTOR_BUILD_INFO: Gauge, "nvidia_gpu_collector_build_info",
        "Version of the exporter that wrote this file; always 1.";
    COLLECTOR_READ_ERRORS: Gauge, "nvidia_gpu_collector_read_errors",
        "NVML reads of this GPU that failed in this run for a reason other than not supported.";

    // Host-wide facts.
    DRIVER_INFO: Gauge, "nvidia_gpu_driver_info",
        "NVIDIA driver, CUDA driver API and NVML versions; always 1.";

    // Identity and liveness.
    UP: Gauge, "nvidia_gpu_up",
        "1 if the GPU answered NVML in this run, 0 if it is lost or failing (see nvidia_gpu_down_reason).";
    DOWN_REASON: Gauge, "nvidia_gpu_down_reason",
        "1 with the reason a GPU is down; absent for healthy GPUs.";
    INFO: Gauge, "nvidia_gpu_info",
        "Static facts about the GPU as labels; always 1.";

    // Utilization.
    UTILIZATION: Gauge, "nvidia_gpu_utilization_ratio",
        "Fraction of the last sample period during which a kernel ran on the GPU (0-1).";
    MEMORY_UTILIZATION: Gauge, "nvidia_gpu_memory_utilization_ratio",
        "Fraction of the last sample period during which device memory was read or written (0-1).";

    // Memory.
    MEMORY_USED: Gauge, "nvidia_gpu_memory_used_bytes",
        "Device memory allocated by processes and the driver.";
    MEMORY_FREE: Gauge, "nvidia_gpu_memory_free_bytes",
        "Device memory not allocated.";
    MEMORY_TOTAL: Gauge, "nvidia_gpu_memory_total_bytes",
        "Device memory in total.";

    // Thermal.
    TEMPERATURE: Gauge, "nvidia_gpu_temperature_celsius",
        "GPU die temperature.";

    // Power.
    POWER: Gauge, "nvidia_gpu_power_watts",
        "Power drawn by the GPU and its memory.";
    ENERGY: Counter, "nvidia_gpu_energy_joules_total",
        "Energy consumed by the GPU since the driver was last loaded.";

    // Clocks and performance state.
    CLOCK: Gauge, "nvidia_gpu_clock_hertz",
        "Current clock frequency by clock domain.";
    PERFORMANCE_STATE: Gauge, "nvidia_gpu_performance_state",
        "Performance state: 0 (P0, maximum performance) to 15 (P15, minimum).";

    // Cooling.
    FAN_SPEED: Gauge, "nvidia_gpu_fan_speed_ratio",
        "Intended fan speed as a fraction of its maximum, by fan (may exceed 1 on some boards).";

    // Processes.
    PROCESSES: Gauge, "nvidia_gpu_processes",
        "Compute processes running on the GPU.";
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn is_valid_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    #[test]
    fn names_are_unique_prefixed_and_valid() {
        let mut seen = HashSet::new();
        for family in ALL {
            assert!(seen.insert(family.name), "duplicate {}", family.name);
            assert!(family.name.starts_with(PREFIX), "{}", family.name);
            assert!(is_valid_metric_name(family.name), "{}", family.name);
            assert!(!family.help.is_empty(), "{} has no HELP", family.name);
        }
    }

    #[test]
    fn counters_and_only_counters_end_in_total() {
        for family in ALL {
            assert_eq!(
                family.kind == Kind::Counter,
                family.name.ends_with("_total"),
                "{}",
                family.name
            );
        }
    }

    #[test]
    fn index_matches_position() {
        for (position, family) in ALL.iter().enumerate() {
            assert_eq!(family.index, position, "{}", family.name);
        }
    }

    #[test]
    fn ratios_and_base_units_are_named_as_such() {
        for family in ALL {
            for bad in ["_percent", "_mw", "_mhz", "_kb", "_celcius", "_milli"] {
                assert!(
                    !family.name.contains(bad),
                    "{} is not in base units",
                    family.name
                );
            }
        }
    }
}
