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

# The lab's fixed PostgreSQL ports (54329 lab origin, 54331 TLS origin, 54339 PostgreSQL 18,
# 54340-54343 the failover and standby pairs) lie inside Linux's ephemeral range (32768-60999):
# a client connection that happens to get one as its local port keeps a cluster from binding
# it. Reserve them so the kernel never hands them out as ephemeral ports.
if [ -w /proc/sys/net/ipv4/ip_local_reserved_ports ] || [ -n "$SUDO" ]; then
    reserved=$(cat /proc/sys/net/ipv4/ip_local_reserved_ports)
    case ",$reserved," in
        *,54329-54343,*) ;;
        *) echo "${reserved:+$reserved,}54329-54343" | $SUDO tee /proc/sys/net/ipv4/ip_local_reserved_ports >/dev/null || true ;;
    esac
fi

deploy/lab/pg.sh start
