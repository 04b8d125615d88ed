# nvidia-textfile-exporter — see README.md.
CARGO ?= cargo
BIN := target/release/nvidia-textfile-exporter
FAKE_NVML := target/debug/libfake_nvml.so
SCENARIO ?= tests/scenarios/demo-h100x8.toml

.PHONY: build deps test demo run lint deb docs bench test-packaging test-arm64 copyright \
	nspawn-both arm64-package gpu-bundle gpu-check

## build: the release binary and the fake NVML used by tests and the demo
build:
	$(CARGO) build --release --locked
	$(CARGO) build --locked -p fake-nvml -p nvml-capture

## deps: install the Debian packages (and the arm64 cross toolchain) the tests need and are missing (as root)
deps:
	tests/install-deps.sh
	tests/install-deps.sh --arm64

## test: everything CI runs; installs what is missing first (as root)
test: deps
	$(MAKE) build
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) test --workspace --locked
	python3 packaging/copyright.py --check
	python3 docs/generate.py --check $(BIN)
	tests/e2e/node-exporter.sh
	EXPORTER=$(BIN) FAKE_NVML=$(FAKE_NVML) tests/e2e/nss-users.sh
	EXPORTER=$(BIN) FAKE_NVML=$(FAKE_NVML) tests/rules/run.sh
	FAULT_MATRIX_BIN=$(BIN) FAULT_MATRIX_NVML=$(FAKE_NVML) tests/fault-matrix/run.sh
	tests/packaging/host-test.sh
	# The booted containers mostly wait on their timers: the arm64 cross build
	# runs beside them (each part's output printed when it ends). The two
	# containers take turns: side by side, the systemd in one failed to clean up
	# its units' control groups (they share the caller's, --keep-unit).
	$(MAKE) -j2 --output-sync=target nspawn-both arm64-package

## demo: run the real binary against the fake 8x H100 node (its samples follow the wall clock,
## so every run shows the utilization since the previous one), its processes in the small
## /proc and kubelet log tree of tests/fixtures/demo-node (Slurm jobs, pods, a user); writes
## demo/nvidia_gpu.prom and prints one line per GPU and per task from it (run it twice: a
## task's counters grow from the second run on)
DEMO_NODE := tests/fixtures/demo-node
demo: build
	mkdir -p demo
	FAKE_NVML_SCENARIO=$(SCENARIO) $(BIN) --nvml-lib $(FAKE_NVML) --output-dir demo --state-dir demo/state \
		--procfs $(DEMO_NODE)/proc --pod-log-dir $(DEMO_NODE)/pods --container-log-dir $(DEMO_NODE)/containers \
		--kubelet-checkpoint $(DEMO_NODE)/kubelet_internal_checkpoint --dra-checkpoint $(DEMO_NODE)/dra.json \
		--job-map gpustat:$(DEMO_NODE)/gpustat --slurm-hook-dir $(DEMO_NODE)/slurm --cgroupfs $(DEMO_NODE)/cgroup; \
	status=$$?; python3 -c "$$DEMO_SUMMARY" demo/nvidia_gpu.prom $$status

