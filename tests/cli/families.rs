//! Which families and labels a run writes, by collector; no series twice.

use super::*;

#[test]
fn collectors_can_be_switched() {
    let (text, samples) = golden::case(
        ex(),
        "h100x8-minimal",
        "h100x8",
        &[
            "--no-collector",
            "nvlink",
            "--no-collector",
            "clocks",
            "--no-collector",
            "health",
        ],
        0,
    );
    assert!(!text.contains("nvidia_gpu_nvlink_"));
    assert!(!text.contains("nvidia_gpu_clock_hertz"));
    assert!(!text.contains("nvidia_gpu_ecc_"));
    let power = select(&samples, "nvidia_gpu_power_watts", &[]);
    assert_eq!(power.len(), 8, "{text}");
}

/// The labels of every sample of every golden file, beyond `gpu` and `uuid`,
/// are ones its family declares (`--generate families`).
#[test]
fn golden_samples_carry_only_declared_labels() {
    let table = Command::new(EXE)
        .args(["--generate", "families"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    let declared: std::collections::HashMap<&str, Vec<&str>> = table
        .lines()
        .map(|line| {
            let mut cells = line.split('\t');
            let name = cells.next().unwrap();
            let labels = cells.nth(1).unwrap();
            (name, labels.split(',').filter(|l| !l.is_empty()).collect())
        })
        .collect();
    let mut checked = 0;
    for entry in fs::read_dir(Path::new(ROOT).join("tests/golden")).unwrap() {
        let path = entry.unwrap().path();
        // The placeholders of the run's own values, as numbers again.
        let text = fs::read_to_string(&path)
            .unwrap()
            .replace(" <duration>\n", " 0\n")
            .replace(" <timestamp>\n", " 0\n")
            .replace(" <window>\n", " 0\n");
        let samples =
            exposition::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for series in samples.keys() {
            let name = series.name.as_str();
            let labels = declared
                .get(name)
                .unwrap_or_else(|| panic!("{name} undeclared"));
            for (label, _) in &series.labels {
                assert!(
                    label == "gpu" || label == "uuid" || labels.contains(&label.as_str()),
                    "{name} carries undeclared label {label}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "only {checked} labels checked");
}

/// Each collector, run alone on every scenario a run can read (all but the
/// ones where NVML hangs), exits with the status the scenario calls for, emits
/// only the families its registry row lists (plus the always-written ones),
/// and emits at least one of its own families on some scenario.
#[test]
fn collectors_emit_only_their_registered_families() {
    let table = Command::new(EXE)
        .args(["--generate", "collectors"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    let rows: Vec<(&str, Vec<&str>)> = table
        .lines()
        .map(|line| {
            let cells: Vec<&str> = line.split('\t').collect();
            (cells[0], cells[2].split(',').collect())
        })
        .collect();
    assert!(rows.len() > 10, "{table}");
    let always = [
        "nvidia_gpu_collector_up",
        "nvidia_gpu_collector_error",
        "nvidia_gpu_collector_duration_seconds",
        "nvidia_gpu_collector_timestamp_seconds",
        "nvidia_gpu_collector_build_info",
        "nvidia_gpu_collector_read_errors",
        "nvidia_gpu_collector_state_ok",
        // Written by the registry for every host-level collector that is on.
        "nvidia_gpu_collector_success",
        "nvidia_gpu_collector_step_duration_seconds",
        "nvidia_gpu_driver_info",
        "nvidia_gpu_up",
        "nvidia_gpu_down_reason",
        "nvidia_gpu_info",
        // Said for every collector with a host step (xid, processes).
        "nvidia_gpu_collector_success",
        "nvidia_gpu_collector_step_duration_seconds",
    ];
    let mut scenarios: Vec<String> = fs::read_dir(Path::new(ROOT).join("tests/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|n| n.strip_suffix(".toml").map(String::from))
        .filter(|n| !n.contains("hang"))
        .collect();
    scenarios.sort();
    assert!(scenarios.len() >= 25, "{scenarios:?}");
    let procfs = tempfile::tempdir().unwrap();
    let procfs = procfs.path().to_str().unwrap();
    // Which collectors wrote one of their own families somewhere; two threads
    // share the scenarios.
    let wrote = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let check = |scenario_name: &str| {
        for (collector, families) in &rows {
            let mut args = vec!["--stdout", "--procfs", procfs, "--gpm-window", "100ms"];
            for (other, _) in &rows {
                let switch = if other == collector {
                    "--collector"
                } else {
                    "--no-collector"
                };
                args.extend([switch, other]);
            }
            let output = exporter(scenario_name, &args);
            let at = format!("{scenario_name}, only {collector}");
            let want = expected_status(scenario_name, collector);
            assert_eq!(output.code(), Some(want), "{at}: {}", output.err());
            let file = output.parsed().unwrap_or_else(|e| panic!("{at}: {e}"));
            let names = file
                .families
                .keys()
                .chain(file.samples.keys().map(|s| &s.name));
            for name in names {
                assert!(
                    always.contains(&name.as_str()) || families.contains(&name.as_str()),
                    "{at}: emitted {name}"
                );
                if families.contains(&name.as_str()) {
                    wrote.lock().unwrap().insert(collector.to_string());
                }
            }
        }
    };
    std::thread::scope(|scope| {
        let (odd, even): (Vec<_>, Vec<_>) =
            scenarios.iter().enumerate().partition(|(i, _)| i % 2 == 1);
        for half in [odd, even] {
            let check = &check;
            scope.spawn(move || half.iter().for_each(|(_, name)| check(name)));
        }
    });
    let wrote = wrote.into_inner().unwrap();
    // The jobstats collector writes what the tasks collector's allocations
    // give, which no scenario has alone: tests/cli/allocations.rs runs it.
    let silent: Vec<&str> = rows
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| !wrote.contains(*c) && *c != "jobstats")
        .collect();
    assert!(
        silent.is_empty(),
        "collectors that wrote none of their families on any scenario: {silent:?}"
    );
}

/// No scenario, with every collector on, writes a series twice; the scenario
/// whose NVML lists a pid twice and two MIG devices with the same ids is
/// merged (process memory summed).
#[test]
fn no_series_is_ever_written_twice() {
    let procfs = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for entry in fs::read_dir(Path::new(ROOT).join("tests/scenarios")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let name = name.strip_suffix(".toml").unwrap();
        if name.contains("hang") || name.starts_with("bench") {
            continue;
        }
        let mut args = vec!["--stdout", "--timeout", "5s", "--procfs"];
        args.push(procfs.path().to_str().unwrap());
        let table = Command::new(EXE)
            .args(["--generate", "collectors"])
            .output()
            .unwrap();
        let table = String::from_utf8(table.stdout).unwrap();
        let names: Vec<String> = table
            .lines()
            .map(|l| l.split('\t').next().unwrap().to_owned())
            .collect();
        for collector in &names {
            args.extend(["--collector", collector.as_str()]);
        }
        // The strict parser refuses a series written twice.
        if let Err(e) = exporter(name, &args).parsed() {
            panic!("{name}: {e}");
        }
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} scenarios");
    let text = String::from_utf8(
        exporter(
            "fault-duplicates",
            &[
                "--stdout",
                "--collector",
                "processes",
                "--procfs",
                procfs.path().to_str().unwrap(),
            ],
        )
        .stdout,
    )
    .unwrap();
    let memory = value(
        &parsed(&text),
        "nvidia_gpu_process_memory_used_bytes",
        &[("pid", "61377")],
    );
    assert_eq!(memory, Some(7516193768.0), "{text}");
}

/// The exit status a run of `scenario_name` with only `collector` must have:
/// 3 where NVML is unusable, 4 where a GPU is down (in fault-lost-midread only
/// when the collector makes the call that finds it lost: the temperature, read
/// by `thermal`), else 0.
fn expected_status(scenario_name: &str, collector: &str) -> i32 {
    match scenario_name {
        "fault-device-count" => 3,
        s if s.starts_with("init-") => 3,
        "lost-gpu" | "fault-handle-error" => 4,
        "fault-lost-midread" if collector == "thermal" => 4,
        _ => 0,
    }
}
