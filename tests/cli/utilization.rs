//! Utilization from NVML's sample buffer: windows, running totals, clock steps, lost state.

use super::*;

/// A 50 % duty cycle (1 s busy, 1 s idle) read every 10 s gives 0.5 every run
/// and busy/sampled grow by exactly 5 s/10 s; the first run takes NVML's whole
/// buffer (71 samples, 14.2 s; the duplicated newest sample covers nothing).
#[test]
fn duty_cycle_is_read_completely_every_window() {
    let state = tempfile::tempdir().unwrap();
    let first = ex().run_at("duty-cycle", state.path(), T0, &[]);
    let (busy, sampled, ratio) = window_of(&first);
    assert!(close(sampled, 14.2), "{first}");
    // Samples k-70..=k with k at a busy start: 36 busy of 71.
    assert!(close(busy, 7.2), "{first}");
    assert!(close(ratio.unwrap(), 36.0 / 71.0));
    assert!(close(
        value_in(
            &first,
            "nvidia_gpu_memory_utilization_ratio",
            &[("gpu", "0")]
        )
        .unwrap(),
        0.8 * 36.0 / 71.0
    ));
    let (mut busy, mut sampled) = (busy, sampled);
    for run in 1..=4 {
        let text = ex().run_at("duty-cycle", state.path(), T0 + run * 10 * SECOND, &[]);
        let (now_busy, now_sampled, ratio) = window_of(&text);
        assert_eq!(ratio, Some(0.5), "run {run}");
        assert!(
            close(now_busy - busy, 5.0),
            "run {run}: {now_busy} after {busy}"
        );
        assert!(close(now_sampled - sampled, 10.0), "run {run}");
        (busy, sampled) = (now_busy, now_sampled);
    }
    // Encoder and decoder keep no samples here: point readings, no counters.
    let text = ex().run_at("duty-cycle", state.path(), T0 + 50 * SECOND, &[]);
    assert_eq!(
        value_in(
            &text,
            "nvidia_gpu_decoder_utilization_ratio",
            &[("gpu", "0")]
        ),
        Some(0.03)
    );
    let samples = parsed(&text);
    let decoder = samples
        .keys()
        .filter(|s| s.label("engine") == Some("decoder"));
    assert_eq!(decoder.count(), 0, "{text}");
    assert_eq!(lookup(&samples, "nvidia_gpu_collector_state_ok"), Some(1.0));
}

/// A timer period longer than NVML's buffer: the missing time is not invented,
/// it shows as sampled time growing slower than wall time.
#[test]
fn a_gap_longer_than_the_buffer_shows_in_sampled_time() {
    let state = tempfile::tempdir().unwrap();
    let (_, before, _) = window_of(&ex().run_at("duty-cycle", state.path(), T0, &[]));
    let (_, after, ratio) =
        window_of(&ex().run_at("duty-cycle", state.path(), T0 + 30 * SECOND, &[]));
    assert!(close(after - before, 14.2), "{before} -> {after}");
    assert!(ratio.is_some());
}

/// Two runs with no sample in between: the ratio is left out (nothing new to
/// average), the counters stay as they were.
#[test]
fn no_new_samples_leave_the_ratio_out_and_the_counters_alone() {
    let state = tempfile::tempdir().unwrap();
    let first = window_of(&ex().run_at("duty-cycle", state.path(), T0, &[]));
    let second = window_of(&ex().run_at("duty-cycle", state.path(), T0 + 100_000, &[]));
    assert_eq!((second.0, second.1), (first.0, first.1));
    assert_eq!(second.2, None);
}

