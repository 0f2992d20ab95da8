#!/usr/bin/env bash
# How long a store miss can wait for the writer on a large store: one RESP client GETs keys
# that are not cached (each a miss, filled by the writer), one every 4 ms, while the store holds
# ENTRIES rows of another table. Anything that stops the writer (before 2026-12-06: counting
# entries per table by walking the whole store every 2 s, about 200 ms for 850,000 entries)
# shows as the tail of these misses.
#
#   bench/miss-stall.sh                       # ENTRIES=850000 MISSES=4000, target/release/pgline
#   PGLINE_BIN=/path/to/other/pgline bench/miss-stall.sh    # any build ("before"/"after")
#
# Makes its own database (pgline_stall: stall_warm with ENTRIES rows, stall_probe with MISSES
# rows) on the lab origin (deploy/lab/pg.sh), once. Prints the store and one line: misses, p50,
# p99, p99.9, max and how many took over 10 ms. Ports: PGLINE_PORT (6497, RESP), API_PORT
# (6498), PGWIRE_PORT (6533).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib-pgline.sh
ENTRIES=${ENTRIES:-850000} MISSES=${MISSES:-4000}
PGLINE_PORT=${PGLINE_PORT:-6497} API_PORT=${API_PORT:-6498} PGWIRE_PORT=${PGWIRE_PORT:-6533}
PGLINE_BIN=${PGLINE_BIN:-target/release/pgline}
DB=pgline_stall SLOT=pgline_stall_$PGLINE_PORT
for tool in psql redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "miss-stall.sh: $tool not found" >&2; exit 1; }
done
[ -x "$PGLINE_BIN" ] || cargo build --release -q -p pgline-controlplane
eval "$(deploy/lab/pg.sh env)"
export PGHOST PGPORT PGUSER PGPASSWORD
export PGLINE_API_TOKEN=stall-$RANDOM$RANDOM$RANDOM

psql -qtA -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 \
    || psql -q -d postgres -c "CREATE DATABASE $DB"
psql -q -d "$DB" -v ON_ERROR_STOP=1 <<SQL
CREATE TABLE IF NOT EXISTS stall_warm (id int PRIMARY KEY, v text);
CREATE TABLE IF NOT EXISTS stall_probe (id int PRIMARY KEY, v text);
INSERT INTO stall_warm SELECT g, md5(g::text) FROM generate_series(1, $ENTRIES) g
    ON CONFLICT DO NOTHING;
INSERT INTO stall_probe SELECT g, md5(g::text) FROM generate_series(1, $MISSES) g
    ON CONFLICT DO NOTHING;
SQL

ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
TMPD=$(mktemp -d)
trap bench_cleanup EXIT
pgline_serve "$PGLINE_BIN" 1GiB --set 'catalog.tables=["public.stall_probe"]'
"$PGLINE_BIN" tables add public.stall_warm --warm --api "http://127.0.0.1:$API_PORT" >/dev/null
keys() { # entries in the store, 0 before the first
    local n
    n=$(redis-cli -p "$PGLINE_PORT" INFO keyspace | tr -d '\r' | sed -n 's/^db0:keys=\([0-9]*\).*/\1/p')
    echo "${n:-0}"
}
for _ in $(seq 1 1200); do [ "$(keys)" -ge "$ENTRIES" ] && break; sleep 0.5; done
[ "$(keys)" -ge "$ENTRIES" ] || { echo "miss-stall.sh: the store holds $(keys) entries after 600 s, not $ENTRIES" >&2; exit 1; }
echo "miss-stall.sh: $("$PGLINE_BIN" --version), store $(redis-cli -p "$PGLINE_PORT" INFO keyspace | tr -d '\r' | grep '^db0')"
python3 - "$PGLINE_PORT" "$MISSES" <<'EOF'
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
f = s.makefile("rb")
lat = []
for i in range(1, n + 1):
    k = f"stall_probe:{i}".encode()
    t = time.perf_counter()
    s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
    line = f.readline()
    if not line.startswith(b"$") or line.startswith(b"$-"):
        sys.exit(f"miss-stall.sh: GET {k.decode()} answered {line!r}")
    f.read(int(line[1:]) + 2)
    lat.append((time.perf_counter() - t) * 1000)
    time.sleep(0.004)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(len(lat) * p))]
print(f"misses {len(lat)}: p50 {q(.5):.3f} ms  p99 {q(.99):.3f} ms  p99.9 {q(.999):.3f} ms  "
      f"max {lat[-1]:.3f} ms  over 10 ms: {sum(x > 10 for x in lat)}")
EOF
