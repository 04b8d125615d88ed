#!/usr/bin/env python3
"""Two builds of the exporter on the same GPUs: the same series, the same
fixed values.

Run on a host with NVIDIA GPUs, from the repository root (as root for GPM):

    python3 tests/gpu/parity.py OLD_EXPORTER NEW_EXPORTER

Each build runs three times (--stdout --write-state, its own state directory,
--gpm-window 1s), so both see first and later runs. Compared on the last
runs: the set of series (name and labels), and the values of series that do
not change on an idle GPU (info labels, thresholds, limits, modes, counts).
Prints each difference; exit status 1 if there is one, 0 otherwise.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from exposition import parse  # noqa: E402

# Families whose values are fixed while the driver is loaded and the GPU idle.
FIXED = (
    "nvidia_gpu_info", "nvidia_gpu_driver_info", "nvidia_gpu_up", "nvidia_gpu_collector_read_errors",
    "nvidia_gpu_temperature_threshold_celsius", "nvidia_gpu_power_limit_watts",
    "nvidia_gpu_power_default_limit_watts", "nvidia_gpu_memory_total_bytes",
    "nvidia_gpu_persistence_mode", "nvidia_gpu_compute_mode", "nvidia_gpu_mig_enabled",
    "nvidia_gpu_ecc_enabled", "nvidia_gpu_remapped_rows", "nvidia_gpu_remapped_rows_pending",
    "nvidia_gpu_remapped_rows_failure", "nvidia_gpu_clocks_event_active",
    "nvidia_gpu_nvlink_links", "nvidia_gpu_mig_info", "nvidia_gpu_gpm_unavailable",
)


def runs(exporter, state):
    out = None
    for _ in range(3):
        result = subprocess.run(
            [exporter, "--stdout", "--write-state", "--state-dir", state, "--gpm-window", "1s"],
            capture_output=True, text=True,
        )
        if result.returncode not in (0, 4):
            raise SystemExit(f"{exporter}: exit {result.returncode}: {result.stderr}")
        out = parse(result.stdout)
    return out


def main():
    old_exporter, new_exporter = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        old, new = runs(old_exporter, a), runs(new_exporter, b)
    differences = 0
    order = lambda series: (series.name, sorted(series.labels))  # noqa: E731
    for series in sorted(set(old) ^ set(new), key=order):
        differences += 1
        print(f"only in {'old' if series in old else 'new'}: {series.name} {dict(series.labels)}")
    for series in sorted(set(old) & set(new), key=order):
        if series.name in FIXED and old[series] != new[series]:
            differences += 1
            print(f"differs: {series.name} {dict(series.labels)}: {old[series]} -> {new[series]}")
    print(f"{len(old)} and {len(new)} series, {differences} difference(s)")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
