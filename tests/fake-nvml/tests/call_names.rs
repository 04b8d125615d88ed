//! Every NVML call name the exporter's sources pass to the reader (and so to
//! the watchdog and to log lines) is a symbol this fake exports and can fail,
//! delay or hang on (`DEVICE_SYMBOLS`, `SYSTEM_ERROR_SYMBOLS`), or one of the few
//! that read no scenario value (`OTHER_SYMBOLS`: init). A name that matches none
//! would make fault injection for it silently impossible.

use std::fs;
use std::path::Path;

use fake_nvml::scenario::{DEVICE_SYMBOLS, OTHER_SYMBOLS, SYSTEM_ERROR_SYMBOLS};

/// The string literals in `text` that look like NVML function names.
fn call_names(text: &str) -> Vec<&str> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.strip_prefix("nvml")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()))
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
        .collect()
}

#[test]
fn every_call_name_in_the_exporter_is_a_symbol_the_fake_knows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../src");
    let mut files = vec![src.join("watchdog.rs")];
    for dir in ["nvml", "collectors"] {
        for entry in fs::read_dir(src.join(dir)).unwrap() {
            files.push(entry.unwrap().path());
        }
    }
    let mut checked = 0;
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for name in call_names(&text) {
            let known = [DEVICE_SYMBOLS, SYSTEM_ERROR_SYMBOLS, OTHER_SYMBOLS]
                .iter()
                .any(|symbols| symbols.contains(&name));
            assert!(
                known,
                "{}: {name} is not a symbol the fake can inject faults into",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked > 50,
        "only {checked} call names found: has the layout changed?"
    );
}
