//! What the exporter's Rust tests share (tests/cli/ and the fault matrix):
//! - [`exposition`]: the one strict parser of the text format;
//! - [`Exporter`] and [`Run`]: the one way to run the real binary against the
//!   fake NVML, with its own temporary output, state and journal directories;
//! - [`Proc`]: a child process that is killed when dropped;
//! - [`Calls`]: the NVML calls a run made, from the fake's call log;
//! - [`Reader`]: a thread reading the published file without pause;
//! - [`promtool`]: `promtool check metrics` on a text;
//! - [`clock`]: runs at the fake NVML's clock and the utilization window they read;
//! - [`journal`]: journal files with chosen kernel lines, for the xid collector;
//! - [`checks`]: what every published file must be;
//! - [`golden`]: golden files of the output, its per-run values replaced;
//! - [`scenario`]: what a scenario file says the exporter must report, and
//!   edited copies of the shipped ones;
//! - [`library_without`]: a copy of the fake NVML lacking some exports.

mod calls;
pub mod checks;
pub mod clock;
mod elf;
pub mod exposition;
pub mod golden;
pub mod journal;
mod process;
mod reader;
mod run;
pub mod scenario;

pub use calls::Calls;
pub use elf::library_without;
pub use exposition::{
    any_named, gpu_value, lookup, parse, parse_all, parse_bytes, parsed, select, value, value_in,
    Exposition, Samples, Series,
};
pub use process::{kill_all, Proc};
pub use reader::{Reader, ReaderStats};
pub use run::{Exporter, Outcome, Run, Started, LOCK_FILE, OUT_FILE};

use std::io::Write;
use std::process::{Command, Stdio};

/// `promtool check metrics` on `text`: `Err` with what it said unless it
/// succeeded and printed nothing.
pub fn promtool(text: &[u8]) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool (Debian package prometheus): {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    // A write error means promtool exited early; its output says why.
    let _ = stdin.write_all(text);
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let said = String::from_utf8_lossy(&[out.stdout, out.stderr].concat())
        .trim()
        .to_string();
    match (out.status.success(), said.is_empty()) {
        (true, true) => Ok(()),
        (_, false) => Err(said),
        (false, true) => Err(format!("promtool {}", out.status)),
    }
}

/// Asserts that `promtool check metrics` on `text` prints nothing and succeeds.
pub fn assert_promtool(case: &str, text: &str) {
    if let Err(said) = promtool(text.as_bytes()) {
        panic!("{case}: promtool: {said}");
    }
}

/// The pid in a temporary file's name `.nvidia_gpu.prom.<pid>.<random>.tmp`.
pub fn temp_pid(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix(".nvidia_gpu.prom.")?
        .strip_suffix(".tmp")?;
    let (pid, random) = rest.split_once('.')?;
    let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (digits && !random.is_empty() && !random.contains('.')).then(|| pid.parse().ok())?
}

/// The exporter's temporary files in `dir`, sorted.
pub fn temp_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.retain(|n| temp_pid(n).is_some());
    names.sort();
    names
}
