#!/usr/bin/env bash
# Start (or stop) a throw-away PostgreSQL origin for pgline's tests, demo and benchmarks.
#
#   deploy/lab/pg.sh start    # initdb if needed, start on 127.0.0.1:$PGLINE_PG_PORT
#   deploy/lab/pg.sh init     # initdb only (a wrapper edits the cluster's files, then starts it)
#   deploy/lab/pg.sh stop
#   deploy/lab/pg.sh env      # print the connection settings as shell exports
#   deploy/lab/pg.sh drop-slot NAME   # drop a replication slot once its walsender is gone
#
# The cluster lives in $PGLINE_PG_DIR (default /var/tmp/pgline-pg), listens only on loopback,
# has wal_level=logical, loads pg_stat_statements (for `pgline advise`; a cluster made before
# that gets the setting and one restart on its next `start`), and its superuser `postgres` has
# the password `pgline`.
set -euo pipefail

PG_DIR=${PGLINE_PG_DIR:-/var/tmp/pgline-pg}
PG_PORT=${PGLINE_PG_PORT:-54329}
PG_PASSWORD=${PGLINE_PG_PASSWORD:-pgline}
PG_BIN=${PGLINE_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

init() {
    if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
        echo "pg.sh: PostgreSQL server binaries not found; install the 'postgresql' package" >&2
        exit 1
    fi
    if [ ! -f "$PG_DIR/PG_VERSION" ]; then
        mkdir -p "$PG_DIR"
        [ "$(id -u)" = 0 ] && chown postgres:postgres "$PG_DIR"
        local pwfile
        pwfile=$(mktemp)
        echo "$PG_PASSWORD" > "$pwfile"
        [ "$(id -u)" = 0 ] && chown postgres "$pwfile"
        as_postgres "$PG_BIN/initdb" -D "$PG_DIR" -U postgres --pwfile="$pwfile" \
            --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
        rm -f "$pwfile"
        cat >> "$PG_DIR/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '/tmp'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
max_connections = 300
shared_buffers = 256MB
fsync = off
synchronous_commit = on
timezone = 'UTC'
log_min_messages = warning
shared_preload_libraries = 'pg_stat_statements'
CONF
        # PostgreSQL 18 warns on every md5 login and md5 password; the lab's tests compare
        # message sequences across versions.
        if [ "$("$PG_BIN/postgres" --version | sed -E 's/.* ([0-9]+).*/\1/')" -ge 18 ]; then
            echo "md5_password_warnings = off" >> "$PG_DIR/postgresql.conf"
        fi
        echo "host replication all 127.0.0.1/32 scram-sha-256" >> "$PG_DIR/pg_hba.conf"
    fi
}

# Adds pg_stat_statements to a cluster initialized before the lab loaded it; true if it did.
add_preload() {
    grep -q "^shared_preload_libraries" "$PG_DIR/postgresql.conf" && return 1
    echo "shared_preload_libraries = 'pg_stat_statements'" >> "$PG_DIR/postgresql.conf"
}

start() {
    init
    local added=0
    add_preload && added=1
    if as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR" status >/dev/null 2>&1; then
        if [ $added = 1 ]; then
            as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR" -l "$PG_DIR/server.log" -w -m fast restart >/dev/null
            echo "pg.sh: restarted on port $PG_PORT to load pg_stat_statements"
        else
            echo "pg.sh: already running on port $PG_PORT"
        fi
    else
        as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR" -l "$PG_DIR/server.log" -w start >/dev/null
        echo "pg.sh: started on 127.0.0.1:$PG_PORT (data in $PG_DIR)"
    fi
}

stop() {
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR" -m fast stop >/dev/null 2>&1 || true
}

# A benchmark's slot goes with the benchmark: pgline's slots are permanent by design (a
# restart resumes from them), so one left behind holds the origin's WAL from then on. Waits up
# to 10 s for the slot's walsender to go after its pgline stopped.
drop_slot() {
    [[ "$1" =~ ^[a-z0-9_]+$ ]] || { echo "pg.sh: bad slot name: $1" >&2; return 2; }
    local sql="SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$1'"
    for _ in $(seq 1 100); do
        [ "$(as_postgres psql -h /tmp -p "$PG_PORT" -U postgres -d postgres -qtA -c "$sql")" = 0 ] \
            && return 0
        as_postgres psql -h /tmp -p "$PG_PORT" -U postgres -d postgres -qtA -c \
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
             WHERE slot_name = '$1' AND NOT active" >/dev/null 2>&1 || true
        sleep 0.1
    done
    echo "pg.sh: replication slot $1 is still in use; not dropped" >&2
    return 1
}

case "${1:-start}" in
    start) start ;;
    init) init ;;
    stop) stop ;;
    drop-slot) drop_slot "${2:?usage: $0 drop-slot NAME}" ;;
    env)
        echo "export PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=postgres PGPASSWORD=$PG_PASSWORD"
        ;;
    *) echo "usage: $0 start|init|stop|env|drop-slot NAME" >&2; exit 2 ;;
esac