/// The clock stepped back: nothing is counted twice and the counters never go
/// back; a small step costs the time until the clock passes the last sample
/// again, a large one (the system clock behind the last sample) re-reads the
/// buffer.
#[test]
fn a_clock_stepped_back_counts_nothing_twice() {
    let state = tempfile::tempdir().unwrap();
    let first = window_of(&ex().run_at("duty-cycle", state.path(), T0, &[]));
    let stepped = window_of(&ex().run_at("duty-cycle", state.path(), T0 - 5 * SECOND, &[]));
    assert_eq!((stepped.0, stepped.1, stepped.2), (first.0, first.1, None));
    let later = window_of(&ex().run_at("duty-cycle", state.path(), T0 + 10 * SECOND, &[]));
    assert!(close(later.1 - first.1, 10.0));
    assert_eq!(later.2, Some(0.5));

    // Samples stamped a day ahead of the system clock, then the clock put right.
    let aligned = now_on_the_sample_grid();
    let ahead = window_of(&ex().run_at("duty-cycle", state.path(), aligned + 86_400 * SECOND, &[]));
    let back = window_of(&ex().run_at("duty-cycle", state.path(), aligned - 3_600 * SECOND, &[]));
    assert!(ahead.1 >= later.1 && ahead.0 >= later.0);
    assert!(close(back.1 - ahead.1, 14.2), "{ahead:?} -> {back:?}");
    assert!(back.2.is_some());
    let after = window_of(&ex().run_at("duty-cycle", state.path(), aligned - 3_590 * SECOND, &[]));
    assert!(close(after.1 - back.1, 10.0));
    assert_eq!(after.2, Some(0.5));
}

/// A GPU reset empties NVML's buffer: the counters continue from the state and
/// cover only the samples taken since.
#[test]
fn a_gpu_reset_continues_the_counters() {
    let reset = 1_800_000_000_000_000;
    let state = tempfile::tempdir().unwrap();
    let before = window_of(&ex().run_at("duty-cycle", state.path(), reset - 10 * SECOND, &[]));
    let after = window_of(&ex().run_at("duty-cycle", state.path(), reset + 4 * SECOND, &[]));
    assert!(close(after.1 - before.1, 4.0), "{before:?} -> {after:?}");
    assert!(after.0 >= before.0);
}

/// Lost or damaged state: the run still publishes, from the whole buffer,
/// and says so in nvidia_gpu_collector_state_ok.
#[test]
fn missing_or_corrupt_state_still_publishes() {
    let state = tempfile::tempdir().unwrap();
    let first = ex().run_at("duty-cycle", state.path(), T0, &[]);
    assert_eq!(
        lookup(&parsed(&first), "nvidia_gpu_collector_state_ok"),
        Some(0.0)
    );
    fs::write(state.path().join("state"), "garbage\n").unwrap();
    let output = ex().run_args(
        "duty-cycle",
        state.path(),
        &["--stdout"],
        &[("FAKE_NVML_CLOCK_US", &(T0 + 10 * SECOND).to_string())],
    );
    assert_eq!(output.code(), Some(0));
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        lookup(&parsed(&text), "nvidia_gpu_collector_state_ok"),
        Some(0.0)
    );
    let (_, sampled, ratio) = window_of(&text);
    assert!(close(sampled, 14.2));
    assert!(ratio.is_some());
}

/// Where NVML keeps no samples (MIG mode), the point reading, said in HELP;
/// no counters are invented.
#[test]
fn mig_mode_falls_back_to_the_point_reading() {
    let state = tempfile::tempdir().unwrap();
    let text = ex().run_at("mig-point-reading", state.path(), T0, &[]);
    assert_eq!(
        value_in(&text, "nvidia_gpu_utilization_ratio", &[("gpu", "0")]),
        Some(0.42)
    );
    assert_eq!(
        value_in(
            &text,
            "nvidia_gpu_memory_utilization_ratio",
            &[("gpu", "0")]
        ),
        Some(0.07)
    );
    let file = exposition::parse_all(&text).unwrap();
    assert!(select(&file.samples, "nvidia_gpu_busy_seconds_total", &[]).is_empty());
    let help = file.families["nvidia_gpu_utilization_ratio"]
        .help
        .as_deref();
    assert!(
        help.is_some_and(|h| h.contains("(MIG mode), the point reading")),
        "{help:?}"
    );
}

