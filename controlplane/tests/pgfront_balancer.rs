//! The PostgreSQL front behind an L4 balancer (issue 17): Debian's HAProxy in TCP mode in front
//! of two pgline processes, each checked on its API's `/v1/ready`. psql and pgbench connect to
//! HAProxy only. One appliance is killed (SIGKILL) in the middle of a pgbench run:
//! - with a connection per transaction (`pgbench -C`), no transaction fails: HAProxy marks the
//!   dead appliance down within two checks and sends new connections to the other one, and a
//!   connection refused before that is retried there (`option redispatch`);
//! - with persistent sessions (TPC-B), the sessions on the killed appliance end (a session stays
//!   on one appliance, `docs/scale-out.md`), the others run to the end, and the origin's
//!   balances still agree: a transaction cut off with its appliance was rolled back whole.
//!
//! Then the killed appliance is started again on the same ports and HAProxy sends it sessions
//! again. Needs `haproxy` (deploy/lab/packages.txt).
//!
//! Run: `cargo test --release -p pgline-controlplane --test suite -- pgfront_balancer::`

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_testkit::{free_port, origin, TestDb};

/// One appliance: a `pgline serve` process with its RESP, API and PostgreSQL ports.
struct Appliance {
    name: &'static str,
    resp: u16,
    api: u16,
    pg: u16,
    slot: String,
    child: Option<Child>,
}

impl Appliance {
    fn new(name: &'static str, db: &TestDb) -> Appliance {
        Appliance {
            name,
            resp: free_port(),
            api: free_port(),
            pg: free_port(),
            slot: format!("{}_{name}", db.name),
            child: None,
        }
    }

    /// Starts the process and waits until `/v1/ready` answers 200.
    fn start(&mut self, db: &TestDb) {
        let set = |k: &str, v: String| ["--set".to_string(), format!("{k}=\"{v}\"")];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgline"));
        cmd.args(["serve", "--origin", &db.conn_string(), "--memory", "64MiB"])
            .args(["--listen", &format!("127.0.0.1:{}", self.resp)])
            .args(set("api.listen", format!("127.0.0.1:{}", self.api)))
            .args(set("pgwire.listen", format!("127.0.0.1:{}", self.pg)))
            .args(set("replication.slot", self.slot.clone()))
            .args(set("log.level", "warn".into()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        self.child = Some(cmd.spawn().expect("pgline serve"));
        let since = Instant::now();
        while !self.ready() {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "{} never became ready",
                self.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn ready(&self) -> bool {
        ureq::get(&format!("http://127.0.0.1:{}/v1/ready", self.api))
            .timeout(Duration::from_secs(2))
            .call()
            .is_ok()
    }

    /// SIGKILL: no shutdown of any kind, as when the machine dies.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("kill pgline");
            c.wait().expect("reap pgline");
        }
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        self.kill();
    }
}

/// HAProxy in TCP mode: `front` balanced over the appliances' PostgreSQL ports, each checked
/// every 100 ms on `/v1/ready` (down after 2 failures, up after 2 successes); a stats page
/// (CSV) on `stats`.
struct Balancer {
    child: Child,
    front: u16,
    stats: u16,
    cfg: std::path::PathBuf,
}

impl Balancer {
    fn start(appliances: &[&Appliance]) -> Balancer {
        let (front, stats) = (free_port(), free_port());
        let servers: String = appliances
            .iter()
            .map(|a| {
                format!(
                    "    server {} 127.0.0.1:{} check port {}\n",
                    a.name, a.pg, a.api
                )
            })
            .collect();
        let cfg = format!(
            "global\n    maxconn 256\n\
             defaults\n    mode tcp\n    timeout connect 500ms\n    timeout client 60s\n    \
             timeout server 60s\n    retries 3\n    option redispatch 1\n\
             listen pgline_pg\n    bind 127.0.0.1:{front}\n    balance roundrobin\n    \
             option httpchk GET /v1/ready\n    http-check expect status 200\n    \
             timeout check 1s\n    default-server inter 100ms fall 2 rise 2\n\
             {servers}\
             listen stats\n    mode http\n    bind 127.0.0.1:{stats}\n    stats enable\n    \
             stats uri /stats\n"
        );
        let path =
            std::env::temp_dir().join(format!("pgline-haproxy-{}-{front}.cfg", std::process::id()));
        std::fs::write(&path, cfg).expect("haproxy.cfg");
        let check = Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("haproxy is installed (deploy/lab/packages.txt)");
        assert!(check.status.success(), "haproxy -c: {check:?}");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy");
        Balancer {
            child,
            front,
            stats,
            cfg: path,
        }
    }

    /// Per server: (status, sessions so far, sessions now), from the stats CSV.
    fn servers(&self) -> BTreeMap<String, (String, u64, u64)> {
        let Ok(r) = ureq::get(&format!("http://127.0.0.1:{}/stats;csv", self.stats))
            .timeout(Duration::from_secs(2))
            .call()
        else {
            return BTreeMap::new();
        };
        let text = r.into_string().expect("stats csv");
        let mut lines = text.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .trim_start_matches("# ")
            .split(',')
            .collect();
        let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
        let (px, sv, status) = (col("pxname"), col("svname"), col("status"));
        let (stot, scur) = (col("stot"), col("scur"));
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > stot.max(scur) && f[px] == "pgline_pg")
            .filter(|f| f[sv] != "FRONTEND" && f[sv] != "BACKEND")
            .map(|f| {
                (
                    f[sv].to_string(),
                    (
                        f[status].to_string(),
                        f[stot].parse().unwrap_or(0),
                        f[scur].parse().unwrap_or(0),
                    ),
                )
            })
            .collect()
    }

    /// Waits until server `name`'s status starts with `want` ("UP", "DOWN"); how long it took.
    fn wait_status(&self, name: &str, want: &str, secs: u64) -> Duration {
        let since = Instant::now();
        loop {
            if let Some((s, _, _)) = self.servers().get(name) {
                if s.starts_with(want) {
                    return since.elapsed();
                }
            }
            assert!(
                since.elapsed() < Duration::from_secs(secs),
                "{name} not {want} within {secs} s: {:?}",
                self.servers()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sessions server `name` has had so far.
    fn sessions(&self, name: &str) -> u64 {
        self.servers().get(name).map_or(0, |s| s.1)
    }

    /// Sessions server `name` holds now.
    fn current(&self, name: &str) -> u64 {
        self.servers().get(name).map_or(0, |s| s.2)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.cfg);
    }
}

/// libpq's environment for the test database through `port` on loopback.
fn libpq_env(db: &TestDb, port: u16) -> Vec<(&'static str, String)> {
    let (_, _, user, password) = origin::origin_base();
    vec![
        ("PGHOST", "127.0.0.1".into()),
        ("PGPORT", port.to_string()),
        ("PGUSER", user),
        ("PGPASSWORD", password),
        ("PGDATABASE", db.name.clone()),
        ("PGCONNECT_TIMEOUT", "5".into()),
    ]
}

/// The same as a libpq connection string.
fn libpq_conn(db: &TestDb, port: u16) -> String {
    let (_, _, user, password) = origin::origin_base();
    format!(
        "host=127.0.0.1 port={port} user={user} password={password} dbname={} connect_timeout=5",
        db.name
    )
}

/// Connects, reads one row and disconnects, again and again until `stop`: per connection, when
/// it began and ended and whether it worked.
fn connect_loop(conn: &str, stop: &AtomicBool) -> Vec<(Instant, Instant, Result<(), String>)> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let begun = Instant::now();
        let ok = postgres_read(conn);
        out.push((begun, Instant::now(), ok));
    }
    out
}

fn postgres_read(conn: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let task = tokio::spawn(connection);
        let read = client
            .query_one("SELECT abalance FROM pgbench_accounts WHERE aid = 7", &[])
            .await
            .map(|_| ())
            .map_err(|e| format!("read: {e}"));
        drop(client);
        let _ = task.await;
        read
    })
}

