//! The process exit statuses, in one place. `cli::EXIT_STATUS_HELP` (and so
//! `--help` and the man page) and the README document the same numbers; a test
//! checks that every status appears in `EXIT_STATUS_HELP`.

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
    /// NVML did not answer within `--timeout`; the file says so.
    Timeout = 5,
    /// Another run holds the output's lock; the file says so.
    Busy = 6,
    /// The output could not be written.
    PublishFailed = 7,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
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
    use crate::cli::EXIT_STATUS_HELP;

    #[test]
    fn every_status_is_documented_in_help() {
        for exit in [
            Exit::Success,
            Exit::Usage,
            Exit::NvmlUnavailable,
            Exit::DeviceDown,
            Exit::Timeout,
            Exit::Busy,
            Exit::PublishFailed,
        ] {
            let line = format!("\n  {}  ", exit.code());
            assert!(EXIT_STATUS_HELP.contains(&line), "{exit:?} undocumented");
        }
    }
}
