//! A GPU's task accounting from run to run: the state it keeps ([`Ledger`])
//! and the pure step from one run to the next ([`account`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::allocation::Edge;
use crate::owner::Owner;
use crate::snapshot::BusyWindow as Window;

/// A task on a GPU: who, and on which MIG instance (where NVML says).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Holder {
    pub task: Owner,
    pub gpu_instance_id: Option<u32>,
}

/// One holder's running totals on one GPU; the times at most [`MAX_US`],
/// the energy at most [`MAX_MJ`] (adding stops there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// SM-busy time: the GPU's busy time by the holder's share, µs.
    pub busy_us: u64,
    /// Energy by the holder's share of the busy time, mJ.
    pub energy_mj: u64,
    /// Time a process of the holder was listed on the GPU, µs.
    pub held_us: u64,
    /// Time the GPU (or its MIG instance) was allocated to the holder, µs.
    pub allocated_us: u64,
    /// The most device memory its processes held at a run, bytes.
    pub memory_peak_bytes: u64,
    /// XIDs the GPU logged in the windows the holder held or was given it.
    pub xid_errors: u64,
    /// When it last held the GPU or was charged, µs after boot.
    pub seen_us: u64,
    /// Its busy time is known: a window in which NVML gave the GPU's
    /// processes their shares counted it (it held the GPU or had a share).
    /// Never unset: a holder's busy series does not come and go.
    pub measured: bool,
}

/// A GPU's task accounting as one run leaves it for the next. `at_us` 0: no
/// run to count from (the next run only sets the baseline). Its totals
/// within their bounds ([`Ledger::implausible`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ledger {
    /// When the run it is up to took place, µs after boot (the state is a
    /// boot's).
    pub at_us: u64,
    /// The GPU's energy counter at the last run that read it, mJ: the
    /// baseline of the energy still to charge.
    pub energy_mj: Option<u64>,
    /// Energy of windows (or their parts) no known holder used, mJ.
    pub unattributed_mj: u64,
    pub totals: Vec<(Holder, Totals)>,
    /// The processes listed at that run: pid, start time (µs after boot),
    /// its holder's index in `totals`; how a share NVML gives a pid
    /// that has since exited or been reused finds the holder it ran for.
    pub processes: Vec<(u32, u64, usize)>,
    /// A holder was refused for [`MAX_HOLDERS`] (said once, when it began).
    pub refused: bool,
    /// The GPU's XIDs counted up to that run, where they were counted.
    pub xids: Option<u64>,
}

impl Ledger {
    /// Within the bounds, each process naming a holder it has.
    pub fn is_bounded(&self) -> bool {
        let holders = self.totals.len();
        holders <= MAX_HOLDERS
            && self.processes.len() <= MAX_PROCESSES
            && self.processes.iter().all(|&(_, _, at)| at < holders)
    }

    /// The first total past its bound: one no GPU reaches (the ledger is
    /// damaged, and adding to it could wrap).
    pub fn implausible(&self) -> Option<Implausible> {
        let check =
            |what, value, bound| (value > bound).then_some(Implausible { what, value, bound });
        let holder = |t: &Totals| {
            check("a task's busy time (µs)", t.busy_us, MAX_US)
                .or_else(|| check("a task's time held (µs)", t.held_us, MAX_US))
                .or_else(|| check("a task's time allocated (µs)", t.allocated_us, MAX_US))
                .or_else(|| check("a task's energy (mJ)", t.energy_mj, MAX_MJ))
        };
        check("the unattributed energy (mJ)", self.unattributed_mj, MAX_MJ)
            .or_else(|| self.totals.iter().find_map(|(_, t)| holder(t)))
    }
}

/// A ledger's total past its bound.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {value}, more than {bound}")]
pub struct Implausible {
    what: &'static str,
    value: u64,
    bound: u64,
}

