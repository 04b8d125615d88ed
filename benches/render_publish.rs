//! Cost of rendering and publishing a large snapshot, and the allocations made.
//!
//! The snapshot is built by hand as the readers would build it for 8 H100 SXM
//! GPUs in MIG mode: per GPU the default collectors' samples (18 NVLinks with
//! their data counters), 7 MIG devices and 200 compute processes with the
//! owner labels `procfs` adds. Labels the readers format from numbers or copy
//! (link, ids, pid, owner) are owned strings here too, as there.
//!
//! A plain `fn main` (registered with `harness = false`):
//!
//! ```sh
//! cargo bench --bench render_publish                  # 1000 iterations
//! cargo bench --bench render_publish -- 300 /some/dir # iterations, publish directories
//! ```
//!
//! Publishes go to a fresh directory on tmpfs (`/dev/shm`) and one in the
//! system temporary directory unless directories are given. Times are medians
//! of per-iteration times; compare them as ratios on the same machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::borrow::Cow;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use nvidia_textfile_exporter::metrics::{self, Family, Labelled};
use nvidia_textfile_exporter::render;
use nvidia_textfile_exporter::snapshot::{Device, LabelValue, Sample, Snapshot};
use nvidia_textfile_exporter::Target;

// ---------------------------------------------------------------------------
// Counting allocator

/// Counters per class: strings (alignment 1: label values, UUIDs, the output
/// text) and everything else (vectors of samples, labels, buckets).
struct Counters {
    allocs: AtomicU64,
    reallocs: AtomicU64,
    bytes: AtomicU64,
    realloc_copied: AtomicU64,
}

impl Counters {
    const fn new() -> Self {
        Counters {
            allocs: AtomicU64::new(0),
            reallocs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            realloc_copied: AtomicU64::new(0),
        }
    }

    fn of(layout: Layout) -> &'static Counters {
        if layout.align() == 1 {
            &STRINGS
        } else {
            &OTHERS
        }
    }

    fn read(&self) -> Allocs {
        Allocs {
            allocs: self.allocs.load(Relaxed),
            reallocs: self.reallocs.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            realloc_copied: self.realloc_copied.load(Relaxed),
        }
    }
}

static STRINGS: Counters = Counters::new();
static OTHERS: Counters = Counters::new();

struct Counting;

// SAFETY: forwards every call unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let counters = Counters::of(layout);
        counters.allocs.fetch_add(1, Relaxed);
        counters.bytes.fetch_add(layout.size() as u64, Relaxed);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let counters = Counters::of(layout);
        counters.allocs.fetch_add(1, Relaxed);
        counters.bytes.fetch_add(layout.size() as u64, Relaxed);
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let counters = Counters::of(layout);
        counters.reallocs.fetch_add(1, Relaxed);
        counters
            .realloc_copied
            .fetch_add(layout.size() as u64, Relaxed);
        counters
            .bytes
            .fetch_add(new_size.saturating_sub(layout.size()) as u64, Relaxed);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations of one class made while running `f`.
#[derive(Debug, Clone, Copy, Default)]
struct Allocs {
    allocs: u64,
    reallocs: u64,
    bytes: u64,
    /// Bytes the reallocations had to move (an upper bound: some grow in place).
    realloc_copied: u64,
}

impl Allocs {
    fn since(self, before: Allocs) -> Allocs {
        Allocs {
            allocs: self.allocs - before.allocs,
            reallocs: self.reallocs - before.reallocs,
            bytes: self.bytes - before.bytes,
            realloc_copied: self.realloc_copied - before.realloc_copied,
        }
    }
}

impl std::fmt::Display for Allocs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} + {} realloc ({} KB, {} KB moved)",
            self.allocs,
            self.reallocs,
            self.bytes / 1000,
            self.realloc_copied / 1000
        )
    }
}

/// String and other allocations made while running `f`.
fn counted<T>(f: impl FnOnce() -> T) -> (T, Allocs, Allocs) {
    let (strings, others) = (STRINGS.read(), OTHERS.read());
    let value = f();
    (
        value,
        STRINGS.read().since(strings),
        OTHERS.read().since(others),
    )
}

// ---------------------------------------------------------------------------
// The snapshot

const GPUS: u32 = 8;
const MIG_DEVICES: u32 = 7;
const PROCESSES_PER_GPU: u32 = 200;
const NVLINKS: u32 = 18;

