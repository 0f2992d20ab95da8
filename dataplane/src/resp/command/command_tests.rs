//! Tests for COMMAND parsing and the COMMAND table reply.

use super::super::test_util::{parse, strings};
use super::*;

/// A decoded reply value, enough to check the table's shape.
#[derive(Debug, PartialEq)]
enum Value {
    Simple(String),
    Int(i64),
    Bulk(String),
    Null,
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Set(Vec<Value>),
}

fn line(buf: &[u8], pos: &mut usize) -> String {
    let end = *pos + buf[*pos..].windows(2).position(|w| w == b"\r\n").unwrap();
    let s = String::from_utf8(buf[*pos..end].to_vec()).unwrap();
    *pos = end + 2;
    s
}

fn decode(buf: &[u8], pos: &mut usize) -> Value {
    let kind = buf[*pos];
    *pos += 1;
    let head = line(buf, pos);
    let n = || head.parse::<usize>().unwrap();
    let many = |pos: &mut usize, n| (0..n).map(|_| decode(buf, pos)).collect::<Vec<_>>();
    match kind {
        b'+' => Value::Simple(head),
        b':' => Value::Int(head.parse().unwrap()),
        b'_' => Value::Null,
        b'$' if head == "-1" => Value::Null,
        b'$' => {
            let s = String::from_utf8(buf[*pos..*pos + n()].to_vec()).unwrap();
            *pos += n();
            assert_eq!(&buf[*pos..*pos + 2], b"\r\n");
            *pos += 2;
            Value::Bulk(s)
        }
        b'*' => Value::Array(many(pos, n())),
        b'~' => Value::Set(many(pos, n())),
        b'%' => Value::Map(
            (0..n())
                .map(|_| (decode(buf, pos), decode(buf, pos)))
                .collect(),
        ),
        other => panic!("unexpected type byte {other}"),
    }
}

fn decode_all(buf: &[u8]) -> Value {
    let mut pos = 0;
    let value = decode(buf, &mut pos);
    assert_eq!(pos, buf.len(), "trailing bytes");
    value
}

fn sub(words: &[&str]) -> Result<CommandSub<'static>, CommandError> {
    match parse(words)? {
        Command::Command { sub } => Ok(sub),
        other => panic!("{other:?}"),
    }
}

#[test]
fn subcommands() {
    assert!(matches!(sub(&["COMMAND"]), Ok(CommandSub::All)));
    assert!(matches!(sub(&["command", "count"]), Ok(CommandSub::Count)));
    assert_eq!(
        sub(&["COMMAND", "COUNT", "x"]).map(|_| ()),
        Err(CommandError::WrongArity("command|count"))
    );
    match sub(&["COMMAND", "DOCS", "get", "mget"]) {
        Ok(CommandSub::Docs { names }) => assert_eq!(strings(names), ["get", "mget"]),
        other => panic!("{other:?}"),
    }
    match sub(&["COMMAND", "info"]) {
        Ok(CommandSub::Info { names }) => assert!(names.is_empty()),
        other => panic!("{other:?}"),
    }
    match sub(&["COMMAND", "GETKEYS", "GET", "k"]) {
        Ok(CommandSub::Other { name, args }) => {
            assert_eq!(name, b"GETKEYS");
            assert_eq!(strings(args), ["GET", "k"]);
        }
        other => panic!("{other:?}"),
    }
}

const GET_ROW_RESP2: &[u8] = b"*10\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n\
:1\r\n:1\r\n:1\r\n*3\r\n+@read\r\n+@string\r\n+@fast\r\n*0\r\n\
*1\r\n*6\r\n$5\r\nflags\r\n*2\r\n+RO\r\n+access\r\n\
$12\r\nbegin_search\r\n*4\r\n$4\r\ntype\r\n$5\r\nindex\r\n$4\r\nspec\r\n*2\r\n$5\r\nindex\r\n:1\r\n\
$9\r\nfind_keys\r\n*4\r\n$4\r\ntype\r\n$5\r\nrange\r\n$4\r\nspec\r\n\
*6\r\n$7\r\nlastkey\r\n:0\r\n$7\r\nkeystep\r\n:1\r\n$5\r\nlimit\r\n:0\r\n*0\r\n";

#[test]
#[allow(clippy::single_range_in_vec_init)] // one name, not a range to expand
fn get_row_is_byte_exact_in_resp2() {
    let names = [0..3];
    let mut out = Vec::new();
    compose_command_info(&mut out, Args::new(b"get", &names), Protocol::Resp2);
    assert_eq!(out, [&b"*1\r\n"[..], GET_ROW_RESP2].concat());
}

fn rows(proto: Protocol) -> Vec<Value> {
    let mut out = Vec::new();
    compose_command_table(&mut out, proto);
    match decode_all(&out) {
        Value::Array(rows) => rows,
        other => panic!("{other:?}"),
    }
}