/// Samples with an impossible value (101 %) are dropped and claim no time: a
/// first run over a full 71-sample buffer alternating 0 % and 101 % counts the
/// 36 good samples' 7.2 s, never more than the buffer holds.
#[test]
fn impossible_samples_claim_no_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("impossible.toml");
    let text = fs::read_to_string(scenario("duty-cycle"))
        .unwrap()
        .replace(
            "gpu = [100, 100, 100, 100, 100, 0, 0, 0, 0, 0]",
            "gpu = [0, 101]",
        )
        .replace(", duplicate_last = true", "");
    fs::write(&path, text).unwrap();
    let state = tempfile::tempdir().unwrap();
    let output = ex().run_args(
        "duty-cycle",
        state.path(),
        &["--stdout", "--gpm-window", "0"],
        &[
            ("FAKE_NVML_SCENARIO", path.to_str().unwrap()),
            ("FAKE_NVML_CLOCK_US", &T0.to_string()),
        ],
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let engine = &[("engine", "gpu")];
    let sampled = value_in(&text, "nvidia_gpu_sampled_seconds_total", engine).unwrap();
    let busy = value_in(&text, "nvidia_gpu_busy_seconds_total", engine).unwrap();
    assert!((sampled - 7.2).abs() < 1e-9, "sampled {sampled}\n{text}");
    assert_eq!(busy, 0.0, "{text}");
    assert_eq!(
        value_in(&text, "nvidia_gpu_collector_read_errors", &[("gpu", "0")]),
        Some(35.0),
        "{text}"
    );
}

/// A run whose state another run holds (its lock) publishes no running
/// totals rather than totals from 0, so the counters never go back; the next
/// run continues the stored ones.
#[test]
fn a_run_without_the_state_leaves_the_totals_out() {
    let state = tempfile::tempdir().unwrap();
    let busy = |o: &Outcome| {
        let text = String::from_utf8(o.stdout.clone()).unwrap();
        value_in(&text, "nvidia_gpu_busy_seconds_total", &[("engine", "gpu")])
    };
    let first = ex().stored_run("duty-cycle", state.path(), T0, &[]);
    let before = busy(&first).expect("a first run keeps totals");
    let lock = fs::File::create(state.path().join(".state.lock")).unwrap();
    lock.lock().unwrap();
    let locked = ex().stored_run(
        "duty-cycle",
        state.path(),
        T0 + 15 * SECOND,
        &["--timeout", "1s"],
    );
    let text = String::from_utf8(locked.stdout.clone()).unwrap();
    assert_eq!(busy(&locked), None, "{text}");
    let samples = parsed(&text);
    for family in [
        "nvidia_gpu_sampled_seconds_total",
        "nvidia_gpu_xid_errors_total",
    ] {
        assert!(select(&samples, family, &[]).is_empty(), "{family}: {text}");
    }
    for (series, want) in [
        ("nvidia_gpu_collector_success{collector=\"xid\"}", 0.0),
        ("nvidia_gpu_collector_state_ok", 0.0),
    ] {
        assert_eq!(lookup(&samples, series), Some(want), "{series}: {text}");
    }
    // The window's own ratio is still published.
    let ratio = select(&samples, "nvidia_gpu_utilization_ratio", &[]);
    assert!(!ratio.is_empty(), "{text}");
    drop(lock);
    let after = ex().stored_run("duty-cycle", state.path(), T0 + 30 * SECOND, &[]);
    assert!(busy(&after).unwrap() > before);
}

/// The GPU engine's sample buffer is fetched once a run, whichever of
/// utilization, tasks and processes read it; the memory buffer is another.
#[test]
fn the_gpu_engines_samples_are_fetched_once_for_every_reader() {
    let state = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let out = ex().run_args(
        "tasks",
        state.path(),
        &["--stdout", "--collector", "processes", "--gpm-window", "0"],
        &[("FAKE_NVML_CALL_LOG", log.path().to_str().unwrap())],
    );
    assert_eq!(out.code(), Some(0), "{}", out.err());
    let calls = Calls::read(log.path());
    // Per GPU the GPU engine's buffer once (not again for the processes'
    // window), the memory's, and the decoder's (NOT_SUPPORTED here; the
    // encoder is not asked on GH100).
    let samples = calls.count("nvmlDeviceGetSamples", "0");
    assert_eq!(samples, 3, "{calls:?}");
    assert_eq!(
        calls.count("nvmlDeviceGetProcessUtilization", "0"),
        1,
        "{calls:?}"
    );
}

