#!/usr/bin/env python3
"""What each NVML call of a snapshot costs on this host's GPU, and what batching saves.

usage: benches/nvml_latency.py [--lib PATH] [--gpu INDEX] [--processes N]

Run on a host with an NVIDIA GPU (python3 standard library only; loads
libnvidia-ml.so.1 through ctypes). A snapshot is a short-lived process that
makes each call once, so what counts is the first call of each function in a
fresh process: every measurement here runs in PROCESSES fresh child processes
(default 7) and the median is printed.

Part 1 makes the calls of one GPU's snapshot, in the exporter's order and
number, and prints each function's first-call time, its time when repeated in
the same process, and its share of the snapshot: the numbers to compare with
the [delays_us] of tests/scenarios/bench-*.toml.

Part 2 compares, for the readings the exporter makes many calls for, the
individual getters with one nvmlDeviceGetFieldValues call asking for the same
readings, and checks that the two give the same values.

Part 3, on hosts with more than one GPU and with NVLink, reads every GPU's
NVLink state and error counters one GPU after another and from one thread per
GPU, both with the individual getters and batched, to show whether NVML runs
those calls on different GPUs at the same time.

Against the fake NVML, e.g. to check this script:
  FAKE_NVML_SCENARIO=tests/scenarios/bench-1gpu.toml \\
      benches/nvml_latency.py --lib target/debug/libfake_nvml.so
"""
import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import threading
import time

U, ULL, INT = ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_int
NOT_SUPPORTED = 3


class Value(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("siVal", ctypes.c_int), ("uiVal", ctypes.c_uint),
                ("ulVal", ctypes.c_ulong), ("ullVal", ctypes.c_ulonglong),
                ("sllVal", ctypes.c_longlong), ("usVal", ctypes.c_ushort)]


class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", U), ("scopeId", U), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", INT), ("nvmlReturn", INT),
                ("value", Value)]


def field_number(field):
    kind = field.valueType
    return {0: field.value.dVal, 1: field.value.uiVal, 2: field.value.ulVal,
            3: field.value.ullVal, 4: field.value.sllVal, 5: field.value.siVal,
            6: field.value.usVal}.get(kind)


def buffers(*types):
    return [t() for t in types]


def refs(values):
    return [ctypes.byref(v) for v in values]


class Nvml:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)

    def call(self, symbol, *args):
        """(nvmlReturn, microseconds); a missing symbol is (None, 0)."""
        function = getattr(self.lib, symbol, None)
        if function is None:
            return None, 0.0
        start = time.perf_counter_ns()
        code = function(*args)
        return code, (time.perf_counter_ns() - start) / 1000


def mem_v2():
    memory = (ctypes.c_ubyte * 40)()
    ctypes.cast(memory, ctypes.POINTER(U))[0] = 40 | (2 << 24)
    return memory


def string(n=96):
    return (ctypes.create_string_buffer(n), U(n))


