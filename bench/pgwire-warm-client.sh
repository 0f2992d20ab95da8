#!/usr/bin/env bash
# What the client itself costs on a warm store (issue 15: the 3x goal at 1 client): pgbench -S
# (prepared, one client) straight at the origin and through a pgline whose store holds every
# account, with `perf stat` on the pgbench process. Prints tps, pgbench's own CPU per lookup,
# its context switches per lookup (it sleeps in poll once per reply) and the wall time per
# lookup; the difference between wall time and pgbench's CPU is the server, loopback and the
# wake-ups.
#
#   bench/pgwire-warm-client.sh              # ROUNDS=2 (origin, pgline in turn), DURATION=5
#
# Needs the scale-10 pgbench database that bench/pgwire-pgbench.sh makes (pgline_pgbench_s10),
# perf, redis-cli, and the lab origin (deploy/lab/pg.sh). Ports: PGLINE_PORT (6397, RESP),
# API_PORT (6398), PGWIRE_PORT (6433). PGLINE_BIN (target/release/pgline).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib-pgline.sh
ROUNDS=${ROUNDS:-2} DURATION=${DURATION:-5}
PGLINE_PORT=${PGLINE_PORT:-6397} API_PORT=${API_PORT:-6398} PGWIRE_PORT=${PGWIRE_PORT:-6433}
PGLINE_BIN=${PGLINE_BIN:-target/release/pgline}
DB=pgline_pgbench_s10
SLOT=pgline_pgbench_$PGWIRE_PORT
for tool in perf pgbench redis-cli pg_isready; do
    command -v "$tool" >/dev/null || { echo "pgwire-warm-client.sh: $tool not found" >&2; exit 1; }
done
eval "$(deploy/lab/pg.sh env)"
export PGHOST PGPORT PGUSER PGPASSWORD
psql -qtA -d "$DB" -c "SELECT count(*) FROM pgbench_accounts" >/dev/null 2>&1 \
    || { echo "pgwire-warm-client.sh: no $DB; run bench/pgwire-pgbench.sh once" >&2; exit 1; }
export PGLINE_API_TOKEN=warm-$RANDOM$RANDOM$RANDOM
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
TMPD=$(mktemp -d)
trap bench_cleanup EXIT

pgline_serve "$PGLINE_BIN" 1GiB \
    --set 'catalog.tables=["public.pgbench_branches","public.pgbench_tellers"]'
"$PGLINE_BIN" tables add public.pgbench_accounts --warm --api "http://127.0.0.1:$API_PORT" >/dev/null
pgbench -n -S -M prepared -h 127.0.0.1 -p "$PGWIRE_PORT" -c 8 -j 2 -T 5 "$DB" >/dev/null 2>&1
for _ in $(seq 1 "$ROUNDS"); do
    for target in origin pgline; do
        port=$PGPORT
        [ "$target" = pgline ] && port=$PGWIRE_PORT
        pgbench -n -S -M prepared -h 127.0.0.1 -p "$port" -c 1 -j 1 -T $((DURATION + 2)) "$DB" \
            >"$TMPD/pgbench.out" 2>&1 &
        bench=$!
        sleep 1
        # pgbench's one process (one thread: -j 1).
        perf stat -x, -e task-clock,context-switches -p "$bench" -- sleep "$DURATION" 2>"$TMPD/perf.csv"
        wait "$bench" || { cat "$TMPD/pgbench.out" >&2; exit 1; }
        tps=$(awk '/^tps/ {print $3}' "$TMPD/pgbench.out")
        awk -F, -v t="$target" -v tps="$tps" -v d="$DURATION" '
            { v[$3] = $1 }
            END {
                n = tps * d
                printf "%-7s clients=1 tps=%7.0f pgbench_cpu_us/txn=%5.1f pgbench_cs/txn=%4.2f wall_us/txn=%5.1f\n",
                    t, tps, v["task-clock"] * 1000 / n, v["context-switches"] / n, 1e6 / tps
            }' "$TMPD/perf.csv"
    done
done
echo "pgline store: $(redis-cli -p "$PGLINE_PORT" INFO stats | tr -d '\r' | grep -E 'keyspace_(hits|misses)' | tr '\n' ' ')"
