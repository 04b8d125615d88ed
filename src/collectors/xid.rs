//! XIDs, SXids and GPUs fallen off the bus, counted exactly between runs from
//! the kernel log's events into this boot's totals in the state: XIDs and
//! fallen-off lines by GPU (else unattributed by bus id), SXids by switch, bus
//! id, code and severity. Without a position or with a damaged count, the
//! boot is recounted into `recount` while the old totals stay published; a
//! complete recount raises each total to it (docs/design.md, "Recovery").

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use crate::collector::{HostError, HostRun};
use crate::kernel_log::{self, BusId, Event, Position, Source};
use crate::metrics;
use crate::snapshot::Snapshot;
use crate::state::boot_id;
use crate::state::schema::{SxidCount, XidCounts as Counts, XidTotals as Totals};

/// The most events one series counts in one boot (one every 7 ms for a
/// year): a stored count above it is damage. Counting saturates here.
const MAX_COUNT: u64 = 1 << 32;

/// Why a run did not count the kernel log to its end.
#[derive(Debug)]
enum Error {
    NoBootId,
    StateUnusable,
    NoKernelLog,
    Log(kernel_log::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::NoBootId => "cannot read this boot's id: nothing can be told to be this boot's",
            Error::StateUnusable => {
                "the state cannot be used this run; the XID counts are left out"
            }
            Error::NoKernelLog => "no kernel log to count XID errors from",
            Error::Log(e) => return e.fmt(f),
        })
    }
}

impl std::error::Error for Error {}

/// The xid collector's host step (after NVML was read, whose GPUs' bus ids
/// attribute the events): counts the events logged since the previous run and
/// adds the totals to the snapshot; the counts known are published anyway.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), HostError> {
    let Some(boot_id) = boot_id() else {
        // No state was loaded either (see `state::boot_id`).
        log::warn!("cannot count XID errors: {}", Error::NoBootId);
        return Err(Error::NoBootId.into());
    };
    if !run.state.continues_totals() {
        // Counts from nothing would publish a reset, then a jump.
        return Err(Error::StateUnusable.into());
    }
    let mut counts = run.state.previous().xid.clone();
    if let Some(damage) = take_damage(&mut counts) {
        log::warn!(
            "the state holds an impossible XID count ({damage}); ignoring it and recounting \
             this boot's kernel log from its start"
        );
        counts.start_recount();
    }
    let result = match Source::choose(run.journal_dir) {
        None => {
            if !counts.unavailable {
                log::warn!(
                    "no kernel log to count XID errors from (no journal files, /dev/kmsg not \
                     readable); publishing the counts known so far"
                );
            }
            counts.unavailable = true;
            Err(Error::NoKernelLog)
        }
        Some(source) => {
            let gpus = gpus_of(run.snapshot);
            counts.read(&source, &gpus, &boot_id.replace('-', ""), run.until)
        }
    };
    add_samples(&counts, run.snapshot);
    run.state.set_xid(counts);
    result.map_err(HostError::from)
}

