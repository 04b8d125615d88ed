//! Fault matrix: runs the real exporter under the faults that need root
//! (tmpfs mounts, node_exporter as its own user) or kill runs at chosen
//! moments, and checks what a reader of the textfile sees. Every other fault is
//! a tests/cli/ case. See tests/fault-matrix/README.md; run through
//! tests/fault-matrix/run.sh.
//!
//! For every row:
//! - the file a reader finds is always complete (never a partial write) and
//!   passes `promtool check metrics` with empty output;
//! - a failure file holds only nvidia_gpu_collector_* series, no device series;
//! - every failure is named, in nvidia_gpu_collector_error{reason} or, when
//!   nothing can be written, in one line on stderr, with the documented exit
//!   status;
//! - no temporary file is left in the output directory, except by a run
//!   killed while publishing, and the next run removes it.

#[macro_use]
mod harness;
mod rows;

use std::collections::HashMap;
use std::fs::{self};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::Ordering;
use std::time::Instant;

use harness::{fail, short, Fail, R};
use test_support::{exposition, Exporter, Samples, Started};

const USAGE: &str = "usage: fault-matrix [--seed N] [--only SUBSTRING]... [--keep]
  --seed N     seed of the random kill moments (default 1, or $FAULT_MATRIX_SEED)
  --only S     run only rows whose name contains S (repeatable, any case)
  --keep       keep the scratch directory";

/// What every row needs: the binary, the fake, the scratch directory, the exit
/// statuses (from the binary's `--generate exit-codes`).
pub struct Ctx {
    pub root: PathBuf,
    pub exporter: Exporter,
    pub work: PathBuf,
    pub seed: u64,
    codes: HashMap<String, i32>,
}

/// How to run the exporter; `Opts::default()` writes to the directory with `--timeout 10s`.
pub struct Opts<'a> {
    pub timeout: &'a str,
    pub stdout: bool,
    pub faults_off: bool,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            timeout: "10s",
            stdout: false,
            faults_off: false,
        }
    }
}

/// A finished run of the exporter.
pub struct Run {
    pub rc: i32,
    pub out: String,
    pub err: String,
    /// Seconds until the process had exited.
    pub elapsed: f64,
    /// Seconds until the output file was replaced, if it was.
    pub t_file: Option<f64>,
}

fn normalize(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_lowercase()
}

impl Ctx {
    /// An exit status by its name in `--generate exit-codes` (case, `_`, `-` ignored).
    pub fn code(&self, name: &str) -> i32 {
        self.codes[&normalize(name)]
    }

    pub fn scenario_path(&self, name: &str) -> PathBuf {
        self.root.join("tests/scenarios").join(name)
    }

    /// A fresh directory under the scratch directory.
    pub fn scratch(&self, name: &str) -> R<PathBuf> {
        let path = self.work.join(name);
        fs::create_dir_all(&path)?;
        Ok(path)
    }

    /// Starts a run through test_support's runner; its stdout and stderr go
    /// to logs/ (kept with --keep). Each output directory has its own state
    /// directory beside it, so rows never share what a run remembers.
    pub fn start(&self, scenario: &Path, dir: Option<&Path>, o: &Opts) -> R<Started> {
        let logs = self.work.join("logs");
        fs::create_dir_all(&logs)?;
        let n = harness::LOGS.fetch_add(1, Ordering::Relaxed);
        // Every run of a row ends within seconds; 30 s means it hangs.
        let run = self
            .exporter
            .run(&scenario.to_string_lossy())
            .args(["--timeout", o.timeout])
            .logs(logs.join(format!("run.{n}")))
            .limit(30.0)
            .env("FAKE_NVML_FAULTS", if o.faults_off { "off" } else { "on" });
        let run = match dir {
            Some(d) if !o.stdout => run
                .output_dir(d)
                .state_dir(format!("{}.state", d.display())),
            _ => run.stdout(),
        };
        Ok(run.start()?)
    }

