//! A one-second run of the wire benchmark answers correctly: GET at depth 1 and 8 and MGET 16,
//! every reply framed and checked, a sample compared byte for byte, non-zero throughput and
//! per-request CPU figures. A wrong reply, a stall or a miss (no control plane runs, so a miss
//! would never be answered) makes `run` return an error.

use pgline_wire_bench::rows::Rows;
use pgline_wire_bench::{run, run_rows, WireConfig};

fn smoke(conns: usize, depth: usize, mget: usize) {
    let cfg = WireConfig {
        conns,
        depth,
        mget,
        secs: 1.0,
        warmup: 0.2,
        rows: 20_000,
        sample_every: 8,
        ..WireConfig::default()
    };
    let r = run(&cfg).unwrap_or_else(|e| panic!("{conns}x{depth} mget {mget}: {e}"));
    assert!(r.requests > 0, "no replies in the window: {r:?}");
    assert!(r.verified > 0, "nothing compared in full: {r:?}");
    assert_eq!(r.keys, r.requests * mget.max(1) as u64);
    assert!(r.server_cpu_s > 0.0 && r.server_ns_per_req > 0.0, "{r:?}");
    let row = r.to_json();
    assert_eq!(row["bench"], "wire");
    assert_eq!(row["op"], if mget == 0 { "get" } else { "mget" });
    assert_eq!(row["value_bytes"], 166);
}

#[test]
fn get_depth_1_and_8_and_mget_16_answer_correctly() {
    smoke(16, 1, 0);
    smoke(64, 8, 0);
    smoke(16, 2, 16);
}

/// Connections spread over several client stacks (addresses) sharing the port, as the
/// 100,000-connection cell needs, answer as one stack's do.
#[test]
fn connections_over_several_client_addresses_answer_correctly() {
    let cfg = WireConfig {
        conns: 40,
        conns_per_stack: 16,
        secs: 1.0,
        warmup: 0.2,
        rows: 20_000,
        sample_every: 8,
        ..WireConfig::default()
    };
    let r = run(&cfg).unwrap_or_else(|e| panic!("40 connections on 3 addresses: {e}"));
    assert!(r.requests > 0 && r.verified > 0, "{r:?}");
}

#[test]
fn a_wrong_reply_fails_the_run() {
    // Served rows differ from the expected ones only inside the JSON, past the bytes checked on
    // every reply: the full comparison of the sampled replies must catch it.
    let cfg = WireConfig {
        conns: 4,
        secs: 1.0,
        warmup: 0.1,
        rows: 1000,
        sample_every: 4,
        ..WireConfig::default()
    };
    let served = Rows::with_label(cfg.rows, cfg.value_bytes, "usex");
    let expected = Rows::new(cfg.rows, cfg.value_bytes);
    let err = run_rows(&cfg, &served, &expected).expect_err("a wrong reply must fail the run");
    assert!(err.contains("expected"), "{err}");
}

#[test]
fn invalid_settings_are_refused() {
    let cfg = WireConfig {
        value_bytes: 10,
        ..WireConfig::default()
    };
    assert!(run(&cfg).is_err());
}
