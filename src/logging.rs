//! Log lines on standard error, in the form the reader of stderr expects.
//!
//! On a terminal or in a file: `nvidia-textfile-exporter: <level>: <message>`.
//! When stderr is the systemd journal (`JOURNAL_STREAM` names the same device
//! and inode as fd 2), every line instead starts with its syslog priority,
//! `<3>` for errors and `<4>` for warnings (sd-daemon(3)), and not with the
//! program name, which the journal records itself: so `journalctl -p err`
//! shows the exporter's errors. Info, debug and trace lines, which appear only
//! when `RUST_LOG` asks for them, are logged at notice (`<5>`), since the unit's
//! `LogLevelMax=notice` would drop lower priorities. Every line of a
//! multi-line message carries the prefix.

use std::io::Write;

use log::Level;

/// The program name on lines that do not go to the journal.
const PROGRAM: &str = "nvidia-textfile-exporter";

/// Installs the logger: `warn` unless `RUST_LOG` says otherwise.
pub fn init() {
    let journal = stderr_is_journal();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(move |out, record| {
            let message = record.args().to_string();
            for line in message.lines() {
                if journal {
                    writeln!(out, "<{}>{line}", priority(record.level()))?;
                } else {
                    let level = record.level().as_str().to_lowercase();
                    writeln!(out, "{PROGRAM}: {level}: {line}")?;
                }
            }
            Ok(())
        })
        .init();
}

/// The syslog priority a line of `level` is logged at in the journal.
fn priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info | Level::Debug | Level::Trace => 5,
    }
}

/// Whether fd 2 is the journal stream systemd announced in `JOURNAL_STREAM`
/// (`<device>:<inode>`); a child that inherited the variable but not the
/// stream (stderr redirected) is not.
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((device, inode)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(device), Ok(inode)) = (device.parse::<u64>(), inode.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat only writes the struct it is given.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(2, &mut stat) } != 0 {
        return false;
    }
    stat.st_dev == device && stat.st_ino == inode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_err_warnings_warning_and_the_rest_passes_log_level_max() {
        assert_eq!(priority(Level::Error), 3);
        assert_eq!(priority(Level::Warn), 4);
        assert_eq!(priority(Level::Debug), 5);
    }
}
