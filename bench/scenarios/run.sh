#!/usr/bin/env bash
# Scenario runner: pgline vs Valkey 9 (application-side cache-aside) vs prepared SQL straight to
# PostgreSQL, on the same data, in the same run. One command per scenario:
#
#   bench/scenarios/run.sh reads      # MGET 1/16/64 x clients 16/64/256 x hot/uniform
#   bench/scenarios/run.sh writes     # origin UPDATE/INSERT tx/s: plain, + pgline's WAL consumer,
#                                     #   + Valkey DEL; synchronous_commit on and off
#   bench/scenarios/run.sh mixed      # 64 readers, writers none/10k/30k/unlimited, uniform and
#                                     #   Zipf, stale check after each cell
#   bench/scenarios/run.sh stale      # 120 s of unlimited writers + readers, then the full check
#   bench/scenarios/run.sh soak       # MGET 16 + 20k UPDATE/s for SOAK (default 1h), RSS sampled
#   bench/scenarios/run.sh all        # every scenario above, in that order
#
# Options (before the scenario):
#   --smoke            short cells and a small key space (what CI runs; about 2-3 minutes)
#   --dry-run          print the load-generator commands instead of running them
#   --loadgen HOST     two-machine mode: run pgline-bench on HOST over ssh (see bench/README.md);
#                      the servers listen on SERVER_ADDR, which HOST must reach
#   --out DIR          where the JSONL goes (default bench/results)
#
# Environment: ROWS (100000), SERVER_CPUS (0), CLIENT_CPUS (1), DURATION (10s), WARMUP (2s),
# STALE_SECS (120), SOAK (1h), SERVER_ADDR (127.0.0.1), PGLINE_PORT (6390), VALKEY_PORT (6391);
# READ_MGETS, READ_CLIENTS, READ_SHAPES narrow the reads grid (e.g. READ_MGETS="1 16");
# MIXED_RATES replaces the writer targets of `mixed` (e.g. MIXED_RATES="4000"); PGLINE_BIN
# (target/release/pgline) runs another pgline binary; PGLINE_BASE_BIN adds a second pgline
# (a baseline build, on PGLINE_BASE_PORT 6392-6394) to `reads`, each cell run beside the first.
set -euo pipefail
cd "$(dirname "$0")/../.."

SMOKE=0 DRY=0 LOADGEN="" OUT_DIR=bench/results
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1 ;;
        --dry-run) DRY=1 ;;
        --loadgen) LOADGEN=$2; shift ;;
        --out) OUT_DIR=$2; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
SCENARIO=${1:-}
case "$SCENARIO" in
    reads|writes|mixed|stale|soak|all) ;;
    *) echo "usage: bench/scenarios/run.sh [--smoke] [--dry-run] [--loadgen HOST] reads|writes|mixed|stale|soak|all" >&2; exit 2 ;;
esac

source bench/scenarios/lib.sh

if [ $SMOKE = 1 ]; then
    ROWS=${ROWS:-2000}; DURATION=${DURATION:-1s}; WARMUP=${WARMUP:-300ms}
    STALE_SECS=${STALE_SECS:-5}; SOAK=${SOAK:-10s}; RSS_EVERY=${RSS_EVERY:-2}
else
    ROWS=${ROWS:-100000}; DURATION=${DURATION:-10s}; WARMUP=${WARMUP:-2s}
    STALE_SECS=${STALE_SECS:-120}; SOAK=${SOAK:-1h}; RSS_EVERY=${RSS_EVERY:-60}
fi

lab_prepare
trap servers_stop EXIT

