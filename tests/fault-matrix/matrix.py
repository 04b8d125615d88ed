#!/usr/bin/env python3
"""Fault matrix: runs the real exporter under every fault that the fake NVML and
the file system can produce and checks what a reader of the textfile sees.

For every row:
- the file a reader finds is always complete (never a partial write) and passes
  `promtool check metrics` with empty output;
- a failure leaves no device series behind: when NVML is unusable the file holds
  only nvidia_gpu_collector_* series, a GPU that is down has only nvidia_gpu_up 0
  and nvidia_gpu_down_reason;
- every failure is named, in nvidia_gpu_collector_error{reason},
  nvidia_gpu_down_reason{reason} or, when nothing can be written, in one line on
  stderr, with the documented exit status;
- no temporary file is left in the output directory.

Usage: run.sh [--seed N] [--only SUBSTRING] [--keep]. Needs root for the mount
and node_exporter rows (they are reported SKIP otherwise), python3 >= 3.11,
promtool, flock, and prometheus-node-exporter for the end-to-end row.
Standard library only.
"""

import argparse
import ctypes
import errno
import fcntl
import multiprocessing
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import generated  # noqa: E402
from exposition import ParseError, Series, load, parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("FAULT_MATRIX_BIN", ROOT / "target/release/nvidia-textfile-exporter"))
LIB = Path(os.environ.get("FAULT_MATRIX_NVML", ROOT / "target/debug/libfake_nvml.so"))
SCENARIOS = ROOT / "tests" / "scenarios"
OUT_FILE = "nvidia_gpu.prom"
LOCK_FILE = f".{OUT_FILE}.lock"
TEMP_RE = re.compile(r"^\." + re.escape(OUT_FILE) + r"\.(\d+)\.[^.]+\.tmp$")

# Exit statuses, from `--generate exit-codes` in main().
EXIT_OK = EXIT_NVML = EXIT_DOWN = EXIT_TIMEOUT = EXIT_BUSY = EXIT_WRITE = None

# Values that differ from run to run; compared by presence only.
# Whether a run had the previous run's state depends on the row's history.
VOLATILE = {"nvidia_gpu_collector_duration_seconds", "nvidia_gpu_collector_timestamp_seconds",
            "nvidia_gpu_collector_state_ok"}


class Failed(Exception):
    """A row's expectation did not hold; `outcome` is what was seen, if known."""

    def __init__(self, message, outcome=None):
        super().__init__(message)
        self.outcome = outcome


class Skipped(Exception):
    """A row cannot run here (not root, tool missing)."""


def expect(condition, message):
    if not condition:
        raise Failed(message)


# ---------------------------------------------------------------------------
# Cleanup of everything this run creates: processes, mounts, directories.


class Janitor:
    def __init__(self):
        self.procs = []  # (Popen, whole process group?)
        self.mounts = []
        self.dirs = []

    def track(self, proc, group=False):
        self.procs.append((proc, group))
        return proc

    def mount_tmpfs(self, path, size):
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                       check=True, capture_output=True)
        self.mounts.append(path)

    def umount(self, path):
        if path in self.mounts:
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
            self.mounts.remove(path)

    def cleanup(self):
        for proc, group in reversed(self.procs):
            if proc.poll() is None:
                try:
                    if group:
                        os.killpg(proc.pid, signal.SIGKILL)
                    else:
                        proc.kill()
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self.procs.clear()
        for path in reversed(list(self.mounts)):
            self.umount(path)
        for path in reversed(self.dirs):
            shutil.rmtree(path, ignore_errors=True)
        self.dirs.clear()


JANITOR = Janitor()
WORK = None  # the run's scratch directory, set in main()


def scratch(name):
    """A fresh directory under the run's scratch directory."""
    path = WORK / name
    path.mkdir(parents=True)
    return path


# ---------------------------------------------------------------------------
# What a file says.


def promtool(path):
    """promtool check metrics's complaints about the file ('' when silent)."""
    with open(path, "rb") as f:
        r = subprocess.run(["promtool", "check", "metrics"], stdin=f, capture_output=True, timeout=60)
    out = (r.stdout + r.stderr).decode("utf-8", "replace").strip()
    if r.returncode != 0 and not out:
        out = f"promtool exit {r.returncode}"
    return out


def gpus(samples):
    """{gpu index: {series without gpu/uuid: value}} and the host-wide samples."""
    per_gpu, host = {}, {}
    for s, v in samples.items():
        gpu = s.label("gpu")
        if gpu is None:
            host[s] = v
        else:
            per_gpu.setdefault(gpu, {})[s.without("gpu", "uuid")] = v
    return per_gpu, host


def reasons(samples):
    """The failure reasons the file names, e.g. ['timeout'] or ['gpu 2: gpu_lost']."""
    out = []
    for s, v in sorted(samples.items(), key=lambda kv: (kv[0].name, kv[0].labels)):
        if s.name == "nvidia_gpu_collector_error" and v == 1:
            out.append(s.label("reason"))
        if s.name == "nvidia_gpu_down_reason" and v == 1:
            out.append(f"gpu{s.label('gpu')}:{s.label('reason')}")
    return out


def collector_up(samples):
    return samples.get(Series("nvidia_gpu_collector_up", ()))


def keys(samples):
    return frozenset(samples)


def temp_files(directory):
    return sorted(n for n in os.listdir(directory) if TEMP_RE.match(n))


def check_file(path, *, failure=None):
    """Parses the published file, runs promtool and, for a failed run, checks that
    only collector series with the one expected reason are left. Returns samples."""
    path = Path(path)
    expect(path.exists(), f"{path.name} does not exist")
    try:
        samples = load(path)
    except (ParseError, UnicodeDecodeError) as e:
        raise Failed(f"{path.name} is not a complete exposition file: {e}")
    complaints = promtool(path)
    expect(complaints == "", f"promtool check metrics: {complaints[:300]}")
    expect(collector_up(samples) is not None, "no nvidia_gpu_collector_up")
    if failure is not None:
        expect(collector_up(samples) == 0, "nvidia_gpu_collector_up is not 0")
        foreign = sorted({s.name for s in samples if not s.name.startswith("nvidia_gpu_collector_")
                          or s.label("gpu") is not None})
        expect(not foreign, f"series other than the collector's survived the failure: {foreign[:5]}")
        errors = [s for s in samples if s.name == "nvidia_gpu_collector_error"]
        expect(len(errors) == 1, f"{len(errors)} nvidia_gpu_collector_error series")
        expect(errors[0].label("reason") == failure and samples[errors[0]] == 1,
               f"reason={errors[0].label('reason')!r}, expected {failure!r}")
    else:
        expect(collector_up(samples) == 1, f"nvidia_gpu_collector_up is {collector_up(samples)}, "
               f"reason {reasons(samples)}")
    left = temp_files(path.parent)
    expect(not left, f"temporary files left: {left}")
    return samples