/// The most holders a GPU's ledger keeps (past it, new ones are not counted).
pub const MAX_HOLDERS: usize = 256;
/// The most processes a GPU's ledger remembers.
pub const MAX_PROCESSES: usize = 1024;
/// How long a holder's series stay after it last held the GPU: every
/// scrape interval up to this sees its last increment.
pub const LINGER_US: u64 = 10 * 60 * 1_000_000;
/// The most a time total reaches, µs: a century (a state is one boot's).
pub const MAX_US: u64 = 100 * 365 * 86_400 * 1_000_000;
/// The most an energy total reaches, mJ: a century at 10 kW (10 mJ a µs),
/// more than any GPU draws.
pub const MAX_MJ: u64 = MAX_US * 10;

/// Adds `more` to `total`, stopping at `bound`.
fn add(total: &mut u64, more: u64, bound: u64) {
    *total = total.saturating_add(more).min(bound);
}

/// What adds `more` to the total `field` picks, stopping at `bound`.
fn adding(field: fn(&mut Totals) -> &mut u64, more: u64, bound: u64) -> impl Fn(&mut Totals) {
    move |totals| add(field(totals), more, bound)
}

/// `of` by `share` parts of `all`: at most `of` where `share` is part of `all`.
fn part(of: u64, share: u64, all: u64) -> u64 {
    (u128::from(of) * u128::from(share) / u128::from(all)) as u64
}

/// `first` plus every one of `more`, stopping at `u64::MAX`.
fn sum<'a>(first: u64, more: impl IntoIterator<Item = &'a u64>) -> u64 {
    more.into_iter()
        .fold(first, |all, &s| all.saturating_add(s))
}

/// A process of this run as the host step knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub pid: u32,
    /// Listed by NVML now (it holds the GPU); else only its share is known.
    pub listed: bool,
    /// The holder of the process now running as `pid`, and its start time.
    pub now: Option<(Holder, u64)>,
    /// Its mean share of the window (0-1) and NVML's newest sample time of
    /// it (µs after boot).
    pub share: Option<(f64, u64)>,
}

/// A holder the scheduler gave the GPU (or a MIG instance of it): from
/// `start` to `end` where the source knows them, else over the whole window.
#[derive(Debug, Clone, PartialEq)]
pub struct Given {
    pub holder: Holder,
    pub start: Option<Edge>,
    pub end: Option<Edge>,
    /// The whole GPU, not shared (no replica, no MIG instance): its energy
    /// over the allocation is the holder's, idle included, where no other
    /// holder's allocation overlaps it.
    pub whole: bool,
}

