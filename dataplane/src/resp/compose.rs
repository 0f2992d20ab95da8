//! Replies, composed straight into the connection's output buffer. Integers go through `itoa`.

use super::{Args, Protocol};

fn push_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `+OK`
pub fn compose_simple(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'+');
    out.extend(
        s.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

/// `-<msg>`; `msg` starts with its code (`ERR ...`). CR and LF become spaces.
pub fn compose_error(out: &mut Vec<u8>, msg: &[u8]) {
    out.push(b'-');
    out.extend(
        msg.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

pub fn compose_integer(out: &mut Vec<u8>, n: i64) {
    out.push(b':');
    push_int(out, n);
    out.extend_from_slice(b"\r\n");
}

pub fn compose_bulk_header(out: &mut Vec<u8>, len: usize) {
    out.push(b'$');
    push_int(out, len);
    out.extend_from_slice(b"\r\n");
}

pub fn compose_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    compose_bulk_header(out, bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Nil: `$-1` in RESP2, `_` in RESP3.
pub fn compose_null(out: &mut Vec<u8>, proto: Protocol) {
    match proto {
        Protocol::Resp2 => out.extend_from_slice(b"$-1\r\n"),
        Protocol::Resp3 => out.extend_from_slice(b"_\r\n"),
    }
}

pub fn compose_array_header(out: &mut Vec<u8>, n: usize) {
    out.push(b'*');
    push_int(out, n);
    out.extend_from_slice(b"\r\n");
}

/// A map of `n` pairs: `%n` in RESP3, a flat array of `2n` in RESP2.
pub fn compose_map_header(out: &mut Vec<u8>, n: usize, proto: Protocol) {
    match proto {
        Protocol::Resp2 => compose_array_header(out, n * 2),
        Protocol::Resp3 => {
            out.push(b'%');
            push_int(out, n);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Text such as `INFO`: a verbatim string in RESP3, a bulk string in RESP2.
pub fn compose_verbatim(out: &mut Vec<u8>, format: &[u8; 3], text: &[u8], proto: Protocol) {
    match proto {
        Protocol::Resp2 => compose_bulk(out, text),
        Protocol::Resp3 => {
            out.push(b'=');
            push_int(out, text.len() + 4);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(format);
            out.push(b':');
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Redis' text: `-ERR unknown command 'foo', with args beginning with: 'a' 'b' `.
pub fn compose_unknown_command(out: &mut Vec<u8>, name: &[u8], args: Args<'_>) {
    let mut msg = b"ERR unknown command '".to_vec();
    msg.extend_from_slice(&name[..name.len().min(128)]);
    msg.extend_from_slice(b"', with args beginning with: ");
    let mut budget = 128usize;
    for a in args.iter() {
        if budget == 0 {
            break;
        }
        let take = a.len().min(budget);
        msg.push(b'\'');
        msg.extend_from_slice(&a[..take]);
        msg.extend_from_slice(b"' ");
        budget -= take;
    }
    compose_error(out, &msg);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars() {
        let mut o = Vec::new();
        compose_simple(&mut o, b"OK");
        compose_error(&mut o, b"ERR bad\r\nthing");
        compose_integer(&mut o, -42);
        compose_bulk(&mut o, b"hi");
        compose_null(&mut o, Protocol::Resp2);
        compose_null(&mut o, Protocol::Resp3);
        assert_eq!(
            o,
            b"+OK\r\n-ERR bad  thing\r\n:-42\r\n$2\r\nhi\r\n$-1\r\n_\r\n"
        );
    }

    #[test]
    fn aggregates() {
        let mut o = Vec::new();
        compose_array_header(&mut o, 2);
        compose_map_header(&mut o, 2, Protocol::Resp2);
        compose_map_header(&mut o, 2, Protocol::Resp3);
        compose_verbatim(&mut o, b"txt", b"a", Protocol::Resp3);
        compose_verbatim(&mut o, b"txt", b"a", Protocol::Resp2);
        assert_eq!(o, b"*2\r\n*4\r\n%2\r\n=5\r\ntxt:a\r\n$1\r\na\r\n");
    }

    #[test]
    fn unknown_command_text() {
        let buf = b"ab";
        let ranges = [0..1, 1..2];
        let mut o = Vec::new();
        compose_unknown_command(&mut o, b"frob", Args::new(buf, &ranges));
        assert_eq!(
            o,
            b"-ERR unknown command 'frob', with args beginning with: 'a' 'b' \r\n"
        );
    }
}