def compare(actual, expected, what):
    """Same series and, except run timings, the same values."""
    missing = sorted(set(expected) - set(actual), key=str)
    extra = sorted(set(actual) - set(expected), key=str)
    if missing:
        raise Failed(f"{what}: missing {len(missing)} series, e.g. {missing[0]}")
    if extra:
        raise Failed(f"{what}: {len(extra)} unexpected series, e.g. {extra[0]}")
    for s, v in expected.items():
        if s.name not in VOLATILE:
            expect(actual[s] == v, f"{what}: {s} is {actual[s]}, expected {v}")


# ---------------------------------------------------------------------------
# Scenarios, and the same scenario with its faults removed by the fake
# (FAKE_NVML_FAULTS=off): the baseline a faulty run is compared with.

def scenario(name):
    path = SCENARIOS / name
    with open(path, "rb") as f:
        return path, tomllib.load(f)


def baseline(name):
    """What the exporter prints for scenario `name` with all its faults removed."""
    run = exporter(SCENARIOS / name, stdout=True, faults_off=True)
    expect(run.rc == 0, f"baseline of {name} exited {run.rc}: {run.err.strip()[:200]}")
    return parse(run.out)


def text_of(value):
    """A scenario string as the exporter reports it: byte arrays decoded lossily."""
    if isinstance(value, list):
        return bytes(value).decode("utf-8", "replace")
    return value


# ---------------------------------------------------------------------------
# Running the exporter.


@dataclass
class Run:
    rc: int
    out: str
    err: str
    elapsed: float  # until the process had exited
    t_file: float = None  # until the output file was replaced, if it was


def exporter_env(scenario_path, faults_off=False):
    env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
    env["FAKE_NVML_SCENARIO"] = str(scenario_path)
    env["FAKE_NVML_FAULTS"] = "off" if faults_off else "on"
    return env


def exporter_argv(outdir=None, *extra, lib=None, timeout="10s", stdout=False):
    argv = [str(BIN), "--nvml-lib", str(lib or LIB), "--timeout", timeout]
    argv += ["--stdout"] if stdout else ["--output-dir", str(outdir)]
    # Each output directory has its own state directory beside it, so rows never
    # share what a run remembers; --stdout runs read an empty one.
    state = Path(tempfile.gettempdir()) / "fault-matrix-no-state" if stdout else Path(f"{outdir}.state")
    argv += ["--state-dir", str(state)]
    return argv + list(extra)


def start(scenario_path, outdir=None, *extra, lib=None, timeout="10s", stdout=False, tag="run",
          faults_off=False):
    """Starts the exporter with its output going to files; returns (Popen, out, err)."""
    logs = WORK / "logs"
    logs.mkdir(exist_ok=True)
    fd, base = tempfile.mkstemp(prefix=f"{tag}.", dir=logs)
    os.close(fd)
    out, err = open(base + ".out", "wb+"), open(base + ".err", "wb+")
    proc = subprocess.Popen(exporter_argv(outdir, *extra, lib=lib, timeout=timeout, stdout=stdout),
                            env=exporter_env(scenario_path, faults_off), stdin=subprocess.DEVNULL,
                            stdout=out, stderr=err)
    JANITOR.track(proc)
    return proc, out, err


def collect(proc, out, err):
    out.seek(0)
    err.seek(0)
    text = out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")
    out.close()
    err.close()
    return text


def file_id(path):
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        return None


def exporter(scenario_path, outdir=None, *extra, lib=None, timeout="10s", stdout=False, limit=30,
             faults_off=False):
    """Runs the exporter to the end, noting when the output file was replaced."""
    target = Path(outdir) / OUT_FILE if outdir else None
    before = file_id(target) if target else None
    t0 = time.monotonic()
    proc, out, err = start(scenario_path, outdir, *extra, lib=lib, timeout=timeout, stdout=stdout,
                           faults_off=faults_off)
    t_file = None
    while True:
        rc = proc.poll()
        now = time.monotonic() - t0
        if target is not None and t_file is None and file_id(target) != before:
            t_file = now
        if rc is not None:
            break
        if now > limit:
            proc.kill()
            proc.wait()
            raise Failed(f"the exporter was still running after {limit} s (killed)")
        time.sleep(0.002)
    elapsed = time.monotonic() - t0
    o, e = collect(proc, out, err)
    return Run(rc, o, e, elapsed, t_file)


def seeded(name, scenario_name="fault-read-error.toml"):
    """A fresh output directory holding a complete file from a successful run."""
    d = scratch(name)
    run = exporter(SCENARIOS / scenario_name, d)
    expect(run.rc == 0, f"seeding run exited {run.rc}: {run.err.strip()[:200]}")
    return d


def one_line_error(run, *needles):
    lines = run.err.strip().split("\n")
    expect(run.err.strip() and len(lines) == 1, f"stderr is not one line: {run.err.strip()[:300]!r}")
    expect(lines[0].startswith("nvidia-textfile-exporter: error: "), f"stderr: {lines[0]!r}")
    for needle in needles:
        expect(needle in lines[0], f"stderr does not say {needle!r}: {lines[0]!r}")
    return lines[0]


# ---------------------------------------------------------------------------
# A build of the fake that lacks some exports (FAKE_NVML_HIDE, see
# tests/fake-nvml/README.md), in its own target directory.


