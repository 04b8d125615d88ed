//! Prometheus text exposition format 0.0.4, as a pure function of a [`Snapshot`];
//! all escaping lives here. Families appear sorted by name (as Prometheus' Go
//! client gathers them and node_exporter serves them), each under one HELP
//! and TYPE, only if it has samples; host samples precede the devices', which keep snapshot and
//! read order, each starting with `gpu="<index>",uuid="<uuid>"`; no timestamps.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::snapshot::{Sample, Snapshot};

/// Renders the snapshot as exposition text.
pub fn render(snapshot: &Snapshot) -> String {
    // Identity labels are escaped once per device.
    let identities: Vec<String> = snapshot
        .devices
        .iter()
        .map(|device| {
            let mut identity = format!("gpu=\"{}\",uuid=\"", device.index);
            escape_label_value(&device.uuid, &mut identity);
            identity + "\""
        })
        .collect();

    let mut families: BTreeMap<&str, Vec<(Option<&str>, &Sample)>> = BTreeMap::new();
    let devices = snapshot.devices.iter().zip(&identities);
    let device_samples = devices.flat_map(|(device, identity)| {
        (device.samples.iter()).map(move |sample| (Some(identity.as_str()), sample))
    });
    let host_samples = snapshot.host.iter().map(|sample| (None, sample));
    for (identity, sample) in host_samples.chain(device_samples) {
        let family = families.entry(sample.family.name).or_default();
        family.push((identity, sample));
    }

    let sample_count: usize = families.values().map(Vec::len).sum();
    let mut out = String::with_capacity(sample_count * 96 + 4096);
    for samples in families.values() {
        let family = samples[0].1.family;
        let _ = write!(out, "# HELP {} ", family.name);
        escape_help(family.help, &mut out);
        let _ = write!(out, "\n# TYPE {} {}\n", family.name, family.kind.as_str());
        for (identity, sample) in samples {
            out.push_str(family.name);
            let mut separator = '{';
            if let Some(identity) = identity {
                out.push(separator);
                out.push_str(identity);
                separator = ',';
            }
            for label in &sample.labels {
                let _ = write!(out, "{separator}{}=\"", label.name);
                escape_label_value(&label.value, &mut out);
                out.push('"');
                separator = ',';
            }
            if separator == ',' {
                out.push('}');
            }
            out.push(' ');
            format_value(sample.value, &mut out);
            out.push('\n');
        }
    }
    out
}

