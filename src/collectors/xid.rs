//! XIDs, SXids and GPUs fallen off the bus, counted exactly between runs from
//! the kernel log's events ([`crate::kernel_log`]) into this boot's totals in
//! the state (host entries `xid.*`): XIDs and fallen-off lines by GPU (the
//! line's bus id against the snapshot's GPUs, else unattributed by bus id),
//! SXids by switch, bus id, code and severity.
//!
//! Recounting: with no position left (the source changed, or journalctl
//! refused the cursor and no time of its entry is kept) or an impossible
//! stored count, this boot
//! is recounted from its start into separate totals (`xid.recount.*`) while
//! the old ones stay published, so no series goes backwards; once it reaches
//! the end of the log each count becomes the larger of the two. That is exact:
//! a read from the boot's start sees every line the old counts came from plus
//! those since (lower only if journald vacuumed the boot's start, and then the
//! old count is the better bound).

use std::collections::BTreeMap;
use std::time::Instant;

use super::hooks::HostRun;
use crate::kernel_log::{self, normalize_bus_id, Ended, Event, Position, Source};
use crate::metrics;
use crate::snapshot::Snapshot;
use crate::state::boot_id;

/// The most events one series counts in one boot: 2^32 XIDs would be one
/// every 7 ms for a year (over 400 GB of kernel log), so a stored count above
/// it is a damaged state. Counting saturates here; the sum over all codes
/// (at most 10,000) stays below 2^53, exact as an `f64` and plausible.
pub const MAX_COUNT: u64 = 1 << 32;

/// The prefix of every state entry of this module.
pub const STATE_PREFIX: &str = "xid.";

/// What a series counts (the labels of each in [`KINDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Xid,
    XidUnattributed,
    FallenOffBus,
    FallenOffBusUnattributed,
    SXid,
}

/// Each kind's state key start and number of labels (none holds a dot).
const KINDS: [(Kind, &str, usize); 5] = [
    (Kind::Xid, "gpu.", 2),                             // UUID, code
    (Kind::XidUnattributed, "bus.", 2),                 // bus id, code
    (Kind::FallenOffBus, "fallen.gpu.", 1),             // UUID
    (Kind::FallenOffBusUnattributed, "fallen.bus.", 1), // bus id
    (Kind::SXid, "sxid.", 4),                           // switch, bus id, code, severity
];

/// One counted series: its kind and label values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Series(pub Kind, pub Vec<String>);

impl Series {
    /// Its state key (after the prefix): `gpu.<uuid>.<code>`, `bus.<bus>.<code>`,
    /// `fallen.gpu.<uuid>`, `fallen.bus.<bus>`, `sxid.<switch>.<bus>.<code>.<severity>`.
    fn key(&self) -> String {
        let start = KINDS
            .iter()
            .find(|(kind, ..)| *kind == self.0)
            .map_or("", |k| k.1);
        format!("{start}{}", self.1.join("."))
    }

    fn from_key(key: &str) -> Option<Series> {
        KINDS.into_iter().find_map(|(kind, start, labels)| {
            let values: Vec<String> = key
                .strip_prefix(start)?
                .split('.')
                .map(str::to_owned)
                .collect();
            let valid = values.len() == labels && values.iter().all(|v| !v.is_empty());
            valid.then_some(Series(kind, values))
        })
    }

    /// The series of `event`, attributed to `gpus` (normalised bus id → UUID).
    fn of(event: Event, gpus: &BTreeMap<String, String>) -> Series {
        use Kind::*;
        let (mine, none, bus, code) = match event {
            Event::Xid { bus, code } => (Xid, XidUnattributed, bus, Some(code)),
            Event::FallenOffBus { bus } => (FallenOffBus, FallenOffBusUnattributed, bus, None),
            Event::SXid {
                switch,
                bus,
                code,
                severity,
            } => {
                let labels = [switch.to_string(), bus, code.to_string(), severity.into()];
                return Series(SXid, labels.into());
            }
        };
        let (kind, who) = match gpus.get(&bus) {
            Some(uuid) => (mine, uuid.clone()),
            None => (none, bus),
        };
        let mut labels = vec![who];
        labels.extend(code.map(|code| code.to_string()));
        Series(kind, labels)
    }
}

/// Counts per series.
pub type Totals = BTreeMap<Series, u64>;

/// The running totals and the read position, as kept in the state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// The source the position belongs to ([`Source::label`]); empty before
    /// the first read of a boot.
    pub source: String,
    /// Set while no kernel log can be read, so that this is said once.
    pub unavailable: bool,
    pub position: Position,
    /// The totals published: this boot's events up to the position.
    pub totals: Totals,
    /// A recount of this boot from its start, under way.
    pub recount: Option<Totals>,
}

