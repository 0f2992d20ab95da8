#!/usr/bin/env bash
# PostgreSQL front vs PgBouncer vs the origin, with PostgreSQL's own pgbench, side by side in one
# run (issue 15's benchmark). Also reached as `bench/pgwire.sh --pgbench [--smoke]`.
#
#   bench/pgwire-pgbench.sh            # full: scale 10 (1M accounts), 10 s cells, 1/8/32 clients
#   bench/pgwire-pgbench.sh --smoke    # CI: scale 1, 1 s cells, 1/8 clients, checked
#   SERVER_CPUS=0 bench/pgwire-pgbench.sh       # pinned: pgline and PgBouncer on CPU 0 only
#   SERVER_CPUS=0 ORIGIN_CPUS=1 CLIENT_CPUS=1 bench/pgwire-pgbench.sh   # "appliance": the proxy
#                                               # on a CPU of its own, origin and pgbench on another
#   PGLINE_BIN=/path/to/other/pgline bench/pgwire-pgbench.sh   # any build ("before"/"after")
#
# Three columns, each cell run against each of them in turn (order reversed every other round):
#   origin     the lab PostgreSQL directly;
#   PgBouncer  Debian's pgbouncer (1.18 on Debian 12), started here: pool_mode = transaction,
#              default_pool_size = 20 (pgline's pgwire.pool_size), SCRAM to clients and origin;
#   pgline     PGLINE_BIN (default target/release/pgline, built here) with its defaults, one
#              dataplane core, its PostgreSQL port on PGWIRE_PORT.
# Cells (pgbench -n, each printed as tps and p50 latency, from pgbench's per-transaction log):
#   tpcb      the built-in TPC-B-like script, -M simple, extended and prepared. PgBouncer gets
#             no prepared cell: 1.18 has no prepared statements in transaction mode (a named
#             statement is parsed on one server connection and executed on another: "prepared
#             statement does not exist"); 1.21 added max_prepared_statements.
#   select1   `SELECT 1;` (bench/pgwire-select1.pgbench), simple; prepared (origin, pgline).
#   txn10     BEGIN; 6 point reads; 2 updates; COMMIT (bench/pgwire-txn10.pgbench), simple.
#   cold      pgbench -S -M prepared, pgline's store emptied (`pgline flush`) before each pgline
#             cell, budget COLD_MEMORY (256MiB, pgline's default) below the working set (1M
#             accounts take ~320 MiB of store): misses and evictions throughout.
#   coldx     the cold cell with -M extended, PgBouncer included: what the same lookups cost
#             through the alternative proxy, which answers none from memory (not in the
#             default CELLS; PgBouncer's column shows what relaying alone costs the origin).
#   coldw     the cold cell with writers beside it: pgbench -N (simple-update: an account
#             updated, a history row inserted) at WRITE_RATE transactions a second over 4
#             connections straight to the origin, in every column. Open write transactions
#             hold every snapshot's xmin behind the writes pgline has applied; the pgline rows
#             count the lookups answered from their fill and those forwarded instead
#             (`fills_answered`, `fills_forwarded`, from /metrics). Not in the full run's
#             default CELLS; the smoke runs it.
#   warm      pgbench -S -M prepared on a second pgline (WARM_MEMORY, 1GiB) whose accounts were
#             loaded by `pgline tables add --warm` and read once by a WARMUP run.
# Every pgline cell also records the store hits and misses it caused (RESP INFO). Every cell
# prints ">2ms=": the share of its clients' time spent in transactions over 2 ms (stalls).
# Rows go to bench/results/pgbench-<UTC stamp>.jsonl (gitignored), the output to stdout; a
# Markdown table with both ratios and each round's figures ends it
# (bench/pgwire-pgbench-report.py, which also sets runs side by side: `... BEFORE.jsonl AFTER.jsonl`). The smoke (and any run)
# exits 1 when a cell failed, had failed transactions or no transactions, when a warm
# pgline cell had no store hits, or when a cold (or coldw) pgline cell missed but answered no
# miss from its fill.
#
# Environment: SCALE (10; smoke 1), DB (pgline_pgbench_s<SCALE>, created once by pgbench -i and
# reused while its row counts match), DURATION (seconds, 10; smoke 1), WARMUP (5; smoke 1),
# CLIENTS ("1 8 32"; smoke "1 8"), ROUNDS (2; smoke 1), CELLS ("tpcb select1 txn10 cold warm";
# smoke also coldw), JOBS (pgbench threads, 2, at most the clients), WRITE_RATE (coldw's writes
# a second, 200), SAMPLING (pgbench --sampling-rate for the latency log, 0.1; smoke 1),
# COLD_MEMORY (256MiB; smoke 16MiB), WARM_MEMORY (1GiB; smoke 256MiB), SERVER_CPUS (unset:
# unpinned; else taskset for pgline and PgBouncer), CLIENT_CPUS (unset; else taskset for
# pgbench), ORIGIN_CPUS (unset; else every process of the local origin is moved there for the
# run, and back to every CPU at its end), PGLINE_BIN, PGLINE_EXTRA (more `serve` arguments),
# LABEL (tag in every row, default the binary's path), ports PGLINE_PORT (6397, RESP), API_PORT
# (6398), PGWIRE_PORT (6433), BOUNCER_PORT (6434).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pgbouncer.sh
. bench/lib-pgline.sh

