//! XIDs, SXids and GPUs fallen off the bus, counted exactly between runs from
//! the kernel log's events ([`crate::kernel_log`]) into this boot's totals in
//! the state (its `xid` field): XIDs and fallen-off lines by GPU (the
//! line's bus id against the snapshot's GPUs, else unattributed by bus id),
//! SXids by switch, bus id, code and severity.
//!
//! Recounting: with no position left (the source changed, or journalctl
//! refused the cursor and no time of its entry is kept) or an impossible
//! stored count, this boot
//! is recounted from its start into separate totals (`recount`) while
//! the old ones stay published, so no series goes backwards; once it reaches
//! the end of the log each count becomes the larger of the two. That is exact:
//! a read from the boot's start sees every line the old counts came from plus
//! those since (lower only if journald vacuumed the boot's start, and then the
//! old count is the better bound).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::collector::{HostError, HostRun};
use crate::kernel_log::{self, normalize_bus_id, Ended, Event, Position, Source};
use crate::metrics;
use crate::snapshot::Snapshot;
use crate::state::boot_id;

/// The most events one series counts in one boot: 2^32 XIDs would be one
/// every 7 ms for a year (over 400 GB of kernel log), so a stored count above
/// it is a damaged state. Counting saturates here; the sum over all codes
/// (at most 10,000) stays below 2^53, exact as an `f64` and plausible.
pub const MAX_COUNT: u64 = 1 << 32;

pub use crate::state::schema::{SxidCount, XidCounts as Counts, XidTotals as Totals};

/// The xid collector's host step (after NVML was read, whose GPUs' bus ids
/// attribute the events): counts the events logged since the previous run and
/// adds the totals to the snapshot. An error says why this run did not read
/// the log to its end (logged here); the counts known are published anyway.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), HostError> {
    let Some(boot_id) = boot_id() else {
        // No state was loaded either (see `state::boot_id`).
        let error = "cannot read this boot's id: nothing can be told to be this boot's";
        log::warn!("cannot count XID errors: {error}");
        return Err(error.into());
    };
    if !run.state.continues_totals() {
        // Counts from nothing would publish a reset, then a jump.
        return Err("the state cannot be used this run; the XID counts are left out".into());
    }
    let mut counts = run.state.previous().xid.clone();
    if let Some(damage) = take_damage(&mut counts) {
        log::warn!(
            "the state holds an impossible XID count ({damage}); ignoring it and recounting \
             this boot's kernel log from its start"
        );
        counts.start_recount();
    }
    let gpus = gpus_of(run.snapshot);
    let result = match Source::choose(run.journal_dir) {
        None => {
            if !counts.unavailable {
                log::warn!(
                    "no kernel log to count XID errors from (no journal files, /dev/kmsg not \
                     readable); publishing the counts known so far"
                );
            }
            counts.unavailable = true;
            Err("no kernel log to count XID errors from".to_owned())
        }
        Some(source) => counts.read(&source, &gpus, &boot_id.replace('-', ""), run.until),
    };
    add_samples(&counts, run.snapshot);
    run.state.set_xid(counts);
    result.map_err(HostError::from)
}

