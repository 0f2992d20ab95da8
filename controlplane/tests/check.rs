//! `pgline check` against real PostgreSQL clusters: the lab origin (passes), a second cluster
//! started here with `wal_level=replica` (fails with the fix-it line), and nothing at all.

use std::path::PathBuf;
use std::process::Command;

use pgline_testkit::TestDb;

fn pgline(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pgline"))
        .args(args)
        .env_remove("PGLINE_CONFIG")
        // Once the [api] section exists, its default port may be taken by a test's pgline.
        .env("PGLINE_API_LISTEN", "127.0.0.1:0")
        .output()
        .expect("run pgline");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The line of check `name`, and the line after it.
fn line<'a>(out: &'a str, name: &str) -> (&'a str, &'a str) {
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.get(6..).is_some_and(|rest| rest.starts_with(name)))
        .unwrap_or_else(|| panic!("no check {name:?} in\n{out}"));
    (lines[i], lines.get(i + 1).copied().unwrap_or(""))
}

#[tokio::test]
async fn passes_against_the_test_origin_and_names_bad_tables() {
    let db = TestDb::create("check").await;
    let c = db.client().await;
    // Slot names are cluster-wide: named after the database, as a killed run's leftovers
    // (dropped with their database by the next TestDb) must not collide with this run's.
    let (pgo, td) = (format!("{}_pgo", db.name), format!("{}_td", db.name));
    // One statement each: a slot cannot be created in a transaction that wrote.
    for sql in [
        "CREATE TABLE users (id int PRIMARY KEY, name text)".to_string(),
        "CREATE TABLE nopk (id int, v text)".to_string(),
        format!("SELECT pg_create_logical_replication_slot('{pgo}', 'pgoutput')"),
        format!("SELECT pg_create_logical_replication_slot('{td}', 'test_decoding')"),
    ] {
        c.batch_execute(&sql).await.expect(&sql);
    }
    let (pgo_slot, td_slot) = (
        format!("replication.slot=\"{pgo}\""),
        format!("replication.slot=\"{td}\""),
    );
    let origin = db.conn_string();
    let base = [
        "check",
        "--origin",
        &origin,
        "--listen",
        "127.0.0.1:0",
        "--set",
        "replication.publication=\"chk_pub\"",
    ];

    let mut args = base.to_vec();
    args.extend(["--set", "catalog.tables=[\"users\"]", "--set", &pgo_slot]);
    let (code, out, err) = pgline(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    // A verdict starts its line ("FAILOVER" in a fix line is not one).
    assert!(!out.lines().any(|l| l.starts_with("FAIL")), "{out}");
    for name in [
        "origin reachable",
        "wal_level",
        "replication privilege",
        "table users",
    ] {
        assert!(line(&out, name).0.starts_with("PASS"), "{name}:\n{out}");
    }
    assert!(line(&out, "slot").0.contains("exists (pgoutput"), "{out}");
    assert!(
        line(&out, "publication").0.contains("will create it"),
        "{out}"
    );
    assert!(out.contains("primary key (id)"), "{out}");

    // JSON for scripts: the same checks.
    args.push("--json");
    let (code, out, _) = pgline(&args);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["ok"], true);
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["check"] == "wal_level" && c["status"] == "PASS"));

    // A table without a primary key, a missing table, a slot of the wrong plugin.
    let mut args = base.to_vec();
    args.extend([
        "--set",
        "catalog.tables=[\"users\", \"nopk\", \"missing\"]",
        "--set",
        &td_slot,
    ]);
    let (code, out, _) = pgline(&args);
    assert_eq!(code, 1, "{out}");
    let (l, fix) = line(&out, "table nopk");
    assert!(
        l.starts_with("FAIL") && l.contains("no primary key"),
        "{out}"
    );
    assert!(
        fix.contains("fix: ALTER TABLE nopk ADD PRIMARY KEY"),
        "{out}"
    );
    let (l, fix) = line(&out, "table missing");
    assert!(
        l.starts_with("FAIL") && l.contains("does not exist"),
        "{out}"
    );
    assert!(
        fix.contains("remove \"missing\" from catalog.tables"),
        "{out}"
    );
    let (l, fix) = line(&out, "slot");
    assert!(
        l.starts_with("FAIL") && l.contains("test_decoding"),
        "{out}"
    );
    assert!(
        fix.contains(&format!("pg_drop_replication_slot('{td}')")),
        "{out}"
    );
    assert!(line(&out, "table users").0.starts_with("PASS"), "{out}");

    // Custom settings that a policy reads and a function sets: named until followed.
    assert!(line(&out, "custom settings").0.starts_with("PASS"), "{out}");
    c.batch_execute(
        "ALTER TABLE users ENABLE ROW LEVEL SECURITY; \
         CREATE POLICY by_tenant ON users USING (id = current_setting('App.Tenant', true)::int); \
         CREATE FUNCTION set_region(r text) RETURNS text LANGUAGE sql \
           AS $$ SELECT set_config('app.region', r, false) $$",
    )
    .await
    .unwrap();
    let mut args = base.to_vec();
    args.extend(["--set", "catalog.tables=[\"users\"]", "--set", &pgo_slot]);
    let (code, out, _) = pgline(&args);
    assert_eq!(code, 0, "{out}");
    let (l, fix) = line(&out, "custom settings");
    assert!(
        l.starts_with("WARN") && l.contains("app.region, app.tenant"),
        "{out}"
    );
    assert!(
        fix.contains(r#"pgwire.custom_settings=["app.region", "app.tenant"]"#),
        "{out}"
    );
    args.extend([
        "--set",
        r#"pgwire.custom_settings=["app.tenant", "app.region"]"#,
    ]);
    let (code, out, _) = pgline(&args);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "custom settings").0.starts_with("PASS"), "{out}");

    // A function that takes a session-level advisory lock is named; the transaction-level
    // lock is not.
    assert!(
        line(&out, "session state in functions")
            .0
            .starts_with("PASS"),
        "{out}"
    );
    c.batch_execute(
        "CREATE FUNCTION lock_tx(k int) RETURNS void LANGUAGE sql \
           AS $$ SELECT pg_advisory_xact_lock(k) $$; \
         CREATE FUNCTION lock_job(k int) RETURNS void LANGUAGE plpgsql \
           AS $$ BEGIN PERFORM pg_advisory_lock (k); END $$",
    )
    .await
    .unwrap();
    let (code, out, _) = pgline(&args);
    assert_eq!(code, 0, "{out}");
    let (l, fix) = line(&out, "session state in functions");
    assert!(
        l.starts_with("WARN") && l.contains("public.lock_job take") && !l.contains("lock_tx"),
        "{out}"
    );
    assert!(fix.contains("pg_advisory_xact_lock"), "{out}");
}

