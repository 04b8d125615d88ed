//! What a test reads from a scenario file (tests/scenarios, the fake NVML's
//! TOML) to know what the exporter must report.

use std::path::Path;

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
