//! The origin catalog: which tables are cached, their columns, key columns and key prefixes.
//!
//! A table's id in the store is its relation OID, the same id pgoutput's Relation messages
//! carry, so WAL changes map to store entries without a name lookup. The catalog is read from the
//! origin at start-up and re-read for a table when the WAL reports that its definition changed.

use std::collections::HashMap;
use std::sync::Arc;

use pgline_dataplane::keyspace::KeySpace;

use crate::config::CatalogConfig;
use crate::rowjson::{json_kind, JsonColumn};

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("origin: reading the catalog failed: {0}")]
    Origin(#[from] tokio_postgres::Error),
    #[error("catalog: table {0:?} does not exist on the origin")]
    NoSuchTable(String),
    #[error("catalog: table {0:?} has no primary key, so its rows have no key")]
    NoPrimaryKey(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    pub name: String,
    /// Type OID with domains resolved to their base type.
    pub type_oid: u32,
    /// The column's declared type OID (a domain stays a domain), as pgoutput reports it.
    pub declared_type_oid: u32,
    /// SQL name of the type, for casts in fill queries (`format_type`).
    pub type_name: String,
}

#[derive(Debug, Clone)]
pub struct TableInfo {
    pub id: u32,
    pub schema: String,
    pub name: String,
    pub columns: Vec<ColumnInfo>,
    /// Indexes into `columns` of the primary key, in key order.
    pub key_columns: Vec<usize>,
    pub json_columns: Vec<JsonColumn>,
    pub prefixes: Vec<String>,
}

impl TableInfo {
    /// `"schema"."name"`, quoted for SQL.
    pub fn qualified(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }

    /// Splits a key's pk text into one text per key column (`a:b` for a two-column key).
    pub fn split_pk<'a>(&self, pk: &'a [u8]) -> Option<Vec<&'a [u8]>> {
        let n = self.key_columns.len();
        let parts: Vec<&[u8]> = pk.splitn(n, |b| *b == b':').collect();
        (parts.len() == n).then_some(parts)
    }

    /// The pk text of a row given its column texts.
    pub fn pk_text(&self, values: &[Option<&[u8]>]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for (i, &c) in self.key_columns.iter().enumerate() {
            if i > 0 {
                out.push(b':');
            }
            out.extend_from_slice(values.get(c).copied().flatten()?);
        }
        Some(out)
    }
}

pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub tables: HashMap<u32, Arc<TableInfo>>,
}

const TABLES_SQL: &str = "SELECT c.oid, n.nspname::text, c.relname::text \
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
       AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%' \
       AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) \
     ORDER BY 2, 3";

const COLUMNS_SQL: &str = "SELECT a.attnum::int4, a.attname::text, \
       (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END)::oid, \
       format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END, NULL), \
       a.atttypid \
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
     WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

const KEY_SQL: &str = "SELECT k.attnum::int4 FROM pg_index i, \
       unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
     WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord";

const RESOLVE_SQL: &str = "SELECT c.oid, n.nspname::text, c.relname::text \
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.oid = to_regclass($1)";

impl Catalog {
    /// Reads the cached tables from the origin.
    pub async fn load(
        client: &tokio_postgres::Client,
        cfg: &CatalogConfig,
    ) -> Result<Catalog, CatalogError> {
        let mut found: Vec<(u32, String, String)> = Vec::new();
        if cfg.tables.is_empty() {
            for row in client.query(TABLES_SQL, &[]).await? {
                found.push((row.get(0), row.get(1), row.get(2)));
            }
        } else {
            for t in &cfg.tables {
                let row = client
                    .query_opt(RESOLVE_SQL, &[t])
                    .await?
                    .ok_or_else(|| CatalogError::NoSuchTable(t.clone()))?;
                found.push((row.get(0), row.get(1), row.get(2)));
            }
        }
        let mut catalog = Catalog::default();
        for (oid, schema, name) in found {
            let table = load_table(client, oid, schema, name).await?;
            catalog.tables.insert(oid, Arc::new(table));
        }
        catalog.assign_prefixes(cfg);
        Ok(catalog)
    }

