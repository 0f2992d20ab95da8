//! TLS on pgline's RESP front, Redis's way: a `resp.tls_listen` port beside the plaintext one,
//! driven by the real `redis-cli --tls` (Debian redis-tools 7) and redis-py with `ssl=True`;
//! `resp.tls_auth_clients = yes` requires a client certificate from `tls.client_ca_file`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use pgline_controlplane::config::TlsAuthClients;
use pgline_controlplane::server::Pgline;
use pgline_testkit::pki::{Ca, Issued, Validity};
use pgline_testkit::{lab, TestDb};

const SCHEMA: &str = "
CREATE TABLE users (id int8 PRIMARY KEY, name text NOT NULL);
INSERT INTO users SELECT g, 'user ' || g FROM generate_series(1, 20) g;
";

fn pki_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgline-resptls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn start(db: &TestDb, server: &Issued, ca: &Ca, auth: TlsAuthClients) -> Arc<Pgline> {
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(db, 2);
    cfg.tls.cert_file = server.cert.display().to_string();
    cfg.tls.key_file = server.key.display().to_string();
    cfg.tls.client_ca_file = ca.cert.display().to_string();
    cfg.resp.tls_listen = "127.0.0.1:0".into();
    cfg.resp.tls_auth_clients = auth;
    cfg.validate().expect("the TLS config validates");
    lab::start(cfg).await
}

/// `redis-cli --tls` against the TLS port with `extra` arguments; (success, stdout+stderr).
async fn redis_cli(p: &Pgline, ca: &Ca, extra: &[String], command: &[&str]) -> (bool, String) {
    let port = p.tls_addr().expect("the RESP TLS listener is on").port();
    let mut cmd = Command::new("redis-cli");
    cmd.args(["--tls", "--cacert"])
        .arg(&ca.cert)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(extra)
        .args(command);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run redis-cli"))
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_and_redis_py_get_rows_over_tls() {
    let db = TestDb::create("resptls_get").await;
    let dir = pki_dir("get");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let server = ca.server("server", &["localhost", "127.0.0.1"], Validity::Current);
    let p = start(&db, &server, &ca, TlsAuthClients::No).await;
    for _ in 0..2 {
        let (ok, out) = redis_cli(&p, &ca, &[], &["GET", "users:7"]).await;
        assert!(ok, "{out}");
        assert!(out.contains("\"name\":\"user 7\""), "{out}");
    }
    assert!(
        p.shared.total(|s| &s.keys_hit) >= 1,
        "the second GET is a hit"
    );
    // Plaintext RESP on the TLS port gets no answer: the bytes are not a ClientHello.
    let port = p.tls_addr().unwrap().port();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "PING"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("PONG"));
    // The plaintext port still serves.
    let mut plain = lab::redis(&p).await;
    let v: String = redis::cmd("GET")
        .arg("users:3")
        .query_async(&mut plain)
        .await
        .unwrap();
    assert!(v.contains("user 3"), "{v}");
    assert!(p.shared.total(|s| &s.tls_handshakes) >= 2);
    assert!(p.shared.total(|s| &s.tls_handshake_failures) >= 1);

    // redis-py with ssl=True, when the lab venv has it.
    let python = lab::python_venv();
    match python {
        None => {
            eprintln!("redis-py: the lab venv (deploy/lab/pgwire_venv.sh) is unavailable: skipped")
        }
        Some(python) => {
            let script = format!(
                "import redis\n\
                 r = redis.Redis(host='localhost', port={port}, ssl=True, ssl_ca_certs='{}')\n\
                 print(r.get('users:11').decode())\n",
                ca.cert.display()
            );
            let out = tokio::task::spawn_blocking(move || {
                Command::new(python).arg("-c").arg(script).output().unwrap()
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "redis-py: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("\"name\":\"user 11\""));
        }
    }
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_clients_yes_needs_a_certificate_from_the_client_ca() {
    let db = TestDb::create("resptls_mtls").await;
    let dir = pki_dir("mtls");
    let ca = Ca::new(&dir, "ca", "pgline test CA");
    let server = ca.server("server", &["localhost", "127.0.0.1"], Validity::Current);
    let client = ca.client("client", "app", Validity::Current);
    let other_ca = Ca::new(&dir, "other", "another CA");
    let stranger = other_ca.client("stranger", "app", Validity::Current);
    let p = start(&db, &server, &ca, TlsAuthClients::Yes).await;
    let with = |c: &Issued| {
        vec![
            "--cert".to_string(),
            c.cert.display().to_string(),
            "--key".to_string(),
            c.key.display().to_string(),
        ]
    };
    let (ok, out) = redis_cli(&p, &ca, &with(&client), &["GET", "users:2"]).await;
    assert!(ok && out.contains("\"name\":\"user 2\""), "{out}");
    let failures = p.shared.total(|s| &s.tls_handshake_failures);
    let (_, out) = redis_cli(&p, &ca, &[], &["GET", "users:2"]).await;
    assert!(!out.contains("user 2"), "no certificate, no row: {out}");
    let (_, out) = redis_cli(&p, &ca, &with(&stranger), &["GET", "users:2"]).await;
    assert!(
        !out.contains("user 2"),
        "a certificate of another CA: {out}"
    );
    assert!(
        p.shared.total(|s| &s.tls_handshake_failures) >= failures + 2,
        "both refusals counted"
    );
    p.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
