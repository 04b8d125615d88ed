//! nvidia-textfile-exporter: one NVML snapshot of every GPU, written atomically as
//! a Prometheus textfile for node_exporter.
//!
//! The pipeline, one module per stage:
//! `nvml` (the only code that touches NVML) → `snapshot` (plain data) →
//! `render` (pure function to text) → `publish` (the only code that touches the
//! textfile directory). `collector` runs `nvml` under a watchdog and adds the
//! collector's own metrics; `procfs` adds process owners; `main` wires the stages
//! together.

pub mod cli;
pub mod collector;
pub mod exit;
pub mod inflight;
pub mod metrics;
pub mod nvml;
pub mod procfs;
pub mod publish;
pub mod render;
pub mod snapshot;