    /// Re-reads one table (after a WAL relation change); `None` if it is gone or lost its key.
    pub async fn reload_table(
        &mut self,
        client: &tokio_postgres::Client,
        oid: u32,
        cfg: &CatalogConfig,
    ) -> Result<(), CatalogError> {
        let Some(old) = self.tables.get(&oid).cloned() else {
            return Ok(());
        };
        match load_table(client, oid, old.schema.clone(), old.name.clone()).await {
            Ok(t) => {
                self.tables.insert(oid, Arc::new(t));
            }
            Err(CatalogError::NoPrimaryKey(_)) => {
                self.tables.remove(&oid);
            }
            Err(e) => return Err(e),
        }
        self.assign_prefixes(cfg);
        Ok(())
    }

    /// Adds a table first seen in the WAL (every-table mode), if it has a primary key.
    pub async fn add_table(
        &mut self,
        client: &tokio_postgres::Client,
        oid: u32,
        cfg: &CatalogConfig,
    ) -> Result<(), CatalogError> {
        let Some(row) = client
            .query_opt(
                "SELECT n.nspname::text, c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
                &[&oid],
            )
            .await?
        else {
            return Ok(());
        };
        match load_table(client, oid, row.get(0), row.get(1)).await {
            Ok(t) => {
                self.tables.insert(oid, Arc::new(t));
                self.assign_prefixes(cfg);
                Ok(())
            }
            Err(CatalogError::NoPrimaryKey(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every table answers to `schema.name`; to `name` alone when that is unambiguous; and to
    /// any prefix configured for it.
    fn assign_prefixes(&mut self, cfg: &CatalogConfig) {
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for t in self.tables.values() {
            *by_name.entry(t.name.clone()).or_default() += 1;
        }
        let ids: Vec<u32> = self.tables.keys().copied().collect();
        for id in ids {
            let Some(t) = self.tables.get(&id) else {
                continue;
            };
            let mut t = (**t).clone();
            let qualified = format!("{}.{}", t.schema, t.name);
            let mut prefixes = vec![qualified.clone()];
            if by_name.get(&t.name) == Some(&1) || t.schema == "public" {
                prefixes.push(t.name.clone());
            }
            for (table, prefix) in &cfg.prefixes {
                if *table == t.name || *table == qualified {
                    prefixes.push(prefix.clone());
                }
            }
            prefixes.retain(|p| !p.contains(':'));
            t.prefixes = prefixes;
            self.tables.insert(id, Arc::new(t));
        }
    }

    /// The key space the cores use to turn `users:42` into (table id, pk).
    pub fn keyspace(&self) -> KeySpace {
        let mut ks = KeySpace::new();
        let mut ids: Vec<&u32> = self.tables.keys().collect();
        ids.sort();
        for id in ids {
            for p in &self.tables[id].prefixes {
                ks.add(p, *id);
            }
        }
        ks
    }

    pub fn get(&self, id: u32) -> Option<&Arc<TableInfo>> {
        self.tables.get(&id)
    }
}

async fn load_table(
    client: &tokio_postgres::Client,
    oid: u32,
    schema: String,
    name: String,
) -> Result<TableInfo, CatalogError> {
    let mut columns = Vec::new();
    let mut attnums = Vec::new();
    for row in client.query(COLUMNS_SQL, &[&oid]).await? {
        attnums.push(row.get::<_, i32>(0));
        columns.push(ColumnInfo {
            name: row.get(1),
            type_oid: row.get(2),
            declared_type_oid: row.get(4),
            type_name: row.get(3),
        });
    }
    let mut key_columns = Vec::new();
    for row in client.query(KEY_SQL, &[&oid]).await? {
        let attnum: i32 = row.get(0);
        if let Some(i) = attnums.iter().position(|a| *a == attnum) {
            key_columns.push(i);
        }
    }
    if key_columns.is_empty() {
        return Err(CatalogError::NoPrimaryKey(format!("{schema}.{name}")));
    }
    let json_columns = columns
        .iter()
        .map(|c| JsonColumn {
            name: c.name.clone(),
            kind: json_kind(c.type_oid),
        })
        .collect();
    Ok(TableInfo {
        id: oid,
        schema,
        name,
        columns,
        key_columns,
        json_columns,
        prefixes: Vec::new(),
    })
}
