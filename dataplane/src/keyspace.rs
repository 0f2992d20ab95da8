//! Key names to store keys: `users:42` -> (table id of `users`, pk text `42`).
//!
//! A key is `<prefix>:<pk>` where the prefix is a cached table's name, its schema-qualified name
//! or a configured per-table prefix; all of them name the same table id, so `users:1` and
//! `public.users:1` are one entry. The pk part is everything after the first `:` (prefixes may not
//! contain `:`); composite keys keep their `:`-joined parts as the pk text.
//!
//! The control plane publishes a new immutable [`KeySpace`] when the catalog changes; each core
//! checks one atomic generation per poll and takes the new snapshot only when it moved, so a
//! lookup costs a hash of the prefix and no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// One immutable snapshot of the prefix -> table id map.
///
/// Hashed with FxHash: the map is small, built only by the control plane and never grown by
/// client input, so a keyed (DoS-resistant) hash buys nothing on this per-key path.
#[derive(Debug, Default, Clone)]
pub struct KeySpace {
    prefixes: rustc_hash::FxHashMap<Box<[u8]>, u32>,
    /// The same map inverted: every name of a table (BCAST client tracking spells a changed
    /// row's keys with them).
    names: rustc_hash::FxHashMap<u32, Vec<Box<[u8]>>>,
    /// Cached tables as the PostgreSQL front describes them, by table id.
    pg_tables: rustc_hash::FxHashMap<u32, Arc<PgTable>>,
    /// `(schema, name)` -> table id, for statements that name a table.
    pg_names: rustc_hash::FxHashMap<(Box<str>, Box<str>), u32>,
    /// Prefixes of user tables that cannot be cached -> the RESP error their keys answer
    /// (`ERR table public.t is not cacheable: unlogged ...`), so that such a key does not read
    /// as an absent row. Never shadows a cached table's prefix.
    refused: rustc_hash::FxHashMap<Box<[u8]>, Box<[u8]>>,
}

/// One column of a cached table, as PostgreSQL's RowDescription describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgColumn {
    pub name: Box<str>,
    /// `pg_attribute.attnum` (not the position: dropped columns leave gaps).
    pub attnum: i16,
    /// The type OID the origin reports (a domain reports its base type).
    pub type_oid: u32,
    /// `pg_type.typlen` of that type.
    pub typlen: i16,
    /// The type modifier the origin reports (`atttypmod`, the base type's for a domain).
    pub typmod: i32,
}

/// A cached table as the PostgreSQL front needs it: names, columns in the order of the
/// store's columns section (attribute order), and the primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTable {
    /// The table's id in the store (its `pg_class` OID, reported in RowDescription).
    pub id: u32,
    pub schema: Box<str>,
    pub name: Box<str>,
    pub columns: Box<[PgColumn]>,
    /// Indexes into `columns` of the primary key, in key order.
    pub key_columns: Box<[usize]>,
    /// The primary key's column names, in key order (what statement classification asks for).
    pub key_names: Box<[String]>,
    /// Row-level security is enabled on the table (`pg_class.relrowsecurity`, forced or not):
    /// its rows depend on who asks, so the store may answer only a role RLS does not apply to.
    pub row_security: bool,
}

impl KeySpace {
    pub fn new() -> Self {
        KeySpace::default()
    }

    /// Adds `prefix` as a name of `table`. Prefixes containing `:` are refused.
    pub fn add(&mut self, prefix: &str, table: u32) -> bool {
        if prefix.is_empty() || prefix.contains(':') {
            return false;
        }
        if let Some(old) = self.prefixes.insert(prefix.as_bytes().into(), table) {
            if let Some(names) = self.names.get_mut(&old) {
                names.retain(|n| &n[..] != prefix.as_bytes());
            }
        }
        self.names
            .entry(table)
            .or_default()
            .push(prefix.as_bytes().into());
        true
    }

    /// Every prefix that names `table`.
    pub fn names_of(&self, table: u32) -> impl Iterator<Item = &[u8]> {
        self.names.get(&table).into_iter().flatten().map(|n| &n[..])
    }

    /// Records that keys with `prefix` name a table that cannot be cached: they answer `error`
    /// (a RESP error text without the leading `-`). A prefix of a cached table wins.
    pub fn add_refused(&mut self, prefix: &str, error: &str) {
        if prefix.is_empty()
            || prefix.contains(':')
            || self.prefixes.contains_key(prefix.as_bytes())
        {
            return;
        }
        self.refused
            .insert(prefix.as_bytes().into(), error.as_bytes().into());
    }

