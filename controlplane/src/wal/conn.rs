//! A streaming-replication connection to the origin, spoken directly over a tokio `TcpStream`.
//!
//! Purpose: open a `replication=database` session, authenticate (cleartext, MD5 or
//! SCRAM-SHA-256), run replication commands (`IDENTIFY_SYSTEM`, `START_REPLICATION ... LOGICAL`)
//! and then exchange CopyBoth sub-messages: `XLogData`/keepalives in, Standby Status Updates out.
//! `tokio-postgres` has no replication API, so this module frames messages itself with
//! `postgres_protocol` (frontend messages, backend `Header`, SCRAM/MD5 helpers). Backend bodies
//! are decoded here because `postgres_protocol::message::backend::Message` has no
//! `CopyBothResponse`.
//!
//! Invariants:
//! - A backend frame larger than [`MAX_FRAME`] is a protocol error (bounded buffering).
//! - [`ReplicationConn::recv`] is cancel-safe: bytes read so far stay in the connection's read
//!   buffer, so it can sit in a `tokio::select!` next to timers and a shutdown signal.
//! - All LSNs are plain `u64`; all timestamps on the wire are microseconds since 2000-01-01.
//!
//! Thread model: one task owns a connection; nothing is shared.
//!
//! Limitations: TCP only (a Unix-socket host is skipped), no TLS (`sslmode` is ignored: the
//! origin link is the management network), first host that accepts wins.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::{backend::Header, frontend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::config::Host;

use super::WalError;
use crate::clock::{unix_now_us, PG_EPOCH_UNIX_US};
use crate::lsn::{format_lsn, parse_lsn};

/// Largest backend frame accepted (a row can be up to 1 GiB; leave room for headers).
pub const MAX_FRAME: usize = (1 << 30) + (1 << 20);

/// Quotes an SQL identifier (`my"slot` becomes `"my""slot"`).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The answer to `IDENTIFY_SYSTEM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemInfo {
    pub system_id: String,
    pub timeline: u32,
    pub xlogpos: u64,
    pub dbname: Option<String>,
}

/// One CopyBoth message from the server while streaming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationEvent {
    /// WAL data: for a logical slot, one output-plugin message.
    XLogData {
        wal_start: u64,
        wal_end: u64,
        data: Bytes,
    },
    /// Primary keepalive: the server has sent everything up to `wal_end`.
    Keepalive {
        wal_end: u64,
        /// Microseconds since 2000-01-01.
        server_time_us: i64,
        reply_requested: bool,
    },
}

/// Severity, SQLSTATE and message of an `ErrorResponse` or `NoticeResponse`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ServerMessage {
    severity: String,
    code: String,
    message: String,
}

impl From<ServerMessage> for WalError {
    fn from(m: ServerMessage) -> WalError {
        WalError::Server {
            severity: m.severity,
            code: m.code,
            message: m.message,
        }
    }
}

/// The backend messages this module understands; bodies are slices of the frame.
enum Backend {
    Auth(i32, Bytes),
    ReadyForQuery,
    Error(ServerMessage),
    Notice(ServerMessage),
    DataRow(Vec<Option<Bytes>>),
    CopyBoth,
    CopyData(Bytes),
    CopyDone,
    /// Messages that need no action here (ParameterStatus, BackendKeyData, RowDescription,
    /// CommandComplete, EmptyQueryResponse, NotificationResponse).
    Ignored,
    Other(u8),
}

/// An open replication session.
pub struct ReplicationConn {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    streaming: bool,
}

