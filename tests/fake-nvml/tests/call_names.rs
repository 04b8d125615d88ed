//! Every NVML call name the NVML layer declares (and so passes to the watchdog
//! and to log lines) is a symbol this fake exports and can fail, delay or hang
//! on (`DEVICE_SYMBOLS`, `SYSTEM_ERROR_SYMBOLS`), or one of the few that read
//! no scenario value (`OTHER_SYMBOLS`: init). A name that matches none would
//! make fault injection for it silently impossible. The collectors name none:
//! they make the layer's declared calls.

use std::fs;
use std::path::Path;

use fake_nvml::scenario::{DEVICE_SYMBOLS, OTHER_SYMBOLS, SYSTEM_ERROR_SYMBOLS};

/// Whether `name` looks like an NVML function's.
fn is_call_name(name: &str) -> bool {
    name.strip_prefix("nvml")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()))
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The string literals in `text` that look like NVML function names, and
/// the functions of its `calls!` declarations (`NAME: nvmlFunction(…)`).
fn call_names(text: &str) -> Vec<&str> {
    let constant = |name: &str| {
        name.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    };
    let declared = text.lines().filter_map(move |line| {
        let (name, rest) = line.trim_start().split_once(": ")?;
        constant(name).then(|| rest.split('(').next())?
    });
    text.split('"')
        .skip(1)
        .step_by(2)
        .chain(declared)
        .filter(|name| is_call_name(name))
        .collect()
}

#[test]
fn every_call_name_in_the_exporter_is_a_symbol_the_fake_knows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("src/watchdog.rs")];
    for entry in fs::read_dir(root.join("crates/nvml/src")).unwrap() {
        files.push(entry.unwrap().path());
    }
    for entry in fs::read_dir(root.join("src/collectors")).unwrap() {
        let file = entry.unwrap().path();
        let text = fs::read_to_string(&file).unwrap();
        assert_eq!(call_names(&text), [] as [&str; 0], "{}", file.display());
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
