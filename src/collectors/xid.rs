//! XIDs, SXids and GPUs fallen off the bus, counted exactly between runs from
//! the kernel log's events into this boot's totals in the state: XIDs and
//! fallen-off lines by GPU (else unattributed by bus id), SXids by switch, bus
//! id, code and severity. Without a position or with a damaged count, the
//! boot is recounted into `recount` while the old totals stay published; a
//! complete recount raises each total to it (docs/design.md, "Recovery").

use std::collections::BTreeMap;

use crate::collector::{HostError, HostRun};
use crate::kernel_log::{BusId, Error, Event, Position, Source};
use crate::metrics::families;
use crate::snapshot::Snapshot;
use crate::state::schema::{
    Series, XidCounts as Counts, XidOf, XidTotals as Totals, MAX_XID_SERIES,
};

families! {
    FAMILIES;
    XID_ERRORS: Counter(Count), "nvidia_gpu_xid_errors_total", [],
        "XID errors the NVIDIA driver logged for this GPU in the kernel log during this boot; 0 until the first.";
    XID_ERRORS_BY_CODE: Counter(Count), "nvidia_gpu_xid_errors_by_code_total", ["code"],
        "XID errors logged for this GPU during this boot, by XID code; a code appears when it is first logged.";
    XID_UNATTRIBUTED: Counter(Count), "nvidia_gpu_xid_unattributed_errors_total", ["pci_bus_id", "code"],
        "XID errors logged during this boot for a PCI bus id that matches no GPU NVML reports, by bus id (domain:bus:device) and code.";
    FALLEN_OFF_BUS: Counter(Count), "nvidia_gpu_fallen_off_bus_total", [],
        "Kernel lines of this boot saying this GPU has fallen off the bus, outside an Xid line (the driver may log one without an Xid 79); 0 until the first.";
    FALLEN_OFF_BUS_UNATTRIBUTED: Counter(Count), "nvidia_gpu_fallen_off_bus_unattributed_total", ["pci_bus_id"],
        "Kernel lines of this boot saying a GPU has fallen off the bus, for a PCI bus id that matches no GPU NVML reports (one that fell off before it enumerated), by bus id (domain:bus:device).";
    NVSWITCH_SXID_ERRORS: Counter(Count), "nvidia_gpu_nvswitch_sxid_errors_total", ["switch", "pci_bus_id", "code", "sxid_severity"],
        "SXid errors the NVSwitch driver logged during this boot, by switch (N of nvidia-nvswitchN), its PCI bus id (domain:bus:device), SXid code and severity (fatal, non_fatal, correctable); a series appears at its first count.";
}

/// The most events one series counts in one boot (one every 7 ms for a
/// year): a stored count above it is damage. Counting saturates here.
const MAX_COUNT: u64 = 1 << 32;

/// Why a run counted nothing: the state cannot be used this run.
#[derive(Debug)]
pub struct StateUnusable;

impl std::fmt::Display for StateUnusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the state cannot be used this run; the XID counts are left out")
    }
}

impl std::error::Error for StateUnusable {}

/// Why a run did not count every line: this many were of new series beyond
/// [`MAX_XID_SERIES`] (the series counted before stay).
#[derive(Debug)]
pub struct Beyond(u64);

impl std::fmt::Display for Beyond {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} kernel line(s) of new XID or SXid series beyond the bound of {MAX_XID_SERIES} \
             series were not counted; the series counted before are kept",
            self.0
        )
    }
}

impl std::error::Error for Beyond {}

/// The xid collector's host step (after NVML was read, whose GPUs' bus ids
/// attribute the events): counts the events logged since the previous run and
/// adds the totals to the snapshot; the counts known are published anyway.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), HostError> {
    if !run.state.continues_totals() {
        // Counts from nothing would publish a reset, then a jump.
        return Err(StateUnusable.into());
    }
    // Whenever totals continue, the state's boot id is this boot's.
    let boot_id = run.state.previous().boot_id.clone();
    let mut counts = run.state.previous().xid.clone();
    if let Some(damage) = take_damage(&mut counts) {
        log::warn!(
            "the state holds an impossible XID count ({damage}); ignoring it and recounting \
             this boot's kernel log from its start"
        );
        counts.start_recount();
    }
    let source = Source::choose(run.journal_dir);
    let mut refused = 0;
    let result = source.and_then(|source| counts.read(&source, run, &boot_id, &mut refused));
    if matches!(result, Err(Error::NoSource)) && !std::mem::replace(&mut counts.unavailable, true) {
        let none = Error::NoSource;
        log::warn!("cannot count XID errors: {none}; publishing the counts known so far");
    }
    add_samples(&counts, run.snapshot);
    run.state.set_xid(counts);
    result?;
    if refused > 0 {
        let beyond = Beyond(refused);
        log::warn!("{beyond}");
        return Err(beyond.into());
    }
    Ok(())
}

