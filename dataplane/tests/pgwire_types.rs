//! Cached point lookups across column types: binary result formats produced from the stored
//! text output must be byte-for-byte what the origin sends, types without an exact conversion
//! go to the origin, and session settings that change text output turn hits off.
//! Needs PostgreSQL at 127.0.0.1:54329 (deploy/lab/pg.sh start).

mod support;

use std::io::Write;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use pgline_dataplane::plane::PgRequestKind;
use postgres_protocol::message::frontend as fe;
use postgres_protocol::IsNull;
use support::pglab::{self, client, Lab};
use support::pgorigin::{simple, until_ready};

const COLUMNS: &str = "id int4 PRIMARY KEY, a int2, b int8, o oid, flag bool, t text, \
    v varchar(10), c char(5), nm name, f4 float4, f8 float8, u uuid, by bytea, j json, \
    jb jsonb, num numeric(6,2), ts timestamptz, ip inet";
const ROWS: &str = "INSERT INTO {t} VALUES \
    (1, -7, 9007199254740993, 4000000000, true, 'héllo', 'vv', 'ab', 'nm', 0.1, \
     3.141592653589793, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '\\x00ff10', \
     '{\"a\": [1, 2]}', '{\"b\": 1, \"a\": [1]}', 12.5, '2024-01-02 03:04:05+00', \
     '10.0.0.1'), \
    (2, NULL, NULL, NULL, false, '', NULL, NULL, NULL, 1e-40, '-Infinity', NULL, '\\x', \
     NULL, '[]', NULL, NULL, NULL), \
    (3, 1, 1, 1, NULL, 'x', 'x', 'x', 'x', 'NaN', 'NaN', NULL, NULL, NULL, NULL, 1, NULL, \
     NULL)";
/// Every column with an exact binary conversion.
const CONVERTIBLE: &str = "id, a, b, o, flag, t, v, c, nm, f4, f8, u, by, j, jb";

fn lab(tag: &str) -> Lab {
    pglab::lab(tag, COLUMNS, ROWS, &[1, 2, 3])
}

/// Parse (int4 parameter), Bind (binary parameter, `formats` for the results), Describe
/// portal, Execute, Sync.
fn lookup(sql: &str, id: i32, formats: &[i16]) -> BytesMut {
    let mut b = BytesMut::new();
    fe::parse("", sql, [23u32], &mut b).expect("parse");
    fe::bind(
        "",
        "",
        [1i16],
        [id],
        |p, buf| {
            buf.extend_from_slice(&p.to_be_bytes());
            Ok::<_, Box<dyn std::error::Error + Sync + Send>>(IsNull::No)
        },
        formats.iter().copied(),
        &mut b,
    )
    .map_err(|_| "bind")
    .expect("bind");
    fe::describe(b'P', "", &mut b).expect("describe");
    fe::execute("", 0, &mut b).expect("execute");
    fe::sync(&mut b);
    b
}

fn hits(lab: &Lab) -> u64 {
    lab.shared.stats(0).keys_hit.load(Ordering::Relaxed)
}

fn batches(lab: &Lab) -> usize {
    let seen = lab.relay.seen.lock().expect("seen");
    seen.requests
        .iter()
        .filter(|(k, _)| *k == PgRequestKind::Batch)
        .count()
}

/// Sends `msgs` through pgline and to the origin; the replies must be identical. Returns
/// whether pgline served it (a hit, nothing forwarded).
fn same(lab: &mut Lab, c: &mut std::net::TcpStream, msgs: &[u8], what: &str) -> bool {
    let (h, b) = (hits(lab), batches(lab));
    c.write_all(msgs).expect("write");
    let ours = until_ready(c);
    lab.origin.write_all(msgs).expect("write");
    let theirs = until_ready(&mut lab.origin);
    assert_eq!(ours, theirs, "{what}: bytes differ");
    let served = hits(lab) == h + 1;
    assert_eq!(served, batches(lab) == b, "{what}: a hit or a forward");
    served
}

