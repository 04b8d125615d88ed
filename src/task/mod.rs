//! Each GPU's accounting of the tasks its processes work for, from run to
//! run ([`ledger`]); who a task is, is `owner`'s.

pub mod ledger;

pub use ledger::{account, Given, Holder, Ledger, Seen, MAX_HOLDERS};
