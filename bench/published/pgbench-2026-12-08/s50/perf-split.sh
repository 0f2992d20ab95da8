#!/usr/bin/env bash
set -euo pipefail
cd /work/main
. bench/lib-pgline.sh
eval "$(deploy/lab/pg.sh env)"; export PGHOST PGPORT PGUSER PGPASSWORD
DB=${DB:-pgline_pgbench_s10}; C=${C:-8}; BIN=${BIN:-target/release/pgline}
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
PGWIRE_PORT=6443 PGLINE_PORT=6441 API_PORT=6442 SLOT=$DB TMPD=$(mktemp -d)
trap bench_cleanup EXIT
pgline_serve "$BIN" 64MiB ${EXTRA:-}
pgbench -n ${BUILTIN:+-b $BUILTIN} ${SCRIPT:+-f $SCRIPT} -h 127.0.0.1 -p 6443 -c $C -j 2 -T 7 $DB > $TMPD/out 2>&1 &
b=$!
sleep 1
perf record -e ${EV:-cpu-clock} ${PERF_ARGS:-} -o ${OUT:-/tmp/perf.data} -p $PGLINE_PID -- sleep 5 2>/dev/null
wait $b
awk '/^tps/ {print "tps=" $3}' $TMPD/out
awk '/^number of transactions actually/ {print "txns=" $NF}' $TMPD/out
pgline_stop
