//! `load`: create and fill the bench table on the origin.
//!
//! `bench_rows(id int8 primary key, name, email, plan, credits numeric(10,2), active,
//! created timestamptz, rev int4)`, ids `0..keyspace`, ~166 bytes of `row_to_json` per row for
//! 5-digit ids (the published benchmark's row size). Writers bump `rev`. The database named in
//! the origin string is created when it does not exist. A table that already has exactly
//! `keyspace` rows with ids `0..keyspace` is kept (its `rev`s reset) unless `--force`.
//! `--preload ADDR` SETs every row into a RESP server (Valkey, the cache-aside way);
//! `--warm ADDR` MGETs every key once (pgline's read-through fills).

#![deny(unsafe_code)]

use crate::cli::LoadArgs;
use crate::error::BenchError;
use crate::pg;
use crate::resp::{compose_get, RespConn};
use crate::target::key_bytes;
use serde::Serialize;
use tokio_postgres::Client;

/// Keys per MSET / MGET when preloading or warming.
const BATCH: u64 = 500;

/// What `load` did.
#[derive(Debug, Serialize)]
pub struct LoadReport {
    /// Keys SET into `--preload` servers (each).
    pub preloaded: u64,
    /// Keys found when warming `--warm` servers (summed).
    pub warmed_found: u64,
    /// Rows in the table.
    pub rows: i64,
    /// Whether the table was (re)created.
    pub created: bool,
    /// Average `row_to_json` length.
    pub avg_json_bytes: f64,
}

/// Runs `load`.
pub async fn load(args: &LoadArgs) -> Result<LoadReport, BenchError> {
    let table = &args.data.table;
    pg::check_table(table)?;
    ensure_database(&args.data.origin).await?;
    let c = pg::connect(&args.data.origin).await?;
    let n = args.data.keyspace as i64;
    let exists: bool = c
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
        .await?
        .get(0);
    let keep = exists && !args.force && {
        let r = c
            .query_one(
                &format!(
                    "SELECT count(*), coalesce(min(id), 0), coalesce(max(id), -1) FROM {table}"
                ),
                &[],
            )
            .await?;
        (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2)) == (n, 0, n - 1)
    };
    if keep {
        c.execute(&format!("UPDATE {table} SET rev = 0 WHERE rev <> 0"), &[])
            .await?;
    } else {
        c.batch_execute(&format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (id int8 PRIMARY KEY, name text, email text, plan text,
                 credits numeric(10,2), active bool, created timestamptz, rev int4 NOT NULL DEFAULT 0);
             INSERT INTO {table} {};",
            pg::row_select(&format!("generate_series(0, {n} - 1) g"))
        ))
        .await?;
    }
    c.batch_execute(&format!("VACUUM ANALYZE {table}")).await?;
    let r = c
        .query_one(
            &format!("SELECT count(*), coalesce(avg(octet_length(row_to_json(t)::text)), 0)::float8 FROM {table} t"),
            &[],
        )
        .await?;
    let mut rep = LoadReport {
        preloaded: 0,
        warmed_found: 0,
        rows: r.get(0),
        created: !keep,
        avg_json_bytes: r.get(1),
    };
    for addr in &args.preload {
        rep.preloaded = preload(&c, table, args.data.keyspace, addr).await?;
    }
    for addr in &args.warm {
        rep.warmed_found += warm(table, args.data.keyspace, addr).await?;
    }
    Ok(rep)
}

/// SETs (MSET in batches) every row's JSON into a RESP server; returns the keys set.
async fn preload(c: &Client, table: &str, keyspace: u64, addr: &str) -> Result<u64, BenchError> {
    let sql = format!("SELECT id, row_to_json(t)::text FROM {table} t WHERE id >= $1 AND id < $2");
    let stmt = c.prepare(&sql).await?;
    let mut conn = RespConn::connect(addr).await?;
    let prefix = format!("{table}:").into_bytes();
    let mut set = 0u64;
    let mut lo = 0u64;
    while lo < keyspace {
        let hi = (lo + BATCH).min(keyspace);
        let rows = c.query(&stmt, &[&(lo as i64), &(hi as i64)]).await?;
        lo = hi;
        if rows.is_empty() {
            continue;
        }
        let pairs: Vec<(Vec<u8>, String)> = rows
            .iter()
            .map(|r| (key_bytes(&prefix, r.get::<_, i64>(0) as u64), r.get(1)))
            .collect();
        let mut args: Vec<&[u8]> = vec![b"MSET"];
        for (k, v) in &pairs {
            args.push(k);
            args.push(v.as_bytes());
        }
        conn.command(&args).await?;
        set += pairs.len() as u64;
    }
    Ok(set)
}

/// MGETs every key once (pgline fills what it does not hold); returns the keys found.
async fn warm(table: &str, keyspace: u64, addr: &str) -> Result<u64, BenchError> {
    let mut conn = RespConn::connect(addr).await?;
    let prefix = format!("{table}:").into_bytes();
    let mut found = 0u64;
    let mut lo = 0u64;
    while lo < keyspace {
        let hi = (lo + BATCH).min(keyspace);
        let ids: Vec<u64> = (lo..hi).collect();
        compose_get(&mut conn.wbuf, &prefix, &ids, true);
        conn.flush().await?;
        let t = conn.read_tally().await?;
        if t.error {
            return Err(BenchError::Config(format!(
                "MGET on {addr} answered an error"
            )));
        }
        found += u64::from(t.found);
        lo = hi;
    }
    Ok(found)
}

/// Creates the origin string's database if connecting says it does not exist.
pub async fn ensure_database(origin: &str) -> Result<(), BenchError> {
    let cfg: tokio_postgres::Config = origin.parse()?;
    let Some(db) = cfg.get_dbname().map(str::to_string) else {
        return Ok(());
    };
    match tokio_postgres::connect(origin, tokio_postgres::NoTls).await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_CATALOG_NAME) => {
            let mut admin = cfg.clone();
            admin.dbname("postgres");
            let (client, conn) = admin.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            client
                .batch_execute(&format!("CREATE DATABASE \"{}\"", db.replace('"', "\"\"")))
                .await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