SMOKE=0
case "${1:-}" in
    --smoke) SMOKE=1 ;;
    "") ;;
    -h|--help) sed -n '2,59p' "$0"; exit 0 ;;
    *) echo "usage: bench/pgwire-pgbench.sh [--smoke]" >&2; exit 2 ;;
esac
if [ $SMOKE = 1 ]; then
    SCALE=${SCALE:-1} DURATION=${DURATION:-1} WARMUP=${WARMUP:-1} CLIENTS=${CLIENTS:-1 8}
    ROUNDS=${ROUNDS:-1} SAMPLING=${SAMPLING:-1} COLD_MEMORY=${COLD_MEMORY:-16MiB}
    WARM_MEMORY=${WARM_MEMORY:-256MiB} CELLS=${CELLS:-tpcb select1 txn10 cold coldw warm}
else
    SCALE=${SCALE:-10} DURATION=${DURATION:-10} WARMUP=${WARMUP:-5} CLIENTS=${CLIENTS:-1 8 32}
    ROUNDS=${ROUNDS:-2} SAMPLING=${SAMPLING:-0.1} COLD_MEMORY=${COLD_MEMORY:-256MiB}
    WARM_MEMORY=${WARM_MEMORY:-1GiB}
fi
CELLS=${CELLS:-tpcb select1 txn10 cold warm} JOBS=${JOBS:-2} WRITE_RATE=${WRITE_RATE:-200}
SERVER_CPUS=${SERVER_CPUS:-} CLIENT_CPUS=${CLIENT_CPUS:-} ORIGIN_CPUS=${ORIGIN_CPUS:-}
PGLINE_PORT=${PGLINE_PORT:-6397} API_PORT=${API_PORT:-6398}
PGWIRE_PORT=${PGWIRE_PORT:-6433} BOUNCER_PORT=${BOUNCER_PORT:-6434}
DB=${DB:-pgline_pgbench_s$SCALE}
SLOT=pgline_pgbench_$PGWIRE_PORT
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ $SMOKE = 1 ] && STAMP="smoke-$STAMP"
JSONL=bench/results/pgbench-$STAMP.jsonl
mkdir -p bench/results bench/.cache

for tool in pgbench psql pg_isready redis-cli curl taskset python3; do
    command -v "$tool" >/dev/null || { echo "pgwire-pgbench.sh: $tool not found (deploy/lab/setup.sh installs it)" >&2; exit 1; }
done
BOUNCER=$(command -v pgbouncer || true)
if [ -z "$BOUNCER" ]; then
    echo "pgwire-pgbench.sh: pgbouncer not found: apt-get install pgbouncer (deploy/lab/packages.txt; deploy/lab/setup.sh)" >&2
    exit 1
fi

deploy/lab/setup.sh >/dev/null
eval "$(deploy/lab/pg.sh env)"
export PGHOST PGPORT PGUSER PGPASSWORD
if [ -z "${PGLINE_BIN:-}" ]; then
    cargo build --release -q -p pgline-controlplane -p pgline-bench # one feature set for every script (bench/README.md)
    PGLINE_BIN=target/release/pgline
fi
[ -x "$PGLINE_BIN" ] || { echo "pgwire-pgbench.sh: PGLINE_BIN=$PGLINE_BIN is not an executable" >&2; exit 1; }
LABEL=${LABEL:-$PGLINE_BIN}
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"

for p in "$PGLINE_PORT" "$API_PORT" "$PGWIRE_PORT" "$BOUNCER_PORT"; do
    if bench_port_busy "$p"; then
        echo "pgwire-pgbench.sh: port $p is in use (set PGLINE_PORT/API_PORT/PGWIRE_PORT/BOUNCER_PORT)" >&2
        exit 1
    fi
