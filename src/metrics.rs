//! The one table of metric families: name, type, unit, labels and HELP, each
//! declared once. A [`Labelled`] handle's type carries its family's label
//! count, so a sample with the wrong number of label values does not compile;
//! the renderer walks [`ALL`] in declaration order. Names are unique, start
//! with `nvidia_gpu_`, and only counters end in `_total` (checked by tests).

use crate::reason::constants;

constants! {
    /// The Prometheus metric type of a family.
    pub enum Kind {
        /// The word used on the `# TYPE` line.
        fn as_str;
    }
    Gauge => ("gauge");
    Counter => ("counter");
}

/// What a family's values measure, in base units (the name's suffix says the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Ratio,
    /// A fraction of a maximum that NVML lets exceed it (fan speed, up to 255 %).
    RatioOfMax,
    Celsius,
    Watts,
    Joules,
    Hertz,
    Bytes,
    BytesPerSecond,
    Seconds,
    Count,
    /// A state, a mode, an enum value, how many.
    Number,
}

/// How two samples of one family with the same labels become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    Sum,
    /// The larger is kept (an `_info` or state stays 1).
    Max,
}

/// A metric family: one name, one HELP, one TYPE.
#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    /// Position in [`ALL`]; the renderer orders families by it.
    pub index: usize,
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// Decides [`Family::plausible`] and [`Family::merge`].
    pub unit: Unit,
    /// The label names beyond the device identity (`gpu`, `uuid`), in order.
    pub labels: &'static [&'static str],
}

/// A family whose samples carry `N` labels beyond the device identity, the
/// way to make a [`crate::snapshot::Sample`]. `N == self.family().labels.len()`:
/// only `families!` makes one.
#[derive(Debug, Clone, Copy)]
pub struct Labelled<const N: usize> {
    family: &'static Family,
}

impl<const N: usize> Labelled<N> {
    pub const fn family(self) -> &'static Family {
        self.family
    }
}

macro_rules! families {
    ($($ident:ident: $kind:ident($unit:ident), $name:literal, [$($label:literal),*], $help:literal;)*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum Position { $($ident),* }
        $(
            #[doc = $help]
            pub const $ident: Labelled<{ <[&str]>::len(&[$($label),*]) }> = Labelled {
                family: &ALL[Position::$ident as usize],
            };
        )*
        /// Every family, in output order.
        pub const ALL: &[Family] = &[$(
            Family {
                index: Position::$ident as usize,
                name: $name,
                help: $help,
                kind: Kind::$kind,
                unit: Unit::$unit,
                labels: &[$($label),*],
            }
        ),*];
    };
}

