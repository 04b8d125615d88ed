//! Command-line entry point: see the library's `app`.

fn main() -> std::process::ExitCode {
    nvidia_textfile_exporter::main()
}
