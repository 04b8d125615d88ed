#!/usr/bin/env python3
"""Cost of one snapshot against the fake NVML with a real H200's call latencies.

usage: benches/snapshot.py [--runs N] [--exporter PATH] [--fake PATH] [--no-count]
       benches/snapshot.py --real [LIB] [--runs N] [--exporter PATH]

Six configurations (1 and 8 GPUs of tests/scenarios/bench-*.toml, one thread per
GPU and --sequential, and both without latencies) run alternately after a
warm-up; per configuration the median wall time, peak RSS (through
benches/launcher.c, so that Python's own RSS does not floor it) and collector
duration, then the ratios of one interleaved run. Unless --no-count, the NVML
calls of one snapshot are counted per symbol and GPU thread (benches/count_shim.c).
--real times a GPU host's NVML instead. benches/README.md has the details.
"""
import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = {
    "1gpu": os.path.join(ROOT, "tests/scenarios/bench-1gpu.toml"),
    "8gpu": os.path.join(ROOT, "tests/scenarios/bench-8gpu.toml"),
}
# (name, scenario, extra arguments); "-fast": the scenario under FAKE_NVML_FAULTS=off.
CONFIGS = [
    ("1 GPU, parallel", "1gpu", []),
    ("1 GPU, sequential", "1gpu", ["--sequential"]),
    ("8 GPUs, parallel", "8gpu", []),
    ("8 GPUs, sequential", "8gpu", ["--sequential"]),
    ("1 GPU, no latency", "1gpu-fast", []),
    ("8 GPUs, no latency", "8gpu-fast", []),
]
REAL_CONFIGS = [
    ("all GPUs, parallel", None, []),
    ("all GPUs, sequential", None, ["--sequential"]),
]
FAKE_RATIOS = [
    ("8 GPUs, parallel", "1 GPU, parallel", "target <= 1.25"),
    ("8 GPUs, sequential", "8 GPUs, parallel", "what one thread per GPU saves"),
    ("1 GPU, sequential", "1 GPU, parallel", "cost of the thread with 1 GPU"),
    ("8 GPUs, no latency", "1 GPU, no latency", "CPU-side work, 8 GPUs against 1"),
]
REAL_RATIOS = [
    ("all GPUs, sequential", "all GPUs, parallel", "what one thread per GPU saves"),
]
DURATION = "nvidia_gpu_collector_duration_seconds "

BENCHES = os.path.dirname(os.path.abspath(__file__))

SHIM_STUB = """
    .globl {name}
    .type {name}, @function
{name}:
    push %rdi
    push %rsi
    push %rdx
    push %rcx
    push %r8
    push %r9
    sub $8, %rsp
    mov ${index}, %edi
    call shim_count
    add $8, %rsp
    pop %r9
    pop %r8
    pop %rcx
    pop %rdx
    pop %rsi
    pop %rdi
    jmp *shim_real+{offset}(%rip)
    .size {name}, .-{name}
"""


