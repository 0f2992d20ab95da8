//! A raw PostgreSQL connection to the lab origin (SCRAM by `pgline_testkit::pg::Login`), and a
//! stand-in relay thread that answers a core's `PgRequest`s by relaying them to the origin:
//! test scaffolding for the core side of the pgwire front (the product relay lives in the
//! control plane).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pgline_dataplane::pgwire::compose_auth_ok;
use pgline_dataplane::plane::{
    FillResult, MissReply, MissRequest, PgReply, PgReplyEnd, PgRequestKind, Shared,
};
use pgline_testkit::pg::Login;
use postgres_protocol::message::frontend as fe;

pub const ORIGIN: &str = "127.0.0.1:54329";
pub const PASSWORD: &str = "pgline";

/// Reads one backend message: (tag, whole message bytes).
pub fn read_message(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 5];
    s.read_exact(&mut head).expect("read header");
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut msg = head.to_vec();
    msg.resize(len + 1, 0);
    s.read_exact(&mut msg[5..]).expect("read body");
    (head[0], msg)
}

/// The number of frontend messages in `b` (whole messages).
fn count_messages(mut b: &[u8]) -> usize {
    let mut n = 0;
    while b.len() >= 5 {
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        b = &b[(1 + len).min(b.len())..];
        n += 1;
    }
    n
}

/// Reads until ReadyForQuery; all bytes, ReadyForQuery included.
pub fn until_ready(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    loop {
        let (tag, msg) = read_message(s);
        all.extend_from_slice(&msg);
        if tag == b'Z' {
            return all;
        }
    }
}

/// An authenticated origin connection and what the origin sent after AuthenticationOk.
pub fn connect_origin(database: &str) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(ORIGIN).expect("origin is up (deploy/lab/pg.sh start)");
    let mut b = BytesMut::new();
    fe::startup_message([("user", "postgres"), ("database", database)], &mut b).expect("encode");
    s.write_all(&b).expect("write");
    let mut login = Login::new(PASSWORD);
    loop {
        let (tag, msg) = read_message(&mut s);
        assert_eq!(tag, b'R', "expected an authentication request");
        if msg[5..9] == [0, 0, 0, 0] {
            break;
        }
        let reply = login.answer(&msg[5..]);
        s.write_all(&reply).expect("write");
    }
    assert!(
        login.done(),
        "AuthenticationOk before the SCRAM exchange ended"
    );
    let tail = until_ready(&mut s);
    (s, tail)
}

/// A simple query on a raw connection; its reply bytes.
pub fn simple(s: &mut TcpStream, sql: &str) -> Vec<u8> {
    let mut b = BytesMut::new();
    fe::query(sql, &mut b).expect("encode");
    s.write_all(&b).expect("write");
    until_ready(s)
}

/// What the stand-in relay saw.
#[derive(Default)]
pub struct Seen {
    pub requests: Vec<(PgRequestKind, Vec<u8>)>,
    /// Each request's `statements` (see `PgRequest::statements`), in step with `requests`.
    pub statements: Vec<Vec<u8>>,
    pub misses: Vec<MissRequest>,
}

/// The stand-in relay for core 0; stops when dropped.
pub struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub seen: Arc<Mutex<Seen>>,
}

impl Relay {
    /// Waits (up to 10 s) until what the relay saw satisfies `done`: it runs on its own thread,
    /// and a core's request may reach it after the client already has its answer.
    pub fn until_seen(&self, what: &str, done: impl Fn(&Seen) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(&self.seen.lock().expect("seen")) {
            assert!(Instant::now() < deadline, "the relay never saw {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Every session gets its own origin connection to `database`.
    pub fn start(shared: Arc<Shared>, database: &str) -> Relay {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (flag, log, db) = (stop.clone(), seen.clone(), database.to_string());
        let control = shared.control_port();
        let thread = std::thread::spawn(move || {
            let mut sessions: std::collections::HashMap<u64, TcpStream> = Default::default();
            while !flag.load(Ordering::Relaxed) {
                if let Some(m) = control.recv_miss(0) {
                    // No store writer here: a point lookup's fill cannot answer, so the core
                    // forwards the batch (what it does when a real fill fails).
                    let reply = MissReply {
                        conn: m.conn,
                        seq: m.seq,
                        results: vec![
                            FillResult::Error("no fills in this rig".into());
                            m.keys.len()
                        ],
                        lsn: 0,
                    };
                    log.lock().expect("log").misses.push(m);
                    control.send_reply(0, reply);
                }
                let Some(req) = control.recv_pg_request(0) else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                {
                    let mut log = log.lock().expect("log");
                    log.requests.push((req.kind, req.messages.clone()));
                    log.statements.push(req.statements.clone());
                }
                let (bytes, end) = match req.kind {
                    PgRequestKind::Startup => {
                        let (s, tail) = connect_origin(&db);
                        sessions.insert(req.session, s);
                        let mut out = Vec::new();
                        compose_auth_ok(&mut out);
                        out.extend_from_slice(&tail);
                        (out, PgReplyEnd::Ready(b'I'))
                    }
                    PgRequestKind::Batch => {
                        // The statements the core answered from cache go first, as the
                        // product relay prepares them, and their replies are not the client's
                        // (one ParseComplete or CloseComplete each; this rig's sessions own
                        // their origin connections, so nothing else needs them).
                        let s = sessions.get_mut(&req.session).expect("session");
                        s.write_all(&req.statements).expect("write origin");
                        s.write_all(&req.messages).expect("write origin");
                        for _ in 0..count_messages(&req.statements) {
                            let (tag, _) = read_message(s);
                            assert!(matches!(tag, b'1' | b'3'), "a booked statement failed");
                        }
                        let out = until_ready(s);
                        let status = out[out.len() - 1];
                        (out, PgReplyEnd::Ready(status))
                    }
                    PgRequestKind::Close => {
                        sessions.remove(&req.session);
                        continue;
                    }
                    _ => continue,
                };
                let reply = PgReply {
                    conn: req.conn,
                    seq: req.seq,
                    bytes,
                    end,
                    fence_lsn: 0,
                    // The product relay reads the session's state from the origin after each
                    // batch; this stand-in's sessions never change theirs unless a test does.
                    serve_cached: true,
                    unparsed: Vec::new(),
                    unclosed: Vec::new(),
                };
                control.send_pg_reply(0, reply);
            }
        });
        Relay {
            stop,
            thread: Some(thread),
            seen,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
