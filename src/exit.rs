//! The process exit statuses, defined once: `--help`, the man page
//! (`--generate man`), `--generate exit-codes` and docs/failures.md all come
//! from or are checked against [`Exit::ALL`].

use std::process::ExitCode;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every GPU was read and the file was written.
    Success = 0,
    /// The command line was rejected (clap's own status for usage errors).
    Usage = 2,
    /// NVML could not be initialised; the file holds the reason.
    NvmlUnavailable = 3,
    /// At least one GPU is down; the file says which.
    DeviceDown = 4,
    /// The run did not finish within `--timeout`, or a GPU's reads did not;
    /// the file says so.
    Timeout = 5,
    /// Another run holds the output's lock; the file says so.
    Busy = 6,
    /// The output could not be written.
    PublishFailed = 7,
}

impl Exit {
    /// Every status, in numeric order.
    pub const ALL: [Exit; 7] = [
        Exit::Success,
        Exit::Usage,
        Exit::NvmlUnavailable,
        Exit::DeviceDown,
        Exit::Timeout,
        Exit::Busy,
        Exit::PublishFailed,
    ];

    /// The numeric status.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// A stable name, for scripts (`--generate exit-codes`).
    pub fn name(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Usage => "usage",
            Exit::NvmlUnavailable => "nvml_unavailable",
            Exit::DeviceDown => "device_down",
            Exit::Timeout => "timeout",
            Exit::Busy => "busy",
            Exit::PublishFailed => "publish_failed",
        }
    }

    /// What the status means, in one sentence.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Success => "all GPUs were read and the file was written",
            Exit::Usage => "bad command line; nothing was changed",
            Exit::NvmlUnavailable => {
                "NVML could not be used (library missing, driver not loaded, no permission, \
                 ...); the file says why"
            }
            Exit::DeviceDown => {
                "at least one GPU is down (lost, or failing every read); the file says which"
            }
            Exit::Timeout => {
                "the run did not finish within --timeout (a hung driver call or file system, \
                 standard output nobody reads), or a GPU's reads did not (that GPU is down \
                 with reason timeout, the others are published); the file says so, unless \
                 even writing it could not finish in time"
            }
            Exit::Busy => {
                "another run held the lock of the output file until the deadline; the file \
                 says so unless that run published meanwhile"
            }
            Exit::PublishFailed => "the output file could not be written (nothing was changed)",
        }
    }

    /// The exit statuses as `--help` and the man page print them.
    pub fn help() -> String {
        let mut text = String::from("Exit status:\n");
        for exit in Exit::ALL {
            text.push_str(&format!("  {}  {}\n", exit.code(), exit.meaning()));
        }
        text.push_str(
            "\nLogging goes to standard error and is quiet for a healthy run; set \
             RUST_LOG=debug to see every unsupported field.",
        );
        text
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
