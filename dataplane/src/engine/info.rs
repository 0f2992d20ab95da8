//! Replies that describe the server: `INFO`, `HELLO`, `CLIENT INFO`.
//!
//! These are not on the hit path; they format with `write!` into a reused buffer.

use std::io::Write;

use crate::plane::Shared;
use crate::resp::Protocol;
use crate::resp::{
    compose_array_header, compose_bulk, compose_integer, compose_map_header, compose_verbatim,
};

use super::conn::Session;

/// The Redis version pgline answers as, for clients that gate features on it.
pub const REDIS_COMPAT_VERSION: &str = "7.4.0";

pub(crate) fn compose_hello(out: &mut Vec<u8>, session: &Session) {
    let proto = session.proto;
    compose_map_header(out, 7, proto);
    compose_bulk(out, b"server");
    // "redis", not "pgline": redis-py's client-side cache, among others, is enabled only for a
    // server that names itself so (`docs/decisions.md`, "HELLO names the server redis"); INFO
    // still says what pgline is.
    compose_bulk(out, b"redis");
    compose_bulk(out, b"version");
    compose_bulk(out, REDIS_COMPAT_VERSION.as_bytes());
    compose_bulk(out, b"proto");
    compose_integer(out, if proto == Protocol::Resp3 { 3 } else { 2 });
    compose_bulk(out, b"id");
    compose_integer(out, session.client_id as i64);
    compose_bulk(out, b"mode");
    compose_bulk(out, b"standalone");
    compose_bulk(out, b"role");
    compose_bulk(out, b"master");
    compose_bulk(out, b"modules");
    compose_array_header(out, 0);
}

pub(crate) fn compose_client_info(out: &mut Vec<u8>, session: &Session) {
    let mut text = Vec::with_capacity(128);
    let _ = writeln!(
        text,
        "id={} name={} resp={} lib-name={} lib-ver={}",
        session.client_id,
        String::from_utf8_lossy(session.name.as_deref().unwrap_or(b"")),
        if session.proto == Protocol::Resp3 {
            3
        } else {
            2
        },
        String::from_utf8_lossy(session.lib_name.as_deref().unwrap_or(b"")),
        String::from_utf8_lossy(session.lib_ver.as_deref().unwrap_or(b"")),
    );
    compose_verbatim(out, b"txt", &text, session.proto);
}