#[test]
fn binary_results_are_byte_identical_and_unconvertible_ones_forward() {
    let mut lab = lab("bin");
    let addr = lab.engine.pg_local_addr().expect("pg listener");
    let mut c = client(addr);
    let t = lab.table.clone();
    let sql = format!("SELECT {CONVERTIBLE} FROM {t} WHERE id = $1");
    for id in [1, 2] {
        assert!(same(
            &mut lab,
            &mut c,
            &lookup(&sql, id, &[1]),
            "all binary"
        ));
        assert!(same(&mut lab, &mut c, &lookup(&sql, id, &[]), "all text"));
        let mixed: Vec<i16> = (0..15).map(|i| i % 2).collect();
        assert!(same(&mut lab, &mut c, &lookup(&sql, id, &mixed), "mixed"));
    }
    // NaN's bits are not in its text: the origin answers.
    assert!(!same(&mut lab, &mut c, &lookup(&sql, 3, &[1]), "NaN"));
    // numeric and timestamptz convert (see `binary_dates_and_numerics_...` below); inet has
    // no conversion: binary goes to the origin...
    let all = format!("SELECT * FROM {t} WHERE id = $1");
    assert!(same(
        &mut lab,
        &mut c,
        &lookup(
            &format!("SELECT id, num, ts FROM {t} WHERE id = $1"),
            1,
            &[1]
        ),
        "numeric and timestamptz binary"
    ));
    assert!(!same(
        &mut lab,
        &mut c,
        &lookup(&all, 1, &[1]),
        "inet binary"
    ));
    // ...text for that column is served.
    let mut per_column = vec![1i16; 18];
    per_column[17] = 0;
    assert!(same(
        &mut lab,
        &mut c,
        &lookup(&all, 1, &per_column),
        "per column"
    ));
    // A format count that is neither 0, 1 nor the column count: the origin's error.
    assert!(!same(
        &mut lab,
        &mut c,
        &lookup(&all, 1, &[1, 1]),
        "bad count"
    ));
}

#[test]
fn tokio_postgres_prepared_lookups_hit() {
    let lab = lab("tokbin");
    let addr = lab.engine.pg_local_addr().expect("pg listener");
    let t = lab.table.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let before = hits(&lab);
    rt.block_on(async {
        let conf = format!(
            "host=127.0.0.1 port={} user=postgres password=pgline dbname=postgres",
            addr.port()
        );
        let (client, conn) = tokio_postgres::connect(&conf, tokio_postgres::NoTls)
            .await
            .expect("connect through pgline");
        tokio::spawn(conn);
        let stmt = client
            .prepare(&format!(
                "SELECT a, b, t, f8, u, by, jb FROM {t} WHERE id = $1"
            ))
            .await
            .expect("prepare");
        for _ in 0..3 {
            let row = client.query_one(&stmt, &[&1i32]).await.expect("query");
            assert_eq!(row.get::<_, i16>(0), -7);
            assert_eq!(row.get::<_, i64>(1), 9007199254740993);
            assert_eq!(row.get::<_, &str>(2), "héllo");
            assert_eq!(row.get::<_, f64>(3), std::f64::consts::PI);
            assert_eq!(row.get::<_, &[u8]>(5), &[0, 255, 16]);
        }
        let row = client
            .query_one(&format!("SELECT f4 FROM {t} WHERE id = $1"), &[&2i32])
            .await
            .expect("query");
        assert_eq!(row.get::<_, f32>(0), 1e-40f32);
    });
    assert_eq!(hits(&lab), before + 4, "every prepared lookup was a hit");
}

