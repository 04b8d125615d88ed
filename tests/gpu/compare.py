#!/usr/bin/env python3
"""Compare one exporter snapshot with nvidia-smi on the same GPUs.

Run on a host with NVIDIA GPUs:  python3 tests/gpu/compare.py [path/to/exporter]
Needs nvidia-smi; parses with tests/lib/exposition.py. Prints one row per compared
value and exits 1 if any differs beyond its tolerance. Values that change
between the two reads (power, clocks, temperature) get a tolerance.
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from exposition import parse_all  # noqa: E402

EXPORTER = sys.argv[1] if len(sys.argv) > 1 else "target/release/nvidia-textfile-exporter"
MIB = 1024 * 1024



def yes_no(value):
    """nvidia-smi's flags; anything else is not a flag."""
    return {"No": 0.0, "Yes": 1.0}[value]


# nvidia-smi field, our metric (labels beyond gpu), converter smi->base unit, tolerance
FIELDS = [
    ("temperature.gpu", ("nvidia_gpu_temperature_celsius", {}), float, 2),
    ("temperature.memory", ("nvidia_gpu_memory_temperature_celsius", {}), float, 2),
    ("memory.total", ("nvidia_gpu_memory_total_bytes", {}), lambda v: float(v) * MIB, MIB),
    ("memory.used", ("nvidia_gpu_memory_used_bytes", {}), lambda v: float(v) * MIB, 64 * MIB),
    ("memory.free", ("nvidia_gpu_memory_free_bytes", {}), lambda v: float(v) * MIB, 64 * MIB),
    ("memory.reserved", ("nvidia_gpu_memory_reserved_bytes", {}), lambda v: float(v) * MIB, MIB),
    ("utilization.gpu", ("nvidia_gpu_utilization_ratio", {}), lambda v: float(v) / 100, 0.1),
    ("power.draw", ("nvidia_gpu_power_watts", {}), float, 15),
    ("enforced.power.limit", ("nvidia_gpu_power_limit_watts", {}), float, 0.5),
    ("power.default_limit", ("nvidia_gpu_power_default_limit_watts", {}), float, 0.5),
    ("power.min_limit", ("nvidia_gpu_power_min_limit_watts", {}), float, 0.5),
    ("power.max_limit", ("nvidia_gpu_power_max_limit_watts", {}), float, 0.5),
    ("clocks.gr", ("nvidia_gpu_clock_hertz", {"clock": "graphics"}), lambda v: float(v) * 1e6, 100e6),
    ("clocks.sm", ("nvidia_gpu_clock_hertz", {"clock": "sm"}), lambda v: float(v) * 1e6, 100e6),
    ("clocks.mem", ("nvidia_gpu_clock_hertz", {"clock": "memory"}), lambda v: float(v) * 1e6, 100e6),
    ("clocks.video", ("nvidia_gpu_clock_hertz", {"clock": "video"}), lambda v: float(v) * 1e6, 100e6),
    ("clocks.max.sm", ("nvidia_gpu_clock_max_hertz", {"clock": "sm"}), lambda v: float(v) * 1e6, 0),
    ("clocks.max.mem", ("nvidia_gpu_clock_max_hertz", {"clock": "memory"}), lambda v: float(v) * 1e6, 0),
    ("pstate", ("nvidia_gpu_performance_state", {}), lambda v: float(v.lstrip("P")), 0),
    ("pcie.link.gen.current", ("nvidia_gpu_pcie_link_generation", {}), float, 0),
    ("pcie.link.gen.max", ("nvidia_gpu_pcie_link_max_generation", {}), float, 0),
    ("pcie.link.width.current", ("nvidia_gpu_pcie_link_width", {}), float, 0),
    ("pcie.link.width.max", ("nvidia_gpu_pcie_link_max_width", {}), float, 0),
    ("persistence_mode", ("nvidia_gpu_persistence_mode", {}), lambda v: 1.0 if v == "Enabled" else 0.0, 0),
    ("ecc.mode.current", ("nvidia_gpu_ecc_enabled", {}), lambda v: 1.0 if v == "Enabled" else 0.0, 0),
    ("ecc.errors.corrected.volatile.total", ("nvidia_gpu_ecc_errors_total", {"type": "corrected", "scope": "volatile"}), float, 0),
    ("ecc.errors.uncorrected.volatile.total", ("nvidia_gpu_ecc_errors_total", {"type": "uncorrected", "scope": "volatile"}), float, 0),
    ("ecc.errors.corrected.aggregate.total", ("nvidia_gpu_ecc_errors_total", {"type": "corrected", "scope": "aggregate"}), float, 0),
    ("ecc.errors.uncorrected.aggregate.total", ("nvidia_gpu_ecc_errors_total", {"type": "uncorrected", "scope": "aggregate"}), float, 0),
    ("retired_pages.pending", ("nvidia_gpu_retired_pages_pending", {}), lambda v: 1.0 if v == "Yes" else 0.0, 0),
    ("mig.mode.current", ("nvidia_gpu_mig_enabled", {}), lambda v: 1.0 if v == "Enabled" else 0.0, 0),
    ("encoder.stats.sessionCount", ("nvidia_gpu_encoder_sessions", {}), float, 0),
    ("remapped_rows.correctable", ("nvidia_gpu_remapped_rows", {"cause": "correctable"}), float, 0),
    ("remapped_rows.uncorrectable", ("nvidia_gpu_remapped_rows", {"cause": "uncorrectable"}), float, 0),
    ("remapped_rows.correctable_inactive", ("nvidia_gpu_remapped_rows_inactive", {"cause": "correctable"}),
     float, 0),
    ("remapped_rows.uncorrectable_inactive", ("nvidia_gpu_remapped_rows_inactive", {"cause": "uncorrectable"}),
     float, 0),
    ("remapped_rows.pending", ("nvidia_gpu_remapped_rows_pending", {}), yes_no, 0),
    ("remapped_rows.failure", ("nvidia_gpu_remapped_rows_failure", {}), yes_no, 0),
    ("gpu_recovery_action", ("nvidia_gpu_recovery_action", {"action": "none"}),
     lambda v: 1.0 if v == "None" else 0.0, 0),
] + [
    (f"ecc.errors.{field}", ("nvidia_gpu_sram_ecc_errors_total", {"type": kind, "scope": scope}), float, 0)
    for field, kind, scope in [
        ("corrected.volatile.sram", "corrected", "volatile"),
        ("corrected.aggregate.sram", "corrected", "aggregate"),
        ("uncorrected.volatile.sram.parity", "uncorrected_parity", "volatile"),
        ("uncorrected.volatile.sram.secded", "uncorrected_sec_ded", "volatile"),
        ("uncorrected.aggregate.sram.parity", "uncorrected_parity", "aggregate"),
        ("uncorrected.aggregate.sram.secded", "uncorrected_sec_ded", "aggregate"),
    ]
] + [
    (f"ecc.errors.uncorrected.aggregate.sram.{field}",
     ("nvidia_gpu_sram_ecc_location_errors_total", {"location": location}), float, 0)
    for field, location in [("l2", "l2"), ("sm", "sm"), ("mcu", "microcontroller"), ("pcie", "pcie"),
                            ("other", "other")]
] + [
    ("ecc.errors.uncorrected.aggregate.sram.thresholdExceeded",
     ("nvidia_gpu_sram_ecc_threshold_exceeded", {}), yes_no, 0),
]
STRINGS = [
    ("name", "name"),
    ("pci.bus_id", "pci_bus_id"),
    ("serial", "serial"),
    ("vbios_version", "vbios_version"),
]


