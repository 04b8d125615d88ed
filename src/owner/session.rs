//! A user's session, and everything no other manager claims: the process's
//! user (`user.slice` is the user's own delegated subtree, in which any name
//! says nothing). Named by the user database (NSS), bounded; by the uid
//! where it does not answer.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Instant;

use nix::unistd;

use super::manager::{Claim, Node};
use crate::bounded::{self, Unfinished};
use crate::procfs::Proc;

label_set! {
    /// A user by name, or by uid.
    #[serde(transparent)]
    pub struct User {
        pub name: String => "user",
    }
}

#[derive(Default)]
pub struct Session {
    users: Users,
}

impl Session {
    pub fn claim(&self, _: &[&str], _: &Proc, _: &Node) -> Claim<User> {
        Claim::User
    }

    /// The owner of a process no manager names: its real user.
    pub fn user(&self, process: &Proc, until: Instant) -> Option<User> {
        let name = self.users.name(process.uid?, until);
        Some(User { name })
    }
}

/// User names by uid, looked up once per uid and never past `until` (after
/// one that did not answer, owners are named by uid).
#[derive(Debug, Default)]
struct Users {
    names: RefCell<HashMap<u32, String>>,
    gave_up: Cell<bool>,
}

impl Users {
    /// The user's name, or else the uid as text.
    fn name(&self, uid: u32, until: Instant) -> String {
        let lookup = || self.bounded_lookup(uid, until).unwrap_or_else(|| uid.to_string());
        let mut names = self.names.borrow_mut();
        names.entry(uid).or_insert_with(lookup).clone()
    }

    /// getpwuid_r(3) on a thread of its own, waited for until `until`.
    fn bounded_lookup(&self, uid: u32, until: Instant) -> Option<String> {
        if self.gave_up.get() {
            return None;
        }
        let lookup = move || unistd::User::from_uid(uid.into());
        match bounded::call("nss", until, lookup) {
            Ok(user) => return user.ok().flatten().map(|user| user.name),
            Err(Unfinished::NotStarted(e)) => {
                log::warn!("cannot start a thread for user lookups: {e}; owners shown by uid")
            }
            Err(Unfinished::Late | Unfinished::Ended) => log::warn!(
                "the user database (NSS) did not name uid {uid} in time; \
                 process owners of this run are shown by uid"
            ),
        }
        self.gave_up.set(true);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{owner_of, root};
    use super::*;
    use std::time::Duration;

    #[test]
    fn users_by_name_else_by_uid() {
        let (users, until) = (Users::default(), Instant::now() + Duration::from_secs(5));
        assert_eq!(users.name(0, until), "root");
        // No system has a user with the largest uid below the invalid one.
        assert_eq!(users.name(4_294_967_294, until), "4294967294");
        assert_eq!(owner_of("0::/user.slice/user-1000.slice/session-4.scope", ""), root());
    }
}
