//! nvidia-textfile-exporter: one NVML snapshot of every GPU, written atomically as
//! a Prometheus textfile for node_exporter. The pipeline, one layer per stage:
//! `nvml` → `collectors` (over `collector`, run by `phases`) → `snapshot` →
//! `render` → `publish`; the other modules serve them (docs/design.md,
//! "Architecture").

// The documentation is for the people who work on this crate: links to private
// items are meant (`cargo doc --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

pub mod bounded;
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
