//! The reader of the state format before the schema (version 1, written up
//! to release 0.1.0), so that the running totals continue across the package
//! upgrade: the first run of the new release reads it, converts it once, and
//! stores the schema's version in its place.
//!
//! Version 1 is a line format, one record per line, fields separated by one
//! space, the last field running to the end of the line:
//! ```text
//! nvidia-textfile-exporter-state 1
//! boot <boot id>
//! driver <driver version>
//! host <key> <value>
//! gpu <uuid> <index> <pci bus id or -> <serial or ->
//! set <uuid> <key> <value>
//! end <number of lines before this one>
//! ```
//! The keys are the readers' of that release; entries this converter does not
//! know are dropped (as that release dropped them on a driver change).

use std::collections::BTreeMap;

use super::schema::{Carry, GpuState, State, Stream, XidCounts, XidTotals, VERSION};

/// The first line of a version 1 file.
pub const MAGIC: &str = "nvidia-textfile-exporter-state 1";

/// The version 1 file `text` in the schema; the error says what is wrong.
pub fn parse(text: &str) -> Result<State, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err("not a state file".into());
    }
    if !text.ends_with('\n') {
        return Err("truncated".into());
    }
    let mut state = State {
        version: VERSION,
        ..State::default()
    };
    let mut host = BTreeMap::new();
    let mut count = 1;
    let mut ended = false;
    for line in lines {
        if ended {
            return Err("text after the end line".into());
        }
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "boot" => state.boot_id = rest.to_owned(),
            "driver" => state.driver_version = rest.to_owned(),
            "host" => {
                let (key, value) = rest.split_once(' ').ok_or("a host line without a value")?;
                host.insert(key, value);
            }
            "gpu" => {
                let [uuid, index, bus, serial] = rest.split(' ').collect::<Vec<_>>()[..] else {
                    return Err(format!("bad gpu line {line:?}"));
                };
                let undash = |text: &str| if text == "-" { "" } else { text }.to_owned();
                let gpu = GpuState {
                    index: index
                        .parse()
                        .map_err(|_| format!("bad index in {line:?}"))?,
                    pci_bus_id: undash(bus),
                    serial: undash(serial),
                    ..GpuState::default()
                };
                state.gpus.insert(uuid.to_owned(), gpu);
            }
            "set" => {
                let mut fields = rest.splitn(3, ' ');
                let (Some(uuid), Some(key), Some(value)) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    return Err(format!("bad set line {line:?}"));
                };
                let gpu = state
                    .gpus
                    .get_mut(uuid)
                    .ok_or_else(|| format!("an entry for an unlisted GPU {uuid:?}"))?;
                set(gpu, key, value);
            }
            "end" => {
                if rest.parse() != Ok(count) {
                    return Err("truncated (line count does not match)".into());
                }
                ended = true;
                continue;
            }
            _ => return Err(format!("unknown line {line:?}")),
        }
        count += 1;
    }
    if !ended {
        return Err("truncated (no end line)".into());
    }
    state.xid = xid_counts(&host)?;
    Ok(state)
}

/// Takes the version 1 entry `key value` into `gpu`. A carry that is not
/// one is dropped (its totals start afresh, as that release did).
fn set(gpu: &mut GpuState, key: &str, value: &str) {
    let stream = match key {
        "boot.util.gpu" => Some(Stream::Gpu),
        "boot.util.memory" => Some(Stream::Memory),
        "boot.util.encoder" => Some(Stream::Encoder),
        "boot.util.decoder" => Some(Stream::Decoder),
        "boot.util.process" => Some(Stream::Processes),
        _ => None,
    };
    if let Some(stream) = stream {
        if let Some(carry) = carry(value) {
            gpu.carries.insert(stream, carry);
        }
    } else if key == "reads_us" {
        gpu.reads_us = value.parse().ok();
    } else if key == "left_enumeration" {
        gpu.left_enumeration = true;
    } else if key == "gpm_unavailable" {
        gpu.gpm_unavailable = Some(value.to_owned());
    } else if key.starts_with("threshold.") {
        let reading = if value == "not_supported" {
            Some(None)
        } else {
            value.parse().ok().map(Some)
        };
        if let Some(reading) = reading {
            gpu.fixed.insert(key.to_owned(), reading);
        }
    }
}

/// A version 1 carry, `last period busy sampled`.
fn carry(text: &str) -> Option<Carry> {
    let numbers: Vec<u64> = text
        .split(' ')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [last_us, period_us, busy_percent_us, sampled_us] = numbers[..] else {
        return None;
    };
    let carry = Carry {
        last_us,
        period_us,
        busy_percent_us,
        sampled_us,
    };
    carry.is_possible().then_some(carry)
}

