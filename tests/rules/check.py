#!/usr/bin/env python3
"""Static checks of the alerting and recording rules and the Grafana dashboard.

  check.py static BIN             metric names against `BIN --generate families` and the
                                  recorded names; rule and dashboard structure; every
                                  recording rule has a promtool test
  check.py output BIN FAKE_NVML   the same names, labels and label values against what the
                                  exporter really writes for every tests/scenarios/*.toml
                                  (for a recorded series: what its sources carry);
                                  every family's type, HELP and label names as generated
  check.py short-for OUT DUR IN…  one file with the groups of the rule files IN, every
                                  `for:` set to DUR
  check.py dashboard-queries      the dashboard's queries with variables filled in, as JSON

Each check prints one line per problem and exits 1 if there was any.
"""

import atexit
import concurrent.futures
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import exposition  # noqa: E402
import generated  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ALERTS = os.path.join(ROOT, "packaging", "prometheus", "nvidia-gpu-alerts.yml")
RECORDING = os.path.join(ROOT, "packaging", "prometheus", "nvidia-gpu-rules.yml")
RECORDING_TESTS = os.path.join(ROOT, "tests", "rules", "nvidia-gpu-rules.test.yml")
# The dcgm-exporter pack: dcgm-exporter's series names, recorded from ours.
COMPAT = os.path.join(ROOT, "packaging", "prometheus", "dcgm-exporter-compat.yml")
COMPAT_TESTS = os.path.join(ROOT, "tests", "rules", "dcgm-exporter-compat.test.yml")
JOBSTATS = os.path.join(ROOT, "packaging", "prometheus", "jobstats-compat.yml")
JOBSTATS_TESTS = os.path.join(ROOT, "tests", "rules", "jobstats-compat.test.yml")
DCGM_NAME = re.compile(r"DCGM_FI_(DEV|PROF)_[A-Z0-9_]+")
# Prometheus's naming convention for recorded series, level:metric:operations
# (https://prometheus.io/docs/practices/rules/), for this exporter's metrics.
RECORD_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*:nvidia_gpu_[a-z_]+:[a-z0-9_]+")
DASHBOARD = os.path.join(ROOT, "packaging", "grafana", "nvidia-gpu.json")
SCENARIOS = os.path.join(ROOT, "tests", "scenarios")

# Series that do not come from the exporter, by who makes them.
FOREIGN = {
    "node_boot_time_seconds": "node_exporter",
    "node_textfile_mtime_seconds": "node_exporter",
    "node_textfile_scrape_error": "node_exporter",
    "up": "Prometheus",
    "ALERTS": "Prometheus",
}
# Labels that Prometheus adds to every scraped series, labels of node_exporter's
# series, and labels of ALERTS.
TARGET_LABELS = {"instance", "job"}
# Levels of recorded series per task (a Slurm job, a pod) over all its nodes.
TASK_LEVELS = {"slurm_job", "k8s_pod"}
FOREIGN_LABELS = {"file"}
ALERT_LABELS = {"alertname", "alertstate", "severity"}
# Labels whose values come from the kernel log, not from the exporter: any XID or
# SXid number may be selected, logged in a scenario or not.
OPEN_VALUES = {"code": re.compile(r"[0-9]+")}
SEVERITIES = ("critical", "warning", "info")
# A target label the rules document for marking GPU hosts.
# cluster: the label jobstats' scrape configs add to every target.
DOCUMENTED_TARGET_LABELS = {"nvidia_gpu_host", "cluster"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s",
                    "__range_ms", "__from", "__to", "__dashboard", "__user", "__org", "__name",
                    "timeFilter", "__timeFilter", "__all"}
# Values that stand in for the dashboard's variables when a query is sent to Prometheus.
VARIABLE_VALUES = {"job": ".*", "instance": ".*", "gpu": ".*", "__rate_interval": "15s",
                   "__interval": "15s", "__range": "1h"}

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan", "atan2"}

problems = []


