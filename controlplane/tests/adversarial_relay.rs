//! Issue 11, the PostgreSQL relay as an attacker (or an unlucky operator) finds it: startups
//! that never log in (C4), pools that are never trimmed and dead origin connections handed to
//! clients (C5), and an error that names pgline's internal statement (Minor). Each test runs a
//! real pgline against the lab origin and measures the origin's side (its processes, its
//! `pg_stat_activity`) or this process's sockets; each fails on the code before the fix.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pgline_controlplane::server::Pgline;
use pgline_testkit::pg::{Wire, PATIENCE};
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin, pg};
use postgres_protocol::authentication::sasl;
use postgres_protocol::message::frontend;
use tokio_postgres::NoTls;

fn pg_addr(p: &Pgline) -> SocketAddr {
    p.pg_addr().expect("the pgwire front is on")
}

/// A connection string to pgline's PostgreSQL port: `user`/`password` (default: the origin's
/// superuser), `extra` appended as is.
fn via_pgline(p: &Pgline, db: &TestDb, login: Option<(&str, &str)>, extra: &str) -> String {
    let addr = pg_addr(p);
    let (_, _, user, password) = origin::origin_base();
    let (user, password) = login.unwrap_or((&user, &password));
    format!(
        "host={} port={} user={user} password={password} dbname={} {extra}",
        addr.ip(),
        addr.port(),
        db.name
    )
}

async fn try_connect(conn: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conn, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// `SELECT 42` over the simple protocol: the answer, or the error's (SQLSTATE, message).
async fn answer(c: &tokio_postgres::Client) -> Result<String, (String, String)> {
    match c.simple_query("SELECT 42::int4").await {
        Ok(msgs) => Ok(msgs
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap_or_default()),
        Err(e) => Err(db_error(&e)),
    }
}

fn db_error(e: &tokio_postgres::Error) -> (String, String) {
    match e.as_db_error() {
        Some(d) => (d.code().code().to_owned(), d.message().to_owned()),
        None => ("-".into(), e.to_string()),
    }
}

/// Origin processes in authentication for database `db` (PostgreSQL's process title is
/// `postgres: <user> <db> <host>(<port>) authentication` until the login completes).
fn origin_processes_authenticating(db: &str) -> usize {
    let needle = format!(" {db} ");
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .map(|c| String::from_utf8_lossy(&c).into_owned())
                .filter(|c| c.starts_with("postgres:") && c.contains(&needle))
                .filter(|c| c.trim_end_matches('\0').ends_with("authentication"))
                .count()
        })
        .unwrap_or(0)
}

/// Sockets of this process in CLOSE-WAIT (the peer closed, we did not) towards `port`.
fn close_wait_sockets_to(port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")
                        .and_then(|s| s.strip_suffix(']'))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local rem st ... inode (field 9); CLOSE_WAIT is state 08.
            f.len() > 9 && f[2].ends_with(&want) && f[3] == "08" && inodes.contains(f[9])
        })
        .count()
}

/// Polls `f` until it holds, or fails with `what` after [`PATIENCE`].
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < until, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A field of an ErrorResponse body ("" if absent).
fn field(body: &[u8], code: u8) -> String {
    pg::error_field(body, code).unwrap_or_default()
}