impl Counts {
    /// Reads `source` from the position until `until`, counting its events:
    /// from the saved cursor; if that fails, from its entry's time; then,
    /// recounting, from the boot's start. The first read that works counts;
    /// if none does, nothing changes.
    fn read(
        &mut self,
        source: &Source,
        gpus: &BTreeMap<BusId, String>,
        boot_id: &str,
        until: Instant,
    ) -> Result<(), Error> {
        self.unavailable = false;
        if self.source != source.label() {
            if !self.source.is_empty() {
                // The position is the other source's: recount.
                log::info!("reading the kernel log from {} now", source.label());
                self.start_recount();
            }
            self.source = source.label().into();
            self.start_over();
        }
        let mut tries = vec![self.clone()];
        if self.cursor.is_some() {
            let mut by_time = self.clone();
            by_time.cursor = None;
            tries.extend(by_time.monotonic.is_some().then_some(by_time));
            let mut recount = self.clone();
            recount.start_recount();
            tries.push(recount);
        }
        let mut first_error = None;
        for mut attempt in tries {
            let mut at = Position {
                cursor: attempt.cursor.take(),
                monotonic: attempt.monotonic,
                kmsg_seq: attempt.kmsg_seq,
            };
            let into = attempt.recount.as_mut().unwrap_or(&mut attempt.totals);
            let read = source.read(&mut at, boot_id, until, &mut |e| count(into, e, gpus));
            (attempt.cursor, attempt.monotonic, attempt.kmsg_seq) =
                (at.cursor, at.monotonic, at.kmsg_seq);
            match read {
                Err(error) if !error.is_cut() => drop(first_error.get_or_insert(error)),
                read => {
                    if let Some(error) = first_error {
                        let now = match attempt.recount {
                            Some(_) => "recounting this boot's kernel log from its start",
                            None => "reading on from the time of the last line counted",
                        };
                        log::warn!("journalctl refused the saved cursor ({error}); {now}");
                    }
                    *self = attempt;
                    return self.finish(read);
                }
            }
        }
        let error = first_error.expect("one read was tried");
        log::warn!("cannot count XID errors: {error}; publishing the counts known so far");
        Err(Error::Log(error))
    }

    /// Ends a read: a complete one ends a recount under way (each total
    /// becomes the larger of the two); a cut one says why.
    fn finish(&mut self, read: Result<(), kernel_log::Error>) -> Result<(), Error> {
        if let Err(cut) = read {
            log::warn!(
                "{cut}; counted the kernel lines read by then, the rest follows in the next runs"
            );
            return Err(Error::Log(cut));
        }
        if let Some(recount) = self.recount.take() {
            raise(&mut self.totals, recount);
        }
        Ok(())
    }

    fn start_recount(&mut self) {
        self.recount = Some(Totals::default());
        self.start_over();
    }

    /// Forgets the position: the next read starts at the boot's start.
    fn start_over(&mut self) {
        (self.cursor, self.monotonic, self.kmsg_seq) = (None, None, None);
    }
}

/// Drops every count above [`MAX_COUNT`] and describes the first, if any.
fn take_damage(counts: &mut Counts) -> Option<String> {
    let mut damage = None;
    let mut possible = |what: &dyn fmt::Display, count: u64| {
        if count > MAX_COUNT && damage.is_none() {
            damage = Some(format!(
                "the count of {what} is {count}, more than {MAX_COUNT}"
            ));
        }
        count <= MAX_COUNT
    };
    for totals in std::iter::once(&mut counts.totals).chain(&mut counts.recount) {
        for (id, codes) in totals.gpus.iter_mut().chain(&mut totals.unattributed) {
            codes.retain(|code, n| possible(&format_args!("XID {code} for {id}"), *n));
        }
        let fallen = [
            &mut totals.fallen_off_bus,
            &mut totals.fallen_off_bus_unattributed,
        ];
        for ids in fallen {
            ids.retain(|id, n| possible(&format_args!("{id} falling off the bus"), *n));
        }
        let sxid = |s: &SxidCount| format!("SXid {} of nvidia-nvswitch{}", s.code, s.switch);
        totals.sxids.retain(|s| possible(&sxid(s), s.count));
    }
    damage
}

/// Raises every count of `totals` to at least the one in `recount`.
fn raise(totals: &mut Totals, recount: Totals) {
    for (mine, theirs) in [
        (&mut totals.gpus, recount.gpus),
        (&mut totals.unattributed, recount.unattributed),
    ] {
        for (id, codes) in theirs {
            raise_each(mine.entry(id).or_default(), codes);
        }
    }
    raise_each(&mut totals.fallen_off_bus, recount.fallen_off_bus);
    let unattributed = recount.fallen_off_bus_unattributed;
    raise_each(&mut totals.fallen_off_bus_unattributed, unattributed);
    for sxid in recount.sxids {
        let n = sxid.count;
        let at = &mut sxid_entry(&mut totals.sxids, sxid).count;
        *at = (*at).max(n);
    }
}

fn raise_each<K: Ord>(mine: &mut BTreeMap<K, u64>, theirs: BTreeMap<K, u64>) {
    for (key, n) in theirs {
        let at = mine.entry(key).or_default();
        *at = (*at).max(n);
    }
}

