#!/usr/bin/env bash
# What keeping the cache coherent costs a writing workload: pgbench TPC-B straight at the origin,
# with and without a pgline tailing the origin's WAL (its logical replication slot, decoded by
# the origin's walsender and applied by pgline's WAL consumer), alternating, side by side in one
# run. PgBouncer has no such cost; pgline has it whichever way the clients connect. In
# bench/pgwire-pgbench.sh one pgline runs through every column, so the origin and PgBouncer
# columns there pay it too.
#
#   bench/pgwire-wal-cost.sh                  # scale-10 database, 8 clients, 3 rounds of 8 s
#   CLIENTS=32 ROUNDS=2 bench/pgwire-wal-cost.sh
#
# Environment: DB (pgline_pgbench_s10: made by bench/pgwire-pgbench.sh, or pgbench -i -s 10),
# CLIENTS (8), ROUNDS (3), DURATION (seconds, 8), PGLINE_BIN (target/release/pgline), ports
# PGLINE_PORT (6451), API_PORT (6452), PGWIRE_PORT (6453). One line per run: tps, and with pgline
# running, the CPU per transaction of the walsender (on the origin) and of pgline (from /proc).
# Against the lab origin (deploy/lab/pg.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib-pgline.sh
DB=${DB:-pgline_pgbench_s10}
CLIENTS=${CLIENTS:-8}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
PGLINE_BIN=${PGLINE_BIN:-target/release/pgline}
PGLINE_PORT=${PGLINE_PORT:-6451}
API_PORT=${API_PORT:-6452}
PGWIRE_PORT=${PGWIRE_PORT:-6453}
SLOT=pgline_walcost
eval "$(deploy/lab/pg.sh env)"
export PGHOST PGPORT PGUSER PGPASSWORD
psql -qtA -d "$DB" -c "SELECT count(*) FROM pgbench_branches" >/dev/null 2>&1 \
    || { echo "pgwire-wal-cost.sh: no pgbench database $DB (pgbench -i -s 10 $DB)" >&2; exit 1; }
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
TMPD=$(mktemp -d)
trap bench_cleanup EXIT

start_pgline() {
    pgline_serve "$PGLINE_BIN" 256MiB
    sleep 2 # the slot is made and the walsender streams
}

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
HZ=$(getconf CLK_TCK)

run() { # with|without
    local ws="" w0=0 p0=0
    if [ "$1" = with ]; then
        start_pgline
        ws=$(psql -d postgres -qtA -c "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '$SLOT'")
        [ -n "$ws" ] || { echo "pgwire-wal-cost.sh: no walsender for $SLOT" >&2; exit 1; }
        w0=$(ticks "$ws") p0=$(ticks "$PGLINE_PID")
    fi
    local out
    out=$(pgbench -n -b tpcb-like -h 127.0.0.1 -p "$PGPORT" -c "$CLIENTS" -j 2 -T "$DURATION" "$DB" 2>&1)
    local n tps
    n=$(awk '/number of transactions actually processed/ {split($NF, a, "/"); print a[1]}' <<<"$out")
    tps=$(awk '/^tps/ {printf "%.0f", $3}' <<<"$out")
    if [ "$1" = with ]; then
        local w1 p1
        w1=$(ticks "$ws") p1=$(ticks "$PGLINE_PID")
        pgline_stop
        printf 'pgline tailing the WAL  clients=%-3s tps=%6s walsender_us/txn=%5.1f pgline_us/txn=%5.1f\n' "$CLIENTS" "$tps" \
            "$(awk -v d=$((w1 - w0)) -v hz="$HZ" -v n="$n" 'BEGIN {print d * 1e6 / hz / n}')" \
            "$(awk -v d=$((p1 - p0)) -v hz="$HZ" -v n="$n" 'BEGIN {print d * 1e6 / hz / n}')"
    else
        printf 'no pgline               clients=%-3s tps=%6s\n' "$CLIENTS" "$tps"
    fi
}

echo "pgwire-wal-cost.sh: $(date -u +%FT%TZ) $DB, TPC-B straight at the origin, $CLIENTS clients, ${DURATION}s, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then run without; run with; else run with; run without; fi
done
