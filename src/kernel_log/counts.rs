//! The kernel log's events counted by series into this boot's totals from a
//! position on ([`Counts`], kernel_log's part of the state). Without a
//! position or with a damaged count the boot is recounted (docs/design.md,
//! "Recovery").

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize, Serializer};

use super::event::{BusId, Error, Event, Position};
use super::source::Source;

/// The most series in the totals, and in a recount: 64 for each of 64 GPUs.
pub const MAX_SERIES: usize = 64 * 64;

/// Counting saturates here (one event every 7 ms for a year); a stored count
/// above it is damage.
const MAX_COUNT: u64 = 1 << 32;

/// The position in the kernel log, kept whatever happens to the totals.
/// Written by serde; the state reads it within its bounds (`state::bounded`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// `journal` or `kmsg`, the position's source; empty before a boot's first read.
    pub source: String,
    /// Set while no kernel log can be read (so that it is said once).
    pub unavailable: bool,
    #[serde(flatten)]
    pub position: Position,
    /// Every XID from the start of this boot up to the position.
    pub totals: Totals,
    /// A recount of this boot up to the position, under way (not published).
    pub recount: Option<Totals>,
}

/// The count of each series, stored as a list of `[series, count]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals(pub BTreeMap<Series, u64>);

impl Serialize for Totals {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(&self.0)
    }
}

/// One counted series: XIDs and lines saying a GPU fell off the bus (outside
/// an Xid line) of a GPU or a bus id no GPU has; NVSwitch SXids.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Series {
    Xid {
        id: XidOf,
        code: u32,
    },
    FallenOffBus {
        id: XidOf,
    },
    /// Of `nvidia-nvswitch<switch>`; the severity `fatal`, `non_fatal` or `correctable`.
    Sxid {
        switch: u32,
        pci_bus_id: String,
        code: u32,
        severity: String,
    },
}

/// Whose a series is: a GPU's by UUID, or unattributed, by bus id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XidOf {
    Gpu(String),
    Bus(String),
}

impl Counts {
    /// The XIDs counted for the GPU `uuid`, every code.
    pub fn xids_of(&self, uuid: &str) -> u64 {
        let of_gpu = self.totals.0.iter().filter(
            |(series, _)| matches!(series, Series::Xid { id: XidOf::Gpu(gpu), .. } if gpu == uuid),
        );
        of_gpu.map(|(_, &n)| n).sum()
    }

    /// Counts the events this boot logged since the position, attributed to
    /// `gpus` (bus id → UUID), until `until`: from the cursor, else its
    /// entry's time, else recounting from the boot's start; if no read works,
    /// nothing changes. Returns how many events of new series beyond
    /// [`MAX_SERIES`] were not counted.
    pub fn update(
        &mut self,
        journal_dir: Option<&Path>,
        gpus: &BTreeMap<BusId, String>,
        boot_id: &str,
        until: Instant,
    ) -> Result<u64, Error> {
        if let Some(damage) = take_damage(self) {
            log::warn!(
                "the state holds an impossible XID count ({damage}); ignoring it and recounting \
                 this boot's kernel log from its start"
            );
            self.start_recount();
        }
        let source = Source::choose(journal_dir).inspect_err(|none| {
            if !std::mem::replace(&mut self.unavailable, true) {
                log::warn!("cannot count XID errors: {none}; publishing the counts known so far");
            }
        })?;
        self.unavailable = false;
        if self.source != source.label() {
            // The position is the other source's, if any: recount.
            if !std::mem::replace(&mut self.source, source.label().into()).is_empty() {
                log::info!("reading the kernel log from {} now", source.label());
                self.start_recount();
            }
            self.position = Position::default();
        }
        // Each with what it does after a refused cursor.
        let mut tries = vec![(self.clone(), "")];
        if self.position.cursor.is_some() {
            let (mut by_time, mut recount) = (self.clone(), self.clone());
            by_time.position.cursor = None;
            recount.start_recount();
            let on = "reading on from the time of the last line counted";
            tries.extend(by_time.position.monotonic.map(|_| (by_time, on)));
            tries.push((recount, "recounting this boot's kernel log from its start"));
        }
        let mut first_error = None;
        for (mut attempt, now) in tries {
            let into = attempt.recount.as_mut().unwrap_or(&mut attempt.totals);
            let mut refused = 0;
            let mut on_event = |e| refused += u64::from(!count(into, e, gpus));
            match source.read(&mut attempt.position, boot_id, until, &mut on_event) {
                Err(e) if !matches!(e, Error::Deadline | Error::Bound | Error::Lost(_)) => {
                    first_error.get_or_insert(e);
                }
                read => {
                    if let Some(error) = first_error {
                        log::warn!("journalctl refused the saved cursor ({error}); {now}");
                    }
                    *self = attempt;
                    return self.finish(read).map(|()| refused);
                }
            }
        }
        let error = first_error.expect("one read was tried");
        log::warn!("cannot count XID errors: {error}; publishing the counts known so far");
        Err(error)
    }

