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

/// A loopback port free at the time of the call, for a server the test starts later (which
/// must be told its port). Chosen at random below the kernel's ephemeral range
/// (`ip_local_port_range`), so that no outgoing connection, which takes its local port from
/// that range, can take it before the server binds (a cluster test lost its API port to one);
/// another test process may still pick the same one, one chance in thousands (this process
/// never hands one out twice). Where the ephemeral range leaves too little room below it, the
/// kernel picks.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let ephemeral_lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LO: u16 = 10_000;
    if ephemeral_lo > LO + 1_000 {
        for _ in 0..100 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            let port = LO + (h.finish() % u64::from(ephemeral_lo - LO)) as u16;
            if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
