//! The control plane's integration tests, one binary: each module was a test binary of its own
//! (`tests/<module>.rs`, the same files). One binary compiles once instead of 33 times: the 33
//! took about 950 s of CPU, each monomorphizing tokio, tokio-postgres and the test kit again;
//! this one takes 136 s (`docs/decisions.md`).
//!
//! `deploy/lab/suite.sh` runs it the way the separate binaries ran: one module at a time, each in
//! a process of its own, so a module's tests share the origin and the CPUs only with each other
//! (several hold a module-wide lock to run alone, or install a process-wide log subscriber).
//! One module by hand: `cargo test --release --test suite -- pgfront_relay::`.
//! `dpdk_veth` (the dpdk feature) stays a binary of its own.

mod admin_ops;
mod adversarial_catalog;
mod adversarial_identity;
mod adversarial_limits;
mod adversarial_relay;
mod advise_e2e;
mod api_e2e;
mod check;
mod cli;
mod client_tracking;
mod cluster_e2e;
mod ddl_coherence;
mod failover;
mod metrics_live;
mod module_cycles;
mod origin_tls;
mod pgfront_balancer;
mod pgfront_relay;
mod pgwire_api;
mod pgwire_corpus;
mod pgwire_diff;
mod pgwire_diff_catalog;
mod pgwire_e2e;
mod pgwire_miss;
mod pgwire_results;
mod pgwire_tls;
mod resp_behaviour;
mod resp_e2e;
mod resp_malformed;
mod resp_tls;
mod rowjson_origin;
mod stale_probe;
mod standby_tail;
mod userspace_e2e;
mod visibility_gap;
mod wal_conn;
mod wal_consumer;
mod wal_streaming;
