#!/usr/bin/env bash
# The small families against nvidia-smi on a real GPU host, side by side:
# JPEG and OFA utilization, the T.Limit margin, the second power reading (the
# instantaneous power or the driver's average, whichever power_watts is not),
# NVLink totals against the sum of the per-link series, MIG profiles where MIG is on; then which NVML field ids the
# driver answers (straight through libnvidia-ml with ctypes), and the cost of the
# per-link NVLink collector.
#
#   tests/gpu/small_families.sh [EXPORTER] [GPULOAD]
#
# EXPORTER defaults to target/release/nvidia-textfile-exporter. GPULOAD, if given
# (a known-load generator, gpuload.c: gcc -O2 -o gpuload gpuload.c -ldl), puts a full load on
# GPU 0 for the second snapshot so that power and temperature move. Needs only
# the exporter, nvidia-smi and python3. Exits 1 if a value differs from
# nvidia-smi by more than the reading can move between the two commands.
set -u
cd "$(dirname "$0")/../.." || exit 1
exporter=${1:-target/release/nvidia-textfile-exporter}
gpuload=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -n "${load_pid:-}" ] && kill "$load_pid" 2>/dev/null' EXIT

snapshot() { # NAME: the exporter (default set and with per-link NVLink) and nvidia-smi, back to back
    "$exporter" --stdout --state-dir "$work/state" --collector nvlink-links >"$work/$1.prom" 2>"$work/$1.err" ||
        echo "exporter exit status $? ($1): $(cat "$work/$1.err")"
    nvidia-smi -q -d TEMPERATURE,POWER,UTILIZATION >"$work/$1.smi"
    nvidia-smi -L >"$work/$1.list"
}

echo "== nvidia-smi $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1), $("$exporter" --version)"
snapshot idle
if [ -n "$gpuload" ]; then
    "$gpuload" spin 1000 0 20 0 1056 1024 0 >"$work/gpuload.out" 2>&1 &
    load_pid=$!
    sleep 8
    snapshot load
fi

python3 - "$work" "$exporter" <<'EOF'
import ctypes, os, re, statistics, subprocess, sys, time

work, exporter = sys.argv[1], sys.argv[2]
bad = []


def samples(path):
    out = []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        out.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return out


def smi_sections(path):
    """nvidia-smi -q text per GPU: {bus id: {"Section/Key": value}}."""
    gpus, gpu, section = {}, None, ""
    for line in open(path):
        m = re.match(r"^GPU ([0-9A-Fa-f:.]+)\s*$", line)
        if m:
            gpu = gpus.setdefault(m.group(1).upper(), {})
            continue
        if gpu is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        if not _:
            if indent <= 4:
                section = key.strip()
            continue
        gpu[f"{section}/{key.strip()}" if indent > 4 else key.strip()] = value.strip()
    return gpus


def number(text):
    m = re.match(r"^(-?[0-9.]+)", text or "")
    return float(m.group(1)) if m else None


def row(what, ours, theirs, tolerance):
    diff = "" if ours is None or theirs is None else abs(ours - theirs)
    flag = ""
    if ours is None and theirs is not None:
        flag = "  (not exported)"
    elif ours is not None and theirs is None:
        flag = "  (nvidia-smi shows none)"
    elif diff != "" and diff > tolerance:
        flag = f"  DIFFERS (more than {tolerance})"
        bad.append(what)
    fmt = lambda v: "-" if v is None else f"{v:g}"
    print(f"    {what:<44} {fmt(ours):>14} {fmt(theirs):>14}{flag}")


