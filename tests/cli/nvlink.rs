//! NVLink counters (per GPU and per link) and the NVSwitch fabric.

use super::*;

#[test]
fn nvlink_counters_come_from_one_batched_read() {
    let (_, samples) = golden::case(
        ex(),
        "nvlink-fields",
        "nvlink-fields",
        &["--no-collector", "mig", "--collector", "nvlink-links"],
        0,
    );
    let id = "gpu=\"0\",uuid=\"GPU-0c7e5a91-2b3d-4f60-8e14-a9d2c6b07f35\"";
    let link_errors = "nvidia_gpu_nvlink_link_errors_total";
    for (series, want) in [
        (
            format!("nvidia_gpu_nvlink_link_active{{{id},link=\"2\"}}"),
            0.0,
        ),
        (
            format!("{link_errors}{{{id},link=\"0\",counter=\"crc_data\"}}"),
            20.0,
        ),
        (
            format!("{link_errors}{{{id},link=\"3\",counter=\"crc_flit\"}}"),
            2.0,
        ),
        (
            format!("{link_errors}{{{id},link=\"3\",counter=\"replay\"}}"),
            5.0,
        ),
        (
            format!("{link_errors}{{{id},link=\"1\",counter=\"recovery\"}}"),
            1.0,
        ),
        (
            format!("nvidia_gpu_nvlink_link_transmit_bytes_total{{{id},link=\"0\"}}"),
            1024000.0,
        ),
        (
            format!("nvidia_gpu_nvlink_link_receive_bytes_total{{{id},link=\"3\"}}"),
            9216.0,
        ),
        // The per-GPU totals: link state by function where the state field is
        // not offered; replay/recovery/data summed over the per-link fields.
        (format!("nvidia_gpu_nvlink_links{{{id}}}"), 4.0),
        (format!("nvidia_gpu_nvlink_links_active{{{id}}}"), 3.0),
        (
            format!("nvidia_gpu_nvlink_errors_total{{{id},counter=\"replay\"}}"),
            8.0,
        ),
        (
            format!("nvidia_gpu_nvlink_errors_total{{{id},counter=\"recovery\"}}"),
            1.0,
        ),
        (
            format!("nvidia_gpu_nvlink_transmit_bytes_total{{{id}}}"),
            1041408.0,
        ),
        (
            format!("nvidia_gpu_nvlink_receive_bytes_total{{{id}}}"),
            2077696.0,
        ),
        (format!("nvidia_gpu_collector_read_errors{{{id}}}"), 0.0),
    ] {
        assert_eq!(lookup(&samples, &series), Some(want), "{series}");
    }
    let probed: Vec<_> = samples
        .keys()
        .filter(|s| s.label("link") == Some("4"))
        .collect();
    assert!(probed.is_empty(), "probed past the link count: {probed:?}");
    assert!(
        !samples.values().any(|v| *v == 999.0),
        "replay/recovery read by function, not field"
    );
    // No cheap CRC source (the per-GPU CRC fields are not offered, as on an
    // H200): the totals leave the CRC counters out rather than call per link.
    let crc = |s: &Series| s.label("counter").is_some_and(|c| c.starts_with("crc_"));
    assert!(!samples
        .iter()
        .any(|(s, v)| s.label("counter") == Some("crc_flit") && *v == 3.0));
    let totals: Vec<_> = samples
        .keys()
        .filter(|s| crc(s) && s.label("link").is_none())
        .collect();
    assert!(totals.is_empty(), "{totals:?}");
}

