//! The state format of release 0.1.0 (version 1), read once on the package
//! upgrade so that running totals continue. One record a line, fields split
//! by one space, the last running to the end of the line:
//! ```text
//! nvidia-textfile-exporter-state 1
//! boot <boot id>
//! driver <driver version>
//! host <key> <value>
//! gpu <uuid> <index> <pci bus id or -> <serial or ->
//! set <uuid> <key> <value>
//! end <number of lines before this one>
//! ```
//! Keys this reader does not know are dropped. Each record is taken as it
//! is read, within the schema's bounds: the first GPU, fixed reading or XID
//! series past its bound is damage, and reading stops there.

use std::collections::BTreeMap;

use super::schema::{Carry, Damage, GpuState, State, Stream, MAX_FIXED, MAX_GPUS, VERSION};
use crate::kernel_log::{Counts, Series, XidOf, MAX_SERIES};

/// The first line of a version 1 file.
pub const MAGIC: &str = "nvidia-textfile-exporter-state 1";

/// The version 1 file `text` in the schema.
pub fn parse(text: &str) -> Result<State, Damage> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(Damage::V1("not a state file"));
    }
    if !text.ends_with('\n') {
        return Err(Damage::V1("truncated"));
    }
    let mut state = State {
        version: VERSION,
        ..State::default()
    };
    let mut ended = false;
    for (before, line) in (1..).zip(lines) {
        if ended {
            return Err(Damage::V1("text after the end line"));
        }
        let bad = |what| Damage::V1Line(what, line.to_owned());
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "boot" => state.boot_id = rest.to_owned(),
            "driver" => state.driver_version = rest.to_owned(),
            "host" => {
                let no_value = Damage::V1("a host line without a value");
                let (key, value) = rest.split_once(' ').ok_or(no_value)?;
                if let Some(key) = key.strip_prefix("xid.") {
                    xid_record(&mut state.xid, key, value)?;
                }
            }
            "gpu" => {
                let [uuid, index, bus, serial] = rest.splitn(5, ' ').collect::<Vec<_>>()[..] else {
                    return Err(bad("bad gpu line"));
                };
                let undash = |text: &str| if text == "-" { "" } else { text }.to_owned();
                let gpu = GpuState {
                    index: index.parse().map_err(|_| bad("bad index in"))?,
                    pci_bus_id: undash(bus),
                    serial: undash(serial),
                    ..GpuState::default()
                };
                insert_within(&mut state.gpus, uuid.to_owned(), gpu, MAX_GPUS)
                    .ok_or(Damage::Gpus)?;
            }
            "set" => {
                let [uuid, key, value] = rest.splitn(3, ' ').collect::<Vec<_>>()[..] else {
                    return Err(bad("bad set line"));
                };
                let unlisted = || Damage::V1Line("an entry for an unlisted GPU", uuid.to_owned());
                let gpu = state.gpus.get_mut(uuid).ok_or_else(unlisted)?;
                set(gpu, key, value).ok_or_else(|| Damage::Fixed(uuid.to_owned()))?;
            }
            "end" if rest.parse() == Ok(before) => ended = true,
            "end" => return Err(Damage::V1("truncated (line count does not match)")),
            _ => return Err(bad("unknown line")),
        }
    }
    if !ended {
        return Err(Damage::V1("truncated (no end line)"));
    }
    Ok(state)
}

/// Inserts `key` into `map` unless that would make it longer than `max`.
fn insert_within<K: Ord, V>(map: &mut BTreeMap<K, V>, key: K, value: V, max: usize) -> Option<()> {
    if map.len() >= max && !map.contains_key(&key) {
        return None;
    }
    map.insert(key, value);
    Some(())
}

/// Takes the version 1 record `key value` into `gpu`; `None`: a fixed
/// reading past [`MAX_FIXED`].
fn set(gpu: &mut GpuState, key: &str, value: &str) -> Option<()> {
    match key {
        "reads_us" => gpu.reads_us = value.parse().ok(),
        "left_enumeration" => gpu.left_enumeration = true,
        // Now the gpm collector's part, which this module does not know:
        // the reason is said once more after the upgrade.
        "gpm_unavailable" => {}
        _ if key.starts_with("threshold.") => {
            let reading = match value {
                "not_supported" => Some(None),
                _ => value.parse().ok().map(Some),
            };
            // A reading that is not one is dropped: it is read again.
            if let Some(reading) = reading {
                return insert_within(&mut gpu.fixed, key.to_owned(), reading, MAX_FIXED);
            }
        }
        // A carry that is not one is dropped: its totals start afresh.
        _ => {
            if let (Some(stream), Some(carry)) = (stream(key), carry(value)) {
                gpu.carries.insert(stream, carry);
            }
        }
    }
    Some(())
}

/// The stream whose carry the version 1 key `key` is.
fn stream(key: &str) -> Option<Stream> {
    Some(match key {
        "boot.util.gpu" => Stream::Gpu,
        "boot.util.memory" => Stream::Memory,
        "boot.util.encoder" => Stream::Encoder,
        "boot.util.decoder" => Stream::Decoder,
        "boot.util.process" => Stream::Processes,
        _ => return None,
    })
}