for phase in ("idle", "load"):
    if not os.path.exists(f"{work}/{phase}.prom"):
        continue
    ours = samples(f"{work}/{phase}.prom")
    smi = smi_sections(f"{work}/{phase}.smi")
    print(f"\n== {phase}: ours beside nvidia-smi -q")
    infos = [(l["gpu"], l["pci_bus_id"]) for n, l, _ in ours if n == "nvidia_gpu_info"]
    for gpu, bus in infos:
        q = smi.get(bus.upper(), {})

        def one(name, **labels):
            for n, l, v in ours:
                if n == name and l.get("gpu") == gpu and all(l.get(k) == x for k, x in labels.items()):
                    return v
            return None

        def smi_value(*keys):
            for key in keys:
                for k, v in q.items():
                    if k.endswith(key) and number(v) is not None:
                        return number(v)
            return None

        print(f"  GPU {gpu} ({bus})                               {'ours':>14} {'nvidia-smi':>14}")
        row("T.Limit margin, C (GPU T.Limit Temp)", one("nvidia_gpu_temperature_margin_celsius"),
            smi_value("/GPU T.Limit Temp"), 2)
        row("temperature, C (GPU Current Temp)", one("nvidia_gpu_temperature_celsius"),
            smi_value("/GPU Current Temp"), 2)
        # One second power family per GPU: the instantaneous power where
        # power_watts is NVML's 1 s average (Ampere except GA100, and newer),
        # the driver's average where power_watts is instantaneous.
        instant = one("nvidia_gpu_power_instant_watts")
        if instant is not None:
            row("power, W (Average Power Draw)", one("nvidia_gpu_power_watts"),
                smi_value("/Average Power Draw"), 15)
            row("instant power, W (Instantaneous Power Draw)", instant,
                smi_value("/Instantaneous Power Draw"), 60)
        else:
            row("averaged power, W (Average Power Draw)", one("nvidia_gpu_power_average_watts"),
                smi_value("/Average Power Draw"), 15)
            row("power, W (Power Draw / Instantaneous)", one("nvidia_gpu_power_watts"),
                smi_value("/Power Draw", "/Instantaneous Power Draw"), 60)
        jpeg, ofa = one("nvidia_gpu_jpeg_utilization_ratio"), one("nvidia_gpu_ofa_utilization_ratio")
        row("JPEG utilization, % (Utilization/JPEG)", None if jpeg is None else jpeg * 100,
            smi_value("Utilization/JPEG"), 5)
        row("OFA utilization, % (Utilization/OFA)", None if ofa is None else ofa * 100,
            smi_value("Utilization/OFA"), 5)
        links = one("nvidia_gpu_nvlink_links")
        if links:
            print(f"    NVLink: {links:g} links, {one('nvidia_gpu_nvlink_links_active')} active"
                  " (per-GPU totals beside the sum of the per-link series)")
            per = lambda name, **lab: [v for n, l, v in ours if n == name and l.get("gpu") == gpu
                                       and all(l.get(k) == x for k, x in lab.items())]
            row("  links (link_active series)", links, len(per("nvidia_gpu_nvlink_link_active")), 0)
            row("  active links", one("nvidia_gpu_nvlink_links_active"),
                sum(per("nvidia_gpu_nvlink_link_active")), 0)
            for counter in ("replay", "recovery", "crc_flit", "crc_data"):
                links_sum = per("nvidia_gpu_nvlink_link_errors_total", counter=counter)
                row(f"  errors {counter}", one("nvidia_gpu_nvlink_errors_total", counter=counter),
                    sum(links_sum) if links_sum else None, 0)
            for total, link in (("transmit", "nvidia_gpu_nvlink_link_transmit_bytes_total"),
                                ("receive", "nvidia_gpu_nvlink_link_receive_bytes_total")):
                s = per(link)
                # The counters move between the two reads within one run while traffic flows.
                row(f"  {total} bytes", one(f"nvidia_gpu_nvlink_{total}_bytes_total"),
                    sum(s) if s else None, 0 if phase == "idle" else 1e12)
        else:
            print("    NVLink: none reported (no links, or no NVLink)")
    mig = [(l["gpu"], l.get("profile"), l.get("mig_uuid")) for n, l, _ in ours if n == "nvidia_gpu_mig_info"]
    if mig:
        listed = open(f"{work}/{phase}.list").read()
        print("  MIG devices (ours; nvidia-smi -L lines below):")
        for gpu, profile, uuid in mig:
            line = next((l.strip() for l in listed.splitlines() if uuid and uuid in l), "")
            ok = profile and f"MIG {profile}" in line
            print(f"    GPU {gpu} profile={profile!r:<14} {line}{'' if ok else '  DIFFERS'}")
            if not ok:
                bad.append(f"MIG profile {uuid}")
    else:
        print("  MIG: no MIG devices (MIG mode off)")

print("\n== NVML field values the driver answers (GPU 0; scope 0, per-link fields also scope = last link)")
nvml = ctypes.CDLL("libnvidia-ml.so.1")


class Value(ctypes.Union):
    _fields_ = [("d", ctypes.c_double), ("ui", ctypes.c_uint), ("ul", ctypes.c_ulong),
                ("ull", ctypes.c_ulonglong), ("sll", ctypes.c_longlong), ("si", ctypes.c_int),
                ("us", ctypes.c_ushort)]


class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", Value)]


