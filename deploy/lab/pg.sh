#!/usr/bin/env bash
# Start (or stop) a throw-away PostgreSQL origin for pgline's tests, demo and benchmarks.
#
#   deploy/lab/pg.sh start    # initdb if needed, start on 127.0.0.1:$PGLINE_PG_PORT
#   deploy/lab/pg.sh stop
#   deploy/lab/pg.sh env      # print the connection settings as shell exports
#
# The cluster lives in $PGLINE_PG_DIR (default /var/tmp/pgline-pg), listens only on loopback,
# has wal_level=logical, and its superuser `postgres` has the password `pgline`.
set -euo pipefail

PG_DIR=${PGLINE_PG_DIR:-/var/tmp/pgline-pg}
PG_PORT=${PGLINE_PG_PORT:-54329}
PG_PASSWORD=${PGLINE_PG_PASSWORD:-pgline}
PG_BIN=${PGLINE_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
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
CONF
        echo "host replication all 127.0.0.1/32 scram-sha-256" >> "$PG_DIR/pg_hba.conf"
    fi
    if as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR" status >/dev/null 2>&1; then
        echo "pg.sh: already running on port $PG_PORT"
    else
        as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR" -l "$PG_DIR/server.log" -w start >/dev/null
        echo "pg.sh: started on 127.0.0.1:$PG_PORT (data in $PG_DIR)"
    fi
}

stop() {
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR" -m fast stop >/dev/null 2>&1 || true
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    env)
        echo "export PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=postgres PGPASSWORD=$PG_PASSWORD"
        ;;
    *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
