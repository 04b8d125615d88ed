#!/usr/bin/env python3
"""GPM over most of the timer's period, against a known load (issue: GPM is not
a one-second sample of each 15 s period).

Run on a host with a Hopper (or newer) GPU, from the repository root, as root:

    python3 tests/gpu/period.py [EXPORTER] [GPULOAD]

EXPORTER defaults to target/release/nvidia-textfile-exporter, GPULOAD to
target/gpu/gpuload (gcc -O2 -o target/gpu/gpuload gpuload.c -ldl). GPU=N picks
the GPU (default 0). About two minutes.

Every SM is busy 5 s and idle 5 s (`gpuload spin 5000 5000 110 0 264 1024`:
264 x 1024 threads are one wave on the H200's 132 SMs). Six runs start 15 s
apart with the package's settings (--timeout 14s --gpm-window auto, as the
unit's ExecStart) and their own state directory. For each run it prints the
window-exact utilization, GPM SM activity, the GPM window and its share of the
15 s period, when the point readings were taken before the windows closed
(the exporter's debug log) and against the file's timestamp, wall and CPU
time. Checks: SM activity within 0.2 of utilization on every run, point
readings within 100 ms of the timestamp. Exit status 0 when all pass.
"""
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

EXPORTER = sys.argv[1] if len(sys.argv) > 1 else "target/release/nvidia-textfile-exporter"
GPULOAD = sys.argv[2] if len(sys.argv) > 2 else "target/gpu/gpuload"
GPU = os.environ.get("GPU", "0")
PERIOD = 15.0
STATE = tempfile.mkdtemp(prefix="period-state-")
JOURNAL = tempfile.mkdtemp(prefix="period-journal-")
READINGS = re.compile(r"GPU (\d+): point readings taken from (\d+) ms to (\d+) ms before the windows closed")


def value(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") and f'gpu="{GPU}"' in line:
            return float(line.rsplit(" ", 1)[1])
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def run():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    out = subprocess.run(
        [EXPORTER, "--stdout", "--write-state", "--state-dir", STATE,
         "--journal-dir", JOURNAL, "--timeout", "14s", "--gpm-window", "auto"],
        capture_output=True, text=True, env={**os.environ, "RUST_LOG": "debug"})
    finished = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, finished - started, cpu, finished


def main():
    load = subprocess.Popen([GPULOAD, "spin", "5000", "5000", "110", "0", "264", "1024", GPU])
    failures = 0
    try:
        # A first run consumes the sample buffer from before the load.
        time.sleep(2)
        run()
        start = time.time()
        print("run  utilization  sm_active  diff   window_s  share  reads_ms_before_close  ts_minus_close_ms  wall_s  cpu_s")
        for n in range(1, 7):
            time.sleep(max(0.0, start + n * PERIOD - time.time()))
            out, wall, cpu, finished = run()
            text = out.stdout
            util = value(text, "nvidia_gpu_utilization_ratio")
            sm = value(text, "nvidia_gpu_sm_active_ratio")
            window = value(text, "nvidia_gpu_gpm_window_seconds")
            stamp = value(text, "nvidia_gpu_collector_timestamp_seconds")
            reads = [m for m in READINGS.finditer(out.stderr) if m.group(1) == GPU]
            first, last = (int(reads[0].group(2)), int(reads[0].group(3))) if reads else (None, None)
            if util is None or sm is None or window is None:
                print(f"run {n}: missing values\n{out.stderr}")
                failures += 1
                continue
            diff = sm - util
            # The timestamp is taken when reading ends, right after the windows
            # close; it must be within 100 ms of the readings' start.
            close_to_stamp = (stamp - (finished - 0)) * 1000
            print(f"{n:>3}  {util:11.3f}  {sm:9.3f}  {diff:+.3f}  {window:8.3f}  {window / PERIOD:5.2f}  "
                  f"{first!s:>10} .. {last!s:<8}  {close_to_stamp:17.0f}  {wall:6.2f}  {cpu:5.3f}")
            if abs(diff) > 0.2:
                print(f"  FAIL: SM activity {sm:.3f} is not within 0.2 of utilization {util:.3f}")
                failures += 1
            if first is None or first > 100:
                print(f"  FAIL: point readings {first} ms before the windows closed")
                failures += 1
    finally:
        load.kill()
        load.wait()
    print("PASS" if failures == 0 else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
