//! Generates the man page from the same clap definition the binary uses, into
//! `$OUT_DIR/nvidia-textfile-exporter.1`. No build date is written, so the page
//! is reproducible.

use std::path::PathBuf;

#[allow(dead_code)]
#[path = "src/cli.rs"]
mod cli;

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=src/cli.rs");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let command = <cli::Cli as clap::CommandFactory>::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .section("1")
        .manual("User Commands")
        .render(&mut page)?;
    std::fs::write(out_dir.join("nvidia-textfile-exporter.1"), page)
}
