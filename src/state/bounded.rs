//! The state's collections read within their bounds: a list or map of a
//! state file is an error as soon as one element more than its bound
//! arrives, before that element is read, so a damaged file of the accepted
//! size never costs more memory than the bounds allow (the file's text, and
//! at most what 64 GPUs keep). [`seq`] and [`map`] read any list or map so;
//! the task ledger and the XID counts (whose types `task` and `kernel_log`
//! own) are read here field by field, the schema's own fields beside their
//! declarations. A GPU's carries need none: a map keyed by the stream holds
//! one per stream however often one is repeated.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::kernel_log::{self, Counts, Position, MAX_SERIES};
use crate::task::ledger::{Holder, Ledger, Totals, MAX_HOLDERS, MAX_PROCESSES};

/// A collection of at most `max` elements (a map's entries, a repeated key
/// counting again): `what` names them in the error.
struct AtMost<C, T> {
    max: usize,
    what: &'static str,
    read: PhantomData<fn() -> (C, T)>,
}

impl<C: Default + Extend<T>, T> AtMost<C, T> {
    fn new(max: usize, what: &'static str) -> Self {
        let read = PhantomData;
        AtMost { max, what, read }
    }

    /// Takes elements from `access` by `next` until it has none, or errs
    /// once element `max + 1` arrives (`skip` reads it, never keeps it).
    fn fill<A, E: de::Error>(
        &self,
        mut access: A,
        next: impl Fn(&mut A) -> Result<Option<T>, E>,
        skip: impl Fn(&mut A) -> Result<Option<IgnoredAny>, E>,
    ) -> Result<C, E> {
        let mut read = C::default();
        for _ in 0..self.max {
            match next(&mut access)? {
                Some(element) => read.extend([element]),
                None => return Ok(read),
            }
        }
        if skip(&mut access)?.is_some() {
            let (max, what) = (self.max, self.what);
            return Err(E::custom(format_args!("more than {max} {what}")));
        }
        Ok(read)
    }
}

impl<'de, C, T> Visitor<'de> for AtMost<C, T>
where
    C: Default + Extend<T>,
    T: Deserialize<'de>,
{
    type Value = C;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a list of at most {} {}", self.max, self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<C, A::Error> {
        self.fill(seq, A::next_element, A::next_element)
    }
}

/// A map of at most `max` entries.
struct MapAtMost<C, K, V>(AtMost<C, (K, V)>);

impl<'de, C, K, V> Visitor<'de> for MapAtMost<C, K, V>
where
    C: Default + Extend<(K, V)>,
    K: Deserialize<'de>,
    V: Deserialize<'de>,
{
    type Value = C;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a map of at most {} {}", self.0.max, self.0.what)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<C, A::Error> {
        self.0.fill(map, A::next_entry, A::next_key)
    }
}

/// A list of at most `max` elements `T`, collected into `C` as they arrive.
pub(super) fn seq<'de, D, C, T>(d: D, max: usize, what: &'static str) -> Result<C, D::Error>
where
    D: Deserializer<'de>,
    C: Default + Extend<T> + IntoIterator<Item = T>,
    T: Deserialize<'de>,
{
    d.deserialize_seq(AtMost::new(max, what))
}

/// A map of at most `max` entries, collected into `C` as they arrive.
pub(super) fn map<'de, D, C, K, V>(d: D, max: usize, what: &'static str) -> Result<C, D::Error>
where
    D: Deserializer<'de>,
    C: Default + Extend<(K, V)> + IntoIterator<Item = (K, V)>,
    K: Deserialize<'de>,
    V: Deserialize<'de>,
{
    d.deserialize_map(MapAtMost(AtMost::new(max, what)))
}

/// A GPU's task ledger: at most [`MAX_HOLDERS`] holders and [`MAX_PROCESSES`]
/// processes. `task` owns [`Ledger`] and its serde form; this reads that form
/// field for field and builds the ledger without `..`, so a field added there
/// does not compile until it is read here (and an unread one fails the
/// tests, which refuse unknown fields).
pub(super) fn ledger<'de, D: Deserializer<'de>>(d: D) -> Result<Ledger, D::Error> {
    fn holders<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(Holder, Totals)>, D::Error> {
        seq(d, MAX_HOLDERS, "task holders")
    }
    fn pids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u32, u64, usize)>, D::Error> {
        seq(d, MAX_PROCESSES, "task processes")
    }
    #[derive(Default, Deserialize)]
    #[serde(default)]
    #[cfg_attr(test, serde(deny_unknown_fields))]
    struct Read {
        at_us: u64,
        energy_mj: Option<u64>,
        unattributed_mj: u64,
        #[serde(deserialize_with = "holders")]
        totals: Vec<(Holder, Totals)>,
        #[serde(deserialize_with = "pids")]
        processes: Vec<(u32, u64, usize)>,
        refused: bool,
        xids: Option<u64>,
    }
    let read = Read::deserialize(d)?;
    Ok(Ledger {
        at_us: read.at_us,
        energy_mj: read.energy_mj,
        unattributed_mj: read.unattributed_mj,
        totals: read.totals,
        processes: read.processes,
        refused: read.refused,
        xids: read.xids,
    })
}