/// Advances `previous` to the run at `now_us`:
/// - busy: each holder's share of the window's busy time;
/// - energy: the energy since the baseline (the counter at the last run
///   that read it: a run that cannot read it charges nothing and keeps the
///   baseline, so the next reading charges all of it) split by this run's
///   shares; all of it to the only holder of a window without busy time; to
///   nobody (`unattributed_mj`) where no known holder used it;
/// - held: the time since the previous run or the process's start;
/// - XIDs: the GPU's XIDs of the window (counted this run and at the
///   previous one), to every holder that held or was given it;
/// - allocated: the part of the window inside each [`Given`]'s edges. The
///   energy between the edges of a whole GPU given to one holder alone is
///   that holder's (the counter's readings at the edges, else its value
///   there interpolated in time); the rest of the window's energy goes by
///   the shares of the other holders as above, a given holder counting as
///   holding the GPU.
///
/// A share is the holder's of the process at its pid if that started before
/// NVML last saw the pid busy, else the holder the previous run knew at the
/// pid (it exited or the pid was reused), else nobody's. Nothing is added
/// where `previous` has no run, or the energy counter went back (a driver
/// reload): those only set the baseline. A window with shares marks its
/// holders [`Totals::measured`]. Totals stop at their bounds; holders gone
/// for [`LINGER_US`] are dropped. The next ledger's `refused`: a holder
/// was not counted this run for [`MAX_HOLDERS`].
pub fn account(
    previous: &Ledger,
    now_us: u64,
    energy_mj: Option<u64>,
    window: Option<Window>,
    seen: &[Seen],
    given: &[Given],
    xids: Option<u64>,
) -> Ledger {
    // A ledger written before `measured`: a holder with busy time had it.
    let upgraded = |t: &Totals| Totals {
        measured: t.measured || t.busy_us > 0,
        ..*t
    };
    let mut totals: BTreeMap<Holder, Totals> = previous
        .totals
        .iter()
        .map(|(holder, t)| (holder.clone(), upgraded(t)))
        .collect();
    let mut refused = false;
    // Adds to a holder's totals; false (and nothing added) for a new holder
    // past the bound.
    let mut charge = |holder: &Holder, add: &dyn Fn(&mut Totals)| {
        if totals.len() >= MAX_HOLDERS && !totals.contains_key(holder) {
            refused = true;
            return false;
        }
        let entry = totals.entry(holder.clone()).or_default();
        add(entry);
        entry.seen_us = now_us;
        true
    };
    let counting = previous.at_us != 0 && previous.at_us < now_us;
    let earlier = |pid: u32| {
        let &(_, _, at) = previous.processes.iter().find(|p| p.0 == pid)?;
        Some(&previous.totals.get(at)?.0)
    };
    let ran_for = |process: &Seen, last_us: u64| match &process.now {
        Some((holder, start)) if *start <= last_us => Some(holder.clone()),
        _ => earlier(process.pid).cloned(),
    };
    // Shares in parts per million, so that the parts add up exactly.
    let mut shares: BTreeMap<Holder, u64> = BTreeMap::new();
    let mut unknown: u64 = 0;
    for process in seen {
        if let Some((share, last_us)) = process.share.filter(|&(share, _)| share > 0.0) {
            let share = (share * 1e6).round() as u64;
            let to = match ran_for(process, last_us) {
                Some(holder) => shares.entry(holder).or_default(),
                None => &mut unknown,
            };
            *to = to.saturating_add(share);
        }
    }
    let (since_us, spans) = (previous.at_us, spans(given, previous.at_us, now_us));
    let alone = alone(&spans);
    let mut holding: Vec<&Holder> = seen
        .iter()
        .filter(|p| p.listed)
        .filter_map(|p| p.now.as_ref().map(|(holder, _)| holder))
        .chain(spans.iter().map(|(g, _, _)| &g.holder))
        .collect();
    holding.sort();
    holding.dedup();
    let mut unattributed_mj = previous.unattributed_mj.min(MAX_MJ);
    if counting {
        let all = sum(unknown, shares.values());
        if let Some(window) = window.filter(|_| all > 0) {
            let unread = unread_busy(window);
            for (holder, &share) in &shares {
                // Time the buffer lost is estimated only for a task that
                // held the GPU at the previous run, when that time began.
                let held_then = previous
                    .processes
                    .iter()
                    .any(|&(_, _, at)| previous.totals.get(at).is_some_and(|(h, _)| h == holder));
                let estimated = if held_then { unread } else { 0 };
                let busy =
                    part(window.busy_us, share, all).saturating_add(part(estimated, share, all));
                charge(holder, &adding(|t| &mut t.busy_us, busy, MAX_US));
            }
        }
        let counter = match (previous.energy_mj, energy_mj) {
            (Some(before), Some(now)) if now >= before => Some(Counter {
                from: (since_us, before),
                to: (now_us, now),
            }),
            _ => None,
        };
        let spent = counter.map_or(0, |c| c.to.1 - c.from.1);
        let mut given_mj: u64 = 0;
        // A whole GPU given to one holder alone: its energy between the edges.
        for &(g, from, to) in spans.iter().filter(|(g, _, _)| alone.contains(&&g.holder)) {
            let Some(counter) = counter else { break };
            let mj = counter
                .at(to)
                .saturating_sub(counter.at(from))
                .min(spent - given_mj);
            if charge(&g.holder, &adding(|t| &mut t.energy_mj, mj, MAX_MJ)) {
                given_mj += mj;
            }
        }
        // The rest by the other holders' shares.
        let rest = spent - given_mj;
        let others: Vec<(&Holder, &u64)> = shares
            .iter()
            .filter(|(holder, _)| !alone.contains(holder))
            .collect();
        let all_others = sum(unknown, others.iter().map(|&(_, share)| share));
        let idle: Vec<&&Holder> = holding.iter().filter(|h| !alone.contains(h)).collect();
        if all_others > 0 {
            for &(holder, &share) in &others {
                let mj = part(rest, share, all_others);
                if charge(holder, &adding(|t| &mut t.energy_mj, mj, MAX_MJ)) {
                    given_mj = given_mj.saturating_add(mj);
                }
            }
        } else if let ([only], true) = (&idle[..], alone.is_empty()) {
            if charge(only, &adding(|t| &mut t.energy_mj, rest, MAX_MJ)) {
                given_mj = spent;
            }
        }
        add(&mut unattributed_mj, spent.saturating_sub(given_mj), MAX_MJ);
        for &holder in &holding {
            if let Some(held) = held_since(holder, seen, since_us, now_us) {
                charge(holder, &adding(|t| &mut t.held_us, held, MAX_US));
            }
        }
        let logged = match (previous.xids, xids) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => 0,
        };
        for holder in holding.iter().filter(|_| logged > 0) {
            charge(holder, &|t: &mut Totals| {
                t.xid_errors = t.xid_errors.saturating_add(logged);
            });
        }
        for &(g, from, to) in &spans {
            let allocated = to.0.saturating_sub(from.0);
            charge(
                &g.holder,
                &adding(|t| &mut t.allocated_us, allocated, MAX_US),
            );
        }
    } else {
        for holder in &holding {
            charge(holder, &|_: &mut Totals| {});
        }
    }
    if window.is_some() {
        for holder in holding.iter().copied().chain(shares.keys()) {
            charge(holder, &|t: &mut Totals| t.measured = true);
        }
    }
    // Either way: a clock stepped back does not keep a holder for ever.
    totals.retain(|_, t| now_us.abs_diff(t.seen_us) <= LINGER_US);
    let totals: Vec<(Holder, Totals)> = totals.into_iter().collect();
    let processes = seen
        .iter()
        .filter(|p| p.listed)
        .filter_map(|p| {
            let (holder, start) = p.now.as_ref()?;
            let at = totals.iter().position(|(h, _)| h == holder)?;
            Some((p.pid, *start, at))
        })
        .take(MAX_PROCESSES)
        .collect();
    Ledger {
        at_us: now_us,
        energy_mj: energy_mj.or(previous.energy_mj),
        unattributed_mj,
        totals,
        processes,
        refused,
        xids: xids.or(previous.xids),
    }
}