    /// Runs the exporter to the end, noting when the output file was replaced.
    pub fn exporter(&self, scenario: &Path, dir: Option<&Path>, o: Opts) -> R<Run> {
        let done = self.start(scenario, dir, &o)?.wait()?;
        Ok(Run {
            rc: done.status,
            out: String::from_utf8_lossy(&done.stdout).into_owned(),
            err: done.err(),
            elapsed: done.elapsed,
            t_file: done.t_file,
        })
    }

    /// What the exporter prints for a scenario with all its faults removed.
    pub fn baseline(&self, name: &str) -> R<Samples> {
        let o = Opts {
            stdout: true,
            faults_off: true,
            ..Opts::default()
        };
        let run = self.exporter(&self.scenario_path(name), None, o)?;
        expect!(
            run.rc == 0,
            "baseline of {name} exited {}: {}",
            run.rc,
            short(&run.err, 200)
        );
        exposition::parse(&run.out).or_else(|e| fail(format!("baseline of {name}: {e}")))
    }

    /// A fresh output directory holding a complete file from a successful run
    /// (of the scenario without its faults when `clean`).
    pub fn seeded(&self, name: &str, scenario: &str, clean: bool) -> R<PathBuf> {
        let d = self.scratch(name)?;
        let run = self.exporter(
            &self.scenario_path(scenario),
            Some(&d),
            Opts {
                faults_off: clean,
                ..Opts::default()
            },
        )?;
        expect!(
            run.rc == 0,
            "seeding run exited {}: {}",
            run.rc,
            short(&run.err, 200)
        );
        Ok(d)
    }
}

pub fn secs(t: Option<f64>) -> String {
    t.map_or("-".into(), |t| format!("{t:.2} s"))
}

struct Row {
    fault: String,
    outcome: String,
    t_error: String,
    verdict: &'static str,
    why: String,
}