# Chips without a video encoder (GA100, GH100: NVENC 0 in NVIDIA's video
# support matrix), by the upper half of the PCI device id; the exporter leaves
# the encoder families out there (src/nvml/facts.rs), while nvidia-smi prints
# NVML's zeros.
NO_ENCODER = [range(0x2080, 0x2100), range(0x2300, 0x2380)]
ENCODER_FIELDS = {"encoder.stats.sessionCount"}


def without_encoder(device_id):
    chip = int(device_id, 16) >> 16
    return any(chip in ids for ids in NO_ENCODER)


def smi(fields):
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index," + ",".join(fields), "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = {}
    for line in out.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        rows[cells[0]] = dict(zip(fields, cells[1:]))
    return rows


def main():
    # The hardware maxima are opt-in (`limits`); compare them too.
    run = subprocess.run([EXPORTER, "--stdout", "--collector", "limits"],
                         capture_output=True, text=True)
    print(f"exporter exit status {run.returncode}; stderr: {run.stderr.strip() or '(empty)'}")
    samples = {}
    parsed, families = parse_all(run.stdout)
    for series, value in parsed.items():
        samples.setdefault(series.name, []).append((dict(series.labels), value))
    print(f"parsed {len(families)} families, {len(parsed)} samples")
    smi_rows = smi([f for f, *_ in FIELDS] + [f for f, _ in STRINGS] + ["driver_version", "pci.device_id"])
    failures = 0
    print(f"{'gpu':>3} {'nvidia-smi field':<42} {'nvidia-smi':>16} {'exporter':>16}  verdict")
    for gpu, row in sorted(smi_rows.items()):
        def ours(name, labels):
            for found, value in samples.get(name, []):
                if found.get("gpu") == gpu and all(found.get(k) == v for k, v in labels.items()):
                    return value
            return None
        for field, (metric, labels), convert, tolerance in FIELDS:
            raw = row[field]
            mine = ours(metric, labels)
            if field in ENCODER_FIELDS and without_encoder(row["pci.device_id"]):
                verdict = "ok (no encoder on this chip)" if mine is None else "EXTRA (no encoder)"
                failures += mine is not None
                print(f"{gpu:>3} {field:<42} {raw:>16} {str(mine):>16}  {verdict}")
                continue
            if raw in ("[N/A]", "N/A", "[Not Supported]", "") or raw.startswith("[Unknown"):
                verdict = "ok (both absent)" if mine is None else "EXTRA (smi has none)"
                failures += mine is not None
                print(f"{gpu:>3} {field:<42} {raw:>16} {str(mine):>16}  {verdict}")
                continue
            try:
                expected = convert(raw)
            except (KeyError, ValueError):
                failures += 1
                print(f"{gpu:>3} {field:<42} {raw:>16} {str(mine):>16}  DIFFERS")
                continue
            if mine is None:
                verdict = "MISSING"
                failures += 1
            elif abs(mine - expected) <= tolerance:
                verdict = "ok" if mine == expected else f"ok (within {tolerance:g})"
            else:
                verdict = "DIFFERS"
                failures += 1
            print(f"{gpu:>3} {field:<42} {expected:>16g} {str(mine):>16}  {verdict}")
        info = next((found for found, _ in samples.get("nvidia_gpu_info", []) if found.get("gpu") == gpu), {})
        for field, label in STRINGS:
            raw, mine = row[field], info.get(label)
            same = (raw == mine) or (raw in ("[N/A]", "N/A") and mine is None)
            failures += not same
            print(f"{gpu:>3} {field:<42} {raw:>16} {str(mine):>16}  {'ok' if same else 'DIFFERS'}")
        driver = next((found.get("driver_version") for found, _ in samples.get("nvidia_gpu_driver_info", [])), None)
        same = driver == row["driver_version"]
        failures += not same
        print(f"{gpu:>3} {'driver_version':<42} {row['driver_version']:>16} {str(driver):>16}  {'ok' if same else 'DIFFERS'}")
    print(f"{failures} difference(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
