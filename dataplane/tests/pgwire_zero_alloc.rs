//! The pgwire codec allocates nothing per message in steady state: a counting global
//! allocator (`stats_alloc`) watches the messages a cached prepared point lookup exchanges
//! (Bind, Describe, Execute, Sync in; BindComplete, RowDescription, DataRow, CommandComplete,
//! ReadyForQuery out) and a simple query, parsed and composed into a reused output buffer.
//! In its own test binary because the allocator is global to the process.

use pgline_dataplane::pgwire::*;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use std::alloc::System;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn framed(tag: u8, body: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    out.extend_from_slice(body);
}

/// Parses every message of `input` and composes the replies a hit would send.
fn serve(input: &[u8], out: &mut Vec<u8>) -> usize {
    let limits = Limits::default();
    let fields = [
        FieldDescription {
            name: b"id",
            table_oid: 16384,
            column_id: 1,
            type_oid: 23,
            type_size: 4,
            type_modifier: -1,
            format: Format::Binary,
        },
        FieldDescription {
            name: b"name",
            table_oid: 16384,
            column_id: 2,
            type_oid: 25,
            type_size: -1,
            type_modifier: -1,
            format: Format::Text,
        },
    ];
    let mut pos = 0;
    let mut messages = 0;
    while pos < input.len() {
        let (msg, n) = parse_frontend(&input[pos..], &limits).expect("valid input");
        match msg {
            Frontend::Bind(b) => {
                let key = b.params().next().flatten().expect("one key");
                assert_eq!(key.len(), 4);
                compose_bind_complete(out);
            }
            Frontend::Describe { .. } => compose_row_description(out, &fields),
            Frontend::Execute { .. } => {
                compose_data_row(out, &[Some(&42i32.to_be_bytes()), Some(b"alice")]);
                compose_select_complete(out, 1);
            }
            Frontend::Query(q) => {
                assert!(q.starts_with(b"SELECT"));
                compose_row_description(out, &fields);
                compose_data_row(out, &[Some(b"42"), None]);
                compose_select_complete(out, 1);
                compose_ready_for_query(out, TxStatus::Idle);
            }
            Frontend::Sync => compose_ready_for_query(out, TxStatus::Idle),
            _ => unreachable!("not in the fixture"),
        }
        pos += n;
        messages += 1;
    }
    messages
}

#[test]
fn steady_state_parse_and_compose_allocate_nothing() {
    let mut input = Vec::new();
    framed(
        b'B',
        b"\0s1\0\0\x01\0\x01\0\x01\0\0\0\x04\0\0\0\x2a\0\x02\0\x01\0\0",
        &mut input,
    );
    framed(b'D', b"P\0", &mut input);
    framed(b'E', b"\0\0\0\0\0", &mut input);
    framed(b'S', b"", &mut input);
    framed(b'Q', b"SELECT * FROM users WHERE id = 42\0", &mut input);
    let mut out = Vec::with_capacity(4096);
    for _ in 0..100 {
        out.clear();
        serve(&input, &mut out);
    }
    let expected = out.clone();
    // The harness's own threads may allocate at any time (seen once in a full run): the
    // best of three windows must be zero. A per-message allocation shows in every window.
    let mut best = u64::MAX;
    for _ in 0..3 {
        let region = Region::new(GLOBAL);
        let mut messages = 0;
        for _ in 0..10_000 {
            out.clear();
            messages += serve(&input, &mut out);
        }
        let change = region.change();
        assert_eq!(out, expected);
        assert_eq!(messages, 50_000);
        best = best.min((change.allocations + change.reallocations) as u64);
        if best == 0 {
            break;
        }
    }
    assert_eq!(
        best, 0,
        "allocations while parsing and answering 50,000 messages"
    );
}
