//! The origin catalog: which tables are cached, their columns, key columns and key prefixes.
//!
//! A table's id in the store is its relation OID, the same id pgoutput's Relation messages
//! carry, so WAL changes map to store entries without a name lookup. The catalog is read from the
//! origin at start-up and re-read for a table when the WAL reports that its definition changed.
//! DROP and RENAME are not in the WAL: [`check_tables`] finds them (the writer polls it, see
//! `writer/ddl.rs`), and the fill query refuses to read a name that no longer names the cached
//! OID (`fill::batch_sql`).
//!
//! The store writer owns the catalog and is its only mutator; it publishes every new version to a
//! [`CatalogCell`] (readers: the admin API, tests), the same way it publishes the key space to the
//! cores. Tables can be added and removed at run time (`add_table`/`remove_table` in
//! `crate::admin`); [`publication_add`]/[`publication_drop`] keep a table-list publication in step.
//!
//! The key space it builds ([`Catalog::keyspace`]) also carries a `PgTable` per cached table for
//! the PostgreSQL front: the columns in the order of the store's columns section with the type
//! OID, typmod and typlen PostgreSQL reports for them in RowDescription (domains resolved to
//! their base type and typmod at every level), and the key columns.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use pgline_dataplane::keyspace::{KeySpace, PgColumn, PgTable};

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
    /// A relation that is not a user table whose changes reach the WAL (see [`REFUSAL_SQL`]).
    #[error("catalog: {name} is not cacheable: {reason}")]
    NotCacheable { name: String, reason: String },
}

/// Why relation `c` (in namespace `n`) can never be cached, or NULL. Only user tables whose
/// changes reach the WAL are: system catalogs are not in the logical-replication stream (their
/// rows would go stale, and they hold secrets such as `pg_authid.rolpassword`); views, foreign
/// tables and the like have no changes of their own; unlogged and temporary tables write no WAL.
/// Every schema beginning with `pg_` is a system one (`pg_catalog`, `pg_toast`, `pg_temp_N`,
/// `pg_toast_temp_N`: PostgreSQL reserves the prefix).
pub const REFUSAL_SQL: &str = "CASE \
       WHEN n.nspname = 'information_schema' OR n.nspname LIKE 'pg\\_%' \
         THEN 'a system catalog (only user tables are cached)' \
       WHEN c.relkind = 'v' THEN 'a view (only tables are cached)' \
       WHEN c.relkind = 'm' THEN 'a materialized view (its refreshes are not in the WAL)' \
       WHEN c.relkind = 'f' THEN 'a foreign table (its rows live elsewhere)' \
       WHEN c.relkind NOT IN ('r', 'p') THEN 'not a table' \
       WHEN c.relpersistence = 'u' THEN 'unlogged (its changes never reach the WAL)' \
       WHEN c.relpersistence = 't' THEN 'temporary (its changes never reach the WAL)' \
     END";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    pub name: String,
    /// Type OID with domains resolved to their base type.
    pub type_oid: u32,
    /// The column's declared type OID (a domain stays a domain), as pgoutput reports it.
    pub declared_type_oid: u32,
    /// SQL name of the type, for casts in fill queries (`format_type`).
    pub type_name: String,
    /// `pg_attribute.attnum` (dropped columns leave gaps).
    pub attnum: i16,
    /// The type modifier RowDescription reports: `atttypmod`, or for a domain its base's.
    pub typmod: i32,
    /// `pg_type.typlen` of the base type (RowDescription's data type size).
    pub typlen: i16,
    /// The column's declared `atttypmod` (a domain column's is -1), as pgoutput reports it.
    pub declared_typmod: i32,
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
    /// Row-level security is enabled (`relrowsecurity`; `FORCE` or not, see
    /// `force_row_security`): the rows a role sees depend on the role.
    pub row_security: bool,
    /// `relforcerowsecurity`: RLS applies to the table's owner too.
    pub force_row_security: bool,
}