/// The xid collector's host step (after NVML was read, whose GPUs' bus ids
/// attribute the events): counts the events logged since the previous run and
/// adds the totals to the snapshot. An error says why this run did not read
/// the log to its end (logged here); the counts known are published anyway.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), String> {
    let Some(boot_id) = boot_id() else {
        // No state was loaded either (see `state::boot_id`).
        let error = "cannot read this boot's id: nothing can be told to be this boot's";
        log::warn!("cannot count XID errors: {error}");
        return Err(error.into());
    };
    if !run.memory.continues_totals() {
        // Counts from nothing would publish a reset, then a jump.
        return Err("the state cannot be used this run; the XID counts are left out".into());
    }
    let (mut counts, damage) = Counts::from_state(run.memory.host());
    if let Some(damage) = damage {
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
    run.memory.replace_host(STATE_PREFIX, counts.to_state());
    result
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
            self.position = Position::default();
        }
        let mut tries = vec![self.clone()];
        if self.position.cursor.is_some() {
            let mut by_time = self.clone();
            by_time.position.cursor = None;
            tries.extend(by_time.position.monotonic.is_some().then_some(by_time));
            let mut recount = self.clone();
            recount.start_recount();
            tries.push(recount);
        }
        let mut first_error = None;
        for mut attempt in tries {
            let into = attempt.recount.as_mut().unwrap_or(&mut attempt.totals);
            let mut count = |event| count(into, event, gpus);
            match kernel_log::read(source, &mut attempt.position, boot_id, until, &mut count) {
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
                for (series, count) in self.recount.take().into_iter().flatten() {
                    let total = self.totals.entry(series).or_default();
                    *total = (*total).max(count);
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
        self.position = Position::default();
    }

    /// The counts kept in the state's host entries, and the damage if a
    /// stored count was impossible (that count is left out). Entries this
    /// module does not know are ignored.
    pub fn from_state(host: &BTreeMap<String, String>) -> (Self, Option<String>) {
        let (mut counts, mut damage) = (Counts::default(), None);
        for (key, value) in host
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(STATE_PREFIX)?, v)))
        {
            let position = &mut counts.position;
            match key {
                "source" => counts.source.clone_from(value),
                "cursor" => position.cursor = Some(value.clone()),
                "monotonic" => position.monotonic = value.parse().ok(),
                "kmsg_seq" => position.kmsg_seq = value.parse().ok(),
                "unavailable" => counts.unavailable = value == "1",
                "recount" => drop(counts.recount.get_or_insert_with(Totals::default)),
                _ => {
                    let (into, series) = match key.strip_prefix("recount.") {
                        Some(key) => (counts.recount.get_or_insert_with(Totals::default), key),
                        None => (&mut counts.totals, key),
                    };
                    let Some(series) = Series::from_key(series) else {
                        continue;
                    };
                    match value.parse::<u64>() {
                        Ok(count) if count <= MAX_COUNT => drop(into.insert(series, count)),
                        _ => drop(damage.get_or_insert(format!(
                            "{STATE_PREFIX}{key} is {value:?}, not a count of at most {MAX_COUNT}"
                        ))),
                    }
                }
            }
        }
        (counts, damage)
    }

    /// The host entries that keep these counts.
    pub fn to_state(&self) -> BTreeMap<String, String> {
        let (at, one) = (&self.position, || "1".to_owned());
        let words = [
            ("source", Some(self.source.clone())),
            ("cursor", at.cursor.clone()),
            ("monotonic", at.monotonic.map(|m| m.to_string())),
            ("kmsg_seq", at.kmsg_seq.map(|seq| seq.to_string())),
            ("unavailable", self.unavailable.then(one)),
            ("recount", self.recount.as_ref().map(|_| one())),
        ];
        let words = words
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_owned(), v?)));
        let recount = self.recount.iter().flatten();
        let recount = recount.map(|(s, n)| (format!("recount.{}", s.key()), n.to_string()));
        let totals = self.totals.iter().map(|(s, n)| (s.key(), n.to_string()));
        let entries = words.chain(recount).chain(totals);
        entries
            .map(|(k, v)| (format!("{STATE_PREFIX}{k}"), v))
            .collect()
    }
}

/// Counts `event` (attributed to `gpus`) into `totals`, saturating at
/// [`MAX_COUNT`].
fn count(totals: &mut Totals, event: Event, gpus: &BTreeMap<String, String>) {
    let total = totals.entry(Series::of(event, gpus)).or_default();
    *total = total.saturating_add(1).min(MAX_COUNT);
}

