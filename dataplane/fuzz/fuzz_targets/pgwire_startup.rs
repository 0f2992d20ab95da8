//! Fuzzes the pgwire startup packet parser (`parse_startup`), the first bytes any client
//! sends. Beyond "never panics" the target checks the parser's invariants:
//! - on success `8 <= consumed <= len` and `consumed <= max_startup_bytes`;
//! - the packet alone parses to the same value (no look-ahead past it), and every strict
//!   prefix of it is `Incomplete` (bytes that arrive late never change the outcome);
//! - a StartupMessage has a `user`, no parameter twice, and its parameters, written back as a
//!   packet, parse to the same parameters and minor version.
//!
//! Run with `cargo +nightly fuzz run pgwire_startup` from `dataplane/`, or `fuzz/run.sh`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgline_dataplane::pgwire::{parse_startup, Limits, ParseError, Startup, PROTOCOL_3_0};

const LIMITS: Limits = Limits {
    max_startup_bytes: 1024,
    max_message_bytes: 4096,
    max_params: 64,
};

fn check_packet(packet: &[u8], parsed: Startup<'_>) {
    assert_eq!(parse_startup(packet, &LIMITS), Ok((parsed, packet.len())));
    for cut in 0..packet.len() {
        assert_eq!(
            parse_startup(&packet[..cut], &LIMITS),
            Err(ParseError::Incomplete),
            "prefix {cut} of a valid packet"
        );
    }
    let Startup::Startup(m) = parsed else {
        return;
    };
    let params: Vec<(&[u8], &[u8])> = m.params().collect();
    assert!(m.get(b"user").is_some(), "validated without a user");
    for (i, (name, _)) in params.iter().enumerate() {
        assert!(!name.is_empty());
        assert!(params[..i].iter().all(|(n, _)| n != name), "duplicate parameter");
    }
    let _ = (m.user(), m.database());

    let mut again = vec![0u8; 4];
    again.extend_from_slice(&(PROTOCOL_3_0 | i32::from(m.minor)).to_be_bytes());
    for (name, value) in &params {
        for s in [name, value] {
            again.extend_from_slice(s);
            again.push(0);
        }
    }
    again.push(0);
    let len = again.len() as i32;
    again[..4].copy_from_slice(&len.to_be_bytes());
    match parse_startup(&again, &LIMITS) {
        Ok((Startup::Startup(m2), n)) => {
            assert_eq!(n, again.len());
            assert_eq!(m2.minor, m.minor);
            assert!(m2.params().eq(params.iter().copied()));
        }
        other => panic!("re-written startup packet: {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    match parse_startup(data, &LIMITS) {
        Ok((s, n)) => {
            assert!((8..=data.len()).contains(&n) && n <= LIMITS.max_startup_bytes);
            check_packet(&data[..n], s);
        }
        Err(ParseError::Incomplete) => {
            // Only a short buffer is incomplete: a whole claimed packet is judged.
            let claimed = data
                .get(..4)
                .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            assert!(claimed.is_none_or(|c| c as usize > data.len()), "{claimed:?}");
        }
        Err(ParseError::Invalid(_)) => {}
    }
});
