//! A reader that reads the published file as fast as it can, on its own thread
//! (a second CPU), and checks that every read is one of the complete files it
//! expects: what node_exporter would see at any moment.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crate::exposition::{self, Series};

/// What the reader saw.
#[derive(Default)]
pub struct ReaderStats {
    /// Successful reads of the file.
    pub reads: usize,
    /// Reads that found no file.
    pub missing: usize,
    /// The first few reads that were not a complete file of an expected kind.
    pub bad: Vec<String>,
    /// Reads per kind of complete file.
    pub seen: BTreeMap<String, usize>,
    /// The first file of each kind, byte for byte.
    pub first: BTreeMap<String, Vec<u8>>,
}

impl ReaderStats {
    /// The reader read the file, every read was a complete file of an expected
    /// kind, none found the file missing, and promtool is silent on the first
    /// file of each kind.
    pub fn check(&self) -> Result<(), String> {
        if self.reads == 0 {
            return Err("the reader never read the file".into());
        }
        if let Some(first) = self.bad.first() {
            return Err(format!(
                "the reader saw {}+ incomplete files: {first}",
                self.bad.len()
            ));
        }
        if self.missing > 0 {
            return Err(format!("the file was missing {} times", self.missing));
        }
        for (kind, data) in &self.first {
            crate::promtool(data)
                .map_err(|e| format!("promtool on a {kind} file the reader saw: {e}"))?;
        }
        Ok(())
    }
}

pub struct Reader {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<ReaderStats>,
}

impl Reader {
    /// Starts reading `path`; a read is complete when it parses and its series
    /// are exactly those of one of `kinds` (name, series).
    pub fn start(path: PathBuf, kinds: Vec<(String, BTreeSet<Series>)>) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut st = ReaderStats::default();
            while !flag.load(Ordering::Relaxed) {
                let Ok(data) = fs::read(&path) else {
                    st.missing += 1;
                    continue;
                };
                st.reads += 1;
                let why = match exposition::parse_bytes(&data) {
                    Err(e) => format!("{e}; {} bytes, ends {:?}", data.len(), tail(&data)),
                    Ok(samples) => {
                        let got: BTreeSet<Series> = samples.into_keys().collect();
                        if let Some((kind, _)) = kinds.iter().find(|(_, k)| *k == got) {
                            *st.seen.entry(kind.clone()).or_default() += 1;
                            st.first.entry(kind.clone()).or_insert(data);
                            continue;
                        }
                        let some: Vec<String> = got.iter().take(2).map(|s| s.to_string()).collect();
                        format!(
                            "a parseable file with {} series that is no complete render (e.g. {some:?})",
                            got.len()
                        )
                    }
                };
                if st.bad.len() < 5 {
                    st.bad.push(format!("read {}: {why}", st.reads));
                }
            }
            st
        });
        Reader { stop, thread }
    }

    /// Stops reading and returns what was seen.
    pub fn finish(self) -> Result<ReaderStats, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the reader thread panicked".to_string())
    }
}

fn tail(data: &[u8]) -> String {
    String::from_utf8_lossy(&data[data.len().saturating_sub(60)..]).into_owned()
}