impl ReplicationConn {
    /// Connects and authenticates with the settings of `config` (hosts, ports, user, password,
    /// dbname, application_name, options, connect_timeout).
    pub async fn connect(config: &tokio_postgres::Config) -> Result<ReplicationConn, WalError> {
        let user = config
            .get_user()
            .ok_or_else(|| WalError::Config("no user".into()))?
            .to_owned();
        let stream = open_tcp(config).await?;
        let mut conn = ReplicationConn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(1024),
            streaming: false,
        };
        let dbname = config.get_dbname().unwrap_or(&user).to_owned();
        let app = config.get_application_name().unwrap_or("pgline-wal");
        let mut params = vec![
            ("user", user.as_str()),
            ("database", dbname.as_str()),
            ("replication", "database"),
            ("application_name", app),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("extra_float_digits", "1"),
            ("TimeZone", "UTC"),
            ("IntervalStyle", "postgres"),
        ];
        if let Some(options) = config.get_options() {
            params.push(("options", options));
        }
        frontend::startup_message(params, &mut conn.wbuf)?;
        conn.flush().await?;
        conn.authenticate(&user, config.get_password()).await?;
        conn.wait_ready().await?;
        Ok(conn)
    }

    async fn authenticate(&mut self, user: &str, password: Option<&[u8]>) -> Result<(), WalError> {
        let need_pw = || password.ok_or_else(|| WalError::Auth("password required".into()));
        let mut scram: Option<sasl::ScramSha256> = None;
        loop {
            let (code, body) = match self.read_message().await? {
                Backend::Auth(code, body) => (code, body),
                Backend::Error(e) => return Err(e.into()),
                Backend::Notice(n) => {
                    log_notice(&n);
                    continue;
                }
                other => return Err(unexpected("authentication", &other)),
            };
            match code {
                0 => return Ok(()),
                3 => frontend::password_message(need_pw()?, &mut self.wbuf)?,
                5 => {
                    let salt: [u8; 4] = body
                        .get(..4)
                        .and_then(|s| s.try_into().ok())
                        .ok_or_else(|| WalError::Protocol("short MD5 salt".into()))?;
                    let hash = md5_hash(user.as_bytes(), need_pw()?, salt);
                    frontend::password_message(hash.as_bytes(), &mut self.wbuf)?;
                }
                10 => {
                    let offers_scram = body
                        .split(|&b| b == 0)
                        .any(|m| m == sasl::SCRAM_SHA_256.as_bytes());
                    if !offers_scram {
                        return Err(WalError::Auth("server offers no SCRAM-SHA-256".into()));
                    }
                    let s = sasl::ScramSha256::new(need_pw()?, sasl::ChannelBinding::unsupported());
                    frontend::sasl_initial_response(
                        sasl::SCRAM_SHA_256,
                        s.message(),
                        &mut self.wbuf,
                    )?;
                    scram = Some(s);
                }
                11 | 12 => {
                    let s = scram.as_mut().ok_or_else(|| {
                        WalError::Protocol("SASL message before SASL start".into())
                    })?;
                    if code == 11 {
                        s.update(&body).map_err(|e| WalError::Auth(e.to_string()))?;
                        frontend::sasl_response(s.message(), &mut self.wbuf)?;
                    } else {
                        s.finish(&body).map_err(|e| WalError::Auth(e.to_string()))?;
                        continue;
                    }
                }
                other => {
                    return Err(WalError::Auth(format!(
                        "unsupported authentication request {other}"
                    )))
                }
            }
            self.flush().await?;
        }
    }

    /// Reads until `ReadyForQuery`; an `ErrorResponse` before it is returned as the error.
    async fn wait_ready(&mut self) -> Result<(), WalError> {
        let mut error = None;
        loop {
            match self.read_message().await? {
                Backend::ReadyForQuery => {
                    return error.map_or(Ok(()), |e: ServerMessage| Err(e.into()))
                }
                Backend::Error(e) => error = Some(e),
                Backend::Notice(n) => log_notice(&n),
                Backend::Ignored | Backend::DataRow(_) => {}
                other => return Err(unexpected("startup", &other)),
            }
        }
    }

    /// Runs a replication command or simple query and returns its rows as text.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, WalError> {
        if self.streaming {
            return Err(WalError::Protocol("simple_query while streaming".into()));
        }
        frontend::query(sql, &mut self.wbuf)?;
        self.flush().await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.read_message().await? {
                Backend::DataRow(cols) => rows.push(
                    cols.into_iter()
                        .map(|c| c.map(|b| String::from_utf8_lossy(&b).into_owned()))
                        .collect(),
                ),
                Backend::ReadyForQuery => {
                    return error.map_or(Ok(rows), |e: ServerMessage| Err(e.into()))
                }
                Backend::Error(e) => error = Some(e),
                Backend::Notice(n) => log_notice(&n),
                Backend::Ignored => {}
                other => return Err(unexpected("simple query", &other)),
            }
        }
    }

    /// `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<SystemInfo, WalError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = rows
            .first()
            .filter(|r| r.len() >= 4)
            .ok_or_else(|| WalError::Protocol("IDENTIFY_SYSTEM returned no row".into()))?;
        let bad = |what: &str| WalError::Protocol(format!("IDENTIFY_SYSTEM: bad {what}"));
        Ok(SystemInfo {
            system_id: row[0].clone().ok_or_else(|| bad("systemid"))?,
            timeline: row[1]
                .as_deref()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| bad("timeline"))?,
            xlogpos: row[2]
                .as_deref()
                .and_then(parse_lsn)
                .ok_or_else(|| bad("xlogpos"))?,
            dbname: row[3].clone(),
        })
    }

    /// Starts logical streaming from `slot` with pgoutput protocol 1 for `publication`, at
    /// `start_lsn` (0 means "from the slot's confirmed position"). On success the connection is
    /// in CopyBoth mode: use [`recv`](Self::recv) and [`send_status`](Self::send_status).
    pub async fn start_logical(
        &mut self,
        slot: &str,
        publication: &str,
        start_lsn: u64,
    ) -> Result<(), WalError> {
        if slot.contains('\0') || publication.contains('\0') {
            return Err(WalError::Config(
                "NUL byte in slot or publication name".into(),
            ));
        }
        let sql = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {})",
            quote_ident(slot),
            format_lsn(start_lsn),
            quote_literal(&quote_ident(publication)),
        );
        frontend::query(&sql, &mut self.wbuf)?;
        self.flush().await?;
        loop {
            match self.read_message().await? {
                Backend::CopyBoth => {
                    self.streaming = true;
                    return Ok(());
                }
                Backend::Error(e) => {
                    // Drain to ReadyForQuery so the error is the whole story.
                    let _ = self.wait_ready().await;
                    return Err(e.into());
                }
                Backend::Notice(n) => log_notice(&n),
                Backend::Ignored => {}
                other => return Err(unexpected("START_REPLICATION", &other)),
            }
        }
    }

    /// The next CopyBoth message. Cancel-safe. Notices are logged and skipped; an
    /// `ErrorResponse` or the end of the stream is an error.
    pub async fn recv(&mut self) -> Result<ReplicationEvent, WalError> {
        if !self.streaming {
            return Err(WalError::Protocol("recv before start_logical".into()));
        }
        loop {
            match self.read_message().await? {
                Backend::CopyData(d) => return parse_copy_data(d),
                Backend::Notice(n) => log_notice(&n),
                Backend::Error(e) => return Err(e.into()),
                Backend::CopyDone => return Err(WalError::Closed),
                Backend::Ignored => {}
                other => return Err(unexpected("streaming", &other)),
            }
        }
    }

    /// Sends a Standby Status Update (`'r'`). For a logical slot the server moves the slot's
    /// `confirmed_flush_lsn` to `flush`, so pass only what has been applied there.
    pub async fn send_status(
        &mut self,
        write: u64,
        flush: u64,
        apply: u64,
        reply_requested: bool,
    ) -> Result<(), WalError> {
        let mut payload = [0u8; 34];
        let mut p = &mut payload[..];
        p.put_u8(b'r');
        p.put_u64(write);
        p.put_u64(flush);
        p.put_u64(apply);
        p.put_i64(unix_now_us() - PG_EPOCH_UNIX_US);
        p.put_u8(u8::from(reply_requested));
        frontend::CopyData::new(&payload[..])?.write(&mut self.wbuf);
        self.flush().await
    }

    async fn flush(&mut self) -> Result<(), WalError> {
        self.stream.write_all(&self.wbuf).await?;
        self.wbuf.clear();
        Ok(())
    }

    /// Reads one whole backend message (cancel-safe: partial input stays in `rbuf`).
    async fn read_message(&mut self) -> Result<Backend, WalError> {
        loop {
            if let Some(header) = Header::parse(&self.rbuf)? {
                let total = usize::try_from(header.len())
                    .ok()
                    .and_then(|l| l.checked_add(1))
                    .filter(|&t| t <= MAX_FRAME)
                    .ok_or_else(|| WalError::Protocol("backend frame too large".into()))?;
                if self.rbuf.len() >= total {
                    let frame = self.rbuf.split_to(total).freeze();
                    return parse_backend(header.tag(), frame.slice(5..));
                }
                self.rbuf.reserve(total - self.rbuf.len());
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(WalError::Closed);
            }
        }
    }
}