families! {
    // Collector health. These are the only series written when NVML is unusable.
    COLLECTOR_UP: Gauge(Number), "nvidia_gpu_collector_up", [],
        "1 if this run read NVML, 0 if it did not (the reason is in nvidia_gpu_collector_error).";
    COLLECTOR_ERROR: Gauge(Number), "nvidia_gpu_collector_error", ["reason"],
        "1 with the reason this run did not read NVML (including busy: another run held the lock); absent when it did.";
    COLLECTOR_DURATION: Gauge(Seconds), "nvidia_gpu_collector_duration_seconds", [],
        "Wall time of this run up to rendering: waiting for the lock (busy runs) or reading NVML.";
    COLLECTOR_TIMESTAMP: Gauge(Seconds), "nvidia_gpu_collector_timestamp_seconds", [],
        "Unix time at which this run took its snapshot: when reading ended (the GPUs' point readings are taken just before it), or when the run failed.";
    COLLECTOR_BUILD_INFO: Gauge(Number), "nvidia_gpu_collector_build_info", ["version"],
        "Version of the exporter that wrote this file; always 1.";
    COLLECTOR_STATE_OK: Gauge(Number), "nvidia_gpu_collector_state_ok", [],
        "1 if this run used the previous run's state and stored its own; 0 if it started afresh (first run, other boot, damaged, unwritable or untrusted state, or another run held its lock).";
    COLLECTOR_SUCCESS: Gauge(Number), "nvidia_gpu_collector_success", ["collector"],
        "1 if the collector's host-level step (outside NVML: the kernel log for xid, /proc for process owners) did all it had to in this run, 0 if it failed or was cut short by the deadline or the read bound (its series then hold what was known before; the journal says why); written for each one that is on, in runs that read NVML.";
    COLLECTOR_STEP_DURATION: Gauge(Seconds), "nvidia_gpu_collector_step_duration_seconds", ["collector"],
        "Wall time the collector's host-level step took in this run (see nvidia_gpu_collector_success).";
    COLLECTOR_READ_ERRORS: Gauge(Number), "nvidia_gpu_collector_read_errors", [],
        "NVML reads of this GPU that failed in this run for a reason other than not supported.";

    DRIVER_INFO: Gauge(Number), "nvidia_gpu_driver_info", ["driver_version", "cuda_version", "nvml_version"],
        "NVIDIA driver, CUDA driver API and NVML versions; always 1.";

    UP: Gauge(Number), "nvidia_gpu_up", [],
        "1 if the GPU answered NVML in this run, 0 if it is lost or failing (see nvidia_gpu_down_reason).";
    DOWN_REASON: Gauge(Number), "nvidia_gpu_down_reason", ["reason"],
        "1 with the reason a GPU is down; absent for healthy GPUs.";
    INFO: Gauge(Number), "nvidia_gpu_info", ["name", "pci_bus_id", "serial", "vbios_version", "brand", "architecture", "minor_number"],
        "Static facts about the GPU as labels; always 1.";

    UTILIZATION: Gauge(Ratio), "nvidia_gpu_utilization_ratio", [],
        "Mean fraction of time a kernel ran on the GPU, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples (MIG mode), the point reading of its last sample period.";
    MEMORY_UTILIZATION: Gauge(Ratio), "nvidia_gpu_memory_utilization_ratio", [],
        "Mean fraction of time device memory was read or written, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples (MIG mode), the point reading of its last sample period.";
    ENCODER_UTILIZATION: Gauge(Ratio), "nvidia_gpu_encoder_utilization_ratio", [],
        "Mean fraction of time the video encoder was busy, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples, the point reading of its last sample period.";
    DECODER_UTILIZATION: Gauge(Ratio), "nvidia_gpu_decoder_utilization_ratio", [],
        "Mean fraction of time the video decoder was busy, over NVML's samples since the previous run (0-1; absent when none is new); where NVML keeps no samples, the point reading of its last sample period.";
    ENCODER_SESSIONS: Gauge(Number), "nvidia_gpu_encoder_sessions", [],
        "Active video encoder sessions.";
    ENCODER_FPS: Gauge(Number), "nvidia_gpu_encoder_average_fps", [],
        "Average frames per second over the active encoder sessions.";
    ENCODER_LATENCY: Gauge(Seconds), "nvidia_gpu_encoder_average_latency_seconds", [],
        "Average encode latency over the active encoder sessions.";

    // Window-complete utilization: NVML's samples integrated over time.
    BUSY: Counter(Seconds), "nvidia_gpu_busy_seconds_total", ["engine"],
        "Time the engine (gpu, memory, encoder, decoder) was busy, integrated from NVML's utilization samples; rate(busy)/rate(nvidia_gpu_sampled_seconds_total) is its exact mean utilization.";
    SAMPLED: Counter(Seconds), "nvidia_gpu_sampled_seconds_total", ["engine"],
        "Time covered by the NVML samples integrated into nvidia_gpu_busy_seconds_total, by engine; grows slower than wall time where samples were missed (a timer period longer than NVML's buffer, missed runs).";

    MEMORY_USED: Gauge(Bytes), "nvidia_gpu_memory_used_bytes", [],
        "Device memory allocated (NVML memory info v2: excluding reserved memory).";
    MEMORY_FREE: Gauge(Bytes), "nvidia_gpu_memory_free_bytes", [],
        "Device memory not allocated.";
    MEMORY_TOTAL: Gauge(Bytes), "nvidia_gpu_memory_total_bytes", [],
        "Device memory in total.";
    MEMORY_RESERVED: Gauge(Bytes), "nvidia_gpu_memory_reserved_bytes", [],
        "Device memory reserved by the driver and firmware.";
    BAR1_USED: Gauge(Bytes), "nvidia_gpu_bar1_memory_used_bytes", [],
        "BAR1 (CPU-mappable) memory in use.";
    BAR1_TOTAL: Gauge(Bytes), "nvidia_gpu_bar1_memory_total_bytes", [],
        "BAR1 (CPU-mappable) memory in total.";

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

    POWER: Gauge(Watts), "nvidia_gpu_power_watts", [],
        "Power drawn by the GPU and its memory (nvmlDeviceGetPowerUsage): averaged over the last second on Ampere except GA100 (A100, A30, A800) and newer, instantaneous on GA100 and older architectures.";
    ENERGY: Counter(Joules), "nvidia_gpu_energy_joules_total", [],
        "Energy consumed by the GPU since the driver was last loaded.";
    POWER_LIMIT: Gauge(Watts), "nvidia_gpu_power_limit_watts", [],
        "Power limit the GPU enforces now (the lowest of all limiters).";
    POWER_DEFAULT_LIMIT: Gauge(Watts), "nvidia_gpu_power_default_limit_watts", [],
        "Power limit the GPU has by default.";
    POWER_MIN_LIMIT: Gauge(Watts), "nvidia_gpu_power_min_limit_watts", [],
        "Lowest power limit that can be set.";
    POWER_MAX_LIMIT: Gauge(Watts), "nvidia_gpu_power_max_limit_watts", [],
        "Highest power limit that can be set.";

    CLOCK: Gauge(Hertz), "nvidia_gpu_clock_hertz", ["clock"],
        "Current clock frequency by clock domain.";
    CLOCK_MAX: Gauge(Hertz), "nvidia_gpu_clock_max_hertz", ["clock"],
        "Maximum clock frequency by clock domain.";
    PERFORMANCE_STATE: Gauge(Number), "nvidia_gpu_performance_state", [],
        "Performance state: 0 (P0, maximum performance) to 15 (P15, minimum).";
    CLOCKS_EVENT: Gauge(Number), "nvidia_gpu_clocks_event_active", ["reason"],
        "1 if this reason is holding the clocks down now, 0 if not, by reason.";
    VIOLATION: Counter(Seconds), "nvidia_gpu_violation_seconds_total", ["policy"],
        "Time the clocks were held below their target by this policy, by policy.";

    FAN_SPEED: Gauge(RatioOfMax), "nvidia_gpu_fan_speed_ratio", ["fan"],
        "Intended fan speed as a fraction of its maximum, by fan (may exceed 1 on some boards).";

    PCIE_GENERATION: Gauge(Number), "nvidia_gpu_pcie_link_generation", [],
        "Current PCIe link generation.";
    PCIE_MAX_GENERATION: Gauge(Number), "nvidia_gpu_pcie_link_max_generation", [],
        "Highest PCIe link generation the GPU and system support.";
    PCIE_WIDTH: Gauge(Number), "nvidia_gpu_pcie_link_width", [],
        "Current PCIe link width in lanes.";
    PCIE_MAX_WIDTH: Gauge(Number), "nvidia_gpu_pcie_link_max_width", [],
        "Widest PCIe link the GPU and system support, in lanes.";
    PCIE_ERRORS: Counter(Count), "nvidia_gpu_pcie_errors_total", ["kind"],
        "PCIe link events counted by the GPU since the driver was loaded, by kind: l0_to_recovery, correctable, nak_received, nak_sent, receiver, bad_tlp, bad_dllp, non_fatal, fatal, unsupported_request, lcrc, lane (only with --collector pcie-errors).";
    PCIE_REPLAYS: Counter(Count), "nvidia_gpu_pcie_replays_total", [],
        "PCIe replays (retransmitted packets) since the driver was loaded.";
    PCIE_TRANSMIT: Counter(Bytes), "nvidia_gpu_pcie_transmit_bytes_total", [],
        "Bytes the GPU sent over PCIe.";
    PCIE_RECEIVE: Counter(Bytes), "nvidia_gpu_pcie_receive_bytes_total", [],
        "Bytes the GPU received over PCIe.";
    PCIE_TRANSMIT_THROUGHPUT: Gauge(BytesPerSecond), "nvidia_gpu_pcie_transmit_throughput_bytes_per_second", [],
        "PCIe send throughput over a 20 ms sample (only with --collector pcie-throughput).";
    PCIE_RECEIVE_THROUGHPUT: Gauge(BytesPerSecond), "nvidia_gpu_pcie_receive_throughput_bytes_per_second", [],
        "PCIe receive throughput over a 20 ms sample (only with --collector pcie-throughput).";

    // Memory health.
    ECC_ENABLED: Gauge(Number), "nvidia_gpu_ecc_enabled", [],
        "1 if ECC is enabled now.";
    ECC_PENDING_ENABLED: Gauge(Number), "nvidia_gpu_ecc_pending_enabled", [],
        "1 if ECC will be enabled after the next reboot.";
    ECC_ERRORS: Counter(Count), "nvidia_gpu_ecc_errors_total", ["type", "scope"],
        "ECC errors by type (corrected, uncorrected) and scope (volatile: since the driver loaded; aggregate: lifetime).";
    RETIRED_PAGES: Gauge(Number), "nvidia_gpu_retired_pages", ["cause"],
        "Memory pages retired, by cause (single_bit_ecc, double_bit_ecc).";
    RETIRED_PAGES_PENDING: Gauge(Number), "nvidia_gpu_retired_pages_pending", [],
        "1 if pages are waiting to be retired at the next reboot.";
    REMAPPED_ROWS: Gauge(Number), "nvidia_gpu_remapped_rows", ["cause"],
        "Memory rows remapped, by cause (correctable, uncorrectable).";
    REMAPPED_ROWS_PENDING: Gauge(Number), "nvidia_gpu_remapped_rows_pending", [],
        "1 if a row remap is waiting for a GPU reset.";
    REMAPPED_ROWS_FAILURE: Gauge(Number), "nvidia_gpu_remapped_rows_failure", [],
        "1 if a row remap failed: the GPU needs service.";

    PERSISTENCE_MODE: Gauge(Number), "nvidia_gpu_persistence_mode", [],
        "1 if persistence mode is on.";
    COMPUTE_MODE: Gauge(Number), "nvidia_gpu_compute_mode", ["mode"],
        "The compute mode as a label (default, exclusive_thread, exclusive_process, prohibited); always 1.";
    MIG_ENABLED: Gauge(Number), "nvidia_gpu_mig_enabled", [],
        "1 if MIG mode is enabled now.";
    MIG_PENDING_ENABLED: Gauge(Number), "nvidia_gpu_mig_pending_enabled", [],
        "1 if MIG mode will be enabled after the next GPU reset.";

    // Media engines, thermal margin and the second power reading.
    JPEG_UTILIZATION: Gauge(Ratio), "nvidia_gpu_jpeg_utilization_ratio", [],
        "Fraction of the last sample period during which the JPEG decoders (NVJPG) were busy (0-1).";
    OFA_UTILIZATION: Gauge(Ratio), "nvidia_gpu_ofa_utilization_ratio", [],
        "Fraction of the last sample period during which the optical flow accelerator (OFA) was busy (0-1).";
    TEMPERATURE_MARGIN: Gauge(Celsius), "nvidia_gpu_temperature_margin_celsius", [],
        "Degrees the GPU is below its nearest slowdown threshold (nvidia-smi: GPU T.Limit Temp); negative once past it.";
    POWER_AVERAGE: Gauge(Watts), "nvidia_gpu_power_average_watts", [],
        "Power drawn by the GPU, averaged by the driver over the last second (nvidia-smi: Average Power Draw); only where nvidia_gpu_power_watts is instantaneous (GA100 and older, or an architecture NVML does not name).";
    POWER_INSTANT: Gauge(Watts), "nvidia_gpu_power_instant_watts", [],
        "Power drawn by the GPU at the moment of reading (nvidia-smi: Instantaneous Power Draw; driver 535+); only where nvidia_gpu_power_watts is a 1 s average (Ampere except GA100, and newer).";

    // NVLink, per GPU (summed over its links).
    NVLINK_LINKS: Gauge(Number), "nvidia_gpu_nvlink_links", [],
        "NVLink links the GPU has.";
    NVLINK_LINKS_ACTIVE: Gauge(Number), "nvidia_gpu_nvlink_links_active", [],
        "NVLink links that are active.";
    NVLINK_ERRORS: Counter(Count), "nvidia_gpu_nvlink_errors_total", ["counter"],
        "NVLink errors summed over the GPU's links, by counter (replay, recovery, crc_flit, crc_data; effective, symbol on NVLink 5).";
    NVLINK_TRANSMIT: Counter(Bytes), "nvidia_gpu_nvlink_transmit_bytes_total", [],
        "Data bytes sent over NVLink, summed over the GPU's links.";
    NVLINK_RECEIVE: Counter(Bytes), "nvidia_gpu_nvlink_receive_bytes_total", [],
        "Data bytes received over NVLink, summed over the GPU's links.";

    NVLINK_RECOVERIES: Counter(Count), "nvidia_gpu_nvlink_recoveries_total", ["result"],
        "NVLink link recoveries summed over the GPU's links, by result (successful, failed); NVLink 5 (Blackwell) and newer.";
    NVLINK_LINKS_LOST: Gauge(Number), "nvidia_gpu_nvlink_links_lost", [],
        "NVLink links that were active earlier in this boot (under this driver) and are not active now.";

    // NVLink fabric (NVSwitch systems; absent on GPUs on no fabric).
    FABRIC_STATE: Gauge(Number), "nvidia_gpu_fabric_state", ["state"],
        "Registration of the GPU with the NVLink fabric (Fabric Manager), as a state set: 1 for the current state (not_started, in_progress, completed), 0 for the others.";
    FABRIC_STATUS: Gauge(Number), "nvidia_gpu_fabric_status", [],
        "NVML return code of the GPU's fabric registration: 0 success; meaningful once the state is completed.";
    FABRIC_INFO: Gauge(Number), "nvidia_gpu_fabric_info", ["cluster_uuid", "clique_id"],
        "The NVLink fabric cluster and clique of the GPU as labels; always 1.";
    FABRIC_HEALTH: Gauge(Number), "nvidia_gpu_fabric_health_condition", ["condition"],
        "1 if this fabric health condition holds, 0 if not, by condition (degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery, incorrect_configuration); absent where the driver does not report it.";
    FABRIC_HEALTH_SUMMARY: Gauge(Number), "nvidia_gpu_fabric_health", ["summary"],
        "The driver's summary of the fabric's health (struct version 3), as a state set: 1 for the current one (healthy, unhealthy, limited_capacity), 0 for the others.";

    // NVLink, per link (only with --collector nvlink-links).
    NVLINK_LINK_ACTIVE: Gauge(Number), "nvidia_gpu_nvlink_link_active", ["link"],
        "1 if the NVLink link is active, by link (only with --collector nvlink-links).";
    NVLINK_LINK_ERRORS: Counter(Count), "nvidia_gpu_nvlink_link_errors_total", ["link", "counter"],
        "NVLink errors by link and counter: replay, recovery, crc_flit, crc_data; effective, symbol on NVLink 5 (only with --collector nvlink-links).";
    NVLINK_LINK_RECOVERIES: Counter(Count), "nvidia_gpu_nvlink_link_recoveries_total", ["link", "result"],
        "NVLink link recoveries by link and result (successful, failed); NVLink 5 and newer (only with --collector nvlink-links).";
    NVLINK_LINK_BIT_ERROR: Gauge(Ratio), "nvidia_gpu_nvlink_link_bit_error_ratio", ["link", "kind"],
        "NVLink bit error rate the link reports, by link and kind (effective, symbol); NVLink 5 and newer (only with --collector nvlink-links).";
    NVLINK_LINK_TRANSMIT: Counter(Bytes), "nvidia_gpu_nvlink_link_transmit_bytes_total", ["link"],
        "Data bytes sent over the NVLink link, by link (only with --collector nvlink-links).";
    NVLINK_LINK_RECEIVE: Counter(Bytes), "nvidia_gpu_nvlink_link_receive_bytes_total", ["link"],
        "Data bytes received over the NVLink link, by link (only with --collector nvlink-links).";

    // XID errors, counted from the kernel log, and the driver's recovery action.
    XID_ERRORS: Counter(Count), "nvidia_gpu_xid_errors_total", [],
        "XID errors the NVIDIA driver logged for this GPU in the kernel log during this boot; 0 until the first.";
    XID_ERRORS_BY_CODE: Counter(Count), "nvidia_gpu_xid_errors_by_code_total", ["code"],
        "XID errors logged for this GPU during this boot, by XID code; a code appears when it is first logged.";
    XID_UNATTRIBUTED: Counter(Count), "nvidia_gpu_xid_unattributed_errors_total", ["pci_bus_id", "code"],
        "XID errors logged during this boot for a PCI bus id that matches no GPU NVML reports, by bus id (domain:bus:device) and code.";
    FALLEN_OFF_BUS: Counter(Count), "nvidia_gpu_fallen_off_bus_total", [],
        "Kernel lines of this boot saying this GPU has fallen off the bus, outside an Xid line (the driver may log one without an Xid 79); 0 until the first.";
    FALLEN_OFF_BUS_UNATTRIBUTED: Counter(Count), "nvidia_gpu_fallen_off_bus_unattributed_total", ["pci_bus_id"],
        "Kernel lines of this boot saying a GPU has fallen off the bus, for a PCI bus id that matches no GPU NVML reports (one that fell off before it enumerated), by bus id (domain:bus:device).";
    NVSWITCH_SXID_ERRORS: Counter(Count), "nvidia_gpu_nvswitch_sxid_errors_total", ["switch", "pci_bus_id", "code", "sxid_severity"],
        "SXid errors the NVSwitch driver logged during this boot, by switch (N of nvidia-nvswitchN), its PCI bus id (domain:bus:device), SXid code and severity (fatal, non_fatal); a series appears at its first count.";
    RECOVERY_ACTION: Gauge(Number), "nvidia_gpu_recovery_action", ["action"],
        "Recovery action the driver asks for, as a state set: 1 for the current action (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset), 0 for the others.";

    MIG_INFO: Gauge(Number), "nvidia_gpu_mig_info", ["gpu_instance_id", "compute_instance_id", "mig_uuid", "profile"],
        "A MIG device of this GPU, with its ids and profile (e.g. 1g.10gb) as labels; always 1.";
    MIG_MEMORY_USED: Gauge(Bytes), "nvidia_gpu_mig_memory_used_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory allocated on the MIG device.";
    MIG_MEMORY_TOTAL: Gauge(Bytes), "nvidia_gpu_mig_memory_total_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory of the MIG device in total.";
    MIG_MEMORY_FREE: Gauge(Bytes), "nvidia_gpu_mig_memory_free_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory not allocated on the MIG device.";
    MIG_MEMORY_RESERVED: Gauge(Bytes), "nvidia_gpu_mig_memory_reserved_bytes", ["gpu_instance_id", "compute_instance_id"],
        "Device memory of the MIG device reserved by the driver and firmware.";

    // GPM (GPU Performance Monitoring, Hopper and newer): activity over the run's window.
    SM_ACTIVE: Gauge(Ratio), "nvidia_gpu_sm_active_ratio", [],
        "Fraction of the GPM window during which an SM had at least one warp resident, averaged over all SMs (0-1).";
    SM_OCCUPANCY: Gauge(Ratio), "nvidia_gpu_sm_occupancy_ratio", [],
        "Warps resident on the SMs as a fraction of the most they can hold, averaged over the GPM window (0-1).";
    GRAPHICS_ENGINE_ACTIVE: Gauge(Ratio), "nvidia_gpu_graphics_engine_active_ratio", [],
        "Fraction of the GPM window during which the graphics or compute engine was busy (0-1).";
    DRAM_ACTIVE: Gauge(Ratio), "nvidia_gpu_dram_active_ratio", [],
        "Device memory bandwidth used as a fraction of its peak, over the GPM window (0-1).";
    PIPE_ACTIVE: Gauge(Ratio), "nvidia_gpu_pipe_active_ratio", ["pipe"],
        "Fraction of the GPM window during which a pipe was active, by pipe (tensor: any tensor pipe; tensor_hmma, tensor_imma, tensor_dfma, fp64, fp32, fp16, integer) (0-1).";
    GPM_WINDOW: Gauge(Seconds), "nvidia_gpu_gpm_window_seconds", [],
        "Time between the two GPM samples the GPM metrics of this GPU were computed from.";
    GPM_UNAVAILABLE: Gauge(Number), "nvidia_gpu_gpm_unavailable", ["reason"],
        "1 with the reason the GPM metrics of a GPU that supports GPM are missing from this run (no_permission, counters_in_use, paused, window_too_short); absent when they were read.";
    MIG_SM_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_sm_active_ratio", ["gpu_instance_id"],
        "nvidia_gpu_sm_active_ratio of one MIG GPU instance, over its SMs (0-1).";
    MIG_SM_OCCUPANCY: Gauge(Ratio), "nvidia_gpu_mig_sm_occupancy_ratio", ["gpu_instance_id"],
        "nvidia_gpu_sm_occupancy_ratio of one MIG GPU instance (0-1).";
    MIG_GRAPHICS_ENGINE_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_graphics_engine_active_ratio", ["gpu_instance_id"],
        "nvidia_gpu_graphics_engine_active_ratio of one MIG GPU instance (0-1).";
    MIG_DRAM_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_dram_active_ratio", ["gpu_instance_id"],
        "nvidia_gpu_dram_active_ratio of one MIG GPU instance (0-1).";
    MIG_PIPE_ACTIVE: Gauge(Ratio), "nvidia_gpu_mig_pipe_active_ratio", ["gpu_instance_id", "pipe"],
        "nvidia_gpu_pipe_active_ratio of one MIG GPU instance, by pipe (0-1).";

    PROCESSES: Gauge(Number), "nvidia_gpu_processes", [],
        "Compute processes running on the GPU.";
    PROCESS_MEMORY_USED: Gauge(Bytes), "nvidia_gpu_process_memory_used_bytes", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Device memory used by a compute process, with its owner (only with --collector processes).";
    PROCESS_UTILIZATION: Gauge(Ratio), "nvidia_gpu_process_utilization_ratio", ["pid", "gpu_instance_id", "compute_instance_id", "comm", "user", "systemd_unit", "container_id", "slurm_job_id"],
        "Fraction of the GPU's sample periods since the previous run in which a compute process's kernels ran, NVML's one mean per process (0-1; the processes of a GPU add up to its utilization), with its owner (only with --collector processes).";
}

