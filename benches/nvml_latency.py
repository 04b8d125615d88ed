#!/usr/bin/env python3
"""What each NVML call of a snapshot costs on this host, from the exporter's own
per-call timings (RUST_LOG=trace: "GPU n: <call> took <duration>").

usage: benches/nvml_latency.py [--exporter PATH] [--runs N] [--gpu INDEX] [-- EXPORTER ARGS...]

Runs the exporter RUNS times (default 7) as fresh processes with --stdout, one
thread per GPU and then --sequential, and prints medians over the runs:
1. for GPU INDEX (default 0), threads mode: each NVML function's calls, the
   time of its first call, its total and share of the GPU's NVML time, and
   the time to load and initialise NVML: the numbers to compare with the
   [delays_us] of tests/scenarios/bench-*.toml;
2. per mode: wall time, and the NVML time summed over GPUs, in all and for the
   NVLink calls: when threads take as long in all as GPUs read in turn, NVML
   serialises those calls across GPUs.
Against the fake, to check this script:
  FAKE_NVML_SCENARIO=tests/scenarios/bench-8gpu.toml benches/nvml_latency.py \\
      -- --nvml-lib target/debug/libfake_nvml.so
"""
import argparse
import os
import re
import subprocess
import tempfile
import time
from statistics import median

LINE = re.compile(r"trace: (?:GPU (\d+): (\w+)|loading and initialising NVML) took ([\d.]+)(ns|µs|ms|s)\b")
UNIT = {"ns": 1e-3, "µs": 1.0, "ms": 1e3, "s": 1e6}


def run(args, state, *mode):
    env = dict(os.environ, RUST_LOG="trace")
    argv = [args.exporter, "--stdout", "--state-dir", state, *mode, *args.rest]
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = (time.perf_counter() - t0) * 1e3
    calls = []  # (gpu or None for nvmlInit, symbol, microseconds) in log order
    for m in LINE.finditer(done.stderr):
        gpu, symbol, value, unit = m.groups()
        calls.append((None if gpu is None else int(gpu), symbol or "nvmlInit_v2", float(value) * UNIT[unit]))
    if done.returncode != 0 or not calls:
        raise SystemExit(f"exporter exited {done.returncode} with {len(calls)} timings:\n{done.stderr[-2000:]}")
    return wall, calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", default="target/release/nvidia-textfile-exporter")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("rest", nargs="*", help="more exporter arguments, after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        modes = {m: [run(args, state, *flags) for _ in range(args.runs)]
                 for m, flags in (("threads", []), ("in turn", ["--sequential"]))}
    per_symbol = {}  # symbol -> [(calls, first, total)] per run
    for _, calls in modes["threads"]:
        mine = {}
        for gpu, symbol, us in calls:
            if gpu == args.gpu or gpu is None:
                calls_, first, total = mine.get(symbol, (0, us, 0.0))
                mine[symbol] = (calls_ + 1, first, total + us)
        for symbol, entry in mine.items():
            per_symbol.setdefault(symbol, []).append(entry)
    gpu_total = median(sum(us for gpu, _, us in calls if gpu == args.gpu) for _, calls in modes["threads"])
    gpus = len({gpu for gpu, _, _ in modes["threads"][0][1] if gpu is not None})
    print(f"{gpus} GPUs; medians over {args.runs} fresh processes of each mode")
    print(f"1. GPU {args.gpu}, one thread per GPU: {gpu_total / 1e3:.1f} ms of NVML calls "
          "(nvmlInit_v2: loading and initialising, host-wide)")
    print(f"  {'symbol':<46} {'calls':>5} {'first us':>9} {'all ms':>7} {'share':>6}")
    rows = {s: (max(e[0] for e in v), median(e[1] for e in v), median(e[2] for e in v))
            for s, v in per_symbol.items()}
    for symbol, (calls, first, total) in sorted(rows.items(), key=lambda kv: -kv[1][2]):
        share = "" if symbol == "nvmlInit_v2" else f"{total / gpu_total:6.1%}"
        print(f"  {symbol:<46} {calls:5d} {first:9.0f} {total / 1e3:7.2f} {share:>6}")
    print("2. wall ms, and NVML ms summed over GPUs (in all; NVLink calls)")
    for mode, runs in modes.items():
        nvml = median(sum(us for g, _, us in c if g is not None) for _, c in runs) / 1e3
        nvlink = median(sum(us for g, s, us in c if g is not None and "NvLink" in s) for _, c in runs) / 1e3
        print(f"  {mode:<8} wall {median(w for w, _ in runs):7.1f}  NVML {nvml:7.1f}  NVLink {nvlink:7.1f}")


if __name__ == "__main__":
    main()
