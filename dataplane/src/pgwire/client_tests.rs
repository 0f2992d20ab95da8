//! Real clients against a tiny in-test server built only on this codec: tokio-postgres
//! (simple and extended query, trust and a cleartext password, a wrong password) and `psql`.
//!
//! The server is blocking std networking, one thread per connection. It answers the startup,
//! lets user `trust` in and asks any other user for the password in clear text (pgline itself
//! never authenticates clients: the relay hands the origin's own exchange through), and serves
//! one fixed statement, `SELECT 42 AS answer` (int4), in text or binary; anything else gets
//! ERROR 42601.

use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

const PASSWORD: &[u8] = b"pgline-secret";
const ANSWER: &[u8] = b"SELECT 42 AS answer";

/// Reads until one message parses; returns it as owned bytes to keep borrows simple.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Conn {
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    fn flush(&mut self) {
        let _ = self.stream.write_all(&self.out);
        self.out.clear();
    }

    /// Runs `f` on the next complete frontend message; `None` when the peer is gone.
    fn next<T>(&mut self, f: impl Fn(Frontend<'_>) -> T) -> Option<T> {
        loop {
            match parse_frontend(&self.buf, &Limits::default()) {
                Ok((msg, n)) => {
                    let t = f(msg);
                    self.buf.drain(..n);
                    return Some(t);
                }
                Err(ParseError::Incomplete) => {
                    if !self.fill() {
                        return None;
                    }
                }
                Err(ParseError::Invalid(k)) => panic!("client sent invalid message: {k:?}"),
            }
        }
    }

    fn next_password(&mut self) -> Option<Vec<u8>> {
        self.next(|m| match m {
            Frontend::Password(body) => body.to_vec(),
            other => panic!("expected a password message, got {other:?}"),
        })
    }
}

/// Startup: returns the user name, or `None` if the connection ended (cancel, bad auth).
fn startup(c: &mut Conn) -> Option<Vec<u8>> {
    loop {
        let parsed = parse_startup(&c.buf, &Limits::default());
        let (user, n) = match parsed {
            Err(ParseError::Incomplete) => {
                if !c.fill() {
                    return None;
                }
                continue;
            }
            Err(ParseError::Invalid(k)) => panic!("bad startup {k:?}"),
            Ok((Startup::SslRequest | Startup::GssEncRequest, n)) => {
                compose_ssl_response(&mut c.out, false);
                (None, n)
            }
            Ok((Startup::Cancel { .. }, _)) => return None,
            Ok((Startup::Startup(m), n)) => (Some(m.user().to_vec()), n),
        };
        c.buf.drain(..n);
        c.flush();
        if let Some(user) = user {
            return Some(user);
        }
    }
}

fn authenticate(c: &mut Conn, user: &[u8]) -> Option<bool> {
    let mut ok = true;
    if user != b"trust" {
        compose_auth_cleartext(&mut c.out);
        c.flush();
        let body = c.next_password()?;
        ok = parse_password_message(&body) == Ok(PASSWORD);
    }
    if !ok {
        let e = ErrorFields::fatal(
            sqlstate::INVALID_PASSWORD,
            b"password authentication failed for user",
        );
        compose_error_response(&mut c.out, &e);
    }
    if ok {
        compose_auth_ok(&mut c.out);
        for (k, v) in [
            (&b"server_version"[..], &b"15.0"[..]),
            (b"server_encoding", b"UTF8"),
            (b"client_encoding", b"UTF8"),
            (b"DateStyle", b"ISO, MDY"),
            (b"integer_datetimes", b"on"),
            (b"standard_conforming_strings", b"on"),
        ] {
            compose_parameter_status(&mut c.out, k, v);
        }
        compose_backend_key_data(&mut c.out, 4242, 0x5eed);
        compose_ready_for_query(&mut c.out, TxStatus::Idle);
    }
    c.flush();
    Some(ok)
}

fn answer_field(format: Format) -> FieldDescription<'static> {
    FieldDescription {
        name: b"answer",
        table_oid: 0,
        column_id: 0,
        type_oid: 23,
        type_size: 4,
        type_modifier: -1,
        format,
    }
}

fn compose_answer_row(out: &mut Vec<u8>, format: Format) {
    match format {
        Format::Text => compose_data_row(out, &[Some(b"42")]),
        Format::Binary => compose_data_row(out, &[Some(&42i32.to_be_bytes())]),
    }
}

/// What the server does for one message; owned so the input buffer can be drained.
enum Action {
    Simple(Vec<u8>),
    Parse(bool),
    Bind(Format),
    Describe(Target),
    Execute,
    Sync,
    Close,
    Terminate,
    Other,
}

