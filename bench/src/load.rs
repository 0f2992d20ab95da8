//! `load`: create and fill the bench table on the origin.
//!
//! `bench_rows(id int8 primary key, name, email, plan, credits numeric(10,2), active,
//! created timestamptz, rev int4)`, ids `0..keyspace`, ~166 bytes of `row_to_json` per row for
//! 5-digit ids (the published benchmark's row size). Writers bump `rev`. The database named in
//! the origin string is created when it does not exist. A table that already has exactly
//! `keyspace` rows with ids `0..keyspace` is kept (its `rev`s reset) unless `--force`.

#![deny(unsafe_code)]

use crate::cli::LoadArgs;
use crate::error::BenchError;
use crate::pg;
use serde::Serialize;

/// What `load` did.
#[derive(Debug, Serialize)]
pub struct LoadReport {
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
    Ok(LoadReport {
        rows: r.get(0),
        created: !keep,
        avg_json_bytes: r.get(1),
    })
}

/// Creates the origin string's database if connecting says it does not exist.
async fn ensure_database(origin: &str) -> Result<(), BenchError> {
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
