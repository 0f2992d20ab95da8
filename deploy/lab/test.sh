#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs, starts the origin, then runs
# formatting, lints and every test against the real PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/lab/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --features pgline-nic/dpdk -- -D warnings
cargo test --workspace --release -- --test-threads=2
# The DPDK backend: EAL with --no-pci --no-huge and virtual devices only (net_ring, net_null,
# net_tap, net_af_packet and net_af_xdp on a veth into a namespace the test creates).
cargo test -p pgline-nic -p pgline-dpdk-sys --features pgline-nic/dpdk --release -- --test-threads=2
bench/resp_vs_valkey.sh --smoke
