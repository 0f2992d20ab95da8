#!/usr/bin/env bash
# Builds pgline_<version>_amd64.deb from the workspace with dpkg-deb (no extra tool): the pgline
# binary built with the dpdk feature, the systemd units, the commented /etc/pgline/pgline.toml,
# the service user (systemd-sysusers) and the docs. Depends: computed by dpkg-shlibdeps from the
# binary's libraries, plus the DPDK PMD plugins the appliance uses (loaded at run time, so not
# seen by dpkg-shlibdeps).
#
#   deploy/package/build-deb.sh [--binary PATH] [--out DIR]
#
# Without --binary it runs `cargo build --release -p pgline-controlplane --features dpdk`
# (CARGO_TARGET_DIR is honoured). Prints the .deb's path on the last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
binary=""
out="${CARGO_TARGET_DIR:-$root/target}/deb"
while [ $# -gt 0 ]; do
    case "$1" in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--binary PATH] [--out DIR]" >&2; exit 2 ;;
    esac
done
if [ -z "$binary" ]; then
    cargo build --release -p pgline-controlplane --features dpdk --bin pgline >&2
    binary="${CARGO_TARGET_DIR:-$root/target}/release/pgline"
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg="$stage/pkg"
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/lib/pgline" "$pkg/lib/systemd/system" \
    "$pkg/usr/lib/sysusers.d" "$pkg/etc/pgline" "$pkg/usr/share/doc/pgline"
install -m 755 "$binary" "$pkg/usr/bin/pgline"
# The release profile keeps line tables (debug = 1): strip them for the package.
strip --strip-debug "$pkg/usr/bin/pgline"
install -m 755 deploy/package/pgline-run "$pkg/usr/lib/pgline/pgline-run"
install -m 644 deploy/package/pgline.service deploy/package/pgline-nic-bind.service \
    "$pkg/lib/systemd/system/"
install -m 644 deploy/package/sysusers.conf "$pkg/usr/lib/sysusers.d/pgline.conf"
install -m 640 deploy/package/pgline.toml "$pkg/etc/pgline/pgline.toml"
for d in docs/*.md; do install -m 644 "$d" "$pkg/usr/share/doc/pgline/"; done
install -m 644 LICENSE* "$pkg/usr/share/doc/pgline/" 2>/dev/null || true
install -m 755 deploy/package/postinst deploy/package/prerm deploy/package/postrm "$pkg/DEBIAN/"
echo /etc/pgline/pgline.toml >"$pkg/DEBIAN/conffiles"

# Library dependencies, the Debian way (dpkg-shlibdeps wants a debian/control next to it).
mkdir -p "$stage/src/debian"
printf 'Source: pgline\n\nPackage: pgline\nArchitecture: any\n' >"$stage/src/debian/control"
shlibs=$(cd "$stage/src" && dpkg-shlibdeps -O "$pkg/usr/bin/pgline" 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
# PMDs dlopen()ed by the EAL from the plugin directory: virtio (the appliance's default NIC),
# the ring mempool driver every PMD needs, and the PCI bus.
depends="$shlibs, librte-net-virtio23, librte-mempool-ring23, librte-bus-pci23, kmod, systemd"
size=$(du -sk "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<CONTROL
Package: pgline
Version: $version
Architecture: $arch
Maintainer: pgline maintainers <pgline@localhost>
Installed-Size: $size
Depends: $depends
Recommends: dpdk
Section: database
Priority: optional
Homepage: https://github.com/pgline/pgline
Description: PostgreSQL read cache (Redis and PostgreSQL protocols, WAL-coherent)
 pgline serves rows of PostgreSQL tables over the Redis protocol and answers cacheable
 PostgreSQL-protocol reads from memory, kept coherent by logical replication. Built with
 the DPDK client transport; kernel sockets by default.
CONTROL
# Reproducible: the same binary and packaging files give the same .deb (the image cache is keyed
# by its hash). File times = the last commit of the packaging files.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct -- deploy/package 2>/dev/null || echo 1700000000)}
find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$out"
deb="$out/pgline_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >&2
echo "$deb"
