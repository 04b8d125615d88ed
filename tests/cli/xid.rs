//! XID errors counted from a real journal.

use super::*;

#[test]
fn xids_count_exactly_across_runs_and_a_rotated_and_vacuumed_journal() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    // Every GPU starts at 0, before any XID.
    write_journal(
        journal.path(),
        "system@1.journal",
        &journal_entry(
            1000,
            "kernel",
            "nvidia-nvlink: Nvlink Core is being initialized",
        ),
    );
    let run = ex().xid_run(state.path(), journal.path());
    assert_eq!(select(&run, "nvidia_gpu_xid_errors_total", &[]).len(), 8);
    assert_eq!(xids(&run, GPU0), Some(0.0));
    assert_eq!(xids(&run, GPU0_79), None);

    // The first XID; a spoofed one from user space (logger) and an older
    // driver's line for GPU 1 without pid; a bus id that matches no GPU.
    let mut export = journal_entry(2000, "kernel", XID79);
    export += &journal_entry(2001, "syslog", XID79);
    export += &journal_entry(
        2002,
        "kernel",
        "NVRM: Xid (PCI:0000:2a:00): 13, Graphics Exception: ESR 0x405840=0x0",
    );
    export += &journal_entry(
        2003,
        "kernel",
        "NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    );
    write_journal(journal.path(), "system@2.journal", &export);
    let run = ex().xid_run(state.path(), journal.path());
    assert_eq!(
        xids(&run, GPU0),
        Some(1.0),
        "the logger line must not count: {run:?}"
    );
    assert_eq!(xids(&run, GPU0_79), Some(1.0));
    assert_eq!(xids(&run, GPU1), Some(1.0));
    assert_eq!(
        value(
            &run,
            "nvidia_gpu_xid_unattributed_errors_total",
            &[("pci_bus_id", "00000000:EE:00"), ("code", "79")]
        ),
        Some(1.0)
    );
    // Nothing new: nothing counted twice.
    assert_eq!(ex().xid_run(state.path(), journal.path()), run);

    // Rotation: the active file is archived and a new one written; then the
    // archived files are vacuumed. The cursor's file is gone: no double count.
    write_journal(
        journal.path(),
        "system@3.journal",
        &journal_entry(3000, "kernel", XID79),
    );
    let run = ex().xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(2.0));
    fs::remove_file(journal.path().join("system@1.journal")).unwrap();
    fs::remove_file(journal.path().join("system@2.journal")).unwrap();
    write_journal(
        journal.path(),
        "system@4.journal",
        &journal_entry(4000, "kernel", XID79),
    );
    let run = ex().xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(3.0), "{run:?}");
    assert_eq!(
        xids(&run, GPU1),
        Some(1.0),
        "totals outlive the journal files"
    );
}

#[test]
fn an_invalid_cursor_restarts_from_the_last_entrys_time_without_double_counting() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let export = journal_entry(1000, "kernel", XID79)
        + &journal_entry(1000, "kernel", "a line at the same time");
    write_journal(journal.path(), "a.journal", &export);
    assert_eq!(
        xids(&ex().xid_run(state.path(), journal.path()), GPU0),
        Some(1.0)
    );
    // A damaged cursor (its monotonic time is kept): journalctl refuses it.
    let path = state.path().join("state");
    let mut file: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    assert!(file["xid"]["cursor"].is_string(), "{file}");
    file["xid"]["cursor"] = "garbage".into();
    fs::write(&path, file.to_string()).unwrap();
    write_journal(
        journal.path(),
        "b.journal",
        &journal_entry(2000, "kernel", XID79),
    );
    let run = ex().xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(2.0), "{run:?}");
    assert_eq!(
        xids(&ex().xid_run(state.path(), journal.path()), GPU0),
        Some(2.0)
    );
}

#[test]
fn ten_thousand_xids_in_one_window_count_exactly() {
    let state = tempfile::tempdir().unwrap();
    let journal = tempfile::tempdir().unwrap();
    let mut export = String::new();
    for i in 0..10_000u64 {
        export += &journal_entry(1000 + 2 * i, "kernel", XID79);
        export += &journal_entry(
            1001 + 2 * i,
            "kernel",
            "NVRM: GPU at PCI:0000:18:00: GPU-5a8f0c3e",
        );
    }
    write_journal(journal.path(), "a.journal", &export);
    let run = ex().xid_run(state.path(), journal.path());
    assert_eq!(xids(&run, GPU0), Some(10_000.0));
    assert_eq!(xids(&run, GPU0_79), Some(10_000.0));
    assert_eq!(
        xids(&ex().xid_run(state.path(), journal.path()), GPU0),
        Some(10_000.0)
    );
}

#[test]
fn no_collector_xid_leaves_the_families_out() {
    let output = exporter("h100x8", &["--stdout", "--no-collector", "xid"]);
    assert!(output.success());
    assert!(!String::from_utf8(output.stdout)
        .unwrap()
        .contains("nvidia_gpu_xid_"));
}