impl TableInfo {
    /// The table as the PostgreSQL front describes it: columns in the order of the store's
    /// columns section (`fill::encode_row` writes `columns` in this order), each with what
    /// RowDescription reports for it in `SELECT * FROM t`.
    pub fn pg_table(&self) -> PgTable {
        let columns: Vec<PgColumn> = self
            .columns
            .iter()
            .map(|c| PgColumn {
                name: c.name.as_str().into(),
                attnum: c.attnum,
                type_oid: c.type_oid,
                typlen: c.typlen,
                typmod: c.typmod,
            })
            .collect();
        PgTable {
            id: self.id,
            schema: self.schema.as_str().into(),
            name: self.name.as_str().into(),
            columns: columns.into(),
            key_columns: self.key_columns.clone().into(),
            key_names: self
                .key_columns
                .iter()
                .map(|&i| self.columns[i].name.clone())
                .collect(),
            row_security: self.row_security,
        }
    }

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
    /// User tables that cannot be cached, with why (no primary key, unlogged, a partition read
    /// through its parent): their keys answer an error on RESP rather than a nil that would look
    /// like an absent row. Sorted by `(schema, name)`.
    pub refused: Vec<RefusedTable>,
}

/// A user table pgline cannot cache (see [`Catalog::refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedTable {
    pub schema: String,
    pub name: String,
    pub reason: String,
}

/// `EXISTS` a primary key on relation `$rel` (an SQL expression naming a relation OID).
macro_rules! has_pk {
    ($rel:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = ",
            $rel,
            " AND i.indisprimary)"
        )
    };
}

/// A partition whose partitioned ancestor has a primary key: cached through that ancestor (the
/// publication publishes its changes as the root's), never on its own in every-table mode.
const UNDER_KEYED_PARENT: &str = concat!(
    "(c.relispartition AND EXISTS (SELECT 1 FROM pg_partition_ancestors(c.oid) a \
       WHERE a.relid <> c.oid AND ",
    has_pk!("a.relid"),
    "))"
);

/// Every user table (`r`, `p`) that every-table mode does not cache, and why.
fn refused_sql() -> String {
    format!(
        "SELECT n.nspname::text, c.relname::text, CASE \
           WHEN c.relpersistence = 'u' THEN 'unlogged (its changes never reach the WAL)' \
           WHEN c.relpersistence = 't' THEN 'temporary (its changes never reach the WAL)' \
           WHEN NOT {pk} THEN 'no primary key (its rows have no key)' \
           ELSE 'a partition: its rows are read through its partitioned table' END \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') \
           AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%' \
           AND (c.relpersistence <> 'p' OR NOT {pk} OR {UNDER_KEYED_PARENT}) \
         ORDER BY 1, 2",
        pk = has_pk!("c.oid"),
    )
}

/// What can move an open session's name resolution with no statement of its own, as one digest
/// (`writer/ddl.rs`): every schema's OID, name, owner and access list, whether each cache user
/// (`$1`, by name) may use it now (a schema without `USAGE` is left out of the resolved path;
/// this follows role memberships and `INHERIT` wherever they change), then each cache user's
/// OID and name (`"$user"` is the current name). Not the schema rows' versions: a `GRANT` that
/// grants nothing new rewrites the row, and a permission job re-granting every minute would
/// close every session's gate every minute. Temporary schemas are left out: only their own
/// session sees them, and each new one would read as a change. Names starting `pg_` are
/// reserved, so no user schema passes for a temporary one. SHA-256, which FIPS builds allow.
pub const NAMES_SQL: &str = "SELECT pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(\
     pg_catalog.concat_ws(';', \
     (SELECT pg_catalog.string_agg(pg_catalog.concat_ws(':', n.oid, n.nspname, n.nspowner, \
       n.nspacl, \
       (SELECT pg_catalog.string_agg( \
          pg_catalog.has_schema_privilege(r.oid, n.oid, 'USAGE')::pg_catalog.text, ',' \
          ORDER BY r.oid) \
        FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) ANY ($1))), \
       ',' ORDER BY n.oid) \
      FROM pg_catalog.pg_namespace n \
      WHERE n.nspname OPERATOR(pg_catalog.!~) '^pg_(toast_)?temp_'), \
     (SELECT pg_catalog.string_agg(pg_catalog.concat_ws(':', oid, rolname), ',' ORDER BY oid) \
      FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) ANY ($1))), \
     'UTF8')), 'hex')";

/// See [`NAMES_SQL`]; `users`: the identities that may read the cache.
pub async fn load_names(
    client: &tokio_postgres::Client,
    users: &[String],
) -> Result<String, CatalogError> {
    Ok(client.query_one(NAMES_SQL, &[&users]).await?.get(0))
}