/// The one plausibility rule: a reading outside is a sentinel or garbage,
/// dropped and counted by the reader (docs/metrics.md lists the bounds).
impl Family {
    /// The values a reading of this family can take on any GPU.
    pub fn plausible(&self) -> std::ops::RangeInclusive<f64> {
        let counter = self.kind == Kind::Counter;
        match self.unit {
            Unit::Ratio => RATIO,
            Unit::RatioOfMax => 0.0..=2.55,
            Unit::Celsius => -40.0..=200.0,
            Unit::Watts => 0.0..=5_000.0,
            Unit::Joules => 0.0..=1e14,
            Unit::Hertz => 0.0..=1e11,
            Unit::Bytes if counter => 0.0..=1e19,
            Unit::Bytes => 0.0..=1.2e15,
            Unit::BytesPerSecond => 0.0..=1e13,
            Unit::Seconds if counter => 0.0..=1e10,
            Unit::Seconds => 0.0..=3600.0,
            Unit::Count => 0.0..=1e15,
            Unit::Number => f64::MIN..=f64::MAX,
        }
    }

    /// Whether `value` is finite and [`Family::plausible`].
    pub fn admits(&self, value: f64) -> bool {
        value.is_finite() && self.plausible().contains(&value)
    }

    /// How duplicate samples merge: bytes and counters sum, the rest keeps the larger.
    pub fn merge(&self) -> Merge {
        if self.unit == Unit::Bytes || self.kind == Kind::Counter {
            Merge::Sum
        } else {
            Merge::Max
        }
    }
}

