//! Byte-literal tests for request framing.

use super::*;

fn parse(buf: &[u8]) -> Result<(usize, Vec<Vec<u8>>), ParseError> {
    parse_with(buf, &Limits::default())
}

fn parse_with(buf: &[u8], limits: &Limits) -> Result<(usize, Vec<Vec<u8>>), ParseError> {
    let mut ranges = Vec::new();
    let n = parse_request(buf, limits, &mut ranges)?;
    assert!(n <= buf.len());
    Ok((n, ranges.iter().map(|r| buf[r.clone()].to_vec()).collect()))
}

fn words(ws: &[&str]) -> Vec<Vec<u8>> {
    ws.iter().map(|w| w.as_bytes().to_vec()).collect()
}

fn invalid(kind: Invalid) -> Result<(usize, Vec<Vec<u8>>), ParseError> {
    Err(ParseError::Invalid(kind))
}

#[test]
fn multibulk_get() {
    let buf = b"*2\r\n$3\r\nGET\r\n$8\r\nusers:42\r\n";
    assert_eq!(parse(buf), Ok((buf.len(), words(&["GET", "users:42"]))));
}

#[test]
fn multibulk_binary_and_empty_args() {
    let buf = b"*3\r\n$3\r\nGET\r\n$0\r\n\r\n$4\r\n\r\n\0\xff\r\n";
    let expected = vec![b"GET".to_vec(), vec![], b"\r\n\0\xff".to_vec()];
    assert_eq!(parse(buf), Ok((buf.len(), expected)));
}

#[test]
fn multibulk_consumes_only_one_frame() {
    let buf = b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n";
    assert_eq!(parse(buf), Ok((14, words(&["PING"]))));
    assert_eq!(parse(&buf[14..]), Ok((14, words(&["PING"]))));
}

#[test]
fn empty_and_null_arrays_yield_no_args() {
    assert_eq!(parse(b"*0\r\n"), Ok((4, vec![])));
    assert_eq!(parse(b"*-1\r\n*1\r\n"), Ok((5, vec![])));
}

#[test]
fn every_prefix_is_incomplete() {
    let buf = b"*2\r\n$3\r\nGET\r\n$8\r\nusers:42\r\n";
    for cut in 0..buf.len() {
        assert_eq!(parse(&buf[..cut]), Err(ParseError::Incomplete), "cut {cut}");
    }
    for cut in 0..5 {
        assert_eq!(
            parse(&b"*-1\r\n"[..cut]),
            Err(ParseError::Incomplete),
            "cut {cut}"
        );
    }
}

