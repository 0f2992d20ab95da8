#!/usr/bin/env bash
# Client-side caching (issue 18): reads/s of a hot key set through redis-py 5.2 (RESP3), with and
# without its client cache, against pgline and against Valkey 9 with cache-aside code, while
# rows change at the origin. Same data, same run, servers pinned to one CPU and the client to
# another.
#
#   bench/tracking.sh            # full run (1,000 hot keys, 20 s per cell, 50 updates/s)
#   bench/tracking.sh --smoke    # CI: 200 hot keys, 3 s per cell
#
# pgline's reads are GETs: its WAL apply invalidates both its store and, through CLIENT
# TRACKING, redis-py's cache. Valkey's are cache-aside: GET, on a miss the row from the origin
# and SET; the writer DELs each key after its UPDATE commits (Valkey invalidates client caches
# only on its own writes). After each cell every hot key read through the client is compared
# with the origin: pgline must have 0 stale rows. bench/tracking.py is the client. Results: a
# Markdown table on stdout, one JSON line per cell in bench/results/tracking.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
HOT=${HOT:-1000}
SECONDS_PER_CELL=${SECONDS_PER_CELL:-20}
RATE=${RATE:-50}
if [ $SMOKE = 1 ]; then HOT=200; SECONDS_PER_CELL=3; fi
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PGLINE_PORT=${PGLINE_PORT:-6395}
VALKEY_PORT=${VALKEY_PORT:-6396}
OUT=bench/results/tracking.jsonl
CACHE=bench/.cache
mkdir -p "$CACHE" bench/results

deploy/lab/setup.sh >/dev/null
eval "$(deploy/lab/pg.sh env)"
PY="$(deploy/lab/pgwire_venv.sh)"
source bench/valkey.sh
valkey_binary

DB=pgline_tracking
DSN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
psql -q -d postgres -tA -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 \
    || psql -q -d postgres -c "CREATE DATABASE $DB"
psql -q -d $DB <<SQL
SET client_min_messages = warning;
DROP TABLE IF EXISTS items;
CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, name text, email text, plan text);
INSERT INTO items SELECT g, 0, 'User number ' || g, 'user' || g || '@example.com',
       (ARRAY['free','pro','team'])[1 + g % 3] FROM generate_series(1, $HOT) g;
VACUUM ANALYZE items;
SQL

cargo build --release -q -p pgline-controlplane -p pgline-bench # one feature set for every script (bench/README.md)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    deploy/lab/pg.sh drop-slot pgline_tracking || true
}
trap cleanup EXIT

taskset -c "$SERVER_CPU" target/release/pgline serve --origin "$DSN" \
    --listen "127.0.0.1:$PGLINE_PORT" --cores 1 --memory 256MiB \
    --set replication.slot='"pgline_tracking"' --set replication.publication='"pgline_tracking"' \
    --set log.level='"warn"' >"$CACHE/tracking-pgline.log" 2>&1 &
PIDS+=($!)
taskset -c "$SERVER_CPU" "$VALKEY_BIN" --port "$VALKEY_PORT" --save '' --appendonly no \
    --io-threads 1 --bind 127.0.0.1 --protected-mode no >"$CACHE/tracking-valkey.log" 2>&1 &
PIDS+=($!)
for port in $PGLINE_PORT $VALKEY_PORT; do
    for _ in $(seq 1 300); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$port" PING >/dev/null || { echo "server on $port did not start"; cat "$CACHE"/tracking-*.log; exit 1; }
done
for _ in $(seq 1 300); do
    redis-cli -p $PGLINE_PORT INFO replication | grep -q 'serving_hits:1' && break; sleep 0.1
done

ENV_JSON=$(printf '{"cpu":"%s","cores":%s,"kernel":"%s","hot_keys":%s,"updates_per_s":%s}' \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(nproc)" "$(uname -r)" "$HOT" "$RATE")
run_cell() { # server port cache
    local server=$1 port=$2 cache=$3 line writes
    local common=(--server "$server" --port "$port" --dsn "$DSN" --hot "$HOT" --seconds "$SECONDS_PER_CELL")
    # Warm the server (and nothing else): one unrecorded pass over the hot set.
    taskset -c "$CLIENT_CPU" "$PY" bench/tracking.py read "${common[@]}" --seconds 0.5 --settle 0 >/dev/null
    "$PY" bench/tracking.py write "${common[@]}" --rate "$RATE" >"$CACHE/tracking-writer.json" &
    local writer=$!
    line=$(taskset -c "$CLIENT_CPU" "$PY" bench/tracking.py read "${common[@]}" --cache "$cache" --settle 1.5)
    wait $writer
    writes=$(sed -n 's/.*"writes": \([0-9]*\).*/\1/p' "$CACHE/tracking-writer.json")
    echo "$line" | "$PY" -c '
import json, sys
c = json.loads(sys.stdin.read())
print("| %s | %s | %s | %s | %.1f %% | %s | %s | %s |" % (c["server"], "yes" if c["client_cache"] else "no",
      "{:,}".format(c["reads_per_s"]), "{:,}".format(c["reads"]), 100 * c["local_share"],
      c["origin_fills"], sys.argv[1], c["stale_after_settle"]))' "$writes"
    echo "$line" | sed "s/^{/{\"bench\":\"tracking\",\"writes\":$writes,\"smoke\":$SMOKE,\"env\":$ENV_JSON,\"at\":\"$(date -u +%FT%TZ)\",/" >>"$OUT"
    if [ "$server" = pgline ] && ! echo "$line" | grep -q '"stale_after_settle": 0'; then
        echo "pgline served a stale row after the writes settled: $line"; exit 1
    fi
}

echo "hot keys=$HOT, ${SECONDS_PER_CELL} s per cell, $RATE updates/s at the origin; server cpu=$SERVER_CPU, client cpu=$CLIENT_CPU"
echo "| server | client cache | reads/s | reads | from the client cache | origin reads by the app | updates | stale after settle |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
run_cell pgline $PGLINE_PORT 0
run_cell pgline $PGLINE_PORT 1
run_cell valkey $VALKEY_PORT 0
run_cell valkey $VALKEY_PORT 1