/// The NVLink scenarios: the default set stays within 100 series a GPU (it was
/// 162 on the demo H100 with per-link series) and holds no per-link series.
#[test]
fn default_set_stays_within_101_series_per_nvlink_gpu() {
    for scenario_name in ["h100x8", "nvlink-fields"] {
        let output = exporter(scenario_name, &["--stdout"]);
        assert_eq!(output.code(), Some(0), "{scenario_name}");
        let (text, samples) = (output.text(), output.samples());
        let gpus: std::collections::BTreeSet<&str> =
            samples.keys().filter_map(|s| s.label("gpu")).collect();
        assert!(!gpus.is_empty());
        for gpu in gpus {
            let series = samples
                .keys()
                .filter(|s| s.label("gpu") == Some(gpu))
                .count();
            // 100, and the tasks collector's unattributed energy (a task
            // adds 4 while it holds the GPU: none here).
            assert!(
                series <= 101,
                "{scenario_name}: GPU {gpu} has {series} series"
            );
            assert!(
                value(&samples, "nvidia_gpu_nvlink_links", &[("gpu", gpu)]).is_some(),
                "{scenario_name}: GPU {gpu} lacks its NVLink totals"
            );
        }
        assert!(
            !samples.keys().any(|s| s.label("link").is_some()),
            "{scenario_name}: per-link series by default"
        );
        assert!(!text.contains("nvidia_gpu_nvlink_link_"), "{scenario_name}");
    }
}

/// With both NVLink collectors on, each per-GPU total equals the sum of the
/// per-link values (the per-link CRC counters come from the single function,
/// the totals from NVML's per-GPU fields), and the link counts agree.
#[test]
fn nvlink_totals_equal_the_sum_of_the_links() {
    for (scenario_name, counters) in [
        (
            "h100x8",
            &["replay", "recovery", "crc_flit", "crc_data"][..],
        ),
        ("nvlink-fields", &["replay", "recovery"][..]),
    ] {
        let output = exporter(scenario_name, &["--stdout", "--collector", "nvlink-links"]);
        assert_eq!(output.code(), Some(0), "{scenario_name}");
        let samples = output.samples();
        let gpus: std::collections::BTreeSet<&str> =
            samples.keys().filter_map(|s| s.label("gpu")).collect();
        for gpu in gpus {
            let of = |name: &str| select(&samples, name, &[("gpu", gpu)]);
            let one = |name: &str| -> f64 {
                let found = of(name);
                assert_eq!(found.len(), 1, "{scenario_name} GPU {gpu}: {name}");
                found[0].1
            };
            let at = format!("{scenario_name} GPU {gpu}");
            let links = of("nvidia_gpu_nvlink_link_active");
            assert_eq!(one("nvidia_gpu_nvlink_links"), links.len() as f64, "{at}");
            let active: f64 = links.iter().map(|s| s.1).sum();
            assert_eq!(one("nvidia_gpu_nvlink_links_active"), active, "{at}");
            for counter in counters {
                let per_link: Vec<f64> = of("nvidia_gpu_nvlink_link_errors_total")
                    .iter()
                    .filter(|s| s.0.label("counter") == Some(counter))
                    .map(|s| s.1)
                    .collect();
                assert_eq!(per_link.len(), links.len(), "{at}: {counter}");
                let total: Vec<f64> = of("nvidia_gpu_nvlink_errors_total")
                    .iter()
                    .filter(|s| s.0.label("counter") == Some(counter))
                    .map(|s| s.1)
                    .collect();
                assert_eq!(total, [per_link.iter().sum::<f64>()], "{at}: {counter}");
            }
            for (total, per_link) in [
                (
                    "nvidia_gpu_nvlink_transmit_bytes_total",
                    "nvidia_gpu_nvlink_link_transmit_bytes_total",
                ),
                (
                    "nvidia_gpu_nvlink_receive_bytes_total",
                    "nvidia_gpu_nvlink_link_receive_bytes_total",
                ),
            ] {
                let per_link = of(per_link);
                assert_eq!(per_link.len(), links.len(), "{at}: {total}");
                let sum: f64 = per_link.iter().map(|s| s.1).sum();
                assert!(sum > 0.0, "{at}: {total}");
                assert_eq!(one(total), sum, "{at}: {total}");
            }
        }
    }
}

