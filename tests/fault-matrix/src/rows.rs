//! The rows, in the order of the table: each returns its outcome and the time
//! to the error file ("-" when no error file is expected).

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::harness::{self, *};
use crate::{secs, Ctx, Opts, Run};
use test_support::{exposition, Samples, Series};

type Cell = (String, String);
type RowFn = Box<dyn Fn(&Ctx) -> R<Cell>>;

/// Every row: (fault, check).
pub fn all() -> Vec<(String, RowFn)> {
    let mut rows: Vec<(String, RowFn)> = Vec::new();
    let mut row = |name: &str, f: RowFn| rows.push((name.to_string(), f));
    for (scenario, reason) in [
        ("init-driver-not-loaded.toml", "driver_not_loaded"),
        ("init-no-permission.toml", "no_permission"),
        (
            "init-lib-rm-version-mismatch.toml",
            "driver_library_mismatch",
        ),
        ("init-unknown.toml", "unknown"),
    ] {
        let name = format!(
            "nvmlInit: {}",
            scenario[5..scenario.len() - 5].replace('-', " ")
        );
        row(
            &name,
            Box::new(move |c| nvml_unusable(c, scenario, reason, None)),
        );
    }
    row(
        "nvmlDeviceGetCount fails (UNKNOWN)",
        Box::new(|c| nvml_unusable(c, "fault-device-count.toml", "unknown", None)),
    );
    row(
        "NVML library missing (--nvml-lib nonexistent)",
        Box::new(|c| {
            nvml_unusable(
                c,
                "h100x8.toml",
                "library_not_found",
                Some(c.work.join("no-such-dir/libnvidia-ml.so.1")),
            )
        }),
    );
    row(
        "symbol nvmlInit_v2 missing",
        Box::new(|c| {
            let (_, doc) = c.scenario("fault-missing-init.toml")?;
            let lib = library_without(c, &missing_symbols(&doc))?;
            nvml_unusable(c, "fault-missing-init.toml", "missing_symbol", Some(lib))
        }),
    );
    // No GPU can be read without it: a collector error, not every GPU down.
    row(
        "symbol nvmlDeviceGetHandleByIndex_v2 missing",
        Box::new(|c| {
            let lib = library_without(c, &["nvmlDeviceGetHandleByIndex_v2".into()])?;
            nvml_unusable(c, "h100x8.toml", "missing_symbol", Some(lib))
        }),
    );
    row(
        "optional symbols missing (energy, ClocksEventReasons)",
        Box::new(missing_optional_symbols),
    );
    row(
        "UNKNOWN on one getter, INSUFFICIENT_SIZE on a name",
        Box::new(read_error),
    );
    row(
        "GPU_IS_LOST on one GPU (lost = true)",
        Box::new(|c| one_gpu_down(c, "lost-gpu.toml", 2, "gpu_lost")),
    );
    row(
        "GPU_IS_LOST in the middle of a GPU's reads",
        Box::new(|c| one_gpu_down(c, "fault-lost-midread.toml", 0, "gpu_lost")),
    );
    row(
        "handle error on one GPU (NO_PERMISSION)",
        Box::new(|c| one_gpu_down(c, "fault-handle-error.toml", 1, "no_permission")),
    );
    row(
        "nvmlInit hangs (--timeout 2s)",
        Box::new(|c| hang(c, "fault-init-hang.toml", "nvmlInit_v2 (host)", &[])),
    );
    row(
        "device call hangs (--timeout 2s)",
        Box::new(|c| {
            hang(
                c,
                "fault-device-hang.toml",
                "nvmlDeviceGetPowerUsage (GPU 1)",
                &[],
            )
        }),
    );
    row(
        "device call hangs, --sequential (--timeout 2s)",
        Box::new(|c| {
            hang(
                c,
                "fault-device-hang.toml",
                "nvmlDeviceGetPowerUsage (GPU 1)",
                &["--sequential"],
            )
        }),
    );
    row("output directory missing", Box::new(output_dir_missing));
    row(
        "a directory in the output file's place",
        Box::new(output_is_directory),
    );
    row(
        "output directory read-only (tmpfs remounted ro)",
        Box::new(read_only),
    );
    row("disk full (64 KiB tmpfs filled)", Box::new(disk_full));
    row(
        "SIGKILL between temp-file create and rename",
        Box::new(|c| kill_mid_publish(c, libc::SIGKILL)),
    );
    row(
        "SIGTERM between temp-file create and rename",
        Box::new(|c| kill_mid_publish(c, libc::SIGTERM)),
    );
    row(
        "30 runs SIGKILLed/SIGTERMed at random moments, reader",
        Box::new(random_kills),
    );
    row(
        "a lock held by another process (flock), --timeout 1s",
        Box::new(lock_held),
    );
    row(
        "lock held 1.5 s, then a device call hangs (--timeout 2s)",
        Box::new(lock_then_hang),
    );
    row(
        "100 overlapping runs (20 at a time), reader",
        Box::new(overlapping),
    );
    row("hostile strings: exporter file", Box::new(hostile_file));
    row(
        "hostile strings: through node_exporter",
        Box::new(hostile_node_exporter),
    );
    rows
}

