//! Running the real binary against the fake NVML: [`Exporter::run`] gives a
//! [`Run`] to configure (scenario, arguments, environment, where the file goes),
//! [`Run::finish`] runs it to the end and returns an [`Outcome`]: exit status,
//! stdout, stderr, timings and the file, parsed strictly.
//!
//! Every run has a state directory and an empty journal directory of its own
//! unless the caller names them, so no run sees another's state or this host's
//! kernel log; `RUST_LOG` is removed from its environment, stdin is empty.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::exposition::{self, Exposition, Samples, Series};
use crate::process::Proc;

/// The file the exporter publishes in its output directory.
pub const OUT_FILE: &str = "nvidia_gpu.prom";
/// The lock beside it that serialises runs.
pub const LOCK_FILE: &str = ".nvidia_gpu.prom.lock";

/// The binary, the fake NVML library and the scenario directory.
#[derive(Clone, Debug)]
pub struct Exporter {
    pub bin: PathBuf,
    pub lib: PathBuf,
    pub scenarios: PathBuf,
}

enum Output {
    /// A fresh temporary directory.
    Temp,
    Dir(PathBuf),
    Stdout,
}

/// One run of the exporter, being configured.
pub struct Run<'a> {
    exporter: &'a Exporter,
    scenario: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    output: Output,
    state: Option<PathBuf>,
    journal: Option<PathBuf>,
    lib: Option<PathBuf>,
    logs: Option<PathBuf>,
    /// Where stdout and stderr go instead of the log files.
    stdio: Option<(Stdio, Stdio)>,
    limit: f64,
    group: bool,
}

/// A run that has started; [`Started::wait`] ends it.
pub struct Started {
    pub proc: Proc,
    t0: Instant,
    target: Option<PathBuf>,
    before: Option<FileId>,
    /// The files stdout and stderr go to; `None` where the caller chose.
    logged: Option<(PathBuf, PathBuf)>,
    dir: Option<PathBuf>,
    state: PathBuf,
    limit: f64,
    temps: Vec<TempDir>,
}

/// A finished run.
pub struct Outcome {
    /// The exit status; minus the signal number when a signal ended it.
    pub status: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Seconds from the start until the process had exited.
    pub elapsed: f64,
    /// Seconds from the start until the output file was replaced, if it was.
    pub t_file: Option<f64>,
    /// The output directory (`None` for `--stdout`).
    pub dir: Option<PathBuf>,
    /// The state directory the run used.
    pub state: PathBuf,
    /// The process, reaped.
    pub proc: Proc,
    _temps: Vec<TempDir>,
}

type FileId = (u64, i64, i64, u64);