#[test]
fn unreachable_origin_fails_cleanly() {
    let (code, out, err) = pgline(&[
        "check",
        "--origin",
        "host=127.0.0.1 port=1 user=x dbname=x",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 1, "{out}\n{err}");
    let (l, fix) = line(&out, "origin reachable");
    assert!(l.starts_with("FAIL") && l.contains("refused"), "{out}");
    assert!(
        fix.trim_start().starts_with("fix: check origin.url"),
        "{out}"
    );
    assert!(line(&out, "wal_level").0.starts_with("SKIP"), "{out}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn a_busy_listen_address_fails_with_a_fix() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, out, _) = pgline(&[
        "check",
        "--origin",
        "host=127.0.0.1 port=1 user=x dbname=x",
        "--listen",
        &addr,
    ]);
    assert_eq!(code, 1);
    let (l, fix) = line(&out, "nic (kernel sockets)");
    assert!(l.starts_with("FAIL") && l.contains(&addr), "{out}");
    assert!(fix.contains("ss -ltnp"), "{out}");
    let (code, out, _) = pgline(&[
        "check",
        "--nic",
        "dpdk",
        "--origin",
        "host=127.0.0.1 port=1",
        "--set",
        "nic.ip=\"10.9.8.2\"",
        "--set",
        "nic.port=\"net_af_packet0\"",
        "--set",
        "nic.vdevs=[\"net_af_packet0,iface=pgline-no-such-if\"]",
    ]);
    assert_eq!(code, 1); // the origin still fails
    let (l, fix) = line(&out, "nic (dpdk)");
    assert!(l.starts_with("FAIL"), "{out}");
    if cfg!(feature = "dpdk") {
        assert!(
            l.contains("pgline-no-such-if") && fix.contains("ip -br link"),
            "{out}"
        );
    } else {
        assert!(fix.contains("--features dpdk"), "{out}");
    }
}

/// A throw-away PostgreSQL 15 cluster with `wal_level=replica`, stopped and removed on drop.
struct ReplicaCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

fn as_postgres(cmd: &std::path::Path, args: &[&str]) -> std::process::Output {
    let root = is_root();
    let mut c = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(cmd);
        c
    } else {
        Command::new(cmd)
    };
    c.args(args).output().expect("run a PostgreSQL tool")
}

/// Whether this process runs as root (from `id -u`, to stay free of `unsafe`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl ReplicaCluster {
    fn start() -> ReplicaCluster {
        let bin = PathBuf::from("/usr/lib/postgresql/15/bin");
        assert!(bin.join("initdb").exists(), "PostgreSQL 15 server binaries");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("pgline-check-replica-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the cluster directory");
        }
        let cluster = ReplicaCluster { dir, bin, port };
        let data = cluster.dir.join("data");
        let out = as_postgres(
            &cluster.bin.join("initdb"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let opts = format!(
            "-c wal_level=replica -c port={port} -c listen_addresses=127.0.0.1 \
             -c unix_socket_directories={}",
            cluster.dir.display()
        );
        let log = cluster.dir.join("log");
        let out = as_postgres(
            &cluster.bin.join("pg_ctl"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {} {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        cluster
    }
}

impl Drop for ReplicaCluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                data.to_str().unwrap_or(""),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn wal_level_replica_fails_with_the_fix_it_line() {
    let cluster = ReplicaCluster::start();
    let origin = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        cluster.port
    );
    let (code, out, err) = pgline(&["check", "--origin", &origin, "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        line(&out, "origin reachable").0.starts_with("PASS"),
        "{out}"
    );
    let (l, fix) = line(&out, "wal_level");
    assert!(l.starts_with("FAIL") && l.contains("replica"), "{out}");
    assert_eq!(
        fix.trim(),
        "fix: set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) \
         and restart PostgreSQL",
        "{out}"
    );
    drop(cluster);
}
