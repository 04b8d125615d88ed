//! The command line's run: take the deadline, begin publishing (lock, or
//! busy), load the state, read the GPUs under the watchdog, run the host steps,
//! store the state, render, publish; map the outcome to an exit status.

use std::process::ExitCode;
use std::time::Instant;

use clap::{CommandFactory, Parser};

use crate::cli::Cli;
use crate::collectors::HostRun;
use crate::exit::Exit;
use crate::generate::generate;
use crate::hook;
use crate::logging;
use crate::metrics;
use crate::outcome::Outcome;
use crate::owner::Owners;
use crate::phases;
use crate::publish::{write_stdout, Published, Publisher, Target};
use crate::reason::Reason;
use crate::render::render;
use crate::report;
use crate::state::{StateDir, StateFile};
use crate::watchdog::{collect, exit_now, Deadline};

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
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
        let written = generate(what, &mut std::io::stdout().lock());
        return written
            .map_or_else(|e| stdout_failed(e, Exit::Success), |()| Exit::Success)
            .into();
    }
    if let Some(hook) = cli.slurm_hook {
        hook::run(
            hook,
            &cli.nvml_lib,
            cli.timeout,
            &cli.slurm_hook_dir,
            &cli.cgroupfs,
        );
        return Exit::Success.into();
    }
    if let Some(job_id) = &cli.job_report {
        return report::print(job_id, &cli.state_dir, &cli.slurm_hook_dir).into();
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
        let mut outcome = snapshot_with_state(cli, deadline, cli.write_state);
        deadline.enter("writing to standard output");
        outcome.stamp_duration(&deadline.budget);
        let text = render(&outcome.snapshot);
        return match write_stdout(text.as_bytes(), deadline.budget.end) {
            Ok(true) => outcome.exit,
            Ok(false) => {
                log::error!(
                    "standard output did not take the metrics within --timeout {}; \
                     the reader got only part of them",
                    humantime::format_duration(cli.timeout)
                );
                Exit::Timeout
            }
            Err(error) => stdout_failed(error, outcome.exit),
        };
    }

    let target = Target::new(&cli.output_dir, &cli.output_file);
    deadline.enter("waiting for the lock of the output file");
    let publisher = match Publisher::begin(&target, deadline.budget.gpus_end) {
        Ok(publisher) => publisher,
        Err(error) => return publish_failed(error),
    };
    let mut outcome = if publisher.superseded() {
        // Another run published while this one waited: its file is fresh, and
        // this run's would repeat it later or replace it with an error.
        log::warn!(
            "another run held {} and published meanwhile; leaving its file",
            target.path().display()
        );
        return Exit::Busy;
    } else if publisher.holds_lock() {
        snapshot_with_state(cli, deadline, true)
    } else {
        log::error!(
            "another run still holds {} at this run's deadline and published nothing \
             meanwhile; writing reason=\"busy\"\nhint: {}",
            target.path().display(),
            Reason::Busy.hint()
        );
        Outcome::failed(Reason::Busy, Exit::Busy, &deadline.budget)
    };
    deadline.enter("writing the output file");
    outcome.stamp_duration(&deadline.budget);
    match publisher.publish(&render(&outcome.snapshot)) {
        Ok(Published::Written) => outcome.exit,
        Ok(Published::LeftHoldersFile) => Exit::Busy,
        Err(error) => publish_failed(error),
    }
}

fn publish_failed(error: impl std::fmt::Display) -> Exit {
    log::error!("{error}");
    Exit::PublishFailed
}

/// What a failed write to standard output makes of a run that would exit
/// `exit`: a closed pipe (`| head`) is a reader that has all it wanted.
fn stdout_failed(error: std::io::Error, exit: Exit) -> Exit {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        return exit;
    }
    publish_failed(format_args!("cannot write to standard output: {error}"))
}

/// A snapshot read with the previous run's state and the host steps run over
/// it; with `store`, the state is stored for the next run.
fn snapshot_with_state(cli: &Cli, deadline: &Deadline, store: bool) -> Outcome {
    deadline.enter(match store {
        true => "waiting for the lock of the state",
        false => "reading the state",
    });
    let dir = StateDir::new(&cli.state_dir);
    let state = &mut StateFile::open(dir, deadline.budget.halfway(Instant::now()), store);
    let settings = cli.settings(deadline.budget);
    let (previous, totals) = (state.previous().clone(), state.continues_totals());
    let library = cli.nvml_lib.clone();
    let reading_settings = settings.clone();
    deadline.enter("reading NVML");
    let collected = collect(
        move |inflight, opened| {
            phases::read(
                &library,
                &reading_settings,
                (&previous, totals),
                inflight,
                opened,
            )
        },
        &deadline.budget,
    );
    let mut outcome = Outcome::of(collected, &deadline.budget);
    // Host steps work on the GPUs NVML reported, until the end of reading,
    // which a hung GPU cannot take (`timing`). Where NVML could not be read
    // (not loaded, hung), those that need nothing of it (the kernel log's
    // XIDs, which may say why) work on the GPUs the state knows of this boot.
    let nvml_read = outcome.driver_version.is_some();
    let inputs = cli.host_inputs();
    if nvml_read || outcome.with_known_gpus(state) {
        phases::run_host(
            &settings.collectors,
            &mut HostRun {
                snapshot: &mut outcome.snapshot,
                state,
                until: deadline.budget.host_end,
                inputs: &inputs,
                owners: &mut Owners::new(
                    &inputs.procfs,
                    &inputs.pod_logs,
                    &inputs.container_logs,
                    deadline.budget.host_end,
                ),
                states: &mut outcome.states,
                succeeded: Vec::new(),
            },
            nvml_read,
            &|phase| deadline.enter(phase),
        );
    }
    if let (true, Some(driver)) = (store, &outcome.driver_version) {
        deadline.enter("storing the state");
        let (devices, states) = (&outcome.snapshot.devices, &outcome.states);
        state.store(devices, states, driver, deadline.budget.storing_end);
    }
    let state_ok = metrics::COLLECTOR_STATE_OK.sample(if state.ok() { 1.0 } else { 0.0 });
    outcome.snapshot.host.push(state_ok);
    outcome
}