/// A given holder's part of the window: its edges, each the instant and
/// the counter's reading there where known.
type Span<'g> = (&'g Given, (u64, Option<u64>), (u64, Option<u64>));

/// Each given holder's part of the window from `since_us` to `now_us`
/// (none for one whose allocation lies outside it).
fn spans(given: &[Given], since_us: u64, now_us: u64) -> Vec<Span<'_>> {
    let within = |edge: Option<Edge>, or: u64| match edge {
        Some(e) if e.at_us > since_us && e.at_us < now_us => (e.at_us, e.energy_mj),
        Some(e) if e.at_us <= since_us => (since_us, None),
        Some(_) => (now_us, None),
        None => (or, None),
    };
    given
        .iter()
        .map(|g| (g, within(g.start, since_us), within(g.end, now_us)))
        .filter(|(_, from, to)| to.0 > from.0)
        .collect()
}

/// The holders given the whole GPU whose spans no other holder's overlaps.
fn alone<'g>(spans: &[Span<'g>]) -> Vec<&'g Holder> {
    let overlaps = |a: &Span<'_>, b: &Span<'_>| a.1 .0 < b.2 .0 && b.1 .0 < a.2 .0;
    let shared = |a: &Span<'_>| {
        spans
            .iter()
            .any(|b| b.0.holder != a.0.holder && overlaps(a, b))
    };
    let mut alone: Vec<&Holder> = spans
        .iter()
        .filter(|a| a.0.whole && !shared(a))
        .map(|a| &a.0.holder)
        .collect();
    alone.dedup();
    alone
}

