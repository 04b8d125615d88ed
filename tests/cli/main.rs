//! The real binary against the fake NVML (`tests/fake-nvml`), one scenario each.
//!
//! Golden files in `tests/golden/<case>.prom` are the exact output with the
//! values that change every run (durations, timestamp) replaced by `<duration>`
//! and `<timestamp>` after they were checked. `UPDATE_GOLDEN=1 cargo test`
//! rewrites them; review the diff line by line before committing.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, UNIX_EPOCH};

use test_support::checks::{check_file, compare, device_series, gpus, uuid_of};
use test_support::clock::{close, now_on_the_sample_grid, window_of, SECOND, T0};
use test_support::golden;
use test_support::journal::{journal_entry, write_journal, XID79};
use test_support::scenario::without_the_second_gpu;
use test_support::{
    any_named, assert_promtool, exposition, gpu_value, lookup, parsed, select, value, value_in,
    Calls, Exporter, Outcome, Samples, Series,
};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

mod allocations;
mod attacks_44;
mod attacks_45;
mod attacks_46;
mod command_line;
mod deadline;
mod families;
mod gpm;
mod health_attacks;
mod identity;
mod nvlink;
mod nvml_faults;
mod processes;
mod publishing;
mod readings;
mod task_attacks;
mod tasks;
mod utilization;
mod xid;

/// The binary against the fake NVML, scenarios from tests/scenarios.
fn ex() -> &'static Exporter {
    static EXPORTER: std::sync::OnceLock<Exporter> = std::sync::OnceLock::new();
    EXPORTER.get_or_init(|| Exporter::beside(EXE, ROOT))
}

/// The fake NVML, built next to the binary by `cargo build -p fake-nvml`.
fn fake_nvml() -> PathBuf {
    ex().lib.clone()
}

fn scenario(name: &str) -> PathBuf {
    ex().scenario(name)
}

/// A run of `scenario_name` with `args` (see [`Exporter::run_args`]) and a
/// fresh state directory of its own.
fn exporter(scenario_name: &str, args: &[&str]) -> Outcome {
    let state = tempfile::tempdir().unwrap();
    ex().run_args(scenario_name, state.path(), args, &[])
}
