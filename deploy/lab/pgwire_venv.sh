#!/usr/bin/env bash
# Makes (once) the Python venv the pgwire differential suite's psycopg client runs in and prints
# its python's path. The venv lives under the workspace's target/ (PGLINE_PGWIRE_VENV overrides),
# psycopg 3 with its binary build, redis-py (the RESP TLS test's Python client) and valkey-glide
# (cluster_e2e's second Python cluster client) come from PyPI.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${PGLINE_PGWIRE_VENV:-$ROOT/target/pgwire-venv}"
PSYCOPG_VERSION="3.2.13"
REDIS_PY_VERSION="5.2.1"
GLIDE_VERSION="2.6.0"
mkdir -p "$(dirname "$VENV")"
# Tests may ask at the same time: one makes the venv, the others wait for it.
exec 9>"$VENV.lock"
flock 9
if ! "$VENV/bin/python" -c "import psycopg, redis, glide" >/dev/null 2>&1; then
    [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        "psycopg[binary]==$PSYCOPG_VERSION" "redis==$REDIS_PY_VERSION" \
        "valkey-glide==$GLIDE_VERSION" >&2
fi
echo "$VENV/bin/python"
