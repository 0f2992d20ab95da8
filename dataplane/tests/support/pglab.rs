//! A lab for the PostgreSQL front: a uniquely named table on the real origin, some of its rows
//! copied into a store exactly as the origin prints them (text output, read over a simple
//! query), its description read from `pg_attribute`, an engine with a pg listener, and the
//! stand-in relay. Needs PostgreSQL at 127.0.0.1:54329 (deploy/lab/pg.sh start).
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use pgline_dataplane::engine::Engine;
use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell, PgColumn, PgTable};
use pgline_dataplane::plane::{ControlWakers, Shared};
use pgline_dataplane::row::encode_columns;
use pgline_dataplane::store::{self, EntryData, StoreConfig, StoreWriter};
use postgres_protocol::message::frontend as fe;

use super::pgorigin::{connect_origin, read_message, simple, until_ready, Relay};

pub struct Lab {
    pub table: String,
    pub engine: Engine,
    pub relay: Relay,
    pub shared: Arc<Shared>,
    pub origin: TcpStream,
    pub pg_table: Arc<PgTable>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        simple(
            &mut self.origin,
            &format!("DROP TABLE IF EXISTS {}", self.table),
        );
    }
}

/// The messages of a backend reply: (tag, body).
pub fn messages(reply: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= reply.len() {
        let len = u32::from_be_bytes(reply[at + 1..at + 5].try_into().expect("len")) as usize;
        out.push((reply[at], &reply[at + 5..at + 1 + len]));
        at += 1 + len;
    }
    out
}

/// The values of the first DataRow of a reply.
pub fn first_row(reply: &[u8]) -> Vec<Option<Vec<u8>>> {
    let (_, body) = messages(reply)
        .into_iter()
        .find(|(t, _)| *t == b'D')
        .expect("a DataRow");
    row_values(body)
}

/// The values of a DataRow body.
pub fn row_values(body: &[u8]) -> Vec<Option<Vec<u8>>> {
    let n = i16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        let len = i32::from_be_bytes(body[at..at + 4].try_into().expect("len"));
        at += 4;
        if len < 0 {
            values.push(None);
        } else {
            values.push(Some(body[at..at + len as usize].to_vec()));
            at += len as usize;
        }
    }
    values
}

fn text(v: &Option<Vec<u8>>) -> String {
    String::from_utf8(v.clone().expect("not null")).expect("utf8")
}

/// Creates `pgl_core_<tag>_<pid>` with `columns` (the first is the int4 primary key `id`),
/// runs `setup` (with `{t}` replaced by the table name), and copies rows `cached` into the
/// store as the origin prints them. One kernel core with a pg listener.
pub fn lab(tag: &str, columns: &str, setup: &str, cached: &[i32]) -> Lab {
    lab_with(tag, columns, setup, cached, |shared| {
        let mut ecfg = super::rig::engine_config(1, 64, "127.0.0.1:0");
        ecfg.pg_listen = Some("127.0.0.1:0".parse().expect("addr"));
        Engine::start(ecfg, shared).expect("engine")
    })
}

/// [`lab`] with the engine (one core) that `start` starts.
pub fn lab_with(
    tag: &str,
    columns: &str,
    setup: &str,
    cached: &[i32],
    start: impl FnOnce(Arc<Shared>) -> Engine,
) -> Lab {
    let (mut origin, _) = connect_origin("postgres");
    let table = format!("pgl_core_{tag}_{}", std::process::id());
    simple(&mut origin, &format!("DROP TABLE IF EXISTS {table}"));
    let created = simple(
        &mut origin,
        &format!(
            "CREATE TABLE {table} ({columns}); {}",
            setup.replace("{t}", &table)
        ),
    );
    assert!(!created.windows(6).any(|w| w == b"SERROR"), "setup failed");
    let pg_table = describe(&mut origin, &table);
    let cfg = StoreConfig {
        memory_bytes: 16 << 20,
        segment_bytes: 1 << 20,
        max_page_level: pgline_hugepages::PageLevel::Base,
        prefault: false,
    };
    let (mut writer, reader) = store::open(&cfg).expect("store");
    for &id in cached {
        cache_row(&mut origin, &mut writer, &pg_table, id);
    }
    let mut ks = KeySpace::new();
    let id = pg_table.id;
    ks.add(&table, id);
    ks.add_pg_table(pg_table);
    let shared = Arc::new(Shared::new(
        reader,
        KeySpaceCell::new(ks),
        1,
        1024,
        ControlWakers::none(),
    ));
    std::mem::forget(writer);
    shared.control_port().set_serve_hits(true);
    let engine = start(shared.clone());
    let relay = Relay::start(shared.clone(), "postgres");
    let pg_table = shared
        .keyspace()
        .snapshot()
        .pg_table(id)
        .expect("table")
        .clone();
    Lab {
        table,
        engine,
        relay,
        shared,
        origin,
        pg_table,
    }
}

/// The table's description from the catalog (dropped columns left out), key `id`.
fn describe(origin: &mut TcpStream, table: &str) -> PgTable {
    let oid: u32 =
        text(&first_row(&simple(origin, &format!("SELECT '{table}'::regclass::oid")))[0])
            .parse()
            .expect("oid");
    let reply = simple(
        origin,
        &format!(
            "SELECT attname, attnum, atttypid, attlen, atttypmod FROM pg_attribute \
             WHERE attrelid = {oid} AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ),
    );
    let mut columns = Vec::new();
    for (_, body) in messages(&reply).into_iter().filter(|(t, _)| *t == b'D') {
        let v = row_values(body);
        columns.push(PgColumn {
            name: text(&v[0]).as_str().into(),
            attnum: text(&v[1]).parse().expect("attnum"),
            type_oid: text(&v[2]).parse().expect("type"),
            typlen: text(&v[3]).parse().expect("len"),
            typmod: text(&v[4]).parse().expect("typmod"),
        });
    }
    PgTable {
        id: oid,
        schema: "public".into(),
        name: table.into(),
        columns: columns.into(),
        key_columns: vec![0].into(),
        key_names: vec!["id".to_string()].into(),
        row_security: false,
    }
}

/// Copies row `id` into the store as the origin prints it.
fn cache_row(origin: &mut TcpStream, writer: &mut StoreWriter, t: &PgTable, id: i32) {
    let values = first_row(&simple(
        origin,
        &format!("SELECT * FROM {} WHERE id = {id}", t.name),
    ));
    let mut cols = Vec::new();
    encode_columns(
        &mut cols,
        t.columns
            .iter()
            .zip(values.iter())
            .map(|(c, v)| (c.name.as_bytes(), v.as_deref())),
    );
    let sections: [&[u8]; 2] = [b"$2\r\n{}\r\n", &cols];
    let data = EntryData {
        sections: &sections,
        negative: false,
        lsn: 1,
    };
    writer
        .insert(t.id, id.to_string().as_bytes(), &data)
        .expect("insert");
}

/// A raw client through pgline, after startup (SSLRequest first, as libpq does).
pub fn client(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).expect("ssl");
    let mut n = [0u8; 1];
    std::io::Read::read_exact(&mut s, &mut n).expect("ssl answer");
    assert_eq!(n[0], b'N');
    let mut b = BytesMut::new();
    fe::startup_message([("user", "postgres"), ("database", "postgres")], &mut b).expect("enc");
    s.write_all(&b).expect("write");
    let (tag, _) = read_message(&mut s);
    assert_eq!(tag, b'R', "AuthenticationOk first");
    until_ready(&mut s);
    s
}