/// C4: clients that send a StartupMessage and nothing more cost the origin at most
/// `pgwire.max_pending_startups` processes in authentication, each for at most
/// `pgwire.auth_timeout_ms`; the startups past the cap are refused with 53300, and a real
/// client logs in once they are gone. Before the fix, every one held an origin process (40 of
/// them here, for the origin's `authentication_timeout`, a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startups_that_never_log_in_cost_the_origin_a_bounded_number_of_backends() {
    // Overridable for a measurement with the defaults, e.g. PGLINE_ADV_STARTUPS=100
    // PGLINE_ADV_CAP=32 PGLINE_ADV_WAIT_MS=3000 PGLINE_ADV_AUTH_MS=10000.
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let cap = env("PGLINE_ADV_CAP", 4) as usize;
    let sockets = env("PGLINE_ADV_STARTUPS", 40) as usize;
    let db = TestDb::create("adv_relay_c4").await;
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.max_pending_startups = cap;
    cfg.pgwire.startup_wait_ms = env("PGLINE_ADV_WAIT_MS", 300);
    cfg.pgwire.auth_timeout_ms = env("PGLINE_ADV_AUTH_MS", 3_000);
    let p = lab::start(cfg).await;
    let relay = Arc::clone(p.pg_relay().expect("relay"));
    let (_, _, user, _) = origin::origin_base();

    let mut raws = Vec::new();
    let started = Instant::now();
    for _ in 0..sockets {
        raws.push(Wire::startup(pg_addr(&p), &[("user", &user), ("database", &db.name)]).await);
    }
    // Each gets the origin's password request (admitted) or a 53300 refusal (past the cap).
    let mut peak = 0;
    let (mut admitted, mut refused) = (Vec::new(), 0);
    for (i, r) in raws.iter_mut().enumerate() {
        peak = peak.max(origin_processes_authenticating(&db.name));
        match r.message(PATIENCE).await {
            Some((b'R', _)) => admitted.push(i),
            Some((b'E', body)) => {
                assert_eq!(field(&body, b'C'), "53300", "{}", field(&body, b'M'));
                assert!(field(&body, b'M').contains("max_pending_startups"));
                refused += 1;
            }
            other => panic!("unexpected answer to a startup: {other:?}"),
        }
    }
    peak = peak.max(origin_processes_authenticating(&db.name));
    let admitted_n = admitted.len();
    eprintln!(
        "{sockets} startups without a password: {admitted_n} admitted, {refused} refused \
         (53300) after {:?}, origin processes in authentication at most {peak} (cap {cap})",
        started.elapsed()
    );
    assert!(
        peak <= cap,
        "{peak} origin processes in authentication, cap {cap}"
    );
    assert!(admitted_n <= cap && admitted_n + refused == sockets);
    assert!(
        refused >= sockets.saturating_sub(2 * cap),
        "refused {refused}"
    );

    // The deadline ends the admitted ones: the origin's processes go, the slots come back.
    eventually("origin processes in authentication gone", || {
        origin_processes_authenticating(&db.name) == 0
    })
    .await;
    eprintln!("none left in authentication after {:?}", started.elapsed());
    eventually("the startup slots given back", || {
        relay.origin_stats().startup_pending == 0
    })
    .await;
    let stats = relay.origin_stats();
    assert!(stats.auth_timeout >= admitted_n as u64, "{stats:?}");
    assert_eq!(stats.startup_refused, refused as u64, "{stats:?}");
    // A late password of a timed-out startup is refused, and the connection closed.
    if let Some(&i) = admitted.first() {
        let mut m = BytesMut::new();
        frontend::sasl_initial_response(sasl::SCRAM_SHA_256, b"n,,n=,r=x", &mut m).unwrap();
        raws[i].send(&m).await;
        let (tag, body) = raws[i].message(PATIENCE).await.expect("a refusal");
        assert_eq!((tag, field(&body, b'S').as_str()), (b'E', "FATAL"));
        assert_eq!(raws[i].message(PATIENCE).await, None, "closed");
    }
    // A login the origin refuses gives its slot back too.
    let e = try_connect(&via_pgline(&p, &db, Some((&user, "wrong")), "")).await;
    assert_eq!(e.err().map(|e| db_error(&e).0).as_deref(), Some("28P01"));
    eventually("a refused login's slot given back", || {
        relay.origin_stats().startup_pending == 0
    })
    .await;
    // A real client logs in.
    let c = try_connect(&via_pgline(&p, &db, None, ""))
        .await
        .expect("a client logs in once the abusers' slots are back");
    assert_eq!(answer(&c).await, Ok("42".into()));
    drop(raws);
    p.shutdown().await;
}