impl Counts {
    /// Reads `source` from the position until `until`, counting its events
    /// (attributed to `gpus`: normalised bus id → UUID): from the saved
    /// cursor; if that fails, from its entry's time; then, recounting, from
    /// the boot's start. The first read that works counts; if none does,
    /// nothing changes. journalctl gives no other sign of a refused cursor: it
    /// exits 1 as for a journal it cannot open (systemd 252).
    pub fn read(
        &mut self,
        source: &Source,
        gpus: &BTreeMap<String, String>,
        boot_id: &str,
        until: Instant,
    ) -> Result<(), String> {
        self.unavailable = false;
        if self.source != source.label() {
            if !self.source.is_empty() {
                // The position is the other source's: recount (exact, see the module doc).
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
            let read = kernel_log::read(source, &mut at, boot_id, until, &mut |event| {
                count(into, event, gpus);
            });
            (attempt.cursor, attempt.monotonic, attempt.kmsg_seq) =
                (at.cursor, at.monotonic, at.kmsg_seq);
            match read {
                Err(error) => drop(first_error.get_or_insert(error)),
                Ok(ended) => {
                    if let Some(error) = first_error {
                        let now = match attempt.recount {
                            Some(_) => "recounting this boot's kernel log from its start",
                            None => "reading on from the time of the last line counted",
                        };
                        log::warn!("journalctl refused the saved cursor ({error}); {now}");
                    }
                    *self = attempt;
                    return self.finish(ended);
                }
            }
        }
        let error = first_error.expect("one read was tried").to_string();
        log::warn!("cannot count XID errors: {error}; publishing the counts known so far");
        Err(error)
    }

    /// Ends a read: a complete one ends a recount under way (each total
    /// becomes the larger of the two); a cut one says why.
    fn finish(&mut self, ended: Ended) -> Result<(), String> {
        let why = match ended {
            Ended::Complete => {
                if let Some(recount) = self.recount.take() {
                    raise(&mut self.totals, recount);
                }
                return Ok(());
            }
            Ended::Deadline => "reading the kernel log did not finish by the run's deadline".into(),
            Ended::Bound => format!(
                "journalctl wrote more than {} bytes in this run",
                kernel_log::journal::MAX_BYTES_PER_RUN
            ),
        };
        log::warn!(
            "{why}; counted the kernel lines read by then, the rest follows in the next runs"
        );
        Err(why)
    }

    /// Starts recounting this boot from its start (see the module doc).
    pub fn start_recount(&mut self) {
        self.recount = Some(Totals::default());
        self.start_over();
    }

    /// Forgets the position: the next read starts at the boot's start.
    fn start_over(&mut self) {
        (self.cursor, self.monotonic, self.kmsg_seq) = (None, None, None);
    }
}

/// Drops every impossible count (above [`MAX_COUNT`]: damage, not something
/// the driver logged) and describes the first, if any.
fn take_damage(counts: &mut Counts) -> Option<String> {
    let mut damage = None;
    let mut possible = |what: &dyn std::fmt::Display, count: u64| {
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
    let up = |at: &mut u64, n: u64| *at = (*at).max(n);
    for (mine, theirs) in [
        (&mut totals.gpus, recount.gpus),
        (&mut totals.unattributed, recount.unattributed),
    ] {
        for (id, codes) in theirs {
            let into = mine.entry(id).or_default();
            codes
                .into_iter()
                .for_each(|(code, n)| up(into.entry(code).or_default(), n));
        }
    }
    for (mine, theirs) in [
        (&mut totals.fallen_off_bus, recount.fallen_off_bus),
        (
            &mut totals.fallen_off_bus_unattributed,
            recount.fallen_off_bus_unattributed,
        ),
    ] {
        theirs
            .into_iter()
            .for_each(|(id, n)| up(mine.entry(id).or_default(), n));
    }
    for sxid in recount.sxids {
        let n = sxid.count;
        up(&mut sxid_entry(&mut totals.sxids, sxid).count, n);
    }
}

/// The record of `sxids` for the series of `key` (its count aside), added at
/// 0 if missing.
fn sxid_entry(sxids: &mut Vec<SxidCount>, key: SxidCount) -> &mut SxidCount {
    let same = |s: &SxidCount| {
        (s.switch, &s.pci_bus_id, s.code, &s.severity)
            == (key.switch, &key.pci_bus_id, key.code, &key.severity)
    };
    let at = match sxids.iter().position(same) {
        Some(at) => at,
        None => {
            sxids.push(SxidCount { count: 0, ..key });
            sxids.len() - 1
        }
    };
    &mut sxids[at]
}

/// Counts `event` (attributed to `gpus`: normalised bus id → UUID) into
/// `totals`, saturating at [`MAX_COUNT`].
fn count(totals: &mut Totals, event: Event, gpus: &BTreeMap<String, String>) {
    let total = match event {
        Event::Xid { bus, code } => {
            let codes = match gpus.get(&bus) {
                Some(uuid) => totals.gpus.entry(uuid.clone()),
                None => totals.unattributed.entry(bus),
            };
            codes.or_default().entry(code).or_default()
        }
        Event::FallenOffBus { bus } => match gpus.get(&bus) {
            Some(uuid) => totals.fallen_off_bus.entry(uuid.clone()).or_default(),
            None => totals.fallen_off_bus_unattributed.entry(bus).or_default(),
        },
        Event::SXid {
            switch,
            bus,
            code,
            severity,
        } => {
            let key = SxidCount {
                switch,
                pci_bus_id: bus,
                code,
                severity: severity.into(),
                count: 0,
            };
            &mut sxid_entry(&mut totals.sxids, key).count
        }
    };
    *total = total.saturating_add(1).min(MAX_COUNT);
}

/// Adds the samples: for every GPU of the snapshot with a UUID its XID total
/// and fallen-off-the-bus count (0 until the first, so that `increase()` sees
/// it) and its XIDs by code; the unattributed and SXid series as host
/// samples. Down GPUs keep theirs: the counts come from the kernel log. A
/// recount under way is not published (see the module doc).
pub fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    let totals = &counts.totals;
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let codes = totals.gpus.get(&device.uuid).into_iter().flatten();
        let total = codes
            .clone()
            .fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
        let fallen = totals
            .fallen_off_bus
            .get(&device.uuid)
            .copied()
            .unwrap_or(0);
        let samples = &mut device.samples;
        samples.push(metrics::XID_ERRORS.sample(total as f64));
        for (code, n) in codes {
            samples.push(metrics::XID_ERRORS_BY_CODE.sample_with([code.to_string()], *n as f64));
        }
        samples.push(metrics::FALLEN_OFF_BUS.sample(fallen as f64));
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

/// The GPUs of `snapshot` events are attributed to: normalised bus id →
/// UUID. A GPU without a UUID or bus id takes none (they stay unattributed).
pub fn gpus_of(snapshot: &Snapshot) -> BTreeMap<String, String> {
    snapshot
        .devices
        .iter()
        .filter(|d| !d.uuid.is_empty())
        .filter_map(|d| Some((normalize_bus_id(&d.pci_bus_id)?, d.uuid.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> BTreeMap<String, String> {
        BTreeMap::from([("00000000:3B:00".to_owned(), "GPU-a".to_owned())])
    }

    fn xid(code: u32) -> Event {
        Event::Xid {
            bus: "00000000:3B:00".into(),
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
        assert_eq!(counts.finish(Ended::Complete), Ok(()));
        assert_eq!(counts.recount, None);
        let got = |code| gpu_a(&counts.totals, code);
        assert_eq!((got(79), got(13), got(48)), (Some(3), Some(1), Some(1)));
    }

    #[test]
    fn each_event_counts_on_its_series() {
        let mut totals = Totals::default();
        let sxid = || Event::SXid {
            switch: 3,
            bus: "00000000:04:00".into(),
            code: 22013,
            severity: "non_fatal",
        };
        let fallen = |bus: &str| Event::FallenOffBus { bus: bus.into() };
        let events = [
            xid(79),
            xid(79),
            Event::Xid {
                bus: "00000000:99:00".into(),
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
