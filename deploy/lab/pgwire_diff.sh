#!/usr/bin/env bash
# Runs pgline's pgwire differential suite.
#
#   deploy/lab/pgwire_diff.sh
#       the Rust tests (controlplane/tests/pgwire_diff.rs): a fresh database, an in-process
#       pgline, psql + tokio-postgres + psycopg in lockstep, origin vs pgline; plus the corpus
#       self-check (origin vs origin, and against mutated data).
#   deploy/lab/pgwire_diff.sh --origin DSN --pgline DSN [--load-schema]
#       only the psycopg client, against a pgline already running in front of the origin
#       database DSN names (--load-schema first loads controlplane/tests/pgwire_corpus/
#       schema.sql into it, for a database that does not have the tables yet).
#
# Needs the lab origin (deploy/lab/pg.sh start). Exit status 0 = no differences.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CORPUS="$ROOT/controlplane/tests/pgwire_corpus"
if [ $# -eq 0 ]; then
    cd "$ROOT"
    exec cargo test -p pgline-controlplane --test suite -- --nocapture pgwire_diff:: \
        pgwire_diff_catalog::
fi
ORIGIN="" PGLINE="" LOAD=0
while [ $# -gt 0 ]; do
    case "$1" in
        --origin) ORIGIN="$2"; shift 2 ;;
        --pgline) PGLINE="$2"; shift 2 ;;
        --load-schema) LOAD=1; shift ;;
        *) echo "pgwire_diff.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "$ORIGIN" ] || [ -z "$PGLINE" ]; then
    echo "pgwire_diff.sh: --origin and --pgline go together" >&2
    exit 2
fi
if [ "$LOAD" = 1 ]; then
    psql -X -q -v ON_ERROR_STOP=1 -d "$ORIGIN" -f "$CORPUS/schema.sql"
fi
PY="$("$ROOT/deploy/lab/pgwire_venv.sh")"
exec "$PY" "$ROOT/deploy/lab/pgwire_diff.py" --origin "$ORIGIN" --pgline "$PGLINE" \
    --corpus "$CORPUS/corpus.sql"
