//! MGET with a key repeated back to back (issue 16: one hot key at MGET 64): the repeats are
//! answered from the reply already composed for the key, so the reply bytes, the hit counters
//! and the value every repeat carries are what this file checks, on a real engine (kernel
//! transport, real store). Every key here is a hit, a negative hit or names no table, so
//! nothing goes to the origin, except when a store read loses to the writer of the last test
//! too many times in a row (the writer was preempted while it held the key's bucket): that read
//! is a miss, and the test answers it as a fill would.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgline_dataplane::engine::Engine;
use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell};
use pgline_dataplane::plane::{ControlWakers, FillResult, MissReply, RowBytes, Shared};
use pgline_dataplane::resp::compose_request;
use pgline_dataplane::row::encode_resp_json;
use pgline_dataplane::store::{self, EntryData, StoreConfig, StoreWriter};
use pgline_hugepages::PageLevel;

mod support;

const TABLE: u32 = 7;

fn put(writer: &mut StoreWriter, pk: &str, json: &[u8]) {
    let mut resp = Vec::new();
    encode_resp_json(&mut resp, json);
    let sections: [&[u8]; 1] = [&resp];
    writer
        .insert(
            TABLE,
            pk.as_bytes(),
            &EntryData {
                sections: &sections,
                negative: false,
                lsn: 1,
            },
        )
        .expect("insert");
}

/// An engine over a store holding rows "1" and "2", a negative entry "404", and the writer.
fn start() -> (Engine, Arc<Shared>, StoreWriter) {
    let cfg = StoreConfig {
        memory_bytes: 8 << 20,
        segment_bytes: 1 << 20,
        max_page_level: PageLevel::Base,
        prefault: true,
    };
    let (mut writer, reader) = store::open(&cfg).expect("store");
    put(&mut writer, "1", br#"{"id":1,"v":"one"}"#);
    put(&mut writer, "2", br#"{"id":2,"v":"two"}"#);
    writer
        .insert(
            TABLE,
            b"404",
            &EntryData {
                sections: &[],
                negative: true,
                lsn: 1,
            },
        )
        .expect("insert negative");
    let mut ks = KeySpace::new();
    ks.add("kv", TABLE);
    let shared = Arc::new(Shared::new(
        reader,
        KeySpaceCell::new(ks),
        1,
        64,
        ControlWakers::none(),
    ));
    shared.control_port().set_serve_hits(true);
    let engine = Engine::start(
        support::rig::engine_config(1, 16, "127.0.0.1:0"),
        shared.clone(),
    )
    .expect("engine");
    (engine, shared, writer)
}

fn request(args: &[&str]) -> Vec<u8> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let mut out = Vec::new();
    compose_request(&mut out, &args);
    out
}

/// Sends `req` and reads exactly `len` bytes of reply.
fn round_trip(s: &mut TcpStream, req: &[u8], len: usize) -> Vec<u8> {
    s.write_all(req).unwrap();
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).unwrap();
    buf
}

fn bulk(json: &str) -> String {
    format!("${}\r\n{json}\r\n", json.len())
}

