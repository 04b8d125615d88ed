//! A fake `libnvidia-ml.so` for testing programs that use NVML.
//!
//! Built as a cdylib, it exports the NVML entry points listed in
//! [`scenario::all_symbols`] with NVML's C signatures. `nvmlInit_v2` /
//! `nvmlInitWithFlags` read a TOML scenario from the file named by the
//! `FAKE_NVML_SCENARIO` environment variable; every later call answers from
//! it (see README.md for the schema and the precedence of hangs, delays,
//! errors and lost GPUs).
//!
//! All exports are thread-safe and never unwind: a panic answers
//! `NVML_ERROR_UNKNOWN`.

pub mod exports;
pub mod ffi;
pub mod scenario;
pub mod state;

pub use scenario::{parse, Scenario};
pub use state::{CALL_LOG_ENV, FAULTS_ENV, SCENARIO_ENV};

#[cfg(test)]
mod tests;
