//! Golden files: the exact output of a run with the values that change every
//! run (durations, timestamp, the measured GPM window) checked and replaced
//! by placeholders.

use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{assert_promtool, Exporter, Samples};

/// Seconds since the epoch, as the exporter's timestamp counts them.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Runs `scenario` with `--stdout` and `args` and checks the exit status
/// `status`, stderr (empty when 0), strict parsing, promtool and the golden
/// file `case`; returns the normalized text and the samples.
pub fn case(
    exporter: &Exporter,
    case: &str,
    scenario: &str,
    args: &[&str],
    status: i32,
) -> (String, Samples) {
    let started = now();
    let state = tempfile::tempdir().unwrap();
    let mut all_args = vec!["--stdout"];
    all_args.extend_from_slice(args);
    let output = exporter.run_args(scenario, state.path(), &all_args, &[]);
    let finished = now();
    let stderr = output.err();
    assert_eq!(output.code(), Some(status), "{case}: {stderr}");
    if status == 0 {
        assert!(stderr.is_empty(), "{case}: a healthy run printed {stderr}");
    }
    if let Err(e) = output.parsed() {
        panic!("{case}: {e}");
    }
    assert_promtool(case, &output.text());
    let normalized = normalize(&output.stdout, started, finished);
    check(&exporter.golden_dir(), case, &normalized);
    (String::from_utf8(normalized).unwrap(), output.samples())
}

/// Checks the per-run values and replaces them, in place, with placeholders;
/// every other byte (line ends, the final line feed or its absence) is kept,
/// so the comparison with the golden file sees them.
pub fn normalize(bytes: &[u8], started: f64, finished: f64) -> Vec<u8> {
    let run = finished - started + 0.001;
    // The series whose value changes every run (a name ending in `{` stands
    // for the name with any labels), the range the value must be in, and its
    // placeholder. The GPM window is the one actually measured: at least the
    // shortest --gpm-window, within the run.
    let volatile = [
        (
            "nvidia_gpu_collector_duration_seconds",
            0.0..=run,
            "<duration>",
        ),
        (
            "nvidia_gpu_collector_timestamp_seconds",
            started - 0.001..=finished,
            "<timestamp>",
        ),
        (
            "nvidia_gpu_collector_step_duration_seconds{",
            0.0..=run,
            "<duration>",
        ),
        ("nvidia_gpu_gpm_window_seconds{", 0.1..=run, "<window>"),
    ];
    let text = std::str::from_utf8(bytes).expect("UTF-8 output");
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let (series, value) = body.rsplit_once(' ').unwrap_or((body, ""));
        let volatile = volatile.iter().find(|(name, _, _)| {
            series == *name || (name.ends_with('{') && series.starts_with(name))
        });
        match volatile {
            Some((_, range, placeholder)) => {
                let value: f64 = value.parse().unwrap();
                assert!(range.contains(&value), "{line}");
                out.push_str(&format!("{series} {placeholder}{end}"));
            }
            None => out.push_str(line),
        }
    }
    out.into_bytes()
}

/// Compares `bytes` with `dir/<case>.prom`, or writes it there when
/// `UPDATE_GOLDEN` is set (review the diff line by line before committing).
pub fn check(dir: &Path, case: &str, bytes: &[u8]) {
    let path = dir.join(format!("{case}.prom"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, bytes).unwrap();
        return;
    }
    let expected = fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
    if expected != bytes {
        let (want, got) = (
            String::from_utf8_lossy(&expected),
            String::from_utf8_lossy(bytes),
        );
        // The first differing line, line ends included.
        for (number, (w, g)) in want
            .split_inclusive('\n')
            .zip(got.split_inclusive('\n'))
            .enumerate()
        {
            assert_eq!(w, g, "{case}: first difference at line {}", number + 1);
        }
        panic!(
            "{case}: {} bytes, the golden file {} (the same lines; one has more)",
            bytes.len(),
            expected.len()
        );
    }
}
