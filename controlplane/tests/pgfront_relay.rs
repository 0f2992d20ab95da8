//! The PostgreSQL relay (`pgfront`) driven through the core queues against a real origin. A real
//! `Pgline` runs with the pgwire front on (its WAL consumer checks the fences); the test plays
//! the core of a relay of its own, built the way `Pgline::start` builds it but on a `Shared`
//! whose queues no running core drains (the real cores pop `pg_replies`), pushing `PgRequest`s
//! built with `postgres_protocol`'s frontend encoders on `queues[0].pg_requests` and reading
//! the `PgReply`s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use pgline_controlplane::pgfront::{self, RelayConfig, RelayState};
use pgline_controlplane::result_plane::ResultPlane;
use pgline_controlplane::server::Pgline;
use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell};
use pgline_dataplane::plane::{
    ConnToken, ControlWakers, CorePort, PgFlow, PgReply, PgReplyEnd, PgRequest, PgRequestKind,
    Shared, Wake, PG_FLOW_WINDOW,
};
use pgline_testkit::pg::{frames, msgs, Login};
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin, pg};
use postgres_protocol::message::frontend;
use tokio::sync::{watch, Notify};

const PASSWORD: &str = "relay-secret";

struct Driver {
    p: Arc<Pgline>,
    /// Core 0's side of a plane of its own: the driver stands in for the core.
    port: CorePort,
    relay: Arc<RelayState>,
    seq: AtomicU64,
    stash: Mutex<Vec<PgReply>>,
    /// Per session: the flow control a core would share with the relay. The driver counts
    /// every reply it pops as applied; `unread` is what its "client" has not read yet.
    flows: Mutex<HashMap<u64, Arc<PgFlow>>>,
    /// The client reads nothing: every popped byte stays in the backlog.
    stalled: AtomicBool,
    _stop: watch::Sender<bool>,
}

struct NotifyWake(Arc<Notify>);

impl Wake for NotifyWake {
    fn wake(&self) {
        self.0.notify_one();
    }
}

/// A whole reply (its chunks joined).
#[derive(Debug)]
struct Reply {
    bytes: Vec<u8>,
    end: PgReplyEnd,
    fence: u64,
    chunks: Vec<usize>,
}

impl Driver {
    /// A request as a core sends a batch holding a statement the cache could answer (it asks
    /// for the fence and the state verdict).
    fn push(&self, session: u64, kind: PgRequestKind, messages: Vec<u8>) -> u64 {
        self.push_fenced(session, kind, messages, true)
    }

    fn push_fenced(
        &self,
        session: u64,
        kind: PgRequestKind,
        messages: Vec<u8>,
        fence: bool,
    ) -> u64 {
        self.push_marked(session, kind, messages, fence, false)
    }

    fn push_marked(
        &self,
        session: u64,
        kind: PgRequestKind,
        messages: Vec<u8>,
        fence: bool,
        state_free: bool,
    ) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let flow = (kind == PgRequestKind::Startup).then(|| {
            let f = Arc::new(PgFlow::default());
            self.flows.lock().unwrap().insert(session, f.clone());
            f
        });
        let req = PgRequest {
            core: 0,
            conn: ConnToken::new(session as usize, 0),
            seq,
            session,
            kind,
            messages,
            statements: Vec::new(),
            cache: None,
            fence,
            state_free,
            flow,
        };
        assert!(self.port.send_pg(req).is_ok());
        self.port.end_turn();
        seq
    }

    async fn reply(&self, conn: u64, seq: u64) -> Reply {
        let until = Instant::now() + Duration::from_secs(30);
        let mut r = Reply {
            bytes: Vec::new(),
            end: PgReplyEnd::More,
            fence: 0,
            chunks: Vec::new(),
        };
        loop {
            {
                let mut stash = self.stash.lock().unwrap();
                while let Some(x) = self.port.recv_pg_reply() {
                    self.applied(&x);
                    stash.push(x);
                }
                let token = ConnToken::new(conn as usize, 0);
                while let Some(i) = stash.iter().position(|x| x.conn == token && x.seq == seq) {
                    let x = stash.remove(i);
                    r.chunks.push(x.bytes.len());
                    r.bytes.extend_from_slice(&x.bytes);
                    r.fence = x.fence_lsn;
                    r.end = x.end;
                    if x.end != PgReplyEnd::More {
                        return r;
                    }
                }
            }
            assert!(Instant::now() < until, "no reply for {conn}/{seq}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// What a core does with a reply's bytes, for flow control.
    fn applied(&self, x: &PgReply) {
        if let Some(f) = self.flows.lock().unwrap().get(&(x.conn.slot() as u64)) {
            let n = x.bytes.len() as u64;
            f.applied.fetch_add(n, Ordering::Release);
            if self.stalled.load(Ordering::Relaxed) {
                f.backlog.fetch_add(n, Ordering::Release);
            }
        }
    }

    async fn request(&self, session: u64, kind: PgRequestKind, messages: Vec<u8>) -> Reply {
        let seq = self.push(session, kind, messages);
        self.reply(session, seq).await
    }

    /// A simple query sent as a core sends a batch the cache could not have answered: the
    /// relay asks the origin nothing after it.
    async fn query_unfenced(&self, session: u64, sql: &str) -> Reply {
        let m = msgs(|b| frontend::query(sql, b).unwrap());
        let seq = self.push_fenced(session, PgRequestKind::Batch, m, false);
        self.reply(session, seq).await
    }

    /// A batch the core marked as unable to change session state (`PgRequest::state_free`).
    async fn query_state_free(&self, session: u64, sql: &str) -> Reply {
        let m = msgs(|b| frontend::query(sql, b).unwrap());
        let seq = self.push_marked(session, PgRequestKind::Batch, m, false, true);
        self.reply(session, seq).await
    }

    async fn query(&self, session: u64, sql: &str) -> Reply {
        self.request(
            session,
            PgRequestKind::Batch,
            msgs(|b| frontend::query(sql, b).unwrap()),
        )
        .await
    }

    /// Startup as `user`; answers SCRAM/md5/cleartext with `password`. Returns the final reply.
    async fn startup(&self, session: u64, user: &str, db: &str, password: &str) -> Reply {
        let m = msgs(|b| {
            frontend::startup_message(
                [
                    ("user", user),
                    ("database", db),
                    ("application_name", "pgf"),
                ],
                b,
            )
            .unwrap()
        });
        let mut r = self.request(session, PgRequestKind::Startup, m).await;
        let mut login = Login::new(password);
        while r.end == PgReplyEnd::Auth {
            let (_, body) = frames(&r.bytes).into_iter().last().expect("auth request");
            let answer = login.answer(&body);
            r = self.request(session, PgRequestKind::Auth, answer).await;
        }
        if let PgReplyEnd::Ready(_) = r.end {
            // The server's final SCRAM message passed the relay intact: it verifies.
            for (_, body) in frames(&r.bytes).into_iter().filter(|(t, _)| *t == b'R') {
                login.answer(&body);
            }
            assert!(login.done(), "SASLFinal verified");
        }
        r
    }
}

fn tags(b: &[u8]) -> String {
    frames(b).iter().map(|(t, _)| char::from(*t)).collect()
}

fn error_code(b: &[u8]) -> Option<String> {
    let (_, body) = frames(b).into_iter().find(|(t, _)| *t == b'E')?;
    pg::error_field(&body, b'C')
}

/// First column of each DataRow.
fn first_values(b: &[u8]) -> Vec<String> {
    frames(b)
        .into_iter()
        .filter(|(t, _)| *t == b'D')
        .map(|(_, body)| {
            let len = i32::from_be_bytes(body[2..6].try_into().unwrap()) as usize;
            String::from_utf8_lossy(&body[6..6 + len]).into_owned()
        })
        .collect()
}

/// pgline's (pid, secret) from a startup reply.
fn backend_key(b: &[u8]) -> (i32, i32) {
    let (_, body) = frames(b).into_iter().find(|(t, _)| *t == b'K').expect("K");
    (
        i32::from_be_bytes(body[..4].try_into().unwrap()),
        i32::from_be_bytes(body[4..8].try_into().unwrap()),
    )
}

/// A pgline with the front on, a test database with table `t` and a login role with a
/// password; returns the role name (dropped by [`drop_role`]).
async fn setup(tag: &str) -> (TestDb, Driver, String) {
    setup_with(tag, |_| {}).await
}

/// [`setup`] with a change to pgline's configuration.
async fn setup_with(
    tag: &str,
    change: impl FnOnce(&mut pgline_controlplane::config::Config),
) -> (TestDb, Driver, String) {
    let db = TestDb::create(tag).await;
    let role = format!("{}_r", db.name);
    let admin = origin::admin_client().await;
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'"
        ))
        .await
        .unwrap();
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE t (id int PRIMARY KEY, v text);
             INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g;
             GRANT ALL ON t TO {role};"
        ))
        .await
        .unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.listen = "127.0.0.1:0".into();
    change(&mut cfg);
    let relay_cfg = RelayConfig::from_config(&cfg).unwrap();
    let p = Pgline::start(cfg).await.expect("pgline starts");
    assert!(p.pg_relay().is_some() && p.pg_addr().is_some());
    let wake = Arc::new(Notify::new());
    let shared = Arc::new(Shared::new(
        p.shared.store().clone(),
        KeySpaceCell::new(KeySpace::default()),
        1,
        64,
        ControlWakers {
            misses: Arc::new(NotifyWake(wake.clone())),
            pg: Arc::new(NotifyWake(wake.clone())),
        },
    ));
    let leases = Arc::new(ResultPlane::default());
    let relay = RelayState::new(shared.control_port(), leases, relay_cfg);
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(pgfront::run(relay.clone(), wake, stop_rx));
    let d = Driver {
        p,
        port: shared.core_port(0),
        relay,
        seq: AtomicU64::new(1),
        stash: Mutex::default(),
        flows: Mutex::default(),
        stalled: AtomicBool::new(false),
        _stop: stop,
    };
    (db, d, role)
}

