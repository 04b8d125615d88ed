//! nvidia-textfile-exporter: one NVML snapshot of every GPU, written atomically as
//! a Prometheus textfile for node_exporter.
//!
//! The pipeline, one layer per stage:
//! `nvml` (the NVML session and its error policy, the only code that loads
//! NVML) → `collectors` (the registry and one file per collector, device and
//! host alike; `collectors::gpus` runs their phases) → `snapshot` (plain data)
//! → `render` (pure function to text) → `publish` (the only code that touches
//! the textfile directory). `identity` resolves which GPU is which; `state` is
//! what one run leaves for the next (its own directory); `fsutil` the file
//! primitives `publish` and `state` share; `watchdog` keeps
//! the run's one deadline; `reason` and `exit` are the failure reasons and exit
//! statuses; `generate` prints the man page and the tables; `procfs` tells a
//! process's owner; `main` wires the stages.

// The documentation is for the people who work on this crate: links to private
// items are meant (`cargo doc --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

pub mod cli;
#[forbid(unsafe_code)]
pub mod collector;
#[forbid(unsafe_code)]
pub mod collectors;
pub mod exit;
pub mod fsutil;
pub mod generate;
pub mod identity;
pub mod inflight;
#[forbid(unsafe_code)]
pub mod kernel_log;
pub mod logging;
pub mod metrics;
pub mod nvml;
#[forbid(unsafe_code)]
pub mod phases;
pub mod procfs;
pub mod publish;
pub mod reason;
pub mod render;
pub mod snapshot;
pub mod state;
pub mod timing;
pub mod watchdog;