/// The record of `sxids` for the series of `key` (its count aside), added at
/// 0 if missing.
fn sxid_entry(sxids: &mut Vec<SxidCount>, key: SxidCount) -> &mut SxidCount {
    let same = |s: &SxidCount| {
        (s.switch, &s.pci_bus_id, s.code, &s.severity)
            == (key.switch, &key.pci_bus_id, key.code, &key.severity)
    };
    match sxids.iter().position(same) {
        Some(at) => &mut sxids[at],
        None => {
            sxids.push(SxidCount { count: 0, ..key });
            sxids.last_mut().expect("pushed")
        }
    }
}

/// Counts `event` (attributed to `gpus`: bus id → UUID) into `totals`,
/// saturating at [`MAX_COUNT`].
fn count(totals: &mut Totals, event: Event, gpus: &BTreeMap<BusId, String>) {
    let total = match event {
        Event::Xid { bus, code } => {
            let codes = match gpus.get(&bus) {
                Some(uuid) => totals.gpus.entry(uuid.clone()),
                None => totals.unattributed.entry(bus.into()),
            };
            codes.or_default().entry(code).or_default()
        }
        Event::FallenOffBus { bus } => {
            let fallen = match gpus.get(&bus) {
                Some(uuid) => totals.fallen_off_bus.entry(uuid.clone()),
                None => totals.fallen_off_bus_unattributed.entry(bus.into()),
            };
            fallen.or_default()
        }
        Event::SXid {
            switch,
            bus,
            code,
            severity,
        } => {
            let key = SxidCount {
                switch,
                pci_bus_id: bus.into(),
                code,
                severity: severity.into(),
                count: 0,
            };
            &mut sxid_entry(&mut totals.sxids, key).count
        }
    };
    *total = total.saturating_add(1).min(MAX_COUNT);
}

/// Adds the samples: for every GPU of the snapshot with a UUID (down ones
/// too) its XID total and fallen-off-the-bus count (0 until the first) and
/// its XIDs by code; the unattributed and SXid series as host samples. A
/// recount under way is not published.
fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    let totals = &counts.totals;
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let codes = totals.gpus.get(&device.uuid).into_iter().flatten();
        let total: u64 = codes.clone().map(|(_, n)| n).sum();
        let fallen = totals.fallen_off_bus.get(&device.uuid).copied();
        let samples = &mut device.samples;
        samples.push(metrics::XID_ERRORS.sample(total as f64));
        for (code, n) in codes {
            samples.push(metrics::XID_ERRORS_BY_CODE.sample_with([code.to_string()], *n as f64));
        }
        samples.push(metrics::FALLEN_OFF_BUS.sample(fallen.unwrap_or(0) as f64));
    }
    let host = &mut snapshot.host;
    for (bus, codes) in &totals.unattributed {
        for (code, n) in codes {
            let labels = [bus.clone(), code.to_string()];
            host.push(metrics::XID_UNATTRIBUTED.sample_with(labels, *n as f64));
        }
    }
    for (bus, n) in &totals.fallen_off_bus_unattributed {
        host.push(metrics::FALLEN_OFF_BUS_UNATTRIBUTED.sample_with([bus.clone()], *n as f64));
    }
    for s in &totals.sxids {
        let labels = [
            s.switch.to_string(),
            s.pci_bus_id.clone(),
            s.code.to_string(),
            s.severity.clone(),
        ];
        host.push(metrics::NVSWITCH_SXID_ERRORS.sample_with(labels, s.count as f64));
    }
}

