#!/usr/bin/env bash
# The origin's cost of a fleet (issue 17): every appliance holds its own logical slot, so N
# appliances mean N walsenders decoding the same WAL. This measures, at one fixed write rate,
# the CPU of each walsender and of the whole origin for 1, 2, 4 and 8 consumers (real pgline
# processes), in two layouts side by side:
#   primary   every pgline's slot on the primary (the default layout);
#   standby   every pgline's slot on a physical standby of it (`replication.url`, PostgreSQL
#             16+ decoding on a standby): the primary feeds one physical walsender whatever N.
#
#   bench/fleet-origin.sh            # full: 1 2 4 8 consumers, 500 updates/s, 20 s per cell
#   bench/fleet-origin.sh --smoke    # CI: 1 2 consumers, 200 updates/s, 3 s per cell, checked
#
# Both servers are PostgreSQL 18 (deploy/lab/pg18.sh; Debian 12's 15 cannot decode on a
# standby), made here in throw-away directories on loopback ports and stopped at the end. The
# writes are pgbench (`UPDATE t SET n = n + 1 WHERE id = random`, one row per transaction, -R
# RATE, 2 clients) against the primary. CPU comes from /proc/<pid>/stat (user + system) before
# and after each cell:
#   walsender   the logical walsenders of this cell's slots (mean per walsender, and summed);
#   primary     every process of the primary's cluster (postmaster and all its children:
#               the writing backends, the WAL writer, the walsenders...);
#   standby     the same on the standby (standby layout only);
#   pglines     the N pgline processes together.
# Rows go to bench/results/fleet-origin-<UTC stamp>.jsonl (gitignored), a Markdown table to
# stdout. The smoke exits 1 when a cell's consumers did not keep up (a slot more than 16 MiB
# behind after the cell) or no walsender used any CPU.
#
# Environment: CONSUMERS ("1 2 4 8"; smoke "1 2"), LAYOUTS ("primary standby"), RATE (500;
# smoke 200), DURATION (20; smoke 3), ROWS (100000; smoke 10000), PGLINE_BIN (default
# target/release/pgline, built here), ports PRIMARY_PORT (54341), STANDBY_PORT (54342),
# BASE_PORT (6500: pgline i takes BASE_PORT+3i .. +3i+2).
set -euo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
case "${1:-}" in
    --smoke) SMOKE=1 ;;
    "") ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "usage: bench/fleet-origin.sh [--smoke]" >&2; exit 2 ;;
esac
if [ $SMOKE = 1 ]; then
    CONSUMERS=${CONSUMERS:-1 2} RATE=${RATE:-200} DURATION=${DURATION:-3} ROWS=${ROWS:-10000}
else
    CONSUMERS=${CONSUMERS:-1 2 4 8} RATE=${RATE:-500} DURATION=${DURATION:-20} ROWS=${ROWS:-100000}
fi
LAYOUTS=${LAYOUTS:-primary standby}
PRIMARY_PORT=${PRIMARY_PORT:-54341} STANDBY_PORT=${STANDBY_PORT:-54342} BASE_PORT=${BASE_PORT:-6500}
PASSWORD=pgline
DB=fleet

if [ -z "${PGLINE_BIN:-}" ]; then
    cargo build --release -q -p pgline-controlplane -p pgline-bench # one feature set for every script (bench/README.md)
    PGLINE_BIN=target/release/pgline
fi
PG_BIN=$(deploy/lab/pg18.sh)
PRIMARY_DIR=$(mktemp -d /var/tmp/pgline-fleet-primary.XXXXXX)
STANDBY_DIR=$(mktemp -d /var/tmp/pgline-fleet-standby.XXXXXX)
rmdir "$STANDBY_DIR" # pg_basebackup makes it
TMPD=$(mktemp -d)
PIDS=()
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    as_postgres "$PG_BIN/pg_ctl" -D "$STANDBY_DIR" -m immediate stop >/dev/null 2>&1 || true
    as_postgres "$PG_BIN/pg_ctl" -D "$PRIMARY_DIR" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$PRIMARY_DIR" "$STANDBY_DIR" "$TMPD"
}
trap cleanup EXIT

# The primary: the lab's settings (deploy/lab/pg.sh init) on its own port and directory.
[ "$(id -u)" = 0 ] && chown postgres:postgres "$PRIMARY_DIR"
PGLINE_PG_BIN=$PG_BIN PGLINE_PG_DIR=$PRIMARY_DIR PGLINE_PG_PORT=$PRIMARY_PORT deploy/lab/pg.sh start >/dev/null
export PGPASSWORD=$PASSWORD PGUSER=postgres PGHOST=127.0.0.1
psql_p() { psql -XqtA -p "$PRIMARY_PORT" "$@"; }
psql_s() { psql -XqtA -p "$STANDBY_PORT" "$@"; }
psql_p -d postgres -c "CREATE DATABASE $DB" >/dev/null
psql_p -d $DB -c "CREATE TABLE t (id int8 PRIMARY KEY, v text, n int8);
    INSERT INTO t SELECT g, 'row ' || g, 0 FROM generate_series(1, $ROWS) g;" >/dev/null
