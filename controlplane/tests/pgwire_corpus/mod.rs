//! The pgwire differential suite's harness: the corpus (`corpus.sql`, `schema.sql` beside this
//! file) and three clients that run it in lockstep against two endpoints, the origin and pgline,
//! over the SAME database: each read runs on both and the answers are compared; each write runs
//! once for real through pgline, and on the origin inside a transaction that is rolled back, to
//! learn what pgline should have answered. The reads right after a write are then compared on
//! both paths, so a stale cached answer shows as a difference.
//!
//! Each client keeps one session per side for the whole corpus (pgline promises read-your-writes
//! within a session, not across sessions), and runs every read twice through pgline: the first
//! may be a cache miss, the second then a hit.
//!
//! Clients: `psql` (one `-X -A` process per side fed on stdin, verbose errors, stdout and stderr
//! compared), tokio-postgres (the simple protocol with text results, then the extended protocol:
//! prepared statement, text-format parameters, binary results compared byte for byte, column
//! descriptions, SQLSTATE and error fields, CommandComplete row counts) and psycopg 3
//! (`deploy/lab/pgwire_diff.py`: raw RowDescription fields, value bytes and CommandComplete tags
//! with text and binary cursors, in a venv made by `deploy/lab/pgwire_venv.sh`).
//!
//! A difference is reported as `[client] corpus.sql:LINE: statement`, then what the origin
//! answered and what pgline answered. Transaction blocks in the corpus are read-only (a write
//! inside one could not be rolled back on the origin side alone); their control statements run
//! once per side and client.

use std::path::PathBuf;
use std::process::Command;

use futures_util::TryStreamExt;
use tokio_postgres::types::{to_sql_checked, Format, FromSql, IsNull, ToSql, Type};

/// One corpus statement.
#[derive(Debug, Clone)]
pub struct Stmt {
    /// 1-based line in `corpus.sql`.
    pub line: usize,
    pub sql: String,
    pub params: Vec<Option<String>>,
    pub write: bool,
    /// Transaction control (BEGIN, COMMIT, SAVEPOINT, ...): runs once on each side, compared,
    /// never repeated. Writes inside a transaction block are refused by the parser (the origin
    /// side could not roll them back alone).
    pub control: bool,
    /// Inside a transaction block: not repeated (an error would abort the block on one side).
    pub in_block: bool,
}

impl Stmt {
    /// The statement with `$n` replaced by quoted literals (for psql, which cannot bind).
    pub fn inlined(&self) -> String {
        let mut out = self.sql.clone();
        for (i, p) in self.params.iter().enumerate().rev() {
            let lit = match p {
                Some(v) => format!("'{}'", v.replace('\'', "''")),
                None => "NULL".to_string(),
            };
            out = out.replace(&format!("${}", i + 1), &lit);
        }
        out
    }

    /// The statement without its trailing `;` (one statement per extended-protocol Parse).
    pub fn bare(&self) -> &str {
        self.sql.trim_end().trim_end_matches(';')
    }
}

pub fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pgwire_corpus")
}

pub fn schema_sql() -> String {
    std::fs::read_to_string(corpus_dir().join("schema.sql")).expect("schema.sql")
}

/// Parses `corpus.sql` (format in its header).
pub fn load() -> Vec<Stmt> {
    let text = std::fs::read_to_string(corpus_dir().join("corpus.sql")).expect("corpus.sql");
    parse(&text)
}

pub fn parse(text: &str) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut in_block = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with("--") {
            continue;
        }
        let (sql, params) = match line.rsplit_once("--@params") {
            Some((sql, json)) => {
                let params: Vec<Option<String>> =
                    serde_json::from_str(json.trim()).expect("params are a JSON array");
                (sql.trim().to_string(), params)
            }
            None => (line.to_string(), Vec::new()),
        };
        let head = sql
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let write = matches!(head.as_str(), "INSERT" | "UPDATE" | "DELETE");
        let control = matches!(
            head.trim_end_matches(';'),
            "BEGIN" | "START" | "COMMIT" | "END" | "ROLLBACK" | "ABORT" | "SAVEPOINT" | "RELEASE"
        );
        if control {
            let rest = sql.to_ascii_uppercase();
            let to_savepoint = rest.starts_with("ROLLBACK TO");
            match head.trim_end_matches(';') {
                "BEGIN" | "START" => in_block = true,
                "COMMIT" | "END" | "ABORT" => in_block = false,
                "ROLLBACK" if !to_savepoint => in_block = false,
                _ => {}
            }
        }
        assert!(
            !(write && in_block),
            "corpus line {}: a write inside a transaction block",
            i + 1
        );
        out.push(Stmt {
            line: i + 1,
            sql,
            params,
            write,
            control,
            in_block,
        });
    }
    out
}

