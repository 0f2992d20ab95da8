//! TLS on pgline's PostgreSQL front, against the lab origin (plaintext leg) and real clients:
//! psql 15 with `sslmode=require` and `verify-full`, tokio-postgres over tokio-postgres-rustls,
//! psycopg 3 (libpq with OpenSSL); `pgwire.tls = required` refusing plaintext with PostgreSQL's
//! own text; the startup negotiation byte by byte (GSSENCRequest, SSLRequest, the
//! unencrypted-data checks, a garbage handshake); certificate reload through the API.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_controlplane::config::{Config, PgwireTls};
use pgline_controlplane::server::Pgline;
use pgline_testkit::pki::{Ca, Issued, Validity};
use pgline_testkit::{lab, origin, TestDb};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SCHEMA: &str = "
CREATE TABLE items (id int8 PRIMARY KEY, name text NOT NULL);
INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g;
";

/// A directory of its own for a test's certificates.
fn pki_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgline-pgtls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The lab config for `db` with the PostgreSQL front's TLS in `mode`, using `server`.
fn tls_config(db: &TestDb, server: &Issued, mode: PgwireTls) -> Config {
    let mut cfg = lab::config(db, 1);
    cfg.tls.cert_file = server.cert.display().to_string();
    cfg.tls.key_file = server.key.display().to_string();
    cfg.pgwire.tls = mode;
    cfg.api.token = Some("tls-test-token".into());
    cfg.validate().expect("the TLS config validates");
    cfg
}

async fn start(db: &TestDb, server: &Issued, mode: PgwireTls) -> Arc<Pgline> {
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    lab::start(tls_config(db, server, mode)).await
}