/// The UUIDs of the snapshot's GPUs by bus id; a GPU without a UUID or bus id
/// takes no events (they stay unattributed).
fn gpus_of(snapshot: &Snapshot) -> BTreeMap<BusId, String> {
    snapshot
        .devices
        .iter()
        .filter(|d| !d.uuid.is_empty())
        .filter_map(|d| Some((BusId::parse(&d.pci_bus_id)?, d.uuid.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(id: &str) -> BusId {
        BusId::parse(id).unwrap()
    }

    fn gpus() -> BTreeMap<BusId, String> {
        BTreeMap::from([(bus("0000:3b:00.0"), "GPU-a".to_owned())])
    }

    fn xid(code: u32) -> Event {
        Event::Xid {
            bus: bus("0000:3b:00"),
            code,
        }
    }

    fn count(totals: &mut Totals, event: Event) {
        super::count(totals, event, &gpus());
    }

    fn gpu_a(totals: &Totals, code: u32) -> Option<u64> {
        totals.gpus.get("GPU-a")?.get(&code).copied()
    }

    #[test]
    fn counts_saturate_and_impossible_stored_counts_are_damage() {
        let mut counts = Counts::default();
        let codes = BTreeMap::from([(79, MAX_COUNT), (13, MAX_COUNT)]);
        counts.totals.gpus.insert("GPU-a".into(), codes);
        count(&mut counts.totals, xid(79));
        assert_eq!(gpu_a(&counts.totals, 79), Some(MAX_COUNT));
        assert_eq!(take_damage(&mut counts), None);
        counts
            .totals
            .gpus
            .get_mut("GPU-a")
            .unwrap()
            .insert(79, u64::MAX);
        let sxid = SxidCount {
            switch: 3,
            pci_bus_id: "00000000:04:00".into(),
            code: 22013,
            severity: "non_fatal".into(),
            count: MAX_COUNT + 1,
        };
        counts.totals.sxids.push(sxid);
        let damage = take_damage(&mut counts).unwrap();
        assert!(damage.contains("XID 79 for GPU-a"), "{damage}");
        assert_eq!(gpu_a(&counts.totals, 79), None);
        assert_eq!(gpu_a(&counts.totals, 13), Some(MAX_COUNT));
        assert!(counts.totals.sxids.is_empty());
        // The largest possible file stays exact and plausible.
        let most = (MAX_COUNT * 10_000) as f64;
        assert!(most < 2f64.powi(53));
        assert!(metrics::XID_ERRORS.family().plausible().contains(&most));
    }

    #[test]
    fn a_complete_recount_replaces_the_totals_but_never_lowers_them() {
        let mut counts = Counts::default();
        for code in [79, 79, 13] {
            count(&mut counts.totals, xid(code));
        }
        counts.start_recount();
        // The journal still holds 79 three times (one logged since) but lost
        // the 13 to vacuuming; a new code 48.
        for code in [79, 79, 79, 48] {
            count(counts.recount.as_mut().unwrap(), xid(code));
        }
        assert_eq!(gpu_a(&counts.totals, 79), Some(2), "not before it ends");
        assert!(counts.finish(Ok(())).is_ok());
        assert_eq!(counts.recount, None);
        let got = |code| gpu_a(&counts.totals, code);
        assert_eq!((got(79), got(13), got(48)), (Some(3), Some(1), Some(1)));
    }

    #[test]
    fn each_event_counts_on_its_series() {
        let mut totals = Totals::default();
        let sxid = || Event::SXid {
            switch: 3,
            bus: bus("00000000:04:00"),
            code: 22013,
            severity: "non_fatal",
        };
        let fallen = |id: &str| Event::FallenOffBus { bus: bus(id) };
        let events = [
            xid(79),
            xid(79),
            Event::Xid {
                bus: bus("00000000:99:00"),
                code: 79,
            },
            fallen("00000000:3B:00"),
            fallen("00000000:B3:00"),
            sxid(),
            sxid(),
        ];
        for event in events {
            count(&mut totals, event);
        }
        assert_eq!(gpu_a(&totals, 79), Some(2));
        assert_eq!(totals.unattributed["00000000:99:00"][&79], 1);
        assert_eq!(totals.fallen_off_bus["GPU-a"], 1);
        assert_eq!(totals.fallen_off_bus_unattributed["00000000:B3:00"], 1);
        assert_eq!(totals.sxids.len(), 1);
        assert_eq!((totals.sxids[0].count, totals.series()), (2, 5));
    }
}