#[test]
fn repeated_keys_reply_exactly_and_count_every_hit() {
    let (engine, shared, _writer) = start();
    let mut s = TcpStream::connect(engine.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (one, two) = (bulk(r#"{"id":1,"v":"one"}"#), bulk(r#"{"id":2,"v":"two"}"#));
    // Runs of a hit, a negative hit, a key of no table and a missing-free mix, with a repeat
    // after every kind of key (a repeat after a nil must not copy anything).
    let keys = [
        "kv:1", "kv:1", "kv:1", "kv:2", "kv:404", "kv:404", "kv:2", "nope:1", "nope:1", "kv:1",
        "kv:2", "kv:2",
    ];
    let mut args = vec!["MGET"];
    args.extend(keys);
    let req = request(&args);
    for (proto, null) in [("2", "$-1\r\n"), ("3", "_\r\n")] {
        let hello = request(&["HELLO", proto]);
        s.write_all(&hello).unwrap();
        // Skip the HELLO reply: a PING after it marks where it ends.
        s.write_all(&request(&["PING"])).unwrap();
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"+PONG\r\n") {
            s.read_exact(&mut byte).unwrap();
            seen.push(byte[0]);
        }
        let want =
            format!("*12\r\n{one}{one}{one}{two}{null}{null}{two}{null}{null}{one}{two}{two}");
        let stats = shared.stats(0);
        let hits = stats.keys_hit.load(Ordering::Relaxed);
        let negative = stats.keys_negative_hit.load(Ordering::Relaxed);
        let got = round_trip(&mut s, &req, want.len());
        assert_eq!(String::from_utf8_lossy(&got), want, "RESP{proto}");
        assert_eq!(
            stats.keys_hit.load(Ordering::Relaxed) - hits,
            8,
            "RESP{proto}"
        );
        assert_eq!(
            stats.keys_negative_hit.load(Ordering::Relaxed) - negative,
            2,
            "RESP{proto}"
        );
    }
    engine.stop();
}

/// Every copy of a key in one MGET carries the same version of its row while the row keeps
/// changing (Redis answers MGET atomically). Before issue 16 each copy was a separate store
/// read, so an update between two of them showed both versions in one reply: this test failed
/// on that code in 6 runs of 6, within the first 1,500 rounds.
#[test]
fn repeated_key_is_one_version_while_the_row_changes() {
    let (engine, shared, mut writer) = start();
    let stop = Arc::new(AtomicBool::new(false));
    // The number of the last version written: version n carries "aaa" if n is even.
    let written = Arc::new(AtomicU64::new(0));
    let value = |n: u64| {
        let v = if n.is_multiple_of(2) { "aaa" } else { "bbb" };
        format!(r#"{{"id":1,"v":"{v}"}}"#)
    };
    let updater = {
        let (stop, written) = (stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                put(&mut writer, "1", value(n).as_bytes());
                written.store(n, Ordering::Relaxed);
                n += 1;
            }
            n
        })
    };
    // A read that lost to the writer more than the store's retry bound is a miss. On a loaded
    // machine the writer is sometimes preempted while it holds the bucket, so this happens;
    // such a miss is answered as a fill would answer it, with the last version written. The
    // MGET that missed is then composed key by key and is left out of the check below.
    let filler = {
        let (stop, written, control) = (stop.clone(), written.clone(), shared.control_port());
        std::thread::spawn(move || {
            let mut fills = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let Some(req) = control.recv_miss(0) else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let mut resp_json = Vec::new();
                encode_resp_json(
                    &mut resp_json,
                    value(written.load(Ordering::Relaxed)).as_bytes(),
                );
                let row = Arc::new(RowBytes {
                    resp_json,
                    columns: Vec::new(),
                });
                let results = req
                    .keys
                    .iter()
                    .map(|_| FillResult::Row(row.clone()))
                    .collect();
                control.send_reply(
                    0,
                    MissReply {
                        conn: req.conn,
                        seq: req.seq,
                        results,
                        lsn: 0,
                    },
                );
                fills += 1;
            }
            fills
        })
    };
    let mut s = TcpStream::connect(engine.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Long enough that the updater, running on another CPU, lands inside most replies.
    const N: usize = 1000;
    let mut args = vec!["MGET"];
    args.extend(std::iter::repeat_n("kv:1", N));
    let req = request(&args);
    let value_len = bulk(r#"{"id":1,"v":"aaa"}"#).len();
    let (mut a, mut b, mut missed) = (0, 0, 0);
    let stats = shared.stats(0);
    for round in 0..2_000 {
        let misses = stats.keys_miss.load(Ordering::Relaxed);
        let got = round_trip(&mut s, &req, 7 + N * value_len);
        assert_eq!(&got[..7], b"*1000\r\n");
        if stats.keys_miss.load(Ordering::Relaxed) != misses {
            missed += 1;
            continue;
        }
        let values: Vec<&[u8]> = got[7..].chunks(value_len).collect();
        assert!(
            values.iter().all(|v| *v == values[0]),
            "round {round}: two versions of one row in one MGET: {:?}",
            String::from_utf8_lossy(&got)
        );
        if values[0].windows(3).any(|w| w == b"aaa") {
            a += 1;
        } else {
            b += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let updates = updater.join().unwrap();
    let fills = filler.join().unwrap();
    assert!(updates > 1000, "the row changed only {updates} times");
    assert!(a > 0 && b > 0, "both versions were served ({a} / {b})");
    assert!(
        missed < 100,
        "most rounds were served from the store alone ({missed} of 2,000 missed, {fills} fills)"
    );
    engine.stop();
}
