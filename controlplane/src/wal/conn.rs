//! A streaming-replication connection to the origin, spoken directly over a tokio `TcpStream`.
//!
//! Purpose: open a `replication=database` session, authenticate (cleartext, MD5 or
//! SCRAM-SHA-256), run replication commands (`IDENTIFY_SYSTEM`, `START_REPLICATION ... LOGICAL`)
//! (pgoutput protocol chosen from the server's version, `streaming 'on'` from protocol 2)
//! and then exchange CopyBoth sub-messages: `XLogData`/keepalives in, Standby Status Updates out.
//! `tokio-postgres` has no replication API, so this module speaks the protocol itself over the
//! origin connector ([`crate::origin`]: connection, framing, login) and writes frontend messages
//! with `postgres_protocol`. Backend bodies are decoded here because
//! `postgres_protocol::message::backend::Message` has no `CopyBothResponse`.
//!
//! Invariants:
//! - A backend frame larger than [`crate::origin::MAX_FRAME`] is a protocol error (bounded
//!   buffering).
//! - [`ReplicationConn::recv`] is cancel-safe: bytes read so far stay in the connection's read
//!   buffer, so it can sit in a `tokio::select!` next to timers and a shutdown signal.
//! - All LSNs are plain `u64`; all timestamps on the wire are microseconds since 2000-01-01.
//!
//! Thread model: one task owns a connection; nothing is shared.
//!
//! Limitations: TCP only (a Unix-socket host is skipped), no TLS (`sslmode` is ignored: the
//! origin link is the management network), first host that accepts wins.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::message::frontend;

use super::WalError;
use crate::clock::{unix_now_us, PG_EPOCH_UNIX_US};
use crate::lsn::{format_lsn, parse_lsn};
use crate::origin::{self, Credentials, FrameError, LoginError, OriginConn};

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

/// Where timeline `tli` ended, according to a later timeline's history file `history` (the
/// content of [`ReplicationConn::timeline_history`]): WAL of `tli` past this LSN does not exist
/// on the later timeline. `None` if `tli` is not one of its ancestors. Comment and blank lines
/// are skipped.
pub fn switch_point(history: &str, tli: u32) -> Option<u64> {
    history.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let parent: u32 = fields.next()?.parse().ok()?;
        let lsn = parse_lsn(fields.next()?)?;
        (parent == tli).then_some(lsn)
    })
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

impl From<FrameError> for WalError {
    fn from(e: FrameError) -> WalError {
        match e {
            FrameError::Closed => WalError::Closed,
            FrameError::Io(e) => WalError::Io(e),
            other => WalError::Protocol(other.to_string()),
        }
    }
}

impl From<LoginError> for WalError {
    fn from(e: LoginError) -> WalError {
        match e {
            LoginError::Frame(e) => e.into(),
            LoginError::Refused {
                severity,
                code,
                message,
            } => WalError::Server {
                severity,
                code,
                message,
            },
            LoginError::Auth(m) => WalError::Auth(m),
            LoginError::Protocol(m) => WalError::Protocol(m),
        }
    }
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
    conn: OriginConn,
    wbuf: BytesMut,
    streaming: bool,
    /// Major version from the login's `server_version` (None if absent or unparseable).
    server_major: Option<u32>,
    /// pgoutput protocol of the running `START_REPLICATION` (0 before it).
    proto_version: u32,
}

/// The highest pgoutput protocol a server of this major version speaks (16+ → 4, 15 → 3,
/// 14 → 2, older or unknown → 1).
pub fn max_proto_version(server_major: Option<u32>) -> u32 {
    match server_major {
        Some(m) if m >= 16 => 4,
        Some(15) => 3,
        Some(14) => 2,
        _ => 1,
    }
}

