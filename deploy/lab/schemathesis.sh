#!/usr/bin/env bash
# Property-based API test: schemathesis (PyPI) reads /v1/openapi.json of a live pgline and
# sends generated requests to every operation, with the bearer token; fails on any 5xx and on
# any response that does not match its documented schema.
#
#   deploy/lab/schemathesis.sh                # uses target/release/pgline, builds it if needed
#   PGLINE_BIN=target/debug/pgline deploy/lab/schemathesis.sh
#   ST_MAX_EXAMPLES=200 ST_SEED=7 deploy/lab/schemathesis.sh   # more cases, another seed
#
# It starts the lab origin (deploy/lab/pg.sh), loads the demo data into a database of its own,
# runs a pgline from deploy/lab/demo.toml on free ports (slot and publication of its own), then
# stops that pgline and drops its slot. schemathesis lives in a venv under /var/tmp.
set -euo pipefail
cd "$(dirname "$0")/../.."

ST_VERSION=${ST_VERSION:-4.32.5}
VENV=${ST_VENV:-/var/tmp/pgline-schemathesis}
MAX_EXAMPLES=${ST_MAX_EXAMPLES:-100}
DB=pgline_schemathesis
SLOT=pgline_schemathesis
WORK=$(mktemp -d /var/tmp/pgline-st.XXXXXX)
TOKEN="st-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"

deploy/lab/pg.sh start >/dev/null
eval "$(deploy/lab/pg.sh env)"

if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -qF "$ST_VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "schemathesis==$ST_VERSION"
fi

BIN=${PGLINE_BIN:-target/release/pgline}
if [ -z "${PGLINE_BIN:-}" ]; then
    cargo build --release -q -p pgline-controlplane -p pgline-bench # the benchmarks' feature set (bench/README.md)
fi

drop_db() {
    psql -q -d postgres -v ON_ERROR_STOP=0 >/dev/null 2>&1 <<SQL || true
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
 WHERE slot_name = '$SLOT' AND NOT active;
DROP DATABASE IF EXISTS $DB WITH (FORCE);
SQL
}
drop_db
psql -q -d postgres -c "CREATE DATABASE $DB"
PGOPTIONS="--client-min-messages=warning" psql -q -d "$DB" -f deploy/lab/demo.sql >/dev/null
psql -q -d "$DB" -c "CREATE TABLE extra (id int4 PRIMARY KEY, v text); CREATE TABLE nokey (v text);"

# Three distinct free ports, asked for while all three are held (so none is handed out twice).
read -r RESP_PORT API_PORT PG_PORT < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
API="http://127.0.0.1:$API_PORT"

PID=
cleanup() {
    if [ -n "$PID" ]; then
        kill "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    drop_db
    rm -rf "$WORK"
}
trap cleanup EXIT

PGLINE_API_TOKEN="$TOKEN" "$BIN" serve --config deploy/lab/demo.toml \
    --origin "host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$DB" \
    --listen "127.0.0.1:$RESP_PORT" \
    --memory 64MiB \
    --set "api.listen=\"127.0.0.1:$API_PORT\"" \
    --set "pgwire.listen=\"127.0.0.1:$PG_PORT\"" \
    --set "store.max_page=\"4KiB\"" \
    --set "replication.slot=\"$SLOT\"" \
    --set "replication.publication=\"$SLOT\"" \
    --set "log.level=\"debug\"" \
    >"$WORK/pgline.log" 2>&1 &
PID=$!

for _ in $(seq 1 150); do
    if curl -fsS "$API/v1/ready" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "schemathesis.sh: pgline exited:" >&2
        cat "$WORK/pgline.log" >&2
        exit 1
    fi
    sleep 0.2
done
curl -fsS "$API/v1/ready" >/dev/null || {
    echo "schemathesis.sh: pgline never became ready" >&2
    tail -50 "$WORK/pgline.log" >&2
    exit 1
}

# The binary's own wiring: log.level changes live (the log reload hook is installed).
code=$(curl -sS -o "$WORK/patch.json" -w '%{http_code}' -X PATCH "$API/v1/config" \
    -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d '{"log": {"level": "debug"}}')
if [ "$code" != 200 ]; then
    echo "schemathesis.sh: FAIL: PATCH log.level answered $code: $(cat "$WORK/patch.json")" >&2
    exit 1
fi

set +e
cd "$WORK"   # schemathesis writes a .schemathesis/ folder into the working directory
"$VENV/bin/schemathesis" run "$API/v1/openapi.json" \
    --url "$API" \
    --header "Authorization: Bearer $TOKEN" \
    --checks not_a_server_error,response_schema_conformance \
    --max-examples "$MAX_EXAMPLES" \
    --seed "${ST_SEED:-5}" \
    --no-color
rc=$?
set -e

if ! kill -0 "$PID" 2>/dev/null; then
    echo "schemathesis.sh: FAIL: pgline died during the run" >&2
    tail -50 "$WORK/pgline.log" >&2
    rc=1
fi
if grep -qF "$TOKEN" "$WORK/pgline.log"; then
    echo "schemathesis.sh: FAIL: the API token appears in pgline's log" >&2
    rc=1
fi
if [ "$rc" -ne 0 ]; then
    echo "schemathesis.sh: FAIL (exit $rc); pgline log tail:" >&2
    tail -30 "$WORK/pgline.log" >&2
else
    echo "schemathesis.sh: PASS"
fi
exit "$rc"
