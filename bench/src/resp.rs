//! A minimal RESP2 client: compose commands into one write buffer, read replies in order.
//!
//! The load path never builds reply values: [`scan_reply`] walks one reply in place and counts
//! found and nil elements (a GET's bulk string or an MGET's array), so a pipelined batch costs
//! one `write` and as few `read`s as the kernel allows. [`parse_value`] builds owned values for
//! the control uses (INFO, stale check, cache-aside fills).
//!
//! Why not the `redis` crate: its multiplexed connection routes every reply through a channel
//! and a task, and builds a `Value` per reply; this client is what `redis-benchmark` does,
//! so the generator is not the bound (see bench/README.md for the measurement).
//!
//! # Thread model
//! A [`RespConn`] is owned by one task.
//!
//! # Limitations
//! RESP2 only (no HELLO 3); pushes, maps and other RESP3 types are refused as `Invalid`, except
//! the RESP3 null `_` which some servers send.

#![deny(unsafe_code)]

use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX_DEPTH: usize = 4;

/// Why a reply could not be parsed or read.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// Socket error.
    #[error("resp i/o: {0}")]
    Io(#[from] io::Error),
    /// The server closed the connection.
    #[error("resp: connection closed by server")]
    Closed,
    /// The bytes are not a RESP2 reply this client understands.
    #[error("resp: invalid reply ({0})")]
    Invalid(&'static str),
    /// The server answered with an error reply.
    #[error("resp: server error: {0}")]
    Server(String),
}

/// An owned reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `$-1`, `*-1` or `_`.
    Nil,
    /// A bulk string.
    Bulk(Vec<u8>),
    /// `+...`.
    Simple(String),
    /// `:n`.
    Int(i64),
    /// `-...`.
    Error(String),
    /// `*n` followed by n replies.
    Array(Vec<Value>),
}

/// What one reply held, for the load path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyTally {
    /// Non-nil bulk strings (a GET hit or each found MGET element).
    pub found: u32,
    /// Nil bulk strings.
    pub nil: u32,
    /// The reply (or an element of it) was an error.
    pub error: bool,
}

/// Parses one line (without CRLF) at the start of `buf`: `(line, bytes consumed)`.
fn parse_line(buf: &[u8]) -> Option<(&[u8], usize)> {
    let at = memchr_crlf(buf)?;
    Some((&buf[..at], at + 2))
}

fn memchr_crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = memchr::memchr(b'\r', &buf[from..]) {
        let at = from + i;
        match buf.get(at + 1) {
            Some(b'\n') => return Some(at),
            Some(_) => from = at + 1,
            None => return None,
        }
    }
    None
}

fn parse_int(s: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(RespError::Invalid("bad integer"))
}

/// Walks one reply at the start of `buf`; `Ok(None)` if it is incomplete.
pub fn scan_reply(buf: &[u8]) -> Result<Option<(ReplyTally, usize)>, RespError> {
    let mut t = ReplyTally::default();
    Ok(scan_into(buf, 0, &mut t)?.map(|n| (t, n)))
}

fn scan_into(buf: &[u8], depth: usize, t: &mut ReplyTally) -> Result<Option<usize>, RespError> {
    let Some((line, mut used)) = parse_line(buf) else {
        return Ok(None);
    };
    let (&kind, rest) = line.split_first().ok_or(RespError::Invalid("empty line"))?;
    match kind {
        b'+' | b':' => {}
        b'-' => t.error = true,
        b'_' => t.nil += 1,
        b'$' => {
            let len = parse_int(rest)?;
            if len < 0 {
                t.nil += 1;
            } else {
                let need = used + len as usize + 2;
                if buf.len() < need {
                    return Ok(None);
                }
                t.found += 1;
                used = need;
            }
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                t.nil += 1;
            } else if depth >= MAX_DEPTH {
                return Err(RespError::Invalid("nested too deep"));
            } else {
                for _ in 0..n {
                    match scan_into(&buf[used..], depth + 1, t)? {
                        Some(k) => used += k,
                        None => return Ok(None),
                    }
                }
            }
        }
        _ => return Err(RespError::Invalid("unknown type byte")),
    }
    Ok(Some(used))
}