fn fields(row: &Value) -> &[Value] {
    match row {
        Value::Array(f) => f,
        other => panic!("{other:?}"),
    }
}

#[test]
fn table_shape_resp2() {
    let rows = rows(Protocol::Resp2);
    assert_eq!(rows.len(), TABLE.len());
    for row in &rows {
        let f = fields(row);
        assert_eq!(f.len(), 10, "{row:?}");
        assert!(matches!(f[0], Value::Bulk(_)));
        assert!(matches!(f[1], Value::Int(_)));
        for i in [2, 6, 7, 8, 9] {
            assert!(matches!(f[i], Value::Array(_)), "field {i} of {row:?}");
        }
        for i in [3, 4, 5] {
            assert!(matches!(f[i], Value::Int(_)), "field {i} of {row:?}");
        }
    }
    let mget = fields(&rows[1]);
    assert_eq!(mget[0], Value::Bulk("mget".into()));
    assert_eq!(mget[1], Value::Int(-2));
    assert_eq!(mget[3], Value::Int(1));
    assert_eq!(mget[4], Value::Int(-1));
}

#[test]
fn table_shape_resp3_uses_sets_and_maps() {
    for row in rows(Protocol::Resp3) {
        let f = fields(&row);
        assert_eq!(f.len(), 10);
        for i in [2, 6, 7] {
            assert!(matches!(f[i], Value::Set(_)), "field {i} of {row:?}");
        }
        if let Value::Array(specs) = &f[8] {
            for spec in specs {
                let Value::Map(pairs) = spec else {
                    panic!("{spec:?}")
                };
                assert_eq!(pairs[0].0, Value::Bulk("flags".into()));
                assert!(matches!(pairs[0].1, Value::Set(_)));
            }
        }
    }
}

#[test]
fn subcommand_rows_are_nested() {
    let rows = rows(Protocol::Resp2);
    let client = rows
        .iter()
        .find(|r| fields(r)[0] == Value::Bulk("client".into()))
        .expect("client row");
    let Value::Array(subs) = &fields(client)[9] else {
        panic!()
    };
    let names: Vec<_> = subs.iter().map(|s| fields(s)[0].clone_name()).collect();
    assert_eq!(
        names,
        [
            "client|setname",
            "client|getname",
            "client|setinfo",
            "client|id",
            "client|info"
        ]
    );
}

impl Value {
    fn clone_name(&self) -> String {
        match self {
            Value::Bulk(s) => s.clone(),
            other => panic!("{other:?}"),
        }
    }
}

/// Every described command is one the parser recognises, with the arity it advertises.
#[test]
fn table_agrees_with_parser() {
    let all = TABLE.iter().chain(TABLE.iter().flat_map(|s| s.subcommands));
    for spec in all {
        let mut words: Vec<&str> = spec.name.split('|').collect();
        let arity = usize::try_from(spec.arity.unsigned_abs()).unwrap();
        while words.len() < arity {
            words.push("1");
        }
        if spec.name == "hello" {
            words.truncate(1);
        }
        let parsed = parse(&words);
        assert!(
            !matches!(
                parsed,
                Ok(Command::Unknown { .. } | Command::Write { .. }) | Err(_)
            ),
            "{}: {parsed:?}",
            spec.name
        );
        let is_sub = spec.name.contains('|');
        assert!(
            !is_sub
                || !matches!(
                    parsed,
                    Ok(Command::Command {
                        sub: CommandSub::Other { .. }
                    }) | Ok(Command::Client {
                        sub: super::super::ClientSub::Other { .. }
                    })
                ),
            "{}: {parsed:?}",
            spec.name
        );
    }
}

#[test]
fn info_count_docs() {
    let buf = b"getnopeclient|ID";
    let names = [0..3, 3..7, 7..16];
    let mut out = Vec::new();
    compose_command_info(&mut out, Args::new(buf, &names), Protocol::Resp3);
    let Value::Array(rows) = decode_all(&out) else {
        panic!()
    };
    assert_eq!(rows.len(), 3);
    assert_eq!(fields(&rows[0])[0], Value::Bulk("get".into()));
    assert_eq!(rows[1], Value::Null);
    assert_eq!(fields(&rows[2])[0], Value::Bulk("client|id".into()));

    let mut out = Vec::new();
    compose_command_info(&mut out, Args::new(b"", &[]), Protocol::Resp2);
    let mut table = Vec::new();
    compose_command_table(&mut table, Protocol::Resp2);
    assert_eq!(out, table);

    let mut out = Vec::new();
    compose_command_count(&mut out);
    assert_eq!(out, format!(":{}\r\n", TABLE.len()).as_bytes());
    assert_eq!(TABLE.len(), 20);

    let mut out = Vec::new();
    compose_command_docs(&mut out, Args::new(b"", &[]), Protocol::Resp2);
    compose_command_docs(&mut out, Args::new(b"", &[]), Protocol::Resp3);
    assert_eq!(out, b"*0\r\n%0\r\n");
}
