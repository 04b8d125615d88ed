//! XIDs, SXids and GPUs fallen off the bus, counted exactly between runs from
//! the kernel log's events ([`crate::kernel_log`]).
//!
//! A run reads the events logged since the previous run's position, counts
//! them into running totals kept in the state (host entries under `xid.`):
//! XIDs and fallen-off-the-bus lines by GPU (the PCI bus id in the line
//! against the bus ids of the snapshot's GPUs; unattributed by bus id when
//! none matches), SXids by switch, bus id, code and severity. The state is
//! per boot, so the totals start at 0 each boot and never go backwards.
//!
//! No double counting: the position names the last entry read. Should
//! journalctl fail with the saved cursor while a read from the time of its
//! entry works (journalctl says no more: it exits 1 for a refused cursor as
//! for a journal it cannot open), the read goes on from that time.
//!
//! Recounting: where no position is left (the cursor refused and no time of
//! its entry kept) or a stored count is impossible (above [`MAX_COUNT`], not a
//! number), this boot's kernel log is recounted from its start into separate
//! totals (`xid.recount.*`), while the counts known before stay published, so
//! no series goes backwards (`increase()` would take that for a reset). When
//! the recount reaches the end of the log, each count becomes the larger of
//! the two. That is exact: the totals are this boot's, so a read from the
//! boot's start sees every line the old ones counted plus those since; only
//! if journald already vacuumed the start of this boot can the recount be
//! lower, and the old count is then the better bound.

use std::collections::BTreeMap;
use std::time::Instant;

use super::hooks::HostRun;
use crate::kernel_log::{self, normalize_bus_id, Ended, Event, Position, Severity, Source};
use crate::metrics;
use crate::snapshot::Snapshot;
use crate::state::boot_id;

/// The most events one series can count in one boot. An XID is a kernel line
/// of about 100 bytes; 2^32 of them would be one every 7 ms for a year and
/// over 400 GB of kernel log, so a stored count above this is a damaged
/// state. Counting saturates here. The sum over all codes (at most 10,000)
/// stays below 2^53, exact as an `f64` and within `Family::plausible`.
pub const MAX_COUNT: u64 = 1 << 32;

/// The prefix of every state entry of this module.
pub const STATE_PREFIX: &str = "xid.";

/// Whose series a GPU's event counts on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    /// The GPU with this UUID.
    Gpu(String),
    /// No GPU of the snapshot: this normalised bus id.
    Bus(String),
}

/// One counted series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Series {
    Xid(Owner, u32),
    FallenOffBus(Owner),
    SXid {
        switch: u32,
        bus: String,
        code: u32,
        severity: Severity,
    },
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
    /// The totals published: every event of this boot up to the position
    /// (while no recount is under way).
    pub totals: Totals,
    /// A recount of this boot from its start, under way.
    pub recount: Option<Totals>,
}