/// The user tables pgline cannot cache (see [`Catalog::refused`]).
pub async fn load_refused(
    client: &tokio_postgres::Client,
) -> Result<Vec<RefusedTable>, CatalogError> {
    Ok(client
        .query(&refused_sql(), &[])
        .await?
        .iter()
        .map(|r| RefusedTable {
            schema: r.get(0),
            name: r.get(1),
            reason: r.get(2),
        })
        .collect())
}

/// Every table every-table mode caches: user tables whose changes reach the WAL, with a primary
/// key, and not partitions of a keyed partitioned table.
pub fn tables_sql() -> String {
    format!(
        "SELECT c.oid, n.nspname::text, c.relname::text \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p' \
           AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%' \
           AND {} AND NOT {UNDER_KEYED_PARENT} \
         ORDER BY 2, 3",
        has_pk!("c.oid")
    )
}

/// One row per live column of table `$1`, in `attnum` order (the order of the store's columns
/// section): attnum, name, base type OID (domains resolved through every level, as
/// `getBaseTypeAndTypmod` does for RowDescription), the base type's SQL name, the declared type
/// OID, the typmod RowDescription reports (for a domain: the innermost domain's `typtypmod`), the
/// base type's `typlen`, the column's 1-based position in the primary key (NULL if not in it)
/// and its declared `atttypmod`. One round trip per table.
const COLUMNS_SQL: &str = "SELECT a.attnum::int4, a.attname::text, b.typid, \
       format_type(b.typid, NULL), a.atttypid, b.typmod, bt.typlen::int4, \
       (SELECT k.ord FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
         WHERE i.indrelid = a.attrelid AND i.indisprimary AND k.attnum = a.attnum)::int4, \
       a.atttypmod \
     FROM pg_attribute a \
     CROSS JOIN LATERAL ( \
       WITH RECURSIVE d(typid, typmod, depth) AS ( \
         SELECT a.atttypid, a.atttypmod, 0 \
         UNION ALL \
         SELECT t.typbasetype, t.typtypmod, d.depth + 1 \
           FROM d JOIN pg_type t ON t.oid = d.typid WHERE t.typtype = 'd') \
       SELECT d.typid, d.typmod FROM d ORDER BY d.depth DESC LIMIT 1) b \
     JOIN pg_type bt ON bt.oid = b.typid \
     WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

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
            for row in client.query(&tables_sql(), &[]).await? {
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
            for (oid, schema, name) in &found {
                if let Some(reason) = refusal(client, *oid).await? {
                    return Err(CatalogError::NotCacheable {
                        name: format!("catalog.tables: {schema}.{name}"),
                        reason,
                    });
                }
            }
        }
        let mut catalog = Catalog::default();
        for (oid, schema, name) in found {
            let table = load_table(client, oid, schema, name).await?;
            catalog.tables.insert(oid, Arc::new(table));
        }
        catalog.refused = load_refused(client).await?;
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
            Err(CatalogError::NoPrimaryKey(_) | CatalogError::NotCacheable { .. }) => {
                self.tables.remove(&oid);
            }
            Err(e) => return Err(e),
        }
        self.assign_prefixes(cfg);
        Ok(())
    }

    /// Adds (or replaces) a table loaded with [`load_named_table`].
    pub fn insert(&mut self, table: TableInfo, cfg: &CatalogConfig) {
        self.tables.insert(table.id, Arc::new(table));
        self.assign_prefixes(cfg);
    }

    /// Removes a table; true if it was there.
    pub fn remove(&mut self, id: u32, cfg: &CatalogConfig) -> bool {
        let was = self.tables.remove(&id).is_some();
        self.assign_prefixes(cfg);
        was
    }

    /// Re-derives every table's prefixes (after `catalog.prefixes` changed).
    pub fn reassign_prefixes(&mut self, cfg: &CatalogConfig) {
        self.assign_prefixes(cfg);
    }

    /// The table called `name`: `schema.name`, or any of its key prefixes (`users`, `u`).
    pub fn find(&self, name: &str) -> Option<&Arc<TableInfo>> {
        let mut ids: Vec<&u32> = self.tables.keys().collect();
        ids.sort();
        let by =
            |f: &dyn Fn(&TableInfo) -> bool| ids.iter().map(|id| &self.tables[id]).find(|t| f(t));
        by(&|t| format!("{}.{}", t.schema, t.name) == name)
            .or_else(|| by(&|t| t.prefixes.iter().any(|p| p == name)))
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
            ks.add_pg_table(self.tables[id].pg_table());
        }
        for r in &self.refused {
            let why = format!(
                "ERR table {}.{} is not cacheable: {}",
                r.schema, r.name, r.reason
            )
            .replace(|c: char| c.is_control(), "?");
            let qualified = format!("{}.{}", r.schema, r.name);
            ks.add_refused(&qualified, &why);
            if r.schema == "public" {
                ks.add_refused(&r.name, &why);
            }
        }
        ks
    }

    pub fn get(&self, id: u32) -> Option<&Arc<TableInfo>> {
        self.tables.get(&id)
    }
}