/// `INFO [section]`: server, clients, stats, memory, replication, keyspace.
pub(crate) fn compose_info(
    out: &mut Vec<u8>,
    shared: &Shared,
    section: Option<&[u8]>,
    proto: Protocol,
) {
    let want = |name: &str| match section {
        None => true,
        Some(s) => {
            s.eq_ignore_ascii_case(name.as_bytes())
                || s.eq_ignore_ascii_case(b"all")
                || s.eq_ignore_ascii_case(b"everything")
                || s.eq_ignore_ascii_case(b"default")
        }
    };
    let mut t = Vec::with_capacity(2048);
    let store = shared.store().stats();
    let total = |f: fn(&crate::plane::CoreStats) -> &std::sync::atomic::AtomicU64| shared.total(f);
    let transport = shared.transport();
    if want("server") {
        let _ = write!(
            t,
            "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\npgline_version:{}\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\nuptime_in_seconds:{}\r\ndataplane_cores:{}\r\ntransport:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            shared.uptime().as_secs(),
            shared.cores(),
            transport,
        );
    }
    if want("nic") && transport == "userspace" {
        write_nic_section(&mut t, shared);
    }
    if want("clients") {
        let _ = write!(
            t,
            "# Clients\r\nconnected_clients:{}\r\nrejected_connections:{}\r\ntracking_clients:{}\r\n\r\n",
            total(|s| &s.connections_open),
            total(|s| &s.connections_rejected),
            total(|s| &s.tracking_clients),
        );
    }
    if want("stats") {
        let hits = total(|s| &s.keys_hit) + total(|s| &s.keys_negative_hit);
        let misses = total(|s| &s.keys_miss);
        let _ = write!(
            t,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nkeyspace_hits:{hits}\r\nkeyspace_misses:{misses}\r\nkeyspace_negative_hits:{}\r\nkeyspace_bypass:{}\r\nkeyspace_unknown_table:{}\r\nevicted_keys:{}\r\nevicted_segments:{}\r\ntotal_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nprotocol_errors:{}\r\nmiss_queue_full:{}\r\ntracking_total_keys:{}\r\ntracking_invalidations:{}\r\ntracking_evicted_keys:{}\r\ntracking_queue_overflows:{}\r\n\r\n",
            total(|s| &s.connections_accepted),
            // Both protocols, as ever (the metrics split them: see docs/operations.md).
            total(|s| &s.resp_commands) + total(|s| &s.pg_steps),
            total(|s| &s.keys_negative_hit),
            total(|s| &s.keys_bypass),
            total(|s| &s.keys_unknown_table),
            store.evicted_entries,
            store.evicted_segments,
            total(|s| &s.bytes_in),
            total(|s| &s.bytes_out),
            total(|s| &s.protocol_errors),
            total(|s| &s.resp_queue_full) + total(|s| &s.pg_queue_full),
            total(|s| &s.tracking_keys),
            total(|s| &s.tracking_invalidations),
            total(|s| &s.tracking_evicted),
            total(|s| &s.tracking_overflows),
        );
    }
    if want("memory") {
        let _ = write!(
            t,
            "# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\nstore_region_bytes:{}\r\nstore_page_level:{}\r\nstore_pages:{}\r\nstore_segments_total:{}\r\nstore_segments_free:{}\r\nmaxmemory_policy:clock-segments\r\n\r\n",
            store.used_bytes,
            store.budget_bytes,
            store.region_bytes,
            store.page_level,
            store.pages,
            store.segments_total,
            store.segments_free,
        );
    }
    if want("replication") {
        let r = shared.replication();
        let applied = r.applied_lsn();
        let _ = write!(
            t,
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\norigin_stream:{}\r\napplied_lsn:{:X}/{:X}\r\napplied_lsn_int:{applied}\r\nlag_bytes:{}\r\nlag_ms:{}\r\nserving_hits:{}\r\n\r\n",
            if r.streaming() { "streaming" } else { "down" },
            applied >> 32,
            applied & 0xffff_ffff,
            r.lag_bytes(),
            r.lag_ms(),
            u8::from(shared.serve_hits()),
        );
    }
    if want("keyspace") {
        let keys = store.entries.saturating_sub(store.negative_entries);
        let _ = write!(t, "# Keyspace\r\n");
        if keys > 0 {
            let _ = write!(
                t,
                "db0:keys={keys},expires=0,avg_ttl=0,negative={}\r\n",
                store.negative_entries
            );
        }
        let _ = write!(t, "\r\n");
    }
    while t.ends_with(b"\r\n\r\n") {
        t.truncate(t.len() - 2);
    }
    compose_verbatim(out, b"txt", &t, proto);
}

/// `# Nic`: the userspace stacks' counters, as the cores last published them.
fn write_nic_section(t: &mut Vec<u8>, shared: &Shared) {
    let total = |f: fn(&crate::plane::CoreStats) -> &std::sync::atomic::AtomicU64| shared.total(f);
    let _ = write!(
        t,
        "# Nic\r\nnet_rx_frames:{}\r\nnet_tx_frames:{}\r\nnet_rx_dropped:{}\r\nnet_tx_dropped:{}\r\nnet_tcp_retransmits:{}\r\nnet_tcp_buffer_waits:{}\r\nnet_tcp_send_stall_aborts:{}\r\n\r\n",
        total(|s| &s.net_rx_frames),
        total(|s| &s.net_tx_frames),
        total(|s| &s.net_rx_dropped),
        total(|s| &s.net_tx_dropped),
        total(|s| &s.net_tcp_retransmits),
        total(|s| &s.net_tcp_buffer_waits),
        total(|s| &s.net_tcp_send_stall_aborts),
    );
}
