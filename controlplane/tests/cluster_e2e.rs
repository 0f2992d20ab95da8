//! Cluster mode on RESP (issue 17): a fleet of six pglines on loopback, three shards of a
//! primary and a replica, every one tailing the lab origin with its own slot. Read through
//! redis-py's `RedisCluster` (`tests/cluster_client.py`: it learns the topology from `CLUSTER
//! SLOTS` and follows nothing but the slot map), valkey-glide's cluster client
//! (`tests/cluster_glide.py`, RESP3, `ReadFrom.PREFER_REPLICA` for the replicas) and `redis-cli`:
//! every answer equals the
//! origin's `row_to_json`; `-MOVED`, `-CROSSSLOT`, `READONLY` and `CLUSTER KEYSLOT` behave as a
//! Redis Cluster node's; an UPDATE is seen through the owning shard's primary and its replica.
//! Then a primary is stopped while redis-rs's cluster client (the third client) reads and
//! writers update the origin: no error reaches the application, the fleet routes the shard to
//! its replica within a stated bound, no store holds a stale entry once the writers stop, and
//! the primary rejoins when it is started again.
//!
//! Run: `cargo test --release -p pgline-controlplane --test suite -- cluster_e2e::`

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_controlplane::config::{ClusterConfig, ClusterNodeConfig, ClusterShardConfig};
use pgline_controlplane::server::Pgline;
use pgline_dataplane::cluster::key_slot;
use pgline_testkit::TestDb;
use pgline_testkit::{free_port, lab};

const ROWS: i64 = 300;
/// The fleet's API token (`PUT /v1/cluster` changes the topology).
const TOKEN: &str = "cluster-e2e-token";
const NAMES: [&str; 6] = ["p1", "r1", "p2", "r2", "p3", "r3"];
/// Slot ranges of the three shards (as `redis-cli --cluster create` splits 16,384 slots).
const RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// The shard that serves `key`'s slot.
fn shard_of(key: &str) -> usize {
    let slot = key_slot(key.as_bytes());
    RANGES
        .iter()
        .position(|&(lo, hi)| (lo..=hi).contains(&slot))
        .expect("every slot is assigned")
}

/// The fleet's configuration as node `me` has it; `ports` are each node's RESP and API ports.
/// Peers are checked every 100 ms and failed after two checks in a row without a 200.
fn fleet_config(me: &str, ports: &[(u16, u16)]) -> ClusterConfig {
    ClusterConfig {
        node: me.into(),
        nodes: NAMES
            .iter()
            .zip(ports)
            .map(|(name, port)| ClusterNodeConfig {
                name: name.to_string(),
                addr: format!("127.0.0.1:{}", port.0),
                id: String::new(),
                api: format!("127.0.0.1:{}", port.1),
            })
            .collect(),
        shards: RANGES
            .iter()
            .enumerate()
            .map(|(i, (lo, hi))| ClusterShardConfig {
                name: format!("s{}", i + 1),
                slots: vec![format!("{lo}-{hi}")],
                nodes: vec![NAMES[2 * i].into(), NAMES[2 * i + 1].into()],
            })
            .collect(),
        health_interval_ms: 100,
        health_timeout_ms: 300,
        health_failures: 2,
    }
}

/// `redis-cli -p port` with `stdin` as its commands (one per line); its output.
async fn cli(port: u16, stdin: &str) -> String {
    let stdin = stdin.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("redis-cli");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("redis-cli output");
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .expect("redis-cli thread")
}

/// `redis-cli`'s output as one line per reply: it prints an empty line after an error reply
/// (and a nil as an empty line, kept).
fn replies(out: &str) -> Vec<&str> {
    let mut v: Vec<&str> = Vec::new();
    for line in out.lines() {
        let after_error = v
            .last()
            .is_some_and(|l| l.starts_with("MOVED ") || l.starts_with("CROSSSLOT "));
        if !(line.is_empty() && after_error) {
            v.push(line);
        }
    }
    v
}