/// Whether an 0A000 error text is pgoutput refusing a too-high `proto_version`: "client sent
/// proto_version=N but we only support protocol M or lower" (PostgreSQL 14-15), "... but server
/// only supports protocol M or lower" (16+).
fn refuses_proto_version(message: &str) -> bool {
    message.contains("proto_version")
        && (message.contains("only support protocol") || message.contains("only supports protocol"))
}

/// The major version in a `server_version` string ("15.18 (Debian …)", "18.6", "9.6.24").
pub fn parse_server_major(version: &str) -> Option<u32> {
    let digits: String = version.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

impl ReplicationConn {
    /// Connects and authenticates with the settings of `origin` (hosts, ports, TLS, user,
    /// password, dbname, application_name, options, connect_timeout), on the first host with
    /// its `target_session_attrs` (see [`origin::connect`]).
    pub async fn connect(origin: &origin::Settings) -> Result<ReplicationConn, WalError> {
        let config = &origin.pg;
        let user = config
            .get_user()
            .ok_or_else(|| WalError::Config("no user".into()))?
            .to_owned();
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
        let mut startup = BytesMut::new();
        frontend::startup_message(params, &mut startup)?;
        let who = Credentials {
            user: &user,
            password: config.get_password(),
        };
        let timeout = config.get_connect_timeout().copied();
        let (conn, logged_in, _) = origin::connect(origin, timeout, &startup, who, 64 * 1024)
            .await
            .map_err(|e| match e {
                origin::ConnectError::Open { addr, source } => WalError::Connect {
                    addr: addr.to_string(),
                    source,
                },
                origin::ConnectError::Login { source, .. } => source.into(),
                // None of the hosts is the primary yet (a failover in progress): retryable.
                e @ origin::ConnectError::NoMatch(..) => WalError::Connect {
                    addr: "origin".into(),
                    source: std::io::Error::other(e.to_string()),
                },
                e @ origin::ConnectError::NoHost => WalError::Config(e.to_string()),
            })?;
        Ok(ReplicationConn {
            conn,
            wbuf: BytesMut::with_capacity(1024),
            streaming: false,
            server_major: logged_in
                .params
                .iter()
                .find(|(k, _)| k == "server_version")
                .and_then(|(_, v)| parse_server_major(v)),
            proto_version: 0,
        })
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

    /// The origin's major version, from the login's `server_version`.
    pub fn server_major(&self) -> Option<u32> {
        self.server_major
    }

    /// The pgoutput protocol of the running stream (0 before [`start_logical`](Self::start_logical)).
    pub fn proto_version(&self) -> u32 {
        self.proto_version
    }

    /// `TIMELINE_HISTORY tli`: the content of timeline `tli`'s history file (one line per
    /// ancestor timeline: `parent_tli<TAB>switch_lsn<TAB>reason`). See [`switch_point`].
    pub async fn timeline_history(&mut self, tli: u32) -> Result<String, WalError> {
        let rows = self
            .simple_query(&format!("TIMELINE_HISTORY {tli}"))
            .await?;
        let content = rows
            .first()
            .and_then(|r| r.get(1).cloned().flatten())
            .ok_or_else(|| WalError::Protocol("TIMELINE_HISTORY returned no content".into()))?;
        Ok(content)
    }

    /// Starts logical streaming from `slot` for `publication`, at `start_lsn` (0 means "from
    /// the slot's confirmed position"), with the highest pgoutput protocol the server's version
    /// implies ([`max_proto_version`]) and `streaming 'on'` from protocol 2 (never `parallel`).
    /// If the server answers that it only supports a lower protocol, it retries one lower.
    /// On success the connection is in CopyBoth mode: use [`recv`](Self::recv) and
    /// [`send_status`](Self::send_status).
    pub async fn start_logical(
        &mut self,
        slot: &str,
        publication: &str,
        start_lsn: u64,
    ) -> Result<(), WalError> {
        let proto = max_proto_version(self.server_major);
        self.start_logical_with(slot, publication, start_lsn, proto)
            .await
    }

    /// [`start_logical`](Self::start_logical) asking first for protocol `proto` (at least 1),
    /// then one lower each time the server says it only supports a lower one.
    pub async fn start_logical_with(
        &mut self,
        slot: &str,
        publication: &str,
        start_lsn: u64,
        proto: u32,
    ) -> Result<(), WalError> {
        if slot.contains('\0') || publication.contains('\0') {
            return Err(WalError::Config(
                "NUL byte in slot or publication name".into(),
            ));
        }
        let mut proto = proto.max(1);
        loop {
            match self.try_start(slot, publication, start_lsn, proto).await {
                Err(WalError::Server { code, message, .. })
                    if proto > 1 && code == "0A000" && refuses_proto_version(&message) =>
                {
                    tracing::info!(proto, %message, "origin refused the pgoutput protocol; trying one lower");
                    proto -= 1;
                }
                other => {
                    if other.is_ok() {
                        self.proto_version = proto;
                    }
                    return other;
                }
            }
        }
    }

    async fn try_start(
        &mut self,
        slot: &str,
        publication: &str,
        start_lsn: u64,
        proto: u32,
    ) -> Result<(), WalError> {
        let streaming = if proto >= 2 { ", streaming 'on'" } else { "" };
        let sql = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '{proto}', publication_names {}{streaming})",
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
        self.conn.write_all(&self.wbuf).await?;
        self.wbuf.clear();
        Ok(())
    }

    /// Reads one whole backend message (cancel-safe: partial input stays in the connection's
    /// buffer).
    async fn read_message(&mut self) -> Result<Backend, WalError> {
        let frame = self.conn.read_frame().await?;
        parse_backend(frame[0], frame.slice(5..))
    }
}

fn parse_backend(tag: u8, body: Bytes) -> Result<Backend, WalError> {
    Ok(match tag {
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
    let (severity, code, message) = origin::error_fields(body);
    ServerMessage {
        severity,
        code,
        message,
    }
}

fn parse_data_row(body: Bytes) -> Result<Vec<Option<Bytes>>, WalError> {
    let cols =
        origin::data_row(&body).ok_or_else(|| WalError::Protocol("malformed DataRow".into()))?;
    Ok(cols
        .into_iter()
        .map(|c| c.map(|c| body.slice_ref(c)))
        .collect())
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
    fn protocol_from_server_version() {
        let major = |v: &str| parse_server_major(v);
        assert_eq!(major("15.18 (Debian 15.18-1.pgdg120+1)"), Some(15));
        assert_eq!(major("18.6"), Some(18));
        assert_eq!(major("9.6.24"), Some(9));
        assert_eq!(major("17beta1"), Some(17));
        assert_eq!(major("devel"), None);
        let proto = |v: &str| max_proto_version(major(v));
        assert_eq!(
            [
                proto("18.6"),
                proto("16.1"),
                proto("15.4"),
                proto("14.2"),
                proto("13.9")
            ],
            [4, 4, 3, 2, 1]
        );
        assert_eq!(max_proto_version(None), 1);
    }

    #[test]
    fn protocol_refusals_of_each_version_are_recognised() {
        assert!(refuses_proto_version(
            "client sent proto_version=9 but we only support protocol 3 or lower"
        ));
        assert!(refuses_proto_version(
            "client sent proto_version=9 but server only supports protocol 4 or lower"
        ));
        assert!(!refuses_proto_version(
            "requested proto_version=1 does not support streaming, need 2 or higher"
        ));
    }

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

    #[test]
    fn timeline_switch_points() {
        let h = "1\t0/3000A58\tno recovery target specified\n\n2\t0/5000000\tbefore 2000-01-01\n";
        assert_eq!(switch_point(h, 1), Some(0x3000A58));
        assert_eq!(switch_point(h, 2), Some(0x5000000));
        assert_eq!(switch_point(h, 3), None);
        assert_eq!(switch_point("garbage\n1 nonsense\n", 1), None);
        assert_eq!(switch_point("", 1), None);
    }
}