/// The family `nvidia_gpu_<name>` as its collector declares it (found
/// without allocating, so that the counts below are the readers' own).
fn family<const N: usize>(name: &str) -> Labelled<N> {
    let named = |family: &&Family| family.name.strip_prefix("nvidia_gpu_") == Some(name);
    let found = nvidia_textfile_exporter::families().find(named);
    Labelled::new(found.expect("a declared family"))
}

/// What the readers would produce for one H100 SXM in MIG mode.
fn device(index: u32, mig: u32, processes: u32) -> Device {
    let mut samples = Vec::with_capacity(64);
    let mut push = |sample: Sample| samples.push(sample);

    push(metrics::INFO.sample_with(
        [
            String::from("NVIDIA H100 80GB HBM3"),
            format!("00000000:{:02X}:00.0", 0x18 + index * 0x11),
            format!("16549230{:05}", 11871 + index * 37),
            String::from("96.00.99.00.01"),
            String::from("nvidia"),
            String::from("hopper"),
            index.to_string(),
        ],
        1.0,
    ));
    push(family("utilization_ratio").sample(0.97));
    push(family("memory_utilization_ratio").sample(0.61));
    push(family("processes").sample(f64::from(processes)));
    for (family, value) in [
        (family("memory_used_bytes"), 77844185088.0),
        (family("memory_free_bytes"), 7039090688.0),
        (family("memory_total_bytes"), 85520809984.0),
        (family("memory_reserved_bytes"), 637534208.0),
        (family("bar1_memory_used_bytes"), 41943040.0),
        (family("bar1_memory_total_bytes"), 137438953472.0),
        (family("temperature_celsius"), 71.0),
        (family("memory_temperature_celsius"), 78.0),
    ] {
        push(family.sample(value));
    }
    for (threshold, value) in [
        ("slowdown", 89.0),
        ("shutdown", 92.0),
        ("gpu_max", 87.0),
        ("memory_max", 95.0),
    ] {
        push(family("temperature_threshold_celsius").sample_with([threshold], value));
    }
    for (family, value) in [
        (family("power_watts"), 682.311),
        (family("energy_joules_total"), 486214350.112),
        (family("power_limit_watts"), 700.0),
        (family("power_default_limit_watts"), 700.0),
        (family("power_min_limit_watts"), 200.0),
        (family("power_max_limit_watts"), 700.0),
    ] {
        push(family.sample(value));
    }
    for family in [family("clock_hertz"), family("clock_max_hertz")] {
        for (clock, mhz) in [
            ("graphics", 1980.0),
            ("sm", 1980.0),
            ("memory", 2619.0),
            ("video", 1755.0),
        ] {
            push(family.sample_with([clock], mhz * 1e6));
        }
    }
    push(family("performance_state").sample(0.0));
    for (bit, reason) in [
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
    ]
    .into_iter()
    .enumerate()
    {
        push(family("clocks_event_active").sample_with([reason], f64::from(u8::from(bit == 2))));
    }
    for (policy, seconds) in [
        ("power", 48.2),
        ("thermal", 0.0),
        ("sync_boost", 0.0),
        ("board_limit", 0.0),
        ("low_utilization", 0.0),
        ("reliability", 0.0),
        ("app_clocks", 0.0),
        ("base_clocks", 0.0),
    ] {
        push(family("violation_seconds_total").sample_with([policy], seconds));
    }
    for (family, value) in [
        (family("pcie_link_generation"), 5.0),
        (family("pcie_link_max_generation"), 5.0),
        (family("pcie_link_width"), 16.0),
        (family("pcie_link_max_width"), 16.0),
        (family("pcie_replays_total"), 0.0),
        (family("pcie_transmit_bytes_total"), 9183365120311.0),
        (family("pcie_receive_bytes_total"), 8873412093342.0),
        (family("ecc_enabled"), 1.0),
        (family("ecc_pending_enabled"), 1.0),
    ] {
        push(family.sample(value));
    }
    for (kind, scope) in [
        ("corrected", "volatile"),
        ("uncorrected", "volatile"),
        ("corrected", "aggregate"),
        ("uncorrected", "aggregate"),
    ] {
        push(family("ecc_errors_total").sample_with([kind, scope], 0.0));
    }
    for cause in ["correctable", "uncorrectable"] {
        push(family("remapped_rows").sample_with([cause], 0.0));
    }
    for (family, value) in [
        (family("remapped_rows_pending"), 0.0),
        (family("remapped_rows_failure"), 0.0),
        (family("decoder_utilization_ratio"), 0.0),
        (family("persistence_mode"), 1.0),
    ] {
        push(family.sample(value));
    }
    push(family("compute_mode").sample_with(["default"], 1.0));
    push(family("mig_enabled").sample(f64::from(u8::from(mig > 0))));
    push(family("mig_pending_enabled").sample(f64::from(u8::from(mig > 0))));
    for link in 0..NVLINKS {
        let label = link.to_string();
        push(family("nvlink_link_active").sample_with([label.clone()], 1.0));
        for counter in ["replay", "recovery", "crc_flit", "crc_data"] {
            push(
                family("nvlink_link_errors_total")
                    .sample_with([LabelValue::from(label.clone()), counter.into()], 0.0),
            );
        }
    }
    for link in 0..NVLINKS {
        for family in [
            family("nvlink_link_transmit_bytes_total"),
            family("nvlink_link_receive_bytes_total"),
        ] {
            let bytes = 1024.0 * f64::from(918336512 + link * 7919);
            push(family.sample_with([link.to_string()], bytes));
        }
    }
    for slot in 0..mig {
        let gi = (slot + 1).to_string();
        let ci = String::from("0");
        push(family("mig_info").sample_with(
            [
                LabelValue::from(gi.clone()),
                ci.clone().into(),
                format!("MIG-4f1b8a2e-63c7-5d90-8e4a-b2c9d1{index:02x}{slot:04x}").into(),
                "1g.10gb".into(),
            ],
            1.0,
        ));
        for (family, bytes) in [
            (family("mig_memory_used_bytes"), 9663676416.0),
            (family("mig_memory_total_bytes"), 10200547328.0),
        ] {
            push(family.sample_with([gi.clone(), ci.clone()], bytes));
        }
    }
    for process in 0..processes {
        let pid = 300000 + index * 1000 + process;
        let job = 4711000 + index * 100 + process % 50;
        let owned = |value: String| Some(LabelValue::Owned(value));
        let labels = [
            owned(pid.to_string()),
            (mig > 0).then(|| LabelValue::Owned((1 + process % mig).to_string())),
            (mig > 0).then(|| LabelValue::Owned(0.to_string())),
            owned(format!("python3-rank{}", process % 16)),
            owned(format!("user{:03}", process % 40)),
            owned(format!("slurmstepd-job{job}.scope")),
            owned(format!("{:064x}", u128::from(pid) * 0x9e37_79b9)),
            owned(job.to_string()),
        ];
        let bytes = f64::from(1 + process % 9) * 1073741824.0;
        push(family("process_memory_used_bytes").sample_some(labels, bytes));
    }
    push(metrics::UP.sample(1.0));
    push(metrics::COLLECTOR_READ_ERRORS.sample(0.0));
    Device {
        index,
        uuid: format!("GPU-5a8f0c3e-1b7d-4e52-9c61-2f3a8d4b7e{index:02x}"),
        samples,
        ..Device::default()
    }
}

