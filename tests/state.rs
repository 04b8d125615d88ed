//! The state directory through the binary: the upgrade from the format of
//! the previous release, bounds that never count twice, a state file system
//! that does not answer, and temporary files of killed runs.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use test_support::journal::{journal_entry, write_journal};
use test_support::{select, Exporter, Outcome};

const EXE: &str = env!("CARGO_BIN_EXE_nvidia-textfile-exporter");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The binary against the fake NVML, scenarios from tests/scenarios.
fn ex() -> &'static Exporter {
    static EXPORTER: OnceLock<Exporter> = OnceLock::new();
    EXPORTER.get_or_init(|| Exporter::beside(EXE, ROOT))
}

/// The GPU of the duty-cycle scenario.
const DUTY_GPU: &str = r#"gpu="0",uuid="GPU-d0c7c1e5-5a1e-4b0d-9c3e-200000000001""#;

/// A `--stdout --write-state` run of duty-cycle with the state in `state`
/// and the sample buffers' clock at `clock_us`.
fn duty_cycle_at(state: &Path, clock_us: u64) -> Outcome {
    let output = ex()
        .run("duty-cycle")
        .stdout()
        .state_dir(state)
        .env("FAKE_NVML_CLOCK_US", clock_us.to_string())
        .args(["--write-state", "--gpm-window", "0"])
        .finish()
        .expect("run the exporter");
    output.assert_status(0);
    output
}

/// The state file in `dir`, parsed as JSON.
fn state_json(dir: &Path) -> serde_json::Value {
    let text = fs::read_to_string(dir.join("state")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// tests/fixtures/state-v1-duty-cycle is the state file release 0.1.0 (the
/// format before the schema) left after two runs of duty-cycle, 10 s apart
/// (`FAKE_NVML_CLOCK_US` 1800000100000000, then 1800000110000000), and one
/// Xid 79 of its GPU in the journal: 24.2 s sampled, 12.2 s busy, one XID.
/// The upgraded binary reads it once, stores the schema in its place, and
/// the totals go on from there, run after run.
#[test]
fn the_previous_release_s_state_is_converted_once_and_its_totals_continue() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        fs::read_to_string(Path::new(ROOT).join("tests/fixtures/state-v1-duty-cycle")).unwrap();
    // The fixture's boot is replaced by this one's: a state is per boot.
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let upgraded: String = fixture
        .lines()
        .map(|line| match line.strip_prefix("boot ") {
            Some(_) => format!("boot {}\n", boot.trim()),
            None => format!("{line}\n"),
        })
        .collect();
    assert!(upgraded.contains("\nhost xid.cursor "), "{upgraded}");
    let path = dir.path().join("state");
    fs::write(&path, upgraded).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();

    let series = |name: &str, labels: &str| format!("{name}{{{labels}}}");
    let sampled = series(
        "nvidia_gpu_sampled_seconds_total",
        &format!("{DUTY_GPU},engine=\"gpu\""),
    );
    let busy = series(
        "nvidia_gpu_busy_seconds_total",
        &format!("{DUTY_GPU},engine=\"gpu\""),
    );
    let xids = series("nvidia_gpu_xid_errors_total", DUTY_GPU);
    // 10 s after the fixture's last run, and 10 s after that: 5 s busy each.
    for (run, clock_us, want_sampled, want_busy) in [
        (1, 1_800_000_120_000_000, 34.2, 17.2),
        (2, 1_800_000_130_000_000, 44.2, 22.2),
    ] {
        let out = duty_cycle_at(dir.path(), clock_us);
        let near = |value: Option<f64>, want: f64| value.is_some_and(|v| (v - want).abs() < 1e-6);
        assert!(
            near(out.series(&sampled), want_sampled),
            "run {run}: {:?}, not {want_sampled}: {}",
            out.series(&sampled),
            out.err()
        );
        assert!(near(out.series(&busy), want_busy), "run {run}");
        assert_eq!(out.series(&xids), Some(1.0), "run {run}");
        assert_eq!(
            out.series("nvidia_gpu_collector_state_ok"),
            Some(1.0),
            "run {run}: {}",
            out.err()
        );
        let stored = state_json(dir.path());
        assert_eq!(stored["version"], 2, "run {run}");
        assert!(stored["xid"]["cursor"].is_string(), "run {run}: {stored}");
    }
}

/// The XID codes each GPU logs in [`xids_of_64_gpus_are_counted_once`].
const CODES: [u32; 16] = [
    13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95,
];

/// A scenario of 64 GPUs, at bus ids 00000000:01:00.0 to 00000000:40:00.0.
fn sixty_four_gpus() -> String {
    let mut toml = String::from("description = \"64 GPUs\"\n");
    for n in 1..=64u32 {
        write!(
            toml,
            "\n[[gpu]]\nuuid = \"GPU-00000000-0000-0000-0000-{n:012}\"\nname = \"NVIDIA H200\"\n\
             pci = {{ bus_id = \"00000000:{n:02X}:00.0\", domain = 0, bus = {n}, device = 0, \
             pci_device_id = 0x233510de, pci_subsystem_id = 0x18b010de }}\n"
        )
        .unwrap();
    }
    toml
}

/// 64 GPUs with 16 distinct XID codes each are 1024 series, which filled the
/// state's bound of the format before the schema and pushed the kernel log's
/// position out of it: every run counted the boot again (1024, 2047,
/// 3070). The position is its own field now, and no bound can drop it: the
/// counts stay what the log holds.
#[test]
fn xids_of_64_gpus_are_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("64-gpus.toml");
    fs::write(&scenario, sixty_four_gpus()).unwrap();
    let journal = dir.path().join("journal");
    fs::create_dir(&journal).unwrap();
    let mut export = String::new();
    let mut monotonic = 1_000_000;
    for n in 1..=64u32 {
        for code in CODES {
            let line = format!("NVRM: Xid (PCI:0000:{n:02x}:00): {code}, pid=1, name=x, test");
            export += &journal_entry(monotonic, "kernel", &line);
            monotonic += 1000;
        }
    }
    write_journal(&journal, "a.journal", &export);
    let state = dir.path().join("state");
    for run in 1..=3 {
        let out = ex()
            .run(scenario.to_str().unwrap())
            .stdout()
            .state_dir(&state)
            .journal_dir(&journal)
            .args(["--write-state", "--gpm-window", "0", "--timeout", "10s"])
            .finish()
            .expect("run the exporter");
        out.assert_status(0);
        let samples = out.samples();
        let per_gpu = select(&samples, "nvidia_gpu_xid_errors_total", &[]);
        assert_eq!(per_gpu.len(), 64, "run {run}");
        let total: f64 = per_gpu.iter().map(|(_, v)| v).sum();
        assert_eq!(total, 1024.0, "run {run}: {}", out.err());
        let by_code = select(&samples, "nvidia_gpu_xid_errors_by_code_total", &[]);
        assert_eq!(by_code.len(), 1024, "run {run}");
        assert!(by_code.iter().all(|(_, v)| *v == 1.0), "run {run}");
        assert_eq!(
            out.series(r#"nvidia_gpu_collector_success{collector="xid"}"#),
            Some(1.0),
            "run {run}"
        );
    }
}

/// A file system frozen for as long as it takes to thaw it.
struct Frozen {
    mount: std::path::PathBuf,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(&self.mount).status();
    }
}