/// C5 (a): an origin connection idle in its pool past `pgwire.pool_idle_timeout_ms` is
/// closed, a pool with no connection and no session is forgotten, and at most
/// `pgwire.max_pools` pools exist: startup-setting variants cannot grow the relay's pools or
/// the origin's backends without bound. Before the fix, every variant kept its pool and its
/// connections forever, and a fourth variant was never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pools_are_trimmed_and_their_number_is_bounded() {
    let db = TestDb::create("adv_relay_c5a").await;
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.pool_idle_timeout_ms = 1_000;
    cfg.pgwire.max_pools = 3;
    let p = lab::start(cfg).await;
    let relay = Arc::clone(p.pg_relay().expect("relay"));
    let admin = db.client().await;
    let origin_backends = || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = 'adv_trim'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let variant = |n: u32| {
        via_pgline(
            &p,
            &db,
            None,
            &format!("application_name=adv_trim options='-c statement_timeout={n}000'"),
        )
    };
    // Three variants in use at once: three pools, the cap.
    let mut held = Vec::new();
    for n in 1..=3 {
        let c = try_connect(&variant(n)).await.expect("a variant logs in");
        assert_eq!(answer(&c).await, Ok("42".into()));
        held.push(c);
    }
    // A fourth, while the three are in use, is refused cleanly.
    let Err(e) = try_connect(&variant(4)).await else {
        panic!("a fourth variant is refused while max_pools are in use");
    };
    let (code, msg) = db_error(&e);
    assert_eq!(code, "53300", "{msg}");
    assert!(msg.contains("max_pools"), "{msg}");
    assert_eq!(relay.origin_stats().pool_refused, 1);
    // Once their sessions are gone, unused pools make room: a stream of variants keeps at most
    // three pools, and the origin at most three of their backends (each pool's idle one).
    drop(held);
    for n in 5..=24 {
        eventually("the sessions ended", || relay.sessions() == 0).await;
        let c = try_connect(&variant(n)).await.expect("room once unused");
        assert_eq!(answer(&c).await, Ok("42".into()));
        drop(c);
        assert!(
            relay.origin_stats().pools <= 3,
            "{:?}",
            relay.origin_stats()
        );
    }
    let until = Instant::now() + PATIENCE;
    while origin_backends().await > 3 {
        assert!(
            Instant::now() < until,
            "evicted pools' connections stay open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(origin_backends().await >= 1);

    // Idle past the timeout: the connections close at the origin, the pools are forgotten.
    let until = Instant::now() + PATIENCE;
    while origin_backends().await > 0 || relay.origin_stats().pools > 0 {
        assert!(
            Instant::now() < until,
            "idle pools never trimmed: {} origin backends, {:?}",
            origin_backends().await,
            relay.origin_stats()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = relay.origin_stats();
    eprintln!("after the idle timeout: {stats:?}");
    assert!(
        stats.backend_idle_closed >= 1 && stats.pool_forgotten >= 3,
        "{stats:?}"
    );
    // A pool forgotten is made again on the next login.
    let c = try_connect(&variant(1)).await.expect("logs in again");
    assert_eq!(answer(&c).await, Ok("42".into()));
    drop(c);
    p.shutdown().await;
}

/// C5 (b): after the origin terminated every backend of pgline's pools
/// (`pg_terminate_backend`, as an operator or a failover does), no client gets a dead
/// connection: sessions of `origin.url`'s user (whose pool reopens) get their answers, other
/// users a clean pgline error (their pool cannot reopen without their password) and then log
/// in again, and no socket to the origin stays in CLOSE-WAIT. Before the fix, the next clients
/// got the origin's `FATAL 57P01 terminating connection due to administrator command`, and
/// the dead sockets stayed in the pools in CLOSE-WAIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_are_never_handed_to_clients() {
    let db = TestDb::create("adv_relay_c5b").await;
    let role = format!("{}_r", db.name);
    let admin = origin::admin_client().await;
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD 'rpw'"
        ))
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let relay = Arc::clone(p.pg_relay().expect("relay"));
    let app = "application_name=adv_dead";
    let mut owners = Vec::new();
    for _ in 0..6 {
        owners.push(try_connect(&via_pgline(&p, &db, None, app)).await.unwrap());
    }
    let mut others = Vec::new();
    for _ in 0..3 {
        let login = Some((role.as_str(), "rpw"));
        others.push(try_connect(&via_pgline(&p, &db, login, app)).await.unwrap());
    }
    for c in owners.iter().chain(&others) {
        assert_eq!(answer(c).await, Ok("42".into()));
    }
    let killed: i64 = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) \
             FROM pg_stat_activity WHERE datname = $1 AND application_name = 'adv_dead'",
            &[&db.name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 9, "terminated {killed} origin backends");

    for c in &owners {
        assert_eq!(answer(c).await, Ok("42".into()), "origin.url's user");
    }
    for c in &others {
        let (code, msg) = answer(c)
            .await
            .expect_err("no connection left for this user");
        assert_eq!(code, "08006", "{msg}");
        assert!(
            msg.starts_with("pgline: "),
            "a clean pgline error, got {msg:?}"
        );
    }
    let login = Some((role.as_str(), "rpw"));
    let again = try_connect(&via_pgline(&p, &db, login, app))
        .await
        .expect("the other user logs in again");
    assert_eq!(answer(&again).await, Ok("42".into()));
    let (_, port, _, _) = origin::origin_base();
    eventually("no CLOSE-WAIT socket to the origin", || {
        close_wait_sockets_to(port) == 0
    })
    .await;
    let stats = relay.origin_stats();
    eprintln!("terminated {killed} origin backends: {stats:?}");
    assert!(stats.backend_dead >= 9, "{stats:?}");
    drop((owners, others, again));
    p.shutdown().await;
    let _ = admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await;
}

