#!/usr/bin/env bash
# When a cold store pays back (issue 15: "cold cache no slower than the origin"): pgbench -S
# (prepared) for minutes on a pgline whose store starts empty and is smaller than the working
# set, interval by interval beside the same run straight at the origin. The cold cells of
# bench/pgwire-pgbench.sh last 10 s, nearly all misses; this shows how the rate moves as the
# store fills and starts evicting, and when pgline passes the origin.
#
#   bench/pgwire-cold-payback.sh                      # 1, 8, 32 clients; 180 s each; 10 s steps
#   CLIENTS=8 DURATION=120 bench/pgwire-cold-payback.sh
#   SERVER_CPUS=0 ORIGIN_CPUS=1 CLIENT_CPUS=1 bench/pgwire-cold-payback.sh
#                       # as on the appliance: pgline on a CPU of its own, origin and pgbench on 1
#
# Each client count: the origin column, then a fresh pgline (empty store of MEMORY, 256MiB:
# the scale-10 accounts take about 320 MiB of store, so it evicts once full), the order
# reversed for every other client count. pgbench reports each INTERVAL (`-P`); pgline's store
# hits and misses are read from RESP INFO at the same steps. Printed: per step the two rates,
# their ratio and the share of lookups the store answered; then per client count the whole
# run's ratio, the last third's, and the first step from which pgline stayed at or above the
# origin. Rows: bench/results/cold-payback-<UTC stamp>.jsonl.
#
# Environment: CLIENTS ("1 8 32"), DURATION (180), INTERVAL (10), MEMORY (256MiB), JOBS (2, at
# most the clients), DB (pgline_pgbench_s10, made by bench/pgwire-pgbench.sh), PGLINE_BIN
# (target/release/pgline), PGLINE_EXTRA (more `serve` arguments), SERVER_CPUS / CLIENT_CPUS
# (taskset lists for pgline / pgbench; unset: unpinned), ORIGIN_CPUS (every process of the lab
# origin moved there for the run, back to every CPU at its end), ports PGLINE_PORT (6461, RESP),
# API_PORT (6462), PGWIRE_PORT (6463). Against the lab origin (deploy/lab/pg.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib-pgline.sh
CLIENTS=${CLIENTS:-1 8 32}
DURATION=${DURATION:-180}
INTERVAL=${INTERVAL:-10}
MEMORY=${MEMORY:-256MiB}
JOBS=${JOBS:-2}
DB=${DB:-pgline_pgbench_s10}
PGLINE_BIN=${PGLINE_BIN:-target/release/pgline}
PGLINE_PORT=${PGLINE_PORT:-6461}
API_PORT=${API_PORT:-6462}
PGWIRE_PORT=${PGWIRE_PORT:-6463}
SLOT=pgline_cold_payback
for tool in pgbench psql pg_isready redis-cli python3 taskset; do
    command -v "$tool" >/dev/null || { echo "pgwire-cold-payback.sh: $tool not found" >&2; exit 1; }
done
[ -x "$PGLINE_BIN" ] || { echo "pgwire-cold-payback.sh: $PGLINE_BIN is not an executable" >&2; exit 1; }
eval "$(deploy/lab/pg.sh env)"
export PGHOST PGPORT PGUSER PGPASSWORD
psql -qtA -d "$DB" -c "SELECT count(*) FROM pgbench_accounts" >/dev/null 2>&1 || {
    echo "pgwire-cold-payback.sh: no $DB (bench/pgwire-pgbench.sh makes it)" >&2
    exit 1
}
ORIGIN="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB"
TMPD=$(mktemp -d)
trap bench_cleanup EXIT
if [ -n "${ORIGIN_CPUS:-}" ]; then
    pin_origin "$ORIGIN_CPUS"
    trap 'pin_origin "0-$(($(nproc) - 1))"; bench_cleanup' EXIT
fi
PIN_SERVER=() PIN_CLIENT=()
if [ -n "${SERVER_CPUS:-}" ]; then PIN_SERVER=(taskset -c "$SERVER_CPUS"); fi
if [ -n "${CLIENT_CPUS:-}" ]; then PIN_CLIENT=(taskset -c "$CLIENT_CPUS"); fi
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
JSONL=bench/results/cold-payback-$STAMP.jsonl
mkdir -p bench/results

echo "pgwire-cold-payback.sh: $(date -u +%FT%TZ) $DB, ${DURATION}s runs in ${INTERVAL}s steps, clients $CLIENTS, store $MEMORY"
echo "  pgline $PGLINE_BIN ($("$PGLINE_BIN" --version 2>/dev/null | head -1)) on CPUs ${SERVER_CPUS:-any}; pgbench on ${CLIENT_CPUS:-any}; origin on ${ORIGIN_CPUS:-any}; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"