def library_without(symbols):
    if not shutil.which("cargo"):
        raise Skipped("cargo is needed to build the fake without some symbols")
    target = ROOT / "target" / "fake-nvml-hidden"
    subprocess.run(["cargo", "build", "--quiet", "--locked", "-p", "fake-nvml", "--target-dir", str(target)],
                   cwd=ROOT, env=dict(os.environ, FAKE_NVML_HIDE=",".join(symbols)), check=True)
    path = WORK / f"libfake_nvml-without-{len(symbols)}-{abs(hash(tuple(symbols))) % 10**8}.so"
    shutil.copy(target / "debug" / "libfake_nvml.so", path)
    lib = ctypes.CDLL(str(path))
    for name in symbols:
        expect(not hasattr(lib, name), f"{name} is still exported by {path.name}")
    expect(hasattr(lib, "nvmlShutdown"), f"{path.name} lacks nvmlShutdown")
    return path


# ---------------------------------------------------------------------------
# A reader that reads the file as fast as it can, in its own process, and checks
# that every read is one of the complete files it was told to expect.


def reader_main(path, kinds, stop, conn):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    reads, missing, bad, seen, first = 0, 0, [], {}, {}
    while not stop.is_set():
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            missing += 1
            continue
        reads += 1
        try:
            got = keys(parse(data.decode("utf-8")))
        except (ParseError, UnicodeDecodeError) as e:
            if len(bad) < 5:
                bad.append(f"read {reads}: {e}; {len(data)} bytes, ends {data[-60:]!r}")
            continue
        kind = next((k for k, ks in kinds.items() if ks == got), None)
        if kind is None:
            if len(bad) < 5:
                bad.append(f"read {reads}: a parseable file with {len(got)} series that is no "
                           f"complete render (e.g. {[str(s) for s in list(got)[:2]]})")
            continue
        seen[kind] = seen.get(kind, 0) + 1
        first.setdefault(kind, data)
    conn.send({"reads": reads, "missing": missing, "bad": bad, "seen": seen, "first": first})
    conn.close()


class Reader:
    def __init__(self, path, kinds):
        ctx = multiprocessing.get_context("fork")
        self.stop = ctx.Event()
        self.parent, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=reader_main, args=(str(path), kinds, self.stop, child),
                                daemon=True)
        self.proc.start()
        JANITOR.track(_ProcHandle(self.proc))

    def finish(self):
        self.stop.set()
        stats = self.parent.recv() if self.parent.poll(30) else None
        self.proc.join(10)
        expect(stats is not None, "the reader process did not report")
        return stats


class _ProcHandle:
    """Lets the janitor stop a multiprocessing.Process like a Popen."""

    def __init__(self, proc):
        self.proc, self.pid = proc, proc.pid

    def poll(self):
        return self.proc.exitcode

    def kill(self):
        self.proc.kill()

    def wait(self, timeout=None):
        self.proc.join(timeout)


def check_reader(stats, allow_missing=False):
    expect(stats["reads"] > 0, "the reader never read the file")
    if stats["bad"]:
        raise Failed(f"the reader saw {len(stats['bad'])}+ incomplete files: {stats['bad'][0]}")
    if not allow_missing:
        expect(stats["missing"] == 0, f"the file was missing {stats['missing']} times")
    for kind, data in stats["first"].items():
        path = WORK / f"reader-{kind}.prom"
        path.write_bytes(data)
        complaints = promtool(path)
        expect(complaints == "", f"promtool on a {kind} file the reader saw: {complaints[:200]}")


# ---------------------------------------------------------------------------
# inotify, to kill a run while its temporary file exists (between create and rename).

IN_CREATE = 0x100
libc = ctypes.CDLL(None, use_errno=True)


def kill_on_temp_create(directory, proc, sig, limit=20):
    """Sends `sig` to `proc` as soon as it creates its temporary file; True if it did."""
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise Skipped(f"inotify_init1: {os.strerror(ctypes.get_errno())}")
    try:
        if libc.inotify_add_watch(fd, str(directory).encode(), IN_CREATE) < 0:
            raise Skipped(f"inotify_add_watch: {os.strerror(ctypes.get_errno())}")
        deadline = time.monotonic() + limit
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if not ready:
                continue
            buf = os.read(fd, 65536)
            i = 0
            while i < len(buf):
                _, _, _, length = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + length].rstrip(b"\0").decode(errors="replace")
                i += 16 + length
                m = TEMP_RE.match(name)
                if m and int(m.group(1)) == proc.pid:
                    os.kill(proc.pid, sig)
                    return True
        return False
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# The rows.


@dataclass
class Row:
    fault: str
    outcome: str = ""
    t_error: str = "-"
    verdict: str = "FAIL"
    why: str = ""
    seconds: float = 0.0


ROWS = []


def row(fault):
    def register(fn):
        ROWS.append((fault, fn))
        return fn
    return register


def outcome(run, samples=None):
    text = f"exit {run.rc}"
    if samples is not None:
        named = reasons(samples)
        text += ", " + (", ".join(f"reason={r}" for r in named) if named else "no error")
    return text


def secs(t):
    return "-" if t is None else f"{t:.2f} s"


def need_root():
    if os.geteuid() != 0:
        raise Skipped("needs root (mounts, runuser)")


def nvml_unusable(scenario_name, reason, lib=None, nvml_lib=None):
    d = seeded("nvml-" + reason + "-" + scenario_name.replace(".toml", ""))
    run = exporter(SCENARIOS / scenario_name, d, lib=nvml_lib or lib)
    samples = check_file(d / OUT_FILE, failure=reason)
    expect(run.rc == EXIT_NVML, f"exit {run.rc}, expected {EXIT_NVML}")
    expect(f"cannot use NVML ({reason})" in run.err, f"stderr does not name {reason}: {run.err[:200]!r}")
    return outcome(run, samples), secs(run.t_file)


for _name, _reason in [("init-driver-not-loaded.toml", "driver_not_loaded"),
                       ("init-no-permission.toml", "no_permission"),
                       ("init-lib-rm-version-mismatch.toml", "driver_library_mismatch"),
                       ("init-unknown.toml", "unknown")]:
    row(f"nvmlInit: {_name[5:-5].replace('-', ' ')}")(
        lambda n=_name, r=_reason: nvml_unusable(n, r))


