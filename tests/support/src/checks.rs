//! The checks the fault matrix and tests/cli/ share about a published file.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use crate::exposition::{self, Samples, Series};
use crate::{promtool, scenario, temp_files, OUT_FILE};

/// Values that differ from run to run, compared by presence only: timings, and
/// whether a run had the previous run's state (which depends on what ran
/// before it).
pub const VOLATILE: [&str; 4] = [
    "nvidia_gpu_collector_duration_seconds",
    "nvidia_gpu_collector_step_duration_seconds",
    "nvidia_gpu_collector_timestamp_seconds",
    "nvidia_gpu_collector_state_ok",
];

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// {gpu index: {series without gpu/uuid: value}} and the host-wide samples.
pub fn gpus(samples: &Samples) -> (BTreeMap<String, Samples>, Samples) {
    let (mut per_gpu, mut host) = (BTreeMap::<String, Samples>::new(), Samples::new());
    for (s, &v) in samples {
        match s.label("gpu") {
            Some(gpu) => per_gpu
                .entry(gpu.to_string())
                .or_default()
                .insert(s.without(&["gpu", "uuid"]), v),
            None => host.insert(s.clone(), v),
        };
    }
    (per_gpu, host)
}

/// The failure reasons the file names, e.g. `["timeout"]` or `["gpu2:gpu_lost"]`.
pub fn reasons(samples: &Samples) -> Vec<String> {
    let mut out = Vec::new();
    for (s, &v) in samples {
        let reason = s.label("reason").unwrap_or_default();
        if s.name == "nvidia_gpu_collector_error" && v == 1.0 {
            out.push(reason.to_string());
        }
        if s.name == "nvidia_gpu_down_reason" && v == 1.0 {
            out.push(format!(
                "gpu{}:{reason}",
                s.label("gpu").unwrap_or_default()
            ));
        }
    }
    out
}

/// The series that belong to a GPU (have a `gpu` label).
pub fn device_series(samples: &Samples) -> Vec<&Series> {
    samples
        .keys()
        .filter(|s| s.label("gpu").is_some())
        .collect()
}

/// The UUID of GPU `gpu`'s `nvidia_gpu_up`.
pub fn uuid_of(samples: &Samples, gpu: &str) -> Option<String> {
    let up = samples
        .keys()
        .find(|s| s.name == "nvidia_gpu_up" && s.label("gpu") == Some(gpu));
    up.and_then(|s| s.label("uuid")).map(String::from)
}

pub fn keys(samples: &Samples) -> BTreeSet<Series> {
    samples.keys().cloned().collect()
}

/// What the kernel log's counts write: a failed run still writes them.
const KERNEL_LOG_FAMILIES: [&str; 6] = [
    "nvidia_gpu_xid_errors_total",
    "nvidia_gpu_xid_errors_by_code_total",
    "nvidia_gpu_xid_unattributed_errors_total",
    "nvidia_gpu_fallen_off_bus_total",
    "nvidia_gpu_fallen_off_bus_unattributed_total",
    "nvidia_gpu_nvswitch_sxid_errors_total",
];

/// Parses the published file strictly, runs promtool and checks that no
/// temporary file is left. A failure (`Some(reason)`) must leave only
/// collector series with exactly that one `nvidia_gpu_collector_error`, and
/// the kernel log's counts (the GPUs the state knew, which NVML did not
/// read); otherwise `nvidia_gpu_collector_up` is 1.
pub fn check_file(path: &Path, failure: Option<&str>) -> Result<Samples, String> {
    let data = fs::read(path).map_err(|e| format!("{OUT_FILE}: {e}"))?;
    let samples = exposition::parse_bytes(&data)
        .map_err(|e| format!("{OUT_FILE} is not a complete exposition file: {e}"))?;
    promtool(&data).map_err(|e| format!("promtool check metrics: {e}"))?;
    let up = samples
        .get(&Series::new("nvidia_gpu_collector_up", &[]))
        .copied();
    ensure!(up.is_some(), "no nvidia_gpu_collector_up");
    if let Some(failure) = failure {
        ensure!(up == Some(0.0), "nvidia_gpu_collector_up is not 0");
        let foreign: BTreeSet<&str> = samples
            .keys()
            .filter(|s| !s.name.starts_with("nvidia_gpu_collector_") || s.label("gpu").is_some())
            .filter(|s| !KERNEL_LOG_FAMILIES.contains(&s.name.as_str()))
            .map(|s| s.name.as_str())
            .collect();
        ensure!(
            foreign.is_empty(),
            "series other than the collector's survived the failure: {foreign:?}"
        );
        let errors: Vec<(&Series, &f64)> = samples
            .iter()
            .filter(|(s, _)| s.name == "nvidia_gpu_collector_error")
            .collect();
        ensure!(
            errors.len() == 1,
            "{} nvidia_gpu_collector_error series",
            errors.len()
        );
        let reason = errors[0].0.label("reason");
        ensure!(
            reason == Some(failure) && *errors[0].1 == 1.0,
            "reason={reason:?}, expected {failure:?}"
        );
    } else {
        ensure!(
            up == Some(1.0),
            "nvidia_gpu_collector_up is {up:?}, reason {:?}",
            reasons(&samples)
        );
    }
    let left = temp_files(path.parent().unwrap_or(Path::new(".")));
    ensure!(left.is_empty(), "temporary files left: {left:?}");
    Ok(samples)
}