/// Runs psql with `conninfo` and the commands; returns (success, stdout, stderr).
fn psql(conninfo: &str, commands: &[&str]) -> (bool, String, String) {
    let (_, _, _, password) = origin::origin_base();
    let mut cmd = Command::new("psql");
    cmd.env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .arg("-XAt")
        .arg("-v")
        .arg("ON_ERROR_STOP=1")
        .arg(conninfo);
    for c in commands {
        cmd.arg("-c").arg(c);
    }
    let out = cmd
        .output()
        .expect("run psql (Debian postgresql-client 15)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn conninfo(p: &Pgline, db: &TestDb, host: &str, extra: &str) -> String {
    let addr = p.pg_addr().expect("pgwire front on");
    let (_, _, user, _) = origin::origin_base();
    format!(
        "host={host} hostaddr={} port={} user={user} dbname={} {extra}",
        addr.ip(),
        addr.port(),
        db.name
    )
}

/// Runs `sql` over a plaintext session (`pgwire.tls = on` allows it) until an answer comes
/// from the cache, so that a later run over TLS is a hit.
async fn warm(p: &Pgline, db: &TestDb, sql: &str) {
    let addr = p.pg_addr().unwrap();
    let (_, _, user, password) = origin::origin_base();
    let conn = format!(
        "host={} port={} user={user} password={password} dbname={}",
        addr.ip(),
        addr.port(),
        db.name
    );
    let client = origin::connect(&conn).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = hits(p);
        client.simple_query(sql).await.unwrap();
        if hits(p) > before {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sql} never hit the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hits(p: &Pgline) -> u64 {
    p.shared.total(|s| &s.keys_hit)
}

fn handshakes(p: &Pgline) -> (u64, u64) {
    (
        p.shared.total(|s| &s.tls_handshakes),
        p.shared.total(|s| &s.tls_handshake_failures),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_require_and_verify_full_run_cached_and_relayed_queries() {
    let db = TestDb::create("pgtls_psql").await;
    let dir = pki_dir("psql");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let server = ca.server("server", &["localhost"], Validity::Current);
    let p = start(&db, &server, PgwireTls::On).await;
    warm(&p, &db, "SELECT name FROM items WHERE id = 7").await;
    let ca_path = ca.cert.display().to_string();
    for (label, extra) in [
        ("require", "sslmode=require".to_string()),
        (
            "verify-full",
            format!("sslmode=verify-full sslrootcert={ca_path}"),
        ),
    ] {
        // A new session's lookups go to the origin until pgline's WAL reaches its login
        // fence, which the lab origin's other writers keep moving: a run may end before that.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let info = conninfo(&p, &db, "localhost", &extra);
            let before = hits(&p);
            let (ok, out, err) = tokio::task::spawn_blocking(move || {
                psql(
                    &info,
                    &[
                        "\\conninfo",
                        "SELECT name FROM items WHERE id = 7",
                        "SELECT name FROM items WHERE id = 7",
                        "SELECT count(*) FROM items",
                    ],
                )
            })
            .await
            .unwrap();
            assert!(ok, "psql {label} failed: {err}\n{out}");
            assert!(
                out.contains("SSL connection (protocol: TLSv1.3"),
                "psql {label} is not on TLS: {out}"
            );
            let lines: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("item")).collect();
            assert_eq!(lines, ["item 7", "item 7", "50"], "psql {label}: {out}");
            // The point lookup was cached (warmed in plaintext): answered from cache over TLS.
            if hits(&p) > before {
                break;
            }
            assert!(
                Instant::now() < until,
                "psql {label}: no cache hit over TLS"
            );
        }
    }
    // verify-full against a name the certificate does not carry fails on the client's check.
    let info = conninfo(
        &p,
        &db,
        "127.0.0.1",
        &format!("sslmode=verify-full sslrootcert={ca_path}"),
    );
    let (ok, _, err) = tokio::task::spawn_blocking(move || psql(&info, &["SELECT 1"]))
        .await
        .unwrap();
    assert!(!ok && err.contains("does not match host name"), "{err}");
    // The relay hands the origin's SASL exchange to the client: over a plaintext origin leg the
    // origin offers no SCRAM-SHA-256-PLUS, so libpq's default channel_binding=prefer logs in
    // (above) and channel_binding=require is refused by the client itself.
    let info = conninfo(
        &p,
        &db,
        "localhost",
        "sslmode=require channel_binding=require",
    );
    let (ok, _, err) = tokio::task::spawn_blocking(move || psql(&info, &["SELECT 1"]))
        .await
        .unwrap();
    assert!(!ok && err.contains("channel binding"), "{err}");
    let (done, _) = handshakes(&p);
    assert!(done >= 2, "handshakes counted: {done}");
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_refuses_plaintext_like_a_hostssl_only_postgres() {
    let db = TestDb::create("pgtls_required").await;
    let dir = pki_dir("required");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let server = ca.server("server", &["localhost"], Validity::Current);
    let p = start(&db, &server, PgwireTls::Required).await;
    let (_, _, user, _) = origin::origin_base();
    let info = conninfo(&p, &db, "127.0.0.1", "sslmode=disable");
    let (ok, _, err) = tokio::task::spawn_blocking(move || psql(&info, &["SELECT 1"]))
        .await
        .unwrap();
    let want = format!(
        "FATAL:  no pg_hba.conf entry for host \"127.0.0.1\", user \"{user}\", database \"{}\", no encryption",
        db.name
    );
    assert!(!ok && err.contains(&want), "got: {err}");
    // sslmode=prefer (libpq's default) goes to TLS and works.
    let info = conninfo(&p, &db, "localhost", "sslmode=prefer");
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || psql(&info, &["SELECT name FROM items WHERE id = 3"]))
            .await
            .unwrap();
    assert!(ok && out.trim() == "item 3", "{err}{out}");
    // A CancelRequest in plaintext is still taken (PostgreSQL does not check pg_hba for it):
    // pgline reads it and closes without an error message.
    let addr = p.pg_addr().unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut cancel = 16i32.to_be_bytes().to_vec();
    cancel.extend_from_slice(&80_877_102i32.to_be_bytes());
    cancel.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]);
    s.write_all(&cancel).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed")
        .unwrap();
    assert!(rest.is_empty(), "a cancel gets no answer: {rest:?}");
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rustls client configuration trusting `ca`.
fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_and_psycopg_over_tls() {
    let db = TestDb::create("pgtls_clients").await;
    let dir = pki_dir("clients");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let server = ca.server("server", &["localhost"], Validity::Current);
    let p = start(&db, &server, PgwireTls::Required).await;
    let addr = p.pg_addr().unwrap();
    let (_, _, user, password) = origin::origin_base();
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new((*client_config(&ca.cert)).clone());
    let conn = format!(
        "host=localhost hostaddr={} port={} user={user} password={password} dbname={} sslmode=require",
        addr.ip(),
        addr.port(),
        db.name
    );
    let (client, connection) = tokio_postgres::connect(&conn, tls)
        .await
        .expect("tokio-postgres over TLS through pgline");
    tokio::spawn(connection);
    // Asked until an answer comes from the cache (the first ones fill it).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = hits(&p);
        let row = client
            .query_one("SELECT name FROM items WHERE id = $1", &[&9i64])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "item 9");
        if hits(&p) > before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no cache hit over TLS (extended protocol)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n: i64 = client
        .query_one("SELECT count(*) FROM items", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 50);

    // psycopg 3 (its binary wheel bundles libpq with OpenSSL), when the lab venv is there.
    let python = std::env::var("PGLINE_PGWIRE_PYTHON").ok().or_else(|| {
        let out = Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../deploy/lab/pgwire_venv.sh"
            ))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    match python {
        None => {
            eprintln!("psycopg: the lab venv (deploy/lab/pgwire_venv.sh) is unavailable: skipped")
        }
        Some(python) => {
            let script = format!(
                "import psycopg\n\
                 with psycopg.connect('host=localhost hostaddr={} port={} user={user} password={password} dbname={} sslmode=verify-full sslrootcert={}') as c:\n\
                 \x20   print(c.pgconn.ssl_in_use, c.execute('SELECT name FROM items WHERE id = %s', (4,)).fetchone()[0], c.execute('SELECT count(*) FROM items').fetchone()[0])\n",
                addr.ip(),
                addr.port(),
                db.name,
                ca.cert.display()
            );
            let out = tokio::task::spawn_blocking(move || {
                Command::new(python).arg("-c").arg(script).output().unwrap()
            })
            .await
            .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "psycopg: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(stdout.trim(), "True item 4 50");
        }
    }
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
const GSSENC_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];