/// Identifies one version of a file: a rename in its place changes it.
pub fn file_id(path: &Path) -> Option<FileId> {
    fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

impl Exporter {
    pub fn new(
        bin: impl Into<PathBuf>,
        lib: impl Into<PathBuf>,
        scenarios: impl Into<PathBuf>,
    ) -> Exporter {
        Exporter {
            bin: bin.into(),
            lib: lib.into(),
            scenarios: scenarios.into(),
        }
    }

    /// The binary `bin` of the package at `root` (an integration test's
    /// `CARGO_BIN_EXE_…` and `CARGO_MANIFEST_DIR`), the fake NVML built beside
    /// it and the package's tests/scenarios.
    ///
    /// # Panics
    /// When the fake NVML is missing; the message says how to build it.
    pub fn beside(bin: &str, root: &str) -> Exporter {
        let lib = Path::new(bin).with_file_name("libfake_nvml.so");
        assert!(
            lib.exists(),
            "{} is missing: build it with `cargo build -p fake-nvml` (make test does)",
            lib.display()
        );
        Exporter::new(bin, lib, Path::new(root).join("tests/scenarios"))
    }

    /// A scenario by name (`h100x8` or `h100x8.toml`); a path with a `/` as it is.
    pub fn scenario(&self, name: &str) -> PathBuf {
        if name.contains('/') {
            return PathBuf::from(name);
        }
        let file = if name.ends_with(".toml") {
            name.to_string()
        } else {
            format!("{name}.toml")
        };
        self.scenarios.join(file)
    }

    /// The package's tests/golden, beside its tests/scenarios.
    pub fn golden_dir(&self) -> PathBuf {
        self.scenarios.with_file_name("golden")
    }

    /// Runs `scenario` to the end with the state directory `state` (each test
    /// its own, so that no run sees another test's state), the command line
    /// `args` and extra environment `env`. `--stdout` and `--output-dir DIR`
    /// in `args` choose where the file goes; without either it goes to a
    /// temporary directory.
    pub fn run_args(
        &self,
        scenario: &str,
        state: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Outcome {
        let mut run = self.run(scenario).state_dir(state);
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            run = match *arg {
                "--stdout" => run.stdout(),
                "--output-dir" => run.output_dir(*rest.next().expect("--output-dir DIR")),
                arg => run.arg(arg),
            };
        }
        for (key, value) in env {
            run = run.env(key, value);
        }
        run.finish().expect("run the exporter")
    }

    /// A fresh output directory holding the file of a successful run of
    /// `scenario` (without its faults when `faults_off`), and the state
    /// directory that run wrote.
    pub fn seeded(&self, scenario: &str, faults_off: bool) -> (TempDir, TempDir) {
        let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let run = self
            .run(scenario)
            .output_dir(dir.path())
            .state_dir(state.path());
        let run = if faults_off { run.faults_off() } else { run };
        run.finish().unwrap().assert_status(0);
        (dir, state)
    }

    /// What `scenario` gives without its faults (`--stdout`).
    pub fn baseline(&self, scenario: &str) -> Samples {
        let run = self.run(scenario).stdout().faults_off().finish().unwrap();
        run.assert_status(0);
        run.samples()
    }

    /// A copy of the fake NVML in `dir` for which `dlsym` fails for `symbols`.
    pub fn fake_without(&self, dir: &Path, symbols: &[&str]) -> PathBuf {
        let lib = dir.join(format!("libfake_nvml-without-{}.so", symbols.join("-")));
        crate::library_without(&self.lib, symbols, "nvmlShutdown", &lib).unwrap();
        lib
    }

    /// A run of `scenario` that publishes into a fresh temporary directory.
    pub fn run(&self, scenario: &str) -> Run<'_> {
        Run {
            exporter: self,
            scenario: self.scenario(scenario),
            args: Vec::new(),
            env: Vec::new(),
            output: Output::Temp,
            state: None,
            journal: None,
            lib: None,
            logs: None,
            stdio: None,
            limit: 60.0,
            group: false,
        }
    }
}

impl<'a> Run<'a> {
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// `--stdout`: the file is what the run prints.
    pub fn stdout(mut self) -> Self {
        self.output = Output::Stdout;
        self
    }