    /// The error a key answers whose prefix names a table that cannot be cached (call it only
    /// when [`KeySpace::resolve`] found no cached table).
    pub fn refusal(&self, key: &[u8]) -> Option<&[u8]> {
        if self.refused.is_empty() {
            return None;
        }
        let colon = memchr::memchr(b':', key)?;
        self.refused.get(&key[..colon]).map(|e| &e[..])
    }

    /// Splits `key` into its table id and pk text, or `None` if the prefix names no cached table.
    pub fn resolve<'a>(&self, key: &'a [u8]) -> Option<(u32, &'a [u8])> {
        let colon = memchr::memchr(b':', key)?;
        let table = *self.prefixes.get(&key[..colon])?;
        Some((table, &key[colon + 1..]))
    }

    pub fn len(&self) -> usize {
        self.prefixes.len()
    }

    /// Describes a cached table for the PostgreSQL front (replacing an earlier description).
    pub fn add_pg_table(&mut self, table: PgTable) {
        let key = (table.schema.clone(), table.name.clone());
        self.pg_names.insert(key, table.id);
        self.pg_tables.insert(table.id, Arc::new(table));
    }

    /// A cached table by id.
    pub fn pg_table(&self, id: u32) -> Option<&Arc<PgTable>> {
        self.pg_tables.get(&id)
    }

    /// A cached table by name; without a schema, `public` (pgline does not follow the client's
    /// `search_path`; statements naming other schemas must qualify the table).
    ///
    /// An unqualified name beginning with `pg_` resolves to nothing: PostgreSQL searches
    /// `pg_catalog` before the path, so such a name may be a catalog relation, never to be taken
    /// for `public.pg_x`.
    pub fn pg_table_named(&self, schema: Option<&str>, name: &str) -> Option<&Arc<PgTable>> {
        if schema.is_none() && name.starts_with("pg_") {
            return None;
        }
        let key: (Box<str>, Box<str>) = (schema.unwrap_or("public").into(), name.into());
        self.pg_names
            .get(&key)
            .and_then(|id| self.pg_tables.get(id))
    }

    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }
}

/// The shared, swappable key space.
#[derive(Debug, Default)]
pub struct KeySpaceCell {
    generation: AtomicU64,
    current: RwLock<Arc<KeySpace>>,
}

impl KeySpaceCell {
    pub fn new(space: KeySpace) -> Self {
        KeySpaceCell {
            generation: AtomicU64::new(1),
            current: RwLock::new(Arc::new(space)),
        }
    }

    /// Publishes a new snapshot (control plane only).
    pub fn publish(&self, space: KeySpace) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = Arc::new(space);
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> Arc<KeySpace> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl crate::pgwire::classify::Catalog for KeySpace {
    fn primary_key(&self, schema: Option<&str>, table: &str) -> Option<&[String]> {
        self.pg_table_named(schema, table).map(|t| &t.key_names[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_resolve_to_one_table() {
        let mut ks = KeySpace::new();
        assert!(ks.add("users", 7));
        assert!(ks.add("public.users", 7));
        assert!(!ks.add("bad:prefix", 8));
        assert_eq!(ks.resolve(b"users:42"), Some((7, &b"42"[..])));
        assert_eq!(ks.resolve(b"public.users:42"), Some((7, &b"42"[..])));
        assert_eq!(ks.resolve(b"orders:1:2"), None);
        assert_eq!(ks.resolve(b"users"), None);
        assert_eq!(ks.resolve(b"users:a:b"), Some((7, &b"a:b"[..])));
    }

    fn table(id: u32, schema: &str, name: &str) -> PgTable {
        PgTable {
            id,
            schema: schema.into(),
            name: name.into(),
            columns: Box::new([]),
            key_columns: Box::new([]),
            key_names: Box::new([]),
            row_security: false,
        }
    }

    #[test]
    fn unqualified_pg_names_do_not_resolve() {
        let mut ks = KeySpace::new();
        ks.add_pg_table(table(7, "public", "pg_class"));
        ks.add_pg_table(table(8, "public", "users"));
        assert!(ks.pg_table_named(None, "pg_class").is_none());
        assert_eq!(
            ks.pg_table_named(Some("public"), "pg_class").map(|t| t.id),
            Some(7)
        );
        assert_eq!(ks.pg_table_named(None, "users").map(|t| t.id), Some(8));
    }

    #[test]
    fn publish_bumps_the_generation() {
        let cell = KeySpaceCell::new(KeySpace::new());
        let g = cell.generation();
        let mut ks = KeySpace::new();
        ks.add("t", 1);
        cell.publish(ks);
        assert!(cell.generation() > g);
        assert_eq!(cell.snapshot().resolve(b"t:1"), Some((1, &b"1"[..])));
    }
}
