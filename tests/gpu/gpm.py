#!/usr/bin/env python3
"""GPM values of the exporter under four known loads, beside NVML utilization.

Run on a host with a Hopper (or newer) GPU, from the repository root, as root:

    python3 tests/gpu/gpm.py [EXPORTER] [GPULOAD]

EXPORTER defaults to target/release/nvidia-textfile-exporter, GPULOAD to
target/gpu/gpuload (gcc -O2 -o target/gpu/gpuload gpuload.c -ldl). GPU=N picks
the GPU (default 0). About 1.5 minutes.

1. Each load of the table below runs on the GPU; after a 4 s warm-up the
   exporter takes three snapshots with --gpm-window 1s; the medians are printed
   beside nvidia_gpu_utilization_ratio and checked against what the load does.
2. Windows from 100 ms to 2 s on the full spin load: the shortest window that
   reads right (a 50 ms window read zeros), and the window the exporter measured.
3. Run time on the idle GPU with the window and without (--gpm-window 0).

Exit status 0 when every check passes. A run whose GPM is unavailable prints its
reason (no_permission: run as root, or see docs/operations.md, "GPM: permission and profilers").
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

EXPORTER = sys.argv[1] if len(sys.argv) > 1 else "target/release/nvidia-textfile-exporter"
GPULOAD = sys.argv[2] if len(sys.argv) > 2 else "target/gpu/gpuload"
GPU = os.environ.get("GPU", "0")
STATE = tempfile.mkdtemp(prefix="gpm-state-")

# name, gpuload arguments, checks on the medians (ratio names as below)
LOADS = [
    ("spin 1 x 1", ["spin", "1000", "0", "20", "0", "1", "1"],
     [("utilization", ">=", 0.9), ("sm_active", "<", 0.05), ("tensor", "<", 0.01), ("dram", "<", 0.05)]),
    ("spin 1056 x 1024", ["spin", "1000", "0", "20", "0", "1056", "1024"],
     [("utilization", ">=", 0.9), ("sm_active", ">=", 0.9), ("sm_occupancy", ">=", 0.5), ("tensor", "<", 0.01)]),
    ("tensor 1056 x 256", ["tensor", "1000", "0", "20", "0", "1056", "256"],
     [("utilization", ">=", 0.9), ("sm_active", ">=", 0.9), ("tensor", ">=", 0.5)]),
    ("dram 8 GiB memset", ["dram", "1000", "0", "20", "8192"],
     [("utilization", ">=", 0.9), ("sm_active", ">=", 0.5), ("dram", ">=", 0.8), ("tensor", "<", 0.01)]),
]
COLUMNS = [
    ("utilization", "nvidia_gpu_utilization_ratio", None),
    ("sm_active", "nvidia_gpu_sm_active_ratio", None),
    ("sm_occupancy", "nvidia_gpu_sm_occupancy_ratio", None),
    ("graphics", "nvidia_gpu_graphics_engine_active_ratio", None),
    ("tensor", "nvidia_gpu_pipe_active_ratio", "tensor"),
    ("hmma", "nvidia_gpu_pipe_active_ratio", "tensor_hmma"),
    ("fp32", "nvidia_gpu_pipe_active_ratio", "fp32"),
    ("dram", "nvidia_gpu_dram_active_ratio", None),
    ("window", "nvidia_gpu_gpm_window_seconds", None),
]
LINE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def snapshot(window="1s"):
    """One exporter run: (values of GPU $GPU by column, unavailable reason, wall s, stderr)."""
    start = time.perf_counter()
    result = subprocess.run(
        [EXPORTER, "--stdout", "--write-state", "--state-dir", STATE, "--gpm-window", window],
        capture_output=True, text=True, timeout=30)
    wall = time.perf_counter() - start
    values, reason = {}, None
    for line in result.stdout.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        if labels.get("gpu") != GPU or "gpu_instance_id" in labels:
            continue
        if name == "nvidia_gpu_gpm_unavailable":
            reason = labels.get("reason")
        for column, family, pipe in COLUMNS:
            if name == family and labels.get("pipe") == pipe:
                values[column] = float(value)
    if result.returncode != 0:
        print(f"exporter exit status {result.returncode}: {result.stderr.strip()}")
    return values, reason, wall, result.stderr.strip()


def start_load(args):
    # MODE BUSY IDLE SECONDS [MEM_MIB] [BLOCKS] [THREADS] [DEVICE]
    args = [*args, *["0", "1", "1"][len(args) - 4:], GPU]
    load = subprocess.Popen([GPULOAD, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    time.sleep(4)
    if load.poll() is not None:
        raise SystemExit(f"gpuload {' '.join(args)} ended: {load.stdout.read()}")
    return load


def stop_load(load):
    load.terminate()
    try:
        load.wait(timeout=10)
    except subprocess.TimeoutExpired:
        load.kill()
        load.wait()


def fmt(value, column):
    if value is None:
        return "-"
    return f"{value:.3f}s" if column == "window" else f"{100 * value:.2f}%"


def median(runs, column):
    got = [r[column] for r in runs if column in r]
    return statistics.median(got) if got else None


def main():
    for path in (EXPORTER, GPULOAD):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"{path} is not an executable (see the docstring)")
    values, reason, _, stderr = snapshot()
    if reason or "sm_active" not in values:
        print(f"GPM unavailable on GPU {GPU}: reason={reason}; stderr: {stderr}")
        return 1
    failures = []

    print(f"1. loads on GPU {GPU}, --gpm-window 1s, medians of 3 snapshots after a 4 s warm-up"
          " and one snapshot that consumes the samples from before the load")
    print(f"{'load':<20}" + "".join(f"{c:>13}" for c, _, _ in COLUMNS) + "  checks")
    for name, args, checks in LOADS:
        load = start_load(args)
        # Utilization is the mean of NVML's samples since the previous run: a
        # first snapshot under the load consumes the samples from before it.
        snapshot()
        runs = [snapshot()[0] for _ in range(3)]
        stop_load(load)
        medians = {c: median(runs, c) for c, _, _ in COLUMNS}
        verdicts = []
        for column, op, bound in checks:
            value = medians[column]
            ok = value is not None and (value >= bound if op == ">=" else value < bound)
            verdicts.append(f"{column}{op}{bound:g}:{'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"{name}: {column} {fmt(value, column)} not {op} {bound:g}")
        print(f"{name:<20}" + "".join(f"{fmt(medians[c], c):>13}" for c, _, _ in COLUMNS)
              + "  " + " ".join(verdicts))

    print("\n2. window sweep on spin 1056 x 1024 (2 snapshots each)")
    print(f"{'--gpm-window':<14}{'sm_active':>12}{'occupancy':>12}{'measured':>12}{'wall':>9}")
    load = start_load(LOADS[1][1])
    for window in ["100ms", "200ms", "500ms", "1s", "2s"]:
        for _ in range(2):
            values, reason, wall, _ = snapshot(window)
            print(f"{window:<14}{fmt(values.get('sm_active'), ''):>12}"
                  f"{fmt(values.get('sm_occupancy'), ''):>12}"
                  f"{fmt(values.get('window'), 'window'):>12}{wall:>8.3f}s"
                  + (f"  unavailable: {reason}" if reason else ""))
    stop_load(load)

    print("\n3. idle GPU: run time with and without the window (medians of 3)")
    for window in ["1s", "0"]:
        walls = [snapshot(window)[2] for _ in range(3)]
        print(f"--gpm-window {window:<4} wall {statistics.median(walls):.3f}s")

    print()
    if failures:
        print("FAIL\n  " + "\n  ".join(failures))
        return 1
    print("PASS: every load reads as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
