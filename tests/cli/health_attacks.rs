//! An outside tester's attacks on the health readings, through the binary.

use super::*;

/// A state whose platform labels lost one of their five (damaged, yet still
/// JSON) is a read error of that run, and the next run asks NVML again.
#[test]
fn damaged_platform_labels_in_the_state_are_read_again() {
    let state = tempfile::tempdir().unwrap();
    let first = ex().run_args(
        "gb200-nvl72",
        state.path(),
        &["--stdout", "--write-state"],
        &[],
    );
    assert_eq!(first.code(), Some(0));
    assert!(first.text().contains("nvidia_gpu_platform_info{"));
    let file = state.path().join("state");
    let text = fs::read_to_string(&file).unwrap();
    let whole = r#""platform":["1821324000123","7","3","1","2"]"#;
    assert!(text.contains(whole), "{text}");
    let damaged = text.replace(whole, r#""platform":["1821324000123","7","3","1"]"#);
    fs::write(&file, damaged).unwrap();
    let run = ex().run_args(
        "gb200-nvl72",
        state.path(),
        &["--stdout", "--write-state"],
        &[],
    );
    assert!(!run.text().contains("nvidia_gpu_platform_info{"));
    let errors = r#"nvidia_gpu_collector_read_errors{gpu="0",uuid="GPU-c2a91f4e-5d07-4b3a-8e62-71f0b9d4a3c8"}"#;
    assert_eq!(run.series(errors), Some(1.0));
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(
        log.contains("the state's platform labels are damaged"),
        "{log}"
    );
    let again = ex().run_args(
        "gb200-nvl72",
        state.path(),
        &["--stdout", "--write-state"],
        &[],
    );
    assert!(
        again.text().contains("nvidia_gpu_platform_info{"),
        "no platform info after a damaged state: {}",
        fs::read_to_string(&file).unwrap()
    );
}

/// A C2C power state this exporter does not name is `unknown`, so that the
/// state set still has its 1; Orin (an architecture value nvml-wrapper does
/// not name, 11) is not asked the Blackwell calls.
#[test]
fn an_unnamed_power_state_is_unknown_and_orin_is_no_blackwell() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = ex().edited("gb200-nvl72", dir.path(), "state-7", |t| {
        t.replace("\"234\" = 0", "\"234\" = 7")
    });
    let run = ex()
        .run(scenario.to_str().unwrap())
        .stdout()
        .finish()
        .unwrap();
    let text = run.text();
    let state = |s: &str| {
        format!(
            r#"nvidia_gpu_c2c_link_power_state{{gpu="0",uuid="GPU-c2a91f4e-5d07-4b3a-8e62-71f0b9d4a3c8",state="{s}"}}"#
        )
    };
    assert_eq!(run.series(&state("unknown")), Some(1.0), "{text}");
    assert_eq!(run.series(&state("full_power")), Some(0.0), "{text}");
    let orin = ex().edited("gb200-nvl72", dir.path(), "orin", |t| {
        t.replace("architecture = 10", "architecture = 11")
    });
    let run = ex().run(orin.to_str().unwrap()).stdout().finish().unwrap();
    let text = run.text();
    assert!(!text.contains("nvidia_gpu_platform_info{"), "{text}");
    assert!(
        !text.contains("nvidia_gpu_power_smoothing_lifetime"),
        "{text}"
    );
}
