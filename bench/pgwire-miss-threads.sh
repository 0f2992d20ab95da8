#!/usr/bin/env bash
# Where pgline's CPU goes per cold-store miss, by thread group (issue 15): the core thread(s)
# that read the misses, and the control threads (the writer that installs what the cores read,
# and whatever else wakes them); and the origin's processes beside them. Throughput on a shared 2-vCPU machine swings 15-20 % between
# runs; CPU time and context switches per lookup, read from /proc for each thread, move less.
#
#   bench/pgwire-miss-threads.sh                                   # 8 clients, 2 rounds
#   BINS="/tmp/old/pgline target/release/pgline" CLIENTS="8 32" bench/pgwire-miss-threads.sh
#
# Each run: a fresh `pgline serve` (store of MEMORY, so empty), `pgbench -n -S -M prepared` on
# the scale-10 pgbench database for 7 s, and per-thread CPU (utime + stime) and context switches
# (voluntary and not) counted over seconds 2-6, divided by the lookups pgbench reported for
# those seconds (`-P 1`), with the share of them the store answered. Environment: BINS
# (target/release/pgline), CLIENTS (8), ROUNDS (2), MEMORY (256MiB), PRIME (seconds of the same
# pgbench before the counted run, so that the store is full and evicting; 0), DB
# (pgline_pgbench_s10, made by bench/pgwire-pgbench.sh), PGWIRE_PORT (6453), PGLINE_PORT (6451),
# API_PORT (6452). Against the lab origin (deploy/lab/pg.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib-pgline.sh
BINS=${BINS:-target/release/pgline}
CLIENTS=${CLIENTS:-8}
ROUNDS=${ROUNDS:-2}
MEMORY=${MEMORY:-256MiB}
PRIME=${PRIME:-0}
DB=${DB:-pgline_pgbench_s10}
PGWIRE_PORT=${PGWIRE_PORT:-6453}
PGLINE_PORT=${PGLINE_PORT:-6451}
API_PORT=${API_PORT:-6452}
SLOT=pgline_miss_threads
eval "$(deploy/lab/pg.sh env)"
export PGHOST PGPORT PGUSER PGPASSWORD
psql -qtA -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 || {
    echo "pgwire-miss-threads.sh: no database $DB (bench/pgwire-pgbench.sh makes it)" >&2
    exit 1
}
export PGLINE_API_TOKEN=${PGLINE_API_TOKEN:-threads-$RANDOM$RANDOM}
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
TMPD=$(mktemp -d)
trap bench_cleanup EXIT
POSTMASTER=$(ps -o ppid= -p "$(psql -qtA -d "$DB" -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'")" | tr -d ' ')

threads() { # group cpu_ticks switches, one line per thread of pgline
    local t comm g
    for t in /proc/"$PGLINE_PID"/task/*; do
        comm=$(cat "$t/comm" 2>/dev/null) || continue
        case $comm in pgline-core*) g=core ;; pgline-control) g=control ;; *) g=other ;; esac
        echo "$g $(awk '{print $14 + $15}' "$t/stat") $(awk '/^(non)?voluntary_ctxt/ {s += $2} END {print s}' "$t/status")"
    done
    # The origin's processes (backends, walsender, background workers): what the lookups and
    # their fill statements cost PostgreSQL.
    local p
    for p in $(pgrep -P "$POSTMASTER"); do
        [ -r "/proc/$p/stat" ] || continue
        echo "origin $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0) $(awk '/^(non)?voluntary_ctxt/ {s += $2} END {print s + 0}' "/proc/$p/status" 2>/dev/null || echo 0)"
    done
}

store_counts() { # "hits misses" of pgline's store so far (RESP INFO)
    redis-cli -p "$PGLINE_PORT" INFO stats 2>/dev/null | tr -d '\r' | awk -F: '
        $1 == "keyspace_hits" {h = $2} $1 == "keyspace_misses" {m = $2} END {print h + 0, m + 0}'
}

run() { # binary clients
    local bin=$1 c=$2 ticks n tps
    pgline_serve "$bin" "$MEMORY"
    if [ "$PRIME" -gt 0 ]; then # the store filled (and evicting) before the count
        pgbench -n -S -M prepared -h 127.0.0.1 -p "$PGWIRE_PORT" -c "$c" -j 2 -T "$PRIME" "$DB" \
            >"$TMPD/prime.out" 2>&1 || { cat "$TMPD/prime.out" >&2; exit 1; }
    fi
    pgbench -n -S -M prepared -h 127.0.0.1 -p "$PGWIRE_PORT" -c "$c" -j 2 -T 7 -P 1 "$DB" \
        >"$TMPD/pgbench.out" 2>&1 &
    local bench=$!
    sleep 2
    threads >"$TMPD/before"
    local hm0 hm1
    hm0=$(store_counts)
    sleep 4
    threads >"$TMPD/after"
    hm1=$(store_counts)
    wait "$bench" || { cat "$TMPD/pgbench.out" >&2; exit 1; }
    pgline_stop
    # Lookups in the counted seconds: pgbench's progress lines 3 to 6 (seconds 2-6).
    n=$(grep '^progress' "$TMPD/pgbench.out" | sed -n 3,6p | awk '{s += $4} END {print s + 0}')
    tps=$(awk '/^tps/ {printf "%.0f", $3}' "$TMPD/pgbench.out")
    ticks=$(getconf CLK_TCK)
    awk -v n="$n" -v tps="$tps" -v hz="$ticks" -v bin="$bin" -v c="$c" -v hm0="$hm0" -v hm1="$hm1" '
        FNR == NR { c0[$1] += $2; s0[$1] += $3; next }
        { c1[$1] += $2; s1[$1] += $3 }
        END {
            if (n == 0) { print "pgwire-miss-threads.sh: no lookups counted" > "/dev/stderr"; exit 1 }
            printf "%-28s clients=%-3s tps=%7s", bin, c, tps
            split("core control other origin", g, " ")
            for (i = 1; i <= 4; i++)
                printf "  %s: %5.1f us %4.2f cs", g[i], (c1[g[i]] - c0[g[i]]) * 1e6 / hz / n, (s1[g[i]] - s0[g[i]]) / n
            split(hm0, a, " "); split(hm1, b, " ")
            h = b[1] - a[1]; m = b[2] - a[2]
            printf "  (per lookup; store hits %.0f %%)\n", (h + m > 0 ? 100 * h / (h + m) : 0)
        }' "$TMPD/before" "$TMPD/after"
}

for round in $(seq 1 "$ROUNDS"); do
    for c in $CLIENTS; do
        for bin in $BINS; do
            run "$bin" "$c"
        done
    done
done
