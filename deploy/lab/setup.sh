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

# Debian's pgbouncer (bench/pgwire-pgbench.sh starts its own, on its own port) comes as a system
# service that its package enables and starts on 127.0.0.1:6432: pgline's default PostgreSQL
# port, which bench/pgwire.sh and the docs use. Stop it and keep it from starting again.
if dpkg -s pgbouncer >/dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then # systemd is PID 1
        for unit in pgbouncer.service pgbouncer.socket; do
            if systemctl is-enabled --quiet "$unit" 2>/dev/null || systemctl is-active --quiet "$unit" 2>/dev/null; then
                echo "setup: stopping and disabling $unit (it listens on 6432)"
                $SUDO systemctl disable --now --quiet "$unit"
            fi
        done
    elif [ -x /etc/init.d/pgbouncer ]; then # no systemd (a container): the SysV script, if it ran
        if /etc/init.d/pgbouncer status >/dev/null 2>&1; then
            echo "setup: stopping the pgbouncer service (it listens on 6432)"
            $SUDO /etc/init.d/pgbouncer stop >/dev/null
        fi
        if ls /etc/rc[2-5].d/S*pgbouncer >/dev/null 2>&1; then
            $SUDO update-rc.d pgbouncer disable >/dev/null 2>&1
        fi
    fi
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
