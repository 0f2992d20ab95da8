//! Property tests for the codec: compose/parse round trips at every split point,
//! pipelines, inline requests, and arbitrary or corrupted input (never a panic, and the
//! parser's invariants hold whatever it returns).

use super::*;
use proptest::prelude::*;
use std::ops::Range;

fn arg_vectors() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..12)
}

fn frame(args: &[Vec<u8>]) -> Vec<u8> {
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    compose_request(&mut out, &refs);
    out
}

/// Parses and checks the invariants every outcome must satisfy.
fn checked_parse(buf: &[u8], limits: &Limits) -> Result<(usize, Vec<Vec<u8>>), ParseError> {
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let consumed = parse_request(buf, limits, &mut ranges)?;
    assert!(
        consumed >= 1 && consumed <= buf.len(),
        "consumed {consumed} of {}",
        buf.len()
    );
    assert!(ranges.len() <= limits.max_args);
    for r in &ranges {
        assert!(
            r.start <= r.end && r.end <= consumed,
            "{r:?} outside {consumed}"
        );
        assert!(r.len() <= limits.max_bulk_bytes.max(limits.max_inline_bytes));
    }
    Ok((
        consumed,
        ranges.iter().map(|r| buf[r.clone()].to_vec()).collect(),
    ))
}

proptest! {
    // Failures are reported with their minimal input; nothing is written beside the source.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn multibulk_round_trip_at_every_split(args in arg_vectors()) {
        let buf = frame(&args);
        let limits = Limits::default();
        for cut in 0..buf.len() {
            prop_assert_eq!(checked_parse(&buf[..cut], &limits), Err(ParseError::Incomplete));
        }
        prop_assert_eq!(checked_parse(&buf, &limits), Ok((buf.len(), args)));
    }

    #[test]
    fn pipelines_parse_frame_by_frame(frames in prop::collection::vec(arg_vectors(), 1..6)) {
        let buf: Vec<u8> = frames.iter().flat_map(|f| frame(f)).collect();
        let limits = Limits::default();
        let mut pos = 0;
        for expected in &frames {
            let (n, args) = checked_parse(&buf[pos..], &limits).expect("valid frame");
            prop_assert_eq!(&args, expected);
            pos += n;
        }
        prop_assert_eq!(pos, buf.len());
        prop_assert_eq!(checked_parse(&buf[pos..], &limits), Err(ParseError::Incomplete));
    }

    #[test]
    fn inline_round_trip(
        words in prop::collection::vec("[!#-&(-~]{1,12}", 1..8),
        quoted in prop::collection::vec("[ !#-\\[\\]-~]{0,8}", 0..3),
        crlf in any::<bool>(),
    ) {
        // Bare words: printable, no space or quotes. Quoted words: may hold spaces.
        // A line starting with '*' is a multibulk request, not an inline one.
        prop_assume!(!words[0].starts_with('*'));
        let mut line: Vec<String> = words.clone();
        line.extend(quoted.iter().map(|q| format!("\"{q}\"")));
        let mut buf = line.join(" ").into_bytes();
        buf.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        let expected: Vec<Vec<u8>> = words
            .iter()
            .chain(&quoted)
            .map(|w| w.as_bytes().to_vec())
            .collect();
        let limits = Limits::default();
        for cut in 0..buf.len() {
            prop_assert_eq!(checked_parse(&buf[..cut], &limits), Err(ParseError::Incomplete));
        }
        prop_assert_eq!(checked_parse(&buf, &limits), Ok((buf.len(), expected)));
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in prop::collection::vec(any::<u8>(), 0..256)) {
        let tight = Limits { max_args: 4, max_bulk_bytes: 16, max_inline_bytes: 32 };
        let _ = checked_parse(&buf, &Limits::default());
        let _ = checked_parse(&buf, &tight);
    }

    #[test]
    fn star_prefixed_garbage_is_never_accepted_as_more_than_it_is(
        tail in prop::collection::vec(any::<u8>(), 0..64)
    ) {
        let mut buf = vec![b'*'];
        buf.extend_from_slice(&tail);
        if let Ok((n, args)) = checked_parse(&buf, &Limits::default()) {
            // Whatever was accepted must re-compose to exactly the bytes consumed.
            if !args.is_empty() {
                prop_assert_eq!(frame(&args), buf[..n].to_vec());
            }
        }
    }

    #[test]
    fn corrupted_frames_never_panic(
        args in arg_vectors(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut buf = frame(&args);
        let i = at.index(buf.len());
        buf[i] = byte;
        let _ = checked_parse(&buf, &Limits::default());
        buf.truncate(i + 1);
        let _ = checked_parse(&buf, &Limits::default());
    }

    #[test]
    fn parse_command_never_panics(args in prop::collection::vec(
        prop::sample::select(vec![
            "GET", "mget", "HELLO", "3", "AUTH", "SETNAME", "CLIENT", "COMMAND", "INFO",
            "COUNT", "x", "", "-1", "SET", "ping", "select", "hmget", "setinfo",
        ]),
        0..6,
    )) {
        let buf = args.concat().into_bytes();
        let mut ranges = Vec::new();
        let mut at = 0;
        for a in &args {
            ranges.push(at..at + a.len());
            at += a.len();
        }
        let _ = parse_command(Args::new(&buf, &ranges));
    }
}
