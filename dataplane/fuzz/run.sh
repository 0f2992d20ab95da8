#!/usr/bin/env bash
# Runs every fuzz target of the dataplane (fuzz_targets/*.rs) for a bounded time each, with
# libFuzzer through cargo-fuzz, starting from the committed seeds (seeds/<target>/) and the
# corpus grown by earlier runs (corpus/<target>/, not committed), with dicts/<target>.dict as
# its dictionary when there is one. Fails if any target finds a
# crash or a broken invariant; the input that did it is in artifacts/<target>/.
#
#   dataplane/fuzz/run.sh                      # every target, 60 s each
#   FUZZ_SECONDS=10 dataplane/fuzz/run.sh      # shorter
#   dataplane/fuzz/run.sh pgwire_startup       # some targets only
#
# Needs: cargo-fuzz (installed with `cargo install` from crates.io if missing, pinned below)
# and a toolchain that takes `-Z` flags: the nightly toolchain if rustup has it, else the
# default toolchain with RUSTC_BOOTSTRAP=1 (a machine may have no nightly and no way to fetch
# one). No standard input is read; CI=true changes nothing.
set -euo pipefail
cd "$(dirname "$0")"

SECONDS_EACH=${FUZZ_SECONDS:-60}
CARGO_FUZZ_VERSION=0.13.2
exec </dev/null

if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    TOOLCHAIN=(+nightly)
else
    echo "no nightly toolchain: the default one with RUSTC_BOOTSTRAP=1"
    TOOLCHAIN=()
    export RUSTC_BOOTSTRAP=1
fi

if [ "$#" -gt 0 ]; then
    TARGETS=("$@")
else
    TARGETS=()
    for f in fuzz_targets/*.rs; do
        TARGETS+=("$(basename "$f" .rs)")
    done
fi

echo "== building the fuzz targets"
cargo "${TOOLCHAIN[@]}" fuzz build
failed=()
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t" "seeds/$t"
    echo "== fuzz $t for ${SECONDS_EACH}s"
    log=$(mktemp)
    dict=()
    if [ -f "dicts/$t.dict" ]; then
        dict=(-dict="dicts/$t.dict")
    fi
    if cargo "${TOOLCHAIN[@]}" fuzz run "$t" "corpus/$t" "seeds/$t" -- "${dict[@]}" \
        -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' "$log" || true
        echo "fuzz $t: ok, $(find "corpus/$t" -type f | wc -l) inputs in its corpus"
    else
        tail -n 60 "$log"
        echo "fuzz $t: FAILED; the input is under $(pwd)/artifacts/$t/"
        failed+=("$t")
    fi
    rm -f "$log"
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz targets failed: ${failed[*]}"
    exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets, ${SECONDS_EACH}s each, no failure"
