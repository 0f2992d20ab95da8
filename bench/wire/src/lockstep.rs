//! The lockstep driver: server core and client in one thread, turn for turn, for a fixed number
//! of replies. What it is for: counting the server core's cost per request without the noise of
//! a shared machine (no cross-thread spinning, no preemption between the two sides).
//!
//! Run it under callgrind with collection limited to the server's turn to get instructions per
//! request, e.g. (`bench/wire/instr.sh` does this and subtracts a short run to drop the set-up):
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*UserCore*poll_once*' \
//!     target/release/pgline-wire-bench --lockstep 50000 --conns 256
//! ```
//!
//! Time is virtual (a fixed step per round), so the stacks' timers behave the same under
//! callgrind as natively. Without valgrind it reports the server's CPU time per request in its turns (thread CPU clock
//! around `poll_once`). One CPU runs both sides, so the frames a side reads were written by the
//! same CPU: this is the cost without cross-CPU cache traffic, a lower bound for the threaded
//! benchmark.
//!
//! Limitations: the client keeps `depth` requests in flight per connection as in the threaded
//! run, but each server turn sees whatever the client's last turn sent (at most `rx_burst`
//! frames), so batches follow the connection count as they do there.

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use crate::client::{Client, Load};
use crate::cpu::ThreadClock;
use crate::rows::Rows;
use crate::{port_pair, server_core, WireConfig, CLIENT_IP, PORT, SERVER_IP};

/// Virtual time per round (one server turn and one client turn): about a native round at 256
/// connections.
const ROUND: Duration = Duration::from_micros(10);

/// What a lockstep run measured.
#[derive(Clone, Copy, Debug)]
pub struct LockstepReport {
    pub requests: u64,
    /// Server turns that had work.
    pub server_turns: u64,
    /// Thread CPU nanoseconds inside the server's turns, per reply.
    pub server_ns_per_req: f64,
    /// Frames the client sent and received per reply (each is one the server received or sent).
    pub frames_to_server_per_req: f64,
    pub frames_from_server_per_req: f64,
}

/// Runs server and client alternately until `requests` replies were received and checked.
pub fn run_lockstep(cfg: &WireConfig, requests: u64) -> Result<LockstepReport, String> {
    cfg.validate()?;
    let rows = Rows::new(cfg.rows, cfg.value_bytes);
    let shared = rows.install()?;
    let (server_q, client_q) = port_pair(cfg);
    let mut server = server_core(server_q, shared, cfg)?;
    let load = Load {
        conns: cfg.conns,
        depth: cfg.depth,
        mget: cfg.mget,
        warmup: Duration::ZERO,
        secs: Duration::ZERO,
        sample_every: cfg.sample_every,
        seed: 0x9e37_79b9_7f4a_7c15 ^ cfg.conns as u64,
        conns_per_stack: cfg.conns_per_stack,
        idle: Duration::ZERO,
    };
    let mut client = Client::new(client_q, CLIENT_IP, &rows, load)?;
    client.connect_all(SocketAddrV4::new(SERVER_IP, PORT))?;
    let clock = ThreadClock::current();
    let (mut server_ns, mut turns, mut idle) = (0u128, 0u64, 0u32);
    // Virtual time: the clock advances a fixed step per round, so timers (delayed ACK,
    // retransmission) fire as in a native run even under callgrind's ~50x slowdown, and the
    // instruction count does not depend on how fast the machine is.
    let start = Instant::now();
    let mut round = 0u64;
    while client.requests() < requests {
        round += 1;
        let now = start + ROUND * u32::try_from(round).unwrap_or(u32::MAX);
        let before = clock.read();
        let worked = server.poll_once(now);
        server_ns += clock.read().saturating_sub(before).as_nanos();
        turns += u64::from(worked);
        let progressed = client.step(now)?;
        idle = if worked || progressed { 0 } else { idle + 1 };
        if idle > 1_000_000 {
            return Err(format!(
                "lockstep stalled after {} replies ({} connected)",
                client.requests(),
                client.connected()
            ));
        }
    }
    let n = client.requests().max(1);
    let st = client.net_stats();
    let (tx, rx) = st
        .iter()
        .fold((0, 0), |(tx, rx), s| (tx + s.tx_frames, rx + s.rx_frames));
    Ok(LockstepReport {
        frames_to_server_per_req: tx as f64 / n as f64,
        frames_from_server_per_req: rx as f64 / n as f64,
        requests: n,
        server_turns: turns,
        server_ns_per_req: server_ns as f64 / n as f64,
    })
}
