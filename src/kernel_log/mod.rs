//! The kernel log as typed [`Event`](event::Event)s: the driver's lines of
//! this boot after a [`Position`](event::Position), from the systemd journal
//! ([`journal`]) or else `/dev/kmsg` ([`kmsg`]); only the kernel's own lines
//! (facility kern, kernel transport); and their [`Counts`], the xid
//! collector's part of the state. It knows neither NVML nor the state.

mod counts;
mod event;
mod journal;
mod kmsg;
mod source;

pub use counts::{Counts, Series, XidOf, MAX_SERIES};
pub use event::BusId;
