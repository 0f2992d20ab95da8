#!/usr/bin/env bash
# Installs what pgline's build, demo and tests need on Debian 12, reserves hugepages and starts
# the lab PostgreSQL origin. Idempotent. Needs root (or sudo) for apt-get and hugepages.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

need=""
for pkg in $(cat deploy/lab/packages.txt); do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    echo "setup: installing$need"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found; install Rust from https://rustup.rs first" >&2
    exit 1
fi

# Hugepages for the store (it falls back to THP or 4 KiB pages when none are reserved).
HUGEPAGES=${PGLINE_HUGEPAGES:-256}
if [ -w /proc/sys/vm/nr_hugepages ] || [ -n "$SUDO" ]; then
    cur=$(cat /proc/sys/vm/nr_hugepages)
    if [ "$cur" -lt "$HUGEPAGES" ]; then
        echo "$HUGEPAGES" | $SUDO tee /proc/sys/vm/nr_hugepages >/dev/null || true
    fi
    if ! grep -q hugetlbfs /proc/mounts; then
        $SUDO mkdir -p /dev/hugepages
        $SUDO mount -t hugetlbfs nodev /dev/hugepages 2>/dev/null || true
    fi
    echo "setup: hugepages reserved: $(cat /proc/sys/vm/nr_hugepages) x $(grep Hugepagesize /proc/meminfo | awk '{print $2 $3}')"
fi

deploy/lab/pg.sh start
