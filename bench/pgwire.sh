#!/usr/bin/env bash
# PostgreSQL front: the same prepared statements straight to the origin and through pgline's
# PostgreSQL port, side by side in one run (issue 4's benchmark).
#
#   bench/pgwire.sh            # full: 100,000 bench_rows, 100 tenants / 100,000 tasks, 10 s cells
#   bench/pgwire.sh --smoke    # CI: 2,000 rows, 10 tenants / 5,000 tasks, 1 s cells, checked
#   bench/pgwire.sh --pgbench [--smoke]   # pgbench: origin vs PgBouncer vs pgline (issue 15):
#                                         # runs bench/pgwire-pgbench.sh, described there
#
# Cells (pgline-bench run --target pg-prepared, closed loop), each once with --pg = origin and
# once with --pg = pgline's [pgwire] listen address:
#   point      SELECT id, name, email, plan, active, rev FROM bench_rows WHERE id = $1
#              (uniform ids): 1 client (latency), 32 and 256 clients (throughput)
#   dashboard  one SaaS page = 8 tenant-scoped prepared queries (bench/src/saas.rs), one page
#              per request, tenants KEYS_DASH (uniform): 1, 8 and 32 clients. The SaaS tables
#              are cached, so through pgline the pages come from the query-result cache in the
#              binary format tokio-postgres asks for (the smoke checks that they did)
#   forwarded  SELECT row_to_json(t)::text, random() ... WHERE id = $1 (volatile: pgline passes it through):
#              1 client (the relay's cost per statement)
# Rows go to bench/results/pgwire-<UTC stamp>.jsonl; a table with the ratios is printed.
# The smoke fails when a cell has errors or no requests, or when pgline's point lookups were
# not served from its store (INFO keyspace_hits in the window).
#
# Environment: DB (pgline_pgwire, its own database), ROWS, TENANTS, TASKS, DURATION, WARMUP, SERVER_CPUS (0: pgline), CLIENT_CPUS
# (1: the load generator; PostgreSQL is not pinned), PGLINE_PORT (6396, RESP), PGWIRE_PORT
# (6432), KEYS_DASH (uniform|zipf), POINT_CLIENTS ("1 32 256"; smoke "1 32"), DASH_CLIENTS
# ("1 8 32"; smoke "1 8"), PGLINE_EXTRA (more pgline arguments, e.g. "--set resp.spin_polls=0").
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --pgbench ]; then
    shift
    exec bench/pgwire-pgbench.sh "$@"
fi
SMOKE=0
case "${1:-}" in
    --smoke) SMOKE=1 ;;
    "") ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "usage: bench/pgwire.sh [--smoke] | --pgbench [--smoke]" >&2; exit 2 ;;
esac
if [ $SMOKE = 1 ]; then
    ROWS=${ROWS:-2000} TENANTS=${TENANTS:-10} TASKS=${TASKS:-5000}
    DURATION=${DURATION:-1s} WARMUP=${WARMUP:-300ms}
    POINT_CLIENTS=${POINT_CLIENTS:-1 32} DASH_CLIENTS=${DASH_CLIENTS:-1 8}
else
    ROWS=${ROWS:-100000} TENANTS=${TENANTS:-100} TASKS=${TASKS:-100000}
    DURATION=${DURATION:-10s} WARMUP=${WARMUP:-2s}
    POINT_CLIENTS=${POINT_CLIENTS:-1 32 256} DASH_CLIENTS=${DASH_CLIENTS:-1 8 32}
fi
SERVER_CPUS=${SERVER_CPUS:-0} CLIENT_CPUS=${CLIENT_CPUS:-1}
PGLINE_PORT=${PGLINE_PORT:-6396} PGWIRE_PORT=${PGWIRE_PORT:-6432}
KEYS_DASH=${KEYS_DASH:-uniform} DB=${DB:-pgline_pgwire}
CACHE=bench/.cache BENCH=target/release/pgline-bench PGLINE_BIN=target/release/pgline
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ $SMOKE = 1 ] && STAMP="smoke-$STAMP"
JSONL=bench/results/pgwire-$STAMP.jsonl
mkdir -p "$CACHE" bench/results

deploy/lab/setup.sh >/dev/null
eval "$(deploy/lab/pg.sh env)"
DB_ARGS="user=$PGUSER password=$PGPASSWORD dbname=$DB"
ORIGIN="host=$PGHOST port=$PGPORT $DB_ARGS"
FRONT="host=127.0.0.1 port=$PGWIRE_PORT $DB_ARGS"
export PGLINE_BENCH_ORIGIN="$ORIGIN"
cargo build --release -q -p pgline-controlplane -p pgline-bench

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$PGLINE_PORT" "$PGWIRE_PORT"; do
    if port_busy "$p"; then echo "pgwire.sh: port $p is in use (set PGLINE_PORT/PGWIRE_PORT)" >&2; exit 1; fi
done

# Data first, with no pgline running (re-creating tables under it is DDL it would follow).
"$BENCH" load --keyspace "$ROWS" >/dev/null
"$BENCH" load --schema saas --tenants "$TENANTS" --tasks "$TASKS" >/dev/null
psql -q -d "$DB" -c "VACUUM ANALYZE bench_rows"

