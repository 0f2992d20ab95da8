#!/usr/bin/env bash
# origin CPU per statement for a pgbench script: CPU of all postgres processes over the run
cd "$(dirname "$0")/../../../.." && eval "$(deploy/lab/pg.sh env)"; export PGHOST PGPORT PGUSER PGPASSWORD
f=$1; c=${2:-8}
pgcpu() { local s=0; for p in $(pgrep -x postgres); do s=$((s + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done; echo $s; }
PGOPTIONS="-c plan_cache_mode=force_generic_plan" pgbench -n -M ${MODE:-prepared} -f $f -c $c -j 2 -T 7 ${DB:-pgline_pgbench_s10} > /tmp/fillcost/out 2>&1 &
b=$!; sleep 1; a=$(pgcpu); sleep 5; z=$(pgcpu); wait $b
tps=$(awk '/^tps/ {print $3}' /tmp/fillcost/out)
awk -v a=$a -v z=$z -v t=$tps -v f=$(basename $f) 'BEGIN {printf "%-16s tps=%7.0f origin_us/stmt=%5.1f\n", f, t, (z-a)*10000/(t*5)}'