/// The energy counter at the window's two ends.
#[derive(Clone, Copy)]
struct Counter {
    from: (u64, u64),
    to: (u64, u64),
}

impl Counter {
    /// Its value at `edge`: the reading there if it lies between the ends',
    /// else interpolated in time.
    fn at(&self, (at_us, reading): (u64, Option<u64>)) -> u64 {
        let ((t0, e0), (t1, e1)) = (self.from, self.to);
        match reading {
            Some(mj) if (e0..=e1).contains(&mj) => mj,
            _ if at_us <= t0 => e0,
            _ if at_us >= t1 => e1,
            _ => e0 + part(e1 - e0, at_us - t0, t1 - t0),
        }
    }
}

/// The time `holder` held the GPU since the previous run (at `since_us`)
/// or its earliest listed process's start; `None` where it lists none.
fn held_since(holder: &Holder, seen: &[Seen], since_us: u64, now_us: u64) -> Option<u64> {
    let start = seen
        .iter()
        .filter(|p| p.listed)
        .filter_map(|p| p.now.as_ref())
        .filter(|(h, _)| h == holder)
        .map(|&(_, start)| start)
        .min()?;
    Some(now_us.saturating_sub(start.max(since_us)))
}

/// The busy time of the window's time NVML's buffer no longer held (no GPM
/// window and a timer period longer than the buffer), estimated at the
/// samples' mean over at most twice the time they cover: runs missed for
/// longer, or a step of the wall clock (which stamps the samples), add no
/// more than that.
fn unread_busy(window: Window) -> u64 {
    let unread = window.unread_us.min(window.length_us.saturating_mul(2));
    part(window.busy_us, unread, window.length_us.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    /// The previous run's time; this run is 15 s later.
    const BEFORE: u64 = 1_800_000_000 * S;
    const NOW: u64 = BEFORE + 15 * S;

    fn job(id: &str) -> Holder {
        let task = Owner::Slurm(crate::owner::slurm::Job {
            job_id: Some(id.into()),
            sluid: None,
        });
        Holder {
            task,
            gpu_instance_id: None,
        }
    }

    fn process(pid: u32, holder: Option<(&Holder, u64)>, share: Option<f64>) -> Seen {
        Seen {
            pid,
            listed: holder.is_some(),
            now: holder.map(|(h, start)| (h.clone(), start)),
            share: share.map(|s| (s, NOW - S)),
        }
    }

    /// A previous run's ledger; its processes' holders are added to the
    /// totals (at 0) where missing.
    fn ledger(totals: &[(&Holder, Totals)], processes: &[(u32, u64, &Holder)]) -> Ledger {
        let mut all: Vec<(Holder, Totals)> =
            totals.iter().map(|(h, t)| ((*h).clone(), *t)).collect();
        for &(_, _, h) in processes {
            if !all.iter().any(|(known, _)| known == h) {
                all.push((
                    h.clone(),
                    Totals {
                        seen_us: BEFORE,
                        ..Totals::default()
                    },
                ));
            }
        }
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let at = |h: &Holder| all.iter().position(|(known, _)| known == h).unwrap();
        let processes = processes.iter().map(|&(p, s, h)| (p, s, at(h))).collect();
        Ledger {
            at_us: BEFORE,
            energy_mj: Some(1_000_000),
            unattributed_mj: 0,
            refused: false,
            totals: all,
            processes,
            xids: None,
        }
    }

    fn totals_of<'l>(ledger: &'l Ledger, holder: &Holder) -> &'l Totals {
        &ledger.totals.iter().find(|(h, _)| h == holder).unwrap().1
    }

    /// 15 s window, the GPU busy 9 s of it; 6 kJ spent.
    #[test]
    fn unread_time_is_estimated_at_the_mean_over_at_most_twice_the_sampled() {
        let window = |unread_us| Window {
            busy_us: 6 * S,
            length_us: 10 * S,
            unread_us,
        };
        assert_eq!(unread_busy(window(5 * S)), 3 * S);
        assert_eq!(unread_busy(window(3600 * S)), 12 * S);
        let empty = Window {
            busy_us: 0,
            length_us: 0,
            unread_us: S,
        };
        assert_eq!(unread_busy(empty), 0);
    }

    const WINDOW: Window = Window {
        busy_us: 9 * S,
        length_us: 15 * S,
        unread_us: 0,
    };
    const ENERGY: Option<u64> = Some(7_000_000);

    #[test]
    fn a_first_run_sets_the_baseline_and_counts_nothing() {
        let a = job("1");
        let seen = [process(10, Some((&a, BEFORE - S)), Some(0.6))];
        let next = account(
            &Ledger::default(),
            NOW,
            ENERGY,
            Some(WINDOW),
            &seen,
            &[],
            None,
        );
        assert_eq!(
            next.totals,
            [(
                a.clone(),
                Totals {
                    seen_us: NOW,
                    measured: true,
                    ..Totals::default()
                }
            )]
        );
        assert_eq!(
            (next.at_us, next.energy_mj, next.unattributed_mj),
            (NOW, ENERGY, 0)
        );
        assert_eq!(next.processes, [(10, BEFORE - S, 0)]);
    }

    #[test]
    fn owners_split_the_windows_busy_time_and_energy_by_their_shares() {
        let (a, b) = (job("1"), job("2"));
        let previous = ledger(&[], &[(10, 0, &a), (20, 0, &b)]);
        let seen = [
            process(10, Some((&a, 0)), Some(0.49)),
            process(20, Some((&b, 0)), Some(0.11)),
        ];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &seen, &[], None);
        let (ta, tb) = (totals_of(&next, &a), totals_of(&next, &b));
        // The owners add up to the GPU's busy time and to the energy spent.
        assert_eq!(ta.busy_us + tb.busy_us, WINDOW.busy_us);
        assert_eq!((ta.busy_us, tb.busy_us), (7_350_000, 1_650_000));
        assert_eq!(
            ta.energy_mj + tb.energy_mj + next.unattributed_mj,
            6_000_000
        );
        assert_eq!((ta.energy_mj, tb.energy_mj), (4_900_000, 1_100_000));
        assert_eq!((ta.held_us, tb.held_us), (15 * S, 15 * S));
    }

    #[test]
    fn an_idle_gpu_gives_its_energy_to_its_only_holder_else_to_nobody() {
        let (a, b) = (job("1"), job("2"));
        let previous = ledger(&[], &[]);
        let one = [process(10, Some((&a, 0)), None)];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &one, &[], None);
        assert_eq!(totals_of(&next, &a).energy_mj, 6_000_000);
        assert_eq!(next.unattributed_mj, 0);
        let two = [
            process(10, Some((&a, 0)), None),
            process(20, Some((&b, 0)), None),
        ];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &two, &[], None);
        assert_eq!(totals_of(&next, &a).energy_mj, 0);
        assert_eq!(next.unattributed_mj, 6_000_000);
        let none = account(&previous, NOW, ENERGY, Some(WINDOW), &[], &[], None);
        assert_eq!(none.unattributed_mj, 6_000_000);
    }

    #[test]
    fn an_energy_counter_that_went_back_adds_nothing() {
        let a = job("1");
        let previous = ledger(&[], &[(10, 0, &a)]);
        let seen = [process(10, Some((&a, 0)), Some(0.5))];
        let next = account(&previous, NOW, Some(10), Some(WINDOW), &seen, &[], None);
        assert_eq!(
            (totals_of(&next, &a).energy_mj, next.unattributed_mj),
            (0, 0)
        );
        assert_eq!(next.energy_mj, Some(10));
    }

    #[test]
    fn an_owner_that_exited_or_whose_pid_was_reused_keeps_its_share() {
        let (a, b) = (job("1"), job("2"));
        let previous = ledger(&[], &[(10, 100, &a), (20, 200, &a)]);
        let seen = [
            // pid 10 exited: only its share is listed.
            process(10, None, Some(0.2)),
            // pid 20 now runs for b, started after NVML last saw it busy.
            process(20, Some((&b, NOW)), Some(0.4)),
        ];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &seen, &[], None);
        assert_eq!(totals_of(&next, &a).busy_us, WINDOW.busy_us);
        assert_eq!(totals_of(&next, &b).busy_us, 0);
        // b held the GPU from its start only.
        assert_eq!(totals_of(&next, &b).held_us, 0);
        // A share nobody can be named for is nobody's.
        let unknown = [process(30, None, Some(0.3))];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &unknown, &[], None);
        assert_eq!(next.totals, previous.totals);
        assert_eq!(next.unattributed_mj, 6_000_000);
    }

    /// The process at pid 30 started after NVML last saw the pid busy, and
    /// the previous run did not know the pid: the share is nobody's.
    #[test]
    fn a_share_older_than_the_process_at_its_pid_is_nobodys_unless_known() {
        let (a, b) = (job("1"), job("2"));
        let previous = ledger(&[], &[(10, 0, &a)]);
        let seen = [
            process(10, Some((&a, 0)), Some(0.3)),
            process(30, Some((&b, NOW - S + 1)), Some(0.3)),
        ];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &seen, &[], None);
        assert_eq!(totals_of(&next, &a).busy_us, WINDOW.busy_us / 2);
        assert_eq!(totals_of(&next, &b).busy_us, 0);
        assert_eq!(next.unattributed_mj, 3_000_000);
        // Started at the very sample: it may have done the work.
        let seen = [process(30, Some((&b, NOW - S)), Some(0.3))];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &seen, &[], None);
        assert_eq!(totals_of(&next, &b).busy_us, WINDOW.busy_us);
    }

    /// A run that cannot read the energy counter keeps the baseline: the
    /// next reading charges the energy since it, by its own shares.
    #[test]
    fn a_failed_energy_reading_keeps_the_baseline() {
        let (a, b) = (job("1"), job("2"));
        let previous = ledger(&[], &[(10, 0, &a), (20, 0, &b)]);
        let seen = [
            process(10, Some((&a, 0)), Some(0.3)),
            process(20, Some((&b, 0)), Some(0.1)),
        ];
        let failed = account(&previous, NOW, None, Some(WINDOW), &seen, &[], None);
        assert_eq!(failed.energy_mj, previous.energy_mj);
        assert_eq!(totals_of(&failed, &a).energy_mj, 0);
        assert_eq!(failed.unattributed_mj, 0);
        // 15 s later: 9 kJ since the baseline, split 3:1.
        let later = account(
            &failed,
            NOW + 15 * S,
            Some(10_000_000),
            Some(WINDOW),
            &seen,
            &[],
            None,
        );
        assert_eq!(totals_of(&later, &a).energy_mj, 6_750_000);
        assert_eq!(totals_of(&later, &b).energy_mj, 2_250_000);
        assert_eq!(later.unattributed_mj, 0);
        assert_eq!(later.energy_mj, Some(10_000_000));
    }

    /// Without a window with shares a holder's busy time is unknown (not
    /// measured); once measured it stays so through windows without shares.
    #[test]
    fn busy_time_is_measured_only_in_windows_with_shares_and_stays_so() {
        let a = job("1");
        let previous = ledger(&[], &[(10, 0, &a)]);
        let seen = [process(10, Some((&a, 0)), None)];
        let none = account(&previous, NOW, ENERGY, None, &seen, &[], None);
        assert!(!totals_of(&none, &a).measured);
        assert!(totals_of(&none, &a).held_us > 0);
        let idle = account(&previous, NOW, ENERGY, Some(WINDOW), &seen, &[], None);
        assert!(totals_of(&idle, &a).measured);
        assert_eq!(totals_of(&idle, &a).busy_us, 0);
        let after = account(&idle, NOW + 15 * S, ENERGY, None, &seen, &[], None);
        assert!(totals_of(&after, &a).measured);
        // A ledger written before the mark: busy time means measured.
        let old = Totals {
            busy_us: 1,
            seen_us: BEFORE,
            ..Totals::default()
        };
        let next = account(
            &ledger(&[(&a, old)], &[]),
            NOW,
            ENERGY,
            None,
            &[],
            &[],
            None,
        );
        assert!(totals_of(&next, &a).measured);
    }

    /// Totals stop at their bounds; past them a ledger is implausible.
    #[test]
    fn totals_stop_at_their_bounds_and_past_them_are_damage() {
        let a = job("1");
        let full = Totals {
            busy_us: MAX_US - 1,
            energy_mj: MAX_MJ - 1,
            held_us: MAX_US,
            seen_us: BEFORE,
            measured: true,
            ..Totals::default()
        };
        let mut previous = ledger(&[(&a, full)], &[(10, 0, &a)]);
        previous.unattributed_mj = MAX_MJ;
        assert_eq!(previous.implausible(), None);
        let seen = [
            process(10, Some((&a, 0)), Some(0.3)),
            process(30, None, Some(0.3)),
        ];
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &seen, &[], None);
        let t = totals_of(&next, &a);
        assert_eq!(
            (t.busy_us, t.energy_mj, t.held_us),
            (MAX_US, MAX_MJ, MAX_US)
        );
        assert_eq!(next.unattributed_mj, MAX_MJ);
        assert_eq!(next.implausible(), None);
        let mut damaged = next.clone();
        damaged.totals[0].1.busy_us = MAX_US + 1;
        let said = damaged.implausible().unwrap().to_string();
        assert_eq!(
            said,
            format!(
                "a task's busy time (µs) is {}, more than {MAX_US}",
                MAX_US + 1
            )
        );
        damaged = next;
        damaged.unattributed_mj = u64::MAX;
        assert!(damaged.implausible().is_some());
    }

    #[test]
    fn time_held_counts_from_the_start_of_a_process_that_began_between_runs() {
        let a = job("1");
        let seen = [process(10, Some((&a, BEFORE + 5 * S)), None)];
        let next = account(
            &ledger(&[], &[]),
            NOW,
            ENERGY,
            Some(WINDOW),
            &seen,
            &[],
            None,
        );
        assert_eq!(totals_of(&next, &a).held_us, 10 * S);
    }

    #[test]
    fn an_owner_gone_longer_than_the_linger_time_is_dropped() {
        let (a, b) = (job("1"), job("2"));
        let kept = Totals {
            busy_us: 5,
            seen_us: NOW - LINGER_US,
            measured: true,
            ..Totals::default()
        };
        let gone = Totals {
            busy_us: 5,
            seen_us: NOW - LINGER_US - 1,
            ..Totals::default()
        };
        let previous = ledger(&[(&a, kept), (&b, gone)], &[]);
        let next = account(&previous, NOW, ENERGY, Some(WINDOW), &[], &[], None);
        assert_eq!(next.totals, [(a, kept)]);
    }

    #[test]
    fn past_the_bound_a_new_owner_is_refused_and_the_others_count_on() {
        let holders: Vec<Holder> = (0..MAX_HOLDERS).map(|i| job(&i.to_string())).collect();
        let full: Vec<(&Holder, Totals)> = holders
            .iter()
            .map(|h| {
                (
                    h,
                    Totals {
                        seen_us: BEFORE,
                        ..Totals::default()
                    },
                )
            })
            .collect();
        let previous = ledger(&full, &[]);
        let (old, new) = (&holders[0], job("new"));
        let seen = [
            process(10, Some((old, 0)), Some(0.5)),
            process(20, Some((&new, 0)), Some(0.5)),
        ];
        let accounted = account(&previous, NOW, ENERGY, Some(WINDOW), &seen, &[], None);
        assert!(accounted.refused);
        assert_eq!(accounted.totals.len(), MAX_HOLDERS);
        assert_eq!(totals_of(&accounted, old).busy_us, WINDOW.busy_us / 2);
        // The refused share is not given to anyone else.
        let given: u64 = accounted.totals.iter().map(|(_, t)| t.energy_mj).sum();
        assert_eq!(given, 3_000_000);
    }
}
