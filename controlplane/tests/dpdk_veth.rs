//! End to end over DPDK: a real pgline (origin, WAL, store) started in-process with
//! `nic.mode = "dpdk"`, its dataplane core owning one end of a veth pair through `net_af_packet`
//! and then through `net_af_xdp`; the clients are the kernel's TCP stack in a network namespace
//! the test creates (`ip netns exec`): `ping`, `redis-cli GET`/`MGET` compared byte for byte with
//! the origin's `row_to_json`, and 1,000 concurrent connections doing 100 requests each
//! (`tests/dpdk_client.py`), every answer checked.
//!
//! One test function: DPDK allows one `rte_eal_init` per process. The first pgline starts the EAL
//! with `--vdev net_af_packet0,...` from its `[nic]` section; the second finds the EAL up and
//! hot-plugs `net_af_xdp0`. Needs root, `iproute2`, `ethtool`, `ping`, `redis-cli`, `python3`
//! and the PostgreSQL of `deploy/lab/pg.sh`; as another user it prints why and passes.
//!
//! Run: `cargo test -p pgline-controlplane --features dpdk --release --test dpdk_veth -- --nocapture`
//! With `PGLINE_E2E_IDLE_CONNECTIONS=N` each run first prints the server's resident memory per
//! idle connection with N open (`tests/dpdk_idle.py`; a figure, not a check).
#![cfg(feature = "dpdk")]

mod netns;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use netns::Netns;
use pgline_controlplane::config::NicMode;
use pgline_controlplane::server::Pgline;
use pgline_dataplane::plane::CoreStats;
use pgline_testkit::lab;
use pgline_testkit::TestDb;

const RESP_PORT: u16 = 6379;
const ROWS: i64 = 500;
/// Concurrent clients of the load check; `PGLINE_E2E_CONNECTIONS` for more (issue 16's
/// 10,000-connection run: `PGLINE_E2E_VDEVS=net_af_packet2 PGLINE_E2E_CONNECTIONS=10000`).
const CONNECTIONS: usize = 1000;

fn connections() -> usize {
    std::env::var("PGLINE_E2E_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CONNECTIONS)
}
const REQUESTS: usize = 100;

#[test]
fn dpdk_veth_end_to_end() {
    if !netns::is_root() {
        eprintln!("skipped: needs root (network namespaces, DPDK)");
        return;
    }
    // `PGLINE_E2E_VDEVS=af_xdp` (or `af_packet`): only those runs.
    let only = std::env::var("PGLINE_E2E_VDEVS").ok();
    let _eal_dir = EalRuntimeDir;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // Two queue pairs on af_packet: a PACKET_FANOUT group that hashes flows to the queues
        // and rolls a frame over to another queue when its ring is full, which moves a flow to
        // the other core (its stack answers RST); pgline gives a multi-queue af_packet 4,096
        // frames per ring (default 512) when `framecnt` is not named, which keeps the
        // 1,000-connection burst from filling it. The run below relies on that default.
        let runs = [
            Run {
                port: "net_af_packet0",
                tag: "afp",
                cores: 1,
                args: "",
                load: true,
                owned_tcp: false,
            },
            Run {
                port: "net_af_xdp0",
                tag: "xdp",
                cores: 1,
                args: "",
                // It once stalled after a few thousand frames: the mbuf pool's buffers past
                // net_af_xdp's UMEM were refused on the fill ring (dpdk_port.rs packs the pool).
                load: true,
                owned_tcp: false,
            },
            Run {
                port: "net_af_packet1",
                tag: "afp2q",
                cores: 2,
                args: ",qpairs=2",
                load: true,
                owned_tcp: false,
            },
            // Our own TCP (issue 16) against Linux's, on the same 1,000-connection load.
            Run {
                port: "net_af_packet2",
                tag: "afpown",
                cores: 1,
                args: "",
                load: true,
                owned_tcp: true,
            },
        ];
        for r in runs {
            if only
                .as_ref()
                .is_none_or(|o| o.split(',').any(|w| r.port.contains(w)))
            {
                run(r).await;
            }
        }
    });
}

/// Removes the EAL's runtime directory (`--file-prefix=pgline-<pid>`, see dpdk_port.rs) when the
/// test ends, also by a panic.
struct EalRuntimeDir;

impl Drop for EalRuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/pgline-{}", std::process::id()));
    }
}

/// One pgline with `cores` dataplane cores on a fresh veth through the vdev `port` (driver
/// arguments `iface=<veth>` and `args`).
struct Run {
    port: &'static str,
    tag: &'static str,
    cores: usize,
    args: &'static str,
    /// Whether the 1,000 x 100 clients run.
    load: bool,
    /// `nic.owned_tcp`: our own TCP instead of smoltcp's.
    owned_tcp: bool,
}

