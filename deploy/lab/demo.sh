#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running pgline: installs what is needed,
# starts a local PostgreSQL (wal_level=logical) with demo data, builds pgline and runs it on the
# kernel-socket path. Ctrl-C stops pgline (the origin keeps running: deploy/lab/pg.sh stop).
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/lab/setup.sh
eval "$(deploy/lab/pg.sh env)"
psql -q -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'demo'" -tA | grep -q 1 \
    || psql -q -d postgres -c "CREATE DATABASE demo"
if ! psql -q -d demo -tA -c "SELECT to_regclass('public.orders') IS NOT NULL" | grep -q t; then
    psql -q -d demo -f deploy/lab/demo.sql
fi
cargo build --release -p pgline-controlplane
cat <<MSG

  Demo origin: psql "host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=demo"
  Try:         redis-cli -p 6380 GET users:42
               redis-cli -p 6380 MGET users:1 users:2 orders:3:3
               redis-cli -p 6380 HGET users:42 email
               psql ... -c "UPDATE users SET plan = 'team' WHERE id = 42"   # then GET again

MSG
exec target/release/pgline serve --config deploy/lab/demo.toml \
    --origin "host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=demo"
