#!/usr/bin/env python3
"""Side-by-side cost of one exporter snapshot and the equivalent nvidia-smi query.

Run on a host with NVIDIA GPUs:  python3 tests/gpu/bench.py [path/to/exporter] [pairs]
Extra exporter flags (e.g. --sequential) can be given in EXPORTER_ARGS.
Alternates the two commands (a warm-up pair first, then PAIRS pairs, default 20),
measuring each child's wall time and peak RSS (wait4's ru_maxrss), and prints the
medians and their ratios. Both programs write to /dev/null.
"""
import os
import statistics
import subprocess
import sys
import time

EXPORTER = sys.argv[1] if len(sys.argv) > 1 else "target/release/nvidia-textfile-exporter"
PAIRS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
SMI_FIELDS = (
    "index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "memory.free,power.draw,power.limit,temperature.gpu,temperature.memory,fan.speed,clocks.sm,"
    "clocks.mem,clocks.gr,pstate,clocks_event_reasons.active,pcie.link.gen.current,"
    "pcie.link.width.current,ecc.errors.corrected.volatile.total,"
    "ecc.errors.uncorrected.volatile.total,persistence_mode,mig.mode.current"
)
COMMANDS = {
    "exporter": [EXPORTER, "--stdout", *os.environ.get("EXPORTER_ARGS", "").split()],
    "nvidia-smi": ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
}


def measure(argv):
    devnull = os.open(os.devnull, os.O_WRONLY)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=devnull, stderr=devnull)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[0]} failed with {status}")
    return wall, usage.ru_maxrss * 1024


def main():
    assert len(SMI_FIELDS.split(",")) == 25
    for argv in COMMANDS.values():
        measure(argv)  # warm-up
    results = {name: ([], []) for name in COMMANDS}
    for _ in range(PAIRS):
        for name, argv in COMMANDS.items():
            wall, rss = measure(argv)
            results[name][0].append(wall)
            results[name][1].append(rss)
    med = {n: (statistics.median(w), statistics.median(r)) for n, (w, r) in results.items()}
    for name, (wall, rss) in med.items():
        print(f"{name:<12} median wall {wall * 1000:8.1f} ms   median peak RSS {rss / 1e6:6.1f} MB   ({PAIRS} runs)")
    print(f"ratio exporter/nvidia-smi: wall {med['exporter'][0] / med['nvidia-smi'][0]:.2f}x, "
          f"peak RSS {med['exporter'][1] / med['nvidia-smi'][1]:.2f}x")


if __name__ == "__main__":
    main()