    /// `--output-dir dir` (which the caller keeps).
    pub fn output_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.output = Output::Dir(dir.into());
        self
    }

    /// `--state-dir dir`, kept by the caller across runs.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state = Some(dir.into());
        self
    }

    /// `--journal-dir dir`: the journal files the xid collector reads.
    pub fn journal_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.journal = Some(dir.into());
        self
    }

    /// `--nvml-lib lib` instead of the fake.
    pub fn lib(mut self, lib: impl Into<PathBuf>) -> Self {
        self.lib = Some(lib.into());
        self
    }

    /// `FAKE_NVML_FAULTS=off`: the scenario with every fault removed.
    pub fn faults_off(self) -> Self {
        self.env("FAKE_NVML_FAULTS", "off")
    }

    /// `FAKE_NVML_CALL_LOG=path`: the fake logs the NVML calls it answers
    /// there ([`crate::Calls::read`] reads them).
    pub fn call_log(self, path: impl AsRef<OsStr>) -> Self {
        self.env("FAKE_NVML_CALL_LOG", path)
    }

    /// Stdout and stderr to `<prefix>.out` and `<prefix>.err` (kept for a look).
    pub fn logs(mut self, prefix: impl Into<PathBuf>) -> Self {
        self.logs = Some(prefix.into());
        self
    }

    /// Stdout and stderr into `stdout` and `stderr` (a pipe nobody reads, say)
    /// instead of files; the outcome's `stdout` and `stderr` are then empty.
    pub fn stdio(mut self, stdout: impl Into<Stdio>, stderr: impl Into<Stdio>) -> Self {
        self.stdio = Some((stdout.into(), stderr.into()));
        self
    }

    /// Seconds after which the run is killed and [`Run::finish`] fails (60).
    pub fn limit(mut self, seconds: f64) -> Self {
        self.limit = seconds;
        self
    }

    /// Starts the run in a process group of its own, so that
    /// `outcome.proc.group_gone()` tells whether anything it started is left.
    pub fn own_process_group(mut self) -> Self {
        self.group = true;
        self
    }

    fn prepare(&self) -> (Command, Option<PathBuf>, PathBuf, Vec<TempDir>) {
        let mut temps = Vec::new();
        let mut temp = || {
            let t = tempfile::tempdir().expect("a temporary directory");
            let path = t.path().to_path_buf();
            temps.push(t);
            path
        };
        let mut cmd = Command::new(&self.exporter.bin);
        cmd.arg("--nvml-lib")
            .arg(self.lib.as_ref().unwrap_or(&self.exporter.lib));
        let dir = match &self.output {
            Output::Stdout => None,
            Output::Dir(d) => Some(d.clone()),
            Output::Temp => Some(temp()),
        };
        match &dir {
            Some(d) => cmd.arg("--output-dir").arg(d),
            None => cmd.arg("--stdout"),
        };
        let state = self.state.clone().unwrap_or_else(&mut temp);
        let journal = self.journal.clone().unwrap_or_else(&mut temp);
        // The scenarios' pids are no process of this host's: an empty /proc
        // unless the test gives one.
        if !self.args.iter().any(|a| a == "--procfs") {
            cmd.arg("--procfs").arg(temp());
        }
        cmd.arg("--state-dir")
            .arg(&state)
            .arg("--journal-dir")
            .arg(journal)
            .args(&self.args)
            .env_remove("RUST_LOG")
            .env("FAKE_NVML_SCENARIO", &self.scenario)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        (cmd, dir, state, temps)
    }

    /// Starts the run; its stdout and stderr go to files unless redirected.
    pub fn start(self) -> std::io::Result<Started> {
        let (mut cmd, dir, state, mut temps) = self.prepare();
        let logged = match (self.stdio, self.logs) {
            (Some((stdout, stderr)), _) => {
                cmd.stdout(stdout).stderr(stderr);
                None
            }
            (None, logs) => {
                let prefix = match logs {
                    Some(p) => p,
                    None => {
                        let t = tempfile::tempdir()?;
                        let p = t.path().join("run");
                        temps.push(t);
                        p
                    }
                };
                let (stdout_path, stderr_path) = (
                    PathBuf::from(format!("{}.out", prefix.display())),
                    PathBuf::from(format!("{}.err", prefix.display())),
                );
                cmd.stdout(File::create(&stdout_path)?)
                    .stderr(File::create(&stderr_path)?);
                Some((stdout_path, stderr_path))
            }
        };
        let target = dir.as_ref().map(|d| d.join(OUT_FILE));
        let before = target.as_deref().and_then(file_id);
        let t0 = Instant::now();
        Ok(Started {
            proc: Proc::spawn(&mut cmd, self.group)?,
            t0,
            target,
            before,
            logged,
            dir,
            state,
            limit: self.limit,
            temps,
        })
    }

    /// Runs to the end; `Err` when it could not start or ran past the limit.
    pub fn finish(self) -> Result<Outcome, String> {
        self.start()
            .map_err(|e| format!("cannot start the exporter: {e}"))?
            .wait()
    }
}

