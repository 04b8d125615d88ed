#!/usr/bin/env python3
"""Wall and CPU time of exporter runs beside nvidia-smi's 25-field query, in
one interleaved run, with medians and ratios.

    python3 tests/gpu/cost.py ROUNDS NAME=EXPORTER [NAME=EXPORTER ...]

Each round runs every exporter once (`--stdout --write-state --gpm-window 0`,
each with its own state directory and an empty journal directory, as the timer's
runs follow one another) and the nvidia-smi query once, in turn; a warm-up round
first. Wall time is measured around each child, CPU time (user + system) from
its rusage, peak RSS from ru_maxrss. Prints each command's medians and its
ratios to nvidia-smi's.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

SMI_FIELDS = (
    "index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "memory.free,power.draw,power.limit,temperature.gpu,temperature.memory,fan.speed,clocks.sm,"
    "clocks.mem,clocks.gr,pstate,clocks_event_reasons.active,pcie.link.gen.current,"
    "pcie.link.width.current,ecc.errors.corrected.volatile.total,"
    "ecc.errors.uncorrected.volatile.total,persistence_mode,mig.mode.current"
)


def measure(command):
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, status


def main():
    rounds = int(sys.argv[1])
    journal = tempfile.mkdtemp(prefix="cost-journal-")
    commands = {}
    for spec in sys.argv[2:]:
        name, path = spec.split("=", 1)
        state = tempfile.mkdtemp(prefix=f"cost-{name}-")
        commands[name] = [path, "--stdout", "--write-state", "--state-dir", state,
                          "--journal-dir", journal, "--gpm-window", "0"]
    commands["nvidia-smi"] = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
    results = {name: [] for name in commands}
    for round_ in range(rounds + 1):
        for name, command in commands.items():
            result = measure(command)
            if result[3] != 0:
                print(f"{name} exited with status {result[3]}")
            if round_ > 0:
                results[name].append(result)
    smi = results["nvidia-smi"]
    smi_wall = statistics.median(r[0] for r in smi)
    smi_cpu = statistics.median(r[1] for r in smi)
    smi_rss = statistics.median(r[2] for r in smi)
    print(f"{'command':<12} {'wall ms':>8} {'cpu ms':>8} {'rss MiB':>8} {'wall x':>7} {'cpu x':>7} {'rss x':>7}")
    for name, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        rss = statistics.median(r[2] for r in runs)
        print(f"{name:<12} {wall * 1e3:8.1f} {cpu * 1e3:8.1f} {rss / 1024:8.1f} "
              f"{wall / smi_wall:7.2f} {cpu / smi_cpu:7.2f} {rss / smi_rss:7.2f}")


if __name__ == "__main__":
    main()