#[test]
fn bad_array_lengths() {
    assert_eq!(parse(b"*x\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*1x\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*-2\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*-0\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*-12\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*+1\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*01\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"* 1\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*1\n$1\r\na\r\n"), invalid(Invalid::BadArrayLength));
    assert_eq!(parse(b"*1\rx"), invalid(Invalid::MissingCrlf));
    assert_eq!(parse(b"*-1\rx"), invalid(Invalid::MissingCrlf));
}

#[test]
fn too_many_args_is_invalid_before_data_arrives() {
    assert_eq!(parse(b"*4097"), invalid(Invalid::TooManyArgs));
    assert_eq!(
        parse(b"*99999999999999999999999999"),
        invalid(Invalid::TooManyArgs)
    );
    let limits = Limits {
        max_args: 2,
        ..Limits::default()
    };
    assert_eq!(
        parse_with(b"*3\r\n", &limits),
        invalid(Invalid::TooManyArgs)
    );
    assert!(parse_with(b"*2\r\n", &limits) == Err(ParseError::Incomplete));
}

#[test]
fn bad_bulk_lengths() {
    assert_eq!(parse(b"*1\r\n$x\r\n"), invalid(Invalid::BadBulkLength));
    assert_eq!(parse(b"*1\r\n$\r\n"), invalid(Invalid::BadBulkLength));
    assert_eq!(parse(b"*1\r\n$-1\r\n"), invalid(Invalid::BadBulkLength));
    assert_eq!(parse(b"*1\r\n$-5\r\n"), invalid(Invalid::BadBulkLength));
    assert_eq!(
        parse(b"*1\r\n$03\r\nGET\r\n"),
        invalid(Invalid::BadBulkLength)
    );
    assert_eq!(parse(b"*1\r\n$3\rGET\r\n"), invalid(Invalid::MissingCrlf));
}

#[test]
fn huge_bulk_claim_is_invalid_immediately() {
    assert_eq!(parse(b"*1\r\n$1000000000"), invalid(Invalid::BulkTooLarge));
    assert_eq!(parse(b"*1\r\n$1048577"), invalid(Invalid::BulkTooLarge));
    // Exactly the limit is a valid claim that waits for its data.
    assert_eq!(parse(b"*1\r\n$1048576\r\n"), Err(ParseError::Incomplete));
}

#[test]
fn expected_bulk() {
    assert_eq!(parse(b"*1\r\n+GET\r\n"), invalid(Invalid::ExpectedBulk));
    assert_eq!(
        parse(b"*2\r\n$3\r\nGET\r\n:1\r\n"),
        invalid(Invalid::ExpectedBulk)
    );
    assert_eq!(
        parse(b"*1\r\n*1\r\n$1\r\na\r\n"),
        invalid(Invalid::ExpectedBulk)
    );
}

#[test]
fn missing_crlf_after_payload() {
    assert_eq!(parse(b"*1\r\n$3\r\nGETxx"), invalid(Invalid::MissingCrlf));
    assert_eq!(parse(b"*1\r\n$3\r\nGET\rx"), invalid(Invalid::MissingCrlf));
    // Detected as soon as the first byte after the payload is wrong.
    assert_eq!(parse(b"*1\r\n$3\r\nGETx"), invalid(Invalid::MissingCrlf));
    assert_eq!(parse(b"*1\r\n$3\r\nGET\r"), Err(ParseError::Incomplete));
}

#[test]
fn inline_commands() {
    assert_eq!(
        parse(b"GET users:42\r\n"),
        Ok((14, words(&["GET", "users:42"])))
    );
    assert_eq!(parse(b"PING\n"), Ok((5, words(&["PING"]))));
    assert_eq!(
        parse(b"  MGET\ta  b \r\nGET x\r\n"),
        Ok((14, words(&["MGET", "a", "b"])))
    );
    assert_eq!(parse(b"GET users:42"), Err(ParseError::Incomplete));
    assert_eq!(parse(b"GET users:42\r"), Err(ParseError::Incomplete));
}

#[test]
fn empty_inline_lines_yield_no_args() {
    assert_eq!(parse(b"\r\n"), Ok((2, vec![])));
    assert_eq!(parse(b"\n"), Ok((1, vec![])));
    assert_eq!(parse(b"   \t \r\nPING\r\n"), Ok((7, vec![])));
}

#[test]
fn inline_quoting() {
    assert_eq!(
        parse(b"SET \"a key\" 'it is'\r\n"),
        Ok((21, words(&["SET", "a key", "it is"])))
    );
    assert_eq!(parse(b"ECHO \"\"\n"), Ok((8, words(&["ECHO", ""]))));
    assert_eq!(parse(b"ECHO 'a\\b'\n"), Ok((11, words(&["ECHO", "a\\b"]))));
    assert_eq!(parse(b"ECHO 'a\"b'\n"), Ok((11, words(&["ECHO", "a\"b"]))));
    // A quote inside a bare word is literal.
    assert_eq!(parse(b"ECHO a\"b\n"), Ok((9, words(&["ECHO", "a\"b"]))));
    assert_eq!(parse(b"ECHO \"abc\n"), invalid(Invalid::UnbalancedQuotes));
    assert_eq!(parse(b"ECHO 'abc\n"), invalid(Invalid::UnbalancedQuotes));
    assert_eq!(parse(b"ECHO \"a\"b\n"), invalid(Invalid::UnbalancedQuotes));
    assert_eq!(
        parse(b"ECHO \"a\\nb\"\n"),
        invalid(Invalid::UnsupportedEscape)
    );
    assert_eq!(
        parse(b"ECHO 'a\\'b'\n"),
        invalid(Invalid::UnsupportedEscape)
    );
}

#[test]
fn inline_limits() {
    let limits = Limits {
        max_inline_bytes: 8,
        max_args: 2,
        ..Limits::default()
    };
    assert_eq!(
        parse_with(b"12345678", &limits),
        Err(ParseError::Incomplete)
    );
    assert_eq!(
        parse_with(b"123456789", &limits),
        invalid(Invalid::InlineTooLong)
    );
    assert_eq!(
        parse_with(b"12345678\r\n", &limits),
        invalid(Invalid::InlineTooLong)
    );
    assert_eq!(
        parse_with(b"1234567\r\n", &limits),
        Ok((9, words(&["1234567"])))
    );
    assert_eq!(
        parse_with(b"a b c\n", &limits),
        invalid(Invalid::TooManyArgs)
    );
    assert_eq!(parse_with(b"a b\n", &limits), Ok((4, words(&["a", "b"]))));
}

#[test]
fn args_vector_is_cleared_and_reused() {
    let mut ranges = vec![0..1; 5];
    let n = parse_request(b"PING\r\n", &Limits::default(), &mut ranges);
    assert_eq!(n, Ok(6));
    assert_eq!(ranges, vec![0..4]);
}

#[test]
fn messages_match_redis() {
    assert_eq!(
        Invalid::BadArrayLength.message(),
        "Protocol error: invalid multibulk length"
    );
    assert_eq!(
        Invalid::BulkTooLarge.message(),
        "Protocol error: invalid bulk length"
    );
    let mut out = Vec::new();
    Invalid::InlineTooLong.compose(&mut out);
    assert_eq!(out, b"-ERR Protocol error: too big inline request\r\n");
}
