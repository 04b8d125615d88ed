//! The phases of a run over the registry's hooks: identities (resolved by
//! [`identity::resolve`]), then per GPU every `open`, the batched field read
//! and every `read`, every window's close; then every `host` step. Each GPU
//! reads on a thread of its own (one for all with `--sequential`); a GPU not
//! done by `gpus_end` is down (`timeout`) and its thread abandoned. The
//! reads' and closes' times are kept in the state for the next run's plan.

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nvml::types::Device as NvmlDevice;
use nvml::{DeviceReader, InFlight, InitError, Scope, Session};

use crate::bounded::{Threads, Waiting};
use crate::collector::{down, Collector, Finished, Gpu, HostRun, Settings, Window};
use crate::collectors;
use crate::identity::{self, Identity};
use crate::metrics;
use crate::reason::Reason;
use crate::snapshot::{KnownGpu, Sample};
use crate::state::schema::{GpuState, State};
use crate::timing;

/// What a successful read produced.
#[derive(Debug)]
pub struct Reading {
    /// Host-wide samples (driver versions).
    pub host: Vec<Sample>,
    /// The driver version, empty if it could not be read.
    pub driver_version: String,
    /// One entry per GPU in index order, then the GPUs that left enumeration.
    pub devices: Vec<Finished>,
    /// A GPU did not answer by the deadline (it is down, reason `timeout`).
    pub timed_out: bool,
}

/// What a reading thread tells the coordinator: where one of its GPUs is now.
type Report = (u32, Slot);

/// What a GPU's thread needs, once the identities are resolved.
#[derive(Clone)]
struct Start {
    identity: Identity,
    state: GpuState,
    keeps_totals: bool,
}

/// Where one GPU is, as far as the coordinator knows.
enum Slot {
    /// Its identity is being read.
    Identifying,
    /// Its identity read (empty where it failed); its reads have not started.
    Identified(identity::Read),
    /// Its reads started; how long they took once they ended (its windows' close follows).
    Reading(Option<Duration>),
    /// Its readings.
    Read(Box<Finished>),
    /// Down without readings of its own, why; its identity read, if it came.
    Down(Reason, Option<identity::Read>),
}

/// Reads every GPU with the `previous` state (its running totals continue if
/// `totals`), calling `opened` once NVML is open; from then on it returns by
/// `settings.budget.gpus_end`, whatever the GPUs do.
pub fn read(
    library: &Path,
    settings: &Settings,
    (previous, totals): (&State, bool),
    inflight: &Arc<InFlight>,
    opened: &dyn Fn(),
) -> Result<Reading, InitError> {
    // Threads stuck in a call may outlive this function, so the session does.
    let session: &'static Session = Box::leak(Box::new(Session::open(library, inflight)?));
    let opened_at = Instant::now();
    opened();
    let states = states_for(previous, &session.versions.driver);
    let mut slots: Vec<Slot> = (0..session.count).map(|_| Slot::Identifying).collect();
    let (starts, waits): (Vec<_>, Vec<_>) = (0..session.count).map(|_| mpsc::channel()).unzip();
    let reports = spawn_readers(session, settings, inflight, waits, &mut slots);
    let (started, missing) = identify(
        &reports, &mut slots, starts, &states, totals, settings, inflight,
    );
    let gpus_end = settings.budget.gpus_end;
    receive(&reports, &mut slots, gpus_end, Slot::settled);
    let (mut devices, timeouts): (Vec<Finished>, Vec<bool>) = (0..)
        .zip(slots)
        .zip(started)
        .map(|((index, slot), start)| slot.into_device(index, start, settings, inflight, opened_at))
        .unzip();
    devices.extend(missing.into_iter().map(|gone| departed(gone, &states)));
    // A version NVML cannot tell is an empty label.
    let versions = &session.versions;
    let labels = [&versions.driver, &versions.cuda, &versions.nvml].map(Clone::clone);
    Ok(Reading {
        host: vec![metrics::DRIVER_INFO.sample_with(labels, 1.0)],
        driver_version: versions.driver.clone(),
        devices,
        timed_out: timeouts.contains(&true),
    })
}