/// Asks node `port` for `key` until it answers `want` (one reply); panics after `secs` seconds.
async fn wait_answer(port: u16, key: &str, want: &str, secs: u64, what: &str) {
    let since = Instant::now();
    loop {
        let out = cli(port, &format!("GET {key}\n")).await;
        if replies(&out) == vec![want] {
            return;
        }
        assert!(
            since.elapsed() < Duration::from_secs(secs),
            "{what}: not within {secs} s ({out})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The second client, redis-rs's cluster client, with retries that outlast a failover (30, 10 ms
/// growing to 200 ms apart).
async fn redis_rs(port: u16) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::builder(vec![format!("redis://127.0.0.1:{port}/")])
        .retries(30)
        .min_retry_wait(10)
        .max_retry_wait(200)
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(2))
        .build()
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection")
}

/// Every row through redis-rs's cluster client, compared with `rows`.
async fn redis_rs_reads_all(port: u16, rows: &BTreeMap<i64, String>) {
    let mut c = redis_rs(port).await;
    for (id, want) in rows {
        let got: Option<String> = redis::cmd("GET")
            .arg(format!("t:{id}"))
            .query_async(&mut c)
            .await
            .unwrap_or_else(|e| panic!("redis-rs GET t:{id}: {e}"));
        assert_eq!(got.as_deref(), Some(want.as_str()), "redis-rs t:{id}");
    }
}

/// Reads the rows in turn through redis-rs's cluster client until `stop`: how many answers, the
/// errors the client returned to the application (after its own retries), and the longest time
/// between two answers.
async fn read_loop(port: u16, stop: Arc<AtomicBool>) -> (u64, Vec<String>, Duration) {
    let mut c = redis_rs(port).await;
    let (mut reads, mut errors, mut gap) = (0u64, Vec::new(), Duration::ZERO);
    let mut last = Instant::now();
    let mut id = 0;
    while !stop.load(Ordering::Relaxed) {
        id = id % ROWS + 1;
        let got: redis::RedisResult<Option<String>> = redis::cmd("GET")
            .arg(format!("t:{id}"))
            .query_async(&mut c)
            .await;
        match got {
            Ok(Some(_)) => {
                reads += 1;
                gap = gap.max(last.elapsed());
                last = Instant::now();
            }
            Ok(None) => errors.push(format!("t:{id}: nil")),
            Err(e) => errors.push(format!("t:{id}: {e}")),
        }
    }
    (reads, errors, gap)
}

/// Updates rows at the origin (a few hundred a second) until `stop`; how many.
async fn write_loop(origin: tokio_postgres::Client, stop: Arc<AtomicBool>) -> u64 {
    let mut writes = 0u64;
    let mut x: i64 = 7;
    while !stop.load(Ordering::Relaxed) {
        x = (x * 37 + 11) % ROWS;
        origin
            .execute("UPDATE t SET n = n + 1 WHERE id = $1", &[&(x + 1)])
            .await
            .expect("update");
        writes += 1;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    writes
}

async fn origin_rows(origin: &tokio_postgres::Client) -> BTreeMap<i64, String> {
    origin
        .query("SELECT id, row_to_json(t)::text FROM t ORDER BY id", &[])
        .await
        .expect("origin rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// `PUT /v1/cluster` on the node whose API is `api`: (status, body).
async fn put_topology(api: u16, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .put(format!("http://127.0.0.1:{api}/v1/cluster"))
        .bearer_auth(TOKEN)
        .json(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("PUT /v1/cluster");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// `[cluster]`'s nodes and shards as the API takes them, with `ranges` as the shards' slots.
fn topology_body(ports: &[(u16, u16)], ranges: &[(u16, u16); 3]) -> serde_json::Value {
    let cfg = fleet_config("p1", ports);
    serde_json::json!({
        "nodes": cfg.nodes,
        "shards": ranges.iter().enumerate().map(|(i, (lo, hi))| serde_json::json!({
            "name": format!("s{}", i + 1),
            "slots": [format!("{lo}-{hi}")],
            "nodes": [NAMES[2 * i], NAMES[2 * i + 1]],
        })).collect::<Vec<_>>(),
    })
}

/// Runs redis-py's `cluster_client.py` against node `port` in `mode`; panics unless it read
/// every row right and found `nodes` serving nodes.
async fn redis_py(python: &str, port: u16, rows: &BTreeMap<i64, String>, mode: &str, nodes: usize) {
    python_client(python, "cluster_client.py", port, rows, mode, nodes).await;
}

/// The same with valkey-glide's cluster client (`cluster_glide.py`).
async fn glide(python: &str, port: u16, rows: &BTreeMap<i64, String>, mode: &str, nodes: usize) {
    python_client(python, "cluster_glide.py", port, rows, mode, nodes).await;
}

async fn python_client(
    python: &str,
    script: &str,
    port: u16,
    rows: &BTreeMap<i64, String>,
    mode: &str,
    nodes: usize,
) {
    let file = std::env::temp_dir().join(format!(
        "pgline-cluster-rows-{}-{script}-{mode}",
        std::process::id()
    ));
    let text: String = rows.iter().map(|(id, j)| format!("{id}\t{j}\n")).collect();
    std::fs::write(&file, text).expect("rows file");
    let path_of_script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let (python, path, mode_s) = (
        python.to_string(),
        file.to_string_lossy().into_owned(),
        mode.to_string(),
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args([
                &path_of_script,
                "127.0.0.1",
                &port.to_string(),
                &path,
                &mode_s,
            ])
            .output()
            .expect("python")
    })
    .await
    .expect("python thread");
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with(&format!("ok gets=300 mgets=300 nodes={nodes}")),
        "{script} ({mode}): {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_three_shards_answers_redis_cluster_clients() {
    let db = TestDb::create("cluster_fleet").await;
    let origin = db.client().await;
    origin
        .batch_execute(&format!(
            "CREATE TABLE t (id int8 PRIMARY KEY, v text, n int4);
             INSERT INTO t SELECT g, 'row ' || g, g * 3 FROM generate_series(1, {ROWS}) g;
             CREATE TABLE o (tenant int4, id int4, v text, PRIMARY KEY (tenant, id));
             INSERT INTO o SELECT t, i, 'order ' || t || '/' || i
               FROM generate_series(1, 5) t, generate_series(1, 4) i;"
        ))
        .await
        .expect("origin table");
    let rows = origin_rows(&origin).await;
    let both: Vec<(u16, u16)> = NAMES.iter().map(|_| (free_port(), free_port())).collect();
    let ports: Vec<u16> = both.iter().map(|p| p.0).collect();
    let mut fleet: Vec<Arc<Pgline>> = Vec::new();
    let mut cfgs = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let slot = format!("{}_{name}", lab::slot_name(&db));
        let mut cfg = lab::config_with(
            &db.conn_string(),
            &slot,
            1,
            &[format!("api.token=\"{TOKEN}\"")],
        );
        cfg.resp.listen = format!("127.0.0.1:{}", both[i].0);
        cfg.api.listen = format!("127.0.0.1:{}", both[i].1);
        cfg.cluster = fleet_config(name, &both);
        cfgs.push(cfg.clone());
        fleet.push(lab::start(cfg).await);
    }

    // One key per shard, and what each node of the fleet answers for it.
    let key = |s: usize| {
        (1..=ROWS)
            .map(|i| format!("t:{i}"))
            .find(|k| shard_of(k) == s)
            .expect("a key in every shard")
    };
    for s in 0..3 {
        let k = key(s);
        let slot = key_slot(k.as_bytes());
        let id: i64 = k[2..].parse().expect("id");
        let row = &rows[&id];
        let primary = ports[2 * s];
        for (n, &port) in ports.iter().enumerate() {
            let out = cli(port, &format!("GET {k}\n")).await;
            if n == 2 * s {
                assert_eq!(out.trim(), row.as_str(), "{k} from its primary");
            } else {
                // Other shards, and the replica without READONLY: to the primary.
                assert_eq!(
                    replies(&out),
                    vec![format!("MOVED {slot} 127.0.0.1:{primary}")],
                    "{k} from {}",
                    NAMES[n]
                );
            }
        }
        let replica = ports[2 * s + 1];
        let out = cli(replica, &format!("READONLY\nGET {k}\nREADWRITE\nGET {k}\n")).await;
        assert_eq!(
            replies(&out),
            vec![
                "OK",
                row.as_str(),
                "OK",
                &format!("MOVED {slot} 127.0.0.1:{primary}")
            ],
            "{k} from its replica"
        );
        let out = cli(primary, &format!("CLUSTER KEYSLOT {k}\n")).await;
        assert_eq!(out.trim(), slot.to_string());
    }
    // A multi-key command across slots, as Redis answers it (even when one node serves both).
    let (a, b) = (key(0), key(1));
    let out = cli(ports[0], &format!("MGET {a} {b}\nEXISTS {a} {b}\n")).await;
    assert_eq!(
        replies(&out),
        vec!["CROSSSLOT Keys in request don't hash to the same slot"; 2]
    );
    // Hash tags route by the tag: `{t:1}x` and `{t:1}y` share a slot, so MGET reaches the
    // store (absent keys: both nil) instead of CROSSSLOT.
    let tagged = shard_of("t:1");
    let out = cli(ports[2 * tagged], "MGET {t:1}x {t:1}y\n").await;
    assert_eq!(replies(&out), vec!["", ""], "{out}");
    // The key rule for composite keys: `o:{tenant}:id` keeps one tenant's rows in one slot, and
    // the braces are not part of the row's key.
    for tenant in 1..=5 {
        let s = shard_of(&tenant.to_string());
        let keys: Vec<String> = (1..=4).map(|i| format!("o:{{{tenant}}}:{i}")).collect();
        let out = cli(ports[2 * s], &format!("MGET {}\n", keys.join(" "))).await;
        let want: Vec<String> = (1..=4)
            .map(|i| format!("{{\"tenant\":{tenant},\"id\":{i},\"v\":\"order {tenant}/{i}\"}}"))
            .collect();
        assert_eq!(replies(&out), want, "tenant {tenant}");
    }
    let out = cli(ports[1], "CLUSTER INFO\nCLUSTER MYID\n").await;
    assert!(out.contains("cluster_state:ok"), "{out}");
    assert!(out.contains("cluster_known_nodes:6"), "{out}");

    // redis-py's cluster client, from the primaries and with READONLY from the replicas.
    let python =
        lab::python_venv().expect("the lab venv with redis-py (deploy/lab/pgwire_venv.sh)");
    redis_py(&python, ports[3], &rows, "primaries", 6).await;
    redis_py(&python, ports[4], &rows, "replicas", 6).await;
    glide(&python, ports[2], &rows, "primaries", 6).await;
    glide(&python, ports[5], &rows, "replicas", 6).await;

    // An UPDATE reaches the owning shard's primary and replica.
    let k = key(2);
    let id: i64 = k[2..].parse().expect("id");
    origin
        .execute("UPDATE t SET v = 'changed', n = -1 WHERE id = $1", &[&id])
        .await
        .expect("update");
    let rows = origin_rows(&origin).await;
    for p in &fleet[4..6] {
        lab::sync(p, &origin).await;
    }
    let out = cli(ports[4], &format!("GET {k}\n")).await;
    assert_eq!(out.trim(), rows[&id].as_str());
    let out = cli(ports[5], &format!("READONLY\nGET {k}\n")).await;
    assert_eq!(out.lines().nth(1), Some(rows[&id].as_str()));
    assert!(rows[&id].contains("changed"));
    redis_py(&python, ports[0], &rows, "replicas", 6).await;

    // Shard 1's primary dies: its peers see /v1/ready refused twice in a row (100 ms apart),
    // report its replica as the shard's master, and send its keys there; the clients read every
    // row again through the replica.
    let k = key(0);
    let id: i64 = k[2..].parse().expect("id");
    let slot = key_slot(k.as_bytes());
    // Through the kill, redis-rs's cluster client reads every row in turn while writers update
    // rows at the origin: the application must see no error beyond the client's own retries.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn(read_loop(ports[2], stop.clone()));
    let writer = tokio::spawn(write_loop(db.client().await, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    fleet[0].shutdown().await;
    let moved_to_replica = format!("MOVED {slot} 127.0.0.1:{}", ports[1]);
    wait_answer(
        ports[2],
        &k,
        &moved_to_replica,
        5,
        "shard 1 routed to its replica",
    )
    .await;
    let failover = killed.elapsed();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    let (reads, errors, gap) = reader.await.expect("reader");
    let writes = writer.await.expect("writer");
    assert!(errors.is_empty(), "errors through the failover: {errors:?}");
    assert!(
        gap < Duration::from_secs(3),
        "no answer for {gap:?} through the failover"
    );
    eprintln!(
        "cluster_e2e: through the failover redis-rs read {reads} rows with no error, longest wait \
         {gap:?}, while {writes} updates ran"
    );
    // Writers stopped: every node that is up has applied them, and no entry of any store is
    // stale; both clients read the new rows.
    for p in &fleet[1..] {
        lab::sync(p, &origin).await;
        // Table t's entries (`stale_entries` looks rows up by an `id` column; o's rows, keyed
        // by (tenant, id), are never written).
        let stale: Vec<String> = lab::stale_entries(p, &origin)
            .await
            .into_iter()
            .filter(|e| e.starts_with("t:"))
            .collect();
        assert_eq!(stale, Vec::<String>::new());
    }
    let rows = origin_rows(&origin).await;
    redis_rs_reads_all(ports[3], &rows).await;
    let out = cli(ports[1], &format!("GET {k}\n")).await;
    assert_eq!(
        out.trim(),
        rows[&id].as_str(),
        "the replica serves without READONLY"
    );
    let nodes = cli(ports[4], "CLUSTER NODES\n").await;
    assert!(
        nodes
            .lines()
            .any(|l| l.contains(" slave,fail ") && l.contains(",p1 ")),
        "{nodes}"
    );
    redis_py(&python, ports[2], &rows, "primaries", 5).await;
    glide(&python, ports[3], &rows, "replicas", 5).await;
    eprintln!("cluster_e2e: shard 1 routed to its replica {failover:?} after its primary stopped");

    // The primary comes back (same configuration, same slot): it rejoins as the shard's master.
    let back = Instant::now();
    fleet[0] = lab::start(cfgs[0].clone()).await;
    let moved_to_primary = format!("MOVED {slot} 127.0.0.1:{}", ports[0]);
    wait_answer(
        ports[2],
        &k,
        &moved_to_primary,
        10,
        "shard 1 routed back to its primary",
    )
    .await;
    eprintln!(
        "cluster_e2e: routed back {:?} after the restart began",
        back.elapsed()
    );
    let out = cli(ports[0], &format!("GET {k}\n")).await;
    assert_eq!(out.trim(), rows[&id].as_str());
    redis_py(&python, ports[5], &rows, "primaries", 6).await;
    redis_rs_reads_all(ports[1], &rows).await;

    // The topology changes without a restart: shard 1 takes slots 5461-8191 from shard 2. An
    // invalid one first (a shard naming an unknown node): refused with the reason, nothing
    // changes.
    let mut bad = topology_body(&both, &RANGES);
    bad["shards"][2]["nodes"] = serde_json::json!(["p3", "nobody"]);
    let (status, body) = put_topology(both[2].1, &bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("nobody"), "{body}");
    let moved: [(u16, u16); 3] = [(0, 8191), (8192, 10922), (10923, 16383)];
    let k = (1..=ROWS)
        .map(|i| format!("t:{i}"))
        .find(|k| (5461..=8191).contains(&key_slot(k.as_bytes())))
        .expect("a key in the moved slots");
    let slot = key_slot(k.as_bytes());
    let id: i64 = k[2..].parse().expect("id");
    assert_eq!(
        replies(&cli(ports[2], &format!("GET {k}\n")).await),
        vec![rows[&id].as_str()],
        "shard 2 serves {k} before the change"
    );
    let body = topology_body(&both, &moved);
    let mut changes = Vec::new();
    for (_, api) in &both {
        let (status, change) = put_topology(*api, &body).await;
        assert_eq!(status, 200, "{change}");
        changes.push(change);
    }
    // p1 and r1 gained 2,731 slots; p2 and r2 lost them and flushed their stores (p2 held
    // shard 2's rows, read above); shard 3 is untouched.
    for (n, change) in changes.iter().enumerate() {
        let (gained, lost) = match n / 2 {
            0 => (2731, 0),
            1 => (0, 2731),
            _ => (0, 0),
        };
        assert_eq!(change["slots_gained"], gained, "{}: {change}", NAMES[n]);
        assert_eq!(change["slots_lost"], lost, "{}: {change}", NAMES[n]);
        if lost == 0 {
            assert_eq!(change["flushed"], 0, "{}: {change}", NAMES[n]);
        }
    }
    assert!(changes[2]["flushed"].as_u64() > Some(0), "{}", changes[2]);
    let out = cli(ports[2], &format!("GET {k}\n")).await;
    assert_eq!(
        replies(&out),
        vec![format!("MOVED {slot} 127.0.0.1:{}", ports[0])],
        "shard 2 sends {k} to shard 1 now"
    );
    let out = cli(ports[0], &format!("GET {k}\n")).await;
    assert_eq!(
        out.trim(),
        rows[&id].as_str(),
        "shard 1 fills {k} on demand"
    );
    let out = cli(ports[4], "CLUSTER SHARDS\n").await;
    assert!(out.contains("8191"), "{out}");
    redis_py(&python, ports[4], &rows, "primaries", 6).await;
    redis_py(&python, ports[3], &rows, "replicas", 6).await;
    glide(&python, ports[1], &rows, "replicas", 6).await;
    let view: serde_json::Value = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/v1/cluster", both[3].1))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET /v1/cluster")
        .json()
        .await
        .expect("cluster view");
    assert_eq!(view["node"], "r2");
    assert_eq!(
        view["shards"][1]["slots"],
        serde_json::json!(["8192-10922"])
    );
    assert_eq!(view["shards"][0]["acting_primary"], "p1");

    for p in fleet {
        p.shutdown().await;
    }
}