/// Appends `value` escaped for use inside a double-quoted label value.
pub fn escape_label_value(value: &str, out: &mut String) {
    // Copy the runs between special characters whole: most values have none.
    let mut rest = value;
    while let Some(at) = rest.find(['\\', '"', '\n']) {
        out.push_str(&rest[..at]);
        out.push_str(match rest.as_bytes()[at] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// Appends `help` escaped for a `# HELP` line.
pub fn escape_help(help: &str, out: &mut String) {
    out.push_str(&help.replace('\\', "\\\\").replace('\n', "\\n"));
}

/// Appends a sample value in the format's spelling (`NaN`, `+Inf`, `-Inf`).
pub fn format_value(value: f64, out: &mut String) {
    // Integers up to 2^53 are exact in an f64: printed as integers, the same text.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.fract() == 0.0 && value.abs() <= EXACT && value != 0.0 {
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{self, families};
    use crate::snapshot::Device;

    families! {
        TEMPERATURE: Gauge(Celsius), "nvidia_gpu_temperature_celsius", [], "GPU die temperature.";
        POWER: Gauge(Watts), "nvidia_gpu_power_watts", [], "Power drawn.";
        CLOCK: Gauge(Hertz), "nvidia_gpu_clock_hertz", ["clock"], "Clock frequency.";
    }

    fn escaped(value: &str) -> String {
        let mut out = String::new();
        escape_label_value(value, &mut out);
        out
    }

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(escaped(r"a\b"), r"a\\b");
        assert_eq!(escaped("say \"hi\""), r#"say \"hi\""#);
        assert_eq!(escaped("two\nlines"), r"two\nlines");
        assert_eq!(escaped("\\\"\n"), r#"\\\"\n"#);
    }

    #[test]
    fn label_values_keep_other_characters() {
        assert_eq!(escaped("GPU-ü{}#=,\t"), "GPU-ü{}#=,\t");
        assert_eq!(escaped("显卡"), "显卡");
    }

    #[test]
    fn help_escapes_backslash_and_newline_but_not_quotes() {
        let mut out = String::new();
        escape_help("a \"b\" \\ c\nd", &mut out);
        assert_eq!(out, "a \"b\" \\\\ c\\nd");
    }

    #[test]
    fn values_never_use_rust_spellings() {
        let format = |v: f64| {
            let mut out = String::new();
            format_value(v, &mut out);
            out
        };
        assert_eq!(format(f64::NAN), "NaN");
        assert_eq!(format(f64::INFINITY), "+Inf");
        assert_eq!(format(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format(0.87), "0.87");
        assert_eq!(format(81559.0 * 1048576.0), "85520809984");
        assert_eq!(format(-0.5), "-0.5");
        assert_eq!(format(0.0), "0");
        assert_eq!(format(-0.0), "-0");
        assert_eq!(format(-3.0), "-3");
        assert_eq!(format(1e20), "100000000000000000000");
        // 2^53, the last integer every f64 below it can hold; 2^53 + 2, the
        // next f64; 2^63, where an i64 cast would saturate (9223372036854775807):
        // the shortest text that parses back to the same f64.
        assert_eq!(format(9_007_199_254_740_992.0), "9007199254740992");
        assert_eq!(format(9_007_199_254_740_994.0), "9007199254740994");
        assert_eq!(format(9_223_372_036_854_775_808.0), "9223372036854776000");
    }

    fn device(index: u32, uuid: &str, samples: Vec<Sample>) -> Device {
        Device {
            index,
            uuid: uuid.into(),
            samples,
            ..Device::default()
        }
    }

    #[test]
    fn families_are_grouped_by_name_with_one_header_each() {
        let snapshot = Snapshot {
            host: vec![metrics::COLLECTOR_UP.sample(1.0)],
            devices: vec![
                device(
                    0,
                    "GPU-a",
                    vec![POWER.sample(100.0), TEMPERATURE.sample(40.0)],
                ),
                device(
                    1,
                    "GPU-b",
                    vec![TEMPERATURE.sample(50.0), POWER.sample(200.0)],
                ),
            ],
        };
        let text = render(&snapshot);
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "nvidia_gpu_collector_up 1",
                "nvidia_gpu_power_watts{gpu=\"0\",uuid=\"GPU-a\"} 100",
                "nvidia_gpu_power_watts{gpu=\"1\",uuid=\"GPU-b\"} 200",
                "nvidia_gpu_temperature_celsius{gpu=\"0\",uuid=\"GPU-a\"} 40",
                "nvidia_gpu_temperature_celsius{gpu=\"1\",uuid=\"GPU-b\"} 50",
            ]
        );
        assert_eq!(
            text.matches("# TYPE nvidia_gpu_power_watts gauge\n")
                .count(),
            1
        );
        assert_eq!(text.matches("# HELP nvidia_gpu_power_watts ").count(), 1);
        assert!(
            !text.contains("nvidia_gpu_utilization_ratio"),
            "empty family rendered"
        );
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn extra_labels_follow_identity_and_are_escaped() {
        let snapshot = Snapshot {
            host: vec![metrics::DRIVER_INFO.sample_with(["5\"5\n", "12.4", "12.550"], 1.0)],
            devices: vec![device(
                3,
                "GPU-\"x\"",
                vec![CLOCK.sample_with(["sm"], 1.5e9)],
            )],
        };
        let text = render(&snapshot);
        assert!(text.contains(
            "nvidia_gpu_driver_info{driver_version=\"5\\\"5\\n\",cuda_version=\"12.4\",nvml_version=\"12.550\"} 1\n"
        ));
        assert!(text.contains(
            "nvidia_gpu_clock_hertz{gpu=\"3\",uuid=\"GPU-\\\"x\\\"\",clock=\"sm\"} 1500000000\n"
        ));
    }

    #[test]
    fn a_family_is_its_help_type_and_samples_with_the_identity_first() {
        let snapshot = Snapshot {
            host: vec![metrics::COLLECTOR_UP.sample(1.0)],
            devices: vec![device(0, "GPU-0f1e", vec![TEMPERATURE.sample(41.0)])],
        };
        assert_eq!(
            render(&snapshot),
            concat!(
                "# HELP nvidia_gpu_collector_up 1 if this run read NVML, 0 if it did not (the reason is in nvidia_gpu_collector_error).\n",
                "# TYPE nvidia_gpu_collector_up gauge\n",
                "nvidia_gpu_collector_up 1\n",
                "# HELP nvidia_gpu_temperature_celsius GPU die temperature.\n",
                "# TYPE nvidia_gpu_temperature_celsius gauge\n",
                "nvidia_gpu_temperature_celsius{gpu=\"0\",uuid=\"GPU-0f1e\"} 41\n",
            )
        );
    }

    #[test]
    fn empty_snapshot_renders_nothing() {
        assert_eq!(render(&Snapshot::default()), "");
    }
}
