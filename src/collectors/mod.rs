//! The registry ([`ALL`]) and one file per collector. Tested: names unique
//! kebab-case (a letter first); a family emitted by one collector only, except
//! `collector::SHARED`; a collector emits only its families (in `tests/cli/`).

mod c2c;
mod clocks;
mod fabric;
mod gpm;
mod health;
mod info;
mod jobstats;
mod limits;
mod media;
mod memory;
mod mig;
mod modes;
mod nvlink;
mod pcie;
mod pcie_errors;
mod platform;
mod power;
mod processes;
mod tasks;
mod thermal;
mod utilization;
pub mod xid;

use crate::collector::SHARED;
use crate::metrics::{self, Family};

pub use crate::collector::{Collector, HostInputs, HostRun, Settings};

/// Runs first, on every GPU.
pub(crate) use info::read as identify;

/// In the order `--help` and the docs list them.
pub static ALL: &[&Collector] = &[
    &utilization::COLLECTOR,
    &memory::COLLECTOR,
    &thermal::COLLECTOR,
    &power::COLLECTOR,
    &clocks::COLLECTOR,
    &pcie::COLLECTOR,
    &pcie_errors::COLLECTOR,
    &limits::COLLECTOR,
    &pcie::THROUGHPUT,
    &health::COLLECTOR,
    &media::COLLECTOR,
    &modes::COLLECTOR,
    &nvlink::COLLECTOR,
    &nvlink::LINKS,
    &fabric::COLLECTOR,
    &c2c::COLLECTOR,
    &platform::COLLECTOR,
    &mig::COLLECTOR,
    &gpm::COLLECTOR,
    &tasks::COLLECTOR,
    &processes::COLLECTOR,
    &xid::COLLECTOR,
    &jobstats::COLLECTOR,
];

/// A family declared twice is listed twice, for the tests.
pub fn families() -> impl Iterator<Item = &'static Family> {
    let rows = ALL.iter().flat_map(|collector| collector.families.iter());
    let own = rows.filter(|family| !SHARED.contains(family));
    metrics::ALWAYS.iter().chain(SHARED).chain(own).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Kind, Merge, Unit};
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_kebab_case() {
        let mut seen = HashSet::new();
        for collector in ALL {
            assert!(seen.insert(collector.name), "duplicate {}", collector.name);
            let name = collector.name.as_bytes();
            assert!(name[0].is_ascii_lowercase(), "{}", collector.name);
            assert!(name
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-'));
            assert!(collector.help.ends_with('.'), "{}", collector.name);
        }
    }

    #[test]
    fn every_family_has_at_most_one_collector() {
        let mut seen = HashSet::new();
        for collector in ALL {
            for family in collector.families {
                if SHARED.contains(family) {
                    continue;
                }
                assert!(seen.insert(family.name), "{} listed twice", family.name);
            }
        }
    }

    #[test]
    fn readme_lists_every_collector_with_its_default() {
        let readme = include_str!("../../README.md");
        for collector in ALL {
            let row = format!(
                "| `{}` | {} | {} |",
                collector.name,
                if collector.default { "on" } else { "off" },
                collector.help
            );
            assert!(readme.contains(&row), "README lacks the row\n{row}");
        }
    }

    const PREFIX: &str = "nvidia_gpu_";

    fn is_valid_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    #[test]
    fn names_are_unique_prefixed_and_valid() {
        let mut seen = HashSet::new();
        for family in families() {
            assert!(seen.insert(family.name), "duplicate {}", family.name);
            assert!(family.name.starts_with(PREFIX), "{}", family.name);
            assert!(is_valid_metric_name(family.name), "{}", family.name);
            assert!(!family.help.is_empty(), "{} has no HELP", family.name);
        }
    }

    #[test]
    fn every_name_ends_in_its_unit() {
        for family in families() {
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
        assert_eq!(thermal::FAN_SPEED.family().plausible(), 0.0..=2.55);
        assert_eq!(power::ENERGY.family().merge(), Merge::Sum);
        assert_eq!(processes::PROCESS_MEMORY_USED.family().merge(), Merge::Sum);
        assert_eq!(mig::MIG_INFO.family().merge(), Merge::Max);
    }

    #[test]
    fn counters_and_only_counters_end_in_total() {
        for family in families() {
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
            (thermal::TEMPERATURE.family(), 4_294_967_295.0),
            (thermal::MEMORY_TEMPERATURE.family(), 1.8e19),
            (power::POWER.family(), 4_294_967.295),
            (power::ENERGY.family(), 1.8e19),
            (health::ECC_ERRORS.family(), 1.8e19),
            (utilization::UTILIZATION.family(), 1.01),
            (gpm::SM_ACTIVE.family(), f64::NAN),
            (memory::MEMORY_USED.family(), 1.8e19),
        ] {
            assert!(!family.admits(sentinel), "{}", family.name);
        }
        for (family, real) in [
            (thermal::TEMPERATURE.family(), 44.0),
            (power::POWER.family(), 700.0),
            (power::ENERGY.family(), 91_234_567.0),
            (memory::MEMORY_TOTAL.family(), 150_754_820_096.0),
            (clocks::CLOCK.family(), 1.98e9),
            (thermal::FAN_SPEED.family(), 1.1),
            (pcie::PCIE_TRANSMIT.family(), 9.2e16),
        ] {
            assert!(family.admits(real), "{}", family.name);
        }
    }

    #[test]
    fn ratios_and_base_units_are_named_as_such() {
        for family in families() {
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
