//! The kernel log as typed [`Event`](event::Event)s: the kernel's own driver
//! lines of this boot after a [`Position`](event::Position), from the journal
//! ([`journal`]) or else `/dev/kmsg` ([`kmsg`]), and their [`Counts`] (its part
//! of the state's schema). It knows neither NVML nor the state file.

mod counts;
mod event;
mod journal;
mod kmsg;
mod source;

pub use counts::{Counts, Series, Totals, XidOf, MAX_SERIES};
pub use event::{BusId, Position};
