#!/bin/bash
# Builds the Debian package from a staging tree with dpkg-deb (no debhelper, no
# cargo-deb) and prints the path of the .deb on the last line of stdout.
#
#   packaging/build-deb.sh            # what `make deb` runs
#   DEB_ARCH=arm64 packaging/build-deb.sh   # `make deb ARCH=arm64`: cross-built
#
# Environment:
#   DEB_ARCH         Debian architecture of the package: amd64 or arm64 (default:
#                    this machine's). Another one than this machine's is
#                    cross-compiled (rustup target add aarch64-unknown-linux-gnu;
#                    gcc-aarch64-linux-gnu and libc6-dev-arm64-cross link it,
#                    binutils-aarch64-linux-gnu strips it) and its Depends come from that
#                    architecture's C library, which dpkg-shlibdeps reads from the
#                    dpkg database: dpkg --add-architecture arm64, apt-get install
#                    libc6:arm64. The man page is rendered by a build for this
#                    machine (it is the same on every architecture).
#   DEB_VERSION      full Debian version (default: Cargo.toml's version + "-1");
#                    the package tests build a higher one (e.g. 0.1.0-2) to upgrade
#   DEB_MAINTAINER   Maintainer: field (default: the one in packaging/debian/changelog)
#   DEB_OUT_DIR      where the .deb goes (default: target/deb)
#   CARGO            cargo command (default: cargo)
#   CARGO_BUILD_FLAGS  extra flags for cargo build (default: --locked)
#   SOURCE_DATE_EPOCH  timestamp of every file (default: the last commit's)
#
# Needs: cargo, python3, dpkg-dev (dpkg-shlibdeps, dpkg-parsechangelog), binutils, gzip;
# for another architecture also the cross toolchain and C library named above.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

package=nvidia-textfile-exporter
cargo=${CARGO:-cargo}
out_dir=${DEB_OUT_DIR:-$root/target/deb}
staging=$out_dir/staging
work=$out_dir/work

log() { printf 'build-deb: %s\n' "$*" >&2; }

umask 022
export LC_ALL=C.UTF-8 TZ=UTC

# ---- version, date --------------------------------------------------------
cargo_version=$(python3 - <<'EOF'
import tomllib
with open("Cargo.toml", "rb") as f:
    print(tomllib.load(f)["package"]["version"])
EOF
)
version=${DEB_VERSION:-$cargo_version-1}
case "$version" in
    "$cargo_version"-*) ;;
    *) log "DEB_VERSION=$version does not start with Cargo.toml's version $cargo_version-"; exit 1 ;;
esac
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || true)
    if [ -z "$SOURCE_DATE_EPOCH" ]; then
        SOURCE_DATE_EPOCH=$(date -d "$(dpkg-parsechangelog -l packaging/debian/changelog -S Date)" +%s)
    fi
fi
export SOURCE_DATE_EPOCH
build_arch=$(dpkg --print-architecture)
arch=${DEB_ARCH:-$build_arch}
# Rust's target for each architecture the package is built for; the GNU
# triplet (for the cross linker and strip) comes from dpkg-architecture.
case "$arch" in
    amd64) rust_target=x86_64-unknown-linux-gnu ;;
    arm64) rust_target=aarch64-unknown-linux-gnu ;;
    *) log "DEB_ARCH=$arch: only amd64 and arm64 are supported"; exit 1 ;;
esac
gnu_type=$(dpkg-architecture -a"$arch" -qDEB_HOST_GNU_TYPE 2>/dev/null)
changelog_maintainer=$(dpkg-parsechangelog -l packaging/debian/changelog -S Maintainer)
maintainer=${DEB_MAINTAINER:-$changelog_maintainer}

# ---- build ------------------------------------------------------------------
# build_binary [CARGO FLAGS]: builds the bin target and prints the path of its
# executable (read from cargo's messages, wherever --target puts it).
build_binary() {
    # shellcheck disable=SC2086 # CARGO_BUILD_FLAGS is a list of flags
    $cargo build --release ${CARGO_BUILD_FLAGS---locked} -p "$package" --bin "$package" \
        --message-format=json-render-diagnostics "$@" >"$work/cargo.json"
    python3 - "$work/cargo.json" "$package" <<'EOF'
import json, sys
path, package = sys.argv[1], sys.argv[2]
messages = [json.loads(line) for line in open(path) if line.startswith("{")]
print(next(m["executable"] for m in messages
           if m.get("reason") == "compiler-artifact"
           and m["target"]["name"] == package and "bin" in m["target"]["kind"]))
EOF
}

rm -rf "$work" "$staging"
mkdir -p "$work" "$staging"
log "cargo build --release (version $version)"
host_binary=$(build_binary)
[ -x "$host_binary" ] || { log "no binary at $host_binary"; exit 1; }
if [ "$arch" = "$build_arch" ]; then
    binary=$host_binary
    strip="strip"
else
    log "cargo build --release --target $rust_target (cross, for $arch)"
    # Cargo reads the linker for a target from this variable; the default is the
    # cross gcc of Debian's gcc-<triplet> package.
    linker_var=CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$rust_target")_LINKER
    export "$linker_var=${!linker_var:-$gnu_type-gcc}"
    command -v "${!linker_var}" >/dev/null ||
        { log "no linker ${!linker_var}: apt-get install gcc-$gnu_type"; exit 1; }
    binary=$(build_binary --target "$rust_target")
    strip=$gnu_type-strip
