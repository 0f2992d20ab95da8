//! Fuzzes RESP request framing and command recognition.
//!
//! The input is treated as a connection's input buffer holding a pipeline. For every
//! request taken from it the target checks the parser's invariants, not only that nothing
//! panics:
//! - `0 < consumed <= len`, every argument range inside the consumed bytes, limits obeyed;
//! - the frame alone parses to the same arguments (no look-ahead past the frame), and a
//!   strict prefix of it is `Incomplete` (bytes that arrive late never change the outcome);
//! - the arguments composed as a multibulk request parse back to themselves, consuming
//!   exactly the composed bytes;
//! - `parse_command` and every error reply compose without panicking, and error replies are
//!   single lines.
//!
//! Run with `cargo +nightly fuzz run resp_request` from `dataplane/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgline_dataplane::resp::{
    compose_request, compose_unknown_command, parse_command, parse_request, Args, Command, Limits,
    ParseError,
};
use std::ops::Range;

const LIMITS: Limits = Limits {
    max_args: 64,
    max_bulk_bytes: 512,
    max_inline_bytes: 256,
};

fn args_of(buf: &[u8], ranges: &[Range<usize>]) -> Vec<Vec<u8>> {
    ranges.iter().map(|r| buf[r.clone()].to_vec()).collect()
}

fn check_frame(frame: &[u8], ranges: &[Range<usize>]) {
    let expected = args_of(frame, ranges);

    let mut again = Vec::new();
    assert_eq!(parse_request(frame, &LIMITS, &mut again), Ok(frame.len()));
    assert_eq!(args_of(frame, &again), expected);
    for cut in [frame.len() - 1, frame.len() / 2] {
        assert_eq!(
            parse_request(&frame[..cut], &LIMITS, &mut again),
            Err(ParseError::Incomplete),
            "prefix {cut} of a valid frame"
        );
    }

    if !expected.is_empty() {
        let refs: Vec<&[u8]> = expected.iter().map(Vec::as_slice).collect();
        let mut composed = Vec::new();
        compose_request(&mut composed, &refs);
        assert_eq!(
            parse_request(&composed, &LIMITS, &mut again),
            Ok(composed.len())
        );
        assert_eq!(args_of(&composed, &again), expected);
    }

    let mut out = Vec::new();
    match parse_command(Args::new(frame, ranges)) {
        Err(e) => e.compose(&mut out),
        Ok(Command::Unknown { name, args }) => compose_unknown_command(&mut out, name, args),
        Ok(_) => {}
    }
    if !out.is_empty() {
        assert_eq!(out.first(), Some(&b'-'));
        assert!(out.ends_with(b"\r\n"));
        assert!(!out[..out.len() - 2]
            .iter()
            .any(|&b| b == b'\r' || b == b'\n'));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut ranges = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let buf = &data[pos..];
        match parse_request(buf, &LIMITS, &mut ranges) {
            Ok(n) => {
                assert!(n > 0 && n <= buf.len());
                assert!(ranges.len() <= LIMITS.max_args);
                assert!(ranges.iter().all(|r| r.start <= r.end && r.end <= n));
                check_frame(&buf[..n], &ranges);
                pos += n;
            }
            Err(ParseError::Incomplete) => break,
            Err(ParseError::Invalid(kind)) => {
                let mut out = Vec::new();
                kind.compose(&mut out);
                assert!(out.starts_with(b"-ERR Protocol error: "));
                break;
            }
        }
    }
});