/// The XID counts: at most [`MAX_SERIES`] series in the totals
/// and in a recount. `kernel_log` owns [`Counts`] and its serde form, whose
/// position is flattened into it; serde would buffer the whole object (the
/// series too) to read a flattened field, so this reads the position's
/// fields as the fields they are in the file. Every field of [`Counts`] and
/// of its position is set without `..` (a field added there does not compile
/// until it is read here; one written but not read here fails the tests).
pub(super) fn xid<'de, D: Deserializer<'de>>(d: D) -> Result<Counts, D::Error> {
    type Series = BTreeMap<kernel_log::Series, u64>;
    fn series<'de, D: Deserializer<'de>>(d: D) -> Result<Series, D::Error> {
        seq(d, MAX_SERIES, "XID series")
    }
    /// A recount's series, bounded as the totals are.
    #[derive(Deserialize)]
    #[serde(transparent)]
    struct Recount(#[serde(deserialize_with = "series")] Series);
    #[derive(Default, Deserialize)]
    #[serde(default)]
    #[cfg_attr(test, serde(deny_unknown_fields))]
    struct Read {
        source: String,
        unavailable: bool,
        cursor: Option<String>,
        monotonic: Option<u64>,
        kmsg_seq: Option<u64>,
        #[serde(deserialize_with = "series")]
        totals: Series,
        recount: Option<Recount>,
    }
    let read = Read::deserialize(d)?;
    Ok(Counts {
        source: read.source,
        unavailable: read.unavailable,
        position: Position {
            cursor: read.cursor,
            monotonic: read.monotonic,
            kmsg_seq: read.kmsg_seq,
        },
        totals: kernel_log::Totals(read.totals),
        recount: read.recount.map(|recount| kernel_log::Totals(recount.0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// How many [`Counted`] elements were read on this thread.
        static READ: Cell<usize> = const { Cell::new(0) };
    }

    /// An element that counts its reads.
    #[derive(Debug, PartialEq)]
    struct Counted;

    impl<'de> Deserialize<'de> for Counted {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            IgnoredAny::deserialize(d)?;
            READ.with(|read| read.set(read.get() + 1));
            Ok(Counted)
        }
    }

    /// `text` read as a list of at most 3 [`Counted`], and how many were read.
    fn read_seq(text: &str) -> (Result<Vec<Counted>, serde_json::Error>, usize) {
        READ.with(|read| read.set(0));
        let mut d = serde_json::Deserializer::from_str(text);
        let read = seq(&mut d, 3, "elements");
        (read, READ.with(Cell::get))
    }

    /// `text` read as a map of at most 3 entries to [`Counted`], and how many
    /// values were read.
    fn read_map(text: &str) -> (Result<BTreeMap<String, Counted>, serde_json::Error>, usize) {
        READ.with(|read| read.set(0));
        let mut d = serde_json::Deserializer::from_str(text);
        let read = map(&mut d, 3, "entries");
        (read, READ.with(Cell::get))
    }

    #[test]
    fn up_to_the_bound_everything_is_read() {
        let (read, count) = read_seq("[1,2,3]");
        assert_eq!((read.unwrap().len(), count), (3, 3));
        let (read, count) = read_seq("[]");
        assert_eq!((read.unwrap().len(), count), (0, 0));
        let (read, count) = read_map(r#"{"a":1,"b":2,"c":3}"#);
        assert_eq!((read.unwrap().len(), count), (3, 3));
    }

    /// A million elements past the bound: the error comes at the fourth,
    /// which is never read as an element, and reading stops there (the
    /// error's column is the fourth element's).
    #[test]
    fn reading_stops_at_the_first_element_past_the_bound() {
        let list = format!("[{}1]", "1,".repeat(1_000_000));
        let (read, count) = read_seq(&list);
        let error = read.unwrap_err();
        assert_eq!(count, 3);
        assert_eq!(error.to_string(), "more than 3 elements at line 1 column 9");
        let entries: String = (0..1_000_000).map(|n| format!("\"{n}\":{{}},")).collect();
        let (read, count) = read_map(&format!("{{{entries}\"end\":0}}"));
        let error = read.unwrap_err();
        assert_eq!(count, 3);
        assert_eq!(error.to_string(), "more than 3 entries at line 1 column 25");
    }

    #[test]
    fn a_repeated_key_counts_again() {
        let (read, count) = read_map(r#"{"a":1,"a":2,"a":3,"a":4}"#);
        assert!(read.is_err());
        assert_eq!(count, 3);
    }

    #[test]
    fn what_is_not_a_collection_is_refused() {
        assert!(read_seq(r#"{"a":1}"#).0.is_err());
        assert!(read_map("[1]").0.is_err());
    }
}
