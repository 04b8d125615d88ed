//! nvidia-textfile-exporter: one NVML snapshot of every GPU, written atomically as
//! a Prometheus textfile for node_exporter. The pipeline, one layer per stage:
//! the `nvml` crate → `collectors` (over `collector`, run by `phases`) →
//! `snapshot` → `render` → `publish`; the other modules serve them
//! (docs/design.md, "Architecture").
//!
//! No `unsafe` here: NVML's is the `nvml` crate's, and the one C call no safe
//! crate covers is `_exit` in `watchdog::exit_now` (the hard stop).

// The documentation is for the people who work on this crate: links to private
// items are meant (`cargo doc --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]
#![deny(unsafe_code)]

pub mod bounded;
pub mod cli;
pub mod collector;
pub mod collectors;
pub mod exit;
pub mod facts;
pub mod fsutil;
pub mod generate;
pub mod identity;
pub mod kernel_log;
pub mod logging;
pub mod metrics;
pub mod phases;
pub mod procfs;
pub mod publish;
pub mod reason;
pub mod render;
pub mod samples;
pub mod snapshot;
pub mod state;
pub mod timing;
pub mod watchdog;
