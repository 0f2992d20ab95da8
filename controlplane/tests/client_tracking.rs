//! Client-side caching (`CLIENT TRACKING`, issue 18) against a real origin: invalidation pushes
//! from the WAL, byte for byte, for every kind of change; RESP2 redirection through
//! `__redis__:invalidate`; BCAST, OPTIN; Redis's errors; the table's bound; the null
//! invalidation when hits stop; and redis-py's and valkey-glide's client caches in a stale probe.

use std::time::{Duration, Instant};

use pgline_testkit::lab;
use pgline_testkit::resp::{bulk, show, Raw};
use pgline_testkit::TestDb;

const SCHEMA: &str = "
CREATE TABLE users (id int8 PRIMARY KEY, name text NOT NULL);
INSERT INTO users SELECT g, 'user ' || g FROM generate_series(1, 200) g;
CREATE TABLE notes (id int4 PRIMARY KEY, body text);
INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 20) g;
";

/// `>2 invalidate [key]` as pgline sends it to a RESP3 client.
fn push(key: &str) -> Vec<u8> {
    let mut v = b">2\r\n$10\r\ninvalidate\r\n*1\r\n".to_vec();
    v.extend(bulk(key));
    v
}

const NULL_PUSH: &[u8] = b">2\r\n$10\r\ninvalidate\r\n_\r\n";

/// The same on the RESP2 channel.
fn message(key: &str) -> Vec<u8> {
    let mut v = b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n".to_vec();
    v.extend(bulk(key));
    v
}