fn snapshot(gpus: u32, mig: u32, processes: u32) -> Snapshot {
    Snapshot {
        host: vec![
            metrics::COLLECTOR_UP.sample(1.0),
            metrics::COLLECTOR_DURATION.sample(0.062118933),
            metrics::COLLECTOR_TIMESTAMP.sample(1796045427.125),
            metrics::COLLECTOR_BUILD_INFO.sample_with(["0.1.0"], 1.0),
            metrics::DRIVER_INFO.sample_with(
                [
                    String::from("580.159.04"),
                    String::from("13.0"),
                    String::from("13.580.159.04"),
                ],
                1.0,
            ),
        ],
        devices: (0..gpus).map(|i| device(i, mig, processes)).collect(),
    }
}

/// Samples, labels, and labels whose value is an owned string (one allocation each).
fn census(snapshot: &Snapshot) -> (usize, usize, usize) {
    let samples = || {
        snapshot
            .host
            .iter()
            .chain(snapshot.devices.iter().flat_map(|d| &d.samples))
    };
    let labels = samples().map(|s| s.labels.len()).sum();
    let owned = samples()
        .flat_map(|s| &s.labels)
        .filter(|l| matches!(l.value, Cow::Owned(_)))
        .count();
    (samples().count(), labels, owned)
}

