//! Byte layouts checked against the real origin (PostgreSQL 15 of the lab, `deploy/lab/pg.sh
//! start`; address from `PGLINE_TEST_PG_*` as in the control plane's tests): what the origin
//! sends for a few statements must equal, byte for byte, what our composers write for the same
//! answer.

use super::*;
use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend as fe;
use std::io::{Read, Write};
use std::net::TcpStream;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

struct Origin {
    stream: TcpStream,
    password: String,
}

impl Origin {
    /// Reads one backend message: (tag, whole message bytes).
    fn read(&mut self) -> (u8, Vec<u8>) {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head).expect("read header");
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut msg = head.to_vec();
        msg.resize(len + 1, 0);
        self.stream.read_exact(&mut msg[5..]).expect("read body");
        (head[0], msg)
    }

    fn send(&mut self, buf: &BytesMut) {
        self.stream.write_all(buf).expect("write");
    }

    /// Reads until ReadyForQuery; returns all the bytes, ReadyForQuery included.
    fn until_ready(&mut self) -> Vec<u8> {
        let mut all = Vec::new();
        loop {
            let (tag, msg) = self.read();
            all.extend_from_slice(&msg);
            if tag == b'Z' {
                return all;
            }
        }
    }

    fn connect() -> Origin {
        let addr = format!(
            "{}:{}",
            env("PGLINE_TEST_PG_HOST", "127.0.0.1"),
            env("PGLINE_TEST_PG_PORT", "54329")
        );
        let stream = TcpStream::connect(&addr).expect("origin is up (deploy/lab/pg.sh start)");
        let mut o = Origin {
            stream,
            password: env("PGLINE_TEST_PG_PASSWORD", "pgline"),
        };
        let user = env("PGLINE_TEST_PG_USER", "postgres");
        let mut b = BytesMut::new();
        fe::startup_message([("user", user.as_str()), ("database", "postgres")], &mut b)
            .expect("encode");
        o.send(&b);
        o.authenticate(&user);
        o.until_ready();
        o
    }

    fn authenticate(&mut self, user: &str) {
        loop {
            let (_, msg) = self.read();
            let mut buf = BytesMut::from(&msg[..]);
            let mut out = BytesMut::new();
            match Message::parse(&mut buf).expect("parse").expect("complete") {
                Message::AuthenticationOk => return,
                Message::AuthenticationMd5Password(b) => {
                    let resp = md5_hash(user.as_bytes(), self.password.as_bytes(), b.salt());
                    fe::password_message(resp.as_bytes(), &mut out).expect("encode");
                }
                Message::AuthenticationSasl(_) => {
                    let mut scram =
                        ScramSha256::new(self.password.as_bytes(), ChannelBinding::unsupported());
                    fe::sasl_initial_response("SCRAM-SHA-256", scram.message(), &mut out)
                        .expect("encode");
                    self.send(&out);
                    out.clear();
                    let Message::AuthenticationSaslContinue(c) = self.parse_next() else {
                        panic!("expected SASLContinue")
                    };
                    scram.update(c.data()).expect("server-first");
                    fe::sasl_response(scram.message(), &mut out).expect("encode");
                    self.send(&out);
                    let Message::AuthenticationSaslFinal(f) = self.parse_next() else {
                        panic!("expected SASLFinal")
                    };
                    scram.finish(f.data()).expect("server signature");
                    continue;
                }
                Message::ErrorResponse(_) => panic!("origin refused the lab credentials"),
                _ => panic!("unexpected auth message"),
            }
            self.send(&out);
        }
    }

    fn parse_next(&mut self) -> Message {
        let (_, msg) = self.read();
        let mut buf = BytesMut::from(&msg[..]);
        Message::parse(&mut buf).expect("parse").expect("complete")
    }

    fn simple(&mut self, sql: &str) -> Vec<u8> {
        let mut b = BytesMut::new();
        fe::query(sql, &mut b).expect("encode");
        self.send(&b);
        self.until_ready()
    }
}

