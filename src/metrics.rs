//! What a metric family is, and the families every run writes. Every family
//! (tested in `collectors`): a unique name starting with `nvidia_gpu_` and
//! ending in its unit; only counters end in `_total`.

use crate::reason::constants;

constants! {
    pub enum Kind {
        /// The word on the `# TYPE` line.
        fn as_str;
    }
    Gauge => ("gauge");
    Counter => ("counter");
}

/// In base units, as the name's suffix says.
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

/// How two samples of one family and labels become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    Sum,
    /// The larger is kept (an `_info` or state stays 1).
    Max,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// Decides [`Family::plausible`] and [`Family::merge`].
    pub unit: Unit,
    /// Beyond the device identity (`gpu`, `uuid`).
    pub labels: &'static [&'static str],
}

/// A family with `N` labels: a sample with the wrong number of label values
/// does not compile.
#[derive(Debug, Clone, Copy)]
pub struct Labelled<const N: usize> {
    family: &'static Family,
}

impl<const N: usize> Labelled<N> {
    /// Panics (at compile time in a constant) unless `family` has `N` labels.
    pub const fn new(family: &'static Family) -> Self {
        assert!(family.labels.len() == N, "the label count differs");
        Labelled { family }
    }

    pub const fn family(self) -> &'static Family {
        self.family
    }
}

/// A [`Labelled`] handle per family and, if named, `$list`: the collector's
/// families (first those in brackets, declared elsewhere). A family's labels
/// are its own, then those of `+ more` (a constant list, the owner's).
macro_rules! families {
    ($list:ident $([$($shared:path),*])?;
     $($ident:ident: $kind:ident($unit:ident), $name:literal, [$($label:literal),*] $(+ $more:path)?,
       $help:literal;)*) => {
        $crate::metrics::families! {
            $($ident: $kind($unit), $name, [$($label),*] $(+ $more)?, $help;)*
        }
        pub const $list: &[&$crate::metrics::Family] =
            &[$($($shared.family(),)*)? $($ident.family()),*];
    };
    ($($ident:ident: $kind:ident($unit:ident), $name:literal, [$($label:literal),*] $(+ $more:path)?,
       $help:literal;)*) => {
        $(
            #[doc = $help]
            pub const $ident: $crate::metrics::Labelled<
                { <[&str]>::len(&[$($label),*]) $(+ $more.len())? },
            > = {
                const LABELS: [&str; <[&str]>::len(&[$($label),*]) $(+ $more.len())?] =
                    $crate::metrics::join(&[&[$($label),*] $(, &$more)?]);
                $crate::metrics::Labelled::new(&$crate::metrics::Family {
                    name: $name,
                    help: $help,
                    kind: $crate::metrics::Kind::$kind,
                    unit: $crate::metrics::Unit::$unit,
                    labels: &LABELS,
                })
            };
        )*
    };
}
pub(crate) use families;

families! {
    // Written by every run (the collector's only when NVML is unusable).
    ALWAYS;
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
}

impl Family {
    /// A reading outside is a sentinel or garbage, dropped and counted
    /// (docs/metrics.md lists the bounds).
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

    pub fn admits(&self, value: f64) -> bool {
        value.is_finite() && self.plausible().contains(&value)
    }

    pub fn merge(&self) -> Merge {
        if self.unit == Unit::Bytes || self.kind == Kind::Counter {
            Merge::Sum
        } else {
            Merge::Max
        }
    }
}

/// `lists` one after another (a family's label names).
pub const fn join<const N: usize>(lists: &[&[&'static str]]) -> [&'static str; N] {
    let (mut all, mut at, mut list) = ([""; N], 0, 0);
    while list < lists.len() {
        let mut label = 0;
        while label < lists[list].len() {
            all[at] = lists[list][label];
            (at, label) = (at + 1, label + 1);
        }
        list += 1;
    }
    assert!(at == N, "the label count differs");
    all
}

const RATIO: std::ops::RangeInclusive<f64> = 0.0..=1.0;

pub fn plausible_percent(percent: f64) -> bool {
    RATIO.contains(&ratio(percent))
}

/// The decimal point moved two places: 58.7 % is 0.587, not 0.5870000000000001.
pub fn ratio(percent: f64) -> f64 {
    format!("{percent}e-2").parse().unwrap_or(percent / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_outside_a_period_are_implausible() {
        assert!(plausible_percent(0.0) && plausible_percent(100.0));
        assert!(!plausible_percent(101.0) && !plausible_percent(-1.0));
        assert!(!plausible_percent(f64::NAN) && !plausible_percent(4_294_967_295.0));
    }

    #[test]
    fn ratios_print_as_their_percentages_do() {
        assert_eq!(ratio(58.7).to_string(), "0.587");
        assert_eq!(ratio(9.7).to_string(), "0.097");
        assert_eq!(ratio(100.0), 1.0);
        assert_eq!(ratio(51.723_456_7).to_string(), "0.517234567");
        assert!(ratio(f64::NAN).is_nan() && ratio(f64::INFINITY).is_infinite());
    }
}