/// Parses one reply at the start of `buf` into an owned value; `Ok(None)` if incomplete.
pub fn parse_value(buf: &[u8]) -> Result<Option<(Value, usize)>, RespError> {
    parse_value_at(buf, 0)
}

fn parse_value_at(buf: &[u8], depth: usize) -> Result<Option<(Value, usize)>, RespError> {
    let Some((line, used)) = parse_line(buf) else {
        return Ok(None);
    };
    let (&kind, rest) = line.split_first().ok_or(RespError::Invalid("empty line"))?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    let v = match kind {
        b'+' => Value::Simple(text()),
        b'-' => Value::Error(text()),
        b':' => Value::Int(parse_int(rest)?),
        b'_' => Value::Nil,
        b'$' => {
            let len = parse_int(rest)?;
            if len < 0 {
                Value::Nil
            } else {
                let end = used + len as usize;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                return Ok(Some((Value::Bulk(buf[used..end].to_vec()), end + 2)));
            }
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                Value::Nil
            } else if depth >= MAX_DEPTH {
                return Err(RespError::Invalid("nested too deep"));
            } else {
                let mut items = Vec::with_capacity(n.min(1024) as usize);
                let mut at = used;
                for _ in 0..n {
                    match parse_value_at(&buf[at..], depth + 1)? {
                        Some((v, k)) => {
                            items.push(v);
                            at += k;
                        }
                        None => return Ok(None),
                    }
                }
                return Ok(Some((Value::Array(items), at)));
            }
        }
        _ => return Err(RespError::Invalid("unknown type byte")),
    };
    Ok(Some((v, used)))
}

