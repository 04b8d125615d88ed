#!/usr/bin/env bash
# Installs what `make test` needs and is missing (Debian 12). As root it runs
# apt-get install for the missing packages; otherwise it prints the command and
# exits 1. Run by `make test` before anything else; `--check` only reports.
# `--arm64` adds what `make test-arm64` needs: Rust's aarch64 target (rustup),
# the cross compiler, Debian's arm64 C library (a foreign architecture for dpkg)
# and qemu-user.
set -euo pipefail

check_only=false
arm64=false
for arg in "$@"; do
    case "$arg" in
        --check) check_only=true ;;
        --arm64) arm64=true ;;
        *) echo "usage: $0 [--check] [--arm64]" >&2; exit 2 ;;
    esac
done

# command  Debian package that provides it (what the tests run)
needs=(
    promtool prometheus
    prometheus prometheus
    prometheus-node-exporter prometheus-node-exporter
    lintian lintian
    shellcheck shellcheck
    debootstrap debootstrap
    systemd-nspawn systemd-container
    systemd-analyze systemd
    crontab cron
    curl curl
    dpkg-buildpackage dpkg-dev
    dpkg-shlibdeps dpkg-dev
    dpkg-parsechangelog dpkg-dev
    dh debhelper
    flock util-linux
    runuser util-linux
    nsenter util-linux
    unshare util-linux
    setpriv util-linux
    strip binutils
    cc gcc
    python3 python3
    /lib/systemd/systemd-journal-remote systemd-journal-remote
)

if $arm64; then
    needs+=(
        aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
        aarch64-linux-gnu-strip binutils-aarch64-linux-gnu
        qemu-aarch64-static qemu-user-static
        readelf binutils
    )
fi

missing=()
add() { [[ " ${missing[*]} " == *" $1 "* ]] || missing+=("$1"); }
installed() { dpkg-query -W -f '${Status}' "$1" 2>/dev/null | grep -q ' installed$'; }
for ((i = 0; i < ${#needs[@]}; i += 2)); do
    command -v "${needs[i]}" >/dev/null || add "${needs[i + 1]}"
done
python3 -c 'import yaml' 2>/dev/null || add python3-yaml
# An NSS module other than files, for the user-name test (tests/e2e/nss-users.sh).
installed libnss-extrausers || add libnss-extrausers
foreign=
if $arm64; then
    # The C runtime the cross linker links against, and the arm64 C library that
    # dpkg-shlibdeps reads Depends from and qemu-user runs the binary with.
    installed libc6-dev-arm64-cross || add libc6-dev-arm64-cross
    installed libc6:arm64 || add libc6:arm64
    dpkg --print-foreign-architectures | grep -qx arm64 || foreign=arm64
fi

if ! command -v cargo >/dev/null; then
    echo "install-deps: cargo is missing; install Rust (rust-version in Cargo.toml) with rustup" >&2
    exit 1
fi
# Rust's aarch64 target is added with rustup, after the packages.
rust_target=
if $arm64 && ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    rust_target=aarch64-unknown-linux-gnu
fi
if [ ${#missing[@]} -gt 0 ]; then
    if $check_only || [ "$(id -u)" -ne 0 ]; then
        echo "install-deps: missing packages; as root run:" >&2
        [ -z "$foreign" ] || echo "  dpkg --add-architecture $foreign && apt-get update" >&2
        echo "  apt-get install --no-install-recommends ${missing[*]}" >&2
        [ -z "$rust_target" ] || echo "install-deps: and the Rust target: rustup target add $rust_target" >&2
        exit 1
    fi
    echo "install-deps: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    [ -z "$foreign" ] || dpkg --add-architecture "$foreign"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -n "$rust_target" ]; then
    if $check_only; then
        echo "install-deps: missing Rust target; run: rustup target add $rust_target" >&2
        exit 1
    fi
    command -v rustup >/dev/null ||
        { echo "install-deps: the $rust_target target needs rustup (rustup target add $rust_target)" >&2; exit 1; }
    echo "install-deps: rustup target add $rust_target" >&2
    rustup target add "$rust_target" >&2
fi