/// The per-link families appear only with `--collector nvlink-links`, and that
/// collector alone writes no totals.
#[test]
fn per_link_families_only_with_the_opt_in_collector() {
    let default = String::from_utf8(exporter("h100x8", &["--stdout"]).stdout).unwrap();
    let links_only = String::from_utf8(
        exporter(
            "h100x8",
            &[
                "--stdout",
                "--no-collector",
                "nvlink",
                "--collector",
                "nvlink-links",
            ],
        )
        .stdout,
    )
    .unwrap();
    for family in [
        "nvidia_gpu_nvlink_link_active",
        "nvidia_gpu_nvlink_link_errors_total",
        "nvidia_gpu_nvlink_link_transmit_bytes_total",
        "nvidia_gpu_nvlink_link_receive_bytes_total",
    ] {
        let declared = |text: &str| {
            let file = exposition::parse_all(text).unwrap();
            file.families.get(family).and_then(|f| f.kind.clone())
        };
        assert_eq!(declared(&default), None, "{family} by default");
        assert!(
            declared(&links_only).is_some(),
            "{family} missing when asked for"
        );
    }
    // 18 links x (state, 4 error counters, 2 data counters) on each of 8 GPUs.
    let links = parsed(&links_only);
    let per_link = links.keys().filter(|s| s.label("link").is_some());
    assert_eq!(per_link.count(), 8 * 18 * 7);
    assert!(!links_only.contains("nvidia_gpu_nvlink_links"));
    let families = exposition::parse_all(&links_only).unwrap().families;
    assert!(!families.contains_key("nvidia_gpu_nvlink_errors_total"));
}

/// HGX H100 with NVSwitches: the fabric is completed on both GPUs; a health
/// mask that is not zero (every condition "false") is no fault, and the
/// degraded GPU says degraded bandwidth and limited capacity, nothing else.
#[test]
fn hgx_fabric_completed_healthy_and_degraded() {
    let (_, samples) = golden::case(ex(), "hgx-h100-fabric", "hgx-h100-fabric", &[], 0);
    let condition = |gpu, condition| {
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health_condition",
            gpu,
            &[("condition", condition)],
        )
    };
    for gpu in ["0", "1"] {
        let state = |state| {
            gpu_value(
                &samples,
                "nvidia_gpu_fabric_state",
                gpu,
                &[("state", state)],
            )
        };
        assert_eq!(state("completed"), Some(1.0));
        assert_eq!(state("not_started"), Some(0.0));
        for healthy in [
            "route_recovery",
            "route_unhealthy",
            "access_timeout_recovery",
            "incorrect_configuration",
        ] {
            assert_eq!(condition(gpu, healthy), Some(0.0), "GPU {gpu} {healthy}");
        }
    }
    assert_eq!(condition("0", "degraded_bandwidth"), Some(0.0));
    assert_eq!(condition("1", "degraded_bandwidth"), Some(1.0));
    let summary = |gpu, summary| {
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health",
            gpu,
            &[("summary", summary)],
        )
    };
    assert_eq!(summary("0", "healthy"), Some(1.0));
    assert_eq!(summary("1", "limited_capacity"), Some(1.0));
}

/// Older drivers: struct version 2 (no summary) and the unversioned call
/// (no health at all) give what they have.
#[test]
fn fabric_from_older_drivers_gives_what_they_have() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = ex().replaced(
        dir.path(),
        "hgx-h100-fabric",
        &[(
            "health_summary = 1 }",
            "health_summary = 1, max_version = 2 }",
        )],
    );
    let run = ex().run(&v2).stdout().finish().unwrap();
    run.assert_status(0);
    let samples = run.samples();
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health_condition",
            "0",
            &[("condition", "degraded_bandwidth")]
        ),
        Some(0.0)
    );
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_health",
            "0",
            &[("summary", "healthy")]
        ),
        None
    );
    assert!(run.stderr.is_empty(), "{run:?}");

    let lib = ex().fake_without(dir.path(), &["nvmlDeviceGetGpuFabricInfoV"]);
    let run = ex()
        .run("hgx-h100-fabric")
        .stdout()
        .lib(lib)
        .finish()
        .unwrap();
    run.assert_status(0);
    assert!(run.stderr.is_empty(), "{run:?}");
    let samples = run.samples();
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_state",
            "1",
            &[("state", "completed")]
        ),
        Some(1.0)
    );
    assert!(!samples
        .keys()
        .any(|s| s.name.starts_with("nvidia_gpu_fabric_health")));
}

