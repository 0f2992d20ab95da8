//! End to end over the userspace transport: a real pgline (control plane, origin, WAL) whose
//! dataplane core runs the userspace TCP stack on one end of the in-memory port pair; the test
//! is a client `net::Stack` on the other end, speaking raw RESP. GET/MGET hits and misses,
//! pipelined requests answered in order, a malformed request closing only its connection;
//! client-tracking pushes (issue 18).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_dataplane::net::{ConnId, NetConfig, NetEvent, Stack};
use pgline_dataplane::plane::CoreStats;
use pgline_nic::mem::MemQueue;
use pgline_testkit::lab;
use pgline_testkit::origin::origin_json;
use pgline_testkit::resp::{bulk, encode, frame_len, show};
use pgline_testkit::TestDb;

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const PORT: u16 = 6380;
const WAIT: Duration = Duration::from_secs(10);
const TOKEN: &str = "userspace-e2e-token";

/// A client stack driven by the test thread.
struct Wire {
    stack: Stack<MemQueue>,
    events: Vec<NetEvent>,
    closed: Vec<ConnId>,
}

impl Wire {
    fn new(queue: MemQueue) -> Wire {
        // The client runs smoltcp's TCP: an independent implementation against the server's.
        let cfg = NetConfig {
            owned_tcp: false,
            ..NetConfig::new(CLIENT_IP, 24)
        };
        let stack = Stack::new(queue, cfg).expect("client stack");
        Wire {
            stack,
            events: Vec::new(),
            closed: Vec::new(),
        }
    }

    fn turn(&mut self) {
        let now = Instant::now();
        self.events.clear();
        self.stack.poll(now, &mut self.events);
        for e in &self.events {
            if let NetEvent::Closed(id) = e {
                self.closed.push(*id);
            }
        }
        self.stack.flush(now);
        std::thread::yield_now();
    }

    fn connect(&mut self) -> ConnId {
        let id = self
            .stack
            .connect(SocketAddrV4::new(SERVER_IP, PORT), 0)
            .expect("connect");
        let until = Instant::now() + WAIT;
        loop {
            self.turn();
            if self.events.contains(&NetEvent::Connected(id)) {
                return id;
            }
            assert!(Instant::now() < until, "no handshake with the appliance");
        }
    }

    fn send(&mut self, id: ConnId, mut bytes: &[u8]) {
        let until = Instant::now() + WAIT;
        while !bytes.is_empty() {
            match self.stack.send(id, bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(pgline_dataplane::net::NetError::Full) => {}
                Err(e) => panic!("send: {e}"),
            }
            self.turn();
            assert!(Instant::now() < until, "send stalled");
        }
    }

    /// Reads until `n` whole RESP frames arrived; returns them.
    fn frames(&mut self, id: ConnId, n: usize) -> Vec<Vec<u8>> {
        let until = Instant::now() + WAIT;
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while out.len() < n {
            self.turn();
            match self.stack.recv(id, &mut buf, 1 << 20) {
                Ok(_) => {}
                Err(e) => panic!(
                    "connection ended after {} frames: {e}; {:?}",
                    out.len(),
                    show(&buf)
                ),
            }
            while let Some(len) = (!buf.is_empty()).then(|| frame_len(&buf)).flatten() {
                out.push(buf.drain(..len).collect());
            }
            assert!(
                Instant::now() < until,
                "{} of {n} frames; buffered {:?}",
                out.len(),
                show(&buf)
            );
        }
        out
    }

    /// Everything until the appliance closes its side.
    fn until_closed(&mut self, id: ConnId) -> Vec<u8> {
        let until = Instant::now() + WAIT;
        let mut buf = Vec::new();
        loop {
            self.turn();
            match self.stack.recv(id, &mut buf, 1 << 20) {
                Ok(_) if !self.closed.contains(&id) => {}
                _ => return buf,
            }
            assert!(Instant::now() < until, "still open; got {:?}", show(&buf));
        }
    }
}