def problem(message):
    problems.append(message)
    print("  FAIL " + message)


def finish(what):
    if problems:
        print(f"{what}: {len(problems)} problem(s)")
        sys.exit(1)
    print(f"{what}: ok")


# ---- PromQL, just enough of it ---------------------------------------------

STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:\\.|[^"\\])*")')
GROUPING = re.compile(r'\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)')


def fill_variables(expr):
    """Grafana's $var, ${var} and [[var]] replaced by VARIABLE_VALUES (unknown ones kept)."""
    def value(match):
        name = match.group(1) or match.group(2) or match.group(3)
        name = name.split(":")[0]
        return VARIABLE_VALUES.get(name, match.group(0))
    return re.sub(r'\$\{(\w+(?::\w+)?)\}|\$(\w+)|\[\[(\w+)\]\]', value, expr)


def metric_names(expr):
    """Metric names in a PromQL expression."""
    text = STRING.sub('""', expr)
    text = re.sub(r'\{[^}]*\}', " ", text)
    text = re.sub(r'\[[^\]]*\]', " ", text)
    text = GROUPING.sub(" ", text)
    names = set()
    for match in re.finditer(r'(?<![\w.:$])([A-Za-z_:][\w:]*)(\s*\()?', text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in PROMQL_WORDS:
            continue
        names.add(name)
    return names


def selectors(expr):
    """(metric name, [(label, op, value)]) for each `name{...}` in the expression."""
    found = []
    for match in re.finditer(r'(?<![\w.:])([A-Za-z_:][\w:]*)\s*\{((?:[^{}"]|"(?:\\.|[^"\\])*")*)\}', expr):
        matchers = [(label, op, json.loads(value)) for label, op, value in MATCHER.findall(match.group(2))]
        found.append((match.group(1), matchers))
    return found


def grouping_labels(expr):
    labels = set()
    for match in GROUPING.finditer(STRING.sub('""', expr)):
        labels.update(label.strip() for label in match.group(2).split(",") if label.strip())
    return labels


# ---- sources ---------------------------------------------------------------

def load_rules(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def rule_items():
    """(alert or record name, expr, labels, annotations) for each rule, recording
    rules first."""
    for path in (RECORDING, COMPAT, JOBSTATS, ALERTS):
        for group in load_rules(path)["groups"]:
            for rule in group["rules"]:
                yield (rule.get("alert") or rule.get("record"), rule["expr"], rule.get("labels", {}),
                       rule.get("annotations", {}))


def recording_rules(paths=(RECORDING, COMPAT, JOBSTATS)):
    """{record name: expr}, in the order of the files."""
    return {rule["record"]: rule["expr"] for path in paths
            for group in load_rules(path)["groups"] for rule in group["rules"] if "record" in rule}


WITHOUT = re.compile(r'\bwithout\s*\(([^)]*)\)')
# label_replace(v, "dst", "replacement", "src", "regex"): a label made from another.
COPIED_LABEL = re.compile(r'"(\w+)"\s*,\s*"[^"]*"\s*,\s*"(\w+)"\s*,\s*"[^"]*"\s*\)')
# label_replace(v, "dst", "replacement", "", ""): a constant label added.
CONSTANT_LABEL = re.compile(r'"(\w+)"\s*,\s*"(\w*)"\s*,\s*""\s*,\s*""\s*\)')


def recorded_labels(seen):
    """{record: {label: set(values)}}: the labels a recorded series can carry, from
    what its sources carry in `seen` (or earlier records), less those aggregated
    away with `without`, plus constants set by label_replace and the labels it
    copies."""
    recorded = {}
    for record, expr in recording_rules().items():
        labels = {}
        for source in metric_names(expr):
            for label, values in (recorded.get(source) or seen.get(source) or {}).items():
                labels.setdefault(label, set()).update(values)
        for match in WITHOUT.finditer(expr):
            for label in match.group(1).split(","):
                labels.pop(label.strip(), None)
        for label, value in CONSTANT_LABEL.findall(expr):
            labels.setdefault(label, set()).add(value)
        for label, source in COPIED_LABEL.findall(expr):
            if source in labels:
                labels.setdefault(label, set()).update(labels[source])
        recorded[record] = labels
    return recorded


def load_dashboard():
    with open(DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def all_panels(dashboard):
    for panel in dashboard.get("panels", []):
        yield panel
        for inner in panel.get("panels", []) or []:
            yield inner


def dashboard_queries(dashboard):
    """(where, expr, legend) of every PromQL expression in the dashboard."""
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []) or []:
            if "expr" in target:
                yield (f'panel {panel.get("id")} "{panel.get("title")}" {target.get("refId")}',
                       target["expr"], target.get("legendFormat", ""))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            yield (f'annotation "{annotation.get("name")}"', annotation["expr"],
                   annotation.get("titleFormat", "") + " " + annotation.get("textFormat", ""))


def variable_selectors(dashboard):
    """(variable, label, selector) of each label_values(selector, label) variable."""
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        match = re.fullmatch(r'\s*label_values\((.*),\s*(\w+)\)\s*', query or "")
        if not match:
            problem(f'variable {variable.get("name")}: not a label_values(selector, label) query: {query!r}')
            continue
        yield variable["name"], match.group(2), match.group(1)


def every_expression():
    """(where, expr) of every expression in the rules and the dashboard, variables filled in."""
    for name, expr, _, _ in rule_items():
        yield f"rule {name}", expr
    dashboard = load_dashboard()
    for where, expr, _ in dashboard_queries(dashboard):
        yield f"dashboard {where}", fill_variables(expr)
    for name, _, selector in variable_selectors(dashboard):
        yield f"dashboard variable {name}", fill_variables(selector)


# ---- checks ----------------------------------------------------------------

def check_names(binary):
    families = generated.families(binary)
    recorded = recording_rules()
    used = set()
    for where, expr in every_expression():
        for name in sorted(metric_names(expr)):
            used.add(name)
            if name not in families and name not in FOREIGN and name not in recorded:
                problem(f"{where}: {name} is neither a family the exporter generates "
                        f"nor recorded by {os.path.basename(RECORDING)} or {os.path.basename(COMPAT)}")
    print(f"  {len(used)} metric names used in rules and dashboard; "
          f"{len(families)} families generated, {len(recorded)} recorded")


def check_rules_shape():
    names = set()
    recorded = recording_rules()
    for name, expr, labels, annotations in rule_items():
        if name in names:
            problem(f"rule {name}: defined twice")
        names.add(name)
        if name in recorded:
            # The packs record the names the tools they serve query.
            if not RECORD_NAME.fullmatch(name) and not (DCGM_NAME.fullmatch(name)
                                                        and name in recording_rules((COMPAT,))) \
                    and name not in recording_rules((JOBSTATS,)):
                problem(f"rule {name}: not named level:nvidia_gpu_…:operations")
            continue
        if severity_outputs(labels.get("severity")) - set(SEVERITIES) or not labels.get("severity"):
            problem(f"rule {name}: severity label missing or not critical/warning/info")
        for key in ("summary", "description"):
            if not str(annotations.get(key, "")).strip():
                problem(f"rule {name}: no {key} annotation")


def severity_outputs(value):
    """What a severity label can expand to: itself, or the text between the
    actions of a template that picks one ({{ if … }}warning{{ else }}critical{{ end }})."""
    return {part.strip() for part in re.split(r"\{\{.*?\}\}", str(value or "")) if part.strip()}


def check_recording_tests():
    """Every recording rule is the expression of a promtool test with samples."""
    for rules, path in ((RECORDING, RECORDING_TESTS), (COMPAT, COMPAT_TESTS), (JOBSTATS, JOBSTATS_TESTS)):
        with open(path, encoding="utf-8") as f:
            tests = yaml.safe_load(f)
        tested = set()
        for test in tests.get("tests", []):
            for case in test.get("promql_expr_test", []):
                if case.get("exp_samples"):
                    tested |= metric_names(case["expr"])
        for record in recording_rules((rules,)):
            if record not in tested:
                problem(f"rule {record}: no promql_expr_test with samples in {os.path.basename(path)}")


def check_dashboard():
    dashboard = load_dashboard()
    for key in ("uid", "title", "panels", "templating", "schemaVersion"):
        if key not in dashboard:
            problem(f"dashboard: no {key}")
    if not 36 <= dashboard.get("schemaVersion", 0) <= 41:
        problem(f"dashboard: schemaVersion {dashboard.get('schemaVersion')} is not a current one")
    if dashboard.get("id") is not None:
        problem("dashboard: id must be null so that importing creates a new dashboard")

    variables = {v.get("name"): v for v in dashboard["templating"].get("list", [])}
    datasource = variables.get("datasource")
    if not datasource or datasource.get("type") != "datasource" or datasource.get("query") != "prometheus":
        problem("dashboard: needs a variable `datasource` of type datasource for prometheus")
    for wanted in ("instance", "gpu"):
        if wanted not in variables:
            problem(f"dashboard: no `{wanted}` variable")
    variable_ds = {"type": "prometheus", "uid": "${datasource}"}
    for name, variable in variables.items():
        if variable.get("type") == "query" and variable.get("datasource") != variable_ds:
            problem(f"variable {name}: datasource is not ${{datasource}}")
    list(variable_selectors(dashboard))

    seen_ids = {}
    kinds = {"row", "timeseries", "stat", "table", "gauge", "bargauge", "state-timeline", "text"}
    for panel in all_panels(dashboard):
        pid, title = panel.get("id"), panel.get("title")
        where = f'panel {pid} "{title}"'
        if not isinstance(pid, int):
            problem(f"{where}: id is not an integer")
        elif pid in seen_ids:
            problem(f'{where}: id also used by "{seen_ids[pid]}"')
        seen_ids[pid] = title
        if panel.get("type") not in kinds:
            problem(f"{where}: unexpected type {panel.get('type')}")
        grid = panel.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in ("h", "w", "x", "y")):
            problem(f"{where}: gridPos incomplete")
        elif grid["x"] < 0 or grid["w"] < 1 or grid["x"] + grid["w"] > 24:
            problem(f"{where}: gridPos outside the 24 columns")
        if panel.get("type") in ("row", "text"):
            continue
        if panel.get("datasource") != variable_ds:
            problem(f"{where}: datasource is not ${{datasource}}")
        targets = panel.get("targets") or []
        if not targets:
            problem(f"{where}: no queries")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            problem(f"{where}: refIds missing or repeated: {refs}")
        for target in targets:
            if target.get("datasource", variable_ds) != variable_ds:
                problem(f"{where} {target.get('refId')}: datasource is not ${{datasource}}")
            if not target.get("expr", "").strip():
                problem(f"{where} {target.get('refId')}: empty expr")
    check_overlaps(dashboard)

    # Variables used anywhere must exist.
    text = json.dumps(dashboard)
    for match in re.finditer(r'\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]', text):
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in variables and name not in GRAFANA_BUILTINS:
            problem(f"dashboard: uses ${name}, which is not a variable")
    # Every expression of a GPU panel narrows by the variables.
    for where, expr, _ in dashboard_queries(dashboard):
        for name, matchers in selectors(expr):
            if name in FOREIGN and name != "node_textfile_mtime_seconds":
                continue
            # A task's recorded figures span its nodes: no instance to pick.
            if name.split(":")[0] in TASK_LEVELS:
                continue
            labels = {label for label, _, _ in matchers}
            if "instance" not in labels:
                problem(f"{where}: {name} is not filtered by $instance")


def check_overlaps(dashboard):
    boxes = []
    for panel in dashboard.get("panels", []):
        grid = panel.get("gridPos", {})
        try:
            box = (grid["x"], grid["y"], grid["x"] + grid["w"], grid["y"] + grid["h"])
        except (KeyError, TypeError):
            continue
        for other, title in boxes:
            if box[0] < other[2] and other[0] < box[2] and box[1] < other[3] and other[1] < box[3]:
                problem(f'panel "{panel.get("title")}" overlaps "{title}"')
        boxes.append((box, panel.get("title")))


# ---- against the exporter's real output ------------------------------------

def parse_exposition(name, text, seen, families):
    """Adds {family: {label: set(values)}} of the text to `seen`; checks each
    family's type, HELP and label names against `--generate families`."""
    try:
        samples, meta = exposition.parse_all(text)
    except exposition.ParseError as e:
        problem(f"{name}: {e}")
        return
    for family, (kind, text) in meta.items():
        want = families.get(family)
        if want is None:
            problem(f"{name}: {family} is not a generated family")
        elif (kind, text) != (want.type, want.help):
            problem(f"{name}: {family} has TYPE {kind}, HELP {text!r}; generated: {want.type}, {want.help!r}")
    for series in samples:
        labels = seen.setdefault(series.name, {})
        want = families.get(series.name)
        extra = {k for k, _ in series.labels} - {"gpu", "uuid"} - set(want.labels if want else ())
        if want and extra:
            problem(f"{name}: {series} has labels {sorted(extra)} its family does not declare")
        for label, value in series.labels:
            labels.setdefault(label, set()).add(value)


def temporary_directory(prefix):
    directory = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, directory, True)
    return directory