fn int4_field(name: &'static [u8], format: Format) -> FieldDescription<'static> {
    FieldDescription {
        name,
        table_oid: 0,
        column_id: 0,
        type_oid: 23,
        type_size: 4,
        type_modifier: -1,
        format,
    }
}

#[test]
fn simple_query_bytes_equal_the_origin() {
    let mut o = Origin::connect();
    let mut ours = Vec::new();
    compose_row_description(&mut ours, &[int4_field(b"answer", Format::Text)]);
    compose_data_row(&mut ours, &[Some(b"42")]);
    compose_select_complete(&mut ours, 1);
    compose_ready_for_query(&mut ours, TxStatus::Idle);
    assert_eq!(o.simple("SELECT 42 AS answer"), ours);

    let mut ours = Vec::new();
    compose_empty_query_response(&mut ours);
    compose_ready_for_query(&mut ours, TxStatus::Idle);
    assert_eq!(o.simple(""), ours);

    let mut ours = Vec::new();
    compose_command_complete(&mut ours, b"BEGIN");
    compose_ready_for_query(&mut ours, TxStatus::InTransaction);
    assert_eq!(o.simple("BEGIN"), ours);
    let got = o.simple("SELECT 1/0");
    assert_eq!(got.last(), Some(&b'E'), "failed transaction status");
    let mut ours = Vec::new();
    compose_command_complete(&mut ours, b"ROLLBACK");
    compose_ready_for_query(&mut ours, TxStatus::Idle);
    assert_eq!(o.simple("ROLLBACK"), ours);
}

#[test]
fn extended_query_bytes_equal_the_origin() {
    let mut o = Origin::connect();
    let mut b = BytesMut::new();
    fe::parse("s1", "SELECT $1::int4 AS v", [23u32], &mut b).expect("encode");
    fe::describe(b'S', "s1", &mut b).expect("encode");
    fe::bind(
        "",
        "s1",
        [1i16],
        [7i32],
        |v, buf| {
            buf.extend_from_slice(&v.to_be_bytes());
            Ok(postgres_protocol::IsNull::No)
        },
        [1i16],
        &mut b,
    )
    .map_err(|_| ())
    .expect("encode");
    fe::describe(b'P', "", &mut b).expect("encode");
    fe::execute("", 0, &mut b).expect("encode");
    fe::close(b'S', "s1", &mut b).expect("encode");
    fe::sync(&mut b);
    o.send(&b);
    let mut ours = Vec::new();
    compose_parse_complete(&mut ours);
    compose_parameter_description(&mut ours, &[23]);
    compose_row_description(&mut ours, &[int4_field(b"v", Format::Text)]);
    compose_bind_complete(&mut ours);
    compose_row_description(&mut ours, &[int4_field(b"v", Format::Binary)]);
    compose_data_row(&mut ours, &[Some(&7i32.to_be_bytes())]);
    compose_select_complete(&mut ours, 1);
    compose_close_complete(&mut ours);
    compose_ready_for_query(&mut ours, TxStatus::Idle);
    assert_eq!(o.until_ready(), ours);
}

#[test]
fn error_fields_match_the_origin() {
    let mut o = Origin::connect();
    let got = o.simple("SELECT 1/0");
    let mut buf = BytesMut::from(&got[..]);
    let Some(Message::ErrorResponse(e)) = Message::parse(&mut buf).expect("parse") else {
        panic!("expected an error")
    };
    let mut fields = e.fields();
    let mut theirs = Vec::new();
    while let Some(f) = fields.next().expect("field") {
        if matches!(f.type_(), b'S' | b'V' | b'C' | b'M') {
            theirs.push((f.type_(), f.value_bytes().to_vec()));
        }
    }
    let mut ours = Vec::new();
    compose_error_response(
        &mut ours,
        &ErrorFields::error(b"22012", b"division by zero"),
    );
    // Our message is exactly those four fields, in the origin's order.
    let mut expect = Vec::new();
    for (t, v) in &theirs {
        expect.push(*t);
        expect.extend_from_slice(v);
        expect.push(0);
    }
    expect.push(0);
    assert_eq!(&ours[5..], &expect[..]);
}