PGLINE_PID=""
stop_pgline() {
    [ -n "$PGLINE_PID" ] || return 0
    kill "$PGLINE_PID" 2>/dev/null || true
    wait "$PGLINE_PID" 2>/dev/null || true
    PGLINE_PID=""
}
trap 'stop_pgline; deploy/lab/pg.sh drop-slot pgline_pgwire_bench || true' EXIT
taskset -c "$SERVER_CPUS" "$PGLINE_BIN" serve --origin "$ORIGIN" --listen "127.0.0.1:$PGLINE_PORT" \
    --cores 1 --memory 1GiB \
    --set pgwire.listen="\"127.0.0.1:$PGWIRE_PORT\"" \
    --set replication.slot='"pgline_pgwire_bench"' --set replication.publication='"pgline_pgwire_bench"' \
    --set 'catalog.tables=["public.bench_rows","public.tenants","public.users","public.projects","public.tasks","public.comments"]' \
    --set log.level='"warn"' ${PGLINE_EXTRA:-} >"$CACHE/pgline-pgwire.log" 2>&1 &
PGLINE_PID=$!
for _ in $(seq 1 300); do
    redis-cli -p "$PGLINE_PORT" INFO replication 2>/dev/null | grep -q 'serving_hits:1' && break
    kill -0 "$PGLINE_PID" 2>/dev/null || break
    sleep 0.1
done
if ! redis-cli -p "$PGLINE_PORT" INFO replication 2>/dev/null | grep -q 'serving_hits:1' \
    || ! pg_isready -q -h 127.0.0.1 -p "$PGWIRE_PORT"; then
    echo "pgwire.sh: pgline did not start serving; its log:" >&2
    cat "$CACHE/pgline-pgwire.log" >&2
    exit 1
fi
# Every bench_rows row into the store (and checked against the origin) before the first cell.
"$BENCH" stale-check --resp "127.0.0.1:$PGLINE_PORT" --keyspace "$ROWS" --expect-zero >/dev/null

cell() { # label where(origin|pgline) args...
    local label=$1 where=$2; shift 2
    local pg=$ORIGIN extra=()
    if [ "$where" = pgline ]; then pg=$FRONT; extra=(--info "127.0.0.1:$PGLINE_PORT"); fi
    taskset -c "$CLIENT_CPUS" "$BENCH" run --scenario pgwire --label "$label $where" \
        --target pg-prepared --pg "$pg" --server-pid "pgline=$PGLINE_PID" "${extra[@]}" \
        --duration "$DURATION" --warmup "$WARMUP" --out "$JSONL" "$@" >/dev/null
    tail -1 "$JSONL" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("%-22s %-22s clients=%-4s %9.0f req/s p50=%7.0fus p99=%7.0fus errors=%s store_hits=%s client_cpu=%.1fs pgline_cpu=%.1fs" % (r["label"], r["pg"], r["clients"], r["rps"], r["p50_us"], r["p99_us"], r["errors"], r["server_keyspace_hits"], r["client_cpu_s"] or 0, r["server_cpu_s"].get("pgline", 0)))'
    echo "    load average after the cell: $(cut -d' ' -f1-3 /proc/loadavg)"
}

for c in $POINT_CLIENTS; do
    for where in origin pgline; do
        cell point "$where" --pg-query columns --keys uniform --keyspace "$ROWS" --clients "$c"
    done
done
# What pass-through costs per statement: a cheap statement pgline forwards (row_to_json is a
# function call, so not a cached point lookup), 1 client.
for where in origin pgline; do
    cell forwarded "$where" --pg-query volatile --keys uniform --keyspace "$ROWS" --clients 1
done
for c in $DASH_CLIENTS; do
    for where in origin pgline; do
        cell dashboard "$where" --op dashboard --keys "$KEYS_DASH" --keyspace "$TENANTS" --clients "$c"
    done
done
stop_pgline

"$BENCH" check-jsonl "$JSONL" >/dev/null
python3 - "$JSONL" "$SMOKE" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
smoke = sys.argv[2] == "1"
by = {(r["label"], r["clients"]): r for r in rows}
print("| workload | clients | origin req/s | origin p50 / p99 µs | pgline req/s | pgline p50 / p99 µs | pgline/origin req/s | origin/pgline p50 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
bad = []
for (label, c), o in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    if not label.endswith(" origin"):
        continue
    name = label[: -len(" origin")]
    p = by.get((name + " pgline", c))
    if p is None:
        bad.append(f"{name} {c}: no pgline row")
        continue
    unit = "pages/s" if o["op"] == "dashboard" else "req/s"
    print(f"| {name} ({unit}) | {c} | {o['rps']:.0f} | {o['p50_us']:.0f} / {o['p99_us']:.0f} | "
          f"{p['rps']:.0f} | {p['p50_us']:.0f} / {p['p99_us']:.0f} | "
          f"{p['rps'] / max(o['rps'], 1e-9):.2f}x | {o['p50_us'] / max(p['p50_us'], 1e-9):.2f}x |")
for r in rows:
    if r["errors"] or r["requests"] == 0:
        bad.append(f"{r['label']} clients={r['clients']}: {r['requests']} requests, {r['errors']} errors")
    if r["label"] == "forwarded pgline" and (r.get("server_keyspace_hits") or 0) > 0:
        bad.append("forwarded pgline: store hits for a statement that must pass through")
    if r["label"] == "dashboard pgline" and smoke and not (r.get("server_keyspace_hits") or 0) > 0:
        bad.append(f"dashboard pgline clients={r['clients']}: no answers from the result cache")
    if r["label"] == "point pgline" and not (r.get("server_keyspace_hits") or 0) > 0:
        bad.append(f"point pgline clients={r['clients']}: no store hits")
print(f"\nrows: {len(rows)} in {sys.argv[1]}")
if bad:
    print("pgwire.sh: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
EOF
