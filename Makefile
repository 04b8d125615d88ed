# nvidia-textfile-exporter — see README.md.
CARGO ?= cargo
BIN := target/release/nvidia-textfile-exporter
FAKE_NVML := target/debug/libfake_nvml.so
SCENARIO ?= tests/scenarios/demo-h100x8.toml

.PHONY: build deps test demo run lint deb bench test-packaging test-arm64 copyright \
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
## so every run shows the utilization since the previous one); writes demo/nvidia_gpu.prom
demo: build
	mkdir -p demo
	FAKE_NVML_SCENARIO=$(SCENARIO) $(BIN) --nvml-lib $(FAKE_NVML) --output-dir demo --state-dir demo/state
	cat demo/nvidia_gpu.prom

## run: one snapshot of this host's real GPUs, printed
run:
	$(CARGO) build --release --locked
	$(BIN) --stdout

## lint: formatting and clippy (make test runs both too)
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## deb: the Debian package, in target/deb/ (its path is printed last);
## ARCH=arm64 cross-builds the arm64 one (needs what `tests/install-deps.sh --arm64` installs)
ARCH ?=
deb:
	CARGO="$(CARGO)" DEB_ARCH="$(ARCH)" packaging/build-deb.sh

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
