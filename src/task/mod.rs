//! The tasks GPU processes work for: who a process's task is ([`owner`])
//! and each GPU's accounting of its tasks from run to run ([`ledger`]).

pub mod ledger;
pub mod owner;

pub use ledger::{account, Holder, Ledger, Seen, MAX_HOLDERS};