/// A GPU with no process now and none at the previous run: the tasks do
/// not ask NVML for per-process shares (no share could be a task's); the
/// processes collector still does (a process that came and went has its
/// pid series).
#[test]
fn an_idle_gpu_is_not_asked_for_process_shares_but_for_the_processes_collector() {
    // duty-cycle's GPU without its process.
    let text = fs::read_to_string(scenario("duty-cycle")).unwrap();
    let (before, after) = text.split_once("processes = [").unwrap();
    let idle = format!(
        "{before}processes = []{}",
        &after[after.find("\n]").unwrap() + 2..]
    );
    let dir = tempfile::tempdir().unwrap();
    let idle_scenario = dir.path().join("idle.toml");
    fs::write(&idle_scenario, idle).unwrap();
    for (args, asked) in [(&[][..], 0), (&["--collector", "processes"][..], 1)] {
        let state = tempfile::tempdir().unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut all = vec!["--stdout", "--gpm-window", "0"];
        all.extend_from_slice(args);
        let out = ex().run_args(
            idle_scenario.to_str().unwrap(),
            state.path(),
            &all,
            &[("FAKE_NVML_CALL_LOG", log.path().to_str().unwrap())],
        );
        assert_eq!(out.code(), Some(0), "{}", out.err());
        let calls = Calls::read(log.path());
        let made = calls.count("nvmlDeviceGetProcessUtilization", "0");
        assert_eq!(made, asked, "{args:?}: {calls:?}");
    }
}

/// `scenario` with a buffer of 5 samples (1 s at 200 ms) and GPM, written
/// into `dir`: a run's window outlasts the buffer.
fn with_short_buffer(dir: &Path, name: &str) -> String {
    let text = fs::read_to_string(scenario(name)).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        match line.strip_prefix("samples = { ") {
            Some(rest) => {
                let rest = rest
                    .replace("buffer = 71, ", "")
                    .replace(", duplicate_last = true", "");
                out += &format!("samples = {{ buffer = 5, {rest}\ngpm = {{ sm_active = 50.0 }}\n");
            }
            None => out += &format!("{line}\n"),
        }
    }
    let path = dir.join(format!("{name}-short-buffer.toml"));
    fs::write(&path, out).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Two runs 1.8 s apart, each with a 1 s GPM window, at the fake's running
/// clock from `t0`; `args` and the state in `state`.
fn runs_around_windows(path: &str, state: &Path, t0: u64, args: &[&str]) -> (String, String) {
    let mut all = vec!["--stdout", "--write-state"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--gpm-window", "1s", "--timeout", "3s"]);
    let run = |from: u64| {
        let from = from.to_string();
        let output = ex().run_args(path, state, &all, &[("FAKE_NVML_CLOCK_FROM_US", &from)]);
        assert_eq!(output.code(), Some(0), "{}", output.err());
        String::from_utf8(output.stdout).unwrap()
    };
    (run(t0), run(t0 + 1_800_000))
}

/// A run with a GPM window reads NVML's buffers as the window opens and
/// again at its end, so the buffer has to hold only the time between runs:
/// a buffer of 1 s covers two runs 1.8 s apart whole (one read at the
/// window's end would count 1 s of it, the rest lost).
#[test]
fn a_window_reads_the_buffers_at_both_ends_and_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = with_short_buffer(dir.path(), "duty-cycle");
    let state = tempfile::tempdir().unwrap();
    let (first, second) = runs_around_windows(&path, state.path(), T0, &[]);
    let (busy, sampled, _) = window_of(&first);
    let (then_busy, then_sampled, ratio) = window_of(&second);
    let covered = then_sampled - sampled;
    // From the first run's last sample to the second's: 1.8 s, give or
    // take the two windows' ends (a sample period each).
    assert!((1.5..=2.1).contains(&covered), "{covered} s\n{second}");
    assert!(ratio.is_some());
    // Every sample counted once: busy is 100 % of the busy samples' time.
    let busy_samples = then_busy - busy;
    assert!(busy_samples <= covered + 1e-9);
    assert!(
        close((busy_samples / 0.2).round() * 0.2, busy_samples),
        "{busy_samples}"
    );
}