/// Same series and, except the [`VOLATILE`] ones, the same values.
pub fn compare(actual: &Samples, expected: &Samples, what: &str) -> Result<(), String> {
    let missing: Vec<_> = expected
        .keys()
        .filter(|s| !actual.contains_key(s))
        .collect();
    let extra: Vec<_> = actual
        .keys()
        .filter(|s| !expected.contains_key(s))
        .collect();
    ensure!(
        missing.is_empty(),
        "{what}: missing {} series, e.g. {}",
        missing.len(),
        missing[0]
    );
    ensure!(
        extra.is_empty(),
        "{what}: {} unexpected series, e.g. {}",
        extra.len(),
        extra[0]
    );
    for (s, v) in expected {
        let a = actual[s];
        let same = a == *v || (a.is_nan() && v.is_nan());
        ensure!(
            VOLATILE.contains(&s.name.as_str()) || same,
            "{what}: {s} is {a}, expected {v}"
        );
    }
    Ok(())
}

/// What a file (or a page that serves it) must hold for the hostile-strings
/// scenario `doc` (fault-hostile.toml): no series the strings try to smuggle in
/// (`gpu="9"`, `uuid="forged"`), one `nvidia_gpu_up` per GPU of the scenario
/// under its UUID, and the identity labels and the driver version exactly as
/// the scenario has them (invalid UTF-8 as U+FFFD). `at` names what is checked.
pub fn check_hostile(samples: &Samples, doc: &scenario::Table, at: &str) -> Result<(), String> {
    let forged: Vec<String> = samples
        .keys()
        .filter(|s| {
            s.label("uuid") == Some("forged")
                || s.label("gpu") == Some("9")
                || s.name.contains("forged")
        })
        .map(|s| s.to_string())
        .collect();
    ensure!(forged.is_empty(), "{at}: smuggled series: {forged:?}");
    let want: Vec<BTreeMap<&str, String>> = (0..)
        .map_while(|index| scenario::gpu(doc, index).map(|g| (index, g)))
        .map(|(index, g)| {
            let mut w = BTreeMap::from([("gpu", index.to_string())]);
            for label in ["uuid", "name", "serial", "vbios_version"] {
                w.insert(label, scenario::text(g.get(label)));
            }
            w
        })
        .collect();
    let ups: BTreeMap<&str, &str> = samples
        .keys()
        .filter(|s| s.name == "nvidia_gpu_up")
        .map(|s| {
            (
                s.label("gpu").unwrap_or_default(),
                s.label("uuid").unwrap_or_default(),
            )
        })
        .collect();
    ensure!(!ups.is_empty(), "{at}: no nvidia_gpu_up");
    let wanted: BTreeMap<&str, &str> = want
        .iter()
        .map(|w| (w["gpu"].as_str(), w["uuid"].as_str()))
        .collect();
    ensure!(ups == wanted, "{at}: nvidia_gpu_up series {ups:?}");
    for w in &want {
        let gpu = w["gpu"].as_str();
        let info: Vec<&Series> = samples
            .keys()
            .filter(|s| s.name == "nvidia_gpu_info" && s.label("gpu") == Some(gpu))
            .collect();
        ensure!(
            info.len() == 1,
            "{at}: {} nvidia_gpu_info for GPU {gpu}",
            info.len()
        );
        for label in ["uuid", "name", "serial", "vbios_version"] {
            let got = info[0].label(label);
            ensure!(
                got == Some(w[label].as_str()),
                "{at}: GPU {gpu} {label} is {got:?}, expected {:?}",
                w[label]
            );
        }
    }
    let want_driver = doc
        .get("system")
        .and_then(|s| s.get("driver_version"))
        .and_then(|v| v.as_str());
    let driver: Vec<&Series> = samples
        .keys()
        .filter(|s| s.name == "nvidia_gpu_driver_info")
        .collect();
    ensure!(
        driver.len() == 1 && driver[0].label("driver_version") == want_driver,
        "{at}: driver_version label is not the scenario's string"
    );
    Ok(())
}