    /// Ends a read: one that reached the end ends a recount under way (each
    /// total becomes the larger of the two).
    fn finish(&mut self, read: Result<(), Error>) -> Result<(), Error> {
        match &read {
            Err(lost @ Error::Lost(_)) => log::warn!("{lost}"),
            Err(cut) => {
                log::warn!(
                    "{cut}; counted the kernel lines read by then, the rest follows in the next runs"
                );
                return read;
            }
            Ok(()) => {}
        }
        for (series, n) in self.recount.take().unwrap_or_default().0 {
            let room = self.totals.0.len() < MAX_SERIES;
            if let Some(at) = self.totals.0.get_mut(&series) {
                *at = (*at).max(n);
            } else if room {
                self.totals.0.insert(series, n);
            }
        }
        read
    }

    /// Recounts from the boot's start: forgets the position.
    fn start_recount(&mut self) {
        self.recount = Some(Totals::default());
        self.position = Position::default();
    }
}

/// Drops every count above [`MAX_COUNT`]; the first one's record, if any.
fn take_damage(counts: &mut Counts) -> Option<String> {
    let mut damage = None;
    for totals in std::iter::once(&mut counts.totals).chain(&mut counts.recount) {
        totals.0.retain(|series, &mut n| {
            if n > MAX_COUNT {
                let record = || serde_json::to_string(&(series, n)).unwrap_or_default();
                damage.get_or_insert_with(|| format!("{}, more than {MAX_COUNT}", record()));
            }
            n <= MAX_COUNT
        });
    }
    damage
}

