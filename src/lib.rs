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

mod allocation;
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
mod hook;
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
mod report;
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

/// What the capture tool (tests/nvml-capture) needs: a run's reads, so that
/// the recorder it sets in the `nvml` crate (`nvml::record`) sees the calls a
/// run makes.
pub mod capture {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::collector::Settings;
    use crate::state::schema::State;
    use crate::timing::{Budget, MAX_TIMEOUT};

    /// Reads every GPU of `library` as a run with every collector on and no
    /// state does (the readings kept once per driver are taken), GPM off; the
    /// readings are dropped.
    pub fn read_every_gpu(library: &Path) -> Result<(), nvml::InitError> {
        let settings = Settings {
            collectors: crate::collectors::ALL.to_vec(),
            parallel: true,
            budget: Budget::new(Instant::now(), MAX_TIMEOUT),
            gpm_window: Duration::ZERO,
            gpm_paused: false,
        };
        let previous = (&State::default(), false);
        crate::phases::read(library, &settings, previous, &Arc::default(), &|| {}).map(drop)
    }
}