/// A loop-mounted ext4 file system, unmounted when dropped.
struct Mounted {
    mount: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Mounted {
    /// A fresh 16 MiB ext4 file system, mounted; `Err` says why not (not
    /// root, no loop devices, no mkfs.ext4).
    fn ext4() -> Result<Mounted, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not running as root".into());
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        let mount = dir.path().join("mnt");
        fs::create_dir(&mount).unwrap();
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            let status = Command::new(program).args(args).status();
            match status {
                Ok(status) if status.success() => Ok(()),
                other => Err(format!("{program} {args:?}: {other:?}")),
            }
        };
        run("truncate", &["-s".as_ref(), "16M".as_ref(), image.as_ref()])?;
        run("mkfs.ext4", &["-q".as_ref(), "-F".as_ref(), image.as_ref()])?;
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_ref(),
                mount.as_ref(),
            ],
        )?;
        Ok(Mounted { mount, _dir: dir })
    }

    fn freeze(&self) -> Frozen {
        let status = Command::new("fsfreeze")
            .arg("-f")
            .arg(&self.mount)
            .status()
            .unwrap();
        assert!(status.success(), "fsfreeze -f");
        Frozen {
            mount: self.mount.clone(),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

/// With the state directory on a frozen file system (`fsfreeze -f`: every
/// write, such as creating the temporary state file, waits for the thaw) and
/// a healthy output directory, the run still replaces its file by the
/// deadline, saying that the state was not stored (`state_ok 0`). Before, the
/// store blocked the run until the thaw and the previous file stayed. Needs
/// root and loop devices; skipped with a message otherwise.
#[test]
fn a_frozen_state_file_system_costs_the_state_not_the_snapshot() {
    let mounted = match Mounted::ext4() {
        Ok(mounted) => mounted,
        Err(why) => {
            eprintln!("skipped: no file system to freeze here ({why})");
            return;
        }
    };
    let state = mounted.mount.join("state");
    let out = tempfile::tempdir().unwrap();
    let timer_run = || {
        ex().run("h100x8")
            .output_dir(out.path())
            .state_dir(&state)
            .args(["--timeout", "2s", "--gpm-window", "0"])
    };
    // The state and its lock exist, as on any host after the first run.
    for _ in 0..2 {
        timer_run().finish().unwrap().assert_status(0);
    }
    let frozen = mounted.freeze();
    let started = timer_run().limit(30.0).start().unwrap();
    // The run cannot end before the thaw (a thread of it waits in the
    // kernel for it): thaw well after the deadline.
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(4));
        drop(frozen);
    });
    let output = started.wait().unwrap();
    thaw.join().unwrap();
    let t_file = output.t_file.expect("the file was replaced");
    assert!(t_file < 2.25, "replaced after {t_file} s: {}", output.err());
    assert_eq!(output.series("nvidia_gpu_collector_state_ok"), Some(0.0));
    assert_eq!(
        output.series(r#"nvidia_gpu_up{gpu="0",uuid="GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e10"}"#),
        Some(1.0)
    );
    assert!(
        output
            .err()
            .contains("did not answer in time while storing"),
        "{}",
        output.err()
    );
    // Thawed, the next run uses the state again.
    let next = timer_run().finish().unwrap();
    next.assert_status(0);
    assert_eq!(next.series("nvidia_gpu_collector_state_ok"), Some(1.0));
}