/// One pgline as `r` says, and every client check against it.
async fn run(r: Run) {
    let Run {
        port,
        tag,
        cores,
        args,
        load,
        owned_tcp,
    } = r;
    let t0 = Instant::now();
    let db = TestDb::create(&format!("dpdk_{tag}")).await;
    let origin = db.client().await;
    origin
        .batch_execute(&format!(
            "CREATE TABLE t (id int8 PRIMARY KEY, name text, qty int4, tags text[]);
             INSERT INTO t SELECT g, 'row \"' || g || '\" é', g * 7, ARRAY['a', 'b' || g]
               FROM generate_series(1, {ROWS}) g;"
        ))
        .await
        .expect("origin table");
    let rows = origin_rows(&origin).await;
    let net = Netns::create(tag).expect("netns + veth set-up");
    if cores > 1 {
        // af_packet's fanout spreads frames over the queues by the skb hash, which for the
        // namespace's own TCP is the socket's txhash; Linux picks a new one after a
        // retransmission timeout, which would move the flow to another core (whose stack answers
        // RST). A NIC's RSS hashes the 4-tuple and has no such problem.
        net.exec(&["sysctl", "-qw", "net.core.txrehash=0"])
            .expect("net.core.txrehash=0 in the namespace");
    }

    let mut cfg = lab::config(&db, cores);
    cfg.resp.listen = format!("0.0.0.0:{RESP_PORT}");
    cfg.nic.mode = NicMode::Dpdk;
    cfg.nic.ip = net.app_ip.to_string();
    cfg.nic.port = port.to_string();
    cfg.nic.vdevs = vec![format!("{port},iface={}{args}", net.root_if)];
    cfg.nic.eal_args = ["--no-huge", "-m", "512", "--log-level=notice"]
        .map(String::from)
        .to_vec();
    cfg.nic.rx_buffer = pgline_controlplane::config::ByteSize(16 * 1024);
    cfg.nic.tx_buffer = pgline_controlplane::config::ByteSize(16 * 1024);
    cfg.nic.owned_tcp = owned_tcp;
    if let Some(n) = idle_connections() {
        cfg.resp.max_connections = cfg.resp.max_connections.max(n + connections() + 64);
    }
    let p = lab::start(cfg).await;
    eprintln!(
        "[{port}] pgline ({cores} cores) serving after {:?}",
        t0.elapsed()
    );

    let app = net.app_ip.to_string();
    let t = Instant::now();
    let out = blocking(&net, &["ping", "-c", "3", "-i", "0.2", "-W", "2", &app]).await;
    assert!(out.contains(" 0% packet loss"), "[{port}] ping: {out}");
    eprintln!("[{port}] ping ok in {:?}", t.elapsed());

    check_redis_cli(&net, &app, &rows, port).await;
    if let Some(n) = idle_connections() {
        idle_memory(&net, &app, n, port).await;
    }
    if load {
        check_many_clients(&p, &net, &app, &rows, port).await;
        let stats = p.nic_ports();
        let s = stats
            .iter()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("[{port}] no device counters: {stats:?}"));
        // Every request and answer crossed the port; /metrics exports these counters.
        let want = (connections() * REQUESTS) as u64;
        assert!(s.ipackets >= want && s.opackets >= want, "[{port}] {s:?}");
    }

    let total = |f: fn(&CoreStats) -> &AtomicU64| p.shared.total(f);
    let accepted = total(|s| &s.connections_accepted);
    let want = if load { connections() as u64 + 3 } else { 3 };
    assert!(accepted >= want, "[{port}] {accepted} connections accepted");
    assert_eq!(total(|s| &s.protocol_errors), 0, "[{port}] protocol errors");
    assert!(total(|s| &s.keys_hit) > 0 && total(|s| &s.keys_miss) > 0);
    let per_core: Vec<u64> = p
        .shared
        .all_stats()
        .iter()
        .map(|s| {
            s.connections_accepted
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .collect();
    eprintln!("[{port}] connections accepted per core: {per_core:?}");
    if load {
        // Every queue pair got flows (the device spreads them: RSS, or af_packet's fanout).
        assert!(per_core.iter().all(|&n| n > 0), "[{port}] {per_core:?}");
    }
    p.shutdown().await;
    drop(net);
    eprintln!("[{port}] done in {:?}", t0.elapsed());
}

/// 1,000 concurrent kernel-TCP clients in the namespace, 100 requests each (`dpdk_client.py`),
/// every answer compared with the origin's rows.
async fn check_many_clients(
    p: &Pgline,
    net: &Netns,
    app: &str,
    rows: &BTreeMap<i64, String>,
    port: &str,
) {
    let tag = net.ns.rsplit('-').next().unwrap_or("x");
    let rows_file =
        std::env::temp_dir().join(format!("pgline-dpdk-rows-{}-{tag}", std::process::id()));
    let text: String = rows.iter().map(|(id, j)| format!("{id}\t{j}\n")).collect();
    std::fs::write(&rows_file, text).expect("rows file");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dpdk_client.py");
    let t = Instant::now();
    let out = try_blocking(
        net,
        &[
            "python3",
            script,
            app,
            &RESP_PORT.to_string(),
            &connections().to_string(),
            &REQUESTS.to_string(),
            rows_file.to_str().expect("utf-8 temp path"),
            "240",
        ],
    )
    .await;
    let _ = std::fs::remove_file(&rows_file);
    print_device_stats(p, port);
    let out = out.unwrap_or_else(|e| panic!("[{port}] clients: {e}"));
    let n = connections();
    let want = format!("ok connections={n} requests={}", n * REQUESTS);
    assert!(out.contains(&want), "[{port}] clients: {out}");
    eprintln!(
        "[{port}] {n} connections x {REQUESTS} requests in {:?}: {}",
        t.elapsed(),
        out.trim()
    );
}

/// `PGLINE_E2E_IDLE_CONNECTIONS=N`: measure the server's resident memory per idle connection
/// with N connections (issue 16's "memory per idle established connection"). Off by default:
/// a figure for `docs/benchmarks.md`, not a check (this process's RSS moves with the WAL and the
/// runtime too).
fn idle_connections() -> Option<usize> {
    std::env::var("PGLINE_E2E_IDLE_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// This process's resident set in KiB (the server: its clients are the kernel's TCP in the
/// namespace and a Python process).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Opens `n` idle connections from the namespace (one PING each), waits until the server has
/// taken back every idle session's buffers (after 1 s without input), and prints what the
/// process's resident set grew by, per connection. Before the load run, so that the heap has not
/// been warmed by other connections.
async fn idle_memory(net: &Netns, app: &str, n: usize, port: &str) {
    use std::io::{BufRead, BufReader};
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dpdk_idle.py");
    let before = rss_kib();
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &net.ns, "python3", script, app])
        .arg(RESP_PORT.to_string())
        .arg(n.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("idle clients");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        line
    })
    .await
    .expect("reader");
    assert_eq!(line.trim(), format!("open {n}"), "[{port}] idle clients");
    let opened = rss_kib();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let idle = rss_kib();
    drop(child.stdin.take());
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    let per = |kib: u64| kib.saturating_sub(before) as f64 * 1024.0 / n as f64;
    eprintln!(
        "[{port}] {n} idle connections: RSS {before} KiB before, {opened} KiB once open \
         ({:.0} bytes/conn), {idle} KiB after 2.5 s idle ({:.0} bytes/conn)",
        per(opened),
        per(idle)
    );
}

