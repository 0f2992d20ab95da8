#!/usr/bin/env bash
# Aggregate GET/s of a fleet (issue 17's fleet cell): six pglines on loopback in cluster mode,
# three shards of a primary and a replica (the layout of controlplane/tests/cluster_e2e.rs),
# every one tailing the lab origin and warmed with the bench table; beside it, in the same run,
# one pgline outside cluster mode under the same total load.
#
#   bench/fleet.sh            # full: 10 s cells, 100,000 rows
#   bench/fleet.sh --smoke    # CI: 2 s cells, 10,000 rows, checked
#
# Load: one `pgline-bench run` per node at once, each with CLIENTS connections reading GETs of
# the keys its node serves (`--slots`: its shard's ids; replicas after `READONLY`), uniform over
# them; the single node gets the six load processes too, over the whole key space. Before each
# cell the same processes warm the stores for WARM (8s; smoke 1s), pipelined. A cell's figure
# is the sum of the six processes' GET/s, with the stores' hit ratio in the window; an error or
# a nil reply (every id is a row) fails the run. On one machine the fleet and its load share the same CPUs, so the figure is what
# six nodes and six load generators reach on this machine's cores, not six machines' worth;
# docs/scale-out.md turns the per-node cost into a fleet capacity.
#
# Environment: ROWS (100000; smoke 10000), DURATION (10s; smoke 2s), WARM, CLIENTS (4 per load
# process), PIPELINE (1), PGLINE_BIN (default target/release/pgline, built here with
# pgline-bench), BASE_PORT (6600: node i takes BASE_PORT+2i and +2i+1), CORES (1 per node).
set -euo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
case "${1:-}" in
    --smoke) SMOKE=1 ;;
    "") ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "usage: bench/fleet.sh [--smoke]" >&2; exit 2 ;;
esac
if [ $SMOKE = 1 ]; then
    ROWS=${ROWS:-10000} DURATION=${DURATION:-2s} WARM=${WARM:-1s}
else
    ROWS=${ROWS:-100000} DURATION=${DURATION:-10s} WARM=${WARM:-8s}
fi
CLIENTS=${CLIENTS:-4} PIPELINE=${PIPELINE:-1} BASE_PORT=${BASE_PORT:-6600} CORES=${CORES:-1}

cargo build --release -q -p pgline-controlplane -p pgline-bench # one feature set for every script (bench/README.md)
PGLINE_BIN=${PGLINE_BIN:-target/release/pgline}
BENCH=target/release/pgline-bench
eval "$(deploy/lab/pg.sh env)"
ORIGIN="host=127.0.0.1 port=$PGPORT user=postgres password=$PGPASSWORD dbname=pgline_bench"
export PGLINE_BENCH_ORIGIN=$ORIGIN
"$BENCH" load --keyspace "$ROWS" >/dev/null

NAMES=(p1 r1 p2 r2 p3 r3)
RANGES=("0-5460" "5461-10922" "10923-16383")
TMPD=$(mktemp -d)
PIDS=()
SLOTS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for s in "${SLOTS[@]}"; do deploy/lab/pg.sh drop-slot "$s" >/dev/null 2>&1 || true; done
    rm -rf "$TMPD"
}
trap cleanup EXIT

resp_port() { echo $((BASE_PORT + 2 * $1)); }
api_port() { echo $((BASE_PORT + 2 * $1 + 1)); }

# One pgline: name, RESP port, API port, then more `serve` arguments; warmed with every row.
launch() {
    local name=$1 port=$2 api=$3; shift 3
    local slot="pgline_fleet_$name"
    SLOTS+=("$slot")
    "$PGLINE_BIN" serve --origin "$ORIGIN" --listen "127.0.0.1:$port" --cores "$CORES" \
        --memory 64MiB --set api.listen="\"127.0.0.1:$api\"" --set pgwire.enabled=false \
        --set replication.slot="\"$slot\"" --set replication.publication='"pgline_fleet"' \
        --set 'catalog.tables=["public.bench_rows"]' --set log.level='"warn"' "$@" \
        >"$TMPD/$name.log" 2>&1 &
    PIDS+=($!)
}
wait_serving() { # port name
    for _ in $(seq 1 300); do
        redis-cli -p "$1" INFO replication 2>/dev/null | grep -q 'serving_hits:1' && return 0
        sleep 0.1
    done
    echo "fleet.sh: $2 did not start serving; its log:" >&2
    cat "$TMPD/$2.log" >&2
    exit 1
}
# Warms every node at once: the load processes of the cell, pipelined, for WARM (each miss is
# filled from the origin; the measured cell then reports the store's own hits and misses).
warm_all() {
    local pids=() port extra
    while read -r port extra; do
        # shellcheck disable=SC2086
        "$BENCH" run --target resp --resp "127.0.0.1:$port" --keyspace "$ROWS" --op get \
            --clients 4 --pipeline 32 --duration "$WARM" --warmup 0s ${extra%%--server-pid*} \
            --out "$TMPD/warm.jsonl" >/dev/null 2>&1 &
        pids+=($!)
    done <"$TMPD/loads"
    for p in "${pids[@]}"; do wait "$p"; done
}