def xid_journal():
    """A directory with one journal file of this boot's kernel lines: XID 79 for
    00000000:18:00 (GPU 0 of h100x8) and XID 79 for 00000000:EE:00 (no GPU), a
    fatal and a non-fatal NVSwitch SXid, and a GPU fallen off the bus for
    00000000:B3:00 (no GPU)."""
    directory = temporary_directory("xid-journal.")
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip().replace("-", "")
    messages = [f"NVRM: Xid (PCI:0000:{bus}:00): 79, pid=1, name=x, GPU has fallen off the bus."
                for bus in ["18", "ee"]]
    messages += ["nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
                 "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
                 "NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus."]
    export = "".join(
        f"__REALTIME_TIMESTAMP={1700000000000000 + i}\n__MONOTONIC_TIMESTAMP={1000 + i}\n"
        f"_BOOT_ID={boot}\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\n_HOSTNAME=gpu1\n"
        f"MESSAGE={message}\n\n"
        for i, message in enumerate(messages))
    subprocess.run(["/lib/systemd/systemd-journal-remote", f"--output={directory}/system.journal", "-"],
                   input=export, text=True, check=True, capture_output=True)
    return directory


def exporter_output(binary, fake):
    """Runs the exporter on every scenario (hanging ones give up after 2 s), in parallel."""
    # fault-* (hangs, hostile strings) and bench-* scenarios have their own harnesses.
    scenarios = sorted(
        s for s in glob.glob(os.path.join(SCENARIOS, "*.toml"))
        if not os.path.basename(s).startswith(("fault-", "bench-"))
    )
    # --stdout runs only read the state; an absent directory keeps them independent
    # of whatever the host's default state directory holds.
    no_state = ["--state-dir", "/nonexistent/nvidia-textfile-exporter-state"]
    runs = [(os.path.basename(s), [binary, "--nvml-lib", fake, "--stdout", "--timeout", "2s", *no_state, *extra],
             dict(os.environ, FAKE_NVML_SCENARIO=s))
            for s in scenarios for extra in ([], ["--collector", "processes"])]
    # Task series of every kind: the demo node's processes in its /proc and
    # kubelet tree (Slurm jobs, pods, a unit, a container, a user)
    node = os.path.join(ROOT, "tests", "fixtures", "demo-node")
    runs.append(("demo-h100x8.toml with the demo node's tasks",
                 [binary, "--nvml-lib", fake, "--stdout", "--timeout", "2s", *no_state,
                  "--procfs", os.path.join(node, "proc"), "--pod-log-dir", os.path.join(node, "pods"),
                  "--container-log-dir", os.path.join(node, "containers"),
                  "--kubelet-checkpoint", os.path.join(node, "kubelet_internal_checkpoint"),
                  "--job-map", "gpustat:" + os.path.join(node, "gpustat"),
                  "--cgroupfs", os.path.join(node, "cgroup"), "--collector", "jobstats"],
                 dict(os.environ, FAKE_NVML_SCENARIO=os.path.join(SCENARIOS, "demo-h100x8.toml"))))
    # A MIG instance given to a pod (the kubelet's checkpoint): allocation
    # series with gpu_instance_id
    checkpoint = os.path.join(temporary_directory("checkpoint."), "kubelet_internal_checkpoint")
    with open(checkpoint, "w", encoding="utf-8") as f:
        json.dump({"Data": {"PodDeviceEntries": [{
            "PodUID": "0b6a7c52-1d2e-4f3a-8b9c-0d1e2f3a4b5c", "ContainerName": "notebook",
            "ResourceName": "nvidia.com/mig-2g.20gb",
            "DeviceIDs": {"-1": ["MIG-c80e5d37-91a2-5f4b-a6d3-7e1f0b9c8d24"]}}]}}, f)
    runs.append(("h100-mig.toml with a GPU instance given to a pod",
                 [binary, "--nvml-lib", fake, "--stdout", "--timeout", "2s", *no_state,
                  "--kubelet-checkpoint", checkpoint, "--cgroupfs", "/nonexistent"],
                 dict(os.environ, FAKE_NVML_SCENARIO=os.path.join(SCENARIOS, "h100-mig.toml"))))
    # XID series: a journal with an XID for GPU 0 of h100x8 and one for a bus id
    # that no GPU has, SXids and a GPU fallen off the bus, written as journald
    # would (systemd-journal-remote)
    runs.append(("h100x8.toml with XIDs in the journal",
                 [binary, "--nvml-lib", fake, "--stdout", "--timeout", "2s", "--journal-dir", xid_journal(),
                  "--state-dir", temporary_directory("xid-state.")],
                 dict(os.environ, FAKE_NVML_SCENARIO=os.path.join(SCENARIOS, "h100x8.toml"))))
    # a GPU stuck in a call: down with reason timeout, the other GPU as read
    runs.append(("fault-device-hang.toml (GPU 1 hangs)",
                 [binary, "--nvml-lib", fake, "--stdout", "--timeout", "2s", *no_state],
                 dict(os.environ, FAKE_NVML_SCENARIO=os.path.join(SCENARIOS, "fault-device-hang.toml"))))
    # and the reasons the collector writes when NVML cannot even be loaded
    runs.append(("no library", [binary, "--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--stdout", *no_state],
                 dict(os.environ)))

    def run(item):
        name, argv, env = item
        return name, subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    seen, families = {}, generated.families(binary)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for name, result in pool.map(run, runs):
            if not result.stdout.strip():
                problem(f"exporter wrote nothing for {name} (exit {result.returncode}): "
                        f"{result.stderr.strip()[:200]}")
            parse_exposition(name, result.stdout, seen, families)
    print(f"  exporter output of {len(scenarios)} scenarios: {len(seen)} families")
    return seen


