//! Backend composers checked two ways: byte-literal fixtures, and decoding by
//! postgres-protocol's client-side parser (the one tokio-postgres uses).

use super::*;
use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::Message;

/// Decodes exactly one message from `bytes` with postgres-protocol.
fn decode(bytes: &[u8]) -> Message {
    let mut buf = BytesMut::from(bytes);
    let msg = Message::parse(&mut buf)
        .expect("well-formed")
        .expect("complete");
    assert!(buf.is_empty(), "{} bytes left over", buf.len());
    msg
}

fn composed(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

#[test]
fn fixed_layouts() {
    assert_eq!(composed(compose_auth_ok), b"R\0\0\0\x08\0\0\0\0");
    assert_eq!(
        composed(|o| compose_auth_md5(o, *b"abcd")),
        b"R\0\0\0\x0c\0\0\0\x05abcd"
    );
    assert_eq!(
        composed(|o| compose_ready_for_query(o, TxStatus::InTransaction)),
        b"Z\0\0\0\x05T"
    );
    assert_eq!(composed(compose_parse_complete), b"1\0\0\0\x04");
    assert_eq!(composed(compose_bind_complete), b"2\0\0\0\x04");
    assert_eq!(composed(compose_close_complete), b"3\0\0\0\x04");
    assert_eq!(composed(compose_no_data), b"n\0\0\0\x04");
    assert_eq!(composed(compose_portal_suspended), b"s\0\0\0\x04");
    assert_eq!(composed(compose_empty_query_response), b"I\0\0\0\x04");
    assert_eq!(composed(|o| compose_ssl_response(o, false)), b"N");
    assert_eq!(
        composed(|o| compose_data_row(o, &[Some(b"42"), None])),
        b"D\0\0\0\x10\0\x02\0\0\0\x0242\xff\xff\xff\xff"
    );
    assert_eq!(
        composed(|o| compose_select_complete(o, 12)),
        b"C\0\0\0\x0eSELECT 12\0"
    );
}

#[test]
fn auth_messages_decode() {
    assert!(matches!(
        decode(&composed(compose_auth_ok)),
        Message::AuthenticationOk
    ));
    let Message::AuthenticationMd5Password(b) =
        decode(&composed(|o| compose_auth_md5(o, [1, 2, 3, 4])))
    else {
        panic!()
    };
    assert_eq!(b.salt(), [1, 2, 3, 4]);
    let Message::AuthenticationSasl(b) =
        decode(&composed(|o| compose_auth_sasl(o, &[b"SCRAM-SHA-256"])))
    else {
        panic!()
    };
    let mechs: Vec<String> = b
        .mechanisms()
        .map(|m| Ok(m.to_owned()))
        .collect()
        .expect("ok");
    assert_eq!(mechs, ["SCRAM-SHA-256"]);
    let Message::AuthenticationSaslContinue(b) = decode(&composed(|o| {
        compose_auth_sasl_continue(o, b"r=abc,s=xyz,i=4096")
    })) else {
        panic!()
    };
    assert_eq!(b.data(), b"r=abc,s=xyz,i=4096");
    let Message::AuthenticationSaslFinal(b) =
        decode(&composed(|o| compose_auth_sasl_final(o, b"v=sig")))
    else {
        panic!()
    };
    assert_eq!(b.data(), b"v=sig");
}

#[test]
fn session_messages_decode() {
    let Message::ParameterStatus(b) = decode(&composed(|o| {
        compose_parameter_status(o, b"client_encoding", b"UTF8")
    })) else {
        panic!()
    };
    assert_eq!(
        (b.name().ok(), b.value().ok()),
        (Some("client_encoding"), Some("UTF8"))
    );
    let Message::BackendKeyData(b) = decode(&composed(|o| compose_backend_key_data(o, 77, -5)))
    else {
        panic!()
    };
    assert_eq!((b.process_id(), b.secret_key()), (77, -5));
    let Message::ReadyForQuery(b) =
        decode(&composed(|o| compose_ready_for_query(o, TxStatus::Failed)))
    else {
        panic!()
    };
    assert_eq!(b.status(), b'E');
}

#[test]
fn rows_decode() {
    let fields = [
        FieldDescription {
            name: b"id",
            table_oid: 16384,
            column_id: 1,
            type_oid: 23,
            type_size: 4,
            type_modifier: -1,
            format: Format::Binary,
        },
        FieldDescription {
            name: b"name",
            table_oid: 16384,
            column_id: 2,
            type_oid: 1043,
            type_size: -1,
            type_modifier: 68,
            format: Format::Text,
        },
    ];
    let Message::RowDescription(b) = decode(&composed(|o| compose_row_description(o, &fields)))
    else {
        panic!()
    };
    let got: Vec<_> = b
        .fields()
        .map(|f| {
            Ok((
                f.name().to_owned(),
                f.table_oid(),
                f.column_id(),
                f.type_oid(),
                f.type_size(),
                f.type_modifier(),
                f.format(),
            ))
        })
        .collect()
        .expect("ok");
    assert_eq!(
        got,
        [
            ("id".to_owned(), 16384, 1, 23, 4, -1, 1),
            ("name".to_owned(), 16384, 2, 1043, -1, 68, 0)
        ]
    );
    let Message::DataRow(b) = decode(&composed(|o| {
        compose_data_row(o, &[Some(b"x"), None, Some(b"")])
    })) else {
        panic!()
    };
    let values: Vec<Option<Vec<u8>>> = b
        .ranges()
        .map(|r| Ok(r.map(|r| b.buffer()[r].to_vec())))
        .collect()
        .expect("ok");
    assert_eq!(values, [Some(b"x".to_vec()), None, Some(vec![])]);
    let Message::ParameterDescription(b) =
        decode(&composed(|o| compose_parameter_description(o, &[23, 25])))
    else {
        panic!()
    };
    let oids: Vec<u32> = b.parameters().collect().expect("ok");
    assert_eq!(oids, [23, 25]);
    let Message::CommandComplete(b) =
        decode(&composed(|o| compose_command_complete(o, b"INSERT 0 1")))
    else {
        panic!()
    };
    assert_eq!(b.tag().ok(), Some("INSERT 0 1"));
}

#[test]
fn errors_decode_with_all_fields_and_no_embedded_nul() {
    let e = ErrorFields {
        detail: Some(b"bad\0detail"),
        hint: Some(b"try again"),
        position: Some(17),
        ..ErrorFields::fatal(
            crate::pgwire::sqlstate::INVALID_PASSWORD,
            b"password authentication failed",
        )
    };
    for notice in [false, true] {
        let bytes = composed(|o| {
            if notice {
                compose_notice_response(o, &e)
            } else {
                compose_error_response(o, &e)
            }
        });
        let msg = decode(&bytes);
        let mut fields = match &msg {
            Message::ErrorResponse(b) if !notice => b.fields(),
            Message::NoticeResponse(b) if notice => b.fields(),
            _ => panic!("wrong message kind"),
        };
        let mut got = Vec::new();
        while let Some(f) = fields.next().expect("ok") {
            got.push((
                f.type_(),
                String::from_utf8_lossy(f.value_bytes()).into_owned(),
            ));
        }
        let want: Vec<(u8, String)> = [
            (b'S', "FATAL"),
            (b'V', "FATAL"),
            (b'C', "28P01"),
            (b'M', "password authentication failed"),
            (b'D', "baddetail"),
            (b'H', "try again"),
            (b'P', "17"),
        ]
        .iter()
        .map(|&(t, v)| (t, v.to_owned()))
        .collect();
        assert_eq!(got, want);
    }
}

#[test]
fn negotiate_protocol_version_layout() {
    assert_eq!(
        composed(|o| compose_negotiate_protocol_version(o, 0, &[b"_pq_.x"])),
        b"v\0\0\0\x13\0\0\0\0\0\0\0\x01_pq_.x\0"
    );
}
