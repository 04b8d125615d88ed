//! Command-line entry point: parse, run once, map the outcome to an exit status.
//!
//! The pipeline in one screen: take the deadline, open a publish session (lock,
//! or busy), read NVML under the watchdog, render, publish.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use nvidia_textfile_exporter::cli::Cli;
use nvidia_textfile_exporter::exit::Exit;
use nvidia_textfile_exporter::generate::generate;
use nvidia_textfile_exporter::nvml::{self, registry};
use nvidia_textfile_exporter::procfs::{self, Users};
use nvidia_textfile_exporter::publish::{Published, Session, Target};
use nvidia_textfile_exporter::reason::Reason;
use nvidia_textfile_exporter::render::render;
use nvidia_textfile_exporter::watchdog::{collect, exit_now, Deadline, Outcome};

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
    if let Some(what) = cli.generate {
        return match generate(what, &mut std::io::stdout().lock()) {
            Ok(()) => Exit::Success.into(),
            Err(error) => {
                log::error!("cannot write to standard output: {error}");
                Exit::PublishFailed.into()
            }
        };
    }
    let deadline = Deadline::start(cli.timeout);
    deadline.arm();
    match run(&cli, &deadline) {
        Exit::Timeout => exit_now(Exit::Timeout),
        exit => exit.into(),
    }
}

fn run(cli: &Cli, deadline: &Deadline) -> Exit {
    if cli.stdout {
        let outcome = snapshot(cli, deadline);
        deadline.enter("writing to standard output");
        return match std::io::stdout()
            .lock()
            .write_all(render(&outcome.snapshot).as_bytes())
        {
            Ok(()) => outcome.exit,
            Err(error) => {
                log::error!("cannot write to standard output: {error}");
                Exit::PublishFailed
            }
        };
    }

    let target = Target::new(&cli.output_dir, &cli.output_file);
    deadline.enter("waiting for the lock of the output file");
    let session = match Session::begin(&target, deadline.reading_ends()) {
        Ok(session) => session,
        Err(error) => {
            log::error!("{error}");
            return Exit::PublishFailed;
        }
    };
    let mut outcome = if session.superseded() {
        // Another run published while this one waited (with the lock now or
        // not): its file is fresh, and this run's would only repeat it later or,
        // with what is left of the deadline, replace it with an error.
        log::warn!(
            "another run held {} and published meanwhile; leaving its file",
            target.path().display()
        );
        return Exit::Busy;
    } else if session.holds_lock() {
        snapshot(cli, deadline)
    } else {
        log::error!(
            "another run still holds {} at this run's deadline and published nothing \
             meanwhile; writing reason=\"busy\"\nhint: {}",
            target.path().display(),
            Reason::Busy.hint()
        );
        deadline.failed(Reason::Busy, Exit::Busy)
    };
    deadline.enter("reading the previous file");
    outcome
        .snapshot
        .fill_missing_uuids(&session.previous_identities());
    deadline.enter("writing the output file");
    match session.publish(&render(&outcome.snapshot)) {
        Ok(Published::Written) => outcome.exit,
        Ok(Published::LeftHoldersFile) => Exit::Busy,
        Err(error) => {
            log::error!("{error}");
            Exit::PublishFailed
        }
    }
}

/// Reads the GPUs and, with the processes collector, who owns their processes.
fn snapshot(cli: &Cli, deadline: &Deadline) -> Outcome {
    let options = nvml::Options {
        collectors: cli.collectors(),
        parallel: !cli.sequential,
    };
    deadline.enter("reading NVML");
    let mut outcome = collect(&cli.nvml_lib, &options, deadline);
    if options
        .collectors
        .contains(&registry::by_name("processes").expect("registered"))
    {
        deadline.enter("reading process owners from procfs");
        procfs::attribute(&mut outcome.snapshot, &cli.procfs, &Users::load());
    }
    outcome
}