done
# taskset prefixes (empty: unpinned). Commands are run as `"${PIN_X[@]}" cmd ... &`, a simple
# command, so that $! is the server's own pid (taskset execs it).
PIN_SERVER=() PIN_CLIENT=()
if [ -n "$SERVER_CPUS" ]; then PIN_SERVER=(taskset -c "$SERVER_CPUS"); fi
if [ -n "$CLIENT_CPUS" ]; then PIN_CLIENT=(taskset -c "$CLIENT_CPUS"); fi

# The pgbench database, made once per scale and reused while its row counts are right
# (`pgbench -i` takes seconds at scale 10 on the lab origin; DDL must not run under a pgline).
counts_ok() {
    [ "$(psql -qtA -d "$DB" -c "SELECT (SELECT count(*) FROM pgbench_branches) = $SCALE
        AND (SELECT count(*) FROM pgbench_accounts) = $SCALE * 100000" 2>/dev/null)" = t ]
}
if ! counts_ok; then
    echo "pgwire-pgbench.sh: creating $DB (pgbench -i -s $SCALE)"
    psql -q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
    pgbench -i -q -s "$SCALE" "$DB" >/dev/null 2>&1
    counts_ok || { echo "pgwire-pgbench.sh: pgbench -i did not give scale $SCALE in $DB" >&2; exit 1; }
fi
# TPC-B appends to pgbench_history in every run; start each run with it empty and statistics fresh.
psql -q -d "$DB" -c "TRUNCATE pgbench_history" -c "VACUUM ANALYZE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history"

TMPD=$(mktemp -d /tmp/pgline-pgbench.XXXXXX)
chmod 755 "$TMPD"
export PGLINE_API_TOKEN=${PGLINE_API_TOKEN:-pgbench-$RANDOM$RANDOM}
API="http://127.0.0.1:$API_PORT"
trap bench_cleanup EXIT

# The origin pinned for the run when ORIGIN_CPUS is set (pin_origin, bench/lib-pgline.sh): the
# proxy's CPUs are then its own, as on the appliance, and the origin column gets the same CPUs
# as the others.
if [ -n "$ORIGIN_CPUS" ]; then
    pin_origin "$ORIGIN_CPUS"
    trap 'pin_origin "0-$(($(nproc) - 1))"; bench_cleanup' EXIT
fi

# PgBouncer, as a new user would set it up for transaction pooling (bench/pgbouncer.sh).
start_pgbouncer "$TMPD/pgbouncer" "$BOUNCER_PORT" "$DB" "${PIN_SERVER[@]}"
BENCH_KILL=$BOUNCER_PID
BOUNCER_VERSION=$("$BOUNCER" --version | head -1)

start_pgline() { # memory extra-args...
    local memory=$1; shift
    # shellcheck disable=SC2086 # PGLINE_EXTRA: more arguments, split on spaces
    pgline_serve "$PGLINE_BIN" "$memory" "$@" ${PGLINE_EXTRA:-}
}
info_counts() { # "hits misses" of the pgline store, from RESP INFO
    redis-cli -p "$PGLINE_PORT" INFO stats 2>/dev/null | tr -d '\r' \
        | awk -F: '$1=="keyspace_hits"{h=$2} $1=="keyspace_misses"{m=$2} END{print h+0, m+0}'
}