/// Phase 1: awaits the identities until the budget's `halfway`, resolves them and
/// starts each GPU's reads; returns the starts and the GPUs that left.
fn identify(
    reports: &Waiting<Report>,
    slots: &mut [Slot],
    starts: Vec<Sender<Start>>,
    states: &BTreeMap<String, GpuState>,
    totals: bool,
    settings: &Settings,
    inflight: &InFlight,
) -> (Vec<Start>, Vec<KnownGpu>) {
    let identities_end = settings.budget.halfway(Instant::now());
    let identified = |slot: &Slot| !matches!(slot, Slot::Identifying);
    receive(reports, slots, identities_end, identified);
    let reads: Vec<identity::Read> = (0..)
        .zip(slots.iter_mut())
        .map(|(index, slot)| match slot {
            Slot::Identified(read) | Slot::Down(_, Some(read)) => read.clone(),
            Slot::Identifying => {
                stuck(index, "its identity reads", settings, inflight);
                *slot = Slot::Down(Reason::Timeout, None);
                identity::Read::unread(index)
            }
            _ => identity::Read::unread(index), // down before its identity came
        })
        .collect();
    let known: Vec<KnownGpu> = (states.iter())
        .map(|(uuid, gpu)| KnownGpu {
            index: gpu.index,
            uuid: uuid.clone(),
            pci_bus_id: gpu.pci_bus_id.clone(),
            serial: gpu.serial.clone(),
        })
        .collect();
    let resolution = identity::resolve(&reads, &known);
    let mut started = Vec::with_capacity(slots.len());
    for ((slot, identity), sender) in slots.iter().zip(resolution.identities).zip(starts) {
        // What is kept under a UUID two GPUs share is neither's.
        let state = states.get(&identity.uuid).filter(|_| identity.unique);
        let start = Start {
            state: state.cloned().unwrap_or_default(),
            keeps_totals: totals && identity.unique,
            identity,
        };
        if !slot.settled() {
            let _ = sender.send(start.clone());
        }
        started.push(start);
    }
    (started, resolution.missing)
}

impl Slot {
    fn settled(&self) -> bool {
        matches!(self, Slot::Read(_) | Slot::Down(..))
    }

    /// Phase 3: the GPU's readings, or it down; whether it timed out.
    fn into_device(
        self,
        index: u32,
        start: Start,
        settings: &Settings,
        inflight: &InFlight,
        opened: Instant,
    ) -> (Finished, bool) {
        let mut state = start.state;
        let stuck_in = match self {
            Slot::Read(finished) => return (*finished, false),
            // Its identity reads timed out: its reads never started.
            Slot::Down(Reason::Timeout, _) => None,
            Slot::Down(reason, _) => {
                return (down(index, &start.identity, reason, None).into(), false)
            }
            Slot::Reading(took) => {
                // The phase the deadline cut keeps all the run's time (`timing::cut`).
                let cut = micros(timing::cut(opened, settings.budget.gpus_end));
                match took {
                    None => state.reads_us = cut,
                    Some(took) => (state.reads_us, state.closing_us) = (micros(took), cut),
                }
                stuck(index, "its reads", settings, inflight)
            }
            // Its reads not reached (behind another GPU's call): nothing learnt.
            _ => stuck(index, "its reads", settings, inflight),
        };
        let device = down(index, &start.identity, Reason::Timeout, stuck_in);
        let state = Some(state);
        (Finished { device, state }, true)
    }
}

/// Takes the threads' reports until every slot is `done` or `until` came.
fn receive(
    reports: &Waiting<Report>,
    slots: &mut [Slot],
    until: Instant,
    done: impl Fn(&Slot) -> bool,
) {
    while !slots.iter().all(&done) {
        let Ok((index, next)) = reports.next_by(until) else {
            return;
        };
        let slot = &mut slots[index as usize];
        *slot = match (std::mem::replace(slot, Slot::Identifying), next) {
            // Settled stays so (a GPU whose identity reads timed out goes on).
            (settled @ (Slot::Read(_) | Slot::Down(..)), _) => settled,
            // What is down keeps the identity read that came before.
            (Slot::Identified(read), Slot::Down(why, None)) => Slot::Down(why, Some(read)),
            (_, next) => next,
        };
    }
}

/// Logs that GPU `index` did not finish `what` by its deadline, and why.
fn stuck(index: u32, what: &str, settings: &Settings, inflight: &InFlight) -> Option<&'static str> {
    let stuck_in = inflight.call_of(Scope::Gpu(index));
    let call = match stuck_in {
        Some(call) => format!("stuck in {call}"),
        None if !settings.parallel => "behind another GPU's call (--sequential)".to_owned(),
        None => "between NVML calls".to_owned(),
    };
    log::error!(
        "GPU {index} did not finish {what} by the deadline, {call}; reporting it down \
         (reason=\"timeout\"), the other GPUs as read\nhint: {}",
        Reason::Timeout.hint()
    );
    stuck_in
}

