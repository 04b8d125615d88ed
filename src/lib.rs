//! nvidia-textfile-exporter: one NVML snapshot of every GPU, written atomically as
//! a Prometheus textfile for node_exporter.
//!
//! The pipeline, one module per stage:
//! `nvml` (the only code that touches NVML; its `registry` defines the
//! collectors) → `snapshot` (plain data) → `render` (pure function to text) →
//! `publish` (the only code that touches the textfile directory). `watchdog`
//! keeps the run's one deadline and runs `nvml` under it; `procfs` adds process
//! owners; `state` is what one run remembers for the next (its own directory); `reason` and `exit` are the failure reasons and exit statuses;
//! `generate` prints the man page and the tables; `xid` counts XID errors
//! from the kernel log; `main` wires the stages.

pub mod cli;
pub mod exit;
pub mod generate;
pub mod inflight;
pub mod logging;
pub mod metrics;
pub mod nvml;
pub mod procfs;
pub mod publish;
pub mod reason;
pub mod render;
pub mod snapshot;
pub mod state;
pub mod watchdog;
pub mod xid;
