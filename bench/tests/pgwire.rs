//! The PostgreSQL-front pieces of `pgline-bench` against the real lab PostgreSQL
//! (127.0.0.1:54329): `load --schema saas` (sizes, determinism, every page query's result),
//! `run --op dashboard`, `--pg` (load connections to another address than `--origin`, said in
//! the row) and the `--pg-query` forms. Through pgline itself: `bench/pgwire.sh --smoke`.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_pgline-bench");
const PG: &str = "host=127.0.0.1 port=54329 user=postgres password=pgline";

struct Db(String);

impl Db {
    fn new(tag: &str) -> Db {
        let name = format!("pgline_bench_pgw_{tag}_{}", std::process::id());
        psql("postgres", &format!("DROP DATABASE IF EXISTS {name}"));
        Db(name)
    }
    fn origin(&self) -> String {
        format!("{PG} dbname={}", self.0)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        psql(
            "postgres",
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0),
        );
    }
}

/// Runs `sql` on `db` and returns the rows as text.
fn psql(db: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) =
            tokio_postgres::connect(&format!("{PG} dbname={db}"), tokio_postgres::NoTls)
                .await
                .expect("lab PostgreSQL on 127.0.0.1:54329 (deploy/lab/pg.sh start)");
        tokio::spawn(conn);
        let mut out = Vec::new();
        for m in c.simple_query(sql).await.unwrap() {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                out.push((0..r.len()).map(|i| r.get(i).map(String::from)).collect());
            }
        }
        out
    })
}

fn bench(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
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

/// A digest of every table's content.
fn digest(db: &str) -> String {
    let sql = "SELECT string_agg(x, ',' ORDER BY x) FROM (
        SELECT 'tenants' || md5(string_agg(t::text, '|' ORDER BY id)) x FROM tenants t UNION ALL
        SELECT 'users' || md5(string_agg(t::text, '|' ORDER BY id)) FROM users t UNION ALL
        SELECT 'projects' || md5(string_agg(t::text, '|' ORDER BY id)) FROM projects t UNION ALL
        SELECT 'tasks' || md5(string_agg(t::text, '|' ORDER BY id)) FROM tasks t UNION ALL
        SELECT 'comments' || md5(string_agg(t::text, '|' ORDER BY id)) FROM comments t) s";
    psql(db, sql)[0][0].clone().unwrap()
}

#[test]
fn saas_schema_is_deterministic_and_every_page_query_answers() {
    let db = Db::new("saas");
    let origin = db.origin();
    let load = |force: bool| {
        let mut a = vec![
            "load",
            "--schema",
            "saas",
            "--origin",
            &origin,
            "--tenants",
            "5",
            "--tasks",
            "1000",
        ];
        if force {
            a.push("--force");
        }
        json(&bench(&a))
    };
    let first = load(false);
    assert_eq!(first["created"], true);
    assert_eq!(
        first["rows"],
        serde_json::json!([
            ["tenants", 5],
            ["users", 250],
            ["projects", 100],
            ["tasks", 1000],
            ["comments", 2000]
        ])
    );
    let d1 = digest(&db.0);
    assert_eq!(load(false)["created"], false, "same sizes: kept");
    assert_eq!(load(true)["created"], true);
    assert_eq!(digest(&db.0), d1, "a reload holds the same bytes");

    // Every row is in its tenant; children point into the same tenant.
    let cross = psql(
        &db.0,
        "SELECT (SELECT count(*) FROM tasks k JOIN projects p ON p.id = k.project_id
                  JOIN users u ON u.id = k.assignee_id
                  WHERE p.tenant_id <> k.tenant_id OR u.tenant_id <> k.tenant_id)
              + (SELECT count(*) FROM comments c JOIN tasks k ON k.id = c.task_id
                  JOIN users u ON u.id = c.author_id
                  WHERE k.tenant_id <> c.tenant_id OR u.tenant_id <> c.tenant_id)",
    );
    assert_eq!(cross[0][0].as_deref(), Some("0"));
    // A tenant has open work to show on its dashboard.
    let page_rows = psql(
        &db.0,
        "SELECT (SELECT count(*) FROM tasks WHERE tenant_id = 3 AND status <> 'done'),
                (SELECT count(*) FROM tasks WHERE tenant_id = 3)",
    );
    let open: i64 = page_rows[0][0].as_deref().unwrap().parse().unwrap();
    assert!(open > 0 && open < 200, "open tasks of tenant 3: {open}");
}

#[test]
fn dashboard_pages_and_point_lookup_forms_against_a_named_pg_address() {
    let db = Db::new("dash");
    let origin = db.origin();
    json(&bench(&[
        "load",
        "--schema",
        "saas",
        "--origin",
        &origin,
        "--tenants",
        "4",
        "--tasks",
        "400",
    ]));
    json(&bench(&["load", "--origin", &origin, "--keyspace", "500"]));
    // The same server under another spelling: the row names the --pg address, not --origin's.
    let pg = format!("postgresql://postgres:pgline@localhost:54329/{}", db.0);
    let page = json(&bench(&[
        "run",
        "--origin",
        &origin,
        "--pg",
        &pg,
        "--target",
        "pg-prepared",
        "--op",
        "dashboard",
        "--keyspace",
        "4",
        "--keys",
        "zipf",
        "--clients",
        "2",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--label",
        "dash origin",
    ]));
    assert_eq!(page["op"], "dashboard");
    assert_eq!(page["pg"], "localhost:54329", "{page}");
    assert_eq!(page["label"], "dash origin");
    assert!(page["pg_query"].is_null());
    assert_eq!(page["errors"], 0, "{page}");
    assert!(page["requests"].as_u64().unwrap() > 0, "{page}");
    assert_eq!(page["hits"], page["requests"]);

    for form in ["json", "columns", "star"] {
        for target in ["pg-prepared", "pg-simple"] {
            let r = json(&bench(&[
                "run",
                "--origin",
                &origin,
                "--target",
                target,
                "--pg-query",
                form,
                "--keyspace",
                "500",
                "--clients",
                "1",
                "--duration",
                "300ms",
                "--warmup",
                "0",
            ]));
            assert_eq!(r["pg_query"], form);
            assert_eq!(r["pg"], "127.0.0.1:54329");
            assert_eq!(r["errors"], 0, "{form} {target}: {r}");
            assert!(r["requests"].as_u64().unwrap() > 0, "{form} {target}: {r}");
            assert_eq!(r["misses"], 0, "{form} {target}: every id exists");
        }
    }

    // A --pg that refuses connections fails the run (the origin alone is not used instead).
    let bad = bench(&[
        "run",
        "--origin",
        &origin,
        "--pg",
        "host=127.0.0.1 port=1 user=postgres",
        "--target",
        "pg-prepared",
        "--keyspace",
        "500",
        "--clients",
        "1",
        "--duration",
        "200ms",
    ]);
    assert!(!bad.status.success());
    // Dashboard pages need the prepared target.
    let bad = bench(&[
        "run",
        "--origin",
        &origin,
        "--target",
        "pg-simple",
        "--op",
        "dashboard",
        "--keyspace",
        "4",
        "--duration",
        "200ms",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("dashboard"));
}
