//! One origin connection: its stream, its read buffer, and the framing of backend messages.
//!
//! Invariants: [`OriginConn::read_frame`] returns whole messages (tag, length word, body) and
//! nothing longer than [`MAX_FRAME`]; it is cancel-safe, since bytes read so far stay in
//! `rbuf`. The split is `pgline_dataplane::pgwire::split_frame`, the codec's own.

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pgline_dataplane::pgwire;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{open_stream, OriginAddr, OriginStream, OriginTls};

/// Largest backend message accepted, tag included (a row can be up to 1 GiB; leave room for
/// headers).
pub const MAX_FRAME: usize = (1 << 30) + (1 << 20);

/// Why no backend message could be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The origin closed the connection.
    #[error("the origin closed the connection")]
    Closed,
    /// A message claims more than [`MAX_FRAME`] bytes.
    #[error("backend frame too large")]
    TooLarge,
    /// A length word below 4.
    #[error("invalid message length: header length < 4")]
    BadLength,
    /// Reading the socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<FrameError> for io::Error {
    fn from(e: FrameError) -> io::Error {
        match e {
            FrameError::Closed => io::ErrorKind::UnexpectedEof.into(),
            FrameError::TooLarge => io::Error::other("backend frame too large"),
            FrameError::BadLength => io::Error::new(
                io::ErrorKind::InvalidInput,
                "invalid message length: header length < 4",
            ),
            FrameError::Io(e) => e,
        }
    }
}

/// An open connection to the origin (not logged in by itself: see [`super::login`]).
pub struct OriginConn {
    stream: OriginStream,
    rbuf: BytesMut,
}

impl OriginConn {
    /// Opens a connection to `addr` (`timeout`: none means the system's), encrypted as `tls`
    /// says, with a read buffer of `buffer` bytes to start with.
    pub async fn open(
        addr: &OriginAddr,
        timeout: Option<Duration>,
        tls: &OriginTls,
        buffer: usize,
    ) -> io::Result<OriginConn> {
        let stream = open_stream(addr, timeout, tls).await?;
        Ok(OriginConn {
            stream,
            rbuf: BytesMut::with_capacity(buffer),
        })
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.stream.is_tls()
    }

    /// The TLS version and cipher suite (`None`: not encrypted).
    pub fn tls_summary(&self) -> Option<String> {
        self.stream.tls_summary()
    }

    /// Writes all of `bytes`.
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// One whole backend message, tag and length word included. Cancel-safe.
    pub async fn read_frame(&mut self) -> Result<Bytes, FrameError> {
        loop {
            match pgwire::split_frame(&self.rbuf, MAX_FRAME - 1) {
                Ok(Some((_, total))) => return Ok(self.rbuf.split_to(total).freeze()),
                Ok(None) => {}
                Err(pgwire::Invalid::TooLarge) => return Err(FrameError::TooLarge),
                Err(_) => return Err(FrameError::BadLength),
            }
            if let Some(total) = pgwire::frame_len(&self.rbuf) {
                self.rbuf.reserve(total.saturating_sub(self.rbuf.len()));
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(FrameError::Closed);
            }
        }
    }

    /// Reads whatever comes next (at most 16 bytes; 0 is the end of the stream) within
    /// `timeout`: for a CancelRequest, which the origin answers by closing the connection once
    /// it signalled the backend.
    pub async fn read_some(&mut self, timeout: Duration) -> io::Result<usize> {
        let mut sink = [0u8; 16];
        tokio::time::timeout(timeout, self.stream.read(&mut sink))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
    }

    /// Whether this idle connection has something to read nobody asked for, or was closed
    /// (EOF, reset). For plain TCP: the runtime's readiness first, which costs no system call
    /// (the last read of a reply was short, so tokio cleared it; its I/O driver polls at every
    /// turn of the core that hosts this connection), then, only if it reports input, a
    /// `MSG_PEEK` to tell input from a stale flag. A close the driver has not reported yet is
    /// missed, as a close arriving just after the peek was before. Under TLS the bytes are
    /// taken and handed to the TLS session, since TLS records that carry no data (session
    /// tickets, key updates) are no reason to drop the connection; data is (and is kept in
    /// the read buffer), and so is the origin's close_notify.
    pub fn unusable(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return true;
        }
        match &mut self.stream {
            OriginStream::Plain(tcp) => {
                // A no-op waker: nobody waits here; the next read registers its own.
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                if tcp.poll_read_ready(&mut cx).is_pending() {
                    return false;
                }
                let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
                // The socket is non-blocking (tokio's): nothing pending is WouldBlock.
                match socket2::SockRef::from(&*tcp).peek(&mut probe) {
                    Err(e) => e.kind() != io::ErrorKind::WouldBlock,
                    Ok(_) => true,
                }
            }
            OriginStream::Tls(tls) => tls_unusable(tls, &mut self.rbuf),
        }
    }
}

/// Most socket reads one [`OriginConn::unusable`] check makes under TLS.
const TLS_PROBE_READS: usize = 4;

/// [`OriginConn::unusable`] for a TLS stream: feeds what the socket holds to the session.
fn tls_unusable(
    tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    rbuf: &mut BytesMut,
) -> bool {
    use std::io::Read as _;
    let (tcp, session) = tls.get_mut();
    let sock = socket2::SockRef::from(&*tcp);
    for _ in 0..TLS_PROBE_READS {
        // The socket is non-blocking (tokio's): nothing pending is WouldBlock.
        match session.read_tls(&mut &*sock) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(_) | Ok(0) => return true,
            Ok(_) => {}
        }
        let state = match session.process_new_packets() {
            Ok(s) => s,
            Err(_) => return true,
        };
        if state.peer_has_closed() {
            return true;
        }
        let pending = state.plaintext_bytes_to_read();
        if pending > 0 {
            let mut plain = vec![0u8; pending];
            if let Ok(k) = session.reader().read(&mut plain) {
                rbuf.extend_from_slice(&plain[..k]);
            }
            return true;
        }
    }
    false
}
