//! What a test reads from a scenario file (tests/scenarios, the fake NVML's
//! TOML) to know what the exporter must report, and edited copies of the
//! shipped scenarios that a test writes.

use std::fs;
use std::path::{Path, PathBuf};

use crate::Exporter;

pub use toml::Table;

/// The scenario file at `path`, parsed.
pub fn load(path: &Path) -> Result<Table, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.parse().map_err(|e| format!("{}: {e}", path.display()))
}

/// A string as the exporter reports it: a byte array (the scenarios' way of
/// writing invalid UTF-8) decoded lossily; empty when absent.
pub fn text(value: Option<&toml::Value>) -> String {
    match value {
        Some(toml::Value::String(s)) => s.clone(),
        Some(toml::Value::Array(a)) => {
            let bytes: Vec<u8> = a
                .iter()
                .filter_map(|b| b.as_integer())
                .map(|b| b as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        _ => String::new(),
    }
}

/// The exports the scenario's library lacks (`missing_symbols`).
pub fn missing_symbols(doc: &Table) -> Vec<String> {
    let list = doc.get("missing_symbols").and_then(|v| v.as_array());
    list.into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// The `[[gpu]]` table of GPU `index`.
pub fn gpu(doc: &Table, index: usize) -> Option<&Table> {
    doc.get("gpu")?.as_array()?.get(index)?.as_table()
}

impl Exporter {
    /// The shipped scenario `base` with `edit` applied to its text, written to
    /// `dir/<name>.toml`.
    pub fn edited(
        &self,
        base: &str,
        dir: &Path,
        name: &str,
        edit: impl FnOnce(String) -> String,
    ) -> PathBuf {
        let path = dir.join(format!("{name}.toml"));
        let text = fs::read_to_string(self.scenario(base)).unwrap();
        fs::write(&path, edit(text)).unwrap();
        path
    }

    /// The shipped scenario `base` with each `(from, to)` replaced (each must
    /// occur), written to `dir/<base>-edited.toml`; its path.
    pub fn replaced(&self, dir: &Path, base: &str, edits: &[(&str, &str)]) -> String {
        let mut text = fs::read_to_string(self.scenario(base)).unwrap();
        for (from, to) in edits {
            assert!(text.contains(from), "{base} lacks {from}");
            text = text.replace(from, to);
        }
        let path = dir.join(format!("{base}-edited.toml"));
        fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// A scenario's text without its second GPU (index 1): what NVML lists after
/// a driver reload without that GPU.
pub fn without_the_second_gpu(text: String) -> String {
    let starts: Vec<usize> = text.match_indices("[[gpu]]\n").map(|(i, _)| i).collect();
    format!("{}{}", &text[..starts[1]], &text[starts[2]..])
}