/// Where a client connects.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub db: String,
}

impl Endpoint {
    pub fn conn_string(&self) -> String {
        format!(
            "host={} port={} user={} password={} dbname={}",
            self.host, self.port, self.user, self.password, self.db
        )
    }
}

/// One difference: which client, which statement, what the origin said and what pgline said.
#[derive(Debug, Clone)]
pub struct Diff {
    pub client: String,
    pub line: usize,
    pub sql: String,
    pub expected: String,
    pub got: String,
}

impl std::fmt::Display for Diff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{}] corpus.sql:{}: {}\n  expected (origin): {}\n  got (pgline):      {}",
            self.client, self.line, self.sql, self.expected, self.got
        )
    }
}

fn diff(client: &str, s: &Stmt, expected: String, got: String) -> Option<Diff> {
    (expected != got).then(|| Diff {
        client: client.to_string(),
        line: s.line,
        sql: s.sql.clone(),
        expected,
        got,
    })
}

// ---------------------------------------------------------------------------------------- psql

/// One psql process (one session) fed statements on stdin; after each, `\echo` and `\warn` print
/// a marker on stdout and stderr, so each statement's output is read up to its markers.
pub struct PsqlSession {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: std::sync::mpsc::Receiver<String>,
    err: std::sync::mpsc::Receiver<String>,
    seq: u64,
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

impl PsqlSession {
    pub fn start(ep: &Endpoint) -> PsqlSession {
        use std::process::Stdio;
        let mut child = Command::new("psql")
            .env("PGPASSWORD", &ep.password)
            .env("PGCONNECT_TIMEOUT", "10")
            .args(["-X", "-A", "-v", "VERBOSITY=verbose", "-h", &ep.host])
            .args(["-p", &ep.port.to_string(), "-U", &ep.user, "-d", &ep.db])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("psql starts");
        let stdin = child.stdin.take().expect("stdin");
        let out = lines_of(child.stdout.take().expect("stdout"));
        let err = lines_of(child.stderr.take().expect("stderr"));
        PsqlSession {
            child,
            stdin,
            out,
            err,
            seq: 0,
        }
    }

    /// Runs `sql` (one line); its stdout and stderr.
    pub fn run(&mut self, sql: &str) -> (String, String) {
        use std::io::Write;
        self.seq += 1;
        let marker = format!("__pgdiff_{}__", self.seq);
        let input = format!("{sql}\n\\echo {marker}\n\\warn {marker}\n");
        self.stdin.write_all(input.as_bytes()).expect("psql stdin");
        self.stdin.flush().expect("psql stdin");
        let read = |rx: &std::sync::mpsc::Receiver<String>, what: &str| {
            let mut text = String::new();
            loop {
                match rx.recv_timeout(std::time::Duration::from_secs(60)) {
                    Ok(line) if line == marker => return text,
                    Ok(line) => {
                        text.push_str(&line);
                        text.push('\n');
                    }
                    Err(e) => panic!("psql {what} ended before {marker} ({e}): {text}"),
                }
            }
        };
        (read(&self.out, "stdout"), read(&self.err, "stderr"))
    }

