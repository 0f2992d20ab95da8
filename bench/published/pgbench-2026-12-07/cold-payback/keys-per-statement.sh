#!/usr/bin/env bash
# keys per core fill statement, empty store vs full store, 8 clients unpinned
set -euo pipefail
cd /work/main
. bench/lib-pgline.sh
eval "$(deploy/lab/pg.sh env)"; export PGHOST PGPORT PGUSER PGPASSWORD
DB=pgline_pgbench_s10 SLOT=pgline_kps PGLINE_PORT=6471 API_PORT=6472 PGWIRE_PORT=6473
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
export PGLINE_API_TOKEN=kps-$RANDOM
TMPD=$(mktemp -d); trap bench_cleanup EXIT
C=${C:-8}
m() { curl -sf -H "Authorization: Bearer $PGLINE_API_TOKEN" "http://127.0.0.1:$API_PORT/metrics" | awk '$1 ~ /^pgline_core_pg_core_fills_total/ {k+=$2} $1 ~ /^pgline_core_pg_core_fill_statements_total/ {s+=$2} END {print k+0, s+0}'; }
pgline_serve target/release/pgline 256MiB
b() { pgbench -n -S -M prepared -h 127.0.0.1 -p $PGWIRE_PORT -c $C -j 2 -T $1 $DB 2>&1 | awk '/^tps/ {print $3}'; }
a=$(m); t=$(b 8); z=$(m)
echo "empty store, first 8 s: tps=$t keys,statements: $a -> $z" | awk '{print} {split("",x)}'
b 52 >/dev/null
a=$(m); t=$(b 8); z=$(m)
echo "store full, 8 s: tps=$t keys,statements: $a -> $z"