# One GPU's snapshot with the default collectors, in the exporter's order:
# (symbol, arguments after the handle). Calls the exporter makes only when an
# earlier one succeeded (ECC counters, NVLink counters, MIG devices) are
# made here regardless.
def snapshot_calls(links):
    calls = [("nvmlDeviceGetUUID", string), ("nvmlDeviceGetName", string),
             ("nvmlDeviceGetPciInfo_v3", lambda: [ctypes.create_string_buffer(256)]),
             ("nvmlDeviceGetSerial", string), ("nvmlDeviceGetVbiosVersion", string),
             ("nvmlDeviceGetBrand", lambda: refs(buffers(INT))),
             ("nvmlDeviceGetArchitecture", lambda: refs(buffers(U))),
             ("nvmlDeviceGetMinorNumber", lambda: refs(buffers(U))),
             ("nvmlDeviceGetUtilizationRates", lambda: [ctypes.create_string_buffer(8)]),
             ("nvmlDeviceGetComputeRunningProcesses_v3", lambda: [ctypes.byref(U(0)), None]),
             ("nvmlDeviceGetMemoryInfo_v2", lambda: [mem_v2()]),
             ("nvmlDeviceGetBAR1MemoryInfo", lambda: [ctypes.create_string_buffer(24)]),
             ("nvmlDeviceGetTemperature", lambda: [0, *refs(buffers(U))]),
             ("nvmlDeviceGetFieldValues", lambda: fields_args([(82, 0)]))]
    calls += [("nvmlDeviceGetTemperatureThreshold", lambda t=t: [t, *refs(buffers(U))])
              for t in (1, 0, 3, 2)]
    calls += [("nvmlDeviceGetNumFans", lambda: refs(buffers(U))),
              ("nvmlDeviceGetPowerUsage", lambda: refs(buffers(U))),
              ("nvmlDeviceGetTotalEnergyConsumption", lambda: refs(buffers(ULL))),
              ("nvmlDeviceGetEnforcedPowerLimit", lambda: refs(buffers(U))),
              ("nvmlDeviceGetPowerManagementDefaultLimit", lambda: refs(buffers(U))),
              ("nvmlDeviceGetPowerManagementLimitConstraints", lambda: refs(buffers(U, U)))]
    calls += [("nvmlDeviceGetClockInfo", lambda c=c: [c, *refs(buffers(U))]) for c in range(4)]
    calls += [("nvmlDeviceGetMaxClockInfo", lambda c=c: [c, *refs(buffers(U))]) for c in range(4)]
    calls += [("nvmlDeviceGetPerformanceState", lambda: refs(buffers(INT))),
              ("nvmlDeviceGetCurrentClocksEventReasons", lambda: refs(buffers(ULL))),
              ("nvmlDeviceGetSupportedClocksEventReasons", lambda: refs(buffers(ULL)))]
    calls += [("nvmlDeviceGetViolationStatus", lambda p=p: [p, ctypes.create_string_buffer(16)])
              for p in (0, 1, 2, 3, 4, 5, 10, 11)]
    calls += [(s, lambda: refs(buffers(U))) for s in (
        "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetPcieReplayCounter")]
    calls += [("nvmlDeviceGetFieldValues", lambda: fields_args([(197, 0), (198, 0)])),
              ("nvmlDeviceGetEccMode", lambda: refs(buffers(INT, INT)))]
    calls += [("nvmlDeviceGetTotalEccErrors", lambda e=e, c=c: [e, c, *refs(buffers(ULL))])
              for c in (0, 1) for e in (0, 1)]
    calls += [("nvmlDeviceGetRetiredPages", lambda c=c: [c, ctypes.byref(U(0)), ctypes.byref(ULL())])
              for c in (0, 1)]
    calls += [("nvmlDeviceGetRetiredPagesPendingStatus", lambda: refs(buffers(INT))),
              ("nvmlDeviceGetRemappedRows", lambda: refs(buffers(U, U, U, U))),
              ("nvmlDeviceGetEncoderUtilization", lambda: refs(buffers(U, U))),
              ("nvmlDeviceGetDecoderUtilization", lambda: refs(buffers(U, U))),
              ("nvmlDeviceGetEncoderStats", lambda: refs(buffers(U, U, U))),
              ("nvmlDeviceGetPersistenceMode", lambda: refs(buffers(INT))),
              ("nvmlDeviceGetComputeMode", lambda: refs(buffers(INT))),
              ("nvmlDeviceGetMigMode", lambda: refs(buffers(U, U)))]
    calls += [("nvmlDeviceGetNvLinkState", lambda l=l: [l, *refs(buffers(INT))])
              for l in range(max(links, 1))]
    calls += [("nvmlDeviceGetNvLinkErrorCounter", lambda l=l, c=c: [l, c, *refs(buffers(ULL))])
              for l in range(links) for c in range(4)]
    calls += [("nvmlDeviceGetFieldValues", lambda: fields_args(
        [(f, l) for l in range(links) for f in (138, 139)] or [(138, 0)])),
              ("nvmlDeviceGetMigMode", lambda: refs(buffers(U, U)))]
    return calls


def fields_args(requests):
    values = (FieldValue * len(requests))()
    for value, (field, scope) in zip(values, requests):
        value.fieldId, value.scopeId = field, scope
    return [len(requests), values]


def active_links(nvml, handle):
    links = 0
    for link in range(18):
        state = INT()
        code, _ = nvml.call("nvmlDeviceGetNvLinkState", handle, link, ctypes.byref(state))
        if code != 0:
            break
        links += 1
    return links


