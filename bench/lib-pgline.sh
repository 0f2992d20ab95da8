# Sourced by the bench scripts that run their own pgline against the lab origin
# (deploy/lab/pg.sh): start it, wait until it serves, stop it, and clean up on exit.
#
# The caller sets, before calling:
#   ORIGIN        the origin's connection string (libpq keywords);
#   SLOT          the replication slot and publication name, one per script so that two
#                 scripts never share one;
#   PGLINE_PORT, API_PORT, PGWIRE_PORT   the RESP, HTTP API and PostgreSQL ports;
#   TMPD          a scratch directory (removed by bench_cleanup);
#   DB            the origin database (bench_cleanup drops the publication there; pin_origin
#                 finds the postmaster through it);
#   PIN_SERVER    optional, an array: a prefix for pgline's command line (`taskset -c 0`).
# The pid of the running pgline is in PGLINE_PID (empty when none runs).

PGLINE_PID=""

# pgline_serve BIN MEMORY [more `serve` arguments...]: start BIN with a store of MEMORY and
# return once it serves from its store and its PostgreSQL port answers. Exits the script with
# pgline's log when it dies or does not serve within 30 s.
pgline_serve() {
    local bin=$1 memory=$2 pin=()
    shift 2
    if [ -n "${PIN_SERVER+x}" ]; then pin=("${PIN_SERVER[@]}"); fi
    local _
    for _ in $(seq 1 100); do # a previous instance's listeners may take a moment to go
        bench_port_busy "$PGLINE_PORT" || bench_port_busy "$API_PORT" \
            || bench_port_busy "$PGWIRE_PORT" || break
        sleep 0.1
    done
    # A simple command, so that $! is pgline's own pid (taskset execs it).
    "${pin[@]}" "$bin" serve --origin "$ORIGIN" --listen "127.0.0.1:$PGLINE_PORT" --memory "$memory" \
        --set api.listen="\"127.0.0.1:$API_PORT\"" --set pgwire.listen="\"127.0.0.1:$PGWIRE_PORT\"" \
        --set replication.slot="\"$SLOT\"" --set replication.publication="\"$SLOT\"" \
        --set log.level='"warn"' "$@" >"$TMPD/pgline.log" 2>&1 &
    PGLINE_PID=$!
    for _ in $(seq 1 300); do
        kill -0 "$PGLINE_PID" 2>/dev/null || break
        # Alive after both answered: not another process's listener on one of the ports.
        redis-cli -p "$PGLINE_PORT" INFO replication 2>/dev/null | grep -q 'serving_hits:1' \
            && pg_isready -q -h 127.0.0.1 -p "$PGWIRE_PORT" && kill -0 "$PGLINE_PID" 2>/dev/null \
            && return 0
        sleep 0.1
    done
    echo "$(basename "$0"): pgline ($bin) did not start serving; its log:" >&2
    cat "$TMPD/pgline.log" >&2
    exit 1
}

# bench_port_busy PORT: whether something listens on 127.0.0.1:PORT.
bench_port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pgline_stop: stop the running pgline (if any) and drop its slot, which would otherwise hold
# the origin's WAL (a walsender still exiting keeps it active; pg.sh waits for it).
pgline_stop() {
    if [ -n "$PGLINE_PID" ]; then
        kill "$PGLINE_PID" 2>/dev/null || true
        wait "$PGLINE_PID" 2>/dev/null || true
        PGLINE_PID=""
    fi
    deploy/lab/pg.sh drop-slot "$SLOT" >/dev/null || true
}

# bench_cleanup: for `trap bench_cleanup EXIT`: pgline stopped, the pids in BENCH_KILL (a
# PgBouncer, a sampler) stopped, every other child waited for, the publication dropped, TMPD
# removed.
bench_cleanup() {
    local p
    for p in ${BENCH_KILL:-}; do kill "$p" 2>/dev/null || true; done
    pgline_stop
    wait 2>/dev/null || true
    [ -z "${DB:-}" ] || psql -qtA -d "$DB" -c "DROP PUBLICATION IF EXISTS $SLOT" >/dev/null 2>&1 || true
    rm -rf "$TMPD"
}

# pin_origin CPUS: move every process of the lab origin to CPUS (a taskset list); backends
# forked later inherit it from the postmaster (the checkpointer's parent). DB must exist.
pin_origin() {
    local checkpointer postmaster p
    checkpointer=$(psql -qtA -d "$DB" -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'")
    postmaster=$(ps -o ppid= -p "$checkpointer" | tr -d ' ')
    for p in "$postmaster" $(pgrep -P "$postmaster"); do
        taskset -a -p -c "$1" "$p" >/dev/null 2>&1 || true
    done
}