/// Opens a TCP connection to the first reachable TCP host of `config`.
async fn open_tcp(config: &tokio_postgres::Config) -> Result<TcpStream, WalError> {
    let ports = config.get_ports();
    let mut last = WalError::Config("no TCP host in origin config".into());
    for (i, host) in config.get_hosts().iter().enumerate() {
        let Host::Tcp(name) = host else { continue };
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let addr = format!("{name}:{port}");
        let attempt = TcpStream::connect((name.as_str(), port));
        let result = match config.get_connect_timeout() {
            Some(t) => tokio::time::timeout(*t, attempt)
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
            None => attempt.await,
        };
        match result {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(source) => last = WalError::Connect { addr, source },
        }
    }
    Err(last)
}

fn parse_backend(tag: u8, mut body: Bytes) -> Result<Backend, WalError> {
    Ok(match tag {
        b'R' => {
            if body.len() < 4 {
                return Err(WalError::Protocol("short authentication message".into()));
            }
            let code = body.get_i32();
            Backend::Auth(code, body)
        }
        b'Z' => Backend::ReadyForQuery,
        b'E' => Backend::Error(parse_fields(&body)),
        b'N' => Backend::Notice(parse_fields(&body)),
        b'D' => Backend::DataRow(parse_data_row(body)?),
        b'W' => Backend::CopyBoth,
        b'd' => Backend::CopyData(body),
        b'c' => Backend::CopyDone,
        b'S' | b'K' | b'T' | b'C' | b'I' | b'A' => Backend::Ignored,
        other => Backend::Other(other),
    })
}