/// `id -> row_to_json(t)::text` for every origin row.
async fn origin_rows(origin: &tokio_postgres::Client) -> BTreeMap<i64, String> {
    origin
        .query("SELECT id, row_to_json(t)::text FROM t", &[])
        .await
        .expect("origin rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// `redis-cli GET` and `MGET` from the namespace: raw output (one bulk per line, nil as an empty
/// line) compared with the origin's rows.
async fn check_redis_cli(net: &Netns, app: &str, rows: &BTreeMap<i64, String>, port: &str) {
    let port_s = RESP_PORT.to_string();
    let cli = |args: &[&str]| {
        let mut v = vec!["redis-cli", "-h", app, "-p", port_s.as_str()];
        v.extend_from_slice(args);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let t = Instant::now();
    // The first GET is a miss filled from the origin, the second a hit from the store.
    for _ in 0..2 {
        let out = blocking_owned(net, cli(&["GET", "t:1"])).await;
        assert_eq!(out, format!("{}\n", rows[&1]), "[{port}] redis-cli GET t:1");
    }
    let out = blocking_owned(
        net,
        cli(&["MGET", "t:1", "t:2", "t:3", "t:100000", "t:500"]),
    )
    .await;
    let want = format!(
        "{}\n{}\n{}\n\n{}\n",
        rows[&1], rows[&2], rows[&3], rows[&500]
    );
    assert_eq!(out, want, "[{port}] redis-cli MGET");
    eprintln!("[{port}] redis-cli GET/MGET ok in {:?}", t.elapsed());
}

/// The DPDK port's device counters as `/metrics` exports them.
fn print_device_stats(p: &Pgline, port: &str) {
    for s in p.nic_ports() {
        let name = &s.port;
        eprintln!(
            "[{port}] device {name}: ipackets={} opackets={} imissed={} ierrors={} oerrors={} \
             rx_nombuf={}",
            s.ipackets, s.opackets, s.imissed, s.ierrors, s.oerrors, s.rx_nombuf
        );
    }
}

/// Runs `args` inside the namespace on a blocking thread; its stdout (panics on failure).
async fn blocking(net: &Netns, args: &[&str]) -> String {
    blocking_owned(net, args.iter().map(|s| s.to_string()).collect()).await
}

async fn blocking_owned(net: &Netns, args: Vec<String>) -> String {
    try_blocking_owned(net, args)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`blocking`], with the command's failure as an error.
async fn try_blocking(net: &Netns, args: &[&str]) -> Result<String, String> {
    try_blocking_owned(net, args.iter().map(|s| s.to_string()).collect()).await
}

async fn try_blocking_owned(net: &Netns, args: Vec<String>) -> Result<String, String> {
    let ns = net.ns.clone();
    tokio::time::timeout(
        Duration::from_secs(300),
        tokio::task::spawn_blocking(move || {
            let mut full = vec!["ip", "netns", "exec", ns.as_str()];
            full.extend(args.iter().map(String::as_str));
            netns::run(&full)
        }),
    )
    .await
    .expect("command timed out")
    .expect("command thread")
    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}