/// The tasks' shares come from the same two reads: each task's busy time
/// is its share of the whole window, and together they are the GPU's.
#[test]
fn a_window_gives_the_tasks_their_shares_of_the_whole_period() {
    let dir = tempfile::tempdir().unwrap();
    let path = with_short_buffer(dir.path(), "tasks");
    let tree = super::tasks::tasks_tree();
    let state = tempfile::tempdir().unwrap();
    let args = tree.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let t0 = now_on_the_sample_grid();
    let (first, second) = runs_around_windows(&path, state.path(), t0, &args);
    let busy = |text: &str| {
        let gpu = value_in(
            text,
            "nvidia_gpu_busy_seconds_total",
            &[("gpu", "0"), ("engine", "gpu")],
        );
        let family = "nvidia_gpu_task_busy_seconds_total";
        let job = super::tasks::task_value(text, family, "0", &super::tasks::slurm("4711"));
        let pod = [("k8s_pod_uid", super::tasks::POD)];
        (
            gpu.unwrap(),
            job,
            super::tasks::task_value(text, family, "0", &pod),
        )
    };
    let ((gpu, job, pod), (then_gpu, then_job, then_pod)) = (busy(&first), busy(&second));
    let (gpu, job, pod) = (then_gpu - gpu, then_job - job, then_pod - pod);
    // GPU 0 busy 60 % of about 1.8 s, the job's share 40 and the pod's 20.
    assert!((0.9..=1.26).contains(&gpu), "GPU busy {gpu} s\n{second}");
    assert!((job + pod - gpu).abs() < 1e-5, "{job} + {pod} != {gpu}");
    assert!((job - 2.0 * pod).abs() < 1e-5, "{job} != 2 x {pod}");
}

/// Runs further apart than NVML's buffer holds (no GPM window, a 30 s
/// timer): the GPU's own counters keep only what was sampled (14.2 s of
/// the 30 s), while the tasks count the unread 15.8 s at the window's mean,
/// so that a job's busy GPU-hours are not low by it (docs/design.md, "Tasks").
#[test]
fn tasks_count_the_unread_part_of_a_window_at_its_mean() {
    let tree = super::tasks::tasks_tree();
    let runs = super::tasks::Runs::new(&tree);
    let first = runs.at("tasks", runs.t0);
    let second = runs.at("tasks", runs.t0 + 30 * SECOND);
    let family = "nvidia_gpu_task_busy_seconds_total";
    let grown = |labels: &[(&str, &str)]| {
        super::tasks::task_value(&second, family, "0", labels)
            - super::tasks::task_value(&first, family, "0", labels)
    };
    let gpu = [("gpu", "0"), ("engine", "gpu")];
    let gpu_busy = value_in(&second, "nvidia_gpu_busy_seconds_total", &gpu).unwrap()
        - value_in(&first, "nvidia_gpu_busy_seconds_total", &gpu).unwrap();
    // GPU 0 busy 60 %: 8.52 s of the 14.2 s sampled; 18 s of the 30 s.
    assert!(close(gpu_busy, 0.6 * 14.2), "{gpu_busy}");
    let job = grown(&super::tasks::slurm("4711"));
    let pod = grown(&[("k8s_pod_uid", super::tasks::POD)]);
    assert!(close(job, 12.0), "{job}\n{second}");
    assert!(close(pod, 6.0), "{pod}");
}