/// Fields of an ErrorResponse/NoticeResponse; malformed trailing bytes are ignored.
fn parse_fields(body: &[u8]) -> ServerMessage {
    let mut m = ServerMessage::default();
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]).into_owned();
        match kind {
            b'V' => m.severity = value,
            b'S' if m.severity.is_empty() => m.severity = value,
            b'C' => m.code = value,
            b'M' => m.message = value,
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or(&[]);
    }
    m
}

fn parse_data_row(mut body: Bytes) -> Result<Vec<Option<Bytes>>, WalError> {
    let short = || WalError::Protocol("malformed DataRow".into());
    if body.len() < 2 {
        return Err(short());
    }
    let n = body.get_i16();
    let mut cols = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(body.len() / 4));
    for _ in 0..n {
        if body.len() < 4 {
            return Err(short());
        }
        let len = body.get_i32();
        if len < 0 {
            cols.push(None);
            continue;
        }
        let len = usize::try_from(len).map_err(|_| short())?;
        if body.len() < len {
            return Err(short());
        }
        cols.push(Some(body.split_to(len)));
    }
    Ok(cols)
}

/// Decodes a CopyData payload received while streaming.
fn parse_copy_data(mut d: Bytes) -> Result<ReplicationEvent, WalError> {
    let short = |what: &str| WalError::Protocol(format!("short {what} message"));
    match d.first() {
        Some(b'w') => {
            if d.len() < 25 {
                return Err(short("XLogData"));
            }
            d.advance(1);
            let wal_start = d.get_u64();
            let wal_end = d.get_u64();
            let _server_time = d.get_i64();
            Ok(ReplicationEvent::XLogData {
                wal_start,
                wal_end,
                data: d,
            })
        }
        Some(b'k') => {
            if d.len() < 18 {
                return Err(short("keepalive"));
            }
            d.advance(1);
            Ok(ReplicationEvent::Keepalive {
                wal_end: d.get_u64(),
                server_time_us: d.get_i64(),
                reply_requested: d.get_u8() == 1,
            })
        }
        Some(&other) => Err(WalError::Protocol(format!(
            "unknown CopyData message {:?}",
            char::from(other)
        ))),
        None => Err(short("CopyData")),
    }
}