@row("nvmlDeviceGetCount fails (UNKNOWN)")
def device_count_error():
    return nvml_unusable("fault-device-count.toml", "unknown")


@row("NVML library missing (--nvml-lib nonexistent)")
def library_missing():
    return nvml_unusable("h100x8.toml", "library_not_found", nvml_lib=WORK / "no-such-dir" / "libnvidia-ml.so.1")


@row("symbol nvmlInit_v2 missing")
def missing_init_symbol():
    path, doc = scenario("fault-missing-init.toml")
    return nvml_unusable(path.name, "missing_symbol", lib=library_without(doc["missing_symbols"]))


@row("symbol nvmlDeviceGetHandleByIndex_v2 missing")
def missing_handle_symbol():
    # No GPU can be read without it: a collector error, not every GPU down.
    return nvml_unusable("h100x8.toml", "missing_symbol",
                         lib=library_without(["nvmlDeviceGetHandleByIndex_v2"]))


@row("optional symbols missing (energy, ClocksEventReasons)")
def missing_optional_symbols():
    path, doc = scenario("fault-missing-optional.toml")
    lib = library_without(doc["missing_symbols"])
    expected = baseline(path.name)
    d = scratch("missing-optional")
    run = exporter(path, d, lib=lib)
    samples = check_file(d / OUT_FILE)
    expect(run.rc == EXIT_OK, f"exit {run.rc}")
    expect(run.err == "", f"stderr not empty: {run.err[:200]!r}")
    energy = {s for s in expected if s.name == "nvidia_gpu_energy_joules_total"}
    expect(energy, "the baseline has no energy series to lose")
    expect(any(s.name == "nvidia_gpu_clocks_event_active" for s in samples),
           "clock event reasons are gone: no fallback to the ClocksThrottleReasons names")
    compare(samples, {s: v for s, v in expected.items() if s not in energy},
            "file vs. baseline without energy")
    return outcome(run, samples) + " (energy omitted, 0 read errors)", "-"


@row("UNKNOWN on one getter, INSUFFICIENT_SIZE on a name")
def read_error():
    path, doc = scenario("fault-read-error.toml")
    expected = dict(baseline(path.name))
    d = scratch("read-error")
    run = exporter(path, d)
    samples = check_file(d / OUT_FILE)
    expect(run.rc == EXIT_OK, f"exit {run.rc}")
    uuid1, uuid2 = doc["gpu"][1]["uuid"], doc["gpu"][2]["uuid"]
    power1 = Series("nvidia_gpu_power_watts", (("gpu", "1"), ("uuid", uuid1)))
    expect(power1 in expected, "baseline lacks the power of GPU 1")
    del expected[power1]
    info2 = next(s for s in expected if s.name == "nvidia_gpu_info" and s.label("gpu") == "2")
    # The info series keeps its label set; the unreadable name is empty.
    emptied = Series(info2.name, tuple((k, "" if k == "name" else v) for k, v in info2.labels))
    expected[emptied] = expected.pop(info2)
    for gpu, uuid in (("1", uuid1), ("2", uuid2)):
        expected[Series("nvidia_gpu_collector_read_errors", (("gpu", gpu), ("uuid", uuid)))] = 1
    compare(samples, expected, "file vs. baseline less the failed fields")
    for call in ("GPU 1: nvmlDeviceGetPowerUsage", "GPU 2: nvmlDeviceGetName"):
        expect(call in run.err, f"stderr does not name {call!r}")
    return outcome(run, samples) + " (fields omitted, read_errors 1)", "-"


def seeded_clean(name, scenario_name):
    """A fresh directory holding the file of the scenario without its faults: the
    state before the fault struck."""
    d = scratch(name)
    run = exporter(SCENARIOS / scenario_name, d, faults_off=True)
    expect(run.rc == 0, f"seeding run exited {run.rc}: {run.err.strip()[:200]}")
    return d


def uuid_of(samples, gpu):
    return next(s.label("uuid") for s in samples if s.name == "nvidia_gpu_up" and s.label("gpu") == str(gpu))


def one_gpu_down(scenario_name, down_gpu, reason, run_args=()):
    path, doc = scenario(scenario_name)
    before = baseline(scenario_name)
    expected_gpus, expected_host = gpus(before)
    d = seeded_clean("down-" + scenario_name.replace(".toml", ""), scenario_name)
    run = exporter(path, d, *run_args)
    samples = check_file(d / OUT_FILE)
    expect(run.rc == EXIT_DOWN, f"exit {run.rc}, expected {EXIT_DOWN}")
    actual_gpus, host = gpus(samples)
    compare(host, expected_host, "host-wide series")
    expect(set(actual_gpus) == set(expected_gpus), f"GPUs {sorted(actual_gpus)}")
    for gpu, series in expected_gpus.items():
        if gpu == str(down_gpu):
            want = {Series("nvidia_gpu_up", ()): 0,
                    Series("nvidia_gpu_down_reason", (("reason", reason),)): 1}
            compare(actual_gpus[gpu], want, f"GPU {gpu} (down)")
        else:
            compare(actual_gpus[gpu], series, f"GPU {gpu}")
    expect(f"GPU {down_gpu}" in run.err, f"stderr does not name GPU {down_gpu}: {run.err[:200]!r}")
    kept = uuid_of(samples, down_gpu)
    expect(kept == uuid_of(before, down_gpu),
           f"GPU {down_gpu} is down with uuid={kept!r}, not the UUID of the previous file")
    return (outcome(run, samples) + f", UUID kept; other GPUs complete: {len(expected_gpus) - 1}",
            secs(run.t_file))


@row("GPU_IS_LOST on one GPU (lost = true)")
def lost_gpu():
    return one_gpu_down("lost-gpu.toml", 2, "gpu_lost")


@row("GPU_IS_LOST in the middle of a GPU's reads")
def lost_midread():
    return one_gpu_down("fault-lost-midread.toml", 0, "gpu_lost")


@row("handle error on one GPU (NO_PERMISSION)")
def handle_error():
    return one_gpu_down("fault-handle-error.toml", 1, "no_permission")