assert nvml.nvmlInit_v2() == 0
handle = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
NAMES = {38: "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 45: "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
         52: "NVLINK_REPLAY_ERROR_COUNT_TOTAL", 59: "NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
         91: "NVLINK_LINK_COUNT", 138: "NVLINK_THROUGHPUT_DATA_TX", 139: "NVLINK_THROUGHPUT_DATA_RX",
         160: "NVLINK_ECC_DATA_ERROR_COUNT_TOTAL", 161: "NVLINK_ERROR_DL_REPLAY", 162: "NVLINK_ERROR_DL_RECOVERY",
         163: "NVLINK_ERROR_DL_CRC", 165: "NVLINK_GET_STATE", 185: "POWER_AVERAGE", 186: "POWER_INSTANT",
         193: "TEMPERATURE_SHUTDOWN_TLIMIT", 194: "TEMPERATURE_SLOWDOWN_TLIMIT",
         195: "TEMPERATURE_MEM_MAX_TLIMIT", 196: "TEMPERATURE_GPU_MAX_TLIMIT",
         **{i: f"NVLINK_COUNT_{n}" for i, n in zip(range(201, 223), (
             "XMIT_PACKETS", "XMIT_BYTES", "RCV_PACKETS", "RCV_BYTES", "VL15_DROPPED", "MALFORMED_PACKET_ERRORS",
             "BUFFER_OVERRUN_ERRORS", "RCV_ERRORS", "RCV_REMOTE_ERRORS", "RCV_GENERAL_ERRORS",
             "LOCAL_LINK_INTEGRITY_ERRORS", "XMIT_DISCARDS", "LINK_RECOVERY_SUCCESSFUL_EVENTS",
             "LINK_RECOVERY_FAILED_EVENTS", "LINK_RECOVERY_EVENTS", "RAW_BER_LANE0", "RAW_BER_LANE1", "RAW_BER",
             "EFFECTIVE_ERRORS", "EFFECTIVE_BER", "SYMBOL_ERRORS", "SYMBOL_BER"))}}
count_req = (FieldValue * 1)(FieldValue(fieldId=91, scopeId=0))
nvml.nvmlDeviceGetFieldValues(handle, 1, count_req)
links = count_req[0].value.ui if count_req[0].nvmlReturn == 0 else 0
scopes = [0] + ([links - 1] if links > 1 else [])
requests = [(i, s) for i in NAMES for s in scopes if s == 0 or i in (138, 139, 161, 162, 163, 165) or i > 200]
array = (FieldValue * len(requests))(*[FieldValue(fieldId=i, scopeId=s) for i, s in requests])
start = time.perf_counter()
rc = nvml.nvmlDeviceGetFieldValues(handle, len(requests), array)
took = (time.perf_counter() - start) * 1000
print(f"  one nvmlDeviceGetFieldValues of {len(requests)} fields: return {rc}, {took:.2f} ms")
errors = {0: "ok", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 999: "UNKNOWN"}
for f in array:
    kind = f.valueType
    v = {0: f.value.d, 1: f.value.ui, 2: f.value.ul, 3: f.value.ull, 4: f.value.sll, 5: f.value.si}.get(kind)
    answer = f"{v} (type {kind})" if f.nvmlReturn == 0 else errors.get(f.nvmlReturn, f.nvmlReturn)
    print(f"  {f.fieldId:>3}:{f.scopeId:<3} {NAMES[f.fieldId]:<38} {answer}")

print("\n== cost: median wall time of 7 runs each (default set; with --collector nvlink-links)")
for args in ([], ["--collector", "nvlink-links"]):
    times = []
    for _ in range(7):
        start = time.perf_counter()
        subprocess.run([exporter, "--stdout", "--state-dir", f"{work}/state", *args],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append((time.perf_counter() - start) * 1000)
    series = subprocess.run([exporter, "--stdout", "--state-dir", f"{work}/state", *args],
                            capture_output=True, text=True).stdout
    per_gpu = {}
    for line in series.splitlines():
        m = re.search(r'gpu="(\d+)"', line)
        if m and not line.startswith("#"):
            per_gpu[m.group(1)] = per_gpu.get(m.group(1), 0) + 1
    print(f"  {' '.join(args) or 'default':<26} {statistics.median(times):7.1f} ms   series per GPU: "
          + ", ".join(f"{g}: {n}" for g, n in sorted(per_gpu.items())))

print("\nresult: " + ("differences: " + ", ".join(bad) if bad else "no differences beyond the tolerances"))
sys.exit(1 if bad else 0)
EOF
