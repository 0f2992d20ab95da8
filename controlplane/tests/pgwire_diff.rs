//! The pgwire differential suite (issue 4): the corpus in `tests/pgwire_corpus/corpus.sql` run by
//! psql, tokio-postgres (prepared) and psycopg 3 straight at the origin and through pgline's
//! PostgreSQL port, in lockstep over the same database (see `pgwire_corpus/mod.rs`). Every
//! result, error and CommandComplete tag must be identical: 0 differences.
//!
//! `corpus_self_check` runs the same harness origin against origin (0 differences expected, so
//! the corpus itself is deterministic), then against a database whose data differs in one row
//! (differences expected exactly there, so the comparison can fail).
//!
//! Run: `cargo test -p pgline-controlplane --test suite -- --nocapture pgwire_diff::` (the lab origin up:
//! `deploy/lab/pg.sh start`; psycopg is installed on first use into `target/pgwire-venv`).

use crate::pgwire_corpus;

use pgline_testkit::{lab, origin};
use pgwire_corpus::{Diff, Endpoint, Stmt};

fn origin_endpoint(db: &origin::TestDb) -> Endpoint {
    let (host, port, user, password) = origin::origin_base();
    Endpoint {
        host,
        port,
        user,
        password,
        db: db.name.clone(),
    }
}

async fn create_db(tag: &str) -> origin::TestDb {
    let db = origin::TestDb::create(tag).await;
    db.client()
        .await
        .batch_execute(&pgwire_corpus::schema_sql())
        .await
        .expect("schema.sql loads");
    db
}

/// All three clients in lockstep; every difference found.
async fn run_all(origin: &Endpoint, pgline: &Endpoint, corpus: &[Stmt], file: &str) -> Vec<Diff> {
    let mut diffs = pgwire_corpus::diff_tokio(origin, pgline, corpus).await;
    let (o, p, c) = (origin.clone(), pgline.clone(), corpus.to_vec());
    diffs.extend(
        tokio::task::spawn_blocking(move || pgwire_corpus::diff_psql(&o, &p, &c))
            .await
            .expect("psql runner"),
    );
    let (o, p, f) = (origin.clone(), pgline.clone(), file.to_string());
    diffs.extend(
        tokio::task::spawn_blocking(move || pgwire_corpus::diff_psycopg(&o, &p, &f))
            .await
            .expect("psycopg runner"),
    );
    diffs
}

fn report(diffs: &[Diff]) -> String {
    let mut s = format!("{} differences\n", diffs.len());
    for d in diffs {
        s.push_str(&format!("{d}\n"));
    }
    s
}

fn corpus_file() -> String {
    pgwire_corpus::corpus_dir()
        .join("corpus.sql")
        .to_string_lossy()
        .into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_self_check() {
    let corpus = pgwire_corpus::load();
    assert!(
        corpus.len() >= 200,
        "corpus has {} statements",
        corpus.len()
    );
    assert!(corpus.iter().any(|s| s.write) && corpus.iter().any(|s| !s.params.is_empty()));

    let db = create_db("pgdiff_self").await;
    let origin = origin_endpoint(&db);
    let diffs = run_all(&origin, &origin, &corpus, &corpus_file()).await;
    assert!(diffs.is_empty(), "origin vs origin: {}", report(&diffs));

    // A second database with one changed row: among the statements before the first write,
    // the reads of user 3's name must differ, for every client.
    let other = create_db("pgdiff_mut").await;
    other
        .client()
        .await
        .batch_execute("UPDATE users SET name = 'changed' WHERE id = 3")
        .await
        .expect("mutate");
    let reads: Vec<Stmt> = corpus.iter().take_while(|s| !s.write).cloned().collect();
    let dir = std::env::temp_dir().join(format!("pgdiff_reads_{}.sql", std::process::id()));
    let text: String = reads
        .iter()
        .map(|s| match s.params.is_empty() {
            true => format!("{}\n", s.sql),
            false => format!(
                "{} --@params {}\n",
                s.sql,
                serde_json::to_string(&s.params).expect("json")
            ),
        })
        .collect();
    std::fs::write(&dir, text).expect("write reads corpus");
    let diffs = run_all(
        &origin,
        &origin_endpoint(&other),
        &reads,
        &dir.to_string_lossy(),
    )
    .await;
    let _ = std::fs::remove_file(&dir);
    let clients = [
        "psql",
        "psql-repeat",
        "tokio-postgres",
        "tokio-postgres-repeat",
        "tokio-postgres-simple",
        "psycopg-text",
        "psycopg-binary",
        "psycopg-text-repeat",
    ];
    for client in clients {
        assert!(
            diffs
                .iter()
                .any(|d| d.client == client && d.sql.contains("id = 3")),
            "{client} did not see the changed row: {}",
            report(&diffs)
        );
    }
    // Those differences are the changed name (the other database also has other OIDs, so
    // statements naming its tables or types differ too: no "only those" check here).
    for d in diffs
        .iter()
        .filter(|d| d.sql.contains("SELECT name, email FROM users WHERE id = 3"))
    {
        assert!(
            d.got.contains("changed") || d.got.contains("6368616e676564"),
            "unexpected difference: {d}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_through_pgline_matches_the_origin() {
    let db = create_db("pgdiff").await;
    let p = lab::start(lab::config(&db, 2)).await;
    let addr = p.pg_addr().expect("the PostgreSQL front is on");
    let origin = origin_endpoint(&db);
    let pgline = Endpoint {
        host: addr.ip().to_string(),
        port: addr.port(),
        ..origin.clone()
    };
    let corpus = pgwire_corpus::load();
    let hits = p.shared.total(|s| &s.keys_hit);
    let diffs = run_all(&origin, &pgline, &corpus, &corpus_file()).await;
    assert!(diffs.is_empty(), "origin vs pgline: {}", report(&diffs));
    // Every read runs twice through pgline (a miss, then a hit where it can be cached): the
    // suite must have compared answers served from the store, not only passed-through ones.
    let hits = p.shared.total(|s| &s.keys_hit) - hits;
    eprintln!(
        "{} statements, 0 differences; {hits} answers from cache",
        corpus.len()
    );
    assert!(hits >= 50, "only {hits} answers came from cache");
}
