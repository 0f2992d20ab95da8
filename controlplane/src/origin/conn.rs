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

use super::{open_stream, OriginAddr, OriginStream};

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
    /// Opens a connection to `addr` (`timeout`: none means the system's), with a read buffer
    /// of `buffer` bytes to start with.
    pub async fn open(
        addr: &OriginAddr,
        timeout: Option<Duration>,
        buffer: usize,
    ) -> io::Result<OriginConn> {
        let stream = open_stream(addr, timeout).await?;
        Ok(OriginConn {
            stream,
            rbuf: BytesMut::with_capacity(buffer),
        })
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
    /// (EOF, reset). A non-blocking `MSG_PEEK` on the socket, so that input the runtime has not
    /// been told about yet is seen too.
    pub fn unusable(&self) -> bool {
        if !self.rbuf.is_empty() {
            return true;
        }
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        // The socket is non-blocking (tokio's): nothing pending is WouldBlock.
        match socket2::SockRef::from(&self.stream).peek(&mut probe) {
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            Ok(_) => true,
        }
    }
}
