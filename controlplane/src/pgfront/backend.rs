//! One origin connection of the relay: raw protocol 3.0 over a tokio `TcpStream`, framed with
//! `postgres_protocol`'s backend `Header`.
//!
//! Invariants: a frame larger than [`MAX_FRAME`] is a protocol error; `prepared` holds the
//! statement names (`pgl_...`) this connection has (see `plan`).
//!
//! Thread model: owned by one session task at a time (or idle in its pool).

use std::collections::HashSet;
use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use postgres_protocol::message::{backend::Header, frontend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use crate::wal::conn::MAX_FRAME;

/// Where the origin listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginAddr {
    pub host: String,
    pub port: u16,
}

/// An origin connection.
pub struct Backend {
    stream: TcpStream,
    rbuf: BytesMut,
    /// The origin's own BackendKeyData (for cancel).
    pub pid: i32,
    pub secret: i32,
    /// Backend statement names this connection has prepared.
    pub prepared: HashSet<String>,
}

impl Backend {
    /// Opens a TCP connection to the origin (no startup yet).
    pub async fn connect(addr: &OriginAddr, timeout: Duration) -> io::Result<Backend> {
        let stream = open(addr, timeout).await?;
        Ok(Backend {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            pid: 0,
            secret: 0,
            prepared: HashSet::new(),
        })
    }

    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// One whole backend message, tag and length word included.
    pub async fn read_frame(&mut self) -> io::Result<Bytes> {
        loop {
            if let Some(header) = Header::parse(&self.rbuf)? {
                let total = usize::try_from(header.len())
                    .ok()
                    .and_then(|l| l.checked_add(1))
                    .filter(|&t| t <= MAX_FRAME)
                    .ok_or_else(|| io::Error::other("backend frame too large"))?;
                if self.rbuf.len() >= total {
                    return Ok(self.rbuf.split_to(total).freeze());
                }
                self.rbuf.reserve(total - self.rbuf.len());
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Runs pgline's own simple query; `Ok(Some(first column of the first row))` on success,
    /// `Ok(None)` when the origin answered with an error (the connection is still usable).
    pub async fn simple(&mut self, sql: &str) -> io::Result<Option<Option<String>>> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf)?;
        self.write(&buf).await?;
        self.read_simple().await
    }

    /// Reads one simple query's replies up to ReadyForQuery (see [`Backend::simple`]).
    pub async fn read_simple(&mut self) -> io::Result<Option<Option<String>>> {
        let mut first = None;
        let mut failed = false;
        loop {
            let f = self.read_frame().await?;
            match f[0] {
                b'D' if first.is_none() => first = Some(first_text(&f)),
                b'E' => failed = true,
                b'G' => {
                    let mut buf = BytesMut::new();
                    frontend::copy_fail("pgline: no COPY data", &mut buf)?;
                    self.write(&buf).await?;
                }
                b'Z' => return Ok((!failed).then(|| first.flatten())),
                _ => {}
            }
        }
    }

    /// Says goodbye (best effort).
    pub async fn terminate(mut self) {
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        let _ = self.write(&buf).await;
    }
}

/// The text of a DataRow's first column.
fn first_text(frame: &[u8]) -> Option<String> {
    let body = frame.get(5..)?;
    let len = i32::from_be_bytes(body.get(2..6)?.try_into().ok()?);
    let text = body.get(6..6 + usize::try_from(len).ok()?)?;
    Some(String::from_utf8_lossy(text).into_owned())
}

async fn open(addr: &OriginAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect((addr.host.as_str(), addr.port)))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends a CancelRequest for the origin backend `(pid, secret)` on a new connection.
pub async fn send_cancel(
    addr: &OriginAddr,
    timeout: Duration,
    pid: i32,
    secret: i32,
) -> io::Result<()> {
    let mut stream = open(addr, timeout).await?;
    let mut buf = BytesMut::new();
    frontend::cancel_request(pid, secret, &mut buf);
    stream.write_all(&buf).await?;
    // The origin closes the connection once it has read the request.
    let mut sink = [0u8; 16];
    let _ = tokio::time::timeout(timeout, stream.read(&mut sink)).await;
    Ok(())
}

/// A complete backend message: `tag`, length word, body.
pub fn compose_message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(5 + body.len());
    m.push(tag);
    m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// An ErrorResponse with severity, SQLSTATE and message.
pub fn compose_error(severity: &str, code: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in [
        (b'S', severity),
        (b'V', severity),
        (b'C', code),
        (b'M', message),
    ] {
        body.push(k);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    compose_message(b'E', &body)
}

/// ReadyForQuery with `status`.
pub fn compose_ready(status: u8) -> Vec<u8> {
    compose_message(b'Z', &[status])
}