/// A fraction of time or capacity.
const RATIO: std::ops::RangeInclusive<f64> = 0.0..=1.0;

/// Whether an NVML reading in percent of a period can be one.
pub fn plausible_percent(percent: f64) -> bool {
    RATIO.contains(&(percent / 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const PREFIX: &str = "nvidia_gpu_";

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
    fn every_name_ends_in_its_unit() {
        for family in ALL {
            let name = family.name;
            let counter = family.kind == Kind::Counter;
            let suffixes: &[&str] = match family.unit {
                Unit::Ratio | Unit::RatioOfMax => &["_ratio"],
                Unit::Celsius => &["_celsius"],
                Unit::Watts => &["_watts"],
                Unit::Joules => &["_joules_total"],
                Unit::Hertz => &["_hertz"],
                Unit::Bytes if counter => &["_bytes_total"],
                Unit::Bytes => &["_bytes"],
                Unit::BytesPerSecond => &["_bytes_per_second"],
                Unit::Seconds if counter => &["_seconds_total"],
                Unit::Seconds => &["_seconds"],
                Unit::Count => &["_total"],
                Unit::Number => &[""],
            };
            assert!(
                suffixes.iter().any(|suffix| name.ends_with(suffix)),
                "{name} is declared {:?}",
                family.unit
            );
            let units = [
                "_ratio", "_celsius", "_watts", "_joules", "_hertz", "_bytes", "_seconds",
            ];
            if matches!(family.unit, Unit::Number | Unit::Count) {
                let stem = name.trim_end_matches("_total");
                assert!(
                    !units.iter().any(|unit| stem.ends_with(unit)),
                    "{name} names a unit but is declared {:?}",
                    family.unit
                );
            }
        }
        assert_eq!(FAN_SPEED.family().plausible(), 0.0..=2.55);
        assert_eq!(ENERGY.family().merge(), Merge::Sum);
        assert_eq!(PROCESS_MEMORY_USED.family().merge(), Merge::Sum);
        assert_eq!(MIG_INFO.family().merge(), Merge::Max);
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
    fn sentinels_are_implausible_and_real_readings_plausible() {
        for (family, sentinel) in [
            (TEMPERATURE.family(), 4_294_967_295.0),
            (MEMORY_TEMPERATURE.family(), 1.8e19),
            (POWER.family(), 4_294_967.295),
            (ENERGY.family(), 1.8e19),
            (ECC_ERRORS.family(), 1.8e19),
            (UTILIZATION.family(), 1.01),
            (SM_ACTIVE.family(), f64::NAN),
            (MEMORY_USED.family(), 1.8e19),
        ] {
            assert!(!family.admits(sentinel), "{}", family.name);
        }
        for (family, real) in [
            (TEMPERATURE.family(), 44.0),
            (POWER.family(), 700.0),
            (ENERGY.family(), 91_234_567.0),
            (MEMORY_TOTAL.family(), 150_754_820_096.0),
            (CLOCK.family(), 1.98e9),
            (FAN_SPEED.family(), 1.1),
            (PCIE_TRANSMIT.family(), 9.2e16),
        ] {
            assert!(family.admits(real), "{}", family.name);
        }
        assert!(plausible_percent(0.0) && plausible_percent(100.0));
        assert!(!plausible_percent(101.0) && !plausible_percent(-1.0));
        assert!(!plausible_percent(f64::NAN) && !plausible_percent(4_294_967_295.0));
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
