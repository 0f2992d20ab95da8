#!/usr/bin/env bash
# A throw-away primary + physical standby on loopback, for pgline's failover and
# standby-tailing tests.
#
#   deploy/lab/pair.sh start          # fresh primary and standby (any previous pair is removed)
#   deploy/lab/pair.sh kill-primary   # pg_ctl -m immediate stop on the primary (a crash)
#   deploy/lab/pair.sh promote        # promote the standby, wait until it accepts writes
#   deploy/lab/pair.sh stop           # stop both and remove their data directories
#
# Settings (environment):
#   PGLINE_PAIR_BIN   server bin dir (default: the newest Debian one; PG18: $(deploy/lab/pg18.sh))
#   PGLINE_PAIR_DIR   base dir (default /var/tmp/pgline-pair): primary/ and standby/ under it
#   PGLINE_PAIR_PRIMARY_PORT, PGLINE_PAIR_STANDBY_PORT (default 54340, 54341)
#   PGLINE_PAIR_SYNC_SLOTS  on|off (default on): slot synchronization on PostgreSQL 17+
#
# Both run with wal_level=logical (logical decoding on the standby needs it too). The standby
# streams through the physical slot `pgline_standby` with hot_standby_feedback=on, so the
# primary keeps the catalog rows a logical slot on the standby needs. On 17+ the primary has
# synchronized_standby_slots='pgline_standby' (a failover slot's consumer is never sent WAL
# the standby has not confirmed) and the standby runs the slot-sync worker
# (sync_replication_slots=on; primary_conninfo carries dbname=postgres, which it needs).
# Superuser `postgres`, password `pgline`, as deploy/lab/pg.sh sets up.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${PGLINE_PAIR_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
BASE=${PGLINE_PAIR_DIR:-/var/tmp/pgline-pair}
P1=${PGLINE_PAIR_PRIMARY_PORT:-54340}
P2=${PGLINE_PAIR_STANDBY_PORT:-54341}
SYNC=${PGLINE_PAIR_SYNC_SLOTS:-on}
PASSWORD=pgline
PHYSICAL_SLOT=pgline_standby

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

version() {
    "$BIN/postgres" --version | sed -E 's/.* ([0-9]+).*/\1/'
}

psql_at() {
    # Over the Unix socket (trust); Debian's psql works against every version here.
    local port=$1
    shift
    as_postgres "$BIN/psql" -X -h /tmp -p "$port" -U postgres -d postgres -qtA "$@"
}

ctl() {
    as_postgres "$BIN/pg_ctl" "$@"
}

# Starts the cluster in $1; when it does not come up, prints its log's tail (the data
# directory, and with it the log, is removed when the test's guard drops).
start_cluster() {
    local d=$1
    if ! ctl -D "$d" -l "$d/server.log" -w start >/dev/null; then
        echo "pair.sh: $d did not start; the end of its server.log:" >&2
        tail -n 20 "$d/server.log" >&2 || true
        exit 1
    fi
}

stop() {
    for d in "$BASE/standby" "$BASE/primary"; do
        if [ -f "$d/PG_VERSION" ]; then
            ctl -D "$d" -m immediate stop >/dev/null 2>&1 || true
        fi
    done
    rm -rf "$BASE/primary" "$BASE/standby"
    rmdir "$BASE" 2>/dev/null || true
}

start() {
    [ -x "$BIN/pg_basebackup" ] || { echo "pair.sh: no pg_basebackup in $BIN" >&2; exit 1; }
    [[ "$SYNC" =~ ^(on|off)$ ]] || { echo "pair.sh: PGLINE_PAIR_SYNC_SLOTS must be on|off" >&2; exit 2; }
    stop
    mkdir -p "$BASE"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$BASE"
    local v
    v=$(version)

    PGLINE_PG_BIN="$BIN" PGLINE_PG_DIR="$BASE/primary" PGLINE_PG_PORT="$P1" \
        PGLINE_PG_PASSWORD="$PASSWORD" "$HERE/pg.sh" init
    {
        echo "# pair.sh: primary"
        echo "hot_standby_feedback = on"
        echo "wal_keep_size = '256MB'"
        echo "max_connections = 100"
        echo "shared_buffers = 64MB"
        if [ "$v" -ge 17 ]; then
            echo "synchronized_standby_slots = '$PHYSICAL_SLOT'"
        fi
    } >> "$BASE/primary/postgresql.conf"
    start_cluster "$BASE/primary"
    psql_at "$P1" -c "SELECT pg_create_physical_replication_slot('$PHYSICAL_SLOT')" >/dev/null

    # -R writes standby.signal and primary_conninfo (with the password and dbname, which the
    # slot-sync worker needs), -S sets primary_slot_name.
    as_postgres "$BIN/pg_basebackup" -D "$BASE/standby" -R -X stream -S "$PHYSICAL_SLOT" \
        -c fast -d "host=127.0.0.1 port=$P1 user=postgres password=$PASSWORD dbname=postgres"
    {
        echo "# pair.sh: standby"
        echo "port = $P2"
        echo "hot_standby = on"
        echo "hot_standby_feedback = on"
        if [ "$v" -ge 17 ]; then
            # After a promotion this cluster is the primary, with no standby of its own.
            echo "synchronized_standby_slots = ''"
            echo "sync_replication_slots = $SYNC"
        fi
    } >> "$BASE/standby/postgresql.conf"
    start_cluster "$BASE/standby"
    # Streaming through the physical slot before we call it started.
    for _ in $(seq 1 100); do
        [ "$(psql_at "$P1" -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ] \
            && { echo "pair.sh: primary 127.0.0.1:$P1, standby 127.0.0.1:$P2 (PostgreSQL $v, data in $BASE)"; return 0; }
        sleep 0.1
    done
    echo "pair.sh: the standby never started streaming (see $BASE/standby/server.log)" >&2
    exit 1
}

kill_primary() {
    ctl -D "$BASE/primary" -m immediate stop >/dev/null
}

promote() {
    ctl -D "$BASE/standby" -w promote >/dev/null
    for _ in $(seq 1 100); do
        [ "$(psql_at "$P2" -c "SELECT pg_is_in_recovery()")" = f ] && return 0
        sleep 0.1
    done
    echo "pair.sh: the standby did not leave recovery" >&2
    exit 1
}

case "${1:-}" in
    start) start ;;
    kill-primary) kill_primary ;;
    promote) promote ;;
    stop) stop ;;
    *) echo "usage: $0 start|kill-primary|promote|stop" >&2; exit 2 ;;
esac
