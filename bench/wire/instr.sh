#!/usr/bin/env bash
# Instructions per request on the server core, counted by callgrind over the lockstep driver
# (bench/wire/src/lockstep.rs): collection is limited to the server's `UserCore::poll_once`, and a
# short run is subtracted from a long one so connection set-up and warm-up drop out.
#
#   bench/wire/instr.sh                 # GET, depth 1, 16/256/1024 connections
#   CONNS="256" DEPTH=8 bench/wire/instr.sh
#
# Prints one line per connection count: instructions/request (server turn only).
set -euo pipefail
cd "$(dirname "$0")/../.."
CONNS=${CONNS:-"16 256 1024"}
DEPTH=${DEPTH:-1}
MGET=${MGET:-0}
SHORT=${SHORT:-20000}
LONG=${LONG:-80000}
[ -n "${BIN:-}" ] || cargo build --release -q -p pgline-wire-bench
BIN=${BIN:-target/release/pgline-wire-bench}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ir() { # conns requests -> Ir inside the server's turns
    valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$1.$2" \
        --toggle-collect='*UserCore*poll_once*' \
        "$BIN" --lockstep "$2" --conns "$1" --depth "$DEPTH" --mget "$MGET" --no-pin ${EXTRA:-} \
        >"$TMP/out.$1.$2" 2>"$TMP/err.$1.$2"
    grep -E '^(summary|totals):' "$TMP/cg.$1.$2" | head -1 | awk '{print $2}'
}
for c in $CONNS; do
    a=$(ir "$c" "$SHORT")
    b=$(ir "$c" "$LONG")
    echo "conns $c depth $DEPTH mget $MGET: $(( (b - a) / (LONG - SHORT) )) instructions/request (server turn; Ir $a @ $SHORT, $b @ $LONG)"
done
