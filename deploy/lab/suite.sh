#!/usr/bin/env bash
# The control plane's integration suite (controlplane/tests/suite.rs, one test binary with a
# module per file of controlplane/tests), run one module at a time, each module in a process of
# its own with two test threads: the way the separate test binaries ran before they became one.
# Stops at the first module that fails, as `cargo test` stops at the first failing binary.
#
#   deploy/lab/suite.sh                          every module
#   deploy/lab/suite.sh pgfront_relay wal_conn   these modules
#   deploy/lab/suite.sh --skip failover,check    every module but these
#
# Needs the lab origin (deploy/lab/setup.sh) and its environment, as `cargo test` does.
# PGLINE_SUITE_THREADS sets the test threads per module (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."

skip=","
if [ "${1:-}" = --skip ]; then
    skip=",${2:?--skip needs a comma-separated list of modules},"
    shift 2
fi

# `--workspace`, as deploy/lab/test.sh's other passes: the same feature unification, so the
# control plane's library they built is reused.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! cargo test --workspace --release --test suite --no-run >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi
cat "$log" >&2
exe=$(sed -n 's/^ *Executable tests\/suite\.rs (\(.*\))$/\1/p' "$log")
[ -x "$exe" ] || { echo "suite.sh: no suite executable in cargo's output" >&2; exit 1; }
exe=$(realpath "$exe")

list=$("$exe" --list --format terse | sed -n 's/: test$//p')
if [ $# -gt 0 ]; then
    modules=("$@")
else
    mapfile -t modules < <(printf '%s\n' "$list" | sed 's/::.*//' | sort -u)
fi

start=$SECONDS
for m in "${modules[@]}"; do
    case $skip in *",$m,"*) continue ;; esac
    mapfile -t names < <(printf '%s\n' "$list" | grep "^$m::" || true)
    [ ${#names[@]} -gt 0 ] || { echo "suite.sh: no module $m in the suite" >&2; exit 1; }
    printf '\n-- suite module %s (%s tests, %ss)\n' "$m" "${#names[@]}" "$((SECONDS - start))"
    # Exact names, so a module's name inside another test's path selects nothing else. Run
    # from the package's directory, as cargo runs its tests.
    (cd controlplane && "$exe" --exact --test-threads="${PGLINE_SUITE_THREADS:-2}" "${names[@]}")
done
