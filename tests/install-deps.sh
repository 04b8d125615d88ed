#!/usr/bin/env bash
# Installs what `make test` needs and is missing (Debian 12). As root it runs
# apt-get install for the missing packages; otherwise it prints the command and
# exits 1. Run by `make test` before anything else; `--check` only reports.
set -euo pipefail

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
    dpkg-shlibdeps dpkg-dev
    dpkg-parsechangelog dpkg-dev
    flock util-linux
    runuser util-linux
    nsenter util-linux
    strip binutils
    cc gcc
    python3 python3
    /lib/systemd/systemd-journal-remote systemd-journal-remote
)

missing=()
add() { [[ " ${missing[*]} " == *" $1 "* ]] || missing+=("$1"); }
for ((i = 0; i < ${#needs[@]}; i += 2)); do
    command -v "${needs[i]}" >/dev/null || add "${needs[i + 1]}"
done
python3 -c 'import yaml' 2>/dev/null || add python3-yaml
# An NSS module other than files, for the user-name test (tests/e2e/nss-users.sh).
dpkg-query -W -f '${Status}' libnss-extrausers 2>/dev/null | grep -q ' installed$' ||
    add libnss-extrausers

if ! command -v cargo >/dev/null; then
    echo "install-deps: cargo is missing; install Rust (rust-version in Cargo.toml) with rustup" >&2
    exit 1
fi
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "${1:-}" = --check ] || [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages; as root run:" >&2
    echo "  apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
