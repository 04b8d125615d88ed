//! nvidia-textfile-exporter: one NVML snapshot of every GPU, written atomically as
//! a Prometheus textfile for node_exporter. The pipeline, one layer per stage:
//! the `nvml` crate → `collectors` (over `collector`, run by `phases`) →
//! `snapshot` → `render` → `publish`; the other modules serve them, `app`
//! wires them (docs/design.md, "Architecture"). Public only what the binary,
//! the tests, the benchmark and the capture tool use.
//!
//! No `unsafe` here: NVML's is the `nvml` crate's, and the one C call no safe
//! crate covers is `_exit` in `watchdog::exit_now` (the hard stop).

// Links to private items are meant (`cargo doc --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]
#![deny(unsafe_code)]

mod app;
mod bounded;
mod cli;
mod collector;
mod collectors;
mod compute;
mod exit;
mod facts;
mod fsutil;
mod generate;
mod identity;
mod kernel_log;
mod logging;
pub mod metrics;
mod outcome;
mod owner;
mod phases;
mod procfs;
mod publish;
mod reason;
mod render;
mod samples;
pub mod snapshot;
mod state;
mod task;
mod timing;
mod watchdog;

pub use app::main;
pub use cli::MAX_TIMEOUT;
pub use collectors::families;
pub use publish::Target;
pub use render::render;
pub use timing::{gpm_window, WindowRequest, HARD_STOP_GRACE};

/// What the capture tool (tests/nvml-capture) needs to make the field calls
/// a run makes.
pub mod capture {
    pub use crate::collectors::{field_batches, Collector, ALL};
    pub use crate::facts::GpuFacts;
}