fn reply_of(json: &Option<String>) -> Vec<u8> {
    match json {
        Some(j) => bulk(j),
        None => b"$-1\r\n".to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_over_the_userspace_stack_one_core() {
    userspace(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_over_the_userspace_stack_two_cores() {
    userspace(2).await;
}

async fn userspace(cores: usize) {
    let db = TestDb::create("userspace").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, name text, qty int4);
             INSERT INTO items SELECT g, 'item ' || g, g * 7 FROM generate_series(1, 300) g;",
        )
        .await
        .unwrap();
    let mut cfg = lab::config(&db, cores);
    cfg.resp.listen = format!("127.0.0.1:{PORT}");
    cfg.nic.mode = pgline_controlplane::config::NicMode::Mem;
    cfg.nic.ip = SERVER_IP.to_string();
    cfg.api.token = Some(TOKEN.to_string());
    let p = lab::start(cfg).await;
    assert_eq!(
        p.local_addr(),
        std::net::SocketAddr::from((SERVER_IP, PORT))
    );
    let ports = p.take_mem_ports();
    assert_eq!(ports.len(), cores, "one in-memory port per core");

    // Expected replies, from the origin.
    let mut want = HashMap::new();
    for id in (1..=40).chain([299, 300, 5000, 5001]) {
        want.insert(id, reply_of(&origin_json(&origin, "items", id).await));
    }
    let want = Arc::new(want);
    // One client stack per core's port, each on its own thread.
    let clients: Vec<_> = ports
        .into_iter()
        .map(|queue| {
            let want = want.clone();
            tokio::task::spawn_blocking(move || drive(queue, &want))
        })
        .collect();
    for c in clients {
        c.await.expect("client thread");
    }
    let total = |f: fn(&CoreStats) -> &AtomicU64| p.shared.total(f);
    assert!(total(|s| &s.keys_miss) > 0);
    assert!(total(|s| &s.keys_hit) > 0);
    assert_eq!(total(|s| &s.protocol_errors), cores as u64);
    assert_eq!(total(|s| &s.connections_accepted), 2 * cores as u64);
    assert_eq!(
        total(|s| &s.connections_closed),
        cores as u64,
        "the malformed ones"
    );
    assert_eq!(total(|s| &s.connections_open), cores as u64);
    check_status_transport(&p, cores).await;
    p.shutdown().await;
}

/// Client tracking (issue 18) over the userspace transport: a RESP3 client that read a key gets
/// its `invalidate` push after an UPDATE at the origin, and a flush sends a null one. The core's
/// poll loop on this transport delivers pushes the way the kernel one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_over_the_userspace_stack() {
    let db = TestDb::create("userspace_tracking").await;
    let origin = Arc::new(db.client().await);
    origin
        .batch_execute(
            "CREATE TABLE items (id int8 PRIMARY KEY, name text);
             INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 10) g;",
        )
        .await
        .unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.resp.listen = format!("127.0.0.1:{PORT}");
    cfg.nic.mode = pgline_controlplane::config::NicMode::Mem;
    cfg.nic.ip = SERVER_IP.to_string();
    let p = Arc::new(lab::start(cfg).await);
    let queue = p.take_mem_ports().pop().expect("one port");
    let runtime = tokio::runtime::Handle::current();
    let (o, pl) = (origin.clone(), p.clone());
    tokio::task::spawn_blocking(move || {
        let mut w = Wire::new(queue);
        let a = w.connect();
        w.send(a, &encode(&["HELLO", "3"]));
        assert!(w.frames(a, 1)[0].starts_with(b"%7\r\n"));
        w.send(a, &encode(&["CLIENT", "TRACKING", "on"]));
        assert_eq!(w.frames(a, 1)[0], b"+OK\r\n");
        for key in ["items:1", "items:2"] {
            w.send(a, &encode(&["GET", key]));
            assert!(w.frames(a, 1)[0].starts_with(b"$"));
        }
        runtime
            .block_on(o.batch_execute("UPDATE items SET name = 'new' WHERE id = 2"))
            .unwrap();
        let mut push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n".to_vec();
        push.extend(bulk("items:2"));
        assert_eq!(show(&w.frames(a, 1)[0]), show(&push));
        w.send(a, &encode(&["GET", "items:2"]));
        assert!(show(&w.frames(a, 1)[0]).contains("new"));
        runtime.block_on(pl.admin().flush_all());
        assert_eq!(w.frames(a, 1)[0], b">2\r\n$10\r\ninvalidate\r\n_\r\n");
    })
    .await
    .expect("client thread");
    Arc::into_inner(p)
        .expect("the client thread is done")
        .shutdown()
        .await;
}