@row("UNKNOWN on nvmlDeviceGetUUID of one GPU")
def uuid_error():
    path, doc = scenario("fault-uuid-error.toml")
    before = baseline(path.name)
    expected_gpus, _ = gpus(before)
    d = seeded_clean("uuid-error", path.name)
    run = exporter(path, d)
    samples = check_file(d / OUT_FILE)
    actual_gpus, _ = gpus(samples)
    gpu1 = actual_gpus.get("1", {})
    up = gpu1.get(Series("nvidia_gpu_up", ()))
    if up == 0:
        expect(run.rc == EXIT_DOWN, f"GPU 1 down but exit {run.rc}")
        expect(len(gpu1) == 2, f"GPU 1 is down but has {len(gpu1)} series")
    else:
        # Up: then its readings must be there, with the failed read counted.
        expect(run.rc == EXIT_OK, f"exit {run.rc}")
        want = dict(expected_gpus["1"])
        want[Series("nvidia_gpu_collector_read_errors", ())] = 1
        if len(gpu1) <= 2:
            raise Failed(f"GPU 1 is reported nvidia_gpu_up {up:g} with all {len(want) - 2} of its "
                         f"readings dropped (only {', '.join(sorted(s.name for s in gpu1))}), exit {run.rc}",
                         outcome=outcome(run, samples) + f"; GPU 1 up={up:g} with 0 of {len(want) - 2} readings")
        compare(gpu1, want, "GPU 1")
        expect(uuid_of(samples, 1) == uuid_of(before, 1),
               f"GPU 1 has uuid={uuid_of(samples, 1)!r}, not the UUID of the previous file")
    return outcome(run, samples), secs(run.t_file) if up == 0 else "-"


def hang(scenario_name, call, *extra):
    d = seeded("hang-" + scenario_name.replace(".toml", "") + "-".join(extra))
    timeout = 2.0
    run = exporter(SCENARIOS / scenario_name, d, *extra, timeout="2s", limit=timeout + 10)
    samples = check_file(d / OUT_FILE, failure="timeout")
    expect(run.rc == EXIT_TIMEOUT, f"exit {run.rc}, expected {EXIT_TIMEOUT}")
    expect(run.t_file is not None, "the file was not replaced")
    expect(run.t_file <= timeout + 1, f"file replaced after {run.t_file:.2f} s > timeout + 1 s")
    expect(run.elapsed <= timeout + 1, f"process exited after {run.elapsed:.2f} s > timeout + 1 s")
    expect(f"stuck in {call}" in run.err, f"stderr does not name {call}: {run.err.strip()[:300]!r}")
    return (outcome(run, samples) + f", exited at {run.elapsed:.2f} s",
            f"{run.t_file:.2f} s")


@row("nvmlInit hangs (--timeout 2s)")
def init_hang():
    return hang("fault-init-hang.toml", "nvmlInit_v2 (host)")


@row("device call hangs (--timeout 2s)")
def device_hang():
    return hang("fault-device-hang.toml", "nvmlDeviceGetPowerUsage (GPU 1)")


@row("device call hangs, --sequential (--timeout 2s)")
def device_hang_sequential():
    return hang("fault-device-hang.toml", "nvmlDeviceGetPowerUsage (GPU 1)", "--sequential")


@row("output directory missing")
def output_dir_missing():
    d = WORK / "absent-dir"
    run = exporter(SCENARIOS / "geforce.toml", d)
    expect(run.rc == EXIT_WRITE, f"exit {run.rc}, expected {EXIT_WRITE}")
    one_line_error(run, str(d), "does not exist")
    expect(not d.exists(), "the directory was created")
    return f"exit {run.rc}, stderr: output directory ... does not exist", "-"


@row("a directory in the output file's place")
def output_is_directory():
    d = seeded("target-is-dir", "geforce.toml")
    (d / OUT_FILE).unlink()
    (d / OUT_FILE).mkdir()
    (d / OUT_FILE / "keep").write_text("old")
    run = exporter(SCENARIOS / "geforce.toml", d)
    expect(run.rc == EXIT_WRITE, f"exit {run.rc}, expected {EXIT_WRITE}")
    line = one_line_error(run, "rename", str(d / OUT_FILE))
    expect((d / OUT_FILE / "keep").read_text() == "old", "the directory's content changed")
    expect(not temp_files(d), f"temporary files left: {temp_files(d)}")
    return f"exit {run.rc}, stderr: cannot rename ...: {short(line)}", "-"


def short(line):
    return line.removeprefix("nvidia-textfile-exporter: error: ").split(": ")[-1][:40]


def unwritable(name, size, prepare, needle):
    need_root()
    d = scratch(name)
    JANITOR.mount_tmpfs(d, size)
    try:
        run = exporter(SCENARIOS / "geforce.toml", d)
        expect(run.rc == 0, f"seeding run exited {run.rc}")
        old = (d / OUT_FILE).read_bytes()
        old_id = file_id(d / OUT_FILE)
        prepare(d)
        before = sorted(os.listdir(d))
        run = exporter(SCENARIOS / "geforce.toml", d)
        expect(run.rc == EXIT_WRITE, f"exit {run.rc}, expected {EXIT_WRITE}: {run.err.strip()[:200]}")
        line = one_line_error(run, needle)
        expect((d / OUT_FILE).read_bytes() == old and file_id(d / OUT_FILE) == old_id,
               "the old file was changed")
        expect(sorted(os.listdir(d)) == before, f"directory changed: {before} -> {sorted(os.listdir(d))}")
        expect(not temp_files(d), f"temporary files left: {temp_files(d)}")
        check_file(d / OUT_FILE)
        return f"exit {run.rc}, stderr: {short(line)}", "-"
    finally:
        JANITOR.umount(d)


@row("output directory read-only (tmpfs remounted ro)")
def read_only():
    def remount(d):
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True, capture_output=True)
    return unwritable("read-only", "1m", remount, "Read-only file system")


@row("disk full (64 KiB tmpfs filled)")
def disk_full():
    def fill(d):
        with open(d / "filler.bin", "wb", buffering=0) as f:
            for chunk in (65536, 4096, 1):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
        expect(shutil.disk_usage(d).free == 0, f"{shutil.disk_usage(d).free} bytes still free")
    return unwritable("disk-full", "64k", fill, "No space left on device")


