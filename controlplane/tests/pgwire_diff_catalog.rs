//! The `PgTable` the catalog publishes in the key space must describe a cached table exactly as
//! the origin's RowDescription for `SELECT * FROM t` does (names, table OID, attnums, type OIDs,
//! typlen, typmod), since the PostgreSQL front composes cached answers from it. The origin's
//! RowDescription is read raw off the wire (tokio-postgres does not expose typlen).

use pgline_controlplane::catalog::Catalog;
use pgline_controlplane::config::CatalogConfig;
use pgline_dataplane::keyspace::{PgColumn, PgTable};
use pgline_testkit::pg::Wire;
use pgline_testkit::{lab, origin, pg};
use postgres_protocol::message::frontend as fe;

/// One field of a RowDescription, with the table OID it names.
#[derive(Debug, PartialEq, Eq)]
struct Field {
    name: String,
    table_oid: u32,
    column: PgColumn,
    format: i16,
}

/// The RowDescription the origin sends for simple query `sql`.
async fn row_description(raw: &mut Wire, sql: &str) -> Vec<Field> {
    let reply = raw
        .exchange(&pg::msgs(|b| fe::query(sql, b).expect("enc")))
        .await;
    let mut fields = None;
    for (tag, body) in reply {
        match tag {
            b'T' => fields = Some(parse_row_description(&body)),
            b'E' => panic!("{sql}: {}", String::from_utf8_lossy(&body)),
            _ => {}
        }
    }
    fields.expect("a RowDescription")
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
async fn assert_describes(raw: &mut Wire, table: &PgTable, sql: &str) {
    let fields = row_description(raw, sql).await;
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
    let db = origin::TestDb::create("pgmeta").await;
    let client = db.client().await;
    client.batch_execute(SCHEMA).await.expect("schema");
    let catalog = Catalog::load(&client, &CatalogConfig::default())
        .await
        .expect("catalog");
    let ks = catalog.keyspace();
    let mut raw = Wire::connect(origin::origin_addr(), &db.name, &[]).await;

    for (schema, name, sql) in [
        (None, "t", "SELECT * FROM t"),
        (Some("other"), "Mixed", "SELECT * FROM other.\"Mixed\""),
    ] {
        let table = ks.pg_table_named(schema, name).expect("published");
        assert_describes(&mut raw, table, sql).await;
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
    let db = origin::TestDb::create("pgmeta_ddl").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, label varchar(20), price numeric(10,2));
             INSERT INTO t SELECT g, 'x' || g, g FROM generate_series(1, 5) g;",
        )
        .await
        .expect("schema");
    let p = lab::start(lab::config(&db, 1)).await;
    let mut raw = Wire::connect(origin::origin_addr(), &db.name, &[]).await;
    let published = || {
        p.shared
            .keyspace()
            .snapshot()
            .pg_table_named(None, "t")
            .cloned()
    };
    let t = published().expect("t published at start");
    assert_describes(&mut raw, &t, "SELECT * FROM t").await;

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
        lab::sync(&p, &origin).await;
        let t = published().expect("t still published");
        assert!(t.columns.iter().any(|c| &*c.name == check), "{ddl}");
        assert_describes(&mut raw, &t, "SELECT * FROM t").await;
    }
    p.shutdown().await;
}
