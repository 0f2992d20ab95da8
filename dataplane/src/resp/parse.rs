//! Request framing: multibulk and inline.

use std::ops::Range;

use super::{Invalid, Limits, ParseError};

/// Longest `*<n>` or `$<n>` header line we wait for before calling it invalid.
const MAX_HEADER: usize = 24;

/// Parses one request at the start of `buf`; fills `args` (cleared first) with the argument
/// ranges inside `buf` and returns the bytes consumed. Empty inline lines and `*0`/`*-1` are
/// consumed and yield no arguments.
pub fn parse_request(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<usize, ParseError> {
    args.clear();
    match buf.first() {
        None => Err(ParseError::Incomplete),
        Some(b'*') => parse_multibulk(buf, limits, args),
        Some(_) => parse_inline(buf, limits, args),
    }
}

/// Finds the CRLF ending the header line that starts at `from`; `Invalid(err)` if none is
/// within `MAX_HEADER` bytes.
fn header_end(buf: &[u8], from: usize, err: Invalid) -> Result<usize, ParseError> {
    let window = &buf[from..buf.len().min(from + MAX_HEADER)];
    match memchr::memchr(b'\r', window) {
        Some(i) => match buf.get(from + i + 1) {
            Some(b'\n') => Ok(from + i),
            Some(_) => Err(ParseError::Invalid(err)),
            None => Err(ParseError::Incomplete),
        },
        None if window.len() == MAX_HEADER => Err(ParseError::Invalid(err)),
        None => Err(ParseError::Incomplete),
    }
}

/// A decimal integer with an optional leading `-`; `None` for anything else.
fn parse_int(digits: &[u8]) -> Option<i64> {
    let (neg, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n * 10 + i64::from(d - b'0');
    }
    Some(if neg { -n } else { n })
}

fn parse_multibulk(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<usize, ParseError> {
    let cr = header_end(buf, 1, Invalid::BadArrayLength)?;
    let count = parse_int(&buf[1..cr]).ok_or(ParseError::Invalid(Invalid::BadArrayLength))?;
    let mut pos = cr + 2;
    if count <= 0 {
        return Ok(pos);
    }
    if count as u64 > limits.max_args as u64 {
        return Err(ParseError::Invalid(Invalid::TooManyArgs));
    }
    for _ in 0..count {
        match buf.get(pos) {
            None => return Err(ParseError::Incomplete),
            Some(b'$') => {}
            Some(_) => return Err(ParseError::Invalid(Invalid::ExpectedBulk)),
        }
        let cr = header_end(buf, pos + 1, Invalid::BadBulkLength)?;
        let len =
            parse_int(&buf[pos + 1..cr]).ok_or(ParseError::Invalid(Invalid::BadBulkLength))?;
        if len < 0 {
            return Err(ParseError::Invalid(Invalid::BadBulkLength));
        }
        if len as u64 > limits.max_bulk_bytes as u64 {
            return Err(ParseError::Invalid(Invalid::BulkTooLarge));
        }
        let start = cr + 2;
        let end = start + len as usize;
        match buf.get(end..end + 2) {
            None => return Err(ParseError::Incomplete),
            Some(b"\r\n") => {}
            Some(_) => return Err(ParseError::Invalid(Invalid::MissingCrlf)),
        }
        args.push(start..end);
        pos = end + 2;
    }
    Ok(pos)
}

fn parse_inline(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<usize, ParseError> {
    let window = &buf[..buf.len().min(limits.max_inline_bytes.saturating_add(1))];
    let Some(nl) = memchr::memchr(b'\n', window) else {
        return if window.len() > limits.max_inline_bytes {
            Err(ParseError::Invalid(Invalid::InlineTooLong))
        } else {
            Err(ParseError::Incomplete)
        };
    };
    let end = if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    let line = &buf[..end];
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b' ' | b'\t' => i += 1,
            q @ (b'"' | b'\'') => {
                let close = memchr::memchr(q, &line[i + 1..])
                    .ok_or(ParseError::Invalid(Invalid::UnbalancedQuotes))?;
                let stop = i + 1 + close;
                // A closing quote must end the argument.
                if !matches!(line.get(stop + 1), None | Some(b' ' | b'\t')) {
                    return Err(ParseError::Invalid(Invalid::UnbalancedQuotes));
                }
                push_arg(args, i + 1..stop, limits)?;
                i = stop + 1;
            }
            _ => {
                let stop = line[i..]
                    .iter()
                    .position(|b| matches!(b, b' ' | b'\t'))
                    .map_or(line.len(), |p| i + p);
                push_arg(args, i..stop, limits)?;
                i = stop;
            }
        }
    }
    Ok(nl + 1)
}

fn push_arg(
    args: &mut Vec<Range<usize>>,
    r: Range<usize>,
    limits: &Limits,
) -> Result<(), ParseError> {
    if args.len() >= limits.max_args {
        return Err(ParseError::Invalid(Invalid::TooManyArgs));
    }
    args.push(r);
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::resp::Args;

    fn parse(buf: &[u8]) -> Result<(usize, Vec<Vec<u8>>), ParseError> {
        let mut args = Vec::new();
        let n = parse_request(buf, &Limits::default(), &mut args)?;
        Ok((
            n,
            Args::new(buf, &args).iter().map(<[u8]>::to_vec).collect(),
        ))
    }

    fn v(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn multibulk() {
        assert_eq!(
            parse(b"*2\r\n$3\r\nGET\r\n$7\r\nusers:1\r\n"),
            Ok((26, v(&["GET", "users:1"])))
        );
        assert_eq!(parse(b"*1\r\n$0\r\n\r\n"), Ok((10, v(&[""]))));
        assert_eq!(parse(b"*0\r\n"), Ok((4, vec![])));
        assert_eq!(parse(b"*-1\r\n"), Ok((5, vec![])));
    }

    #[test]
    fn inline() {
        assert_eq!(parse(b"PING\r\n"), Ok((6, v(&["PING"]))));
        assert_eq!(parse(b"GET  users:1\n"), Ok((13, v(&["GET", "users:1"]))));
        assert_eq!(
            parse(b"ECHO \"a b\" 'c'\r\n"),
            Ok((16, v(&["ECHO", "a b", "c"])))
        );
        assert_eq!(parse(b"\r\n"), Ok((2, vec![])));
        assert_eq!(
            parse(b"ECHO \"ab\r\n"),
            Err(ParseError::Invalid(Invalid::UnbalancedQuotes))
        );
        assert_eq!(
            parse(b"ECHO \"a\"b\r\n"),
            Err(ParseError::Invalid(Invalid::UnbalancedQuotes))
        );
        assert_eq!(parse(b"PIN"), Err(ParseError::Incomplete));
    }

    #[test]
    fn malformed() {
        let inv = |i| Err(ParseError::Invalid(i));
        assert_eq!(parse(b"*abc\r\n"), inv(Invalid::BadArrayLength));
        assert_eq!(parse(b"*1\r\n$-5\r\n"), inv(Invalid::BadBulkLength));
        assert_eq!(parse(b"*1\r\n$1000000000\r\n"), inv(Invalid::BulkTooLarge));
        assert_eq!(parse(b"*999999999\r\n"), inv(Invalid::TooManyArgs));
        assert_eq!(parse(b"*1\r\n$4\r\nPINGxx"), inv(Invalid::MissingCrlf));
        assert_eq!(parse(b"*1\r\n:4\r\n"), inv(Invalid::ExpectedBulk));
        assert_eq!(parse(b"*1\rx"), inv(Invalid::BadArrayLength));
        assert_eq!(
            parse(b"*11111111111111111111111111111"),
            inv(Invalid::BadArrayLength)
        );
        assert_eq!(parse(b"*+1\r\n"), inv(Invalid::BadArrayLength));
        let long = vec![b'a'; DEFAULT_INLINE + 10];
        assert_eq!(parse(&long), inv(Invalid::InlineTooLong));
    }

    const DEFAULT_INLINE: usize = crate::resp::DEFAULT_MAX_INLINE_BYTES;

    fn compose_request(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    proptest! {
        #[test]
        fn round_trip_at_every_split(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8)) {
            let frame = compose_request(&args);
            for cut in 0..frame.len() {
                prop_assert_eq!(parse(&frame[..cut]), Err(ParseError::Incomplete));
            }
            prop_assert_eq!(parse(&frame), Ok((frame.len(), args.clone())));
            // A pipeline: the first frame parses alone, then the second.
            let mut two = frame.clone();
            two.extend_from_slice(&frame);
            let (n, got) = parse(&two).unwrap();
            prop_assert_eq!(n, frame.len());
            prop_assert_eq!(got, args);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut args = Vec::new();
            if let Ok(n) = parse_request(&bytes, &Limits::default(), &mut args) {
                prop_assert!(n <= bytes.len());
                for r in &args {
                    prop_assert!(r.end <= n);
                }
            }
        }
    }
}
