//! The engine over the real userspace stack on in-memory ports, two cores: core 0's wire drops,
//! duplicates and reorders 2 % of the frames each way, core 1's is clean. Many connections send
//! pipelines of hits, misses (answered by a stand-in control plane) and MGETs; every reply must
//! arrive byte for byte in request order. Then clients close (FIN) or reset (RST), and the
//! engine's sessions are freed.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use pgline_dataplane::engine::Engine;
use pgline_dataplane::net::NetConfig;
use pgline_nic::mem::{self, Faults, MemConfig};
use support::rig::{self, get, mget, resp_row, ControlPlane, ORIGIN_ONLY};
use support::wire::{Wire, PORT, SERVER_IP};

const CONNS: usize = 48;

/// Requests of flow `i` and the exact reply stream they must produce.
fn script(i: usize) -> (Vec<u8>, Vec<u8>) {
    let (mut req, mut rep) = (Vec::new(), Vec::new());
    for j in 0..12u32 {
        let hit = (i as u32 * 7 + j) % rig::ROWS;
        req.extend(get(&format!("kv:{hit}")));
        rep.extend(resp_row(hit));
        if j % 3 == 0 {
            let miss = ORIGIN_ONLY + i as u32 * 100 + j;
            req.extend(get(&format!("kv:{miss}")));
            rep.extend(resp_row(miss));
        }
        if j % 4 == 1 {
            let keys = vec![
                format!("kv:{j}"),
                "kv:555".to_string(),
                format!("kv:{}", hit),
            ];
            req.extend(mget(&keys));
            rep.extend(b"*3\r\n");
            rep.extend(resp_row(j));
            rep.extend(b"$-1\r\n");
            rep.extend(resp_row(hit));
        }
    }
    (req, rep)
}

fn faults(seed: u64) -> Faults {
    Faults {
        loss_per_mille: 20,
        duplicate_per_mille: 20,
        reorder_per_mille: 20,
        seed,
    }
}

#[test]
fn pipelines_over_a_lossy_wire_and_a_clean_one_then_close_and_reset() {
    let shared = rig::shared(2);
    let _control = ControlPlane::start(shared.clone(), Duration::ZERO);
    let lossy = MemConfig {
        a_to_b: faults(7),
        b_to_a: faults(11),
        ..MemConfig::default()
    };
    let (server0, client0) = mem::pair(lossy);
    let (server1, client1) = mem::pair(MemConfig::default());
    let cfg = rig::engine_config(2, 2 * CONNS, &format!("{SERVER_IP}:{PORT}"));
    let mut net = NetConfig::new(SERVER_IP, 24);
    net.max_connections = CONNS + 16;
    let engine =
        Engine::start_userspace(cfg, shared.clone(), vec![server0, server1], net).expect("engine");

    let scripts: Vec<_> = (0..CONNS).map(script).collect();
    let mut wires = [Wire::new(client0, CONNS), Wire::new(client1, CONNS)];
    for w in wires.iter_mut() {
        w.open(CONNS);
        for (f, (req, _)) in w.flows.iter_mut().zip(&scripts) {
            f.out = req.clone();
        }
    }
    for (core, w) in wires.iter_mut().enumerate() {
        w.run_until_received(Duration::from_secs(60), |i| scripts[i].1.len());
        for (i, f) in w.flows.iter().enumerate() {
            assert_eq!(
                String::from_utf8_lossy(&f.got),
                String::from_utf8_lossy(&scripts[i].1),
                "core {core} flow {i}"
            );
        }
    }
    let open = |core: usize| shared.stats(core).connections_open.load(Ordering::Relaxed);
    assert_eq!((open(0), open(1)), (CONNS as u64, CONNS as u64));

    // Core 0's clients close with FIN (retransmitted through the faults); the appliance answers
    // with its own FIN and drops the sessions.
    let w = &mut wires[0];
    for i in 0..w.flows.len() {
        let id = w.flows[i].id;
        w.stack.close(id);
    }
    w.run_until(Duration::from_secs(60), "the appliance's FINs", |w| {
        w.flows.iter().all(|f| f.eof)
    });
    // Core 1's clients reset (a clean wire: the RST is not lost).
    let w = &mut wires[1];
    for i in 0..w.flows.len() {
        let id = w.flows[i].id;
        w.stack.abort(id);
    }
    w.turn();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while open(0) + open(1) > 0 {
        for w in wires.iter_mut() {
            w.turn();
        }
        assert!(
            std::time::Instant::now() < until,
            "sessions left open: core 0 {}, core 1 {}",
            open(0),
            open(1)
        );
    }
    let closed = |core: usize| {
        shared
            .stats(core)
            .connections_closed
            .load(Ordering::Relaxed)
    };
    assert_eq!((closed(0), closed(1)), (CONNS as u64, CONNS as u64));
    assert!(
        wires[0].stack.stats().tcp_retransmits > 0,
        "the faults caused retransmissions"
    );
    engine.stop();
}