/// The xid collector's version 1 host entries (`xid.source`, `xid.cursor`,
/// `xid.monotonic`, `xid.kmsg_seq`, `xid.unavailable`, `xid.recount` and the
/// counts `xid.[recount.]gpu.<uuid>.<code>` and `xid.[recount.]bus.<bus
/// id>.<code>`). A count that is not a number is damage: the file is refused.
fn xid_counts(host: &BTreeMap<&str, &str>) -> Result<XidCounts, String> {
    let mut counts = XidCounts::default();
    for (&key, &value) in host {
        let Some(key) = key.strip_prefix("xid.") else {
            continue;
        };
        match key {
            "source" => counts.source = value.to_owned(),
            "cursor" => counts.cursor = Some(value.to_owned()),
            "monotonic" => counts.monotonic = value.parse().ok(),
            "kmsg_seq" => counts.kmsg_seq = value.parse().ok(),
            "unavailable" => counts.unavailable = value == "1",
            "recount" => {
                counts.recount.get_or_insert_with(XidTotals::default);
            }
            _ => {
                let (totals, series) = match key.strip_prefix("recount.") {
                    Some(series) => (
                        counts.recount.get_or_insert_with(XidTotals::default),
                        series,
                    ),
                    None => (&mut counts.totals, key),
                };
                let Some((what, code)) = series.rsplit_once('.') else {
                    continue;
                };
                let Ok(code) = code.parse::<u32>() else {
                    continue;
                };
                let into = if let Some(uuid) = what.strip_prefix("gpu.") {
                    totals.gpus.entry(uuid.to_owned()).or_default()
                } else if let Some(bus) = what.strip_prefix("bus.") {
                    totals.unattributed.entry(bus.to_owned()).or_default()
                } else {
                    continue;
                };
                let count = value
                    .parse()
                    .map_err(|_| format!("the XID count xid.{key} is {value:?}, not a number"))?;
                into.insert(code, count);
            }
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 1 file as release 0.1.0 wrote it, with every kind of entry.
    const FILE: &str = "nvidia-textfile-exporter-state 1
boot b0
driver 580.1
host xid.cursor s=ab;i=1;b=cd;m=f4240
host xid.gpu.GPU-a.79 3
host xid.bus.00000000:3B:00.13 1
host xid.monotonic 1000000
host xid.recount 1
host xid.recount.gpu.GPU-a.79 2
host xid.source journal
gpu GPU-a 1 00000000:17:00.0 -
set GPU-a boot.util.gpu 1800000110000000 200000 1220000000 24200000
set GPU-a boot.util.process 1800000110000000 200000 100 1
set GPU-a boot.util.memory 1 2 301 3
set GPU-a gpm_unavailable paused
set GPU-a left_enumeration 1
set GPU-a reads_us 98
set GPU-a threshold.shutdown 92
set GPU-a threshold.memory_max not_supported
end 19
";

    #[test]
    fn every_entry_of_the_old_format_is_converted() {
        let state = parse(FILE).unwrap();
        assert_eq!(
            (
                state.version,
                state.boot_id.as_str(),
                state.driver_version.as_str()
            ),
            (VERSION, "b0", "580.1")
        );
        let gpu = &state.gpus["GPU-a"];
        assert_eq!(
            (gpu.index, gpu.pci_bus_id.as_str(), gpu.serial.as_str()),
            (1, "00000000:17:00.0", "")
        );
        let gpu_carry = Carry {
            last_us: 1_800_000_110_000_000,
            period_us: 200_000,
            busy_percent_us: 1_220_000_000,
            sampled_us: 24_200_000,
        };
        assert_eq!(gpu.carries[&Stream::Gpu], gpu_carry);
        assert_eq!(gpu.carries[&Stream::Processes].busy_percent_us, 100);
        assert!(
            !gpu.carries.contains_key(&Stream::Memory),
            "an impossible carry is dropped"
        );
        assert_eq!(gpu.gpm_unavailable.as_deref(), Some("paused"));
        assert!(gpu.left_enumeration);
        assert_eq!(gpu.reads_us, Some(98));
        assert_eq!(gpu.fixed["threshold.shutdown"], Some(92));
        assert_eq!(gpu.fixed["threshold.memory_max"], None);
        let xid = &state.xid;
        assert_eq!(xid.source, "journal");
        assert_eq!(xid.cursor.as_deref(), Some("s=ab;i=1;b=cd;m=f4240"));
        assert_eq!(xid.monotonic, Some(1_000_000));
        assert_eq!(xid.totals.gpus["GPU-a"][&79], 3);
        assert_eq!(xid.totals.unattributed["00000000:3B:00"][&13], 1);
        assert_eq!(xid.recount.as_ref().unwrap().gpus["GPU-a"][&79], 2);
    }

    #[test]
    fn damaged_files_are_refused_with_a_reason() {
        let truncated = &FILE[..FILE.len() - 8];
        assert!(parse(truncated).unwrap_err().contains("truncated"));
        let without_end: String = FILE.lines().take(4).map(|l| format!("{l}\n")).collect();
        assert!(parse(&without_end).unwrap_err().contains("truncated"));
        assert!(parse("garbage\n").is_err());
        assert!(parse(&FILE.replace("set GPU-a reads", "set GPU-b reads")).is_err());
        let not_a_count = FILE.replace("GPU-a.79 3", "GPU-a.79 x");
        assert!(parse(&not_a_count).unwrap_err().contains("not a number"));
    }
}