fn run(program: &str, args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn psql(env: &[(&str, String)], sql: &str) -> String {
    let out = run("psql", &["-XtAq", "-v", "ON_ERROR_STOP=1", "-c", sql], env);
    assert!(out.status.success(), "psql {sql}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// pgbench in the background, progress every second; killed by nothing but its own end.
fn pgbench(args: &[&str], env: &[(&str, String)]) -> Child {
    Command::new("pgbench")
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pgbench")
}

fn finish(child: Child) -> (bool, String) {
    let out = child.wait_with_output().expect("pgbench output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `progress: 4.0 s, 812.3 tps, ...` lines: (second, tps).
fn progress(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("progress: ")?;
            let mut it = rest.split(", ");
            let t = it.next()?.strip_suffix(" s")?.parse().ok()?;
            let tps = it.next()?.strip_suffix(" tps")?.parse().ok()?;
            Some((t, tps))
        })
        .collect()
}

/// pgbench's `number of transactions actually processed: N`.
fn processed(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|v| v.split(['/', ' ']).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

const SUMS: &str = "SELECT (SELECT sum(abalance) FROM pgbench_accounts)::text || ' ' || \
                    (SELECT sum(bbalance) FROM pgbench_branches) || ' ' || \
                    (SELECT sum(tbalance) FROM pgbench_tellers) || ' ' || \
                    (SELECT coalesce(sum(delta), 0) FROM pgbench_history)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_keeps_the_postgresql_front_up_when_an_appliance_dies() {
    let db = TestDb::create("pg_balancer").await;
    tokio::task::spawn_blocking(move || balancer_test(&db))
        .await
        .expect("balancer test");
}

fn balancer_test(db: &TestDb) {
    let (host, port, _, _) = origin::origin_base();
    let mut origin_env = libpq_env(db, port);
    origin_env[0].1 = host;
    let init = run("pgbench", &["-i", "-s", "1", "-q"], &origin_env);
    assert!(init.status.success(), "pgbench -i: {init:?}");

    let mut a = Appliance::new("a", db);
    let mut b = Appliance::new("b", db);
    a.start(db);
    b.start(db);
    let lb = Balancer::start(&[&a, &b]);
    lb.wait_status("a", "UP", 10);
    lb.wait_status("b", "UP", 10);
    let env = libpq_env(db, lb.front);

    // psql through the balancer: the origin's answers, from both appliances in turn.
    let q = "SELECT aid, abalance, filler FROM pgbench_accounts WHERE aid IN (1, 77, 1000) ORDER BY aid";
    let want = psql(&origin_env, q);
    for _ in 0..4 {
        assert_eq!(psql(&env, q), want);
    }
    assert!(
        lb.sessions("a") >= 2 && lb.sessions("b") >= 2,
        "round robin over both: {:?}",
        lb.servers()
    );

    // New connections in a loop (two at a time, each connects, reads a row, disconnects)
    // while `a` is killed: a connection open on `a` at that instant fails with it; every
    // connection begun after the kill succeeds, also before HAProxy has marked `a` down (a
    // refused connect is retried on `b`).
    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let (conn, stop) = (libpq_conn(db, lb.front), stop.clone());
            std::thread::spawn(move || connect_loop(&conn, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    a.kill();
    // Reaped: its sockets are closed from here on.
    let killed = Instant::now();
    let marked_down = lb.wait_status("a", "DOWN", 5);
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let outcomes: Vec<_> = loops
        .into_iter()
        .flat_map(|l| l.join().expect("loop"))
        .collect();
    let failed: Vec<_> = outcomes.iter().filter(|o| o.2.is_err()).collect();
    let late: Vec<_> = failed
        .iter()
        .filter(|o| o.0 >= killed)
        .map(|(begun, ended, e)| {
            format!(
                "begun {:?} after the kill, failed {:?} later: {e:?}",
                *begun - killed,
                *ended - *begun
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "connections begun after the kill failed: {late:?}"
    );
    let after: Vec<_> = outcomes.iter().filter(|o| o.0 >= killed).collect();
    let before_down = after.iter().filter(|o| o.0 < killed + marked_down).count();
    assert!(
        after.len() >= 10,
        "too few connections after the kill: {}",
        after.len()
    );
    eprintln!(
        "pgfront_balancer: {} connections, {} failed (open on the killed appliance); HAProxy \
         marked it down {marked_down:?} after the kill; {} connections after the kill all \
         succeeded ({before_down} of them before it was marked down)",
        outcomes.len(),
        failed.len(),
        after.len()
    );

    // Back on the same ports: HAProxy checks it up again and sends it sessions.
    let back = Instant::now();
    a.start(db);
    lb.wait_status("a", "UP", 10);
    eprintln!(
        "pgfront_balancer: a restarted appliance is UP again {:?} after its start",
        back.elapsed()
    );
    let before = lb.sessions("a");
    for _ in 0..4 {
        assert_eq!(psql(&env, q), want);
    }
    assert!(lb.sessions("a") > before, "{:?}", lb.servers());

    // Persistent sessions (TPC-B, 4 clients: two on each appliance) while `b` is killed: its
    // sessions end, the others run to the end, and the origin's balances agree.
    let run2 = pgbench(&["-n", "-c", "4", "-j", "2", "-T", "6", "-P", "1"], &env);
    std::thread::sleep(Duration::from_secs(2));
    let on_b = lb.current("b");
    assert_eq!(on_b + lb.current("a"), 4, "{:?}", lb.servers());
    b.kill();
    lb.wait_status("b", "DOWN", 5);
    let (_, text) = finish(run2);
    let aborted = text
        .lines()
        .filter(|l| l.starts_with("pgbench: error: client ") && l.contains(" aborted "))
        .count();
    assert_eq!(
        aborted as u64, on_b,
        "the clients on b, and only those, end:\n{text}"
    );
    let ticks = progress(&text);
    assert!(processed(&text) > 0, "{text}");
    assert!(
        ticks
            .iter()
            .filter(|(t, _)| *t >= 4.0)
            .all(|(_, tps)| *tps > 0.0),
        "the surviving sessions stopped: {ticks:?}\n{text}"
    );
    let sums = psql(&origin_env, SUMS);
    let parts: Vec<&str> = sums.split(' ').collect();
    assert!(
        parts.len() == 4 && parts.iter().all(|p| *p == parts[0]),
        "balances disagree after the kill: {sums}"
    );
    // New sessions through the balancer reach the surviving appliance.
    assert_eq!(psql(&env, q).lines().count(), 3);
    eprintln!(
        "pgfront_balancer: TPC-B with persistent sessions: {} transactions, the {aborted} \
         sessions on the killed appliance ended, the others ran to the end, balances agree \
         ({sums})",
        processed(&text)
    );
}