async fn read_all(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("pgline closes the connection")
        .expect("read");
    out
}

/// The message text of an ErrorResponse.
fn error_fields(bytes: &[u8]) -> (String, String) {
    assert_eq!(bytes.first(), Some(&b'E'), "{bytes:?}");
    let mut code = String::new();
    let mut message = String::new();
    for field in bytes[5..].split(|b| *b == 0) {
        match field.first() {
            Some(b'C') => code = String::from_utf8_lossy(&field[1..]).into(),
            Some(b'M') => message = String::from_utf8_lossy(&field[1..]).into(),
            _ => {}
        }
    }
    (code, message)
}

/// SSLRequest on `s`, expecting `S`, then a handshake; returns the TLS stream.
async fn start_tls(mut s: TcpStream, ca: &Path) -> tokio_rustls::client::TlsStream<TcpStream> {
    s.write_all(&SSL_REQUEST).await.unwrap();
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"S");
    let connector = tokio_rustls::TlsConnector::from(client_config(ca));
    connector
        .connect(ServerName::try_from("localhost").unwrap(), s)
        .await
        .expect("handshake")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_negotiation_byte_by_byte() {
    let db = TestDb::create("pgtls_raw").await;
    let dir = pki_dir("raw");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let server = ca.server("server", &["localhost"], Validity::Current);
    let p = start(&db, &server, PgwireTls::On).await;
    let addr = p.pg_addr().unwrap();

    // GSSENCRequest → N, then SSLRequest on the same connection → S and a handshake; a
    // second SSLRequest inside TLS is refused as PostgreSQL refuses it.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&GSSENC_REQUEST).await.unwrap();
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"N");
    let mut tls = start_tls(s, &ca.cert).await;
    tls.write_all(&SSL_REQUEST).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest)).await;
    assert_eq!(
        error_fields(&rest),
        (
            "0A000".into(),
            "unsupported frontend protocol 1234.5679: server supports 3.0 to 3.0".into()
        )
    );

    // SSLRequest with bytes behind it in the same write: refused (CVE-2021-23214).
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut packet = SSL_REQUEST.to_vec();
    packet.extend_from_slice(b"\x16\x03\x01 injected");
    s.write_all(&packet).await.unwrap();
    let got = read_all(&mut s).await;
    assert_eq!(got[0], b'S');
    assert_eq!(
        error_fields(&got[1..]),
        (
            "08P01".into(),
            "received unencrypted data after SSL request".into()
        )
    );
    // The same after a GSSENCRequest.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut packet = GSSENC_REQUEST.to_vec();
    packet.extend_from_slice(&SSL_REQUEST);
    s.write_all(&packet).await.unwrap();
    let got = read_all(&mut s).await;
    assert_eq!(got[0], b'N');
    assert_eq!(
        error_fields(&got[1..]).1,
        "received unencrypted data after GSSAPI encryption request"
    );

    // A garbage handshake closes that connection only; one opened before keeps working.
    let (_, failures_before) = handshakes(&p);
    let info = conninfo(&p, &db, "localhost", "sslmode=require");
    let mut good = {
        let (_, _, user, password) = origin::origin_base();
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new((*client_config(&ca.cert)).clone());
        let conn = format!(
            "host=localhost hostaddr={} port={} user={user} password={password} dbname={} sslmode=require",
            addr.ip(),
            addr.port(),
            db.name
        );
        let (client, connection) = tokio_postgres::connect(&conn, tls).await.unwrap();
        tokio::spawn(connection);
        Some(client)
    };
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&SSL_REQUEST).await.unwrap();
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"S");
    s.write_all(b"GET / HTTP/1.1\r\nHost: pgline\r\n\r\n")
        .await
        .unwrap();
    let alert = read_all(&mut s).await;
    assert!(
        alert.is_empty() || alert[0] == 0x15,
        "a TLS alert or nothing: {alert:?}"
    );
    let (_, failures) = handshakes(&p);
    assert_eq!(
        failures,
        failures_before + 1,
        "the failed handshake is counted"
    );
    let client = good.take().unwrap();
    let row = client
        .query_one("SELECT name FROM items WHERE id = 5", &[])
        .await
        .expect("the other connection still works");
    assert_eq!(row.get::<_, String>(0), "item 5");
    let (ok, out, err) = tokio::task::spawn_blocking(move || psql(&info, &["SELECT 1"]))
        .await
        .unwrap();
    assert!(ok && out.trim() == "1", "a new connection works: {err}");
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The certificate pgline's PostgreSQL front shows a new connection.
async fn served_certificate(addr: std::net::SocketAddr, ca: &Path) -> Vec<u8> {
    let s = TcpStream::connect(addr).await.unwrap();
    let tls = start_tls(s, ca).await;
    let (_, conn) = tls.get_ref();
    conn.peer_certificates().expect("a certificate")[0].to_vec()
}