/// `GET /v1/status` names the transport each core runs: here the userspace stack on the
/// in-memory ports (`mem`), not the kernel's sockets.
async fn check_status_transport(p: &pgline_controlplane::server::Pgline, cores: usize) {
    let addr = p.api_addr().expect("the API is enabled");
    let s: serde_json::Value = reqwest::Client::new()
        .get(format!("http://{addr}/v1/status"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET /v1/status")
        .error_for_status()
        .expect("status 200")
        .json()
        .await
        .expect("status JSON");
    let transports: Vec<&str> = s["cores"]
        .as_array()
        .expect("cores")
        .iter()
        .map(|c| c["transport"].as_str().expect("transport"))
        .collect();
    assert_eq!(transports, vec!["mem"; cores], "{s}");
}

fn drive(queue: MemQueue, want: &HashMap<i64, Vec<u8>>) {
    let mut w = Wire::new(queue);
    let a = w.connect();
    // GET: miss (filled from the origin), then hit; an absent row, twice.
    for _ in 0..2 {
        w.send(a, &encode(&["GET", "items:1"]));
        assert_eq!(show(&w.frames(a, 1)[0]), show(&want[&1]));
        w.send(a, &encode(&["GET", "items:5000"]));
        assert_eq!(w.frames(a, 1)[0], b"$-1\r\n");
    }
    // MGET of misses and hits and absent rows, in order, twice (the second time all cached).
    let ids = [2i64, 1, 300, 5001, 3, 299, 4];
    let keys: Vec<String> = ids.iter().map(|i| format!("items:{i}")).collect();
    let mut args = vec!["MGET"];
    args.extend(keys.iter().map(String::as_str));
    let mut expect = format!("*{}\r\n", ids.len()).into_bytes();
    for id in ids {
        expect.extend_from_slice(&want[&id]);
    }
    for _ in 0..2 {
        w.send(a, &encode(&args));
        assert_eq!(show(&w.frames(a, 1)[0]), show(&expect));
    }
    // A pipeline of 40 GETs (hits and misses mixed) and a PING, in one write: answered in order.
    let mut pipeline = Vec::new();
    for id in (5..=40).chain([1, 2, 3, 4]) {
        pipeline.extend(encode(&["GET", &format!("items:{id}")]));
    }
    pipeline.extend(encode(&["PING"]));
    w.send(a, &pipeline);
    let got = w.frames(a, 41);
    for (i, id) in (5..=40).chain([1, 2, 3, 4]).enumerate() {
        assert_eq!(
            show(&got[i]),
            show(&want[&id]),
            "pipelined reply {i} (items:{id})"
        );
    }
    assert_eq!(got[40], b"+PONG\r\n");

    // A malformed request closes its own connection, after the replies before it.
    let b = w.connect();
    let mut bad = encode(&["GET", "items:6"]);
    bad.extend_from_slice(b"*1\r\n$-5\r\n");
    w.send(b, &bad);
    let text = show(&w.until_closed(b));
    assert!(text.starts_with(&show(&want[&6])), "{text}");
    assert!(text.contains("-ERR Protocol error"), "{text}");
    // ... and only that one.
    w.send(a, &encode(&["GET", "items:7"]));
    assert_eq!(show(&w.frames(a, 1)[0]), show(&want[&7]));
    // INFO names the transport and shows the stack's counters.
    w.send(a, &encode(&["INFO"]));
    let info = show(&w.frames(a, 1)[0]);
    assert!(info.contains("transport:userspace"), "{info}");
    let rx: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("net_rx_frames:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no net_rx_frames in {info}"));
    assert!(rx > 0, "{info}");
}