fn table(results: &[Row]) -> String {
    let header = [
        "fault",
        "outcome (exit status, reason)",
        "time to error file",
        "verdict",
    ]
    .map(String::from);
    let mut cells = vec![header];
    for r in results {
        let outcome = if r.outcome.is_empty() {
            r.why
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(80)
                .collect()
        } else {
            r.outcome.clone()
        };
        cells.push([
            r.fault.clone(),
            outcome,
            r.t_error.clone(),
            r.verdict.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = Vec::new();
    for (n, c) in cells.iter().enumerate() {
        let padded: Vec<String> = c
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        out.push(format!("| {} |", padded.join(" | ")));
        if n == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
            out.push(format!("|{}|", rule.join("|")));
        }
    }
    out.join("\n")
}

fn exit_codes(bin: &Path) -> Result<HashMap<String, i32>, String> {
    let out = Command::new(bin)
        .args(["--generate", "exit-codes"])
        .output()
        .map_err(|e| e.to_string())?;
    let mut codes = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
    {
        let mut fields = line.split('\t');
        let (Some(code), Some(name)) = (fields.next(), fields.next()) else {
            return Err(format!("bad line {line:?}"));
        };
        codes.insert(
            normalize(name),
            code.parse().map_err(|_| format!("bad code in {line:?}"))?,
        );
    }
    for name in [
        "Success",
        "NvmlUnavailable",
        "DeviceDown",
        "Timeout",
        "Busy",
        "PublishFailed",
    ] {
        if !codes.contains_key(&normalize(name)) {
            return Err(format!(
                "exit status {name} not in --generate exit-codes: {codes:?}"
            ));
        }
    }
    Ok(codes)
}

fn main() -> ExitCode {
    let (mut seed, mut only, mut keep) = (
        std::env::var("FAULT_MATRIX_SEED").unwrap_or("1".into()),
        vec![],
        false,
    );
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => seed = args.next().unwrap_or_default(),
            "--only" => only.push(args.next().unwrap_or_default().to_lowercase()),
            "--keep" => keep = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("fault-matrix: unknown argument {arg:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Ok(seed) = seed.parse() else {
        eprintln!("fault-matrix: --seed takes a number\n{USAGE}");
        return ExitCode::from(2);
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let path_or =
        |var: &str, default: &str| std::env::var_os(var).map_or(root.join(default), PathBuf::from);
    let bin = path_or(
        "FAULT_MATRIX_BIN",
        "target/release/nvidia-textfile-exporter",
    );
    let lib = path_or("FAULT_MATRIX_NVML", "target/debug/libfake_nvml.so");
    for path in [&bin, &lib] {
        if !path.exists() {
            eprintln!(
                "fault-matrix: {} not found; build first (make build)",
                path.display()
            );
            return ExitCode::from(2);
        }
    }
    if harness::which("promtool").is_none() {
        eprintln!("fault-matrix: promtool not found (apt-get install prometheus)");
        return ExitCode::from(2);
    }
    let codes = match exit_codes(&bin) {
        Ok(codes) => codes,
        Err(e) => {
            eprintln!("fault-matrix: {}: {e}", bin.display());
            return ExitCode::from(2);
        }
    };
    harness::clean_up_on_signals();
    let started = Instant::now();
    let work = match tempfile::Builder::new().prefix("fault-matrix.").tempdir() {
        Ok(dir) => dir.keep(),
        Err(e) => {
            eprintln!("fault-matrix: scratch directory: {e}");
            return ExitCode::from(2);
        }
    };
    if !keep {
        harness::remove_at_exit(&work);
    }
    let shown = bin
        .strip_prefix(&root)
        .unwrap_or(&bin)
        .display()
        .to_string();
    let lib_name = lib
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    eprintln!("fault-matrix: {shown} against {lib_name}, seed {seed}");
    let ctx = Ctx {
        exporter: Exporter::new(bin, lib, root.join("tests/scenarios")),
        root,
        work,
        seed,
        codes,
    };

    let mut results = Vec::new();
    for (fault, row) in rows::all() {
        if !only.is_empty() && !only.iter().any(|o| fault.to_lowercase().contains(o)) {
            continue;
        }
        let t0 = Instant::now();
        let mut r = Row {
            fault,
            outcome: String::new(),
            t_error: "-".into(),
            verdict: "FAIL",
            why: String::new(),
        };
        match row(&ctx) {
            Ok((outcome, t_error)) => {
                (r.outcome, r.t_error, r.verdict) = (outcome, t_error, "PASS")
            }
            Err(Fail::Skipped(why)) => (r.verdict, r.outcome) = ("SKIP", why),
            Err(Fail::Failed(why, outcome)) => {
                (r.why, r.outcome) = (why, outcome.unwrap_or_default())
            }
        }
        eprintln!(
            "  {:4}  {}  ({:.1} s)",
            r.verdict,
            r.fault,
            t0.elapsed().as_secs_f64()
        );
        results.push(r);
    }
    harness::cleanup();

    println!("{}", table(&results));
    let strict = std::env::var("CI").as_deref() == Ok("true")
        || std::env::var("FAULT_MATRIX_STRICT").as_deref() == Ok("1");
    let failed: Vec<&Row> = results
        .iter()
        .filter(|r| r.verdict == "FAIL" || (strict && r.verdict == "SKIP"))
        .collect();
    for r in &failed {
        let why = if r.why.is_empty() { &r.outcome } else { &r.why };
        let note = if r.verdict == "SKIP" {
            " (a skip fails under CI=true or FAULT_MATRIX_STRICT=1)"
        } else {
            ""
        };
        println!("\n{} {}:\n  {why}{note}", r.verdict, r.fault);
    }
    let passed = results.iter().filter(|r| r.verdict == "PASS").count();
    let skipped = if strict {
        0
    } else {
        results.iter().filter(|r| r.verdict == "SKIP").count()
    };
    let kept = if keep {
        format!(" (kept {})", ctx.work.display())
    } else {
        String::new()
    };
    println!(
        "\nfault-matrix: {} rows in {:.1} s{kept}",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    let skipped = if skipped > 0 {
        format!(", {skipped} skipped")
    } else {
        String::new()
    };
    println!(
        "fault-matrix: {passed} passed, {} failed{skipped}",
        failed.len()
    );
    if failed.is_empty() && !results.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
