//! Command-line entry point: parse, run once, map the outcome to an exit status.
//!
//! The pipeline in one screen: take the deadline, open a publish session (lock,
//! or busy), load the state under its lock, read NVML under the watchdog, store
//! the state, render, publish.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use nvidia_textfile_exporter::cli::Cli;
use nvidia_textfile_exporter::exit::Exit;
use nvidia_textfile_exporter::generate::generate;
use nvidia_textfile_exporter::logging;
use nvidia_textfile_exporter::metrics;
use nvidia_textfile_exporter::nvml;
use nvidia_textfile_exporter::nvml::registry::{self, HostRun};
use nvidia_textfile_exporter::procfs::{self, Users};
use nvidia_textfile_exporter::publish::{write_stdout, Published, Session, Target};
use nvidia_textfile_exporter::reason::Reason;
use nvidia_textfile_exporter::render::render;
use nvidia_textfile_exporter::snapshot::Sample;
use nvidia_textfile_exporter::state::{Memory, StateDir};
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
    if let Err(message) = cli.check() {
        let _ = Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .print();
        return Exit::Usage.into();
    }
    logging::init();
    if let Some(what) = cli.generate {
        return match generate(what, &mut std::io::stdout().lock()) {
            Ok(()) => Exit::Success.into(),
            // `--generate man | head`: the reader has all it wanted.
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Exit::Success.into(),
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
        let dir = StateDir::new(&cli.state_dir);
        let mut memory = if cli.write_state {
            deadline.enter("waiting for the lock of the state");
            Memory::load_to_store(dir, deadline.waiting_ends())
        } else {
            Memory::load(dir)
        };
        let mut outcome = remembered_snapshot(cli, deadline, &mut memory, cli.write_state);
        deadline.enter("writing to standard output");
        deadline.stamp_duration(&mut outcome.snapshot);
        let text = render(&outcome.snapshot);
        return match write_stdout(text.as_bytes(), deadline.end()) {
            Ok(true) => outcome.exit,
            Ok(false) => {
                log::error!(
                    "standard output did not take the metrics within --timeout {}; \
                     the reader got only part of them",
                    humantime::format_duration(cli.timeout)
                );
                Exit::Timeout
            }
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => outcome.exit,
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
        deadline.enter("waiting for the lock of the state");
        let mut memory =
            Memory::load_to_store(StateDir::new(&cli.state_dir), deadline.waiting_ends());
        remembered_snapshot(cli, deadline, &mut memory, true)
    } else {
        log::error!(
            "another run still holds {} at this run's deadline and published nothing \
             meanwhile; writing reason=\"busy\"\nhint: {}",
            target.path().display(),
            Reason::Busy.hint()
        );
        deadline.failed(Reason::Busy, Exit::Busy)
    };
    deadline.enter("writing the output file");
    deadline.stamp_duration(&mut outcome.snapshot);
    match session.publish(&render(&outcome.snapshot)) {
        Ok(Published::Written) => outcome.exit,
        Ok(Published::LeftHoldersFile) => Exit::Busy,
        Err(error) => {
            log::error!("{error}");
            Exit::PublishFailed
        }
    }
}

/// A snapshot read with the previous run's memory: GPUs whose UUID cannot be
/// read get the one this boot confirmed for them, and (with `store`) what this
/// run leaves is stored for the next. The state's health is in the snapshot.
fn remembered_snapshot(
    cli: &Cli,
    deadline: &Deadline,
    memory: &mut Memory,
    store: bool,
) -> Outcome {
    let mut outcome = snapshot(cli, deadline, memory);
    outcome.snapshot.fill_missing_uuids(&memory.known_gpus());
    // Host-level collectors (the kernel log) attribute what they read to the
    // GPUs NVML reported: only after a successful read.
    if outcome.driver_version.is_some() {
        for collector in cli.collectors() {
            deadline.enter(collector.name);
            collector.read_host(&mut HostRun {
                snapshot: &mut outcome.snapshot,
                memory,
                until: deadline.reading_ends(),
                journal_dir: cli.journal_dir.as_deref(),
            });
        }
    }
    if let (true, Some(driver)) = (store, &outcome.driver_version) {
        deadline.enter("storing the state");
        memory.store(&outcome.snapshot.devices, driver);
    }
    let ok = if memory.ok() { 1.0 } else { 0.0 };
    outcome
        .snapshot
        .host
        .push(Sample::new(&metrics::COLLECTOR_STATE_OK, ok));
    outcome
}

/// Reads the GPUs and, with the processes collector, who owns their processes.
fn snapshot(cli: &Cli, deadline: &Deadline, memory: &Memory) -> Outcome {
    let (entries, driver) = memory.entries();
    let options = nvml::Options {
        collectors: cli.collectors(),
        parallel: !cli.sequential,
        memory: entries,
        memory_driver: driver,
        known: memory.known_gpus(),
        gpm: nvml::GpmOptions {
            window: cli.gpm_window(),
            paused: cli.gpm_pause_file.exists(),
            latest_end: None,
        },
    };
    deadline.enter("reading NVML");
    let mut outcome = collect(&cli.nvml_lib, &options, deadline);
    if options
        .collectors
        .contains(&registry::by_name("processes").expect("registered"))
    {
        deadline.enter("reading process owners from procfs");
        procfs::attribute(
            &mut outcome.snapshot,
            &cli.procfs,
            &Users::new(deadline.reading_ends()),
        );
    }
    outcome
}
