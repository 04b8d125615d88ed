//! Command-line entry point: parse, run once, map the outcome to an exit status.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use nvidia_textfile_exporter::cli::{Cli, Collector};
use nvidia_textfile_exporter::collector::{collect, Outcome, RunClock};
use nvidia_textfile_exporter::exit::Exit;
use nvidia_textfile_exporter::nvml;
use nvidia_textfile_exporter::procfs::{self, Users};
use nvidia_textfile_exporter::publish::Target;
use nvidia_textfile_exporter::render::render;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Success.into()
            };
        }
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|out, record| {
            writeln!(
                out,
                "nvidia-textfile-exporter: {}: {}",
                record.level().as_str().to_lowercase(),
                record.args()
            )
        })
        .init();
    match run(&cli) {
        Exit::Timeout => exit_without_cleanup(Exit::Timeout),
        exit => exit.into(),
    }
}

/// Ends the process at once, without exit handlers or library destructors.
///
/// After a timeout the NVML thread is still inside a driver call; returning from
/// `main` would run libnvidia-ml's destructors, which can wait for locks that
/// the stuck call holds. The file is already written, so nothing is lost.
fn exit_without_cleanup(exit: Exit) -> ! {
    extern "C" {
        fn _exit(status: i32) -> !;
    }
    let _ = std::io::stdout().flush();
    // SAFETY: _exit(2) only ends the process; every output is flushed above
    // (stderr is unbuffered).
    unsafe { _exit(i32::from(exit.code())) }
}

/// Reads the GPUs and, with the processes collector, who owns their processes.
fn snapshot(cli: &Cli, clock: RunClock) -> Outcome {
    let options = nvml::Options {
        collectors: cli.collectors(),
        parallel: !cli.sequential,
    };
    let mut outcome = collect(&cli.nvml_lib, &options, cli.timeout, clock);
    if options.collectors.contains(&Collector::Processes) {
        procfs::attribute(&mut outcome.snapshot, &cli.procfs, &Users::load());
    }
    outcome
}

fn run(cli: &Cli) -> Exit {
    let clock = RunClock::start();
    if cli.stdout {
        let outcome = snapshot(cli, clock);
        print!("{}", render(&outcome.snapshot));
        return outcome.exit;
    }

    let target = Target::new(&cli.output_dir, &cli.output_file);
    let published_before = target.published_file();
    let lock = match target.lock(Instant::now() + cli.timeout) {
        Ok(lock) => lock,
        Err(error) => {
            log::error!("{error}");
            return Exit::PublishFailed;
        }
    };
    // `lock` stays bound until the end of this function, so the file is
    // published under the lock.
    let mut outcome = match &lock {
        Some(_) => {
            match target.remove_stale_temp_files() {
                Ok(0) => {}
                Ok(n) => log::info!("removed {n} temporary file(s) left by killed runs"),
                Err(error) => log::warn!("{error}"),
            }
            snapshot(cli, RunClock::start())
        }
        None if target.published_file() != published_before => {
            // The other run is alive and published while this one waited: its
            // file is fresh, and a busy error would only overwrite good data.
            log::warn!(
                "another run held {} for {} but published meanwhile; leaving its file",
                target.path().display(),
                humantime::format_duration(cli.timeout)
            );
            return Exit::Busy;
        }
        None => {
            log::error!(
                "another run still holds {} after {} and published nothing meanwhile; \
                 writing reason=\"busy\"",
                target.path().display(),
                humantime::format_duration(cli.timeout)
            );
            clock.failed("busy", Exit::Busy)
        }
    };
    outcome
        .snapshot
        .fill_missing_uuids(&target.previous_uuids());
    if lock.is_none() && target.published_file() != published_before {
        // The holder published after all, while this run prepared its busy file.
        return Exit::Busy;
    }
    match target.publish(&render(&outcome.snapshot)) {
        Ok(()) => outcome.exit,
        Err(error) => {
            log::error!("{error}");
            Exit::PublishFailed
        }
    }
}
