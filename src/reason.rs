//! Why a run or a GPU failed: one enum, each variant with its stable label (the
//! `reason` label of `nvidia_gpu_collector_error` and `nvidia_gpu_down_reason`)
//! and what an operator should check.
//!
//! Invariants (checked by tests): labels are unique, lower snake case, and every
//! one is listed in the README's table of reasons.

/// A failure reason. Plain data: `nvml` maps NVML errors onto it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// libnvidia-ml could not be loaded.
    LibraryNotFound,
    /// The NVIDIA kernel module is not loaded.
    DriverNotLoaded,
    /// The GPUs' device files may not be opened.
    NoPermission,
    /// The NVML library and the kernel module are different versions.
    DriverLibraryMismatch,
    /// The NVML library lacks a function the exporter needs.
    MissingSymbol,
    /// The GPU has fallen off the bus.
    GpuLost,
    /// A GPU this boot has seen is no longer enumerated by NVML.
    NotEnumerated,
    /// The GPU needs a reset before it can be used again.
    ResetRequired,
    /// NVML was not initialised (a driver reload under the run).
    Uninitialized,
    /// The driver itself timed out.
    DriverTimeout,
    /// The driver reported an interrupt problem.
    IrqIssue,
    /// The GPU's external power connectors are not plugged in properly.
    InsufficientPower,
    /// The GPU's InfoROM is corrupted.
    CorruptedInforom,
    /// NVML ran out of memory.
    OutOfMemory,
    /// An operating system call inside NVML failed.
    OperatingSystem,
    /// An error NVML did not explain.
    Unknown,
    /// The run did not finish within `--timeout` (`nvidia_gpu_collector_error`:
    /// NVML's init or the device count hung), or a GPU's calls did not
    /// (`nvidia_gpu_down_reason`: that GPU is down, the others are published).
    Timeout,
    /// Another run held the output's lock until the deadline.
    Busy,
    /// The exporter itself failed (a panic in a reading thread).
    ExporterBug,
    /// The exporter could not get a thread or memory.
    ExporterResources,
}

impl Reason {
    /// Every reason, in the order the README lists them.
    pub const ALL: [Reason; 20] = [
        Reason::LibraryNotFound,
        Reason::DriverNotLoaded,
        Reason::NoPermission,
        Reason::DriverLibraryMismatch,
        Reason::MissingSymbol,
        Reason::GpuLost,
        Reason::NotEnumerated,
        Reason::ResetRequired,
        Reason::Uninitialized,
        Reason::DriverTimeout,
        Reason::IrqIssue,
        Reason::InsufficientPower,
        Reason::CorruptedInforom,
        Reason::OutOfMemory,
        Reason::OperatingSystem,
        Reason::Unknown,
        Reason::Timeout,
        Reason::Busy,
        Reason::ExporterBug,
        Reason::ExporterResources,
    ];

    /// The stable label value.
    pub fn label(self) -> &'static str {
        match self {
            Reason::LibraryNotFound => "library_not_found",
            Reason::DriverNotLoaded => "driver_not_loaded",
            Reason::NoPermission => "no_permission",
            Reason::DriverLibraryMismatch => "driver_library_mismatch",
            Reason::MissingSymbol => "missing_symbol",
            Reason::GpuLost => "gpu_lost",
            Reason::NotEnumerated => "not_enumerated",
            Reason::ResetRequired => "reset_required",
            Reason::Uninitialized => "uninitialized",
            Reason::DriverTimeout => "driver_timeout",
            Reason::IrqIssue => "irq_issue",
            Reason::InsufficientPower => "insufficient_power",
            Reason::CorruptedInforom => "corrupted_inforom",
            Reason::OutOfMemory => "out_of_memory",
            Reason::OperatingSystem => "operating_system",
            Reason::Unknown => "unknown",
            Reason::Timeout => "timeout",
            Reason::Busy => "busy",
            Reason::ExporterBug => "exporter_bug",
            Reason::ExporterResources => "exporter_resources",
        }
    }

    /// What an operator should check.
    pub fn hint(self) -> &'static str {
        match self {
            Reason::LibraryNotFound => {
                "libnvidia-ml.so.1 could not be loaded: is the NVIDIA driver installed \
                 (ldconfig -p | grep libnvidia-ml)? In a container, is the NVIDIA container \
                 toolkit set up? Use --nvml-lib to point at the library."
            }
            Reason::DriverNotLoaded => {
                "the NVIDIA kernel module is not loaded: check `lsmod | grep nvidia`, \
                 `sudo modprobe nvidia` and `dmesg | grep -i -e nvidia -e nouveau` \
                 (nouveau loaded instead? Secure Boot refusing the module?)."
            }
            Reason::NoPermission => {
                "no permission to use the GPUs: check `ls -l /dev/nvidia*` and that the \
                 service user may open them."
            }
            Reason::DriverLibraryMismatch => {
                "the NVML library and the loaded kernel module are different versions, \
                 usually after a driver upgrade without a reboot: reboot, or reload the \
                 nvidia modules."
            }
            Reason::MissingSymbol => {
                "the NVML library lacks a function this exporter needs: the driver is too \
                 old, or --nvml-lib points at the wrong library."
            }
            Reason::NotEnumerated => {
                "NVML no longer lists a GPU this boot has seen (after a driver reload, \
                 a GPU that fell off the bus is left out of the count); check `dmesg` \
                 for Xid 79 and `nvidia-smi -L`; it is reported until the next boot."
            }
            Reason::GpuLost => {
                "the GPU fell off the bus (Xid 79): check `dmesg` for Xid errors, power \
                 and cooling; the node usually needs a reboot."
            }
            Reason::ResetRequired => "the GPU needs a reset: drain it and run `nvidia-smi -r`.",
            Reason::Timeout => {
                "an NVML call did not return within --timeout (the log names it): the \
                 driver or the GPU may be hung; check `dmesg` for Xid errors and whether \
                 `nvidia-smi` also hangs (`nvidia-smi -i N` for one GPU); a GPU that stays \
                 stuck usually needs a reset or a reboot."
            }
            Reason::Busy => {
                "another run held the output's lock until the deadline: is a run stuck in \
                 the driver (`ps -C nvidia-textfile-exporter -o pid,stat,wchan`)?"
            }
            Reason::ExporterBug => "a bug in the exporter: please report the log above.",
            Reason::ExporterResources => {
                "the exporter could not get a thread or memory: check the unit's limits."
            }
            Reason::Uninitialized
            | Reason::DriverTimeout
            | Reason::IrqIssue
            | Reason::InsufficientPower
            | Reason::CorruptedInforom
            | Reason::OutOfMemory
            | Reason::OperatingSystem
            | Reason::Unknown => {
                "see the detail above; `nvidia-smi` usually reports the same failure."
            }
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn labels_are_unique_snake_case() {
        let mut seen = HashSet::new();
        for reason in Reason::ALL {
            let label = reason.label();
            assert!(seen.insert(label), "duplicate {label}");
            assert!(
                label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{label}"
            );
            assert!(!reason.hint().is_empty());
        }
    }

    #[test]
    fn readme_lists_every_reason() {
        let readme = include_str!("../README.md");
        for reason in Reason::ALL {
            let cell = format!("| `{}` |", reason.label());
            assert!(readme.contains(&cell), "README lacks a row {cell}");
        }
    }
}