/// Counts `event` into `totals`; false for a new series beyond
/// [`MAX_SERIES`], which is not counted.
fn count(totals: &mut Totals, event: Event, gpus: &BTreeMap<BusId, String>) -> bool {
    let of = |bus: BusId| match gpus.get(&bus) {
        Some(uuid) => XidOf::Gpu(uuid.clone()),
        None => XidOf::Bus(bus.into_string()),
    };
    let series = match event {
        Event::Xid { bus, code } => Series::Xid { id: of(bus), code },
        Event::FallenOffBus { bus } => Series::FallenOffBus { id: of(bus) },
        Event::SXid {
            switch,
            bus,
            code,
            severity,
        } => Series::Sxid {
            switch,
            pci_bus_id: bus.into_string(),
            code,
            severity: severity.into(),
        },
    };
    if !totals.0.contains_key(&series) && totals.0.len() >= MAX_SERIES {
        return false;
    }
    let total = totals.0.entry(series).or_default();
    *total = total.saturating_add(1).min(MAX_COUNT);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectors::xid::XID_ERRORS;

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
        assert!(super::count(totals, event, &gpus()));
    }

    fn gpu_a(totals: &Totals, code: u32) -> Option<u64> {
        totals.0.get(&xid_of("GPU-a", code)).copied()
    }

    fn xid_of(uuid: &str, code: u32) -> Series {
        let id = XidOf::Gpu(uuid.into());
        Series::Xid { id, code }
    }

    /// Past the bound a new series is refused; the first series, and the
    /// counts of any series already there, go on.
    #[test]
    fn new_series_beyond_the_bound_are_refused_not_the_first() {
        let mut totals = Totals::default();
        let unattributed = |n: u32| Event::FallenOffBus {
            bus: BusId::parse(&format!("{:04x}:{:02x}:00", n >> 8, n & 0xff)).unwrap(),
        };
        count(&mut totals, xid(79));
        for n in 1..MAX_SERIES as u32 {
            count(&mut totals, unattributed(n));
        }
        assert_eq!(totals.0.len(), MAX_SERIES);
        assert!(!super::count(&mut totals, unattributed(99_999), &gpus()));
        assert!(!super::count(&mut totals, xid(13), &gpus()));
        assert!(super::count(&mut totals, xid(79), &gpus()));
        assert_eq!(gpu_a(&totals, 79), Some(2));
        assert_eq!(totals.0.len(), MAX_SERIES);
    }

    #[test]
    fn counts_saturate_and_impossible_stored_counts_are_damage() {
        let mut counts = Counts::default();
        for code in [79, 13] {
            counts.totals.0.insert(xid_of("GPU-a", code), MAX_COUNT);
        }
        count(&mut counts.totals, xid(79));
        assert_eq!(gpu_a(&counts.totals, 79), Some(MAX_COUNT));
        assert_eq!(take_damage(&mut counts), None);
        counts.totals.0.insert(xid_of("GPU-a", 79), u64::MAX);
        let sxid = Series::Sxid {
            switch: 3,
            pci_bus_id: "00000000:04:00".into(),
            code: 22013,
            severity: "non_fatal".into(),
        };
        counts.totals.0.insert(sxid.clone(), MAX_COUNT + 1);
        let fallen = Series::FallenOffBus {
            id: XidOf::Bus("00000000:B3:00".into()),
        };
        counts.recount = Some(Totals([(fallen, MAX_COUNT + 2)].into()));
        let damage = take_damage(&mut counts).unwrap();
        assert_eq!(
            damage,
            r#"[{"xid":{"id":{"gpu":"GPU-a"},"code":79}},18446744073709551615], more than 4294967296"#
        );
        assert_eq!(gpu_a(&counts.totals, 79), None);
        assert_eq!(gpu_a(&counts.totals, 13), Some(MAX_COUNT));
        assert!(!counts.totals.0.contains_key(&sxid));
        assert_eq!(counts.recount, Some(Totals::default()));
        // Each kind of series describes itself.
        let mut alone = Counts::default();
        alone.totals.0.insert(sxid, u64::MAX);
        let damage = take_damage(&mut alone).unwrap();
        let sxid = r#"[{"sxid":{"switch":3,"pci_bus_id":"00000000:04:00","code":22013,"#;
        assert!(damage.starts_with(sxid), "{damage}");
        alone.recount = Some(Totals(
            [(
                Series::FallenOffBus {
                    id: XidOf::Bus("B".into()),
                },
                u64::MAX,
            )]
            .into(),
        ));
        let damage = take_damage(&mut alone).unwrap();
        assert!(
            damage.starts_with(r#"[{"fallen_off_bus":{"id":{"bus":"B"}}},"#),
            "{damage}"
        );
        // The largest possible file stays exact and plausible.
        let most = (MAX_COUNT * 10_000) as f64;
        assert!(most < 2f64.powi(53));
        assert!(XID_ERRORS.family().plausible().contains(&most));
    }

    #[test]
    fn a_complete_recount_replaces_the_totals_but_never_lowers_them() {
        let mut counts = Counts::default();
        for code in [79, 79, 13] {
            count(&mut counts.totals, xid(code));
        }
        counts.position.cursor = Some("c".into());
        counts.start_recount();
        assert_eq!(counts.position, Position::default());
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
        let bus_id = |id: &str| XidOf::Bus(id.into());
        let expected = [
            (xid_of("GPU-a", 79), 2),
            (
                Series::Xid {
                    id: bus_id("00000000:99:00"),
                    code: 79,
                },
                1,
            ),
            (
                Series::FallenOffBus {
                    id: XidOf::Gpu("GPU-a".into()),
                },
                1,
            ),
            (
                Series::FallenOffBus {
                    id: bus_id("00000000:B3:00"),
                },
                1,
            ),
            (
                Series::Sxid {
                    switch: 3,
                    pci_bus_id: "00000000:04:00".into(),
                    code: 22013,
                    severity: "non_fatal".into(),
                },
                2,
            ),
        ];
        assert_eq!(totals, Totals(expected.into()));
    }
}