/// A GPU this boot knew that NVML no longer enumerates: down, its state kept.
fn departed(gone: KnownGpu, states: &BTreeMap<String, GpuState>) -> Finished {
    let mut state = states.get(&gone.uuid).cloned().unwrap_or_default();
    // Said once, when it leaves; the file says it every run.
    if !std::mem::replace(&mut state.left_enumeration, true) {
        log::warn!(
            "GPU {} ({}, {}) is no longer enumerated by NVML; reporting it down",
            gone.index,
            gone.uuid,
            gone.pci_bus_id
        );
    }
    let identity = Identity {
        uuid: gone.uuid,
        pci_bus_id: gone.pci_bus_id,
        serial: gone.serial,
        unique: true,
    };
    let device = down(gone.index, &identity, Reason::NotEnumerated, None);
    let state = Some(state);
    Finished { device, state }
}

/// Starts the reading threads, whose reports it returns; a GPU whose thread
/// cannot start is down (`exporter_resources`).
fn spawn_readers(
    session: &'static Session,
    settings: &Settings,
    inflight: &Arc<InFlight>,
    waits: Vec<Receiver<Start>>,
    slots: &mut [Slot],
) -> Waiting<Report> {
    let readers = Threads::default();
    let gpus: Vec<(u32, Receiver<Start>)> = (0..).zip(waits).collect();
    let groups: Vec<Vec<(u32, Receiver<Start>)>> = if settings.parallel {
        gpus.into_iter().map(|gpu| vec![gpu]).collect()
    } else {
        vec![gpus]
    };
    for group in groups.into_iter().filter(|group| !group.is_empty()) {
        let indices: Vec<u32> = group.iter().map(|(index, _)| *index).collect();
        let name = if settings.parallel {
            format!("gpu{}", indices[0])
        } else {
            "gpus".to_owned()
        };
        let (settings, inflight) = (settings.clone(), Arc::clone(inflight));
        let panicked = indices.clone();
        let spawned = readers.spawn(&name, move |report| {
            let reading = panic::catch_unwind(AssertUnwindSafe(|| {
                read_group(session, group, &settings, &inflight, &report)
            }));
            if reading.is_err() {
                for index in panicked {
                    let _ = report.send((index, Slot::Down(Reason::ExporterBug, None)));
                }
            }
        });
        if let Err(e) = spawned {
            log::warn!("GPU {indices:?}: cannot start a reading thread: {e}");
            for index in indices {
                slots[index as usize] = Slot::Down(Reason::ExporterResources, None);
            }
        }
    }
    readers.waiting()
}

/// Reads the GPUs of `group` on this thread: identities, then each once started.
fn read_group(
    session: &'static Session,
    group: Vec<(u32, Receiver<Start>)>,
    settings: &Settings,
    inflight: &InFlight,
    report: &Sender<Report>,
) {
    let handles: Vec<Result<NvmlDevice<'static>, Reason>> = group
        .iter()
        .map(|(index, _)| session.handle(*index, inflight).map_err(Reason::from))
        .collect();
    let mut identified = Vec::with_capacity(group.len());
    for ((index, start), handle) in group.into_iter().zip(&handles) {
        let (reader, read) = match handle {
            Ok(device) => {
                let mut reader = Gpu::new(DeviceReader::new(device, index, inflight));
                let read = collectors::identify(&mut reader);
                (Ok(reader), read)
            }
            Err(why) => (Err(*why), identity::Read::unread(index)),
        };
        let _ = report.send((index, Slot::Identified(read)));
        identified.push((index, reader, start));
    }
    let mut ready = Vec::with_capacity(identified.len());
    for (index, reader, start) in identified {
        // No start: the deadline came first; nothing of this GPU is wanted.
        let Ok(start) = start.recv() else { continue };
        match open(index, reader, start, settings) {
            Ok(gpu) => ready.push(gpu),
            Err(down) => drop(report.send((index, Slot::Read(down)))),
        }
    }
    let windows_end = ready.iter().filter_map(|gpu| gpu.windows_end).min();
    let estimates: Vec<timing::Estimate> = ready.iter().map(|gpu| gpu.estimate).collect();
    let plan = timing::schedule(
        Instant::now(),
        settings.budget.gpus_end,
        windows_end,
        &estimates,
    );
    // The windows shortened to end by their plan's latest end.
    for (gpu, &latest) in ready.iter_mut().zip(&plan.windows_end_by) {
        for window in &mut gpu.windows {
            window.end_by(latest);
        }
        gpu.windows_end = gpu.windows.iter().map(|w| w.ends()).min();
    }
    if let Some(start) = plan.reads_start {
        thread::sleep(start.saturating_duration_since(Instant::now()));
    }
    for mut gpu in ready {
        let index = gpu.reader.index();
        let _ = report.send((index, Slot::Reading(None)));
        let took = gpu.read(&settings.collectors);
        let _ = report.send((index, Slot::Reading(Some(took))));
        let _ = report.send((index, Slot::Read(Box::new(gpu.close()))));
    }
}

