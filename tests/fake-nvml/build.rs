//! `FAKE_NVML_HIDE=sym1,sym2` builds a library that does not export those
//! symbols, like an older driver's `libnvidia-ml.so` that predates them:
//! `dlsym` fails for them. A linker version script makes them local; the
//! export code is unchanged. Build it into its own `--target-dir` so it does
//! not replace the complete library (tests/fake-nvml/README.md).

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=FAKE_NVML_HIDE");
    let hide = env::var("FAKE_NVML_HIDE").unwrap_or_default();
    let names: Vec<&str> = hide
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() {
        return;
    }
    let script = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("hide.map");
    fs::write(&script, format!("{{ local: {}; }};\n", names.join("; "))).unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
}
