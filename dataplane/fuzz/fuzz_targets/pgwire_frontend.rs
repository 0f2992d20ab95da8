//! Fuzzes the pgwire frontend message parser (`parse_frontend`) and the `p` message decoders.
//!
//! The input is treated as a connection's input buffer after startup, holding a pipeline of
//! messages. For every message taken from it the target checks the parser's invariants, not
//! only that nothing panics:
//! - `5 <= consumed <= len` and the length claim within `max_message_bytes`;
//! - the message alone parses to the same value (no look-ahead past it), and every strict
//!   prefix of it is `Incomplete`;
//! - the views' accessors agree with what was validated: a Bind yields exactly
//!   `param_count` values, each inside the message, and format lookups never fail; a Parse's
//!   parameter types number `len()`;
//! - a `p` body decodes (or is refused) as a SASLInitialResponse and as a PasswordMessage
//!   without panicking.
//!
//! Run with `cargo +nightly fuzz run pgwire_frontend` from `dataplane/`, or `fuzz/run.sh`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgline_dataplane::pgwire::{
    parse_frontend, parse_password_message, parse_sasl_initial_response, Frontend, Limits,
    ParseError,
};

const LIMITS: Limits = Limits {
    max_startup_bytes: 1024,
    max_message_bytes: 4096,
    max_params: 64,
};

fn check_message(frame: &[u8], msg: Frontend<'_>) {
    assert_eq!(parse_frontend(frame, &LIMITS), Ok((msg, frame.len())));
    for cut in 0..frame.len() {
        assert_eq!(
            parse_frontend(&frame[..cut], &LIMITS),
            Err(ParseError::Incomplete),
            "prefix {cut} of a valid message"
        );
    }
    let inside = |s: &[u8]| {
        let (start, end) = (frame.as_ptr() as usize, frame.as_ptr() as usize + frame.len());
        let p = s.as_ptr() as usize;
        assert!(s.is_empty() || (p >= start && p + s.len() <= end));
    };
    match msg {
        Frontend::Bind(b) => {
            inside(b.portal);
            inside(b.statement);
            assert!(b.param_count() <= LIMITS.max_params);
            let values: Vec<Option<&[u8]>> = b.params().collect();
            assert_eq!(values.len(), b.param_count());
            values.iter().flatten().for_each(|v| inside(v));
            for i in 0..b.param_count() {
                let _ = b.param_format(i);
            }
            assert!(b.result_format_count() <= LIMITS.max_params);
            for i in 0..b.result_format_count().max(1) {
                let _ = b.result_format(i);
            }
        }
        Frontend::Parse {
            name,
            query,
            param_types,
        } => {
            inside(name);
            inside(query);
            assert!(param_types.len() <= LIMITS.max_params);
            assert_eq!(param_types.iter().count(), param_types.len());
            assert_eq!(param_types.is_empty(), param_types.len() == 0);
        }
        Frontend::Password(body) => {
            inside(body);
            if let Ok(r) = parse_sasl_initial_response(body) {
                inside(r.mechanism);
                r.data.iter().for_each(|d| inside(d));
                assert!(!r.mechanism.contains(&0));
            }
            if let Ok(p) = parse_password_message(body) {
                assert_eq!(p.len() + 1, body.len());
            }
        }
        Frontend::Query(q) => {
            inside(q);
            assert!(!q.contains(&0));
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let mut pos = 0;
    while pos < data.len() {
        let buf = &data[pos..];
        match parse_frontend(buf, &LIMITS) {
            Ok((msg, n)) => {
                assert!(n >= 5 && n <= buf.len() && n - 1 <= LIMITS.max_message_bytes);
                check_message(&buf[..n], msg);
                pos += n;
            }
            Err(ParseError::Incomplete) => break,
            Err(ParseError::Invalid(_)) => break,
        }
    }
});
