#!/usr/bin/env bash
# A second lab origin that accepts only TLS, for the origin-TLS tests (docs/operations.md,
# "TLS to the origin"). Wraps deploy/lab/pg.sh with its own directory and port.
#
#   deploy/lab/pg-tls.sh start   # make the PKI and the cluster if needed, start on 127.0.0.1:54331
#   deploy/lab/pg-tls.sh stop
#   deploy/lab/pg-tls.sh pki     # print the PKI directory
#
# The PKI (openssl, ECDSA P-256) lives in $PGLINE_PG_TLS_PKI (default /var/tmp/pgline-pg-tls-pki):
#   ca.crt / ca.key            the CA that signs the server and client certificates
#   server.crt / server.key    the server's, subjectAltName DNS:localhost only (so host=127.0.0.1
#                              with sslmode=verify-full fails on the name)
#   client.crt / client.key    CN=pgline_cert, for the clientcert=verify-full user
#   other-ca.crt               a CA that signed nothing here (the "wrong CA" case)
# pg_hba.conf has no plain `host` line: TCP is TLS-only (hostssl, scram-sha-256); user
# pgline_cert must also present a client certificate (clientcert=verify-full). Local (Unix
# socket, /tmp) connections are trusted, for the tests' own set-up. Idempotent.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
export PGLINE_PG_DIR=${PGLINE_PG_TLS_DIR:-/var/tmp/pgline-pg-tls}
export PGLINE_PG_PORT=${PGLINE_PG_TLS_PORT:-54331}
PKI=${PGLINE_PG_TLS_PKI:-/var/tmp/pgline-pg-tls-pki}
PG_PASSWORD=${PGLINE_PG_PASSWORD:-pgline}
# A build with OpenSSL (the PostgreSQL 18 wheel has none): $PGLINE_PG_TLS_BIN, or the newest
# /usr/lib/postgresql/*/bin whose postgres links libssl. PGLINE_PG_BIN (a CI pass's other
# version) is not used here.
ssl_bin() {
    local b
    for b in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
        if ldd "$b/postgres" 2>/dev/null | grep -q libssl; then echo "$b"; return 0; fi
    done
    echo "pg-tls.sh: no PostgreSQL build with OpenSSL under /usr/lib/postgresql" >&2
    return 1
}
export PGLINE_PG_BIN=${PGLINE_PG_TLS_BIN:-$(ssl_bin)}

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pki() {
    [ -f "$PKI/other-ca.crt" ] && return 0
    mkdir -p "$PKI"
    chmod 700 "$PKI"
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    openssl req -x509 "${ec[@]}" -days 3650 -subj "/CN=pgline test CA" \
        -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
    openssl req "${ec[@]}" -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost" \
        -keyout "$PKI/server.key" -out "$PKI/server.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 825 -copy_extensions copy -out "$PKI/server.crt" 2>/dev/null
    openssl req "${ec[@]}" -subj "/CN=pgline_cert" \
        -keyout "$PKI/client.key" -out "$PKI/client.csr" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n' \
        > "$PKI/client.ext"
    openssl x509 -req -in "$PKI/client.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 825 -extfile "$PKI/client.ext" -out "$PKI/client.crt" 2>/dev/null
    openssl req -x509 "${ec[@]}" -days 3650 -subj "/CN=pgline other CA" \
        -keyout "$PKI/other-ca.key" -out "$PKI/other-ca.crt" 2>/dev/null
    chmod 600 "$PKI"/*.key
    rm -f "$PKI"/*.csr "$PKI"/*.ext
}

configure() {
    [ -f "$PGLINE_PG_DIR/pgline-tls.conf" ] && return 0
    "$HERE/pg.sh" init
    install -m 600 "$PKI/server.key" "$PGLINE_PG_DIR/server.key"
    install -m 644 "$PKI/server.crt" "$PGLINE_PG_DIR/server.crt"
    install -m 644 "$PKI/ca.crt" "$PGLINE_PG_DIR/root.crt"
    if [ "$(id -u)" = 0 ]; then
        chown postgres:postgres "$PGLINE_PG_DIR"/server.key "$PGLINE_PG_DIR"/server.crt \
            "$PGLINE_PG_DIR"/root.crt
    fi
    cat > "$PGLINE_PG_DIR/pg_hba.conf" <<HBA
local    all          all                          trust
hostssl  all          pgline_cert  127.0.0.1/32    scram-sha-256 clientcert=verify-full
hostssl  replication  pgline_cert  127.0.0.1/32    scram-sha-256 clientcert=verify-full
hostssl  all          all          127.0.0.1/32    scram-sha-256
hostssl  replication  all          127.0.0.1/32    scram-sha-256
HBA
    cat > "$PGLINE_PG_DIR/pgline-tls.conf" <<CONF
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_ca_file = 'root.crt'
ssl_min_protocol_version = 'TLSv1.2'
CONF
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$PGLINE_PG_DIR/pg_hba.conf" \
        "$PGLINE_PG_DIR/pgline-tls.conf"
    echo "include 'pgline-tls.conf'" >> "$PGLINE_PG_DIR/postgresql.conf"
}

start() {
    pki
    configure
    "$HERE/pg.sh" start
    as_postgres psql -h /tmp -p "$PGLINE_PG_PORT" -U postgres -d postgres -qtA -c "
        DO \$\$ BEGIN
          IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgline_cert') THEN
            CREATE ROLE pgline_cert LOGIN SUPERUSER REPLICATION PASSWORD '$PG_PASSWORD';
          END IF;
        END \$\$;" >/dev/null
}

case "${1:-start}" in
    start) start ;;
    stop) "$HERE/pg.sh" stop ;;
    pki) echo "$PKI" ;;
    *) echo "usage: $0 start|stop|pki" >&2; exit 2 ;;
esac
