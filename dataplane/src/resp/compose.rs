//! Reply composition: RESP2/RESP3 values written straight into the output buffer.
//!
//! Purpose: the last step of the hit path; every function appends one complete value (or
//! one aggregate header) to `out`, and allocates only if `out` must grow. Integers are
//! written with `itoa`. Invariants: error and simple-string replies never contain CR or LF
//! (they are replaced by spaces), so a reply can never be split into two by its contents.
//! Thread model: pure functions over the caller's buffer.

use super::Args;

/// The reply protocol a connection negotiated (RESP2 until `HELLO 3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

fn compose_line(out: &mut Vec<u8>, prefix: u8, s: &[u8]) {
    out.push(prefix);
    out.extend(
        s.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

fn compose_header(out: &mut Vec<u8>, prefix: u8, n: usize) {
    out.push(prefix);
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `+s\r\n` (CR/LF in `s` become spaces).
pub fn compose_simple(out: &mut Vec<u8>, s: &[u8]) {
    compose_line(out, b'+', s);
}

/// `-msg\r\n`; `msg` includes the code (`b"ERR unknown command 'x'"`). CR/LF become spaces.
pub fn compose_error(out: &mut Vec<u8>, msg: &[u8]) {
    compose_line(out, b'-', msg);
}

/// `:n\r\n`
pub fn compose_integer(out: &mut Vec<u8>, n: i64) {
    out.push(b':');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `$len\r\nbytes\r\n`
pub fn compose_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    compose_bulk_header(out, bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// `$len\r\n`; the caller appends exactly `len` bytes and then `\r\n`.
pub fn compose_bulk_header(out: &mut Vec<u8>, len: usize) {
    compose_header(out, b'$', len);
}

/// The null value: `$-1\r\n` in RESP2, `_\r\n` in RESP3.
pub fn compose_null(out: &mut Vec<u8>, proto: Protocol) {
    out.extend_from_slice(match proto {
        Protocol::Resp2 => b"$-1\r\n",
        Protocol::Resp3 => b"_\r\n",
    });
}

/// `*n\r\n`; the caller then composes `n` values.
pub fn compose_array_header(out: &mut Vec<u8>, n: usize) {
    compose_header(out, b'*', n);
}

/// A map of `n` pairs: `%n\r\n` in RESP3, a flat array `*2n\r\n` in RESP2. The caller then
/// composes `2n` values, key and value alternating.
pub fn compose_map_header(out: &mut Vec<u8>, n: usize, proto: Protocol) {
    match proto {
        Protocol::Resp2 => compose_header(out, b'*', n.saturating_mul(2)),
        Protocol::Resp3 => compose_header(out, b'%', n),
    }
}

/// A set of `n` members: `~n\r\n` in RESP3, `*n\r\n` in RESP2.
pub fn compose_set_header(out: &mut Vec<u8>, n: usize, proto: Protocol) {
    match proto {
        Protocol::Resp2 => compose_header(out, b'*', n),
        Protocol::Resp3 => compose_header(out, b'~', n),
    }
}

/// A verbatim string: `=len\r\nfmt:text\r\n` in RESP3, a bulk string of `text` in RESP2.
pub fn compose_verbatim(out: &mut Vec<u8>, format: &[u8; 3], text: &[u8], proto: Protocol) {
    match proto {
        Protocol::Resp2 => compose_bulk(out, text),
        Protocol::Resp3 => {
            compose_header(out, b'=', text.len() + 4);
            out.extend_from_slice(format);
            out.push(b':');
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// A request as clients send it: a multibulk array of bulk strings (for tests, fuzzing and
/// load generators; the server never sends requests).
pub fn compose_request(out: &mut Vec<u8>, args: &[&[u8]]) {
    compose_array_header(out, args.len());
    for arg in args {
        compose_bulk(out, arg);
    }
}

/// Longest part of the name, and budget for the argument list, that Redis quotes.
const UNKNOWN_QUOTE_MAX: usize = 128;

/// Redis' exact reply to an unknown command:
/// `-ERR unknown command 'foo', with args beginning with: 'a' 'b' \r\n`
/// (name cut to 128 bytes; arguments quoted while the list is under 128 bytes, each cut to
/// what is left of that budget; CR/LF become spaces).
pub fn compose_unknown_command(out: &mut Vec<u8>, name: &[u8], args: Args) {
    let start = out.len();
    out.extend_from_slice(b"-ERR unknown command '");
    out.extend_from_slice(name.get(..UNKNOWN_QUOTE_MAX).unwrap_or(name));
    out.extend_from_slice(b"', with args beginning with: ");
    let mut listed = 0usize;
    for arg in args.iter() {
        if listed >= UNKNOWN_QUOTE_MAX {
            break;
        }
        let cut = arg.get(..UNKNOWN_QUOTE_MAX - listed).unwrap_or(arg);
        out.push(b'\'');
        out.extend_from_slice(cut);
        out.extend_from_slice(b"' ");
        listed += cut.len() + 3;
    }
    for b in &mut out[start + 1..] {
        if *b == b'\r' || *b == b'\n' {
            *b = b' ';
        }
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn composed(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = b"prev".to_vec();
        f(&mut out);
        assert_eq!(&out[..4], b"prev", "must append, not overwrite");
        out.split_off(4)
    }

    #[test]
    fn scalars() {
        assert_eq!(composed(|o| compose_simple(o, b"OK")), b"+OK\r\n");
        assert_eq!(composed(|o| compose_simple(o, b"a\r\nb")), b"+a  b\r\n");
        assert_eq!(
            composed(|o| compose_error(o, b"ERR bad\r\nthing")),
            b"-ERR bad  thing\r\n"
        );
        assert_eq!(composed(|o| compose_integer(o, 0)), b":0\r\n");
        assert_eq!(composed(|o| compose_integer(o, -42)), b":-42\r\n");
        assert_eq!(
            composed(|o| compose_integer(o, i64::MIN)),
            b":-9223372036854775808\r\n"
        );
        assert_eq!(composed(|o| compose_bulk(o, b"")), b"$0\r\n\r\n");
        assert_eq!(
            composed(|o| compose_bulk(o, b"a\r\nb")),
            b"$4\r\na\r\nb\r\n"
        );
        assert_eq!(composed(|o| compose_bulk_header(o, 166)), b"$166\r\n");
    }

    #[test]
    fn protocol_dependent() {
        assert_eq!(composed(|o| compose_null(o, Protocol::Resp2)), b"$-1\r\n");
        assert_eq!(composed(|o| compose_null(o, Protocol::Resp3)), b"_\r\n");
        assert_eq!(composed(|o| compose_array_header(o, 3)), b"*3\r\n");
        assert_eq!(
            composed(|o| compose_map_header(o, 3, Protocol::Resp2)),
            b"*6\r\n"
        );
        assert_eq!(
            composed(|o| compose_map_header(o, 3, Protocol::Resp3)),
            b"%3\r\n"
        );
        assert_eq!(
            composed(|o| compose_set_header(o, 2, Protocol::Resp2)),
            b"*2\r\n"
        );
        assert_eq!(
            composed(|o| compose_set_header(o, 2, Protocol::Resp3)),
            b"~2\r\n"
        );
        assert_eq!(
            composed(|o| compose_verbatim(o, b"txt", b"hi\r\n", Protocol::Resp3)),
            b"=8\r\ntxt:hi\r\n\r\n"
        );
        assert_eq!(
            composed(|o| compose_verbatim(o, b"txt", b"hi", Protocol::Resp2)),
            b"$2\r\nhi\r\n"
        );
        assert_eq!(Protocol::default(), Protocol::Resp2);
    }

    #[test]
    fn request() {
        assert_eq!(
            composed(|o| compose_request(o, &[b"GET", b"k"])),
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
        );
    }

    #[test]
    fn unknown_command_text() {
        let buf = b"foo a b";
        let ranges = [4..5, 6..7];
        assert_eq!(
            composed(|o| compose_unknown_command(o, b"foo", Args::new(buf, &ranges))),
            &b"-ERR unknown command 'foo', with args beginning with: 'a' 'b' \r\n"[..]
        );
        assert_eq!(
            composed(|o| compose_unknown_command(o, b"x\r\ny", Args::new(b"", &[]))),
            &b"-ERR unknown command 'x  y', with args beginning with: \r\n"[..]
        );
    }

    #[test]
    fn unknown_command_truncates_like_redis() {
        let long = vec![b'a'; 300];
        let buf = [&long[..], b" ", &long[..], b" b"].concat();
        let ranges = [0..300, 301..601, 602..603];
        let args = Args::new(&buf, &ranges);
        let out = composed(|o| compose_unknown_command(o, &buf[..300], args.slice(1)));
        let name = "a".repeat(128);
        let first = "a".repeat(128);
        let expected =
            format!("-ERR unknown command '{name}', with args beginning with: '{first}' \r\n");
        assert_eq!(String::from_utf8(out).unwrap(), expected);
        // A short first argument leaves budget for the next one, cut to what is left.
        let ranges = [602..603, 0..300];
        let out = composed(|o| compose_unknown_command(o, b"x", Args::new(&buf, &ranges)));
        let rest = "a".repeat(128 - 4);
        let expected =
            format!("-ERR unknown command 'x', with args beginning with: 'b' '{rest}' \r\n");
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }
}
