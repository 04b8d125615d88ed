//! Why a run or a GPU failed: one table, each reason with its stable label (the
//! `reason` label of `nvidia_gpu_collector_error` and `nvidia_gpu_down_reason`)
//! and what an operator should check. Labels are unique, lower snake case, and
//! every one is in the README's table of reasons (checked by tests).

/// The hint of the reasons `nvidia-smi` reports as well.
const SEE_DETAIL: &str = "see the detail above; `nvidia-smi` usually reports the same failure.";

/// An enum whose variants each carry constant strings: `ALL` (declaration
/// order) and one accessor per column, `fn column;` in the header, one value
/// per column in each row, `Variant (= discriminant)? => (values);`.
macro_rules! constants {
    (
        $(#[$meta:meta])* pub enum $name:ident { $($(#[$fn_doc:meta])* fn $column:ident;)+ }
        $($(#[$doc:meta])* $variant:ident $(= $number:literal)? => ($($value:expr),+);)*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$doc])* $variant $(= $number)?,)*
        }

        impl $name {
            pub const ALL: [$name; [$(stringify!($variant)),*].len()] = [$($name::$variant),*];

            $crate::reason::constants!(@columns $name [$($(#[$fn_doc])* $column;)+]
                $($variant ($($value),+))*);
        }
    };
    (@columns $name:ident [$(#[$fn_doc:meta])* $column:ident; $($rest:tt)*]
        $($variant:ident ($value:expr $(, $more:expr)*))*) => {
        $(#[$fn_doc])*
        pub fn $column(self) -> &'static str {
            match self {
                $($name::$variant => $value,)*
            }
        }

        $crate::reason::constants!(@columns $name [$($rest)*] $($variant ($($more),*))*);
    };
    (@columns $name:ident [] $($variant:ident ())*) => {};
}
pub(crate) use constants;

constants! {
    /// A failure reason, in the order the README lists them. Plain data: `nvml`
    /// maps NVML errors onto it.
    pub enum Reason {
        /// The stable label value.
        fn label;
        /// What an operator should check.
        fn hint;
    }
    LibraryNotFound => ("library_not_found",
        "libnvidia-ml.so.1 could not be loaded: is the NVIDIA driver installed \
         (ldconfig -p | grep libnvidia-ml)? In a container, is the NVIDIA container \
         toolkit set up? Use --nvml-lib to point at the library.");
    DriverNotLoaded => ("driver_not_loaded",
        "the NVIDIA kernel module is not loaded: check `lsmod | grep nvidia`, \
         `sudo modprobe nvidia` and `dmesg | grep -i -e nvidia -e nouveau` \
         (nouveau loaded instead? Secure Boot refusing the module?).");
    NoPermission => ("no_permission",
        "no permission to use the GPUs: check `ls -l /dev/nvidia*` and that the \
         service user may open them.");
    DriverLibraryMismatch => ("driver_library_mismatch",
        "the NVML library and the loaded kernel module are different versions, \
         usually after a driver upgrade without a reboot: reboot, or reload the \
         nvidia modules.");
    MissingSymbol => ("missing_symbol",
        "the NVML library lacks a function this exporter needs: the driver is too \
         old, or --nvml-lib points at the wrong library.");
    GpuLost => ("gpu_lost",
        "the GPU fell off the bus (Xid 79): check `dmesg` for Xid errors, power \
         and cooling; the node usually needs a reboot.");
    NotEnumerated => ("not_enumerated",
        "NVML no longer lists a GPU this boot has seen (after a driver reload, \
         a GPU that fell off the bus is left out of the count); check `dmesg` \
         for Xid 79 and `nvidia-smi -L`; it is reported until the next boot.");
    ResetRequired => ("reset_required", "the GPU needs a reset: drain it and run `nvidia-smi -r`.");
    /// NVML was not initialised (a driver reload under the run).
    Uninitialized => ("uninitialized", SEE_DETAIL);
    DriverTimeout => ("driver_timeout", SEE_DETAIL);
    IrqIssue => ("irq_issue", SEE_DETAIL);
    /// The GPU's external power connectors are not plugged in properly.
    InsufficientPower => ("insufficient_power", SEE_DETAIL);
    CorruptedInforom => ("corrupted_inforom", SEE_DETAIL);
    OutOfMemory => ("out_of_memory", SEE_DETAIL);
    OperatingSystem => ("operating_system", SEE_DETAIL);
    Unknown => ("unknown", SEE_DETAIL);
    /// NVML's init or the device count did not finish within `--timeout` (the
    /// run fails), or a GPU's calls did not (that GPU is down).
    Timeout => ("timeout",
        "an NVML call did not return within --timeout (the log names it): the \
         driver or the GPU may be hung; check `dmesg` for Xid errors and whether \
         `nvidia-smi` also hangs (`nvidia-smi -i N` for one GPU); a GPU that stays \
         stuck usually needs a reset or a reboot.");
    Busy => ("busy",
        "another run held the output's lock until the deadline: is a run stuck in \
         the driver (`ps -C nvidia-textfile-exporter -o pid,stat,wchan`)?");
    /// The exporter itself failed (a panic in a reading thread).
    ExporterBug => ("exporter_bug", "a bug in the exporter: please report the log above.");
    ExporterResources => ("exporter_resources",
        "the exporter could not get a thread or memory: check the unit's limits.");
}

impl From<nvml::Failure> for Reason {
    fn from(failure: nvml::Failure) -> Reason {
        // Each failure is the reason of the same name (the match is exhaustive).
        macro_rules! same_name {
            ($($name:ident)*) => {
                match failure {
                    $(nvml::Failure::$name => Reason::$name,)*
                }
            };
        }
        same_name!(
            LibraryNotFound DriverNotLoaded NoPermission DriverLibraryMismatch MissingSymbol GpuLost
            ResetRequired Uninitialized DriverTimeout IrqIssue InsufficientPower CorruptedInforom
            OutOfMemory OperatingSystem Unknown
        )
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
