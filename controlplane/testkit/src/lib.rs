//! Test support for pgline's integration tests (`controlplane/tests`), in one place.
//!
//! - [`origin`]: the lab PostgreSQL origin, a database of its own per test ([`TestDb`]), and
//!   what the tests ask the origin directly ([`origin::origin_json`], [`origin::origin_lsn`]).
//! - [`lab`]: a real pgline booted in-process against a test database: its configuration,
//!   start, waiting for replication to catch up, and the staleness probe.
//! - [`resp`]: a raw RESP client (bytes in, whole frames out, unparsed) and RESP encoding.
//! - [`pg`]: a raw PostgreSQL protocol client (SCRAM-SHA-256 login, whole backend messages
//!   out), for tests that compare bytes or send what a driver would not; its [`pg::Login`] is
//!   the tests' one SCRAM client, also used by the dataplane's tests over their own sockets.
//! - [`pgbench`]: PostgreSQL's own `pgbench` against the origin or pgline's PostgreSQL port.
//! - [`pair`]: a primary + physical standby (`deploy/lab/pair.sh`) for the failover and
//!   standby-tailing tests.
//! - [`pki`]: a throw-away CA with server and client certificates (current or expired) as PEM
//!   files, for the TLS tests.
//!
//! `lab` and `resp` need the `pgline` feature (on by default); the dataplane's tests use the
//! crate without it, so that they do not build the control plane.
//!
//! Invariants: every test database is dropped, with its replication slots, when its guard
//! drops, so tests run in parallel without seeing each other's tables, publications or slots.
//! The origin is the lab cluster that `deploy/lab/pg.sh` starts (settings overridable with
//! `PGLINE_TEST_PG_*`). A separate crate (not a `mod` in every test binary) so that nothing
//! needs `#[allow(dead_code)]`: see docs/decisions.md.
#![deny(unsafe_code)]

#[cfg(feature = "pgline")]
pub mod lab;
pub mod origin;
pub mod pair;
pub mod pg;
pub mod pgbench;
pub mod pki;
#[cfg(feature = "pgline")]
pub mod resp;

pub use origin::TestDb;

/// A loopback port free at the time of the call, for a server the test starts as a process
/// (which must be told its port): another process may take it before the server binds.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