/// GPU 0 of h100x8 is at 00000000:18:00.0, GPU 1 at 00000000:2A:00.0.
pub(crate) const GPU0: (&str, &[(&str, &str)]) = ("nvidia_gpu_xid_errors_total", &[("gpu", "0")]);

const GPU1: (&str, &[(&str, &str)]) = ("nvidia_gpu_xid_errors_total", &[("gpu", "1")]);

pub(crate) const GPU0_79: (&str, &[(&str, &str)]) = (
    "nvidia_gpu_xid_errors_by_code_total",
    &[
        ("gpu", "0"),
        ("uuid", "GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"),
        ("code", "79"),
    ],
);

/// The value of one XID series of a run.
fn xids(run: &Samples, (name, labels): (&str, &[(&str, &str)])) -> Option<f64> {
    value(run, name, labels)
}

/// A GPU hung in a driver call takes the GPUs' time, not the host steps':
/// with GPU 1 stuck in nvmlDeviceGetPowerUsage in every run, the Xid 79 the
/// driver logs for it is counted in the run that sees it, under the
/// default timeout and a short one.
#[test]
fn xids_of_a_hung_gpu_are_counted_while_it_hangs() {
    const HUNG_GPU1: &str =
        "NVRM: Xid (PCI:0000:37:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
    for timeout in ["2s", "10s"] {
        let (state, journal) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_journal(
            journal.path(),
            "a.journal",
            &journal_entry(1000, "kernel", HUNG_GPU1),
        );
        let run = ex()
            .run("fault-device-hang")
            .stdout()
            .state_dir(state.path())
            .journal_dir(journal.path())
            .args(["--write-state", "--timeout", timeout])
            .finish()
            .unwrap();
        let at = format!("--timeout {timeout}: {run:?}");
        assert_eq!(run.code(), Some(5), "{at}");
        let samples = run.samples();
        let xid = [("collector", "xid")];
        assert_eq!(
            value(&samples, "nvidia_gpu_collector_success", &xid),
            Some(1.0),
            "{at}"
        );
        let gpu1 = [("gpu", "1"), ("code", "79")];
        assert_eq!(
            value(&samples, "nvidia_gpu_xid_errors_by_code_total", &gpu1),
            Some(1.0),
            "{at}"
        );
        assert_eq!(
            value(
                &samples,
                "nvidia_gpu_down_reason",
                &[("gpu", "1"), ("reason", "timeout")]
            ),
            Some(1.0),
            "{at}"
        );
    }
}

/// NVML hangs in a system call (the driver version, inside its init): the
/// file says the run failed, and still counts the Xid 79 that explains it,
/// for the GPU the state knows of this boot. With no state, the failure's
/// file is what it always was: only the collector's series.
#[test]
fn xids_are_counted_while_nvml_hangs_for_the_gpus_the_state_knows() {
    const FALLEN: &str =
        "NVRM: Xid (PCI:0000:17:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let journal = tempfile::tempdir().unwrap();
    let answering = dir.path().join("answering.toml");
    let text = fs::read_to_string(scenario("fault-system-hang")).unwrap();
    fs::write(
        &answering,
        text.replace("hang = [\"nvmlSystemGetDriverVersion\"]", ""),
    )
    .unwrap();
    let run = |scenario: &str, state: &Path| {
        ex().run(scenario)
            .stdout()
            .state_dir(state)
            .journal_dir(journal.path())
            .args(["--write-state", "--timeout", "2s"])
            .finish()
            .unwrap()
    };
    let seeded = run(answering.to_str().unwrap(), state.path());
    assert_eq!(seeded.code(), Some(0), "{seeded:?}");
    write_journal(
        journal.path(),
        "a.journal",
        &journal_entry(1000, "kernel", FALLEN),
    );
    let hung = run("fault-system-hang", state.path());
    let at = format!("{hung:?}");
    assert_eq!(hung.code(), Some(5), "{at}");
    let samples = hung.samples();
    assert_eq!(
        lookup(&samples, "nvidia_gpu_collector_up"),
        Some(0.0),
        "{at}"
    );
    let xid = [("collector", "xid")];
    assert_eq!(
        value(&samples, "nvidia_gpu_collector_success", &xid),
        Some(1.0),
        "{at}"
    );
    let gpu0 = [
        ("gpu", "0"),
        ("uuid", "GPU-1f3e5a70-77c1-4e0a-9d3b-5c2f8e1a6b00"),
        ("code", "79"),
    ];
    assert_eq!(
        value(&samples, "nvidia_gpu_xid_errors_by_code_total", &gpu0),
        Some(1.0),
        "{at}"
    );
    // Nothing else of the GPU: it was not read.
    assert_eq!(
        value(&samples, "nvidia_gpu_up", &[("gpu", "0")]),
        None,
        "{at}"
    );
    let fresh = tempfile::tempdir().unwrap();
    let alone = run("fault-system-hang", fresh.path()).samples();
    assert!(
        alone
            .keys()
            .all(|s| s.name.starts_with("nvidia_gpu_collector_")),
        "{alone:?}"
    );
}
