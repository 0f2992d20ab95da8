//! The `PgTable` the catalog publishes in the key space must describe a cached table exactly as
//! the origin's RowDescription for `SELECT * FROM t` does (names, table OID, attnums, type OIDs,
//! typlen, typmod), since the PostgreSQL front composes cached answers from it. The origin's
//! RowDescription is read raw off the wire (tokio-postgres does not expose typlen).

mod common;
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;

use bytes::BytesMut;
use pgline_controlplane::catalog::Catalog;
use pgline_controlplane::config::CatalogConfig;
use pgline_dataplane::keyspace::{PgColumn, PgTable};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend as fe;

/// One field of a RowDescription, with the table OID it names.
#[derive(Debug, PartialEq, Eq)]
struct Field {
    name: String,
    table_oid: u32,
    column: PgColumn,
    format: i16,
}

/// A blocking protocol-3 client that keeps the raw backend messages.
struct Raw {
    stream: TcpStream,
}

impl Raw {
    fn connect(db: &str) -> Raw {
        let (host, port, user, password) = common::origin_base();
        let stream = TcpStream::connect((host.as_str(), port)).expect("origin is up");
        let mut raw = Raw { stream };
        let mut b = BytesMut::new();
        fe::startup_message([("user", user.as_str()), ("database", db)], &mut b).expect("enc");
        raw.send(&b);
        raw.authenticate(&password);
        while raw.read().0 != b'Z' {}
        raw
    }

    fn send(&mut self, b: &[u8]) {
        self.stream.write_all(b).expect("write");
    }

    /// One backend message: (tag, body without the length).
    fn read(&mut self) -> (u8, Vec<u8>) {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head).expect("read header");
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len - 4];
        self.stream.read_exact(&mut body).expect("read body");
        (head[0], body)
    }

    fn authenticate(&mut self, password: &str) {
        loop {
            let (tag, body) = self.read();
            assert_eq!(tag, b'R', "expected an authentication request");
            let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            let mut out = BytesMut::new();
            match code {
                0 => return,
                3 => fe::password_message(password.as_bytes(), &mut out).expect("enc"),
                10 => {
                    let mut scram =
                        ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
                    fe::sasl_initial_response("SCRAM-SHA-256", scram.message(), &mut out)
                        .expect("enc");
                    self.send(&out);
                    out.clear();
                    let (_, cont) = self.read();
                    scram.update(&cont[4..]).expect("server-first");
                    fe::sasl_response(scram.message(), &mut out).expect("enc");
                    self.send(&out);
                    let (_, fin) = self.read();
                    scram.finish(&fin[4..]).expect("server-final");
                    continue;
                }
                other => panic!("auth method {other} not supported by this test"),
            }
            self.send(&out);
        }
    }

    /// The RowDescription the origin sends for simple query `sql`.
    fn row_description(&mut self, sql: &str) -> Vec<Field> {
        let mut b = BytesMut::new();
        fe::query(sql, &mut b).expect("enc");
        self.send(&b);
        let mut fields = None;
        loop {
            let (tag, body) = self.read();
            match tag {
                b'T' => fields = Some(parse_row_description(&body)),
                b'E' => panic!("{sql}: {}", String::from_utf8_lossy(&body)),
                b'Z' => return fields.expect("a RowDescription"),
                _ => {}
            }
        }
    }
}

fn parse_row_description(body: &[u8]) -> Vec<Field> {
    let n = i16::from_be_bytes([body[0], body[1]]);
    let mut at = 2;
    let mut out = Vec::new();
    let u32_at = |b: &[u8], i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let i16_at = |b: &[u8], i: usize| i16::from_be_bytes([b[i], b[i + 1]]);
    for _ in 0..n {
        let end = at + body[at..].iter().position(|b| *b == 0).expect("name");
        let name = String::from_utf8(body[at..end].to_vec()).expect("utf8");
        at = end + 1;
        out.push(Field {
            column: PgColumn {
                name: name.as_str().into(),
                attnum: i16_at(body, at + 4),
                type_oid: u32_at(body, at + 6),
                typlen: i16_at(body, at + 10),
                typmod: u32_at(body, at + 12) as i32,
            },
            name,
            table_oid: u32_at(body, at),
            format: i16_at(body, at + 16),
        });
        at += 18;
    }
    out
}

/// `table` describes the columns of `sql`'s RowDescription exactly.
fn assert_describes(raw: &mut Raw, table: &PgTable, sql: &str) {
    let fields = raw.row_description(sql);
    assert_eq!(fields.len(), table.columns.len(), "{sql}: column count");
    for (f, c) in fields.iter().zip(table.columns.iter()) {
        assert_eq!(f.table_oid, table.id, "{sql}: table OID of {}", f.name);
        assert_eq!(&f.column, c, "{sql}: column {}", f.name);
        assert_eq!(f.format, 0);
    }
}