/// Adds the samples: for every GPU of the snapshot with a UUID its XID total
/// and fallen-off-the-bus count (0 until the first, so that `increase()` sees
/// it) and its XIDs by code; the unattributed and SXid series as host
/// samples. Down GPUs keep theirs: the counts come from the kernel log. A
/// recount under way is not published (see the module doc).
pub fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let uuid = &device.uuid;
        let mine = |kind| {
            counts
                .totals
                .iter()
                .filter(move |(s, _)| s.0 == kind && s.1[0] == *uuid)
        };
        let xids: Vec<(&String, u64)> = mine(Kind::Xid).map(|(s, n)| (&s.1[1], *n)).collect();
        let total = xids.iter().fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
        let fallen: u64 = mine(Kind::FallenOffBus).map(|(_, n)| *n).sum();
        let mut samples = vec![metrics::XID_ERRORS.sample(total as f64)];
        for (code, n) in xids {
            samples.push(metrics::XID_ERRORS_BY_CODE.sample_with([code.clone()], n as f64));
        }
        samples.push(metrics::FALLEN_OFF_BUS.sample(fallen as f64));
        device.samples.extend(samples);
    }
    for (Series(kind, labels), n) in &counts.totals {
        let (n, l) = (*n as f64, |i: usize| labels[i].clone());
        snapshot.host.push(match kind {
            Kind::XidUnattributed => metrics::XID_UNATTRIBUTED.sample_with([l(0), l(1)], n),
            Kind::FallenOffBusUnattributed => {
                metrics::FALLEN_OFF_BUS_UNATTRIBUTED.sample_with([l(0)], n)
            }
            Kind::SXid => metrics::NVSWITCH_SXID_ERRORS.sample_with([l(0), l(1), l(2), l(3)], n),
            Kind::Xid | Kind::FallenOffBus => continue,
        });
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

    fn gpu_xid(code: &str) -> Series {
        Series(Kind::Xid, vec!["GPU-a".into(), code.into()])
    }

    #[test]
    fn counts_saturate_and_impossible_stored_counts_are_damage() {
        let mut totals = Totals::from([(gpu_xid("79"), MAX_COUNT)]);
        count(&mut totals, xid(79));
        assert_eq!(totals[&gpu_xid("79")], MAX_COUNT);
        let mut host = BTreeMap::from([
            ("xid.source".to_owned(), "journal".to_owned()),
            ("xid.gpu.GPU-a.13".to_owned(), MAX_COUNT.to_string()),
        ]);
        assert_eq!(Counts::from_state(&host).1, None);
        for damaged in [
            u64::MAX.to_string(),
            "18446744073709551616".into(),
            "-1".into(),
        ] {
            host.insert("xid.gpu.GPU-a.79".to_owned(), damaged.clone());
            let (counts, damage) = Counts::from_state(&host);
            assert!(damage.unwrap().contains("xid.gpu.GPU-a.79"), "{damaged}");
            assert_eq!(counts.totals.get(&gpu_xid("79")), None, "{damaged}");
            assert_eq!(counts.totals[&gpu_xid("13")], MAX_COUNT);
        }
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
        assert_eq!(counts.totals[&gpu_xid("79")], 2, "not before it ends");
        assert_eq!(counts.finish(Ended::Complete), Ok(()));
        assert_eq!(counts.recount, None);
        let got = |code| counts.totals[&gpu_xid(code)];
        assert_eq!((got("79"), got("13"), got("48")), (3, 1, 1));
    }

    #[test]
    fn counts_round_trip_through_the_state() {
        let mut counts = Counts {
            source: "journal".into(),
            position: Position {
                cursor: Some("s=1;i=2;b=3;m=4;t=5;x=6".into()),
                monotonic: Some(4),
                kmsg_seq: None,
            },
            ..Counts::default()
        };
        let events = [
            xid(79),
            xid(13),
            Event::Xid {
                bus: "00000000:99:00".into(),
                code: 79,
            },
            Event::FallenOffBus {
                bus: "00000000:3B:00".into(),
            },
            Event::FallenOffBus {
                bus: "00000000:B3:00".into(),
            },
            Event::SXid {
                switch: 3,
                bus: "00000000:04:00".into(),
                code: 22013,
                severity: "non_fatal",
            },
        ];
        for event in events {
            count(&mut counts.totals, event);
        }
        let keys: Vec<String> = counts.to_state().into_keys().collect();
        for key in [
            "xid.gpu.GPU-a.79",
            "xid.bus.00000000:99:00.79",
            "xid.fallen.gpu.GPU-a",
            "xid.fallen.bus.00000000:B3:00",
            "xid.sxid.3.00000000:04:00.22013.non_fatal",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
        }
        assert_eq!(
            Counts::from_state(&counts.to_state()),
            (counts.clone(), None)
        );
        // A recount under way, also before its first event.
        counts.start_recount();
        assert_eq!(
            Counts::from_state(&counts.to_state()),
            (counts.clone(), None)
        );
        count(counts.recount.as_mut().unwrap(), xid(13));
        assert_eq!(Counts::from_state(&counts.to_state()), (counts, None));
    }
}