    /// psql's output for `sql` as one comparable text; with `rollback` inside BEGIN ... ROLLBACK.
    pub fn outcome(&mut self, sql: &str, rollback: bool) -> String {
        if rollback {
            self.run("BEGIN;");
        }
        let (out, err) = self.run(sql);
        if rollback {
            self.run("ROLLBACK;");
        }
        format!("stdout {out:?} | stderr {err:?}")
    }
}

impl Drop for PsqlSession {
    fn drop(&mut self) {
        use std::io::Write;
        let _ = self.stdin.write_all(b"\\q\n");
        let _ = self.child.wait();
    }
}

/// Runs the corpus with psql in lockstep (one psql session per side); reads run twice through
/// pgline (a cache miss, then likely a hit), both compared.
pub fn diff_psql(origin: &Endpoint, pgline: &Endpoint, corpus: &[Stmt]) -> Vec<Diff> {
    let mut o = PsqlSession::start(origin);
    let mut p = PsqlSession::start(pgline);
    let mut diffs = Vec::new();
    for s in corpus {
        let sql = s.inlined();
        let expected = o.outcome(&sql, s.write);
        let got = p.outcome(&sql, false);
        diffs.extend(diff("psql", s, expected.clone(), got));
        if !s.write && !s.control && !s.in_block {
            let again = p.outcome(&sql, false);
            diffs.extend(diff("psql-repeat", s, expected, again));
        }
    }
    diffs
}

// ------------------------------------------------------------------------------ tokio-postgres

/// A parameter sent in text format, whatever its type (the server parses it).
#[derive(Debug)]
struct TextParam(Option<String>);

impl ToSql for TextParam {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.0 {
            Some(v) => {
                out.extend_from_slice(v.as_bytes());
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

/// A result value as the raw bytes the server sent, hex-encoded (`NULL` for SQL NULL).
struct RawValue(String);

impl<'a> FromSql<'a> for RawValue {
    fn from_sql(
        _ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(RawValue(format!("\\x{hex}")))
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(RawValue("NULL".into()))
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }
}

fn describe_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "ERROR {} {} {:?} detail={:?} hint={:?} position={:?} where={:?}",
            db.code().code(),
            db.severity(),
            db.message(),
            db.detail(),
            db.hint(),
            db.position(),
            db.where_()
        ),
        None => format!("client error: {e}"),
    }
}

/// The outcome of one statement, prepared and executed with text parameters, as text.
async fn run_tokio_once(client: &tokio_postgres::Client, s: &Stmt) -> String {
    let stmt = match client.prepare(s.bare()).await {
        Ok(st) => st,
        Err(e) => return format!("prepare: {}", describe_error(&e)),
    };
    let cols: Vec<String> = stmt
        .columns()
        .iter()
        .map(|c| {
            format!(
                "{}:{}/{}@{:?}.{:?}",
                c.name(),
                c.type_().oid(),
                c.type_modifier(),
                c.table_oid(),
                c.column_id()
            )
        })
        .collect();
    let params: Vec<String> = stmt.params().iter().map(|t| t.oid().to_string()).collect();
    let args = s.params.iter().map(|p| TextParam(p.clone()));
    let stream = match client.query_raw(&stmt, args).await {
        Ok(st) => st,
        Err(e) => return format!("execute: {}", describe_error(&e)),
    };
    futures_util::pin_mut!(stream);
    let mut rows = Vec::new();
    loop {
        match stream.try_next().await {
            Ok(Some(row)) => {
                let vals: Vec<String> = (0..row.len())
                    .map(|i| match row.try_get::<_, RawValue>(i) {
                        Ok(v) => v.0,
                        Err(e) => format!("<{e}>"),
                    })
                    .collect();
                rows.push(vals.join(","));
            }
            Ok(None) => break,
            Err(e) => return format!("rows {rows:?} then: {}", describe_error(&e)),
        }
    }
    format!(
        "params {params:?} columns {cols:?} rows {rows:?} affected {:?}",
        stream.rows_affected()
    )
}

async fn run_tokio(client: &tokio_postgres::Client, s: &Stmt, rollback: bool) -> String {
    if !rollback {
        return run_tokio_once(client, s).await;
    }
    if let Err(e) = client.batch_execute("BEGIN").await {
        return format!("BEGIN failed: {e}");
    }
    let out = run_tokio_once(client, s).await;
    if let Err(e) = client.batch_execute("ROLLBACK").await {
        return format!("{out}; ROLLBACK failed: {e}");
    }
    out
}

/// The outcome of `sql` over the simple query protocol (text results), as text.
async fn run_simple(client: &tokio_postgres::Client, sql: &str, rollback: bool) -> String {
    use tokio_postgres::SimpleQueryMessage as M;
    if rollback {
        if let Err(e) = client.batch_execute("BEGIN").await {
            return format!("BEGIN failed: {e}");
        }
    }
    let out = match client.simple_query(sql).await {
        Ok(msgs) => {
            let mut parts = Vec::new();
            for m in msgs {
                match m {
                    M::RowDescription(cols) => {
                        let names: Vec<&str> = cols.iter().map(|c| c.name()).collect();
                        parts.push(format!("columns {names:?}"));
                    }
                    M::Row(row) => {
                        let vals: Vec<Option<&str>> = (0..row.len()).map(|i| row.get(i)).collect();
                        parts.push(format!("{vals:?}"));
                    }
                    M::CommandComplete(n) => parts.push(format!("complete {n}")),
                    _ => parts.push("other".into()),
                }
            }
            parts.join(" | ")
        }
        Err(e) => describe_error(&e),
    };
    if rollback {
        if let Err(e) = client.batch_execute("ROLLBACK").await {
            return format!("{out}; ROLLBACK failed: {e}");
        }
    }
    out
}

pub async fn connect(ep: &Endpoint) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&ep.conn_string(), tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {}:{}: {e}", ep.host, ep.port));
    tokio::spawn(conn);
    client
}