def scratch_dir():
    """A private directory, on tmpfs where there is one."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="nvidia-exporter-bench.", dir=base)


def build_launcher(work):
    cc = shutil.which("cc")
    if not cc:
        return None
    binary = os.path.join(work, "launcher")
    subprocess.run([cc, "-O2", "-o", binary, os.path.join(BENCHES, "launcher.c")], check=True)
    return binary


def build_shim(fake, work):
    """The counting library, or (None, why not)."""
    if platform.machine() != "x86_64":
        return None, f"call counting needs x86-64 (this is {platform.machine()})"
    cc, nm = shutil.which("cc"), shutil.which("nm")
    if not cc or not nm:
        return None, "call counting needs cc and nm"
    listing = subprocess.run([nm, "-D", "--defined-only", fake], check=True,
                             capture_output=True, text=True).stdout
    symbols = sorted({parts[2] for parts in map(str.split, listing.splitlines())
                      if len(parts) == 3 and parts[1] == "T" and parts[2].startswith("nvml")})
    s_path = os.path.join(work, "count_shim.S")
    so_path = os.path.join(work, "libnvml_count_shim.so")
    with open(s_path, "w", encoding="utf-8") as s:
        s.write("    .text\n")
        for index, name in enumerate(symbols):
            s.write(SHIM_STUB.format(name=name, index=index, offset=8 * index))
        s.write('    .section .note.GNU-stack,"",@progbits\n')
    names = "-DNAMES=" + ", ".join(f'"{s}"' for s in symbols)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", names, "-o", so_path,
                    os.path.join(BENCHES, "count_shim.c"), s_path, "-ldl",
                    "-lpthread"], check=True)
    return so_path, None


class Runner:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.out_path = os.path.join(work, "out.prom")
        self.launcher = build_launcher(work)
        self.lib = args.real or args.fake
        self.scenarios = dict(SCENARIOS)

    def env(self, scenario, **more):
        env = dict(os.environ, **more)
        env.pop("RUST_LOG", None)
        env.pop("FAKE_NVML_SCENARIO", None)
        if scenario:
            # "-fast": the same scenario with its latencies dropped by the fake.
            env["FAKE_NVML_SCENARIO"] = self.scenarios[scenario.removesuffix("-fast")]
            env["FAKE_NVML_FAULTS"] = "off" if scenario.endswith("-fast") else "on"
        return env

    def run(self, scenario, extra, lib=None, **env):
        """One snapshot; returns (wall seconds, peak RSS bytes, collector duration)."""
        argv = [self.args.exporter, "--nvml-lib", lib or self.lib, "--stdout", *extra]
        with open(self.out_path, "wb") as out:
            if self.launcher:
                done = subprocess.run([self.launcher, *argv], env=self.env(scenario, **env),
                                      stdout=out, stderr=subprocess.PIPE, check=True)
                wall_ns, rss_kib, status = map(int, done.stderr.split())
                wall = wall_ns / 1e9
            else:
                with open(os.devnull, "wb") as err:
                    start = time.perf_counter()
                    proc = subprocess.Popen(argv, env=self.env(scenario, **env), stdout=out,
                                            stderr=err)
                    _, status, usage = os.wait4(proc.pid, 0)
                    wall = time.perf_counter() - start
                rss_kib = usage.ru_maxrss
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"{' '.join(argv)} ({scenario}) exited with {code}")
        duration = None
        with open(self.out_path, encoding="utf-8") as text:
            for line in text:
                if line.startswith(DURATION):
                    duration = float(line[len(DURATION):])
        return wall, rss_kib * 1024, duration


def timing(runner, runs, configs, ratios):
    for _, scenario, extra in configs:  # warm-up: page cache, dynamic loader
        runner.run(scenario, extra)
    results = {name: [] for name, _, _ in configs}
    for round_ in range(runs):
        shift = round_ % len(configs)
        for name, scenario, extra in configs[shift:] + configs[:shift]:
            results[name].append(runner.run(scenario, extra))
    if not runner.launcher:
        print("warning: no cc, so peak RSS is this script's wait4 and floored at its own RSS")
    print(f"Snapshot cost, {runs} interleaved runs per configuration (medians; "
          "wall range in brackets)")
    print(f"  {'configuration':<20} {'wall ms':>8} {'[min - max]':>17} {'collector ms':>13} "
          f"{'peak RSS MB':>12}")
    medians = {}
    for name, rows in results.items():
        walls = [w for w, _, _ in rows]
        medians[name] = (statistics.median(walls),
                         statistics.median(r for _, r, _ in rows),
                         statistics.median(d for _, _, d in rows))
        wall, rss, collector = medians[name]
        print(f"  {name:<20} {wall * 1e3:8.1f} [{min(walls) * 1e3:6.1f} - {max(walls) * 1e3:6.1f}] "
              f"{collector * 1e3:13.1f} {rss / 1e6:12.1f}")

    def ratio(a, b, what):
        return medians[a][what] / medians[b][what]

    print("Ratios of medians (wall; collector duration in brackets):")
    for a, b, note in ratios:
        print(f"  {a} / {b}: {ratio(a, b, 0):.2f} ({ratio(a, b, 2):.2f})   {note}")
    if ratios is FAKE_RATIOS:
        print(f"  peak RSS, 8 GPUs / 1 GPU, parallel: "
              f"{ratio('8 GPUs, parallel', '1 GPU, parallel', 1):.2f}; "
              f"8 GPUs parallel / sequential: "
              f"{ratio('8 GPUs, parallel', '8 GPUs, sequential', 1):.2f}")


def delay_us(config, symbol):
    if symbol in ("nvmlInit_v2", "nvmlInitWithFlags"):
        return config.get("system", {}).get("init_delay_ms", 0) * 1000
    return config.get("delays_us", {}).get(symbol, 0)


def count(runner, shim, scenario, extra):
    """NVML calls of one snapshot: {thread: {symbol: calls}}, thread -1 = host."""
    counts_path = os.path.join(runner.work, "counts.txt")
    runner.run(scenario, extra, lib=shim, NVML_COUNT_TARGET=os.path.abspath(runner.args.fake),
               NVML_COUNT_OUT=counts_path)
    per_thread = {}
    with open(counts_path, encoding="utf-8") as f:
        for line in f:
            thread, symbol, calls = line.split()
            per_thread.setdefault(int(thread), {})[symbol] = int(calls)
    os.unlink(counts_path)
    return per_thread


def merged(per_thread):
    calls = {}
    for symbols in per_thread.values():
        for symbol, n in symbols.items():
            calls[symbol] = calls.get(symbol, 0) + n
    return calls


def count_calls(runner):
    shim, why = build_shim(runner.args.fake, runner.work)
    if shim is None:
        print(f"NVML calls: not counted ({why})")
        return
    for scenario in SCENARIOS:
        with open(SCENARIOS[scenario], "rb") as f:
            config = tomllib.load(f)
        per_thread = count(runner, shim, scenario, [])
        host = per_thread.pop(-1, {})
        gpu_calls = {gpu: sum(calls.values()) for gpu, calls in per_thread.items()}
        gpu_us = {gpu: sum(n * delay_us(config, s) for s, n in calls.items())
                  for gpu, calls in per_thread.items()}
        host_us = sum(n * delay_us(config, s) for s, n in host.items())
        total = sum(host.values()) + sum(gpu_calls.values())
        print(f"NVML calls of one snapshot, {scenario}, default collectors: {total} in all, "
              f"{sum(host.values())} on the host thread, "
              f"{min(gpu_calls.values())}-{max(gpu_calls.values())} per GPU thread")
        print(f"  their latency: host {host_us / 1e3:.1f} ms, per GPU "
              f"{min(gpu_us.values()) / 1e3:.1f}-{max(gpu_us.values()) / 1e3:.1f} ms; so at "
              f"least {(host_us + max(gpu_us.values())) / 1e3:.1f} ms parallel, "
              f"{(host_us + sum(gpu_us.values())) / 1e3:.1f} ms sequential")
        if scenario != "1gpu":
            continue
        calls = merged({-1: host, **per_thread})
        with_processes = merged(count(runner, shim, scenario, ["--collector", "processes"]))
        rows = sorted(calls.items(), key=lambda kv: (-kv[1] * delay_us(config, kv[0]), kv[0]))
        print("  per symbol, 1 GPU, by latency (+processes: the calls with --collector "
              "processes, where they differ):")
        print(f"  {'symbol':<46} {'calls':>5} {'each us':>8} {'total ms':>9} {'+processes':>10}")
        for symbol, n in rows:
            each = delay_us(config, symbol)
            more = with_processes.get(symbol, 0)
            shown = str(more) if more != n else ""
            print(f"  {symbol:<46} {n:5d} {each:8d} {n * each / 1e3:9.2f} {shown:>10}")
        for symbol in sorted(set(with_processes) - set(calls)):
            print(f"  {symbol:<46} {0:5d} {delay_us(config, symbol):8d} {0:9.2f} "
                  f"{with_processes[symbol]:>10}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21,
                        help="rounds after the warm-up (default 21)")
    parser.add_argument("--exporter",
                        default=os.path.join(ROOT, "target/release/nvidia-textfile-exporter"))
    parser.add_argument("--fake", default=os.path.join(ROOT, "target/debug/libfake_nvml.so"))
    parser.add_argument("--no-count", action="store_true", help="skip counting NVML calls")
    parser.add_argument("--real", nargs="?", const="libnvidia-ml.so.1", metavar="LIB",
                        help="time this host's GPUs through the real NVML instead")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    needed = [args.exporter] if args.real else [args.exporter, args.fake, *SCENARIOS.values()]
    for path in needed:
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing (make build)")
    work = scratch_dir()
    try:
        runner = Runner(args, work)
        print(f"NVML library: {runner.lib}")
        if args.real:
            timing(runner, args.runs, REAL_CONFIGS, REAL_RATIOS)
            return
        timing(runner, args.runs, CONFIGS, FAKE_RATIOS)
        if not args.no_count:
            count_calls(runner)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
