//! A raw RESP client: sends bytes as given and reads whole frames back, unparsed, for tests
//! that check replies byte for byte or send what a driver would not.

use std::time::Duration;

use pgline_controlplane::server::Pgline;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a [`Raw`] read waits before failing the test.
const RAW_TIMEOUT: Duration = Duration::from_secs(10);

/// A plain TCP connection that sends raw bytes and reads whole RESP frames, unparsed.
pub struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    pub async fn connect(p: &Pgline) -> Raw {
        let s = TcpStream::connect(p.local_addr()).await.expect("connect");
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new() }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.expect("write");
    }

    /// Reads more bytes into the buffer; false on EOF (or a reset).
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(RAW_TIMEOUT, self.s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => panic!(
                "no reply within {RAW_TIMEOUT:?}; buffered {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    /// One complete RESP2/RESP3 frame, as sent.
    pub async fn frame(&mut self) -> Vec<u8> {
        loop {
            if let Some(n) = frame_len(&self.buf) {
                return self.buf.drain(..n).collect();
            }
            assert!(
                self.fill().await,
                "connection closed mid-frame: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    /// Exactly `n` bytes.
    pub async fn bytes(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(
                self.fill().await,
                "connection closed after {} of {n} bytes",
                self.buf.len()
            );
        }
        self.buf.drain(..n).collect()
    }

    /// Sends one command and returns its reply frame.
    pub async fn cmd(&mut self, args: &[&str]) -> Vec<u8> {
        self.send(&encode(args)).await;
        self.frame().await
    }

    /// Whatever arrives until the peer closes; panics if it stays open.
    pub async fn until_closed(&mut self) -> Vec<u8> {
        while self.fill().await {}
        std::mem::take(&mut self.buf)
    }
}

pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Length of the complete frame at the start of `b`, or `None` if it is not complete yet.
pub fn frame_len(b: &[u8]) -> Option<usize> {
    let line_end = b.windows(2).position(|w| w == b"\r\n")?;
    let after = line_end + 2;
    let head = std::str::from_utf8(&b[1..line_end]).ok();
    let num = || -> i64 { head.and_then(|h| h.parse().ok()).expect("frame length") };
    match b[0] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(after),
        b'$' | b'=' | b'!' => {
            let n = num();
            if n < 0 {
                return Some(after);
            }
            let end = after + n as usize + 2;
            (b.len() >= end).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = num();
            let items = if matches!(b[0], b'%' | b'|') {
                2 * n
            } else {
                n
            };
            let mut at = after;
            for _ in 0..items.max(0) {
                at += frame_len(&b[at..])?;
            }
            Some(at)
        }
        other => panic!("not a RESP frame type: {:?}", other as char),
    }
}

pub fn bulk(s: &str) -> Vec<u8> {
    format!("${}\r\n{s}\r\n", s.len()).into_bytes()
}

pub fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