def open_gpu(nvml, index):
    code, init_us = nvml.call("nvmlInit_v2")
    if code != 0:
        raise SystemExit(f"nvmlInit_v2 failed: {code}")
    handle = ctypes.c_void_p()
    code, handle_us = nvml.call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
    if code != 0:
        raise SystemExit(f"nvmlDeviceGetHandleByIndex_v2({index}) failed: {code}")
    return handle, init_us, handle_us


def child_snapshot(nvml, index):
    """First-call and repeated-call microseconds of every call of a snapshot."""
    handle, init_us, handle_us = open_gpu(nvml, index)
    # Counted in another process, so that these NvLinkState calls are the first.
    links = int(sys.argv[sys.argv.index("--links") + 1])
    rows = [("nvmlInit_v2", 0, init_us, init_us), ("nvmlDeviceGetHandleByIndex_v2", 0, handle_us,
                                                     handle_us)]
    seen = set()
    for symbol, args in snapshot_calls(links):
        code, first = nvml.call(symbol, handle, *args())
        repeat = first
        if symbol not in seen:
            repeat = statistics.median(nvml.call(symbol, handle, *args())[1] for _ in range(5))
            seen.add(symbol)
        rows.append((symbol, code, first, repeat))
    _, shutdown_us = nvml.call("nvmlShutdown")
    rows.append(("nvmlShutdown", 0, shutdown_us, shutdown_us))
    return rows


# Part 2: (name, individual calls, one field-values request) as functions of the
# number of active links.
def experiments(links):
    link_fields = [(f, l) for l in range(links) for f in (165, 161, 162, 163)]
    return [
        ("violation time, 8 policies",
         [("nvmlDeviceGetViolationStatus", [p, ctypes.create_string_buffer(16)])
          for p in (0, 1, 2, 3, 4, 5, 10, 11)],
         [(74 + i, 0) for i in range(8)]),
        ("ECC mode and 4 totals",
         [("nvmlDeviceGetEccMode", refs(buffers(INT, INT)))]
         + [("nvmlDeviceGetTotalEccErrors", [e, c, *refs(buffers(ULL))])
            for c in (0, 1) for e in (0, 1)],
         [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0)]),
        (f"NVLink state and 3 error counters x {links} links",
         [("nvmlDeviceGetNvLinkState", [l, *refs(buffers(INT))]) for l in range(links)]
         + [("nvmlDeviceGetNvLinkErrorCounter", [l, c, *refs(buffers(ULL))])
            for l in range(links) for c in range(3)],
         link_fields),
        (f"NVLink: 4 error counters x {links} links against the 4 per-GPU totals",
         [("nvmlDeviceGetNvLinkErrorCounter", [l, c, *refs(buffers(ULL))])
          for l in range(links) for c in range(4)],
         [(52, 0), (59, 0), (38, 0), (45, 0)] if links else []),
        ("energy and PCIe replays: getters and a 3-field batch against one 5-field batch",
         [("nvmlDeviceGetFieldValues", fields_args([(82, 0), (197, 0), (198, 0)])),
          ("nvmlDeviceGetTotalEnergyConsumption", refs(buffers(ULL))),
          ("nvmlDeviceGetPcieReplayCounter", refs(buffers(U)))],
         [(82, 0), (197, 0), (198, 0), (83, 0), (94, 0)]),
    ]


def child_batch(nvml, index, which, batched):
    handle, _, _ = open_gpu(nvml, index)
    links = int(sys.argv[sys.argv.index("--links") + 1])
    name, individual, requests = experiments(links)[which]
    if not batched:
        total, values = 0.0, []
        for symbol, args in individual:
            code, us = nvml.call(symbol, handle, *args)
            total += us
            values.append(code)
        return {"us": total, "calls": len(individual), "codes": values}
    if not requests:
        return {"us": 0.0, "calls": 0, "codes": []}
    count, values = fields_args(requests)
    code, us = nvml.call("nvmlDeviceGetFieldValues", handle, count, values)
    return {"us": us, "calls": 1, "code": code,
            "codes": [v.nvmlReturn for v in values]}


def nvlink_work(nvml, handle, links, batched):
    if batched:
        count, values = fields_args([(f, l) for l in range(links) for f in (165, 161, 162, 163)])
        nvml.call("nvmlDeviceGetFieldValues", handle, count, values)
        return
    for link in range(links):
        nvml.call("nvmlDeviceGetNvLinkState", handle, link, ctypes.byref(INT()))
    for link in range(links):
        for counter in range(4):
            nvml.call("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter,
                      ctypes.byref(ULL()))


