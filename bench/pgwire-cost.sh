#!/usr/bin/env bash
# What pgline's process spends per forwarded transaction: CPU time and system calls, counted by
# `perf stat` over a pgbench run through the PostgreSQL front (issue 15: the per-core cost of
# pass-through). Throughput on a shared 2-vCPU machine swings 2x between runs; CPU time and
# system calls per transaction move much less, so two builds compare better on them.
#
#   bench/pgwire-cost.sh                                  # select1, 8 and 32 clients, 3 rounds
#   BINS="/tmp/old/pgline target/release/pgline" bench/pgwire-cost.sh   # builds side by side
#   BINS="pgbouncer target/release/pgline" bench/pgwire-cost.sh     # against PgBouncer
#   DB=pgline_pgbench_s10 SCRIPT= BUILTIN=tpcb-like CLIENTS=8 bench/pgwire-cost.sh   # TPC-B
#   SCRIPT=bench/pgwire-write-read.pgbench SETUP=bench/pgwire-write-read.sql bench/pgwire-cost.sh
#                                               # a write, then a cached read of the row
#
# Environment: BINS (pgline binaries, default target/release/pgline, or the word `pgbouncer`
# for Debian's PgBouncer in transaction mode, bench/pgbouncer.sh; each round runs every one in
# turn), CLIENTS ("8 32"), ROUNDS (3), DURATION (seconds counted, 5), SCRIPT (pgbench script,
# bench/pgwire-select1.pgbench; empty for none), SETUP (SQL file run on DB first), BUILTIN (a pgbench builtin such as tpcb-like,
# with SCRIPT= and a DB that pgbench -i made), DB (pgline_cost), PGWIRE_PORT (6443), PGLINE_PORT (6441), API_PORT (6442),
# BOUNCER_PORT (6444).
# One line per run: tps, the proxy's CPU µs per transaction, system calls per transaction
# (all, and without sched_yield, which a spinning core makes when idle), eventfd/epoll and
# recvfrom/sendto/read calls per transaction, and context switches per transaction. Needs
# `perf` (linux-perf) and root or perf_event_paranoid <= 1; against the lab origin.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pgbouncer.sh
. bench/lib-pgline.sh
BINS=${BINS:-target/release/pgline}
CLIENTS=${CLIENTS:-8 32}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
SCRIPT=${SCRIPT-bench/pgwire-select1.pgbench}
PGWIRE_PORT=${PGWIRE_PORT:-6443}
PGLINE_PORT=${PGLINE_PORT:-6441}
API_PORT=${API_PORT:-6442}
BOUNCER_PORT=${BOUNCER_PORT:-6444}
DB=${DB:-pgline_cost}
command -v perf >/dev/null || { echo "pgwire-cost.sh: needs perf (apt-get install linux-perf)" >&2; exit 1; }
eval "$(deploy/lab/pg.sh env)"
export PGHOST PGPORT PGUSER PGPASSWORD
psql -qtA -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 \
    || psql -q -d postgres -c "CREATE DATABASE $DB"
[ -z "${SETUP:-}" ] || psql -q -v ON_ERROR_STOP=1 -d "$DB" -f "$SETUP" >/dev/null
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
TMPD=$(mktemp -d)
chmod 755 "$TMPD" # PgBouncer runs as postgres
SLOT=$DB # pgline's slot and publication
PID=""    # the proxy measured: pgline's or PgBouncer's
trap bench_cleanup EXIT

run() { # binary-or-pgbouncer clients
    local bin=$1 c=$2 port=$PGWIRE_PORT
    if [ "$bin" = pgbouncer ]; then
        start_pgbouncer "$TMPD/pgbouncer" "$BOUNCER_PORT" "$DB"
        PID=$BOUNCER_PID port=$BOUNCER_PORT BENCH_KILL=$BOUNCER_PID
    else
        pgline_serve "$bin" 64MiB
        PID=$PGLINE_PID
    fi
    sleep 1
    # pgbench runs a second longer than the count, which starts half a second in.
    pgbench -n ${BUILTIN:+-b "$BUILTIN"} ${SCRIPT:+-f "$SCRIPT"} -h 127.0.0.1 -p "$port" -c "$c" -j 2 -T $((DURATION + 1)) \
        "$DB" >"$TMPD/pgbench.out" 2>&1 &
    local bench=$!
    sleep 0.5
    perf stat -x, -e task-clock,raw_syscalls:sys_enter,context-switches \
        -e syscalls:sys_enter_write,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_read \
        -p "$PID" -- sleep "$DURATION" 2>"$TMPD/perf.csv"
    wait "$bench" || { cat "$TMPD/pgbench.out" >&2; exit 1; }
    if [ "$bin" = pgbouncer ]; then
        kill "$PID"
        wait "$PID" 2>/dev/null || true
        BENCH_KILL=""
    else
        pgline_stop
    fi
    PID=""
    local tps
    tps=$(awk '/^tps/ {print $3}' "$TMPD/pgbench.out")
    awk -F, -v tps="$tps" -v bin="$bin" -v c="$c" -v d="$DURATION" '
        { v[$3] = $1 }
        END {
            n = tps * d
            printf "%-28s clients=%-3s tps=%7.0f cpu_us/txn=%6.1f syscalls/txn=%5.2f (%5.2f without sched_yield) write/txn=%4.2f epoll_wait/txn=%4.2f recv/txn=%4.2f send/txn=%4.2f read/txn=%4.2f cs/txn=%4.2f\n",
                bin, c, tps, v["task-clock"] * 1000 / n, v["raw_syscalls:sys_enter"] / n,
                (v["raw_syscalls:sys_enter"] - v["syscalls:sys_enter_sched_yield"]) / n,
                v["syscalls:sys_enter_write"] / n, v["syscalls:sys_enter_epoll_wait"] / n,
                v["syscalls:sys_enter_recvfrom"] / n, v["syscalls:sys_enter_sendto"] / n, v["syscalls:sys_enter_read"] / n,
                v["context-switches"] / n
        }' "$TMPD/perf.csv"
}

for round in $(seq 1 "$ROUNDS"); do
    for c in $CLIENTS; do
        for bin in $BINS; do
            run "$bin" "$c"
        done
    done
done
