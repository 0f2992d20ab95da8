#!/usr/bin/env bash
set -euo pipefail
cd /work/main
. bench/pgbouncer.sh
eval "$(deploy/lab/pg.sh env)"; export PGHOST PGPORT PGUSER PGPASSWORD
DB=pgline_pgbench_s10; TMPD=$(mktemp -d); chmod 755 $TMPD
start_pgbouncer "$TMPD/pgbouncer" 6444 "$DB"
sleep 1
pgbench -n -b tpcb-like -h 127.0.0.1 -p 6444 -c ${C:-8} -j 2 -T 7 $DB > $TMPD/out 2>&1 &
b=$!; sleep 1
perf record -e cpu-clock -o /tmp/perf-bouncer.data -p $BOUNCER_PID -- sleep 5 2>/dev/null
wait $b; awk '/^tps/ {print "tps=" $3}' $TMPD/out
kill $BOUNCER_PID
