//! The hit path allocates nothing over the userspace transport either: a counting global
//! allocator watches one userspace core (real store, real `net::Stack` on an in-memory port)
//! serve pipelined GET and MGET 16 hits to a client stack on the other end that reuses its
//! buffers. Nothing else runs in the process during the measured window (no control plane).

mod support;

use std::alloc::System;
use std::time::Duration;

use pgline_dataplane::engine::Engine;
use pgline_dataplane::net::NetConfig;
use pgline_nic::mem::{self, MemConfig};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use support::rig::{self, get, mget, resp_row, ROWS};
use support::wire::{Wire, PORT, SERVER_IP};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CONNS: usize = 4;

/// Sends `request` on every flow and waits for `reply` on each; buffers keep their capacity.
fn round(w: &mut Wire, request: &[u8], reply: &[u8]) {
    for f in w.flows.iter_mut() {
        f.out.clear();
        f.out.extend_from_slice(request);
        f.sent = 0;
        f.got.clear();
    }
    w.run_until_received(Duration::from_secs(10), |_| reply.len());
}

#[test]
fn userspace_hits_allocate_nothing() {
    let shared = rig::shared(1);
    let (server, client) = mem::pair(MemConfig::default());
    let cfg = rig::engine_config(1, 16, &format!("{SERVER_IP}:{PORT}"));
    let engine = Engine::start_userspace(cfg, shared, vec![server], NetConfig::new(SERVER_IP, 24))
        .expect("engine");
    let mut w = Wire::new(client, CONNS);
    w.open(CONNS);
    w.run_until(Duration::from_secs(10), "handshakes", |w| {
        w.flows.iter().all(|f| f.connected)
    });

    let mut gets = Vec::new();
    let mut gets_reply = Vec::new();
    for i in 0..32u32 {
        let row = (i * 37) % ROWS;
        gets.extend(get(&format!("kv:{row}")));
        gets_reply.extend(resp_row(row));
    }
    let keys: Vec<String> = (0..16u32)
        .map(|i| format!("kv:{}", (i * 13) % ROWS))
        .collect();
    let mut mget_reply = b"*16\r\n".to_vec();
    for i in 0..16u32 {
        mget_reply.extend(resp_row((i * 13) % ROWS));
    }
    let mget = mget(&keys);
    for f in w.flows.iter_mut() {
        f.out.reserve(64 * 1024);
        f.got.reserve(64 * 1024);
    }

    // Warm up: buffers, tables and the stacks' pools reach their steady-state sizes.
    for _ in 0..300 {
        round(&mut w, &gets, &gets_reply);
        round(&mut w, &mget, &mget_reply);
    }
    let region = Region::new(GLOBAL);
    let rounds = 1000;
    for _ in 0..rounds {
        round(&mut w, &gets, &gets_reply);
        round(&mut w, &mget, &mget_reply);
    }
    let change = region.change();
    let allocs = change.allocations + change.reallocations;
    for f in &w.flows {
        assert_eq!(
            f.got, mget_reply,
            "the last replies are right, not just fast"
        );
    }
    let requests = rounds * CONNS * (32 + 1);
    eprintln!("{requests} hit requests over the userspace stack, {allocs} heap allocations");
    assert_eq!(
        allocs, 0,
        "the userspace hit path allocated {allocs} times over {requests} requests"
    );
    engine.stop();
}
