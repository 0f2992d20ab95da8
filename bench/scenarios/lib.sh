# Shared by bench/scenarios/run.sh: the lab origin, the servers under test and the load generator.
# Sourced, not run. Expects SMOKE, DRY, LOADGEN, OUT_DIR, SCENARIO set by run.sh.

SERVER_CPUS=${SERVER_CPUS:-0}
CLIENT_CPUS=${CLIENT_CPUS:-1}
SERVER_ADDR=${SERVER_ADDR:-127.0.0.1}
PGLINE_PORT=${PGLINE_PORT:-6390}
VALKEY_PORT=${VALKEY_PORT:-6391}
PGLINE="$SERVER_ADDR:$PGLINE_PORT"
VALKEY="$SERVER_ADDR:$VALKEY_PORT"
CACHE=bench/.cache
BENCH=target/release/pgline-bench
PGLINE_BIN=${PGLINE_BIN:-target/release/pgline}
PGLINE_BASE_PORT=${PGLINE_BASE_PORT:-6392}
PGLINE_BASE="$SERVER_ADDR:$PGLINE_BASE_PORT"
PGLINE_PID="" PGLINE_BASE_PID="" VALKEY_PID=""
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ "${SMOKE:-0}" = 1 ] && STAMP="smoke-$STAMP"
JSONL="$OUT_DIR/scenarios-$STAMP.jsonl"
REMOTE_JSONL="pgline-bench-scenarios-$STAMP.jsonl"
REMOTE_ORIGIN="host=$SERVER_ADDR port=${PGLINE_PG_PORT:-54329} user=postgres password=${PGLINE_PG_PASSWORD:-pgline} dbname=pgline_bench"

# Runs (or, with --dry-run, prints) a command; over ssh in two-machine mode.
loadgen() {
    local cmd=("$@")
    if [ -n "$LOADGEN" ]; then
        # The remote has pgline-bench on its PATH (bench/README.md: two machines); it reaches the
        # origin on SERVER_ADDR and appends its rows to a file of its own, fetched at the end.
        local remote=() a
        for a in "${cmd[@]:1}"; do remote+=("${a/#$JSONL/$REMOTE_JSONL}"); done
        cmd=(ssh -o BatchMode=yes "$LOADGEN"
            "PGLINE_BENCH_ORIGIN=$(printf '%q' "$REMOTE_ORIGIN") pgline-bench $(printf '%q ' "${remote[@]}")")
    else
        cmd=(taskset -c "$CLIENT_CPUS" "${cmd[@]}")
    fi
    if [ "$DRY" = 1 ]; then
        printf '%q ' "${cmd[@]}"; echo
    else
        "${cmd[@]}"
    fi
}

lab_prepare() {
    mkdir -p "$CACHE" "$OUT_DIR"
    if [ "$DRY" = 1 ]; then
        echo "# dry run: scenario=$SCENARIO rows=$ROWS duration=$DURATION loadgen=${LOADGEN:-local} out=$JSONL"
        return
    fi
    deploy/lab/setup.sh >/dev/null
    eval "$(deploy/lab/pg.sh env)"
    ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=pgline_bench"
    export PGLINE_BENCH_ORIGIN="$ORIGIN"
    valkey_binary
    cargo build --release -q -p pgline-controlplane -p pgline-bench
}

# Every scenario starts from the same table: ROWS rows (re-created when a previous scenario's
# INSERTs grew it), vacuumed. Called with no server running: re-creating the table under a
# running pgline is a DDL change the scenarios do not measure.
data_reset() {
    [ "$DRY" = 1 ] && return
    servers_stop
    "$BENCH" load --keyspace "$ROWS" >/dev/null
    psql -q -d pgline_bench -c "VACUUM ANALYZE bench_rows"
}

source bench/valkey.sh