async fn resp3(p: &pgline_controlplane::server::Pgline) -> Raw {
    let mut r = Raw::connect(p).await;
    let hello = r.cmd(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%7\r\n"), "{}", show(&hello));
    r
}

/// Reads one frame and says how long it took to come.
async fn timed_frame(r: &mut Raw, since: Instant) -> (Vec<u8>, Duration) {
    let f = r.frame().await;
    (f, since.elapsed())
}

/// Sends a command and returns its reply; invalidation pushes that arrive before it (a RESP3
/// client may get them between any two replies) are added to `pushes`.
async fn cmd_past_pushes(r: &mut Raw, args: &[&str], pushes: &mut Vec<String>) -> Vec<u8> {
    r.send(&pgline_testkit::resp::encode(args)).await;
    loop {
        let f = r.frame().await;
        if f.starts_with(b">") {
            pushes.push(show(&f));
        } else {
            return f;
        }
    }
}

/// Nothing arrives within `wait` (a frame that does is returned as the error).
async fn nothing(r: &mut Raw, wait: Duration) -> Result<(), Vec<u8>> {
    match tokio::time::timeout(wait, r.frame()).await {
        Err(_) => Ok(()),
        Ok(f) => Err(f),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_follow_every_kind_of_change_and_modes_behave_as_redis() {
    let db = TestDb::create("tracking").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;

    let mut c = resp3(&p).await;
    assert_eq!(c.cmd(&["CLIENT", "GETREDIR"]).await, b":-1\r\n");
    assert_eq!(c.cmd(&["CLIENT", "TRACKING", "on"]).await, b"+OK\r\n");
    assert_eq!(c.cmd(&["CLIENT", "GETREDIR"]).await, b":0\r\n");

    // Update: a miss filled, then a hit; one push after the commit, then forgotten.
    let mut delays = Vec::new();
    for id in 1..=5 {
        let key = format!("users:{id}");
        let got = c.cmd(&["GET", &key]).await;
        assert!(got.starts_with(b"$"), "{}", show(&got));
        c.cmd(&["GET", &key]).await;
        let t = Instant::now();
        origin
            .execute(
                "UPDATE users SET name = name || '!' WHERE id = $1",
                &[&(id as i64)],
            )
            .await
            .unwrap();
        let (f, d) = timed_frame(&mut c, t).await;
        assert_eq!(f, push(&key), "{}", show(&f));
        delays.push(d);
        let fresh = c.cmd(&["GET", &key]).await;
        assert!(
            String::from_utf8_lossy(&fresh).contains('!'),
            "the reread after the push has the new row: {}",
            show(&fresh)
        );
    }
    delays.sort();
    eprintln!(
        "invalidation delay, commit returned -> push read (RESP3, 5 updates): min {:?}, median {:?}, max {:?}",
        delays[0], delays[2], delays[4]
    );
    // Delete, an insert over an absent row, both spellings of a key, MGET, HGET, EXISTS.
    c.cmd(&["MGET", "users:10", "public.users:10", "users:1000"])
        .await;
    c.cmd(&["HGET", "users:11", "name"]).await;
    c.cmd(&["EXISTS", "users:12"]).await;
    origin
        .batch_execute(
            "DELETE FROM users WHERE id = 10; INSERT INTO users VALUES (1000, 'new');
             UPDATE users SET name = 'h' WHERE id IN (11, 12)",
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(show(&c.frame().await));
    }
    got.sort();
    let mut want: Vec<String> = [
        "users:10",
        "public.users:10",
        "users:1000",
        "users:11",
        "users:12",
    ]
    .iter()
    .map(|k| show(&push(k)))
    .collect();
    want.sort();
    assert_eq!(got, want);
    // A change of a key nobody read sends nothing; nor does a second change of a forgotten key.
    origin
        .batch_execute("UPDATE users SET name = 'x' WHERE id IN (11, 50)")
        .await
        .unwrap();
    assert_eq!(nothing(&mut c, Duration::from_millis(300)).await, Ok(()));
    // Truncate invalidates what was read of the table.
    c.cmd(&["GET", "notes:1"]).await;
    c.cmd(&["GET", "notes:2"]).await;
    origin.batch_execute("TRUNCATE notes").await.unwrap();
    let mut got = vec![show(&c.frame().await), show(&c.frame().await)];
    got.sort();
    assert_eq!(got, [show(&push("notes:1")), show(&push("notes:2"))]);
    // A flush through the admin API: a null invalidation.
    p.admin().flush_all().await;
    assert_eq!(c.frame().await, NULL_PUSH);

    // Redis's refusals.
    let err = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    let mut e = resp3(&p).await;
    for (args, want) in [
        (&["CLIENT", "TRACKING", "on", "optin", "optout"][..], "-ERR You can't use both OPTIN and OPTOUT"),
        (&["CLIENT", "TRACKING", "on", "bcast", "optin"], "-ERR OPTIN and OPTOUT are not compatible with BCAST"),
        (&["CLIENT", "TRACKING", "on", "prefix", "users:"], "-ERR PREFIX option requires BCAST mode to be enabled"),
        (&["CLIENT", "TRACKING", "on", "redirect", "999999"], "-ERR The client ID you want redirect to does not exist"),
        (&["CLIENT", "TRACKING", "on", "bcast", "prefix", "us", "prefix", "users:"], "-ERR Prefix 'users:' overlaps with an existing prefix 'us'"),
        (&["CLIENT", "CACHING", "yes"], "-ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled"),
        (&["CLIENT", "TRACKING", "maybe"], "-ERR syntax error"),
        (&["SUBSCRIBE", "news"], "-ERR pgline has no pub/sub"),
        (&["PSUBSCRIBE", "n*"], "-ERR pgline has no pub/sub"),
    ] {
        let got = err(e.cmd(args).await);
        assert!(got.starts_with(want), "{args:?}: {got}");
    }
    assert_eq!(
        e.cmd(&["CLIENT", "TRACKING", "on", "optin"]).await,
        b"+OK\r\n"
    );
    let got = err(e.cmd(&["CLIENT", "TRACKING", "on", "bcast"]).await);
    assert!(got.starts_with("-ERR You can't switch BCAST mode"), "{got}");
    let got = err(e.cmd(&["CLIENT", "CACHING", "no"]).await);
    assert!(
        got.starts_with("-ERR CLIENT CACHING NO is only valid"),
        "{got}"
    );

    // OPTIN: only the read right after CLIENT CACHING yes is remembered.
    e.cmd(&["GET", "users:20"]).await;
    assert_eq!(e.cmd(&["CLIENT", "CACHING", "yes"]).await, b"+OK\r\n");
    let info = show(&e.cmd(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(
        info.contains("caching-yes") && info.contains("optin"),
        "{info}"
    );
    // TRACKINGINFO consumed the CACHING yes, as any command does.
    e.cmd(&["GET", "users:21"]).await;
    e.cmd(&["CLIENT", "CACHING", "yes"]).await;
    e.cmd(&["GET", "users:22"]).await;
    origin
        .batch_execute("UPDATE users SET name = 'o' WHERE id IN (20, 21, 22)")
        .await
        .unwrap();
    assert_eq!(e.frame().await, push("users:22"));
    assert_eq!(nothing(&mut e, Duration::from_millis(300)).await, Ok(()));

    // BCAST with a prefix: changes of matching keys nobody read.
    let mut b = resp3(&p).await;
    assert_eq!(
        b.cmd(&["CLIENT", "TRACKING", "on", "bcast", "prefix", "users:"])
            .await,
        b"+OK\r\n"
    );
    let info = show(&b.cmd(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(info.contains("bcast") && info.contains("users:"), "{info}");
    origin
        .batch_execute("UPDATE users SET name = 'b' WHERE id = 77; UPDATE notes SET body = 'n'")
        .await
        .unwrap();
    assert_eq!(
        b.frame().await,
        push("users:77"),
        "public.users:77 does not match the prefix"
    );
    assert_eq!(nothing(&mut b, Duration::from_millis(300)).await, Ok(()));

    // RESP2: a subscriber on __redis__:invalidate receives what a tracking client redirects.
    let mut sub = Raw::connect(&p).await;
    let id = String::from_utf8(sub.cmd(&["CLIENT", "ID"]).await).unwrap();
    let id = id.trim_start_matches(':').trim().to_string();
    assert_eq!(
        sub.cmd(&["SUBSCRIBE", "__redis__:invalidate"]).await,
        b"*3\r\n$9\r\nsubscribe\r\n$20\r\n__redis__:invalidate\r\n:1\r\n"
    );
    let got = err(sub.cmd(&["GET", "users:1"]).await);
    assert!(got.starts_with("-ERR Can't execute 'get'"), "{got}");
    assert_eq!(sub.cmd(&["PING"]).await, b"*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    let mut data = Raw::connect(&p).await;
    assert_eq!(
        data.cmd(&["CLIENT", "TRACKING", "on", "redirect", &id])
            .await,
        b"+OK\r\n"
    );
    assert_eq!(
        data.cmd(&["CLIENT", "GETREDIR"]).await,
        format!(":{id}\r\n").into_bytes()
    );
    data.cmd(&["GET", "users:30"]).await;
    origin
        .batch_execute("UPDATE users SET name = 'r' WHERE id = 30")
        .await
        .unwrap();
    assert_eq!(sub.frame().await, message("users:30"));
    // A RESP2 client without a redirect receives nothing (as Redis), and is still served.
    let mut plain = Raw::connect(&p).await;
    plain.cmd(&["CLIENT", "TRACKING", "on"]).await;
    plain.cmd(&["GET", "users:31"]).await;
    origin
        .batch_execute("UPDATE users SET name = 'r' WHERE id = 31")
        .await
        .unwrap();
    assert_eq!(
        nothing(&mut plain, Duration::from_millis(300)).await,
        Ok(())
    );
    // The redirect target goes away: a RESP3 client is told, and TRACKINGINFO says so.
    let mut target = Raw::connect(&p).await;
    let tid = String::from_utf8(target.cmd(&["CLIENT", "ID"]).await).unwrap();
    let tid = tid.trim_start_matches(':').trim().to_string();
    let mut orphan = resp3(&p).await;
    orphan
        .cmd(&["CLIENT", "TRACKING", "on", "redirect", &tid])
        .await;
    orphan.cmd(&["GET", "users:32"]).await;
    drop(target);
    tokio::time::sleep(Duration::from_millis(200)).await;
    origin
        .batch_execute("UPDATE users SET name = 'g' WHERE id = 32")
        .await
        .unwrap();
    assert_eq!(
        orphan.frame().await,
        format!(">2\r\n$21\r\ntracking-redir-broken\r\n:{tid}\r\n").into_bytes()
    );
    let info = show(&orphan.cmd(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(info.contains("broken_redirect"), "{info}");
    // RESET turns tracking off and unsubscribes.
    assert_eq!(sub.cmd(&["RESET"]).await, b"+RESET\r\n");
    assert!(sub.cmd(&["GET", "users:1"]).await.starts_with(b"$"));
    assert_eq!(c.cmd(&["RESET"]).await, b"+RESET\r\n");
    c.cmd(&["GET", "users:40"]).await;
    origin
        .batch_execute("UPDATE users SET name = 'z' WHERE id = 40")
        .await
        .unwrap();
    assert_eq!(nothing(&mut c, Duration::from_millis(300)).await, Ok(()));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_is_bounded_and_a_lost_stream_invalidates_everything() {
    let db = TestDb::create("tracking_bound").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.resp.tracking_table_max_keys = 5;
    cfg.replication.max_lag_ms = 100;
    cfg.replication.reconnect_backoff_ms = 3_000;
    let p = lab::start(cfg).await;
    let mut c = resp3(&p).await;
    c.cmd(&["CLIENT", "TRACKING", "on"]).await;
    // Eight keys into a table of five: the three oldest are invalidated at once.
    let mut evicted = Vec::new();
    for id in 1..=8 {
        let got = cmd_past_pushes(&mut c, &["GET", &format!("users:{id}")], &mut evicted).await;
        assert!(got.starts_with(b"$"), "{}", show(&got));
    }
    while evicted.len() < 3 {
        evicted.push(show(&c.frame().await));
    }
    evicted.sort();
    assert_eq!(
        evicted,
        [
            show(&push("users:1")),
            show(&push("users:2")),
            show(&push("users:3"))
        ]
    );
    let info = show(&cmd_past_pushes(&mut c, &["INFO", "stats"], &mut evicted).await);
    assert_eq!(evicted.len(), 3, "{evicted:?}");
    assert!(info.contains("tracking_total_keys:5"), "{info}");
    assert!(info.contains("tracking_evicted_keys:3"), "{info}");
    // A change of a key still remembered is still sent.
    origin
        .batch_execute("UPDATE users SET name = 'b' WHERE id = 8")
        .await
        .unwrap();
    assert_eq!(c.frame().await, push("users:8"));

    // The stream is lost and stays down past max_lag_ms: a null invalidation.
    let n = origin
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(c.frame().await, NULL_PUSH);
    // While hits are off, a read is answered by the origin and invalidated right after.
    let got = c.cmd(&["GET", "users:9"]).await;
    assert!(got.starts_with(b"$"), "{}", show(&got));
    if p.shared.serve_hits() {
        eprintln!("the stream came back before the read: the read-in-bypass check is skipped");
    } else {
        assert_eq!(c.frame().await, push("users:9"));
    }
    p.shutdown().await;
}

/// The id of a RESP connection: ids are `n * cores + core + 1`, so with two cores the parity
/// tells the connection's core.
async fn client_id(r: &mut Raw) -> u64 {
    let id = String::from_utf8(r.cmd(&["CLIENT", "ID"]).await).unwrap();
    id.trim_start_matches(':').trim().parse().unwrap()
}

/// Connects until a connection lands on `core` (of two).
async fn on_core(p: &pgline_controlplane::server::Pgline, core: u64) -> (Raw, u64) {
    for _ in 0..64 {
        let mut r = Raw::connect(p).await;
        let id = client_id(&mut r).await;
        if (id - 1) % 2 == core {
            return (r, id);
        }
    }
    panic!("no connection landed on core {core} in 64 tries");
}

/// With two cores, tracking state lives on each connection's own core: a change reaches tracking
/// clients on both, a redirect to a subscriber on the other core crosses to it, and a redirect
/// target on the other core is checked as one on the same core is (never issued: refused; gone:
/// `tracking-redir-broken`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidations_reach_every_core_and_redirects_cross_cores() {
    let db = TestDb::create("tracking_cores").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 2)).await;

    let (mut sub, sub_id) = on_core(&p, 0).await;
    assert_eq!(
        sub.cmd(&["SUBSCRIBE", "__redis__:invalidate"]).await,
        b"*3\r\n$9\r\nsubscribe\r\n$20\r\n__redis__:invalidate\r\n:1\r\n"
    );
    let (mut data, _) = on_core(&p, 1).await;
    assert_eq!(
        data.cmd(&["CLIENT", "TRACKING", "on", "redirect", &sub_id.to_string()])
            .await,
        b"+OK\r\n"
    );
    // One RESP3 tracking client on each core, both reading the same key.
    let mut resp3_on = Vec::new();
    for core in 0..2 {
        let (mut r, _) = on_core(&p, core).await;
        assert!(r.cmd(&["HELLO", "3"]).await.starts_with(b"%7\r\n"));
        assert_eq!(r.cmd(&["CLIENT", "TRACKING", "on"]).await, b"+OK\r\n");
        resp3_on.push(r);
    }
    for r in [&mut data].into_iter().chain(resp3_on.iter_mut()) {
        assert!(r.cmd(&["GET", "users:5"]).await.starts_with(b"$"));
    }
    origin
        .batch_execute("UPDATE users SET name = 'c' WHERE id = 5")
        .await
        .unwrap();
    assert_eq!(
        sub.frame().await,
        message("users:5"),
        "redirected across cores"
    );
    for r in &mut resp3_on {
        assert_eq!(r.frame().await, push("users:5"));
    }
    let clients = show(&data.cmd(&["INFO", "clients"]).await);
    assert!(clients.contains("tracking_clients:3"), "{clients}");

    // A null invalidation (here a flush) reaches a redirect target that neither tracks nor
    // subscribes, on the other core.
    let (mut plain3, plain3_id) = on_core(&p, 0).await;
    assert!(plain3.cmd(&["HELLO", "3"]).await.starts_with(b"%7\r\n"));
    let (mut via, _) = on_core(&p, 1).await;
    assert_eq!(
        via.cmd(&[
            "CLIENT",
            "TRACKING",
            "on",
            "redirect",
            &plain3_id.to_string()
        ])
        .await,
        b"+OK\r\n"
    );
    p.admin().flush_all().await;
    assert_eq!(plain3.frame().await, NULL_PUSH);
    for r in &mut resp3_on {
        assert_eq!(r.frame().await, NULL_PUSH);
    }

    // A redirect to an id on the other core that was never handed out is refused, as Redis.
    let (mut e, _) = on_core(&p, 1).await;
    let got = show(
        &e.cmd(&["CLIENT", "TRACKING", "on", "redirect", "999999"])
            .await,
    );
    assert!(
        got.starts_with("-ERR The client ID you want redirect to does not exist"),
        "{got}"
    );
    // A target on the other core that goes away: the tracking client is told at its next
    // invalidation, and TRACKINGINFO says so.
    let (mut gone, gone_id) = on_core(&p, 0).await;
    gone.cmd(&["PING"]).await;
    let (mut orphan, _) = on_core(&p, 1).await;
    assert!(orphan.cmd(&["HELLO", "3"]).await.starts_with(b"%7\r\n"));
    orphan
        .cmd(&["CLIENT", "TRACKING", "on", "redirect", &gone_id.to_string()])
        .await;
    orphan.cmd(&["GET", "users:6"]).await;
    drop(gone);
    tokio::time::sleep(Duration::from_millis(200)).await;
    origin
        .batch_execute("UPDATE users SET name = 'g' WHERE id = 6")
        .await
        .unwrap();
    assert_eq!(
        orphan.frame().await,
        format!(">2\r\n$21\r\ntracking-redir-broken\r\n:{gone_id}\r\n").into_bytes()
    );
    let info = show(&orphan.cmd(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(info.contains("broken_redirect"), "{info}");
    p.shutdown().await;
}

/// BCAST prefixes are bounded per client (count and bytes) and per core (the core matches each
/// change against all of them): past a bound `CLIENT TRACKING` is refused and nothing changes;
/// a closed client's prefixes are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bcast_prefixes_are_bounded_per_client_and_per_core() {
    let db = TestDb::create("tracking_prefixes").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let err = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();

    let mut big = resp3(&p).await;
    let long = "a".repeat(70_000);
    let got = err(big
        .cmd(&["CLIENT", "TRACKING", "on", "bcast", "prefix", &long])
        .await);
    assert!(
        got.starts_with("-ERR pgline: a client's prefixes total at most 65536 bytes"),
        "{got}"
    );
    let mut args = vec!["CLIENT", "TRACKING", "on", "bcast"];
    let many: Vec<String> = (0..1025).map(|i| format!("p{i:05}:")).collect();
    for p in &many {
        args.extend(["prefix", p.as_str()]);
    }
    let got = err(big.cmd(&args).await);
    assert!(
        got.starts_with("-ERR pgline: at most 1024 prefixes per client"),
        "{got}"
    );
    assert_eq!(
        big.cmd(&["CLIENT", "GETREDIR"]).await,
        b":-1\r\n",
        "still off"
    );

    // 64 clients of 1,024 prefixes fill the core's 65,536.
    let mut full = Vec::new();
    for c in 0..64 {
        let mut r = resp3(&p).await;
        let prefixes: Vec<String> = (0..1024).map(|i| format!("c{c}:{i:04}:")).collect();
        let mut args = vec!["CLIENT", "TRACKING", "on", "bcast"];
        for p in &prefixes {
            args.extend(["prefix", p.as_str()]);
        }
        assert_eq!(r.cmd(&args).await, b"+OK\r\n", "client {c}");
        full.push(r);
    }
    let got = err(big
        .cmd(&["CLIENT", "TRACKING", "on", "bcast", "prefix", "users:"])
        .await);
    assert!(
        got.starts_with(
            "-ERR pgline: the BCAST clients of this connection's core hold 65536 prefixes"
        ),
        "{got}"
    );
    // A client closes: its prefixes are given back.
    drop(full.pop());
    let mut ok = false;
    for _ in 0..50 {
        let got = big
            .cmd(&["CLIENT", "TRACKING", "on", "bcast", "prefix", "users:"])
            .await;
        if got == b"+OK\r\n" {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "the closed client's prefixes were given back");
    // And BCAST still works for everyone: a change of users:3 reaches `big`.
    origin
        .batch_execute("UPDATE users SET name = 'p' WHERE id = 3")
        .await
        .unwrap();
    assert_eq!(big.frame().await, push("users:3"));
    p.shutdown().await;
}

/// In cluster mode a key may carry a hash tag anywhere (`{users}:42`, `users:{42}`): a BCAST
/// client's tagged reads are remembered and invalidated under the spelling it read, beside the
/// untagged names its prefixes match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bcast_in_cluster_mode_invalidates_the_tagged_spellings_read() {
    use pgline_controlplane::config::{ClusterConfig, ClusterNodeConfig, ClusterShardConfig};
    let db = TestDb::create("tracking_cluster").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.cluster = ClusterConfig {
        node: "n1".into(),
        nodes: vec![ClusterNodeConfig {
            name: "n1".into(),
            addr: "127.0.0.1:6380".into(),
            id: String::new(),
            api: String::new(),
        }],
        shards: vec![ClusterShardConfig {
            name: "s1".into(),
            slots: vec!["0-16383".into()],
            nodes: vec!["n1".into()],
        }],
        ..ClusterConfig::default()
    };
    let p = lab::start(cfg).await;
    let mut b = resp3(&p).await;
    assert_eq!(
        b.cmd(&["CLIENT", "TRACKING", "on", "bcast", "prefix", "users:"])
            .await,
        b"+OK\r\n"
    );
    for key in ["{users}:42", "users:{42}", "users:43"] {
        let got = b.cmd(&["GET", key]).await;
        assert!(got.starts_with(b"$"), "{key}: {}", show(&got));
    }
    origin
        .batch_execute("UPDATE users SET name = 't' WHERE id = 42")
        .await
        .unwrap();
    let mut got = vec![
        show(&b.frame().await),
        show(&b.frame().await),
        show(&b.frame().await),
    ];
    got.sort();
    let mut want = vec![
        show(&push("{users}:42")),
        show(&push("users:{42}")),
        show(&push("users:42")),
    ];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(nothing(&mut b, Duration::from_millis(300)).await, Ok(()));
    p.shutdown().await;
}

/// redis-py's client cache (RESP3, default mode) and valkey-glide's (server-assisted: BCAST)
/// read through their caches while the origin is written to; no read may return a row older than
/// the bound after a committed change, and at the end every cached value is the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_caches_read_nothing_stale() {
    let Some(python) = lab::python_venv() else {
        eprintln!("the lab venv (deploy/lab/pgwire_venv.sh) is unavailable: skipped");
        return;
    };
    let db = TestDb::create("tracking_py").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE items (id int4 PRIMARY KEY, v int8 NOT NULL);
             INSERT INTO items SELECT g, 0 FROM generate_series(1, 200) g;",
        )
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let addr = p.local_addr();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tracking_probe.py");
    let host = addr.ip().to_string();
    let port = addr.port().to_string();
    let dsn = db.conn_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args([
                "--host",
                &host,
                "--port",
                &port,
                "--dsn",
                &dsn,
                "--seconds",
                "6",
            ])
            .output()
    })
    .await
    .unwrap()
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "the probe failed");
    assert!(stdout.contains("redis-py: stale 0"), "{stdout}");
    assert!(stdout.contains("glide: stale 0"), "{stdout}");
    p.shutdown().await;
}