def child_across(nvml, threaded, batched):
    """Wall milliseconds of every GPU's NVLink readings (ctypes calls release the GIL)."""
    open_gpu(nvml, 0)
    gpus = U()
    nvml.call("nvmlDeviceGetCount_v2", ctypes.byref(gpus))
    handles = []
    for index in range(gpus.value):
        handle = ctypes.c_void_p()
        nvml.call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
        handles.append(handle)
    links = int(sys.argv[sys.argv.index("--links") + 1])
    start = time.perf_counter()
    if threaded:
        threads = [threading.Thread(target=nvlink_work, args=(nvml, h, links, batched))
                   for h in handles]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for handle in handles:
            nvlink_work(nvml, handle, links, batched)
    return {"ms": (time.perf_counter() - start) * 1000, "gpus": len(handles)}


def run_child(args, *extra):
    argv = [sys.executable, __file__, "--lib", args.lib, "--gpu", str(args.gpu), *extra]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default="libnvidia-ml.so.1")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--links", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    nvml = Nvml(args.lib)
    if args.child == "links":
        handle, _, _ = open_gpu(nvml, args.gpu)
        gpus = U()
        nvml.call("nvmlDeviceGetCount_v2", ctypes.byref(gpus))
        print(json.dumps({"links": active_links(nvml, handle), "gpus": gpus.value}))
        return
    if args.child == "snapshot":
        print(json.dumps(child_snapshot(nvml, args.gpu)))
        return
    if args.child and args.child.startswith("across"):
        _, threaded, batched = args.child.split(":")
        print(json.dumps(child_across(nvml, threaded == "threads", batched == "batched")))
        return
    if args.child:
        which, batched = args.child.split(":")
        print(json.dumps(child_batch(nvml, args.gpu, int(which), batched == "batched")))
        return

    host = run_child(args, "--child", "links")
    links = host["links"]
    print(f"GPU {args.gpu} of {host['gpus']}: {links} active NVLink links; medians over "
          f"{args.processes} fresh processes")
    runs = [run_child(args, "--child", "snapshot", "--links", str(links))
            for _ in range(args.processes)]
    per_symbol = {}
    order = []
    for run in runs:
        totals = {}
        for symbol, code, first, repeat in run:
            entry = totals.setdefault(symbol, [0, 0.0, None, code])
            entry[0] += 1
            entry[1] += first
            if entry[2] is None:
                entry[2] = (first, repeat)
        for symbol, (calls, total, (first, repeat), code) in totals.items():
            if symbol not in per_symbol:
                order.append(symbol)
                per_symbol[symbol] = {"calls": calls, "code": code, "total": [], "first": [],
                                      "repeat": []}
            per_symbol[symbol]["total"].append(total)
            per_symbol[symbol]["first"].append(first)
            per_symbol[symbol]["repeat"].append(repeat)
    snapshot_total = statistics.median(sum(first for _, _, first, _ in run) for run in runs)
    print(f"Part 1: one snapshot's calls, {snapshot_total / 1000:.1f} ms in all (median)")
    print(f"  {'symbol':<46} {'calls':>5} {'first us':>9} {'again us':>9} {'all ms':>7} "
          f"{'share':>6}  status")
    rows = sorted(order, key=lambda s: -statistics.median(per_symbol[s]["total"]))
    for symbol in rows:
        entry = per_symbol[symbol]
        total = statistics.median(entry["total"])
        status = {0: "ok", NOT_SUPPORTED: "not supported", None: "missing"}.get(
            entry["code"], f"error {entry['code']}")
        if symbol == "nvmlDeviceGetComputeRunningProcesses_v3" and entry["code"] == 7:
            status = "ok (count only: insufficient size)"
        print(f"  {symbol:<46} {entry['calls']:5d} {statistics.median(entry['first']):9.0f} "
              f"{statistics.median(entry['repeat']):9.0f} {total / 1000:7.2f} "
              f"{total / snapshot_total:6.1%}  {status}")

    print("Part 2: individual getters against one nvmlDeviceGetFieldValues (first calls)")
    for which, (name, individual, requests) in enumerate(experiments(links)):
        if not individual:
            continue
        one = [run_child(args, "--child", f"{which}:individual", "--links", str(links))
               for _ in range(args.processes)]
        batch = [run_child(args, "--child", f"{which}:batched", "--links", str(links))
                 for _ in range(args.processes)]
        ok_individual = sum(code == 0 for code in one[0]["codes"])
        ok_fields = sum(code == 0 for code in batch[0]["codes"])
        one_us = statistics.median(r["us"] for r in one)
        batch_us = statistics.median(r["us"] for r in batch)
        print(f"  {name}: {len(individual)} calls {one_us / 1000:.2f} ms ({ok_individual} ok); "
              f"1 call for {len(requests)} fields {batch_us / 1000:.2f} ms "
              f"({ok_fields} ok): {batch_us / max(one_us, 1e-9):.2f}x")
    compare_values(args, nvml, links)
    if links and host["gpus"] > 1:
        across(args, links)


