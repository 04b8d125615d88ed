//! The rows, in the order of the table: each returns its outcome and the time
//! to the error file ("-" when no error file is expected).

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::harness::{self, *};
use crate::{secs, Ctx, Opts, Run};
use test_support::checks::check_hostile;
use test_support::{exposition, scenario, Samples, Series};

type Cell = (String, String);
type RowFn = Box<dyn Fn(&Ctx) -> R<Cell>>;

/// Every row: (fault, check).
pub fn all() -> Vec<(String, RowFn)> {
    let mut rows: Vec<(String, RowFn)> = Vec::new();
    let mut row = |name: &str, f: RowFn| rows.push((name.to_string(), f));
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
    check_reader(&c.work, &stats)?;
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
    // One deadline: the lock wait ends when the GPUs' reading would have to
    // (0.72 x timeout: 0.8 less the host steps' tenth), so the busy file is
    // in place before --timeout.
    expect!(
        (0.7..=1.05).contains(&run.elapsed),
        "gave up after {:.2} s, expected 0.72-1 s",
        run.elapsed
    );
    expect!(
        run.err.contains("reason=\"busy\""),
        "stderr: {:?}",
        short(&run.err, 200)
    );
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
    // The file itself is checked by tests/cli/.
    // (hostile_strings_round_trip_and_smuggle_nothing_in); here what
    // node_exporter makes of it.
    let path = c.scenario_path("fault-hostile.toml");
    let doc = scenario::load(&path).or_else(fail)?;
    let dir = c.scratch("hostile")?;
    let run = c.exporter(&path, Some(&dir), Opts::default())?;
    expect!(run.rc == 0, "exit {}: {}", run.rc, short(&run.err, 200));
    check_file(&dir.join(OUT_FILE), None)?;
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
    check_hostile(&samples, &doc, "node_exporter").or_else(fail)?;
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
