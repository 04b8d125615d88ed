//! nvidia-textfile-exporter: one NVML snapshot of every GPU, written atomically as
//! a Prometheus textfile for node_exporter. The pipeline, one layer per stage:
//! `nvml` → `collectors` (over `collector`, run by `phases`) → `snapshot` →
//! `render` → `publish`; the other modules serve them (docs/design.md,
//! "Architecture").

// The documentation is for the people who work on this crate: links to private
// items are meant (`cargo doc --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

#[forbid(unsafe_code)]
pub mod bounded;
#[forbid(unsafe_code)]
pub mod cli;
#[forbid(unsafe_code)]
pub mod collector;
#[forbid(unsafe_code)]
pub mod collectors;
#[forbid(unsafe_code)]
pub mod exit;
#[forbid(unsafe_code)]
pub mod fsutil;
#[forbid(unsafe_code)]
pub mod generate;
#[forbid(unsafe_code)]
pub mod identity;
#[forbid(unsafe_code)]
pub mod inflight;
#[forbid(unsafe_code)]
pub mod kernel_log;
#[forbid(unsafe_code)]
pub mod logging;
#[forbid(unsafe_code)]
pub mod metrics;
pub mod nvml;
#[forbid(unsafe_code)]
pub mod phases;
#[forbid(unsafe_code)]
pub mod procfs;
#[forbid(unsafe_code)]
pub mod publish;
#[forbid(unsafe_code)]
pub mod reason;
#[forbid(unsafe_code)]
pub mod render;
#[forbid(unsafe_code)]
pub mod snapshot;
#[forbid(unsafe_code)]
pub mod state;
#[forbid(unsafe_code)]
pub mod timing;
#[deny(unsafe_code)]
pub mod watchdog;