def across(args, links):
    results = {}
    for batched in ("individual", "batched"):
        for threaded in ("in turn", "threads"):
            runs = [run_child(args, "--child", f"across:{threaded}:{batched}", "--links",
                              str(links)) for _ in range(args.processes)]
            results[batched, threaded] = statistics.median(r["ms"] for r in runs)
            gpus = runs[0]["gpus"]
    print(f"Part 3: NVLink readings of {links} links on each of {gpus} GPUs, wall ms, GPUs one "
          "after another and one thread per GPU")
    print("  individual: the exporter's calls (state and 4 counters per link); batched: one "
          "field-values call per GPU (state, replay, recovery, crc per link)")
    for batched in ("individual", "batched"):
        turn, threads = results[batched, "in turn"], results[batched, "threads"]
        print(f"  {batched:<10}: in turn {turn:7.1f}, threads {threads:7.1f}: "
              f"threads / in turn {threads / turn:.2f}")


def compare_values(args, nvml, links):
    """The same readings both ways, where both answer."""
    handle, _, _ = open_gpu(nvml, args.gpu)
    checks = []
    for i, policy in enumerate((0, 1, 2, 3, 4, 5, 10, 11)):
        violation = (ULL * 2)()
        code, _ = nvml.call("nvmlDeviceGetViolationStatus", handle, policy, violation)
        checks.append((f"violation policy {policy} (ns)", 74 + i, 0,
                       violation[1] if code == 0 else None))
    for e, c, field in ((0, 0, 3), (1, 0, 4), (0, 1, 5), (1, 1, 6)):
        count = ULL()
        code, _ = nvml.call("nvmlDeviceGetTotalEccErrors", handle, e, c, ctypes.byref(count))
        checks.append((f"ECC errors type {e} counter {c}", field, 0,
                       count.value if code == 0 else None))
    energy = ULL()
    code, _ = nvml.call("nvmlDeviceGetTotalEnergyConsumption", handle, ctypes.byref(energy))
    checks.append(("energy (mJ)", 83, 0, energy.value if code == 0 else None))
    for link in range(links):
        for counter, field in ((0, 161), (1, 162), (2, 163)):
            value = ULL()
            code, _ = nvml.call("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter,
                                ctypes.byref(value))
            checks.append((f"NVLink {link} counter {counter}", field, link,
                           value.value if code == 0 else None))
    count, values = fields_args([(field, scope) for _, field, scope, _ in checks])
    nvml.call("nvmlDeviceGetFieldValues", handle, count, values)
    same = differ = 0
    for (name, field, scope, direct), value in zip(checks, values):
        if direct is None or value.nvmlReturn != 0:
            continue
        batched = field_number(value)
        # Counters read a moment apart may have moved on.
        # Violation time and energy move on between the two reads.
        if batched == direct or (name.startswith(("violation", "energy"))
                                 and abs(batched - direct) <= max(1, 0.01 * direct)):
            same += 1
        else:
            differ += 1
            print(f"  differs: {name}: getter {direct}, field {field}/{scope} {batched}")
    nonzero = sum(1 for *_, direct in checks if direct)
    print(f"  values compared where both answer: {same} agree, {differ} differ "
          f"({nonzero} of the getters' values are not 0)")
    nvml.call("nvmlShutdown")


if __name__ == "__main__":
    main()