/// A version 1 carry, `last period busy sampled`.
fn carry(text: &str) -> Option<Carry> {
    let mut numbers = text.split(' ').map(str::parse);
    let mut next = || numbers.next()?.ok();
    let carry = Carry {
        last_us: next()?,
        period_us: next()?,
        busy_percent_us: next()?,
        sampled_us: next()?,
    };
    (numbers.next().is_none() && carry.is_possible()).then_some(carry)
}

/// Takes the xid collector's version 1 host record `xid.<key> <value>` into
/// `counts` (`xid.cursor`, …, the counts `xid.[recount.]gpu.<uuid>.<code>`
/// and `xid.[recount.]bus.<bus id>.<code>`), at most [`MAX_SERIES`] series
/// in the totals and in a recount.
fn xid_record(counts: &mut Counts, key: &str, value: &str) -> Result<(), Damage> {
    match key {
        "source" => counts.source = value.to_owned(),
        "cursor" => counts.position.cursor = Some(value.to_owned()),
        "monotonic" => counts.position.monotonic = value.parse().ok(),
        "kmsg_seq" => counts.position.kmsg_seq = value.parse().ok(),
        "unavailable" => counts.unavailable = value == "1",
        "recount" => {
            counts.recount.get_or_insert_default();
        }
        _ => {
            let (totals, series) = match key.strip_prefix("recount.") {
                Some(series) => (counts.recount.get_or_insert_default(), series),
                None => (&mut counts.totals, key),
            };
            let (what, code) = series.rsplit_once('.').unwrap_or_default();
            let (id, code) = match (what.split_once('.'), code.parse()) {
                (Some(("gpu", uuid)), Ok(code)) => (XidOf::Gpu(uuid.to_owned()), code),
                (Some(("bus", bus)), Ok(code)) => (XidOf::Bus(bus.to_owned()), code),
                _ => return Ok(()),
            };
            let not_a_number = |_| Damage::XidCount(key.to_owned(), value.to_owned());
            let count = value.parse().map_err(not_a_number)?;
            let series = Series::Xid { id, code };
            insert_within(&mut totals.0, series, count, MAX_SERIES).ok_or(Damage::XidSeries)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::schema::MAX_SIZE;

    /// A version 1 file as release 0.1.0 wrote it, with every kind of record.
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
    fn every_record_of_the_old_format_is_converted() {
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
        assert!(gpu.left_enumeration);
        assert_eq!(gpu.reads_us, Some(98));
        assert_eq!(gpu.fixed["threshold.shutdown"], Some(92));
        assert_eq!(gpu.fixed["threshold.memory_max"], None);
        let xid = &state.xid;
        assert_eq!(xid.source, "journal");
        let at = &xid.position;
        assert_eq!(at.cursor.as_deref(), Some("s=ab;i=1;b=cd;m=f4240"));
        assert_eq!((at.monotonic, at.kmsg_seq), (Some(1_000_000), None));
        let series = |id, code| Series::Xid { id, code };
        let gpu_a = || series(XidOf::Gpu("GPU-a".into()), 79);
        let bus = series(XidOf::Bus("00000000:3B:00".into()), 13);
        assert_eq!(xid.totals.0, BTreeMap::from([(gpu_a(), 3), (bus, 1)]));
        let recount = &xid.recount.as_ref().unwrap().0;
        assert_eq!(recount, &BTreeMap::from([(gpu_a(), 2)]));
    }

    #[test]
    fn damaged_files_are_refused_with_a_reason() {
        let truncated = &FILE[..FILE.len() - 8];
        assert!(parse(truncated)
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        let without_end: String = FILE.lines().take(4).map(|l| format!("{l}\n")).collect();
        assert!(parse(&without_end)
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        assert!(parse("garbage\n").is_err());
        assert!(parse(&FILE.replace("set GPU-a reads", "set GPU-b reads")).is_err());
        let not_a_count = FILE.replace("GPU-a.79 3", "GPU-a.79 x");
        assert!(parse(&not_a_count)
            .unwrap_err()
            .to_string()
            .contains("not a number"));
    }

    /// Records past a bound are damage where they pass it: reading stops
    /// there, before the damaged line after them.
    #[test]
    fn reading_stops_at_the_first_record_past_a_bound() {
        let file = |records: String| format!("{MAGIC}\n{records}a damaged line\n");
        let gpus: String = (0..1_300_000).map(|n| format!("gpu {n} 0 - -\n")).collect();
        let gpus = file(gpus);
        assert!(gpus.len() as u64 <= MAX_SIZE, "{} bytes", gpus.len());
        assert!(matches!(parse(&gpus), Err(Damage::Gpus)));
        let fixed = (0..=MAX_FIXED).map(|n| format!("set GPU-a threshold.{n} 1\n"));
        let fixed = file(format!("gpu GPU-a 0 - -\n{}", fixed.collect::<String>()));
        assert!(matches!(parse(&fixed), Err(Damage::Fixed(uuid)) if uuid == "GPU-a"));
        for counts in ["xid.gpu.GPU-a", "xid.recount.bus.00000000:3B:00"] {
            let xids = (0..=MAX_SERIES).map(|n| format!("host {counts}.{n} 1\n"));
            let xids = file(xids.collect());
            assert!(matches!(parse(&xids), Err(Damage::XidSeries)), "{counts}");
        }
    }
}
