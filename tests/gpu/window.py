#!/usr/bin/env python3
"""Window-complete utilization on a real GPU: no 15-second aliasing.

Run on a host with an NVIDIA GPU (builds nothing):

    python3 tests/gpu/window.py EXPORTER GPULOAD [--gpu N] [--period S]

EXPORTER is the release binary, GPULOAD the binary built from gpuload.c
(`gcc -O2 -o gpuload gpuload.c -ldl`). Three phases share one state directory,
so the counters run on across them:

  duty   `gpuload spin 1000 1000 200` (busy 1 s, idle 1 s): 10 runs PERIOD apart
  busy   `gpuload spin 1000 0 60`   (always busy):        4 runs
  idle   nothing running:                                4 runs

Each run is `EXPORTER --stdout --write-state --state-dir DIR`. Per run it prints
nvidia_gpu_utilization_ratio (the mean of NVML's samples since the previous
run), the window's rate(busy)/rate(sampled) from this run's and the previous
run's counters, and how much of the window the samples covered. Expected: duty
0.45-0.55 in every run after the first of the phase (and both columns agree),
busy >= 0.95, idle <= 0.05; sampled/wall about 0.95 with a 15 s period on an
H200 (its buffer holds 14.2 s), 1.0 with a period below the buffer's length.
Exits 1 if a window is outside its range. Takes about 4 minutes.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from exposition import parse_all  # noqa: E402

PHASES = [
    # name, gpuload arguments (None: idle), runs, expected window range
    ("duty", ["spin", "1000", "1000", "200"], 10, (0.45, 0.55)),
    ("busy", ["spin", "1000", "0", "60"], 4, (0.95, 1.0)),
    ("idle", None, 4, (0.0, 0.05)),
]


def snapshot(exporter, state, gpu):
    """The GPU's utilization ratio, busy and sampled seconds (engine gpu)."""
    run = subprocess.run(
        [exporter, "--stdout", "--write-state", "--state-dir", state],
        capture_output=True, text=True, check=True)
    parsed, _ = parse_all(run.stdout)
    found = {}
    for series, value in parsed.items():
        labels = dict(series.labels)
        if labels.get("gpu") != str(gpu):
            continue
        if series.name == "nvidia_gpu_utilization_ratio":
            found["ratio"] = value
        elif labels.get("engine") == "gpu" and series.name in (
                "nvidia_gpu_busy_seconds_total", "nvidia_gpu_sampled_seconds_total"):
            found[series.name.split("_")[2]] = value
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exporter")
    parser.add_argument("gpuload")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--period", type=float, default=15.0)
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="window-state.")
    print(f"{'phase':<5} {'run':>3} {'wall s':>7} {'ratio':>6} {'busy/sampled':>12} "
          f"{'sampled/wall':>12}  verdict")
    failures = 0
    previous = None
    for name, load, runs, (low, high) in PHASES:
        worker = None
        if load:
            worker = subprocess.Popen([args.gpuload, *load, "0", "1", "1", str(args.gpu)],
                                      stdout=subprocess.DEVNULL)
            time.sleep(2)  # context creation, first kernels
        try:
            for run in range(runs):
                if run:
                    time.sleep(max(0.0, started + args.period - time.monotonic()))
                started = time.monotonic()
                now = snapshot(args.exporter, state, args.gpu)
                ratio = now.get("ratio")
                window = coverage = None
                verdict = "first of phase" if run == 0 else ""
                if previous and "sampled" in now and "sampled" in previous[1]:
                    wall = started - previous[0]
                    d_busy = now["busy"] - previous[1]["busy"]
                    d_sampled = now["sampled"] - previous[1]["sampled"]
                    coverage = d_sampled / wall
                    if d_sampled > 0:
                        window = d_busy / d_sampled
                    if run:
                        fine = window is not None and low <= window <= high
                        verdict = "ok" if fine else f"OUTSIDE {low}-{high}"
                        failures += not fine
                else:
                    wall = 0.0
                show = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
                print(f"{name:<5} {run:>3} {wall:>7.1f} {show(ratio):>6} {show(window):>12} "
                      f"{show(coverage):>12}  {verdict}", flush=True)
                previous = (started, now)
        finally:
            if worker:
                worker.terminate()
                worker.wait()
    print(f"{failures} window(s) outside the expected range; state in {state}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