/// The GPUs' previous state as this driver may use it (after a driver
/// change, only the identities and the boot's running totals).
fn states_for(previous: &State, driver_version: &str) -> BTreeMap<String, GpuState> {
    if previous.driver_version == driver_version {
        return previous.gpus.clone();
    }
    if !previous.gpus.is_empty() {
        log::info!(
            "the driver changed ({} -> {driver_version}): using only the boot's running \
             totals of the previous run's state",
            previous.driver_version
        );
    }
    previous
        .gpus
        .iter()
        .map(|(uuid, gpu)| (uuid.clone(), gpu.after_driver_change()))
        .collect()
}

/// A GPU whose windows are open.
struct Opened<'n> {
    reader: Gpu<'n>,
    identity: Identity,
    windows: Vec<Box<dyn Window<'n> + 'n>>,
    /// When the first window ends, if one is open.
    windows_end: Option<Instant>,
    /// How long the reads and the windows' close are expected to take.
    estimate: timing::Estimate,
    /// When the reads started and ended, once they ran.
    reads: Option<(Instant, Instant)>,
}

/// Phase 2a: GPU `index`'s previous state, every collector's window opened
/// and, where one is, the early reads taken.
fn open<'n>(
    index: u32,
    reader: Result<Gpu<'n>, Reason>,
    start: Start,
    settings: &Settings,
) -> Result<Opened<'n>, Box<Finished>> {
    let unopened = |why| Box::new(Finished::from(down(index, &start.identity, why, None)));
    let mut reader = reader.map_err(unopened)?;
    reader.resume(start.state, start.keeps_totals);
    let windows: Vec<_> = settings
        .collectors
        .iter()
        .filter_map(|c| c.hooks.open.and_then(|open| open(&mut reader, settings)))
        .collect();
    if !windows.is_empty() {
        for early in settings.collectors.iter().filter_map(|c| c.hooks.early) {
            early(&mut reader);
        }
    }
    let windows_end = windows.iter().map(|w| w.ends()).min();
    let previous = reader.previous_state();
    let estimate = timing::Estimate::new(
        previous.reads_us.map(Duration::from_micros),
        previous.closing_us.map(Duration::from_micros),
        !windows.is_empty(),
    );
    Ok(Opened {
        reader,
        identity: start.identity,
        windows,
        windows_end,
        estimate,
        reads: None,
    })
}

impl Opened<'_> {
    /// Phase 2b: the batched field read and every `read`; how long they took.
    fn read(&mut self, collectors: &[&'static Collector]) -> Duration {
        let started = Instant::now();
        let reader = &mut self.reader;
        let facts = reader.facts().clone();
        let mut fields: Vec<u32> = collectors
            .iter()
            .flat_map(|collector| collector.fields(&facts))
            .collect();
        // Collectors may share a field (the NVLink link count): ask for it once.
        fields.sort_unstable();
        fields.dedup();
        if !fields.is_empty() {
            reader.nvml.prefetch(&fields);
        }
        for read in collectors.iter().filter_map(|c| c.hooks.read) {
            read(reader);
        }
        let ended = Instant::now();
        reader.next_state().reads_us = micros(ended - started);
        self.reads = Some((started, ended));
        ended - started
    }

    /// Phase 2c: closes the windows, keeping how long that took from their end.
    fn close(mut self) -> Finished {
        let had_windows = !self.windows.is_empty();
        let ended = self.windows_end.map(|end| end.max(Instant::now()));
        for window in self.windows {
            window.close(&mut self.reader);
        }
        let closed = Instant::now();
        self.reader.next_state().closing_us = ended.and_then(|ended| micros(closed - ended));
        if let (true, Some((started, ended))) = (had_windows, self.reads) {
            log::debug!(
                "GPU {}: point readings taken from {} ms to {} ms before the windows closed",
                self.reader.index(),
                (closed - started).as_millis(),
                (closed - ended).as_millis()
            );
        }
        self.reader.finish(&self.identity)
    }
}

/// `duration` in whole µs, as the state keeps it.
fn micros(duration: Duration) -> Option<u64> {
    u64::try_from(duration.as_micros()).ok()
}

