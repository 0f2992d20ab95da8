#!/usr/bin/env bash
# Memory of client tracking (issue 18): pgline's resident memory before and after CLIENTS RESP3
# tracking clients each read every one of ROWS rows (so CLIENTS x ROWS (key, client) pairs in the
# core's tracking table), the store already warm. Prints the bytes per pair.
#
#   bench/tracking_memory.sh                 # 200,000 rows x 5 clients = 1,000,000 pairs
#   ROWS=20000 CLIENTS=2 bench/tracking_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-200000}
CLIENTS=${CLIENTS:-5}
PORT=${PORT:-6397}
CACHE=bench/.cache
mkdir -p "$CACHE"

deploy/lab/setup.sh >/dev/null
eval "$(deploy/lab/pg.sh env)"
PY="$(deploy/lab/pgwire_venv.sh)"
DB=pgline_tracking_mem
DSN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
psql -q -d postgres -tA -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 \
    || psql -q -d postgres -c "CREATE DATABASE $DB"
psql -q -d $DB <<SQL
SET client_min_messages = warning;
DROP TABLE IF EXISTS items;
CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL);
INSERT INTO items SELECT g, 0 FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE items;
SQL

cargo build --release -q -p pgline-controlplane -p pgline-bench # one feature set for every script (bench/README.md)
cleanup() {
    kill "$PID" 2>/dev/null || true
    wait 2>/dev/null || true
    deploy/lab/pg.sh drop-slot pgline_tracking_mem || true
}
target/release/pgline serve --origin "$DSN" --listen "127.0.0.1:$PORT" --cores 1 --memory 512MiB \
    --set replication.slot='"pgline_tracking_mem"' --set replication.publication='"pgline_tracking_mem"' \
    --set resp.tracking_table_max_keys=$((ROWS * CLIENTS)) \
    --set log.level='"warn"' >"$CACHE/tracking-memory.log" 2>&1 &
PID=$!
trap cleanup EXIT
for _ in $(seq 1 300); do redis-cli -p $PORT INFO replication 2>/dev/null | grep -q 'serving_hits:1' && break; sleep 0.1; done

"$PY" - "$PORT" "$ROWS" "$CLIENTS" "$PID" <<'PY'
import sys
import redis

port, rows, clients, pid = (int(a) for a in sys.argv[1:])

def rss_kib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def read_all(r):
    for lo in range(1, rows + 1, 1000):
        keys = [f"items:{i}" for i in range(lo, min(lo + 1000, rows + 1))]
        assert all(v is not None for v in r.mget(keys))

plain = redis.Redis(port=port, protocol=3)
for _ in range(2):  # fills, then hits: the store and the connection buffers are at size
    read_all(plain)
before = rss_kib()
trackers = []
for _ in range(clients):
    r = redis.Redis(port=port, protocol=3, single_connection_client=True)
    r.execute_command("CLIENT", "TRACKING", "ON")
    read_all(r)
    trackers.append(r)
after = rss_kib()
pairs = int(plain.info("stats")["tracking_total_keys"])
assert pairs == rows * clients, pairs
print(f"rows={rows} clients={clients} pairs={pairs} rss_before={before} KiB rss_after={after} KiB "
      f"bytes_per_pair={(after - before) * 1024 / pairs:.0f} (keys like items:123456, 12 bytes)")
PY