async fn teardown(db: TestDb, d: Driver, role: &str) {
    let _ = d._stop.send(true);
    d.p.shutdown().await;
    let client = db.client().await;
    let _ = client.batch_execute(&format!("DROP OWNED BY {role}")).await;
    drop(client);
    drop(db);
    let admin = origin::admin_client().await;
    let _ = admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_startup_and_wrong_password() {
    let (db, d, role) = setup("pgf_auth").await;
    let ok = d.startup(1, &role, &db.name, PASSWORD).await;
    assert_eq!(ok.end, PgReplyEnd::Ready(b'I'), "{}", tags(&ok.bytes));
    let t = tags(&ok.bytes);
    assert!(
        t.starts_with('R') && t.contains('S') && t.ends_with("KZ"),
        "{t}"
    );
    let (pid, _) = backend_key(&ok.bytes);
    assert!(
        pid >= 1_000_000,
        "pgline's own pid, not the origin's: {pid}"
    );
    let r = d.query(1, "SELECT current_user").await;
    assert_eq!(first_values(&r.bytes), vec![role.clone()]);
    assert_eq!(d.relay.pool_counts(&role, &db.name), (1, 1));

    // Session state pins a session to its backend for good; DISCARD ALL cleans it on close.
    let relay = d.relay.clone();
    assert_eq!(
        d.startup(3, &role, &db.name, PASSWORD).await.end,
        PgReplyEnd::Ready(b'I')
    );
    assert_eq!(relay.pool_counts(&role, &db.name), (2, 2));
    let r = d.query(3, "SET application_name = 'pinned'").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert_eq!(relay.pool_counts(&role, &db.name), (1, 2));
    for _ in 0..2 {
        let r = d.query(1, "SHOW application_name").await;
        assert_eq!(first_values(&r.bytes), vec!["pgf"]);
        let r = d.query(3, "SHOW application_name").await;
        assert_eq!(first_values(&r.bytes), vec!["pinned"]);
    }
    d.push(3, PgRequestKind::Close, Vec::new());
    let until = Instant::now() + Duration::from_secs(10);
    while relay.pool_counts(&role, &db.name) != (2, 2) {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = d.query(1, "SHOW application_name").await;
    assert_eq!(
        first_values(&r.bytes),
        vec!["pgf"],
        "DISCARD ALL reset the pinned backend"
    );

    let bad = d.startup(2, &role, &db.name, "wrong").await;
    assert_eq!(bad.end, PgReplyEnd::Close);
    assert_eq!(error_code(&bad.bytes).as_deref(), Some("28P01"));
    teardown(db, d, &role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooling_prepared_statements_pinning_fence_and_chunks() {
    let (db, d, role) = setup("pgf_pool").await;
    for s in [1, 2] {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    // Simple query.
    let r = d.query(1, "SELECT v FROM t WHERE id = 3").await;
    assert_eq!(tags(&r.bytes), "TDCZ");
    assert_eq!(first_values(&r.bytes), vec!["v3"]);
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert!(r.fence > 0, "a read that went to the origin sets the fence");

    // A named statement on one backend...
    let sql = "SELECT v || ':' || pg_backend_pid() FROM t WHERE id = $1";
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                frontend::parse("s1", sql, [23u32], b).unwrap();
                pg::bind_text(b, "s1", &["1"]);
                frontend::execute("", 0, b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(tags(&r.bytes), "12DCZ");
    let first = first_values(&r.bytes)[0].clone();
    // ...then session 2 takes that backend (most recently used) into a transaction...
    let r = d.query(2, "BEGIN").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'T'));
    assert_eq!(r.fence, 0);
    let pinned_pid =
        first_values(&d.query(2, "SELECT pg_backend_pid()::text").await.bytes)[0].clone();
    assert!(
        first.ends_with(&format!(":{pinned_pid}")),
        "{first} vs {pinned_pid}"
    );
    // ...so session 1's next execution runs on the other backend: the relay prepares it there
    // and hides that ParseComplete.
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                pg::bind_text(b, "s1", &["2"]);
                frontend::execute("", 0, b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(tags(&r.bytes), "2DCZ");
    let second = first_values(&r.bytes)[0].clone();
    assert!(second.starts_with("v2:"));
    assert_ne!(
        first.split(':').nth(1),
        second.split(':').nth(1),
        "different backends"
    );
    // Session 2 stays on its backend for the whole transaction, and is idle after COMMIT.
    let r = d.query(2, "SELECT pg_backend_pid()::text").await;
    assert_eq!(first_values(&r.bytes), vec![pinned_pid.clone()]);
    assert_eq!(r.end, PgReplyEnd::Ready(b'T'));
    let r = d.query(2, "COMMIT").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert!(r.fence > 0);
    // Close of a statement is answered locally; the statement is gone for the session.
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                frontend::close(b'S', "s1", b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(tags(&r.bytes), "3Z");
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                pg::bind_text(b, "s1", &["2"]);
                frontend::execute("", 0, b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(error_code(&r.bytes).as_deref(), Some("26000"));
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));

    // Parse of a name still open fails like PostgreSQL's (42P05), and what follows is skipped.
    let parse_s9 = |b: &mut BytesMut| frontend::parse("s9", "SELECT 9", [], b).unwrap();
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                parse_s9(b);
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(tags(&r.bytes), "1Z");
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                parse_s9(b);
                pg::bind_text(b, "s9", &[]);
                frontend::execute("", 0, b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(tags(&r.bytes), "EZ");
    assert_eq!(error_code(&r.bytes).as_deref(), Some("42P05"));

    // Fence after a write: at least the commit's end, and pgline's WAL consumer reaches it.
    let r = d
        .query(2, "UPDATE t SET v = 'w' WHERE id = 1 RETURNING (pg_current_wal_insert_lsn() - '0/0')::text")
        .await;
    let during: u64 = first_values(&r.bytes)[0].parse().unwrap();
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert!(
        r.fence > during,
        "fence {} <= LSN before the commit {during}",
        r.fence
    );
    let origin_now = origin::origin_lsn(&db.client().await).await;
    assert!(r.fence <= origin_now);
    assert!(d.p.wait_applied(r.fence, Duration::from_secs(20)).await);

    // A 1 MB result streams in chunks of at most 64 KiB.
    let r = d.query(1, "SELECT repeat('x', 1048576)").await;
    assert_eq!(tags(&r.bytes), "TDCZ");
    assert!(r.bytes.len() > 1 << 20);
    assert!(r.chunks.len() >= 16, "{:?}", r.chunks);
    assert!(r.chunks.iter().all(|&c| c <= 64 * 1024));
    assert_eq!(first_values(&r.bytes)[0].len(), 1 << 20);

    // COPY FROM STDIN cannot run through batches: refused with CopyFail (the client sees only
    // the origin's error, not the CopyInResponse), the session goes on.
    let r = d.query(1, "COPY t FROM STDIN").await;
    assert_eq!(tags(&r.bytes), "EZ");
    assert_eq!(error_code(&r.bytes).as_deref(), Some("57014"));
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));

    // Per-statement statistics, keyed by normalized text.
    let stats = d.relay.statement_stats();
    let get = |k: &str| {
        stats
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no stats for {k:?} in {stats:?}"))
    };
    let prepared = get("SELECT v || $2 || pg_backend_pid() FROM t WHERE id = $1");
    assert_eq!((prepared.calls, prepared.errors), (2, 0));
    assert!(prepared.mean_us() > 0 && prepared.p99_us() >= prepared.mean_us());
    assert!(get("SELECT repeat($1, $2)").bytes > 1 << 20);
    assert_eq!(get("SELECT v FROM t WHERE id = $1").calls, 1);

    // Closing a session mid-transaction rolls back and returns its backend.
    assert_eq!(d.query(2, "BEGIN").await.end, PgReplyEnd::Ready(b'T'));
    d.query(2, "UPDATE t SET v = 'rolled back' WHERE id = 2")
        .await;
    d.push(2, PgRequestKind::Close, Vec::new());
    let relay = d.relay.clone();
    let until = Instant::now() + Duration::from_secs(10);
    while relay.pool_counts(&role, &db.name) != (2, 2) || relay.sessions() != 1 {
        assert!(
            Instant::now() < until,
            "{:?}",
            relay.pool_counts(&role, &db.name)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = d.query(1, "SELECT v FROM t WHERE id = 2").await;
    assert_eq!(first_values(&r.bytes), vec!["v2"]);

    // A backend killed under the pool: it is found dead before a batch gets it (issue 11 C5)
    // and dropped; the batch runs on the other one.
    let pid = first_values(&d.query(1, "SELECT pg_backend_pid()::text").await.bytes)[0].clone();
    db.client()
        .await
        .batch_execute(&format!("SELECT pg_terminate_backend({pid}, 10000)"))
        .await
        .unwrap();
    let r = d.query(1, "SELECT pg_backend_pid()::text").await;
    assert_eq!(tags(&r.bytes), "TDCZ");
    assert_ne!(first_values(&r.bytes), vec![pid]);
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert_eq!(relay.pool_counts(&role, &db.name).1, 1);
    let r = d.query(1, "SELECT 1").await;
    assert_eq!(tags(&r.bytes), "TDCZ");
    teardown(db, d, &role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_running_query() {
    let (db, d, role) = setup("pgf_cancel").await;
    let r = d.startup(1, &role, &db.name, PASSWORD).await;
    let (pid, secret) = backend_key(&r.bytes);
    let started = Instant::now();
    let seq = d.push(
        1,
        PgRequestKind::Batch,
        msgs(|b| frontend::query("SELECT pg_sleep(10)", b).unwrap()),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.push(
        99,
        PgRequestKind::Cancel,
        msgs(|b| frontend::cancel_request(pid, secret, b)),
    );
    let r = d.reply(1, seq).await;
    // Well before the 10 s sleep would have ended by itself.
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error_code(&r.bytes).as_deref(), Some("57014"));
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    // A wrong secret cancels nothing.
    let seq = d.push(
        1,
        PgRequestKind::Batch,
        msgs(|b| frontend::query("SELECT pg_sleep(0.5)", b).unwrap()),
    );
    d.push(
        99,
        PgRequestKind::Cancel,
        msgs(|b| frontend::cancel_request(pid, secret ^ 1, b)),
    );
    let r = d.reply(1, seq).await;
    assert_eq!(error_code(&r.bytes), None);
    teardown(db, d, &role).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_waker_drives_the_relay_and_the_front_can_be_off() {
    let db = TestDb::create("pgf_wiring").await;
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.listen = "127.0.0.1:0".into();
    let p = Pgline::start(cfg.clone()).await.expect("pgline starts");
    // A request on the real cores' queue is drained by pgline's relay once woken (a cancel
    // with an unknown key: no reply, nothing else happens).
    let port = p.shared.core_port(0);
    let req = PgRequest {
        core: 0,
        conn: ConnToken::new(1, 0),
        seq: 1,
        session: 1,
        kind: PgRequestKind::Cancel,
        messages: msgs(|b| frontend::cancel_request(1, 2, b)),
        statements: Vec::new(),
        cache: None,
        fence: false,
        state_free: false,
        flow: None,
    };
    assert!(port.send_pg(req).is_ok());
    port.end_turn();
    let until = Instant::now() + Duration::from_secs(5);
    while p.shared.queue_depths(0).pg_requests > 0 {
        assert!(Instant::now() < until, "the relay never drained the queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(p.pg_relay().unwrap().sessions(), 0);
    p.shutdown().await;

    cfg.pgwire.enabled = false;
    let p = Pgline::start(cfg).await.expect("pgline starts");
    assert!(p.pg_relay().is_none());
    assert_eq!(p.pg_addr(), None);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_of_the_origin_user_refill_themselves() {
    let (db, d, role) = setup("pgf_refill").await;
    let (_, _, user, password) = origin::origin_base();
    let r = d.startup(1, &user, &db.name, &password).await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    let r = d.startup(2, &role, &db.name, PASSWORD).await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    let admin = db.client().await;
    for s in [1, 2] {
        let pid = first_values(&d.query(s, "SELECT pg_backend_pid()::text").await.bytes)[0].clone();
        admin
            .batch_execute(&format!("SELECT pg_terminate_backend({pid}, 10000)"))
            .await
            .unwrap();
    }
    // The dead connections leave the pools before any batch gets them (issue 11 C5).
    let until = Instant::now() + Duration::from_secs(10);
    while d.relay.pool_counts(&user, &db.name) != (0, 0)
        || d.relay.pool_counts(&role, &db.name) != (0, 0)
    {
        assert!(Instant::now() < until, "dead connections stay pooled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // pgline has the password of origin.url's user: that pool opens a new connection...
    let r = d.query(1, "SELECT current_user").await;
    assert_eq!(first_values(&r.bytes), vec![user.clone()]);
    assert_eq!(d.relay.pool_counts(&user, &db.name), (1, 1));
    // ...while a pool of another user has no way to: the session must reconnect.
    let r = d.query(2, "SELECT 1").await;
    assert_eq!(r.end, PgReplyEnd::Close);
    assert_eq!(error_code(&r.bytes).as_deref(), Some("08006"));
    teardown(db, d, &role).await;
}

/// What the relay books for a session stays true when batches fail: a failed named Parse can
/// be retried under its name, COPY FROM STDIN (simple and extended) ends with an error
/// instead of hanging, the fence never runs inside a transaction the batch opened, a batch the
/// relay cannot read leaves no open transaction in the pool, and an ambiguous startup packet
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_leave_the_bookkeeping_true() {
    let (db, d, role) = setup("pgf_fail").await;
    for s in [1, 2, 3] {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }

    // A named Parse the origin refuses, then the same name again.
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                frontend::parse("s9", "SELEC v FROM t", [], b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(error_code(&r.bytes).as_deref(), Some("42601"));
    let r = d
        .request(
            1,
            PgRequestKind::Batch,
            msgs(|b| {
                frontend::parse("s9", "SELECT v FROM t WHERE id = $1", [23u32], b).unwrap();
                pg::bind_text(b, "s9", &["4"]);
                frontend::execute("", 0, b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert_eq!(tags(&r.bytes), "12DCZ", "{:?}", error_code(&r.bytes));
    assert_eq!(first_values(&r.bytes), vec!["v4"]);

    // The fence query must not take the transaction's snapshot: SET TRANSACTION after BEGIN.
    let r = d.query(2, "BEGIN").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'T'));
    let r = d
        .query(2, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await;
    assert_eq!(
        error_code(&r.bytes),
        None,
        "the fence ran inside the transaction"
    );
    let r = d.query(2, "COMMIT").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert!(r.fence > 0);
    // BEGIN and a read in one batch ending idle: the fence is asked afterwards.
    let r = d
        .query(2, "BEGIN; SELECT v FROM t WHERE id = 1; COMMIT")
        .await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert!(r.fence > 0, "fence asked after the batch");

    // COPY FROM STDIN: an error and ReadyForQuery, no CopyInResponse, both protocols.
    let r = d.query(2, "COPY t FROM STDIN").await;
    assert!(!tags(&r.bytes).contains('G'), "{}", tags(&r.bytes));
    assert!(error_code(&r.bytes).is_some());
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    let r = d
        .request(
            2,
            PgRequestKind::Batch,
            msgs(|b| {
                frontend::parse("", "COPY t FROM STDIN", [], b).unwrap();
                pg::bind_text(b, "", &[]);
                frontend::execute("", 0, b).unwrap();
                frontend::sync(b);
            }),
        )
        .await;
    assert!(!tags(&r.bytes).contains('G'), "{}", tags(&r.bytes));
    assert!(error_code(&r.bytes).is_some());
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    let r = d.query(2, "SELECT v FROM t WHERE id = 2").await;
    assert_eq!(first_values(&r.bytes), vec!["v2"]);

    // Session 3 opens a transaction, then sends a batch the relay cannot plan (a named
    // statement whose text is not UTF-8): the session ends, and its transaction with it.
    let r = d
        .query(3, "BEGIN; INSERT INTO t VALUES (100, 'uncommitted')")
        .await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'T'));
    let mut bad = BytesMut::new();
    let body = b"s1\0SELECT '\xff'\0\0\0";
    bad.put_u8(b'P');
    bad.put_i32(body.len() as i32 + 4);
    bad.put_slice(body);
    frontend::sync(&mut bad);
    let r = d.request(3, PgRequestKind::Batch, bad.to_vec()).await;
    assert_eq!(r.end, PgReplyEnd::Close);
    assert_eq!(error_code(&r.bytes).as_deref(), Some("08P01"));
    for _ in 0..4 {
        let r = d
            .query(1, "SELECT count(*)::text FROM t WHERE id = 100")
            .await;
        assert_eq!(
            r.end,
            PgReplyEnd::Ready(b'I'),
            "a pooled backend was in a transaction"
        );
        assert_eq!(first_values(&r.bytes), vec!["0"]);
    }

    // A startup naming `user` twice is refused before the origin sees it.
    let mut m = BytesMut::new();
    let params = format!("user\0{role}\0database\0{}\0user\0postgres\0\0", db.name);
    m.put_i32(8 + params.len() as i32);
    m.put_i32(196_608);
    m.put_slice(params.as_bytes());
    let r = d.request(4, PgRequestKind::Startup, m.to_vec()).await;
    assert_eq!(r.end, PgReplyEnd::Close);
    assert_eq!(error_code(&r.bytes).as_deref(), Some("08P01"));

    teardown(db, d, &role).await;
}

/// A client that does not read a large answer holds the relay back at `PG_FLOW_WINDOW` bytes
/// instead of letting its core buffer the whole answer; once it reads, the rest flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_holds_the_relay_back() {
    let (db, d, role) = setup("pgf_flow").await;
    let r = d.startup(1, &role, &db.name, PASSWORD).await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    let flow = d.flows.lock().unwrap()[&1].clone();

    // 24 MiB of answer; the "client" reads none of it (nor has it read the startup reply).
    let startup_bytes = flow.sent.load(Ordering::Relaxed);
    flow.backlog.store(startup_bytes, Ordering::Release);
    d.stalled.store(true, Ordering::Relaxed);
    let seq = d.push(
        1,
        PgRequestKind::Batch,
        msgs(|b| {
            frontend::query("SELECT repeat('x', 1048576) FROM generate_series(1, 24)", b).unwrap()
        }),
    );
    // Until the relay has stopped: past the window, everything it sent popped, and no more
    // for 300 ms (without the window it would go on to all 24 MiB).
    let mut popped = 0u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut still_since = (0u64, Instant::now());
    let sent = loop {
        while let Some(x) = d.port.recv_pg_reply() {
            d.applied(&x);
            popped += x.bytes.len() as u64;
            d.stash.lock().unwrap().push(x);
        }
        let sent = flow.sent.load(Ordering::Relaxed);
        if sent != still_since.0 || popped + startup_bytes != sent {
            still_since = (sent, Instant::now());
        } else if sent >= PG_FLOW_WINDOW && still_since.1.elapsed() > Duration::from_millis(300) {
            break sent;
        }
        assert!(
            Instant::now() < deadline,
            "the relay never settled: sent {sent}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        sent >= PG_FLOW_WINDOW,
        "sent {sent}: the window was not used"
    );
    assert!(
        sent <= PG_FLOW_WINDOW + 2 * 65_536 + 4096,
        "sent {sent} bytes to a client that read nothing"
    );
    assert_eq!(popped + startup_bytes, sent);

    // The client reads: the rest of the answer arrives, whole.
    d.stalled.store(false, Ordering::Relaxed);
    flow.backlog.store(0, Ordering::Release);
    let r = d.reply(1, seq).await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert_eq!(tags(&r.bytes), format!("T{}CZ", "D".repeat(24)));
    assert!(r.bytes.len() > 24 << 20);
    teardown(db, d, &role).await;
}

/// `shift_path()`, a SQL function that sets the session's `search_path` (through
/// `set_config`, which no text rule sees), executable by `role`.
async fn create_shift_path(db: &TestDb, role: &str) {
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION shift_path() RETURNS text LANGUAGE sql AS \
             $$ SELECT pg_catalog.set_config('search_path', 'elsewhere, public', false) $$;
             GRANT EXECUTE ON FUNCTION shift_path() TO {role};"
        ))
        .await
        .unwrap();
}

/// Batches that do not ask for the fence run alone at the origin (no fence, no state read:
/// the reply's fence is 0) and their backend stays reserved for the session, so state a
/// function left on it (here `set_config` inside a SQL function, which no text rule sees) stays
/// the session's. Another session that finds no idle backend takes a reserved one only after
/// the origin says it is in the login state: the one holding state goes back to its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfenced_batches_keep_their_backend_and_its_state() {
    let (db, d, role) = setup_with("pgf_reserve", |cfg| cfg.pgwire.pool_size = 3).await;
    create_shift_path(&db, &role).await;
    for s in 1..=4 {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    // Three connections (the 4th login found the pool full).
    assert_eq!(d.relay.pool_counts(&role, &db.name), (3, 3));
    let login_path = "\"$user\", public";
    let path = |r: &Reply| first_values(&r.bytes)[0].clone();
    // Session 2 holds one connection in a transaction.
    assert_eq!(d.query(2, "BEGIN").await.end, PgReplyEnd::Ready(b'T'));
    // Session 1 changes its search path through a function; session 3 runs a plain read.
    let r = d.query_unfenced(1, "SELECT shift_path()").await;
    assert_eq!((r.end, r.fence), (PgReplyEnd::Ready(b'I'), 0), "no fence");
    let r = d.query_unfenced(3, "SELECT pg_backend_pid()::text").await;
    assert_eq!(r.fence, 0);
    let pid3 = first_values(&r.bytes)[0].clone();
    // Both stay reserved: none is idle.
    assert_eq!(d.relay.pool_counts(&role, &db.name), (0, 3));
    let steals = || d.relay.origin_stats().backend_steals;
    assert_eq!(steals(), 0);
    // Session 4 has no connection: it tries session 1's (the oldest reservation), finds
    // another search path, hands it back, and takes session 3's, which is clean.
    let r = d
        .query_unfenced(
            4,
            "SELECT current_setting('search_path') || ' ' || pg_backend_pid()",
        )
        .await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert_eq!(path(&r), format!("{login_path} {pid3}"));
    assert_eq!(
        steals(),
        2,
        "two reserved backends read before one was used"
    );
    // Session 1 still has its setting, on its own backend, from now on pinned.
    for _ in 0..2 {
        let r = d.query_unfenced(1, "SHOW search_path").await;
        assert_eq!(path(&r), "elsewhere, public");
    }
    // Session 3's own reservation went to session 4; it takes that one back the same way.
    let r = d.query_unfenced(3, "SHOW search_path").await;
    assert_eq!(path(&r), login_path);
    assert_eq!(steals(), 3);
    // A fenced batch reads the state: a clean backend goes back to the pool.
    let r = d.query(3, "SELECT 1").await;
    assert!(r.fence > 0);
    assert_eq!(d.query(2, "COMMIT").await.end, PgReplyEnd::Ready(b'I'));
    // Session 1 ends: its backend is reset (DISCARD ALL) and pooled in the login state.
    d.push(1, PgRequestKind::Close, Vec::new());
    let until = Instant::now() + Duration::from_secs(10);
    while d.relay.sessions() != 3 {
        assert!(Instant::now() < until, "session 1 never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for s in [2, 3, 4] {
        let r = d.query(s, "BEGIN").await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'T'));
        let r = d.query(s, "SHOW search_path").await;
        assert_eq!(path(&r), login_path, "session {s}");
    }
    for s in [2, 3, 4] {
        assert_eq!(d.query(s, "COMMIT").await.end, PgReplyEnd::Ready(b'I'));
    }
    teardown(db, d, &role).await;
}

/// A batch that only starts a transaction reads a stolen backend's state in its own round trip:
/// the state query goes in front of it. When that state is another session's, the relay takes
/// the transaction back there (ROLLBACK), returns the backend to its owner, and runs the batch
/// on another backend; the client sees one BEGIN, in the login state. Simple and extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_start_reads_a_stolen_backend_in_its_own_round_trip() {
    let (db, d, role) = setup_with("pgf_unread", |cfg| cfg.pgwire.pool_size = 3).await;
    create_shift_path(&db, &role).await;
    for s in 1..=4 {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    let login_path = "\"$user\", public";
    let path_pid = "SELECT current_setting('search_path') || ' ' || pg_backend_pid()";
    let first = |r: &Reply| first_values(&r.bytes)[0].clone();
    let steals = || {
        let s = d.relay.origin_stats();
        (s.backend_steals, s.backend_steals_unread)
    };
    // Session 2 holds a backend in a transaction; session 1 leaves unread state on another and
    // session 3 leaves the third one clean, both reserved.
    assert_eq!(d.query(2, "BEGIN").await.end, PgReplyEnd::Ready(b'T'));
    d.query_unfenced(1, "SELECT shift_path()").await;
    let r = d.query_unfenced(3, "SELECT pg_backend_pid()::text").await;
    let pid3 = first(&r);
    assert_eq!(d.relay.pool_counts(&role, &db.name), (0, 3));
    // Session 4 starts a transaction: it takes session 1's backend (the oldest reservation),
    // finds its state in front of the BEGIN, takes the BEGIN back, and runs it on session 3's.
    let r = d.query_unfenced(4, "begin;").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'T'));
    assert_eq!(
        tags(&r.bytes),
        "CZ",
        "one BEGIN, nothing of the state reads"
    );
    assert_eq!(steals(), (2, 2), "both read in front of the batch");
    let r = d.query_unfenced(4, path_pid).await;
    assert_eq!(first(&r), format!("{login_path} {pid3}"));
    // Session 1 keeps its state on its own backend, where no transaction is left open.
    let r = d.query_unfenced(1, "SHOW search_path").await;
    assert_eq!(
        (first(&r), r.end),
        ("elsewhere, public".into(), PgReplyEnd::Ready(b'I'))
    );
    // Session 4 leaves state of its own behind its transaction; session 2 ends its own.
    d.query_unfenced(4, "SELECT shift_path()").await;
    assert_eq!(
        d.query_unfenced(4, "COMMIT").await.end,
        PgReplyEnd::Ready(b'I')
    );
    let r = d.query_unfenced(2, "SELECT pg_backend_pid()::text").await;
    let pid2 = first(&r);
    assert_eq!(
        d.query_unfenced(2, "COMMIT").await.end,
        PgReplyEnd::Ready(b'I')
    );
    // Session 3 (its backend gone to session 4) starts one through the extended protocol, with
    // a named statement: session 4's backend (state read: another's) goes back, session 2's is
    // clean.
    let seq = d.push_fenced(
        3,
        PgRequestKind::Batch,
        msgs(|b| {
            frontend::parse(
                "tx",
                "START TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                [],
                b,
            )
            .unwrap();
            pg::bind_text(b, "tx", &[]);
            frontend::execute("", 0, b).unwrap();
            frontend::sync(b);
        }),
        false,
    );
    let r = d.reply(3, seq).await;
    assert_eq!(tags(&r.bytes), "12CZ");
    assert_eq!(r.end, PgReplyEnd::Ready(b'T'));
    assert_eq!(steals(), (4, 4));
    let r = d.query_unfenced(3, path_pid).await;
    assert_eq!(first(&r), format!("{login_path} {pid2}"));
    let r = d.query_unfenced(3, "SHOW transaction_isolation").await;
    assert_eq!(first(&r), "repeatable read");
    assert_eq!(
        d.query_unfenced(3, "COMMIT").await.end,
        PgReplyEnd::Ready(b'I')
    );
    let r = d.query_unfenced(4, "SHOW search_path").await;
    assert_eq!(
        (first(&r), r.end),
        ("elsewhere, public".into(), PgReplyEnd::Ready(b'I'))
    );
    // The named statement stayed the session's: bound again, on whatever backend.
    let seq = d.push_fenced(
        3,
        PgRequestKind::Batch,
        msgs(|b| {
            pg::bind_text(b, "tx", &[]);
            frontend::execute("", 0, b).unwrap();
            frontend::sync(b);
        }),
        false,
    );
    let r = d.reply(3, seq).await;
    assert_eq!(tags(&r.bytes), "2CZ");
    assert_eq!(
        d.query_unfenced(3, "ROLLBACK").await.end,
        PgReplyEnd::Ready(b'I')
    );
    teardown(db, d, &role).await;
}

/// A function can `LISTEN` or declare a cursor `WITH HOLD` through `EXECUTE`, out of sight of
/// the text rule; the state read sees both, so that backend stays with its session: another
/// session gets neither its notifications nor its cursor (before, the backend went back to the
/// pool and the next session found both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_or_a_held_cursor_made_by_a_function_stays_with_its_session() {
    let (db, d, role) = setup_with("pgf_objects", |cfg| cfg.pgwire.pool_size = 3).await;
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION listen_here() RETURNS int LANGUAGE plpgsql AS \
               $$ BEGIN EXECUTE 'LISTEN pgl_chan'; RETURN 1; END $$; \
             CREATE FUNCTION hold_cursor() RETURNS int LANGUAGE plpgsql AS \
               $$ BEGIN EXECUTE 'DECLARE held CURSOR WITH HOLD FOR SELECT 1'; RETURN 1; END $$; \
             GRANT EXECUTE ON FUNCTION listen_here() TO {role}; \
             GRANT EXECUTE ON FUNCTION hold_cursor() TO {role};"
        ))
        .await
        .unwrap();
    for s in 1..=3 {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    assert_eq!(d.relay.pool_counts(&role, &db.name), (3, 3));
    // The state is read after each (the fence).
    for (s, f) in [(1, "SELECT listen_here()"), (2, "SELECT hold_cursor()")] {
        let r = d.query(s, f).await;
        assert_eq!(
            (r.end, error_code(&r.bytes)),
            (PgReplyEnd::Ready(b'I'), None)
        );
    }
    let objects = "SELECT (SELECT count(*) FROM pg_listening_channels()) || ' ' || \
                   (SELECT count(*) FROM pg_cursors WHERE is_holdable)";
    for (s, want) in [(3, "0 0"), (1, "1 0"), (2, "0 1"), (3, "0 0")] {
        let r = d.query(s, objects).await;
        assert_eq!(first_values(&r.bytes), [want], "session {s}");
    }
    teardown(db, d, &role).await;
}

/// Sessions 1, 2 and 3 of the origin's user log in to a pool of two; session 1 runs `sets[0]`
/// in a fenced batch, session 2 `sets[1]` unfenced, each answering its value. With both
/// backends holding a session's state, session 3's `read` waits for one and is refused (53300)
/// rather than answered under another session's state; each owner then `read`s its own value.
async fn two_sessions_keep_what_their_functions_set(
    d: &Driver,
    db: &TestDb,
    read: &str,
    sets: [(&str, &str); 2],
) {
    let (_, _, user, password) = origin::origin_base();
    for s in 1..=3 {
        let r = d.startup(s, &user, &db.name, &password).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    let r = d.query(1, sets[0].0).await;
    assert_eq!(first_values(&r.bytes), [sets[0].1]);
    let r = d.query_unfenced(2, sets[1].0).await;
    assert_eq!(first_values(&r.bytes), [sets[1].1]);
    let r = d.query_unfenced(3, read).await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert!(
        first_values(&r.bytes).is_empty(),
        "{:?}",
        first_values(&r.bytes)
    );
    assert_eq!(error_code(&r.bytes).as_deref(), Some("53300"));
    for (s, (_, want)) in [1, 2].into_iter().zip(sets) {
        let r = d.query_unfenced(s, read).await;
        assert_eq!(first_values(&r.bytes), [want], "session {s}");
    }
}

/// Ends session 1 and waits until the pools of the origin's user hold `counts` (idle, total).
async fn end_session_1(d: &Driver, db: &TestDb, counts: impl Fn((usize, usize)) -> bool) {
    let (_, _, user, _) = origin::origin_base();
    d.push(1, PgRequestKind::Close, Vec::new());
    let until = Instant::now() + Duration::from_secs(10);
    while !counts(d.relay.pool_counts(&user, &db.name)) {
        assert!(
            Instant::now() < until,
            "{:?}",
            d.relay.pool_counts(&user, &db.name)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A custom setting a function sets (`set_config('app.tenant', .., false)`, which no statement
/// text shows and `pg_settings` does not list) never reaches another session when the relay
/// follows it (`pgwire.custom_settings`): the fenced batch's backend stays with its session
/// rather than going back to the pool, a reserved backend another session takes is handed back
/// to its owner rather than used (without the list, session 3 read another session's tenant),
/// each owner keeps its value, and a backend whose reset leaves `''` where a new connection
/// reads NULL is closed, not pooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_setting_made_by_a_function_stays_with_its_session() {
    let (db, d, role) = setup_with("pgf_custom", |cfg| {
        cfg.pgwire.pool_size = 2;
        cfg.pgwire.pool_wait_ms = 500;
        cfg.pgwire.custom_settings = vec!["app.tenant".into()];
    })
    .await;
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION set_tenant(t int) RETURNS int LANGUAGE plpgsql AS \
               $$ BEGIN PERFORM set_config('app.tenant', t::text, false); RETURN t; END $$",
        )
        .await
        .unwrap();
    // origin.url's user: its pool opens connections on demand (the last step needs one).
    let tenant = "SELECT coalesce(current_setting('app.tenant', true), '<null>')";
    let sets = [
        ("SELECT set_tenant(42)", "42"),
        ("SELECT set_tenant(7)", "7"),
    ];
    two_sessions_keep_what_their_functions_set(&d, &db, tenant, sets).await;
    // Session 1 ends: `DISCARD ALL` leaves '' where a new connection reads NULL, so its
    // backend is closed; session 3 gets a new one.
    end_session_1(&d, &db, |(_, total)| total == 1).await;
    let r = d.query_unfenced(3, tenant).await;
    assert_eq!(first_values(&r.bytes), ["<null>"]);
    teardown(db, d, &role).await;
}

/// A built-in setting a function makes its session's own (`set_config('statement_timeout',
/// .., false)`: no statement text shows it, no cached answer depends on it, so it is not in
/// the fingerprint) never reaches another session: the fenced batch's backend stays with its
/// session, a reserved backend another session takes is handed back to its owner (before,
/// session 3 ran under session 1's `41s`), and at a session's end `DISCARD ALL` resets it and
/// the backend is pooled again. A value a configuration reload gives every backend is not a
/// session's own: the backend that shows it after a fenced batch goes back to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_made_by_a_function_stays_with_its_session() {
    let (db, d, role) = setup_with("pgf_watched", |cfg| {
        cfg.pgwire.pool_size = 2;
        cfg.pgwire.pool_wait_ms = 500;
    })
    .await;
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION set_timeout(t text) RETURNS text LANGUAGE plpgsql AS \
               $$ BEGIN RETURN set_config('statement_timeout', t, false); END $$",
        )
        .await
        .unwrap();
    let (_, _, user, _) = origin::origin_base();
    let timeout = "SELECT current_setting('statement_timeout')";
    let sets = [
        ("SELECT set_timeout('41s')", "41s"),
        ("SELECT set_timeout('7s')", "7s"),
    ];
    two_sessions_keep_what_their_functions_set(&d, &db, timeout, sets).await;
    // Session 1 ends: `DISCARD ALL` resets the setting and its backend is pooled again.
    end_session_1(&d, &db, |counts| counts == (1, 2)).await;
    let r = d.query(3, timeout).await;
    assert_eq!(first_values(&r.bytes), ["0"]);
    assert_eq!(d.relay.pool_counts(&user, &db.name), (1, 2));
    // A reload changes a watched setting on every backend; it is nobody's session state.
    let admin = db.client().await;
    let reload = |sql: &'static str| {
        let admin = &admin;
        async move {
            admin.batch_execute(sql).await.unwrap();
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .unwrap();
        }
    };
    reload("ALTER SYSTEM SET idle_session_timeout = '1h'").await;
    let idle = "SELECT current_setting('idle_session_timeout')";
    let until = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let r = d.query(3, idle).await;
        let v = first_values(&r.bytes);
        if v == ["1h"] || Instant::now() > until {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let counts = d.relay.pool_counts(&user, &db.name);
    reload("ALTER SYSTEM RESET idle_session_timeout").await;
    assert_eq!(seen, ["1h"]);
    assert_eq!(counts, (1, 2), "the reloaded backend went back to the pool");
    teardown(db, d, &role).await;
}

/// `currval` and `lastval` are session state no state read sees: a session whose batch runs on
/// a backend another session used first (taken while reserved, or from the pool after a fenced
/// batch) gets PostgreSQL's answer for a session that never used the sequence (SQLSTATE 55000),
/// never the other session's value (before: session 2 read session 1's `1`), while a session on its own backend
/// keeps its values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_values_stay_with_their_session() {
    let (db, d, role) = setup_with("pgf_seq", |cfg| {
        cfg.pgwire.pool_size = 1;
        cfg.pgwire.pool_wait_ms = 2_000;
    })
    .await;
    db.client()
        .await
        .batch_execute("CREATE TABLE seq_t (id serial PRIMARY KEY, v text)")
        .await
        .unwrap();
    let (_, _, user, password) = origin::origin_base();
    for s in 1..=2 {
        let r = d.startup(s, &user, &db.name, &password).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    let undefined = |r: &Reply, what: &str| {
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'), "{what}");
        assert_eq!(
            error_code(&r.bytes).as_deref(),
            Some("55000"),
            "{what}: {:?}",
            first_values(&r.bytes)
        );
    };
    // Reserved for session 1 after its insert (a batch nobody vouched for).
    d.query_unfenced(1, "INSERT INTO seq_t (v) VALUES ('a')")
        .await;
    let r = d.query_unfenced(1, "SELECT lastval()").await;
    assert_eq!(first_values(&r.bytes), ["1"]);
    // Session 2 takes it (the pool's only backend; its state is the login state).
    let r = d.query_unfenced(2, "SELECT lastval()").await;
    undefined(&r, "session 2 on session 1's reserved backend");
    let r = d.query_unfenced(2, "SELECT nextval('seq_t_id_seq')").await;
    assert_eq!(first_values(&r.bytes), ["2"]);
    // A fenced batch puts the backend back in the pool (its state read shows the login state).
    let r = d
        .query(
            2,
            "INSERT INTO seq_t (v) VALUES ('b'); SELECT v FROM t WHERE id = 1",
        )
        .await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    let r = d.query_unfenced(1, "SELECT currval('seq_t_id_seq')").await;
    undefined(&r, "session 1 on the pooled backend session 2 used");
    // Inside a transaction block that began on a backend another session used, the session's
    // own values stay (nothing is discarded there).
    let r = d.query_unfenced(2, "SELECT nextval('seq_t_id_seq')").await;
    assert_eq!(first_values(&r.bytes), ["4"]);
    for sql in ["BEGIN", "INSERT INTO seq_t (v) VALUES ('c')"] {
        let r = d.query_unfenced(1, sql).await;
        assert_eq!(error_code(&r.bytes), None, "{sql}");
    }
    let r = d.query_unfenced(1, "SELECT lastval()").await;
    assert_eq!(first_values(&r.bytes), ["5"]);
    assert_eq!(
        d.query_unfenced(1, "COMMIT").await.end,
        PgReplyEnd::Ready(b'I')
    );
    let r = d.query_unfenced(1, "SELECT lastval()").await;
    assert_eq!(
        first_values(&r.bytes),
        ["5"],
        "its own backend, after the commit"
    );
    teardown(db, d, &role).await;
}

/// A batch the core marks state-free (one statement of constants) puts a backend it took in
/// the login state back into the pool without a state read, so that sessions outnumbering the
/// backends do not steal each other's; a backend whose state is not known stays reserved
/// whatever the mark says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_free_batches_give_a_clean_backend_back_to_the_pool() {
    let (db, d, role) = setup_with("pgf_state_free", |cfg| cfg.pgwire.pool_size = 2).await;
    create_shift_path(&db, &role).await;
    for s in 1..=3 {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    assert_eq!(d.relay.pool_counts(&role, &db.name), (2, 2));
    let steals = || d.relay.origin_stats().backend_steals;
    // Unmarked, a batch leaves its backend reserved; marked, it goes back to the pool.
    let r = d.query_unfenced(1, "SELECT 1").await;
    assert_eq!((r.end, r.fence), (PgReplyEnd::Ready(b'I'), 0));
    assert_eq!(d.relay.pool_counts(&role, &db.name), (1, 2));
    for round in 0..3 {
        for s in [2, 3] {
            let r = d.query_state_free(s, "SELECT 1").await;
            assert_eq!((r.end, r.fence), (PgReplyEnd::Ready(b'I'), 0));
            assert_eq!(first_values(&r.bytes), ["1"], "round {round}");
            assert_eq!(
                d.relay.pool_counts(&role, &db.name),
                (1, 2),
                "round {round}"
            );
        }
    }
    assert_eq!(steals(), 0, "sessions 2 and 3 shared the idle backend");
    // Session 1's reserved backend now holds state the relay does not know of; a marked batch
    // on it (its own backend, state unknown) does not pool it.
    d.query_unfenced(1, "SELECT shift_path()").await;
    let r = d.query_state_free(1, "SELECT 1").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    assert_eq!(
        d.relay.pool_counts(&role, &db.name),
        (1, 2),
        "still reserved"
    );
    for s in [2, 3, 2, 3] {
        let r = d.query_unfenced(s, "SHOW search_path").await;
        assert_eq!(first_values(&r.bytes), ["\"$user\", public"], "session {s}");
    }
    let r = d.query_unfenced(1, "SHOW search_path").await;
    assert_eq!(first_values(&r.bytes), ["elsewhere, public"]);
    teardown(db, d, &role).await;
}

/// A session whose reserved backend another session is reading the state of must not run its
/// next batch on some other backend: that one lacks its state. The state read is held by a
/// lock on `pg_class` (the read looks for temporary objects when the backend has a temporary
/// schema), and a backend becomes idle meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_waits_for_its_backend_while_another_reads_its_state() {
    let (db, d, role) = setup_with("pgf_steal_race", |cfg| cfg.pgwire.pool_size = 2).await;
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION shift_path_temp() RETURNS text LANGUAGE plpgsql AS $$ BEGIN \
               CREATE TEMP TABLE IF NOT EXISTS scratch (x int); \
               RETURN pg_catalog.set_config('search_path', 'elsewhere, public', false); \
             END $$; \
             GRANT EXECUTE ON FUNCTION shift_path_temp() TO {role};"
        ))
        .await
        .unwrap();
    for s in 1..=3 {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    assert_eq!(d.relay.pool_counts(&role, &db.name), (2, 2));
    let path = |r: &Reply| first_values(&r.bytes)[0].clone();
    // Session 2 holds one backend; session 1 leaves unread state on the other.
    assert_eq!(d.query(2, "BEGIN").await.end, PgReplyEnd::Ready(b'T'));
    let r = d.query_unfenced(1, "SELECT shift_path_temp()").await;
    assert_eq!((r.end, r.fence), (PgReplyEnd::Ready(b'I'), 0));
    assert_eq!(d.relay.pool_counts(&role, &db.name), (0, 2));
    // The state read of session 1's backend will wait for this lock.
    let mut locker = db.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE pg_catalog.pg_class IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    // Session 3 finds no idle backend and takes session 1's to read its state.
    let third = d.push_fenced(
        3,
        PgRequestKind::Batch,
        msgs(|b| frontend::query("SELECT 1", b).unwrap()),
        false,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Session 2's backend becomes free (unfenced: the lock would hold a state read), and
    // session 1 sends its next batch.
    let r = d.query_unfenced(2, "COMMIT").await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    let first = d.push_fenced(
        1,
        PgRequestKind::Batch,
        msgs(|b| frontend::query("SHOW search_path", b).unwrap()),
        false,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.rollback().await.unwrap();
    let r = d.reply(1, first).await;
    assert_eq!(
        path(&r),
        "elsewhere, public",
        "session 1 ran on a backend without its state"
    );
    let r = d.reply(3, third).await;
    assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    teardown(db, d, &role).await;
}

/// Two kernel cores, each running the relay on its own thread: sessions on both cores are
/// served, each core keeps its own pool, and a cancel that arrives on either core (the kernel
/// spreads connections over the cores' `SO_REUSEPORT` listeners) reaches its query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_runs_on_two_cores_and_cancels_cross_them() {
    let (db, d, role) = setup_with("pgf_twocores", |cfg| cfg.resp.cores = 2).await;
    let addr = d.p.pg_addr().unwrap();
    let conn = format!(
        "host={} port={} user={role} password={PASSWORD} dbname={}",
        addr.ip(),
        addr.port(),
        db.name
    );
    let open_on = |c: usize| {
        d.p.shared
            .stats(c)
            .connections_open_pg
            .load(Ordering::Relaxed)
    };
    // The kernel spreads connections by a hash of their ports: open until both cores have some.
    let mut clients = Vec::new();
    while clients.len() < 8 || (open_on(0) == 0 || open_on(1) == 0) && clients.len() < 64 {
        let (client, connection) = tokio_postgres::connect(&conn, tokio_postgres::NoTls)
            .await
            .expect("connects through pgline");
        tokio::spawn(connection);
        clients.push(client);
    }
    assert!(
        open_on(0) > 0 && open_on(1) > 0,
        "all connections on one core"
    );
    for (i, c) in clients.iter().enumerate() {
        let id = (i % 10) as i32 + 1;
        let row = c
            .query_one("SELECT v FROM t WHERE id = $1", &[&id])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), format!("v{id}"));
    }
    // Each session's cancel goes out on a new connection, whichever core takes it.
    for c in &clients[..6] {
        let token = c.cancel_token();
        let started = Instant::now();
        let sleeper = c.simple_query("SELECT pg_sleep(10)");
        let cancel = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        };
        let (r, ()) = tokio::join!(sleeper, cancel);
        let e = r.expect_err("cancelled");
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::QUERY_CANCELED)
        );
        assert!(started.elapsed() < Duration::from_secs(9));
        c.simple_query("SELECT 1").await.unwrap();
    }
    drop(clients);
    teardown(db, d, &role).await;
}

/// A client that prepares a statement the pool already knows is answered at once when no
/// backend is free: `pgbench -M prepared` at more clients than the pool blocked in `PQprepare`
/// (Parse + Sync) behind backends held by its own thread's open transactions, and hung. A
/// statement the pool has never prepared, or any other batch, still waits for a backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_prepare_does_not_wait_for_a_busy_pool() {
    let (db, d, role) = setup_with("pgf_known_prepare", |cfg| cfg.pgwire.pool_size = 1).await;
    for s in 1..=2 {
        let r = d.startup(s, &role, &db.name, PASSWORD).await;
        assert_eq!(r.end, PgReplyEnd::Ready(b'I'));
    }
    let sql = "SELECT v FROM t WHERE id = $1";
    let prepare = |name: &'static str, text: &'static str| {
        msgs(move |b| {
            frontend::parse(name, text, [23u32], b).unwrap();
            frontend::sync(b);
        })
    };
    let run = |name: &'static str, id: &'static str| {
        msgs(move |b| {
            pg::bind_text(b, name, &[id]);
            frontend::execute("", 0, b).unwrap();
            frontend::sync(b);
        })
    };
    // Session 1 prepares and runs the statement: the pool learns it.
    assert_eq!(
        tags(
            &d.request(1, PgRequestKind::Batch, prepare("a", sql))
                .await
                .bytes
        ),
        "1Z"
    );
    let r = d.request(1, PgRequestKind::Batch, run("a", "3")).await;
    assert_eq!(first_values(&r.bytes), ["v3"]);
    // Session 1 holds the only backend in a transaction.
    assert_eq!(d.query(1, "BEGIN").await.end, PgReplyEnd::Ready(b'T'));
    // Session 2 prepares the same statement: answered without a backend, promptly.
    let started = Instant::now();
    let r = d.request(2, PgRequestKind::Batch, prepare("b", sql)).await;
    assert_eq!(
        (tags(&r.bytes).as_str(), r.end),
        ("1Z", PgReplyEnd::Ready(b'I'))
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The same name again is the client's error, from the origin's rule, so it waits: a
    // statement the pool never prepared waits too. Both are answered once the backend is free.
    let dup = d.push(2, PgRequestKind::Batch, prepare("b", sql));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        d.port.recv_pg_reply().is_none() && d.stash.lock().unwrap().is_empty(),
        "a duplicate name must not be answered locally"
    );
    assert_eq!(d.query(1, "COMMIT").await.end, PgReplyEnd::Ready(b'I'));
    let r = d.reply(2, dup).await;
    assert_eq!(error_code(&r.bytes).as_deref(), Some("42P05"));
    assert_eq!(d.query(1, "BEGIN").await.end, PgReplyEnd::Ready(b'T'));
    let fresh = d.push(
        2,
        PgRequestKind::Batch,
        prepare("c", "SELECT v || '!' FROM t WHERE id = $1"),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(d.port.recv_pg_reply().is_none() && d.stash.lock().unwrap().is_empty());
    assert_eq!(d.query(1, "COMMIT").await.end, PgReplyEnd::Ready(b'I'));
    assert_eq!(tags(&d.reply(2, fresh).await.bytes), "1Z");
    // The locally answered statement runs: prepared on the backend by its first Bind.
    let r = d.request(2, PgRequestKind::Batch, run("b", "7")).await;
    assert_eq!(first_values(&r.bytes), ["v7"]);
    let r = d.request(2, PgRequestKind::Batch, run("c", "2")).await;
    assert_eq!(first_values(&r.bytes), ["v2!"]);
    teardown(db, d, &role).await;
}

/// A TCP proxy to the origin at `origin` (`host:port`) that holds every CancelRequest `delay`
/// before passing it on: a slow path to the origin for cancels only. Returns its port.
async fn cancel_delaying_proxy(origin: String, delay: Duration) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let origin = origin.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(&origin).await else {
                    return;
                };
                let mut head = [0u8; 8];
                loop {
                    if client.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    // An SSLRequest (sslmode=prefer) goes first; the origin's one-byte answer
                    // comes back before the request that follows it.
                    if head[4..8] != 80_877_103i32.to_be_bytes() {
                        break;
                    }
                    let mut answer = [0u8; 1];
                    if server.write_all(&head).await.is_err()
                        || server.read_exact(&mut answer).await.is_err()
                        || client.write_all(&answer).await.is_err()
                    {
                        return;
                    }
                    if answer[0] == b'S' {
                        // TLS from here on: passed on as it is.
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                }
                if head[4..8] == 80_877_102i32.to_be_bytes() {
                    tokio::time::sleep(delay).await;
                }
                if server.write_all(&head).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    port
}

/// A cancel that reaches the origin after its statement finished must not cancel the
/// session's next statement. The origin signals the backend before it closes the cancel's
/// connection; the session's next batch waits for that close, so the signal finds the backend
/// idle (and is dropped, as PostgreSQL drops a cancel for an idle backend). Here cancels reach
/// the origin through a proxy that holds them 600 ms. Before the wait, the next statement went
/// to the session's own backend at once, and the late signal cancelled it (57014).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cancel_does_not_cancel_the_next_statement() {
    let origin = origin::origin_addr();
    let port = origin.port();
    let proxy = cancel_delaying_proxy(origin.to_string(), Duration::from_millis(600)).await;
    let (db, d, role) = setup_with("pgf_late_cancel", |cfg| {
        cfg.origin.url = cfg
            .origin
            .url
            .replace(&format!("port={port}"), &format!("port={proxy}"));
    })
    .await;
    let addr = d.p.pg_addr().unwrap();
    let (c, connection) = tokio_postgres::connect(
        &format!(
            "host={} port={} user={role} password={PASSWORD} dbname={}",
            addr.ip(),
            addr.port(),
            db.name
        ),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connects through pgline");
    tokio::spawn(connection);
    let token = c.cancel_token();
    let first = c.simple_query("SELECT pg_sleep(0.3)");
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    };
    let (r, ()) = tokio::join!(first, cancel);
    r.expect("the first statement ends before its cancel reaches the origin");
    // The cancel reaches the origin about 400 ms from now, while this would run.
    c.simple_query("SELECT pg_sleep(1)")
        .await
        .expect("the next statement is not cancelled by the late cancel");
    drop(c);
    teardown(db, d, &role).await;
}