fill_counts() { # "answered forwarded": PostgreSQL lookups answered from their fill, and not
    curl -sf -H "Authorization: Bearer $PGLINE_API_TOKEN" "$API/metrics" 2>/dev/null \
        | awk '$1 ~ /^pgline_core_pg_lookup_filled_total({|$)/ {a += $2}
               $1 ~ /^pgline_core_pg_lookup_fill_forwarded_total({|$)/ {f += $2}
               END {print a + 0, f + 0}'
}

port_of() { case $1 in origin) echo "$PGPORT" ;; pgbouncer) echo "$BOUNCER_PORT" ;; pgline) echo "$PGWIRE_PORT" ;; esac; }
RUN_NO=0
FAILED=0
run() { # cell target protocol clients round pgbench-args...
    local cell=$1 target=$2 mode=$3 clients=$4 round=$5; shift 5
    local jobs=$JOBS before="0 0" after="0 0" fills0="0 0" fills1="0 0" rc=0
    if [ "$jobs" -gt "$clients" ]; then jobs=$clients; fi
    RUN_NO=$((RUN_NO + 1))
    local prefix=$TMPD/log$RUN_NO load0
    load0=$(cut -d' ' -f1 /proc/loadavg)
    if [ "$target" = pgline ]; then before=$(info_counts) fills0=$(fill_counts); fi
    "${PIN_CLIENT[@]}" pgbench -n -h 127.0.0.1 -p "$(port_of "$target")" -M "$mode" \
        -c "$clients" -j "$jobs" -T "$DURATION" -l --log-prefix="$prefix" \
        --sampling-rate="$SAMPLING" "$@" "$DB" >"$prefix.out" 2>&1 || rc=$?
    if [ "$target" = pgline ]; then after=$(info_counts) fills1=$(fill_counts); fi
    python3 - "$JSONL" "$prefix" "$rc" "$cell" "$target" "$mode" "$clients" "$round" \
        "$before" "$after" "$load0" "$LABEL" "$SERVER_CPUS" "$DURATION" "$fills0" "$fills1" <<'EOF' || FAILED=1
import glob, json, re, sys, os
(out, prefix, rc, cell, target, mode, clients, rnd, before, after, load0, label, cpus,
 duration, fills0, fills1) = sys.argv[1:]
text = open(prefix + ".out").read()
def grab(pat, conv=float):
    m = re.search(pat, text, re.M)
    return conv(m.group(1)) if m else None
lat = []
for f in glob.glob(prefix + ".*"):
    if f.endswith(".out"):
        continue
    for line in open(f):
        parts = line.split()
        if len(parts) >= 3 and parts[2].isdigit():
            lat.append(int(parts[2]))
lat.sort()
def q(p):
    return lat[min(len(lat) - 1, int(p * len(lat)))] / 1000.0 if lat else None
h0, m0 = map(int, before.split()); h1, m1 = map(int, after.split())
a0, f0 = map(int, fills0.split()); a1, f1 = map(int, fills1.split())
row = {
    "cell": cell, "target": target, "protocol": mode, "clients": int(clients), "round": int(rnd),
    "tps": grab(r"^tps = ([0-9.]+)"), "xacts": grab(r"actually processed: (\d+)", int),
    "failed": grab(r"number of failed transactions: (\d+)", int) or 0,
    "lat_avg_ms": grab(r"^latency average = ([0-9.]+) ms"),
    "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": lat[-1] / 1000.0 if lat else None,
    # The share of the clients' time spent in transactions over 2 ms: stalls, not the body.
    "slow_share": sum(l for l in lat if l > 2000) / sum(lat) if lat and sum(lat) else None,
    "lat_samples": len(lat),
    "store_hits": h1 - h0, "store_misses": m1 - m0, "rc": int(rc),
    "fills_answered": a1 - a0, "fills_forwarded": f1 - f0,
    "load_before": float(load0), "load_after": float(open("/proc/loadavg").read().split()[0]),
    "duration_s": float(duration), "pgline": label, "server_cpus": cpus or None,
}
err = None
if row["rc"] != 0:
    errors = []  # the distinct error lines (not the per-client "aborted" ones), then the tail
    for line in text.splitlines():
        if "error:" in line and "aborted" not in line and line not in errors:
            errors.append(line)
    err = "pgbench exited %s: %s" % (rc, " | ".join(errors[:3] or text.strip().splitlines()[-3:]))
elif not row["xacts"] or not row["tps"]:
    err = "no transactions"
elif row["failed"]:
    err = "%d failed transactions" % row["failed"]
elif cell == "warm" and target == "pgline" and row["store_hits"] <= 0:
    err = "no store hits on a warm store"
elif cell in ("cold", "coldw") and target == "pgline" and row["store_misses"] > 0 \
        and row["fills_answered"] <= 0:
    err = "no miss answered from its fill (or /metrics unreadable)"
row["error"] = err
with open(out, "a") as f:
    f.write(json.dumps(row) + "\n")
hm = " hits=%d misses=%d fills=%d fwd=%d" % (
    row["store_hits"], row["store_misses"], row["fills_answered"], row["fills_forwarded"]
) if target == "pgline" else ""
print("%-7s %-9s %-8s c=%-3s r%s %10.0f tps  p50=%7.3fms p99=%7.3fms >2ms=%3.0f%%%s  load %s->%.2f%s" % (
    cell, target, mode, clients, rnd, row["tps"] or 0, row["p50_ms"] or 0, row["p99_ms"] or 0,
    100 * (row["slow_share"] or 0), hm, load0, row["load_after"], "  ERROR: " + err if err else ""), flush=True)
sys.exit(1 if err else 0)
EOF
}
targets_for() { # round with|without-pgbouncer: the columns in this round's order
    local t=(origin)
    [ "$2" = with ] && t+=(pgbouncer)
    t+=(pgline)
    if [ $(($1 % 2)) = 0 ]; then printf '%s\n' "${t[@]}" | tac; else printf '%s\n' "${t[@]}"; fi
}
has_cell() { case " $CELLS " in *" $1 "*) return 0 ;; esac; return 1; }
cold_cell() { # cell protocol with|without-pgbouncer clients round: pgbench -S, pgline's store
    local cell=$1 mode=$2 bouncer=$3 c=$4 r=$5 t writer   # flushed before its column
    for t in $(targets_for "$r" "$bouncer"); do
        if [ "$t" = pgline ]; then
            "$PGLINE_BIN" flush --api "$API" >/dev/null
        fi
        writer=""
        if [ "$cell" = coldw ]; then # the writers, straight to the origin, for the column's run
            pgbench -n -N -h 127.0.0.1 -p "$PGPORT" -c 4 -j 1 -R "$WRITE_RATE" \
                -T "$DURATION" "$DB" >"$TMPD/writer.out" 2>&1 &
            writer=$!
        fi
        run "$cell" "$t" "$mode" "$c" "$r" -S
        if [ -n "$writer" ] && ! wait "$writer"; then
            echo "pgwire-pgbench.sh: the coldw writers failed: $(tail -2 "$TMPD/writer.out")" >&2
            FAILED=1
        fi
    done
}