fn serve(stream: TcpStream) {
    let mut c = Conn {
        stream,
        buf: Vec::new(),
        out: Vec::new(),
    };
    let Some(user) = startup(&mut c) else { return };
    if authenticate(&mut c, &user) != Some(true) {
        return;
    }
    let (mut known, mut format, mut failed) = (false, Format::Text, false);
    while let Some(action) = c.next(|m| match m {
        Frontend::Query(q) => Action::Simple(q.to_vec()),
        Frontend::Parse { query, .. } => Action::Parse(query == ANSWER),
        Frontend::Bind(b) => Action::Bind(b.result_format(0)),
        Frontend::Describe { target, .. } => Action::Describe(target),
        Frontend::Execute { .. } => Action::Execute,
        Frontend::Sync => Action::Sync,
        Frontend::Close { .. } => Action::Close,
        Frontend::Terminate => Action::Terminate,
        _ => Action::Other,
    }) {
        let ends_batch = matches!(action, Action::Simple(_) | Action::Sync);
        let out = &mut c.out;
        let syntax = ErrorFields::error(b"42601", b"only SELECT 42 AS answer is served here");
        match action {
            Action::Simple(q) if q.trim_ascii().is_empty() => compose_empty_query_response(out),
            Action::Simple(q) if q == ANSWER => {
                compose_row_description(out, &[answer_field(Format::Text)]);
                compose_answer_row(out, Format::Text);
                compose_select_complete(out, 1);
            }
            Action::Simple(_) => compose_error_response(out, &syntax),
            _ if failed && !matches!(action, Action::Sync | Action::Terminate) => {}
            Action::Parse(true) => {
                known = true;
                compose_parse_complete(out);
            }
            Action::Parse(false) => {
                failed = true;
                compose_error_response(out, &syntax);
            }
            Action::Bind(f) => {
                format = f;
                compose_bind_complete(out);
            }
            Action::Describe(Target::Statement) => {
                compose_parameter_description(out, &[]);
                compose_row_description(out, &[answer_field(Format::Text)]);
            }
            Action::Describe(Target::Portal) => {
                compose_row_description(out, &[answer_field(format)]);
            }
            Action::Execute if known => {
                compose_answer_row(out, format);
                compose_select_complete(out, 1);
            }
            Action::Execute => compose_no_data(out),
            Action::Close => compose_close_complete(out),
            Action::Sync => failed = false,
            Action::Terminate => return,
            Action::Other => compose_error_response(
                out,
                &ErrorFields::error(sqlstate::FEATURE_NOT_SUPPORTED, b"not supported"),
            ),
        }
        if ends_batch {
            compose_ready_for_query(&mut c.out, TxStatus::Idle);
            c.flush();
        }
    }
}

/// Starts the server on an ephemeral port; returns the port.
fn start_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream));
        }
    });
    port
}

fn connect_string(port: u16, user: &str, password: &str) -> String {
    format!("host=127.0.0.1 port={port} user={user} password={password} dbname=db sslmode=disable")
}

async fn tokio_connect(
    port: u16,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) =
        tokio_postgres::connect(&connect_string(port, user, password), tokio_postgres::NoTls)
            .await?;
    tokio::spawn(conn);
    Ok(client)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn tokio_postgres_simple_and_extended_with_trust_and_password() {
    let port = start_server();
    runtime().block_on(async {
        for user in ["trust", "password"] {
            let pw = std::str::from_utf8(PASSWORD).expect("ascii");
            let client = tokio_connect(port, user, pw).await.expect(user);
            // extended protocol, binary result
            let rows = client
                .query("SELECT 42 AS answer", &[])
                .await
                .expect("query");
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].columns()[0].name(), "answer");
            assert_eq!(rows[0].get::<_, i32>(0), 42);
            // simple protocol, text result
            let msgs = client
                .simple_query("SELECT 42 AS answer")
                .await
                .expect("simple");
            let texts: Vec<_> = msgs
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
                .collect();
            assert_eq!(texts, ["42"]);
            // an error carries its SQLSTATE, and the session goes on
            let err = client.simple_query("SELECT 1").await.expect_err("refused");
            assert_eq!(err.code().map(|c| c.code()), Some("42601"));
            let stmt = client
                .prepare("SELECT 42 AS answer")
                .await
                .expect("prepare");
            assert_eq!(
                client
                    .query_one(&stmt, &[])
                    .await
                    .expect("one")
                    .get::<_, i32>(0),
                42
            );
        }
    });
}

#[test]
fn wrong_password_is_28p01() {
    let port = start_server();
    runtime().block_on(async {
        for user in ["password"] {
            let Err(err) = tokio_connect(port, user, "not-the-password").await else {
                panic!("{user}: a wrong password was accepted");
            };
            assert_eq!(
                err.code(),
                Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD),
                "{user}: {err}"
            );
        }
    });
}

#[test]
fn psql_runs_the_query() {
    let port = start_server();
    for user in ["trust", "password"] {
        let out = std::process::Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={port} user={user} dbname=db sslmode=prefer gssencmode=prefer"
            ))
            .args(["-X", "-A", "-t", "-c", "SELECT 42 AS answer"])
            .env("PGPASSWORD", std::str::from_utf8(PASSWORD).expect("ascii"))
            .output()
            .expect("psql is installed (deploy/lab/packages.txt)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{user}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42", "{user}");
    }
}
