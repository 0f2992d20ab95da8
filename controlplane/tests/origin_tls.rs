//! TLS to the origin against a real PostgreSQL 15 that accepts only TLS
//! (`deploy/lab/pg-tls.sh`, 127.0.0.1:54331, started here if needed), plus in-process fake
//! origins for what no real server here does (an expired certificate).
//!
//! Each mode boots a real pgline and checks that the fill, the replication stream and the
//! relay work, and that every one of pgline's origin connections is encrypted
//! (`pg_stat_ssl`). The failures check that each cause is named.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pgline_controlplane::config::Config;
use pgline_controlplane::origin::{self, Credentials, Settings};
use pgline_controlplane::server::Pgline;
use pgline_controlplane::wal::ReplicationConn;
use pgline_testkit::{lab, origin::run_cleanup, pki};
use redis::AsyncCommands;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PORT: u16 = 54331;

/// Starts the TLS lab origin (idempotent) and returns its PKI directory.
fn lab_pki() -> PathBuf {
    static START: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    START
        .get_or_init(|| {
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/lab/pg-tls.sh");
            let out = std::process::Command::new(&script)
                .arg("start")
                .output()
                .expect("run deploy/lab/pg-tls.sh");
            assert!(
                out.status.success(),
                "deploy/lab/pg-tls.sh start failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let pki = std::process::Command::new(&script)
                .arg("pki")
                .output()
                .expect("pg-tls.sh pki");
            PathBuf::from(String::from_utf8_lossy(&pki.stdout).trim())
        })
        .clone()
}

fn pki_file(name: &str) -> String {
    lab_pki().join(name).display().to_string()
}

/// A client of the TLS origin over its Unix socket (trusted: the tests' own set-up).
async fn local(db: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(
        &format!("host=/tmp port={PORT} user=postgres dbname={db}"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("Unix-socket connection to the TLS lab origin");
    tokio::spawn(conn);
    c
}

/// A database of its own on the TLS origin; dropped (slots included) on drop.
struct TlsDb {
    name: String,
}

impl TlsDb {
    async fn create(tag: &str) -> TlsDb {
        lab_pki();
        let name = format!("t_{tag}_{}", std::process::id());
        let admin = local("postgres").await;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let c = local(&name).await;
        c.batch_execute(
            "CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL);
             INSERT INTO users VALUES (1, 'ann'), (2, 'bob');",
        )
        .await
        .unwrap();
        TlsDb { name }
    }

    fn url(&self, host: &str, extra: &str) -> String {
        format!(
            "host={host} port={PORT} user=postgres password=pgline dbname={} {extra}",
            self.name
        )
    }
}

impl Drop for TlsDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        run_cleanup(async move {
            let admin = local("postgres").await;
            for _ in 0..20 {
                let _ = admin
                    .batch_execute(&format!(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE database = '{name}' AND active_pid IS NOT NULL;
                         SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE database = '{name}' AND NOT active;"
                    ))
                    .await;
                let left: i64 = admin
                    .query_one(
                        "SELECT count(*) FROM pg_replication_slots WHERE database = $1",
                        &[&name],
                    )
                    .await
                    .map(|r| r.get(0))
                    .unwrap_or(0);
                if left == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        });
    }
}

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// pgline's config for `db` with `url` as `origin.url`.
fn config(db: &TlsDb, url: &str) -> Config {
    let sets = vec![
        format!("origin.url={}", toml_str(url)),
        format!("replication.slot={}", toml_str(&db.name)),
        "resp.listen=\"127.0.0.1:0\"".to_string(),
        "api.listen=\"127.0.0.1:0\"".to_string(),
        "pgwire.listen=\"127.0.0.1:0\"".to_string(),
        "resp.cores=1".to_string(),
        "store.memory=\"64MiB\"".to_string(),
        "store.max_page=\"4KiB\"".to_string(),
        "replication.status_interval_ms=100".to_string(),
        "replication.reconnect_backoff_ms=100".to_string(),
        "origin.pool_size=2".to_string(),
    ];
    Config::load(None, Vec::<(String, String)>::new(), &sets).expect("test config")
}

/// Boots pgline on `url` and checks fill, replication and relay; then that each of pgline's
/// connections to the database is encrypted.
async fn boots_and_encrypts(db: &TlsDb, url: &str) {
    let c = local(&db.name).await;
    c.batch_execute("UPDATE users SET name = 'ann' WHERE id = 1")
        .await
        .unwrap();
    let p: Arc<Pgline> = lab::start(config(db, url)).await;
    let mut r = lab::redis(&p).await;
    let before: String = r.get("users:1").await.unwrap();
    assert!(before.contains("\"ann\""), "{before}");

    // Replication: an UPDATE reaches the cache.
    c.batch_execute("UPDATE users SET name = 'anna' WHERE id = 1")
        .await
        .unwrap();
    lab::sync(&p, &c).await;
    let after: String = r.get("users:1").await.unwrap();
    assert!(after.contains("\"anna\""), "{after}");

    // The relay (plaintext client leg, TLS origin leg), twice: the second batch runs on a
    // pooled connection, which must not look unusable under TLS.
    let addr = p.pg_addr().expect("pg port");
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host={} port={} user=postgres password=pgline dbname={}",
            addr.ip(),
            addr.port(),
            db.name
        ),
        tokio_postgres::NoTls,
    )
    .await
    .expect("relay login");
    tokio::spawn(conn);
    for _ in 0..3 {
        let row = client
            .query_one("SELECT name FROM users WHERE id = 2", &[])
            .await
            .expect("relayed query");
        assert_eq!(row.get::<_, String>(0), "bob");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A pooled TLS connection is not taken for dead (TLS records that carry no data).
    let relay = p.pg_relay().expect("relay");
    assert_eq!(relay.origin_stats().backend_dead, 0);

    let rows = c
        .query(
            "SELECT a.backend_type, a.application_name, s.ssl \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.datname = current_database() AND a.client_addr IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    let seen: Vec<(String, String, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(
        seen.iter().any(|(t, _, _)| t == "walsender"),
        "the walsender is connected: {seen:?}"
    );
    assert!(seen.len() >= 3, "walsender, fills, relay: {seen:?}");
    assert!(
        seen.iter().all(|(_, _, ssl)| *ssl),
        "every origin connection is TLS: {seen:?}"
    );
    drop(client);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_and_require_encrypt_everything() {
    let db = TlsDb::create("otls_req").await;
    boots_and_encrypts(&db, &db.url("127.0.0.1", "")).await; // prefer, the default
    boots_and_encrypts(&db, &db.url("127.0.0.1", "sslmode=require")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_and_verify_full_encrypt_everything() {
    let db = TlsDb::create("otls_verify").await;
    let ca = pki_file("ca.crt");
    boots_and_encrypts(
        &db,
        &db.url("127.0.0.1", &format!("sslmode=verify-ca sslrootcert={ca}")),
    )
    .await;
    // The URI form, with the CA path percent-encoded.
    let uri = format!(
        "postgresql://postgres:pgline@localhost:{PORT}/{}?sslmode=verify-full&sslrootcert={}",
        db.name,
        ca.replace('/', "%2F")
    );
    boots_and_encrypts(&db, &uri).await;
}

/// pgline's start-up error on `url`.
async fn start_error(db: &TlsDb, url: &str) -> String {
    match Pgline::start(config(db, url)).await {
        Ok(p) => {
            p.shutdown().await;
            panic!("pgline started on {url}")
        }
        Err(e) => e.to_string(),
    }
}

/// The raw connector's error (the replication stream's login) on `url`.
async fn raw_error(url: &str) -> String {
    let s = Settings::parse(url).expect("url");
    match ReplicationConn::connect(&s).await {
        Ok(_) => panic!("the raw connector logged in on {url}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_is_refused_with_a_hint() {
    let db = TlsDb::create("otls_disable").await;
    let url = db.url("127.0.0.1", "sslmode=disable");
    let e = start_error(&db, &url).await;
    assert!(e.contains("no encryption"), "{e}");
    assert!(e.contains("sslmode=require or stronger"), "{e}");
    let e = raw_error(&url).await;
    assert!(
        e.contains("no encryption") && e.contains("sslmode=require"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_checks_the_host_name() {
    let db = TlsDb::create("otls_name").await;
    let url = db.url(
        "127.0.0.1",
        &format!("sslmode=verify-full sslrootcert={}", pki_file("ca.crt")),
    );
    let want = "not valid for host '127.0.0.1' (it names localhost)";
    let e = start_error(&db, &url).await;
    assert!(e.contains(want), "{e}");
    let e = raw_error(&url).await;
    assert!(e.contains(want), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ca_is_refused() {
    let db = TlsDb::create("otls_ca").await;
    let other = pki_file("other-ca.crt");
    let url = db.url(
        "localhost",
        &format!("sslmode=verify-ca sslrootcert={other}"),
    );
    let want = format!("not signed by a trusted CA (sslrootcert={other})");
    let e = start_error(&db, &url).await;
    assert!(e.contains(&want), "{e}");
    let e = raw_error(&url).await;
    assert!(e.contains(&want), "{e}");
    // require with a root file checks the chain too, as libpq's does.
    let e = raw_error(&db.url("localhost", &format!("sslmode=require sslrootcert={other}"))).await;
    assert!(e.contains(&want), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented() {
    let db = TlsDb::create("otls_cert").await;
    let base = format!(
        "host=localhost port={PORT} user=pgline_cert password=pgline dbname={} \
         sslmode=verify-full sslrootcert={}",
        db.name,
        pki_file("ca.crt")
    );
    let e = raw_error(&base).await;
    assert!(
        e.contains("connection requires a valid client certificate"),
        "{e}"
    );
    let with = format!(
        "{base} sslcert={} sslkey={}",
        pki_file("client.crt"),
        pki_file("client.key")
    );
    let s = Settings::parse(&with).unwrap();
    let mut conn = ReplicationConn::connect(&s)
        .await
        .expect("login with a client cert");
    let info = conn.identify_system().await.unwrap();
    assert_eq!(info.dbname.as_deref(), Some(db.name.as_str()));
    // And tokio-postgres (fills, catalog) with the same settings.
    let (c, task) =
        s.pg.connect(s.pg_tls())
            .await
            .expect("tokio-postgres with a client cert");
    tokio::spawn(task);
    let ssl: bool = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl);
}

/// A fake origin on port 0 that answers an SSLRequest with `answer` and, for `S`, completes
/// the handshake with `cert`; returns its port.
async fn fake_origin(answer: u8, cert: Option<pki::Issued>) -> u16 {
    fake_origin_with(Some(vec![answer]), cert, None).await
}

/// A fake origin on port 0: answers an SSLRequest with `answer` (`None`: no SSLRequest, TLS
/// from the first byte, ALPN `postgresql` required), completes the handshake with `cert`, and
/// then sends `after` (if any) inside TLS; returns its port.
async fn fake_origin_with(
    answer: Option<Vec<u8>>,
    cert: Option<pki::Issued>,
    after: Option<Vec<u8>>,
) -> u16 {
    use rustls::pki_types::pem::PemObject;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = cert.map(|c| {
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(&c.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&c.key).unwrap();
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let mut cfg = cfg;
        if answer.is_none() {
            cfg.alpn_protocols = vec![b"postgresql".to_vec()];
        }
        tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let (answer, after) = (answer.clone(), after.clone());
            tokio::spawn(async move {
                if let Some(answer) = &answer {
                    let mut req = [0u8; 8];
                    if s.read_exact(&mut req).await.is_err() {
                        return;
                    }
                    let _ = s.write_all(answer).await;
                }
                if let Some(a) = acceptor {
                    let Ok(mut tls) = a.accept(s).await else {
                        return;
                    };
                    if answer.is_none() {
                        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                        assert_eq!(alpn.as_deref(), Some(&b"postgresql"[..]), "ALPN");
                    }
                    if let Some(after) = after {
                        let _ = tls.write_all(&after).await;
                        let _ = tls.shutdown().await;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused() {
    let dir = std::env::temp_dir().join(format!("pgline-otls-exp-{}", std::process::id()));
    let ca = pki::Ca::new(&dir, "ca", "expired test CA");
    let port = fake_origin(
        b'S',
        Some(ca.server("old", &["localhost"], pki::Validity::Expired)),
    )
    .await;
    let url = format!(
        "host=localhost port={port} user=u password=p dbname=d sslmode=verify-full \
         sslrootcert={}",
        ca.cert.display()
    );
    let e = raw_error(&url).await;
    assert!(
        e.contains("the origin's certificate expired at 2002-"),
        "{e}"
    );
    let s = Settings::parse(&url).unwrap();
    let e = s.pg.connect(s.pg_tls()).await.err().expect("refused");
    let e = origin::describe_error(&e);
    assert!(e.contains("expired at 2002-"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_an_origin_without_tls() {
    let port = fake_origin(b'N', None).await;
    let e = raw_error(&format!(
        "host=127.0.0.1 port={port} user=u password=p sslmode=require"
    ))
    .await;
    assert!(
        e.contains("does not support SSL, but sslmode=require"),
        "{e}"
    );
}

/// A host list with `target_session_attrs`: a database that defaults to read-only on one
/// cluster, read-write on the other; the raw connector lands where it is asked to, and
/// remembers the read-write host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_host_follows_target_session_attrs() {
    let db = TlsDb::create("otls_multi").await;
    local(&db.name)
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .await
        .unwrap();
    // The same database on the plain lab cluster, read-write.
    // Dropped with the slot pgline's stream makes there, whatever the test's outcome.
    let _plain_db = pgline_testkit::origin::TestDb::named(db.name.clone()).await;
    let (_, plain_port, _, _) = pgline_testkit::origin::origin_base();
    let url = |attrs: &str| {
        format!(
            "host=127.0.0.1,127.0.0.1,127.0.0.1 port=1,{PORT},{plain_port} user=postgres \
             password=pgline dbname={} target_session_attrs={attrs}",
            db.name
        )
    };
    let startup = |s: &Settings| {
        let mut b = bytes::BytesMut::new();
        postgres_protocol::message::frontend::startup_message(
            [("user", "postgres"), ("database", db.name.as_str())],
            &mut b,
        )
        .unwrap();
        let _ = s;
        b
    };
    let who = Credentials {
        user: "postgres",
        password: Some(b"pgline"),
    };
    let timeout = Some(Duration::from_secs(3));

    let rw = Settings::parse(&url("read-write")).unwrap();
    let (conn, _, host) = origin::connect(&rw, timeout, &startup(&rw), who, 1024)
        .await
        .expect("a read-write host");
    assert_eq!(host, 2, "the TLS host defaults to read-only: skipped");
    assert!(!conn.is_tls(), "the plain lab cluster answered");
    assert_eq!(rw.primary.get(), 2, "remembered");
    // The next login starts there.
    let (_, _, again) = origin::connect(&rw, timeout, &startup(&rw), who, 1024)
        .await
        .unwrap();
    assert_eq!(again, 2);

    let ro = Settings::parse(&url("read-only")).unwrap();
    let (conn, _, host) = origin::connect(&ro, timeout, &startup(&ro), who, 1024)
        .await
        .expect("a read-only host");
    assert_eq!(host, 1);
    assert!(conn.is_tls());

    // The WAL stream's login with read-write lands on the plain cluster too.
    let mut wal = ReplicationConn::connect(&Settings::parse(&url("read-write")).unwrap())
        .await
        .expect("replication login on the read-write host");
    wal.identify_system().await.unwrap();
    drop(wal);
}

/// `pgline check --origin <url>`: the `origin TLS` line (and the line after it, the fix).
fn check_line(url: &str) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pgline"))
        .args(["check", "--origin", url, "--listen", "127.0.0.1:0"])
        .env_remove("PGLINE_CONFIG")
        .env("PGLINE_API_LISTEN", "127.0.0.1:0")
        .output()
        .expect("run pgline check");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.contains("origin TLS"))
        .unwrap_or_else(|| panic!("no origin TLS line in\n{out}"));
    (
        lines[i].to_owned(),
        lines.get(i + 1).copied().unwrap_or("").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgline_check_names_each_cause() {
    let db = TlsDb::create("otls_check").await;
    let ca = pki_file("ca.crt");
    let (l, _) = check_line(&db.url(
        "localhost",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    ));
    assert!(
        l.starts_with("PASS") && l.contains("TLSv1.3") && l.contains("verify-full"),
        "{l}"
    );
    let (l, fix) = check_line(&db.url("127.0.0.1", "sslmode=require"));
    assert!(
        l.starts_with("WARN") && l.contains("without server verification"),
        "{l}"
    );
    assert!(fix.contains("verify-full"), "{fix}");
    let (l, fix) = check_line(&db.url(
        "127.0.0.1",
        &format!("sslmode=verify-full sslrootcert={ca}"),
    ));
    assert!(
        l.starts_with("FAIL") && l.contains("not valid for host '127.0.0.1'"),
        "{l}"
    );
    assert!(fix.contains("verify-ca"), "{fix}");
    let other = pki_file("other-ca.crt");
    let (l, fix) = check_line(&db.url(
        "localhost",
        &format!("sslmode=verify-ca sslrootcert={other}"),
    ));
    assert!(
        l.starts_with("FAIL") && l.contains("not signed by a trusted CA"),
        "{l}"
    );
    assert!(fix.contains("sslrootcert"), "{fix}");

    let dir = std::env::temp_dir().join(format!("pgline-otls-chk-{}", std::process::id()));
    let old = pki::Ca::new(&dir, "ca", "expired test CA");
    let port = fake_origin(
        b'S',
        Some(old.server("old", &["localhost"], pki::Validity::Expired)),
    )
    .await;
    let url = format!(
        "host=localhost port={port} user=u password=p sslmode=verify-full sslrootcert={}",
        old.cert.display()
    );
    let (l, fix) = tokio::task::spawn_blocking(move || check_line(&url))
        .await
        .unwrap();
    assert!(
        l.starts_with("FAIL") && l.contains("expired at 2002-"),
        "{l}"
    );
    assert!(fix.contains("renew"), "{fix}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Reads one backend message (tag, body) from a raw socket.
async fn read_msg(s: &mut tokio::net::TcpStream) -> (u8, Vec<u8>) {
    let tag = s.read_u8().await.expect("a message");
    let len = s.read_i32().await.unwrap() as usize;
    let mut body = vec![0; len - 4];
    s.read_exact(&mut body).await.unwrap();
    (tag, body)
}

/// Through the relay with a TLS origin leg: the origin offers SCRAM-SHA-256-PLUS, the client
/// does not see it, and a client that says it could bind (`y`) gets pgline's FATAL telling it
/// to use channel_binding=disable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_scram_hides_channel_binding() {
    let db = TlsDb::create("otls_scram").await;
    let p = lab::start(config(&db, &db.url("localhost", "sslmode=require"))).await;
    let addr = p.pg_addr().expect("pg port");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    postgres_protocol::message::frontend::startup_message(
        [("user", "postgres"), ("database", db.name.as_str())],
        &mut buf,
    )
    .unwrap();
    s.write_all(&buf).await.unwrap();
    let (tag, body) = read_msg(&mut s).await;
    assert_eq!(tag, b'R');
    assert_eq!(&body[..4], &10i32.to_be_bytes(), "AuthenticationSASL");
    let mechanisms: Vec<&[u8]> = body[4..]
        .split(|&b| b == 0)
        .filter(|m| !m.is_empty())
        .collect();
    assert_eq!(mechanisms, [&b"SCRAM-SHA-256"[..]], "PLUS is not relayed");

    buf.clear();
    postgres_protocol::message::frontend::sasl_initial_response(
        "SCRAM-SHA-256",
        b"y,,n=,r=abcdefghijklmnop",
        &mut buf,
    )
    .unwrap();
    s.write_all(&buf).await.unwrap();
    let (tag, body) = read_msg(&mut s).await;
    assert_eq!(tag, b'E');
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("channel_binding=disable"), "{text}");
    assert!(text.contains("28000"), "{text}");

    // A client that does not bind (`n`) logs in.
    let (client, conn) = tokio_postgres::Config::new()
        .host(addr.ip().to_string())
        .port(addr.port())
        .user("postgres")
        .password("pgline")
        .dbname(&db.name)
        .channel_binding(tokio_postgres::config::ChannelBinding::Disable)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("SCRAM without binding through the relay");
    tokio::spawn(conn);
    client.simple_query("SELECT 1").await.unwrap();
    drop(client);
    p.shutdown().await;
}

/// The relay with `target_session_attrs=read-write` over a host list whose first host is
/// read-only: relayed logins start on the host the replication stream found read-write; when
/// that host turns read-only (a failover, here simulated with `default_transaction_read_only`),
/// the relayed login that lands there is refused with a retryable FATAL, and the next one
/// starts on the next host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_login_on_a_read_only_host_moves_on() {
    let db = TlsDb::create("otls_relay_rw").await;
    local(&db.name)
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .await
        .unwrap();
    // Dropped with the slot pgline's stream makes there, whatever the test's outcome.
    let _plain_db = pgline_testkit::origin::TestDb::named(db.name.clone()).await;
    let (_, plain_port, _, _) = pgline_testkit::origin::origin_base();
    let plain_db =
        pgline_testkit::origin::connect(&pgline_testkit::origin::conn_string(&db.name)).await;
    plain_db
        .batch_execute("CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL)")
        .await
        .unwrap();
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={PORT},{plain_port} user=postgres password=pgline \
         dbname={} target_session_attrs=read-write",
        db.name
    );
    let p = lab::start(config(&db, &url)).await;
    let addr = p.pg_addr().expect("pg port");
    let login = || async {
        tokio_postgres::connect(
            &format!(
                "host={} port={} user=postgres password=pgline dbname={}",
                addr.ip(),
                addr.port(),
                db.name
            ),
            tokio_postgres::NoTls,
        )
        .await
    };
    let (client, conn) = login()
        .await
        .expect("the first login starts on the read-write host");
    tokio::spawn(conn);
    client
        .batch_execute("INSERT INTO users VALUES (9, 'written through the relay')")
        .await
        .expect("a write through the relay");
    drop(client);

    // "Failover": the plain cluster's database turns read-only, the TLS one read-write.
    let plain = pgline_testkit::origin::admin_client().await;
    plain
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .await
        .unwrap();
    local("postgres")
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} RESET default_transaction_read_only",
            db.name
        ))
        .await
        .unwrap();
    let e = login()
        .await
        .err()
        .expect("the next relayed login lands on the old host");
    let text = origin::describe_error(&e);
    assert!(text.contains("target_session_attrs"), "{text}");
    let (client, conn) = login()
        .await
        .expect("the one after starts on the other host");
    tokio::spawn(conn);
    client
        .batch_execute("INSERT INTO users VALUES (10, 'written on the new primary')")
        .await
        .expect("a write through the relay on the new host");
    drop(client);
    p.shutdown().await;
    drop(plain_db);
}

/// A FATAL ErrorResponse with `message` (whole message).
fn fatal(message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "XX000"),
        (b'M', message),
    ] {
        body.push(k);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut m = vec![b'E'];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(&body);
    m
}

/// `sslnegotiation=direct`: TLS from the first byte with ALPN `postgresql`; what the origin
/// then says arrives through TLS (here: a FATAL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_negotiation() {
    let dir = std::env::temp_dir().join(format!("pgline-otls-direct-{}", std::process::id()));
    let ca = pki::Ca::new(&dir, "ca", "direct test CA");
    let port = fake_origin_with(
        None,
        Some(ca.server("srv", &["localhost"], pki::Validity::Current)),
        Some(fatal("direct TLS reached the origin")),
    )
    .await;
    let url = format!(
        "host=localhost port={port} user=u password=p sslmode=verify-full sslnegotiation=direct \
         sslrootcert={}",
        ca.cert.display()
    );
    let e = raw_error(&url).await;
    assert!(e.contains("direct TLS reached the origin"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Bytes after the origin's `S` and before the handshake are refused (CVE-2021-23222).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_after_the_ssl_answer_are_refused() {
    let dir = std::env::temp_dir().join(format!("pgline-otls-cve-{}", std::process::id()));
    let ca = pki::Ca::new(&dir, "ca", "cve test CA");
    let port = fake_origin_with(
        Some(b"SZ\0\0\0\x05I".to_vec()),
        Some(ca.server("srv", &["localhost"], pki::Validity::Current)),
        None,
    )
    .await;
    let e = raw_error(&format!(
        "host=localhost port={port} user=u password=p sslmode=require"
    ))
    .await;
    assert!(
        e.contains("received unencrypted data after SSL response"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