def slow_kinds():
    return {"complete": keys(baseline("fault-slow.toml"))}


def kill_mid_publish(sig):
    """Kills a run between creating and renaming its temporary file; the next run
    must remove the temporary file and publish."""
    d = seeded("kill-publish-" + str(int(sig)), "fault-slow.toml")
    for attempt in range(1, 6):
        old = (d / OUT_FILE).read_bytes()
        proc, out, err = start(SCENARIOS / "fault-slow.toml", d)
        hit = kill_on_temp_create(d, proc, sig)
        proc.wait(30)
        collect(proc, out, err)
        left = temp_files(d)
        if hit and left and proc.returncode == -sig:
            break
    else:
        raise Failed("could not kill a run between creating and renaming its temporary file")
    expect((d / OUT_FILE).read_bytes() == old, "the file changed although the run was killed before rename")
    run = exporter(SCENARIOS / "fault-slow.toml", d)
    samples = check_file(d / OUT_FILE)
    expect(run.rc == 0, f"next run exit {run.rc}")
    compare(samples, baseline("fault-slow.toml"), "next run's file")
    return (f"killed (exit {-sig}) with {len(left)} temp left (try {attempt}); next run exit {run.rc}, "
            f"temp removed", "-")


@row("SIGKILL between temp-file create and rename")
def sigkill_publish():
    return kill_mid_publish(signal.SIGKILL)


@row("SIGTERM between temp-file create and rename")
def sigterm_publish():
    return kill_mid_publish(signal.SIGTERM)


@row("30 runs SIGKILLed/SIGTERMed at random moments, reader")
def random_kills():
    rng = random.Random(ARGS.seed)
    kinds = slow_kinds()
    d = scratch("random-kills")
    first = exporter(SCENARIOS / "fault-slow.toml", d)
    expect(first.rc == 0, f"first run exited {first.rc}")
    window = first.elapsed * 1.2  # kill moments cover the whole run, publish included
    reader = Reader(d / OUT_FILE, kinds)
    killed = {signal.SIGKILL: 0, signal.SIGTERM: 0}
    finished, temps_seen = 0, 0
    try:
        for _ in range(30):
            proc, out, err = start(SCENARIOS / "fault-slow.toml", d)
            time.sleep(rng.uniform(0, window))
            sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            if proc.poll() is None:
                proc.send_signal(sig)
            proc.wait(30)
            collect(proc, out, err)
            if proc.returncode == -sig:
                killed[sig] += 1
            else:
                expect(proc.returncode == 0, f"a run exited {proc.returncode}")
                finished += 1
            temps_seen += len(temp_files(d))
    finally:
        stats = reader.finish()
    check_reader(stats)
    # A temporary file of a dead writer, as a crash would leave it.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (d / f".{OUT_FILE}.{dead.pid}.zZ9xQ1.tmp").write_text("nvidia_gpu_collector_up 1\nnvidia_gpu_up{")
    run = exporter(SCENARIOS / "fault-slow.toml", d)
    samples = check_file(d / OUT_FILE)
    expect(run.rc == 0, f"final run exit {run.rc}")
    expect(keys(samples) == kinds["complete"], "final file is not a complete render")
    return (f"{killed[signal.SIGKILL]} KILL + {killed[signal.SIGTERM]} TERM mid-run, {finished} done; "
            f"{stats['reads']} reads ok; stale temps removed", "-")


@row("a lock held by another process (flock), --timeout 1s")
def lock_held():
    if not shutil.which("flock"):
        raise Skipped("flock (util-linux) is not installed")
    d = seeded("lock-held", "fault-slow.toml")
    holder = hold_lock(d / LOCK_FILE, 120)
    run = exporter(SCENARIOS / "fault-slow.toml", d, timeout="1s")
    samples = check_file(d / OUT_FILE, failure="busy")
    expect(run.rc == EXIT_BUSY, f"exit {run.rc}, expected {EXIT_BUSY}")
    # One deadline: the lock wait ends when reading would have to (0.8 x timeout),
    # so the busy file is in place before --timeout.
    expect(0.75 <= run.elapsed <= 1.05, f"gave up after {run.elapsed:.2f} s, expected 0.8-1 s")
    expect('reason="busy"' in run.err, f"stderr: {run.err.strip()[:200]!r}")
    global BUSY_KEYS
    BUSY_KEYS = keys(samples)
    # The holder dies without unlocking: the kernel drops the lock with it.
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    after = exporter(SCENARIOS / "fault-slow.toml", d, timeout="1s")
    samples_after = check_file(d / OUT_FILE)
    expect(after.rc == 0, f"run after the holder died: exit {after.rc}: {after.err.strip()[:200]}")
    expect(after.elapsed < 1.0, f"run after the holder died waited: {after.elapsed:.2f} s")
    compare(samples_after, baseline("fault-slow.toml"), "file after the holder died")
    return (outcome(run, samples) + f" after {run.elapsed:.2f} s; holder killed -9: next run exit "
            f"{after.rc} in {after.elapsed:.2f} s", secs(run.t_file))


BUSY_KEYS = None


def busy_keys():
    """The series of a complete busy file (from the lock row, or made here)."""
    global BUSY_KEYS
    if BUSY_KEYS is None:
        d = scratch("busy-file")
        holder = hold_lock(d / LOCK_FILE, 60)
        run = exporter(SCENARIOS / "fault-slow.toml", d, timeout="100ms")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        expect(run.rc == EXIT_BUSY, f"exit {run.rc}, expected {EXIT_BUSY}")
        BUSY_KEYS = keys(check_file(d / OUT_FILE, failure="busy"))
    return BUSY_KEYS