echo "pgwire-pgbench.sh: $(date -u +%FT%TZ) $DB (scale $SCALE), ${DURATION}s cells, clients $CLIENTS, rounds $ROUNDS"
echo "  pgline $LABEL ($("$PGLINE_BIN" --version 2>/dev/null | head -1)); $BOUNCER_VERSION; $(psql -qtA -d "$DB" -c 'SHOW server_version')"
echo "  pgline and PgBouncer on CPUs: ${SERVER_CPUS:-any}; pgbench on CPUs: ${CLIENT_CPUS:-any}; origin on CPUs: ${ORIGIN_CPUS:-any}; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"

# Pass-through and cold cells: one pgline with its defaults but the store budget.
start_pgline "$COLD_MEMORY"
for c in $CLIENTS; do
    for r in $(seq 1 "$ROUNDS"); do
        if has_cell tpcb; then
            for mode in simple extended; do
                for t in $(targets_for "$r" with); do run tpcb "$t" "$mode" "$c" "$r"; done
            done
            for t in $(targets_for "$r" without); do run tpcb "$t" prepared "$c" "$r"; done
        fi
        if has_cell select1; then
            for t in $(targets_for "$r" with); do run select1 "$t" simple "$c" "$r" -f bench/pgwire-select1.pgbench; done
            for t in $(targets_for "$r" without); do run select1 "$t" prepared "$c" "$r" -f bench/pgwire-select1.pgbench; done
        fi
        if has_cell txn10; then
            for t in $(targets_for "$r" with); do
                run txn10 "$t" simple "$c" "$r" -f bench/pgwire-txn10.pgbench -D scale="$SCALE"
            done
        fi
        if has_cell cold; then cold_cell cold prepared without "$c" "$r"; fi
        if has_cell coldx; then cold_cell coldx extended with "$c" "$r"; fi
        if has_cell coldw; then cold_cell coldw prepared without "$c" "$r"; fi
    done
done
pgline_stop

# Warm cells: a store that holds every account before the first measured transaction.
if has_cell warm; then
    start_pgline "$WARM_MEMORY" --set 'catalog.tables=["public.pgbench_branches","public.pgbench_tellers"]'
    "$PGLINE_BIN" tables add public.pgbench_accounts --warm --api "$API" >/dev/null
    max_c=$(printf '%s\n' $CLIENTS | sort -n | tail -1)
    "${PIN_CLIENT[@]}" pgbench -n -S -M prepared -h 127.0.0.1 -p "$PGWIRE_PORT" -c "$max_c" \
        -j "$JOBS" -T "$WARMUP" "$DB" >/dev/null 2>&1
    echo "  warm store: $(redis-cli -p "$PGLINE_PORT" INFO keyspace | tr -d '\r' | grep '^db0'), $(redis-cli -p "$PGLINE_PORT" INFO memory | tr -d '\r' | grep '^used_memory:')"
    for c in $CLIENTS; do
        for r in $(seq 1 "$ROUNDS"); do
            for t in $(targets_for "$r" without); do run warm "$t" prepared "$c" "$r" -S; done
        done
    done
    pgline_stop
fi

python3 bench/pgwire-pgbench-report.py --check "$JSONL"
[ "$FAILED" = 0 ] || { echo "pgwire-pgbench.sh: some cells failed (above)" >&2; exit 1; }