/// Minor: a Bind with the wrong parameter count gets the origin's own error, naming the
/// client's statement, not the relay's `pgl_...` name (compared byte for byte with the same
/// messages sent straight to the origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_error_names_the_clients_statement() {
    let db = TestDb::create("adv_relay_bind").await;
    let p = lab::start(lab::config(&db, 1)).await;
    let (_, _, user, password) = origin::origin_base();
    let origin = origin::origin_addr();
    let mut m = BytesMut::new();
    frontend::parse("mine", "SELECT $1::int + $2::int", [], &mut m).unwrap();
    pg::bind_text(&mut m, "mine", &["1"]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    let mut errors = Vec::new();
    for addr in [origin, pg_addr(&p)] {
        let mut r = Wire::login(addr, &user, &password, &db.name, &[]).await;
        let got = r.exchange(&m).await;
        let tags: Vec<u8> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            tags, b"1EZ",
            "ParseComplete, the Bind's error, ReadyForQuery"
        );
        errors.push(got[1].1.clone());
    }
    let msg = field(&errors[0], b'M');
    assert!(msg.contains("\"mine\""), "{msg}");
    assert_eq!(
        field(&errors[1], b'M'),
        msg,
        "the error names the client's statement"
    );
    assert_eq!(errors[1], errors[0], "every field as the origin's");
    p.shutdown().await;
}

/// Named statements are bounded per session: a batch that would hold more than
/// `pgwire.max_session_statements` (or their bytes past `max_session_statement_bytes`) ends
/// that session with FATAL 53400, and nothing else; a Close in the same batch makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_statement_bound_is_ended_alone() {
    let db = TestDb::create("adv_relay_stmts").await;
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.max_session_statements = 20;
    cfg.pgwire.max_session_statement_bytes = 4096;
    let p = lab::start(cfg).await;
    let (_, _, user, password) = origin::origin_base();
    let bystander = try_connect(&via_pgline(&p, &db, None, "")).await.unwrap();
    let mut w = Wire::login(pg_addr(&p), &user, &password, &db.name, &[]).await;
    let parse = |names: std::ops::Range<usize>, m: &mut BytesMut| {
        for i in names {
            frontend::parse(&format!("s{i}"), &format!("SELECT {i}"), [], m).unwrap();
        }
    };
    let mut m = BytesMut::new();
    parse(0..20, &mut m);
    frontend::sync(&mut m);
    let tags: Vec<u8> = w.exchange(&m).await.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, [&[b'1'; 20][..], b"Z"].concat(), "20 statements fit");
    // Parsing a held name again adds none (the origin refuses it: 42P05).
    let mut m = BytesMut::new();
    parse(3..4, &mut m);
    frontend::sync(&mut m);
    let tags: Vec<u8> = w.exchange(&m).await.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, b"EZ");
    let mut m = BytesMut::new();
    frontend::close(b'S', "s0", &mut m).unwrap();
    parse(20..21, &mut m);
    pg::bind_text(&mut m, "s20", &[]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    let got = w.exchange(&m).await;
    let tags: Vec<u8> = got.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, b"312DCZ", "a Close made room for one more");
    let mut m = BytesMut::new();
    parse(21..22, &mut m);
    frontend::sync(&mut m);
    w.send(&m).await;
    let (tag, body) = w.next().await;
    assert_eq!(tag, b'E');
    assert_eq!(field(&body, b'V'), "FATAL");
    assert_eq!(field(&body, b'C'), "53400");
    assert!(
        field(&body, b'M').contains("pgwire.max_session_statements"),
        "{}",
        field(&body, b'M')
    );
    assert_eq!(w.message(PATIENCE).await, None, "the session is closed");

    // The bytes: two statements of 3,000 bytes do not fit in 4,096.
    let mut w = Wire::login(pg_addr(&p), &user, &password, &db.name, &[]).await;
    let long = format!("SELECT 1 {}", "-".repeat(3000));
    let mut m = BytesMut::new();
    frontend::parse("a", &long, [], &mut m).unwrap();
    frontend::sync(&mut m);
    assert_eq!(w.exchange(&m).await.len(), 2, "one fits");
    let mut m = BytesMut::new();
    frontend::parse("b", &long, [], &mut m).unwrap();
    frontend::sync(&mut m);
    w.send(&m).await;
    let (tag, body) = w.next().await;
    assert_eq!((tag, field(&body, b'C')), (b'E', "53400".to_owned()));
    assert_eq!(w.message(PATIENCE).await, None, "the session is closed");

    assert_eq!(answer(&bystander).await, Ok("42".into()), "others go on");
    p.shutdown().await;
}