cpus_in_set() { # "0-3,6" -> 5
    local n=0 part
    for part in ${1//,/ }; do
        if [[ $part == *-* ]]; then n=$((n + ${part#*-} - ${part%-*} + 1)); else n=$((n + 1)); fi
    done
    echo "$n"
}

# io-threads values to run Valkey at: 1, and the server CPU count when that is more than 1.
valkey_io_threads() {
    local n
    n=$(cpus_in_set "$SERVER_CPUS")
    if [ "$n" -gt 1 ]; then echo "1 $n"; else echo 1; fi
}

wait_port() { # port name pid
    local i
    for i in $(seq 1 300); do
        redis-cli -h "$SERVER_ADDR" -p "$1" PING >/dev/null 2>&1 && return 0
        kill -0 "$3" 2>/dev/null || break
        sleep 0.1
    done
    echo "run.sh: $2 did not start; its log:" >&2
    cat "$CACHE/$2.log" >&2
    exit 1
}

start_pgline() {
    [ "$DRY" = 1 ] && { PGLINE_PID=0; echo "# start pgline on $PGLINE (cpus $SERVER_CPUS)"; return; }
    [ -n "$PGLINE_PID" ] && return
    pgline_launch pgline "$PGLINE_BIN" "$PGLINE_PORT" pgline_scenarios
    PGLINE_PID=$LAUNCHED_PID
}

# The baseline pgline of a before/after (PGLINE_BASE_BIN set): a second instance on its own
# ports and replication slot, measured in the same run, cell by cell, beside the first.
start_pgline_base() {
    [ -z "${PGLINE_BASE_BIN:-}" ] && return
    [ "$DRY" = 1 ] && { PGLINE_BASE_PID=0; echo "# start pgline base on $PGLINE_BASE"; return; }
    [ -n "$PGLINE_BASE_PID" ] && return
    pgline_launch pgline-base "$PGLINE_BASE_BIN" "$PGLINE_BASE_PORT" pgline_scenarios_base \
        --set api.listen="\"$SERVER_ADDR:$((PGLINE_BASE_PORT + 1))\"" \
        --set pgwire.listen="\"$SERVER_ADDR:$((PGLINE_BASE_PORT + 2))\""
    PGLINE_BASE_PID=$LAUNCHED_PID
}

# Starts a pgline (name, binary, RESP port, slot, extra flags), waits until it serves hits and
# every key is warm; sets LAUNCHED_PID.
pgline_launch() {
    local name=$1 bin=$2 port=$3 slot=$4; shift 4
    taskset -c "$SERVER_CPUS" "$bin" serve --origin "$ORIGIN" --listen "$SERVER_ADDR:$port" \
        --cores "$(cpus_in_set "$SERVER_CPUS")" --memory 1GiB \
        --set replication.slot="\"$slot\"" --set replication.publication='"pgline_scenarios"' \
        --set 'catalog.tables=["public.bench_rows"]' \
        --set log.level='"warn"' "$@" >"$CACHE/$name.log" 2>&1 &
    LAUNCHED_PID=$!
    wait_port "$port" "$name" "$LAUNCHED_PID"
    local i
    for i in $(seq 1 300); do
        redis-cli -h "$SERVER_ADDR" -p "$port" INFO replication | grep -q 'serving_hits:1' && break
        sleep 0.1
    done
    # Warm every key (and check them against the origin) before the first cell.
    "$BENCH" stale-check --resp "$SERVER_ADDR:$port" --keyspace "$ROWS" --expect-zero >/dev/null
}

stop_pgline() {
    [ -z "$PGLINE_PID" ] || [ "$PGLINE_PID" = 0 ] && { PGLINE_PID=""; return; }
    kill "$PGLINE_PID" 2>/dev/null || true
    wait "$PGLINE_PID" 2>/dev/null || true
    PGLINE_PID=""
}

stop_pgline_base() {
    [ -z "$PGLINE_BASE_PID" ] || [ "$PGLINE_BASE_PID" = 0 ] && { PGLINE_BASE_PID=""; return; }
    kill "$PGLINE_BASE_PID" 2>/dev/null || true
    wait "$PGLINE_BASE_PID" 2>/dev/null || true
    PGLINE_BASE_PID=""
    [ "$DRY" = 1 ] || deploy/lab/pg.sh drop-slot pgline_scenarios_base || true
}

start_valkey() { # io-threads
    [ "$DRY" = 1 ] && { VALKEY_PID=0; echo "# start valkey io-threads $1 on $VALKEY (cpus $SERVER_CPUS)"; return; }
    stop_valkey
    taskset -c "$SERVER_CPUS" "$VALKEY_BIN" --port "$VALKEY_PORT" --bind "$SERVER_ADDR" --save '' \
        --appendonly no --io-threads "$1" --protected-mode no >"$CACHE/valkey.log" 2>&1 &
    VALKEY_PID=$!
    wait_port "$VALKEY_PORT" valkey "$VALKEY_PID"
}

stop_valkey() {
    [ -z "$VALKEY_PID" ] || [ "$VALKEY_PID" = 0 ] && { VALKEY_PID=""; return; }
    kill "$VALKEY_PID" 2>/dev/null || true
    wait "$VALKEY_PID" 2>/dev/null || true
    VALKEY_PID=""
}

servers_stop() {
    stop_pgline
    stop_pgline_base
    stop_valkey
    [ "$DRY" = 1 ] || deploy/lab/pg.sh drop-slot pgline_scenarios || true
}

# The application's cache-aside state at the start: every row SET, as the reads would leave it.
valkey_prefill() {
    [ "$DRY" = 1 ] && return
    "$BENCH" load --keyspace "$ROWS" --preload "$VALKEY" >/dev/null
}

op_args() { # mget -> --op get|mget --mget N
    if [ "$1" = 1 ]; then echo "--op get --mget 1"; else echo "--op mget --mget $1"; fi
}

bench_run() { # scenario label args...
    local scenario=$1 label=$2; shift 2
    local args=()
    while [ $# -gt 0 ]; do
        # A remote load generator cannot read the servers' /proc: their CPU is not charged.
        if [ -n "$LOADGEN" ] && [ "$1" = --server-pid ]; then shift 2; continue; fi
        args+=("$1"); shift
    done
    local out=/dev/null
    [ "$DRY" = 1 ] && out=/dev/stdout
    loadgen "$BENCH" run --scenario "$scenario" --label "$label" --keyspace "$ROWS" \
        --duration "$DURATION" --warmup "$WARMUP" --settle "${SETTLE:-1s}" --out "$JSONL" \
        "${args[@]}" >"$out"
    [ "$DRY" = 1 ] || tail -1 "$JSONL" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("%-8s %-24s mget=%-3s clients=%-4s keys=%-8s writes=%-9s %10.0f req/s p99=%8.0fus %8.0f writes/s stale=%s" % (r["scenario"], r["label"], r["mget"], r["clients"], r["keys"], r["write_rate"], r["rps"], r["p99_us"], r.get("write_rps") or 0, r.get("stale")))'
}

# Every row complete, and no stale entry served by pgline.
check_rows() {
    if [ -n "$LOADGEN" ]; then
        scp -q -o BatchMode=yes "$LOADGEN:$REMOTE_JSONL" "$JSONL"
    fi
    "$BENCH" check-jsonl --stale-zero-for resp "$JSONL"
    echo "rows: $(wc -l <"$JSONL") in $JSONL"
}