def hold_lock(lock, seconds):
    """Starts `flock --no-fork LOCK sleep SECONDS` and waits until it holds the lock."""
    holder = JANITOR.track(subprocess.Popen(["flock", "--no-fork", str(lock), "sleep", str(seconds)]))
    deadline = time.monotonic() + 10
    while True:
        expect(holder.poll() is None, "flock exited")
        with open(lock, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(probe, fcntl.LOCK_UN)
            except BlockingIOError:
                return holder
        expect(time.monotonic() < deadline, "flock did not take the lock")
        time.sleep(0.01)


@row("lock held 1.5 s, then a device call hangs (--timeout 2s)")
def lock_then_hang():
    if not shutil.which("flock"):
        raise Skipped("flock (util-linux) is not installed")
    d = seeded("lock-then-hang", "fault-slow.toml")
    holder = hold_lock(d / LOCK_FILE, 1.5)
    timeout = 2.0
    run = exporter(SCENARIOS / "fault-device-hang.toml", d, timeout="2s", limit=3 * timeout + 10)
    holder.wait(10)
    samples = check_file(d / OUT_FILE, failure="timeout")
    expect(run.rc == EXIT_TIMEOUT, f"exit {run.rc}, expected {EXIT_TIMEOUT}")
    # One deadline for the whole run: the error file is in place by --timeout
    # (0.1 s of slack for a loaded machine), the process gone right after.
    expect(run.t_file is not None and run.t_file <= timeout + 0.1,
           f"file replaced after {secs(run.t_file)}, bound --timeout")
    expect(run.elapsed <= timeout + 0.3, f"process exited after {run.elapsed:.2f} s > --timeout + 0.3 s")
    return (outcome(run, samples) + f", exited at {run.elapsed:.2f} s (bound --timeout)",
            secs(run.t_file))


@row("100 overlapping runs (20 at a time), reader")
def overlapping():
    kinds = slow_kinds()
    kinds["busy"] = busy_keys()
    d = seeded("overlap", "fault-slow.toml")
    reader = Reader(d / OUT_FILE, kinds)
    codes, running, started, problems = {}, [], 0, []
    t0 = time.monotonic()
    try:
        while started < 100 or running:
            while len(running) < 20 and started < 100:
                running.append(start(SCENARIOS / "fault-slow.toml", d, timeout="1s", tag="overlap"))
                started += 1
            for item in list(running):
                proc, out, err = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                _, e = collect(proc, out, err)
                codes[proc.returncode] = codes.get(proc.returncode, 0) + 1
                # A busy run either writes reason="busy" (the holder published
                # nothing while it waited) or leaves the holder's fresh file.
                if proc.returncode == EXIT_BUSY and not (
                    'reason="busy"' in e or "published meanwhile" in e
                ):
                    problems.append(f"busy run without a busy message: {e.strip()[:150]!r}")
                elif proc.returncode == EXIT_OK and e:
                    problems.append(f"successful run wrote to stderr: {e.strip()[:150]!r}")
            expect(time.monotonic() - t0 < 120, "overlapping runs took over 120 s")
            time.sleep(0.005)
    finally:
        stats = reader.finish()
    check_reader(stats)
    expect(set(codes) <= {EXIT_OK, EXIT_BUSY}, f"exit statuses {codes}")
    expect(codes.get(EXIT_OK, 0) >= 1, f"no run succeeded: {codes}")
    if problems:
        raise Failed(f"{len(problems)} runs misbehaved, e.g. {problems[0]}")
    samples = check_file(d / OUT_FILE, failure="busy" if keys(load(d / OUT_FILE)) == BUSY_KEYS else None)
    seen = ", ".join(f"{n} {k}" for k, n in sorted(stats["seen"].items()))
    return (f"{codes.get(EXIT_OK, 0)} exit {EXIT_OK}, {codes.get(EXIT_BUSY, 0)} exit {EXIT_BUSY} (busy); {stats['reads']} reads: {seen}",
            "-")


def hostile_expectations():
    path, doc = scenario("fault-hostile.toml")
    want = []
    for index, g in enumerate(doc["gpu"]):
        want.append({"gpu": str(index), "uuid": text_of(g["uuid"]), "name": text_of(g["name"]),
                     "serial": text_of(g["serial"]), "vbios_version": text_of(g["vbios_version"])})
    return path, doc, want


def check_hostile(samples, doc, want, where):
    forged = [str(s) for s in samples
              if s.label("uuid") == "forged" or s.label("gpu") == "9" or "forged" in s.name]
    expect(not forged, f"{where}: smuggled series: {forged[:3]}")
    names = {s.name for s in samples}
    expect("nvidia_gpu_up" in names, f"{where}: no nvidia_gpu_up")
    ups = {s.label("gpu"): s.label("uuid") for s in samples if s.name == "nvidia_gpu_up"}
    expect(ups == {w["gpu"]: w["uuid"] for w in want}, f"{where}: nvidia_gpu_up series {ups}")
    for w in want:
        info = [s for s in samples if s.name == "nvidia_gpu_info" and s.label("gpu") == w["gpu"]]
        expect(len(info) == 1, f"{where}: {len(info)} nvidia_gpu_info for GPU {w['gpu']}")
        for label in ("uuid", "name", "serial", "vbios_version"):
            got = info[0].label(label)
            expect(got == w[label], f"{where}: GPU {w['gpu']} {label} is {got!r}, expected {w[label]!r}")
    driver = [s for s in samples if s.name == "nvidia_gpu_driver_info"]
    want_driver = doc["system"]["driver_version"]
    expect(len(driver) == 1 and driver[0].label("driver_version") == want_driver,
           f"{where}: driver_version label is not the scenario's string")


@row("hostile strings: exporter file")
def hostile_file():
    path, doc, want = hostile_expectations()
    d = scratch("hostile")
    d.chmod(0o755)
    run = exporter(path, d)
    samples = check_file(d / OUT_FILE)
    expect(run.rc == 0, f"exit {run.rc}: {run.err.strip()[:200]}")
    expect(run.err == "", f"stderr not empty: {run.err.strip()[:200]!r}")
    check_hostile(samples, doc, want, "file")
    global HOSTILE_DIR
    HOSTILE_DIR = d
    return outcome(run, samples) + ", labels round-trip, nothing smuggled", "-"


HOSTILE_DIR = None


@row("hostile strings: through node_exporter")
def hostile_node_exporter():
    need_root()
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not binary:
        raise Failed("prometheus-node-exporter is not installed")
    if HOSTILE_DIR is None:
        hostile_file()
    path, doc, want = hostile_expectations()
    # node_exporter runs as prometheus: the scratch directory must be searchable.
    WORK.chmod(0o711)
    HOSTILE_DIR.chmod(0o755)
    expect(subprocess.run(["runuser", "-u", "prometheus", "--", "test", "-r", str(HOSTILE_DIR / OUT_FILE)]
                          ).returncode == 0, "user prometheus cannot read the file")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(WORK / "node_exporter.log", "wb+")
    proc = JANITOR.track(subprocess.Popen(
        ["runuser", "-u", "prometheus", "--", binary, f"--web.listen-address=127.0.0.1:{port}",
         "--collector.disable-defaults", "--collector.textfile",
         f"--collector.textfile.directory={HOSTILE_DIR}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), group=True)
    text, deadline = None, time.monotonic() + 15
    try:
        while text is None:
            expect(proc.poll() is None, f"node_exporter exited {proc.returncode}")
            expect(time.monotonic() < deadline, "node_exporter did not answer within 15 s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode("utf-8")
            except OSError:
                time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    log.seek(0)
    errors = [line for line in log.read().decode("utf-8", "replace").splitlines()
              if "error" in line.lower() or "level=warn" in line]
    if errors:
        raise Failed(f"node_exporter logged: {errors[0][:300]}")
    samples = parse(text)
    scrape_error = samples.get(Series("node_textfile_scrape_error", ()))
    expect(scrape_error == 0, f"node_textfile_scrape_error is {scrape_error}")
    mtime = [s for s in samples if s.name == "node_textfile_mtime_seconds"]
    expect(len(mtime) == 1 and mtime[0].label("file", "").endswith(OUT_FILE),
           f"node_exporter did not read the file: {[str(s) for s in mtime]}")
    check_hostile(samples, doc, want, "node_exporter")
    served = WORK / "node_exporter-metrics.prom"
    served.write_text("\n".join(line for line in text.split("\n")
                                if line.startswith(("nvidia_gpu", "# HELP nvidia_gpu", "# TYPE nvidia_gpu")))
                      + "\n", encoding="utf-8")
    complaints = promtool(served)
    expect(complaints == "", f"promtool on node_exporter's nvidia_gpu series: {complaints[:200]}")
    return "scrape_error 0, no error logged, labels round-trip, nothing smuggled", "-"


# ---------------------------------------------------------------------------


def run_rows():
    results = []
    for fault, fn in ROWS:
        if ARGS.only and not any(o.lower() in fault.lower() for o in ARGS.only):
            continue
        r = Row(fault)
        t0 = time.monotonic()
        try:
            r.outcome, r.t_error = fn()
            r.verdict = "PASS"
        except Skipped as e:
            r.verdict, r.outcome = "SKIP", str(e)
        except Failed as e:
            r.why, r.outcome = str(e), e.outcome or ""
        except Exception as e:  # a broken harness is a failure too, with its trace
            r.why = f"harness error: {e!r}\n{traceback.format_exc()}"
        r.seconds = time.monotonic() - t0
        results.append(r)
        print(f"  {r.verdict:4}  {r.fault}  ({r.seconds:.1f} s)", file=sys.stderr, flush=True)
    return results


def table(results):
    header = ("fault", "outcome (exit status, reason)", "time to error file", "verdict")
    cells = [header] + [(r.fault, r.outcome or r.why.split("\n")[0][:80], r.t_error, r.verdict)
                        for r in results]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    line = "+".join("-" * (w + 2) for w in widths)
    out = []
    for n, c in enumerate(cells):
        out.append("| " + " | ".join(v.ljust(w) for v, w in zip(c, widths)) + " |")
        if n == 0:
            out.append("|" + line.replace("+", "|") + "|")
    return "\n".join(out)


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def main():
    global ARGS, WORK
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("FAULT_MATRIX_SEED", "1")),
                        help="seed of the random kill moments (default 1, or $FAULT_MATRIX_SEED)")
    parser.add_argument("--only", action="append", help="run only rows whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ARGS = parser.parse_args()
    for path in (BIN, LIB):
        if not path.exists():
            sys.exit(f"fault-matrix: {path} not found; build first (make build)")
    global EXIT_OK, EXIT_NVML, EXIT_DOWN, EXIT_TIMEOUT, EXIT_BUSY, EXIT_WRITE
    codes = generated.exit_codes(BIN)
    EXIT_OK, EXIT_NVML, EXIT_DOWN = codes["Success"], codes["NvmlUnavailable"], codes["DeviceDown"]
    EXIT_TIMEOUT, EXIT_BUSY, EXIT_WRITE = codes["Timeout"], codes["Busy"], codes["PublishFailed"]
    for tool in ("promtool",):
        if not shutil.which(tool):
            sys.exit(f"fault-matrix: {tool} not found (apt-get install prometheus)")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    started = time.monotonic()
    WORK = Path(tempfile.mkdtemp(prefix="fault-matrix."))
    if not ARGS.keep:
        JANITOR.dirs.append(WORK)
    print(f"fault-matrix: {BIN.relative_to(ROOT) if BIN.is_relative_to(ROOT) else BIN} against "
          f"{LIB.name}, seed {ARGS.seed}", file=sys.stderr)
    try:
        results = run_rows()
    finally:
        JANITOR.cleanup()
    print(table(results))
    strict = os.environ.get("CI") == "true" or os.environ.get("FAULT_MATRIX_STRICT") == "1"
    failed = [r for r in results if r.verdict == "FAIL" or (strict and r.verdict == "SKIP")]
    for r in failed:
        print(f"\n{r.verdict} {r.fault}:\n  {r.why or r.outcome}"
              + (" (a skip fails under CI=true or FAULT_MATRIX_STRICT=1)" if r.verdict == "SKIP" else ""))
    passed = sum(r.verdict == "PASS" for r in results)
    skipped = sum(r.verdict == "SKIP" for r in results) if not strict else 0
    print(f"\nfault-matrix: {len(results)} rows in {time.monotonic() - started:.1f} s"
          + (f" (kept {WORK})" if ARGS.keep else ""))
    print(f"fault-matrix: {passed} passed, {len(failed)} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed or not results else 0


ARGS = None

if __name__ == "__main__":
    sys.exit(main())
