//! A dataplane without a control plane: a real store with rows `kv:0..ROWS`, shared state for
//! `cores` cores, and a stand-in control plane thread that answers misses (`kv:ORIGIN_ONLY..`
//! with a row, anything else "absent").
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use pgline_dataplane::engine::EngineConfig;
use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell};
use pgline_dataplane::plane::{
    ControlPort, ControlWakers, FillResult, MissReply, RowBytes, Shared,
};
use pgline_dataplane::resp::Limits;
use pgline_dataplane::row::{encode_columns, encode_resp_json};
use pgline_dataplane::store::{self, EntryData, StoreConfig};
use pgline_hugepages::PageLevel;

pub const TABLE: u32 = 16384;
pub const ROWS: u32 = 100;
/// Keys from here on are not in the store; the stand-in control plane "fills" them.
pub const ORIGIN_ONLY: u32 = 1000;

pub fn row_json(i: u32) -> Vec<u8> {
    format!(r#"{{"id":{i},"name":"row {i}"}}"#).into_bytes()
}

/// The RESP reply for row `i`.
pub fn resp_row(i: u32) -> Vec<u8> {
    let mut out = Vec::new();
    encode_resp_json(&mut out, &row_json(i));
    out
}

pub fn get(key: &str) -> Vec<u8> {
    format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).into_bytes()
}

pub fn mget(keys: &[String]) -> Vec<u8> {
    let mut out = format!("*{}\r\n$4\r\nMGET\r\n", keys.len() + 1).into_bytes();
    for k in keys {
        out.extend_from_slice(format!("${}\r\n{k}\r\n", k.len()).as_bytes());
    }
    out
}

/// Shared state over a store holding rows `0..ROWS`, serving hits.
pub fn shared(cores: usize) -> Arc<Shared> {
    shared_with_queues(cores, 4096)
}

/// [`shared`] with queues of `capacity` messages.
pub fn shared_with_queues(cores: usize, capacity: usize) -> Arc<Shared> {
    let cfg = StoreConfig {
        memory_bytes: 16 << 20,
        segment_bytes: 1 << 20,
        max_page_level: PageLevel::Base,
        prefault: false,
    };
    let (mut writer, reader) = store::open(&cfg).expect("store");
    for i in 0..ROWS {
        let resp = resp_row(i);
        let mut cols = Vec::new();
        let id = i.to_string();
        encode_columns(&mut cols, [(&b"id"[..], Some(id.as_bytes()))].into_iter());
        let sections: [&[u8]; 2] = [&resp, &cols];
        let data = EntryData {
            sections: &sections,
            negative: false,
            lsn: 1,
        };
        writer.insert(TABLE, id.as_bytes(), &data).expect("insert");
    }
    let mut ks = KeySpace::new();
    ks.add("kv", TABLE);
    let shared = Arc::new(Shared::new(
        reader,
        KeySpaceCell::new(ks),
        cores,
        capacity,
        ControlWakers::none(),
    ));
    shared.control_port().set_serve_hits(true);
    // The writer must outlive the readers: its region backs them.
    std::mem::forget(writer);
    shared
}

pub fn engine_config(cores: usize, max_connections: usize, listen: &str) -> EngineConfig {
    EngineConfig {
        pg_listen: None,
        pg_cache_users: vec!["postgres".into()],
        pg_cache_database: Some("postgres".into()),
        listen: listen.parse().expect("listen address"),
        cores,
        max_connections,
        max_request_bytes: 64 * 1024,
        max_reply_backlog: 1 << 20,
        requests_per_turn: 8,
        max_pending_per_conn: 1024,
        spin_polls: 100,
        password: None,
        limits: Limits::default(),
        conn_limits: pgline_dataplane::engine::ConnLimits::default(),
    }
}

/// The stand-in control plane; stops when dropped.
pub struct ControlPlane {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlPlane {
    /// Answers every core's misses after `delay` (so later hits are composed before it).
    pub fn start(shared: Arc<Shared>, delay: Duration) -> ControlPlane {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let control = shared.control_port();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if !answer_one(&control, delay) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        ControlPlane {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer_one(control: &ControlPort, delay: Duration) -> bool {
    let mut any = false;
    for core in 0..control.cores() {
        let Some(req) = control.recv_miss(core) else {
            continue;
        };
        any = true;
        std::thread::sleep(delay);
        let results = req
            .keys
            .iter()
            .map(|k| {
                let n: u32 = std::str::from_utf8(&k.pk)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if n >= ORIGIN_ONLY {
                    FillResult::Row(Arc::new(RowBytes {
                        resp_json: resp_row(n),
                        columns: Vec::new(),
                    }))
                } else {
                    FillResult::Absent
                }
            })
            .collect();
        let reply = MissReply {
            conn: req.conn,
            seq: req.seq,
            results,
            lsn: 0,
        };
        control.send_reply(core, reply);
    }
    any
}
