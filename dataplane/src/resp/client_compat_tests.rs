//! Cross-checks with a real client library (redis-rs): requests it packs parse here, and
//! replies composed here parse there, in RESP2 and RESP3, including the COMMAND table.

use super::*;
use redis::{parse_redis_value, Value};
use std::ops::Range;

fn parse_all(buf: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut pos = 0;
    let mut frames = Vec::new();
    while pos < buf.len() {
        let n = parse_request(&buf[pos..], &Limits::default(), &mut ranges).expect("valid");
        frames.push(
            ranges
                .iter()
                .map(|r| buf[pos..][r.clone()].to_vec())
                .collect(),
        );
        pos += n;
    }
    frames
}

#[test]
fn redis_rs_requests_parse() {
    let get = redis::cmd("GET").arg("users:42").get_packed_command();
    assert_eq!(
        parse_all(&get),
        vec![vec![b"GET".to_vec(), b"users:42".to_vec()]]
    );

    let mut pipe = redis::pipe();
    pipe.cmd("HELLO")
        .arg(3)
        .cmd("MGET")
        .arg(&["a", "b\r\nc"])
        .cmd("PING");
    let frames = parse_all(&pipe.get_packed_pipeline());
    assert_eq!(frames.len(), 3);
    assert_eq!(
        frames[1],
        vec![b"MGET".to_vec(), b"a".to_vec(), b"b\r\nc".to_vec()]
    );
}

fn value(buf: &[u8]) -> Value {
    parse_redis_value(buf).expect("redis-rs accepts the reply")
}

#[test]
fn replies_parse_in_redis_rs() {
    let mut out = Vec::new();
    compose_bulk(&mut out, b"{\"id\":42}");
    assert_eq!(value(&out), Value::BulkString(b"{\"id\":42}".to_vec()));

    for proto in [Protocol::Resp2, Protocol::Resp3] {
        let mut out = Vec::new();
        compose_null(&mut out, proto);
        assert_eq!(value(&out), Value::Nil, "{proto:?}");
    }

    let mut out = Vec::new();
    compose_map_header(&mut out, 1, Protocol::Resp3);
    compose_bulk(&mut out, b"k");
    compose_integer(&mut out, -5);
    assert_eq!(
        value(&out),
        Value::Map(vec![(Value::BulkString(b"k".to_vec()), Value::Int(-5))])
    );

    let mut out = Vec::new();
    compose_verbatim(&mut out, b"txt", b"# Server\r\n", Protocol::Resp3);
    match value(&out) {
        Value::VerbatimString { text, .. } => assert_eq!(text, "# Server\r\n"),
        other => panic!("{other:?}"),
    }

    let mut out = Vec::new();
    compose_simple(&mut out, b"OK");
    assert_eq!(value(&out), Value::Okay);
}

#[test]
fn errors_are_errors_in_redis_rs() {
    let mut out = Vec::new();
    CommandError::WrongArity("get").compose(&mut out);
    let code = match parse_redis_value(&out) {
        Ok(Value::ServerError(e)) => e.code().to_string(),
        Err(e) => e.code().unwrap_or_default().to_string(),
        Ok(other) => panic!("{other:?}"),
    };
    assert_eq!(code, "ERR");
}

#[test]
fn command_table_parses_in_redis_rs() {
    for proto in [Protocol::Resp2, Protocol::Resp3] {
        let mut out = Vec::new();
        compose_command_table(&mut out, proto);
        let Value::Array(rows) = value(&out) else {
            panic!("{proto:?}")
        };
        assert_eq!(rows.len(), 20);
        for row in rows {
            let Value::Array(fields) = row else {
                panic!("{proto:?}")
            };
            assert_eq!(fields.len(), 10);
            assert!(matches!(fields[0], Value::BulkString(_)));
            assert!(matches!(fields[1], Value::Int(_)));
        }
    }
}