def check_output(binary, fake):
    seen = exporter_output(binary, fake)
    recorded = recorded_labels(seen)
    known_labels = TARGET_LABELS | FOREIGN_LABELS | ALERT_LABELS | DOCUMENTED_TARGET_LABELS
    for labels in seen.values():
        known_labels |= set(labels)
    # Labels the rules make from a label the exporter writes (the pack's UUID, modelName, …).
    for _, expr, _, _ in rule_items():
        for _ in range(3):
            known_labels |= {dst for dst, src in COPIED_LABEL.findall(expr) if src in known_labels}
    # Values a rule may compare a label with: the failure reasons the binary
    # defines, every label value the scenarios produced, and the values the
    # recording rules set (the action of instance_gpu:nvidia_gpu_action:state).
    reasons = {row[0] for row in generated.generate(binary, "reasons")}
    literals = set(reasons)
    for labels in list(seen.values()) + list(recorded.values()):
        for values in labels.values():
            literals |= values

    def check_expression(where, expr, used_labels):
        for name in metric_names(expr):
            if name not in FOREIGN and name not in seen and name not in recorded:
                problem(f"{where}: {name} appears in no scenario's output")
        for name, matchers in selectors(expr):
            if name in FOREIGN:
                continue
            family = recorded[name] if name in recorded else seen.get(name, {})
            for label, op, value in matchers:
                if label in TARGET_LABELS:
                    continue
                # `label=""` selects the series without it: always meaningful
                # (the exporter's own, beside a pack's of the same name).
                if op == "=" and not value:
                    continue
                if label not in family:
                    problem(f"{where}: {name} has no label {label!r} in the exporter's output"
                            + (" (recorded from it)" if name in recorded else ""))
                    continue
                # `label!=""` only asks that the label be set.
                values = [value] if op == "=" or (op == "!=" and value) else (
                    value.split("|") if re.fullmatch(r"[\w|]+", value) else [])
                for one in values:
                    if label in OPEN_VALUES and OPEN_VALUES[label].fullmatch(one):
                        continue
                    # A reason the binary defines, which no scenario may produce
                    # (not_enumerated needs a GPU lost before a driver reload).
                    if label == "reason" and one in reasons:
                        continue
                    if one not in family[label]:
                        problem(f"{where}: {name}{{{label}={one!r}}} never appears (seen: "
                                f"{', '.join(sorted(family[label]))})")
        for label in used_labels | grouping_labels(expr):
            if label not in known_labels:
                problem(f"{where}: label {label!r} is on no series")

    for name, expr, _, annotations in rule_items():
        text = " ".join(str(v) for v in annotations.values())
        used = set(re.findall(r"\$labels\.(\w+)", text))
        check_expression(f"rule {name}", expr, used)
        for label, value in re.findall(r'eq \$labels\.(\w+) "(\w+)"', text):
            if value not in literals:
                problem(f'rule {name}: compares {label} with "{value}", which the exporter never writes')
    dashboard = load_dashboard()
    for where, expr, legend in dashboard_queries(dashboard):
        check_expression(f"dashboard {where}", fill_variables(expr),
                         set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)))
    for name, label, selector in variable_selectors(dashboard):
        check_expression(f"dashboard variable {name}", fill_variables(selector), {label})


