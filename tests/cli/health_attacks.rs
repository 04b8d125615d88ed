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