fi
[ -x "$binary" ] || { log "no binary at $binary"; exit 1; }
man_page=$work/$package.1
"$host_binary" --generate man >"$man_page"

# ---- staging tree -------------------------------------------------------------
doc=$staging/usr/share/doc/$package
install -D -m 0755 "$binary" "$staging/usr/bin/$package"
# What dh_strip does to an executable (the release profile already strips symbols).
"$strip" --remove-section=.comment --remove-section=.note "$staging/usr/bin/$package"
# Units in /usr/lib: Debian 13's lintian rejects /lib (aliased-location: /lib
# is a symlink to usr/lib on merged-/usr systems, which every Debian 12 and 13
# is), Debian 12's accepts both, and systemd reads both.
install -D -m 0644 systemd/$package.service "$staging/usr/lib/systemd/system/$package.service"
install -D -m 0644 systemd/$package.timer "$staging/usr/lib/systemd/system/$package.timer"
# Removes the previous boot's snapshot at boot (systemd-tmpfiles-setup.service).
install -D -m 0644 systemd/$package.tmpfiles "$staging/usr/lib/tmpfiles.d/$package.conf"
install -D -m 0644 packaging/default "$staging/etc/default/$package"
install -D -m 0644 packaging/cron/$package "$doc/examples/cron.d/$package"
install -D -m 0644 packaging/debian/copyright "$doc/copyright"
install -d "$staging/usr/share/man/man1"
gzip -9n <"$man_page" >"$staging/usr/share/man/man1/$package.1.gz"
if [ -f README.md ]; then
    gzip -9n <README.md >"$doc/README.md.gz"
else
    log "warning: no README.md, none packaged"
fi
# Prometheus rules and Grafana dashboards, whichever exist, side by side in
# /usr/share/nvidia-textfile-exporter/.
shopt -s nullglob
for file in packaging/prometheus/*.yml packaging/grafana/*.json; do
    install -D -m 0644 "$file" "$staging/usr/share/$package/${file##*/}"
done
shopt -u nullglob
if [ -f packaging/debian/lintian-overrides ]; then
    install -D -m 0644 packaging/debian/lintian-overrides \
        "$staging/usr/share/lintian/overrides/$package"
fi

# changelog.Debian: packaging/debian/changelog, plus an entry for $version when
# it is not the newest one there (a rebuild with DEB_VERSION, a new Cargo version).
changelog_version=$(dpkg-parsechangelog -l packaging/debian/changelog -S Version)
{
    if [ "$changelog_version" != "$version" ]; then
        printf '%s (%s) unstable; urgency=medium\n\n' "$package" "$version"
        printf '  * Rebuilt from the %s sources.\n\n' "$cargo_version"
        printf ' -- %s  %s\n\n' "$maintainer" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
    fi
    cat packaging/debian/changelog
} | gzip -9n >"$doc/changelog.Debian.gz"

# ---- control area -------------------------------------------------------------
install -d -m 0755 "$staging/DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "packaging/debian/$script" "$staging/DEBIAN/$script"
done
echo "/etc/default/$package" >"$staging/DEBIAN/conffiles"
chmod 0644 "$staging/DEBIAN/conffiles"

# Depends from the shared libraries the binary links (dpkg-shlibdeps wants a
# debian/control to sit in). For another architecture, dpkg-architecture -a
# makes dpkg-shlibdeps look up that architecture's libraries (multiarch paths)
# and their symbols files, which libc6:<arch> installs.
mkdir -p "$work/shlibs/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$package" "$package" \
    >"$work/shlibs/debian/control"
if [ "$arch" != "$build_arch" ] &&
    ! dpkg-query -W -f '${Status}' "libc6:$arch" 2>/dev/null | grep -q ' installed$'; then
    log "Depends for $arch need libc6:$arch: dpkg --add-architecture $arch; apt-get update; apt-get install libc6:$arch"
    exit 1
fi
shlibs=$(cd "$work/shlibs" && dpkg-architecture -a"$arch" -f -c dpkg-shlibdeps -O "$staging/usr/bin/$package")
depends=${shlibs#shlibs:Depends=}
if [ -z "$depends" ] || [ "$depends" = "$shlibs" ]; then
    log "dpkg-shlibdeps said: $shlibs"
    exit 1
fi

installed_size=$(du -s -k --apparent-size --exclude=DEBIAN "$staging" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$installed_size|" -e "s|@DEPENDS@|$depends|" \
    packaging/debian/control >"$staging/DEBIAN/control"
chmod 0644 "$staging/DEBIAN/control"

(cd "$staging" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
    xargs -0 md5sum) >"$staging/DEBIAN/md5sums"
chmod 0644 "$staging/DEBIAN/md5sums"

find "$staging" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

deb=$out_dir/${package}_${version}_${arch}.deb
rm -f "$deb"
dpkg-deb --root-owner-group -Zxz --build "$staging" "$deb" >&2
log "built $deb"
echo "$deb"