impl Started {
    /// Stdout and stderr so far.
    pub fn collect(&self) -> (Vec<u8>, Vec<u8>) {
        let read = |path: &Path| fs::read(path).unwrap_or_default();
        match &self.logged {
            Some((stdout, stderr)) => (read(stdout), read(stderr)),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// Waits for the end, noting when the output file was replaced.
    pub fn wait(mut self) -> Result<Outcome, String> {
        let mut t_file = None;
        let status = loop {
            let rc = self.proc.poll();
            let now = self.t0.elapsed().as_secs_f64();
            if t_file.is_none()
                && self
                    .target
                    .as_deref()
                    .is_some_and(|t| file_id(t) != self.before)
            {
                t_file = Some(now);
            }
            if let Some(rc) = rc {
                break rc;
            }
            if now > self.limit {
                self.proc.signal(libc::SIGKILL);
                return Err(format!(
                    "the exporter was still running after {} s (killed)",
                    self.limit
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let elapsed = self.t0.elapsed().as_secs_f64();
        let (stdout, stderr) = self.collect();
        Ok(Outcome {
            status,
            stdout,
            stderr,
            elapsed,
            t_file,
            dir: self.dir,
            state: self.state,
            proc: self.proc,
            _temps: self.temps,
        })
    }
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}, stderr: {:?}", self.status, self.err())
    }
}

impl Outcome {
    /// The exit code; `None` when a signal ended the run.
    pub fn code(&self) -> Option<i32> {
        (self.status >= 0).then_some(self.status)
    }

    pub fn success(&self) -> bool {
        self.status == 0
    }

    /// Stderr as text (invalid UTF-8 replaced).
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The published file's path.
    ///
    /// # Panics
    /// For a `--stdout` run.
    pub fn path(&self) -> PathBuf {
        self.dir
            .as_ref()
            .expect("a run with an output directory")
            .join(OUT_FILE)
    }

    /// The file's bytes as they are now (stdout for a `--stdout` run); empty
    /// when there is no file.
    pub fn bytes(&self) -> Vec<u8> {
        match &self.dir {
            None => self.stdout.clone(),
            Some(_) => fs::read(self.path()).unwrap_or_default(),
        }
    }

    /// [`Outcome::bytes`] as text.
    ///
    /// # Panics
    /// When it is not UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8(self.bytes()).expect("the file is UTF-8")
    }

    /// The file, parsed strictly.
    pub fn parsed(&self) -> Result<Exposition, String> {
        exposition::parse_all_bytes(&self.bytes())
    }

    /// The value of exactly the series `series` (`name{label="value",...}`,
    /// labels in any order); `None` when the file has no such series.
    ///
    /// # Panics
    /// When `series` is not a series or the file does not parse.
    pub fn series(&self, series: &str) -> Option<f64> {
        let key: Series = exposition::series(series).unwrap_or_else(|e| panic!("{e}"));
        self.samples().get(&key).copied()
    }

    /// The file's samples.
    ///
    /// # Panics
    /// When the file does not parse (the message has the run's stderr).
    pub fn samples(&self) -> Samples {
        match self.parsed() {
            Ok(e) => e.samples,
            Err(e) => panic!(
                "the file is not a complete exposition: {e}\nexit {}, stderr: {}",
                self.status,
                self.err()
            ),
        }
    }

    /// Asserts the exit status, naming stderr when it differs.
    pub fn assert_status(&self, want: i32) -> &Self {
        assert_eq!(
            self.status,
            want,
            "exit status {}, expected {want}; stderr: {}",
            self.status,
            self.err()
        );
        self
    }
}