/// numeric and the date/time types in binary, edge values included: byte for byte the
/// origin's (its `*_send` functions), or forwarded when the text cannot say.
#[test]
fn binary_dates_and_numerics_are_the_origins_send_output() {
    // (column, literal, served from cache in binary)
    let values: &[(&str, &str, bool)] = &[
        ("n", "0", true),
        ("n", "0.000", true),
        ("n", "-123.4500", true),
        ("n", "1", true),
        ("n", "-0.5", true),
        ("n", "9999.9999", true),
        ("n", "10000", true),
        ("n", "100000000", true),
        ("n", "0.0001", true),
        ("n", "0.00000000000000000001", true),
        ("n", "12345678901234567890.123456789012345678901", true),
        ("n", "('1' || repeat('0', 1000))::numeric", true),
        ("n", "('0.' || repeat('0', 16382) || '1')::numeric", true),
        ("n", "'NaN'", true),
        ("n", "'Infinity'", true),
        ("n", "'-Infinity'", true),
        ("d", "'2000-01-01'", true),
        ("d", "'1999-12-31'", true),
        ("d", "'2024-02-29'", true),
        ("d", "'0001-01-01'", true),
        ("d", "'0044-03-15 BC'", true),
        ("d", "'4713-01-01 BC'", true),
        ("d", "'5874897-12-31'", true),
        ("d", "'infinity'", true),
        ("d", "'-infinity'", true),
        ("t", "'00:00:00'", true),
        ("t", "'23:59:59.999999'", true),
        ("t", "'24:00:00'", true),
        ("t", "'12:00:00.5'", true),
        ("tt", "'00:00:00+00'", true),
        ("tt", "'12:34:56.789+05:30'", true),
        ("tt", "'01:02:03-08'", true),
        ("tt", "'23:59:59.999999-15:59:59'", true),
        ("ts", "'2000-01-01 00:00:00'", true),
        ("ts", "'1970-01-01 00:00:00.000001'", true),
        ("ts", "'1999-12-31 23:59:59.999999'", true),
        ("ts", "'0044-03-15 12:00:00 BC'", true),
        ("ts", "'4713-01-01 00:00:00 BC'", true),
        ("ts", "'294276-12-31 23:59:59.999999'", true),
        ("ts", "'infinity'", true),
        ("ts", "'-infinity'", true),
        ("tz", "'2000-01-01 00:00:00+00'", true),
        ("tz", "'2024-02-29 12:34:56.5+09'", true),
        ("tz", "'1900-06-01 00:00:00+00'", true),
        ("tz", "'0001-01-01 00:00:00+00 BC'", true),
        ("tz", "'294276-12-31 23:59:59.999999+00'", true),
        ("tz", "'infinity'", true),
        ("tz", "'-infinity'", true),
        ("iv", "'0 seconds'", true),
        ("iv", "'1 year 2 mons 3 days 04:05:06.789'", true),
        ("iv", "'-1 years -2 mons +3 days -04:05:06'", true),
        ("iv", "'-3 days'", true),
        ("iv", "'1 mon'", true),
        ("iv", "'100000 hours'", true),
        ("iv", "'-0.000001 seconds'", true),
        (
            "iv",
            "'178956970 years 7 mons 2147483647 days 2562047788:00:54.775807'",
            true,
        ),
        ("iv", "'-178956970 years -8 mons -2147483648 days'", true),
    ];
    let rows: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, (col, lit, _))| {
            format!("INSERT INTO {{t}} (id, {col}) VALUES ({}, {lit});", i + 1)
        })
        .collect();
    let ids: Vec<i32> = (1..=values.len() as i32).collect();
    let mut lab = pglab::lab(
        "dates",
        "id int4 PRIMARY KEY, n numeric, d date, t time, tt timetz, ts timestamp, \
         tz timestamptz, iv interval",
        &rows.concat(),
        &ids,
    );
    let addr = lab.engine.pg_local_addr().expect("pg listener");
    let mut c = client(addr);
    let t = lab.table.clone();
    let sql = format!("SELECT n, d, t, tt, ts, tz, iv FROM {t} WHERE id = $1");
    for (i, (col, lit, served)) in values.iter().enumerate() {
        let what = format!("{col} = {lit}");
        let id = i as i32 + 1;
        assert_eq!(
            same(&mut lab, &mut c, &lookup(&sql, id, &[1]), &what),
            *served,
            "{what}: served from cache"
        );
        // Text stays served either way.
        assert!(same(&mut lab, &mut c, &lookup(&sql, id, &[]), &what));
    }
}

/// A simple query through pgline and on the origin (same settings on both): same bytes.
/// Returns whether pgline served it.
fn same_simple(lab: &mut Lab, c: &mut std::net::TcpStream, sql: &str) -> bool {
    let (h, b) = (hits(lab), batches(lab));
    let ours = simple(c, sql);
    assert_eq!(ours, simple(&mut lab.origin, sql), "{sql}: bytes differ");
    let served = hits(lab) == h + 1;
    assert_eq!(served, batches(lab) == b, "{sql}: a hit or a forward");
    served
}

#[test]
fn settings_that_change_text_output_turn_hits_off() {
    let mut lab = lab("settings");
    let addr = lab.engine.pg_local_addr().expect("pg listener");
    let mut c = client(addr);
    let t = lab.table.clone();
    let ts = format!("SELECT id, ts FROM {t} WHERE id = 1");
    let f8 = format!("SELECT f8, by FROM {t} WHERE id = 1");
    assert!(same_simple(&mut lab, &mut c, &ts));
    assert!(!same_simple(
        &mut lab,
        &mut c,
        "SET TimeZone = 'Asia/Tokyo'"
    ));
    let tokyo = simple(&mut c, &ts);
    assert!(
        tokyo.windows(22).any(|w| w == b"2024-01-02 12:04:05+09"),
        "the origin's timestamptz text in Tokyo"
    );
    assert!(
        !same_simple(&mut lab, &mut c, &ts),
        "date/time column: origin"
    );
    assert!(
        same_simple(&mut lab, &mut c, &f8),
        "other columns still hit"
    );
    assert!(!same_simple(&mut lab, &mut c, "SET DateStyle = 'German'"));
    assert!(!same_simple(&mut lab, &mut c, "RESET TimeZone"));
    assert!(
        !same_simple(&mut lab, &mut c, &ts),
        "DateStyle still German"
    );
    assert!(!same_simple(&mut lab, &mut c, "RESET DateStyle"));
    assert!(same_simple(&mut lab, &mut c, &ts), "server defaults again");
    // Unreported settings (extra_float_digits, bytea_output, search_path, the role...) are
    // read from the origin by the product relay after each batch; this stand-in relay vouches
    // for every state, so they are tested through the real relay
    // (controlplane/tests/adversarial_identity.rs).
}