# ---- helpers for run.sh and e2e.py -----------------------------------------

def short_for(target, duration, sources):
    groups = []
    for source in sources:
        for group in load_rules(source)["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = duration
            groups.append(group)
    with open(target, "w", encoding="utf-8") as f:
        yaml.safe_dump({"groups": groups}, f, allow_unicode=True, sort_keys=False)


def main(argv):
    command = argv[1] if len(argv) > 1 else ""
    if command == "static" and len(argv) == 3:
        check_names(argv[2])
        check_rules_shape()
        check_recording_tests()
        check_dashboard()
        finish("rules and dashboard, static")
    elif command == "output" and len(argv) == 4:
        check_output(argv[2], argv[3])
        finish("rules and dashboard against exporter output")
    elif command == "short-for" and len(argv) >= 5:
        short_for(argv[2], argv[3], argv[4:])
    elif command == "dashboard-queries":
        dashboard = load_dashboard()
        queries = [{"where": where, "expr": fill_variables(expr)}
                   for where, expr, _ in dashboard_queries(dashboard)]
        variables = [{"name": name, "label": label, "selector": fill_variables(selector)}
                     for name, label, selector in variable_selectors(dashboard)]
        json.dump({"queries": queries, "variables": variables}, sys.stdout, indent=1)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv)