store_counts() { # "hits misses" of pgline's store so far
    redis-cli -p "$PGLINE_PORT" INFO stats 2>/dev/null | tr -d '\r' | awk -F: '
        $1 == "keyspace_hits" {h = $2} $1 == "keyspace_misses" {m = $2} END {print h + 0, m + 0}'
}

run() { # target clients: pgbench's progress to $TMPD/<target>.out, store counts to .info
    local target=$1 c=$2 port=$PGPORT jobs=$JOBS sampler=""
    if [ "$jobs" -gt "$c" ]; then jobs=$c; fi
    : >"$TMPD/$target.info"
    if [ "$target" = pgline ]; then
        # The store's hits and misses at every step, beside pgbench's own progress lines.
        pgline_serve "$PGLINE_BIN" "$MEMORY" ${PGLINE_EXTRA:-}
        port=$PGWIRE_PORT
        (while sleep "$INTERVAL"; do store_counts; done) >"$TMPD/$target.info" &
        sampler=$!
        BENCH_KILL=$sampler
    fi
    "${PIN_CLIENT[@]}" pgbench -n -S -M prepared -h 127.0.0.1 -p "$port" -c "$c" -j "$jobs" \
        -T "$DURATION" -P "$INTERVAL" "$DB" >"$TMPD/$target.out" 2>&1 || {
        cat "$TMPD/$target.out" >&2
        exit 1
    }
    if [ -n "$sampler" ]; then
        kill "$sampler" 2>/dev/null || true
        wait "$sampler" 2>/dev/null || true
        BENCH_KILL=""
        store_counts >>"$TMPD/$target.info" # the last step's, a moment after it ended
        pgline_stop
    fi
}

i=0
for c in $CLIENTS; do
    i=$((i + 1))
    order="origin pgline"
    [ $((i % 2)) = 0 ] && order="pgline origin"
    for target in $order; do
        run "$target" "$c"
    done
    python3 - "$JSONL" "$TMPD" "$c" "$INTERVAL" "$PGLINE_BIN" "${SERVER_CPUS:-}" "$MEMORY" \
        "${ORIGIN_CPUS:-}" <<'EOF'
import json, re, sys
out, tmpd, clients, step, label, cpus, memory, origin_cpus = sys.argv[1:]
step = float(step)
def progress(target):
    rates = []
    for line in open(f"{tmpd}/{target}.out"):
        m = re.match(r"progress: ([0-9.]+) s, ([0-9.]+) tps", line)
        if m:
            rates.append(float(m.group(2)))
    return rates
origin, pgline = progress("origin"), progress("pgline")
counts = [tuple(map(int, l.split())) for l in open(f"{tmpd}/pgline.info") if l.strip()]
n = min(len(origin), len(pgline))
if n == 0:
    sys.exit("pgwire-cold-payback.sh: no progress lines")
rows = []
print(f"\nclients={clients}")
print("| seconds | origin tps | pgline tps | pgline / origin | store hit share |")
print("|---:|---:|---:|---:|---:|")
prev = (0, 0)
for k in range(n):
    share = None
    if k < len(counts):
        dh, dm = counts[k][0] - prev[0], counts[k][1] - prev[1]
        prev = counts[k]
        share = dh / (dh + dm) if dh + dm > 0 else None
    ratio = pgline[k] / origin[k] if origin[k] else None
    row = {"clients": int(clients), "t_end_s": (k + 1) * step, "origin_tps": origin[k],
           "pgline_tps": pgline[k], "ratio": ratio, "hit_share": share, "pgline": label,
           "server_cpus": cpus or None, "origin_cpus": origin_cpus or None, "memory": memory}
    rows.append(row)
    print("| %g-%g | %.0f | %.0f | %s | %s |" % (k * step, (k + 1) * step, origin[k], pgline[k],
          "%.2fx" % ratio if ratio else "-", "%.0f %%" % (100 * share) if share is not None else "-"))
whole = sum(pgline[:n]) / sum(origin[:n])
third = max(1, n // 3)
last = sum(pgline[n - third:n]) / sum(origin[n - third:n])
parity = next((k for k in range(n) if all(pgline[j] >= origin[j] for j in range(k, n))), None)
summary = {"clients": int(clients), "summary": True, "steps": n, "ratio_whole": whole,
           "ratio_last_third": last, "parity_from_s": parity * step if parity is not None else None,
           "pgline": label, "server_cpus": cpus or None, "origin_cpus": origin_cpus or None, "memory": memory}
print("whole run %.2fx of the origin; last %g s %.2fx; at or above the origin from %s" % (
    whole, third * step, last, "%g s on" % (parity * step) if parity is not None else "never"))
with open(out, "a") as f:
    for r in rows + [summary]:
        f.write(json.dumps(r) + "\n")
EOF
done
echo "rows: $JSONL"