/// A run killed while storing the state leaves its temporary file; the next
/// run that takes the state's lock removes every one (each writer holds the
/// lock while its file exists), and leaves every other file alone.
#[test]
fn temporary_state_files_of_killed_runs_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let run = || {
        ex().run("h100x8")
            .state_dir(&state)
            .args(["--gpm-window", "0"])
            .finish()
            .unwrap()
    };
    run().assert_status(0);
    // As the previous release named them, and as this one does.
    let stale = [".state.Ab3xYz.tmp", ".state.4242.Qw9Er7.tmp"];
    for name in stale {
        fs::write(state.join(name), "{\"version\":2").unwrap();
    }
    fs::write(state.join("notes.tmp"), "not ours").unwrap();
    let output = run();
    output.assert_status(0);
    let mut names: Vec<String> = fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".state.lock", "notes.tmp", "state"]);
    assert_eq!(output.series("nvidia_gpu_collector_state_ok"), Some(1.0));
}

/// This boot's id, as a state file names it.
fn this_boot() -> String {
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    boot.trim().to_owned()
}

/// A damaged state of about the accepted size (22 MiB): 1.3 million empty GPU
/// entries, more than the 64 a state keeps. Read whole, they took 0.9 GB
/// (0.55 GB in the previous release's format) before the bound was checked;
/// now reading stops at the 65th GPU: the run names where (the schema), or
/// names the bound, not the missing end line after it (version 1). The run
/// treats it as any damaged state: it publishes every reading with
/// `state_ok 0`, and replaces it.
#[test]
fn a_state_past_the_gpu_bound_is_damaged_and_read_no_further() {
    let gpus = |entry: fn(u32) -> String| (0..1_300_000).map(entry).collect::<String>();
    let json = format!(
        "{{\"version\":2,\"boot_id\":\"{}\",\"gpus\":{{{}\"GPU-end\":{{}}}}}}\n",
        this_boot(),
        gpus(|n| format!("\"GPU-{n}\":{{}},"))
    );
    let at_65th = json.find("\"GPU-64\"").unwrap() + "\"GPU-64\"".len();
    let v1 = format!(
        "nvidia-textfile-exporter-state 1\nboot {}\n{}",
        this_boot(),
        gpus(|n| format!("gpu {n} 0 - -\n"))
    );
    let unusable = "the state file is unusable (more than 64 GPUs";
    let json_why = format!("{unusable} at line 1 column {at_65th});");
    let v1_why = format!("{unusable});");
    for (format, text, why) in [("schema", json, json_why), ("version 1", v1, v1_why)] {
        assert!(text.len() < 22 << 20, "{format}: {} bytes", text.len());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let run = || duty_cycle_at(dir.path(), 1_800_000_100_000_000);
        let out = run();
        let err = out.err();
        assert!(err.contains(&why), "{format}: {err}");
        assert_eq!(err.matches("state file").count(), 1, "{format}: {err}");
        assert_eq!(
            out.series("nvidia_gpu_collector_state_ok"),
            Some(0.0),
            "{format}"
        );
        assert_eq!(
            out.series(&format!("nvidia_gpu_up{{{DUTY_GPU}}}")),
            Some(1.0),
            "{format}"
        );
        assert_eq!(state_json(dir.path())["gpus"].as_object().unwrap().len(), 1);
        let next = run();
        assert_eq!(
            next.series("nvidia_gpu_collector_state_ok"),
            Some(1.0),
            "{format}: {}",
            next.err()
        );
    }
}