psql_p -d postgres -c "SELECT pg_create_physical_replication_slot('fleet_standby')" >/dev/null

# The standby: a base backup streaming from the primary through its physical slot, with the
# feedback that decoding on a standby needs.
as_postgres env PGPASSWORD=$PASSWORD "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY_PORT" \
    -U postgres -D "$STANDBY_DIR" -R -S fleet_standby -X stream -c fast
as_postgres sh -c "printf '%s\n' 'port = $STANDBY_PORT' 'hot_standby_feedback = on' >> '$STANDBY_DIR/postgresql.conf'"
as_postgres "$PG_BIN/pg_ctl" -D "$STANDBY_DIR" -l "$STANDBY_DIR/server.log" -w start >/dev/null
for _ in $(seq 1 100); do
    [ "$(psql_s -d $DB -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = t ] && break
    sleep 0.1
done

URL_P="host=127.0.0.1 port=$PRIMARY_PORT user=postgres password=$PASSWORD dbname=$DB"
URL_S="host=127.0.0.1 port=$STANDBY_PORT user=postgres password=$PASSWORD dbname=$DB"
cat > "$TMPD/update.pgbench" <<SQL
\set id random(1, $ROWS)
UPDATE t SET n = n + 1 WHERE id = :id;
SQL

# CPU seconds (user + system) of the processes given, from /proc (processes that ended count 0).
cpu() {
    local tck total=0 p f
    tck=$(getconf CLK_TCK)
    for p in "$@"; do
        f=$(cut -d' ' -f14,15 "/proc/$p/stat" 2>/dev/null) || continue
        total=$((total + ${f% *} + ${f#* }))
    done
    awk -v t="$total" -v k="$tck" 'BEGIN { printf "%.3f", t / k }'
}
# CPU seconds of the cluster in data directory $1: its live processes (postmaster and
# children) plus what the postmaster's children that have exited used (the postmaster reaps
# them: its cutime and cstime), so backends that came and went in a cell are counted.
cluster_cpu() {
    local pm reaped
    pm=$(head -1 "$1/postmaster.pid")
    reaped=$(cut -d' ' -f16,17 "/proc/$pm/stat")
    awk -v live="$(cpu "$pm" $(pgrep -P "$pm"))" -v r="$reaped" -v k="$(getconf CLK_TCK)" \
        'BEGIN { split(r, a, " "); printf "%.3f", live + (a[1] + a[2]) / k }'
}

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p bench/results
OUT=bench/results/fleet-origin-$([ $SMOKE = 1 ] && echo smoke- || true)$STAMP.jsonl
echo "fleet-origin.sh: $STAMP, PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}'), $RATE updates/s for ${DURATION}s per cell, consumers $CONSUMERS, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
FAILED=0

for layout in $LAYOUTS; do
    for n in $CONSUMERS; do
        PIDS=()
        slots=()
        for i in $(seq 0 $((n - 1))); do
            port=$((BASE_PORT + 3 * i))
            slot="fleet_${layout}_$i"
            slots+=("$slot")
            extra=()
            [ "$layout" = standby ] && extra=(--set "replication.url=\"$URL_S\"")
            "$PGLINE_BIN" serve --origin "$URL_P" --listen "127.0.0.1:$port" --memory 16MiB \
                --set api.listen="\"127.0.0.1:$((port + 1))\"" \
                --set pgwire.listen="\"127.0.0.1:$((port + 2))\"" \
                --set resp.spin_polls=50 \
                --set replication.slot="\"$slot\"" --set log.level='"warn"' "${extra[@]}" \
                >"$TMPD/pgline-$i.log" 2>&1 &
            PIDS+=($!)
        done
        for i in $(seq 0 $((n - 1))); do
            port=$((BASE_PORT + 3 * i))
            for _ in $(seq 1 300); do
                redis-cli -p "$port" INFO replication 2>/dev/null | grep -q 'serving_hits:1' && break
                kill -0 "${PIDS[$i]}" 2>/dev/null || break
                sleep 0.1
            done
            redis-cli -p "$port" INFO replication 2>/dev/null | grep -q 'serving_hits:1' || {
                echo "fleet-origin.sh: pgline $i ($layout) did not start streaming; its log:" >&2
                cat "$TMPD/pgline-$i.log" >&2
                exit 1
            }
        done
        psql_slots=psql_p
        [ "$layout" = standby ] && psql_slots=psql_s
        slot_list=$(printf "'%s'," "${slots[@]}")
        walsenders=$($psql_slots -d $DB -c "SELECT string_agg(active_pid::text, ' ')
            FROM pg_replication_slots WHERE slot_name IN (${slot_list%,})")
        [ "$(wc -w <<<"$walsenders")" = "$n" ] || { echo "fleet-origin.sh: expected $n walsenders, got '$walsenders'" >&2; exit 1; }
        ws0=$(cpu $walsenders)
        p0=$(cluster_cpu "$PRIMARY_DIR")
        s0=$(cluster_cpu "$STANDBY_DIR")
        g0=$(cpu "${PIDS[@]}")
        pgbench -n -p "$PRIMARY_PORT" -d $DB -f "$TMPD/update.pgbench" -c 2 -j 2 -R "$RATE" \
            -T "$DURATION" >"$TMPD/pgbench.log" 2>&1 || { cat "$TMPD/pgbench.log" >&2; exit 1; }
        ws1=$(cpu $walsenders)
        p1=$(cluster_cpu "$PRIMARY_DIR")
        s1=$(cluster_cpu "$STANDBY_DIR")
        g1=$(cpu "${PIDS[@]}")
        tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$TMPD/pgbench.log" | head -1)
        sleep 1
        behind=$($psql_slots -d $DB -c "SELECT coalesce(max(pg_current_wal_lsn() - confirmed_flush_lsn), 0)
            FROM pg_replication_slots WHERE slot_name IN (${slot_list%,})" 2>/dev/null || echo -1)
        if [ "$layout" = standby ]; then
            behind=$($psql_slots -d $DB -c "SELECT coalesce(max(pg_last_wal_replay_lsn() - confirmed_flush_lsn), 0)
                FROM pg_replication_slots WHERE slot_name IN (${slot_list%,})")
        fi
        row=$(awk -v l="$layout" -v n="$n" -v r="$RATE" -v d="$DURATION" -v tps="$tps" \
            -v w0="$ws0" -v w1="$ws1" -v p0="$p0" -v p1="$p1" -v s0="$s0" -v s1="$s1" \
            -v g0="$g0" -v g1="$g1" -v b="$behind" 'BEGIN {
            ws = (w1 - w0) / d * 100; printf "{\"layout\":\"%s\",\"consumers\":%d,\"rate\":%d,\"duration_s\":%d,\"tps\":%s,", l, n, r, d, tps
            printf "\"walsender_cpu_pct_each\":%.2f,\"walsender_cpu_pct_total\":%.2f,\"walsender_us_per_txn\":%.1f,", ws / n, ws, (w1 - w0) * 1e6 / (tps * d) / n
            printf "\"primary_cpu_pct\":%.2f,\"standby_cpu_pct\":%.2f,\"pglines_cpu_pct\":%.2f,\"slot_behind_bytes\":%d}\n", (p1 - p0) / d * 100, (s1 - s0) / d * 100, (g1 - g0) / d * 100, b }')
        echo "$row" >>"$OUT"
        echo "$row"
        if [ "$behind" -lt 0 ] || [ "$behind" -gt $((16 << 20)) ] \
            || awk -v a="$ws0" -v b="$ws1" 'BEGIN { exit !(b <= a) }'; then
            echo "fleet-origin.sh: $layout/$n: consumers $behind bytes behind, walsender CPU $ws0 -> $ws1" >&2
            FAILED=1
        fi
        for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
        wait "${PIDS[@]}" 2>/dev/null || true
        PIDS=()
        for s in "${slots[@]}"; do
            for _ in $(seq 1 100); do
                [ "$($psql_slots -d $DB -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$s' AND active")" = 0 ] && break
                sleep 0.1
            done
            $psql_slots -d $DB -c "SELECT pg_drop_replication_slot('$s')" >/dev/null
        done
    done
done

python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"\nrows: {len(rows)} in {sys.argv[1]}\n")
print("| layout | consumers | updates/s | CPU per walsender (% of a core) | µs per txn per walsender | walsenders together | primary (all processes) | standby (all processes) | pglines together |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    sb = f"{r['standby_cpu_pct']:.1f} %" if r["layout"] == "standby" else "-"
    print(f"| {r['layout']} | {r['consumers']} | {r['tps']:.0f} | {r['walsender_cpu_pct_each']:.2f} % | "
          f"{r['walsender_us_per_txn']:.1f} | {r['walsender_cpu_pct_total']:.1f} % | "
          f"{r['primary_cpu_pct']:.1f} % | {sb} | {r['pglines_cpu_pct']:.1f} % |")
PY
exit $FAILED
