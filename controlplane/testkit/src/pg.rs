//! A raw PostgreSQL protocol 3.0 client, for tests that compare bytes with the origin's or
//! send what a driver would not: messages are composed with `postgres-protocol`'s frontend
//! encoders and read back whole, as (tag, body), unparsed.
//!
//! [`Login`] answers the authentication requests of one login (SCRAM-SHA-256 with the
//! server's signature verified, or cleartext) over any transport; [`Wire`] is that client on
//! a TCP connection. This is the tests' one SCRAM client: pgline itself relays authentication
//! to the origin and has no SCRAM of its own to borrow.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::origin::origin_base;

/// How long [`Wire`] waits for a message a test expects before failing it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The bytes `f` composes (with `postgres_protocol::message::frontend`'s encoders).
pub fn msgs(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
    let mut b = BytesMut::new();
    f(&mut b);
    b.to_vec()
}

/// Splits complete backend messages into (tag, body); panics on a partial trailing message.
pub fn frames(mut b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while b.len() >= 5 {
        let len = u32::from_be_bytes(b[1..5].try_into().unwrap()) as usize;
        out.push((b[0], b[5..1 + len].to_vec()));
        b = &b[1 + len..];
    }
    assert!(b.is_empty(), "trailing bytes");
    out
}

/// Field `code` (`b'C'` for the SQLSTATE, `b'M'` for the message, `b'S'` for the severity)
/// of an ErrorResponse or NoticeResponse body.
pub fn error_field(body: &[u8], code: u8) -> Option<String> {
    body.split(|&b| b == 0)
        .find(|f| f.first() == Some(&code))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
}

/// Appends a Bind of the unnamed portal to `stmt` with text parameters and text results (no
/// format codes: all text).
pub fn bind_text(b: &mut BytesMut, stmt: &str, params: &[&str]) {
    frontend::bind(
        "",
        stmt,
        std::iter::empty::<i16>(),
        params.iter(),
        |p, buf| {
            buf.extend_from_slice(p.as_bytes());
            Ok(postgres_protocol::IsNull::No)
        },
        std::iter::empty::<i16>(),
        b,
    )
    .unwrap_or_else(|_| panic!("bind of {stmt:?}"));
}

/// The client side of one login's authentication exchange.
pub struct Login {
    password: String,
    scram: Option<ScramSha256>,
    verified: bool,
}

impl Login {
    pub fn new(password: &str) -> Login {
        Login {
            password: password.to_owned(),
            scram: None,
            verified: false,
        }
    }

    /// The reply to the body of one Authentication (`R`) message; empty when none is due
    /// (AuthenticationOk, or SASLFinal, whose server signature is checked here). Panics on a
    /// method the tests do not use, or a SCRAM step out of order.
    pub fn answer(&mut self, body: &[u8]) -> Vec<u8> {
        let code = i32::from_be_bytes(body[..4].try_into().expect("authentication code"));
        match code {
            0 => Vec::new(),
            3 => msgs(|b| frontend::password_message(self.password.as_bytes(), b).unwrap()),
            10 => {
                let s = ScramSha256::new(self.password.as_bytes(), ChannelBinding::unsupported());
                let m = msgs(|b| {
                    frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), b).unwrap()
                });
                self.scram = Some(s);
                m
            }
            11 => {
                let s = self.scram.as_mut().expect("SASLContinue before SASL");
                s.update(&body[4..]).expect("server-first-message");
                msgs(|b| frontend::sasl_response(s.message(), b).unwrap())
            }
            12 => {
                let s = self.scram.as_mut().expect("SASLFinal before SASL");
                s.finish(&body[4..])
                    .expect("the server's SCRAM signature verifies");
                self.verified = true;
                Vec::new()
            }
            other => panic!("authentication method {other} is not one the tests use"),
        }
    }

    /// Whether the login is complete from the client's side: no SCRAM exchange, or one whose
    /// server signature was verified.
    pub fn done(&self) -> bool {
        self.scram.is_none() || self.verified
    }
}