/// Appends `*n` and each argument as a bulk string to `out`.
pub fn compose_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    let mut num = itoa::Buffer::new();
    out.push(b'*');
    out.extend_from_slice(num.format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(num.format(a.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends `GET <prefix><id>` (`ids.len() == 1`, `mget == false`) or `MGET <prefix><id>...`.
pub fn compose_get(out: &mut Vec<u8>, prefix: &[u8], ids: &[u64], mget: bool) {
    let mut num = itoa::Buffer::new();
    let mut idbuf = itoa::Buffer::new();
    let argc = ids.len() + 1;
    out.push(b'*');
    out.extend_from_slice(num.format(argc).as_bytes());
    out.extend_from_slice(if mget {
        b"\r\n$4\r\nMGET\r\n"
    } else {
        b"\r\n$3\r\nGET\r\n"
    });
    for &id in ids {
        let digits = idbuf.format(id).as_bytes();
        out.push(b'$');
        out.extend_from_slice(num.format(prefix.len() + digits.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(prefix);
        out.extend_from_slice(digits);
        out.extend_from_slice(b"\r\n");
    }
}

/// One connection to a RESP server.
pub struct RespConn {
    stream: TcpStream,
    /// Commands composed but not yet written.
    pub wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    rpos: usize,
}

impl RespConn {
    /// Connects (TCP_NODELAY on).
    pub async fn connect(addr: &str) -> Result<Self, RespError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RespConn {
            stream,
            wbuf: Vec::with_capacity(16 * 1024),
            rbuf: Vec::with_capacity(64 * 1024),
            rpos: 0,
        })
    }

    /// Writes every composed command.
    pub async fn flush(&mut self) -> Result<(), RespError> {
        self.stream.write_all(&self.wbuf).await?;
        self.wbuf.clear();
        Ok(())
    }

    async fn fill(&mut self) -> Result<(), RespError> {
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        } else if self.rpos > 32 * 1024 {
            self.rbuf.drain(..self.rpos);
            self.rpos = 0;
        }
        self.rbuf.reserve(64 * 1024);
        if self.stream.read_buf(&mut self.rbuf).await? == 0 {
            return Err(RespError::Closed);
        }
        Ok(())
    }

    /// Reads the next reply and tallies it.
    pub async fn read_tally(&mut self) -> Result<ReplyTally, RespError> {
        loop {
            if let Some((t, n)) = scan_reply(&self.rbuf[self.rpos..])? {
                self.rpos += n;
                return Ok(t);
            }
            self.fill().await?;
        }
    }

    /// Reads the next reply as a value.
    pub async fn read_value(&mut self) -> Result<Value, RespError> {
        loop {
            if let Some((v, n)) = parse_value(&self.rbuf[self.rpos..])? {
                self.rpos += n;
                return Ok(v);
            }
            self.fill().await?;
        }
    }

    /// Sends one command and returns its reply (an error reply becomes `Err(Server)`).
    pub async fn command(&mut self, args: &[&[u8]]) -> Result<Value, RespError> {
        compose_command(&mut self.wbuf, args);
        self.flush().await?;
        match self.read_value().await? {
            Value::Error(e) => Err(RespError::Server(e)),
            v => Ok(v),
        }
    }
}

/// The value of `field` in an INFO text (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_get_and_mget() {
        let mut out = Vec::new();
        compose_get(&mut out, b"t:", &[42], false);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$4\r\nt:42\r\n");
        out.clear();
        compose_get(&mut out, b"t:", &[0, 1000], true);
        assert_eq!(out, b"*3\r\n$4\r\nMGET\r\n$3\r\nt:0\r\n$6\r\nt:1000\r\n");
        out.clear();
        compose_command(&mut out, &[b"SET", b"k", b"v v"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv v\r\n");
    }

    #[test]
    fn scan_counts_found_nil_and_errors() {
        let mget = b"*3\r\n$2\r\n{}\r\n$-1\r\n$5\r\nab\r\nc\r\nrest";
        let (t, n) = scan_reply(mget).unwrap().unwrap();
        assert_eq!(
            t,
            ReplyTally {
                found: 2,
                nil: 1,
                error: false
            }
        );
        assert_eq!(&mget[n..], b"rest");
        let (t, _) = scan_reply(b"-ERR no\r\n").unwrap().unwrap();
        assert!(t.error);
        let (t, n) = scan_reply(b"_\r\n").unwrap().unwrap();
        assert_eq!((t.nil, n), (1, 3));
        assert_eq!(scan_reply(b"$-1\r\n").unwrap().unwrap().0.nil, 1);
        assert_eq!(scan_reply(b":7\r\n").unwrap().unwrap().1, 4);
    }

    #[test]
    fn incomplete_replies_wait_for_more_bytes() {
        let full = b"*2\r\n$3\r\nabc\r\n$-1\r\n";
        for cut in 0..full.len() {
            assert!(scan_reply(&full[..cut]).unwrap().is_none(), "cut {cut}");
            assert!(parse_value(&full[..cut]).unwrap().is_none(), "cut {cut}");
        }
        let (v, n) = parse_value(full).unwrap().unwrap();
        assert_eq!(n, full.len());
        assert_eq!(
            v,
            Value::Array(vec![Value::Bulk(b"abc".to_vec()), Value::Nil])
        );
    }

    #[test]
    fn invalid_replies_are_errors() {
        assert!(scan_reply(b"?x\r\n").is_err());
        assert!(parse_value(b"$x\r\n").is_err());
        assert!(scan_reply(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n").is_err());
    }

    #[test]
    fn info_fields() {
        let info = "# Server\r\nredis_version:7.2.4\r\nvalkey_version:9.0.0\r\n";
        assert_eq!(info_field(info, "valkey_version").as_deref(), Some("9.0.0"));
        assert_eq!(info_field(info, "pgline_version"), None);
    }
}