impl Counts {
    /// Reads `source` from the position until the run's deadline, counting its
    /// events: from the saved cursor; if that fails, from its entry's time;
    /// then, recounting, from the boot's start. The first read that works
    /// counts; if none does, nothing changes. `refused` counts the events
    /// of new series beyond the bound.
    fn read(
        &mut self,
        source: &Source,
        run: &HostRun<'_>,
        boot_id: &str,
        refused: &mut u64,
    ) -> Result<(), Error> {
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
        // By bus id; a GPU without a UUID or bus id takes no events.
        let devices = run.snapshot.devices.iter().filter(|d| !d.uuid.is_empty());
        let gpus = devices
            .filter_map(|d| Some((BusId::parse(&d.pci_bus_id)?, d.uuid.clone())))
            .collect();
        let mut first_error = None;
        for (mut attempt, now) in tries {
            let into = attempt.recount.as_mut().unwrap_or(&mut attempt.totals);
            let at = &mut attempt.position;
            *refused = 0;
            let mut on_event = |e| *refused += u64::from(!count(into, e, &gpus));
            match source.read(at, boot_id, run.until, &mut on_event) {
                Err(e) if !matches!(e, Error::Deadline | Error::Bound | Error::Lost(_)) => {
                    first_error.get_or_insert(e);
                }
                read => {
                    if let Some(error) = first_error {
                        log::warn!("journalctl refused the saved cursor ({error}); {now}");
                    }
                    *self = attempt;
                    return self.finish(read);
                }
            }
        }
        let error = first_error.expect("one read was tried");
        log::warn!("cannot count XID errors: {error}; publishing the counts known so far");
        Err(error)
    }

    /// Ends a read: one that reached the end ends a recount under way
    /// (each total becomes the larger of the two); a cut one says why.
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
            let room = self.totals.0.len() < MAX_XID_SERIES;
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

/// Drops every count above [`MAX_COUNT`] and describes the first, if any, by
/// its record in the state.
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

/// Counts `event` (attributed to `gpus`: bus id → UUID) into `totals`,
/// saturating at [`MAX_COUNT`]; false for a new series beyond
/// [`MAX_XID_SERIES`], which is not counted (the first series stay).
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
    if !totals.0.contains_key(&series) && totals.0.len() >= MAX_XID_SERIES {
        return false;
    }
    let total = totals.0.entry(series).or_default();
    *total = total.saturating_add(1).min(MAX_COUNT);
    true
}

/// Adds the samples: for every GPU of the snapshot with a UUID (down ones
/// too) its XID total and fallen-off-the-bus count (0 until the first) and
/// its XIDs by code; the unattributed and SXid series as host samples. A
/// recount under way is not published.
fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    let totals = &counts.totals.0;
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let gpu = XidOf::Gpu(device.uuid.clone());
        let (mut total, samples) = (0, &mut device.samples);
        for (code, n) in totals.iter().filter_map(|(series, &n)| match series {
            Series::Xid { id, code } if *id == gpu => Some((code, n)),
            _ => None,
        }) {
            total += n;
            samples.push(XID_ERRORS_BY_CODE.sample_with([code.to_string()], n as f64));
        }
        samples.push(XID_ERRORS.sample(total as f64));
        let fallen = totals.get(&Series::FallenOffBus { id: gpu }).copied();
        samples.push(FALLEN_OFF_BUS.sample(fallen.unwrap_or(0) as f64));
    }
    for (series, n) in totals.iter().map(|(series, &n)| (series, n as f64)) {
        snapshot.host.push(match series {
            Series::Xid {
                id: XidOf::Bus(bus),
                code,
            } => XID_UNATTRIBUTED.sample_with([bus.clone(), code.to_string()], n),
            Series::FallenOffBus {
                id: XidOf::Bus(bus),
            } => FALLEN_OFF_BUS_UNATTRIBUTED.sample_with([bus.clone()], n),
            Series::Sxid {
                switch,
                pci_bus_id,
                code,
                severity,
            } => {
                let (switch, code) = (switch.to_string(), code.to_string());
                let labels = [switch, pci_bus_id.clone(), code, severity.clone()];
                NVSWITCH_SXID_ERRORS.sample_with(labels, n)
            }
            _ => continue,
        });
    }
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
        for n in 1..MAX_XID_SERIES as u32 {
            count(&mut totals, unattributed(n));
        }
        assert_eq!(totals.0.len(), MAX_XID_SERIES);
        assert!(!super::count(&mut totals, unattributed(99_999), &gpus()));
        assert!(!super::count(&mut totals, xid(13), &gpus()));
        assert!(super::count(&mut totals, xid(79), &gpus()));
        assert_eq!(gpu_a(&totals, 79), Some(2));
        assert_eq!(totals.0.len(), MAX_XID_SERIES);
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