/// A raw protocol 3.0 connection over TCP: whole backend messages as (tag, body).
pub struct Wire {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Wire {
    /// Connects and sends a StartupMessage with `params`, nothing more.
    pub async fn startup(addr: SocketAddr, params: &[(&str, &str)]) -> Wire {
        let s = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        s.set_nodelay(true).unwrap();
        let mut w = Wire { s, buf: Vec::new() };
        let m = msgs(|b| frontend::startup_message(params.iter().copied(), b).unwrap());
        w.send(&m).await;
        w
    }

    /// Logs in to `db` as `user` with `password` (and `extra` startup parameters), up to
    /// the first ReadyForQuery; panics if the server refuses.
    pub async fn login(
        addr: SocketAddr,
        user: &str,
        password: &str,
        db: &str,
        extra: &[(&str, &str)],
    ) -> Wire {
        let mut params = vec![("user", user), ("database", db)];
        params.extend_from_slice(extra);
        let mut w = Wire::startup(addr, &params).await;
        let mut login = Login::new(password);
        loop {
            let (tag, body) = w.next().await;
            match tag {
                b'R' => {
                    let reply = login.answer(&body);
                    if !reply.is_empty() {
                        w.send(&reply).await;
                    }
                }
                b'E' => panic!("login refused: {}", String::from_utf8_lossy(&body)),
                b'Z' => {
                    assert!(
                        login.done(),
                        "ReadyForQuery before the SCRAM exchange ended"
                    );
                    return w;
                }
                _ => {}
            }
        }
    }

    /// Logs in to `db` as the lab origin's user, with `extra` startup parameters.
    pub async fn connect(addr: SocketAddr, db: &str, extra: &[(&str, &str)]) -> Wire {
        let (_, _, user, password) = origin_base();
        Wire::login(addr, &user, &password, db, extra).await
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.expect("write");
    }

    /// The next message, `None` on EOF (or a reset) or after `wait`.
    pub async fn message(&mut self, wait: Duration) -> Option<(u8, Vec<u8>)> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let m: Vec<u8> = self.buf.drain(..1 + len).collect();
                    return Some((m[0], m[5..].to_vec()));
                }
            }
            let mut chunk = [0u8; 64 * 1024];
            match tokio::time::timeout_at(until, self.s.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => self.buf.extend_from_slice(&chunk[..n]),
                _ => return None,
            }
        }
    }

    /// The next message; panics if none comes within [`PATIENCE`].
    pub async fn next(&mut self) -> (u8, Vec<u8>) {
        self.message(PATIENCE)
            .await
            .unwrap_or_else(|| panic!("no message within {PATIENCE:?} (or the server closed)"))
    }

    /// Sends `m` and returns every message up to and including ReadyForQuery.
    pub async fn exchange(&mut self, m: &[u8]) -> Vec<(u8, Vec<u8>)> {
        self.send(m).await;
        let mut got = Vec::new();
        loop {
            let msg = self.next().await;
            let done = msg.0 == b'Z';
            got.push(msg);
            if done {
                return got;
            }
        }
    }

    /// [`Wire::exchange`], the reply as the bytes that came (for byte-for-byte comparison).
    pub async fn exchange_bytes(&mut self, m: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (tag, body) in self.exchange(m).await {
            out.push(tag);
            out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
            out.extend_from_slice(&body);
        }
        out
    }

    /// A simple query's raw reply, up to ReadyForQuery.
    pub async fn simple(&mut self, sql: &str) -> Vec<u8> {
        self.exchange_bytes(&msgs(|b| frontend::query(sql, b).unwrap()))
            .await
    }

    /// Unnamed Parse, Bind of text parameters (text results), Describe portal (if
    /// `describe`), Execute, Sync: the raw reply, up to ReadyForQuery.
    pub async fn extended(&mut self, sql: &str, params: &[&str], describe: bool) -> Vec<u8> {
        let m = msgs(|b| {
            frontend::parse("", sql, std::iter::empty(), b).unwrap();
            bind_text(b, "", params);
            if describe {
                frontend::describe(b'P', "", b).unwrap();
            }
            frontend::execute("", 0, b).unwrap();
            frontend::sync(b);
        });
        self.exchange_bytes(&m).await
    }
}