/// GB200: the NVLink 5 counters, summed by default and per link on request
/// (link 7's 505 recoveries, its bit error rates), the Hopper counters absent; the clock event
/// times at the ids drivers from 580.82 answer them (269-271).
#[test]
fn gb200_nvlink5_counters_and_clique() {
    golden::case(ex(), "gb200-nvl72", "gb200-nvl72", &[], 0);
    let (_, samples) = golden::case(
        ex(),
        "gb200-nvl72-links",
        "gb200-nvl72",
        &["--collector", "nvlink-links"],
        0,
    );
    let link = |name, link: &str, labels: &[(&str, &str)]| {
        let mut all = vec![("link", link)];
        all.extend_from_slice(labels);
        gpu_value(&samples, name, "0", &all)
    };
    assert_eq!(
        link(
            "nvidia_gpu_nvlink_link_recoveries_total",
            "7",
            &[("result", "successful")]
        ),
        Some(505.0)
    );
    assert_eq!(
        link(
            "nvidia_gpu_nvlink_link_recoveries_total",
            "6",
            &[("result", "successful")]
        ),
        Some(0.0)
    );
    assert_eq!(
        link(
            "nvidia_gpu_nvlink_link_errors_total",
            "7",
            &[("counter", "effective")]
        ),
        Some(12.0)
    );
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_clocks_event_seconds_total",
            "0",
            &[("reason", "sw_thermal_slowdown")]
        ),
        Some(2.5)
    );
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_fabric_info",
            "0",
            &[("clique_id", "3")]
        ),
        Some(1.0)
    );
}

/// B200 on an HGX board: fabric and NVLink 5 counters at zero.
#[test]
fn b200_fabric_and_nvlink5() {
    let (_, samples) = golden::case(ex(), "b200", "b200", &[], 0);
    assert_eq!(
        gpu_value(
            &samples,
            "nvidia_gpu_nvlink_recoveries_total",
            "0",
            &[("result", "failed")]
        ),
        Some(0.0)
    );
}

/// nvlink-fields with its link 3 down.
const LINK_3_DOWN: (&str, &str) = (
    "{ active = true, errors = { replay = 999, recovery = 999, crc_flit = 2",
    "{ active = false, errors = { replay = 999, recovery = 999, crc_flit = 2",
);

/// A link active earlier in this boot that is down now is counted lost (the
/// state remembers which links were seen active); a fresh state knows none,
/// and a link asleep is not lost.
#[test]
fn a_link_that_went_down_is_counted_lost() {
    let state = tempfile::tempdir().unwrap();
    let first = ex().run_args(
        "nvlink-fields",
        state.path(),
        &["--stdout", "--write-state"],
        &[],
    );
    assert_eq!(first.code(), Some(0));
    assert_eq!(
        gpu_value(&first.samples(), "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(0.0)
    );
    let dir = tempfile::tempdir().unwrap();
    let down = ex().replaced(dir.path(), "nvlink-fields", &[LINK_3_DOWN]);
    let second = ex().run_args(&down, state.path(), &["--stdout", "--write-state"], &[]);
    assert_eq!(second.code(), Some(0));
    let samples = second.samples();
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_active", "0", &[]),
        Some(2.0)
    );
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(1.0)
    );
    let fresh = exporter(&down, &["--stdout"]);
    assert_eq!(
        gpu_value(&fresh.samples(), "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(0.0)
    );
    // A link asleep (state field 2, NVML_NVLINK_STATE_SLEEP) is not active
    // and not lost.
    let asleep = ex().replaced(
        dir.path(),
        "nvlink-fields",
        &[("field_values = { ", "field_values = { \"165:1\" = 2, ")],
    );
    let third = ex().run_args(&asleep, state.path(), &["--stdout", "--write-state"], &[]);
    assert_eq!(third.code(), Some(0), "{}", third.err());
    let samples = third.samples();
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_active", "0", &[]),
        Some(2.0)
    );
    assert_eq!(
        gpu_value(&samples, "nvidia_gpu_nvlink_links_lost", "0", &[]),
        Some(0.0)
    );
}