const SCHEMA: &str = "\
    CREATE DOMAIN short_name AS varchar(12);\
    CREATE DOMAIN nested_name AS short_name;\
    CREATE DOMAIN positive AS int CHECK (VALUE > 0);\
    CREATE TABLE t (id int, gone text, code text, price numeric(10,2), label varchar(20), \
        at timestamptz, qty positive, nick nested_name, tags short_name[], flag char(3), \
        bits bit(5), amount numeric, big int8, ok bool, PRIMARY KEY (code, id));\
    ALTER TABLE t DROP COLUMN gone;\
    CREATE SCHEMA other;\
    CREATE TABLE other.\"Mixed\" (\"Key\" uuid PRIMARY KEY, v jsonb, d date);";

#[tokio::test]
async fn pg_tables_match_the_origin_row_description() {
    let db = common::TestDb::create("pgmeta").await;
    let client = db.client().await;
    client.batch_execute(SCHEMA).await.expect("schema");
    let catalog = Catalog::load(&client, &CatalogConfig::default())
        .await
        .expect("catalog");
    let ks = catalog.keyspace();
    let mut raw = Raw::connect(&db.name);

    for (schema, name, sql) in [
        (None, "t", "SELECT * FROM t"),
        (Some("other"), "Mixed", "SELECT * FROM other.\"Mixed\""),
    ] {
        let table = ks.pg_table_named(schema, name).expect("published");
        assert_describes(&mut raw, table, sql);
        // tokio-postgres agrees on the types and typmods (extended protocol, Describe).
        let stmt = client.prepare(sql).await.expect("prepare");
        for (col, c) in stmt.columns().iter().zip(table.columns.iter()) {
            assert_eq!(col.type_().oid(), c.type_oid, "{sql}: {}", c.name);
            assert_eq!(col.type_modifier(), c.typmod, "{sql}: {}", c.name);
            assert_eq!(col.column_id(), Some(c.attnum), "{sql}: {}", c.name);
        }
        let info = catalog.get(table.id).expect("table info");
        let names: Vec<&str> = info.columns.iter().map(|c| c.name.as_str()).collect();
        let pg_names: Vec<&str> = table.columns.iter().map(|c| &*c.name).collect();
        assert_eq!(
            names, pg_names,
            "PgTable columns follow the store's columns section"
        );
    }

    let t = ks.pg_table_named(None, "t").expect("t");
    assert_eq!(
        &*t.key_columns,
        &[1, 0],
        "key order is the primary key's, not the table's"
    );
    assert_eq!(&*t.key_names, &["code".to_string(), "id".to_string()]);
    let attnums: Vec<i16> = t.columns.iter().map(|c| c.attnum).collect();
    assert_eq!(attnums, [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    // Spot checks against known catalog values, so a shared mistake cannot pass both sides.
    let col = |n: &str| t.columns.iter().find(|c| &*c.name == n).expect(n).clone();
    assert_eq!(
        (col("price").type_oid, col("price").typmod),
        (1700, 10 << 16 | 2 | 4)
    );
    assert_eq!((col("label").type_oid, col("label").typmod), (1043, 24));
    assert_eq!((col("nick").type_oid, col("nick").typmod), (1043, 16));
    assert_eq!((col("qty").type_oid, col("qty").typlen), (23, 4));
    assert_eq!(col("at").typlen, 8);
    let m = ks.pg_table_named(Some("other"), "Mixed").expect("Mixed");
    assert_eq!(&*m.key_names, &["Key".to_string()]);
    assert_eq!(m.columns[0].type_oid, 2950);
}

/// A running pgline publishes the tables in the key space the cores read, and re-publishes a
/// table whose definition changed (a typmod change alone included) once the WAL shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_pg_tables_follow_ddl() {
    let db = common::TestDb::create("pgmeta_ddl").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, label varchar(20), price numeric(10,2));
             INSERT INTO t SELECT g, 'x' || g, g FROM generate_series(1, 5) g;",
        )
        .await
        .expect("schema");
    let p = support::start(support::config(&db, 1)).await;
    let mut raw = Raw::connect(&db.name);
    let published = || {
        p.shared
            .keyspace()
            .snapshot()
            .pg_table_named(None, "t")
            .cloned()
    };
    let t = published().expect("t published at start");
    assert_describes(&mut raw, &t, "SELECT * FROM t");

    for (ddl, check) in [
        ("ALTER TABLE t ALTER COLUMN label TYPE varchar(30)", "label"),
        (
            "ALTER TABLE t ALTER COLUMN price TYPE numeric(12,3)",
            "price",
        ),
        ("ALTER TABLE t ADD COLUMN extra timestamptz", "extra"),
    ] {
        origin.batch_execute(ddl).await.expect("ddl");
        // The next write carries the new Relation message.
        origin
            .batch_execute("UPDATE t SET label = label WHERE id = 1")
            .await
            .expect("write");
        support::sync(&p, &origin).await;
        let t = published().expect("t still published");
        assert!(t.columns.iter().any(|c| &*c.name == check), "{ddl}");
        assert_describes(&mut raw, &t, "SELECT * FROM t");
    }
    p.shutdown().await;
}