/// `max_per_source` on the userspace transport: one source's connections are counted across the
/// engine's cores, the one over the limit gets the RESP refusal and is closed, and a closed
/// connection frees its place. (The stack did not report peer addresses before, and this
/// transport accepted every connection.)
#[test]
fn the_per_source_limit_counts_a_source_across_cores() {
    let shared = rig::shared(2);
    let _control = ControlPlane::start(shared.clone(), Duration::ZERO);
    let (server0, client0) = mem::pair(MemConfig::default());
    let (server1, client1) = mem::pair(MemConfig::default());
    let mut cfg = rig::engine_config(2, 64, &format!("{SERVER_IP}:{PORT}"));
    cfg.conn_limits.max_per_source = 3;
    let mut net = NetConfig::new(SERVER_IP, 24);
    net.max_connections = 32;
    let engine =
        Engine::start_userspace(cfg, shared.clone(), vec![server0, server1], net).expect("engine");
    let (mut a, mut b) = (Wire::new(client0, 8), Wire::new(client1, 8));
    let limit = Duration::from_secs(30);
    let row = |k: u32| resp_row(k).len();
    // Two on core 0, one on core 1: all served.
    a.open(2);
    for (i, f) in a.flows.iter_mut().enumerate() {
        f.out = get(&format!("kv:{i}"));
    }
    a.run_until_received(limit, |i| row(i as u32));
    b.open(1);
    b.flows[0].out = get("kv:7");
    b.run_until_received(limit, |_| row(7));
    assert_eq!(b.flows[0].got, resp_row(7));
    // The fourth from this address, on core 1: refused and closed.
    b.open(1);
    b.flows[1].out = get("kv:8");
    b.run_until(limit, "the refusal", |w| w.flows[1].eof);
    assert_eq!(
        String::from_utf8_lossy(&b.flows[1].got),
        "-ERR max number of clients from this address reached\r\n"
    );
    let stat = |core: usize| {
        shared
            .stats(core)
            .connections_rejected_source
            .load(Ordering::Relaxed)
    };
    assert_eq!((stat(0), stat(1)), (0, 1));
    // One closes on core 0; once its session is gone, core 1 takes a new one from the source.
    let id = a.flows[0].id;
    a.stack.close(id);
    let open0 = || shared.stats(0).connections_open.load(Ordering::Relaxed);
    let until = std::time::Instant::now() + limit;
    while open0() != 1 {
        a.turn();
        assert!(std::time::Instant::now() < until, "core 0 kept the session");
    }
    b.open(1);
    b.flows[2].out = get("kv:9");
    b.run_until(limit, "the reply on the freed place", |w| {
        w.flows[2].got.len() >= row(9) || w.flows[2].eof
    });
    assert_eq!(b.flows[2].got, resp_row(9));
    engine.stop();
}
