//! Bounded waits: work run on threads of its own, what it hands over waited for
//! until a deadline and never longer; work not done by then is left behind (never
//! joined), and the caller names what it was stuck in (NVML's: `inflight`).

use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::Instant;

/// Why a bounded wait ended without a value.
#[derive(Debug)]
pub enum Unfinished {
    /// No thread could be started for the work.
    NotStarted(io::Error),
    /// The deadline came first: the work is left behind.
    Late,
    /// Every thread ended without handing over more (one panicked).
    Ended,
}

/// Threads being started, each handing over what it has through its [`Sender`].
pub struct Threads<T>(Sender<T>, Receiver<T>);

/// What the started [`Threads`] hand over, waited for until a deadline.
pub struct Waiting<T>(Receiver<T>);

impl<T> Default for Threads<T> {
    fn default() -> Self {
        let (sender, receiver) = mpsc::channel();
        Threads(sender, receiver)
    }
}

impl<T: Send + 'static> Threads<T> {
    /// Starts `work` on a thread named `name`.
    pub fn spawn(
        &self,
        name: &str,
        work: impl FnOnce(Sender<T>) + Send + 'static,
    ) -> io::Result<()> {
        let (sender, thread) = (self.0.clone(), thread::Builder::new().name(name.into()));
        thread.spawn(move || work(sender)).map(drop)
    }

    /// Starts no more: from now on a wait ends once every thread has.
    pub fn waiting(self) -> Waiting<T> {
        Waiting(self.1)
    }
}

impl<T> Waiting<T> {
    /// The next thing handed over, if it came by `until`.
    pub fn next_by(&self, until: Instant) -> Result<T, Unfinished> {
        let left = until.saturating_duration_since(Instant::now());
        self.0.recv_timeout(left).map_err(|error| match error {
            RecvTimeoutError::Timeout => Unfinished::Late,
            RecvTimeoutError::Disconnected => Unfinished::Ended,
        })
    }
}

/// Runs `work` on a thread named `name`; its value, if it ended by `until`.
pub fn call<T: Send + 'static>(
    name: &str,
    until: Instant,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unfinished> {
    let threads = Threads::default();
    let spawned = threads.spawn(name, move |done| drop(done.send(work())));
    spawned.map_err(Unfinished::NotStarted)?;
    threads.waiting().next_by(until)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_value_by_the_deadline_late_work_left_behind_a_panic_ended() {
        let far = Instant::now() + Duration::from_secs(5);
        assert!(matches!(call("t", far, || 7), Ok(7)));
        let started = Instant::now();
        let late = call("t", started + Duration::from_millis(50), || {
            thread::sleep(Duration::from_secs(2));
        });
        assert!(matches!(late, Err(Unfinished::Late)), "{late:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
        let panicked = call("t", far, || -> u8 { panic!("on purpose") });
        assert!(matches!(panicked, Err(Unfinished::Ended)), "{panicked:?}");
    }

    #[test]
    fn every_thread_is_heard_until_all_ended() {
        let threads = Threads::default();
        for n in 0..3 {
            threads
                .spawn(&format!("t{n}"), move |s| {
                    let _ = s.send(n);
                })
                .unwrap();
        }
        let waiting = threads.waiting();
        let far = Instant::now() + Duration::from_secs(5);
        let mut heard: Vec<u32> = (0..3).map(|_| waiting.next_by(far).unwrap()).collect();
        heard.sort_unstable();
        assert_eq!(heard, [0, 1, 2]);
        assert!(matches!(waiting.next_by(far), Err(Unfinished::Ended)));
    }
}
