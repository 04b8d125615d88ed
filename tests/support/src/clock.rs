//! Runs at the fake NVML's clock (`FAKE_NVML_CLOCK_US`), with a state kept
//! from run to run, and the utilization window they read.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{assert_promtool, value_in, Exporter, Outcome};

/// A time (µs) at a 2 s boundary, so that a busy second starts there.
pub const T0: u64 = 1_750_000_000_000_000;

pub const SECOND: u64 = 1_000_000;

/// Whether `a` and `b` are equal but for rounding.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The system clock in µs, on the 2 s grid of duty-cycle's sample pattern.
pub fn now_on_the_sample_grid() -> u64 {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    now_us / (2 * SECOND) * (2 * SECOND)
}

/// Busy and sampled seconds of the GPU engine, and its utilization ratio.
pub fn window_of(text: &str) -> (f64, f64, Option<f64>) {
    let engine = &[("engine", "gpu")];
    (
        value_in(text, "nvidia_gpu_busy_seconds_total", engine).expect("busy"),
        value_in(text, "nvidia_gpu_sampled_seconds_total", engine).expect("sampled"),
        value_in(text, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]),
    )
}

impl Exporter {
    /// One `--stdout` run of `scenario` at the fake clock `clock_us` with the
    /// state directory `state` (read and stored); checks it succeeded and
    /// promtool accepts it, and returns its text.
    pub fn run_at(&self, scenario: &str, state: &Path, clock_us: u64, args: &[&str]) -> String {
        self.run_at_with(scenario, state, clock_us, args, &[])
    }

    /// [`Exporter::run_at`] with the extra environment `env`.
    pub fn run_at_with(
        &self,
        scenario: &str,
        state: &Path,
        clock_us: u64,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> String {
        let clock = clock_us.to_string();
        let mut all_args = vec!["--stdout", "--write-state"];
        all_args.extend_from_slice(args);
        let mut all_env = vec![("FAKE_NVML_CLOCK_US", clock.as_str())];
        all_env.extend_from_slice(env);
        let output = self.run_args(scenario, state, &all_args, &all_env);
        assert_eq!(output.code(), Some(0), "{}", output.err());
        let text = String::from_utf8(output.stdout).unwrap();
        assert_promtool(scenario, &text);
        text
    }

    /// One `--stdout` run without GPM at the fake clock `clock_us` with the
    /// state in `state`, stored; unchecked.
    pub fn stored_run(
        &self,
        scenario: &str,
        state: &Path,
        clock_us: u64,
        args: &[&str],
    ) -> Outcome {
        let mut all = vec!["--stdout", "--write-state", "--gpm-window", "0"];
        all.extend_from_slice(args);
        let clock = clock_us.to_string();
        self.run_args(scenario, state, &all, &[("FAKE_NVML_CLOCK_US", &clock)])
    }
}