/// The xid collector's host step: counts the events logged since the previous
/// run into the totals and adds them to the snapshot. It runs only after NVML
/// was read, whose GPUs' bus ids attribute the events. While no kernel log
/// can be read the position and totals stay, so nothing is counted twice
/// when it is back. An error says why this run did not read the log to its
/// end (logged here); the counts known are published all the same.
pub fn collect(run: &mut HostRun<'_>) -> Result<(), String> {
    let Some(boot_id) = boot_id() else {
        // No state was loaded either (see `state::boot_id`).
        let error = "cannot read this boot's id: the kernel log and the state cannot be told \
                     to be this boot's";
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
    /// (attributed to `gpus`: normalised bus id → UUID) and moving the
    /// position, falling back as the module doc says.
    pub fn read(
        &mut self,
        source: &Source,
        gpus: &BTreeMap<String, String>,
        boot_id: &str,
        until: Instant,
    ) -> Result<(), String> {
        self.unavailable = false;
        if self.source != source.label() {
            let previous = std::mem::replace(&mut self.source, source.label().into());
            self.position = Position::default();
            if !previous.is_empty() {
                // Lines counted from the other source would be counted again.
                log::info!("kernel log source changed from {previous} to {} during this boot; counting new lines only", source.label());
                self.recount = None;
                let skipped =
                    kernel_log::read(source, &mut self.position, boot_id, until, &mut |_| {});
                return self.finish(skipped);
            }
        }
        let mut tries = vec![self.clone()];
        if self.position.cursor.is_some() {
            let mut by_time = self.clone();
            by_time.position.cursor = None;
            if by_time.position.monotonic.is_some() {
                tries.push(by_time);
            }
            let mut recount = self.clone();
            recount.start_recount();
            tries.push(recount);
        }
        let mut first_error = None;
        for mut attempt in tries {
            let into = attempt.recount.as_mut().unwrap_or(&mut attempt.totals);
            let read = kernel_log::read(
                source,
                &mut attempt.position,
                boot_id,
                until,
                &mut |event| {
                    count(into, event, gpus);
                },
            );
            match read {
                Err(error) => {
                    first_error.get_or_insert(error);
                }
                Ok(ended) => {
                    if let Some(error) = first_error {
                        let now = match attempt.recount {
                            Some(_) => "recounting this boot's kernel log from its start",
                            None => "read on from the time of the last line counted",
                        };
                        log::warn!("journalctl refused the saved cursor ({error}); {now}");
                    }
                    *self = attempt;
                    return self.finish(Ok(ended));
                }
            }
        }
        let error = first_error.expect("one read was tried").to_string();
        log::warn!("cannot count XID errors: {error}; publishing the counts known so far");
        Err(error)
    }

    /// Ends a read: a complete one ends a recount under way (every total
    /// becomes the larger of the two); a cut one says why.
    fn finish(&mut self, read: Result<Ended, kernel_log::Error>) -> Result<(), String> {
        let why = match read.map_err(|e| e.to_string())? {
            Ended::Complete => {
                for (series, count) in self.recount.take().into_iter().flatten() {
                    let total = self.totals.entry(series).or_default();
                    *total = (*total).max(count);
                }
                return Ok(());
            }
            Ended::Deadline => {
                "reading the kernel log did not finish by the run's deadline".to_owned()
            }
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
        let mut counts = Counts::default();
        let mut damage = None;
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
                    let (into, key) = match key.strip_prefix("recount.") {
                        Some(key) => (counts.recount.get_or_insert_with(Totals::default), key),
                        None => (&mut counts.totals, key),
                    };
                    let Some(series) = series_of(key) else {
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
        let mut host = BTreeMap::new();
        let mut set =
            |key: &str, value: String| drop(host.insert(format!("{STATE_PREFIX}{key}"), value));
        set("source", self.source.clone());
        let p = &self.position;
        p.cursor
            .iter()
            .for_each(|cursor| set("cursor", cursor.clone()));
        p.monotonic
            .iter()
            .for_each(|m| set("monotonic", m.to_string()));
        p.kmsg_seq
            .iter()
            .for_each(|seq| set("kmsg_seq", seq.to_string()));
        if self.unavailable {
            set("unavailable", "1".into());
        }
        if let Some(recount) = &self.recount {
            set("recount", "1".into());
            recount
                .iter()
                .for_each(|(s, n)| set(&format!("recount.{}", key_of(s)), n.to_string()));
        }
        self.totals
            .iter()
            .for_each(|(s, n)| set(&key_of(s), n.to_string()));
        host
    }
}

/// Counts `event` into `totals`, attributed to `gpus`; saturates at
/// [`MAX_COUNT`].
fn count(totals: &mut Totals, event: Event, gpus: &BTreeMap<String, String>) {
    let owner = |bus: String| match gpus.get(&bus) {
        Some(uuid) => Owner::Gpu(uuid.clone()),
        None => Owner::Bus(bus),
    };
    let series = match event {
        Event::Xid { bus, code } => Series::Xid(owner(bus), code),
        Event::FallenOffBus { bus } => Series::FallenOffBus(owner(bus)),
        Event::SXid {
            switch,
            bus,
            code,
            severity,
        } => Series::SXid {
            switch,
            bus,
            code,
            severity,
        },
    };
    let total = totals.entry(series).or_default();
    *total = total.saturating_add(1).min(MAX_COUNT);
}

/// A series' state key (after the prefix): `gpu.<uuid>.<code>`,
/// `bus.<bus id>.<code>`, `fallen.gpu.<uuid>`, `fallen.bus.<bus id>`,
/// `sxid.<switch>.<bus id>.<code>.<severity>`. UUIDs and bus ids hold no dot.
fn key_of(series: &Series) -> String {
    let owner = |owner: &Owner| match owner {
        Owner::Gpu(uuid) => format!("gpu.{uuid}"),
        Owner::Bus(bus) => format!("bus.{bus}"),
    };
    match series {
        Series::Xid(who, code) => format!("{}.{code}", owner(who)),
        Series::FallenOffBus(who) => format!("fallen.{}", owner(who)),
        Series::SXid {
            switch,
            bus,
            code,
            severity,
        } => {
            format!("sxid.{switch}.{bus}.{code}.{}", severity.label())
        }
    }
}

/// The series of a state key ([`key_of`]); `None` if it is none.
fn series_of(key: &str) -> Option<Series> {
    let owner = |kind: &str, id: &str| match kind {
        "gpu" => Some(Owner::Gpu(id.to_owned())),
        "bus" => Some(Owner::Bus(id.to_owned())),
        _ => None,
    };
    let parts: Vec<&str> = key.split('.').collect();
    Some(match parts[..] {
        ["fallen", kind, id] => Series::FallenOffBus(owner(kind, id)?),
        ["sxid", switch, bus, code, severity] => Series::SXid {
            switch: switch.parse().ok()?,
            bus: bus.to_owned(),
            code: code.parse().ok()?,
            severity: Severity::from_label(severity)?,
        },
        [kind, id, code] => Series::Xid(owner(kind, id)?, code.parse().ok()?),
        _ => return None,
    })
}

/// Adds the samples: for every GPU of the snapshot with a UUID its XID total
/// and fallen-off-the-bus count (0 until the first, so that `increase()` sees
/// it) and its XIDs by code; the unattributed and SXid series as host
/// samples. Down GPUs keep theirs: the counts come from the kernel log. A
/// recount under way is not published (see the module doc).
pub fn add_samples(counts: &Counts, snapshot: &mut Snapshot) {
    for device in snapshot.devices.iter_mut().filter(|d| !d.uuid.is_empty()) {
        let gpu = Owner::Gpu(device.uuid.clone());
        let codes = counts
            .totals
            .range(Series::Xid(gpu.clone(), 0)..=Series::Xid(gpu.clone(), u32::MAX));
        let codes: Vec<(u32, u64)> = codes
            .filter_map(|(series, n)| match series {
                Series::Xid(_, code) => Some((*code, *n)),
                _ => None,
            })
            .collect();
        let total = codes
            .iter()
            .fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
        let fallen = counts
            .totals
            .get(&Series::FallenOffBus(gpu))
            .copied()
            .unwrap_or(0);
        let samples = &mut device.samples;
        samples.push(metrics::XID_ERRORS.sample(total as f64));
        for (code, n) in codes {
            samples.push(metrics::XID_ERRORS_BY_CODE.sample_with([code.to_string()], n as f64));
        }
        samples.push(metrics::FALLEN_OFF_BUS.sample(fallen as f64));
    }
    for (series, n) in &counts.totals {
        let n = *n as f64;
        snapshot.host.push(match series {
            Series::Xid(Owner::Bus(bus), code) => {
                metrics::XID_UNATTRIBUTED.sample_with([bus.clone(), code.to_string()], n)
            }
            Series::FallenOffBus(Owner::Bus(bus)) => {
                metrics::FALLEN_OFF_BUS_UNATTRIBUTED.sample_with([bus.clone()], n)
            }
            Series::SXid {
                switch,
                bus,
                code,
                severity,
            } => metrics::NVSWITCH_SXID_ERRORS.sample_with(
                [
                    switch.to_string(),
                    bus.clone(),
                    code.to_string(),
                    severity.label().to_owned(),
                ],
                n,
            ),
            Series::Xid(Owner::Gpu(_), _) | Series::FallenOffBus(Owner::Gpu(_)) => continue,
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
