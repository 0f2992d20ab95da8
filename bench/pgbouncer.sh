# Sourced by the benchmarks that set PgBouncer beside pgline (bench/pgwire-pgbench.sh,
# bench/pgwire-cost.sh): Debian's pgbouncer as a new user would set it up for transaction
# pooling, in front of the lab origin (PGHOST, PGPORT, PGUSER, PGPASSWORD).
#
#   start_pgbouncer DIR PORT DB [taskset prefix...]   # sets BOUNCER_PID; exits 1 if it fails
#
# As root PgBouncer runs as postgres, so DIR must be reachable by that user.

start_pgbouncer() {
    local dir=$1 port=$2 db=$3 bouncer user=()
    shift 3
    bouncer=$(command -v pgbouncer) || {
        echo "pgbouncer not found: apt-get install pgbouncer (deploy/lab/packages.txt)" >&2
        exit 1
    }
    mkdir -p "$dir"
    printf '"%s" "%s"\n' "$PGUSER" "$PGPASSWORD" >"$dir/userlist.txt"
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
$db = host=$PGHOST port=$PGPORT dbname=$db

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
log_connections = 0
log_disconnections = 0
INI
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres "$dir"
        user=(-u postgres) # pgbouncer refuses to run as root
    fi
    "$@" "$bouncer" "${user[@]}" "$dir/pgbouncer.ini" >"$dir/stdout" 2>&1 &
    BOUNCER_PID=$!
    for _ in $(seq 1 100); do
        pg_isready -q -h 127.0.0.1 -p "$port" -d "$db" && break
        kill -0 "$BOUNCER_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! psql -qtA -h 127.0.0.1 -p "$port" -d "$db" -c "SELECT 1" >/dev/null 2>&1; then
        echo "PgBouncer did not start; its log:" >&2
        cat "$dir/stdout" "$dir/pgbouncer.log" >&2 2>/dev/null || true
        exit 1
    fi
}