scenario_reads() {
    local mgets="1 16 64" clients="16 64 256" shapes="hot uniform"
    [ $SMOKE = 1 ] && mgets="1 16" clients="16" shapes="hot uniform"
    mgets=${READ_MGETS:-$mgets} clients=${READ_CLIENTS:-$clients} shapes=${READ_SHAPES:-$shapes}
    start_pgline
    start_pgline_base
    local io
    for io in $(valkey_io_threads); do
        start_valkey "$io"
        valkey_prefill
        local m c k
        for m in $mgets; do for c in $clients; do for k in $shapes; do
            if [ "$io" = 1 ]; then
                bench_run reads "pgline" --target resp --resp "$PGLINE" --server-pid "pgline=$PGLINE_PID" \
                    $(op_args "$m") --clients "$c" --keys "$k"
                if [ -n "${PGLINE_BASE_BIN:-}" ]; then
                    bench_run reads "pgline base" --target resp --resp "$PGLINE_BASE" \
                        --server-pid "pgline=$PGLINE_BASE_PID" $(op_args "$m") --clients "$c" --keys "$k"
                fi
                bench_run reads "postgres prepared" --target pg-prepared --mget "$m" --clients "$c" --keys "$k"
            fi
            bench_run reads "valkey io-threads $io" --target cache-aside --resp "$VALKEY" \
                --server-pid "valkey=$VALKEY_PID" $(op_args "$m") --clients "$c" --keys "$k"
        done; done; done
        stop_valkey
    done
}

scenario_writes() {
    local op sc
    for sc in on off; do for op in update insert; do
        stop_pgline
        bench_run writes "plain" --target pg-prepared --clients 0 --write-rate unlimited \
            --write-op "$op" --synchronous-commit "$sc"
        start_pgline
        bench_run writes "pgline WAL consumer" --target pg-prepared --clients 0 --write-rate unlimited \
            --write-op "$op" --synchronous-commit "$sc" --server-pid "pgline=$PGLINE_PID"
        stop_pgline
        start_valkey 1
        bench_run writes "plain + valkey DEL" --target cache-aside --resp "$VALKEY" --clients 0 \
            --write-rate unlimited --write-op "$op" --synchronous-commit "$sc"
        stop_valkey
    done; done
}

scenario_mixed() {
    local rates="0 10000 30000 unlimited" shapes="uniform zipf" r k
    [ $SMOKE = 1 ] && rates="0 unlimited"
    rates=${MIXED_RATES:-$rates}
    start_pgline
    start_valkey 1
    for k in $shapes; do for r in $rates; do
        bench_run mixed "pgline" --target resp --resp "$PGLINE" --server-pid "pgline=$PGLINE_PID" \
            --clients 64 --keys "$k" --write-rate "$r" --stale-check
        # Fresh cache-aside state per cell: stale entries a cell leaves would count again in
        # the next one.
        valkey_prefill
        bench_run mixed "valkey cache-aside" --target cache-aside --resp "$VALKEY" \
            --server-pid "valkey=$VALKEY_PID" --clients 64 --keys "$k" --write-rate "$r" --stale-check
    done; done
}

scenario_stale() {
    start_pgline
    start_valkey 1
    DURATION=${STALE_SECS}s bench_run stale "pgline" --target resp --resp "$PGLINE" \
        --server-pid "pgline=$PGLINE_PID" --clients 64 --keys zipf --write-rate unlimited --stale-check
    # Filled after pgline's cell: that cell's writers update rows without Valkey DELs, so a
    # fill before it would start Valkey's cell with those rows already stale.
    valkey_prefill
    DURATION=${STALE_SECS}s bench_run stale "valkey cache-aside" --target cache-aside --resp "$VALKEY" \
        --server-pid "valkey=$VALKEY_PID" --clients 64 --keys zipf --write-rate unlimited --stale-check
}

scenario_soak() {
    start_pgline
    DURATION=$SOAK bench_run soak "pgline" --target resp --resp "$PGLINE" --server-pid "pgline=$PGLINE_PID" \
        --rss-every "${RSS_EVERY}s" --op mget --mget 16 --clients 64 --keys zipf --write-rate 20000 \
        --stale-check
}

if [ "$SCENARIO" = all ]; then
    for s in reads writes mixed stale soak; do data_reset; "scenario_$s"; servers_stop; done
else
    data_reset
    "scenario_$SCENARIO"
fi
servers_stop
if [ $DRY = 0 ]; then
    check_rows
fi