# The demo's summary: per GPU what a person looks at first, read from the
# file the exporter wrote (argv: the file, the run's exit status).
define DEMO_SUMMARY
import re, sys
path, status = sys.argv[1], sys.argv[2]
sample = re.compile(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$$")
label = re.compile(r'([a-z0-9_]+)="((?:[^"\\]|\\.)*)"')
host, gpus, tasks, lines = {}, {}, {}, 0
for line in open(path, encoding="utf-8"):
    lines += 1
    match = sample.match(line.rstrip("\n"))
    if not match:
        continue
    name, labels, value = match.group(1), dict(label.findall(match.group(2) or "")), match.group(3)
    if name == "nvidia_gpu_collector_error" and value == "1":
        host["error"] = labels["reason"]
    elif name == "nvidia_gpu_collector_up":
        host["up"] = value
    elif name.startswith("nvidia_gpu_task_"):
        who = {k: v for k, v in labels.items() if k not in ("gpu", "uuid")}
        task = tasks.setdefault((int(labels["gpu"]), tuple(sorted(who.items()))), {})
        task[name[len("nvidia_gpu_task_"):]] = float(value)
    elif "gpu" in labels and "gpu_instance_id" not in labels and "pid" not in labels:
        gpu = gpus.setdefault(int(labels["gpu"]), {})
        if name == "nvidia_gpu_down_reason" and value == "1":
            gpu["down"] = labels["reason"]
        elif not labels.keys() - {"gpu", "uuid"}:
            gpu[name[len("nvidia_gpu_"):]] = float(value)
def show(gpu, key, scale, unit):
    return f"{gpu[key] * scale:.0f} {unit}" if key in gpu else "-"
print(f"\nexit status {status}; nvidia_gpu_collector_up {host.get('up', '?')}"
      + (f", reason {host['error']}" if "error" in host else "") + f"; {len(gpus)} GPUs")
if gpus:
    print(f"{'gpu':>3}  {'up':>2}  {'util':>5}  {'memory used/total':>20}  {'temp':>6}  {'power':>6}  down reason")
for index, gpu in sorted(gpus.items()):
    memory = "-"
    if "memory_used_bytes" in gpu and "memory_total_bytes" in gpu:
        memory = f"{gpu['memory_used_bytes'] / 2**30:.1f} / {gpu['memory_total_bytes'] / 2**30:.1f} GiB"
    print(f"{index:>3}  {gpu.get('up', 0):>2.0f}  {show(gpu, 'utilization_ratio', 100, '%'):>5}  {memory:>20}  "
          f"{show(gpu, 'temperature_celsius', 1, '°C'):>6}  {show(gpu, 'power_watts', 1, 'W'):>6}  {gpu.get('down', '')}".rstrip())
def named(who):
    who = dict(who)
    for key, show in [("slurm_job_id", "Slurm job {}"), ("k8s_pod_name", "pod {k8s_namespace_name}/{}"),
                      ("k8s_pod_uid", "pod {}"), ("slurm_job_sluid", "Slurm job {}"),
                      ("container_id", "container {:.12}"), ("systemd_unit", "unit {}"), ("user", "user {}")]:
        if key in who:
            return show.format(who[key], **who)
    return "?"
if tasks:
    print(f"\n{'gpu':>3}  {'task':<34}  {'allocated':>9}  {'busy':>8}  {'energy':>10}  {'held':>8}  {'memory':>9}")
for (index, who), task in sorted(tasks.items()):
    memory = f"{task['memory_used_bytes'] / 2**30:.1f} GiB" if "memory_used_bytes" in task else "-"
    allocated = f"{task['allocated_seconds_total']:.1f}s" if "allocated_seconds_total" in task else "-"
    print(f"{index:>3}  {named(who):<34}  {allocated:>9}  {task.get('busy_seconds_total', 0):>7.1f}s  "
          f"{task.get('energy_joules_total', 0):>9.0f}J  {task.get('held_seconds_total', 0):>7.1f}s  {memory:>9}")
print(f"full file: {path} ({lines} lines)")
sys.exit(int(status))
endef
export DEMO_SUMMARY

## run: one snapshot of this host's real GPUs, printed
run:
	$(CARGO) build --release --locked
	$(BIN) --stdout

## lint: formatting and clippy (make test runs both too)
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## deb: the Debian package, built by dpkg-buildpackage -b from packaging/debian,
## in target/deb/ (its path is printed last); ARCH=arm64 cross-builds the arm64
## one, dpkg-buildpackage -aarm64 (needs what `tests/install-deps.sh --arm64` installs)
ARCH ?=
deb:
	CARGO="$(CARGO)" DEB_ARCH="$(ARCH)" packaging/build-package.sh

## docs: regenerate the tables of docs/ that come from the binary (make test checks them)
docs:
	$(CARGO) build --release --locked
	python3 docs/generate.py $(BIN)

## copyright: regenerate packaging/debian/copyright from Cargo.lock (make test checks it)
copyright:
	python3 packaging/copyright.py

## test-packaging: the .deb on this host, then under systemd in booted Debian 12 and 13 containers (root)
test-packaging:
	tests/packaging/host-test.sh
	$(MAKE) nspawn-both

# The booted Debian 12 and 13 containers, one after the other, and the arm64
# package test: the parts make test runs side by side.
nspawn-both:
	tests/packaging/nspawn-test.sh bookworm
	tests/packaging/nspawn-test.sh trixie
arm64-package:
	tests/packaging/arm64-test.sh

## test-arm64: the cross-built arm64 .deb, its binary under qemu-user against the amd64 one
## (installs the cross toolchain first, as root; make test runs it too)
test-arm64:
	tests/install-deps.sh --arm64
	$(MAKE) build
	$(MAKE) arm64-package

## bench: snapshot cost against the fake NVML with real call latencies, and the
## render/publish micro-benchmark (ratios measured side by side; not part of test)
bench: build
	$(CARGO) build --release --locked -p fake-nvml
	python3 benches/snapshot.py --fake target/release/libfake_nvml.so
	$(CARGO) bench --locked --bench render_publish

## gpu-bundle: what gpu-check needs, built here into GPU_DIR (default target/gpu), to carry
## to a GPU host that has no Rust toolchain
GPU_DIR ?= target/gpu
GPULOAD_SRC ?= ../shared/tools/gpuload.c
gpu-bundle:
	$(CARGO) build --release --locked -p nvidia-textfile-exporter -p nvml-capture
	mkdir -p $(GPU_DIR)
	cp $(BIN) target/release/nvml-capture $(GPULOAD_SRC) $(GPU_DIR)/

## gpu-check: the hardware suite on this host's GPU (root, about 6 minutes): every default
## reading against nvidia-smi, every windowed one against a known load's own timeline, and
## NVML captures of the idle and loaded GPU into GPU_DIR; ends with `N passed, M failed`
gpu-check:
	gcc -O2 -o $(GPU_DIR)/gpuload $(GPU_DIR)/gpuload.c -ldl
	python3 tests/gpu/check.py $(GPU_DIR)/nvidia-textfile-exporter $(GPU_DIR)/gpuload \
		$(GPU_DIR)/nvml-capture $(GPU_DIR)