/// Runs the corpus with tokio-postgres in lockstep (one session per side for the whole corpus):
/// each statement over the simple protocol (a write: for real through pgline), then prepared
/// (a read: twice through pgline; a write: on both sides in a rolled-back transaction).
pub async fn diff_tokio(origin: &Endpoint, pgline: &Endpoint, corpus: &[Stmt]) -> Vec<Diff> {
    let o = connect(origin).await;
    let p = connect(pgline).await;
    let mut diffs = Vec::new();
    for s in corpus {
        // Simple protocol, text results (statements with parameters get them inlined).
        let sql = s.inlined();
        let expected = run_simple(&o, &sql, s.write).await;
        let got = run_simple(&p, &sql, false).await;
        diffs.extend(diff("tokio-postgres-simple", s, expected, got));
        if s.control {
            continue;
        }
        if s.write {
            // The write is done: prepared, it runs again on both sides in a transaction that
            // is rolled back (through pgline: a pinned transaction).
            let expected = run_tokio(&o, s, true).await;
            let got = run_tokio(&p, s, true).await;
            diffs.extend(diff("tokio-postgres", s, expected, got));
            continue;
        }
        let expected = run_tokio(&o, s, false).await;
        let got = run_tokio(&p, s, false).await;
        diffs.extend(diff("tokio-postgres", s, expected.clone(), got));
        if !s.in_block {
            let again = run_tokio(&p, s, false).await;
            diffs.extend(diff("tokio-postgres-repeat", s, expected, again));
        }
    }
    diffs
}

// ------------------------------------------------------------------------------------- psycopg

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The venv's python with psycopg 3 (made on first use by `deploy/lab/pgwire_venv.sh`).
pub fn psycopg_python() -> String {
    let out = Command::new("bash")
        .arg(workspace_root().join("deploy/lab/pgwire_venv.sh"))
        .output()
        .expect("pgwire_venv.sh runs");
    assert!(
        out.status.success(),
        "making the psycopg venv failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `deploy/lab/pgwire_diff.py` (psycopg 3, text and binary cursors) in lockstep.
pub fn diff_psycopg(origin: &Endpoint, pgline: &Endpoint, corpus_file: &str) -> Vec<Diff> {
    let python = psycopg_python();
    let out = Command::new(python)
        .arg(workspace_root().join("deploy/lab/pgwire_diff.py"))
        .args([
            "--origin",
            &origin.conn_string(),
            "--pgline",
            &pgline.conn_string(),
        ])
        .args(["--corpus", corpus_file, "--json"])
        .output()
        .expect("pgwire_diff.py runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0) | Some(1)),
        "pgwire_diff.py failed: {stderr}"
    );
    let mut diffs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON diff line");
        let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        diffs.push(Diff {
            client: field("client"),
            line: v["line"].as_u64().unwrap_or(0) as usize,
            sql: field("sql"),
            expected: field("expected"),
            got: field("got"),
        });
    }
    assert_eq!(
        out.status.code() == Some(1),
        !diffs.is_empty(),
        "pgwire_diff.py exit status and its diff lines disagree: {stderr}"
    );
    diffs
}
