#!/usr/bin/env bash
# The throwaway runs of stop 50 (results.log), from /work/main with the lab origin:
#   s50.sh cold        pgbench -S -M prepared for T (8) s from an empty store; prints tps
#   s50.sh perf        perf record (EV, default cpu-clock; PERF_ARGS) of 5 s of pgbench (BUILTIN)
#   s50.sh per-thread  perf stat --per-thread (task-clock, context switches) of 5 s of pgbench
# BIN (target/release/pgline), C (8 clients), DB (pgline_pgbench_s10), EXTRA (pgline --set ...).
# PgBouncer's profile: bench/pgbouncer.sh's start_pgbouncer, then the same perf record on its pid.
set -euo pipefail
cd /work/main
. bench/lib-pgline.sh
eval "$(deploy/lab/pg.sh env)"; export PGHOST PGPORT PGUSER PGPASSWORD
DB=${DB:-pgline_pgbench_s10}; C=${C:-8}; BIN=${BIN:-target/release/pgline}
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
PGWIRE_PORT=6443 PGLINE_PORT=6441 API_PORT=6442 SLOT=$DB TMPD=$(mktemp -d)
trap bench_cleanup EXIT
pgline_serve "$BIN" 256MiB ${EXTRA:-}
case ${1:-cold} in
cold)
    pgbench -n -S -M prepared -h 127.0.0.1 -p 6443 -c $C -j 2 -T ${T:-8} $DB > $TMPD/out 2>&1
    ;;
perf | per-thread)
    pgbench -n -b ${BUILTIN:-tpcb-like} -h 127.0.0.1 -p 6443 -c $C -j 2 -T 7 $DB > $TMPD/out 2>&1 &
    b=$!
    sleep 1
    if [ "$1" = perf ]; then
        perf record -e ${EV:-cpu-clock} ${PERF_ARGS:-} -o ${OUT:-/tmp/perf.data} -p $PGLINE_PID -- sleep 5 2>/dev/null
    else
        perf stat --per-thread -e task-clock,context-switches -p $PGLINE_PID -- sleep 5 2>&1 | grep -v "^$" | tail -12
    fi
    wait $b
    ;;
esac
echo "$(basename $BIN) c=$C $(awk '/^tps/ {print "tps=" $3}' $TMPD/out)"
pgline_stop