fn log_notice(n: &ServerMessage) {
    tracing::info!(severity = %n.severity, code = %n.code, "origin notice: {}", n.message);
}

fn unexpected(during: &str, msg: &Backend) -> WalError {
    let tag = match msg {
        Backend::Other(t) => char::from(*t).to_string(),
        Backend::Auth(..) => "R".into(),
        Backend::CopyData(_) => "d".into(),
        Backend::CopyBoth => "W".into(),
        Backend::CopyDone => "c".into(),
        Backend::DataRow(_) => "D".into(),
        Backend::ReadyForQuery => "Z".into(),
        _ => "?".into(),
    };
    WalError::Protocol(format!("unexpected message '{tag}' during {during}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal(&quote_ident("it's")), "'\"it''s\"'");
    }

    #[test]
    fn copy_data_messages() {
        let mut w = vec![b'w'];
        w.extend_from_slice(&1u64.to_be_bytes());
        w.extend_from_slice(&2u64.to_be_bytes());
        w.extend_from_slice(&3i64.to_be_bytes());
        w.extend_from_slice(b"xyz");
        assert_eq!(
            parse_copy_data(Bytes::from(w)).ok(),
            Some(ReplicationEvent::XLogData {
                wal_start: 1,
                wal_end: 2,
                data: Bytes::from_static(b"xyz")
            })
        );
        let mut k = vec![b'k'];
        k.extend_from_slice(&9u64.to_be_bytes());
        k.extend_from_slice(&8i64.to_be_bytes());
        k.push(1);
        assert_eq!(
            parse_copy_data(Bytes::from(k.clone())).ok(),
            Some(ReplicationEvent::Keepalive {
                wal_end: 9,
                server_time_us: 8,
                reply_requested: true
            })
        );
        assert!(parse_copy_data(Bytes::from(k[..10].to_vec())).is_err());
        assert!(parse_copy_data(Bytes::new()).is_err());
        assert!(parse_copy_data(Bytes::from_static(b"q")).is_err());
    }

    #[test]
    fn error_fields_and_data_rows() {
        let m = parse_fields(b"SERROR\0VERROR\0C42704\0Mslot \"x\" does not exist\0\0");
        assert_eq!(m.severity, "ERROR");
        assert_eq!(m.code, "42704");
        assert_eq!(m.message, "slot \"x\" does not exist");
        // Unterminated input does not panic.
        let _ = parse_fields(b"Cabc");

        let mut row = Vec::new();
        row.extend_from_slice(&2i16.to_be_bytes());
        row.extend_from_slice(&(-1i32).to_be_bytes());
        row.extend_from_slice(&2i32.to_be_bytes());
        row.extend_from_slice(b"hi");
        let cols = parse_data_row(Bytes::from(row.clone())).ok();
        assert_eq!(cols, Some(vec![None, Some(Bytes::from_static(b"hi"))]));
        assert!(parse_data_row(Bytes::from(row[..row.len() - 1].to_vec())).is_err());
    }
}
