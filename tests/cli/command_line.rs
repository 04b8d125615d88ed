//! The command line: refused arguments, `--help`, `--version`, the unit's timeouts.

use super::*;

#[test]
fn bad_command_lines_are_refused_clearly() {
    bad_input(&["--frobnicate"], 2, "unexpected argument '--frobnicate'");
    bad_input(
        &["--timeout", "soon"],
        2,
        "invalid value 'soon' for '--timeout",
    );
    bad_input(&["--timeout", "0s"], 2, "must be longer than zero");
    bad_input(&["--timeout", "1h"], 2, "must be at most 5m");
    bad_input(&["--output-file", "gpu.txt"], 2, "must end in .prom");
    bad_input(
        &["--output-file", "../x.prom"],
        2,
        "must be a file name, not a path",
    );
    bad_input(
        &["--output-file", ".hidden.prom"],
        2,
        "must not start with '.'",
    );
    bad_input(
        &["--no-collector", "everything"],
        2,
        "invalid value 'everything'",
    );
}

#[test]
fn help_documents_exit_statuses_and_version_prints() {
    let help = Command::new(EXE).arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8(help.stdout).unwrap();
    for needle in [
        "Exit status:",
        "  5  the run did not finish within --timeout",
        "--output-dir",
        "--no-collector",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}");
    }
    let version = Command::new(EXE).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8(version.stdout).unwrap(),
        format!("nvidia-textfile-exporter {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// The unit's start timeout is longer than any `--timeout` the command line
/// accepts plus the hard stop's grace, so systemd never kills a run before it
/// has written its file.
#[test]
fn unit_start_timeout_outlasts_every_allowed_timeout() {
    let unit = fs::read_to_string(Path::new(ROOT).join("systemd/nvidia-textfile-exporter.service"))
        .unwrap();
    let value = unit
        .lines()
        .find_map(|line| line.strip_prefix("TimeoutStartSec="))
        .expect("TimeoutStartSec= in the unit");
    let start_timeout = humantime::parse_duration(value.trim()).unwrap();
    let longest = nvidia_textfile_exporter::MAX_TIMEOUT + nvidia_textfile_exporter::HARD_STOP_GRACE;
    assert!(start_timeout > longest + Duration::from_secs(5), "{value}");
    let refused = Command::new(EXE)
        .args(["--timeout", "301s", "--stdout"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

/// The unit's comment states the GPM window `auto` gives under its
/// `--timeout 14s`, as the binary computes it.
#[test]
fn unit_comment_states_the_auto_gpm_window() {
    let unit = fs::read_to_string(Path::new(ROOT).join("systemd/nvidia-textfile-exporter.service"))
        .unwrap();
    let exec = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("ExecStart= in the unit");
    assert!(exec.contains("--timeout 14s --gpm-window auto"), "{exec}");
    let stated = unit
        .split(" s of it")
        .next()
        .and_then(|before| before.rsplit('(').next())
        .expect("the unit states the window as (N s of it");
    let computed = nvidia_textfile_exporter::gpm_window(
        Some(nvidia_textfile_exporter::WindowRequest::Longest),
        Duration::from_secs(14),
    )
    .unwrap();
    assert_eq!(format!("{:.1}", computed.as_secs_f64()), stated);
}

fn bad_input(args: &[&str], status: i32, message: &str) {
    let output = Command::new(EXE).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(status), "{args:?}: {stderr}");
    let first = stderr.lines().next().unwrap_or("");
    assert!(first.contains(message), "{args:?}: first line {first:?}");
    assert!(output.stdout.is_empty());
}