/// A run that does not read the links (`--no-collector nvlink`) keeps the
/// links the state saw active: a later loss is still counted.
#[test]
fn a_run_without_the_links_keeps_the_links_seen_active() {
    let state = tempfile::tempdir().unwrap();
    let store = ["--stdout", "--write-state"];
    let first = ex().run_args("nvlink-fields", state.path(), &store, &[]);
    assert_eq!(first.code(), Some(0), "{}", first.err());
    let without = ["--stdout", "--write-state", "--no-collector", "nvlink"];
    let second = ex().run_args("nvlink-fields", state.path(), &without, &[]);
    assert_eq!(second.code(), Some(0), "{}", second.err());
    let lost = |run: &Outcome| gpu_value(&run.samples(), "nvidia_gpu_nvlink_links_lost", "0", &[]);
    assert_eq!(lost(&second), None, "no links read, none published");
    let dir = tempfile::tempdir().unwrap();
    let down = ex().replaced(dir.path(), "nvlink-fields", &[LINK_3_DOWN]);
    let third = ex().run_args(&down, state.path(), &store, &[]);
    assert_eq!(third.code(), Some(0), "{}", third.err());
    assert_eq!(lost(&third), Some(1.0));
}

/// While the state of a link seen active cannot be read, whether it is lost
/// is not known: `links_lost` is left out, not 0, and comes back once read.
#[test]
fn links_lost_is_left_out_while_a_link_seen_active_is_unread() {
    let state = tempfile::tempdir().unwrap();
    let store = ["--stdout", "--write-state"];
    let first = ex().run_args("nvlink-fields", state.path(), &store, &[]);
    assert_eq!(first.code(), Some(0), "{}", first.err());
    let dir = tempfile::tempdir().unwrap();
    let link_down = LINK_3_DOWN;
    let lost = |run: &Outcome| gpu_value(&run.samples(), "nvidia_gpu_nvlink_links_lost", "0", &[]);
    let second = ex().run_args(
        &ex().replaced(dir.path(), "nvlink-fields", &[link_down]),
        state.path(),
        &store,
        &[],
    );
    assert_eq!(lost(&second), Some(1.0));
    let unread = ex().replaced(
        dir.path(),
        "nvlink-fields",
        &[
            link_down,
            (
                "nvlinks = [",
                "errors = { nvmlDeviceGetNvLinkState = \"UNKNOWN\" }\nnvlinks = [",
            ),
        ],
    );
    let third = ex().run_args(&unread, state.path(), &store, &[]);
    assert_eq!(third.code(), Some(0), "{}", third.err());
    assert_eq!(lost(&third), None, "{}", third.text());
    let fourth = ex().run_args(
        &ex().replaced(dir.path(), "nvlink-fields", &[link_down]),
        state.path(),
        &store,
        &[],
    );
    assert_eq!(lost(&fourth), Some(1.0));
}

/// With both NVLink collectors on, the per-link one reads the link count of
/// the batch too (4): it asks the state of those 4 links, not of links up to
/// the first NVML does not know; the totals collector asks the 4 too (the
/// state field is not answered here).
#[test]
fn both_nvlink_collectors_read_the_link_count() {
    let state = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let out = ex().run_args(
        "nvlink-fields",
        state.path(),
        &["--stdout", "--collector", "nvlink-links"],
        &[("FAKE_NVML_CALL_LOG", log.path().to_str().unwrap())],
    );
    assert_eq!(out.code(), Some(0), "{}", out.err());
    let calls = Calls::read(log.path());
    assert_eq!(calls.total("nvmlDeviceGetNvLinkState"), 4 + 4, "{calls:?}");
}