/// Runs every collector's host step in registry order (only those that
/// need nothing of NVML where `nvml_read` is false), each with its
/// `nvidia_gpu_collector_success` and `_step_duration_seconds` samples.
pub fn run_host(
    collectors: &[&'static Collector],
    run: &mut HostRun<'_>,
    nvml_read: bool,
    enter: &dyn Fn(&'static str),
) {
    let runnable = |c: &&Collector| nvml_read || c.hooks.host_without_nvml;
    for collector in in_needed_order(collectors).into_iter().filter(runnable) {
        let Some(host) = collector.hooks.host else {
            continue;
        };
        enter(collector.name);
        let started = Instant::now();
        let outcome = host(run);
        match &outcome {
            Ok(()) => run.succeeded.push(collector.name),
            // The step logs its own failures (once, not every run).
            Err(why) => log::debug!("collector {}: {why}", collector.name),
        }
        let labels = [collector.name];
        run.snapshot.host.extend([
            metrics::COLLECTOR_SUCCESS.sample_with(labels, f64::from(u8::from(outcome.is_ok()))),
            metrics::COLLECTOR_STEP_DURATION.sample_with(labels, started.elapsed().as_secs_f64()),
        ]);
    }
}

/// `collectors`, each after the ones it needs (`Hooks::needs`) where they
/// are among them; otherwise in their order.
fn in_needed_order(collectors: &[&'static Collector]) -> Vec<&'static Collector> {
    let mut left = collectors.to_vec();
    let mut ordered = Vec::with_capacity(left.len());
    while !left.is_empty() {
        let waiting = |need: &&str| left.iter().any(|l| l.name == *need);
        // A need that is never met (a cycle) does not hold the rest back.
        let next = (left.iter())
            .position(|c| !c.hooks.needs.iter().any(waiting))
            .unwrap_or(0);
        ordered.push(left.remove(next));
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step runs after the steps it needs, whatever the registry's order;
    /// the others keep theirs.
    #[test]
    fn a_host_step_runs_after_the_steps_it_needs() {
        let find = |name: &str| {
            *crate::collectors::ALL
                .iter()
                .find(|c| c.name == name)
                .unwrap()
        };
        let (tasks, xid, processes) = (find("tasks"), find("xid"), find("processes"));
        assert_eq!(tasks.hooks.needs, ["xid"]);
        for given in [
            [tasks, xid, processes],
            [processes, tasks, xid],
            [xid, processes, tasks],
        ] {
            let names: Vec<&str> = in_needed_order(&given).iter().map(|c| c.name).collect();
            let at = |name| names.iter().position(|n| *n == name).unwrap();
            assert!(at("xid") < at("tasks"), "{names:?}");
            assert_eq!(names.len(), 3);
        }
        let alone: Vec<&str> = in_needed_order(&[tasks]).iter().map(|c| c.name).collect();
        assert_eq!(alone, ["tasks"]);
    }

    /// A GPU's slot after its thread reported: down keeps the identity read
    /// that came before; a settled slot (read, or down when its identity
    /// timed out) ignores what its thread says later.
    #[test]
    fn a_report_moves_a_slot_and_a_settled_slot_stays() {
        let read = identity::Read {
            uuid: "GPU-0".into(),
            ..identity::Read::unread(0)
        };
        let mut slots = vec![
            Slot::Identified(read.clone()),
            Slot::Identifying,
            Slot::Down(Reason::Timeout, None),
            Slot::Read(Box::default()),
            Slot::Identified(identity::Read::unread(4)),
        ];
        let bug = || Slot::Down(Reason::ExporterBug, None);
        let reports = [
            (0, bug()),
            (1, bug()),
            (2, Slot::Identified(identity::Read::unread(2))),
            (2, Slot::Reading(None)),
            (3, bug()),
            (4, Slot::Reading(None)),
            (4, Slot::Reading(Some(Duration::from_millis(7)))),
        ];
        let threads = Threads::default();
        let sent = threads.spawn("test", move |report| {
            reports.into_iter().for_each(|r| drop(report.send(r)));
        });
        sent.unwrap();
        let far = Instant::now() + Duration::from_secs(5);
        receive(&threads.waiting(), &mut slots, far, |_| false);
        assert!(matches!(&slots[0], Slot::Down(Reason::ExporterBug, Some(r)) if *r == read));
        assert!(matches!(slots[1], Slot::Down(Reason::ExporterBug, None)));
        assert!(matches!(slots[2], Slot::Down(Reason::Timeout, None)));
        assert!(matches!(slots[3], Slot::Read(_)));
        assert!(matches!(slots[4], Slot::Reading(Some(took)) if took.as_millis() == 7));
    }
}
