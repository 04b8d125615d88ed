#!/usr/bin/env python3
"""End to end: exporter -> node_exporter textfile -> Prometheus -> recording rules, alerts.

One Prometheus (127.0.0.1, temporary storage, 1 s scrape and evaluation) loads a
copy of the recording and alerting rules whose `for:` are cut to seconds and
scrapes one node_exporter per simulated host, each reading its own textfile
directory that the real exporter, run against the fake NVML, rewrites every second:

  healthy   demo-h100x8.toml (samples on the wall     no critical or collector alert;
            clock), with --collector processes       NvidiaGpuBusyButSmsIdle on GPU 7 (it
                                                     spins); recorded: 8 GPUs up, none down,
                                                     the window utilization of each GPU
  hot       alert-hot-gpu.toml                       GPU 0: temperature alerts; GPU 1: none
  lost      lost-gpu.toml                            NvidiaGpuDown{gpu="2",reason="gpu_lost"};
                                                     recorded: 3 GPUs up, 1 down (gpu_lost)
  nodriver  init-driver-not-loaded.toml              NvidiaGpuCollectorFailed{reason="driver_not_loaded"}
  vanished  h100x8.toml, then the file is deleted    NvidiaGpuCollectorAbsent for that host only
  geforce   geforce.toml (no ECC, fans)              no critical or collector alert

Then the recorded series of the healthy and the lost host must hold the
expected values, every dashboard query must evaluate without error, every
dashboard variable must have values, and every rule must evaluate without error
on this data. Alerts are read from /api/v1/alerts (pending or firing both count).
Usage: e2e.py EXPORTER FAKE_NVML RULES_COPY [TIMEOUT_S]
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SCENARIOS = os.path.join(ROOT, "tests", "scenarios")

HOSTS = {
    "healthy": ("demo-h100x8.toml", ["--collector", "processes"]),
    "hot": ("alert-hot-gpu.toml", []),
    "lost": ("lost-gpu.toml", []),
    "nodriver": ("init-driver-not-loaded.toml", []),
    "vanished": ("h100x8.toml", []),
    "geforce": ("geforce.toml", []),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def which(*names):
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    sys.exit(f"none of {', '.join(names)} is installed")


class Stack:
    def __init__(self, exporter, fake, rules, work):
        self.exporter, self.fake, self.rules, self.work = exporter, fake, rules, work
        self.processes = []
        self.stop = threading.Event()
        self.paused = set()
        # Held while a host's file is written, so that vanish() cannot race a run
        # in progress (a GPM window makes a run last about a second).
        self.writing = threading.Lock()
        self.ports = {}
        self.dirs = {}
        self.writer_errors = []

    def spawn(self, name, argv):
        log = open(os.path.join(self.work, name + ".log"), "w")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.processes.append((name, process))
        return process

    def start(self):
        node_exporter = which("prometheus-node-exporter", "node_exporter")
        prometheus = which("prometheus")
        for host in HOSTS:
            self.dirs[host] = os.path.join(self.work, "textfile-" + host)
            os.makedirs(self.dirs[host])
            self.ports[host] = free_port()
            self.spawn("node-exporter-" + host, [
                node_exporter, f"--web.listen-address=127.0.0.1:{self.ports[host]}",
                "--collector.disable-defaults", "--collector.textfile",
                f"--collector.textfile.directory={self.dirs[host]}"])
        self.write_all()
        self.writer = threading.Thread(target=self.write_loop, daemon=True)
        self.writer.start()

        self.prometheus_port = free_port()
        targets = "\n".join(
            f"      - targets: ['127.0.0.1:{self.ports[host]}']\n        labels: {{host: {host}}}"
            for host in HOSTS)
        config = os.path.join(self.work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {self.rules}
scrape_configs:
  - job_name: node
    static_configs:
{targets}
""")
        self.spawn("prometheus", [
            prometheus, f"--config.file={config}",
            f"--storage.tsdb.path={os.path.join(self.work, 'data')}",
            f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
            "--storage.tsdb.retention.time=1h", "--web.enable-lifecycle"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                urllib.request.urlopen(self.url("/-/ready"), timeout=2).read()
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        raise SystemExit("Prometheus did not become ready within 30 s")

    def check_alive(self):
        for name, process in self.processes:
            if process.poll() is not None:
                with open(os.path.join(self.work, name + ".log")) as f:
                    tail = f.read()[-2000:]
                raise SystemExit(f"{name} exited with {process.returncode}:\n{tail}")

    def write_all(self):
        for host, (scenario, extra) in HOSTS.items():
            with self.writing:
                if host not in self.paused:
                    self.write_one(host, scenario, extra)

    def write_one(self, host, scenario, extra):
        result = subprocess.run(
            [self.exporter, "--nvml-lib", self.fake, "--output-dir", self.dirs[host],
             "--state-dir", self.dirs[host] + ".state", "--timeout", "5s", *extra],
            env=dict(os.environ, FAKE_NVML_SCENARIO=os.path.join(SCENARIOS, scenario)),
            capture_output=True, text=True, timeout=30)
        if not os.path.exists(os.path.join(self.dirs[host], "nvidia_gpu.prom")):
            self.writer_errors.append(f"{host}: no file written (exit {result.returncode}): "
                                      f"{result.stderr.strip()[:300]}")

    def write_loop(self):
        while not self.stop.wait(1.0):
            try:
                self.write_all()
            except Exception as e:  # reported by the main thread
                self.writer_errors.append(repr(e))

    def vanish(self, host):
        with self.writing:
            self.paused.add(host)
            os.remove(os.path.join(self.dirs[host], "nvidia_gpu.prom"))

    def url(self, path, **params):
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        return f"http://127.0.0.1:{self.prometheus_port}{path}{query}"

    def api(self, path, **params):
        try:
            with urllib.request.urlopen(self.url(path, **params), timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:
            return json.load(e)

    def shutdown(self):
        self.stop.set()
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for _, process in reversed(self.processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def alerts_of(stack):
    return stack.api("/api/v1/alerts")["data"]["alerts"]


def summarize(alerts):
    return sorted({(a["labels"].get("host"), a["labels"]["alertname"], a["labels"].get("gpu", ""),
                    a["labels"].get("reason", ""), a["state"]) for a in alerts})


def expectations(alerts):
    """(description, met) for every assertion on the current alerts."""
    def has(host, alertname, **labels):
        return any(a["labels"].get("host") == host and a["labels"]["alertname"] == alertname
                   and all(a["labels"].get(k) == v for k, v in labels.items()) for a in alerts)

    def names(host, **labels):
        return {a["labels"]["alertname"] for a in alerts if a["labels"].get("host") == host
                and all(a["labels"].get(k) == v for k, v in labels.items())}

    hot = {"NvidiaGpuTemperatureHigh", "NvidiaGpuTemperatureCritical", "NvidiaGpuMemoryTemperatureHigh"}
    def serious(host):
        return sorted({a["labels"]["alertname"] for a in alerts if a["labels"].get("host") == host
                       and (a["labels"].get("severity") == "critical"
                            or a["labels"]["alertname"].startswith("NvidiaGpuCollector"))})
    return [
        ("hot: GPU 0 has exactly the three temperature alerts",
         names("hot", gpu="0") == hot),
        ("hot: GPU 1 (healthy control) has no alert", not names("hot", gpu="1")),
        ("hot: no host-level alert", not {n for n in names("hot") if n.startswith("NvidiaGpuCollector")}),
        ('lost: NvidiaGpuDown{gpu="2",reason="gpu_lost"}', has("lost", "NvidiaGpuDown", gpu="2", reason="gpu_lost")),
        ("lost: no other GPU down",
         not any(a["labels"].get("host") == "lost" and a["labels"]["alertname"] == "NvidiaGpuDown"
                 and a["labels"].get("gpu") != "2" for a in alerts)),
        ('nodriver: NvidiaGpuCollectorFailed{reason="driver_not_loaded"}',
         has("nodriver", "NvidiaGpuCollectorFailed", reason="driver_not_loaded")),
        ("nodriver: not reported absent (its file says why it fails)",
         not has("nodriver", "NvidiaGpuCollectorAbsent")),
        ("vanished: NvidiaGpuCollectorAbsent names the host", has("vanished", "NvidiaGpuCollectorAbsent")),
        (f"healthy: no critical or collector alert {serious('healthy') or ''}", not serious("healthy")),
        # demo-h100x8's GPU 7 spins: 63 % utilization, 0.8 % SM activity.
        ("healthy: NvidiaGpuBusyButSmsIdle on GPU 7, on no other GPU or host",
         has("healthy", "NvidiaGpuBusyButSmsIdle", gpu="7")
         and not any(a["labels"]["alertname"] == "NvidiaGpuBusyButSmsIdle"
                     and (a["labels"].get("host"), a["labels"].get("gpu")) != ("healthy", "7")
                     for a in alerts)),
        (f"geforce: no critical or collector alert {serious('geforce') or ''}", not serious("geforce")),
        ("no host but vanished is reported absent",
         not any(a["labels"]["alertname"] == "NvidiaGpuCollectorAbsent" and a["labels"].get("host") != "vanished"
                 for a in alerts)),
    ]


def recorded_expectations(stack):
    """(description, met) for the recorded series of the healthy and the lost host."""
    def values(query):
        answer = stack.api("/api/v1/query", query=query)
        if answer.get("status") != "success":
            return {}
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in answer["data"]["result"]}

    def one(query):
        found = list(values(query).values())
        return found[0] if len(found) == 1 else None

    utilization = {dict(k).get("gpu"): v for k, v in values(
        'instance_gpu:nvidia_gpu_utilization:ratio_rate5m{host="healthy",engine="gpu"}').items()}
    return [
        ('healthy: instance:nvidia_gpu_up:sum 8', one('instance:nvidia_gpu_up:sum{host="healthy"}') == 8),
        ('healthy: instance:nvidia_gpu_down:count 0', one('instance:nvidia_gpu_down:count{host="healthy"}') == 0),
        ('lost: instance:nvidia_gpu_up:sum 3', one('instance:nvidia_gpu_up:sum{host="lost"}') == 3),
        ('lost: instance:nvidia_gpu_down:count 1', one('instance:nvidia_gpu_down:count{host="lost"}') == 1),
        ('lost: instance_reason:nvidia_gpu_down_reason:count{reason="gpu_lost"} 1',
         one('instance_reason:nvidia_gpu_down_reason:count{host="lost",reason="gpu_lost"}') == 1),
        # demo-h100x8: GPU 0 busy 9 samples of 10 and 70 % in the tenth, GPU 5 idle.
        (f"healthy: window utilization of all 8 GPUs, GPU 0 about 0.97, GPU 5 0 {utilization or ''}",
         len(utilization) == 8 and 0.9 <= utilization.get("0", 0) <= 1 and utilization.get("5") == 0),
        ("healthy: a mean utilization for the node",
         one('instance:nvidia_gpu_utilization:avg_ratio_rate5m{host="healthy",engine="gpu"}') is not None),
    ]


def wait_for(stack, what, predicate, deadline):
    while time.monotonic() < deadline:
        stack.check_alive()
        if stack.writer_errors:
            raise SystemExit("exporter runs failed: " + "; ".join(stack.writer_errors[:3]))
        if predicate():
            return True
        time.sleep(0.5)
    print(f"  FAIL timed out waiting for {what}")
    return False


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    exporter, fake, rules = (os.path.abspath(a) for a in argv[1:4])
    timeout = float(argv[4]) if len(argv) > 4 else 90
    started = time.monotonic()
    deadline = started + timeout
    work = tempfile.mkdtemp(prefix="gpu-rules-e2e-")
    stack = Stack(exporter, fake, rules, work)
    failures = 0
    try:
        stack.start()
        # Every host scraped with GPU data (or its error) before the vanishing act.
        ok = wait_for(stack, "all hosts scraped", lambda: len(
            stack.api("/api/v1/query", query="nvidia_gpu_collector_up")["data"]["result"]) == len(HOSTS),
            deadline)
        if not ok:
            return 1
        stack.vanish("vanished")

        state = {}

        def all_met():
            state["checks"] = expectations(alerts_of(stack))
            return all(ok for _, ok in state["checks"])

        met = wait_for(stack, "the expected alerts", all_met, deadline)
        if met:
            # Let a few more evaluations pass: what must not fire must stay quiet.
            time.sleep(3)
            met = all_met()
        checks = state["checks"]

        def recorded_met():
            state["recorded"] = recorded_expectations(stack)
            return all(ok for _, ok in state["recorded"])

        wait_for(stack, "the expected recorded series", recorded_met, deadline)
        checks += state["recorded"]
        for description, ok in checks:
            print(f"  {'ok  ' if ok else 'FAIL'} {description}")
            failures += not ok
        seen = summarize(alerts_of(stack))
        print(f"  {len(seen)} alerts pending or firing:")
        for host, alertname, gpu, reason, state in seen:
            print(f"      {host:9} {alertname:32} {'gpu ' + gpu if gpu else '':6} {reason:18} {state}")

        # Rules must evaluate cleanly on real data (a many-to-many match, say, only shows here).
        for group in stack.api("/api/v1/rules")["data"]["groups"]:
            for rule in group["rules"]:
                if rule.get("health") == "err" or rule.get("lastError"):
                    print(f"  FAIL rule {rule['name']}: {rule.get('lastError')}")
                    failures += 1

        # Dashboard: each query evaluates; each variable has values.
        listing = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), "dashboard-queries"],
                                 capture_output=True, text=True, check=True)
        dashboard = json.loads(listing.stdout)
        empty = []
        for query in dashboard["queries"]:
            answer = stack.api("/api/v1/query", query=query["expr"])
            if answer.get("status") != "success":
                print(f"  FAIL {query['where']}: {answer.get('error')}")
                failures += 1
            elif not answer["data"]["result"]:
                empty.append(query["where"])
        for variable in dashboard["variables"]:
            answer = stack.api(f"/api/v1/label/{variable['label']}/values", **{"match[]": variable["selector"]})
            if answer.get("status") != "success" or not answer["data"]:
                print(f"  FAIL variable {variable['name']}: no values ({answer.get('error', 'empty')})")
                failures += 1
        print(f"  {len(dashboard['queries'])} dashboard queries evaluated, "
              f"{len(dashboard['variables'])} variables have values")
        if empty:
            print(f"  (no data here, as expected for counters that do not move or states no scenario has: "
                  f"{len(empty)}: {'; '.join(empty)})")
    finally:
        stack.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    print(f"  end to end took {time.monotonic() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