// ---------------------------------------------------------------------------
// Measuring

fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Median and fastest time of `f` over `iterations` calls, after a few warm-up calls.
fn time<T>(iterations: usize, mut f: impl FnMut() -> T) -> (Duration, Duration) {
    for _ in 0..iterations.clamp(1, 10) {
        black_box(f());
    }
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        black_box(f());
        times.push(start.elapsed());
    }
    let fastest = *times.iter().min().unwrap();
    (median(&mut times), fastest)
}

fn publish_dirs(args: &[String]) -> Vec<PathBuf> {
    if !args.is_empty() {
        return args.iter().map(PathBuf::from).collect();
    }
    let mut dirs = Vec::new();
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        dirs.push(shm.to_path_buf());
    }
    dirs.push(std::env::temp_dir());
    dirs
}

/// Renders `snapshot`, reports size, allocations and time; returns the text and
/// the median time.
fn report_render(name: &str, snapshot: &Snapshot, iterations: usize) -> (String, Duration) {
    let (samples, labels, owned) = census(snapshot);
    let (text, strings, others) = counted(|| render(snapshot));
    println!(
        "{name}: {samples} samples, {labels} extra labels ({owned} owned values), \
         {} bytes, {} lines",
        text.len(),
        text.lines().count()
    );
    println!("  allocations per render call: strings {strings}; vectors {others}");
    let (median, fastest) = time(iterations, || render(snapshot));
    println!(
        "  render: median {:.1} us (fastest {:.1}), {:.0} ns per sample",
        micros(median),
        micros(fastest),
        median.as_secs_f64() * 1e9 / samples as f64,
    );
    (text, median)
}

fn main() {
    // `cargo bench` passes --bench; the other arguments are ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (iterations, dirs) = match args.first().map(|a| a.parse::<usize>()) {
        Some(Ok(n)) if n > 0 => (n, publish_dirs(&args[1..])),
        Some(_) => {
            eprintln!("usage: render_publish [ITERATIONS [PUBLISH_DIR...]]");
            std::process::exit(2);
        }
        None => (1000, publish_dirs(&[])),
    };

    let (small, strings, others) = counted(|| snapshot(1, 0, 0));
    println!(
        "Building the snapshot, as readers and procfs allocate: 1 GPU, no MIG or \
         processes: strings {strings}; vectors {others}"
    );
    let (large, strings, others) = counted(|| snapshot(GPUS, MIG_DEVICES, PROCESSES_PER_GPU));
    println!(
        "  {GPUS} GPUs x {MIG_DEVICES} MIG x {PROCESSES_PER_GPU} processes: strings {strings}; \
         vectors {others}"
    );
    println!("Render ({iterations} iterations each):");
    let (_, small_render) = report_render("1 GPU, no MIG or processes", &small, iterations);
    let (text, large_render) = report_render(
        &format!("{GPUS} GPUs x {MIG_DEVICES} MIG devices x {PROCESSES_PER_GPU} processes"),
        &large,
        iterations,
    );
    println!(
        "  render time, large / small: {:.1}",
        large_render.as_secs_f64() / small_render.as_secs_f64()
    );

    println!(
        "Publish of the large text ({} bytes), {} iterations:",
        text.len(),
        iterations.div_ceil(4)
    );
    for dir in dirs {
        let scratch = match tempfile::Builder::new()
            .prefix("render-publish-bench.")
            .tempdir_in(&dir)
        {
            Ok(scratch) => scratch,
            Err(e) => {
                println!("  {}: skipped ({e})", dir.display());
                continue;
            }
        };
        let target = Target::new(scratch.path(), "nvidia_gpu.prom");
        let (result, strings, others) = counted(|| target.publish(&text));
        if let Err(e) = result {
            println!("  {}: skipped ({e})", dir.display());
            continue;
        }
        let (median, fastest) = time(iterations.div_ceil(4), || {
            target.publish(&text).expect("publish");
        });
        println!(
            "  into {}: median {:.1} us (fastest {:.1}), {:.2}x the large render; \
             allocations per call: strings {strings}; others {others}",
            dir.display(),
            micros(median),
            micros(fastest),
            median.as_secs_f64() / large_render.as_secs_f64(),
        );
    }
}
