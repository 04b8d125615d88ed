#!/bin/bash
# Builds the Debian package with dpkg-buildpackage -b and prints the path of
# the .deb on the last line of stdout (all else goes to stderr).
#
#   packaging/build-package.sh                 # what `make deb` runs
#   DEB_ARCH=arm64 packaging/build-package.sh  # `make deb ARCH=arm64`: dpkg-buildpackage -aarm64
#
# dpkg-buildpackage wants debian/ at the root of the source tree and writes the
# .deb into the directory above it. So the source tree is a build tree under
# DEB_OUT_DIR: a copy of the repository (its links resolved, target/ left out)
# with packaging/debian as debian/, so that what the build writes stays out of
# the repository. Only Cargo.toml is a link: debian/rules builds the workspace
# it points to, so cargo reuses the repository's target/.
#
# Environment:
#   DEB_ARCH     Debian architecture of the package: amd64 or arm64 (default: this
#                machine's). Another is cross-built: tests/install-deps.sh --arm64
#                installs what that needs.
#   DEB_VERSION  full Debian version (default: the newest in packaging/debian/changelog);
#                another one gets a changelog entry of its own in the build tree
#                (the package tests build the next revision to upgrade to)
#   DEB_OUT_DIR  where the .deb goes (default: target/deb)
#   CARGO        cargo command (default: cargo), for debian/rules
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
package=nvidia-textfile-exporter
out_dir=${DEB_OUT_DIR:-$root/target/deb}
build_arch=$(dpkg --print-architecture)
arch=${DEB_ARCH:-$build_arch}
changelog=$root/packaging/debian/changelog
newest=$(dpkg-parsechangelog -l "$changelog" -S Version)
version=${DEB_VERSION:-$newest}
log() { printf 'build-package: %s\n' "$*" >&2; }

cargo_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
case "$version" in
    "$cargo_version"-*) ;;
    *) log "version $version does not start with Cargo.toml's version $cargo_version-"; exit 1 ;;
esac

build=$out_dir/build
tree=$build/$package-$cargo_version
rm -rf "$build"
mkdir -p "$tree"
for entry in "$root"/*; do
    case ${entry##*/} in target | demo | debian | Cargo.toml) continue ;; esac
    cp -rL "$entry" "$tree/"
done
ln -s "$root/Cargo.toml" "$tree/Cargo.toml"
cp -rL "$root/packaging/debian" "$tree/debian"
if [ "$version" != "$newest" ]; then
    {
        printf '%s (%s) unstable; urgency=medium\n\n' "$package" "$version"
        printf '  * Rebuilt from the %s sources.\n\n' "$cargo_version"
        # A day after the newest entry: a date of its own (lintian), the same every build.
        printf ' -- %s  %s\n\n' "$(dpkg-parsechangelog -l "$changelog" -S Maintainer)" \
            "$(date -u -R -d "$(dpkg-parsechangelog -l "$changelog" -S Date) + 1 day")"
        cat "$changelog"
    } >"$tree/debian/changelog"
fi

options=(-b --no-sign)
[ "$arch" = "$build_arch" ] || options+=(-a"$arch")
log "dpkg-buildpackage ${options[*]} ($package $version, $arch) in $tree"
(cd "$tree" && dpkg-buildpackage "${options[@]}") >&2

deb=$out_dir/${package}_${version}_${arch}.deb
mv "$build/${package}_${version}_${arch}.deb" "$deb"
log "built $deb"
echo "$deb"