fn pem_der(path: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(path).unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_the_certificate_and_a_broken_file_keeps_the_old_one() {
    let db = TestDb::create("pgtls_reload").await;
    let dir = pki_dir("reload");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let live = ca.server("live", &["localhost"], Validity::Current);
    let p = start(&db, &live, PgwireTls::On).await;
    let addr = p.pg_addr().unwrap();
    let first = pem_der(&live.cert);
    assert_eq!(served_certificate(addr, &ca.cert).await, first);
    let open = {
        let s = TcpStream::connect(addr).await.unwrap();
        start_tls(s, &ca.cert).await
    };

    // New files in place (same paths), then the API.
    let next = ca.server("next", &["localhost"], Validity::Current);
    std::fs::copy(&next.cert, &live.cert).unwrap();
    std::fs::copy(&next.key, &live.key).unwrap();
    let api = format!("http://{}/v1/tls/reload", p.api_addr().unwrap());
    let http = reqwest::Client::new();
    let r = http
        .post(&api)
        .bearer_auth("tls-test-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["chain"], 1);
    let second = pem_der(&next.cert);
    assert_ne!(first, second);
    assert_eq!(served_certificate(addr, &ca.cert).await, second);
    // The connection opened before keeps its session.
    assert_eq!(
        open.get_ref().1.peer_certificates().unwrap()[0].to_vec(),
        first
    );

    // A broken key: the reload fails with its reason, the certificate in use stays.
    std::fs::write(&live.key, "not a key").unwrap();
    let r = http
        .post(&api)
        .bearer_auth("tls-test-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let body: serde_json::Value = r.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("tls.key_file") && detail.contains("old certificate stays"),
        "{detail}"
    );
    assert_eq!(served_certificate(addr, &ca.cert).await, second);
    // The in-process call SIGHUP makes (main.rs) gives the same error.
    assert!(matches!(p.reload_tls(), Some(Err(_))));
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn userspace_transports_refuse_tls_at_start() {
    let dir = pki_dir("userspace");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let server = ca.server("server", &["localhost"], Validity::Current);
    let sets = [
        format!("tls.cert_file=\"{}\"", server.cert.display()),
        format!("tls.key_file=\"{}\"", server.key.display()),
        "pgwire.tls=\"on\"".to_string(),
        "nic.mode=\"mem\"".to_string(),
        "nic.ip=\"10.0.0.2\"".to_string(),
        "resp.listen=\"0.0.0.0:6379\"".to_string(),
    ];
    let e = Config::load(None, Vec::<(String, String)>::new(), &sets).expect_err("refused");
    let text = e.to_string();
    assert!(
        text.contains("nic.mode") && text.contains("kernel sockets only"),
        "{text}"
    );
    // Without a certificate, asking for TLS names the missing key.
    let e = Config::load(
        None,
        Vec::<(String, String)>::new(),
        &["pgwire.tls=\"required\"".to_string()],
    )
    .expect_err("refused");
    assert!(e.to_string().contains("tls.cert_file"), "{e}");
    // A key others can read is refused.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&server.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Config::load(None, Vec::<(String, String)>::new(), &sets[..3]).expect_err("refused");
    assert!(e.to_string().contains("readable by group or others"), "{e}");
    // A key that is not the certificate's.
    let other = ca.server("other", &["localhost"], Validity::Current);
    let mismatched = [
        sets[0].clone(),
        format!("tls.key_file=\"{}\"", other.key.display()),
        sets[2].clone(),
    ];
    let e = Config::load(None, Vec::<(String, String)>::new(), &mismatched).expect_err("refused");
    assert!(e.to_string().contains("do not belong together"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