fn outcome(run: &Run, samples: Option<&Samples>) -> String {
    let mut text = format!("exit {}", run.rc);
    if let Some(samples) = samples {
        let named = reasons(samples);
        let named: Vec<String> = named.iter().map(|r| format!("reason={r}")).collect();
        text += &format!(
            ", {}",
            if named.is_empty() {
                "no error".into()
            } else {
                named.join(", ")
            }
        );
    }
    text
}

fn need_root() -> R<()> {
    if is_root() {
        Ok(())
    } else {
        Err(Fail::Skipped("needs root (mounts, runuser)".into()))
    }
}

fn need_flock() -> R<()> {
    match which("flock") {
        Some(_) => Ok(()),
        None => Err(Fail::Skipped("flock (util-linux) is not installed".into())),
    }
}

fn one_line_error(run: &Run, needles: &[&str]) -> R<String> {
    let err = run.err.trim();
    expect!(
        !err.is_empty() && !err.contains('\n'),
        "stderr is not one line: {:?}",
        short(err, 300)
    );
    expect!(
        err.starts_with("nvidia-textfile-exporter: error: "),
        "stderr: {err:?}"
    );
    for needle in needles {
        expect!(
            err.contains(needle),
            "stderr does not say {needle:?}: {err:?}"
        );
    }
    Ok(err.to_string())
}

/// The end of an error line: `cannot rename ...: Is a directory (os error 21)` gives the cause.
fn cause(line: &str) -> String {
    let line = line
        .strip_prefix("nvidia-textfile-exporter: error: ")
        .unwrap_or(line);
    line.rsplit(": ")
        .next()
        .unwrap_or(line)
        .chars()
        .take(40)
        .collect()
}