/// The shared, swappable catalog snapshot the writer publishes (see the module doc).
#[derive(Debug, Default)]
pub struct CatalogCell {
    current: RwLock<Arc<Catalog>>,
}

impl CatalogCell {
    pub fn new(catalog: Catalog) -> Self {
        CatalogCell {
            current: RwLock::new(Arc::new(catalog)),
        }
    }

    /// Publishes a new version (store writer only).
    pub fn publish(&self, catalog: Catalog) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(catalog);
    }

    pub fn snapshot(&self) -> Arc<Catalog> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn get(&self, id: u32) -> Option<Arc<TableInfo>> {
        self.snapshot().get(id).cloned()
    }
}

/// What the origin says of the cached tables now (see [`check_tables`]).
#[derive(Debug, Default)]
pub struct TableCheck {
    /// Cached tables that no longer exist (dropped).
    pub dropped: Vec<u32>,
    /// Cached tables that exist under another schema or name: `(id, schema, name)` now.
    pub renamed: Vec<(u32, String, String)>,
    /// Cached tables whose row-level security changed (`ALTER TABLE ... ENABLE/DISABLE/FORCE
    /// ROW LEVEL SECURITY` leaves nothing in the WAL): `(id, enabled, forced)` now.
    pub security: Vec<(u32, bool, bool)>,
    /// Cached tables that cannot be cached any more: `(id, why)` (made unlogged, primary key
    /// dropped, or no longer published under their own name: their changes stopped arriving).
    pub uncacheable: Vec<(u32, String)>,
}

/// A cached table as the periodic check compares it: id, schema, name, RLS enabled, forced.
pub type CheckedTable = (u32, String, String, bool, bool);

/// `$1`: the cached OIDs; `$2`: the publication. A table counts as published when the
/// publication does not exist (the WAL consumer creates it with the cached tables).
fn check_sql() -> String {
    format!(
        "SELECT c.oid, n.nspname::text, c.relname::text, \
           c.relrowsecurity, c.relforcerowsecurity, COALESCE({REFUSAL_SQL}, CASE \
             WHEN NOT {pk} THEN 'no primary key' \
             WHEN EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2) \
               AND NOT EXISTS (SELECT 1 FROM pg_publication_tables pt WHERE pt.pubname = $2 \
                 AND pt.schemaname = n.nspname AND pt.tablename = c.relname) \
               THEN 'no longer published under its own name' END) \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY($1)",
        pk = has_pk!("c.oid")
    )
}