# The fleet's [cluster] section (node = ... given to each node by PGLINE_CLUSTER_NODE).
{
    echo "[cluster]"
    echo "health_interval_ms = 200"
    echo "nodes = ["
    for i in "${!NAMES[@]}"; do
        echo "  { name = \"${NAMES[$i]}\", addr = \"127.0.0.1:$(resp_port "$i")\", api = \"127.0.0.1:$(api_port "$i")\" },"
    done
    echo "]"
    echo "shards = ["
    for s in 0 1 2; do
        echo "  { name = \"s$((s + 1))\", slots = [\"${RANGES[$s]}\"], nodes = [\"${NAMES[$((2 * s))]}\", \"${NAMES[$((2 * s + 1))]}\"] },"
    done
    echo "]"
} >"$TMPD/cluster.toml"

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p bench/results
OUT=bench/results/fleet-$([ $SMOKE = 1 ] && echo smoke- || true)$STAMP.jsonl
echo "fleet.sh: $STAMP, $ROWS rows, $DURATION cells, $CLIENTS clients x pipeline $PIPELINE per load process, $CORES core(s) per node, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
FAILED=0

# cell name: runs the six load processes (args per process in $TMPD/loads), sums them.
cell() {
    local name=$1 i=0 pids=()
    while read -r port extra; do
        # shellcheck disable=SC2086
        "$BENCH" run --target resp --resp "127.0.0.1:$port" --keyspace "$ROWS" --op get \
            --clients "$CLIENTS" --pipeline "$PIPELINE" --duration "$DURATION" --warmup 1s \
            --scenario fleet --label "$name $i" --out "$TMPD/$name-$i.jsonl" $extra \
            >"$TMPD/$name-$i.log" 2>&1 &
        pids+=($!)
        i=$((i + 1))
    done <"$TMPD/loads"
    for p in "${pids[@]}"; do wait "$p" || { cat "$TMPD"/"$name"-*.log >&2; FAILED=1; }; done
    cat "$TMPD"/"$name"-*.jsonl >>"$OUT"
    python3 - "$name" "$TMPD"/"$name"-*.jsonl <<'PY'
import json, sys
name, rows = sys.argv[1], [json.loads(open(f).readline()) for f in sys.argv[2:]]
tot = sum(r["rps"] for r in rows)
errors = sum(r.get("errors", 0) for r in rows)
misses = sum(r.get("misses", 0) for r in rows)
hits = sum(r.get("server_keyspace_hits") or 0 for r in rows)
fills = sum(r.get("server_keyspace_misses") or 0 for r in rows)
each = " ".join(f"{r['rps']:.0f}" for r in rows)
store = f"{hits / (hits + fills):.1%}" if hits + fills else "-"
print(f"| {name} | {len(rows)} | {tot:,.0f} | {each} | {store} | {errors} | {misses} |")
sys.exit(1 if errors or misses or tot <= 0 else 0)
PY
}

echo
echo "| cell | load processes | GET/s together | GET/s per process | store hit ratio | errors | nil replies |"
echo "|---|---:|---:|---|---:|---:|---:|"

# The fleet.
for i in "${!NAMES[@]}"; do
    PGLINE_CLUSTER_NODE=${NAMES[$i]} launch "${NAMES[$i]}" "$(resp_port "$i")" "$(api_port "$i")" \
        --config "$TMPD/cluster.toml"
done
for i in "${!NAMES[@]}"; do wait_serving "$(resp_port "$i")" "${NAMES[$i]}"; done
: >"$TMPD/loads"
for i in "${!NAMES[@]}"; do
    s=$((i / 2))
    ro=""
    [ $((i % 2)) = 1 ] && ro="--readonly"
    echo "$(resp_port "$i") --slots ${RANGES[$s]} $ro --server-pid ${NAMES[$i]}=${PIDS[$i]}" >>"$TMPD/loads"
done
warm_all
cell "fleet: 3 shards x 2 nodes" || FAILED=1
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
wait "${PIDS[@]}" 2>/dev/null || true
PIDS=()

# One node outside cluster mode, the same six load processes over the whole key space.
launch single "$(resp_port 0)" "$(api_port 0)"
wait_serving "$(resp_port 0)" single
: >"$TMPD/loads"
for _ in "${NAMES[@]}"; do echo "$(resp_port 0) --server-pid single=${PIDS[0]}" >>"$TMPD/loads"; done
warm_all
cell "one node" || FAILED=1
echo
echo "rows: $(wc -l <"$OUT") in $OUT"
exit $FAILED