/// A scenario string as the exporter reports it: byte arrays decoded lossily.
fn text_of(value: Option<&toml::Value>) -> String {
    match value {
        Some(toml::Value::String(s)) => s.clone(),
        Some(toml::Value::Array(a)) => {
            let bytes: Vec<u8> = a
                .iter()
                .filter_map(|b| b.as_integer())
                .map(|b| b as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        _ => String::new(),
    }
}

fn missing_symbols(doc: &toml::Table) -> Vec<String> {
    let list = doc.get("missing_symbols").and_then(|v| v.as_array());
    list.into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

fn gpu_doc(doc: &toml::Table, index: usize) -> Option<&toml::Table> {
    doc.get("gpu")?.as_array()?.get(index)?.as_table()
}

/// A build of the fake without some exports (FAKE_NVML_HIDE, see
/// tests/fake-nvml/README.md) in its own target directory, copied into the
/// scratch directory; `dlsym` must fail for those names.
fn library_without(c: &Ctx, symbols: &[String]) -> R<PathBuf> {
    if which("cargo").is_none() {
        return Err(Fail::Skipped(
            "cargo is needed to build the fake without some symbols".into(),
        ));
    }
    let target = c.root.join("target/fake-nvml-hidden");
    let status = Command::new("cargo")
        .args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "fake-nvml",
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(&c.root)
        .env("FAKE_NVML_HIDE", symbols.join(","))
        .status()?;
    expect!(
        status.success(),
        "building the fake without {symbols:?} failed"
    );
    let path = c
        .work
        .join(format!("libfake_nvml-without-{}.so", symbols.join("-")));
    fs::copy(target.join("debug/libfake_nvml.so"), &path)?;
    let exported = |lib: *mut libc::c_void, name: &str| {
        let name = std::ffi::CString::new(name).unwrap_or_default();
        // SAFETY: a handle from dlopen and a NUL-terminated name.
        !unsafe { libc::dlsym(lib, name.as_ptr()) }.is_null()
    };
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: loads the fake (as the exporter does) to look up symbols only.
    let lib = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    expect!(!lib.is_null(), "dlopen {} failed", path.display());
    let still: Vec<&String> = symbols.iter().filter(|s| exported(lib, s)).collect();
    let shutdown = exported(lib, "nvmlShutdown");
    // SAFETY: the handle from dlopen above, used no more.
    unsafe { libc::dlclose(lib) };
    expect!(
        still.is_empty(),
        "{still:?} still exported by {}",
        path.display()
    );
    expect!(shutdown, "{} lacks nvmlShutdown", path.display());
    Ok(path)
}

fn nvml_unusable(c: &Ctx, scenario: &str, reason: &str, lib: Option<PathBuf>) -> R<Cell> {
    let d = c.seeded(
        &format!("nvml-{reason}-{}", scenario.trim_end_matches(".toml")),
        "fault-read-error.toml",
        false,
    )?;
    let run = c.exporter(
        &c.scenario_path(scenario),
        Some(&d),
        Opts {
            lib: lib.as_deref(),
            ..Opts::default()
        },
    )?;
    let samples = check_file(&d.join(OUT_FILE), Some(reason))?;
    let want = c.code("NvmlUnavailable");
    expect!(run.rc == want, "exit {}, expected {want}", run.rc);
    expect!(
        run.err.contains(&format!("cannot use NVML ({reason})")),
        "stderr does not name {reason}: {:?}",
        short(&run.err, 200)
    );
    Ok((outcome(&run, Some(&samples)), secs(run.t_file)))
}

fn missing_optional_symbols(c: &Ctx) -> R<Cell> {
    let name = "fault-missing-optional.toml";
    let (path, doc) = c.scenario(name)?;
    let lib = library_without(c, &missing_symbols(&doc))?;
    let expected = c.baseline(name)?;
    let d = c.scratch("missing-optional")?;
    let run = c.exporter(
        &path,
        Some(&d),
        Opts {
            lib: Some(&lib),
            ..Opts::default()
        },
    )?;
    let samples = check_file(&d.join(OUT_FILE), None)?;
    expect!(run.rc == c.code("Success"), "exit {}", run.rc);
    expect!(
        run.err.is_empty(),
        "stderr not empty: {:?}",
        short(&run.err, 200)
    );
    let (energy, rest): (Samples, Samples) = expected
        .into_iter()
        .partition(|(s, _)| s.name == "nvidia_gpu_energy_joules_total");
    expect!(
        !energy.is_empty(),
        "the baseline has no energy series to lose"
    );
    expect!(
        samples
            .keys()
            .any(|s| s.name == "nvidia_gpu_clocks_event_active"),
        "clock event reasons are gone: no fallback to the ClocksThrottleReasons names"
    );
    compare(&samples, &rest, "file vs. baseline without energy")?;
    Ok((
        outcome(&run, Some(&samples)) + " (energy omitted, 0 read errors)",
        "-".into(),
    ))
}

fn read_error(c: &Ctx) -> R<Cell> {
    let name = "fault-read-error.toml";
    let (path, doc) = c.scenario(name)?;
    let mut expected = c.baseline(name)?;
    let d = c.scratch("read-error")?;
    let run = c.exporter(&path, Some(&d), Opts::default())?;
    let samples = check_file(&d.join(OUT_FILE), None)?;
    expect!(run.rc == c.code("Success"), "exit {}", run.rc);
    let uuid = |i| text_of(gpu_doc(&doc, i).and_then(|g| g.get("uuid")));
    let (uuid1, uuid2) = (uuid(1), uuid(2));
    let power1 = Series::new("nvidia_gpu_power_watts", &[("gpu", "1"), ("uuid", &uuid1)]);
    expect!(
        expected.remove(&power1).is_some(),
        "baseline lacks the power of GPU 1"
    );
    let info2 = expected
        .keys()
        .find(|s| s.name == "nvidia_gpu_info" && s.label("gpu") == Some("2"))
        .cloned();
    let Some(info2) = info2 else {
        return fail("baseline lacks nvidia_gpu_info of GPU 2".into());
    };
    // The info series keeps its label set; the unreadable name is empty.
    let mut emptied = info2.clone();
    emptied
        .labels
        .iter_mut()
        .filter(|(k, _)| k == "name")
        .for_each(|(_, v)| v.clear());
    let value = expected.remove(&info2).unwrap_or_default();
    expected.insert(emptied, value);
    for (gpu, uuid) in [("1", &uuid1), ("2", &uuid2)] {
        expected.insert(
            Series::new(
                "nvidia_gpu_collector_read_errors",
                &[("gpu", gpu), ("uuid", uuid)],
            ),
            1.0,
        );
    }
    compare(
        &samples,
        &expected,
        "file vs. baseline less the failed fields",
    )?;
    for call in ["GPU 1: nvmlDeviceGetPowerUsage", "GPU 2: nvmlDeviceGetName"] {
        expect!(run.err.contains(call), "stderr does not name {call:?}");
    }
    Ok((
        outcome(&run, Some(&samples)) + " (fields omitted, read_errors 1)",
        "-".into(),
    ))
}

fn uuid_of(samples: &Samples, gpu: usize) -> Option<String> {
    let gpu = gpu.to_string();
    let up = samples
        .keys()
        .find(|s| s.name == "nvidia_gpu_up" && s.label("gpu") == Some(&gpu));
    up.and_then(|s| s.label("uuid")).map(String::from)
}

fn one_gpu_down(c: &Ctx, name: &str, down: usize, reason: &str) -> R<Cell> {
    let before = c.baseline(name)?;
    let (expected_gpus, expected_host) = gpus(&before);
    let d = c.seeded(
        &format!("down-{}", name.trim_end_matches(".toml")),
        name,
        true,
    )?;
    let run = c.exporter(&c.scenario_path(name), Some(&d), Opts::default())?;
    let samples = check_file(&d.join(OUT_FILE), None)?;
    let want = c.code("DeviceDown");
    expect!(run.rc == want, "exit {}, expected {want}", run.rc);
    let (actual_gpus, host) = gpus(&samples);
    compare(&host, &expected_host, "host-wide series")?;
    let (actual, wanted): (Vec<_>, Vec<_>) =
        (actual_gpus.keys().collect(), expected_gpus.keys().collect());
    expect!(actual == wanted, "GPUs {actual:?}");
    for (gpu, series) in &expected_gpus {
        if *gpu == down.to_string() {
            let mut want = Samples::from([
                (Series::new("nvidia_gpu_up", &[]), 0.0),
                (
                    Series::new("nvidia_gpu_down_reason", &[("reason", reason)]),
                    1.0,
                ),
            ]);
            // XID counters come from the kernel log, not from the GPU: a GPU
            // that is down keeps them (an Xid 79 is what explains it).
            want.extend(
                series
                    .iter()
                    .filter(|(s, _)| s.name.starts_with("nvidia_gpu_xid_"))
                    .map(|(s, v)| (s.clone(), *v)),
            );
            compare(&actual_gpus[gpu], &want, &format!("GPU {gpu} (down)"))?;
        } else {
            compare(&actual_gpus[gpu], series, &format!("GPU {gpu}"))?;
        }
    }
    expect!(
        run.err.contains(&format!("GPU {down}")),
        "stderr does not name GPU {down}: {:?}",
        short(&run.err, 200)
    );
    let kept = uuid_of(&samples, down);
    expect!(
        kept == uuid_of(&before, down),
        "GPU {down} is down with uuid={kept:?}, not the UUID of the previous file"
    );
    let others = expected_gpus.len() - 1;
    Ok((
        outcome(&run, Some(&samples)) + &format!(", UUID kept; other GPUs complete: {others}"),
        secs(run.t_file),
    ))
}

fn hang(c: &Ctx, name: &str, call: &str, extra: &[&str]) -> R<Cell> {
    let d = c.seeded(
        &format!("hang-{}{}", name.trim_end_matches(".toml"), extra.join("-")),
        "fault-read-error.toml",
        false,
    )?;
    let timeout = 2.0;
    let run = c.exporter(
        &c.scenario_path(name),
        Some(&d),
        Opts {
            extra,
            timeout: "2s",
            limit: timeout + 10.0,
            ..Opts::default()
        },
    )?;
    let samples = check_file(&d.join(OUT_FILE), Some("timeout"))?;
    let want = c.code("Timeout");
    expect!(run.rc == want, "exit {}, expected {want}", run.rc);
    let Some(t_file) = run.t_file else {
        return fail("the file was not replaced".into());
    };
    expect!(
        t_file <= timeout + 1.0,
        "file replaced after {t_file:.2} s > timeout + 1 s"
    );
    expect!(
        run.elapsed <= timeout + 1.0,
        "process exited after {:.2} s > timeout + 1 s",
        run.elapsed
    );
    expect!(
        run.err.contains(&format!("stuck in {call}")),
        "stderr does not name {call}: {:?}",
        short(&run.err, 300)
    );
    Ok((
        outcome(&run, Some(&samples)) + &format!(", exited at {:.2} s", run.elapsed),
        secs(Some(t_file)),
    ))
}

fn output_dir_missing(c: &Ctx) -> R<Cell> {
    let d = c.work.join("absent-dir");
    let run = c.exporter(&c.scenario_path("geforce.toml"), Some(&d), Opts::default())?;
    let want = c.code("PublishFailed");
    expect!(run.rc == want, "exit {}, expected {want}", run.rc);
    one_line_error(&run, &[&d.display().to_string(), "does not exist"])?;
    expect!(!d.exists(), "the directory was created");
    Ok((
        format!(
            "exit {}, stderr: output directory ... does not exist",
            run.rc
        ),
        "-".into(),
    ))
}

fn output_is_directory(c: &Ctx) -> R<Cell> {
    let d = c.seeded("target-is-dir", "geforce.toml", false)?;
    let target = d.join(OUT_FILE);
    fs::remove_file(&target)?;
    fs::create_dir(&target)?;
    fs::write(target.join("keep"), "old")?;
    let run = c.exporter(&c.scenario_path("geforce.toml"), Some(&d), Opts::default())?;
    let want = c.code("PublishFailed");
    expect!(run.rc == want, "exit {}, expected {want}", run.rc);
    let line = one_line_error(&run, &["rename", &target.display().to_string()])?;
    expect!(
        fs::read_to_string(target.join("keep"))? == "old",
        "the directory's content changed"
    );
    let left = temp_files(&d);
    expect!(left.is_empty(), "temporary files left: {left:?}");
    Ok((
        format!(
            "exit {}, stderr: cannot rename ...: {}",
            run.rc,
            cause(&line)
        ),
        "-".into(),
    ))
}

fn listing(d: &Path) -> R<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(d)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// A tmpfs holding a good file, made unwritable by `prepare`: the next run must
/// fail with `needle` on stderr and leave the directory exactly as it was.
fn unwritable(
    c: &Ctx,
    name: &str,
    size: &str,
    prepare: fn(&Path) -> R<()>,
    needle: &str,
) -> R<Cell> {
    need_root()?;
    let d = c.scratch(name)?;
    mount_tmpfs(&d, size)?;
    let result = (|| {
        let run = c.exporter(&c.scenario_path("geforce.toml"), Some(&d), Opts::default())?;
        expect!(run.rc == 0, "seeding run exited {}", run.rc);
        let file = d.join(OUT_FILE);
        let (old, old_id) = (fs::read(&file)?, file_id(&file));
        prepare(&d)?;
        let before = listing(&d)?;
        let run = c.exporter(&c.scenario_path("geforce.toml"), Some(&d), Opts::default())?;
        let want = c.code("PublishFailed");
        expect!(
            run.rc == want,
            "exit {}, expected {want}: {}",
            run.rc,
            short(&run.err, 200)
        );
        let line = one_line_error(&run, &[needle])?;
        expect!(
            fs::read(&file)? == old && file_id(&file) == old_id,
            "the old file was changed"
        );
        let after = listing(&d)?;
        expect!(
            after == before,
            "directory changed: {before:?} -> {after:?}"
        );
        check_file(&file, None)?;
        Ok((
            format!("exit {}, stderr: {}", run.rc, cause(&line)),
            "-".into(),
        ))
    })();
    umount(&d);
    result
}

fn read_only(c: &Ctx) -> R<Cell> {
    fn remount(d: &Path) -> R<()> {
        let out = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(d)
            .output()?;
        expect!(
            out.status.success(),
            "remount ro: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }
    unwritable(c, "read-only", "1m", remount, "Read-only file system")
}

fn disk_full(c: &Ctx) -> R<Cell> {
    fn fill(d: &Path) -> R<()> {
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(d.join("filler.bin"))?;
        for chunk in [65536, 4096, 1] {
            let zeros = vec![0u8; chunk];
            loop {
                match f.write(&zeros) {
                    Ok(n) if n > 0 => {}
                    Ok(_) => break,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // SAFETY: fstatvfs of our open file into a zeroed struct.
        let free = unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            libc::fstatvfs(f.as_raw_fd(), &mut st);
            st.f_bavail as u64 * st.f_frsize as u64
        };
        expect!(free == 0, "{free} bytes still free");
        Ok(())
    }
    unwritable(c, "disk-full", "64k", fill, "No space left on device")
}

/// Kills a run between creating and renaming its temporary file; the next run
/// must remove the temporary file and publish.
fn kill_mid_publish(c: &Ctx, sig: i32) -> R<Cell> {
    let d = c.seeded(&format!("kill-publish-{sig}"), "fault-slow.toml", false)?;
    let file = d.join(OUT_FILE);
    let mut hit_on = None;
    let mut old = Vec::new();
    for attempt in 1..=5 {
        old = fs::read(&file)?;
        let mut run = c.start(
            &c.scenario_path("fault-slow.toml"),
            Some(&d),
            &Opts::default(),
        )?;
        let hit = kill_on_temp_create(&d, &mut run.proc, sig, 20.0)?;
        let rc = run.proc.wait(30.0)?;
        let left = temp_files(&d);
        if hit && !left.is_empty() && rc == -sig {
            hit_on = Some((attempt, left.len()));
            break;
        }
    }
    let Some((attempt, left)) = hit_on else {
        return fail(
            "could not kill a run between creating and renaming its temporary file".into(),
        );
    };
    expect!(
        fs::read(&file)? == old,
        "the file changed although the run was killed before rename"
    );
    let run = c.exporter(
        &c.scenario_path("fault-slow.toml"),
        Some(&d),
        Opts::default(),
    )?;
    let samples = check_file(&file, None)?;
    expect!(run.rc == 0, "next run exit {}", run.rc);
    compare(&samples, &c.baseline("fault-slow.toml")?, "next run's file")?;
    let text = format!(
        "killed (exit {}) with {left} temp left (try {attempt}); next run exit {}, temp removed",
        -sig, run.rc
    );
    Ok((text, "-".into()))
}

fn slow_kinds(c: &Ctx) -> R<Vec<(String, Keys)>> {
    Ok(vec![(
        "complete".into(),
        keys(&c.baseline("fault-slow.toml")?),
    )])
}

fn random_kills(c: &Ctx) -> R<Cell> {
    let mut rng = Rng::new(c.seed);
    let kinds = slow_kinds(c)?;
    let complete = kinds[0].1.clone();
    let d = c.scratch("random-kills")?;
    let slow = c.scenario_path("fault-slow.toml");
    let first = c.exporter(&slow, Some(&d), Opts::default())?;
    expect!(first.rc == 0, "first run exited {}", first.rc);
    let window = first.elapsed * 1.2; // kill moments cover the whole run, publish included
    let reader = Reader::start(d.join(OUT_FILE), kinds);
    let (mut kills, mut terms, mut finished) = (0, 0, 0);
    let result = (|| {
        for _ in 0..30 {
            let mut run = c.start(&slow, Some(&d), &Opts::default())?;
            sleep(Duration::from_secs_f64(rng.uniform(window)));
            let sig = if rng.coin() {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            run.proc.signal(sig);
            let rc = run.proc.wait(30.0)?;
            match rc {
                _ if rc == -sig && sig == libc::SIGKILL => kills += 1,
                _ if rc == -sig => terms += 1,
                0 => finished += 1,
                _ => return fail(format!("a run exited {rc}")),
            }
        }
        Ok(())
    })();
    let stats = reader.finish()?;
    result?;
    check_reader(&c.work, &stats, false)?;
    // A temporary file of a dead writer, as a crash would leave it.
    let mut dead = Command::new("true").spawn()?;
    dead.wait()?;
    fs::write(
        d.join(format!(".{OUT_FILE}.{}.zZ9xQ1.tmp", dead.id())),
        "nvidia_gpu_collector_up 1\nnvidia_gpu_up{",
    )?;
    let run = c.exporter(&slow, Some(&d), Opts::default())?;
    let samples = check_file(&d.join(OUT_FILE), None)?;
    expect!(run.rc == 0, "final run exit {}", run.rc);
    expect!(
        keys(&samples) == complete,
        "final file is not a complete render"
    );
    let text = format!(
        "{kills} KILL + {terms} TERM mid-run, {finished} done; {} reads ok; stale temps removed",
        stats.reads
    );
    Ok((text, "-".into()))
}

/// Starts `flock --no-fork LOCK sleep SECONDS` and waits until it holds the lock.
fn hold_lock(lock: &Path, seconds: f64) -> R<Proc> {
    let mut cmd = Command::new("flock");
    cmd.arg("--no-fork")
        .arg(lock)
        .args(["sleep", &seconds.to_string()]);
    let mut holder = Proc::spawn(&mut cmd, false)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        expect!(holder.poll().is_none(), "flock exited");
        let probe = OpenOptions::new().create(true).append(true).open(lock)?;
        // SAFETY: flock on a descriptor we own; unlocked at once when we got it.
        let got = unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if !got {
            return Ok(holder);
        }
        // SAFETY: as above.
        unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_UN) };
        expect!(Instant::now() < deadline, "flock did not take the lock");
        sleep(Duration::from_millis(10));
    }
}

fn lock_held(c: &Ctx) -> R<Cell> {
    need_flock()?;
    let d = c.seeded("lock-held", "fault-slow.toml", false)?;
    let mut holder = hold_lock(&d.join(LOCK_FILE), 120.0)?;
    let slow = c.scenario_path("fault-slow.toml");
    let run = c.exporter(
        &slow,
        Some(&d),
        Opts {
            timeout: "1s",
            ..Opts::default()
        },
    )?;
    let samples = check_file(&d.join(OUT_FILE), Some("busy"))?;
    let want = c.code("Busy");
    expect!(run.rc == want, "exit {}, expected {want}", run.rc);
    // One deadline: the lock wait ends when reading would have to (0.8 x timeout),
    // so the busy file is in place before --timeout.
    expect!(
        (0.75..=1.05).contains(&run.elapsed),
        "gave up after {:.2} s, expected 0.8-1 s",
        run.elapsed
    );
    expect!(
        run.err.contains("reason=\"busy\""),
        "stderr: {:?}",
        short(&run.err, 200)
    );
    *c.busy_keys.borrow_mut() = Some(keys(&samples));
    // The holder dies without unlocking: the kernel drops the lock with it.
    holder.signal(libc::SIGKILL);
    holder.wait(10.0)?;
    let after = c.exporter(
        &slow,
        Some(&d),
        Opts {
            timeout: "1s",
            ..Opts::default()
        },
    )?;
    let samples_after = check_file(&d.join(OUT_FILE), None)?;
    expect!(
        after.rc == 0,
        "run after the holder died: exit {}: {}",
        after.rc,
        short(&after.err, 200)
    );
    expect!(
        after.elapsed < 1.0,
        "run after the holder died waited: {:.2} s",
        after.elapsed
    );
    compare(
        &samples_after,
        &c.baseline("fault-slow.toml")?,
        "file after the holder died",
    )?;
    let text = format!(
        "{} after {:.2} s; holder killed -9: next run exit {} in {:.2} s",
        outcome(&run, Some(&samples)),
        run.elapsed,
        after.rc,
        after.elapsed
    );
    Ok((text, secs(run.t_file)))
}

/// The series of a complete busy file (from the lock row, or made here).
fn busy_keys(c: &Ctx) -> R<Keys> {
    if let Some(k) = c.busy_keys.borrow().clone() {
        return Ok(k);
    }
    let d = c.scratch("busy-file")?;
    let mut holder = hold_lock(&d.join(LOCK_FILE), 60.0)?;
    let run = c.exporter(
        &c.scenario_path("fault-slow.toml"),
        Some(&d),
        Opts {
            timeout: "100ms",
            ..Opts::default()
        },
    )?;
    holder.signal(libc::SIGKILL);
    holder.wait(10.0)?;
    expect!(
        run.rc == c.code("Busy"),
        "exit {}, expected {}",
        run.rc,
        c.code("Busy")
    );
    let k = keys(&check_file(&d.join(OUT_FILE), Some("busy"))?);
    *c.busy_keys.borrow_mut() = Some(k.clone());
    Ok(k)
}

fn lock_then_hang(c: &Ctx) -> R<Cell> {
    need_flock()?;
    let d = c.seeded("lock-then-hang", "fault-slow.toml", false)?;
    let mut holder = hold_lock(&d.join(LOCK_FILE), 1.5)?;
    let timeout = 2.0;
    let o = Opts {
        timeout: "2s",
        limit: 3.0 * timeout + 10.0,
        ..Opts::default()
    };
    let run = c.exporter(&c.scenario_path("fault-device-hang.toml"), Some(&d), o)?;
    holder.wait(10.0)?;
    let samples = check_file(&d.join(OUT_FILE), Some("timeout"))?;
    let want = c.code("Timeout");
    expect!(run.rc == want, "exit {}, expected {want}", run.rc);
    // One deadline for the whole run: the error file is in place by --timeout
    // (0.1 s of slack for a loaded machine), the process gone right after.
    expect!(
        run.t_file.is_some_and(|t| t <= timeout + 0.1),
        "file replaced after {}, bound --timeout",
        secs(run.t_file)
    );
    expect!(
        run.elapsed <= timeout + 0.3,
        "process exited after {:.2} s > --timeout + 0.3 s",
        run.elapsed
    );
    let text = outcome(&run, Some(&samples))
        + &format!(", exited at {:.2} s (bound --timeout)", run.elapsed);
    Ok((text, secs(run.t_file)))
}

fn overlapping(c: &Ctx) -> R<Cell> {
    let mut kinds = slow_kinds(c)?;
    let busy = busy_keys(c)?;
    kinds.push(("busy".into(), busy.clone()));
    let d = c.seeded("overlap", "fault-slow.toml", false)?;
    let slow = c.scenario_path("fault-slow.toml");
    let reader = Reader::start(d.join(OUT_FILE), kinds);
    let (ok, busy_code) = (c.code("Success"), c.code("Busy"));
    let mut codes: BTreeMap<i32, usize> = BTreeMap::new();
    let mut problems = Vec::new();
    let t0 = Instant::now();
    let result = (|| {
        let (mut running, mut started) = (Vec::new(), 0);
        while started < 100 || !running.is_empty() {
            while running.len() < 20 && started < 100 {
                running.push(c.start(
                    &slow,
                    Some(&d),
                    &Opts {
                        timeout: "1s",
                        tag: "overlap",
                        ..Opts::default()
                    },
                )?);
                started += 1;
            }
            let mut i = 0;
            while i < running.len() {
                let Some(rc) = running[i].proc.poll() else {
                    i += 1;
                    continue;
                };
                let (_, e) = running.swap_remove(i).collect();
                let e = String::from_utf8_lossy(&e);
                *codes.entry(rc).or_default() += 1;
                // A busy run either writes reason="busy" (the holder published
                // nothing while it waited) or leaves the holder's fresh file.
                if rc == busy_code
                    && !(e.contains("reason=\"busy\"") || e.contains("published meanwhile"))
                {
                    problems.push(format!(
                        "busy run without a busy message: {:?}",
                        short(&e, 150)
                    ));
                } else if rc == ok && !e.is_empty() {
                    problems.push(format!(
                        "successful run wrote to stderr: {:?}",
                        short(&e, 150)
                    ));
                }
            }
            expect!(
                t0.elapsed() < Duration::from_secs(120),
                "overlapping runs took over 120 s"
            );
            sleep(Duration::from_millis(5));
        }
        Ok(())
    })();
    let stats = reader.finish()?;
    result?;
    check_reader(&c.work, &stats, false)?;
    expect!(
        codes.keys().all(|k| *k == ok || *k == busy_code),
        "exit statuses {codes:?}"
    );
    expect!(
        codes.get(&ok).is_some_and(|n| *n >= 1),
        "no run succeeded: {codes:?}"
    );
    expect!(
        problems.is_empty(),
        "{} runs misbehaved, e.g. {}",
        problems.len(),
        problems[0]
    );
    let file = d.join(OUT_FILE);
    let is_busy = keys(&load(&file)?) == busy;
    check_file(&file, is_busy.then_some("busy"))?;
    let seen: Vec<String> = stats.seen.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let count = |code| codes.get(&code).copied().unwrap_or(0);
    let text = format!(
        "{} exit {ok}, {} exit {busy_code} (busy); {} reads: {}",
        count(ok),
        count(busy_code),
        stats.reads,
        seen.join(", ")
    );
    Ok((text, "-".into()))
}

/// Per GPU: gpu, uuid, name, serial, vbios_version as the exporter must report them.
type Want = Vec<BTreeMap<&'static str, String>>;

/// fault-hostile.toml and what it must give.
fn hostile_expectations(c: &Ctx) -> R<(PathBuf, toml::Table, Want)> {
    let (path, doc) = c.scenario("fault-hostile.toml")?;
    let mut want = Vec::new();
    let mut index = 0;
    while let Some(g) = gpu_doc(&doc, index) {
        let mut w = BTreeMap::from([("gpu", index.to_string())]);
        for label in ["uuid", "name", "serial", "vbios_version"] {
            w.insert(label, text_of(g.get(label)));
        }
        want.push(w);
        index += 1;
    }
    Ok((path, doc, want))
}

fn check_hostile(
    samples: &Samples,
    doc: &toml::Table,
    want: &[BTreeMap<&str, String>],
    at: &str,
) -> R<()> {
    let forged: Vec<String> = samples
        .keys()
        .filter(|s| {
            s.label("uuid") == Some("forged")
                || s.label("gpu") == Some("9")
                || s.name.contains("forged")
        })
        .map(|s| s.to_string())
        .collect();
    expect!(forged.is_empty(), "{at}: smuggled series: {forged:?}");
    let ups: BTreeMap<&str, &str> = samples
        .keys()
        .filter(|s| s.name == "nvidia_gpu_up")
        .map(|s| {
            (
                s.label("gpu").unwrap_or_default(),
                s.label("uuid").unwrap_or_default(),
            )
        })
        .collect();
    expect!(!ups.is_empty(), "{at}: no nvidia_gpu_up");
    let wanted: BTreeMap<&str, &str> = want
        .iter()
        .map(|w| (w["gpu"].as_str(), w["uuid"].as_str()))
        .collect();
    expect!(ups == wanted, "{at}: nvidia_gpu_up series {ups:?}");
    for w in want {
        let gpu = w["gpu"].as_str();
        let info: Vec<&Series> = samples
            .keys()
            .filter(|s| s.name == "nvidia_gpu_info" && s.label("gpu") == Some(gpu))
            .collect();
        expect!(
            info.len() == 1,
            "{at}: {} nvidia_gpu_info for GPU {gpu}",
            info.len()
        );
        for label in ["uuid", "name", "serial", "vbios_version"] {
            let got = info[0].label(label);
            expect!(
                got == Some(w[label].as_str()),
                "{at}: GPU {gpu} {label} is {got:?}, expected {:?}",
                w[label]
            );
        }
    }
    let want_driver = doc
        .get("system")
        .and_then(|s| s.get("driver_version"))
        .and_then(|v| v.as_str());
    let driver: Vec<&Series> = samples
        .keys()
        .filter(|s| s.name == "nvidia_gpu_driver_info")
        .collect();
    expect!(
        driver.len() == 1 && driver[0].label("driver_version") == want_driver,
        "{at}: driver_version label is not the scenario's string"
    );
    Ok(())
}

fn hostile_file(c: &Ctx) -> R<Cell> {
    let (path, doc, want) = hostile_expectations(c)?;
    let d = c.scratch("hostile")?;
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755))?;
    let run = c.exporter(&path, Some(&d), Opts::default())?;
    let samples = check_file(&d.join(OUT_FILE), None)?;
    expect!(run.rc == 0, "exit {}: {}", run.rc, short(&run.err, 200));
    expect!(
        run.err.is_empty(),
        "stderr not empty: {:?}",
        short(&run.err, 200)
    );
    check_hostile(&samples, &doc, &want, "file")?;
    *c.hostile_dir.borrow_mut() = Some(d);
    Ok((
        outcome(&run, Some(&samples)) + ", labels round-trip, nothing smuggled",
        "-".into(),
    ))
}

/// GET /metrics from 127.0.0.1:port (HTTP/1.0: the body ends with the connection).
fn scrape(port: u16) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = Vec::new();
    s.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !(head.starts_with("HTTP/1.") && head.split(' ').nth(1) == Some("200")) {
        return Err(std::io::Error::other(
            head.lines().next().unwrap_or("").to_string(),
        ));
    }
    Ok(body.to_string())
}

fn hostile_node_exporter(c: &Ctx) -> R<Cell> {
    need_root()?;
    let Some(binary) = which("prometheus-node-exporter").or_else(|| which("node_exporter")) else {
        return fail("prometheus-node-exporter is not installed".into());
    };
    if c.hostile_dir.borrow().is_none() {
        hostile_file(c)?;
    }
    let dir = c.hostile_dir.borrow().clone().unwrap_or_default();
    let (_, doc, want) = hostile_expectations(c)?;
    // node_exporter runs as prometheus: the scratch directory must be searchable.
    fs::set_permissions(&c.work, fs::Permissions::from_mode(0o711))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    let readable = Command::new("runuser")
        .args(["-u", "prometheus", "--", "test", "-r"])
        .arg(dir.join(OUT_FILE))
        .status()?;
    expect!(readable.success(), "user prometheus cannot read the file");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log_path = c.work.join("node_exporter.log");
    let log = fs::File::create(&log_path)?;
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "prometheus", "--"]).arg(&binary);
    cmd.arg(format!("--web.listen-address=127.0.0.1:{port}"));
    cmd.args(["--collector.disable-defaults", "--collector.textfile"]);
    cmd.arg(format!("--collector.textfile.directory={}", dir.display()));
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut proc = Proc::spawn(&mut cmd, true)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        if let Some(rc) = proc.poll() {
            return fail(format!("node_exporter exited {rc}"));
        }
        expect!(
            Instant::now() < deadline,
            "node_exporter did not answer within 15 s"
        );
        match scrape(port) {
            Ok(text) => break text,
            Err(_) => sleep(Duration::from_millis(50)),
        }
    };
    proc.signal(libc::SIGTERM);
    if proc.wait(5.0).is_err() {
        proc.signal(libc::SIGKILL);
    }
    let logged = String::from_utf8_lossy(&fs::read(&log_path)?).into_owned();
    let errors: Vec<&str> = logged
        .lines()
        .filter(|l| l.to_lowercase().contains("error") || l.contains("level=warn"))
        .collect();
    expect!(
        errors.is_empty(),
        "node_exporter logged: {}",
        short(errors[0], 300)
    );
    let samples =
        exposition::parse(&text).or_else(|e| fail(format!("node_exporter's page: {e}")))?;
    let scrape_error = samples.get(&Series::new("node_textfile_scrape_error", &[]));
    expect!(
        scrape_error == Some(&0.0),
        "node_textfile_scrape_error is {scrape_error:?}"
    );
    let mtime: Vec<&Series> = samples
        .keys()
        .filter(|s| s.name == "node_textfile_mtime_seconds")
        .collect();
    expect!(
        mtime.len() == 1
            && mtime[0]
                .label("file")
                .unwrap_or_default()
                .ends_with(OUT_FILE),
        "node_exporter did not read the file: {mtime:?}"
    );
    check_hostile(&samples, &doc, &want, "node_exporter")?;
    let served = c.work.join("node_exporter-metrics.prom");
    let ours: Vec<&str> = text
        .split('\n')
        .filter(|l| {
            ["nvidia_gpu", "# HELP nvidia_gpu", "# TYPE nvidia_gpu"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    fs::write(&served, ours.join("\n") + "\n")?;
    let complaints = harness::promtool(&served)?;
    expect!(
        complaints.is_empty(),
        "promtool on node_exporter's nvidia_gpu series: {}",
        short(&complaints, 200)
    );
    Ok((
        "scrape_error 0, no error logged, labels round-trip, nothing smuggled".into(),
        "-".into(),
    ))
}