/// Checks cached tables against the origin's catalog with one query.
///
/// DROP and RENAME leave nothing in the WAL (a Relation message shows a rename only once the
/// renamed table is next written), so the writer calls this periodically. A table re-created
/// under the same name has a new OID: the old one shows here as dropped. Row-level security
/// switched on or off shows in `security`.
pub async fn check_tables(
    client: &tokio_postgres::Client,
    publication: &str,
    tables: &[CheckedTable],
) -> Result<TableCheck, CatalogError> {
    type Now = (String, String, bool, bool, Option<String>);
    let ids: Vec<u32> = tables.iter().map(|t| t.0).collect();
    let mut now: HashMap<u32, Now> = HashMap::new();
    for row in client.query(&check_sql(), &[&ids, &publication]).await? {
        let t: Now = (row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
        now.insert(row.get(0), t);
    }
    let mut check = TableCheck::default();
    for (id, schema, name, rls, force) in tables {
        match now.remove(id) {
            None => check.dropped.push(*id),
            Some((s, n, ..)) if s != *schema || n != *name => check.renamed.push((*id, s, n)),
            Some((.., Some(why))) => check.uncacheable.push((*id, why)),
            Some((_, _, r, f, _)) if r != *rls || f != *force => check.security.push((*id, r, f)),
            Some(_) => {}
        }
    }
    Ok(check)
}

/// Drops from `publication` every table it lists that cannot be cached (no primary key, not
/// permanent): such a table is never cached, and while published without a replica identity
/// every UPDATE and DELETE of it fails at the origin. Returns the tables dropped.
pub async fn publication_prune(
    client: &tokio_postgres::Client,
    publication: &str,
) -> Result<Vec<String>, CatalogError> {
    let sql = format!(
        "SELECT format('%I.%I', n.nspname, c.relname) \
         FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
         JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE p.pubname = $1 AND (c.relpersistence <> 'p' OR NOT {})",
        has_pk!("c.oid")
    );
    let names: Vec<String> = client
        .query(&sql, &[&publication])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !names.is_empty() {
        let sql = format!(
            "ALTER PUBLICATION {} DROP TABLE {}",
            quote_ident(publication),
            names.join(", ")
        );
        client.batch_execute(&sql).await?;
    }
    Ok(names)
}

/// Tables every-table mode would cache that are not in `known` (cached or excluded):
/// `"schema"."name"`s, quoted.
pub async fn new_tables(
    client: &tokio_postgres::Client,
    known: &[u32],
) -> Result<Vec<String>, CatalogError> {
    Ok(client
        .query(&tables_sql(), &[])
        .await?
        .iter()
        .filter(|r| !known.contains(&r.get::<_, u32>(0)))
        .map(|r| format!("{}.{}", quote_ident(r.get(1)), quote_ident(r.get(2))))
        .collect())
}

/// Resolves `name` (`users`, `public.users`, `"Mixed Case"`) on the origin and reads its
/// definition.
pub async fn load_named_table(
    client: &tokio_postgres::Client,
    name: &str,
) -> Result<TableInfo, CatalogError> {
    let row = client
        .query_opt(RESOLVE_SQL, &[&name])
        .await?
        .ok_or_else(|| CatalogError::NoSuchTable(name.to_string()))?;
    load_table(client, row.get(0), row.get(1), row.get(2)).await
}

/// Whether publication `publication` exists and is `FOR ALL TABLES`.
async fn publication_all_tables(
    client: &tokio_postgres::Client,
    publication: &str,
) -> Result<Option<bool>, CatalogError> {
    let row = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Whether `table` is listed in `publication` (by relation, not through `FOR ALL TABLES`).
async fn publication_lists(
    client: &tokio_postgres::Client,
    publication: &str,
    table: u32,
) -> Result<bool, CatalogError> {
    let row = client
        .query_opt(
            "SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
             WHERE p.pubname = $1 AND pr.prrelid = $2",
            &[&publication, &table],
        )
        .await?;
    Ok(row.is_some())
}

/// Adds `table` to a table-list publication (nothing to do for `FOR ALL TABLES` or a
/// publication that does not exist yet: the WAL consumer creates it with its start-up list).
/// Returns whether the publication is a table list (so the table joined it at some point that
/// may be recent: now, or by an earlier attempt).
///
/// Then call [`wait_for_older_transactions`] before filling the table: a
/// transaction that was already open when the table joined the publication may have its changes
/// decoded without it (PostgreSQL before 15.13 / 16.9 / 17.5 did not pass the publication's
/// invalidation to concurrent transactions), and such a change would never void a fill.
pub async fn publication_add(
    client: &tokio_postgres::Client,
    publication: &str,
    table: &TableInfo,
) -> Result<bool, CatalogError> {
    if publication_all_tables(client, publication).await? != Some(false) {
        return Ok(false);
    }
    if publication_lists(client, publication, table.id).await? {
        return Ok(true);
    }
    let sql = format!(
        "ALTER PUBLICATION {} ADD TABLE {}",
        quote_ident(publication),
        table.qualified()
    );
    client.batch_execute(&sql).await?;
    Ok(true)
}

/// Waits until every transaction open now has ended, as new snapshots see it; false if some
/// are still open after `timeout` (like `CREATE INDEX CONCURRENTLY` waiting for older
/// snapshots).
///
/// "Ended" is judged by a fresh snapshot's `xip`, not by `pg_xact_status`: a committing
/// backend marks the commit log before it leaves the proc array, so `pg_xact_status` says
/// `committed` while new snapshots still see the transaction in progress. A transaction whose
/// commit record precedes the publication change is not streamed; a fill whose snapshot still
/// missed it would cache the older row for good (seen once: `admin_ops` warming under writes).
pub async fn wait_for_older_transactions(
    client: &tokio_postgres::Client,
    timeout: std::time::Duration,
) -> Result<bool, CatalogError> {
    let open: Vec<String> = client
        .query(
            "SELECT x::text FROM pg_snapshot_xip(pg_current_snapshot()) AS x",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let until = std::time::Instant::now() + timeout;
    loop {
        let row = client
            .query_one(
                "SELECT count(*) FROM unnest($1::text[]) AS x \
                 WHERE x::xid8 IN (SELECT pg_snapshot_xip(pg_current_snapshot()))",
                &[&open],
            )
            .await?;
        if row.get::<_, i64>(0) == 0 {
            return Ok(true);
        }
        if std::time::Instant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Drops `table` from a table-list publication, if it is listed there.
pub async fn publication_drop(
    client: &tokio_postgres::Client,
    publication: &str,
    table: &TableInfo,
) -> Result<(), CatalogError> {
    if publication_all_tables(client, publication).await? != Some(false)
        || !publication_lists(client, publication, table.id).await?
    {
        return Ok(());
    }
    let sql = format!(
        "ALTER PUBLICATION {} DROP TABLE {}",
        quote_ident(publication),
        table.qualified()
    );
    client.batch_execute(&sql).await?;
    Ok(())
}

/// Why relation `oid` can never be cached ([`REFUSAL_SQL`]), or `None`.
async fn refusal(
    client: &tokio_postgres::Client,
    oid: u32,
) -> Result<Option<String>, CatalogError> {
    let sql = format!(
        "SELECT {REFUSAL_SQL} FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = $1"
    );
    Ok(client
        .query_opt(&sql, &[&oid])
        .await?
        .and_then(|r| r.get::<_, Option<String>>(0)))
}

/// Whether `table` is published by `publication` under its own name (`pg_publication_tables`:
/// not a system catalog, and not a partition whose changes are published as its root's).
pub async fn is_published(
    client: &tokio_postgres::Client,
    publication: &str,
    table: &TableInfo,
) -> Result<bool, CatalogError> {
    let row = client
        .query_opt(
            "SELECT 1 FROM pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &table.schema, &table.name],
        )
        .await?;
    Ok(row.is_some())
}

async fn load_table(
    client: &tokio_postgres::Client,
    oid: u32,
    schema: String,
    name: String,
) -> Result<TableInfo, CatalogError> {
    let sql = format!(
        "SELECT c.relrowsecurity, c.relforcerowsecurity, {REFUSAL_SQL} \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1"
    );
    let (row_security, force_row_security) = match client.query_opt(&sql, &[&oid]).await? {
        Some(row) => {
            if let Some(reason) = row.get::<_, Option<String>>(2) {
                return Err(CatalogError::NotCacheable {
                    name: format!("{schema}.{name}"),
                    reason,
                });
            }
            (row.get::<_, bool>(0), row.get::<_, bool>(1))
        }
        None => return Err(CatalogError::NoSuchTable(format!("{schema}.{name}"))),
    };
    let mut columns = Vec::new();
    let mut keyed: Vec<(i32, usize)> = Vec::new();
    for row in client.query(COLUMNS_SQL, &[&oid]).await? {
        if let Some(ord) = row.get::<_, Option<i32>>(7) {
            keyed.push((ord, columns.len()));
        }
        columns.push(ColumnInfo {
            name: row.get(1),
            type_oid: row.get(2),
            declared_type_oid: row.get(4),
            type_name: row.get(3),
            attnum: row.get::<_, i32>(0) as i16,
            typmod: row.get(5),
            typlen: row.get::<_, i32>(6) as i16,
            declared_typmod: row.get(8),
        });
    }
    keyed.sort_unstable();
    let key_columns: Vec<usize> = keyed.into_iter().map(|(_, i)| i).collect();
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
        row_security,
        force_row_security,
    })
}
