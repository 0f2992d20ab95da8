#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs, starts the origin, then runs
# formatting, lints and every test against the real PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/lab/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release -- --test-threads=2
bench/resp_vs_valkey.sh --smoke