/// Sessions sharing an origin connection prepare their statements on it, and a client's Close
/// is answered by pgline; past `pgwire.max_origin_statements` pgline closes them on the
/// connection, and a statement still in use is prepared again when next bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_connection_holds_a_bounded_number_of_statements() {
    let db = TestDb::create("adv_relay_origin_stmts").await;
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.pool_size = 1;
    cfg.pgwire.max_origin_statements = 16;
    let p = lab::start(cfg).await;
    let relay = Arc::clone(p.pg_relay().expect("relay"));
    let c = try_connect(&via_pgline(&p, &db, None, "")).await.unwrap();
    let held_on_origin = || async {
        let n: i64 = c
            .query_one("SELECT count(*) FROM pg_prepared_statements", &[])
            .await
            .unwrap()
            .get(0);
        n
    };
    // A driver that prepares, runs and closes each statement (a bounded statement cache).
    for i in 0..60 {
        let st = c
            .prepare(&format!("SELECT {i}::int4 + $1::int4"))
            .await
            .unwrap();
        let v: i32 = c.query_one(&st, &[&1i32]).await.unwrap().get(0);
        assert_eq!(v, i + 1);
    }
    let held = held_on_origin().await;
    assert!(
        held <= 16 + 4,
        "the origin connection holds {held} statements"
    );
    // Statements kept open past the bound still answer, prepared again where needed.
    let mut kept = Vec::new();
    for i in 0..40 {
        kept.push(
            c.prepare(&format!("SELECT {i}::int4 * $1::int4"))
                .await
                .unwrap(),
        );
    }
    for round in 0..2 {
        for (i, st) in kept.iter().enumerate() {
            let v: i32 = c.query_one(st, &[&2i32]).await.unwrap().get(0);
            assert_eq!(v, 2 * i as i32, "round {round}");
        }
    }
    let held = held_on_origin().await;
    assert!(
        held <= 16 + 4,
        "the origin connection holds {held} statements"
    );
    // Inside one transaction block too (before 2026-12-05 only an idle connection was
    // trimmed, so a transaction could grow its backend's statements without end).
    c.batch_execute("BEGIN").await.unwrap();
    for i in 0..60 {
        let st = c
            .prepare(&format!("SELECT {i}::int4 - $1::int4"))
            .await
            .unwrap();
        let v: i32 = c.query_one(&st, &[&1i32]).await.unwrap().get(0);
        assert_eq!(v, i - 1);
    }
    let held = held_on_origin().await;
    c.batch_execute("COMMIT").await.unwrap();
    assert!(
        held <= 16 + 4,
        "the origin connection holds {held} statements in a transaction"
    );
    let closed = relay.origin_stats().origin_statements_closed;
    assert!(closed >= 120, "closed {closed}");
    p.shutdown().await;
}
