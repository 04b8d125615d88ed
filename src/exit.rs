//! The process exit statuses, defined once: `--help`, the man page
//! (`--generate man`), `--generate exit-codes` and docs/failures.md all come
//! from or are checked against [`Exit::ALL`].

use std::process::ExitCode;

use crate::reason::constants;

constants! {
    /// How a run ended; `ALL` in numeric order.
    pub enum Exit {
        /// A stable name, for scripts (`--generate exit-codes`).
        fn name;
        /// What the status means, in one sentence.
        fn meaning;
    }
    Success = 0 => ("success", "all GPUs were read and the file was written");
    Usage = 2 => ("usage", "bad command line; nothing was changed");
    NvmlUnavailable = 3 => ("nvml_unavailable",
        "NVML could not be used (library missing, driver not loaded, no permission, \
         ...); the file says why");
    DeviceDown = 4 => ("device_down",
        "at least one GPU is down (lost, or failing every read); the file says which");
    Timeout = 5 => ("timeout",
        "the run did not finish within --timeout (a hung driver call or file system, \
         standard output nobody reads), or a GPU's reads did not (that GPU is down \
         with reason timeout, the others are published); the file says so, unless \
         even writing it could not finish in time");
    Busy = 6 => ("busy",
        "another run held the lock of the output file until the deadline; the file \
         says so unless that run published meanwhile");
    PublishFailed = 7 => ("publish_failed",
        "the output file could not be written (nothing was changed)");
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The exit statuses as `--help` and the man page print them.
    pub fn help() -> String {
        let statuses = Exit::ALL.map(|exit| format!("  {}  {}\n", exit.code(), exit.meaning()));
        format!(
            "Exit status:\n{}\nLogging goes to standard error and is quiet for a healthy run; \
             set RUST_LOG=debug to see every unsupported field.",
            statuses.concat()
        )
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_in_order() {
        let codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        let mut sorted = codes.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(codes, sorted);
    }

    #[test]
    fn failures_doc_lists_every_status() {
        let doc = include_str!("../docs/failures.md");
        for exit in Exit::ALL {
            let row = format!("\n| {} | ", exit.code());
            assert!(
                doc.contains(&row),
                "docs/failures.md lacks a row for {exit:?}"
            );
        }
    }
}
