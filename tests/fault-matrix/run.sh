#!/usr/bin/env bash
# Fault matrix: the real exporter under the faults that need root, mounts, kills
# or a real node_exporter (every other fault is a tests/cli/ case). See
# tests/fault-matrix/README.md.
#   tests/fault-matrix/run.sh [--seed N] [--only SUBSTRING]... [--keep]
# Uses target/release/nvidia-textfile-exporter and target/debug/libfake_nvml.so
# (override with FAULT_MATRIX_BIN / FAULT_MATRIX_NVML); builds them first unless
# FAULT_MATRIX_NO_BUILD=1. The matrix itself (a binary of the workspace crate
# tests/fault-matrix) is always built. Run as root: the mount and node_exporter
# rows need it.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ "${FAULT_MATRIX_NO_BUILD:-0}" != 1 && -z "${FAULT_MATRIX_BIN:-}" ]]; then
    cargo build --quiet --release --locked
    cargo build --quiet --locked -p fake-nvml
fi
cargo build --quiet --locked -p fault-matrix
exec target/debug/fault-matrix "$@"
