#!/usr/bin/env bash
# The dataplane wire benchmark: one userspace dataplane core on an in-memory port, GET and MGET 16
# hits of 166-byte rows, at 16, 256, 1,024, 10,000 and 100,000 connections, pipeline depth 1 and 8,
# with the process's resident memory once every connection is open.
#
#   bench/wire.sh            # full matrix (SECS=5 measured + WARMUP=1 per cell)
#   bench/wire.sh --smoke    # CI: short cells (SMOKE_CONNS, default 16 256 1024 connections);
#                            # fails on any wrong reply, stall or zero throughput
#   SECS=10 CONNS="16 1024" DEPTHS="1" bench/wire.sh
#   CONNS="10000 100000" DEPTHS=1 OPS=0 bench/wire.sh    # the connection-count cells alone
#
# Everything runs in one process (bench/wire, crate pgline-wire-bench): no NIC, no PostgreSQL;
# see docs/decisions.md for what the figures mean. RSS is the whole process's (the client stacks
# and the in-memory port's frame pool as well as the server core): `rss base` is before the first
# connection, `RSS/conn` what the open connections added, both ends together (at the end of the
# window; `idle RSS/conn`, in the 10,000 and 100,000 connection cells, after IDLE_SECS=2.5
# seconds without requests: the server gives an idle session's buffers back after 1 s). Results: one JSON
# line per cell appended to bench/results/wire.jsonl and a Markdown table on stdout. A cell that
# fails (a wrong reply, a stall, connections not established) says why and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
SECS=${SECS:-5}
WARMUP=${WARMUP:-1}
CONNS=${CONNS:-"16 256 1024 10000 100000"}
[ $SMOKE = 1 ] && CONNS=${SMOKE_CONNS:-"16 256 1024"}
DEPTHS=${DEPTHS:-"1 8"}
OPS=${OPS:-"0 16"}          # keys per MGET; 0 = GET
if [ $SMOKE = 1 ]; then SECS=0.5; WARMUP=0.2; fi
OUT=bench/results/wire.jsonl
mkdir -p bench/results

cargo build --release -q -p pgline-wire-bench
BIN=target/release/pgline-wire-bench

ROWS=$(mktemp)
trap 'rm -f "$ROWS"' EXIT
fail=0
for mget in $OPS; do
    for depth in $DEPTHS; do
        for conns in $CONNS; do
            # The idle resident set only where it means something (and costs the wait once).
            idle=0
            [ "$conns" -ge 10000 ] && idle=${IDLE_SECS:-2.5}
            if row=$("$BIN" --conns "$conns" --depth "$depth" --mget "$mget" \
                    --secs "$SECS" --warmup "$WARMUP" --idle-secs "$idle" --json); then
                echo "$row" >>"$ROWS"
                echo "$row" >>"$OUT"
            else
                echo "FAILED: conns $conns depth $depth mget $mget (the reason is above)" >&2
                fail=1
            fi
        done
    done
done

echo
echo "| op | conns | depth | req/s | keys/s | server ns/req | server cycles/req | server capacity (M req/s) | server busy | req/busy turn | client ns/req | client busy | server CPU share | RSS (MiB) | RSS base (MiB) | RSS/conn (KiB) | idle RSS/conn (KiB) | client retransmits |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
jq -r '"| \(if .mget == 0 then "GET" else "MGET \(.mget)" end) | \(.conns) | \(.depth) | \(.rps) | \(.keys_per_s) | \(.server_ns_per_req) | \(.server_cycles_per_req) | \(.server_capacity_rps / 1e6 * 100 | round / 100) | \(.server_busy * 100 | round)% | \(.reqs_per_busy_turn) | \(.client_ns_per_req) | \(.client_busy * 100 | round)% | \(.server_cpu_share * 100 | round)% | \(.rss_mib) | \(.rss_base_mib) | \(.rss_per_conn_kib) | \(.rss_idle_per_conn_kib) | \(.client_retransmits) |"' "$ROWS"
echo
jq -r 'select(.conns) | "env: \(.env.cpu_model), \(.env.cores) cores, kernel \(.env.kernel); cycles = CPU time x \(.mhz) MHz (\(.mhz_source))"' "$ROWS" | head -1

# Zero throughput in any cell fails the run (wrong replies and stalls already did).
if jq -e 'select(.rps <= 0 or .verified_replies <= 0)' "$ROWS" >/dev/null; then
    echo "FAILED: a cell had zero throughput" >&2
    fail=1
fi
exit $fail
